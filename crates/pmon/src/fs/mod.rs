//! The vNode file system: a FUSE mount on the pComponent per vNode, where programs see their
//! vNode's files as a normal hierarchy (LegoOS §4.5; the paper's "extended Linux state layer").
//!
//! The pComponent keeps no file data. Names and attributes go to the vNode's sComponent (full
//! paths, stateless); file data goes to the mComponent holding that file's buffer cache, which
//! reads from and writes back to the sComponent. Files are opened with direct I/O, so no page
//! cache on the pComponent stands between a program and the buffer cache; reading mmaps are
//! still allowed (FUSE_DIRECT_IO_ALLOW_MMAP).
//!
//! A name removed while a program still has the file open keeps its inode (detached at the
//! sComponent) until the last close here, as POSIX wants.
//!
//! Every user may reach the mount (allow_other), and the kernel checks each access against
//! the files' owners and modes (default_permissions), which the sComponent keeps as programs
//! set them. The top directory is the vNode's door: it shows root as owner, mode
//! [`TOP_MODE`], and the vNode's grants as its POSIX ACL, so only the users the admin granted
//! the vNode get past it.
pub(super) mod grants;

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, MountOption,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
};
use serde_bytes::ByteBuf;
use splitos_rpc::Request as RpcRequest;
use splitos_rpc::{ErrCode, FileAttr, FileKind, Refusal, RpcError, SetAttr, ERR, NAME_MAX, PAGE_SIZE};
use splitos_rpc::{
    P2G_FILE_CACHE, P2G_VNODE_STORAGE, P2M_FILE_FORGET, P2M_FILE_READ, P2M_FILE_SETSIZE, P2M_FILE_STAT, P2M_FILE_SYNC,
    P2M_FILE_WRITE,
};
use splitos_rpc::{
    P2S_CREATE, P2S_DROP, P2S_LINK, P2S_LOOKUP, P2S_READDIR, P2S_READLINK, P2S_RENAME, P2S_SETATTR, P2S_STATFS,
    P2S_UNLINK, X2S_GETATTR, X2S_SYNC,
};

pub use grants::Grants;
use grants::{Grant, TOP_MODE};
use splitos_core::config::check_vnode_name;
use splitos_core::node::Node;
use splitos_core::sys::unmount;

/// How long the kernel may trust a name or attributes without asking again.
const TTL: Duration = Duration::from_secs(1);
const ROOT: u64 = 1;
/// Largest write the kernel sends in one request (the RPC frame bound is 2 MiB).
const MAX_WRITE: u32 = 1 << 20;

type R<T> = Result<T, Errno>;

struct State {
    scomp: Option<String>,
    /// Full path of every inode the kernel knows (FUSE speaks inode numbers, the sComponent
    /// paths), with the kernel's count of lookups: at zero (FUSE forget) it is dropped.
    paths: HashMap<u64, String>,
    lookups: HashMap<u64, u64>,
    /// Where each file's buffer cache is (asked of the global managers once per file).
    /// Kept while the pComponent lives, so that a file's blocks stay at one mComponent even
    /// if GMM's choice changes when mComponents join.
    caches: HashMap<u64, String>,
    open: HashMap<u64, u32>,
    /// Inodes whose name is gone but which are still open here.
    detached: HashSet<u64>,
    /// Directory listings by handle, taken at opendir so that offsets stay stable.
    listings: HashMap<u64, Vec<(u64, FileType, String)>>,
    next_fh: u64,
}

pub struct VnodeFs {
    vnode: String,
    node: Arc<Node>,
    /// Who besides root may enter (none: root alone).
    grant: Option<Grant>,
    st: Mutex<State>,
}

const ACL_ACCESS: &str = "system.posix_acl_access";

/// How many times a file request follows a buffer cache that moved (a heartbeat apart).
const MOVED_TRIES: usize = 40;

fn errno_of(e: &RpcError) -> Errno {
    Errno::from_i32(e.code().errno())
}

