//! The socket system-call trap: a vNode's network isolation must not depend on the program
//! calling libc. A seccomp filter makes the socket calls a program issues itself (Go, static
//! code, `syscall(2)`, libc's own internal calls) raise SIGSYS instead of reaching the host's
//! stack; the handler serves each through the same code as the interposed libc entry point
//! (`net`), so a raw `socket(AF_INET, ...)` gets the stub's socket and a raw `connect` on it
//! goes where the stub says.
//!
//! The shim's own system calls of those numbers pass the filter because they are issued from
//! one instruction at a fixed address, [`GATE`], which the filter allows: a page every image
//! of the process maps with the same code at the same place, so that the filter, which stays
//! for the life of the process and across exec, keeps letting the next image's shim through.
// Elsewhere than on x86-64 there is no gate and no filter (yet): the shim calls libc.
#![cfg_attr(not(target_arch = "x86_64"), allow(dead_code, unused_imports))]
use core::ffi::{c_int, c_long, c_void};
use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use libc::{sock_filter, socklen_t};

use crate::sys::{die, errno, raw_mmap, raw_mprotect, set_errno};

/// Where every image of a process maps the gate: below the heap region, at the same address
/// in every image so that one filter fits them all.
const GATE: u64 = splitos_shim_abi::REGION_BASE - 0x10000;

// The gate's code: `gate(nr, a, b, c, d, e, f)` with the C calling convention, the system
// call's six arguments in its registers. It uses no address of its own, so a copy runs
// anywhere; before the copy is mapped (or where there is no filter) the shim calls it here.
#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".pushsection .text.splitos_gate,\"ax\",@progbits",
    ".globl splitos_gate_code",
    ".hidden splitos_gate_code",
    "splitos_gate_code:",
    "mov rax, rdi",
    "mov rdi, rsi",
    "mov rsi, rdx",
    "mov rdx, rcx",
    "mov r10, r8",
    "mov r8, r9",
    "mov r9, [rsp + 8]",
    "syscall",
    ".globl splitos_gate_after",
    ".hidden splitos_gate_after",
    "splitos_gate_after:",
    "ret",
    ".globl splitos_gate_end",
    ".hidden splitos_gate_end",
    "splitos_gate_end:",
    ".popsection",
);

#[cfg(target_arch = "x86_64")]
extern "C" {
    fn splitos_gate_code(nr: c_long, a: usize, b: usize, c: usize, d: usize, e: usize, f: usize) -> c_long;
    static splitos_gate_after: u8;
    static splitos_gate_end: u8;
}

type GateFn = unsafe extern "C" fn(c_long, usize, usize, usize, usize, usize, usize) -> c_long;

/// The gate the shim calls: the library's own copy until [`install`] maps the fixed one.
static GATE_FN: AtomicUsize = AtomicUsize::new(0);

/// A system call through the gate, as syscall(2) returns it: -1 with errno set on failure.
///
/// # Safety
/// As the system call: its pointer arguments are valid for what it does with them.
pub(crate) unsafe fn syscall(nr: c_long, args: &[usize]) -> c_long {
    let mut a = [0usize; 6];
    a[..args.len()].copy_from_slice(args);
    // SAFETY: the caller's contract.
    let r = unsafe { raw(nr, a) };
    if (-4095..0).contains(&r) {
        set_errno(-r as c_int);
        -1
    } else {
        r
    }
}

/// # Safety
/// As [`syscall`].
#[cfg(target_arch = "x86_64")]
unsafe fn raw(nr: c_long, a: [usize; 6]) -> c_long {
    let mut f = GATE_FN.load(Relaxed);
    if f == 0 {
        f = splitos_gate_code as *const () as usize;
    }
    // SAFETY: `f` is the gate's code (the library's, or the fixed copy of it, which is never
    // unmapped); what the system call does with its arguments is the caller's contract.
    unsafe { core::mem::transmute::<usize, GateFn>(f)(nr, a[0], a[1], a[2], a[3], a[4], a[5]) }
}

/// # Safety
/// As [`syscall`].
#[cfg(not(target_arch = "x86_64"))]
unsafe fn raw(nr: c_long, a: [usize; 6]) -> c_long {
    // SAFETY: as above.
    let r = unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
    if r == -1 {
        -(errno() as c_long)
    } else {
        r
    }
}

