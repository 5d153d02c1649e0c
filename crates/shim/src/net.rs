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
use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicI32, AtomicU8, Ordering::Relaxed};
use libc::{size_t, sockaddr, socklen_t, ssize_t};
use splitos_shim_abi::{udp_addr, udp_name, FromZeros, IntoBytes, NetOp, NetReq, NetResp, NET_DATA, NET_LOCAL, NET_SOCK_SUFFIX, NET_UDP_MAX, NET_UDP_SUFFIX, SHIM_ABI_VERSION};

use crate::conn::SOCK;
use crate::start::{env, ready};
use crate::sys::{errno, served_by_trusted_user, set_errno, until_nul};
use crate::trap::sys;

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
    let mut cred = libc::ucred { pid: -1, uid: 0, gid: 0 };
    let mut len = core::mem::size_of::<libc::ucred>() as socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into the live ucred.
    let ok = sock >= 0 && unsafe { raw_getsockopt(sock, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len) } == 0;
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
    let r = unsafe { sys!(libc::SYS_getsockname, fd, &mut sa as *mut libc::sockaddr_un, &mut len as *mut socklen_t) };
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
    let ours = LOCAL_STACK.load(Relaxed) & UDP == 0 && name.bytes().starts_with(sock) && name.bytes()[sock.len()..].starts_with(NET_UDP_SUFFIX);
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
    let mut cred = libc::ucred { pid: -1, uid: 0, gid: 0 };
    let mut len = core::mem::size_of::<libc::ucred>() as socklen_t;
    // SAFETY: writes at most `len` bytes into the live ucred.
    pid > 0 && unsafe { raw_getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len) == 0 && cred.pid == pid }
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

fn request(op: NetOp, a: i64, b: i64, c: i64, data: &[u8]) -> NetReq {
    let mut r = NetReq::new_zeroed();
    r.abi = SHIM_ABI_VERSION;
    r.op = op as u32;
    (r.a, r.b, r.c) = (a, b, c);
    let n = data.len().min(NET_DATA);
    r.data[..n].copy_from_slice(&data[..n]);
    r.len = n as u32;
    r
}

/// One socket call to the pComponent with `fd` attached (-1: none): its answer and the
/// descriptor that came with it (-1: none). A pComponent without the socket stub answers
/// NET_LOCAL.
fn call(req: &NetReq, fd: c_int) -> (NetResp, c_int) {
    let mut resp = NetResp::new_zeroed();
    let path = until_nul(&env().sock);
    // SAFETY: sockaddr_un is plain data, valid when zeroed.
    let mut sa: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as _;
    if path.len() + NET_SOCK_SUFFIX.len() >= sa.sun_path.len() {
        resp.ret = NET_LOCAL;
        return (resp, -1);
    }
    for (i, b) in path.iter().chain(NET_SOCK_SUFFIX).enumerate() {
        sa.sun_path[i] = *b as c_char;
    }
    // SAFETY: socket(2) creates a descriptor, closed below.
    let s = unsafe { sys!(libc::SYS_socket, libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) } as c_int;
    if s < 0 {
        resp.ret = -(errno() as i64);
        return (resp, -1);
    }
    let saved = errno();
    // SAFETY: the address is a live sockaddr_un of the length passed.
    let connected = unsafe { sys!(libc::SYS_connect, s, &sa as *const libc::sockaddr_un, core::mem::size_of::<libc::sockaddr_un>() as socklen_t) } == 0;
    let got = if !connected {
        resp.ret = if matches!(errno(), libc::ENOENT | libc::ECONNREFUSED) { NET_LOCAL } else { -(libc::ENETDOWN as i64) };
        -1
    } else if !served_by_trusted_user(s) {
        // Another user's socket in the stub's place gets neither the call nor the descriptor.
        resp.ret = -(libc::ENETDOWN as i64);
        -1
    } else if !send_with_fd(s, req.as_bytes(), fd) {
        resp.ret = -(libc::ENETDOWN as i64);
        -1
    } else {
        match recv_with_fd(s, resp.as_mut_bytes()) {
            Some(fd) => fd,
            None => {
                resp = NetResp::new_zeroed();
                resp.ret = -(libc::ENETDOWN as i64);
                -1
            }
        }
    };
    // SAFETY: closes the descriptor made above.
    unsafe { sys!(libc::SYS_close, s) };
    set_errno(saved);
    (resp, got)
}

