//! Stream (TCP) sockets' calls: bind, listen, accept, connect (to a skeleton on an
//! nComponent, or by the shortcut to a listener of the same vNode), names and options.
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use splitos_rpc::{P2N_CONNECT, P2N_LISTEN};
use splitos_shim_abi::{NetOp, NetReq, NetResp};

use super::{addr, bridge, put_addr, Answer, NetStub, Phase, Sock, State};

/// How long a connect may take before the program sees ETIMEDOUT (the kernel's own SYN
/// retries give up after about two minutes).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(130);

impl NetStub {
    pub(super) fn on_sock(
        self: &Arc<Self>,
        op: NetOp,
        s: &Arc<Sock>,
        req: &NetReq,
        fd: OwnedFd,
        resp: &mut NetResp,
    ) -> Result<Answer, i32> {
        let data = &req.data[..(req.len as usize).min(req.data.len())];
        match op {
            NetOp::Socket => unreachable!("handled by the caller"),
            NetOp::Bind => {
                let a = addr::parse(data)?;
                {
                    let st = s.st.lock().unwrap();
                    if st.phase != Phase::Fresh || st.bound.is_some() {
                        return Err(libc::EINVAL);
                    }
                }
                let bound = self.bind_skel(&s.spec, &s.slot, a)?;
                s.st.lock().unwrap().bound = Some(bound);
                Ok(Answer::Ret(0))
            }
            NetOp::Listen => {
                let (at, id) = self.ensure_skel(&s.spec, &s.slot, None)?;
                let direct = self.shortcut.then(|| self.node.addr.clone());
                self.call(
                    &at,
                    P2N_LISTEN {
                        sock: id,
                        backlog: req.a as i32,
                        direct,
                    },
                )?;
                let first = {
                    let mut st = s.st.lock().unwrap();
                    st.backlog = req.a.clamp(1, 4096) as usize;
                    st.phase != Phase::Listening
                };
                if first {
                    // Marks the program's end as listening, which the shim's accept reads
                    // (SO_PASSCRED changes nothing else on it: no credentials are sent on it).
                    let one: libc::c_int = 1;
                    // SAFETY: setsockopt with a live c_int on the descriptor the call brought.
                    unsafe {
                        libc::setsockopt(
                            fd.as_raw_fd(),
                            libc::SOL_SOCKET,
                            libc::SO_PASSCRED,
                            (&one as *const libc::c_int).cast(),
                            4,
                        )
                    };
                    s.set_phase(Phase::Listening);
                    let (stub, s2) = (self.clone(), s.clone());
                    std::thread::Builder::new()
                        .name("net-accept".into())
                        .spawn(move || stub.accept_loop(&s2))
                        .map_err(|_| libc::EAGAIN)?;
                }
                Ok(Answer::Ret(0))
            }
            NetOp::Accept => {
                let next = {
                    let mut st = s.st.lock().unwrap();
                    if st.phase != Phase::Listening {
                        return Err(libc::EINVAL);
                    }
                    st.queue
                        .pop_front()
                        .ok_or(if st.error != 0 { st.error } else { libc::EAGAIN })
                };
                s.changed.notify_all();
                let (conn, peer) = next?;
                put_addr(resp, peer);
                Ok(Answer::Fd(conn))
            }
            NetOp::Connect => {
                let a = addr::parse(data)?;
                self.connect(s, a, req.a != 0, fd)
            }
            NetOp::SockName | NetOp::PeerName => {
                let names = s.st.lock().unwrap().names;
                let a = match names {
                    Some((local, peer)) => {
                        if op == NetOp::PeerName {
                            peer
                        } else {
                            local
                        }
                    }
                    None => self.skel_name(&s.spec, &s.slot, op == NetOp::PeerName)?,
                };
                put_addr(resp, a);
                Ok(Answer::Ret(0))
            }
            NetOp::GetOpt => {
                let (level, name) = (req.a as i32, req.b as i32);
                if level == libc::SOL_SOCKET && name == libc::SO_ERROR {
                    let e = {
                        let mut st = s.st.lock().unwrap();
                        std::mem::take(&mut st.error)
                    };
                    resp.data[..4].copy_from_slice(&e.to_ne_bytes());
                    resp.len = 4;
                    return Ok(Answer::Ret(0));
                }
                self.get_opt(&s.spec, &s.slot, req, resp)
            }
            NetOp::SetOpt => self.set_opt(&s.spec, &s.slot, req),
            NetOp::Route => Err(libc::EOPNOTSUPP),
            NetOp::TakeReset => {
                let mut st = s.st.lock().unwrap();
                if st.error != libc::ECONNRESET {
                    return Ok(Answer::Ret(0));
                }
                st.error = 0;
                Err(libc::ECONNRESET)
            }
        }
    }

