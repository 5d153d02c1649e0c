//! The global managers' state file: what they are told at run time (the REST API's tokens, the
//! vNodes made through it), one redb table each, keyed by name, each value postcard-encoded,
//! so that a restart resumes with it. Without a file, it lasts as long as the process.
use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub type Table = TableDefinition<'static, &'static str, &'static [u8]>;

#[derive(Clone, Default)]
pub struct Store {
    db: Option<Arc<Database>>,
}

impl Store {
    /// The state kept in `file` (created if missing), or in memory only without one.
    pub fn open(file: Option<&Path>) -> anyhow::Result<Store> {
        let db = match file {
            Some(f) => Some(Arc::new(Database::create(f).map_err(|e| anyhow::anyhow!("cannot open the managers' state {}: {e}", f.display()))?)),
            None => None,
        };
        Ok(Store { db })
    }

    /// Every value of `table` (none in a new file).
    pub fn load<T: DeserializeOwned>(&self, table: Table) -> anyhow::Result<Vec<T>> {
        let Some(db) = &self.db else { return Ok(Vec::new()) };
        let tx = db.begin_read()?;
        let Ok(t) = tx.open_table(table) else { return Ok(Vec::new()) };
        let mut all = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            all.push(postcard::from_bytes(v.value()).map_err(|e| anyhow::anyhow!("the managers' state: a damaged {} entry {:?}: {e}", table.name(), k.value()))?);
        }
        Ok(all)
    }

    /// Keeps `value` under `key` in `table`, or removes the key (`None`); durable when it
    /// returns.
    pub fn put<T: Serialize>(&self, table: Table, key: &str, value: Option<&T>) -> anyhow::Result<()> {
        let Some(db) = &self.db else { return Ok(()) };
        let tx = db.begin_write()?;
        {
            let mut t = tx.open_table(table)?;
            match value {
                Some(v) => _ = t.insert(key, postcard::to_allocvec(v)?.as_slice())?,
                None => _ = t.remove(key)?,
            }
        }
        tx.commit()?;
        Ok(())
    }
}
