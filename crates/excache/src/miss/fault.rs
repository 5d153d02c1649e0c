//! A miss, step by step (the module documentation tells why each step is as it is):
//! [`MissPath::fault`] serves one fault, [`MissPath::claim`] claims a way (step 1),
//! [`MissPath::fill`] gets the line's contents (step 2) and [`MissPath::install`] puts it in the
//! program (step 3). What every claim does is here too, whichever options are on: take a way
//! ([`MissPath::claim_way`]), queue its set for the background evictor
//! ([`MissPath::claimed`]) and protect again the lines the policy looked at ([`MissPath::rearm`]).
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use splitos_rpc::Refusal;

use super::sample::unmap_batch;
use super::{
    Access, Claim, CleanVictim, Evictable, InstallAs, MissPath, ProcHeap, Sent, Source, State, Writeback, PAGE,
};
use crate::cache::{self, Filled, Line, LineState};
use crate::prefetch::SAMPLE;
use crate::region::Install;
use crate::store::Page;

impl MissPath {
    /// Serves one fault of `t` on page `vpn`.
    pub fn fault(&self, t: &Arc<ProcHeap>, vpn: u64, access: Access, t0: Instant) {
        let Some(mut claim) = self.claim(t, vpn, access) else {
            return;
        };
        let t_evicted = Instant::now();
        let (remote, tier_dirty) = match &claim.source {
            Source::Store => (true, None),
            Source::Tier(e) => (false, Some(e.dirty)),
            Source::Local => (false, None),
        };
        let ahead: Vec<u64> = claim.ahead.iter().map(|(v, _)| *v).collect();
        let filled = self.fill(t, vpn, claim.source, claim.victims, &ahead);
        let t_fetched = Instant::now();
        match filled {
            Ok((data, pages)) => {
                // A line installed writable is dirty from the start: no write to it can go unseen.
                // When the kernel tracks writes, a write costs no trap, so reads never predict one.
                let writable = access == Access::Write || (!t.region.tracks_writes() && t.predicts_write());
                if !writable {
                    // Only lines a read installed write-protected can show whether a write follows.
                    t.read_fills.fetch_add(1, Relaxed);
                }
                // A dirty tier entry stays dirty as a line (write-protected after a read all the
                // same, so that the process's write prediction still learns).
                let how = match (writable, tier_dirty) {
                    (true, _) => InstallAs::Writable,
                    (false, Some(true)) => InstallAs::ProtectedDirty,
                    (false, _) => InstallAs::Clean,
                };
                // A first touch written to goes in with its fault-around window in one step,
                // and the program wakes to find the whole window mapped.
                let with_around = data.is_none() && how.writable() && !claim.around.is_empty();
                let installed = if !claim.extent.is_empty() {
                    self.allocate_extent(t, vpn, claim.slot, &claim.extent, how)
                } else if with_around {
                    let mut run = claim.around.clone();
                    run.push((vpn, claim.slot));
                    self.install_zeros(t, &mut run, false)
                } else {
                    self.install(t, vpn, claim.slot, data.as_deref(), how)
                };
                if !installed && tier_dirty == Some(true) && t.alive() {
                    self.fail(
                        t,
                        &format!(
                            "cannot install heap page {:#x} from the compressed tier, which held its only copy",
                            vpn * PAGE
                        ),
                    );
                    return;
                }
                // Lines read ahead go in writable when most of those the process had read ahead
                // were written (each write to a protected line is a trap), else clean and
                // write-protected, or are staged as samples; those not fetched are given back.
                let ahead_how = if !t.region.tracks_writes() && t.predicts_ahead_write() {
                    InstallAs::Writable
                } else {
                    InstallAs::Ahead
                };
                let fetched = pages.len();
                let mut pages = pages.into_iter();
                for (v, slot) in &claim.ahead {
                    match pages.next() {
                        Some(p) if self.prefetch_count.fetch_add(1, Relaxed) % SAMPLE == SAMPLE - 1 => {
                            self.stage(t, *v, *slot, p)
                        }
                        Some(p) => {
                            if ahead_how == InstallAs::Ahead {
                                t.ahead_fills.fetch_add(1, Relaxed);
                            }
                            self.install(t, *v, *slot, Some(&p), ahead_how);
                        }
                        None => self.abandon(t, *v, *slot),
                    }
                }
                if fetched > 0 {
                    self.bump(t, |s| {
                        s.prefetched.fetch_add(fetched as u64, Relaxed);
                        s.bytes_fetched.fetch_add(fetched as u64 * PAGE, Relaxed);
                    });
                }
                if !with_around && !claim.around.is_empty() {
                    self.install_zeros(t, &mut claim.around, false);
                }
                if !claim.around.is_empty() {
                    self.bump(t, |s| {
                        s.faulted_around.fetch_add(claim.around.len() as u64, Relaxed);
                    });
                }
                self.preallocate(t, &mut claim.fresh);
            }
            Err(e) => {
                self.abandon(t, vpn, claim.slot);
                for (v, slot) in claim
                    .ahead
                    .iter()
                    .chain(&claim.around)
                    .chain(&claim.fresh)
                    .chain(&claim.extent)
                {
                    self.abandon(t, *v, *slot);
                }
                self.fail(t, &e.msg);
                return;
            }
        }
        let t_done = Instant::now();
        let parts = [t_evicted - t0, t_fetched - t_evicted, t_done - t_fetched].map(|d| (d.as_nanos() as u64).max(1));
        self.bump(t, |s| {
            let _ = s.evict_ns.lock().unwrap().record(parts[0]);
            if remote {
                let _ = s.rpc_ns.lock().unwrap().record(parts[1]);
                s.bytes_fetched.fetch_add(PAGE, Relaxed);
            } else if tier_dirty.is_some() {
                s.tier_hits.fetch_add(1, Relaxed);
            } else {
                s.plocal_fills.fetch_add(1, Relaxed);
            }
            let _ = s.install_ns.lock().unwrap().record(parts[2]);
            s.misses.fetch_add(1, Relaxed);
            let _ = s
                .miss_ns
                .lock()
                .unwrap()
                .record(((t_done - t0).as_nanos() as u64).max(1));
        });
        self.flush_unmaps();
    }

