//! What each component process is started with: its component's configuration and what it
//! needs to join the cluster, from its command line or, when `cluster up` or `run` starts it,
//! whole from a JSON file ([`Startup`]).
//!
//! The subcommand that runs each role ([`role_named`], [`subcommand`]) is here too: the command
//! line, the REST API's join tokens and `splitos join` name roles by it.
use std::path::{Path, PathBuf};

use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use splitos_rpc::Role;

use super::{
    GmConfig, McompConfig, NcompConfig, PcompConfig, ScompConfig, TransportConfig, VnodeConfig, HAND_STARTED_GM,
};

/// What every component process has besides its knobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Args)]
pub struct ProcessArgs {
    /// This component's credentials, issued by the cluster's authority (`cluster up` makes
    /// them for the components it starts; `splitos cluster credentials --role ROLE --out FILE`
    /// for one started by hand).
    #[arg(long)]
    pub credentials: Option<PathBuf>,
    /// A file to write the component's address to once it serves.
    #[arg(long)]
    pub ready_file: Option<PathBuf>,
    /// Where it serves its Prometheus metrics over HTTP (`GET /metrics`, docs/control-plane.md):
    /// on loopback (port 0: any free port, which `cluster status --json` names) to anyone on
    /// the host; beyond loopback only to requests with an admin token of the REST API; "off":
    /// not served.
    #[arg(long, default_value = METRICS_ADDR)]
    #[serde(default = "metrics_addr")]
    pub metrics_addr: String,
    /// How it reaches the other components. Last: its options' headings (`--help`) hold for
    /// every option after them.
    #[command(flatten)]
    pub transport: TransportConfig,
}

/// Where a component serves its metrics unless told otherwise.
pub const METRICS_ADDR: &str = "127.0.0.1:0";

fn metrics_addr() -> String {
    METRICS_ADDR.to_string()
}

impl ProcessArgs {
    /// The credentials file, which every component needs.
    pub fn credentials(&self) -> anyhow::Result<&Path> {
        self.credentials
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("a component needs the cluster's credentials: --credentials FILE (`splitos cluster credentials --role ROLE --out FILE` issues them from the cluster's authority)"))
    }
}

/// What a monitor (every component but the global managers) has besides its knobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Args)]
pub struct NodeArgs {
    /// Where the global managers listen: an address, or several (ADDR,ADDR,...) when several
    /// managers run, of which the component follows the leader (docs/deployment.md).
    #[arg(long, default_value = HAND_STARTED_GM)]
    pub gm: String,
    #[command(flatten)]
    pub process: ProcessArgs,
}

/// `splitos gm`: the global managers (GPM, GMM, GSM, GNM).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Args)]
pub struct GmArgs {
    /// Where the global managers listen.
    #[arg(long, default_value = HAND_STARTED_GM)]
    pub listen: String,
    #[command(flatten)]
    pub cluster: GmConfig,
    /// The vNodes of the cluster's configuration (`[[vnode]]`), made at every start; started by
    /// hand, the managers make them through the REST API (docs/control-plane.md).
    #[arg(skip)]
    pub vnodes: Vec<VnodeConfig>,
    /// The file where the managers keep what they are told at run time, to resume with it
    /// after a restart: the REST API's tokens (hashed) and the vNodes made through it (created
    /// if missing); none: they last as long as the process. `cluster up` keeps it in the
    /// cluster's state directory.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// The REST API's certificate (PEM) and its key: with both, the API serves HTTPS, which
    /// it must beyond loopback. `cluster up` issues them from the cluster's authority.
    #[arg(long, requires = "api_key")]
    pub api_cert: Option<PathBuf>,
    #[arg(long, requires = "api_cert")]
    pub api_key: Option<PathBuf>,
    /// The certificate (PEM) of the authority that issued the API's certificate: join tokens
    /// pin it (docs/deployment.md#joining-a-machine). `cluster up` gives its own.
    #[arg(long, requires = "api_cert")]
    pub api_ca: Option<PathBuf>,
    /// The cluster's authority (its key), with which the managers issue credentials to a
    /// machine that joins with a join token; none: no machine joins. `cluster up` gives its
    /// own.
    #[arg(long)]
    pub authority: Option<PathBuf>,
    /// The key every record of the managers' state is signed with (32 random bytes in hex,
    /// mode 0600), the same for every manager of the cluster: a record without its signature
    /// is refused. Unset: beside `--state` (`FILE.key`, made if missing); with etcd it must be
    /// given (`cluster up` makes one in its state directory).
    #[arg(long)]
    pub state_key: Option<PathBuf>,
    /// The certificate authority (PEM) etcd's certificates are checked against: the
    /// cluster's X.509 authority (`ca.pem` of the state directory; docs/deployment.md).
    #[arg(long, requires_all = ["etcd_cert", "etcd_key"])]
    pub etcd_ca: Option<PathBuf>,
    /// The managers' client certificate for etcd (PEM), issued by that authority; `cluster
    /// up` issues it.
    #[arg(long, requires_all = ["etcd_ca", "etcd_key"])]
    pub etcd_cert: Option<PathBuf>,
    /// Its private key (PEM, mode 0600).
    #[arg(long, requires_all = ["etcd_ca", "etcd_cert"])]
    pub etcd_key: Option<PathBuf>,
    #[command(flatten)]
    pub process: ProcessArgs,
}

