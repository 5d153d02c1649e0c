//! The socket stub's program side: TCP sockets whose stack is an nComponent's.
//!
//! socket(2) for TCP asks the pComponent, which answers with a real descriptor, one end of a
//! Unix socket pair it bridges to the socket's skeleton on an nComponent. Reads, writes,
//! poll, epoll, fcntl, dup, close, fork and exec then need nothing from us. Only the calls
//! that name addresses or options come here, and go to the pComponent with the descriptor
//! attached; a descriptor the pComponent does not know (a plain Unix socket) is served by the
//! kernel as before. Without an nComponent in the cluster every call is the kernel's.
use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicI32, Ordering::Relaxed};
use libc::{size_t, sockaddr, socklen_t, ssize_t};
use splitos_shim_abi::{FromZeros, IntoBytes, NetOp, NetReq, NetResp, NET_DATA, NET_LOCAL, NET_SOCK_SUFFIX, SHIM_ABI_VERSION};

use crate::conn::SOCK;
use crate::start::{env, ready};
use crate::sys::{errno, set_errno, until_nul};

/// Set once the pComponent said the cluster has no nComponent.
static LOCAL_STACK: AtomicBool = AtomicBool::new(false);

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
    unsafe { libc::syscall(libc::SYS_getsockopt, fd, level, name, val, len) as c_int }
}

/// Whether `fd` may be a socket the pComponent runs: a Unix socket whose other end the
/// pComponent made. The pComponent has the last word (NET_LOCAL).
fn bridged(fd: c_int) -> bool {
    if fd < 0 || fd == SOCK.load(Relaxed) || !crate::start::is_ready() {
        return false;
    }
    let pid = pcomp_pid();
    let mut domain: c_int = 0;
    let mut len = 4 as socklen_t;
    // SAFETY: writes at most 4 bytes into a live c_int.
    if pid <= 0 || unsafe { raw_getsockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN, (&mut domain as *mut c_int).cast(), &mut len) } != 0 || domain != libc::AF_UNIX {
        return false;
    }
    let mut cred = libc::ucred { pid: -1, uid: 0, gid: 0 };
    let mut len = core::mem::size_of::<libc::ucred>() as socklen_t;
    // SAFETY: writes at most `len` bytes into the live ucred.
    unsafe { raw_getsockopt(fd, libc::SOL_SOCKET, libc::SO_PEERCRED, (&mut cred as *mut libc::ucred).cast(), &mut len) == 0 && cred.pid == pid }
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
    let s = unsafe { libc::syscall(libc::SYS_socket, libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) } as c_int;
    if s < 0 {
        resp.ret = -(errno() as i64);
        return (resp, -1);
    }
    let saved = errno();
    // SAFETY: the address is a live sockaddr_un of the length passed.
    let connected = unsafe { libc::syscall(libc::SYS_connect, s, &sa as *const libc::sockaddr_un, core::mem::size_of::<libc::sockaddr_un>() as socklen_t) } == 0;
    let got = if !connected {
        resp.ret = if matches!(errno(), libc::ENOENT | libc::ECONNREFUSED) { NET_LOCAL } else { -(libc::ENETDOWN as i64) };
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
    unsafe { libc::syscall(libc::SYS_close, s) };
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
        let n = unsafe { libc::syscall(libc::SYS_sendmsg, s, &msg as *const libc::msghdr, libc::MSG_NOSIGNAL) };
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
        let n = unsafe { libc::syscall(libc::SYS_recvmsg, s, &mut msg as *mut libc::msghdr, libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL) };
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
        let m = unsafe { libc::syscall(libc::SYS_recvfrom, s, buf[got..].as_mut_ptr(), buf.len() - got, libc::MSG_WAITALL, 0usize, 0usize) };
        if m > 0 {
            got += m as usize;
        } else if !(m < 0 && errno() == libc::EINTR) {
            break;
        }
    }
    if got != buf.len() {
        if fd >= 0 {
            // SAFETY: a descriptor just installed for us that nothing else knows.
            unsafe { libc::syscall(libc::SYS_close, fd) };
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
            libc::syscall(libc::SYS_fcntl, fd, libc::F_SETFD, 0);
        }
        if flags & libc::SOCK_NONBLOCK != 0 {
            let fl = libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL);
            libc::syscall(libc::SYS_fcntl, fd, libc::F_SETFL, fl | libc::O_NONBLOCK as i64);
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
    let tcp = matches!(domain, libc::AF_INET | libc::AF_INET6) && base == libc::SOCK_STREAM && matches!(protocol, 0 | libc::IPPROTO_TCP);
    if tcp && !LOCAL_STACK.load(Relaxed) && ready() {
        let (r, fd) = call(&request(NetOp::Socket, domain as i64, base as i64, protocol as i64, &[]), -1);
        if r.ret < 0 {
            return fail(r.ret);
        }
        if r.ret != NET_LOCAL && fd >= 0 {
            apply_flags(fd, ty);
            return fd;
        }
        // The cluster has no nComponent: this image's sockets are the host's, without asking
        // again for each.
        LOCAL_STACK.store(true, Relaxed);
    }
    // SAFETY: socket(2) takes no pointers.
    unsafe { libc::syscall(libc::SYS_socket, domain, ty, protocol) as c_int }
}

