//! What a newcomer meets with `splitos run` and the cluster commands: signals from the
//! terminal and from `timeout`, options that cannot apply, sizes that cannot work, and the
//! smaller edges of the CLI.
use crate::common;
use common::*;

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

/// A Python program that says "ready", then waits for a KeyboardInterrupt, says so and lets it
/// end the interpreter (exit by SIGINT: status 130, as in a shell).
// Short sleeps: a SIGINT that lands before a sleep begins (its handler run on the way back from
// a trapped page fault, say) is only seen by the interpreter between sleeps, not during one.
const CATCHES_SIGINT: &str = "import time\ntry:\n    print('ready', flush=True)\n    for _ in range(6000):\n        time.sleep(0.1)\nexcept KeyboardInterrupt:\n    print('caught KeyboardInterrupt', flush=True)\n    raise\n";

/// `splitos run` on an embedded cluster, in a process group of its own as a shell puts a job.
pub(crate) fn run_cmd(opts: &[&str], prog: &[&str], data: &std::path::Path) -> Command {
    let mut c = Command::new(splitos());
    c.arg("run").args(opts).arg("--").args(prog);
    c.env_remove("SPLITOS_GM")
        .env(
            "SPLITOS_STATE_DIR",
            std::env::temp_dir().join("splitos-test-no-cluster"),
        )
        .env("SPLITOS_DATA_DIR", data);
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// Ends the process group of a job the test started, whatever the test's outcome.
pub(crate) struct Job(pub Child);

impl Drop for Job {
    fn drop(&mut self) {
        // SAFETY: kill(2) takes no pointers; the group is this test's own job, led by its child.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// The next line of the job's stdout, read a byte at a time so that nothing after it is
/// taken from the pipe.
pub(crate) fn first_line(job: &mut Job) -> String {
    use std::io::Read;
    let out = job.0.stdout.as_mut().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8];
    while out.read(&mut b).unwrap() == 1 {
        line.push(b[0]);
        if b[0] == b'\n' {
            break;
        }
    }
    String::from_utf8_lossy(&line).into_owned()
}

pub(crate) fn finish(mut job: Job) -> (String, String, i32) {
    use std::io::Read;
    let (mut out, mut err) = (String::new(), String::new());
    job.0.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    job.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let st = job.0.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    (out, err, st.code().unwrap_or_else(|| 128 + st.signal().unwrap()))
}

#[test]
fn ctrl_c_to_the_job_reaches_the_program_not_the_cluster() {
    let data = tempfile::tempdir().unwrap();
    let py = python3();
    let mut job = Job(run_cmd(&["--embedded"], &[&py, "-c", CATCHES_SIGINT], data.path())
        .process_group(0)
        .spawn()
        .unwrap());
    assert_eq!(first_line(&mut job), "ready\n");
    // As a terminal's ^C: SIGINT to every process of the foreground job.
    // SAFETY: kill(2) takes no pointers; the group is this test's job.
    unsafe { libc::kill(-(job.0.id() as i32), libc::SIGINT) };
    let (out, err, code) = finish(job);
    assert_eq!(out, "caught KeyboardInterrupt\n", "{err}");
    assert!(err.contains("KeyboardInterrupt") && !err.contains("went away"), "{err}");
    assert_eq!(code, 130, "{err}");
}

#[test]
fn a_senders_signal_to_run_and_to_its_group_reach_the_program_once_even_apart() {
    // What `timeout` does when it is preempted between its two kill(2)s: the same signal from
    // the same sender, to `run` and then to `run`'s group, a few milliseconds apart. A program
    // that cleans up on SIGINT must not be interrupted again in its clean-up.
    let data = tempfile::tempdir().unwrap();
    let py = python3();
    let cleans_up = CATCHES_SIGINT.replace("    raise", "    time.sleep(0.5)\n    raise");
    let mut job = Job(run_cmd(&["--embedded"], &[&py, "-c", &cleans_up], data.path())
        .process_group(0)
        .spawn()
        .unwrap());
    assert_eq!(first_line(&mut job), "ready\n");
    let run = job.0.id() as i32;
    // SAFETY: kill(2) takes no pointers; the process and group are this test's job.
    unsafe { libc::kill(run, libc::SIGINT) };
    std::thread::sleep(std::time::Duration::from_millis(30));
    // SAFETY: as above.
    unsafe { libc::kill(-run, libc::SIGINT) };
    let (out, err, code) = finish(job);
    assert_eq!(out, "caught KeyboardInterrupt\n", "{err}");
    assert_eq!(err.matches("KeyboardInterrupt").count(), 1, "{err}");
    assert_eq!(code, 130, "{err}");
}

#[test]
fn timeout_signals_the_program_not_the_cluster() {
    let data = tempfile::tempdir().unwrap();
    let py = python3();
    let splitos = splitos();
    // `timeout` signals its child and then its whole process group. It does the same with a
    // signal it receives as with its own at expiry, so the test hands it SIGINT once the
    // program is ready rather than betting on how long a loaded machine takes to get there.
    let mut c = run_cmd(&["--embedded"], &[&py, "-c", CATCHES_SIGINT], data.path());
    let args: Vec<String> = std::iter::once("run".to_string())
        .chain(c.get_args().skip(1).map(|a| a.to_string_lossy().into_owned()))
        .collect();
    c = Command::new("timeout");
    c.args(["--preserve-status", "-s", "INT", "600"])
        .arg(&splitos)
        .args(&args);
    c.env_remove("SPLITOS_GM")
        .env(
            "SPLITOS_STATE_DIR",
            std::env::temp_dir().join("splitos-test-no-cluster"),
        )
        .env("SPLITOS_DATA_DIR", data.path());
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut job = Job(c.spawn().unwrap());
    assert_eq!(first_line(&mut job), "ready\n");
    // SAFETY: kill(2) takes no pointers; the process is this test's own `timeout`.
    unsafe { libc::kill(job.0.id() as i32, libc::SIGINT) };
    let (out, err, code) = finish(job);
    assert_eq!(out, "caught KeyboardInterrupt\n", "{err}");
    assert!(!err.contains("went away"), "{err}");
    assert_eq!(code, 130, "{err}");
}

/// A shim the dynamic loader cannot preload (missing, not a shared library) would leave the
/// program running natively, ld.so only warning: `run` refuses before it starts anything,
/// naming the shim, and the program never runs.
#[test]
fn a_shim_that_cannot_be_loaded_is_refused_by_path_and_nothing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let text_file = dir.path().join("not-a-library.so");
    std::fs::write(&text_file, "not an ELF shared object\n").unwrap();
    let marker = dir.path().join("ran");
    for (shim, why) in [
        (dir.path().join("missing.so"), "cannot be read"),
        (text_file, "is not a 64-bit ELF shared library"),
    ] {
        let out = run_cmd(&["--embedded"], &["touch", marker.to_str().unwrap()], dir.path())
            .env("SPLITOS_SHIM", &shim)
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(shim.to_str().unwrap()) && err.contains(why), "{err}");
        assert!(!marker.exists(), "the program ran without its shim");
    }
}

