//! The join tokens outstanding (docs/deployment.md#joining-a-machine): a token the admin made
//! for a role, which a new machine trades once, before it expires, for credentials of that role
//! issued by the cluster's authority. The managers keep only its secret's SHA-256, in their
//! state (table `join-tokens`), so that another manager, or this one restarted, honours it.
//!
//! They are the managers' own state, as the REST API's tokens are (gm/tokens.rs): the REST API
//! (api/join.rs) makes and redeems tokens through them, and `splitos join` reads a token's
//! parts with [`parse`].
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use splitos_rpc::auth::Authority;
use splitos_rpc::Role;

use splitos_core::state::{Store, Table};

const JOIN_TOKENS: Table = Table("join-tokens");
const PREFIX: &str = "splitos-join_";
/// The longest a join token lasts.
pub const MAX_TTL_S: u64 = 7 * 24 * 3600;
/// The most join tokens outstanding: each is kept until it is used or expires.
const MAX_TOKENS: usize = 1024;

/// Why a join token was not made, or a machine presenting one was not let in.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error("the REST API serves no HTTPS here: a machine joins only over HTTPS (serve the API beyond loopback)")]
    NoHttps,
    #[error("these global managers hold no authority to issue credentials with (splitos gm --authority)")]
    NoAuthority,
    #[error("a join token is for a component; the admin's credentials are not handed out")]
    Admin,
    #[error("ttl_s: {0} is not between 1 and {MAX_TTL_S} seconds")]
    Ttl(u64),
    #[error("{MAX_TOKENS} join tokens are outstanding: let some be used or expire")]
    TooMany,
    #[error("the kernel's random generator: {0}")]
    Random(std::io::Error),
    #[error("cannot keep the join token: {0}")]
    Keep(anyhow::Error),
    #[error("not a valid join token (used, expired, revoked, or never made)")]
    NotValid,
    #[error("cannot use the join token up: {0}")]
    UseUp(anyhow::Error),
    #[error("cannot issue credentials: {0}")]
    Issue(splitos_rpc::auth::AuthError),
    #[error("cannot encode the credentials: {0}")]
    Encode(postcard::Error),
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    s.len().is_multiple_of(2).then_some(())?;
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The pin of a certificate authority: its PEM's SHA-256, in hex.
pub fn pin(ca_pem: &str) -> String {
    hex(&Sha256::digest(ca_pem.as_bytes()))
}

#[derive(Clone, Serialize, Deserialize)]
struct Stored {
    id: String,
    hash: [u8; 32],
    role: Role,
    expires_unix_s: u64,
}

/// A token's parts: its id, its secret and the pin of the authority it trusts.
pub struct Parsed<'a> {
    pub id: &'a str,
    pub secret: &'a str,
    pub pin: &'a str,
}

pub fn parse(token: &str) -> Option<Parsed<'_>> {
    let mut parts = token.strip_prefix(PREFIX)?.split('_');
    let p = Parsed {
        id: parts.next()?,
        secret: parts.next()?,
        pin: parts.next()?,
    };
    (parts.next().is_none() && p.pin.len() == 64).then_some(p)
}

/// The join tokens outstanding, and what the managers need to honour them.
pub struct JoinTokens {
    store: Store,
    by_id: Mutex<Vec<Stored>>,
    /// The authority that issues the components' credentials (`splitos gm --authority`).
    authority: Option<Authority>,
    /// The API's certificate authority, whose pin the tokens carry (`--api-ca`).
    pub ca_pem: Option<String>,
}

impl JoinTokens {
    pub fn open(store: Store, authority: Option<Authority>, ca_pem: Option<String>) -> anyhow::Result<JoinTokens> {
        let by_id = store.load::<Stored>(JOIN_TOKENS)?;
        Ok(JoinTokens {
            store,
            by_id: Mutex::new(by_id),
            authority,
            ca_pem,
        })
    }

