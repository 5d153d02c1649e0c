//! The backup home and its taking over; fencing of an mComponent declared lost.
use super::*;

/// The mComponent the managers choose as backup home of the first process (the least chosen
/// one that is not the home).
const BACKUP: u32 = 2;

#[test]
fn every_change_reaches_the_backup_home_first() {
    let rig = Rig::new(4, Replication::Replica);
    let who = rig.process(1, 2, 1);
    let sets = rig.sets(HOME, &who);
    assert_eq!(sets.backup.as_ref().map(|b| b.id), Some(BACKUP));
    let kept = rig
        .mem(BACKUP)
        .backups
        .lock()
        .unwrap()
        .get(&who.pid)
        .cloned()
        .expect("the backup keeps the process's state");
    assert_eq!(kept.who.epoch, sets.epoch);
    assert_eq!(kept.vregions, sets.owners, "with the sets the pComponent was told");
    assert_eq!(kept.vmas.len(), 1);
}

#[test]
fn the_backup_takes_over_a_home_it_cannot_reach_either() {
    let rig = Rig::new(4, Replication::Replica);
    let who = rig.process(1, 2, 4);
    let seen = rig.sets(HOME, &who).epoch;
    rig.down(HOME);

    let home = rig
        .call(
            BACKUP,
            P2M_HOME_TAKEOVER {
                who: Who {
                    epoch: seen,
                    ..who.clone()
                },
                lost: HOME,
            },
        )
        .expect("the backup takes over");
    let asked = rig
        .net
        .calls("M2M_HOME_OF")
        .pop()
        .expect("the backup asks the home first");
    assert_eq!(
        (asked.from, asked.to, asked.how),
        (BACKUP, HOME, How::Within(Duration::from_secs(2)))
    );
    let new_backup = home.backup.expect("a new backup home").id;
    assert!(new_backup != HOME && new_backup != BACKUP);
    assert!(rig.mem(new_backup).backups.lock().unwrap().contains_key(&who.pid));

    let sets = rig.sets(BACKUP, &who);
    assert!(sets.epoch > seen, "the epoch moves past any the pComponent has seen");
    for o in sets.owners.iter().flat_map(|s| &s.owners) {
        let e = rig.call(
            o.id,
            P2M_FLUSH {
                who: Who {
                    epoch: seen,
                    ..who.clone()
                },
                vpn: vpn(0, 0),
                data: seal_page(&content(vpn(0, 0), 1)),
            },
        );
        assert_eq!(e.expect_err("every owner was told the new epoch").code, ErrCode::Stale);
    }
    check_pages(&rig, BACKUP, &who, 2, 4);
    rig.mmap(BACKUP, &who, VRS)
        .expect("the new home serves the process's calls");
}

#[test]
fn a_slow_home_stays_the_home() {
    let rig = Rig::new(4, Replication::Replica);
    let who = rig.process(1, 1, 1);
    rig.net.cut(PCOMP, HOME);

    let e = rig
        .call(
            BACKUP,
            P2M_HOME_TAKEOVER {
                who: who.clone(),
                lost: HOME,
            },
        )
        .expect_err("the home still answers its backup");
    assert_eq!(e.code, ErrCode::Unreachable);
    assert!(e.msg.contains("slow, not lost"), "{}", e.msg);
    assert_eq!(
        rig.call(BACKUP, P2M_VREGIONS { who: who.clone() })
            .expect_err("not the home")
            .code,
        ErrCode::NotHome
    );
    assert!(
        rig.mem(BACKUP).backups.lock().unwrap().contains_key(&who.pid),
        "and still the backup"
    );
}

