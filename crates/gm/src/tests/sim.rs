//! The managers under seeded faults, in simulated time: three managers take leases and elect a
//! leader through a simulated keeper (leases, revisions and transactions as etcd keeps them),
//! and the one that leads serves its real handlers (`Manager::handle` over `Gm`, the state in
//! the keeper) to simulated pComponents and mComponents. The network loses, delays, reorders
//! and duplicates messages; managers crash, pause, and lose the keeper; the keeper's answers
//! are lost or late; components crash, pause and are detached. Time moves only when the
//! simulator moves it, so a seed replays exactly. Invariants are checked after every step; a
//! failing seed panics with the seed, what broke and the whole trace.
//! `SPLITOS_GM_SIM_SEEDS` (how many) and `SPLITOS_GM_SIM_FIRST` (from which) run others.
use super::*;
use crate::clock::{Clock, Simulated};
use crate::election::{Claim, Election, Held, Keeper, Round, WATCH};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};

mod faults;
mod keeper;
mod managers;
use keeper::{Kv, SimKeeper, World};
use managers::Mgr;

const MANAGERS: usize = 3;
const PCOMPS: u32 = 3;
const MCOMPS: u32 = 5;
/// One step of simulated time.
const TICK: Duration = Duration::from_millis(10);
/// Faults are drawn for this long, then the network heals and everything that is down comes
/// back (but crashed components, which stay down) for [`QUIET`].
const FAULTY: Duration = Duration::from_secs(40);
const QUIET: Duration = Duration::from_secs(14);
/// How long a component waits for the managers' answer (a real one waits 5 s; shorter here,
/// so that lost answers cost less simulated time).
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// Lease of each manager at the keeper.
const LEASE: Duration = Duration::from_secs(2);
/// The keeper applies a request up to this long after it was sent: its clock may run ahead
/// of a manager's by as much (less than the election's margin).
const KEEPER_LATE: u64 = 150;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Up {
    Running,
    Crashed,
    Paused,
    Exited,
}

struct Comp {
    id: u32,
    role: Role,
    addr: String,
    up: Up,
    paused_until: Option<Instant>,
    registered: bool,
    /// The manager it sends to.
    guess: usize,
    /// Its call under way: its number and until when it waits for the answer.
    call: Option<(u64, Instant)>,
    next: Instant,
    /// Once asked to leave: what it still holds (it moves one unit a beat).
    left: Option<u32>,
    /// The admin detached it: it is to exit (or crash).
    detaching: bool,
    /// When answers made from then on must fence it first: the managers announced it lost to
    /// another mComponent, which rebuilds its copies.
    must_fence: Option<Instant>,
    /// The last fence it acted on.
    fenced_by: u64,
    /// Its last call asked for a home.
    picked: bool,
    /// The number its current start drew (its registrations carry it).
    start: u64,
}

enum Flight {
    Request {
        m: usize,
        c: usize,
        seq: u64,
        msg: Msg,
    },
    Answer {
        c: usize,
        seq: u64,
        made: Instant,
        msg: Msg,
    },
}

struct Sim {
    world: Arc<World>,
    mgrs: Vec<Mgr>,
    comps: Vec<Comp>,
    /// Messages under way, by when they arrive.
    net: BTreeMap<(Instant, u64), Flight>,
    /// Cuts between component and manager, until when.
    cuts: BTreeMap<(usize, usize), Instant>,
    order: u64,
    args: GmArgs,
    t: Arc<dyn Transport>,
    key: state::StateKey,
    reclaim_dead: Duration,
    trace: Vec<String>,
    start: Instant,
    /// mComponents the admin detached, or told to exit: pComponents hear of them among the
    /// lost ones once they exit, however recently they were heard.
    detached: BTreeSet<u32>,
    /// Ids of components started anew under another: named lost at once, as replaced.
    replaced: BTreeSet<u32>,
    /// The id the managers last gave at each component's address: a registration after it
    /// under another replaces it (a new start, whose first answer may have been lost; or one
    /// replaced by a late registration that registers again under its id).
    given: BTreeMap<usize, u32>,
}

