//! Write-backs: victims that travel without a fetch ([`MissPath::flush_apart`]), the one
//! failure rule every write-back ends in ([`MissPath::settle`]; the module documentation says
//! why), and what the home's virtual-memory calls need done to a range of a heap: write it
//! back (fork, mremap), move it out (mremap), drop it (munmap, MADV_DONTNEED).
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, MutexGuard};

use splitos_rpc::Refusal;

use super::{capture, unstage, Held, MissError, MissPath, ProcHeap, Sent, State, Stored, Writeback, FLUSH_BATCH, PAGE};
use crate::cache::LineState;
use crate::store::Place;

impl MissPath {
    /// Writes back victims that travel without a fetch: one message per process and place
    /// (`flush_many` for several), each settled with its result. Returns the process of each
    /// message sent.
    pub(super) fn flush_apart(&self, victims: Vec<Writeback>) -> Vec<Arc<ProcHeap>> {
        let mut groups: BTreeMap<(u64, Place), Vec<Writeback>> = BTreeMap::new();
        for wb in victims {
            match self.store.place(wb.heap.pid, wb.vpn) {
                Ok(p) => groups.entry((wb.heap.pid, p)).or_default().push(wb),
                Err(e) => self.settle(vec![wb], Err(e), Sent::Alone),
            }
        }
        let mut messages = Vec::new();
        for ((pid, _), mut group) in groups {
            while !group.is_empty() {
                let batch: Vec<Writeback> = group.drain(..group.len().min(FLUSH_BATCH)).collect();
                let r = match &batch[..] {
                    [wb] => self.store.flush(pid, wb.vpn, &wb.data),
                    _ => self
                        .store
                        .flush_many(pid, &batch.iter().map(|w| (w.vpn, &w.data[..])).collect::<Vec<_>>()),
                };
                messages.push(batch[0].heap.clone());
                self.settle(batch, r, Sent::Alone);
            }
        }
        messages
    }

    /// Ends write-backs that were sent together, with their one result. This is the one
    /// failure rule of every write-back (see the module documentation).
    pub(super) fn settle(&self, wbs: Vec<Writeback>, r: Result<(), Refusal>, sent: Sent) {
        let mut lost = Vec::new();
        let mut g = self.state.lock().unwrap();
        for wb in &wbs {
            let (pid, vpn) = (wb.heap.pid, wb.vpn);
            if r.is_ok() {
                if let Some(m) = g.materialized.get_mut(&pid) {
                    m.insert(vpn);
                }
            }
            match wb.held {
                Held::Evicted | Held::PushedOut | Held::Clean => {
                    if r.is_err() && wb.held != Held::Clean && wb.heap.alive() {
                        // Stop the process before the page stops being in flight: none of its
                        // threads may miss on it and read zeros.
                        wb.heap.alive.store(false, Relaxed);
                        lost.push(wb);
                    }
                    g.inflight.remove(&(pid, vpn));
                }
                Held::Line(writes) => {
                    if let Some(slot) = g.cache.lookup(pid, vpn) {
                        let l = g.cache.line_mut(slot);
                        l.state = LineState::Ready;
                        if r.is_ok() && l.writes == writes {
                            l.dirty = false;
                        }
                    }
                }
                Held::Tier => {
                    if let Some(tier) = g.tier.as_mut() {
                        tier.unpin(pid, vpn, r.is_ok());
                    }
                    g.inflight.remove(&(pid, vpn));
                }
            }
        }
        drop(g);
        self.cv.notify_all();
        match &r {
            Ok(()) => {
                for wb in &wbs {
                    self.bump(&wb.heap, |s| {
                        s.flushes.fetch_add(1, Relaxed);
                        s.bytes_flushed.fetch_add(PAGE, Relaxed);
                        if sent == Sent::WithFetch {
                            s.piggybacked.fetch_add(1, Relaxed);
                        }
                        if matches!(wb.held, Held::PushedOut | Held::Tier) {
                            s.tier_writebacks.fetch_add(1, Relaxed);
                        }
                    });
                }
            }
            Err(e) => {
                for wb in lost {
                    self.fail(&wb.heap, &format!("{}; it was the only copy of that page", e.msg));
                }
            }
        }
    }

