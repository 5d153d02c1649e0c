//! The socket stub's program side: TCP and UDP sockets whose stack is an nComponent's.
//!
//! socket(2) for TCP asks the pComponent, which answers with a real descriptor, one end of a
//! Unix socket pair it bridges to the socket's skeleton on an nComponent. Reads, writes,
//! poll, epoll, fcntl, dup, close, fork and exec then need nothing from us. Only the calls
//! that name addresses or options come here, and go to the pComponent with the descriptor
//! attached; a descriptor the pComponent does not know (a plain Unix socket) is served by the
//! kernel as before. Without an nComponent in the cluster every call is the kernel's.
//!
//! A UDP socket is a Unix datagram socket the pComponent named in its UDP directory; each
//! address has a sender socket there named after it (splitos_shim_abi::NET_UDP_SUFFIX). sendto
//! and sendmsg with an address send to its sender's name instead, and recvfrom and recvmsg say
//! a datagram's source by its sender's name: no call to the pComponent per datagram.
//!
//! Here: what a descriptor is to the stub, and the calls that name addresses or options. The
//! one call to the pComponent they all make is in `pcomp`; the calls that move data (the send
//! and receive families, and read for a TCP socket's reset) in `send` and `recv`.
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicI32, AtomicU8, Ordering::Relaxed};
use libc::{sockaddr, socklen_t};
use splitos_shim_abi::{NetOp, NetReq, NetResp, NET_DATA, NET_LOCAL, NET_UDP_SUFFIX};

use crate::conn::SOCK;
use crate::start::{env, ready};
use crate::sys::{errno, set_errno, until_nul};
use crate::trap::sys;

mod pcomp;
mod recv;
mod send;

use pcomp::{call, request};
pub use recv::*;
pub use send::*;

/// The kinds of sockets ([`TCP`], [`UDP`]) the pComponent said are the host's (the cluster
/// has no nComponent, or the pComponent cannot name datagram sockets).
static LOCAL_STACK: AtomicU8 = AtomicU8::new(0);
const TCP: u8 = 1;
const UDP: u8 = 2;

/// The pComponent's process id, as its program socket says (0: not asked yet, -1: none).
static PCOMP_PID: AtomicI32 = AtomicI32::new(0);

fn pcomp_pid() -> c_int {
    let p = PCOMP_PID.load(Relaxed);
    if p != 0 {
        return p;
    }
    let sock = SOCK.load(Relaxed);
    let mut cred = libc::ucred {
        pid: -1,
        uid: 0,
        gid: 0,
    };
    let mut len = core::mem::size_of::<libc::ucred>() as socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into the live ucred.
    let ok = sock >= 0
        && unsafe {
            raw_getsockopt(
                sock,
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        } == 0;
    let p = if ok && cred.pid > 0 { cred.pid } else { -1 };
    PCOMP_PID.store(p, Relaxed);
    p
}

/// getsockopt(2) itself, not the interposed one.
///
/// # Safety
/// As getsockopt(2): `val` has room for `*len` bytes.
unsafe fn raw_getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { sys!(libc::SYS_getsockopt, fd, level, name, val, len) as c_int }
}

/// A UDP socket's name: the path of its Unix datagram socket.
#[derive(Clone)]
struct UdpName {
    path: [u8; 108],
    len: usize,
}

impl UdpName {
    fn bytes(&self) -> &[u8] {
        &self.path[..self.len]
    }
}

/// What a descriptor is, as far as the socket stub goes, from one getsockname(2).
enum Kind {
    /// One of the pComponent's UDP sockets (bound in its UDP directory), by its name.
    Udp(UdpName),
    /// Another Unix socket: maybe a TCP socket's pair ([`paired`]).
    Unix,
    /// Anything else: the kernel's.
    Other,
}

