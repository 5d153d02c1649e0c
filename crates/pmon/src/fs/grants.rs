//! Who may use which vNode on this pComponent: the admin's grants (the global managers' table
//! of vNodes: `[[vnode]]` of the cluster configuration and those made through the REST API,
//! followed by its version in every heartbeat's answer), checked against the credentials the kernel gives
//! for each connection to the program socket (SO_PEERCRED, SO_PEERGROUPS), never against
//! anything the connection says. Root uses every vNode.
//!
//! The same grants guard the vNode's files: its mount's top directory carries them as a POSIX
//! access ACL ([`Grant::acl`]), which the kernel enforces on every path through it, cached
//! names included.
use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use splitos_rpc::VnodeInfo;

/// The credentials of the process at the other end of a Unix socket, as the kernel recorded
/// them when it connected.
#[derive(Clone, Debug)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
    /// That process, whatever later has its pid.
    pub pidfd: Arc<OwnedFd>,
}

impl PeerCred {
    pub fn of(s: &UnixStream) -> std::io::Result<PeerCred> {
        let c = splitos_rpc::fdpass::peer_cred(s)?;
        Ok(PeerCred {
            pid: c.pid,
            uid: c.uid,
            gid: c.gid,
            groups: splitos_rpc::fdpass::peer_groups(s)?,
            pidfd: Arc::new(splitos_rpc::fdpass::peer_pidfd(s, c.pid)?),
        })
    }

    /// Whether the process that connected still exists (then nothing else has its pid).
    pub fn alive(&self) -> bool {
        alive(&self.pidfd)
    }
}

/// Whether the process of a pidfd still exists (a zombie does: its pid is not free yet).
pub fn alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: signal 0 checks the process and sends nothing; the pidfd outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        ) == 0
    }
}

/// The users and groups one vNode is granted to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    pub uids: BTreeSet<u32>,
    pub gids: BTreeSet<u32>,
}

const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;
const ACL_UNDEFINED_ID: u32 = u32::MAX;
const RWX: u16 = 7;

/// The mode a vNode's top directory shows: the owner (root) and, through the ACL's mask,
/// the named users and groups may do everything; everyone else nothing. Sticky, so that
/// users sharing a vNode remove only their own names there, as in /tmp.
pub const TOP_MODE: u32 = 0o1770;

impl Grant {
    /// The POSIX access ACL of the vNode's top directory, in the kernel's xattr encoding
    /// (`system.posix_acl_access`: a version, then entries sorted by tag and id).
    pub fn acl(&self) -> Vec<u8> {
        let mut entries = vec![(ACL_USER_OBJ, RWX, ACL_UNDEFINED_ID)];
        entries.extend(self.uids.iter().map(|u| (ACL_USER, RWX, *u)));
        entries.push((ACL_GROUP_OBJ, 0, ACL_UNDEFINED_ID));
        entries.extend(self.gids.iter().map(|g| (ACL_GROUP, RWX, *g)));
        entries.push((ACL_MASK, RWX, ACL_UNDEFINED_ID));
        entries.push((ACL_OTHER, 0, ACL_UNDEFINED_ID));
        let mut out = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            out.extend(tag.to_le_bytes());
            out.extend(perm.to_le_bytes());
            out.extend(id.to_le_bytes());
        }
        out
    }

    fn admits(&self, who: &PeerCred) -> bool {
        self.uids.contains(&who.uid) || self.gids.contains(&who.gid) || who.groups.iter().any(|g| self.gids.contains(g))
    }
}

/// The grants of this pComponent: the global managers' table of vNodes, resolved on this host.
#[derive(Debug, Default)]
pub struct Grants {
    by_vnode: RwLock<HashMap<String, Grant>>,
    /// The version of the managers' table they are (0: none yet).
    version: AtomicU64,
}

impl Grants {
    /// Resolves the managers' table on this host: user and group names (or numeric ids) to
    /// ids. A name this host does not know grants nothing, and is logged: a grant to someone
    /// else of the same name elsewhere must not become a grant to anyone here.
    pub fn resolve(vnodes: &[VnodeInfo]) -> HashMap<String, Grant> {
        let mut table = HashMap::new();
        for v in vnodes {
            if let Err(e) = splitos_core::config::check_vnode_name(&v.name) {
                tracing::warn!(vnode = %v.name, "a vNode of the global managers is not granted here: {e}");
                continue;
            }
            let mut g = Grant::default();
            for u in &v.users {
                match splitos_core::sys::uid_of(u) {
                    Ok(uid) => _ = g.uids.insert(uid),
                    Err(e) => tracing::warn!(vnode = %v.name, user = %u, "not granted on this host: {e}"),
                }
            }
            for n in &v.groups {
                match splitos_core::sys::gid_of(n) {
                    Ok(gid) => _ = g.gids.insert(gid),
                    Err(e) => tracing::warn!(vnode = %v.name, group = %n, "not granted on this host: {e}"),
                }
            }
            table.insert(v.name.clone(), g);
        }
        table
    }

