//! What components and the control plane ask of this host that no one monitor owns: users and
//! groups by name, and the mounts under a directory (a pComponent's vNode file systems, which
//! `cluster down` and `run` also look at).
use std::path::{Path, PathBuf};

/// A user's or group's id, from its number or its name on this host; a name this host does not
/// know is an error, not a grant to nobody.
fn id_of(what: &str, name: &str, lookup: impl Fn(&str) -> nix::Result<Option<u32>>) -> Result<u32, String> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    match lookup(name) {
        Ok(Some(id)) => Ok(id),
        Ok(None) => Err(format!("no {what} {name:?} on this host")),
        Err(e) => Err(format!("cannot look up {what} {name:?}: {e}")),
    }
}

pub fn uid_of(name: &str) -> Result<u32, String> {
    id_of("user", name, |n| nix::unistd::User::from_name(n).map(|u| u.map(|u| u.uid.as_raw())))
}

pub fn gid_of(name: &str) -> Result<u32, String> {
    id_of("group", name, |n| nix::unistd::Group::from_name(n).map(|g| g.map(|g| g.gid.as_raw())))
}

/// Detaches whatever is mounted at `dir` (a mount left by a pComponent that was killed).
pub fn unmount(dir: &Path) {
    if let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) {
        // SAFETY: `c` is a NUL-terminated path that outlives the call, which only reads it. The
        // result is not needed: EINVAL (nothing mounted there) is the usual case. A link in the
        // mount point's place is not followed: it never names one of our mounts.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    }
}

/// Every mount point under `dir`, deepest first (from /proc/self/mountinfo).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    let mut v: Vec<PathBuf> = info.lines().filter_map(|l| l.split(' ').nth(4)).map(|p| PathBuf::from(p.replace("\\040", " "))).filter(|p| p.starts_with(dir) && p != dir).collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    v
}
