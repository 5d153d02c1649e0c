//! Runtime start: the state machine that sets the region up on first use, the environment the
//! shim read at start-up, and the library constructor.
use core::sync::atomic::{AtomicU32, Ordering::*};
use splitos_shim_abi::{DEFAULT_REGION_SIZE, ENV_ALLOW_NATIVE, ENV_REGION_SIZE, ENV_RUN_ID, ENV_SOCK, ENV_VNODE};

use crate::sys::{cstr, die, parse_u64, PAGE};
use crate::{exec, fork, trap, vm};

const UNINIT: u32 = 0;
const INITIALIZING: u32 = 1;
const READY: u32 = 2;
/// No pComponent named and SPLITOS_ALLOW_NATIVE=1: every call goes straight to the kernel.
const OFF: u32 = 3;

static STATE: AtomicU32 = AtomicU32::new(UNINIT);
/// `mi_option_arena_reserve` in mimalloc v3's option enum (the binding does not name it); KiB.
const MI_OPTION_ARENA_RESERVE: libmimalloc_sys::mi_option_t = 23;

/// What the shim read from the environment at start-up. A forked child must not call getenv:
/// a program may keep its environment in heap memory that the child has not mapped yet. A
/// new image (exec) gets the variables from here: the program may have changed or cleared its
/// environment, or overwritten the strings (a process title).
pub(crate) struct EnvCache {
    pub(crate) sock: [u8; 108],
    pub(crate) vnode: [u8; 64],
    pub(crate) run_id: u64,
    /// `NAME=value\0` of each SPLITOS_* variable that was set, back to back.
    carried: [u8; 1024],
    carried_len: usize,
    /// `LD_PRELOAD=` and this library's path as the dynamic loader loaded it.
    preload: [u8; 4096],
    preload_len: usize,
}

static mut ENV: EnvCache = EnvCache {
    sock: [0; 108],
    vnode: [0; 64],
    run_id: 0,
    carried: [0; 1024],
    carried_len: 0,
    preload: [0; 4096],
    preload_len: 0,
};

pub(crate) const PRELOAD: &[u8] = b"LD_PRELOAD=";
/// The variables the shim reads, which a new image needs as they were.
pub(crate) const CARRIED: [&core::ffi::CStr; 5] = [
    c"SPLITOS_PCOMP_SOCK",
    c"SPLITOS_VNODE",
    c"SPLITOS_RUN_ID",
    c"SPLITOS_REGION_SIZE",
    c"SPLITOS_ALLOW_NATIVE",
];

impl EnvCache {
    /// The carried variables, each a NUL-terminated `NAME=value`.
    pub(crate) fn carried(&self) -> impl Iterator<Item = &[u8]> {
        self.carried[..self.carried_len].split_inclusive(|b| *b == 0)
    }

    /// `LD_PRELOAD=/path/of/the/shim`, without a NUL.
    pub(crate) fn preload(&self) -> &[u8] {
        &self.preload[..self.preload_len]
    }

    fn carry(&mut self, name: &[u8], value: &[u8]) {
        let entry = [name, b"=", value, b"\0"];
        let len: usize = entry.iter().map(|p| p.len()).sum();
        if self.carried_len + len > self.carried.len() {
            die(&[
                b"the value of ",
                name,
                b" is too long to hand to programs this one starts",
            ]);
        }
        for p in entry {
            self.carried[self.carried_len..self.carried_len + p.len()].copy_from_slice(p);
            self.carried_len += p.len();
        }
    }
}

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

/// Reads the environment into ENV and sets the region up; false if the program may run
/// natively. Without a pComponent and without that permission the program is stopped: it
/// would otherwise run with its memory silently local.
///
/// # Safety
/// Called once, before any reader of ENV can run (see `ready`).
unsafe fn init() -> bool {
    // SAFETY: getenv with a NUL-terminated name; its results are environment strings, which
    // are never freed, and are copied into ENV before this returns.
    let getenv = |name: &core::ffi::CStr| unsafe { cstr(libc::getenv(name.as_ptr())) };
    // SAFETY: by this function's contract nothing else reads or writes ENV now.
    let e = unsafe { &mut *core::ptr::addr_of_mut!(ENV) };
    for name in CARRIED {
        // SAFETY: getenv with a NUL-terminated name, as above.
        let value = unsafe { libc::getenv(name.as_ptr()) };
        if !value.is_null() {
            // SAFETY: an environment string, copied before this returns.
            e.carry(name.to_bytes(), unsafe { cstr(value) });
        }
    }
    let mut info: libc::Dl_info = libc::Dl_info {
        dli_fname: core::ptr::null(),
        dli_fbase: core::ptr::null_mut(),
        dli_sname: core::ptr::null(),
        dli_saddr: core::ptr::null_mut(),
    };
    // SAFETY: dladdr only fills `info`; dli_fname then names this library's link map entry,
    // which lives as long as the library, and is copied here.
    let path = unsafe {
        libc::dladdr(constructor as *const core::ffi::c_void, &mut info);
        cstr(info.dli_fname)
    };
    if path.is_empty() || PRELOAD.len() + path.len() > e.preload.len() {
        die(&[b"cannot tell where the shim was loaded from, so programs this one starts could not load it"]);
    }
    e.preload[..PRELOAD.len()].copy_from_slice(PRELOAD);
    e.preload[PRELOAD.len()..PRELOAD.len() + path.len()].copy_from_slice(path);
    e.preload_len = PRELOAD.len() + path.len();

    let sock = getenv(c"SPLITOS_PCOMP_SOCK");
    debug_assert_eq!(ENV_SOCK, "SPLITOS_PCOMP_SOCK");
    if sock.is_empty() {
        debug_assert_eq!(ENV_ALLOW_NATIVE, "SPLITOS_ALLOW_NATIVE");
        if getenv(c"SPLITOS_ALLOW_NATIVE") == b"1" {
            return false;
        }
        die(&[
            b"no pComponent is named (SPLITOS_PCOMP_SOCK is not set), so this program's memory would not be \
               disaggregated. Start it with `splitos run`, or set SPLITOS_ALLOW_NATIVE=1 to run it natively.",
        ]);
    }
    let size = parse_u64(getenv(c"SPLITOS_REGION_SIZE")).unwrap_or(DEFAULT_REGION_SIZE);
    debug_assert_eq!(ENV_REGION_SIZE, "SPLITOS_REGION_SIZE");
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
    // Before the shim's first socket call: the filter of the image that exec'd this one,
    // if any, already traps the calls not made from the gate.
    trap::install();
    // SAFETY: first set-up of this process's region: nothing lives in its range yet.
    unsafe { vm::setup_region(0) };
    true
}

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;

/// Sets the region up before main (unless a library's constructor used it already), so that
/// the program's first allocation finds it, and registers the fork child handler (unless a
/// library's constructor registered handlers already, and so it).
extern "C" fn constructor() {
    fork::REAL_FORK.resolve();
    for f in exec::REAL {
        f.resolve();
    }
    fork::register_child_handler();
    ready();
}
