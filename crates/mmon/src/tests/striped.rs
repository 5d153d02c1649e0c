//! Striped sets (`replication = "ec:2"`): a lost place is rebuilt from the parity and the
//! rest of each row; the parity member refuses changes of an older epoch.
//!
//! With six mComponents the managers place the first process's vRegion on 3 and 4 (data)
//! and 5 (parity); 2 is its backup home and 6 free.
use super::*;

const EC: Replication = Replication::Ec { data: 2 };

fn striped() -> (Rig, Who) {
    let rig = Rig::new(6, EC);
    let who = rig.process(1, 1, 8);
    assert_eq!(ids(&rig.set(HOME, &who, idx(0))), vec![3, 4, 5]);
    (rig, who)
}

#[test]
fn a_page_change_reaches_the_parity_on_the_holders_own_channel() {
    let (rig, _) = striped();
    let sent = rig.net.calls("M2M_PARITY");
    assert!(!sent.is_empty());
    assert!(
        sent.iter()
            .all(|c| c.to == 5 && [3, 4].contains(&c.from) && c.how == How::Direct),
        "forwards go on the calling thread's own channel"
    );
}

#[test]
fn a_lost_data_place_is_rebuilt_from_parity_before_the_report_is_answered() {
    let (rig, who) = striped();
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
        .expect("answered once rebuilt");
    let set = after.owners.iter().find(|s| s.index == idx(0)).unwrap();
    assert_eq!(
        ids(set),
        vec![6, 4, 5],
        "the lost place is on a new member, the others where they were"
    );
    let epochs: Vec<u32> = rig
        .net
        .calls("M2M_EPOCH")
        .iter()
        .filter(|c| c.from == HOME)
        .map(|c| c.to)
        .collect();
    assert_eq!(
        epochs,
        vec![4, 5],
        "the survivors are fenced, the data member before the parity"
    );
    check_pages(&rig, HOME, &who, 1, 8);
    assert_eq!(rig.mem(HOME).short_vregions(), 0);
}

#[test]
fn a_lost_parity_place_is_rebuilt_in_the_background_and_serves_the_next_loss() {
    let (rig, who) = striped();
    rig.declare_lost(&[5]);
    assert_eq!(
        ids(&rig.set(HOME, &who, idx(0))),
        vec![3, 4, 5],
        "a loss the managers announce is rebuilt in the background"
    );
    rig.run_jobs();
    assert_eq!(ids(&rig.set(HOME, &who, idx(0))), vec![3, 4, 6]);

    rig.down(4);
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: 4,
            vpn: vpn(0, 16),
        },
    )
    .unwrap();
    assert_eq!(ids(&rig.set(HOME, &who, idx(0))), vec![3, 2, 6]);
    check_pages(&rig, HOME, &who, 1, 8);
}

#[test]
fn two_places_lost_at_once_are_not_rebuilt() {
    let (rig, who) = striped();
    rig.declare_lost(&[3, 4]);
    rig.run_jobs();
    assert_eq!(ids(&rig.set(HOME, &who, idx(0))), vec![3, 4, 5], "the set keeps them");
    assert!(rig.net.calls("M2M_PUT_PAGES").is_empty(), "nothing is rebuilt");
    assert_eq!(
        rig.read(HOME, &who, vpn(0, 0))
            .expect_err("no page is ever read wrong")
            .code,
        ErrCode::Unreachable
    );

    for lost in [3, 4] {
        rig.call(
            HOME,
            P2M_REPLICA_LOST {
                who: who.clone(),
                lost,
                vpn: vpn(0, 0),
            },
        )
        .expect("the program is told which member it waits for");
        assert_eq!(ids(&rig.set(HOME, &who, idx(0))), vec![3, 4, 5]);
    }
    assert!(rig.net.calls("M2M_PUT_PAGES").is_empty());
}

#[test]
fn a_corrupted_page_is_rebuilt_from_its_row_and_written_over_the_bad_copy() {
    let (rig, who) = striped();
    let flipped = rig
        .call(
            3,
            C2M_DEBUG_FLIP {
                who: who.clone(),
                from_vpn: vpn(0, 0),
                bit: 9,
            },
        )
        .unwrap()
        .vpn;
    assert!(
        rig.read(HOME, &who, flipped).is_err(),
        "the bad copy fails its checksum"
    );
    let epoch = rig.sets(HOME, &who).epoch;

    let page = rig
        .call(
            HOME,
            P2M_RECONSTRUCT {
                who: who.clone(),
                vpn: flipped,
            },
        )
        .expect("rebuilt");
    assert_eq!(unseal_page(page.data).unwrap(), content(flipped, 0));
    assert_eq!(
        rig.read(HOME, &who, flipped).unwrap(),
        content(flipped, 0),
        "and written over the bad copy"
    );
    assert!(
        rig.sets(HOME, &who).epoch > epoch,
        "the set was fenced while its row was read"
    );
}

#[test]
fn a_member_cut_off_from_the_home_cannot_write_on_unseen() {
    let (rig, who) = striped();
    let old = rig.sets(HOME, &who).epoch;
    rig.net.cut(HOME, 3);
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: 3,
            vpn: vpn(0, 0),
        },
    )
    .unwrap();
    assert_eq!(ids(&rig.set(HOME, &who, idx(0))), vec![6, 4, 5]);

    // The pComponent still reaches the old member and writes on the sets it knew.
    let stale = Who {
        epoch: old,
        ..who.clone()
    };
    let e = rig
        .call(
            3,
            P2M_FLUSH {
                who: stale,
                vpn: vpn(0, 0),
                data: seal_page(&content(vpn(0, 0), 5)),
            },
        )
        .expect_err("the parity refuses its change");
    assert_eq!(e.code, ErrCode::Stale);
    assert_eq!(
        rig.read_from(3, &who, vpn(0, 0)).unwrap(),
        content(vpn(0, 0), 0),
        "the member undid its store"
    );

    // The parity still agrees with the pages: the other data place rebuilds from it.
    rig.down(4);
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: 4,
            vpn: vpn(0, 16),
        },
    )
    .unwrap();
    check_pages(&rig, HOME, &who, 1, 8);
}

#[test]
fn a_holder_that_cannot_reach_the_parity_says_so() {
    let (rig, who) = striped();
    rig.net.cut(3, 5);
    assert_eq!(
        rig.write(HOME, &who, vpn(0, 0), 1)
            .expect_err("no redundancy for the change")
            .code,
        ErrCode::ParityLost
    );
}

#[test]
fn a_parity_member_the_home_cannot_reach_either_is_rebuilt_before_a_call_goes_on() {
    let (rig, who) = striped();
    rig.net.cut(3, 5);
    rig.net.cut(HOME, 5);
    // Freeing a page sends its contents to the parity as a change to zero.
    rig.call(
        HOME,
        P2M_DONTNEED {
            who: who.clone(),
            addr: vpn(0, 0) * PAGE,
            len: PAGE,
        },
    )
    .expect("done on a rebuilt parity");
    assert_eq!(ids(&rig.set(HOME, &who, idx(0))), vec![3, 4, 6]);
    assert_eq!(rig.read(HOME, &who, vpn(0, 0)).unwrap(), vec![0; PAGE_SIZE]);

    rig.down(4);
    rig.call(
        HOME,
        P2M_REPLICA_LOST {
            who: who.clone(),
            lost: 4,
            vpn: vpn(0, 16),
        },
    )
    .unwrap();
    for p in 1..8 {
        let v = vpn(0, p * 5);
        assert_eq!(rig.read(HOME, &who, v).unwrap(), content(v, 0), "page {v:#x}");
    }
}
