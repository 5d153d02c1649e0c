//! What every heartbeat's answer tells of the whole cluster (the lost components, the memory
//! that takes vRegions, the mComponents leaving or being emptied, the vNodes' quota homes),
//! worked out once for all the heartbeats of [`VIEW_FOR`] rather than for each: each is a
//! walk over every component, which at thousands of components made the managers' work per
//! heartbeat grow with the cluster (docs/benchmarks.md, "The managers at datacenter scale").
//!
//! A view is worked out again sooner when membership changes in a way an answer must not miss:
//! a component registers, is forgotten or detached, or comes back after a silence (else an
//! answer could still name lost one that is back, and it would be fenced twice); the
//! admin's cordons and detaches, the vNodes' quotas. Only what time alone changes (a silence
//! growing into a loss, the load the components report) may be up to [`VIEW_FOR`] old, as if
//! the heartbeat had come that much earlier.
use super::*;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// How long a view serves the heartbeats' answers: a third of a heartbeat period.
pub(crate) const VIEW_FOR: Duration = Duration::from_millis(100);

/// The cluster as the heartbeats' answers tell it.
#[derive(Default)]
pub(crate) struct View {
    /// pComponents lost (silent for `reclaim_dead`) or replaced by a new start.
    pub(crate) lost: Vec<LostPcomp>,
    /// mComponents lost, replaced, or forgotten and not back.
    pub(crate) lost_mcomps: Vec<u32>,
    /// mComponents detached lately, which pComponents hear of as lost.
    pub(crate) detached: Vec<u32>,
    /// Bytes of the mComponents that take memory.
    pub(crate) memory: u64,
    /// mComponents being detached or drained.
    pub(crate) leaving: Vec<u32>,
    /// The mComponent the homes empty towards the others now (rebalancing).
    pub(crate) rebalance: Option<u32>,
    /// For each mComponent that is a vNode's quota home, the vNodes and their quotas.
    pub(crate) quotas: std::collections::HashMap<u32, Vec<(String, u64)>>,
}

/// A view, when it was worked out, and at which changes and version of the vNodes' table.
type Dated = (Instant, (u64, u64), Arc<View>);

/// The last view and what it was worked out from.
#[derive(Default)]
pub(crate) struct Views {
    /// Bumped by every change a view must show at once.
    changes: AtomicU64,
    /// Views worked out (also `gm_views_total`, which is the process's, not this manager's).
    worked_out: AtomicU64,
    last: Mutex<Option<Dated>>,
}

impl Views {
    /// Makes the next answer work the view out again.
    pub(crate) fn changed(&self) {
        self.changes.fetch_add(1, Relaxed);
    }

    /// Views worked out so far.
    #[cfg(test)]
    pub(crate) fn worked_out(&self) -> u64 {
        self.worked_out.load(Relaxed)
    }
}

impl Gm {
    /// The view for a heartbeat's answer, from `comps` (the membership, locked by the caller).
    pub(crate) fn view(&self, comps: &Comps) -> Arc<View> {
        let changes = (self.views.changes.load(Relaxed), self.vnodes.version());
        let mut last = self.views.last.lock().unwrap();
        if let Some((at, seen, v)) = last.as_ref() {
            if *seen == changes && self.since(*at) < VIEW_FOR {
                return v.clone();
            }
        }
        let v = Arc::new(self.work_out(comps));
        crate::series::VIEWS.increment(1);
        self.views.worked_out.fetch_add(1, Relaxed);
        *last = Some((self.now(), changes, v.clone()));
        v
    }

    fn work_out(&self, comps: &Comps) -> View {
        let at = self.at();
        let mut lost: Vec<LostPcomp> = comps
            .values()
            .filter(|e| e.info.role == Role::Proc && at.lost(e))
            .filter_map(|e| {
                Some(LostPcomp {
                    key: e.key?,
                    id: e.info.id,
                })
            })
            .collect();
        lost.extend(self.replaced.current());
        let mut lost_mcomps: Vec<u32> = comps
            .values()
            .filter(|e| e.info.role == Role::Mem && at.lost(e))
            .map(|e| e.info.id)
            .collect();
        lost_mcomps.extend(self.replaced_mcomps.current());
        lost_mcomps.extend(
            self.forgotten_mcomps
                .current()
                .into_iter()
                .filter(|id| !comps.contains_key(id)),
        );
        let (_, vnodes) = self.vnodes.list();
        let mut quotas: std::collections::HashMap<u32, Vec<(String, u64)>> = Default::default();
        for (quota, name) in vnodes.into_iter().filter_map(|v| Some((v.memory?, v.name))) {
            if let Ok(home) = self.quota_home(comps, &name, &at) {
                quotas.entry(home.id).or_default().push((name, quota));
            }
        }
        View {
            lost,
            lost_mcomps,
            detached: self.detached.current(),
            memory: comps
                .values()
                .filter(|e| self.takes_memory(e, &at))
                .map(|e| e.info.load.capacity)
                .sum(),
            leaving: self.leaving_ids(comps, &at),
            rebalance: self.rebalance_from(comps, &at),
            quotas,
        }
    }
}
