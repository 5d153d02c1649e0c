//! The vNodes the admin made: `[[vnode]]` tables of the cluster's configuration, made again at
//! every start of the global managers, and those made through the REST API, kept in the
//! managers' state file so that they outlive a restart. Each has the users and groups it is
//! granted to and its memory quota. pComponents follow the table by its version (in every
//! heartbeat's answer) and grant what it says; the managers give a vNode's quota to the home
//! of its processes.
//!
//! A vNode not in the table is root's alone, as before any was made.
use std::collections::BTreeMap;
use std::sync::Mutex;

use splitos_rpc::VnodeInfo;

use splitos_core::config::{ConfigError, VnodeConfig};
use splitos_core::state::{Store, Table as StateTable};

const VNODES: StateTable = StateTable("vnodes");

/// Why a change to the table was refused.
#[derive(Debug, thiserror::Error)]
pub enum VnodeError {
    /// A name, user, group or quota that is not valid.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    #[error("a vNode named {0:?} exists")]
    Exists(String),
    #[error("no vNode is named {0:?}")]
    NotFound(String),
    /// The state file could not be written: nothing changed.
    #[error("cannot keep the vNodes: {0}")]
    Store(anyhow::Error),
}

struct Table {
    /// Changes with every change of `by_name`, and differs across starts of the managers, so
    /// that a pComponent never keeps a table it did not get from these managers.
    version: u64,
    by_name: BTreeMap<String, VnodeInfo>,
}

pub struct Vnodes {
    store: Store,
    table: Mutex<Table>,
}

fn new_version(old: u64) -> u64 {
    // Random, not counted: a counter would start again at the same value after a restart.
    let v = splitos_rpc::auth::random_u64();
    if v == old || v == 0 {
        old.wrapping_add(1).max(1)
    } else {
        v
    }
}

/// Checks a vNode as the managers' host sees its users and groups: a name it does not know is
/// an error, not a grant to nobody.
fn check(v: &VnodeInfo) -> Result<(), VnodeError> {
    let cfg = VnodeConfig {
        name: v.name.clone(),
        users: v.users.clone(),
        groups: v.groups.clone(),
        memory: v.memory.map(splitos_core::config::Size),
    };
    Ok(cfg.validate()?)
}

impl Vnodes {
    /// The table of the managers' state, with the configuration's vNodes made again over
    /// what it kept.
    pub fn open(store: Store, configured: &[VnodeConfig]) -> anyhow::Result<Vnodes> {
        let by_name = store
            .load::<VnodeInfo>(VNODES)?
            .into_iter()
            .map(|v| (v.name.clone(), v))
            .collect();
        let vnodes = Vnodes {
            store,
            table: Mutex::new(Table {
                version: new_version(0),
                by_name,
            }),
        };
        for c in configured {
            let v = VnodeInfo {
                name: c.name.clone(),
                users: c.users.clone(),
                groups: c.groups.clone(),
                memory: c.memory.map(|m| m.0),
            };
            check(&v).map_err(|e| anyhow::anyhow!("vNode {:?}: {e}", v.name))?;
            vnodes.save(&v.name, Some(&v)).map_err(|e| anyhow::anyhow!("{e}"))?;
            vnodes.table.lock().unwrap().by_name.insert(v.name.clone(), v);
        }
        Ok(vnodes)
    }

    fn save(&self, name: &str, v: Option<&VnodeInfo>) -> Result<(), VnodeError> {
        self.store.put(VNODES, name, v).map_err(VnodeError::Store)
    }

    pub fn create(&self, v: VnodeInfo) -> Result<(), VnodeError> {
        check(&v)?;
        let mut t = self.table.lock().unwrap();
        if t.by_name.contains_key(&v.name) {
            return Err(VnodeError::Exists(v.name));
        }
        self.save(&v.name, Some(&v))?;
        t.by_name.insert(v.name.clone(), v);
        t.version = new_version(t.version);
        Ok(())
    }

    pub fn delete(&self, name: &str) -> Result<VnodeInfo, VnodeError> {
        let mut t = self.table.lock().unwrap();
        if !t.by_name.contains_key(name) {
            return Err(VnodeError::NotFound(name.to_string()));
        }
        self.save(name, None)?;
        t.version = new_version(t.version);
        Ok(t.by_name.remove(name).expect("checked above"))
    }

    pub fn get(&self, name: &str) -> Option<VnodeInfo> {
        self.table.lock().unwrap().by_name.get(name).cloned()
    }

    /// The table's version and every vNode, by name.
    pub fn list(&self) -> (u64, Vec<VnodeInfo>) {
        let t = self.table.lock().unwrap();
        (t.version, t.by_name.values().cloned().collect())
    }

    pub fn version(&self) -> u64 {
        self.table.lock().unwrap().version
    }

    pub fn quota(&self, name: &str) -> Option<u64> {
        self.table.lock().unwrap().by_name.get(name).and_then(|v| v.memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lab(users: &[&str]) -> VnodeInfo {
        VnodeInfo {
            name: "lab".into(),
            users: users.iter().map(|u| u.to_string()).collect(),
            groups: Vec::new(),
            memory: Some(1 << 20),
        }
    }

    #[test]
    fn vnodes_outlive_a_restart_and_each_change_moves_the_version() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state.redb");
        let v = Vnodes::open(Store::for_test(&file), &[]).unwrap();
        let v0 = v.version();
        v.create(lab(&["0"])).unwrap();
        assert_ne!(v.version(), v0);
        assert!(matches!(v.create(lab(&["0"])), Err(VnodeError::Exists(n)) if n == "lab"));
        assert!(matches!(
            v.create(VnodeInfo {
                name: "../x".into(),
                ..lab(&[])
            }),
            Err(VnodeError::Invalid(_))
        ));
        assert!(matches!(
            v.create(VnodeInfo {
                name: "ghosts".into(),
                ..lab(&["no-such-user-here"])
            }),
            Err(VnodeError::Invalid(_))
        ));
        assert_eq!(v.quota("lab"), Some(1 << 20));
        let before = v.version();
        drop(v);
        let again = Vnodes::open(Store::for_test(&file), &[]).unwrap();
        assert_eq!(again.get("lab"), Some(lab(&["0"])));
        assert_ne!(again.version(), before, "a restart gives a version no pComponent holds");
        assert_eq!(again.delete("lab").unwrap().name, "lab");
        assert!(matches!(again.delete("lab"), Err(VnodeError::NotFound(n)) if n == "lab"));
        assert!(again.list().1.is_empty());
    }
}
