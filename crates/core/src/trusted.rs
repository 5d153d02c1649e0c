//! Directories no other user can change: the state and storage trees of a cluster, the
//! directories of program sockets and the mount points of vNodes.
//!
//! A path is safe to create in, open or mount onto only if no other user can change what it
//! names meanwhile: every directory on it, from `/` down, belongs to root or to this user and
//! is writable by no one else, or is sticky (like `/tmp`, where others cannot rename or remove
//! what is ours). A tree that existed before we made it (perhaps open to others, perhaps made
//! by them) is checked entry by entry wherever others could have written: an entry of another
//! user, a symbolic link (we make none), or a file with a second name (a hard link to a file of
//! ours made by someone else) was planted, and the tree is refused naming it. Once a tree
//! passes, only its owner can add to it, so the paths below it stay what they were checked as.
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

fn me() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Whether users other than the owner (and root) may add, rename or remove names in the
/// directory of mode `mode`.
fn open_to_others(mode: u32) -> bool {
    mode & 0o022 != 0 && mode & libc::S_ISVTX == 0
}

fn absolute(p: &Path) -> anyhow::Result<PathBuf> {
    if p.is_absolute() {
        return Ok(p.to_path_buf());
    }
    Ok(std::env::current_dir()?.join(p))
}

/// Checks every component of `p` as written, then as resolved: each is root's or ours, and a
/// directory among them admits no one else's names. Symbolic links on the way are followed
/// only if root or we made them (their parents, checked too, keep others from replacing them).
pub fn check_path(p: &Path) -> anyhow::Result<()> {
    let written = absolute(p)?;
    let resolved = std::fs::canonicalize(&written).map_err(|e| anyhow::anyhow!("{}: {e}", written.display()))?;
    for path in [&written, &resolved] {
        let mut at = PathBuf::new();
        for c in path.components() {
            at.push(c);
            let m = std::fs::symlink_metadata(&at).map_err(|e| anyhow::anyhow!("{}: {e}", at.display()))?;
            if m.uid() != 0 && m.uid() != me() {
                anyhow::bail!("{} belongs to uid {}: another user could replace what splitos keeps below it; use a directory of root's or of this user (uid {})", at.display(), m.uid(), me());
            }
            if m.is_dir() && open_to_others(m.mode()) {
                anyhow::bail!(
                    "{} is open to other users (mode {:o}): they could replace what splitos keeps below it",
                    at.display(),
                    m.mode() & 0o7777
                );
            }
        }
    }
    Ok(())
}

/// Refuses an entry of `dir` (or below, wherever others could write) that we did not make.
fn check_entries(dir: &Path, top: &Path) -> anyhow::Result<()> {
    let dev = std::fs::symlink_metadata(dir)?.dev();
    for e in std::fs::read_dir(dir).map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))? {
        let e = e?;
        let path = e.path();
        let m = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            // The mount of a pComponent that died (ECONNABORTED for a look that was pending
            // when its connection was aborted): it unmounts before mounting there again.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)) => continue,
            Err(e) => anyhow::bail!("{}: {e}", path.display()),
        };
        // A vNode's file system mounted there by a pComponent: not part of the tree.
        if m.dev() != dev {
            continue;
        }
        let planted = if m.uid() != me() {
            Some(format!("it belongs to uid {}", m.uid()))
        } else if m.file_type().is_symlink() {
            Some("it is a symbolic link".to_string())
        } else if m.is_file() && m.nlink() > 1 {
            Some(format!("it has {} names (a hard link)", m.nlink()))
        } else {
            None
        };
        if let Some(why) = planted {
            anyhow::bail!(
                "{} holds {}, which splitos did not make ({why}): another user may have planted it while the directory was open to them. Check it, remove it (or the whole of {}), and start again",
                dir.display(),
                path.display(),
                top.display()
            );
        }
        if m.is_dir() && open_to_others(m.mode()) {
            check_entries(&path, top)?;
        }
    }
    Ok(())
}

