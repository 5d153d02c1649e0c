//! The ExCache: a set-associative, virtually indexed cache of 4 KB lines of remote memory,
//! owned by the pComponent and shared by all of its processes. This is its bookkeeping; the
//! miss path moves the data (miss/). A line is tagged by (process, virtual page).
//!
//! Eviction policy is a swappable component ([`EvictionPolicy`]): FIFO evicts in fill order;
//! CLOCK approximates LRU with a reference bit and a hand per set; ghost CLOCK admits a new
//! line unreferenced unless it was evicted recently, so that lines used once (a scan) leave
//! before lines in use. A policy sees the access events the pComponent sees: a line claimed,
//! used (a write trap, or with access sampling a touch) and evicted.
//!
//! Interleaving ([`ExCache::with_interleave`], ThymesisFlow's best configuration) keeps a share
//! of the heap's pages local for good: a line of such a page is pinned when filled, and no
//! policy ever chooses it; the others come and go as remote memory. A job may choose its own
//! share ([`ExCache::set_interleave`]) instead of the pComponent's.
//!
//! Processes sharing the cache may each keep a floor of lines against the others' misses
//! ([`ExCache::with_floor`], off unless configured): then a program whose misses come fast
//! cannot evict every line of one whose misses come slowly.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

mod eviction;
mod evictor;
mod workingset;
pub use eviction::{Clock, EvictionPolicy, Fifo, GhostClock};
pub use workingset::Workingset;

use splitos_core::config::MIN_UNPINNED;

use crate::stats::RunStats;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineState {
    /// Claimed by a miss that is still fetching; never a victim.
    Filling,
    Ready,
    /// Resident and being written back (fork, mremap); never a victim until acknowledged.
    WritingBack,
    /// Chosen by the background evictor, which is capturing and dropping it; a miss on it
    /// waits, as on a line being filled.
    Evicting,
}

#[derive(Clone, Copy, Debug)]
pub struct Line {
    pub pid: u64,
    pub vpn: u64,
    pub state: LineState,
    /// Written since it was last written back: must be flushed when evicted.
    pub dirty: bool,
    /// Mapped write-protected in the program, so the next write traps to us.
    pub wp: bool,
    /// CLOCK's reference bit: set on fill, on every write we observe and, with access
    /// sampling, when the line is found touched since it was unmapped.
    pub referenced: bool,
    /// Set by a policy that cleared `referenced` and wants the next use observed again (the
    /// next write, or with access sampling the next touch).
    pub rearm: bool,
    /// Unmapped by access sampling, its page kept: the kernel maps it again at the program's
    /// next touch, which only the page tables tell.
    pub unmapped: bool,
    /// Queued to be unmapped by access sampling, not unmapped yet: still mapped, which says
    /// nothing of its use.
    pub unmap_queued: bool,
    /// Fill order, for FIFO.
    pub seq: u64,
    /// Pre-allocated ahead of the program: it may have been written without any trap, and
    /// may still be all zeros.
    pub fresh: bool,
    /// Writes observed since the fill: a write-back acknowledged for an older count leaves
    /// the line dirty.
    pub writes: u32,
    /// Filled by a read miss of a process whose writes the kernel tracks: fault tracking
    /// installs such a line writable and dirty whenever the process predicts writes.
    pub read_fill: bool,
    /// Read ahead and installed write-protected, not written since: its first write tells its
    /// process how often the lines it reads ahead are written.
    pub ahead: bool,
    /// Kept local for good (interleaving): never a victim.
    pub pinned: bool,
}

impl Line {
    /// Whether a policy may choose the line as a victim: ready, and not pinned. Every policy
    /// chooses among these only.
    pub fn candidate(&self) -> bool {
        self.state == LineState::Ready && !self.pinned
    }
}

/// Which heap pages interleaving keeps local: `local` of every `of` pages, or of every `of`
/// ranges of `unit` pages, round robin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interleave {
    pub local: u64,
    pub of: u64,
    pub unit: u64,
}

impl Interleave {
    /// A configuration's: `ratio` of every range of `unit` bytes.
    pub fn of(ratio: splitos_core::config::InterleaveRatio, unit: splitos_core::config::Size) -> Option<Interleave> {
        ratio.0.map(|(local, of)| Interleave {
            local: local.into(),
            of: of.into(),
            unit: unit.0 / splitos_rpc::PAGE_SIZE as u64,
        })
    }

