//! splitos: one binary for every monitor, the global managers and the user. This file is
//! only the command tree and its dispatch; everything it runs is in the `splitos` library, and
//! every component's options are its configuration struct (`splitos::config`).
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use splitos::config::{GmArgs, MemArgs, NetArgs, ProcArgs, Startup, StorageArgs};
use splitos::{bench, control, node};
use splitos_gm::api;
use splitos_tools::{loadgen, memcached, sim};

#[derive(Parser)]
#[command(
    name = "splitos",
    version,
    about = "A user-space splitkernel: run unmodified programs with their memory on disaggregated memory components"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a program with its heap on mComponents.
    ///
    /// Finds the cluster in this order: --pcomponent, --gm, $SPLITOS_GM, $SPLITOS_PCOMPONENT,
    /// the cluster started by `splitos cluster up` (its state file); for a user other than
    /// root, the host's cluster (the program sockets in its state directory, /run/splitos or
    /// $SPLITOS_STATE_DIR), on a vNode the admin granted that user; for root, else an embedded
    /// cluster (global managers, one pComponent, two mComponents and one sComponent for the
    /// vNode's files, each its own process on loopback) for the duration of the program. A cluster named or started that cannot be
    /// reached is an error, never a reason to run on another; --embedded always runs on an
    /// embedded one. The program runs as the user who runs this; its stdout, stderr and exit
    /// status are its own.
    Run(Box<control::run::RunArgs>),
    /// List the programs running on the cluster (through its REST API), as squeue or kubectl get pods do.
    Ps {
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: control::ApiArgs,
    },
    /// Show the cluster live (through its REST API), as top does: its components, and its jobs
    /// with their ExCache misses, evictions and write-backs per second.
    Top {
        /// Seconds between two looks.
        #[arg(long, short = 'd', default_value_t = 2.0)]
        interval: f64,
        /// Stop after this many looks (default: until interrupted).
        #[arg(long, short = 'n')]
        iterations: Option<u64>,
        #[command(flatten)]
        api: control::ApiArgs,
    },
    /// Join this machine to a cluster: trade a join token (`splitos cluster join-token`) for
    /// credentials of its role, over the managers' HTTPS REST API, checked against the
    /// authority the token pins; writes them, and the managers' addresses, in --out.
    Join {
        /// The join token.
        #[arg(long)]
        token: String,
        /// Where to write the credentials (ROLE.cred), the managers' addresses (ROLE.env) and
        /// the authority's certificate (ca.pem).
        #[arg(long, default_value = "/etc/splitos/default")]
        out: PathBuf,
        /// The managers' REST API (HOST:PORT, served over HTTPS).
        api: String,
        /// Where this machine's component is to listen (ADDR:PORT, an address of this machine
        /// the others reach): written to ROLE.env as SPLITOS_LISTEN, which its unit needs.
        #[arg(long)]
        listen: Option<String>,
    },
    /// Manage a long-lived cluster on this host.
    Cluster {
        #[command(subcommand)]
        cmd: ClusterCmd,
    },
    /// Attach and detach mComponents of a running cluster, through its REST API
    /// (docs/elastic-memory.md).
    Memory {
        #[command(subcommand)]
        cmd: MemoryCmd,
    },
    /// Run the global managers (GPM, GMM).
    Gm(Box<Startup<GmArgs>>),
    /// Run a memory monitor (mComponent).
    Mem(Box<Startup<MemArgs>>),
    /// Run a process monitor (pComponent).
    Proc(Box<Startup<ProcArgs>>),
    /// Run a storage monitor (sComponent): vNodes' files, kept durably under --dir.
    Storage(Box<Startup<StorageArgs>>),
    /// Run a network monitor (nComponent): owns this host's network interfaces and runs the
    /// sockets of programs on pComponents on its stack (docs/network.md).
    Net(Box<Startup<NetArgs>>),
    /// Replay a cluster trace against fixed, disaggregated and splitos datacenters with the same resources (docs/simulation.md).
    ///
    /// Reports per model the fragmentation index, the modules that could be switched off,
    /// the tasks that could not be placed and their waits, utilization, and the failure
    /// model of LegoOS section 6.3 for the units the replay needed.
    Sim(Box<sim::SimArgs>),
    /// Random faults against a cluster of its own while programs run on it, with a checker:
    /// every run prints what it prints natively or fails with an error a fault beyond the
    /// configuration's tolerance explains, never hangs, and the cluster settles and holds
    /// nothing of ended programs afterwards (docs/reliability.md). Exits 1 if not; the
    /// seed replays the same faults.
    Chaos(Box<control::chaos::ChaosArgs>),
    /// Measure the floors a miss is compared with (JSON on stdout).
    BenchFloor {
        #[arg(long, default_value_t = 20000)]
        n: usize,
        /// Also time the splitos RPC round trip to this mComponent.
        #[arg(long)]
        mcomp: Option<String>,
    },
    /// Load the global managers with thousands of simulated components (registrations,
    /// heartbeats, placement questions, mComponents falling silent) and measure their CPU,
    /// memory, state writes and decision latencies (JSON on stdout; docs/benchmarks.md).
    BenchManagers(Box<bench::managers::ManagersArgs>),
    /// Drive memcached-protocol servers with Facebook's ETC load (key and value sizes, GET:SET
    /// 30:1, Zipf keys), open or closed loop, and report throughput, hit ratio and latency
    /// percentiles; every value read back is checked (docs/benchmarks.md).
    Loadgen(Box<loadgen::LoadgenArgs>),
    /// Serve the memcached protocol (text and binary) from the Ebb runtime: per-core event
    /// loops that poll under load and sleep at rest, a table with per-core representatives,
    /// LRU eviction at --memory (docs/ebb.md).
    Memcached(Box<memcached::MemcachedArgs>),
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
        /// Cluster configuration (TOML); default: the global managers, 1 pComponent, 2
        /// mComponents and 1 sComponent on loopback.
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
    /// Start again a component of the cluster `cluster up` started that has exited (a
    /// manager, an mComponent, ...), by its name in the state directory: gm (gm0, gm1, ...
    /// with several managers), storage0, mem0, proc0, net0, as its log is named. It runs
    /// with the configuration and credentials it had, a manager at the address it had;
    /// `cluster down` stops it with the rest.
    Restart {
        /// The component's name (its log is NAME.log in the state directory).
        name: String,
    },
    /// Print every component's counters in Prometheus text format.
    Metrics {
        #[arg(long)]
        gm: Option<String>,
        /// Print instead every series a component may export, declared once in the code: its
        /// help, type and labels (no cluster needed).
        #[arg(long, conflicts_with = "gm")]
        declared: bool,
    },
    /// Print the REST API's OpenAPI document (the one the API serves at /openapi.json).
    Openapi,
    /// Replace the global managers' placement policy while the cluster runs: placements
    /// from then on follow it (what is placed stays where it is). Prints the policy then
    /// (without a name, as it is). It lasts until the managers restart, which start again
    /// with `[cluster] placement`.
    SetPlacement {
        /// least-loaded, best-fit, first-fit or nearest.
        placement: Option<String>,
        #[arg(long)]
        gm: Option<String>,
    },
    /// Print the global id map: the Ebbs whose messages components serve, and which
    /// components serve each (docs/ebb.md#the-messenger).
    Ebbs {
        #[arg(long)]
        gm: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the topology graph: hosts and their components, and the links pComponents
    /// measured to the mComponents their programs use (latency, bandwidth).
    Topology {
        /// Print the graph as the API serves it (JSON).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: control::ApiArgs,
    },
    /// Take a pComponent or mComponent out of placement, by its id (`cluster status`): no new
    /// programs start on it, no new homes or vRegions go to it; what runs there goes on.
    Cordon {
        /// The component's id (`cluster status`).
        id: u32,
        #[command(flatten)]
        api: control::ApiArgs,
    },
    /// Put a cordoned component back into placement.
    Uncordon {
        /// The component's id (`cluster status`).
        id: u32,
        #[command(flatten)]
        api: control::ApiArgs,
    },
    /// Resize a running pComponent's ExCache, by its id (`cluster status`), while programs
    /// run: growing takes effect at once; shrinking evicts down to the new size, writing dirty
    /// lines back first. Prints the ExCache as it is then (with neither SIZE nor shares, as
    /// it is now).
    SetExcache {
        /// The pComponent's id (`cluster status`).
        id: u32,
        /// The new size (e.g. 32M): at least 256K, at most the pComponent's excache_max
        /// (default four times its excache); rounded down to whole ways of every set.
        size: Option<splitos::config::Size>,
        /// A vNode's share (VNODE=SIZE, repeated): lines it keeps against other vNodes' misses
        /// while it holds no more. Replaces every share set before; they add up to no more
        /// than the size.
        #[arg(long = "share", value_name = "VNODE=SIZE")]
        shares: Vec<String>,
        /// Remove every vNode's share.
        #[arg(long, conflicts_with = "shares")]
        clear_shares: bool,
        #[command(flatten)]
        api: control::ApiArgs,
    },
    /// Replace a running pComponent's eviction or read-ahead policy, by its id (`cluster
    /// status`), while programs run: the ExCache takes the new policy before its next miss,
    /// with the lines it holds (docs/ebb.md#policies-as-ebbs). Prints the policies then (with
    /// neither option, as they are).
    SetPolicy {
        /// The pComponent's id (`cluster status`).
        id: u32,
        /// The eviction policy: workingset, fifo, clock or ghost-clock.
        #[arg(long)]
        eviction: Option<String>,
        /// The read-ahead policy: leap, sequential or nextline.
        #[arg(long)]
        prefetch: Option<String>,
        #[command(flatten)]
        api: control::ApiArgs,
    },
    /// Cordon a component and wait until nothing runs on it: no job on a pComponent; an
    /// mComponent's memory moves to the others while programs run (it stays, empty).
    Drain {
        /// The id of the pComponent or mComponent (`cluster status`).
        id: u32,
        /// Give up after this many seconds (the component stays cordoned).
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        #[command(flatten)]
        api: control::ApiArgs,
    },
    /// Create, list and revoke the REST API's bearer tokens (docs/control-plane.md).
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
    /// Make a single-use join token for a role, through the REST API: `splitos join` on another
    /// machine trades it for credentials (docs/deployment.md#joining-a-machine).
    JoinToken {
        /// The role of the component the machine runs: pcomponent, mcomponent, scomponent,
        /// ncomponent or global-managers (or the subcommand: proc, mem, storage, net, gm).
        #[arg(long)]
        role: String,
        /// How long the token lasts (s), at most a week.
        #[arg(long, default_value_t = 3600)]
        ttl_s: u64,
        #[command(flatten)]
        api: control::ApiArgs,
    },
    /// Issue an etcd member's certificate from the cluster's X.509 authority (in the state
    /// directory): the etcd the managers keep their state in serves them over TLS and requires
    /// the client certificate `cluster up` gives them (docs/deployment.md#managers-in-etcd).
    EtcdCert {
        /// The member's addresses, those of its client and peer URLs (comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        ip: Vec<std::net::IpAddr>,
        /// The directory to write etcd.pem, etcd.key (mode 0600) and ca.pem to.
        #[arg(long)]
        out: PathBuf,
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

#[derive(Subcommand)]
enum MemoryCmd {
    /// The cluster's mComponents: state (attached, cordoned, detaching, draining, drained),
    /// capacity, use, and how far a detach has come.
    List {
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: control::ApiArgs,
    },
    /// Give an mComponent (by id, `memory list`) to the cluster: new homes and vRegions go to
    /// it at once. One started with `splitos mem --standby` waits for this; a detach under
    /// way is called off.
    Attach {
        /// The mComponent's id (`memory list`).
        id: u32,
        #[command(flatten)]
        api: control::ApiArgs,
    },
    /// Detach an mComponent while programs run: every vRegion, home and cached file it holds
    /// moves to the other mComponents, then it exits. Refused for the last mComponent and
    /// when the others lack room.
    Detach {
        /// The mComponent's id (`memory list`).
        id: u32,
        /// Return once the detach has started, without waiting for it to end.
        #[arg(long)]
        no_wait: bool,
        /// Stop waiting after this many seconds (the detach goes on).
        #[arg(long, default_value_t = 600)]
        timeout: u64,
        #[command(flatten)]
        api: control::ApiArgs,
    },
}

#[derive(Subcommand)]
enum TokenCmd {
    /// Create a token; prints it once, as the last line (only its hash is kept).
    Create {
        /// Its name, to list and revoke it by (letters, digits, '-', '_', '.').
        name: String,
        /// An admin's token: every vNode, job and component.
        #[arg(long, conflicts_with = "vnode", required_unless_present = "vnode")]
        admin: bool,
        /// A tenant's token: sees and changes only these vNodes and their jobs (repeatable).
        #[arg(long)]
        vnode: Vec<String>,
        #[arg(long)]
        gm: Option<String>,
    },
    /// List the tokens (never their secrets).
    List {
        #[arg(long)]
        json: bool,
        #[arg(long)]
        gm: Option<String>,
    },
    /// Revoke a token: requests with it are refused from now on.
    Revoke {
        /// The token's name (`cluster token list`).
        name: String,
        #[arg(long)]
        gm: Option<String>,
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

fn clap_num_u64(s: &str) -> Result<u64, std::num::ParseIntError> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
}

/// What signals `run`'s caller ignored or blocked must reach its program, and the Rust runtime
/// sets SIGPIPE to ignored before `main`: they are read before it.
#[used]
#[link_section = ".init_array"]
static RECORD_INHERITED_SIGNALS: extern "C" fn() = control::job::record_inherited;

fn main() {
    let cli = Cli::parse();
    node::init_logging();
    splitos_metrics::set_catalogue(splitos::catalogue::all());
    let r = match cli.cmd {
        Cmd::Run(args) => control::run::run(*args).map(|code| std::process::exit(code)),
        Cmd::Join {
            token,
            out,
            api,
            listen,
        } => api::join::join_cli(&token, &api, &out, listen.as_deref()),
        Cmd::Cluster { cmd } => match cmd {
            ClusterCmd::Up { config } => control::up(config),
            ClusterCmd::Status { gm, json } => control::status(gm, json),
            ClusterCmd::Down { force } => control::down(force),
            ClusterCmd::Restart { name } => control::procs::restart(&name),
            ClusterCmd::Metrics { declared: true, .. } => {
                splitos::out!("{}", splitos::catalogue::render());
                Ok(())
            }
            ClusterCmd::Metrics { gm, .. } => control::metrics(gm),
            ClusterCmd::Credentials { role, out } => control::credentials(&role, &out),
            ClusterCmd::EtcdCert { ip, out } => control::etcd_cert(&ip, &out),
            ClusterCmd::JoinToken { role, ttl_s, api } => control::join_token(api, &role, ttl_s),
            ClusterCmd::Cordon { id, api } => control::cordon(api, id, true),
            ClusterCmd::Uncordon { id, api } => control::cordon(api, id, false),
            ClusterCmd::Drain { id, timeout, api } => control::drain(api, id, std::time::Duration::from_secs(timeout)),
            ClusterCmd::Topology { json, api } => control::topology(api, json),
            ClusterCmd::Ebbs { gm, json } => control::ebbs(gm, json),
            ClusterCmd::SetPlacement { placement, gm } => control::set_placement(gm, placement),
            ClusterCmd::SetPolicy {
                id,
                eviction,
                prefetch,
                api,
            } => control::memory::set_policy(api, id, eviction, prefetch),
            ClusterCmd::SetExcache {
                id,
                size,
                shares,
                clear_shares,
                api,
            } => {
                let shares = match (clear_shares, shares.is_empty()) {
                    (true, _) => Some(Vec::new()),
                    (false, true) => None,
                    (false, false) => Some(shares),
                };
                control::memory::set_excache(api, id, size, shares)
            }
            ClusterCmd::Openapi => {
                splitos::out!("{}", api::openapi_json());
                Ok(())
            }
            ClusterCmd::Token {
                cmd: TokenCmd::Create { name, admin, vnode, gm },
            } => control::token_create(gm, name, admin, vnode),
            ClusterCmd::Token {
                cmd: TokenCmd::List { json, gm },
            } => control::token_list(gm, json),
            ClusterCmd::Token {
                cmd: TokenCmd::Revoke { name, gm },
            } => control::token_revoke(gm, name),
        },
        Cmd::Memory { cmd } => match cmd {
            MemoryCmd::List { json, api } => control::memory::list(api, json),
            MemoryCmd::Attach { id, api } => control::memory::attach(api, id),
            MemoryCmd::Detach {
                id,
                no_wait,
                timeout,
                api,
            } => control::memory::detach(api, id, false, !no_wait, std::time::Duration::from_secs(timeout)),
        },
        Cmd::Ps { json, api } => control::ps(api, json),
        Cmd::Top {
            interval,
            iterations,
            api,
        } => match interval.is_finite() && interval >= 0.1 {
            true => control::top::top(api, std::time::Duration::from_secs_f64(interval), iterations),
            false => Err(anyhow::anyhow!(
                "--interval must be at least 0.1 seconds, not {interval}"
            )),
        },
        Cmd::Gm(start) => component(*start, |a| splitos_gm::run(a, api::start)),
        Cmd::Mem(start) => component(*start, splitos_mmon::run),
        Cmd::Proc(start) => component(*start, splitos_pmon::run),
        Cmd::Storage(start) => component(*start, splitos_smon::run),
        Cmd::Net(start) => component(*start, splitos_nmon::run),
        Cmd::Sim(args) => sim::run(*args),
        Cmd::Chaos(args) => control::chaos::chaos(*args).map(|code| std::process::exit(code)),
        Cmd::BenchFloor { n, mcomp } => bench::floor(n, mcomp, &control::cluster::admin_credentials()),
        Cmd::BenchManagers(a) => bench::managers::managers(*a, &control::cluster::admin_credentials()),
        Cmd::Loadgen(args) => loadgen::run(*args),
        Cmd::Memcached(args) => memcached::run(*args),
        Cmd::Debug {
            cmd: DebugCmd::Fetch { at, vaddr },
        } => control::debug_fetch(&at.mcomp, at.vnode, at.pid, vaddr),
        Cmd::Debug {
            cmd: DebugCmd::Flip { at, vaddr, bit },
        } => control::debug_flip(&at.mcomp, at.vnode, at.pid, vaddr, bit),
    };
    if let Err(e) = r {
        splitos::errln!("splitos: {e:#}");
        // A program that could not be started ends `run` as it ends a shell.
        let code = e
            .downcast_ref::<control::run::StartError>()
            .map_or(1, |e| e.exit_code());
        std::process::exit(code);
    }
}

/// Runs a component process with its configuration, from its options or its file.
fn component<T: serde::de::DeserializeOwned>(
    start: Startup<T>,
    run: fn(T) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    run(start.load()?)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    fn parse(args: &[&str]) -> Result<Cmd, clap::Error> {
        Cli::try_parse_from(std::iter::once("splitos").chain(args.iter().copied())).map(|c| c.cmd)
    }

    /// A component started by `cluster up` gets its configuration from a file alone; one
    /// started by hand still needs what has no default.
    #[test]
    fn a_component_takes_its_options_or_its_file_but_not_both() {
        assert!(matches!(parse(&["proc", "--config-file", "f"]), Ok(Cmd::Proc(s)) if matches!(*s, Startup::File(_))));
        assert!(parse(&["proc", "--config-file", "f", "--excache", "1G"]).is_err());
        assert!(
            parse(&["proc", "--excache", "1G"]).is_err(),
            "--shim-sock and --vnode-root are needed"
        );
        let Ok(Cmd::Proc(s)) = parse(&[
            "proc",
            "--shim-sock",
            "s",
            "--vnode-root",
            "r",
            "--excache",
            "1G",
            "--no-piggyback",
        ]) else {
            panic!()
        };
        let Startup::Options(p) = *s else { panic!() };
        assert_eq!(
            (p.pcomp.excache.0, p.pcomp.piggyback, p.node.gm.as_str()),
            (1 << 30, false, splitos::config::HAND_STARTED_GM)
        );
        assert!(matches!(parse(&["storage"]), Err(e) if e.to_string().contains("--dir")));
        let Ok(Cmd::Gm(s)) = parse(&["gm"]) else { panic!() };
        let Startup::Options(g) = *s else { panic!() };
        assert_eq!(
            (g.listen.as_str(), g.cluster.replication),
            (splitos::config::HAND_STARTED_GM, None)
        );
    }
}