/// syscall(2) through the gate, with its arguments cast as the C call would pass them.
macro_rules! sys {
    ($nr:expr $(, $a:expr)* $(,)?) => {
        $crate::trap::syscall($nr, &[$($a as usize),*])
    };
}
pub(crate) use sys;

const SECCOMP_DATA_NR: u32 = 0;
const SECCOMP_DATA_ARCH: u32 = 4;
const SECCOMP_DATA_IP: u32 = 8;
const fn arg(i: u32) -> u32 {
    16 + 8 * i
}
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const AUDIT_ARCH_I386: u32 = 0x4000_0003;
/// x32 system calls: the same calls under other numbers.
const X32_BIT: u32 = 0x4000_0000;
const I386_SOCKETCALL: u32 = 102;
const I386_SOCKET: u32 = 359;
const IO_URING_SETUP: u32 = 425;
/// Sent by the seccomp filter (siginfo's si_code).
const SYS_SECCOMP: c_int = 1;

/// The calls whose every raw use is trapped: they name addresses or options of a socket that
/// may be the stub's, whose descriptor is a Unix socket the kernel would serve wrongly.
const TRAPPED: [c_long; 13] = [
    libc::SYS_connect,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_getsockopt,
    libc::SYS_setsockopt,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
];

#[derive(Clone, Copy)]
enum To {
    Next,
    At(u8),
}

#[derive(Clone, Copy)]
enum Ins {
    Load(u32),
    /// If the loaded word equals `k`, go to the first place, else to the second.
    Eq(u32, To, To),
    /// If the loaded word is at least `k`.
    Ge(u32, To, To),
    Ret(u32),
    Label(u8),
}

const ALLOW: u8 = 0;
const TRAP: u8 = 1;
const ENOSYS: u8 = 2;
const EACCES: u8 = 3;
const I386: u8 = 4;
const CHECK_ADDR: u8 = 5;
const NOT_GATE: u8 = 6;
const MAX_INS: usize = 64;

/// The filter: on x86-64, the gate's calls pass; socket(2) of IPv4 and IPv6 and every call
/// of [`TRAPPED`] trap, as do sendto and recvfrom with an address (without one they are send
/// and recv, which need nothing from the stub); x32 calls and io_uring (which makes and
/// connects sockets without system calls) fail with ENOSYS. An i386 program (exec'd, without
/// the shim) cannot make IPv4 or IPv6 sockets.
fn program(gate_ip: u64) -> ([sock_filter; MAX_INS], usize) {
    use Ins::*;
    use To::*;
    let (lo, hi) = (gate_ip as u32, (gate_ip >> 32) as u32);
    let mut p = [Label(0); MAX_INS];
    let mut n = 0;
    let mut put = |i: Ins| {
        p[n] = i;
        n += 1;
    };
    put(Load(SECCOMP_DATA_ARCH));
    put(Eq(AUDIT_ARCH_X86_64, Next, At(I386)));
    put(Load(SECCOMP_DATA_NR));
    put(Ge(X32_BIT, At(ENOSYS), Next));
    put(Load(SECCOMP_DATA_IP));
    put(Eq(lo, Next, At(NOT_GATE)));
    put(Load(SECCOMP_DATA_IP + 4));
    put(Eq(hi, At(ALLOW), Next));
    put(Label(NOT_GATE));
    put(Load(SECCOMP_DATA_NR));
    for nr in TRAPPED {
        put(Eq(nr as u32, At(TRAP), Next));
    }
    put(Eq(libc::SYS_sendto as u32, At(CHECK_ADDR), Next));
    put(Eq(libc::SYS_recvfrom as u32, At(CHECK_ADDR), Next));
    put(Eq(IO_URING_SETUP, At(ENOSYS), Next));
    put(Eq(libc::SYS_socket as u32, Next, At(ALLOW)));
    put(Load(arg(0)));
    put(Eq(libc::AF_INET as u32, At(TRAP), Next));
    put(Eq(libc::AF_INET6 as u32, At(TRAP), At(ALLOW)));
    put(Label(CHECK_ADDR));
    put(Load(arg(4)));
    put(Eq(0, Next, At(TRAP)));
    put(Load(arg(4) + 4));
    put(Eq(0, At(ALLOW), At(TRAP)));
    put(Label(I386));
    put(Eq(AUDIT_ARCH_I386, Next, At(ALLOW)));
    put(Load(SECCOMP_DATA_NR));
    put(Eq(I386_SOCKETCALL, At(ENOSYS), Next));
    put(Eq(IO_URING_SETUP, At(ENOSYS), Next));
    put(Eq(I386_SOCKET, Next, At(ALLOW)));
    put(Load(arg(0)));
    put(Eq(libc::AF_INET as u32, At(EACCES), Next));
    put(Eq(libc::AF_INET6 as u32, At(EACCES), At(ALLOW)));
    put(Label(ALLOW));
    put(Ret(libc::SECCOMP_RET_ALLOW));
    put(Label(TRAP));
    put(Ret(libc::SECCOMP_RET_TRAP));
    put(Label(ENOSYS));
    put(Ret(libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32));
    put(Label(EACCES));
    put(Ret(libc::SECCOMP_RET_ERRNO | libc::EACCES as u32));
    assemble(&p[..n])
}

