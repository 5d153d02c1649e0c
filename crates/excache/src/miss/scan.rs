//! The miss path with dirty tracking by scan (dirty.rs explains the kernel side and why no
//! write is lost): no write traps, so where fault tracking has the write-protect fault this
//! asks the kernel. A line's `dirty` bit holds what scans took out of the page table (a scan
//! that protects a written page again marks its line dirty first); the page table holds the
//! writes since. A line needs a write-back if either says so:
//! - eviction takes the line from the program and learns both its last contents and whether
//!   it was written, and drops a clean one without a message ([`MissPath::evict_taken`]);
//! - a write-back of a range asks which lines were written, protecting them again in the same
//!   step ([`MissPath::scan_written`]); moving a range out takes its lines the same way
//!   ([`MissPath::drop_taken`]);
//! - CLOCK asks whether a line was written since its reference bit was cleared before it
//!   evicts it, and a claim that must not wait for a write-back asks whether its victim is
//!   clean ([`MissPath::claim_way`]); clearing a bit protects the line again
//!   ([`MissPath::observe`]).
//!
//! Reads are still unseen (dirty.rs, "Access bits"), as in fault mode.
use super::*;
use crate::Keep;

impl MissPath {
    /// Asks the kernel whether line `l` of `t` was written since it was last protected and
    /// protects it again; a written line becomes dirty. A failed question counts as written.
    pub(super) fn observe(&self, t: &ProcHeap, l: &mut Line) -> bool {
        let written = t.region.written(l.vpn, l.vpn + 1).map_or(true, |w| !w.is_empty());
        self.count_scan(t, 1);
        if written {
            self.observed_write(l);
        }
        written
    }

    /// A scan found `l` written: it is dirty from now on (the page table no longer says so),
    /// and a write-back captured before it must not make it clean (`Held::Line`).
    pub(super) fn observed_write(&self, l: &mut Line) {
        l.dirty = true;
        l.writes = l.writes.wrapping_add(1);
        // No write traps: the bookkeeping never counts the line as protected.
        l.wp = false;
    }

    fn count_scan(&self, t: &ProcHeap, pages: u64) {
        self.bump(t, |s| {
            s.dirty_scans.fetch_add(1, Relaxed);
            s.dirty_scanned_pages.fetch_add(pages, Relaxed);
        });
    }

    /// For a write-back of `resident` lines of `t`: those written since their last protection,
    /// now protected again (one scan per run of adjacent lines, never over holes, see dirty.rs),
    /// and whether that protection happened. Without tracking by the kernel, none and false; a
    /// failed scan counts every line of its run as written, unprotected.
    pub(super) fn scan_written(&self, t: &ProcHeap, resident: &[(u64, usize)]) -> (HashSet<u64>, bool) {
        let mut written = HashSet::new();
        if !t.region.tracks_writes() {
            return (written, false);
        }
        let mut protected = true;
        for (first, end) in runs(resident.iter().map(|(v, _)| *v)) {
            self.count_scan(t, end - first);
            match t.region.written(first, end) {
                Ok(w) => written.extend(w),
                Err(e) => {
                    tracing::warn!(pid = t.pid, error = %e, "cannot scan for written lines; writing them all back");
                    written.extend(first..end);
                    protected = false;
                }
            }
        }
        (written, protected)
    }

