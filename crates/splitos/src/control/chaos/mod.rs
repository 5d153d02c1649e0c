//! `splitos chaos`: random faults against a running cluster, with a checker (docs/reliability.md).
//!
//! A cluster of its own is started from the configuration; programs run on it again and again
//! while faults drawn from the seed hit its components one at a time, each healed and the
//! cluster settled before the next, so that no more is down at once than the configuration
//! tolerates. Every run's output is compared with a native run of the same command: a run
//! either prints what it prints natively, or fails with an error that a fault beyond the
//! configuration's tolerance explains. Afterwards the cluster must settle (every component
//! alive, every vRegion with its copies) and hold nothing of a program that ended.
mod defaults;
mod disks;
mod etcd;
mod fds;
mod hosts;
mod inject;
mod net;
mod report;
mod schedule;

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::config::{ClusterConfig, Loopback};
use defaults::{DEFAULT_CONFIG, DEFAULT_WORKLOADS};
use inject::inject;
use report::{print_report, replay, report};
use schedule::{Fault, Kind, Targets};

#[derive(clap::Args, Debug)]
pub struct ChaosArgs {
    /// The seed the faults are drawn from (default: one from the clock, printed): the same
    /// seed and configuration give the same faults, in the same order, on the same components.
    #[arg(long)]
    pub seed: Option<u64>,
    /// For how long faults are drawn, in minutes of quiet gaps and holds (fractions allowed);
    /// waiting for the cluster to settle after each fault comes on top.
    #[arg(long, default_value_t = 5.0)]
    pub minutes: f64,
    /// The cluster's configuration file (default: one global manager, one pComponent with a
    /// 16 MiB ExCache and four mComponents with replicas, vRegions of 4 MiB).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A workload: a shell command (`sh -c CMD`) run again and again on the cluster, its
    /// output and exit status compared with a native run of it. Repeatable; adds to the
    /// default workloads (CPython's heap, a pipeline of C programs, threads, a file, memcached,
    /// and with nComponents an HTTP fetch through them).
    #[arg(long = "workload", value_name = "CMD")]
    pub workloads: Vec<String>,
    /// Run only the --workload commands, not the default ones.
    #[arg(long)]
    pub only_workloads: bool,
    /// Leave out a default workload, by name: cpython-heap, c-pipeline, cpython-threads,
    /// files, memcached, and network (with nComponents). Repeatable.
    #[arg(long, value_name = "NAME")]
    pub without: Vec<String>,
    /// Draw only these kinds of fault (comma-separated, e.g. `kill-mem,stop-storage`); by
    /// default every kind the configuration has: kill-mem, stop-mem, pause-mem, drain-mem,
    /// detach-mem, kill-gm, stop-gm, swap-placement, stop-proc, kill-proc, resize-excache, swap-policy,
    /// stop-storage, kill-storage, slow-mem, full-disk, stop-net, kill-net, and with three
    /// members or more of the managers' etcd on this host's loopback stop-etcd, kill-etcd,
    /// with components in network namespaces cut-host, and with two such hosts or more
    /// split-hosts (docs/reliability.md says what each does).
    #[arg(long, value_delimiter = ',', value_name = "KIND")]
    pub faults: Vec<Kind>,
    /// Programs running at once.
    #[arg(long, default_value_t = 2)]
    pub parallel: usize,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Print the schedule the seed draws for the configuration, and run nothing.
    #[arg(long)]
    pub schedule_only: bool,
}

/// How long the cluster may take to settle after a fault, or after the last one.
const SETTLE: Duration = Duration::from_secs(60);

/// Set by SIGINT or SIGTERM: the runs and the faults stop, the cluster is stopped, and the
/// command exits 130.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// A workload, and what it printed natively (where it exited 0: one that fails natively is
/// refused).
struct Workload {
    name: String,
    cmd: String,
    stdout: Vec<u8>,
    native_s: f64,
}

#[derive(Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "kebab-case")]
enum Outcome {
    AsNative,
    /// Exited as natively but printed something else.
    Wrong,
    /// Exited otherwise than natively (the end of its stderr in the record's detail).
    Error,
    /// Still running past the bound; killed.
    Hang,
}

