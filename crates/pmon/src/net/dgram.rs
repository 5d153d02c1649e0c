//! Datagram sockets (UDP) of the socket stub.
//!
//! A program's UDP socket is a Unix datagram socket this pComponent bound in its UDP
//! directory (`<dir>/<n>`) and handed over. For each address the program sends to or hears
//! from there is a sender socket, `<dir>/<n>-<address>` (`splitos_shim_abi::udp_name`): the
//! shim's sendto sends a datagram to its destination's sender, and each datagram received
//! comes to the program from its source's sender, whose name the shim's recvfrom turns back
//! into the source address. A connected socket is connected to its peer's sender, so that
//! read, write, send and recv need nothing from the shim, and only the peer reaches it, as
//! the kernel's UDP does. poll, epoll, fork and exec work on the descriptor as the kernel
//! makes them work.
//!
//! Who may send what: the program's end is this pComponent's file, mode 0600, so only its
//! senders reach it; a sender forwards only datagrams from the program's end's name, which
//! only this pComponent can bind in its directory. The program closing its socket is seen
//! by a probe: connecting to its name fails once nothing holds it.
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_bytes::ByteBuf;
use splitos_rpc::*;
use splitos_shim_abi::{udp_name, UDP_NAME_MAX};

use super::{addr, bridge, NetStub, Slot, Spec};

/// Most senders a socket keeps; the least recently used goes beyond (the shim asks for it
/// again when the program sends there).
const SENDERS: usize = 256;
/// Most senders of all sockets of a pComponent (each is a descriptor): beyond, a datagram
/// from or to a new address is dropped (`ENOBUFS` for a send).
pub const SENDERS_ALL: usize = 16384;
/// How often a socket's watcher looks whether the program still holds the socket.
const PROBE: Duration = Duration::from_secs(1);
/// How long a received datagram waits for room in the program's socket before it is dropped,
/// as a full receive buffer drops it (the nComponent's socket buffers the rest meanwhile).
const DELIVER_WAIT: Duration = Duration::from_millis(500);
/// Most bytes of datagrams one send to the nComponent carries, and one receive asks for.
const BATCH: usize = 256 << 10;
/// How long a receive waits at the skeleton before it is asked again.
const WAIT_MS: u32 = 2000;
/// Longest counter part of a socket's name (hex of a u32).
const COUNTER: usize = 8;

/// One datagram socket of a program.
pub struct Dgram {
    pub(super) spec: Spec,
    pub(super) slot: Mutex<Slot>,
    /// Where the program's end is bound.
    path: PathBuf,
    st: Mutex<DState>,
    /// Wakes the watcher when the senders change.
    wake: OwnedFd,
    pub(super) closed: AtomicBool,
    /// An error the skeleton's receives reported (ICMP, on a connected socket), for SO_ERROR.
    error: AtomicI32,
    /// Held while the socket is bound (a bind, or a first send's).
    binding: Mutex<()>,
}

#[derive(Default)]
struct DState {
    /// The sender socket of each address, and when it was last used.
    senders: HashMap<SocketAddr, (Arc<UnixDatagram>, Instant)>,
    peer: Option<SocketAddr>,
    bound: Option<SocketAddr>,
    /// Whether the receiver runs (from the first call that made the skeleton).
    receiving: bool,
}

/// The UDP directory for a pComponent whose program socket is `shim_sock`, made anew; None
/// if its names would not fit a Unix socket address (programs' UDP then stays on the host).
pub fn make_dir(shim_sock: &Path) -> Option<PathBuf> {
    let mut d = shim_sock.as_os_str().to_owned();
    d.push(std::str::from_utf8(splitos_shim_abi::NET_UDP_SUFFIX).expect("ASCII"));
    let dir = PathBuf::from(d);
    let longest = dir.as_os_str().len() + COUNTER + 1 + UDP_NAME_MAX;
    if longest >= 108 {
        tracing::warn!(dir = %dir.display(), "the program socket's path is too long for the UDP directory's names: programs' UDP sockets stay on this host's stack");
        return None;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let made = std::fs::create_dir_all(&dir)
        .and_then(|_| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)));
    match made {
        Ok(()) => Some(dir),
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot make the UDP directory: programs' UDP sockets stay on this host's stack");
            None
        }
    }
}

fn name_for(path: &Path, a: SocketAddr) -> PathBuf {
    let (sa, len) = addr::encode(a);
    let (n, nlen) = udp_name(&sa[..len]).expect("an IP address");
    let mut p = path.as_os_str().to_owned();
    p.push("-");
    p.push(std::str::from_utf8(&n[..nlen]).expect("ASCII"));
    PathBuf::from(p)
}

