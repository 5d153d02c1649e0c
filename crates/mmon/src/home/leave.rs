//! Detaching an mComponent while programs run (docs/elastic-memory.md): every home moves the
//! vRegions of its processes off the leaving members, one vRegion at a time under the
//! process's lock ([`Mem::relocate`], as for a full member: fenced by a new epoch, so no
//! write-back lands only on the old member), and chooses another backup home where the backup
//! leaves. The leaving mComponent also gives each process it is home of to another
//! mComponent (`M2M_HOME_ADOPT`) and tells the process's pComponent where it went
//! (`M2P_HOME_MOVED`). Rebalancing moves vRegions the same way, one a heartbeat, off the
//! mComponent the managers find fullest.
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use splitos_rpc::*;

use super::{HomeError, HomeProc};
use crate::{Mem, Peers};

impl<P: Peers> Mem<P> {
    /// Moves what this home has on the `leaving` mComponents elsewhere; if this mComponent is
    /// among them, gives up its homes and its buffer cache too (and takes them back if the
    /// detach was called off).
    pub(crate) fn leave(&self, leaving: &[u32]) {
        *self.leavers.lock().unwrap() = leaving.to_vec();
        let me = leaving.contains(&self.peers.id());
        if !me && self.leaving.lock().unwrap().take().is_some() {
            *self.files_closed.write().unwrap() = false;
            tracing::info!("detach called off: this mComponent takes file requests again");
        }
        if me && self.leaving.lock().unwrap().is_none() {
            let at_start = self.room.used();
            *self.leaving.lock().unwrap() = Some(Leaving {
                bytes_at_start: at_start,
                ..Leaving::default()
            });
            tracing::info!(
                bytes = at_start,
                homes = self.homes.lock().unwrap().len(),
                "leaving: moving homes, vRegions and the buffer cache to other mComponents"
            );
        }
        if leaving.is_empty() {
            return;
        }
        let stuck = self.leave_pass(leaving);
        if me {
            self.announce_moves();
            let released = {
                *self.files_closed.write().unwrap() = true;
                self.bcache.release()
            };
            if let Some(l) = self.leaving.lock().unwrap().as_mut() {
                l.files_released = released;
                l.stuck = stuck;
            }
        }
    }

    /// How far this mComponent's detach has come, for its heartbeat (none: not leaving).
    pub(crate) fn leave_report(&self) -> Option<Leaving> {
        let mut l = self.leaving.lock().unwrap().clone()?;
        let owned: Vec<Arc<Mutex<crate::owner::OwnerProc>>> = self.owned.lock().unwrap().values().cloned().collect();
        l.processes = owned.iter().filter(|p| p.lock().unwrap().holds()).count() as u32;
        l.bytes_left = self.room.used();
        l.homes = (self.homes.lock().unwrap().len() + self.unannounced.lock().unwrap().len()) as u32;
        l.backups = self.backups.lock().unwrap().len() as u32;
        l.socket_buffers = self.netbufs.count() as u32;
        Some(l)
    }

    /// One pass of moving this home's processes off the `leaving` mComponents (this one
    /// among them: its processes get other homes). Returns why something could not move,
    /// if it could not: everything stays as it was, and the next pass tries again.
    pub(crate) fn leave_pass(&self, leaving: &[u32]) -> Option<String> {
        let me_leaving = leaving.contains(&self.peers.id());
        let homes: Vec<Arc<Mutex<HomeProc>>> = self.homes.lock().unwrap().values().cloned().collect();
        let mut stuck = None;
        for hp in homes {
            // A leaving home first gives the process away: its new home moves the vRegions.
            let r = match me_leaving {
                true => self.hand_off(&hp),
                false => self.move_off(&hp, leaving),
            };
            if let Err(e) = r {
                tracing::warn!(error = %e.msg, "cannot move a process's memory off a leaving mComponent yet; will try again");
                stuck.get_or_insert(e.msg);
            }
        }
        stuck
    }

    /// Rebalancing: moves one vRegion of this home's processes off mComponent `full` (to the
    /// mComponent placement picks, not a member of its set), if any has a copy there.
    pub(crate) fn rebalance_pass(&self, full: u32) {
        let homes: Vec<Arc<Mutex<HomeProc>>> = self.homes.lock().unwrap().values().cloned().collect();
        for hp in homes {
            let mut h = hp.lock().unwrap();
            if h.gone() {
                continue;
            }
            let found = h
                .vregions
                .iter()
                .find_map(|(i, s)| s.owners.iter().find(|o| o.id == full).map(|o| (*i, o.clone())));
            let Some((idx, member)) = found else { continue };
            match self.relocate(&mut h, idx, &member, &[]) {
                Ok(()) => {
                    crate::series::REBALANCE_MOVES.increment(1);
                    tracing::info!(
                        pid = h.who.pid,
                        vregion = idx,
                        from = full,
                        "rebalancing: moved a vRegion off the fullest mComponent"
                    );
                }
                Err(e) => {
                    tracing::debug!(pid = h.who.pid, vregion = idx, error = %e.msg, "rebalancing: cannot move a vRegion now")
                }
            }
            return;
        }
    }

