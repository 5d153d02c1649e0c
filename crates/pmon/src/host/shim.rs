//! The pComponent's side of the shim protocol (splitos_shim_abi): welcome, hello, then one
//! request at a time per program. A closed connection is the process's exit (or exec). The
//! socket is open to every user of the host; what a connection may do follows from its
//! peer's credentials and the admin's grants ([`crate::fs::grants`]).
mod ending;
mod home;
mod requests;
mod slots;

pub(crate) use slots::{take_slot, SharedSlots, Slot, Slots};

pub(crate) use ending::Ending;
pub(crate) use requests::{HomeRefusals, Posted};

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use splitos_rpc::refusals::Refusals;
use splitos_rpc::{
    ErrCode, Refusal, Refuse, Request, VmaInfo, Who, G2P_HOME, P2G_PICK_HOME, P2M_DONTNEED, P2M_EXIT, P2M_FORK,
    P2M_MMAP, P2M_MPROTECT, P2M_MREMAP, P2M_MUNMAP, P2M_PROC_CREATE,
};
use splitos_shim_abi::{
    Admitted, FromZeros, Hello, IntoBytes, Op, ShimReq, ShimResp, VmaRec, Welcome, ADMITTED_COMMIT_ON_USE,
    DEFAULT_VNODE, HELLO_CREATE_VNODE, HELLO_LAUNCHER, HELLO_PROGRAM, MMAP_AT_HINT, MMAP_FIXED, MMAP_NORESERVE,
    MREMAP_FIXED, MREMAP_MAYMOVE, SHIM_ABI_VERSION, WELCOME_HEAP_FILE, WELCOME_MARK, WELCOME_UFFD_DEV,
};

use super::fault;
use super::huge::HugeHeap;
use super::reuse::HeapReuse;
use super::uffd::PAGE;
use crate::fs::grants::PeerCred;
use crate::fs::MountError;

/// Why a program that connected is not admitted.
#[derive(Debug, thiserror::Error)]
enum AdmitError {
    #[error("cannot keep the program's connection: {0}")]
    Connection(std::io::Error),
    #[error("cannot track the writes of program {pid}: {error}")]
    Track { pid: i32, error: std::io::Error },
    /// Its pid is another process's now, perhaps: no program to serve.
    #[error("process {pid} that connected has ended")]
    Ended { pid: i32 },
    #[error("program {pid} handed over a descriptor that is not a userfaultfd as its heap's")]
    NotUserfaultfd { pid: i32 },
    #[error("a forked child is its parent's user's")]
    OtherUsersChild,
    #[error("no forked child {token}")]
    NoForkedChild { token: u64 },
    #[error("cannot create an eventfd: {0}")]
    Eventfd(std::io::Error),
}

impl Refuse for AdmitError {
    fn code(&self) -> ErrCode {
        match self {
            AdmitError::Connection(_) | AdmitError::Track { .. } | AdmitError::Eventfd(_) => ErrCode::Internal,
            AdmitError::Ended { .. } | AdmitError::OtherUsersChild => ErrCode::Denied,
            AdmitError::NotUserfaultfd { .. } => ErrCode::Invalid,
            AdmitError::NoForkedChild { .. } => ErrCode::NotFound,
        }
    }
}
use crate::{Pcomp, PendingChild, Proc};
use splitos_core::config::{DirtyTracking, InterleaveRatio, Size};
use splitos_excache::dirty::{Taker, Tracker};
use splitos_excache::miss::ProcHeap;
use splitos_excache::region::{Sampling, UffdRegion};
use splitos_excache::store::ProcMemory;
use splitos_excache::Interleave;

/// The errno a program's memory call fails with: the one mapping of refusals to errnos
/// (`ErrCode::errno`), narrowed to what mmap(2) and its kin may return.
fn vm_errno(e: &Refusal) -> i64 {
    match e.code.errno() {
        n @ (libc::EINVAL | libc::EACCES | libc::ENOMEM) => n as i64,
        _ => libc::ENOMEM as i64,
    }
}

