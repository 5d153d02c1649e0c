//! File data of the sComponent's store: one data file per inode under its vNode's directory,
//! read and written at absolute offsets, and the space they take. Space is reserved ahead of
//! a file's size (fallocate) and counted against one quota for all vNodes, so that a full
//! disk or quota fails the request that needs the space with ENOSPC rather than a later write.
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;

use splitos_rpc::{FileKind, MAX_FILE_SIZE};

use super::{internal, now_ns, vnode_key, FsResult, Inode, Store};

/// Open data files kept around between requests.
const OPEN_FILES: usize = 256;
/// The most of the disk's free space kept for the namespace database: files' data never
/// takes it, and new names fail with ENOSPC within it, so that the database does not run
/// into a full disk (an I/O error inside it would have it opened again, rolling back what
/// was not yet synced). A sixteenth of a smaller disk.
const NAMES_ROOM: u64 = 8 << 20;

fn io_errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

impl Store {
    /// Where an inode's data is kept: by inode number, so a rename moves no data.
    pub(super) fn data_path(&self, vkey: &str, ino: u64) -> PathBuf {
        self.dir.join("data").join(vkey).join(ino.to_string())
    }

    pub fn used(&self) -> u64 {
        *self.used.lock().unwrap()
    }

    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// Closes and deletes the data file of an inode gone from the namespace, and gives its
    /// space back to the quota.
    pub(super) fn free_data(&self, vkey: &str, ino: u64, alloc: u64) {
        self.files.lock().unwrap().remove(&(vkey.to_string(), ino));
        let _ = std::fs::remove_file(self.data_path(vkey, ino));
        let mut used = self.used.lock().unwrap();
        *used = used.saturating_sub(alloc);
    }

    /// Runs `f` on the data file of an inode, opened (and created) on demand.
    pub(super) fn with_file<T>(
        &self,
        vkey: &str,
        ino: u64,
        f: impl FnOnce(&File) -> std::io::Result<T>,
    ) -> FsResult<T> {
        let mut files = self.files.lock().unwrap();
        let key = (vkey.to_string(), ino);
        if !files.contains_key(&key) {
            if files.len() >= OPEN_FILES {
                files.clear();
            }
            let p = self.data_path(vkey, ino);
            std::fs::create_dir_all(p.parent().expect("data dir")).map_err(io_errno)?;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(&p)
                .map_err(io_errno)?;
            files.insert(key.clone(), file);
        }
        f(&files[&key]).map_err(io_errno)
    }

    /// Data of a regular file; bytes never written read as zeros, nothing past its size.
    pub fn read_data(&self, vnode: &str, ino: u64, offset: u64, len: u32) -> FsResult<Vec<u8>> {
        let a = self.getattr(vnode, ino)?;
        if a.kind != FileKind::File {
            return Err(libc::EISDIR);
        }
        let n = a.size.saturating_sub(offset).min(len as u64) as usize;
        let mut buf = vec![0u8; n];
        if n > 0 {
            let vkey = vnode_key(vnode)?;
            let mut got = 0;
            self.with_file(&vkey, ino, |f| {
                while got < n {
                    match f.read_at(&mut buf[got..], offset + got as u64)? {
                        0 => break,
                        k => got += k,
                    }
                }
                Ok(())
            })?;
        }
        Ok(buf)
    }