#[test]
fn excache_sizes_that_cannot_work_are_refused_by_name_and_megabytes_are_read() {
    for (size, why) in [
        ("4K", "least workable ExCache, 256K"),
        ("1T", "more than this host's memory"),
    ] {
        let out = under_splitos(&["--embedded", "--excache", size], &["true"]);
        assert_eq!(out.status.code(), Some(1), "{size}");
        assert!(text(&out.stderr).contains(why), "{size}: {}", text(&out.stderr));
    }
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("big.toml");
    std::fs::write(&f, "[[pcomponent]]\nexcache = \"1T\"\n[[mcomponent]]\n").unwrap();
    let up = Command::new(splitos())
        .args(["cluster", "up", "--config"])
        .arg(&f)
        .env("SPLITOS_STATE_DIR", dir.path().join("state"))
        .output()
        .unwrap();
    assert!(!up.status.success());
    assert!(
        text(&up.stderr).contains("pcomponent[0].excache") && text(&up.stderr).contains("host's memory"),
        "{}",
        text(&up.stderr)
    );
    let out = same_as_native(&["--embedded", "--excache", "64MB"], &["echo", "hi"]);
    assert_eq!(text(&out.stdout), "hi\n");
}

/// The processes whose command line names `dir` (an embedded cluster's components).
fn processes_naming(dir: &std::path::Path) -> Vec<i32> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .collect()
}

