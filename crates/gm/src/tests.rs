//! The managers in process: membership, placement and what a restarted manager resumes, driven
//! through the calls their dispatch table makes, on a state store in a temporary file. No
//! component runs; a component's silence is made by ageing its last heartbeat.
use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

struct Rig {
    gm: Arc<Gm>,
    args: GmArgs,
    dir: tempfile::TempDir,
}

impl Rig {
    fn new(cluster: impl FnOnce(&mut splitos_core::config::GmConfig)) -> Rig {
        let mut args = GmArgs::for_test();
        cluster(&mut args.cluster);
        let dir = tempfile::tempdir().unwrap();
        let gm = Rig::open(&args, &dir);
        Rig { gm, args, dir }
    }

    fn open(args: &GmArgs, dir: &tempfile::TempDir) -> Arc<Gm> {
        let t = args.process.transport.build(None).unwrap();
        let store = state::Store::for_test(&dir.path().join("managers.state"));
        Gm::open(args, "127.0.0.1:7100", &t, store, None).unwrap()
    }

    /// The managers stop and start again on the same state.
    fn restart(self) -> Rig {
        let Rig { gm, args, dir } = self;
        drop(gm);
        let gm = Rig::open(&args, &dir);
        Rig { gm, args, dir }
    }

    fn register(&self, role: Role, addr: &str, capacity: u64, id: u32) -> Result<u32, ErrCode> {
        self.gm
            .register(X2G_REGISTER {
                role,
                addr: addr.into(),
                shim_sock: None,
                nics: Vec::new(),
                load: Load {
                    capacity,
                    ..Load::default()
                },
                id,
                metrics: None,
                standby: false,
                ebbs: Vec::new(),
            })
            .map(|r| r.id)
            .map_err(|e| e.code)
    }

    fn join(&self, role: Role, addr: &str, capacity: u64) -> u32 {
        self.register(role, addr, capacity, 0).unwrap()
    }

    fn beat(&self, id: u32, addr: &str, load: Load) -> Result<G2X_BEAT, Refusal> {
        // Others heartbeat meanwhile: the managers were not stalled.
        *self.gm.last_any.lock().unwrap() = Instant::now();
        self.gm.heartbeat(X2G_HEARTBEAT {
            id,
            addr: addr.into(),
            load,
            links: Vec::new(),
            leaving: None,
            ebbs: Vec::new(),
        })
    }

    fn used(&self, id: u32, addr: &str, used: u64) {
        self.beat(
            id,
            addr,
            Load {
                capacity: GIB,
                used,
                ..Load::default()
            },
        )
        .unwrap();
    }

    /// Component `id` was last heard `ago`.
    fn silent(&self, id: u32, ago: Duration) {
        let mut comps = self.gm.comps.lock().unwrap();
        let e = comps.iter_mut().find(|e| e.info.id == id).expect("registered");
        e.last = Instant::now().checked_sub(ago).expect("this host has been up longer");
    }

    fn info(&self, id: u32) -> Option<ComponentInfo> {
        self.gm.snapshot().into_iter().find(|c| c.id == id)
    }

    fn pick(&self, need: u64, exclude: &[u32]) -> Result<u32, ErrCode> {
        self.gm
            .pick_memory(need, exclude, None)
            .map(|c| c.id)
            .map_err(|e| e.code())
    }
}

#[test]
fn a_component_keeps_its_id_across_a_restart_of_the_managers_and_heartbeats_only_from_its_address() {
    let r = Rig::new(|_| {});
    let m = r.join(Role::Mem, "10.0.0.1:7000", GIB);
    let p = r.join(Role::Proc, "10.0.0.2:7000", 0);
    assert_ne!(m, p);
    // The same start registering again keeps its id; another component asking for that id
    // at another address gets a new one.
    assert_eq!(r.register(Role::Mem, "10.0.0.1:7000", GIB, m), Ok(m));
    let other = r.register(Role::Mem, "10.0.0.3:7000", GIB, m).unwrap();
    assert!(![0, m, p].contains(&other));
    assert_eq!(r.gm.snapshot().len(), 3);

    let r = r.restart();
    assert_eq!(r.gm.snapshot().len(), 3, "the membership is resumed");
    r.used(m, "10.0.0.1:7000", 0);
    assert_eq!(
        r.beat(m, "10.0.0.9:7000", Load::default())
            .map(|_| ())
            .map_err(|e| e.code),
        Err(ErrCode::NotFound),
        "a heartbeat counts only from the address its id was registered at"
    );
    assert_eq!(
        r.register(Role::Mem, "10.0.0.1:7000", GIB, m),
        Ok(m),
        "nobody registers anew"
    );
}