#[test]
fn a_backup_takes_over_on_the_managers_word_and_homes_rebuild_what_they_lost() {
    let rig = Rig::new(5, Replication::Replica);
    let first = rig.process(1, 1, 4);
    let member = ids(&rig.set(HOME, &first, idx(0)))[0];
    let lost = [HOME, member];
    // The managers name the lost mComponents in every heartbeat answer: the backup takes over
    // at the first, and as the home it takes the lost member out of its sets at the next.
    rig.declare_lost(&lost);
    rig.run_jobs();
    assert!(
        rig.mem(BACKUP).homes.lock().unwrap().contains_key(&first.pid),
        "the backup is the home"
    );
    rig.declare_lost(&lost);
    rig.run_jobs();

    let sets = rig.sets(BACKUP, &first);
    assert!(
        sets.owners
            .iter()
            .all(|s| s.owners.len() == 2 && !ids(s).iter().any(|o| lost.contains(o))),
        "{:?}",
        sets.owners
    );
    assert!(sets.backup.is_some_and(|b| !lost.contains(&b.id)));
    assert_eq!(rig.mem(BACKUP).short_vregions(), 0);
    check_pages(&rig, BACKUP, &first, 1, 4);
}

#[test]
fn a_backup_that_cannot_be_reached_is_replaced() {
    let rig = Rig::new(4, Replication::Replica);
    let who = rig.create(1);
    rig.down(BACKUP);
    let m = rig.mmap(HOME, &who, VRS).expect("mmap");
    let backup = m.backup.expect("another backup home").id;
    assert_ne!(backup, BACKUP);
    assert!(rig.mem(backup).backups.lock().unwrap().contains_key(&who.pid));

    // With no mComponent left to be backup, the home goes on with one copy of its state.
    rig.down(backup);
    for id in 1..=4 {
        rig.net.lost.lock().unwrap().insert(id);
    }
    let m = rig
        .call(
            HOME,
            P2M_MUNMAP {
                who: who.clone(),
                addr: BASE,
                len: PAGE,
            },
        )
        .map(|_| rig.sets(HOME, &who));
    assert!(m.expect("the home answers without a backup").backup.is_none());
}

#[test]
fn a_fenced_mcomponent_drops_every_copy_it_held() {
    let rig = Rig::new(4, Replication::Replica);
    let who = rig.process(1, 2, 4);
    let member = ids(&rig.set(HOME, &who, idx(0)))[0];
    assert!(rig.stats(member)["used"].as_u64() > Some(0));

    rig.mem(member).fence();
    assert_eq!(rig.stats(member)["used"], 0);
    assert_eq!(
        rig.read_from(member, &who, vpn(0, 0))
            .expect_err("it holds nothing")
            .code,
        ErrCode::NotFound
    );
    // The pComponent reports it; the home finds it holds nothing of the process, takes it
    // out of the sets and rebuilds its copies from the other members.
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: member,
            vpn: vpn(0, 0),
        },
    )
    .unwrap();
    assert!(!ids(&rig.set(HOME, &who, idx(0))).contains(&member));
    rig.run_jobs();
    check_pages(&rig, HOME, &who, 2, 4);

    rig.mem(BACKUP).fence();
    assert!(
        rig.mem(BACKUP).backups.lock().unwrap().is_empty(),
        "a backup home's copies go too"
    );
}

#[test]
fn a_home_exit_frees_the_process_on_every_member_and_the_backup() {
    let rig = Rig::new(4, Replication::Replica);
    let who = rig.process(1, 2, 4);
    let members: Vec<u32> = rig.sets(HOME, &who).owners.iter().flat_map(ids).collect();
    rig.call(HOME, P2M_EXIT { who: who.clone() }).expect("exit");
    for m in members {
        assert_eq!(rig.stats(m)["used"], 0, "mComponent {m} freed the pages");
    }
    assert!(rig.mem(BACKUP).backups.lock().unwrap().is_empty());
    assert_eq!(
        rig.call(HOME, P2M_VREGIONS { who }).expect_err("gone").code,
        ErrCode::NotHome
    );
}

/// Creation `attempt` of process `pid` at [`HOME`], from the pComponent with id `pcomp`.
fn create_at(rig: &Rig, pid: u64, pcomp: u32, attempt: u32) -> Result<M2P_HOME, Refusal> {
    rig.call(
        HOME,
        P2M_PROC_CREATE {
            who: Who::new("v", pid),
            region_base: BASE,
            region_size: REGION,
            pcomp,
            memory_quota: None,
            attempt,
        },
    )
}

