//! The ExCache miss path: one type, [`MissPath`], with its own state, over a [`PageStore`]
//! (where lines come from and go back to) and each process's [`Region`] (its heap).
//!
//! A miss, step by step ([`MissPath::fault`]):
//! 1. claim a way in the line's set ([`MissPath::claim`]); if the set is full the eviction
//!    policy picks a victim, a clean victim is dropped without a message and a dirty one is
//!    write-protected, copied out and dropped ([`MissPath::evict`]). With the background
//!    evictor on, a set is rarely full: it keeps spare ways ahead of the misses (evictor.rs);
//! 2. with the compressed tier on, offer the victim to it ([`MissPath::stash`]); write the
//!    dirty victims it did not take back and fetch the line, in one round trip when both go to
//!    the same place (LegoOS piggyback), or decompress the line from the tier, or zero-fill a
//!    line that never left this pComponent (a p-local line) ([`MissPath::fill`]);
//! 3. install the line, write-protected after a read so that the first write traps and marks
//!    it dirty ([`MissPath::install`]); or, if the fill failed, discard the claim and fail the
//!    process with the store's error. A p-local line brings the fresh lines after it: some
//!    installed with it (fault-around), the next ones pre-allocated in the program's memfd so
//!    that touching them does not trap at all ([`MissPath::preallocate`]).
//!
//! Every write-back ends in [`MissPath::settle`], the one failure rule: a line's only copy is
//! never dropped before a component acknowledged it. A resident line whose write-back fails
//! stays resident and dirty. An evicted victim's copy lives only in the write-back until the
//! acknowledgement; if its write-back fails, its process is stopped (before any of its threads
//! could see the page as never written) and failed with an error naming the component. A miss
//! on a line whose write-back is on the wire waits for the acknowledgement.
//!
//! With dirty tracking by scan (dirty.rs, scan.rs) no write traps: the kernel records it in the
//! page table, eviction learns it as it takes the line from the program, and a clean line is
//! dropped without a write-back.
//!
//! The compressed tier (tier.rs) is exclusive: a page is a resident line, a tier entry, or
//! neither. A dirty tier entry is a page's only copy, and it follows the same rule: pushed out
//! of the tier, it is in flight until the store acknowledged it, and a failed write-back fails
//! its process.
//!
//! Where each part is: the state and its types here; the fault and a miss's three steps in
//! fault.rs; what becomes of a victim in evict.rs; write-backs, their failure rule and the
//! range operations in writeback.rs; read-ahead in ahead.rs; fresh lines (fault-around,
//! pre-allocation, huge pages) in fresh.rs; the background evictor in evictor.rs; dirty
//! tracking by scan in scan.rs; access sampling in sample.rs.
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use splitos_rpc::{Refusal, PAGE_SIZE};

use super::cache::{EvictionPolicy, ExCache, Line, LineState};
use super::prefetch::Prefetcher;
use super::region::Region;
use super::store::{Page, PageStore};
use super::tier::{Codec, Entry, UnpackError, VictimTier};
use crate::stats::RunStats;
use splitos_core::vma::{Vma, VmaMap};

const PAGE: u64 = PAGE_SIZE as u64;
const PROT_WRITE: u32 = 2;
/// Pages per batched write-back message (well inside the frame bound).
const FLUSH_BATCH: usize = 256;