    /// Moves every vRegion of the process with a member in `leaving` to other mComponents,
    /// and its backup home if that leaves.
    fn move_off(&self, hp: &Arc<Mutex<HomeProc>>, leaving: &[u32]) -> Result<(), Refusal> {
        let mut tried = BTreeSet::new();
        loop {
            let mut h = hp.lock().unwrap();
            if h.gone() {
                return Ok(());
            }
            let found = h
                .vregions
                .iter()
                .filter(|(i, _)| !tried.contains(*i))
                .find_map(|(i, s)| {
                    s.owners
                        .iter()
                        .find(|o| leaving.contains(&o.id))
                        .map(|o| (*i, o.clone()))
                });
            let Some((idx, member)) = found else { break };
            tried.insert(idx);
            self.relocate(&mut h, idx, &member, &[])?;
        }
        let mut h = hp.lock().unwrap();
        if let Some(b) = h.backup.clone().filter(|b| leaving.contains(&b.id)) {
            h.backup = None;
            self.sync_backup(&mut h);
            if let Err(e) = self.peers.call(&b.addr, M2M_HOME_DROP { who: h.who() }) {
                tracing::warn!(pid = h.who.pid, backup = b.id, error = %e, "a leaving backup home did not drop its copy");
            }
        }
        Ok(())
    }

    /// Gives the process to another mComponent as its home, then tells its pComponent. From
    /// the request on, this home no longer acts for the process: calls are refused `NotHome`,
    /// naming the new home. An answer that does not come is asked for again, of that same
    /// mComponent (which may be the home already, and answers a repeat again): two homes of
    /// one process never exist. A refusal, or a request never delivered, gives the process
    /// back to this home.
    fn hand_off(&self, hp: &Arc<Mutex<HomeProc>>) -> Result<(), Refusal> {
        let mut h = hp.lock().unwrap();
        if h.exited || h.handed {
            return Ok(());
        }
        let pid = h.who.pid;
        let new = match h.moved_to.clone() {
            Some(to) => to,
            None => self
                .pick_other(0, &[self.peers.id()], h.pcomp)?
                .ok_or(HomeError::NoOtherHome { pid })?,
        };
        h.moved_to = Some(new.clone());
        let adopted = match self.peers.call(
            &new.addr,
            M2M_HOME_ADOPT {
                state: h.state(self.me()),
            },
        ) {
            Ok(a) => a,
            Err(e) => {
                if matches!(e, RpcError::Remote { .. } | RpcError::Unreachable { .. }) {
                    h.moved_to = None;
                }
                return Err(HomeError::HandOver {
                    pid,
                    to: new.id,
                    cause: e,
                }
                .into());
            }
        };
        h.handed = true;
        // The old backup's copy names this home: only the new home's backup may take over.
        if let Some(b) = h
            .backup
            .take()
            .filter(|b| b.id != new.id && Some(b.id) != adopted.backup.as_ref().map(|a| a.id))
        {
            if let Err(e) = self.peers.call(&b.addr, M2M_HOME_DROP { who: h.who() }) {
                tracing::warn!(pid, backup = b.id, error = %e, "the old backup home did not drop its copy");
            }
        }
        // Listed as to be told before it stops counting among the homes, so that this
        // mComponent never reports itself empty while a pComponent still knows only it; told
        // at once, while calls still wait on the lock, so that they find the new home.
        self.unannounced.lock().unwrap().push((
            h.pcomp,
            M2P_HOME_MOVED {
                who: h.who(),
                from: self.peers.id(),
                home: new.clone(),
                backup: adopted.backup,
            },
        ));
        self.announce_moves();
        self.homes.lock().unwrap().remove(&pid);
        self.quotas.settle(&h.who.vnode, 0, h.charged, 0);
        h.charged = 0;
        drop(h);
        crate::series::HOMES_HANDED_OFF.increment(1);
        tracing::info!(pid, to = new.id, "gave a process to another home before leaving");
        Ok(())
    }

    /// Tells pComponents the new homes of processes this mComponent gave away; those it
    /// cannot reach yet are told at the next pass (until then they find out by `NotHome`,
    /// and this mComponent stays).
    pub(crate) fn announce_moves(&self) {
        let pending = self.unannounced.lock().unwrap().clone();
        for (pcomp, moved) in pending {
            let told = self
                .peers
                .call_gm(M2G_FIND { id: pcomp })
                .map_err(Refusal::from)
                .and_then(|f| Ok(self.peers.call(&f.comp.addr, moved.clone())?));
            match told {
                Ok(_) => {}
                // A pComponent the managers do not know alive ran its processes' last: nothing to tell.
                Err(e) if e.code == ErrCode::NotFound => {}
                Err(e) => {
                    tracing::warn!(pid = moved.who.pid, pcomp, error = %e.msg, "cannot tell a pComponent its process's new home yet");
                    continue;
                }
            }
            self.unannounced
                .lock()
                .unwrap()
                .retain(|(_, m)| m.who.pid != moved.who.pid);
        }
    }
}