    /// Whether `vpn` is local in a cache of `sets` sets. The round robin runs over the pages
    /// that share a set (in address order), so that every set keeps its share: dealing out
    /// consecutive pages would put every local page of a 1:2 round robin in the even sets.
    /// Seen from the program, a page is then a range of as many pages as there are sets, and
    /// a range shorter than that acts as a page.
    pub fn is_local(&self, vpn: u64, sets: u64) -> bool {
        (vpn / sets / (self.unit / sets).max(1)) % self.of < self.local
    }
}

/// What a line is once its fill completes ([`ExCache::complete`]).
#[derive(Clone, Copy, Debug)]
pub struct Filled {
    pub dirty: bool,
    /// Mapped write-protected.
    pub wp: bool,
}

/// Candidates of one claim the policy may pass over because their process is at its floor:
/// a bound, so that a fully associative cache (one set of every line) does not ask its policy
/// again and again on the way of a miss.
const SHIELDED: usize = 8;

/// What a miss got: the slot it fills and the line it displaced, if any.
pub struct Claim {
    pub slot: usize,
    pub victim: Option<Line>,
}

/// Nothing here scans a whole set on the way of a miss when it need not: a fully associative
/// cache is one set of every line.
pub struct ExCache {
    nsets: usize,
    /// Ways in use per set: the cache's size is `nsets * ways` lines, and it changes while
    /// programs run ([`ExCache::resize`]) up to `stride` ways. A set's ways sit at
    /// `set * stride`, so a line's slot never moves when the size changes.
    ways: usize,
    stride: usize,
    slots: Vec<Option<Line>>,
    /// Per set: its policy's hand; CLOCK's counts the ways it has passed since the cache
    /// began, and points at that modulo the set's ways.
    hands: Vec<usize>,
    /// Per set: lines held in its ways.
    held: Vec<usize>,
    /// Per set: lines still held in ways past its end after a shrink (being evicted).
    past_end: Vec<usize>,
    /// Per set: its free ways (each way within `ways` that holds no line, once). A scan for
    /// the lowest free way cost a miss thousands of steps in a large fully associative set
    /// whose lines the evictor frees all over it.
    free: Vec<Vec<u32>>,
    /// Per set: where its hand stood when the set was last checked for lines to rearm. Only
    /// the ways the hand passed since are looked at: a look at every way cost each miss
    /// thousands of steps in a large fully associative set (CLOCK's misses spent more time
    /// there than in the kernel).
    rearm_from: Vec<usize>,
    /// Per set: lines the background evictor is taking out (`LineState::Evicting`).
    evicting: Vec<usize>,
    /// Per set: pinned lines in its ways, at most [`ExCache::pin_cap`].
    pinned: Vec<usize>,
    /// The pComponent's interleaving, for processes whose job chose none of its own.
    interleave: Option<Interleave>,
    /// Processes whose job chose its own interleaving (or none).
    own_interleave: HashMap<u64, Option<Interleave>>,
    /// Ways of a set interleaving never pins: [`MIN_UNPINNED`] and those the background
    /// evictor keeps free.
    unpinned: usize,
    used: usize,
    index: HashMap<u64, BTreeMap<u64, usize>>,
    policy: Box<dyn EvictionPolicy>,
    /// Victims each policy replaced so far chose, by name, and those the current one chose:
    /// which policy ran, across replacements (a plain count on the eviction path).
    victims: BTreeMap<&'static str, u64>,
    chosen: u64,
    seq: u64,
    /// Percent of an equal share (lines over processes holding lines) that each process keeps
    /// against other processes' misses (0: none).
    floor: usize,
    /// Each process's group (its vNode), for shares.
    groups: HashMap<u64, u32>,
    /// Lines each group holds, and the lines a group with a share keeps against other
    /// groups' misses ([`ExCache::set_shares`]).
    group_lines: HashMap<u32, usize>,
    shares: HashMap<u32, usize>,
    /// Each process's run, and the pages the process has had lines for: the run counts
    /// them (`RunStats::pages`), as the ExCache a program needs.
    runs: HashMap<u64, Arc<RunStats>>,
    seen: HashMap<u64, HashSet<u64>>,
}