    /// connect(2). A blocking one is answered when it is done. A non-blocking one is answered
    /// EINPROGRESS at once, and the program's end is held unwritable until it is done
    /// ([`bridge::Hold`]), so that poll and epoll say when, as for a kernel socket.
    fn connect(
        self: &Arc<Self>,
        s: &Arc<Sock>,
        a: SocketAddr,
        nonblocking: bool,
        theirs: OwnedFd,
    ) -> Result<Answer, i32> {
        {
            let st = s.st.lock().unwrap();
            match st.phase {
                Phase::Fresh => {}
                Phase::Connecting => return Err(libc::EALREADY),
                Phase::Connected => return Err(libc::EISCONN),
                Phase::Listening | Phase::Failed => return Err(libc::EINVAL),
            }
        }
        self.c.connects.fetch_add(1, Relaxed);
        if self.shortcut {
            if let Some(listener) = self.local_listener(&s.spec.vnode, a) {
                drop(theirs);
                return self.connect_locally(s, &listener, a).map(|_| Answer::Ret(0));
            }
            if let Some(pcomp) = self.remote_listener(&s.spec, a) {
                match self.connect_remote(s, &pcomp, a) {
                    Ok(()) => return Ok(Answer::Ret(0)),
                    // That pComponent does not answer: the listener's skeleton may.
                    Err(libc::ENETDOWN | libc::ETIMEDOUT) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let (at, id) = self.ensure_skel(&s.spec, &s.slot, None)?;
        s.st.lock().unwrap().phase = Phase::Connecting;
        if !nonblocking {
            drop(theirs);
            let r = self.finish_connect(s, &at, id, a, None);
            return r.map(|_| Answer::Ret(0));
        }
        let hold = bridge::Hold::new(theirs);
        let (stub, s2) = (self.clone(), s.clone());
        std::thread::Builder::new()
            .name("net-connect".into())
            .spawn(move || {
                let _ = stub.finish_connect(&s2, &at, id, a, Some(hold));
            })
            .map_err(|_| libc::EAGAIN)?;
        Err(libc::EINPROGRESS)
    }

    /// A listening socket of the same vNode on this pComponent that `a` reaches: bound to
    /// its port, on the nComponent that holds `a` (the vNode's own for a loopback address),
    /// to `a`'s address or to all.
    pub(super) fn local_listener(&self, vnode: &str, a: SocketAddr) -> Option<Arc<Sock>> {
        let socks: Vec<Arc<Sock>> = self
            .socks
            .lock()
            .unwrap()
            .values()
            .filter(|l| l.spec.vnode == vnode && l.spec.kind == libc::SOCK_STREAM)
            .cloned()
            .collect();
        let listening = |l: &Sock| {
            let st = l.st.lock().unwrap();
            st.phase == Phase::Listening
                && st.bound.is_some_and(|b| {
                    b.port() == a.port() && (b.ip().is_unspecified() || b.ip().to_canonical() == a.ip().to_canonical())
                })
        };
        let candidates: Vec<Arc<Sock>> = socks.into_iter().filter(|l| listening(l)).collect();
        if candidates.is_empty() {
            return None;
        }
        // Only now ask where the address is: most connects have no candidate.
        let ncomp = self.ncomp_for(vnode, Some(a.ip())).ok()?;
        candidates
            .into_iter()
            .find(|l| l.skel().is_some_and(|(at, _)| at == ncomp))
    }

    /// Connects `s` to `listener`, both of this pComponent: a new connection queued on the
    /// listener whose bytes the two watchers hand each other (the paper's local channel).
    fn connect_locally(self: &Arc<Self>, s: &Arc<Sock>, listener: &Arc<Sock>, a: SocketAddr) -> Result<(), i32> {
        let mine = self.shortcut_name(a);
        let server = self.shortcut_end(listener, a, mine, |st| st.local_peer = Some(Arc::downgrade(s)))?;
        {
            let mut st = s.st.lock().unwrap();
            st.local_peer = Some(Arc::downgrade(&server));
            st.names = Some((mine, a));
        }
        s.set_phase(Phase::Connected);
        self.c.shortcuts.fetch_add(1, Relaxed);
        Ok(())
    }

    /// A shortcut connection's accepted end, queued on `listener` for the program's accept:
    /// its addresses (`local`, the listener's; `peer`, the connecting end's) and where its
    /// bytes go (`link`). ECONNREFUSED when the backlog is full, as the kernel's.
    pub(super) fn shortcut_end(
        self: &Arc<Self>,
        listener: &Arc<Sock>,
        local: SocketAddr,
        peer: SocketAddr,
        link: impl FnOnce(&mut State),
    ) -> Result<Arc<Sock>, i32> {
        {
            let st = listener.st.lock().unwrap();
            if st.queue.len() >= st.backlog.max(1) {
                return Err(libc::ECONNREFUSED);
            }
        }
        let (server, theirs) = self
            .new_sock(listener.spec.clone(), Phase::Connected, None)
            .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        {
            let mut st = server.st.lock().unwrap();
            link(&mut st);
            st.names = Some((local, peer));
        }
        server.set_phase(Phase::Connected);
        listener.st.lock().unwrap().queue.push_back((theirs, peer));
        bridge::token(listener);
        Ok(server)
    }

    /// The address a shortcut connection's connecting end gives itself (no skeleton has one).
    pub(super) fn shortcut_name(&self, a: SocketAddr) -> SocketAddr {
        SocketAddr::new(a.ip(), 40000 + (self.next_port.fetch_add(1, Relaxed) % 20000) as u16)
    }

    /// Waits for the connect; then lets go of a held program end (before the watcher may
    /// read from the pair, so that it never sees the filler).
    fn finish_connect(
        self: &Arc<Self>,
        s: &Arc<Sock>,
        at: &str,
        id: u64,
        a: SocketAddr,
        hold: Option<bridge::Hold>,
    ) -> Result<(), i32> {
        // The nComponent answers "in progress" every few seconds; the connect takes as long as
        // the kernel's own attempts there, up to CONNECT_TIMEOUT.
        let t0 = std::time::Instant::now();
        let r = loop {
            match self.call(at, P2N_CONNECT { sock: id, addr: a }) {
                Err(libc::EINPROGRESS) if t0.elapsed() < CONNECT_TIMEOUT => continue,
                Err(libc::EINPROGRESS) => break Err(libc::ETIMEDOUT),
                r => break r.map(|_| ()),
            }
        };
        if let (Err(e), Some(_)) = (r, &hold) {
            s.st.lock().unwrap().error = e;
            // Readable (at its end) as well as writable: the program's poll returns, and
            // SO_ERROR says why.
            bridge::end_stream(s);
        }
        let nonblocking = hold.is_some();
        if let Some(h) = hold {
            h.release(&s.mine);
        }
        match r {
            Ok(()) => {
                s.set_phase(Phase::Connected);
                self.start_down(s).map_err(|_| libc::EAGAIN)?;
                Ok(())
            }
            Err(e) => {
                // A failed blocking connect may be tried again, as on Linux.
                let phase = if !nonblocking
                    && matches!(
                        e,
                        libc::ECONNREFUSED | libc::ETIMEDOUT | libc::ENETUNREACH | libc::EHOSTUNREACH
                    ) {
                    Phase::Fresh
                } else {
                    Phase::Failed
                };
                s.set_phase(phase);
                Err(e)
            }
        }
    }
}
