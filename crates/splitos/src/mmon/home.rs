//! The home side of an mComponent: for every process it is home of, the vRegion array
//! (which mComponent owns each vRegion) and the address-space layout. Every virtual-memory
//! call of a process lands here (`P2M_MMAP`, `P2M_MUNMAP`, ...) and fans out to the owners of
//! the vRegions it touches (`M2M_*`), in-process when the owner is this mComponent.
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use super::vma::{Vma, VmaMap};
use super::{Mem, PAGE};

/// Pages per message when a mapping moves between owners (mremap).
const MOVE_BATCH: u32 = 128;

/// Home state of one process.
pub(super) struct HomeProc {
    vnode: String,
    /// The pComponent that created the process ([`super::may_act`]), and the component id
    /// of that start of it ([`Mem::reclaim_lost`]).
    creator: Option<[u8; 32]>,
    pcomp: u32,
    base: u64,
    limit: u64,
    layout: VmaMap,
    vregions: BTreeMap<u64, ComponentRef>,
}

impl HomeProc {
    fn owners(&self) -> Vec<VregionOwner> {
        self.vregions.iter().map(|(i, o)| VregionOwner { index: *i, owner: o.clone() }).collect()
    }

    /// The end of [addr, addr + len), which must be page-aligned and inside the heap region.
    fn check_range(&self, addr: u64, len: u64) -> Result<u64, Refusal> {
        let end = addr.checked_add(len).ok_or_else(|| ERR::new(ErrCode::Invalid, "range overflows"))?;
        if !addr.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) || len == 0 || addr < self.base || end > self.limit {
            return Err(ERR::new(ErrCode::Invalid, format!("range {addr:#x}+{len:#x} is not page-aligned inside the heap region")));
        }
        Ok(end)
    }

    fn mapped(&self, addr: u64, prot: u32) -> M2P_MAPPED {
        M2P_MAPPED { addr, prot, owners: self.owners() }
    }
}

/// Refusals an owner may give for a process it never saw: nothing of it to remove there.
fn ignore_unknown(r: Result<OK, Refusal>) -> Result<(), Refusal> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.code == ErrCode::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

impl Mem {
    fn home_proc(&self, who: &Who) -> Result<Arc<Mutex<HomeProc>>, Refusal> {
        let h = self.homes.lock().unwrap().get(&who.pid).cloned();
        let h = h.ok_or_else(|| ERR::new(ErrCode::NotFound, format!("mComponent {} is not home of process {}", self.node.id(), who.pid)))?;
        let (vnode, creator) = {
            let g = h.lock().unwrap();
            (g.vnode.clone(), g.creator)
        };
        if vnode != who.vnode {
            self.c.denied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(ERR::new(ErrCode::Denied, format!("process {} belongs to another vNode", who.pid)));
        }
        self.may_act(who.pid, creator)?;
        Ok(h)
    }

    /// [start, end) cut at vRegion boundaries: (vRegion index, start, end) each.
    fn slices(&self, start: u64, end: u64) -> Vec<(u64, u64, u64)> {
        let vrs = self.vrs();
        let mut out = Vec::new();
        let mut at = start;
        while at < end {
            let idx = at / vrs;
            let stop = ((idx + 1) * vrs).min(end);
            out.push((idx, at, stop));
            at = stop;
        }
        out
    }

    /// The owner of vRegion `idx`, asking GMM for one when it becomes active.
    fn ensure_owner(&self, h: &mut HomeProc, idx: u64) -> Result<ComponentRef, Refusal> {
        if let Some(o) = h.vregions.get(&idx) {
            return Ok(o.clone());
        }
        let owner = match self.node.call_gm(M2G_PICK_OWNER { bytes: self.vrs() }) {
            Ok(r) => r.mcomp,
            // With every mComponent short of a whole free vRegion, the home owns it and the
            // accounting of each mapping decides what fits.
            Err(RpcError::Remote { code: ErrCode::NoMemory, .. }) => self.me(),
            Err(e) => return Err(e.into()),
        };
        tracing::debug!(vregion = idx, owner = owner.id, "vRegion activated");
        h.vregions.insert(idx, owner.clone());
        Ok(owner)
    }

    fn add_range(&self, h: &mut HomeProc, who: &Who, start: u64, end: u64, prot: u32) -> Result<(), Refusal> {
        let mut done: Vec<(ComponentRef, u64, u64)> = Vec::new();
        for (idx, s, e) in self.slices(start, end) {
            let r = self.ensure_owner(h, idx).and_then(|o| self.to_owner(&o, M2M_VMA_ADD { who: who.clone(), start: s, end: e, prot, creator: h.creator }).map(|_| o));
            match r {
                Ok(o) => done.push((o, s, e)),
                Err(err) => {
                    for (o, s, e) in done {
                        let _ = self.to_owner(&o, M2M_VMA_REMOVE { who: who.clone(), start: s, end: e });
                    }
                    return Err(err);
                }
            }
        }
        h.layout.insert(start, Vma { end, prot, accounted: false });
        Ok(())
    }