/// The request never reached the component (no connection, or the send failed), so it is
/// safe to send again; after a timeout or a lost reply it may have been carried out.
fn unreachable(e: &RpcError) -> bool {
    matches!(e, RpcError::Unreachable { .. })
}

fn to_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn to_ns(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

fn kind_of(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
    }
}

fn fuse_attr(a: &FileAttr) -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: to_time(a.atime_ns),
        mtime: to_time(a.mtime_ns),
        ctime: to_time(a.ctime_ns),
        crtime: to_time(a.ctime_ns),
        kind: kind_of(a.kind),
        perm: a.perm as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: PAGE_SIZE as u32,
        flags: 0,
    }
}

/// An extended attribute's value or list: its size when asked with no room (`size` 0), else
/// the bytes if they fit.
fn xattr_reply(reply: ReplyXattr, bytes: &[u8], size: u32) {
    if size == 0 {
        reply.size(bytes.len() as u32)
    } else if (size as usize) < bytes.len() {
        reply.error(Errno::ERANGE)
    } else {
        reply.data(bytes)
    }
}

fn join(parent: &str, name: &OsStr) -> R<String> {
    let name = name.to_str().ok_or(Errno::EINVAL)?;
    Ok(if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    })
}

impl VnodeFs {
    pub fn new(vnode: String, node: Arc<Node>, grant: Option<Grant>) -> VnodeFs {
        let mut paths = HashMap::new();
        paths.insert(ROOT, "/".to_string());
        VnodeFs {
            vnode,
            node,
            grant,
            st: Mutex::new(State {
                scomp: None,
                paths,
                lookups: HashMap::new(),
                caches: HashMap::new(),
                open: HashMap::new(),
                detached: HashSet::new(),
                listings: HashMap::new(),
                next_fh: 1,
            }),
        }
    }

    /// The vNode's sComponent, as GSM placed it.
    pub fn storage(&self) -> R<String> {
        if let Some(s) = self.st.lock().unwrap().scomp.clone() {
            return Ok(s);
        }
        match self.node.call_gm(P2G_VNODE_STORAGE {
            vnode: self.vnode.clone(),
        }) {
            Ok(r) => {
                self.st.lock().unwrap().scomp = Some(r.scomp.addr.clone());
                Ok(r.scomp.addr)
            }
            Err(e) => {
                tracing::warn!(vnode = %self.vnode, error = %e, "no sComponent for the vNode");
                Err(Errno::EIO)
            }
        }
    }

    /// A request to the sComponent; if it cannot be reached, ask GSM again once (it may
    /// have come back elsewhere). Still unreachable: EIO.
    fn s_call<Q: RpcRequest + Clone>(&self, req: Q) -> R<Q::Reply> {
        for attempt in 0..2 {
            let s = self.storage()?;
            match self.node.rpc.call(&s, req.clone()) {
                Ok(m) => return Ok(m),
                Err(e) if unreachable(&e) && attempt == 0 => {
                    self.st.lock().unwrap().scomp = None;
                }
                Err(e) => {
                    if !matches!(e, RpcError::Remote { .. }) {
                        tracing::warn!(vnode = %self.vnode, error = %e, "sComponent unreachable: EIO");
                    }
                    return Err(errno_of(&e));
                }
            }
        }
        Err(Errno::EIO)
    }

    fn cache_of(&self, ino: u64) -> R<String> {
        if let Some(m) = self.st.lock().unwrap().caches.get(&ino).cloned() {
            return Ok(m);
        }
        match self.node.call_gm(P2G_FILE_CACHE {
            vnode: self.vnode.clone(),
            ino,
        }) {
            Ok(r) => {
                self.st.lock().unwrap().caches.insert(ino, r.mcomp.addr.clone());
                Ok(r.mcomp.addr)
            }
            Err(_) => Err(Errno::EIO),
        }
    }