#[derive(Serialize, Clone, Debug)]
struct RunRecord {
    workload: String,
    start_ms: u64,
    end_ms: u64,
    outcome: Outcome,
    #[serde(skip_serializing_if = "String::is_empty")]
    detail: String,
    /// The last line of its stderr: the error that says why it failed, if it did.
    #[serde(skip_serializing_if = "String::is_empty")]
    error: String,
    /// The injected fault that explains a failure, if one does.
    #[serde(skip_serializing_if = "Option::is_none")]
    explained_by: Option<String>,
}

#[derive(Serialize, Clone, Debug)]
struct Injected {
    #[serde(flatten)]
    fault: Fault,
    start_ms: u64,
    end_ms: u64,
    /// What the cluster showed of it (a component held lost, copies rebuilt, ...).
    seen: String,
}

/// The cluster under test, in a directory of its own; stopped when dropped, whatever happened.
struct Rig {
    exe: PathBuf,
    /// The managers `cluster up` started, named to every run so that none can fall back to
    /// an embedded cluster of its own while this one is down.
    gm: Option<String>,
    /// Unmounted once the cluster is down, before the directory they are in goes.
    disks: disks::Disks,
    /// The managers' etcd members faults may hit (none unless three or more on loopback).
    etcd: etcd::Members,
    _tmp: tempfile::TempDir,
    state: PathBuf,
    data: PathBuf,
    t0: Instant,
    up: bool,
}

impl Rig {
    fn splitos(&self) -> Command {
        let mut c = Command::new(&self.exe);
        c.env("SPLITOS_STATE_DIR", &self.state)
            .env("SPLITOS_DATA_DIR", &self.data);
        for v in ["SPLITOS_GM", "SPLITOS_PCOMPONENT", "SPLITOS_CREDENTIALS"] {
            c.env_remove(v);
        }
        c
    }

    fn ms(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    fn cluster(&self, args: &[&str]) -> anyhow::Result<String> {
        self.cli("cluster", args)
    }

    /// `splitos SUB ARGS...` on this cluster: what it printed, or its error.
    fn cli(&self, sub: &str, args: &[&str]) -> anyhow::Result<String> {
        let out = self.splitos().arg(sub).args(args).stdin(Stdio::null()).output()?;
        if !out.status.success() {
            anyhow::bail!(
                "`splitos {sub} {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn status(&self) -> Option<Value> {
        serde_json::from_str(&self.cluster(&["status", "--json"]).ok()?).ok()
    }

    /// The live process of component `name`, by its configuration file in the state directory.
    fn pid_of(&self, name: &str) -> Option<u32> {
        if name.starts_with("etcd") {
            return self.etcd.pid_of(name);
        }
        super::procs::running(&self.state)
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, p)| p)
    }

    /// The components `cluster up` started in network namespace `ns`, by name.
    fn in_netns(&self, ns: &str) -> Vec<String> {
        std::fs::read_dir(&self.state)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.strip_suffix(".netns")?.to_string();
                (std::fs::read_to_string(e.path()).ok()?.trim() == ns).then_some(name)
            })
            .collect()
    }

    /// Whether the managers hold the component at `addr` lost, as they alone say: quick
    /// where `cluster status` asks every component for its statistics, and so waits for a
    /// stopped one.
    fn lost(&self, addr: &str) -> bool {
        let Some(gm) = &self.gm else { return false };
        super::cluster::gm_status(gm).is_ok_and(|s| s.components.iter().any(|c| c.addr == addr && c.lost))
    }

    /// The id the cluster knows component `name` by, which the API's changes name.
    fn id_of(&self, name: &str) -> anyhow::Result<String> {
        let addr = self.addr_of(name).unwrap_or_default();
        let s = self
            .status()
            .ok_or_else(|| anyhow::anyhow!("no status of the cluster"))?;
        s["components"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["addr"] == addr.as_str() && c["alive"] == true))
            .map(|c| c["id"].to_string())
            .ok_or_else(|| anyhow::anyhow!("{name} is not alive at {addr}"))
    }

    fn addr_of(&self, name: &str) -> Option<String> {
        std::fs::read_to_string(self.state.join(format!("{name}.ready")))
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// Waits up to `limit` for `ok` of the cluster's status; whether it came.
    fn until(&self, limit: Duration, mut ok: impl FnMut(&Value) -> bool) -> bool {
        let t = Instant::now();
        while t.elapsed() < limit && !interrupted() {
            if self.status().is_some_and(|s| ok(&s)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if self.up {
            if let Err(e) = self.cluster(&["down", "--force"]) {
                crate::errln!("splitos chaos: {e}");
            }
        }
    }
}

fn components<'a>(s: &'a Value, role: &str) -> Vec<&'a Value> {
    s["components"]
        .as_array()
        .map(|a| a.iter().filter(|c| c["role"] == role).collect())
        .unwrap_or_default()
}

