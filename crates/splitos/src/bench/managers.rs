//! `splitos bench-managers`: the real global managers under the registrations, heartbeats and
//! placement questions of thousands of components, which this process plays over the wire
//! protocol (docs/benchmarks.md, "The managers at datacenter scale").
//!
//! Every simulated component registers, then heartbeats at a phase of its own, every period
//! the managers told it ([`HEARTBEAT`] until they do), as a component does; halfway through the measured window `--fail` mComponents fall
//! silent, and the time until the managers' heartbeat answers name them lost is their
//! failover delay. Placement questions (a new process's home, a vRegion's owner) are asked at
//! a steady rate meanwhile and timed. The managers' CPU time and memory are read from /proc,
//! their state writes from their own counter.
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::hist;
use rand::Rng;
use splitos_core::node::HEARTBEAT;
use splitos_gm::scale::{failing, played, told, Played};
use splitos_rpc::{Role, Rpc, TransportConfig, M2G_PICK_OWNER, P2G_PICK_HOME, X2G_HEARTBEAT, X2G_REGISTER};

/// What `splitos bench-managers` is asked to simulate.
#[derive(clap::Args, Debug, Clone)]
pub struct ManagersArgs {
    /// The global managers to load: their RPC address.
    #[arg(long, required_unless_present = "simulated")]
    pub gm: Option<String>,
    /// Their process id, whose CPU time and resident memory are read from /proc.
    #[arg(long, required_unless_present = "simulated")]
    pub gm_pid: Option<u32>,
    /// Run the managers in this process, in simulated time, with the components played
    /// beside them (no transport, no etcd: their state in memory, its writes counted): what
    /// the managers' own work costs, apart from what shares the cores with them. The
    /// managers' CPU is the time their requests took in the window.
    #[arg(long, conflicts_with_all = ["gm", "gm_pid", "connections"])]
    pub simulated: bool,
    /// Components simulated, spread evenly over --hosts: one pComponent per host, one
    /// sComponent on every tenth host, mComponents for the rest.
    #[arg(long, default_value_t = 10_000)]
    pub components: usize,
    /// Hosts the components are on (each a loopback address of its own, 127.H.H.H).
    #[arg(long, default_value_t = 1_000)]
    pub hosts: usize,
    /// Connections to the managers, shared by the components of a host (0: one per host).
    #[arg(long, default_value_t = 0)]
    pub connections: usize,
    /// Seconds measured, once every component registered and beat once.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Placement questions asked per second, a home for a new process (`P2G_PICK_HOME`) and an
    /// owner for a vRegion (`M2G_PICK_OWNER`) in turn.
    #[arg(long, default_value_t = 50)]
    pub picks_per_s: u64,
    /// Registrations a second, at most: components start over a while, as a datacenter's do,
    /// rather than all at once (each registration is a write to the managers' state).
    #[arg(long, default_value_t = 500)]
    pub registrations_per_s: u64,
    /// mComponents (each on a host of its own) that fall silent halfway through the window.
    #[arg(long, default_value_t = 4)]
    pub fail: usize,
}

/// Threads sending the components' heartbeats; each owns the connections of its hosts, and
/// waits for every answer before its next request (where each component has a heartbeat
/// thread of its own). More threads keep up with slower answers but take more of the cores
/// the managers run on; `sent_late` in the report counts heartbeats these sent late.
const SENDERS: usize = 64;
/// A heartbeat sent later than this after its time is counted: the simulation, not the
/// managers, fell behind.
const LATE: Duration = Duration::from_millis(100);
/// How long every component may take to register.
const REGISTERING: Duration = Duration::from_secs(300);
/// Time given to every component's beats after the last registered, before the window opens.
const WARMUP: Duration = Duration::from_secs(2);

fn summary(h: &Histogram<u64>) -> serde_json::Value {
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    serde_json::json!({
        "n": h.len(),
        "p50_us": us(0.5),
        "p99_us": us(0.99),
        "p999_us": us(0.999),
        "max_us": h.max() as f64 / 1000.0,
    })
}

