//! Where the miss path gets lines from and writes them back to: the [`PageStore`] interface,
//! and [`RemoteStore`], its implementation over RPC to the vRegion replicas (mComponents).
//!
//! A researcher swaps the page store to change where remote memory lives (a compressed one,
//! a shared-memory one) without touching the miss path.
//!
//! Replication lives behind this interface: each vRegion has a replica set, primary first.
//! A page is fetched from the primary (the next replica when the primary cannot be reached
//! or sends a page that fails its checksum, which is then repaired from the good copy) and
//! written back to every replica; a write-back completes when all of them stored it. A
//! replica that cannot be reached is reported to the home (`P2M_REPLICA_LOST`), which takes
//! it out of the sets and rebuilds its copies; a home that cannot be reached is replaced by
//! its backup (`P2M_HOME_TAKEOVER`).
//!
//! A striped (erasure-coded) set has one copy of each page: it is fetched from and written
//! back to its one holder, which forwards the change to the parity. A page failing its
//! checksum is rebuilt by the home from the parity (`P2M_RECONSTRUCT`); a holder that cannot be
//! reached is reported like a replica, and the home rebuilds its place before it answers.
mod failure;
mod memory;

use failure::{corrupt, failed, transport_failure, waited_for, Next};
pub use memory::ProcMemory;
use memory::{Homes, KEPT_REPORTS, KEPT_WINDOW};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use super::onesided::{Leases, OneSided};
use splitos_core::node::Node;

/// The contents of one page (`PAGE_SIZE` bytes).
pub type Page = Vec<u8>;

/// Where a page lives. Two pages at the same place can travel in one round trip.
pub type Place = u32;

/// A victim riding with a fetch: its process, page and sealed contents.
type Riding = (Who, u64, ByteBuf);

/// A victim's write-back to a further member of its set, with the victim's process.
type VictimWrite = (Arc<ProcMemory>, Write);

/// Where one of several calls under way at once goes: the member, the size of its set, and
/// the process and first page of the pages it writes (none for the fetch itself).
type Target = (ComponentRef, usize, Option<(Arc<ProcMemory>, u64)>);

/// Attempts of one page operation while replica sets change under it (waits for a late
/// member not counted): at least this many, and more until [`SETTLE`] has passed.
const TRIES: usize = 8;

/// How long one page operation keeps trying while replica sets change under it: a backup
/// home that took over rebuilds the sets of every vRegion, and a fault meanwhile finds them
/// changing a few times in a few milliseconds; on a loaded machine the eight attempts used to
/// be spent before the new home had settled.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(3);

/// The attempts of one page operation: the second at once, later ones after a wait that
/// doubles from 1 ms up to 100 ms, until [`TRIES`] were made and [`SETTLE`] has passed.
struct Attempts {
    made: usize,
    t0: std::time::Instant,
    /// The last attempt waited for a late member already: the next one goes at once.
    waited: bool,
}

impl Attempts {
    fn new() -> Attempts {
        Attempts {
            made: 0,
            t0: std::time::Instant::now(),
            waited: false,
        }
    }

    /// Whether to make another attempt, after waiting as the ones made so far say.
    fn next(&mut self) -> bool {
        if std::mem::take(&mut self.waited) {
            return true;
        }
        if self.made >= TRIES && self.t0.elapsed() >= SETTLE {
            return false;
        }
        if self.made >= 2 {
            let ms = 1u64 << (self.made - 2).min(7);
            std::thread::sleep(std::time::Duration::from_millis(ms.min(100)));
        }
        self.made += 1;
        true
    }

    /// The last attempt failed on a late member and waited for it: it does not count.
    fn waited(&mut self) {
        self.waited = true;
    }
}

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

/// The page store of the vRegion replicas, reached over the cluster's transport.
pub struct RemoteStore {
    node: Arc<Node>,
    vregion_size: AtomicU64,
    procs: Mutex<HashMap<u64, Arc<ProcMemory>>>,
    pub one_sided: OneSided,
    /// Requests a batch of fetched pages is striped across (`links`).
    links: usize,
}

fn page(vpn: u64) -> u64 {
    vpn * PAGE_SIZE as u64
}

