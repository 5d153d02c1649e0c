//! Losses, fences and departures: what the managers tell of an mComponent declared lost or
//! detached, and that it outlives a lost answer, a registration again and a restart.
use super::*;

const ADDRS: [&str; 3] = ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"];

/// Managers with replicas, a 2 s silence limit, and three mComponents registered.
fn three_replicated() -> (Rig, [&'static str; 3], Vec<u32>) {
    let r = Rig::new(|c| {
        c.reclaim_dead_ms = 2_000;
        c.replication = Some(Replication::Replica);
    });
    let m = ADDRS.iter().map(|a| r.join(Role::Mem, a, GIB)).collect();
    (r, ADDRS, m)
}

/// The heartbeats' answers share a view of the cluster for up to 100 ms (view.rs); an
/// mComponent back after it was declared lost must not be named lost by an answer made from the
/// view before it came back: its peers would announce it again, and its next heartbeat would
/// fence it a second time, dropping copies rebuilt onto it meanwhile.
#[test]
fn an_mcomponent_back_after_its_loss_is_fenced_once_and_no_later_answer_names_it_lost() {
    let (r, addrs, m) = three_replicated();
    let beat = |i: usize| r.beat(m[i], addrs[i], Load::default()).unwrap();
    r.silent(m[0], Duration::from_millis(2_100));
    assert_eq!(beat(1).lost_mcomps, vec![m[0]], "declared lost, and so announced");
    // The view of that answer is fresh: what follows happens within its 100 ms.
    assert_ne!(beat(0).fence, 0, "back after it was announced lost: fenced");
    for i in [1, 2, 1] {
        assert!(
            beat(i).lost_mcomps.is_empty(),
            "an answer after it came back names it lost"
        );
    }
    assert_eq!(beat(0).fence, 0, "fenced twice");
    // Answers within the 100 ms share one view: no more were worked out for them.
    let views = || r.gm.views.worked_out();
    let before = views();
    for i in [1, 2, 1, 2] {
        beat(i);
    }
    assert!(views() - before <= 1, "{} views for four heartbeats", views() - before);
}

/// A fence is told until the mComponent names it back (`fenced_by`): the answer that fenced
/// it may be lost on the way, or made for a call its sender had given up, and an mComponent
/// that never heard it would serve copies rebuilt elsewhere. The fence outlives a restart of
/// the managers; once named back it ends, and a later loss brings a new one.
#[test]
fn a_fence_is_told_again_until_the_mcomponent_names_it_back_also_after_a_restart_of_the_managers() {
    let (r, addrs, m) = three_replicated();
    r.silent(m[0], Duration::from_millis(2_100));
    assert_eq!(r.beat(m[1], addrs[1], Load::default()).unwrap().lost_mcomps, vec![m[0]]);
    let unheard = |r: &Rig| r.beat_naming(m[0], addrs[0], Load::default(), 0).unwrap().fence;
    let fence = unheard(&r);
    assert_ne!(fence, 0, "back after it was announced lost: fenced");
    assert_eq!(unheard(&r), fence, "its answer was lost: the same fence again");
    let r = r.restart();
    assert_eq!(unheard(&r), fence, "a restart of the managers keeps the fence");
    let named = r.beat_naming(m[0], addrs[0], Load::default(), fence).unwrap();
    assert_eq!(named.fence, 0, "it acted on the fence: not fenced again");
    assert_eq!(unheard(&r), 0, "the fence ended once named back");
    r.silent(m[0], Duration::from_millis(2_100));
    assert_eq!(r.beat(m[1], addrs[1], Load::default()).unwrap().lost_mcomps, vec![m[0]]);
    let again = unheard(&r);
    assert!(again != 0 && again != fence, "a second loss brings a new fence");
}

/// A detach goes on across a registration of the mComponent under its id (the managers had
/// lost its registration, or it started anew, holding nothing): it still leaves placement,
/// and exits once it reports itself empty; a new start after it was told to exit is a new
/// member.
#[test]
fn a_detach_goes_on_across_a_registration_under_its_id_until_the_mcomponent_exits() {
    let r = Rig::new(|_| {});
    let addrs = ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"];
    let m: Vec<u32> = addrs.iter().map(|a| r.join(Role::Mem, a, GIB)).collect();
    assert!(r.gm.detach(m[0], true).unwrap().leaving.is_some());
    assert_eq!(r.register(Role::Mem, addrs[0], GIB, m[0]), Ok(m[0]), "registered again");
    assert_ne!(r.pick(MIB, &[]), Ok(m[0]), "still leaving after its registration");
    assert_eq!(r.beat(m[1], addrs[1], Load::default()).unwrap().leaving, vec![m[0]]);
    let empty = Leaving {
        files_released: true,
        exit: true,
        ..Leaving::default()
    };
    *r.gm.last_any.lock().unwrap() = Instant::now();
    let told =
        r.gm.heartbeat(X2G_HEARTBEAT {
            id: m[0],
            addr: addrs[0].into(),
            load: Load::default(),
            links: Vec::new(),
            leaving: Some(empty),
            ebbs: Vec::new(),
            fenced_by: 0,
        })
        .unwrap();
    assert!(told.exit, "empty: told to exit");
    assert_eq!(r.register(Role::Mem, addrs[0], GIB, m[0]), Ok(m[0]), "a new start");
    assert!(
        r.beat(m[1], addrs[1], Load::default()).unwrap().leaving.is_empty(),
        "a new member, not leaving"
    );
}

/// A registration without an id repeated under the same start (its answer lost, or handled
/// after a later one) gets the id the first got, also from a successor; one of an earlier
/// start under its old id, arriving after a new start registered at its address, is refused
/// while the new one is alive, rather than replacing it.
#[test]
fn a_repeated_registration_keeps_its_id_and_a_late_one_of_an_earlier_start_replaces_nothing() {
    let r = Rig::new(|_| {});
    let addr = "10.0.0.1:7000";
    let register = |r: &Rig, id: u32, start: u64| {
        r.gm.register(X2G_REGISTER {
            role: Role::Mem,
            addr: addr.into(),
            shim_sock: None,
            nics: Vec::new(),
            load: Load::default(),
            id,
            metrics: None,
            standby: false,
            ebbs: Vec::new(),
            fenced_by: 0,
            start,
        })
        .map(|g| g.id)
        .map_err(|e| e.code)
    };
    let first = register(&r, 0, 11).unwrap();
    assert_eq!(register(&r, 0, 11), Ok(first), "the same start again: the same id");
    let r = r.restart();
    assert_eq!(register(&r, 0, 11), Ok(first), "also from a successor");
    let renewed = register(&r, 0, 12).unwrap();
    assert_ne!(renewed, first, "a new start: a new id, replacing the first");
    assert_eq!(register(&r, first, 11), Err(ErrCode::Denied), "the earlier start, late");
    assert_eq!(
        r.beat(renewed, addr, Load::default()).map(|_| ()).map_err(|e| e.code),
        Ok(())
    );
}

/// A registration of another start at an mComponent's address (a late one, of a start that
/// died) replaces it while it lives on; once that one is silent it registers again under its
/// id, fenced as one announced lost. From then on it is a member: no answer names it lost, and
/// it is not fenced again. (It stayed named replaced, so was announced and fenced at every
/// heartbeat: found by the managers' simulation, seed 219,420.)
#[test]
fn an_mcomponent_replaced_by_a_late_registration_that_registers_again_is_fenced_once_and_named_lost_no_more() {
    let (r, addrs, m) = three_replicated();
    let beat = |i: usize| r.beat(m[i], addrs[i], Load::default());
    let ghost = r.register(Role::Mem, addrs[0], GIB, 0).unwrap();
    assert_ne!(ghost, m[0]);
    assert!(
        beat(1).unwrap().lost_mcomps.contains(&m[0]),
        "replaced, and so announced"
    );
    assert_eq!(beat(0).map(|_| ()).map_err(|e| e.code), Err(ErrCode::NotFound));
    assert_eq!(
        r.register(Role::Mem, addrs[0], GIB, m[0]),
        Err(ErrCode::Denied),
        "refused while the other start is heard"
    );
    r.silent(ghost, Duration::from_millis(1_300));
    assert_eq!(
        r.register(Role::Mem, addrs[0], GIB, m[0]),
        Ok(m[0]),
        "back under its id"
    );
    assert_ne!(beat(0).unwrap().fence, 0, "fenced: its copies were rebuilt elsewhere");
    for _ in 0..3 {
        for i in [1, 2] {
            let b = beat(i).unwrap();
            assert!(!b.lost_mcomps.contains(&m[0]), "a member again, named lost: {b:?}");
        }
        assert_eq!(beat(0).unwrap().fence, 0, "fenced again");
    }
}
