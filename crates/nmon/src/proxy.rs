//! The proxy: the nComponent's entry point for socket requests, the skeletons it made, and
//! the service registry of the ports they hold. Nothing here blocks: a request completes at
//! once on the thread that received it, or waits in its skeleton for the socket's next
//! readiness event (which the proxy thread watches) or its deadline.
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};
use serde_bytes::ByteBuf;
use splitos_rpc::refusals::Refusals;
use splitos_rpc::*;

use crate::series::Counters;

use super::netns::{Namespaces, Realm};
use super::skeleton::{refusal, Owner, Skeleton, State, MAX_WAIT};

const WAKER: Token = Token(usize::MAX);
/// Longest a closed socket may take to send what its program wrote before it closed.
const LINGER: Duration = Duration::from_secs(30);

/// A request: the message, its sender's key, where the answer goes.
pub struct Job(pub Msg, pub Option<[u8; 32]>, pub Reply);

/// The proxy as the monitor's dispatch table reaches it. A request is handled at once, on
/// the thread that received it; what must wait (bytes, a connection, room to send) waits in
/// its skeleton, and the proxy thread moves it along when the socket is ready.
pub struct ProxyHandle {
    state: Arc<Mutex<Proxy>>,
    waker: Arc<Waker>,
    outbox: Outbox,
}

/// Answers made while the proxy is locked, sent once it is not: sending one may wait for its
/// peer's connection, and a peer that stops reading must hold up no one else's socket.
#[derive(Clone, Default)]
struct Outbox(Arc<Mutex<Vec<(Reply, Msg)>>>);

impl Outbox {
    /// `reply`, answered later by [`Outbox::send`].
    fn hold(&self, reply: Reply) -> Reply {
        let q = self.0.clone();
        Box::new(move |m| q.lock().unwrap().push((reply, m)))
    }

    fn send(&self) {
        let ready = std::mem::take(&mut *self.0.lock().unwrap());
        for (reply, m) in ready {
            reply(m);
        }
    }
}

impl ProxyHandle {
    pub fn submit(&self, Job(msg, key, reply): Job) {
        self.locked(|p| {
            let Some(id) = p.request(msg, key, self.outbox.hold(reply)) else {
                return;
            };
            let now = Instant::now();
            p.progress(id, now);
            // A wait that ends before the proxy thread's next look: it must look sooner.
            let due = p.socks.get_mut(&id).and_then(|s| s.expire(now));
            if due.is_some_and(|d| p.next_deadline.is_none_or(|n| d < n)) {
                p.next_deadline = due;
                let _ = self.waker.wake();
            }
        });
    }

    /// Closes every socket of the pComponents the global managers say are lost.
    pub fn forget_owners(&self, keys: &[[u8; 32]]) {
        self.locked(|p| {
            let gone: Vec<u64> = p
                .socks
                .iter()
                .filter(|(_, s)| keys.contains(&s.owner.key))
                .map(|(id, _)| *id)
                .collect();
            if !gone.is_empty() {
                tracing::info!(sockets = gone.len(), "closing the sockets of lost pComponents");
            }
            for id in gone {
                p.forget(id);
            }
        });
    }

    /// How many vNodes have a loopback of their own here.
    pub fn loopbacks(&self) -> usize {
        self.state.lock().unwrap().ns.as_ref().map_or(0, Namespaces::count)
    }

    /// Whether socket `sock` is the sender's (before work is done for it elsewhere).
    pub fn owns(&self, sock: u64, key: Option<[u8; 32]>) -> bool {
        self.state
            .lock()
            .unwrap()
            .socks
            .get(&sock)
            .is_some_and(|s| key.is_none_or(|k| k == s.owner.key))
    }

    fn locked(&self, f: impl FnOnce(&mut Proxy)) {
        f(&mut self.state.lock().unwrap());
        self.outbox.send();
    }
}

