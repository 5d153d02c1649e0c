//! The configuration of a cluster and of each of its components, declared once.
//!
//! Each component's knobs are one struct: [`PcompConfig`], [`McompConfig`], [`ScompConfig`],
//! [`NcompConfig`], [`GmConfig`] (the `[cluster]` table), and the transport's
//! [`TransportConfig`]. A field is a knob: its doc comment is its help (`--help`,
//! docs/configuration.md), its `#[arg(default_value_t = ...)]` its one default, serde gives its
//! name in the cluster file (TOML) and in JSON, clap its option, and the struct's `validate()`
//! checks it. Adding a knob is adding a field, and using it in the component.
//!
//! How a knob reaches a component:
//! * a cluster file ([`ClusterConfig`]) holds one struct per `[[pcomponent]]`,
//!   `[[mcomponent]]`, ... table; `cluster up` gives each component process its whole
//!   configuration ([`ProcArgs`], [`MemArgs`], ...) as a JSON file (`splitos proc
//!   --config-file F`, see [`Startup`]), never re-written as options;
//! * a monitor started by hand (`splitos proc --excache 1G ...`) gets the same struct from its
//!   options, each struct flattened into its command;
//! * `splitos run` flattens them too ([`Embedded`]): the options given override the embedded
//!   cluster's configuration, and are refused or noted on a running cluster by the struct
//!   they belong to ([`OnRun`]).
//!
//! Every default is written once, on its field, and the struct's `Default` is the command line
//! without options ([`splitos_rpc::knob::defaults`]): a field missing from a file and an option
//! not given cannot disagree. This module imports no monitor: the monitors import their
//! configuration from here.
mod embedded;
mod error;
mod gm;
mod mcomp;
mod ncomp;
mod pcomp;
mod process;
mod scomp;
mod size;
mod vnode;

use std::path::Path;

pub use crate::sys::IdError;
pub use error::ConfigError;

use serde::{Deserialize, Serialize};
pub use splitos_rpc::TransportConfig;

pub use embedded::{Embedded, OnRun, Override, Running};
pub use gm::{GmConfig, ManagerConfig, PlacementPolicy, PLACEMENT_POLICIES};
pub use mcomp::McompConfig;
pub use ncomp::{Loopback, NcompConfig};
pub use pcomp::{
    check_excache, AccessSampling, DirtyTracking, EvictPolicy, EvictReserve, ExcacheSize, FaultCpu, HugePages,
    IdlePoll, InterleaveRatio, NetPath, OneSided, PcompConfig, PrefetchPolicy, EVICT_POLICIES, MIN_UNPINNED,
    PREFETCH_POLICIES,
};
pub use process::{
    role_named, subcommand, write_start_file, GmArgs, MemArgs, NetArgs, NodeArgs, ProcArgs, ProcessArgs, Startup,
    StorageArgs, METRICS_ADDR,
};
pub use scomp::ScompConfig;
pub use size::{parse_size, Size, SizeError};
pub use vnode::{check_vnode_name, BadVnodeName, VnodeConfig};

const PAGE: u64 = splitos_rpc::PAGE_SIZE as u64;

/// Any free port on loopback: where a component of a cluster on one host listens unless told.
const ANY_PORT: &str = "127.0.0.1:0";

/// Where the global managers listen when started by hand (`splitos gm`), and where monitors
/// started by hand look for them. `cluster up` instead starts them on any free port
/// (`[cluster] gm`) and tells every component it starts, so that clusters on one host do not
/// collide.
pub const HAND_STARTED_GM: &str = "127.0.0.1:7100";

/// `netns`, which every component's table has.
fn check_netns(netns: &Option<String>) -> Result<(), ConfigError> {
    match netns
        .as_deref()
        .filter(|ns| ns.is_empty() || ns.contains('/') || ns.starts_with('.'))
    {
        Some(ns) => Err(ConfigError::Netns(ns.to_string())),
        None => Ok(()),
    }
}

