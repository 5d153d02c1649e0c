//! fork without exec: the pComponent writes back the parent's dirty lines and the home
//! mComponent copies the whole address space for the child, which then maps a fresh region
//! and fetches from that copy.
use core::ffi::{c_int, c_void};
use core::sync::atomic::{AtomicU64, AtomicU8, Ordering::*};
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

/// The C library's registration of fork handlers, which `pthread_atfork` (linked into each
/// program and library from libc_nonshared) calls.
static REAL_REGISTER_ATFORK: NextFn = NextFn::new(c"__register_atfork");
type Handler = Option<unsafe extern "C" fn()>;
type RegisterAtforkFn = unsafe extern "C" fn(Handler, Handler, Handler, *mut c_void) -> c_int;

const UNREGISTERED: u8 = 0;
const REGISTERING: u8 = 1;
const REGISTERED: u8 = 2;
static OWN_HANDLER: AtomicU8 = AtomicU8::new(UNREGISTERED);

/// Registers [`child_after_fork`] unless it is registered already. The C library runs child
/// handlers in the order they were registered, and this one sets the child's heap up, so it
/// must come before those of any library that keeps state on the heap (jemalloc resets its
/// locks there): every registration goes through [`__register_atfork`], which calls this first;
/// the constructor calls it for programs whose libraries register nothing.
pub(crate) fn register_child_handler() {
    loop {
        match OWN_HANDLER.compare_exchange(UNREGISTERED, REGISTERING, AcqRel, Acquire) {
            Ok(_) => break,
            Err(REGISTERED) => return,
            // SAFETY: sched_yield takes no arguments and touches no memory of ours.
            Err(_) => unsafe {
                libc::sched_yield();
            },
        }
    }
    // SAFETY: the C library's function of this name and type; the handler stays valid (this
    // library is preloaded, never unloaded), so it is registered with no object to unload it with.
    if unsafe {
        REAL_REGISTER_ATFORK.get::<RegisterAtforkFn>()(None, None, Some(child_after_fork), core::ptr::null_mut())
    } != 0
    {
        die(&[b"cannot register the fork handler that gives a forked child its heap"]);
    }
    OWN_HANDLER.store(REGISTERED, Release);
}

/// Every `pthread_atfork` of the program and its libraries, also in constructors that run
/// before this library's: the shim's own child handler is registered first.
#[no_mangle]
pub unsafe extern "C" fn __register_atfork(
    prepare: Handler,
    parent: Handler,
    child: Handler,
    dso: *mut c_void,
) -> c_int {
    register_child_handler();
    // SAFETY: the C library's function of this name and type, with the caller's arguments.
    unsafe { REAL_REGISTER_ATFORK.get::<RegisterAtforkFn>()(prepare, parent, child, dso) }
}

#[no_mangle]
pub extern "C" fn fork() -> pid_t {
    // SAFETY: the C library's fork has this type.
    let real = unsafe { REAL_FORK.get::<ForkFn>() };
    if !ready() {
        // SAFETY: the C library's fork, called as the program asked.
        return unsafe { real() };
    }
    conn::lock();
    let r = request_locked(&ShimReq {
        op: Op::ForkPrepare as u32,
        ..Default::default()
    });
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
        request_locked(&ShimReq {
            op: Op::ForkAbort as u32,
            a: r.val,
            b: e as u64,
            ..Default::default()
        });
        set_errno(e);
    }
    conn::unlock();
    pid
}

/// Runs first among the child's fork handlers (see [`register_child_handler`]), so that
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
