//! The global managers' state: what they are told at run time (membership, the REST API's
//! tokens, vNodes, cordons, the placement policy, fencing), one table each, keyed by name,
//! each value postcard-encoded, so that a restart or another manager resumes with it.
//!
//! Where it lives is a [`Backend`]: a local redb file (one manager, the embedded default), or
//! etcd (several managers, one leader; `super::etcd`), or nowhere (it lasts as long as the
//! process).
use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A table of the managers' state, by name.
#[derive(Clone, Copy, Debug)]
pub struct Table(pub &'static str);

/// Where the managers' state is kept: raw values by table and key.
pub trait Backend: Send + Sync {
    /// Every key and value of `table` (none when it was never written).
    fn load(&self, table: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>>;
    /// Keeps `value` under `key` in `table`, or removes the key (`None`); durable when it
    /// returns, and refused when this manager may no longer write (it stopped leading).
    fn put(&self, table: &str, key: &str, value: Option<&[u8]>) -> anyhow::Result<()>;
}

#[derive(Clone, Default)]
pub struct Store {
    backend: Option<Arc<dyn Backend>>,
}

impl Store {
    /// The state kept in `file` (created if missing), or in memory only without one.
    pub fn open(file: Option<&Path>) -> anyhow::Result<Store> {
        Ok(match file {
            Some(f) => Store::on(Arc::new(Redb(Database::create(f).map_err(|e| anyhow::anyhow!("cannot open the managers' state {}: {e}", f.display()))?))),
            None => Store::default(),
        })
    }

    pub fn on(backend: Arc<dyn Backend>) -> Store {
        Store { backend: Some(backend) }
    }

    /// Every value of `table` (none in a new store).
    pub fn load<T: DeserializeOwned>(&self, table: Table) -> anyhow::Result<Vec<T>> {
        Ok(self.load_keyed(table)?.into_iter().map(|(_, v)| v).collect())
    }

    /// Every key of `table` with its value. An entry that cannot be read (damaged, or written
    /// by another version) is left out and logged: the managers start without it rather than
    /// not at all.
    pub fn load_keyed<T: DeserializeOwned>(&self, table: Table) -> anyhow::Result<Vec<(String, T)>> {
        let Some(b) = &self.backend else { return Ok(Vec::new()) };
        Ok(b.load(table.0)?
            .into_iter()
            .filter_map(|(k, v)| match postcard::from_bytes(&v) {
                Ok(v) => Some((k, v)),
                Err(e) => {
                    tracing::error!(table = table.0, key = %k, error = %e, "the managers' state holds an entry that cannot be read; it is left out");
                    metrics::counter!("gm_state_unreadable_total").increment(1);
                    None
                }
            })
            .collect())
    }

    /// Keeps `value` under `key` in `table`, or removes the key (`None`); durable when it
    /// returns.
    pub fn put<T: Serialize>(&self, table: Table, key: &str, value: Option<&T>) -> anyhow::Result<()> {
        let Some(b) = &self.backend else { return Ok(()) };
        let bytes = value.map(postcard::to_allocvec).transpose()?;
        b.put(table.0, key, bytes.as_deref())
    }
}

/// The local store: one redb file.
struct Redb(Database);

impl Backend for Redb {
    fn load(&self, table: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let tx = self.0.begin_read()?;
        let Ok(t) = tx.open_table(TableDefinition::<&str, &[u8]>::new(table)) else { return Ok(Vec::new()) };
        let mut all = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            all.push((k.value().to_string(), v.value().to_vec()));
        }
        Ok(all)
    }

    fn put(&self, table: &str, key: &str, value: Option<&[u8]>) -> anyhow::Result<()> {
        let tx = self.0.begin_write()?;
        {
            let mut t = tx.open_table(TableDefinition::<&str, &[u8]>::new(table))?;
            match value {
                Some(v) => _ = t.insert(key, v)?,
                None => _ = t.remove(key)?,
            }
        }
        tx.commit()?;
        Ok(())
    }
}