#[test]
fn a_creation_given_up_and_sent_again_to_the_same_home_is_made_and_a_late_undo_ends_nothing() {
    let rig = Rig::new(4, Replication::Replica);
    let undo = |pid: u64, attempt: u32| {
        rig.call(
            HOME,
            P2M_CREATE_UNDO {
                who: Who::new("v", pid),
                attempt,
            },
        )
        .expect("an undo is answered")
    };
    let made = |pid: u64| rig.mem(HOME).homes.lock().unwrap().contains_key(&pid);
    // The home was paused: the pComponent gave creation 0 up and undid it, and the managers
    // picked the same home again. Creation 1 is made; creation 0, come late, is not.
    undo(1, 0);
    create_at(&rig, 1, 7, 1).expect("a creation sent after the undo is made");
    assert!(made(1));
    assert_eq!(create_at(&rig, 1, 7, 0).expect_err("late").code, ErrCode::Denied);
    assert!(made(1), "a late creation ends nothing");

    // Creation 0 was made but its answer lost: its undo ends it, and creation 1 is made.
    create_at(&rig, 2, 7, 0).expect("made");
    undo(2, 0);
    assert!(!made(2), "the undo ended what creation 0 made");
    create_at(&rig, 2, 7, 1).expect("a creation sent after the undo is made");
    assert!(made(2));

    // An undo of creation 0 that comes after creation 1 made the process (the undo's thread
    // retries until the home answers) ends nothing.
    create_at(&rig, 3, 7, 1).expect("made");
    undo(3, 0);
    assert!(made(3), "a late undo ends nothing");
    // Creation 0 made it, its answer lost; creation 1 came before the undo of 0 (sent from a
    // thread of its own) and was answered as a repeat: the process is creation 1's now, and
    // that undo, however often it comes, ends nothing.
    create_at(&rig, 5, 7, 0).expect("made");
    create_at(&rig, 5, 7, 1).expect("answered as a repeat");
    undo(5, 0);
    undo(5, 0);
    assert!(made(5), "the undo of the creation given up ends nothing");
    create_at(&rig, 5, 7, 0).expect("a repeat of 0 is answered as the first");
    let who = rig.create(4);
    rig.mmap(HOME, &who, 4096).expect("the home serves");

    for pid in [1, 2, 3, 4, 5] {
        rig.call(
            HOME,
            P2M_EXIT {
                who: Who::new("v", pid),
            },
        )
        .expect("exit");
    }
    assert_eq!(rig.stats(HOME)["used"], 0);
}

