//! A storage directory shared by the sComponents started on it. The first to open it (its
//! database takes a lock) owns it and listens on `share.sock` in it; every other one is a
//! front: it serves its own cluster, whose components authenticate to it as to any
//! sComponent, and passes each request on files to the owner, which serves it as its own. When
//! the owner stops, a front that needs the directory takes it over, so the files outlive the
//! run that started their owner while any other uses them.
//!
//! The socket is reached only through the storage directory, which is its user's alone
//! (`0700`), and the owner serves only a peer of its own user (`SO_PEERCRED`): the same
//! protection as the shared-memory channels between components of one host. Requests on it
//! are the cluster's frames ([`splitos_rpc::frame`]), vetted by the front's dispatcher (the
//! sender's role) before they are passed on.
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use splitos_rpc::frame::{encode, read_frame};
use splitos_rpc::{ErrCode, FrameKind, Load, Msg, Refuse, C2X_STATS, X2C_STATS};

use super::{ns::InUse, Core};

/// Why a request could not be passed on to the process that has the storage directory open.
/// Whether a lost owner made the change before it went is unknown: the caller sees what an
/// unreachable sComponent gives.
#[derive(Debug, thiserror::Error)]
enum PassOnError {
    #[error("{0:#}")]
    Attach(anyhow::Error),
    #[error("the sComponent that had storage directory {} open went away during {msg}", dir.display())]
    OwnerGone { dir: PathBuf, msg: &'static str },
}

impl Refuse for PassOnError {
    fn code(&self) -> ErrCode {
        ErrCode::Unreachable
    }
}

const SOCKET: &str = "share.sock";
/// How long a front waits for the directory's owner to answer or to let go of it: an owner
/// that is stopping commits its last changes first.
const ATTACH_WAIT: Duration = Duration::from_secs(10);

pub struct Share {
    dir: PathBuf,
    quota: u64,
    /// Set once this process has the directory open; never unset.
    owner: OnceLock<Arc<Core>>,
    /// Connections to the owner not in use (a front's).
    idle: Mutex<Vec<UnixStream>>,
    /// Held while reaching or taking over the directory, so one request does it at a time.
    attaching: Mutex<()>,
    /// Requests this process passed on to the owner.
    forwarded: AtomicU64,
    /// Requests of other sComponents this process served as the owner.
    served: AtomicU64,
    /// Times this process took the directory over from an owner that stopped.
    takeovers: AtomicU64,
    /// This process started as a front.
    front: AtomicBool,
}

impl Share {
    /// Opens the storage directory, or reaches the sComponent that has it open.
    pub fn open(dir: &Path, quota: u64) -> anyhow::Result<Arc<Share>> {
        let s = Arc::new(Share {
            dir: dir.to_path_buf(),
            quota,
            owner: OnceLock::new(),
            idle: Mutex::new(Vec::new()),
            attaching: Mutex::new(()),
            forwarded: AtomicU64::new(0),
            served: AtomicU64::new(0),
            takeovers: AtomicU64::new(0),
            front: AtomicBool::new(false),
        });
        if let Some(c) = s.attach()? {
            tracing::info!(dir = %dir.display(), "another sComponent has the storage directory open: passing requests on files to it");
            s.idle.lock().unwrap().push(c);
            s.front.store(true, Relaxed);
        }
        Ok(s)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join(SOCKET)
    }

    pub fn is_owner(&self) -> bool {
        self.owner.get().is_some()
    }