/// A process's heap as the miss path serves it: the region its lines go to, its counters, and
/// whether it is still served. One of a process's three facets: `Proc` (pmon/mod.rs) is its
/// hosting, `ProcMemory` (store.rs) who it is and where its memory lives.
pub struct ProcHeap {
    pub pid: u64,
    pub region: Box<dyn Region>,
    /// The run's counters (the miss path also counts into its pComponent total).
    pub stats: Arc<RunStats>,
    alive: AtomicBool,
    /// Set once the process was failed or retired: it is failed at most once.
    done: AtomicBool,
    /// Lines this process faulted in by a read, and how many of those it then wrote: when most
    /// reads are followed by a write (reference counts, hash-table updates), read misses are
    /// installed writable and dirty, saving the write-protect fault each would take.
    read_fills: AtomicU64,
    written_after_read: AtomicU64,
    /// The same for the lines read ahead, apart: a program may write most pages it misses on
    /// and few of those it reads ahead, or (an in-memory database's b-tree pages) both.
    ahead_fills: AtomicU64,
    written_after_ahead: AtomicU64,
    /// Where this process's first touches run, and how many fresh lines each run's next one
    /// gets (fresh.rs).
    runs: Mutex<fresh::Runs>,
}

impl ProcHeap {
    pub fn new(pid: u64, region: Box<dyn Region>, stats: Arc<RunStats>) -> Arc<ProcHeap> {
        Arc::new(ProcHeap {
            pid,
            region,
            stats,
            alive: AtomicBool::new(true),
            done: AtomicBool::new(false),
            read_fills: AtomicU64::new(0),
            written_after_read: AtomicU64::new(0),
            ahead_fills: AtomicU64::new(0),
            written_after_ahead: AtomicU64::new(0),
            runs: Mutex::new(fresh::Runs::default()),
        })
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Relaxed)
    }

    fn predicts_write(&self) -> bool {
        mostly(&self.read_fills, &self.written_after_read)
    }

    fn predicts_ahead_write(&self) -> bool {
        mostly(&self.ahead_fills, &self.written_after_ahead)
    }
}

/// Whether most of at least 64 lines installed write-protected were written afterwards.
fn mostly(fills: &AtomicU64, written: &AtomicU64) -> bool {
    let fills = fills.load(Relaxed);
    fills >= 64 && written.load(Relaxed) * 2 > fills
}

/// What a fault asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    /// A write to a page mapped write-protected.
    WriteProtect,
}

/// Called once for a process whose memory cannot be served, with why.
pub type FailHook = Box<dyn Fn(&ProcHeap, &str) + Send + Sync>;

/// A page captured for write-back; until it is settled, `data` may be its only copy.
struct Writeback {
    heap: Arc<ProcHeap>,
    vpn: u64,
    data: Page,
    held: Held,
}

/// Where else a captured page is while its write-back is on the wire.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Nowhere: a dirty victim evicted from the ExCache.
    Evicted,
    /// Nowhere: a dirty entry pushed out of the compressed tier.
    PushedOut,
    /// Still resident, captured when the line had seen this many writes.
    Line(u32),
    /// In the compressed tier, pinned until this write-back ends.
    Tier,
    /// A clean victim: the store holds it, so it is only offered to the tier, never written.
    Clean,
}

/// Where a miss gets its line from.
enum Source {
    /// Zeros: a p-local line.
    Local,
    Store,
    Tier(Entry),
}

/// Which ways a claim may take ([`MissPath::claim_way`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Evictable {
    /// A free way or any victim the policy picks.
    Any,
    /// A free way or a victim that needs no write-back (as [`ExCache::claim_clean`]).
    CleanOnly,
}

/// What an eviction does with a clean victim the store holds ([`MissPath::evict`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum CleanVictim {
    /// Offers it to the compressed tier, when the tier is on.
    ToTier,
    /// Drops it.
    Drop,
}

/// How a line goes into the program ([`MissPath::install`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum InstallAs {
    /// Writable, and so dirty from the start: no write to it can go unseen.
    Writable,
    /// Write-protected and clean: its first write traps and makes it dirty.
    Clean,
    /// Write-protected but dirty already (a dirty tier entry: the line is its only copy).
    ProtectedDirty,
    /// Read ahead: write-protected and clean, and its first write counts for its process's
    /// prediction of writes to lines read ahead.
    Ahead,
}

impl InstallAs {
    fn writable(self) -> bool {
        self == InstallAs::Writable
    }

