//! The kernel's two lists with user space's information (mm/workingset.c): every set keeps an
//! inactive and an active list of its lines, in O(1) per miss however many ways it has, so a
//! fully associative ExCache costs no scan.
//!
//! User space sees no reference bits, so a line cannot earn the active list by being used
//! while resident, as a page does in the kernel. What it sees is the miss that brings an
//! evicted line back: the kernel's refault distance. When a line leaves, the set's eviction
//! clock is kept for it (a shadow entry); when it is missed again within as many evictions
//! as the set has ways, a set twice the size would have kept it, so it was evicted too early
//! and enters the active list, which only the active list's own overflow ages. A line used
//! once (a scan, a collector's copy) stays inactive and leaves first. A write trap (or, with
//! access sampling, a touch) on an inactive line is a second reference and activates it too.
//!
//! The active list holds at most half the ways (the kernel's ratio at small sizes); its
//! oldest line then goes back to the inactive list's tail, or round again if it was seen used
//! since it was last looked at there.
use std::collections::VecDeque;

use super::eviction::Shadows;
use super::{EvictionPolicy, Line};

/// A set's queues: lines come in at the tail of `inactive` or `active`; with sampled
/// references, an inactive line that reaches the head of `inactive` moves to `sampled`, where
/// it is unmapped and waits its turn to leave unless the program touches it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    Inactive,
    Sampled,
    Active,
}

#[derive(Default)]
struct SetLists {
    inactive: VecDeque<(u32, u64)>,
    /// Inactive lines asked to be observed (unmapped, with access sampling), oldest first: a
    /// line still here when it reaches the head was not used since, and leaves.
    sampled: VecDeque<(u32, u64)>,
    active: VecDeque<(u32, u64)>,
    /// Ways of lines moved into `sampled` since the miss path last asked.
    rearmed: Vec<usize>,
    /// Per way: the fill (`Line::seq`) the policy knows there, and whether it is active. A
    /// queue entry whose way holds another fill, or whose list differs, is stale.
    ways: Vec<(u64, bool)>,
    /// Entries of the active queue that count as active lines (stale ones included until
    /// they are popped).
    n_active: usize,
    /// Evictions from this set so far: the clock refault distances are measured on.
    clock: u64,
}

impl SetLists {
    fn queue(&mut self, q: Queue) -> &mut VecDeque<(u32, u64)> {
        match q {
            Queue::Inactive => &mut self.inactive,
            Queue::Sampled => &mut self.sampled,
            Queue::Active => &mut self.active,
        }
    }

    fn is(&self, set: &[Option<Line>], (way, seq): (u32, u64), active: bool) -> bool {
        let w = way as usize;
        w < set.len() && set[w].is_some_and(|l| l.seq == seq) && self.ways.get(w).is_some_and(|m| *m == (seq, active))
    }

    fn mark(&mut self, way: usize, seq: u64, active: bool) {
        if self.ways.len() <= way {
            self.ways.resize(way + 1, (0, false));
        }
        self.ways[way] = (seq, active);
        let q = if active {
            self.n_active += 1;
            &mut self.active
        } else {
            &mut self.inactive
        };
        q.push_back((way as u32, seq));
    }

    /// Drops stale entries once a queue is much longer than the set (lines that left with
    /// their range, not as victims, leave entries behind): amortised O(1) per fill.
    fn compact(&mut self, set: &[Option<Line>]) {
        let bound = 2 * set.len() + 16;
        if self.inactive.len() > bound {
            let inactive = std::mem::take(&mut self.inactive);
            self.inactive = inactive.into_iter().filter(|e| self.is(set, *e, false)).collect();
        }
        if self.sampled.len() > bound {
            let sampled = std::mem::take(&mut self.sampled);
            self.sampled = sampled.into_iter().filter(|e| self.is(set, *e, false)).collect();
        }
        if self.active.len() > bound {
            let active = std::mem::take(&mut self.active);
            self.active = active.into_iter().filter(|e| self.is(set, *e, true)).collect();
            self.n_active = self.active.len();
        }
    }

    /// Ages the active list down to `target` lines.
    fn age(&mut self, set: &mut [Option<Line>], target: usize) {
        let mut budget = self.active.len();
        while self.n_active > target && budget > 0 {
            budget -= 1;
            let Some(e) = self.active.pop_front() else { break };
            self.n_active -= 1;
            if !self.is(set, e, true) {
                continue;
            }
            let line = set[e.0 as usize].as_mut().expect("checked by is");
            let again = std::mem::take(&mut line.referenced);
            self.mark(e.0 as usize, e.1, again);
        }
    }

    /// The first candidate of a queue, from its head; entries of lines not candidates now (being
    /// filled, evicted, pinned) go round to the tail. The entry stays: the caller may still
    /// spare the line, and an evicted line's entry is stale at the next look.
    fn first(&mut self, set: &[Option<Line>], q: Queue) -> Option<usize> {
        let active = q == Queue::Active;
        let mut budget = self.queue(q).len();
        while budget > 0 {
            budget -= 1;
            let e = *self.queue(q).front()?;
            if !self.is(set, e, active) {
                self.queue(q).pop_front();
                if active {
                    self.n_active -= 1;
                }
                continue;
            }
            if set[e.0 as usize].is_some_and(|l| l.candidate()) {
                return Some(e.0 as usize);
            }
            self.queue(q).rotate_left(1);
        }
        None
    }

