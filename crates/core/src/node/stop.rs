//! A component stopped (SIGSTOP, a stalled VM) for longer than the managers wait for a
//! heartbeat may have been declared lost meanwhile and its processes' homes given to their
//! backups, while what it was sent before the stop is still queued for it. Carried out
//! before it hears so, those requests would act as the home it no longer is: a process made
//! that runs elsewhere, a copy of a home sent to a backup that takes it over as a second
//! home, mappings added at members for a process that has ended. The watch notices the stop
//! (its ticker's sleep overran), and requests wait until the managers have answered a
//! heartbeat sent after it, and that answer (a fence, maybe) was handled.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use super::{HEARTBEAT, MISSED_BEATS};

/// A pause longer than this may have been taken for a death: the managers count a component
/// late after as long. A `reclaim_dead_ms` below it (it has no lower bound) declares lost
/// components stopped for less, which this watch does not see.
const STOP: Duration = Duration::from_millis(HEARTBEAT.as_millis() as u64 * MISSED_BEATS as u64);
/// How often the ticker looks at the clock.
const TICK: Duration = Duration::from_millis(100);
/// How long a request waits for the managers' word after a stop: past it (managers that do
/// not answer) it is served as before, which is no worse than without the watch.
const WORD_WAIT: Duration = Duration::from_secs(5);

pub(super) struct StopWatch {
    base: Instant,
    /// When the ticker last ran, in ms since `base`.
    last_tick: AtomicU64,
    /// When a stop was noticed, in ms since `base` plus one; 0: none not yet answered.
    stopped: AtomicU64,
}

impl StopWatch {
    pub(super) fn new() -> StopWatch {
        StopWatch {
            base: Instant::now(),
            last_tick: AtomicU64::new(0),
            stopped: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    /// Runs forever: a sleep that overran by more than [`STOP`] was a stop.
    pub(super) fn tick_forever(&self) {
        // From now: the time the component took to start is no stop.
        self.last_tick.store(self.now_ms(), Relaxed);
        loop {
            std::thread::sleep(TICK);
            let now = self.now_ms();
            let gap = now.saturating_sub(self.last_tick.load(Relaxed));
            if gap > STOP.as_millis() as u64 {
                // Before the tick is new again: a request sees one or the other.
                self.stopped.store(now + 1, Relaxed);
                crate::series::NODE_STOPS_NOTICED.increment(1);
                tracing::warn!(
                    stopped_ms = gap,
                    "this component was stopped for longer than the managers wait: requests wait for their next word"
                );
            }
            self.last_tick.store(now, Relaxed);
        }
    }

    /// The time to stamp a heartbeat with, before it is sent.
    pub(super) fn beat_sent(&self) -> u64 {
        self.now_ms()
    }

    /// The managers answered a heartbeat sent at `sent` (and the answer was handled): a
    /// stop noticed before it is over.
    pub(super) fn answered(&self, sent: u64) {
        let stopped = self.stopped.load(Relaxed);
        if stopped != 0 && stopped - 1 <= sent {
            let _ = self.stopped.compare_exchange(stopped, 0, Relaxed, Relaxed);
        }
    }

    /// Whether a stop may have happened that the managers have not answered since.
    fn unanswered(&self) -> bool {
        let ticked = self.last_tick.load(Relaxed);
        // Right after a stop the ticker may not have run yet: its last tick is old.
        self.stopped.load(Relaxed) != 0
            || (ticked != 0 && self.now_ms().saturating_sub(ticked) > STOP.as_millis() as u64)
    }

    /// Waits while a stop is not yet answered, until [`WORD_WAIT`] after it was noticed:
    /// past that (managers that do not answer) the stop is forgotten, and requests are served
    /// as before.
    pub(super) fn after_stop(&self) {
        if !self.unanswered() {
            return;
        }
        crate::series::NODE_REQUESTS_HELD_AFTER_STOPS.increment(1);
        let t0 = Instant::now();
        while self.unanswered() && t0.elapsed() < WORD_WAIT {
            std::thread::sleep(Duration::from_millis(10));
            let stopped = self.stopped.load(Relaxed);
            if stopped != 0 && self.now_ms().saturating_sub(stopped - 1) > WORD_WAIT.as_millis() as u64 {
                let _ = self.stopped.compare_exchange(stopped, 0, Relaxed, Relaxed);
            }
        }
    }
}
