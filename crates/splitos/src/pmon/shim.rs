//! The pComponent's side of the shim protocol (splitos_shim_abi): hello, then one request at a
//! time per program. A closed connection is the process's exit (or exec).
use std::collections::{BTreeSet, HashMap};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use splitos_rpc::{ComponentRef, ErrCode, Msg, RpcError, Who};
use splitos_shim_abi::{FromZeros, Hello, IntoBytes, Op, ShimReq, ShimResp, VmaRec, MMAP_FIXED, MREMAP_FIXED, MREMAP_MAYMOVE, SHIM_ABI_VERSION};

use super::uffd::PAGE;
use super::{errno_of, fault, Pcomp, PendingChild, Proc};

pub fn listen(p: Arc<Pcomp>, path: &Path) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).map_err(|e| anyhow::anyhow!("cannot listen for programs on {}: {e}", path.display()))?;
    std::thread::Builder::new().name("shim-accept".into()).spawn(move || {
        for s in l.incoming() {
            match s {
                Ok(s) => {
                    let p = p.clone();
                    let _ = std::thread::Builder::new().name("shim".into()).spawn(move || p.serve_program(s));
                }
                Err(e) => tracing::warn!(error = %e, "accepting a program failed"),
            }
        }
    })?;
    Ok(())
}

/// Receives the hello and the two descriptors that come with it.
fn recv_hello(s: &UnixStream) -> std::io::Result<(Hello, OwnedFd, OwnedFd)> {
    let mut hello = Hello::new_zeroed();
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec { iov_base: hello.as_mut_bytes().as_mut_ptr() as *mut libc::c_void, iov_len: std::mem::size_of::<Hello>() };
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL) };
    if n != std::mem::size_of::<Hello>() as isize {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("hello of {n} bytes")));
    }
    let c = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    if c.is_null() || unsafe { (*c).cmsg_type } != libc::SCM_RIGHTS {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "hello without descriptors"));
    }
    let nfds = (unsafe { (*c).cmsg_len } as usize - unsafe { libc::CMSG_LEN(0) } as usize) / 4;
    let fds = unsafe { std::slice::from_raw_parts(libc::CMSG_DATA(c) as *const i32, nfds) };
    let owned: Vec<OwnedFd> = fds.iter().map(|fd| unsafe { OwnedFd::from_raw_fd(*fd) }).collect();
    let mut it = owned.into_iter();
    match (it.next(), it.next()) {
        (Some(u), Some(m)) => Ok((hello, u, m)),
        _ => Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "hello needs a userfaultfd and a memfd")),
    }
}

fn reply(s: &mut UnixStream, ret: i64, val: u64, val2: u64) -> std::io::Result<()> {
    s.write_all(ShimResp { ret, val, val2 }.as_bytes())
}

