//! The durable state of an sComponent: every vNode's namespace and inodes in one redb database,
//! file data in one file per inode under the vNode's directory.
//!
//! The paper keys a hash table by full path. We keep the full path as the key, split as
//! (parent path, name) in a B-tree: a lookup is still one probe by name, and a directory
//! listing is a range scan of its children instead of a walk over the whole vNode. A rename of
//! a directory rewrites the keys of its subtree, as the paper's flat table must too; data is
//! kept by inode number, so no data moves.
//!
//! Ordinary changes commit without fsync; `sync` commits durably (which also persists every
//! change before it) after an fdatasync of the file's data. So an acknowledged fsync survives
//! a kill -9 of any component and a restart of this one.
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use redb::{Database, Durability, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle};
use serde::{Deserialize, Serialize};
use splitos_rpc::{DirEntry, FileAttr, FileKind, SetAttr};

pub type FsResult<T> = Result<T, i32>;

pub const NAME_MAX: usize = 255;
pub const PATH_MAX: usize = 4096;
const ROOT_INO: u64 = 1;
/// Inode numbers reserved durably at a time: after a crash numbering resumes past the
/// reservation, so a number is never handed out twice (a cache keyed by it stays right).
const INO_BATCH: u64 = 4096;
/// Largest file size and offset accepted from a request.
pub const MAX_FILE_SIZE: u64 = 1 << 44;
/// Entries per directory-listing reply.
const LIST_BATCH: usize = 256;
/// Open data files kept around between requests.
const OPEN_FILES: usize = 256;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

#[derive(Serialize, Deserialize, Clone)]
struct Inode {
    attr: FileAttr,
    target: Option<String>,
}

fn now_ns() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
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

fn internal(e: impl std::fmt::Display) -> i32 {
    tracing::error!(error = %e, "storage error");
    libc::EIO
}

fn io_errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// A vNode name made safe as a table and directory name.
fn vnode_key(vnode: &str) -> FsResult<String> {
    if vnode.is_empty() || vnode.len() > 128 {
        return Err(libc::EINVAL);
    }
    Ok(vnode.bytes().map(|b| format!("{b:02x}")).collect())
}

