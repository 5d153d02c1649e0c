//! exec and spawn: a new program image stays under splitos.
//!
//! The shim reaches a new image only through LD_PRELOAD and the SPLITOS_* variables, and a
//! program may start one with an environment that lacks them (`env -i`, an execve with a
//! cleaned envp, posix_spawn with its own envp, an environment it cleared). Every entry point
//! of the C library that starts an image is interposed here and hands the new image the
//! environment it was given plus LD_PRELOAD with this library and the variables the shim read
//! at start-up (from the environment cache: the program may have changed its own).
//!
//! These run in vfork children and in the children of multithreaded programs, where only
//! async-signal-safe work is allowed: the new environment is built without allocating, on the
//! stack, or in a private mapping of its own when it does not fit there.
use core::ffi::{c_char, c_int};
use libc::pid_t;

use crate::start::{env, ready, CARRIED, PRELOAD};
use crate::sys::{cstr, raw_mmap, set_errno, NextFn};

type Argv = *const *const c_char;

static REAL_EXECVPE: NextFn = NextFn::new(c"execvpe");
static REAL_FEXECVE: NextFn = NextFn::new(c"fexecve");
static REAL_POSIX_SPAWN: NextFn = NextFn::new(c"posix_spawn");
static REAL_POSIX_SPAWNP: NextFn = NextFn::new(c"posix_spawnp");
static REAL_SYSTEM: NextFn = NextFn::new(c"system");
static REAL_POPEN: NextFn = NextFn::new(c"popen");
pub(crate) static REAL: [&NextFn; 6] = [
    &REAL_EXECVPE,
    &REAL_FEXECVE,
    &REAL_POSIX_SPAWN,
    &REAL_POSIX_SPAWNP,
    &REAL_SYSTEM,
    &REAL_POPEN,
];

type ExecvpeFn = unsafe extern "C" fn(*const c_char, Argv, Argv) -> c_int;
type FexecveFn = unsafe extern "C" fn(c_int, Argv, Argv) -> c_int;
type SpawnFn = unsafe extern "C" fn(
    *mut pid_t,
    *const c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    Argv,
    Argv,
) -> c_int;
type SystemFn = unsafe extern "C" fn(*const c_char) -> c_int;
type PopenFn = unsafe extern "C" fn(*const c_char, *const c_char) -> *mut libc::FILE;

/// Words of stack for a new environment; larger ones get a private mapping.
const STACK_WORDS: usize = 1024;

/// `NAME=` of a `NAME=value` entry.
fn name_of(var: &[u8]) -> &[u8] {
    &var[..var.iter().position(|b| *b == b'=').map_or(0, |i| i + 1)]
}

fn names_shim(list: &[u8]) -> bool {
    let mine = &env().preload()[PRELOAD.len()..];
    list.split(|b| *b == b':' || *b == b' ').any(|p| p == mine)
}

/// What an environment holds of the shim's variables.
struct Scan<'a> {
    entries: usize,
    /// The value of the first LD_PRELOAD (the one getenv sees).
    first_preload: Option<&'a [u8]>,
    /// Every LD_PRELOAD (ld.so takes the last) names this library.
    preloads_name_shim: bool,
    /// Which carried variables it sets, whatever the value.
    has: [bool; CARRIED.len()],
    /// It names a pComponent other than ours: its SPLITOS_* variables are deliberate (a
    /// nested `splitos run`) and none of ours are added.
    other_pcomponent: bool,
}

/// # Safety
/// As [`with_shim_env`].
unsafe fn scan<'a>(envp: Argv) -> Scan<'a> {
    let e = env();
    let mut s = Scan {
        entries: 0,
        first_preload: None,
        preloads_name_shim: true,
        has: [false; CARRIED.len()],
        other_pcomponent: false,
    };
    // SAFETY: envp is NULL or NULL-terminated, its entries C strings (the contract).
    while !envp.is_null() && !unsafe { *envp.add(s.entries) }.is_null() {
        // SAFETY: as above.
        let v = unsafe { cstr(*envp.add(s.entries)) };
        s.entries += 1;
        if let Some(list) = v.strip_prefix(PRELOAD) {
            s.first_preload.get_or_insert(list);
            s.preloads_name_shim &= names_shim(list);
        } else if let Some((j, c)) = e.carried().enumerate().find(|(_, c)| v.starts_with(name_of(c))) {
            s.has[j] = true;
            s.other_pcomponent |= c.starts_with(b"SPLITOS_PCOMP_SOCK=") && v != &c[..c.len() - 1];
        }
    }
    s
}

impl Scan<'_> {
    fn missing(&self, j: usize) -> bool {
        !self.other_pcomponent && !self.has[j]
    }

    fn complete(&self) -> bool {
        self.first_preload.is_some()
            && self.preloads_name_shim
            && (0..env().carried().count()).all(|j| !self.missing(j))
    }
}