/// Classic BPF of `prog`, jumps resolved against its labels.
fn assemble(prog: &[Ins]) -> ([sock_filter; MAX_INS], usize) {
    let mut at = [0usize; 8];
    let mut pos = 0;
    for i in prog {
        match i {
            Ins::Label(l) => at[*l as usize] = pos,
            _ => pos += 1,
        }
    }
    let mut out = [sock_filter {
        code: 0,
        jt: 0,
        jf: 0,
        k: 0,
    }; MAX_INS];
    let mut pos = 0;
    let off = |to: To, pos: usize| match to {
        To::Next => 0,
        To::At(l) => (at[l as usize] - pos - 1) as u8,
    };
    for i in prog {
        let (code, k, jt, jf) = match *i {
            Ins::Label(_) => continue,
            Ins::Load(k) => (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, k, 0, 0),
            Ins::Eq(k, t, f) => (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, k, off(t, pos), off(f, pos)),
            Ins::Ge(k, t, f) => (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K, k, off(t, pos), off(f, pos)),
            Ins::Ret(k) => (libc::BPF_RET | libc::BPF_K, k, 0, 0),
        };
        out[pos] = sock_filter {
            code: code as u16,
            jt,
            jf,
            k,
        };
        pos += 1;
    }
    (out, pos)
}

