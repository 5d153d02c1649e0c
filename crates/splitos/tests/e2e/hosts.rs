//! A cluster whose components run on separate hosts (network namespaces linked by a bridge,
//! `common::Hosts`), from a configuration that names their addresses: losing a host or its
//! link as on real machines, not one process on loopback.
use crate::common;
use std::time::Duration;

use common::*;

#[test]
fn a_cluster_of_hosts_survives_a_partition_and_releases_a_lost_hosts_memory() {
    let h = Hosts::new(&["gm", "p1", "p2", "m1", "m2"]);
    let at = |host: &str| format!("listen = \"{}:0\"\nnetns = \"{}\"\n", h.addr(host), h.netns(host));
    let cfg = format!(
        "[cluster]\ngm = \"{}:0\"\nnetns = \"{}\"\nreclaim_dead_ms = 1500\nvregion_size = \"4M\"\n[[pcomponent]]\n{}excache = \"4M\"\n[[pcomponent]]\n{}excache = \"4M\"\n[[mcomponent]]\n{}[[mcomponent]]\n{}",
        h.addr("gm"),
        h.netns("gm"),
        at("p1"),
        at("p2"),
        at("m1"),
        at("m2")
    );
    let c = TestCluster::up(Some(&cfg));
    // Each component is on its host.
    let addrs: Vec<String> = c.status()["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["addr"].as_str().unwrap().to_string())
        .collect();
    for host in ["p1", "p2", "m1", "m2"] {
        assert_eq!(
            addrs
                .iter()
                .filter(|a| a.starts_with(&format!("{}:", h.addr(host))))
                .count(),
            1,
            "{host}: {addrs:?}"
        );
    }
    let (doomed, survivor, doomed_pid, survivor_pid) = hold_on_both_pcomponents(&c);
    let holding = mcomponents_holding;
    assert_eq!(
        (holding(&c, doomed_pid), holding(&c, survivor_pid)),
        (2, 2),
        "both heaps are spread over both mComponent hosts"
    );

    // m2's host is cut off for longer than the global managers wait for a heartbeat, then
    // comes back: they see it dead, then alive, and nothing it holds is lost.
    let m2_alive = |c: &TestCluster| {
        c.components("mcomponent")
            .into_iter()
            .find(|m| m["addr"].as_str().unwrap().starts_with(&h.addr("m2")))
            .unwrap()["alive"]
            == true
    };
    h.link("m2", false);
    assert!(
        c.eventually(Duration::from_secs(10), |c| !m2_alive(c)),
        "the global managers see m2 gone"
    );
    h.link("m2", true);
    assert!(c.eventually(Duration::from_secs(10), m2_alive), "and back");

    // p1's host is lost, all its processes at once: its program is stopped, naming its
    // pComponent, and both mComponent hosts release its memory.
    for pid in h.pids("p1") {
        forget_pid(c.dir.path(), pid);
        // SAFETY: kill(2) takes no pointers; these are the processes of this test's own host.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let out = doomed.wait_with_output().unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("went away"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        c.eventually(Duration::from_secs(15), |c| holding(c, doomed_pid) == 0),
        "the lost host's process is released"
    );
    assert_eq!(holding(&c, survivor_pid), 2);
    // The other program reads its whole heap back from both mComponent hosts.
    assert_hold_ends_native(survivor);
}

#[test]
fn replicated_memory_survives_a_partitioned_mcomponent_that_comes_back_fenced_and_a_lost_host() {
    // Three mComponent hosts: replication is `replica` by default.
    partition_then_lost_host(3, None, 2, 100_000, "4M");
}

#[test]
fn erasure_coded_memory_survives_a_partitioned_mcomponent_that_comes_back_fenced_and_a_lost_host() {
    // Sets of three places (two data, one parity) on four hosts: one to spare. A smaller
    // table and ExCache: a write-back here is two round trips between hosts in a row.
    partition_then_lost_host(4, Some("ec:2"), 3, 40_000, "1M");
}

/// A C hash table of `entries` runs with an ExCache of `excache` on a cluster of `mhosts`
/// mComponent hosts with `scheme` (the default if none) whose sets have `members` members. After phase 1 a member's host is cut off until
/// its places are rebuilt elsewhere, then comes back and is fenced; after phase 2 the home's
/// host is lost, all its processes at once.
#[test]
fn logged_memory_survives_a_partitioned_mcomponent_that_comes_back_fenced_and_a_lost_host() {
    // The backup files on the global managers' host: a cut-off logger cannot reach them
    // either, and when it is back its stale records are refused there.
    partition_then_lost_host(3, Some("log"), 2, 100_000, "4M");
}

fn partition_then_lost_host(mhosts: usize, scheme: Option<&str>, members: usize, entries: u32, excache: &str) {
    let mut names = vec!["gm".to_string(), "p1".to_string()];
    names.extend((1..=mhosts).map(|i| format!("m{i}")));
    let h = Hosts::new(&names.iter().map(String::as_str).collect::<Vec<_>>());
    let at = |host: &str| format!("listen = \"{}:0\"\nnetns = \"{}\"\n", h.addr(host), h.netns(host));
    let mut cfg = format!(
        "[cluster]\ngm = \"{}:0\"\nnetns = \"{}\"\nreclaim_dead_ms = 1500\nvregion_size = \"4M\"\n",
        h.addr("gm"),
        h.netns("gm")
    );
    if let Some(scheme) = scheme {
        cfg += &format!("replication = \"{scheme}\"\n");
    }
    cfg += &format!("[[pcomponent]]\n{}excache = \"{excache}\"\n", at("p1"));
    if scheme == Some("log") {
        cfg += &format!("[[scomponent]]\n{}", at("gm"));
    }
    for m in &names[2..] {
        cfg += &format!("[[mcomponent]]\n{}", at(m));
    }
    let c = TestCluster::up(Some(&cfg));
    let host_of = |addr: &str| {
        names[2..]
            .iter()
            .find(|m| addr.starts_with(&format!("{}:", h.addr(m))))
            .unwrap()
            .clone()
    };
    let table = program("hashtable");
    let entries = entries.to_string();
    let cmd = [table.to_str().unwrap(), entries.as_str()];
    let (out, err, ok) = run_phased(&c, &cmd, |c, phase, pid| {
        let (home, sets) = home_of(c, pid);
        if phase == 1 {
            // A member's host is cut off for longer than the global managers wait: the home
            // rebuilds its places elsewhere; when the link is back, the host is fenced and
            // drops what it holds (it may be older than what was rebuilt).
            let cut = sets
                .iter()
                .flatten()
                .map(|id| addr_of(c, *id))
                .find(|a| *a != home)
                .unwrap();
            let cut_id = c
                .components("mcomponent")
                .into_iter()
                .find(|m| m["addr"] == cut.as_str())
                .unwrap()["id"]
                .as_u64()
                .unwrap();
            h.link(&host_of(&cut), false);
            let moved = c.eventually(Duration::from_secs(30), |c| {
                try_home_of(c, pid)
                    .is_some_and(|(_, sets)| sets.iter().all(|s| s.len() == members && !s.contains(&cut_id)))
            });
            assert!(
                moved,
                "the places on the cut host are rebuilt elsewhere: {:?}",
                try_home_of(c, pid)
            );
            h.link(&host_of(&cut), true);
            let fenced = c.eventually(Duration::from_secs(30), |c| {
                c.components("mcomponent")
                    .into_iter()
                    .any(|m| m["addr"] == cut.as_str() && m["alive"] == true && m["stats"]["used"] == 0)
            });
            assert!(fenced, "the host that came back holds nothing: {:?}", mcomp_stats(c));
            assert_eq!(c.metric(&cut, "splitos_mcomp_fenced_total"), 1.0);
        } else {
            // The home's host is lost, all its processes at once.
            for p in h.pids(&host_of(&home)) {
                forget_pid(c.dir.path(), p);
                // SAFETY: kill(2) takes no pointers; these are the processes of this test's own host.
                unsafe { libc::kill(p, libc::SIGKILL) };
            }
        }
    });
    assert!(ok, "{err}");
    assert_eq!(out, native_phased(&cmd), "{err}");
    assert!(mcomp_metric(&c, "splitos_mcomp_home_takeovers_total") >= 1.0);
}

/// A configuration that spans machines: `cluster up` starts only this machine's components and
/// names the others; the other host joins with a join token (credentials over the API's
/// HTTPS, its authority checked against the token's pin), and its mComponent registers and
/// takes memory.
#[test]
fn cluster_up_starts_only_this_machines_components_and_another_host_joins() {
    let h = Hosts::new(&["m2"]);
    let (here, there) = (h.bridge_addr(), format!("{}:7000", h.addr("m2")));
    let cfg = format!(
        "[cluster]\ngm = \"{here}:0\"\napi = \"{here}:0\"\nvregion_size = \"4M\"\n[[pcomponent]]\nlisten = \"{here}:0\"\nexcache = \"4M\"\n[[mcomponent]]\nlisten = \"{here}:0\"\n[[mcomponent]]\nlisten = \"{there}\"\n"
    );
    let c = TestCluster::up(Some(&cfg));
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.dir.path().join("cluster.json")).unwrap()).unwrap();
    assert_eq!(
        state["elsewhere"],
        serde_json::json!([format!("mem1 at {there}")]),
        "{state}"
    );
    assert_eq!(
        c.components("mcomponent").len(),
        1,
        "only this machine's mComponent started"
    );
    // Said once, in its summary, not also as a log line.
    let said = std::fs::read_to_string(c.dir.path().join("up.stderr")).unwrap();
    assert!(!said.contains("INFO"), "{said}");
    let api = state["api"].as_str().unwrap().to_string();
    // Beyond loopback the API is HTTPS, and what people read says so.
    let status = c.cmd(&["cluster", "status"]).output().unwrap();
    assert!(
        text(&status.stdout).contains(&format!("REST API at https://{api}")),
        "{}",
        text(&status.stdout)
    );
    let join_token = |c: &TestCluster| {
        let out = c.cmd(&["cluster", "join-token", "--role", "mem"]).output().unwrap();
        // Its expiry as a date and how long, not as Unix time.
        assert!(
            out.status.success()
                && text(&out.stderr).contains(" UTC, in 1h00m)")
                && !text(&out.stderr).contains("unix"),
            "{}",
            text(&out.stderr)
        );
        text(&out.stdout).trim().to_string()
    };
    // On the other machine, which has nothing of the cluster's yet.
    let bin = splitos();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("etc");
    let join = |token: &str| {
        h.exec(
            "m2",
            &[
                bin.to_str().unwrap(),
                "join",
                "--token",
                token,
                "--out",
                out.to_str().unwrap(),
                "--listen",
                &there,
                &api,
            ],
        )
        .output()
        .unwrap()
    };
    // A token whose pin is another authority's is not sent.
    let token = join_token(&c);
    let forged = format!("{}{}", &token[..token.len() - 64], "0".repeat(64));
    let refused = join(&forged);
    assert!(
        !refused.status.success() && text(&refused.stderr).contains("is not the one the join token names"),
        "{}",
        text(&refused.stderr)
    );
    let joined = join(&token);
    assert!(joined.status.success(), "{}", text(&joined.stderr));
    let again = join(&token);
    assert!(
        !again.status.success() && text(&again.stderr).contains("not a valid join token"),
        "a join token works once: {}",
        text(&again.stderr)
    );
    // The env file holds all its unit needs: the managers and where to listen.
    let env = std::fs::read_to_string(out.join("mem.env")).unwrap();
    let gm = env
        .lines()
        .find_map(|l| l.strip_prefix("SPLITOS_GM="))
        .unwrap_or_else(|| panic!("{env}"))
        .to_string();
    assert!(env.lines().any(|l| l == format!("SPLITOS_LISTEN={there}")), "{env}");
    let log = std::fs::File::create(c.dir.path().join("m2.log")).unwrap();
    let child = {
        use std::os::unix::process::CommandExt;
        h.exec(
            "m2",
            &[
                bin.to_str().unwrap(),
                "mem",
                "--gm",
                &gm,
                "--listen",
                &there,
                "--credentials",
                out.join("mem.cred").to_str().unwrap(),
            ],
        )
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .process_group(0)
        .spawn()
        .unwrap()
    };
    remember_pid(c.dir.path(), child.id() as i32);
    assert!(
        c.eventually(Duration::from_secs(15), |c| mcomp_stats(c)
            .iter()
            .any(|m| m["addr"] == there.as_str())),
        "{}",
        c.log("m2")
    );
    let gm_addr = c.status()["gm"].as_str().unwrap().to_string();
    assert_eq!(c.metric(&gm_addr, "splitos_gm_joins_total"), 1.0);
    assert_eq!(
        c.metric(&gm_addr, "splitos_gm_joins_refused_total"),
        1.0,
        "the used token's second try"
    );
    // A heap larger than one mComponent's share spreads to the one that joined.
    let (child, _) = spawn_hold(&c, 24);
    let remote_used = |c: &TestCluster| {
        mcomp_stats(c)
            .iter()
            .find(|m| m["addr"] == there.as_str())
            .and_then(|m| m["stats"]["used"].as_u64())
            .unwrap_or(0)
    };
    assert!(
        c.eventually(Duration::from_secs(10), |c| remote_used(c) > 0),
        "the joined mComponent holds part of the heap: {:?}",
        mcomp_stats(&c)
    );
    assert_hold_ends_native(child);
}
