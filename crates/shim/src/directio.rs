//! Reads from FUSE files into the heap region go through memory outside it. A FUSE file
//! opened for direct I/O (a vNode's files are, for coherence between pComponents) is read
//! straight into the caller's pages: the kernel pins them when the call starts and copies
//! the FUSE server's answer into them later. A heap page the ExCache evicts in between is no
//! longer the program's, and the answer would land in a page nobody maps, the program
//! finding there what the page held before. Pages outside the region are the kernel's alone.
//! Writes need nothing: an evicted page still holds what it held when it was pinned.
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicPtr, Ordering::*};

use crate::trap::sys;

const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
/// One bounce buffer, and the most one read through it asks of the kernel at once.
const BOUNCE: usize = 1 << 20;
/// Bounce buffers kept mapped for reuse; a read that finds none free maps one of its own.
const SLOTS: usize = 8;

static BUSY: [AtomicBool; SLOTS] = [const { AtomicBool::new(false) }; SLOTS];
static MEM: [AtomicPtr<u8>; SLOTS] = [const { AtomicPtr::new(core::ptr::null_mut()) }; SLOTS];

fn map_bounce() -> *mut u8 {
    // SAFETY: a fresh private anonymous mapping the kernel places (never in the region, which
    // it keeps reserved); nothing else refers to it.
    let p = unsafe {
        crate::sys::raw_mmap(
            0,
            BOUNCE as u64,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        core::ptr::null_mut()
    } else {
        p.cast()
    }
}

/// A bounce buffer held for one read.
struct Bounce {
    slot: Option<usize>,
    mem: *mut u8,
}

impl Bounce {
    fn take() -> Option<Bounce> {
        for (i, busy) in BUSY.iter().enumerate() {
            if busy.compare_exchange(false, true, Acquire, Relaxed).is_ok() {
                let mut mem = MEM[i].load(Acquire);
                if mem.is_null() {
                    mem = map_bounce();
                    if mem.is_null() {
                        busy.store(false, Release);
                        return None;
                    }
                    MEM[i].store(mem, Release);
                }
                return Some(Bounce { slot: Some(i), mem });
            }
        }
        let mem = map_bounce();
        (!mem.is_null()).then_some(Bounce { slot: None, mem })
    }
}

impl Drop for Bounce {
    fn drop(&mut self) {
        match self.slot {
            Some(i) => BUSY[i].store(false, Release),
            // SAFETY: the buffer this value mapped for itself; nothing refers to it any more.
            None => unsafe {
                libc::syscall(libc::SYS_munmap, self.mem, BOUNCE);
            },
        }
    }
}

fn fuse_file(fd: c_int) -> bool {
    // SAFETY: statfs is plain data, valid when zeroed; fstatfs(2) writes only into it.
    let mut st: libc::statfs = unsafe { core::mem::zeroed() };
    // SAFETY: fstatfs(2) with a live statfs to fill.
    let r = unsafe { sys!(libc::SYS_fstatfs, fd, &mut st as *mut libc::statfs) };
    r == 0 && st.f_type == FUSE_SUPER_MAGIC
}

/// Whether a read of `n` bytes from `fd` into `buf` must go through a bounce buffer.
pub(crate) fn needed(fd: c_int, buf: *const c_void, n: usize) -> bool {
    n > 0 && crate::start::is_ready() && crate::vm::overlaps_region(buf as u64, n as u64) && fuse_file(fd)
}

/// Reads up to `n` bytes into `buf` through a bounce buffer: `read_at(p, len, done)` reads up
/// to `len` bytes into `p` at the call's position plus `done` (the file offset itself for a
/// plain read). Returns what the call returns; `None` when no bounce buffer can be mapped
/// (the caller reads directly, as before).
///
/// # Safety
/// `buf` has room for `n` bytes.
pub(crate) unsafe fn bounced(
    buf: *mut c_void,
    n: usize,
    mut read_at: impl FnMut(*mut c_void, usize, usize) -> isize,
) -> Option<isize> {
    let b = Bounce::take()?;
    let mut done = 0usize;
    while done < n {
        let want = (n - done).min(BOUNCE);
        let r = read_at(b.mem.cast(), want, done);
        if r < 0 {
            return Some(if done > 0 { done as isize } else { r });
        }
        // SAFETY: the kernel wrote `r` bytes into the bounce buffer; the caller's buffer has
        // room for `n`. Copied by the program's own thread: a missing heap page faults and is
        // served by the pComponent as any other access.
        unsafe { core::ptr::copy_nonoverlapping(b.mem, buf.cast::<u8>().add(done), r as usize) };
        done += r as usize;
        if (r as usize) < want {
            break;
        }
    }
    Some(done as isize)
}

/// The same for a vector of buffers (readv, preadv): read into the bounce buffer, then
/// scattered over `iov`. `None` when the vector needs no bounce or none can be mapped.
///
/// # Safety
/// `iov` points to `cnt` live iovecs, each with room for its length.
unsafe fn readv_bounced(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    mut read_at: impl FnMut(*mut c_void, usize, usize) -> isize,
) -> Option<isize> {
    if cnt <= 0 || !crate::start::is_ready() {
        return None;
    }
    // SAFETY: the caller's contract.
    let iov = unsafe { core::slice::from_raw_parts(iov, cnt as usize) };
    let in_region = iov
        .iter()
        .any(|v| v.iov_len > 0 && crate::vm::overlaps_region(v.iov_base as u64, v.iov_len as u64));
    if !in_region || !fuse_file(fd) {
        return None;
    }
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    let b = Bounce::take()?;
    let (mut done, mut at) = (0usize, (0usize, 0usize));
    while done < total {
        let want = (total - done).min(BOUNCE);
        let r = read_at(b.mem.cast(), want, done);
        if r < 0 {
            return Some(if done > 0 { done as isize } else { r });
        }
        let mut from = 0usize;
        while from < r as usize {
            let v = &iov[at.0];
            let k = (v.iov_len - at.1).min(r as usize - from);
            // SAFETY: `k` bytes the kernel wrote into the bounce buffer, into the room left in
            // the caller's iovec `at.0`.
            unsafe { core::ptr::copy_nonoverlapping(b.mem.add(from), v.iov_base.cast::<u8>().add(at.1), k) };
            from += k;
            at.1 += k;
            if at.1 == v.iov_len {
                at = (at.0 + 1, 0);
            }
        }
        done += r as usize;
        if (r as usize) < want {
            break;
        }
    }
    Some(done as isize)
}

#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: libc::size_t, off: libc::off_t) -> libc::ssize_t {
    if needed(fd, buf, n) {
        // SAFETY: pread(2) into the bounce buffer, at the caller's offset plus what is done.
        let r = unsafe {
            bounced(buf, n, |p, len, done| {
                sys!(libc::SYS_pread64, fd, p, len, off + done as libc::off_t) as isize
            })
        };
        if let Some(r) = r {
            return r;
        }
    }
    // SAFETY: pread(2) with the caller's arguments.
    unsafe { sys!(libc::SYS_pread64, fd, buf, n, off) as libc::ssize_t }
}