fn is_leader_only(msg: &Msg) -> bool {
    matches!(
        msg,
        Msg::X2G_REGISTER(_) | Msg::X2G_HEARTBEAT(_) | Msg::P2G_PICK_HOME(_)
    )
}

impl Sim {
    fn new(seed: u64, args: &GmArgs, t: &Arc<dyn Transport>, key: &state::StateKey) -> Sim {
        let clock = Arc::new(Simulated::new());
        let world = Arc::new(World {
            kv: Mutex::new(Kv {
                now: clock.now(),
                revision: 1,
                keys: BTreeMap::new(),
                leases: BTreeMap::new(),
            }),
            clock: clock.clone(),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            tally: Mutex::default(),
            calm: AtomicBool::new(false),
        });
        let start = clock.now();
        let mgrs = (0..MANAGERS)
            .map(|i| Mgr {
                addr: format!("10.0.0.{}:7100", i + 1),
                keeper: Arc::new(SimKeeper {
                    world: world.clone(),
                    cut: AtomicBool::new(false),
                    term: AtomicI64::new(0),
                }),
                run: None,
                lease_taken: false,
                next_round: start,
                next_renew: start,
                paused_until: None,
                down_until: Some(start),
                heard: BTreeMap::new(),
                fresh: start,
                last_any: None,
                detaching: BTreeSet::new(),
            })
            .collect();
        let comps = (0..PCOMPS + MCOMPS)
            .map(|i| Comp {
                id: 1000 + i,
                role: if i < PCOMPS { Role::Proc } else { Role::Mem },
                addr: format!("10.0.1.{}:7200", i + 1),
                up: Up::Running,
                paused_until: None,
                registered: false,
                guess: i as usize % MANAGERS,
                call: None,
                next: start + Duration::from_millis(10 * i as u64),
                left: None,
                detaching: false,
                must_fence: None,
                fenced_by: 0,
                picked: false,
                start: 1 + i as u64,
            })
            .collect();
        Sim {
            world,
            mgrs,
            comps,
            net: BTreeMap::new(),
            cuts: BTreeMap::new(),
            order: 0,
            args: args.clone(),
            t: t.clone(),
            key: key.clone(),
            reclaim_dead: Duration::from_millis(args.cluster.reclaim_dead_ms),
            trace: Vec::new(),
            start,
            detached: BTreeSet::new(),
            replaced: BTreeSet::new(),
            given: BTreeMap::new(),
        }
    }

    fn now(&self) -> Instant {
        self.world.clock.now()
    }

