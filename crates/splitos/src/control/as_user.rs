//! `cluster up` by a user other than root: a cluster that user can run programs on, or a
//! refusal that says what is missing, before any component starts.
use crate::config::{ClusterConfig, VnodeConfig};

/// What a user's cluster would lack.
#[derive(Debug, thiserror::Error)]
pub enum AsUserError {
    #[error("its pComponent could not serve the programs' memory faults: /dev/userfaultfd is not open to uid {uid} and vm.unprivileged_userfaultfd is 0. Root can allow it (`setfacl -m u:{uid}:rw /dev/userfaultfd`, or `sysctl vm.unprivileged_userfaultfd=1`), or run the host's cluster and grant this user a vNode (docs/security.md)")]
    NoUserfaultfd { uid: u32 },
    #[error("its configuration grants uid {uid} no vNode, so its programs would be refused: add one, as `[[vnode]]` with `users = [\"{uid}\"]`")]
    NoVnode { uid: u32 },
}

/// Makes `cfg` a cluster user `uid` can run programs on: with no `[[vnode]]` configured, the
/// embedded default vNode is granted to that user (root uses every vNode; a user only those
/// granted). Refuses a cluster whose pComponent could not serve the user's programs.
pub fn fit(cfg: &mut ClusterConfig, uid: u32) -> Result<(), AsUserError> {
    if cfg.pcomponent.is_empty() {
        return Ok(());
    }
    if !userfaultfd() {
        return Err(AsUserError::NoUserfaultfd { uid });
    }
    if cfg.vnode.is_empty() {
        cfg.vnode.push(VnodeConfig {
            name: "default".into(),
            users: vec![uid.to_string()],
            groups: Vec::new(),
            memory: None,
        });
    } else if !cfg.vnode.iter().any(|v| grants(v, uid)) {
        return Err(AsUserError::NoVnode { uid });
    }
    Ok(())
}

/// Whether this process may have a userfaultfd made: through
/// /dev/userfaultfd, which the pComponent opens and hands its programs, or by the system
/// call itself.
fn userfaultfd() -> bool {
    // SAFETY: access reads the NUL-terminated literal.
    let device = unsafe { libc::access(c"/dev/userfaultfd".as_ptr(), libc::R_OK | libc::W_OK) } == 0;
    device || std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").is_ok_and(|s| s.trim() == "1")
}

/// Whether `v` grants `uid`, by name, number or one of the user's groups.
fn grants(v: &VnodeConfig, uid: u32) -> bool {
    let by_user = v.users.iter().any(|u| crate::sys::uid_of(u).is_ok_and(|id| id == uid));
    let groups: Vec<u32> = nix::unistd::getgroups()
        .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
        .unwrap_or_default();
    // SAFETY: getgid takes nothing and cannot fail.
    let gid = unsafe { libc::getgid() };
    by_user
        || v.groups
            .iter()
            .any(|g| crate::sys::gid_of(g).is_ok_and(|id| id == gid || groups.contains(&id)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_cluster_grants_it_the_default_vnode_or_says_it_grants_none() {
        // SAFETY: getuid takes nothing and cannot fail.
        let uid = unsafe { libc::getuid() };
        let mut cfg = ClusterConfig::embedded();
        if userfaultfd() {
            fit(&mut cfg, uid).unwrap();
            assert_eq!(cfg.vnode.len(), 1);
            assert!(grants(&cfg.vnode[0], uid));
            cfg.vnode[0].users = vec![(uid + 1).to_string()];
            assert!(matches!(fit(&mut cfg, uid), Err(AsUserError::NoVnode { .. })));
        } else {
            assert!(matches!(fit(&mut cfg, uid), Err(AsUserError::NoUserfaultfd { .. })));
        }
        // No pComponent here: nothing to run programs on, nothing to grant.
        let mut cfg = ClusterConfig {
            pcomponent: Vec::new(),
            ..ClusterConfig::embedded()
        };
        fit(&mut cfg, uid).unwrap();
        assert!(cfg.vnode.is_empty());
    }
}
