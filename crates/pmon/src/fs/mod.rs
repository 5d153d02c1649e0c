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
//!
//! The file operations are in ops.rs, the mounts in mounts.rs.
pub(super) mod grants;
mod mounts;
mod ops;

pub use mounts::{MountError, Mounts};

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
use splitos_rpc::{ErrCode, FileAttr, FileKind, Refuse, RpcError, SetAttr, NAME_MAX, PAGE_SIZE};
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
    /// The mComponent holding writes to each file not yet synced: its buffer cache has no
    /// copy elsewhere, so if the file's cache is placed again on another (that one lost),
    /// they are gone, and the file is in `lost_writes`.
    unsynced: HashMap<u64, String>,
    /// Files whose written data was lost with a buffer cache: reads fail with EIO, and so
    /// does the next fsync (as Linux reports a failed write back), which clears it, instead
    /// of succeeding on what is left.
    lost_writes: HashSet<u64>,
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

/// What a request to a file's buffer cache does to the file's unsynced writes there.
trait FileRequest {
    /// `Some(true)`: it adds some; `Some(false)`: it makes them durable; `None`: neither.
    const DIRTIES: Option<bool>;
}

macro_rules! file_requests {
    ($($req:ident => $dirties:expr),* $(,)?) => {
        $( impl FileRequest for splitos_rpc::$req { const DIRTIES: Option<bool> = $dirties; } )*
    };
}

file_requests! {
    P2M_FILE_WRITE => Some(true),
    P2M_FILE_SETSIZE => Some(true),
    P2M_FILE_SYNC => Some(false),
    P2M_FILE_READ => None,
    P2M_FILE_STAT => None,
    P2M_FILE_FORGET => None,
}

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
                unsynced: HashMap::new(),
                lost_writes: HashSet::new(),
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
        // Waits only for managers that do not answer: "no sComponent is alive" is how a
        // cluster without one answers, for good.
        let unanswered = |e: &RpcError| !matches!(e, RpcError::Remote { .. }) && e.code() == ErrCode::Unreachable;
        match self.call_gm_waiting(unanswered, || P2G_VNODE_STORAGE {
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
        // "No mComponent is alive" too: managers started again know none until they beat.
        let unreachable = |e: &RpcError| e.code() == ErrCode::Unreachable;
        match self.call_gm_waiting(unreachable, || P2G_FILE_CACHE {
            vnode: self.vnode.clone(),
            ino,
        }) {
            Ok(r) => {
                self.st.lock().unwrap().caches.insert(ino, r.mcomp.addr.clone());
                Ok(r.mcomp.addr)
            }
            Err(e) => {
                tracing::warn!(vnode = %self.vnode, ino, error = %e, "no buffer cache for a file: EIO");
                Err(Errno::EIO)
            }
        }
    }

    /// A question for the managers that a file call waits on: while it fails `unreachable`
    /// (the only manager restarting) it is asked again, as heap calls and starts do, rather
    /// than failing the call with EIO at once.
    fn call_gm_waiting<Q: RpcRequest>(
        &self,
        unreachable: impl Fn(&RpcError) -> bool,
        req: impl Fn() -> Q,
    ) -> Result<Q::Reply, RpcError> {
        splitos_core::node::waiting_for_managers(
            || self.node.call_gm(req()),
            unreachable,
            || crate::series::FILE_CALLS_WAITED_FOR_MANAGERS.increment(1),
        )
    }

    /// A request to the mComponent holding the file's buffer cache; if it is gone, GMM
    /// places the cache again (on a live one) and the request is retried once.
    /// A cache that moved (its mComponent is leaving, `ErrCode::Moved`) is asked for again
    /// until GMM places it elsewhere, which it does once the old one wrote the file back.
    fn m_call<Q: RpcRequest + FileRequest>(&self, ino: u64, req: impl Fn(String) -> Q) -> R<Q::Reply> {
        let mut unreached = 0;
        for _ in 0..MOVED_TRIES {
            let (m, s) = (self.cache_of(ino)?, self.storage()?);
            {
                let mut st = self.st.lock().unwrap();
                if st.unsynced.get(&ino).is_some_and(|u| *u != m) {
                    st.unsynced.remove(&ino);
                    st.lost_writes.insert(ino);
                    tracing::warn!(vnode = %self.vnode, ino, "a file's buffer cache was lost with writes not yet synced: its next fsync fails with EIO");
                }
            }
            match self.node.rpc.call(&m, req(s)) {
                Ok(r) => {
                    let mut st = self.st.lock().unwrap();
                    match Q::DIRTIES {
                        Some(true) => drop(st.unsynced.insert(ino, m)),
                        Some(false) if st.unsynced.get(&ino) == Some(&m) => drop(st.unsynced.remove(&ino)),
                        _ => {}
                    }
                    return Ok(r);
                }
                Err(RpcError::Remote {
                    code: ErrCode::Moved, ..
                }) => {
                    // GMM places the cache elsewhere only once the old one wrote the file back.
                    let mut st = self.st.lock().unwrap();
                    st.caches.remove(&ino);
                    st.unsynced.remove(&ino);
                    drop(st);
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
