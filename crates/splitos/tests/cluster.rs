//! A long-lived cluster: placement, memory accounting and release, vNodes, two-level virtual
//! memory across mComponents, and errors (bad input, full pools, dead components).
mod common;
use std::io::{Read, Write};
use std::time::Duration;

use common::*;

fn mem_stats(c: &TestCluster) -> Vec<serde_json::Value> {
    c.components("mcomponent").into_iter().map(|m| m["stats"].clone()).collect()
}

#[test]
fn exit_frees_all_memory_and_status_shows_it() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[mcomponent]]\n"));
    let p = program("hold");
    let mut child = c.spawn(&[], &[p.to_str().unwrap(), "24"]);
    assert_eq!(read_line(&mut child), "ready\n");
    let used: u64 = mem_stats(&c).iter().map(|s| s["used"].as_u64().unwrap()).sum();
    let committed: u64 = mem_stats(&c).iter().map(|s| s["committed"].as_u64().unwrap()).sum();
    assert!(used >= 16 << 20, "flushed pages live on mComponents while the program runs: {used}");
    assert!(committed >= 24 << 20, "{committed}");
    let pcomp = &c.components("pcomponent")[0]["stats"];
    assert_eq!(pcomp["processes"].as_array().unwrap().len(), 1, "{pcomp}");
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success() && text(&out.stdout).starts_with("sum "), "{}", text(&out.stderr));
    let freed = c.eventually(Duration::from_secs(5), |c| mem_stats(c).iter().all(|s| s["used"] == 0 && s["committed"] == 0));
    assert!(freed, "all memory is released after exit: {:?}", mem_stats(&c));
    let human = c.cmd(&["cluster", "status"]).output().unwrap();
    assert!(text(&human.stdout).contains("mcomponent") && text(&human.stdout).contains("pcomponent"));
}

#[test]
fn small_vregions_spread_one_process_over_both_mcomponents() {
    let c = TestCluster::up(Some("[cluster]\nvregion_size = \"8M\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[mcomponent]]\n"));
    let p = program("hold");
    let mut child = c.spawn(&[], &[p.to_str().unwrap(), "48"]);
    assert_eq!(read_line(&mut child), "ready\n");
    for s in mem_stats(&c) {
        let procs = s["owned_processes"].as_array().unwrap();
        assert!(procs.iter().any(|p| p["pages"].as_u64().unwrap() > 100), "each mComponent owns some of the process's vRegions: {s}");
    }
    drop(child.stdin.take());
    assert!(child.wait_with_output().unwrap().status.success());
}

#[test]
fn an_mcomponent_refuses_pages_of_another_vnode() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let p = program("hold");
    let mut child = c.spawn(&["--vnode", "alpha"], &[p.to_str().unwrap(), "16"]);
    assert_eq!(read_line(&mut child), "ready\n");
    let pcomp = &c.components("pcomponent")[0]["stats"];
    let pid = pcomp["processes"][0]["pid"].as_u64().unwrap().to_string();
    assert_eq!(pcomp["processes"][0]["vnode"], "alpha");
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let addr = "0x200000000000";
    let ok = c.cmd(&["debug", "fetch", "--mcomp", &m, "--vnode", "alpha", "--pid", &pid, "--vaddr", addr]).output().unwrap();
    assert!(ok.status.success(), "the process's own vNode may read: {}", text(&ok.stderr));
    let bad = c.cmd(&["debug", "fetch", "--mcomp", &m, "--vnode", "beta", "--pid", &pid, "--vaddr", addr]).output().unwrap();
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("Denied"), "{}", text(&bad.stderr));
    drop(child.stdin.take());
    assert!(child.wait_with_output().unwrap().status.success());
    assert!(c.log("mem0").contains("refused a request for another vNode"));
}

#[test]
fn out_of_memory_fails_malloc_not_the_cluster() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\ncapacity = \"96M\"\n"));
    let p = program("oom");
    let out = c.run(&[], &[p.to_str().unwrap()]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(s.contains("malloc returned NULL with ENOMEM") && s.contains("malloc works: 1"), "{s}");
    let m = program("memtouch");
    let again = c.run(&[], &[m.to_str().unwrap(), "8"]);
    assert_eq!(text(&again.stdout), text(&native(&[m.to_str().unwrap(), "8"]).stdout), "the cluster keeps serving");
}