/// A fetched page, if it is what was written back. `Ok(None)`: it fails its checksum.
/// Why a fetch or a write-back of a process's heap pages failed.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error("mComponent {mcomp} at {addr} sent {bytes} bytes for heap page {page:#x}")]
    Size {
        mcomp: u32,
        addr: String,
        bytes: usize,
        page: u64,
    },
    #[error("mComponent {mcomp} at {addr} sent {sent} pages for {asked}")]
    Count {
        mcomp: u32,
        addr: String,
        sent: usize,
        asked: usize,
    },
    #[error("process {pid} belongs to another vNode")]
    OtherVnode { pid: u64 },
    #[error("process {pid} is not on this pComponent")]
    NotHere { pid: u64 },
    #[error("heap page {page:#x} is in no active vRegion")]
    Inactive { page: u64 },
    #[error("heap page {page:#x}: every mComponent that held a copy of it is lost")]
    AllCopiesLost { page: u64 },
    #[error("heap page {page:#x}: its replica sets kept changing")]
    SetsKeptChanging { page: u64 },
    /// A member's failure passed on with the code it failed with, so that a program sees
    /// the errno of the real cause.
    #[error("mComponent {mcomp} at {addr}: cannot {what} heap page {page:#x}: {cause}")]
    Call {
        mcomp: u32,
        addr: String,
        what: &'static str,
        page: u64,
        cause: RpcError,
    },
    #[error("mComponent {mcomp} at {addr} sent heap page {page:#x} changed since it was written back (it fails its checksum)")]
    Corrupt { mcomp: u32, addr: String, page: u64 },
    #[error("mComponent {mcomp} at {addr} sent heap page {page:#x} failing its checksum, and it cannot be rebuilt from the parity or backup: {cause}")]
    Unrebuildable {
        mcomp: u32,
        addr: String,
        page: u64,
        cause: RpcError,
    },
}

impl Refuse for PageError {
    fn code(&self) -> ErrCode {
        match self {
            PageError::Size { .. } | PageError::Count { .. } | PageError::Corrupt { .. } => ErrCode::Internal,
            PageError::OtherVnode { .. } => ErrCode::Denied,
            PageError::NotHere { .. } | PageError::Inactive { .. } => ErrCode::NotFound,
            PageError::AllCopiesLost { .. } | PageError::SetsKeptChanging { .. } => ErrCode::Unreachable,
            PageError::Call { cause, .. } | PageError::Unrebuildable { cause, .. } => cause.code(),
        }
    }
}

fn opened(o: &ComponentRef, vpn: u64, data: ByteBuf) -> Result<Option<Page>, PageError> {
    match unseal_page(data) {
        Ok(p) => Ok(Some(p)),
        Err(Unsealed::Size(n)) => Err(PageError::Size {
            mcomp: o.id,
            addr: o.addr.clone(),
            bytes: n,
            page: page(vpn),
        }),
        Err(Unsealed::Checksum) => {
            crate::series::CHECKSUM_FAILURES.increment(1);
            tracing::error!(owner = o.id, vpn, "a fetched page failed its checksum");
            Ok(None)
        }
    }
}

impl RemoteStore {
    /// `one_sided`: whether pages of owners on this host are reached by a copy.
    pub fn new(node: Arc<Node>, one_sided: bool, links: usize) -> RemoteStore {
        RemoteStore {
            one_sided: OneSided::new(node.clone(), one_sided),
            node,
            vregion_size: AtomicU64::new(1 << 30),
            procs: Mutex::new(HashMap::new()),
            links: links.max(1),
        }
    }

    /// The mComponents this pComponent's programs use: their homes, backup homes and the
    /// members of their vRegions' sets as last heard, each once.
    pub fn mcomponents(&self) -> Vec<ComponentRef> {
        let procs: Vec<Arc<ProcMemory>> = self.procs.lock().unwrap().values().cloned().collect();
        let mut all: Vec<ComponentRef> = Vec::new();
        for p in procs {
            let homes = p.homes.lock().unwrap();
            all.push(homes.home.clone());
            all.extend(homes.backup.clone());
            drop(homes);
            for set in p.view.lock().unwrap().vregions.values() {
                all.extend(set.owners.iter().cloned());
                all.extend(set.log.clone());
            }
        }
        all.sort_by_key(|c| c.id);
        all.dedup_by_key(|c| c.id);
        all
    }

