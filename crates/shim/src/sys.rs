//! Raw system calls and helpers that neither allocate nor touch the heap region: they run
//! inside malloc, inside fork and before the region exists.
use core::ffi::{c_char, c_int, c_void, CStr};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use libc::off_t;

pub(crate) const PAGE: u64 = 4096;
/// The shim's descriptors live high so that programs which close their low fds keep them.
const HIGH_FD: c_int = 900;

pub(crate) fn until_nul(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|c| *c == 0).unwrap_or(b.len())]
}

pub(crate) fn errno() -> c_int {
    // SAFETY: __errno_location returns the calling thread's errno slot, valid as long as the
    // thread lives, and nothing else holds a reference to it.
    unsafe { *libc::__errno_location() }
}

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: as in errno().
    unsafe { *libc::__errno_location() = e }
}

pub(crate) fn spin_lock(l: &AtomicBool) {
    while l.compare_exchange_weak(false, true, Acquire, Relaxed).is_err() {
        // SAFETY: sched_yield takes no arguments and touches no memory of ours.
        unsafe { libc::sched_yield() };
    }
}

pub(crate) fn spin_unlock(l: &AtomicBool) {
    l.store(false, Release);
}

pub(crate) fn say(parts: &[&[u8]]) {
    for p in parts {
        // SAFETY: pointer and length describe a live slice; write(2) only reads from it.
        unsafe { libc::write(2, p.as_ptr() as *const c_void, p.len()) };
    }
}

/// A fatal condition under which continuing would be silently wrong.
pub(crate) fn die(parts: &[&[u8]]) -> ! {
    say(&[b"splitos shim: "]);
    say(parts);
    say(&[b"\n"]);
    // SAFETY: _exit ends the process without running atexit handlers or flushing stdio, which
    // may themselves need the heap that is at fault here.
    unsafe { libc::_exit(127) }
}

/// The bytes of a C string up to its NUL; empty for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string that is never freed or changed (the
/// environment strings the shim reads at start-up qualify).
pub(crate) unsafe fn cstr(p: *const c_char) -> &'static [u8] {
    if p.is_null() {
        return b"";
    }
    // SAFETY: by the contract above, strlen stays within the string and the bytes outlive us.
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

/// mmap(2) itself, never our interposed `mmap`.
///
/// # Safety
/// With MAP_FIXED the range must hold no memory that Rust code or the program still uses.
pub(crate) unsafe fn raw_mmap(addr: u64, len: u64, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    // SAFETY: the kernel validates the arguments; replacing live memory is excluded by the
    // caller's contract.
    unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void }
}

/// mprotect(2) itself, never our interposed `mprotect`.
///
/// # Safety
/// Revoking access to memory that Rust code holds references into is the caller's to exclude.
pub(crate) unsafe fn raw_mprotect(addr: u64, len: u64, prot: c_int) -> c_int {
    // SAFETY: the kernel validates the range; what it protects is the caller's contract.
    unsafe { libc::syscall(libc::SYS_mprotect, addr, len, prot) as c_int }
}

/// Whether the process at the other end of the connected Unix socket `fd` may be given this
/// program's memory and sockets: it runs as root (the host's pComponent) or as this program's
/// own user, never as another user who made a socket where the pComponent's was expected.
pub(crate) fn served_by_trusted_user(fd: c_int) -> bool {
    // SAFETY: ucred is plain data, valid when zeroed.
    let mut cred: libc::ucred = unsafe { core::mem::zeroed() };
    let mut len = core::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which lives across the call;
    // made from the gate, as the shim's own call, not the program's.
    let r = unsafe {
        crate::trap::sys!(
            libc::SYS_getsockopt,
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred,
            &mut len as *mut libc::socklen_t
        )
    } as c_int;
    // SAFETY: geteuid has no preconditions.
    r == 0 && (cred.uid == 0 || cred.uid == unsafe { libc::geteuid() })
}

/// Moves a descriptor the shim just created (and owns) above the program's usual range.
pub(crate) fn high_fd(fd: c_int) -> c_int {
    // SAFETY: F_DUPFD_CLOEXEC only creates a descriptor; `fd` is ours, so closing it after a
    // successful dup closes nothing the program knows about.
    unsafe {
        let h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, HIGH_FD);
        if h < 0 {
            return fd;
        }
        libc::close(fd);
        h
    }
}

/// A C library function that the shim's own definition of the same name hides, found with
/// RTLD_NEXT. Looked up from the constructor: dlsym may allocate, which the fork and vfork
/// children that call these must not.
pub(crate) struct NextFn {
    name: &'static CStr,
    addr: AtomicUsize,
}

impl NextFn {
    pub(crate) const fn new(name: &'static CStr) -> NextFn {
        NextFn {
            name,
            addr: AtomicUsize::new(0),
        }
    }

    pub(crate) fn resolve(&self) -> usize {
        let mut f = self.addr.load(Relaxed);
        if f == 0 {
            // SAFETY: RTLD_NEXT with a NUL-terminated name only looks a symbol up.
            f = unsafe { libc::dlsym(libc::RTLD_NEXT, self.name.as_ptr()) } as usize;
            if f == 0 {
                die(&[b"cannot find the C library's ", self.name.to_bytes()]);
            }
            self.addr.store(f, Relaxed);
        }
        f
    }

    /// # Safety
    /// `F` is the function pointer type of the C library function of this name.
    pub(crate) unsafe fn get<F: Copy>(&self) -> F {
        assert_eq!(core::mem::size_of::<F>(), core::mem::size_of::<usize>());
        let f = self.resolve();
        // SAFETY: a non-null address of the function, of the type the caller names.
        unsafe { core::mem::transmute_copy::<usize, F>(&f) }
    }
}
