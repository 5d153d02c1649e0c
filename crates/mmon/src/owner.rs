//! The owner side of an mComponent: for each process with memory in a vRegion this
//! mComponent owns, the vma tree of that part of the process and its pages; the ExCache's
//! fetches and flushes land here (`P2M_FETCH`, `P2M_FLUSH`, `P2M_FLUSH_FETCH` and the
//! batched forms), and so do the home's requests (`M2M_*`).
//!
//! With strict overcommit, memory is accounted when a mapping becomes writable, never when a
//! page is flushed, so a flush can never fail for lack of space. With heuristic overcommit
//! (the default) pages are charged as they are stored; a write-back that finds its owner full
//! is refused, and the home moves the vRegion to an mComponent with room.
//!
//! In a striped (erasure-coded) set the owner of a page also keeps the set's parity honest:
//! every change of a page it stores or frees (old XOR new) is forwarded to the parity member
//! (`M2M_PARITY`) before the write-back is answered, outside the process's lock, so that two
//! owners that are each other's parity never wait on each other. A change of epoch waits
//! until no forward of the old epoch is under way ([`Mem::set_epoch`]): a rebuild that reads
//! the pages and the parity then sees them agree.
//!
//! The logger of a logged set keeps no pages of it: what would be stored or freed there is
//! appended to the backup log instead ([`super::log`]); made primary, it replays the backup.
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use super::log::{Logged, Op, COPY_WAIT};
use super::pages::Pages;
use super::room::Room;
use super::{Mem, Peers, PAGE};
use splitos_core::vma::{Vma, VmaMap};

/// A parity row, sealed as a page is ([`SEALED_PAGE`]); the owner keeps pages as they were
/// written back, checksum included, and returns them without looking at them ([`Pages`]).
type Page = Box<[u8; SEALED_PAGE]>;

const PROT_WRITE: u32 = 2;

/// A page to store must be sealed ([`SEALED_PAGE`] bytes); its seal is the fetcher's to check.
fn sealed_size(data: &[u8]) -> Result<(), Refusal> {
    if data.len() != SEALED_PAGE {
        return Err(ERR::new(
            ErrCode::Invalid,
            format!("a sealed page is {SEALED_PAGE} bytes, got {}", data.len()),
        ));
    }
    Ok(())
}

/// A change of a page of a striped set, bound for its set's parity member.
struct Delta {
    to: ComponentRef,
    vpn: u64,
    /// Old XOR new (sealed bytes; a page never written counts as zeros).
    d: ByteBuf,
    /// For a page stored by a write-back: whether there was none before. A write-back whose
    /// change the parity refuses (it is at a newer epoch) is undone, so that page and parity
    /// still agree when the sender writes again on the new sets.
    undo: Option<bool>,
}

type Deltas = Vec<Delta>;

/// Changes per `M2M_PARITY` message, well inside a frame's bound.
const PARITY_BATCH: usize = 128;

/// `a` XOR= `b`, both sealed pages.
fn xor_into(a: &mut [u8], b: &[u8]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x ^= y;
    }
}

/// Owner state of one process: its vmas and pages in vRegions this mComponent owns.
pub(super) struct OwnerProc {
    pub pid: u64,
    pub vnode: String,
    /// The pComponent that created the process ([`super::may_act`]).
    creator: Option<[u8; 32]>,
    vmas: VmaMap,
    pub pages: Pages,
    /// Parity rows of striped sets this mComponent is parity member of, keyed by the first
    /// page of the row. A row whose parity is all zeros is not kept.
    pub parity: BTreeMap<u64, Page>,
    /// The striped sets of the process's vRegions this mComponent is a member of, by index.
    pub(super) sets: BTreeMap<u64, VregionReplicas>,
    /// The vRegions this mComponent is the logger of, by index.
    pub logs: BTreeMap<u64, Logged>,
    pub committed: u64,
    /// Its vNode's memory quota, which this mComponent keeps room for while it holds the
    /// process ([`super::room`]).
    quota: Option<u64>,
    /// Write-backs of an older epoch of the process are refused ([`Who::epoch`]).
    pub epoch: u64,
    /// Parity forwards under way (each counted while its lock is held).
    forwarding: u32,
}

