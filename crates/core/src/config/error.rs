//! Why a cluster configuration is refused: one case per check, so that a caller (the control
//! plane, a test) can tell which, while the text names the field as a user writes it
//! (`pcomponent[0].excache: ...`). A table's checks return its cases bare; the cluster's
//! check names the table around them ([`ConfigError::In`]).
use std::path::PathBuf;

use super::pcomp::MAX_LINKS;
use super::{ExcacheSize, IdError, Size, MIN_UNPINNED};
use crate::config::BadVnodeName;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {}: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },
    #[error("config {}: {error}", path.display())]
    Parse { path: PathBuf, error: toml::de::Error },
    #[error("config {}: {error}", path.display())]
    Invalid { path: PathBuf, error: Box<ConfigError> },
    /// A refusal inside a table: `cluster`, `gm[1]`, `pcomponent[0]`.
    #[error("{table}.{error}")]
    In { table: String, error: Box<ConfigError> },
    /// The transport's and the event loops' own checks, whose text names their fields.
    #[error(transparent)]
    Transport(#[from] splitos_rpc::transport::TransportError),
    #[error("option {0} is no field of its configuration")]
    NoSuchOption(String),
    #[error(transparent)]
    Options(#[from] serde_json::Error),

    // The whole cluster.
    #[error("netns: {0:?} is not a network namespace name (as `ip netns` names them)")]
    Netns(String),
    #[error("gm: {0} managers need [cluster] etcd, where they elect their leader and keep the state")]
    ManagersNeedEtcd(usize),
    #[error("cluster.gm: the managers are the [[gm]] tables; leave cluster.gm out")]
    GmBesideTables,
    #[error("gm[{i}].listen: {listen:?} is not an address")]
    ListenNotAddress { i: usize, listen: String },
    #[error("gm[{i}].listen: {listen:?} needs a fixed port and an address others reach (not 0.0.0.0)")]
    ListenNotFixed { i: usize, listen: String },
    #[error("gm[{i}].listen: {listen} is another manager's too")]
    ListenTaken { i: usize, listen: String },
    #[error("cluster.gm: with etcd, the global managers need a fixed port (a manager that stops leading starts again at its address)")]
    EtcdNeedsFixedPort,
    #[error("cluster.replication: \"log\" keeps each vRegion's backup file on an sComponent, and the cluster has no [[scomponent]]")]
    LogWithoutSComponent,
    #[error("pcomponent: at least one [[pcomponent]] is needed")]
    NoPComponent,
    #[error("mcomponent: at least one [[mcomponent]] is needed")]
    NoMComponent,
    #[error("scomponent[{0}].dir: two sComponents cannot share a storage directory")]
    SharedDir(usize),

    // `[cluster]`, the global managers'.
    #[error("api: {0:?} is not an address (loopback, or one of the managers' host, served with TLS) or \"off\"")]
    Api(String),
    #[error("api_connections_per_peer: {0} is not between 1 and {max}, the connections the API serves at once", max = crate::telemetry::MAX_CONNECTIONS)]
    ApiConnections(usize),
    #[error("vregion_size: {0}")]
    VregionStripes(splitos_rpc::PolicyError),
    #[error("vregion_size: {0} must be a power of two of at least 4096")]
    VregionSize(u64),
    #[error("rebalance_percent: {0} is more than 100 percentage points (0 turns rebalancing off)")]
    RebalancePercent(u32),
    #[error("leader_lease_s: {0} is not between 2 and 60 seconds")]
    LeaderLease(u64),
    #[error("etcd: {0:?} is not an etcd client URL (https://HOST:PORT)")]
    EtcdUrl(String),
    #[error("etcd: mixes https and http endpoints (one etcd cluster speaks one of them)")]
    EtcdMixed,
    #[error("etcd: {0:?} is plain http, which lets every user who reaches it read and change the cluster's state: use https with client certificates (docs/deployment.md), or etcd_insecure = true on a machine no one else uses")]
    EtcdPlain(String),
    #[error("etcd_prefix: {0:?} is not a key prefix (\"/splitos\", \"/clusters/a\"; not holding /state/, /leader or /managers/)")]
    EtcdPrefix(String),
    #[error("reclaim_dead_ms: {reclaim} must be less than forget_dead_ms ({forget}): a forgotten pComponent is never reclaimed")]
    ReclaimAfterForget { reclaim: u64, forget: u64 },

    // `[[mcomponent]]` and `[[scomponent]]`.
    #[error("capacity: {0} bytes is less than one page")]
    Capacity(u64),
    #[error("bcache: {0} bytes is less than one 4 KiB block")]
    Bcache(u64),
    #[error("quota: must be more than 0")]
    NoQuota,

    // `[[vnode]]`.
    #[error("name: {0}")]
    VnodeName(BadVnodeName),
    #[error("users: {0}")]
    User(IdError),
    #[error("groups: {0}")]
    Group(IdError),
    #[error("memory: a memory quota of {0} bytes is less than one 4 KiB page")]
    MemoryQuota(u64),

    // `[[pcomponent]]`.
    #[error("excache: {0}")]
    Excache(ExcacheSize),
    #[error("excache_max: {0}")]
    ExcacheMax(ExcacheSize),
    #[error("excache_max: {max} is less than excache ({excache}): the ExCache starts no larger than it may grow")]
    ExcacheMaxBelow { max: Size, excache: Size },
    #[error("{0:?}: interleave is off or N:M (N of every M pages local, 1 <= N < M <= 1024), as in 1:2")]
    NotARatio(String),
    #[error("{0:?}: evict_reserve is auto or a number of spare ways per set (0: off)")]
    NotAReserve(String),
    #[error("{n}:{m}: interleave is off or N:M with 1 <= N < M <= 1024")]
    Ratio { n: u32, m: u32 },
    #[error("interleave_unit: {0} is not a whole number of 4 KiB pages")]
    InterleaveUnit(Size),
    #[error("interleave: an ExCache of {ways} ways per set pins nothing, as every set keeps {MIN_UNPINNED} ways for the pages that come and go and {reserve} free for the background evictor")]
    InterleavePinsNothing { ways: u64, reserve: usize },
    #[error("links: {0} is not between 1 and {MAX_LINKS}")]
    Links(usize),
    #[error(
        "dirty_tracking: \"scan\" cannot be used with huge_pages = \"on\": eviction by scan needs heap pages of 4 KiB"
    )]
    ScanWithHugePages,
    #[error("dirty_tracking: \"scan\" cannot be used with evict_reserve > 0: the background evictor copies a line after write-protecting it, which asynchronous write protection does not make a barrier")]
    ScanWithEvictor,
    #[error("access_sampling: \"unmap\" needs eviction = \"workingset\", \"clock\" or \"ghost-clock\": fifo uses nothing sampling sees")]
    SamplingWithFifo,
    #[error("access_sampling: \"unmap\" needs dirty_tracking = \"fault\": unmapping a page drops the written bit the kernel keeps for a scan")]
    SamplingWithScan,
    #[error(
        "access_sampling: \"unmap\" cannot be used with huge_pages = \"on\": a huge page is unmapped and faulted whole"
    )]
    SamplingWithHugePages,
    #[error("compressed_tier: {0} bytes is less than one 4 KiB page (0 turns the tier off)")]
    CompressedTier(u64),
    #[error("fault_workers: must be at least 1")]
    NoFaultWorkers,
    #[error("fork_timeout_ms: must be at least 1")]
    NoForkTimeout,
    #[error("evict_reserve: {reserve} spare ways leave no way to fill in sets of {ways} (0 turns the evictor off)")]
    EvictReserve { reserve: usize, ways: u64 },
    #[error("share_floor: {0}% is more than an equal share (at most 100; 0 turns it off)")]
    ShareFloor(usize),
    #[error("evict_beside: {0} pages on either side of a victim is more than 64 (0 turns it off)")]
    EvictBeside(usize),
}

impl ConfigError {
    /// This refusal as one inside `table`.
    pub fn in_table(self, table: impl Into<String>) -> ConfigError {
        ConfigError::In {
            table: table.into(),
            error: Box::new(self),
        }
    }
}
