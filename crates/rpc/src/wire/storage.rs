//! Messages of the vNode file system (pComponents with sComponents and with the mComponent
//! holding a file's buffer cache, buffer caches with sComponents) and of the backup logs
//! (loggers with sComponents), with the data they carry.
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;

/// The backup file of one vRegion of a process on an sComponent ([`Replication::Log`](super::Replication::Log)).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LogFile {
    pub vnode: String,
    pub pid: u64,
    pub index: u64,
}

/// One entry of a backup log, replayed in order: the last `Page` of a page not discarded
/// since is its content.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogRecord {
    /// A write-back: the page's sealed bytes.
    Page { vpn: u64, data: ByteBuf },
    /// Pages [start, end) freed (munmap, MADV_DONTNEED, a mapping replaced): zeros again.
    Discard { start: u64, end: u64 },
}

/// Applies backup-log records, in order, to the pages they leave.
pub fn replay_log(records: impl IntoIterator<Item = LogRecord>, pages: &mut std::collections::BTreeMap<u64, ByteBuf>) {
    for r in records {
        match r {
            LogRecord::Page { vpn, data } => {
                pages.insert(vpn, data);
            }
            // A range the wrong way round frees nothing (and must not panic the replayer).
            LogRecord::Discard { start, end } if start < end => {
                let gone: Vec<u64> = pages.range(start..end).map(|(v, _)| *v).collect();
                for v in gone {
                    pages.remove(&v);
                }
            }
            LogRecord::Discard { .. } => {}
        }
    }
}

/// What a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
}

/// A file's attributes as the sComponent keeps them. Times are nanoseconds since the epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileAttr {
    pub ino: u64,
    pub kind: FileKind,
    /// Permission bits (07777).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// Names of the inode (hard links); directories report 2.
    pub nlink: u32,
    /// Bytes reserved on the sComponent's disk for this file (counted against its quota).
    pub alloc: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: String,
    pub ino: u64,
    pub kind: FileKind,
}

/// Attribute changes of `P2S_SETATTR`; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub atime_ns: Option<i64>,
    pub mtime_ns: Option<i64>,
}

message_types! {
    // ---- pComponent -> sComponent: the namespace of a vNode. Every request names the vNode and a
    // full path (or, for an inode that may have no name left, its number), like NFS v2.
    P2S_LOOKUP { pub vnode: String, pub path: String };
    S2P_ATTR { pub attr: FileAttr };
    X2S_GETATTR { pub vnode: String, pub ino: u64 };
    /// Creates a file, directory or symlink (`target`); `excl` fails with EEXIST if the name
    /// exists, otherwise an existing regular file is returned as it is.
    P2S_CREATE { pub vnode: String, pub path: String, pub kind: FileKind, pub perm: u32, pub uid: u32, pub gid: u32, pub excl: bool, pub target: Option<String> };
    P2S_SETATTR { pub vnode: String, pub ino: u64, pub set: SetAttr };
    /// A further name for a file (a hard link).
    P2S_LINK { pub vnode: String, pub ino: u64, pub to: String };
    P2S_READLINK { pub vnode: String, pub ino: u64 };
    S2P_TARGET { pub target: String };
    /// Removes a name. An inode that loses its last name is detached (kept, with its data)
    /// until `P2S_DROP`: a program may still have it open.
    P2S_UNLINK { pub vnode: String, pub path: String, pub dir: bool };
    S2P_DETACHED { pub ino: Option<u64> };
    /// Renames; an existing target is replaced (and detached, as by `P2S_UNLINK`) unless
    /// `noreplace`.
    P2S_RENAME { pub vnode: String, pub from: String, pub to: String, pub noreplace: bool };
    P2S_READDIR { pub vnode: String, pub path: String, pub after: Option<String> };
    S2P_ENTRIES { pub entries: Vec<DirEntry>, pub more: bool };
    P2S_DROP { pub vnode: String, pub ino: u64 };
    P2S_STATFS { pub vnode: String };
    S2P_STATFS { pub quota: u64, pub used: u64, pub files: u64 };
    /// Makes the data of `ino` (if given) and every namespace change so far durable.
    X2S_SYNC { pub vnode: String, pub ino: Option<u64> };

    // ---- mComponent (buffer cache) -> sComponent: file data by inode and absolute offset
    M2S_READ { pub vnode: String, pub ino: u64, pub offset: u64, pub len: u32 };
    S2M_DATA { pub data: ByteBuf };
    /// Writes back dirty data; `size` is the file's size as the buffer cache knows it.
    M2S_WRITE { pub vnode: String, pub ino: u64, pub offset: u64, pub data: ByteBuf, pub size: u64, pub mtime_ns: i64 };
    /// Reserves disk space up to `bytes` for the file: ENOSPC if the quota or disk is full.
    M2S_RESERVE { pub vnode: String, pub ino: u64, pub bytes: u64 };
    M2S_SETSIZE { pub vnode: String, pub ino: u64, pub size: u64 };

    // ---- logger mComponent -> sComponent: backup files of logged vRegions, append-only
    /// `reset`: the file starts anew with these records, at `epoch` (of the set the logger
    /// logs for); appends of an older epoch than the file's are refused `Stale`.
    M2S_LOG_APPEND { pub file: LogFile, pub epoch: u64, pub reset: bool, pub records: Vec<LogRecord> };
    /// Up to `max` records of the file from byte `offset` on.
    M2S_LOG_READ { pub file: LogFile, pub offset: u64, pub max: u32 };
    S2M_LOG { pub records: Vec<LogRecord>, pub next: u64, pub more: bool };
    /// The file `to` becomes a copy of `from` (a forked child's vRegion), at `epoch` (refused
    /// `Stale` when older than `to`'s).
    M2S_LOG_COPY { pub from: LogFile, pub to: LogFile, pub epoch: u64 };
    /// Removes every backup file of a process that exited.
    M2S_LOG_DROP { pub vnode: String, pub pid: u64 };

    // ---- pComponent -> the mComponent holding a file's buffer cache. `scomp` is where the
    // file is stored, so the mComponent needs no other state to reach it.
    P2M_FILE_READ { pub scomp: String, pub vnode: String, pub ino: u64, pub offset: u64, pub len: u32 };
    M2P_FILE_DATA { pub data: ByteBuf };
    P2M_FILE_WRITE { pub scomp: String, pub vnode: String, pub ino: u64, pub offset: u64, pub data: ByteBuf };
    M2P_FILE_SIZE { pub size: Option<u64>, pub mtime_ns: i64 };
    P2M_FILE_SETSIZE { pub scomp: String, pub vnode: String, pub ino: u64, pub size: u64 };
    /// Writes the file's dirty blocks back and makes them durable (fsync).
    P2M_FILE_SYNC { pub scomp: String, pub vnode: String, pub ino: u64 };
    /// The file's size while its buffer cache holds it (`None`: ask the sComponent).
    P2M_FILE_STAT { pub vnode: String, pub ino: u64 };
    /// Drops a deleted file's blocks without writing them back.
    P2M_FILE_FORGET { pub vnode: String, pub ino: u64 };
}