impl ExCache {
    /// `lines` total lines in sets of `ways` (0 = fully associative).
    pub fn new(lines: usize, ways: usize, policy: Box<dyn EvictionPolicy>) -> ExCache {
        ExCache::growable(lines, lines, ways, policy)
    }

    /// As [`ExCache::new`], able to grow to `max_lines` while running (rounded down to whole
    /// ways of every set). Only bookkeeping is reserved for them: a line's page is the
    /// program's own.
    pub fn growable(lines: usize, max_lines: usize, ways: usize, policy: Box<dyn EvictionPolicy>) -> ExCache {
        let lines = lines.max(1);
        let ways = if ways == 0 || ways > lines { lines } else { ways };
        let nsets = lines / ways;
        let stride = (max_lines / nsets).max(ways);
        ExCache {
            nsets,
            ways,
            stride,
            slots: vec![None; nsets * stride],
            hands: vec![0; nsets],
            held: vec![0; nsets],
            past_end: vec![0; nsets],
            free: (0..nsets).map(|_| (0..ways as u32).rev().collect()).collect(),
            rearm_from: vec![0; nsets],
            evicting: vec![0; nsets],
            pinned: vec![0; nsets],
            interleave: None,
            own_interleave: HashMap::new(),
            unpinned: MIN_UNPINNED,
            used: 0,
            index: HashMap::new(),
            policy,
            victims: BTreeMap::new(),
            chosen: 0,
            seq: 0,
            floor: 0,
            groups: HashMap::new(),
            group_lines: HashMap::new(),
            shares: HashMap::new(),
            runs: HashMap::new(),
            seen: HashMap::new(),
        }
    }

    /// Ways per set for a cache of `lines` lines: its size rounds down to whole ways of every
    /// set, between one way and the most it may grow to.
    pub fn ways_for(&self, lines: usize) -> Result<usize, crate::miss::ResizeError> {
        let ways = lines / self.nsets;
        if ways == 0 || ways > self.stride {
            return Err(crate::miss::ResizeError::Lines {
                lines,
                sets: self.nsets,
                ways: self.stride,
            });
        }
        Ok(ways)
    }

    /// Uses `ways` ways per set from now on. Growing takes effect at once; after shrinking,
    /// the lines in ways past the new end are still resident and are no miss's to take:
    /// [`ExCache::beyond`] names them for the miss path to evict.
    pub fn resize(&mut self, ways: usize) {
        assert!(
            ways > 0 && ways <= self.stride,
            "{ways} ways in sets of at most {}",
            self.stride
        );
        self.ways = ways;
        for set in 0..self.nsets {
            // The hand's steps since then counted other ways: the next look takes them all.
            self.rearm_from[set] = self.hands[set].wrapping_sub(self.stride);
            let base = set * self.stride;
            let (within, past) = self.slots[base..base + self.stride].split_at(ways);
            self.held[set] = within.iter().flatten().count();
            self.evicting[set] = within
                .iter()
                .flatten()
                .filter(|l| l.state == LineState::Evicting)
                .count();
            self.past_end[set] = past.iter().flatten().count();
            self.free[set] = (0..ways as u32)
                .rev()
                .filter(|w| within[*w as usize].is_none())
                .collect();
            // Fewer ways may leave more pinned lines than a set keeps: the newest go back to
            // coming and going.
            let mut pinned: Vec<(u64, usize)> = (0..ways)
                .filter_map(|w| self.slots[base + w].filter(|l| l.pinned).map(|l| (l.seq, base + w)))
                .collect();
            pinned.sort_unstable();
            for (_, slot) in pinned.drain(pinned.len().min(self.pin_cap())..) {
                self.line_mut(slot).pinned = false;
            }
            self.pinned[set] = pinned.len();
        }
    }

    /// The most lines of a set that interleaving pins: all its ways but those it never pins,
    /// so that as much of the local share as the ExCache can hold stays local, as asked.
    fn pin_cap(&self) -> usize {
        self.ways.saturating_sub(self.unpinned)
    }

    /// Keeps the lines of the heap pages `interleave` names local for good, from now on, for
    /// every process whose job chose no interleaving of its own.
    pub fn with_interleave(mut self, interleave: Option<Interleave>) -> ExCache {
        self.interleave = interleave;
        self
    }

