//! The global managers' state: what they are told at run time (membership, the REST API's
//! tokens, vNodes, cordons, the placement policy, fencing), one table each, keyed by name,
//! each value postcard-encoded, so that a restart or another manager resumes with it.
//!
//! Where it lives is a [`Backend`]: a local redb file (one manager, the embedded default), or
//! etcd (several managers, one leader; `gm/etcd.rs`, the election in `gm/election.rs`), or
//! nowhere (it lasts as long as the process).
//!
//! It is a top-level module, not the managers' own, because what keeps its records here is not
//! all of the managers: the placement policies (`placement`, shared with the simulator) and the
//! control plane (which makes the key) use it too, and neither may import the managers.
//!
//! Every record carries an HMAC-SHA256 under the managers' [`StateKey`], over its table, its
//! key and its value, so that whoever can write to the backend but does not hold the key (a
//! user who reaches etcd's port, a file restored from elsewhere) cannot make the managers
//! believe in a token, a member or a grant of their own: a record without a valid tag is
//! refused and logged, as if it were not there.
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

/// The secret the managers sign their state's records with: 32 random bytes, in hex, in a
/// file only the cluster's user may read. Every manager of a cluster holds the same one.
#[derive(Clone)]
pub struct StateKey(ring::hmac::Key);

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateKey(secret)")
    }
}

/// A signed record: this byte, the tag, then the value.
const SIGNED_V1: u8 = 1;
const TAG: usize = 32;

impl StateKey {
    /// A key of this process alone, for a state that lives no longer than it (a simulation).
    pub fn ephemeral() -> anyhow::Result<StateKey> {
        let secret = splitos_rpc::auth::random::<32>().map_err(|e| anyhow::anyhow!("a state key: {e}"))?;
        Ok(StateKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret)))
    }

    /// The key kept at `path`; made there (mode 0600) when it is missing and `create`.
    pub fn at(path: &Path, create: bool) -> anyhow::Result<StateKey> {
        let named = |e: &dyn std::fmt::Display| anyhow::anyhow!("the managers' state key {}: {e}", path.display());
        if create && !path.exists() {
            let secret = splitos_rpc::auth::random::<32>().map_err(|e| named(&e))?;
            let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
            splitos_rpc::auth::write_private(path, format!("{hex}\n").as_bytes()).map_err(|e| named(&e))?;
        }
        let text = splitos_rpc::auth::read_private(path).map_err(|e| named(&e))?;
        let text = std::str::from_utf8(&text).map_err(|e| named(&e))?.trim();
        let secret: Vec<u8> = (0..text.len())
            .step_by(2)
            .filter_map(|i| text.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
            .collect();
        if text.len() != 64 || secret.len() != 32 {
            return Err(named(&"not 32 bytes in hex (64 digits)"));
        }
        Ok(StateKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &secret)))
    }

    /// What the tag covers: the record's place (table and key, each length-prefixed, so that
    /// no two places share an encoding) and its value.
    fn covered(table: &str, key: &str, value: &[u8]) -> Vec<u8> {
        let mut m = Vec::with_capacity(16 + table.len() + key.len() + value.len());
        for part in [table.as_bytes(), key.as_bytes(), value] {
            m.extend_from_slice(&(part.len() as u64).to_le_bytes());
            m.extend_from_slice(part);
        }
        m
    }

    /// `value` as kept under `key` of `table`: signed.
    pub fn seal(&self, table: &str, key: &str, value: &[u8]) -> Vec<u8> {
        let tag = ring::hmac::sign(&self.0, &StateKey::covered(table, key, value));
        let mut out = Vec::with_capacity(1 + TAG + value.len());
        out.push(SIGNED_V1);
        out.extend_from_slice(tag.as_ref());
        out.extend_from_slice(value);
        out
    }

    /// The value of a record kept under `key` of `table`, if these managers signed it there.
    pub fn open<'a>(&self, table: &str, key: &str, record: &'a [u8]) -> Option<&'a [u8]> {
        let (&version, rest) = record.split_first()?;
        if version != SIGNED_V1 || rest.len() < TAG {
            return None;
        }
        let (tag, value) = rest.split_at(TAG);
        ring::hmac::verify(&self.0, &StateKey::covered(table, key, value), tag).ok()?;
        Some(value)
    }
}

#[derive(Clone, Default)]
pub struct Store {
    backend: Option<(Arc<dyn Backend>, StateKey)>,
}

impl Store {
    /// The state kept in `file` (created if missing, mode 0600), signed with `key`.
    pub fn open(file: &Path, key: StateKey) -> anyhow::Result<Store> {
        let named =
            |e: &dyn std::fmt::Display| anyhow::anyhow!("cannot open the managers' state {}: {e}", file.display());
        // redb creates its file with the process's umask; the state names every member and
        // token hash, and is the cluster user's alone.
        {
            use std::os::unix::fs::OpenOptionsExt;
            use std::os::unix::fs::PermissionsExt;
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(file)
                .map_err(|e| named(&e))?;
            f.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(|e| named(&e))?;
        }
        Ok(Store::on(
            Arc::new(Redb(Database::create(file).map_err(|e| named(&e))?)),
            key,
        ))
    }

    pub fn on(backend: Arc<dyn Backend>, key: StateKey) -> Store {
        Store {
            backend: Some((backend, key)),
        }
    }

