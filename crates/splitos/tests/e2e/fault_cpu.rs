//! `fault_cpu = "faulting"` with real components and real programs: each fault worker runs on
//! the CPU of the thread whose fault it serves, the mComponent's channel threads follow it
//! there, and programs see exactly what they see natively.
use crate::common;
use std::process::{Command, Stdio};

use common::*;

/// The CPUs this test may run on.
fn usable_cpus() -> Vec<u32> {
    let out = native(&["taskset", "-pc", &std::process::id().to_string()]);
    let list = text(&out.stdout);
    let list = list.rsplit(": ").next().unwrap().trim();
    list.split(',')
        .flat_map(|r| match r.split_once('-') {
            Some((a, b)) => (a.parse().unwrap()..=b.parse().unwrap()).collect::<Vec<u32>>(),
            None => vec![r.parse().unwrap()],
        })
        .collect()
}

/// The CPUs each thread of `pid` whose name starts with `prefix` may run on
/// (`Cpus_allowed_list`).
fn allowed_cpus(pid: i32, prefix: &str) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix)))
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:").map(|v| v.trim().to_string()))
        })
        .collect()
}

#[test]
fn a_fault_worker_and_the_mcomponent_follow_a_program_to_its_cpu() {
    let cpus = usable_cpus();
    if cpus.len() < 2 {
        skip(&format!("needs two usable CPUs, has {cpus:?}"));
        return;
    }
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"4M\"\nfault_cpu = \"faulting\"\n[[mcomponent]]\n",
    ));
    let pcomp = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let mcomp = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let (ppid, mpid) = (c.pid_of_addr(&pcomp), c.pid_of_addr(&mcomp));
    let hold = program("hold");
    let cmd = [hold.to_str().unwrap(), "32"];
    let native = native(&cmd);
    for &cpu in cpus.iter().rev().take(2) {
        // The program alone is pinned (`taskset` runs `splitos run`, whose child it is); the
        // cluster's components may run anywhere.
        let stats = c.dir.path().join(format!("run-{cpu}.json"));
        let mut run = Command::new("taskset");
        run.args(["-c", &cpu.to_string()])
            .arg(splitos())
            .args(["run", "--stats-json", stats.to_str().unwrap(), "--"])
            .args(cmd);
        run.env("SPLITOS_STATE_DIR", c.dir.path())
            .env("SPLITOS_DATA_DIR", c.dir.path().join("data"))
            .env_remove("SPLITOS_GM");
        let mut child = run
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert_eq!(read_line(&mut child), "ready\n");
        // 32 MiB written through a 4 MiB ExCache: the worker served over a thousand faults
        // (fault-around and pre-allocation took most first touches), the program sits waiting
        // for its stdin, and the worker sleeps where it served them.
        let workers = allowed_cpus(ppid, "fault");
        assert_eq!(
            workers,
            vec![cpu.to_string()],
            "the program's fault worker runs on the program's CPU {cpu}"
        );
        let servers = allowed_cpus(mpid, "mcomp-shm");
        assert!(
            servers.contains(&cpu.to_string()),
            "a channel thread of the mComponent runs on CPU {cpu}: {servers:?}"
        );
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            format!("ready\n{}", text(&out.stdout)),
            text(&native.stdout),
            "{}",
            text(&out.stderr)
        );
        let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
        let (on, off) = (n(&s, "faults_on_faulting_cpu"), n(&s, "faults_off_faulting_cpu"));
        // 32 MiB through a 4 MiB ExCache with fault-around of 16 pages: about a thousand
        // faults, a few more or less from run to run.
        assert!(
            on >= 500 && off * 50 < on,
            "faults served on the faulting CPU: {on}, elsewhere: {off}: {s}"
        );
        assert!(n(&s, "fault_worker_moves") >= 1, "{s}");
        assert_eq!(
            n(&s, "fault_worker_partings"),
            0,
            "a pinned program never leaves its CPU: {s}"
        );
    }
    // Both runs' faults, each over a thousand (above), as the pComponent's metrics count them.
    let on = c.metric(&pcomp, "splitos_pcomp_faults_on_faulting_cpu_total");
    assert!(on > 2000.0, "faults served on the faulting CPU: {on}");
    // Most of a miss's traffic goes one-sided; the write-backs and fetches that reach the
    // mComponent's channel still number hundreds in the two runs (500 to 850 on a quiet
    // machine, 292 beside the rest of the suite: how much goes one-sided depends on the load).
    let followed = c.metric(&mcomp, "splitos_rpc_shm_followed_total");
    assert!(
        followed > 100.0,
        "the pComponent's requests asked the mComponent to follow: {followed}"
    );
    assert!(
        c.metric(&mcomp, "splitos_rpc_shm_server_moves_total") >= 2.0,
        "a channel thread moved to each CPU"
    );
}

