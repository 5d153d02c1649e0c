//! Detaching, attaching and rebalancing memory (docs/elastic-memory.md): the admin detaches an mComponent,
//! which leaves placement at once; its heartbeats' answers name it among the `leaving` ones,
//! so every home moves its processes' vRegions and backup homes off it and it gives its own
//! homes and buffer cache away. Its heartbeats report what is left; once nothing is, the
//! managers forget it and tell it to exit (or, drained, it stays, empty and cordoned).
use splitos_rpc::*;

use super::membership::At;
use super::{ComponentError, Comps, Entry, Gm};

impl Gm {
    /// Whether new homes, vRegions and buffer caches may go to this entry, at `at`.
    pub(super) fn takes_memory(&self, e: &Entry, at: &At) -> bool {
        e.info.role == Role::Mem && e.info.leaving.is_none() && !self.cordons.has(e.info.id) && at.alive(e)
    }

    /// The mComponents being detached or drained. One declared lost meanwhile is not: its
    /// copies are rebuilt from the others, as for any loss.
    pub(super) fn leaving_ids(&self, comps: &Comps, at: &At) -> Vec<u32> {
        comps
            .values()
            .filter(|e| e.info.leaving.is_some() && !at.lost(e))
            .map(|e| e.info.id)
            .collect()
    }

    /// Starts moving everything off mComponent `id` while programs run; `exit`: it exits once
    /// empty (a detach), else it stays, empty and out of placement (a drain). Refused for an
    /// unknown or lost component, one already leaving, the last mComponent that takes memory,
    /// and when the others lack room for what it holds.
    pub fn detach(&self, id: u32, exit: bool) -> Result<ComponentInfo, ComponentError> {
        let mut comps = self.comps();
        let at = self.at();
        let others_free: u64 = comps
            .values()
            .filter(|e| e.info.id != id && self.takes_memory(e, &at))
            .map(|e| e.info.load.capacity.saturating_sub(Gm::taken(e)))
            .sum();
        let others = comps
            .values()
            .filter(|e| e.info.id != id && self.takes_memory(e, &at))
            .count();
        // A finished drain (empty, staying) is no detach under way.
        let busy: Vec<u32> = comps
            .values()
            .filter(|e| e.info.id != id && e.info.leaving.as_ref().is_some_and(|l| l.exit || !l.empty()) && !at.lost(e))
            .map(|e| e.info.id)
            .collect();
        let e = comps
            .values_mut()
            .find(|e| e.info.id == id)
            .ok_or(ComponentError::NoSuch { id })?;
        if e.info.role != Role::Mem {
            return Err(ComponentError::NotDetachable {
                id,
                role: e.info.role.name(),
            });
        }
        if !at.alive(e) {
            return Err(ComponentError::LostMComponent { id });
        }
        match e.info.leaving.as_mut() {
            // A drained (or draining) mComponent is detached by letting it exit once empty.
            Some(l) if exit && !l.exit => {
                l.exit = true;
                tracing::info!(id, "a drained mComponent is detached: it exits once empty");
                return Ok(ComponentInfo {
                    alive: true,
                    cordoned: self.cordons.has(id),
                    ..e.info.clone()
                });
            }
            Some(_) => return Err(ComponentError::AlreadyDetaching { id }),
            None => {}
        }
        if let Some(other) = busy.first() {
            return Err(ComponentError::OneDetachAtATime { other: *other });
        }
        if others == 0 {
            return Err(ComponentError::LastMComponent { id });
        }
        let needs = self.replication.members();
        if others < needs {
            return Err(ComponentError::TooFewOthers {
                replication: self.replication,
                needs,
                others,
            });
        }
        let holds = e.info.load.used.max(e.info.load.committed);
        if holds > others_free {
            return Err(ComponentError::NoRoomToMove {
                id,
                holds,
                free: others_free,
            });
        }
        e.info.leaving = Some(Leaving {
            bytes_at_start: e.info.load.used,
            bytes_left: e.info.load.used,
            homes: e.info.load.processes,
            exit,
            ..Leaving::default()
        });
        // Kept before it is answered: a detach the admin was told of that a successor does
        // not know would never end, the mComponent half emptied and taken back.
        // One whose write may have reached the state all the same (its answer was lost) is
        // taken back there too, as far as it can be.
        if let Err(err) = self.keep(e) {
            e.info.leaving = None;
            self.keep_change(e);
            return Err(ComponentError::KeepDetach(err));
        }
        self.views.changed();
        crate::series::MCOMPONENT_DETACHES.increment(1);
        tracing::info!(id, addr = %e.info.addr, bytes = e.info.load.used, exit, "mComponent leaving: its memory moves to the others");
        Ok(ComponentInfo {
            alive: true,
            cordoned: self.cordons.has(id),
            ..e.info.clone()
        })
    }