    fn dirty(self) -> bool {
        matches!(self, InstallAs::Writable | InstallAs::ProtectedDirty)
    }
}

/// How write-backs travelled ([`MissPath::settle`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sent {
    Alone,
    /// In the fetch's round trip (LegoOS piggyback).
    WithFetch,
}

/// What a range dropped from the cache leaves of its pages on the store
/// ([`MissPath::drop_locked`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stored {
    /// They are still there (mremap moved them).
    Keep,
    /// They are gone (munmap, MADV_DONTNEED): a miss on one is a p-local line again.
    Forget,
}

struct Claim {
    slot: usize,
    /// Lines evicted for this miss and its read-ahead: dirty ones to be written back with it,
    /// clean ones to be offered to the compressed tier.
    victims: Vec<Writeback>,
    source: Source,
    /// Following lines claimed for read-ahead: (page, way).
    ahead: Vec<(u64, usize)>,
    /// Following fresh lines claimed for fault-around: (page, way).
    around: Vec<(u64, usize)>,
    /// Fresh lines after those claimed for pre-allocation: (page, way), contiguous.
    fresh: Vec<(u64, usize)>,
    /// The other lines of the missed line's 2 MiB extent, claimed to pre-allocate the extent
    /// as one huge page: (page, way). Empty unless that is possible.
    extent: Vec<(u64, usize)>,
}

struct State {
    cache: ExCache,
    /// Evicted victims whose write-back is on the wire: a miss on one waits for it.
    inflight: HashSet<(u64, u64)>,
    /// Pages that exist on the store; a miss on any other page is a p-local line.
    materialized: HashMap<u64, BTreeSet<u64>>,
    heaps: HashMap<u64, Arc<ProcHeap>>,
    prefetcher: Box<dyn Prefetcher>,
    /// Each process's mappings as its home granted them: fault-around installs fresh lines
    /// only where the program may write.
    layouts: HashMap<u64, VmaMap>,
    /// The compressed tier, when on.
    tier: Option<Box<dyn VictimTier>>,
    /// Sampled read-ahead lines: fetched and holding a way, but kept here instead of installed,
    /// so that the program's first touch traps and shows the read-ahead was used.
    staged: BTreeMap<(u64, u64), Page>,
    /// What the background evictor keeps free, when on (evictor.rs).
    reserve: Option<Reserve>,
    /// Access sampling: lines queued to be unmapped (`Line::unmap_queued`), (pid, page, fill),
    /// unmapped in batches (sample.rs).
    unmaps: Vec<(u64, u64, u64)>,
    /// vNodes by the group id the cache knows them by (resize.rs).
    vnode_ids: HashMap<String, u32>,
}

/// The evictor's share of the miss path's state (under its lock).
struct Reserve {
    /// Spare ways the evictor keeps in every set a claim used.
    ways: usize,
    /// Lines short of the reserve (claims that left their set short since the evictor last
    /// looked) that wake the evictor: the low watermark.
    wake_at: usize,
    owed: usize,
    /// Those claims by process: whose misses the next round's victims make room for.
    owed_by: HashMap<u64, usize>,
    /// Pages on either side of a victim that may leave with it ([`ExCache::pick_beside`]).
    beside: u64,
    /// Sets short of `ways` spare ways, each queued once, oldest first.
    short: VecDeque<usize>,
    queued: Vec<bool>,
    stop: bool,
}