fn send_with_fd(s: c_int, bytes: &[u8], fd: c_int) -> bool {
    let mut cbuf = [0u64; 4];
    let mut iov = libc::iovec { iov_base: bytes.as_ptr() as *mut c_void, iov_len: bytes.len() };
    // SAFETY: msghdr is plain data, valid when zeroed.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if fd >= 0 {
        msg.msg_control = cbuf.as_mut_ptr() as *mut c_void;
        // SAFETY: CMSG_SPACE is arithmetic.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as _;
        // SAFETY: cbuf (32 bytes) holds one header with one descriptor (CMSG_SPACE(4) is 24).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as _;
            core::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut c_int, fd);
        }
    }
    loop {
        // SAFETY: the message points at live bytes and at cbuf; sendmsg only reads them.
        let n = unsafe { sys!(libc::SYS_sendmsg, s, &msg as *const libc::msghdr, libc::MSG_NOSIGNAL) };
        // A signal before anything was sent: send it again (the record is small enough to go
        // whole, or not at all).
        if n < 0 && errno() == libc::EINTR {
            continue;
        }
        return n == bytes.len() as i64;
    }
}

/// Receives exactly `buf.len()` bytes; the descriptor attached (-1: none), None on failure.
fn recv_with_fd(s: c_int, buf: &mut [u8]) -> Option<c_int> {
    let mut cbuf = [0u64; 4];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut c_void, iov_len: buf.len() };
    // SAFETY: msghdr is plain data, valid when zeroed.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut c_void;
    msg.msg_controllen = core::mem::size_of_val(&cbuf) as _;
    // A signal handler may interrupt the wait: the call goes on at the pComponent, so its
    // answer is waited for again rather than lost.
    let n = loop {
        // SAFETY: the message points at the live buffer and cbuf, sized as declared; a
        // descriptor the kernel installs is ours alone.
        let n = unsafe { sys!(libc::SYS_recvmsg, s, &mut msg as *mut libc::msghdr, libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL) };
        if !(n < 0 && errno() == libc::EINTR) {
            break n;
        }
    };
    let mut fd = -1;
    // SAFETY: CMSG_FIRSTHDR stays inside the control buffer the kernel filled.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if n > 0 && !c.is_null() && (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
            fd = core::ptr::read_unaligned(libc::CMSG_DATA(c) as *const c_int);
        }
    }
    // What a signal cut short after the first bytes (and the descriptor, which comes with
    // them): the rest.
    let mut got = n.max(0) as usize;
    while n > 0 && got < buf.len() {
        // SAFETY: reads into the unfilled tail of the live buffer.
        let m = unsafe { sys!(libc::SYS_recvfrom, s, buf[got..].as_mut_ptr(), buf.len() - got, libc::MSG_WAITALL, 0usize, 0usize) };
        if m > 0 {
            got += m as usize;
        } else if !(m < 0 && errno() == libc::EINTR) {
            break;
        }
    }
    if got != buf.len() {
        if fd >= 0 {
            // SAFETY: a descriptor just installed for us that nothing else knows.
            unsafe { sys!(libc::SYS_close, fd) };
        }
        return None;
    }
    Some(fd)
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
        let (r, fd) = call(&request(NetOp::Socket, domain as i64, base as i64, protocol as i64, &[]), -1);
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
    if unsafe { raw_getsockopt(fd, libc::SOL_SOCKET, libc::SO_PASSCRED, (&mut listening as *mut c_int).cast(), &mut olen) } != 0 || listening == 0 {
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
    level == libc::SOL_SOCKET && matches!(opt, libc::SO_RCVTIMEO | libc::SO_SNDTIMEO | libc::SO_RCVTIMEO_NEW | libc::SO_SNDTIMEO_NEW)
}