/// The address a sender stands for: as its name says it (IPv6 flow labels are not part of
/// an address).
fn key(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(mut v6) => {
            v6.set_flowinfo(0);
            SocketAddr::V6(v6)
        }
        v4 => v4,
    }
}

impl Dgram {
    /// A sender for `a`, made if there is none; the least recently used goes beyond
    /// [`SENDERS`] (never the peer's). `open` counts the pComponent's senders.
    fn sender(&self, a: SocketAddr, open: &AtomicUsize) -> std::io::Result<Arc<UnixDatagram>> {
        let a = key(a);
        let mut st = self.st.lock().unwrap();
        // Closed: its names are gone, and must stay gone.
        if self.closed.load(Relaxed) {
            return Err(std::io::Error::from_raw_os_error(libc::EBADF));
        }
        if let Some((s, used)) = st.senders.get_mut(&a) {
            *used = Instant::now();
            return Ok(s.clone());
        }
        if st.senders.len() >= SENDERS {
            let peer = st.peer;
            if let Some(old) = st
                .senders
                .iter()
                .filter(|(k, _)| Some(**k) != peer)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| *k)
            {
                st.senders.remove(&old);
                open.fetch_sub(1, Relaxed);
                let _ = std::fs::remove_file(name_for(&self.path, old));
            }
        }
        if open.fetch_add(1, Relaxed) >= SENDERS_ALL {
            open.fetch_sub(1, Relaxed);
            return Err(std::io::Error::from_raw_os_error(libc::ENOBUFS));
        }
        let made = self.bind_sender(a);
        let s = match made {
            Ok(s) => Arc::new(s),
            Err(e) => {
                open.fetch_sub(1, Relaxed);
                return Err(e);
            }
        };
        st.senders.insert(a, (s.clone(), Instant::now()));
        drop(st);
        bridge::wake(&self.wake);
        Ok(s)
    }

    /// Binds the sender of `a`: its program's user's alone (mode 0600), so that no other
    /// local user sends through it; it also drops what does not come from its program's
    /// socket.
    fn bind_sender(&self, a: SocketAddr) -> std::io::Result<UnixDatagram> {
        let name = name_for(&self.path, a);
        let s = UnixDatagram::bind(&name)?;
        let owned = std::os::unix::fs::chown(&name, Some(self.spec.uid), None);
        // A pComponent that is not root cannot give the file away: programs of every user
        // may then send to it, and it keeps dropping what is not its program's.
        let mode = if owned.is_ok() { 0o600 } else { 0o666 };
        std::fs::set_permissions(&name, std::fs::Permissions::from_mode(mode))?;
        s.set_write_timeout(Some(DELIVER_WAIT))?;
        Ok(s)
    }

    /// Whether the program still holds its end: connecting to its name finds it (EPERM: it is
    /// connected to its peer's sender, and there).
    fn alive(&self) -> bool {
        let Ok(probe) = UnixDatagram::unbound() else {
            return true;
        };
        match probe.connect(&self.path) {
            Ok(()) => true,
            Err(e) => e.raw_os_error() == Some(libc::EPERM),
        }
    }

    fn remove_files(&self, open: &AtomicUsize) {
        let senders = std::mem::take(&mut self.st.lock().unwrap().senders);
        open.fetch_sub(senders.len(), Relaxed);
        for a in senders.keys() {
            let _ = std::fs::remove_file(name_for(&self.path, *a));
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl NetStub {
    /// A new datagram socket: the program's end, bound in the UDP directory, and its watcher.
    pub(super) fn new_dgram(self: &Arc<Self>, spec: Spec, dir: &Path) -> std::io::Result<OwnedFd> {
        let n = self.next_dgram.fetch_add(1, Relaxed);
        let path = dir.join(format!("{n:x}"));
        let _ = std::fs::remove_file(&path);
        let theirs = UnixDatagram::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        let id = addr::inode(theirs.as_fd().as_raw_fd())?;
        let d = Arc::new(Dgram {
            spec,
            slot: Mutex::default(),
            path,
            st: Mutex::default(),
            wake: bridge::waker()?,
            closed: AtomicBool::new(false),
            error: AtomicI32::new(0),
            binding: Mutex::new(()),
        });
        self.dgrams.lock().unwrap().insert(id, d.clone());
        self.c.sockets.fetch_add(1, Relaxed);
        let stub = self.clone();
        let spawned = std::thread::Builder::new()
            .name("net-udp-up".into())
            .spawn(move || stub.dgram_up(id, &d));
        if let Err(e) = spawned {
            self.dgrams.lock().unwrap().remove(&id);
            return Err(e);
        }
        Ok(OwnedFd::from(theirs))
    }

    /// The skeleton of a datagram socket, and its receiver from the first time there is one.
    fn dgram_skel(self: &Arc<Self>, d: &Arc<Dgram>) -> Result<(String, u64), i32> {
        let at = self.ensure_skel(&d.spec, &d.slot, None)?;
        let start = !std::mem::replace(&mut d.st.lock().unwrap().receiving, true);
        if start {
            let (stub, d2) = (self.clone(), d.clone());
            if std::thread::Builder::new()
                .name("net-udp-down".into())
                .spawn(move || stub.dgram_down(&d2))
                .is_err()
            {
                d.st.lock().unwrap().receiving = false;
                return Err(libc::EAGAIN);
            }
        }
        Ok(at)
    }

    /// Binds a datagram socket to `a` (its skeleton made on the nComponent that holds it) and
    /// starts its receiver; false if it was bound already. One at a time, so that two
    /// threads' first sends bind once.
    fn dgram_bind(self: &Arc<Self>, d: &Arc<Dgram>, a: SocketAddr) -> Result<bool, i32> {
        let _one = d.binding.lock().unwrap();
        if d.st.lock().unwrap().bound.is_some() {
            return Ok(false);
        }
        let bound = self.bind_skel(&d.spec, &d.slot, a)?;
        self.dgram_skel(d)?;
        d.st.lock().unwrap().bound = Some(bound);
        Ok(true)
    }

    /// One socket call on a datagram socket; `fd` is the program's end.
    pub(super) fn on_dgram(
        self: &Arc<Self>,
        op: splitos_shim_abi::NetOp,
        d: &Arc<Dgram>,
        req: &splitos_shim_abi::NetReq,
        fd: OwnedFd,
        resp: &mut splitos_shim_abi::NetResp,
    ) -> Result<super::Answer, i32> {
        use splitos_shim_abi::NetOp;
        let data = &req.data[..(req.len as usize).min(req.data.len())];
        match op {
            NetOp::Bind => {
                let a = addr::parse(data)?;
                match self.dgram_bind(d, a)? {
                    true => Ok(super::Answer::Ret(0)),
                    false => Err(libc::EINVAL),
                }
            }
            NetOp::Connect => {
                // AF_UNSPEC: forget the peer.
                if data.len() >= 2 && u16::from_ne_bytes([data[0], data[1]]) == libc::AF_UNSPEC as u16 {
                    let (at, id) = self.dgram_skel(d)?;
                    self.call(&at, P2N_DISCONNECT { sock: id })?;
                    connect_fd(&fd, None)?;
                    d.st.lock().unwrap().peer = None;
                    return Ok(super::Answer::Ret(0));
                }
                let a = addr::parse(data)?;
                let (at, id) = self.dgram_skel(d)?;
                let local = self.call(&at, P2N_CONNECT { sock: id, addr: a })?.addr;
                let a = key(a);
                d.sender(a, &self.senders_open)
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
                connect_fd(&fd, Some(&name_for(&d.path, a)))?;
                let mut st = d.st.lock().unwrap();
                st.peer = Some(a);
                st.bound.get_or_insert(local);
                self.c.connects.fetch_add(1, Relaxed);
                Ok(super::Answer::Ret(0))
            }
            NetOp::Route => {
                let a = addr::parse(data)?;
                // A socket's first send gives it a port, as the kernel's sendto does, before
                // the program can ask for its name.
                let any: SocketAddr = if d.spec.family == libc::AF_INET6 {
                    "[::]:0"
                } else {
                    "0.0.0.0:0"
                }
                .parse()
                .expect("an address");
                self.dgram_bind(d, any)?;
                d.sender(a, &self.senders_open)
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
                Ok(super::Answer::Ret(0))
            }
            NetOp::SockName | NetOp::PeerName => {
                let a = self.skel_name(&d.spec, &d.slot, op == NetOp::PeerName)?;
                super::put_addr(resp, a);
                Ok(super::Answer::Ret(0))
            }
            NetOp::GetOpt if req.a as i32 == libc::SOL_SOCKET && req.b as i32 == libc::SO_ERROR => {
                resp.data[..4].copy_from_slice(&d.error.swap(0, Relaxed).to_ne_bytes());
                resp.len = 4;
                Ok(super::Answer::Ret(0))
            }
            NetOp::GetOpt => self.get_opt(&d.spec, &d.slot, req, resp),
            NetOp::SetOpt => self.set_opt(&d.spec, &d.slot, req),
            NetOp::Listen | NetOp::Accept => Err(libc::EOPNOTSUPP),
            NetOp::TakeReset => Ok(super::Answer::Ret(0)),
            NetOp::Socket => unreachable!("handled by the caller"),
        }
    }

    /// Forgets a datagram socket its program closed: its names, its skeleton.
    fn close_dgram(&self, id: addr::SockId, d: &Dgram) {
        if d.closed.swap(true, Relaxed) {
            return;
        }
        self.dgrams.lock().unwrap().remove(&id);
        d.remove_files(&self.senders_open);
        if let Some((at, sock)) = d.slot.lock().unwrap().at.take() {
            let _ = self.call(&at, P2N_CLOSE { sock });
        }
    }

    /// The watcher: takes what the program sends to the senders, in batches to the skeleton,
    /// and sees the program close the socket.
    fn dgram_up(self: &Arc<Self>, id: addr::SockId, d: &Arc<Dgram>) {
        let mut buf = vec![0u8; splitos_shim_abi::NET_UDP_MAX + 1];
        let mut last_probe = Instant::now();
        loop {
            let senders: Vec<(SocketAddr, Arc<UnixDatagram>)> =
                d.st.lock()
                    .unwrap()
                    .senders
                    .iter()
                    .map(|(a, (s, _))| (*a, s.clone()))
                    .collect();
            let mut fds: Vec<libc::pollfd> = senders
                .iter()
                .map(|(_, s)| libc::pollfd {
                    fd: s.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            fds.push(libc::pollfd {
                fd: d.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            // SAFETY: polls live pollfds, as many as given.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, PROBE.as_millis() as i32) };
            if fds.last().is_some_and(|w| w.revents & libc::POLLIN != 0) {
                let mut v = 0u64;
                // SAFETY: reads the eventfd's 8-byte counter into a live u64.
                unsafe { libc::read(d.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            }
            let mut grams = Vec::new();
            let mut bytes = 0usize;
            let peer = d.st.lock().unwrap().peer;
            for ((a, s), p) in senders.iter().zip(&fds) {
                if p.revents & libc::POLLIN == 0 {
                    continue;
                }
                if let Some((_, used)) = d.st.lock().unwrap().senders.get_mut(a) {
                    *used = Instant::now();
                }
                while bytes < BATCH {
                    let Ok((n, from)) = recv_from_nb(s, &mut buf) else {
                        break;
                    };
                    if from.as_deref() != Some(d.path.as_path()) {
                        self.c.refused.fetch_add(1, Relaxed);
                        static STRANGERS: splitos_rpc::refusals::Refusals = splitos_rpc::refusals::Refusals::new(
                            "dropped a datagram sent to a program's UDP socket by someone else",
                        );
                        if STRANGERS.log_this(format_args!("vNode {}", d.spec.vnode)) {
                            tracing::warn!(vnode = %d.spec.vnode, "dropped a datagram sent to a program's UDP socket by someone else");
                        }
                        continue;
                    }
                    if n > splitos_shim_abi::NET_UDP_MAX {
                        self.c.datagrams_dropped.fetch_add(1, Relaxed);
                        continue;
                    }
                    bytes += n;
                    // The connected peer's: as the kernel's send(2) on the connected socket.
                    let to = (Some(*a) != peer).then_some(*a);
                    grams.push(Datagram {
                        addr: to,
                        data: ByteBuf::from(buf[..n].to_vec()),
                    });
                }
            }
            if !grams.is_empty() {
                self.send_grams(d, grams, bytes);
                continue;
            }
            if d.closed.load(Relaxed) {
                return;
            }
            if last_probe.elapsed() >= PROBE {
                last_probe = Instant::now();
                if !d.alive() {
                    self.close_dgram(id, d);
                    return;
                }
            }
        }
    }

    fn send_grams(self: &Arc<Self>, d: &Arc<Dgram>, grams: Vec<Datagram>, bytes: usize) {
        let n = grams.len() as u64;
        let sent = self
            .dgram_skel(d)
            .and_then(|(at, sock)| self.call(&at, P2N_SENDTO { sock, grams }));
        match sent {
            Ok(_) => {
                self.c.datagrams_sent.fetch_add(n, Relaxed);
                self.c.sent_bytes.fetch_add(bytes as u64, Relaxed);
            }
            Err(e) => {
                // Lost, as a datagram the network drops.
                self.c.datagrams_dropped.fetch_add(n, Relaxed);
                tracing::debug!(errno = e, datagrams = n, "datagrams could not reach their nComponent");
            }
        }
    }

    /// The receiver: the skeleton's datagrams, each from its source's sender into the
    /// program's end.
    fn dgram_down(self: &Arc<Self>, d: &Arc<Dgram>) {
        let mut fails = 0u32;
        while !d.closed.load(Relaxed) {
            let Some((at, sock)) = d.slot.lock().unwrap().at.clone() else {
                return;
            };
            let grams = match self.wait_call(
                &at,
                P2N_RECVFROM {
                    sock,
                    max: BATCH as u32,
                    wait_ms: WAIT_MS,
                },
            ) {
                Ok(r) => {
                    fails = 0;
                    r.grams
                }
                Err(e) => {
                    if d.closed.load(Relaxed) {
                        return;
                    }
                    // An ICMP error for an earlier send: the program's SO_ERROR says it.
                    if matches!(
                        e,
                        libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN | libc::EMSGSIZE
                    ) {
                        d.error.store(e, Relaxed);
                        continue;
                    }
                    // The nComponent may be back, or the socket made anew elsewhere.
                    fails += 1;
                    tracing::debug!(errno = e, "a datagram socket's receive failed");
                    std::thread::sleep(Duration::from_millis(100 * fails.min(10) as u64));
                    continue;
                }
            };
            for g in grams {
                let Some(from) = g.addr else { continue };
                self.c.received_bytes.fetch_add(g.data.len() as u64, Relaxed);
                let delivered = d
                    .sender(from, &self.senders_open)
                    .and_then(|s| s.send_to(&g.data, &d.path));
                match delivered {
                    Ok(_) => {
                        self.c.datagrams_received.fetch_add(1, Relaxed);
                    }
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::ENOENT)) => return,
                    Err(e) => {
                        self.c.datagrams_dropped.fetch_add(1, Relaxed);
                        tracing::debug!(error = %e, "a received datagram found no room in the program's socket");
                    }
                }
            }
        }
    }
}

/// Connects the program's end to a sender (None: disconnects it).
fn connect_fd(fd: &OwnedFd, to: Option<&Path>) -> Result<(), i32> {
    // SAFETY: sockaddr_un is plain data, valid when zeroed.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let len = match to {
        None => {
            sa.sun_family = libc::AF_UNSPEC as libc::sa_family_t;
            std::mem::size_of::<libc::sa_family_t>()
        }
        Some(p) => {
            use std::os::unix::ffi::OsStrExt;
            let b = p.as_os_str().as_bytes();
            if b.len() >= sa.sun_path.len() {
                return Err(libc::ENAMETOOLONG);
            }
            sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (i, c) in b.iter().enumerate() {
                sa.sun_path[i] = *c as libc::c_char;
            }
            std::mem::size_of::<libc::sa_family_t>() + b.len() + 1
        }
    };
    // SAFETY: connect(2) reads `len` bytes of the live sockaddr_un.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
    }
    Ok(())
}

/// One datagram without waiting, and the name of its sender (None: unnamed).
fn recv_from_nb(s: &UnixDatagram, buf: &mut [u8]) -> std::io::Result<(usize, Option<PathBuf>)> {
    // SAFETY: sockaddr_un is plain data, valid when zeroed.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: recvfrom writes at most buf.len() bytes and `len` bytes of address into live
    // values; MSG_TRUNC makes it say a datagram's whole length.
    let n = unsafe {
        libc::recvfrom(
            s.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            (&mut sa as *mut libc::sockaddr_un).cast(),
            &mut len,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let off = std::mem::size_of::<libc::sa_family_t>();
    let name = (len as usize > off).then(|| {
        use std::os::unix::ffi::OsStrExt;
        // SAFETY: sun_path is plain bytes; the kernel wrote `len - off` of them.
        let path: &[u8] = unsafe { std::slice::from_raw_parts(sa.sun_path.as_ptr().cast(), len as usize - off) };
        let path = path.split(|b| *b == 0).next().unwrap_or(&[]);
        PathBuf::from(std::ffi::OsStr::from_bytes(path))
    });
    Ok((n as usize, name))
}