    /// Whether [start, start + len) lies in vRegions the process has already (as its home
    /// last said): a mapping there costs the home no new vRegion.
    pub fn in_active_vregions(&self, mem: &ProcMemory, start: u64, len: u64) -> bool {
        let vrs = self.vregion_size.load(Relaxed);
        let Some(last) = start.checked_add(len).filter(|_| len > 0).map(|e| (e - 1) / vrs) else {
            return false;
        };
        let v = mem.view.lock().unwrap();
        (start / vrs..=last).all(|i| v.vregions.contains_key(&i))
    }

    pub fn set_vregion_size(&self, v: u64) {
        self.vregion_size.store(v, Relaxed);
    }

    pub fn attach(&self, pid: u64, memory: Arc<ProcMemory>) {
        self.procs.lock().unwrap().insert(pid, memory);
    }

    pub fn detach(&self, pid: u64) {
        self.procs.lock().unwrap().remove(&pid);
    }

    /// `M2P_HOME_MOVED`: the home of one of this pComponent's processes left (or was lost, and
    /// its backup took over) and gave it to another mComponent. Only an mComponent may say so (the transport's roles), and only of
    /// a process of the vNode it names.
    pub fn home_moved(&self, r: M2P_HOME_MOVED) -> Result<OK, Refusal> {
        let m = self.memory_of(r.who.pid)?;
        if m.who.vnode != r.who.vnode {
            return Err(PageError::OtherVnode { pid: r.who.pid }.into());
        }
        let mut homes = m.homes.lock().unwrap();
        // Only the current home gives the process away; a repeated word changes nothing.
        if homes.home.id != r.from {
            tracing::debug!(
                pid = r.who.pid,
                home = homes.home.id,
                from = r.from,
                "ignored a home move from an mComponent that is not the process's home"
            );
            return Ok(OK);
        }
        tracing::info!(
            pid = r.who.pid,
            from = r.from,
            to = r.home.id,
            "a process's home moved (its old home left, or was lost and its backup took over)"
        );
        crate::series::HOME_MOVES.increment(1);
        // The new home's backup, or none: the old one's copy names the old home.
        *homes = Homes {
            home: r.home,
            backup: r.backup,
        };
        Ok(OK)
    }

    fn memory_of(&self, pid: u64) -> Result<Arc<ProcMemory>, Refusal> {
        self.procs
            .lock()
            .unwrap()
            .get(&pid)
            .cloned()
            .ok_or_else(|| PageError::NotHere { pid }.into())
    }

    /// The one owner of page `vpn`'s vRegion, and its index, when a copy may reach the page
    /// there: a vRegion with one member, no parity and no log (those keep every copy and
    /// every change through their owners).
    fn sole_owner(&self, s: &ProcMemory, vpn: u64) -> Option<(ComponentRef, u64)> {
        let set = self.set_of(s, vpn).ok()?;
        let sole = set.distinct().len() == 1 && set.parity().is_none() && set.logger().is_none();
        sole.then(|| (set.holder(vpn).clone(), page(vpn) / self.vregion_size.load(Relaxed)))
    }

    fn read_direct(&self, s: &ProcMemory, vpn: u64) -> Option<Page> {
        if !self.one_sided.on() {
            return None;
        }
        let (o, idx) = self.sole_owner(s, vpn)?;
        self.one_sided.read(&s.who_now(), &s.leases, &o, idx, vpn)
    }

    fn write_direct(&self, s: &ProcMemory, vpn: u64, data: &[u8]) -> bool {
        if !self.one_sided.on() {
            return false;
        }
        let Some((o, idx)) = self.sole_owner(s, vpn) else {
            return false;
        };
        self.one_sided.write(&s.who_now(), &s.leases, &o, idx, vpn, data)
    }

