//! The global managers: GPM places processes on pComponents, GMM picks home mComponents,
//! vRegion owners and the mComponent of each file's buffer cache, GSM picks the sComponent of
//! each vNode. They decide from approximate load that components report in heartbeats, and
//! are never on the data path.
//!
//! Storage placements must come out the same after a restart of the global managers (which
//! keep no placement of their own) and on every pComponent, so GSM and the buffer-cache placement use
//! rendezvous hashing over the live components: deterministic, and moving only the share of
//! a component that died.
//!
//! Membership survives restarts of the global managers: ids are random, so that an id of an
//! earlier incarnation never names another component; a component that re-registers asks
//! for the id it had, which keeps its process ids and the vRegion owners others recorded
//! valid; a heartbeat counts only from the address its id was registered at. A component
//! silent for `forget_dead` is forgotten.
//!
//! The mComponents learn from their heartbeats' answers which pComponents are lost (silent
//! for `reclaim_dead`, or replaced by a new start at their address) and release the memory of
//! the processes those created: a pComponent that dies takes its programs with it, never
//! their memory. In a replicated cluster they also learn which mComponents are lost (silent
//! as long), and rebuild the copies those held; an mComponent that was declared lost and
//! speaks again is fenced: its copies may be out of date, so it drops them.
//!
//! What they are told at run time (membership, fencing, the REST API's tokens and join tokens
//! (tokens.rs, joins.rs), the vNodes, cordons, the placement policy) they keep in their state
//! (splitos-core's `state`, kept.rs): a local file, or etcd when several managers run, one
//! elected leader (election.rs, over etcd: etcd.rs). A restarted manager, or a new leader,
//! resumes with it (open.rs). Their time is a clock (clock.rs): the host's, or a simulation's.
//!
//! Membership (registrations, heartbeats) is in membership.rs, what heartbeats' answers tell of
//! the cluster in view.rs, how requests are served in serve.rs, the pickers in place.rs, and
//! what a manager answers while another leads in manager.rs; this file is the managers' state,
//! their dispatch table, their operations for the admin, and their start.
//!
//! The control plane's REST API ([`api`]) is served by the managers and lives in this crate
//! with them; they start it through the function `run` is given, so the managers' own code
//! imports nothing of it.
pub mod api;
mod beat;
pub mod clock;
pub mod cordon;
mod detach;
mod election;
mod etcd;
pub mod joins;
mod kept;
mod manager;
mod membership;
mod open;
pub use membership::forget_components;
mod place;
pub mod scale;
mod serve;
use serve::{from_memory, server_config};
pub mod series;
#[cfg(test)]
mod tests;
pub mod tokens;
mod view;
pub mod vnodes;

use manager::principal;
pub use manager::Manager;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use splitos_rpc::*;

use splitos_core::config::GmArgs;
use splitos_core::node;
use splitos_core::placement::Unit;
use splitos_core::state;
use splitos_core::topology::host_of;

/// The programs of the cluster, as its pComponents report them.
pub struct Jobs {
    /// Each program with the pComponent it runs on.
    pub running: Vec<(ComponentInfo, JobInfo)>,
    /// The alive pComponents that did not answer, with why.
    pub unanswered: Vec<(ComponentInfo, String)>,
}

/// How long the managers wait for a component's answer to a control-plane request.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long `/api/v1/status` waits for a component's statistics: longer than a control
/// request (a busy mComponent answers late), shorter than the CLI waits for the API.
const STATS_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an ExCache resize may take: a shrink writes back every dirty line past the new
/// size first (a GiB of them at the miss path's write-back rate is seconds).
const EXCACHE_TIMEOUT: Duration = Duration::from_secs(120);

/// The most measured links the managers keep of one component.
const MAX_LINKS: usize = 256;

/// The components known, by id, in the order they registered (first-fit placement's order).
type Comps = indexmap::IndexMap<u32, Entry>;

