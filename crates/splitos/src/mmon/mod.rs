//! The memory monitor (mComponent). For the processes it is home of, it handles every
//! virtual-memory call and keeps their vRegion array (which mComponent owns each 1 GiB vRegion)
//! and their address-space layout. For the vRegions it owns, it keeps a vma tree and the
//! virtual-to-physical map (here: page contents keyed by virtual page) and serves the
//! ExCache's fetches and flushes.
//!
//! Memory is accounted when a mapping becomes writable, never when a page is flushed, so a
//! flush can never fail for lack of space: an mComponent out of memory fails the mmap, which
//! the program sees as ENOMEM (malloc returns NULL).
//!
//! It also holds the storage buffer cache of the files placed on it ([`bcache`]).
mod bcache;
mod vma;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use serde_bytes::ByteBuf;
use splitos_rpc::{serve, ComponentRef, ErrCode, Handler, Load, Msg, Role, RpcError, ServerConfig, VmaInfo, VregionOwner, Who, PAGE_SIZE};

pub use vma::{Vma, VmaMap};

use crate::node::{self, Node};

type Page = Box<[u8; PAGE_SIZE]>;
type Reply = Result<Msg, (ErrCode, String)>;

const PROT_WRITE: u32 = 2;
const PAGE: u64 = PAGE_SIZE as u64;
/// Pages per message when a mapping moves between owners (mremap).
const MOVE_BATCH: u32 = 128;

/// Home state of one process.
struct HomeProc {
    vnode: String,
    base: u64,
    limit: u64,
    layout: VmaMap,
    vregions: BTreeMap<u64, ComponentRef>,
}

/// Owner state of one process: its vmas and pages in vRegions this mComponent owns.
struct OwnerProc {
    vnode: String,
    vmas: VmaMap,
    pages: BTreeMap<u64, Page>,
    committed: u64,
}

#[derive(Default)]
struct Counters {
    fetches: AtomicU64,
    flushes: AtomicU64,
    piggybacked: AtomicU64,
    denied: AtomicU64,
    oom: AtomicU64,
}

pub struct Mem {
    node: Arc<Node>,
    capacity: u64,
    vregion_size: AtomicU64,
    committed: AtomicU64,
    used: AtomicU64,
    homes: Mutex<HashMap<u64, Arc<Mutex<HomeProc>>>>,
    owned: Mutex<HashMap<u64, Arc<Mutex<OwnerProc>>>>,
    bcache: Arc<bcache::BufferCache>,
    c: Counters,
}

fn bad(code: ErrCode, msg: impl Into<String>) -> (ErrCode, String) {
    (code, msg.into())
}

fn rpc_err(e: RpcError) -> (ErrCode, String) {
    (e.code(), e.to_string())
}

impl Mem {
    fn me(&self) -> ComponentRef {
        ComponentRef { id: self.node.id(), addr: self.node.addr.clone() }
    }

    fn vrs(&self) -> u64 {
        self.vregion_size.load(Relaxed)
    }

    fn load(&self) -> Load {
        Load {
            threads: 0,
            processes: self.homes.lock().unwrap().len() as u32,
            capacity: self.capacity,
            committed: self.committed.load(Relaxed),
            used: self.used.load(Relaxed),
        }
    }

    // ---------------------------------------------------------------- owner side

    fn owner_proc(&self, who: &Who) -> Result<Arc<Mutex<OwnerProc>>, (ErrCode, String)> {
        let p = self.owned.lock().unwrap().get(&who.pid).cloned();
        let p = p.ok_or_else(|| bad(ErrCode::NotFound, format!("process {} has no memory on mComponent {}", who.pid, self.node.id())))?;
        let vnode = p.lock().unwrap().vnode.clone();
        if vnode != who.vnode {
            self.c.denied.fetch_add(1, Relaxed);
            metrics::counter!("mcomp_denied_total").increment(1);
            tracing::warn!(pid = who.pid, owner_vnode = %vnode, asked_by = %who.vnode, "refused a request for another vNode's pages");
            return Err(bad(ErrCode::Denied, format!("process {} belongs to vNode {vnode:?}, not {:?}", who.pid, who.vnode)));
        }
        Ok(p)
    }

