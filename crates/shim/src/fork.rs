//! fork without exec: the pComponent writes back the parent's dirty lines and the home
//! mComponent copies the whole address space for the child, which then maps a fresh region
//! and fetches from that copy.
use core::ffi::c_int;
use core::sync::atomic::{AtomicU64, Ordering::*};
use libc::pid_t;
use splitos_shim_abi::{Op, ShimReq};

use crate::conn::{self, request_locked, SOCK};
use crate::start::{is_ready, ready};
use crate::sys::{die, errno, set_errno, NextFn};
use crate::vm::{setup_region, MEMFD, UFFD};

/// Set by our fork() for the child's handler: the process id the pComponent made for the child.
static FORK_TOKEN: AtomicU64 = AtomicU64::new(0);
pub(crate) static REAL_FORK: NextFn = NextFn::new(c"fork");

type ForkFn = unsafe extern "C" fn() -> pid_t;

#[no_mangle]
pub extern "C" fn fork() -> pid_t {
    // SAFETY: the C library's fork has this type.
    let real = unsafe { REAL_FORK.get::<ForkFn>() };
    if !ready() {
        // SAFETY: the C library's fork, called as the program asked.
        return unsafe { real() };
    }
    conn::lock();
    let r = request_locked(&ShimReq { op: Op::ForkPrepare as u32, ..Default::default() });
    if r.ret < 0 {
        conn::unlock();
        set_errno((-r.ret) as c_int);
        return -1;
    }
    FORK_TOKEN.store(r.val, Release);
    // SAFETY: the C library's fork. The request lock is held across it, so the child's copy of
    // the lock is taken too and no half-sent request is duplicated; both sides release it.
    let pid = unsafe { real() };
    if pid == 0 {
        if FORK_TOKEN.load(Acquire) != 0 {
            child_after_fork();
        }
        conn::unlock();
        return 0;
    }
    FORK_TOKEN.store(0, Release);
    if pid < 0 {
        let e = errno();
        request_locked(&ShimReq { op: Op::ForkAbort as u32, a: r.val, ..Default::default() });
        set_errno(e);
    }
    conn::unlock();
    pid
}

/// Runs first among the child's fork handlers (registered at the shim's first use), so that
/// handlers of other libraries already find a heap.
pub(crate) extern "C" fn child_after_fork() {
    let token = FORK_TOKEN.swap(0, AcqRel);
    if token == 0 {
        if is_ready() {
            // A fork that did not go through us: the child has no heap to run on.
            die(&[b"this program forked through a path the shim does not cover; the child has no heap"]);
        }
        return;
    }
    for fd in [SOCK.load(Relaxed), UFFD.load(Relaxed), MEMFD.load(Relaxed)] {
        // SAFETY: the parent's shim descriptors, inherited; nothing in the child uses them.
        unsafe { libc::close(fd) };
    }
    // SAFETY: MADV_DONTFORK left the child nothing at the region's address, so mapping a fresh
    // region there replaces no memory in use.
    unsafe { setup_region(token) };
}
