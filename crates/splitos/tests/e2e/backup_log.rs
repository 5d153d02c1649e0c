//! LegoOS's memory replication (`replication = "log"`, docs/failures.md): each vRegion on a
//! primary mComponent, every write-back also appended to a small log on a logger mComponent,
//! which streams it to a backup file on an sComponent. Real programs with an ExCache far
//! smaller than their heaps run while components are killed or stalled under them, and print
//! what they print natively (or fail with an error naming what was lost, never with wrong
//! output); the components that did the work show it in their own counters.
use crate::common;
use std::time::Duration;

use common::*;

/// `mcomps` mComponents (each with `mcomp` in its table), one sComponent, vRegions of 4 MiB
/// so that a program's heap spreads over all of them, an ExCache of 4 MiB.
fn cluster(mcomps: usize, mcomp: &str) -> TestCluster {
    TestCluster::up(Some(&format!(
        "[cluster]\nvregion_size = \"4M\"\nreclaim_dead_ms = 2000\nreplication = \"log\"\n[[pcomponent]]\nexcache = \"4M\"\n[[scomponent]]\n{}",
        format!("[[mcomponent]]\n{mcomp}").repeat(mcomps)
    )))
}

fn scomp(c: &TestCluster) -> String {
    c.components("scomponent")[0]["addr"].as_str().unwrap().to_string()
}