    /// Writes back every dirty line and dirty tier entry of `t` in [first, end) (virtual
    /// pages), batched per place, so that the store holds the range's current contents (fork,
    /// mremap); the lines stay resident and the entries in the tier, and those not written
    /// meanwhile become clean. One whose write-back fails stays dirty, and the first error is
    /// returned.
    pub fn write_back_range(&self, t: &Arc<ProcHeap>, first: u64, end: u64) -> Result<(), Refusal> {
        let mut wbs = Vec::new();
        let mut result = Ok(());
        let mut pinned = Vec::new();
        {
            let mut g = self.wait_range_settled(t.pid, first, end);
            let resident = g.cache.resident_in(t.pid, first, end);
            let (written, protected) = self.scan_written(t, &resident);
            for (vpn, slot) in resident {
                if written.contains(&vpn) {
                    self.observed_write(g.cache.line_mut(slot));
                }
                let line = *g.cache.line(slot);
                if !line.dirty {
                    continue;
                }
                let captured = capture(t, vpn, line.wp || protected);
                let zero = captured
                    .as_ref()
                    .is_ok_and(|data| self.needs_no_write_back(&g, t, &line, data));
                // Protected by the capture (also when reading it failed): its next write traps,
                // or the kernel records it.
                let l = g.cache.line_mut(slot);
                l.wp = !t.region.tracks_writes();
                match captured {
                    Ok(_) if zero => {
                        l.dirty = false;
                        l.fresh = false;
                    }
                    Ok(data) => {
                        l.state = LineState::WritingBack;
                        wbs.push(Writeback {
                            heap: t.clone(),
                            vpn,
                            data,
                            held: Held::Line(l.writes),
                        });
                    }
                    Err(error) => {
                        result = Err(MissError::Read {
                            addr: vpn * PAGE,
                            error,
                        }
                        .into())
                    }
                }
            }
            // Pinned and in flight until acknowledged: no miss takes an entry whose older
            // contents could then reach the store after its newer ones.
            let st = &mut *g;
            if let Some(tier) = st.tier.as_mut() {
                pinned = tier.pin_dirty(t.pid, first, end);
                st.inflight.extend(pinned.iter().map(|(vpn, _)| (t.pid, *vpn)));
            }
        }
        for (vpn, packed) in pinned {
            match self.unpack(t, vpn, &packed) {
                Ok(data) => wbs.push(Writeback {
                    heap: t.clone(),
                    vpn,
                    data,
                    held: Held::Tier,
                }),
                Err(e) => {
                    self.settle(
                        vec![Writeback {
                            heap: t.clone(),
                            vpn,
                            data: Vec::new(),
                            held: Held::Tier,
                        }],
                        Err(e.clone()),
                        Sent::Alone,
                    );
                    result = result.and(Err(e));
                }
            }
        }
        let mut by_place: BTreeMap<Place, Vec<Writeback>> = BTreeMap::new();
        for wb in wbs {
            match self.store.place(t.pid, wb.vpn) {
                Ok(p) => by_place.entry(p).or_default().push(wb),
                Err(e) => {
                    self.settle(vec![wb], Err(e.clone()), Sent::Alone);
                    result = result.and(Err(e));
                }
            }
        }
        for (_, mut group) in by_place {
            while !group.is_empty() {
                let batch: Vec<Writeback> = group.drain(..group.len().min(FLUSH_BATCH)).collect();
                let pages: Vec<(u64, &[u8])> = batch.iter().map(|w| (w.vpn, &w.data[..])).collect();
                let r = self.store.flush_many(t.pid, &pages);
                if let Err(e) = &r {
                    result = result.and(Err(e.clone()));
                }
                self.settle(batch, r, Sent::Alone);
            }
        }
        result
    }