fn classify(fd: c_int) -> Kind {
    if fd < 0 || fd == SOCK.load(Relaxed) || !crate::start::is_ready() {
        return Kind::Other;
    }
    let saved = errno();
    // SAFETY: sockaddr_un is plain data, valid when zeroed.
    let mut sa: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    let mut len = core::mem::size_of::<libc::sockaddr_un>() as socklen_t;
    // SAFETY: getsockname writes at most `len` bytes into the live sockaddr_un.
    let r = unsafe {
        sys!(
            libc::SYS_getsockname,
            fd,
            &mut sa as *mut libc::sockaddr_un,
            &mut len as *mut socklen_t
        )
    };
    set_errno(saved);
    if r != 0 || sa.sun_family != libc::AF_UNIX as libc::sa_family_t {
        return Kind::Other;
    }
    let mut name = UdpName { path: [0; 108], len: 0 };
    for (i, c) in sa.sun_path.iter().take((len as usize).saturating_sub(2)).enumerate() {
        name.path[i] = *c as u8;
    }
    name.len = until_nul(&name.path).len();
    let sock = until_nul(&env().sock);
    let ours = LOCAL_STACK.load(Relaxed) & UDP == 0
        && name.bytes().starts_with(sock)
        && name.bytes()[sock.len()..].starts_with(NET_UDP_SUFFIX);
    if ours {
        Kind::Udp(name)
    } else {
        Kind::Unix
    }
}

/// The name of `fd` if it is one of the pComponent's UDP sockets.
fn udp_self(fd: c_int) -> Option<UdpName> {
    match classify(fd) {
        Kind::Udp(name) => Some(name),
        _ => None,
    }
}

/// Whether Unix socket `fd`'s other end is the pComponent's (a TCP socket's pair).
fn paired(fd: c_int) -> bool {
    let pid = pcomp_pid();
    let mut cred = libc::ucred {
        pid: -1,
        uid: 0,
        gid: 0,
    };
    let mut len = core::mem::size_of::<libc::ucred>() as socklen_t;
    // SAFETY: writes at most `len` bytes into the live ucred.
    pid > 0
        && unsafe {
            raw_getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            ) == 0
                && cred.pid == pid
        }
}

/// Whether `fd` may be a socket the pComponent runs: one of its UDP sockets, or a Unix socket
/// whose other end it made. The pComponent has the last word (NET_LOCAL).
fn bridged(fd: c_int) -> bool {
    match classify(fd) {
        Kind::Udp(_) => true,
        Kind::Unix => paired(fd),
        Kind::Other => false,
    }
}

/// -1 with errno set from a negative answer.
fn fail(ret: i64) -> c_int {
    set_errno((-ret) as c_int);
    -1
}

/// Gives a new descriptor the flags SOCK_NONBLOCK and SOCK_CLOEXEC ask for (it comes
/// close-on-exec).
fn apply_flags(fd: c_int, flags: c_int) {
    // SAFETY: fcntl(2) on a descriptor just received.
    unsafe {
        if flags & libc::SOCK_CLOEXEC == 0 {
            sys!(libc::SYS_fcntl, fd, libc::F_SETFD, 0);
        }
        if flags & libc::SOCK_NONBLOCK != 0 {
            let fl = sys!(libc::SYS_fcntl, fd, libc::F_GETFL);
            sys!(libc::SYS_fcntl, fd, libc::F_SETFL, fl | libc::O_NONBLOCK as i64);
        }
    }
}

/// Copies an answer's address out as getsockname(2) does: truncated to the caller's room,
/// with the full length stored.
///
/// # Safety
/// `addr` has room for `*len` bytes, or `len` is null.
unsafe fn put_addr(resp: &NetResp, addr: *mut sockaddr, len: *mut socklen_t) {
    if addr.is_null() || len.is_null() {
        return;
    }
    // SAFETY: the caller's contract.
    unsafe {
        let n = (resp.len as usize).min(*len as usize).min(NET_DATA);
        core::ptr::copy_nonoverlapping(resp.data.as_ptr(), addr as *mut u8, n);
        *len = resp.len;
    }
}

