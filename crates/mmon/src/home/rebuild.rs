//! Rebuilds: a member lost or full leaves its sets ([`Mem::drop_replicas`]) and its copies
//! are made again elsewhere, from a survivor (a replica set), from the parity and the rest of
//! each row (a striped set), or from the backup file (a logged set's primary, replayed by its
//! logger). A corrupted page is rebuilt the same ways ([`Mem::reconstruct`]).
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use super::{lock_home, HomeProc, Replicas, MOVE_BATCH};
use crate::{Mem, Peers, PAGE};
use splitos_core::vma::Vma;

/// Why a rebuild, a move of a full member's vRegion or a corrupted page's reconstruction
/// failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RebuildError {
    #[error("no other mComponent has room for vRegion {idx} of process {pid} held on mComponent {full}")]
    NoRoomToMove { idx: u64, pid: u64, full: u32 },
    #[error("no other mComponent has room for a replica")]
    NoRoomForReplica,
    #[error("heap page {addr:#x} is in no striped or logged set")]
    NotRedundant { addr: u64 },
    #[error("heap page {addr:#x} cannot be rebuilt: the result fails its checksum too (the parity, another page of its row, or the backup is corrupted)")]
    Corrupted { addr: u64 },
    #[error(
        "vRegion {idx} of process {pid} lost {lost} of its {places} places at once: one parity cannot rebuild them"
    )]
    TooManyLost {
        idx: u64,
        pid: u64,
        lost: usize,
        places: usize,
    },
    #[error("no mComponent has room to rebuild vRegion {idx} of process {pid}")]
    NoRoomToRebuild { idx: u64, pid: u64 },
}

impl Refuse for RebuildError {
    fn code(&self) -> ErrCode {
        match self {
            RebuildError::NoRoomToMove { .. }
            | RebuildError::NoRoomForReplica
            | RebuildError::NoRoomToRebuild { .. } => ErrCode::NoMemory,
            RebuildError::NotRedundant { .. } => ErrCode::Invalid,
            RebuildError::Corrupted { .. } => ErrCode::Internal,
            RebuildError::TooManyLost { .. } => ErrCode::Unreachable,
        }
    }
}

impl<P: Peers> Mem<P> {
    /// Takes `lost` out of every replica set of the process where another member remains (a
    /// set whose only member is lost keeps it: its pages are there if it comes back, and
    /// until then the program is told which mComponent it waits for), queues the sets that
    /// lost a member for rebuilding, and tells the backup home. A lost primary's logger is
    /// made primary at once; a striped set's lost place is rebuilt at once only in vRegion
    /// `urgent` (the one a caller waits for: its pages cannot be read or written until
    /// then), the others in the background.
    pub(super) fn drop_replicas(&self, h: &mut HomeProc, lost: &[u32], urgent: Option<u64>) {
        self.note_lost(lost);
        let mut changed = false;
        let mut retired = Vec::new();
        let mut striped = Vec::new();
        let mut promote = Vec::new();
        for (idx, set) in h.vregions.iter_mut() {
            if set.log.is_some()
                && set.owners.len() == 2
                && lost.contains(&set.owners[0].id)
                && !lost.contains(&set.owners[1].id)
            {
                // The logger replays the backup and becomes primary below.
                retired.push(set.owners[0].clone());
                promote.push(*idx);
                changed = true;
            } else if set.data > 0 {
                // A striped set keeps its places: the lost member's is rebuilt below.
                if let Some(o) = set.owners.iter().find(|o| lost.contains(&o.id)) {
                    retired.push(o.clone());
                    striped.push(*idx);
                    changed = true;
                }
            } else if set.owners.iter().any(|o| !lost.contains(&o.id)) {
                let (gone, kept): (Vec<ComponentRef>, Vec<ComponentRef>) =
                    set.owners.drain(..).partition(|o| lost.contains(&o.id));
                set.owners = kept;
                changed |= !gone.is_empty();
                retired.extend(gone);
            } else if !set.owners.is_empty() {
                crate::series::VREGIONS_UNREACHABLE.increment(1);
                tracing::error!(pid = h.who.pid, lost = ?lost, "every copy of a vRegion is on lost mComponents");
            }
        }
        for o in retired {
            if !h.retired.iter().any(|r| r.id == o.id) {
                h.retired.push(o);
            }
        }
        if h.backup.as_ref().is_some_and(|b| lost.contains(&b.id)) {
            h.backup = None;
            changed = true;
        }
        if changed {
            h.epoch += 1;
            let epoch = h.epoch;
            for set in h
                .vregions
                .values_mut()
                .filter(|s| s.data == 0 && s.owners.len() < self.replication().members())
            {
                set.epoch = epoch;
            }
            for idx in striped.into_iter().filter(|i| Some(*i) == urgent) {
                if let Err(e) = self.rebuild_place(h, idx) {
                    tracing::error!(pid = h.who.pid, vregion = idx, error = %e, "cannot rebuild a lost member of a striped set; will try again");
                }
            }
            for idx in promote {
                if let Err(e) = self.promote_logger(h, idx) {
                    crate::series::VREGIONS_UNREACHABLE.increment(1);
                    tracing::error!(pid = h.who.pid, vregion = idx, error = %e, "the primary of a logged vRegion is lost and its logger cannot take its place: the program waits for the lost primary");
                }
            }
            self.sync_backup(h);
            if h.short_of(self.replication().members()) > 0 {
                self.queue(crate::Job::Rebuild(h.who.pid));
            }
        }
    }