    /// A request to the mComponent holding the file's buffer cache; if it is gone, GMM
    /// places the cache again (on a live one) and the request is retried once.
    /// A cache that moved (its mComponent is leaving, `ErrCode::Moved`) is asked for again
    /// until GMM places it elsewhere, which it does once the old one wrote the file back.
    fn m_call<Q: RpcRequest>(&self, ino: u64, req: impl Fn(String) -> Q) -> R<Q::Reply> {
        let mut unreached = 0;
        for _ in 0..MOVED_TRIES {
            let (m, s) = (self.cache_of(ino)?, self.storage()?);
            match self.node.rpc.call(&m, req(s)) {
                Ok(r) => return Ok(r),
                Err(RpcError::Remote {
                    code: ErrCode::Moved, ..
                }) => {
                    self.st.lock().unwrap().caches.remove(&ino);
                    std::thread::sleep(splitos_core::node::HEARTBEAT);
                }
                Err(e) if unreachable(&e) && unreached == 0 => {
                    unreached += 1;
                    let mut st = self.st.lock().unwrap();
                    st.caches.remove(&ino);
                    st.scomp = None;
                }
                Err(e) => return Err(errno_of(&e)),
            }
        }
        Err(Errno::EIO)
    }

    fn path(&self, ino: u64) -> R<String> {
        self.st.lock().unwrap().paths.get(&ino).cloned().ok_or(Errno::ESTALE)
    }

    /// Attributes as the kernel sees them: the top directory is the vNode's door (see the
    /// module's comment), whatever the sComponent records for it.
    fn attr(&self, a: &FileAttr) -> fuser::FileAttr {
        let mut f = fuse_attr(a);
        if a.ino == ROOT {
            (f.uid, f.gid, f.perm) = (
                0,
                0,
                (if self.grant.is_some() {
                    TOP_MODE
                } else {
                    TOP_MODE & !0o070
                }) as u16,
            );
        }
        f
    }

    /// Attributes with the size and mtime the buffer cache knows, for files it holds.
    fn complete(&self, mut a: FileAttr) -> R<FileAttr> {
        if a.kind == FileKind::File {
            let cached = self.m_call(a.ino, |_| P2M_FILE_STAT {
                vnode: self.vnode.clone(),
                ino: a.ino,
            })?;
            if let Some(size) = cached.size {
                a.size = size;
                a.mtime_ns = a.mtime_ns.max(cached.mtime_ns);
                // A buffered write changed the file already; its write-back keeps that time.
                a.ctime_ns = a.ctime_ns.max(cached.mtime_ns);
            }
        }
        Ok(a)
    }

    /// Records a name the kernel is told about (every reply with an entry counts a lookup).
    fn learn(&self, path: String, a: &FileAttr) {
        let mut st = self.st.lock().unwrap();
        st.paths.insert(a.ino, path);
        *st.lookups.entry(a.ino).or_insert(0) += 1;
    }

    fn lookup_path(&self, path: String) -> R<FileAttr> {
        let a = self.complete(
            self.s_call(P2S_LOOKUP {
                vnode: self.vnode.clone(),
                path: path.clone(),
            })?
            .attr,
        )?;
        self.learn(path, &a);
        Ok(a)
    }

    #[allow(clippy::too_many_arguments)]
    fn create_node(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: FileKind,
        perm: u32,
        excl: bool,
        target: Option<String>,
    ) -> R<FileAttr> {
        let path = join(&self.path(parent.0)?, name)?;
        let m = self.s_call(P2S_CREATE {
            vnode: self.vnode.clone(),
            path: path.clone(),
            kind,
            perm,
            uid: req.uid(),
            gid: req.gid(),
            excl,
            target,
        })?;
        let a = self.complete(m.attr)?;
        self.learn(path, &a);
        Ok(a)
    }