    /// Step 1: a hit is served here (a write to a write-protected line makes it dirty); a miss
    /// claims a way, evicting the policy's victim if the set is full. `None` when nothing more
    /// is to be done.
    fn claim(&self, t: &Arc<ProcHeap>, vpn: u64, access: Access) -> Option<Claim> {
        let mut g = self.state.lock().unwrap();
        loop {
            if !t.alive() {
                return None;
            }
            if let Some(slot) = g.cache.lookup(t.pid, vpn) {
                let line = *g.cache.line(slot);
                if matches!(line.state, LineState::Filling | LineState::Evicting) {
                    g = self.cv.wait(g);
                    continue;
                }
                if let Some(page) = g.staged.remove(&(t.pid, vpn)) {
                    self.unstage_used(&mut g, t, vpn, slot, &page, access);
                    return None;
                }
                // A write-protect fault on a line believed writable (its protection was set but
                // not recorded) is lifted too, or the writer would fault forever.
                if access != Access::Read && (line.wp || access == Access::WriteProtect) {
                    self.written(&mut g, t, slot);
                    if let Err(e) = t.region.write_protect(vpn, 1, false) {
                        tracing::warn!(pid = t.pid, error = %e, "cannot lift write protection");
                    }
                } else {
                    t.region.wake(vpn);
                }
                return None;
            }
            if access == Access::WriteProtect {
                // Evicted while the writer waited: woken, it faults again as a miss.
                t.region.wake(vpn);
                return None;
            }
            if g.inflight.contains(&(t.pid, vpn)) {
                g = self.cv.wait(g);
                continue;
            }
            let Some(c) = self.claim_way(&mut g, t.pid, vpn, Evictable::Any) else {
                g = self.cv.wait(g);
                continue;
            };
            g.cache.line_mut(c.slot).read_fill = access == Access::Read && t.region.tracks_writes();
            self.claimed(&mut g, t.pid, vpn);
            let (mut victims, mut lost) = (Vec::new(), Vec::new());
            if let Some(v) = c.victim {
                self.evict(&mut g, v, &mut victims, &mut lost, CleanVictim::ToTier);
            }
            self.rearm(&mut g, vpn);
            // The tier before the store: a tier entry is the page's newest version.
            let source = match g.tier.as_mut().and_then(|tier| tier.take(t.pid, vpn)) {
                Some(e) => Source::Tier(e),
                None if g.materialized.get(&t.pid).is_some_and(|s| s.contains(&vpn)) => Source::Store,
                None => Source::Local,
            };
            let ahead = if matches!(source, Source::Store) {
                self.claim_ahead(&mut g, t, vpn, &mut victims, &mut lost)
            } else {
                Vec::new()
            };
            let extent = if matches!(source, Source::Local) {
                self.claim_extent(&mut g, t, vpn)
            } else {
                Vec::new()
            };
            let mut around = if matches!(source, Source::Local) && extent.is_empty() {
                self.claim_around(&mut g, t, vpn, &mut victims, &mut lost)
            } else {
                Vec::new()
            };
            let fresh = around.split_off(around.len().min(self.fault_around as usize));
            drop(g);
            // The fail hook talks to the process (its stderr, a signal): never under the lock.
            for (vt, why) in lost {
                self.fail(&vt, &why.to_string());
            }
            return Some(Claim {
                slot: c.slot,
                victims,
                source,
                ahead,
                around,
                fresh,
                extent,
            });
        }
    }