    /// Brings every replica set of process `pid` back to the cluster's number of copies, one
    /// vRegion at a time, holding the process's home lock for each (not between them): the
    /// process's calls and write-backs to that vRegion wait meanwhile (its owners refuse
    /// older epochs).
    pub(crate) fn rebuild(&self, pid: u64) {
        let Some(hp) = self.homes.lock().unwrap().get(&pid).cloned() else {
            return;
        };
        let members = self.replication().members();
        let mut tried = std::collections::BTreeSet::new();
        loop {
            let mut h = hp.lock().unwrap();
            if h.gone() {
                return;
            }
            let Some(idx) = h
                .vregions
                .iter()
                .find(|(i, s)| h.short(s, members) && !tried.contains(*i))
                .map(|(i, _)| *i)
            else {
                return;
            };
            tried.insert(idx);
            let striped = h.vregions[&idx].data > 0;
            let done = if striped {
                self.rebuild_place(&mut h, idx)
            } else {
                self.rebuild_vregion(&mut h, idx)
            };
            if let Err(e) = done {
                tracing::warn!(pid, vregion = idx, error = %e, "cannot rebuild a replica; will try again");
            }
            self.sync_backup(&mut h);
        }
    }

    fn rebuild_vregion(&self, h: &mut HomeProc, idx: u64) -> Result<(), Refusal> {
        let started = std::time::Instant::now();
        let source = h.vregions.get(&idx).expect("listed by the caller").owners[0].clone();
        let Some((new, pages_copied)) = self.copy_to_new_member(h, idx, &source, &[], true)? else {
            return Err(RebuildError::NoRoomForReplica.into());
        };
        let s = h.vregions.get_mut(&idx).expect("listed by the caller");
        s.owners.push(new.clone());
        s.epoch = h.epoch;
        h.retired.retain(|r| r.id != new.id);
        crate::series::REBUILT_VREGIONS.increment(1);
        tracing::info!(
            pid = h.who.pid,
            vregion = idx,
            to = new.id,
            pages = pages_copied,
            ms = started.elapsed().as_millis() as u64,
            "replica rebuilt"
        );
        Ok(())
    }

    /// Moves the members of set `set` but `skip` to the process's epoch in `who`; in a striped
    /// set the data members first and the parity member last: each answers once no change of its own
    /// is on its way to the parity, and a write-back that a data member took before it was
    /// told reaches a parity member that still takes it. From then on the set's pages and
    /// parity agree until the home lets go of the process.
    pub(super) fn fence_set(&self, set: &VregionReplicas, who: &Who, skip: Option<u32>) -> Result<(), Refusal> {
        let parity = set.parity().map(|p| p.id);
        let mut members: Vec<&ComponentRef> = set.distinct().into_iter().filter(|o| Some(o.id) != skip).collect();
        members.sort_by_key(|o| Some(o.id) == parity);
        for o in members {
            self.to_owner(o, M2M_EPOCH { who: who.clone() })?;
        }
        Ok(())
    }