/// CPU seconds (user and system) process `pid` used so far.
fn cpu_s(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| anyhow::anyhow!("cannot read the CPU time of process {pid}: {e}"))?;
    // The fields after the command name, which may hold spaces, closed by the last ')'.
    let rest = stat
        .rsplit_once(')')
        .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat unreadable"))?
        .1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    // SAFETY: sysconf takes no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ticks as f64 / hz)
}

/// A line `key: value` of /proc/`pid`/status, as a number.
fn status_field(pid: u32, key: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The managers' count of writes to their state, from their metrics.
fn state_writes(rpc: &Rpc, gm: &str) -> Option<f64> {
    let text = rpc.call(gm, splitos_rpc::C2X_METRICS).ok()?.text;
    // Its labels (the component's) are left out.
    text.lines()
        .filter(|l| {
            l.strip_prefix("splitos_gm_state_writes_total")
                .is_some_and(|r| r.starts_with([' ', '{']))
        })
        .find_map(|l| l.split_whitespace().last()?.parse().ok())
}

/// What every sender thread adds to.
#[derive(Default)]
struct Seen {
    beats: Mutex<Option<Histogram<u64>>>,
    register: Mutex<Option<Histogram<u64>>>,
    beats_in_window: AtomicU64,
    late: AtomicU64,
    /// The longest heartbeat period the managers told (ms).
    period_ms: AtomicU64,
    errors: Mutex<HashMap<String, u64>>,
    /// When a failed mComponent's last heartbeat was answered.
    last_answered: Mutex<HashMap<u32, Instant>>,
    /// When an answer first named a failed mComponent lost.
    named_lost: Mutex<HashMap<u32, Instant>>,
    /// Components named lost that never fell silent.
    wrongly_lost: Mutex<HashSet<u32>>,
}

impl Seen {
    fn error(&self, e: impl std::fmt::Display) {
        let e = e.to_string();
        // One entry per kind, not per component.
        let kind: String = e
            .split(|c: char| c.is_ascii_digit())
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join("N")
            .chars()
            .take(100)
            .collect();
        *self.errors.lock().unwrap().entry(kind).or_default() += 1;
    }

    fn merge(into: &Mutex<Option<Histogram<u64>>>, h: &Histogram<u64>) {
        let mut into = into.lock().unwrap();
        match into.as_mut() {
            Some(i) => i.add(h).expect("same bounds"),
            None => *into = Some(h.clone()),
        }
    }
}

struct Plan {
    args: ManagersArgs,
    /// The managers' address and process id.
    gm: String,
    gm_pid: u32,
    rpcs: Vec<Rpc>,
    ids: Vec<AtomicU32>,
    /// The components that fall silent halfway through the window.
    failing: HashSet<usize>,
    start: Instant,
    /// When the window opens, in ms after `start` (0 until every component registered).
    open_ms: AtomicU64,
}

impl Plan {
    /// The window, once every component registered.
    fn window(&self) -> Option<(Instant, Instant)> {
        let open = match self.open_ms.load(Ordering::Relaxed) {
            0 => return None,
            ms => self.start + Duration::from_millis(ms),
        };
        Some((open, open + Duration::from_secs(self.args.seconds)))
    }

    fn fail_at(&self) -> Option<Instant> {
        self.window().map(|(open, close)| open + (close - open) / 2)
    }
}

/// Sender `t` of `senders`: each of its components registers at its first turn (as a
/// component starts), then heartbeats at each, every period the managers told it last, until
/// the window closes.
fn sender(t: usize, senders: usize, plan: &Plan, seen: &Seen) {
    let a = &plan.args;
    let conns = plan.rpcs.len();
    let mine: Vec<usize> = (0..a.components)
        .filter(|i| (i % a.hosts) % conns % senders == t)
        .collect();
    let mut rng = rand::rng();
    let sims: Vec<Played> = mine.iter().map(|&i| played(i, a.hosts, &mut rng)).collect();
    let mut turns: BinaryHeap<Reverse<(Instant, usize)>> = (0..mine.len())
        .map(|k| Reverse((plan.start + HEARTBEAT.mul_f64(rng.random::<f64>()), k)))
        .collect();
    let mut period = vec![HEARTBEAT; mine.len()];
    let (mut beats, mut register) = (hist(), hist());
    // This sender's share of the registrations a second.
    let register_every = Duration::from_secs(1).mul_f64(senders as f64 / a.registrations_per_s.max(1) as f64);
    let mut next_registration = plan.start;
    // The ids of the failing components, known once all registered.
    let mut failing_ids: Option<HashMap<u32, usize>> = None;
    while let Some(Reverse((due, k))) = turns.pop() {
        let window = plan.window();
        if window.is_some_and(|(_, close)| due >= close) {
            break;
        }
        let now = Instant::now();
        if now < due {
            std::thread::sleep(due - now);
        } else if now - due > LATE {
            seen.late.fetch_add(1, Ordering::Relaxed);
        }
        let (i, s) = (mine[k], &sims[k]);
        let rpc = &plan.rpcs[i % a.hosts % conns];
        let id = plan.ids[i].load(Ordering::Relaxed);
        let t0 = Instant::now();
        if id == 0 {
            if t0 >= next_registration {
                next_registration = t0 + register_every;
                let reg = X2G_REGISTER {
                    role: s.role,
                    addr: s.addr.clone(),
                    shim_sock: None,
                    nics: Vec::new(),
                    load: s.load.clone(),
                    id: 0,
                    metrics: None,
                    standby: false,
                    ebbs: Vec::new(),
                    fenced_by: 0,
                    start: 0,
                };
                match rpc.call(&plan.gm, reg) {
                    Ok(r) => {
                        plan.ids[i].store(r.id, Ordering::Relaxed);
                        period[k] = told(r.beat_ms).unwrap_or(period[k]);
                        let _ = register.record(t0.elapsed().as_nanos() as u64);
                    }
                    Err(e) => seen.error(format_args!("register: {e}")),
                }
            }
            turns.push(Reverse((due + period[k], k)));
            continue;
        }
        let fail_at = plan.fail_at();
        if plan.failing.contains(&i) && fail_at.is_some_and(|f| due >= f) {
            // Silent from now on.
            continue;
        }
        let beat = X2G_HEARTBEAT {
            id,
            addr: s.addr.clone(),
            load: s.load.clone(),
            links: Vec::new(),
            leaving: None,
            ebbs: Vec::new(),
            fenced_by: 0,
        };
        let answer = rpc.call(&plan.gm, beat);
        let at = Instant::now();
        let answer = match answer {
            Ok(b) => b,
            Err(e) => {
                seen.error(format_args!("heartbeat: {e}"));
                turns.push(Reverse((due + period[k], k)));
                continue;
            }
        };
        period[k] = told(answer.beat_ms).unwrap_or(period[k]);
        seen.period_ms
            .fetch_max(period[k].as_millis() as u64, Ordering::Relaxed);
        turns.push(Reverse((due + period[k], k)));
        if window.is_some_and(|(open, _)| t0 >= open) {
            let _ = beats.record((at - t0).as_nanos() as u64);
            seen.beats_in_window.fetch_add(1, Ordering::Relaxed);
        }
        if plan.failing.contains(&i) {
            seen.last_answered.lock().unwrap().insert(id, at);
        }
        if failing_ids.is_none() && window.is_some() {
            failing_ids = Some(
                plan.failing
                    .iter()
                    .map(|&f| (plan.ids[f].load(Ordering::Relaxed), f))
                    .collect(),
            );
        }
        for lost in answer.lost_mcomps.iter().chain(answer.lost.iter().map(|l| &l.id)) {
            let failing = failing_ids.as_ref().is_some_and(|f| f.contains_key(lost));
            // A failing one named before it fell silent was lost wrongly too.
            match fail_at.filter(|f| failing && at > *f) {
                Some(_) => {
                    seen.named_lost.lock().unwrap().entry(*lost).or_insert(at);
                }
                None => {
                    seen.wrongly_lost.lock().unwrap().insert(*lost);
                }
            }
        }
    }
    Seen::merge(&seen.beats, &beats);
    Seen::merge(&seen.register, &register);
}

/// Asks placement questions at `--picks-per-s` through the window, in turn a home and an
/// owner, near a pComponent drawn at random.
fn picker(plan: &Plan, rpc: &Rpc, seen: &Seen) -> (Histogram<u64>, Histogram<u64>) {
    let a = &plan.args;
    let procs: Vec<u32> = (0..a.components.min(a.hosts))
        .map(|i| plan.ids[i].load(Ordering::Relaxed))
        .collect();
    let Some((open, close)) = plan.window() else {
        return (hist(), hist());
    };
    let (mut home, mut owner) = (hist(), hist());
    if a.picks_per_s == 0 || procs.is_empty() {
        return (home, owner);
    }
    let every = Duration::from_secs(1) / a.picks_per_s as u32;
    let mut rng = rand::rng();
    for n in 0u32.. {
        let due = open + every * n;
        if due >= close {
            break;
        }
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let near = procs[rng.random_range(0..procs.len())];
        let t0 = Instant::now();
        let (done, h) = if n % 2 == 0 {
            let r = rpc.call(
                &plan.gm,
                P2G_PICK_HOME {
                    vnode: "default".into(),
                    pcomp: near,
                },
            );
            (r.map(drop), &mut home)
        } else {
            let r = rpc.call(
                &plan.gm,
                M2G_PICK_OWNER {
                    bytes: 1 << 20,
                    exclude: Vec::new(),
                    near,
                },
            );
            (r.map(drop), &mut owner)
        };
        match done {
            Ok(()) => {
                let _ = h.record(t0.elapsed().as_nanos() as u64);
            }
            Err(e) => seen.error(format_args!("placement: {e}")),
        }
    }
    (home, owner)
}

/// Runs the simulation against the managers at `args.gm`, proving the admin's credentials in
/// `admin` (or, `--simulated`, the managers in this process in simulated time), and prints
/// what was measured as JSON.
pub fn managers(args: ManagersArgs, admin: &Path) -> anyhow::Result<()> {
    if args.simulated {
        let out = splitos_gm::scale::run(&splitos_gm::scale::Scale {
            components: args.components,
            hosts: args.hosts,
            seconds: args.seconds,
            picks_per_s: args.picks_per_s,
            registrations_per_s: args.registrations_per_s,
            fail: args.fail,
            seed: rand::rng().random(),
        })?;
        crate::outln!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let (Some(gm), Some(gm_pid)) = (args.gm.clone(), args.gm_pid) else {
        anyhow::bail!("--gm and --gm-pid name the managers to load (or --simulated runs them here)");
    };
    if args.components == 0 || args.hosts == 0 || args.hosts > args.components {
        anyhow::bail!("--hosts must be between 1 and --components ({})", args.components);
    }
    if args.hosts > 65536 * 254 {
        anyhow::bail!("--hosts: at most {} (each a loopback address of its own)", 65536 * 254);
    }
    let conns = match args.connections {
        0 => args.hosts,
        c => c.min(args.hosts),
    };
    cpu_s(gm_pid)?;
    let creds = splitos_core::node::credentials(admin, Role::Admin)?;
    // The components it plays are on other hosts: TCP, never this host's shared memory.
    let t = TransportConfig {
        kind: "tcp".into(),
        ..Default::default()
    };
    let rpcs = (0..conns)
        .map(|_| splitos_core::node::client_rpc(&t, creds.clone(), Duration::from_secs(5)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let control = splitos_core::node::client_rpc(&t, creds, Duration::from_secs(5))?;
    let failing = failing(args.components, args.hosts, args.fail)?;
    let plan = Plan {
        ids: (0..args.components).map(|_| AtomicU32::new(0)).collect(),
        args,
        gm,
        gm_pid,
        rpcs,
        failing,
        start: Instant::now(),
        open_ms: AtomicU64::new(0),
    };
    let seen = Seen::default();
    let senders = SENDERS.min(plan.rpcs.len());
    let cpu_before_registering = cpu_s(plan.gm_pid)?;
    let out = std::thread::scope(|s| -> anyhow::Result<serde_json::Value> {
        let workers: Vec<_> = (0..senders)
            .map(|t| {
                let (plan, seen) = (&plan, &seen);
                std::thread::Builder::new()
                    .name(format!("beat{t}"))
                    .stack_size(256 << 10)
                    .spawn_scoped(s, move || sender(t, senders, plan, seen))
                    .expect("spawn a sender")
            })
            .collect();
        // A registration refused is tried again at the component's next turn.
        while plan.ids.iter().any(|id| id.load(Ordering::Relaxed) == 0) {
            if plan.start.elapsed() > REGISTERING {
                // The senders go on until a window closes.
                plan.open_ms.store(1, Ordering::Relaxed);
                anyhow::bail!(
                    "not every component registered within {REGISTERING:?}: {:?}",
                    seen.errors.lock().unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let registered_s = plan.start.elapsed().as_secs_f64();
        let registering_cpu = cpu_s(plan.gm_pid)? - cpu_before_registering;
        plan.open_ms
            .store((plan.start.elapsed() + WARMUP).as_millis() as u64, Ordering::Relaxed);
        let (open, close) = plan.window().expect("just opened");
        std::thread::sleep(open.saturating_duration_since(Instant::now()));
        let (cpu0, own0, writes0, t0) = (
            cpu_s(plan.gm_pid)?,
            cpu_s(std::process::id())?,
            state_writes(&control, &plan.gm),
            Instant::now(),
        );
        let (home, owner) = picker(&plan, &control, &seen);
        std::thread::sleep(close.saturating_duration_since(Instant::now()));
        let (cpu1, own1, writes1) = (
            cpu_s(plan.gm_pid)?,
            cpu_s(std::process::id())?,
            state_writes(&control, &plan.gm),
        );
        // As long as it took: the last placement question may end after the window.
        let window_s = t0.elapsed().as_secs_f64();
        for w in workers {
            w.join().map_err(|_| anyhow::anyhow!("a sender panicked"))?;
        }
        let last = seen.last_answered.lock().unwrap().clone();
        let named = seen.named_lost.lock().unwrap().clone();
        let mut delays: Vec<f64> = last
            .iter()
            .filter_map(|(id, at)| Some(named.get(id)?.saturating_duration_since(*at).as_secs_f64() * 1000.0))
            .collect();
        delays.sort_by(f64::total_cmp);
        let beats = seen.beats.lock().unwrap().take().unwrap_or_else(hist);
        let register = seen.register.lock().unwrap().take().unwrap_or_else(hist);
        let a = &plan.args;
        Ok(serde_json::json!({
            "components": a.components,
            "hosts": a.hosts,
            "connections": plan.rpcs.len(),
            "heartbeat_ms": seen.period_ms.load(Ordering::Relaxed),
            "seconds": a.seconds,
            "register": {
                "seconds": registered_s,
                "per_s": a.components as f64 / registered_s,
                "gm_cpu_s": registering_cpu,
                "latency": summary(&register),
            },
            "gm": {
                "cpu_percent_of_one_core": (cpu1 - cpu0) / window_s * 100.0,
                "rss_mib": status_field(plan.gm_pid, "VmRSS").map(|kb| kb as f64 / 1024.0),
                "threads": status_field(plan.gm_pid, "Threads"),
                "state_writes_per_s": writes0.zip(writes1).map(|(w0, w1)| (w1 - w0) / window_s),
            },
            "simulation_cpu_percent_of_one_core": (own1 - own0) / window_s * 100.0,
            "beats": {
                "in_window": seen.beats_in_window.load(Ordering::Relaxed),
                "per_s": seen.beats_in_window.load(Ordering::Relaxed) as f64 / window_s,
                "expected_per_s": a.components as f64 * 1000.0 / seen.period_ms.load(Ordering::Relaxed).max(1) as f64,
                "sent_late": seen.late.load(Ordering::Relaxed),
                "latency": summary(&beats),
            },
            "picks": {
                "per_s": a.picks_per_s,
                "home": summary(&home),
                "owner": summary(&owner),
            },
            "failover": {
                "failed": a.fail,
                "named_lost": named.len(),
                "delays_ms": delays,
            },
            "wrongly_lost": seen.wrongly_lost.lock().unwrap().len(),
            "errors": seen.errors.lock().unwrap().clone(),
        }))
    })?;
    crate::outln!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
