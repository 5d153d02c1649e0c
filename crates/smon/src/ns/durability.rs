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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, TableHandle};

use super::{dec, internal, vnode_key, FsResult, Store, Tables, ROOT_INO};

/// Inode numbers reserved durably at a time: after a crash numbering resumes past the
/// reservation, so a number is never handed out twice (a cache keyed by it stays right).
const INO_BATCH: u64 = 4096;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// The namespace database's file in the storage directory.
pub(super) const NAMESPACE: &str = "namespace.redb";

/// The bytes all inodes of database `db` reserve (for a store opened again).
pub(super) fn count_used(db: &Database) -> Result<u64, String> {
    let count = || -> anyhow::Result<u64> {
        let tx = db.begin_read()?;
        let mut used = 0;
        for h in tx.list_tables()? {
            if let Some(name) = h.name().strip_prefix("ino/") {
                used += reserved_by(&tx.open_table(Tables::of(name).ino())?)?;
            }
        }
        Ok(used)
    };
    count().map_err(|e| format!("cannot count the space of the namespace's inodes: {e}"))
}

/// The bytes the inodes of one vNode's table reserve.
fn reserved_by<T: ReadableTable<u64, &'static [u8]>>(t: &T) -> anyhow::Result<u64> {
    let mut used = 0;
    for r in t.iter()? {
        let (_, v) = r?;
        used += dec(v.value())
            .map_err(|e| anyhow::anyhow!("corrupt inode record (errno {e})"))?
            .attr
            .alloc;
    }
    Ok(used)
}

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
        let db = Database::create(dir.join(NAMESPACE)).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => anyhow::Error::new(InUse(dir.to_path_buf())),
            e => anyhow::anyhow!("cannot open the namespace in {}: {e}", dir.display()),
        })?;
        let s = Store {
            db: RwLock::new(Some(db)),
            poisoned: AtomicBool::new(false),
            reopened_at: Mutex::new(None),
            reopens: AtomicU64::new(0),
            reserve_held: Mutex::new(false),
            reserves_released: AtomicU64::new(0),
            inos: Mutex::new((0, 0)),
            unsynced: AtomicBool::new(false),
            dir: dir.to_path_buf(),
            quota,
            used: Mutex::new(0),
            files: Mutex::new(HashMap::new()),
        };
        s.recover()?;
        // Room for the namespace database on a disk that has it: a reserve an earlier run left
        // is not known whole, and is written again.
        let _ = std::fs::remove_file(dir.join(super::room::RESERVE));
        s.keep_room();
        Ok(s)
    }

    /// Frees what a crash left behind and recomputes the space in use from the inodes.
    fn recover(&self) -> anyhow::Result<()> {
        let db = self.db.read().unwrap();
        let tx = db.as_ref().expect("opened").begin_write()?;
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
            used += reserved_by(&tx.open_table(Tables::of(name).ino())?)?;
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

    /// Times the namespace was opened again after an I/O error.
    pub fn reopens(&self) -> u64 {
        self.reopens.load(Ordering::Relaxed)
    }

    /// A fresh inode number; call outside any write transaction (it may commit one itself).
    pub(super) fn alloc_ino(&self) -> FsResult<u64> {
        let mut g = self.inos.lock().unwrap();
        if g.0 >= g.1 {
            let limit = g.0 + INO_BATCH;
            self.committing(|db| {
                let mut tx = db.begin_write().map_err(internal)?;
                tx.set_durability(Durability::Immediate).map_err(internal)?;
                tx.open_table(META)
                    .map_err(internal)?
                    .insert("ino_limit", limit)
                    .map_err(internal)?;
                tx.commit().map_err(internal)
            })?;
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
        self.committing(|db| {
            let mut tx = db.begin_write().map_err(internal)?;
            tx.set_durability(Durability::Immediate).map_err(internal)?;
            tx.commit().map_err(internal)
        })
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

#[cfg(test)]
mod full_disk {
    use std::io::Write;

    use splitos_rpc::{FileKind, SetAttr};

    use super::*;

    /// A small file system of the test's own, unmounted when dropped.
    struct SmallDisk(tempfile::TempDir);

    impl SmallDisk {
        fn new() -> Option<SmallDisk> {
            let d = tempfile::tempdir().unwrap();
            let out = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=4m", "splitos-test-disk"])
                .arg(d.path())
                .output()
                .ok()?;
            out.status.success().then_some(SmallDisk(d))
        }

        /// Writes to the disk until it is full, into file `name`.
        fn fill(&self, name: &str) {
            let mut f = std::fs::File::create(self.0.path().join(name)).unwrap();
            while f.write(&[0u8; 4096]).is_ok_and(|n| n > 0) {}
        }
    }

    impl Drop for SmallDisk {
        fn drop(&mut self) {
            let c = std::ffi::CString::new(self.0.path().as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: `c` is a NUL-terminated path that outlives the call, which only reads it.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }

    /// A disk filled by someone else: new names fail with ENOSPC, and every other change
    /// commits on the room kept for the namespace, nothing rolled back (before, the database
    /// met the full disk and was opened again, which undid removals not yet synced).
    #[test]
    fn a_disk_filled_by_someone_else_is_ridden_out_on_the_room_kept_for_the_namespace() {
        let Some(disk) = SmallDisk::new() else {
            eprintln!("skipped: cannot mount a tmpfs (not root)");
            return;
        };
        let s = Store::open(&disk.0.path().join("store"), 1 << 30).unwrap();
        let reserve = disk.0.path().join("store").join(super::super::room::RESERVE);
        assert!(reserve.exists(), "room is kept from the start");
        let v = "v";
        let a = s.create(v, "/a", FileKind::File, 0o644, 0, 0, true, None).unwrap();
        for p in ["/e", "/f"] {
            s.create(v, p, FileKind::File, 0o644, 0, 0, true, None).unwrap();
        }
        s.create(v, "/d", FileKind::Dir, 0o755, 0, 0, true, None).unwrap();
        s.sync(v, Some(a.ino)).unwrap();
        disk.fill("ballast");
        assert_eq!(
            s.create(v, "/b", FileKind::File, 0o644, 0, 0, true, None),
            Err(libc::ENOSPC)
        );
        s.unlink(v, "/e", false).expect("a removal commits on the room kept");
        s.unlink(v, "/d", true).expect("so does an rmdir");
        s.rename(v, "/f", "/g", false).expect("and a rename");
        for i in 0..200 {
            let set = SetAttr {
                perm: Some(0o600 + i % 64),
                ..Default::default()
            };
            s.setattr(v, a.ino, &set).expect("a change of attributes");
        }
        s.checkpoint().expect("a durable commit");
        assert_eq!(s.reopens(), 0, "the database never met the full disk");
        assert!(s.reserves_released() >= 1 && !reserve.exists());
        std::fs::remove_file(disk.0.path().join("ballast")).unwrap();
        let c = s.create(v, "/c", FileKind::File, 0o644, 0, 0, true, None).unwrap();
        assert_eq!(s.lookup(v, "/c").unwrap().ino, c.ino);
        for gone in ["/e", "/d", "/f"] {
            assert_eq!(s.lookup(v, gone).map(|a| a.ino), Err(libc::ENOENT), "{gone} stays gone");
        }
        assert!(s.lookup(v, "/g").is_ok());
        assert!(reserve.exists(), "the room is kept again once the disk has it");
    }

    /// A disk filled by someone else who takes the room kept for the namespace too: new names
    /// fail with ENOSPC, and once there is room again the namespace serves as before, whatever
    /// the database met meanwhile (before, an I/O error inside it failed every later call
    /// with EIO until a restart).
    #[test]
    fn a_full_disk_fails_new_names_with_enospc_and_the_namespace_serves_again_once_freed() {
        let Some(disk) = SmallDisk::new() else {
            eprintln!("skipped: cannot mount a tmpfs (not root)");
            return;
        };
        let s = Store::open(&disk.0.path().join("store"), 1 << 30).unwrap();
        let v = "v";
        let a = s.create(v, "/a", FileKind::File, 0o644, 0, 0, true, None).unwrap();
        s.sync(v, Some(a.ino)).unwrap();
        disk.fill("ballast");
        s.setattr(v, a.ino, &SetAttr::default()).unwrap();
        assert!(s.reserves_released() >= 1);
        disk.fill("ballast2");
        assert_eq!(
            s.create(v, "/b", FileKind::File, 0o644, 0, 0, true, None),
            Err(libc::ENOSPC)
        );
        let mut failed = Vec::new();
        for i in 0..2000 {
            let set = SetAttr {
                perm: Some(0o600 + i % 64),
                ..Default::default()
            };
            if let Err(e) = s.setattr(v, a.ino, &set).and_then(|_| s.checkpoint()) {
                failed.push(e);
            }
        }
        assert!(
            failed.iter().all(|e| [libc::ENOSPC, libc::EIO].contains(e)),
            "{failed:?}"
        );
        // The database met the full disk (redb then refuses every call until it is opened
        // again) and was opened again.
        assert!(s.reopens() >= 1, "opened again");
        for b in ["ballast", "ballast2"] {
            std::fs::remove_file(disk.0.path().join(b)).unwrap();
        }
        let c = s.create(v, "/c", FileKind::File, 0o644, 0, 0, true, None).unwrap();
        assert_eq!(s.lookup(v, "/c").unwrap().ino, c.ino);
        assert_eq!(s.lookup(v, "/a").unwrap().ino, a.ino, "synced before the disk filled");
        s.sync(v, Some(c.ino)).unwrap();
    }
}
