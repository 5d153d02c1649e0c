//! Access sampling: how the ExCache sees reads. The kernel keeps a page's accessed bit to
//! itself, so a line that is read but never written looks unused to the policy, which then
//! evicts the program's hottest data. Instead, when the clock hand passes a referenced line
//! and clears its bit, the line's page is unmapped from the program but kept in its memfd
//! (`MissPath::rearm` queues it; [`MissPath::flush_unmaps`] unmaps a batch in one system
//! call). The program's next touch of it is a minor fault: the line is referenced again and
//! mapped as it was ([`MissPath::touched`]), without a copy or a round trip. A line the hand
//! finds still unmapped was not touched for a whole turn and is evicted; its page being
//! unmapped already, dropping it needs no TLB flush.
use super::*;
use crate::region::Install;

/// Lines unmapped per batch at most: one system call per process per batch, and a line
/// passed by the hand stays mapped (unobserved) until its batch is due. A small cache takes
/// smaller batches ([`unmap_batch`]), or lines would be evicted before they were observed.
const UNMAP_BATCH: usize = 32;

/// The batch for a cache of `lines`: at most a 64th of it.
pub(super) fn unmap_batch(lines: usize) -> usize {
    (lines / 64).clamp(1, UNMAP_BATCH)
}

impl MissPath {
    /// A touch of line `slot` (page `vpn` of `t`) while it was unmapped: it is referenced, and
    /// mapped again as it was (write-protected if clean). A write makes a clean line dirty and
    /// maps it writable, sparing the write-protect fault that would follow.
    pub(super) fn touched(&self, g: &mut MutexGuard<'_, State>, t: &ProcHeap, slot: usize, vpn: u64, write: bool) {
        g.cache.line_mut(slot).unmapped = false;
        if write && g.cache.line(slot).wp {
            self.written(g, t, slot);
        } else {
            g.cache.touch(slot);
        }
        let wp = g.cache.line(slot).wp;
        self.bump(t, |s| {
            s.sample_touches.fetch_add(1, Relaxed);
        });
        match t.region.map(vpn, wp) {
            Ok(Install::Done | Install::Exists) => {}
            // Punched meanwhile, or a page the program itself mapped: woken, the thread
            // faults again and is served as that fault says.
            Ok(Install::Gone) => t.region.wake(vpn),
            Err(e) => {
                tracing::warn!(pid = t.pid, addr = vpn * PAGE, error = %e, "cannot map a sampled line again");
                t.region.wake(vpn);
            }
        }
    }

    /// A touch of a page the memfd holds but no line stands for (a victim dropped after the
    /// fault was queued): the page is stale, so it goes, and the woken thread misses.
    pub(super) fn stray_touch(&self, t: &ProcHeap, vpn: u64) {
        if let Err(e) = t.region.punch(vpn, 1) {
            tracing::warn!(pid = t.pid, addr = vpn * PAGE, error = %e, "cannot drop a stale heap page");
        }
        t.region.wake(vpn);
    }

    /// A write to the write-protected line in `slot`: it is dirty from now on, and mapped
    /// writable by the caller.
    pub(super) fn written(&self, g: &mut MutexGuard<'_, State>, t: &ProcHeap, slot: usize) {
        g.cache.touch(slot);
        let l = g.cache.line_mut(slot);
        if !l.dirty {
            let n = if l.ahead {
                &t.written_after_ahead
            } else {
                &t.written_after_read
            };
            n.fetch_add(1, Relaxed);
        }
        l.ahead = false;
        l.wp = false;
        l.dirty = true;
        l.writes = l.writes.wrapping_add(1);
        self.bump(t, |s| {
            s.wp_faults.fetch_add(1, Relaxed);
        });
    }

    /// Unmaps the lines queued by `rearm` once a batch is due, one system call per process.
    /// Runs after a miss was served, off its wait.
    pub(super) fn flush_unmaps(&self) {
        if !self.unmaps_due.swap(false, Relaxed) {
            return;
        }
        let mut g = self.state.lock().unwrap();
        let mut queued = std::mem::take(&mut g.unmaps);
        queued.sort_unstable();
        let mut batches: Vec<(Arc<ProcHeap>, Vec<u64>)> = Vec::new();
        for (pid, vpn) in queued {
            // A line touched or evicted since it was queued is left as it is.
            if !g.cache.lookup(pid, vpn).is_some_and(|s| g.cache.line(s).unmapped) {
                continue;
            }
            match batches.last_mut() {
                Some((h, vpns)) if h.pid == pid => vpns.push(vpn),
                _ => {
                    if let Some(h) = g.heaps.get(&pid) {
                        batches.push((h.clone(), vec![vpn]));
                    }
                }
            }
        }
        drop(g);
        for (h, vpns) in batches {
            match h.region.unmap(&vpns) {
                Ok(()) => self.bump(&h, |s| {
                    s.sample_unmaps.fetch_add(vpns.len() as u64, Relaxed);
                    s.sample_unmap_calls.fetch_add(1, Relaxed);
                }),
                // Left mapped, the lines look untouched and go first: as without sampling.
                Err(e) => tracing::warn!(pid = h.pid, lines = vpns.len(), error = %e, "cannot unmap sampled lines"),
            }
        }
    }
}