    fn remove_range(&self, h: &mut HomeProc, who: &Who, start: u64, end: u64) -> Result<(), Refusal> {
        for (idx, s, e) in self.slices(start, end) {
            if let Some(o) = h.vregions.get(&idx).cloned() {
                ignore_unknown(self.to_owner(&o, M2M_VMA_REMOVE { who: who.clone(), start: s, end: e }))?;
            }
        }
        h.layout.remove_range(start, end);
        Ok(())
    }

    /// Refuses a process id already in use here: a pComponent may not take over another's
    /// process by creating (or forking into) its id.
    fn fresh_pid(&self, pid: u64) -> Result<(), Refusal> {
        if self.homes.lock().unwrap().contains_key(&pid) {
            self.c.denied.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Err(ERR::new(ErrCode::Denied, format!("process id {pid} is in use")));
        }
        Ok(())
    }

    pub(super) fn proc_create(&self, r: P2M_PROC_CREATE) -> Result<OK, Refusal> {
        self.fresh_pid(r.who.pid)?;
        let h = HomeProc { vnode: r.who.vnode.clone(), creator: splitos_rpc::current_peer().map(|p| p.key), pcomp: r.pcomp, base: r.region_base, limit: r.region_base.saturating_add(r.region_size), layout: VmaMap::default(), vregions: BTreeMap::new() };
        self.homes.lock().unwrap().insert(r.who.pid, Arc::new(Mutex::new(h)));
        tracing::debug!(pid = r.who.pid, vnode = %r.who.vnode, "home of a new process");
        Ok(OK)
    }