/// Binds the program socket. Programs are served only once [`serve`] is called, after the
/// pComponent registered: one served earlier would run by what the pComponent assumes before
/// its cluster tells it (the vRegion size above all: a fork's write-back then looked for its
/// pages in vRegions of the wrong size, and failed). Programs that connect meanwhile wait in
/// the socket's backlog.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("cannot listen for programs on {}: {e}", path.display()))?;
    // Every user may connect: the grants decide what a connection gets.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(l)
}

/// Serves the programs that connect to the socket [`bind`] made.
pub fn serve(p: Arc<Pcomp>, l: UnixListener) -> anyhow::Result<()> {
    std::thread::Builder::new().name("shim-accept".into()).spawn(move || {
        for s in l.incoming() {
            match s {
                Ok(s) => {
                    let p = p.clone();
                    let _ = std::thread::Builder::new()
                        .name("shim".into())
                        .spawn(move || p.serve_program(s));
                }
                Err(e) => tracing::warn!(error = %e, "accepting a program failed"),
            }
        }
    })?;
    Ok(())
}

/// How long a connection may take to say hello after its welcome.
const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Forked children of one process that may wait for their hello at once (each holds a copy
/// of the address space at the home).
const PENDING_PER_PARENT: usize = 256;
/// How a program's process comes to be: a new one of the hello's vNode, with the program
/// slot its hello took, or a forked child (the token its parent's fork gave it) of its
/// parent's vNode, whose slot the fork took.
enum Start {
    New { vnode: String, program: Slot },
    Forked(u64),
}

/// The welcome of a connection that gets nothing, with why (an errno).
fn refused_welcome(s: &mut UnixStream, errno: i32) {
    let w = Welcome {
        mark: WELCOME_MARK,
        abi: SHIM_ABI_VERSION,
        flags: 0,
        uffd_features: 0,
        refused: errno as u32,
        reply_spin_us: 0,
    };
    let _ = s.write_all(w.as_bytes());
}

/// Receives a hello and the descriptors that come with it.
fn recv_hello(s: &UnixStream) -> std::io::Result<(Hello, Vec<OwnedFd>)> {
    let mut hello = Hello::new_zeroed();
    let fds = splitos_rpc::fdpass::recv_fds(s, hello.as_mut_bytes())?;
    Ok((hello, fds))
}

fn reply(s: &mut UnixStream, ret: i64, val: u64, val2: u64) -> std::io::Result<()> {
    s.write_all(ShimResp { ret, val, val2 }.as_bytes())
}

/// A reply whose `val` is the length of the bytes that follow it.
fn reply_bytes(s: &mut UnixStream, bytes: &[u8]) -> std::io::Result<()> {
    reply(s, 0, bytes.len() as u64, 0)?;
    s.write_all(bytes)
}

fn vnode_of(h: &Hello) -> String {
    let len = h.vnode.iter().position(|b| *b == 0).unwrap_or(h.vnode.len());
    String::from_utf8_lossy(&h.vnode[..len]).to_string()
}

impl Pcomp {
    /// The first message on a connection: the userfaultfd features the miss path needs, the
    /// userfaultfd device (programs of users who may not create a userfaultfd serving the
    /// kernel's own accesses get theirs from it), and a file to back the heap with when heaps
    /// live on the private tmpfs (huge pages), else none and the shim creates a memfd.
    fn welcome(&self, s: &mut UnixStream) -> std::io::Result<()> {
        let file = self.heap_fs.as_ref().and_then(|fs| {
            fs.create()
                .inspect_err(
                    |e| tracing::warn!(error = %e, "cannot create a heap file; this program's heap gets no huge pages"),
                )
                .ok()
        });
        let mut w = Welcome {
            mark: WELCOME_MARK,
            abi: SHIM_ABI_VERSION,
            flags: 0,
            uffd_features: splitos_excache::dirty::uffd_features(self.cfg.dirty_tracking),
            refused: 0,
            reply_spin_us: u32::try_from(self.cfg.heap_call_spin_us).unwrap_or(u32::MAX),
        };
        let mut fds = Vec::new();
        if let Some(d) = &self.uffd_dev {
            w.flags |= WELCOME_UFFD_DEV;
            fds.push(d.as_raw_fd());
        }
        if let Some(f) = &file {
            w.flags |= WELCOME_HEAP_FILE;
            fds.push(f.as_raw_fd());
        }
        splitos_rpc::fdpass::send_fds(s, w.as_bytes(), &fds)
    }

    /// Logs (a flood's first lines, then a summary) and counts a connection refused for who it is.
    fn refuse(&self, peer: &PeerCred, why: &str) {
        static REFUSED: Refusals = Refusals::new("refused a program-socket connection");
        if REFUSED.log_this(format_args!("uid {}", peer.uid)) {
            tracing::warn!(
                uid = peer.uid,
                os_pid = peer.pid,
                "refused a program-socket connection: {why}"
            );
        }
        crate::series::PROGRAM_CONNECTIONS_REFUSED.increment(1);
    }

    fn serve_program(self: Arc<Self>, mut s: UnixStream) {
        let peer = match PeerCred::of(&s) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "cannot tell who connected to the program socket");
                return;
            }
        };
        if !self.grants.may_use_any(&peer) {
            self.refuse(&peer, "the user is granted no vNode");
            return refused_welcome(&mut s, libc::EACCES);
        }
        let Some(wait) = take_slot(&self.waiting, peer.uid, peer.uid) else {
            self.refuse(&peer, "too many of the user's connections are waiting for their hello");
            return refused_welcome(&mut s, libc::EAGAIN);
        };
        // A peer that is no shim may be gone already: its hello, or its lack of one, tells.
        let _ = self.welcome(&mut s);
        // A shim says hello at once; a connection that never does must not hold a thread.
        let _ = s.set_read_timeout(Some(HELLO_TIMEOUT));
        let hello = recv_hello(&s);
        let _ = s.set_read_timeout(None);
        drop(wait);
        let (hello, fds) = match hello {
            Ok(h) => h,
            Err(e) => return self.refuse(&peer, &format!("a malformed hello: {e}")),
        };
        if hello.abi != SHIM_ABI_VERSION {
            self.refuse(
                &peer,
                &format!(
                    "its shim speaks ABI version {}, this pComponent {SHIM_ABI_VERSION}",
                    hello.abi
                ),
            );
            let _ = reply(&mut s, -(libc::EPROTO as i64), 0, 0);
            return;
        }
        let vnode = vnode_of(&hello);
        if !self.grants.may_use(&vnode, &peer) {
            self.refuse(&peer, &format!("vNode {vnode:?} is not granted to the user"));
            let _ = reply(&mut s, -(libc::EACCES as i64), 0, 0);
            return;
        }
        let (uffd_fd, memfd) = match (hello.kind, <[OwnedFd; 2]>::try_from(fds)) {
            (HELLO_PROGRAM, Ok([u, m])) => (u, m),
            (HELLO_LAUNCHER, _) => {
                // The table held may be older than the vNode (no heartbeat brought one yet,
                // or the admin made it through the API a moment ago): a name not in it is
                // looked up again before it counts as a typo. With no table to be had, there
                // is nothing to tell a typo by, and root's run goes ahead as every run did.
                let asked = hello.flags & HELLO_CREATE_VNODE != 0 || vnode == DEFAULT_VNODE;
                let held = || self.grants.of(&vnode).is_some();
                if !asked && !held() {
                    self.take_vnodes();
                }
                if !asked && !held() && self.grants.version() != 0 {
                    self.refuse(&peer, &format!("the cluster has no vNode {vnode:?}"));
                    let _ = reply(&mut s, -(libc::ENOENT as i64), 0, 0);
                    return;
                }
                if self.cordoned.load(std::sync::atomic::Ordering::Relaxed) {
                    self.refuse(&peer, "the pComponent is cordoned");
                    let _ = reply(&mut s, -(libc::EBUSY as i64), 0, 0);
                    return;
                }
                let Some(_run) = take_slot(&self.launchers, peer.uid, peer.uid) else {
                    self.refuse(&peer, "too many of the user's runs are under way");
                    let _ = reply(&mut s, -(libc::EAGAIN as i64), 0, 0);
                    return;
                };
                let interleave = match self.job_interleave(&hello) {
                    Ok(i) => i,
                    Err(why) => {
                        self.refuse(&peer, &format!("the run's {why}"));
                        let _ = reply(&mut s, -(libc::EINVAL as i64), 0, 0);
                        return;
                    }
                };
                if !self.claim_run(hello.run_id, peer.uid, interleave) {
                    self.refuse(&peer, &format!("run {} is another user's", hello.run_id));
                    let _ = reply(&mut s, -(libc::EEXIST as i64), 0, 0);
                    return;
                }
                self.serve_launcher(s, &peer, &vnode);
                // The run's processes that are still there keep their counters; the
                // pComponent keeps nothing of a run whose launcher is gone.
                let mut runs = self.runs.lock().unwrap();
                if runs.get(&hello.run_id).is_some_and(|r| r.uid == peer.uid) {
                    runs.remove(&hello.run_id);
                }
                return;
            }
            (kind, _) => {
                self.refuse(&peer, &format!("a hello of kind {kind} is neither a launcher's nor a program's with exactly a userfaultfd and a memfd"));
                let _ = reply(&mut s, -(libc::EPROTO as i64), 0, 0);
                return;
            }
        };
        // A program slot is held until the program exits: what one user's programs hold here
        // (threads, the ExCache's bookkeeping, channels to homes) stays bounded. A forked
        // child's was taken at its parent's fork, so that a fork over the cap fails there.
        let start = match hello.fork_token {
            0 => match take_slot(&self.programs, peer.uid, peer.uid) {
                Some(program) => Start::New { vnode, program },
                None => {
                    self.refuse(&peer, "too many of the user's programs run here");
                    let _ = reply(&mut s, -(libc::EAGAIN as i64), 0, 0);
                    return;
                }
            },
            token => Start::Forked(token),
        };
        let (proc_, _program) = match s
            .try_clone()
            .map_err(|e| AdmitError::Connection(e).into())
            .and_then(|conn| self.admit(&hello, &peer, uffd_fd, memfd, conn, start))
        {
            Ok((p, vmas, slot)) => {
                let charged = p.memory_quota.is_some() || self.refusals.strict();
                let admitted = Admitted {
                    flags: if charged { ADMITTED_COMMIT_ON_USE } else { 0 },
                };
                let ok = reply(&mut s, 0, p.pid, vmas.len() as u64).is_ok()
                    && s.write_all(admitted.as_bytes()).is_ok()
                    && vmas.iter().all(|v| {
                        s.write_all(
                            VmaRec {
                                start: v.start,
                                end: v.end,
                                prot: v.prot as u64,
                            }
                            .as_bytes(),
                        )
                        .is_ok()
                    });
                if !ok {
                    self.exit_process(&p);
                    return;
                }
                (p, slot)
            }
            Err(e) => {
                self.refuse(&peer, &format!("cannot admit the program: {e}"));
                // EACCES tells the shim the vNode is not granted, which was checked above.
                let errno = match vm_errno(&e) {
                    n if n == libc::EACCES as i64 => libc::EPERM as i64,
                    n => n,
                };
                let _ = reply(&mut s, -errno, 0, 0);
                return;
            }
        };
        for i in 0..self.cfg.fault_workers.max(1) {
            let (p2, pr) = (self.clone(), proc_.clone());
            let _ = std::thread::Builder::new()
                .name(format!("fault{}.{i}", proc_.os_pid))
                .spawn(move || fault::worker(p2, pr));
        }
        // A program's heap calls come in bursts (an allocator growing, a library loading):
        // polling for the next one after a reply spares the program the wake-up of this thread.
        let polling = splitos_rpc::poll::Poller::new(
            std::time::Duration::from_micros(self.cfg.heap_call_spin_us),
            self.cfg.fault_polling,
        );
        loop {
            let mut req = ShimReq::default();
            let Some(polled) = next_request(&mut s, &proc_.pidfd, &polling, req.as_mut_bytes()) else {
                break;
            };
            let t0 = std::time::Instant::now();
            let mut posted = None;
            let (ret, val, val2) = match self.request(&proc_, &req, &mut posted) {
                Ok((v, v2)) => (0, v, v2),
                Err(e) => (-e, 0, 0),
            };
            if matches!(
                Op::from_u32(req.op),
                Some(Op::Mmap | Op::Munmap | Op::Mprotect | Op::Dontneed | Op::Mremap)
            ) {
                let ns = t0.elapsed().as_nanos() as u64;
                for s in [&proc_.heap.stats, self.miss.total()] {
                    s.heap_calls.fetch_add(1, Relaxed);
                    s.heap_call_ns.fetch_add(ns, Relaxed);
                    s.heap_calls_polled.fetch_add(polled as u64, Relaxed);
                }
            }
            if reply(&mut s, ret, val, val2).is_err() {
                break;
            }
            if let Some(w) = posted {
                self.post(&proc_, w);
            }
        }
        self.exit_process(&proc_);
    }

    /// The interleaving a launcher's hello chose for its run (`None`: the pComponent's),
    /// checked as the pComponent's own against the ExCache as it is now.
    fn job_interleave(&self, h: &Hello) -> Result<Option<Option<Interleave>>, splitos_core::config::ConfigError> {
        if h.interleave_of == 0 {
            return Ok(None);
        }
        if h.interleave_local == 0 {
            return Ok(Some(None));
        }
        let ratio = InterleaveRatio::of(h.interleave_local, h.interleave_of)?;
        let unit = Size(h.interleave_unit);
        ratio.check(unit, self.miss.with_cache(|c| c.ways()) as u64, self.cfg.reserve_ways())?;
        Ok(Some(Interleave::of(ratio, unit)))
    }

    /// `splitos run`'s connection: mounts the vNode's file system and says where, then
    /// answers for the counters of the user's runs until it closes.
    fn serve_launcher(&self, mut s: UnixStream, peer: &PeerCred, vnode: &str) {
        let dir = match self.mounts.mount(vnode) {
            Ok(d) => d.into_os_string().into_encoded_bytes(),
            // A cluster without sComponents has no files to show.
            Err(MountError::NoStorage(_)) => Vec::new(),
            Err(e) => {
                tracing::warn!(vnode, error = %e, "cannot mount a vNode for a launcher");
                let _ = reply(&mut s, -(e.code().errno() as i64), 0, 0);
                return;
            }
        };
        if reply_bytes(&mut s, &dir).is_err() {
            return;
        }
        loop {
            let mut req = ShimReq::default();
            if s.read_exact(req.as_mut_bytes()).is_err() {
                return;
            }
            let sent = match Op::from_u32(req.op) {
                Some(Op::RunStats) => match self.runs.lock().unwrap().get(&req.a).map(|r| (r.uid, r.stats.clone())) {
                    Some((uid, run)) if uid == peer.uid || peer.uid == 0 => {
                        reply_bytes(&mut s, run.json().to_string().as_bytes())
                    }
                    // Another user's run is as unknown as one that never was.
                    _ => reply(&mut s, -(libc::ENOENT as i64), 0, 0),
                },
                _ => {
                    static ASKS: Refusals = Refusals::new("refused a launcher's request launchers do not make");
                    if ASKS.log_this(format_args!("uid {}", peer.uid)) {
                        tracing::warn!(
                            op = req.op,
                            os_pid = peer.pid,
                            "refused a launcher's request launchers do not make"
                        );
                    }
                    reply(&mut s, -(libc::ENOSYS as i64), 0, 0)
                }
            };
            if sent.is_err() {
                return;
            }
        }
    }

    /// Creates the process for a hello: a new one (home chosen by GMM) or a forked child.
    /// The process is the peer's, whatever the hello says. Returns its program slot with it.
    fn admit(
        &self,
        h: &Hello,
        peer: &PeerCred,
        uffd_fd: OwnedFd,
        memfd: OwnedFd,
        conn: UnixStream,
        start: Start,
    ) -> Result<(Arc<Proc>, Vec<VmaInfo>, Slot), Refusal> {
        // Before anything exists for it: a program whose writes cannot be tracked is refused.
        let tracker = match self.cfg.dirty_tracking {
            DirtyTracking::Fault => None,
            DirtyTracking::Scan => Some(
                Tracker::open(peer.pid, h.region_base).map_err(|error| AdmitError::Track { pid: peer.pid, error })?,
            ),
        };
        // Access sampling reads in the program's page tables which pages it unmapped were
        // touched again; without them the program runs unsampled.
        let sampling = self.sampling.then(|| {
            std::fs::File::open(format!("/proc/{}/pagemap", peer.pid))
                .map(|pagemap| Sampling {
                    pidfd: peer.pidfd.clone(),
                    pagemap,
                })
                .inspect_err(|e| tracing::warn!(pid = peer.pid, error = %e, "cannot open the program's page tables; its lines are not sampled"))
                .ok()
        });
        // The pid is the process's only while it lives: one that connected and ended (its
        // pid perhaps another's now) is no program to serve. Checked after the page tables
        // above were opened by that pid.
        if !peer.alive() {
            return Err(AdmitError::Ended { pid: peer.pid }.into());
        }
        if !super::uffd::is_userfaultfd(&uffd_fd) {
            crate::series::FAULT_SOURCES_REFUSED.increment(1);
            return Err(AdmitError::NotUserfaultfd { pid: peer.pid }.into());
        }
        let (pid, child) = match start {
            Start::Forked(token) => {
                let mut pending = self.pending.lock().unwrap();
                match pending.remove(&token) {
                    Some(c) if c.uid == peer.uid => (token, c),
                    Some(c) => {
                        pending.insert(token, c);
                        return Err(AdmitError::OtherUsersChild.into());
                    }
                    None => return Err(AdmitError::NoForkedChild { token }.into()),
                }
            }
            Start::New { vnode, program } => {
                let (run, interleave) = self.run_of(h.run_id, peer.uid);
                let pid = crate::new_pid();
                let who = Who::new(vnode, pid);
                let (
                    G2P_HOME {
                        mcomp: home,
                        memory_quota,
                    },
                    created,
                ) = self.make_home(&who, h.region_base, h.region_size)?;
                (
                    pid,
                    PendingChild {
                        memory: Arc::new(ProcMemory::new(who, home, created.backup)),
                        memory_quota,
                        run,
                        interleave,
                        vmas: Vec::new(),
                        materialized: BTreeSet::new(),
                        uid: peer.uid,
                        parent: 0,
                        since: std::time::Instant::now(),
                        program,
                    },
                )
            }
        };
        // SAFETY: eventfd(2) takes no pointers; its result is checked before it is owned.
        let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if stop < 0 {
            return Err(AdmitError::Eventfd(std::io::Error::last_os_error()).into());
        }
        // SAFETY: `stop` is a fresh descriptor that nothing else owns.
        let stop = unsafe { OwnedFd::from_raw_fd(stop) };
        let uffd = Arc::new(uffd_fd);
        let huge = HugeHeap::of(&memfd, self.heap_fs.as_ref());
        let taker = if tracker.is_none() {
            Taker::for_heap(huge.enabled())
        } else {
            None
        };
        let region = UffdRegion {
            uffd: uffd.clone(),
            memfd,
            base: h.region_base,
            huge,
            tracker,
            taker,
            sampling: sampling.flatten(),
        };
        let heap = ProcHeap::new(pid, Box::new(region), child.run);
        // What is kept for reuse is mapped at the home, and a quota charges mappings: under a
        // quota a process keeps nothing, so that its vNode's programs may map all the quota
        // (a chunk kept per process took about a sixth of a 48 MiB quota each).
        let reuse_cap = match child.memory_quota {
            Some(_) => 0,
            None => self.cfg.heap_reuse.0,
        };
        let reuse = std::sync::Mutex::new(HeapReuse::new(reuse_cap));
        let heap_range = h.region_base..h.region_base.saturating_add(h.region_size);
        let p = Arc::new(Proc {
            pid,
            os_pid: peer.pid,
            uid: peer.uid,
            pidfd: peer.pidfd.clone(),
            conn,
            memory: child.memory,
            memory_quota: child.memory_quota,
            heap,
            uffd,
            stop,
            reuse,
            owed: Mutex::new(Vec::new()),
            heap_range,
            _idle: self.idle.hold(),
            started: std::time::SystemTime::now(),
            replaced: Default::default(),
        });
        p.heap.stats.processes.fetch_add(1, Relaxed);
        self.miss.total().processes.fetch_add(1, Relaxed);
        self.store.attach(pid, p.memory.clone());
        let earlier: Vec<Arc<Proc>> = {
            let mut procs = self.procs.lock().unwrap();
            procs.insert(pid, p.clone());
            // Two processes alive now with one pid are one process.
            let same =
                |o: &Proc| o.pid != pid && o.os_pid == peer.pid && crate::fs::grants::alive(&o.pidfd) && peer.alive();
            procs.values().filter(|o| same(o)).cloned().collect()
        };
        // One program per process: a process says hello again after an exec, whose end of
        // its earlier connection the kernel closed; ending that connection here too keeps a
        // process from holding many.
        for o in earlier {
            o.replaced.store(true, Relaxed);
            let _ = o.conn.shutdown(std::net::Shutdown::Both);
        }
        self.miss.add(p.heap.clone(), child.materialized);
        self.miss.set_vnode(pid, &p.memory.who.vnode);
        if let Some(i) = child.interleave {
            self.miss.set_interleave(pid, i);
        }
        for v in &child.vmas {
            self.miss.set_prot(pid, v.start, v.end, Some(v.prot));
        }
        tracing::info!(pid, os_pid = peer.pid, uid = peer.uid, vnode = %p.memory.who.vnode, home = p.memory.home().id, forked = h.fork_token != 0, "process started");
        Ok((p, child.vmas, child.program))
    }

    /// Gives up forked children whose parent has ended and that did not say hello within
    /// `fork_timeout_ms` (their fork failed, or a process asked for children it never
    /// made): their homes drop the copies of the address space. A live parent's are bounded
    /// by [`PENDING_PER_PARENT`] and kept: a child may be stopped (^Z, a debugger) between
    /// its fork and its hello for any time.
    pub(crate) fn reap_unclaimed_children(&self) {
        let live: BTreeSet<u64> = self.procs.lock().unwrap().keys().copied().collect();
        let stale: Vec<(u64, PendingChild)> = {
            let mut pending = self.pending.lock().unwrap();
            let old: Vec<u64> = pending
                .iter()
                .filter(|(_, c)| {
                    c.since.elapsed().as_millis() > self.cfg.fork_timeout_ms.into() && !live.contains(&c.parent)
                })
                .map(|(k, _)| *k)
                .collect();
            old.into_iter()
                .filter_map(|k| pending.remove(&k).map(|c| (k, c)))
                .collect()
        };
        for (pid, c) in stale {
            tracing::warn!(
                pid,
                parent = c.parent,
                "a forked child never said hello; its copy is dropped"
            );
            let _ = c.memory.call_home(
                &self.node,
                P2M_EXIT {
                    who: c.memory.who.clone(),
                },
            );
        }
    }
}

