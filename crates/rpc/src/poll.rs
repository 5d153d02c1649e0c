//! Waiting for an event by polling first, then sleeping in the kernel: what every waiter on the
//! data path does (a transport's reader, a shared-memory channel's side, a pComponent's fault
//! worker). On virtual machines waking a halted vCPU costs more than a loopback round trip, so
//! polling pays when the event comes soon; when it does not, polling burns a CPU that the
//! program or a neighbour could use.
//!
//! [`Poller`] adapts the polling budget to the waits it sees, as EbbRT's event loop and Linux's
//! hybrid block polling do: an event caught while polling keeps the budget at twice its delay
//! at least; an event that came after the poller gave up but within the ceiling doubles the
//! budget (up to the ceiling); one beyond the ceiling shrinks it in proportion (to nothing after
//! a long idle). A waiter that stopped polling polls the whole ceiling every sixteenth wait,
//! to find out whether its events came back within reach. So a waiter whose events come in
//! bursts polls through the burst, and one whose events come later than the ceiling, or not at
//! all, stops polling. With `adaptive: false` it polls for the full ceiling every time.
//!
//! However many threads of a process wait, at most half its CPUs' worth of them poll at once
//! (`most_polling`); the others sleep at once. A poller holds a CPU that the thread it waits
//! for (a program, a fault worker, a channel's server) may need: when many programs miss on one
//! pComponent, a poller per waiter would take the CPUs from the work they all wait for.
//!
//! A thread that nobody waits on (the pComponent's background evictor) never polls
//! ([`set_unhurried`]): a wake-up costs it microseconds that no program sees.
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

crate::knob_enum! {
    /// How a waiter polls: `fixed` (the default: always the whole ceiling) or `adaptive`. On the
    /// 2-vCPU machines we measured, adaptive polling made programs with frequent misses 5-15%
    /// slower (a waiter descheduled between polls sees a long wait and stops polling just before
    /// the next burst) and saved no measurable CPU, so it is a choice, not the default
    /// (docs/benchmarks.md, "Transports").
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum Polling, "polling", POLLING {
        Adaptive = "adaptive",
        #[default]
        Fixed = "fixed",
    }
}

/// Below this a budget is not worth a poll: the waiter sleeps at once.
const MIN_BUDGET_NS: u64 = 1_000;

/// A waiter that stopped polling polls the whole ceiling once every this many waits, to learn
/// whether events came back within reach (how long a sleeping waiter took to see its event
/// says nothing about that: the wake-up itself may be most of it).
const PROBE_EVERY: u64 = 16;

thread_local! {
    static UNHURRIED: Cell<bool> = const { Cell::new(false) };
}

/// Says that no program waits on the calling thread's calls (a background writer): its waits
/// sleep at once instead of polling, and its shared-memory calls ask their server to sleep
/// rather than poll for its next request (transport.md, "Callers nobody waits on").
pub fn set_unhurried(on: bool) {
    UNHURRIED.with(|u| u.set(on));
}

/// Whether the calling thread said that nobody waits on its calls.
pub fn unhurried() -> bool {
    UNHURRIED.with(Cell::get)
}

/// Threads of this process polling at this moment.
static POLLERS: AtomicUsize = AtomicUsize::new(0);

/// How many threads of a process may poll at once: half the CPUs it may run on, at least one.
fn most_polling() -> usize {
    static MOST: OnceLock<usize> = OnceLock::new();
    *MOST.get_or_init(|| (std::thread::available_parallelism().map_or(1, |n| n.get()) / 2).max(1))
}

/// A place among the process's pollers, given back when dropped.
struct Place;

impl Place {
    fn take() -> Option<Place> {
        POLLERS
            .fetch_update(Relaxed, Relaxed, |n| (n < most_polling()).then_some(n + 1))
            .ok()
            .map(|_| Place)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        POLLERS.fetch_sub(1, Relaxed);
    }
}

/// One waiter's polling state (each thread that waits has its own). Counters, per component:
/// `poll_spins_total` (waits that polled), `poll_sleeps_total` (of those, the ones that found
/// nothing and slept), `poll_skipped_total` (waits that slept at once, the budget having
/// shrunk to nothing) and `poll_crowded_total` (waits that slept at once because as many of
/// the process's threads as may poll were polling).
pub struct Poller {
    ceiling_ns: u64,
    adaptive: bool,
    /// Whether it polls only with a place among the process's pollers (always, but in tests
    /// of the polling itself, which run beside other tests).
    limited: bool,
    budget_ns: AtomicU64,
    skipped: AtomicU64,
    /// Registered once: every wait on the data path counts.
    spins: metrics::Counter,
    sleeps: metrics::Counter,
    skips: metrics::Counter,
    crowded: metrics::Counter,
}

