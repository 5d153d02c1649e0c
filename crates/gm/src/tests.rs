//! The managers in process: membership, placement and what a restarted manager resumes, driven
//! through the calls their dispatch table makes, on a state store in a temporary file. No
//! component runs; a component's silence is made by ageing its last heartbeat. The managers'
//! own calls to components go through a transport of the test's ([`Components`]), and a
//! follower's answers through an election of the test's ([`Election`]).
use super::*;
use manager::{Lead, Manager};
use splitos_core::node::{HEARTBEAT, MISSED_BEATS};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

struct Rig {
    gm: Arc<Gm>,
    args: GmArgs,
    dir: tempfile::TempDir,
    t: Arc<dyn Transport>,
    /// The last fence each component acted on, as a component's node keeps it: what its
    /// heartbeats name back (`beat` acts on every fence it is given).
    fenced_by: Mutex<std::collections::HashMap<u32, u64>>,
    /// The managers serve their placement Ebb under its static id, which one process holds
    /// once: tests running side by side take turns.
    _turn: std::sync::MutexGuard<'static, ()>,
}

pub(crate) static TURNS: Mutex<()> = Mutex::new(());

impl Rig {
    fn new(cluster: impl FnOnce(&mut splitos_core::config::GmConfig)) -> Rig {
        let mut args = GmArgs::defaults();
        cluster(&mut args.cluster);
        let t = args.process.transport.build(None).unwrap();
        Rig::on(args, t)
    }

    /// Managers whose calls to components `answer` answers.
    fn calling(answer: impl Fn(&str, &Msg) -> Result<Msg, RpcError> + Send + Sync + 'static) -> (Rig, Arc<Components>) {
        let comps = Arc::new(Components {
            calls: Mutex::default(),
            answer: Box::new(answer),
        });
        (Rig::on(GmArgs::defaults(), comps.clone()), comps)
    }

    fn on(args: GmArgs, t: Arc<dyn Transport>) -> Rig {
        let _turn = TURNS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let gm = Rig::open(&args, &dir, &t);
        Rig {
            gm,
            args,
            dir,
            t,
            fenced_by: Mutex::default(),
            _turn,
        }
    }

    fn open(args: &GmArgs, dir: &tempfile::TempDir, t: &Arc<dyn Transport>) -> Arc<Gm> {
        Gm::open(args, "127.0.0.1:7100", t, Rig::store(dir), None, Arc::new(clock::Host)).unwrap()
    }

    fn store(dir: &tempfile::TempDir) -> state::Store {
        state::Store::for_test(&dir.path().join("managers.state"))
    }