#[test]
fn silence_makes_an_mcomponent_late_then_lost_then_forgotten_and_still_told_lost_until_it_returns() {
    let r = Rig::new(|c| {
        c.reclaim_dead_ms = 2_000;
        c.forget_dead_ms = 6_000;
    });
    let (m1, m2) = (
        r.join(Role::Mem, "10.0.0.1:7000", GIB),
        r.join(Role::Mem, "10.0.0.2:7000", GIB),
    );
    let p = r.join(Role::Proc, "10.0.0.3:7000", 0);
    let told_lost = || r.beat(p, "10.0.0.3:7000", Load::default()).unwrap().lost_mcomps;

    r.silent(m1, HEARTBEAT * MISSED_BEATS + Duration::from_millis(100));
    let late = r.info(m1).unwrap();
    assert!(!late.alive && !late.lost, "late, not lost: {late:?}");
    assert!(told_lost().is_empty(), "a late mComponent is waited for");
    assert_eq!(r.pick(MIB, &[]), Ok(m2), "a late mComponent takes no new memory");

    r.silent(m1, Duration::from_millis(2_100));
    assert!(r.info(m1).unwrap().lost);
    assert_eq!(told_lost(), vec![m1]);

    r.silent(m1, Duration::from_millis(6_100));
    assert!(r.info(m1).is_none(), "forgotten");
    assert_eq!(told_lost(), vec![m1], "a forgotten mComponent is still told lost");

    assert_eq!(r.register(Role::Mem, "10.0.0.1:7000", GIB, m1), Ok(m1));
    assert!(told_lost().is_empty(), "back under its id, it is no longer lost");
    assert!(r.info(m1).unwrap().alive);
}

#[test]
fn memory_goes_to_the_least_loaded_mcomponent_with_room_never_a_cordoned_or_excluded_one() {
    let r = Rig::new(|_| {});
    let addrs = ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"];
    let [m1, m2, m3] = addrs.map(|a| r.join(Role::Mem, a, GIB));
    for (id, (addr, used)) in [m1, m2, m3]
        .into_iter()
        .zip(addrs.iter().zip([600 * MIB, 100 * MIB, 300 * MIB]))
    {
        r.used(id, addr, used);
    }
    assert_eq!(r.pick(4 * MIB, &[]), Ok(m2));
    assert_eq!(r.pick(4 * MIB, &[m2]), Ok(m3));
    r.gm.cordon(m2, true).unwrap();
    assert_eq!(
        r.pick(4 * MIB, &[]),
        Ok(m3),
        "a cordoned mComponent takes no new memory"
    );
    assert_eq!(
        r.pick(800 * MIB, &[]),
        Err(ErrCode::NoMemory),
        "none has 800 MiB free but the cordoned one"
    );
    r.gm.cordon(m2, false).unwrap();

    // What is promised counts until the next heartbeat reports it.
    assert_eq!(r.pick(600 * MIB, &[]), Ok(m2));
    assert_eq!(r.pick(600 * MIB, &[]), Ok(m3));
    assert_eq!(r.pick(600 * MIB, &[]), Err(ErrCode::NoMemory));
    r.used(m2, addrs[1], 100 * MIB);
    assert_eq!(r.pick(600 * MIB, &[]), Ok(m2));

    // A copy goes to a host none of the others is on while there is one.
    let beside = r.join(Role::Mem, "10.0.0.1:7001", GIB);
    r.used(beside, "10.0.0.1:7001", 0);
    assert_eq!(r.pick(4 * MIB, &[]), Ok(beside), "the emptiest");
    assert_ne!(r.pick(4 * MIB, &[m1]), Ok(beside), "not beside the copy it replicates");
    assert_eq!(r.pick(4 * MIB, &[m1, m2, m3]), Ok(beside), "unless no other has room");
}

#[test]
fn a_process_goes_to_the_pcomponent_with_the_fewest_threads_that_is_not_cordoned() {
    let r = Rig::new(|_| {});
    let (a, b) = ("10.0.0.1:7000", "10.0.0.2:7000");
    let (p1, p2) = (r.join(Role::Proc, a, 0), r.join(Role::Proc, b, 0));
    let threads = |n| Load {
        threads: n,
        ..Load::default()
    };
    r.beat(p1, a, threads(10)).unwrap();
    r.beat(p2, b, threads(2)).unwrap();
    assert_eq!(r.gm.place_process().unwrap().pcomp.id, p2);
    r.gm.cordon(p2, true).unwrap();
    assert_eq!(r.gm.place_process().unwrap().pcomp.id, p1);
    r.gm.cordon(p1, true).unwrap();
    assert_eq!(
        r.gm.place_process().map(|_| ()).map_err(|e| e.code),
        Err(ErrCode::Unreachable)
    );
}

