//! Cordoned components (`splitos cluster cordon`, the REST API): the admin takes them out of
//! placement, a pComponent for new programs and an mComponent for new homes and vRegions,
//! while what runs on them keeps running; draining is cordoning and then waiting for that to
//! end. Kept in the managers' state by component id (ids survive restarts of the managers), so
//! that a cordon outlives one.
use std::collections::BTreeSet;
use std::sync::Mutex;

use splitos_core::state::{Store, Table};

const CORDONED: Table = Table("cordoned");

pub struct Cordons {
    store: Store,
    ids: Mutex<BTreeSet<u32>>,
}

impl Cordons {
    pub fn open(store: Store) -> anyhow::Result<Cordons> {
        let ids = store.load::<u32>(CORDONED)?.into_iter().collect();
        Ok(Cordons {
            store,
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
        Ok(())
    }

    pub fn has(&self, id: u32) -> bool {
        self.ids.lock().unwrap().contains(&id)
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
