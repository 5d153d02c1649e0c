//! The storage monitor (sComponent). Stateless as in LegoOS (and NFS v2): every request
//! carries the vNode and a full path, or an inode number and an absolute offset, so any
//! request can be served alone, in any order, after a restart. Changes are made durable by
//! fsync, every `CHECKPOINT_EVERY`, and at an orderly stop, like a journaling file system's
//! commit interval. pComponents send it namespace
//! operations; mComponents (the buffer cache) read and write file data, and loggers their
//! backup files ([`backup`]). It never calls another component of its cluster.
//!
//! One process at a time opens a storage directory (its database is locked). Other sComponents
//! started on the same directory, e.g. by two embedded runs at once, pass their requests to
//! that one ([`share`]) and take the directory over when it stops.
mod backup;
mod ns;
pub mod series;
mod share;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use serde_bytes::ByteBuf;
use splitos_rpc::*;

pub use ns::Store;

use splitos_core::config::StorageArgs;
use splitos_core::node::{self, Node};

const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What the process that has a storage directory open keeps of it, and its counters.
pub struct Core {
    store: Store,
    backups: backup::BackupFiles,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    syncs: AtomicU64,
    backup_appended: AtomicU64,
}

impl Core {
    /// Opens the storage directory; an [`ns::InUse`] error if another process has it open.
    fn open(dir: &std::path::Path, quota: u64) -> anyhow::Result<Core> {
        let store = Store::open(dir, quota)?;
        let backups = backup::BackupFiles::open(dir)?;
        Ok(Core {
            store,
            backups,
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            backup_appended: AtomicU64::new(0),
        })
    }

    /// The directory's figures and this process's counters of the work it did on it.
    fn stats(&self) -> serde_json::Value {
        serde_json::json!({
            "quota": self.store.quota(), "used": self.store.used(), "namespace_reopens": self.store.reopens(), "namespace_reserve_released": self.store.reserves_released(),
            "bytes_read": self.bytes_read.load(Relaxed), "bytes_written": self.bytes_written.load(Relaxed), "syncs": self.syncs.load(Relaxed),
            "backup_files": {"bytes": self.backups.bytes(), "appended_bytes": self.backup_appended.load(Relaxed)},
        })
    }

    fn checkpoint(&self) {
        if let Err(e) = self.store.checkpoint() {
            tracing::error!(errno = e, "commit failed");
        }
    }

    fn sync(&self, r: X2S_SYNC) -> Result<OK, Refusal> {
        self.syncs.fetch_add(1, Relaxed);
        crate::series::SYNCS.increment(1);
        fs(self.store.sync(&r.vnode, r.ino))?;
        Ok(OK)
    }

    fn read(&self, r: M2S_READ) -> Result<S2M_DATA, Refusal> {
        let data = fs(self.store.read_data(&r.vnode, r.ino, r.offset, r.len.min(MAX_BODY / 2)))?;
        self.bytes_read.fetch_add(data.len() as u64, Relaxed);
        crate::series::READ_BYTES.increment(data.len() as u64);
        Ok(S2M_DATA {
            data: ByteBuf::from(data),
        })
    }

    fn write(&self, r: M2S_WRITE) -> Result<OK, Refusal> {
        fs(self
            .store
            .write_data(&r.vnode, r.ino, r.offset, &r.data, r.size, r.mtime_ns))?;
        self.bytes_written.fetch_add(r.data.len() as u64, Relaxed);
        crate::series::WRITTEN_BYTES.increment(r.data.len() as u64);
        Ok(OK)
    }

    fn log_append(&self, r: M2S_LOG_APPEND) -> Result<OK, Refusal> {
        let n = self
            .backups
            .append(&r.file, r.epoch, r.reset, &r.records)
            .map_err(|e| refused(e, &r.file, r.epoch))?;
        self.backup_appended.fetch_add(n, Relaxed);
        crate::series::BACKUP_APPENDED_BYTES.increment(n);
        Ok(OK)
    }