    /// Keeps `window` lines in `sampled`: inactive lines from the head of `inactive` move there
    /// and are asked to be observed.
    fn sample(&mut self, set: &mut [Option<Line>], window: usize) {
        while self.sampled.front().is_some_and(|e| !self.is(set, *e, false)) {
            self.sampled.pop_front();
        }
        while self.sampled.len() < window {
            let Some(w) = self.first(set, Queue::Inactive) else {
                break;
            };
            let e = self.inactive.pop_front().expect("first found it");
            let line = set[w].as_mut().expect("a candidate is a line");
            if !line.unmapped {
                line.rearm = true;
                self.rearmed.push(w);
            }
            self.sampled.push_back(e);
        }
    }
}

/// With access sampling, one in this many of a set's ways waits unmapped at the head of its
/// inactive list. The kernel looks at a page's accessed bit when reclaim reaches it, at no
/// cost to the program; here each look costs an unmap of the line (and a minor fault if the
/// program touches it), so only lines about to leave are looked at, for as long as it takes
/// an eighth of the set to be replaced. A quarter cut node's word-pair count at half its
/// memory to 13.4k misses against 17.6k, for 28.5k touches against 15.3k, in about the same
/// time (one run each, when the pComponent served each touch).
const SAMPLED_SHARE: usize = 8;

pub struct Workingset {
    sets: Vec<SetLists>,
    /// With sampled references: the share of a set's ways (one in `window`) kept unmapped at
    /// the head of its inactive list, waiting to be seen used before they leave.
    window: Option<usize>,
    /// Shadow entries: recent victims, each with its set's clock when it left.
    shadows: Shadows,
}

impl Workingset {
    /// `sampled`: with access sampling, a line at the head of its set's inactive list waits
    /// unmapped (see [`SAMPLED_SHARE`]) before it leaves.
    pub fn new(lines: usize, sampled: bool) -> Workingset {
        Workingset {
            sets: Vec::new(),
            window: sampled.then_some(SAMPLED_SHARE),
            shadows: Shadows::new(lines),
        }
    }

    fn lists(&mut self, set: usize) -> &mut SetLists {
        if self.sets.len() <= set {
            self.sets.resize_with(set + 1, SetLists::default);
        }
        &mut self.sets[set]
    }
}

impl EvictionPolicy for Workingset {
    fn name(&self) -> &'static str {
        "workingset"
    }

    fn victim(&mut self, set_id: usize, set: &mut [Option<Line>], _hand: &mut usize) -> Option<usize> {
        let target = set.len() / 2;
        let window = self.window.map(|w| (set.len() / w).max(1));
        let l = self.lists(set_id);
        l.age(set, target);
        if let Some(w) = window {
            l.sample(set, w);
        }
        if let Some(w) = l
            .first(set, Queue::Sampled)
            .or_else(|| l.first(set, Queue::Inactive))
            .or_else(|| l.first(set, Queue::Active))
        {
            return Some(w);
        }
        // Lines the policy never saw (it replaced another while they were resident) join the
        // inactive list in fill order.
        let mut unseen: Vec<(u64, usize)> = set
            .iter()
            .enumerate()
            .filter_map(|(w, line)| {
                line.filter(|line| l.ways.get(w).is_none_or(|m| m.0 != line.seq))
                    .map(|line| (line.seq, w))
            })
            .collect();
        unseen.sort_unstable();
        for (seq, w) in unseen {
            l.mark(w, seq, false);
        }
        l.first(set, Queue::Inactive)
    }

    fn take_rearmed(&mut self, set_id: usize) -> Option<Vec<usize>> {
        self.window?;
        Some(std::mem::take(&mut self.lists(set_id).rearmed))
    }

    fn admit(&mut self, _pid: u64, _vpn: u64) -> bool {
        false
    }

    fn passes_over_cheaply(&self) -> bool {
        true
    }

    fn filled(&mut self, set_id: usize, way: usize, line: &Line, set: &[Option<Line>]) {
        let shadow = self.shadows.take(line.pid, line.vpn);
        let l = self.lists(set_id);
        let active = shadow.is_some_and(|at| l.clock - at <= set.len() as u64);
        l.mark(way, line.seq, active);
        l.compact(set);
    }

    fn touched(&mut self, set_id: usize, way: usize, line: &mut Line) {
        let l = self.lists(set_id);
        // A use of an inactive line activates it and is spent on that, as the kernel clears
        // the referenced flag of a page it activates; one of an active line keeps it a turn.
        let inactive = l.ways.get(way).is_some_and(|m| *m == (line.seq, false));
        line.referenced = !inactive;
        if inactive {
            l.mark(way, line.seq, true);
        }
    }

    /// Inactive: the lines it lets go first. An active line is one a miss showed evicted too
    /// early, or one seen used since. With sampling, only an inactive line that waited
    /// unmapped and was not touched: any other could still be in use.
    fn cold(&self, set_id: usize, way: usize, line: &Line) -> bool {
        (self.window.is_none() || line.unmapped)
            && self
                .sets
                .get(set_id)
                .and_then(|l| l.ways.get(way))
                .is_some_and(|m| *m == (line.seq, false))
    }

    fn evicted(&mut self, set_id: usize, line: &Line) {
        let l = self.lists(set_id);
        l.clock += 1;
        let at = l.clock;
        self.shadows.remember(line, at);
    }
}
