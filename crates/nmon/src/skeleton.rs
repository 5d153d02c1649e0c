//! A socket skeleton: one socket on this host's stack, made for a program's socket stub, with
//! the requests of that stub that wait for the socket (a connection, bytes, room to send).
//! Everything here runs on the proxy's one thread, with the socket non-blocking: each
//! operation either completes now or leaves its waiter for the next readiness event.
mod nics;

use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::AsRawFd;
use std::time::Instant;

use serde_bytes::ByteBuf;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use splitos_rpc::{Datagram, Msg, Refusal, Reply, N2P_ADDR, N2P_DATA, N2P_GRAMS, OK};

use super::netns::{Namespaces, Realm};
use super::proxy::SocketError;

/// Bytes a skeleton holds for sending before it makes its stub wait: enough to keep a
/// connection busy between two of the stub's sends.
pub const SEND_QUEUE: usize = 256 << 10;
/// Most bytes one receive hands back.
pub const RECV_MAX: usize = 256 << 10;
/// Room for one received datagram: the largest an IP packet holds.
pub const GRAM_MAX: usize = 65535;
/// Most datagrams one receive hands back.
const GRAMS_MAX: usize = 1024;
/// Peers whose part a skeleton remembers (a datagram to another asks the routes).
const ROUTES: usize = 16;

/// Who a skeleton belongs to: the pComponent that made it (its credentials' key), the vNode
/// and the user of the program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub key: [u8; 32],
    pub vnode: String,
    pub uid: u32,
}

pub enum State {
    Fresh,
    /// A connect under way, and the request waiting for it (none between the stub's asks).
    Connecting(Option<(Instant, Reply)>),
    Connected,
    Listening,
}

/// Longest a connect or a send waits before it is answered "not yet" (`EINPROGRESS`,
/// `EAGAIN`) and the stub asks again: no request stays long at the nComponent.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