impl OwnerProc {
    fn new(pid: u64, vnode: &str, creator: Option<[u8; 32]>, epoch: u64, vregion_size: u64) -> OwnerProc {
        OwnerProc {
            pid,
            vnode: vnode.to_string(),
            creator,
            vmas: VmaMap::default(),
            pages: Pages::new(vregion_size),
            parity: BTreeMap::new(),
            sets: BTreeMap::new(),
            logs: BTreeMap::new(),
            committed: 0,
            quota: None,
            epoch,
            forwarding: 0,
        }
    }

    /// Whether a vma of the process overlaps [start, end).
    pub(super) fn has_memory_in(&self, start: u64, end: u64) -> bool {
        self.vmas.iter().any(|(s, v)| s < end && v.end > start)
    }

    /// The vRegion of page `vpn`, if this mComponent is its logger.
    fn logged(&self, vpn: u64, vrs: u64) -> Option<u64> {
        let idx = vpn * PAGE / vrs;
        self.logs.contains_key(&idx).then_some(idx)
    }

    /// The backup file of vRegion `index` of the process.
    pub fn file(&self, index: u64) -> LogFile {
        LogFile {
            vnode: self.vnode.clone(),
            pid: self.pid,
            index,
        }
    }

    /// Pages and parity rows held: what the process takes of this mComponent's memory.
    /// Whether it still holds anything of the process: a mapping, a page or a parity row.
    pub fn holds(&self) -> bool {
        self.vmas.iter().next().is_some() || self.held() > 0
    }

    pub fn held(&self) -> u64 {
        (self.pages.len() + self.parity.len()) as u64 * PAGE
    }

    /// The striped set page `vpn` belongs to, if it is in one.
    fn striped(&self, vpn: u64, vrs: u64) -> Option<&VregionReplicas> {
        self.sets.get(&(vpn * PAGE / vrs)).filter(|s| s.data > 0)
    }

    /// The change of page `vpn` from what is stored to `new` (none: freed), for the parity
    /// member of its set; none outside striped sets.
    fn delta(&self, vpn: u64, new: Option<&[u8]>, vrs: u64) -> Option<Delta> {
        let to = self.striped(vpn, vrs)?.parity()?.clone();
        let mut d = vec![0u8; SEALED_PAGE];
        let old = self.pages.get(vpn);
        if let Some(old) = &old {
            d.copy_from_slice(old);
        }
        if let Some(new) = new {
            xor_into(&mut d, new);
        }
        let undo = new.map(|_| old.is_none());
        d.iter().any(|b| *b != 0).then(|| Delta {
            to,
            vpn,
            d: ByteBuf::from(d),
            undo,
        })
    }

    /// Undoes the stores of a write-back whose changes the parity refused.
    fn undo(&mut self, deltas: &[Delta], room: &Room) {
        for x in deltas {
            match x.undo {
                Some(true) if self.pages.remove(x.vpn) => {
                    room.free_pages(&self.vnode, PAGE);
                }
                Some(true) => {}
                Some(false) => {
                    self.pages.modify(x.vpn, |pg| xor_into(pg, &x.d));
                }
                None => {}
            }
        }
    }

    /// Refuses a write-back sent for replica sets that have changed since.
    pub(super) fn current(&self, who: &Who) -> Result<(), Refusal> {
        if who.epoch < self.epoch {
            metrics::counter!("mcomp_stale_writes_refused_total").increment(1);
            return Err(ERR::new(
                ErrCode::Stale,
                format!(
                    "process {} is at epoch {}, the write-back was sent for epoch {}",
                    who.pid, self.epoch, who.epoch
                ),
            ));
        }
        Ok(())
    }

    fn page_in_vma(&self, vpn: u64) -> Result<(), Refusal> {
        self.vmas
            .find(vpn * PAGE)
            .map(|_| ())
            .ok_or_else(|| ERR::new(ErrCode::Invalid, format!("page {:#x} is not mapped", vpn * PAGE)))
    }