/// Calls `f` with `envp` completed for a new image: exactly one LD_PRELOAD, naming this
/// library (theirs if it already does, else ours put first in theirs), and each carried
/// SPLITOS_* variable it lacks, with the value the shim read at start-up. Variables it sets
/// itself are the program's choice and stay; an environment that needs nothing is passed as
/// it is. A program running natively (SPLITOS_ALLOW_NATIVE=1) hands on that permission the
/// same way. Fails with an errno only if a large environment finds no memory.
///
/// # Safety
/// `envp` is NULL or a NULL-terminated array of C strings, valid during the call.
unsafe fn with_shim_env<R>(envp: Argv, f: impl FnOnce(Argv) -> R) -> Result<R, c_int> {
    // The environment cache is filled whether or not the region runs.
    ready();
    // SAFETY: envp as this function's contract says.
    let s = unsafe { scan(envp) };
    if s.complete() {
        return Ok(f(envp));
    }
    let e = env();
    let (n, theirs) = (s.entries, s.first_preload);
    let keep_theirs = theirs.is_some_and(names_shim);

    // Their entries, LD_PRELOAD, the carried variables, NULL; then the LD_PRELOAD string.
    let ptrs = n + 1 + CARRIED.len() + 1;
    let words = ptrs + (e.preload().len() + 1 + theirs.map_or(0, |t| t.len()) + 1).div_ceil(8);
    let mut stack = [0usize; STACK_WORDS];
    let mapped = words > STACK_WORDS;
    let mem: &mut [usize] = if !mapped {
        &mut stack[..]
    } else {
        // SAFETY: a fresh private mapping at an address the kernel picks replaces nothing.
        // In a vfork child it stays in the parent if the exec succeeds; only an environment
        // of more than 8 KiB gets here.
        let p = unsafe {
            raw_mmap(
                0,
                (words * 8) as u64,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(libc::E2BIG);
        }
        // SAFETY: the mapping is `words` words long, writable, aligned, and only ours.
        unsafe { core::slice::from_raw_parts_mut(p as *mut usize, words) }
    };
    let (out, text) = mem.split_at_mut(ptrs);
    // SAFETY: the words after the pointers, viewed as the bytes they are.
    let text = unsafe { core::slice::from_raw_parts_mut(text.as_mut_ptr() as *mut u8, text.len() * 8) };
    let mut at = 0;
    let parts: [&[u8]; 3] = match theirs {
        Some(t) if !t.is_empty() => [e.preload(), b":", t],
        _ => [e.preload(), b"", b""],
    };
    for p in parts.into_iter().chain([&b"\0"[..]]) {
        text[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    let preload = text.as_ptr() as usize;

    let mut k = 0;
    let mut push = |p: usize| {
        out[k] = p;
        k += 1;
    };
    let mut preload_done = false;
    for i in 0..n {
        // SAFETY: i is below the terminator of envp (counted by scan).
        let p = unsafe { *envp.add(i) };
        // SAFETY: an entry of envp, a C string.
        if unsafe { cstr(p) }.starts_with(PRELOAD) {
            // ld.so takes the last LD_PRELOAD, getenv the first: keep exactly one.
            if !preload_done {
                push(if keep_theirs { p as usize } else { preload });
                preload_done = true;
            }
        } else {
            push(p as usize);
        }
    }
    if !preload_done {
        push(preload);
    }
    for (j, c) in e.carried().enumerate() {
        if s.missing(j) {
            push(c.as_ptr() as usize);
        }
    }
    push(0);
    let r = f(out.as_ptr() as Argv);
    if mapped {
        // SAFETY: our own mapping, no longer referenced.
        unsafe { libc::syscall(libc::SYS_munmap, mem.as_ptr(), words * 8) };
    }
    Ok(r)
}

/// An exec's result: it returns only on failure, with errno set.
fn exec_result(r: Result<c_int, c_int>) -> c_int {
    r.unwrap_or_else(|e| {
        set_errno(e);
        -1
    })
}

fn environ() -> Argv {
    // SAFETY: reads the pointer the C library keeps; the program may change it, but not
    // during its own call into exec.
    unsafe { libc::environ as Argv }
}

/// Whether `path` (relative to `dirfd`) is a statically linked ELF executable: one without an
/// interpreter, which LD_PRELOAD cannot reach. Only open, pread and close: async-signal-safe.
///
/// # Safety
/// `path` is a NUL-terminated string.
unsafe fn is_static_elf(dirfd: c_int, path: *const c_char) -> bool {
    // SAFETY: openat reads the caller's NUL-terminated path.
    let fd = unsafe { libc::openat(dirfd, path, libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return false;
    }
    let read = |buf: &mut [u8], at: u64| {
        // SAFETY: pread writes at most buf.len() bytes into the live buffer.
        unsafe {
            libc::pread(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), at as libc::off_t) == buf.len() as isize
        }
    };
    let mut eh = [0u8; 64];
    let mut interpreter = None;
    if read(&mut eh, 0) && eh[..4] == *b"\x7fELF" && eh[4] == 2 {
        let phoff = u64::from_le_bytes([eh[32], eh[33], eh[34], eh[35], eh[36], eh[37], eh[38], eh[39]]);
        let (entsize, count) = (
            u16::from_le_bytes([eh[54], eh[55]]) as u64,
            u16::from_le_bytes([eh[56], eh[57]]) as u64,
        );
        interpreter = Some(false);
        for i in 0..count {
            let mut kind = [0u8; 4];
            // A header that cannot be read: not known to be static.
            if !read(&mut kind, phoff + i * entsize) || u32::from_le_bytes(kind) == libc::PT_INTERP {
                interpreter = Some(true);
                break;
            }
        }
    }
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
    interpreter == Some(false)
}

/// A program exec'd from the program (a script's command, a launcher's child) that is
/// statically linked runs natively: its memory is not disaggregated. `splitos run` refuses
/// such a program itself; here the image is the program's business, so it is said on its
/// stderr and the exec goes on.
///
/// # Safety
/// `path` is a NUL-terminated string.
unsafe fn warn_if_static(dirfd: c_int, path: *const c_char) {
    // SAFETY: the caller's NUL-terminated path.
    if !path.is_null() && unsafe { is_static_elf(dirfd, path) } {
        // SAFETY: as above.
        let name = unsafe { core::ffi::CStr::from_ptr(path) }.to_bytes();
        crate::sys::say(&[
            b"splitos shim: warning: ",
            name,
            b" is statically linked: it runs natively, its memory is not disaggregated\n",
        ]);
    }
}

#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: Argv, envp: Argv) -> c_int {
    // SAFETY: the caller's NUL-terminated path.
    unsafe { warn_if_static(libc::AT_FDCWD, path) };
    // SAFETY: execve(2) itself, with the caller's path and argv and a completed envp.
    exec_result(unsafe { with_shim_env(envp, |envp| libc::syscall(libc::SYS_execve, path, argv, envp) as c_int) })
}

#[no_mangle]
pub unsafe extern "C" fn execveat(dirfd: c_int, path: *const c_char, argv: Argv, envp: Argv, flags: c_int) -> c_int {
    if flags & libc::AT_EMPTY_PATH == 0 {
        // SAFETY: the caller's directory and path.
        unsafe { warn_if_static(dirfd, path) };
    }
    // SAFETY: execveat(2) itself, with the caller's arguments and a completed envp.
    exec_result(unsafe {
        with_shim_env(envp, |envp| {
            libc::syscall(libc::SYS_execveat, dirfd, path, argv, envp, flags) as c_int
        })
    })
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: Argv) -> c_int {
    // SAFETY: execv is execve with the program's environment.
    unsafe { execve(path, argv, environ()) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: Argv, envp: Argv) -> c_int {
    // A name with a slash is a path; one without is searched in PATH by the C library, whose
    // own execve this shim does not see.
    // SAFETY: the caller's NUL-terminated name.
    if !file.is_null() && unsafe { core::ffi::CStr::from_ptr(file) }.to_bytes().contains(&b'/') {
        // SAFETY: as above.
        unsafe { warn_if_static(libc::AT_FDCWD, file) };
    }
    // SAFETY: the C library's execvpe (its PATH search and its shell fallback), resolved for
    // this type, with the caller's arguments and a completed envp.
    exec_result(unsafe { with_shim_env(envp, |envp| REAL_EXECVPE.get::<ExecvpeFn>()(file, argv, envp)) })
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: Argv) -> c_int {
    // SAFETY: execvp is execvpe with the program's environment.
    unsafe { execvpe(file, argv, environ()) }
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: Argv, envp: Argv) -> c_int {
    // SAFETY: the C library's fexecve, resolved for this type, with a completed envp.
    exec_result(unsafe { with_shim_env(envp, |envp| REAL_FEXECVE.get::<FexecveFn>()(fd, argv, envp)) })
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut pid_t,
    path: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: Argv,
    envp: Argv,
) -> c_int {
    // SAFETY: the caller's path.
    unsafe { warn_if_static(libc::AT_FDCWD, path) };
    // SAFETY: the C library's posix_spawn, resolved for this type, with the caller's arguments
    // and a completed envp, which lives until it returns (the child has copied it by then).
    unsafe {
        with_shim_env(envp, |envp| {
            REAL_POSIX_SPAWN.get::<SpawnFn>()(pid, path, actions, attr, argv, envp)
        })
    }
    .unwrap_or_else(|e| e)
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut pid_t,
    file: *const c_char,
    actions: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: Argv,
    envp: Argv,
) -> c_int {
    // SAFETY: as posix_spawn.
    unsafe {
        with_shim_env(envp, |envp| {
            REAL_POSIX_SPAWNP.get::<SpawnFn>()(pid, file, actions, attr, argv, envp)
        })
    }
    .unwrap_or_else(|e| e)
}

/// system() and popen() start a shell inside the C library with the program's own
/// environment, which the shim cannot hand over: if the program removed the shim's variables
/// from it, they are put back (with setenv, which these two functions may call: they are not
/// async-signal-safe themselves).
fn restore_own_environment() {
    let put_back = |full: Argv| {
        let mut i = 0;
        // SAFETY: `full` is the completed copy of the environment, NULL-terminated.
        while let Some(p) = Some(unsafe { *full.add(i) }).filter(|p| !p.is_null()) {
            i += 1;
            // SAFETY: an entry of `full`, a C string.
            let v = unsafe { cstr(p) };
            let name = [c"LD_PRELOAD"]
                .into_iter()
                .chain(CARRIED)
                .find(|n| v.strip_prefix(n.to_bytes()).is_some_and(|r| r.first() == Some(&b'=')));
            if let Some(name) = name {
                // SAFETY: NUL-terminated name and value (the rest of the entry); setenv copies
                // both.
                unsafe { libc::setenv(name.as_ptr(), p.add(name.to_bytes().len() + 1), 1) };
            }
        }
    };
    // SAFETY: the program's environment, a NULL-terminated array of C strings. A complete one
    // is left alone; otherwise put_back walks a copy, which setenv's changes do not touch.
    unsafe {
        ready();
        if !scan(environ()).complete() {
            let _ = with_shim_env(environ(), put_back);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn system(command: *const c_char) -> c_int {
    restore_own_environment();
    // SAFETY: the C library's system, resolved for this type, with the caller's command.
    unsafe { REAL_SYSTEM.get::<SystemFn>()(command) }
}

#[no_mangle]
pub unsafe extern "C" fn popen(command: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    restore_own_environment();
    // SAFETY: the C library's popen, resolved for this type, with the caller's arguments.
    unsafe { REAL_POPEN.get::<PopenFn>()(command, mode) }
}

#[cfg(not(target_arch = "x86_64"))]
compile_error!("the execl stubs below read the x86-64 calling convention");

/// execl, execlp and execle take their arguments as a C variadic list, which Rust cannot
/// define. On x86-64 the list is arg0..arg4 in rsi, rdx, rcx, r8, r9 and the rest on the
/// stack above the return address. The stub stores r9 over the return address slot and
/// pushes r8, rcx, rdx, rsi below it, which makes the whole list one contiguous, NULL-terminated
/// argv (for execle the envp follows its NULL), then calls `$imp(path, argv)` and puts the
/// return address back. rbx (callee-saved, pushed below the list) keeps the return address.
macro_rules! list_exec {
    ($name:ident, $imp:ident) => {
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name(path: *const c_char, arg0: *const c_char) -> c_int {
            // Stack alignment at the call: 8 (mod 16) on entry, minus five pushes = 0.
            core::arch::naked_asm!(
                "mov rax, [rsp]",
                "mov [rsp], r9",
                "push r8",
                "push rcx",
                "push rdx",
                "push rsi",
                "mov rsi, rsp",
                "push rbx",
                "mov rbx, rax",
                "call {imp}",
                "mov rdx, rbx",
                "pop rbx",
                "add rsp, 32",
                "mov [rsp], rdx",
                "ret",
                imp = sym $imp,
            )
        }
    };
}

list_exec!(execl, execl_argv);
list_exec!(execlp, execlp_argv);
list_exec!(execle, execle_argv);

/// # Safety
/// Called by the execl stub with the program's path and its list as a NULL-terminated argv.
unsafe extern "C" fn execl_argv(path: *const c_char, argv: Argv) -> c_int {
    // SAFETY: execl is execv of its list.
    unsafe { execv(path, argv) }
}

/// # Safety
/// As [`execl_argv`].
unsafe extern "C" fn execlp_argv(file: *const c_char, argv: Argv) -> c_int {
    // SAFETY: execlp is execvp of its list.
    unsafe { execvp(file, argv) }
}

/// # Safety
/// As [`execl_argv`]; the list's NULL is followed by the envp.
unsafe extern "C" fn execle_argv(path: *const c_char, argv: Argv) -> c_int {
    let mut i = 0;
    // SAFETY: argv is NULL-terminated and execle's contract puts the envp right after it.
    unsafe {
        while !(*argv.add(i)).is_null() {
            i += 1;
        }
        execve(path, argv, *argv.add(i + 1) as Argv)
    }
}