struct Entry {
    info: ComponentInfo,
    /// The static key the component registered with: only it may heartbeat for the entry
    /// or register again at its address.
    key: Option<[u8; 32]>,
    last: Instant,
    /// The number its start drew (`X2G_REGISTER.start`).
    start: u64,
    /// Bytes GMM promised to vRegions since the last heartbeat, so that a burst of placements
    /// between two heartbeats spreads instead of piling onto one stale minimum.
    pending: u64,
    /// The links it measured to the components it uses, as its last heartbeat said.
    links: Vec<LinkSample>,
    /// Its buffer cache was handed over in a detach: pComponents may still use the interim
    /// caches, so it takes no file again until it starts anew (two caches of one file).
    files_gone: bool,
    /// The Ebbs whose messages it serves, as its registration or last heartbeat said: its
    /// part of the global id map.
    ebbs: Vec<EbbServed>,
}

/// At most this many Ebbs per component in the id map, each named in at most
/// [`MAX_EBB_NAME`] bytes, and addresses of at most [`MAX_ADDR`] bytes: a component cannot
/// grow the managers' memory (or the map's answer) without bound.
const MAX_EBBS: usize = 64;
const MAX_EBB_NAME: usize = 64;
const MAX_ADDR: usize = 256;

/// The Ebbs a registration or heartbeat names, refused whole if they exceed the bounds or
/// name one id twice.
fn checked_ebbs(ebbs: Vec<EbbServed>) -> Result<Vec<EbbServed>, membership::MembershipError> {
    let ids: std::collections::BTreeSet<u32> = ebbs.iter().map(|e| e.id).collect();
    if ebbs.len() > MAX_EBBS
        || ids.len() != ebbs.len()
        || ebbs
            .iter()
            .any(|e| e.name.len() > MAX_EBB_NAME || e.id >= splitos_ebb::ebb::FIRST_DYNAMIC)
    {
        return Err(membership::MembershipError::Ebbs);
    }
    Ok(ebbs)
}

