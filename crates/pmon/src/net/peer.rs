//! The shortcut across pComponents (the paper's section 3.7): a program connecting to a
//! listener of its vNode that runs on another pComponent gets a direct connection between
//! the two pComponents, and the nComponent never carries its bytes. The nComponent only says
//! where the listener is (`P2N_FIND_LISTENER`, from what `P2N_LISTEN.direct` told it). Each
//! end has a random id at its pComponent, the capability to send to it (`P2P_SEND`); bytes
//! go from one end's watcher to the other pComponent, which puts what fits into its program's
//! end and says how much it took.
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use super::{bridge, NetStub, Phase, Sock, Spec};

/// The other end of a direct connection: its pComponent (address and component id), its id
/// there, and this end's id.
#[derive(Clone, Debug)]
pub struct Remote {
    pub pcomp: String,
    pub pcomp_id: u32,
    pub theirs: u64,
    pub mine: u64,
}

/// How long a send waits, at most, before it offers the rest again to a program that did
/// not read.
const BACKOFF_MAX: Duration = Duration::from_millis(20);

impl NetStub {
    /// The pComponent holding a listener of the vNode that `a` reaches, if it is not this one
    /// and takes direct connections.
    pub(super) fn remote_listener(&self, spec: &Spec, a: SocketAddr) -> Option<String> {
        let ncomp = self.ncomp_for(&spec.vnode, Some(a.ip())).ok()?;
        let found = self
            .call(
                &ncomp,
                P2N_FIND_LISTENER {
                    vnode: spec.vnode.clone(),
                    addr: a,
                },
            )
            .ok()?
            .pcomp;
        found.filter(|p| *p != self.node.addr)
    }

    fn register(&self, s: &Arc<Sock>) -> u64 {
        let mut conns = self.conns.lock().unwrap();
        loop {
            let id = auth::random_u64();
            if id != 0 && !conns.contains_key(&id) {
                conns.insert(id, Arc::downgrade(s));
                return id;
            }
        }
    }

    /// Connects `s` straight to the listener at `pcomp` that `a` reaches.
    pub(super) fn connect_remote(self: &Arc<Self>, s: &Arc<Sock>, pcomp: &str, a: SocketAddr) -> Result<(), i32> {
        let mine = self.register(s);
        let name = self.shortcut_name(a);
        let asked = P2P_CONNECT {
            vnode: s.spec.vnode.clone(),
            addr: a,
            peer: name,
            conn: mine,
            from: self.node.addr.clone(),
            from_id: self.node.id(),
        };
        let r = match self.call(pcomp, asked) {
            Ok(r) => r,
            Err(e) => {
                self.conns.lock().unwrap().remove(&mine);
                return Err(e);
            }
        };
        let remote = Remote {
            pcomp: pcomp.to_string(),
            pcomp_id: r.id,
            theirs: r.conn,
            mine,
        };
        {
            let mut st = s.st.lock().unwrap();
            st.remote = Some(remote.clone());
            st.names = Some((name, a));
        }
        // The program closed the socket meanwhile: its close found no other end to tell.
        if s.closed.load(Relaxed) {
            self.end_remote(&remote, true);
            return Err(libc::EBADF);
        }
        s.set_phase(Phase::Connected);
        self.c.remote_shortcuts.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Sends bytes to a direct connection's other end, all of them, as fast as its program
    /// takes them; false if the connection is gone.
    pub(super) fn send_remote(&self, s: &Sock, r: &Remote, mut data: &[u8]) -> bool {
        let mut wait = Duration::from_micros(200);
        while !data.is_empty() {
            if s.closed.load(Relaxed) {
                return false;
            }
            match self.call(
                &r.pcomp,
                P2P_SEND {
                    conn: r.theirs,
                    data: ByteBuf::from(data.to_vec()),
                },
            ) {
                Ok(t) if t.n > 0 => {
                    let n = (t.n as usize).min(data.len());
                    self.c.remote_shortcut_bytes.fetch_add(n as u64, Relaxed);
                    data = &data[n..];
                    wait = Duration::from_micros(200);
                }
                Ok(_) => {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(BACKOFF_MAX);
                }
                Err(e) => {
                    tracing::debug!(errno = e, "a direct connection's other end is gone");
                    return false;
                }
            }
        }
        true
    }

    /// Tells a direct connection's other end that this one shut down writing, or closed.
    pub(super) fn end_remote(&self, r: &Remote, close: bool) {
        if close {
            self.conns.lock().unwrap().remove(&r.mine);
        }
        let _ = self.call(&r.pcomp, P2P_SHUTDOWN { conn: r.theirs, close });
    }

    /// The other pComponent's side of a direct connection.
    pub fn on_peer(self: &Arc<Self>, msg: Msg) -> Msg {
        match msg {
            Msg::P2P_CONNECT(r) => on(r, |r| self.accept_remote(r).map_err(Refusal::errno)),
            Msg::P2P_SEND(r) => on(r, |r| {
                let s = self.conn(r.conn)?;
                let n = take(&s, &r.data)?;
                self.c.remote_shortcut_bytes.fetch_add(n as u64, Relaxed);
                Ok(P2P_TAKEN { n: n as u32 })
            }),
            Msg::P2P_SHUTDOWN(r) => on(r, |r| {
                let s = self.conn(r.conn)?;
                bridge::end_stream(&s);
                if r.close {
                    self.conns.lock().unwrap().remove(&r.conn);
                }
                Ok(OK)
            }),
            other => Msg::ERR(
                Unhandled {
                    by: "the socket stub does",
                    msg: other.name(),
                }
                .into(),
            ),
        }
    }

    /// Ends the direct connections with pComponents the global managers say are lost, as
    /// reset ones: their programs' reads fail with `ECONNRESET`.
    pub fn forget_peers(&self, lost: &[LostPcomp]) {
        let ends: Vec<(u64, Arc<Sock>)> = self
            .conns
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(id, w)| w.upgrade().map(|s| (*id, s)))
            .collect();
        for (id, s) in ends {
            let gone =
                s.st.lock()
                    .unwrap()
                    .remote
                    .as_ref()
                    .is_some_and(|r| lost.iter().any(|l| l.id == r.pcomp_id));
            if gone {
                tracing::info!(conn = id, "a direct connection's other pComponent is lost");
                self.conns.lock().unwrap().remove(&id);
                s.st.lock().unwrap().error = libc::ECONNRESET;
                bridge::end_stream(&s);
            }
        }
    }