pub struct Skeleton {
    pub owner: Owner,
    pub socket: Socket,
    /// Where `socket` is (the vNodes' loopbacks: [`super::netns`]).
    pub realm: Realm,
    /// The parts on the host's interface addresses of a socket in its vNode's loopback that
    /// is bound to all addresses (a server on 0.0.0.0, a datagram socket that sent before it
    /// was bound): one per address, on its port.
    pub nic_parts: Vec<Socket>,
    family: i32,
    /// SOCK_STREAM or SOCK_DGRAM.
    pub kind: i32,
    protocol: i32,
    /// Every option set (and accepted), to set again on a socket made anew elsewhere.
    opts: Vec<(i32, i32, Vec<u8>)>,
    /// The part each of the last peers of its datagrams went from.
    routes: Vec<(std::net::IpAddr, usize)>,
    pub state: State,
    /// The (kind, port) this socket holds in the service registry.
    pub port: Option<(i32, u16)>,
    /// Bytes taken from the stub, not yet taken by the kernel.
    sendq: VecDeque<u8>,
    /// Sends that did not fit the queue, answered when they do, in order, or not taken at
    /// their deadline.
    send_waiters: VecDeque<(ByteBuf, Instant, Reply)>,
    /// How the last connect failed, for the stub's next ask when no request was waiting.
    connect_err: Option<i32>,
    /// A receive waiting for bytes: at most this many, answered empty at the deadline.
    recv_waiter: Option<(usize, Instant, Reply)>,
    accept_waiter: Option<(Instant, Reply)>,
    /// The stub asked to shut down writing once the queue is empty.
    shut_wr: bool,
    /// The stub closed the socket: it goes once the queue is empty, or at this deadline.
    pub closing: Option<Instant>,
    eof: bool,
    /// An error the socket reported (ECONNRESET, EPIPE): every later operation gets it.
    err: Option<i32>,
    /// Whether SO_REUSEPORT was asked for: applied only among one vNode's sockets.
    pub reuseport: bool,
    /// A listener's pComponent, where programs of the vNode on other pComponents connect to
    /// it directly.
    pub direct: Option<String>,
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

pub fn refusal(e: &std::io::Error) -> Refusal {
    Refusal::errno(errno_of(e))
}

/// The kind of socket a skeleton's sockets are, as socket2 names it.
fn kind_of(family: i32, kind: i32, protocol: i32) -> Result<(Domain, Type, Option<Protocol>), Refusal> {
    let domain = match family {
        libc::AF_INET => Domain::IPV4,
        libc::AF_INET6 => Domain::IPV6,
        _ => return Err(Refusal::errno(libc::EAFNOSUPPORT)),
    };
    let ty = match kind {
        libc::SOCK_STREAM => Type::STREAM,
        libc::SOCK_DGRAM => Type::DGRAM,
        _ => return Err(Refusal::errno(libc::ESOCKTNOSUPPORT)),
    };
    Ok((domain, ty, (protocol != 0).then_some(Protocol::from(protocol))))
}

/// Sets an option on a socket as setsockopt(2) does.
fn set_raw_option(s: &Socket, level: i32, name: i32, value: &[u8]) -> std::io::Result<()> {
    // SAFETY: setsockopt reads `value.len()` bytes from a live slice; the kernel checks the
    // option and its size.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            value.as_ptr().cast(),
            value.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Binds `s` to `addr`. SO_REUSEPORT shares a port only among sockets of one user, and every
/// skeleton is this monitor's: it applies only when the vNode already holds the port (`share`).
fn bind_one(s: &Socket, addr: SocketAddr, reuseport: bool, share: bool) -> std::io::Result<()> {
    if reuseport && !share {
        s.set_reuse_port(false)?;
    }
    let bound = s.bind(&SockAddr::from(addr));
    if reuseport && !share {
        let _ = s.set_reuse_port(true);
    }
    bound
}

impl Skeleton {
    pub fn new(owner: Owner, family: i32, kind: i32, protocol: i32) -> Result<Skeleton, Refusal> {
        let (domain, ty, proto) = kind_of(family, kind, protocol)?;
        let socket = Socket::new(domain, ty, proto).map_err(|e| refusal(&e))?;
        socket.set_nonblocking(true).map_err(|e| refusal(&e))?;
        Ok(Skeleton::wrap(
            owner,
            socket,
            Realm::Host,
            (family, kind, protocol),
            State::Fresh,
        ))
    }

    /// A skeleton of `socket` in `realm`, of `(family, kind, protocol)`.
    pub fn wrap(
        owner: Owner,
        socket: Socket,
        realm: Realm,
        (family, kind, protocol): (i32, i32, i32),
        state: State,
    ) -> Skeleton {
        Skeleton {
            owner,
            socket,
            realm,
            nic_parts: Vec::new(),
            family,
            kind,
            protocol,
            opts: Vec::new(),
            routes: Vec::new(),
            state,
            port: None,
            sendq: VecDeque::new(),
            send_waiters: VecDeque::new(),
            connect_err: None,
            recv_waiter: None,
            accept_waiter: None,
            shut_wr: false,
            closing: None,
            eof: false,
            err: None,
            reuseport: false,
            direct: None,
        }
    }

    pub fn fd(&self) -> i32 {
        self.socket.as_raw_fd()
    }

    /// Its family, kind and protocol, for a socket accepted on it.
    pub fn spec(&self) -> (i32, i32, i32) {
        (self.family, self.kind, self.protocol)
    }

    /// Every socket it has: its own, then its parts on the host's interface addresses.
    pub fn sockets(&self) -> impl Iterator<Item = &Socket> {
        std::iter::once(&self.socket).chain(&self.nic_parts)
    }

    /// Sets an option on every socket it has, and keeps it for a socket made anew.
    pub fn set_option(&mut self, level: i32, name: i32, value: &[u8]) -> std::io::Result<()> {
        for s in self.sockets() {
            set_raw_option(s, level, name, value)?;
        }
        self.opts.retain(|(l, n, _)| (*l, *n) != (level, name));
        self.opts.push((level, name, value.to_vec()));
        Ok(())
    }

    /// A socket like this one's in `realm`, with the options set so far.
    fn make(&self, ns: &Namespaces, realm: Realm) -> Result<Socket, Refusal> {
        let (domain, ty, proto) = kind_of(self.family, self.kind, self.protocol)?;
        let s = ns
            .socket(realm, &self.owner.vnode, domain, ty, proto)
            .map_err(|e| refusal(&e))?;
        for (level, name, value) in &self.opts {
            // Each was accepted once, by the same kind of socket.
            if let Err(e) = set_raw_option(&s, *level, *name, value) {
                tracing::debug!(level, name, error = %e, "an option did not carry over to a socket made anew");
            }
        }
        Ok(s)
    }

    /// Replaces its (unbound, unconnected) socket with one in `realm`.
    pub fn remake(&mut self, ns: &Namespaces, realm: Realm) -> Result<(), Refusal> {
        self.socket = self.make(ns, realm)?;
        self.realm = realm;
        self.nic_parts.clear();
        self.routes.clear();
        Ok(())
    }

    /// Listens on every socket it has.
    pub fn listen(&mut self, backlog: i32) -> std::io::Result<()> {
        for s in self.sockets() {
            s.listen(backlog)?;
        }
        self.state = State::Listening;
        Ok(())
    }

    /// A connection waiting on any of its sockets, and where it is.
    pub fn accept(&self) -> std::io::Result<(Socket, SockAddr, Realm)> {
        let mut last = std::io::Error::from(ErrorKind::WouldBlock);
        for (i, s) in self.sockets().enumerate() {
            match s.accept() {
                Ok((c, peer)) => return Ok((c, peer, if i == 0 { self.realm } else { Realm::Host })),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Starts a connect, or waits for the one under way (the stub asks again after each
    /// `EINPROGRESS`).
    pub fn connect(&mut self, addr: SocketAddr, now: Instant, reply: Reply) {
        let dgram = self.is_dgram();
        match &mut self.state {
            // A datagram socket connects again, to its new peer.
            State::Connected if !dgram => return reply(self.local()),
            State::Listening => return reply(Msg::ERR(Refusal::errno(libc::EISCONN))),
            State::Connecting(w) => {
                if let Some((_, old)) = w.replace((now + MAX_WAIT, reply)) {
                    old(Msg::ERR(Refusal::errno(libc::EALREADY)));
                }
                return;
            }
            State::Fresh | State::Connected => {}
        }
        if let Some(e) = self.connect_err.take() {
            return reply(Msg::ERR(Refusal::errno(e)));
        }
        match self.socket.connect(&SockAddr::from(addr)) {
            Ok(()) => {
                self.state = State::Connected;
                reply(self.local());
            }
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => {
                self.state = State::Connecting(Some((now + MAX_WAIT, reply)))
            }
            Err(e) => reply(Msg::ERR(refusal(&e))),
        }
    }

    fn local(&self) -> Msg {
        match self.socket.local_addr().ok().and_then(|a| a.as_socket()) {
            Some(addr) => N2P_ADDR { addr }.into(),
            None => Msg::ERR(Refusal::errno(libc::EINVAL)),
        }
    }

    pub fn send(&mut self, data: ByteBuf, now: Instant, reply: Reply) {
        if let Some(e) = self.err {
            return reply(Msg::ERR(Refusal::errno(e)));
        }
        if self.shut_wr || self.closing.is_some() {
            return reply(Msg::ERR(Refusal::errno(libc::EPIPE)));
        }
        self.send_waiters.push_back((data, now + MAX_WAIT, reply));
    }

    pub fn is_dgram(&self) -> bool {
        self.kind == libc::SOCK_DGRAM
    }

    /// Sends datagrams at once (a datagram socket has no queue here: what the kernel does
    /// not take is lost, as on a full interface). Returns the bytes sent and the datagrams
    /// dropped.
    pub fn send_grams(&mut self, grams: Vec<Datagram>) -> (u64, u64) {
        let (mut sent, mut dropped) = (0u64, 0u64);
        for g in grams {
            let r = match g.addr {
                Some(a) => self.sender_for(a).send_to(&g.data, &SockAddr::from(a)),
                None => self.socket.send(&g.data),
            };
            match r {
                Ok(n) => sent += n as u64,
                Err(e) => {
                    dropped += 1;
                    tracing::debug!(error = %e, to = ?g.addr, "a datagram could not be sent");
                }
            }
        }
        (sent, dropped)
    }

    /// Disconnects a datagram socket (connect to AF_UNSPEC).
    pub fn disconnect(&mut self) -> Result<(), Refusal> {
        // SAFETY: sockaddr is plain data; connect(2) reads the family of the live value.
        let r = unsafe {
            let mut sa: libc::sockaddr = std::mem::zeroed();
            sa.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
            libc::connect(self.fd(), &sa, std::mem::size_of::<libc::sockaddr>() as libc::socklen_t)
        };
        if r != 0 {
            return Err(refusal(&std::io::Error::last_os_error()));
        }
        self.state = State::Fresh;
        Ok(())
    }

    pub fn recv(&mut self, max: usize, deadline: Instant, reply: Reply) {
        if let Some((_, _, old)) = self.recv_waiter.take() {
            old(Msg::ERR(SocketError::Replaced.into()));
        }
        self.recv_waiter = Some((max.clamp(1, RECV_MAX), deadline, reply));
    }

    pub fn accept_later(&mut self, deadline: Instant, reply: Reply) {
        if let Some((_, old)) = self.accept_waiter.take() {
            old(Msg::ERR(Refusal::errno(libc::EAGAIN)));
        }
        self.accept_waiter = Some((deadline, reply));
    }

    /// A waiting accept, for the proxy, which makes the new skeleton.
    pub fn take_accept_waiter(&mut self) -> Option<(Instant, Reply)> {
        self.accept_waiter.take()
    }

    pub fn shutdown(&mut self, how: i32) -> Result<(), Refusal> {
        let read = how == libc::SHUT_RD || how == libc::SHUT_RDWR;
        let write = how == libc::SHUT_WR || how == libc::SHUT_RDWR;
        if !read && !write {
            return Err(Refusal::errno(libc::EINVAL));
        }
        if read {
            self.socket.shutdown(Shutdown::Read).map_err(|e| refusal(&e))?;
        }
        self.shut_wr |= write;
        Ok(())
    }

    /// Moves everything that can move now: a finished connect, queued bytes out, waiting sends
    /// into the queue, received bytes to a waiting receive. Returns the bytes sent and
    /// received.
    pub fn progress(&mut self, now: Instant) -> (u64, u64) {
        if let State::Connecting(_) = self.state {
            let done = match self.socket.take_error() {
                Ok(Some(e)) => Some(Err(e)),
                Err(e) => Some(Err(e)),
                Ok(None) => match self.socket.peer_addr() {
                    Ok(_) => Some(Ok(())),
                    Err(e) if e.kind() == ErrorKind::NotConnected => None,
                    Err(e) => Some(Err(e)),
                },
            };
            if let Some(r) = done {
                let State::Connecting(waiter) = std::mem::replace(&mut self.state, State::Fresh) else {
                    unreachable!()
                };
                match r {
                    Ok(()) => {
                        self.state = State::Connected;
                        if let Some((_, reply)) = waiter {
                            reply(self.local());
                        }
                    }
                    Err(e) => match waiter {
                        Some((_, reply)) => reply(Msg::ERR(refusal(&e))),
                        None => self.connect_err = Some(errno_of(&e)),
                    },
                }
            }
        }
        if self.is_dgram() {
            return (0, self.deliver_grams(now));
        }
        if !matches!(self.state, State::Connected) {
            return (0, 0);
        }
        let sent = self.flush();
        let received = self.deliver(now);
        (sent, received)
    }

    fn flush(&mut self) -> u64 {
        let mut sent = 0u64;
        loop {
            while self.sendq.len() < SEND_QUEUE {
                let Some((data, _, reply)) = self.send_waiters.pop_front() else {
                    break;
                };
                match self.err {
                    Some(e) => reply(Msg::ERR(Refusal::errno(e))),
                    None => {
                        self.sendq.extend(data.iter());
                        reply(OK.into());
                    }
                }
            }
            if self.sendq.is_empty() || self.err.is_some() {
                break;
            }
            let (head, _) = self.sendq.as_slices();
            match (&self.socket).write(head) {
                Ok(n) => {
                    self.sendq.drain(..n);
                    sent += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => self.fail(errno_of(&e)),
            }
        }
        if self.sendq.is_empty() && self.shut_wr && self.err.is_none() {
            let _ = self.socket.shutdown(Shutdown::Write);
        }
        sent
    }

    fn deliver(&mut self, now: Instant) -> u64 {
        let Some((max, deadline, reply)) = self.recv_waiter.take() else {
            return 0;
        };
        if self.eof {
            reply(
                N2P_DATA {
                    data: ByteBuf::new(),
                    eof: true,
                }
                .into(),
            );
            return 0;
        }
        let mut buf = vec![0u8; max];
        loop {
            match (&self.socket).read(&mut buf) {
                Ok(0) => {
                    self.eof = true;
                    reply(
                        N2P_DATA {
                            data: ByteBuf::new(),
                            eof: true,
                        }
                        .into(),
                    );
                    return 0;
                }
                Ok(n) => {
                    buf.truncate(n);
                    reply(
                        N2P_DATA {
                            data: ByteBuf::from(buf),
                            eof: false,
                        }
                        .into(),
                    );
                    return n as u64;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if let Some(e) = self.err {
                        reply(Msg::ERR(Refusal::errno(e)));
                    } else if now >= deadline {
                        reply(
                            N2P_DATA {
                                data: ByteBuf::new(),
                                eof: false,
                            }
                            .into(),
                        );
                    } else {
                        self.recv_waiter = Some((max, deadline, reply));
                    }
                    return 0;
                }
                Err(e) => {
                    self.fail(errno_of(&e));
                    reply(Msg::ERR(Refusal::errno(errno_of(&e))));
                    return 0;
                }
            }
        }
    }

    /// Hands a waiting receive of a datagram socket what came, whole datagrams with their
    /// sources.
    fn deliver_grams(&mut self, now: Instant) -> u64 {
        let Some((max, deadline, reply)) = self.recv_waiter.take() else {
            return 0;
        };
        let mut grams = Vec::new();
        let mut total = 0usize;
        let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); GRAM_MAX];
        // One more datagram only if the largest one still fits the answer; each of its
        // sockets in turn, until none has one.
        let parts: Vec<&Socket> = self.sockets().collect();
        let mut dry = 0;
        let mut at = 0;
        while dry < parts.len() && (grams.is_empty() || (total + GRAM_MAX <= max && grams.len() < GRAMS_MAX)) {
            match parts[at].recv_from(&mut buf) {
                Ok((n, from)) => {
                    // SAFETY: recv_from initialized the first `n` bytes.
                    let data = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
                    total += n;
                    grams.push(Datagram {
                        addr: from.as_socket(),
                        data: ByteBuf::from(data.to_vec()),
                    });
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                // An error queued by an earlier send (ICMP unreachable on a connected socket):
                // reported once, as the kernel's recv does.
                Err(e) if grams.is_empty() => {
                    reply(Msg::ERR(refusal(&e)));
                    return 0;
                }
                Err(_) => {}
            }
            dry += 1;
            at = (at + 1) % parts.len();
        }
        if grams.is_empty() && now < deadline {
            self.recv_waiter = Some((max, deadline, reply));
        } else {
            reply(N2P_GRAMS { grams }.into());
        }
        total as u64
    }

    /// The socket broke: every waiting send learns it.
    fn fail(&mut self, errno: i32) {
        self.err.get_or_insert(errno);
        self.sendq.clear();
        for (_, _, reply) in self.send_waiters.drain(..) {
            reply(Msg::ERR(Refusal::errno(errno)));
        }
    }

    /// Answers waiters whose time is up; returns the earliest deadline still ahead.
    pub fn expire(&mut self, now: Instant) -> Option<Instant> {
        if self.accept_waiter.as_ref().is_some_and(|(d, _)| *d <= now) {
            let (_, reply) = self.accept_waiter.take().unwrap();
            reply(Msg::ERR(Refusal::errno(libc::EAGAIN)));
        }
        if self.recv_waiter.as_ref().is_some_and(|(_, d, _)| *d <= now) {
            let (_, _, reply) = self.recv_waiter.take().unwrap();
            match self.err {
                Some(e) => reply(Msg::ERR(Refusal::errno(e))),
                None if self.is_dgram() => reply(N2P_GRAMS { grams: Vec::new() }.into()),
                None => reply(
                    N2P_DATA {
                        data: ByteBuf::new(),
                        eof: self.eof,
                    }
                    .into(),
                ),
            }
        }
        if let State::Connecting(w) = &mut self.state {
            if w.as_ref().is_some_and(|(d, _)| *d <= now) {
                let (_, reply) = w.take().unwrap();
                reply(Msg::ERR(Refusal::errno(libc::EINPROGRESS)));
            }
        }
        // Sends not taken in time are answered "not yet": the stub offers them again.
        while self.send_waiters.front().is_some_and(|(_, d, _)| *d <= now) {
            let (_, _, reply) = self.send_waiters.pop_front().unwrap();
            reply(Msg::ERR(Refusal::errno(libc::EAGAIN)));
        }
        let connecting = match &self.state {
            State::Connecting(Some((d, _))) => Some(*d),
            _ => None,
        };
        [
            self.accept_waiter.as_ref().map(|w| w.0),
            self.recv_waiter.as_ref().map(|w| w.1),
            connecting,
            self.send_waiters.front().map(|w| w.1),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether a closing skeleton has nothing left to send.
    pub fn drained(&self) -> bool {
        self.sendq.is_empty() && self.send_waiters.is_empty() || self.err.is_some()
    }

    /// Answers every waiter: the socket is going away.
    pub fn end(&mut self) {
        if let State::Connecting(Some((_, reply))) = std::mem::replace(&mut self.state, State::Fresh) {
            reply(Msg::ERR(Refusal::errno(libc::ECONNABORTED)));
        }
        self.fail(libc::EPIPE);
        if let Some((_, _, reply)) = self.recv_waiter.take() {
            if self.is_dgram() {
                reply(Msg::ERR(Refusal::errno(libc::EBADF)));
            } else {
                reply(
                    N2P_DATA {
                        data: ByteBuf::new(),
                        eof: true,
                    }
                    .into(),
                );
            }
        }
        if let Some((_, reply)) = self.accept_waiter.take() {
            reply(Msg::ERR(Refusal::errno(libc::EBADF)));
        }
    }
}