/// Why the managers refuse a request about one component (the admin's cordon, detach and
/// attach, an ExCache's statistics, an mComponent's search for a pComponent).
#[derive(Debug, thiserror::Error)]
pub enum ComponentError {
    #[error("no component has id {id}")]
    NoSuch { id: u32 },
    #[error("component {id} is a {role}: only pComponents and mComponents take new work, and are cordoned")]
    NotCordonable { id: u32, role: &'static str },
    #[error("cannot keep the cordon: {0}")]
    KeepCordon(anyhow::Error),
    #[error("cannot keep the detach in the managers' state, so it is called off (a successor would not know of it; if the write reached the state after all, the detach goes on): {0}")]
    KeepDetach(anyhow::Error),
    #[error("component {id} is a {role}: only pComponents have an ExCache")]
    NotPComponent { id: u32, role: &'static str },
    #[error("pComponent {id} does not answer")]
    Silent { id: u32 },
    #[error("no pComponent that is not lost has id {id}")]
    NoLivePComponent { id: u32 },
    #[error("component {id} is a {role}: only mComponents are detached")]
    NotDetachable { id: u32, role: &'static str },
    #[error("component {id} is a {role}: only mComponents are attached")]
    NotAttachable { id: u32, role: &'static str },
    #[error("mComponent {id} does not answer: a lost mComponent's copies are rebuilt from the others, not moved")]
    LostMComponent { id: u32 },
    #[error("mComponent {id} is already being detached")]
    AlreadyDetaching { id: u32 },
    #[error("mComponent {other} is being detached: one detach at a time")]
    OneDetachAtATime { other: u32 },
    #[error("mComponent {id} is the last mComponent that takes memory: its memory has nowhere to go")]
    LastMComponent { id: u32 },
    #[error("replication {replication} keeps each vRegion on {needs} mComponents and only {others} others take memory: attach memory first")]
    TooFewOthers {
        replication: Replication,
        needs: usize,
        others: usize,
    },
    #[error("mComponent {id} holds {holds} bytes and the other mComponents have {free} free: no room to move it (attach memory first)")]
    NoRoomToMove { id: u32, holds: u64, free: u64 },
}

impl Refuse for ComponentError {
    fn code(&self) -> ErrCode {
        use ComponentError::*;
        match self {
            NoSuch { .. } | NoLivePComponent { .. } => ErrCode::NotFound,
            NotCordonable { .. }
            | NotPComponent { .. }
            | NotDetachable { .. }
            | NotAttachable { .. }
            | AlreadyDetaching { .. }
            | OneDetachAtATime { .. } => ErrCode::Invalid,
            KeepCordon(_) | KeepDetach(_) => ErrCode::Internal,
            Silent { .. } | LostMComponent { .. } => ErrCode::Unreachable,
            LastMComponent { .. } | TooFewOthers { .. } | NoRoomToMove { .. } => ErrCode::NoMemory,
        }
    }
}

pub struct Gm {
    /// Where the managers serve requests.
    pub addr: String,
    vregion_size: u64,
    replication: Replication,
    overcommit: Overcommit,
    /// How GPM and GMM choose among the components with room (`[cluster] placement`, then
    /// what the admin put in its place).
    placement: splitos_core::placement::Placements,
    /// `[cluster] rebalance_percent` (0: off), and the mComponent being emptied towards the
    /// others now (detach.rs).
    rebalance_percent: u32,
    rebalancing: Mutex<Option<u32>>,
    forget_dead: Duration,
    /// How long a pComponent may be silent before the mComponents release its processes.
    reclaim_dead: Duration,
    /// The heartbeat period told to the components, which grows with the cluster.
    period: beat::Period,
    comps: Mutex<Comps>,
    /// Held by a registration throughout, `comps` only while it reads and changes it.
    registering: Mutex<()>,
    /// When `comps` was last walked for components to forget.
    swept: Mutex<Instant>,
    /// What the heartbeats' answers tell of the whole cluster (view.rs).
    views: view::Views,
    /// Where membership and the rest of the managers' state are kept (kept.rs).
    store: state::Store,
    /// Starts of pComponents replaced by a new start at their address, kept for
    /// `forget_dead` so that every mComponent hears of them.
    replaced: kept::Recent<LostPcomp>,
    /// Ids of mComponents replaced by a new start at their address, kept for `forget_dead`
    /// so that every home rebuilds the copies they held.
    replaced_mcomps: kept::Recent<u32>,
    /// Ids of mComponents forgotten after `forget_dead` of silence, kept for `forget_dead`
    /// more and still told as lost (unless one registers again): a call to one that began
    /// after it was forgotten is then given up, where a peer that heard nothing of it would
    /// wait for it as late.
    forgotten_mcomps: kept::Recent<u32>,
    /// Ids of mComponents detached (they exited empty), kept for `forget_dead` and told to
    /// pComponents as lost: one whose view of a process still names it asks the home again
    /// instead of waiting for it.
    detached: kept::Recent<u32>,
    /// mComponents announced lost to some other live component, each with its fence: only
    /// those are fenced when they speak again, since only their copies can have been rebuilt
    /// elsewhere and their processes taken over, and until they act on it.
    announced: Mutex<std::collections::HashMap<u32, membership::Announced>>,
    /// When the managers last heard any heartbeat: after a stall of their own (paused, cut
    /// off) every component looks silent, and none of them may be taken for lost.
    last_any: Mutex<Instant>,
    started: Instant,
    /// The vNodes the admin made, their grants and memory quotas.
    pub vnodes: vnodes::Vnodes,
    /// The components the admin took out of placement.
    cordons: cordon::Cordons,
    /// The home of each vNode with a quota, kept while it is alive: an mComponent that joins
    /// later does not win the rendezvous for the vNode's next processes, whose charges the
    /// first home would then not see.
    quota_homes: Mutex<std::collections::HashMap<String, ComponentRef>>,
    /// The REST API's tokens (`C2G_TOKEN_*`).
    pub tokens: tokens::Tokens,
    /// The join tokens, and the authority the managers issue credentials with to a machine
    /// that joins.
    pub joins: joins::JoinTokens,
    /// Where the managers serve their own metrics, once they do.
    metrics: std::sync::OnceLock<String>,
    /// The managers' own requests to components, for the control plane: a short timeout, so
    /// that a hung pComponent delays a job list by that much at most.
    rpc: Rpc,
    /// Their election, when several managers keep the state in etcd.
    election: Option<Arc<election::Election>>,
    /// Their time (the host's, but in a simulation).
    clock: Arc<dyn clock::Clock>,
    /// When a write to the state the heartbeats' answers need last failed.
    write_failed_at: Mutex<Option<Instant>>,
}

impl Gm {
    /// The components and where the managers serve (the API's `/api/v1/status` adds each
    /// component's statistics).
    pub fn status_summary(&self) -> G2C_STATUS {
        let managers = self
            .election
            .as_ref()
            .map_or_else(|| vec![self.addr.clone()], |e| e.managers());
        G2C_STATUS {
            components: self.snapshot(),
            vregion_size: self.vregion_size,
            api: manager::API_AT.get().cloned(),
            metrics: self.metrics.get().cloned(),
            leader: Some(self.addr.clone()),
            managers,
            apis: self.apis(),
        }
    }

    /// Where the managers serve their own metrics, if they do.
    pub fn metrics_addr(&self) -> Option<String> {
        self.metrics.get().cloned()
    }

    /// Asks every alive component that `which` picks at once, each answer beside its asker.
    fn ask_all<R: Request + Clone + Sync>(
        &self,
        which: impl Fn(&ComponentInfo) -> bool,
        req: R,
        timeout: Duration,
    ) -> Vec<(ComponentInfo, Result<R::Reply, RpcError>)>
    where
        R::Reply: Send,
    {
        let comps: Vec<ComponentInfo> = self.snapshot().into_iter().filter(|c| c.alive && which(c)).collect();
        let answers: Vec<Result<R::Reply, RpcError>> = std::thread::scope(|s| {
            let asks: Vec<_> = comps
                .iter()
                .map(|c| s.spawn(|| self.rpc.call_timeout(&c.addr, req.clone(), timeout)))
                .collect();
            asks.into_iter()
                .map(|h| h.join().expect("a request to a component panicked"))
                .collect()
        });
        comps.into_iter().zip(answers).collect()
    }

    /// Every program the alive pComponents run; they are asked at once.
    /// Every component with its own statistics (alive ones that answer), as `cluster status`
    /// shows them.
    pub fn status(&self) -> Vec<(ComponentInfo, Option<serde_json::Value>)> {
        let mut answered: std::collections::HashMap<u32, serde_json::Value> = std::collections::HashMap::new();
        for (c, r) in self.ask_all(|_| true, G2X_STATS, STATS_TIMEOUT) {
            match r
                .map_err(|e| e.to_string())
                .and_then(|s| serde_json::from_str(&s.json).map_err(|e| e.to_string()))
            {
                Ok(v) => _ = answered.insert(c.id, v),
                Err(e) => tracing::debug!(id = c.id, error = %e, "a component did not give its statistics"),
            }
        }
        self.snapshot()
            .into_iter()
            .map(|c| (answered.remove(&c.id), c))
            .map(|(s, c)| (c, s))
            .collect()
    }

    pub fn jobs(&self) -> Jobs {
        let mut jobs = Jobs {
            running: Vec::new(),
            unanswered: Vec::new(),
        };
        for (c, a) in self.ask_all(|c| c.role == Role::Proc, G2P_JOBS, CONTROL_TIMEOUT) {
            match a {
                Ok(r) => jobs.running.extend(r.jobs.into_iter().map(|j| (c.clone(), j))),
                Err(e) => jobs.unanswered.push((c, e.to_string())),
            }
        }
        jobs
    }

    /// The whole cluster's metrics: the managers' own and every alive component's, merged
    /// into one exposition (a silent component's series are missing).
    pub fn cluster_metrics(&self) -> String {
        let answers = self.ask_all(|_| true, G2X_METRICS, CONTROL_TIMEOUT);
        splitos_core::telemetry::merge(
            std::iter::once(splitos_core::telemetry::render())
                .chain(answers.into_iter().filter_map(|(_, a)| a.ok().map(|m| m.text))),
        )
    }

    /// Resizes the ExCache of pComponent `id` and sets the vNodes' shares of it (each left as
    /// it is when `None`). A shrink waits for the lines past the new size to be written back.
    pub fn set_excache(
        &self,
        id: u32,
        size: Option<u64>,
        shares: Option<Vec<ExcacheShare>>,
    ) -> Result<P2G_EXCACHE, Refusal> {
        let pcomp = self.running_pcomponent(id)?;
        let r = self
            .rpc
            .call_timeout(&pcomp.addr, G2P_SET_EXCACHE { size, shares }, EXCACHE_TIMEOUT)?;
        crate::series::EXCACHE_CHANGES.increment(1);
        Ok(r)
    }

    /// Replaces the eviction or read-ahead policy of pComponent `id` while it runs (each left
    /// as it is when `None`), through the messenger to its `excache-policies` Ebb: a hosted
    /// caller, it finds the Ebb's home on that component in the id map these managers keep, and
    /// names the component in the message, so that another at the same address refuses it.
    pub fn set_policy(
        &self,
        id: u32,
        eviction: Option<String>,
        prefetch: Option<String>,
    ) -> Result<PolicyState, Refusal> {
        let pcomp = self.running_pcomponent(id)?;
        let change = eviction.is_some() || prefetch.is_some();
        let ebb = splitos_ebb::EbbId(EBB_EXCACHE_POLICIES);
        let homes: Vec<EbbHome> = self
            .ebb_map(Some(ebb.0))
            .map(|m| m.ebbs.into_iter().flat_map(|e| e.homes).collect())
            .unwrap_or_default();
        let messenger = splitos_rpc::messenger::Messenger::new(self.rpc.clone(), Box::new(move |_| Ok(homes.clone())));
        let r = SetPolicy { eviction, prefetch }.ask(|body| messenger.send_to(ebb, pcomp.id, body))?;
        if change {
            crate::series::POLICY_CHANGES.increment(1);
        }
        Ok(r)
    }

    /// Replaces the placement policy with the one `name` names (none: only reads it).
    pub fn placement(&self, name: Option<String>) -> Result<PlacementState, splitos_core::placement::PlacementError> {
        self.placement.set(name)
    }

    /// The global id map: every Ebb served by a live component (only `ebb`, if given), with
    /// the live components that serve it.
    fn ebb_map(&self, ebb: Option<u32>) -> Result<G2X_EBB_MAP, Refusal> {
        let mut map: std::collections::BTreeMap<u32, EbbHomes> = Default::default();
        // The managers' own Ebbs, at id 0 (no component has it).
        let own = EbbHome {
            id: 0,
            role: Role::Gm,
            addr: self.addr.clone(),
        };
        // Taken under the membership's lock, which heartbeats and placements wait for; built
        // after it.
        let comps = self.comps();
        let at = self.at();
        let served: Vec<(EbbHome, Vec<EbbServed>)> = comps
            .values()
            .filter(|e| at.alive(e) && !e.ebbs.is_empty())
            .map(|e| {
                (
                    EbbHome {
                        id: e.info.id,
                        role: e.info.role,
                        addr: e.info.addr.clone(),
                    },
                    e.ebbs
                        .iter()
                        .filter(|s| ebb.is_none_or(|id| id == s.id))
                        .cloned()
                        .collect(),
                )
            })
            .collect();
        drop(comps);
        let own_ebbs = splitos_rpc::messenger::served()
            .into_iter()
            .filter(|s| ebb.is_none_or(|id| id == s.id))
            .collect();
        for (home, ebbs) in std::iter::once((own, own_ebbs)).chain(served) {
            for s in ebbs {
                map.entry(s.id)
                    .or_insert_with(|| EbbHomes {
                        id: s.id,
                        name: s.name,
                        homes: Vec::new(),
                    })
                    .homes
                    .push(home.clone());
            }
        }
        if let Some(id) = ebb.filter(|_| map.is_empty()) {
            return Err(membership::MembershipError::EbbNotServed { id }.into());
        }
        Ok(G2X_EBB_MAP {
            ebbs: map.into_values().collect(),
        })
    }

    /// The pComponent `id`, answering.
    fn running_pcomponent(&self, id: u32) -> Result<ComponentInfo, ComponentError> {
        let pcomp = self
            .snapshot()
            .into_iter()
            .find(|c| c.id == id)
            .ok_or(ComponentError::NoSuch { id })?;
        if pcomp.role != Role::Proc {
            return Err(ComponentError::NotPComponent {
                id,
                role: pcomp.role.name(),
            });
        }
        if !pcomp.alive {
            return Err(ComponentError::Silent { id });
        }
        Ok(pcomp)
    }

    /// Signals program `pid` on `pcomp`, which the caller found it on.
    pub fn signal(&self, pcomp: &ComponentInfo, pid: u64, signal: i32) -> Result<(), RpcError> {
        self.rpc.call(&pcomp.addr, G2P_SIGNAL { pid, signal }).map(|_| ())
    }

    fn stats(&self) -> Result<X2C_STATS, Refusal> {
        let json = serde_json::json!({"role": "global-managers", "uptime_ms": self.since(self.started).as_millis() as u64, "components": self.snapshot().len(), "placement": self.placement.now().to_string(), "placement_swaps": self.placement.swaps()}).to_string();
        Ok(X2C_STATS { json })
    }
}

/// The global managers' dispatch table.
impl Handler for Gm {
    fn fans_out(&self, msg: &Msg) -> bool {
        !from_memory(msg)
    }

    fn handle(&self, msg: Msg) -> Msg {
        match msg {
            Msg::X2G_REGISTER(r) => on(r, |r| self.register(r)),
            Msg::X2G_HEARTBEAT(r) => on(r, |r| self.heartbeat(r)),
            Msg::C2G_STATUS(r) => on(r, |_| Ok(self.status_summary())),
            Msg::P2G_VNODES(r) => on(r, |_| {
                let (version, vnodes) = self.vnodes.list();
                Ok(G2P_VNODES { version, vnodes })
            }),
            Msg::X2G_API_TOKEN(r) => on(r, |r| principal(self.tokens.check(&r.token))),
            Msg::X2G_WHO_LEADS(r) => on(r, |_| {
                Ok(G2X_LEADER {
                    leader: Some(self.addr.clone()),
                    term: self.election.as_ref().map_or(0, |e| e.term().max(0) as u64),
                })
            }),
            Msg::C2G_TOKEN_CREATE(r) => on(r, |r| {
                let token = self.tokens.create(&r.name, r.admin, r.vnodes.clone())?;
                tracing::info!(name = %r.name, admin = r.admin, vnodes = ?r.vnodes, "API token created");
                Ok(G2C_TOKEN { token })
            }),
            Msg::C2G_TOKEN_LIST(r) => on(r, |_| {
                Ok(G2C_TOKENS {
                    tokens: self.tokens.list(),
                })
            }),
            Msg::C2G_TOKEN_REVOKE(r) => on(r, |r| match self.tokens.revoke(&r.name) {
                Ok(true) => {
                    tracing::info!(name = %r.name, "API token revoked");
                    Ok(OK)
                }
                Ok(false) => Err(tokens::TokenError::NoSuch(r.name.clone()).into()),
                Err(e) => Err(e.into()),
            }),
            Msg::C2G_PLACE_PROCESS(r) => on(r, |_| self.place_process()),
            Msg::P2G_PICK_HOME(r) => on(r, |r| self.pick_home(r)),
            Msg::M2G_PICK_OWNER(r) => on(r, |r| {
                crate::series::GMM_VREGION_PLACEMENTS.increment(1);
                self.pick_memory(r.bytes, &r.exclude, (r.near != 0).then_some(r.near))
                    .map(|mcomp| G2M_OWNER { mcomp })
                    .map_err(Into::into)
            }),
            Msg::P2G_VNODE_STORAGE(r) => on(r, |r| self.vnode_storage(r)),
            Msg::M2G_BACKUP_STORE(r) => on(r, |r| self.backup_store(r)),
            Msg::P2G_FILE_CACHE(r) => on(r, |r| self.file_cache(r)),
            Msg::M2G_FIND(r) => on(r, |r| {
                // Only pComponents not lost (a late one is still told): an mComponent has no
                // other use for it.
                let comps = self.comps();
                let at = self.at();
                let c = comps
                    .values()
                    .find(|e| e.info.id == r.id && e.info.role == Role::Proc && !at.lost(e))
                    .map(|e| ComponentRef {
                        id: e.info.id,
                        addr: e.info.addr.clone(),
                    });
                c.map(|comp| G2M_FOUND { comp })
                    .ok_or_else(|| ComponentError::NoLivePComponent { id: r.id }.into())
            }),
            Msg::P2G_PICK_NET(r) => on(r, |r| self.pick_net(r)),
            Msg::X2G_EBB_FIND(r) => on(r, |r| self.ebb_map(r.ebb)),
            Msg::C2X_PING(r) => on(r, |_| Ok(X2C_PONG { role: Role::Gm, id: 0 })),
            Msg::C2X_METRICS(r) => on(r, |_| {
                Ok(X2C_METRICS {
                    text: splitos_core::telemetry::render(),
                })
            }),
            Msg::C2X_STATS(r) => on(r, |_| self.stats()),
            Msg::C2X_SHUTDOWN(r) => on(r, |_| {
                splitos_core::node::exit_soon();
                Ok(OK)
            }),
            other => Msg::ERR(
                Unhandled {
                    by: "the global managers do",
                    msg: other.name(),
                }
                .into(),
            ),
        }
    }
}

/// How often a leader looks at its status, to publish it for the followers when it changed
/// (which components there are, and whether each is alive), and at least every
/// [`PUBLISH_ANYWAY`] (their loads): each publication is a revision etcd keeps until it
/// compacts its history.
const PUBLISH: Duration = Duration::from_secs(1);
const PUBLISH_ANYWAY: Duration = Duration::from_secs(10);

/// Runs the global managers until they are stopped. `start_api` serves the REST API
/// (`api::start`): on every manager, from before it leads, so that its address outlives a
/// handover (only the leader answers; a follower names it). It is given, not called by name,
/// because the API imports the managers and the managers must not import it.
pub fn run(args: GmArgs, start_api: fn(&Arc<Manager>, &GmArgs) -> anyhow::Result<()>) -> anyhow::Result<()> {
    // Before any thread starts, which would inherit the mask.
    let stop = node::block_stop_signals();
    let cfg = &args.cluster;
    cfg.validate().map_err(|e| anyhow::anyhow!(e))?;
    let t = args
        .process
        .transport
        .build(Some(node::credentials(args.process.credentials()?, Role::Gm)?))
        .map_err(|e| anyhow::anyhow!(e))?;
    node::advertisable(Role::Gm, &args.listen)?;
    let ep = t
        .listen(&args.listen)
        .map_err(|e| anyhow::anyhow!("global managers cannot listen on {}: {e}", args.listen))?;
    let addr = ep.addr();
    splitos_core::telemetry::init(Role::Gm, &addr);
    splitos_rpc::messenger::set_component_id(0);
    if cfg.etcd.is_empty() {
        let store = match &args.state {
            Some(file) => state::Store::open(
                file,
                state::StateKey::at(
                    &args.state_key.clone().unwrap_or_else(|| file.with_extension("key")),
                    true,
                )?,
            )?,
            None => state::Store::default(),
        };
        let gm = Gm::open(&args, &addr, &t, store.clone(), None, Arc::new(clock::Host))?;
        ep.serve(gm.clone(), server_config());
        let alone = Arc::new(Manager {
            election: Arc::new(manager::Alone { addr: addr.clone() }),
            gm: gm.clone().into(),
            store,
        });
        let g = gm.clone();
        if let Some(at) = node::serve_metrics(&args.process, move |token| {
            matches!(g.tokens.check(token), Some(tokens::Principal::Admin { .. }))
        })? {
            let _ = gm.metrics.set(at);
        }
        start_api(&alone, &args)?;
        stop.on_stop(|| {});
        tracing::info!(%addr, transport = t.name(), role = "global-managers (GPM, GMM)", metrics = ?gm.metrics.get(), vregion_size = cfg.vregion_size.0, replication = %gm.replication, overcommit = cfg.overcommit.name(), placement = %cfg.placement, state = ?args.state, "splitos global managers started");
        node::announce_ready(args.process.ready_file.as_deref(), &addr);
        splitos_core::node::park_forever()
    }
    // Every manager of the cluster signs with the same key: one made here would refuse the
    // others' records.
    let key = state::StateKey::at(
        args.state_key.as_deref().ok_or_else(|| {
            anyhow::anyhow!("managers in etcd need the cluster's state key (--state-key; `cluster up` makes one)")
        })?,
        false,
    )?;
    let tls = match (&args.etcd_ca, &args.etcd_cert, &args.etcd_key) {
        (Some(ca), Some(cert), Some(key)) => Some(etcd::Tls { ca, cert, key }),
        _ => None,
    };
    let etcd = etcd::Etcd::connect(&cfg.etcd, &cfg.etcd_prefix, tls)?;
    let store = state::Store::on(etcd.clone(), key.clone());
    let clock: Arc<dyn clock::Clock> = Arc::new(clock::Host);
    let election = election::Election::new(etcd, key, &addr, Duration::from_secs(cfg.leader_lease_s), clock.clone());
    let manager = Arc::new(Manager {
        election: election.clone(),
        gm: std::sync::OnceLock::new(),
        store: store.clone(),
    });
    let leaving = election.clone();
    stop.on_stop(move || leaving.resign());
    ep.serve(manager.clone(), server_config());
    let token_store = store.clone();
    let metrics = node::serve_metrics(&args.process, move |token| {
        tokens::Tokens::open(token_store.clone())
            .is_ok_and(|t| matches!(t.check(token), Some(tokens::Principal::Admin { .. })))
    })?;
    // Before the election lists this manager: its listing names where it serves the API.
    start_api(&manager, &args)?;
    tracing::info!(%addr, transport = t.name(), role = "global-managers (GPM, GMM), following until elected", etcd = ?cfg.etcd, prefix = %cfg.etcd_prefix, lease_s = cfg.leader_lease_s, ?metrics, "splitos global managers started");
    node::announce_ready(args.process.ready_file.as_deref(), &addr);
    let e = election.clone();
    election.run(move || {
        let gm = Gm::open(&args, &addr, &t, store, Some(e.clone()), clock)?;
        if let Some(at) = metrics {
            let _ = gm.metrics.set(at);
        }
        let _ = manager.gm.set(gm.clone());
        std::thread::Builder::new()
            .name("publish-status".into())
            .spawn(move || {
                let mut last: Option<(Vec<u8>, Instant)> = None;
                loop {
                    let status = gm.status_summary();
                    let shape = G2C_STATUS {
                        components: status
                            .components
                            .iter()
                            .map(|c| ComponentInfo {
                                since_heartbeat_ms: 0,
                                load: Load::default(),
                                ..c.clone()
                            })
                            .collect(),
                        ..status.clone()
                    };
                    let shape = postcard::to_allocvec(&shape).expect("a status encodes");
                    if last
                        .as_ref()
                        .is_none_or(|(s, at)| *s != shape || at.elapsed() > PUBLISH_ANYWAY)
                    {
                        match e.publish_status(&postcard::to_allocvec(&status).expect("a status encodes")) {
                            Ok(()) => last = Some((shape, Instant::now())),
                            Err(err) => tracing::debug!(error = %err, "cannot publish the status for the followers"),
                        }
                    }
                    std::thread::sleep(PUBLISH);
                }
            })?;
        Ok(())
    })
}
