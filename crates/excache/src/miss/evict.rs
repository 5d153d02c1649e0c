//! What becomes of a victim: dropped from its process, a dirty one captured first and in
//! flight until its write-back is acknowledged ([`MissPath::evict`]); offered to the
//! compressed tier before the store ([`MissPath::stash`]); never written back if it is zeros
//! that never left this pComponent ([`MissPath::needs_no_write_back`]).
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use splitos_rpc::{Refusal, PAGE_SIZE};

use super::{capture, CleanVictim, Held, MissError, MissPath, ProcHeap, Sent, State, Writeback, PAGE};
use crate::cache::Line;
use crate::huge::SplitError;
use crate::store::Page;
use crate::tier::Entry;

impl MissPath {
    /// Drops a victim line from its process; a dirty one is captured first and marked in
    /// flight, its write-back (pushed to `victims`) now holding the only copy. A dirty line
    /// that cannot be captured is lost: its process is stopped here, under the lock, and pushed
    /// to `lost` to be failed once the lock is released. With the compressed tier on and
    /// `clean` [`CleanVictim::ToTier`], a clean line the store holds is captured too, for the tier, and is in
    /// flight until the tier took it (so that no miss fetches it meanwhile and two copies exist).
    pub(super) fn evict(
        &self,
        g: &mut MutexGuard<'_, State>,
        v: Line,
        victims: &mut Vec<Writeback>,
        lost: &mut Vec<(Arc<ProcHeap>, MissError)>,
        clean: CleanVictim,
    ) {
        let Some(vt) = g.heaps.get(&v.pid).cloned() else { return };
        // A staged sample was never in the program: the store holds it, nothing is unmapped.
        if g.staged.remove(&(v.pid, v.vpn)).is_some() {
            g.prefetcher.outcome(v.pid, false);
            self.bump(&vt, |s| {
                s.evictions.fetch_add(1, Relaxed);
                s.prefetch_sample_wasted.fetch_add(1, Relaxed);
            });
            return;
        }
        // A dirty line goes without being write-protected first where the region can take it.
        if vt.alive() && (vt.region.tracks_writes() || (v.dirty && vt.region.takes_dirty())) {
            return self.evict_taken(g, &vt, v, victims, lost, clean);
        }
        // A clean line the store does not hold is zeros never written: a miss zero-fills it again.
        let for_tier = !v.dirty
            && clean == CleanVictim::ToTier
            && self.codec.is_some()
            && g.materialized.get(&v.pid).is_some_and(|s| s.contains(&v.vpn));
        if (v.dirty || for_tier) && vt.alive() {
            match capture(&vt, v.vpn, v.wp) {
                Ok(data) if self.needs_no_write_back(g, &vt, &v, &data) => {}
                Ok(data) => {
                    g.inflight.insert((v.pid, v.vpn));
                    let held = if v.dirty { Held::Evicted } else { Held::Clean };
                    victims.push(Writeback {
                        heap: vt.clone(),
                        vpn: v.vpn,
                        data,
                        held,
                    });
                }
                Err(e) if v.dirty => {
                    vt.alive.store(false, Relaxed);
                    lost.push((
                        vt.clone(),
                        MissError::WriteBackRead {
                            addr: v.vpn * PAGE,
                            error: e,
                        },
                    ));
                }
                // The store holds it: nothing is lost.
                Err(_) => {}
            }
        }
        if let Err(why) = self.punch(&vt, v.vpn, 1) {
            vt.alive.store(false, Relaxed);
            lost.push((vt.clone(), why));
        }
        self.bump(&vt, |s| {
            s.evictions.fetch_add(1, Relaxed);
            s.inline_evictions.fetch_add(1, Relaxed);
        });
    }

    /// True if a dirty line needs no write-back: it never left this pComponent and is still
    /// all zeros, which is what a miss on it fills in anyway (an untouched pre-allocated or
    /// faulted-around line). Its contents were captured write-protected, so a later write
    /// traps and makes it dirty again.
    pub(super) fn needs_no_write_back(
        &self,
        g: &MutexGuard<'_, State>,
        t: &ProcHeap,
        line: &Line,
        data: &[u8],
    ) -> bool {
        let stored = g.materialized.get(&line.pid).is_some_and(|s| s.contains(&line.vpn));
        if stored || !is_zero(data) {
            return false;
        }
        self.bump(t, |s| {
            s.zero_writebacks_skipped.fetch_add(1, Relaxed);
            if line.fresh {
                s.prealloc_unused.fetch_add(1, Relaxed);
            }
        });
        true
    }

