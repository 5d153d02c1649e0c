//! The managers at datacenter scale in simulated time (`splitos bench-managers --simulated`):
//! the real managers (one leader, its state in memory, every write counted) and thousands of
//! components played in the same thread under the simulation's clock (clock.rs), so that what
//! is measured is the managers' own work, without the transport, the kernel, etcd or a load
//! generator sharing the cores. Components register at a steady rate, then heartbeat at
//! phases of their own, every period the managers tell them; placement questions come at a steady rate; `fail`
//! mComponents fall silent halfway through the window. The time each request takes the
//! managers is measured on the host's clock; everything else runs in simulated time. The
//! managers run with `splitos gm`'s defaults (no replication, as the over-the-wire runs'
//! cluster), so losses are told without fences to keep.
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use splitos_core::config::GmArgs;
use splitos_core::node::HEARTBEAT;
use splitos_core::state::{Backend, StateKey, Store};
use splitos_rpc::{Handler, Load, Msg, Role, M2G_PICK_OWNER, P2G_PICK_HOME, X2G_HEARTBEAT, X2G_REGISTER};

use crate::clock::{Clock, Simulated};
use crate::Gm;

/// What a simulated run plays.
#[derive(Clone, Debug)]
pub struct Scale {
    pub components: usize,
    pub hosts: usize,
    pub seconds: u64,
    pub picks_per_s: u64,
    pub registrations_per_s: u64,
    pub fail: usize,
    /// Draws the components' phases and loads.
    pub seed: u64,
}

/// Time given to every component's beats after the last registered, before the window opens.
const WARMUP: Duration = Duration::from_secs(2);

/// The managers' state in memory, counting its writes.
#[derive(Default)]
struct Counted {
    records: Mutex<BTreeMap<String, Vec<u8>>>,
    writes: AtomicU64,
}

impl Backend for Counted {
    fn load(&self, table: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let prefix = format!("{table}/");
        Ok(self
            .records
            .lock()
            .unwrap()
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(k, v)| (k[prefix.len()..].to_string(), v.clone()))
            .collect())
    }

    fn put(&self, table: &str, key: &str, value: Option<&[u8]>) -> anyhow::Result<()> {
        self.writes.fetch_add(1, Relaxed);
        let key = format!("{table}/{key}");
        let mut records = self.records.lock().unwrap();
        match value {
            Some(v) => records.insert(key, v.to_vec()),
            None => records.remove(&key),
        };
        Ok(())
    }
}

/// A component both runs of the benchmark play (`bench-managers` over the wire, and here):
/// component `i` of `hosts` is on host `i % hosts`, each a loopback address of its own; the
/// first on a host is its pComponent, the second an sComponent on every tenth host, the rest
/// mComponents.
pub struct Played {
    pub role: Role,
    pub addr: String,
    pub load: Load,
}

/// The role of component `i` of `hosts`.
pub fn role(i: usize, hosts: usize) -> Role {
    match (i / hosts, i % hosts) {
        (0, _) => Role::Proc,
        (1, host) if host % 10 == 0 => Role::Storage,
        _ => Role::Mem,
    }
}

/// Component `i` of `hosts`, memory taken drawn from `rng`.
pub fn played(i: usize, hosts: usize, rng: &mut impl Rng) -> Played {
    let (host, k) = (i % hosts, i / hosts);
    let role = role(i, hosts);
    let capacity: u64 = if role == Role::Mem { 64 << 30 } else { 1 << 30 };
    let used = rng.random_range(0..capacity / 2);
    Played {
        role,
        addr: format!(
            "127.{}.{}.{}:{}",
            1 + host / 65536,
            (host / 256) % 256,
            host % 256,
            7000 + k
        ),
        load: Load {
            capacity,
            committed: used,
            used,
            ..Load::default()
        },
    }
}

/// The `fail` mComponents that fall silent halfway through the window, each on a host of its
/// own (the first hosts that have one).
pub fn failing(components: usize, hosts: usize, fail: usize) -> anyhow::Result<HashSet<usize>> {
    let mut chosen: Vec<usize> = Vec::new();
    for i in (0..components).filter(|&i| role(i, hosts) == Role::Mem) {
        if chosen.len() < fail && chosen.iter().all(|&j| j % hosts != i % hosts) {
            chosen.push(i);
        }
    }
    anyhow::ensure!(
        chosen.len() == fail,
        "--fail {fail}: only {} hosts have an mComponent",
        chosen.len()
    );
    Ok(chosen.into_iter().collect())
}

struct Comp {
    played: Played,
    id: u32,
    phase: Duration,
    /// The heartbeat period the managers told it last.
    period: Duration,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Register(usize),
    Beat(usize),
    Pick(u64),
}

/// A heartbeat period the managers told (0: none).
pub fn told(ms: u32) -> Option<Duration> {
    (ms != 0).then(|| Duration::from_millis(ms as u64))
}

/// Request times, in ns.
#[derive(Default)]
struct Times(Vec<u64>);

