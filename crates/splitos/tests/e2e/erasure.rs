//! Erasure-coded memory (`replication = "ec"`, docs/failures.md): one copy of each page,
//! striped over k mComponents, and their XOR parity on one more. Real programs with an ExCache
//! far smaller than their heaps run while members of their sets are killed, and print what
//! they print natively; the mComponents that did the work (parity updates, rebuilds from
//! parity, reconstructions) show it in their own counters.
use crate::common;

use common::*;

/// `mcomps` mComponents with `scheme`, vRegions of 4 MiB so that a program's heap spreads
/// over all of them, an ExCache of 4 MiB.
fn cluster(mcomps: usize, scheme: &str) -> TestCluster {
    TestCluster::up(Some(&format!("[cluster]\nvregion_size = \"4M\"\nreclaim_dead_ms = 2000\nreplication = \"{scheme}\"\n[[pcomponent]]\nexcache = \"4M\"\n{}", "[[mcomponent]]\n".repeat(mcomps))))
}

/// The striped set of `pid`'s vRegions that sets hold in common, as (data places, parity).
fn places(sets: &[Vec<u64>], k: usize) -> Vec<(Vec<u64>, u64)> {
    sets.iter().map(|s| (s[..k].to_vec(), s[k])).collect()
}

/// The mComponent holding the most data places of `pid`'s sets, other than its home.
fn busiest_data_member(c: &TestCluster, pid: u64, k: usize) -> String {
    let (home, sets) = home_of(c, pid);
    let mut count: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for (data, _) in places(&sets, k) {
        for id in data {
            *count.entry(id).or_default() += 1;
        }
    }
    let mut ids: Vec<(usize, u64)> = count.into_iter().map(|(id, n)| (n, id)).collect();
    ids.sort();
    ids.into_iter()
        .rev()
        .map(|(_, id)| addr_of(c, id))
        .find(|a| *a != home)
        .expect("a data member other than the home")
}

fn used(c: &TestCluster) -> u64 {
    mcomp_stats(c)
        .iter()
        .map(|m| m["stats"]["used"].as_u64().unwrap())
        .sum()
}

#[test]
fn a_c_hash_table_survives_losing_a_data_member_then_a_parity_member_with_a_rebuild_between() {
    // ec:2 on five mComponents: a set takes three, and two are left for rebuilding onto.
    let c = cluster(5, "ec:2");
    let table = program("hashtable");
    let cmd = [table.to_str().unwrap(), "100000"];
    let (out, err, ok) = run_phased(&c, &cmd, |c, phase, pid| {
        let (home, sets) = home_of(c, pid);
        assert!(
            sets.iter().all(|s| s.len() == 3),
            "two data places and a parity place: {sets:?}"
        );
        let victim = if phase == 1 {
            busiest_data_member(c, pid, 2)
        } else {
            places(&sets, 2)
                .into_iter()
                .map(|(_, p)| addr_of(c, p))
                .find(|a| *a != home)
                .expect("a parity member other than the home")
        };
        c.kill_component(c.pid_of_addr(&victim));
        wait_rebuilt(c, pid, 3);
    });
    assert!(ok, "{err}");
    assert_eq!(out, native_phased(&cmd), "{err}");
    // The parity members applied the owners' changes, and the lost places were rebuilt from
    // parity (the home's counter), not copied.
    assert!(mcomp_metric(&c, "splitos_mcomp_parity_deltas_applied_total") > 0.0);
    assert!(
        mcomp_metric(&c, "splitos_mcomp_rebuilt_pages_total") > 0.0,
        "pages were rebuilt from parity"
    );
    assert!(mcomp_metric(&c, "splitos_mcomp_rebuilt_vregions_total") >= 2.0);
    assert_eq!(
        used(&c),
        0,
        "everything is released when the program ends, rebuilt places too"
    );
}

#[test]
fn cpython_and_sqlite_survive_a_lost_member_of_an_ec4_cluster_and_restarts_of_the_global_managers() {
    let port = restartable_port();
    let gm_addr = format!("127.0.0.1:{port}");
    let c = TestCluster::up(Some(&format!(
        "[cluster]\ngm = \"{gm_addr}\"\nforget_dead_ms = 6000\nvregion_size = \"4M\"\nreclaim_dead_ms = 2000\nreplication = \"ec\"\n[[pcomponent]]\nexcache = \"4M\"\n{}",
        "[[mcomponent]]\n".repeat(7)
    )));
    python_phases_as_native(&c, |c, phase, round, pid| {
        if phase == 1 {
            // Four data places and a parity place, each on another mComponent: five of the
            // seven, and one left after each round's loss.
            c.kill_component(c.pid_of_addr(&busiest_data_member(c, pid, 4)));
            wait_rebuilt(c, pid, 5);
        } else {
            // The global managers are never on the data path, striped sets' neither.
            restart_gm_and_wait(c, &gm_addr, round, 6 - round);
        }
    });
    assert!(mcomp_metric(&c, "splitos_mcomp_rebuilt_vregions_total") >= 2.0);
}

