//! Durability and recovery of the sComponent's store: opening it after a crash, inode numbers
//! that survive one, the commit interval and fsync.
//!
//! Ordinary changes commit without fsync; `sync` commits durably (which also persists every
//! change before it) after an fdatasync of the file's data. So an acknowledged fsync survives
//! a kill -9 of any component and a restart of this one. What a crash leaves behind (inodes
//! detached and never dropped, data files whose inode never became durable) is cleaned up
//! when the store is opened again.
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use redb::{Database, Durability, ReadableTable, TableDefinition, TableHandle};

use super::{dec, internal, vnode_key, FsResult, Store, Tables, ROOT_INO};

/// Inode numbers reserved durably at a time: after a crash numbering resumes past the
/// reservation, so a number is never handed out twice (a cache keyed by it stays right).
const INO_BATCH: u64 = 4096;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// The storage directory is open in another process (its database is locked): that process
/// may share it ([`crate`]), this one cannot open it too.
#[derive(Debug, thiserror::Error)]
#[error("storage directory {} is in use by another process", .0.display())]
pub struct InUse(pub std::path::PathBuf);

impl Store {
    /// Opens (or creates) the store under `dir`. Inodes detached by an earlier run and never
    /// dropped (their pComponent went away) are freed now.
    pub fn open(dir: &Path, quota: u64) -> anyhow::Result<Store> {
        // File data is the vNodes' users', who reach it only through their mounts, where the
        // modes recorded here are enforced: on this host's disk it is the sComponent's alone,
        // and a tree another user could have planted links in is refused.
        splitos_core::trusted::own_dir(dir, 0o700).map_err(|e| anyhow::anyhow!("the storage directory: {e}"))?;
        std::fs::create_dir_all(dir.join("data"))?;
        let db = Database::create(dir.join("namespace.redb")).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => anyhow::Error::new(InUse(dir.to_path_buf())),
            e => anyhow::anyhow!("cannot open the namespace in {}: {e}", dir.display()),
        })?;
        let s = Store {
            db,
            inos: Mutex::new((0, 0)),
            unsynced: AtomicBool::new(false),
            dir: dir.to_path_buf(),
            quota,
            used: Mutex::new(0),
            files: Mutex::new(HashMap::new()),
        };
        s.recover()?;
        Ok(s)
    }

    /// Frees what a crash left behind and recomputes the space in use from the inodes.
    fn recover(&self) -> anyhow::Result<()> {
        let tx = self.db.begin_write()?;
        let names: Vec<String> = tx.list_tables()?.map(|h| h.name().to_string()).collect();
        let mut used = 0u64;
        let mut freed = 0u64;
        for name in names.iter().filter_map(|n| n.strip_prefix("detached/")) {
            let t = Tables::of(name);
            let gone: Vec<u64> = {
                let d = tx.open_table(t.detached())?;
                d.iter()?.filter_map(|r| r.ok().map(|(k, _)| k.value())).collect()
            };
            let mut ino = tx.open_table(t.ino())?;
            for i in gone {
                ino.remove(i)?;
                let _ = std::fs::remove_file(self.data_path(name, i));
                freed += 1;
            }
            tx.delete_table(t.detached())?;
        }
        for name in names.iter().filter_map(|n| n.strip_prefix("ino/")) {
            let t = Tables::of(name);
            let ino = tx.open_table(t.ino())?;
            for r in ino.iter()? {
                let (_, v) = r?;
                used += dec(v.value())
                    .map_err(|e| anyhow::anyhow!("corrupt inode record (errno {e})"))?
                    .attr
                    .alloc;
            }
        }
        let limit = tx
            .open_table(META)?
            .get("ino_limit")?
            .map(|v| v.value())
            .unwrap_or(ROOT_INO + 1);
        // Data files without an inode: their creation or deletion did not become durable.
        let mut orphans = 0u64;
        for name in names.iter().filter_map(|n| n.strip_prefix("ino/")) {
            let ino = tx.open_table(Tables::of(name).ino())?;
            for e in std::fs::read_dir(self.dir.join("data").join(name))
                .into_iter()
                .flatten()
                .flatten()
            {
                let known = e
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u64>().ok())
                    .map(|i| ino.get(i).map(|v| v.is_some()).unwrap_or(true));
                if known == Some(false) {
                    let _ = std::fs::remove_file(e.path());
                    orphans += 1;
                }
            }
        }
        tx.commit()?;
        *self.inos.lock().unwrap() = (limit, limit);
        *self.used.lock().unwrap() = used;
        if orphans > 0 {
            tracing::info!(orphans, "removed data files whose inode never became durable");
        }
        if freed > 0 {
            tracing::info!(freed, "freed inodes detached by an earlier run");
        }
        Ok(())
    }

    /// A fresh inode number; call outside any write transaction (it may commit one itself).
    pub(super) fn alloc_ino(&self) -> FsResult<u64> {
        let mut g = self.inos.lock().unwrap();
        if g.0 >= g.1 {
            let limit = g.0 + INO_BATCH;
            let mut tx = self.db.begin_write().map_err(internal)?;
            tx.set_durability(Durability::Immediate).map_err(internal)?;
            tx.open_table(META)
                .map_err(internal)?
                .insert("ino_limit", limit)
                .map_err(internal)?;
            tx.commit().map_err(internal)?;
            g.1 = limit;
        }
        g.0 += 1;
        Ok(g.0 - 1)
    }

    /// Makes every change so far durable, if there are any (the periodic and final commit).
    pub fn checkpoint(&self) -> FsResult<()> {
        if !self.unsynced.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        let mut tx = self.db.begin_write().map_err(internal)?;
        tx.set_durability(Durability::Immediate).map_err(internal)?;
        tx.commit().map_err(internal)
    }

    /// fdatasync of the inode's data, then a durable commit of every namespace change so far.
    pub fn sync(&self, vnode: &str, ino: Option<u64>) -> FsResult<()> {
        if let Some(i) = ino {
            // An inode that is gone cannot have been made durable.
            self.getattr(vnode, i)?;
            let vkey = vnode_key(vnode)?;
            if self.data_path(&vkey, i).exists() {
                self.with_file(&vkey, i, |f| f.sync_data())?;
            }
        }
        self.checkpoint()
    }
}

#[cfg(test)]
mod tests {
    use splitos_rpc::FileKind;

    use super::*;

    #[test]
    fn inode_numbers_are_never_reused_after_a_restart() {
        let d = tempfile::tempdir().unwrap();
        let first = {
            let s = Store::open(d.path(), 8 << 20).unwrap();
            s.create("v", "/f", FileKind::File, 0o644, 0, 0, true, None)
                .unwrap()
                .ino
        };
        // Whether or not the unsynced create survived, a new file never gets its number.
        let s = Store::open(d.path(), 8 << 20).unwrap();
        let g = s.create("v", "/g", FileKind::File, 0o644, 0, 0, true, None).unwrap();
        assert_ne!(g.ino, first);
    }
}
