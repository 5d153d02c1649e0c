//! Membership: components register (keeping the id they had, across restarts of the managers),
//! heartbeat with their load and what they measured of their links, and are declared late,
//! lost and forgotten by how long they were silent. What is kept of it survives a restart of the
//! managers (`resume`).
use super::*;

/// Why the managers refuse a registration, a heartbeat or a search of the Ebbs' map.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MembershipError {
    #[error("ebbs: at most {MAX_EBBS}, each once, with static ids (below {first_dynamic}) and names of at most {MAX_EBB_NAME} bytes", first_dynamic = splitos_ebb::ebb::FIRST_DYNAMIC)]
    Ebbs,
    #[error("addr: longer than {MAX_ADDR} bytes")]
    AddrTooLong,
    /// A component registers as what its credentials say it is.
    #[error("a {peer} may not register as a {role}")]
    NotItsRole { peer: &'static str, role: &'static str },
    #[error("a live {role} with other credentials is registered at {addr}")]
    OtherCredentials { role: &'static str, addr: String },
    #[error("cannot keep the registration: {0}")]
    Keep(anyhow::Error),
    #[error("no component {id} is registered at {addr}")]
    NotRegistered { id: u32, addr: String },
    #[error("component {id} at {addr} is an earlier start: a live one registered there since")]
    Replaced { id: u32, addr: String },
    #[error("no live component serves Ebb {id}")]
    EbbNotServed { id: u32 },
}

impl Refuse for MembershipError {
    fn code(&self) -> ErrCode {
        match self {
            MembershipError::Ebbs | MembershipError::AddrTooLong => ErrCode::Invalid,
            MembershipError::NotItsRole { .. } | MembershipError::OtherCredentials { .. } => ErrCode::Denied,
            MembershipError::Keep(_) => ErrCode::Internal,
            MembershipError::NotRegistered { .. } | MembershipError::EbbNotServed { .. } => ErrCode::NotFound,
            MembershipError::Replaced { .. } => ErrCode::Denied,
        }
    }
}

/// An mComponent announced lost: its fence, and whether the fence may have been told to it
/// (by these managers, or by a predecessor, whose fences these find in their state).
pub(super) struct Announced {
    pub(super) fence: u64,
    pub(super) told: bool,
}

/// How long after a failed write to the state the heartbeats' answers try none again.
const WRITE_BACKOFF: Duration = Duration::from_secs(1);

/// A moment of the managers' time, and how it judges a component's silence.
pub(super) struct At {
    now: Instant,
    alive_for: Duration,
    reclaim_dead: Duration,
}

impl At {
    /// How long `e` has been silent.
    pub(super) fn silent(&self, e: &Entry) -> Duration {
        self.now.saturating_duration_since(e.last)
    }

    /// Heard within the last few heartbeat periods ([`beat::Period::alive_for`]).
    pub(super) fn alive(&self, e: &Entry) -> bool {
        self.silent(e) < self.alive_for
    }

    /// A pComponent or mComponent silent for longer than `reclaim_dead`.
    pub(super) fn lost(&self, e: &Entry) -> bool {
        matches!(e.info.role, Role::Proc | Role::Mem) && self.silent(e) > self.reclaim_dead
    }
}

impl Gm {
    /// Memory of an mComponent that others cannot have: what is charged to mappings
    /// (strict overcommit) or holds pages (heuristic), and what GMM promised since its last
    /// heartbeat.
    pub(super) fn taken(e: &Entry) -> u64 {
        e.info.load.committed.max(e.info.load.used) + e.pending
    }

    /// The managers' clock read once, for a walk over every component: reading it for each
    /// of 10,000 entries cost more than the walk itself (docs/benchmarks.md, "The managers at
    /// datacenter scale").
    pub(super) fn at(&self) -> At {
        At {
            now: self.now(),
            alive_for: self.period.alive_for(),
            reclaim_dead: self.reclaim_dead,
        }
    }

