//! The virtual-memory calls of the processes this mComponent is home of (`P2M_PROC_CREATE`,
//! `P2M_MMAP`, `P2M_MUNMAP`, `P2M_MPROTECT`, `P2M_MREMAP`, `P2M_DONTNEED`, `P2M_FORK`,
//! `P2M_EXIT`): each changes the home's layout within the vNode's quota and goes to the
//! replicas of the vRegions it touches.
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use super::{ignore_unknown, lock_home, HomeError, HomeProc, MOVE_BATCH, PROT_WRITE};
use crate::{Mem, Peers, PAGE};
use splitos_core::vma::{Vma, VmaMap};

/// How many ended processes are remembered per pComponent: enough for the creations it sent
/// again during one pause of this mComponent.
const ENDED_KEPT: usize = 4096;

/// Processes that ended, or whose creation was given up, by their pComponent's key, each with
/// the last of its creations that is over (`P2M_PROC_CREATE.attempt`): a creation up to that one
/// that comes after is late, and refused; a later one was sent after, and is made. The last
/// [`ENDED_KEPT`] of each pComponent, so that one ending many (made-up) processes pushes out
/// none of another's. (Keys come from credentials the cluster's authority issued: there are as
/// many as its pComponents.)
#[derive(Default)]
pub(crate) struct Ended(std::collections::HashMap<Option<[u8; 32]>, std::collections::VecDeque<(u64, u32)>>);

impl Ended {
    fn remember(&mut self, creator: Option<[u8; 32]>, pid: u64, upto: u32) {
        let pids = self.0.entry(creator).or_default();
        if pids.len() == ENDED_KEPT {
            pids.pop_front();
        }
        pids.push_back((pid, upto));
    }

    /// Whether creation `attempt` of `pid` is over: late, and refused.
    fn refuses(&self, creator: Option<[u8; 32]>, pid: u64, attempt: u32) -> bool {
        self.0
            .get(&creator)
            .is_some_and(|pids| pids.iter().any(|&(p, upto)| p == pid && attempt <= upto))
    }
}

impl<P: Peers> Mem<P> {
    /// Refuses a process id already in use here: a pComponent may not take over another's
    /// process by forking into its id.
    fn fresh_pid(&self, pid: u64) -> Result<(), Refusal> {
        if self.homes.lock().unwrap().contains_key(&pid) {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(HomeError::PidInUse { pid }.into());
        }
        Ok(())
    }

    /// Makes the home of a new process. A pComponent sends a creation again when the first
    /// got no answer in time (this mComponent paused, or its answer lost): the same process
    /// from the same pComponent gets the same answer, and a creation that comes after its
    /// pComponent said the process ended (it gave up and made it elsewhere) is refused.
    pub(crate) fn proc_create(&self, r: P2M_PROC_CREATE) -> Result<M2P_HOME, Refusal> {
        let creator = splitos_rpc::current_peer().map(|p| p.key);
        let pid = r.who.pid;
        let hp = Arc::new(Mutex::new(HomeProc {
            who: Who {
                epoch: 0,
                ..r.who.clone()
            },
            creator,
            pcomp: r.pcomp,
            base: r.region_base,
            limit: r.region_base.saturating_add(r.region_size),
            layout: VmaMap::default(),
            vregions: BTreeMap::new(),
            epoch: 1,
            backup: None,
            retired: Vec::new(),
            exited: false,
            moved_to: None,
            handed: false,
            adopted_from: None,
            memory_quota: r.memory_quota,
            charged: 0,
            attempt: r.attempt,
        }));
        // Held until the home is whole: a creation sent again, and the process's first
        // calls, wait for it.
        let mut h = hp.lock().unwrap();
        let earlier = {
            // Both held, in this order, as an end of the process not made here records it.
            let ended = self.ended.lock().unwrap();
            if ended.refuses(creator, pid, r.attempt) {
                crate::series::CREATIONS_AFTER_END.increment(1);
                return Err(HomeError::EndedBeforeCreated { pid }.into());
            }
            let mut homes = self.homes.lock().unwrap();
            let earlier = homes.get(&pid).cloned();
            if earlier.is_none() {
                homes.insert(pid, hp.clone());
            }
            earlier
        };
        if let Some(earlier) = earlier {
            drop(h);
            return self.created_again(&earlier, &r, creator);
        }
        // Shows the vNode and its quota before it maps anything.
        if let Err(e) = self.quotas.reserve(&r.who.vnode, r.memory_quota, 0) {
            // A repeat waiting on its lock must not answer for a home that was never made.
            h.exited = true;
            self.homes.lock().unwrap().remove(&pid);
            return Err(e.into());
        }
        self.sync_backup(&mut h);
        tracing::debug!(pid, vnode = %r.who.vnode, "home of a new process");
        Ok(M2P_HOME {
            backup: h.backup.clone(),
        })
    }

