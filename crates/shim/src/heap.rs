//! The malloc family, all of it mimalloc, so that no allocation escapes into glibc's
//! non-interposable internal brk/mmap. Where glibc and mimalloc differ in what a program can
//! observe (errno on failure, realloc to zero bytes, the alignments each function accepts),
//! these behave as glibc does.
//!
//! Every function here has the contract of the C function it replaces; mimalloc checks
//! nothing more than glibc would, so a pointer the program passes must come from this family.
use core::ffi::c_void;
use core::sync::atomic::{AtomicU8, Ordering::Relaxed};
use libc::size_t;
use libmimalloc_sys as mi;

use crate::sys::{cstr, errno, parse_u64, set_errno};

/// glibc's malloc gives this alignment to every block (mimalloc only to blocks of 16 bytes or
/// more), and memalign never less.
const MALLOC_ALIGNMENT: size_t = 16;
const PAGE: size_t = 4096;

/// A failed allocation sets ENOMEM, as glibc's does (mimalloc leaves errno alone when it
/// refuses a size or an alignment itself).
fn or_enomem(p: *mut c_void) -> *mut c_void {
    if p.is_null() {
        set_errno(libc::ENOMEM);
    }
    p
}

#[no_mangle]
pub extern "C" fn malloc(n: size_t) -> *mut c_void {
    // SAFETY: allocation takes no pointer; mimalloc is initialized on first use.
    or_enomem(unsafe { mi::mi_malloc(n) })
}

#[no_mangle]
pub extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: as malloc; mimalloc checks the product for overflow.
    or_enomem(unsafe { mi::mi_calloc(n, size) })
}

/// glibc frees the block and returns NULL for a size of zero; mimalloc would return a block.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, n: size_t) -> *mut c_void {
    if n == 0 && !p.is_null() {
        // SAFETY: `p` is from this family (realloc's contract).
        unsafe { free(p) };
        return core::ptr::null_mut();
    }
    // SAFETY: `p` is NULL or from this family (realloc's contract).
    or_enomem(unsafe { mi::mi_realloc(p, n) })
}

#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: `p` is NULL or from this family (reallocarray's contract).
        Some(total) => unsafe { realloc(p, total) },
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

/// The host's memory and swap, asked once (0 until then; `u64::MAX` if it cannot be known):
/// not a system call per aligned allocation.
fn host_memory() -> u64 {
    static HOST: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
    let known = HOST.load(core::sync::atomic::Ordering::Relaxed);
    if known != 0 {
        return known;
    }
    // SAFETY: sysinfo fills the struct it is given; all zeros is a valid value of it.
    let mut si: libc::sysinfo = unsafe { core::mem::zeroed() };
    // SAFETY: a valid pointer to that struct.
    let host = if unsafe { libc::sysinfo(&mut si) } == 0 {
        (si.totalram as u64 + si.totalswap as u64).saturating_mul(si.mem_unit as u64)
    } else {
        u64::MAX
    };
    HOST.store(host, core::sync::atomic::Ordering::Relaxed);
    host
}

/// A power-of-two alignment above what malloc gives anyway. glibc maps size plus alignment
/// for it, which Linux's heuristic overcommit refuses beyond the host's memory and swap; the
/// same request is refused here, although the heap region could place it, so that a program
/// sees what it sees natively.
fn alloc_aligned(n: size_t, align: size_t) -> *mut c_void {
    debug_assert!(align.is_power_of_two());
    if (n as u64).saturating_add(align as u64) > host_memory() {
        return or_enomem(core::ptr::null_mut());
    }
    // SAFETY: the alignment is a power of two, as mimalloc requires.
    or_enomem(unsafe { mi::mi_malloc_aligned(n, align) })
}

#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: size_t, n: size_t) -> libc::c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(core::mem::size_of::<usize>()) {
        return libc::EINVAL;
    }
    let p = alloc_aligned(n, align);
    if p.is_null() {
        return libc::ENOMEM;
    }
    // SAFETY: `out` points to a writable pointer (posix_memalign's contract).
    unsafe { *out = p };
    0
}

/// glibc's memalign: at least malloc's alignment; one that cannot be a power of two is
/// EINVAL, any other is rounded up to a power of two.
#[no_mangle]
pub extern "C" fn memalign(align: size_t, n: size_t) -> *mut c_void {
    match align.max(MALLOC_ALIGNMENT).checked_next_power_of_two() {
        Some(a) => alloc_aligned(n, a),
        None => {
            set_errno(libc::EINVAL);
            core::ptr::null_mut()
        }
    }
}

/// glibc before 2.38 made aligned_alloc an alias of memalign; 2.38 refuses an alignment that
/// is not a power of two (C17). Programs see the behaviour of the C library they run with.
fn aligned_alloc_refuses_odd_alignments() -> bool {
    static STRICT: AtomicU8 = AtomicU8::new(0);
    match STRICT.load(Relaxed) {
        1 => false,
        2 => true,
        _ => {
            // SAFETY: gnu_get_libc_version returns a static NUL-terminated string.
            let v = unsafe { cstr(libc::gnu_get_libc_version()) };
            let mut parts = v.split(|b| *b == b'.').map(parse_u64);
            let strict = matches!((parts.next(), parts.next()), (Some(Some(major)), Some(Some(minor))) if (major, minor) >= (2, 38));
            STRICT.store(if strict { 2 } else { 1 }, Relaxed);
            strict
        }
    }
}

#[no_mangle]
pub extern "C" fn aligned_alloc(align: size_t, n: size_t) -> *mut c_void {
    // glibc counts 0 as a power of two here (and serves it as malloc).
    if align & align.wrapping_sub(1) != 0 && aligned_alloc_refuses_odd_alignments() {
        set_errno(libc::EINVAL);
        return core::ptr::null_mut();
    }
    memalign(align, n)
}

#[no_mangle]
pub extern "C" fn valloc(n: size_t) -> *mut c_void {
    memalign(PAGE, n)
}

#[no_mangle]
pub extern "C" fn pvalloc(n: size_t) -> *mut c_void {
    match n.checked_add(PAGE - 1) {
        Some(up) => memalign(PAGE, up & !(PAGE - 1)),
        None => {
            set_errno(libc::ENOMEM);
            core::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub extern "C" fn malloc_trim(_pad: size_t) -> libc::c_int {
    0
}
