//! The durable state of an sComponent: every vNode's namespace and inodes in one redb database,
//! file data in one file per inode under the vNode's directory (`data.rs`), made durable and
//! recovered after a crash as `durability.rs` describes. This file is the namespace.
//!
//! The paper keys a hash table by full path. We keep the full path as the key, split as
//! (parent path, name) in a B-tree: a lookup is still one probe by name, and a directory
//! listing is a range scan of its children instead of a walk over the whole vNode. A rename of
//! a directory rewrites the keys of its subtree, as the paper's flat table must too; data is
//! kept by inode number, so no data moves.
mod data;
mod durability;
mod room;

pub use durability::InUse;

use std::cell::Cell;
use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};
use splitos_rpc::refusals::Refusals;
use splitos_rpc::{DirEntry, FileAttr, FileKind, SetAttr, NAME_MAX, PATH_MAX};

pub type FsResult<T> = Result<T, i32>;

const ROOT_INO: u64 = 1;
/// While the disk is full, how long after opening the namespace again it is not opened again.
const REOPEN_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Entries per directory-listing reply.
const LIST_BATCH: usize = 256;

#[derive(Serialize, Deserialize, Clone)]
struct Inode {
    attr: FileAttr,
    target: Option<String>,
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Checks a full path from a request and splits it into (parent, name). Only absolute paths
/// of plain names are accepted: no empty, `.` or `..` components, so no request can name
/// anything outside its vNode's namespace.
pub fn split(path: &str) -> FsResult<(&str, &str)> {
    if path.len() > PATH_MAX {
        return Err(libc::ENAMETOOLONG);
    }
    if !path.starts_with('/') || path.contains('\0') {
        return Err(libc::EINVAL);
    }
    if path == "/" {
        return Ok(("", "/"));
    }
    for c in path[1..].split('/') {
        if c.is_empty() || c == "." || c == ".." {
            return Err(libc::EINVAL);
        }
        if c.len() > NAME_MAX {
            return Err(libc::ENAMETOOLONG);
        }
    }
    let cut = path.rfind('/').expect("absolute");
    Ok((if cut == 0 { "/" } else { &path[..cut] }, &path[cut + 1..]))
}

thread_local! {
    /// Set by [`internal`] when an error leaves the namespace database refusing every later
    /// call (redb's "previous I/O error"); taken by the store that made the call.
    static NEEDS_REOPEN: Cell<bool> = const { Cell::new(false) };
}

/// The errno a request sees for a failure of the namespace database or a data file: a full
/// disk or quota as themselves, anything else as EIO.
fn internal(e: impl Into<redb::Error>) -> i32 {
    let e: redb::Error = e.into();
    let errno = match &e {
        redb::Error::Io(io) => match io.raw_os_error() {
            Some(n @ (libc::ENOSPC | libc::EDQUOT)) => n,
            _ => libc::EIO,
        },
        // An I/O error that left the file in doubt: redb refuses every later call until the
        // database is opened again (one it could ride out it only reports).
        redb::Error::PreviousIo => {
            NEEDS_REOPEN.set(true);
            libc::EIO
        }
        _ => libc::EIO,
    };
    static ERRORS: Refusals = Refusals::new("storage error");
    if ERRORS.log_this(errno) {
        tracing::error!(error = %e, errno, "storage error");
    }
    errno
}

/// A vNode name made safe as a table and directory name.
pub(super) fn vnode_key(vnode: &str) -> FsResult<String> {
    if vnode.is_empty() || vnode.len() > 128 {
        return Err(libc::EINVAL);
    }
    Ok(vnode.bytes().map(|b| format!("{b:02x}")).collect())
}

/// One sComponent's store. Its methods are split by concern: the namespace here, file data and
/// space in `data.rs`, opening, recovery and fsync in `durability.rs`.
pub struct Store {
    /// `None` only while it is opened again after an I/O error ([`Store::db`]).
    db: RwLock<Option<Database>>,
    /// An I/O error left the database refusing everything: it is opened again first.
    poisoned: AtomicBool,
    /// When it was last opened again, or tried.
    reopened_at: Mutex<Option<std::time::Instant>>,
    /// Times it was opened again.
    reopens: AtomicU64,
    /// The room kept on the disk for it is there ([`room`]).
    reserve_held: Mutex<bool>,
    /// Times that room was given up to it.
    reserves_released: AtomicU64,
    /// Next inode number and the end of the durably reserved range.
    inos: Mutex<(u64, u64)>,
    /// Changes committed without fsync since the last durable commit.
    unsynced: AtomicBool,
    dir: PathBuf,
    quota: u64,
    /// Bytes reserved by all inodes together, counted against `quota`.
    used: Mutex<u64>,
    /// Open data files by (vNode key, inode).
    files: Mutex<HashMap<(String, u64), File>>,
}

type NsTable<'a> = TableDefinition<'a, (&'static str, &'static str), u64>;
type InoTable<'a> = TableDefinition<'a, u64, &'static [u8]>;
type DetachedTable<'a> = TableDefinition<'a, u64, ()>;

struct Tables {
    ns: String,
    ino: String,
    detached: String,
}

impl Tables {
    fn of(vkey: &str) -> Tables {
        Tables {
            ns: format!("ns/{vkey}"),
            ino: format!("ino/{vkey}"),
            detached: format!("detached/{vkey}"),
        }
    }
    fn ns(&self) -> NsTable<'_> {
        TableDefinition::new(&self.ns)
    }
    fn ino(&self) -> InoTable<'_> {
        TableDefinition::new(&self.ino)
    }
    fn detached(&self) -> DetachedTable<'_> {
        TableDefinition::new(&self.detached)
    }
}