fn alive(s: &Value, role: &str) -> usize {
    components(s, role).iter().filter(|c| c["alive"] == true).count()
}

/// vRegions short of a copy, over every live mComponent.
fn short_vregions(s: &Value) -> u64 {
    components(s, "mcomponent")
        .iter()
        .filter(|c| c["alive"] == true)
        .map(|c| c["stats"]["rebuild"]["short_vregions"].as_u64().unwrap_or(0))
        .sum()
}

/// The cluster as configured, every live vRegion with its copies.
fn settled(s: &Value, t: &Targets) -> bool {
    alive(s, "mcomponent") == t.mems
        && alive(s, "pcomponent") == t.procs
        && alive(s, "scomponent") == t.storages
        && alive(s, "ncomponent") == t.nets
        && short_vregions(s) == 0
}

/// What the live components still hold of programs: empty once every program has ended.
fn held(s: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for c in components(s, "pcomponent").into_iter().filter(|c| c["alive"] == true) {
        let n = c["stats"]["processes"].as_array().map_or(0, Vec::len);
        if n > 0 {
            out.push(format!("pComponent {} still has {n} process(es)", c["addr"]));
        }
    }
    for c in components(s, "ncomponent").into_iter().filter(|c| c["alive"] == true) {
        let n = c["stats"]["open_sockets"].as_u64().unwrap_or(0);
        if n > 0 {
            out.push(format!("nComponent {} still has {n} socket(s) open", c["addr"]));
        }
    }
    for c in components(s, "mcomponent").into_iter().filter(|c| c["alive"] == true) {
        let st = &c["stats"];
        // By pid, to be looked up in the components' logs.
        let pids = |what: &str| -> Vec<String> {
            st[what]
                .as_array()
                .map(|ps| ps.iter().map(|p| p["pid"].to_string()).collect())
                .unwrap_or_default()
        };
        let (homes, owned) = (pids("home_processes"), pids("owned_processes"));
        let taken = st["taken"].as_u64().unwrap_or(0);
        if !homes.is_empty() || !owned.is_empty() || taken > 0 {
            out.push(format!(
                "mComponent {} still holds {taken} bytes, the homes of [{}] and pages of [{}]",
                c["addr"],
                homes.join(", "),
                owned.join(", ")
            ));
        }
    }
    out
}

