//! Replica sets (`replication = "replica"`): a lost member leaves its sets and its copies are
//! rebuilt elsewhere, under a new epoch that the survivors enforce.
use super::*;

#[test]
fn a_lost_replica_is_rebuilt_elsewhere_with_every_page() {
    let rig = Rig::new(4, Replication::Replica);
    let who = rig.process(1, 2, 8);
    let before = rig.sets(HOME, &who);
    let victim = ids(&rig.set(HOME, &who, idx(0)))[0];
    rig.down(victim);

    let after = rig
        .call(
            HOME,
            P2M_REPLICA_LOST {
                who: who.clone(),
                lost: victim,
                vpn: vpn(0, 0),
            },
        )
        .expect("the home answers the report");
    assert!(
        after.epoch > before.epoch,
        "a set changed: the process moves to a new epoch"
    );
    assert!(
        after.owners.iter().all(|s| !ids(s).contains(&victim)),
        "the lost member left every set"
    );
    let verified = rig
        .net
        .calls("M2M_READ_PAGES")
        .into_iter()
        .find(|c| c.from == HOME && c.to == victim)
        .expect("the home checks the report itself");
    assert_eq!(
        verified.how,
        How::Within(Duration::from_secs(2)),
        "and waits for the member no longer than VERIFY_TIMEOUT"
    );
    assert!(rig.mem(HOME).short_vregions() > 0, "the sets are short until rebuilt");

    rig.run_jobs();
    let rebuilt = rig.sets(HOME, &who);
    assert_eq!(rig.mem(HOME).short_vregions(), 0);
    assert!(
        rebuilt.epoch > after.epoch,
        "a rebuild moves the process to a new epoch before it copies"
    );
    for s in &rebuilt.owners {
        assert_eq!(s.owners.len(), 2, "vRegion {} has two members again", s.index);
        assert!(
            !ids(s).contains(&victim),
            "a member lost lately is not chosen again (the managers still count it alive)"
        );
        for o in &s.owners {
            for p in 0..8 {
                let v = (s.index * VRS) / PAGE + p * 5;
                assert_eq!(
                    rig.read_from(o.id, &who, v).expect("every member holds every page"),
                    content(v, 0)
                );
            }
        }
    }
    let picks = rig.net.calls("M2G_PICK_OWNER");
    let Msg::M2G_PICK_OWNER(last) = &picks.last().expect("the rebuild picked a member").msg else {
        unreachable!()
    };
    assert!(
        last.exclude.contains(&victim),
        "the lost member is excluded from the managers' choice"
    );
}

#[test]
fn the_survivors_refuse_write_backs_of_an_older_epoch() {
    let rig = Rig::new(4, Replication::Replica);
    let who = rig.process(1, 1, 2);
    let old = rig.sets(HOME, &who);
    let set = rig.set(HOME, &who, idx(0));
    let (survivor, victim) = (set.owners[0].id, set.owners[1].id);
    rig.down(victim);
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: victim,
            vpn: vpn(0, 0),
        },
    )
    .unwrap();
    rig.run_jobs();

    let stale = Who {
        epoch: old.epoch,
        ..who.clone()
    };
    let e = rig
        .call(
            survivor,
            P2M_FLUSH {
                who: stale,
                vpn: vpn(0, 0),
                data: seal_page(&content(vpn(0, 0), 7)),
            },
        )
        .expect_err("a write-back sent for the old sets");
    assert_eq!(e.code, ErrCode::Stale);
    assert_eq!(
        rig.read_from(survivor, &who, vpn(0, 0)).unwrap(),
        content(vpn(0, 0), 0),
        "a refused write-back changes nothing"
    );
    rig.write(HOME, &who, vpn(0, 0), 7)
        .expect("the pComponent writes again on the new sets");
    for o in rig.set(HOME, &who, idx(0)).owners {
        assert_eq!(rig.read_from(o.id, &who, vpn(0, 0)).unwrap(), content(vpn(0, 0), 7));
    }
}