    /// An existing file that a create without O_EXCL opens: checked as the kernel checks an
    /// open (owner, group, other; root passes) and truncated for O_TRUNC. The request names
    /// only the caller's primary group, so a file open to a supplementary group alone is
    /// refused here, never opened wrongly.
    fn open_existing(&self, req: &Request, parent: INodeNo, name: &OsStr, flags: i32) -> R<FileAttr> {
        let a = self.lookup_path(join(&self.path(parent.0)?, name)?)?;
        if a.kind == FileKind::Dir {
            return Err(Errno::EISDIR);
        }
        let want = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => 4,
            libc::O_WRONLY => 2,
            _ => 6,
        } | if flags & libc::O_TRUNC != 0 { 2 } else { 0 };
        let shift = if req.uid() == a.uid {
            6
        } else if req.gid() == a.gid {
            3
        } else {
            0
        };
        let bits = (a.perm >> shift) & 7;
        if req.uid() != 0 && bits & want != want {
            return Err(Errno::EACCES);
        }
        if flags & libc::O_TRUNC != 0 {
            return self.do_setattr(a.ino, Some(0), SetAttr::default());
        }
        Ok(a)
    }

    /// Frees a detached inode now, or at its last close here.
    fn detached(&self, ino: Option<u64>) {
        let Some(ino) = ino else { return };
        {
            let mut st = self.st.lock().unwrap();
            st.paths.remove(&ino);
            if st.open.get(&ino).copied().unwrap_or(0) > 0 {
                st.detached.insert(ino);
                return;
            }
        }
        self.free(ino);
    }

    fn free(&self, ino: u64) {
        let _ = self.m_call(ino, |_| P2M_FILE_FORGET {
            vnode: self.vnode.clone(),
            ino,
        });
        if let Err(e) = self.s_call(P2S_DROP {
            vnode: self.vnode.clone(),
            ino,
        }) {
            tracing::warn!(vnode = %self.vnode, ino, error = ?e, "could not free a deleted file; the sComponent frees it when it restarts");
        }
        self.st.lock().unwrap().caches.remove(&ino);
    }

    fn open_fh(&self, ino: u64) -> u64 {
        let mut st = self.st.lock().unwrap();
        *st.open.entry(ino).or_insert(0) += 1;
        st.next_fh += 1;
        st.next_fh
    }

    fn do_setattr(&self, ino: u64, size: Option<u64>, set: SetAttr) -> R<FileAttr> {
        if let Some(size) = size {
            self.m_call(ino, |scomp| P2M_FILE_SETSIZE {
                scomp,
                vnode: self.vnode.clone(),
                ino,
                size,
            })?;
        }
        let mut a = self.complete(
            self.s_call(P2S_SETATTR {
                vnode: self.vnode.clone(),
                ino,
                set: set.clone(),
            })?
            .attr,
        )?;
        if let Some(mt) = set.mtime_ns {
            // An explicit mtime (tar, touch -d) wins over the time of a buffered write.
            a.mtime_ns = mt;
        }
        Ok(a)
    }

    fn list(&self, ino: u64) -> R<Vec<(u64, FileType, String)>> {
        let path = self.path(ino)?;
        // The kernel answers ".." itself; its inode number here is only informative.
        let mut out = vec![
            (ino, FileType::Directory, ".".to_string()),
            (ROOT, FileType::Directory, "..".to_string()),
        ];
        let mut after = None;
        loop {
            let splitos_rpc::S2P_ENTRIES { entries, more } = self.s_call(P2S_READDIR {
                vnode: self.vnode.clone(),
                path: path.clone(),
                after: after.clone(),
            })?;
            after = entries.last().map(|e| e.name.clone());
            out.extend(entries.into_iter().map(|e| (e.ino, kind_of(e.kind), e.name)));
            if !more {
                return Ok(out);
            }
        }
    }
}

