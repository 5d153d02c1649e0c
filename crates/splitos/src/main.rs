//! splitos: one binary for every monitor, the global managers and the user. This file is
//! only the command line; everything it runs is in the `splitos` library.
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use splitos::config::parse_size;
use splitos::{bench, control, gm, mmon, node, pmon, smon};

#[derive(Parser)]
#[command(name = "splitos", version, about = "A user-space splitkernel: run unmodified programs with their memory on disaggregated memory components")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s)
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a program with its heap on mComponents.
    ///
    /// Finds the cluster in this order: --gm, $SPLITOS_GM, the cluster started by
    /// `splitos cluster up` (its state file), else starts an embedded cluster (global managers,
    /// one pComponent, two mComponents, each its own process on loopback) for the duration of
    /// the program. The program's stdout, stderr and exit status are its own.
    #[command(trailing_var_arg = true)]
    Run {
        /// ExCache capacity of the embedded cluster's pComponent (e.g. 64M).
        #[arg(long, value_parser = size)]
        excache: Option<u64>,
        /// ExCache associativity: lines per set (0 = fully associative). Default 8.
        #[arg(long)]
        ways: Option<usize>,
        /// Eviction policy: fifo, or clock (LRU approximated by a reference bit).
        #[arg(long)]
        policy: Option<String>,
        /// Send dirty flushes and miss fills as separate RPCs even to the same mComponent.
        #[arg(long)]
        no_piggyback: bool,
        /// Threads of the pComponent serving the misses of each process. Default 1.
        #[arg(long)]
        fault_workers: Option<usize>,
        /// Number of mComponents of the embedded cluster.
        #[arg(long, default_value_t = 2)]
        mcomponents: usize,
        /// Memory each embedded mComponent offers (e.g. 8G).
        #[arg(long, value_parser = size)]
        mem_capacity: Option<u64>,
        /// Worker threads per embedded mComponent; 0 (default) serves requests on each
        /// connection's receiving thread.
        #[arg(long)]
        mem_workers: Option<usize>,
        /// vRegion size of the embedded cluster (power of two, e.g. 1G or 16M).
        #[arg(long, value_parser = size)]
        vregion_size: Option<u64>,
        /// Always start an embedded cluster, even if one is running.
        #[arg(long)]
        embedded: bool,
        /// Address of the global managers of a running cluster.
        #[arg(long)]
        gm: Option<String>,
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
        #[arg(long, default_value = "127.0.0.1:7100")]
        listen: String,
        #[arg(long, value_parser = size, default_value = "1G")]
        vregion_size: u64,
        #[arg(long)]
        ready_file: Option<PathBuf>,
        /// Serve Prometheus metrics over HTTP here.
        #[arg(long)]
        metrics_addr: Option<String>,
    },
    /// Run a memory monitor (mComponent).
    Mem {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        #[arg(long, default_value = "127.0.0.1:7100")]
        gm: String,
        #[arg(long, value_parser = size, default_value = "8G")]
        capacity: u64,
        /// Worker threads for data-path requests; 0 serves them on each connection's receiving thread.
        #[arg(long, default_value_t = 0)]
        workers: usize,
        /// Storage buffer cache held for the files the global managers place here.
        #[arg(long, value_parser = size, default_value = "256M")]
        bcache: u64,
        /// Largest read-ahead for sequential file reads through the buffer cache (0: off).
        #[arg(long, value_parser = size, default_value = "128K")]
        readahead: u64,
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[arg(long)]
        metrics_addr: Option<String>,
    },
    /// Run a process monitor (pComponent).
    Proc {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        #[arg(long, default_value = "127.0.0.1:7100")]
        gm: String,
        #[arg(long, value_parser = size, default_value = "64M")]
        excache: u64,
        #[arg(long, default_value_t = 8)]
        ways: usize,
        #[arg(long, default_value = "fifo")]
        policy: String,
        #[arg(long)]
        no_piggyback: bool,
        /// Threads serving the misses of each process.
        #[arg(long, default_value_t = 1)]
        fault_workers: usize,
        /// Unix socket where programs' shims connect.
        #[arg(long)]
        shim_sock: PathBuf,
        /// Directory under which each vNode's file system is mounted (one subdirectory per vNode).
        #[arg(long)]
        vnode_root: PathBuf,
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[arg(long)]
        metrics_addr: Option<String>,
    },
    /// Run a storage monitor (sComponent): vNodes' files, kept durably under --dir.
    Storage {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        #[arg(long, default_value = "127.0.0.1:7100")]
        gm: String,
        /// Directory holding the namespace database and file data.
        #[arg(long)]
        dir: PathBuf,
        /// Bytes of file data stored for all vNodes together; beyond it writes fail with ENOSPC.
        #[arg(long, value_parser = size, default_value = "16G")]
        quota: u64,
        #[arg(long)]
        ready_file: Option<PathBuf>,
        #[arg(long)]
        metrics_addr: Option<String>,
    },
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
    /// Show every component, its liveness and its memory.
    Status {
        #[arg(long)]
        gm: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Stop the cluster started by `cluster up`.
    Down,
    /// Print every component's counters in Prometheus text format.
    Metrics {
        #[arg(long)]
        gm: Option<String>,
    },
}

