//! Access sampling: how the ExCache sees reads. The kernel keeps a page's accessed bit to
//! itself, so a line that is read but never written looks unused to the policy, which then
//! evicts the program's hottest data. Instead, when the policy asks to observe a line (CLOCK's
//! hand clears its bit; it nears the head of `workingset`'s inactive list), the line's page is
//! unmapped from the program but kept in its memfd (`MissPath::rearm` queues it;
//! [`MissPath::flush_unmaps`] unmaps a batch in one system call). The program's next touch of
//! it is a minor fault that the kernel serves itself, mapping the page again from the memfd
//! (write-protected if it was: the protection stays in the page table), about 0.3 µs where a
//! fault served by the pComponent costs a trap and a wake-up, 8-24 µs. So nothing tells the
//! pComponent of the touch when it happens; it asks when it matters, as the kernel's reclaim
//! looks at a page's accessed bit when the page is about to go: before an unmapped line
//! leaves, the program's page tables say whether it is mapped again ([`MissPath::probe`], and
//! for the background evictor's victims a walk per run, [`MissPath::spare_touched`]). A touched
//! line stays, seen used; an untouched one leaves, and its page being unmapped already,
//! dropping it flushes no TLB entry.
use super::evictor::{run_len, Victim};
use super::*;

/// Lines unmapped per batch at most: one system call per process per batch, and a line
/// passed by the hand stays mapped (unobserved) until its batch is due. A small cache takes
/// smaller batches ([`unmap_batch`]), or lines would be evicted before they were observed.
const UNMAP_BATCH: usize = 32;

/// The batch for a cache of `lines`: at most a 64th of it.
pub(super) fn unmap_batch(lines: usize) -> usize {
    (lines / 64).clamp(1, UNMAP_BATCH)
}

/// A line queued to be unmapped: its page, and its fill (`Line::seq`), which tells it from a
/// line filled at the same page since.
type Queued = (u64, u64);

impl MissPath {
    /// Whether the program touched line `l` of `t` since sampling unmapped it (the kernel
    /// mapped it again): if so it is mapped, as far as sampling goes, and seen used. A line
    /// whose page tables cannot be read counts as untouched, as without sampling.
    pub(super) fn probe(&self, t: &ProcHeap, l: &mut Line) -> bool {
        let touched = t.region.present(l.vpn, l.vpn + 1).is_ok_and(|p| !p.is_empty());
        if touched {
            l.unmapped = false;
            self.bump(t, |s| {
                s.sample_touches.fetch_add(1, Relaxed);
            });
        }
        touched
    }

    /// The background evictor's victims that sampling unmapped and the program touched since
    /// stay, seen used: one walk of the page tables per run of neighbouring victims, without
    /// the lock, then the lock once for all that stay. `victims` is sorted by process and page,
    /// and stays so.
    pub(super) fn spare_touched(&self, victims: &mut Vec<Victim>) {
        let mut touched = Vec::new();
        let mut i = 0;
        while i < victims.len() {
            let n = run_len(&victims[i..]);
            let run = &victims[i..i + n];
            if run.iter().any(|v| v.unmapped) {
                if let Ok(p) = run[0].heap.region.present(run[0].vpn, run[0].vpn + n as u64) {
                    touched.extend(p.into_iter().map(|vpn| (run[0].heap.pid, vpn)));
                }
            }
            i += n;
        }
        if touched.is_empty() {
            return;
        }
        touched.sort_unstable();
        let mut g = self.state.lock().unwrap();
        victims.retain(|v| {
            if !v.unmapped || touched.binary_search(&(v.heap.pid, v.vpn)).is_err() {
                return true;
            }
            if g.cache.lookup(v.heap.pid, v.vpn) == Some(v.slot) && g.cache.line(v.slot).state == LineState::Evicting {
                g.cache.keep(v.slot);
                g.cache.line_mut(v.slot).unmapped = false;
                g.cache.touch(v.slot);
                self.bump(&v.heap, |s| {
                    s.sample_touches.fetch_add(1, Relaxed);
                });
            }
            false
        });
        drop(g);
        self.cv.notify_all();
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
        // Mapped, or it could not have been written: it was seen used, and a queued unmap
        // would only hide its next use.
        l.unmapped = false;
        l.unmap_queued = false;
        l.wp = false;
        l.dirty = true;
        l.writes = l.writes.wrapping_add(1);
        self.bump(t, |s| {
            s.wp_faults.fetch_add(1, Relaxed);
        });
    }

    /// Unmaps the lines queued by `rearm` once a batch is due, one system call per process.
    /// Runs after a miss was served, off its wait, and after the background evictor's rounds.
    pub(super) fn flush_unmaps(&self) {
        if !self.unmaps_due.swap(false, Relaxed) {
            return;
        }
        let mut g = self.state.lock().unwrap();
        let mut queued = std::mem::take(&mut g.unmaps);
        queued.sort_unstable();
        queued.dedup();
        // Per process, its lines to unmap: (page, fill).
        let mut batches: Vec<(Arc<ProcHeap>, Vec<Queued>)> = Vec::new();
        for (pid, vpn, seq) in queued {
            // A line written or evicted since it was queued is left as it is.
            let queued_still = |l: &Line| l.seq == seq && l.unmap_queued;
            if !g.cache.lookup(pid, vpn).is_some_and(|s| queued_still(g.cache.line(s))) {
                continue;
            }
            match batches.last_mut() {
                Some((h, lines)) if h.pid == pid => lines.push((vpn, seq)),
                _ => {
                    if let Some(h) = g.heaps.get(&pid) {
                        batches.push((h.clone(), vec![(vpn, seq)]));
                    }
                }
            }
        }
        drop(g);
        let mut done = Vec::new();
        for (h, lines) in batches {
            let vpns: Vec<u64> = lines.iter().map(|(v, _)| *v).collect();
            let unmapped = match h.region.unmap(&vpns) {
                Ok(()) => {
                    self.bump(&h, |s| {
                        s.sample_unmaps.fetch_add(vpns.len() as u64, Relaxed);
                        s.sample_unmap_calls.fetch_add(1, Relaxed);
                    });
                    true
                }
                // Left mapped, the lines are observed no further: as without sampling.
                Err(e) => {
                    tracing::warn!(pid = h.pid, lines = vpns.len(), error = %e, "cannot unmap sampled lines");
                    false
                }
            };
            done.push((h.pid, lines, unmapped));
        }
        let mut g = self.state.lock().unwrap();
        for (pid, lines, unmapped) in done {
            for (vpn, seq) in lines {
                let Some(slot) = g.cache.lookup(pid, vpn) else { continue };
                let l = g.cache.line_mut(slot);
                // Only now may a line found mapped have been touched (reclaim may skip a page
                // it cannot isolate at once, which is then taken for touched once); one written
                // meanwhile was seen used already, and one filled anew at the page was never
                // unmapped.
                if l.seq == seq && l.unmap_queued {
                    l.unmap_queued = false;
                    l.unmapped = unmapped;
                }
            }
        }
    }
}
