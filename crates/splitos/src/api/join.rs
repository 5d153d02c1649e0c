//! Joining a machine to the cluster (docs/deployment.md#joining-a-machine): the admin makes a
//! join token for a role (`POST /api/v1/join-tokens`, `splitos cluster join-token`), and
//! `splitos join --token T API` on the new machine trades it for credentials of that role,
//! issued by the cluster's authority, over the API's HTTPS.
//!
//! A token is single use and expires; the managers keep only its secret's SHA-256, in their
//! state. It names the SHA-256 of the API's certificate authority (`..._PIN`): the joining
//! machine, which trusts nothing yet, fetches the authority's certificate
//! (`GET /api/v1/join/ca`, public) and checks it against the pin before it sends the token
//! over a connection verified by it.
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{ConnectInfo, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use splitos_rpc::auth::Authority;
use splitos_rpc::Role;

use super::{admin_only, internal, Api, ApiError, Body, ErrorBody, Principal};
use crate::state::{Store, Table};

const JOIN_TOKENS: Table = Table("join-tokens");
const PREFIX: &str = "splitos-join_";
/// The longest a join token lasts.
pub const MAX_TTL_S: u64 = 7 * 24 * 3600;
/// The most join tokens outstanding: each is kept until it is used or expires.
const MAX_TOKENS: usize = 1024;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
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
    ca_pem: Option<String>,
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
    pub fn create(&self, role: Role, ttl_s: u64) -> Result<(String, u64), String> {
        let ca = self.ca_pem.as_deref().ok_or(
            "the REST API serves no HTTPS here: a machine joins only over HTTPS (serve the API beyond loopback)",
        )?;
        self.authority
            .as_ref()
            .ok_or("these global managers hold no authority to issue credentials with (splitos gm --authority)")?;
        if role == Role::Admin {
            return Err("a join token is for a component; the admin's credentials are not handed out".into());
        }
        if ttl_s == 0 || ttl_s > MAX_TTL_S {
            return Err(format!("ttl_s: {ttl_s} is not between 1 and {MAX_TTL_S} seconds"));
        }
        let mut by_id = self.by_id.lock().unwrap();
        by_id.retain(|s| s.expires_unix_s > now_s());
        if by_id.len() >= MAX_TOKENS {
            return Err(format!(
                "{MAX_TOKENS} join tokens are outstanding: let some be used or expire"
            ));
        }
        let id = hex(&splitos_rpc::auth::random::<8>().map_err(|e| e.to_string())?);
        let secret = hex(&splitos_rpc::auth::random::<32>().map_err(|e| e.to_string())?);
        let stored = Stored {
            id: id.clone(),
            hash: Sha256::digest(secret.as_bytes()).into(),
            role,
            expires_unix_s: now_s() + ttl_s,
        };
        self.store
            .put(JOIN_TOKENS, &id, Some(&stored))
            .map_err(|e| format!("cannot keep the join token: {e}"))?;
        by_id.push(stored.clone());
        Ok((format!("{PREFIX}{id}_{secret}_{}", pin(ca)), stored.expires_unix_s))
    }

    /// Uses up `token` (once, before it expires) and issues credentials of its role.
    fn redeem(&self, token: &str) -> Result<(Role, Vec<u8>), String> {
        const REFUSED: &str = "not a valid join token (used, expired, revoked, or never made)";
        let p = parse(token).ok_or(REFUSED)?;
        let mut by_id = self.by_id.lock().unwrap();
        let at = by_id.iter().position(|s| s.id == p.id).ok_or(REFUSED)?;
        let s = by_id[at].clone();
        let h: [u8; 32] = Sha256::digest(p.secret.as_bytes()).into();
        // Constant time: how much of a guess matched must not show in the answer's timing.
        if h.iter().zip(s.hash.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 || s.expires_unix_s <= now_s() {
            return Err(REFUSED.into());
        }
        // Used up before anything is issued: a token that cannot be struck off issues nothing.
        self.store
            .put::<Stored>(JOIN_TOKENS, &s.id, None)
            .map_err(|e| format!("cannot use the join token up: {e}"))?;
        by_id.remove(at);
        let authority = self
            .authority
            .as_ref()
            .ok_or("these global managers hold no authority to issue credentials with")?;
        let creds = authority
            .issue(s.role)
            .map_err(|e| format!("cannot issue credentials: {e}"))?;
        Ok((s.role, postcard::to_allocvec(&creds).map_err(|e| e.to_string())?))
    }
}

/// A join token to make (admin only).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinTokenRequest {
    /// The role the joining machine's component gets: `mcomponent`, `pcomponent`,
    /// `scomponent`, `ncomponent` or `global-managers` (or the subcommand: `mem`, `proc`, ...).
    pub role: String,
    /// How long the token lasts (s); default an hour, at most a week.
    #[serde(default)]
    pub ttl_s: Option<u64>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct JoinTokenView {
    /// Shown once: the managers keep only its hash.
    pub token: String,
    pub role: String,
    pub expires_unix_s: u64,
}

/// Makes a single-use join token for a role (admin only).
#[utoipa::path(post, path = "/api/v1/join-tokens", security(("bearer" = [])), request_body = JoinTokenRequest,
    responses((status = 200, description = "Made", body = JoinTokenView), (status = 400, description = "A bad role or time to live, or no HTTPS", body = ErrorBody), (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody)))]
