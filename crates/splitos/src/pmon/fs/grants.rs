//! Who may use which vNode on this pComponent: the admin's grants (`[[vnode]]` of the cluster
//! configuration, `splitos proc --grant`), checked against the credentials the kernel gives
//! for each connection to the program socket (SO_PEERCRED, SO_PEERGROUPS), never against
//! anything the connection says. Root uses every vNode.
//!
//! The same grants guard the vNode's files: its mount's top directory carries them as a POSIX
//! access ACL ([`Grant::acl`]), which the kernel enforces on every path through it, cached
//! names included.
use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

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
        Ok(PeerCred { pid: c.pid, uid: c.uid, gid: c.gid, groups: splitos_rpc::fdpass::peer_groups(s)?, pidfd: Arc::new(splitos_rpc::fdpass::peer_pidfd(s, c.pid)?) })
    }

    /// Whether the process that connected still exists (then nothing else has its pid).
    pub fn alive(&self) -> bool {
        alive(&self.pidfd)
    }
}

/// Whether the process of a pidfd still exists (a zombie does: its pid is not free yet).
pub fn alive(pidfd: &OwnedFd) -> bool {
    // SAFETY: signal 0 checks the process and sends nothing; the pidfd outlives the call.
    unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), 0, std::ptr::null::<libc::siginfo_t>(), 0) == 0 }
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

#[derive(Clone, Debug, Default)]
pub struct Grants {
    by_vnode: HashMap<String, Grant>,
}

impl Grants {
    /// Parses `VNODE=WHO[,WHO...]`, each WHO `user:NAME`, `user:UID`, `group:NAME` or
    /// `group:GID`. Names are resolved now: a name this host does not know is an error, not a
    /// grant to nobody.
    pub fn parse(specs: &[String]) -> Result<Grants, String> {
        let mut g = Grants::default();
        for spec in specs {
            let (vnode, who) = spec.split_once('=').ok_or_else(|| format!("grant {spec:?}: expected VNODE=user:NAME,group:NAME,..."))?;
            crate::config::check_vnode_name(vnode).map_err(|e| format!("grant {spec:?}: {e}"))?;
            let grant = g.by_vnode.entry(vnode.to_string()).or_default();
            for w in who.split(',').filter(|w| !w.is_empty()) {
                match w.split_once(':') {
                    Some(("user", n)) => grant.uids.insert(crate::sys::uid_of(n).map_err(|e| format!("grant {spec:?}: {e}"))?),
                    Some(("group", n)) => grant.gids.insert(crate::sys::gid_of(n).map_err(|e| format!("grant {spec:?}: {e}"))?),
                    _ => return Err(format!("grant {spec:?}: {w:?} is neither user:NAME nor group:NAME")),
                };
            }
        }
        Ok(g)
    }

    pub fn of(&self, vnode: &str) -> Option<&Grant> {
        self.by_vnode.get(vnode)
    }

    /// Whether `who` may run programs on `vnode` and see its files.
    pub fn may_use(&self, vnode: &str, who: &PeerCred) -> bool {
        who.uid == 0 || self.of(vnode).is_some_and(|g| g.admits(who))
    }

    /// Whether `who` may use some vNode here (else the program socket serves them nothing).
    pub fn may_use_any(&self, who: &PeerCred) -> bool {
        who.uid == 0 || self.by_vnode.values().any(|g| g.admits(who))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(uid: u32, gid: u32, groups: &[u32]) -> PeerCred {
        let pidfd = Arc::new(OwnedFd::from(std::fs::File::open("/dev/null").unwrap()));
        PeerCred { pid: 1, uid, gid, groups: groups.to_vec(), pidfd }
    }

    #[test]
    fn grants_admit_their_users_and_groups_and_root_only() {
        let g = Grants::parse(&["lab=user:1001,user:1002,group:3000".into(), "solo=user:1003".into()]).unwrap();
        assert!(g.may_use("lab", &who(1001, 1001, &[])));
        assert!(g.may_use("lab", &who(1500, 3000, &[])), "primary group");
        assert!(g.may_use("lab", &who(1500, 1500, &[7, 3000])), "supplementary group");
        assert!(!g.may_use("lab", &who(1003, 1003, &[])));
        assert!(!g.may_use("other", &who(1001, 1001, &[])), "a vNode without grants is root's alone");
        assert!(g.may_use("other", &who(0, 0, &[])));
        assert!(g.may_use_any(&who(1003, 1003, &[])));
        assert!(!g.may_use_any(&who(1500, 1500, &[1, 2])));
    }

    #[test]
    fn bad_grants_are_refused_with_the_reason() {
        for (spec, why) in [("lab", "expected VNODE="), ("lab=alice", "neither user:NAME"), ("lab=user:no-such-user-here", "no user"), ("lab=group:no-such-group-here", "no group"), ("a/b=user:1", "not a vNode name")] {
            let e = Grants::parse(&[spec.into()]).unwrap_err();
            assert!(e.contains(why), "{spec}: {e}");
        }
        let g = Grants::parse(&["lab=user:root,group:root".into()]).unwrap();
        assert_eq!(g.of("lab").unwrap().uids.iter().copied().collect::<Vec<_>>(), vec![0]);
    }

    #[test]
    fn the_acl_is_sorted_by_tag_and_id_as_the_kernel_requires() {
        let g = Grants::parse(&["lab=user:20,user:10,group:5".into()]).unwrap();
        let acl = g.of("lab").unwrap().acl();
        assert_eq!(u32::from_le_bytes(acl[..4].try_into().unwrap()), 2);
        let entries: Vec<(u16, u16, u32)> = acl[4..].chunks(8).map(|e| (u16::from_le_bytes([e[0], e[1]]), u16::from_le_bytes([e[2], e[3]]), u32::from_le_bytes(e[4..8].try_into().unwrap()))).collect();
        assert_eq!(entries, vec![(ACL_USER_OBJ, 7, u32::MAX), (ACL_USER, 7, 10), (ACL_USER, 7, 20), (ACL_GROUP_OBJ, 0, u32::MAX), (ACL_GROUP, 7, 5), (ACL_MASK, 7, u32::MAX), (ACL_OTHER, 0, u32::MAX)]);
    }
}