    /// Interleaving never pins the `reserve` ways per set the background evictor keeps free
    /// either: a pinned line in one of them would leave the set's remote pages fewer than
    /// [`MIN_UNPINNED`] ways to come and go in.
    pub fn with_evict_reserve(mut self, reserve: usize) -> ExCache {
        self.unpinned = MIN_UNPINNED + reserve;
        self
    }

    /// Process `pid`'s job chose its own interleaving (`None`: none), instead of the
    /// pComponent's, from its next fill on.
    pub fn set_interleave(&mut self, pid: u64, interleave: Option<Interleave>) {
        self.own_interleave.insert(pid, interleave);
    }

    /// The interleaving `pid`'s job chose, if it chose one.
    pub fn job_interleave(&self, pid: u64) -> Option<Option<Interleave>> {
        self.own_interleave.get(&pid).copied()
    }

    fn interleave_of(&self, pid: u64) -> Option<Interleave> {
        self.own_interleave.get(&pid).copied().unwrap_or(self.interleave)
    }

    /// Whether a line of `pid` may be pinned: with shares, only within its vNode's share, so
    /// that no job pins away lines another vNode's share keeps.
    fn may_pin(&self, pid: u64) -> bool {
        if self.shares.is_empty() {
            return true;
        }
        self.group_of(pid)
            .is_some_and(|g| self.shares.get(&g).is_some_and(|share| self.group_lines(g) < *share))
    }

    /// Lines pinned by interleaving.
    pub fn pinned_lines(&self) -> usize {
        self.pinned.iter().sum()
    }

    /// The most lines it may grow to.
    pub fn max_lines(&self) -> usize {
        self.nsets * self.stride
    }

    /// Resident lines in ways past the cache's size (left by a shrink), as (slot, line).
    pub fn beyond(&self) -> Vec<(usize, Line)> {
        let mut out = Vec::new();
        for set in (0..self.nsets).filter(|s| self.past_end[*s] > 0) {
            let base = set * self.stride;
            for way in self.ways..self.stride {
                if let Some(l) = self.slots[base + way] {
                    out.push((base + way, l));
                }
            }
        }
        out
    }

    /// Marks a resident `Ready` line `Evicting`, as [`ExCache::pick`] does with the policy's.
    pub fn mark_evicting(&mut self, slot: usize) {
        let l = self.line_mut(slot);
        assert_eq!(l.state, LineState::Ready, "only a ready line is evicted");
        l.state = LineState::Evicting;
        if slot % self.stride < self.ways {
            self.evicting[slot / self.stride] += 1;
        }
    }

    /// Puts process `pid` in group `group` (its vNode), for shares.
    pub fn set_group(&mut self, pid: u64, group: u32) {
        let held = self.resident_of(pid);
        if let Some(old) = self.groups.insert(pid, group) {
            self.count_group(old, held, false);
        }
        self.count_group(group, held, true);
    }

    /// Lines each group keeps against other groups' misses while it holds no more: a miss of
    /// another group passes over them, as over a line being filled, unless its set has no
    /// other line to give. Replaces every share. With shares, a miss in a full set looks at
    /// each of the set's lines once.
    pub fn set_shares(&mut self, shares: HashMap<u32, usize>) {
        self.shares = shares;
    }

    pub fn shares(&self) -> &HashMap<u32, usize> {
        &self.shares
    }

    /// Process `pid` counts the pages it has lines for in `run`'s.
    pub fn set_run(&mut self, pid: u64, run: Arc<RunStats>) {
        self.runs.insert(pid, run);
    }

    /// Process `pid` gave up [first, end) (munmap, MADV_DONTNEED): those pages are no longer
    /// its, and a later line for one of them is a first one, not a page had again. (A runtime
    /// that frees and maps its heap all the time, as V8 does, otherwise counted every page it
    /// ever touched: Node.js's 177 MiB heap showed as 236.)
    pub fn forget_pages(&mut self, pid: u64, first: u64, end: u64) {
        let Some(seen) = self.seen.get_mut(&pid) else { return };
        let before = seen.len();
        if end - first < before as u64 {
            for v in first..end {
                seen.remove(&v);
            }
        } else {
            seen.retain(|v| *v < first || *v >= end);
        }
        if let Some(run) = self.runs.get(&pid) {
            run.pages.left((before - seen.len()) as u64);
        }
    }