#[test]
fn a_killed_run_leaves_no_authority_key_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let hold = program("hold");
    let mut c = run_cmd(&["--embedded"], &[hold.to_str().unwrap(), "8"], data.path());
    c.env("TMPDIR", tmp.path()).stdin(Stdio::piped()).process_group(0);
    let mut job = Job(c.spawn().unwrap());
    assert_eq!(first_line(&mut job), "ready\n");
    let dirs: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("splitos-run-"))
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    // SAFETY: kill(2) takes no pointers; the process is this test's `run`.
    unsafe { libc::kill(job.0.id() as i32, libc::SIGKILL) };
    let _ = job.0.wait();
    let key = dirs[0].join("authority.key");
    let left = key.exists();
    // The components end with their run (parent-death signal); wait for them, then clean up.
    for _ in 0..100 {
        if processes_naming(&dirs[0]).is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for pid in processes_naming(&dirs[0]) {
        // SAFETY: as above; the process is a component of this test's run.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    unmount_under(&dirs[0]);
    assert!(!left, "{} outlived its run", key.display());
}

#[test]
fn a_static_binary_started_by_a_script_is_named_on_its_stderr() {
    let p = program("static_hello");
    let script = format!("{} && echo done", p.display());
    let out = under_splitos(&["--embedded"], &["sh", "-c", &script]);
    assert_eq!(text(&out.stdout), "hello from a static binary\ndone\n");
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{} is statically linked: it runs natively", p.display())),
        "{err}"
    );
}

#[test]
fn status_json_without_a_cluster_is_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(splitos())
        .args(["cluster", "status", "--json"])
        .env_remove("SPLITOS_GM")
        .env("SPLITOS_STATE_DIR", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
    assert!(v["gm"].is_null() && v["components"] == serde_json::json!([]), "{v}");
    assert!(v["error"].as_str().unwrap().contains("no cluster is running"), "{v}");
}

