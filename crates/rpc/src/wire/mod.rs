//! The splitos wire format, version [`WIRE_VERSION`]. This module is the one place it is
//! defined; docs/wire.md describes it for people.
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
//!
//! This file holds the frame, the protocol constants, the rules of who may send and receive a
//! message, and [`Msg`]: the table of every message in the order that gives each its number
//! on the wire, with each request's reply type. The message types, and the data they carry,
//! are in submodules by the monitors they go between: `cluster` (every component and the
//! control client with the global managers, the control client with every component),
//! `memory` (pComponents with mComponents, and mComponents with each other), `storage` (the
//! vNode file system and the backup logs: with sComponents and buffer caches) and `network`
//! (the socket stub with the GNM, nComponents, socket buffers and other pComponents).
#![allow(non_camel_case_types)]

use serde::{Deserialize, Serialize};
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
/// Version 19 added elastic memory: detaching an mComponent (`Leaving`, `G2X_BEAT.leaving`,
/// `M2M_HOME_ADOPT`, `M2P_HOME_MOVED`, `M2G_FIND`, `ErrCode::Moved`) and `G2X_STATS` (`cluster
/// status` through the REST API).
/// Version 20 added `M2P_HOME_MOVED.from` (only the current home gives a process away),
/// `G2X_BEAT.rebalance` (background rebalancing) and a
/// running ExCache resized and shared among vNodes (`G2P_SET_EXCACHE`, `P2G_EXCACHE`,
/// `ExcacheShare`).
/// Version 21 added the credit frame; version 22 credits on shared-memory channels (the
/// channel header's `credits`, and a caller refused a channel beyond them).
/// Version 23 added a running pComponent's policies replaced (`G2P_SET_POLICY`, `P2G_POLICY`).
/// Version 24 added the Ebb messenger (`X2X_EBB_MESSAGE`) and the global id map
/// (`X2G_EBB_FIND`, the `ebbs` of registrations and heartbeats); a pComponent's policies are
/// now replaced through it, not by `G2P_SET_POLICY`.
/// Version 25 added several global managers with one leader: `ErrCode::NotLeader`,
/// `X2G_WHO_LEADS`, and the `leader` and `managers` of `G2C_STATUS`.
/// Version 26 added room kept for vNodes' memory quotas: `G2X_BEAT.keep` and
/// `M2M_VMA_ADD.quota`.
/// Version 27 added every manager's REST API address, `G2C_STATUS.apis`, and `G2P_CORDON`:
/// the managers tell a pComponent its cordon at once.
/// Version 28 told fences until they are acted on: `G2X_BEAT.fence` and
/// `G2X_REGISTERED.fence` (a number, where `fenced` was a flag), named back in
/// `X2G_HEARTBEAT.fenced_by` and `X2G_REGISTER.fenced_by`; and `X2G_REGISTER.start`.
/// Version 29 added the heartbeat period the managers tell: `G2X_BEAT.beat_ms` and
/// `G2X_REGISTERED.beat_ms`.
/// Version 30 numbered a process's creations, `P2M_PROC_CREATE.attempt`, and undoes one given
/// up with `P2M_CREATE_UNDO` (an exit had ended the process for good, so that a creation sent
/// again to the same home was refused).
pub const WIRE_VERSION: u16 = 30;
/// Bound on a frame body. Large enough for a batch of 256 pages, small enough that a bogus
/// length cannot make a receiver allocate much.
pub const MAX_BODY: u32 = 2 << 20;
/// A page of the ExCache, of a vRegion owner and of the buffer cache.
pub const PAGE_SIZE: usize = 4096;
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
    /// The receiver's grant of credits (TCP): how many requests the connection may have in
    /// flight, in `req_id`; the body is `OK`. Sent when a connection begins to be served.
    Credit = 2,
}

