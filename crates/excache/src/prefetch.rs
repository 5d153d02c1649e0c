//! Read-ahead for the miss path: which lines to fetch with a missed one in the same round
//! trip. A [`Prefetcher`] sees every remote miss of every process and answers with an
//! [`Ahead`]: a stride and a number of lines; the miss path fetches up to that many lines
//! `vpn + stride`, `vpn + 2 * stride`, ... that exist remotely, are not resident, live at the
//! same place and can take a way, and installs them write-protected (clean) with the missed
//! line.
//!
//! A read of an installed line is invisible to the pComponent (no trap, and this kernel has
//! no idle-page tracking), so whether read-ahead paid is learned by sampling: one prefetched
//! line in [`SAMPLE`] is kept in the pComponent instead of installed, and its first touch (a
//! trap served locally) or its eviction untouched is reported to [`Prefetcher::outcome`].
use std::collections::HashMap;

use super::policies::BuildPrefetch;
use splitos_core::config::PrefetchPolicy;

/// One prefetched line in this many is a sample whose use is observed.
pub const SAMPLE: u64 = 16;

/// The lines to fetch with a miss on `vpn`: `vpn + i * stride` for i in 1..=lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ahead {
    pub stride: i64,
    pub lines: usize,
}

impl Ahead {
    pub const NONE: Ahead = Ahead { stride: 1, lines: 0 };

    fn next(lines: usize) -> Ahead {
        Ahead { stride: 1, lines }
    }
}

pub trait Prefetcher: Send {
    fn name(&self) -> &'static str;
    /// The lines to fetch with the miss of process `pid` on `vpn`.
    fn window(&mut self, pid: u64, vpn: u64) -> Ahead;
    /// A sampled prefetched line of `pid` was touched (`used`) or evicted untouched.
    fn outcome(&mut self, _pid: u64, _used: bool) {}
    /// The process ended.
    fn forget(&mut self, pid: u64);
}

/// No read-ahead.
pub struct Off;

impl Prefetcher for Off {
    fn name(&self) -> &'static str {
        "off"
    }
    fn window(&mut self, _pid: u64, _vpn: u64) -> Ahead {
        Ahead::NONE
    }
    fn forget(&mut self, _pid: u64) {}
}

/// Per-process stream detector: a miss right after the previous miss (or right after the
/// lines read ahead with it) doubles the window, up to `max`; any other miss sets it to
/// `base`. With base 0 (`sequential`) random access costs nothing; with base 1 (`nextline`)
/// every remote miss also brings the next line, which pays when misses cluster without being
/// strictly sequential (measured in docs/excache.md).
pub struct Sequential {
    max: usize,
    base: usize,
    /// pid -> (the page a stream misses next, the current window).
    streams: HashMap<u64, (u64, usize)>,
}

impl Sequential {
    pub fn new(max: usize, base: usize) -> Sequential {
        Sequential {
            max,
            base: base.min(max),
            streams: HashMap::new(),
        }
    }
}

impl Prefetcher for Sequential {
    fn name(&self) -> &'static str {
        if self.base == 0 {
            "sequential"
        } else {
            "nextline"
        }
    }

    fn window(&mut self, pid: u64, vpn: u64) -> Ahead {
        let (next, window) = self.streams.get(&pid).copied().unwrap_or((u64::MAX, 0));
        let w = if vpn == next {
            (window * 2).clamp(1, self.max)
        } else {
            self.base
        };
        self.streams.insert(pid, (vpn + 1 + w as u64, w));
        Ahead::next(w)
    }

    fn forget(&mut self, pid: u64) {
        self.streams.remove(&pid);
    }
}

/// Leap's prefetcher (ATC'20): the stride is the majority of the recent deltas between a
/// process's misses, found by a Boyer-Moore vote over the last H/4, H/2 and H deltas; with no
/// majority it falls back to the next lines. The window follows Linux's swap read-ahead
/// heuristic over read-ahead hits: hits + 2 lines rounded up to a power of two (at least 4),
/// never less than half the previous window, at most `max`. A hit is a sampled prefetched line
/// touched (it stands for [`SAMPLE`] lines), or a miss that continues the stride right after
/// the lines fetched with the previous miss (the stream used them all).
pub struct Leap {
    max: usize,
    procs: HashMap<u64, Trend>,
}

const HISTORY: usize = 32;

#[derive(Default)]
struct Trend {
    last: Option<u64>,
    deltas: std::collections::VecDeque<i64>,
    /// What was fetched with the previous miss.
    prev: Option<Ahead>,
    hits: u64,
}

impl Leap {
    pub fn new(max: usize) -> Leap {
        Leap {
            max,
            procs: HashMap::new(),
        }
    }
}

/// The delta that is a majority of the last `w` deltas, for the smallest such `w` of H/4, H/2
/// and H that the history holds.
fn majority(deltas: &std::collections::VecDeque<i64>) -> Option<i64> {
    let mut w = HISTORY / 4;
    while w <= deltas.len() {
        let recent = deltas.iter().rev().take(w);
        let (mut cand, mut count) = (0i64, 0usize);
        for &d in recent.clone() {
            if count == 0 {
                cand = d;
            }
            count = if d == cand { count + 1 } else { count - 1 };
        }
        if recent.filter(|d| **d == cand).count() > w / 2 {
            return Some(cand);
        }
        w *= 2;
    }
    None
}