    /// Takes the table of `version` in place of the one held; returns the vNodes whose grant
    /// changed (made, deleted, or granted to others).
    pub fn replace(&self, version: u64, table: HashMap<String, Grant>) -> Vec<String> {
        let mut held = self.by_vnode.write().unwrap();
        let mut changed: Vec<String> = held
            .iter()
            .filter(|(v, g)| table.get(*v) != Some(g))
            .map(|(v, _)| v.clone())
            .collect();
        changed.extend(table.keys().filter(|v| !held.contains_key(*v)).cloned());
        *held = table;
        self.version.store(version, Ordering::Relaxed);
        changed
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Relaxed)
    }

    pub fn of(&self, vnode: &str) -> Option<Grant> {
        self.by_vnode.read().unwrap().get(vnode).cloned()
    }

    /// Whether `who` may run programs on `vnode` and see its files.
    pub fn may_use(&self, vnode: &str, who: &PeerCred) -> bool {
        who.uid == 0 || self.by_vnode.read().unwrap().get(vnode).is_some_and(|g| g.admits(who))
    }

    /// Whether `who` may use some vNode here (else the program socket serves them nothing).
    pub fn may_use_any(&self, who: &PeerCred) -> bool {
        who.uid == 0 || self.by_vnode.read().unwrap().values().any(|g| g.admits(who))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(uid: u32, gid: u32, groups: &[u32]) -> PeerCred {
        let pidfd = Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        PeerCred {
            pid: 1,
            uid,
            gid,
            groups: groups.to_vec(),
            pidfd,
        }
    }

    fn vnode(name: &str, users: &[&str], groups: &[&str]) -> VnodeInfo {
        VnodeInfo {
            name: name.into(),
            users: users.iter().map(|u| u.to_string()).collect(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            memory: None,
        }
    }

    fn grants(vnodes: &[VnodeInfo]) -> Grants {
        let g = Grants::default();
        g.replace(1, Grants::resolve(vnodes));
        g
    }

    #[test]
    fn grants_admit_their_users_and_groups_and_root_only() {
        let g = grants(&[
            vnode("lab", &["1001", "1002"], &["3000"]),
            vnode("solo", &["1003"], &[]),
        ]);
        assert!(g.may_use("lab", &who(1001, 1001, &[])));
        assert!(g.may_use("lab", &who(1500, 3000, &[])), "primary group");
        assert!(g.may_use("lab", &who(1500, 1500, &[7, 3000])), "supplementary group");
        assert!(!g.may_use("lab", &who(1003, 1003, &[])));
        assert!(
            !g.may_use("other", &who(1001, 1001, &[])),
            "a vNode without grants is root's alone"
        );
        assert!(g.may_use("other", &who(0, 0, &[])));
        assert!(g.may_use_any(&who(1003, 1003, &[])));
        assert!(!g.may_use_any(&who(1500, 1500, &[1, 2])));
    }

    #[test]
    fn names_this_host_does_not_know_grant_nothing_and_changes_are_told() {
        let g = grants(&[
            vnode("lab", &["root", "no-such-user-here"], &["root", "no-such-group-here"]),
            vnode("a/b", &["1"], &[]),
        ]);
        let lab = g.of("lab").unwrap();
        assert_eq!(
            (
                lab.uids.iter().copied().collect::<Vec<_>>(),
                lab.gids.iter().copied().collect::<Vec<_>>()
            ),
            (vec![0], vec![0])
        );
        assert!(g.of("a/b").is_none(), "not a vNode name");
        assert_eq!(g.version(), 1);
        let mut changed = g.replace(
            2,
            Grants::resolve(&[vnode("lab", &["root"], &["root"]), vnode("new", &["7"], &[])]),
        );
        changed.sort();
        assert_eq!(changed, ["new"], "lab's grant is the same");
        let mut changed = g.replace(3, Grants::resolve(&[vnode("lab", &["8"], &[])]));
        changed.sort();
        assert_eq!(changed, ["lab", "new"]);
        assert!(!g.may_use("new", &who(7, 7, &[])), "a deleted vNode is root's alone");
    }

    #[test]
    fn the_acl_is_sorted_by_tag_and_id_as_the_kernel_requires() {
        let g = grants(&[vnode("lab", &["20", "10"], &["5"])]);
        let acl = g.of("lab").unwrap().acl();
        assert_eq!(u32::from_le_bytes(acl[..4].try_into().unwrap()), 2);
        let entries: Vec<(u16, u16, u32)> = acl[4..]
            .chunks(8)
            .map(|e| {
                (
                    u16::from_le_bytes([e[0], e[1]]),
                    u16::from_le_bytes([e[2], e[3]]),
                    u32::from_le_bytes(e[4..8].try_into().unwrap()),
                )
            })
            .collect();
        assert_eq!(
            entries,
            vec![
                (ACL_USER_OBJ, 7, u32::MAX),
                (ACL_USER, 7, 10),
                (ACL_USER, 7, 20),
                (ACL_GROUP_OBJ, 0, u32::MAX),
                (ACL_GROUP, 7, 5),
                (ACL_MASK, 7, u32::MAX),
                (ACL_OTHER, 0, u32::MAX)
            ]
        );
    }
}