pub fn chaos(args: ChaosArgs) -> anyhow::Result<i32> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    if !(args.minutes > 0.0 && args.minutes.is_finite()) {
        anyhow::bail!("--minutes must be a positive number, not {}", args.minutes);
    }
    if args.parallel == 0 {
        anyhow::bail!("--parallel must be at least 1");
    }
    // Before any thread: an interrupted run stops its cluster instead of leaving it running.
    let stop_signals = splitos_core::node::block_stop_signals();
    let tmp = tempfile::Builder::new().prefix("splitos-chaos-").tempdir()?;
    let config = match &args.config {
        Some(p) => p.clone(),
        None => {
            let p = tmp.path().join("cluster.toml");
            std::fs::write(&p, DEFAULT_CONFIG)?;
            p
        }
    };
    let cfg = ClusterConfig::load(&config).map_err(|e| anyhow::anyhow!(e))?;
    // Members this run cannot see or read are no target: a run that asks for no etcd fault
    // goes on without them.
    let asks_etcd = args.faults.iter().any(|k| k.target_kind() == "etcd");
    let etcd = match etcd::Members::find(&cfg.cluster.etcd) {
        Ok(m) => m,
        Err(e) if asks_etcd => return Err(e),
        Err(e) => {
            crate::errln!("splitos chaos: no etcd faults: {e:#}");
            etcd::Members::default()
        }
    };
    // Every namespace a component is started in, in the configuration's order: a host each.
    let mut hosts: Vec<String> = Vec::new();
    let spaces = cfg.managers().into_iter().map(|m| m.netns);
    let spaces = spaces
        .chain(cfg.pcomponent.iter().map(|c| c.netns.clone()))
        .chain(cfg.mcomponent.iter().map(|c| c.netns.clone()))
        .chain(cfg.scomponent.iter().map(|c| c.netns.clone()));
    for ns in spaces.flatten() {
        if !hosts.contains(&ns) {
            hosts.push(ns);
        }
    }
    let targets = Targets {
        mems: cfg.mcomponent.len(),
        procs: cfg.pcomponent.len(),
        storages: cfg.scomponent.len(),
        nets: cfg.ncomponent.len(),
        etcds: etcd.len(),
        hosts,
        excaches: cfg.pcomponent.iter().map(|p| p.excache.0).collect(),
        api: cfg.cluster.api != "off",
        managers: cfg.managers().len(),
        // A copy survives the loss, and another mComponent can take the rebuilt one.
        mem_loss_tolerated: cfg.replication().members() > 1 && cfg.mcomponent.len() > cfg.replication().members(),
        silence_ms: cfg.cluster.reclaim_dead_ms,
        disks: disks::Disks::plan(&cfg),
        only: args.faults.clone(),
    };
    if cfg.ncomponent.iter().any(|n| n.netns.is_some()) {
        anyhow::bail!(
            "splitos chaos's network workload fetches from a server on this host's loopback: an [[ncomponent]] in a network namespace cannot reach it"
        );
    }
    // The network workload's server is on the host's loopback.
    if cfg.ncomponent.iter().any(|n| n.loopback != Loopback::Host) {
        anyhow::bail!("splitos chaos's network workload fetches from a server on the host's loopback: give every [[ncomponent]] loopback = \"host\"");
    }
    let schedule = schedule::draw(seed, (args.minutes * 60_000.0) as u64, &targets);
    if schedule.is_empty() {
        anyhow::bail!("no fault of the kinds --faults names fits this cluster (an mComponent to kill needs replicas, a drain two mComponents, a storage fault an sComponent, a full disk root and an sComponent given no directory, an etcd fault three members or more of the managers' etcd on this host's loopback, a partition components in network namespaces, a change the REST API)");
    }
    if let Some(w) = args
        .without
        .iter()
        .find(|w| *w != net::NAME && !DEFAULT_WORKLOADS.iter().any(|(n, _)| n == w))
    {
        anyhow::bail!(
            "--without {w}: no such default workload (they are {}, and {} with nComponents)",
            DEFAULT_WORKLOADS.map(|(n, _)| n).join(", "),
            net::NAME
        );
    }
    if args.schedule_only {
        crate::outln!("{}", serde_json::to_string_pretty(&schedule)?);
        return Ok(0);
    }
    let mut workloads = Vec::new();
    let defaults = DEFAULT_WORKLOADS
        .iter()
        .filter(|(n, _)| !args.only_workloads && !args.without.iter().any(|w| w == n));
    let named = args
        .workloads
        .iter()
        .enumerate()
        .map(|(i, c)| (format!("workload-{}", i + 1), c.clone()));
    let exe = std::env::current_exe()?.to_string_lossy().replace('\'', "'\\''");
    let mut defaults: Vec<(String, String)> = defaults
        .map(|(n, c)| (n.to_string(), c.replace("{splitos}", &format!("'{exe}'"))))
        .collect();
    if targets.nets > 0 && !args.only_workloads && !args.without.iter().any(|w| w == net::NAME) {
        defaults.push((net::NAME.to_string(), net::workload(net::serve()?)));
    }
    for (name, cmd) in defaults.into_iter().chain(named) {
        let t = Instant::now();
        let out = Command::new("sh").args(["-c", &cmd]).stdin(Stdio::null()).output()?;
        if !out.status.success() {
            anyhow::bail!(
                "workload {name} fails natively ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        workloads.push(Workload {
            name,
            cmd,
            stdout: out.stdout,
            native_s: t.elapsed().as_secs_f64(),
        });
    }
    if workloads.is_empty() {
        anyhow::bail!("no workload: --only-workloads needs a --workload");
    }
    // This process's own calls to the managers (`Rig::lost`) go to the rig's cluster, with
    // its admin's credentials and transport; set before any thread that reads the
    // environment starts (the network workload's server reads none).
    std::env::set_var("SPLITOS_STATE_DIR", tmp.path().join("state"));
    // Disks are made only for a schedule that fills one: the others run as configured.
    let fills = schedule.iter().any(|f| f.kind == Kind::FullDisk);
    let planned = if fills { &targets.disks[..] } else { &[] };
    let (disks, config) = disks::Disks::make(&config, planned, tmp.path())?;
    let mut rig = Rig {
        exe: std::env::current_exe()?,
        gm: None,
        disks,
        etcd,
        state: tmp.path().join("state"),
        data: tmp.path().join("data"),
        _tmp: tmp,
        t0: Instant::now(),
        up: false,
    };
    crate::outln!(
        "splitos chaos: seed {seed}, {} fault(s) over {} minute(s), {} workload(s), {} at once",
        schedule.len(),
        args.minutes,
        workloads.len(),
        args.parallel
    );
    // The main thread stops what runs and the cluster (dropping the rig), then exits.
    stop_signals.on_stop(|| {
        INTERRUPTED.store(true, Ordering::Relaxed);
        loop {
            std::thread::park();
        }
    });
    rig.up = true;
    rig.cluster(&["up", "--config", &config.to_string_lossy()])?;
    let state: super::cluster::ClusterState =
        serde_json::from_str(&std::fs::read_to_string(rig.state.join("cluster.json"))?)?;
    rig.gm = Some(state.gm);
    let rig = Arc::new(rig);
    let workloads = Arc::new(workloads);
    let runs = Arc::new(Mutex::new(Vec::<RunRecord>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicUsize::new(0));
    let runners: Vec<_> = (0..args.parallel)
        .map(|_| {
            let (rig, workloads, runs, stop, next) =
                (rig.clone(), workloads.clone(), runs.clone(), stop.clone(), next.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) && !interrupted() {
                    let w = &workloads[next.fetch_add(1, Ordering::Relaxed) % workloads.len()];
                    let r = run_once(&rig, w);
                    // A cluster that refuses programs (its manager down) would be asked
                    // hundreds of times a second.
                    if r.outcome != Outcome::AsNative {
                        std::thread::sleep(Duration::from_millis(500));
                    }
                    runs.lock().unwrap().push(r);
                }
            })
        })
        .collect();
    let mut injected = Vec::new();
    for f in &schedule {
        let gap = Instant::now();
        while gap.elapsed() < Duration::from_millis(f.gap_ms) && !interrupted() {
            std::thread::sleep(Duration::from_millis(50));
        }
        if interrupted() {
            break;
        }
        let start_ms = rig.ms();
        let seen = inject(&rig, f, &targets).unwrap_or_else(|e| format!("could not inject: {e}"));
        injected.push(Injected {
            fault: f.clone(),
            start_ms,
            end_ms: rig.ms(),
            seen,
        });
    }
    stop.store(true, Ordering::Relaxed);
    for r in runners {
        let _ = r.join();
    }
    if interrupted() {
        drop(rig);
        crate::errln!("splitos chaos: interrupted; its programs and cluster are stopped (seed {seed})");
        return Ok(130);
    }
    let mut leaks = Vec::new();
    if !rig.until(SETTLE, |s| settled(s, &targets)) {
        leaks.push(match rig.status() {
            Some(s) => format!(
                "the cluster did not settle within {} s: {} of {} mComponents and {} of {} pComponents alive, {} vRegion(s) short of a copy",
                SETTLE.as_secs(),
                alive(&s, "mcomponent"),
                targets.mems,
                alive(&s, "pcomponent"),
                targets.procs,
                short_vregions(&s)
            ),
            None => format!("the cluster did not answer `cluster status` within {} s", SETTLE.as_secs()),
        });
    }
    // What ended programs held is released in the background: give it the time a lost
    // component's reclaim takes.
    let limit = Duration::from_millis(targets.silence_ms * 2 + 10_000);
    let leftovers = |s: &Value| {
        let shim_socks = components(s, "pcomponent")
            .iter()
            .filter_map(|c| c["shim_sock"].as_str().map(String::from))
            .collect();
        let mut l = held(s);
        l.extend(fds::leaked(&rig.state, &shim_socks));
        l
    };
    if !rig.until(limit, |s| leftovers(s).is_empty()) {
        leaks.extend(rig.status().map(|s| leftovers(&s)).unwrap_or_default());
    }
    let runs = runs.lock().unwrap().clone();
    let report = report(seed, args.minutes, &workloads, injected, runs, leaks, &targets);
    print_report(&report);
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)?;
    }
    if !report.passed {
        match keep_logs(&rig.state, seed) {
            Ok(dir) => crate::errln!("splitos chaos: the components' logs are kept in {}", dir.display()),
            Err(e) => crate::errln!("splitos chaos: cannot keep the components' logs: {e}"),
        }
        crate::errln!(
            "splitos chaos: FAILED with seed {seed}; the same faults again: {}",
            replay(seed)
        );
    }
    Ok(if report.passed { 0 } else { 1 })
}