#[no_mangle]
pub unsafe extern "C" fn getsockopt(fd: c_int, level: c_int, opt: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int {
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

/// Sends a UDP socket's datagram of `n` bytes to the sender of `dest` (a sockaddr's bytes):
/// `send` does it with the sender's sockaddr_un. A sender the pComponent has not made (or
/// dropped) is asked for once.
fn udp_send(fd: c_int, own: &UdpName, dest: &[u8], n: usize, send: impl Fn(*const libc::sockaddr_un, socklen_t) -> ssize_t) -> ssize_t {
    let Some((part, plen)) = udp_name(dest) else {
        set_errno(if dest.len() >= 2 && u16::from_ne_bytes([dest[0], dest[1]]) as c_int != libc::AF_INET && u16::from_ne_bytes([dest[0], dest[1]]) as c_int != libc::AF_INET6 { libc::EAFNOSUPPORT } else { libc::EINVAL });
        return -1;
    };
    let max = if part[0] == b'4' { NET_UDP_MAX - 20 } else { NET_UDP_MAX };
    if n > max {
        set_errno(libc::EMSGSIZE);
        return -1;
    }
    // SAFETY: sockaddr_un is plain data, valid when zeroed.
    let mut sa: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as _;
    let name = own.bytes().iter().chain(b"-").chain(&part[..plen]);
    if own.len + 1 + plen >= sa.sun_path.len() {
        set_errno(libc::ENAMETOOLONG);
        return -1;
    }
    for (i, b) in name.enumerate() {
        sa.sun_path[i] = *b as c_char;
    }
    let salen = (2 + own.len + 1 + plen + 1) as socklen_t;
    let r = send(&sa, salen);
    if r < 0 && matches!(errno(), libc::ENOENT | libc::ECONNREFUSED) {
        let (resp, _) = call(&request(NetOp::Route, 0, 0, 0, dest), fd);
        if resp.ret < 0 {
            return fail(resp.ret) as ssize_t;
        }
        return send(&sa, salen);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t {
    // An address of length 0 is none, as for the kernel.
    let (addr, len) = if !addr.is_null() && len != 0 {
        match classify(fd) {
            Kind::Udp(own) => {
                // SAFETY: the caller's contract (sendto(2)).
                let dest = unsafe { addr_bytes(addr, len) };
                // SAFETY: sendto(2) with the caller's buffer and a live sockaddr_un.
                return udp_send(fd, &own, dest, n, |sa, salen| unsafe { sys!(libc::SYS_sendto, fd, buf, n, flags, sa, salen) as ssize_t });
            }
            // A connected TCP socket ignores a destination; its Unix end would refuse one.
            Kind::Unix if paired(fd) => (core::ptr::null(), 0),
            _ => (addr, len),
        }
    } else {
        (addr, len)
    };
    // SAFETY: sendto(2) with the caller's arguments.
    unsafe { sys!(libc::SYS_sendto, fd, buf, n, flags, addr, len) as ssize_t }
}

/// The bytes a message carries.
///
/// # Safety
/// `m`'s iovecs are readable.
unsafe fn msg_len(m: &libc::msghdr) -> usize {
    // SAFETY: the caller's contract: `msg_iovlen` readable iovecs.
    (0..m.msg_iovlen).map(|i| unsafe { (*m.msg_iov.add(i)).iov_len }).sum()
}

/// sendmsg(2) of a UDP socket's message: to its destination's sender.
///
/// # Safety
/// As sendmsg(2).
unsafe fn udp_sendmsg(fd: c_int, own: &UdpName, msg: &libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's contract.
    let dest = unsafe { addr_bytes(msg.msg_name as *const sockaddr, msg.msg_namelen) };
    // SAFETY: as above.
    let n = unsafe { msg_len(msg) };
    udp_send(fd, own, dest, n, |sa, salen| {
        let mut m = *msg;
        m.msg_name = sa as *mut c_void;
        m.msg_namelen = salen;
        // SAFETY: sendmsg(2) with the caller's buffers and a live sockaddr_un.
        unsafe { sys!(libc::SYS_sendmsg, fd, &m as *const libc::msghdr, flags) as ssize_t }
    })
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's contract: `msg` is a readable msghdr.
    if !msg.is_null() && unsafe { !(*msg).msg_name.is_null() && (*msg).msg_namelen != 0 } {
        let kind = classify(fd);
        if let Kind::Udp(own) = &kind {
            // SAFETY: as above.
            return unsafe { udp_sendmsg(fd, own, &*msg, flags) };
        }
        if matches!(kind, Kind::Unix) && paired(fd) {
            // SAFETY: as above; a copy without the destination.
            let mut m = unsafe { *msg };
            m.msg_name = core::ptr::null_mut();
            m.msg_namelen = 0;
            // SAFETY: sendmsg(2) with the caller's buffers.
            return unsafe { sys!(libc::SYS_sendmsg, fd, &m as *const libc::msghdr, flags) as ssize_t };
        }
    }
    // SAFETY: sendmsg(2) with the caller's arguments.
    unsafe { sys!(libc::SYS_sendmsg, fd, msg, flags) as ssize_t }
}

#[no_mangle]
pub unsafe extern "C" fn sendmmsg(fd: c_int, vec: *mut libc::mmsghdr, vlen: libc::c_uint, flags: c_int) -> c_int {
    let Some(own) = udp_self(fd) else {
        // SAFETY: sendmmsg(2) with the caller's arguments.
        return unsafe { sys!(libc::SYS_sendmmsg, fd, vec, vlen, flags) as c_int };
    };
    // One at a time, each to its destination's sender; as the kernel's, the count of those
    // sent, or the first one's error.
    for i in 0..vlen as usize {
        // SAFETY: the caller's contract: `vec` holds `vlen` messages.
        let mm = unsafe { &mut *vec.add(i) };
        let r = if mm.msg_hdr.msg_name.is_null() || mm.msg_hdr.msg_namelen == 0 {
            // SAFETY: sendmsg(2) with the caller's message.
            unsafe { sys!(libc::SYS_sendmsg, fd, &mm.msg_hdr as *const libc::msghdr, flags) as ssize_t }
        } else {
            // SAFETY: as above.
            unsafe { udp_sendmsg(fd, &own, &mm.msg_hdr, flags) }
        };
        if r < 0 {
            return if i == 0 { -1 } else { i as c_int };
        }
        mm.msg_len = r as libc::c_uint;
    }
    vlen as c_int
}

/// Writes the source of a datagram the kernel named `raw` (`rlen` bytes) into the caller's
/// address, as recvfrom(2) does (truncated to the room, the whole length stored): a UDP
/// socket's sender as the address it stands for (`own`: the socket's name, asked only for a
/// Unix source).
///
/// # Safety
/// `addr` has room for `*alen` bytes; `alen` is writable.
unsafe fn put_source(own: impl FnOnce() -> Option<UdpName>, raw: &[u8], rlen: usize, addr: *mut sockaddr, alen: *mut socklen_t) {
    let rlen = rlen.min(raw.len());
    let mut out = [0u8; 28];
    let mut src: &[u8] = &raw[..rlen];
    if rlen > 2 && u16::from_ne_bytes([raw[0], raw[1]]) as c_int == libc::AF_UNIX {
        if let Some(own) = own() {
            let path = until_nul(&raw[2..rlen]);
            let prefix = own.bytes();
            if path.len() > prefix.len() + 1 && path.starts_with(prefix) && path[prefix.len()] == b'-' {
                if let Some((sa, n)) = udp_addr(&path[prefix.len() + 1..]) {
                    out[..n].copy_from_slice(&sa[..n]);
                    src = &out[..n];
                }
            }
        }
    }
    // SAFETY: the caller's contract.
    unsafe {
        let room = (*alen as usize).min(src.len());
        core::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, room);
        *alen = src.len() as socklen_t;
    }
}

/// A read of `want` bytes from `fd` that returned `n`: the end of a TCP socket's stream that
/// its peer reset is `ECONNRESET`, as the kernel's read says it (the pair's end itself can
/// only end; the stub knows why). Costs one getsockname(2) per end of a file or stream.
fn reset_or(fd: c_int, want: usize, n: ssize_t) -> ssize_t {
    if n != 0 || want == 0 || !matches!(classify(fd), Kind::Unix) || !paired(fd) {
        return n;
    }
    let saved = errno();
    match on_socket(fd, &request(NetOp::TakeReset, 0, 0, 0, &[])) {
        Some(r) if r.ret == -(libc::ECONNRESET as i64) => fail(r.ret) as ssize_t,
        _ => {
            set_errno(saved);
            0
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: read(2) with the caller's arguments.
    let r = unsafe { sys!(libc::SYS_read, fd, buf, n) as ssize_t };
    reset_or(fd, n, r)
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: recvfrom(2) with the caller's arguments and no address.
    let r = unsafe { sys!(libc::SYS_recvfrom, fd, buf, n, flags, 0usize, 0usize) as ssize_t };
    reset_or(fd, n, r)
}

#[no_mangle]
pub unsafe extern "C" fn recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, alen: *mut socklen_t) -> ssize_t {
    if addr.is_null() || alen.is_null() || !crate::start::is_ready() {
        // SAFETY: recvfrom(2) with the caller's arguments.
        return reset_or(fd, n, unsafe { sys!(libc::SYS_recvfrom, fd, buf, n, flags, addr, alen) as ssize_t });
    }
    // SAFETY: sockaddr_storage is plain data, valid when zeroed.
    let mut raw: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    let mut rlen = core::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: recvfrom(2) with the caller's buffer and a live address of the size given.
    let r = unsafe { sys!(libc::SYS_recvfrom, fd, buf, n, flags, &mut raw as *mut libc::sockaddr_storage, &mut rlen as *mut socklen_t) as ssize_t };
    if r >= 0 {
        // SAFETY: the kernel wrote `rlen` bytes (at most the size) of the live value.
        let bytes = unsafe { core::slice::from_raw_parts((&raw as *const libc::sockaddr_storage).cast::<u8>(), core::mem::size_of::<libc::sockaddr_storage>()) };
        let saved = errno();
        // SAFETY: the caller's contract.
        unsafe { put_source(|| udp_self(fd), bytes, rlen as usize, addr, alen) };
        set_errno(saved);
    }
    reset_or(fd, n, r)
}

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's contract: `msg` is a readable msghdr.
    if msg.is_null() || unsafe { (*msg).msg_name }.is_null() || !crate::start::is_ready() {
        // SAFETY: recvmsg(2) with the caller's arguments.
        let r = unsafe { sys!(libc::SYS_recvmsg, fd, msg, flags) as ssize_t };
        // SAFETY: the caller's contract: a readable msghdr, if any.
        let want = if msg.is_null() { 0 } else { unsafe { msg_len(&*msg) } };
        return reset_or(fd, want, r);
    }
    // SAFETY: sockaddr_storage is plain data, valid when zeroed.
    let mut raw: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    // SAFETY: the caller's contract; a copy with our address buffer.
    let mut m = unsafe { *msg };
    m.msg_name = (&mut raw as *mut libc::sockaddr_storage).cast();
    m.msg_namelen = core::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: recvmsg(2) with the caller's buffers and a live address of the size given.
    let r = unsafe { sys!(libc::SYS_recvmsg, fd, &mut m as *mut libc::msghdr, flags) as ssize_t };
    if r >= 0 {
        // SAFETY: the caller's msghdr, written back as the kernel would have.
        unsafe {
            (*msg).msg_controllen = m.msg_controllen;
            (*msg).msg_flags = m.msg_flags;
            let bytes = core::slice::from_raw_parts((&raw as *const libc::sockaddr_storage).cast::<u8>(), core::mem::size_of::<libc::sockaddr_storage>());
            let saved = errno();
            put_source(|| udp_self(fd), bytes, m.msg_namelen as usize, (*msg).msg_name.cast(), &mut (*msg).msg_namelen);
            set_errno(saved);
        }
    }
    // SAFETY: the caller's iovecs, readable.
    reset_or(fd, unsafe { msg_len(&m) }, r)
}

/// Most messages one recvmmsg of a UDP socket receives (it may return fewer than asked).
const MMSG: usize = 64;

#[no_mangle]
pub unsafe extern "C" fn recvmmsg(fd: c_int, vec: *mut libc::mmsghdr, vlen: libc::c_uint, flags: c_int, timeout: *mut libc::timespec) -> c_int {
    let own = match udp_self(fd) {
        Some(own) if !vec.is_null() => own,
        // SAFETY: recvmmsg(2) with the caller's arguments.
        _ => return unsafe { sys!(libc::SYS_recvmmsg, fd, vec, vlen, flags, timeout) as c_int },
    };
    let n = (vlen as usize).min(MMSG);
    // SAFETY: sockaddr_storage is plain data, valid when zeroed.
    let mut raw: [libc::sockaddr_storage; MMSG] = unsafe { core::mem::zeroed() };
    let mut names = [(core::ptr::null_mut::<c_void>(), 0 as socklen_t); MMSG];
    // SAFETY: the caller's contract: `vec` holds `vlen` messages; each gets our address
    // buffer for the call and its own back after it.
    unsafe {
        for i in 0..n {
            let h = &mut (*vec.add(i)).msg_hdr;
            names[i] = (h.msg_name, h.msg_namelen);
            h.msg_name = (&mut raw[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = core::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
        }
        let r = sys!(libc::SYS_recvmmsg, fd, vec, n as libc::c_uint, flags, timeout) as c_int;
        let saved = errno();
        for i in 0..n {
            let h = &mut (*vec.add(i)).msg_hdr;
            let got = h.msg_namelen as usize;
            (h.msg_name, h.msg_namelen) = names[i];
            if (i as c_int) < r && !h.msg_name.is_null() {
                let bytes = core::slice::from_raw_parts((&raw[i] as *const libc::sockaddr_storage).cast::<u8>(), core::mem::size_of::<libc::sockaddr_storage>());
                put_source(|| Some(own.clone()), bytes, got, h.msg_name.cast(), &mut h.msg_namelen);
            }
        }
        set_errno(saved);
        r
    }
}
