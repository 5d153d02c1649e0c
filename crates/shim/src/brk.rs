//! The program break, emulated inside a reserved stretch of the region: glibc's own brk cannot
//! be interposed, but programs that call brk/sbrk themselves get region memory.
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use libc::size_t;

use crate::start::ready;
use crate::sys::{page_up, set_errno, spin_lock, spin_unlock};
use crate::vm::{madvise, mprotect, region_mmap};
use splitos_shim_abi::MMAP_NORESERVE;

static BRK_LOCK: AtomicBool = AtomicBool::new(false);
static BRK_BASE: AtomicU64 = AtomicU64::new(0);
static BRK_CUR: AtomicU64 = AtomicU64::new(0);
static BRK_TOP: AtomicU64 = AtomicU64::new(0);
const BRK_RESERVE: u64 = 1 << 30;

/// # Safety
/// As sbrk(2): shrinking the break revokes memory the program must no longer use.
unsafe fn native_sbrk(inc: isize) -> *mut c_void {
    // SAFETY: brk(0) only reads the break.
    let cur = unsafe { libc::syscall(libc::SYS_brk, 0) } as isize;
    if inc == 0 {
        return cur as *mut c_void;
    }
    let want = cur + inc;
    // SAFETY: moves the break by what the program asked (this function's contract).
    if unsafe { libc::syscall(libc::SYS_brk, want) } as isize != want {
        set_errno(libc::ENOMEM);
        return usize::MAX as *mut c_void;
    }
    cur as *mut c_void
}

/// The program break, emulated inside a reserved stretch of the region.
#[no_mangle]
pub unsafe extern "C" fn sbrk(inc: isize) -> *mut c_void {
    if !ready() {
        // SAFETY: the program's own sbrk, passed to the kernel's break.
        return unsafe { native_sbrk(inc) };
    }
    spin_lock(&BRK_LOCK);
    // SAFETY: BRK_LOCK is held; the program asked for this change of its break.
    let r = unsafe { sbrk_locked(inc) };
    spin_unlock(&BRK_LOCK);
    match r {
        Ok(old) => old as *mut c_void,
        Err(e) => {
            set_errno(e);
            usize::MAX as *mut c_void
        }
    }
}

/// # Safety
/// BRK_LOCK is held, and as sbrk: a shrink revokes memory the program no longer uses.
unsafe fn sbrk_locked(inc: isize) -> Result<u64, c_int> {
    if BRK_BASE.load(Relaxed) == 0 {
        let base = region_mmap(0, BRK_RESERVE, libc::PROT_NONE, MMAP_NORESERVE)?;
        BRK_BASE.store(base, Relaxed);
        BRK_CUR.store(base, Relaxed);
        BRK_TOP.store(base, Relaxed);
    }
    let (base, cur, top) = (BRK_BASE.load(Relaxed), BRK_CUR.load(Relaxed), BRK_TOP.load(Relaxed));
    let new = cur.checked_add_signed(inc as i64).ok_or(libc::ENOMEM)?;
    if new < base || new > base + BRK_RESERVE {
        return Err(libc::ENOMEM);
    }
    let new_top = page_up(new).ok_or(libc::ENOMEM)?;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: growing opens pages of the break's own reserve, which nothing else uses;
    // shrinking discards pages above the new break, which the program gave up.
    unsafe {
        if new_top > top {
            if mprotect(top as *mut c_void, (new_top - top) as size_t, rw) != 0 {
                return Err(libc::ENOMEM);
            }
        } else if new_top < top {
            madvise(new_top as *mut c_void, (top - new_top) as size_t, libc::MADV_DONTNEED);
            mprotect(new_top as *mut c_void, (top - new_top) as size_t, libc::PROT_NONE);
        }
    }
    BRK_TOP.store(new_top, Relaxed);
    BRK_CUR.store(new, Relaxed);
    Ok(cur)
}

#[no_mangle]
pub unsafe extern "C" fn brk(addr: *mut c_void) -> c_int {
    if !ready() {
        // SAFETY: the program's own brk, passed to the kernel.
        return if unsafe { libc::syscall(libc::SYS_brk, addr) } as u64 == addr as u64 {
            0
        } else {
            set_errno(libc::ENOMEM);
            -1
        };
    }
    // SAFETY: sbrk(0) only sets the emulated break up.
    unsafe { sbrk(0) };
    let cur = BRK_CUR.load(Relaxed) as i64;
    // SAFETY: moves the break to where the program asked.
    if unsafe { sbrk((addr as i64 - cur) as isize) } as usize == usize::MAX {
        -1
    } else {
        0
    }
}
