//! The storage monitor (sComponent). Stateless as in LegoOS (and NFS v2): every request
//! carries the vNode and a full path, or an inode number and an absolute offset, so any
//! request can be served alone, in any order, after a restart. Changes are made durable by
//! fsync, every `CHECKPOINT_EVERY`, and at an orderly stop, like a journaling file system's
//! commit interval. pComponents send it namespace
//! operations; mComponents (the buffer cache) read and write file data. It never calls
//! another component.
mod ns;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use serde_bytes::ByteBuf;
use splitos_rpc::{serve, ErrCode, Handler, Load, Msg, Role, ServerConfig};

pub use ns::{Store, NAME_MAX};

use crate::node::{self, Node};

const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

pub struct Storage {
    node: Arc<Node>,
    store: Store,
    started: Instant,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    syncs: AtomicU64,
}

fn errno(e: i32) -> Msg {
    Msg::ERR { code: ErrCode::Errno(e), msg: std::io::Error::from_raw_os_error(e).to_string() }
}

impl Storage {
    fn load(&self) -> Load {
        Load { threads: 0, processes: 0, capacity: self.store.quota(), committed: self.store.used(), used: self.store.used() }
    }

    fn stats_json(&self) -> String {
        serde_json::json!({
            "role": "scomponent", "id": self.node.id(), "addr": self.node.addr, "uptime_ms": self.started.elapsed().as_millis() as u64,
            "quota": self.store.quota(), "used": self.store.used(),
            "bytes_read": self.bytes_read.load(Relaxed), "bytes_written": self.bytes_written.load(Relaxed), "syncs": self.syncs.load(Relaxed),
        })
        .to_string()
    }

    fn fs(&self, msg: Msg) -> Result<Msg, i32> {
        let s = &self.store;
        Ok(match msg {
            Msg::P2S_LOOKUP { vnode, path } => Msg::S2P_ATTR { attr: s.lookup(&vnode, &path)? },
            Msg::X2S_GETATTR { vnode, ino } => Msg::S2P_ATTR { attr: s.getattr(&vnode, ino)? },
            Msg::P2S_CREATE { vnode, path, kind, perm, uid, gid, excl, target } => Msg::S2P_ATTR { attr: s.create(&vnode, &path, kind, perm, uid, gid, excl, target)? },
            Msg::P2S_SETATTR { vnode, ino, set } => Msg::S2P_ATTR { attr: s.setattr(&vnode, ino, &set)? },
            Msg::P2S_LINK { vnode, ino, to } => Msg::S2P_ATTR { attr: s.link(&vnode, ino, &to)? },
            Msg::P2S_READLINK { vnode, ino } => Msg::S2P_TARGET { target: s.readlink(&vnode, ino)? },
            Msg::P2S_UNLINK { vnode, path, dir } => Msg::S2P_DETACHED { ino: s.unlink(&vnode, &path, dir)? },
            Msg::P2S_RENAME { vnode, from, to, noreplace } => Msg::S2P_DETACHED { ino: s.rename(&vnode, &from, &to, noreplace)? },
            Msg::P2S_READDIR { vnode, path, after } => {
                let (entries, more) = s.readdir(&vnode, &path, after.as_deref())?;
                Msg::S2P_ENTRIES { entries, more }
            }
            Msg::P2S_DROP { vnode, ino } => {
                s.drop_inode(&vnode, ino)?;
                Msg::OK
            }
            Msg::P2S_STATFS { vnode } => Msg::S2P_STATFS { quota: s.quota(), used: s.used(), files: s.files(&vnode)? },
            Msg::X2S_SYNC { vnode, ino } => {
                self.syncs.fetch_add(1, Relaxed);
                metrics::counter!("scomp_syncs_total").increment(1);
                s.sync(&vnode, ino)?;
                Msg::OK
            }
            Msg::M2S_READ { vnode, ino, offset, len } => {
                let data = s.read_data(&vnode, ino, offset, len.min(splitos_rpc::MAX_BODY / 2))?;
                self.bytes_read.fetch_add(data.len() as u64, Relaxed);
                metrics::counter!("scomp_read_bytes_total").increment(data.len() as u64);
                Msg::S2M_DATA { data: ByteBuf::from(data) }
            }
            Msg::M2S_WRITE { vnode, ino, offset, data, size } => {
                s.write_data(&vnode, ino, offset, &data, size)?;
                self.bytes_written.fetch_add(data.len() as u64, Relaxed);
                metrics::counter!("scomp_written_bytes_total").increment(data.len() as u64);
                Msg::OK
            }
            Msg::M2S_RESERVE { vnode, ino, bytes } => {
                s.reserve(&vnode, ino, bytes)?;
                Msg::OK
            }
            Msg::M2S_SETSIZE { vnode, ino, size } => {
                s.set_size(&vnode, ino, size)?;
                Msg::OK
            }
            other => Msg::err(ErrCode::Invalid, format!("an sComponent does not handle {}", other.name())),
        })
    }
}

