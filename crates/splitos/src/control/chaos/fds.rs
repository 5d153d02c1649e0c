//! The descriptors a pComponent holds for the programs it runs: a userfaultfd and a pidfd per
//! process, and the connections of their shims. Once every program has ended it holds none;
//! what remains is a leak, as a process or a page left at a component is.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A component process's descriptors of the kinds programs leave behind.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(super) struct Held {
    pub userfaultfds: usize,
    pub pidfds: usize,
    /// Connections accepted on one of `shim_socks`.
    pub shim_connections: usize,
}

/// The Unix sockets of `pid`'s network namespace, by inode: whether each listens, and its path.
fn unix_sockets(pid: u32) -> BTreeMap<u64, (bool, String)> {
    // Columns: Num RefCount Protocol Flags Type St Inode Path; an accepted connection shows
    // the path of the socket it was accepted on, a listening one the flag __SO_ACCEPTCON.
    const ACCEPTCON: u32 = 1 << 16;
    std::fs::read_to_string(format!("/proc/{pid}/net/unix"))
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let flags = u32::from_str_radix(f.get(3)?, 16).ok()?;
            let inode = f.get(6)?.parse().ok()?;
            Some((
                inode,
                (flags & ACCEPTCON != 0, f.get(7).copied().unwrap_or("").to_string()),
            ))
        })
        .collect()
}

/// What process `pid` holds now, counting connections accepted on `shim_socks`; `None` once
/// it is gone.
pub(super) fn held_by(pid: u32, shim_socks: &BTreeSet<String>) -> Option<Held> {
    let unix = unix_sockets(pid);
    let mut h = Held::default();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let target = target.to_string_lossy();
        match target.as_ref() {
            "anon_inode:[userfaultfd]" => h.userfaultfds += 1,
            "anon_inode:[pidfd]" => h.pidfds += 1,
            t => {
                let inode = t.strip_prefix("socket:[").and_then(|i| i.strip_suffix(']'));
                let socket = inode.and_then(|i| unix.get(&i.parse().ok()?));
                if socket.is_some_and(|(listens, path)| !listens && shim_socks.contains(path)) {
                    h.shim_connections += 1;
                }
            }
        }
    }
    Some(h)
}

/// Whether `name` (a component's name in the cluster's directory) is a pComponent.
fn is_proc(name: &str) -> bool {
    name.strip_prefix("proc").is_some_and(|n| n.parse::<u32>().is_ok())
}

/// What the live pComponents of the cluster in `state` hold of programs, none running; empty
/// if nothing. `shim_socks`: the pComponents' shim sockets, as the cluster's status names them.
pub(super) fn leaked(state: &Path, shim_socks: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, pid) in crate::control::procs::running(state)
        .into_iter()
        .filter(|(n, _)| is_proc(n))
    {
        let Some(h) = held_by(pid, shim_socks) else {
            continue;
        };
        if h != Held::default() {
            out.push(format!(
                "pComponent {name} (pid {pid}) still holds {} userfaultfd(s), {} pidfd(s) and {} shim connection(s)",
                h.userfaultfds, h.pidfds, h.shim_connections
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn userfaultfds_pidfds_and_connections_accepted_on_a_shim_socket_are_counted() {
        let me = std::process::id();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shim.sock");
        let socks = BTreeSet::from([path.to_string_lossy().to_string()]);
        let before = held_by(me, &socks).unwrap();
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let _client = std::os::unix::net::UnixStream::connect(&path).unwrap();
        let (accepted, _) = l.accept().unwrap();
        let _pair = std::os::unix::net::UnixStream::pair().unwrap();
        // SAFETY: pidfd_open takes no pointer; the descriptor is closed below.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, me, 0) } as i32;
        // SAFETY: userfaultfd takes no pointer; the descriptor is closed below.
        let uffd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) } as i32;
        assert!(pidfd >= 0 && uffd >= 0, "{}", std::io::Error::last_os_error());
        let during = held_by(me, &socks).unwrap();
        assert_eq!(
            during,
            Held {
                userfaultfds: before.userfaultfds + 1,
                pidfds: before.pidfds + 1,
                shim_connections: before.shim_connections + 1,
            },
            "the listener, the client's end and an unrelated pair are not shim connections"
        );
        // SAFETY: both were opened above and are closed once.
        unsafe {
            libc::close(uffd);
            libc::close(pidfd);
        }
        drop(accepted);
        assert_eq!(held_by(me, &socks).unwrap(), before);
        assert!(is_proc("proc0") && is_proc("proc12") && !is_proc("proc") && !is_proc("mem0"));
    }
}
