//! The pages an owner keeps of one process: one [`Segment`] (a memfd) per vRegion, so that
//! the pComponent of the process can be handed a vRegion's pages for one-sided access
//! ([`super::lease`]), and an index of the pages held, which is the owner's own: it decides
//! what exists and what is charged, whatever a lease holder writes into the memfd.
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;

use splitos_rpc::{ErrCode, Refuse, SEALED_PAGE};

use splitos_core::segment::Segment;

/// The memory for a vRegion's pages could not be made (the memfd, or its mapping).
#[derive(Debug, thiserror::Error)]
#[error("cannot make the memory of a vRegion: {0}")]
pub(super) struct NoSegment(std::io::Error);

impl Refuse for NoSegment {
    fn code(&self) -> ErrCode {
        ErrCode::NoMemory
    }
}

pub(super) struct Pages {
    /// Pages per vRegion: the size of each segment.
    per_vregion: u64,
    segments: BTreeMap<u64, (u64, Arc<Segment>)>,
    index: BTreeSet<u64>,
}

impl Pages {
    pub fn new(vregion_size: u64) -> Pages {
        Pages {
            per_vregion: (vregion_size / splitos_rpc::PAGE_SIZE as u64).max(1),
            segments: BTreeMap::new(),
            index: BTreeSet::new(),
        }
    }

    fn at(&self, vpn: u64) -> (u64, u64) {
        (vpn / self.per_vregion, vpn % self.per_vregion)
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn contains(&self, vpn: u64) -> bool {
        self.index.contains(&vpn)
    }

    /// Page `vpn`, sealed, if held.
    pub fn get(&self, vpn: u64) -> Option<Vec<u8>> {
        if !self.index.contains(&vpn) {
            return None;
        }
        let (idx, i) = self.at(vpn);
        self.segments.get(&idx).and_then(|(_, s)| s.get(i))
    }

    /// The segment of vRegion `idx`, made if new, with its id.
    pub fn segment(&mut self, idx: u64) -> Result<(u64, Arc<Segment>), NoSegment> {
        if let Some((id, s)) = self.segments.get(&idx) {
            return Ok((*id, s.clone()));
        }
        let s = Arc::new(Segment::create(self.per_vregion).map_err(NoSegment)?);
        let id = splitos_rpc::auth::random_u64();
        self.segments.insert(idx, (id, s.clone()));
        Ok((id, s))
    }

    /// Stores page `vpn` (sealed); whether it is new.
    pub fn insert(&mut self, vpn: u64, sealed: &[u8]) -> Result<bool, NoSegment> {
        debug_assert_eq!(sealed.len(), SEALED_PAGE);
        let (idx, i) = self.at(vpn);
        self.segment(idx)?.1.put(i, sealed);
        Ok(self.index.insert(vpn))
    }

    /// Changes page `vpn` in place (its sealed bytes), if held.
    pub fn modify(&mut self, vpn: u64, f: impl FnOnce(&mut [u8])) -> bool {
        if !self.index.contains(&vpn) {
            return false;
        }
        let (idx, i) = self.at(vpn);
        self.segments.get(&idx).is_some_and(|(_, s)| s.modify(i, f))
    }

    /// Drops page `vpn`; whether it was held.
    pub fn remove(&mut self, vpn: u64) -> bool {
        let (idx, i) = self.at(vpn);
        if let Some((_, s)) = self.segments.get(&idx) {
            s.clear(i, i + 1);
        }
        self.index.remove(&vpn)
    }

    /// Drops the pages in `vpns`; how many were held. Whole vRegions' segments go with them.
    pub fn remove_range(&mut self, vpns: Range<u64>) -> u64 {
        let held: Vec<u64> = self.index.range(vpns.clone()).copied().collect();
        for v in &held {
            self.index.remove(v);
        }
        let idxs: Vec<u64> = self
            .segments
            .range(vpns.start / self.per_vregion..vpns.end.div_ceil(self.per_vregion))
            .map(|(i, _)| *i)
            .collect();
        for idx in idxs {
            let base = idx * self.per_vregion;
            let (from, to) = (
                vpns.start.max(base) - base,
                vpns.end.min(base + self.per_vregion) - base,
            );
            if from == 0 && to == self.per_vregion {
                if let Some((_, s)) = self.segments.remove(&idx) {
                    release(&s);
                }
            } else {
                self.segments[&idx].1.clear(from, to);
            }
        }
        held.len() as u64
    }

    /// The pages held in `vpns`, in order.
    pub fn keys(&self, vpns: Range<u64>) -> impl Iterator<Item = u64> + '_ {
        self.index.range(vpns).copied()
    }

    /// Takes every segment back from its lease holder: the owner is about to change the
    /// process's memory other than by a write-back.
    pub fn revoke(&self) {
        for (_, s) in self.segments.values() {
            s.revoke();
        }
    }
}

/// Takes a segment back from its lease holder and gives its memory back to the host: the
/// holder's mapping would otherwise keep the pages of a segment the owner dropped.
fn release(s: &Segment) {
    s.revoke();
    s.clear_all();
}

impl Drop for Pages {
    fn drop(&mut self) {
        // A holder still mapping a segment must not go on reading pages the owner dropped.
        for (_, s) in self.segments.values() {
            release(s);
        }
    }
}
