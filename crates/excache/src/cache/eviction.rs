//! The ExCache's eviction policies: which `Ready` line of a full set leaves for a miss. The
//! policies are the swappable part (docs/ebb.md#policies-as-ebbs); the cache's bookkeeping,
//! which asks them, is in cache.rs.
use std::collections::{HashMap, VecDeque};

use super::Line;

pub trait EvictionPolicy: Send {
    fn name(&self) -> &'static str;
    /// Picks the way to evict from set `set_id`, whose ways are `set`, among its candidates
    /// ([`Line::candidate`]). `hand` is the set's own policy state (CLOCK's hand). `None` if
    /// no line is a candidate. The caller may still spare the line it names.
    fn victim(&mut self, set_id: usize, set: &mut [Option<Line>], hand: &mut usize) -> Option<usize>;
    /// True if asking again after the caller passed over the line named costs O(1): the
    /// policy moved past it. Then a process's floor may pass over as many lines as the set
    /// has, not a few, and holds in a fully associative ExCache too.
    fn passes_over_cheaply(&self) -> bool {
        false
    }
    /// True if `victim` may mark lines to be observed again (`Line::rearm`).
    fn rearms(&self) -> bool {
        false
    }
    /// The ways of set `set_id` whose lines it asked to be observed since it was last asked,
    /// if it keeps them itself; `None`: those the set's hand passed (CLOCK's).
    fn take_rearmed(&mut self, _set_id: usize) -> Option<Vec<usize>> {
        None
    }
    /// Whether a line just claimed for (pid, vpn) starts referenced.
    fn admit(&mut self, _pid: u64, _vpn: u64) -> bool {
        true
    }
    /// `line` was claimed in way `way` of set `set_id` (whose ways are now `set`).
    fn filled(&mut self, _set_id: usize, _way: usize, _line: &Line, _set: &[Option<Line>]) {}
    /// The program was seen using the line in way `way` of set `set_id`: a write trap, or
    /// with access sampling a touch of a line it had unmapped.
    fn touched(&mut self, _set_id: usize, _way: usize, line: &mut Line) {
        line.referenced = true;
    }
    /// A line of set `set_id` left the cache as a victim.
    fn evicted(&mut self, _set_id: usize, _line: &Line) {}
    /// Whether the line in way `way` of set `set_id` is one the policy would let go soon:
    /// it may leave beside a victim ([`super::ExCache::pick_beside`]).
    fn cold(&self, _set_id: usize, _way: usize, line: &Line) -> bool {
        !line.referenced
    }
}

pub struct Fifo;

impl EvictionPolicy for Fifo {
    fn name(&self) -> &'static str {
        "fifo"
    }
    fn victim(&mut self, _set_id: usize, set: &mut [Option<Line>], _hand: &mut usize) -> Option<usize> {
        set.iter()
            .enumerate()
            .filter_map(|(i, l)| l.filter(|l| l.candidate()).map(|l| (i, l.seq)))
            .min_by_key(|(_, seq)| *seq)
            .map(|(i, _)| i)
    }
    /// Every line goes in its turn, used or not: age alone says how soon.
    fn cold(&self, _set_id: usize, _way: usize, _line: &Line) -> bool {
        true
    }
}

pub struct Clock;

impl EvictionPolicy for Clock {
    fn name(&self) -> &'static str {
        "clock"
    }
    fn rearms(&self) -> bool {
        true
    }
    fn victim(&mut self, _set_id: usize, set: &mut [Option<Line>], hand: &mut usize) -> Option<usize> {
        clock_victim(set, hand)
    }
    fn cold(&self, _set_id: usize, _way: usize, line: &Line) -> bool {
        clock_cold(line)
    }
}

/// Whether CLOCK would let a line go soon: its bit is clear and it is not one the hand has
/// just cleared, whose use since could not be seen yet (its second chance).
fn clock_cold(line: &Line) -> bool {
    !line.referenced && !line.rearm
}

/// CLOCK's sweep: the first `Ready` line from the hand on whose reference bit is clear,
/// clearing the bits it passes (and asking that those lines be observed again).
fn clock_victim(set: &mut [Option<Line>], hand: &mut usize) -> Option<usize> {
    let n = set.len();
    // Two sweeps: the first clears reference bits, the second must find an unreferenced line.
    for _ in 0..2 * n + 1 {
        let i = *hand % n;
        *hand = hand.wrapping_add(1);
        if let Some(l) = set[i].as_mut() {
            if !l.candidate() {
                continue;
            }
            if l.referenced {
                l.referenced = false;
                l.rearm = true;
                continue;
            }
            return Some(i);
        }
    }
    None
}

/// Lines evicted recently, at most as many as the cache holds, each with a stamp its policy
/// gives it when it leaves (an eviction count): what a miss on a line evicted too early tells
/// a policy. The stamps of one line only grow, so an older record of a line re-made since is
/// told apart from the newest.
pub(super) struct Shadows {
    stamps: HashMap<(u64, u64), u64>,
    order: VecDeque<((u64, u64), u64)>,
    cap: usize,
}

impl Shadows {
    pub(super) fn new(cap: usize) -> Shadows {
        Shadows {
            stamps: HashMap::new(),
            order: VecDeque::new(),
            cap: cap.max(1),
        }
    }

    /// `line` left with `stamp`; the oldest records go beyond the bound.
    pub(super) fn remember(&mut self, line: &Line, stamp: u64) {
        let key = (line.pid, line.vpn);
        self.stamps.insert(key, stamp);
        self.order.push_back((key, stamp));
        while self.order.len() > self.cap {
            let (key, stamp) = self.order.pop_front().expect("over capacity means not empty");
            // A record re-made since is newer than this one: it stays.
            if self.stamps.get(&key) == Some(&stamp) {
                self.stamps.remove(&key);
            }
        }
    }

    /// The stamp (pid, vpn) left with, if it left recently; forgotten once asked.
    pub(super) fn take(&mut self, pid: u64, vpn: u64) -> Option<u64> {
        self.stamps.remove(&(pid, vpn))
    }
}

/// CLOCK with a memory of the lines it evicted recently (as many as the cache holds): a new
/// line starts unreferenced, so that the hand evicts it at its first pass unless the program
/// was seen using it since, except a line evicted recently, whose miss shows it was evicted
/// too early. Lines read once (a scan, a sort's input) then go before lines in use, which
/// plain CLOCK gives a whole turn each. It needs access sampling to see reads.
pub struct GhostClock {
    ghosts: Shadows,
    seq: u64,
}

impl GhostClock {
    pub fn new(cap: usize) -> GhostClock {
        GhostClock {
            ghosts: Shadows::new(cap),
            seq: 0,
        }
    }
}

impl EvictionPolicy for GhostClock {
    fn name(&self) -> &'static str {
        "ghost-clock"
    }
    fn rearms(&self) -> bool {
        true
    }
    fn victim(&mut self, _set_id: usize, set: &mut [Option<Line>], hand: &mut usize) -> Option<usize> {
        clock_victim(set, hand)
    }
    fn cold(&self, _set_id: usize, _way: usize, line: &Line) -> bool {
        clock_cold(line)
    }
    fn admit(&mut self, pid: u64, vpn: u64) -> bool {
        self.ghosts.take(pid, vpn).is_some()
    }
    fn evicted(&mut self, _set_id: usize, line: &Line) {
        self.seq += 1;
        self.ghosts.remember(line, self.seq);
    }
}