struct Proxy {
    /// Where sockets are watched (the proxy thread's poll).
    watch: mio::Registry,
    socks: HashMap<u64, Skeleton>,
    /// The service registry: which vNode holds each (kind, port) on this nComponent, with
    /// how many of its sockets (SO_REUSEPORT) do.
    registry: Registry,
    next: u64,
    /// When the proxy thread looks again without an event.
    next_deadline: Option<Instant>,
    loopback: splitos_core::config::Loopback,
    /// The vNodes' loopbacks (with `loopback = "vnode"`, when this process may make them).
    ns: Option<Namespaces>,
    /// This host's addresses, which a connect to a listener here names, and where a server
    /// bound to all addresses listens beside its vNode's loopback.
    nics: Vec<std::net::IpAddr>,
    c: Arc<Counters>,
}

/// Starts the proxy thread.
pub fn start(
    c: Arc<Counters>,
    loopback: splitos_core::config::Loopback,
    nics: Vec<std::net::IpAddr>,
) -> anyhow::Result<ProxyHandle> {
    let mut poll = Poll::new()?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let ns = match loopback {
        splitos_core::config::Loopback::Host => None,
        splitos_core::config::Loopback::Vnode => Namespaces::new()
            .inspect_err(|e| tracing::warn!(error = %e, "cannot make network namespaces (the nComponent must run as root): vNodes' loopback servers are on this host's loopback, where any of its processes reaches them"))
            .ok(),
    };
    let p = Proxy {
        watch: poll.registry().try_clone()?,
        socks: HashMap::new(),
        registry: HashMap::new(),
        next: 1,
        next_deadline: None,
        loopback,
        ns,
        nics,
        c,
    };
    let state = Arc::new(Mutex::new(p));
    let outbox = Outbox::default();
    let (s2, o2) = (state.clone(), outbox.clone());
    std::thread::Builder::new()
        .name("proxy".into())
        .spawn(move || watch(&mut poll, &s2, &o2))?;
    Ok(ProxyHandle { state, waker, outbox })
}

/// The proxy thread: moves skeletons along when their sockets are ready, answers waits whose
/// time is up.
fn watch(poll: &mut Poll, state: &Mutex<Proxy>, outbox: &Outbox) {
    let mut events = Events::with_capacity(256);
    loop {
        let timeout = state
            .lock()
            .unwrap()
            .next_deadline
            .map(|d| d.saturating_duration_since(Instant::now()));
        if let Err(e) = poll.poll(&mut events, timeout) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::error!(error = %e, "the proxy's poll failed");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        {
            let mut p = state.lock().unwrap();
            let now = Instant::now();
            for e in events.iter().filter(|e| e.token() != WAKER) {
                p.progress(e.token().0 as u64, now);
            }
            p.next_deadline = p.expire(now);
        }
        outbox.send();
    }
}

fn errno_reply(reply: Reply, errno: i32) {
    reply(Msg::ERR(Refusal::errno(errno)))
}

impl Proxy {
    /// Moves skeleton `id` along after an event or a request.
    fn progress(&mut self, id: u64, now: Instant) {
        let Some(s) = self.socks.get_mut(&id) else { return };
        if matches!(s.state, State::Listening) {
            self.try_accept(id, now);
            return;
        }
        let (sent, received) = s.progress(now);
        self.c.wire_sent_bytes.fetch_add(sent, Relaxed);
        self.c.wire_received_bytes.fetch_add(received, Relaxed);
        if s.closing.is_some() && s.drained() {
            self.forget(id);
        }
    }

