//! The malloc family, all of it mimalloc, so that no allocation escapes into glibc's
//! non-interposable internal brk/mmap.
//!
//! Every function here has the contract of the C function it replaces; mimalloc checks
//! nothing more than glibc would, so a pointer the program passes must come from this family.
use core::ffi::c_void;
use libc::size_t;
use libmimalloc_sys as mi;

use crate::sys::{errno, set_errno};

#[no_mangle]
pub extern "C" fn malloc(n: size_t) -> *mut c_void {
    // SAFETY: allocation takes no pointer; mimalloc is initialized on first use.
    unsafe { mi::mi_malloc(n) }
}

#[no_mangle]
pub extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: as malloc; mimalloc checks the product for overflow.
    unsafe { mi::mi_calloc(n, size) }
}

#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, n: size_t) -> *mut c_void {
    // SAFETY: `p` is NULL or from this family (realloc's contract).
    unsafe { mi::mi_realloc(p, n) }
}

#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: `p` is NULL or from this family (reallocarray's contract).
        Some(total) => unsafe { mi::mi_realloc(p, total) },
        None => {
            set_errno(libc::ENOMEM);
            core::ptr::null_mut()
        }
    }
}

/// free() must not change errno: programs check errno after a failing call and free first.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    let e = errno();
    // SAFETY: `p` is NULL or from this family and not yet freed (free's contract).
    unsafe { mi::mi_free(p) };
    set_errno(e);
}

#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    // SAFETY: the same contract as free.
    unsafe { free(p) }
}

#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if p.is_null() {
        0
    } else {
        // SAFETY: a live block of this family (malloc_usable_size's contract).
        unsafe { mi::mi_usable_size(p) }
    }
}

fn valid_alignment(a: size_t) -> bool {
    a.is_power_of_two() && a.is_multiple_of(core::mem::size_of::<usize>())
}

#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: size_t, n: size_t) -> libc::c_int {
    if !valid_alignment(align) {
        return libc::EINVAL;
    }
    // SAFETY: the alignment is a power of two, as mimalloc requires.
    let p = unsafe { mi::mi_malloc_aligned(n, align) };
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: `out` points to a writable pointer (posix_memalign's contract).
    unsafe { *out = p };
    0
}

#[no_mangle]
pub extern "C" fn aligned_alloc(align: size_t, n: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    // SAFETY: the alignment is a power of two, as mimalloc requires.
    unsafe { mi::mi_malloc_aligned(n, align) }
}

#[no_mangle]
pub extern "C" fn memalign(align: size_t, n: size_t) -> *mut c_void {
    aligned_alloc(align.next_power_of_two(), n)
}

#[no_mangle]
pub extern "C" fn valloc(n: size_t) -> *mut c_void {
    // SAFETY: a page is a power-of-two alignment.
    unsafe { mi::mi_malloc_aligned(n, 4096) }
}

#[no_mangle]
pub extern "C" fn pvalloc(n: size_t) -> *mut c_void {
    // SAFETY: a page is a power-of-two alignment.
    unsafe { mi::mi_malloc_aligned((n + 4095) & !4095, 4096) }
}

#[no_mangle]
pub extern "C" fn malloc_trim(_pad: size_t) -> libc::c_int {
    0
}