    /// Claims a way for (pid, vpn) as [`cache::ExCache::claim`] or [`cache::ExCache::claim_clean`]
    /// does; a line whose writes the kernel tracks is asked about first.
    pub(super) fn claim_way(
        &self,
        g: &mut MutexGuard<'_, State>,
        pid: u64,
        vpn: u64,
        evictable: Evictable,
    ) -> Option<cache::Claim> {
        let st = &mut **g;
        let heaps = &st.heaps;
        // Written since it was last asked (dirty tracking by scan).
        let written = |l: &mut Line| {
            heaps
                .get(&l.pid)
                .filter(|t| t.region.tracks_writes())
                .is_some_and(|t| self.observe(t, l))
        };
        let used = |l: &mut Line| {
            if l.unmapped {
                heaps.get(&l.pid).is_some_and(|t| self.probe(t, l))
            } else {
                written(l)
            }
        };
        // A clean line that was only read needs no write-back: a claim that wants such a
        // victim asks about writes alone.
        let c = st.cache.claim_observing(
            pid,
            vpn,
            |l| evictable == Evictable::Any || (!l.dirty && !written(l)),
            used,
        )?;
        let owner = c.victim.and_then(|v| heaps.get(&v.pid));
        if let (Some(owner), Some(claimer)) = (owner, heaps.get(&pid)) {
            if !Arc::ptr_eq(&owner.stats, &claimer.stats) {
                self.bump(owner, |s| {
                    s.evicted_by_others.fetch_add(1, Relaxed);
                });
            }
        }
        if let Some(t) = heaps.get(&pid).filter(|_| st.cache.line(c.slot).pinned) {
            self.bump(t, |s| {
                s.pinned.fetch_add(1, Relaxed);
            });
        }
        Some(c)
    }

