//! The heartbeat period the managers tell the components (`G2X_BEAT.beat_ms`). A heartbeat
//! costs the leader about the same whatever it carries (a request read, an answer written,
//! the kernel's wake-ups), so beyond `[cluster] heartbeats_per_s` times the 300 ms period
//! fewer beats are the only way to keep the leader's share of a core: the period grows with
//! the number of components, by steps of [`STEP`], up to a quarter of `reclaim_dead` (so that
//! a live component beats four times within the silence that declares it lost).
//!
//! A component learns a new period at its next beat, so for a while some still beat at the
//! old one: a component counts as alive within [`MISSED_BEATS`] of the longer of the two
//! until every component has heard the new period.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use splitos_core::node::{HEARTBEAT, MISSED_BEATS};

/// The period grows by whole steps: a cluster that gains or loses a component changes it
/// only at a step, not at each registration.
const STEP: Duration = Duration::from_millis(100);

pub(super) struct Period {
    per_s: u64,
    longest: Duration,
    changes: Mutex<Changes>,
    /// What alive is judged by, in ms ([`Period::alive_for`]).
    alive_ms: AtomicU64,
}

struct Changes {
    told: Duration,
    /// The period told before `told`, and when `told` began.
    before: Duration,
    since: Instant,
}

impl Period {
    pub(super) fn new(heartbeats_per_s: u64, reclaim_dead: Duration, now: Instant) -> Period {
        Period {
            per_s: heartbeats_per_s,
            longest: (reclaim_dead / MISSED_BEATS).max(HEARTBEAT),
            changes: Mutex::new(Changes {
                told: HEARTBEAT,
                before: HEARTBEAT,
                since: now,
            }),
            alive_ms: AtomicU64::new((HEARTBEAT * MISSED_BEATS).as_millis() as u64),
        }
    }

    /// The period for a cluster of `components`.
    fn for_size(&self, components: usize) -> Duration {
        if self.per_s == 0 {
            return HEARTBEAT;
        }
        let wanted = Duration::from_secs_f64(components as f64 / self.per_s as f64);
        let steps = wanted.as_nanos().div_ceil(STEP.as_nanos()) as u32;
        (STEP * steps).clamp(HEARTBEAT, self.longest)
    }

    /// The period to tell a component that beats now in a cluster of `components`.
    pub(super) fn tell(&self, components: usize, now: Instant) -> Duration {
        let want = self.for_size(components);
        let mut c = self.changes.lock().unwrap();
        // Every component has beaten at `told` at least once: `before` is over.
        let heard = now.saturating_duration_since(c.since) > c.before;
        if want != c.told {
            c.before = if heard { c.told } else { c.before.max(c.told) };
            c.told = want;
            c.since = now;
            tracing::info!(
                period_ms = want.as_millis() as u64,
                components,
                "heartbeat period changed"
            );
        } else if heard {
            c.before = c.told;
        }
        let judged = c.told.max(c.before) * MISSED_BEATS;
        self.alive_ms.store(judged.as_millis() as u64, Relaxed);
        crate::series::HEARTBEAT_PERIOD_MS.set(c.told.as_millis() as f64);
        c.told
    }

    /// How long a component may be silent and count as alive: [`MISSED_BEATS`] periods.
    pub(super) fn alive_for(&self) -> Duration {
        Duration::from_millis(self.alive_ms.load(Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_period_grows_with_the_cluster_by_steps_up_to_a_quarter_of_the_silence_limit() {
        let now = Instant::now();
        let p = Period::new(10_000, Duration::from_secs(5), now);
        let ms = |n| p.for_size(n).as_millis();
        assert_eq!((ms(1), ms(3_000), ms(3_001), ms(5_000)), (300, 300, 400, 500));
        assert_eq!((ms(10_000), ms(12_500), ms(1_000_000)), (1_000, 1_250, 1_250));
        let off = Period::new(0, Duration::from_secs(5), now);
        assert_eq!(off.for_size(1_000_000), HEARTBEAT);
        let short = Period::new(10, Duration::from_millis(800), now);
        assert_eq!(short.for_size(1_000), HEARTBEAT, "never below 300 ms");
    }

    #[test]
    fn while_components_learn_a_new_period_alive_is_judged_by_the_longer() {
        let t0 = Instant::now();
        let p = Period::new(10, Duration::from_secs(5), t0);
        assert_eq!(p.alive_for(), HEARTBEAT * MISSED_BEATS);
        // Ten components: one second.
        assert_eq!(p.tell(10, t0), Duration::from_secs(1));
        assert_eq!(p.alive_for(), Duration::from_secs(4));
        // Back to three: 300 ms told, but those that beat just before still wait a second.
        let t1 = t0 + Duration::from_secs(10);
        assert_eq!(p.tell(3, t1), HEARTBEAT);
        assert_eq!(p.alive_for(), Duration::from_secs(4));
        p.tell(3, t1 + Duration::from_millis(900));
        assert_eq!(p.alive_for(), Duration::from_secs(4), "one may not have heard yet");
        p.tell(3, t1 + Duration::from_millis(1_100));
        assert_eq!(p.alive_for(), HEARTBEAT * MISSED_BEATS, "every one has heard");
        // Changes in a row: the longest of them counts until it is over.
        let t2 = t1 + Duration::from_secs(10);
        p.tell(10, t2);
        p.tell(5, t2 + Duration::from_millis(100));
        assert_eq!(p.alive_for(), Duration::from_secs(4));
        p.tell(5, t2 + Duration::from_millis(1_200));
        assert_eq!(p.alive_for(), Duration::from_secs(2));
    }
}
