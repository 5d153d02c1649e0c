//! Where the miss path gets lines from and writes them back to: the [`PageStore`] interface,
//! and [`RemoteStore`], its implementation over RPC to the vRegion owners (mComponents).
//!
//! A researcher swaps the page store to change where remote memory lives (a replicated store,
//! an erasure-coded one, a shared-memory one) without touching the miss path.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use crate::node::Node;

/// The contents of one page (`PAGE_SIZE` bytes).
pub type Page = Vec<u8>;

/// Where a page lives. Two pages at the same place can travel in one round trip.
pub type Place = u32;

pub trait PageStore: Send + Sync {
    fn place(&self, pid: u64, vpn: u64) -> Result<Place, Refusal>;
    fn fetch(&self, pid: u64, vpn: u64) -> Result<Page, Refusal>;
    fn flush(&self, pid: u64, vpn: u64, data: &[u8]) -> Result<(), Refusal>;
    /// Writes one page back and fetches another from the same place in one round trip (the
    /// LegoOS piggyback). The two may belong to different processes.
    fn flush_fetch(&self, flush: (u64, u64, &[u8]), fetch: (u64, u64)) -> Result<Page, Refusal>;
    /// Several pages of one process from one place, in the order asked.
    fn fetch_many(&self, pid: u64, vpns: &[u64]) -> Result<Vec<Page>, Refusal>;
    /// [`PageStore::flush_fetch`] with several victims (any processes) written back and several
    /// pages of one process fetched (read-ahead), all at one place.
    fn flush_fetch_many(&self, flushes: &[(u64, u64, &[u8])], pid: u64, vpns: &[u64]) -> Result<Vec<Page>, Refusal>;
    /// Several pages of one process to one place; all stored or none.
    fn flush_many(&self, pid: u64, pages: &[(u64, &[u8])]) -> Result<(), Refusal>;
}

/// A process's address space as the page store needs it: who it is, its home, and the owners
/// of its vRegions learnt so far.
pub struct Space {
    pub who: Who,
    pub home: ComponentRef,
    vregions: Mutex<HashMap<u64, ComponentRef>>,
}

impl Space {
    pub fn new(who: Who, home: ComponentRef) -> Space {
        Space { who, home, vregions: Mutex::new(HashMap::new()) }
    }

    /// Owners the home announced (in `M2P_MAPPED` and `M2P_FORKED` replies).
    pub fn learn_owners(&self, owners: &[VregionOwner]) {
        let mut v = self.vregions.lock().unwrap();
        for o in owners {
            v.insert(o.index, o.owner.clone());
        }
    }
}

/// The page store of the vRegion owners, reached over the cluster's transport.
pub struct RemoteStore {
    node: Arc<Node>,
    vregion_size: AtomicU64,
    spaces: Mutex<HashMap<u64, Arc<Space>>>,
}

fn page(vpn: u64) -> u64 {
    vpn * PAGE_SIZE as u64
}

impl RemoteStore {
    pub fn new(node: Arc<Node>) -> RemoteStore {
        RemoteStore { node, vregion_size: AtomicU64::new(1 << 30), spaces: Mutex::new(HashMap::new()) }
    }

    pub fn set_vregion_size(&self, v: u64) {
        self.vregion_size.store(v, Relaxed);
    }

    pub fn attach(&self, pid: u64, space: Arc<Space>) {
        self.spaces.lock().unwrap().insert(pid, space);
    }

    pub fn detach(&self, pid: u64) {
        self.spaces.lock().unwrap().remove(&pid);
    }

    fn space(&self, pid: u64) -> Result<Arc<Space>, Refusal> {
        self.spaces.lock().unwrap().get(&pid).cloned().ok_or_else(|| ERR::new(ErrCode::NotFound, format!("process {pid} is not on this pComponent")))
    }

    /// The owner of the vRegion holding `vpn`, from the cached vRegion array or the home.
    fn owner(&self, s: &Space, vpn: u64) -> Result<ComponentRef, Refusal> {
        let idx = page(vpn) / self.vregion_size.load(Relaxed);
        if let Some(o) = s.vregions.lock().unwrap().get(&idx) {
            return Ok(o.clone());
        }
        let r = self.node.rpc.call_direct(&s.home.addr, P2M_VREGION { who: s.who.clone(), index: idx });
        match r.map_err(|e| failed(&s.home, "find the owner of", vpn, e))?.owner {
            Some(o) => {
                s.vregions.lock().unwrap().insert(idx, o.clone());
                Ok(o)
            }
            None => Err(ERR::new(ErrCode::NotFound, format!("heap page {:#x} is in no active vRegion", page(vpn)))),
        }
    }
}

/// A failed call, naming the component, the page and what was attempted.
fn failed(o: &ComponentRef, what: &str, vpn: u64, e: RpcError) -> Refusal {
    ERR::new(e.code(), format!("mComponent {} at {}: cannot {what} heap page {:#x}: {e}", o.id, o.addr, page(vpn)))
}

