//! Fresh lines (never left this pComponent): a first touch brings its neighbours with it, so
//! that a program filling new memory traps once per window instead of once per page. The
//! nearest are installed with it (fault-around, [`MissPath::claim_around`]), those beyond are
//! pre-allocated in the program's memfd ([`MissPath::preallocate`]); with huge pages, a fresh
//! 2 MiB extent is pre-allocated whole as one huge page ([`MissPath::claim_extent`],
//! [`MissPath::allocate_extent`]).
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, MutexGuard};

use super::{
    tiered, CleanVictim, Evictable, InstallAs, MissError, MissPath, ProcHeap, State, Writeback, PAGE, PROT_WRITE,
};
use crate::cache::Filled;
use crate::huge::{SplitError, EXTENT};

/// The runs of first touches of one process, a few at once (threads filling memory each
/// their own, an allocator filling several arenas), as the kernel's read-ahead keeps a window
/// per stream: a first touch where a run's last window ended continues it and gets four times
/// that window; any other starts a run with the smallest. So a program filling memory traps
/// once per whole window after its first few touches, and one that touches new memory here
/// and there (a sparse table, a stack of pages apart) is not given lines it never uses: those
/// cost it a page's allocation each, about 1 µs, and their way in the ExCache.
#[derive(Default)]
pub(super) struct Runs {
    runs: [Run; RUNS],
    clock: u64,
}

/// Runs of first touches followed at once per process.
const RUNS: usize = 8;

#[derive(Clone, Copy, Default)]
struct Run {
    /// The first line past the run's last window (upwards) or before it (downwards).
    next: u64,
    up: bool,
    /// The lines its last touch got; 0: no run.
    window: u64,
    /// When it was last continued, to replace the oldest.
    used: u64,
}

impl Runs {
    /// A first touch at `vpn` whose window runs `up` (or down): the run it continues (or the
    /// oldest's place, for a run it starts) and the lines it gets, from `start` to `most`.
    /// A touch within one window past where the run's ended continues it too: a program may
    /// skip a page or two (writes of every other page, an allocator's guard).
    fn touch(&mut self, vpn: u64, up: bool, start: u64, most: u64) -> (usize, u64) {
        self.clock += 1;
        let continues = |r: &Run| {
            r.window > 0
                && r.up == up
                && if up {
                    vpn >= r.next && vpn - r.next <= r.window
                } else {
                    vpn <= r.next && r.next - vpn <= r.window
                }
        };
        let (i, window) = match self.runs.iter().position(continues) {
            Some(i) => (i, self.runs[i].window.saturating_mul(4).min(most)),
            None => {
                let oldest = (0..RUNS).min_by_key(|i| self.runs[*i].used).unwrap_or(0);
                (oldest, start.max(1))
            }
        };
        self.runs[i] = Run {
            next: vpn,
            up,
            window,
            used: self.clock,
        };
        (i, window)
    }

    /// The touch at `vpn` that [`Runs::touch`] gave run `i` got `claimed` lines beyond it.
    fn claimed(&mut self, i: usize, vpn: u64, up: bool, claimed: u64) {
        self.runs[i].next = if up {
            vpn.saturating_add(claimed + 1)
        } else {
            vpn.saturating_sub(claimed + 1)
        };
    }
}

