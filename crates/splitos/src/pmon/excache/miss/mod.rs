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
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use splitos_rpc::{Refusal, PAGE_SIZE};

use super::cache::{ExCache, Line, LineState};
use super::prefetch::{Prefetcher, SAMPLE};
use super::region::{Install, Region};
use super::store::{Page, PageStore, Place};
use super::tier::{Codec, Entry, VictimTier};
use crate::pmon::host::huge::{SplitError, EXTENT};
use crate::pmon::stats::RunStats;
use crate::vma::{Vma, VmaMap};

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
}

impl ProcHeap {
    pub fn new(pid: u64, region: Box<dyn Region>, stats: Arc<RunStats>) -> Arc<ProcHeap> {
        Arc::new(ProcHeap { pid, region, stats, alive: AtomicBool::new(true), done: AtomicBool::new(false), read_fills: AtomicU64::new(0), written_after_read: AtomicU64::new(0) })
    }

    pub fn alive(&self) -> bool {
        self.alive.load(Relaxed)
    }

    fn predicts_write(&self) -> bool {
        let reads = self.read_fills.load(Relaxed);
        reads >= 64 && self.written_after_read.load(Relaxed) * 2 > reads
    }
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
    reserve: Option<evictor::Reserve>,
}

pub struct MissPath {
    store: Arc<dyn PageStore>,
    piggyback: bool,
    /// Fresh lines installed with a first touch (0: none).
    fault_around: u64,
    /// Fresh lines pre-allocated past those (0: none).
    prealloc: u64,
    state: Mutex<State>,
    cv: Condvar,
    total: Arc<RunStats>,
    on_fail: FailHook,
    /// The compressed tier's codec, when the tier is on (used without the lock).
    codec: Option<Box<dyn Codec>>,
    /// Lines read ahead so far: every [`SAMPLE`]th is staged.
    prefetch_count: AtomicU64,
    /// Where the background evictor sleeps.
    evictor_cv: Condvar,
}