/// A vNode's table not made yet is ENOENT (the vNode has no file yet); anything else is
/// the database's failure.
fn table_missing(e: redb::TableError) -> i32 {
    match e {
        redb::TableError::TableDoesNotExist(_) => libc::ENOENT,
        e => internal(e),
    }
}

fn enc(i: &Inode) -> Vec<u8> {
    postcard::to_allocvec(i).expect("inode encodes")
}

fn dec(b: &[u8]) -> FsResult<Inode> {
    postcard::from_bytes(b).map_err(|e| {
        tracing::error!(error = %e, "an inode in the namespace does not decode");
        libc::EIO
    })
}

impl Store {
    /// Runs `f` in a write transaction on the vNode's tables (created with their root on first
    /// use) and commits it, durably if asked.
    fn write<T>(
        &self,
        vnode: &str,
        durable: bool,
        f: impl FnOnce(&redb::WriteTransaction, &Tables, &str) -> FsResult<T>,
    ) -> FsResult<T> {
        let vkey = vnode_key(vnode)?;
        let t = Tables::of(&vkey);
        if durable {
            // Cleared before: a change committed meanwhile sets it again, and this commit persists it.
            self.unsynced.store(false, Ordering::Relaxed);
        }
        let r = self.committing(|db| {
            let mut tx = db.begin_write().map_err(internal)?;
            tx.set_durability(if durable {
                Durability::Immediate
            } else {
                Durability::None
            })
            .map_err(internal)?;
            {
                let mut ino = tx.open_table(t.ino()).map_err(internal)?;
                if ino.get(ROOT_INO).map_err(internal)?.is_none() {
                    let now = now_ns();
                    let root = FileAttr {
                        ino: ROOT_INO,
                        kind: FileKind::Dir,
                        perm: 0o755,
                        uid: 0,
                        gid: 0,
                        size: 0,
                        nlink: 2,
                        alloc: 0,
                        atime_ns: now,
                        mtime_ns: now,
                        ctime_ns: now,
                    };
                    ino.insert(
                        ROOT_INO,
                        enc(&Inode {
                            attr: root,
                            target: None,
                        })
                        .as_slice(),
                    )
                    .map_err(internal)?;
                }
            }
            let r = f(&tx, &t, &vkey)?;
            tx.commit().map_err(internal)?;
            Ok(r)
        })?;
        if !durable {
            self.unsynced.store(true, Ordering::Relaxed);
        }
        Ok(r)
    }