pub async fn create(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Body(r): Body<JoinTokenRequest>,
) -> Result<Json<JoinTokenView>, ApiError> {
    admin_only(&p, peer, "/api/v1/join-tokens")?;
    let role =
        crate::config::role_named(&r.role).map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("role: {e}")))?;
    let gm = api.gm.clone();
    let (token, expires_unix_s) = tokio::task::spawn_blocking(move || gm.joins.create(role, r.ttl_s.unwrap_or(3600)))
        .await
        .map_err(internal)?
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?;
    tracing::info!(role = role.name(), expires_unix_s, token = p.name(), "join token made");
    Ok(Json(JoinTokenView {
        token,
        role: role.name().into(),
        expires_unix_s,
    }))
}

/// The API's certificate authority (PEM), public: a joining machine checks it against its
/// token's pin before it trusts it.
#[utoipa::path(get, path = "/api/v1/join/ca", responses((status = 200, description = "The authority's certificate", body = String), (status = 404, description = "The API serves no HTTPS", body = ErrorBody)))]
pub async fn ca(State(api): State<Arc<Api>>) -> Result<impl IntoResponse, ApiError> {
    let pem = api
        .gm
        .joins
        .ca_pem
        .clone()
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, "the REST API serves no HTTPS here".into()))?;
    Ok(([(header::CONTENT_TYPE, "application/x-pem-file")], pem))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JoinRequest {
    pub token: String,
}

#[derive(Serialize, Deserialize, utoipa::ToSchema)]
pub struct Joined {
    pub role: String,
    /// The credentials, hex of what `splitos ... --credentials FILE` reads.
    pub credentials: String,
    /// Every global manager alive (`--gm`, comma-separated).
    pub gm: String,
}

/// Trades a join token for credentials of its role (public: the token is the proof). Each
/// token works once.
#[utoipa::path(post, path = "/api/v1/join", request_body = JoinRequest,
    responses((status = 200, description = "Joined", body = Joined), (status = 403, description = "Not a valid join token", body = ErrorBody)))]
pub async fn join(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Body(r): Body<JoinRequest>,
) -> Result<Json<Joined>, ApiError> {
    let gm = api.gm.clone();
    let (answer, managers) =
        tokio::task::spawn_blocking(move || (gm.joins.redeem(&r.token), gm.status_summary().managers))
            .await
            .map_err(internal)?;
    let (role, creds) = answer.map_err(|why| {
        metrics::counter!("gm_joins_refused_total").increment(1);
        static REFUSED: splitos_rpc::refusals::Refusals = splitos_rpc::refusals::Refusals::new("join refused");
        if REFUSED.log_this(peer.ip()) {
            tracing::warn!(%peer, "join refused: {why}");
        }
        ApiError(StatusCode::FORBIDDEN, why)
    })?;
    metrics::counter!("gm_joins_total").increment(1);
    tracing::info!(%peer, role = role.name(), "a machine joined: credentials issued");
    Ok(Json(Joined {
        role: role.name().into(),
        credentials: hex(&creds),
        gm: managers.join(","),
    }))
}

