//! Elastic memory (docs/elastic-memory.md): an mComponent detached while a C hash table with a
//! small ExCache runs, under each replication scheme (none, replica, log, ec), moves every vRegion and home it holds to
//! the others and exits; the program prints what it prints natively, and the components that
//! did the work show it in their own counters. A standby mComponent takes nothing until
//! attached. Bad input: an unknown component, the last mComponent, two detaches at once, a
//! tenant's token.
mod common;
use std::time::Duration;

use common::*;

fn cluster(scheme: &str, mcomps: usize, extra: &str) -> TestCluster {
    TestCluster::up(Some(&format!("[cluster]\nvregion_size = \"4M\"\nreplication = \"{scheme}\"\n[[pcomponent]]\nexcache = \"2M\"\n{}{extra}", "[[mcomponent]]\n".repeat(mcomps))))
}

fn splitos_ok(c: &TestCluster, args: &[&str]) -> String {
    let out = c.cmd(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

fn splitos_fails(c: &TestCluster, args: &[&str]) -> String {
    let out = c.cmd(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} should fail: {}", text(&out.stdout));
    text(&out.stderr)
}

/// Detaches the home of the hash table's process after its first phase (it holds vRegions
/// too) and checks it is gone and the program's output native.
fn detach_the_home_mid_run(scheme: &str, mcomps: usize) {
    // A logged set's backup file goes to an sComponent.
    let c = cluster(scheme, mcomps, if scheme == "log" { "[[scomponent]]\n" } else { "" });
    let table = program("hashtable");
    // Every write-back of a logged set is also logged and streamed to disk: a smaller table.
    let cmd = [table.to_str().unwrap(), if scheme == "log" { "30000" } else { "100000" }];
    let mut detached = String::new();
    let (out, err, ok) = run_phased(&c, &cmd, |c, phase, pid| {
        if phase != 1 {
            return;
        }
        let (home, sets) = home_of(c, pid);
        let id = c.components("mcomponent").into_iter().find(|m| m["addr"] == home.as_str()).unwrap()["id"].as_u64().unwrap();
        assert!(sets.iter().any(|s| s.contains(&id)), "{scheme}: the home holds vRegions too: {sets:?}");
        let pid_of_home = c.pid_of_addr(&home);
        let said = splitos_ok(c, &["memory", "detach", &id.to_string(), "--timeout", "60"]);
        assert!(said.contains("detached in"), "{said}");
        assert!(c.eventually(Duration::from_secs(5), |_| !pid_running(pid_of_home)), "the detached mComponent exited");
        assert!(c.components("mcomponent").iter().all(|m| m["id"] != id), "{scheme}: the managers forgot it");
        let (_, sets) = home_of(c, pid);
        assert!(sets.iter().all(|s| !s.contains(&id)), "{scheme}: no set names it: {sets:?}");
        detached = id.to_string();
    });
    assert!(ok, "{scheme}: {err}");
    assert_eq!(out, native_phased(&cmd), "{scheme}: {err}");
    assert!(!detached.is_empty());
    // The new home adopted the process; the homes moved vRegions by copying pages.
    assert_eq!(mcomp_metric(&c, "splitos_mcomp_homes_adopted_total"), 1.0, "{scheme}");
    assert!(mcomp_metric(&c, "splitos_mcomp_vregions_moved_total") > 0.0, "{scheme}");
    assert!(c.metric(c.components("pcomponent")[0]["addr"].as_str().unwrap(), "splitos_pcomp_home_moves_total") == 1.0, "{scheme}: the pComponent was told the new home");
    let used: u64 = mcomp_stats(&c).iter().map(|m| m["stats"]["used"].as_u64().unwrap()).sum();
    assert_eq!(used, 0, "{scheme}: everything is released when the program ends");
}

#[test]
fn detaching_the_home_of_a_running_c_hash_table_without_replication() {
    detach_the_home_mid_run("none", 3);
}

#[test]
fn detaching_the_home_of_a_running_c_hash_table_with_replicas() {
    detach_the_home_mid_run("replica", 3);
}

#[test]
fn detaching_the_home_of_a_running_c_hash_table_logged() {
    detach_the_home_mid_run("log", 3);
}

#[test]
fn detaching_the_home_of_a_running_c_hash_table_erasure_coded() {
    // ec:2 places three mComponents per set: a fourth takes the leaving one's place.
    detach_the_home_mid_run("ec:2", 4);
}

#[test]
fn standby_memory_takes_nothing_until_attached_and_detach_refuses_bad_requests() {
    let c = cluster("none", 1, "[[mcomponent]]\nstandby = true\n");
    let mems = c.components("mcomponent");
    let standby = mems.iter().find(|m| m["cordoned"] == true).expect("the standby mComponent joined cordoned")["id"].as_u64().unwrap().to_string();
    let first = mems.iter().find(|m| m["cordoned"] == false).unwrap()["id"].as_u64().unwrap().to_string();
    let listed = splitos_ok(&c, &["memory", "list"]);
    assert!(listed.contains("cordoned") && listed.contains("attached"), "{listed}");

    // The last mComponent that takes memory cannot leave; nor can a pComponent or nothing.
    assert!(splitos_fails(&c, &["memory", "detach", &first]).contains("is the last mComponent that takes memory"));
    let pcomp = c.components("pcomponent")[0]["id"].to_string();
    assert!(splitos_fails(&c, &["memory", "detach", &pcomp]).contains("only mComponents are detached"));
    assert!(splitos_fails(&c, &["memory", "detach", "12345"]).contains("no component has id 12345"));

    // A tenant may not detach or attach.
    let tenant = api_token(&c, &["elastic-tenant", "--vnode", "default"]);
    assert!(splitos_fails(&c, &["memory", "attach", &standby, "--token", &tenant]).contains("403"));

    // Attached, it takes the next program's memory; the first one, detached while nothing
    // runs, exits.
    assert!(splitos_ok(&c, &["memory", "attach", &standby]).contains("attached"));
    let said = splitos_ok(&c, &["memory", "detach", &first, "--no-wait"]);
    assert!(said.contains("detaching"), "{said}");
    // A second detach while one is under way is refused, and so is detaching the last one.
    let again = splitos_fails(&c, &["memory", "detach", &standby]);
    assert!(again.contains("one detach at a time") || again.contains("last mComponent"), "{again}");
    assert!(c.eventually(Duration::from_secs(20), |c| c.components("mcomponent").len() == 1), "the detached mComponent is gone");
    let py = python3();
    let prog = [py.as_str(), "-c", "x = {i: str(i) * 3 for i in range(100000)}; print(len(x), sum(map(len, x.values())))"];
    let out = c.run(&[], &prog);
    assert_eq!(text(&out.stdout), text(&native(&prog).stdout), "{}", text(&out.stderr));
    let m = &c.components("mcomponent")[0];
    assert_eq!(m["id"].as_u64().unwrap().to_string(), standby);
    assert!(
        m["stats"]["flushes"].as_u64().unwrap() > 0 || m["stats"]["fetches"].as_u64().unwrap() > 0 || c.metric(m["addr"].as_str().unwrap(), "splitos_mcomp_requests_total") > 0.0,
        "the attached mComponent served the program: {m}"
    );
}