    fn read<T>(&self, vnode: &str, f: impl FnOnce(&redb::ReadTransaction, &Tables) -> FsResult<T>) -> FsResult<T> {
        let vkey = vnode_key(vnode)?;
        self.noting(|db| {
            let tx = db.begin_read().map_err(internal)?;
            f(&tx, &Tables::of(&vkey))
        })
    }

    fn get_inode<T: ReadableTable<u64, &'static [u8]>>(t: &T, ino: u64) -> FsResult<Inode> {
        match t.get(ino).map_err(internal)? {
            Some(v) => dec(v.value()),
            None => Err(libc::ENOENT),
        }
    }

    fn put_inode(t: &mut redb::Table<u64, &'static [u8]>, i: &Inode) -> FsResult<()> {
        t.insert(i.attr.ino, enc(i).as_slice()).map_err(internal)?;
        Ok(())
    }

    /// The inode number of a full path, checking that every parent on the way is a directory.
    fn resolve<N: ReadableTable<(&'static str, &'static str), u64>, I: ReadableTable<u64, &'static [u8]>>(
        ns: &N,
        ino: &I,
        path: &str,
    ) -> FsResult<u64> {
        let (parent, name) = split(path)?;
        if parent.is_empty() {
            return Ok(ROOT_INO);
        }
        let p = Store::resolve(ns, ino, parent)?;
        if Store::get_inode(ino, p)?.attr.kind != FileKind::Dir {
            return Err(libc::ENOTDIR);
        }
        match ns.get((parent, name)).map_err(internal)? {
            Some(v) => Ok(v.value()),
            None => Err(libc::ENOENT),
        }
    }

    /// The parent of `path` must exist and be a directory.
    fn parent_dir<N: ReadableTable<(&'static str, &'static str), u64>, I: ReadableTable<u64, &'static [u8]>>(
        ns: &N,
        ino: &I,
        path: &str,
    ) -> FsResult<u64> {
        let (parent, _) = split(path)?;
        if parent.is_empty() {
            return Err(libc::EEXIST);
        }
        let p = Store::resolve(ns, ino, parent)?;
        if Store::get_inode(ino, p)?.attr.kind != FileKind::Dir {
            return Err(libc::ENOTDIR);
        }
        Ok(p)
    }

    fn touch_dir(ino: &mut redb::Table<u64, &'static [u8]>, dir: u64) -> FsResult<()> {
        let mut d = Store::get_inode(ino, dir)?;
        let now = now_ns();
        d.attr.mtime_ns = now;
        d.attr.ctime_ns = now;
        Store::put_inode(ino, &d)
    }

    pub fn lookup(&self, vnode: &str, path: &str) -> FsResult<FileAttr> {
        if path == "/" {
            return self.getattr(vnode, ROOT_INO);
        }
        self.read(vnode, |tx, t| {
            let ns = tx.open_table(t.ns()).map_err(table_missing)?;
            let ino = tx.open_table(t.ino()).map_err(table_missing)?;
            let i = Store::resolve(&ns, &ino, path)?;
            Ok(Store::get_inode(&ino, i)?.attr)
        })
    }

    pub fn getattr(&self, vnode: &str, ino: u64) -> FsResult<FileAttr> {
        match self.read(vnode, |tx, t| {
            Ok(Store::get_inode(&tx.open_table(t.ino()).map_err(table_missing)?, ino)?.attr)
        }) {
            // A vNode's root exists from its first request on.
            Err(libc::ENOENT) if ino == ROOT_INO => self.write(vnode, false, |tx, t, _| {
                Ok(Store::get_inode(&tx.open_table(t.ino()).map_err(internal)?, ROOT_INO)?.attr)
            }),
            r => r,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        vnode: &str,
        path: &str,
        kind: FileKind,
        perm: u32,
        uid: u32,
        gid: u32,
        excl: bool,
        target: Option<String>,
    ) -> FsResult<FileAttr> {
        if kind == FileKind::Symlink && target.as_ref().is_none_or(|t| t.is_empty() || t.len() > PATH_MAX) {
            return Err(libc::EINVAL);
        }
        self.names_fit()?;
        let n = self.alloc_ino()?;
        self.write(vnode, false, |tx, t, _| {
            let mut ns = tx.open_table(t.ns()).map_err(internal)?;
            let mut ino = tx.open_table(t.ino()).map_err(internal)?;
            let dir = Store::parent_dir(&ns, &ino, path)?;
            let (parent, name) = split(path)?;
            if let Some(existing) = ns.get((parent, name)).map_err(internal)?.map(|v| v.value()) {
                let e = Store::get_inode(&ino, existing)?;
                return match (excl, kind, e.attr.kind) {
                    (true, _, _) => Err(libc::EEXIST),
                    (false, FileKind::File, FileKind::Dir) => Err(libc::EISDIR),
                    (false, FileKind::File, _) => Ok(e.attr),
                    _ => Err(libc::EEXIST),
                };
            }
            let now = now_ns();
            let size = target.as_ref().map(|t| t.len() as u64).unwrap_or(0);
            let nlink = if kind == FileKind::Dir { 2 } else { 1 };
            let attr = FileAttr {
                ino: n,
                kind,
                perm: perm & 0o7777,
                uid,
                gid,
                size,
                nlink,
                alloc: 0,
                atime_ns: now,
                mtime_ns: now,
                ctime_ns: now,
            };
            Store::put_inode(
                &mut ino,
                &Inode {
                    attr: attr.clone(),
                    target,
                },
            )?;
            ns.insert((parent, name), n).map_err(internal)?;
            Store::touch_dir(&mut ino, dir)?;
            Ok(attr)
        })
    }

    pub fn setattr(&self, vnode: &str, ino_no: u64, set: &SetAttr) -> FsResult<FileAttr> {
        self.write(vnode, false, |tx, t, _| {
            let mut ino = tx.open_table(t.ino()).map_err(internal)?;
            let mut i = Store::get_inode(&ino, ino_no)?;
            let a = &mut i.attr;
            if let Some(p) = set.perm {
                a.perm = p & 0o7777;
            }
            if let Some(u) = set.uid {
                a.uid = u;
            }
            if let Some(g) = set.gid {
                a.gid = g;
            }
            if let Some(at) = set.atime_ns {
                a.atime_ns = at;
            }
            if let Some(mt) = set.mtime_ns {
                a.mtime_ns = mt;
            }
            a.ctime_ns = now_ns();
            Store::put_inode(&mut ino, &i)?;
            Ok(i.attr)
        })
    }

    pub fn readlink(&self, vnode: &str, ino: u64) -> FsResult<String> {
        self.read(vnode, |tx, t| {
            let i = Store::get_inode(&tx.open_table(t.ino()).map_err(table_missing)?, ino)?;
            i.target.ok_or(libc::EINVAL)
        })
    }

    fn has_children<N: ReadableTable<(&'static str, &'static str), u64>>(ns: &N, dir: &str) -> FsResult<bool> {
        Ok(ns
            .range((dir, "")..)
            .map_err(internal)?
            .next()
            .map(|r| r.map(|(k, _)| k.value().0 == dir))
            .transpose()
            .map_err(internal)?
            .unwrap_or(false))
    }

    /// Removes `path`'s name. A file's inode is detached (kept until `drop_inode`) and returned.
    pub fn unlink(&self, vnode: &str, path: &str, want_dir: bool) -> FsResult<Option<u64>> {
        self.write(vnode, false, |tx, t, _| {
            let mut ns = tx.open_table(t.ns()).map_err(internal)?;
            let mut ino = tx.open_table(t.ino()).map_err(internal)?;
            let (parent, name) = split(path)?;
            if parent.is_empty() {
                return Err(libc::EBUSY);
            }
            let dir = Store::parent_dir(&ns, &ino, path)?;
            let victim = ns
                .get((parent, name))
                .map_err(internal)?
                .map(|v| v.value())
                .ok_or(libc::ENOENT)?;
            let v = Store::get_inode(&ino, victim)?;
            match (want_dir, v.attr.kind == FileKind::Dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if Store::has_children(&ns, path)? => return Err(libc::ENOTEMPTY),
                _ => {}
            }
            ns.remove((parent, name)).map_err(internal)?;
            Store::touch_dir(&mut ino, dir)?;
            Store::unname(tx, t, &mut ino, v)
        })
    }

    /// One name of `v` is gone: a directory or symlink goes with it; a file loses a link and
    /// is detached (returned) when that was its last.
    fn unname(
        tx: &redb::WriteTransaction,
        t: &Tables,
        ino: &mut redb::Table<u64, &'static [u8]>,
        mut v: Inode,
    ) -> FsResult<Option<u64>> {
        let i = v.attr.ino;
        if v.attr.kind != FileKind::File {
            ino.remove(i).map_err(internal)?;
            return Ok(None);
        }
        v.attr.nlink = v.attr.nlink.saturating_sub(1);
        v.attr.ctime_ns = now_ns();
        Store::put_inode(ino, &v)?;
        if v.attr.nlink > 0 {
            return Ok(None);
        }
        tx.open_table(t.detached())
            .map_err(internal)?
            .insert(i, ())
            .map_err(internal)?;
        Ok(Some(i))
    }

    /// A further name `to` for the file `ino_no`.
    pub fn link(&self, vnode: &str, ino_no: u64, to: &str) -> FsResult<FileAttr> {
        self.names_fit()?;
        self.write(vnode, false, |tx, t, _| {
            let mut ns = tx.open_table(t.ns()).map_err(internal)?;
            let mut ino = tx.open_table(t.ino()).map_err(internal)?;
            let mut i = Store::get_inode(&ino, ino_no)?;
            // Only regular files count their names; directories and symlinks have one.
            if i.attr.kind != FileKind::File {
                return Err(libc::EPERM);
            }
            if tx
                .open_table(t.detached())
                .map_err(internal)?
                .get(ino_no)
                .map_err(internal)?
                .is_some()
            {
                return Err(libc::ENOENT);
            }
            let dir = Store::parent_dir(&ns, &ino, to)?;
            let (parent, name) = split(to)?;
            if ns.get((parent, name)).map_err(internal)?.is_some() {
                return Err(libc::EEXIST);
            }
            ns.insert((parent, name), ino_no).map_err(internal)?;
            i.attr.nlink += 1;
            i.attr.ctime_ns = now_ns();
            Store::put_inode(&mut ino, &i)?;
            Store::touch_dir(&mut ino, dir)?;
            Ok(i.attr)
        })
    }

    /// Renames `from` to `to`; returns the inode an existing `to` named, now detached.
    pub fn rename(&self, vnode: &str, from: &str, to: &str, noreplace: bool) -> FsResult<Option<u64>> {
        self.write(vnode, false, |tx, t, _| {
            let mut ns = tx.open_table(t.ns()).map_err(internal)?;
            let mut ino = tx.open_table(t.ino()).map_err(internal)?;
            let (fp, fname) = split(from)?;
            let (tp, tname) = split(to)?;
            if fp.is_empty() || tp.is_empty() {
                return Err(libc::EBUSY);
            }
            let fdir = Store::parent_dir(&ns, &ino, from)?;
            let tdir = Store::parent_dir(&ns, &ino, to)?;
            let src = ns
                .get((fp, fname))
                .map_err(internal)?
                .map(|v| v.value())
                .ok_or(libc::ENOENT)?;
            if from == to {
                return Ok(None);
            }
            let s = Store::get_inode(&ino, src)?;
            let is_dir = s.attr.kind == FileKind::Dir;
            if is_dir && to.starts_with(&format!("{from}/")) {
                return Err(libc::EINVAL);
            }
            let mut detached = None;
            if let Some(dst) = ns.get((tp, tname)).map_err(internal)?.map(|v| v.value()) {
                if noreplace {
                    return Err(libc::EEXIST);
                }
                if dst == src {
                    // Two names of one file: POSIX says rename does nothing.
                    return Ok(None);
                }
                let d = Store::get_inode(&ino, dst)?;
                match (is_dir, d.attr.kind == FileKind::Dir) {
                    (false, true) => return Err(libc::EISDIR),
                    (true, false) => return Err(libc::ENOTDIR),
                    (true, true) if Store::has_children(&ns, to)? => return Err(libc::ENOTEMPTY),
                    _ => {}
                }
                detached = Store::unname(tx, t, &mut ino, d)?;
            }
            ns.remove((fp, fname)).map_err(internal)?;
            ns.insert((tp, tname), src).map_err(internal)?;
            if is_dir {
                // Children of `from` and everything below: parent == from, or parent under "from/".
                let below = format!("{from}/");
                let upper = format!("{from}0");
                let mut moved = Vec::new();
                let children = ns
                    .range((from, "")..)
                    .map_err(internal)?
                    .take_while(|r| r.as_ref().map_or(true, |(k, _)| k.value().0 == from));
                let deeper = ns.range((below.as_str(), "")..(upper.as_str(), "")).map_err(internal)?;
                for r in children.chain(deeper) {
                    let (k, v) = r.map_err(internal)?;
                    let (p, n) = k.value();
                    moved.push((p.to_string(), n.to_string(), v.value()));
                }
                for (p, n, i) in moved {
                    ns.remove((p.as_str(), n.as_str())).map_err(internal)?;
                    let np = format!("{to}{}", &p[from.len()..]);
                    ns.insert((np.as_str(), n.as_str()), i).map_err(internal)?;
                }
            }
            let mut s = s;
            s.attr.ctime_ns = now_ns();
            Store::put_inode(&mut ino, &s)?;
            Store::touch_dir(&mut ino, fdir)?;
            if tdir != fdir {
                Store::touch_dir(&mut ino, tdir)?;
            }
            Ok(detached)
        })
    }

    pub fn readdir(&self, vnode: &str, path: &str, after: Option<&str>) -> FsResult<(Vec<DirEntry>, bool)> {
        if path != "/" && self.lookup(vnode, path)?.kind != FileKind::Dir {
            return Err(libc::ENOTDIR);
        }
        self.read(vnode, |tx, t| {
            let tables = (
                tx.open_table(t.ns()).map_err(table_missing),
                tx.open_table(t.ino()).map_err(table_missing),
            );
            let (ns, ino) = match tables {
                (Ok(n), Ok(i)) => (n, i),
                (Err(libc::ENOENT), _) | (_, Err(libc::ENOENT)) => return Ok((Vec::new(), false)),
                (Err(e), _) | (_, Err(e)) => return Err(e),
            };
            let start = (path, after.unwrap_or(""));
            let mut out = Vec::new();
            for r in ns.range(start..).map_err(internal)? {
                let (k, v) = r.map_err(internal)?;
                let (parent, name) = k.value();
                if parent != path {
                    break;
                }
                if Some(name) == after {
                    continue;
                }
                if out.len() == LIST_BATCH {
                    return Ok((out, true));
                }
                let i = Store::get_inode(&ino, v.value())?;
                out.push(DirEntry {
                    name: name.to_string(),
                    ino: i.attr.ino,
                    kind: i.attr.kind,
                });
            }
            Ok((out, false))
        })
    }

    /// Frees a detached inode and its data. Named inodes are left alone.
    /// The removal commits durably before the data goes: a crash never leaves a name whose
    /// data is gone.
    pub fn drop_inode(&self, vnode: &str, ino_no: u64) -> FsResult<()> {
        let vkey = vnode_key(vnode)?;
        let freed = self.write(vnode, true, |tx, t, _| {
            let mut det = tx.open_table(t.detached()).map_err(internal)?;
            if det.remove(ino_no).map_err(internal)?.is_none() {
                return Ok(None);
            }
            let mut ino = tx.open_table(t.ino()).map_err(internal)?;
            let i = Store::get_inode(&ino, ino_no)?;
            ino.remove(ino_no).map_err(internal)?;
            Ok(Some(i.attr.alloc))
        })?;
        if let Some(freed) = freed {
            self.free_data(&vkey, ino_no, freed);
        }
        Ok(())
    }

    pub fn files(&self, vnode: &str) -> FsResult<u64> {
        self.read(vnode, |tx, t| match tx.open_table(t.ino()).map_err(table_missing) {
            Ok(i) => i.len().map_err(internal),
            Err(libc::ENOENT) => Ok(0),
            Err(e) => Err(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_cannot_leave_the_namespace() {
        assert_eq!(split("/a/b"), Ok(("/a", "b")));
        assert_eq!(split("/a"), Ok(("/", "a")));
        assert_eq!(split("/"), Ok(("", "/")));
        for bad in ["a/b", "/a/../b", "/..", "/a//b", "/a/", "/./a", ""] {
            assert_eq!(split(bad), Err(libc::EINVAL), "{bad}");
        }
        assert_eq!(split(&format!("/{}", "x".repeat(256))), Err(libc::ENAMETOOLONG));
        assert_eq!(split(&"/x".repeat(3000)), Err(libc::ENAMETOOLONG));
    }

    #[test]
    fn namespace_operations_and_errors() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), 1 << 20).unwrap();
        let v = "vn";
        s.create(v, "/d", FileKind::Dir, 0o755, 0, 0, true, None).unwrap();
        let f = s.create(v, "/d/f", FileKind::File, 0o644, 0, 0, true, None).unwrap();
        assert_eq!(
            s.create(v, "/d/f", FileKind::File, 0o644, 0, 0, true, None),
            Err(libc::EEXIST)
        );
        assert_eq!(
            s.create(v, "/d/f/x", FileKind::File, 0o644, 0, 0, true, None),
            Err(libc::ENOTDIR)
        );
        assert_eq!(
            s.create(v, "/nope/x", FileKind::File, 0o644, 0, 0, true, None),
            Err(libc::ENOENT)
        );
        assert_eq!(s.unlink(v, "/d", true), Err(libc::ENOTEMPTY));
        assert_eq!(s.unlink(v, "/d", false), Err(libc::EISDIR));
        s.write_data(v, f.ino, 0, b"hello", 5, 0).unwrap();
        s.rename(v, "/d", "/e", false).unwrap();
        assert_eq!(s.lookup(v, "/e/f").unwrap().ino, f.ino);
        assert_eq!(s.lookup(v, "/d/f"), Err(libc::ENOENT));
        assert_eq!(s.read_data(v, f.ino, 0, 100).unwrap(), b"hello");
        assert_eq!(s.rename(v, "/e", "/e/inside", false), Err(libc::EINVAL));
        let (names, more) = s.readdir(v, "/", None).unwrap();
        assert_eq!((names.len(), more), (1, false));
        assert_eq!(s.lookup("other", "/e"), Err(libc::ENOENT), "vNodes do not share names");
        assert_eq!(
            s.write_data(v, f.ino, 0, &vec![1u8; 2 << 20], 2 << 20, 0),
            Err(libc::ENOSPC)
        );
        let gone = s.unlink(v, "/e/f", false).unwrap().unwrap();
        assert_eq!(
            s.read_data(v, gone, 0, 5).unwrap(),
            b"hello",
            "a detached inode keeps its data"
        );
        s.drop_inode(v, gone).unwrap();
        assert_eq!(s.getattr(v, gone), Err(libc::ENOENT));
        assert_eq!(s.used(), 0);
        assert_eq!(
            s.sync(v, Some(gone)),
            Err(libc::ENOENT),
            "fsync of a dropped inode cannot succeed"
        );
    }
}
