//! Failover of homes: a home copies its state of each process to a backup home after every
//! change (`M2M_HOME_SYNC`), and the backup takes over when the home is lost
//! (`P2M_HOME_TAKEOVER`, or the global managers' word), once it cannot reach it either.
use std::sync::{Arc, Mutex};

use splitos_rpc::*;

use super::{HomeError, HomeProc, Replicas, VERIFY_TIMEOUT};
use crate::{Mem, Peers};

impl<P: Peers> Mem<P> {
    /// Copies the home's state of the process to its backup home, choosing another backup
    /// when that one cannot be reached.
    pub(super) fn sync_backup(&self, h: &mut HomeProc) {
        if !self.replication().redundant() || h.gone() {
            return;
        }
        let mut failed = vec![self.peers.id()];
        for _ in 0..3 {
            let backup = match h.backup.clone() {
                Some(b) => b,
                None => match self.pick_other(0, &failed, 0) {
                    Ok(Some(b)) => b,
                    _ => {
                        tracing::warn!(
                            pid = h.who.pid,
                            "no mComponent can be backup home: the process's layout has one copy"
                        );
                        return;
                    }
                },
            };
            match self.peers.call(
                &backup.addr,
                M2M_HOME_SYNC {
                    state: h.state(self.me()),
                },
            ) {
                Ok(_) => {
                    h.backup = Some(backup);
                    return;
                }
                Err(e) => {
                    tracing::warn!(pid = h.who.pid, backup = backup.id, error = %e, "backup home cannot be reached; choosing another");
                    failed.push(backup.id);
                    h.backup = None;
                }
            }
        }
    }

    /// The global managers declared this mComponent lost and rebuilt its copies elsewhere:
    /// what it holds may be older than those, so it holds nothing any more.
    pub(crate) fn fence(&self) {
        self.fences.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let owned = std::mem::take(&mut *self.owned.lock().unwrap());
        let homes = std::mem::take(&mut *self.homes.lock().unwrap());
        let backups = std::mem::take(&mut *self.backups.lock().unwrap());
        self.backup_log.clear();
        for p in owned.values() {
            self.let_go(&mut p.lock().unwrap());
        }
        crate::series::FENCED.increment(1);
        tracing::error!(
            processes = owned.len(),
            homes = homes.len(),
            backups = backups.len(),
            "fenced by the global managers (declared lost while unreachable): dropped every copy this mComponent held"
        );
    }

    /// The global managers say these mComponents are lost: every process this mComponent is
    /// home of loses its replicas there, and every process whose home was one of them gets
    /// this mComponent as its home if it was the backup.
    pub(crate) fn mcomps_lost(&self, lost: &[u32]) {
        *self.declared_lost.lock().unwrap() = lost.to_vec();
        if lost.is_empty() || !self.replication().redundant() {
            return;
        }
        let homes: Vec<Arc<Mutex<HomeProc>>> = self.homes.lock().unwrap().values().cloned().collect();
        for hp in homes {
            let mut h = hp.lock().unwrap();
            let touched = h
                .vregions
                .values()
                .any(|s| s.owners.iter().any(|o| lost.contains(&o.id)))
                || h.backup.as_ref().is_some_and(|b| lost.contains(&b.id));
            if touched {
                self.drop_replicas(&mut h, lost, None);
            }
        }
        let orphans: Vec<(Who, u32, u32)> = self
            .backups
            .lock()
            .unwrap()
            .values()
            .filter(|s| lost.contains(&s.home.id))
            .map(|s| (s.who.clone(), s.home.id, s.pcomp))
            .collect();
        for (who, home, pcomp) in orphans {
            let pid = who.pid;
            match self.take_over(who.clone(), home) {
                // Its pComponent is told, or it would know only the lost home and its backup
                // (this one): lost too before its next call, the process would have no home
                // it can find.
                Ok(took) => self.unannounced.lock().unwrap().push((
                    pcomp,
                    M2P_HOME_MOVED {
                        who,
                        from: home,
                        home: self.me(),
                        backup: took.backup,
                    },
                )),
                Err(e) => tracing::warn!(pid, error = %e, "cannot take over a process whose home is lost"),
            }
        }
        self.announce_moves();
    }

    /// A home's copy of its state of one process, kept for taking over.
    pub(crate) fn home_sync(&self, r: M2M_HOME_SYNC) -> Result<OK, Refusal> {
        let pid = r.state.who.pid;
        // A home declared lost that goes on before it hears so (paused, cut off) carries out
        // what it was sent meanwhile: its copy may be of a process that has another home now,
        // or has ended, and would be taken over as a second home or one nobody ends.
        if self.declared_lost.lock().unwrap().contains(&r.state.home.id) {
            crate::series::STALE_HOME_SYNCS.increment(1);
            return Err(HomeError::DeclaredLost {
                mcomp: r.state.home.id,
                pid,
            }
            .into());
        }
        if self.homes.lock().unwrap().contains_key(&pid) {
            return Err(HomeError::NowHome {
                mcomp: self.peers.id(),
                pid,
            }
            .into());
        }
        self.backups.lock().unwrap().insert(pid, r.state);
        Ok(OK)
    }

    pub(crate) fn home_drop(&self, r: M2M_HOME_DROP) -> Result<OK, Refusal> {
        self.backups.lock().unwrap().remove(&r.who.pid);
        Ok(OK)
    }

