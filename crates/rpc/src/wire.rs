//! The splitos wire format, version 4. This file is the one place it is defined; docs/wire.md
//! describes it for people.
//!
//! Every frame is a 24-byte little-endian [`FrameHeader`] followed by `len` bytes of body, the
//! postcard encoding of one [`Msg`]. Message names say who sends them to whom:
//! `P` processor monitor (pComponent), `M` memory monitor (mComponent), `S` storage monitor
//! (sComponent), `G` global managers,
//! `C` a control client (the CLI), `X` any component. `P2M_FETCH` goes from a pComponent to an
//! mComponent. Replies use the same frame with kind `Reply`; a refused request gets `ERR`.
//!
//! Every message is its own type, and [`Msg`] is their union as it travels. A request type
//! names its reply type ([`Request::Reply`]), so a caller gets the reply it asked for or an
//! error, never another message to sort out by hand.
#![allow(non_camel_case_types)]

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::net::{IpAddr, SocketAddr};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// "SPOS" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SPOS");
/// Version 2 added storage: the sComponent role, file messages and `ErrCode::Errno`.
/// Version 3 added the batched page messages `P2M_FETCH_MANY`, `P2M_FLUSH_MANY` and
/// `P2M_FLUSH_FETCH_MANY`.
/// Version 8 added replication: replica sets with epochs in place of single vRegion owners,
/// the backup home, and the epoch in [`Who`].
/// Version 9 added erasure coding: striped sets ([`VregionReplicas::data`]), `M2M_SET`,
/// `M2M_PARITY`, `P2M_RECONSTRUCT`, the parity forms of `M2M_READ_PAGES` and
/// `M2M_PUT_PAGES`, and `ErrCode::ParityLost`.
/// Version 11 added the network: the nComponent role, its NIC addresses in `X2G_REGISTER`,
/// the GNM's `P2G_PICK_NET`, the socket messages `P2N_*`, and socket buffers on mComponents
/// for the DMA path (`P2M_NETBUF_*`, `N2M_NETBUF_*`).
/// Version 12 added datagram sockets (`P2N_SENDTO`, `P2N_RECVFROM`, `P2N_DISCONNECT`) and
/// the shortcut between pComponents (`P2N_LISTEN.direct`, `P2N_FIND_LISTENER`, `P2P_*`).
/// Version 13 added vNodes' memory quotas: `P2G_PICK_HOME.vnode`, `G2P_HOME.memory_quota`,
/// `P2M_PROC_CREATE.memory_quota` and `HomeState.memory_quota`.
pub const WIRE_VERSION: u16 = 13;
/// Bound on a frame body. Large enough for a batch of 256 pages, small enough that a bogus
/// length cannot make a receiver allocate much.
pub const MAX_BODY: u32 = 2 << 20;
/// A page of the ExCache, of a vRegion owner and of the buffer cache.
pub const PAGE_SIZE: usize = 4096;
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
/// Longest name of one path component in a vNode's file system (as Linux's NAME_MAX).
pub const NAME_MAX: usize = 255;
/// Longest path in a vNode's file system (as Linux's PATH_MAX).
pub const PATH_MAX: usize = 4096;
/// Largest file a vNode's file system holds (16 TiB); beyond it writes fail with EFBIG.
pub const MAX_FILE_SIZE: u64 = 1 << 44;

#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct FrameHeader {
    pub magic: u32,
    pub version: u16,
    pub kind: u8,
    pub flags: u8,
    pub req_id: u64,
    pub len: u32,
    pub reserved: u32,
}

impl FrameHeader {
    pub const SIZE: usize = 24;
}

const _: () = assert!(std::mem::size_of::<FrameHeader>() == FrameHeader::SIZE);

#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Request = 0,
    Reply = 1,
}