    fn load_page(&self, vpn: u64, vrs: u64) -> Result<ByteBuf, Refusal> {
        // Not mapped here: its vRegion may have moved to another member (a detach, or
        // rebalancing) since the fetcher's view of the sets, so the fetcher asks the home for
        // them and tries again (a page mapped nowhere still fails, after a few tries).
        self.page_in_vma(vpn).map_err(|e| ERR::new(ErrCode::Stale, e.msg))?;
        if let Some(idx) = self.logged(vpn, vrs) {
            return Err(ERR::new(
                ErrCode::Stale,
                format!(
                    "this mComponent keeps the backup log of vRegion {idx} of process {}, not its pages",
                    self.pid
                ),
            ));
        }
        Ok(match self.pages.get(vpn) {
            Some(pg) => ByteBuf::from(pg),
            None => sealed_zero_page(),
        })
    }
}

impl<P: Peers> Mem<P> {
    pub(super) fn owner_proc(&self, who: &Who) -> Result<Arc<Mutex<OwnerProc>>, Refusal> {
        let p = self.owned.lock().unwrap().get(&who.pid).cloned();
        let p = p.ok_or_else(|| {
            ERR::new(
                ErrCode::NotFound,
                format!("process {} has no memory on mComponent {}", who.pid, self.peers.id()),
            )
        })?;
        let (vnode, creator) = {
            let g = p.lock().unwrap();
            (g.vnode.clone(), g.creator)
        };
        if vnode != who.vnode {
            self.c.denied.fetch_add(1, Relaxed);
            metrics::counter!("mcomp_denied_total").increment(1);
            static THEIRS: splitos_rpc::refusals::Refusals =
                splitos_rpc::refusals::Refusals::new("refused a request for another vNode's pages");
            if THEIRS.log_this(format_args!("vNode {}", who.vnode)) {
                tracing::warn!(pid = who.pid, owner_vnode = %vnode, asked_by = %who.vnode, "refused a request for another vNode's pages");
            }
            return Err(ERR::new(
                ErrCode::Denied,
                format!("process {} belongs to another vNode", who.pid),
            ));
        }
        self.may_act(who.pid, creator)?;
        Ok(p)
    }

    /// The owner state of a process its home names (made if new here), moved to the home's
    /// epoch, with its vNode's `quota` kept for it; refused when the id is another vNode's or
    /// pComponent's process.
    fn owner_from_home(
        &self,
        who: &Who,
        creator: Option<[u8; 32]>,
        quota: Option<u64>,
    ) -> Result<Arc<Mutex<OwnerProc>>, Refusal> {
        let p = self
            .owned
            .lock()
            .unwrap()
            .entry(who.pid)
            .or_insert_with(|| {
                Arc::new(Mutex::new(OwnerProc::new(
                    who.pid,
                    &who.vnode,
                    creator,
                    who.epoch,
                    self.vrs(),
                )))
            })
            .clone();
        let mut g = p.lock().unwrap();
        if g.vnode != who.vnode || g.creator != creator {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(ERR::new(ErrCode::Denied, "process belongs to another vNode"));
        }
        g.epoch = g.epoch.max(who.epoch);
        if let (None, Some(q)) = (g.quota, quota) {
            g.quota = Some(q);
            self.room.hold(&g.vnode, q);
        }
        drop(g);
        Ok(p)
    }

    /// Lets go of all that process `g` takes here (it exited, or this mComponent was fenced).
    pub(super) fn let_go(&self, g: &OwnerProc) {
        self.room.uncommit(&g.vnode, g.committed);
        self.room.free_pages(&g.vnode, g.held());
        if g.quota.is_some() {
            self.room.unhold(&g.vnode);
        }
        self.freed.fetch_add(g.parity.len() as u64 * PAGE, Relaxed);
    }

