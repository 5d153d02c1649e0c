//! `splitos chaos` (docs/reliability.md): seeded faults against a cluster of its own while real
//! programs run on it, every run checked against a native one. The short seed here injects
//! every kind of fault the default configuration has but three (`pause-mem`; `detach-mem` and
//! `slow-mem`, which tests of their own run); what the cluster showed of each
//! (a killed mComponent held lost by the managers, its copies rebuilt by the mComponents) is
//! in the report, from the components' own statistics.
use crate::common;
use std::process::{Command, Output};

use common::*;

fn chaos(args: &[&str]) -> Output {
    Command::new(splitos())
        .arg("chaos")
        .args(args)
        .env_remove("SPLITOS_STATE_DIR")
        .env_remove("SPLITOS_GM")
        .output()
        .unwrap()
}

/// Field `key` of every object in the report's list `list`.
fn strings<'a>(list: &'a serde_json::Value, key: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|o| o[key].as_str().unwrap())
        .collect()
}

fn report(dir: &std::path::Path, args: &[&str]) -> (Output, serde_json::Value) {
    let json = dir.join("chaos.json");
    let mut all = args.to_vec();
    all.extend(["--json", json.to_str().unwrap()]);
    let out = chaos(&all);
    let r = std::fs::read_to_string(&json)
        .map(|s| serde_json::from_str(&s).unwrap())
        .unwrap_or_else(|_| panic!("no report: {}{}", text(&out.stdout), text(&out.stderr)));
    (out, r)
}

#[test]
fn a_short_seed_hits_every_kind_of_component_and_every_run_ends_as_natively_or_explained() {
    let dir = tempfile::tempdir().unwrap();
    // Every kind but pause-mem, which still finds failures not fixed yet
    // (docs/reliability.md#found-and-not-fixed-yet); seed 56 draws each of the twelve kinds
    // within its minute.
    let faults = "kill-mem,stop-mem,drain-mem,kill-gm,stop-gm,swap-placement,stop-proc,kill-proc,resize-excache,swap-policy,stop-storage,kill-storage";
    let args = ["--seed", "56", "--minutes", "1", "--faults", faults];
    let (out, r) = report(dir.path(), &args);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{said}");
    assert_eq!(r["passed"], true, "{said}");
    assert_eq!(
        (r["wrong"].as_u64(), r["unexplained"].as_u64(), r["hangs"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{said}"
    );
    assert_eq!(r["leaks"].as_array().map(Vec::len), Some(0), "{said}");
    for kind in faults.split(',') {
        assert!(r["faults"][kind].as_u64().unwrap_or(0) >= 1, "{kind} injected: {said}");
    }
    assert_eq!(
        r["faults"].as_object().unwrap().len(),
        12,
        "only the kinds named: {said}"
    );
    for f in r["schedule"].as_array().unwrap() {
        let seen = f["seen"].as_str().unwrap();
        assert!(!seen.starts_with("could not"), "{f}");
        if f["kind"] == "kill-mem" {
            // The managers declared it lost and the mComponents left no vRegion short of
            // a copy before it was started again (went on).
            assert!(
                seen.contains("held lost: true") && seen.contains("rebuilt: true"),
                "{f}"
            );
        }
    }
    // CPython's heap, the C pipeline, threads, files and memcached under loadgen (every value
    // it read back as stored: "corrupt 0", as natively), each as natively at least once.
    let names = strings(&r["workloads"], "name");
    assert_eq!(
        names,
        ["cpython-heap", "c-pipeline", "cpython-threads", "files", "memcached"],
        "{said}"
    );
    for w in r["workloads"].as_array().unwrap() {
        assert!(w["as_native"].as_u64().unwrap() >= 1, "{w}");
    }
    // The pComponent that was killed took its programs with it: their errors name it.
    for e in r["errors"].as_array().unwrap() {
        assert!(e["explained_by"].is_string(), "{e}");
    }
}

/// Detaches while programs run (seed 4 draws five): two that end with the mComponent gone,
/// its memory moved to the others, started again as a new member; three called off soon
/// after they began, one at least while its memory was moving. Every run ends as natively,
/// no fault explains an error (none is beyond tolerance), and nothing is left at the
/// components.
#[test]
fn detaches_ended_and_called_off_while_programs_run_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--seed", "4", "--minutes", "0.25", "--faults", "detach-mem"];
    let (out, r) = report(dir.path(), &args);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success() && r["passed"] == true, "{said}");
    assert_eq!(r["faults"]["detach-mem"].as_u64(), Some(5), "{said}");
    let seen = strings(&r["schedule"], "seen");
    let exits = seen
        .iter()
        .filter(|s| s.contains("exited; started again, a new member"))
        .count();
    let called_off = seen.iter().filter(|s| s.contains("called off after")).count();
    let exited_first = seen.iter().filter(|s| s.contains("exited before the call-off")).count();
    assert_eq!((exits, called_off + exited_first), (2, 3), "{seen:#?}");
    assert!(called_off >= 1, "no detach called off mid-move: {seen:#?}");
    every_run_as_natively(&r, &said);
}