impl Pcomp {
    fn serve_program(self: Arc<Self>, mut s: UnixStream) {
        let (hello, uffd_fd, memfd) = match recv_hello(&s) {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "refused a malformed hello from a program");
                return;
            }
        };
        if hello.abi != SHIM_ABI_VERSION {
            tracing::warn!(abi = hello.abi, "refused a program whose shim speaks another ABI version");
            let _ = reply(&mut s, -(libc::EPROTO as i64), 0, 0);
            return;
        }
        let proc_ = match self.admit(&hello, uffd_fd, memfd) {
            Ok((p, vmas)) => {
                let ok = reply(&mut s, 0, p.pid, vmas.len() as u64).is_ok()
                    && vmas.iter().all(|v| s.write_all(VmaRec { start: v.start, end: v.end, prot: v.prot as u64 }.as_bytes()).is_ok());
                if !ok {
                    self.exit_process(&p);
                    return;
                }
                p
            }
            Err(e) => {
                tracing::warn!(error = %e, os_pid = hello.os_pid, "cannot admit a program");
                let _ = reply(&mut s, -errno_of(&e), 0, 0);
                return;
            }
        };
        for i in 0..self.cfg.fault_workers.max(1) {
            let (p2, pr) = (self.clone(), proc_.clone());
            let _ = std::thread::Builder::new().name(format!("fault{}.{i}", proc_.os_pid)).spawn(move || fault::worker(p2, pr));
        }
        loop {
            let mut req = ShimReq::default();
            if s.read_exact(req.as_mut_bytes()).is_err() {
                break;
            }
            let (ret, val, val2) = match self.request(&proc_, &req) {
                Ok((v, v2)) => (0, v, v2),
                Err(e) => (-e, 0, 0),
            };
            if reply(&mut s, ret, val, val2).is_err() {
                break;
            }
        }
        self.exit_process(&proc_);
    }

    /// Creates the process for a hello: a new one (home chosen by GMM) or a forked child.
    fn admit(&self, h: &Hello, uffd_fd: OwnedFd, memfd: OwnedFd) -> Result<(Arc<Proc>, Vec<splitos_rpc::VmaInfo>), RpcError> {
        let vnode_len = h.vnode.iter().position(|b| *b == 0).unwrap_or(h.vnode.len());
        let vnode = String::from_utf8_lossy(&h.vnode[..vnode_len]).to_string();
        let (pid, child) = if h.fork_token != 0 {
            let c = self.pending.lock().unwrap().remove(&h.fork_token);
            let c = c.ok_or_else(|| RpcError::Remote { code: ErrCode::NotFound, msg: format!("no forked child {}", h.fork_token) })?;
            (h.fork_token, c)
        } else {
            let pid = self.next_pid.fetch_add(1, Relaxed);
            let home = match self.node.call_gm(&Msg::P2G_PICK_HOME)? {
                Msg::G2P_HOME { mcomp } => mcomp,
                other => return Err(RpcError::Remote { code: ErrCode::Internal, msg: format!("unexpected {}", other.name()) }),
            };
            let who = Who { vnode, pid };
            self.node.pool.call(&home.addr, &Msg::P2M_PROC_CREATE { who: who.clone(), region_base: h.region_base, region_size: h.region_size })?;
            let run = self.run_stats(h.run_id);
            (pid, PendingChild { who, home, run, vmas: Vec::new(), owners: Vec::new(), materialized: BTreeSet::new() })
        };
        let stop = unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, libc::EFD_CLOEXEC)) };
        let p = Arc::new(Proc {
            pid,
            who: child.who,
            os_pid: h.os_pid as i32,
            base: h.region_base,
            uffd: uffd_fd,
            memfd,
            home: child.home,
            vregions: Mutex::new(HashMap::new()),
            run: child.run,
            alive: AtomicBool::new(true),
            stop,
            read_fills: AtomicU64::new(0),
            written_after_read: AtomicU64::new(0),
        });
        self.learn_owners(&p, &child.owners);
        self.bump(&p, |s| {
            s.processes.fetch_add(1, Relaxed);
        });
        let mut g = self.inner.lock().unwrap();
        g.procs.insert(pid, p.clone());
        g.materialized.insert(pid, child.materialized);
        drop(g);
        tracing::info!(pid, os_pid = h.os_pid, vnode = %p.who.vnode, home = p.home.id, forked = h.fork_token != 0, "process started");
        Ok((p, child.vmas))
    }

    fn exit_process(&self, p: &Arc<Proc>) {
        p.alive.store(false, Relaxed);
        let one: u64 = 1;
        unsafe { libc::write(p.stop.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
        let mut g = self.inner.lock().unwrap();
        for (vpn, _) in g.cache.resident_in(p.pid, 0, u64::MAX) {
            g.cache.remove(p.pid, vpn);
        }
        g.procs.remove(&p.pid);
        g.materialized.remove(&p.pid);
        drop(g);
        self.cv.notify_all();
        if let Err(e) = self.node.pool.call(&p.home.addr, &Msg::P2M_EXIT { who: p.who.clone() }) {
            tracing::warn!(pid = p.pid, error = %e, "home did not release an exited process");
        }
        tracing::info!(pid = p.pid, os_pid = p.os_pid, "process exited; its memory is released");
    }

    fn home_call(&self, p: &Proc, msg: Msg) -> Result<Msg, i64> {
        self.node.pool.call(&p.home.addr, &msg).map_err(|e| {
            if !matches!(e, RpcError::Remote { code: ErrCode::NoMemory, .. }) {
                tracing::warn!(pid = p.pid, error = %e, "home mComponent refused a memory call");
            }
            errno_of(&e)
        })
    }

    fn mapped(&self, p: &Proc, r: Msg) -> Result<(u64, u64), i64> {
        match r {
            Msg::M2P_MAPPED { addr, prot, owners } => {
                self.learn_owners(p, &owners);
                Ok((addr, prot as u64))
            }
            _ => Err(libc::EPROTO as i64),
        }
    }

    fn request(&self, p: &Arc<Proc>, r: &ShimReq) -> Result<(u64, u64), i64> {
        let who = p.who.clone();
        let pages = |a: u64, len: u64| (a / PAGE, (a + len).div_ceil(PAGE));
        match Op::from_u32(r.op) {
            Some(Op::Mmap) => {
                let fixed = r.d & MMAP_FIXED != 0;
                if fixed {
                    let (f, e) = pages(r.a, r.b);
                    self.discard_range(p, f, e);
                }
                let m = self.home_call(p, Msg::P2M_MMAP { who, hint: r.a, len: r.b, prot: r.c as u32, fixed })?;
                self.mapped(p, m)
            }
            Some(Op::Munmap) => {
                let (f, e) = pages(r.a, r.b);
                self.discard_range(p, f, e);
                self.home_call(p, Msg::P2M_MUNMAP { who, addr: r.a, len: r.b })?;
                Ok((0, 0))
            }
            Some(Op::Mprotect) => {
                self.home_call(p, Msg::P2M_MPROTECT { who, addr: r.a, len: r.b, prot: r.c as u32 })?;
                Ok((0, 0))
            }
            Some(Op::Dontneed) => {
                let (f, e) = pages(r.a, r.b);
                self.discard_range(p, f, e);
                self.home_call(p, Msg::P2M_DONTNEED { who, addr: r.a, len: r.b })?;
                Ok((0, 0))
            }
            Some(Op::Mremap) => {
                let (f, e) = pages(r.a, r.b);
                self.write_back_range(p, f, e, false).map_err(|_| libc::ENOMEM as i64)?;
                let fixed_to = (r.d & MREMAP_FIXED != 0).then_some(r.e);
                let m = self.home_call(p, Msg::P2M_MREMAP { who, old: r.a, old_len: r.b, new_len: r.c, may_move: r.d & MREMAP_MAYMOVE != 0, fixed_to })?;
                let (new, prot) = self.mapped(p, m)?;
                self.shift_materialized(p, r.a, r.b, r.c, new);
                Ok((new, prot))
            }
            Some(Op::ForkPrepare) => self.fork_prepare(p).map(|t| (t, 0)),
            Some(Op::ForkAbort) => {
                if let Some(c) = self.pending.lock().unwrap().remove(&r.a) {
                    let _ = self.node.pool.call(&c.home.addr, &Msg::P2M_EXIT { who: c.who });
                }
                Ok((0, 0))
            }
            None => {
                tracing::warn!(pid = p.pid, op = r.op, "unknown shim request");
                Err(libc::ENOSYS as i64)
            }
        }
    }

    /// After mremap: the pages that existed remotely in the old range now exist at the new one.
    fn shift_materialized(&self, p: &Proc, old: u64, old_len: u64, new_len: u64, new: u64) {
        let mut g = self.inner.lock().unwrap();
        let Some(m) = g.materialized.get_mut(&p.pid) else { return };
        let (of, oe) = (old / PAGE, (old + old_len) / PAGE);
        let moved: Vec<u64> = m.range(of..oe).copied().collect();
        for v in &moved {
            m.remove(v);
        }
        let keep = new_len / PAGE;
        for v in moved.into_iter().filter(|v| v - of < keep) {
            m.insert(v - of + new / PAGE);
        }
    }

    /// Writes back the parent's dirty lines, has the home copy the address space for the
    /// child, and parks the child's state until its hello.
    fn fork_prepare(&self, p: &Arc<Proc>) -> Result<u64, i64> {
        self.write_back_range(p, 0, u64::MAX / PAGE, true).map_err(|e| {
            tracing::warn!(pid = p.pid, error = %e, "fork failed: write-back");
            libc::ENOMEM as i64
        })?;
        let child = self.next_pid.fetch_add(1, Relaxed);
        let r = self.home_call(p, Msg::P2M_FORK { parent: p.who.clone(), child })?;
        let Msg::M2P_FORKED { vmas, owners } = r else { return Err(libc::EPROTO as i64) };
        let materialized = self.inner.lock().unwrap().materialized.get(&p.pid).cloned().unwrap_or_default();
        let who = Who { vnode: p.who.vnode.clone(), pid: child };
        let home: ComponentRef = p.home.clone();
        self.pending.lock().unwrap().insert(child, PendingChild { who, home, run: p.run.clone(), vmas, owners, materialized });
        Ok(child)
    }
}
