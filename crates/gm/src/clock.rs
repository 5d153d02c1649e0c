//! The managers' time: the host's, or a simulation's, which moves only when the simulator
//! advances it, so that what the managers decide by silence and age (a component late, lost,
//! forgotten; a lease that may have lapsed) replays the same from the same seed.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync {
    fn now(&self) -> Instant;
    /// Wall-clock time in ms since the Unix epoch: departures kept in the managers' state
    /// carry it, so that a successor (another process) places them in its own time.
    fn unix_ms(&self) -> u64;
}

/// The host's clocks.
pub struct Host;

impl Clock for Host {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock that stands still until [`Simulated::advance`] moves it.
pub struct Simulated {
    base: Instant,
    ns: AtomicU64,
}

/// Where a simulation's wall clock starts (2026-01-01), so that runs of a seed agree.
const SIMULATED_EPOCH_MS: u64 = 1_767_225_600_000;

impl Simulated {
    pub fn new() -> Simulated {
        Simulated {
            base: Instant::now(),
            ns: AtomicU64::new(0),
        }
    }

    pub fn advance(&self, by: Duration) {
        self.ns.fetch_add(by.as_nanos() as u64, Relaxed);
    }

    /// Time since the simulation began.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.ns.load(Relaxed))
    }
}

impl Default for Simulated {
    fn default() -> Simulated {
        Simulated::new()
    }
}

impl Clock for Simulated {
    fn now(&self) -> Instant {
        self.base + self.elapsed()
    }

    fn unix_ms(&self) -> u64 {
        SIMULATED_EPOCH_MS + self.elapsed().as_millis() as u64
    }
}