pub struct Store {
    db: Database,
    /// Next inode number and the end of the durably reserved range.
    inos: Mutex<(u64, u64)>,
    /// Changes committed without fsync since the last durable commit.
    unsynced: std::sync::atomic::AtomicBool,
    dir: PathBuf,
    quota: u64,
    used: Mutex<u64>,
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
        Tables { ns: format!("ns/{vkey}"), ino: format!("ino/{vkey}"), detached: format!("detached/{vkey}") }
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

fn enc(i: &Inode) -> Vec<u8> {
    postcard::to_allocvec(i).expect("inode encodes")
}

fn dec(b: &[u8]) -> FsResult<Inode> {
    postcard::from_bytes(b).map_err(internal)
}

impl Store {
    /// Opens (or creates) the store under `dir`. Inodes detached by an earlier run and never
    /// dropped (their pComponent went away) are freed now.
    pub fn open(dir: &Path, quota: u64) -> anyhow::Result<Store> {
        std::fs::create_dir_all(dir.join("data"))?;
        let db = Database::create(dir.join("namespace.redb")).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => anyhow::anyhow!("storage directory {} is in use by another sComponent", dir.display()),
            e => anyhow::anyhow!("cannot open the namespace in {}: {e}", dir.display()),
        })?;
        let s = Store { db, inos: Mutex::new((0, 0)), unsynced: std::sync::atomic::AtomicBool::new(false), dir: dir.to_path_buf(), quota, used: Mutex::new(0), files: Mutex::new(HashMap::new()) };
        s.recover()?;
        Ok(s)
    }

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
                used += dec(v.value()).map_err(|e| anyhow::anyhow!("corrupt inode record (errno {e})"))?.attr.alloc;
            }
        }
        let limit = tx.open_table(META)?.get("ino_limit")?.map(|v| v.value()).unwrap_or(ROOT_INO + 1);
        // Data files without an inode: their creation or deletion did not become durable.
        let mut orphans = 0u64;
        for name in names.iter().filter_map(|n| n.strip_prefix("ino/")) {
            let ino = tx.open_table(Tables::of(name).ino())?;
            for e in std::fs::read_dir(self.dir.join("data").join(name)).into_iter().flatten().flatten() {
                let known = e.file_name().to_str().and_then(|n| n.parse::<u64>().ok()).map(|i| ino.get(i).map(|v| v.is_some()).unwrap_or(true));
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

    fn data_path(&self, vkey: &str, ino: u64) -> PathBuf {
        self.dir.join("data").join(vkey).join(ino.to_string())
    }

    pub fn used(&self) -> u64 {
        *self.used.lock().unwrap()
    }

    pub fn quota(&self) -> u64 {
        self.quota
    }

    /// Runs `f` in a write transaction on the vNode's tables (created with their root on first
    /// use) and commits it, durably if asked.
    fn write<T>(&self, vnode: &str, durable: bool, f: impl FnOnce(&redb::WriteTransaction, &Tables, &str) -> FsResult<T>) -> FsResult<T> {
        let vkey = vnode_key(vnode)?;
        let t = Tables::of(&vkey);
        if durable {
            // Cleared before: a change committed meanwhile sets it again, and this commit persists it.
            self.unsynced.store(false, std::sync::atomic::Ordering::Relaxed);
        }
        let mut tx = self.db.begin_write().map_err(internal)?;
        tx.set_durability(if durable { Durability::Immediate } else { Durability::None }).map_err(internal)?;
        {
            let mut ino = tx.open_table(t.ino()).map_err(internal)?;
            if ino.get(ROOT_INO).map_err(internal)?.is_none() {
                let now = now_ns();
                let root = FileAttr { ino: ROOT_INO, kind: FileKind::Dir, perm: 0o755, uid: 0, gid: 0, size: 0, nlink: 2, alloc: 0, atime_ns: now, mtime_ns: now, ctime_ns: now };
                ino.insert(ROOT_INO, enc(&Inode { attr: root, target: None }).as_slice()).map_err(internal)?;
            }
        }
        let r = f(&tx, &t, &vkey)?;
        tx.commit().map_err(internal)?;
        if !durable {
            self.unsynced.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(r)
    }

    fn read<T>(&self, vnode: &str, f: impl FnOnce(&redb::ReadTransaction, &Tables) -> FsResult<T>) -> FsResult<T> {
        let vkey = vnode_key(vnode)?;
        let tx = self.db.begin_read().map_err(internal)?;
        f(&tx, &Tables::of(&vkey))
    }

    /// A fresh inode number; call outside any write transaction (it may commit one itself).
    fn alloc_ino(&self) -> FsResult<u64> {
        let mut g = self.inos.lock().unwrap();
        if g.0 >= g.1 {
            let limit = g.0 + INO_BATCH;
            let mut tx = self.db.begin_write().map_err(internal)?;
            tx.set_durability(Durability::Immediate).map_err(internal)?;
            tx.open_table(META).map_err(internal)?.insert("ino_limit", limit).map_err(internal)?;
            tx.commit().map_err(internal)?;
            g.1 = limit;
        }
        g.0 += 1;
        Ok(g.0 - 1)
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
    fn resolve<N: ReadableTable<(&'static str, &'static str), u64>, I: ReadableTable<u64, &'static [u8]>>(ns: &N, ino: &I, path: &str) -> FsResult<u64> {
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
    fn parent_dir<N: ReadableTable<(&'static str, &'static str), u64>, I: ReadableTable<u64, &'static [u8]>>(ns: &N, ino: &I, path: &str) -> FsResult<u64> {
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
            let (ns, ino) = match (tx.open_table(t.ns()), tx.open_table(t.ino())) {
                (Ok(n), Ok(i)) => (n, i),
                _ => return Err(libc::ENOENT),
            };
            let i = Store::resolve(&ns, &ino, path)?;
            Ok(Store::get_inode(&ino, i)?.attr)
        })
    }

    pub fn getattr(&self, vnode: &str, ino: u64) -> FsResult<FileAttr> {
        match self.read(vnode, |tx, t| Ok(Store::get_inode(&tx.open_table(t.ino()).map_err(|_| libc::ENOENT)?, ino)?.attr)) {
            // A vNode's root exists from its first request on.
            Err(libc::ENOENT) if ino == ROOT_INO => self.write(vnode, false, |tx, t, _| Ok(Store::get_inode(&tx.open_table(t.ino()).map_err(internal)?, ROOT_INO)?.attr)),
            r => r,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub fn create(&self, vnode: &str, path: &str, kind: FileKind, perm: u32, uid: u32, gid: u32, excl: bool, target: Option<String>) -> FsResult<FileAttr> {
        if kind == FileKind::Symlink && target.as_ref().is_none_or(|t| t.is_empty() || t.len() > PATH_MAX) {
            return Err(libc::EINVAL);
        }
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
            let attr = FileAttr { ino: n, kind, perm: perm & 0o7777, uid, gid, size, nlink, alloc: 0, atime_ns: now, mtime_ns: now, ctime_ns: now };
            Store::put_inode(&mut ino, &Inode { attr: attr.clone(), target })?;
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
            let i = Store::get_inode(&tx.open_table(t.ino()).map_err(|_| libc::ENOENT)?, ino)?;
            i.target.ok_or(libc::EINVAL)
        })
    }

    fn has_children<N: ReadableTable<(&'static str, &'static str), u64>>(ns: &N, dir: &str) -> FsResult<bool> {
        Ok(ns.range((dir, "")..).map_err(internal)?.next().map(|r| r.map(|(k, _)| k.value().0 == dir)).transpose().map_err(internal)?.unwrap_or(false))
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
            let victim = ns.get((parent, name)).map_err(internal)?.map(|v| v.value()).ok_or(libc::ENOENT)?;
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
    fn unname(tx: &redb::WriteTransaction, t: &Tables, ino: &mut redb::Table<u64, &'static [u8]>, mut v: Inode) -> FsResult<Option<u64>> {
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
        tx.open_table(t.detached()).map_err(internal)?.insert(i, ()).map_err(internal)?;
        Ok(Some(i))
    }

    /// A further name `to` for the file `ino_no`.
    pub fn link(&self, vnode: &str, ino_no: u64, to: &str) -> FsResult<FileAttr> {
        self.write(vnode, false, |tx, t, _| {
            let mut ns = tx.open_table(t.ns()).map_err(internal)?;
            let mut ino = tx.open_table(t.ino()).map_err(internal)?;
            let mut i = Store::get_inode(&ino, ino_no)?;
            // Only regular files count their names; directories and symlinks have one.
            if i.attr.kind != FileKind::File {
                return Err(libc::EPERM);
            }
            if tx.open_table(t.detached()).map_err(internal)?.get(ino_no).map_err(internal)?.is_some() {
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
            let src = ns.get((fp, fname)).map_err(internal)?.map(|v| v.value()).ok_or(libc::ENOENT)?;
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
                let children = ns.range((from, "")..).map_err(internal)?.take_while(|r| r.as_ref().map_or(true, |(k, _)| k.value().0 == from));
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
            let (ns, ino) = match (tx.open_table(t.ns()), tx.open_table(t.ino())) {
                (Ok(n), Ok(i)) => (n, i),
                _ => return Ok((Vec::new(), false)),
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
                out.push(DirEntry { name: name.to_string(), ino: i.attr.ino, kind: i.attr.kind });
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
            self.files.lock().unwrap().remove(&(vkey.clone(), ino_no));
            let _ = std::fs::remove_file(self.data_path(&vkey, ino_no));
            let mut used = self.used.lock().unwrap();
            *used = used.saturating_sub(freed);
        }
        Ok(())
    }

    pub fn files(&self, vnode: &str) -> FsResult<u64> {
        self.read(vnode, |tx, t| Ok(tx.open_table(t.ino()).map(|i| i.len().unwrap_or(0)).unwrap_or(0)))
    }

    /// Runs `f` on the data file of an inode, opened (and created) on demand.
    fn with_file<T>(&self, vkey: &str, ino: u64, f: impl FnOnce(&File) -> std::io::Result<T>) -> FsResult<T> {
        let mut files = self.files.lock().unwrap();
        let key = (vkey.to_string(), ino);
        if !files.contains_key(&key) {
            if files.len() >= OPEN_FILES {
                files.clear();
            }
            let p = self.data_path(vkey, ino);
            std::fs::create_dir_all(p.parent().expect("data dir")).map_err(io_errno)?;
            let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p).map_err(io_errno)?;
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
        let (from, len) = (i.attr.alloc as libc::off_t, grow as libc::off_t);
        self.with_file(vkey, i.attr.ino, |f| {
            use std::os::fd::AsRawFd;
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
                    use std::os::fd::AsRawFd;
                    let r = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, from, len) };
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
            self.with_file(vkey, i.attr.ino, |f| if f.metadata()?.len() > size { f.set_len(size) } else { Ok(()) })?;
        }
        Ok(())
    }

    pub fn write_data(&self, vnode: &str, ino_no: u64, offset: u64, data: &[u8], size: u64) -> FsResult<()> {
        let end = offset.checked_add(data.len() as u64).filter(|e| *e <= MAX_FILE_SIZE && size <= MAX_FILE_SIZE).ok_or(libc::EFBIG)?;
        // An overwrite inside the file and its reservation changes no metadata but the mtime,
        // which is kept to the second: no namespace commit, so fsync is one fdatasync.
        let a = self.getattr(vnode, ino_no)?;
        if a.kind == FileKind::File && a.size == size && end <= a.size.max(a.alloc) && now_ns() - a.mtime_ns < 1_000_000_000 {
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
            let now = now_ns();
            i.attr.mtime_ns = now;
            i.attr.ctime_ns = now;
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

    /// Makes every change so far durable, if there are any (the periodic and final commit).
    pub fn checkpoint(&self) -> FsResult<()> {
        if !self.unsynced.swap(false, std::sync::atomic::Ordering::Relaxed) {
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
        assert_eq!(s.create(v, "/d/f", FileKind::File, 0o644, 0, 0, true, None), Err(libc::EEXIST));
        assert_eq!(s.create(v, "/d/f/x", FileKind::File, 0o644, 0, 0, true, None), Err(libc::ENOTDIR));
        assert_eq!(s.create(v, "/nope/x", FileKind::File, 0o644, 0, 0, true, None), Err(libc::ENOENT));
        assert_eq!(s.unlink(v, "/d", true), Err(libc::ENOTEMPTY));
        assert_eq!(s.unlink(v, "/d", false), Err(libc::EISDIR));
        s.write_data(v, f.ino, 0, b"hello", 5).unwrap();
        s.rename(v, "/d", "/e", false).unwrap();
        assert_eq!(s.lookup(v, "/e/f").unwrap().ino, f.ino);
        assert_eq!(s.lookup(v, "/d/f"), Err(libc::ENOENT));
        assert_eq!(s.read_data(v, f.ino, 0, 100).unwrap(), b"hello");
        assert_eq!(s.rename(v, "/e", "/e/inside", false), Err(libc::EINVAL));
        let (names, more) = s.readdir(v, "/", None).unwrap();
        assert_eq!((names.len(), more), (1, false));
        assert_eq!(s.lookup("other", "/e"), Err(libc::ENOENT), "vNodes do not share names");
        assert_eq!(s.write_data(v, f.ino, 0, &vec![1u8; 2 << 20], 2 << 20), Err(libc::ENOSPC));
        let gone = s.unlink(v, "/e/f", false).unwrap().unwrap();
        assert_eq!(s.read_data(v, gone, 0, 5).unwrap(), b"hello", "a detached inode keeps its data");
        s.drop_inode(v, gone).unwrap();
        assert_eq!(s.getattr(v, gone), Err(libc::ENOENT));
        assert_eq!(s.used(), 0);
        assert_eq!(s.sync(v, Some(gone)), Err(libc::ENOENT), "fsync of a dropped inode cannot succeed");
    }

    #[test]
    fn reservations_are_given_back_and_inode_numbers_never_reused() {
        let d = tempfile::tempdir().unwrap();
        let first = {
            let s = Store::open(d.path(), 8 << 20).unwrap();
            let f = s.create("v", "/f", FileKind::File, 0o644, 0, 0, true, None).unwrap();
            s.reserve("v", f.ino, 4 << 20).unwrap();
            assert_eq!(s.used(), 4 << 20);
            s.write_data("v", f.ino, 0, b"abc", 3).unwrap();
            s.reserve("v", f.ino, 0).unwrap();
            assert_eq!(s.used(), 4096, "only the block holding data stays reserved");
            assert_eq!(s.reserve("v", f.ino, 9 << 20), Err(libc::ENOSPC));
            assert_eq!(s.write_data("v", f.ino, u64::MAX - 2, b"abc", 3), Err(libc::EFBIG));
            f.ino
        };
        // Whether or not the unsynced create survived, a new file never gets its number.
        let s = Store::open(d.path(), 8 << 20).unwrap();
        let g = s.create("v", "/g", FileKind::File, 0o644, 0, 0, true, None).unwrap();
        assert_ne!(g.ino, first);
    }
}
