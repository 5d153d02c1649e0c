//! Messages between every component and the global managers (registration, heartbeats,
//! placement) and from the control client to every component, with the data they carry.
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::net::IpAddr;

use super::{ErrCode, Overcommit, Replication, Role};
use crate::RpcError;

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
    /// Bytes unavailable to new mappings and vRegions (mComponent): held by pages, promised
    /// to mappings, or kept for vNodes' memory quotas.
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
    /// Where it serves its Prometheus metrics over HTTP, if it does.
    #[serde(default)]
    pub metrics: Option<String>,
    /// Cordoned by the admin: it takes no new programs (pComponent) or homes and vRegions
    /// (mComponent); what it has keeps running.
    #[serde(default)]
    pub cordoned: bool,
    /// An mComponent being detached: its vRegions and homes move to others while programs
    /// run, and it exits once it holds nothing (docs/elastic-memory.md).
    #[serde(default)]
    pub leaving: Option<Leaving>,
}

/// How far the detach of an mComponent has come, as its own heartbeats say.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leaving {
    /// Bytes of pages and parity it held when the detach began, and holds now.
    pub bytes_at_start: u64,
    pub bytes_left: u64,
    /// Processes it is still home of, home copies it keeps as a backup, processes it still
    /// holds memory of, and socket buffers still in use on it.
    pub homes: u32,
    pub backups: u32,
    pub processes: u32,
    pub socket_buffers: u32,
    /// Its buffer cache was written back and now refuses file requests (they go elsewhere).
    pub files_released: bool,
    /// Exit when empty (`memory detach`), or stay, empty and cordoned (`cluster drain`).
    pub exit: bool,
    /// Why it cannot go on, if it cannot (no room elsewhere): everything keeps working and
    /// it is tried again.
    pub stuck: Option<String>,
}

impl Leaving {
    /// Whether nothing is left on it.
    pub fn empty(&self) -> bool {
        self.bytes_left == 0
            && self.homes == 0
            && self.backups == 0
            && self.processes == 0
            && self.socket_buffers == 0
            && self.files_released
    }
}

/// Bytes of a pComponent's ExCache that a vNode keeps against other vNodes' misses while it
/// holds no more (`bytes`), and what its processes hold now (`used`; ignored in a request).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExcacheShare {
    pub vnode: String,
    pub bytes: u64,
    pub used: u64,
}

/// An API token as the global managers list it: never its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    pub name: String,
    pub admin: bool,
    pub vnodes: Vec<String>,
    /// When it was created, in seconds since the Unix epoch.
    pub created_unix_s: u64,
}

/// A vNode the admin made (a `[[vnode]]` table, or the REST API): who may use it, by names
/// or numeric ids that each pComponent resolves on its host, and its memory quota.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VnodeInfo {
    pub name: String,
    pub users: Vec<String>,
    pub groups: Vec<String>,
    /// Bytes all its processes together may map writable; none: no quota.
    pub memory: Option<u64>,
}

/// A program running on a pComponent, as the control plane lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    /// Its process id in the cluster.
    pub pid: u64,
    /// Its process id on the pComponent's host.
    pub os_pid: i32,
    pub uid: u32,
    /// Its user's name on that host ("" if the host has none for `uid`).
    pub user: String,
    pub vnode: String,
    /// Its command line as the host's /proc shows it, arguments separated by spaces.
    pub command: String,
    /// When the pComponent took it on, in seconds since the Unix epoch.
    pub started_unix_s: u64,
    /// Counters of its run (every process one `splitos run` started): misses served,
    /// lines evicted, lines written back.
    pub misses: u64,
    pub evictions: u64,
    pub writebacks: u64,
}

/// One link as the component using it measured it (off the data path, by probes): the round
/// trip of a small request and the rate a large reply arrived at.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkSample {
    /// The component at the other end.
    pub peer: u32,
    /// The shortest round trip of a few small requests, in nanoseconds.
    pub rtt_ns: u64,
    /// Bytes per second of a large reply, its round trip's latency taken off.
    pub bytes_per_s: u64,
    /// How long ago it was measured, in milliseconds.
    pub age_ms: u64,
}

/// An Ebb a component serves messages of: its static id and its name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EbbServed {
    pub id: u32,
    pub name: String,
}

/// One entry of the global id map: an Ebb and the live components that serve it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EbbHomes {
    pub id: u32,
    pub name: String,
    pub homes: Vec<EbbHome>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EbbHome {
    pub id: u32,
    pub role: Role,
    pub addr: String,
}