    /// The answer to a creation of a process already made here: the first's, if the same
    /// pComponent sends it again; a refusal otherwise (a pComponent may not take over
    /// another's process by creating its id). A later creation than the one that made it
    /// (the first given up, its undo not come yet) now owns it: that undo ends nothing.
    fn created_again(
        &self,
        earlier: &Arc<Mutex<HomeProc>>,
        r: &P2M_PROC_CREATE,
        creator: Option<[u8; 32]>,
    ) -> Result<M2P_HOME, Refusal> {
        let mut h = lock_home(earlier)?;
        let same = h.creator == creator
            && h.pcomp == r.pcomp
            && h.who.vnode == r.who.vnode
            && h.base == r.region_base
            && h.limit == r.region_base.saturating_add(r.region_size)
            && !h.exited;
        if !same {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(HomeError::PidInUse { pid: r.who.pid }.into());
        }
        crate::series::CREATIONS_REPEATED.increment(1);
        if r.attempt > h.attempt {
            h.attempt = r.attempt;
            self.sync_backup(&mut h);
        }
        Ok(M2P_HOME {
            backup: h.backup.clone(),
        })
    }

    pub(crate) fn mmap(&self, r: P2M_MMAP) -> Result<M2P_MAPPED, Refusal> {
        let hp = self.home_proc(&r.who)?;
        // Heuristic overcommit refuses only the obvious: one writable mapping larger than all
        // the cluster's memory, unless the program said it reserves no memory.
        if !r.noreserve {
            self.obvious_overcommit(r.len, r.prot)?;
        }
        let mut h = lock_home(&hp)?;
        // A fixed mapping replaces what it lands on.
        let replaced = if r.fixed {
            h.layout.writable_in(r.hint, r.hint.saturating_add(r.len))
        } else {
            0
        };
        let more = if r.prot & PROT_WRITE != 0 {
            r.len.saturating_sub(replaced)
        } else {
            0
        };
        let start = self.within_quota(&mut h, more, |m, h| {
            let start = if r.fixed {
                let end = h.check_range(r.hint, r.len)?;
                m.remove_range(h, r.hint, end)?;
                r.hint
            } else {
                h.layout
                    .find_gap(h.base, h.limit, r.len, r.hint)
                    .ok_or(HomeError::NoFreeRange)?
            };
            let added = m.add_range(h, start, start + r.len, r.prot);
            m.sync_backup(h);
            added.map(|()| start)
        })?;
        Ok(h.mapped(start, r.prot))
    }

    /// Runs `change` on process `h` within its vNode's memory quota: `more`, the most it can
    /// add to what the process maps writable, is reserved first, and the process is charged
    /// what it maps after the change, done or failed.
    fn within_quota<T>(
        &self,
        h: &mut HomeProc,
        more: u64,
        change: impl FnOnce(&Self, &mut HomeProc) -> Result<T, Refusal>,
    ) -> Result<T, Refusal> {
        self.quotas.reserve(&h.who.vnode, h.memory_quota, more)?;
        let out = change(self, h);
        let after = h.layout.writable_in(h.base, h.limit);
        self.quotas.settle(&h.who.vnode, more, h.charged, after);
        h.charged = after;
        out
    }

