//! `splitos run` as a shell's command: what the caller ignored or blocked reaches the program
//! as it would natively (`nohup`, `trap '' INT`, a script's background jobs), and a program
//! that cannot be started ends `run` with a shell's exit status.
use crate::cli::{finish, first_line, run_cmd, Job};
use crate::common::*;

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Signals the caller ignores, and one it blocks, as nohup, `trap ''` and a non-interactive
/// shell's background jobs leave them (SIGPIPE too, which the Rust runtime ignores for itself).
const IGNORED: [libc::c_int; 4] = [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGPIPE];
const BLOCKED: libc::c_int = libc::SIGUSR1;

fn as_ignoring_caller(c: &mut Command) -> &mut Command {
    // SAFETY: signal, sigemptyset, sigaddset and sigprocmask are async-signal-safe; the set is
    // on this stack frame.
    unsafe {
        c.pre_exec(|| {
            for sig in IGNORED {
                libc::signal(sig, libc::SIG_IGN);
            }
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, BLOCKED);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            Ok(())
        })
    }
}

/// The program's ignored and blocked signals as the kernel shows them.
const SHOW: [&str; 3] = ["grep", "-E", "^Sig(Ign|Blk)"];

#[test]
fn signals_the_caller_ignored_or_blocked_are_the_programs_as_natively() {
    let data = tempfile::tempdir().unwrap();
    let native = as_ignoring_caller(Command::new(SHOW[0]).args(&SHOW[1..]).arg("/proc/self/status"))
        .output()
        .unwrap();
    let native = text(&native.stdout);
    let bits = |key: &str| -> u64 {
        let line = native.lines().find(|l| l.starts_with(key)).unwrap();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    // The test means something only if the native program really sees them.
    for sig in IGNORED {
        assert_ne!(bits("SigIgn") & 1 << (sig - 1), 0, "{native}");
    }
    assert_ne!(bits("SigBlk") & 1 << (BLOCKED - 1), 0, "{native}");

    let mut prog = SHOW.to_vec();
    prog.push("/proc/self/status");
    let out = as_ignoring_caller(&mut run_cmd(&["--embedded", "--stats"], &prog, data.path()))
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(text(&out.stdout), native, "{err}");
    // It ran under the shim, on the cluster.
    assert!(err.contains("misses="), "{err}");
}

/// `nohup splitos run -- prog &` survives a hangup, and `(trap '' INT; splitos run -- prog)`
/// an interrupt, sent to `run` itself or to its whole process group, as the program does
/// natively; the program ends on its own with its own status.
#[test]
fn a_run_whose_caller_ignored_hangups_and_interrupts_survives_them() {
    let data = tempfile::tempdir().unwrap();
    let py = python3();
    const SLEEPS: &str = "import signal, time\nign = lambda s: signal.getsignal(s) == signal.SIG_IGN\nprint('ready', ign(signal.SIGINT), ign(signal.SIGHUP), flush=True)\ntime.sleep(3)\nprint('done')\n";
    let mut c = run_cmd(&["--embedded"], &[&py, "-c", SLEEPS], data.path());
    let mut job = Job(as_ignoring_caller(c.process_group(0)).spawn().unwrap());
    assert_eq!(first_line(&mut job), "ready True True\n");
    let pid = job.0.id() as i32;
    // SAFETY: kill(2) takes no pointers; the process and group are this test's job.
    unsafe {
        libc::kill(pid, libc::SIGHUP);
        libc::kill(pid, libc::SIGINT);
        libc::kill(-pid, libc::SIGHUP);
        libc::kill(-pid, libc::SIGINT);
    }
    let (out, err, code) = finish(job);
    assert_eq!(out, "done\n", "{err}");
    assert_eq!(code, 0, "{err}");
}

/// The exit status and message a shell gives when it cannot start a command: 127 when it is
/// not there, 126 when it cannot be run; checked against the shell's own.
#[test]
fn a_program_that_cannot_be_started_ends_run_as_it_ends_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\necho ran\n").unwrap();
    let (plain, folder, missing) = (
        plain.to_str().unwrap().to_string(),
        dir.path().to_str().unwrap().to_string(),
        dir.path().join("missing").to_str().unwrap().to_string(),
    );
    for (prog, code, says) in [
        (
            "no-such-program-anywhere",
            127,
            "no-such-program-anywhere: command not found",
        ),
        (missing.as_str(), 127, "No such file or directory"),
        (plain.as_str(), 126, "Permission denied"),
        (folder.as_str(), 126, "Is a directory"),
    ] {
        let shell = Command::new("sh").args(["-c", "exec \"$0\"", prog]).output().unwrap();
        assert_eq!(shell.status.code(), Some(code), "the shell's own status for {prog}");
        let out = run_cmd(&["--embedded"], &[prog], dir.path()).output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{prog}: {err}");
        assert!(err.contains(says) && err.contains(prog), "{prog}: {err}");
        assert!(out.stdout.is_empty(), "{prog}: {err}");
    }
}