    /// [`MissPath::evict`] of a line whose writes the kernel tracks, or of a dirty line the
    /// region takes out without protecting it first ([`crate::Region::takes_dirty`]): takes it from the program,
    /// then writes it back if it was dirty or written since its last protection; a clean one is
    /// dropped (or, as `clean` says, offered to the compressed tier as in fault mode). If it
    /// cannot be taken its writes may be lost, so its process is stopped here, under the lock.
    pub(super) fn evict_taken(
        &self,
        g: &mut MutexGuard<'_, State>,
        vt: &Arc<ProcHeap>,
        v: Line,
        victims: &mut Vec<Writeback>,
        lost: &mut Vec<(Arc<ProcHeap>, MissError)>,
        clean: CleanVictim,
    ) {
        let for_tier = clean == CleanVictim::ToTier
            && self.codec.is_some()
            && g.materialized.get(&v.pid).is_some_and(|s| s.contains(&v.vpn));
        let keep = match (v.dirty, for_tier) {
            (true, _) => Keep::Dirty,
            (false, true) => Keep::All,
            (false, false) => Keep::Written,
        };
        let taken = vt.region.take(v.vpn, 1, keep);
        if keep != Keep::Dirty {
            self.count_scan(vt, 1);
        } else if taken.is_ok() {
            self.bump(vt, |s| {
                s.taken_dirty.fetch_add(1, Relaxed);
            });
        }
        match taken.map(|mut t| t.pop()) {
            Ok(Some(tk)) => {
                let dirty = v.dirty || tk.written;
                if !dirty {
                    self.bump(vt, |s| {
                        s.scan_clean_evictions.fetch_add(1, Relaxed);
                        if v.read_fill {
                            s.writebacks_avoided.fetch_add(1, Relaxed);
                        }
                    });
                }
                match tk.data {
                    Some(data) if (dirty || for_tier) && !self.needs_no_write_back(g, vt, &v, &data) => {
                        g.inflight.insert((v.pid, v.vpn));
                        let held = if dirty { Held::Evicted } else { Held::Clean };
                        victims.push(Writeback {
                            heap: vt.clone(),
                            vpn: v.vpn,
                            data,
                            held,
                        });
                    }
                    _ => {}
                }
            }
            Ok(None) => {}
            Err(e) => {
                vt.alive.store(false, Relaxed);
                lost.push((
                    vt.clone(),
                    MissError::WriteBackRead {
                        addr: v.vpn * PAGE,
                        error: e,
                    },
                ));
            }
        }
        self.bump(vt, |s| {
            s.evictions.fetch_add(1, Relaxed);
            s.inline_evictions.fetch_add(1, Relaxed);
        });
    }

    /// [`MissPath::evict_range`]'s last step for a process whose writes the kernel tracks: the
    /// lines of [first, end) are clean as far as the lock holder knows, but the program may have
    /// written them since their write-back. They are taken from the program, those written are
    /// written back (in flight until acknowledged, as evicted victims are), and the range is
    /// dropped. A line that cannot be taken, or whose write-back fails, fails the process.
    pub(super) fn drop_taken(
        &self,
        mut g: MutexGuard<'_, State>,
        t: &Arc<ProcHeap>,
        first: u64,
        end: u64,
    ) -> Result<(), Refusal> {
        let resident: Vec<u64> = g
            .cache
            .resident_in(t.pid, first, end)
            .into_iter()
            .map(|(v, _)| v)
            .collect();
        let (mut victims, mut failure) = (Vec::new(), None);
        for (run, stop) in runs(resident.iter().copied()) {
            self.count_scan(t, stop - run);
            match t.region.take(run, stop - run, Keep::Written) {
                Ok(taken) => {
                    for tk in taken {
                        if let Some(data) = tk.data {
                            g.inflight.insert((t.pid, tk.vpn));
                            victims.push(Writeback {
                                heap: t.clone(),
                                vpn: tk.vpn,
                                data,
                                held: Held::Evicted,
                            });
                        }
                    }
                }
                Err(error) => {
                    failure = Some(MissError::WriteBackRead {
                        addr: run * PAGE,
                        error,
                    })
                }
            }
        }
        if failure.is_some() {
            t.alive.store(false, Relaxed);
        }
        self.drop_locked(g, t, first, end, Stored::Keep);
        self.flush_apart(victims);
        if let Some(why) = failure {
            self.fail(t, &why.to_string());
        }
        if !t.alive() {
            return Err(MissError::PagesLost { pid: t.pid }.into());
        }
        Ok(())
    }
}

/// Runs of adjacent pages [first, end) in ascending `vpns`.
fn runs(vpns: impl Iterator<Item = u64>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for v in vpns {
        match out.last_mut() {
            Some((_, end)) if *end == v => *end += 1,
            _ => out.push((v, v + 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn runs_split_at_holes() {
        assert_eq!(
            super::runs([3, 4, 5, 9, 11, 12].into_iter()),
            vec![(3, 6), (9, 10), (11, 13)]
        );
        assert!(super::runs(std::iter::empty()).is_empty());
    }
}