    /// The entries, less those silent for longer than `forget_dead` (looked for at most every
    /// [`view::VIEW_FOR`]: a walk over every component, which each call would pay).
    pub(super) fn comps(&self) -> std::sync::MutexGuard<'_, Comps> {
        let mut comps = self.comps.lock().unwrap();
        {
            let mut swept = self.swept.lock().unwrap();
            if self.since(*swept) < view::VIEW_FOR {
                return comps;
            }
            *swept = self.now();
        }
        let before = comps.len();
        comps.retain(|_, e| {
            let keep = self.since(e.last) < self.forget_dead;
            if !keep {
                tracing::info!(id = e.info.id, role = e.info.role.name(), addr = %e.info.addr, "component forgotten: no heartbeat for {:?}", self.forget_dead);
                crate::series::COMPONENTS_FORGOTTEN.increment(1);
                self.unkeep(e.info.id);
                if e.info.role == Role::Mem {
                    self.forgotten_mcomps.push(e.info.id);
                }
            }
            keep
        });
        if comps.len() != before {
            self.views.changed();
        }
        crate::series::COMPONENTS.set(comps.len() as f64);
        comps
    }

    /// Keeps `e`'s registration in the managers' state.
    pub(super) fn keep(&self, e: &Entry) -> anyhow::Result<()> {
        self.store.put(
            kept::MEMBERS,
            &e.info.id.to_string(),
            Some(&kept::Member {
                info: ComponentInfo {
                    load: Load::default(),
                    ..e.info.clone()
                },
                key: e.key,
                ebbs: e.ebbs.clone(),
                files_gone: e.files_gone,
                start: e.start,
            }),
        )
    }

    /// Keeps `e`'s registration after a change a successor must know; one that cannot be kept
    /// is logged, and the successor has the registration as it was.
    pub(super) fn keep_change(&self, e: &Entry) {
        if let Err(err) = self.keep(e) {
            tracing::warn!(id = e.info.id, error = %err, "cannot keep a change of a component's registration in the managers' state");
        }
    }

    /// Drops component `id`'s registration from the managers' state.
    pub(super) fn unkeep(&self, id: u32) {
        if let Err(e) = self.store.put::<kept::Member>(kept::MEMBERS, &id.to_string(), None) {
            tracing::warn!(id, error = %e, "cannot drop a component from the managers' state");
        }
    }

    /// Adds mComponents to those announced lost, each with a fence of its own, kept in the
    /// managers' state: a successor fences them too when they speak again. Returns those
    /// that could not be kept, which are not announced (the next answer tries again).
    ///
    /// A fence that may have been told gets a new one when its mComponent is announced again:
    /// it may have acted on the old one, with the word of it lost on the way, and taken
    /// copies since that the second loss had rebuilt; naming the old fence back must not end
    /// the new one.
    pub(super) fn announce(&self, ids: impl Iterator<Item = u32>) -> Vec<u32> {
        let mut announced = self.announced.lock().unwrap();
        let mut unkept = Vec::new();
        for id in ids {
            if announced.get(&id).is_some_and(|a| !a.told) {
                continue;
            }
            if !self.may_write() {
                unkept.push(id);
                continue;
            }
            let fence = splitos_rpc::auth::random_u64().max(1);
            match self.store.put(kept::ANNOUNCED, &id.to_string(), Some(&fence)) {
                Ok(()) => _ = announced.insert(id, Announced { fence, told: false }),
                Err(e) => {
                    self.write_failed();
                    tracing::warn!(id, error = %e, "cannot keep an mComponent announced lost in the managers' state: it is not announced yet");
                    unkept.push(id);
                }
            }
        }
        unkept
    }

    /// The mComponents an answer to component `to` names lost: those the view holds lost
    /// (with replication, only once their fence is kept, which this answer keeps if it can:
    /// a pComponent that hears of the loss gives the processes to their backup homes, and a
    /// peer rebuilds the copies, so a successor must fence the lost one too).
    fn told_lost(&self, view: &view::View, to: u32) -> Vec<u32> {
        let mut lost = view.lost_mcomps.clone();
        if self.replication != Replication::None {
            let unkept = self.announce(view.lost_mcomps.iter().copied().filter(|id| *id != to));
            lost.retain(|id| !unkept.contains(id));
        }
        lost
    }

    /// Whether a write to the state may be tried now while heartbeats wait: not within
    /// [`WRITE_BACKOFF`] of one that failed (the state unreachable), so that the heartbeats do
    /// not each wait out its timeout.
    fn may_write(&self) -> bool {
        self.write_failed_at
            .lock()
            .unwrap()
            .is_none_or(|t| self.since(t) >= WRITE_BACKOFF)
    }

    fn write_failed(&self) {
        *self.write_failed_at.lock().unwrap() = Some(self.now());
    }

    /// Forgets the fence of mComponent `id`, which no longer exists (detached, or replaced by
    /// a new start).
    fn drop_fence(&self, id: u32) {
        let mut announced = self.announced.lock().unwrap();
        self.unannounce(&mut announced, id);
    }

    fn unannounce(&self, announced: &mut std::collections::HashMap<u32, Announced>, id: u32) {
        if announced.remove(&id).is_some() {
            if let Err(e) = self.store.put::<u64>(kept::ANNOUNCED, &id.to_string(), None) {
                tracing::warn!(id, error = %e, "cannot drop an mComponent announced lost from the managers' state");
            }
        }
    }

    /// The fence mComponent `id` is to act on (0: none), given the last it acted on
    /// (`fenced_by`): one announced lost is fenced by every answer until it names its fence
    /// back, which ends it. An answer that fenced it may be lost on the way, or made for a
    /// call its sender had given up; the next one must fence it again.
    pub(super) fn fence(&self, id: u32, fenced_by: u64) -> u64 {
        let mut announced = self.announced.lock().unwrap();
        match announced.get_mut(&id) {
            None => 0,
            Some(a) if a.fence != fenced_by => {
                a.told = true;
                a.fence
            }
            Some(_) => {
                self.unannounce(&mut announced, id);
                tracing::info!(id, "an mComponent fenced after it was declared lost acted on its fence");
                0
            }
        }
    }

    /// Drops every registration `store` keeps.
    pub(super) fn forget_all(store: &state::Store) -> anyhow::Result<()> {
        for m in store.load::<kept::Member>(kept::MEMBERS)? {
            store.put::<kept::Member>(kept::MEMBERS, &m.info.id.to_string(), None)?;
        }
        Ok(())
    }

    /// The registrations kept in `store`, each with a fresh start: whether a component is
    /// alive is learnt again from its heartbeats.
    pub(super) fn resume(store: &state::Store, now: Instant) -> anyhow::Result<Vec<Entry>> {
        Ok(store
            .load::<kept::Member>(kept::MEMBERS)?
            .into_iter()
            .map(|m| Entry {
                info: m.info,
                key: m.key,
                last: now,
                pending: 0,
                links: Vec::new(),
                files_gone: m.files_gone,
                start: m.start,
                ebbs: m.ebbs,
            })
            .collect())
    }

    pub(crate) fn snapshot(&self) -> Vec<ComponentInfo> {
        let at = self.at();
        self.comps()
            .values()
            .map(|e| ComponentInfo {
                alive: at.alive(e),
                since_heartbeat_ms: at.silent(e).as_millis() as u64,
                lost: at.lost(e),
                cordoned: self.cordons.has(e.info.id),
                ..e.info.clone()
            })
            .collect()
    }

    pub(super) fn register(&self, r: X2G_REGISTER) -> Result<G2X_REGISTERED, Refusal> {
        let ebbs = checked_ebbs(r.ebbs)?;
        if r.addr.len() > MAX_ADDR {
            return Err(MembershipError::AddrTooLong.into());
        }
        let peer = current_peer();
        if let Some(p) = peer.filter(|p| p.role != r.role && p.role != Role::Admin) {
            return Err(MembershipError::NotItsRole {
                peer: p.role.name(),
                role: r.role.name(),
            }
            .into());
        }
        let key = peer.map(|p| p.key);
        // Registrations one at a time: each picks its id and finds what it replaces from the
        // membership, then writes to the state without the membership's lock (which every
        // heartbeat waits for, and a write to etcd takes milliseconds), then changes it.
        let _one_at_a_time = self.registering.lock().unwrap();
        let comps = self.comps();
        let at = self.at();
        // A component restarting at the same address replaces its old entry (with new
        // credentials, after the old entry was forgotten).
        if comps
            .values()
            .any(|e| e.info.addr == r.addr && e.info.role == r.role && e.key != key && at.alive(e))
        {
            return Err(MembershipError::OtherCredentials {
                role: r.role.name(),
                addr: r.addr,
            }
            .into());
        }
        // A registration under an id these managers do not hold, from the address of a live
        // component with another: an earlier start's, arriving late (read from the dead
        // start's connection after the new one registered). It would replace the live start.
        if r.id != 0
            && !comps.contains_key(&r.id)
            && comps
                .values()
                .any(|e| e.info.addr == r.addr && e.info.role == r.role && e.info.id != r.id && at.alive(e))
        {
            return Err(MembershipError::Replaced { id: r.id, addr: r.addr }.into());
        }
        let replaces = |e: &Entry| e.info.addr == r.addr && e.info.role == r.role;
        let before: Vec<LostPcomp> = comps
            .values()
            .filter(|e| replaces(e) && r.role == Role::Proc)
            .filter_map(|e| {
                Some(LostPcomp {
                    key: e.key?,
                    id: e.info.id,
                })
            })
            .collect();
        let earlier: Vec<u32> = comps.values().filter(|e| replaces(e)).map(|e| e.info.id).collect();
        let taken = |id: u32| id == 0 || comps.get(&id).is_some_and(|e| !replaces(e));
        // The same start registering again without the id its first registration got (that
        // answer lost, or this request handled after a later one): the same id, not a new
        // one that would replace it.
        let asked = match (r.id, r.start) {
            (0, start) if start != 0 => comps
                .values()
                .find(|e| e.info.addr == r.addr && e.info.role == r.role && e.start == start)
                .map_or(0, |e| e.info.id),
            (id, _) => id,
        };
        let again = !taken(asked);
        let id = if again {
            asked
        } else {
            std::iter::repeat_with(|| splitos_rpc::auth::random_u64() as u32)
                .find(|id| !taken(*id))
                .expect("an endless supply")
        };
        // A detach or drain under way goes on across a registration under the same id (the
        // managers had lost its registration): it ends as the admin asked. A new start of the
        // mComponent, under a new id, replaces it: what it held is gone, as after a loss.
        let leaving = comps
            .get(&id)
            .filter(|e| again && replaces(e))
            .and_then(|e| e.info.leaving.clone());
        let info = ComponentInfo {
            id,
            role: r.role,
            addr: r.addr.clone(),
            shim_sock: r.shim_sock,
            nics: r.nics,
            load: r.load,
            alive: true,
            since_heartbeat_ms: 0,
            lost: false,
            metrics: r.metrics,
            cordoned: false,
            leaving,
        };
        let e = Entry {
            info,
            key,
            last: self.now(),
            pending: 0,
            links: Vec::new(),
            files_gone: false,
            start: r.start,
            ebbs,
        };
        drop(comps);
        // Kept before anything changes: a manager that cannot keep it (it stopped leading)
        // registers nobody, and changes nothing.
        self.keep(&e).map_err(MembershipError::Keep)?;
        let mut comps = self.comps();
        comps.retain(|_, e| !replaces(e));
        let replacing = !earlier.is_empty();
        for old in earlier.iter().filter(|old| **old != id) {
            self.unkeep(*old);
            self.drop_fence(*old);
        }
        // A new start of a pComponent in place of an earlier one: the earlier one's programs
        // are gone (the same start registering again keeps its key and id).
        for l in before.into_iter().filter(|l| Some(l.key) != key || l.id != id) {
            tracing::warn!(id = l.id, addr = %r.addr, "a pComponent was replaced by a new start; its processes' memory is released");
            self.replaced.push(l);
        }
        // One replaced that registers again (it lived on after a registration of another start
        // at its address, a late one perhaps) is a member again, fenced: named replaced, it
        // would be announced lost at every answer, and fenced again each time it acted on that.
        if again && r.role == Role::Mem {
            self.replaced_mcomps.forget(&id);
        }
        // A new start of an mComponent in place of an earlier one: the earlier one's copies
        // are gone.
        for old in earlier.into_iter().filter(|old| *old != id && r.role == Role::Mem) {
            tracing::warn!(id = old, addr = %r.addr, "an mComponent was replaced by a new start; the homes rebuild the copies it held");
            self.replaced_mcomps.push(old);
        }
        // One declared lost that registers again (it was forgotten meanwhile) is fenced too.
        let fence = match r.role {
            Role::Mem => self.fence(id, r.fenced_by),
            _ => 0,
        };
        if fence != 0 {
            tracing::warn!(id, addr = %r.addr, "an mComponent declared lost registers again: fenced, it drops its copies");
            crate::series::MCOMPONENTS_FENCED.increment(1);
        }
        if r.standby && r.role == Role::Mem && !again {
            if let Err(err) = self.cordons.set(id, true) {
                tracing::warn!(id, error = %err, "cannot keep the cordon of a standby mComponent; it takes memory");
            }
        }
        tracing::info!(id, role = r.role.name(), addr = %r.addr, again, "component registered");
        crate::series::REGISTRATIONS.increment(1);
        comps.insert(id, e);
        // A new start at a new address changes only what may be a view old (the memory that
        // takes vRegions); a view worked out at each of a datacenter's starting components
        // would walk the membership at every heartbeat between two registrations.
        if again || replacing || fence != 0 {
            self.views.changed();
        }
        crate::series::COMPONENTS.set(comps.len() as f64);
        Ok(G2X_REGISTERED {
            id,
            vregion_size: self.vregion_size,
            replication: self.replication,
            overcommit: self.overcommit,
            fence,
            vnodes: self.vnodes.version(),
            beat_ms: self.period.tell(comps.len(), self.now()).as_millis() as u32,
        })
    }

    /// Answers a heartbeat, with the period to the next one.
    pub(super) fn heartbeat(&self, r: X2G_HEARTBEAT) -> Result<G2X_BEAT, Refusal> {
        let answer = self.answer_heartbeat(r)?;
        crate::series::HEARTBEATS.increment(1);
        Ok(G2X_BEAT {
            beat_ms: self.beat_ms(),
            ..answer
        })
    }

    /// The heartbeat period to tell a component now, in ms.
    fn beat_ms(&self) -> u32 {
        let components = self.comps.lock().unwrap().len();
        self.period.tell(components, self.now()).as_millis() as u32
    }

    fn answer_heartbeat(&self, r: X2G_HEARTBEAT) -> Result<G2X_BEAT, Refusal> {
        // A list out of bounds keeps the one registered: a heartbeat refused would make the
        // component look dead.
        let ebbs = checked_ebbs(r.ebbs)
            .inspect_err(|e| {
                static BAD_EBBS: splitos_rpc::refusals::Refusals = splitos_rpc::refusals::Refusals::new("heartbeats naming Ebbs out of bounds");
                if BAD_EBBS.log_this(format_args!("component {}", r.id)) {
                    tracing::warn!(id = r.id, error = %e, "a heartbeat named Ebbs out of bounds; its registered ones are kept");
                }
            })
            .ok();
        let mut comps = self.comps();
        {
            let mut last_any = self.last_any.lock().unwrap();
            if self.since(*last_any) > self.period.alive_for() {
                tracing::warn!(
                    silent_ms = self.since(*last_any).as_millis() as u64,
                    "the global managers heard no heartbeat for a while (they were stalled or cut off): every component gets a fresh start before any is taken for lost"
                );
                let now = self.now();
                for e in comps.values_mut() {
                    e.last = now;
                }
                self.views.changed();
            }
            *last_any = self.now();
        }
        // A component reports links only to components the managers know, a bounded number.
        let links: Vec<LinkSample> = r
            .links
            .into_iter()
            .filter(|l| comps.contains_key(&l.peer))
            .take(MAX_LINKS)
            .collect();
        let Some(e) = comps
            .get_mut(&r.id)
            .filter(|e| e.info.addr == r.addr && current_peer().is_none_or(|p| Some(p.key) == e.key))
        else {
            // A detached mComponent whose `exit` answer was lost is told again, rather than
            // registering as a new one.
            if current_peer().is_none_or(|p| p.role == Role::Mem) && self.detached.current().contains(&r.id) {
                return Ok(G2X_BEAT {
                    cordoned: true,
                    leaving: vec![r.id],
                    exit: true,
                    ..G2X_BEAT::nothing()
                });
            }
            return Err(MembershipError::NotRegistered { id: r.id, addr: r.addr }.into());
        };
        let at = self.at();
        // The view may name one that was lost: every answer from now on must not. One only
        // late changes nothing an answer must show at once; were every late heartbeat to work
        // the view out again, managers running behind (a registration storm, a stall) would
        // walk the whole membership at each heartbeat and fall further behind.
        if at.lost(e) {
            tracing::info!(id = r.id, addr = %e.info.addr, "component is back");
            self.views.changed();
        } else if !at.alive(e) {
            tracing::debug!(id = r.id, addr = %e.info.addr, "a late heartbeat");
        }
        // It was announced lost while silent, so its copies may have been rebuilt elsewhere:
        // what it holds may be older.
        // (Only one silent for longer than `reclaim_dead` is announced, and it leaves the set
        // once it acted on its fence: being in it is enough, also after a restart of the
        // managers, which gives every component a fresh start.)
        let fence = match e.info.role == Role::Mem && self.replication != Replication::None {
            true => self.fence(r.id, r.fenced_by),
            false => 0,
        };
        let fenced = fence != 0;
        if fenced {
            tracing::warn!(id = r.id, addr = %e.info.addr, "an mComponent declared lost is back: fenced, it drops its copies");
            crate::series::MCOMPONENTS_FENCED.increment(1);
        }
        e.info.load = r.load;
        let files_gone = e.files_gone;
        let was_leaving = e.info.leaving.is_some();
        let exit = Gm::leaving_report(e, r.leaving);
        e.links = links;
        let mut changed = e.files_gone != files_gone;
        if let Some(ebbs) = ebbs.filter(|ebbs| *ebbs != e.ebbs) {
            e.ebbs = ebbs;
            changed = true;
        }
        if changed {
            self.keep_change(e);
        }
        if e.info.leaving.is_some() != was_leaving {
            self.views.changed();
        }
        e.last = self.now();
        e.pending = 0;
        let role = e.info.role;
        if !matches!(role, Role::Mem | Role::Net | Role::Proc) {
            return Ok(G2X_BEAT::nothing());
        }
        // Only what is known to be gone: after a restart of the global managers a pComponent
        // that has not registered again yet is not lost, merely not heard of.
        let view = self.view(&comps);
        // An nComponent closes the sockets of lost pComponents.
        if role == Role::Net {
            return Ok(G2X_BEAT {
                lost: view.lost.clone(),
                ..G2X_BEAT::nothing()
            });
        }
        // Memory that takes new vRegions: a standby, cordoned or leaving mComponent's is not
        // there to be promised (heuristic overcommit refuses a mapping larger than this;
        // a pComponent answers the changes no home would refuse before the home has them).
        // A pComponent closes its direct connections with lost pComponents, and waits for an
        // mComponent that does not answer until it is among the lost ones.
        if role == Role::Proc {
            let mut lost_mcomps = self.told_lost(&view, r.id);
            lost_mcomps.extend(&view.detached);
            return Ok(G2X_BEAT {
                lost: view.lost.clone(),
                lost_mcomps,
                memory: view.memory,
                vnodes: self.vnodes.version(),
                cordoned: self.cordons.has(r.id),
                ..G2X_BEAT::nothing()
            });
        }
        // One fenced now drops everything, rebuilding nothing: it is told the lost as they are.
        let lost_mcomps = match fenced {
            true => view.lost_mcomps.clone(),
            false => self.told_lost(&view, r.id),
        };
        // Told to exit once its departure is kept: a successor tells it again if this answer
        // is lost (else it would register anew, an ordinary member, its detach never ended).
        let exit = exit
            && self.may_write()
            && {
                let kept = self.detached.keep(r.id);
                if let Err(e) = &kept {
                    self.write_failed();
                    tracing::warn!(id = r.id, error = %e, "cannot keep a detached mComponent's departure in the managers' state: it exits at a later heartbeat");
                }
                kept.is_ok()
            };
        if exit {
            // Forgotten before it goes: its silence is no loss, and nothing is rebuilt.
            comps.shift_remove(&r.id);
            self.views.changed();
            self.unkeep(r.id);
            // It can no longer name a fence back: gone, it needs none.
            self.drop_fence(r.id);
            crate::series::MCOMPONENTS_DETACHED.increment(1);
            tracing::info!(id = r.id, addr = %r.addr, "mComponent detached: it holds nothing any more and exits");
        }
        Ok(G2X_BEAT {
            lost: view.lost.clone(),
            lost_mcomps,
            fence,
            memory: view.memory,
            leaving: view.leaving.clone(),
            exit,
            rebalance: view.rebalance,
            keep: view.quotas.get(&r.id).cloned().unwrap_or_default(),
            ..G2X_BEAT::nothing()
        })
    }
}

/// Forgets the components kept in the managers' state `file` (signed with the key in
/// `key`), before the managers start: `cluster up` starts every component anew, and the last
/// start's would show as lost until forgotten. What else the state keeps (tokens, vNodes,
/// cordons) stays.
pub fn forget_components(file: &std::path::Path, key: &std::path::Path) -> anyhow::Result<()> {
    let store = state::Store::open(file, state::StateKey::at(key, false)?)?;
    Gm::forget_all(&store)
}