impl MissPath {
    /// Claims ways for the fresh lines next to a first touch at `vpn` (after it, or before it
    /// if the line after was touched already): lines that never left this
    /// pComponent, are not resident, lie in a writable mapping and take a way without a
    /// write-back, so that a program filling new memory traps once per window instead of once
    /// per page. The `fault_around` nearest are installed zero-filled, writable and dirty with
    /// the touched line; the `prealloc` beyond them are pre-allocated ([`MissPath::preallocate`]).
    /// Either way they hold ExCache ways like any line and are evicted by the policy. (A victim
    /// the kernel saw written after it was last asked goes to `victims` all the same.)
    pub(super) fn claim_around(
        &self,
        g: &mut MutexGuard<'_, State>,
        t: &ProcHeap,
        vpn: u64,
        victims: &mut Vec<Writeback>,
        lost: &mut Vec<(Arc<ProcHeap>, MissError)>,
    ) -> Vec<(u64, usize)> {
        let most = self.fault_around + self.prealloc;
        if most == 0 {
            return Vec::new();
        }
        let Some(layout) = g.layouts.get(&t.pid) else {
            return Vec::new();
        };
        let writable = |v: u64| layout.find(v * PAGE).is_some_and(|(_, vma)| vma.prot & PROT_WRITE != 0);
        // With huge pages, the window ends with the extent: the next one's first touch may
        // take that extent whole.
        let huge = t.region.huge_pages();
        let fresh = |g: &MutexGuard<'_, State>, v: u64| {
            let stored = g.materialized.get(&t.pid).is_some_and(|s| s.contains(&v));
            // A page in the tier was written: it is not fresh, whether or not the store has it.
            !(stored || g.cache.lookup(t.pid, v).is_some() || g.inflight.contains(&(t.pid, v)) || tiered(g, t.pid, v))
        };
        // Memory filled downwards (GNU sort's line table grows from the end of its buffer) finds
        // the line above already touched: the window then runs downwards, so that such a
        // program too traps once per window instead of once per page.
        let up = writable(vpn + 1) && !(huge && (vpn + 1).is_multiple_of(EXTENT)) && fresh(g, vpn + 1);
        let mut runs = t.runs.lock().unwrap();
        let (run, window) = runs.touch(vpn, up, self.window_start.min(most), most);
        let candidates: Vec<u64> = if up {
            (vpn + 1..=vpn.saturating_add(window))
                .take_while(|v| writable(*v) && !(huge && v % EXTENT == 0))
                .collect()
        } else {
            (vpn.saturating_sub(window)..vpn)
                .rev()
                .take_while(|v| writable(*v) && !(huge && (v + 1) % EXTENT == 0))
                .collect()
        };
        let mut around = Vec::new();
        for v in candidates {
            if !fresh(g, v) {
                break;
            }
            let Some(c) = self.claim_way(g, t.pid, v, Evictable::CleanOnly) else {
                break;
            };
            self.claimed(g, t.pid, v);
            if let Some(victim) = c.victim {
                // A clean victim is dropped here, not offered to the tier: a first touch does
                // not wait for compression.
                self.evict(g, victim, victims, lost, CleanVictim::Drop);
            }
            self.rearm(g, v);
            around.push((v, c.slot));
        }
        runs.claimed(run, vpn, up, around.len() as u64);
        around
    }

    /// With huge pages, claims ways for the other lines of the 2 MiB extent of a first touch at
    /// `vpn`, if the whole extent is fresh (no line of it ever left this pComponent, is resident
    /// or in flight), lies in one writable mapping, and every line takes a way without a
    /// write-back; else claims nothing. The extent is then pre-allocated as one huge page
    /// ([`MissPath::allocate_extent`]).
    pub(super) fn claim_extent(&self, g: &mut MutexGuard<'_, State>, t: &ProcHeap, vpn: u64) -> Vec<(u64, usize)> {
        let (first, end) = (vpn - vpn % EXTENT, vpn - vpn % EXTENT + EXTENT);
        let writable = g
            .layouts
            .get(&t.pid)
            .and_then(|m| m.prot_of(first * PAGE, end * PAGE))
            .is_some_and(|p| p & PROT_WRITE != 0);
        if !t.region.huge_pages() || !writable {
            return Vec::new();
        }
        let others = || (first..end).filter(|v| *v != vpn);
        let stored = g
            .materialized
            .get(&t.pid)
            .is_some_and(|s| s.range(first..end).next().is_some());
        if stored
            || others()
                .any(|v| g.cache.lookup(t.pid, v).is_some() || g.inflight.contains(&(t.pid, v)) || tiered(g, t.pid, v))
        {
            return Vec::new();
        }
        let mut extent = Vec::with_capacity(EXTENT as usize - 1);
        for v in others() {
            let Some(c) = g.cache.claim_clean(t.pid, v) else {
                for (v, _) in extent {
                    g.cache.remove(t.pid, v);
                }
                return Vec::new();
            };
            if let Some(victim) = c.victim {
                self.evict(g, victim, &mut Vec::new(), &mut Vec::new(), CleanVictim::Drop);
            }
            self.claimed(g, t.pid, v);
            self.rearm(g, v);
            extent.push((v, c.slot));
        }
        extent
    }

    /// Pre-allocates the claimed lines `fresh` (contiguous, upwards or downwards from the
    /// touched line) in the program: they become resident, mapped, writable and dirty, and the
    /// program's first touch of each does not fault at all. A touch that trapped before the
    /// pages were there finds the line ready and is woken. Installed and mapped in an ioctl per
    /// 64 pages (about 1 µs a page), where allocating them in the memfd (0.3 µs a page) left
    /// the program a minor fault on each (1.3 µs).
    pub(super) fn preallocate(&self, t: &ProcHeap, fresh: &mut [(u64, usize)]) {
        if !fresh.is_empty() && self.install_zeros(t, fresh, true) {
            self.bump(t, |s| {
                s.preallocated.fetch_add(fresh.len() as u64, Relaxed);
            });
        }
    }

    /// Pre-allocates the 2 MiB extent of a first touch at `vpn` as one huge page: the touched
    /// line and `extent` (the others) become resident and dirty (writable, or write-protected
    /// if the region could give only 4 KiB pages), and the touching thread is woken to map it.
    /// If the region cannot, the touched line is installed alone as `how` says and the others
    /// are given back. Returns whether the touched line is in the program.
    pub(super) fn allocate_extent(
        &self,
        t: &ProcHeap,
        vpn: u64,
        slot: usize,
        extent: &[(u64, usize)],
        how: InstallAs,
    ) -> bool {
        let huge = match t.region.allocate_huge(vpn - vpn % EXTENT) {
            Ok(huge) => huge,
            Err(e) => {
                for (v, s) in extent {
                    self.abandon(t, *v, *s);
                }
                if let SplitError::Lost(e) = e {
                    self.abandon(t, vpn, slot);
                    self.fail(
                        t,
                        &format!(
                            "cannot put back the 2 MiB of heap at {:#x} after a failed huge page: {e}",
                            (vpn - vpn % EXTENT) * PAGE
                        ),
                    );
                    return false;
                }
                tracing::debug!(pid = t.pid, addr = vpn * PAGE, error = %e, "cannot pre-allocate a huge page; installing the line alone");
                return self.install(t, vpn, slot, None, how);
            }
        };
        let mut g = self.state.lock().unwrap();
        for &(v, s) in extent.iter().chain([&(vpn, slot)]) {
            if g.cache.lookup(t.pid, v) == Some(s) {
                g.cache.complete(s, Filled { dirty: true, wp: !huge });
                g.cache.line_mut(s).fresh = v != vpn;
            }
        }
        drop(g);
        self.cv.notify_all();
        t.region.wake(vpn);
        self.bump(t, |s| {
            s.preallocated.fetch_add(extent.len() as u64, Relaxed);
            s.huge_pages.fetch_add(huge as u64, Relaxed);
        });
        true
    }
}
