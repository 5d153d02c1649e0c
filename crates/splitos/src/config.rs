//! The cluster configuration file (TOML). Every field is documented in docs/configuration.md;
//! a bad file is refused with a message naming the field.
use std::path::Path;

use serde::Deserialize;

/// A byte size: a number, or a string with a K/M/G/T suffix (powers of 1024).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                'B' => 1,
                _ => return Err(format!("{s:?}: unknown size suffix {c:?} (use K, M, G or T)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size (examples: 4096, 64M, 1G)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Size(n)),
            Raw::S(s) => parse_size(&s).map(Size).map_err(serde::de::Error::custom),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Where the global managers listen.
    #[serde(default = "default_gm")]
    pub gm: String,
    #[serde(default = "default_vregion")]
    pub vregion_size: Size,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcompSection {
    #[serde(default = "default_listen")]
    pub listen: String,
    #[serde(default = "default_excache")]
    pub excache: Size,
    #[serde(default = "default_ways")]
    pub ways: usize,
    #[serde(default = "default_policy")]
    pub policy: String,
    #[serde(default = "yes")]
    pub piggyback: bool,
    #[serde(default = "default_fault_workers")]
    pub fault_workers: usize,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McompSection {
    #[serde(default = "default_listen")]
    pub listen: String,
    #[serde(default = "default_capacity")]
    pub capacity: Size,
    /// Worker threads for data-path requests; 0 serves them on each connection's receiving thread.
    #[serde(default)]
    pub workers: usize,
    /// Storage buffer cache this mComponent holds for files placed on it.
    #[serde(default = "default_bcache")]
    pub bcache: Size,
    /// Largest read-ahead window for sequential file reads; 0 turns it off.
    #[serde(default = "default_readahead")]
    pub readahead: Size,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScompSection {
    #[serde(default = "default_listen")]
    pub listen: String,
    /// Where files are kept (default: the data directory's `storage`, see docs/storage.md).
    pub dir: Option<std::path::PathBuf>,
    /// Bytes of file data this sComponent stores for all vNodes together.
    #[serde(default = "default_quota")]
    pub quota: Size,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    #[serde(default = "default_cluster")]
    pub cluster: ClusterSection,
    #[serde(default)]
    pub pcomponent: Vec<PcompSection>,
    #[serde(default)]
    pub mcomponent: Vec<McompSection>,
    /// Storage components; without one, runs get no vNode file system.
    #[serde(default)]
    pub scomponent: Vec<ScompSection>,
}

fn default_gm() -> String {
    "127.0.0.1:0".into()
}
fn default_vregion() -> Size {
    Size(1 << 30)
}
fn default_listen() -> String {
    "127.0.0.1:0".into()
}
fn default_excache() -> Size {
    Size(64 << 20)
}
fn default_ways() -> usize {
    8
}
fn default_policy() -> String {
    "fifo".into()
}
fn yes() -> bool {
    true
}
fn default_fault_workers() -> usize {
    1
}
fn default_capacity() -> Size {
    Size(8 << 30)
}
fn default_bcache() -> Size {
    Size(256 << 20)
}
fn default_readahead() -> Size {
    Size(128 << 10)
}
fn default_quota() -> Size {
    Size(16 << 30)
}
fn default_cluster() -> ClusterSection {
    ClusterSection { gm: default_gm(), vregion_size: default_vregion() }
}

pub fn default_pcomp() -> PcompSection {
    PcompSection { listen: default_listen(), excache: default_excache(), ways: default_ways(), policy: default_policy(), piggyback: true, fault_workers: default_fault_workers() }
}

pub fn default_mcomp() -> McompSection {
    McompSection { listen: default_listen(), capacity: default_capacity(), workers: 0, bcache: default_bcache(), readahead: default_readahead() }
}

pub fn default_scomp() -> ScompSection {
    ScompSection { listen: default_listen(), dir: None, quota: default_quota() }
}

impl ClusterConfig {
    /// The embedded cluster: global managers, one pComponent, two mComponents, one sComponent.
    pub fn embedded() -> ClusterConfig {
        ClusterConfig { cluster: default_cluster(), pcomponent: vec![default_pcomp()], mcomponent: vec![default_mcomp(), default_mcomp()], scomponent: vec![default_scomp()] }
    }

    pub fn load(path: &Path) -> Result<ClusterConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        let c: ClusterConfig = toml::from_str(&text).map_err(|e| format!("config {}: {e}", path.display()))?;
        c.validate().map_err(|e| format!("config {}: {e}", path.display()))?;
        Ok(c)
    }

    pub fn validate(&self) -> Result<(), String> {
        let vrs = self.cluster.vregion_size.0;
        if vrs < 4096 || !vrs.is_power_of_two() {
            return Err(format!("cluster.vregion_size: {vrs} must be a power of two of at least 4096"));
        }
        if self.pcomponent.is_empty() {
            return Err("pcomponent: at least one [[pcomponent]] is needed".into());
        }
        if self.mcomponent.is_empty() {
            return Err("mcomponent: at least one [[mcomponent]] is needed".into());
        }
        for (i, p) in self.pcomponent.iter().enumerate() {
            if p.excache.0 < 4096 {
                return Err(format!("pcomponent[{i}].excache: {} bytes is less than one 4 KiB line", p.excache.0));
            }
            if crate::pmon::policy_by_name(&p.policy).is_none() {
                return Err(format!("pcomponent[{i}].policy: unknown policy {:?} (known: {})", p.policy, crate::pmon::POLICIES.join(", ")));
            }
            if p.fault_workers == 0 {
                return Err(format!("pcomponent[{i}].fault_workers: must be at least 1"));
            }
        }
        for (i, m) in self.mcomponent.iter().enumerate() {
            if m.capacity.0 < 4096 {
                return Err(format!("mcomponent[{i}].capacity: {} bytes is less than one page", m.capacity.0));
            }
            if m.bcache.0 < 4096 {
                return Err(format!("mcomponent[{i}].bcache: {} bytes is less than one 4 KiB block", m.bcache.0));
            }
        }
        let mut dirs = std::collections::HashSet::new();
        for (i, s) in self.scomponent.iter().enumerate() {
            if s.quota.0 == 0 {
                return Err(format!("scomponent[{i}].quota: must be more than 0"));
            }
            if !dirs.insert(s.dir.clone()) {
                return Err(format!("scomponent[{i}].dir: two sComponents cannot share a storage directory"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn bad_fields_are_named() {
        let e = toml::from_str::<ClusterConfig>("[[pcomponent]]\nexcahce = \"1M\"\n").unwrap_err().to_string();
        assert!(e.contains("excahce"), "{e}");
        let c: ClusterConfig = toml::from_str("[[pcomponent]]\npolicy = \"lfu\"\n[[mcomponent]]\n").unwrap();
        assert!(c.validate().unwrap_err().contains("pcomponent[0].policy"));
        let e = toml::from_str::<ClusterConfig>("[[mcomponent]]\ncapacity = \"9X\"\n").unwrap_err().to_string();
        assert!(e.contains("capacity") || e.contains("9X"), "{e}");
    }
}
