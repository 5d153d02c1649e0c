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
mod process;
mod sets;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, MutexGuard};

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

/// Why an owner refuses a fetch, a write-back or a request of the home about a process's
/// pages: each case one a caller can match, its code on the wire given once, in [`Refuse`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnerError {
    #[error("a sealed page is {SEALED_PAGE} bytes, got {len}")]
    SealedSize { len: usize },
    #[error("process {pid} is at epoch {epoch}, the write-back was sent for epoch {sent}")]
    Stale { pid: u64, epoch: u64, sent: u64 },
    /// A page stored outside the process's vmas.
    #[error("page {addr:#x} is not mapped")]
    NotMapped { addr: u64 },
    /// A page fetched outside the vmas kept here: its vRegion may have moved since the
    /// fetcher's view of the sets, so the fetcher asks the home and tries again.
    #[error("page {addr:#x} is not mapped")]
    NotMappedHere { addr: u64 },
    #[error("this mComponent keeps the backup log of vRegion {idx} of process {pid}, not its pages")]
    LoggedHere { idx: u64, pid: u64 },
    #[error("process {pid} has no memory on mComponent {mcomp}")]
    NoMemoryHere { pid: u64, mcomp: u32 },
    #[error("process {pid} belongs to another vNode")]
    OtherVnode { pid: u64 },
    /// A fork's child id names a process of another vNode or pComponent here.
    #[error("process id {pid} is in use")]
    PidInUse { pid: u64 },
    #[error(transparent)]
    OtherPcomponent(#[from] super::OtherPcomponent),
    #[error("mComponent {mcomp} is out of memory ({taken} of {capacity} bytes taken, {asked} more asked)")]
    OutOfMemory {
        mcomp: u32,
        taken: u64,
        capacity: u64,
        asked: u64,
    },
    #[error("mComponent {mcomp} is full ({taken} of {capacity} bytes hold pages or are kept for vNodes' quotas)")]
    Full { mcomp: u32, taken: u64, capacity: u64 },
    #[error("mComponent {member} at {addr}, the parity member, did not take the pages' changes: {}", cause.msg)]
    ParityMember { member: u32, addr: String, cause: Refusal },
    #[error("the backup log of vRegion {idx} has had no room for {secs} s: its sComponent does not take it")]
    LogFull { idx: u64, secs: u64 },
    #[error("process {pid} has no page at or after {addr:#x} here")]
    NoPageFrom { pid: u64, addr: u64 },
}

impl Refuse for OwnerError {
    fn code(&self) -> ErrCode {
        match self {
            OwnerError::SealedSize { .. } | OwnerError::NotMapped { .. } => ErrCode::Invalid,
            OwnerError::Stale { .. } | OwnerError::NotMappedHere { .. } | OwnerError::LoggedHere { .. } => {
                ErrCode::Stale
            }
            OwnerError::NoMemoryHere { .. } | OwnerError::NoPageFrom { .. } => ErrCode::NotFound,
            OwnerError::OtherVnode { .. } | OwnerError::PidInUse { .. } => ErrCode::Denied,
            OwnerError::OtherPcomponent(e) => e.code(),
            OwnerError::OutOfMemory { .. } | OwnerError::Full { .. } => ErrCode::NoMemory,
            // A member that cannot be reached is lost to the set: the sender reports it.
            OwnerError::ParityMember { cause, .. } => match cause.code {
                ErrCode::Unreachable | ErrCode::NotFound => ErrCode::ParityLost,
                other => other,
            },
            OwnerError::LogFull { .. } => ErrCode::Unreachable,
        }
    }
}