#[test]
fn a_creation_sent_again_gets_the_first_answer_and_one_after_the_end_is_refused() {
    let rig = Rig::new(4, Replication::Replica);
    let create = |pid: u64, pcomp: u32| create_at(&rig, pid, pcomp, 0);
    // The first answer was lost: the pComponent asks again, and the same home answers.
    let first = create(1, 7).expect("create");
    let again = create(1, 7).expect("the same creation again");
    assert_eq!(first.backup, again.backup);
    assert!(first.backup.is_some(), "a replicated home has a backup");
    assert_eq!(rig.mem(HOME).homes.lock().unwrap().len(), 1);
    // Another pComponent may not take the process over by creating its id.
    assert_eq!(create(1, 8).expect_err("in use").code, ErrCode::Denied);

    // The pComponent gave up on a home that did not answer and undid the creation there; the
    // creation it had sent comes afterwards, and is refused.
    let who = Who::new("v", 2);
    rig.call(
        HOME,
        P2M_CREATE_UNDO {
            who: who.clone(),
            attempt: 0,
        },
    )
    .expect("undone");
    assert_eq!(create(2, 7).expect_err("undone first").code, ErrCode::Denied);
    assert!(!rig.mem(HOME).homes.lock().unwrap().contains_key(&2));
    // An end said of a process never made here refuses every creation of it.
    let who = Who::new("v", 6);
    assert_eq!(
        rig.call(HOME, P2M_EXIT { who: who.clone() })
            .expect_err("not made")
            .code,
        ErrCode::NotHome
    );
    assert_eq!(create_at(&rig, 6, 7, 3).expect_err("ended first").code, ErrCode::Denied);
    // Made, ended, and then a repeat of its creation comes (held through a pause): refused.
    create(5, 7).expect("create");
    rig.call(HOME, P2M_EXIT { who: Who::new("v", 5) }).expect("exit");
    assert_eq!(create(5, 7).expect_err("a late repeat").code, ErrCode::Denied);
    assert!(!rig.mem(HOME).homes.lock().unwrap().contains_key(&5));
    // A fork sent again gets the first's answer; a fork into the parent's own id is refused.
    let parent = rig.process(3, 1, 2);
    let fork = |child: u64| {
        rig.call(
            HOME,
            P2M_FORK {
                parent: parent.clone(),
                child,
            },
        )
    };
    let first = fork(4).expect("fork");
    let again = fork(4).expect("the same fork again");
    assert_eq!((first.vmas, first.epoch), (again.vmas, again.epoch));
    assert_eq!(first.owners.len(), again.owners.len());
    assert_eq!(fork(3).expect_err("the parent").code, ErrCode::Denied);

    // A process that ended after it was made is gone as before.
    for pid in [1, 3, 4] {
        rig.call(
            HOME,
            P2M_EXIT {
                who: Who::new("v", pid),
            },
        )
        .expect("exit");
    }
    assert!(rig.mem(HOME).homes.lock().unwrap().is_empty());
}

#[test]
fn a_lost_home_that_goes_on_before_it_is_fenced_gets_no_copy_taken_over() {
    let rig = Rig::new(5, Replication::Replica);
    let who = rig.process(1, 1, 2);
    rig.declare_lost(&[HOME]);
    assert!(rig.mem(BACKUP).homes.lock().unwrap().contains_key(&who.pid));
    rig.call(BACKUP, P2M_EXIT { who: who.clone() })
        .expect("exit at the new home");

    // The lost home goes on and carries out a mapping sent to it before; it has not heard it
    // was declared lost, and sends its copy of the process to its backup.
    rig.net.down.lock().unwrap().remove(&HOME);
    let _ = rig.mmap(HOME, &who, VRS);
    assert!(
        rig.net
            .calls("M2M_HOME_SYNC")
            .iter()
            .any(|c| c.from == HOME && c.to == BACKUP),
        "the lost home sent its copy"
    );
    assert!(rig.mem(BACKUP).backups.lock().unwrap().is_empty(), "and it was refused");
    // The managers' next word that the home is lost makes no second home of the process.
    rig.declare_lost(&[HOME]);
    assert!(rig.mem(BACKUP).homes.lock().unwrap().is_empty());
}

#[test]
fn a_homes_change_held_through_a_stop_that_ended_in_a_fence_is_refused() {
    let rig = Rig::new(5, Replication::Replica);
    let who = rig.create(1);
    // Member 3 was stopped past the managers' patience and goes on: the mapping a home sent
    // it before waits for the managers' word, which fences it.
    rig.net.stopped.lock().unwrap().insert(3);
    let add = || {
        rig.net.send(
            HOME,
            &addr(3),
            M2M_VMA_ADD {
                who: who.clone(),
                start: BASE,
                end: BASE + VRS,
                prot: 3,
                creator: None,
                quota: None,
            },
            How::Rpc,
        )
    };
    let added = add();
    assert!(
        matches!(
            added,
            Err(RpcError::Remote {
                code: ErrCode::NotFound,
                ..
            })
        ),
        "{added:?}"
    );
    assert!(
        rig.mem(3).owned.lock().unwrap().is_empty(),
        "it holds nothing of the process"
    );
    // Sent after the fence, a change is served as ever.
    let again = add();
    assert!(again.is_ok(), "{again:?}");
}