/// What a [`Poller::poll`] left to do: polling found nothing, so the caller sleeps and then
/// reports with [`Pending::slept`] that the wait is over.
#[must_use = "report the end of the wait with `slept`, or the poller learns nothing"]
pub struct Pending<'a> {
    poller: &'a Poller,
    t0: Instant,
    learns: bool,
}

impl Poller {
    pub fn new(ceiling: Duration, polling: Polling) -> Poller {
        let ceiling_ns = ceiling.as_nanos() as u64;
        Poller {
            ceiling_ns,
            adaptive: polling == Polling::Adaptive,
            limited: true,
            budget_ns: AtomicU64::new(ceiling_ns),
            skipped: AtomicU64::new(0),
            spins: crate::series::POLL_SPINS.handle(),
            sleeps: crate::series::POLL_SLEEPS.handle(),
            skips: crate::series::POLL_SKIPPED.handle(),
            crowded: crate::series::POLL_CROWDED.handle(),
        }
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
        let mut budget = self.budget_ns.load(Relaxed);
        if budget == 0 && self.adaptive && self.skipped.fetch_add(1, Relaxed) % PROBE_EVERY == PROBE_EVERY - 1 {
            budget = self.ceiling_ns;
        }
        if budget == 0 {
            self.skips.increment(1);
            return try_once().ok_or(self.pending(t0, true));
        }
        // Its waits teach the poller nothing: they say how long it slept, not how soon events come.
        if unhurried() {
            return try_once().ok_or(self.pending(t0, false));
        }
        let place = if self.limited { Place::take() } else { None };
        if self.limited && place.is_none() {
            self.crowded.increment(1);
            return try_once().ok_or(self.pending(t0, true));
        }
        let budget = Duration::from_nanos(budget);
        self.spins.increment(1);
        loop {
            if let Some(v) = try_once() {
                self.caught(t0.elapsed().as_nanos() as u64);
                return Ok(v);
            }
            let waited = t0.elapsed();
            if waited >= budget {
                self.sleeps.increment(1);
                return Err(self.pending(t0, true));
            }
            if waited < budget / 4 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// A wait polling did not end, begun at `t0`; `learns`: whether its length teaches this
    /// poller how soon events come.
    fn pending(&self, t0: Instant, learns: bool) -> Pending<'_> {
        Pending {
            poller: self,
            t0,
            learns,
        }
    }

    /// Polling caught the event `after_ns` into the wait: keep polling at least twice that
    /// (unless the poll overran the ceiling, descheduled between two tries).
    fn caught(&self, after_ns: u64) {
        if self.adaptive && after_ns <= self.ceiling_ns {
            let want = (2 * after_ns).max(2 * MIN_BUDGET_NS).min(self.ceiling_ns);
            self.budget_ns.fetch_max(want, Relaxed);
        }
    }

    /// Polling gave up and the event came `waited_ns` into the wait (measured when the
    /// sleeper woke, so a little late).
    fn learn(&self, waited_ns: u64) {
        if !self.adaptive || self.ceiling_ns == 0 {
            return;
        }
        let b = self.budget_ns.load(Relaxed);
        let next = if waited_ns <= self.ceiling_ns {
            // Within reach: polling longer would have caught it.
            (b * 2).max(2 * MIN_BUDGET_NS).min(self.ceiling_ns)
        } else {
            // Beyond even the ceiling: the polling was wasted, the more surely the longer the
            // wait. Shrinking in proportion stops a waiter that idles for seconds at once, and
            // one whose events come just beyond reach over a few waits.
            let shrunk = (b as u128 * self.ceiling_ns as u128 / waited_ns as u128) as u64;
            Some(shrunk).filter(|h| *h >= MIN_BUDGET_NS).unwrap_or(0)
        };
        self.budget_ns.store(next, Relaxed);
    }
}

impl Pending<'_> {
    /// The sleep that followed is over (the event came, or the wait gave up).
    pub fn slept(self) {
        if self.learns {
            self.poller.learn(self.t0.elapsed().as_nanos() as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poller that polls whatever other tests' pollers do meanwhile.
    fn alone(ceiling: Duration, polling: Polling) -> Poller {
        Poller {
            limited: false,
            ..Poller::new(ceiling, polling)
        }
    }

    /// One wait whose event comes `after` into it; a sleeping waiter sees it `late` after that.
    /// The wait starts at the poller's first look: a test thread descheduled before the poll
    /// began would otherwise hand it an event that seems to come early.
    fn wait(p: &Poller, after: Duration, late: Duration) -> bool {
        let first = std::cell::Cell::new(None::<Instant>);
        let since_first = || {
            let t0 = first.get().unwrap_or_else(Instant::now);
            first.set(Some(t0));
            t0.elapsed()
        };
        match p.poll(|| (since_first() >= after).then_some(())) {
            Ok(()) => true,
            Err(pending) => {
                std::thread::sleep((after + late).saturating_sub(since_first()));
                pending.slept();
                false
            }
        }
    }

    #[test]
    fn an_idle_waiter_stops_polling_and_a_busy_one_polls_again() {
        let p = alone(Duration::from_millis(1), Polling::Adaptive);
        assert_eq!(p.budget(), Duration::from_millis(1));
        for _ in 0..20 {
            let pending = p.poll(|| None::<()>).err().unwrap();
            std::thread::sleep(Duration::from_millis(10));
            pending.slept();
        }
        assert_eq!(
            p.budget(),
            Duration::ZERO,
            "sleeps of 10 ms against a 1 ms ceiling: polling is wasted"
        );
        // Events now come 100 µs into each wait: polling resumes and catches them.
        let mut most = Duration::ZERO;
        let hits: Vec<bool> = (0..30)
            .map(|_| {
                let hit = wait(&p, Duration::from_micros(100), Duration::ZERO);
                most = most.max(p.budget());
                hit
            })
            .collect();
        // Most, not all: a poller descheduled past an event on a busy machine misses it.
        assert!(
            hits[20..].iter().filter(|h| **h).count() >= 8,
            "the last waits were caught polling: {hits:?}"
        );
        // At least the events' delay (twice it, measured from the poll's start, a little
        // after the wait's), once the caught waits have grown it: a last wait missed on a busy
        // machine shrinks it again.
        assert!(most >= Duration::from_micros(100), "{most:?}, now {:?}", p.budget());
    }

    #[test]
    fn events_beyond_the_ceiling_stop_the_polling() {
        // Each event comes 2.5 ceilings into its wait: polling the whole ceiling never catches it
        // (unless the poller is descheduled past the event, which teaches it nothing).
        let p = alone(Duration::from_millis(2), Polling::Adaptive);
        for _ in 0..30 {
            wait(&p, Duration::from_millis(5), Duration::ZERO);
        }
        assert_eq!(p.budget(), Duration::ZERO, "nothing to catch: no polling");
    }

    #[test]
    fn a_waiter_that_stopped_polling_finds_events_back_within_reach() {
        let p = alone(Duration::from_millis(2), Polling::Adaptive);
        for _ in 0..10 {
            wait(&p, Duration::from_millis(20), Duration::ZERO);
        }
        assert_eq!(p.budget(), Duration::ZERO);
        // Events now come 300 µs into each wait, but a sleeper only sees them 3 ms later (a slow
        // wake-up): sleeping shows nothing, the periodic probe finds them, and polling resumes
        // at twice their delay. A wait descheduled past the ceiling (beside other tests) shrinks
        // the budget again, and a probe descheduled past the event catches nothing: so what is
        // asserted is that polling resumed, within many probes, not that it stayed resumed.
        let resumed = (0..20 * PROBE_EVERY).any(|_| {
            wait(&p, Duration::from_micros(300), Duration::from_millis(3));
            p.budget() >= Duration::from_micros(600)
        });
        assert!(resumed, "polling resumed: {:?}", p.budget());
    }

    #[test]
    fn fixed_polling_keeps_its_budget() {
        let p = alone(Duration::from_micros(50), Polling::Fixed);
        for _ in 0..5 {
            wait(&p, Duration::from_millis(1), Duration::ZERO);
        }
        assert_eq!(p.budget(), Duration::from_micros(50));
    }

    #[test]
    fn polling_stops_at_the_budget() {
        let p = alone(Duration::from_micros(200), Polling::Fixed);
        let mut tries = 0;
        let r = p.poll(|| {
            tries += 1;
            None::<()>
        });
        assert!(r.is_err());
        assert!(tries > 1, "it polled more than once");
    }

    #[test]
    fn at_most_half_the_cpus_poll_at_once_and_the_others_sleep_at_once() {
        use std::sync::atomic::AtomicBool;
        use std::sync::Arc;
        let n = most_polling() + 2;
        let (started, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let waiters: Vec<_> = (0..n)
            .map(|_| {
                let (started, stop) = (started.clone(), stop.clone());
                std::thread::spawn(move || {
                    let p = Poller::new(Duration::from_secs(30), Polling::Fixed);
                    let mut tries = 0;
                    let polled = p
                        .poll(|| {
                            tries += 1;
                            if tries == 1 {
                                started.fetch_add(1, Relaxed);
                            } else {
                                // Holding its place without holding a CPU from other tests.
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            stop.load(Relaxed).then_some(())
                        })
                        .is_ok();
                    (polled, tries)
                })
            })
            .collect();
        while started.load(Relaxed) < n {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Relaxed);
        let results: Vec<(bool, u32)> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
        let polled = results.iter().filter(|(p, _)| *p).count();
        // Pollers of other tests may hold places too: fewer may have polled, never more.
        assert!(polled <= most_polling(), "{results:?}");
        assert!(
            results.iter().filter(|(p, _)| !p).all(|(_, tries)| *tries == 1),
            "a waiter without a place tried once and slept: {results:?}"
        );
    }
}
