//! Runtime start: the state machine that sets the region up on first use, the environment the
//! shim read at start-up, and the library constructor.
use core::sync::atomic::{AtomicU32, Ordering::*};
use splitos_shim_abi::{DEFAULT_REGION_SIZE, ENV_REGION_SIZE, ENV_RUN_ID, ENV_SOCK, ENV_VNODE};

use crate::sys::{cstr, die, parse_u64, PAGE};
use crate::{fork, vm};

const UNINIT: u32 = 0;
const INITIALIZING: u32 = 1;
const READY: u32 = 2;
/// No pComponent named in the environment: every call goes straight to the kernel.
const OFF: u32 = 3;

static STATE: AtomicU32 = AtomicU32::new(UNINIT);
/// `mi_option_arena_reserve` in mimalloc v3's option enum (the binding does not name it); KiB.
const MI_OPTION_ARENA_RESERVE: libmimalloc_sys::mi_option_t = 23;

/// What the shim read from the environment at start-up. A forked child must not call getenv:
/// a program may keep its environment in heap memory that the child has not mapped yet.
pub(crate) struct EnvCache {
    pub(crate) sock: [u8; 108],
    pub(crate) vnode: [u8; 64],
    pub(crate) run_id: u64,
}

static mut ENV: EnvCache = EnvCache { sock: [0; 108], vnode: [0; 64], run_id: 0 };

pub(crate) fn env() -> &'static EnvCache {
    // SAFETY: init() writes ENV once and finishes before anything calls env(): the hello it
    // sends afterwards runs in the same thread, every other caller after STATE is READY.
    unsafe { &*core::ptr::addr_of!(ENV) }
}

/// True once the region is set up and requests can be served; sets it up on first use.
pub(crate) fn ready() -> bool {
    loop {
        match STATE.load(Acquire) {
            READY => return true,
            OFF => return false,
            UNINIT => {
                if STATE.compare_exchange(UNINIT, INITIALIZING, AcqRel, Acquire).is_ok() {
                    // SAFETY: this thread alone moved STATE out of UNINIT, so init() runs once
                    // and nobody reads ENV before STATE leaves INITIALIZING.
                    let ok = unsafe { init() };
                    STATE.store(if ok { READY } else { OFF }, Release);
                    return ok;
                }
            }
            // SAFETY: sched_yield takes no arguments and touches no memory of ours.
            _ => unsafe {
                libc::sched_yield();
            },
        }
    }
}

/// True once the region is set up; unlike [`ready`], never sets it up.
pub(crate) fn is_ready() -> bool {
    STATE.load(Acquire) == READY
}

/// Reads the environment into ENV and sets the region up; false if no pComponent is named.
///
/// # Safety
/// Called once, before any reader of ENV can run (see `ready`).
unsafe fn init() -> bool {
    // SAFETY: getenv with a NUL-terminated name; its results are environment strings, which
    // are never freed, and are copied into ENV before this returns.
    let getenv = |name: &core::ffi::CStr| unsafe { cstr(libc::getenv(name.as_ptr())) };
    let sock = getenv(c"SPLITOS_PCOMP_SOCK");
    debug_assert_eq!(ENV_SOCK, "SPLITOS_PCOMP_SOCK");
    if sock.is_empty() {
        return false;
    }
    let size = parse_u64(getenv(c"SPLITOS_REGION_SIZE")).unwrap_or(DEFAULT_REGION_SIZE);
    debug_assert_eq!(ENV_REGION_SIZE, "SPLITOS_REGION_SIZE");
    // SAFETY: by this function's contract nothing else reads or writes ENV now.
    let e = unsafe { &mut *core::ptr::addr_of_mut!(ENV) };
    if sock.len() >= e.sock.len() {
        die(&[b"the pComponent socket path is too long: ", sock]);
    }
    e.sock[..sock.len()].copy_from_slice(sock);
    let vnode = getenv(c"SPLITOS_VNODE");
    let vnode: &[u8] = if vnode.is_empty() { b"default" } else { vnode };
    let n = vnode.len().min(e.vnode.len() - 1);
    e.vnode[..n].copy_from_slice(&vnode[..n]);
    e.run_id = parse_u64(getenv(c"SPLITOS_RUN_ID")).unwrap_or(0);
    debug_assert_eq!((ENV_RUN_ID, ENV_VNODE), ("SPLITOS_RUN_ID", "SPLITOS_VNODE"));
    vm::REGION_SIZE.store(size & !(PAGE - 1), Relaxed);
    // SAFETY: a plain setter; mimalloc reads the option when it next reserves an arena. Its
    // default reserve would commit a GiB of an mComponent per process.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_RESERVE, 64 * 1024) };
    // SAFETY: first set-up of this process's region: nothing lives in its range yet.
    unsafe { vm::setup_region(0) };
    true
}

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;

/// Sets the region up before main, so that the program's first allocation finds it, and
/// registers the fork child handler first, so that other libraries' handlers find a heap.
extern "C" fn constructor() {
    fork::real_fork();
    // SAFETY: registers a handler that stays valid (this library is never unloaded: it is
    // preloaded); no other arguments.
    unsafe { libc::pthread_atfork(None, None, Some(fork::child_after_fork)) };
    ready();
}
