//! The socket stub (the paper's bsdSocketStub): programs' TCP sockets, run on an nComponent.
//!
//! A program's socket is a real descriptor: one end of a Unix socket pair whose other end
//! this pComponent holds and bridges to the socket's skeleton on an nComponent
//! ([`bridge`]). So poll, select, epoll, fcntl, dup, fork, exec, read and write work on it as
//! the kernel makes them work, and only the calls that name addresses or options (socket,
//! bind, listen, accept, connect, getsockname, getpeername, get/setsockopt) come here, each
//! on its own connection to the stub's socket (`<program socket>.net`) with the program's
//! descriptor attached: a program acts only on sockets it holds. docs/network.md says why.
//! A TCP socket's calls are in [`stream`], a UDP socket's in [`dgram`].
mod addr;
mod bridge;
mod dgram;
mod peer;
mod stream;

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use serde_bytes::ByteBuf;
use splitos_metrics::counters;
use splitos_rpc::refusals::Refusals;
use splitos_rpc::*;
use splitos_shim_abi::{FromZeros, IntoBytes, NetOp, NetReq, NetResp, NET_LOCAL, SHIM_ABI_VERSION};

use super::Pcomp;
use splitos_core::config::NetPath;
use splitos_core::node::Node;

/// A socket's two buffers on an mComponent (the DMA path).
#[derive(Clone)]
struct DmaBufs {
    mcomp: String,
    tx: u64,
    rx: u64,
}