    /// Promises `bytes` to writable mappings of `vnode` (strict overcommit).
    pub(super) fn commit(&self, vnode: &str, bytes: u64) -> Result<(), Refusal> {
        if !self.room.commit(vnode, bytes) {
            self.c.oom.fetch_add(1, Relaxed);
            metrics::counter!("mcomp_out_of_memory_total").increment(1);
            return Err(ERR::new(
                ErrCode::NoMemory,
                format!(
                    "mComponent {} is out of memory ({} of {} bytes taken, {bytes} more asked)",
                    self.peers.id(),
                    self.room.taken(),
                    self.capacity
                ),
            ));
        }
        Ok(())
    }

    /// Drops the pages of [start, end); in striped sets their contents go to the parity as
    /// changes to zero (returned, to forward once the lock is released).
    fn free_pages(&self, p: &mut OwnerProc, start: u64, end: u64) -> Deltas {
        let vrs = self.vrs();
        if end > start {
            let logged: Vec<u64> = p.logs.range(start / vrs..=(end - 1) / vrs).map(|(i, _)| *i).collect();
            for idx in logged {
                let (s, e) = (start.max(idx * vrs), end.min((idx + 1) * vrs));
                self.log_op(
                    p,
                    idx,
                    LogRecord::Discard {
                        start: s / PAGE,
                        end: e / PAGE,
                    },
                );
            }
        }
        let vrs = self.vrs();
        let deltas: Deltas = p
            .pages
            .keys(start / PAGE..end / PAGE)
            .filter_map(|v| p.delta(v, None, vrs))
            .collect();
        let n = p.pages.remove_range(start / PAGE..end / PAGE);
        self.room.free_pages(&p.vnode, n * PAGE);
        deltas
    }

    /// Sends the changes of striped pages to their parity members, counted as under way in
    /// `p` until they are applied (the caller counted them while holding its lock).
    fn forward(&self, p: &Mutex<OwnerProc>, who: &Who, deltas: Deltas) -> Result<(), Refusal> {
        // One message per member and batch: a large munmap frees more pages than a frame holds.
        let mut by_member: Vec<(ComponentRef, Deltas)> = Vec::new();
        for x in deltas {
            match by_member
                .iter_mut()
                .find(|(m, v)| m.id == x.to.id && v.len() < PARITY_BATCH)
            {
                Some((_, v)) => v.push(x),
                None => by_member.push((x.to.clone(), vec![x])),
            }
        }
        let mut out = Ok(());
        for (o, batch) in by_member {
            let msg = M2M_PARITY {
                who: who.clone(),
                deltas: batch.iter().map(|x| (x.vpn, x.d.clone())).collect(),
            };
            // On this thread's own channel: the parity member serves it on a receiving thread
            // no other request waits on, so two owners forwarding to each other never block.
            let sent = match o.id == self.peers.id() {
                true => self.to_owner(&o, msg).map(|_| ()),
                false => self.peers.call_direct(&o.addr, msg).map(|_| ()).map_err(Refusal::from),
            };
            match sent {
                Ok(()) => metrics::counter!("mcomp_parity_deltas_sent_total").increment(batch.len() as u64),
                Err(e) if e.code == ErrCode::Stale => {
                    p.lock().unwrap().undo(&batch, &self.room);
                    out = Err(e);
                }
                Err(e) => {
                    tracing::warn!(pid = who.pid, parity = o.id, error = %e, "cannot forward page changes to the parity member");
                    let code = if matches!(e.code, ErrCode::Unreachable | ErrCode::NotFound) {
                        ErrCode::ParityLost
                    } else {
                        e.code
                    };
                    out = Err(ERR::new(
                        code,
                        format!(
                            "mComponent {} at {}, the parity member, did not take the pages' changes: {}",
                            o.id, o.addr, e.msg
                        ),
                    ));
                }
            }
        }
        p.lock().unwrap().forwarding -= 1;
        out
    }

    /// Releases `g` and forwards `deltas`; a request that stored or freed pages of striped
    /// sets is answered only after this.
    fn release_and_forward(
        &self,
        p: &Mutex<OwnerProc>,
        mut g: std::sync::MutexGuard<'_, OwnerProc>,
        who: &Who,
        deltas: Deltas,
    ) -> Result<(), Refusal> {
        if deltas.is_empty() {
            return Ok(());
        }
        g.forwarding += 1;
        drop(g);
        self.forward(p, who, deltas)
    }