/// Maps the gate, takes SIGSYS and installs the filter; once per image, before the shim's
/// first socket call (a filter of the image that exec'd this one may already trap it).
#[cfg(target_arch = "x86_64")]
pub(crate) fn install() {
    // The symbols delimit the gate's code in this library's text.
    let (code, after, end) = (
        splitos_gate_code as *const () as usize,
        core::ptr::addr_of!(splitos_gate_after) as usize,
        core::ptr::addr_of!(splitos_gate_end) as usize,
    );
    let len = end - code;
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
    // SAFETY: MAP_FIXED_NOREPLACE fails rather than replace anything mapped there.
    let page = unsafe { raw_mmap(GATE, 4096, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    if page as u64 != GATE {
        die(&[b"cannot map the page the shim makes its socket system calls from (the address is taken)"]);
    }
    // SAFETY: copies the gate's bytes into the fresh page, then makes it read-only code.
    unsafe {
        core::ptr::copy_nonoverlapping(code as *const u8, page as *mut u8, len);
        if raw_mprotect(GATE, 4096, libc::PROT_READ | libc::PROT_EXEC) != 0 {
            die(&[b"cannot make the shim's system call page executable"]);
        }
    }
    GATE_FN.store(GATE as usize, Relaxed);

    // SAFETY: sigaction is plain data, valid when zeroed; the handler stays valid (this
    // library is never unloaded).
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_sigsys as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGSYS, &sa, core::ptr::null_mut()) != 0 {
            die(&[b"cannot take SIGSYS, which serves the program's own socket system calls"]);
        }
    }

    let (ins, n) = program(GATE + (after - code) as u64);
    let prog = libc::sock_fprog {
        len: n as u16,
        filter: ins.as_ptr() as *mut sock_filter,
    };
    // SAFETY: seccomp(2) reads the program `prog` points to, which lives through the call.
    let set = || unsafe {
        sys!(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_TSYNC,
            &prog as *const libc::sock_fprog
        )
    };
    let mut r = set();
    // Without CAP_SYS_ADMIN a filter needs no_new_privs: set-user-ID programs this one starts
    // then gain no privilege.
    if r == -1 && errno() == libc::EACCES {
        // SAFETY: prctl(2) with no pointers.
        unsafe { sys!(libc::SYS_prctl, libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        r = set();
    }
    if r != 0 {
        die(&[b"cannot install the seccomp filter that keeps this program's sockets on its vNode's network"]);
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn install() {}

/// Serves a trapped socket call with the shim's entry point of the same call; its result goes
/// where the kernel's would (rax), errno as it was.
#[cfg(target_arch = "x86_64")]
extern "C" fn on_sigsys(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    // SAFETY: the kernel hands a SA_SIGINFO handler a siginfo and the interrupted context. For
    // a seccomp SIGSYS the siginfo's union holds the call's address (8 bytes), its number
    // (int) and its architecture (u32), from byte 16.
    let (code, nr, arch) = unsafe {
        let base = info as *const u8;
        (
            (*info).si_code,
            *(base.add(24) as *const c_int),
            *(base.add(28) as *const u32),
        )
    };
    if code != SYS_SECCOMP || arch != AUDIT_ARCH_X86_64 {
        // Somebody else's SIGSYS: what it would have done without us.
        // SAFETY: resets the disposition and re-sends the signal, delivered when we return.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
        return;
    }
    // SAFETY: `ctx` is the interrupted thread's ucontext, ours to read and change.
    let g = unsafe { &mut (*(ctx as *mut libc::ucontext_t)).uc_mcontext.gregs };
    let a = [
        libc::REG_RDI,
        libc::REG_RSI,
        libc::REG_RDX,
        libc::REG_R10,
        libc::REG_R8,
        libc::REG_R9,
    ]
    .map(|r| g[r as usize] as usize);
    let saved = errno();
    // SAFETY: the program's own call, with its arguments, to the shim's entry point of that
    // call, whose contract is the system call's.
    let r: c_long = unsafe {
        use crate::net;
        let i = |k: usize| a[k] as c_int;
        let p = |k: usize| a[k] as *mut c_void;
        match nr as c_long {
            libc::SYS_socket => net::socket(i(0), i(1), i(2)) as c_long,
            libc::SYS_connect => net::connect(i(0), p(1).cast(), a[2] as socklen_t) as c_long,
            libc::SYS_bind => net::bind(i(0), p(1).cast(), a[2] as socklen_t) as c_long,
            libc::SYS_listen => net::listen(i(0), i(1)) as c_long,
            libc::SYS_accept => net::accept4(i(0), p(1).cast(), p(2).cast(), 0) as c_long,
            libc::SYS_accept4 => net::accept4(i(0), p(1).cast(), p(2).cast(), i(3)) as c_long,
            libc::SYS_getsockname => net::getsockname(i(0), p(1).cast(), p(2).cast()) as c_long,
            libc::SYS_getpeername => net::getpeername(i(0), p(1).cast(), p(2).cast()) as c_long,
            libc::SYS_getsockopt => net::getsockopt(i(0), i(1), i(2), p(3), p(4).cast()) as c_long,
            libc::SYS_setsockopt => net::setsockopt(i(0), i(1), i(2), p(3), a[4] as socklen_t) as c_long,
            libc::SYS_sendto => net::sendto(i(0), p(1), a[2], i(3), p(4).cast(), a[5] as socklen_t) as c_long,
            libc::SYS_recvfrom => net::recvfrom(i(0), p(1), a[2], i(3), p(4).cast(), p(5).cast()) as c_long,
            libc::SYS_sendmsg => net::sendmsg(i(0), p(1).cast(), i(2)) as c_long,
            libc::SYS_recvmsg => net::recvmsg(i(0), p(1).cast(), i(2)) as c_long,
            libc::SYS_sendmmsg => net::sendmmsg(i(0), p(1).cast(), a[2] as libc::c_uint, i(3)) as c_long,
            libc::SYS_recvmmsg => net::recvmmsg(i(0), p(1).cast(), a[2] as libc::c_uint, i(3), p(4).cast()) as c_long,
            _ => {
                set_errno(libc::ENOSYS);
                -1
            }
        }
    };
    g[libc::REG_RAX as usize] = if r == -1 { -(errno() as i64) } else { r };
    set_errno(saved);
}