#[test]
fn a_member_only_the_pcomponent_cannot_reach_hands_the_vregion_to_another_whole() {
    // Four members that hold pages beside the home: two in the set, two to move to.
    let rig = Rig::new(5, Replication::Replica);
    let who = rig.process(1, 1, 2);
    let before = rig.set(HOME, &who, idx(0));
    let member = ids(&before)[0];
    rig.net.cut(PCOMP, member);

    let after = rig
        .call(
            HOME,
            P2M_REPLICA_LOST {
                who: who.clone(),
                lost: member,
                vpn: vpn(0, 0),
            },
        )
        .unwrap();
    let now = rig.set(HOME, &who, idx(0));
    assert!(now.epoch > before.epoch, "the set changed");
    assert!(
        !ids(&now).contains(&member),
        "the vRegion left the member the pComponent cannot reach"
    );
    assert_eq!(
        now.owners.len(),
        before.owners.len(),
        "a pComponent's word alone takes no copy out of service: as many as before"
    );
    // Every copy holds what was written, the new one copied from the member left.
    let current = Who {
        epoch: after.epoch,
        ..who.clone()
    };
    for o in &now.owners {
        for p in [0, 5] {
            assert_eq!(rig.read_from(o.id, &current, vpn(0, p)).unwrap(), content(vpn(0, p), 0));
        }
    }
    // The member it moved to is cut off from the pComponent too (another mComponent of the
    // parted host): the vRegion moves on, and not back to the first.
    let second = *ids(&now).iter().find(|id| !ids(&before).contains(id)).unwrap();
    rig.net.cut(PCOMP, second);
    // The managers would pick the first again (picked least often) but for the home's word.
    let others: Vec<u32> = rig
        .mems
        .keys()
        .copied()
        .filter(|id| *id != HOME && !ids(&before).contains(id) && *id != second)
        .collect();
    for id in &others {
        rig.net.picks.lock().unwrap().insert(*id, 100);
    }
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: current,
            lost: second,
            vpn: vpn(0, 0),
        },
    )
    .unwrap();
    let last = ids(&rig.set(HOME, &who, idx(0)));
    assert!(!last.contains(&member) && !last.contains(&second), "{last:?}");
    assert_eq!(last.len(), before.owners.len());
}

#[test]
fn a_write_back_racing_a_rebuild_cannot_land_on_the_old_set_only() {
    let rig = Rig::new(4, Replication::Replica);
    let who = rig.process(1, 1, 4);
    let old = rig.sets(HOME, &who).epoch;
    let set = rig.set(HOME, &who, idx(0));
    let (survivor, victim) = (set.owners[0].id, set.owners[1].id);
    rig.down(victim);
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: victim,
            vpn: vpn(0, 0),
        },
    )
    .unwrap();

    // While the rebuild reads the survivor's pages, the pComponent writes a page back on the
    // sets it knew: the survivor, already at the rebuild's epoch, refuses it.
    let raced = Arc::new(Mutex::new(None));
    let (net, w, out) = (
        rig.net.clone(),
        Who {
            epoch: old,
            ..who.clone()
        },
        raced.clone(),
    );
    rig.net.before("M2M_READ_PAGES", survivor, move || {
        let flush = P2M_FLUSH {
            who: w,
            vpn: vpn(0, 5),
            data: seal_page(&content(vpn(0, 5), 9)),
        };
        *out.lock().unwrap() = Some(net.send(PCOMP, &addr(survivor), flush, How::Rpc));
    });
    rig.run_jobs();
    let raced = raced
        .lock()
        .unwrap()
        .take()
        .expect("the write-back ran during the copy");
    // The survivor was fenced before the copy started.
    assert!(
        matches!(
            raced,
            Err(RpcError::Remote {
                code: ErrCode::Stale,
                ..
            })
        ),
        "refused: {raced:?}"
    );

    rig.write(HOME, &who, vpn(0, 5), 9)
        .expect("written again on the new sets");
    let members = rig.set(HOME, &who, idx(0)).owners;
    assert_eq!(members.len(), 2);
    for o in members {
        assert_eq!(
            rig.read_from(o.id, &who, vpn(0, 5)).unwrap(),
            content(vpn(0, 5), 9),
            "mComponent {} has the page",
            o.id
        );
    }
}

