//! The global managers' configuration: the `[cluster]` table.
use serde::{Deserialize, Serialize};
use splitos_rpc::{knob_enum, Overcommit, Replication};

use super::{check_netns, ConfigError, Size, ANY_PORT, PAGE};

/// The global managers' knobs: the `[cluster]` table of the cluster configuration, the options
/// of `splitos gm`, and those `splitos run` gives the embedded cluster's global managers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct GmConfig {
    /// Where `cluster up` starts the global managers (port 0: a free port below the kernel's
    /// ephemeral range, which it tells every component it starts, and where a manager started
    /// again comes back); one started by hand listens at `splitos gm --listen`.
    #[arg(skip = ANY_PORT.to_string())]
    pub gm: String,
    /// vRegion size: a power of two of at least 4096.
    #[arg(long, default_value_t = Size(1 << 30))]
    pub vregion_size: Size,
    /// How long a component that stopped heartbeating is kept (shown dead) before it is
    /// forgotten (ms); one that comes back later registers again.
    #[arg(long, default_value_t = 30_000)]
    pub forget_dead_ms: u64,
    /// How long a pComponent or mComponent may be silent before it is declared lost (ms),
    /// less than forget_dead_ms: the mComponents release the memory of the processes a lost
    /// pComponent created; programs wait for a silent mComponent until it is declared lost
    /// (docs/failures.md).
    #[arg(long, default_value_t = 5_000)]
    pub reclaim_dead_ms: u64,
    /// The heartbeats a second the global managers take at most (each costs the leader some
    /// 15-25 µs over TCP: 8,000 a second is a fifth of a core). A cluster of more
    /// components than this many per 300 ms period has each component beat less often: the
    /// managers tell every component its period (`G2X_BEAT.beat_ms`), which grows with the
    /// cluster up to a quarter of reclaim_dead_ms, so that a live component is never taken for
    /// lost; a component is still declared lost after reclaim_dead_ms of silence (0: every
    /// component beats every 300 ms, whatever the cluster's size).
    #[arg(long, default_value_t = 8_000)]
    pub heartbeats_per_s: u64,
    /// How heap memory survives the loss of an mComponent: none (one copy), replica (two, on
    /// different hosts where there are), log (LegoOS: one copy, and a logger mComponent
    /// streams each write-back to a backup file on an sComponent), ec or ec:K (one copy
    /// striped over K = 2, 4 or 8 mComponents plus their XOR parity on one more; ec is ec:4).
    /// Unset: replica with three or more mComponents, else none (docs/failures.md); started by
    /// hand, the global managers cannot count the mComponents to come: none.
    #[arg(long, value_parser = Replication::from_name)]
    #[serde(with = "replication_by_name")]
    pub replication: Option<Replication>,
    /// When heap memory is charged, as Linux's vm.overcommit_memory: heuristic (when stored;
    /// only a mapping larger than all memory is refused), strict (writable mappings whole,
    /// when made; ENOMEM beyond capacity; docs/failures.md).
    #[arg(long, default_value = "heuristic", value_parser = Overcommit::from_name)]
    #[serde(with = "overcommit_by_name")]
    pub overcommit: Overcommit,
    /// How the global managers choose the pComponent of a process and the mComponent of a
    /// home or vRegion among those with room: least-loaded spreads (fewest threads, smallest
    /// share of memory taken), best-fit (the least free) and first-fit (the first registered)
    /// pack, nearest takes the mComponent fewest hops from the program's pComponent on the
    /// topology graph, then the least loaded.
    #[arg(long, default_value_t)]
    pub placement: PlacementPolicy,
    /// Background rebalancing (docs/elastic-memory.md): when the mComponent fullest for its
    /// capacity is fuller than the emptiest by more than this many percentage points, every
    /// home moves one vRegion off it each heartbeat, until the gap is under half of this
    /// (0: off; at most 100).
    #[arg(long, default_value_t = 0)]
    pub rebalance_percent: u32,
    /// Where the global managers serve the REST API (docs/control-plane.md): an address (port
    /// 0: any free port, which `cluster status --json` names under `api`), or "off". Beyond
    /// loopback it serves HTTPS with a certificate from the cluster's authority.
    #[arg(long, default_value = ANY_PORT)]
    pub api: String,
    /// Connections one client may hold on the REST API at once (1 to 256, the most it serves
    /// at once): a client on another host is its address, one on the managers' host its user
    /// (every local user shares loopback). One beyond is closed as soon as it is accepted, so a
    /// client that floods the API with slow or silent connections leaves the others room; root's
    /// own from the managers' host are never shut out by the others'.
    #[arg(long, default_value_t = crate::telemetry::MAX_CONNECTIONS_PER_PEER)]
    pub api_connections_per_peer: usize,
    /// The network namespace (`ip netns`) `cluster up` starts the global managers in
    /// (docs/deployment.md); none: the namespace of `cluster up`.
    #[arg(skip)]
    pub netns: Option<String>,
    /// The etcd cluster the global managers keep the cluster's state in and elect their
    /// leader through (client URLs, https://10.0.0.1:2379; docs/deployment.md); several
    /// managers (`[[gm]]`) need it. The managers speak to it only over TLS with a client
    /// certificate of the cluster's authority, which etcd must require
    /// (`--client-cert-auth`): whoever writes its keys is the cluster's admin. Empty: one
    /// manager, which keeps the state in a local file.
    #[arg(long, value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// For development on a machine no one else uses: let the managers speak plain http to
    /// etcd, whose keys any user who reaches its port can then read and change.
    #[arg(long)]
    pub etcd_insecure: bool,
    /// Where the cluster's keys start in etcd: two clusters that share an etcd need two
    /// prefixes.
    #[arg(long, default_value = "/splitos")]
    pub etcd_prefix: String,
    /// How long the leading manager's lease in etcd lasts without a keep-alive (s, 2 to 60):
    /// a leader that died is replaced after about this long (one stopped by SIGTERM gives its
    /// lease up at once), and one cut off from the etcd majority stops leading a little
    /// sooner. Shorter than etcd takes to elect its own new leader (a second or two), every
    /// loss of etcd's leader would also change the managers'.
    #[arg(long, default_value_t = 5)]
    pub leader_lease_s: u64,
}