    /// Serves one request on the files: the sComponent's own, or one another passed on.
    fn handle(&self, msg: Msg) -> Msg {
        let s = &self.store;
        match msg {
            Msg::P2S_LOOKUP(r) => on(r, |r| {
                Ok(S2P_ATTR {
                    attr: fs(s.lookup(&r.vnode, &r.path))?,
                })
            }),
            Msg::X2S_GETATTR(r) => on(r, |r| {
                Ok(S2P_ATTR {
                    attr: fs(s.getattr(&r.vnode, r.ino))?,
                })
            }),
            Msg::P2S_CREATE(r) => on(r, |r| {
                Ok(S2P_ATTR {
                    attr: fs(s.create(&r.vnode, &r.path, r.kind, r.perm, r.uid, r.gid, r.excl, r.target))?,
                })
            }),
            Msg::P2S_SETATTR(r) => on(r, |r| {
                Ok(S2P_ATTR {
                    attr: fs(s.setattr(&r.vnode, r.ino, &r.set))?,
                })
            }),
            Msg::P2S_LINK(r) => on(r, |r| {
                Ok(S2P_ATTR {
                    attr: fs(s.link(&r.vnode, r.ino, &r.to))?,
                })
            }),
            Msg::P2S_READLINK(r) => on(r, |r| {
                Ok(S2P_TARGET {
                    target: fs(s.readlink(&r.vnode, r.ino))?,
                })
            }),
            Msg::P2S_UNLINK(r) => on(r, |r| {
                Ok(S2P_DETACHED {
                    ino: fs(s.unlink(&r.vnode, &r.path, r.dir))?,
                })
            }),
            Msg::P2S_RENAME(r) => on(r, |r| {
                Ok(S2P_DETACHED {
                    ino: fs(s.rename(&r.vnode, &r.from, &r.to, r.noreplace))?,
                })
            }),
            Msg::P2S_READDIR(r) => on(r, |r| {
                let (entries, more) = fs(s.readdir(&r.vnode, &r.path, r.after.as_deref()))?;
                Ok(S2P_ENTRIES { entries, more })
            }),
            Msg::P2S_DROP(r) => on(r, |r| fs(s.drop_inode(&r.vnode, r.ino)).map(|_| OK)),
            Msg::P2S_STATFS(r) => on(r, |r| {
                Ok(S2P_STATFS {
                    quota: s.quota(),
                    used: s.used(),
                    files: fs(s.files(&r.vnode))?,
                })
            }),
            Msg::X2S_SYNC(r) => on(r, |r| self.sync(r)),
            Msg::M2S_READ(r) => on(r, |r| self.read(r)),
            Msg::M2S_WRITE(r) => on(r, |r| self.write(r)),
            Msg::M2S_RESERVE(r) => on(r, |r| fs(s.reserve(&r.vnode, r.ino, r.bytes)).map(|_| OK)),
            Msg::M2S_SETSIZE(r) => on(r, |r| fs(s.set_size(&r.vnode, r.ino, r.size)).map(|_| OK)),
            Msg::M2S_LOG_APPEND(r) => on(r, |r| self.log_append(r)),
            Msg::M2S_LOG_READ(r) => on(r, |r| {
                let (records, next, more) = fs(self.backups.read(&r.file, r.offset, r.max))?;
                Ok(S2M_LOG { records, next, more })
            }),
            Msg::M2S_LOG_COPY(r) => on(r, |r| {
                self.backups
                    .copy(&r.from, &r.to, r.epoch)
                    .map(|_| OK)
                    .map_err(|e| refused(e, &r.to, r.epoch))
            }),
            Msg::M2S_LOG_DROP(r) => on(r, |r| fs(self.backups.drop_process(&r.vnode, r.pid)).map(|_| OK)),
            other => Msg::ERR(
                Unhandled {
                    by: "an sComponent does",
                    msg: other.name(),
                }
                .into(),
            ),
        }
    }
}

pub struct Storage {
    node: Arc<Node>,
    share: Arc<share::Share>,
    started: Instant,
}

impl Storage {
    fn stats_json(&self) -> String {
        let mut s = self.share.stats();
        let me = serde_json::json!({"role": "scomponent", "id": self.node.id(), "addr": self.node.addr, "uptime_ms": self.started.elapsed().as_millis() as u64});
        if let (Some(s), serde_json::Value::Object(me)) = (s.as_object_mut(), me) {
            s.extend(me);
        }
        s.to_string()
    }

    fn shutdown(&self) -> Result<OK, Refusal> {
        self.share.checkpoint();
        splitos_core::node::exit_soon();
        Ok(OK)
    }
}

/// A change of a backup file refused, as its logger sees it.
#[derive(Debug, thiserror::Error)]
enum BackupError {
    #[error("the sComponent's disk is full ({}): the backup file of vRegion {idx} of process {pid} cannot grow", std::io::Error::from_raw_os_error(*errno))]
    DiskFull { errno: i32, idx: u64, pid: u64 },
    #[error("the backup file of vRegion {idx} of process {pid} was reset at epoch {at}, after this change's {epoch}")]
    Reset { idx: u64, pid: u64, at: u64, epoch: u64 },
}