impl FrameKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(FrameKind::Request),
            1 => Some(FrameKind::Reply),
            _ => None,
        }
    }
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
        Who { vnode: vnode.into(), pid, epoch: 0 }
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

    pub fn from_name(name: &str) -> Result<Overcommit, String> {
        match name {
            "heuristic" => Ok(Overcommit::Heuristic),
            "strict" => Ok(Overcommit::Strict),
            other => Err(format!("unknown overcommit mode \"{other}\" (one of {})", Overcommit::NAMES)),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Overcommit::Heuristic => "heuristic",
            Overcommit::Strict => "strict",
        }
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
    pub const NAMES: &'static str = "none, replica, log, ec, ec:K (K data mComponents per parity: 2, 4 or 8; ec is ec:4)";

    pub fn from_name(name: &str) -> Result<Replication, String> {
        match name {
            "none" => Ok(Replication::None),
            "replica" => Ok(Replication::Replica),
            "ec" => Ok(Replication::Ec { data: 4 }),
            "log" => Ok(Replication::Log),
            other => match other.strip_prefix("ec:").map(str::parse::<u32>) {
                Some(Ok(data @ (2 | 4 | 8))) => Ok(Replication::Ec { data }),
                Some(_) => Err(format!("replication \"{other}\": the number of data mComponents per parity must be 2, 4 or 8 (a vRegion's pages divide evenly)")),
                None => Err(format!("unknown replication scheme \"{other}\" (one of {})", Replication::NAMES)),
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
    pub fn check_vregion_size(self, bytes: u64) -> Result<(), String> {
        let row = self.data() as u64 * STRIPE_PAGES * PAGE_SIZE as u64;
        if row > 0 && !bytes.is_multiple_of(row) {
            return Err(format!("replication {self} stripes a vRegion in rows of {row} bytes: a vRegion of {bytes} bytes is not a multiple of that"));
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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Gm,
    Proc,
    Mem,
    Storage,
    /// An nComponent: owns network interfaces and runs programs' sockets on its host's stack.
    Net,
    /// The admin's tools (`splitos run`, `cluster status`, `debug fetch`), holding the
    /// cluster's admin credentials.
    Admin,
}

impl Role {
    pub const ALL: [Role; 6] = [Role::Gm, Role::Proc, Role::Mem, Role::Storage, Role::Net, Role::Admin];

    pub fn from_name(name: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Role::Gm => "global-managers",
            Role::Proc => "pcomponent",
            Role::Mem => "mcomponent",
            Role::Storage => "scomponent",
            Role::Net => "ncomponent",
            Role::Admin => "admin",
        }
    }
}

/// Whether a peer authenticated as `role` may send the request `msg`. The letter before the
/// `2` in a message's name says who sends it (`P` pComponent, `M` mComponent, `S` sComponent,
/// `N` nComponent, `G` global managers, `X` any component, `C` the admin's tools); the admin may send
/// anything (`splitos debug fetch` reads a page as a pComponent would). Replies are never
/// requests: a peer that sends one is refused.
pub fn may_send(role: Role, msg: &Msg) -> bool {
    let Some((from, _)) = msg.name().split_once('2') else { return false };
    if msg.is_reply() {
        return false;
    }
    match (from, role) {
        (_, Role::Admin) => true,
        ("P", Role::Proc) | ("M", Role::Mem) | ("S", Role::Storage) | ("N", Role::Net) | ("G", Role::Gm) => true,
        ("X", r) => r != Role::Admin,
        _ => false,
    }
}

/// Whether a peer authenticated as `role` handles the request `msg`: the letter after the
/// `2` in its name (`M` mComponent, `P` pComponent, `S` sComponent, `N` nComponent, `G` global managers, `X`
/// any component). A caller checks it before sending, so that a request (and the page or
/// file it may carry) goes only to a component of the role meant to receive it, whoever
/// holds the address.
pub fn may_receive(role: Role, msg: &Msg) -> bool {
    let Some((_, rest)) = msg.name().split_once('2') else { return false };
    match (rest.chars().next(), role) {
        (Some('P'), Role::Proc) | (Some('M'), Role::Mem) | (Some('S'), Role::Storage) | (Some('N'), Role::Net) | (Some('G'), Role::Gm) => true,
        (Some('X'), r) => r != Role::Admin,
        _ => false,
    }
}

/// The refusal of a call to a peer that does not handle it ([`may_receive`]).
pub fn wrong_receiver(addr: &str, role: Role, msg: &Msg) -> crate::RpcError {
    crate::RpcError::Unreachable { addr: addr.to_string(), why: format!("it is a {}, which does not handle {}", role.name(), msg.name()) }
}

/// One datagram of a datagram socket: to `addr` (none: the socket's connected peer) when it
/// is sent, from `addr` when it was received.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Datagram {
    pub addr: Option<SocketAddr>,
    pub data: ByteBuf,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentRef {
    pub id: u32,
    pub addr: String,
}

/// One start of a pComponent that the global managers know to be gone: its credentials' key
/// and the component id it had. The processes it created are gone with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostPcomp {
    pub key: [u8; 32],
    pub id: u32,
}

/// Approximate load a component reports in its heartbeat.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Load {
    pub threads: u32,
    pub processes: u32,
    /// Bytes of memory this component offers (mComponent) or ExCache bytes (pComponent).
    pub capacity: u64,
    /// Bytes promised to mappings (mComponent) and so unavailable to others.
    pub committed: u64,
    /// Bytes holding page contents now.
    pub used: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ComponentInfo {
    pub id: u32,
    pub role: Role,
    pub addr: String,
    /// Where programs of this pComponent connect (pComponents only).
    pub shim_sock: Option<String>,
    /// The addresses of this nComponent's network interfaces (nComponents only).
    #[serde(default)]
    pub nics: Vec<IpAddr>,
    pub load: Load,
    pub alive: bool,
    pub since_heartbeat_ms: u64,
    /// Declared lost by the global managers (silent for `reclaim_dead_ms`): its processes
    /// (pComponent) or its copies (mComponent) are given up. One that is not alive and not lost
    /// is late: the components that need it wait for it.
    #[serde(default)]
    pub lost: bool,
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

/// The backup file of one vRegion of a process on an sComponent ([`Replication::Log`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LogFile {
    pub vnode: String,
    pub pid: u64,
    pub index: u64,
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

/// One entry of a backup log, replayed in order: the last `Page` of a page not discarded
/// since is its content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogRecord {
    /// A write-back: the page's sealed bytes.
    Page { vpn: u64, data: ByteBuf },
    /// Pages [start, end) freed (munmap, MADV_DONTNEED, a mapping replaced): zeros again.
    Discard { start: u64, end: u64 },
}

/// Applies backup-log records, in order, to the pages they leave.
pub fn replay_log(records: impl IntoIterator<Item = LogRecord>, pages: &mut std::collections::BTreeMap<u64, ByteBuf>) {
    for r in records {
        match r {
            LogRecord::Page { vpn, data } => {
                pages.insert(vpn, data);
            }
            // A range the wrong way round frees nothing (and must not panic the replayer).
            LogRecord::Discard { start, end } if start < end => {
                let gone: Vec<u64> = pages.range(start..end).map(|(v, _)| *v).collect();
                for v in gone {
                    pages.remove(&v);
                }
            }
            LogRecord::Discard { .. } => {}
        }
    }
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
}

/// A virtual memory area as the pComponent needs it to rebuild protections (after fork).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmaInfo {
    pub start: u64,
    pub end: u64,
    pub prot: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrCode {
    /// Out of memory on an mComponent: the program sees ENOMEM.
    NoMemory,
    /// A request for pages of another vNode's process.
    Denied,
    /// Unknown process, address or component.
    NotFound,
    /// A request that makes no sense (bad range, wrong component role).
    Invalid,
    /// A component this request needed could not be reached.
    Unreachable,
    Internal,
    /// A file-system error the program sees as this Linux errno (ENOENT, ENOSPC, ...).
    Errno(i32),
    /// A write-back of an older epoch than the owner's: the sender asks the home for the
    /// process's replica sets and writes again.
    Stale,
    /// The receiver is not (or no longer) the home of the process: its backup may be.
    NotHome,
    /// A striped write-back was stored but its owner could not reach the set's parity member:
    /// the sender reports that member lost and writes again once the parity is rebuilt.
    ParityLost,
}

impl ErrCode {
    /// The Linux errno a program sees for this refusal: the one mapping used by every
    /// component that answers a program (the shim's memory calls, the vNode file system).
    pub fn errno(self) -> i32 {
        match self {
            ErrCode::NoMemory => libc::ENOMEM,
            ErrCode::Invalid => libc::EINVAL,
            ErrCode::Denied => libc::EACCES,
            ErrCode::NotFound | ErrCode::NotHome => libc::ENOENT,
            ErrCode::Unreachable | ErrCode::Internal | ErrCode::Stale | ErrCode::ParityLost => libc::EIO,
            ErrCode::Errno(n) => n,
        }
    }
}

/// What a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
}

/// A file's attributes as the sComponent keeps them. Times are nanoseconds since the epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAttr {
    pub ino: u64,
    pub kind: FileKind,
    /// Permission bits (07777).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Names of the inode (hard links); directories report 2.
    pub nlink: u32,
    /// Bytes reserved on the sComponent's disk for this file (counted against its quota).
    pub alloc: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub ino: u64,
    pub kind: FileKind,
}

/// Attribute changes of `P2S_SETATTR`; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime_ns: Option<i64>,
    pub mtime_ns: Option<i64>,
}