    /// A store in `file` with a key beside it, for unit tests.
    #[cfg(any(test, feature = "test-support"))]
    pub fn for_test(file: &Path) -> Store {
        Store::open(file, StateKey::at(&file.with_extension("key"), true).unwrap()).unwrap()
    }

    /// Every value of `table` (none in a new store).
    pub fn load<T: DeserializeOwned>(&self, table: Table) -> anyhow::Result<Vec<T>> {
        Ok(self.load_keyed(table)?.into_iter().map(|(_, v)| v).collect())
    }

    /// Every key of `table` with its value. An entry these managers did not sign where it is
    /// is refused, and one that cannot be read (damaged, or written by another version) left
    /// out, each logged (once per load, with how many): the managers start without it rather
    /// than not at all.
    pub fn load_keyed<T: DeserializeOwned>(&self, table: Table) -> anyhow::Result<Vec<(String, T)>> {
        let Some((b, sk)) = &self.backend else {
            return Ok(Vec::new());
        };
        let (mut forged, mut unreadable) = (Vec::new(), 0u64);
        let all = b
            .load(table.0)?
            .into_iter()
            .filter_map(|(k, record)| {
                let Some(value) = sk.open(table.0, &k, &record) else {
                    forged.push(k);
                    return None;
                };
                match postcard::from_bytes(value) {
                    Ok(v) => Some((k, v)),
                    Err(e) => {
                        tracing::error!(table = table.0, key = %k, error = %e, "the managers' state holds an entry that cannot be read; it is left out");
                        unreadable += 1;
                        None
                    }
                }
            })
            .collect();
        crate::series::GM_STATE_UNREADABLE.increment(unreadable);
        if let Some(first) = forged.first() {
            crate::series::GM_STATE_UNSIGNED.increment(forged.len() as u64);
            tracing::error!(table = table.0, first = %first, records = forged.len(), "the managers' state holds records these managers did not sign (written by someone without the state key, or by an earlier version); they are refused");
        }
        Ok(all)
    }

    /// Keeps `value` under `key` in `table`, or removes the key (`None`); durable when it
    /// returns.
    pub fn put<T: Serialize>(&self, table: Table, key: &str, value: Option<&T>) -> anyhow::Result<()> {
        let Some((b, sk)) = &self.backend else { return Ok(()) };
        let bytes = value
            .map(postcard::to_allocvec)
            .transpose()?
            .map(|v| sk.seal(table.0, key, &v));
        crate::series::GM_STATE_WRITES.increment(1);
        b.put(table.0, key, bytes.as_deref())
    }

    /// The key the records are signed with (none for a store in memory).
    pub fn key(&self) -> Option<&StateKey> {
        self.backend.as_ref().map(|(_, k)| k)
    }
}

/// The local store: one redb file.
struct Redb(Database);

impl Backend for Redb {
    fn load(&self, table: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let tx = self.0.begin_read()?;
        let Ok(t) = tx.open_table(TableDefinition::<&str, &[u8]>::new(table)) else {
            return Ok(Vec::new());
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_the_managers_did_not_sign_where_it_is_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state.redb");
        let store = Store::for_test(&file);
        let t = Table("tokens");
        store.put(t, "mine", Some(&7u32)).unwrap();
        let (backend, key) = store.backend.clone().unwrap();
        // Written by someone with the backend but not the key: raw, under another key, with
        // another cluster's tag, or moved from where it was signed.
        backend
            .put("tokens", "raw", Some(&postcard::to_allocvec(&9u32).unwrap()))
            .unwrap();
        let other = StateKey::at(&dir.path().join("other.key"), true).unwrap();
        backend
            .put(
                "tokens",
                "theirs",
                Some(&other.seal("tokens", "theirs", &postcard::to_allocvec(&9u32).unwrap())),
            )
            .unwrap();
        backend
            .put(
                "tokens",
                "moved",
                Some(&key.seal("tokens", "mine", &postcard::to_allocvec(&9u32).unwrap())),
            )
            .unwrap();
        backend.put("tokens", "cut", Some(&[SIGNED_V1, 1, 2, 3])).unwrap();
        assert_eq!(store.load_keyed::<u32>(t).unwrap(), [("mine".to_string(), 7)]);
        // What a restart reads: the same.
        drop((store, backend));
        assert_eq!(
            Store::for_test(&file).load_keyed::<u32>(t).unwrap(),
            [("mine".to_string(), 7)]
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600,
            "the state is its user's alone"
        );
    }

    #[test]
    fn a_state_key_is_made_once_private_and_a_bad_one_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.key");
        assert!(StateKey::at(&p, false).is_err(), "not made unless asked");
        let a = StateKey::at(&p, true).unwrap();
        let b = StateKey::at(&p, true).unwrap();
        let sealed = a.seal("t", "k", b"v");
        assert_eq!(b.open("t", "k", &sealed), Some(&b"v"[..]), "the same key the next time");
        assert_eq!(b.open("t", "k2", &sealed), None);
        std::fs::write(&p, "abcd\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(StateKey::at(&p, true).unwrap_err().to_string().contains("not 32 bytes"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(StateKey::at(&p, true)
            .unwrap_err()
            .to_string()
            .contains("open to other users"));
    }
}