impl Times {
    fn summary(&mut self) -> serde_json::Value {
        self.0.sort_unstable();
        let v = &self.0;
        let us = |q: f64| match v.len() {
            0 => 0.0,
            n => v[((n - 1) as f64 * q).round() as usize] as f64 / 1000.0,
        };
        serde_json::json!({"n": v.len(), "p50_us": us(0.5), "p99_us": us(0.99), "p999_us": us(0.999), "max_us": us(1.0)})
    }
}

/// One run; its report has the shape of `bench-managers` over the wire (with `simulated`).
pub fn run(s: &Scale) -> anyhow::Result<serde_json::Value> {
    anyhow::ensure!(
        s.hosts >= 1 && s.components >= 2 * s.hosts,
        "--components must be at least twice --hosts (one pComponent and one mComponent a host)"
    );
    anyhow::ensure!(s.registrations_per_s > 0, "--registrations-per-s must be above 0");
    anyhow::ensure!(
        s.fail <= s.hosts,
        "--fail: at most one failing mComponent a host ({} hosts)",
        s.hosts
    );
    let wall = Instant::now();
    let clock = Arc::new(Simulated::new());
    let counted = Arc::new(Counted::default());
    let args = GmArgs::defaults();
    let t = args.process.transport.build(None).map_err(|e| anyhow::anyhow!(e))?;
    let store = Store::on(counted.clone(), StateKey::ephemeral()?);
    let gm = Gm::open(
        &args,
        "127.0.0.1:7100",
        &t,
        store,
        None,
        clock.clone() as Arc<dyn Clock>,
    )?;
    let mut rng = StdRng::seed_from_u64(s.seed);
    let mut comps: Vec<Comp> = (0..s.components)
        .map(|i| Comp {
            played: played(i, s.hosts, &mut rng),
            id: 0,
            phase: HEARTBEAT.mul_f64(rng.random::<f64>()),
            period: HEARTBEAT,
        })
        .collect();
    let failing = failing(s.components, s.hosts, s.fail)?;
    let register_every = Duration::from_secs(1).div_f64(s.registrations_per_s as f64);
    let open = register_every * s.components as u32 + WARMUP;
    let close = open + Duration::from_secs(s.seconds);
    let fail_at = open + (close - open) / 2;
    let mut events: BinaryHeap<Reverse<(Duration, Event)>> = (0..s.components)
        .map(|i| Reverse((register_every * i as u32, Event::Register(i))))
        .collect();
    let pick_every = Duration::from_secs(1).div_f64(s.picks_per_s.max(1) as f64);
    if s.picks_per_s > 0 {
        events.push(Reverse((open, Event::Pick(0))));
    }
    let (mut beats, mut register, mut homes, mut owners) =
        (Times::default(), Times::default(), Times::default(), Times::default());
    let mut busy = Duration::ZERO;
    let mut beats_in_window = 0u64;
    let mut writes_at_open = None;
    let mut errors: HashMap<String, u64> = HashMap::new();
    let mut last_answered: HashMap<u32, Duration> = HashMap::new();
    let mut named_lost: HashMap<u32, Duration> = HashMap::new();
    let mut wrongly_lost: HashSet<u32> = HashSet::new();
    let mut mems: Vec<u32> = Vec::new();
    while let Some(Reverse((at, event))) = events.pop() {
        if at >= close {
            break;
        }
        clock.advance(at.saturating_sub(clock.elapsed()));
        if at >= open && writes_at_open.is_none() {
            writes_at_open = Some(counted.writes.load(Relaxed));
        }
        let in_window = at >= open;
        let msg = match event {
            Event::Register(i) => Msg::X2G_REGISTER(X2G_REGISTER {
                role: comps[i].played.role,
                addr: comps[i].played.addr.clone(),
                shim_sock: None,
                nics: Vec::new(),
                load: comps[i].played.load.clone(),
                id: 0,
                metrics: None,
                standby: false,
                ebbs: Vec::new(),
                fenced_by: 0,
                start: 0,
            }),
            Event::Beat(i) => {
                if failing.contains(&i) && at >= fail_at {
                    continue;
                }
                Msg::X2G_HEARTBEAT(X2G_HEARTBEAT {
                    id: comps[i].id,
                    addr: comps[i].played.addr.clone(),
                    load: comps[i].played.load.clone(),
                    links: Vec::new(),
                    leaving: None,
                    ebbs: Vec::new(),
                    fenced_by: 0,
                })
            }
            Event::Pick(n) => {
                events.push(Reverse((at + pick_every, Event::Pick(n + 1))));
                let p = comps[(n as usize % s.hosts) % s.components].id;
                match n % 2 {
                    0 => Msg::P2G_PICK_HOME(P2G_PICK_HOME {
                        vnode: "default".into(),
                        pcomp: p,
                    }),
                    _ => Msg::M2G_PICK_OWNER(M2G_PICK_OWNER {
                        bytes: 1 << 30,
                        exclude: mems.iter().copied().take(1).collect(),
                        near: p,
                    }),
                }
            }
        };
        let t0 = Instant::now();
        let answer = gm.handle(msg);
        let took = t0.elapsed();
        if in_window {
            busy += took;
        }
        let ns = took.as_nanos() as u64;
        match (event, answer) {
            (Event::Register(i), Msg::G2X_REGISTERED(r)) => {
                comps[i].id = r.id;
                comps[i].period = told(r.beat_ms).unwrap_or(comps[i].period);
                if comps[i].played.role == Role::Mem {
                    mems.push(r.id);
                }
                register.0.push(ns);
                // Its first beat at its phase after registering.
                let next = at + comps[i].phase;
                events.push(Reverse((next, Event::Beat(i))));
            }
            (Event::Beat(i), Msg::G2X_BEAT(b)) => {
                comps[i].period = told(b.beat_ms).unwrap_or(comps[i].period);
                events.push(Reverse((at + comps[i].period, Event::Beat(i))));
                if in_window {
                    beats.0.push(ns);
                    beats_in_window += 1;
                }
                if failing.contains(&i) {
                    last_answered.insert(comps[i].id, at);
                }
                for lost in b.lost_mcomps.iter().copied().chain(b.lost.iter().map(|l| l.id)) {
                    let failed = failing.iter().any(|&f| comps[f].id == lost);
                    match failed {
                        true => _ = named_lost.entry(lost).or_insert(at),
                        false => _ = wrongly_lost.insert(lost),
                    }
                }
            }
            (Event::Pick(n), Msg::G2P_HOME(_) | Msg::G2M_OWNER(_)) if in_window => match n % 2 {
                0 => homes.0.push(ns),
                _ => owners.0.push(ns),
            },
            (event, Msg::ERR(e)) => {
                if let Event::Beat(i) = event {
                    events.push(Reverse((at + comps[i].period, Event::Beat(i))));
                }
                *errors.entry(format!("{:?}: {}", e.code, e.msg)).or_default() += 1
            }
            _ => {}
        }
    }
    let window_s = (close - open).as_secs_f64();
    let writes = counted.writes.load(Relaxed) - writes_at_open.unwrap_or(0);
    let mut delays: Vec<f64> = last_answered
        .iter()
        .filter_map(|(id, at)| Some(named_lost.get(id)?.saturating_sub(*at).as_secs_f64() * 1000.0))
        .collect();
    delays.sort_by(f64::total_cmp);
    let registered_s = (register_every * s.components as u32).as_secs_f64();
    let period = comps.iter().map(|c| c.period).max().unwrap_or(HEARTBEAT);
    Ok(serde_json::json!({
        "simulated": true,
        "seed": s.seed,
        "components": s.components,
        "hosts": s.hosts,
        "heartbeat_ms": period.as_millis() as u64,
        "seconds": s.seconds,
        "register": {
            "seconds": registered_s,
            "per_s": s.components as f64 / registered_s,
            "latency": register.summary(),
        },
        "gm": {
            "cpu_percent_of_one_core": busy.as_secs_f64() / window_s * 100.0,
            "state_writes_per_s": writes as f64 / window_s,
        },
        "beats": {
            "in_window": beats_in_window,
            "per_s": beats_in_window as f64 / window_s,
            "expected_per_s": s.components as f64 / period.as_secs_f64(),
            "latency": beats.summary(),
        },
        "picks": {
            "per_s": s.picks_per_s,
            "home": homes.summary(),
            "owner": owners.summary(),
        },
        "failover": {
            "failed": failing.len(),
            "named_lost": named_lost.len(),
            "delays_ms": delays,
        },
        "wrongly_lost": wrongly_lost.len(),
        "errors": errors,
        "wall_s": wall.elapsed().as_secs_f64(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The simulated run plays what it is asked: every component registers and heartbeats at
    /// its rate through the real managers, the failing mComponents are named lost after the
    /// silence limit (and no other component is), and the time the managers took is counted.
    #[test]
    fn a_simulated_run_registers_every_component_and_names_exactly_the_failed_ones_lost() {
        let _turn = crate::tests::TURNS.lock().unwrap_or_else(|e| e.into_inner());
        let r = run(&Scale {
            components: 300,
            hosts: 30,
            seconds: 12,
            picks_per_s: 20,
            registrations_per_s: 1000,
            fail: 2,
            seed: 7,
        })
        .unwrap();
        assert_eq!(r["register"]["latency"]["n"], 300, "{r}");
        let per_s = r["beats"]["per_s"].as_f64().unwrap();
        assert!((per_s - 1000.0).abs() < 20.0, "300 components every 300 ms: {per_s}/s");
        assert_eq!(r["failover"]["named_lost"], 2, "{r}");
        let reclaim = GmArgs::defaults().cluster.reclaim_dead_ms as f64;
        for d in r["failover"]["delays_ms"].as_array().unwrap() {
            let d = d.as_f64().unwrap();
            assert!(
                d > reclaim && d < reclaim + 1000.0,
                "named lost {d} ms after its last beat"
            );
        }
        assert_eq!(r["wrongly_lost"], 0, "{r}");
        assert!(r["picks"]["home"]["n"].as_u64().unwrap() > 100, "{r}");
        assert!(r["gm"]["cpu_percent_of_one_core"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["errors"].as_object().unwrap().is_empty(), "{r}");
    }
}
