//! Receiving: a UDP socket's datagrams name their source by their sender socket, and the end
//! of a TCP socket's stream may be its peer's reset.
use core::ffi::{c_int, c_void};
use libc::{size_t, sockaddr, socklen_t, ssize_t};
use splitos_shim_abi::{udp_addr, NetOp};

use super::send::msg_len;
use super::{classify, fail, on_socket, paired, request, udp_self, Kind, UdpName};
use crate::sys::{errno, set_errno, until_nul};
use crate::trap::sys;

/// Writes the source of a datagram the kernel named `raw` (`rlen` bytes) into the caller's
/// address, as recvfrom(2) does (truncated to the room, the whole length stored): a UDP
/// socket's sender as the address it stands for (`own`: the socket's name, asked only for a
/// Unix source).
///
/// # Safety
/// `addr` has room for `*alen` bytes; `alen` is writable.
unsafe fn put_source(
    own: impl FnOnce() -> Option<UdpName>,
    raw: &[u8],
    rlen: usize,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) {
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
    if crate::directio::needed(fd, buf, n) {
        // SAFETY: read(2) into the bounce buffer; the caller's buffer has room for `n`.
        let bounced =
            unsafe { crate::directio::bounced(buf, n, |p, len, _| sys!(libc::SYS_read, fd, p, len) as isize) };
        if let Some(r) = bounced {
            return r;
        }
    }
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
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    if addr.is_null() || alen.is_null() || !crate::start::is_ready() {
        // SAFETY: recvfrom(2) with the caller's arguments.
        return reset_or(fd, n, unsafe {
            sys!(libc::SYS_recvfrom, fd, buf, n, flags, addr, alen) as ssize_t
        });
    }
    // SAFETY: sockaddr_storage is plain data, valid when zeroed.
    let mut raw: libc::sockaddr_storage = unsafe { core::mem::zeroed() };
    let mut rlen = core::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: recvfrom(2) with the caller's buffer and a live address of the size given.
    let r = unsafe {
        sys!(
            libc::SYS_recvfrom,
            fd,
            buf,
            n,
            flags,
            &mut raw as *mut libc::sockaddr_storage,
            &mut rlen as *mut socklen_t
        ) as ssize_t
    };
    if r >= 0 {
        // SAFETY: the kernel wrote `rlen` bytes (at most the size) of the live value.
        let bytes = unsafe {
            core::slice::from_raw_parts(
                (&raw as *const libc::sockaddr_storage).cast::<u8>(),
                core::mem::size_of::<libc::sockaddr_storage>(),
            )
        };
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
            let bytes = core::slice::from_raw_parts(
                (&raw as *const libc::sockaddr_storage).cast::<u8>(),
                core::mem::size_of::<libc::sockaddr_storage>(),
            );
            let saved = errno();
            put_source(
                || udp_self(fd),
                bytes,
                m.msg_namelen as usize,
                (*msg).msg_name.cast(),
                &mut (*msg).msg_namelen,
            );
            set_errno(saved);
        }
    }
    // SAFETY: the caller's iovecs, readable.
    reset_or(fd, unsafe { msg_len(&m) }, r)
}

/// Most messages one recvmmsg of a UDP socket receives (it may return fewer than asked).
const MMSG: usize = 64;

#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    vec: *mut libc::mmsghdr,
    vlen: libc::c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
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
                let bytes = core::slice::from_raw_parts(
                    (&raw[i] as *const libc::sockaddr_storage).cast::<u8>(),
                    core::mem::size_of::<libc::sockaddr_storage>(),
                );
                put_source(|| Some(own.clone()), bytes, got, h.msg_name.cast(), &mut h.msg_namelen);
            }
        }
        set_errno(saved);
        r
    }
}