/// The static id of a pComponent's ExCache policies (docs/ebb.md#policies-as-ebbs): every
/// pComponent serves it; a message is a [`SetPolicy`], its answer a [`PolicyState`].
pub const EBB_EXCACHE_POLICIES: u32 = 1;

/// Replaces a running pComponent's eviction policy and read-ahead policy (each by its
/// configuration name; left as it is when absent; neither only reads them). The policies are
/// Ebbs: the swap replaces their miss handlers, and the ExCache takes a representative built
/// by the new one before its next miss. Only the global managers and the admin may.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetPolicy {
    pub eviction: Option<String>,
    pub prefetch: Option<String>,
}

/// A pComponent's policies now, with how many times each was replaced since it started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyState {
    pub eviction: String,
    pub prefetch: String,
    pub eviction_swaps: u64,
    pub prefetch_swaps: u64,
}

/// The static id of the global managers' placement policy (docs/ebb.md#the-messenger): a
/// message is a [`SetPlacement`], its answer a [`PlacementState`].
pub const EBB_PLACEMENT: u32 = 2;

/// Replaces the placement policy of the global managers while the cluster runs (by its
/// `[cluster] placement` name; absent: only reads it). Only the admin may.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetPlacement {
    pub placement: Option<String>,
}

/// The placement policy now, with how many times it was replaced since the managers started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementState {
    pub placement: String,
    pub swaps: u64,
}

// The senders of these two messages are the managers and the control plane; the asking lives
// beside the messages, so that neither imports the pComponent or the placement policies.
impl G2X_BEAT {
    /// An answer that tells nothing: what the answers that tell something start from.
    pub fn nothing() -> G2X_BEAT {
        G2X_BEAT {
            lost: Vec::new(),
            lost_mcomps: Vec::new(),
            fence: 0,
            memory: 0,
            vnodes: 0,
            cordoned: false,
            leaving: Vec::new(),
            exit: false,
            rebalance: None,
            keep: Vec::new(),
            beat_ms: 0,
        }
    }
}

impl SetPolicy {
    /// Sends this message to a pComponent's `excache-policies` representative through `send`
    /// and returns its policies after it.
    pub fn ask(&self, send: impl FnOnce(Bytes) -> Result<Bytes, RpcError>) -> Result<PolicyState, RpcError> {
        let answer = send(postcard::to_allocvec(self).expect("a SetPolicy encodes").into())?;
        postcard::from_bytes(&answer).map_err(|e| RpcError::Remote {
            code: ErrCode::Internal,
            msg: format!("the pComponent's answer is not a PolicyState: {e}"),
        })
    }
}

impl SetPlacement {
    /// Sends this message to the global managers' `placement` representative through `send`
    /// and returns the policy after it.
    pub fn ask(&self, send: impl FnOnce(Bytes) -> Result<Bytes, RpcError>) -> Result<PlacementState, RpcError> {
        let answer = send(postcard::to_allocvec(self).expect("a SetPlacement encodes").into())?;
        postcard::from_bytes(&answer).map_err(|e| RpcError::Remote {
            code: ErrCode::Internal,
            msg: format!("the answer is not a PlacementState: {e}"),
        })
    }
}

