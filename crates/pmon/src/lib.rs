//! The process monitor (pComponent). It runs the processes placed on it: each program's shim
//! connects over a Unix socket and hands over its heap region (a userfaultfd and a memfd), and
//! the pComponent serves its misses, forwards its virtual-memory calls to its home mComponent,
//! runs its sockets on an nComponent and mounts its vNode's file system. Four rooms:
//!
//! * `excache` the ExCache shared by all its processes, the miss path and its policies (the
//!   crate `splitos-excache`)
//! * [`host`] process hosting: the program socket, fault workers, heap regions
//! * [`fs`] the vNode file systems (FUSE) and who may use which vNode
//! * [`net`] the socket stub
//!
//! Beside them, [`policy_ebb`] serves the `excache-policies` Ebb that replaces the ExCache's
//! policies while programs run.
//!
//! This file is its dispatch table and start-up.
mod fs;
pub mod host;
mod links;
mod net;
mod policy_ebb;
mod report;
pub mod series;

use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use splitos_rpc::refusals::Refusals;
use splitos_rpc::*;

use splitos_excache as excache;
use splitos_excache::stats;

pub use excache::{prefetcher, Prefetcher, Sequential};
pub use excache::{Access, FailHook, MissPath, MissPathParts, ProcHeap};
pub use excache::{Clock, EvictionPolicy, ExCache, Fifo, Interleave};
pub use excache::{Codec, Entry, Lz4, OldestFirst, VictimTier};
pub use excache::{Install, Region, UffdRegion};
pub use excache::{Keep, Taken};
pub use excache::{Page, PageStore, Place, ProcMemory, RemoteStore};
pub use fs::Grants;
pub use stats::RunStats;

use splitos_core::config::{AccessSampling, DirtyTracking, HugePages, IdlePoll, OneSided, PcompConfig, ProcArgs};
use splitos_core::node::{self, Node};
use splitos_metrics::Exposition;

/// Why a pComponent refuses a control request: its ExCache resized or its policies
/// replaced, a signal to one of its processes.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("excache: {0}")]
    ExcacheSize(splitos_core::config::ExcacheSize),
    #[error(transparent)]
    Resize(#[from] excache::miss::ResizeError),
    #[error("eviction: {0}")]
    Eviction(splitos_rpc::knob::UnknownName),
    #[error("prefetch: {0}")]
    Prefetch(splitos_rpc::knob::UnknownName),
    #[error("prefetch: this pComponent reads no line ahead (prefetch_lines = 0): a read-ahead policy would have nothing to do")]
    NoReadAhead,
    #[error("eviction: fifo cannot replace the eviction policy while access_sampling = \"unmap\" (fifo uses nothing sampling sees)")]
    FifoWhileSampling,
    #[error("{0} is not a signal")]
    NotASignal(i32),
    #[error("no process {0} runs on this pComponent")]
    NoProcess(u64),
    #[error("process {pid}: {error}")]
    Signal { pid: u64, error: std::io::Error },
}

impl Refuse for ControlError {
    fn code(&self) -> ErrCode {
        match self {
            ControlError::NoProcess(_) | ControlError::Signal { .. } => ErrCode::NotFound,
            _ => ErrCode::Invalid,
        }
    }
}

/// A process running on this pComponent.
pub struct Proc {
    pub pid: u64,
    pub os_pid: i32,
    /// Its user, as the kernel said when it connected.
    uid: u32,
    /// To signal it (a pid may be reused once it ends).
    pidfd: Arc<OwnedFd>,
    /// Its connection, to end it when the process says hello again.
    conn: std::os::unix::net::UnixStream,
    /// Who it is and where its memory lives (shared with the page store).
    pub memory: Arc<ProcMemory>,
    /// Its vNode's memory quota, which its home enforces.
    memory_quota: Option<u64>,
    /// Its heap as the miss path sees it.
    pub heap: Arc<ProcHeap>,
    /// The userfaultfd its fault workers read (the region holds it too).
    uffd: Arc<OwnedFd>,
    /// Written when the process ends, so that its fault workers stop.
    stop: OwnedFd,
    /// Its unmapped heap ranges still mapped at its home (only its shim thread uses them).
    reuse: Mutex<host::reuse::HeapReuse>,
    /// Calls answered before its home had them that the home did not take (only its shim
    /// thread uses them).
    owed: Mutex<Vec<host::shim::Posted>>,
    /// Its heap region's addresses.
    heap_range: std::ops::Range<u64>,
    /// Its share of the idle-polling request, while it runs.
    _idle: Option<host::idle::LatencyHold>,
    /// When this pComponent took it on (the control plane's job list).
    started: std::time::SystemTime,
    /// It exec'd and said hello again: this entry's image is gone, as an ended process's is.
    replaced: std::sync::atomic::AtomicBool,
}

