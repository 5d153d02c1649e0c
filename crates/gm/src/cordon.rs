//! Cordoned components (`splitos cluster cordon`, the REST API): the admin takes them out of
//! placement, a pComponent for new programs and an mComponent for new homes and vRegions,
//! while what runs on them keeps running; draining is cordoning and then waiting for that to
//! end. Kept in the managers' state by component id (ids survive restarts of the managers), so
//! that a cordon outlives one; a pComponent, which refuses programs by the cordon it knows, is
//! told at once.
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;

use splitos_core::state::{Store, Table};
use splitos_rpc::{ComponentInfo, Role, G2P_CORDON};

use super::{ComponentError, Gm};

const CORDONED: Table = Table("cordoned");

pub struct Cordons {
    store: Store,
    ids: Mutex<BTreeSet<u32>>,
    /// Whether `ids` is empty, as it mostly is: placement asks of every component, and a
    /// walk of ten thousand took a lock each.
    none: AtomicBool,
}

impl Cordons {
    pub fn open(store: Store) -> anyhow::Result<Cordons> {
        let ids: BTreeSet<u32> = store.load::<u32>(CORDONED)?.into_iter().collect();
        Ok(Cordons {
            store,
            none: AtomicBool::new(ids.is_empty()),
            ids: Mutex::new(ids),
        })
    }

    /// Cordons component `id` (`on`) or lets it take work again; durable when it returns.
    pub fn set(&self, id: u32, on: bool) -> anyhow::Result<()> {
        let mut ids = self.ids.lock().unwrap();
        self.store.put(CORDONED, &id.to_string(), on.then_some(&id))?;
        match on {
            true => ids.insert(id),
            false => ids.remove(&id),
        };
        self.none.store(ids.is_empty(), Relaxed);
        Ok(())
    }

    pub fn has(&self, id: u32) -> bool {
        !self.none.load(Relaxed) && self.ids.lock().unwrap().contains(&id)
    }
}

impl Gm {
    /// Cordons component `id` (`on`) or lets it take work again; returns it as it is now.
    /// Only pComponents and mComponents are placed on, and so cordoned.
    pub fn cordon(&self, id: u32, on: bool) -> Result<ComponentInfo, ComponentError> {
        let c = self
            .snapshot()
            .into_iter()
            .find(|c| c.id == id)
            .ok_or(ComponentError::NoSuch { id })?;
        if !matches!(c.role, Role::Proc | Role::Mem) {
            return Err(ComponentError::NotCordonable {
                id,
                role: c.role.name(),
            });
        }
        self.cordons.set(id, on).map_err(ComponentError::KeepCordon)?;
        self.views.changed();
        if !on {
            self.stay(id);
        }
        tracing::info!(id, role = c.role.name(), addr = %c.addr, cordoned = on, "{}", if on { "component cordoned" } else { "component uncordoned" });
        Ok(ComponentInfo {
            cordoned: on,
            leaving: if on { c.leaving } else { None },
            ..c
        })
    }

    /// Tells pComponent `c` the cordon just set, which it refuses programs by: the API answers
    /// after this, so that a run right after the command meets the new state. One that does
    /// not answer takes it from its next heartbeat's answer.
    pub fn tell_cordon(&self, c: &ComponentInfo) {
        if c.role != Role::Proc || !c.alive {
            return;
        }
        if let Err(e) = self.rpc.call(&c.addr, G2P_CORDON { cordoned: c.cordoned }) {
            tracing::warn!(id = c.id, addr = %c.addr, error = %e, "the pComponent was not told of its cordon: it takes it from its next heartbeat");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cordon_outlives_a_restart_until_lifted() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state.redb");
        let c = Cordons::open(Store::for_test(&file)).unwrap();
        c.set(7, true).unwrap();
        c.set(9, true).unwrap();
        c.set(9, false).unwrap();
        drop(c);
        let c = Cordons::open(Store::for_test(&file)).unwrap();
        assert!(c.has(7) && !c.has(9));
    }
}