pub struct MissPath {
    store: Arc<dyn PageStore>,
    piggyback: bool,
    /// Fresh lines installed with a first touch (0: none).
    fault_around: u64,
    /// Fresh lines pre-allocated past those (0: none).
    prealloc: u64,
    /// Fresh lines a first touch that continues no run gets.
    window_start: u64,
    state: Mutex<State>,
    cv: Waiters,
    total: Arc<RunStats>,
    on_fail: FailHook,
    /// The compressed tier's codec, when the tier is on (used without the lock).
    codec: Option<Box<dyn Codec>>,
    /// Lines read ahead so far: every [`SAMPLE`](super::prefetch::SAMPLE)th is staged.
    prefetch_count: AtomicU64,
    /// Where the background evictor sleeps.
    evictor_cv: Condvar,
    /// A batch of lines to unmap is queued (sample.rs): read without the lock, so that a miss
    /// takes the lock again only when there is something to do.
    unmaps_due: AtomicBool,
}

/// What a [`MissPath`] is built from ([`MissPath::with_tier`] and [`MissPath::with_evictor`]
/// add the optional parts).
pub struct MissPathParts {
    pub cache: ExCache,
    pub store: Arc<dyn PageStore>,
    pub prefetcher: Box<dyn Prefetcher>,
    /// Dirty victims ride with the fetch when both go to the same place (LegoOS piggyback).
    pub piggyback: bool,
    /// Fresh lines installed with a first touch (0: none).
    pub fault_around: usize,
    /// Fresh lines pre-allocated past those (0: none).
    pub prealloc: usize,
    /// Fresh lines (installed, then pre-allocated) a first touch gets when it continues no
    /// run of first touches; each that continues one gets four times the run's last, up to
    /// `fault_around + prealloc`.
    pub window_start: usize,
    pub on_fail: FailHook,
}

impl MissPath {
    pub fn new(parts: MissPathParts) -> MissPath {
        let MissPathParts {
            cache,
            store,
            prefetcher,
            piggyback,
            fault_around,
            prealloc,
            window_start,
            on_fail,
        } = parts;
        let state = State {
            cache,
            inflight: HashSet::new(),
            materialized: HashMap::new(),
            heaps: HashMap::new(),
            prefetcher,
            layouts: HashMap::new(),
            tier: None,
            staged: BTreeMap::new(),
            reserve: None,
            unmaps: Vec::new(),
            vnode_ids: HashMap::new(),
        };
        MissPath {
            store,
            piggyback,
            fault_around: fault_around as u64,
            prealloc: prealloc as u64,
            window_start: window_start as u64,
            state: Mutex::new(state),
            cv: Waiters::default(),
            total: Arc::new(RunStats::default()),
            on_fail,
            codec: None,
            prefetch_count: AtomicU64::new(0),
            evictor_cv: Condvar::new(),
            unmaps_due: AtomicBool::new(false),
        }
    }

    /// Puts a compressed tier between the ExCache and the store.
    pub fn with_tier(mut self, tier: Box<dyn VictimTier>, codec: Box<dyn Codec>) -> MissPath {
        self.state.get_mut().unwrap().tier = Some(tier);
        self.codec = Some(codec);
        self
    }

    /// The compressed tier's policy, codec, budget, bytes charged and entries (for statistics).
    pub fn tier_usage(&self) -> Option<(&'static str, &'static str, u64, u64, usize)> {
        let codec = self.codec.as_ref()?.name();
        self.state
            .lock()
            .unwrap()
            .tier
            .as_ref()
            .map(|t| (t.name(), codec, t.budget(), t.used(), t.entries()))
    }

    /// Records what [start, end) (bytes) of process `pid` now is: mapped with `prot`, or
    /// unmapped (`None`). Called after the home granted an mmap, mprotect, munmap or mremap.
    pub fn set_prot(&self, pid: u64, start: u64, end: u64, prot: Option<u32>) {
        let mut g = self.state.lock().unwrap();
        let m = g.layouts.entry(pid).or_default();
        m.remove_range(start, end);
        if let Some(prot) = prot {
            m.insert(
                start,
                Vma {
                    end,
                    prot,
                    accounted: false,
                },
            );
        }
    }