/// `splitos join`: fetches the authority, checks its pin, trades the token, and writes the
/// credentials (and the managers' addresses) in `out`.
pub fn join_cli(token: &str, api: &str, out: &std::path::Path) -> anyhow::Result<()> {
    let p = parse(token).ok_or_else(|| {
        anyhow::anyhow!("not a join token (splitos-join_...; `splitos cluster join-token` makes one)")
    })?;
    let base = if api.starts_with("https://") {
        api.trim_end_matches('/').to_string()
    } else {
        format!("https://{api}")
    };
    // Nothing is trusted yet: the authority's certificate is fetched unverified, and trusted
    // only if its hash is the token's pin.
    let blind = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .timeout_global(Some(std::time::Duration::from_secs(10)))
            .tls_config(ureq::tls::TlsConfig::builder().disable_verification(true).build())
            .build(),
    );
    let pem = blind
        .get(&format!("{base}/api/v1/join/ca"))
        .call()
        .map_err(|e| anyhow::anyhow!("cannot fetch the managers' certificate authority from {base}: {e}"))?
        .into_body()
        .read_to_string()?;
    if pin(&pem) != p.pin {
        anyhow::bail!(
            "the certificate authority at {base} is not the one the join token names: refusing to send the token"
        );
    }
    let cert = ureq::tls::Certificate::from_pem(pem.as_bytes())
        .map_err(|e| anyhow::anyhow!("the managers' certificate authority: {e}"))?;
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::new_with_certs(&[cert]))
        .build();
    let agent = ureq::Agent::new_with_config(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(10)))
            .tls_config(tls)
            .build(),
    );
    let mut resp = agent
        .post(&format!("{base}/api/v1/join"))
        .send_json(serde_json::json!({ "token": token }))
        .map_err(|e| anyhow::anyhow!("{base}: {e}"))?;
    if !resp.status().is_success() {
        let v: serde_json::Value = resp.body_mut().read_json().unwrap_or_default();
        anyhow::bail!(
            "join refused ({}): {}",
            resp.status(),
            v["error"].as_str().unwrap_or("?")
        );
    }
    let j: Joined = resp.body_mut().read_json()?;
    let creds =
        unhex(&j.credentials).ok_or_else(|| anyhow::anyhow!("the managers sent credentials that are not hex"))?;
    let role = Role::from_name(&j.role)
        .ok_or_else(|| anyhow::anyhow!("the managers issued credentials of an unknown role {:?}", j.role))?;
    let sub = crate::config::subcommand(role);
    crate::trusted::own_dir(out, 0o700)?;
    let (cred, ca, env) = (
        out.join(format!("{}.cred", sub)),
        out.join("ca.pem"),
        out.join(format!("{}.env", sub)),
    );
    splitos_rpc::auth::write_private(&cred, &creds)?;
    std::fs::write(&ca, &pem)?;
    splitos_rpc::auth::write_private(&env, format!("SPLITOS_GM={}\n", j.gm).as_bytes())?;
    crate::outln!(
        "joined as a {}: credentials in {}, the managers in {} (SPLITOS_GM={})",
        role.name(),
        cred.display(),
        env.display(),
        j.gm
    );
    crate::outln!(
        "start it: splitos {} --gm {} --listen ADDR:PORT --credentials {}   (or its unit, docs/deployment.md)",
        sub,
        j.gm,
        cred.display()
    );
    Ok(())
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
        assert!(j.redeem(&token).unwrap_err().contains("not a valid join token"), "once");
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
        assert!(no_tls.create(Role::Mem, 60).unwrap_err().contains("HTTPS"));
        let no_authority = JoinTokens::open(Store::default(), None, Some("pem".into())).unwrap();
        assert!(no_authority.create(Role::Mem, 60).unwrap_err().contains("authority"));
    }
}