    /// The managers stop and start again on the same state.
    fn restart(self) -> Rig {
        let Rig {
            gm,
            args,
            dir,
            t,
            fenced_by,
            _turn,
        } = self;
        drop(gm);
        let gm = Rig::open(&args, &dir, &t);
        Rig {
            gm,
            args,
            dir,
            t,
            fenced_by,
            _turn,
        }
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
                fenced_by: 0,
                start: 0,
            })
            .map(|r| r.id)
            .map_err(|e| e.code)
    }

    fn join(&self, role: Role, addr: &str, capacity: u64) -> u32 {
        self.register(role, addr, capacity, 0).unwrap()
    }

    /// A heartbeat of component `id`, which acts on a fence its answer gives.
    fn beat(&self, id: u32, addr: &str, load: Load) -> Result<G2X_BEAT, Refusal> {
        let fenced_by = self.fenced_by.lock().unwrap().get(&id).copied().unwrap_or(0);
        let b = self.beat_naming(id, addr, load, fenced_by)?;
        if b.fence != 0 {
            self.fenced_by.lock().unwrap().insert(id, b.fence);
        }
        Ok(b)
    }

    /// A heartbeat of component `id` naming `fenced_by` as the last fence it acted on.
    fn beat_naming(&self, id: u32, addr: &str, load: Load, fenced_by: u64) -> Result<G2X_BEAT, Refusal> {
        // Others heartbeat meanwhile: the managers were not stalled.
        *self.gm.last_any.lock().unwrap() = Instant::now();
        self.gm.heartbeat(X2G_HEARTBEAT {
            id,
            addr: addr.into(),
            load,
            links: Vec::new(),
            leaving: None,
            ebbs: Vec::new(),
            fenced_by,
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

    /// Component `id` was last heard `ago`: as if that time had passed, the views and the
    /// walk for components to forget, which time renews, are due.
    fn silent(&self, id: u32, ago: Duration) {
        let mut comps = self.gm.comps.lock().unwrap();
        let e = comps.get_mut(&id).expect("registered");
        e.last = Instant::now().checked_sub(ago).expect("this host has been up longer");
        *self.gm.swept.lock().unwrap() = Instant::now() - crate::view::VIEW_FOR;
        self.gm.views.changed();
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
fn a_new_process_waits_for_a_live_mcomponent_to_be_its_home_where_memory_is_refused() {
    let r = Rig::new(|_| {});
    let m1 = r.join(Role::Mem, "10.0.0.1:7000", GIB);
    let p = r.join(Role::Proc, "10.0.0.3:7000", 0);
    let home = |r: &Rig| {
        r.gm.pick_home(P2G_PICK_HOME {
            vnode: "default".into(),
            pcomp: p,
        })
        .map(|h| h.mcomp.id)
        .map_err(|e| e.code)
    };
    assert_eq!(home(&r), Ok(m1));
    r.silent(m1, HEARTBEAT * MISSED_BEATS + Duration::from_millis(100));
    // Unreachable: the pComponent asks again until one is back (or its bound).
    assert_eq!(home(&r), Err(ErrCode::Unreachable), "no mComponent alive");
    assert_eq!(
        r.pick(MIB, &[]),
        Err(ErrCode::NoMemory),
        "a vRegion is refused as before"
    );
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

/// A pComponent's heartbeat load with `n` threads.
fn threads(n: u32) -> Load {
    Load {
        threads: n,
        ..Load::default()
    }
}

#[test]
fn a_process_goes_to_the_pcomponent_with_the_fewest_threads_that_is_not_cordoned() {
    let r = Rig::new(|_| {});
    let (a, b) = ("10.0.0.1:7000", "10.0.0.2:7000");
    let (p1, p2) = (r.join(Role::Proc, a, 0), r.join(Role::Proc, b, 0));
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
fn a_process_goes_to_a_late_pcomponent_only_when_none_is_alive_and_never_to_a_lost_one() {
    let r = Rig::new(|c| {
        c.reclaim_dead_ms = 2_000;
        c.forget_dead_ms = 6_000;
    });
    let (a, b) = ("10.0.0.1:7000", "10.0.0.2:7000");
    let (p1, p2) = (r.join(Role::Proc, a, 0), r.join(Role::Proc, b, 0));
    r.beat(p1, a, threads(0)).unwrap();
    r.beat(p2, b, threads(50)).unwrap();
    r.silent(p1, HEARTBEAT * MISSED_BEATS + Duration::from_millis(100));
    assert_eq!(
        r.gm.place_process().unwrap().pcomp.id,
        p2,
        "an alive one first, however loaded"
    );
    r.silent(p2, HEARTBEAT * MISSED_BEATS + Duration::from_millis(200));
    let late = r.gm.place_process().unwrap().pcomp.id;
    assert!([p1, p2].contains(&late), "with none alive, a late one: {late}");
    r.silent(p1, Duration::from_millis(2_100));
    r.silent(p2, Duration::from_millis(2_100));
    assert_eq!(
        r.gm.place_process().map(|_| ()).map_err(|e| e.code),
        Err(ErrCode::Unreachable),
        "a lost pComponent takes no program"
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

    // Every sComponent late (heartbeats delayed on a loaded host): each vNode keeps its own
    // rather than being refused its files; once they are silent past `reclaim_dead`, none is.
    for id in ids {
        r.silent(id, HEARTBEAT * MISSED_BEATS + Duration::from_millis(100));
    }
    assert_eq!(storage(&r), before, "late sComponents keep their vNodes");
    for id in ids {
        r.silent(id, Duration::from_millis(r.args.cluster.reclaim_dead_ms + 100));
    }
    let refused = r.gm.vnode_storage(P2G_VNODE_STORAGE {
        vnode: "vnode-0".into(),
    });
    assert_eq!(refused.map(|_| ()).map_err(|e| e.code), Err(ErrCode::Unreachable));
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
            fenced_by: 0,
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

/// How the test's components answer a call: the address it went to, and the request.
type Answer = Box<dyn Fn(&str, &Msg) -> Result<Msg, RpcError> + Send + Sync>;

/// Components as the managers' calls meet them: every call is kept, in order, and answered by
/// `answer`.
struct Components {
    calls: Mutex<Vec<(String, Msg)>>,
    answer: Answer,
}

impl Components {
    /// The calls made since the last look.
    fn taken(&self) -> Vec<(String, Msg)> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

impl Transport for Components {
    fn name(&self) -> &'static str {
        "in-process"
    }

    fn call(&self, addr: &str, msg: &Msg, _timeout: Duration) -> Result<Msg, RpcError> {
        self.calls.lock().unwrap().push((addr.to_string(), msg.clone()));
        (self.answer)(addr, msg)
    }

    fn listen(&self, addr: &str) -> std::io::Result<Box<dyn Endpoint>> {
        Err(std::io::Error::other(format!(
            "components in process listen nowhere ({addr})"
        )))
    }
}

fn job(pid: u64) -> JobInfo {
    JobInfo {
        pid,
        os_pid: 4242,
        uid: 1000,
        user: "ann".into(),
        vnode: "default".into(),
        command: "sleep 60".into(),
        started_unix_s: 0,
        misses: 0,
        evictions: 0,
        writebacks: 0,
    }
}

#[test]
fn the_managers_calls_reach_the_component_named_and_bring_back_its_answer_or_refusal() {
    let (r, comps) = Rig::calling(|addr, msg| match (addr, msg) {
        ("10.0.0.1:7000", Msg::G2P_SET_EXCACHE(x)) if x.size == Some(1) => Ok(Msg::ERR(ERR::new(
            ErrCode::Invalid,
            "an ExCache of 1 byte holds no line",
        ))),
        ("10.0.0.1:7000", Msg::G2P_SET_EXCACHE(x)) => Ok(P2G_EXCACHE {
            size: x.size.unwrap_or(0),
            max: 1 << 30,
            used: 0,
            shares: Vec::new(),
        }
        .into()),
        ("10.0.0.1:7000", Msg::G2P_SIGNAL(_)) => Ok(OK.into()),
        ("10.0.0.1:7000", Msg::G2P_JOBS(_)) => Ok(P2G_JOBS { jobs: vec![job(7)] }.into()),
        ("10.0.0.1:7000" | "10.0.0.3:7000", Msg::G2X_STATS(_)) => Ok(X2G_STATS {
            json: format!("{{\"addr\": \"{addr}\"}}"),
        }
        .into()),
        _ => Err(RpcError::Unreachable {
            addr: addr.into(),
            why: "it does not answer".into(),
        }),
    });
    let (pa, qa, ma) = ("10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000");
    let (p, q, m) = (
        r.join(Role::Proc, pa, 0),
        r.join(Role::Proc, qa, 0),
        r.join(Role::Mem, ma, GIB),
    );

    // The ExCache of the pComponent named is resized; its refusal comes back as it was made.
    assert_eq!(r.gm.set_excache(p, Some(64 * MIB), None).unwrap().size, 64 * MIB);
    let calls = comps.taken();
    assert!(
        matches!(&calls[..], [(a, Msg::G2P_SET_EXCACHE(x))] if a == pa && x.size == Some(64 * MIB) && x.shares.is_none()),
        "{calls:?}"
    );
    let refused = r.gm.set_excache(p, Some(1), None).unwrap_err();
    assert_eq!(refused.code, ErrCode::Invalid);
    assert!(refused.msg.contains("holds no line"), "{refused}");
    // An mComponent has no ExCache, and nothing is sent to it.
    comps.taken();
    assert_eq!(r.gm.set_excache(m, Some(MIB), None).unwrap_err().code, ErrCode::Invalid);
    assert!(comps.taken().is_empty());

    // Programs are listed from every alive pComponent at once; one that does not answer is
    // named with why.
    let jobs = r.gm.jobs();
    assert_eq!(jobs.running.len(), 1);
    assert_eq!((jobs.running[0].0.id, jobs.running[0].1.pid), (p, 7));
    assert_eq!(jobs.unanswered.len(), 1);
    assert_eq!(jobs.unanswered[0].0.id, q);
    assert!(
        jobs.unanswered[0].1.contains("does not answer"),
        "{:?}",
        jobs.unanswered
    );
    let mut asked: Vec<String> = comps.taken().into_iter().map(|(a, _)| a).collect();
    asked.sort();
    assert_eq!(asked, [pa, qa]);

    // A signal goes to the pComponent the program runs on.
    r.gm.signal(&r.info(p).unwrap(), 7, libc::SIGTERM).unwrap();
    let calls = comps.taken();
    assert!(
        matches!(&calls[..], [(a, Msg::G2P_SIGNAL(s))] if a == pa && s.pid == 7 && s.signal == libc::SIGTERM),
        "{calls:?}"
    );

    // Statistics: every alive component is asked; a silent one is not, and shows none.
    r.silent(q, HEARTBEAT * MISSED_BEATS + Duration::from_millis(100));
    let status = r.gm.status();
    let of = |id: u32| status.iter().find(|(c, _)| c.id == id).unwrap().1.clone();
    assert_eq!(of(p).unwrap()["addr"], pa);
    assert_eq!(of(m).unwrap()["addr"], ma);
    assert_eq!(of(q), None);
    let mut asked: Vec<String> = comps.taken().into_iter().map(|(a, _)| a).collect();
    asked.sort();
    assert_eq!(asked, [pa, ma]);
    // Nor is a silent pComponent's ExCache resized.
    assert_eq!(
        r.gm.set_excache(q, Some(MIB), None).unwrap_err().code,
        ErrCode::Unreachable
    );
    assert!(comps.taken().is_empty());
}

/// An election as the test has it: who leads, and whether this manager does, each time it is
/// asked (the last answer kept once the others are taken).
struct Election {
    leader: Option<String>,
    leads: Mutex<std::collections::VecDeque<bool>>,
    published: Option<Vec<u8>>,
}

impl Lead for Election {
    fn leading(&self) -> bool {
        let mut leads = self.leads.lock().unwrap();
        match leads.len() {
            0 => false,
            1 => leads[0],
            _ => leads.pop_front().unwrap(),
        }
    }

    fn seen(&self) -> election::Seen {
        election::Seen {
            leader: self.leader.clone(),
            term: 3,
        }
    }

    fn managers(&self) -> Vec<String> {
        vec!["10.0.0.9:7100".into(), "10.0.0.10:7100".into()]
    }

    fn published_status(&self) -> Option<Vec<u8>> {
        self.published.clone()
    }

    fn resign(&self) {}

    fn apis(&self) -> Vec<(String, String)> {
        vec![("10.0.0.9:7100".into(), "10.0.0.9:7443".into())]
    }

    fn apis_known(&self) -> Vec<String> {
        vec!["10.0.0.9:7443".into()]
    }
}

fn manager(r: &Rig, leader: Option<&str>, leads: &[bool], published: Option<Vec<u8>>) -> Manager {
    let m = Manager {
        election: Arc::new(Election {
            leader: leader.map(String::from),
            leads: Mutex::new(leads.iter().copied().collect()),
            published,
        }),
        gm: std::sync::OnceLock::new(),
        store: r.gm.store.clone(),
    };
    let _ = m.gm.set(r.gm.clone());
    m
}

fn refusal(answer: Msg) -> ERR {
    match answer {
        Msg::ERR(e) => e,
        other => panic!("answered {} where a refusal was due", other.name()),
    }
}

#[test]
fn a_follower_answers_who_leads_and_reads_and_refuses_the_rest_naming_the_leader() {
    let r = Rig::new(|_| {});
    let leader = "10.0.0.9:7100";
    let register = || {
        Msg::from(X2G_REGISTER {
            role: Role::Mem,
            addr: "10.0.0.3:7000".into(),
            shim_sock: None,
            nics: Vec::new(),
            load: Load::default(),
            id: 0,
            metrics: None,
            standby: false,
            ebbs: Vec::new(),
            fenced_by: 0,
            start: 0,
        })
    };
    let token = r.gm.tokens.create("ops", true, Vec::new()).unwrap();
    let status = G2C_STATUS {
        components: Vec::new(),
        vregion_size: GIB,
        api: Some("10.0.0.9:7443".into()),
        metrics: None,
        leader: None,
        managers: Vec::new(),
        apis: Vec::new(),
    };
    let f = manager(
        &r,
        Some(leader),
        &[false],
        Some(postcard::to_allocvec(&status).unwrap()),
    );

    // A change is refused, naming the leader to send it to; nothing reached the managers' state.
    let e = refusal(f.handle(register()));
    assert_eq!(e.code, ErrCode::NotLeader);
    assert!(e.msg.contains(leader), "{e}");
    assert!(r.gm.snapshot().is_empty());
    match f.handle(X2G_WHO_LEADS.into()) {
        Msg::G2X_LEADER(l) => assert_eq!((l.leader.as_deref(), l.term), (Some(leader), 3)),
        other => panic!("{}", other.name()),
    }
    // Reads: the leader's published status, with who leads and every manager; API tokens.
    match f.handle(C2G_STATUS.into()) {
        Msg::G2C_STATUS(s) => {
            assert_eq!(
                (s.leader.as_deref(), s.api.as_deref()),
                (Some(leader), Some("10.0.0.9:7443"))
            );
            assert_eq!(s.managers.len(), 2);
        }
        other => panic!("{}", other.name()),
    }
    match f.handle(X2G_API_TOKEN { token: token.clone() }.into()) {
        Msg::G2X_API_PRINCIPAL(p) => assert!(p.admin && p.name == "ops", "{p:?}"),
        other => panic!("{}", other.name()),
    }
    let unknown = refusal(f.handle(X2G_API_TOKEN { token: "forged".into() }.into()));
    assert_eq!(unknown.code, ErrCode::NotFound);

    // Before anyone is elected: refused as well, and no status to read.
    let lost = manager(&r, None, &[false], None);
    let e = refusal(lost.handle(register()));
    assert_eq!(e.code, ErrCode::NotLeader);
    assert!(e.msg.contains("no leader"), "{e}");
    assert_eq!(refusal(lost.handle(C2G_STATUS.into())).code, ErrCode::NotLeader);
}

#[test]
fn a_leader_whose_lease_lapses_while_it_answers_sends_a_refusal_instead() {
    let r = Rig::new(|_| {});
    let ping = || Msg::from(C2X_PING);
    // Leading before and after: the managers answer.
    let steady = manager(&r, Some("127.0.0.1:7100"), &[true], None);
    assert!(matches!(steady.handle(ping()), Msg::X2C_PONG(_)));
    // Leading when the request came, no longer once it was answered: another may lead by now.
    let lapsed = manager(&r, Some("10.0.0.10:7100"), &[true, false], None);
    let e = refusal(lapsed.handle(ping()));
    assert_eq!(e.code, ErrCode::NotLeader);
    assert!(e.msg.contains("10.0.0.10:7100"), "{e}");
}

mod lost;
mod sim;

/// Beyond `heartbeats_per_s` times 300 ms, the managers tell every component a longer
/// period, judge it alive by that period, and still declare it lost after `reclaim_dead`.
#[test]
fn a_cluster_larger_than_the_heartbeat_budget_is_told_a_longer_period_and_judged_by_it() {
    let r = Rig::new(|c| {
        c.heartbeats_per_s = 4;
        c.reclaim_dead_ms = 6_000;
    });
    let p = r.join(Role::Proc, "10.0.0.9:7000", 0);
    let told = r.beat(p, "10.0.0.9:7000", Load::default()).unwrap().beat_ms;
    assert_eq!(told, 300, "one component: the usual period");
    let mems: Vec<u32> = (1..=4)
        .map(|i| r.join(Role::Mem, &format!("10.0.0.{i}:7000"), GIB))
        .collect();
    // Five components at four beats a second: 1.25 s, to the next step.
    let b = r.beat(mems[0], "10.0.0.1:7000", Load::default()).unwrap();
    assert_eq!(b.beat_ms, 1_300);
    // Silent for three of its periods (longer than four of the usual ones): still alive.
    r.silent(mems[1], Duration::from_millis(3_900));
    assert!(r.info(mems[1]).unwrap().alive, "judged by its period");
    r.silent(mems[1], Duration::from_millis(5_300));
    let late = r.info(mems[1]).unwrap();
    assert!(!late.alive && !late.lost, "late after four of its periods: {late:?}");
    r.silent(mems[1], Duration::from_millis(6_100));
    assert!(r.info(mems[1]).unwrap().lost, "lost after reclaim_dead, as ever");
    // Off: 300 ms whatever the size.
    drop(r);
    let off = Rig::new(|c| c.heartbeats_per_s = 0);
    let ids: Vec<u32> = (1..=5)
        .map(|i| off.join(Role::Mem, &format!("10.0.1.{i}:7000"), GIB))
        .collect();
    assert_eq!(off.beat(ids[0], "10.0.1.1:7000", Load::default()).unwrap().beat_ms, 300);
}