    fn rng(&self) -> std::sync::MutexGuard<'_, StdRng> {
        self.world.rng.lock().unwrap()
    }

    fn note(&mut self, what: &'static str, line: String) {
        self.world.count(what);
        let at = self.now().duration_since(self.start).as_millis();
        self.trace.push(format!("{at:>6} ms  {line}"));
    }

    fn fail(&self, seed: u64, why: String) -> ! {
        let trace = self.trace.join("\n");
        let at = self.now().duration_since(self.start).as_millis();
        let why = format!("at {at} ms, {why}");
        panic!("gm simulation seed {seed}: {why}\n(SPLITOS_GM_SIM_FIRST={seed} SPLITOS_GM_SIM_SEEDS=1 replays it)\ntrace:\n{trace}");
    }

    /// Sends `flight` to arrive after a drawn delay: lost one time in twenty-five, late one time in
    /// ten (which reorders it behind later ones), a request duplicated one time in forty.
    fn send(&mut self, flight: Flight, cut: bool) {
        let (lost, late, again) = (
            self.world.ratio(1, 25),
            self.world.ratio(1, 10),
            self.world.ratio(1, 40),
        );
        let (delay, delay2) = {
            let mut r = self.rng();
            (r.random_range(1..=40u64), r.random_range(1..=1500u64))
        };
        if cut || lost {
            self.world.count("messages lost");
            return;
        }
        let delay = Duration::from_millis(if late { 200 + delay2 } else { delay });
        if late {
            self.world.count("messages late");
        }
        let at = self.now() + delay;
        if let (true, Flight::Request { m, c, seq, msg }) = (again, &flight) {
            self.world.count("requests duplicated");
            let copy = Flight::Request {
                m: *m,
                c: *c,
                seq: *seq,
                msg: msg.clone(),
            };
            self.order += 1;
            self.net.insert((at + Duration::from_millis(delay2), self.order), copy);
        }
        self.order += 1;
        self.net.insert((at, self.order), flight);
    }

    fn cut(&self, c: usize, m: usize) -> bool {
        self.cuts.get(&(c, m)).is_some_and(|u| *u > self.now())
    }

    fn leader_at_keeper(&self) -> Option<(String, i64)> {
        let mut kv = self.world.kv.lock().unwrap();
        kv.at(self.world.clock.now());
        kv.leader()
    }

    // ---- the components

    fn request(&self, c: usize) -> Msg {
        let k = &self.comps[c];
        let load = Load {
            capacity: GIB,
            ..Load::default()
        };
        if !k.registered {
            return Msg::X2G_REGISTER(X2G_REGISTER {
                role: k.role,
                addr: k.addr.clone(),
                shim_sock: None,
                nics: Vec::new(),
                load,
                id: k.id,
                metrics: None,
                standby: false,
                ebbs: Vec::new(),
                fenced_by: k.fenced_by,
                start: k.start,
            });
        }
        // A pComponent asks for homes between its heartbeats (which a real one sends from a
        // thread of their own), never instead of two in a row.
        if k.role == Role::Proc && !k.picked && self.rng().random_ratio(1, 3) {
            return Msg::P2G_PICK_HOME(P2G_PICK_HOME {
                vnode: "sim".into(),
                pcomp: k.id,
            });
        }
        Msg::X2G_HEARTBEAT(X2G_HEARTBEAT {
            id: k.id,
            addr: k.addr.clone(),
            load,
            links: Vec::new(),
            leaving: k.left.map(|n| Leaving {
                bytes_left: n as u64 * MIB,
                homes: n,
                files_released: n == 0,
                exit: true,
                ..Leaving::default()
            }),
            ebbs: Vec::new(),
            fenced_by: k.fenced_by,
        })
    }

    fn component_step(&mut self, c: usize) {
        let now = self.now();
        let k = &mut self.comps[c];
        if k.up == Up::Paused && k.paused_until.is_some_and(|u| u <= now) {
            k.up = Up::Running;
            k.paused_until = None;
            let id = k.id;
            self.note("components resumed", format!("component {id} resumes"));
        }
        let k = &mut self.comps[c];
        if k.up != Up::Running {
            return;
        }
        if let Some((_, deadline)) = k.call {
            if deadline > now {
                return;
            }
            // No answer in time: it asks another manager (as a component asks who leads).
            k.call = None;
            k.guess = (k.guess + 1) % MANAGERS;
            k.next = now;
        }
        if now < k.next {
            return;
        }
        let msg = self.request(c);
        self.comps[c].picked = matches!(msg, Msg::P2G_PICK_HOME(_));
        self.order += 1;
        let seq = self.order;
        let k = &mut self.comps[c];
        k.call = Some((seq, now + CALL_TIMEOUT));
        let m = k.guess;
        let cut = self.cut(c, m);
        self.send(Flight::Request { m, c, seq, msg }, cut);
    }

    /// Delivers what is due (only to manager `only`, if given: what waited for it while it was
    /// paused).
    fn deliver(&mut self, seed: u64, only: Option<usize>) {
        let now = self.now();
        let due: Vec<(Instant, u64)> = self
            .net
            .range(..=(now, u64::MAX))
            .filter(|(_, f)| match (only, f) {
                (Some(o), Flight::Request { m, .. }) => *m == o,
                (Some(_), Flight::Answer { .. }) => false,
                (None, _) => true,
            })
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            let f = self.net.remove(&k).expect("due");
            match f {
                Flight::Request { m, c, seq, msg } => self.serve(seed, m, c, seq, msg, k),
                Flight::Answer { c, seq, made, msg } => self.answered(seed, c, seq, made, msg),
            }
        }
    }

    /// Manager `m` serves a request of component `c`.
    fn serve(&mut self, seed: u64, m: usize, c: usize, seq: u64, msg: Msg, key: (Instant, u64)) {
        let now = self.now();
        if self.mgrs[m].paused_until.is_some_and(|u| u > now) {
            // It waits in the paused manager's socket.
            self.net.insert(
                (self.mgrs[m].paused_until.unwrap(), key.1),
                Flight::Request { m, c, seq, msg },
            );
            return;
        }
        let Some((election, manager)) = self.mgrs[m].run.clone() else {
            return;
        };
        let leader_only = is_leader_only(&msg);
        let name = msg.name();
        let heartbeat = matches!(msg, Msg::X2G_HEARTBEAT(_));
        // The id the request was sent under: a late one of an earlier start has its own.
        let id = match &msg {
            Msg::X2G_HEARTBEAT(r) => r.id,
            Msg::X2G_REGISTER(r) => r.id,
            Msg::P2G_PICK_HOME(r) => r.pcomp,
            _ => self.comps[c].id,
        };
        let answer = manager.handle(msg);
        if leader_only && !matches!(answer, Msg::ERR(_)) {
            // Invariant: only the manager whose lease is live at the keeper answers for the
            // cluster.
            self.check_leads(seed, m, election.term(), &format!("answered {name} of component {id}"));
            self.check_answer(seed, m, c, id, &answer);
        }
        if heartbeat && manager.leading().is_some() {
            let g = &mut self.mgrs[m];
            if g.last_any
                .is_some_and(|l| now.saturating_duration_since(l) > HEARTBEAT * MISSED_BEATS)
            {
                g.fresh = now;
            }
            g.last_any = Some(now);
        }
        match &answer {
            Msg::G2X_BEAT(_) => _ = self.mgrs[m].heard.insert(id, now),
            Msg::G2X_REGISTERED(r) => _ = self.mgrs[m].heard.insert(r.id, now),
            _ => {}
        }
        if let Msg::G2X_REGISTERED(r) = &answer {
            if let Some(earlier) = self.given.insert(c, r.id).filter(|e| *e != r.id) {
                self.replaced.insert(earlier);
            }
        }
        // Told to exit, it has left the membership: its detach ended.
        if matches!(&answer, Msg::G2X_BEAT(b) if b.exit) {
            self.detached.insert(id);
            self.mgrs[m].detaching.remove(&id);
        }
        let cut = self.cut(c, m);
        self.send(
            Flight::Answer {
                c,
                seq,
                made: now,
                msg: answer,
            },
            cut,
        );
    }

    /// Invariants of an answer leader `m` made for component `c`.
    fn check_answer(&mut self, seed: u64, m: usize, c: usize, sender: u32, answer: &Msg) {
        let now = self.now();
        let g = &self.mgrs[m];
        let alive = |id: u32| {
            g.heard
                .get(&id)
                .copied()
                .max(Some(g.fresh))
                .is_some_and(|t| now.saturating_duration_since(t) < HEARTBEAT * MISSED_BEATS)
        };
        match answer {
            Msg::G2X_BEAT(b) => {
                // Nothing heard of within the silence limit is named lost.
                let told = b
                    .lost_mcomps
                    .iter()
                    .filter(|x| !self.detached.contains(x) && !self.replaced.contains(x));
                for lost in b.lost.iter().map(|l| l.id).chain(told.copied()) {
                    if let Some(t) = g
                        .heard
                        .get(&lost)
                        .filter(|t| now.saturating_duration_since(**t) <= self.reclaim_dead)
                    {
                        let ago = now.saturating_duration_since(*t);
                        self.fail(
                            seed,
                            format!("the leader named component {lost} lost {ago:?} after it answered it"),
                        );
                    }
                }
                // Told to one it fences, which drops everything rather than rebuild, they are
                // no announcement.
                if self.comps[c].role == Role::Mem && b.fence == 0 {
                    let named: Vec<u32> = b
                        .lost_mcomps
                        .iter()
                        .copied()
                        .filter(|x| *x != self.comps[c].id)
                        .collect();
                    for x in named {
                        let k = self.comps.iter_mut().find(|k| k.id == x);
                        if let Some(k) = k.filter(|k| k.must_fence.is_none()) {
                            k.must_fence = Some(now);
                            let to = self.comps[c].id;
                            self.note(
                                "mComponents announced lost",
                                format!("mComponent {x} announced lost to {to}"),
                            );
                        }
                    }
                }
            }
            Msg::G2P_HOME(h) => {
                let x = h.mcomp.id;
                if !alive(x) {
                    self.fail(seed, format!("mComponent {x} was picked as a home while the leader had not heard it for the silence limit"));
                }
                if g.detaching.contains(&x) {
                    self.fail(
                        seed,
                        format!("mComponent {x} was picked as a home while it was being detached"),
                    );
                }
                self.world.count("homes picked");
            }
            Msg::G2X_REGISTERED(r) if sender != 0 && r.id != sender => {
                let want = sender;
                self.fail(seed, format!("component {want} registering again got id {}", r.id));
            }
            _ => {}
        }
    }

    /// Component `c` receives an answer made at `made`.
    fn answered(&mut self, seed: u64, c: usize, seq: u64, made: Instant, msg: Msg) {
        let now = self.now();
        let k = &mut self.comps[c];
        if k.up != Up::Running || k.call.is_none_or(|(s, d)| s != seq || d < now) {
            // Late, or for a call given up: the caller's transport drops it.
            return;
        }
        k.call = None;
        k.next = now + HEARTBEAT;
        let id = k.id;
        let fence = match &msg {
            Msg::G2X_BEAT(b) => b.fence,
            Msg::G2X_REGISTERED(r) => r.fence,
            _ => 0,
        };
        let fenced = fence != 0;
        if matches!(msg, Msg::G2X_BEAT(_) | Msg::G2X_REGISTERED(_)) {
            match (fenced, k.must_fence) {
                (true, _) => {
                    // It holds nothing now: a detach under way finds it empty.
                    k.must_fence = None;
                    k.fenced_by = fence;
                    k.left = k.left.map(|_| 0);
                    self.note(
                        "mComponents fenced",
                        format!("mComponent {id} is fenced: it drops its copies"),
                    );
                }
                // Told to exit (detached, and empty), it serves nothing more.
                (false, Some(a)) if made > a && !matches!(&msg, Msg::G2X_BEAT(b) if b.exit) => {
                    let ago = made.duration_since(a);
                    self.fail(
                        seed,
                        format!("mComponent {id} was announced lost, and an answer made {ago:?} later did not fence it: it serves copies rebuilt elsewhere"),
                    );
                }
                _ => {}
            }
        }
        let k = &mut self.comps[c];
        match msg {
            Msg::G2X_REGISTERED(r) => {
                k.registered = true;
                k.id = r.id;
            }
            Msg::G2X_BEAT(b) => {
                if b.exit {
                    k.up = Up::Exited;
                    self.note("mComponents detached", format!("mComponent {id} is detached and exits"));
                    return;
                }
                // Named leaving, it moves a unit a beat; no longer named, it stays.
                k.left = match b.leaving.contains(&id) {
                    true => Some(k.left.map_or(3, |n| n.saturating_sub(1))),
                    false => None,
                };
            }
            Msg::ERR(e) if e.code == ErrCode::NotFound => k.registered = false,
            Msg::ERR(e) if matches!(e.code, ErrCode::NotLeader | ErrCode::Unreachable) => {
                k.guess = (k.guess + 1) % MANAGERS;
                k.next = now;
            }
            _ => {}
        }
    }

    fn step(&mut self, seed: u64, faults: bool) {
        self.world.clock.advance(TICK);
        if faults {
            self.fault();
        }
        self.deliver(seed, None);
        for m in 0..MANAGERS {
            self.manager_step(m, seed);
        }
        for c in 0..self.comps.len() {
            self.component_step(c);
        }
        // At most one manager leads, and only while its lease is live at the keeper.
        let leading: Vec<usize> = (0..MANAGERS)
            .filter(|m| self.mgrs[*m].run.as_ref().is_some_and(|(e, _)| e.leading()))
            .collect();
        for m in leading {
            let term = self.mgrs[m].run.as_ref().unwrap().0.term();
            self.check_leads(seed, m, term, "takes itself for the leader");
        }
    }

    /// Fails unless manager `m`, which `did` something leaders do in `term`, holds the keeper's
    /// leader key in that term under a live lease.
    fn check_leads(&self, seed: u64, m: usize, term: i64, did: &str) {
        let holder = self.leader_at_keeper();
        if holder.as_ref() != Some(&(self.mgrs[m].addr.clone(), term)) {
            let addr = &self.mgrs[m].addr;
            self.fail(
                seed,
                format!("manager {addr} {did} in term {term} while the keeper's live leader is {holder:?}"),
            );
        }
    }

    /// After the faults: one leader, every component that runs registered with it and heard,
    /// every detach ended, every mComponent announced lost fenced.
    fn converged(&mut self, seed: u64) {
        let leaders: Vec<usize> = (0..MANAGERS)
            .filter(|m| self.mgrs[*m].run.as_ref().is_some_and(|(_, g)| g.leading().is_some()))
            .collect();
        if leaders.len() != 1 {
            self.fail(seed, format!("{} managers lead after the faults", leaders.len()));
        }
        let g = &self.mgrs[leaders[0]];
        let now = self.now();
        for k in self.comps.iter().filter(|k| k.up == Up::Running) {
            let heard = g
                .heard
                .get(&k.id)
                .is_some_and(|t| now.saturating_duration_since(*t) < Duration::from_secs(2));
            if !heard || !k.registered {
                let (id, leader, guess, registered) = (k.id, g.addr.clone(), k.guess, k.registered);
                self.fail(
                    seed,
                    format!("component {id} runs but the leader {leader} has not answered it lately (registered: {registered}, sends to manager {guess})"),
                );
            }
            if k.must_fence.is_some() {
                let id = k.id;
                self.fail(seed, format!("mComponent {id} was announced lost and runs unfenced"));
            }
            if k.detaching {
                let id = k.id;
                self.fail(seed, format!("the detach of mComponent {id} did not end"));
            }
        }
    }
}

