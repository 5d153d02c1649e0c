//! The pickers: where a process runs (GPM), which mComponent is a home or holds a vRegion
//! (GMM), which sComponent keeps a vNode's files or a backup (GSM), which nComponent runs a
//! program's sockets, and which mComponent caches a file, each by the load that heartbeats
//! report and the placement policy.
use super::*;
use crate::membership::At;

/// Why a picker found no component for what it places.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error("no alive mComponent has {need} bytes free")]
    NoRoom { need: u64 },
    #[error("no pComponent takes new programs (none is alive or late, or every one is cordoned)")]
    NoPComponent,
    #[error("no alive mComponent takes new homes")]
    NoMComponentTakesHomes,
    #[error("cannot keep the vNode's home: {0}")]
    KeepHome(anyhow::Error),
    #[error("no sComponent is alive")]
    NoSComponentAlive,
    #[error("replication \"log\" keeps backup files on an sComponent, and none is alive")]
    NoSComponentForBackups,
    #[error("no live nComponent has address {ip}")]
    NoNComponentAt { ip: std::net::IpAddr },
    /// Programs keep the stack of their pComponent's host.
    #[error("the cluster has no nComponent")]
    NoNComponent,
    #[error("no nComponent is alive")]
    NoNComponentAlive,
    #[error("no mComponent is alive")]
    NoMComponentAlive,
}

impl Refuse for PlaceError {
    fn code(&self) -> ErrCode {
        match self {
            PlaceError::NoRoom { .. } | PlaceError::NoMComponentTakesHomes => ErrCode::NoMemory,
            PlaceError::NoPComponent
            | PlaceError::NoSComponentAlive
            | PlaceError::NoSComponentForBackups
            | PlaceError::NoMComponentAlive => ErrCode::Unreachable,
            PlaceError::KeepHome(_) => ErrCode::Internal,
            // What the program's socket call sees.
            PlaceError::NoNComponentAt { .. } => ErrCode::Errno(libc::EADDRNOTAVAIL),
            PlaceError::NoNComponent => ErrCode::NotFound,
            PlaceError::NoNComponentAlive => ErrCode::Errno(libc::ENETDOWN),
        }
    }
}

impl Gm {
    /// The cluster's topology graph, with the links components measured.
    pub fn topology(&self) -> splitos_core::topology::Graph {
        let comps = self.comps();
        let infos: Vec<ComponentInfo> = comps.values().map(|e| e.info.clone()).collect();
        let samples = comps
            .values()
            .map(|e| {
                (
                    e.info.id,
                    e.links
                        .iter()
                        .map(|l| LinkSample {
                            age_ms: l.age_ms.saturating_add(self.since(e.last).as_millis() as u64),
                            ..l.clone()
                        })
                        .collect(),
                )
            })
            .collect();
        drop(comps);
        splitos_core::topology::Graph::cluster(&self.addr, &infos, &samples)
    }

    /// Hops on the topology graph from component `from` to each component it has a path to
    /// (by id), for a policy that places near first; empty for another policy, or an unknown
    /// `from`. The graph is built from a snapshot, outside the membership's lock, which
    /// heartbeats and placements wait for.
    pub(super) fn hops(
        &self,
        from: Option<u32>,
        rule: &dyn splitos_core::placement::Placement,
    ) -> std::collections::HashMap<u32, u32> {
        let Some(from) = from.filter(|_| rule.near_first()) else {
            return Default::default();
        };
        let g = splitos_core::topology::Graph::cluster(&self.addr, &self.snapshot(), &Default::default());
        let Some(start) = g.find(&splitos_core::topology::component_id(from)) else {
            return Default::default();
        };
        g.hops_from(start)
            .into_iter()
            .zip(&g.nodes)
            .filter_map(|(h, n)| Some((n.component?, h?)))
            .collect()
    }