impl GmArgs {
    /// What `splitos gm` with no option starts with: for the managers' in-process tests and
    /// their simulation.
    pub fn defaults() -> GmArgs {
        #[derive(clap::Parser)]
        struct Gm {
            #[command(flatten)]
            args: GmArgs,
        }
        <Gm as clap::Parser>::parse_from(["gm"]).args
    }
}

/// `splitos proc`: a pComponent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Args)]
pub struct ProcArgs {
    #[command(flatten)]
    pub pcomp: PcompConfig,
    /// Unix socket where programs' shims connect.
    #[arg(long)]
    pub shim_sock: PathBuf,
    /// Directory under which each vNode's file system is mounted (one subdirectory per vNode).
    #[arg(long)]
    pub vnode_root: PathBuf,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// `splitos mem`: an mComponent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Args)]
pub struct MemArgs {
    #[command(flatten)]
    pub mcomp: McompConfig,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// `splitos storage`: an sComponent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Args)]
pub struct StorageArgs {
    #[command(flatten)]
    pub scomp: ScompConfig,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// `splitos net`: an nComponent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Args)]
pub struct NetArgs {
    #[command(flatten)]
    pub ncomp: NcompConfig,
    #[command(flatten)]
    pub node: NodeArgs,
}

/// The subcommand that runs each role but the admin's.
const SUBCOMMANDS: [(&str, Role); 5] = [
    ("gm", Role::Gm),
    ("proc", Role::Proc),
    ("mem", Role::Mem),
    ("storage", Role::Storage),
    ("net", Role::Net),
];

/// The role `name` names: its own name, or the subcommand that runs it (`gm`, `proc`, ...).
pub fn role_named(name: &str) -> anyhow::Result<Role> {
    SUBCOMMANDS
        .iter()
        .find(|(c, _)| *c == name)
        .map(|(_, r)| *r)
        .or_else(|| Role::from_name(name))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "unknown role {name:?} (known: {}; or the subcommand that runs it: gm, proc, mem, storage, net)",
                Role::ALL.iter().map(|r| r.name()).collect::<Vec<_>>().join(", ")
            )
        })
}

/// The subcommand that runs `role` (the admin's tools: `cluster`).
pub fn subcommand(role: Role) -> &'static str {
    SUBCOMMANDS
        .iter()
        .find(|(_, r)| *r == role)
        .map_or("cluster", |(c, _)| c)
}

/// A component's start: its options, or its whole configuration in a JSON file that `cluster
/// up` and `run` write (`--config-file`, which takes no other option with it).
pub enum Startup<T> {
    Options(T),
    File(PathBuf),
}

const CONFIG_FILE: &str = "config_file";

impl<T: DeserializeOwned> Startup<T> {
    pub fn load(self) -> anyhow::Result<T> {
        match self {
            Startup::Options(t) => Ok(t),
            Startup::File(f) => {
                let text = std::fs::read_to_string(&f)
                    .map_err(|e| anyhow::anyhow!("cannot read the configuration {}: {e}", f.display()))?;
                serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("the configuration {}: {e}", f.display()))
            }
        }
    }
}

/// Writes a component's whole configuration for its `--config-file` (its user's alone: it
/// names its credentials).
pub fn write_start_file<T: Serialize>(path: &Path, args: &T) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f =
        crate::trusted::new_file(path, 0o600).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
    f.write_all(serde_json::to_string_pretty(args)?.as_bytes())?;
    Ok(())
}

impl<T: Args> Args for Startup<T> {
    fn augment_args(cmd: Command) -> Command {
        // Exclusive: the options the command requires are not required with it.
        let file = Arg::new(CONFIG_FILE)
            .long("config-file")
            .value_name("FILE")
            .value_parser(clap::value_parser!(PathBuf))
            .exclusive(true)
            .help("The whole configuration as JSON, as `cluster up` writes it, instead of the options");
        // First: the options' headings (the transport's) hold for every option after them.
        T::augment_args(cmd.arg(file))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl<T: FromArgMatches> FromArgMatches for Startup<T> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        match m.get_one::<PathBuf>(CONFIG_FILE) {
            Some(f) => Ok(Startup::File(f.clone())),
            None => T::from_arg_matches(m).map(Startup::Options),
        }
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}
