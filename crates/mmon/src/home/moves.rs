//! Moves of a vRegion's copy off a member that stays in the cluster: one full (heuristic
//! overcommit), leaving, or one a pComponent cannot reach while the home can. The copy is
//! made from the member itself (or a logged set's primary) to another with room, so the
//! process keeps as many copies; rebuilds after a loss are [`super::rebuild`]'s.
use splitos_rpc::*;

use super::rebuild::RebuildError;
use super::{lock_home, HomeProc};
use crate::{Mem, Peers, PAGE};

/// How long a member a pComponent could not reach is no place for the process's vRegions.
const UNREACHED_FOR: std::time::Duration = std::time::Duration::from_secs(60);

impl<P: Peers> Mem<P> {
    /// A pComponent could not reach a replica of the process: once the home finds it
    /// unreachable too (or not holding the process), it leaves the process's sets and is
    /// rebuilt elsewhere in the background. A pComponent's word alone takes no copy out of
    /// service: from a member the home still reaches (a path lost between the pComponent's
    /// host and the member's while the managers hear both), the home moves the copy of the
    /// vRegion the pComponent needs to another member, as for a full one, so that the
    /// process goes on with as many copies; where no other has room, the member stays.
    pub(crate) fn replica_lost(&self, r: P2M_REPLICA_LOST) -> Result<M2P_VREGIONS, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let member = hp
            .lock()
            .unwrap()
            .vregions
            .values()
            .flat_map(|s| s.owners.iter())
            .find(|o| o.id == r.lost)
            .cloned();
        if let Some(o) = member {
            if self.reaches(&o, &r.who) {
                let avoid: Vec<u32> = {
                    let mut unreached = self.unreached.lock().unwrap();
                    let now = std::time::Instant::now();
                    unreached.retain(|_, at| now.duration_since(*at) < UNREACHED_FOR);
                    unreached.insert((r.who.pid, o.id), now);
                    unreached
                        .keys()
                        .filter(|(pid, _)| *pid == r.who.pid)
                        .map(|(_, m)| *m)
                        .collect()
                };
                let idx = r.vpn * PAGE / self.vrs();
                let mut h = lock_home(&hp)?;
                let holds = h
                    .vregions
                    .get(&idx)
                    .is_some_and(|s| s.owners.iter().any(|m| m.id == o.id));
                match holds.then(|| self.relocate(&mut h, idx, &o, &avoid)) {
                    Some(Ok(())) => {
                        crate::series::VREGIONS_MOVED_UNREACHED.increment(1);
                        tracing::warn!(
                            pid = r.who.pid,
                            member = r.lost,
                            vregion = idx,
                            "a pComponent cannot reach a replica this home reaches: the vRegion it needs moved off it"
                        );
                    }
                    Some(Err(e)) => tracing::warn!(
                        pid = r.who.pid,
                        member = r.lost,
                        error = %e,
                        "a pComponent cannot reach a replica this home reaches, and the vRegion cannot move: it stays"
                    ),
                    None => {}
                }
            } else {
                tracing::warn!(pid = r.who.pid, lost = r.lost, "a replica of a process is lost");
                // The vRegion the pComponent waits for first; the others in the background.
                self.drop_replicas(&mut *lock_home(&hp)?, &[r.lost], Some(r.vpn * PAGE / self.vrs()));
            }
        }
        self.vregions(P2M_VREGIONS { who: r.who })
    }

    /// A write-back of page `vpn` found member `full` out of memory (heuristic overcommit):
    /// the page's vRegion moves from it to an mComponent with room, its copy there is
    /// released, and the new sets are answered.
    pub(crate) fn owner_full(&self, r: P2M_OWNER_FULL) -> Result<M2P_VREGIONS, Refusal> {
        let hp = self.home_proc(&r.who)?;
        {
            let mut h = lock_home(&hp)?;
            let idx = r.vpn * PAGE / self.vrs();
            let holds = h
                .vregions
                .get(&idx)
                .and_then(|s| s.owners.iter().find(|o| o.id == r.full))
                .cloned();
            if let Some(full) = holds {
                self.relocate(&mut h, idx, &full, &[])?;
            }
        }
        self.vregions(P2M_VREGIONS { who: r.who })
    }

    /// Moves member `full` (out of memory, or leaving) of vRegion `idx`'s set to an
    /// mComponent with room, and releases its copy there.
    /// Also not to the members in `avoid`.
    pub(super) fn relocate(
        &self,
        h: &mut HomeProc,
        idx: u64,
        full: &ComponentRef,
        avoid: &[u32],
    ) -> Result<(), Refusal> {
        let set = &h.vregions[&idx];
        let exclude: Vec<u32> = std::iter::once(full.id).chain(avoid.iter().copied()).collect();
        // A logger's copy comes from its primary, and starts the backup afresh, as a new
        // logger's does after a loss.
        let copied = match set.log.is_some() && set.owners.len() == 2 && set.owners[1].id == full.id {
            true => {
                let primary = set.owners[0].clone();
                self.copy_to_new_member(h, idx, &primary, &exclude, true)?
            }
            false => self.copy_to_new_member(h, idx, full, &exclude, false)?,
        };
        let Some((new, moved)) = copied else {
            crate::series::NO_ROOM.increment(1);
            return Err(RebuildError::NoRoomToMove {
                idx,
                pid: h.who.pid,
                full: full.id,
            }
            .into());
        };
        let s = h.vregions.get_mut(&idx).expect("checked by the caller");
        for o in s.owners.iter_mut().filter(|o| o.id == full.id) {
            *o = new.clone();
        }
        s.epoch = h.epoch;
        let set = s.clone();
        let left = !h.vregions.values().any(|s| s.owners.iter().any(|o| o.id == full.id));
        if left && !h.retired.iter().any(|r| r.id == full.id) {
            // It keeps the process's record (whose epoch refuses late write-backs) until the
            // process exits, and is told then: a drained mComponent would keep it for good.
            h.retired.push(full.clone());
        }
        if set.announced() {
            // The full member learns it left the set before it frees its copy: what it frees
            // is on the new member now, and no change of it may reach the parity.
            self.tell_set(h, idx, &set, LogStep::Keep)?;
            if let Err(e) = self.tell_member(h, full, idx, &set, LogStep::Keep) {
                tracing::warn!(owner = full.id, error = %e, "cannot tell a full mComponent it left a striped set");
            }
        }
        let vrs = self.vrs();
        if let Err(e) = self.to_owner(
            full,
            M2M_VMA_REMOVE {
                who: h.who(),
                start: idx * vrs,
                end: (idx + 1) * vrs,
            },
        ) {
            tracing::warn!(owner = full.id, error = %e, "cannot release a moved vRegion on the full mComponent");
        }
        self.sync_backup(h);
        crate::series::VREGIONS_MOVED.increment(1);
        self.moved_pages.fetch_add(moved, std::sync::atomic::Ordering::Relaxed);
        tracing::info!(
            pid = h.who.pid,
            vregion = idx,
            from = full.id,
            to = new.id,
            pages = moved,
            "vRegion moved to another mComponent"
        );
        Ok(())
    }
}