impl FrameKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(FrameKind::Request),
            1 => Some(FrameKind::Reply),
            2 => Some(FrameKind::Credit),
            _ => None,
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
    let Some((from, _)) = msg.name().split_once('2') else {
        return false;
    };
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
    let Some((_, rest)) = msg.name().split_once('2') else {
        return false;
    };
    match (rest.chars().next(), role) {
        (Some('P'), Role::Proc)
        | (Some('M'), Role::Mem)
        | (Some('S'), Role::Storage)
        | (Some('N'), Role::Net)
        | (Some('G'), Role::Gm) => true,
        (Some('X'), r) => r != Role::Admin,
        _ => false,
    }
}

/// The refusal of a call to a peer that does not handle it ([`may_receive`]).
pub fn wrong_receiver(addr: &str, role: Role, msg: &Msg) -> crate::RpcError {
    crate::RpcError::Unreachable {
        addr: addr.to_string(),
        why: format!("it is a {}, which does not handle {}", role.name(), msg.name()),
    }
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
    /// The receiver gave up what the request is about (a leaving mComponent's buffer cache):
    /// the sender asks the global managers where it went.
    Moved,
    /// The global manager asked does not lead (or no longer): the sender asks the managers it
    /// knows `X2G_WHO_LEADS` and sends again to the leader.
    NotLeader,
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
            ErrCode::Unreachable
            | ErrCode::Internal
            | ErrCode::Stale
            | ErrCode::ParityLost
            | ErrCode::Moved
            | ErrCode::NotLeader => libc::EIO,
            ErrCode::Errno(n) => n,
        }
    }
}

