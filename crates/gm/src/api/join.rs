//! Joining a machine to the cluster (docs/deployment.md#joining-a-machine): the admin makes a
//! join token for a role (`POST /api/v1/join-tokens`, `splitos cluster join-token`), and
//! `splitos join --token T API` on the new machine trades it for credentials of that role,
//! issued by the cluster's authority, over the API's HTTPS.
//!
//! A token is single use and expires; the managers keep only its secret's SHA-256, in their
//! state (gm/joins.rs, which makes and redeems tokens; here are the API's handlers and
//! `splitos join`). It names the SHA-256 of the API's certificate authority (`..._PIN`): the
//! joining machine, which trusts nothing yet, fetches the authority's certificate
//! (`GET /api/v1/join/ca`, public) and checks it against the pin before it sends the token
//! over a connection verified by it.
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use splitos_rpc::Role;

use super::{admin_only, internal, Api, ApiError, Body, ErrorBody, Principal};
use crate::joins::{hex, parse, pin, unhex};

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
    let role = splitos_core::config::role_named(&r.role)
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, format!("role: {e}")))?;
    let gm = api.gm.clone();
    let (token, expires_unix_s) = tokio::task::spawn_blocking(move || gm.joins.create(role, r.ttl_s.unwrap_or(3600)))
        .await
        .map_err(internal)?
        .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
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
        crate::series::JOINS_REFUSED.increment(1);
        static REFUSED: splitos_rpc::refusals::Refusals = splitos_rpc::refusals::Refusals::new("join refused");
        if REFUSED.log_this(peer.ip()) {
            tracing::warn!(%peer, "join refused: {why}");
        }
        ApiError(StatusCode::FORBIDDEN, why.to_string())
    })?;
    crate::series::JOINS.increment(1);
    tracing::info!(%peer, role = role.name(), "a machine joined: credentials issued");
    Ok(Json(Joined {
        role: role.name().into(),
        credentials: hex(&creds),
        gm: managers.join(","),
    }))
}

/// `splitos join`: fetches the authority, checks its pin, trades the token, and writes the
/// credentials (and the managers' addresses) in `out`.
pub fn join_cli(token: &str, api: &str, out: &std::path::Path, listen: Option<&str>) -> anyhow::Result<()> {
    // A line of the env file: one word, with a port.
    if let Some(l) = listen.filter(|l| {
        l.chars().any(|c| c.is_whitespace() || c.is_control())
            || l.rsplit_once(':').is_none_or(|(_, port)| port.parse::<u16>().is_err())
    }) {
        anyhow::bail!("--listen {l:?} is not an address with a port (ADDR:PORT)");
    }
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
    let sub = splitos_core::config::subcommand(role);
    splitos_core::trusted::own_dir(out, 0o700)?;
    let (cred, ca, env) = (
        out.join(format!("{}.cred", sub)),
        out.join("ca.pem"),
        out.join(format!("{}.env", sub)),
    );
    splitos_rpc::auth::write_private(&cred, &creds)?;
    std::fs::write(&ca, &pem)?;
    // The unit reads both: without where to listen it cannot start.
    let listen_line = listen.map(|l| format!("SPLITOS_LISTEN={l}\n")).unwrap_or_default();
    splitos_rpc::auth::write_private(&env, format!("SPLITOS_GM={}\n{listen_line}", j.gm).as_bytes())?;
    splitos_core::outln!(
        "joined as a {}: credentials in {}, the managers in {} (SPLITOS_GM={})",
        role.name(),
        cred.display(),
        env.display(),
        j.gm
    );
    match listen {
        Some(l) => splitos_core::outln!(
            "start it: systemctl enable --now splitos-{sub}@INSTANCE (its unit reads {}, which says where it listens: {l}), or splitos {sub} --gm {} --listen {l} --credentials {}",
            env.display(),
            j.gm,
            cred.display()
        ),
        None => splitos_core::outln!(
            "start it: splitos {sub} --gm {} --listen ADDR:PORT --credentials {}; for its unit, add SPLITOS_LISTEN=ADDR:PORT (an address of this machine the others reach) to {} first, or join with --listen ADDR:PORT (docs/deployment.md)",
            j.gm,
            cred.display(),
            env.display()
        ),
    }
    Ok(())
}