/// A fetched page, if it is what was written back: a page that fails its checksum is never
/// taken for the program's data.
fn checked(o: &ComponentRef, vpn: u64, data: ByteBuf) -> Result<Page, Refusal> {
    unseal_page(data).map_err(|e| match e {
        Unsealed::Size(n) => ERR::new(ErrCode::Internal, format!("mComponent {} at {} sent {n} bytes for heap page {:#x}", o.id, o.addr, page(vpn))),
        Unsealed::Checksum => {
            metrics::counter!("pcomp_checksum_failures_total").increment(1);
            tracing::error!(owner = o.id, vpn, "a fetched page failed its checksum");
            ERR::new(ErrCode::Internal, format!("mComponent {} at {} sent heap page {:#x} changed since it was written back (it fails its checksum)", o.id, o.addr, page(vpn)))
        }
    })
}

/// The pages of a batched fetch, one per page asked for.
fn pages_of(o: &ComponentRef, vpns: &[u64], r: M2P_PAGES) -> Result<Vec<Page>, Refusal> {
    if r.pages.len() != vpns.len() {
        return Err(ERR::new(ErrCode::Internal, format!("mComponent {} at {} sent {} pages for {}", o.id, o.addr, r.pages.len(), vpns.len())));
    }
    vpns.iter().zip(r.pages).map(|(v, d)| checked(o, *v, d)).collect()
}

impl PageStore for RemoteStore {
    fn place(&self, pid: u64, vpn: u64) -> Result<Place, Refusal> {
        Ok(self.owner(&*self.space(pid)?, vpn)?.id)
    }

    fn fetch(&self, pid: u64, vpn: u64) -> Result<Page, Refusal> {
        let s = self.space(pid)?;
        let o = self.owner(&s, vpn)?;
        let r = self.node.rpc.call_direct(&o.addr, P2M_FETCH { who: s.who.clone(), vpn }).map_err(|e| failed(&o, "fetch", vpn, e))?;
        checked(&o, vpn, r.data)
    }

    fn flush(&self, pid: u64, vpn: u64, data: &[u8]) -> Result<(), Refusal> {
        let s = self.space(pid)?;
        let o = self.owner(&s, vpn)?;
        self.node.rpc.call_direct(&o.addr, P2M_FLUSH { who: s.who.clone(), vpn, data: seal_page(data) }).map_err(|e| failed(&o, "write back", vpn, e))?;
        Ok(())
    }

    fn flush_fetch(&self, (fpid, fvpn, data): (u64, u64, &[u8]), (pid, vpn): (u64, u64)) -> Result<Page, Refusal> {
        let s = self.space(pid)?;
        // The victim's process exited since it was evicted: its page is garbage, the fetch alone remains.
        let Ok(fs) = self.space(fpid) else { return self.fetch(pid, vpn) };
        let o = self.owner(&s, vpn)?;
        let msg = P2M_FLUSH_FETCH { who: s.who.clone(), fetch_vpn: vpn, flush_who: fs.who.clone(), flush_vpn: fvpn, data: seal_page(data) };
        let r = self.node.rpc.call_direct(&o.addr, msg).map_err(|e| failed(&o, "write back and fetch", vpn, e))?;
        checked(&o, vpn, r.data)
    }

    fn fetch_many(&self, pid: u64, vpns: &[u64]) -> Result<Vec<Page>, Refusal> {
        let Some(&first) = vpns.first() else { return Ok(Vec::new()) };
        let s = self.space(pid)?;
        let o = self.owner(&s, first)?;
        let r = self.node.rpc.call_direct(&o.addr, P2M_FETCH_MANY { who: s.who.clone(), vpns: vpns.to_vec() }).map_err(|e| failed(&o, "fetch", first, e))?;
        pages_of(&o, vpns, r)
    }

    fn flush_fetch_many(&self, flushes: &[(u64, u64, &[u8])], pid: u64, vpns: &[u64]) -> Result<Vec<Page>, Refusal> {
        let Some(&first) = vpns.first() else { return Ok(Vec::new()) };
        let s = self.space(pid)?;
        let o = self.owner(&s, first)?;
        // A victim whose process exited since it was evicted is garbage: it stays behind.
        let flushes = flushes.iter().filter_map(|(fpid, fvpn, data)| self.space(*fpid).ok().map(|fs| (fs.who.clone(), *fvpn, seal_page(data)))).collect();
        let msg = P2M_FLUSH_FETCH_MANY { who: s.who.clone(), vpns: vpns.to_vec(), flushes };
        let r = self.node.rpc.call_direct(&o.addr, msg).map_err(|e| failed(&o, "write back and fetch", first, e))?;
        pages_of(&o, vpns, r)
    }

    fn flush_many(&self, pid: u64, pages: &[(u64, &[u8])]) -> Result<(), Refusal> {
        let Some(&(first, _)) = pages.first() else { return Ok(()) };
        let s = self.space(pid)?;
        let o = self.owner(&s, first)?;
        let pages = pages.iter().map(|(v, d)| (*v, seal_page(d))).collect();
        self.node.rpc.call_direct(&o.addr, P2M_FLUSH_MANY { who: s.who.clone(), pages }).map_err(|e| failed(&o, "write back", first, e))?;
        Ok(())
    }
}
