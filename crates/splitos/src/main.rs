//! splitos: one binary for every monitor, the global managers and the user. This file is
//! only the command line; everything it runs is in the `splitos` library.
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use splitos_rpc::poll::Polling;
use splitos_rpc::transport::{ShmConfig, TcpConfig, TransportConfig};

use splitos::config::{self, ClusterConfig, Size};
use splitos::{bench, control, gm, mmon, nmon, node, placement, pmon, sim, smon};

#[derive(Parser)]
#[command(name = "splitos", version, about = "A user-space splitkernel: run unmodified programs with their memory on disaggregated memory components")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// The transport a monitor uses (`[transport]` of a cluster configuration).
#[derive(Args, Clone, Debug)]
struct TransportArgs {
    #[arg(long = "transport", default_value_t = TransportConfig::default().kind, help = format!("Transport to the other components: {}", splitos_rpc::transport::KINDS.join(", ")))]
    kind: String,
    #[arg(long, default_value_t = TransportConfig::default().polling, help = format!("Whether waiters poll adaptively or always for the whole spin: {}", splitos_rpc::poll::POLLING.join(", ")))]
    polling: Polling,
    /// TCP: how long a reader polls its socket before sleeping (µs).
    #[arg(long, default_value_t = TransportConfig::default().tcp.spin_us)]
    tcp_spin_us: u64,
    /// TCP: delay added before every message this component sends (µs; fault injection).
    #[arg(long, default_value_t = TransportConfig::default().tcp.delay_us)]
    tcp_delay_us: u64,
    /// TCP: connections this component serves at once, from all peers.
    #[arg(long, default_value_t = TransportConfig::default().tcp.max_connections)]
    tcp_max_connections: usize,
    /// TCP: connections this component serves at once from one peer address.
    #[arg(long, default_value_t = TransportConfig::default().tcp.max_connections_per_peer)]
    tcp_max_connections_per_peer: usize,
    /// TCP: how long a frame may take to arrive once begun, and a new connection's first frame (ms).
    #[arg(long, default_value_t = TransportConfig::default().tcp.frame_timeout_ms)]
    tcp_frame_timeout_ms: u64,
    /// TCP: requests of one connection this component serves at once.
    #[arg(long, default_value_t = TransportConfig::default().tcp.max_in_flight)]
    tcp_max_in_flight: usize,
    /// Shared memory: how long a side polls its channel before sleeping (µs).
    #[arg(long, default_value_t = TransportConfig::default().shm.spin_us)]
    shm_spin_us: u64,
    /// Shared memory: the directory of the rendezvous sockets (empty: $XDG_RUNTIME_DIR/splitos, else /run/splitos for root, else $HOME/.local/state/splitos).
    #[arg(long, default_value_t = TransportConfig::default().shm.dir)]
    shm_dir: String,
    /// Shared memory: how long a channel this component opened may sit unused before it closes it, ending its server's thread (ms).
    #[arg(long, default_value_t = TransportConfig::default().shm.idle_ms)]
    shm_idle_ms: u64,
    /// This component's credentials, issued by the cluster's authority (`cluster up` makes them for the components it starts; `splitos cluster credentials --role ROLE --out FILE` for one started by hand).
    #[arg(long)]
    credentials: Option<PathBuf>,
}

impl TransportArgs {
    /// The credentials file, which every component needs.
    fn credentials(&self) -> anyhow::Result<PathBuf> {
        self.credentials
            .clone()
            .ok_or_else(|| anyhow::anyhow!("a component needs the cluster's credentials: --credentials FILE (`splitos cluster credentials --role ROLE --out FILE` issues them from the cluster's authority)"))
    }