    /// `P2M_RECONSTRUCT`: page `vpn` of a striped set, whose holder sent a copy failing its
    /// checksum, as the parity and the rest of its row say it is, written over the bad copy.
    /// The set is fenced first: a checksum cannot tell a page rebuilt from a row that was
    /// changing (XOR of valid pages passes it), so the row must not change meanwhile. In a
    /// logged set the page is what the logger's backup says.
    pub(crate) fn reconstruct(&self, r: P2M_RECONSTRUCT) -> Result<M2P_PAGE, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = lock_home(&hp)?;
        let idx = r.vpn * PAGE / self.vrs();
        let set = h
            .vregions
            .get(&idx)
            .map(|s| s.wire(idx))
            .filter(|s| s.data > 0 || s.logger().is_some())
            .ok_or(RebuildError::NotRedundant { addr: r.vpn * PAGE })?;
        h.epoch += 1;
        let who = h.who();
        let out = self.fence_set(&set, &who, None).and_then(|()| match set.logger() {
            Some(logger) => Ok(self
                .read_all(logger, &who, r.vpn, r.vpn + 1, false)?
                .pop()
                .map_or_else(sealed_zero_page, |(_, d)| d)),
            None => self.rebuild_page(&set, &who, r.vpn),
        });
        self.sync_backup(&mut h);
        let page = out?;
        if unseal_page(page.clone()).is_err() {
            return Err(RebuildError::Corrupted { addr: r.vpn * PAGE }.into());
        }
        let holder = set.holder(r.vpn);
        self.to_owner(
            holder,
            M2M_PUT_PAGES {
                who: who.clone(),
                pages: vec![(r.vpn, page.clone())],
                put: Put::Copy,
            },
        )?;
        self.c.reconstructed_pages.fetch_add(1, Relaxed);
        tracing::warn!(
            pid = r.who.pid,
            vpn = r.vpn,
            holder = holder.id,
            "rebuilt a corrupted page from redundancy and wrote it over its holder's copy"
        );
        Ok(M2P_PAGE { data: page })
    }

    /// Page `vpn` of a fenced striped set as the parity and the other pages of its row say.
    fn rebuild_page(&self, set: &VregionReplicas, who: &Who, vpn: u64) -> Result<ByteBuf, Refusal> {
        let row = set.row(vpn);
        let mut out = vec![0u8; SEALED_PAGE];
        let parity = set.parity().expect("a striped set");
        let from_parity = self.read_all(parity, who, row, row + 1, true)?;
        let others: Vec<u64> = set.row_pages(row).filter(|v| *v != vpn).collect();
        let mut pages = from_parity;
        for v in others {
            pages.extend(self.read_all(set.holder(v), who, v, v + 1, false)?);
        }
        for (_, d) in pages {
            out.iter_mut().zip(&d[..]).for_each(|(x, y)| *x ^= y);
        }
        Ok(if out.iter().all(|b| *b == 0) {
            sealed_zero_page()
        } else {
            ByteBuf::from(out)
        })
    }

    /// Rebuilds the place of a lost member (one of the process's retired members) of striped
    /// set `idx` on another mComponent, holding the home lock: the survivors move to a new
    /// epoch first and answer once no change of theirs is still on its way to the parity, so
    /// that the pages and the parity read agree. A lost data place gets each of its pages as
    /// the XOR of its row's parity and other pages, a lost parity place the XOR of each row.
    /// Two places lost at once cannot be rebuilt: the set keeps them, and the program is told
    /// which mComponent it waits for when it touches them.
    fn rebuild_place(&self, h: &mut HomeProc, idx: u64) -> Result<(), Refusal> {
        let started = std::time::Instant::now();
        let set = h.vregions.get(&idx).cloned().expect("listed by the caller");
        let k = set.data as usize;
        let retired: Vec<u32> = h.retired.iter().map(|r| r.id).collect();
        let lost: Vec<usize> = (0..=k).filter(|p| retired.contains(&set.owners[*p].id)).collect();
        let place = match lost[..] {
            [] => return Ok(()),
            [place] => place,
            _ => {
                crate::series::VREGIONS_UNREACHABLE.increment(1);
                return Err(RebuildError::TooManyLost {
                    idx,
                    pid: h.who.pid,
                    lost: lost.len(),
                    places: k + 1,
                }
                .into());
            }
        };
        let gone = set.owners[place].clone();
        let wire = set.wire(idx);
        let survivors: Vec<ComponentRef> = wire
            .distinct()
            .into_iter()
            .filter(|o| o.id != gone.id)
            .cloned()
            .collect();
        let share = self.vrs() / k as u64;
        let mut out: Vec<u32> = set.owners.iter().map(|o| o.id).collect();
        out.extend(&retired);
        // Another mComponent if one has room; else a survivor takes a second place.
        let new = match self.pick_other(share, &out, h.pcomp)? {
            Some(n) => n,
            None => self
                .pick_other(share, &retired, h.pcomp)?
                .ok_or(RebuildError::NoRoomToRebuild { idx, pid: h.who.pid })?,
        };
        h.epoch += 1;
        let who = h.who();
        self.fence_set(&wire, &who, Some(gone.id))?;
        let vrs = self.vrs();
        let fresh = !survivors.iter().any(|o| o.id == new.id);
        let rebuilt = self.rebuild_rows(h, &wire, place, &survivors, &new, &who);
        if rebuilt.is_err() && fresh {
            // Whatever reached the new member is released there.
            let _ = self.to_owner(
                &new,
                M2M_VMA_REMOVE {
                    who: who.clone(),
                    start: idx * vrs,
                    end: (idx + 1) * vrs,
                },
            );
        }
        let (pages_rebuilt, bad) = rebuilt?;
        if bad > 0 {
            // A survivor's copy was corrupted: those pages fail their checksum when fetched,
            // and the program stops there rather than read them.
            crate::series::REBUILT_PAGES_CORRUPT.increment(bad);
            tracing::error!(
                pid = h.who.pid,
                vregion = idx,
                pages = bad,
                "rebuilt pages fail their checksum: another page of their row was corrupted"
            );
        }
        let s = h.vregions.get_mut(&idx).expect("listed by the caller");
        s.owners[place] = new.clone();
        s.epoch = h.epoch;
        let set = s.clone();
        self.tell_set(h, idx, &set, LogStep::Keep)?;
        crate::series::REBUILT_PAGES.increment(pages_rebuilt);
        crate::series::REBUILT_VREGIONS.increment(1);
        tracing::info!(
            pid = h.who.pid,
            vregion = idx,
            place,
            lost = gone.id,
            to = new.id,
            pages = pages_rebuilt,
            ms = started.elapsed().as_millis() as u64,
            "striped set rebuilt from parity"
        );
        Ok(())
    }

    /// Writes on `new` (which gets the vmas first unless it is a survivor) every page of
    /// `place` of the fenced striped set `set`, from the survivors' pages and parity; returns
    /// the pages written and how many of them fail their checksum.
    fn rebuild_rows(
        &self,
        h: &HomeProc,
        set: &VregionReplicas,
        place: usize,
        survivors: &[ComponentRef],
        new: &ComponentRef,
        who: &Who,
    ) -> Result<(u64, u64), Refusal> {
        let k = set.data as usize;
        let vrs = self.vrs();
        let (lo, hi) = (set.index * vrs / PAGE, (set.index + 1) * vrs / PAGE);
        if !survivors.iter().any(|o| o.id == new.id) {
            self.give_vmas(h, new, who, lo * PAGE, hi * PAGE)?;
        }
        let data: Vec<ComponentRef> = survivors
            .iter()
            .filter(|o| set.owners[..k].iter().any(|d| d.id == o.id))
            .cloned()
            .collect();
        // Whole rows at a time: a window is a multiple of k stripe units.
        let window = 8 * k as u64 * STRIPE_PAGES;
        let (mut pages_rebuilt, mut bad) = (0u64, 0u64);
        let mut at = lo;
        while at < hi {
            let end = (at + window).min(hi);
            let mut rows: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
            let mut add = |row: u64, d: &[u8]| {
                let row = rows.entry(row).or_insert_with(|| vec![0u8; SEALED_PAGE]);
                row.iter_mut().zip(d).for_each(|(x, y)| *x ^= y);
            };
            for o in &data {
                for (vpn, d) in self.read_all(o, who, at, end, false)? {
                    add(set.row(vpn), &d);
                }
            }
            if place < k {
                for (row, d) in self.read_all(&set.owners[k], who, at, end, true)? {
                    add(row, &d);
                }
            }
            let mut pages = Vec::new();
            for (row, d) in rows.into_iter().filter(|(_, d)| d.iter().any(|b| *b != 0)) {
                let d = ByteBuf::from(d);
                if place < k && unseal_page(d.clone()).is_err() {
                    bad += 1;
                }
                pages.push((
                    if place < k {
                        row + place as u64 * STRIPE_PAGES
                    } else {
                        row
                    },
                    d,
                ));
            }
            pages_rebuilt += pages.len() as u64;
            // Progress as it goes, for `cluster status`.
            self.rebuilt_pages.fetch_add(pages.len() as u64, Relaxed);
            if !pages.is_empty() {
                self.to_owner(
                    new,
                    M2M_PUT_PAGES {
                        who: who.clone(),
                        pages,
                        put: if place < k { Put::Copy } else { Put::Parity },
                    },
                )?;
            }
            at = end;
        }
        Ok((pages_rebuilt, bad))
    }

    /// Every page (or parity row) `o` holds of the process in pages [from, end).
    fn read_all(
        &self,
        o: &ComponentRef,
        who: &Who,
        from: u64,
        end: u64,
        parity: bool,
    ) -> Result<Vec<(u64, ByteBuf)>, Refusal> {
        let mut out = Vec::new();
        let mut at = from * PAGE;
        loop {
            let M2M_PAGES { pages, more } = self.to_owner(
                o,
                M2M_READ_PAGES {
                    who: who.clone(),
                    from: at,
                    end: end * PAGE,
                    max: MOVE_BATCH,
                    parity,
                },
            )?;
            if let Some((last, _)) = pages.last() {
                at = (last + 1) * PAGE;
            }
            out.extend(pages);
            if !more {
                return Ok(out);
            }
        }
    }

    /// Picks an mComponent with room outside vRegion `idx`'s set (and `exclude`), moves the
    /// process to a new epoch that the set's members enforce from now on (no write-back of
    /// the old sets can land on them while their pages are copied, and so be missed by the
    /// new member), and copies `source`'s vmas and pages of the vRegion to it. `None`: no
    /// mComponent has room. The caller puts the new member into the set. In a logged set a
    /// new member joining `as_logger` is told so first: the copy starts its backup. A picked
    /// member that turns out full (the managers' view of its room lags its writes) is left out
    /// and the next is tried.
    pub(super) fn copy_to_new_member(
        &self,
        h: &mut HomeProc,
        idx: u64,
        source: &ComponentRef,
        exclude: &[u32],
        as_logger: bool,
    ) -> Result<Option<(ComponentRef, u64)>, Refusal> {
        let set = h.vregions.get(&idx).cloned().expect("checked by the caller");
        let mut out: Vec<u32> = set.owners.iter().map(|o| o.id).collect();
        out.extend_from_slice(exclude);
        loop {
            let Some(new) = self.pick_other(self.vrs(), &out, h.pcomp)? else {
                return Ok(None);
            };
            match self.copy_to(h, idx, &set, source, &new, as_logger) {
                Err(e) if e.code == ErrCode::NoMemory => {
                    tracing::info!(vregion = idx, mcomp = new.id, error = %e, "the mComponent picked for a vRegion is full; trying another");
                    out.push(new.id);
                }
                r => return r.map(|n| Some((new, n))),
            }
        }
    }

    /// As [`Self::copy_to_new_member`], to the member `new`: the number of pages copied.
    fn copy_to(
        &self,
        h: &mut HomeProc,
        idx: u64,
        set: &Replicas,
        source: &ComponentRef,
        new: &ComponentRef,
        as_logger: bool,
    ) -> Result<u64, Refusal> {
        h.epoch += 1;
        let who = h.who();
        self.fence_set(&set.wire(idx), &who, None)?;
        let vrs = self.vrs();
        let (lo, hi) = (idx * vrs, (idx + 1) * vrs);
        // In a logged set the new member learns its place before the copy: a new logger's
        // backup restarts with it, and a new primary that logged this vRegion before (a try
        // that failed on the way) stops logging it.
        let with = match as_logger {
            true => Replicas {
                epoch: h.epoch,
                owners: vec![source.clone(), new.clone()],
                ..set.clone()
            },
            false => Replicas {
                epoch: h.epoch,
                owners: set
                    .owners
                    .iter()
                    .map(|o| if o.id == source.id { new.clone() } else { o.clone() })
                    .collect(),
                ..set.clone()
            },
        };
        let copied = |h: &HomeProc| -> Result<u64, Refusal> {
            if with.log.is_some() {
                self.tell_member(
                    h,
                    new,
                    idx,
                    &with,
                    if as_logger { LogStep::Restart } else { LogStep::Keep },
                )?;
            }
            let n = self.copy_vregion(h, source, new, &who, lo, hi)?;
            if with.log.is_some() && as_logger {
                self.tell_member(h, new, idx, &with, LogStep::Whole)?;
            }
            Ok(n)
        };
        copied(h).inspect_err(|_| {
            // Whatever reached the new member is released there.
            let _ = self.to_owner(
                new,
                M2M_VMA_REMOVE {
                    who: who.clone(),
                    start: lo,
                    end: hi,
                },
            );
        })
    }

    /// Gives `new` the process's vmas of [lo, hi).
    fn give_vmas(&self, h: &HomeProc, new: &ComponentRef, who: &Who, lo: u64, hi: u64) -> Result<(), Refusal> {
        let vmas: Vec<(u64, Vma)> = h.layout.iter().filter(|(s, v)| *s < hi && v.end > lo).collect();
        for (s, v) in vmas {
            self.to_owner(
                new,
                M2M_VMA_ADD {
                    who: who.clone(),
                    start: s.max(lo),
                    end: v.end.min(hi),
                    prot: v.prot,
                    creator: h.creator,
                    quota: h.memory_quota,
                },
            )?;
        }
        Ok(())
    }

    /// Gives `new` the vmas of [lo, hi) and a copy of every page and parity row `source`
    /// holds there; returns the number of pages and rows copied.
    fn copy_vregion(
        &self,
        h: &HomeProc,
        source: &ComponentRef,
        new: &ComponentRef,
        who: &Who,
        lo: u64,
        hi: u64,
    ) -> Result<u64, Refusal> {
        self.give_vmas(h, new, who, lo, hi)?;
        self.copy_pages(source, new, who, lo, hi)
    }

    /// Copies every page and parity row `source` holds in [lo, hi) to `new`.
    pub(super) fn copy_pages(
        &self,
        source: &ComponentRef,
        new: &ComponentRef,
        who: &Who,
        lo: u64,
        hi: u64,
    ) -> Result<u64, Refusal> {
        let mut pages_copied = 0u64;
        for parity in [false, true] {
            let mut from = lo;
            loop {
                let M2M_PAGES { pages, more } = self.to_owner(
                    source,
                    M2M_READ_PAGES {
                        who: who.clone(),
                        from,
                        end: hi,
                        max: MOVE_BATCH,
                        parity,
                    },
                )?;
                if let Some((last, _)) = pages.last() {
                    from = (last + 1) * PAGE;
                }
                pages_copied += pages.len() as u64;
                self.rebuilt_pages.fetch_add(pages.len() as u64, Relaxed);
                crate::series::REBUILT_PAGES.increment(pages.len() as u64);
                if !pages.is_empty() {
                    self.to_owner(
                        new,
                        M2M_PUT_PAGES {
                            who: who.clone(),
                            pages,
                            put: if parity { Put::Parity } else { Put::Copy },
                        },
                    )?;
                }
                if !more {
                    break;
                }
            }
        }
        Ok(pages_copied)
    }
}