    /// Process `pid` left (its lines already did): pids are reused.
    pub fn forget_group(&mut self, pid: u64) {
        if let (Some(run), Some(seen)) = (self.runs.remove(&pid), self.seen.remove(&pid)) {
            run.pages.left(seen.len() as u64);
        }
        self.own_interleave.remove(&pid);
        let held = self.resident_of(pid);
        if let Some(g) = self.groups.remove(&pid) {
            self.count_group(g, held, false);
        }
    }

    fn count_group(&mut self, group: u32, n: usize, add: bool) {
        let c = self.group_lines.entry(group).or_default();
        *c = if add { *c + n } else { c.saturating_sub(n) };
    }

    /// Lines the processes of group `group` hold.
    pub fn group_lines(&self, group: u32) -> usize {
        self.group_lines.get(&group).copied().unwrap_or(0)
    }

    fn group_of(&self, pid: u64) -> Option<u32> {
        self.groups.get(&pid).copied()
    }

    /// Whether a miss of `pid` must pass over `victim`: its group holds no more than its
    /// share, and is not `pid`'s.
    fn shared_away(&self, pid: u64, victim: &Line) -> bool {
        let Some(g) = self.group_of(victim.pid) else {
            return false;
        };
        self.group_of(pid) != Some(g)
            && self
                .shares
                .get(&g)
                .is_some_and(|share| self.group_lines.get(&g).copied().unwrap_or(0) <= *share)
    }

    /// Each process keeps `percent` of an equal share of the lines (the lines over the
    /// processes holding any) against other processes' misses: while it holds no more, the
    /// policy passes over its lines for a miss of another process, unless its set has no
    /// other line to give.
    pub fn with_floor(mut self, percent: usize) -> ExCache {
        self.floor = percent;
        self
    }

    /// The lines a process keeps against others' misses.
    fn floor_lines(&self) -> usize {
        self.lines() * self.floor / 100 / self.index.len().max(1)
    }

    pub fn lines(&self) -> usize {
        self.nsets * self.ways
    }
    pub fn ways(&self) -> usize {
        self.ways
    }
    pub fn sets(&self) -> usize {
        self.nsets
    }
    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Replaces the eviction policy while lines are resident: the new one starts from the
    /// lines as they are (their reference bits, their fill order), without the old one's
    /// history (ghost entries).
    pub fn set_policy(&mut self, policy: Box<dyn EvictionPolicy>) {
        *self.victims.entry(self.policy.name()).or_default() += std::mem::take(&mut self.chosen);
        self.policy = policy;
    }

