//! A process's life on an owner: its mappings as the home tells them (`M2M_VMA_*`,
//! `M2M_DISCARD`), a fork's copy of its pages, and its exit.
use super::*;

impl<P: Peers> Mem<P> {
    pub(crate) fn vma_add(&self, r: M2M_VMA_ADD) -> Result<OK, Refusal> {
        let M2M_VMA_ADD {
            who,
            start,
            end,
            prot,
            creator,
            quota,
        } = r;
        let accounted = prot & PROT_WRITE != 0 && self.charges_mappings();
        if accounted {
            self.commit(&who.vnode, end - start)?;
        }
        let refused = |e: OwnerError| {
            if accounted {
                self.room.uncommit(&who.vnode, end - start);
            }
            e
        };
        let p = self.owner_from_home(&who, creator, quota).map_err(refused)?;
        let mut g = self.live(&p).map_err(refused)?;
        g.pages.revoke();
        let gone = g.vmas.remove_range(start, end);
        self.uncommit(&mut g, &gone);
        let deltas = self.free_pages(&mut g, start, end);
        g.vmas.insert(start, Vma { end, prot, accounted });
        if accounted {
            g.committed += end - start;
        }
        self.release_and_forward(&p, g, &who, deltas)?;
        Ok(OK)
    }

    pub(crate) fn vma_remove(&self, r: M2M_VMA_REMOVE) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = self.live(&p)?;
        g.pages.revoke();
        let gone = g.vmas.remove_range(r.start, r.end);
        self.uncommit(&mut g, &gone);
        let deltas = self.free_pages(&mut g, r.start, r.end);
        self.release_and_forward(&p, g, &r.who, deltas)?;
        Ok(OK)
    }

    pub(crate) fn vma_protect(&self, r: M2M_VMA_PROTECT) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = self.live(&p)?;
        let parts = g.vmas.carve(r.start, r.end);
        let writable = r.prot & PROT_WRITE != 0 && self.charges_mappings();
        if writable {
            let need: u64 = parts.iter().filter(|(_, v)| !v.accounted).map(|(s, v)| v.end - s).sum();
            if need > 0 {
                self.commit(&r.who.vnode, need)?;
                g.committed += need;
            }
        }
        for (s, v) in parts {
            g.vmas.set(
                s,
                Vma {
                    prot: r.prot,
                    accounted: v.accounted || writable,
                    ..v
                },
            );
        }
        Ok(OK)
    }

    pub(crate) fn discard(&self, r: M2M_DISCARD) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = self.live(&p)?;
        g.pages.revoke();
        let deltas = self.free_pages(&mut g, r.start, r.end);
        self.release_and_forward(&p, g, &r.who, deltas)?;
        Ok(OK)
    }

    pub(crate) fn owner_fork(&self, r: M2M_FORK) -> Result<OK, Refusal> {
        let M2M_FORK {
            parent,
            child,
            start,
            end,
        } = r;
        let p = self.owner_proc(&parent)?;
        let g = self.live(&p)?;
        g.pages.revoke();
        let mut vmas = VmaMap::default();
        let mut need = 0;
        for (s, v) in g.vmas.iter().filter(|(s, v)| *s < end && v.end > start) {
            need += if v.accounted { v.end - s } else { 0 };
            vmas.insert(s, v);
        }
        let pages: Vec<(u64, Vec<u8>)> = g
            .pages
            .keys(start / PAGE..end / PAGE)
            .filter_map(|v| Some((v, g.pages.get(v)?)))
            .collect();
        let parity: BTreeMap<u64, Page> = g
            .parity
            .range(start / PAGE..end / PAGE)
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        let sets: Vec<VregionReplicas> = g
            .sets
            .range(start / self.vrs()..end.div_ceil(self.vrs()))
            .map(|(_, s)| s.clone())
            .collect();
        let logs: Vec<(u64, Logged)> = g
            .logs
            .range(start / self.vrs()..end.div_ceil(self.vrs()))
            .map(|(i, l)| (*i, l.clone()))
            .collect();
        let mut owned = self.owned.lock().unwrap();
        let cp = owned
            .entry(child)
            .or_insert_with(|| {
                Arc::new(Mutex::new(OwnerProc::new(
                    child,
                    &parent.vnode,
                    g.creator,
                    g.epoch,
                    self.vrs(),
                )))
            })
            .clone();
        let mut c = self.live(&cp)?;
        // The child's vRegions arrive one message each; a child id that names another
        // process (of another vNode or pComponent) is not merged into.
        if c.vnode != parent.vnode || c.creator != g.creator {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(OwnerError::PidInUse { pid: child }.into());
        }
        if let Err(e) = self.commit(&parent.vnode, need) {
            if !c.holds() {
                owned.remove(&child);
            }
            return Err(e.into());
        }
        self.room
            .add_pages(&parent.vnode, (pages.len() + parity.len()) as u64 * PAGE);
        if let (None, Some(q)) = (c.quota, g.quota) {
            c.quota = Some(q);
            self.room.hold(&c.vnode, q);
        }
        for (s, v) in vmas.iter() {
            c.vmas.insert(s, v);
        }
        for (vpn, data) in &pages {
            c.pages.insert(*vpn, data)?;
        }
        c.parity.extend(parity);
        c.sets.extend(sets.into_iter().map(|s| (s.index, s)));
        for (idx, l) in logs {
            // In the log's order: the child's backup is the parent's as of the fork.
            self.backup_log
                .push(&l.scomp, c.file(idx), l.epoch, Op::CopyFrom(g.file(idx)), None);
            c.logs.insert(idx, Logged { asked: None, ..l });
        }
        c.committed += need;
        Ok(OK)
    }

    pub(crate) fn owner_exit(&self, r: M2M_EXIT) -> Result<OK, Refusal> {
        let p = self.owned.lock().unwrap().remove(&r.who.pid);
        if let Some(p) = p {
            let mut g = p.lock().unwrap();
            // After what is still queued for them; on each sComponent once (the file index is
            // not used).
            let mut scomps: Vec<u32> = Vec::new();
            for l in g.logs.values() {
                if !scomps.contains(&l.scomp.id) {
                    scomps.push(l.scomp.id);
                    self.backup_log
                        .push(&l.scomp, g.file(0), l.epoch, Op::DropProcess, None);
                }
            }
            self.let_go(&mut g);
        }
        Ok(OK)
    }
}