/// `slow-mem` stops an mComponent 20 ms of every 50 while programs run on it: each stop is
/// seen in /proc, and every run still ends as natively, with no error to explain.
#[test]
fn a_slowed_mcomponent_slows_its_programs_and_fails_none() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--seed",
        "1",
        "--minutes",
        "0.1",
        "--faults",
        "slow-mem",
        "--without",
        "memcached",
        "--without",
        "files",
    ];
    let (out, r) = report(dir.path(), &args);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success() && r["passed"] == true, "{said}");
    assert!(r["faults"]["slow-mem"].as_u64().unwrap_or(0) >= 1, "{said}");
    for seen in strings(&r["schedule"], "seen") {
        let stops: u32 = seen
            .split("stopped ")
            .nth(1)
            .and_then(|s| s.split(' ').next()?.parse().ok())
            .unwrap_or(0);
        assert!(stops >= 1, "{seen}");
    }
    every_run_as_natively(&r, &said);
}

/// `full-disk` fills the sComponent's disk (one the chaos run mounted for it) while files
/// are written: a run that met it fails with ENOSPC (or, where the namespace was rolled back,
/// ENOENT or ENOTEMPTY), which the fault explains, and the
/// sComponent serves files again once the room is back (before, its namespace database,
/// once it met the full disk, failed every later call with EIO until it restarted). The
/// disk is unmounted when the run ends.
#[test]
fn a_full_scomponent_disk_fails_writes_with_enospc_and_files_work_again_once_freed() {
    let mounted = || {
        std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .lines()
            .filter(|l| l.starts_with("splitos-chaos-disk "))
            .count()
    };
    let before = mounted();
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--seed",
        "1",
        "--minutes",
        "0.15",
        "--faults",
        "full-disk",
        "--only-workloads",
        "--workload",
        // A file of 64 MiB with an fsync every 8: the disk fills under it.
        "python3 -c 'import os, tempfile\nwith tempfile.TemporaryDirectory(dir=os.environ.get(\"SPLITOS_VNODE_DIR\")) as t:\n    with open(os.path.join(t, \"f\"), \"wb\") as f:\n        for i in range(64):\n            f.write(bytes([i]) * (1 << 20))\n            if i % 8 == 7:\n                f.flush()\n                os.fsync(f.fileno())\n    print(os.path.getsize(os.path.join(t, \"f\")))'",
        "--workload",
        "python3 -c 'import os, tempfile\nwith tempfile.TemporaryDirectory(dir=os.environ.get(\"SPLITOS_VNODE_DIR\")) as t:\n    for i in range(200):\n        os.mkdir(os.path.join(t, str(i)))\n    print(len(os.listdir(t)))'",
    ];
    let (out, r) = report(dir.path(), &args);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success() && r["passed"] == true, "{said}");
    assert!(r["faults"]["full-disk"].as_u64().unwrap_or(0) >= 1, "{said}");
    for seen in strings(&r["schedule"], "seen") {
        assert!(seen.starts_with("its disk filled ("), "{seen}");
    }
    let errors = r["errors"].as_array().unwrap();
    assert!(
        errors
            .iter()
            .all(|e| e["explained_by"].as_str().is_some_and(|x| x.starts_with("full-disk"))),
        "{said}"
    );
    for w in r["workloads"].as_array().unwrap() {
        assert!(w["as_native"].as_u64().unwrap() >= 1, "{w}");
    }
    assert_eq!(mounted(), before, "the run's disk is unmounted");
}