    /// Asks the home for the process's replica sets (for a failure at page `vpn`).
    fn refresh(&self, s: &ProcMemory, vpn: u64) -> Result<(), Refusal> {
        let r = s
            .call_home(&self.node, P2M_VREGIONS { who: s.who.clone() })
            .map_err(|e| failed(&s.home(), "find the replicas of", vpn, e))?;
        s.learn(&r.owners, r.epoch, r.backup);
        Ok(())
    }

    /// The replica set of the vRegion holding `vpn`, from the cached view or the home.
    fn set_of(&self, s: &ProcMemory, vpn: u64) -> Result<VregionReplicas, Refusal> {
        let idx = page(vpn) / self.vregion_size.load(Relaxed);
        let cached = s.view.lock().unwrap().vregions.get(&idx).cloned();
        let set = match cached {
            Some(set) => set,
            None => {
                self.refresh(s, vpn)?;
                let v = s.view.lock().unwrap();
                v.vregions
                    .get(&idx)
                    .cloned()
                    .ok_or(PageError::Inactive { page: page(vpn) })?
            }
        };
        if set.owners.is_empty() {
            return Err(PageError::AllCopiesLost { page: page(vpn) }.into());
        }
        Ok(set)
    }

    /// Sends `pages` of one process to every replica that holds them.
    fn write_all(&self, s: &ProcMemory, pages: &[(u64, &[u8])]) -> Result<(), Refusal> {
        let rest: Vec<(u64, &[u8])> = pages
            .iter()
            .filter(|(v, d)| !self.write_direct(s, *v, d))
            .copied()
            .collect();
        let pages = &rest[..];
        let Some(&(first, _)) = pages.first() else {
            return Ok(());
        };
        let mut attempts = Attempts::new();
        'again: while attempts.next() {
            let who = s.who_now();
            let mut to: Vec<Write> = Vec::new();
            for (vpn, data) in pages {
                let set = self.set_of(s, *vpn)?;
                Write::add(&mut to, &set, &who, *vpn, seal_page(data), None);
            }
            // To every member at once: the write-back is done when all of them stored it.
            let (members, msgs): (Vec<(ComponentRef, usize)>, Vec<Msg>) =
                to.into_iter().map(|w| ((w.to.clone(), w.copies), w.msg())).unzip();
            let calls: Vec<(&str, &Msg)> = members
                .iter()
                .zip(&msgs)
                .map(|((o, _), m)| (o.addr.as_str(), m))
                .collect();
            let replies = self.node.rpc.call_all_direct(&calls);
            for ((o, copies), r) in members.iter().zip(replies) {
                if let Err(e) = stored(o, r) {
                    // Named by a page the member holds: the home acts on that page's vRegion
                    // (the batch's first may be in a set without it).
                    let vpn = pages
                        .iter()
                        .map(|(v, _)| *v)
                        .find(|v| {
                            self.set_of(s, *v)
                                .is_ok_and(|set| set.owners.iter().any(|m| m.id == o.id))
                        })
                        .unwrap_or(first);
                    match self.after(s, o, *copies, "write back", vpn, e) {
                        Next::Again => continue 'again,
                        Next::Waited => {
                            attempts.waited();
                            continue 'again;
                        }
                        Next::Fail(r) => return Err(r),
                    }
                }
            }
            return Ok(());
        }
        Err(PageError::SetsKeptChanging { page: page(first) }.into())
    }

    /// One page from the first replica that has a good copy (from its holder in a striped
    /// set, or rebuilt by the home from the parity when the holder's copy is bad).
    fn fetch_one(&self, s: &ProcMemory, vpn: u64) -> Result<Page, Refusal> {
        if let Some(p) = self.read_direct(s, vpn) {
            return Ok(p);
        }
        let mut attempts = Attempts::new();
        'again: while attempts.next() {
            let set = self.set_of(s, vpn)?;
            let who = s.who_now();
            let mut bad = Vec::new();
            let members = set.distinct().len();
            // A logger holds no pages, a striped set one copy: the home rebuilds a bad one.
            let rebuilt = set.parity().is_some() || set.logger().is_some();
            let holders: Vec<&ComponentRef> = match rebuilt {
                false => set.owners.iter().collect(),
                true => vec![set.holder(vpn)],
            };
            for o in holders {
                match self.node.rpc.call_direct(&o.addr, P2M_FETCH { who: who.clone(), vpn }) {
                    Ok(r) => match opened(o, vpn, r.data)? {
                        Some(p) => {
                            self.repair(&who, vpn, &p, &bad);
                            return Ok(p);
                        }
                        None => bad.push(o.clone()),
                    },
                    Err(e) => match self.after(s, o, members, "fetch", vpn, e) {
                        Next::Again => continue 'again,
                        Next::Waited => {
                            attempts.waited();
                            continue 'again;
                        }
                        Next::Fail(r) => return Err(r),
                    },
                }
            }
            if rebuilt {
                return self.reconstruct(s, vpn, &bad[0]);
            }
            return Err(corrupt(&bad[0], vpn));
        }
        Err(PageError::SetsKeptChanging { page: page(vpn) }.into())
    }

    /// The pages of a batched fetch from `o`, one per page asked for; a page failing its
    /// checksum is fetched again from the other replicas.
    fn pages_of(&self, s: &ProcMemory, o: &ComponentRef, vpns: &[u64], r: M2P_PAGES) -> Result<Vec<Page>, Refusal> {
        if r.pages.len() != vpns.len() {
            return Err(PageError::Count {
                mcomp: o.id,
                addr: o.addr.clone(),
                sent: r.pages.len(),
                asked: vpns.len(),
            }
            .into());
        }
        vpns.iter()
            .zip(r.pages)
            .map(|(v, d)| match opened(o, *v, d)? {
                Some(p) => Ok(p),
                None => self.fetch_one(s, *v),
            })
            .collect()
    }

    /// The victims of a fetch from `primary`, split: those that ride with it (whose primary
    /// it is), with their process's identity, and the write-backs to every other member of
    /// their sets, one message per member and process. Victims of processes that exited
    /// since they were evicted are garbage and stay behind.
    fn victim_writes(
        &self,
        primary: &ComponentRef,
        flushes: &[(u64, u64, &[u8])],
    ) -> Result<(Vec<Riding>, Vec<VictimWrite>), Refusal> {
        let mut along = Vec::new();
        let mut others: Vec<Write> = Vec::new();
        let mut memories: Vec<Arc<ProcMemory>> = Vec::new();
        for (fpid, fvpn, data) in flushes {
            let Ok(fs) = self.memory_of(*fpid) else { continue };
            let set = self.set_of(&fs, *fvpn)?;
            let who = fs.who_now();
            let sealed = seal_page(data);
            let rides = set.holder(*fvpn).id == primary.id;
            if rides {
                along.push((who.clone(), *fvpn, sealed.clone()));
            }
            Write::add(&mut others, &set, &who, *fvpn, sealed, rides.then_some(primary.id));
            if !memories.iter().any(|x| x.who.pid == *fpid) {
                memories.push(fs);
            }
        }
        let others = others
            .into_iter()
            .map(|w| {
                (
                    memories
                        .iter()
                        .find(|x| x.who.pid == w.who.pid)
                        .expect("added above")
                        .clone(),
                    w,
                )
            })
            .collect();
        Ok((along, others))
    }
}

