//! Where the vNodes' file systems are mounted on this pComponent's host: one mount per vNode,
//! made when a program of the vNode first runs here.
use super::*;

/// The vNode mounts of one pComponent.
pub struct Mounts {
    root: PathBuf,
    node: Arc<Node>,
    grants: Arc<Grants>,
    live: Mutex<HashMap<String, (PathBuf, fuser::BackgroundSession)>>,
}

/// Why a vNode's file system was not mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error(transparent)]
    Name(#[from] splitos_core::config::BadVnodeName),
    /// A cluster without sComponents has no files to show.
    #[error("no sComponent is alive to store vNode {0:?}")]
    NoStorage(String),
    #[error("cannot create mount point {}: {error}", dir.display())]
    CreateDir { dir: PathBuf, error: std::io::Error },
    #[error("mount point {}: {error}", dir.display())]
    Stat { dir: PathBuf, error: std::io::Error },
    #[error("mount point {} is not a directory of this pComponent's user (uid {uid}): refusing to mount there", dir.display())]
    NotOurs { dir: PathBuf, uid: u32 },
    #[error("cannot mount vNode {vnode:?} at {}: {error}", dir.display())]
    Mount {
        vnode: String,
        dir: PathBuf,
        error: std::io::Error,
    },
}

impl Refuse for MountError {
    fn code(&self) -> ErrCode {
        match self {
            MountError::Name(e) => e.code(),
            MountError::NoStorage(_) => ErrCode::Unreachable,
            _ => ErrCode::Internal,
        }
    }
}

/// Makes `dir` a mount point only this pComponent could have made: a directory of its own in
/// the vNode root it checked at start (which no one else can write). Anything else in its place
/// is refused, never mounted over or through.
fn mount_point(dir: &Path) -> Result<(), MountError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o755).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => {
            return Err(MountError::CreateDir {
                dir: dir.to_path_buf(),
                error,
            })
        }
    }
    let m = std::fs::symlink_metadata(dir).map_err(|error| MountError::Stat {
        dir: dir.to_path_buf(),
        error,
    })?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me {
        return Err(MountError::NotOurs {
            dir: dir.to_path_buf(),
            uid: me,
        });
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
    pub fn mount(&self, vnode: &str) -> Result<PathBuf, MountError> {
        let mut live = self.live.lock().unwrap();
        if let Some((dir, _)) = live.get(vnode) {
            return Ok(dir.clone());
        }
        check_vnode_name(vnode)?;
        let fs = VnodeFs::new(vnode.to_string(), self.node.clone(), self.grants.of(vnode));
        fs.storage().map_err(|_| MountError::NoStorage(vnode.to_string()))?;
        let dir = self.root.join(vnode);
        unmount(&dir);
        mount_point(&dir)?;
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
        let session = fuser::spawn_mount(fs, &dir, &cfg).map_err(|error| MountError::Mount {
            vnode: vnode.to_string(),
            dir: dir.clone(),
            error,
        })?;
        tracing::info!(vnode, dir = %dir.display(), "mounted the vNode's file system");
        crate::series::VNODE_MOUNTS.increment(1);
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