    fn try_accept(&mut self, id: u64, now: Instant) {
        let s = self.socks.get_mut(&id).expect("a listening skeleton");
        let Some((deadline, reply)) = s.take_accept_waiter() else {
            return;
        };
        match s.accept() {
            Ok((conn, peer, realm)) => {
                let (owner, spec) = (s.owner.clone(), s.spec());
                let Some(peer) = peer.as_socket() else {
                    return errno_reply(reply, libc::EAFNOSUPPORT);
                };
                if let Err(e) = conn.set_nonblocking(true) {
                    return reply(Msg::ERR(refusal(&e)));
                }
                let new = self.add(Skeleton::wrap(owner, conn, realm, spec, State::Connected));
                self.c.accepts.fetch_add(1, Relaxed);
                reply(N2P_ACCEPTED { sock: new, peer }.into());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && now < deadline => s.accept_later(deadline, reply),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => errno_reply(reply, libc::EAGAIN),
            Err(e) => reply(Msg::ERR(refusal(&e))),
        }
    }

    fn add(&mut self, s: Skeleton) -> u64 {
        let id = self.next;
        self.next += 1;
        self.socks.insert(id, s);
        self.watch_all(id);
        self.c.sockets.fetch_add(1, Relaxed);
        self.c.open.fetch_add(1, Relaxed);
        id
    }

    /// Watches every socket skeleton `id` has (a closed one left the poll with its
    /// descriptor; one watched already stays).
    fn watch_all(&self, id: u64) {
        let Some(s) = self.socks.get(&id) else { return };
        // A datagram socket's sends never wait for room here: only its receives are watched.
        let interest = if s.is_dgram() {
            Interest::READABLE
        } else {
            Interest::READABLE | Interest::WRITABLE
        };
        for fd in s.sockets().map(|s| s.as_raw_fd()) {
            match self.watch.register(&mut SourceFd(&fd), Token(id as usize), interest) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    tracing::warn!(error = %e, "cannot watch a socket")
                }
                _ => {}
            }
        }
    }

    fn forget(&mut self, id: u64) {
        if let Some(mut s) = self.socks.remove(&id) {
            let fd = s.fd();
            let _ = self.watch.deregister(&mut SourceFd(&fd));
            if let Some(port) = s.port {
                release(&mut self.registry, port);
            }
            s.end();
            self.c.open.fetch_sub(1, Relaxed);
        }
    }

    fn expire(&mut self, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut gone = Vec::new();
        for (id, s) in self.socks.iter_mut() {
            match s.closing {
                Some(d) if d <= now => gone.push(*id),
                closing => {
                    for d in s.expire(now).into_iter().chain(closing) {
                        next = Some(next.map_or(d, |n| n.min(d)));
                    }
                }
            }
        }
        for id in gone {
            tracing::debug!(sock = id, "a closed socket could not send all it held in time");
            self.forget(id);
        }
        next
    }

    /// The pComponent of a listener of `vnode` that takes direct connections and that a
    /// connect to `a` reaches: on its port, bound to `a`'s address or to all of this host's
    /// (loopback included).
    fn find_listener(&self, vnode: &str, a: std::net::SocketAddr) -> Option<String> {
        let ip = a.ip().to_canonical();
        let here = ip.is_loopback() || ip.is_unspecified() || self.nics.iter().any(|n| n.to_canonical() == ip);
        let mut candidates = self.socks.values().filter(|s| {
            s.direct.is_some()
                && s.port.is_some_and(|p| p == (libc::SOCK_STREAM, a.port()))
                && s.owner.vnode == vnode
                && matches!(s.state, State::Listening)
        });
        candidates.find_map(|s| {
            let bound = s.socket.local_addr().ok().and_then(|l| l.as_socket())?;
            (bound.ip().to_canonical() == ip || (bound.ip().is_unspecified() && here))
                .then(|| s.direct.clone())
                .flatten()
        })
    }

    /// Handles one request; returns the skeleton to move along afterwards.
    fn request(&mut self, msg: Msg, key: Option<[u8; 32]>, reply: Reply) -> Option<u64> {
        let name = msg.name();
        crate::series::REQUESTS.with([name]).increment(1);
        if let Msg::P2N_FIND_LISTENER(r) = &msg {
            reply(
                N2P_LISTENER {
                    pcomp: self.find_listener(&r.vnode, r.addr),
                }
                .into(),
            );
            return None;
        }
        let sock = match &msg {
            Msg::P2N_SOCKET(_) => 0,
            Msg::P2N_SETSOCKOPT(r) => r.sock,
            Msg::P2N_GETSOCKOPT(r) => r.sock,
            Msg::P2N_BIND(r) => r.sock,
            Msg::P2N_LISTEN(r) => r.sock,
            Msg::P2N_ACCEPT(r) => r.sock,
            Msg::P2N_CONNECT(r) => r.sock,
            Msg::P2N_NAME(r) => r.sock,
            Msg::P2N_SEND(r) => r.sock,
            Msg::P2N_RECV(r) => r.sock,
            Msg::P2N_SHUTDOWN(r) => r.sock,
            Msg::P2N_CLOSE(r) => r.sock,
            Msg::P2N_SENDTO(r) => r.sock,
            Msg::P2N_RECVFROM(r) => r.sock,
            Msg::P2N_DISCONNECT(r) => r.sock,
            other => {
                reply(Msg::ERR(
                    Unhandled {
                        by: "the proxy does",
                        msg: other.name(),
                    }
                    .into(),
                ));
                return None;
            }
        };
        if let Msg::P2N_SOCKET(r) = msg {
            let owner = Owner {
                key: key.unwrap_or([0; 32]),
                vnode: r.vnode,
                uid: r.uid,
            };
            match Skeleton::new(owner, r.family, r.kind, r.protocol) {
                Ok(s) => {
                    let id = self.add(s);
                    reply(N2P_SOCKET { sock: id }.into());
                }
                Err(e) => reply(Msg::ERR(e)),
            }
            return None;
        }
        let s = match owned(&mut self.socks, &self.c, sock, key) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(request = name, sock, "request refused");
                reply(Msg::ERR(e));
                return None;
            }
        };
        let for_dgram = matches!(msg, Msg::P2N_SENDTO(_) | Msg::P2N_RECVFROM(_) | Msg::P2N_DISCONNECT(_));
        let for_stream = matches!(
            msg,
            Msg::P2N_LISTEN(_) | Msg::P2N_ACCEPT(_) | Msg::P2N_SEND(_) | Msg::P2N_RECV(_)
        );
        if (for_dgram && !s.is_dgram()) || (for_stream && s.is_dgram()) {
            errno_reply(reply, libc::EOPNOTSUPP);
            return None;
        }
        let now = Instant::now();
        match msg {
            Msg::P2N_SETSOCKOPT(r) => reply(on(r, |r| set_option(s, r.level, r.name, &r.value))),
            Msg::P2N_GETSOCKOPT(r) => reply(on(r, |r| get_option(s, r.level, r.name, r.len))),
            Msg::P2N_BIND(r) => {
                let res = bind(s, &mut self.registry, self.ns.as_ref(), &self.nics, r.addr);
                reply(match res {
                    Ok(addr) => N2P_ADDR { addr }.into(),
                    Err(e) => Msg::ERR(e),
                });
                self.watch_all(sock);
            }
            Msg::P2N_LISTEN(r) => {
                let res = s.listen(r.backlog.clamp(1, 4096));
                reply(match res {
                    Ok(()) => {
                        s.direct = r.direct;
                        OK.into()
                    }
                    Err(e) => Msg::ERR(refusal(&e)),
                });
            }
            Msg::P2N_ACCEPT(r) => {
                if !matches!(s.state, State::Listening) {
                    errno_reply(reply, libc::EINVAL);
                    return None;
                }
                s.accept_later(now + Duration::from_millis(r.wait_ms as u64).min(MAX_WAIT), reply);
                return Some(sock);
            }
            Msg::P2N_CONNECT(r) => {
                // The stub asks again while a connect is under way: count the first ask.
                if matches!(s.state, State::Fresh) {
                    self.c.connects.fetch_add(1, Relaxed);
                }
                if !loopback_allowed(self.loopback, &self.registry, &s.owner.vnode, s.kind, r.addr) {
                    self.c.refused.fetch_add(1, Relaxed);
                    static NOT_HELD: Refusals =
                        Refusals::new("refused a connect to a loopback port the vNode does not hold");
                    if NOT_HELD.log_this(format_args!("vNode {}", s.owner.vnode)) {
                        tracing::info!(vnode = %s.owner.vnode, port = r.addr.port(), "refused a connect to a loopback port the vNode does not hold");
                    }
                    errno_reply(reply, libc::ECONNREFUSED);
                    return None;
                }
                // A connect under way stays where it began.
                let movable = matches!(s.state, State::Fresh) || (s.is_dgram() && matches!(s.state, State::Connected));
                let placed = match &self.ns {
                    Some(ns) if movable => s.place_for(ns, r.addr),
                    _ => Ok(()),
                };
                if let Err(e) = placed {
                    reply(Msg::ERR(e));
                    return None;
                }
                s.connect(r.addr, now, reply);
                self.watch_all(sock);
                return Some(sock);
            }
            Msg::P2N_NAME(r) => {
                let a = if r.peer {
                    s.socket.peer_addr()
                } else {
                    s.socket.local_addr()
                };
                reply(match a.map(|a| a.as_socket()) {
                    Ok(Some(addr)) => N2P_ADDR { addr }.into(),
                    Ok(None) => Msg::ERR(Refusal::errno(libc::EAFNOSUPPORT)),
                    Err(e) => Msg::ERR(refusal(&e)),
                });
            }
            Msg::P2N_SEND(r) => {
                s.send(r.data, now, reply);
                return Some(sock);
            }
            Msg::P2N_RECV(r) => {
                s.recv(
                    r.max as usize,
                    now + Duration::from_millis(r.wait_ms as u64).min(MAX_WAIT),
                    reply,
                );
                return Some(sock);
            }
            Msg::P2N_SHUTDOWN(r) => {
                reply(match s.shutdown(r.how) {
                    Ok(()) => OK.into(),
                    Err(e) => Msg::ERR(e),
                });
                return Some(sock);
            }
            Msg::P2N_SENDTO(r) => {
                let mut grams = r.grams;
                let before = grams.len();
                // The kernel's first send binds a socket to all addresses, as bind does here.
                let unbound = s.port.is_none() && matches!(s.state, State::Fresh);
                if let Some(ns) = self.ns.as_ref().filter(|_| unbound) {
                    let any: std::net::IpAddr = if s.spec().0 == libc::AF_INET6 {
                        std::net::Ipv6Addr::UNSPECIFIED.into()
                    } else {
                        std::net::Ipv4Addr::UNSPECIFIED.into()
                    };
                    if let Err(e) = bind(
                        s,
                        &mut self.registry,
                        Some(ns),
                        &self.nics,
                        std::net::SocketAddr::new(any, 0),
                    ) {
                        reply(Msg::ERR(e));
                        return None;
                    }
                    self.watch_all(sock);
                }
                let s = self.socks.get_mut(&sock)?;
                let (registry, loopback) = (&self.registry, self.loopback);
                grams.retain(|g| {
                    g.addr
                        .is_none_or(|a| loopback_allowed(loopback, registry, &s.owner.vnode, s.kind, a))
                });
                let refused = (before - grams.len()) as u64;
                if refused > 0 {
                    self.c.refused.fetch_add(refused, Relaxed);
                    static NOT_HELD: Refusals =
                        Refusals::new("dropped datagrams to loopback ports the vNode does not hold");
                    if NOT_HELD.log_this(format_args!("vNode {}", s.owner.vnode)) {
                        tracing::info!(vnode = %s.owner.vnode, datagrams = refused, "dropped datagrams to loopback ports the vNode does not hold");
                    }
                }
                let n = grams.len() as u64;
                let (sent, dropped) = s.send_grams(grams);
                self.c.wire_sent_bytes.fetch_add(sent, Relaxed);
                self.c.datagrams_sent.fetch_add(n - dropped, Relaxed);
                self.c.datagrams_dropped.fetch_add(dropped + refused, Relaxed);
                // A socket that sent before it was bound has a port now: the registry holds it
                // for the vNode, so that no other vNode can bind it and take its answers.
                if s.port.is_none() {
                    if let Some(a) = s
                        .socket
                        .local_addr()
                        .ok()
                        .and_then(|a| a.as_socket())
                        .filter(|a| a.port() != 0)
                    {
                        self.registry
                            .entry((s.kind, a.port()))
                            .or_insert_with(|| (s.owner.vnode.clone(), 0))
                            .1 += 1;
                        s.port = Some((s.kind, a.port()));
                    }
                }
                reply(OK.into());
            }
            Msg::P2N_RECVFROM(r) => {
                s.recv(
                    r.max as usize,
                    now + Duration::from_millis(r.wait_ms as u64).min(MAX_WAIT),
                    reply,
                );
                return Some(sock);
            }
            Msg::P2N_DISCONNECT(_) => reply(match s.disconnect() {
                Ok(()) => OK.into(),
                Err(e) => Msg::ERR(e),
            }),
            Msg::P2N_CLOSE(_) => {
                s.closing = Some(now + LINGER);
                reply(OK.into());
                if !matches!(s.state, State::Connected) || s.drained() {
                    self.forget(sock);
                    return None;
                }
                // The port is free for others at once, as the kernel's is.
                if let Some(port) = s.port.take() {
                    release(&mut self.registry, port);
                }
                return Some(sock);
            }
            _ => unreachable!("matched above"),
        }
        None
    }
}

