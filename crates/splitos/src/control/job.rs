//! The program of `splitos run` as a job, the way a shell runs one: in a process group of its
//! own, given the terminal, stopped and continued with `run`, and sent the signals that reach
//! `run`. What its caller ignored or blocked reaches the program as it would natively, and
//! `run` ignores what its caller ignored, so that `nohup`, `trap '' INT` and a script's
//! background jobs mean what they mean without splitos.
use std::io::Read;
use std::os::unix::io::IntoRawFd;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;

/// Signals numbered 1 to 64 as bits (`1 << sig`), the numbers Linux has.
type SigBits = u64;
const SIGNALS: std::ops::RangeInclusive<libc::c_int> = 1..=63;

/// The signals ignored when this process started (bits): taken before the Rust runtime sets
/// SIGPIPE to ignored, which would otherwise hide whether the caller had.
static INHERITED_IGNORED: AtomicU64 = AtomicU64::new(0);
/// The signal mask this process started with.
static INHERITED_MASK: AtomicU64 = AtomicU64::new(0);

/// Records the dispositions this process inherited: the binary calls it from `.init_array`,
/// before the Rust runtime's own set-up.
pub extern "C" fn record_inherited() {
    let (mut ignored, mut masked) = (0, 0);
    // SAFETY: sigaction and sigprocmask only write the zeroed structures given, which outlive
    // the calls; a null new action or set only reads the current one.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigprocmask(libc::SIG_BLOCK, std::ptr::null(), &mut set);
        for sig in SIGNALS {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN {
                ignored |= 1 << sig;
            }
            if libc::sigismember(&set, sig) == 1 {
                masked |= 1 << sig;
            }
        }
    }
    INHERITED_IGNORED.store(ignored, Ordering::Relaxed);
    INHERITED_MASK.store(masked, Ordering::Relaxed);
}

fn inherited_ignored(sig: libc::c_int) -> bool {
    INHERITED_IGNORED.load(Ordering::Relaxed) & (1 << sig) != 0
}

/// In the program's process before exec: the dispositions and mask the caller gave `run`.
/// The standard library empties the mask and resets SIGPIPE before this runs, and this run's
/// own handlers are reset by exec.
///
/// # Safety
/// Only for a `pre_exec` hook: it calls async-signal-safe functions alone.
pub unsafe fn restore_inherited() -> std::io::Result<()> {
    let (ignored, masked) = (
        INHERITED_IGNORED.load(Ordering::Relaxed),
        INHERITED_MASK.load(Ordering::Relaxed),
    );
    let mut set: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut set);
    for sig in SIGNALS {
        if ignored & (1 << sig) != 0 {
            libc::signal(sig, libc::SIG_IGN);
        }
        if masked & (1 << sig) != 0 {
            libc::sigaddset(&mut set, sig);
        }
    }
    if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// What a terminal, a supervisor (`timeout`, systemd) or a user sends to end or interrupt a job.
const FORWARDED: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Signals received and not yet passed on (bits), set by the handler.
static RECEIVED: AtomicU64 = AtomicU64::new(0);
/// The process that last sent each signal (0: the kernel, a terminal), set by the handler.
static SENDERS: [AtomicI32; 64] = [const { AtomicI32::new(0) }; 64];
/// How close a sender's second signal of a kind must follow its first to be its twin: a
/// supervisor's signal to `run` and then to `run`'s group are two system calls in a row, which
/// only a preempted sender draws apart, and natively the program takes them as one.
const TWINS: std::time::Duration = std::time::Duration::from_millis(100);
/// The write end of the pipe that wakes the forwarding thread.
static WAKE: AtomicI32 = AtomicI32::new(-1);

/// The program (once started) and the signals that reached this run before it did.
struct Forwarding {
    program: Option<i32>,
    pending: SigBits,
}
static FORWARDING: Mutex<Forwarding> = Mutex::new(Forwarding {
    program: None,
    pending: 0,
});

extern "C" fn note(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel hands an SA_SIGINFO handler a valid siginfo; si_pid only reads it.
    let sender = if info.is_null() { 0 } else { unsafe { (*info).si_pid() } };
    SENDERS[sig as usize].store(sender, Ordering::SeqCst);
    RECEIVED.fetch_or(1 << sig, Ordering::SeqCst);
    // SAFETY: errno is this thread's, saved and restored around write, which is
    // async-signal-safe; the buffer outlives the call. A full pipe already holds a wake-up.
    unsafe {
        let errno = *libc::__errno_location();
        libc::write(WAKE.load(Ordering::SeqCst), [0u8].as_ptr().cast(), 1);
        *libc::__errno_location() = errno;
    }
}

