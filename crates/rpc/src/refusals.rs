//! Log lines for refusals that a peer can cause again and again. A line per refusal would let
//! a flood of them fill the disk the logs are on (a cluster's state directory is often a
//! RAM-backed tmpfs), so each kind of refusal logs, per peer (whatever identifies the sender
//! where it is refused: a user, a vNode, an address), the peer's first [`LINES_PER_WINDOW`]
//! refusals of a [`WINDOW`] one by one, and when the window ends one summary with how many more
//! there were. Keyed per peer, one flooder's refusals never use up the lines of another's. At
//! most [`PEERS`] windows are open at once per kind: refusals of peers beyond share one, that
//! of the peer `others`. The counters each refusal also bumps still count them all.
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusals of one kind and one peer logged one by one per window.
pub const LINES_PER_WINDOW: u64 = 10;
/// How long a peer's window lasts, from its first refusal in it.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Windows open at once per kind of refusal, that of [`OTHERS`] included.
pub const PEERS: usize = 64;
/// The peer that stands for every peer beyond [`PEERS`].
pub const OTHERS: &str = "others";

/// One kind of refusal, as a `static` at the place that refuses.
pub struct Refusals {
    what: &'static str,
    windows: Mutex<Windows>,
}

struct Windows {
    by_peer: BTreeMap<String, Window>,
    /// Whether a thread is under way that summarizes windows as they end.
    summarizing: bool,
}

struct Window {
    since: Instant,
    logged: u64,
    /// Refusals of the window not logged one by one.
    unlogged: u64,
}

impl Refusals {
    /// `what` names the refusal in the summary line, as its own lines say it.
    pub const fn new(what: &'static str) -> Refusals {
        Refusals {
            what,
            windows: Mutex::new(Windows {
                by_peer: BTreeMap::new(),
                summarizing: false,
            }),
        }
    }

    /// Whether this refusal of `peer`'s gets a line of its own; if not, the summary of the
    /// peer's window counts it.
    pub fn log_this(&'static self, peer: impl std::fmt::Display) -> bool {
        let mut w = self.windows.lock().unwrap();
        let mut peer = peer.to_string();
        if w.by_peer.len() >= PEERS - 1 && !w.by_peer.contains_key(&peer) {
            peer = OTHERS.to_string();
        }
        let win = w.by_peer.entry(peer).or_insert_with(|| Window {
            since: Instant::now(),
            logged: 0,
            unlogged: 0,
        });
        let line = win.logged < LINES_PER_WINDOW;
        match line {
            true => win.logged += 1,
            false => win.unlogged += 1,
        }
        // Summaries come when windows end, also when the flood stops there. A thread that
        // cannot be started now is tried again at the next refusal.
        if !w.summarizing {
            w.summarizing = std::thread::Builder::new()
                .name("refusal-log".into())
                .spawn(move || self.summarize_until_quiet())
                .is_ok();
        }
        line
    }

    fn summarize_until_quiet(&self) {
        while let Some(next) = self.sweep(Instant::now()) {
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    }

    /// Ends the windows over at `now`, logging a summary of each that left refusals unlogged;
    /// returns when the next one ends, or `None` when none is left.
    fn sweep(&self, now: Instant) -> Option<Instant> {
        let mut w = self.windows.lock().unwrap();
        let (ended, open): (BTreeMap<_, _>, BTreeMap<_, _>) = std::mem::take(&mut w.by_peer)
            .into_iter()
            .partition(|(_, win)| win.since + WINDOW <= now);
        w.by_peer = open;
        let next = w.by_peer.values().map(|win| win.since + WINDOW).min();
        w.summarizing = next.is_some();
        drop(w);
        for (peer, win) in ended.into_iter().filter(|(_, win)| win.unlogged > 0) {
            let (unlogged, logged, secs) = (win.unlogged, win.logged, now.duration_since(win.since).as_secs());
            tracing::warn!(
                peer,
                unlogged,
                logged,
                secs,
                "{}: {unlogged} more not logged one by one (in {secs} s, after {logged} that were)",
                self.what
            );
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unlogged(r: &Refusals, peer: &str) -> u64 {
        r.windows.lock().unwrap().by_peer.get(peer).map_or(0, |w| w.unlogged)
    }

    #[test]
    fn a_flood_logs_the_first_lines_of_a_peers_window_and_counts_the_rest() {
        static R: Refusals = Refusals::new("refused a test");
        let logged = (0..1000).filter(|_| R.log_this("uid 1")).count() as u64;
        assert_eq!(logged, LINES_PER_WINDOW);
        assert_eq!(unlogged(&R, "uid 1"), 1000 - LINES_PER_WINDOW);
        // The end of the window summarizes it: the next refusal is logged again.
        assert_eq!(R.sweep(Instant::now() + WINDOW), None);
        assert!(R.log_this("uid 1"));
        assert_eq!(unlogged(&R, "uid 1"), 0);
    }

    #[test]
    fn one_peers_flood_leaves_another_its_lines() {
        static R: Refusals = Refusals::new("refused a test");
        assert_eq!(
            (0..1000).filter(|_| R.log_this("uid 1")).count() as u64,
            LINES_PER_WINDOW
        );
        assert_eq!(
            (0..1000).filter(|_| R.log_this("uid 2")).count() as u64,
            LINES_PER_WINDOW
        );
        assert_eq!(
            (unlogged(&R, "uid 1"), unlogged(&R, "uid 2")),
            (1000 - LINES_PER_WINDOW, 1000 - LINES_PER_WINDOW)
        );
    }

    #[test]
    fn peers_beyond_those_followed_share_one_window() {
        static R: Refusals = Refusals::new("refused a test");
        let logged = (0..PEERS as u64 + 100)
            .filter(|i| R.log_this(format!("10.0.0.{i}")))
            .count() as u64;
        // The first PEERS - 1 peers each, then `others` for the rest.
        assert_eq!(logged, PEERS as u64 - 1 + LINES_PER_WINDOW);
        assert_eq!(R.windows.lock().unwrap().by_peer.len(), PEERS);
        assert_eq!(unlogged(&R, OTHERS), 101 - LINES_PER_WINDOW);
    }
}