/// A cluster configuration file (TOML). Every field is documented in docs/configuration.md;
/// a bad file is refused with a message naming the field.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default)]
    pub cluster: GmConfig,
    /// The global managers, one table each; several need `[cluster] etcd`. None: one, at
    /// `[cluster] gm`.
    #[serde(default)]
    pub gm: Vec<ManagerConfig>,
    #[serde(default)]
    pub pcomponent: Vec<PcompConfig>,
    #[serde(default)]
    pub mcomponent: Vec<McompConfig>,
    /// Storage components; without one, runs get no vNode file system.
    #[serde(default)]
    pub scomponent: Vec<ScompConfig>,
    /// Network components; without one, programs' sockets use their pComponent host's stack.
    #[serde(default)]
    pub ncomponent: Vec<NcompConfig>,
    /// Which transport every component uses, and that transport's knobs (`[transport.tcp]`).
    #[serde(default)]
    pub transport: TransportConfig,
    /// vNodes granted to users of the pComponents' hosts; a vNode not listed is root's alone.
    #[serde(default)]
    pub vnode: Vec<VnodeConfig>,
}

impl ClusterConfig {
    /// The embedded cluster: global managers, one pComponent, two mComponents, one sComponent.
    pub fn embedded() -> ClusterConfig {
        ClusterConfig {
            cluster: GmConfig::default(),
            gm: Vec::new(),
            pcomponent: vec![PcompConfig::default()],
            mcomponent: vec![McompConfig::default(); 2],
            scomponent: vec![ScompConfig::default()],
            ncomponent: Vec::new(),
            transport: TransportConfig::default(),
            vnode: Vec::new(),
        }
    }

    pub fn load(path: &Path) -> Result<ClusterConfig, ConfigError> {
        let path_buf = || path.to_path_buf();
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path_buf(),
            error,
        })?;
        let c: ClusterConfig = toml::from_str(&text).map_err(|error| ConfigError::Parse {
            path: path_buf(),
            error,
        })?;
        c.validate().map_err(|e| ConfigError::Invalid {
            path: path_buf(),
            error: Box::new(e),
        })?;
        Ok(c)
    }

    /// The cluster's replication scheme: the one configured, or by default `replica` when
    /// there are mComponents enough for a copy on another one to spare.
    pub fn replication(&self) -> splitos_rpc::Replication {
        match self.cluster.replication {
            Some(r) => r,
            None if self.mcomponent.len() >= 3 => splitos_rpc::Replication::Replica,
            None => splitos_rpc::Replication::None,
        }
    }

    /// What the global managers are started with: `[cluster]`, its replication scheme decided.
    pub fn gm(&self) -> GmConfig {
        GmConfig {
            replication: Some(self.replication()),
            ..self.cluster.clone()
        }
    }

    /// The global managers: the `[[gm]]` tables, or one at `[cluster] gm`.
    pub fn managers(&self) -> Vec<ManagerConfig> {
        match self.gm.is_empty() {
            true => vec![ManagerConfig {
                listen: self.cluster.gm.clone(),
                api: None,
                netns: self.cluster.netns.clone(),
            }],
            false => self.gm.clone(),
        }
    }

    /// Each component's own checks, and those across components; an error names the field
    /// (`pcomponent[0].excache: ...`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.transport.validate().map_err(ConfigError::Transport)?;
        self.gm().validate().map_err(|e| e.in_table("cluster"))?;
        if self.gm.len() > 1 && self.cluster.etcd.is_empty() {
            return Err(ConfigError::ManagersNeedEtcd(self.gm.len()));
        }
        if !self.gm.is_empty() && self.cluster.gm != ANY_PORT {
            return Err(ConfigError::GmBesideTables);
        }
        let mut seen = std::collections::HashSet::new();
        for (i, m) in self.gm.iter().enumerate() {
            let listen = || m.listen.clone();
            let at = m
                .listen
                .parse::<std::net::SocketAddr>()
                .map_err(|_| ConfigError::ListenNotAddress { i, listen: listen() })?;
            if at.port() == 0 || at.ip().is_unspecified() {
                return Err(ConfigError::ListenNotFixed { i, listen: listen() });
            }
            if !seen.insert(at) {
                return Err(ConfigError::ListenTaken { i, listen: listen() });
            }
            if let Some(api) = &m.api {
                GmConfig {
                    api: api.clone(),
                    ..self.cluster.clone()
                }
                .validate()
                .map_err(|e| e.in_table(format!("gm[{i}]")))?;
            }
            check_netns(&m.netns).map_err(|e| e.in_table(format!("gm[{i}]")))?;
        }
        if self.gm.is_empty()
            && !self.cluster.etcd.is_empty()
            && self
                .cluster
                .gm
                .parse::<std::net::SocketAddr>()
                .is_ok_and(|a| a.port() == 0)
        {
            return Err(ConfigError::EtcdNeedsFixedPort);
        }
        if self.replication() == splitos_rpc::Replication::Log && self.scomponent.is_empty() {
            return Err(ConfigError::LogWithoutSComponent);
        }
        if self.pcomponent.is_empty() {
            return Err(ConfigError::NoPComponent);
        }
        if self.mcomponent.is_empty() {
            return Err(ConfigError::NoMComponent);
        }
        each("pcomponent", &self.pcomponent, PcompConfig::validate)?;
        each("mcomponent", &self.mcomponent, McompConfig::validate)?;
        each("scomponent", &self.scomponent, ScompConfig::validate)?;
        each("ncomponent", &self.ncomponent, NcompConfig::validate)?;
        each("vnode", &self.vnode, VnodeConfig::validate)?;
        let mut dirs = std::collections::HashSet::new();
        for (i, s) in self.scomponent.iter().enumerate() {
            if !dirs.insert(s.dir.clone()) {
                return Err(ConfigError::SharedDir(i));
            }
        }
        Ok(())
    }
}