    /// A new token for `role`, lasting `ttl_s`.
    pub fn create(&self, role: Role, ttl_s: u64) -> Result<(String, u64), JoinError> {
        let ca = self.ca_pem.as_deref().ok_or(JoinError::NoHttps)?;
        self.authority.as_ref().ok_or(JoinError::NoAuthority)?;
        if role == Role::Admin {
            return Err(JoinError::Admin);
        }
        if ttl_s == 0 || ttl_s > MAX_TTL_S {
            return Err(JoinError::Ttl(ttl_s));
        }
        let mut by_id = self.by_id.lock().unwrap();
        by_id.retain(|s| s.expires_unix_s > now_s());
        if by_id.len() >= MAX_TOKENS {
            return Err(JoinError::TooMany);
        }
        let id = hex(&splitos_rpc::auth::random::<8>().map_err(JoinError::Random)?);
        let secret = hex(&splitos_rpc::auth::random::<32>().map_err(JoinError::Random)?);
        let stored = Stored {
            id: id.clone(),
            hash: Sha256::digest(secret.as_bytes()).into(),
            role,
            expires_unix_s: now_s() + ttl_s,
        };
        self.store
            .put(JOIN_TOKENS, &id, Some(&stored))
            .map_err(JoinError::Keep)?;
        by_id.push(stored.clone());
        Ok((format!("{PREFIX}{id}_{secret}_{}", pin(ca)), stored.expires_unix_s))
    }

    /// Uses up `token` (once, before it expires) and issues credentials of its role.
    pub fn redeem(&self, token: &str) -> Result<(Role, Vec<u8>), JoinError> {
        let p = parse(token).ok_or(JoinError::NotValid)?;
        let mut by_id = self.by_id.lock().unwrap();
        let at = by_id.iter().position(|s| s.id == p.id).ok_or(JoinError::NotValid)?;
        let s = by_id[at].clone();
        let h: [u8; 32] = Sha256::digest(p.secret.as_bytes()).into();
        // Constant time: how much of a guess matched must not show in the answer's timing.
        if h.iter().zip(s.hash.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 || s.expires_unix_s <= now_s() {
            return Err(JoinError::NotValid);
        }
        // Used up before anything is issued: a token that cannot be struck off issues nothing.
        self.store
            .put::<Stored>(JOIN_TOKENS, &s.id, None)
            .map_err(JoinError::UseUp)?;
        by_id.remove(at);
        let authority = self.authority.as_ref().ok_or(JoinError::NoAuthority)?;
        let creds = authority.issue(s.role).map_err(JoinError::Issue)?;
        Ok((s.role, postcard::to_allocvec(&creds).map_err(JoinError::Encode)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(file: &std::path::Path) -> JoinTokens {
        JoinTokens::open(
            Store::for_test(file),
            Some(Authority::generate().unwrap()),
            Some("-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n".into()),
        )
        .unwrap()
    }

    #[test]
    fn a_join_token_works_once_for_its_role_until_it_expires_and_outlives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("state.redb");
        let j = tokens(&file);
        let (token, _) = j.create(Role::Mem, 3600).unwrap();
        assert_eq!(parse(&token).unwrap().pin, pin(j.ca_pem.as_deref().unwrap()));
        let wrong = format!(
            "{}0_{}",
            &token[..PREFIX.len() + 16 + 1],
            &token[PREFIX.len() + 16 + 1 + 65..]
        );
        assert!(j.redeem(&wrong).is_err(), "another secret");
        drop(j);
        // Kept in the managers' state: another manager (or this one restarted) honours it.
        let j = tokens(&file);
        let (role, creds) = j.redeem(&token).unwrap();
        assert_eq!(role, Role::Mem);
        let c: splitos_rpc::auth::Credentials = postcard::from_bytes(&creds).unwrap();
        assert_eq!(c.role, Role::Mem);
        assert!(matches!(j.redeem(&token), Err(JoinError::NotValid)), "once");
        drop(j);
        assert!(tokens(&file).redeem(&token).is_err(), "used up in the state too");
        let j = tokens(&file);
        let (short, _) = j.create(Role::Proc, 1).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2100));
        assert!(j.redeem(&short).is_err(), "expired");
        assert!(
            j.create(Role::Admin, 60).is_err()
                && j.create(Role::Mem, 0).is_err()
                && j.create(Role::Mem, MAX_TTL_S + 1).is_err()
        );
        assert!(parse("splitos_abc_def").is_none() && parse(&format!("{PREFIX}a_b_c")).is_none());
    }

    #[test]
    fn without_https_or_an_authority_no_token_is_made() {
        let no_tls = JoinTokens::open(Store::default(), Some(Authority::generate().unwrap()), None).unwrap();
        assert!(matches!(no_tls.create(Role::Mem, 60), Err(JoinError::NoHttps)));
        let no_authority = JoinTokens::open(Store::default(), None, Some("pem".into())).unwrap();
        assert!(matches!(
            no_authority.create(Role::Mem, 60),
            Err(JoinError::NoAuthority)
        ));
    }
}