    /// Heuristic overcommit refuses only the obvious, as Linux's does: making writable at
    /// once more than all the cluster's memory (unless the program said it reserves none).
    fn obvious_overcommit(&self, len: u64, prot: u32) -> Result<(), Refusal> {
        // Until the first heartbeat's answer says how much the cluster has, this mComponent's
        // own capacity stands in for it.
        let memory = Some(self.cluster_memory.load(Relaxed))
            .filter(|m| *m > 0)
            .unwrap_or(self.capacity);
        if !self.charges_mappings() && prot & 2 != 0 && len > memory {
            self.c.out_of_memory.fetch_add(1, Relaxed);
            return Err(HomeError::MoreThanCluster { len, memory }.into());
        }
        Ok(())
    }

    pub(crate) fn munmap(&self, r: P2M_MUNMAP) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = lock_home(&hp)?;
        let end = h.check_range(r.addr, r.len)?;
        let removed = self.within_quota(&mut h, 0, |m, h| m.remove_range(h, r.addr, end));
        self.sync_backup(&mut h);
        removed.map(|()| OK)
    }

    pub(crate) fn mprotect(&self, r: P2M_MPROTECT) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = lock_home(&hp)?;
        let end = h.check_range(r.addr, r.len)?;
        if !h.layout.covers(r.addr, end) {
            return Err(HomeError::MprotectUnmapped.into());
        }
        self.obvious_overcommit(r.len, r.prot)?;
        let more = if r.prot & PROT_WRITE != 0 {
            r.len - h.layout.writable_in(r.addr, end)
        } else {
            0
        };
        self.within_quota(&mut h, more, |m, h| {
            for (idx, s, e) in m.slices(r.addr, end) {
                m.ensure_owners(h, idx)?;
                m.to_replicas(h, idx, |who| M2M_VMA_PROTECT {
                    who,
                    start: s,
                    end: e,
                    prot: r.prot,
                })?;
            }
            for (s, v) in h.layout.carve(r.addr, end) {
                h.layout.set(s, Vma { prot: r.prot, ..v });
            }
            Ok(())
        })?;
        self.sync_backup(&mut h);
        Ok(OK)
    }

    pub(crate) fn dontneed(&self, r: P2M_DONTNEED) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = lock_home(&hp)?;
        let end = h.check_range(r.addr, r.len)?;
        for (idx, s, e) in self.slices(r.addr, end) {
            if h.vregions.contains_key(&idx) {
                self.to_replicas(&mut h, idx, |who| M2M_DISCARD { who, start: s, end: e })
                    .or_else(|e| ignore_unknown(Err(e)))?;
            }
        }
        Ok(OK)
    }

    pub(crate) fn mremap(&self, r: P2M_MREMAP) -> Result<M2P_MAPPED, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = lock_home(&hp)?;
        let writable = h.layout.writable_in(r.old, r.old.saturating_add(r.old_len)) > 0;
        let more = if writable {
            r.new_len.saturating_sub(r.old_len)
        } else {
            0
        };
        let out = self.within_quota(&mut h, more, |m, h| m.mremap_locked(h, r));
        self.sync_backup(&mut h);
        out
    }

    fn mremap_locked(&self, h: &mut HomeProc, r: P2M_MREMAP) -> Result<M2P_MAPPED, Refusal> {
        let P2M_MREMAP {
            who: _,
            old,
            old_len,
            new_len,
            may_move,
            fixed_to,
        } = r;
        let old_end = h.check_range(old, old_len)?;
        let Some((_, vma)) = h.layout.find(old).filter(|_| h.layout.covers(old, old_end)) else {
            return Err(HomeError::MremapUnmapped.into());
        };
        let prot = vma.prot;
        if fixed_to.is_none() && new_len <= old_len {
            if new_len < old_len {
                self.remove_range(h, old + new_len, old_end)?;
            }
            return Ok(h.mapped(old, prot));
        }
        if fixed_to.is_none()
            && old.checked_add(new_len).is_some_and(|e| e <= h.limit)
            && h.layout.is_free(old_end, old + new_len)
        {
            self.add_range(h, old_end, old + new_len, prot)?;
            h.layout.remove_range(old, old + new_len);
            h.layout.insert(
                old,
                Vma {
                    end: old + new_len,
                    prot,
                    accounted: false,
                },
            );
            return Ok(h.mapped(old, prot));
        }
        if !may_move && fixed_to.is_none() {
            return Err(HomeError::CannotGrowInPlace.into());
        }
        let new = match fixed_to {
            Some(at) => {
                let end = h.check_range(at, new_len)?;
                self.remove_range(h, at, end)?;
                at
            }
            None => h
                .layout
                .find_gap(h.base, h.limit, new_len, 0)
                .ok_or(HomeError::NoRangeForMremap)?,
        };
        self.add_range(h, new, new + new_len, prot)?;
        self.move_pages(h, old, old + old_len.min(new_len), new)?;
        self.remove_range(h, old, old_end)?;
        Ok(h.mapped(new, prot))
    }

    /// Moves the materialized pages of [start, end) to the same offsets from `to`.
    fn move_pages(&self, h: &HomeProc, start: u64, end: u64, to: u64) -> Result<(), Refusal> {
        let shift = |vpn: u64| vpn - start / PAGE + to / PAGE;
        let who = h.who();
        for (idx, s, e) in self.slices(start, end) {
            let Some(set) = h.vregions.get(&idx).map(|r| r.wire(idx)) else {
                continue;
            };
            // Every page once: from the primary of a replica set, from each data member of a
            // striped one.
            let sources: Vec<ComponentRef> = match set.data {
                0 => vec![set.owners[0].clone()],
                k => set
                    .distinct()
                    .into_iter()
                    .filter(|o| set.owners[..k as usize].iter().any(|d| d.id == o.id))
                    .cloned()
                    .collect(),
            };
            for src in sources {
                // Copied, not taken: the old range is removed only after every copy landed.
                let mut from = s;
                loop {
                    let M2M_PAGES { pages, more } = self.to_owner(
                        &src,
                        M2M_READ_PAGES {
                            who: who.clone(),
                            from,
                            end: e,
                            max: MOVE_BATCH,
                            parity: false,
                        },
                    )?;
                    if let Some((last, _)) = pages.last() {
                        from = (last + 1) * PAGE;
                    }
                    let mut by_owner: BTreeMap<u32, (ComponentRef, Vec<(u64, ByteBuf)>)> = BTreeMap::new();
                    for (vpn, data) in pages {
                        let nv = shift(vpn);
                        let to = h
                            .vregions
                            .get(&(nv * PAGE / self.vrs()))
                            .map(|r| r.wire(nv * PAGE / self.vrs()))
                            .ok_or(HomeError::MovedToInactive)?;
                        for o in to.writers(nv) {
                            by_owner
                                .entry(o.id)
                                .or_insert_with(|| (o.clone(), Vec::new()))
                                .1
                                .push((nv, data.clone()));
                        }
                    }
                    for (_, (o, pages)) in by_owner {
                        self.to_owner(
                            &o,
                            M2M_PUT_PAGES {
                                who: who.clone(),
                                pages,
                                put: Put::Write,
                            },
                        )?;
                    }
                    if !more {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    pub(crate) fn home_fork(&self, r: P2M_FORK) -> Result<M2P_FORKED, Refusal> {
        let P2M_FORK { parent, child } = r;
        let hp = self.home_proc(&parent)?;
        let mut h = lock_home(&hp)?;
        // After the parent's lock: a fork sent again (its answer late or lost) waits for the
        // first, and gets its answer.
        let earlier = self.homes.lock().unwrap().get(&child).cloned();
        if let Some(earlier) = earlier.filter(|_| child != parent.pid) {
            let of = (h.creator, h.pcomp, h.who.vnode.clone());
            drop(h);
            return self.forked_again(&earlier, of);
        }
        self.fresh_pid(child)?;
        // The child maps what its parent does: charged as much, or refused.
        self.quotas.reserve(&h.who.vnode, h.memory_quota, h.charged)?;
        let vrs = self.vrs();
        let idxs: Vec<u64> = h.vregions.keys().copied().collect();
        for idx in idxs {
            let forked = self.to_replicas(&mut h, idx, |who| M2M_FORK {
                parent: who,
                child,
                start: idx * vrs,
                end: (idx + 1) * vrs,
            });
            if let Err(e) = forked {
                self.quotas.settle(&h.who.vnode, h.charged, 0, 0);
                for o in h.all_owners() {
                    let _ = self.to_owner(
                        &o,
                        M2M_EXIT {
                            who: Who { pid: child, ..h.who() },
                        },
                    );
                }
                return Err(e);
            }
        }
        let mut copy = HomeProc {
            who: Who {
                pid: child,
                ..h.who.clone()
            },
            creator: h.creator,
            pcomp: h.pcomp,
            base: h.base,
            limit: h.limit,
            layout: h.layout.clone(),
            vregions: h.vregions.clone(),
            epoch: h.epoch,
            backup: h.backup.clone(),
            retired: Vec::new(),
            exited: false,
            moved_to: None,
            handed: false,
            adopted_from: None,
            memory_quota: h.memory_quota,
            charged: h.charged,
            attempt: 0,
        };
        self.sync_backup(&mut copy);
        let forked = copy.forked();
        self.homes.lock().unwrap().insert(child, Arc::new(Mutex::new(copy)));
        Ok(forked)
    }

    /// The answer to a fork into `earlier`, a process already made here: the first's, if the
    /// parent's pComponent (`of`: its key, its id, the vNode) sends it again (a random child
    /// id is never another fork's); a refusal otherwise.
    fn forked_again(
        &self,
        earlier: &Arc<Mutex<HomeProc>>,
        of: (Option<[u8; 32]>, u32, String),
    ) -> Result<M2P_FORKED, Refusal> {
        let c = lock_home(earlier)?;
        if (c.creator, c.pcomp, &c.who.vnode) != (of.0, of.1, &of.2) || c.exited {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(HomeError::PidInUse { pid: c.who.pid }.into());
        }
        crate::series::CREATIONS_REPEATED.increment(1);
        Ok(c.forked())
    }

    pub(crate) fn home_exit(&self, r: P2M_EXIT) -> Result<OK, Refusal> {
        let hp = match self.home_proc(&r.who) {
            Ok(hp) => hp,
            Err(e @ HomeError::NotHome { .. }) => {
                if self.ended_unmade(r.who.pid) {
                    return Err(e.into());
                }
                // Made meanwhile: its creation, on its way, came first.
                self.home_proc(&r.who)?
            }
            Err(e) => return Err(e.into()),
        };
        let h = hp.lock().unwrap();
        let attempt = h.attempt;
        if !self.take_home(&h, &hp, r.who.pid, attempt) {
            // Ended meanwhile by another call.
            return Err(HomeError::NotHome {
                mcomp: self.peers.id(),
                pid: r.who.pid,
            }
            .into());
        }
        self.end_home(h, r.who.pid)
    }

    /// Takes process `pid`'s home `hp` (locked: `h`) out of this mComponent's homes if it is
    /// still the one there, and at once holds its creations up to `upto` over: a repeat of
    /// one still on its way (answer lost, home paused) is late, and must not make it again
    /// in between. Whether it was still there.
    fn take_home(&self, h: &HomeProc, hp: &Arc<Mutex<HomeProc>>, pid: u64, upto: u32) -> bool {
        // In this order, as a creation checks and makes it.
        let mut ended = self.ended.lock().unwrap();
        let mut homes = self.homes.lock().unwrap();
        if !homes.get(&pid).is_some_and(|there| Arc::ptr_eq(there, hp)) {
            return false;
        }
        homes.remove(&pid);
        ended.remember(h.creator, pid, upto);
        true
    }

    /// Frees everything of a process taken out of the homes ([`Mem::take_home`]): its charge,
    /// its pages on every member, its backup files and its backup home's copy. A home that
    /// moved away meanwhile answers where it went, and frees nothing here.
    fn end_home(&self, mut h: std::sync::MutexGuard<'_, HomeProc>, pid: u64) -> Result<OK, Refusal> {
        if let Some(to) = &h.moved_to {
            return Err(HomeError::Moved {
                pid,
                to: to.id,
                addr: to.addr.clone(),
            }
            .into());
        }
        h.exited = true;
        self.quotas.settle(&h.who.vnode, 0, h.charged, 0);
        h.charged = 0;
        let owners = h.all_owners();
        let retired: Vec<ComponentRef> = h
            .retired
            .iter()
            .filter(|r| !owners.iter().any(|o| o.id == r.id))
            .cloned()
            .collect();
        let mut orphaned: Vec<ComponentRef> = Vec::new();
        let current = owners.into_iter().map(|o| (o, false));
        for (o, was_retired) in current.chain(retired.into_iter().map(|o| (o, true))) {
            // A late owner is waited for: what it holds of the process would stay charged. A
            // retired one left the process's sets because it was lost or replaced: it is told
            // once, never waited for (the managers may have forgotten it, and a wait for it
            // would hold the process's home).
            let sent = if was_retired {
                self.to_owner(&o, M2M_EXIT { who: h.who() })
            } else {
                self.to_only_copy(&o, || M2M_EXIT { who: h.who() })
            };
            if let Err(e) = sent {
                tracing::warn!(pid, owner = o.id, error = %e, "owner did not free an exited process's memory");
                // A logger drops the process's backup files after what it still streams
                // there; those of a logger that cannot are dropped here.
                let logged = h
                    .vregions
                    .iter()
                    .filter(|(i, s)| s.wire(**i).logger().is_some_and(|l| l.id == o.id))
                    .filter_map(|(_, s)| s.log.clone());
                orphaned.extend(logged.collect::<Vec<_>>());
            }
        }
        orphaned.sort_by_key(|s| s.id);
        orphaned.dedup_by_key(|s| s.id);
        for scomp in orphaned {
            if let Err(e) = self.peers.call(
                &scomp.addr,
                M2S_LOG_DROP {
                    vnode: h.who.vnode.clone(),
                    pid: h.who.pid,
                },
            ) {
                tracing::warn!(pid, scomp = scomp.id, error = %e, "sComponent did not drop an exited process's backup files");
            }
        }
        if let Some(b) = &h.backup {
            if let Err(e) = self.peers.call(&b.addr, M2M_HOME_DROP { who: h.who() }) {
                tracing::warn!(pid, backup = b.id, error = %e, "backup home did not drop an exited process's state");
            }
        }
        Ok(OK)
    }

    /// Remembers that the sender's process `pid`, not made here, ended: its creation may be
    /// on its way still (sent to this mComponent while it was paused), and is refused.
    /// Whether it was not made meanwhile.
    fn ended_unmade(&self, pid: u64) -> bool {
        let creator = splitos_rpc::current_peer().map(|p| p.key);
        // Both held, as a creation checks and makes it.
        let mut ended = self.ended.lock().unwrap();
        if self.homes.lock().unwrap().contains_key(&pid) {
            return false;
        }
        // Not made here: any creation of it is late.
        ended.remember(creator, pid, u32::MAX);
        true
    }

    /// A creation its pComponent gave up (this home did not answer in time): the home it made,
    /// if no later creation made it, ends as at an exit; if it is still on its way it will be
    /// refused; a creation sent after (the managers picked this home again) is made.
    pub(crate) fn create_undo(&self, r: P2M_CREATE_UNDO) -> Result<OK, Refusal> {
        let creator = splitos_rpc::current_peer().map(|p| p.key);
        let pid = r.who.pid;
        crate::series::CREATIONS_UNDONE.increment(1);
        // Looked at again whenever a home was made or ended between two looks: the undo acts
        // on the home it checked, never on one a later creation made meanwhile.
        loop {
            let made = self.homes.lock().unwrap().get(&pid).cloned();
            let Some(hp) = made else {
                // Both held, as a creation checks and makes it.
                let mut ended = self.ended.lock().unwrap();
                if self.homes.lock().unwrap().contains_key(&pid) {
                    continue;
                }
                ended.remember(creator, pid, r.attempt);
                return Ok(OK);
            };
            let h = hp.lock().unwrap();
            if h.who.vnode != r.who.vnode {
                self.c.denied.fetch_add(1, Relaxed);
                return Err(HomeError::OtherVnode { pid }.into());
            }
            self.may_act(pid, h.creator).map_err(HomeError::from)?;
            if h.attempt > r.attempt {
                // Made by a later creation: this undo is late.
                return Ok(OK);
            }
            if self.take_home(&h, &hp, pid, r.attempt) {
                return self.end_home(h, pid);
            }
        }
    }

    /// Releases, as their exit would, the processes created by pComponents the global
    /// managers say are lost: nobody will ever exit them.
    pub(crate) fn reclaim_lost(&self, lost: &[LostPcomp]) {
        if lost.is_empty() {
            return;
        }
        let homes: Vec<(u64, Arc<Mutex<HomeProc>>)> = self
            .homes
            .lock()
            .unwrap()
            .iter()
            .map(|(pid, h)| (*pid, h.clone()))
            .collect();
        for (pid, h) in homes {
            let (who, orphan) = {
                let g = h.lock().unwrap();
                (
                    g.who.clone(),
                    lost.iter().any(|l| g.creator == Some(l.key) && g.pcomp == l.id),
                )
            };
            if !orphan {
                continue;
            }
            tracing::warn!(pid, "releasing the memory of a process whose pComponent is lost");
            crate::series::LOST_PROCESSES_RELEASED.increment(1);
            if let Err(e) = self.home_exit(P2M_EXIT { who }) {
                tracing::warn!(pid, error = %e, "cannot release a lost pComponent's process");
            }
        }
    }

    pub(crate) fn vregions(&self, r: P2M_VREGIONS) -> Result<M2P_VREGIONS, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let h = lock_home(&hp)?;
        Ok(M2P_VREGIONS {
            owners: h.owners(),
            epoch: h.epoch,
            backup: h.backup.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_pcomponent_ending_many_processes_pushes_out_none_of_anothers() {
        let (a, b) = (Some([1; 32]), Some([2; 32]));
        let mut ended = Ended::default();
        ended.remember(b, 7, 0);
        for pid in 0..2 * ENDED_KEPT as u64 {
            ended.remember(a, 1000 + pid, 0);
        }
        assert!(ended.refuses(b, 7, 0), "another pComponent's end is still remembered");
        assert!(!ended.refuses(a, 7, 0), "and only for it");
        assert!(!ended.refuses(a, 1000, 0), "a pComponent's own oldest go");
        assert!(ended.refuses(a, 1000 + 2 * ENDED_KEPT as u64 - 1, 0));
        assert_eq!(ended.0[&a].len(), ENDED_KEPT);
    }
}
