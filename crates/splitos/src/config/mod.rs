//! The cluster configuration file (TOML). Every field is documented in docs/configuration.md;
//! a bad file is refused with a message naming the field.
use std::path::Path;

use serde::Deserialize;
use splitos_rpc::poll::Polling;
use splitos_rpc::TransportConfig;

use crate::pmon::DirtyTracking;
use crate::pmon::HugePages;

const PAGE: u64 = splitos_rpc::PAGE_SIZE as u64;

/// A byte size: a number, or a string with a K/M/G/T suffix (powers of 1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

pub fn parse_size(s: &str) -> Result<u64, String> {
    // "64MB" and "64MiB" mean 64M, as people write them.
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix("ib")).or_else(|| t.strip_suffix(['B', 'b']).filter(|n| n.ends_with(|c: char| c.is_ascii_alphabetic()))).unwrap_or(t);
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => return Err(format!("{s:?}: unknown size suffix {c:?} (use K, M, G or T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size (examples: 4096, 64M, 1G)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))
}

impl std::str::FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Size, String> {
        parse_size(s).map(Size)
    }
}

/// The shortest exact form (`64M`, `1G`, `4097`), which [`parse_size`] reads back: how a
/// default shows in `--help`.
impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = [(40, 'T'), (30, 'G'), (20, 'M'), (10, 'K')].into_iter().find(|(shift, _)| self.0 != 0 && self.0.is_multiple_of(1u64 << shift));
        match unit {
            Some((shift, c)) => write!(f, "{}{c}", self.0 >> shift),
            None => write!(f, "{}", self.0),
        }
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Size(n)),
            Raw::S(s) => parse_size(&s).map(Size).map_err(serde::de::Error::custom),
        }
    }
}

// Every default is written once, in the `default_*` function of its section: a field missing
// from the file takes it (serde's container default), and so does the command line of each
// monitor (main.rs), so a config file and `splitos mem`/`proc`/`storage`/`gm` cannot disagree.

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default = "default_cluster")]
pub struct ClusterSection {
    /// Where the global managers listen.
    pub gm: String,
    pub vregion_size: Size,
    /// How long the global managers keep a component that stopped heartbeating (ms) before
    /// they forget it; one that comes back later registers again.
    pub forget_dead_ms: u64,
    /// How long a pComponent or mComponent may be silent (ms) before the global managers
    /// declare it lost: the mComponents release the memory of the processes a lost pComponent
    /// created; programs give up what a lost mComponent held (until then they wait for it,
    /// and `cluster status` shows it unresponsive); less than `forget_dead_ms`.
    pub reclaim_dead_ms: u64,
    /// The network namespace (`ip netns`) to start the global managers in (docs/deployment.md);
    /// none: the namespace of `cluster up`.
    pub netns: Option<String>,
    /// How heap memory survives the loss of an mComponent (`none`, `replica`;
    /// docs/failures.md); unset: `replica` with three or more mComponents, else `none`.
    pub replication: Option<String>,
    /// When heap memory is charged (`heuristic`, `strict`; docs/failures.md).
    pub overcommit: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default = "default_pcomp")]
