//! Logged sets (`replication = "log"`): the logger of a lost primary replays the backup file
//! and becomes primary; a log that skipped write-backs protects nothing until copied again.
//!
//! With five mComponents the managers place the first process's vRegion on 3 (primary) and
//! 4 (logger); 2 is its backup home and 5 free.
use std::sync::atomic::AtomicBool;

use super::*;

/// Bytes of a log record of a page.
const RECORD: u64 = 17 + SEALED_PAGE as u64;

fn logged(backup_log: u64) -> (Rig, Who) {
    let rig = Rig::with(5, Replication::Log, |_| 64 << 20, backup_log);
    let who = rig.process(1, 1, 8);
    let set = rig.set(HOME, &who, idx(0));
    assert_eq!((ids(&set), set.log.as_ref().map(|s| s.id)), (vec![3, 4], Some(SCOMP)));
    (rig, who)
}

fn file(who: &Who) -> LogFile {
    LogFile {
        vnode: who.vnode.clone(),
        pid: who.pid,
        index: idx(0),
    }
}

/// The logger's record of vRegion 0 of `who`.
fn log_of(rig: &Rig, logger: u32, who: &Who) -> log::Logged {
    let p = rig.mem(logger).owned.lock().unwrap()[&who.pid].clone();
    let g = p.lock().unwrap();
    g.logs[&idx(0)].clone()
}

/// A log streamer running beside the test (a copy into a full log waits for it), until dropped.
struct Streamer(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

impl Streamer {
    fn start(rig: &Rig, id: u32) -> Streamer {
        let (stop, m) = (Arc::new(AtomicBool::new(false)), rig.mems[&id].clone());
        let s = stop.clone();
        let t = std::thread::spawn(move || {
            let mut backoff = Duration::ZERO;
            while !s.load(Relaxed) {
                if !m.stream_one(&mut backoff) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        });
        Streamer(stop, Some(t))
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        self.0.store(true, Relaxed);
        self.1.take().map(|t| t.join());
    }
}

#[test]
fn the_logger_keeps_a_log_not_pages_and_it_reaches_the_backup_file() {
    let (rig, who) = logged(1 << 20);
    assert!(rig.read_from(4, &who, vpn(0, 0)).is_err(), "a logger serves no fetch");
    assert!(
        log_of(&rig, 4, &who).protects(),
        "an empty vRegion's backup is whole from the start"
    );
    rig.stream_logs();
    let backup = rig.net.scomp.pages(&file(&who));
    assert_eq!(backup.len(), 8);
    for (v, d) in backup {
        assert_eq!(unseal_page(d).unwrap(), content(v, 0));
    }
}

#[test]
fn a_lost_primary_is_replaced_by_its_logger_replaying_the_backup() {
    let (rig, who) = logged(1 << 20);
    rig.stream_logs();
    rig.down(3);
    let after = rig
        .call(
            HOME,
            P2M_REPLICA_LOST {
                who: who.clone(),
                lost: 3,
                vpn: vpn(0, 0),
            },
        )
        .expect("answered once the logger replayed");
    assert_eq!(
        ids(after.owners.iter().find(|s| s.index == idx(0)).unwrap()),
        vec![4],
        "the logger is the primary"
    );
    let replay = rig.net.calls("M2M_SET").into_iter().rfind(|c| c.to == 4).unwrap();
    assert!(matches!(&replay.msg, Msg::M2M_SET(s) if s.log == LogStep::Replay));
    assert_eq!(
        replay.how,
        How::Within(Duration::from_secs(120)),
        "a replay may take longer than a call"
    );
    check_pages(&rig, HOME, &who, 1, 8);

    // A new logger gets a full copy in the background; then the next loss is survived too.
    rig.run_jobs();
    let set = rig.set(HOME, &who, idx(0));
    assert_eq!(ids(&set), vec![4, 5]);
    assert!(log_of(&rig, 5, &who).protects());
    rig.stream_logs();
    rig.down(4);
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: 4,
            vpn: vpn(0, 0),
        },
    )
    .unwrap();
    assert_eq!(ids(&rig.set(HOME, &who, idx(0))), vec![5]);
    check_pages(&rig, HOME, &who, 1, 8);
}

#[test]
fn a_primary_lost_while_its_log_skipped_write_backs_is_not_replayed() {
    let (rig, who) = logged(3 * RECORD);
    assert!(
        log_of(&rig, 4, &who).skipped > 0,
        "the log had room for three of eight write-backs"
    );
    assert_eq!(
        rig.stats(4)["owned_processes"][0]["unprotected_vregions"],
        serde_json::json!([idx(0)])
    );
    rig.stream_logs();
    rig.down(3);
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: 3,
            vpn: vpn(0, 0),
        },
    )
    .expect("the program is told which member it waits for");
    assert_eq!(
        ids(&rig.set(HOME, &who, idx(0))),
        vec![3, 4],
        "a backup that misses write-backs is never served"
    );
    assert!(rig.read_from(4, &who, vpn(0, 0)).is_err());
}