/// The bytes of a caller's address.
///
/// # Safety
/// `addr` points to `len` readable bytes, or is null.
unsafe fn addr_bytes<'a>(addr: *const sockaddr, len: socklen_t) -> &'a [u8] {
    if addr.is_null() {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { core::slice::from_raw_parts(addr as *const u8, (len as usize).min(NET_DATA)) }
}

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    let inet = matches!(domain, libc::AF_INET | libc::AF_INET6);
    let kind = match (base, protocol) {
        (libc::SOCK_STREAM, 0 | libc::IPPROTO_TCP) if inet => TCP,
        (libc::SOCK_DGRAM, 0 | libc::IPPROTO_UDP) if inet => UDP,
        _ => 0,
    };
    if kind != 0 && LOCAL_STACK.load(Relaxed) & kind == 0 && ready() {
        let (r, fd) = call(
            &request(NetOp::Socket, domain as i64, base as i64, protocol as i64, &[]),
            -1,
        );
        if r.ret < 0 {
            return fail(r.ret);
        }
        if r.ret != NET_LOCAL && fd >= 0 {
            apply_flags(fd, ty);
            return fd;
        }
        // This kind of socket is the host's here: this image's are, without asking again for
        // each.
        LOCAL_STACK.fetch_or(kind, Relaxed);
    }
    // SAFETY: socket(2) takes no pointers.
    unsafe { sys!(libc::SYS_socket, domain, ty, protocol) as c_int }
}

/// One call about a socket of ours; None: the kernel's.
fn on_socket(fd: c_int, req: &NetReq) -> Option<NetResp> {
    if !bridged(fd) {
        return None;
    }
    let (r, extra) = call(req, fd);
    if extra >= 0 {
        // SAFETY: a descriptor nothing asked for.
        unsafe { sys!(libc::SYS_close, extra) };
    }
    (r.ret != NET_LOCAL).then_some(r)
}

fn answer(r: &NetResp) -> c_int {
    if r.ret < 0 {
        fail(r.ret)
    } else {
        0
    }
}

#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's contract (bind(2)).
    let bytes = unsafe { addr_bytes(addr, len) };
    match on_socket(fd, &request(NetOp::Bind, 0, 0, 0, bytes)) {
        Some(r) => answer(&r),
        // SAFETY: bind(2) with the caller's arguments.
        None => unsafe { sys!(libc::SYS_bind, fd, addr, len) as c_int },
    }
}

#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    match on_socket(fd, &request(NetOp::Listen, backlog as i64, 0, 0, &[])) {
        Some(r) => answer(&r),
        // SAFETY: listen(2) takes no pointers.
        None => unsafe { sys!(libc::SYS_listen, fd, backlog) as c_int },
    }
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's contract (connect(2)).
    let bytes = unsafe { addr_bytes(addr, len) };
    if bridged(fd) {
        // SAFETY: fcntl(2) takes no pointers here.
        let nonblocking = unsafe { sys!(libc::SYS_fcntl, fd, libc::F_GETFL) } & libc::O_NONBLOCK as i64 != 0;
        let (r, _) = call(&request(NetOp::Connect, nonblocking as i64, 0, 0, bytes), fd);
        if r.ret != NET_LOCAL {
            return answer(&r);
        }
    }
    // SAFETY: connect(2) with the caller's arguments.
    unsafe { sys!(libc::SYS_connect, fd, addr, len) as c_int }
}

