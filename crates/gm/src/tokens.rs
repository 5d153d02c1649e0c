//! The REST API's bearer tokens: who may call it, and as whom.
//!
//! They are the managers' state (table `tokens`), not the API's: the managers keep them, hand
//! a component the principal of a token it was shown (`X2G_API_TOKEN`), and serve their metrics
//! to an admin token; the REST API (api/) checks each request against them.
//!
//! A token reads `splitos_ID_SECRET`: ID names its entry, SECRET is 32 random bytes in hex.
//! Only the SHA-256 of the secret is kept (in memory, and in the managers' state file when
//! they have one), so the file does not let anyone in, and a token is checked by hashing
//! what the caller sent and comparing in constant time.
use std::collections::HashMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use splitos_rpc::{ErrCode, Refuse, TokenInfo};

use splitos_core::state::{Store, Table};

const TOKENS: Table = Table("tokens");
const PREFIX: &str = "splitos_";

/// Whom a request speaks for, from the token it carried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// Sees and changes everything.
    Admin { token: String },
    /// Sees and changes only what belongs to these vNodes.
    Tenant { token: String, vnodes: Vec<String> },
}

impl Principal {
    /// The token's name, for the logs.
    pub fn name(&self) -> &str {
        match self {
            Principal::Admin { token } | Principal::Tenant { token, .. } => token,
        }
    }

    pub fn may_see_vnode(&self, vnode: &str) -> bool {
        match self {
            Principal::Admin { .. } => true,
            Principal::Tenant { vnodes, .. } => vnodes.iter().any(|v| v == vnode),
        }
    }
}

#[derive(Clone, Serialize, Deserialize)]
struct Stored {
    id: String,
    hash: [u8; 32],
    info: TokenInfo,
}

/// The tokens, by name.
pub struct Tokens {
    store: Store,
    by_name: Mutex<HashMap<String, Stored>>,
}

fn hash(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why an API token was not made or revoked.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// A name an operator can type and a log line can carry as it is.
    #[error("a token's name is 1 to 64 letters, digits, '-', '_' or '.', not {0:?}")]
    Name(String),
    #[error("an admin token sees every vNode: name none")]
    AdminWithVnodes,
    #[error("a tenant token needs at least one vNode")]
    TenantWithoutVnodes,
    #[error(transparent)]
    Vnode(#[from] splitos_core::config::BadVnodeName),
    #[error("a token named {0:?} exists: revoke it first")]
    Exists(String),
    #[error("the kernel's random generator: {0}")]
    Random(std::io::Error),
    #[error("cannot keep the token: {0}")]
    Keep(anyhow::Error),
    #[error("cannot forget the token: {0}")]
    Forget(anyhow::Error),
    #[error("no API token is named {0:?}")]
    NoSuch(String),
}

/// A token that could not be made is the asker's to fix; one the state could not forget is not.
impl Refuse for TokenError {
    fn code(&self) -> ErrCode {
        match self {
            TokenError::Forget(_) => ErrCode::Internal,
            TokenError::NoSuch(_) => ErrCode::NotFound,
            _ => ErrCode::Invalid,
        }
    }
}

fn check_name(name: &str) -> Result<(), TokenError> {
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return Err(TokenError::Name(name.to_string()));
    }
    Ok(())
}

impl Tokens {
    /// The tokens of the managers' state.
    pub fn open(store: Store) -> anyhow::Result<Tokens> {
        let by_name = store
            .load::<Stored>(TOKENS)?
            .into_iter()
            .map(|s| (s.info.name.clone(), s))
            .collect();
        Ok(Tokens {
            store,
            by_name: Mutex::new(by_name),
        })
    }

    fn save(&self, name: &str, entry: Option<&Stored>) -> anyhow::Result<()> {
        self.store.put(TOKENS, name, entry)
    }