/// One call about a socket of ours; None: the kernel's.
fn on_socket(fd: c_int, req: &NetReq) -> Option<NetResp> {
    if !bridged(fd) {
        return None;
    }
    let (r, extra) = call(req, fd);
    if extra >= 0 {
        // SAFETY: a descriptor nothing asked for.
        unsafe { libc::syscall(libc::SYS_close, extra) };
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
        None => unsafe { libc::syscall(libc::SYS_bind, fd, addr, len) as c_int },
    }
}

#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    match on_socket(fd, &request(NetOp::Listen, backlog as i64, 0, 0, &[])) {
        Some(r) => answer(&r),
        // SAFETY: listen(2) takes no pointers.
        None => unsafe { libc::syscall(libc::SYS_listen, fd, backlog) as c_int },
    }
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's contract (connect(2)).
    let bytes = unsafe { addr_bytes(addr, len) };
    if bridged(fd) {
        // SAFETY: fcntl(2) takes no pointers here.
        let nonblocking = unsafe { libc::syscall(libc::SYS_fcntl, fd, libc::F_GETFL) } & libc::O_NONBLOCK as i64 != 0;
        let (r, _) = call(&request(NetOp::Connect, nonblocking as i64, 0, 0, bytes), fd);
        if r.ret != NET_LOCAL {
            return answer(&r);
        }
    }
    // SAFETY: connect(2) with the caller's arguments.
    unsafe { libc::syscall(libc::SYS_connect, fd, addr, len) as c_int }
}

#[no_mangle]
pub unsafe extern "C" fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    if !bridged(fd) {
        // SAFETY: accept4(2) with the caller's arguments.
        return unsafe { libc::syscall(libc::SYS_accept4, fd, addr, len, flags) as c_int };
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
    let n = unsafe { libc::syscall(libc::SYS_recvfrom, fd, &mut token as *mut u8, 1, 0, 0usize, 0usize) };
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
        None => unsafe { libc::syscall(nr, fd, addr, len) as c_int },
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
    unsafe { libc::syscall(libc::SYS_setsockopt, fd, level, opt, val, len) as c_int }
}

#[no_mangle]
pub unsafe extern "C" fn sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t {
    // A connected TCP socket ignores a destination; its Unix end would refuse one.
    let (addr, len) = if !addr.is_null() && bridged(fd) { (core::ptr::null(), 0) } else { (addr, len) };
    // SAFETY: sendto(2) with the caller's arguments.
    unsafe { libc::syscall(libc::SYS_sendto, fd, buf, n, flags, addr, len) as ssize_t }
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's contract: `msg` is a readable msghdr.
    if !msg.is_null() && !unsafe { (*msg).msg_name }.is_null() && bridged(fd) {
        // SAFETY: as above; a copy without the destination.
        let mut m = unsafe { *msg };
        m.msg_name = core::ptr::null_mut();
        m.msg_namelen = 0;
        // SAFETY: sendmsg(2) with the caller's buffers.
        return unsafe { libc::syscall(libc::SYS_sendmsg, fd, &m as *const libc::msghdr, flags) as ssize_t };
    }
    // SAFETY: sendmsg(2) with the caller's arguments.
    unsafe { libc::syscall(libc::SYS_sendmsg, fd, msg, flags) as ssize_t }
}