#[no_mangle]
pub unsafe extern "C" fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    if !bridged(fd) {
        // SAFETY: accept4(2) with the caller's arguments.
        return unsafe { sys!(libc::SYS_accept4, fd, addr, len, flags) as c_int };
    }
    // The pComponent marks a listening socket's end (SO_PASSCRED): accept on any other
    // socket fails at once, as the kernel's does, without touching its bytes.
    let mut listening: c_int = 0;
    let mut olen = 4 as socklen_t;
    // SAFETY: writes at most 4 bytes into a live c_int.
    if unsafe {
        raw_getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&mut listening as *mut c_int).cast(),
            &mut olen,
        )
    } != 0
        || listening == 0
    {
        set_errno(libc::EINVAL);
        return -1;
    }
    // A token stands for a connection the pComponent holds: waiting for one is waiting for
    // the socket to be readable, as the kernel's accept does (EAGAIN if non-blocking, EINTR).
    // The end of the stream means the socket failed: the pComponent says how.
    let mut token = 0u8;
    // SAFETY: reads one byte into a live u8.
    let n = unsafe { sys!(libc::SYS_recvfrom, fd, &mut token as *mut u8, 1, 0, 0usize, 0usize) };
    if n < 0 {
        return -1;
    }
    let (r, conn) = call(&request(NetOp::Accept, 0, 0, 0, &[]), fd);
    if r.ret < 0 || conn < 0 {
        return fail(if r.ret < 0 { r.ret } else { -(libc::ECONNABORTED as i64) });
    }
    apply_flags(conn, flags);
    // SAFETY: the caller's contract (accept(2)).
    unsafe { put_addr(&r, addr, len) };
    conn
}

#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the same contract.
    unsafe { accept4(fd, addr, len, 0) }
}

/// getsockname or getpeername.
///
/// # Safety
/// As getsockname(2).
unsafe fn name(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, op: NetOp, nr: libc::c_long) -> c_int {
    match on_socket(fd, &request(op, 0, 0, 0, &[])) {
        Some(r) if r.ret < 0 => fail(r.ret),
        Some(r) => {
            // SAFETY: the caller's contract.
            unsafe { put_addr(&r, addr, len) };
            0
        }
        // SAFETY: the system call with the caller's arguments.
        None => unsafe { sys!(nr, fd, addr, len) as c_int },
    }
}

#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { name(fd, addr, len, NetOp::SockName, libc::SYS_getsockname) }
}

#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { name(fd, addr, len, NetOp::PeerName, libc::SYS_getpeername) }
}

/// Options about the program's own blocking calls, which its end of the pair serves.
fn local_option(level: c_int, opt: c_int) -> bool {
    level == libc::SOL_SOCKET
        && matches!(
            opt,
            libc::SO_RCVTIMEO | libc::SO_SNDTIMEO | libc::SO_RCVTIMEO_NEW | libc::SO_SNDTIMEO_NEW
        )
}

#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    opt: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if !local_option(level, opt) && !val.is_null() && !len.is_null() {
        // SAFETY: the caller's contract: `len` is readable.
        let room = unsafe { *len } as i64;
        if let Some(r) = on_socket(fd, &request(NetOp::GetOpt, level as i64, opt as i64, room, &[])) {
            if r.ret < 0 {
                return fail(r.ret);
            }
            // SAFETY: the caller's contract: `val` has room for `*len` bytes.
            unsafe {
                let n = (r.len as usize).min(*len as usize);
                core::ptr::copy_nonoverlapping(r.data.as_ptr(), val as *mut u8, n);
                *len = n as socklen_t;
            }
            return 0;
        }
    }
    // SAFETY: getsockopt(2) with the caller's arguments.
    unsafe { raw_getsockopt(fd, level, opt, val, len) }
}

#[no_mangle]
pub unsafe extern "C" fn setsockopt(fd: c_int, level: c_int, opt: c_int, val: *const c_void, len: socklen_t) -> c_int {
    if !local_option(level, opt) && (len as usize) <= NET_DATA {
        let bytes: &[u8] = if val.is_null() {
            &[]
        } else {
            // SAFETY: the caller's contract: `val` points to `len` readable bytes.
            unsafe { core::slice::from_raw_parts(val as *const u8, len as usize) }
        };
        if let Some(r) = on_socket(fd, &request(NetOp::SetOpt, level as i64, opt as i64, 0, bytes)) {
            return answer(&r);
        }
    }
    // SAFETY: setsockopt(2) with the caller's arguments.
    unsafe { sys!(libc::SYS_setsockopt, fd, level, opt, val, len) as c_int }
}