/// Pages of one process on their way to one member of their sets.
struct Write {
    to: ComponentRef,
    copies: usize,
    who: Who,
    pages: Vec<(u64, ByteBuf)>,
}

impl Write {
    /// Adds page `vpn` of process `who` to the writes bound for every member of its set but
    /// `skip` (which a piggyback reached already).
    fn add(writes: &mut Vec<Write>, set: &VregionReplicas, who: &Who, vpn: u64, sealed: ByteBuf, skip: Option<u32>) {
        for o in set.writers(vpn).into_iter().filter(|o| Some(o.id) != skip) {
            match writes.iter_mut().find(|w| w.to.id == o.id && w.who.pid == who.pid) {
                Some(w) => w.pages.push((vpn, sealed.clone())),
                None => writes.push(Write {
                    to: o.clone(),
                    copies: set.distinct().len(),
                    who: who.clone(),
                    pages: vec![(vpn, sealed.clone())],
                }),
            }
        }
    }

    fn msg(mut self) -> Msg {
        match self.pages.len() {
            1 => {
                let (vpn, data) = self.pages.pop().expect("one page");
                P2M_FLUSH {
                    who: self.who,
                    vpn,
                    data,
                }
                .into()
            }
            _ => P2M_FLUSH_MANY {
                who: self.who,
                pages: self.pages,
            }
            .into(),
        }
    }
}

