//! Messages between pComponents and mComponents (a process's virtual-memory calls to its
//! home, the ExCache data path to the vRegions' owners) and between mComponents (the home and
//! the owners, the backup home), with the data they carry: the process's identity, its
//! replica sets, the home's state, and pages sealed with their checksum.
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

use super::{ComponentRef, ErrCode, PAGE_SIZE};

/// A heap page as it travels and as its owner keeps it: its `PAGE_SIZE` bytes, then the
/// CRC-32C of those bytes (little-endian), made by the pComponent that writes the page back
/// and checked by the one that fetches it, so that a page changed anywhere in between (a
/// flipped bit in an mComponent's memory) is never taken for the program's data.
pub const SEALED_PAGE: usize = PAGE_SIZE + 4;

/// `data` (one page) sealed with its checksum.
pub fn seal_page(data: &[u8]) -> ByteBuf {
    let mut v = Vec::with_capacity(SEALED_PAGE);
    v.extend_from_slice(data);
    v.extend_from_slice(&crc32c::crc32c(data).to_le_bytes());
    ByteBuf::from(v)
}

/// The checksum a sealed page carries.
pub fn page_checksum(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// A page never written back: zeros, sealed.
pub fn sealed_zero_page() -> ByteBuf {
    seal_page(&[0u8; PAGE_SIZE])
}

/// Why a sealed page was not accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum Unsealed {
    /// It is not `SEALED_PAGE` bytes long.
    Size(usize),
    /// Its bytes do not match its checksum.
    Checksum,
}

/// The page's bytes, if they are what was sealed.
pub fn unseal_page(blob: ByteBuf) -> Result<Vec<u8>, Unsealed> {
    let mut v = blob.into_vec();
    if v.len() != SEALED_PAGE {
        return Err(Unsealed::Size(v.len()));
    }
    let sum = u32::from_le_bytes(v[PAGE_SIZE..].try_into().expect("four bytes"));
    v.truncate(PAGE_SIZE);
    if crc32c::crc32c(&v) != sum {
        return Err(Unsealed::Checksum);
    }
    Ok(v)
}

/// Identity carried by every memory request: an mComponent refuses pages of another vNode.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Who {
    pub vnode: String,
    pub pid: u64,
    /// The version of the process's replica sets the sender acts on (see
    /// [`VregionReplicas`]); an owner refuses a write-back of an older epoch (`Stale`), so
    /// that no page lands only on a replica set that has since changed.
    pub epoch: u64,
}

impl Who {
    pub fn new(vnode: impl Into<String>, pid: u64) -> Who {
        Who {
            vnode: vnode.into(),
            pid,
            epoch: 0,
        }
    }
}

/// When heap memory is charged to an mComponent, as Linux's `vm.overcommit_memory`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Overcommit {
    /// Pages are charged when they are stored; a mapping is refused only if it is larger than
    /// all the cluster's memory (and not `MAP_NORESERVE`), as Linux's heuristic mode.
    #[default]
    Heuristic,
    /// Writable mappings are charged whole when they are made, never beyond capacity, as
    /// Linux's strict mode (`MAP_NORESERVE` is charged too).
    Strict,
}

impl Overcommit {
    pub const NAMES: &'static str = "heuristic, strict";

    pub fn from_name(name: &str) -> Result<Overcommit, PolicyError> {
        match name {
            "heuristic" => Ok(Overcommit::Heuristic),
            "strict" => Ok(Overcommit::Strict),
            other => Err(PolicyError::UnknownOvercommit(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Overcommit::Heuristic => "heuristic",
            Overcommit::Strict => "strict",
        }
    }
}

/// Why a memory policy, as a configuration or a command line names it, is not one the cluster
/// has; a vRegion size that a replication cannot stripe is refused with it too.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("unknown overcommit mode \"{0}\" (one of {names})", names = Overcommit::NAMES)]
    UnknownOvercommit(String),
    #[error("replication \"{0}\": the number of data mComponents per parity must be 2, 4 or 8 (a vRegion's pages divide evenly)")]
    EcData(String),
    #[error("unknown replication scheme \"{0}\" (one of {names})", names = Replication::NAMES)]
    UnknownReplication(String),
    #[error("replication {replication} stripes a vRegion in rows of {row} bytes: a vRegion of {bytes} bytes is not a multiple of that")]
    VregionSize {
        replication: Replication,
        row: u64,
        bytes: u64,
    },
}

impl crate::Refuse for PolicyError {
    fn code(&self) -> ErrCode {
        ErrCode::Invalid
    }
}

/// How a cluster keeps heap memory safe from the loss of an mComponent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Replication {
    /// One copy of each page: an mComponent that dies takes its pages with it.
    #[default]
    None,
    /// Every vRegion on two mComponents (on different hosts when there are), written back
    /// to both; the vma tree and the home's state are replicated too.
    Replica,
    /// LegoOS: each vRegion on a primary mComponent, and every write-back also appended to a
    /// small log on a secondary one, which streams it to an append-only backup file on an
    /// sComponent. The primary lost, the secondary replays file and log and becomes primary;
    /// a log that fills up (the sComponent too slow) stops protecting its vRegion until the
    /// primary copies it again.
    Log,
    /// Erasure coding: a vRegion's pages striped over `data` mComponents, one copy each, and
    /// their XOR parity on one more (memory `1 + 1/data` times the data). A write-back goes
    /// to the page's owner, which forwards the change (old XOR new) to the parity.
    Ec { data: u32 },
}

