//! What the home asks of an owner for the sets it is member of: the set itself (`M2M_SET`; a
//! logger's log, a logger made primary), a new epoch, pages read and put for a rebuild, and a
//! striped set's parity.
use super::*;

/// Why an owner refuses what the home asks of it for a set: the set itself, pages read for a
/// rebuild, a logger made primary, a parity change.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetError {
    #[error("the backup of vRegion {idx} is not whole (its log skipped {skipped} records, or the copy that starts it is not complete)")]
    BackupNotWhole { idx: u64, skipped: u64 },
    #[error("{from:#x}..{end:#x} spans vRegions this mComponent keeps backup logs of")]
    SpansLogs { from: u64, end: u64 },
    #[error("a striped set of {data} data members has {members} members")]
    StripedMembers { data: u32, members: usize },
    #[error("a logged set has a primary and a logger, not {members} members")]
    LoggedMembers { members: usize },
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A logger made primary whose backup missed records: the vRegion is lost.
    #[error("the backup of vRegion {idx} of process {pid} is not whole (its log skipped {skipped} records while full, or its first copy did not complete): the vRegion's pages were on its lost primary alone")]
    LostWithPrimary { idx: u64, pid: u64, skipped: u64 },
    #[error("mComponent {mcomp} has no room for the {pages} pages of vRegion {idx} it kept the backup of")]
    NoRoomForBackup { mcomp: u32, pages: u64, idx: u64 },
    #[error("page {addr:#x} is in no striped set here")]
    NotStriped { addr: u64 },
}

impl Refuse for SetError {
    fn code(&self) -> ErrCode {
        match self {
            SetError::BackupNotWhole { .. } | SetError::LostWithPrimary { .. } => ErrCode::Unreachable,
            SetError::SpansLogs { .. }
            | SetError::StripedMembers { .. }
            | SetError::LoggedMembers { .. }
            | SetError::NotStriped { .. } => ErrCode::Invalid,
            SetError::Policy(e) => e.code(),
            SetError::NoRoomForBackup { .. } => ErrCode::NoMemory,
        }
    }
}

impl<P: Peers> Mem<P> {
    /// Refuses older write-backs from now on, and answers once none of them is still
    /// forwarding its changes to a parity member.
    pub(crate) fn set_epoch(&self, r: M2M_EPOCH) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        loop {
            let mut g = self.live(&p)?;
            g.pages.revoke();
            g.epoch = g.epoch.max(r.who.epoch);
            if g.forwarding == 0 {
                return Ok(OK);
            }
            drop(g);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    pub(crate) fn read_pages(&self, r: M2M_READ_PAGES) -> Result<M2M_PAGES, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let g = self.live(&p)?;
        // What is read must not change under the reader (a rebuild, mremap copying it).
        g.pages.revoke();
        let max = r.max as usize;
        let vrs = self.vrs();
        if max > 0 && !r.parity && r.end > r.from {
            if let Some(idx) = g.logged(r.from / PAGE, vrs).filter(|i| (r.end - 1) / vrs == *i) {
                // A logger answers from its backup (a page rebuilt after a bad copy).
                let l = g.logs[&idx].clone();
                if !l.protects() {
                    return Err(SetError::BackupNotWhole {
                        idx,
                        skipped: l.skipped,
                    }
                    .into());
                }
                let file = g.file(idx);
                drop(g);
                let pages = self.read_backup(&l.scomp, &file)?;
                let mut it = pages.range(r.from / PAGE..r.end / PAGE);
                let out = it.by_ref().take(max).map(|(v, d)| (*v, d.clone())).collect();
                return Ok(M2M_PAGES {
                    pages: out,
                    more: it.next().is_some(),
                });
            }
            if g.logs.range(r.from / vrs..=(r.end - 1) / vrs).next().is_some() {
                return Err(SetError::SpansLogs {
                    from: r.from,
                    end: r.end,
                }
                .into());
            }
        }
        let range = r.from / PAGE..r.end / PAGE;
        let (pages, more) = if r.parity {
            let mut it = g.parity.range(range);
            (
                it.by_ref()
                    .take(max)
                    .map(|(v, pg)| (*v, ByteBuf::from(pg.to_vec())))
                    .collect(),
                it.next().is_some(),
            )
        } else {
            let mut it = g.pages.keys(range);
            (
                it.by_ref()
                    .take(max)
                    .filter_map(|v| Some((v, ByteBuf::from(g.pages.get(v)?))))
                    .collect(),
                it.next().is_some(),
            )
        };
        Ok(M2M_PAGES { pages, more })
    }