    /// Moves [first, end) out of the cache, the tier and the program after writing its dirty
    /// lines and entries back; the pages stay on the store (mremap moves them there). They are
    /// dropped only in the lock hold that saw every one of them clean: a write that raced the
    /// write-back (or a line evicted dirty into the tier meanwhile) is written back too, never
    /// dropped.
    pub fn evict_range(&self, t: &Arc<ProcHeap>, first: u64, end: u64) -> Result<(), Refusal> {
        loop {
            self.write_back_range(t, first, end)?;
            let g = self.wait_range_settled(t.pid, first, end);
            let dirty_lines = g
                .cache
                .resident_in(t.pid, first, end)
                .iter()
                .any(|(_, s)| g.cache.line(*s).dirty);
            if dirty_lines || tiered_dirty(&g, t.pid, first, end) {
                continue;
            }
            if t.region.tracks_writes() {
                return self.drop_taken(g, t, first, end);
            }
            self.drop_locked(g, t, first, end, Stored::Keep);
            return Ok(());
        }
    }

    /// Drops [first, end) from the cache and from the program without writing anything back,
    /// and forgets that those pages ever existed on the store (munmap, MADV_DONTNEED). True if
    /// some of them did: only then do their owners hold anything of the range.
    pub fn discard_range(&self, t: &ProcHeap, first: u64, end: u64) -> bool {
        let g = self.wait_range_settled(t.pid, first, end);
        self.drop_locked(g, t, first, end, Stored::Forget)
    }

    /// Drops [first, end) from the cache, the tier and the program under the lock `g` holds.
    /// With [`Stored::Forget`], returns whether some of the pages existed on the store.
    pub(super) fn drop_locked(
        &self,
        mut g: MutexGuard<'_, State>,
        t: &ProcHeap,
        first: u64,
        end: u64,
        on_store: Stored,
    ) -> bool {
        for (vpn, _) in g.cache.resident_in(t.pid, first, end) {
            g.cache.remove(t.pid, vpn);
        }
        // A later mapping at these addresses must never find the old contents.
        if let Some(tier) = g.tier.as_mut() {
            tier.drop_range(t.pid, first, end);
        }
        unstage(&mut g, t.pid, first, end);
        // Stopped under the lock: no thread of it may be woken onto a lost page.
        let lost = self
            .punch(t, first, end - first)
            .inspect_err(|_| t.alive.store(false, Relaxed))
            .err();
        let mut stored = false;
        if on_store == Stored::Forget {
            g.cache.forget_pages(t.pid, first, end);
            if let Some(m) = g.materialized.get_mut(&t.pid) {
                let gone: Vec<u64> = m.range(first..end).copied().collect();
                stored = !gone.is_empty();
                for v in gone {
                    m.remove(&v);
                }
            }
        }
        drop(g);
        if let Some(why) = lost {
            self.fail(t, &why.to_string());
        }
        stored
    }

    /// Locks the state once no line of [first, end) is being filled or written back.
    fn wait_range_settled(&self, pid: u64, first: u64, end: u64) -> MutexGuard<'_, State> {
        let mut g = self.state.lock().unwrap();
        loop {
            let busy = g
                .cache
                .resident_in(pid, first, end)
                .iter()
                .any(|(_, s)| g.cache.line(*s).state != LineState::Ready);
            let flying = g.inflight.iter().any(|(q, v)| *q == pid && *v >= first && *v < end);
            if !busy && !flying {
                return g;
            }
            g = self.cv.wait(g);
        }
    }
}

fn tiered_dirty(g: &State, pid: u64, first: u64, end: u64) -> bool {
    g.tier.as_ref().is_some_and(|t| t.has_dirty(pid, first, end))
}