    fn commit(&self, bytes: u64) -> Result<(), (ErrCode, String)> {
        let mut cur = self.committed.load(Relaxed);
        loop {
            if cur + bytes > self.capacity {
                self.c.oom.fetch_add(1, Relaxed);
                metrics::counter!("mcomp_out_of_memory_total").increment(1);
                return Err(bad(ErrCode::NoMemory, format!("mComponent {} is out of memory ({cur} of {} bytes committed, {bytes} more asked)", self.node.id(), self.capacity)));
            }
            match self.committed.compare_exchange(cur, cur + bytes, Relaxed, Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    fn free_pages(&self, p: &mut OwnerProc, start: u64, end: u64) {
        let vpns: Vec<u64> = p.pages.range(start / PAGE..end / PAGE).map(|(k, _)| *k).collect();
        for v in &vpns {
            p.pages.remove(v);
        }
        self.used.fetch_sub(vpns.len() as u64 * PAGE, Relaxed);
    }

    fn uncommit(&self, p: &mut OwnerProc, gone: &[(u64, Vma)]) {
        let bytes: u64 = gone.iter().filter(|(_, v)| v.accounted).map(|(s, v)| v.end - s).sum();
        p.committed -= bytes;
        self.committed.fetch_sub(bytes, Relaxed);
    }

    fn page_in_vma(p: &OwnerProc, vpn: u64) -> Result<(), (ErrCode, String)> {
        p.vmas.find(vpn * PAGE).map(|_| ()).ok_or_else(|| bad(ErrCode::Invalid, format!("page {:#x} is not mapped", vpn * PAGE)))
    }

    fn store(&self, p: &mut OwnerProc, vpn: u64, data: &[u8]) -> Result<(), (ErrCode, String)> {
        if data.len() != PAGE_SIZE {
            return Err(bad(ErrCode::Invalid, format!("a page is {PAGE_SIZE} bytes, got {}", data.len())));
        }
        Mem::page_in_vma(p, vpn)?;
        let mut page: Page = Box::new([0u8; PAGE_SIZE]);
        page.copy_from_slice(data);
        if p.pages.insert(vpn, page).is_none() {
            self.used.fetch_add(PAGE, Relaxed);
        }
        Ok(())
    }

    fn load_page(p: &OwnerProc, vpn: u64) -> Result<ByteBuf, (ErrCode, String)> {
        Mem::page_in_vma(p, vpn)?;
        Ok(match p.pages.get(&vpn) {
            Some(pg) => ByteBuf::from(pg.to_vec()),
            None => ByteBuf::from(vec![0u8; PAGE_SIZE]),
        })
    }

    fn handle_owner(&self, msg: Msg) -> Reply {
        match msg {
            Msg::P2M_FETCH { who, vpn } => {
                let p = self.owner_proc(&who)?;
                self.c.fetches.fetch_add(1, Relaxed);
                let data = Mem::load_page(&p.lock().unwrap(), vpn)?;
                Ok(Msg::M2P_PAGE { data })
            }
            Msg::P2M_FLUSH { who, vpn, data } => {
                let p = self.owner_proc(&who)?;
                self.c.flushes.fetch_add(1, Relaxed);
                self.store(&mut p.lock().unwrap(), vpn, &data)?;
                Ok(Msg::OK)
            }
            Msg::P2M_FLUSH_FETCH { who, fetch_vpn, flush_who, flush_vpn, data } => {
                let p = self.owner_proc(&who)?;
                // The victim's process may have exited since it was evicted: its page is
                // garbage then, and the fetch must not fail for it.
                match self.owner_proc(&flush_who) {
                    Ok(victim) => {
                        self.c.flushes.fetch_add(1, Relaxed);
                        self.c.piggybacked.fetch_add(1, Relaxed);
                        self.store(&mut victim.lock().unwrap(), flush_vpn, &data)?;
                    }
                    Err((ErrCode::NotFound, _)) => {}
                    Err(e) => return Err(e),
                }
                self.c.fetches.fetch_add(1, Relaxed);
                let data = Mem::load_page(&p.lock().unwrap(), fetch_vpn)?;
                Ok(Msg::M2P_PAGE { data })
            }
            Msg::M2M_VMA_ADD { who, start, end, prot } => {
                let accounted = prot & PROT_WRITE != 0;
                if accounted {
                    self.commit(end - start)?;
                }
                let p = self.owned.lock().unwrap().entry(who.pid).or_insert_with(|| {
                    Arc::new(Mutex::new(OwnerProc { vnode: who.vnode.clone(), vmas: VmaMap::default(), pages: BTreeMap::new(), committed: 0 }))
                }).clone();
                let mut g = p.lock().unwrap();
                if g.vnode != who.vnode {
                    if accounted {
                        self.committed.fetch_sub(end - start, Relaxed);
                    }
                    return Err(bad(ErrCode::Denied, "process belongs to another vNode"));
                }
                let gone = g.vmas.remove_range(start, end);
                self.uncommit(&mut g, &gone);
                self.free_pages(&mut g, start, end);
                g.vmas.insert(start, Vma { end, prot, accounted });
                if accounted {
                    g.committed += end - start;
                }
                Ok(Msg::OK)
            }
            Msg::M2M_VMA_REMOVE { who, start, end } => {
                let p = self.owner_proc(&who)?;
                let mut g = p.lock().unwrap();
                let gone = g.vmas.remove_range(start, end);
                self.uncommit(&mut g, &gone);
                self.free_pages(&mut g, start, end);
                Ok(Msg::OK)
            }
            Msg::M2M_VMA_PROTECT { who, start, end, prot } => {
                let p = self.owner_proc(&who)?;
                let mut g = p.lock().unwrap();
                let parts = g.vmas.carve(start, end);
                if prot & PROT_WRITE != 0 {
                    let need: u64 = parts.iter().filter(|(_, v)| !v.accounted).map(|(s, v)| v.end - s).sum();
                    self.commit(need)?;
                    g.committed += need;
                }
                for (s, v) in parts {
                    let accounted = v.accounted || prot & PROT_WRITE != 0;
                    g.vmas.set(s, Vma { prot, accounted, ..v });
                }
                Ok(Msg::OK)
            }
            Msg::M2M_DISCARD { who, start, end } => {
                let p = self.owner_proc(&who)?;
                self.free_pages(&mut p.lock().unwrap(), start, end);
                Ok(Msg::OK)
            }
            Msg::M2M_TAKE_PAGES { who, start, end, max } => {
                let p = self.owner_proc(&who)?;
                let mut g = p.lock().unwrap();
                let vpns: Vec<u64> = g.pages.range(start / PAGE..end / PAGE).map(|(k, _)| *k).take(max as usize + 1).collect();
                let more = vpns.len() > max as usize;
                let mut pages = Vec::new();
                for v in vpns.into_iter().take(max as usize) {
                    let pg = g.pages.remove(&v).expect("listed above");
                    self.used.fetch_sub(PAGE, Relaxed);
                    pages.push((v, ByteBuf::from(pg.to_vec())));
                }
                Ok(Msg::M2M_PAGES { pages, more })
            }
            Msg::M2M_PUT_PAGES { who, pages } => {
                let p = self.owner_proc(&who)?;
                let mut g = p.lock().unwrap();
                for (vpn, data) in pages {
                    self.store(&mut g, vpn, &data)?;
                }
                Ok(Msg::OK)
            }
            Msg::M2M_FORK { parent, child, start, end } => {
                let p = self.owner_proc(&parent)?;
                let g = p.lock().unwrap();
                let mut vmas = VmaMap::default();
                let mut need = 0;
                for (s, v) in g.vmas.iter().filter(|(s, v)| *s < end && v.end > start) {
                    need += if v.accounted { v.end - s } else { 0 };
                    vmas.insert(s, v);
                }
                self.commit(need)?;
                let pages: BTreeMap<u64, Page> = g.pages.range(start / PAGE..end / PAGE).map(|(k, v)| (*k, v.clone())).collect();
                self.used.fetch_add(pages.len() as u64 * PAGE, Relaxed);
                let mut owned = self.owned.lock().unwrap();
                let cp = owned.entry(child).or_insert_with(|| {
                    Arc::new(Mutex::new(OwnerProc { vnode: parent.vnode.clone(), vmas: VmaMap::default(), pages: BTreeMap::new(), committed: 0 }))
                });
                let mut c = cp.lock().unwrap();
                for (s, v) in vmas.iter() {
                    c.vmas.insert(s, v);
                }
                c.pages.extend(pages);
                c.committed += need;
                Ok(Msg::OK)
            }
            Msg::M2M_EXIT { who } => {
                let p = self.owned.lock().unwrap().remove(&who.pid);
                if let Some(p) = p {
                    let g = p.lock().unwrap();
                    self.committed.fetch_sub(g.committed, Relaxed);
                    self.used.fetch_sub(g.pages.len() as u64 * PAGE, Relaxed);
                }
                Ok(Msg::OK)
            }
            other => Err(bad(ErrCode::Invalid, format!("an mComponent does not handle {}", other.name()))),
        }
    }

    /// Sends an owner request to the owner, in-process when that is us.
    fn to_owner(&self, owner: &ComponentRef, msg: Msg) -> Reply {
        if owner.id == self.node.id() {
            self.handle_owner(msg)
        } else {
            self.node.pool.call(&owner.addr, &msg).map_err(rpc_err)
        }
    }

    // ---------------------------------------------------------------- home side

    fn home_proc(&self, who: &Who) -> Result<Arc<Mutex<HomeProc>>, (ErrCode, String)> {
        let h = self.homes.lock().unwrap().get(&who.pid).cloned();
        let h = h.ok_or_else(|| bad(ErrCode::NotFound, format!("mComponent {} is not home of process {}", self.node.id(), who.pid)))?;
        if h.lock().unwrap().vnode != who.vnode {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(bad(ErrCode::Denied, format!("process {} belongs to another vNode", who.pid)));
        }
        Ok(h)
    }

    /// [start, end) cut at vRegion boundaries.
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
    fn ensure_owner(&self, h: &mut HomeProc, idx: u64) -> Result<ComponentRef, (ErrCode, String)> {
        if let Some(o) = h.vregions.get(&idx) {
            return Ok(o.clone());
        }
        let owner = match self.node.call_gm(&Msg::M2G_PICK_OWNER { bytes: self.vrs() }) {
            Ok(Msg::G2M_OWNER { mcomp }) => mcomp,
            // With every mComponent short of a whole free vRegion, the home owns it and the
            // accounting of each mapping decides what fits.
            Ok(_) | Err(RpcError::Remote { code: ErrCode::NoMemory, .. }) => self.me(),
            Err(e) => return Err(rpc_err(e)),
        };
        tracing::debug!(vregion = idx, owner = owner.id, "vRegion activated");
        h.vregions.insert(idx, owner.clone());
        Ok(owner)
    }

    fn add_range(&self, h: &mut HomeProc, who: &Who, start: u64, end: u64, prot: u32) -> Reply {
        let mut done: Vec<(ComponentRef, u64, u64)> = Vec::new();
        for (idx, s, e) in self.slices(start, end) {
            let r = self.ensure_owner(h, idx).and_then(|o| self.to_owner(&o, Msg::M2M_VMA_ADD { who: who.clone(), start: s, end: e, prot }).map(|_| o));
            match r {
                Ok(o) => done.push((o, s, e)),
                Err(err) => {
                    for (o, s, e) in done {
                        let _ = self.to_owner(&o, Msg::M2M_VMA_REMOVE { who: who.clone(), start: s, end: e });
                    }
                    return Err(err);
                }
            }
        }
        h.layout.insert(start, Vma { end, prot, accounted: false });
        Ok(Msg::OK)
    }

    fn remove_range(&self, h: &mut HomeProc, who: &Who, start: u64, end: u64) -> Result<(), (ErrCode, String)> {
        for (idx, s, e) in self.slices(start, end) {
            if let Some(o) = h.vregions.get(&idx).cloned() {
                match self.to_owner(&o, Msg::M2M_VMA_REMOVE { who: who.clone(), start: s, end: e }) {
                    Ok(_) | Err((ErrCode::NotFound, _)) => {}
                    Err(err) => return Err(err),
                }
            }
        }
        h.layout.remove_range(start, end);
        Ok(())
    }

    fn owners_of(h: &HomeProc) -> Vec<VregionOwner> {
        h.vregions.iter().map(|(i, o)| VregionOwner { index: *i, owner: o.clone() }).collect()
    }

    fn check_range(h: &HomeProc, addr: u64, len: u64) -> Result<u64, (ErrCode, String)> {
        let end = addr.checked_add(len).ok_or_else(|| bad(ErrCode::Invalid, "range overflows"))?;
        if !addr.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) || len == 0 || addr < h.base || end > h.limit {
            return Err(bad(ErrCode::Invalid, format!("range {addr:#x}+{len:#x} is not page-aligned inside the heap region")));
        }
        Ok(end)
    }

    fn handle_home(&self, msg: Msg) -> Reply {
        match msg {
            Msg::P2M_PROC_CREATE { who, region_base, region_size } => {
                let h = HomeProc { vnode: who.vnode.clone(), base: region_base, limit: region_base + region_size, layout: VmaMap::default(), vregions: BTreeMap::new() };
                self.homes.lock().unwrap().insert(who.pid, Arc::new(Mutex::new(h)));
                tracing::debug!(pid = who.pid, vnode = %who.vnode, "home of a new process");
                Ok(Msg::OK)
            }
            Msg::P2M_MMAP { who, hint, len, prot, fixed } => {
                let hp = self.home_proc(&who)?;
                let mut h = hp.lock().unwrap();
                let start = if fixed {
                    let end = Mem::check_range(&h, hint, len)?;
                    self.remove_range(&mut h, &who, hint, end)?;
                    hint
                } else {
                    h.layout.find_gap(h.base, h.limit, len, hint).ok_or_else(|| bad(ErrCode::NoMemory, "the heap region has no free range that large"))?
                };
                self.add_range(&mut h, &who, start, start + len, prot)?;
                Ok(Msg::M2P_MAPPED { addr: start, prot, owners: Mem::owners_of(&h) })
            }
            Msg::P2M_MUNMAP { who, addr, len } => {
                let hp = self.home_proc(&who)?;
                let mut h = hp.lock().unwrap();
                let end = Mem::check_range(&h, addr, len)?;
                self.remove_range(&mut h, &who, addr, end)?;
                Ok(Msg::OK)
            }
            Msg::P2M_MPROTECT { who, addr, len, prot } => {
                let hp = self.home_proc(&who)?;
                let mut h = hp.lock().unwrap();
                let end = Mem::check_range(&h, addr, len)?;
                if !h.layout.covers(addr, end) {
                    return Err(bad(ErrCode::NoMemory, "mprotect of an unmapped range"));
                }
                for (idx, s, e) in self.slices(addr, end) {
                    let o = self.ensure_owner(&mut h, idx)?;
                    self.to_owner(&o, Msg::M2M_VMA_PROTECT { who: who.clone(), start: s, end: e, prot })?;
                }
                for (s, v) in h.layout.carve(addr, end) {
                    h.layout.set(s, Vma { prot, ..v });
                }
                Ok(Msg::OK)
            }
            Msg::P2M_DONTNEED { who, addr, len } => {
                let hp = self.home_proc(&who)?;
                let h = hp.lock().unwrap();
                let end = Mem::check_range(&h, addr, len)?;
                for (idx, s, e) in self.slices(addr, end) {
                    if let Some(o) = h.vregions.get(&idx) {
                        match self.to_owner(o, Msg::M2M_DISCARD { who: who.clone(), start: s, end: e }) {
                            Ok(_) | Err((ErrCode::NotFound, _)) => {}
                            Err(err) => return Err(err),
                        }
                    }
                }
                Ok(Msg::OK)
            }
            Msg::P2M_MREMAP { who, old, old_len, new_len, may_move, fixed_to } => {
                let hp = self.home_proc(&who)?;
                let mut h = hp.lock().unwrap();
                let old_end = Mem::check_range(&h, old, old_len)?;
                let Some((_, vma)) = h.layout.find(old).filter(|_| h.layout.covers(old, old_end)) else {
                    return Err(bad(ErrCode::Invalid, "mremap of an unmapped range"));
                };
                let prot = vma.prot;
                if fixed_to.is_none() && new_len <= old_len {
                    if new_len < old_len {
                        self.remove_range(&mut h, &who, old + new_len, old_end)?;
                    }
                    return Ok(Msg::M2P_MAPPED { addr: old, prot, owners: Mem::owners_of(&h) });
                }
                if fixed_to.is_none() && old + new_len <= h.limit && h.layout.is_free(old_end, old + new_len) {
                    self.add_range(&mut h, &who, old_end, old + new_len, prot)?;
                    h.layout.remove_range(old, old + new_len);
                    h.layout.insert(old, Vma { end: old + new_len, prot, accounted: false });
                    return Ok(Msg::M2P_MAPPED { addr: old, prot, owners: Mem::owners_of(&h) });
                }
                if !may_move && fixed_to.is_none() {
                    return Err(bad(ErrCode::NoMemory, "cannot grow in place and moving is not allowed"));
                }
                let new = match fixed_to {
                    Some(at) => {
                        let end = Mem::check_range(&h, at, new_len)?;
                        self.remove_range(&mut h, &who, at, end)?;
                        at
                    }
                    None => h.layout.find_gap(h.base, h.limit, new_len, 0).ok_or_else(|| bad(ErrCode::NoMemory, "no free range for mremap"))?,
                };
                self.add_range(&mut h, &who, new, new + new_len, prot)?;
                self.move_pages(&h, &who, old, old + old_len.min(new_len), new)?;
                self.remove_range(&mut h, &who, old, old_end)?;
                Ok(Msg::M2P_MAPPED { addr: new, prot, owners: Mem::owners_of(&h) })
            }
            Msg::P2M_FORK { parent, child } => {
                let hp = self.home_proc(&parent)?;
                let h = hp.lock().unwrap();
                let mut done = Vec::new();
                for (idx, o) in &h.vregions {
                    let vrs = self.vrs();
                    let m = Msg::M2M_FORK { parent: parent.clone(), child, start: idx * vrs, end: (idx + 1) * vrs };
                    if let Err(e) = self.to_owner(o, m) {
                        for o in done {
                            let _ = self.to_owner(o, Msg::M2M_EXIT { who: Who { vnode: parent.vnode.clone(), pid: child } });
                        }
                        return Err(e);
                    }
                    done.push(o);
                }
                let copy = HomeProc { vnode: h.vnode.clone(), base: h.base, limit: h.limit, layout: h.layout.clone(), vregions: h.vregions.clone() };
                let vmas = h.layout.iter().map(|(s, v)| VmaInfo { start: s, end: v.end, prot: v.prot }).collect();
                let owners = Mem::owners_of(&h);
                self.homes.lock().unwrap().insert(child, Arc::new(Mutex::new(copy)));
                Ok(Msg::M2P_FORKED { vmas, owners })
            }
            Msg::P2M_EXIT { who } => {
                let hp = self.home_proc(&who)?;
                self.homes.lock().unwrap().remove(&who.pid);
                let h = hp.lock().unwrap();
                let mut seen = Vec::new();
                for o in h.vregions.values() {
                    if !seen.contains(&o.id) {
                        seen.push(o.id);
                        if let Err(e) = self.to_owner(o, Msg::M2M_EXIT { who: who.clone() }) {
                            tracing::warn!(pid = who.pid, owner = o.id, error = %e.1, "owner did not free an exited process's memory");
                        }
                    }
                }
                Ok(Msg::OK)
            }
            Msg::P2M_VREGION { who, index } => {
                let hp = self.home_proc(&who)?;
                let h = hp.lock().unwrap();
                Ok(Msg::M2P_VREGION { owner: h.vregions.get(&index).cloned() })
            }
            other => self.handle_owner(other),
        }
    }

    /// Moves the materialized pages of [start, end) to the same offsets from `to`.
    fn move_pages(&self, h: &HomeProc, who: &Who, start: u64, end: u64, to: u64) -> Result<(), (ErrCode, String)> {
        let shift = |vpn: u64| vpn - start / PAGE + to / PAGE;
        for (idx, s, e) in self.slices(start, end) {
            let Some(src) = h.vregions.get(&idx).cloned() else { continue };
            loop {
                let r = self.to_owner(&src, Msg::M2M_TAKE_PAGES { who: who.clone(), start: s, end: e, max: MOVE_BATCH })?;
                let Msg::M2M_PAGES { pages, more } = r else { return Err(bad(ErrCode::Internal, "unexpected reply to M2M_TAKE_PAGES")) };
                let mut by_owner: HashMap<u32, (ComponentRef, Vec<(u64, ByteBuf)>)> = HashMap::new();
                for (vpn, data) in pages {
                    let nv = shift(vpn);
                    let o = h.vregions.get(&(nv * PAGE / self.vrs())).cloned().ok_or_else(|| bad(ErrCode::Internal, "moved page lands in an inactive vRegion"))?;
                    by_owner.entry(o.id).or_insert_with(|| (o, Vec::new())).1.push((nv, data));
                }
                for (_, (o, pages)) in by_owner {
                    self.to_owner(&o, Msg::M2M_PUT_PAGES { who: who.clone(), pages })?;
                }
                if !more {
                    break;
                }
            }
        }
        Ok(())
    }

    fn stats_json(&self) -> String {
        let owned = self.owned.lock().unwrap();
        let per_proc: Vec<_> = owned
            .iter()
            .map(|(pid, p)| {
                let g = p.lock().unwrap();
                serde_json::json!({"pid": pid, "vnode": g.vnode, "pages": g.pages.len(), "committed": g.committed})
            })
            .collect();
        serde_json::json!({
            "role": "mcomponent", "id": self.node.id(), "addr": self.node.addr,
            "capacity": self.capacity, "committed": self.committed.load(Relaxed), "used": self.used.load(Relaxed),
            "home_of": self.homes.lock().unwrap().len(), "owned_processes": per_proc,
            "fetches": self.c.fetches.load(Relaxed), "flushes": self.c.flushes.load(Relaxed),
            "piggybacked": self.c.piggybacked.load(Relaxed), "denied": self.c.denied.load(Relaxed),
            "out_of_memory": self.c.oom.load(Relaxed), "buffer_cache": self.bcache.stats(),
        })
        .to_string()
    }
}

impl Handler for Mem {
    fn handle(&self, msg: Msg) -> Msg {
        let name = msg.name();
        metrics::counter!("mcomp_requests_total", "msg" => name).increment(1);
        let r = match msg {
            Msg::C2X_PING => Ok(Msg::X2C_PONG { role: Role::Mem, id: self.node.id() }),
            Msg::C2X_STATS => Ok(Msg::X2C_STATS { json: self.stats_json() }),
            Msg::C2X_METRICS => {
                metrics::gauge!("mcomp_committed_bytes").set(self.committed.load(Relaxed) as f64);
                metrics::gauge!("mcomp_used_bytes").set(self.used.load(Relaxed) as f64);
                Ok(Msg::X2C_METRICS { text: node::render_metrics() })
            }
            Msg::C2X_SHUTDOWN => {
                self.bcache.write_back_all();
                crate::node::exit_soon();
                Ok(Msg::OK)
            }
            m @ (Msg::P2M_FILE_READ { .. }
            | Msg::P2M_FILE_WRITE { .. }
            | Msg::P2M_FILE_SETSIZE { .. }
            | Msg::P2M_FILE_SYNC { .. }
            | Msg::P2M_FILE_STAT { .. }
            | Msg::P2M_FILE_FORGET { .. }) => self.bcache.handle(m),
            other => self.handle_home(other),
        };
        r.unwrap_or_else(|(code, msg)| {
            tracing::debug!(request = name, ?code, %msg, "request refused");
            Msg::ERR { code, msg }
        })
    }

    fn fans_out(&self, msg: &Msg) -> bool {
        matches!(
            msg,
            Msg::P2M_MMAP { .. }
                | Msg::P2M_MUNMAP { .. }
                | Msg::P2M_MPROTECT { .. }
                | Msg::P2M_MREMAP { .. }
                | Msg::P2M_DONTNEED { .. }
                | Msg::P2M_FORK { .. }
                | Msg::P2M_EXIT { .. }
                // Waits on the sComponent's disk: not on a receiving thread. Reads and writes stay
                // there: on two cores a hand-off to a pool thread costs more than a cache hit, and
                // page faults use their own connections, so only this pComponent's other control
                // requests queue behind a read that misses.
                | Msg::P2M_FILE_SETSIZE { .. }
                | Msg::P2M_FILE_SYNC { .. }
        )
    }
}

pub struct MemArgs {
    pub listen: String,
    pub gm: String,
    pub capacity: u64,
    pub workers: usize,
    /// Bytes of storage buffer cache.
    pub bcache: u64,
    /// Largest read-ahead window for sequential file reads (0: off).
    pub readahead: u64,
    pub ready_file: Option<std::path::PathBuf>,
    pub metrics_addr: Option<String>,
}

pub fn run(args: MemArgs) -> anyhow::Result<()> {
    let stop = node::block_stop_signals();
    let node = Node::new(Role::Mem, &args.gm);
    let listener = splitos_rpc::transport::Transport::listen(&*node.transport, &args.listen)
        .map_err(|e| anyhow::anyhow!("mComponent cannot listen on {}: {e}", args.listen))?;
    let node = node.with_addr(listener.local_addr());
    let mem = Arc::new(Mem {
        node: node.clone(),
        capacity: args.capacity,
        vregion_size: AtomicU64::new(1 << 30),
        committed: AtomicU64::new(0),
        used: AtomicU64::new(0),
        homes: Mutex::new(HashMap::new()),
        owned: Mutex::new(HashMap::new()),
        bcache: bcache::BufferCache::new(node.clone(), args.bcache, args.readahead),
        c: Counters::default(),
    });
    let m3 = mem.clone();
    // Buffered file writes reach the sComponent before an orderly stop.
    stop.on_stop(move || m3.bcache.write_back_all());
    let h = serve(listener, mem.clone(), ServerConfig { name: "mcomp".into(), workers: args.workers, fanout_workers: 2 });
    let vrs = node.register(None, mem.load()).map_err(|e| anyhow::anyhow!("cannot register with the global managers at {}: {e}", args.gm))?;
    mem.vregion_size.store(vrs, Relaxed);
    let m2 = mem.clone();
    node.clone().heartbeat_forever(None, move || m2.load());
    if let Some(m) = &args.metrics_addr {
        let at = node::serve_metrics_http(m)?;
        tracing::info!(metrics = %at, "serving Prometheus metrics");
    }
    tracing::info!(addr = %h.addr, id = node.id(), role = "mcomponent", capacity = args.capacity, buffer_cache = args.bcache, readahead = args.readahead, workers = args.workers, "splitos memory monitor started");
    node::announce_ready(args.ready_file.as_deref(), &h.addr);
    crate::node::park_forever()
}