    fn conn(&self, id: u64) -> Result<Arc<Sock>, Refusal> {
        let s = self.conns.lock().unwrap().get(&id).and_then(|w| w.upgrade());
        s.filter(|s| !s.closed.load(Relaxed))
            .ok_or_else(|| Refusal::errno(libc::EPIPE))
    }

    /// A connection from another pComponent: queued on the listener `r.addr` reaches, as the
    /// program's accept will take it.
    fn accept_remote(self: &Arc<Self>, r: P2P_CONNECT) -> Result<P2P_CONNECTED, i32> {
        let Some(listener) = self.shortcut.then(|| self.local_listener(&r.vnode, r.addr)).flatten() else {
            self.c.refused.fetch_add(1, Relaxed);
            return Err(libc::ECONNREFUSED);
        };
        // The end's id before it is queued: the program may write as soon as it accepts.
        let mine = auth::random_u64();
        let remote = Remote {
            pcomp: r.from,
            pcomp_id: r.from_id,
            theirs: r.conn,
            mine,
        };
        let server = self.shortcut_end(&listener, r.addr, r.peer, |st| st.remote = Some(remote))?;
        self.conns.lock().unwrap().insert(mine, Arc::downgrade(&server));
        self.c.remote_shortcuts.fetch_add(1, Relaxed);
        Ok(P2P_CONNECTED {
            conn: mine,
            id: self.node.id(),
        })
    }
}

/// Puts what fits of `data` into a socket's program end now: how much.
fn take(s: &Sock, data: &[u8]) -> Result<usize, Refusal> {
    let mut n = 0;
    while n < data.len() {
        // SAFETY: sends from a live slice without waiting; MSG_NOSIGNAL: a program gone is
        // EPIPE, not a signal.
        let r = unsafe {
            libc::send(
                s.mine.as_raw_fd(),
                data[n..].as_ptr().cast(),
                data.len() - n,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => break,
                Some(errno) if n == 0 => return Err(Refusal::errno(errno)),
                _ => break,
            }
        }
        n += r as usize;
    }
    Ok(n)
}