/// Makes `dir` (and any missing parent) a directory of this user with `mode`, or checks and
/// fixes an existing one: its path must be safe ([`check_path`]) and the tree below it hold
/// only what this user made. Returns what was wrong as an error naming the path; a tree
/// refused for what it holds is left closed with `mode`.
pub fn own_dir(dir: &Path, mode: u32) -> anyhow::Result<()> {
    let dir = absolute(dir)?;
    make_parents(&dir)?;
    if let Some(parent) = dir.parent() {
        check_path(parent)?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => anyhow::bail!("cannot create {}: {e}", dir.display()),
    }
    let m = std::fs::symlink_metadata(&dir)?;
    if !m.is_dir() {
        anyhow::bail!(
            "{} is not a directory (a symbolic link or a file is in its place): remove it and start again",
            dir.display()
        );
    }
    if m.uid() != me() {
        anyhow::bail!(
            "{} belongs to uid {}, not to this user (uid {})",
            dir.display(),
            m.uid(),
            me()
        );
    }
    // Closed first, then checked: whatever others planted before the close is found, and
    // nothing can be planted after it (checked first, an entry planted between the check and
    // the close would stay).
    if m.mode() & 0o7777 != mode {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))?;
    }
    check_entries(&dir, &dir)
}

/// Makes the missing directories on the way to `dir`, not `dir` itself: this user's alone
/// (`0700`, as the XDG base directories are made: `~/.local/state` of a user's own cluster),
/// but root's `0755`, for other users pass through them to a host cluster's program sockets.
pub fn make_parents(dir: &Path) -> anyhow::Result<()> {
    let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty() && !p.exists()) else {
        return Ok(());
    };
    let mode = if me() == 0 { 0o755 } else { 0o700 };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(parent)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", parent.display()))
}

/// Opens `path` (in a directory [`own_dir`] checked) as a new file of mode `mode`, never
/// through a link: whatever had the name is removed first.
pub fn new_file(path: &Path, mode: u32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// The user a connected Unix socket's peer ran as when it connected (`SO_PEERCRED`).
pub fn peer_uid(fd: &impl std::os::fd::AsFd) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    // SAFETY: ucred is plain data, valid when zeroed.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, which lives across the call.
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cred.uid)
}

/// Whether a pComponent running as `uid` may be given this user's programs: one of root's
/// (a host's cluster) or of this user's own.
pub fn trusted_server(uid: u32) -> bool {
    uid == 0 || uid == me()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_fresh_directory_is_made_private() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("state");
        own_dir(&d, 0o711).unwrap();
        assert_eq!(std::fs::metadata(&d).unwrap().mode() & 0o7777, 0o711);
        own_dir(&d, 0o711).unwrap();
    }

    #[test]
    fn a_symlink_planted_in_an_open_directory_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("state");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        symlink("/etc/hostname", d.join("gm.log")).unwrap();
        let e = own_dir(&d, 0o711).unwrap_err().to_string();
        assert!(e.contains("gm.log") && e.contains("symbolic link"), "{e}");
    }

    /// The mode is set before the entries are checked, so that nothing can be planted between
    /// the check and the close: a tree refused for what it holds was closed already.
    #[test]
    fn a_tree_is_closed_before_its_entries_are_checked() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("state");
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        symlink("/etc/hostname", d.join("gm.log")).unwrap();
        assert!(own_dir(&d, 0o711).is_err());
        assert_eq!(
            std::fs::metadata(&d).unwrap().mode() & 0o7777,
            0o711,
            "closed before the check refused it"
        );
    }

    #[test]
    fn a_second_name_of_a_file_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("state");
        std::fs::create_dir(&d).unwrap();
        std::fs::write(t.path().join("precious"), b"x").unwrap();
        std::fs::hard_link(t.path().join("precious"), d.join("gm.log")).unwrap();
        let e = own_dir(&d, 0o711).unwrap_err().to_string();
        assert!(e.contains("hard link"), "{e}");
    }

    #[test]
    fn a_directory_in_place_of_the_tree_must_not_be_a_link() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("elsewhere")).unwrap();
        symlink(t.path().join("elsewhere"), t.path().join("state")).unwrap();
        let e = own_dir(&t.path().join("state"), 0o711).unwrap_err().to_string();
        assert!(e.contains("not a directory"), "{e}");
    }

    #[test]
    fn an_open_parent_makes_a_path_unsafe_and_a_sticky_one_does_not() {
        let t = tempfile::tempdir().unwrap();
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = own_dir(&open.join("state"), 0o711).unwrap_err().to_string();
        assert!(e.contains("open to other users"), "{e}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        own_dir(&open.join("state"), 0o711).unwrap();
    }

    #[test]
    fn a_new_file_replaces_a_link_instead_of_following_it() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("target"), b"keep").unwrap();
        symlink(t.path().join("target"), t.path().join("log")).unwrap();
        new_file(&t.path().join("log"), 0o600).unwrap();
        assert_eq!(std::fs::read(t.path().join("target")).unwrap(), b"keep");
        assert!(std::fs::symlink_metadata(t.path().join("log")).unwrap().is_file());
    }
}