pub struct PcompSection {
    pub listen: String,
    pub excache: Size,
    pub ways: usize,
    pub policy: String,
    pub piggyback: bool,
    pub fault_workers: usize,
    /// How long a fault worker polls its process's userfaultfd before sleeping (µs).
    pub fault_spin_us: u64,
    /// `adaptive`: that polling shrinks while the process idles and grows back while it
    /// faults; `fixed`: always `fault_spin_us`.
    pub fault_polling: Polling,
    /// Most lines read ahead with a remote miss (0: off).
    pub prefetch: usize,
    /// `sequential`: read ahead only while misses are sequential; `nextline`: also the next
    /// line of any remote miss.
    pub prefetch_policy: String,
    /// Fresh lines installed zero-filled and writable with a first touch (0: off).
    pub fault_around: usize,
    /// Memory for evicted lines kept compressed on the pComponent, beyond the ExCache (0: off).
    pub compressed_tier: Size,
    /// Fresh lines pre-allocated in the heap's memfd past a first touch (0: off).
    pub prealloc: usize,
    /// Unmapped heap each process keeps mapped at its home to map again locally (0: off).
    pub heap_reuse: Size,
    /// `on`: heaps on the pComponent's private tmpfs, fresh 2 MiB extents pre-allocated as
    /// huge pages; `off`: memfd heaps, 4 KiB pages.
    pub huge_pages: HugePages,
    /// `any`: fault workers run anywhere and poll (`fault_spin_us`); `faulting`: each runs on
    /// the CPU of the thread whose fault it serves and sleeps between faults.
    pub fault_cpu: crate::pmon::FaultCpu,
    /// `fault`: the first write to a line traps to the pComponent; `scan`: the kernel records
    /// writes and eviction asks it (asynchronous write protection and PAGEMAP_SCAN).
    pub dirty_tracking: DirtyTracking,
    /// Spare ways a background evictor keeps in each ExCache set a miss used, less than
    /// `ways` (0: no evictor; misses evict inline).
    pub evict_reserve: usize,
    /// Two programs of a vNode connect through their pComponents (this one, or this one and
    /// another directly), not through an nComponent (docs/network.md).
    pub net_shortcut: bool,
    /// How sockets' bytes travel to the nComponent: `ddio` (in the requests) or `dma`
    /// (through socket buffers on an mComponent).
    pub net_path: crate::pmon::NetPath,
    /// Programs of one user other than root that may run on the pComponent at once; beyond,
    /// a program is refused at its start and a fork fails (EAGAIN).
    pub max_programs_per_user: usize,
    /// Programs of all users but root that may run on the pComponent at once.
    pub max_programs: usize,
    /// The network namespace (`ip netns`) to start it in: a "host" of a cluster on one machine
    /// (docs/deployment.md); none: the namespace of `cluster up`.
    pub netns: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default = "default_mcomp")]
pub struct McompSection {
    pub listen: String,
    pub capacity: Size,
    /// Worker threads for data-path requests; 0 serves them on each connection's receiving thread.
    pub workers: usize,
    /// Storage buffer cache this mComponent holds for files placed on it.
    pub bcache: Size,
    /// Largest read-ahead window for sequential file reads; 0 turns it off.
    pub readahead: Size,
    /// Backup log kept for the sComponent when `replication = "log"`: write-backs beyond it
    /// leave their vRegion unprotected until it is copied again (docs/failures.md).
    pub backup_log: Size,
    /// The network namespace (`ip netns`) to start it in: a "host" of a cluster on one machine
    /// (docs/deployment.md); none: the namespace of `cluster up`.
    pub netns: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default = "default_scomp")]
pub struct ScompSection {
    pub listen: String,
    /// Where files are kept (default: the data directory's `storage`, see docs/storage.md).
    pub dir: Option<std::path::PathBuf>,
    /// Bytes of file data this sComponent stores for all vNodes together.
    pub quota: Size,
    /// The network namespace (`ip netns`) to start it in: a "host" of a cluster on one machine
    /// (docs/deployment.md); none: the namespace of `cluster up`.
    pub netns: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default = "default_ncomp")]
