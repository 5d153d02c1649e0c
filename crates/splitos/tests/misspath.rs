//! The miss path's failure rule with real components: a dirty line evicted on behalf of
//! another process is never silently lost when its write-back fails.
mod common;
use std::time::Duration;

use common::*;

/// The PID of the cluster's component process whose command line has `arg`, taken out of the
/// cluster's PID record so that cleanup never signals a reused PID once the test killed it.
fn take_component_pid(c: &TestCluster, arg: &str) -> i32 {
    let pid = *c
        .state_pids()
        .iter()
        .find(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|cl| cl.split(|b| *b == 0).any(|a| a == arg.as_bytes())))
        .unwrap_or_else(|| panic!("no component process with {arg}"));
    let f = c.dir.path().join("cluster.json");
    let mut s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    s["pids"].as_array_mut().unwrap().retain(|p| p.as_i64() != Some(pid as i64));
    std::fs::write(&f, s.to_string()).unwrap();
    pid
}

#[test]
fn a_failed_piggybacked_write_back_never_lets_the_victims_process_read_zeros() {
    // Direct-mapped: the same heap page of two processes (same layout) falls into one set, so
    // a miss of A evicts B's line at that address.
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"16M\"\nways = 1\n[[mcomponent]]\n"));
    let hold = program("hold");
    let hold = hold.to_str().unwrap();
    let native = native(&[hold, "2"]);
    let mut a = c.spawn(&[], &[hold, "2"]);
    assert_eq!(read_line(&mut a), "ready\n");
    // B's writes evict A's dirty lines (written back to the mComponent); B's own lines are
    // dirty and exist nowhere else.
    let mut b = c.spawn(&[], &[hold, "2"]);
    assert_eq!(read_line(&mut b), "ready\n");
    let m = c.components("mcomponent")[0]["stats"].clone();
    assert!(m["flushes"].as_u64().unwrap() > 400, "A's lines were written back when B evicted them: {m}");

    let mem = take_component_pid(&c, "mem");
    // SAFETY: kill(2) takes no pointers; the PID is a component this test started, now out
    // of the cluster record so nothing signals it again.
    unsafe { libc::kill(mem, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(200));

    // A reads its buffer again: its first miss fetches from the dead mComponent with B's
    // dirty line piggybacked, and fails.
    drop(a.stdin.take());
    let a = a.wait_with_output().unwrap();
    assert!(!a.status.success(), "A cannot continue without its memory");
    assert!(text(&a.stderr).contains("mComponent"), "A's error names the component: {}", text(&a.stderr));

    // B lost its only copy of that page with the failed write-back: it must not go on as if
    // the page had never been written.
    drop(b.stdin.take());
    let b = b.wait_with_output().unwrap();
    let (out, err) = (text(&b.stdout), text(&b.stderr));
    assert!(!(b.status.success() && out != text(&native.stdout)), "B printed a wrong result and exited 0:\n{out}");
    assert!(!b.status.success(), "B's page is gone with the mComponent: {out}");
    assert!(err.contains("only copy") && err.contains("mComponent"), "B is stopped with an error naming the component and the lost page: {err}");
}