    /// Drops [vpn, vpn + pages) from `t`'s program, splitting first the huge pages the range
    /// cuts. `Err` says what was lost when a split failed after the huge page had left the
    /// program: the process must be failed (the caller stops it under the lock).
    pub(super) fn punch(&self, t: &ProcHeap, vpn: u64, pages: u64) -> Result<(), MissError> {
        match t.region.split_huge(vpn, pages) {
            Ok(0) => {}
            Ok(n) => self.bump(t, |s| {
                s.huge_splits.fetch_add(n, Relaxed);
            }),
            Err(SplitError::Lost(error)) => {
                return Err(MissError::HugePageLost {
                    addr: vpn * PAGE,
                    error,
                })
            }
            Err(e) => tracing::warn!(pid = t.pid, addr = vpn * PAGE, error = %e, "cannot split a huge page"),
        }
        if let Err(e) = t.region.punch(vpn, pages) {
            tracing::warn!(pid = t.pid, addr = vpn * PAGE, pages, error = %e, "cannot drop heap pages");
        }
        Ok(())
    }

    /// Offers captured victims to the compressed tier (compressed without the lock). Returns
    /// what must still go to the store: dirty victims that did not compress well enough, and
    /// the dirty entries the tier pushed out to make room, now in flight in their place.
    pub(super) fn stash(&self, victims: Vec<Writeback>) -> Vec<Writeback> {
        let Some(codec) = self.codec.as_deref() else {
            return victims;
        };
        if victims.is_empty() {
            return victims;
        }
        let t0 = Instant::now();
        let packed: Vec<Option<Box<[u8]>>> = victims.iter().map(|wb| codec.pack(&wb.data)).collect();
        let pack_ns = t0.elapsed().as_nanos() as u64 / victims.len() as u64;
        let (mut rest, mut pushed, mut stored, mut skipped) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut g = self.state.lock().unwrap();
        let st = &mut *g;
        let tier = st.tier.as_mut().expect("a codec comes with a tier");
        for (wb, p) in victims.into_iter().zip(packed) {
            let key = (wb.heap.pid, wb.vpn);
            // A process that exited meanwhile needs none of its pages.
            if !st.heaps.contains_key(&key.0) {
                st.inflight.remove(&key);
                continue;
            }
            let Some(p) = p else {
                skipped.push(wb.heap.clone());
                if wb.held == Held::Clean {
                    st.inflight.remove(&key);
                } else {
                    rest.push(wb);
                }
                continue;
            };
            stored.push((wb.heap.clone(), p.len() as u64));
            for (pid, vpn, e) in tier.insert(
                key.0,
                key.1,
                Entry {
                    packed: p,
                    dirty: wb.held != Held::Clean,
                },
            ) {
                if let Some(owner) = st.heaps.get(&pid).filter(|_| e.dirty) {
                    st.inflight.insert((pid, vpn));
                    pushed.push((owner.clone(), vpn, e.packed));
                }
            }
            // In the tier now: a miss on it finds it there.
            st.inflight.remove(&key);
        }
        drop(g);
        self.cv.notify_all();
        for (vt, bytes) in stored {
            self.bump(&vt, |s| {
                s.tier_stores.fetch_add(1, Relaxed);
                s.tier_bytes_raw.fetch_add(PAGE, Relaxed);
                s.tier_bytes_packed.fetch_add(bytes, Relaxed);
                s.tier_pack_ns.fetch_add(pack_ns, Relaxed);
            });
        }
        for vt in skipped {
            self.bump(&vt, |s| {
                s.tier_incompressible.fetch_add(1, Relaxed);
                s.tier_pack_ns.fetch_add(pack_ns, Relaxed);
            });
        }
        for (vt, vpn, packed) in pushed {
            match self.unpack(&vt, vpn, &packed) {
                Ok(data) => rest.push(Writeback {
                    heap: vt,
                    vpn,
                    data,
                    held: Held::PushedOut,
                }),
                Err(e) => {
                    let wb = Writeback {
                        heap: vt,
                        vpn,
                        data: Vec::new(),
                        held: Held::PushedOut,
                    };
                    self.settle(vec![wb], Err(e), Sent::Alone);
                }
            }
        }
        rest
    }

    /// Restores a page from its tier entry.
    pub(super) fn unpack(&self, t: &ProcHeap, vpn: u64, packed: &[u8]) -> Result<Page, Refusal> {
        let codec = self.codec.as_deref().expect("tier entries exist only with a codec");
        let t0 = Instant::now();
        let mut page = vec![0u8; PAGE_SIZE];
        let r = codec.unpack(packed, &mut page);
        let ns = t0.elapsed().as_nanos() as u64;
        self.bump(t, |s| {
            s.tier_unpack_ns.fetch_add(ns, Relaxed);
        });
        r.map(|()| page).map_err(|error| {
            MissError::Unpack {
                addr: vpn * PAGE,
                error,
            }
            .into()
        })
    }
}

fn is_zero(data: &[u8]) -> bool {
    data.chunks_exact(16)
        .all(|c| u128::from_ne_bytes(c.try_into().expect("16 bytes")) == 0)
}