/// Defines message types, each a struct of the fields given (none: a unit struct), for
/// [`messages!`] to gather into [`Msg`]. Only the submodules and `OK`/`ERR` use it.
macro_rules! message_types {
    (@def $(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
        pub struct $name;
    };
    (@def $(#[$m:meta])* $name:ident { $($body:tt)* }) => {
        $(#[$m])*
        #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
        pub struct $name { $($body)* }
    };
    ($( $(#[$m:meta])* $name:ident $({ $($body:tt)* })? ; )*) => {
        $( message_types!(@def $(#[$m])* $name $({ $($body)* })?); )*
    };
}

mod cluster;
mod memory;
mod network;
mod storage;

pub use cluster::*;
pub use memory::*;
pub use network::*;
pub use storage::*;

/// Makes [`Msg`] the union of the message types listed. A message travels as its index in the
/// list, then its fields in the order its type declares them, exactly as if it were a struct
/// variant of `Msg`; the order of the list is therefore part of the wire format.
macro_rules! messages {
    ($($name:ident),* $(,)?) => {
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
pub trait Request: Into<Msg> + Clone {
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

message_types! {
    // ---- generic replies
    OK;
    ERR { pub code: ErrCode, pub msg: String };
}

messages! {
    // ---- generic replies
    OK, ERR,
    // ---- any component <-> global managers (GPM, GMM), in cluster.rs
    X2G_REGISTER, G2X_REGISTERED, X2G_HEARTBEAT, G2X_BEAT, C2G_STATUS, G2C_STATUS,
    C2G_PLACE_PROCESS, G2C_PLACED, P2G_PICK_HOME, G2P_HOME, M2G_PICK_OWNER, G2M_OWNER,
    M2G_BACKUP_STORE, G2M_BACKUP_STORE, P2G_VNODE_STORAGE, G2P_STORAGE, P2G_FILE_CACHE,
    G2P_FILE_CACHE, C2G_TOKEN_CREATE, G2C_TOKEN, C2G_TOKEN_LIST, G2C_TOKENS, C2G_TOKEN_REVOKE,
    G2P_JOBS, P2G_JOBS, G2P_SIGNAL, G2P_CORDON, G2P_SET_EXCACHE, P2G_EXCACHE, X2G_API_TOKEN, G2X_API_PRINCIPAL, G2X_METRICS, X2G_METRICS, G2X_STATS, X2G_STATS, P2G_VNODES, G2P_VNODES, M2G_FIND, G2M_FOUND,
    X2G_EBB_FIND, G2X_EBB_MAP, X2G_WHO_LEADS, G2X_LEADER,
    // ---- the Ebb messenger: any component (or the admin's tools) -> any component, in cluster.rs
    X2X_EBB_MESSAGE, X2X_EBB_ANSWER,
    // ---- pComponent -> home mComponent: virtual memory calls of a process, in memory.rs
    P2M_PROC_CREATE, M2P_HOME, P2M_MMAP, M2P_MAPPED, P2M_MUNMAP, P2M_MPROTECT, P2M_MREMAP,
    P2M_DONTNEED, P2M_FORK, M2P_FORKED, P2M_EXIT, P2M_CREATE_UNDO, P2M_VREGIONS, M2P_VREGIONS, P2M_REPLICA_LOST,
    P2M_OWNER_FULL, P2M_HOME_TAKEOVER,
    // ---- pComponent -> vRegion owner: the ExCache data path, in memory.rs
    P2M_FETCH, M2P_PAGE, P2M_PROBE_LINK, M2P_PROBED, P2M_FLUSH, P2M_FLUSH_FETCH, P2M_FETCH_MANY, M2P_PAGES,
    P2M_FLUSH_FETCH_MANY, P2M_FLUSH_MANY, P2M_RECONSTRUCT, P2M_LEASE, M2P_LEASE,
    // ---- home mComponent -> vRegion owner, in memory.rs
    M2M_VMA_ADD, M2M_EPOCH, M2M_READ_PAGES, M2M_SET, M2M_LOG_RESYNC, M2M_PARITY, M2M_HOME_OF,
    M2M_HOME_SYNC, M2M_HOME_DROP, M2M_VMA_REMOVE, M2M_VMA_PROTECT, M2M_DISCARD, M2M_PAGES,
    M2M_PUT_PAGES, M2M_FORK, M2M_EXIT, M2M_HOME_ADOPT, M2M_HOME_ADOPTED, M2P_HOME_MOVED,
    // ---- pComponent -> sComponent: the namespace of a vNode, in storage.rs
    P2S_LOOKUP, S2P_ATTR, X2S_GETATTR, P2S_CREATE, P2S_SETATTR, P2S_LINK, P2S_READLINK, S2P_TARGET,
    P2S_UNLINK, S2P_DETACHED, P2S_RENAME, P2S_READDIR, S2P_ENTRIES, P2S_DROP, P2S_STATFS,
    S2P_STATFS, X2S_SYNC,
    // ---- mComponent (buffer cache) -> sComponent: file data, in storage.rs
    M2S_READ, S2M_DATA, M2S_WRITE, M2S_RESERVE, M2S_SETSIZE,
    // ---- logger mComponent -> sComponent: backup files of logged vRegions, in storage.rs
    M2S_LOG_APPEND, M2S_LOG_READ, S2M_LOG, M2S_LOG_COPY, M2S_LOG_DROP,
    // ---- pComponent -> the mComponent holding a file's buffer cache, in storage.rs
    P2M_FILE_READ, M2P_FILE_DATA, P2M_FILE_WRITE, M2P_FILE_SIZE, P2M_FILE_SETSIZE, P2M_FILE_SYNC,
    P2M_FILE_STAT, P2M_FILE_FORGET,
    // ---- the socket stub (pComponent) <-> the global network manager (GNM), in network.rs
    P2G_PICK_NET, G2P_NET,
    // ---- the socket stub (pComponent) -> the proxy of an nComponent, in network.rs
    P2N_SOCKET, N2P_SOCKET, P2N_SETSOCKOPT, P2N_GETSOCKOPT, N2P_OPT, P2N_BIND, P2N_LISTEN,
    P2N_FIND_LISTENER, N2P_LISTENER, P2N_ACCEPT, N2P_ACCEPTED, P2N_CONNECT, P2N_NAME, N2P_ADDR,
    P2N_SEND, P2N_RECV, N2P_DATA, P2N_SHUTDOWN, P2N_CLOSE, P2N_SEND_DMA, P2N_RECV_DMA, N2P_RECEIVED,
    P2N_SENDTO, P2N_RECVFROM, N2P_GRAMS, P2N_DISCONNECT,
    // ---- the shortcut between two pComponents, in network.rs
    P2P_CONNECT, P2P_CONNECTED, P2P_SEND, P2P_TAKEN, P2P_SHUTDOWN,
    // ---- socket buffers on an mComponent (the DMA path), in network.rs
    P2M_NETBUF_ALLOC, M2P_NETBUF, P2M_NETBUF_FREE, P2M_NETBUF_WRITE, P2M_NETBUF_READ,
    M2P_NETBUF_DATA, N2M_NETBUF_READ, M2N_NETBUF_DATA, N2M_NETBUF_WRITE,
    // ---- control client -> mComponent, in memory.rs
    C2M_DEBUG_FLIP, M2C_FLIPPED,
    // ---- control client -> any component, in cluster.rs
    C2X_PING, X2C_PONG, C2X_STATS, X2C_STATS, C2X_METRICS, X2C_METRICS, C2X_SHUTDOWN,
}

replies! {
    X2G_REGISTER => G2X_REGISTERED,
    X2G_HEARTBEAT => G2X_BEAT,
    C2G_STATUS => G2C_STATUS,
    C2G_TOKEN_CREATE => G2C_TOKEN,
    C2G_TOKEN_LIST => G2C_TOKENS,
    C2G_TOKEN_REVOKE => OK,
    G2P_JOBS => P2G_JOBS,
    X2G_API_TOKEN => G2X_API_PRINCIPAL,
    P2G_VNODES => G2P_VNODES,
    G2X_METRICS => X2G_METRICS,
    G2P_SIGNAL => OK,
    G2P_CORDON => OK,
    G2P_SET_EXCACHE => P2G_EXCACHE,
    X2G_EBB_FIND => G2X_EBB_MAP,
    X2G_WHO_LEADS => G2X_LEADER,
    X2X_EBB_MESSAGE => X2X_EBB_ANSWER,
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
    P2M_CREATE_UNDO => OK,
    P2M_VREGIONS => M2P_VREGIONS,
    P2M_REPLICA_LOST => M2P_VREGIONS,
    P2M_OWNER_FULL => M2P_VREGIONS,
    P2M_HOME_TAKEOVER => M2P_HOME,
    P2M_FETCH => M2P_PAGE,
    P2M_PROBE_LINK => M2P_PROBED,
    P2M_FLUSH => OK,
    P2M_FLUSH_FETCH => M2P_PAGE,
    P2M_FETCH_MANY => M2P_PAGES,
    P2M_FLUSH_MANY => OK,
    P2M_FLUSH_FETCH_MANY => M2P_PAGES,
    P2M_RECONSTRUCT => M2P_PAGE,
    P2M_LEASE => M2P_LEASE,
    M2M_VMA_ADD => OK,
    M2M_EPOCH => OK,
    M2M_SET => OK,
    M2M_LOG_RESYNC => OK,
    M2M_PARITY => OK,
    M2M_READ_PAGES => M2M_PAGES,
    M2M_HOME_OF => OK,
    M2M_HOME_SYNC => OK,
    M2M_HOME_DROP => OK,
    M2M_HOME_ADOPT => M2M_HOME_ADOPTED,
    M2P_HOME_MOVED => OK,
    M2G_FIND => G2M_FOUND,
    G2X_STATS => X2G_STATS,
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
mod role_tests {
    use super::*;
    use serde_bytes::ByteBuf;

    #[test]
    fn each_request_is_accepted_from_the_roles_its_name_says_and_only_those() {
        let who = || Who::new("v", 1);
        let cases: Vec<(Msg, &[Role])> = vec![
            (P2M_FETCH { who: who(), vpn: 1 }.into(), &[Role::Proc, Role::Admin]),
            (M2M_EXIT { who: who() }.into(), &[Role::Mem, Role::Admin]),
            (
                M2S_SETSIZE {
                    vnode: "v".into(),
                    ino: 1,
                    size: 0,
                }
                .into(),
                &[Role::Mem, Role::Admin],
            ),
            (P2S_STATFS { vnode: "v".into() }.into(), &[Role::Proc, Role::Admin]),
            (
                X2G_HEARTBEAT {
                    id: 1,
                    addr: "a".into(),
                    load: Load::default(),
                    links: Vec::new(),
                    leaving: None,
                    ebbs: Vec::new(),
                    fenced_by: 0,
                }
                .into(),
                &[Role::Gm, Role::Proc, Role::Mem, Role::Storage, Role::Net, Role::Admin],
            ),
            (P2N_CLOSE { sock: 1 }.into(), &[Role::Proc, Role::Admin]),
            (C2X_SHUTDOWN.into(), &[Role::Admin]),
            (C2G_STATUS.into(), &[Role::Admin]),
            (
                C2G_TOKEN_CREATE {
                    name: "t".into(),
                    admin: true,
                    vnodes: Vec::new(),
                }
                .into(),
                &[Role::Admin],
            ),
            (C2G_TOKEN_REVOKE { name: "t".into() }.into(), &[Role::Admin]),
            (G2P_SIGNAL { pid: 1, signal: 15 }.into(), &[Role::Gm, Role::Admin]),
            (G2P_CORDON { cordoned: true }.into(), &[Role::Gm, Role::Admin]),
            (
                G2P_SET_EXCACHE {
                    size: Some(1 << 20),
                    shares: None,
                }
                .into(),
                &[Role::Gm, Role::Admin],
            ),
            (
                X2X_EBB_MESSAGE {
                    ebb: EBB_EXCACHE_POLICIES,
                    to: None,
                    body: ByteBuf::new(),
                }
                .into(),
                &Role::ALL,
            ),
            (X2G_EBB_FIND { ebb: None }.into(), &Role::ALL),
            (X2G_WHO_LEADS.into(), &Role::ALL),
            (
                M2G_PICK_OWNER {
                    bytes: 1,
                    exclude: Vec::new(),
                    near: 0,
                }
                .into(),
                &[Role::Mem, Role::Admin],
            ),
            (OK.into(), &[]),
            (X2C_PONG { role: Role::Mem, id: 1 }.into(), &[]),
        ];
        for (msg, allowed) in cases {
            for role in Role::ALL {
                assert_eq!(
                    may_send(role, &msg),
                    allowed.contains(&role),
                    "{} from {}",
                    msg.name(),
                    role.name()
                );
            }
        }
        let receivers: Vec<(Msg, &[Role])> = vec![
            (P2M_FETCH { who: who(), vpn: 1 }.into(), &[Role::Mem]),
            (
                M2S_SETSIZE {
                    vnode: "v".into(),
                    ino: 1,
                    size: 0,
                }
                .into(),
                &[Role::Storage],
            ),
            (
                X2G_HEARTBEAT {
                    id: 1,
                    addr: "a".into(),
                    load: Load::default(),
                    links: Vec::new(),
                    leaving: None,
                    ebbs: Vec::new(),
                    fenced_by: 0,
                }
                .into(),
                &[Role::Gm],
            ),
            (
                P2N_SEND {
                    sock: 1,
                    data: ByteBuf::new(),
                }
                .into(),
                &[Role::Net],
            ),
            (C2G_STATUS.into(), &[Role::Gm]),
            (G2P_JOBS.into(), &[Role::Proc]),
            (
                C2X_SHUTDOWN.into(),
                &[Role::Gm, Role::Proc, Role::Mem, Role::Storage, Role::Net],
            ),
            (
                X2X_EBB_MESSAGE {
                    ebb: EBB_EXCACHE_POLICIES,
                    to: None,
                    body: ByteBuf::new(),
                }
                .into(),
                &[Role::Gm, Role::Proc, Role::Mem, Role::Storage, Role::Net],
            ),
            (X2G_EBB_FIND { ebb: None }.into(), &[Role::Gm]),
        ];
        for (msg, allowed) in receivers {
            for role in Role::ALL {
                assert_eq!(
                    may_receive(role, &msg),
                    allowed.contains(&role),
                    "{} to {}",
                    msg.name(),
                    role.name()
                );
            }
        }
    }
}
