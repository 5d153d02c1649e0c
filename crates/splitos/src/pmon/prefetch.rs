//! Read-ahead for the miss path: how many of the lines after a missed one to fetch in the same
//! round trip. A [`Prefetcher`] sees every remote miss of every process and answers with a
//! window; the miss path fetches up to that many following lines that exist remotely, are not
//! resident, live at the same place and can take a way without a write-back, and installs them
//! write-protected (clean) with the missed line.
use std::collections::HashMap;

pub trait Prefetcher: Send {
    fn name(&self) -> &'static str;
    /// Lines after `vpn` to fetch with the miss of process `pid` on it (0: none).
    fn window(&mut self, pid: u64, vpn: u64) -> usize;
    /// The process ended.
    fn forget(&mut self, pid: u64);
}

/// No read-ahead.
pub struct Off;

impl Prefetcher for Off {
    fn name(&self) -> &'static str {
        "off"
    }
    fn window(&mut self, _pid: u64, _vpn: u64) -> usize {
        0
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
        Sequential { max, base: base.min(max), streams: HashMap::new() }
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

    fn window(&mut self, pid: u64, vpn: u64) -> usize {
        let (next, window) = self.streams.get(&pid).copied().unwrap_or((u64::MAX, 0));
        let w = if vpn == next { (window * 2).clamp(1, self.max) } else { self.base };
        self.streams.insert(pid, (vpn + 1 + w as u64, w));
        w
    }

    fn forget(&mut self, pid: u64) {
        self.streams.remove(&pid);
    }
}

pub const PREFETCH_POLICIES: &[&str] = &["sequential", "nextline"];

/// The prefetcher named `policy` reading ahead at most `max` lines (0: off).
pub fn prefetcher(policy: &str, max: usize) -> Option<Box<dyn Prefetcher>> {
    match (policy, max) {
        ("sequential" | "nextline", 0) => Some(Box::new(Off)),
        ("sequential", _) => Some(Box::new(Sequential::new(max, 0))),
        ("nextline", _) => Some(Box::new(Sequential::new(max, 1))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequential_stream_grows_the_window_and_a_jump_closes_it() {
        let mut p = Sequential::new(8, 0);
        assert_eq!(p.window(1, 100), 0, "one miss is no stream yet");
        assert_eq!(p.window(1, 101), 1);
        // Lines 102 were read ahead: the stream misses next at 103.
        assert_eq!(p.window(1, 103), 2);
        assert_eq!(p.window(1, 106), 4);
        assert_eq!(p.window(1, 111), 8);
        assert_eq!(p.window(1, 120), 8, "bounded by max");
        assert_eq!(p.window(1, 5000), 0, "a jump closes the window");
        assert_eq!(p.window(2, 129), 0, "streams are per process");
        p.forget(1);
        assert_eq!(p.window(1, 5001), 0);
    }

    #[test]
    fn nextline_always_brings_the_next_line_and_grows_the_same_way() {
        let mut p = Sequential::new(8, 1);
        assert_eq!(p.window(1, 100), 1);
        // Line 101 came with 100: the stream misses next at 102.
        assert_eq!(p.window(1, 102), 2);
        assert_eq!(p.window(1, 105), 4);
        assert_eq!(p.window(1, 7), 1, "a jump falls back to one line");
        assert_eq!(prefetcher("nextline", 0).unwrap().window(1, 5), 0, "0 is off");
        assert!(prefetcher("lru", 8).is_none());
    }
}