    pub(super) fn mmap(&self, r: P2M_MMAP) -> Result<M2P_MAPPED, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = hp.lock().unwrap();
        let start = if r.fixed {
            let end = h.check_range(r.hint, r.len)?;
            self.remove_range(&mut h, &r.who, r.hint, end)?;
            r.hint
        } else {
            h.layout.find_gap(h.base, h.limit, r.len, r.hint).ok_or_else(|| ERR::new(ErrCode::NoMemory, "the heap region has no free range that large"))?
        };
        self.add_range(&mut h, &r.who, start, start + r.len, r.prot)?;
        Ok(h.mapped(start, r.prot))
    }

    pub(super) fn munmap(&self, r: P2M_MUNMAP) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = hp.lock().unwrap();
        let end = h.check_range(r.addr, r.len)?;
        self.remove_range(&mut h, &r.who, r.addr, end)?;
        Ok(OK)
    }

    pub(super) fn mprotect(&self, r: P2M_MPROTECT) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = hp.lock().unwrap();
        let end = h.check_range(r.addr, r.len)?;
        if !h.layout.covers(r.addr, end) {
            return Err(ERR::new(ErrCode::NoMemory, "mprotect of an unmapped range"));
        }
        for (idx, s, e) in self.slices(r.addr, end) {
            let o = self.ensure_owner(&mut h, idx)?;
            self.to_owner(&o, M2M_VMA_PROTECT { who: r.who.clone(), start: s, end: e, prot: r.prot })?;
        }
        for (s, v) in h.layout.carve(r.addr, end) {
            h.layout.set(s, Vma { prot: r.prot, ..v });
        }
        Ok(OK)
    }

    pub(super) fn dontneed(&self, r: P2M_DONTNEED) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let h = hp.lock().unwrap();
        let end = h.check_range(r.addr, r.len)?;
        for (idx, s, e) in self.slices(r.addr, end) {
            if let Some(o) = h.vregions.get(&idx) {
                ignore_unknown(self.to_owner(o, M2M_DISCARD { who: r.who.clone(), start: s, end: e }))?;
            }
        }
        Ok(OK)
    }

    pub(super) fn mremap(&self, r: P2M_MREMAP) -> Result<M2P_MAPPED, Refusal> {
        let P2M_MREMAP { who, old, old_len, new_len, may_move, fixed_to } = r;
        let hp = self.home_proc(&who)?;
        let mut h = hp.lock().unwrap();
        let old_end = h.check_range(old, old_len)?;
        let Some((_, vma)) = h.layout.find(old).filter(|_| h.layout.covers(old, old_end)) else {
            return Err(ERR::new(ErrCode::Invalid, "mremap of an unmapped range"));
        };
        let prot = vma.prot;
        if fixed_to.is_none() && new_len <= old_len {
            if new_len < old_len {
                self.remove_range(&mut h, &who, old + new_len, old_end)?;
            }
            return Ok(h.mapped(old, prot));
        }
        if fixed_to.is_none() && old.checked_add(new_len).is_some_and(|e| e <= h.limit) && h.layout.is_free(old_end, old + new_len) {
            self.add_range(&mut h, &who, old_end, old + new_len, prot)?;
            h.layout.remove_range(old, old + new_len);
            h.layout.insert(old, Vma { end: old + new_len, prot, accounted: false });
            return Ok(h.mapped(old, prot));
        }
        if !may_move && fixed_to.is_none() {
            return Err(ERR::new(ErrCode::NoMemory, "cannot grow in place and moving is not allowed"));
        }
        let new = match fixed_to {
            Some(at) => {
                let end = h.check_range(at, new_len)?;
                self.remove_range(&mut h, &who, at, end)?;
                at
            }
            None => h.layout.find_gap(h.base, h.limit, new_len, 0).ok_or_else(|| ERR::new(ErrCode::NoMemory, "no free range for mremap"))?,
        };
        self.add_range(&mut h, &who, new, new + new_len, prot)?;
        self.move_pages(&h, &who, old, old + old_len.min(new_len), new)?;
        self.remove_range(&mut h, &who, old, old_end)?;
        Ok(h.mapped(new, prot))
    }

    pub(super) fn home_fork(&self, r: P2M_FORK) -> Result<M2P_FORKED, Refusal> {
        let P2M_FORK { parent, child } = r;
        self.fresh_pid(child)?;
        let hp = self.home_proc(&parent)?;
        let h = hp.lock().unwrap();
        let mut done = Vec::new();
        let vrs = self.vrs();
        for (idx, o) in &h.vregions {
            let m = M2M_FORK { parent: parent.clone(), child, start: idx * vrs, end: (idx + 1) * vrs };
            if let Err(e) = self.to_owner(o, m) {
                for o in done {
                    let _ = self.to_owner(o, M2M_EXIT { who: Who { vnode: parent.vnode.clone(), pid: child } });
                }
                return Err(e);
            }
            done.push(o);
        }
        let copy = HomeProc { vnode: h.vnode.clone(), creator: h.creator, pcomp: h.pcomp, base: h.base, limit: h.limit, layout: h.layout.clone(), vregions: h.vregions.clone() };
        let vmas = h.layout.iter().map(|(s, v)| VmaInfo { start: s, end: v.end, prot: v.prot }).collect();
        let owners = h.owners();
        self.homes.lock().unwrap().insert(child, Arc::new(Mutex::new(copy)));
        Ok(M2P_FORKED { vmas, owners })
    }

    pub(super) fn home_exit(&self, r: P2M_EXIT) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        self.homes.lock().unwrap().remove(&r.who.pid);
        let h = hp.lock().unwrap();
        let mut seen = Vec::new();
        for o in h.vregions.values() {
            if !seen.contains(&o.id) {
                seen.push(o.id);
                if let Err(e) = self.to_owner(o, M2M_EXIT { who: r.who.clone() }) {
                    tracing::warn!(pid = r.who.pid, owner = o.id, error = %e, "owner did not free an exited process's memory");
                }
            }
        }
        Ok(OK)
    }

    /// Releases, as their exit would, the processes created by pComponents the global
    /// managers say are lost: nobody will ever exit them.
    pub(super) fn reclaim_lost(&self, lost: &[LostPcomp]) {
        if lost.is_empty() {
            return;
        }
        let homes: Vec<(u64, Arc<Mutex<HomeProc>>)> = self.homes.lock().unwrap().iter().map(|(pid, h)| (*pid, h.clone())).collect();
        for (pid, h) in homes {
            let (vnode, orphan) = {
                let g = h.lock().unwrap();
                (g.vnode.clone(), lost.iter().any(|l| g.creator == Some(l.key) && g.pcomp == l.id))
            };
            if !orphan {
                continue;
            }
            tracing::warn!(pid, "releasing the memory of a process whose pComponent is lost");
            metrics::counter!("mcomp_lost_processes_released_total").increment(1);
            if let Err(e) = self.home_exit(P2M_EXIT { who: Who { vnode, pid } }) {
                tracing::warn!(pid, error = %e, "cannot release a lost pComponent's process");
            }
        }
    }

    pub(super) fn vregion(&self, r: P2M_VREGION) -> Result<M2P_VREGION, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let h = hp.lock().unwrap();
        Ok(M2P_VREGION { owner: h.vregions.get(&r.index).cloned() })
    }

    /// Moves the materialized pages of [start, end) to the same offsets from `to`.
    fn move_pages(&self, h: &HomeProc, who: &Who, start: u64, end: u64, to: u64) -> Result<(), Refusal> {
        let shift = |vpn: u64| vpn - start / PAGE + to / PAGE;
        for (idx, s, e) in self.slices(start, end) {
            let Some(src) = h.vregions.get(&idx).cloned() else { continue };
            loop {
                let M2M_PAGES { pages, more } = self.to_owner(&src, M2M_TAKE_PAGES { who: who.clone(), start: s, end: e, max: MOVE_BATCH })?;
                let mut by_owner: HashMap<u32, (ComponentRef, Vec<(u64, ByteBuf)>)> = HashMap::new();
                for (vpn, data) in pages {
                    let nv = shift(vpn);
                    let o = h.vregions.get(&(nv * PAGE / self.vrs())).cloned().ok_or_else(|| ERR::new(ErrCode::Internal, "moved page lands in an inactive vRegion"))?;
                    by_owner.entry(o.id).or_insert_with(|| (o, Vec::new())).1.push((nv, data));
                }
                for (_, (o, pages)) in by_owner {
                    self.to_owner(&o, M2M_PUT_PAGES { who: who.clone(), pages })?;
                }
                if !more {
                    break;
                }
            }
        }
        Ok(())
    }
}