    /// The room on the disk kept for the namespace, and what is free there now; `None` where
    /// the file system does not say.
    pub(super) fn names_room_and_free(&self) -> Option<(u64, u64)> {
        let path = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()).ok()?;
        // SAFETY: statvfs writes only into `st`, fully initialized when it succeeds.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is NUL-terminated and outlives the call; `st` too.
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return None;
        }
        let unit = st.f_frsize as u64;
        let room = NAMES_ROOM.min(st.f_blocks as u64 * unit / 16);
        Some((room, st.f_bavail as u64 * unit))
    }

    /// Fails with ENOSPC when the disk has no more free than the room kept for the namespace:
    /// asked before a change that adds names.
    pub(super) fn names_fit(&self) -> FsResult<()> {
        match self.names_room_and_free() {
            Some((room, free)) if free <= room / 2 => Err(libc::ENOSPC),
            _ => Ok(()),
        }
    }

    /// Grows an inode's reservation to `bytes`, within the quota and the disk.
    fn reserve_in(&self, i: &mut Inode, vkey: &str, bytes: u64) -> FsResult<()> {
        if bytes > MAX_FILE_SIZE {
            return Err(libc::EFBIG);
        }
        if bytes <= i.attr.alloc {
            return Ok(());
        }
        let grow = bytes - i.attr.alloc;
        let mut used = self.used.lock().unwrap();
        if used.checked_add(grow).is_none_or(|u| u > self.quota) {
            return Err(libc::ENOSPC);
        }
        if self
            .names_room_and_free()
            .is_some_and(|(room, free)| free < grow.saturating_add(room))
        {
            return Err(libc::ENOSPC);
        }
        let (from, len) = (i.attr.alloc as libc::off_t, grow as libc::off_t);
        self.with_file(vkey, i.attr.ino, |f| {
            // SAFETY: fallocate takes the descriptor and integers only, no memory; `f` keeps the
            // descriptor open for the whole call.
            let r = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, from, len) };
            match r {
                0 => Ok(()),
                _ => {
                    let e = std::io::Error::last_os_error();
                    // A file system without fallocate still has to hold the data: let writes find out.
                    if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                        Ok(())
                    } else {
                        Err(e)
                    }
                }
            }
        })?;
        *used += grow;
        i.attr.alloc = bytes;
        Ok(())
    }

    /// Sets an inode's reservation to `bytes`: grows it within the quota and the disk, or gives
    /// back the space past both `bytes` and the file's data.
    pub fn reserve(&self, vnode: &str, ino_no: u64, bytes: u64) -> FsResult<()> {
        self.write(vnode, false, |tx, t, vkey| {
            let mut ino = tx.open_table(t.ino()).map_err(internal)?;
            let mut i = Store::get_inode(&ino, ino_no)?;
            let keep = bytes.max(i.attr.size.div_ceil(4096) * 4096);
            if keep < i.attr.alloc {
                let (from, len) = (keep as libc::off_t, (i.attr.alloc - keep) as libc::off_t);
                self.with_file(vkey, ino_no, |f| {
                    // SAFETY: as in `reserve_in`: no memory is passed, and `f` keeps the descriptor open.
                    let r = unsafe {
                        libc::fallocate(
                            f.as_raw_fd(),
                            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                            from,
                            len,
                        )
                    };
                    if r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EOPNOTSUPP) {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                })?;
                let mut used = self.used.lock().unwrap();
                *used = used.saturating_sub(i.attr.alloc - keep);
                i.attr.alloc = keep;
            } else {
                self.reserve_in(&mut i, vkey, bytes)?;
            }
            Store::put_inode(&mut ino, &i)
        })
    }

    /// Bytes of the data file past the recorded size are left from changes that never became
    /// durable: cut them before the size grows over them, so that the new range reads zeros.
    fn cut_stale(&self, vkey: &str, i: &Inode, new_end: u64) -> FsResult<()> {
        if new_end > i.attr.size {
            let size = i.attr.size;
            self.with_file(vkey, i.attr.ino, |f| {
                if f.metadata()?.len() > size {
                    f.set_len(size)
                } else {
                    Ok(())
                }
            })?;
        }
        Ok(())
    }

    /// `written_ns` is when the program wrote the data (a buffer cache writes it back later;
    /// 0: now): the file's times say when it changed, not when its blocks reached the disk, so
    /// a reader does not see a file change under it because a cache wrote it back.
    pub fn write_data(
        &self,
        vnode: &str,
        ino_no: u64,
        offset: u64,
        data: &[u8],
        size: u64,
        written_ns: i64,
    ) -> FsResult<()> {
        let end = offset
            .checked_add(data.len() as u64)
            .filter(|e| *e <= MAX_FILE_SIZE && size <= MAX_FILE_SIZE)
            .ok_or(libc::EFBIG)?;
        // An overwrite inside the file and its reservation changes no metadata but the mtime,
        // which is kept to the second: no namespace commit, so fsync is one fdatasync.
        let a = self.getattr(vnode, ino_no)?;
        if a.kind == FileKind::File
            && a.size == size
            && end <= a.size.max(a.alloc)
            && now_ns() - a.mtime_ns < 1_000_000_000
        {
            let vkey = vnode_key(vnode)?;
            return self.with_file(&vkey, ino_no, |f| f.write_all_at(data, offset));
        }
        self.write(vnode, false, |tx, t, vkey| {
            let mut ino = tx.open_table(t.ino()).map_err(internal)?;
            let mut i = Store::get_inode(&ino, ino_no)?;
            if i.attr.kind != FileKind::File {
                return Err(libc::EISDIR);
            }
            self.reserve_in(&mut i, vkey, size.max(end))?;
            if offset > i.attr.size {
                self.cut_stale(vkey, &i, offset)?;
            }
            self.with_file(vkey, ino_no, |f| f.write_all_at(data, offset))?;
            i.attr.size = size;
            let when = if written_ns > 0 {
                written_ns.min(now_ns())
            } else {
                now_ns()
            };
            // A change of the file's attributes after the write (an explicit mtime) stands.
            if when >= i.attr.ctime_ns {
                i.attr.mtime_ns = when;
                i.attr.ctime_ns = when;
            }
            Store::put_inode(&mut ino, &i)
        })
    }

    pub fn set_size(&self, vnode: &str, ino_no: u64, size: u64) -> FsResult<()> {
        let released = self.write(vnode, false, |tx, t, vkey| {
            let mut ino = tx.open_table(t.ino()).map_err(internal)?;
            let mut i = Store::get_inode(&ino, ino_no)?;
            if i.attr.kind != FileKind::File {
                return Err(libc::EISDIR);
            }
            self.reserve_in(&mut i, vkey, size)?;
            self.cut_stale(vkey, &i, size)?;
            self.with_file(vkey, ino_no, |f| f.set_len(size))?;
            // Truncation frees the blocks past the new end, reservations included.
            let released = i.attr.alloc.saturating_sub(size);
            i.attr.alloc = size;
            i.attr.size = size;
            let now = now_ns();
            i.attr.mtime_ns = now;
            i.attr.ctime_ns = now;
            Store::put_inode(&mut ino, &i)?;
            Ok(released)
        })?;
        let mut used = self.used.lock().unwrap();
        *used = used.saturating_sub(released);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_given_back() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), 8 << 20).unwrap();
        let f = s.create("v", "/f", FileKind::File, 0o644, 0, 0, true, None).unwrap();
        s.reserve("v", f.ino, 4 << 20).unwrap();
        assert_eq!(s.used(), 4 << 20);
        s.write_data("v", f.ino, 0, b"abc", 3, 0).unwrap();
        s.reserve("v", f.ino, 0).unwrap();
        assert_eq!(s.used(), 4096, "only the block holding data stays reserved");
        assert_eq!(s.reserve("v", f.ino, 9 << 20), Err(libc::ENOSPC));
        assert_eq!(s.write_data("v", f.ino, u64::MAX - 2, b"abc", 3, 0), Err(libc::EFBIG));
    }

    #[test]
    fn a_written_back_block_keeps_the_time_it_was_written() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), 8 << 20).unwrap();
        let f = s.create("v", "/f", FileKind::File, 0o644, 0, 0, true, None).unwrap();
        let written = now_ns();
        std::thread::sleep(std::time::Duration::from_millis(20));
        s.write_data("v", f.ino, 0, &[7u8; 8192], 8192, written).unwrap();
        let a = s.getattr("v", f.ino).unwrap();
        assert_eq!(
            (a.mtime_ns, a.ctime_ns),
            (written, written),
            "the write's time, not the write-back's"
        );
        // A write-back of data written before the file's last change leaves its times alone.
        s.write_data("v", f.ino, 8192, &[8u8; 4096], 12288, written - 1_000_000)
            .unwrap();
        let b = s.getattr("v", f.ino).unwrap();
        assert_eq!((b.mtime_ns, b.ctime_ns, b.size), (written, written, 12288));
    }
}
