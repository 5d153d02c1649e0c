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
    // SAFETY: written once in init(), before STATE becomes READY; read-only afterwards.
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
                    let ok = unsafe { init() };
                    STATE.store(if ok { READY } else { OFF }, Release);
                    return ok;
                }
            }
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

unsafe fn init() -> bool {
    let path = libc::getenv(c"SPLITOS_PCOMP_SOCK".as_ptr());
    debug_assert_eq!(ENV_SOCK, "SPLITOS_PCOMP_SOCK");
    if path.is_null() || *path == 0 {
        return false;
    }
    let size = parse_u64(cstr(libc::getenv(c"SPLITOS_REGION_SIZE".as_ptr()))).unwrap_or(DEFAULT_REGION_SIZE);
    debug_assert_eq!(ENV_REGION_SIZE, "SPLITOS_REGION_SIZE");
    let e = &mut *core::ptr::addr_of_mut!(ENV);
    let sock = cstr(path);
    if sock.len() >= e.sock.len() {
        die(&[b"the pComponent socket path is too long: ", sock]);
    }
    e.sock[..sock.len()].copy_from_slice(sock);
    let vnode = cstr(libc::getenv(c"SPLITOS_VNODE".as_ptr()));
    let vnode: &[u8] = if vnode.is_empty() { b"default" } else { vnode };
    let n = vnode.len().min(e.vnode.len() - 1);
    e.vnode[..n].copy_from_slice(&vnode[..n]);
    e.run_id = parse_u64(cstr(libc::getenv(c"SPLITOS_RUN_ID".as_ptr()))).unwrap_or(0);
    debug_assert_eq!((ENV_RUN_ID, ENV_VNODE), ("SPLITOS_RUN_ID", "SPLITOS_VNODE"));
    vm::REGION_SIZE.store(size & !(PAGE - 1), Relaxed);
    // mimalloc's default reserve would commit a GiB of an mComponent per process.
    libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_RESERVE, 64 * 1024);
    vm::setup_region(0);
    true
}

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: unsafe extern "C" fn() = constructor;

unsafe extern "C" fn constructor() {
    fork::real_fork();
    libc::pthread_atfork(None, None, Some(fork::child_after_fork));
    ready();
}