/// The reply of a write-back: `OK`, or why not.
fn stored(o: &ComponentRef, r: Result<Msg, RpcError>) -> Result<(), RpcError> {
    match r? {
        Msg::OK(_) => Ok(()),
        other => Err(RpcError::Protocol {
            addr: o.addr.clone(),
            request: "P2M_FLUSH",
            reply: other.name(),
        }),
    }
}

impl PageStore for RemoteStore {
    fn place(&self, pid: u64, vpn: u64) -> Result<Place, Refusal> {
        Ok(self.set_of(&*self.memory_of(pid)?, vpn)?.holder(vpn).id)
    }

    fn fetch(&self, pid: u64, vpn: u64) -> Result<Page, Refusal> {
        self.fetch_one(&*self.memory_of(pid)?, vpn)
    }

    fn flush(&self, pid: u64, vpn: u64, data: &[u8]) -> Result<(), Refusal> {
        self.write_all(&*self.memory_of(pid)?, &[(vpn, data)])
    }

    fn flush_fetch(&self, (fpid, fvpn, data): (u64, u64, &[u8]), (pid, vpn): (u64, u64)) -> Result<Page, Refusal> {
        let got = self.flush_fetch_many(&[(fpid, fvpn, data)], pid, &[vpn])?;
        Ok(got.into_iter().next().expect("one page asked"))
    }

    fn fetch_many(&self, pid: u64, vpns: &[u64]) -> Result<Vec<Page>, Refusal> {
        self.flush_fetch_many(&[], pid, vpns)
    }