/// The skeleton `id` if it belongs to the sender.
fn owned<'a>(
    socks: &'a mut HashMap<u64, Skeleton>,
    c: &Counters,
    id: u64,
    key: Option<[u8; 32]>,
) -> Result<&'a mut Skeleton, Refusal> {
    match socks.get_mut(&id) {
        Some(s) if key.is_none_or(|k| k == s.owner.key) => Ok(s),
        Some(_) => {
            c.refused.fetch_add(1, Relaxed);
            static NOT_YOURS: Refusals = Refusals::new("refused a request about a socket another pComponent made");
            let peer = splitos_rpc::current_peer().map_or_else(|| "?".to_string(), |p| p.to_string());
            if NOT_YOURS.log_this(&peer) {
                tracing::warn!(
                    sock = id,
                    peer,
                    "refused a request about a socket another pComponent made"
                );
            }
            Err(SocketError::NotYours(id).into())
        }
        None => Err(Refusal::errno(libc::EBADF)),
    }
}

/// Why the nComponent refuses a socket's request.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// A request about a socket another pComponent made.
    #[error("socket {0} is not yours")]
    NotYours(u64),
    #[error("the nComponent's DMA engine is gone")]
    DmaGone,
    #[error("a newer receive on this socket replaced this one")]
    Replaced,
}