    fn config(self) -> TransportConfig {
        TransportConfig {
            kind: self.kind,
            polling: self.polling,
            tcp: TcpConfig {
                spin_us: self.tcp_spin_us,
                delay_us: self.tcp_delay_us,
                max_connections: self.tcp_max_connections,
                max_connections_per_peer: self.tcp_max_connections_per_peer,
                frame_timeout_ms: self.tcp_frame_timeout_ms,
                max_in_flight: self.tcp_max_in_flight,
            },
            shm: ShmConfig { spin_us: self.shm_spin_us, dir: self.shm_dir, idle_ms: self.shm_idle_ms },
        }
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a program with its heap on mComponents.
    ///
    /// Finds the cluster in this order: --pcomponent, --gm, $SPLITOS_GM, $SPLITOS_PCOMPONENT,
    /// the cluster started by `splitos cluster up` (its state file); for a user other than
    /// root, the host's cluster (the program sockets in its state directory, /run/splitos or
    /// $SPLITOS_STATE_DIR), on a vNode the admin granted that user; for root, else an embedded
    /// cluster (global managers, one pComponent, two mComponents, each its own process on
    /// loopback) for the duration of the program. A cluster named or started that cannot be
    /// reached is an error, never a reason to run on another; --embedded always runs on an
    /// embedded one. The program runs as the user who runs this; its stdout, stderr and exit
    /// status are its own.
    #[command(trailing_var_arg = true)]
    Run {
        // The embedded cluster's options are `None` unless given, so that `run` can tell a
        // running cluster's user they do not apply; their help shows the config's default.
        #[arg(long, help = format!("ExCache capacity of the embedded cluster's pComponent [default: {}]", config::default_pcomp().excache))]
        excache: Option<Size>,
        #[arg(long, help = format!("ExCache associativity: lines per set, 0 = fully associative [default: {}]", config::default_pcomp().ways))]
        ways: Option<usize>,
        #[arg(long, help = format!("Eviction policy: {} [default: {}]", pmon::POLICIES.join(", "), config::default_pcomp().policy))]
        policy: Option<String>,
        /// Send dirty flushes and miss fills as separate RPCs even to the same mComponent.
        #[arg(long)]
        no_piggyback: bool,
        #[arg(long, help = format!("Threads of the pComponent serving the misses of each process [default: {}]", config::default_pcomp().fault_workers))]
        fault_workers: Option<usize>,
        #[arg(long, help = format!("Most lines the embedded cluster's pComponent reads ahead with a remote miss when misses are sequential; 0 = off [default: {}]", config::default_pcomp().prefetch))]
        prefetch: Option<usize>,
        #[arg(long, help = format!("Read-ahead policy of the embedded cluster's pComponent: {} [default: {}]", pmon::PREFETCH_POLICIES.join(", "), config::default_pcomp().prefetch_policy))]
        prefetch_policy: Option<String>,
        #[arg(long, help = format!("Fresh lines the embedded cluster's pComponent installs with a first touch; 0 = off [default: {}]", config::default_pcomp().fault_around))]
        fault_around: Option<usize>,
        #[arg(long, help = format!("Transport between the embedded cluster's components: {} [default: {}]", splitos_rpc::transport::KINDS.join(", "), TransportConfig::default().kind))]
        transport: Option<String>,
        #[arg(long, help = format!("How the embedded cluster's waiters poll (transport and fault workers): {} [default: {}]", splitos_rpc::poll::POLLING.join(", "), Polling::default()))]
        polling: Option<Polling>,
        #[arg(long, help = format!("Memory the embedded cluster's pComponent keeps evicted lines in, compressed, beyond the ExCache; 0 = off [default: {}]", config::default_pcomp().compressed_tier))]
        compressed_tier: Option<Size>,
        #[arg(long, help = format!("Fresh lines the embedded cluster's pComponent pre-allocates in the heap's memfd past a first touch, so that touching them does not trap; 0 = off [default: {}]", config::default_pcomp().prealloc))]
        prealloc: Option<usize>,
        #[arg(long, help = format!("Unmapped heap each process keeps mapped at its home, to map again without asking it; 0 = off [default: {}]", config::default_pcomp().heap_reuse))]
        heap_reuse: Option<Size>,
        #[arg(long, help = format!("Huge pages for fresh heap memory of the embedded cluster's pComponent: {} (on needs root) [default: {}]", pmon::HUGE_PAGES.join(", "), config::default_pcomp().huge_pages))]
        huge_pages: Option<pmon::HugePages>,
        #[arg(long, help = format!("How the embedded cluster's pComponent learns which lines a program wrote: {} [default: {}]", pmon::DIRTY_TRACKING.join(", "), config::default_pcomp().dirty_tracking))]
        dirty_tracking: Option<pmon::DirtyTracking>,
        #[arg(long, help = format!("Spare ways a background evictor of the embedded cluster's pComponent keeps in each ExCache set a miss used, fewer than --ways; 0 = off [default: {}]", config::default_pcomp().evict_reserve))]
        evict_reserve: Option<usize>,
        #[arg(long, help = format!("Number of mComponents of the embedded cluster [default: {}]", ClusterConfig::embedded().mcomponent.len()))]
        mcomponents: Option<usize>,
        /// Start an nComponent with the embedded cluster: the program's TCP sockets live on it (docs/network.md).
        #[arg(long)]
        ncomponent: bool,
        #[arg(long, help = format!("How the embedded pComponent's sockets reach the nComponent: {} [default: {}]", pmon::NET_PATHS.join(", "), config::default_pcomp().net_path))]
        net_path: Option<pmon::NetPath>,
        #[arg(long, help = format!("Memory each embedded mComponent offers [default: {}]", config::default_mcomp().capacity))]
        mem_capacity: Option<Size>,
        #[arg(long, help = format!("Worker threads per embedded mComponent; 0 serves requests on each connection's receiving thread [default: {}]", config::default_mcomp().workers))]
        mem_workers: Option<usize>,
        #[arg(long, help = format!("vRegion size of the embedded cluster, a power of two [default: {}]", config::default_cluster().vregion_size))]
        vregion_size: Option<Size>,
        /// How the embedded cluster keeps heap memory safe from the loss of an mComponent: none, replica, log (LegoOS: one copy plus a log of its write-backs streamed to a backup file on the sComponent), ec, ec:K (one copy striped over K = 2, 4 or 8 mComponents plus XOR parity; ec is ec:4) [default: replica with 3 or more mComponents, else none].
        #[arg(long, value_parser = parse_replication)]
        replication: Option<splitos_rpc::Replication>,
        /// When the embedded cluster charges heap memory: heuristic (when stored), strict (writable mappings whole, when made) [default: heuristic].
        #[arg(long, value_parser = parse_overcommit)]
        overcommit: Option<splitos_rpc::Overcommit>,
        /// Always start an embedded cluster, even if one is running.
        #[arg(long)]
        embedded: bool,
        /// Address of the global managers of a running cluster (needs the admin's credentials).
        #[arg(long)]
        gm: Option<String>,
        /// The program socket of a pComponent of this host to run on, as a user the cluster's admin granted the vNode (see docs/security.md); also $SPLITOS_PCOMPONENT.
        #[arg(long, value_name = "SOCKET")]
        pcomponent: Option<PathBuf>,
        /// The vNode to run the process in.
        #[arg(long, default_value = "default")]
        vnode: String,
        /// Write the run's counters as JSON to this file.
        #[arg(long)]
        stats_json: Option<PathBuf>,
        /// Print the run's counters to stderr when it ends.
        #[arg(long)]
        stats: bool,
        /// Also run the program natively first and report both times.
        #[arg(long)]
        compare_native: bool,
        /// Run a statically linked program natively (with a warning) instead of refusing it.
        #[arg(long)]
        allow_native: bool,
        /// Print no hints, such as the one when most of the run went to ExCache misses of a too small ExCache.
        #[arg(long, short)]
        quiet: bool,
        #[arg(long, help = format!("Where the embedded cluster's fault workers run: {} (faulting: on the faulting thread's CPU, sleeping between faults) [default: {}]", pmon::FAULT_CPUS.join(", "), config::default_pcomp().fault_cpu))]
        fault_cpu: Option<pmon::FaultCpu>,
        /// The program and its arguments.
        #[arg(required = true)]
        program: Vec<String>,
    },
    /// Manage a long-lived cluster on this host.
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Run the global managers (GPM, GMM).
    Gm {
        #[arg(long, default_value = config::HAND_STARTED_GM)]
        listen: String,
        #[arg(long, default_value_t = config::default_cluster().vregion_size)]
        vregion_size: Size,
        /// How long a component that stopped heartbeating is kept (shown dead) before it is forgotten (ms).
        #[arg(long, default_value_t = config::default_cluster().forget_dead_ms)]
        forget_dead_ms: u64,
        /// How long a pComponent or mComponent may be silent before it is declared lost (ms): the mComponents release the memory of a lost pComponent's processes; programs wait for a silent mComponent until it is declared lost.
        #[arg(long, default_value_t = config::default_cluster().reclaim_dead_ms)]
        reclaim_dead_ms: u64,
        /// How heap memory survives the loss of an mComponent: none (one copy), replica (two, on different hosts where there are), log (LegoOS: one copy, and a logger mComponent streams each write-back to a backup file on an sComponent), ec or ec:K (one copy striped over K = 2, 4 or 8 mComponents plus their XOR parity on one more; ec is ec:4).
        #[arg(long, default_value = "none", value_parser = parse_replication)]
        replication: splitos_rpc::Replication,
        /// When heap memory is charged: heuristic (when stored; only a mapping larger than all memory is refused), strict (writable mappings whole, when made).
        #[arg(long, default_value = "heuristic", value_parser = parse_overcommit)]
        overcommit: splitos_rpc::Overcommit,
        /// How GPM and GMM choose among the components with room: least-loaded (spreads), best-fit (the least free), first-fit (the first registered).
        #[arg(long, default_value_t = config::default_cluster().placement)]
        placement: placement::Policy,
        #[arg(long)]
        ready_file: Option<PathBuf>,
        /// Serve Prometheus metrics over HTTP here.
        #[arg(long)]
        metrics_addr: Option<String>,
        /// A vNode's memory quota: what all its processes together may map writable; beyond it their mappings fail with ENOMEM (repeatable; see docs/security.md).
        #[arg(long = "vnode-memory", value_name = "VNODE=SIZE", value_parser = config::parse_vnode_memory)]
        vnode_memory: Vec<(String, u64)>,
        #[command(flatten)]
        transport: TransportArgs,
    },
    /// Run a memory monitor (mComponent).
    Mem {
        #[arg(long, default_value_t = config::default_mcomp().listen)]
        listen: String,
        #[arg(long, default_value = config::HAND_STARTED_GM)]
        gm: String,
        #[arg(long, default_value_t = config::default_mcomp().capacity)]
        capacity: Size,
        /// Worker threads for data-path requests; 0 serves them on each connection's receiving thread.
        #[arg(long, default_value_t = config::default_mcomp().workers)]
        workers: usize,
        /// Storage buffer cache held for the files the global managers place here.
        #[arg(long, default_value_t = config::default_mcomp().bcache)]
        bcache: Size,
        /// Largest read-ahead for sequential file reads through the buffer cache (0: off).
        #[arg(long, default_value_t = config::default_mcomp().readahead)]
        readahead: Size,
        /// Backup log kept for the sComponent with replication "log": write-backs beyond it
        /// leave their vRegion unprotected until its primary copies it again.
        #[arg(long, default_value_t = config::default_mcomp().backup_log)]
        backup_log: Size,
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[arg(long)]
        metrics_addr: Option<String>,
        #[command(flatten)]
        transport: TransportArgs,
    },
    /// Run a process monitor (pComponent).
    Proc {
        #[arg(long, default_value_t = config::default_pcomp().listen)]
        listen: String,
        #[arg(long, default_value = config::HAND_STARTED_GM)]
        gm: String,
        #[arg(long, default_value_t = config::default_pcomp().excache)]
        excache: Size,
        /// ExCache associativity: lines per set (0 = fully associative).
        #[arg(long, default_value_t = config::default_pcomp().ways)]
        ways: usize,
        #[arg(long, default_value_t = config::default_pcomp().policy, help = format!("Eviction policy: {}", pmon::POLICIES.join(", ")))]
        policy: String,
        /// Send dirty flushes and miss fills as separate RPCs (piggybacking is the default).
        #[arg(long)]
        no_piggyback: bool,
        /// Threads serving the misses of each process.
        #[arg(long, default_value_t = config::default_pcomp().fault_workers)]
        fault_workers: usize,
        /// How long a fault worker polls for the next fault before sleeping (µs).
        #[arg(long, default_value_t = config::default_pcomp().fault_spin_us)]
        fault_spin_us: u64,
        #[arg(long, default_value_t = config::default_pcomp().fault_polling, help = format!("Whether fault workers' polling adapts to how often the process faults: {}", splitos_rpc::poll::POLLING.join(", ")))]
        fault_polling: Polling,
        /// Most lines read ahead with a remote miss (0: off).
        #[arg(long, default_value_t = config::default_pcomp().prefetch)]
        prefetch: usize,
        #[arg(long, default_value_t = config::default_pcomp().prefetch_policy, help = format!("Read-ahead policy: {}", pmon::PREFETCH_POLICIES.join(", ")))]
        prefetch_policy: String,
        /// Fresh lines installed zero-filled and writable with a first touch (0: off).
        #[arg(long, default_value_t = config::default_pcomp().fault_around)]
        fault_around: usize,
        /// Memory for evicted lines kept compressed, beyond the ExCache (0: off).
        #[arg(long, default_value_t = config::default_pcomp().compressed_tier)]
        compressed_tier: Size,
        /// Fresh lines pre-allocated in the heap's memfd past a first touch (0: off).
        #[arg(long, default_value_t = config::default_pcomp().prealloc)]
        prealloc: usize,
        /// Unmapped heap each process keeps mapped at its home, to map again without asking it (0: off).
        #[arg(long, default_value_t = config::default_pcomp().heap_reuse)]
        heap_reuse: Size,
        #[arg(long, default_value_t = config::default_pcomp().huge_pages, help = format!("Heaps on a private tmpfs, fresh 2 MiB extents pre-allocated as huge pages: {} (on needs root)", pmon::HUGE_PAGES.join(", ")))]
        huge_pages: pmon::HugePages,
        #[arg(long, default_value_t = config::default_pcomp().dirty_tracking, help = format!("How the pComponent learns which lines a program wrote: {} (fault: the first write traps; scan: the kernel records writes, eviction asks it)", pmon::DIRTY_TRACKING.join(", ")))]
        dirty_tracking: pmon::DirtyTracking,
        /// Spare ways a background evictor keeps in each ExCache set a miss used, fewer than --ways (0: off).
        #[arg(long, default_value_t = config::default_pcomp().evict_reserve)]
        evict_reserve: usize,
        /// Connect two programs of a vNode through an nComponent, not directly (the shortcut,
        /// on by default: through this pComponent when both are here, else pComponent to
        /// pComponent).
        #[arg(long)]
        no_net_shortcut: bool,
        #[arg(long, default_value_t = config::default_pcomp().net_path, help = format!("How sockets' bytes travel to the nComponent: {} (ddio: in the requests; dma: through socket buffers on an mComponent)", pmon::NET_PATHS.join(", ")))]
        net_path: pmon::NetPath,
        /// Programs of one user other than root that may run here at once; beyond, a program is refused at its start and a fork fails (EAGAIN).
        #[arg(long, default_value_t = config::default_pcomp().max_programs_per_user)]
        max_programs_per_user: usize,
        /// Programs of all users but root that may run here at once.
        #[arg(long, default_value_t = config::default_pcomp().max_programs)]
        max_programs: usize,
        /// Unix socket where programs' shims connect.
        #[arg(long)]
        shim_sock: PathBuf,
        /// Directory under which each vNode's file system is mounted (one subdirectory per vNode).
        #[arg(long)]
        vnode_root: PathBuf,
        /// Let users run programs on a vNode and see its files: VNODE=user:NAME,group:NAME,... (names or numeric ids; repeatable). Root uses every vNode; a vNode granted to no one is root's alone.
        #[arg(long = "grant", value_name = "VNODE=WHO,...")]
        grants: Vec<String>,
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[arg(long)]
        metrics_addr: Option<String>,
        #[command(flatten)]
        transport: TransportArgs,
        #[arg(long, default_value_t = config::default_pcomp().fault_cpu, help = format!("Where fault workers run: {} (faulting: on the faulting thread's CPU, sleeping between faults whatever --fault-spin-us says, unless the thread keeps leaving that CPU)", pmon::FAULT_CPUS.join(", ")))]
        fault_cpu: pmon::FaultCpu,
    },
    /// Run a storage monitor (sComponent): vNodes' files, kept durably under --dir.
    Storage {
        #[arg(long, default_value_t = config::default_scomp().listen)]
        listen: String,
        #[arg(long, default_value = config::HAND_STARTED_GM)]
        gm: String,
        /// Directory holding the namespace database and file data. If another sComponent has it
        /// open, this one passes requests on files to that one, and takes it over when it stops.
        #[arg(long)]
        dir: PathBuf,
        /// Bytes of file data stored for all vNodes together; beyond it writes fail with ENOSPC.
        #[arg(long, default_value_t = config::default_scomp().quota)]
        quota: Size,
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[arg(long)]
        metrics_addr: Option<String>,
        #[command(flatten)]
        transport: TransportArgs,
    },
    /// Run a network monitor (nComponent): owns this host's network interfaces and runs the
    /// sockets of programs on pComponents on its stack (docs/network.md).
    Net {
        #[arg(long, default_value_t = config::default_ncomp().listen)]
        listen: String,
        #[arg(long, default_value = config::HAND_STARTED_GM)]
        gm: String,
        /// An interface address to register with the global network manager (repeat it);
        /// none: every address of this host but loopback and IPv6 link-local ones.
        #[arg(long = "nic-addr")]
        nics: Vec<std::net::IpAddr>,
        #[arg(long, default_value_t = config::default_ncomp().loopback, help = format!("What programs' connects to loopback reach: {} (vnode: only ports their vNode holds here; host: the host's loopback)", nmon::LOOPBACKS.join(", ")))]
        loopback: nmon::Loopback,
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[arg(long)]
        metrics_addr: Option<String>,
        #[command(flatten)]
        transport: TransportArgs,
    },
    /// Replay a cluster trace against fixed, disaggregated and splitos datacenters with the same resources (docs/simulation.md).
    ///
    /// Reports per model the fragmentation index, the modules that could be switched off,
    /// the tasks that could not be placed and their waits, utilization, and the failure
    /// model of LegoOS section 6.3 for the units the replay needed.
    Sim(sim::SimArgs),
    /// Measure the floors a miss is compared with (JSON on stdout).
    BenchFloor {
        #[arg(long, default_value_t = 20000)]
        n: usize,
        /// Also time the splitos RPC round trip to this mComponent.
        #[arg(long)]
        mcomp: Option<String>,
    },
    /// Tools for testing and debugging components.
    Debug {
        #[command(subcommand)]
        cmd: DebugCmd,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Start a cluster that outlives this command (state in $SPLITOS_STATE_DIR or /run/splitos).
    Up {
        /// Cluster configuration (TOML); default: 1 pComponent, 2 mComponents on loopback.
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Show every component, its liveness (yes; unresponsive: late on heartbeats, waited for; LOST: declared lost after reclaim_dead_ms) and its memory.
    Status {
        #[arg(long)]
        gm: Option<String>,
        /// Print JSON (also when no cluster runs: {"gm": null, "components": [], "error": ...}).
        #[arg(long)]
        json: bool,
    },
    /// Stop the cluster started by `cluster up`; refused while programs run on it, unless --force.
    Down {
        /// Stop it even while programs run on it (they are stopped with it).
        #[arg(long)]
        force: bool,
    },
    /// Print every component's counters in Prometheus text format.
    Metrics {
        #[arg(long)]
        gm: Option<String>,
    },
    /// Issue credentials from the cluster's authority (in the state directory), for a
    /// component started by hand or another admin's tools.
    Credentials {
        /// global-managers, pcomponent, mcomponent, scomponent, ncomponent or admin (or the subcommand that runs it: gm, proc, mem, storage, net).
        #[arg(long)]
        role: String,
        /// Where to write them (mode 0600).
        #[arg(long)]
        out: PathBuf,
    },
}

/// A process's memory on one mComponent, as the debug tools name it.
#[derive(Args)]
struct ProcessOnMcomp {
    #[arg(long)]
    mcomp: String,
    #[arg(long)]
    vnode: String,
    #[arg(long)]
    pid: u64,
}

#[derive(Subcommand)]
enum DebugCmd {
    /// Send one P2M_FETCH to an mComponent, as a pComponent would, and print the answer.
    Fetch {
        #[command(flatten)]
        at: ProcessOnMcomp,
        #[arg(long, value_parser = clap_num_u64)]
        vaddr: u64,
    },
    /// Flip a bit of a page an mComponent stores for a process (fault injection): the first page at or after --vaddr. The pComponent that fetches it finds it fails its checksum.
    Flip {
        #[command(flatten)]
        at: ProcessOnMcomp,
        #[arg(long, value_parser = clap_num_u64, default_value_t = 0)]
        vaddr: u64,
        /// Which bit of the page (0 to 32767).
        #[arg(long, default_value_t = 0)]
        bit: u32,
    },
}

fn parse_replication(s: &str) -> Result<splitos_rpc::Replication, String> {
    splitos_rpc::Replication::from_name(s)
}

fn parse_overcommit(s: &str) -> Result<splitos_rpc::Overcommit, String> {
    splitos_rpc::Overcommit::from_name(s)
}

fn clap_num_u64(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).map_err(|e| e.to_string()),
        None => s.parse().map_err(|e: std::num::ParseIntError| e.to_string()),
    }
}

fn main() {
    let cli = Cli::parse();
    node::init_logging();
    let r = match cli.cmd {
        Cmd::Run {
            excache,
            ways,
            policy,
            no_piggyback,
            fault_workers,
            prefetch,
            prefetch_policy,
            fault_around,
            compressed_tier,
            prealloc,
            heap_reuse,
            huge_pages,
            dirty_tracking,
            evict_reserve,
            transport,
            polling,
            mcomponents,
            ncomponent,
            net_path,
            mem_capacity,
            mem_workers,
            vregion_size,
            replication,
            overcommit,
            embedded,
            gm,
            pcomponent,
            vnode,
            stats_json,
            stats,
            compare_native,
            allow_native,
            quiet,
            fault_cpu,
            program,
        } => {
            let (excache, compressed_tier, mem_capacity, vregion_size) = (excache.map(|s| s.0), compressed_tier.map(|s| s.0), mem_capacity.map(|s| s.0), vregion_size.map(|s| s.0));
            control::run::run(control::run::RunArgs {
                program,
                gm,
                pcomponent,
                embedded,
                excache,
                ways,
                policy,
                no_piggyback,
                fault_workers,
                prefetch,
                prefetch_policy,
                fault_around,
                compressed_tier,
                prealloc,
                heap_reuse,
                huge_pages,
                dirty_tracking,
                evict_reserve,
                transport,
                polling,
                mcomponents,
                ncomponent,
                net_path,
                mem_capacity,
                mem_workers,
                vregion_size,
                replication,
                overcommit,
                vnode,
                stats_json,
                compare_native,
                allow_native,
                print_stats: stats,
                fault_cpu,
                quiet,
            })
            .map(|code| std::process::exit(code))
        }
        Cmd::Cluster { cmd } => match cmd {
            ClusterCmd::Up { config } => control::up(config),
            ClusterCmd::Status { gm, json } => control::status(gm, json),
            ClusterCmd::Down { force } => control::down(force),
            ClusterCmd::Metrics { gm } => control::metrics(gm),
            ClusterCmd::Credentials { role, out } => control::credentials(&role, &out),
        },
        Cmd::Gm { listen, vregion_size, forget_dead_ms, reclaim_dead_ms, replication, overcommit, placement, ready_file, metrics_addr, transport, vnode_memory } => {
            node::init_metrics();
            transport.credentials().and_then(|credentials| {
                gm::run(gm::GmArgs {
                    listen,
                    credentials,
                    transport: transport.config(),
                    vregion_size: vregion_size.0,
                    replication,
                    overcommit,
                    placement,
                    forget_dead: std::time::Duration::from_millis(forget_dead_ms),
                    reclaim_dead: std::time::Duration::from_millis(reclaim_dead_ms),
                    ready_file,
                    metrics_addr,
                    memory_quotas: vnode_memory.into_iter().collect(),
                })
            })
        }
        Cmd::Mem { listen, gm, capacity, workers, bcache, readahead, backup_log, ready_file, metrics_addr, transport } => {
            node::init_metrics();
            transport.credentials().and_then(|credentials| {
                mmon::run(mmon::MemArgs {
                    listen,
                    credentials,
                    transport: transport.config(),
                    gm,
                    capacity: capacity.0,
                    workers,
                    bcache: bcache.0,
                    readahead: readahead.0,
                    backup_log: backup_log.0,
                    ready_file,
                    metrics_addr,
                })
            })
        }
        Cmd::Proc {
            listen,
            gm,
            excache,
            ways,
            policy,
            no_piggyback,
            fault_workers,
            fault_spin_us,
            fault_polling,
            prefetch,
            prefetch_policy,
            fault_around,
            compressed_tier,
            prealloc,
            heap_reuse,
            huge_pages,
            dirty_tracking,
            evict_reserve,
            no_net_shortcut,
            net_path,
            max_programs_per_user,
            max_programs,
            shim_sock,
            vnode_root,
            grants,
            ready_file,
            metrics_addr,
            transport,
            fault_cpu,
        } => {
            node::init_metrics();
            let cfg = pmon::PcompConfig {
                excache_bytes: excache.0,
                ways,
                policy,
                piggyback: !no_piggyback,
                fault_workers,
                fault_spin_us,
                fault_polling,
                prefetch,
                prefetch_policy,
                fault_around,
                compressed_tier_bytes: compressed_tier.0,
                prealloc,
                heap_reuse: heap_reuse.0,
                huge_pages,
                fault_cpu,
                dirty_tracking,
                evict_reserve,
                net_shortcut: !no_net_shortcut,
                net_path,
                max_programs_per_user,
                max_programs,
            };
            transport.credentials().and_then(|credentials| pmon::run(pmon::ProcArgs { listen, credentials, transport: transport.config(), gm, shim_sock, vnode_root, grants, cfg, ready_file, metrics_addr }))
        }
        Cmd::Storage { listen, gm, dir, quota, ready_file, metrics_addr, transport } => {
            node::init_metrics();
            transport.credentials().and_then(|credentials| smon::run(smon::StorageArgs { listen, credentials, transport: transport.config(), gm, dir, quota: quota.0, ready_file, metrics_addr }))
        }
        Cmd::Net { listen, gm, nics, loopback, ready_file, metrics_addr, transport } => {
            node::init_metrics();
            transport.credentials().and_then(|credentials| nmon::run(nmon::NetArgs { listen, loopback, credentials, transport: transport.config(), gm, nics, ready_file, metrics_addr }))
        }
        Cmd::Sim(args) => sim::run(args),
        Cmd::BenchFloor { n, mcomp } => bench::floor(n, mcomp),
        Cmd::Debug { cmd: DebugCmd::Fetch { at, vaddr } } => control::debug_fetch(&at.mcomp, at.vnode, at.pid, vaddr),
        Cmd::Debug { cmd: DebugCmd::Flip { at, vaddr, bit } } => control::debug_flip(&at.mcomp, at.vnode, at.pid, vaddr, bit),
    };
    if let Err(e) = r {
        eprintln!("splitos: {e:#}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;
    use splitos::config::{McompSection, PcompSection, ScompSection};

    fn parse(args: &[&str]) -> Cmd {
        Cli::try_parse_from(std::iter::once("splitos").chain(args.iter().copied())).unwrap_or_else(|e| panic!("{args:?}: {e}")).cmd
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// A monitor started by hand with no options gets what a config file that names it with
    /// no fields gets. The patterns name every field, so a field added on either side fails to
    /// compile here until its default is compared too.
    #[test]
    fn the_command_line_and_the_config_file_agree_on_every_default() {
        let file: ClusterConfig = toml::from_str("[[pcomponent]]\n[[mcomponent]]\n[[scomponent]]\n[[ncomponent]]\n").unwrap();

        let PcompSection {
            listen,
            excache,
            ways,
            policy,
            piggyback,
            fault_workers,
            fault_spin_us,
            fault_polling,
            prefetch,
            prefetch_policy,
            fault_around,
            compressed_tier,
            prealloc,
            heap_reuse,
            huge_pages,
            fault_cpu,
            dirty_tracking,
            evict_reserve,
            net_shortcut,
            net_path,
            max_programs_per_user,
            max_programs,
            netns: _,
        } = file.pcomponent[0].clone();
        let Cmd::Proc {
            listen: l,
            gm,
            excache: e,
            ways: w,
            policy: p,
            no_piggyback,
            fault_workers: f,
            fault_spin_us: fs,
            fault_polling: fp,
            prefetch: pf,
            prefetch_policy: pp,
            fault_around: fa,
            compressed_tier: ct,
            prealloc: pa,
            heap_reuse: hr,
            huge_pages: hp,
            dirty_tracking: dt,
            evict_reserve: er,
            no_net_shortcut,
            net_path: np,
            max_programs_per_user: mpu,
            max_programs: mp,
            shim_sock: _,
            vnode_root: _,
            grants: _,
            ready_file: _,
            metrics_addr: _,
            transport,
            fault_cpu: fc,
        } = parse(&["proc", "--shim-sock", "x", "--vnode-root", "y"])
        else {
            unreachable!()
        };
        assert_eq!((l, e, w, p, !no_piggyback, f, fs, fp), (listen, excache, ways, policy, piggyback, fault_workers, fault_spin_us, fault_polling), "proc");
        assert_eq!((pf, pp, fa, ct, pa, hr), (prefetch, prefetch_policy, fault_around, compressed_tier, prealloc, heap_reuse), "proc levers");
        assert_eq!((hp,), (huge_pages,), "proc memory levers");
        assert_eq!((fc,), (fault_cpu,), "proc placement");
        assert_eq!((dt,), (dirty_tracking,), "proc dirty tracking");
        assert_eq!((er,), (evict_reserve,), "proc evictor");
        assert_eq!((!no_net_shortcut, np), (net_shortcut, net_path), "proc network");
        assert_eq!((mpu, mp), (max_programs_per_user, max_programs), "proc caps");
        assert_eq!(transport.config(), file.transport, "proc transport");
        assert_eq!(gm, config::HAND_STARTED_GM);

        let McompSection { listen, capacity, workers, bcache, readahead, backup_log, netns: _ } = file.mcomponent[0].clone();
        let Cmd::Mem { listen: l, gm, capacity: c, workers: w, bcache: b, readahead: r, backup_log: bl, ready_file: _, metrics_addr: _, transport } = parse(&["mem"]) else { unreachable!() };
        assert_eq!((l, c, w, b, r, bl), (listen, capacity, workers, bcache, readahead, backup_log), "mem");
        assert_eq!(transport.config(), file.transport, "mem transport");
        assert_eq!(gm, config::HAND_STARTED_GM);

        // `dir` has no default on the command line: `cluster up` derives it from the data directory.
        let ScompSection { listen, dir: _, quota, netns: _ } = file.scomponent[0].clone();
        let Cmd::Storage { listen: l, gm, dir: _, quota: q, ready_file: _, metrics_addr: _, transport } = parse(&["storage", "--dir", "d"]) else { unreachable!() };
        assert_eq!((l, q), (listen, quota), "storage");
        assert_eq!(transport.config(), file.transport, "storage transport");
        assert_eq!(gm, config::HAND_STARTED_GM);

        let config::NcompSection { listen, nics, loopback, netns: _ } = file.ncomponent[0].clone();
        let Cmd::Net { listen: l, gm, nics: n, loopback: lb, ready_file: _, metrics_addr: _, transport } = parse(&["net"]) else { unreachable!() };
        assert_eq!((l, n, lb), (listen, nics, loopback), "net");
        assert_eq!(transport.config(), file.transport, "net transport");
        assert_eq!(gm, config::HAND_STARTED_GM);

        // The global managers' address differs on purpose: see `config::HAND_STARTED_GM`.
        let config::ClusterSection { gm: _, vregion_size, forget_dead_ms, reclaim_dead_ms, netns: _, replication: _, overcommit, placement } = file.cluster.clone();
        let Cmd::Gm { listen, vregion_size: v, forget_dead_ms: f, reclaim_dead_ms: r, replication, overcommit: o, placement: pl, ready_file: _, metrics_addr: _, transport, vnode_memory: _ } = parse(&["gm"]) else {
            unreachable!()
        };
        assert_eq!(o.name(), overcommit, "gm overcommit");
        assert_eq!(pl, placement, "gm placement");
        // The hand-started global managers cannot count the mComponents to come.
        assert_eq!(replication, splitos_rpc::Replication::None);
        assert_eq!((v, f, r), (vregion_size, forget_dead_ms, reclaim_dead_ms), "gm");
        assert_eq!(transport.config(), file.transport, "gm transport");
        assert_eq!(listen, config::HAND_STARTED_GM);

        // Left unset, so that `run` can tell a running cluster's user it does not apply.
        let Cmd::Run { mcomponents, .. } = parse(&["run", "true"]) else { unreachable!() };
        assert_eq!(mcomponents, None);
    }
}