    /// Called under the lock after process `pid`'s claim took a way in `vpn`'s set: queues the
    /// set if it is short of its reserve, and wakes the evictor at the low watermark.
    pub(super) fn claimed(&self, g: &mut State, pid: u64, vpn: u64) {
        let Some(r) = g.reserve.as_mut() else { return };
        let set = g.cache.set_of(vpn);
        // Standing aside, it would wake to pick nothing.
        if g.cache.spare(set) >= r.ways || g.cache.evictor_stands_aside() {
            return;
        }
        if !r.queued[set] {
            r.queued[set] = true;
            r.short.push_back(set);
        }
        r.owed += 1;
        *r.owed_by.entry(pid).or_default() += 1;
        if r.owed == r.wake_at {
            self.evictor_cv.notify_one();
        }
    }

    /// Has the next use of the lines of `vpn`'s set whose reference bit the policy cleared
    /// observed: with access sampling their next touch (they are queued to be unmapped,
    /// sample.rs), else their next write (write-protected again; a line whose writes the kernel
    /// tracks keeps what it recorded: [`MissPath::observe`]).
    pub(super) fn rearm(&self, g: &mut MutexGuard<'_, State>, vpn: u64) {
        for slot in g.cache.take_rearm(vpn) {
            let l = *g.cache.line(slot);
            let Some(q) = g.heaps.get(&l.pid).cloned() else {
                continue;
            };
            if q.region.samples() {
                if !l.unmapped && !l.unmap_queued {
                    g.cache.line_mut(slot).unmap_queued = true;
                    g.unmaps.push((l.pid, l.vpn, l.seq));
                    if g.unmaps.len() >= unmap_batch(g.cache.lines()) {
                        self.unmaps_due.store(true, Relaxed);
                    }
                }
            } else if !l.wp {
                let line = g.cache.line_mut(slot);
                line.wp = true;
                if q.region.tracks_writes() {
                    self.observe(&q, line);
                } else {
                    let _ = q.region.write_protect(l.vpn, 1, true);
                }
            }
        }
    }

    /// Step 2: the line's contents (`None`: zeros, a p-local line) and those of the lines read
    /// ahead that live at the same place (a prefix of `ahead`). Victims go to the compressed
    /// tier first; those that must still be written back are piggybacked on the fetch when
    /// they go to its place, the others are written back first.
    fn fill(
        &self,
        t: &ProcHeap,
        vpn: u64,
        source: Source,
        victims: Vec<Writeback>,
        ahead: &[u64],
    ) -> Result<(Option<Page>, Vec<Page>), Refusal> {
        let victims = self.stash(victims);
        let place = match source {
            Source::Store => self.store.place(t.pid, vpn).ok(),
            Source::Local | Source::Tier(_) => None,
        };
        // One batch goes to one place: read ahead only as far as the lines live with `vpn`.
        let mut vpns = vec![vpn];
        vpns.extend(
            ahead
                .iter()
                .take_while(|v| place.is_some() && self.store.place(t.pid, **v).ok() == place),
        );
        let split = |mut pages: Vec<Page>| {
            let rest = pages.split_off(1);
            (pages.pop(), rest)
        };
        let (joint, apart): (Vec<Writeback>, Vec<Writeback>) = victims
            .into_iter()
            .partition(|wb| self.piggyback && place.is_some() && self.store.place(wb.heap.pid, wb.vpn).ok() == place);
        self.flush_apart(apart);
        match source {
            Source::Local => return Ok((None, Vec::new())),
            Source::Tier(e) => return self.unpack(t, vpn, &e.packed).map(|p| (Some(p), Vec::new())),
            Source::Store => {}
        }
        let alone = || match vpns.len() {
            1 => self.store.fetch(t.pid, vpn).map(|p| vec![p]),
            _ => self.store.fetch_many(t.pid, &vpns),
        };
        let r = match &joint[..] {
            [] => return alone().map(split),
            [wb] if vpns.len() == 1 => self
                .store
                .flush_fetch((wb.heap.pid, wb.vpn, &wb.data), (t.pid, vpn))
                .map(|p| vec![p]),
            wbs => {
                let flushes: Vec<(u64, u64, &[u8])> =
                    wbs.iter().map(|wb| (wb.heap.pid, wb.vpn, &wb.data[..])).collect();
                self.store.flush_fetch_many(&flushes, t.pid, &vpns)
            }
        };
        match r {
            Ok(pages) => {
                self.settle(joint, Ok(()), Sent::WithFetch);
                Ok(split(pages))
            }
            // The victims may belong to other processes, of other vNodes: a write-back that
            // failed fails its own process alone (with its own error), never the miss it rode
            // with. They are written back on their own, and the line is fetched alone.
            Err(_) => {
                self.flush_apart(joint);
                alone().map(split)
            }
        }
    }

