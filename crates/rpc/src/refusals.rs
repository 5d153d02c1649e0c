//! Log lines for refusals that anyone who reaches a socket can cause. A line per refusal
//! would let a flood of them fill the disk the logs are on, so each kind logs its first
//! [`LINES_PER_WINDOW`] refusals of a [`WINDOW`] one by one, and then one summary with how
//! many more there were. The counters each refusal also bumps still count them all.
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusals of one kind logged one by one per window.
pub const LINES_PER_WINDOW: u64 = 10;
/// How long a window lasts, from the first refusal in it.
pub const WINDOW: Duration = Duration::from_secs(10);

/// One kind of refusal, as a `static` at the place that refuses.
pub struct Refusals {
    what: &'static str,
    state: Mutex<State>,
}

struct State {
    /// When the current window began; `None`: no refusal since the last summary.
    since: Option<Instant>,
    logged: u64,
    /// Refusals of the window not logged one by one.
    unlogged: u64,
}

impl Refusals {
    /// `what` names the refusal in the summary line, as its own lines say it.
    pub const fn new(what: &'static str) -> Refusals {
        Refusals { what, state: Mutex::new(State { since: None, logged: 0, unlogged: 0 }) }
    }

    /// Whether this refusal gets a line of its own; if not, the window's summary counts it.
    pub fn log_this(&'static self) -> bool {
        let mut s = self.state.lock().unwrap();
        let since = *s.since.get_or_insert_with(Instant::now);
        if s.logged < LINES_PER_WINDOW {
            s.logged += 1;
            return true;
        }
        s.unlogged += 1;
        if s.unlogged == 1 {
            // The first refusal past the lines of the window schedules its summary, so that
            // it comes even if the flood stops there.
            let spawned = std::thread::Builder::new().name("refusal-log".into()).spawn(move || {
                std::thread::sleep(WINDOW.saturating_sub(since.elapsed()));
                self.summarize();
            });
            if spawned.is_err() {
                drop(s);
                self.summarize();
            }
        }
        false
    }

    /// Logs how many refusals of the window were not logged, and starts a new window.
    fn summarize(&self) {
        let mut s = self.state.lock().unwrap();
        let (unlogged, logged, secs) = (s.unlogged, s.logged, s.since.map_or(0, |t| t.elapsed().as_secs()));
        *s = State { since: None, logged: 0, unlogged: 0 };
        drop(s);
        tracing::warn!(unlogged, logged, secs, "{}: {unlogged} more not logged one by one (in {secs} s, after {logged} that were)", self.what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_the_first_lines_of_a_window_and_counts_the_rest() {
        static R: Refusals = Refusals::new("refused a test");
        let logged = (0..1000).filter(|_| R.log_this()).count() as u64;
        assert_eq!(logged, LINES_PER_WINDOW);
        assert_eq!(R.state.lock().unwrap().unlogged, 1000 - LINES_PER_WINDOW);
        // The summary ends the window: the next refusal is logged again.
        R.summarize();
        assert!(R.log_this());
        assert_eq!(R.state.lock().unwrap().unlogged, 0);
    }
}