#[test]
fn a_rebuild_that_fails_midway_releases_the_new_member_and_is_tried_again() {
    let rig = Rig::new(4, Replication::Replica);
    let who = rig.process(1, 1, 4);
    let victim = ids(&rig.set(HOME, &who, idx(0)))[1];
    rig.down(victim);
    rig.net
        .fail("M2M_PUT_PAGES", None, 1, RpcError::Closed { addr: "any".into() });
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: victim,
            vpn: vpn(0, 0),
        },
    )
    .unwrap();

    rig.run_jobs();
    assert_eq!(
        rig.mem(HOME).short_vregions(),
        1,
        "the copy failed: the set is still short"
    );
    let put = rig.net.calls("M2M_PUT_PAGES").pop().expect("the copy was tried");
    let removed = rig.net.calls("M2M_VMA_REMOVE");
    assert!(
        removed.iter().any(|c| c.to == put.to),
        "what reached the new member is released there"
    );
    assert!(
        rig.read_from(put.to, &who, vpn(0, 0)).is_err(),
        "and it holds nothing of the process"
    );

    rig.mem(HOME).rebuild(who.pid);
    assert_eq!(rig.mem(HOME).short_vregions(), 0, "tried again, it completes");
    check_pages(&rig, HOME, &who, 1, 4);
}

#[test]
fn a_set_with_no_room_elsewhere_stays_short_until_a_heartbeat_finds_room() {
    let rig = Rig::new(3, Replication::Replica);
    let who = rig.process(1, 1, 2);
    let set = ids(&rig.set(HOME, &who, idx(0)));
    rig.down(set[1]);
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: set[1],
            vpn: vpn(0, 0),
        },
    )
    .unwrap();
    rig.run_jobs();
    assert_eq!(
        rig.mem(HOME).short_vregions(),
        1,
        "the only other mComponent with room was the one lost"
    );
    assert_eq!(
        rig.stats(HOME)["rebuild"]["short_vregions"],
        1,
        "and cluster status says so"
    );

    // Room appears (the home takes pages now), and a heartbeat some time later retries.
    rig.net.full.lock().unwrap().clear();
    *rig.mem(HOME).last_retry.lock().unwrap() -= REBUILD_RETRY;
    rig.mem(HOME).on_beat(lost_beat(Vec::new()));
    assert_eq!(rig.mem(HOME).short_vregions(), 0);
    assert_eq!(ids(&rig.set(HOME, &who, idx(0))), vec![set[0], HOME]);
    check_pages(&rig, HOME, &who, 1, 2);
}

#[test]
fn a_full_member_hands_its_vregion_to_one_with_room() {
    // The managers place the vRegion on mComponents 3 and 4 (2 is the backup home).
    let rig = Rig::with(
        4,
        Replication::Replica,
        |id| if id == 3 { 4 * PAGE } else { 64 << 20 },
        1 << 20,
    );
    let who = rig.create(1);
    rig.mmap(HOME, &who, VRS).unwrap();
    assert!(
        ids(&rig.set(HOME, &who, idx(0))).contains(&3),
        "the small mComponent holds the vRegion"
    );
    let full = (0..8)
        .map(|p| rig.write(HOME, &who, vpn(0, p), 0))
        .find_map(Result::err)
        .expect("it fills up");
    assert_eq!(full.code, ErrCode::NoMemory);

    rig.call(
        HOME,
        P2M_OWNER_FULL {
            who: who.clone(),
            vpn: vpn(0, 4),
            full: 3,
        },
    )
    .expect("moved");
    let set = rig.set(HOME, &who, idx(0));
    assert!(!ids(&set).contains(&3), "the full mComponent left the set");
    assert_eq!(rig.stats(3)["used"], 0, "and freed its copy");
    for p in 0..8 {
        rig.write(HOME, &who, vpn(0, p), 0).expect("written on the new set");
    }
    for o in set.owners {
        for p in 0..8 {
            assert_eq!(rig.read_from(o.id, &who, vpn(0, p)).unwrap(), content(vpn(0, p), 0));
        }
    }
    // It keeps the process's record while the process lives (its epoch refuses late
    // write-backs), and is told to free it when the process exits, as the members are.
    assert!(rig.mem(3).owned.lock().unwrap().contains_key(&who.pid));
    rig.call(HOME, P2M_EXIT { who: who.clone() }).expect("exit");
    for id in 1..=4 {
        assert!(
            !rig.mem(id).owned.lock().unwrap().contains_key(&who.pid),
            "mComponent {id} freed the exited process's record"
        );
    }
}