    /// A connection to the directory's owner, or `None` once this process owns it: reaches
    /// the owner, or opens the directory if no process has it open.
    fn attach(self: &Arc<Self>) -> anyhow::Result<Option<UnixStream>> {
        let _one = self.attaching.lock().unwrap();
        let t0 = Instant::now();
        loop {
            if self.is_owner() {
                return Ok(None);
            }
            if let Ok(c) = UnixStream::connect(self.socket()) {
                return Ok(Some(c));
            }
            match Core::open(&self.dir, self.quota) {
                Ok(core) => {
                    self.own(core)?;
                    return Ok(None);
                }
                Err(e) if e.is::<InUse>() => {}
                Err(e) => return Err(e),
            }
            if t0.elapsed() > ATTACH_WAIT {
                anyhow::bail!(
                    "storage directory {} is in use by another process, and no sComponent that shares it answers at {}",
                    self.dir.display(),
                    self.socket().display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Becomes the directory's owner: serves the other sComponents on its socket.
    fn own(self: &Arc<Self>, core: Core) -> anyhow::Result<()> {
        let path = self.socket();
        // Holding the directory, any socket there is a stopped owner's.
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|e| {
            anyhow::anyhow!(
                "cannot listen for the other sComponents of storage directory {} at {}: {e}",
                self.dir.display(),
                path.display()
            )
        })?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        if self.owner.set(Arc::new(core)).is_err() {
            unreachable!("only one attach at a time opens the directory");
        }
        if self.front.load(Relaxed) {
            self.takeovers.fetch_add(1, Relaxed);
            tracing::info!(dir = %self.dir.display(), "the sComponent that had the storage directory open stopped: took it over");
        }
        self.idle.lock().unwrap().clear();
        let me = self.clone();
        std::thread::Builder::new()
            .name("share-accept".into())
            .spawn(move || me.accept(listener))
            .expect("spawn share-accept thread");
        Ok(())
    }

    fn accept(self: Arc<Self>, listener: UnixListener) {
        // SAFETY: geteuid takes nothing and cannot fail.
        let me = unsafe { libc::geteuid() };
        for c in listener.incoming() {
            let Ok(c) = c else { continue };
            match splitos_rpc::fdpass::peer_cred(&c) {
                Ok(cred) if cred.uid == me => {
                    let s = self.clone();
                    let spawned = std::thread::Builder::new()
                        .name("share-serve".into())
                        .spawn(move || s.serve(c));
                    if let Err(e) = spawned {
                        tracing::warn!(error = %e, "cannot serve another sComponent of the storage directory");
                    }
                }
                Ok(cred) => tracing::warn!(
                    uid = cred.uid,
                    pid = cred.pid,
                    "refused a connection to the storage directory's socket from another user"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "refused a connection to the storage directory's socket without peer credentials")
                }
            }
        }
    }

    /// Serves one front's requests in order until it hangs up or sends garbage.
    fn serve(&self, mut c: UnixStream) {
        let core = self.owner.get().expect("only an owner serves");
        loop {
            let f = match read_frame(&mut c) {
                Ok(Some(f)) => f,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "closed a connection of another sComponent that sent a bad frame");
                    return;
                }
            };
            let reply = match f.msg {
                Msg::C2X_STATS(_) => X2C_STATS {
                    json: core.stats().to_string(),
                }
                .into(),
                m => {
                    self.served.fetch_add(1, Relaxed);
                    core.handle(m)
                }
            };
            if c.write_all(&encode(FrameKind::Reply, f.req_id, &reply)).is_err() {
                return;
            }
        }
    }

    /// One request on files, served here or by the owner.
    pub fn handle(self: &Arc<Self>, msg: Msg) -> Msg {
        match self.pass_on(&msg) {
            None => self
                .owner
                .get()
                .expect("no owner to pass on to: this process owns the directory")
                .handle(msg),
            Some(Ok(reply)) => {
                self.forwarded.fetch_add(1, Relaxed);
                reply
            }
            Some(Err(why)) => Msg::ERR(why.into()),
        }
    }

    /// The owner's reply to `msg`, or why there is none; `None` if this process owns the
    /// directory (from now on, if its owner stopped).
    fn pass_on(self: &Arc<Self>, msg: &Msg) -> Option<Result<Msg, PassOnError>> {
        if self.is_owner() {
            return None;
        }
        let frame = encode(FrameKind::Request, 0, msg);
        // A pooled connection may be to an owner that stopped since: the request cannot have
        // reached it if writing fails, so it is sent again to whoever has the directory now.
        loop {
            let pooled = self.idle.lock().unwrap().pop();
            let mut c = match pooled {
                Some(c) => c,
                None => match self.attach() {
                    Ok(Some(c)) => c,
                    Ok(None) => return None,
                    Err(e) => return Some(Err(PassOnError::Attach(e))),
                },
            };
            if c.write_all(&frame).is_err() {
                continue;
            }
            return Some(match read_frame(&mut c) {
                Ok(Some(f)) => {
                    self.idle.lock().unwrap().push(c);
                    Ok(f.msg)
                }
                _ => Err(PassOnError::OwnerGone {
                    dir: self.dir.clone(),
                    msg: msg.name(),
                }),
            });
        }
    }

    /// Commits the directory's changes, if this process has it open.
    pub fn checkpoint(&self) {
        if let Some(core) = self.owner.get() {
            core.checkpoint();
        }
    }

    /// The directory's figures, as its owner counts them.
    fn owner_stats(self: &Arc<Self>) -> serde_json::Value {
        if let Some(core) = self.owner.get() {
            return core.stats();
        }
        match self.pass_on(&C2X_STATS.into()) {
            Some(Ok(Msg::X2C_STATS(s))) => serde_json::from_str(&s.json).unwrap_or_default(),
            Some(_) => serde_json::json!({}),
            None => self.owner_stats(),
        }
    }

    pub fn load(self: &Arc<Self>) -> Load {
        let s = self.owner_stats();
        let n = |k: &str| s[k].as_u64().unwrap_or(0);
        Load {
            threads: 0,
            processes: 0,
            capacity: n("quota"),
            committed: n("used"),
            used: n("used"),
        }
    }

    /// The directory's figures and how this process shares it.
    pub fn stats(self: &Arc<Self>) -> serde_json::Value {
        let mut s = self.owner_stats();
        s["sharing"] = serde_json::json!({
            "owner": self.is_owner(),
            "forwarded_requests": self.forwarded.load(Relaxed),
            "served_requests": self.served.load(Relaxed),
            "takeovers": self.takeovers.load(Relaxed),
        });
        s
    }
}
