//! The process monitor (pComponent). It runs the processes placed on it: each program's shim
//! connects over a Unix socket and hands over its heap region (a userfaultfd and a memfd).
//! The pComponent owns the ExCache shared by all its processes, serves every miss from the
//! vRegion owner, writes back dirty victims, and forwards the processes' virtual-memory calls
//! to their home mComponents. It also mounts each vNode's file system ([`vfs`]).
mod excache;
mod fault;
mod shim;
mod uffd;
mod vfs;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use hdrhistogram::Histogram;
use splitos_rpc::{serve, ComponentRef, ErrCode, Handler, Load, Msg, Role, RpcError, ServerConfig, Who};

pub use excache::{policy_by_name, EvictionPolicy, ExCache, POLICIES};
pub use vfs::{mounts_under, unmount};

use crate::node::{self, Node};

#[derive(Clone, Debug)]
pub struct PcompConfig {
    pub excache_bytes: u64,
    pub ways: usize,
    pub policy: String,
    pub piggyback: bool,
    pub fault_workers: usize,
}

/// Counters of one `splitos run` (all processes it started) or of the whole pComponent.
pub struct RunStats {
    misses: AtomicU64,
    evictions: AtomicU64,
    flushes: AtomicU64,
    piggybacked: AtomicU64,
    plocal_fills: AtomicU64,
    bytes_fetched: AtomicU64,
    bytes_flushed: AtomicU64,
    wp_faults: AtomicU64,
    processes: AtomicU64,
    miss_ns: Mutex<Histogram<u64>>,
    /// Where a miss spends its time inside the pComponent: choosing and dropping a victim,
    /// the network round trip(s), and installing the line into the program.
    evict_ns: Mutex<Histogram<u64>>,
    rpc_ns: Mutex<Histogram<u64>>,
    install_ns: Mutex<Histogram<u64>>,
    errors: Mutex<Vec<String>>,
}