pub struct NcompSection {
    pub listen: String,
    /// Interface addresses to register with the global network manager; empty: every
    /// address of its host but loopback (docs/network.md).
    pub nics: Vec<std::net::IpAddr>,
    /// What programs' connects to loopback reach: `vnode` (only its own ports) or `host`.
    pub loopback: crate::nmon::Loopback,
    /// The network namespace (`ip netns`) to start it in: a "host" of a cluster on one machine
    /// (docs/deployment.md); none: the namespace of `cluster up`.
    pub netns: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default = "default_cluster")]
    pub cluster: ClusterSection,
    #[serde(default)]
    pub pcomponent: Vec<PcompSection>,
    #[serde(default)]
    pub mcomponent: Vec<McompSection>,
    /// Storage components; without one, runs get no vNode file system.
    #[serde(default)]
    pub scomponent: Vec<ScompSection>,
    /// Network components; without one, programs' sockets use their pComponent host's stack.
    #[serde(default)]
    pub ncomponent: Vec<NcompSection>,
    /// Which transport every component uses, and that transport's knobs (`[transport.tcp]`).
    #[serde(default)]
    pub transport: TransportConfig,
    /// vNodes granted to users of the pComponents' hosts; a vNode not listed is root's alone.
    #[serde(default)]
    pub vnode: Vec<VnodeSection>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VnodeSection {
    pub name: String,
    /// Users (names or numeric uids) who may run programs on it and see its files.
    #[serde(default)]
    pub users: Vec<String>,
    /// Groups (names or numeric gids) whose members may.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Memory all its processes together may map writable across the cluster (their heaps,
    /// as strict overcommit charges them); a mapping beyond it fails with ENOMEM. Unset: no
    /// quota.
    pub memory: Option<Size>,
}

impl VnodeSection {
    /// As `splitos proc --grant` takes it.
    pub fn grant_spec(&self) -> String {
        let who: Vec<String> = self.users.iter().map(|u| format!("user:{u}")).chain(self.groups.iter().map(|g| format!("group:{g}"))).collect();
        format!("{}={}", self.name, who.join(","))
    }

    /// As `splitos gm --vnode-memory` takes it, when the vNode has a quota.
    pub fn memory_spec(&self) -> Option<String> {
        self.memory.map(|m| format!("{}={}", self.name, m.0))
    }
}

/// A vNode's memory quota as `splitos gm --vnode-memory` takes it: `VNODE=SIZE`.
pub fn parse_vnode_memory(s: &str) -> Result<(String, u64), String> {
    let (name, size) = s.split_once('=').filter(|(name, _)| !name.is_empty()).ok_or_else(|| format!("{s:?}: expected VNODE=SIZE"))?;
    let bytes = parse_size(size)?;
    check_memory_quota(bytes)?;
    Ok((name.to_string(), bytes))
}

fn check_memory_quota(bytes: u64) -> Result<(), String> {
    match bytes < PAGE {
        true => Err(format!("a memory quota of {bytes} bytes is less than one 4 KiB page")),
        false => Ok(()),
    }
}

/// Where the global managers listen when started by hand (`splitos gm`), and where monitors
/// started by hand look for them. `cluster up` instead starts them on any free port
/// (`[cluster] gm`) and tells every component it starts, so that clusters on one host do not
/// collide.
pub const HAND_STARTED_GM: &str = "127.0.0.1:7100";

/// Any free port on loopback.
fn any_port() -> String {
    "127.0.0.1:0".into()
}

pub fn default_cluster() -> ClusterSection {
    ClusterSection { gm: any_port(), vregion_size: Size(1 << 30), forget_dead_ms: 30_000, reclaim_dead_ms: 5_000, netns: None, replication: None, overcommit: "heuristic".into() }
}

pub fn default_pcomp() -> PcompSection {
    PcompSection {
        listen: any_port(),
        excache: Size(64 << 20),
        ways: 8,
        policy: "fifo".into(),
        piggyback: true,
        fault_workers: 1,
        fault_spin_us: 100,
        fault_polling: Polling::Fixed,
        prefetch: 8,
        prefetch_policy: "leap".into(),
        fault_around: 16,
        compressed_tier: Size(0),
        prealloc: 64,
        heap_reuse: Size(64 << 20),
        huge_pages: HugePages::Off,
        fault_cpu: crate::pmon::FaultCpu::Any,
        dirty_tracking: DirtyTracking::Fault,
        evict_reserve: 0,
        net_shortcut: true,
        net_path: crate::pmon::NetPath::Ddio,
        max_programs_per_user: 128,
        max_programs: 1024,
        netns: None,
    }
}