impl Handler for Storage {
    fn handle(&self, msg: Msg) -> Msg {
        let name = msg.name();
        metrics::counter!("scomp_requests_total", "msg" => name).increment(1);
        match msg {
            Msg::C2X_PING => Msg::X2C_PONG { role: Role::Storage, id: self.node.id() },
            Msg::C2X_STATS => Msg::X2C_STATS { json: self.stats_json() },
            Msg::C2X_METRICS => {
                metrics::gauge!("scomp_used_bytes").set(self.store.used() as f64);
                Msg::X2C_METRICS { text: node::render_metrics() }
            }
            Msg::C2X_SHUTDOWN => {
                if let Err(e) = self.store.checkpoint() {
                    tracing::error!(errno = e, "final commit failed");
                }
                crate::node::exit_soon();
                Msg::OK
            }
            other => match self.fs(other) {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(request = name, errno = e, "request refused");
                    errno(e)
                }
            },
        }
    }
}

pub struct StorageArgs {
    pub listen: String,
    pub gm: String,
    pub dir: std::path::PathBuf,
    pub quota: u64,
    pub ready_file: Option<std::path::PathBuf>,
    pub metrics_addr: Option<String>,
}

pub fn run(args: StorageArgs) -> anyhow::Result<()> {
    let stop = node::block_stop_signals();
    let store = Store::open(&args.dir, args.quota)?;
    let node = Node::new(Role::Storage, &args.gm);
    let listener = splitos_rpc::transport::Transport::listen(&*node.transport, &args.listen)
        .map_err(|e| anyhow::anyhow!("sComponent cannot listen on {}: {e}", args.listen))?;
    let node = node.with_addr(listener.local_addr());
    let st = Arc::new(Storage { node: node.clone(), store, started: Instant::now(), bytes_read: AtomicU64::new(0), bytes_written: AtomicU64::new(0), syncs: AtomicU64::new(0) });
    let s3 = st.clone();
    stop.on_stop(move || {
        if let Err(e) = s3.store.checkpoint() {
            tracing::error!(errno = e, "final commit failed");
        }
    });
    let s4 = st.clone();
    std::thread::Builder::new()
        .name("checkpoint".into())
        .spawn(move || loop {
            std::thread::sleep(CHECKPOINT_EVERY);
            if let Err(e) = s4.store.checkpoint() {
                tracing::error!(errno = e, "periodic commit failed");
            }
        })
        .expect("spawn checkpoint thread");
    let h = serve(listener, st.clone(), ServerConfig { name: "scomp".into(), workers: 0, fanout_workers: 1 });
    node.register(None, st.load()).map_err(|e| anyhow::anyhow!("cannot register with the global managers at {}: {e}", args.gm))?;
    let s2 = st.clone();
    node.clone().heartbeat_forever(None, move || s2.load());
    if let Some(m) = &args.metrics_addr {
        let at = node::serve_metrics_http(m)?;
        tracing::info!(metrics = %at, "serving Prometheus metrics");
    }
    tracing::info!(addr = %h.addr, id = node.id(), role = "scomponent", dir = %args.dir.display(), quota = args.quota, used = st.store.used(), "splitos storage monitor started");
    node::announce_ready(args.ready_file.as_deref(), &h.addr);
    crate::node::park_forever()
}