impl Filesystem for VnodeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        // Reading mmaps of direct-I/O files (Linux 6.6 and later; older kernels refuse mmap).
        let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        // The top directory's ACL is the vNode's door: a kernel that would not enforce it gets
        // no mount rather than one anyone may enter.
        config
            .add_capabilities(InitFlags::FUSE_POSIX_ACL)
            .map_err(|_| std::io::Error::other("this kernel's FUSE has no POSIX ACLs, which guard a vNode's files"))?;
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self
            .path(parent.0)
            .and_then(|p| join(&p, name))
            .and_then(|p| self.lookup_path(p))
        {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let mut st = self.st.lock().unwrap();
        let left = st.lookups.get(&ino.0).map(|n| n.saturating_sub(nlookup)).unwrap_or(0);
        if left == 0 && ino.0 != ROOT {
            st.lookups.remove(&ino.0);
            st.paths.remove(&ino.0);
        } else {
            st.lookups.insert(ino.0, left);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self
            .s_call(X2S_GETATTR {
                vnode: self.vnode.clone(),
                ino: ino.0,
            })
            .and_then(|m| self.complete(m.attr))
        {
            Ok(a) => reply.attr(&TTL, &self.attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let t = |x: Option<TimeOrNow>| {
            x.map(|v| match v {
                TimeOrNow::SpecificTime(t) => to_ns(t),
                TimeOrNow::Now => to_ns(SystemTime::now()),
            })
        };
        if ino.0 == ROOT && (mode.is_some() || uid.is_some() || gid.is_some()) {
            // The top directory's owner and mode are the vNode's grants, not a program's to change.
            return reply.error(Errno::EPERM);
        }
        let set = SetAttr {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            atime_ns: t(atime),
            mtime_ns: t(mtime),
        };
        match self.do_setattr(ino.0, size, set) {
            Ok(a) => reply.attr(&TTL, &self.attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.s_call(P2S_READLINK {
            vnode: self.vnode.clone(),
            ino: ino.0,
        }) {
            Ok(r) => reply.data(r.target.as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        match self.create_node(req, parent, name, FileKind::File, mode & !umask, true, None) {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        match self.create_node(req, parent, name, FileKind::Dir, mode & !umask, true, None) {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let Some(t) = target.to_str() else {
            return reply.error(Errno::EINVAL);
        };
        match self.create_node(
            req,
            parent,
            link_name,
            FileKind::Symlink,
            0o777,
            true,
            Some(t.to_string()),
        ) {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.path(parent.0).and_then(|p| join(&p, name)).and_then(|path| {
            self.s_call(P2S_UNLINK {
                vnode: self.vnode.clone(),
                path,
                dir: false,
            })
        });
        match r {
            Ok(r) => {
                self.detached(r.ino);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let path = match self.path(parent.0).and_then(|p| join(&p, name)) {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        match self.s_call(P2S_UNLINK {
            vnode: self.vnode.clone(),
            path: path.clone(),
            dir: true,
        }) {
            Ok(_) => {
                self.st.lock().unwrap().paths.retain(|_, p| *p != path);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let paths = self
            .path(parent.0)
            .and_then(|p| join(&p, name))
            .and_then(|from| Ok((from, join(&self.path(newparent.0)?, newname)?)));
        let (from, to) = match paths {
            Ok(p) => p,
            Err(e) => return reply.error(e),
        };
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        match self.s_call(P2S_RENAME {
            vnode: self.vnode.clone(),
            from: from.clone(),
            to: to.clone(),
            noreplace,
        }) {
            Ok(splitos_rpc::S2P_DETACHED { ino }) => {
                {
                    let mut st = self.st.lock().unwrap();
                    // A directory `to` replaced is gone with its name.
                    st.paths.retain(|_, p| *p != to);
                    let below = format!("{from}/");
                    for p in st.paths.values_mut() {
                        if *p == from {
                            *p = to.clone();
                        } else if let Some(rest) = p.strip_prefix(&below) {
                            *p = format!("{to}/{rest}");
                        }
                    }
                }
                self.detached(ino);
                reply.ok()
            }
            Err(e) => reply.error(e),
        }
    }

    fn link(&self, _req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let r = self.path(newparent.0).and_then(|p| join(&p, newname)).and_then(|to| {
            let a = self.complete(
                self.s_call(P2S_LINK {
                    vnode: self.vnode.clone(),
                    ino: ino.0,
                    to: to.clone(),
                })?
                .attr,
            )?;
            self.learn(to, &a);
            Ok(a)
        });
        match r {
            Ok(a) => reply.entry(&TTL, &self.attr(&a), Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.opened(FileHandle(self.open_fh(ino.0)), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let ino = ino.0;
        match self.m_call(ino, |scomp| P2M_FILE_READ {
            scomp,
            vnode: self.vnode.clone(),
            ino,
            offset,
            len: size,
        }) {
            Ok(r) => reply.data(&r.data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let ino = ino.0;
        match self.m_call(ino, |scomp| P2M_FILE_WRITE {
            scomp,
            vnode: self.vnode.clone(),
            ino,
            offset,
            data: ByteBuf::from(data.to_vec()),
        }) {
            Ok(_) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock: fuser::LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let free = {
            let mut st = self.st.lock().unwrap();
            let n = st.open.entry(ino.0).or_insert(1);
            *n -= 1;
            if *n == 0 {
                st.open.remove(&ino.0);
                st.detached.remove(&ino.0)
            } else {
                false
            }
        };
        if free {
            self.free(ino.0);
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let ino = ino.0;
        match self.m_call(ino, |scomp| P2M_FILE_SYNC {
            scomp,
            vnode: self.vnode.clone(),
            ino,
        }) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.list(ino.0) {
            Ok(entries) => {
                let mut st = self.st.lock().unwrap();
                st.next_fh += 1;
                let fh = st.next_fh;
                st.listings.insert(fh, entries);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let st = self.st.lock().unwrap();
        let Some(entries) = st.listings.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        self.st.lock().unwrap().listings.remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.s_call(X2S_SYNC {
            vnode: self.vnode.clone(),
            ino: None,
        }) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.s_call(P2S_STATFS {
            vnode: self.vnode.clone(),
        }) {
            Ok(r) => {
                let block = PAGE_SIZE as u64;
                let free = r.quota.saturating_sub(r.used) / block;
                reply.statfs(
                    r.quota / block,
                    free,
                    free,
                    r.files,
                    u32::MAX as u64,
                    block as u32,
                    NAME_MAX as u32,
                    block as u32,
                )
            }
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    /// The one extended attribute there is: the top directory's ACL, made from the grants.
    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match &self.grant {
            Some(g) if ino.0 == ROOT && name == ACL_ACCESS => xattr_reply(reply, &g.acl(), size),
            _ => reply.error(Errno::ENODATA),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let names = if ino.0 == ROOT && self.grant.is_some() {
            format!("{ACL_ACCESS}\0").into_bytes()
        } else {
            Vec::new()
        };
        xattr_reply(reply, &names, size)
    }

    /// The sComponent keeps no extended attributes (as before POSIX ACLs were on: the kernel
    /// answers programs EOPNOTSUPP either way).
    fn setxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn removexattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EOPNOTSUPP);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        // Always exclusive at the sComponent: the kernel checks no permission on a file a
        // create opens, so a file that exists (made meanwhile through another pComponent) is
        // opened only after the checks an open would have made.
        let mut made = Err(Errno::EIO);
        // A name that exists when created and is gone when opened (unlinked meanwhile) is
        // created again: O_CREAT never fails with ENOENT.
        for _ in 0..3 {
            made = match self.create_node(req, parent, name, FileKind::File, mode & !umask, true, None) {
                Err(e) if e == Errno::EEXIST && flags & libc::O_EXCL == 0 => {
                    self.open_existing(req, parent, name, flags)
                }
                r => r,
            };
            if !matches!(made, Err(e) if e == Errno::ENOENT) {
                break;
            }
        }
        match made {
            Ok(a) => {
                let fh = self.open_fh(a.ino);
                reply.created(
                    &TTL,
                    &self.attr(&a),
                    Generation(0),
                    FileHandle(fh),
                    FopenFlags::FOPEN_DIRECT_IO,
                )
            }
            Err(e) => reply.error(e),
        }
    }
}

/// The vNode mounts of one pComponent.
pub struct Mounts {
    root: PathBuf,
    node: Arc<Node>,
    grants: Arc<Grants>,
    live: Mutex<HashMap<String, (PathBuf, fuser::BackgroundSession)>>,
}

/// Makes `dir` a mount point only this pComponent could have made: a directory of its own in
/// the vNode root it checked at start (which no one else can write). Anything else in its place
/// is refused, never mounted over or through.
fn mount_point(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create mount point {}: {e}", dir.display())),
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("mount point {}: {e}", dir.display()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me {
        return Err(format!(
            "mount point {} is not a directory of this pComponent's user (uid {me}): refusing to mount there",
            dir.display()
        ));
    }
    Ok(())
}

impl Mounts {
    pub fn new(root: PathBuf, node: Arc<Node>, grants: Arc<Grants>) -> Mounts {
        Mounts {
            root,
            node,
            grants,
            live: Mutex::new(HashMap::new()),
        }
    }

    /// Mounts the vNode's file system (once) and returns its mount point.
    pub fn mount(&self, vnode: &str) -> Result<PathBuf, Refusal> {
        let mut live = self.live.lock().unwrap();
        if let Some((dir, _)) = live.get(vnode) {
            return Ok(dir.clone());
        }
        check_vnode_name(vnode).map_err(|e| ERR::new(ErrCode::Invalid, e))?;
        let fs = VnodeFs::new(vnode.to_string(), self.node.clone(), self.grants.of(vnode));
        fs.storage().map_err(|_| {
            ERR::new(
                ErrCode::Unreachable,
                format!("no sComponent is alive to store vNode {vnode:?}"),
            )
        })?;
        let dir = self.root.join(vnode);
        unmount(&dir);
        mount_point(&dir).map_err(|e| ERR::new(ErrCode::Internal, e))?;
        let mut cfg = fuser::Config::default();
        // Users share the mount: a set-user-ID file or a device node there must grant nothing.
        cfg.mount_options = vec![
            MountOption::FSName(format!("splitos:{vnode}")),
            MountOption::Subtype("splitos".into()),
            MountOption::DefaultPermissions,
            MountOption::NoSuid,
            MountOption::NoDev,
        ];
        // Every user reaches the mount; its top directory lets in only the vNode's (see above).
        cfg.acl = fuser::SessionACL::All;
        cfg.n_threads = Some(2);
        let session = fuser::spawn_mount(fs, &dir, &cfg).map_err(|e| {
            ERR::new(
                ErrCode::Internal,
                format!("cannot mount vNode {vnode:?} at {}: {e}", dir.display()),
            )
        })?;
        tracing::info!(vnode, dir = %dir.display(), "mounted the vNode's file system");
        metrics::counter!("pcomp_vnode_mounts_total").increment(1);
        live.insert(vnode.to_string(), (dir.clone(), session));
        Ok(dir)
    }

    /// Lets go of a vNode's mount, whose top directory carries a grant that changed: the next
    /// program of the vNode mounts it anew. Detached, not torn down: a program still in it
    /// keeps what it has open.
    pub fn forget(&self, vnode: &str) {
        if let Some((dir, _session)) = self.live.lock().unwrap().remove(vnode) {
            unmount(&dir);
            tracing::info!(vnode, "the vNode's grant changed: its mount is let go");
        }
    }

    /// Unmounts every vNode (the pComponent is stopping).
    pub fn unmount_all(&self) {
        for (_, (dir, _session)) in self.live.lock().unwrap().drain() {
            unmount(&dir);
        }
    }
}
