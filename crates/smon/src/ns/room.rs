//! The namespace database and a full disk. A commit that meets a full disk leaves redb
//! refusing every later call until it is opened again, which rolls it back to its last
//! durable commit: names made or removed since are so again. So the sComponent keeps a file
//! of room for the database on its disk (`namespace.reserve`, half the room kept for names:
//! 4 MiB, less on a small disk), gives it up before a commit when the disk is nearly full
//! (filled by something else: files' data never takes that room), and makes it again once
//! the disk has room. Where even that is not enough, the database is opened again.
use std::sync::atomic::Ordering;
use std::sync::RwLockReadGuard;

use redb::Database;
use splitos_rpc::refusals::Refusals;

use super::durability::{count_used, NAMESPACE};
use super::{FsResult, Store, NEEDS_REOPEN, REOPEN_EVERY};

/// The file of room kept for the namespace database, in the storage directory.
pub(super) const RESERVE: &str = "namespace.reserve";

impl Store {
    /// Runs `f`, which commits, on the namespace database, giving up the room kept for it
    /// first if the disk is nearly full (or making that room again once it is not).
    pub(super) fn committing<T>(&self, f: impl FnOnce(&Database) -> FsResult<T>) -> FsResult<T> {
        self.keep_room();
        self.noting(f)
    }

    /// One statvfs per commit (about a microsecond; a commit costs far more). Held while it
    /// acts, so that two commits neither write the file at once nor race a release. Given up
    /// below `size` free, made again above the room for names and `size` more: a disk hovering
    /// around one bound does not have it written again and again.
    pub(super) fn keep_room(&self) {
        let Some((room, free)) = self.names_room_and_free() else {
            return;
        };
        let size = room / 2;
        let mut held = self.reserve_held.lock().unwrap();
        if *held {
            if free < size {
                // Whoever else fills the disk may take this room too; a commit now finds it.
                let _ = std::fs::remove_file(self.dir.join(RESERVE));
                *held = false;
                self.reserves_released.fetch_add(1, Ordering::Relaxed);
                crate::series::NAMESPACE_RESERVE_RELEASED.increment(1);
                static RELEASED: Refusals = Refusals::new("gave up the room kept for the namespace");
                if RELEASED.log_this("namespace") {
                    tracing::warn!(
                        free,
                        reserve = size,
                        "the disk is nearly full: gave up the room kept for the namespace database"
                    );
                }
            }
        } else if free > room + size {
            *held = self.make_reserve(size);
        }
    }

    /// Writes the reserve file of `size` bytes (real blocks, not a hole), durably; whether it
    /// could.
    fn make_reserve(&self, size: u64) -> bool {
        use std::io::Write;
        let path = self.dir.join(RESERVE);
        let made = std::fs::File::create(&path).and_then(|mut f| {
            let zeros = vec![0u8; 64 << 10];
            let mut left = size;
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                f.write_all(&zeros[..n])?;
                left -= n as u64;
            }
            f.sync_all()
        });
        if let Err(e) = &made {
            let _ = std::fs::remove_file(&path);
            tracing::debug!(error = %e, "cannot keep room for the namespace database yet");
        }
        made.is_ok()
    }

    /// Times the room kept for the namespace was given up to it.
    pub fn reserves_released(&self) -> u64 {
        self.reserves_released.load(Ordering::Relaxed)
    }

    /// Runs `f` on the namespace database; an I/O error that left it refusing everything
    /// has it opened again before the next call. Without that, a disk full for a moment
    /// failed every later call with EIO until the sComponent restarted.
    pub(super) fn noting<T>(&self, f: impl FnOnce(&Database) -> FsResult<T>) -> FsResult<T> {
        NEEDS_REOPEN.set(false);
        let db = self.db()?;
        let r = f(db.as_ref().ok_or(libc::EIO)?);
        // Marked while the handle that failed is still the one open (a reopen waits for this
        // guard), so that a late mark cannot have a fresh database opened again.
        if NEEDS_REOPEN.take() {
            self.poisoned.store(true, Ordering::Relaxed);
        }
        r
    }

    /// The namespace database, opened again first if it was poisoned. It rolls back to its
    /// last durable commit, as after a crash: changes since the last fsync may be lost, and
    /// what they reserved is counted again from the inodes that remain before anything else
    /// uses it. While the disk stays full (a database opened again meets it again, and each
    /// time rolls back), it is opened again at most every `REOPEN_EVERY`; calls between fail
    /// with EIO.
    pub(super) fn db(&self) -> FsResult<RwLockReadGuard<'_, Option<Database>>> {
        if self.poisoned.load(Ordering::Relaxed) {
            let mut db = self.db.write().unwrap();
            let mut last = self.reopened_at.lock().unwrap();
            if self.poisoned.load(Ordering::Relaxed) {
                let full = self.names_room_and_free().is_some_and(|(room, free)| free <= room);
                if full && last.is_some_and(|t| t.elapsed() < REOPEN_EVERY) {
                    return Err(libc::EIO);
                }
                *last = Some(std::time::Instant::now());
                // The file stays locked while the old handle is open.
                drop(db.take());
                static REOPENED: Refusals = Refusals::new("opened the namespace again after an I/O error");
                let opened = Database::create(self.dir.join(NAMESPACE))
                    .map_err(|e| e.to_string())
                    .and_then(|d| count_used(&d).map(|used| (d, used)));
                match opened {
                    Ok((d, used)) => {
                        *self.used.lock().unwrap() = used;
                        *db = Some(d);
                        self.poisoned.store(false, Ordering::Relaxed);
                        self.reopens.fetch_add(1, Ordering::Relaxed);
                        crate::series::NAMESPACE_REOPENED.increment(1);
                        if REOPENED.log_this("namespace") {
                            tracing::warn!("opened the namespace again after an I/O error (a full disk?): changes not yet synced may be lost");
                        }
                    }
                    Err(e) => {
                        if REOPENED.log_this("namespace") {
                            tracing::error!(error = %e, "cannot open the namespace again after an I/O error; will try again");
                        }
                        return Err(libc::EIO);
                    }
                }
            }
        }
        Ok(self.db.read().unwrap())
    }
}