    pub(crate) fn put_pages(&self, r: M2M_PUT_PAGES) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = self.live(&p)?;
        g.pages.revoke();
        let mut deltas = Deltas::new();
        let stored = r.pages.iter().try_for_each(|(vpn, data)| match r.put {
            Put::Write => self.store_or_wait(&mut g, *vpn, data, &mut deltas, Some(COPY_WAIT)),
            Put::Copy => self.store_or_wait(&mut g, *vpn, data, &mut Deltas::new(), Some(COPY_WAIT)),
            Put::Parity => {
                sealed_size(data)?;
                let mut row: Page = Box::new([0u8; SEALED_PAGE]);
                row.copy_from_slice(data);
                if g.parity.insert(*vpn, row).is_none() {
                    self.room.add_pages(&r.who.vnode, PAGE);
                }
                Ok(())
            }
        });
        // What was stored before a refusal has changed: its parity must follow.
        self.release_and_forward(&p, g, &r.who, deltas)?;
        stored.map(|()| OK)
    }

    /// `M2M_SET`: a striped or logged set of the process, from its home (made, or changed by
    /// a rebuild).
    pub(crate) fn member_set(&self, r: M2M_SET) -> Result<OK, Refusal> {
        let M2M_SET {
            who,
            set,
            creator,
            home,
            log,
        } = r;
        if set.data > 0 && set.owners.len() != set.data as usize + 1 {
            return Err(SetError::StripedMembers {
                data: set.data,
                members: set.owners.len(),
            }
            .into());
        }
        if set.log.is_some() && (set.data > 0 || set.owners.is_empty() || set.owners.len() > 2) {
            return Err(SetError::LoggedMembers {
                members: set.owners.len(),
            }
            .into());
        }
        if set.log.is_some() {
            return self.set_logged(who, set, creator, home, log);
        }
        if set.data > 0 {
            Replication::Ec { data: set.data }
                .check_vregion_size(self.vrs())
                .map_err(SetError::from)?;
        }
        let p = self.owner_from_home(&who, creator, None)?;
        let mut g = self.live(&p)?;
        g.pages.revoke();
        if set.owners.iter().any(|o| o.id == self.peers.id()) {
            g.sets.insert(set.index, set);
        } else {
            // It left the set (its vRegion moved): what it frees from now on is no change
            // the parity must see, and its parity rows there are another member's now.
            let vrs = self.vrs();
            g.sets.remove(&set.index);
            let rows: Vec<u64> = g
                .parity
                .range(set.index * vrs / PAGE..(set.index + 1) * vrs / PAGE)
                .map(|(r, _)| *r)
                .collect();
            for r in &rows {
                g.parity.remove(r);
            }
            self.room.free_pages(&g.vnode, rows.len() as u64 * PAGE);
        }
        Ok(OK)
    }

    /// A logged set: this mComponent becomes its logger, stays it (its backup restarted or
    /// made whole as `step` says), is made its primary (replaying its backup into pages
    /// first when `step` is `Replay`; otherwise a copy follows), or leaves it.
    pub(super) fn set_logged(
        &self,
        who: Who,
        set: VregionReplicas,
        creator: Option<[u8; 32]>,
        home: ComponentRef,
        step: LogStep,
    ) -> Result<OK, Refusal> {
        let p = self.owner_from_home(&who, creator, None)?;
        let mut g = self.live(&p)?;
        g.pages.revoke();
        let me = self.peers.id();
        let idx = set.index;
        let scomp = set.log.clone().expect("checked by the caller");
        if set.logger().is_some_and(|l| l.id == me) && set.owners[0].id != me {
            let file = g.file(idx);
            // Named logger without a restart: it has no backup of what came before, and asks
            // for a copy.
            let l = g.logs.entry(idx).or_insert_with(|| Logged {
                scomp: scomp.clone(),
                home: home.clone(),
                epoch: set.epoch,
                skipped: 0,
                whole: false,
                asked: None,
                copies_failed: 0,
            });
            l.scomp = scomp;
            l.home = home;
            // An older set (a home that took over from an older state) does not take its
            // records back to an epoch the backup has moved past.
            l.epoch = l.epoch.max(set.epoch);
            match step {
                LogStep::Restart => {
                    // A reset takes no room: it is never skipped.
                    self.backup_log.push(&l.scomp, file, l.epoch, Op::Reset, None);
                    l.skipped = 0;
                    l.whole = false;
                    l.asked = Some(std::time::Instant::now());
                }
                LogStep::Whole => {
                    l.whole = true;
                    l.copies_failed = 0;
                }
                LogStep::Keep | LogStep::Replay => {}
            }
        } else if set.owners[0].id == me && step == LogStep::Replay && g.logs.contains_key(&idx) {
            let n = self.promote(&mut g, idx)?;
            tracing::warn!(
                pid = who.pid,
                vregion = idx,
                pages = n,
                "primary of a vRegion lost: replayed its backup file and log, and serve it now"
            );
        } else {
            g.logs.remove(&idx);
        }
        if set.owners.iter().any(|o| o.id == me) {
            g.sets.insert(idx, set);
        } else {
            g.sets.remove(&idx);
        }
        Ok(OK)
    }

    /// Makes the logger of vRegion `idx` its primary: the pages are what the backup file,
    /// once the vRegion's whole log reached it, says. A backup that is not whole has no such
    /// answer.
    pub(super) fn promote(&self, g: &mut OwnerProc, idx: u64) -> Result<u64, Refusal> {
        let l = g.logs.get(&idx).cloned().expect("checked by the caller");
        if !l.protects() {
            crate::series::LOG_PROMOTIONS_REFUSED.increment(1);
            return Err(SetError::LostWithPrimary {
                idx,
                pid: g.pid,
                skipped: l.skipped,
            }
            .into());
        }
        let vrs = self.vrs();
        let pages: Vec<(u64, ByteBuf)> = self
            .read_backup(&l.scomp, &g.file(idx))?
            .into_iter()
            .filter(|(v, _)| *v * PAGE / vrs == idx)
            .collect();
        pages.iter().try_for_each(|(_, d)| sealed_size(d))?;
        let n = pages.len() as u64;
        // Heuristic overcommit charges the pages at once (a logger holds none of the vRegion).
        let charged = !self.charges_mappings();
        if charged && !self.room.take_pages(&g.vnode, n * PAGE) {
            self.c.out_of_memory.fetch_add(1, Relaxed);
            return Err(SetError::NoRoomForBackup {
                mcomp: self.peers.id(),
                pages: n,
                idx,
            }
            .into());
        }
        g.logs.remove(&idx);
        let mut held = 0;
        for (vpn, data) in pages {
            if g.pages.insert(vpn, &data)? {
                held += PAGE;
            }
        }
        match charged {
            true => self.room.free_pages(&g.vnode, n * PAGE - held),
            false => self.room.add_pages(&g.vnode, held),
        }
        self.c.log_promoted_pages.fetch_add(n, Relaxed);
        Ok(n)
    }

    /// Page changes from the owners of a striped set this mComponent is parity member of.
    pub(crate) fn parity(&self, r: M2M_PARITY) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = self.live(&p)?;
        // A change from a member the home has not told of the new sets (it was cut off from
        // the home, and its place rebuilt elsewhere) must not reach the parity: the sender
        // undoes its store and the pComponent writes again on the new sets.
        g.current(&r.who)?;
        let vrs = self.vrs();
        for (vpn, d) in &r.deltas {
            sealed_size(d)?;
            let row = g
                .striped(*vpn, vrs)
                .map(|s| s.row(*vpn))
                .ok_or(SetError::NotStriped { addr: vpn * PAGE })?;
            let zero = {
                let parity = g.parity.entry(row).or_insert_with(|| {
                    self.room.add_pages(&r.who.vnode, PAGE);
                    Box::new([0u8; SEALED_PAGE])
                });
                xor_into(&mut parity[..], d);
                parity.iter().all(|b| *b == 0)
            };
            if zero {
                g.parity.remove(&row);
                self.room.free_pages(&r.who.vnode, PAGE);
            }
        }
        self.c.parity_deltas_applied.fetch_add(r.deltas.len() as u64, Relaxed);
        Ok(OK)
    }
}