#[test]
fn an_mmap_whose_set_cannot_be_made_leaves_nothing_behind() {
    let rig = Rig::new(3, Replication::Replica);
    let who = rig.create(1);
    let broken = RpcError::Remote {
        code: ErrCode::Internal,
        msg: "the managers failed in the test".into(),
    };
    rig.net.fail("M2G_PICK_OWNER", None, 1, broken);
    let e = rig.mmap(HOME, &who, VRS).expect_err("the managers pick no members");
    assert_eq!(e.code, ErrCode::Internal);
    assert!(rig.sets(HOME, &who).owners.is_empty(), "no vRegion was activated");

    let m = rig.mmap(HOME, &who, VRS).expect("the managers are back");
    assert_eq!(m.addr, BASE, "the range the failed mmap took is free again");
}

#[test]
fn an_mmap_waits_for_managers_that_do_not_answer_and_maps_when_they_are_back() {
    let rig = Rig::new(3, Replication::Replica);
    let who = rig.create(1);
    rig.down(GM);
    let net = rig.net.clone();
    let back = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(700));
        net.down.lock().unwrap().clear();
    });
    let m = rig.mmap(HOME, &who, VRS).expect("the mmap waits for the managers");
    back.join().unwrap();
    assert_eq!(m.addr, BASE);
    assert_eq!(ids(&rig.set(HOME, &who, idx(0))).len(), 2, "a whole set");
    assert!(rig.mem(HOME).c.waits_for_managers.load(Relaxed) >= 1);
    rig.write(HOME, &who, vpn(0, 0), 0)
        .expect("the new vRegion takes write-backs");
    check_pages(&rig, HOME, &who, 1, 1);
}

/// A write-back that found a process on its owner just before the process's exit freed it
/// there (both waiting on the process, in either order) leaves nothing charged: were it to
/// store its page into the process let go, that page would be held for no process, for good.
#[test]
fn a_write_back_racing_its_process_exit_leaves_no_memory_taken_on_the_owner() {
    let rig = Rig::new(2, Replication::None);
    for pid in 1..=16 {
        let who = rig.process(pid, 1, 1);
        let owner = ids(&rig.set(HOME, &who, idx(0)))[0];
        assert_ne!(owner, HOME, "the home holds no pages here");
        let epoch = rig.sets(HOME, &who).epoch;
        let held = rig.mem(owner).owned.lock().unwrap()[&pid].clone();
        let process = held.lock().unwrap();
        let (net, page) = (rig.net.clone(), vpn(0, 1));
        let late = Who { epoch, ..who.clone() };
        let flush = std::thread::spawn(move || {
            net.send(
                PCOMP,
                &addr(owner),
                P2M_FLUSH {
                    who: late,
                    vpn: page,
                    data: seal_page(&content(page, 0)),
                },
                How::Rpc,
            )
        });
        std::thread::sleep(Duration::from_millis(30));
        let net = rig.net.clone();
        let gone = who.clone();
        let exit = std::thread::spawn(move || net.send(PCOMP, &addr(HOME), P2M_EXIT { who: gone }, How::Rpc));
        std::thread::sleep(Duration::from_millis(30));
        drop(process);
        // Refused or stored before the exit: either is right.
        let _ = flush.join().unwrap();
        exit.join().unwrap().expect("exit");
        let s = rig.stats(owner);
        assert_eq!(
            (s["taken"].as_u64(), s["used"].as_u64()),
            (Some(0), Some(0)),
            "process {pid}: {s}"
        );
    }
}