knob_enum! {
    /// The placement policy of the global managers. Only the names are the configuration's:
    /// what each places with is `PlacementPolicy::rule` (placement.rs).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum PlacementPolicy, "placement", PLACEMENT_POLICIES {
        /// The least loaded component: what the global managers did before policies existed.
        #[default]
        LeastLoaded = "least-loaded",
        /// The component with the least free.
        BestFit = "best-fit",
        /// The first registered component with room.
        FirstFit = "first-fit",
        /// The component fewest hops away on the topology graph, then the least loaded.
        Nearest = "nearest",
    }
}

/// One global manager of several (a `[[gm]]` table; docs/deployment.md): with `[cluster]
/// etcd`, one leads and the others take over when it goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagerConfig {
    /// Where this manager listens, a fixed port: components and tools are told every
    /// manager's address, and find the leader among them.
    pub listen: String,
    /// Where this manager serves the REST API (every manager serves it, and only the leader
    /// answers: a follower names the leader); unset: `[cluster] api`.
    #[serde(default)]
    pub api: Option<String>,
    /// The network namespace `cluster up` starts this manager in; unset: `[cluster] netns`.
    #[serde(default)]
    pub netns: Option<String>,
}

impl Default for GmConfig {
    fn default() -> Self {
        splitos_rpc::knob::defaults()
    }
}

impl GmConfig {
    /// An error names the field it is about.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.api != "off"
            && self
                .api
                .parse::<std::net::SocketAddr>()
                .map(|a| a.ip().is_unspecified())
                .unwrap_or(true)
        {
            return Err(ConfigError::Api(self.api.clone()));
        }
        if !(1..=crate::telemetry::MAX_CONNECTIONS).contains(&self.api_connections_per_peer) {
            return Err(ConfigError::ApiConnections(self.api_connections_per_peer));
        }
        let vrs = self.vregion_size.0;
        self.replication
            .unwrap_or_default()
            .check_vregion_size(vrs)
            .map_err(ConfigError::VregionStripes)?;
        if vrs < PAGE || !vrs.is_power_of_two() {
            return Err(ConfigError::VregionSize(vrs));
        }
        check_netns(&self.netns)?;
        if self.rebalance_percent > 100 {
            return Err(ConfigError::RebalancePercent(self.rebalance_percent));
        }
        if !(2..=60).contains(&self.leader_lease_s) {
            return Err(ConfigError::LeaderLease(self.leader_lease_s));
        }
        if let Some(bad) = self
            .etcd
            .iter()
            .find(|e| !(e.starts_with("http://") || e.starts_with("https://")) || e.len() > 256)
        {
            return Err(ConfigError::EtcdUrl(bad.clone()));
        }
        if self.etcd.iter().any(|e| e.starts_with("http://")) && self.etcd.iter().any(|e| e.starts_with("https://")) {
            return Err(ConfigError::EtcdMixed);
        }
        if let Some(plain) = self
            .etcd
            .iter()
            .find(|e| e.starts_with("http://") && !self.etcd_insecure)
        {
            return Err(ConfigError::EtcdPlain(plain.clone()));
        }
        // A prefix that holds another cluster's parts (`/a/state/...` beside `/a`) would read
        // that cluster's keys as its own.
        let reserved = ["/state/", "/leader", "/managers/"]
            .iter()
            .any(|part| format!("{}/", self.etcd_prefix).contains(part));
        if !self.etcd_prefix.starts_with('/')
            || self.etcd_prefix.len() > 128
            || self.etcd_prefix.contains("//")
            || reserved
        {
            return Err(ConfigError::EtcdPrefix(self.etcd_prefix.clone()));
        }
        if self.reclaim_dead_ms >= self.forget_dead_ms {
            return Err(ConfigError::ReclaimAfterForget {
                reclaim: self.reclaim_dead_ms,
                forget: self.forget_dead_ms,
            });
        }
        Ok(())
    }
}

/// The replication scheme by the name a configuration gives it (its serde is the wire's).
mod replication_by_name {
    use serde::{de::Error, Deserialize, Deserializer, Serialize, Serializer};
    use splitos_rpc::Replication;

    pub fn serialize<S: Serializer>(r: &Option<Replication>, s: S) -> Result<S::Ok, S::Error> {
        r.map(|r| r.to_string()).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Replication>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|n| Replication::from_name(&n))
            .transpose()
            .map_err(D::Error::custom)
    }
}

/// The overcommit mode by the name a configuration gives it (its serde is the wire's).
mod overcommit_by_name {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};
    use splitos_rpc::Overcommit;

    pub fn serialize<S: Serializer>(o: &Overcommit, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(o.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Overcommit, D::Error> {
        Overcommit::from_name(&String::deserialize(d)?).map_err(D::Error::custom)
    }
}