/// A forked child between its parent's FORK_PREPARE and its own hello.
struct PendingChild {
    memory: Arc<ProcMemory>,
    memory_quota: Option<u64>,
    run: Arc<RunStats>,
    /// The interleaving its job chose, if it chose one.
    interleave: Option<Option<Interleave>>,
    vmas: Vec<VmaInfo>,
    materialized: BTreeSet<u64>,
    /// Its parent's user: only that user's process may say hello as the child.
    uid: u32,
    /// Its parent's process id (0 for a new process), and when it was parked.
    parent: u64,
    since: Instant,
    /// Its place under `max_programs_per_user`, taken before the home copied anything and
    /// given back with it if the child never says hello.
    program: host::shim::Slot,
}

/// A `splitos run` under way: the user whose processes it has, their counters, and the
/// interleaving its launcher chose for them (`None`: the pComponent's).
struct Run {
    uid: u32,
    stats: Arc<RunStats>,
    interleave: Option<Option<Interleave>>,
}

/// A new process id: random, so that ids are unique across pComponents and no one guesses
/// another program's (0 means "not a forked child" in a hello).
fn new_pid() -> u64 {
    splitos_rpc::auth::random_u64().max(1)
}

pub struct Pcomp {
    node: Arc<Node>,
    cfg: PcompConfig,
    mounts: fs::Mounts,
    store: Arc<RemoteStore>,
    miss: MissPath,
    /// The eviction and read-ahead policies, as Ebbs replaceable while programs run.
    policies: excache::Policies,
    /// The `excache-policies` Ebb's messages are served while this lives.
    _policy_messages: splitos_ebb::messenger::Serving,
    procs: Mutex<HashMap<u64, Arc<Proc>>>,
    pending: Mutex<HashMap<u64, PendingChild>>,
    /// Each `splitos run` under way, by its id.
    runs: Mutex<HashMap<u64, Run>>,
    /// Program-socket connections waiting for their hello, and launchers.
    waiting: host::shim::SharedSlots,
    launchers: host::shim::SharedSlots,
    /// Programs admitted and not yet exited.
    programs: host::shim::SharedSlots,
    /// Who may use which vNode: the global managers' table, followed by its version.
    grants: Arc<fs::grants::Grants>,
    /// Cordoned by the admin (the global managers say so in every heartbeat's answer): no new
    /// runs start here; those under way go on.
    cordoned: std::sync::atomic::AtomicBool,
    /// The userfaultfd device, handed to programs in their welcome (none if it cannot be opened).
    uffd_dev: Option<OwnedFd>,
    started: Instant,
    /// Where heap files come from with `huge_pages` on.
    heap_fs: Option<host::huge::HeapFs>,
    /// Programs' sockets, run on nComponents.
    net: Arc<net::NetStub>,
    /// Access sampling is on (`access_sampling = "unmap"` and this host allows it).
    sampling: bool,
    /// Idle polling while programs run (`idle_poll`).
    idle: Arc<host::idle::CpuLatency>,
    /// What homes may refuse, to answer the other heap calls before the home has them.
    refusals: host::shim::HomeRefusals,
    /// Processes that ended and are being released at their homes.
    ending: host::shim::Ending,
}

impl Pcomp {
    /// Makes run `run_id` `uid`'s, for its launcher, with the interleaving it chose; false if
    /// it is another user's.
    fn claim_run(&self, run_id: u64, uid: u32, interleave: Option<Option<Interleave>>) -> bool {
        self.runs
            .lock()
            .unwrap()
            .entry(run_id)
            .or_insert_with(|| Run {
                uid,
                stats: Arc::default(),
                interleave,
            })
            .uid
            == uid
    }