#[test]
fn a_vnodes_scomponent_is_the_same_after_a_restart_and_moves_only_when_its_own_is_silent() {
    let r = Rig::new(|_| {});
    let addrs = ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"];
    let ids = addrs.map(|a| r.join(Role::Storage, a, 0));
    let vnodes: Vec<String> = (0..24).map(|i| format!("vnode-{i}")).collect();
    let storage = |r: &Rig| -> Vec<u32> {
        vnodes
            .iter()
            .map(|v| {
                r.gm.vnode_storage(P2G_VNODE_STORAGE { vnode: v.clone() })
                    .unwrap()
                    .scomp
                    .id
            })
            .collect()
    };
    let before = storage(&r);
    assert!(ids.iter().all(|id| before.contains(id)), "spread over all: {before:?}");
    let r = r.restart();
    assert_eq!(storage(&r), before, "the same picks after a restart");

    r.silent(ids[0], HEARTBEAT * MISSED_BEATS + Duration::from_millis(100));
    let after = storage(&r);
    for (b, a) in before.iter().zip(&after) {
        match *b == ids[0] {
            true => assert_ne!(a, b),
            false => assert_eq!(a, b, "only the silent one's vNodes move"),
        }
    }
}

#[test]
fn a_detached_mcomponent_leaves_placement_one_at_a_time_and_is_told_to_exit_once_empty() {
    let r = Rig::new(|_| {});
    let addrs = ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"];
    let [m1, m2, m3] = addrs.map(|a| r.join(Role::Mem, a, GIB));
    let p = r.join(Role::Proc, "10.0.0.9:7000", 0);
    assert!(
        matches!(r.gm.detach(p, true), Err(ComponentError::NotDetachable { .. })),
        "only mComponents are detached"
    );
    let fill = |used: [u64; 3]| {
        for ((id, addr), used) in [m1, m2, m3].into_iter().zip(addrs).zip(used) {
            r.used(id, addr, used);
        }
    };
    fill([900 * MIB, 600 * MIB, 600 * MIB]);
    assert!(
        matches!(r.gm.detach(m1, true), Err(ComponentError::NoRoomToMove { .. })),
        "the others lack room for what it holds"
    );
    fill([50 * MIB, 100 * MIB, 100 * MIB]);

    assert!(r.gm.detach(m1, true).unwrap().leaving.is_some());
    assert_ne!(r.pick(4 * MIB, &[]), Ok(m1), "the emptiest, but leaving");
    let answer = |id: u32, addr: &str, leaving: Option<Leaving>| {
        *r.gm.last_any.lock().unwrap() = Instant::now();
        r.gm.heartbeat(X2G_HEARTBEAT {
            id,
            addr: addr.into(),
            load: Load {
                capacity: GIB,
                ..Load::default()
            },
            links: Vec::new(),
            leaving,
            ebbs: Vec::new(),
        })
        .unwrap()
    };
    assert_eq!(
        answer(m2, addrs[1], None).leaving,
        vec![m1],
        "every home is told to move off it"
    );
    assert!(
        matches!(r.gm.detach(m2, true), Err(ComponentError::OneDetachAtATime { other }) if other == m1),
        "one detach at a time"
    );

    let left = Leaving {
        bytes_at_start: 50 * MIB,
        bytes_left: 10 * MIB,
        ..Leaving::default()
    };
    assert!(!answer(m1, addrs[0], Some(left.clone())).exit, "not empty yet");
    assert_eq!(
        r.info(m1).unwrap().leaving.unwrap().bytes_left,
        10 * MIB,
        "its progress is shown"
    );
    let empty = Leaving {
        bytes_left: 0,
        ..left.clone()
    };
    assert!(
        !answer(m1, addrs[0], Some(empty.clone())).exit,
        "its buffer cache is not handed over yet"
    );
    let empty = Leaving {
        files_released: true,
        ..empty
    };
    assert!(answer(m1, addrs[0], Some(empty.clone())).exit, "empty: it exits");
    assert!(r.info(m1).is_none(), "forgotten, not lost");
    assert!(
        answer(m1, addrs[0], Some(empty)).exit,
        "told again if the answer was lost"
    );

    // A drain leaves it empty and out of placement until it is attached again; the last
    // mComponent that takes memory is never detached.
    assert!(r.gm.detach(m2, false).is_ok());
    let drained = Leaving {
        bytes_at_start: 100 * MIB,
        files_released: true,
        ..Leaving::default()
    };
    assert!(!answer(m2, addrs[1], Some(drained)).exit, "a drained mComponent stays");
    assert!(
        matches!(r.gm.detach(m3, true), Err(ComponentError::LastMComponent { .. })),
        "the last that takes memory"
    );
    assert!(r.gm.attach(m2).unwrap().leaving.is_none());
    r.used(m3, addrs[2], 500 * MIB);
    assert_eq!(r.pick(4 * MIB, &[]), Ok(m2), "attached, it takes memory again");
}