/// Copies the components' logs of a failed run out of its state directory, which goes with
/// the cluster: what each component said around a fault is what explains a failure.
fn keep_logs(state: &std::path::Path, seed: u64) -> anyhow::Result<PathBuf> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("splitos-chaos-logs-{seed}-"))
        .tempdir()?
        .keep();
    for e in std::fs::read_dir(state)?.flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            std::fs::copy(e.path(), dir.join(e.file_name()))?;
        }
    }
    Ok(dir)
}

/// Runs workload `w` once on the cluster, bounded.
fn run_once(rig: &Rig, w: &Workload) -> RunRecord {
    let start_ms = rig.ms();
    let bound = Duration::from_secs_f64(120.0 + 30.0 * w.native_s);
    let mut cmd = rig.splitos();
    if let Some(gm) = &rig.gm {
        cmd.env("SPLITOS_GM", gm);
    }
    cmd.args(["run", "--quiet", "--", "sh", "-c", &w.cmd])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let record = |outcome, detail: String| RunRecord {
        workload: w.name.clone(),
        start_ms,
        end_ms: rig.ms(),
        outcome,
        detail,
        error: String::new(),
        explained_by: None,
    };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return record(Outcome::Error, format!("cannot start splitos run: {e}")),
    };
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let t = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if t.elapsed() < bound && !interrupted() => std::thread::sleep(Duration::from_millis(20)),
            _ => break None,
        }
    };
    let Some(status) = status else {
        kill_group(&mut child);
        return record(
            Outcome::Hang,
            format!("still running after {} s; killed", bound.as_secs()),
        );
    };
    // A child of `run` that outlived it would hold the pipes open. (What splitos holds of a
    // program that ended, forks included, is checked at the components afterwards.)
    kill_group(&mut child);
    let (out, err) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    let stderr = String::from_utf8_lossy(&err);
    let tail: String = stderr
        .trim()
        .chars()
        .rev()
        .take(400)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    let tail = tail.replace('\n', " / ");
    if !status.success() {
        let error = stderr.trim().lines().last().unwrap_or("").to_string();
        RunRecord {
            error,
            ..record(Outcome::Error, format!("{status}: {tail}"))
        }
    } else if out == w.stdout {
        record(Outcome::AsNative, String::new())
    } else {
        let got = format!(
            "{status}; stdout {} bytes (natively {}); stderr: {tail}",
            out.len(),
            w.stdout.len()
        );
        record(Outcome::Wrong, got)
    }
}

fn drain<R: Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut buf);
        }
        buf
    })
}

fn kill_group(child: &mut Child) {
    // SAFETY: kill takes plain integers; the group is the run's own (process_group(0)).
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait();
}