#[test]
fn programs_give_native_output_with_workers_on_the_faulting_cpu() {
    let rnd = program("randpages");
    let threads = program("threads");
    let py = python3();
    let script = "d = {}\nfor i in range(200000):\n    d[str(i) * 3] = [i] * 4\nprint(sum(len(k) + sum(v) for k, v in d.items()))\n";
    for cmd in [
        vec![rnd.to_str().unwrap(), "24", "2"],
        vec![threads.to_str().unwrap(), "24"],
        vec![py.as_str(), "-c", script],
    ] {
        let (_, s) = same_as_native_with_stats(&["--excache", "4M", "--fault-cpu", "faulting"], &cmd);
        assert!(n(&s, "misses") > 1000, "{cmd:?}: {s}");
        assert!(
            n(&s, "faults_on_faulting_cpu") > 0 && n(&s, "fault_worker_moves") >= 1,
            "{cmd:?}: the workers served faults beside the faulting threads: {s}"
        );
        assert_eq!(s["errors"].as_array().map(|e| e.len()), Some(0), "{s}");
    }
    // Over TCP nothing asks the mComponents to follow; the workers still do.
    let (_, s) = same_as_native_with_stats(
        &["--excache", "4M", "--fault-cpu", "faulting", "--transport", "tcp"],
        &[rnd.to_str().unwrap(), "24", "2"],
    );
    assert!(n(&s, "faults_on_faulting_cpu") > 0, "{s}");
    // The default follows the faulting thread too; with `any`, workers run anywhere and
    // nothing is counted.
    let (_, s) = same_as_native_with_stats(&["--excache", "4M"], &[rnd.to_str().unwrap(), "24", "2"]);
    assert_eq!(s["pcomponent"]["fault_cpu"], "faulting", "{s}");
    assert!(n(&s, "faults_on_faulting_cpu") > 0, "{s}");
    let (_, s) = same_as_native_with_stats(
        &["--excache", "4M", "--fault-cpu", "any"],
        &[rnd.to_str().unwrap(), "24", "2"],
    );
    assert_eq!(
        n(&s, "faults_on_faulting_cpu") + n(&s, "faults_off_faulting_cpu") + n(&s, "fault_worker_moves"),
        0,
        "{s}"
    );
}

#[test]
fn a_bad_fault_cpu_is_refused_with_its_name() {
    let bad = under_splitos(&["--fault-cpu", "sometimes"], &["true"]);
    assert!(
        !bad.status.success() && text(&bad.stderr).contains("any, faulting"),
        "{}",
        text(&bad.stderr)
    );
    let c = TestCluster {
        dir: tempfile::Builder::new().prefix("splitos-cluster-").tempdir().unwrap(),
    };
    let cfg = c.dir.path().join("cluster.toml");
    std::fs::write(&cfg, "[[pcomponent]]\nfault_cpu = \"sometimes\"\n[[mcomponent]]\n").unwrap();
    let out = c
        .cmd(&["cluster", "up", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("fault_cpu"),
        "{}",
        text(&out.stderr)
    );
}