pub fn default_mcomp() -> McompSection {
    McompSection { listen: any_port(), capacity: Size(8 << 30), workers: 0, bcache: Size(256 << 20), readahead: Size(128 << 10), backup_log: Size(64 << 20), netns: None }
}

pub fn default_scomp() -> ScompSection {
    ScompSection { listen: any_port(), dir: None, quota: Size(16 << 30), netns: None }
}

pub fn default_ncomp() -> NcompSection {
    NcompSection { listen: any_port(), nics: Vec::new(), loopback: crate::nmon::Loopback::Vnode, netns: None }
}

impl ClusterConfig {
    /// The embedded cluster: global managers, one pComponent, two mComponents, one sComponent.
    pub fn embedded() -> ClusterConfig {
        ClusterConfig {
            cluster: default_cluster(),
            pcomponent: vec![default_pcomp()],
            mcomponent: vec![default_mcomp(), default_mcomp()],
            scomponent: vec![default_scomp()],
            ncomponent: Vec::new(),
            transport: TransportConfig::default(),
            vnode: Vec::new(),
        }
    }

    pub fn load(path: &Path) -> Result<ClusterConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        let c: ClusterConfig = toml::from_str(&text).map_err(|e| format!("config {}: {e}", path.display()))?;
        c.validate().map_err(|e| format!("config {}: {e}", path.display()))?;
        Ok(c)
    }

    /// The cluster's replication scheme: the one configured, or by default `replica` when
    /// there are mComponents enough for a copy on another one to spare.
    pub fn replication(&self) -> Result<splitos_rpc::Replication, String> {
        match &self.cluster.replication {
            Some(name) => splitos_rpc::Replication::from_name(name).map_err(|e| format!("cluster.replication: {e}")),
            None if self.mcomponent.len() >= 3 => Ok(splitos_rpc::Replication::Replica),
            None => Ok(splitos_rpc::Replication::None),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        self.transport.validate()?;
        let scheme = self.replication()?;
        scheme.check_vregion_size(self.cluster.vregion_size.0).map_err(|e| format!("cluster.vregion_size: {e}"))?;
        if scheme == splitos_rpc::Replication::Log && self.scomponent.is_empty() {
            return Err("cluster.replication: \"log\" keeps each vRegion's backup file on an sComponent, and the cluster has no [[scomponent]]".into());
        }
        splitos_rpc::Overcommit::from_name(&self.cluster.overcommit).map_err(|e| format!("cluster.overcommit: {e}"))?;
        let vrs = self.cluster.vregion_size.0;
        if vrs < PAGE || !vrs.is_power_of_two() {
            return Err(format!("cluster.vregion_size: {vrs} must be a power of two of at least 4096"));
        }
        let namespaces = std::iter::once(("cluster".to_string(), &self.cluster.netns))
            .chain(self.pcomponent.iter().enumerate().map(|(i, p)| (format!("pcomponent[{i}]"), &p.netns)))
            .chain(self.mcomponent.iter().enumerate().map(|(i, m)| (format!("mcomponent[{i}]"), &m.netns)))
            .chain(self.scomponent.iter().enumerate().map(|(i, s)| (format!("scomponent[{i}]"), &s.netns)))
            .chain(self.ncomponent.iter().enumerate().map(|(i, n)| (format!("ncomponent[{i}]"), &n.netns)));
        for (at, ns) in namespaces {
            if let Some(ns) = ns.as_deref().filter(|ns| ns.is_empty() || ns.contains('/') || ns.starts_with('.')) {
                return Err(format!("{at}.netns: {ns:?} is not a network namespace name (as `ip netns` names them)"));
            }
        }
        if self.cluster.reclaim_dead_ms >= self.cluster.forget_dead_ms {
            return Err(format!("cluster.reclaim_dead_ms: {} must be less than forget_dead_ms ({}): a forgotten pComponent is never reclaimed", self.cluster.reclaim_dead_ms, self.cluster.forget_dead_ms));
        }
        if self.pcomponent.is_empty() {
            return Err("pcomponent: at least one [[pcomponent]] is needed".into());
        }
        if self.mcomponent.is_empty() {
            return Err("mcomponent: at least one [[mcomponent]] is needed".into());
        }
        for (i, p) in self.pcomponent.iter().enumerate() {
            crate::pmon::check_excache(p.excache.0).map_err(|e| format!("pcomponent[{i}].{e}"))?;
            if crate::pmon::policy_by_name(&p.policy).is_none() {
                return Err(format!("pcomponent[{i}].policy: unknown policy {:?} (known: {})", p.policy, crate::pmon::POLICIES.join(", ")));
            }
            if crate::pmon::prefetcher(&p.prefetch_policy, 0).is_none() {
                return Err(format!("pcomponent[{i}].prefetch_policy: unknown policy {:?} (known: {})", p.prefetch_policy, crate::pmon::PREFETCH_POLICIES.join(", ")));
            }
            if p.dirty_tracking == DirtyTracking::Scan && p.huge_pages == HugePages::On {
                return Err(format!("pcomponent[{i}]: {}", crate::pmon::SCAN_WITH_HUGE_PAGES));
            }
            if p.dirty_tracking == DirtyTracking::Scan && p.evict_reserve > 0 {
                return Err(format!("pcomponent[{i}]: {}", crate::pmon::SCAN_WITH_EVICTOR));
            }
            if p.compressed_tier.0 != 0 && p.compressed_tier.0 < PAGE {
                return Err(format!("pcomponent[{i}].compressed_tier: {} bytes is less than one 4 KiB page (0 turns the tier off)", p.compressed_tier.0));
            }
            if p.fault_workers == 0 {
                return Err(format!("pcomponent[{i}].fault_workers: must be at least 1"));
            }
            // Fully associative (ways = 0): one set of every line.
            let ways = if p.ways == 0 { p.excache.0 / PAGE } else { (p.ways as u64).min(p.excache.0 / PAGE) };
            if p.evict_reserve as u64 >= ways {
                return Err(format!("pcomponent[{i}].evict_reserve: {} spare ways leave no way to fill in sets of {ways} (0 turns the evictor off)", p.evict_reserve));
            }
        }
        for (i, m) in self.mcomponent.iter().enumerate() {
            if m.capacity.0 < PAGE {
                return Err(format!("mcomponent[{i}].capacity: {} bytes is less than one page", m.capacity.0));
            }
            if m.bcache.0 < PAGE {
                return Err(format!("mcomponent[{i}].bcache: {} bytes is less than one 4 KiB block", m.bcache.0));
            }
        }
        let mut dirs = std::collections::HashSet::new();
        for (i, s) in self.scomponent.iter().enumerate() {
            if s.quota.0 == 0 {
                return Err(format!("scomponent[{i}].quota: must be more than 0"));
            }
            if !dirs.insert(s.dir.clone()) {
                return Err(format!("scomponent[{i}].dir: two sComponents cannot share a storage directory"));
            }
        }
        for (i, v) in self.vnode.iter().enumerate() {
            crate::pmon::Grants::parse(&[v.grant_spec()]).map_err(|e| format!("vnode[{i}]: {e}"))?;
            if let Some(m) = v.memory {
                check_memory_quota(m.0).map_err(|e| format!("vnode[{i}].memory: {e}"))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn bad_fields_are_named() {
        let e = toml::from_str::<ClusterConfig>("[[pcomponent]]\nexcahce = \"1M\"\n").unwrap_err().to_string();
        assert!(e.contains("excahce"), "{e}");
        let c: ClusterConfig = toml::from_str("[[pcomponent]]\npolicy = \"lfu\"\n[[mcomponent]]\n").unwrap();
        assert!(c.validate().unwrap_err().contains("pcomponent[0].policy"));
        let e = toml::from_str::<ClusterConfig>("[[pcomponent]]\ndirty_tracking = \"dirty\"\n[[mcomponent]]\n").unwrap_err().to_string();
        assert!(e.contains("dirty_tracking") && e.contains("scan"), "{e}");
        let e = toml::from_str::<ClusterConfig>("[[mcomponent]]\ncapacity = \"9X\"\n").unwrap_err().to_string();
        assert!(e.contains("capacity") || e.contains("9X"), "{e}");
    }

    #[test]
    fn sizes_show_in_a_form_they_are_read_back_from() {
        for n in [0, 1, 4096, 4097, 128 << 10, 64 << 20, 1536 << 20, 1 << 30, 16 << 30, 3 << 40] {
            let shown = Size(n).to_string();
            assert_eq!(shown.parse::<Size>(), Ok(Size(n)), "{shown}");
        }
        assert_eq!(Size(64 << 20).to_string(), "64M");
        assert_eq!(Size(1536 << 20).to_string(), "1536M");
    }

    #[test]
    fn a_vnodes_memory_quota_is_a_size_of_at_least_a_page() {
        let check = |memory: &str| {
            toml::from_str::<ClusterConfig>(&format!("[[pcomponent]]\n[[mcomponent]]\n[[vnode]]\nname = \"lab\"\nusers = [\"root\"]\nmemory = {memory}\n"))
                .map_err(|e| e.to_string())
                .and_then(|c| c.validate().map(|()| c))
        };
        assert_eq!(check("\"256M\"").unwrap().vnode[0].memory_spec().as_deref(), Some("lab=268435456"));
        assert!(check("\"1K\"").unwrap_err().contains("vnode[0].memory"));
        assert!(check("\"lots\"").unwrap_err().contains("\"lots\""));
        assert_eq!(parse_vnode_memory("lab=268435456"), Ok(("lab".to_string(), 256 << 20)));
        assert!(parse_vnode_memory("lab").unwrap_err().contains("VNODE=SIZE"));
        assert!(parse_vnode_memory("=1G").is_err());
        assert!(parse_vnode_memory("lab=0").unwrap_err().contains("less than one 4 KiB page"));
    }

    #[test]
    fn the_evictors_reserve_leaves_a_way_to_fill_in_every_set() {
        let check = |pcomp: &str| toml::from_str::<ClusterConfig>(&format!("[[pcomponent]]\n{pcomp}\n[[mcomponent]]\n")).unwrap().validate();
        assert!(check("evict_reserve = 7").is_ok());
        assert!(check("evict_reserve = 8").unwrap_err().contains("pcomponent[0].evict_reserve"));
        // Fully associative: one set of every line.
        assert!(check("ways = 0\nexcache = \"256K\"\nevict_reserve = 63").is_ok());
        assert!(check("ways = 0\nexcache = \"256K\"\nevict_reserve = 64").is_err());
    }

    #[test]
    fn sizes_read_as_people_write_them_and_unworkable_excaches_are_refused() {
        for (s, n) in [("64MB", 64u64 << 20), ("64MiB", 64 << 20), ("1GB", 1 << 30), ("4096B", 4096), ("4096", 4096)] {
            assert_eq!(parse_size(s), Ok(n), "{s}");
        }
        let check = |pcomp: &str| toml::from_str::<ClusterConfig>(&format!("[[pcomponent]]\n{pcomp}\n[[mcomponent]]\n")).unwrap().validate();
        let tiny = check("excache = \"4K\"").unwrap_err();
        assert!(tiny.contains("pcomponent[0].excache") && tiny.contains("256K"), "{tiny}");
        assert!(check("excache = \"1T\"").unwrap_err().contains("more than this host's memory"));
        assert!(check("excache = \"256K\"").is_ok());
    }
}