    /// Step 3: installs a line (`None`: zeros) as `how` says and completes its claim. Returns
    /// whether the line is in the program now.
    pub(super) fn install(&self, t: &ProcHeap, vpn: u64, slot: usize, data: Option<&[u8]>, how: InstallAs) -> bool {
        let wp = !how.writable();
        let r = match data {
            Some(d) => t.region.copy(vpn, d, wp),
            None => t.region.zero(vpn, wp),
        };
        let installed = r.unwrap_or_else(|e| {
            tracing::warn!(pid = t.pid, addr = vpn * PAGE, error = %e, "cannot install a line");
            Install::Gone
        });
        let mut g = self.state.lock().unwrap();
        if g.cache.lookup(t.pid, vpn) == Some(slot) {
            match installed {
                // No write traps when the kernel tracks writes.
                Install::Done | Install::Exists => {
                    g.cache.complete(
                        slot,
                        Filled {
                            dirty: how.dirty(),
                            wp: wp && !t.region.tracks_writes(),
                        },
                    );
                    g.cache.line_mut(slot).ahead = how == InstallAs::Ahead;
                }
                Install::Gone => {
                    g.cache.remove(t.pid, vpn);
                }
            }
        }
        drop(g);
        self.cv.notify_all();
        !matches!(installed, Install::Gone)
    }

    /// Installs claimed fresh lines `run` (consecutive pages, in any order) as zeros,
    /// writable and dirty (`fresh`: pre-allocated, not asked for), in one step; the threads
    /// waiting on any of them wake. True if they are in the program; if not, their ways are
    /// given back, and a touch of one traps as a first touch again.
    pub(super) fn install_zeros(&self, t: &ProcHeap, run: &mut [(u64, usize)], fresh: bool) -> bool {
        run.sort_unstable();
        let (first, pages) = (run[0].0, run.len() as u64);
        debug_assert_eq!(run[run.len() - 1].0, first + pages - 1, "a run of consecutive pages");
        let installed = t.region.zero_run(first, pages).unwrap_or_else(|e| {
            tracing::warn!(pid = t.pid, addr = first * PAGE, pages, error = %e, "cannot install fresh lines");
            Install::Gone
        });
        let mut g = self.state.lock().unwrap();
        for &(v, slot) in run.iter() {
            if g.cache.lookup(t.pid, v) != Some(slot) {
                continue;
            }
            match installed {
                Install::Done | Install::Exists => {
                    g.cache.complete(slot, Filled { dirty: true, wp: false });
                    g.cache.line_mut(slot).fresh = fresh;
                }
                Install::Gone => {
                    g.cache.remove(t.pid, v);
                }
            }
        }
        drop(g);
        self.cv.notify_all();
        !matches!(installed, Install::Gone)
    }

    /// Gives back the way a failed miss claimed.
    pub(super) fn abandon(&self, t: &ProcHeap, vpn: u64, slot: usize) {
        let mut g = self.state.lock().unwrap();
        if g.cache.lookup(t.pid, vpn) == Some(slot) {
            g.cache.remove(t.pid, vpn);
        }
        drop(g);
        self.cv.notify_all();
    }
}