    fn uncommit(&self, p: &mut OwnerProc, gone: &[(u64, Vma)]) {
        let bytes: u64 = gone.iter().filter(|(_, v)| v.accounted).map(|(s, v)| v.end - s).sum();
        p.committed -= bytes;
        self.room.uncommit(&p.vnode, bytes);
    }

    /// Appends `record` to the backup log of vRegion `idx`; a log without room skips it, and
    /// the vRegion is unprotected until copied again.
    fn log_op(&self, p: &mut OwnerProc, idx: u64, record: LogRecord) {
        let file = p.file(idx);
        let Some(l) = p.logs.get_mut(&idx) else { return };
        if l.skipped == 0 && self.backup_log.push(&l.scomp, file, l.epoch, Op::Record(record), None) {
            return;
        }
        if l.skipped == 0 {
            metrics::counter!("mcomp_log_unprotected_vregions_total").increment(1);
            tracing::warn!(pid = p.pid, vregion = idx, "backup log full (the sComponent is slower than the write-backs): vRegion unprotected until its primary copies it here again");
        }
        // Once one write-back is missing, logging more cannot make the backup whole.
        l.skipped += 1;
        self.backup_log.skipped_one();
    }

    /// Stores a page; its change, when it is in a striped set, is added to `deltas`. A logger
    /// appends it to its log instead (waiting up to `wait` for room).
    fn store(&self, p: &mut OwnerProc, vpn: u64, data: &[u8], deltas: &mut Deltas) -> Result<(), Refusal> {
        self.store_or_wait(p, vpn, data, deltas, None)
    }

    fn store_or_wait(
        &self,
        p: &mut OwnerProc,
        vpn: u64,
        data: &[u8],
        deltas: &mut Deltas,
        wait: Option<std::time::Duration>,
    ) -> Result<(), Refusal> {
        sealed_size(data)?;
        p.page_in_vma(vpn)?;
        if let Some(idx) = p.logged(vpn, self.vrs()) {
            let record = LogRecord::Page {
                vpn,
                data: ByteBuf::from(data.to_vec()),
            };
            let Some(wait) = wait else {
                self.log_op(p, idx, record);
                return Ok(());
            };
            // A copy fails rather than skips: the home tries it again, and the backup is
            // whole only once a copy got through.
            let file = p.file(idx);
            let l = &p.logs[&idx];
            if !self
                .backup_log
                .push(&l.scomp, file, l.epoch, Op::Record(record), Some(wait))
            {
                return Err(ERR::new(
                    ErrCode::Unreachable,
                    format!(
                        "the backup log of vRegion {idx} has had no room for {} s: its sComponent does not take it",
                        wait.as_secs()
                    ),
                ));
            }
            return Ok(());
        }
        // Heuristic overcommit charges pages as they arrive: a new page that fits neither in
        // what is kept for its vNode nor in what no vNode took or kept is refused, and the
        // pComponent has the home move the vRegion to an mComponent with room.
        let new = !p.pages.contains(vpn);
        if new && !self.charges_mappings() {
            if !self.room.take_pages(&p.vnode, PAGE) {
                self.c.oom.fetch_add(1, Relaxed);
                metrics::counter!("mcomp_full_writes_total").increment(1);
                return Err(ERR::new(
                    ErrCode::NoMemory,
                    format!(
                        "mComponent {} is full ({} of {} bytes hold pages or are kept for vNodes' quotas)",
                        self.peers.id(),
                        self.room.taken(),
                        self.capacity
                    ),
                ));
            }
        } else if new {
            self.room.add_pages(&p.vnode, PAGE);
        }
        deltas.extend(p.delta(vpn, Some(data), self.vrs()));
        if let Err(e) = p.pages.insert(vpn, data) {
            if new {
                self.room.free_pages(&p.vnode, PAGE);
            }
            return Err(e);
        }
        Ok(())
    }