/// Defines every message as its own type and [`Msg`] as their union. A message's fields are
/// encoded in the order given, after the variant index, exactly as if it were a struct variant
/// of `Msg`; the order of the list is therefore part of the wire format.
macro_rules! messages {
    (@def $(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Debug, Default, Serialize, Deserialize)]
        pub struct $name;
    };
    (@def $(#[$m:meta])* $name:ident { $($body:tt)* }) => {
        $(#[$m])*
        #[derive(Clone, Debug, Serialize, Deserialize)]
        pub struct $name { $($body)* }
    };
    ($( $(#[$m:meta])* $name:ident $({ $($body:tt)* })? ; )*) => {
        $( messages!(@def $(#[$m])* $name $({ $($body)* })?); )*

        /// One message as it travels: the union of every message type.
        #[derive(Clone, Debug, Serialize, Deserialize)]
        pub enum Msg {
            $( $name($name), )*
        }

        impl Msg {
            /// The message's wire name, for logs and errors.
            pub fn name(&self) -> &'static str {
                match self {
                    $( Msg::$name(_) => stringify!($name), )*
                }
            }
        }

        $(
            impl From<$name> for Msg {
                fn from(m: $name) -> Msg {
                    Msg::$name(m)
                }
            }

            impl TryFrom<Msg> for $name {
                type Error = Msg;
                fn try_from(m: Msg) -> Result<Self, Msg> {
                    match m {
                        Msg::$name(x) => Ok(x),
                        other => Err(other),
                    }
                }
            }
        )*
    };
}

/// A message that asks for an answer, and the type of that answer.
pub trait Request: Into<Msg> {
    type Reply: TryFrom<Msg, Error = Msg> + Into<Msg>;
}

macro_rules! replies {
    ($($req:ident => $rep:ident),* $(,)?) => {
        $( impl Request for $req { type Reply = $rep; } )*

        impl Msg {
            /// True unless the message is a request (one with a reply type).
            pub fn is_reply(&self) -> bool {
                !matches!(self, $( Msg::$req(_) )|*)
            }
        }
    };
}

messages! {
    // ---- generic replies
    OK;
    ERR { pub code: ErrCode, pub msg: String };

    // ---- any component <-> global managers (GPM, GMM)
    /// `id`: the id the component had before the global managers restarted (0: a new one).
    /// `nics`: an nComponent's interface addresses, which the GNM maps to it.
    X2G_REGISTER { pub role: Role, pub addr: String, pub shim_sock: Option<String>, pub nics: Vec<IpAddr>, pub load: Load, pub id: u32 };
    /// `fenced`: as in `G2X_BEAT`, for an mComponent that registers again after it was
    /// declared lost (and forgotten).
    G2X_REGISTERED { pub id: u32, pub vregion_size: u64, pub replication: Replication, pub overcommit: Overcommit, pub fenced: bool };
    /// Answered `ERR NotFound` unless `id` is registered at `addr`: the sender re-registers.
    X2G_HEARTBEAT { pub id: u32, pub addr: String, pub load: Load };
    /// `lost` (to mComponents and nComponents): the pComponents silent for longer than the
    /// cluster's `reclaim_dead_ms`, or replaced by a new start at their address, whose
    /// processes' memory the mComponents release and whose sockets the nComponents close. `lost_mcomps` (to mComponents only): the mComponents
    /// silent for as long, whose replicas the homes rebuild elsewhere. `fenced`: the receiver
    /// itself was declared lost in a replicated cluster; its copies are out of date, and it
    /// drops them and registers again.
    /// `memory`: the capacity of all live mComponents (a mapping larger than that is an
    /// obvious overcommit).
    G2X_BEAT { pub lost: Vec<LostPcomp>, pub lost_mcomps: Vec<u32>, pub fenced: bool, pub memory: u64 };
    C2G_STATUS;
    G2C_STATUS { pub components: Vec<ComponentInfo>, pub vregion_size: u64 };
    /// GPM: which pComponent runs a new process (the one with the fewest threads).
    C2G_PLACE_PROCESS;
    G2C_PLACED { pub pcomp: ComponentInfo };
    /// GMM: which mComponent is home of a new process of `vnode`. `memory_quota`: the
    /// vNode's memory quota, which its home enforces (one home serves all processes of a vNode
    /// with a quota).
    P2G_PICK_HOME { pub vnode: String };
    G2P_HOME { pub mcomp: ComponentRef, pub memory_quota: Option<u64> };
    /// GMM: which mComponent owns a newly active vRegion (or is a backup home, with `bytes`
    /// 0), other than those in `exclude` and, when it can, on another host than they are.
    M2G_PICK_OWNER { pub bytes: u64, pub exclude: Vec<u32> };
    G2M_OWNER { pub mcomp: ComponentRef };
    /// GSM: which sComponent keeps the backup files of a process of `vnode` (`log`
    /// replication): the one storing the vNode's files.
    M2G_BACKUP_STORE { pub vnode: String };
    G2M_BACKUP_STORE { pub scomp: ComponentRef };
    /// GSM: which sComponent stores a vNode's files.
    P2G_VNODE_STORAGE { pub vnode: String };
    G2P_STORAGE { pub scomp: ComponentRef };
    /// GMM: which mComponent holds the buffer cache of one file.
    P2G_FILE_CACHE { pub vnode: String, pub ino: u64 };
    G2P_FILE_CACHE { pub mcomp: ComponentRef };

    // ---- pComponent -> home mComponent: virtual memory calls of a process
    /// `pcomp`: the sender's component id, which with its key names this start of it.
    /// `memory_quota`: its vNode's, as GMM answered `P2G_PICK_HOME`.
    P2M_PROC_CREATE { pub who: Who, pub region_base: u64, pub region_size: u64, pub pcomp: u32, pub memory_quota: Option<u64> };
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

    // ---- home mComponent -> vRegion owner
    /// `creator`: the static key of the pComponent that created the process (the home
    /// recorded it); the owner serves the process's pages to that pComponent alone.
    M2M_VMA_ADD { pub who: Who, pub start: u64, pub end: u64, pub prot: u32, pub creator: Option<[u8; 32]> };
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
    M2M_VMA_REMOVE { pub who: Who, pub start: u64, pub end: u64 };
    M2M_VMA_PROTECT { pub who: Who, pub start: u64, pub end: u64, pub prot: u32 };
    M2M_DISCARD { pub who: Who, pub start: u64, pub end: u64 };
    M2M_PAGES { pub pages: Vec<(u64, ByteBuf)>, pub more: bool };
    M2M_PUT_PAGES { pub who: Who, pub pages: Vec<(u64, ByteBuf)>, pub put: Put };
    M2M_FORK { pub parent: Who, pub child: u64, pub start: u64, pub end: u64 };
    M2M_EXIT { pub who: Who };

    // ---- pComponent -> sComponent: the namespace of a vNode. Every request names the vNode and a
    // full path (or, for an inode that may have no name left, its number), like NFS v2.
    P2S_LOOKUP { pub vnode: String, pub path: String };
    S2P_ATTR { pub attr: FileAttr };
    X2S_GETATTR { pub vnode: String, pub ino: u64 };
    /// Creates a file, directory or symlink (`target`); `excl` fails with EEXIST if the name
    /// exists, otherwise an existing regular file is returned as it is.
    P2S_CREATE { pub vnode: String, pub path: String, pub kind: FileKind, pub perm: u32, pub uid: u32, pub gid: u32, pub excl: bool, pub target: Option<String> };
    P2S_SETATTR { pub vnode: String, pub ino: u64, pub set: SetAttr };
    /// A further name for a file (a hard link).
    P2S_LINK { pub vnode: String, pub ino: u64, pub to: String };
    P2S_READLINK { pub vnode: String, pub ino: u64 };
    S2P_TARGET { pub target: String };
    /// Removes a name. An inode that loses its last name is detached (kept, with its data)
    /// until `P2S_DROP`: a program may still have it open.
    P2S_UNLINK { pub vnode: String, pub path: String, pub dir: bool };
    S2P_DETACHED { pub ino: Option<u64> };
    /// Renames; an existing target is replaced (and detached, as by `P2S_UNLINK`) unless
    /// `noreplace`.
    P2S_RENAME { pub vnode: String, pub from: String, pub to: String, pub noreplace: bool };
    P2S_READDIR { pub vnode: String, pub path: String, pub after: Option<String> };
    S2P_ENTRIES { pub entries: Vec<DirEntry>, pub more: bool };
    P2S_DROP { pub vnode: String, pub ino: u64 };
    P2S_STATFS { pub vnode: String };
    S2P_STATFS { pub quota: u64, pub used: u64, pub files: u64 };
    /// Makes the data of `ino` (if given) and every namespace change so far durable.
    X2S_SYNC { pub vnode: String, pub ino: Option<u64> };

    // ---- mComponent (buffer cache) -> sComponent: file data by inode and absolute offset
    M2S_READ { pub vnode: String, pub ino: u64, pub offset: u64, pub len: u32 };
    S2M_DATA { pub data: ByteBuf };
    /// Writes back dirty data; `size` is the file's size as the buffer cache knows it.
    M2S_WRITE { pub vnode: String, pub ino: u64, pub offset: u64, pub data: ByteBuf, pub size: u64, pub mtime_ns: i64 };
    /// Reserves disk space up to `bytes` for the file: ENOSPC if the quota or disk is full.
    M2S_RESERVE { pub vnode: String, pub ino: u64, pub bytes: u64 };
    M2S_SETSIZE { pub vnode: String, pub ino: u64, pub size: u64 };

    // ---- logger mComponent -> sComponent: backup files of logged vRegions, append-only
    /// `reset`: the file starts anew with these records, at `epoch` (of the set the logger
    /// logs for); appends of an older epoch than the file's are refused `Stale`.
    M2S_LOG_APPEND { pub file: LogFile, pub epoch: u64, pub reset: bool, pub records: Vec<LogRecord> };
    /// Up to `max` records of the file from byte `offset` on.
    M2S_LOG_READ { pub file: LogFile, pub offset: u64, pub max: u32 };
    S2M_LOG { pub records: Vec<LogRecord>, pub next: u64, pub more: bool };
    /// The file `to` becomes a copy of `from` (a forked child's vRegion), at `epoch` (refused
    /// `Stale` when older than `to`'s).
    M2S_LOG_COPY { pub from: LogFile, pub to: LogFile, pub epoch: u64 };
    /// Removes every backup file of a process that exited.
    M2S_LOG_DROP { pub vnode: String, pub pid: u64 };

    // ---- pComponent -> the mComponent holding a file's buffer cache. `scomp` is where the
    // file is stored, so the mComponent needs no other state to reach it.
    P2M_FILE_READ { pub scomp: String, pub vnode: String, pub ino: u64, pub offset: u64, pub len: u32 };
    M2P_FILE_DATA { pub data: ByteBuf };
    P2M_FILE_WRITE { pub scomp: String, pub vnode: String, pub ino: u64, pub offset: u64, pub data: ByteBuf };
    M2P_FILE_SIZE { pub size: Option<u64>, pub mtime_ns: i64 };
    P2M_FILE_SETSIZE { pub scomp: String, pub vnode: String, pub ino: u64, pub size: u64 };
    /// Writes the file's dirty blocks back and makes them durable (fsync).
    P2M_FILE_SYNC { pub scomp: String, pub vnode: String, pub ino: u64 };
    /// The file's size while its buffer cache holds it (`None`: ask the sComponent).
    P2M_FILE_STAT { pub vnode: String, pub ino: u64 };
    /// Drops a deleted file's blocks without writing them back.
    P2M_FILE_FORGET { pub vnode: String, pub ino: u64 };

    // ---- the socket stub (pComponent) <-> the global network manager (GNM)
    /// Which nComponent a socket of `vnode` lives on: the one whose interfaces hold `ip`
    /// (a bind to that address), else the vNode's own (`ip` none, unspecified or loopback).
    P2G_PICK_NET { pub vnode: String, pub ip: Option<IpAddr> };
    G2P_NET { pub ncomp: ComponentRef };

    // ---- the socket stub (pComponent) -> the proxy of an nComponent (docs/network.md).
    // A skeleton belongs to the pComponent that made it (its credentials' key): a request
    // about another's socket is refused. Socket errors come back as `ERR Errno(n)`.
    /// A socket skeleton for a program of `vnode`, run by user `uid` (who may bind ports
    /// below 1024 only if 0). `kind`: SOCK_STREAM or SOCK_DGRAM.
    P2N_SOCKET { pub vnode: String, pub uid: u32, pub family: i32, pub kind: i32, pub protocol: i32 };
    N2P_SOCKET { pub sock: u64 };
    P2N_SETSOCKOPT { pub sock: u64, pub level: i32, pub name: i32, pub value: ByteBuf };
    P2N_GETSOCKOPT { pub sock: u64, pub level: i32, pub name: i32, pub len: u32 };
    N2P_OPT { pub value: ByteBuf };
    P2N_BIND { pub sock: u64, pub addr: SocketAddr };
    /// `direct`: the pComponent's address, where programs of the vNode on other pComponents
    /// may connect to this listener without the nComponent (its shortcut is on).
    P2N_LISTEN { pub sock: u64, pub backlog: i32, pub direct: Option<String> };
    /// Which pComponent holds a listener of `vnode` that a connect to `addr` (one of this
    /// nComponent's addresses, or loopback) would reach, if it takes direct connections.
    P2N_FIND_LISTENER { pub vnode: String, pub addr: SocketAddr };
    N2P_LISTENER { pub pcomp: Option<String> };
    /// Answered with the next connection, or `ERR Errno(EAGAIN)` when none came in `wait_ms`.
    P2N_ACCEPT { pub sock: u64, pub wait_ms: u32 };
    N2P_ACCEPTED { pub sock: u64, pub peer: SocketAddr };
    /// Answered once the connection is made (the local address) or failed.
    P2N_CONNECT { pub sock: u64, pub addr: SocketAddr };
    P2N_NAME { pub sock: u64, pub peer: bool };
    N2P_ADDR { pub addr: SocketAddr };
    /// Bytes to send, carried in the request (the DDIO path). Answered once the skeleton's
    /// send queue took them; it takes none while it holds more than its bound.
    P2N_SEND { pub sock: u64, pub data: ByteBuf };
    /// Up to `max` received bytes, answered as soon as there are some, at the end of the
    /// stream (`eof`), or empty after `wait_ms`.
    P2N_RECV { pub sock: u64, pub max: u32, pub wait_ms: u32 };
    N2P_DATA { pub data: ByteBuf, pub eof: bool };
    /// shutdown(2) with `how` (SHUT_RD, SHUT_WR, SHUT_RDWR), after the queued bytes left.
    P2N_SHUTDOWN { pub sock: u64, pub how: i32 };
    P2N_CLOSE { pub sock: u64 };
    /// The DMA path: bytes to send that the stub put in socket buffer `buf` on mComponent
    /// `mcomp`, from `offset`; the nComponent fetches them from there (`N2M_NETBUF_READ`).
    P2N_SEND_DMA { pub sock: u64, pub mcomp: String, pub buf: u64, pub offset: u32, pub len: u32 };
    /// The DMA path: as `P2N_RECV`, the bytes written to socket buffer `buf` on `mcomp` at
    /// `offset` (`N2M_NETBUF_WRITE`) and only their count answered.
    P2N_RECV_DMA { pub sock: u64, pub max: u32, pub wait_ms: u32, pub mcomp: String, pub buf: u64, pub offset: u32 };
    N2P_RECEIVED { pub len: u32, pub eof: bool };
    /// A datagram socket's datagrams, sent in order; one that cannot go (no route, too big,
    /// a loopback port of another vNode) is dropped and counted, as a lost datagram.
    P2N_SENDTO { pub sock: u64, pub grams: Vec<Datagram> };
    /// A datagram socket's received datagrams, whole, at least one and then as many as fit in
    /// `max` bytes, answered as soon as there is one, or empty after `wait_ms`.
    P2N_RECVFROM { pub sock: u64, pub max: u32, pub wait_ms: u32 };
    N2P_GRAMS { pub grams: Vec<Datagram> };
    /// connect(2) of a datagram socket to AF_UNSPEC: it forgets its peer.
    P2N_DISCONNECT { pub sock: u64 };

    // ---- the shortcut between two pComponents (docs/network.md): a connection between two
    // programs of a vNode whose listener is on another pComponent. Each end has an id at its
    // pComponent, random, which is the capability to send to it.
    /// A connection from the program socket `conn` at pComponent `from` (component id
    /// `from_id`) to the listener of `vnode` that `addr` reaches here; `peer`: the connecting
    /// end's address, as it names itself. Answered with the accepted end's id and this
    /// pComponent's component id (each side ends the connection when the global managers say
    /// the other is lost).
    P2P_CONNECT { pub vnode: String, pub addr: SocketAddr, pub peer: SocketAddr, pub conn: u64, pub from: String, pub from_id: u32 };
    P2P_CONNECTED { pub conn: u64, pub id: u32 };
    /// Bytes for end `conn`: answered with how many it took now (a program that does not
    /// read takes fewer; the sender offers the rest again).
    P2P_SEND { pub conn: u64, pub data: ByteBuf };
    P2P_TAKEN { pub n: u32 };
    /// The other end shut down writing (`close`: it is gone).
    P2P_SHUTDOWN { pub conn: u64, pub close: bool };

    // ---- socket buffers on an mComponent (the DMA path). `buf` is the capability: random,
    // known only to the pComponent that allocated it and the nComponents it names it to.
    P2M_NETBUF_ALLOC { pub vnode: String, pub bytes: u32 };
    M2P_NETBUF { pub buf: u64 };
    P2M_NETBUF_FREE { pub buf: u64 };
    P2M_NETBUF_WRITE { pub buf: u64, pub offset: u32, pub data: ByteBuf };
    P2M_NETBUF_READ { pub buf: u64, pub offset: u32, pub len: u32 };
    M2P_NETBUF_DATA { pub data: ByteBuf };
    /// `owner`: the key of the pComponent whose socket asked (from its connection's
    /// handshake at the nComponent): the buffer must be that pComponent's.
    N2M_NETBUF_READ { pub owner: [u8; 32], pub buf: u64, pub offset: u32, pub len: u32 };
    M2N_NETBUF_DATA { pub data: ByteBuf };
    N2M_NETBUF_WRITE { pub owner: [u8; 32], pub buf: u64, pub offset: u32, pub data: ByteBuf };

    // ---- control client -> mComponent
    /// Fault injection (`splitos debug flip`): flips bit `bit` of the first page of the
    /// process this mComponent stores at or after `from_vpn`, and says which.
    C2M_DEBUG_FLIP { pub who: Who, pub from_vpn: u64, pub bit: u32 };
    M2C_FLIPPED { pub vpn: u64 };

    // ---- control client -> any component
    C2X_PING;
    X2C_PONG { pub role: Role, pub id: u32 };
    C2X_STATS;
    X2C_STATS { pub json: String };
    C2X_METRICS;
    X2C_METRICS { pub text: String };
    C2X_SHUTDOWN;
}

replies! {
    X2G_REGISTER => G2X_REGISTERED,
    X2G_HEARTBEAT => G2X_BEAT,
    C2G_STATUS => G2C_STATUS,
    C2G_PLACE_PROCESS => G2C_PLACED,
    P2G_PICK_HOME => G2P_HOME,
    P2G_PICK_NET => G2P_NET,
    P2N_SOCKET => N2P_SOCKET,
    P2N_SETSOCKOPT => OK,
    P2N_GETSOCKOPT => N2P_OPT,
    P2N_BIND => N2P_ADDR,
    P2N_LISTEN => OK,
    P2N_ACCEPT => N2P_ACCEPTED,
    P2N_CONNECT => N2P_ADDR,
    P2N_NAME => N2P_ADDR,
    P2N_SEND => OK,
    P2N_RECV => N2P_DATA,
    P2N_SHUTDOWN => OK,
    P2N_CLOSE => OK,
    P2N_SEND_DMA => OK,
    P2N_RECV_DMA => N2P_RECEIVED,
    P2N_SENDTO => OK,
    P2N_RECVFROM => N2P_GRAMS,
    P2N_DISCONNECT => OK,
    P2N_FIND_LISTENER => N2P_LISTENER,
    P2P_CONNECT => P2P_CONNECTED,
    P2P_SEND => P2P_TAKEN,
    P2P_SHUTDOWN => OK,
    P2M_NETBUF_ALLOC => M2P_NETBUF,
    P2M_NETBUF_FREE => OK,
    P2M_NETBUF_WRITE => OK,
    P2M_NETBUF_READ => M2P_NETBUF_DATA,
    N2M_NETBUF_READ => M2N_NETBUF_DATA,
    N2M_NETBUF_WRITE => OK,
    M2G_PICK_OWNER => G2M_OWNER,
    M2G_BACKUP_STORE => G2M_BACKUP_STORE,
    P2G_VNODE_STORAGE => G2P_STORAGE,
    P2G_FILE_CACHE => G2P_FILE_CACHE,
    P2M_PROC_CREATE => M2P_HOME,
    P2M_MMAP => M2P_MAPPED,
    P2M_MUNMAP => OK,
    P2M_MPROTECT => OK,
    P2M_MREMAP => M2P_MAPPED,
    P2M_DONTNEED => OK,
    P2M_FORK => M2P_FORKED,
    P2M_EXIT => OK,
    P2M_VREGIONS => M2P_VREGIONS,
    P2M_REPLICA_LOST => M2P_VREGIONS,
    P2M_OWNER_FULL => M2P_VREGIONS,
    P2M_HOME_TAKEOVER => M2P_HOME,
    P2M_FETCH => M2P_PAGE,
    P2M_FLUSH => OK,
    P2M_FLUSH_FETCH => M2P_PAGE,
    P2M_FETCH_MANY => M2P_PAGES,
    P2M_FLUSH_MANY => OK,
    P2M_FLUSH_FETCH_MANY => M2P_PAGES,
    P2M_RECONSTRUCT => M2P_PAGE,
    M2M_VMA_ADD => OK,
    M2M_EPOCH => OK,
    M2M_SET => OK,
    M2M_LOG_RESYNC => OK,
    M2M_PARITY => OK,
    M2M_READ_PAGES => M2M_PAGES,
    M2M_HOME_OF => OK,
    M2M_HOME_SYNC => OK,
    M2M_HOME_DROP => OK,
    M2M_VMA_REMOVE => OK,
    M2M_VMA_PROTECT => OK,
    M2M_DISCARD => OK,
    M2M_PUT_PAGES => OK,
    M2M_FORK => OK,
    M2M_EXIT => OK,
    P2S_LOOKUP => S2P_ATTR,
    X2S_GETATTR => S2P_ATTR,
    P2S_CREATE => S2P_ATTR,
    P2S_SETATTR => S2P_ATTR,
    P2S_LINK => S2P_ATTR,
    P2S_READLINK => S2P_TARGET,
    P2S_UNLINK => S2P_DETACHED,
    P2S_RENAME => S2P_DETACHED,
    P2S_READDIR => S2P_ENTRIES,
    P2S_DROP => OK,
    P2S_STATFS => S2P_STATFS,
    X2S_SYNC => OK,
    M2S_READ => S2M_DATA,
    M2S_WRITE => OK,
    M2S_RESERVE => OK,
    M2S_SETSIZE => OK,
    M2S_LOG_APPEND => OK,
    M2S_LOG_READ => S2M_LOG,
    M2S_LOG_COPY => OK,
    M2S_LOG_DROP => OK,
    P2M_FILE_READ => M2P_FILE_DATA,
    P2M_FILE_WRITE => M2P_FILE_SIZE,
    P2M_FILE_SETSIZE => M2P_FILE_SIZE,
    P2M_FILE_SYNC => OK,
    P2M_FILE_STAT => M2P_FILE_SIZE,
    P2M_FILE_FORGET => OK,
    C2M_DEBUG_FLIP => M2C_FLIPPED,
    C2X_PING => X2C_PONG,
    C2X_STATS => X2C_STATS,
    C2X_METRICS => X2C_METRICS,
    C2X_SHUTDOWN => OK,
}

impl ERR {
    pub fn new(code: ErrCode, msg: impl Into<String>) -> ERR {
        ERR { code, msg: msg.into() }
    }
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

#[cfg(test)]
mod role_tests {
    use super::*;

    #[test]
    fn each_request_is_accepted_from_the_roles_its_name_says_and_only_those() {
        let who = || Who::new("v", 1);
        let cases: Vec<(Msg, &[Role])> = vec![
            (P2M_FETCH { who: who(), vpn: 1 }.into(), &[Role::Proc, Role::Admin]),
            (M2M_EXIT { who: who() }.into(), &[Role::Mem, Role::Admin]),
            (M2S_SETSIZE { vnode: "v".into(), ino: 1, size: 0 }.into(), &[Role::Mem, Role::Admin]),
            (P2S_STATFS { vnode: "v".into() }.into(), &[Role::Proc, Role::Admin]),
            (X2G_HEARTBEAT { id: 1, addr: "a".into(), load: Load::default() }.into(), &[Role::Gm, Role::Proc, Role::Mem, Role::Storage, Role::Net, Role::Admin]),
            (P2N_CLOSE { sock: 1 }.into(), &[Role::Proc, Role::Admin]),
            (C2X_SHUTDOWN.into(), &[Role::Admin]),
            (C2G_STATUS.into(), &[Role::Admin]),
            (M2G_PICK_OWNER { bytes: 1, exclude: Vec::new() }.into(), &[Role::Mem, Role::Admin]),
            (OK.into(), &[]),
            (X2C_PONG { role: Role::Mem, id: 1 }.into(), &[]),
        ];
        for (msg, allowed) in cases {
            for role in Role::ALL {
                assert_eq!(may_send(role, &msg), allowed.contains(&role), "{} from {}", msg.name(), role.name());
            }
        }
        let receivers: Vec<(Msg, &[Role])> = vec![
            (P2M_FETCH { who: who(), vpn: 1 }.into(), &[Role::Mem]),
            (M2S_SETSIZE { vnode: "v".into(), ino: 1, size: 0 }.into(), &[Role::Storage]),
            (X2G_HEARTBEAT { id: 1, addr: "a".into(), load: Load::default() }.into(), &[Role::Gm]),
            (P2N_SEND { sock: 1, data: ByteBuf::new() }.into(), &[Role::Net]),
            (C2G_STATUS.into(), &[Role::Gm]),
            (C2X_SHUTDOWN.into(), &[Role::Gm, Role::Proc, Role::Mem, Role::Storage, Role::Net]),
        ];
        for (msg, allowed) in receivers {
            for role in Role::ALL {
                assert_eq!(may_receive(role, &msg), allowed.contains(&role), "{} to {}", msg.name(), role.name());
            }
        }
    }
}
