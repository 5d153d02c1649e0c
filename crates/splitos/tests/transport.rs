//! The transports with real components: shared memory carries the data path between
//! components of one host unless TCP is asked for, and a component killed mid-call is an
//! error for its callers, never a hang.
mod common;
use common::*;

/// Runs `cmd` on `c` with `--stats-json`; asserts native output; returns the run's counters.
fn run_native_output(c: &TestCluster, cmd: &[&str]) -> serde_json::Value {
    let f = c.dir.path().join("run-stats.json");
    let out = c.run(&["--stats-json", f.to_str().unwrap()], cmd);
    assert_eq!(text(&out.stdout), text(&native(cmd).stdout), "{}", text(&out.stderr));
    serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap()
}

#[test]
fn shared_memory_carries_misses_between_components_of_one_host_unless_tcp_is_asked_for() {
    let p = program("stride");
    let cmd = [p.to_str().unwrap(), "4", "8", "30"];
    let base = "[[pcomponent]]\nexcache = \"4M\"\nways = 1\n[[mcomponent]]\n";
    for (kind, config) in [("shm", base.to_string()), ("tcp", format!("{base}[transport]\nkind = \"tcp\"\n"))] {
        let c = TestCluster::up(Some(&config));
        let s = run_native_output(&c, &cmd);
        let misses = n(&s, "misses") - n(&s, "plocal_fills");
        assert!(misses >= 200, "{kind}: the program missed remotely: {s}");
        let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
        let through_shm = c.metric(&m, "rpc_shm_requests_total");
        if kind == "shm" {
            assert!(through_shm >= misses as f64, "{kind}: the mComponent served every remote miss from its channels ({through_shm} of {misses})");
        } else {
            assert_eq!(through_shm, 0.0, "{kind}: the mComponent served nothing through shared memory");
        }
    }
}

#[test]
fn a_program_whose_mcomponent_dies_mid_run_gets_an_error_over_shared_memory() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let hold = program("hold");
    let mut a = c.spawn(&[], &[hold.to_str().unwrap(), "16"]);
    assert_eq!(read_line(&mut a), "ready\n");
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    assert!(c.metric(&m, "rpc_shm_requests_total") > 0.0, "the pComponent reached the mComponent through shared memory");
    c.kill_component(c.pid_of_addr(&m));
    drop(a.stdin.take());
    let a = a.wait_with_output().unwrap();
    assert!(!a.status.success(), "the program cannot continue without its memory");
    assert!(text(&a.stderr).contains("mComponent"), "its error names the component: {}", text(&a.stderr));
}

#[test]
fn adaptive_polling_stops_polling_while_a_program_idles_and_fixed_polling_never_does() {
    let py = python3();
    // A few faults, then two seconds of nothing: the fault worker and the channels wait idle.
    let cmd = [py.as_str(), "-c", "import time; b = bytearray(8 << 20); time.sleep(2); print(len(b))"];
    let adaptive = "[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n";
    let fixed = "[[pcomponent]]\nexcache = \"4M\"\nfault_polling = \"fixed\"\n[[mcomponent]]\n[transport]\npolling = \"fixed\"\n";
    for (polling, config) in [("adaptive", adaptive), ("fixed", fixed)] {
        let c = TestCluster::up(Some(config));
        let out = c.run(&[], &cmd);
        assert_eq!(text(&out.stdout), text(&native(&cmd).stdout), "{}", text(&out.stderr));
        let skipped: f64 = ["pcomponent", "mcomponent"].iter().map(|r| c.metric(c.components(r)[0]["addr"].as_str().unwrap(), "poll_skipped_total")).sum();
        let spins: f64 = ["pcomponent", "mcomponent"].iter().map(|r| c.metric(c.components(r)[0]["addr"].as_str().unwrap(), "poll_spins_total")).sum();
        assert!(spins > 0.0, "{polling}: the components polled");
        if polling == "adaptive" {
            assert!(skipped > 0.0, "{polling}: idle waiters went to sleep without polling");
        } else {
            assert_eq!(skipped, 0.0, "{polling}: every wait polled for the whole spin");
        }
    }
}