#[test]
fn a_component_or_manager_refuses_to_advertise_0_0_0_0() {
    // The cluster's authority issues the credentials a monitor started by hand needs.
    let c = TestCluster::up(None);
    let cred = c.dir.path().join("by-hand.cred");
    for (role, args) in [
        ("gm", vec!["gm", "--listen", "0.0.0.0:0"]),
        (
            "mcomponent",
            vec!["mem", "--gm", "127.0.0.1:1", "--listen", "0.0.0.0:0"],
        ),
        ("mcomponent", vec!["mem", "--gm", "127.0.0.1:1", "--listen", "[::]:0"]),
    ] {
        let made = c
            .cmd(&["cluster", "credentials", "--role", role, "--out"])
            .arg(&cred)
            .output()
            .unwrap();
        assert!(made.status.success(), "{}", text(&made.stderr));
        let out = Command::new(splitos())
            .args(&args)
            .arg("--credentials")
            .arg(&cred)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{role}");
        let listen = args[args.len() - 1];
        assert!(
            text(&out.stderr).contains(&format!(
                "cannot listen on {listen}: that address is also the one it advertises"
            )),
            "{role}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn a_running_cluster_refuses_memory_options_notes_the_rest_and_guards_its_programs() {
    // Two `cluster up` at once in one state directory: one starts the cluster, the other says
    // there is one.
    let dir = tempfile::Builder::new().prefix("splitos-cluster-").tempdir().unwrap();
    let up = || {
        Command::new(splitos())
            .args(["cluster", "up"])
            .env("SPLITOS_STATE_DIR", dir.path())
            .env("SPLITOS_DATA_DIR", dir.path().join("data"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (up(), up());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let c = TestCluster { dir };
    assert_eq!(
        [&a, &b].iter().filter(|o| o.status.success()).count(),
        1,
        "{} / {}",
        text(&a.stderr),
        text(&b.stderr)
    );
    let failed = if a.status.success() { &b } else { &a };
    assert!(
        text(&failed.stderr).contains("already running") && !text(&failed.stderr).contains("os error"),
        "{}",
        text(&failed.stderr)
    );

    for opt in [
        ["--mem-capacity", "1G"],
        ["--mcomponents", "3"],
        ["--vregion-size", "4M"],
    ] {
        let out = c.run(&opt, &["echo", "hi"]);
        assert_eq!(out.status.code(), Some(1), "{opt:?}");
        assert!(text(&out.stdout).is_empty(), "{opt:?}: the program must not run");
        assert!(
            text(&out.stderr).contains(opt[0]) && text(&out.stderr).contains("--embedded"),
            "{}",
            text(&out.stderr)
        );
    }
    let out = c.run(&["--excache", "4M"], &["echo", "hi"]);
    assert_eq!(text(&out.stdout), "hi\n");
    assert!(
        text(&out.stderr).contains("note: ignored: --excache ("),
        "{}",
        text(&out.stderr)
    );

    // `cluster metrics | head`: the reader is gone before anything is written.
    let out = c
        .cmd(&["cluster", "metrics"])
        .stdout(gone_reader())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        out.status.success() && !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );

    // Roles are also named as the subcommands that run them (docs/deployment.md).
    let cred = c.dir.path().join("by-command.cred");
    let out = c
        .cmd(&[
            "cluster",
            "credentials",
            "--role",
            "gm",
            "--out",
            cred.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success() && text(&out.stdout).contains("global-managers"),
        "{}",
        text(&out.stderr)
    );

    // `cluster down` while a program runs: refused, the program unharmed; --force stops both.
    let hold = program("hold");
    let mut child = c.spawn(&[], &[hold.to_str().unwrap(), "8"]);
    assert_eq!(read_line(&mut child), "ready\n");
    let down = c.cmd(&["cluster", "down"]).output().unwrap();
    assert!(
        !down.status.success() && text(&down.stderr).contains("--force"),
        "{}",
        text(&down.stderr)
    );
    assert!(child.try_wait().unwrap().is_none(), "the program still runs");
    let down = c.cmd(&["cluster", "down", "--force"]).output().unwrap();
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert!(
        text(&down.stderr).contains("warning: stopping 1 program"),
        "{}",
        text(&down.stderr)
    );
    assert!(!child.wait().unwrap().success());
}

#[test]
fn out_of_memory_under_heuristic_overcommit_is_told_once() {
    // The default charges pages when stored: the program is stopped when a page it wrote
    // fits nowhere, as Linux's OOM killer would (docs/running-programs.md); strict overcommit
    // makes malloc return NULL instead (cluster::out_of_memory_fails_malloc_not_the_cluster).
    let p = program("memtouch");
    let out = under_splitos(
        &[
            "--embedded",
            "--mcomponents",
            "1",
            "--mem-capacity",
            "64M",
            "--excache",
            "4M",
        ],
        &[p.to_str().unwrap(), "200"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{err}");
    assert!(err.contains("is full"), "{err}");
    assert_eq!(
        err.matches("cannot write back heap page").count(),
        1,
        "told once: {err}"
    );
}

#[test]
fn ctrl_c_typed_on_a_terminal_reaches_the_program() {
    // `script` runs `run` on a pseudo-terminal of its own, as its foreground job; the ^C
    // written to it is the terminal's SIGINT, sent to whichever process group has the terminal.
    let data = tempfile::tempdir().unwrap();
    let prog = data.path().join("catches.py");
    std::fs::write(&prog, CATCHES_SIGINT).unwrap();
    let line = format!(
        "{} run --embedded -- {} {}",
        splitos().display(),
        python3(),
        prog.display()
    );
    let mut c = Command::new("script");
    c.args(["-qfec", &line, "/dev/null"])
        .env_remove("SPLITOS_GM")
        .env(
            "SPLITOS_STATE_DIR",
            std::env::temp_dir().join("splitos-test-no-cluster"),
        )
        .env("SPLITOS_DATA_DIR", data.path());
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut job = Job(c.spawn().unwrap());
    // On a terminal `run` says which ExCache it chose for this host, before the program runs.
    let said = first_line(&mut job);
    assert!(
        said.starts_with("splitos: ExCache ") && said.contains("sized for this host"),
        "{said}"
    );
    assert_eq!(first_line(&mut job).trim_end(), "ready");
    use std::io::Write;
    job.0.stdin.as_mut().unwrap().write_all(b"\x03").unwrap();
    let (out, err, code) = finish(job);
    assert!(
        out.contains("caught KeyboardInterrupt") && out.contains("KeyboardInterrupt"),
        "{out}{err}"
    );
    assert!(!out.contains("went away"), "{out}");
    assert_eq!(code, 130, "{out}{err}");
}

#[test]
fn cluster_down_leaves_no_rendezvous_sockets() {
    let shm = tempfile::tempdir().unwrap();
    let shm_dir = shm.path().join("rendezvous");
    let c = TestCluster::up(Some(&format!(
        "[transport]\nkind = \"shm\"\n[transport.shm]\ndir = \"{}\"\n[[pcomponent]]\n[[mcomponent]]\n",
        shm_dir.display()
    )));
    let socks = || {
        std::fs::read_dir(&shm_dir)
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "sock"))
            .count()
    };
    assert!(socks() > 0, "the components listen on rendezvous sockets");
    let down = c.cmd(&["cluster", "down"]).output().unwrap();
    assert!(down.status.success(), "{}", text(&down.stderr));
    assert_eq!(socks(), 0, "sockets left in {}", shm_dir.display());
}

// ---- Non-root `cluster up`

// ---- Broken pipes

/// A pipe whose reader is gone already, as `| head` is once it has what it wanted: the first
/// write to it fails with EPIPE.
fn gone_reader() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the read end, ours, closed once.
    unsafe { libc::close(fds[0]) };
    // SAFETY: the write end, ours, handed over to the child.
    Stdio::from(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) })
}

/// Every command below `path`, as clap lists them in the help, with its usage line (but
/// clap's `help`, which prints what `--help` does).
pub(crate) fn commands_below(path: &[String]) -> Vec<(Vec<String>, String)> {
    let help = text(
        &Command::new(splitos())
            .args(path)
            .arg("--help")
            .output()
            .unwrap()
            .stdout,
    );
    let subs: Vec<String> = help
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| Some(l.strip_prefix("  ")?.split_whitespace().next()?.to_string()))
        .filter(|c| c != "help")
        .collect();
    if subs.is_empty() {
        let usage = help
            .lines()
            .find_map(|l| l.strip_prefix("Usage: "))
            .unwrap_or_else(|| panic!("no usage in the help of {path:?}: {help}"));
        return vec![(path.to_vec(), usage.to_string())];
    }
    subs.iter()
        .flat_map(|s| commands_below(&[path, std::slice::from_ref(s)].concat()))
        .collect()
}

/// Waits for `child`, which a regression could leave writing for ever into nothing.
fn finished(mut child: Child, what: &str) -> std::process::Output {
    for _ in 0..1200 {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("{what} still runs after 120 s: {:?}", child.wait_with_output().unwrap());
}

/// The memcached server the load generator drives, ended when dropped.
struct Memcached(Child);

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn every_command_whose_reader_goes_away_exits_without_a_panic() {
    let c = TestCluster::up(None);
    let ids = |role: &str| {
        c.components(role)
            .iter()
            .map(|x| (x["id"].to_string(), x["addr"].as_str().unwrap().to_string()))
            .collect::<Vec<_>>()
    };
    let (pcomp, mcomps) = (ids("pcomponent")[0].0.clone(), ids("mcomponent"));
    let dir = c.dir.path();
    std::fs::write(dir.join("nodes.csv"), "sn,cpu_milli,memory_mib\nn0,4000,8192\n").unwrap();
    std::fs::write(dir.join("tasks.csv"), "name,cpu_milli,memory_mib\na,1000,1024\n").unwrap();
    let mut memcached = Memcached(
        Command::new(splitos())
            .args(["memcached", "--listen", "127.0.0.1:0", "--cores", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let listening = read_line(&mut memcached.0);
    let server = listening
        .split_whitespace()
        .nth(4)
        .unwrap_or_else(|| panic!("{listening}"))
        .to_string();
    let file = |name: &str| dir.join(name).to_str().unwrap().to_string();
    // What each command that needs arguments is given. The components' own monitors serve
    // until stopped and print nothing a reader could cut: their help alone is piped.
    let servers = ["gm", "mem", "proc", "storage", "net"];
    let args_of = |cmd: &str| -> Option<Vec<String>> {
        let a: Vec<String> = match cmd {
            "run" => vec!["--".into(), "seq".into(), "1".into(), "100000".into()],
            "top" => vec!["-n".into(), "2".into(), "-d".into(), "0.1".into()],
            "join" => vec![
                "--token".into(),
                "not-a-token".into(),
                "--out".into(),
                file("joined"),
                "127.0.0.1:1".into(),
            ],
            "cluster cordon" | "cluster uncordon" | "cluster set-excache" | "cluster set-policy" | "cluster drain" => {
                vec![pcomp.clone()]
            }
            "cluster token create" => vec!["piped".into(), "--admin".into()],
            "cluster token revoke" => vec!["piped".into()],
            // It runs: refused, in words.
            "cluster restart" => vec!["gm".into()],
            "cluster join-token" => vec!["--role".into(), "mem".into()],
            "cluster credentials" => vec!["--role".into(), "admin".into(), "--out".into(), file("piped.cred")],
            "cluster etcd-cert" => vec!["--ip".into(), "127.0.0.1".into(), "--out".into(), file("piped-etcd")],
            "memory attach" => vec![mcomps[0].0.clone()],
            "memory detach" => vec![mcomps[1].0.clone()],
            "debug fetch" => [
                "--mcomp",
                &mcomps[0].1,
                "--vnode",
                "default",
                "--pid",
                "1",
                "--vaddr",
                "0x200000000000",
            ]
            .map(String::from)
            .to_vec(),
            "debug flip" => ["--mcomp", &mcomps[0].1, "--vnode", "default", "--pid", "1"]
                .map(String::from)
                .to_vec(),
            "sim" => vec!["--nodes".into(), file("nodes.csv"), "--tasks".into(), file("tasks.csv")],
            "bench-floor" => vec!["--n".into(), "100".into()],
            // Refused before it registers anything, which the cluster's later commands would see.
            "bench-managers" => ["--gm", "127.0.0.1:1", "--gm-pid", "999999999"]
                .map(String::from)
                .to_vec(),
            "loadgen" => [
                "--server",
                &server,
                "--duration",
                "1",
                "--warmup",
                "0",
                "--keys",
                "100",
                "--clients",
                "1",
            ]
            .map(String::from)
            .to_vec(),
            "memcached" => vec!["--listen".into(), "127.0.0.1:0".into(), "--cores".into(), "1".into()],
            _ => return None,
        };
        Some(a)
    };
    let mut commands = commands_below(&[]);
    // Stopping the cluster comes last: the others run on it.
    commands.sort_by_key(|(path, _)| path == &["cluster", "down"]);
    let mut needs_args = Vec::new();
    let mut run = 0;
    for (path, usage) in &commands {
        let name = path.join(" ");
        let panicked = |out: &std::process::Output, how: &str| {
            assert!(
                out.status.code() != Some(101) && !text(&out.stderr).contains("panicked"),
                "`splitos {name}` {how}: {:?} {}",
                out.status,
                text(&out.stderr)
            );
        };
        let help = c
            .cmd(
                path.iter()
                    .map(String::as_str)
                    .chain(["--help"])
                    .collect::<Vec<_>>()
                    .as_slice(),
            )
            .stdout(gone_reader())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        panicked(&help, "--help into a gone reader");
        if servers.contains(&name.as_str()) {
            continue;
        }
        // A command with arguments it cannot go without must be given some above.
        let required = usage
            .split_whitespace()
            .skip(1 + path.len())
            .any(|w| !w.starts_with('['));
        let args = match args_of(&name) {
            Some(a) => a,
            None if required => {
                needs_args.push(name.clone());
                continue;
            }
            None => Vec::new(),
        };
        let cmd = |stderr: Stdio| {
            let mut k = c.cmd(&path.iter().map(String::as_str).collect::<Vec<_>>());
            k.args(&args).stdin(Stdio::null()).stdout(gone_reader()).stderr(stderr);
            finished(k.spawn().unwrap(), &name)
        };
        let out = cmd(Stdio::piped());
        panicked(&out, "into a gone reader");
        if name == "run" {
            // The program meets the gone reader itself, as natively: SIGPIPE ends it.
            let native = Command::new("seq")
                .args(["1", "100000"])
                .stdout(gone_reader())
                .status()
                .unwrap();
            use std::os::unix::process::ExitStatusExt;
            assert_eq!(
                (native.signal(), out.status.code()),
                (Some(libc::SIGPIPE), Some(128 + libc::SIGPIPE)),
                "{}",
                text(&out.stderr)
            );
        }
        // Its messages to stderr, into a gone reader too.
        panicked(&cmd(gone_reader()), "with stdout and stderr into gone readers");
        run += 1;
    }
    assert!(
        needs_args.is_empty(),
        "give these commands arguments in this test: {needs_args:?}"
    );
    assert!(run >= 30, "{run} commands run, of {commands:?}");
}

/// `--vnode` with a name the cluster has no vNode of (neither `default` nor configured nor
/// made through the API) is refused by the pComponent, as a typo would be, and nothing runs;
/// `--create-vnode` runs there.
#[test]
fn a_vnode_the_cluster_does_not_have_is_refused_unless_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = ["touch", marker.to_str().unwrap()];
    let out = run_cmd(&["--embedded", "--vnode", "defualt"], &touch, dir.path())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("has no vNode \"defualt\" (a typo?)") && err.contains("--create-vnode"),
        "{err}"
    );
    assert!(!marker.exists(), "the program ran on a vNode no one made");
    let out = run_cmd(
        &["--embedded", "--vnode", "defualt", "--create-vnode"],
        &touch,
        dir.path(),
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(marker.exists());
    let out = run_cmd(&["--embedded"], &["true"], dir.path()).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the default vNode needs no flag: {}",
        text(&out.stderr)
    );
}
