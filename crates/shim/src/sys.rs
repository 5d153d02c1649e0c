//! Raw system calls and helpers that neither allocate nor touch the heap region: they run
//! inside malloc, inside fork and before the region exists.
use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, Ordering::*};
use libc::off_t;

pub(crate) const PAGE: u64 = 4096;
/// The shim's descriptors live high so that programs which close their low fds keep them.
const HIGH_FD: c_int = 900;

pub(crate) fn until_nul(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|c| *c == 0).unwrap_or(b.len())]
}

pub(crate) fn errno() -> c_int {
    unsafe { *libc::__errno_location() }
}

pub(crate) fn set_errno(e: c_int) {
    unsafe { *libc::__errno_location() = e }
}

pub(crate) fn spin_lock(l: &AtomicBool) {
    while l.compare_exchange_weak(false, true, Acquire, Relaxed).is_err() {
        unsafe { libc::sched_yield() };
    }
}

pub(crate) fn spin_unlock(l: &AtomicBool) {
    l.store(false, Release);
}

pub(crate) fn say(parts: &[&[u8]]) {
    for p in parts {
        unsafe { libc::write(2, p.as_ptr() as *const c_void, p.len()) };
    }
}

/// A fatal condition under which continuing would be silently wrong.
pub(crate) fn die(parts: &[&[u8]]) -> ! {
    say(&[b"splitos shim: "]);
    say(parts);
    say(&[b"\n"]);
    unsafe { libc::_exit(127) }
}

pub(crate) fn cstr(p: *const c_char) -> &'static [u8] {
    if p.is_null() {
        return b"";
    }
    unsafe { core::slice::from_raw_parts(p as *const u8, libc::strlen(p)) }
}

pub(crate) fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((c - b'0') as u64)?;
    }
    Some(v)
}

pub(crate) fn fmt_u64(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

pub(crate) fn page_up(n: u64) -> Option<u64> {
    n.checked_add(PAGE - 1).map(|v| v & !(PAGE - 1))
}

pub(crate) unsafe fn raw_mmap(addr: u64, len: u64, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void
}

pub(crate) unsafe fn raw_mprotect(addr: u64, len: u64, prot: c_int) -> c_int {
    libc::syscall(libc::SYS_mprotect, addr, len, prot) as c_int
}

pub(crate) unsafe fn high_fd(fd: c_int) -> c_int {
    let h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, HIGH_FD);
    if h < 0 {
        return fd;
    }
    libc::close(fd);
    h
}
