//! vNodes: their names, who may use them, and their memory quotas (`[[vnode]]`).
use serde::{Deserialize, Serialize};

use super::{ConfigError, Size, PAGE};

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
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_vnode_name(&self.name).map_err(ConfigError::VnodeName)?;
        for u in &self.users {
            crate::sys::uid_of(u).map_err(ConfigError::User)?;
        }
        for g in &self.groups {
            crate::sys::gid_of(g).map_err(ConfigError::Group)?;
        }
        match self.memory {
            Some(m) if m.0 < PAGE => Err(ConfigError::MemoryQuota(m.0)),
            _ => Ok(()),
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

#[cfg(test)]
mod tests {
    #[test]
    fn a_vnodes_memory_quota_is_a_size_of_at_least_a_page() {
        let check = |memory: &str| {
            toml::from_str::<crate::config::ClusterConfig>(&format!(
                "[[pcomponent]]\n[[mcomponent]]\n[[vnode]]\nname = \"lab\"\nusers = [\"root\"]\nmemory = {memory}\n"
            ))
            .map_err(|e| e.to_string())
            .and_then(|c| c.validate().map(|()| c).map_err(|e| e.to_string()))
        };
        assert_eq!(
            check("\"256M\"").unwrap().vnode[0].memory,
            Some(crate::config::Size(256 << 20))
        );
        assert!(check("\"1K\"").unwrap_err().contains("vnode[0].memory"));
        assert!(check("\"lots\"").unwrap_err().contains("\"lots\""));
    }
}
