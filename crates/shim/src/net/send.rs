//! Sending: a UDP socket's datagrams go to the sender socket named after their destination.
use core::ffi::{c_char, c_int, c_void};
use libc::{size_t, sockaddr, socklen_t, ssize_t};
use splitos_shim_abi::{udp_name, NetOp, NET_UDP_MAX};

use super::{addr_bytes, call, classify, fail, paired, request, udp_self, Kind, UdpName};
use crate::sys::{errno, set_errno};
use crate::trap::sys;

/// Sends a UDP socket's datagram of `n` bytes to the sender of `dest` (a sockaddr's bytes):
/// `send` does it with the sender's sockaddr_un. A sender the pComponent has not made (or
/// dropped) is asked for once.
fn udp_send(
    fd: c_int,
    own: &UdpName,
    dest: &[u8],
    n: usize,
    send: impl Fn(*const libc::sockaddr_un, socklen_t) -> ssize_t,
) -> ssize_t {
    let Some((part, plen)) = udp_name(dest) else {
        set_errno(
            if dest.len() >= 2
                && u16::from_ne_bytes([dest[0], dest[1]]) as c_int != libc::AF_INET
                && u16::from_ne_bytes([dest[0], dest[1]]) as c_int != libc::AF_INET6
            {
                libc::EAFNOSUPPORT
            } else {
                libc::EINVAL
            },
        );
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
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    // An address of length 0 is none, as for the kernel.
    let (addr, len) = if !addr.is_null() && len != 0 {
        match classify(fd) {
            Kind::Udp(own) => {
                // SAFETY: the caller's contract (sendto(2)).
                let dest = unsafe { addr_bytes(addr, len) };
                // SAFETY: sendto(2) with the caller's buffer and a live sockaddr_un.
                return udp_send(fd, &own, dest, n, |sa, salen| unsafe {
                    sys!(libc::SYS_sendto, fd, buf, n, flags, sa, salen) as ssize_t
                });
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
pub(super) unsafe fn msg_len(m: &libc::msghdr) -> usize {
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
