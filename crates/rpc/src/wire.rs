//! The splitos wire format, version 2. This file is the one place it is defined; docs/wire.md
//! describes it for people.
//!
//! Every frame is a 24-byte little-endian [`FrameHeader`] followed by `len` bytes of body, the
//! postcard encoding of one [`Msg`]. Message names say who sends them to whom:
//! `P` processor monitor (pComponent), `M` memory monitor (mComponent), `S` storage monitor
//! (sComponent), `G` global managers,
//! `C` a control client (the CLI), `X` any component. `P2M_FETCH` goes from a pComponent to an
//! mComponent. Replies use the same frame with kind `Reply`; a refused request gets `ERR`.
#![allow(non_camel_case_types)]

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// "SPOS" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SPOS");
/// Version 2 added storage: the sComponent role, file messages and `ErrCode::Errno`.
pub const WIRE_VERSION: u16 = 2;
/// Bound on a frame body. Large enough for a batch of 256 pages, small enough that a bogus
/// length cannot make a receiver allocate much.
pub const MAX_BODY: u32 = 2 << 20;
pub const PAGE_SIZE: usize = 4096;

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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Gm,
    Proc,
    Mem,
    Storage,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Gm => "global-managers",
            Role::Proc => "pcomponent",
            Role::Mem => "mcomponent",
            Role::Storage => "scomponent",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentRef {
    pub id: u32,
    pub addr: String,
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
    pub load: Load,
    pub alive: bool,
    pub since_heartbeat_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VregionOwner {
    pub index: u64,
    pub owner: ComponentRef,
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

#[derive(Clone, Debug, Serialize, Deserialize, strum::IntoStaticStr)]
pub enum Msg {
    // ---- generic replies
    OK,
    ERR { code: ErrCode, msg: String },

    // ---- any component <-> global managers (GPM, GMM)
    X2G_REGISTER { role: Role, addr: String, shim_sock: Option<String>, load: Load },
    G2X_REGISTERED { id: u32, vregion_size: u64 },
    X2G_HEARTBEAT { id: u32, load: Load },
    C2G_STATUS,
    G2C_STATUS { components: Vec<ComponentInfo>, vregion_size: u64 },
    /// GPM: which pComponent runs a new process (the one with the fewest threads).
    C2G_PLACE_PROCESS,
    G2C_PLACED { pcomp: ComponentInfo },
    /// GMM: which mComponent is home of a new process.
    P2G_PICK_HOME,
    G2P_HOME { mcomp: ComponentRef },
    /// GMM: which mComponent owns a newly active vRegion.
    M2G_PICK_OWNER { bytes: u64 },
    G2M_OWNER { mcomp: ComponentRef },
    /// GSM: which sComponent stores a vNode's files.
    P2G_VNODE_STORAGE { vnode: String },
    G2P_STORAGE { scomp: ComponentRef },
    /// GMM: which mComponent holds the buffer cache of one file.
    P2G_FILE_CACHE { vnode: String, ino: u64 },
    G2P_FILE_CACHE { mcomp: ComponentRef },

    // ---- pComponent -> home mComponent: virtual memory calls of a process
    P2M_PROC_CREATE { who: Who, region_base: u64, region_size: u64 },
    P2M_MMAP { who: Who, hint: u64, len: u64, prot: u32, fixed: bool },
    M2P_MAPPED { addr: u64, prot: u32, owners: Vec<VregionOwner> },
    P2M_MUNMAP { who: Who, addr: u64, len: u64 },
    P2M_MPROTECT { who: Who, addr: u64, len: u64, prot: u32 },
    P2M_MREMAP { who: Who, old: u64, old_len: u64, new_len: u64, may_move: bool, fixed_to: Option<u64> },
    P2M_DONTNEED { who: Who, addr: u64, len: u64 },
    P2M_FORK { parent: Who, child: u64 },
    M2P_FORKED { vmas: Vec<VmaInfo>, owners: Vec<VregionOwner> },
    P2M_EXIT { who: Who },
    P2M_VREGION { who: Who, index: u64 },
    M2P_VREGION { owner: Option<ComponentRef> },

    // ---- pComponent -> vRegion owner: the ExCache data path
    P2M_FETCH { who: Who, vpn: u64 },
    M2P_PAGE { data: ByteBuf },
    P2M_FLUSH { who: Who, vpn: u64, data: ByteBuf },
    /// A dirty victim and a miss to the same owner in one round trip (LegoOS piggyback). The
    /// victim may belong to another process of the same pComponent.
    P2M_FLUSH_FETCH { who: Who, fetch_vpn: u64, flush_who: Who, flush_vpn: u64, data: ByteBuf },

    // ---- home mComponent -> vRegion owner
    M2M_VMA_ADD { who: Who, start: u64, end: u64, prot: u32 },
    M2M_VMA_REMOVE { who: Who, start: u64, end: u64 },
    M2M_VMA_PROTECT { who: Who, start: u64, end: u64, prot: u32 },
    M2M_DISCARD { who: Who, start: u64, end: u64 },
    /// Remove and return up to `max` materialized pages of a range (mremap moving a mapping).
    M2M_TAKE_PAGES { who: Who, start: u64, end: u64, max: u32 },
    M2M_PAGES { pages: Vec<(u64, ByteBuf)>, more: bool },
    M2M_PUT_PAGES { who: Who, pages: Vec<(u64, ByteBuf)> },
    M2M_FORK { parent: Who, child: u64, start: u64, end: u64 },
    M2M_EXIT { who: Who },

    // ---- pComponent -> sComponent: the namespace of a vNode. Every request names the vNode and a
    // full path (or, for an inode that may have no name left, its number), like NFS v2.
    P2S_LOOKUP { vnode: String, path: String },
    S2P_ATTR { attr: FileAttr },
    X2S_GETATTR { vnode: String, ino: u64 },
    /// Creates a file, directory or symlink (`target`); `excl` fails with EEXIST if the name
    /// exists, otherwise an existing regular file is returned as it is.
    P2S_CREATE { vnode: String, path: String, kind: FileKind, perm: u32, uid: u32, gid: u32, excl: bool, target: Option<String> },
    P2S_SETATTR { vnode: String, ino: u64, set: SetAttr },
    /// A further name for a file (a hard link).
    P2S_LINK { vnode: String, ino: u64, to: String },
    P2S_READLINK { vnode: String, ino: u64 },
    S2P_TARGET { target: String },
    /// Removes a name. An inode that loses its last name is detached (kept, with its data)
    /// until `P2S_DROP`: a program may still have it open.
    P2S_UNLINK { vnode: String, path: String, dir: bool },
    S2P_DETACHED { ino: Option<u64> },
    /// Renames; an existing target is replaced (and detached, as by `P2S_UNLINK`) unless
    /// `noreplace`.
    P2S_RENAME { vnode: String, from: String, to: String, noreplace: bool },
    P2S_READDIR { vnode: String, path: String, after: Option<String> },
    S2P_ENTRIES { entries: Vec<DirEntry>, more: bool },
    P2S_DROP { vnode: String, ino: u64 },
    P2S_STATFS { vnode: String },
    S2P_STATFS { quota: u64, used: u64, files: u64 },
    /// Makes the data of `ino` (if given) and every namespace change so far durable.
    X2S_SYNC { vnode: String, ino: Option<u64> },

    // ---- mComponent (buffer cache) -> sComponent: file data by inode and absolute offset
    M2S_READ { vnode: String, ino: u64, offset: u64, len: u32 },
    S2M_DATA { data: ByteBuf },
    /// Writes back dirty data; `size` is the file's size as the buffer cache knows it.
    M2S_WRITE { vnode: String, ino: u64, offset: u64, data: ByteBuf, size: u64 },
    /// Reserves disk space up to `bytes` for the file: ENOSPC if the quota or disk is full.
    M2S_RESERVE { vnode: String, ino: u64, bytes: u64 },
    M2S_SETSIZE { vnode: String, ino: u64, size: u64 },

    // ---- pComponent -> the mComponent holding a file's buffer cache. `scomp` is where the
    // file is stored, so the mComponent needs no other state to reach it.
    P2M_FILE_READ { scomp: String, vnode: String, ino: u64, offset: u64, len: u32 },
    M2P_FILE_DATA { data: ByteBuf },
    P2M_FILE_WRITE { scomp: String, vnode: String, ino: u64, offset: u64, data: ByteBuf },
    M2P_FILE_SIZE { size: Option<u64>, mtime_ns: i64 },
    P2M_FILE_SETSIZE { scomp: String, vnode: String, ino: u64, size: u64 },
    /// Writes the file's dirty blocks back and makes them durable (fsync).
    P2M_FILE_SYNC { scomp: String, vnode: String, ino: u64 },
    /// The file's size while its buffer cache holds it (`None`: ask the sComponent).
    P2M_FILE_STAT { vnode: String, ino: u64 },
    /// Drops a deleted file's blocks without writing them back.
    P2M_FILE_FORGET { vnode: String, ino: u64 },

    // ---- control client -> pComponent
    /// Mounts the vNode's file system on this pComponent (if not yet) and says where.
    C2P_MOUNT_VNODE { vnode: String },
    P2C_MOUNTED { dir: String },

    // ---- control client -> any component
    C2X_PING,
    X2C_PONG { role: Role, id: u32 },
    C2X_STATS,
    X2C_STATS { json: String },
    C2X_METRICS,
    X2C_METRICS { text: String },
    C2X_SHUTDOWN,
    C2P_RUN_STATS { run_id: u64 },
}

impl Msg {
    pub fn err(code: ErrCode, msg: impl Into<String>) -> Msg {
        Msg::ERR { code, msg: msg.into() }
    }

    /// The message's wire name, for logs and errors.
    pub fn name(&self) -> &'static str {
        self.into()
    }
}