    /// Gives mComponent `id` to placement again: calls off its detach (what moved stays
    /// where it went) and lifts a cordon.
    pub fn attach(&self, id: u32) -> Result<ComponentInfo, ComponentError> {
        let role = self
            .comps()
            .values()
            .find(|e| e.info.id == id)
            .map(|e| e.info.role)
            .ok_or(ComponentError::NoSuch { id })?;
        if role != Role::Mem {
            return Err(ComponentError::NotAttachable { id, role: role.name() });
        }
        let c = self.cordon(id, false)?;
        crate::series::MCOMPONENT_ATTACHES.increment(1);
        tracing::info!(id, addr = %c.addr, capacity = c.load.capacity, "mComponent attached: it takes new homes and vRegions");
        Ok(c)
    }

    /// Calls off the detach or drain of mComponent `id`, if one is under way.
    pub(super) fn stay(&self, id: u32) {
        if let Some(e) = self.comps().values_mut().find(|e| e.info.id == id) {
            if e.info.leaving.take().is_some() {
                self.keep_change(e);
                self.views.changed();
                tracing::info!(id, "detach called off: the mComponent takes memory again");
            }
        }
    }

    /// Takes a leaving mComponent's heartbeat report; true when it is to exit now (detached
    /// and empty).
    pub(super) fn leaving_report(e: &mut Entry, report: Option<Leaving>) -> bool {
        e.files_gone |= report.as_ref().is_some_and(|r| r.files_released);
        let (Some(l), Some(r)) = (e.info.leaving.as_mut(), report) else {
            return false;
        };
        *l = Leaving {
            bytes_at_start: l.bytes_at_start.max(r.bytes_at_start),
            exit: l.exit,
            ..r
        };
        l.exit && l.empty()
    }

    /// With rebalancing on, the mComponent whose vRegions the homes move off now: the one
    /// fullest for its capacity, from when it is `rebalance_percent` points fuller than the
    /// emptiest until the gap is under half of that (so that moves settle rather than swing).
    /// Only mComponents that take memory count.
    pub(super) fn rebalance_from(&self, comps: &Comps, at: &At) -> Option<u32> {
        if self.rebalance_percent == 0 {
            return None;
        }
        let fill: Vec<(u32, f64)> = comps
            .values()
            .filter(|e| self.takes_memory(e, at) && e.info.load.capacity > 0)
            .map(|e| (e.info.id, e.info.load.used as f64 * 100.0 / e.info.load.capacity as f64))
            .collect();
        let mut on = self.rebalancing.lock().unwrap();
        let (Some(full), Some(empty)) = (
            fill.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1)),
            fill.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1)),
        ) else {
            *on = None;
            return None;
        };
        let (gap, limit) = (full.1 - empty.1, self.rebalance_percent as f64);
        if gap > limit || (on.is_some() && gap > limit / 2.0) {
            if *on != Some(full.0) {
                crate::series::REBALANCES.increment(1);
                tracing::info!(
                    full = full.0,
                    full_percent = full.1,
                    empty = empty.0,
                    empty_percent = empty.1,
                    "rebalancing: the homes move vRegions off the fullest mComponent"
                );
            }
            *on = Some(full.0);
        } else if on.take().is_some() {
            tracing::info!(
                gap,
                "rebalanced: the mComponents are within half the rebalancing gap of each other"
            );
        }
        *on
    }
}