#[test]
fn a_logger_that_skipped_is_copied_again_and_protects_again() {
    let (rig, who) = logged(3 * RECORD);
    rig.stream_logs();
    // Its log has room again, and some time passed since the backup restarted: it asks its
    // home for a copy.
    let p = rig.mem(4).owned.lock().unwrap()[&who.pid].clone();
    p.lock().unwrap().logs.get_mut(&idx(0)).unwrap().asked = None;
    rig.mem(4).ask_resyncs();
    let streamer = Streamer::start(&rig, 4);
    rig.run_jobs();
    drop(streamer);
    assert!(
        log_of(&rig, 4, &who).protects(),
        "the home copied the vRegion to its logger again"
    );
    rig.stream_logs();

    rig.down(3);
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: 3,
            vpn: vpn(0, 0),
        },
    )
    .unwrap();
    assert_eq!(ids(&rig.set(HOME, &who, idx(0))), vec![4]);
    check_pages(&rig, HOME, &who, 1, 8);
}

/// A copy that fails after the home restarted the backup (here the logger refuses the
/// copy's pages, as one whose log stays full for `COPY_WAIT` does) is asked for again as a
/// skip is, not only after `COPY_DUE`.
#[test]
fn a_copy_to_a_logger_that_fails_midway_is_asked_for_again_soon() {
    let (rig, who) = logged(3 * RECORD);
    rig.stream_logs();
    let p = rig.mem(4).owned.lock().unwrap()[&who.pid].clone();
    p.lock().unwrap().logs.get_mut(&idx(0)).unwrap().asked = None;
    let no_room = RpcError::Remote {
        code: ErrCode::NoMemory,
        msg: "no room in the backup log for 5 s".into(),
    };
    rig.net.fail("M2M_PUT_PAGES", Some(4), 1, no_room);
    rig.mem(4).ask_resyncs();
    rig.run_jobs();
    let l = log_of(&rig, 4, &who);
    assert!(!l.whole && l.skipped > 0, "the failed copy counts as a skip: {l:?}");
    // It asks again after twice `RESYNC_EVERY` (the failure doubled it), not before, and
    // the copy makes it whole.
    let ago = |s: u64| Some(std::time::Instant::now() - Duration::from_secs(s));
    let four = ago(4);
    p.lock().unwrap().logs.get_mut(&idx(0)).unwrap().asked = four;
    rig.mem(4).ask_resyncs();
    assert_eq!(
        log_of(&rig, 4, &who).asked,
        four,
        "not asked again 4 s after one failure"
    );
    p.lock().unwrap().logs.get_mut(&idx(0)).unwrap().asked = ago(7);
    rig.mem(4).ask_resyncs();
    let streamer = Streamer::start(&rig, 4);
    rig.run_jobs();
    drop(streamer);
    let l = log_of(&rig, 4, &who);
    assert!(
        l.protects() && l.copies_failed == 0,
        "copied again, protected again: {l:?}"
    );
}

#[test]
fn records_the_scomponent_refuses_leave_the_vregion_unprotected() {
    let (rig, who) = logged(1 << 20);
    let full = RpcError::Remote {
        code: ErrCode::Errno(libc::ENOSPC),
        msg: "the sComponent's disk is full".into(),
    };
    rig.net.fail("M2S_LOG_APPEND", Some(SCOMP), 1, full);
    rig.stream_logs();
    rig.mem(4).ask_resyncs();
    assert!(!log_of(&rig, 4, &who).protects());
    let log = &rig.stats(4)["backup_log"];
    assert!(log["refused_bytes"].as_u64() > Some(0));
    assert_eq!(
        log["refusal"], "the sComponent's disk is full",
        "cluster status names the cause"
    );
}

#[test]
fn a_corrupted_page_of_a_logged_set_is_rebuilt_from_the_backup() {
    let (rig, who) = logged(1 << 20);
    rig.stream_logs();
    let flipped = rig
        .call(
            3,
            C2M_DEBUG_FLIP {
                who: who.clone(),
                from_vpn: vpn(0, 0),
                bit: 100,
            },
        )
        .unwrap()
        .vpn;
    assert!(rig.read(HOME, &who, flipped).is_err());
    let page = rig
        .call(
            HOME,
            P2M_RECONSTRUCT {
                who: who.clone(),
                vpn: flipped,
            },
        )
        .expect("rebuilt from the backup");
    assert_eq!(unseal_page(page.data).unwrap(), content(flipped, 0));
    assert_eq!(rig.read(HOME, &who, flipped).unwrap(), content(flipped, 0));
}