    /// Makes a token and returns its secret form, which is not kept.
    pub fn create(&self, name: &str, admin: bool, vnodes: Vec<String>) -> Result<String, TokenError> {
        check_name(name)?;
        match (admin, vnodes.is_empty()) {
            (true, false) => return Err(TokenError::AdminWithVnodes),
            (false, true) => return Err(TokenError::TenantWithoutVnodes),
            _ => {}
        }
        for v in &vnodes {
            splitos_core::config::check_vnode_name(v)?;
        }
        let mut by_name = self.by_name.lock().unwrap();
        if by_name.contains_key(name) {
            return Err(TokenError::Exists(name.to_string()));
        }
        let id = hex(&splitos_rpc::auth::random::<8>().map_err(TokenError::Random)?);
        let secret = hex(&splitos_rpc::auth::random::<32>().map_err(TokenError::Random)?);
        let created_unix_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let stored = Stored {
            id: id.clone(),
            hash: hash(&secret),
            info: TokenInfo {
                name: name.to_string(),
                admin,
                vnodes,
                created_unix_s,
            },
        };
        self.save(name, Some(&stored)).map_err(TokenError::Keep)?;
        by_name.insert(name.to_string(), stored);
        Ok(format!("{PREFIX}{id}_{secret}"))
    }

    pub fn list(&self) -> Vec<TokenInfo> {
        let mut v: Vec<TokenInfo> = self.by_name.lock().unwrap().values().map(|s| s.info.clone()).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// False if no token has that name.
    pub fn revoke(&self, name: &str) -> Result<bool, TokenError> {
        let mut by_name = self.by_name.lock().unwrap();
        if !by_name.contains_key(name) {
            return Ok(false);
        }
        self.save(name, None).map_err(TokenError::Forget)?;
        by_name.remove(name);
        Ok(true)
    }

    /// Whom `token` speaks for, or None if it is not a live token.
    pub fn check(&self, token: &str) -> Option<Principal> {
        let (id, secret) = token.strip_prefix(PREFIX)?.split_once('_')?;
        let by_name = self.by_name.lock().unwrap();
        let s = by_name.values().find(|s| s.id == id)?;
        let h = hash(secret);
        // Constant time: how much of a guess matched must not show in the answer's timing.
        if h.iter().zip(s.hash.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
            return None;
        }
        let token = s.info.name.clone();
        Some(if s.info.admin {
            Principal::Admin { token }
        } else {
            Principal::Tenant {
                token,
                vnodes: s.info.vnodes.clone(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db(file: &std::path::Path) -> Store {
        Store::for_test(file)
    }

    #[test]
    fn a_token_is_checked_by_its_hash_and_revoked_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.redb");
        let t = Tokens::open(db(&file)).unwrap();
        let admin = t.create("ops", true, Vec::new()).unwrap();
        let lab = t.create("lab-ci", false, vec!["lab".into()]).unwrap();
        assert_eq!(t.check(&admin), Some(Principal::Admin { token: "ops".into() }));
        assert_eq!(
            t.check(&lab),
            Some(Principal::Tenant {
                token: "lab-ci".into(),
                vnodes: vec!["lab".into()]
            })
        );
        // One changed character of the secret, a token without its prefix, garbage: nobody.
        let mut wrong = lab.clone();
        let last = wrong.pop().unwrap();
        wrong.push(if last == '0' { '1' } else { '0' });
        for bad in [
            wrong.as_str(),
            &lab[PREFIX.len()..],
            "",
            "splitos_",
            "splitos__",
            "Bearer x",
        ] {
            assert_eq!(t.check(bad), None, "{bad:?}");
        }
        assert!(matches!(t.create("ops", true, Vec::new()), Err(TokenError::Exists(n)) if n == "ops"));
        assert!(t.create("x", true, vec!["lab".into()]).is_err());
        assert!(t.create("y", false, Vec::new()).is_err());
        assert!(t.create("no spaces", true, Vec::new()).is_err());
        drop(t);
        // The file keeps hashes, not secrets, and the tokens outlive the process.
        let raw = std::fs::read(&file).unwrap();
        let secret = admin.rsplit('_').next().unwrap();
        assert!(!raw.windows(secret.len()).any(|w| w == secret.as_bytes()));
        let t = Tokens::open(db(&file)).unwrap();
        assert_eq!(
            t.list().iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
            ["lab-ci", "ops"]
        );
        assert!(t.check(&admin).is_some());
        assert!(t.revoke("ops").unwrap());
        assert!(!t.revoke("ops").unwrap());
        assert_eq!(t.check(&admin), None);
        drop(t);
        assert_eq!(Tokens::open(db(&file)).unwrap().check(&admin), None);
    }
}