impl MissPath {
    pub fn new(cache: ExCache, store: Arc<dyn PageStore>, piggyback: bool, prefetcher: Box<dyn Prefetcher>, fault_around: usize, prealloc: usize, on_fail: FailHook) -> MissPath {
        let state = State { cache, inflight: HashSet::new(), materialized: HashMap::new(), heaps: HashMap::new(), prefetcher, layouts: HashMap::new(), tier: None, staged: BTreeMap::new(), reserve: None };
        MissPath {
            store,
            piggyback,
            fault_around: fault_around as u64,
            prealloc: prealloc as u64,
            state: Mutex::new(state),
            cv: Condvar::new(),
            total: Arc::new(RunStats::default()),
            on_fail,
            codec: None,
            prefetch_count: AtomicU64::new(0),
            evictor_cv: Condvar::new(),
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
        self.state.lock().unwrap().tier.as_ref().map(|t| (t.name(), codec, t.budget(), t.used(), t.entries()))
    }

    /// Records what [start, end) (bytes) of process `pid` now is: mapped with `prot`, or
    /// unmapped (`None`). Called after the home granted an mmap, mprotect, munmap or mremap.
    pub fn set_prot(&self, pid: u64, start: u64, end: u64, prot: Option<u32>) {
        let mut g = self.state.lock().unwrap();
        let m = g.layouts.entry(pid).or_default();
        m.remove_range(start, end);
        if let Some(prot) = prot {
            m.insert(start, Vma { end, prot, accounted: false });
        }
    }

    /// The protection of [start, end) (bytes) of process `pid` if it is mapped with no hole and
    /// one protection.
    pub fn prot_of(&self, pid: u64, start: u64, end: u64) -> Option<u32> {
        self.state.lock().unwrap().layouts.get(&pid).and_then(|m| m.prot_of(start, end))
    }

    /// The pComponent's counters over all runs.
    pub fn total(&self) -> &Arc<RunStats> {
        &self.total
    }

    pub fn piggyback(&self) -> bool {
        self.piggyback
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
        drop(g);
        self.cv.notify_all();
    }

    pub fn materialized_of(&self, pid: u64) -> BTreeSet<u64> {
        self.state.lock().unwrap().materialized.get(&pid).cloned().unwrap_or_default()
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

    /// Serves one fault of `t` on page `vpn`.
    pub fn fault(&self, t: &Arc<ProcHeap>, vpn: u64, access: Access, t0: Instant) {
        let Some(claim) = self.claim(t, vpn, access) else { return };
        let t_evicted = Instant::now();
        let (remote, tier_dirty) = match &claim.source {
            Source::Store => (true, None),
            Source::Tier(e) => (false, Some(e.dirty)),
            Source::Local => (false, None),
        };
        let ahead: Vec<u64> = claim.ahead.iter().map(|(v, _)| *v).collect();
        let filled = self.fill(t, vpn, claim.source, claim.victims, &ahead);
        let t_fetched = Instant::now();
        match filled {
            Ok((data, pages)) => {
                // A line installed writable is dirty from the start: no write to it can go unseen.
                // When the kernel tracks writes, a write costs no trap, so reads never predict one.
                let writable = access == Access::Write || (!t.region.tracks_writes() && t.predicts_write());
                if !writable {
                    // Only lines a read installed write-protected can show whether a write follows.
                    t.read_fills.fetch_add(1, Relaxed);
                }
                // A dirty tier entry stays dirty as a line (write-protected after a read all the
                // same, so that the process's write prediction still learns).
                let dirty = writable || tier_dirty == Some(true);
                let installed = if claim.extent.is_empty() { self.install(t, vpn, claim.slot, data.as_deref(), writable, dirty) } else { self.allocate_extent(t, vpn, claim.slot, &claim.extent, writable) };
                if !installed && tier_dirty == Some(true) && t.alive() {
                    self.fail(t, &format!("cannot install heap page {:#x} from the compressed tier, which held its only copy", vpn * PAGE));
                    return;
                }
                // Lines read ahead go in clean and write-protected, whatever the process's
                // prediction (nobody asked for them yet), or are staged as samples; those not
                // fetched are given back.
                let fetched = pages.len();
                let mut pages = pages.into_iter();
                for (v, slot) in &claim.ahead {
                    match pages.next() {
                        Some(p) if self.prefetch_count.fetch_add(1, Relaxed) % SAMPLE == SAMPLE - 1 => self.stage(t, *v, *slot, p),
                        Some(p) => {
                            self.install(t, *v, *slot, Some(&p), false, false);
                        }
                        None => self.abandon(t, *v, *slot),
                    }
                }
                if fetched > 0 {
                    self.bump(t, |s| {
                        s.prefetched.fetch_add(fetched as u64, Relaxed);
                        s.bytes_fetched.fetch_add(fetched as u64 * PAGE, Relaxed);
                    });
                }
                for (v, slot) in &claim.around {
                    self.install(t, *v, *slot, None, true, true);
                }
                if !claim.around.is_empty() {
                    self.bump(t, |s| {
                        s.faulted_around.fetch_add(claim.around.len() as u64, Relaxed);
                    });
                }
                self.preallocate(t, &claim.fresh);
            }
            Err(e) => {
                self.abandon(t, vpn, claim.slot);
                for (v, slot) in claim.ahead.iter().chain(&claim.around).chain(&claim.fresh).chain(&claim.extent) {
                    self.abandon(t, *v, *slot);
                }
                self.fail(t, &e.msg);
                return;
            }
        }
        let t_done = Instant::now();
        let parts = [t_evicted - t0, t_fetched - t_evicted, t_done - t_fetched].map(|d| (d.as_nanos() as u64).max(1));
        self.bump(t, |s| {
            let _ = s.evict_ns.lock().unwrap().record(parts[0]);
            if remote {
                let _ = s.rpc_ns.lock().unwrap().record(parts[1]);
                s.bytes_fetched.fetch_add(PAGE, Relaxed);
            } else if tier_dirty.is_some() {
                s.tier_hits.fetch_add(1, Relaxed);
            } else {
                s.plocal_fills.fetch_add(1, Relaxed);
            }
            let _ = s.install_ns.lock().unwrap().record(parts[2]);
            s.misses.fetch_add(1, Relaxed);
            let _ = s.miss_ns.lock().unwrap().record(((t_done - t0).as_nanos() as u64).max(1));
        });
    }

    /// Step 1: a hit is served here (a write to a write-protected line makes it dirty); a miss
    /// claims a way, evicting the policy's victim if the set is full. `None` when nothing more
    /// is to be done.
    fn claim(&self, t: &Arc<ProcHeap>, vpn: u64, access: Access) -> Option<Claim> {
        let mut g = self.state.lock().unwrap();
        loop {
            if !t.alive() {
                return None;
            }
            if let Some(slot) = g.cache.lookup(t.pid, vpn) {
                let line = *g.cache.line(slot);
                if matches!(line.state, LineState::Filling | LineState::Evicting) {
                    g = self.cv.wait(g).unwrap();
                    continue;
                }
                if let Some(page) = g.staged.remove(&(t.pid, vpn)) {
                    self.unstage_used(&mut g, t, vpn, slot, &page, access);
                    return None;
                }
                // A write-protect fault on a line believed writable (its protection was set but
                // not recorded) is lifted too, or the writer would fault forever.
                if access != Access::Read && (line.wp || access == Access::WriteProtect) {
                    if !line.dirty {
                        t.written_after_read.fetch_add(1, Relaxed);
                    }
                    let l = g.cache.line_mut(slot);
                    l.wp = false;
                    l.dirty = true;
                    l.referenced = true;
                    l.writes = l.writes.wrapping_add(1);
                    self.bump(t, |s| {
                        s.wp_faults.fetch_add(1, Relaxed);
                    });
                    if let Err(e) = t.region.write_protect(vpn, 1, false) {
                        tracing::warn!(pid = t.pid, error = %e, "cannot lift write protection");
                    }
                } else {
                    t.region.wake(vpn);
                }
                return None;
            }
            if access == Access::WriteProtect {
                // Evicted while the writer waited: woken, it faults again as a miss.
                t.region.wake(vpn);
                return None;
            }
            if g.inflight.contains(&(t.pid, vpn)) {
                g = self.cv.wait(g).unwrap();
                continue;
            }
            let Some(c) = self.claim_way(&mut g, t.pid, vpn, false) else {
                g = self.cv.wait(g).unwrap();
                continue;
            };
            g.cache.line_mut(c.slot).read_fill = access == Access::Read && t.region.tracks_writes();
            self.claimed(&mut g, vpn);
            let (mut victims, mut lost) = (Vec::new(), Vec::new());
            if let Some(v) = c.victim {
                self.evict(&mut g, v, &mut victims, &mut lost, true);
            }
            self.rearm(&mut g, vpn);
            // The tier before the store: a tier entry is the page's newest version.
            let source = match g.tier.as_mut().and_then(|tier| tier.take(t.pid, vpn)) {
                Some(e) => Source::Tier(e),
                None if g.materialized.get(&t.pid).is_some_and(|s| s.contains(&vpn)) => Source::Store,
                None => Source::Local,
            };
            let ahead = if matches!(source, Source::Store) { self.claim_ahead(&mut g, t, vpn, &mut victims, &mut lost) } else { Vec::new() };
            let extent = if matches!(source, Source::Local) { self.claim_extent(&mut g, t, vpn) } else { Vec::new() };
            let mut around = if matches!(source, Source::Local) && extent.is_empty() { self.claim_around(&mut g, t, vpn, &mut victims, &mut lost) } else { Vec::new() };
            let fresh = around.split_off(around.len().min(self.fault_around as usize));
            drop(g);
            // The fail hook talks to the process (its stderr, a signal): never under the lock.
            for (vt, why) in lost {
                self.fail(&vt, &why);
            }
            return Some(Claim { slot: c.slot, victims, source, ahead, around, fresh, extent });
        }
    }

    /// Claims ways for the lines the prefetcher asks for along its stride from `vpn`: lines
    /// that exist on the store and are neither resident nor in flight, up to the first that is
    /// not. Their victims are evicted as a miss's are, and written back with the miss.
    fn claim_ahead(&self, g: &mut MutexGuard<'_, State>, t: &ProcHeap, vpn: u64, victims: &mut Vec<Writeback>, lost: &mut Vec<(Arc<ProcHeap>, String)>) -> Vec<(u64, usize)> {
        let want = g.prefetcher.window(t.pid, vpn);
        let mut ahead = Vec::new();
        let lines = (1..=want.lines as i64).map_while(|i| want.stride.checked_mul(i).and_then(|d| vpn.checked_add_signed(d)));
        for v in lines {
            let stored = g.materialized.get(&t.pid).is_some_and(|s| s.contains(&v));
            // A page in the tier is newer than the store's copy.
            if !stored || g.cache.lookup(t.pid, v).is_some() || g.inflight.contains(&(t.pid, v)) || tiered(g, t.pid, v) {
                break;
            }
            let Some(c) = self.claim_way(g, t.pid, v, false) else { break };
            self.claimed(g, v);
            if let Some(victim) = c.victim {
                self.evict(g, victim, victims, lost, true);
            }
            self.rearm(g, v);
            ahead.push((v, c.slot));
        }
        ahead
    }

    /// Claims ways for the fresh lines next to a first touch at `vpn` (after it, or before it
    /// if the line after was touched already): lines that never left this
    /// pComponent, are not resident, lie in a writable mapping and take a way without a
    /// write-back, so that a program filling new memory traps once per window instead of once
    /// per page. The `fault_around` nearest are installed zero-filled, writable and dirty with
    /// the touched line; the `prealloc` beyond them are pre-allocated ([`MissPath::preallocate`]).
    /// Either way they hold ExCache ways like any line and are evicted by the policy. (A victim
    /// the kernel saw written after it was last asked goes to `victims` all the same.)
    fn claim_around(&self, g: &mut MutexGuard<'_, State>, t: &ProcHeap, vpn: u64, victims: &mut Vec<Writeback>, lost: &mut Vec<(Arc<ProcHeap>, String)>) -> Vec<(u64, usize)> {
        let window = self.fault_around + self.prealloc;
        if window == 0 {
            return Vec::new();
        }
        let Some(layout) = g.layouts.get(&t.pid) else { return Vec::new() };
        let writable = |v: u64| layout.find(v * PAGE).is_some_and(|(_, vma)| vma.prot & PROT_WRITE != 0);
        // With huge pages, the window ends with the extent: the next one's first touch may
        // take that extent whole.
        let huge = t.region.huge_pages();
        let fresh = |g: &MutexGuard<'_, State>, v: u64| {
            let stored = g.materialized.get(&t.pid).is_some_and(|s| s.contains(&v));
            // A page in the tier was written: it is not fresh, whether or not the store has it.
            !(stored || g.cache.lookup(t.pid, v).is_some() || g.inflight.contains(&(t.pid, v)) || tiered(g, t.pid, v))
        };
        // Memory filled downwards (GNU sort's line table grows from the end of its buffer) finds
        // the line above already touched: the window then runs downwards, so that such a
        // program too traps once per window instead of once per page.
        let up = writable(vpn + 1) && !(huge && (vpn + 1).is_multiple_of(EXTENT)) && fresh(g, vpn + 1);
        let candidates: Vec<u64> = if up {
            (vpn + 1..=vpn.saturating_add(window)).take_while(|v| writable(*v) && !(huge && v % EXTENT == 0)).collect()
        } else {
            (vpn.saturating_sub(window)..vpn).rev().take_while(|v| writable(*v) && !(huge && (v + 1) % EXTENT == 0)).collect()
        };
        let mut around = Vec::new();
        for v in candidates {
            if !fresh(g, v) {
                break;
            }
            let Some(c) = self.claim_way(g, t.pid, v, true) else { break };
            self.claimed(g, v);
            if let Some(victim) = c.victim {
                // A clean victim is dropped here, not offered to the tier: a first touch does
                // not wait for compression.
                self.evict(g, victim, victims, lost, false);
            }
            self.rearm(g, v);
            around.push((v, c.slot));
        }
        around
    }

    /// With huge pages, claims ways for the other lines of the 2 MiB extent of a first touch at
    /// `vpn`, if the whole extent is fresh (no line of it ever left this pComponent, is resident
    /// or in flight), lies in one writable mapping, and every line takes a way without a
    /// write-back; else claims nothing. The extent is then pre-allocated as one huge page
    /// ([`MissPath::allocate_extent`]).
    fn claim_extent(&self, g: &mut MutexGuard<'_, State>, t: &ProcHeap, vpn: u64) -> Vec<(u64, usize)> {
        let (first, end) = (vpn - vpn % EXTENT, vpn - vpn % EXTENT + EXTENT);
        let writable = g.layouts.get(&t.pid).and_then(|m| m.prot_of(first * PAGE, end * PAGE)).is_some_and(|p| p & PROT_WRITE != 0);
        if !t.region.huge_pages() || !writable {
            return Vec::new();
        }
        let others = || (first..end).filter(|v| *v != vpn);
        let stored = g.materialized.get(&t.pid).is_some_and(|s| s.range(first..end).next().is_some());
        if stored || others().any(|v| g.cache.lookup(t.pid, v).is_some() || g.inflight.contains(&(t.pid, v)) || tiered(g, t.pid, v)) {
            return Vec::new();
        }
        let mut extent = Vec::with_capacity(EXTENT as usize - 1);
        for v in others() {
            let Some(c) = g.cache.claim_clean(t.pid, v) else {
                for (v, _) in extent {
                    g.cache.remove(t.pid, v);
                }
                return Vec::new();
            };
            if let Some(victim) = c.victim {
                self.evict(g, victim, &mut Vec::new(), &mut Vec::new(), false);
            }
            self.claimed(g, v);
            self.rearm(g, v);
            extent.push((v, c.slot));
        }
        extent
    }

    /// Write-protects again the lines of `vpn`'s set whose reference bit the policy cleared
    /// (a line whose writes the kernel tracks keeps what it recorded: [`MissPath::observe`]).
    fn rearm(&self, g: &mut MutexGuard<'_, State>, vpn: u64) {
        for (pid, rv) in g.cache.take_rearm(vpn) {
            let Some(q) = g.heaps.get(&pid).cloned() else { continue };
            match g.cache.lookup(pid, rv) {
                Some(slot) if q.region.tracks_writes() => {
                    self.observe(&q, g.cache.line_mut(slot));
                }
                _ => {
                    let _ = q.region.write_protect(rv, 1, true);
                }
            }
        }
    }

    /// Drops a victim line from its process; a dirty one is captured first and marked in
    /// flight, its write-back (pushed to `victims`) now holding the only copy. A dirty line
    /// that cannot be captured is lost: its process is stopped here, under the lock, and pushed
    /// to `lost` to be failed once the lock is released. With the compressed tier on and
    /// `keep_clean`, a clean line the store holds is captured too, for the tier, and is in
    /// flight until the tier took it (so that no miss fetches it meanwhile and two copies exist).
    fn evict(&self, g: &mut MutexGuard<'_, State>, v: Line, victims: &mut Vec<Writeback>, lost: &mut Vec<(Arc<ProcHeap>, String)>, keep_clean: bool) {
        let Some(vt) = g.heaps.get(&v.pid).cloned() else { return };
        // A staged sample was never in the program: the store holds it, nothing is unmapped.
        if g.staged.remove(&(v.pid, v.vpn)).is_some() {
            g.prefetcher.outcome(v.pid, false);
            self.bump(&vt, |s| {
                s.evictions.fetch_add(1, Relaxed);
                s.prefetch_sample_wasted.fetch_add(1, Relaxed);
            });
            return;
        }
        if vt.region.tracks_writes() && vt.alive() {
            return self.evict_taken(g, &vt, v, victims, lost, keep_clean);
        }
        // A clean line the store does not hold is zeros never written: a miss zero-fills it again.
        let for_tier = !v.dirty && keep_clean && self.codec.is_some() && g.materialized.get(&v.pid).is_some_and(|s| s.contains(&v.vpn));
        if (v.dirty || for_tier) && vt.alive() {
            match capture(&vt, v.vpn, v.wp) {
                Ok(data) if self.needs_no_write_back(g, &vt, &v, &data) => {}
                Ok(data) => {
                    g.inflight.insert((v.pid, v.vpn));
                    let held = if v.dirty { Held::Evicted } else { Held::Clean };
                    victims.push(Writeback { heap: vt.clone(), vpn: v.vpn, data, held });
                }
                Err(e) if v.dirty => {
                    vt.alive.store(false, Relaxed);
                    lost.push((vt.clone(), format!("cannot read heap page {:#x} to write it back: {e}", v.vpn * PAGE)));
                }
                // The store holds it: nothing is lost.
                Err(_) => {}
            }
        }
        if let Err(why) = self.punch(&vt, v.vpn, 1) {
            vt.alive.store(false, Relaxed);
            lost.push((vt.clone(), why));
        }
        self.bump(&vt, |s| {
            s.evictions.fetch_add(1, Relaxed);
            s.inline_evictions.fetch_add(1, Relaxed);
        });
    }

    /// True if a dirty line needs no write-back: it never left this pComponent and is still
    /// all zeros, which is what a miss on it fills in anyway (an untouched pre-allocated or
    /// faulted-around line). Its contents were captured write-protected, so a later write
    /// traps and makes it dirty again.
    fn needs_no_write_back(&self, g: &MutexGuard<'_, State>, t: &ProcHeap, line: &Line, data: &[u8]) -> bool {
        let stored = g.materialized.get(&line.pid).is_some_and(|s| s.contains(&line.vpn));
        if stored || !is_zero(data) {
            return false;
        }
        self.bump(t, |s| {
            s.zero_writebacks_skipped.fetch_add(1, Relaxed);
            if line.fresh {
                s.prealloc_unused.fetch_add(1, Relaxed);
            }
        });
        true
    }

    /// Keeps a fetched read-ahead line in the pComponent as a sample: it holds its way as a
    /// clean line, and the program's first touch of it traps ([`MissPath::unstage_used`]).
    fn stage(&self, t: &ProcHeap, vpn: u64, slot: usize, page: Page) {
        let mut g = self.state.lock().unwrap();
        if g.cache.lookup(t.pid, vpn) == Some(slot) {
            g.cache.complete(slot, false, true);
            g.staged.insert((t.pid, vpn), page);
            self.bump(t, |s| {
                s.prefetch_sampled.fetch_add(1, Relaxed);
            });
        }
        drop(g);
        self.cv.notify_all();
    }

    /// The first touch of a staged sample: installs it as a miss would (writable and dirty
    /// for a write), under the lock because it is rare and needs no round trip.
    fn unstage_used(&self, g: &mut MutexGuard<'_, State>, t: &ProcHeap, vpn: u64, slot: usize, page: &[u8], access: Access) {
        let writable = access != Access::Read;
        let installed = t.region.copy(vpn, page, !writable).unwrap_or_else(|e| {
            tracing::warn!(pid = t.pid, addr = vpn * PAGE, error = %e, "cannot install a sampled read-ahead line");
            Install::Gone
        });
        if matches!(installed, Install::Gone) {
            g.cache.remove(t.pid, vpn);
            return;
        }
        g.cache.complete(slot, writable, !writable);
        g.prefetcher.outcome(t.pid, true);
        self.bump(t, |s| {
            s.prefetch_sample_used.fetch_add(1, Relaxed);
        });
    }

    /// Pre-allocates the claimed lines `fresh` (contiguous) in the program's memfd: they
    /// become resident, writable and dirty without being mapped, and the program's first touch
    /// of each is an ordinary page fault instead of a trap into the pComponent. A touch that
    /// trapped before the pages existed finds the line ready and is woken. If the memfd
    /// cannot take them, each is installed as fault-around installs its lines.
    fn preallocate(&self, t: &ProcHeap, fresh: &[(u64, usize)]) {
        // The window is contiguous, upwards or downwards from the touched line.
        let Some(first) = fresh.iter().map(|f| f.0).min() else { return };
        if let Err(e) = t.region.allocate(first, fresh.len() as u64) {
            tracing::debug!(pid = t.pid, addr = first * PAGE, error = %e, "cannot pre-allocate fresh lines; installing them");
            for (v, slot) in fresh {
                self.install(t, *v, *slot, None, true, true);
            }
            return;
        }
        let mut g = self.state.lock().unwrap();
        for &(v, slot) in fresh {
            if g.cache.lookup(t.pid, v) == Some(slot) {
                g.cache.complete(slot, true, false);
                g.cache.line_mut(slot).fresh = true;
            }
        }
        drop(g);
        self.cv.notify_all();
        self.bump(t, |s| {
            s.preallocated.fetch_add(fresh.len() as u64, Relaxed);
        });
    }

    /// Pre-allocates the 2 MiB extent of a first touch at `vpn` as one huge page: the touched
    /// line and `extent` (the others) become resident and dirty (writable, or write-protected
    /// if the region could give only 4 KiB pages), and the touching thread is woken to map it.
    /// If the region cannot, the touched line is installed alone and the others are given back.
    /// Returns whether the touched line is in the program.
    fn allocate_extent(&self, t: &ProcHeap, vpn: u64, slot: usize, extent: &[(u64, usize)], writable: bool) -> bool {
        let huge = match t.region.allocate_huge(vpn - vpn % EXTENT) {
            Ok(huge) => huge,
            Err(e) => {
                for (v, s) in extent {
                    self.abandon(t, *v, *s);
                }
                if let SplitError::Lost(e) = e {
                    self.abandon(t, vpn, slot);
                    self.fail(t, &format!("cannot put back the 2 MiB of heap at {:#x} after a failed huge page: {e}", (vpn - vpn % EXTENT) * PAGE));
                    return false;
                }
                tracing::debug!(pid = t.pid, addr = vpn * PAGE, error = %e, "cannot pre-allocate a huge page; installing the line alone");
                return self.install(t, vpn, slot, None, writable, writable);
            }
        };
        let mut g = self.state.lock().unwrap();
        for &(v, s) in extent.iter().chain([&(vpn, slot)]) {
            if g.cache.lookup(t.pid, v) == Some(s) {
                g.cache.complete(s, true, !huge);
                g.cache.line_mut(s).fresh = v != vpn;
            }
        }
        drop(g);
        self.cv.notify_all();
        t.region.wake(vpn);
        self.bump(t, |s| {
            s.preallocated.fetch_add(extent.len() as u64, Relaxed);
            s.huge_pages.fetch_add(huge as u64, Relaxed);
        });
        true
    }

    /// Drops [vpn, vpn + pages) from `t`'s program, splitting first the huge pages the range
    /// cuts. `Err` says what was lost when a split failed after the huge page had left the
    /// program: the process must be failed (the caller stops it under the lock).
    fn punch(&self, t: &ProcHeap, vpn: u64, pages: u64) -> Result<(), String> {
        match t.region.split_huge(vpn, pages) {
            Ok(0) => {}
            Ok(n) => self.bump(t, |s| {
                s.huge_splits.fetch_add(n, Relaxed);
            }),
            Err(SplitError::Lost(e)) => return Err(format!("cannot split the huge page holding heap page {:#x}: {e}; its other pages were lost", vpn * PAGE)),
            Err(e) => tracing::warn!(pid = t.pid, addr = vpn * PAGE, error = %e, "cannot split a huge page"),
        }
        if let Err(e) = t.region.punch(vpn, pages) {
            tracing::warn!(pid = t.pid, addr = vpn * PAGE, pages, error = %e, "cannot drop heap pages");
        }
        Ok(())
    }

    /// Step 2: the line's contents (`None`: zeros, a p-local line) and those of the lines read
    /// ahead that live at the same place (a prefix of `ahead`). Victims go to the compressed
    /// tier first; those that must still be written back are piggybacked on the fetch when
    /// they go to its place, the others are written back first.
    fn fill(&self, t: &ProcHeap, vpn: u64, source: Source, victims: Vec<Writeback>, ahead: &[u64]) -> Result<(Option<Page>, Vec<Page>), Refusal> {
        let victims = self.stash(victims);
        let place = match source {
            Source::Store => self.store.place(t.pid, vpn).ok(),
            Source::Local | Source::Tier(_) => None,
        };
        // One batch goes to one place: read ahead only as far as the lines live with `vpn`.
        let mut vpns = vec![vpn];
        vpns.extend(ahead.iter().take_while(|v| place.is_some() && self.store.place(t.pid, **v).ok() == place));
        let split = |mut pages: Vec<Page>| {
            let rest = pages.split_off(1);
            (pages.pop(), rest)
        };
        let (joint, apart): (Vec<Writeback>, Vec<Writeback>) = victims.into_iter().partition(|wb| self.piggyback && place.is_some() && self.store.place(wb.heap.pid, wb.vpn).ok() == place);
        self.flush_apart(apart);
        match source {
            Source::Local => return Ok((None, Vec::new())),
            Source::Tier(e) => return self.unpack(t, vpn, &e.packed).map(|p| (Some(p), Vec::new())),
            Source::Store => {}
        }
        let r = match (&joint[..], vpns.len()) {
            ([], 1) => self.store.fetch(t.pid, vpn).map(|p| vec![p]),
            ([], _) => self.store.fetch_many(t.pid, &vpns),
            ([wb], 1) => self.store.flush_fetch((wb.heap.pid, wb.vpn, &wb.data), (t.pid, vpn)).map(|p| vec![p]),
            (wbs, _) => {
                let flushes: Vec<(u64, u64, &[u8])> = wbs.iter().map(|wb| (wb.heap.pid, wb.vpn, &wb.data[..])).collect();
                self.store.flush_fetch_many(&flushes, t.pid, &vpns)
            }
        };
        if !joint.is_empty() {
            self.settle(joint, r.as_ref().map(|_| ()).map_err(Clone::clone), true);
        }
        r.map(split)
    }

    /// Offers captured victims to the compressed tier (compressed without the lock). Returns
    /// what must still go to the store: dirty victims that did not compress well enough, and
    /// the dirty entries the tier pushed out to make room, now in flight in their place.
    fn stash(&self, victims: Vec<Writeback>) -> Vec<Writeback> {
        let Some(codec) = self.codec.as_deref() else { return victims };
        if victims.is_empty() {
            return victims;
        }
        let t0 = Instant::now();
        let packed: Vec<Option<Box<[u8]>>> = victims.iter().map(|wb| codec.pack(&wb.data)).collect();
        let pack_ns = t0.elapsed().as_nanos() as u64 / victims.len() as u64;
        let (mut rest, mut pushed, mut stored, mut skipped) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut g = self.state.lock().unwrap();
        let st = &mut *g;
        let tier = st.tier.as_mut().expect("a codec comes with a tier");
        for (wb, p) in victims.into_iter().zip(packed) {
            let key = (wb.heap.pid, wb.vpn);
            // A process that exited meanwhile needs none of its pages.
            if !st.heaps.contains_key(&key.0) {
                st.inflight.remove(&key);
                continue;
            }
            let Some(p) = p else {
                skipped.push(wb.heap.clone());
                if wb.held == Held::Clean {
                    st.inflight.remove(&key);
                } else {
                    rest.push(wb);
                }
                continue;
            };
            stored.push((wb.heap.clone(), p.len() as u64));
            for (pid, vpn, e) in tier.insert(key.0, key.1, Entry { packed: p, dirty: wb.held != Held::Clean }) {
                if let Some(owner) = st.heaps.get(&pid).filter(|_| e.dirty) {
                    st.inflight.insert((pid, vpn));
                    pushed.push((owner.clone(), vpn, e.packed));
                }
            }
            // In the tier now: a miss on it finds it there.
            st.inflight.remove(&key);
        }
        drop(g);
        self.cv.notify_all();
        for (vt, bytes) in stored {
            self.bump(&vt, |s| {
                s.tier_stores.fetch_add(1, Relaxed);
                s.tier_bytes_raw.fetch_add(PAGE, Relaxed);
                s.tier_bytes_packed.fetch_add(bytes, Relaxed);
                s.tier_pack_ns.fetch_add(pack_ns, Relaxed);
            });
        }
        for vt in skipped {
            self.bump(&vt, |s| {
                s.tier_incompressible.fetch_add(1, Relaxed);
                s.tier_pack_ns.fetch_add(pack_ns, Relaxed);
            });
        }
        for (vt, vpn, packed) in pushed {
            match self.unpack(&vt, vpn, &packed) {
                Ok(data) => rest.push(Writeback { heap: vt, vpn, data, held: Held::PushedOut }),
                Err(e) => {
                    let wb = Writeback { heap: vt, vpn, data: Vec::new(), held: Held::PushedOut };
                    self.settle(vec![wb], Err(e), false);
                }
            }
        }
        rest
    }

    /// Restores a page from its tier entry.
    fn unpack(&self, t: &ProcHeap, vpn: u64, packed: &[u8]) -> Result<Page, Refusal> {
        let codec = self.codec.as_deref().expect("tier entries exist only with a codec");
        let t0 = Instant::now();
        let mut page = vec![0u8; PAGE_SIZE];
        let r = codec.unpack(packed, &mut page);
        let ns = t0.elapsed().as_nanos() as u64;
        self.bump(t, |s| {
            s.tier_unpack_ns.fetch_add(ns, Relaxed);
        });
        r.map(|()| page).map_err(|e| Refusal::new(splitos_rpc::ErrCode::Internal, format!("compressed tier: cannot decompress heap page {:#x}: {e}", vpn * PAGE)))
    }

    /// Writes back victims that travel without a fetch: one message per process and place
    /// (`flush_many` for several), each settled with its result. Returns the process of each
    /// message sent.
    fn flush_apart(&self, victims: Vec<Writeback>) -> Vec<Arc<ProcHeap>> {
        let mut groups: BTreeMap<(u64, Place), Vec<Writeback>> = BTreeMap::new();
        for wb in victims {
            match self.store.place(wb.heap.pid, wb.vpn) {
                Ok(p) => groups.entry((wb.heap.pid, p)).or_default().push(wb),
                Err(e) => self.settle(vec![wb], Err(e), false),
            }
        }
        let mut messages = Vec::new();
        for ((pid, _), mut group) in groups {
            while !group.is_empty() {
                let batch: Vec<Writeback> = group.drain(..group.len().min(FLUSH_BATCH)).collect();
                let r = match &batch[..] {
                    [wb] => self.store.flush(pid, wb.vpn, &wb.data),
                    _ => self.store.flush_many(pid, &batch.iter().map(|w| (w.vpn, &w.data[..])).collect::<Vec<_>>()),
                };
                messages.push(batch[0].heap.clone());
                self.settle(batch, r, false);
            }
        }
        messages
    }

    /// Step 3: installs a line (`None`: zeros) and completes its claim; a line installed
    /// `writable` is dirty, any other write-protected, and dirty as told. Returns whether the
    /// line is in the program now.
    fn install(&self, t: &ProcHeap, vpn: u64, slot: usize, data: Option<&[u8]>, writable: bool, dirty: bool) -> bool {
        let r = match data {
            Some(d) => t.region.copy(vpn, d, !writable),
            None => t.region.zero(vpn, !writable),
        };
        let installed = r.unwrap_or_else(|e| {
            tracing::warn!(pid = t.pid, addr = vpn * PAGE, error = %e, "cannot install a line");
            Install::Gone
        });
        let mut g = self.state.lock().unwrap();
        if g.cache.lookup(t.pid, vpn) == Some(slot) {
            match installed {
                // No write traps when the kernel tracks writes.
                Install::Done | Install::Exists => g.cache.complete(slot, dirty, !writable && !t.region.tracks_writes()),
                Install::Gone => {
                    g.cache.remove(t.pid, vpn);
                }
            }
        }
        drop(g);
        self.cv.notify_all();
        !matches!(installed, Install::Gone)
    }

    /// Gives back the way a failed miss claimed.
    fn abandon(&self, t: &ProcHeap, vpn: u64, slot: usize) {
        let mut g = self.state.lock().unwrap();
        if g.cache.lookup(t.pid, vpn) == Some(slot) {
            g.cache.remove(t.pid, vpn);
        }
        drop(g);
        self.cv.notify_all();
    }

    /// Ends write-backs that were sent together, with their one result. This is the one
    /// failure rule of every write-back (see the module documentation).
    fn settle(&self, wbs: Vec<Writeback>, r: Result<(), Refusal>, piggybacked: bool) {
        let mut lost = Vec::new();
        let mut g = self.state.lock().unwrap();
        for wb in &wbs {
            let (pid, vpn) = (wb.heap.pid, wb.vpn);
            if r.is_ok() {
                if let Some(m) = g.materialized.get_mut(&pid) {
                    m.insert(vpn);
                }
            }
            match wb.held {
                Held::Evicted | Held::PushedOut | Held::Clean => {
                    if r.is_err() && wb.held != Held::Clean && wb.heap.alive() {
                        // Stop the process before the page stops being in flight: none of its
                        // threads may miss on it and read zeros.
                        wb.heap.alive.store(false, Relaxed);
                        lost.push(wb);
                    }
                    g.inflight.remove(&(pid, vpn));
                }
                Held::Line(writes) => {
                    if let Some(slot) = g.cache.lookup(pid, vpn) {
                        let l = g.cache.line_mut(slot);
                        l.state = LineState::Ready;
                        if r.is_ok() && l.writes == writes {
                            l.dirty = false;
                        }
                    }
                }
                Held::Tier => {
                    if let Some(tier) = g.tier.as_mut() {
                        tier.unpin(pid, vpn, r.is_ok());
                    }
                    g.inflight.remove(&(pid, vpn));
                }
            }
        }
        drop(g);
        self.cv.notify_all();
        match &r {
            Ok(()) => {
                for wb in &wbs {
                    self.bump(&wb.heap, |s| {
                        s.flushes.fetch_add(1, Relaxed);
                        s.bytes_flushed.fetch_add(PAGE, Relaxed);
                        if piggybacked {
                            s.piggybacked.fetch_add(1, Relaxed);
                        }
                        if matches!(wb.held, Held::PushedOut | Held::Tier) {
                            s.tier_writebacks.fetch_add(1, Relaxed);
                        }
                    });
                }
            }
            Err(e) => {
                for wb in lost {
                    self.fail(&wb.heap, &format!("{}; it was the only copy of that page", e.msg));
                }
            }
        }
    }

    /// Writes back every dirty line and dirty tier entry of `t` in [first, end) (virtual
    /// pages), batched per place, so that the store holds the range's current contents (fork,
    /// mremap); the lines stay resident and the entries in the tier, and those not written
    /// meanwhile become clean. One whose write-back fails stays dirty, and the first error is
    /// returned.
    pub fn write_back_range(&self, t: &Arc<ProcHeap>, first: u64, end: u64) -> Result<(), Refusal> {
        let mut wbs = Vec::new();
        let mut result = Ok(());
        let mut pinned = Vec::new();
        {
            let mut g = self.wait_range_settled(t.pid, first, end);
            let resident = g.cache.resident_in(t.pid, first, end);
            let (written, protected) = self.scan_written(t, &resident);
            for (vpn, slot) in resident {
                if written.contains(&vpn) {
                    self.observed_write(g.cache.line_mut(slot));
                }
                let line = *g.cache.line(slot);
                if !line.dirty {
                    continue;
                }
                let captured = capture(t, vpn, line.wp || protected);
                let zero = captured.as_ref().is_ok_and(|data| self.needs_no_write_back(&g, t, &line, data));
                // Protected by the capture (also when reading it failed): its next write traps,
                // or the kernel records it.
                let l = g.cache.line_mut(slot);
                l.wp = !t.region.tracks_writes();
                match captured {
                    Ok(_) if zero => {
                        l.dirty = false;
                        l.fresh = false;
                    }
                    Ok(data) => {
                        l.state = LineState::WritingBack;
                        wbs.push(Writeback { heap: t.clone(), vpn, data, held: Held::Line(l.writes) });
                    }
                    Err(e) => result = Err(Refusal::new(splitos_rpc::ErrCode::Internal, format!("cannot read heap page {:#x}: {e}", vpn * PAGE))),
                }
            }
            // Pinned and in flight until acknowledged: no miss takes an entry whose older
            // contents could then reach the store after its newer ones.
            let st = &mut *g;
            if let Some(tier) = st.tier.as_mut() {
                pinned = tier.pin_dirty(t.pid, first, end);
                st.inflight.extend(pinned.iter().map(|(vpn, _)| (t.pid, *vpn)));
            }
        }
        for (vpn, packed) in pinned {
            match self.unpack(t, vpn, &packed) {
                Ok(data) => wbs.push(Writeback { heap: t.clone(), vpn, data, held: Held::Tier }),
                Err(e) => {
                    self.settle(vec![Writeback { heap: t.clone(), vpn, data: Vec::new(), held: Held::Tier }], Err(e.clone()), false);
                    result = result.and(Err(e));
                }
            }
        }
        let mut by_place: BTreeMap<Place, Vec<Writeback>> = BTreeMap::new();
        for wb in wbs {
            match self.store.place(t.pid, wb.vpn) {
                Ok(p) => by_place.entry(p).or_default().push(wb),
                Err(e) => {
                    self.settle(vec![wb], Err(e.clone()), false);
                    result = result.and(Err(e));
                }
            }
        }
        for (_, mut group) in by_place {
            while !group.is_empty() {
                let batch: Vec<Writeback> = group.drain(..group.len().min(FLUSH_BATCH)).collect();
                let pages: Vec<(u64, &[u8])> = batch.iter().map(|w| (w.vpn, &w.data[..])).collect();
                let r = self.store.flush_many(t.pid, &pages);
                if let Err(e) = &r {
                    result = result.and(Err(e.clone()));
                }
                self.settle(batch, r, false);
            }
        }
        result
    }

    /// Moves [first, end) out of the cache, the tier and the program after writing its dirty
    /// lines and entries back; the pages stay on the store (mremap moves them there). They are
    /// dropped only in the lock hold that saw every one of them clean: a write that raced the
    /// write-back (or a line evicted dirty into the tier meanwhile) is written back too, never
    /// dropped.
    pub fn evict_range(&self, t: &Arc<ProcHeap>, first: u64, end: u64) -> Result<(), Refusal> {
        loop {
            self.write_back_range(t, first, end)?;
            let g = self.wait_range_settled(t.pid, first, end);
            let dirty_lines = g.cache.resident_in(t.pid, first, end).iter().any(|(_, s)| g.cache.line(*s).dirty);
            if dirty_lines || tiered_dirty(&g, t.pid, first, end) {
                continue;
            }
            if t.region.tracks_writes() {
                return self.drop_taken(g, t, first, end);
            }
            self.drop_locked(g, t, first, end, false);
            return Ok(());
        }
    }

    /// Drops [first, end) from the cache and from the program without writing anything back,
    /// and forgets that those pages ever existed on the store (munmap, MADV_DONTNEED). True if
    /// some of them did: only then do their owners hold anything of the range.
    pub fn discard_range(&self, t: &ProcHeap, first: u64, end: u64) -> bool {
        let g = self.wait_range_settled(t.pid, first, end);
        self.drop_locked(g, t, first, end, true)
    }

    fn drop_locked(&self, mut g: MutexGuard<'_, State>, t: &ProcHeap, first: u64, end: u64, forget: bool) -> bool {
        for (vpn, _) in g.cache.resident_in(t.pid, first, end) {
            g.cache.remove(t.pid, vpn);
        }
        // A later mapping at these addresses must never find the old contents.
        if let Some(tier) = g.tier.as_mut() {
            tier.drop_range(t.pid, first, end);
        }
        unstage(&mut g, t.pid, first, end);
        // Stopped under the lock: no thread of it may be woken onto a lost page.
        let lost = self.punch(t, first, end - first).inspect_err(|_| t.alive.store(false, Relaxed)).err();
        let mut stored = false;
        if forget {
            if let Some(m) = g.materialized.get_mut(&t.pid) {
                let gone: Vec<u64> = m.range(first..end).copied().collect();
                stored = !gone.is_empty();
                for v in gone {
                    m.remove(&v);
                }
            }
        }
        drop(g);
        if let Some(why) = lost {
            self.fail(t, &why);
        }
        stored
    }

    /// Locks the state once no line of [first, end) is being filled or written back.
    fn wait_range_settled(&self, pid: u64, first: u64, end: u64) -> MutexGuard<'_, State> {
        let mut g = self.state.lock().unwrap();
        loop {
            let busy = g.cache.resident_in(pid, first, end).iter().any(|(_, s)| g.cache.line(*s).state != LineState::Ready);
            let flying = g.inflight.iter().any(|(q, v)| *q == pid && *v >= first && *v < end);
            if !busy && !flying {
                return g;
            }
            g = self.cv.wait(g).unwrap();
        }
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

fn tiered_dirty(g: &State, pid: u64, first: u64, end: u64) -> bool {
    g.tier.as_ref().is_some_and(|t| t.has_dirty(pid, first, end))
}

fn is_zero(data: &[u8]) -> bool {
    data.chunks_exact(16).all(|c| u128::from_ne_bytes(c.try_into().expect("16 bytes")) == 0)
}

/// Write-protects a dirty line (so later writes trap) and copies it out. A line that could
/// not be protected is not captured: a write after the copy would go unseen.
fn capture(t: &ProcHeap, vpn: u64, wp: bool) -> std::io::Result<Page> {
    if !wp {
        t.region.write_protect(vpn, 1, true)?;
    }
    let mut data = vec![0u8; PAGE_SIZE];
    t.region.read_out(vpn, &mut data)?;
    Ok(data)
}

mod evictor;
mod scan;
#[cfg(test)]
mod tests;