    /// The protection of [start, end) (bytes) of process `pid` if it is mapped with no hole and
    /// one protection.
    pub fn prot_of(&self, pid: u64, start: u64, end: u64) -> Option<u32> {
        self.state
            .lock()
            .unwrap()
            .layouts
            .get(&pid)
            .and_then(|m| m.prot_of(start, end))
    }

    /// Bytes of [start, end) the process has writable, if its layout maps all of it.
    pub fn writable_in(&self, pid: u64, start: u64, end: u64) -> Option<u64> {
        let g = self.state.lock().unwrap();
        let m = g.layouts.get(&pid)?;
        m.covers(start, end).then(|| m.writable_in(start, end))
    }

    /// The pComponent's counters over all runs.
    pub fn total(&self) -> &Arc<RunStats> {
        &self.total
    }

    pub fn piggyback(&self) -> bool {
        self.piggyback
    }

    /// Puts new policies in place of the running ones (each only when given), between two
    /// misses: a miss under way finishes with the old. A new prefetcher starts without the old
    /// one's streams. Returns the names now in place.
    pub fn replace_policies(
        &self,
        eviction: Option<Box<dyn EvictionPolicy>>,
        prefetch: Option<Box<dyn Prefetcher>>,
    ) -> (&'static str, &'static str) {
        let mut g = self.state.lock().unwrap();
        if let Some(p) = eviction {
            g.cache.set_policy(p);
        }
        if let Some(p) = prefetch {
            g.prefetcher = p;
        }
        (g.cache.policy_name(), g.prefetcher.name())
    }

    /// The eviction and read-ahead policies in place.
    pub fn policy_names(&self) -> (&'static str, &'static str) {
        self.replace_policies(None, None)
    }

    /// Reads the cache's bookkeeping (for statistics).
    pub fn with_cache<R>(&self, f: impl FnOnce(&ExCache) -> R) -> R {
        f(&self.state.lock().unwrap().cache)
    }

    /// A new process; `materialized` are the pages it already has on the store (a forked
    /// child's copy).
    pub fn add(&self, t: Arc<ProcHeap>, materialized: BTreeSet<u64>) {
        let mut g = self.state.lock().unwrap();
        g.materialized.insert(t.pid, materialized);
        g.cache.set_run(t.pid, t.stats.clone());
        g.heaps.insert(t.pid, t);
    }

    /// A process that ended: its lines leave the cache; it is never failed after this.
    pub fn remove(&self, t: &ProcHeap) {
        t.done.store(true, Relaxed);
        t.alive.store(false, Relaxed);
        let mut g = self.state.lock().unwrap();
        for (vpn, _) in g.cache.resident_in(t.pid, 0, u64::MAX) {
            g.cache.remove(t.pid, vpn);
        }
        if let Some(tier) = g.tier.as_mut() {
            tier.drop_range(t.pid, 0, u64::MAX);
        }
        unstage(&mut g, t.pid, 0, u64::MAX);
        g.heaps.remove(&t.pid);
        g.materialized.remove(&t.pid);
        g.prefetcher.forget(t.pid);
        g.layouts.remove(&t.pid);
        g.cache.forget_group(t.pid);
        drop(g);
        self.cv.notify_all();
    }

    pub fn materialized_of(&self, pid: u64) -> BTreeSet<u64> {
        self.state
            .lock()
            .unwrap()
            .materialized
            .get(&pid)
            .cloned()
            .unwrap_or_default()
    }

    /// After mremap moved [old, old + old_len) to `new`: the pages that existed on the store in
    /// the old range now exist at the new one (as far as the new length reaches).
    pub fn shift_materialized(&self, pid: u64, old: u64, old_len: u64, new_len: u64, new: u64) {
        let mut g = self.state.lock().unwrap();
        let Some(m) = g.materialized.get_mut(&pid) else { return };
        let (of, oe) = (old / PAGE, (old + old_len) / PAGE);
        let moved: Vec<u64> = m.range(of..oe).copied().collect();
        for v in &moved {
            m.remove(v);
        }
        let keep = new_len / PAGE;
        for v in moved.into_iter().filter(|v| v - of < keep) {
            m.insert(v - of + new / PAGE);
        }
    }