impl Refuse for SocketError {
    fn code(&self) -> ErrCode {
        match self {
            SocketError::NotYours(_) => ErrCode::Denied,
            SocketError::DmaGone => ErrCode::Internal,
            SocketError::Replaced => ErrCode::Invalid,
        }
    }
}

type Registry = HashMap<(i32, u16), (String, usize)>;

/// Loopback is the vNode's own: the host's private services and other vNodes' loopback
/// servers are not there for it.
fn loopback_allowed(
    loopback: splitos_core::config::Loopback,
    registry: &Registry,
    vnode: &str,
    kind: i32,
    a: std::net::SocketAddr,
) -> bool {
    // The unspecified address reaches this host's loopback too, as Linux routes it.
    let ip = a.ip().to_canonical();
    loopback != splitos_core::config::Loopback::Vnode
        || !(ip.is_loopback() || ip.is_unspecified())
        || registry.get(&(kind, a.port())).is_some_and(|(v, _)| v == vnode)
}

fn release(registry: &mut Registry, port: (i32, u16)) {
    if let Some((_, n)) = registry.get_mut(&port) {
        *n -= 1;
        if *n == 0 {
            registry.remove(&port);
        }
    }
}

/// Binds through the service registry: a port another vNode holds here is in use, whatever
/// the socket's options say, and ports below 1024 are root's. With the vNodes' loopbacks
/// (`ns`), a loopback address or all of them is bound in the vNode's (all of them: also on
/// each of `nics`), any other in the host's namespace.
fn bind(
    s: &mut Skeleton,
    registry: &mut Registry,
    ns: Option<&Namespaces>,
    nics: &[std::net::IpAddr],
    addr: std::net::SocketAddr,
) -> Result<std::net::SocketAddr, Refusal> {
    let port = addr.port();
    if port != 0 && port < 1024 && s.owner.uid != 0 {
        return Err(Refusal::errno(libc::EACCES));
    }
    let holder = registry.get(&(s.kind, port)).filter(|_| port != 0).map(|(v, _)| v);
    if holder.is_some_and(|v| *v != s.owner.vnode) {
        return Err(Refusal::errno(libc::EADDRINUSE));
    }
    // A socket bound already fails as the kernel's does, where it is.
    if let Some(ns) = ns.filter(|_| s.port.is_none() && matches!(s.state, State::Fresh)) {
        let want = Realm::of(addr.ip());
        if s.realm != want {
            s.remake(ns, want)?;
        }
    }
    let local = s.bind_all(ns, nics, addr, s.reuseport && holder.is_some())?;
    registry
        .entry((s.kind, local.port()))
        .or_insert_with(|| (s.owner.vnode.clone(), 0))
        .1 += 1;
    s.port = Some((s.kind, local.port()));
    Ok(local)
}

