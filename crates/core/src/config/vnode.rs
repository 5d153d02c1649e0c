//! vNodes: their names, who may use them, and their memory quotas (`[[vnode]]`).
use serde::{Deserialize, Serialize};

use super::{Size, PAGE};

/// A vNode granted to users of the pComponents' hosts: a `[[vnode]]` table (a vNode not listed
/// is root's alone). `cluster up` gives it to the global managers, which tell the pComponents
/// whom it is granted to and its home its quota; the REST API makes more at run time
/// (`POST /api/v1/vnodes` takes this).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VnodeConfig {
    /// 1-128 characters, no '/', not starting with '.'.
    pub name: String,
    /// Users (names or numeric uids) who may run programs on it and see its files.
    #[serde(default)]
    pub users: Vec<String>,
    /// Groups (names or numeric gids) whose members may.
    #[serde(default)]
    pub groups: Vec<String>,
    /// Memory all its processes together may map writable across the cluster (their heaps,
    /// as strict overcommit charges them); a mapping beyond it fails with ENOMEM. Its home
    /// keeps that much memory for it, which no other vNode takes. Unset: no quota. A size
    /// ("256M", "8G") or a number of bytes.
    #[schema(value_type = Option<String>)]
    pub memory: Option<Size>,
}

impl VnodeConfig {
    /// Names are resolved now: a user or group this host does not know is an error, not a
    /// grant to nobody. An error names the field it is about.
    pub fn validate(&self) -> Result<(), String> {
        check_vnode_name(&self.name).map_err(|e| format!("name: {e}"))?;
        for u in &self.users {
            crate::sys::uid_of(u).map_err(|e| format!("users: {e}"))?;
        }
        for g in &self.groups {
            crate::sys::gid_of(g).map_err(|e| format!("groups: {e}"))?;
        }
        match self.memory {
            Some(m) => check_memory_quota(m.0).map_err(|e| format!("memory: {e}")),
            None => Ok(()),
        }
    }
}

/// A vNode's name is a directory name under a pComponent's mount root.
pub fn check_vnode_name(vnode: &str) -> Result<(), BadVnodeName> {
    if vnode.is_empty() || vnode.len() > 128 || vnode.contains('/') || vnode.starts_with('.') {
        return Err(BadVnodeName(vnode.to_string()));
    }
    Ok(())
}

/// A name no vNode can have (a file-system path component, and a label of metrics).
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a vNode name (1-128 characters, no '/', not starting with '.')")]
pub struct BadVnodeName(pub String);

impl splitos_rpc::Refuse for BadVnodeName {
    fn code(&self) -> splitos_rpc::ErrCode {
        splitos_rpc::ErrCode::Invalid
    }
}

fn check_memory_quota(bytes: u64) -> Result<(), String> {
    match bytes < PAGE {
        true => Err(format!("a memory quota of {bytes} bytes is less than one 4 KiB page")),
        false => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_vnodes_memory_quota_is_a_size_of_at_least_a_page() {
        let check = |memory: &str| {
            toml::from_str::<crate::config::ClusterConfig>(&format!(
                "[[pcomponent]]\n[[mcomponent]]\n[[vnode]]\nname = \"lab\"\nusers = [\"root\"]\nmemory = {memory}\n"
            ))
            .map_err(|e| e.to_string())
            .and_then(|c| c.validate().map(|()| c))
        };
        assert_eq!(
            check("\"256M\"").unwrap().vnode[0].memory,
            Some(crate::config::Size(256 << 20))
        );
        assert!(check("\"1K\"").unwrap_err().contains("vnode[0].memory"));
        assert!(check("\"lots\"").unwrap_err().contains("\"lots\""));
    }
}