/// The vRegions each logger says it could not protect, by process.
fn unprotected(c: &TestCluster) -> Vec<u64> {
    mcomp_stats(c)
        .iter()
        .filter_map(|m| m["stats"]["owned_processes"].as_array().cloned())
        .flatten()
        .flat_map(|p| p["unprotected_vregions"].as_array().cloned().unwrap_or_default())
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn a_c_hash_table_survives_losing_a_primary_then_a_logger_with_a_rebuild_between() {
    let c = cluster(4, "");
    let table = program("hashtable");
    let cmd = [table.to_str().unwrap(), "100000"];
    // What the loggers made primary in phase 1 counted, read before phase 2 kills a logger,
    // which may be one of them.
    let mut promoted = (0.0, 0.0);
    let (out, err, ok) = run_phased(&c, &cmd, |c, phase, pid| {
        let (home, sets) = home_of(c, pid);
        assert!(
            sets.iter().all(|s| s.len() == 2 && s[0] != s[1]),
            "a primary and a logger: {sets:?}"
        );
        let victim = match phase {
            1 => busiest_primary(c, pid),
            _ => {
                promoted = (
                    mcomp_metric(c, "splitos_mcomp_loggers_promoted_total"),
                    mcomp_metric(c, "splitos_mcomp_log_promoted_pages_total"),
                );
                sets.iter()
                    .map(|s| addr_of(c, s[1]))
                    .find(|a| *a != home)
                    .expect("a logger other than the home")
            }
        };
        c.kill_component(c.pid_of_addr(&victim));
        wait_rebuilt(c, pid, 2);
    });
    assert!(ok, "{err}");
    assert_eq!(out, native_phased(&cmd), "{err}");
    // The loggers' write-backs reached the backup files (the sComponent's counter), a logger
    // replayed one into pages when its primary was lost, and new loggers got full copies.
    let s = scomp(&c);
    assert!(c.metric(&s, "splitos_scomp_backup_appended_bytes_total") > 0.0);
    assert!(promoted.0 >= 1.0, "a logger was made primary");
    assert!(promoted.1 > 0.0, "from the pages of its backup");
    assert!(
        mcomp_metric(&c, "splitos_mcomp_rebuilt_pages_total") > 0.0,
        "new loggers got copies"
    );
    // Everything is released when the program ends: memory, and the backup files.
    let used: u64 = mcomp_stats(&c)
        .iter()
        .map(|m| m["stats"]["used"].as_u64().unwrap())
        .sum();
    assert_eq!(used, 0);
    assert!(
        c.eventually(Duration::from_secs(10), |c| c.components("scomponent")[0]["stats"]
            ["backup_files"]["bytes"]
            == 0),
        "{:?}",
        c.components("scomponent")
    );
}

#[test]
fn cpython_and_sqlite_survive_a_lost_primary_and_restarts_of_the_global_managers() {
    let port = restartable_port();
    let gm_addr = format!("127.0.0.1:{port}");
    let c = TestCluster::up(Some(&format!(
        "[cluster]\ngm = \"{gm_addr}\"\nforget_dead_ms = 6000\nvregion_size = \"4M\"\nreclaim_dead_ms = 2000\nreplication = \"log\"\n[[pcomponent]]\nexcache = \"4M\"\n[[scomponent]]\n{}",
        "[[mcomponent]]\n".repeat(5)
    )));
    python_phases_as_native(&c, |c, phase, round, pid| {
        if phase == 1 {
            // A log that filled while the program wrote (the sComponent slower than its
            // write-backs, as on a busy machine) protects again once it drains, and the program
            // waits between phases: the primary is lost within what the log tolerates
            // (a_full_log_stops_protecting_... shows the other side).
            assert!(
                c.eventually(Duration::from_secs(30), |c| unprotected(c).is_empty()),
                "{:?}",
                mcomp_stats(c)
            );
            c.kill_component(c.pid_of_addr(&busiest_primary(c, pid)));
            wait_rebuilt(c, pid, 2);
        } else {
            // Loggers stream to the sComponent on their own: the global managers are on no path.
            restart_gm_and_wait(c, &gm_addr, round, 4 - round);
        }
    });
    assert!(mcomp_metric(&c, "splitos_mcomp_loggers_promoted_total") >= 2.0);
}

#[test]
fn a_full_log_stops_protecting_says_so_and_protects_again_once_it_drains() {
    // A log of 256 KiB: a few dozen pages while the sComponent is stalled.
    let c = cluster(3, "backup_log = \"256K\"\n");
    assert!(mcomp_stats(&c)
        .iter()
        .all(|m| m["stats"]["backup_log"]["capacity"] == 256 << 10));
    let scomp_pid = c.pid_of_addr(&scomp(&c));
    let table = program("hashtable");
    let cmd = [table.to_str().unwrap(), "100000"];
    let mut stall = None;
    let (out, err, ok) = run_phased(&c, &cmd, |c, phase, pid| {
        if phase == 1 {
            stall = Some(Stalled::new(scomp_pid));
            return;
        }
        // Phase 2 wrote back far more than the log holds: the loggers skipped, and say so.
        assert!(!unprotected(c).is_empty(), "{:?}", mcomp_stats(c));
        assert!(mcomp_metric(c, "splitos_mcomp_log_skipped_records_total") > 0.0);
        let status = text(&c.cmd(&["cluster", "status"]).output().unwrap().stdout);
        assert!(
            status.contains("unprotected:") && status.contains("backup log was full"),
            "{status}"
        );
        // The sComponent catches up: the log drains, each skipped vRegion is copied to its
        // logger again, and a primary lost now is replayed from a whole backup.
        stall = None;
        assert!(
            c.eventually(Duration::from_secs(30), |c| unprotected(c).is_empty()),
            "{:?}",
            mcomp_stats(c)
        );
        assert!(mcomp_metric(c, "splitos_mcomp_log_resyncs_total") >= 1.0);
        c.kill_component(c.pid_of_addr(&busiest_primary(c, pid)));
    });
    drop(stall);
    assert!(ok, "{err}");
    assert_eq!(out, native_phased(&cmd), "{err}");
    assert!(mcomp_metric(&c, "splitos_mcomp_loggers_promoted_total") >= 1.0);
}

#[test]
fn losing_a_primary_whose_log_was_full_ends_the_program_with_an_error_naming_it() {
    let c = cluster(3, "backup_log = \"256K\"\n");
    let scomp_pid = c.pid_of_addr(&scomp(&c));
    let table = program("hashtable");
    let cmd = [table.to_str().unwrap(), "100000"];
    let mut stall = None;
    let mut victim = String::new();
    let (out, err, ok) = run_phased(&c, &cmd, |c, phase, pid| {
        if phase == 1 {
            stall = Some(Stalled::new(scomp_pid));
            return;
        }
        let idx = unprotected(c);
        assert!(!idx.is_empty());
        // The primary of an unprotected vRegion (the home's sets are in index order).
        // A home busy with the process (a copy to a logger) leaves it out of its stats.
        let mut home = None;
        c.eventually(Duration::from_secs(30), |c| {
            home = c.components("mcomponent").into_iter().find_map(|m| {
                m["stats"]["home_processes"]
                    .as_array()?
                    .iter()
                    .find(|p| p["pid"] == pid)
                    .cloned()
            });
            home.is_some()
        });
        let home = home.expect("the process's home lists it");
        let set = home["vregions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| idx.contains(&v["index"].as_u64().unwrap()))
            .unwrap();
        victim = addr_of(c, set["owners"][0].as_u64().unwrap());
        c.kill_component(c.pid_of_addr(&victim));
        // The logger is asked when the managers announce the loss, while the program waits.
        assert!(
            c.eventually(Duration::from_secs(60), |c| mcomp_metric(
                c,
                "splitos_mcomp_log_promotions_refused_total"
            ) >= 1.0),
            "the logger refused to replay a backup that misses pages"
        );
    });
    drop(stall);
    assert!(!ok, "the program cannot go on without pages nobody has");
    assert!(native_phased(&cmd).starts_with(&out), "no output from lost data: {out}");
    assert!(
        err.contains(&victim),
        "the error names the lost mComponent {victim}: {err}"
    );
}

#[test]
fn a_corrupted_page_is_rebuilt_from_the_backup() {
    let c = cluster(3, "");
    let (child, pid) = spawn_hold(&c, 24);
    flip_each_vregion_and_expect_rebuilt(&c, child, pid, 4242, "from the loggers' backups");
}

#[test]
fn log_is_a_knob_that_costs_no_second_copy_in_memory_and_refuses_bad_appends() {
    let hold = program("hold");
    let hold = hold.to_str().unwrap();
    let c = cluster(3, "");
    let (child, pid) = spawn_hold(&c, 24);
    assert!(mcomp_stats(&c).iter().all(|m| m["stats"]["replication"] == "log"));
    assert!(home_of(&c, pid).1.iter().all(|s| s.len() == 2 && s[0] != s[1]));
    // One copy in memory (the loggers hold none); the backup is on the sComponent's disk.
    let used: u64 = mcomp_stats(&c)
        .iter()
        .map(|m| m["stats"]["used"].as_u64().unwrap())
        .sum();
    // 24 MiB written through a 4 MiB ExCache: about 20 MiB written back, held once.
    assert!(
        (16 << 20..=25 << 20).contains(&used),
        "{used} bytes in memory for 24 MiB, of which 4 MiB may be in the ExCache"
    );
    let s = scomp(&c);
    assert!(
        c.eventually(Duration::from_secs(10), |c| c.components("scomponent")[0]["stats"]
            ["backup_files"]["bytes"]
            .as_u64()
            .unwrap()
            >= used),
        "{:?}",
        c.components("scomponent")
    );
    assert!(c.eventually(Duration::from_secs(10), |c| mcomp_stats(c)
        .iter()
        .all(|m| m["stats"]["backup_log"]["queued_bytes"] == 0)));
    // Appends that are not records, or from a logger the file has moved past, are refused;
    // the sComponent goes on serving.
    let rpc = c.admin_rpc();
    let file = splitos_rpc::LogFile {
        vnode: "default".into(),
        pid,
        index: 1 << 40,
    };
    let bad = splitos_rpc::M2S_LOG_APPEND {
        file: file.clone(),
        epoch: 5,
        reset: true,
        records: vec![splitos_rpc::LogRecord::Page {
            vpn: 1,
            data: serde_bytes::ByteBuf::from(vec![1; 100]),
        }],
    };
    let e = rpc.call(&s, bad).unwrap_err().to_string();
    assert!(e.contains("Invalid argument"), "{e}");
    rpc.call(
        &s,
        splitos_rpc::M2S_LOG_APPEND {
            file: file.clone(),
            epoch: 5,
            reset: true,
            records: vec![],
        },
    )
    .unwrap();
    let e = rpc
        .call(
            &s,
            splitos_rpc::M2S_LOG_APPEND {
                file: file.clone(),
                epoch: 4,
                reset: false,
                records: vec![],
            },
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("Stale"), "{e}");
    assert_hold_ends_native(child);
    // The embedded cluster of `run` takes the option: every write-back reaches both members.
    let (_, st) = stats_of(
        &[
            "--embedded",
            "--mcomponents",
            "2",
            "--replication",
            "log",
            "--excache",
            "4M",
        ],
        &[hold, "16"],
    );
    assert!(
        st["mcomponents"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["replication"] == "log"),
        "{st}"
    );
    assert!(
        n(&st, "flushes") > 0 && mcomp_sum(&st, "flushes") >= 2 * n(&st, "flushes"),
        "{st}"
    );
    assert!(
        st["mcomponents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["backup_log"]["streamed_bytes"].as_u64().unwrap() > 0),
        "{st}"
    );
}

#[test]
fn a_full_scomponent_disk_is_named_as_the_cause() {
    // Dropped after the cluster: the sComponent is gone before its disk.
    let disk = SmallDisk::new("4M");
    let c = TestCluster::up(Some(&format!(
        "[cluster]\nvregion_size = \"4M\"\nreplication = \"log\"\n[[pcomponent]]\nexcache = \"4M\"\n[[scomponent]]\ndir = \"{}\"\n{}",
        disk.0.path().display(),
        "[[mcomponent]]\n".repeat(3)
    )));
    // Far more write-backs than the disk holds.
    let (child, _) = spawn_hold(&c, 24);
    let s = scomp(&c);
    assert!(
        c.eventually(Duration::from_secs(30), |c| !unprotected(c).is_empty()
            && c.metric(&s, "splitos_scomp_backup_disk_full_total") > 0.0),
        "{:?}",
        mcomp_stats(&c)
    );
    let status = text(&c.cmd(&["cluster", "status"]).output().unwrap().stdout);
    assert!(
        status.contains("the sComponent refused their backup records") && status.contains("disk is full"),
        "{status}"
    );
    // What was refused is not counted as stored: the mComponents count as streamed no more
    // than the sComponent appended (read after them, it counts before it answers), and no
    // more than the disk holds unless the sComponent compacted files to make room.
    let sum = |k: &str| {
        mcomp_stats(&c)
            .iter()
            .map(|m| m["stats"]["backup_log"][k].as_u64().unwrap())
            .sum::<u64>()
    };
    let (streamed, refused) = (sum("streamed_bytes"), sum("refused_bytes"));
    let appended = c.metric(&s, "splitos_scomp_backup_appended_bytes_total") as u64;
    let compactions = c.metric(&s, "splitos_scomp_backup_compactions_total");
    assert!(
        refused > 0 && streamed <= appended && (compactions > 0.0 || streamed <= 4 << 20),
        "streamed {streamed}, refused {refused}, appended {appended}, compactions {compactions}: {:?}",
        mcomp_stats(&c)
    );
    assert!(c.log("storage0").contains("disk is full"), "{}", c.log("storage0"));
    // The program loses nothing: its pages are on their primaries.
    assert_hold_ends_native(child);
}