/// Options a program of any user may set or read: those its own kernel would let an
/// unprivileged program set (this monitor's privileges are not the program's; neither is a
/// choice of congestion control, which may load a kernel module).
fn allowed(level: i32, name: i32) -> bool {
    match level {
        libc::SOL_SOCKET => matches!(
            name,
            libc::SO_REUSEADDR
                | libc::SO_REUSEPORT
                | libc::SO_KEEPALIVE
                | libc::SO_LINGER
                | libc::SO_RCVBUF
                | libc::SO_SNDBUF
                | libc::SO_RCVLOWAT
                | libc::SO_SNDLOWAT
                | libc::SO_BROADCAST
                | libc::SO_OOBINLINE
                | libc::SO_ERROR
                | libc::SO_TYPE
                | libc::SO_DOMAIN
                | libc::SO_PROTOCOL
                | libc::SO_ACCEPTCONN
                | libc::SO_TIMESTAMP
                | libc::SO_ZEROCOPY
        ),
        libc::IPPROTO_TCP => matches!(
            name,
            libc::TCP_NODELAY
                | libc::TCP_MAXSEG
                | libc::TCP_CORK
                | libc::TCP_KEEPIDLE
                | libc::TCP_KEEPINTVL
                | libc::TCP_KEEPCNT
                | libc::TCP_SYNCNT
                | libc::TCP_LINGER2
                | libc::TCP_DEFER_ACCEPT
                | libc::TCP_INFO
                | libc::TCP_QUICKACK
                | libc::TCP_USER_TIMEOUT
                | libc::TCP_FASTOPEN
                | libc::TCP_NOTSENT_LOWAT
        ),
        libc::IPPROTO_IP => matches!(
            name,
            libc::IP_TOS | libc::IP_TTL | libc::IP_RECVERR | libc::IP_MTU_DISCOVER | libc::IP_MTU
        ),
        libc::IPPROTO_IPV6 => matches!(
            name,
            libc::IPV6_V6ONLY
                | libc::IPV6_TCLASS
                | libc::IPV6_UNICAST_HOPS
                | libc::IPV6_RECVERR
                | libc::IPV6_MTU_DISCOVER
                | libc::IPV6_MTU
        ),
        _ => false,
    }
}

