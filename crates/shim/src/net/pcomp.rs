//! One socket call from the program to its pComponent, on a connection of its own, with a
//! descriptor attached each way.
use core::ffi::{c_char, c_int, c_void};
use libc::socklen_t;
use splitos_shim_abi::{
    FromZeros, IntoBytes, NetOp, NetReq, NetResp, NET_DATA, NET_LOCAL, NET_SOCK_SUFFIX, SHIM_ABI_VERSION,
};

use crate::start::env;
use crate::sys::{errno, served_by_trusted_user, set_errno, until_nul};
use crate::trap::sys;

pub(super) fn request(op: NetOp, a: i64, b: i64, c: i64, data: &[u8]) -> NetReq {
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
pub(super) fn call(req: &NetReq, fd: c_int) -> (NetResp, c_int) {
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
    let s = unsafe {
        sys!(
            libc::SYS_socket,
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0
        )
    } as c_int;
    if s < 0 {
        resp.ret = -(errno() as i64);
        return (resp, -1);
    }
    let saved = errno();
    // SAFETY: the address is a live sockaddr_un of the length passed.
    let connected = unsafe {
        sys!(
            libc::SYS_connect,
            s,
            &sa as *const libc::sockaddr_un,
            core::mem::size_of::<libc::sockaddr_un>() as socklen_t
        )
    } == 0;
    let got = if !connected {
        resp.ret = if matches!(errno(), libc::ENOENT | libc::ECONNREFUSED) {
            NET_LOCAL
        } else {
            -(libc::ENETDOWN as i64)
        };
        -1
    } else if !served_by_trusted_user(s) {
        // Another user's socket in the stub's place gets neither the call nor the descriptor.
        resp.ret = -(libc::ENETDOWN as i64);
        -1
    } else {
        // A send that fails may still have an answer waiting: a stub that refuses a call
        // (EAGAIN when the vNode's share of call threads is taken) answers and closes without
        // reading it, and may do so before the call is sent (EPIPE). Shut, the connection
        // ends a stub that still waits for the call.
        if !send_with_fd(s, req.as_bytes(), fd) {
            // SAFETY: shutdown(2) of the descriptor made above takes no pointers.
            unsafe { sys!(libc::SYS_shutdown, s, libc::SHUT_WR) };
        }
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
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut c_void,
        iov_len: bytes.len(),
    };
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
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut c_void,
        iov_len: buf.len(),
    };
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
        let n = unsafe {
            sys!(
                libc::SYS_recvmsg,
                s,
                &mut msg as *mut libc::msghdr,
                libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL
            )
        };
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
        let m = unsafe {
            sys!(
                libc::SYS_recvfrom,
                s,
                buf[got..].as_mut_ptr(),
                buf.len() - got,
                libc::MSG_WAITALL,
                0usize,
                0usize
            )
        };
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