    /// Victims each policy chose so far, by name.
    pub fn victims_by_policy(&self) -> BTreeMap<&'static str, u64> {
        let mut v = self.victims.clone();
        *v.entry(self.policy.name()).or_default() += self.chosen;
        v
    }

    fn evicted(&mut self, line: &Line) {
        self.policy.evicted(self.set_of(line.vpn), line);
        self.chosen += 1;
    }

    pub fn set_of(&self, vpn: u64) -> usize {
        (vpn % self.nsets as u64) as usize
    }

    pub fn lookup(&self, pid: u64, vpn: u64) -> Option<usize> {
        self.index.get(&pid).and_then(|m| m.get(&vpn)).copied()
    }

    pub fn line(&self, slot: usize) -> &Line {
        self.slots[slot].as_ref().expect("slot holds a line")
    }

    pub fn line_mut(&mut self, slot: usize) -> &mut Line {
        self.slots[slot].as_mut().expect("slot holds a line")
    }

    /// Claims a way for (pid, vpn) in its set: a free one (lowest index first, as a free list
    /// would hand out), else the policy's victim, which leaves the cache here.
    pub fn claim(&mut self, pid: u64, vpn: u64) -> Option<Claim> {
        self.claim_where(pid, vpn, |_| true, |_| false)
    }

    /// As [`ExCache::claim`], but only if the way needs no write-back: a free way, or a clean
    /// victim (fault-around never makes a first touch wait for a write-back).
    pub fn claim_clean(&mut self, pid: u64, vpn: u64) -> Option<Claim> {
        self.claim_where(pid, vpn, |v| !v.dirty, |_| false)
    }

    /// As [`ExCache::claim`], for lines whose uses nobody sees as they happen. Before the
    /// policy's victim goes, `used` is asked whether it was used since it was last looked at
    /// (by a policy that watches writes, of every victim: written since its reference bit was
    /// cleared; by any, of a victim access sampling unmapped: touched since): the policy hears
    /// of a used line as of any use and picks again, at most once per way. Then `evictable`
    /// may still refuse the victim (as [`ExCache::claim_clean`] refuses a dirty one). Both may
    /// mark the line dirty.
    pub fn claim_observing(
        &mut self,
        pid: u64,
        vpn: u64,
        evictable: impl FnMut(&mut Line) -> bool,
        used: impl FnMut(&mut Line) -> bool,
    ) -> Option<Claim> {
        self.claim_where(pid, vpn, evictable, used)
    }

    fn claim_where(
        &mut self,
        pid: u64,
        vpn: u64,
        mut evictable: impl FnMut(&mut Line) -> bool,
        mut used: impl FnMut(&mut Line) -> bool,
    ) -> Option<Claim> {
        let set = self.set_of(vpn);
        let base = set * self.stride;
        let range = base..base + self.ways;
        let slot = if self.held[set] < self.ways {
            let i = self.free[set].pop().expect("a set not full has a free way") as usize;
            debug_assert!(i < self.ways && self.slots[base + i].is_none(), "way {i} is free");
            self.held[set] += 1;
            self.used += 1;
            (base + i, None)
        } else {
            let mut floor = self.floor_lines();
            let mut spared = 0;
            // Lines passed over for their process's floor, kept out of the policy's sight as
            // if being filled until the victim is chosen.
            let mut shielded = Vec::new();
            // Those of vNodes within their shares are all kept out at once, in one pass.
            let mut by_share = 0;
            if !self.shares.is_empty() {
                for way in range.clone() {
                    if self.slots[way]
                        .as_ref()
                        .is_some_and(|l| l.state == LineState::Ready && self.shared_away(pid, l))
                    {
                        self.line_mut(way).state = LineState::Filling;
                        shielded.push(way);
                    }
                }
                by_share = shielded.len();
            }
            let i = loop {
                let Some(i) = self
                    .policy
                    .victim(set, &mut self.slots[range.clone()], &mut self.hands[set])
                else {
                    if shielded.is_empty() {
                        return None;
                    }
                    // Every line left is at its process's floor or within its vNode's share:
                    // they give way.
                    self.unshield(&mut shielded);
                    floor = 0;
                    by_share = 0;
                    continue;
                };
                let l = self.slots[base + i].as_ref().expect("victim is a line");
                // A share shields without bound (the set's ways bound it); a floor gives way
                // after a few lines.
                let bound = if self.policy.passes_over_cheaply() {
                    self.ways
                } else {
                    SHIELDED
                };
                if floor > 0 && l.pid != pid && shielded.len() < bound + by_share && self.resident_of(l.pid) <= floor {
                    shielded.push(base + i);
                    self.line_mut(base + i).state = LineState::Filling;
                    continue;
                }
                let l = self.slots[base + i].as_mut().expect("victim is a line");
                // A policy that watches writes (one that rearms) asks of every victim; any asks
                // of one that access sampling unmapped, which the program may have touched since.
                if !(self.policy.rearms() || l.unmapped) || spared == self.ways || !used(l) {
                    break i;
                }
                self.policy.touched(set, i, l);
                spared += 1;
            };
            self.unshield(&mut shielded);
            if !evictable(self.slots[base + i].as_mut().expect("victim is a line")) {
                return None;
            }
            let v = self.slots[base + i].take().expect("victim is a line");
            self.unindex(v.pid, v.vpn);
            self.evicted(&v);
            (base + i, Some(v))
        };
        self.seq += 1;
        let referenced = self.policy.admit(pid, vpn);
        let pinned = self
            .interleave_of(pid)
            .is_some_and(|i| i.is_local(vpn, self.nsets as u64))
            && self.pinned[set] < self.pin_cap()
            && self.may_pin(pid);
        self.pinned[set] += pinned as usize;
        self.slots[slot.0] = Some(Line {
            pid,
            vpn,
            state: LineState::Filling,
            dirty: false,
            wp: false,
            referenced,
            rearm: false,
            unmapped: false,
            unmap_queued: false,
            seq: self.seq,
            fresh: false,
            writes: 0,
            read_fill: false,
            ahead: false,
            pinned,
        });
        let line = self.slots[slot.0].as_ref().expect("just filled");
        self.policy.filled(set, slot.0 - base, line, &self.slots[range]);
        self.index.entry(pid).or_default().insert(vpn, slot.0);
        if let Some(g) = self.group_of(pid) {
            self.count_group(g, 1, true);
        }
        if let Some(run) = self.runs.get(&pid) {
            if self.seen.entry(pid).or_default().insert(vpn) {
                run.pages.first();
            } else {
                run.pages.again();
            }
        }
        Some(Claim {
            slot: slot.0,
            victim: slot.1,
        })
    }

    fn unshield(&mut self, shielded: &mut Vec<usize>) {
        for slot in shielded.drain(..) {
            self.line_mut(slot).state = LineState::Ready;
        }
    }

    /// The slots of `vpn`'s set whose lines a policy wants observed again (CLOCK cleared
    /// their reference bit); their marks are cleared.
    pub fn take_rearm(&mut self, vpn: u64) -> Vec<usize> {
        let set = self.set_of(vpn);
        let base = set * self.stride;
        if let Some(ways) = self.policy.take_rearmed(set) {
            return ways
                .into_iter()
                .map(|w| base + w)
                .filter(|&slot| self.slots[slot].as_mut().is_some_and(|l| std::mem::take(&mut l.rearm)))
                .collect();
        }
        let (from, to) = (self.rearm_from[set], self.hands[set]);
        self.rearm_from[set] = to;
        let passed = to.wrapping_sub(from).min(self.ways);
        let first = (to % self.ways + self.ways - passed) % self.ways;
        let mut out = Vec::new();
        for step in 0..passed {
            let way = base + (first + step) % self.ways;
            if let Some(l) = self.slots[way].as_mut().filter(|l| l.rearm) {
                l.rearm = false;
                out.push(way);
            }
        }
        out
    }

    pub fn complete(&mut self, slot: usize, Filled { dirty, wp }: Filled) {
        let l = self.line_mut(slot);
        l.state = LineState::Ready;
        l.dirty = dirty;
        l.wp = wp;
    }

    /// The program was seen using the line in `slot` (the policy decides what that means).
    pub fn touch(&mut self, slot: usize) {
        let l = self.slots[slot].as_mut().expect("slot holds a line");
        self.policy.touched(slot / self.stride, slot % self.stride, l);
    }

    fn unindex(&mut self, pid: u64, vpn: u64) {
        let Some(m) = self.index.get_mut(&pid) else { return };
        let held = m.remove(&vpn).is_some();
        if m.is_empty() {
            self.index.remove(&pid);
        }
        if let Some(g) = self.group_of(pid).filter(|_| held) {
            self.count_group(g, 1, false);
        }
    }

    pub fn remove(&mut self, pid: u64, vpn: u64) -> Option<Line> {
        let slot = self.lookup(pid, vpn)?;
        self.unindex(pid, vpn);
        let (set, way) = (slot / self.stride, slot % self.stride);
        if way >= self.ways {
            self.past_end[set] -= 1;
        } else {
            if self.line(slot).state == LineState::Evicting {
                self.evicting[set] -= 1;
            }
            if self.line(slot).pinned {
                self.pinned[set] -= 1;
            }
            self.held[set] -= 1;
            self.free[set].push(way as u32);
        }
        self.used -= 1;
        let line = self.slots[slot].take();
        // A line the background evictor picked is a victim; others leave with their range.
        if let Some(l) = line.as_ref().filter(|l| l.state == LineState::Evicting) {
            self.evicted(l);
        }
        line
    }

    /// Resident (pid, vpn) lines in [first, end) of virtual pages.
    pub fn resident_in(&self, pid: u64, first: u64, end: u64) -> Vec<(u64, usize)> {
        self.index
            .get(&pid)
            .map(|m| m.range(first..end).map(|(v, s)| (*v, *s)).collect())
            .unwrap_or_default()
    }

    pub fn resident_of(&self, pid: u64) -> usize {
        self.index.get(&pid).map_or(0, |m| m.len())
    }

    pub fn used(&self) -> usize {
        self.used
    }
}

#[cfg(test)]
mod tests;