/// Sends each signal of `sigs` to the program's group; to the program alone when the group is
/// gone because it left it (setsid, a shell's own job control). A failure of that means the
/// program is gone.
fn send(program: i32, sigs: SigBits) {
    for sig in SIGNALS.filter(|s| sigs & (1 << s) != 0) {
        // SAFETY: kill takes no pointers.
        unsafe {
            if libc::kill(-program, sig) != 0 {
                libc::kill(program, sig);
            }
        }
    }
}

/// From now on the signals of [`FORWARDED`] that the caller did not ignore go to the
/// program's process group, like the terminal's, instead of ending this run (and with it the
/// embedded cluster) while the program lives. A thread passes them on, not the handler: a
/// signal that arrives again before the first was passed on is passed on once, as the kernel
/// keeps one of a kind pending. `timeout` sends its signal to `run` and then to `run`'s group:
/// natively the two meet in the program as one, and so they do here, even when this thread
/// passed the first on before the second came ([`TWINS`]).
pub fn forward_signals() -> std::io::Result<()> {
    let (mut wakes, wake) = std::os::unix::net::UnixStream::pair()?;
    wake.set_nonblocking(true)?;
    WAKE.store(wake.into_raw_fd(), Ordering::SeqCst);
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        let mut buf = [0u8; 64];
        let mut passed: [Option<(i32, std::time::Instant)>; 64] = [None; 64];
        while wakes.read(&mut buf).is_ok_and(|n| n > 0) {
            let got = RECEIVED.swap(0, Ordering::SeqCst);
            let (mut sigs, now) = (got, std::time::Instant::now());
            for sig in SIGNALS.filter(|s| got & (1 << s) != 0) {
                let sender = SENDERS[sig as usize].load(Ordering::SeqCst);
                let twin = passed[sig as usize].is_some_and(|(s, at)| s == sender && sender != 0 && now - at < TWINS);
                if twin {
                    sigs &= !(1 << sig);
                } else {
                    passed[sig as usize] = Some((sender, now));
                }
            }
            let mut f = FORWARDING.lock().unwrap_or_else(|p| p.into_inner());
            match f.program {
                Some(p) => send(p, sigs),
                None => f.pending |= sigs,
            }
        }
    })?;
    // SAFETY: `note` only uses atomics and write, all async-signal-safe; the action is a
    // zeroed structure that outlives the call. With these valid signal numbers sigaction
    // cannot fail.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = note as *const () as libc::sighandler_t;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        for sig in FORWARDED.into_iter().filter(|&s| !inherited_ignored(s)) {
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
        // Taking the terminal back from the program's group, from the background, must not stop us.
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
    }
    Ok(())
}

/// The program runs as `pid` (its group's id too): signals that reached this run before are
/// passed on now, later ones as they come.
pub fn started(pid: i32) {
    let mut f = FORWARDING.lock().unwrap_or_else(|p| p.into_inner());
    f.program = Some(pid);
    send(pid, std::mem::take(&mut f.pending));
}

/// The descriptor of the terminal whose foreground job this run is, if any.
pub fn foreground_tty() -> Option<i32> {
    // SAFETY: isatty, tcgetpgrp and getpgrp take no pointers.
    (0..3).find(|&fd| unsafe { libc::isatty(fd) == 1 && libc::tcgetpgrp(fd) == libc::getpgrp() })
}

/// Waits for the program to end. When it stops (^Z, or reading the terminal in the background)
/// this run stops too, so that the shell sees its job stopped; when the job is continued, so is
/// the program, with the terminal if the job has it (`fg`) and without (`bg`).
pub fn wait_program(pid: i32, tty: Option<i32>) -> std::io::Result<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    let st = loop {
        let mut st = 0;
        // SAFETY: waitpid writes the status to `st`, which outlives the call.
        if unsafe { libc::waitpid(pid, &mut st, libc::WUNTRACED) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if !libc::WIFSTOPPED(st) {
            break st;
        }
        // SAFETY: tcsetpgrp, getpgrp, kill and getpid take no pointers.
        unsafe {
            if let Some(fd) = tty {
                libc::tcsetpgrp(fd, libc::getpgrp());
            }
            libc::kill(libc::getpid(), libc::SIGSTOP);
            if let Some(fd) = tty.filter(|&fd| libc::tcgetpgrp(fd) == libc::getpgrp()) {
                libc::tcsetpgrp(fd, pid);
            }
            libc::kill(-pid, libc::SIGCONT);
        }
    };
    if let Some(fd) = tty {
        // SAFETY: as above.
        unsafe { libc::tcsetpgrp(fd, libc::getpgrp()) };
    }
    Ok(std::process::ExitStatus::from_raw(st))
}