fn run(seed: u64, args: &GmArgs, t: &Arc<dyn Transport>, key: &state::StateKey) -> BTreeMap<&'static str, u64> {
    let mut sim = Sim::new(seed, args, t, key);
    let faulty = (FAULTY.as_millis() / TICK.as_millis()) as usize;
    let quiet = (QUIET.as_millis() / TICK.as_millis()) as usize;
    for _ in 0..faulty {
        sim.step(seed, true);
    }
    sim.heal();
    for _ in 0..quiet {
        sim.step(seed, false);
    }
    sim.converged(seed);
    let tally = sim.world.tally.lock().unwrap().clone();
    tally
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn seeded_faults_never_give_two_leaders_an_answer_from_a_lapsed_lease_nor_a_lost_fence() {
    let _turn = TURNS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let key = state::StateKey::at(&dir.path().join("state.key"), true).unwrap();
    let mut args = GmArgs::defaults();
    args.cluster.replication = Some(Replication::Replica);
    let t = args.process.transport.build(None).unwrap();
    let (first, seeds) = (env("SPLITOS_GM_SIM_FIRST", 0), env("SPLITOS_GM_SIM_SEEDS", 2000));
    let mut total: BTreeMap<&'static str, u64> = BTreeMap::new();
    for seed in first..first + seeds {
        for (k, v) in run(seed, &args, &t, &key) {
            *total.entry(k).or_default() += v;
        }
    }
    eprintln!("gm simulation, {seeds} seeds from {first}: {total:?}");
    // The faults were drawn, not only the components' steps (a replay of a few seeds need not
    // draw every kind).
    let kinds = if seeds >= 100 { &KINDS[..] } else { &[] };
    for kind in kinds {
        assert!(
            total.get(kind).copied().unwrap_or(0) > 0,
            "no {kind} in {seeds} seeds: {total:?}"
        );
    }
}

/// What the suite's seeds must have drawn.
const KINDS: [&str; 12] = [
    "elections won",
    "managers ended",
    "managers paused",
    "keeper answers lost",
    "messages late",
    "requests duplicated",
    "components crashed",
    "mComponents announced lost",
    "mComponents fenced",
    "detaches started",
    "mComponents detached",
    "homes picked",
];