#[derive(Subcommand)]
enum DebugCmd {
    /// Send one P2M_FETCH to an mComponent, as a pComponent would, and print the answer.
    Fetch {
        #[arg(long)]
        mcomp: String,
        #[arg(long)]
        vnode: String,
        #[arg(long)]
        pid: u64,
        #[arg(long, value_parser = clap_num_u64)]
        vaddr: u64,
    },
}

fn clap_num_u64(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).map_err(|e| e.to_string()),
        None => s.parse().map_err(|e: std::num::ParseIntError| e.to_string()),
    }
}

fn transport() -> splitos_rpc::TransportConfig {
    splitos_rpc::TransportConfig::default().with_env()
}

fn main() {
    let cli = Cli::parse();
    node::init_logging();
    let r = match cli.cmd {
        Cmd::Run { excache, ways, policy, no_piggyback, fault_workers, mcomponents, mem_capacity, mem_workers, vregion_size, embedded, gm, vnode, stats_json, stats, compare_native, allow_native, program } => {
            control::run::run(control::run::RunArgs {
                program, gm, embedded, excache, ways, policy, no_piggyback, fault_workers, mcomponents, mem_capacity, mem_workers, vregion_size, vnode, stats_json, compare_native, allow_native, print_stats: stats,
            })
            .map(|code| std::process::exit(code))
        }
        Cmd::Cluster { cmd } => match cmd {
            ClusterCmd::Up { config } => control::up(config),
            ClusterCmd::Status { gm, json } => control::status(gm, json),
            ClusterCmd::Down => control::down(),
            ClusterCmd::Metrics { gm } => control::metrics(gm),
        },
        Cmd::Gm { listen, vregion_size, ready_file, metrics_addr } => {
            node::init_metrics();
            gm::run(gm::GmArgs { listen, transport: transport(), vregion_size, ready_file, metrics_addr })
        }
        Cmd::Mem { listen, gm, capacity, workers, bcache, readahead, ready_file, metrics_addr } => {
            node::init_metrics();
            mmon::run(mmon::MemArgs { listen, transport: transport(), gm, capacity, workers, bcache, readahead, ready_file, metrics_addr })
        }
        Cmd::Proc { listen, gm, excache, ways, policy, no_piggyback, fault_workers, shim_sock, vnode_root, ready_file, metrics_addr } => {
            node::init_metrics();
            let cfg = pmon::PcompConfig { excache_bytes: excache, ways, policy, piggyback: !no_piggyback, fault_workers, fault_spin_us: pmon::DEFAULT_FAULT_SPIN_US };
            pmon::run(pmon::ProcArgs { listen, transport: transport(), gm, shim_sock, vnode_root, cfg, ready_file, metrics_addr })
        }
        Cmd::Storage { listen, gm, dir, quota, ready_file, metrics_addr } => {
            node::init_metrics();
            smon::run(smon::StorageArgs { listen, transport: transport(), gm, dir, quota, ready_file, metrics_addr })
        }
        Cmd::BenchFloor { n, mcomp } => bench::floor(n, mcomp),
        Cmd::Debug { cmd: DebugCmd::Fetch { mcomp, vnode, pid, vaddr } } => control::debug_fetch(&mcomp, vnode, pid, vaddr),
    };
    if let Err(e) = r {
        eprintln!("splitos: {e:#}");
        std::process::exit(1);
    }
}