    /// Applies a counter update to the process's run and to the pComponent total.
    fn bump(&self, t: &ProcHeap, f: impl Fn(&RunStats)) {
        f(&t.stats);
        f(&self.total);
    }

    /// Stops serving a process and reports why, once.
    pub fn fail(&self, t: &ProcHeap, why: &str) {
        t.alive.store(false, Relaxed);
        if !t.done.swap(true, Relaxed) {
            t.stats.errors.lock().unwrap().push(why.to_string());
            (self.on_fail)(t, why);
        }
        self.cv.notify_all();
    }
}

/// Whether the compressed tier holds (pid, vpn).
fn tiered(g: &State, pid: u64, vpn: u64) -> bool {
    g.tier.as_ref().is_some_and(|t| t.contains(pid, vpn))
}

/// Forgets the staged samples of `pid` in [first, end) (virtual pages).
fn unstage(g: &mut State, pid: u64, first: u64, end: u64) {
    let keys: Vec<(u64, u64)> = g.staged.range((pid, first)..(pid, end)).map(|(k, _)| *k).collect();
    for k in keys {
        g.staged.remove(&k);
    }
}

/// Write-protects a dirty line (so later writes trap) and copies it out. A line that could
/// not be protected is not captured: a write after the copy would go unseen.
/// Why the miss path failed a page of a program.
#[derive(Debug, thiserror::Error)]
pub enum MissError {
    #[error("compressed tier: cannot decompress heap page {addr:#x}: {error}")]
    Unpack { addr: u64, error: UnpackError },
    #[error("cannot read heap page {addr:#x}: {error}")]
    Read { addr: u64, error: std::io::Error },
    #[error("process {pid} lost heap pages while they moved")]
    PagesLost { pid: u64 },
    /// A dirty page that could not be captured: it existed nowhere else.
    #[error("cannot read heap page {addr:#x} to write it back: {error}")]
    WriteBackRead { addr: u64, error: std::io::Error },
    #[error("cannot split the huge page holding heap page {addr:#x}: {error}; its other pages were lost")]
    HugePageLost { addr: u64, error: std::io::Error },
}

impl splitos_rpc::Refuse for MissError {
    fn code(&self) -> splitos_rpc::ErrCode {
        splitos_rpc::ErrCode::Internal
    }
}

fn capture(t: &ProcHeap, vpn: u64, wp: bool) -> std::io::Result<Page> {
    if !wp {
        t.region.write_protect(vpn, 1, true)?;
    }
    let mut data = vec![0u8; PAGE_SIZE];
    t.region.read_out(vpn, &mut data)?;
    Ok(data)
}

mod ahead;
mod evict;
mod evictor;
mod fault;
mod fresh;
mod resize;
pub use resize::ResizeError;
mod sample;
mod scan;
#[cfg(test)]
mod tests;
mod writeback;

/// The miss path's condition variable (paired with its state's lock), which makes no system
/// call when no thread waits: std's waking of the futex at every notification cost a system
/// call at every install and every eviction, where a thread rarely waits for a line.
#[derive(Default)]
struct Waiters {
    cv: Condvar,
    waiting: AtomicUsize,
}

impl Waiters {
    /// Waits for a notification; `g` is the state's guard. Counted before the lock is
    /// released, so that a notifier that changed the state under the lock after it sees the
    /// waiter.
    fn wait<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.waiting.fetch_add(1, SeqCst);
        let g = self.cv.wait(g).unwrap();
        self.waiting.fetch_sub(1, SeqCst);
        g
    }

    /// Wakes every waiter, if any: called after the state changed under its lock.
    fn notify_all(&self) {
        if self.waiting.load(SeqCst) > 0 {
            self.cv.notify_all();
        }
    }
}
