//! The heap region and the virtual-memory calls that land on it.
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicI32, AtomicU64, Ordering::*};
use libc::{off_t, size_t};
use splitos_shim_abi::{uffd, Op, MMAP_AT_HINT, MMAP_FIXED, MMAP_NORESERVE, REGION_BASE};

use crate::conn::{connect, hello, request};
use crate::start::{is_ready, ready};
use crate::sys::{die, errno, high_fd, page_up, raw_mmap, raw_mprotect, set_errno, PAGE};

pub(crate) static UFFD: AtomicI32 = AtomicI32::new(-1);
pub(crate) static MEMFD: AtomicI32 = AtomicI32::new(-1);
pub(crate) static REGION_SIZE: AtomicU64 = AtomicU64::new(0);

fn in_region(addr: u64, len: u64) -> bool {
    let size = REGION_SIZE.load(Relaxed);
    size != 0 && addr >= REGION_BASE && addr.saturating_add(len) <= REGION_BASE + size
}

pub(crate) fn overlaps_region(addr: u64, len: u64) -> bool {
    let size = REGION_SIZE.load(Relaxed);
    size != 0 && addr < REGION_BASE + size && addr.saturating_add(len) > REGION_BASE
}

/// Connects to the pComponent, maps the region (backed by the file the pComponent offers, else
/// a memfd), registers it with a fresh userfaultfd and introduces this process to the
/// pComponent. `fork_token` is non-zero in a forked child.
///
/// # Safety
/// Nothing may use the region's address range yet (at start-up, or in a forked child, which
/// inherits nothing there).
pub(crate) unsafe fn setup_region(fork_token: u64) {
    let size = REGION_SIZE.load(Relaxed);
    // The pComponent says which userfaultfd features its miss path needs before the descriptor
    // exists (they are fixed when it is set up), and may offer the heap's file.
    let welcomed = connect();
    let wanted = welcomed.features;
    let memfd = if welcomed.heap_file >= 0 {
        welcomed.heap_file
    } else {
        // SAFETY: memfd_create with a NUL-terminated name only creates a file.
        (unsafe { libc::syscall(libc::SYS_memfd_create, c"splitos-heap".as_ptr(), libc::MFD_CLOEXEC) }) as c_int
    };
    // SAFETY: sizes the heap's own file, new and empty.
    if memfd < 0 || unsafe { libc::ftruncate(memfd, size as off_t) } != 0 {
        die(&[b"cannot create the heap file"]);
    }
    let flags = libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE | libc::MAP_NORESERVE;
    // SAFETY: MAP_FIXED_NOREPLACE fails rather than replace anything already mapped there.
    let p = unsafe { raw_mmap(REGION_BASE, size, libc::PROT_NONE, flags, memfd, 0) };
    if p as u64 != REGION_BASE {
        die(&[b"the heap region address range is already in use in this program"]);
    }
    // SAFETY: advice on the mapping just made, which changes only what a fork child inherits.
    // A child gets a region of its own from the mComponents' copy, never the parent's pages.
    unsafe { libc::syscall(libc::SYS_madvise, REGION_BASE, size, libc::MADV_DONTFORK) };
    let uffd = if welcomed.uffd_dev >= 0 {
        // SAFETY: the ioctl only creates a descriptor; the device's own is closed after it.
        let fd = unsafe {
            libc::ioctl(
                welcomed.uffd_dev,
                uffd::USERFAULTFD_IOC_NEW as _,
                libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        // SAFETY: the device descriptor the welcome brought, used by nothing else.
        unsafe { libc::close(welcomed.uffd_dev) };
        fd
    } else {
        // SAFETY: userfaultfd(2) only creates a descriptor.
        unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) as c_int }
    };
    if uffd < 0 {
        die(&[b"userfaultfd is not available (the pComponent offered no /dev/userfaultfd, and this user may not create one: needs root or vm.unprivileged_userfaultfd=1)"]);
    }
    let mut api = uffd::Api {
        api: uffd::UFFD_API,
        features: uffd::FEATURE_MISSING_SHMEM | uffd::FEATURE_WP_HUGETLBFS_SHMEM | uffd::FEATURE_THREAD_ID | wanted,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes a uffdio_api, whose layout Api is (size asserted).
    if unsafe { libc::ioctl(uffd, uffd::UFFDIO_API as _, &mut api) } != 0 {
        if wanted & uffd::FEATURE_WP_ASYNC != 0 {
            die(&[b"this kernel's userfaultfd lacks asynchronous write protection, which the pComponent's dirty tracking by scan needs"]);
        }
        die(&[b"this kernel's userfaultfd lacks missing and write-protect faults on shared memory"]);
    }
    register_range(uffd, REGION_BASE, size);
    let memfd = high_fd(memfd);
    let uffd = high_fd(uffd);
    MEMFD.store(memfd, Relaxed);
    UFFD.store(uffd, Relaxed);
    // SAFETY: the region was mapped above and nothing uses it yet (this function's contract).
    unsafe { hello(uffd, memfd, fork_token) };
}

fn register_range(uffd: c_int, start: u64, len: u64) {
    let mode = uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP;
    let mut reg = uffd::Register {
        range: uffd::Range { start, len },
        mode,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_REGISTER reads and writes a uffdio_register, whose layout Register is.
    // Registering changes who serves faults in the range, not what the memory holds.
    if unsafe { libc::ioctl(uffd, uffd::UFFDIO_REGISTER as _, &mut reg) } != 0 {
        die(&[b"cannot register the heap region with userfaultfd"]);
    }
}

/// An anonymous private read/write mapping without exec is heap; everything else (files,
/// shared memory, stacks, JIT code) stays with the local kernel.
fn is_heap_mapping(prot: c_int, flags: c_int, fd: c_int) -> bool {
    let anon_private = flags & libc::MAP_ANONYMOUS != 0 && flags & libc::MAP_TYPE == libc::MAP_PRIVATE;
    let excluded = libc::MAP_HUGETLB | libc::MAP_GROWSDOWN | libc::MAP_STACK;
    anon_private
        && flags & excluded == 0
        && prot & libc::PROT_EXEC == 0
        && (fd == -1 || flags & libc::MAP_ANONYMOUS != 0)
}

/// A heap mapping from the pComponent; `flags` are the protocol's `MMAP_*`.
pub(crate) fn region_mmap(hint: u64, len: u64, prot: c_int, flags: u64) -> Result<u64, c_int> {
    let r = request(Op::Mmap, hint, len, prot as u64, flags, 0);
    if r.ret < 0 {
        return Err((-r.ret) as c_int);
    }
    if flags & MMAP_FIXED != 0 && hint != r.val {
        return Err(libc::ENOMEM);
    }
    // SAFETY: the range was just handed out by the pComponent: no one references it yet.
    if prot != libc::PROT_NONE && unsafe { raw_mprotect(r.val, len, prot) } != 0 {
        return Err(errno());
    }
    Ok(r.val)
}

/// Puts region pages back under our memfd mapping after a foreign mapping replaced them.
///
/// # Safety
/// The program is giving the range up (munmap): nothing may use its memory any more.
unsafe fn restore_region_backing(addr: u64, len: u64) {
    let flags = libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_NORESERVE;
    // SAFETY: replaces only the range the caller gives up, with inaccessible region backing.
    let p = unsafe {
        raw_mmap(
            addr,
            len,
            libc::PROT_NONE,
            flags,
            MEMFD.load(Relaxed),
            (addr - REGION_BASE) as off_t,
        )
    };
    if p as u64 != addr {
        die(&[b"cannot restore the heap region after a foreign mapping"]);
    }
    // SAFETY: advice that changes only what a fork child inherits of the range.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, libc::MADV_DONTFORK) };
    register_range(UFFD.load(Relaxed), addr, len);
}

#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    let a = addr as u64;
    let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
    if !is_heap_mapping(prot, flags, fd) || !ready() || (fixed && !in_region(a, len as u64)) {
        if fixed && overlaps_region(a, len as u64) && ready() {
            // A file or executable mapping placed over heap the program reserved (a JIT's code
            // cache, a JVM's class archive): the kernel replaces those pages, so the
            // mComponents drop their contents but keep the range reserved (an inaccessible,
            // unaccounted area) so that it is never handed out again while the foreign mapping
            // lives. The program's munmap of it gives the range back.
            let start = a.max(REGION_BASE);
            let end = page_up((a + len as u64).min(REGION_BASE + REGION_SIZE.load(Relaxed))).unwrap_or(0);
            let r = request(Op::Mmap, start, end - start, libc::PROT_NONE as u64, MMAP_FIXED, 0);
            if r.ret < 0 {
                set_errno((-r.ret) as c_int);
                return libc::MAP_FAILED;
            }
        }
        // SAFETY: the program's own mmap call, passed on unchanged; its effect on the
        // program's memory is what the program asked for.
        return unsafe { raw_mmap(a, len as u64, prot, flags, fd, off) };
    }
    let Some(len) = page_up(len as u64).filter(|l| *l > 0) else {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    };
    let noreserve = if flags & libc::MAP_NORESERVE != 0 {
        MMAP_NORESERVE
    } else {
        0
    };
    if flags & libc::MAP_FIXED_NOREPLACE != 0 {
        match region_mmap(a, len, prot, MMAP_AT_HINT | noreserve) {
            Ok(got) if got == a => return got as *mut c_void,
            Ok(got) => {
                // SAFETY: gives back the range just handed out, which no one has seen.
                unsafe { munmap(got as *mut c_void, len as size_t) };
                set_errno(libc::EEXIST);
                return libc::MAP_FAILED;
            }
            Err(e) => {
                set_errno(e);
                return libc::MAP_FAILED;
            }
        }
    }
    match region_mmap(a, len, prot, if fixed { MMAP_FIXED } else { 0 } | noreserve) {
        Ok(p) => p as *mut c_void,
        Err(e) => {
            set_errno(e);
            libc::MAP_FAILED
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    // SAFETY: the same call under its other name; the caller's contract is mmap's.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    let a = addr as u64;
    if !is_ready() || !overlaps_region(a, len as u64) {
        // SAFETY: the program's own munmap of memory outside the region, passed on unchanged.
        return unsafe { libc::syscall(libc::SYS_munmap, a, len) } as c_int;
    }
    if !a.is_multiple_of(PAGE) || len == 0 || !in_region(a, len as u64) {
        set_errno(libc::EINVAL);
        return -1;
    }
    let len = page_up(len as u64).unwrap_or(0);
    // If a foreign mapping sits here, put our backing back first; then nothing can touch the
    // pages while the pComponent drops them.
    // SAFETY: the program is unmapping the range, so it no longer uses it.
    unsafe { restore_region_backing(a, len) };
    let r = request(Op::Munmap, a, len, 0, 0, 0);
    if r.ret < 0 {
        set_errno((-r.ret) as c_int);
        return -1;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: size_t, prot: c_int) -> c_int {
    let a = addr as u64;
    if !is_ready() || !in_region(a, len as u64) {
        // SAFETY: the program's own mprotect outside the region, passed on unchanged.
        return unsafe { raw_mprotect(a, len as u64, prot) };
    }
    let len = page_up(len as u64).unwrap_or(0);
    let r = request(Op::Mprotect, a, len, prot as u64, 0, 0);
    if r.ret < 0 {
        set_errno((-r.ret) as c_int);
        return -1;
    }
    // SAFETY: the program's own mprotect, applied as asked once the pComponent recorded it (a
    // forked child gets the protections from there).
    unsafe { raw_mprotect(a, len, prot) }
}

#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    let a = addr as u64;
    if !is_ready() || !in_region(a, len as u64) {
        // SAFETY: the program's own madvise outside the region, passed on unchanged.
        return unsafe { libc::syscall(libc::SYS_madvise, a, len, advice) } as c_int;
    }
    if !a.is_multiple_of(PAGE) {
        set_errno(libc::EINVAL);
        return -1;
    }
    match advice {
        libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE => {
            let len = page_up(len as u64).unwrap_or(0);
            let r = request(Op::Dontneed, a, len, 0, 0, 0);
            if r.ret < 0 {
                set_errno((-r.ret) as c_int);
                return -1;
            }
            0
        }
        // Placement hints mean nothing for memory that lives on mComponents.
        _ => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    if advice == libc::POSIX_MADV_DONTNEED && is_ready() && in_region(addr as u64, len as u64) {
        // POSIX_MADV_DONTNEED must not discard contents (unlike MADV_DONTNEED).
        return 0;
    }
    // SAFETY: the advice the program gave, under the name that reports errors through errno.
    if unsafe { madvise(addr, len, advice) } == 0 {
        0
    } else {
        errno()
    }
}

/// `mremap` is variadic in C; on x86-64 the optional fifth argument is simply the next
/// register, read only when MREMAP_FIXED says it was passed.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let o = old as u64;
    if !is_ready() || !overlaps_region(o, old_len as u64) {
        // SAFETY: the program's own mremap outside the region, passed on unchanged.
        return unsafe { libc::syscall(libc::SYS_mremap, o, old_len, new_len, flags, new_addr) } as *mut c_void;
    }
    let (Some(ol), Some(nl)) = (page_up(old_len as u64), page_up(new_len as u64)) else {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    };
    if !o.is_multiple_of(PAGE) || nl == 0 || !in_region(o, ol) {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    let fixed = flags & libc::MREMAP_FIXED != 0;
    if fixed && !in_region(new_addr as u64, nl) {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    let mut f = 0;
    if flags & libc::MREMAP_MAYMOVE != 0 {
        f |= splitos_shim_abi::MREMAP_MAYMOVE;
    }
    if fixed {
        f |= splitos_shim_abi::MREMAP_FIXED;
    }
    let r = request(Op::Mremap, o, ol, nl, f, new_addr as u64);
    if r.ret < 0 {
        set_errno((-r.ret) as c_int);
        return libc::MAP_FAILED;
    }
    let (new, prot) = (r.val, r.val2 as c_int);
    // SAFETY: the protections mremap itself gives: the old range (or its cut tail) becomes
    // inaccessible as the program asked, the new range gets the old range's protection.
    unsafe {
        if new != o {
            raw_mprotect(o, ol, libc::PROT_NONE);
            raw_mprotect(new, nl, prot);
        } else if nl > ol {
            raw_mprotect(o + ol, nl - ol, prot);
        } else if nl < ol {
            raw_mprotect(o + nl, ol - nl, libc::PROT_NONE);
        }
    }
    new as *mut c_void
}