    fn flush_fetch_many(&self, flushes: &[(u64, u64, &[u8])], pid: u64, vpns: &[u64]) -> Result<Vec<Page>, Refusal> {
        let s = self.memory_of(pid)?;
        // Victims and pages a copy reaches go no further; the rest by message, together (the
        // pages copied first, in the order asked, so only while no victim needs a message).
        let flushes: Vec<(u64, u64, &[u8])> = flushes
            .iter()
            .filter(|(fpid, fvpn, d)| !self.memory_of(*fpid).is_ok_and(|fs| self.write_direct(&fs, *fvpn, d)))
            .copied()
            .collect();
        let flushes = &flushes[..];
        let mut copied = Vec::new();
        let mut vpns = vpns;
        while let (true, Some((v, rest))) = (flushes.is_empty(), vpns.split_first()) {
            let Some(p) = self.read_direct(&s, *v) else { break };
            copied.push(p);
            vpns = rest;
        }
        let Some(&first) = vpns.first() else { return Ok(copied) };
        let mut attempts = Attempts::new();
        'again: while attempts.next() {
            let set = self.set_of(&s, first)?;
            let o = set.holder(first);
            let members = set.distinct().len();
            let (along, others) = self.victim_writes(o, flushes)?;
            let who = s.who_now();
            // Bonding: the batch cut into stripes, each on a link of its own; the victims ride
            // with the first.
            let mut stripes = vpns.chunks(vpns.len().div_ceil(self.links.min(vpns.len())));
            let head = stripes.next().expect("a batch has a page");
            let striped: Vec<Msg> = stripes
                .map(|v| {
                    P2M_FETCH_MANY {
                        who: who.clone(),
                        vpns: v.to_vec(),
                    }
                    .into()
                })
                .collect();
            let n_striped = striped.len();
            if n_striped > 0 {
                crate::series::FETCH_STRIPES.increment(n_striped as u64 + 1);
            }
            let (msg, what): (Msg, _) = match (&along[..], head) {
                ([], [vpn]) => (P2M_FETCH { who, vpn: *vpn }.into(), "fetch"),
                ([], _) => (
                    P2M_FETCH_MANY {
                        who,
                        vpns: head.to_vec(),
                    }
                    .into(),
                    "fetch",
                ),
                ([(fwho, fvpn, data)], [vpn]) => (
                    P2M_FLUSH_FETCH {
                        who,
                        fetch_vpn: *vpn,
                        flush_who: fwho.clone(),
                        flush_vpn: *fvpn,
                        data: data.clone(),
                    }
                    .into(),
                    "write back and fetch",
                ),
                _ => (
                    P2M_FLUSH_FETCH_MANY {
                        who,
                        vpns: head.to_vec(),
                        flushes: along.clone(),
                    }
                    .into(),
                    "write back and fetch",
                ),
            };
            // The fetch (with the victims riding along) and the victims' other copies, all
            // under way at once.
            let (targets, msgs): (Vec<Target>, Vec<Msg>) = std::iter::once(msg)
                .chain(striped)
                .map(|m| ((o.clone(), members, None), m))
                .chain(
                    others
                        .into_iter()
                        .map(|(fs, w)| ((w.to.clone(), w.copies, Some((fs, w.pages[0].0))), w.msg())),
                )
                .unzip();
            let calls: Vec<(&str, &Msg)> = targets
                .iter()
                .zip(&msgs)
                .map(|((t, _, _), m)| (t.addr.as_str(), m))
                .collect();
            let mut replies = self.node.rpc.call_all_direct(&calls).into_iter();
            let fetched: Vec<Result<Msg, RpcError>> = (&mut replies).take(1 + n_striped).collect();
            for ((t, copies, w), r) in targets.iter().skip(1 + n_striped).zip(replies) {
                let (fs, fvpn) = w.as_ref().expect("every write but the fetch names its process");
                if let Err(e) = stored(t, r) {
                    match self.after(fs, t, *copies, "write back", *fvpn, e) {
                        Next::Again => continue 'again,
                        Next::Waited => {
                            attempts.waited();
                            continue 'again;
                        }
                        Next::Fail(r) => return Err(r),
                    }
                }
            }
            // The stripes' pages in the order asked; the first failure stands for the batch.
            let r = match fetched.into_iter().try_fold(
                M2P_PAGES {
                    pages: Vec::with_capacity(vpns.len()),
                },
                |mut all, m| {
                    match m? {
                        Msg::M2P_PAGES(p) => all.pages.extend(p.pages),
                        Msg::M2P_PAGE(p) => all.pages.push(p.data),
                        other => {
                            return Err(RpcError::Protocol {
                                addr: o.addr.clone(),
                                request: "P2M_FETCH",
                                reply: other.name(),
                            })
                        }
                    }
                    Ok(all)
                },
            ) {
                Ok(r) => r,
                Err(e) if matches!(e.code(), ErrCode::NoMemory | ErrCode::ParityLost) && !along.is_empty() => {
                    // A victim riding along found the owner full (its vRegion moves), or its
                    // change could not reach its set's parity member (which is reported).
                    for (fwho, fvpn, _) in &along {
                        let Ok(fs) = self.memory_of(fwho.pid) else { continue };
                        if let Next::Fail(r) = self.after(&fs, o, members, "write back", *fvpn, e.clone()) {
                            return Err(r);
                        }
                    }
                    continue 'again;
                }
                Err(e) if e.code() == ErrCode::Stale && !along.is_empty() => {
                    // A victim of another process may be the stale one: every process in the
                    // request learns its sets again.
                    tracing::debug!(error = %e, "a write-back riding with a fetch was refused as stale");
                    for (fpid, fvpn, _) in flushes {
                        if let Ok(fs) = self.memory_of(*fpid) {
                            self.refresh(&fs, *fvpn)?;
                        }
                    }
                    self.refresh(&s, first)?;
                    continue 'again;
                }
                Err(e) => match self.after(&s, o, members, what, first, e) {
                    Next::Again => continue 'again,
                    Next::Waited => {
                        attempts.waited();
                        continue 'again;
                    }
                    Next::Fail(r) => return Err(r),
                },
            };
            copied.extend(self.pages_of(&s, o, vpns, r)?);
            return Ok(copied);
        }
        Err(PageError::SetsKeptChanging { page: page(first) }.into())
    }

    fn flush_many(&self, pid: u64, pages: &[(u64, &[u8])]) -> Result<(), Refusal> {
        self.write_all(&*self.memory_of(pid)?, pages)
    }
}