#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: libc::size_t, off: libc::off_t) -> libc::ssize_t {
    // SAFETY: the same call.
    unsafe { pread(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, cnt: c_int) -> libc::ssize_t {
    // SAFETY: read(2) into the bounce buffer; the caller's iovecs as its contract says.
    if let Some(r) = unsafe { readv_bounced(fd, iov, cnt, |p, len, _| sys!(libc::SYS_read, fd, p, len) as isize) } {
        return r;
    }
    // SAFETY: readv(2) with the caller's arguments.
    unsafe { sys!(libc::SYS_readv, fd, iov, cnt) as libc::ssize_t }
}

#[no_mangle]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: libc::off_t) -> libc::ssize_t {
    // SAFETY: pread(2) into the bounce buffer; the caller's iovecs as its contract says.
    let bounced = unsafe {
        readv_bounced(fd, iov, cnt, |p, len, done| {
            sys!(libc::SYS_pread64, fd, p, len, off + done as libc::off_t) as isize
        })
    };
    if let Some(r) = bounced {
        return r;
    }
    // SAFETY: preadv(2) with the caller's arguments (the offset split as the kernel takes it).
    unsafe { sys!(libc::SYS_preadv, fd, iov, cnt, off, 0) as libc::ssize_t }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64(fd: c_int, iov: *const libc::iovec, cnt: c_int, off: libc::off_t) -> libc::ssize_t {
    // SAFETY: the same call.
    unsafe { preadv(fd, iov, cnt, off) }
}