    /// The pComponent of a process cannot reach its home: the backup becomes the home, once
    /// it finds the home unreachable too (or no longer the process's home). A home that is
    /// only slow stays the home: two homes of one process would each change its sets.
    pub(crate) fn home_takeover(&self, r: P2M_HOME_TAKEOVER) -> Result<M2P_HOME, Refusal> {
        if let Ok(hp) = self.home_proc(&r.who) {
            return Ok(M2P_HOME {
                backup: hp.lock().unwrap().backup.clone(),
            });
        }
        let kept = self
            .backups
            .lock()
            .unwrap()
            .get(&r.who.pid)
            .map(|s| (s.who.vnode.clone(), s.creator, s.home.clone()));
        let Some((vnode, creator, home)) = kept else {
            return Err(HomeError::NoCopy {
                mcomp: self.peers.id(),
                pid: r.who.pid,
            }
            .into());
        };
        if vnode != r.who.vnode {
            return Err(HomeError::OtherVnode { pid: r.who.pid }.into());
        }
        self.may_act(r.who.pid, creator)?;
        if self
            .peers
            .call_timeout(
                &home.addr,
                M2M_HOME_OF {
                    who: Who::new(vnode, r.who.pid),
                },
                VERIFY_TIMEOUT,
            )
            .is_ok()
        {
            return Err(HomeError::StillHome {
                mcomp: home.id,
                addr: home.addr,
                pid: r.who.pid,
            }
            .into());
        }
        self.take_over(r.who, home.id)
    }

    /// `M2M_HOME_OF`: whether this mComponent is still the process's home.
    pub(crate) fn home_of(&self, r: M2M_HOME_OF) -> Result<OK, Refusal> {
        self.homes.lock().unwrap().get(&r.who.pid).map(|_| OK).ok_or_else(|| {
            HomeError::NotHome {
                mcomp: self.peers.id(),
                pid: r.who.pid,
            }
            .into()
        })
    }

    /// Becomes the home of `who` from the copy of its state kept here. The epoch moves past
    /// any the process's pComponent (`who.epoch`) or an owner may have seen.
    fn take_over(&self, who: Who, lost_home: u32) -> Result<M2P_HOME, Refusal> {
        let Some(state) = self.backups.lock().unwrap().remove(&who.pid) else {
            return Err(HomeError::NoCopy {
                mcomp: self.peers.id(),
                pid: who.pid,
            }
            .into());
        };
        crate::series::HOME_TAKEOVERS.increment(1);
        tracing::warn!(
            pid = who.pid,
            lost = lost_home,
            "home of a process is lost: this mComponent, its backup, takes over"
        );
        let backup = self.become_home(state, who.epoch, Some(lost_home));
        Ok(M2P_HOME { backup })
    }

    /// `M2M_HOME_ADOPT`: a leaving home gives this mComponent one of its processes. A repeat
    /// from the same home (its answer was lost) is answered again: that home stopped acting
    /// for the process when it first asked, so the state is the one taken.
    pub(crate) fn home_adopt(&self, r: M2M_HOME_ADOPT) -> Result<M2M_HOME_ADOPTED, Refusal> {
        let pid = r.state.who.pid;
        let from = r.state.home.id;
        let mine = self.homes.lock().unwrap().get(&pid).cloned();
        if let Some(hp) = mine {
            let h = hp.lock().unwrap();
            if h.adopted_from == Some(from) && h.who.vnode == r.state.who.vnode {
                return Ok(M2M_HOME_ADOPTED {
                    backup: h.backup.clone(),
                });
            }
            return Err(HomeError::AlreadyHome {
                mcomp: self.peers.id(),
                pid,
            }
            .into());
        }
        if !self.leavers.lock().unwrap().contains(&from) {
            return Err(HomeError::NotLeaving { mcomp: from }.into());
        }
        self.backups.lock().unwrap().remove(&pid);
        let backup = self.become_home(r.state, 0, None);
        if let Some(hp) = self.homes.lock().unwrap().get(&pid) {
            hp.lock().unwrap().adopted_from = Some(from);
        }
        crate::series::HOMES_ADOPTED.increment(1);
        tracing::info!(pid, from, "became the home of a process its leaving home gave up");
        Ok(M2M_HOME_ADOPTED { backup })
    }

    /// Becomes the home of the process in `state`, past epoch `seen` and the state's own: the
    /// owners refuse write-backs of older epochs from now on. `lost`: the home it replaces is
    /// lost, and leaves the process's sets. Returns the new backup home.
    fn become_home(&self, state: HomeState, seen: u64, lost: Option<u32>) -> Option<ComponentRef> {
        let pid = state.who.pid;
        let hp = Arc::new(Mutex::new(HomeProc::from_state(state)));
        let mut h = hp.lock().unwrap();
        self.homes.lock().unwrap().insert(pid, hp.clone());
        h.epoch = h.epoch.max(seen) + 1;
        // Charged here now: what it had mapped is not refused, only what it maps next.
        h.charged = h.layout.writable_in(h.base, h.limit);
        self.quotas.settle(&h.who.vnode, 0, 0, h.charged);
        let epoch_who = h.who();
        for o in h.all_owners() {
            if let Err(e) = self.to_owner(&o, M2M_EPOCH { who: epoch_who.clone() }) {
                tracing::debug!(owner = o.id, error = %e, "cannot tell an owner the new epoch");
            }
        }
        if let Some(lost) = lost {
            self.drop_replicas(&mut h, &[lost], None);
        }
        // Loggers ask their home for copies: this one now.
        let logged: Vec<(u64, Replicas)> = h
            .vregions
            .iter()
            .filter(|(_, s)| s.log.is_some())
            .map(|(i, s)| (*i, s.clone()))
            .collect();
        for (idx, set) in logged {
            if let Err(e) = self.tell_set(&h, idx, &set, LogStep::Keep) {
                tracing::warn!(pid, vregion = idx, error = %e, "cannot tell a logged set its new home");
            }
        }
        self.sync_backup(&mut h);
        h.backup.clone()
    }
}