impl Replication {
    pub const NAMES: &'static str =
        "none, replica, log, ec, ec:K (K data mComponents per parity: 2, 4 or 8; ec is ec:4)";

    pub fn from_name(name: &str) -> Result<Replication, PolicyError> {
        match name {
            "none" => Ok(Replication::None),
            "replica" => Ok(Replication::Replica),
            "ec" => Ok(Replication::Ec { data: 4 }),
            "log" => Ok(Replication::Log),
            other => match other.strip_prefix("ec:").map(str::parse::<u32>) {
                Some(Ok(data @ (2 | 4 | 8))) => Ok(Replication::Ec { data }),
                Some(_) => Err(PolicyError::EcData(other.to_string())),
                None => Err(PolicyError::UnknownReplication(other.to_string())),
            },
        }
    }

    /// Members of each vRegion's set.
    pub fn members(self) -> usize {
        match self {
            Replication::None => 1,
            Replication::Replica | Replication::Log => 2,
            Replication::Ec { data } => data as usize + 1,
        }
    }

    /// Whether a set survives the loss of one of its members.
    pub fn redundant(self) -> bool {
        self != Replication::None
    }

    /// A vRegion of `bytes` must hold whole rows of a striped set.
    pub fn check_vregion_size(self, bytes: u64) -> Result<(), PolicyError> {
        let row = self.data() as u64 * STRIPE_PAGES * PAGE_SIZE as u64;
        if row > 0 && !bytes.is_multiple_of(row) {
            return Err(PolicyError::VregionSize {
                replication: self,
                row,
                bytes,
            });
        }
        Ok(())
    }

    /// Data members of a striped set (0: every member holds every page).
    pub fn data(self) -> u32 {
        match self {
            Replication::Ec { data } => data,
            _ => 0,
        }
    }
}

impl std::fmt::Display for Replication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Replication::None => f.write_str("none"),
            Replication::Replica => f.write_str("replica"),
            Replication::Log => f.write_str("log"),
            Replication::Ec { data } => write!(f, "ec:{data}"),
        }
    }
}

/// The mComponents holding a vRegion of a process. `epoch` is the process's epoch when the
/// set last changed.
///
/// With `data` 0 every member holds every page, the primary (fetches go there) first. With
/// `data` k > 0 the set is striped in units of [`STRIPE_PAGES`] pages: unit `u` is held by
/// member `u % k` alone, and member k holds the parity of each row, the k pages at the same
/// offset of k consecutive units: the XOR of their sealed bytes, a page never written
/// counting as zeros. A member may stand at two places when the cluster has too few
/// mComponents (losing it then loses rows).
///
/// `log`: the sComponent keeping the backup file of a logged set ([`Replication::Log`]); its
/// second member keeps a log of the write-backs, not the pages, and serves no fetch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VregionReplicas {
    pub index: u64,
    pub epoch: u64,
    pub owners: Vec<ComponentRef>,
    pub data: u32,
    pub log: Option<ComponentRef>,
}

/// Pages of a stripe unit: read-ahead within one unit goes to one member in one round trip.
pub const STRIPE_PAGES: u64 = 16;

impl VregionReplicas {
    /// The place of page `vpn` in a striped set.
    pub fn column(&self, vpn: u64) -> usize {
        ((vpn / STRIPE_PAGES) % self.data.max(1) as u64) as usize
    }

    /// The row of page `vpn` in a striped set, named by its page at place 0.
    pub fn row(&self, vpn: u64) -> u64 {
        vpn - self.column(vpn) as u64 * STRIPE_PAGES
    }

    /// The pages of a row, by place.
    pub fn row_pages(&self, row: u64) -> impl Iterator<Item = u64> {
        (0..self.data as u64).map(move |j| row + j * STRIPE_PAGES)
    }