impl Prefetcher for Leap {
    fn name(&self) -> &'static str {
        "leap"
    }

    fn window(&mut self, pid: u64, vpn: u64) -> Ahead {
        let tr = self.procs.entry(pid).or_default();
        let delta = tr.last.map(|l| vpn.wrapping_sub(l) as i64);
        // A miss right after the previous window along its stride: the lines in between were
        // used without a trap, and count as the accesses they were (Leap logs every access).
        let (d, times) = match (delta, tr.prev) {
            (Some(d), Some(prev)) if prev.lines > 0 && d == prev.stride * (prev.lines as i64 + 1) => {
                tr.hits += prev.lines as u64;
                (Some(prev.stride), prev.lines + 1)
            }
            _ => (delta, 1),
        };
        for d in d
            .filter(|d| *d != 0)
            .into_iter()
            .flat_map(|d| std::iter::repeat_n(d, times.min(HISTORY)))
        {
            if tr.deltas.len() == HISTORY {
                tr.deltas.pop_front();
            }
            tr.deltas.push_back(d);
        }
        tr.last = Some(vpn);
        let trend = majority(&tr.deltas);
        let hits = std::mem::take(&mut tr.hits) as usize;
        let mut pages = hits + 2;
        if pages == 2 {
            // No hits to judge by: a trend (or an adjacent miss) still earns one line.
            if trend.is_none() && !matches!(delta, Some(1) | Some(-1)) {
                pages = 1;
            }
        } else {
            pages = pages.next_power_of_two().max(4);
        }
        let floor = tr.prev.map_or(0, |p| p.lines / 2);
        let lines = (pages - 1).max(floor).min(self.max);
        let ahead = Ahead {
            stride: trend.unwrap_or(1),
            lines,
        };
        tr.prev = Some(ahead);
        ahead
    }

    fn outcome(&mut self, pid: u64, used: bool) {
        if let (true, Some(tr)) = (used, self.procs.get_mut(&pid)) {
            tr.hits = (tr.hits + SAMPLE).min(self.max as u64);
        }
    }

    fn forget(&mut self, pid: u64) {
        self.procs.remove(&pid);
    }
}

/// The prefetcher of `policy` reading ahead at most `max` lines (0: off).
pub fn prefetcher(policy: PrefetchPolicy, max: usize) -> Box<dyn Prefetcher> {
    match (policy, max) {
        (_, 0) => Box::new(Off),
        (policy, max) => policy.build(max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequential_stream_grows_the_window_and_a_jump_closes_it() {
        let mut p = Sequential::new(8, 0);
        let mut w = |pid, vpn| p.window(pid, vpn).lines;
        assert_eq!(w(1, 100), 0, "one miss is no stream yet");
        assert_eq!(w(1, 101), 1);
        // Lines 102 were read ahead: the stream misses next at 103.
        assert_eq!(w(1, 103), 2);
        assert_eq!(w(1, 106), 4);
        assert_eq!(w(1, 111), 8);
        assert_eq!(w(1, 120), 8, "bounded by max");
        assert_eq!(w(1, 5000), 0, "a jump closes the window");
        assert_eq!(w(2, 129), 0, "streams are per process");
        p.forget(1);
        assert_eq!(p.window(1, 5001).lines, 0);
    }

    #[test]
    fn nextline_always_brings_the_next_line_and_grows_the_same_way() {
        let mut p = Sequential::new(8, 1);
        let mut w = |vpn| p.window(1, vpn).lines;
        assert_eq!(w(100), 1);
        // Line 101 came with 100: the stream misses next at 102.
        assert_eq!(w(102), 2);
        assert_eq!(w(105), 4);
        assert_eq!(w(7), 1, "a jump falls back to one line");
        assert_eq!(
            prefetcher(PrefetchPolicy::Nextline, 0).window(1, 5),
            Ahead::NONE,
            "0 is off"
        );
    }

    #[test]
    fn leap_follows_the_majority_stride_and_grows_on_hits() {
        let mut p = Leap::new(8);
        // A stride of 3 pages (one field of an array of 12 KiB records).
        let mut vpn = 1000;
        let mut seen = vec![p.window(1, vpn).lines];
        for _ in 0..12 {
            let last = p.window(1, vpn + 3 * (*seen.last().unwrap() as u64 + 1));
            vpn += 3 * (*seen.last().unwrap() as u64 + 1);
            assert_eq!(
                last.stride,
                if seen.len() >= 8 { 3 } else { 1 },
                "the stride is the majority of at least 8 deltas"
            );
            seen.push(last.lines);
        }
        // Nothing until 8 deltas show the trend; then one line, and every miss right after the
        // previous window counts that window as hits.
        assert_eq!(seen, [0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 7, 8, 8]);
        // Noise below a majority keeps the trend.
        vpn += 3 * 9;
        p.window(1, vpn);
        vpn += 7;
        assert_eq!(p.window(1, vpn).stride, 3);
        assert_eq!(p.window(2, 5).lines, 0, "history is per process");
    }

    #[test]
    fn leap_without_a_trend_fetches_nothing_and_shrinks_by_halves() {
        let mut p = Leap::new(8);
        let mut vpn = 0u64;
        for _ in 0..9 {
            vpn += 1;
            let a = p.window(1, vpn);
            vpn += a.lines as u64;
        }
        assert_eq!(p.window(1, vpn + 1).lines, 8);
        // Random misses: no hits, so the window halves each time; the stream's stride stays a
        // majority of the history (one line along it) until random deltas outvote it.
        let got: Vec<usize> = (0..20u64)
            .map(|i| p.window(1, (i * i * 7_919 + 13) % 100_003).lines)
            .collect();
        assert_eq!(got[..3], [4, 2, 1]);
        assert_eq!(got[19], 0, "no trend left: {got:?}");
        // A sampled hit stands for SAMPLE lines.
        p.outcome(1, true);
        assert_eq!(p.window(1, 31_337).lines, 8);
    }
}
