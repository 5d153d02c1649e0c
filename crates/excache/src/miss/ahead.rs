//! Read-ahead on the miss path: a remote miss claims ways for the lines the prefetcher asks
//! for ([`MissPath::claim_ahead`]), fetched with it in one round trip as far as they live at
//! the same place. One in `SAMPLE` is staged instead of installed ([`MissPath::stage`]): the
//! program's first touch of it traps and tells the prefetcher its read-ahead was used
//! ([`MissPath::unstage_used`]), its eviction untouched that it was wasted.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, MutexGuard};

use super::{tiered, Access, CleanVictim, Evictable, MissError, MissPath, ProcHeap, State, Writeback, PAGE};
use crate::cache::Filled;
use crate::region::Install;
use crate::store::Page;

impl MissPath {
    /// Claims ways for the lines the prefetcher asks for along its stride from `vpn`: lines
    /// that exist on the store and are neither resident nor in flight, up to the first that is
    /// not. Their victims are evicted as a miss's are, and written back with the miss.
    pub(super) fn claim_ahead(
        &self,
        g: &mut MutexGuard<'_, State>,
        t: &ProcHeap,
        vpn: u64,
        victims: &mut Vec<Writeback>,
        lost: &mut Vec<(Arc<ProcHeap>, MissError)>,
    ) -> Vec<(u64, usize)> {
        let want = g.prefetcher.window(t.pid, vpn);
        let mut ahead = Vec::new();
        let lines =
            (1..=want.lines as i64).map_while(|i| want.stride.checked_mul(i).and_then(|d| vpn.checked_add_signed(d)));
        for v in lines {
            let stored = g.materialized.get(&t.pid).is_some_and(|s| s.contains(&v));
            // A page in the tier is newer than the store's copy.
            if !stored || g.cache.lookup(t.pid, v).is_some() || g.inflight.contains(&(t.pid, v)) || tiered(g, t.pid, v)
            {
                break;
            }
            let Some(c) = self.claim_way(g, t.pid, v, Evictable::Any) else {
                break;
            };
            self.claimed(g, t.pid, v);
            if let Some(victim) = c.victim {
                self.evict(g, victim, victims, lost, CleanVictim::ToTier);
            }
            self.rearm(g, v);
            ahead.push((v, c.slot));
        }
        ahead
    }

    /// Keeps a fetched read-ahead line in the pComponent as a sample: it holds its way as a
    /// clean line, and the program's first touch of it traps ([`MissPath::unstage_used`]).
    pub(super) fn stage(&self, t: &ProcHeap, vpn: u64, slot: usize, page: Page) {
        let mut g = self.state.lock().unwrap();
        if g.cache.lookup(t.pid, vpn) == Some(slot) {
            g.cache.complete(slot, Filled { dirty: false, wp: true });
            g.staged.insert((t.pid, vpn), page);
            self.bump(t, |s| {
                s.prefetch_sampled.fetch_add(1, Relaxed);
            });
        }
        drop(g);
        self.cv.notify_all();
    }

    /// The first touch of a staged sample: installs it as a miss would (writable and dirty
    /// for a write), under the lock because it is rare and needs no round trip.
    pub(super) fn unstage_used(
        &self,
        g: &mut MutexGuard<'_, State>,
        t: &ProcHeap,
        vpn: u64,
        slot: usize,
        page: &[u8],
        access: Access,
    ) {
        let writable = access != Access::Read;
        let installed = t.region.copy(vpn, page, !writable).unwrap_or_else(|e| {
            tracing::warn!(pid = t.pid, addr = vpn * PAGE, error = %e, "cannot install a sampled read-ahead line");
            Install::Gone
        });
        if matches!(installed, Install::Gone) {
            g.cache.remove(t.pid, vpn);
            return;
        }
        g.cache.complete(
            slot,
            Filled {
                dirty: writable,
                wp: !writable,
            },
        );
        g.cache.touch(slot);
        g.prefetcher.outcome(t.pid, true);
        self.bump(t, |s| {
            s.prefetch_sample_used.fetch_add(1, Relaxed);
        });
    }
}