    /// The member that serves page `vpn`.
    pub fn holder(&self, vpn: u64) -> &ComponentRef {
        match self.data {
            0 => &self.owners[0],
            _ => &self.owners[self.column(vpn)],
        }
    }

    /// The members a write-back of page `vpn` goes to.
    pub fn writers(&self, vpn: u64) -> Vec<&ComponentRef> {
        match self.data {
            0 => self.owners.iter().collect(),
            _ => vec![self.holder(vpn)],
        }
    }

    /// The member holding the parity of a striped set.
    pub fn parity(&self) -> Option<&ComponentRef> {
        (self.data > 0).then(|| &self.owners[self.data as usize])
    }

    /// The member keeping the backup log of a logged set.
    pub fn logger(&self) -> Option<&ComponentRef> {
        self.log.as_ref().and(self.owners.get(1))
    }

    /// Every member once.
    pub fn distinct(&self) -> Vec<&ComponentRef> {
        let mut seen: Vec<&ComponentRef> = Vec::new();
        for o in &self.owners {
            if !seen.iter().any(|s| s.id == o.id) {
                seen.push(o);
            }
        }
        seen
    }
}

/// What an `M2M_PUT_PAGES` stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Put {
    /// Pages as a write-back would (mremap): in a striped set their changes reach the parity.
    Write,
    /// Copies of pages the parity already accounts for (a rebuild, a vRegion moved).
    Copy,
    /// Parity rows, keyed by the first page of their row.
    Parity,
}

/// What an `M2M_SET` does to the backup of a logged set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogStep {
    /// Nothing: the logger goes on (a new logger so named has no backup: it is unprotected).
    Keep,
    /// The logger's backup starts anew; it is whole only once `Whole` follows (an empty
    /// vRegion, or a full copy of its pages in between).
    Restart,
    /// The copy that followed `Restart` is complete.
    Whole,
    /// The logger, named primary, replays its backup into pages first.
    Replay,
}

/// A vma as the home keeps it: `accounted` once it was writable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeVma {
    pub start: u64,
    pub end: u64,
    pub prot: u32,
    pub accounted: bool,
}

/// All a home knows of one process, as it copies it to the backup home after each change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HomeState {
    pub who: Who,
    /// The home that sent it: when it is lost, the backup takes over.
    pub home: ComponentRef,
    pub creator: Option<[u8; 32]>,
    pub pcomp: u32,
    pub base: u64,
    pub limit: u64,
    pub vmas: Vec<HomeVma>,
    pub vregions: Vec<VregionReplicas>,
    /// Members taken out of its sets that may still hold copies: freed when it exits.
    pub retired: Vec<ComponentRef>,
    /// Its vNode's memory quota.
    pub memory_quota: Option<u64>,
    /// The creation that made it (`P2M_PROC_CREATE.attempt`).
    pub attempt: u32,
}

/// A virtual memory area as the pComponent needs it to rebuild protections (after fork).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmaInfo {
    pub start: u64,
    pub end: u64,
    pub prot: u32,
}

/// The largest reply a link probe asks for.
pub const MAX_PROBE: u32 = 1 << 20;