/// Reads the program's next request into `buf`, polling for it first as `polling` allows:
/// whether polling caught it, or None once the program is gone. Gone is also its process's
/// end while its connection stays open (a child it made with a raw clone holds it): what
/// comes on it then is no request of the process's.
fn next_request(
    s: &mut UnixStream,
    pidfd: &OwnedFd,
    polling: &splitos_rpc::poll::Poller,
    buf: &mut [u8],
) -> Option<bool> {
    let fd = s.as_raw_fd();
    let got = polling.poll(|| {
        // SAFETY: reads into a live, exclusively borrowed buffer of its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        match n {
            n if n > 0 => Some(n as usize),
            n if n < 0
                && matches!(
                    std::io::Error::last_os_error().raw_os_error(),
                    Some(libc::EAGAIN | libc::EINTR)
                ) =>
            {
                None
            }
            _ => Some(0),
        }
    });
    match got {
        Ok(0) => None,
        Ok(n) => s.read_exact(&mut buf[n..]).ok().map(|_| true),
        Err(pending) => {
            let mut fds = [fd, pidfd.as_raw_fd()].map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
            // SAFETY: polls two pollfds that live through the call.
            while unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
            {}
            pending.slept();
            if fds[1].revents != 0 {
                return None;
            }
            s.read_exact(buf).ok().map(|_| false)
        }
    }
}
