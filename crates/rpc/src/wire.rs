//! The splitos wire format, version 1. This file is the one place it is defined; docs/wire.md
//! describes it for people.
//!
//! Every frame is a 24-byte little-endian [`FrameHeader`] followed by `len` bytes of body, the
//! postcard encoding of one [`Msg`]. Message names say who sends them to whom:
//! `P` processor monitor (pComponent), `M` memory monitor (mComponent), `G` global managers,
//! `C` a control client (the CLI), `X` any component. `P2M_FETCH` goes from a pComponent to an
//! mComponent. Replies use the same frame with kind `Reply`; a refused request gets `ERR`.
#![allow(non_camel_case_types)]

use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// "SPOS" read as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SPOS");
pub const WIRE_VERSION: u16 = 1;
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
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Gm => "global-managers",
            Role::Proc => "pcomponent",
            Role::Mem => "mcomponent",
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