message_types! {
    // ---- pComponent -> home mComponent: virtual memory calls of a process
    /// `pcomp`: the sender's component id, which with its key names this start of it.
    /// `memory_quota`: its vNode's, as GMM answered `P2G_PICK_HOME`. `attempt`: how many
    /// creations of this process the sender gave up before this one (`P2M_CREATE_UNDO`).
    P2M_PROC_CREATE { pub who: Who, pub region_base: u64, pub region_size: u64, pub pcomp: u32, pub memory_quota: Option<u64>, pub attempt: u32 };
    /// `backup`: the mComponent that keeps a copy of the home's state of the process and
    /// takes over when the home is lost (replicated clusters).
    M2P_HOME { pub backup: Option<ComponentRef> };
    /// `noreserve`: the program passed `MAP_NORESERVE` (never charged at mapping time).
    P2M_MMAP { pub who: Who, pub hint: u64, pub len: u64, pub prot: u32, pub fixed: bool, pub noreserve: bool };
    M2P_MAPPED { pub addr: u64, pub prot: u32, pub owners: Vec<VregionReplicas>, pub epoch: u64, pub backup: Option<ComponentRef> };
    P2M_MUNMAP { pub who: Who, pub addr: u64, pub len: u64 };
    P2M_MPROTECT { pub who: Who, pub addr: u64, pub len: u64, pub prot: u32 };
    P2M_MREMAP { pub who: Who, pub old: u64, pub old_len: u64, pub new_len: u64, pub may_move: bool, pub fixed_to: Option<u64> };
    P2M_DONTNEED { pub who: Who, pub addr: u64, pub len: u64 };
    P2M_FORK { pub parent: Who, pub child: u64 };
    M2P_FORKED { pub vmas: Vec<VmaInfo>, pub owners: Vec<VregionReplicas>, pub epoch: u64, pub backup: Option<ComponentRef> };
    P2M_EXIT { pub who: Who };
    /// The sender gave up creation `attempt` of a process (its home did not answer in time):
    /// a home made by it or an earlier one ends, one still on its way is refused, and a later
    /// creation is made as any other.
    P2M_CREATE_UNDO { pub who: Who, pub attempt: u32 };
    /// The replica sets of all the process's active vRegions.
    P2M_VREGIONS { pub who: Who };
    M2P_VREGIONS { pub owners: Vec<VregionReplicas>, pub epoch: u64, pub backup: Option<ComponentRef> };
    /// The sender could not reach mComponent `lost`, a replica of the process's memory, for
    /// page `vpn`: the home takes it out of every replica set of the process, rebuilds what it
    /// held elsewhere (what `vpn` needs first), and answers the new sets.
    P2M_REPLICA_LOST { pub who: Who, pub lost: u32, pub vpn: u64 };
    /// A write-back of page `vpn` found member `full` out of memory (heuristic overcommit):
    /// the home moves the page's vRegion off it to an mComponent with room and answers the
    /// new sets.
    P2M_OWNER_FULL { pub who: Who, pub vpn: u64, pub full: u32 };
    /// To the backup home, when the home (`lost`) cannot be reached: it becomes the home.
    P2M_HOME_TAKEOVER { pub who: Who, pub lost: u32 };

    // ---- pComponent -> vRegion owner: the ExCache data path
    P2M_FETCH { pub who: Who, pub vpn: u64 };
    /// A probe of the link, off the data path: answered with `bytes` (at most
    /// [`MAX_PROBE`]) of zeros, whose arrival rate is the link's bandwidth towards the
    /// pComponent, the direction misses use.
    P2M_PROBE_LINK { pub bytes: u32 };
    M2P_PROBED { pub payload: ByteBuf };
    M2P_PAGE { pub data: ByteBuf };
    P2M_FLUSH { pub who: Who, pub vpn: u64, pub data: ByteBuf };
    /// A dirty victim and a miss to the same owner in one round trip (LegoOS piggyback). The
    /// victim may belong to another process of the same pComponent.
    P2M_FLUSH_FETCH { pub who: Who, pub fetch_vpn: u64, pub flush_who: Who, pub flush_vpn: u64, pub data: ByteBuf };
    /// Several pages of one process from one owner in one round trip (fault-around, prefetch).
    P2M_FETCH_MANY { pub who: Who, pub vpns: Vec<u64> };
    /// The pages of a `P2M_FETCH_MANY`, in the order asked.
    M2P_PAGES { pub pages: Vec<ByteBuf> };
    /// Dirty victims and several pages of one process, all at the same owner, in one round trip
    /// (piggyback with read-ahead); the pages come back as `M2P_PAGES`, in the order asked.
    P2M_FLUSH_FETCH_MANY { pub who: Who, pub vpns: Vec<u64>, pub flushes: Vec<(Who, u64, ByteBuf)> };
    /// Several dirty pages of one process to one owner in one round trip (fork, mremap).
    P2M_FLUSH_MANY { pub who: Who, pub pages: Vec<(u64, ByteBuf)> };
    /// To the home, when the owner of a page of a striped set sent a copy that fails
    /// its checksum: the page rebuilt from the parity and the rest of its row with the set
    /// fenced (answered as `M2P_PAGE`), which the home also writes over the bad copy.
    P2M_RECONSTRUCT { pub who: Who, pub vpn: u64 };
    /// One-sided access ([`crate::Transport::pages_socket`]): the pComponent of the process
    /// asks the owner for its pages of vRegion `index`. The owner answers with a lease: the
    /// segment's id and size, the generation it is valid for, and a one-time `token` that the
    /// pComponent presents on the owner's pages socket to receive the segment's memfd (unless
    /// it already holds segment `segment`). Refused for vRegions in striped or logged sets.
    P2M_LEASE { pub who: Who, pub index: u64 };
    M2P_LEASE { pub segment: u64, pub pages: u64, pub generation: u64, pub token: ByteBuf };

    // ---- home mComponent -> vRegion owner
    /// `creator`: the static key of the pComponent that created the process (the home
    /// recorded it); the owner serves the process's pages to that pComponent alone. `quota`:
    /// the memory quota of the process's vNode, which the owner keeps room for while it holds
    /// any of the vNode's processes.
    M2M_VMA_ADD { pub who: Who, pub start: u64, pub end: u64, pub prot: u32, pub creator: Option<[u8; 32]>, pub quota: Option<u64> };
    /// From now on, refuse the process's write-backs older than `who.epoch` (a replica set
    /// of it is changing).
    M2M_EPOCH { pub who: Who };
    /// Up to `max` materialized pages of a range from `from` on, left in place (a rebuild
    /// copies them to a new replica, mremap to the new range); `max` 0 asks only whether the
    /// receiver holds the process. `parity`: the parity rows the receiver keeps there
    /// instead, each keyed by the first page of its row.
    M2M_READ_PAGES { pub who: Who, pub from: u64, pub end: u64, pub max: u32, pub parity: bool };
    /// The striped or logged set of vRegion `set.index` of the process, from its home
    /// (`home`) whenever it is made or changes: an owner forwards the changes of the pages it
    /// stores to the parity member named there; the logger of a logged set appends its
    /// write-backs to its log; `log` says what happens to the backup.
    M2M_SET { pub who: Who, pub set: VregionReplicas, pub creator: Option<[u8; 32]>, pub home: ComponentRef, pub log: LogStep };
    /// From the logger of vRegion `index` to the process's home: its log was full and skipped
    /// write-backs; the home copies the vRegion to it again (fenced) and it protects it again.
    M2M_LOG_RESYNC { pub who: Who, pub index: u64 };
    /// From an owner of a striped set to its parity member: XOR each delta (old page XOR new
    /// page, sealed bytes) into the parity of the page's row.
    M2M_PARITY { pub who: Who, pub deltas: Vec<(u64, ByteBuf)> };
    /// From a backup home about to take over: answered `OK` while the receiver is still the
    /// process's home (it is not lost), `ERR NotHome` otherwise.
    M2M_HOME_OF { pub who: Who };
    /// The home's state of a process, to the backup home after each change.
    M2M_HOME_SYNC { pub state: HomeState };
    M2M_HOME_DROP { pub who: Who };
    /// From a leaving home: the receiver becomes the home of the process in `state` (its
    /// epoch moves past the state's), and answers with its backup home.
    M2M_HOME_ADOPT { pub state: HomeState };
    M2M_HOME_ADOPTED { pub backup: Option<ComponentRef> };
    /// From a leaving home to the pComponent of a process it gave to `home` (with its backup);
    /// or from a backup that took over on the managers' word (`from`: the lost home).
    M2P_HOME_MOVED { pub who: Who, pub from: u32, pub home: ComponentRef, pub backup: Option<ComponentRef> };
    M2M_VMA_REMOVE { pub who: Who, pub start: u64, pub end: u64 };
    M2M_VMA_PROTECT { pub who: Who, pub start: u64, pub end: u64, pub prot: u32 };
    M2M_DISCARD { pub who: Who, pub start: u64, pub end: u64 };
    M2M_PAGES { pub pages: Vec<(u64, ByteBuf)>, pub more: bool };
    M2M_PUT_PAGES { pub who: Who, pub pages: Vec<(u64, ByteBuf)>, pub put: Put };
    M2M_FORK { pub parent: Who, pub child: u64, pub start: u64, pub end: u64 };
    M2M_EXIT { pub who: Who };

    // ---- control client -> mComponent
    /// Fault injection (`splitos debug flip`): flips bit `bit` of the first page of the
    /// process this mComponent stores at or after `from_vpn`, and says which.
    C2M_DEBUG_FLIP { pub who: Who, pub from_vpn: u64, pub bit: u32 };
    M2C_FLIPPED { pub vpn: u64 };
}

#[cfg(test)]
mod page_seal_tests {
    use super::*;

    #[test]
    fn a_sealed_page_opens_to_its_bytes_and_any_flipped_bit_or_wrong_size_is_refused() {
        let data: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 31 % 251) as u8).collect();
        assert_eq!(unseal_page(seal_page(&data)), Ok(data.clone()));
        assert_eq!(unseal_page(sealed_zero_page()), Ok(vec![0u8; PAGE_SIZE]));
        for bit in [0, 7, 12345, SEALED_PAGE * 8 - 1] {
            let mut v = seal_page(&data).into_vec();
            v[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(unseal_page(ByteBuf::from(v)), Err(Unsealed::Checksum), "bit {bit}");
        }
        assert_eq!(unseal_page(ByteBuf::from(data)), Err(Unsealed::Size(PAGE_SIZE)));
    }
}