fn check_allowed(s: &Skeleton, level: i32, name: i32) -> Result<(), Refusal> {
    if s.owner.uid != 0 && !allowed(level, name) {
        static ROOTS: Refusals = Refusals::new("refused a socket option reserved to root");
        if ROOTS.log_this(format_args!("uid {}", s.owner.uid)) {
            tracing::info!(level, name, vnode = %s.owner.vnode, uid = s.owner.uid, "refused a socket option reserved to root");
        }
        return Err(Refusal::errno(libc::EPERM));
    }
    Ok(())
}

fn set_option(s: &mut Skeleton, level: i32, name: i32, value: &[u8]) -> Result<OK, Refusal> {
    check_allowed(s, level, name)?;
    if value.len() > 256 {
        return Err(Refusal::errno(libc::EINVAL));
    }
    s.set_option(level, name, value).map_err(|e| refusal(&e))?;
    if level == libc::SOL_SOCKET && name == libc::SO_REUSEPORT {
        s.reuseport = value.iter().any(|b| *b != 0);
    }
    Ok(OK)
}

fn get_option(s: &mut Skeleton, level: i32, name: i32, len: u32) -> Result<N2P_OPT, Refusal> {
    check_allowed(s, level, name)?;
    let mut buf = vec![0u8; (len as usize).min(512)];
    let mut n = buf.len() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `n` bytes into the live buffer and stores the length.
    let r = unsafe { libc::getsockopt(s.socket.as_raw_fd(), level, name, buf.as_mut_ptr().cast(), &mut n) };
    if r != 0 {
        return Err(refusal(&std::io::Error::last_os_error()));
    }
    buf.truncate(n as usize);
    Ok(N2P_OPT {
        value: ByteBuf::from(buf),
    })
}