#[test]
fn a_corrupted_page_is_rebuilt_from_the_parity() {
    let c = cluster(3, "ec:2");
    // The first stripe unit of each vRegion is held by its set's first data place.
    let (child, pid) = spawn_hold(&c, 24);
    flip_each_vregion_and_expect_rebuilt(&c, child, pid, 777, "from parity");
}

#[test]
fn losing_two_places_of_a_set_at_once_ends_the_program_with_an_error_naming_what_was_lost() {
    let c = cluster(4, "ec:2");
    let (child, pid) = spawn_hold(&c, 24);
    let (home, sets) = home_of(&c, pid);
    // Two places of a set on three mComponents, neither of them the home (at most one of the
    // three is): two data places, or a data place and the parity.
    let set = sets
        .iter()
        .find(|s| s.iter().collect::<std::collections::HashSet<_>>().len() == 3)
        .expect("a set on three mComponents");
    let both: Vec<String> = set
        .iter()
        .map(|id| addr_of(&c, *id))
        .filter(|a| *a != home)
        .take(2)
        .collect();
    let err = hold_fails_after_losing(&c, child, &both);
    assert!(
        err.contains("mComponent") && both.iter().any(|a| err.contains(a.as_str())),
        "{err}"
    );
}

#[test]
fn ec_is_a_knob_of_the_cluster_and_of_run_and_costs_a_fraction_of_a_copy() {
    let hold = program("hold");
    let hold = hold.to_str().unwrap();
    let held = |scheme: &str| {
        let c = cluster(5, scheme);
        let mut child = c.spawn(&[], &[hold, "24"]);
        assert_eq!(read_line(&mut child), "ready\n");
        let pid = c.process_of(&child)["pid"].as_u64().unwrap();
        let sets = home_of(&c, pid).1;
        let bytes = used(&c);
        assert!(mcomp_stats(&c).iter().all(|m| m["stats"]["replication"] == scheme));
        assert_hold_ends_native(child);
        (sets, bytes)
    };
    let (sets, one) = held("none");
    assert!(sets.iter().all(|s| s.len() == 1));
    let (sets, ec) = held("ec:4");
    assert!(
        sets.iter()
            .all(|s| s.len() == 5 && s.iter().collect::<std::collections::HashSet<_>>().len() == 5),
        "five places on five mComponents: {sets:?}"
    );
    // A copy of each page and a parity row per four: 1.25 times the data.
    let ratio = ec as f64 / one as f64;
    assert!(
        (1.2..=1.3).contains(&ratio),
        "ec:4 holds {ec} bytes for {one} of data ({ratio:.3}x)"
    );
    // Schemes and sizes that cannot work are refused by name.
    let dir = tempfile::tempdir().unwrap();
    for (bad, vrs, why) in [
        ("ec:3", "4M", "2, 4 or 8"),
        ("log", "4M", "sComponent"),
        ("ec:8", "256K", "rows"),
    ] {
        let f = dir.path().join("bad.toml");
        std::fs::write(
            &f,
            format!("[cluster]\nreplication = \"{bad}\"\nvregion_size = \"{vrs}\"\n[[pcomponent]]\n[[mcomponent]]\n"),
        )
        .unwrap();
        let out = std::process::Command::new(splitos())
            .args(["cluster", "up", "--config"])
            .arg(&f)
            .env("SPLITOS_STATE_DIR", dir.path().join("state"))
            .output()
            .unwrap();
        assert!(
            !out.status.success() && text(&out.stderr).contains(why),
            "{bad}: {}",
            text(&out.stderr)
        );
    }
    // The embedded cluster of `run` takes the option: every page written back reaches one
    // mComponent, and its change the parity member.
    let (_, s) = stats_of(
        &[
            "--embedded",
            "--mcomponents",
            "3",
            "--replication",
            "ec:2",
            "--vregion-size",
            "4M",
            "--excache",
            "4M",
        ],
        &[hold, "16"],
    );
    assert!(
        s["mcomponents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["replication"] == "ec:2"),
        "{s}"
    );
    assert!(
        n(&s, "flushes") > 0 && mcomp_sum(&s, "flushes") < 2 * n(&s, "flushes"),
        "one copy of each page: {s}"
    );
    assert!(mcomp_sum(&s, "parity_deltas_applied") > 0, "{s}");
}

#[test]
fn a_large_munmap_sends_what_it_frees_to_the_parity() {
    // 48 MiB written through a 4 MiB ExCache, then freed at once: every page written back is
    // a change to zero for the parity, far more than one message can carry.
    let py = python3();
    let prog = "b = bytearray(48 << 20)\nfor i in range(0, len(b), 4096):\n    b[i] = i % 251 + 1\nprint(sum(b[::4096]))\ndel b\nc = bytearray(8 << 20)\nprint(len(c))\n";
    let cmd = [py.as_str(), "-c", prog];
    let (out, s) = stats_of(
        &[
            "--embedded",
            "--mcomponents",
            "5",
            "--replication",
            "ec",
            "--vregion-size",
            "16M",
            "--excache",
            "4M",
        ],
        &cmd,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), text(&native(&cmd).stdout));
    // The parity members took the changes of the pages written back and of those freed.
    assert!(mcomp_sum(&s, "parity_deltas_applied") > 15_000, "{s}");
}
