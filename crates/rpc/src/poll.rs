//! Waiting for an event by polling first, then sleeping in the kernel: what every waiter on the
//! data path does (a transport's reader, a shared-memory channel's side, a pComponent's fault
//! worker). On virtual machines waking a halted vCPU costs more than a loopback round trip, so
//! polling pays when the event comes soon; when it does not, polling burns a CPU that the
//! program or a neighbour could use.
//!
//! [`Poller`] adapts the polling budget to the waits it sees, as EbbRT's event loop and Linux's
//! hybrid block polling do: an event that came within the ceiling after the poller gave up
//! doubles its budget (up to the ceiling), and a sleep of more than four ceilings shrinks it in
//! proportion (by half at four ceilings, to nothing after a long idle), so a
//! waiter whose events come in bursts polls through the burst and one that idles sleeps at
//! once. With `adaptive: false` it polls for the full ceiling every time.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How a waiter polls: `adaptive` (the default) or `fixed` (always the whole ceiling).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Polling {
    #[default]
    Adaptive,
    Fixed,
}

pub const POLLING: &[&str] = &["adaptive", "fixed"];

impl std::str::FromStr for Polling {
    type Err = String;
    fn from_str(s: &str) -> Result<Polling, String> {
        match s {
            "adaptive" => Ok(Polling::Adaptive),
            "fixed" => Ok(Polling::Fixed),
            _ => Err(format!("unknown polling {s:?} (known: {})", POLLING.join(", "))),
        }
    }
}

impl std::fmt::Display for Polling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Polling::Adaptive => "adaptive",
            Polling::Fixed => "fixed",
        })
    }
}

/// Below this a budget is not worth a poll: the waiter sleeps at once.
const MIN_BUDGET_NS: u64 = 1_000;

/// One waiter's polling state (each thread that waits has its own). Counters, per component:
/// `poll_spins_total` (waits that polled), `poll_sleeps_total` (of those, the ones that found
/// nothing and slept) and `poll_skipped_total` (waits that slept at once, the budget having
/// shrunk to nothing).
pub struct Poller {
    ceiling_ns: u64,
    adaptive: bool,
    budget_ns: AtomicU64,
}

/// What a [`Poller::poll`] left to do: if polling found nothing, the caller sleeps and then
/// reports with [`Pending::slept`] how long the whole wait took.
pub struct Pending<'a> {
    poller: &'a Poller,
    gave_up: Instant,
}

impl Poller {
    pub fn new(ceiling: Duration, polling: Polling) -> Poller {
        let ceiling_ns = ceiling.as_nanos() as u64;
        Poller { ceiling_ns, adaptive: polling == Polling::Adaptive, budget_ns: AtomicU64::new(ceiling_ns) }
    }

    /// The current polling budget.
    pub fn budget(&self) -> Duration {
        Duration::from_nanos(self.budget_ns.load(Relaxed))
    }

    /// Calls `try_once` until it yields something or the budget passes: polling hard for the
    /// first quarter, then yielding the CPU between polls (a yielding poller keeps its vCPU
    /// awake while any runnable thread, such as the peer it waits for, still gets it).
    pub fn poll<T>(&self, mut try_once: impl FnMut() -> Option<T>) -> Result<T, Pending<'_>> {
        let t0 = Instant::now();
        let budget = self.budget();
        if budget.is_zero() {
            metrics::counter!("poll_skipped_total").increment(1);
            return try_once().ok_or(Pending { poller: self, gave_up: t0 });
        }
        metrics::counter!("poll_spins_total").increment(1);
        loop {
            if let Some(v) = try_once() {
                return Ok(v);
            }
            let waited = t0.elapsed();
            if waited >= budget {
                metrics::counter!("poll_sleeps_total").increment(1);
                return Err(Pending { poller: self, gave_up: Instant::now() });
            }
            if waited < budget / 4 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// `slept_ns`: how long the wait went on after polling gave up.
    fn learn(&self, slept_ns: u64) {
        if !self.adaptive || self.ceiling_ns == 0 {
            return;
        }
        let b = self.budget_ns.load(Relaxed);
        let next = if slept_ns <= self.ceiling_ns {
            // The event came soon after polling stopped: polling longer would have caught it.
            (b * 2).max(2 * MIN_BUDGET_NS).min(self.ceiling_ns)
        } else if slept_ns > 4 * self.ceiling_ns {
            // Idle: the polling was wasted, the more surely the longer the sleep. Shrinking in
            // proportion stops a waiter that idles for seconds at once, and one whose events
            // come just beyond reach by halves.
            let shrunk = (b as u128 * 2 * self.ceiling_ns as u128 / slept_ns as u128) as u64;
            Some(shrunk).filter(|h| *h >= MIN_BUDGET_NS).unwrap_or(0)
        } else {
            b
        };
        self.budget_ns.store(next, Relaxed);
    }
}

impl Pending<'_> {
    /// The sleep that followed is over (the event came, or the wait gave up).
    pub fn slept(self) {
        self.poller.learn(self.gave_up.elapsed().as_nanos() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_waiter_stops_polling_and_a_busy_one_polls_again() {
        let p = Poller::new(Duration::from_millis(1), Polling::Adaptive);
        assert_eq!(p.budget(), Duration::from_millis(1));
        for _ in 0..20 {
            let pending = p.poll(|| None::<()>).err().unwrap();
            std::thread::sleep(Duration::from_millis(10));
            pending.slept();
        }
        assert_eq!(p.budget(), Duration::ZERO, "sleeps of 10 ms against a 1 ms ceiling: polling is wasted");
        // Events now come soon after each give-up: the budget climbs back to the ceiling.
        for _ in 0..20 {
            let pending = p.poll(|| None::<()>).err().unwrap();
            std::thread::sleep(Duration::from_micros(5));
            pending.slept();
        }
        assert_eq!(p.budget(), Duration::from_millis(1));
        assert_eq!(p.poll(|| Some(7)).ok(), Some(7));
    }

    #[test]
    fn fixed_polling_keeps_its_budget() {
        let p = Poller::new(Duration::from_micros(50), Polling::Fixed);
        for _ in 0..5 {
            let pending = p.poll(|| None::<()>).err().unwrap();
            std::thread::sleep(Duration::from_millis(1));
            pending.slept();
        }
        assert_eq!(p.budget(), Duration::from_micros(50));
    }

    #[test]
    fn polling_stops_at_the_budget() {
        let p = Poller::new(Duration::from_micros(200), Polling::Fixed);
        let mut tries = 0;
        assert!(p.poll(|| {
            tries += 1;
            None::<()>
        })
        .is_err());
        assert!(tries > 1, "it polled more than once");
    }
}