counters! {
    /// The socket stub's counters: keys of the pComponent's `net` statistics and the series
    /// `splitos_pcomp_net_<counter>_total`.
    pub struct NetCounters: "pcomp_net" {
        /// Sockets programs opened.
        sockets,
        /// Connections programs opened.
        connects,
        /// Connections programs' listening sockets accepted.
        accepts,
        /// Bytes programs sent through nComponents.
        sent_bytes,
        /// Bytes programs received through nComponents.
        received_bytes,
        /// Socket calls refused (a socket of another program, a port the vNode may not use).
        refused,
        /// Socket calls answered EAGAIN because their vNode's share of call threads was taken.
        busy,
        /// Connections between two programs of a vNode on this pComponent that never reached
        /// an nComponent (the shortcut).
        shortcuts,
        /// Bytes those connections moved.
        shortcut_bytes,
        /// Connections between a program here and one on another pComponent, made directly.
        remote_shortcuts,
        /// Bytes those connections moved.
        remote_shortcut_bytes,
        /// Datagrams programs' UDP sockets sent through nComponents.
        datagrams_sent,
        /// Datagrams programs' UDP sockets received through nComponents.
        datagrams_received,
        /// Datagrams lost on the way: no room in the program's socket, an nComponent that did
        /// not answer.
        datagrams_dropped,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Fresh,
    Connecting,
    Connected,
    Listening,
    /// A connect failed: the socket is done.
    Failed,
}

/// A socket's skeleton, stream or datagram.
#[derive(Default)]
struct Slot {
    /// Its nComponent and its id there.
    at: Option<(String, u64)>,
    /// Every option set (and accepted), to set again on a skeleton made anew on another
    /// nComponent.
    opts: Vec<(i32, i32, Vec<u8>)>,
}

struct State {
    phase: Phase,
    /// What SO_ERROR reports next (a failed non-blocking connect).
    error: i32,
    /// Connections accepted by the skeleton, not yet by the program: each with the program's
    /// end of its pair and its peer. One token byte per connection is in the listening
    /// socket, so that the program's poll sees it readable.
    queue: VecDeque<(OwnedFd, SocketAddr)>,
    backlog: usize,
    shut_wr: bool,
    /// Where a listening socket is bound (for the shortcut to find it).
    bound: Option<SocketAddr>,
    /// A shortcut connection's other end on this pComponent: bytes go straight to it.
    local_peer: Option<Weak<Sock>>,
    /// A shortcut connection's other end on another pComponent: bytes go straight there.
    remote: Option<peer::Remote>,
    /// A shortcut connection's addresses (local, peer), which no skeleton has.
    names: Option<(SocketAddr, SocketAddr)>,
    /// Its socket buffers, on the DMA path.
    dma: Option<DmaBufs>,
}

/// What a socket is, and whose: what a new socket takes from its listener.
#[derive(Clone)]
struct Spec {
    vnode: String,
    uid: u32,
    family: i32,
    kind: i32,
    protocol: i32,
}

/// One socket of a program.
pub struct Sock {
    spec: Spec,
    /// The pComponent's end of the pair.
    mine: OwnedFd,
    /// Wakes the socket's watcher when its phase changes.
    wake: OwnedFd,
    slot: Mutex<Slot>,
    st: Mutex<State>,
    changed: Condvar,
    closed: AtomicBool,
}

impl Sock {
    fn skel(&self) -> Option<(String, u64)> {
        self.slot.lock().unwrap().at.clone()
    }

    /// A shortcut connection's other end, while it is there.
    fn local_peer(&self) -> Option<Arc<Sock>> {
        self.st.lock().unwrap().local_peer.as_ref().and_then(Weak::upgrade)
    }

    fn set_phase(&self, phase: Phase) {
        self.st.lock().unwrap().phase = phase;
        self.changed.notify_all();
        bridge::wake(&self.wake);
    }
}

/// The socket stub of a pComponent.
pub struct NetStub {
    node: Arc<Node>,
    /// Sockets by the program's end.
    socks: Mutex<HashMap<addr::SockId, Arc<Sock>>>,
    dgrams: Mutex<HashMap<addr::SockId, Arc<dgram::Dgram>>>,
    /// Senders of all datagram sockets (at most `dgram::SENDERS_ALL`).
    senders_open: std::sync::atomic::AtomicUsize,
    /// This pComponent's ends of direct connections with other pComponents, by their ids.
    conns: Mutex<HashMap<u64, Weak<Sock>>>,
    /// Where datagram sockets are named (none: programs' UDP is the host's).
    udp_dir: std::sync::OnceLock<std::path::PathBuf>,
    next_dgram: std::sync::atomic::AtomicU32,
    /// The nComponent of each vNode, as the GNM said.
    homes: Mutex<HashMap<String, String>>,
    /// Whether two programs of a vNode on this pComponent connect without the nComponent.
    shortcut: bool,
    path: NetPath,
    /// Ports handed to the client ends of shortcut connections (their getsockname).
    next_port: AtomicU64,
    /// Socket calls being served, by vNode.
    calls: super::host::shim::SharedSlots<String>,
    pub c: NetCounters,
}

/// A refusal as the errno a program sees.
fn errno_of(e: &RpcError) -> i32 {
    match e {
        RpcError::Remote { code, .. } => code.errno(),
        RpcError::Timeout { .. } => libc::ETIMEDOUT,
        _ => libc::ENETDOWN,
    }
}

impl NetStub {
    pub fn new(node: Arc<Node>, shortcut: bool, path: NetPath) -> NetStub {
        NetStub {
            node,
            socks: Mutex::new(HashMap::new()),
            dgrams: Mutex::new(HashMap::new()),
            senders_open: Default::default(),
            conns: Mutex::new(HashMap::new()),
            udp_dir: Default::default(),
            next_dgram: Default::default(),
            homes: Mutex::new(HashMap::new()),
            shortcut,
            path,
            next_port: AtomicU64::new(0),
            calls: super::host::shim::Slots::new(CALLS, CALLS_PER_VNODE),
            c: NetCounters::default(),
        }
    }

    pub fn stats(&self) -> serde_json::Value {
        let c = &self.c;
        let state = serde_json::json!({
            "open_sockets": self.socks.lock().unwrap().len() + self.dgrams.lock().unwrap().len(),
            "datagrams_on": self.udp_dir.get().is_some(), "path": self.path.to_string(), "shortcut_on": self.shortcut,
        });
        counters::json_with(c.counters(), state)
    }

    /// The nComponent for a socket of `vnode` bound to `ip` (none: the vNode's own).
    fn ncomp_for(&self, vnode: &str, ip: Option<std::net::IpAddr>) -> Result<String, i32> {
        // An IPv4 address as an IPv6 socket names it (::ffff:a.b.c.d) is that IPv4 address.
        let specific = ip
            .map(|ip| ip.to_canonical())
            .filter(|ip| !ip.is_unspecified() && !ip.is_loopback());
        if specific.is_none() {
            if let Some(a) = self.homes.lock().unwrap().get(vnode) {
                return Ok(a.clone());
            }
        }
        // While no manager answers (the only one restarting) the question is asked again, as
        // a start's, a heap's or a file's is: a connect would fail with ENETDOWN otherwise.
        let r = splitos_core::node::waiting_for_managers(
            || {
                self.node.call_gm(P2G_PICK_NET {
                    vnode: vnode.to_string(),
                    ip: specific,
                })
            },
            |e| matches!(e, RpcError::Unreachable { .. }),
            || crate::series::NET_CALLS_WAITED_FOR_MANAGERS.increment(1),
        )
        .map_err(|e| errno_of(&e))?;
        if specific.is_none() {
            self.homes
                .lock()
                .unwrap()
                .insert(vnode.to_string(), r.ncomp.addr.clone());
        }
        Ok(r.ncomp.addr)
    }

    /// A call to a socket's nComponent, on the connection all sockets share: one that is
    /// answered soon (every call but a receive's or an accept's wait).
    fn call<R: Request>(&self, ncomp: &str, req: R) -> Result<R::Reply, i32> {
        self.node.rpc.call(ncomp, req).map_err(|e| self.failed(ncomp, e))
    }

    /// A call that waits at the nComponent for an event (bytes, a connection), on this
    /// thread's own channel, so that waiting calls of many sockets never hold up the others'.
    fn wait_call<R: Request>(&self, ncomp: &str, req: R) -> Result<R::Reply, i32> {
        self.node.rpc.call_direct(ncomp, req).map_err(|e| self.failed(ncomp, e))
    }

    fn failed(&self, ncomp: &str, e: RpcError) -> i32 {
        if matches!(e, RpcError::Unreachable { .. } | RpcError::Closed { .. }) {
            // Unreachable: ask the GNM again next time.
            self.homes.lock().unwrap().retain(|_, a| a != ncomp);
            tracing::warn!(ncomp, error = %e, "an nComponent did not answer a socket call");
        }
        errno_of(&e)
    }

    /// The socket's skeleton, made on `ncomp` (or the vNode's nComponent) if it has none
    /// there yet; a skeleton elsewhere is closed and its options set again on the new one.
    fn ensure_skel(&self, spec: &Spec, slot: &Mutex<Slot>, ncomp: Option<String>) -> Result<(String, u64), i32> {
        let want = match ncomp {
            Some(n) => n,
            None => match slot.lock().unwrap().at.clone() {
                Some(k) => return Ok(k),
                None => self.ncomp_for(&spec.vnode, None)?,
            },
        };
        let (old, opts) = {
            let sl = slot.lock().unwrap();
            (sl.at.clone(), sl.opts.clone())
        };
        if let Some((at, id)) = old {
            if at == want {
                return Ok((at, id));
            }
            let _ = self.call(&at, P2N_CLOSE { sock: id });
        }
        let sp = spec;
        let r = self.call(
            &want,
            P2N_SOCKET {
                vnode: sp.vnode.clone(),
                uid: sp.uid,
                family: sp.family,
                kind: sp.kind,
                protocol: sp.protocol,
            },
        )?;
        for (level, name, value) in opts {
            // Each was accepted once, by the same kind of stack.
            if let Err(e) = self.call(
                &want,
                P2N_SETSOCKOPT {
                    sock: r.sock,
                    level,
                    name,
                    value: ByteBuf::from(value),
                },
            ) {
                tracing::debug!(
                    level,
                    name,
                    errno = e,
                    "an option did not carry over to the socket's new nComponent"
                );
            }
        }
        let mut sl = slot.lock().unwrap();
        // Another of the program's threads made one there meanwhile: keep that one.
        if let Some(made) = sl.at.clone().filter(|(at, _)| *at == want) {
            drop(sl);
            let _ = self.call(&want, P2N_CLOSE { sock: r.sock });
            return Ok(made);
        }
        sl.at = Some((want.clone(), r.sock));
        Ok((want, r.sock))
    }

    /// bind(2) on the skeleton, made on the nComponent that holds the address.
    fn bind_skel(&self, spec: &Spec, slot: &Mutex<Slot>, a: SocketAddr) -> Result<SocketAddr, i32> {
        let ncomp = self.ncomp_for(&spec.vnode, Some(a.ip()))?;
        let (at, id) = self.ensure_skel(spec, slot, Some(ncomp))?;
        Ok(self.call(&at, P2N_BIND { sock: id, addr: a })?.addr)
    }

    /// getsockname(2) or getpeername(2) of the skeleton.
    fn skel_name(&self, spec: &Spec, slot: &Mutex<Slot>, peer: bool) -> Result<SocketAddr, i32> {
        let (at, id) = self.ensure_skel(spec, slot, None)?;
        Ok(self.call(&at, P2N_NAME { sock: id, peer })?.addr)
    }

    /// getsockopt(2) on the skeleton.
    fn get_opt(&self, spec: &Spec, slot: &Mutex<Slot>, req: &NetReq, resp: &mut NetResp) -> Result<Answer, i32> {
        let (at, id) = self.ensure_skel(spec, slot, None)?;
        let r = self.call(
            &at,
            P2N_GETSOCKOPT {
                sock: id,
                level: req.a as i32,
                name: req.b as i32,
                len: (req.c.clamp(0, resp.data.len() as i64)) as u32,
            },
        )?;
        let n = r.value.len().min(resp.data.len());
        resp.data[..n].copy_from_slice(&r.value[..n]);
        resp.len = n as u32;
        Ok(Answer::Ret(0))
    }

    /// setsockopt(2) where the skeleton is now, so that a refused option fails this call;
    /// kept to be set again on a skeleton made elsewhere.
    fn set_opt(&self, spec: &Spec, slot: &Mutex<Slot>, req: &NetReq) -> Result<Answer, i32> {
        let (level, name) = (req.a as i32, req.b as i32);
        let value = req.data[..(req.len as usize).min(req.data.len())].to_vec();
        let (at, id) = self.ensure_skel(spec, slot, None)?;
        self.call(
            &at,
            P2N_SETSOCKOPT {
                sock: id,
                level,
                name,
                value: ByteBuf::from(value.clone()),
            },
        )?;
        let mut sl = slot.lock().unwrap();
        sl.opts.retain(|(l, n, _)| (*l, *n) != (level, name));
        sl.opts.push((level, name, value));
        Ok(Answer::Ret(0))
    }

    /// Makes a socket: the pair, its watcher; the skeleton comes with the first call that
    /// needs one (a bind names the nComponent).
    fn new_sock(
        self: &Arc<Self>,
        spec: Spec,
        phase: Phase,
        skel: Option<(String, u64)>,
    ) -> std::io::Result<(Arc<Sock>, OwnedFd)> {
        let (mine, theirs) = UnixStream::pair()?;
        let ino = addr::inode(theirs.as_raw_fd())?;
        let wake = bridge::waker()?;
        let st = State {
            phase,
            error: 0,
            queue: VecDeque::new(),
            backlog: 0,
            shut_wr: false,
            bound: None,
            local_peer: None,
            remote: None,
            names: None,
            dma: None,
        };
        let s = Arc::new(Sock {
            spec,
            mine: OwnedFd::from(mine),
            wake,
            slot: Mutex::new(Slot {
                at: skel,
                opts: Vec::new(),
            }),
            st: Mutex::new(st),
            changed: Condvar::new(),
            closed: AtomicBool::new(false),
        });
        self.socks.lock().unwrap().insert(ino, s.clone());
        self.c.sockets.fetch_add(1, Relaxed);
        let (stub, s2) = (self.clone(), s.clone());
        std::thread::Builder::new()
            .name("net-up".into())
            .spawn(move || stub.up(ino, &s2))?;
        if phase == Phase::Connected && s.skel().is_some() {
            self.start_down(&s)?;
        }
        Ok((s, OwnedFd::from(theirs)))
    }

    fn start_down(self: &Arc<Self>, s: &Arc<Sock>) -> std::io::Result<()> {
        let (stub, s2) = (self.clone(), s.clone());
        std::thread::Builder::new()
            .name("net-down".into())
            .spawn(move || stub.down(&s2))?;
        Ok(())
    }

    /// Forgets a socket its program closed, and its skeleton.
    fn close(&self, ino: addr::SockId, s: &Sock) {
        if s.closed.swap(true, Relaxed) {
            return;
        }
        self.socks.lock().unwrap().remove(&ino);
        let skel = s.slot.lock().unwrap().at.take();
        let (queued, peer, dma, remote) = {
            let mut st = s.st.lock().unwrap();
            (
                std::mem::take(&mut st.queue),
                st.local_peer.take(),
                st.dma.take(),
                st.remote.take(),
            )
        };
        if let Some(r) = remote {
            self.end_remote(&r, true);
        }
        if let Some(b) = dma {
            self.free_bufs(&b.mcomp, [b.tx, b.rx]);
        }
        drop(queued);
        if let Some(peer) = peer.and_then(|p| p.upgrade()) {
            bridge::end_stream(&peer);
        }
        s.changed.notify_all();
        if let Some((at, id)) = skel {
            let _ = self.call(&at, P2N_CLOSE { sock: id });
        }
    }

    /// The socket's buffers on an mComponent, made on first use (the DMA path).
    fn dma_bufs(&self, s: &Sock) -> Result<DmaBufs, i32> {
        if let Some(b) = s.st.lock().unwrap().dma.clone() {
            return Ok(b);
        }
        let mcomp = self
            .node
            .call_gm(P2G_PICK_HOME {
                vnode: s.spec.vnode.clone(),
                pcomp: self.node.id(),
            })
            .map_err(|e| errno_of(&e))?
            .mcomp
            .addr;
        let alloc = || {
            self.call(
                &mcomp,
                P2M_NETBUF_ALLOC {
                    vnode: s.spec.vnode.clone(),
                    bytes: bridge::CHUNK as u32,
                },
            )
            .map(|r| r.buf)
        };
        let (tx, rx) = (alloc()?, alloc()?);
        let mut st = s.st.lock().unwrap();
        match &st.dma {
            // The socket's other thread made them first.
            Some(b) => {
                let b = b.clone();
                drop(st);
                self.free_bufs(&mcomp, [tx, rx]);
                Ok(b)
            }
            // The socket closed meanwhile: nothing will free them later.
            None if s.closed.load(Relaxed) => {
                drop(st);
                self.free_bufs(&mcomp, [tx, rx]);
                Err(libc::EBADF)
            }
            None => {
                let b = DmaBufs { mcomp, tx, rx };
                st.dma = Some(b.clone());
                Ok(b)
            }
        }
    }

    fn free_bufs(&self, mcomp: &str, bufs: [u64; 2]) {
        for buf in bufs {
            let _ = self.call(mcomp, P2M_NETBUF_FREE { buf });
        }
    }

    /// The socket the program's descriptor `fd` is, if it is one of ours and the caller's.
    fn sock_of(&self, fd: &OwnedFd, vnode: &str) -> Result<Option<Found>, i32> {
        let Ok(ino) = addr::inode(fd.as_raw_fd()) else {
            return Ok(None);
        };
        let s = self.socks.lock().unwrap().get(&ino).cloned().map(Found::Stream);
        let s = s.or_else(|| self.dgrams.lock().unwrap().get(&ino).cloned().map(Found::Dgram));
        let owner = |f: &Found| match f {
            Found::Stream(s) => s.spec.vnode == vnode,
            Found::Dgram(d) => d.spec.vnode == vnode,
        };
        match s {
            Some(s) if owner(&s) => Ok(Some(s)),
            Some(_) => {
                self.c.refused.fetch_add(1, Relaxed);
                static THEIRS: Refusals = Refusals::new("refused a socket call on another vNode's socket");
                if THEIRS.log_this(format_args!("vNode {vnode}")) {
                    tracing::warn!(vnode, "refused a socket call on another vNode's socket");
                }
                Err(libc::EACCES)
            }
            None => Ok(None),
        }
    }

    /// Serves one socket call of a program of `vnode` run by `uid`.
    fn call_from(
        self: &Arc<Self>,
        vnode: &str,
        uid: u32,
        req: &NetReq,
        fd: Option<OwnedFd>,
    ) -> (NetResp, Option<OwnedFd>) {
        let mut resp = NetResp::new_zeroed();
        let op = NetOp::from_u32(req.op);
        let r = match (op, fd) {
            (Some(NetOp::Socket), _) => match self.socket(vnode, uid, req) {
                Ok(Some(fd)) => return (resp, Some(fd)),
                Ok(None) => Ok(Answer::Ret(NET_LOCAL)),
                Err(e) => Err(e),
            },
            (Some(op), Some(fd)) => match self.sock_of(&fd, vnode) {
                Ok(Some(Found::Stream(s))) => self.on_sock(op, &s, req, fd, &mut resp),
                Ok(Some(Found::Dgram(d))) => self.on_dgram(op, &d, req, fd, &mut resp),
                Ok(None) => Ok(Answer::Ret(NET_LOCAL)),
                Err(e) => Err(e),
            },
            _ => {
                self.c.refused.fetch_add(1, Relaxed);
                if MALFORMED.log_this(format_args!("uid {uid}")) {
                    tracing::warn!(vnode, op = req.op, "refused a malformed socket call");
                }
                Err(libc::EINVAL)
            }
        };
        match r {
            Ok(Answer::Fd(fd)) => (resp, Some(fd)),
            Ok(Answer::Ret(v)) => {
                resp.ret = v;
                (resp, None)
            }
            Err(e) => {
                resp.ret = -(e as i64);
                (resp, None)
            }
        }
    }

    /// A new socket, or None when the cluster has no nComponent: then the program's sockets
    /// are its host's.
    fn socket(self: &Arc<Self>, vnode: &str, uid: u32, req: &NetReq) -> Result<Option<OwnedFd>, i32> {
        let (family, kind, protocol) = (req.a as i32, req.b as i32, req.c as i32);
        let stream = kind == libc::SOCK_STREAM && matches!(protocol, 0 | libc::IPPROTO_TCP);
        let dgram = kind == libc::SOCK_DGRAM && matches!(protocol, 0 | libc::IPPROTO_UDP);
        if !matches!(family, libc::AF_INET | libc::AF_INET6) || !(stream || dgram) {
            return Err(libc::EPROTONOSUPPORT);
        }
        let udp_dir = self.udp_dir.get();
        if dgram && udp_dir.is_none() {
            return Ok(None);
        }
        match self.ncomp_for(vnode, None) {
            Err(e) if e == ErrCode::NotFound.errno() => return Ok(None),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let spec = Spec {
            vnode: vnode.to_string(),
            uid,
            family,
            kind,
            protocol,
        };
        let made = match udp_dir {
            Some(dir) if dgram => self.new_dgram(spec, dir),
            _ => self.new_sock(spec, Phase::Fresh, None).map(|(_, theirs)| theirs),
        };
        made.map(Some).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
    }
}

enum Answer {
    Ret(i64),
    Fd(OwnedFd),
}

/// A socket of the stub, by the program's end.
enum Found {
    Stream(Arc<Sock>),
    Dgram(Arc<dgram::Dgram>),
}

/// An address as the answer's data.
fn put_addr(resp: &mut NetResp, a: SocketAddr) {
    let (bytes, len) = addr::encode(a);
    resp.data[..len].copy_from_slice(&bytes[..len]);
    resp.len = len as u32;
}

/// Listens for programs' socket calls at `<program socket>.net`.
pub fn listen(p: Arc<Pcomp>, shim_sock: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut path = shim_sock.as_os_str().to_owned();
    path.push(std::ffi::OsStr::new(
        std::str::from_utf8(splitos_shim_abi::NET_SOCK_SUFFIX).expect("ASCII"),
    ));
    let path = std::path::PathBuf::from(path);
    if let Some(dir) = dgram::make_dir(shim_sock) {
        let _ = p.net.udp_dir.set(dir);
    }
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path)
        .map_err(|e| anyhow::anyhow!("cannot listen for socket calls on {}: {e}", path.display()))?;
    // Every user may connect: the caller must be a process of this pComponent.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    std::thread::Builder::new()
        .name("net-accept-calls".into())
        .spawn(move || {
            for s in l.incoming() {
                match s {
                    Ok(s) => admit(&p, s),
                    Err(e) => tracing::warn!(error = %e, "accepting a socket call failed"),
                }
            }
        })?;
    Ok(())
}

/// Socket calls that are not what the shim sends, from any program of a user.
static MALFORMED: Refusals = Refusals::new("refused a malformed socket call");

/// Socket calls served at once for users other than root, and for the programs of one vNode,
/// whatever users run them; beyond, a call is answered EAGAIN (a program retries its
/// connect). A vNode's calls that never say anything hold at most its share of threads,
/// never another vNode's.
const CALLS: usize = 256;
const CALLS_PER_VNODE: usize = 64;

/// Gives a call a thread of its own, if it comes from a process this pComponent runs and
/// there is room; otherwise answers it at once, without reading it.
fn admit(p: &Arc<Pcomp>, s: UnixStream) {
    let cred = splitos_rpc::fdpass::peer_cred(&s).ok();
    let caller = cred.as_ref().and_then(|c| {
        p.procs
            .lock()
            .unwrap()
            .values()
            .find(|pr| pr.os_pid == c.pid)
            .map(|pr| (pr.memory.who.vnode.clone(), pr.uid))
    });
    let refuse = |errno: i32| {
        let _ = s.set_nonblocking(true);
        let _ = (&s).write_all(
            NetResp {
                ret: -(errno as i64),
                ..NetResp::new_zeroed()
            }
            .as_bytes(),
        );
    };
    let Some((vnode, uid)) = caller else {
        p.net.c.refused.fetch_add(1, Relaxed);
        static STRANGER: Refusals = Refusals::new("refused a socket call of a process this pComponent does not run");
        if STRANGER.log_this(cred.map_or_else(|| "an unknown user".to_string(), |c| format!("uid {}", c.uid))) {
            tracing::warn!(
                uid = cred.map(|c| c.uid),
                "refused a socket call of a process this pComponent does not run"
            );
        }
        return refuse(libc::EACCES);
    };
    let Some(slot) = super::host::shim::take_slot(&p.net.calls, uid, vnode.clone()) else {
        p.net.c.busy.fetch_add(1, Relaxed);
        return refuse(libc::EAGAIN);
    };
    let p2 = p.clone();
    let _ = std::thread::Builder::new().name("net-call".into()).spawn(move || {
        serve_call(&p2, s, &vnode, uid);
        drop(slot);
    });
}

/// One socket call of a program of `vnode` run by `uid`: the request with its descriptor,
/// the answer with the new socket's.
fn serve_call(p: &Arc<Pcomp>, mut s: UnixStream, vnode: &str, uid: u32) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut req = NetReq::new_zeroed();
    let fds = match splitos_rpc::fdpass::recv_fds(&s, req.as_mut_bytes()) {
        Ok(f) => f,
        Err(e) => {
            p.net.c.refused.fetch_add(1, Relaxed);
            if MALFORMED.log_this(format_args!("uid {uid}")) {
                tracing::warn!(vnode, error = %e, "refused a malformed socket call");
            }
            return;
        }
    };
    let (resp, fd) = if req.abi != SHIM_ABI_VERSION {
        p.net.c.refused.fetch_add(1, Relaxed);
        static ABI: Refusals = Refusals::new("refused a socket call of another shim ABI version");
        if ABI.log_this(format_args!("uid {uid}")) {
            tracing::warn!(
                vnode,
                abi = req.abi,
                "refused a socket call of another shim ABI version"
            );
        }
        (
            NetResp {
                ret: -(libc::EPROTO as i64),
                ..NetResp::new_zeroed()
            },
            None,
        )
    } else {
        p.net.call_from(vnode, uid, &req, fds.into_iter().next())
    };
    let sent = match &fd {
        Some(fd) => splitos_rpc::fdpass::send_fds(&s, resp.as_bytes(), &[fd.as_raw_fd()]),
        None => s.write_all(resp.as_bytes()),
    };
    if let Err(e) = sent {
        tracing::debug!(error = %e, "a program left before its socket call was answered");
    }
}