/// With an nComponent, `network` fetches a document through it from a server on the host's
/// loopback while `stop-net` pauses it and `kill-net` kills it: every fetch prints what it
/// prints natively or fails naming the network, explained by a kill; the nComponent's own
/// counters show it carried the fetches' connections before each kill; the cluster settles
/// with the nComponent back.
#[test]
fn an_ncomponent_stopped_and_killed_under_fetches_fails_none_it_does_not_explain() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        "[cluster]\nvregion_size = \"4M\"\n[[pcomponent]]\nexcache = \"16M\"\n[[scomponent]]\n[[mcomponent]]\n[[mcomponent]]\n[[mcomponent]]\n[[ncomponent]]\nlisten = \"127.0.0.1:0\"\nloopback = \"host\"\n",
    )
    .unwrap();
    let mut args = vec!["--config", config.to_str().unwrap()];
    // Seed 1 draws kill-net, stop-net, kill-net, ... in its quarter of a minute.
    args.extend(["--seed", "1", "--minutes", "0.25", "--faults", "stop-net,kill-net"]);
    for w in ["cpython-heap", "cpython-threads", "c-pipeline", "files", "memcached"] {
        args.extend(["--without", w]);
    }
    let (out, r) = report(dir.path(), &args);
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success() && r["passed"] == true, "{said}");
    assert!(r["faults"]["kill-net"].as_u64().unwrap_or(0) >= 1, "{said}");
    assert!(r["faults"]["stop-net"].as_u64().unwrap_or(0) >= 1, "{said}");
    let w = &r["workloads"].as_array().unwrap()[0];
    assert_eq!(w["name"], "network", "{w}");
    assert!(w["as_native"].as_u64().unwrap() >= 1, "{w}");
    let kills: Vec<&str> = strings(&r["schedule"], "seen")
        .into_iter()
        .filter(|s| s.starts_with("carried "))
        .collect();
    // Each instance counts from its start: one killed before any fetch carried none.
    assert!(
        kills.iter().any(|seen| seen
            .strip_prefix("carried ")
            .and_then(|s| s.split(' ').next()?.parse::<u64>().ok())
            .is_some_and(|n| n >= 1)),
        "{kills:?}"
    );
}

/// No run failed, whatever the faults: each ended as natively.
fn every_run_as_natively(r: &serde_json::Value, said: &str) {
    assert!(r["errors"].as_array().unwrap().is_empty(), "{said}");
    for w in r["workloads"].as_array().unwrap() {
        assert_eq!(w["as_native"], w["runs"], "{w}");
    }
}

#[test]
fn a_run_that_prints_other_than_natively_fails_the_chaos_run_and_names_its_seed() {
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--seed",
        "3",
        "--minutes",
        "0.02",
        "--parallel",
        "1",
        "--only-workloads",
        "--workload",
        "date +%s%N",
    ];
    let (out, r) = report(dir.path(), &args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(r["passed"], false);
    assert!(r["wrong"].as_u64().unwrap() >= 1, "{r}");
    let err = text(&out.stderr);
    assert!(
        err.contains("FAILED with seed 3") && err.contains("splitos chaos --seed 3 --minutes 0.02"),
        "{err}"
    );
}

#[test]
fn a_seed_draws_the_same_faults_again_and_bad_options_are_refused() {
    let schedule = |seed: &str| {
        let out = chaos(&["--seed", seed, "--minutes", "2", "--schedule-only"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let a = schedule("42");
    assert!(a.as_array().unwrap().len() >= 10, "{a}");
    assert_eq!(a, schedule("42"));
    assert_ne!(a, schedule("43"));
    let out = chaos(&["--minutes", "0"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--minutes must be a positive number"),
        "{}",
        text(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[[mcomponent]]\ncapacity = \"lots\"\n").unwrap();
    let out = chaos(&["--config", bad.to_str().unwrap(), "--schedule-only"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("capacity"), "{}", text(&out.stderr));
    // No copy to survive the loss: killing the only mComponent is never drawn.
    let one = dir.path().join("one.toml");
    std::fs::write(
        &one,
        "[[pcomponent]]
[[mcomponent]]
",
    )
    .unwrap();
    let out = chaos(&[
        "--config",
        one.to_str().unwrap(),
        "--faults",
        "kill-mem",
        "--schedule-only",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no fault of the kinds"),
        "{}",
        text(&out.stderr)
    );
    let out = chaos(&["--without", "nope", "--schedule-only"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no such default workload"),
        "{}",
        text(&out.stderr)
    );
}