/// `check` of every table of an array of tables, its error naming the table (`pcomponent[1].`).
fn each<T>(table: &str, tables: &[T], check: impl Fn(&T) -> Result<(), ConfigError>) -> Result<(), ConfigError> {
    tables
        .iter()
        .enumerate()
        .try_for_each(|(i, t)| check(t).map_err(|e| e.in_table(format!("{table}[{i}]"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_fields_are_named() {
        let e = toml::from_str::<ClusterConfig>("[[pcomponent]]\nexcahce = \"1M\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("excahce"), "{e}");
        let e = toml::from_str::<ClusterConfig>("[[pcomponent]]\neviction = \"lfu\"\n[[mcomponent]]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("eviction") && e.contains("fifo, clock"), "{e}");
        let e = toml::from_str::<ClusterConfig>("[[pcomponent]]\ndirty_tracking = \"dirty\"\n[[mcomponent]]\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("dirty_tracking") && e.contains("scan"), "{e}");
        let e = toml::from_str::<ClusterConfig>("[[mcomponent]]\ncapacity = \"9X\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("capacity") || e.contains("9X"), "{e}");
        let e = toml::from_str::<ClusterConfig>("[cluster]\nreplication = \"ec:3\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("replication") && e.contains("2, 4 or 8"), "{e}");
        let check = |text: &str| {
            toml::from_str::<ClusterConfig>(text)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string()
        };
        assert!(
            check("[[pcomponent]]\nfault_workers = 0\n[[mcomponent]]\n").starts_with("pcomponent[0].fault_workers:")
        );
        assert!(
            check("[[pcomponent]]\n[[mcomponent]]\n[[mcomponent]]\nnetns = \"a/b\"\n")
                .starts_with("mcomponent[1].netns:")
        );
        assert!(
            check("[cluster]\nvregion_size = 3000\n[[pcomponent]]\n[[mcomponent]]\n")
                .starts_with("cluster.vregion_size:")
        );
        assert!(
            check("[cluster]\nreplication = \"log\"\n[[pcomponent]]\n[[mcomponent]]\n")
                .starts_with("cluster.replication:")
        );
    }

    #[test]
    fn sizes_read_as_people_write_them_and_unworkable_excaches_are_refused() {
        let check = |pcomp: &str| {
            toml::from_str::<ClusterConfig>(&format!("[[pcomponent]]\n{pcomp}\n[[mcomponent]]\n"))
                .unwrap()
                .validate()
                .map_err(|e| e.to_string())
        };
        let tiny = check("excache = \"4K\"").unwrap_err();
        assert!(
            tiny.contains("pcomponent[0].excache") && tiny.contains("256K"),
            "{tiny}"
        );
        assert!(check("excache = \"1T\"")
            .unwrap_err()
            .contains("more than this host's memory"));
        assert!(check("excache = \"256K\"").is_ok());
        assert!(check("excache = \"64MB\"").is_ok());
    }

    /// What `cluster up` writes for a component reads back the same: the configuration travels
    /// whole.
    #[test]
    fn several_managers_need_etcd_fixed_ports_and_reachable_addresses() {
        let check = |text: &str| {
            toml::from_str::<ClusterConfig>(&format!("{text}\n[[pcomponent]]\n[[mcomponent]]\n"))
                .unwrap()
                .validate()
                .map_err(|e| e.to_string())
        };
        let etcd = "[cluster]\netcd = [\"https://10.0.0.1:2379\"]\n";
        let two = "[[gm]]\nlisten = \"10.0.0.1:7100\"\n[[gm]]\nlisten = \"10.0.0.2:7100\"\n";
        assert!(check(two).unwrap_err().contains("need [cluster] etcd"));
        assert!(check(&format!("{etcd}{two}")).is_ok());
        assert_eq!(
            toml::from_str::<ClusterConfig>(&format!("{etcd}{two}"))
                .unwrap()
                .managers()
                .len(),
            2
        );
        for (listen, why) in [
            ("10.0.0.1:0", "fixed port"),
            ("0.0.0.0:7100", "not 0.0.0.0"),
            ("gm-host", "not an address"),
        ] {
            let e = check(&format!("{etcd}[[gm]]\nlisten = \"{listen}\"\n")).unwrap_err();
            assert!(e.starts_with("gm[0].listen") && e.contains(why), "{listen}: {e}");
        }
        assert!(check(&format!(
            "{etcd}[[gm]]\nlisten = \"10.0.0.1:7100\"\n[[gm]]\nlisten = \"10.0.0.1:7100\"\n"
        ))
        .unwrap_err()
        .contains("another manager's"));
        assert!(check("[cluster]\netcd = [\"10.0.0.1:2379\"]\ngm = \"10.0.0.1:7100\"\n")
            .unwrap_err()
            .contains("not an etcd client URL"));
        assert!(
            check("[cluster]\netcd = [\"https://10.0.0.1:2379\"]\n")
                .unwrap_err()
                .contains("fixed port"),
            "one manager with etcd re-executes at its address"
        );
        // Plain http lets whoever reaches etcd write the cluster's authority: only when asked
        // for by name, and never mixed with https.
        let plain = check(&format!("[cluster]\netcd = [\"http://10.0.0.1:2379\"]\n{two}")).unwrap_err();
        assert!(
            plain.starts_with("cluster.etcd:") && plain.contains("plain http") && plain.contains("etcd_insecure"),
            "{plain}"
        );
        assert!(check(&format!(
            "[cluster]\netcd = [\"http://10.0.0.1:2379\"]\netcd_insecure = true\n{two}"
        ))
        .is_ok());
        let mixed = check(&format!(
            "[cluster]\netcd = [\"https://10.0.0.1:2379\", \"http://10.0.0.2:2379\"]\netcd_insecure = true\n{two}"
        ))
        .unwrap_err();
        assert!(mixed.contains("mixes"), "{mixed}");
        assert!(check("[cluster]\nleader_lease_s = 1\n")
            .unwrap_err()
            .contains("leader_lease_s"));
        assert!(check("[cluster]\netcd_prefix = \"splitos\"\n")
            .unwrap_err()
            .contains("etcd_prefix"));
        // One manager alone, at cluster.gm, as before.
        assert_eq!(ClusterConfig::embedded().managers()[0].listen, ANY_PORT);
    }

    #[test]
    fn the_configuration_travels_through_json_unchanged() {
        let text = "[cluster]\nreplication = \"ec:2\"\novercommit = \"strict\"\n[[pcomponent]]\nexcache = \"1G\"\neviction = \"clock\"\npiggyback = false\nnetns = \"p\"\n[[mcomponent]]\n[[scomponent]]\ndir = \"/d\"\n[[ncomponent]]\nnics = [\"10.0.0.1\"]\n[transport]\nkind = \"tcp\"\n[transport.tcp]\ndelay_us = 5\n[[vnode]]\nname = \"lab\"\nmemory = \"1G\"\n";
        let c: ClusterConfig = toml::from_str(text).unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<ClusterConfig>(&json).unwrap(), c, "{json}");
        assert_eq!(
            toml::from_str::<ClusterConfig>(&toml::to_string(&c).unwrap()).unwrap(),
            c
        );
        assert_eq!(c.pcomponent[0].excache, Size(1 << 30));
        assert!(!c.pcomponent[0].piggyback);
    }

    /// A table that names a component with no fields gives it what its command line without
    /// options gives, and what `ClusterConfig::embedded` starts.
    #[test]
    fn a_file_and_the_command_line_agree_on_every_default() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli<T: clap::Args> {
            #[command(flatten)]
            knobs: T,
        }
        fn no_options<T: clap::Args>() -> T {
            Cli::<T>::parse_from(["splitos"]).knobs
        }
        let c: ClusterConfig = toml::from_str("[[pcomponent]]\n[[mcomponent]]\n[[ncomponent]]\n").unwrap();
        assert_eq!(c.pcomponent[0], no_options::<PcompConfig>());
        assert_eq!(c.mcomponent[0], no_options::<McompConfig>());
        assert_eq!(c.ncomponent[0], no_options::<NcompConfig>());
        assert_eq!(c.cluster, no_options::<GmConfig>());
        assert_eq!(c.transport, no_options::<TransportConfig>());
        assert_eq!(
            ScompConfig {
                dir: None,
                ..Cli::<ScompConfig>::parse_from(["splitos", "--dir", "d"]).knobs
            },
            toml::from_str::<ScompConfig>("").unwrap()
        );
        assert!(ClusterConfig::embedded().validate().is_ok());
        assert_eq!(
            (c.cluster.gm.as_str(), c.pcomponent[0].listen.as_str()),
            (ANY_PORT, ANY_PORT)
        );
        assert_eq!(c.pcomponent[0].excache, Size(64 << 20));
    }

    /// docs/configuration.md shows every field of every table.
    #[test]
    fn the_configuration_page_shows_every_field() {
        let page = include_str!("../../../../docs/configuration.md");
        let mut c = ClusterConfig::embedded();
        c.ncomponent.push(NcompConfig::default());
        c.vnode.push(VnodeConfig {
            name: "lab".into(),
            users: Vec::new(),
            groups: Vec::new(),
            memory: Some(Size(1 << 30)),
        });
        c.gm.push(ManagerConfig {
            listen: "10.0.0.1:7100".into(),
            api: None,
            netns: None,
        });
        let serde_json::Value::Object(tables) = serde_json::to_value(&c).unwrap() else {
            unreachable!()
        };
        for (table, v) in tables {
            let fields = match v {
                serde_json::Value::Array(mut a) => a.remove(0),
                v => v,
            };
            for (field, value) in fields.as_object().unwrap() {
                let keys: Vec<String> = match value.as_object() {
                    Some(sub) => sub.keys().map(|k| format!("{k} = ")).collect(),
                    None => vec![format!("{field} = ")],
                };
                for k in keys {
                    assert!(
                        page.lines().any(|l| l.trim_start_matches(['#', ' ']).starts_with(&k)),
                        "docs/configuration.md does not show {table}.{field} ({k:?})"
                    );
                }
            }
        }
    }
}