    /// Fault injection: a bit of a stored page flips, as in a memory error.
    pub(super) fn debug_flip(&self, r: C2M_DEBUG_FLIP) -> Result<M2C_FLIPPED, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = p.lock().unwrap();
        let vpn = g.pages.keys(r.from_vpn..u64::MAX).next().ok_or_else(|| {
            ERR::new(
                ErrCode::NotFound,
                format!(
                    "process {} has no page at or after {:#x} here",
                    r.who.pid,
                    r.from_vpn * PAGE
                ),
            )
        })?;
        let bit = r.bit as usize % (PAGE_SIZE * 8);
        g.pages.modify(vpn, |page| page[bit / 8] ^= 1 << (bit % 8));
        tracing::warn!(
            pid = r.who.pid,
            vpn,
            bit,
            "flipped a bit of a stored page (fault injection)"
        );
        Ok(M2C_FLIPPED { vpn })
    }

    pub(super) fn fetch(&self, r: P2M_FETCH) -> Result<M2P_PAGE, Refusal> {
        let p = self.owner_proc(&r.who)?;
        self.c.fetches.fetch_add(1, Relaxed);
        let data = p.lock().unwrap().load_page(r.vpn, self.vrs())?;
        Ok(M2P_PAGE { data })
    }

    pub(super) fn flush(&self, r: P2M_FLUSH) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = p.lock().unwrap();
        g.current(&r.who)?;
        self.c.flushes.fetch_add(1, Relaxed);
        let mut deltas = Deltas::new();
        self.store(&mut g, r.vpn, &r.data, &mut deltas)?;
        self.release_and_forward(&p, g, &r.who, deltas)?;
        Ok(OK)
    }

    /// Stores the dirty victim that rides along with a fetch. The victim's process may have
    /// exited since it was evicted: its page is garbage then, and the fetch must not fail for it.
    fn store_piggybacked(&self, who: &Who, vpn: u64, data: &[u8]) -> Result<(), Refusal> {
        match self.owner_proc(who) {
            Ok(victim) => {
                let mut g = victim.lock().unwrap();
                g.current(who)?;
                self.c.flushes.fetch_add(1, Relaxed);
                self.c.piggybacked.fetch_add(1, Relaxed);
                let mut deltas = Deltas::new();
                self.store(&mut g, vpn, data, &mut deltas)?;
                self.release_and_forward(&victim, g, who, deltas)
            }
            Err(e) if e.code == ErrCode::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub(super) fn flush_fetch(&self, r: P2M_FLUSH_FETCH) -> Result<M2P_PAGE, Refusal> {
        let p = self.owner_proc(&r.who)?;
        self.store_piggybacked(&r.flush_who, r.flush_vpn, &r.data)?;
        self.c.fetches.fetch_add(1, Relaxed);
        let data = p.lock().unwrap().load_page(r.fetch_vpn, self.vrs())?;
        Ok(M2P_PAGE { data })
    }

    pub(super) fn flush_fetch_many(&self, r: P2M_FLUSH_FETCH_MANY) -> Result<M2P_PAGES, Refusal> {
        self.owner_proc(&r.who)?;
        for (who, vpn, data) in &r.flushes {
            self.store_piggybacked(who, *vpn, data)?;
        }
        self.fetch_many(P2M_FETCH_MANY {
            who: r.who,
            vpns: r.vpns,
        })
    }

    pub(super) fn fetch_many(&self, r: P2M_FETCH_MANY) -> Result<M2P_PAGES, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let g = p.lock().unwrap();
        let vrs = self.vrs();
        let pages = r
            .vpns
            .iter()
            .map(|v| g.load_page(*v, vrs))
            .collect::<Result<Vec<_>, _>>()?;
        self.c.fetches.fetch_add(pages.len() as u64, Relaxed);
        Ok(M2P_PAGES { pages })
    }

    pub(super) fn flush_many(&self, r: P2M_FLUSH_MANY) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = p.lock().unwrap();
        g.current(&r.who)?;
        // All or nothing: a batch with a page outside the process's vmas stores none of it.
        for (vpn, data) in &r.pages {
            sealed_size(data)?;
            g.page_in_vma(*vpn)?;
        }
        let mut deltas = Deltas::new();
        let stored = r
            .pages
            .iter()
            .try_for_each(|(vpn, data)| self.store(&mut g, *vpn, data, &mut deltas));
        self.c.flushes.fetch_add(r.pages.len() as u64, Relaxed);
        // What was stored before a refusal has changed: its parity must follow.
        self.release_and_forward(&p, g, &r.who, deltas)?;
        stored.map(|()| OK)
    }

    pub(super) fn vma_add(&self, r: M2M_VMA_ADD) -> Result<OK, Refusal> {
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
        let p = match self.owner_from_home(&who, creator, quota) {
            Ok(p) => p,
            Err(e) => {
                if accounted {
                    self.room.uncommit(&who.vnode, end - start);
                }
                return Err(e);
            }
        };
        let mut g = p.lock().unwrap();
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

    pub(super) fn vma_remove(&self, r: M2M_VMA_REMOVE) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = p.lock().unwrap();
        g.pages.revoke();
        let gone = g.vmas.remove_range(r.start, r.end);
        self.uncommit(&mut g, &gone);
        let deltas = self.free_pages(&mut g, r.start, r.end);
        self.release_and_forward(&p, g, &r.who, deltas)?;
        Ok(OK)
    }

    pub(super) fn vma_protect(&self, r: M2M_VMA_PROTECT) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = p.lock().unwrap();
        let parts = g.vmas.carve(r.start, r.end);
        let writable = r.prot & PROT_WRITE != 0 && self.charges_mappings();
        if writable {
            let need: u64 = parts.iter().filter(|(_, v)| !v.accounted).map(|(s, v)| v.end - s).sum();
            self.commit(&r.who.vnode, need)?;
            g.committed += need;
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

    pub(super) fn discard(&self, r: M2M_DISCARD) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = p.lock().unwrap();
        g.pages.revoke();
        let deltas = self.free_pages(&mut g, r.start, r.end);
        self.release_and_forward(&p, g, &r.who, deltas)?;
        Ok(OK)
    }

    /// Refuses older write-backs from now on, and answers once none of them is still
    /// forwarding its changes to a parity member.
    pub(super) fn set_epoch(&self, r: M2M_EPOCH) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        loop {
            let mut g = p.lock().unwrap();
            g.pages.revoke();
            g.epoch = g.epoch.max(r.who.epoch);
            if g.forwarding == 0 {
                return Ok(OK);
            }
            drop(g);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    pub(super) fn read_pages(&self, r: M2M_READ_PAGES) -> Result<M2M_PAGES, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let g = p.lock().unwrap();
        // What is read must not change under the reader (a rebuild, mremap copying it).
        g.pages.revoke();
        let max = r.max as usize;
        let vrs = self.vrs();
        if max > 0 && !r.parity && r.end > r.from {
            if let Some(idx) = g.logged(r.from / PAGE, vrs).filter(|i| (r.end - 1) / vrs == *i) {
                // A logger answers from its backup (a page rebuilt after a bad copy).
                let l = g.logs[&idx].clone();
                if !l.protects() {
                    return Err(ERR::new(ErrCode::Unreachable, format!("the backup of vRegion {idx} is not whole (its log skipped {} records, or the copy that starts it is not complete)", l.skipped)));
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
                return Err(ERR::new(
                    ErrCode::Invalid,
                    format!(
                        "{:#x}..{:#x} spans vRegions this mComponent keeps backup logs of",
                        r.from, r.end
                    ),
                ));
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

    pub(super) fn put_pages(&self, r: M2M_PUT_PAGES) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = p.lock().unwrap();
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
    pub(super) fn member_set(&self, r: M2M_SET) -> Result<OK, Refusal> {
        let M2M_SET {
            who,
            set,
            creator,
            home,
            log,
        } = r;
        if set.data > 0 && set.owners.len() != set.data as usize + 1 {
            return Err(ERR::new(
                ErrCode::Invalid,
                format!(
                    "a striped set of {} data members has {} members",
                    set.data,
                    set.owners.len()
                ),
            ));
        }
        if set.log.is_some() && (set.data > 0 || set.owners.is_empty() || set.owners.len() > 2) {
            return Err(ERR::new(
                ErrCode::Invalid,
                format!(
                    "a logged set has a primary and a logger, not {} members",
                    set.owners.len()
                ),
            ));
        }
        if set.log.is_some() {
            return self.set_logged(who, set, creator, home, log);
        }
        if set.data > 0 {
            Replication::Ec { data: set.data }
                .check_vregion_size(self.vrs())
                .map_err(|e| ERR::new(ErrCode::Invalid, e))?;
        }
        let p = self.owner_from_home(&who, creator, None)?;
        let mut g = p.lock().unwrap();
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
    fn set_logged(
        &self,
        who: Who,
        set: VregionReplicas,
        creator: Option<[u8; 32]>,
        home: ComponentRef,
        step: LogStep,
    ) -> Result<OK, Refusal> {
        let p = self.owner_from_home(&who, creator, None)?;
        let mut g = p.lock().unwrap();
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
                LogStep::Whole => l.whole = true,
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
    fn promote(&self, g: &mut OwnerProc, idx: u64) -> Result<u64, Refusal> {
        let l = g.logs.get(&idx).cloned().expect("checked by the caller");
        if !l.protects() {
            metrics::counter!("mcomp_log_promotions_refused_total").increment(1);
            return Err(ERR::new(
                ErrCode::Unreachable,
                format!(
                    "the backup of vRegion {idx} of process {} is not whole (its log skipped {} records while full, or its first copy did not complete): the vRegion's pages were on its lost primary alone",
                    g.pid, l.skipped
                ),
            ));
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
            self.c.oom.fetch_add(1, Relaxed);
            return Err(ERR::new(
                ErrCode::NoMemory,
                format!(
                    "mComponent {} has no room for the {n} pages of vRegion {idx} it kept the backup of",
                    self.peers.id()
                ),
            ));
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
        self.c.promoted.fetch_add(n, Relaxed);
        metrics::counter!("mcomp_log_promoted_pages_total").increment(n);
        Ok(n)
    }

    /// Page changes from the owners of a striped set this mComponent is parity member of.
    pub(super) fn parity(&self, r: M2M_PARITY) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = p.lock().unwrap();
        // A change from a member the home has not told of the new sets (it was cut off from
        // the home, and its place rebuilt elsewhere) must not reach the parity: the sender
        // undoes its store and the pComponent writes again on the new sets.
        g.current(&r.who)?;
        let vrs = self.vrs();
        for (vpn, d) in &r.deltas {
            sealed_size(d)?;
            let row = g.striped(*vpn, vrs).map(|s| s.row(*vpn)).ok_or_else(|| {
                ERR::new(
                    ErrCode::Invalid,
                    format!("page {:#x} is in no striped set here", vpn * PAGE),
                )
            })?;
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
        self.c.parity_deltas.fetch_add(r.deltas.len() as u64, Relaxed);
        metrics::counter!("mcomp_parity_deltas_applied_total").increment(r.deltas.len() as u64);
        Ok(OK)
    }

    pub(super) fn owner_fork(&self, r: M2M_FORK) -> Result<OK, Refusal> {
        let M2M_FORK {
            parent,
            child,
            start,
            end,
        } = r;
        let p = self.owner_proc(&parent)?;
        let g = p.lock().unwrap();
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
        let mut c = cp.lock().unwrap();
        // The child's vRegions arrive one message each; a child id that names another
        // process (of another vNode or pComponent) is not merged into.
        if c.vnode != parent.vnode || c.creator != g.creator {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(ERR::new(ErrCode::Denied, format!("process id {child} is in use")));
        }
        if let Err(e) = self.commit(&parent.vnode, need) {
            if !c.holds() {
                owned.remove(&child);
            }
            return Err(e);
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

    pub(super) fn owner_exit(&self, r: M2M_EXIT) -> Result<OK, Refusal> {
        let p = self.owned.lock().unwrap().remove(&r.who.pid);
        if let Some(p) = p {
            let g = p.lock().unwrap();
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
            self.let_go(&g);
        }
        Ok(OK)
    }
}