fn histogram() -> Mutex<Histogram<u64>> {
    Mutex::new(Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds"))
}

impl Default for RunStats {
    fn default() -> Self {
        RunStats {
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            piggybacked: AtomicU64::new(0),
            plocal_fills: AtomicU64::new(0),
            bytes_fetched: AtomicU64::new(0),
            bytes_flushed: AtomicU64::new(0),
            wp_faults: AtomicU64::new(0),
            processes: AtomicU64::new(0),
            miss_ns: histogram(),
            evict_ns: histogram(),
            rpc_ns: histogram(),
            install_ns: histogram(),
            errors: Mutex::new(Vec::new()),
        }
    }
}

impl RunStats {
    fn json(&self) -> serde_json::Value {
        let h = self.miss_ns.lock().unwrap();
        let p50 = |m: &Mutex<Histogram<u64>>| m.lock().unwrap().value_at_quantile(0.5);
        serde_json::json!({
            "misses": self.misses.load(Relaxed),
            "evictions": self.evictions.load(Relaxed),
            "flushes": self.flushes.load(Relaxed),
            "piggybacked": self.piggybacked.load(Relaxed),
            "plocal_fills": self.plocal_fills.load(Relaxed),
            "bytes_fetched": self.bytes_fetched.load(Relaxed),
            "bytes_flushed": self.bytes_flushed.load(Relaxed),
            "wp_faults": self.wp_faults.load(Relaxed),
            "processes": self.processes.load(Relaxed),
            "miss_ns_p50": h.value_at_quantile(0.5),
            "miss_ns_p99": h.value_at_quantile(0.99),
            "miss_ns_mean": h.mean() as u64,
            "miss_breakdown_ns_p50": {"evict": p50(&self.evict_ns), "rpc": p50(&self.rpc_ns), "install": p50(&self.install_ns)},
            "errors": *self.errors.lock().unwrap(),
        })
    }
}

/// A process running on this pComponent.
pub struct Proc {
    pub pid: u64,
    pub who: Who,
    pub os_pid: i32,
    pub base: u64,
    pub uffd: OwnedFd,
    pub memfd: OwnedFd,
    pub home: ComponentRef,
    vregions: Mutex<HashMap<u64, ComponentRef>>,
    run: Arc<RunStats>,
    alive: AtomicBool,
    stop: OwnedFd,
    /// Lines this process faulted in by a read, and how many of those it then wrote: when most
    /// reads are followed by a write (reference counts, hash-table updates), read misses are
    /// installed writable and dirty, saving the write-protect fault each would take.
    read_fills: AtomicU64,
    written_after_read: AtomicU64,
}

impl Proc {
    fn predicts_write(&self) -> bool {
        let reads = self.read_fills.load(Relaxed);
        reads >= 64 && self.written_after_read.load(Relaxed) * 2 > reads
    }
}

/// Everything the miss path changes, under one lock.
struct Inner {
    cache: ExCache,
    /// Victims whose write-back is on the wire: a miss on one waits for its acknowledgement.
    inflight: HashSet<(u64, u64)>,
    /// Pages that exist on an mComponent; a miss on any other page is a p-local line.
    materialized: HashMap<u64, BTreeSet<u64>>,
    procs: HashMap<u64, Arc<Proc>>,
}

/// A forked child between its parent's FORK_PREPARE and its own hello.
struct PendingChild {
    who: Who,
    home: ComponentRef,
    run: Arc<RunStats>,
    vmas: Vec<splitos_rpc::VmaInfo>,
    owners: Vec<splitos_rpc::VregionOwner>,
    materialized: BTreeSet<u64>,
}

pub struct Pcomp {
    node: Arc<Node>,
    cfg: PcompConfig,
    mounts: vfs::Mounts,
    vregion_size: AtomicU64,
    inner: Mutex<Inner>,
    cv: Condvar,
    pending: Mutex<HashMap<u64, PendingChild>>,
    next_pid: AtomicU64,
    runs: Mutex<HashMap<u64, Arc<RunStats>>>,
    total: Arc<RunStats>,
    /// How long a fault worker polls for the next fault before sleeping (the transport's
    /// `SPLITOS_NET_SPIN_US` budget).
    fault_spin: std::time::Duration,
    started: Instant,
}

fn errno_of(e: &RpcError) -> i64 {
    match e.code() {
        ErrCode::NoMemory => libc::ENOMEM as i64,
        ErrCode::Invalid => libc::EINVAL as i64,
        ErrCode::Denied => libc::EACCES as i64,
        ErrCode::NotFound => libc::EINVAL as i64,
        ErrCode::Unreachable | ErrCode::Internal => libc::ENOMEM as i64,
        ErrCode::Errno(n) => n as i64,
    }
}

impl Pcomp {
    fn vrs(&self) -> u64 {
        self.vregion_size.load(Relaxed)
    }

    fn run_stats(&self, run_id: u64) -> Arc<RunStats> {
        self.runs.lock().unwrap().entry(run_id).or_default().clone()
    }

    /// Applies a counter update to the process's run and to the pComponent total.
    fn bump(&self, p: &Proc, f: impl Fn(&RunStats)) {
        f(&p.run);
        f(&self.total);
    }

    fn load(&self) -> Load {
        let procs: Vec<i32> = self.inner.lock().unwrap().procs.values().map(|p| p.os_pid).collect();
        let threads = procs.iter().map(|pid| thread_count(*pid)).sum();
        Load { threads, processes: procs.len() as u32, capacity: self.cfg.excache_bytes, committed: 0, used: 0 }
    }

    /// The owner of the vRegion holding `vpn`, from the cached vRegion array or the home.
    fn owner_of(&self, p: &Proc, vpn: u64) -> Result<ComponentRef, RpcError> {
        let idx = vpn * uffd::PAGE / self.vrs();
        if let Some(o) = p.vregions.lock().unwrap().get(&idx) {
            return Ok(o.clone());
        }
        match self.node.pool.call_direct(&p.home.addr, &Msg::P2M_VREGION { who: p.who.clone(), index: idx })? {
            Msg::M2P_VREGION { owner: Some(o) } => {
                p.vregions.lock().unwrap().insert(idx, o.clone());
                Ok(o)
            }
            _ => Err(RpcError::Remote { code: ErrCode::NotFound, msg: format!("address {:#x} is in no active vRegion", vpn * uffd::PAGE) }),
        }
    }

    fn learn_owners(&self, p: &Proc, owners: &[splitos_rpc::VregionOwner]) {
        let mut v = p.vregions.lock().unwrap();
        for o in owners {
            v.insert(o.index, o.owner.clone());
        }
    }

    /// Ends a process whose memory cannot be served: says why on its stderr, then kills it.
    fn fail_process(&self, p: &Proc, why: String) {
        if !p.alive.swap(false, Relaxed) {
            return;
        }
        tracing::error!(pid = p.pid, os_pid = p.os_pid, %why, "killing a process whose memory is unreachable");
        let line = format!("splitos: {why}; the process cannot continue\n");
        let _ = std::fs::OpenOptions::new().write(true).open(format!("/proc/{}/fd/2", p.os_pid)).and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        p.run.errors.lock().unwrap().push(why);
        unsafe { libc::kill(p.os_pid, libc::SIGKILL) };
    }

    fn stats_json(&self) -> String {
        let g = self.inner.lock().unwrap();
        serde_json::json!({
            "role": "pcomponent", "id": self.node.id(), "addr": self.node.addr,
            "uptime_ms": self.started.elapsed().as_millis() as u64,
            "excache": {
                "capacity_bytes": g.cache.lines() as u64 * uffd::PAGE, "lines": g.cache.lines(), "ways": g.cache.ways(),
                "sets": g.cache.sets(), "policy": g.cache.policy_name(), "piggyback": self.cfg.piggyback,
                "used_lines": g.cache.used(), "fault_workers": self.cfg.fault_workers,
            },
            "processes": g.procs.values().map(|p| serde_json::json!({"pid": p.pid, "os_pid": p.os_pid, "vnode": p.who.vnode, "resident_lines": g.cache.resident_of(p.pid)})).collect::<Vec<_>>(),
            "totals": self.total.json(),
        })
        .to_string()
    }

    fn export_metrics(&self) {
        let t = &self.total;
        for (k, v) in [
            ("pcomp_misses_total", &t.misses),
            ("pcomp_evictions_total", &t.evictions),
            ("pcomp_flushes_total", &t.flushes),
            ("pcomp_piggybacked_total", &t.piggybacked),
            ("pcomp_plocal_fills_total", &t.plocal_fills),
            ("pcomp_bytes_fetched_total", &t.bytes_fetched),
            ("pcomp_bytes_flushed_total", &t.bytes_flushed),
            ("pcomp_wp_faults_total", &t.wp_faults),
        ] {
            metrics::counter!(k).absolute(v.load(Relaxed));
        }
        metrics::gauge!("pcomp_excache_used_lines").set(self.inner.lock().unwrap().cache.used() as f64);
    }
}

fn thread_count(os_pid: i32) -> u32 {
    std::fs::read_to_string(format!("/proc/{os_pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(17)).and_then(|t| t.parse().ok()))
        .unwrap_or(1)
}

impl Handler for Pcomp {
    fn handle(&self, msg: Msg) -> Msg {
        match msg {
            Msg::C2X_PING => Msg::X2C_PONG { role: Role::Proc, id: self.node.id() },
            Msg::C2X_STATS => Msg::X2C_STATS { json: self.stats_json() },
            Msg::C2X_METRICS => {
                self.export_metrics();
                Msg::X2C_METRICS { text: node::render_metrics() }
            }
            Msg::C2P_RUN_STATS { run_id } => {
                let r = self.runs.lock().unwrap().get(&run_id).cloned();
                match r {
                    Some(r) => Msg::X2C_STATS { json: r.json().to_string() },
                    None => Msg::err(ErrCode::NotFound, format!("no run {run_id} on this pComponent")),
                }
            }
            Msg::C2P_MOUNT_VNODE { vnode } => match self.mounts.mount(&vnode) {
                Ok(dir) => Msg::P2C_MOUNTED { dir: dir.to_string_lossy().into_owned() },
                Err((code, msg)) => Msg::ERR { code, msg },
            },
            Msg::C2X_SHUTDOWN => {
                self.mounts.unmount_all();
                crate::node::exit_soon();
                Msg::OK
            }
            other => Msg::err(ErrCode::Invalid, format!("a pComponent does not handle {}", other.name())),
        }
    }
}

pub struct ProcArgs {
    pub listen: String,
    pub gm: String,
    pub shim_sock: std::path::PathBuf,
    /// Where vNode file systems are mounted (one directory per vNode).
    pub vnode_root: std::path::PathBuf,
    pub cfg: PcompConfig,
    pub ready_file: Option<std::path::PathBuf>,
    pub metrics_addr: Option<String>,
}

pub fn run(args: ProcArgs) -> anyhow::Result<()> {
    let stop = node::block_stop_signals();
    let policy = policy_by_name(&args.cfg.policy)
        .ok_or_else(|| anyhow::anyhow!("unknown eviction policy {:?} (known: {})", args.cfg.policy, POLICIES.join(", ")))?;
    let node = Node::new(Role::Proc, &args.gm);
    let listener = splitos_rpc::transport::Transport::listen(&*node.transport, &args.listen)
        .map_err(|e| anyhow::anyhow!("pComponent cannot listen on {}: {e}", args.listen))?;
    let node = node.with_addr(listener.local_addr());
    let lines = (args.cfg.excache_bytes / uffd::PAGE) as usize;
    if lines == 0 {
        anyhow::bail!("excache: {} bytes is less than one 4 KiB line", args.cfg.excache_bytes);
    }
    let p = Arc::new(Pcomp {
        node: node.clone(),
        cfg: args.cfg.clone(),
        mounts: vfs::Mounts::new(args.vnode_root.clone(), node.clone()),
        vregion_size: AtomicU64::new(1 << 30),
        inner: Mutex::new(Inner { cache: ExCache::new(lines, args.cfg.ways, policy), inflight: HashSet::new(), materialized: HashMap::new(), procs: HashMap::new() }),
        cv: Condvar::new(),
        pending: Mutex::new(HashMap::new()),
        next_pid: AtomicU64::new(1),
        runs: Mutex::new(HashMap::new()),
        total: Arc::new(RunStats::default()),
        fault_spin: std::time::Duration::from_micros(node.transport.spin_us.load(Relaxed)),
        started: Instant::now(),
    });
    let p2 = p.clone();
    // Programs must not find dead mounts: unmount the vNode file systems before exiting.
    stop.on_stop(move || p2.mounts.unmount_all());
    let shim_sock = args.shim_sock.to_string_lossy().to_string();
    shim::listen(p.clone(), &args.shim_sock)?;
    let h = serve(listener, p.clone(), ServerConfig { name: "pcomp".into(), workers: 1, fanout_workers: 1 });
    let vrs = node.register(Some(shim_sock.clone()), p.load()).map_err(|e| anyhow::anyhow!("cannot register with the global managers at {}: {e}", args.gm))?;
    p.vregion_size.store(vrs, Relaxed);
    // Process ids are unique across pComponents: the component id is in the high bits.
    p.next_pid.store(((node.id() as u64) << 32) | 1, Relaxed);
    let p2 = p.clone();
    node.clone().heartbeat_forever(Some(shim_sock.clone()), move || p2.load());
    if let Some(m) = &args.metrics_addr {
        let at = node::serve_metrics_http(m)?;
        tracing::info!(metrics = %at, "serving Prometheus metrics");
    }
    {
        let g = p.inner.lock().unwrap();
        tracing::info!(addr = %h.addr, id = node.id(), role = "pcomponent", shim_sock = %shim_sock, excache_lines = g.cache.lines(), ways = g.cache.ways(), policy = g.cache.policy_name(), piggyback = args.cfg.piggyback, "splitos process monitor started");
    }
    node::announce_ready(args.ready_file.as_deref(), &h.addr);
    crate::node::park_forever()
}