    /// GMM: the alive mComponent the placement policy prefers among those with at least
    /// `need` bytes free, other than those in `exclude`, and on a host none of them is on when
    /// there is one. Its load is the share of its memory taken. `near`: the pComponent the
    /// memory is for, from which a policy that places near first counts hops.
    pub(super) fn pick_memory(
        &self,
        need: u64,
        exclude: &[u32],
        near: Option<u32>,
    ) -> Result<ComponentRef, PlaceError> {
        // One policy for the whole choice, though it may be replaced meanwhile.
        let rule = self.placement.rule();
        let hops = self.hops(near, rule);
        let mut comps = self.comps();
        let at = self.at();
        let taken_hosts: Vec<String> = comps
            .values()
            .filter(|e| exclude.contains(&e.info.id))
            .map(|e| host_of(&e.info.addr).to_string())
            .collect();
        let best = comps
            .values_mut()
            .enumerate()
            .filter(|(_, e)| self.takes_memory(e, &at) && !exclude.contains(&e.info.id))
            .map(|(index, e)| (index, e.info.load.capacity.saturating_sub(Gm::taken(e)), e))
            .filter(|(_, free, _)| *free >= need)
            .map(|(index, free, e)| {
                let load = (Gm::taken(e) * 1000 / e.info.load.capacity.max(1)) as f64;
                let key = rule.key(&Unit {
                    index,
                    free: &[free],
                    weights: &[1.0],
                    load,
                });
                // Without a path (or one counted before it registered) it comes last.
                let far = if hops.is_empty() {
                    0
                } else {
                    hops.get(&e.info.id).copied().unwrap_or(u32::MAX)
                };
                ((taken_hosts.iter().any(|h| h == host_of(&e.info.addr)), far), key, e)
            })
            .min_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)))
            .map(|(_, _, e)| e);
        let Some(e) = best else {
            let free: Vec<String> = comps
                .values()
                .filter(|e| e.info.role == Role::Mem && at.alive(e))
                .map(|e| format!("{}: {} of {} taken", e.info.id, Gm::taken(e), e.info.load.capacity))
                .collect();
            tracing::debug!(need, ?exclude, ?free, "no mComponent has room");
            return Err(PlaceError::NoRoom { need });
        };
        e.pending += need;
        Ok(ComponentRef {
            id: e.info.id,
            addr: e.info.addr.clone(),
        })
    }

    /// GPM: the pComponent the placement policy prefers for a new program, among the alive
    /// ones; if none is alive, among those only late (silent, not yet declared lost): a loaded
    /// host delays the heartbeats of a pComponent that still serves its programs, and the
    /// launcher says so clearly if it does not answer. Its load is its threads; it reports no
    /// capacity for processes, so every pComponent has room and a packing policy puts every
    /// process on the first.
    pub(super) fn place_process(&self) -> Result<G2C_PLACED, Refusal> {
        let mut comps = self.comps();
        let rule = self.placement.rule();
        let at = self.at();
        let takes = |e: &Entry| e.info.role == Role::Proc && !self.cordons.has(e.info.id) && !at.lost(e);
        let any_alive = comps.values().any(|e| takes(e) && at.alive(e));
        let e = comps
            .values_mut()
            .enumerate()
            .filter(|(_, e)| takes(e) && (at.alive(e) || !any_alive))
            .map(|(index, e)| {
                (
                    rule.key(&Unit {
                        index,
                        free: &[],
                        weights: &[],
                        load: e.info.load.threads as f64,
                    }),
                    e,
                )
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, e)| e)
            .ok_or(PlaceError::NoPComponent)?;
        crate::series::GPM_PLACEMENTS.increment(1);
        // Count the new process's thread until the next heartbeat reports it, so that
        // processes started together spread.
        e.info.load.threads += 1;
        Ok(G2C_PLACED { pcomp: e.info.clone() })
    }

    /// GMM: the home of a new process. A vNode with a memory quota has every process's home
    /// on one mComponent (rendezvous on its name), which so sees all the memory the vNode
    /// maps and enforces the quota alone; other processes go where the placement policy says.
    pub(super) fn pick_home(&self, r: P2G_PICK_HOME) -> Result<G2P_HOME, Refusal> {
        // None alive (the managers started again and no heartbeat came yet, or every
        // mComponent is late): the pComponent waits for one, where "no room" would refuse
        // the program.
        {
            let comps = self.comps();
            let at = self.at();
            if !comps.values().any(|e| e.info.role == Role::Mem && at.alive(e)) {
                return Err(PlaceError::NoMComponentAlive.into());
            }
        }
        let memory_quota = self.vnodes.quota(&r.vnode);
        let mcomp = match memory_quota {
            Some(_) => {
                let comps = self.comps();
                let at = self.at();
                self.quota_home(&comps, &r.vnode, &at)?
            }
            None => self.pick_memory(0, &[], Some(r.pcomp))?,
        };
        Ok(G2P_HOME { mcomp, memory_quota })
    }

    /// The home of every process of `vnode`, which has a memory quota: the one it had while
    /// that one is alive and not leaving, else a new one (rendezvous on the vNode's name).
    pub(super) fn quota_home(&self, comps: &Comps, vnode: &str, at: &At) -> Result<ComponentRef, PlaceError> {
        let mut homes = self.quota_homes.lock().unwrap();
        let kept = homes
            .get(vnode)
            .filter(|h| {
                comps
                    .values()
                    .any(|e| e.info.id == h.id && e.info.role == Role::Mem && at.alive(e) && e.info.leaving.is_none())
            })
            .cloned();
        let home = match kept {
            Some(h) => h,
            // A new home is not a cordoned one; a kept one stays, as it enforces the quota.
            None => rendezvous(
                comps.values().filter(|e| self.takes_memory(e, at)),
                Role::Mem,
                &format!("home\0{vnode}"),
            )
            .ok_or(PlaceError::NoMComponentTakesHomes)?,
        };
        // Kept before it is answered: a successor gives the vNode's next processes the same
        // home, which alone sees all of the vNode's memory.
        if homes.get(vnode) != Some(&home) {
            self.store
                .put(kept::QUOTA_HOMES, vnode, Some(&home))
                .map_err(PlaceError::KeepHome)?;
        }
        homes.insert(vnode.to_string(), home.clone());
        Ok(home)
    }

    /// Forgets the home of a deleted vNode: one made later under its name is placed anew.
    pub fn forget_quota_home(&self, vnode: &str) {
        self.views.changed();
        if self.quota_homes.lock().unwrap().remove(vnode).is_some() {
            if let Err(e) = self.store.put::<ComponentRef>(kept::QUOTA_HOMES, vnode, None) {
                tracing::warn!(vnode, error = %e, "cannot drop a deleted vNode's home from the managers' state");
            }
        }
    }

    pub(super) fn vnode_storage(&self, r: P2G_VNODE_STORAGE) -> Result<G2P_STORAGE, Refusal> {
        let scomp = self.storage_of(&r.vnode).ok_or(PlaceError::NoSComponentAlive)?;
        Ok(G2P_STORAGE { scomp })
    }

    /// Backup files go where the vNode's files are: one sComponent per vNode to reach.
    pub(super) fn backup_store(&self, r: M2G_BACKUP_STORE) -> Result<G2M_BACKUP_STORE, Refusal> {
        let scomp = self.storage_of(&r.vnode).ok_or(PlaceError::NoSComponentForBackups)?;
        Ok(G2M_BACKUP_STORE { scomp })
    }

    /// GSM: the vNode's sComponent, by rendezvous among the alive ones; when none is, among
    /// those only late (silent for less than `reclaim_dead`), as a late mComponent is waited
    /// for: on a loaded host a heartbeat comes late, and the sComponent is still there.
    fn storage_of(&self, vnode: &str) -> Option<ComponentRef> {
        let comps = self.comps();
        let at = self.at();
        rendezvous(comps.values().filter(|e| at.alive(e)), Role::Storage, vnode).or_else(|| {
            rendezvous(
                comps.values().filter(|e| at.silent(e) < self.reclaim_dead),
                Role::Storage,
                vnode,
            )
        })
    }

    /// GNM: the nComponent whose interfaces hold a socket's address, or the vNode's own
    /// (rendezvous on the vNode's name, so that all its programs share one stack and their
    /// loopback reaches each other).
    pub(super) fn pick_net(&self, r: P2G_PICK_NET) -> Result<G2P_NET, Refusal> {
        crate::series::GNM_PLACEMENTS.increment(1);
        let comps = self.comps();
        let at = self.at();
        let specific =
            r.ip.map(|ip| ip.to_canonical())
                .filter(|ip| !ip.is_unspecified() && !ip.is_loopback());
        if let Some(ip) = specific {
            let holder = comps
                .values()
                .find(|e| e.info.role == Role::Net && at.alive(e) && e.info.nics.contains(&ip));
            return match holder {
                Some(e) => Ok(G2P_NET {
                    ncomp: ComponentRef {
                        id: e.info.id,
                        addr: e.info.addr.clone(),
                    },
                }),
                None => Err(PlaceError::NoNComponentAt { ip }.into()),
            };
        }
        if !comps.values().any(|e| e.info.role == Role::Net) {
            return Err(PlaceError::NoNComponent.into());
        }
        let ncomp = rendezvous(comps.values().filter(|e| at.alive(e)), Role::Net, &r.vnode)
            .ok_or(PlaceError::NoNComponentAlive)?;
        Ok(G2P_NET { ncomp })
    }

    pub(super) fn file_cache(&self, r: P2G_FILE_CACHE) -> Result<G2P_FILE_CACHE, Refusal> {
        crate::series::GMM_FILE_CACHE_PLACEMENTS.increment(1);
        // A leaving mComponent keeps its files until it wrote them back: two caches of one
        // file at once would each miss the other's writes.
        let comps = self.comps();
        let at = self.at();
        let mcomp = rendezvous(
            comps.values().filter(|e| at.alive(e) && !e.files_gone),
            Role::Mem,
            &format!("{}\0{}", r.vnode, r.ino),
        )
        .ok_or(PlaceError::NoMComponentAlive)?;
        Ok(G2P_FILE_CACHE { mcomp })
    }
}

/// Rendezvous (highest random weight) choice among the given components of a role (the callers
/// say which count: the alive ones, mostly).
fn rendezvous<'a>(comps: impl IntoIterator<Item = &'a Entry>, role: Role, key: &str) -> Option<ComponentRef> {
    comps
        .into_iter()
        .filter(|e| e.info.role == role)
        .max_by_key(|e| fnv1a(format!("{key}\0{}", e.info.addr).as_bytes()))
        .map(|e| ComponentRef {
            id: e.info.id,
            addr: e.info.addr.clone(),
        })
}

/// FNV-1a: stable across builds and processes, unlike the standard library's hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}
