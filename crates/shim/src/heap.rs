//! The malloc family, all of it mimalloc, so that no allocation escapes into glibc's
//! non-interposable internal brk/mmap.
use core::ffi::c_void;
use libc::size_t;
use libmimalloc_sys as mi;

#[no_mangle]
pub unsafe extern "C" fn malloc(n: size_t) -> *mut c_void {
    mi::mi_malloc(n)
}

#[no_mangle]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    mi::mi_calloc(n, size)
}

#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, n: size_t) -> *mut c_void {
    mi::mi_realloc(p, n)
}

#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    match n.checked_mul(size) {
        Some(total) => mi::mi_realloc(p, total),
        None => {
            *libc::__errno_location() = libc::ENOMEM;
            core::ptr::null_mut()
        }
    }
}

/// free() must not change errno: programs check errno after a failing call and free first.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    let e = *libc::__errno_location();
    mi::mi_free(p);
    *libc::__errno_location() = e;
}

#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    free(p)
}

#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if p.is_null() {
        0
    } else {
        mi::mi_usable_size(p)
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
    let p = mi::mi_malloc_aligned(n, align);
    if p.is_null() {
        return libc::ENOMEM;
    }
    *out = p;
    0
}

#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, n: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        *libc::__errno_location() = libc::EINVAL;
        return core::ptr::null_mut();
    }
    mi::mi_malloc_aligned(n, align)
}

#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, n: size_t) -> *mut c_void {
    aligned_alloc(align.next_power_of_two(), n)
}

#[no_mangle]
pub unsafe extern "C" fn valloc(n: size_t) -> *mut c_void {
    mi::mi_malloc_aligned(n, 4096)
}

#[no_mangle]
pub unsafe extern "C" fn pvalloc(n: size_t) -> *mut c_void {
    mi::mi_malloc_aligned((n + 4095) & !4095, 4096)
}

#[no_mangle]
pub extern "C" fn malloc_trim(_pad: size_t) -> libc::c_int {
    0
}