    /// The counters a process of `uid` adds to, and the interleaving its job chose: its run's,
    /// if its launcher is there and the run is the same user's or root's (root may start
    /// programs that become another user's, `runuser`); else counters of its own, which end
    /// with it, and the pComponent's interleaving.
    fn run_of(&self, run_id: u64, uid: u32) -> (Arc<RunStats>, Option<Option<Interleave>>) {
        let runs = self.runs.lock().unwrap();
        runs.get(&run_id)
            .filter(|r| r.uid == uid || r.uid == 0)
            .map(|r| (r.stats.clone(), r.interleave))
            .unwrap_or_default()
    }

    fn load(&self) -> Load {
        let procs: Vec<i32> = self.procs.lock().unwrap().values().map(|p| p.os_pid).collect();
        let threads = procs.iter().map(|pid| thread_count(*pid)).sum();
        Load {
            threads,
            processes: procs.len() as u32,
            capacity: self.miss.with_cache(|c| c.lines()) as u64 * PAGE_SIZE as u64,
            committed: 0,
            used: 0,
        }
    }

    /// Ends a process whose memory cannot be served (the miss path's fail hook): says why on
    /// its stderr, then kills it.
    fn kill(&self, pid: u64, why: &str) {
        let Some(p) = self.procs.lock().unwrap().get(&pid).cloned() else {
            return;
        };
        // The pidfd pins the process, not its credentials: one that became another user's
        // (an exec of a set-user-ID program by a helper holding its connection) is not this
        // program's to end.
        // A user's programs can make these again and again (a fault outside the heap ends one).
        static NOT_KILLED: Refusals = Refusals::new("not killing a process that is no longer its user's");
        static KILLED: Refusals = Refusals::new("killing a process whose memory cannot be served");
        if p.uid != 0 && !same_user(&p) {
            if NOT_KILLED.log_this(format_args!("uid {}", p.uid)) {
                tracing::warn!(pid, os_pid = p.os_pid, %why, "not killing a process that is no longer its user's");
            }
            return;
        }
        if KILLED.log_this(format_args!("uid {}", p.uid)) {
            tracing::error!(pid, os_pid = p.os_pid, %why, "killing a process whose memory cannot be served");
        }
        let line = format!("splitos: {why}; the process cannot continue\n");
        // Its own stderr, as it opened it: reopening /proc/PID/fd/2 would open the file anew
        // with the pComponent's rights, and a program's read-only descriptor of a file it may
        // not write would become a writable one.
        // SAFETY: pidfd_getfd takes no pointers; its result is checked before it is owned.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, p.pidfd.as_raw_fd(), 2, 0) } as i32;
        if fd >= 0 {
            // SAFETY: a fresh descriptor that nothing else owns.
            let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
            // Non-blocking: a full pipe or one without a reader must not hold up the
            // pComponent. The flag is the program's too, which is about to end.
            // SAFETY: fcntl on the descriptor just taken.
            unsafe { libc::fcntl(fd, libc::F_SETFL, libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK) };
            let _ = std::io::Write::write_all(&mut f, line.as_bytes());
        }
        // SAFETY: pidfd_send_signal takes the process's pidfd and no other pointers but a null siginfo.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                p.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }

    /// The programs it runs, for the control plane.
    fn jobs(&self) -> Vec<JobInfo> {
        use std::sync::atomic::Ordering::Relaxed;
        let procs: Vec<Arc<Proc>> = self.procs.lock().unwrap().values().cloned().collect();
        procs
            .iter()
            .map(|p| {
                // Arguments end with NULs; a process that has just ended shows none.
                let cmdline = std::fs::read(format!("/proc/{}/cmdline", p.os_pid)).unwrap_or_default();
                let command = cmdline
                    .split(|b| *b == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a))
                    .collect::<Vec<_>>()
                    .join(" ");
                let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(p.uid))
                    .ok()
                    .flatten()
                    .map(|u| u.name)
                    .unwrap_or_default();
                let s = &p.heap.stats;
                JobInfo {
                    pid: p.pid,
                    os_pid: p.os_pid,
                    uid: p.uid,
                    user,
                    vnode: p.memory.who.vnode.clone(),
                    command,
                    started_unix_s: p
                        .started
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0),
                    misses: s.misses.load(Relaxed),
                    evictions: s.evictions.load(Relaxed),
                    writebacks: s.flushes.load(Relaxed),
                }
            })
            .collect()
    }

    /// Signals one of its programs for the control plane (`splitos job kill`, the API), through
    /// its pidfd: a pid the host reused since is never hit.
    /// `G2P_SET_EXCACHE`: resizes the running ExCache and sets the vNodes' shares of it
    /// (docs/elastic-memory.md). Shares are checked against the size they will have.
    fn set_excache(&self, r: G2P_SET_EXCACHE) -> Result<P2G_EXCACHE, ERR> {
        let lines = |bytes: u64| (bytes / PAGE_SIZE as u64) as usize;
        if let Some(size) = r.size {
            splitos_core::config::check_excache(size).map_err(ControlError::ExcacheSize)?;
        }
        let shares = r
            .shares
            .map(|s| s.into_iter().map(|s| (s.vnode, lines(s.bytes))).collect());
        let before = self.miss.with_cache(|c| c.lines());
        let now = self
            .miss
            .reconfigure(r.size.map(lines), shares)
            .map_err(ControlError::from)?;
        if now != before {
            tracing::info!(from_lines = before, to_lines = now, "ExCache resized");
        }
        Ok(self.excache_now())
    }

    /// A [`SetPolicy`] message to the `excache-policies` Ebb: replaces the eviction or
    /// read-ahead policy while programs run (docs/ebb.md#policies-as-ebbs), refusing what the
    /// configuration would refuse.
    fn set_policy(&self, r: SetPolicy) -> Result<PolicyState, ControlError> {
        if r.eviction.is_none() && r.prefetch.is_none() {
            return Ok(self.policy_now());
        }
        let eviction = r
            .eviction
            .map(|n| n.parse::<splitos_core::config::EvictPolicy>())
            .transpose()
            .map_err(ControlError::Eviction)?;
        let prefetch = r
            .prefetch
            .map(|n| n.parse::<splitos_core::config::PrefetchPolicy>())
            .transpose()
            .map_err(ControlError::Prefetch)?;
        if prefetch.is_some() && self.cfg.prefetch_lines == 0 {
            return Err(ControlError::NoReadAhead);
        }
        if self.sampling && eviction == Some(splitos_core::config::EvictPolicy::Fifo) {
            return Err(ControlError::FifoWhileSampling);
        }
        let lines = self.miss.with_cache(|c| c.lines());
        let (before, _) = self.miss.policy_names();
        let (e, p) = self
            .policies
            .replace(&self.miss, eviction, prefetch, lines, self.cfg.prefetch_lines);
        tracing::info!(from = before, eviction = e, prefetch = p, "ExCache policies replaced");
        Ok(self.policy_now())
    }

    fn policy_now(&self) -> PolicyState {
        let (eviction, prefetch) = self.miss.policy_names();
        PolicyState {
            eviction: eviction.into(),
            prefetch: prefetch.into(),
            eviction_swaps: self.policies.eviction.generation(),
            prefetch_swaps: self.policies.prefetch.generation(),
        }
    }

    fn excache_now(&self) -> P2G_EXCACHE {
        let page = PAGE_SIZE as u64;
        let (size, max, used) = self.miss.with_cache(|c| {
            (
                c.lines() as u64 * page,
                c.max_lines() as u64 * page,
                c.used() as u64 * page,
            )
        });
        let shares = self
            .miss
            .shares()
            .into_iter()
            .map(|(vnode, share, held)| ExcacheShare {
                vnode,
                bytes: share as u64 * page,
                used: held as u64 * page,
            })
            .collect();
        P2G_EXCACHE {
            size,
            max,
            used,
            shares,
        }
    }

    fn signal(&self, pid: u64, signal: i32) -> Result<OK, ERR> {
        if !(1..=64).contains(&signal) {
            return Err(ControlError::NotASignal(signal).into());
        }
        let Some(p) = self.procs.lock().unwrap().get(&pid).cloned() else {
            return Err(ControlError::NoProcess(pid).into());
        };
        // SAFETY: pidfd_send_signal takes the process's pidfd and no other pointers but a null siginfo.
        if unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                p.pidfd.as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        } != 0
        {
            return Err(ControlError::Signal {
                pid,
                error: std::io::Error::last_os_error(),
            }
            .into());
        }
        tracing::info!(
            pid,
            os_pid = p.os_pid,
            signal,
            "signalled a program for the control plane"
        );
        Ok(OK)
    }

    /// Takes the cordon the managers keep, told by them at once or by a heartbeat's answer.
    fn set_cordon(&self, cordoned: bool) {
        if self.cordoned.swap(cordoned, std::sync::atomic::Ordering::Relaxed) != cordoned {
            tracing::info!(
                cordoned,
                "{}",
                if cordoned {
                    "cordoned: no new programs start here"
                } else {
                    "uncordoned: new programs start here again"
                }
            );
        }
    }

    /// Takes the global managers' table of vNodes when its version is not the one held, and
    /// lets go of the mounts whose grant changed. A table it cannot get now is asked for
    /// again at the next heartbeat.
    fn follow_vnodes(&self, version: u64) {
        if version != self.grants.version() {
            self.take_vnodes();
        }
    }

    /// Asks the global managers for their table of vNodes and takes it.
    pub(crate) fn take_vnodes(&self) {
        match self.node.call_gm(P2G_VNODES) {
            Ok(t) => {
                let changed = self.grants.replace(t.version, fs::grants::Grants::resolve(&t.vnodes));
                tracing::info!(version = t.version, vnodes = t.vnodes.len(), changed = ?changed, "took the vNodes' table of the global managers");
                for v in changed {
                    self.mounts.forget(&v);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot get the vNodes' table of the global managers"),
        }
    }

    fn shutdown(&self) -> Result<OK, Refusal> {
        self.mounts.unmount_all();
        node::exit_soon();
        Ok(OK)
    }
}

/// Whether the process still runs as the user it connected as (real and effective uid),
/// read while its pidfd shows it alive before and after, so that the pid read is its own.
fn same_user(p: &Proc) -> bool {
    if !fs::grants::alive(&p.pidfd) {
        return false;
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", p.os_pid)).unwrap_or_default();
    let uids: Vec<u32> = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .map(|u| u.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default();
    fs::grants::alive(&p.pidfd) && uids.len() >= 2 && uids[..2].iter().all(|u| *u == p.uid)
}

fn thread_count(os_pid: i32) -> u32 {
    std::fs::read_to_string(format!("/proc/{os_pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(17))
                .and_then(|t| t.parse().ok())
        })
        .unwrap_or(1)
}

/// The pComponent's dispatch table (its programs' requests arrive on their own sockets, see
/// [`host::shim`]).
impl Handler for Pcomp {
    /// A resize of the ExCache writes lines back and may take seconds: on the fan-out
    /// worker, so that the leaf worker goes on serving (home moves, sockets, signals).
    fn fans_out(&self, msg: &Msg) -> bool {
        matches!(msg, Msg::G2P_SET_EXCACHE(_))
    }

    fn handle(&self, msg: Msg) -> Msg {
        match msg {
            Msg::C2X_PING(r) => on(r, |_| {
                Ok(X2C_PONG {
                    role: Role::Proc,
                    id: self.node.id(),
                })
            }),
            Msg::C2X_STATS(r) => on(r, |_| {
                Ok(X2C_STATS {
                    json: self.stats_json(),
                })
            }),
            Msg::G2X_STATS(r) => on(r, |_| {
                Ok(X2G_STATS {
                    json: self.stats_json(),
                })
            }),
            Msg::C2X_METRICS(r) => on(r, |_| {
                Ok(X2C_METRICS {
                    text: splitos_core::telemetry::render(),
                })
            }),
            Msg::G2X_METRICS(r) => on(r, |_| {
                Ok(X2G_METRICS {
                    text: splitos_core::telemetry::render(),
                })
            }),
            Msg::C2X_SHUTDOWN(r) => on(r, |_| self.shutdown()),
            Msg::G2P_JOBS(r) => on(r, |_| Ok(P2G_JOBS { jobs: self.jobs() })),
            Msg::G2P_SIGNAL(r) => on(r, |r| self.signal(r.pid, r.signal)),
            Msg::G2P_CORDON(r) => on(r, |r| {
                self.set_cordon(r.cordoned);
                Ok::<_, ERR>(OK)
            }),
            Msg::G2P_SET_EXCACHE(r) => on(r, |r| self.set_excache(r)),
            Msg::M2P_HOME_MOVED(r) => on(r, |r| self.store.home_moved(r)),
            m @ (Msg::P2P_CONNECT(_) | Msg::P2P_SEND(_) | Msg::P2P_SHUTDOWN(_)) => self.net.on_peer(m),
            other => Msg::ERR(
                Unhandled {
                    by: "a pComponent does",
                    msg: other.name(),
                }
                .into(),
            ),
        }
    }
}

/// Programs' sockets are descriptors here too (a pair's end, a UDP socket's senders): the
/// soft limit on descriptors goes up to the hard one.
fn raise_descriptor_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the live rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

pub fn run(args: ProcArgs) -> anyhow::Result<()> {
    let stop = node::block_stop_signals();
    raise_descriptor_limit();
    let cfg = &args.pcomp;
    cfg.validate().map_err(|e| anyhow::anyhow!(e))?;
    if cfg.dirty_tracking == DirtyTracking::Scan {
        excache::dirty::check_kernel().map_err(|e| anyhow::anyhow!("dirty_tracking = \"scan\": {e}"))?;
    }
    // Without credentials it stops here, before it mounts anything.
    args.node.process.credentials()?;
    let lines = (cfg.excache.0 / PAGE_SIZE as u64) as usize;
    let heap_fs = match cfg.huge_pages {
        HugePages::Off => None,
        HugePages::On => Some(host::huge::HeapFs::mount().map_err(|e| anyhow::anyhow!("huge_pages = \"on\" needs a private tmpfs mount for program heaps, which needs CAP_SYS_ADMIN (run the pComponent as root): {e}"))?),
    };
    let max_lines = (cfg.excache_max() / PAGE_SIZE as u64) as usize;
    let sampling = cfg.access_sampling == AccessSampling::Unmap
        && match host::uffd::cannot_unmap() {
            Some(why) => {
                tracing::warn!("access_sampling = \"unmap\" is off: {why}");
                false
            }
            None => true,
        };
    let policies = excache::Policies::new(cfg.eviction, lines, sampling, cfg.prefetch, cfg.prefetch_lines);
    let cache = ExCache::growable(lines, max_lines, cfg.ways, policies.eviction.build())
        .with_floor(cfg.share_floor)
        .with_interleave(Interleave::of(cfg.interleave, cfg.interleave_unit))
        .with_evict_reserve(cfg.reserve_ways());
    let grants = Arc::new(fs::grants::Grants::default());
    // Programs of every user hand their memory to whoever answers at the program socket, and
    // vNodes are mounted by name under the vNode root: no other user may have a hand in either.
    let sock_dir = args
        .shim_sock
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    splitos_core::trusted::check_path(sock_dir).map_err(|e| anyhow::anyhow!("the program socket's directory: {e}"))?;
    splitos_core::trusted::own_dir(&args.vnode_root, 0o755).map_err(|e| anyhow::anyhow!("the vNode root: {e}"))?;
    let uffd_dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
        .map(OwnedFd::from);
    if let Err(e) = &uffd_dev {
        tracing::warn!(error = %e, "cannot open /dev/userfaultfd: programs of users who may not create a userfaultfd will not start");
    }
    let (node, endpoint) = Node::bind(Role::Proc, &args.node.gm, &cfg.listen, &args.node.process)?;
    let store = Arc::new(RemoteStore::new(node.clone(), cfg.one_sided == OneSided::On, cfg.links));
    let p = Arc::new_cyclic(|me: &std::sync::Weak<Pcomp>| {
        let policy_messages = policy_ebb::serve(me.clone());
        let me = me.clone();
        let hook: FailHook = Box::new(move |t, why| {
            if let Some(p) = me.upgrade() {
                p.kill(t.pid, why);
            }
        });
        let parts = MissPathParts {
            cache,
            store: store.clone(),
            prefetcher: policies.prefetch.build(),
            piggyback: cfg.piggyback,
            fault_around: cfg.fault_around,
            prealloc: cfg.prealloc,
            window_start: cfg.fault_around_start,
            on_fail: hook,
        };
        let mut miss = MissPath::new(parts);
        if cfg.compressed_tier.0 > 0 {
            miss = miss.with_tier(Box::new(OldestFirst::new(cfg.compressed_tier.0)), Box::new(Lz4));
        }
        if cfg.reserve_ways() > 0 {
            miss = miss
                .with_evictor(cfg.reserve_ways())
                .evicting_beside(cfg.evict_beside as u64);
        }
        Pcomp {
            node: node.clone(),
            cfg: cfg.clone(),
            mounts: fs::Mounts::new(args.vnode_root.clone(), node.clone(), grants.clone()),
            store: store.clone(),
            miss,
            policies,
            _policy_messages: policy_messages,
            procs: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            runs: Mutex::new(HashMap::new()),
            waiting: host::shim::Slots::waiting(),
            launchers: host::shim::Slots::runs(),
            programs: host::shim::Slots::new(cfg.max_programs, cfg.max_programs_per_user),
            grants,
            cordoned: Default::default(),
            uffd_dev: uffd_dev.ok(),
            started: Instant::now(),
            heap_fs,
            net: Arc::new(net::NetStub::new(node.clone(), cfg.net_shortcut, cfg.net_path)),
            sampling,
            idle: host::idle::CpuLatency::new(cfg.idle_poll == IdlePoll::On),
            refusals: Default::default(),
            ending: Default::default(),
        }
    });
    let p2 = p.clone();
    splitos_core::telemetry::on_render(move |e| p2.render_metrics(e));
    let p2 = p.clone();
    // Programs must not find dead mounts: unmount the vNode file systems before exiting.
    stop.on_stop(move || p2.mounts.unmount_all());
    let shim_sock = args.shim_sock.to_string_lossy().to_string();
    if cfg.reserve_ways() > 0 {
        let p2 = p.clone();
        std::thread::Builder::new()
            .name("evictor".into())
            .spawn(move || p2.miss.run_evictor())?;
    }
    let p2 = p.clone();
    std::thread::Builder::new()
        .name("fork-reaper".into())
        .spawn(move || loop {
            std::thread::sleep(std::time::Duration::from_millis(p2.cfg.fork_timeout_ms) / 3);
            p2.reap_unclaimed_children();
        })?;
    let programs = host::shim::bind(&args.shim_sock)?;
    net::listen(p.clone(), &args.shim_sock)?;
    endpoint.serve(
        p.clone(),
        ServerConfig {
            name: "pcomp".into(),
            workers: 1,
            fanout_workers: 1,
            serving: Default::default(),
        },
    );
    let reg = node
        .register(Some(shim_sock.clone()), p.load())
        .map_err(|e| anyhow::anyhow!("cannot register with the global managers at {}: {e}", args.node.gm))?;
    store.set_vregion_size(reg.vregion_size);
    p.refusals.set_overcommit(reg.overcommit);
    p.follow_vnodes(reg.vnodes);
    host::shim::serve(p.clone(), programs)?;
    let p2 = p.clone();
    let p3 = p.clone();
    node.clone().heartbeat_forever(
        Some(shim_sock.clone()),
        move || p2.load(),
        move |beat| {
            p3.net.forget_peers(&beat.lost);
            p3.follow_vnodes(beat.vnodes);
            p3.set_cordon(beat.cordoned);
            p3.refusals.set_memory(beat.memory);
        },
    );
    if cfg.link_probe_ms > 0 {
        links::probe_forever(
            node.clone(),
            p.store.clone(),
            std::time::Duration::from_millis(cfg.link_probe_ms),
        )?;
    }
    p.miss.with_cache(|c| {
        tracing::info!(addr = %node.addr, transport = node.rpc.transport().name(), id = node.id(), role = "pcomponent", metrics = ?node.metrics, shim_sock = %shim_sock, excache_lines = c.lines(), ways = c.ways(), eviction = c.policy_name(), piggyback = cfg.piggyback, prefetch_lines = cfg.prefetch_lines, prefetch = %cfg.prefetch, compressed_tier = cfg.compressed_tier.0, huge_pages = %cfg.huge_pages, dirty_tracking = %cfg.dirty_tracking, access_sampling = p.sampling, one_sided = %cfg.one_sided, idle_poll = %cfg.idle_poll, "splitos process monitor started");
    });
    node::announce_ready(args.node.process.ready_file.as_deref(), &node.addr);
    node::park_forever()
}
