//! Membership as the managers keep it in their state, so that a restarted manager, or another
//! that takes over the lead, resumes with it: each component's registration (what a heartbeat
//! is checked against), and the recent departures every component must still hear of. How
//! recently each component was heard is not kept: the one that resumes gives every component
//! a fresh start, as after a stall of its own.
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use splitos_rpc::{ComponentInfo, EbbServed};

use crate::clock::Clock;
use splitos_core::state::{Store, Table};

pub const MEMBERS: Table = Table("members");
/// The home of each vNode with a memory quota (`Gm::quota_homes`), by vNode.
pub const QUOTA_HOMES: Table = Table("quota-homes");
/// mComponents announced lost to another, each with its fence (`Gm::announced`; a record of
/// an earlier version holds the id, which serves as the fence as well).
pub const ANNOUNCED: Table = Table("announced");

/// A component's registration, as kept.
#[derive(Serialize, Deserialize)]
pub struct Member {
    pub info: ComponentInfo,
    pub key: Option<[u8; 32]>,
    pub ebbs: Vec<EbbServed>,
    pub files_gone: bool,
    /// The number its start drew (`X2G_REGISTER.start`): a successor gives a repeated
    /// registration of that start the same id. (A record of an earlier version, without
    /// it, cannot be read: that component registers again.)
    pub start: u64,
}

#[derive(Serialize, Deserialize)]
struct Dated<T> {
    item: T,
    at_unix_ms: u64,
}

/// Departures told to components for `keep` after they happened (replaced starts, detached
/// mComponents), kept with their wall-clock time so that a successor tells them for the rest
/// of that time.
pub struct Recent<T> {
    store: Store,
    table: Table,
    keep: Duration,
    items: Mutex<Vec<(T, Instant, String)>>,
    clock: Arc<dyn Clock>,
}

impl<T: Serialize + DeserializeOwned + Clone> Recent<T> {
    pub fn open(store: Store, table: Table, keep: Duration, clock: &Arc<dyn Clock>) -> anyhow::Result<Recent<T>> {
        let now = (clock.now(), clock.unix_ms());
        let items = store
            .load_keyed::<Dated<T>>(table)?
            .into_iter()
            .map(|(key, d)| {
                // One older than `keep` is dropped at the first look; one this host's monotonic
                // clock cannot place that far back counts from now: told longer, never shorter.
                let ago = Duration::from_millis(now.1.saturating_sub(d.at_unix_ms)).min(keep);
                (d.item, now.0.checked_sub(ago).unwrap_or(now.0), key)
            })
            .collect();
        let r = Recent {
            store,
            table,
            keep,
            items: Mutex::new(items),
            clock: clock.clone(),
        };
        r.current();
        Ok(r)
    }

    /// Tells `item` from now, kept in the state if it can be (else only this run tells it).
    pub fn push(&self, item: T) {
        if let Err(e) = self.keep(item.clone()) {
            tracing::warn!(table = self.table.0, error = %e, "cannot keep a departure in the managers' state; a successor will not tell it");
            self.items.lock().unwrap().push((item, self.clock.now(), String::new()));
        }
    }

    /// Keeps `item` in the state and tells it from now; an item that cannot be kept is not
    /// told either.
    pub fn keep(&self, item: T) -> anyhow::Result<()> {
        let at_unix_ms = self.clock.unix_ms();
        let key = format!("{at_unix_ms}-{:08x}", splitos_rpc::auth::random_u64() as u32);
        self.store.put(
            self.table,
            &key,
            Some(&Dated {
                item: item.clone(),
                at_unix_ms,
            }),
        )?;
        self.items.lock().unwrap().push((item, self.clock.now(), key));
        Ok(())
    }

    /// Tells `item` no more (nor does a successor): it is back.
    pub fn forget(&self, item: &T)
    where
        T: PartialEq,
    {
        self.items.lock().unwrap().retain(|(t, _, key)| {
            if t != item {
                return true;
            }
            // One that could not be kept has no key, and nothing to drop.
            if !key.is_empty() {
                if let Err(e) = self.store.put::<Dated<T>>(self.table, key, None) {
                    tracing::warn!(table = self.table.0, error = %e, "cannot drop a departure from the managers' state; a successor tells it for the rest of its time");
                }
            }
            false
        });
    }

    /// The departures of the last `keep`; older ones are dropped.
    pub fn current(&self) -> Vec<T> {
        let mut items = self.items.lock().unwrap();
        items.retain(|(_, at, key)| {
            let keep = self.clock.now().saturating_duration_since(*at) < self.keep;
            if !keep && !key.is_empty() {
                let _ = self.store.put::<Dated<T>>(self.table, key, None);
            }
            keep
        });
        items.iter().map(|(t, _, _)| t.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn departures_outlive_a_restart_for_the_rest_of_their_time_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state.redb");
        let table = Table("departures");
        let keep = Duration::from_secs(4);
        let sim = Arc::new(crate::clock::Simulated::new());
        let clock: Arc<dyn Clock> = sim.clone();
        let r = Recent::<u32>::open(Store::for_test(&file), table, keep, &clock).unwrap();
        r.push(7);
        r.push(9);
        drop(r);
        // One that had already outlived its time when the state was written is not told.
        Store::for_test(&file)
            .put(
                table,
                "old",
                Some(&Dated {
                    item: 5u32,
                    at_unix_ms: clock.unix_ms() - 2 * keep.as_millis() as u64,
                }),
            )
            .unwrap();
        sim.advance(Duration::from_secs(1));
        let r = Recent::<u32>::open(Store::for_test(&file), table, keep, &clock).unwrap();
        let mut kept = r.current();
        kept.sort();
        assert_eq!(kept, [7, 9]);
        // The rest of their time counts from when they were pushed, not from the reopen.
        sim.advance(keep - Duration::from_millis(1100));
        assert_eq!(r.current().len(), 2, "told until their time is up");
        sim.advance(Duration::from_millis(200));
        assert!(r.current().is_empty());
        drop(r);
        let store = Store::for_test(&file);
        assert!(
            store.load::<Dated<u32>>(table).unwrap().is_empty(),
            "an expired departure leaves the state"
        );
    }
}