impl Refuse for BackupError {
    fn code(&self) -> ErrCode {
        match self {
            BackupError::DiskFull { errno, .. } => ErrCode::Errno(*errno),
            BackupError::Reset { .. } => ErrCode::Stale,
        }
    }
}

/// A refused change of a backup file, as its logger sees it.
fn refused(e: backup::Refused, file: &LogFile, epoch: u64) -> Refusal {
    match e {
        backup::Refused::Errno(e @ (libc::ENOSPC | libc::EDQUOT)) => {
            crate::series::BACKUP_DISK_FULL.increment(1);
            tracing::error!(
                pid = file.pid,
                vregion = file.index,
                "the storage directory's disk is full: a backup file cannot grow"
            );
            BackupError::DiskFull {
                errno: e,
                idx: file.index,
                pid: file.pid,
            }
            .into()
        }
        backup::Refused::Errno(e) => Refusal::errno(e),
        backup::Refused::Stale(at) => BackupError::Reset {
            idx: file.index,
            pid: file.pid,
            at,
            epoch,
        }
        .into(),
    }
}

/// A namespace or data error becomes the errno the program sees.
fn fs<T>(r: ns::FsResult<T>) -> Result<T, Refusal> {
    r.map_err(Refusal::errno)
}

/// The sComponent's dispatch table: requests on files go to the process that has the storage
/// directory open, this one or the one it shares it with.
impl Handler for Storage {
    fn handle(&self, msg: Msg) -> Msg {
        let name = msg.name();
        crate::series::REQUESTS.with([name]).increment(1);
        let reply = match msg {
            Msg::C2X_PING(r) => on(r, |_| {
                Ok(X2C_PONG {
                    role: Role::Storage,
                    id: self.node.id(),
                })
            }),
            Msg::C2X_STATS(r) => on(r, |_| {
                Ok(X2C_STATS {
                    json: self.stats_json(),
                })
            }),
            Msg::G2X_STATS(r) => on(r, |_| {
                Ok(X2G_STATS {
                    json: self.stats_json(),
                })
            }),
            Msg::C2X_METRICS(r) => on(r, |_| {
                Ok(X2C_METRICS {
                    text: splitos_core::telemetry::render(),
                })
            }),
            Msg::G2X_METRICS(r) => on(r, |_| {
                Ok(X2G_METRICS {
                    text: splitos_core::telemetry::render(),
                })
            }),
            Msg::C2X_SHUTDOWN(r) => on(r, |_| self.shutdown()),
            other => self.share.handle(other),
        };
        if let Msg::ERR(e) = &reply {
            tracing::debug!(request = name, code = ?e.code, msg = %e.msg, "request refused");
        }
        reply
    }
}

pub fn run(args: StorageArgs) -> anyhow::Result<()> {
    let stop = node::block_stop_signals();
    let cfg = &args.scomp;
    cfg.validate().map_err(|e| anyhow::anyhow!(e))?;
    let dir = cfg
        .dir
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("an sComponent needs its storage directory (dir)"))?;
    let share = share::Share::open(dir, cfg.quota.0)?;
    let (node, endpoint) = Node::bind(Role::Storage, &args.node.gm, &cfg.listen, &args.node.process)?;
    let st = Arc::new(Storage {
        node: node.clone(),
        share: share.clone(),
        started: Instant::now(),
    });
    let s = st.clone();
    splitos_core::telemetry::on_render(move |e| e.one(&crate::series::USED_BYTES, s.share.load().used as f64));
    let s3 = share.clone();
    stop.on_stop(move || s3.checkpoint());
    std::thread::Builder::new()
        .name("checkpoint".into())
        .spawn(move || loop {
            std::thread::sleep(CHECKPOINT_EVERY);
            share.checkpoint();
        })
        .expect("spawn checkpoint thread");
    endpoint.serve(
        st.clone(),
        ServerConfig {
            name: "scomp".into(),
            workers: 0,
            fanout_workers: 1,
            serving: Default::default(),
        },
    );
    node.register(None, st.share.load())
        .map_err(|e| anyhow::anyhow!("cannot register with the global managers at {}: {e}", args.node.gm))?;
    let s2 = st.clone();
    node.clone().heartbeat_forever(None, move || s2.share.load(), |_| {});
    tracing::info!(addr = %node.addr, transport = node.rpc.transport().name(), id = node.id(), role = "scomponent", metrics = ?node.metrics, dir = %dir.display(), quota = cfg.quota.0, used = st.share.load().used, owner = st.share.is_owner(), "splitos storage monitor started");
    node::announce_ready(args.node.process.ready_file.as_deref(), &node.addr);
    splitos_core::node::park_forever()
}