/// A page to store must be sealed ([`SEALED_PAGE`] bytes); its seal is the fetcher's to check.
fn sealed_size(data: &[u8]) -> Result<(), OwnerError> {
    if data.len() != SEALED_PAGE {
        return Err(OwnerError::SealedSize { len: data.len() });
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
    /// Let go ([`Mem::let_go`]): nothing is stored in it any more.
    released: bool,
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
            released: false,
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
    pub(super) fn current(&self, who: &Who) -> Result<(), OwnerError> {
        if who.epoch < self.epoch {
            crate::series::STALE_WRITES_REFUSED.increment(1);
            return Err(OwnerError::Stale {
                pid: who.pid,
                epoch: self.epoch,
                sent: who.epoch,
            });
        }
        Ok(())
    }

    fn page_in_vma(&self, vpn: u64) -> Result<(), OwnerError> {
        self.vmas
            .find(vpn * PAGE)
            .map(|_| ())
            .ok_or(OwnerError::NotMapped { addr: vpn * PAGE })
    }

    fn load_page(&self, vpn: u64, vrs: u64) -> Result<ByteBuf, OwnerError> {
        // Not mapped here: its vRegion may have moved to another member (a detach, or
        // rebalancing) since the fetcher's view of the sets, so the fetcher asks the home for
        // them and tries again (a page mapped nowhere still fails, after a few tries).
        self.page_in_vma(vpn)
            .map_err(|_| OwnerError::NotMappedHere { addr: vpn * PAGE })?;
        if let Some(idx) = self.logged(vpn, vrs) {
            return Err(OwnerError::LoggedHere { idx, pid: self.pid });
        }
        Ok(match self.pages.get(vpn) {
            Some(pg) => ByteBuf::from(pg),
            None => sealed_zero_page(),
        })
    }
}

impl<P: Peers> Mem<P> {
    pub(super) fn owner_proc(&self, who: &Who) -> Result<Arc<Mutex<OwnerProc>>, OwnerError> {
        let p = self.owned.lock().unwrap().get(&who.pid).cloned();
        let p = p.ok_or_else(|| OwnerError::NoMemoryHere {
            pid: who.pid,
            mcomp: self.peers.id(),
        })?;
        let (vnode, creator) = {
            let g = self.live(&p)?;
            (g.vnode.clone(), g.creator)
        };
        if vnode != who.vnode {
            self.c.denied.fetch_add(1, Relaxed);
            static THEIRS: splitos_rpc::refusals::Refusals =
                splitos_rpc::refusals::Refusals::new("refused a request for another vNode's pages");
            if THEIRS.log_this(format_args!("vNode {}", who.vnode)) {
                tracing::warn!(pid = who.pid, owner_vnode = %vnode, asked_by = %who.vnode, "refused a request for another vNode's pages");
            }
            return Err(OwnerError::OtherVnode { pid: who.pid });
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
    ) -> Result<Arc<Mutex<OwnerProc>>, OwnerError> {
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
        let mut g = self.live(&p)?;
        if g.vnode != who.vnode || g.creator != creator {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(OwnerError::OtherVnode { pid: who.pid });
        }
        g.epoch = g.epoch.max(who.epoch);
        if let (None, Some(q)) = (g.quota, quota) {
            g.quota = Some(q);
            self.room.hold(&g.vnode, q);
        }
        drop(g);
        Ok(p)
    }

    /// `p` locked, unless it was let go since the caller found it (the process exited, or this
    /// mComponent was fenced, while the request waited for it): a page stored in it then would
    /// stay charged with no process to free it.
    pub(super) fn live<'a>(&self, p: &'a Mutex<OwnerProc>) -> Result<MutexGuard<'a, OwnerProc>, OwnerError> {
        let g = p.lock().unwrap();
        if g.released {
            return Err(OwnerError::NoMemoryHere {
                pid: g.pid,
                mcomp: self.peers.id(),
            });
        }
        Ok(g)
    }

    /// Lets go of all that process `g` takes here (it exited, or this mComponent was fenced).
    pub(super) fn let_go(&self, g: &mut OwnerProc) {
        g.released = true;
        self.room.uncommit(&g.vnode, g.committed);
        self.room.free_pages(&g.vnode, g.held());
        if g.quota.is_some() {
            self.room.unhold(&g.vnode);
        }
        self.freed.fetch_add(g.parity.len() as u64 * PAGE, Relaxed);
    }

    /// Promises `bytes` to writable mappings of `vnode` (strict overcommit).
    pub(super) fn commit(&self, vnode: &str, bytes: u64) -> Result<(), OwnerError> {
        if !self.room.commit(vnode, bytes) {
            self.c.out_of_memory.fetch_add(1, Relaxed);
            return Err(OwnerError::OutOfMemory {
                mcomp: self.peers.id(),
                taken: self.room.taken(),
                capacity: self.capacity,
                asked: bytes,
            });
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
                Ok(()) => crate::series::PARITY_DELTAS_SENT.increment(batch.len() as u64),
                Err(e) if e.code == ErrCode::Stale => {
                    p.lock().unwrap().undo(&batch, &self.room);
                    out = Err(e);
                }
                Err(e) => {
                    tracing::warn!(pid = who.pid, parity = o.id, error = %e, "cannot forward page changes to the parity member");
                    out = Err(OwnerError::ParityMember {
                        member: o.id,
                        addr: o.addr,
                        cause: e,
                    }
                    .into());
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
            crate::series::LOG_UNPROTECTED_VREGIONS.increment(1);
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
                return Err(OwnerError::LogFull {
                    idx,
                    secs: wait.as_secs(),
                }
                .into());
            }
            return Ok(());
        }
        // Heuristic overcommit charges pages as they arrive: a new page that fits neither in
        // what is kept for its vNode nor in what no vNode took or kept is refused, and the
        // pComponent has the home move the vRegion to an mComponent with room.
        let new = !p.pages.contains(vpn);
        if new && !self.charges_mappings() {
            if !self.room.take_pages(&p.vnode, PAGE) {
                self.c.out_of_memory.fetch_add(1, Relaxed);
                crate::series::FULL_WRITES.increment(1);
                return Err(OwnerError::Full {
                    mcomp: self.peers.id(),
                    taken: self.room.taken(),
                    capacity: self.capacity,
                }
                .into());
            }
        } else if new {
            self.room.add_pages(&p.vnode, PAGE);
        }
        deltas.extend(p.delta(vpn, Some(data), self.vrs()));
        if let Err(e) = p.pages.insert(vpn, data) {
            if new {
                self.room.free_pages(&p.vnode, PAGE);
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Fault injection: a bit of a stored page flips, as in a memory error.
    pub(super) fn debug_flip(&self, r: C2M_DEBUG_FLIP) -> Result<M2C_FLIPPED, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = self.live(&p)?;
        let vpn = g
            .pages
            .keys(r.from_vpn..u64::MAX)
            .next()
            .ok_or(OwnerError::NoPageFrom {
                pid: r.who.pid,
                addr: r.from_vpn * PAGE,
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
        let data = self.live(&p)?.load_page(r.vpn, self.vrs())?;
        Ok(M2P_PAGE { data })
    }

    pub(super) fn flush(&self, r: P2M_FLUSH) -> Result<OK, Refusal> {
        let p = self.owner_proc(&r.who)?;
        let mut g = self.live(&p)?;
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
        let victim = match self.owner_proc(who) {
            Ok(victim) => victim,
            Err(OwnerError::NoMemoryHere { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let mut g = match self.live(&victim) {
            Ok(g) => g,
            Err(OwnerError::NoMemoryHere { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        g.current(who)?;
        self.c.flushes.fetch_add(1, Relaxed);
        self.c.piggybacked.fetch_add(1, Relaxed);
        let mut deltas = Deltas::new();
        self.store(&mut g, vpn, data, &mut deltas)?;
        self.release_and_forward(&victim, g, who, deltas)
    }

    pub(super) fn flush_fetch(&self, r: P2M_FLUSH_FETCH) -> Result<M2P_PAGE, Refusal> {
        let p = self.owner_proc(&r.who)?;
        self.store_piggybacked(&r.flush_who, r.flush_vpn, &r.data)?;
        self.c.fetches.fetch_add(1, Relaxed);
        let data = self.live(&p)?.load_page(r.fetch_vpn, self.vrs())?;
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
        let g = self.live(&p)?;
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
        let mut g = self.live(&p)?;
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
}