message_types! {
    // ---- any component <-> global managers (GPM, GMM)
    /// `id`: the id the component had before the global managers restarted (0: a new one).
    /// `nics`: an nComponent's interface addresses, which the GNM maps to it.
    /// `metrics`: where it serves its Prometheus metrics over HTTP, if it does.
    /// `standby`: an mComponent that joins cordoned, for the admin to attach.
    /// `ebbs`: the Ebbs whose messages it serves, for the global id map.
    /// `fenced_by`: the last fence the sender acted on (0: none), as in `X2G_HEARTBEAT`.
    /// `start`: a number the sender drew when it started: a registration without an `id`
    /// repeated under the same start (its answer lost, or handled after a later one) gets the
    /// id the first got, rather than a new one that would replace it.
    X2G_REGISTER { pub role: Role, pub addr: String, pub shim_sock: Option<String>, pub nics: Vec<IpAddr>, pub load: Load, pub id: u32, pub metrics: Option<String>, pub standby: bool, pub ebbs: Vec<EbbServed>, pub fenced_by: u64, pub start: u64 };
    /// `fence`: as in `G2X_BEAT`, for an mComponent that registers again after it was
    /// declared lost (and forgotten).
    /// `vnodes`: the version of the vNodes' table, as in `G2X_BEAT`.
    /// `beat_ms`: the heartbeat period, as in `G2X_BEAT`.
    G2X_REGISTERED { pub id: u32, pub vregion_size: u64, pub replication: Replication, pub overcommit: Overcommit, pub fence: u64, pub vnodes: u64, pub beat_ms: u32 };
    /// Answered `ERR NotFound` unless `id` is registered at `addr`: the sender re-registers.
    /// `links`: what the sender last measured of its links to the components it uses (the
    /// topology graph's measured links).
    /// `leaving`: a leaving mComponent's progress.
    /// `ebbs`: as in `X2G_REGISTER`, now.
    /// `fenced_by`: the last fence (`G2X_BEAT.fence`) the sender acted on, 0 if none: until
    /// it names the fence it was given, every answer gives it again.
    X2G_HEARTBEAT { pub id: u32, pub addr: String, pub load: Load, pub links: Vec<LinkSample>, pub leaving: Option<Leaving>, pub ebbs: Vec<EbbServed>, pub fenced_by: u64 };
    /// `lost` (to mComponents and nComponents): the pComponents silent for longer than the
    /// cluster's `reclaim_dead_ms`, or replaced by a new start at their address, whose
    /// processes' memory the mComponents release and whose sockets the nComponents close. `lost_mcomps` (to mComponents only): the mComponents
    /// silent for as long, whose replicas the homes rebuild elsewhere. `fence` (not 0): the
    /// receiver itself was declared lost in a replicated cluster; its copies are out of date,
    /// and it drops them, then names this fence in its heartbeats (`fenced_by`), which ends it.
    /// `memory` (to mComponents and pComponents): the capacity of all live mComponents (a
    /// mapping larger than that is an obvious overcommit).
    /// `vnodes`: the version of the vNodes' table; a pComponent that has another asks for
    /// the table (`P2G_VNODES`). `cordoned`: the receiver (a pComponent) takes no new
    /// programs. `leaving` (to mComponents): the mComponents being detached; every home moves
    /// its processes' vRegions and backup homes off them, and one that finds itself there
    /// gives up its homes and its buffer cache. `exit`: the receiver, detached and empty,
    /// exits now (the managers have forgotten it).
    /// `rebalance` (to mComponents, with `[cluster] rebalance_percent`): the mComponent
    /// fullest for its capacity, off which each home moves one vRegion of its processes now.
    /// `keep` (to mComponents): the vNodes with a memory quota whose home the receiver is, and
    /// their quotas: it keeps that much of its memory for each, which no other vNode takes.
    /// `beat_ms`: how long the receiver waits before its next heartbeat (0: as it did): the
    /// managers lengthen it in a large cluster (`[cluster] heartbeats_per_s`).
    G2X_BEAT { pub lost: Vec<LostPcomp>, pub lost_mcomps: Vec<u32>, pub fence: u64, pub memory: u64, pub vnodes: u64, pub cordoned: bool, pub leaving: Vec<u32>, pub exit: bool, pub rebalance: Option<u32>, pub keep: Vec<(String, u64)>, pub beat_ms: u32 };
    C2G_STATUS;
    /// `api`: where the global managers serve the REST API, if they do; `metrics`: where
    /// they serve their own Prometheus metrics. `leader`: the manager that leads (the one
    /// answering, unless a follower answers from the leader's last published status);
    /// `managers`: every manager alive (one alone: itself); `apis`: where each of them serves
    /// the REST API (a follower names the leader's to whoever asks it).
    G2C_STATUS { pub components: Vec<ComponentInfo>, pub vregion_size: u64, pub api: Option<String>, pub metrics: Option<String>, pub leader: Option<String>, pub managers: Vec<String>, pub apis: Vec<String> };
    /// GPM: which pComponent runs a new process (the one with the fewest threads).
    C2G_PLACE_PROCESS;
    G2C_PLACED { pub pcomp: ComponentInfo };
    /// GMM: which mComponent is home of a new process of `vnode`. `memory_quota`: the
    /// vNode's memory quota, which its home enforces (one home serves all processes of a vNode
    /// with a quota). `pcomp`: the asker's id, from which the `nearest` placement counts hops.
    P2G_PICK_HOME { pub vnode: String, pub pcomp: u32 };
    G2P_HOME { pub mcomp: ComponentRef, pub memory_quota: Option<u64> };
    /// GMM: which mComponent owns a newly active vRegion (or is a backup home, with `bytes`
    /// 0), other than those in `exclude` and, when it can, on another host than they are.
    /// `near`: the pComponent the vRegion's process runs on (0: none), from which the
    /// `nearest` placement counts hops.
    M2G_PICK_OWNER { pub bytes: u64, pub exclude: Vec<u32>, pub near: u32 };
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
    /// The REST API's bearer tokens (docs/control-plane.md): an `admin` token sees and
    /// changes everything, any other is a tenant's, of the `vnodes` named. The reply carries
    /// the secret, once: the global managers keep only its hash.
    C2G_TOKEN_CREATE { pub name: String, pub admin: bool, pub vnodes: Vec<String> };
    G2C_TOKEN { pub token: String };
    C2G_TOKEN_LIST;
    G2C_TOKENS { pub tokens: Vec<TokenInfo> };
    /// Answered `ERR NotFound` if no token has that name.
    C2G_TOKEN_REVOKE { pub name: String };
    /// The programs a pComponent runs, for the control plane's job list.
    G2P_JOBS;
    P2G_JOBS { pub jobs: Vec<JobInfo> };
    /// Sends `signal` to one of its programs; `ERR NotFound` if it runs no process `pid`.
    G2P_SIGNAL { pub pid: u64, pub signal: i32 };
    /// The admin cordoned (`cordoned`) or uncordoned the pComponent: told at once, so that a
    /// run right after the command meets the new state (its heartbeats' answers carry it too,
    /// for one that missed this).
    G2P_CORDON { pub cordoned: bool };
    /// Resizes a running ExCache (`size`, bytes; rounded down to whole ways of every set) and
    /// replaces the vNodes' shares of it (`shares`), each left as it is when absent; neither
    /// only reads them. A shrink is answered once the lines past the new size left.
    G2P_SET_EXCACHE { pub size: Option<u64>, pub shares: Option<Vec<ExcacheShare>> };
    P2G_EXCACHE { pub size: u64, pub max: u64, pub used: u64, pub shares: Vec<ExcacheShare> };
    /// The vNodes the admin made, and the table's version: a pComponent grants them to the
    /// users and groups named.
    P2G_VNODES;
    G2P_VNODES { pub version: u64, pub vnodes: Vec<VnodeInfo> };
    /// Whom a bearer token of the REST API speaks for, for a component that serves its
    /// metrics beyond loopback to admins only; `ERR NotFound` for no valid token.
    X2G_API_TOKEN { pub token: String };
    G2X_API_PRINCIPAL { pub name: String, pub admin: bool, pub vnodes: Vec<String> };
    /// A component's Prometheus metrics, for the cluster-wide `/metrics` of the REST API.
    G2X_METRICS;
    X2G_METRICS { pub text: String };
    /// A component's statistics (the JSON `cluster status --json` shows under `stats`), for
    /// the REST API's `/api/v1/status`.
    G2X_STATS;
    X2G_STATS { pub json: String };
    /// Where component `id` is (a leaving home tells a pComponent its processes' new home).
    M2G_FIND { pub id: u32 };
    G2M_FOUND { pub comp: ComponentRef };
    /// The global id map: the Ebbs served in the cluster, each with the live components that
    /// serve it (`ebb`: that Ebb only, `ERR NotFound` if no live component serves it; none:
    /// all).
    X2G_EBB_FIND { pub ebb: Option<u32> };
    G2X_EBB_MAP { pub ebbs: Vec<EbbHomes> };
    /// Which global manager leads: any manager answers, a follower too (`leader`: none while
    /// none is elected). `term` grows with each new leader (etcd's revision of its election),
    /// so that an answer from before a handover is told from one after it.
    X2G_WHO_LEADS;
    G2X_LEADER { pub leader: Option<String>, pub term: u64 };

    // ---- any component (or the admin's tools, hosted) -> any component: the Ebb messenger
    /// A message for the representative of Ebb `ebb` on the receiving component
    /// (docs/ebb.md#the-messenger). The body is the Ebb's own: [`EBB_EXCACHE_POLICIES`]
    /// takes a postcard [`SetPolicy`] and answers a [`PolicyState`], [`EBB_PLACEMENT`] a
    /// [`SetPlacement`] and a [`PlacementState`]. `to`: the component id the sender found the
    /// Ebb's home under (the global managers are 0), which the receiver checks, so that an
    /// address reused by another component is not taken for it; none: whoever is at the
    /// address. `ERR NotFound` if the receiver serves no such Ebb or is not `to`; the
    /// representative's refusal as `ERR Denied` or `Invalid`.
    X2X_EBB_MESSAGE { pub ebb: u32, pub to: Option<u32>, pub body: ByteBuf };
    X2X_EBB_ANSWER { pub body: ByteBuf };

    // ---- control client -> any component
    C2X_PING;
    X2C_PONG { pub role: Role, pub id: u32 };
    C2X_STATS;
    X2C_STATS { pub json: String };
    C2X_METRICS;
    X2C_METRICS { pub text: String };
    C2X_SHUTDOWN;
}