#[test]
fn malformed_frames_are_rejected_and_others_still_served() {
    let c = TestCluster::up(None);
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let header = |len: u32| {
        let mut h = Vec::new();
        h.extend_from_slice(b"SPOS");
        h.extend_from_slice(&1u16.to_le_bytes());
        h.extend_from_slice(&[0, 0]);
        h.extend_from_slice(&1u64.to_le_bytes());
        h.extend_from_slice(&len.to_le_bytes());
        h.extend_from_slice(&[0; 4]);
        h
    };
    let garbage: Vec<Vec<u8>> = vec![b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), header(1 << 30), { let mut h = header(100); h.extend_from_slice(&[0xff; 100]); h }, header(64)[..10].to_vec()];
    for g in garbage {
        let mut s = std::net::TcpStream::connect(&m).unwrap();
        s.write_all(&g).unwrap();
        let _ = s.shutdown(std::net::Shutdown::Write);
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        assert!(buf.is_empty(), "garbage gets no reply, only a closed connection");
    }
    // The pComponent's program socket gets garbage too.
    let sock = c.dir.path().join("proc0.sock");
    let mut u = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    u.write_all(&[0x41; 10]).unwrap();
    drop(u);
    let p = program("memtouch");
    let out = c.run(&[], &[p.to_str().unwrap(), "8"]);
    assert_eq!(text(&out.stdout), text(&native(&[p.to_str().unwrap(), "8"]).stdout), "{}", text(&out.stderr));
    assert!(c.log("mem0").contains("rejected malformed frame") || c.log("mem1").contains("rejected malformed frame"));
    assert!(c.log("proc0").contains("malformed hello"));
}

#[test]
fn a_dead_mcomponent_is_named_in_the_error() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let p = program("hold");
    let mut child = c.spawn(&[], &[p.to_str().unwrap(), "16"]);
    assert_eq!(read_line(&mut child), "ready\n");
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let mem_pid = c.state_pids()[1];
    unsafe { libc::kill(mem_pid, libc::SIGKILL) };
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("mComponent") && err.contains(&m), "the error names the component: {err}");
}

#[test]
fn unreachable_cluster_and_bad_config_are_named() {
    let out = std::process::Command::new(splitos()).args(["run", "--gm", "127.0.0.1:9", "--", "true"]).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("127.0.0.1:9"), "{}", text(&out.stderr));
    let dir = tempfile::tempdir().unwrap();
    for (cfg, field) in [
        ("[[pcomponent]]\nexcahce = \"4M\"\n[[mcomponent]]\n", "excahce"),
        ("[[pcomponent]]\nexcache = \"4Q\"\n[[mcomponent]]\n", "excache"),
        ("[[pcomponent]]\nways = -1\n[[mcomponent]]\n", "ways"),
        ("[[pcomponent]]\n", "mcomponent"),
    ] {
        let f = dir.path().join("bad.toml");
        std::fs::write(&f, cfg).unwrap();
        let out = std::process::Command::new(splitos()).args(["cluster", "up", "--config"]).arg(&f).env("SPLITOS_STATE_DIR", dir.path()).output().unwrap();
        assert_ne!(out.status.code(), Some(0));
        assert!(text(&out.stderr).contains(field), "error for {cfg:?} names {field}: {}", text(&out.stderr));
    }
}

#[test]
fn knobs_of_a_configured_cluster_take_effect() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\nfault_workers = 3\n[[mcomponent]]\nworkers = 2\n"));
    let p = program("hold");
    let mut child = c.spawn(&[], &[p.to_str().unwrap(), "8"]);
    assert_eq!(read_line(&mut child), "ready\n");
    let pids = c.state_pids();
    let threads = |pid: i32, prefix: &str| {
        std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().filter(|t| {
            let comm = std::fs::read_to_string(t.as_ref().unwrap().path().join("comm")).unwrap_or_default();
            comm.starts_with(prefix)
        }).count()
    };
    assert_eq!(threads(pids[2], "fault"), 3, "three fault workers serve the process");
    assert_eq!(threads(pids[1], "mcomp-w"), 2, "two mComponent workers");
    let pcomp = &c.components("pcomponent")[0]["stats"]["excache"];
    assert_eq!(pcomp["capacity_bytes"], 4 << 20);
    drop(child.stdin.take());
    assert!(child.wait_with_output().unwrap().status.success());
    let out = c.cmd(&["cluster", "metrics"]).output().unwrap();
    assert!(text(&out.stdout).contains("pcomp_misses_total"), "Prometheus counters: {}", text(&out.stdout));
}

#[test]
fn a_dead_pcomponent_stops_its_programs_with_a_message() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let p = program("hold");
    let mut child = c.spawn(&[], &[p.to_str().unwrap(), "8"]);
    assert_eq!(read_line(&mut child), "ready\n");
    let os_pid = c.components("pcomponent")[0]["stats"]["processes"][0]["os_pid"].as_i64().unwrap() as i32;
    let pcomp_addr = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    unsafe { libc::kill(c.state_pids()[2], libc::SIGKILL) };
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("pComponent") && err.contains(&pcomp_addr), "{err}");
    assert!(!std::path::Path::new(&format!("/proc/{os_pid}")).exists(), "the program does not outlive its pComponent");
}
