//! Components serving their requests on Ebb event loops (`serving = "loops"`) instead of a
//! thread per connection and channel: programs' output stays native over shared memory and
//! TCP, the loops (seen in the mComponent's own threads and counters) did the serving, they
//! sleep when the cluster is idle, and each waiting knob does what it says.
use crate::common;
use std::time::Duration;

use common::*;

/// CPU seconds (user + system) process `pid` has used.
fn cpu_s(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // SAFETY: sysconf takes no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / hz
}

/// CPU seconds `pid` uses over `over`.
fn cpu_over(pid: i32, over: Duration) -> f64 {
    let before = cpu_s(pid);
    std::thread::sleep(over);
    cpu_s(pid) - before
}

/// How many threads of `pid` have one of `names`.
fn threads_called(pid: i32, names: &[&str]) -> usize {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| names.contains(&c.trim_end())))
        .count()
}

/// A cluster whose mComponent serves on loops with `serving` (more of its `[mcomponent.serving]`
/// table), over `transport`, every fetch a message; the cluster, the mComponent's address and PID.
fn cluster(transport: &str, serving: &str) -> (TestCluster, String, i32) {
    let c = TestCluster::up(Some(&format!("[transport]\nkind = \"{transport}\"\n[[pcomponent]]\nexcache = \"4M\"\none_sided = \"off\"\n[[mcomponent]]\n[mcomponent.serving]\nkind = \"loops\"\n{serving}")));
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let pid = c.pid_of_addr(&m);
    (c, m, pid)
}

/// Programs at once whose heaps do not fit the 4 MiB ExCache (two with `both`, else one); their
/// output is native.
fn programs(c: &TestCluster, both: bool) {
    let threads = program("threads");
    let memtouch = program("memtouch");
    let mut cmds: Vec<Vec<&str>> = vec![vec![memtouch.to_str().unwrap(), "6"]];
    if both {
        cmds.push(vec![threads.to_str().unwrap(), "2"]);
    }
    let running: Vec<_> = cmds
        .iter()
        .map(|cmd| {
            c.cmd(&["run", "--"])
                .args(cmd)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (cmd, child) in cmds.iter().zip(running) {
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            text(&out.stdout),
            text(&native(cmd).stdout),
            "{cmd:?}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn an_mcomponent_serves_programs_on_its_event_loop_over_shared_memory_and_tcp_and_sleeps_at_rest() {
    for transport in ["shm", "tcp"] {
        let (c, m, pid) = cluster(transport, "");
        programs(&c, true);
        let events = c.metric(&m, "splitos_ebb_loop_events_total");
        let served = c.metric(&m, "splitos_mcomp_requests_total");
        eprintln!("{transport}: loop events {events}, requests {served}");
        assert!(
            served > 1000.0,
            "{transport}: the programs' misses reached the mComponent: {served}"
        );
        assert!(
            events >= served,
            "{transport}: every request was an event of the loop: {events} events, {served} requests"
        );
        // The loop's thread serves; no thread per connection or channel stayed behind (the
        // pComponent's connections are still open).
        assert_eq!(threads_named(pid, "mcomp-loop-"), 1, "{transport}: one loop");
        let open = match transport {
            "shm" => c.metric(&m, "splitos_rpc_loop_channels"),
            _ => c.metric(&m, "splitos_rpc_loop_connections"),
        };
        assert!(
            open >= 1.0,
            "{transport}: the pComponent's channels and connections are on the loop: {open}"
        );
        assert_eq!(
            threads_called(pid, &["mcomp-rx", "mcomp-shm"]),
            0,
            "{transport}: no receiving thread"
        );
        // At rest the loop sleeps in epoll: the mComponent uses next to no CPU.
        let idle = cpu_over(pid, Duration::from_secs(2));
        assert!(
            idle < 0.1,
            "{transport}: the idle mComponent used {idle:.3} s of CPU in 2 s"
        );
    }
}

#[test]
fn the_loops_waiting_knobs_do_what_they_say() {
    // Always polling: the idle loop holds a CPU.
    let (c, m, pid) = cluster("shm", "waiting = \"poll\"\n");
    let busy = cpu_over(pid, Duration::from_secs(1));
    assert!(busy > 0.5, "a polling loop holds a CPU at rest: {busy:.3} s in 1 s");
    assert_eq!(
        c.metric(&m, "splitos_ebb_loop_sleeps_total"),
        0.0,
        "a polling loop never sleeps"
    );
    drop(c);
    // Always sleeping, and adaptive with a threshold no load reaches: the loop never polls,
    // under the programs' misses too.
    for serving in ["waiting = \"sleep\"\n", "poll_above = 1000000000\nsleep_below = 1000\n"] {
        let (c, m, _) = cluster("shm", serving);
        programs(&c, false);
        // A polling loop never sleeps; how often this one does depends on how many of the
        // misses queued behind one another (read ahead in batches, they often do).
        let sleeps = c.metric(&m, "splitos_ebb_loop_sleeps_total");
        assert!(sleeps > 100.0, "{serving}: the loop slept between requests: {sleeps}");
        assert_eq!(
            c.metric(&m, "splitos_ebb_loop_switches_total"),
            0.0,
            "{serving}: the loop never switched to polling"
        );
    }
    // Adaptive with a threshold the misses pass: it polls under them and sleeps again after.
    let (c, m, pid) = cluster("shm", "poll_above = 2000\nsleep_below = 500\n");
    programs(&c, false);
    let switches = c.metric(&m, "splitos_ebb_loop_switches_total");
    assert!(switches >= 2.0, "the loop switched to polling and back: {switches}");
    let idle = cpu_over(pid, Duration::from_secs(1));
    assert!(idle < 0.1, "back at rest, the loop sleeps: {idle:.3} s in 1 s");
    // Knobs out of range are refused at start, naming them.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.toml");
    for (bad, knob) in [
        ("cores = 0", "serving.cores"),
        ("poll_above = 10\nsleep_below = 20", "sleep_below"),
        ("kind = \"fibers\"", "serving"),
        ("linger_us = 20000", "serving.linger_us"),
    ] {
        std::fs::write(
            &f,
            format!("[[pcomponent]]\n[[mcomponent]]\n[mcomponent.serving]\n{bad}\n"),
        )
        .unwrap();
        let out = std::process::Command::new(splitos())
            .args(["cluster", "up", "--config"])
            .arg(&f)
            .env("SPLITOS_STATE_DIR", dir.path())
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0), "{bad}");
        assert!(text(&out.stderr).contains(knob), "{bad}: {}", text(&out.stderr));
    }
}
