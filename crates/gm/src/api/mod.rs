//! The REST API of the global managers (docs/control-plane.md): what the cluster is and what
//! runs on it, for operators' tools, dashboards and scripts, under `/api/v1/`, each request
//! with a bearer token (kept by the managers: [`crate::tokens`]). `/livez` and `/readyz`
//! answer without one, as Kubernetes' API server does, and `/openapi.json` describes the rest;
//! it is generated from the handlers below and checked into docs/openapi.json.
//!
//! The managers do not import it: main.rs gives [`start`] to `gm::run`, which calls it once
//! the managers serve.
//!
//! It runs on a thread of its own with a single-threaded tokio runtime
//! ([`splitos_core::telemetry::serve_router`]): the managers' RPC serving never waits for it, and a
//! flood of API clients holds one thread and a few for the calls it makes to components.
mod dashboard;
mod excache;
mod follow;
mod jobs;
pub mod join;
mod listen;
mod memory;
mod placement;
pub mod tls;

pub use listen::start;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequest, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get};
use axum::{Extension, Json, Router};
use serde::de::DeserializeOwned;
use serde::Serialize;
use splitos_rpc::refusals::Refusals;
use splitos_rpc::{ErrCode, Refusal, Role, VnodeInfo};
use utoipa::OpenApi;

pub use follow::{url_of, NotLeader, MANAGER_HEADER};
pub use jobs::{JobList, JobView, SignalQuery, Unanswered};

use crate::tokens::Principal;
use crate::{Gm, Manager};
use splitos_core::config::GmArgs;

/// What the API's handlers share.
pub struct Api {
    pub gm: Arc<Gm>,
    /// The cluster's configuration as the global managers have it (`[cluster]`).
    pub config: serde_json::Value,
}

/// An error as the API answers it: a status and `{"error": "..."}`.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.0, Json(ErrorBody { error: self.1 })).into_response();
        if self.0 == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        }
        r
    }
}

/// The most a request body may hold; a larger one is refused (413) before it is read whole.
pub const MAX_BODY: usize = 64 * 1024;

/// How long a client may take to send a request's body.
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A JSON request body, refused as the API refuses anything: `{"error": ...}` with 415 (not
/// JSON), 400 (malformed), 422 (fields missing, unknown or of the wrong type), 413 (larger
/// than [`MAX_BODY`]) or 408 (not sent whole within [`BODY_TIMEOUT`]).
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match tokio::time::timeout(BODY_TIMEOUT, Json::<T>::from_request(req, state)).await {
            Ok(Ok(Json(v))) => Ok(Body(v)),
            Ok(Err(r)) => Err(ApiError(r.status(), r.body_text())),
            Err(_) => Err(ApiError(
                StatusCode::REQUEST_TIMEOUT,
                format!("the body did not arrive within {} s", BODY_TIMEOUT.as_secs()),
            )),
        }
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: String,
}

/// One component of the cluster as the global managers know it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ComponentView {
    pub id: u32,
    /// pcomponent, mcomponent, scomponent or ncomponent.
    pub role: String,
    /// Where it serves requests.
    pub addr: String,
    /// The host part of `addr`.
    pub host: String,
    /// It heartbeats on time.
    pub alive: bool,
    /// Declared lost (silent for the cluster's `reclaim_dead_ms`): its processes or copies are given up.
    pub lost: bool,
    pub since_heartbeat_ms: u64,
    pub processes: u32,
    pub threads: u32,
    /// Memory it offers (mComponent) or its ExCache (pComponent), bytes.
    pub capacity_bytes: u64,
    /// Memory no new mapping or vRegion may have, bytes (mComponent): held by pages, promised
    /// to mappings, or kept for vNodes' memory quotas.
    pub committed_bytes: u64,
    /// Memory holding pages now, bytes.
    pub used_bytes: u64,
    /// Taken out of placement by the admin: no new programs (pComponent) or homes and
    /// vRegions (mComponent).
    pub cordoned: bool,
    /// Where it serves its Prometheus metrics.
    pub metrics: Option<String>,
    /// An mComponent being detached or drained: how far that has come.
    pub leaving: Option<memory::LeavingView>,
}

impl From<splitos_rpc::ComponentInfo> for ComponentView {
    fn from(c: splitos_rpc::ComponentInfo) -> ComponentView {
        ComponentView {
            id: c.id,
            role: c.role.name().to_string(),
            host: splitos_core::topology::host_of(&c.addr).to_string(),
            addr: c.addr,
            alive: c.alive,
            lost: c.lost,
            since_heartbeat_ms: c.since_heartbeat_ms,
            processes: c.load.processes,
            threads: c.load.threads,
            capacity_bytes: c.load.capacity,
            committed_bytes: c.load.committed,
            used_bytes: c.load.used,
            cordoned: c.cordoned,
            metrics: c.metrics,
            leaving: c.leaving.map(memory::LeavingView::from),
        }
    }
}

/// A vNode the admin made.
#[derive(Serialize, utoipa::ToSchema)]
pub struct VnodeView {
    pub name: String,
    pub users: Vec<String>,
    pub groups: Vec<String>,
    /// Its memory quota in bytes; none: no quota.
    pub memory_bytes: Option<u64>,
}

impl From<VnodeInfo> for VnodeView {
    fn from(v: VnodeInfo) -> VnodeView {
        VnodeView {
            name: v.name,
            users: v.users,
            groups: v.groups,
            memory_bytes: v.memory,
        }
    }
}

/// Whom the caller's token speaks for.
#[derive(Serialize, utoipa::ToSchema)]
pub struct WhoAmI {
    /// The token's name.
    pub token: String,
    /// admin or tenant.
    pub role: String,
    /// The vNodes a tenant's token reaches (none listed for an admin: all).
    pub vnodes: Vec<String>,
}

/// Refusals of API requests, logged a few at a time.
static REFUSED: Refusals = Refusals::new("API requests refused");

fn refuse(status: StatusCode, peer: SocketAddr, method: &str, path: &str, who: Option<&str>, why: String) -> ApiError {
    crate::series::API_REQUESTS_REFUSED
        .with([status.as_u16().to_string()])
        .increment(1);
    if REFUSED.log_this(peer.ip()) {
        tracing::warn!(%peer, method, path, token = who.unwrap_or("-"), status = status.as_u16(), "API request refused: {why}");
    }
    ApiError(status, why)
}

/// The path the client asked for (a nested router sees only the rest of it).
fn path_of(req: &Request) -> String {
    req.extensions()
        .get::<axum::extract::OriginalUri>()
        .map_or_else(|| req.uri().path().to_string(), |u| u.path().to_string())
}

/// Every request under `/api/` proves a token; the handlers get whom it speaks for.
async fn authenticate(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut req: Request,
    next: Next,
) -> Response {
    let principal = match splitos_core::telemetry::bearer(req.headers()) {
        None => Err("no bearer token (Authorization: Bearer TOKEN; tokens: splitos cluster token create)"),
        Some(None) => Err("the Authorization header is not a bearer token"),
        Some(Some(t)) => api
            .gm
            .tokens
            .check(t)
            .ok_or("not a valid token (revoked, or never issued)"),
    };
    match principal {
        Ok(p) => {
            crate::series::API_REQUESTS.increment(1);
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Err(why) => refuse(
            StatusCode::UNAUTHORIZED,
            peer,
            req.method().as_str(),
            &path_of(&req),
            None,
            why.into(),
        )
        .into_response(),
    }
}

/// Refuses a tenant what only an admin may see.
fn admin_only(p: &Principal, peer: SocketAddr, path: &str) -> Result<(), ApiError> {
    match p {
        Principal::Admin { .. } => Ok(()),
        Principal::Tenant { token, .. } => Err(refuse(
            StatusCode::FORBIDDEN,
            peer,
            "GET",
            path,
            Some(token),
            "only an admin token may see this".into(),
        )),
    }
}

#[utoipa::path(get, path = "/livez", responses((status = 200, description = "The API server runs", body = String)))]
async fn livez() -> &'static str {
    "ok\n"
}

/// Ready when a program could start: the managers know an alive pComponent and an alive
/// mComponent.
#[utoipa::path(get, path = "/readyz", responses((status = 200, description = "A program could start", body = String), (status = 503, description = "What is missing", body = String)))]
async fn readyz(State(api): State<Arc<Api>>) -> (StatusCode, String) {
    let comps = api.gm.snapshot();
    let missing: Vec<&str> = [(Role::Proc, "no alive pComponent"), (Role::Mem, "no alive mComponent")]
        .into_iter()
        .filter(|(role, _)| !comps.iter().any(|c| c.role == *role && c.alive))
        .map(|(_, why)| why)
        .collect();
    if missing.is_empty() {
        (StatusCode::OK, "ok\n".into())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("{}\n", missing.join("\n")))
    }
}

#[utoipa::path(get, path = "/api/v1/whoami", security(("bearer" = [])), responses((status = 200, description = "Whom the token speaks for", body = WhoAmI), (status = 401, description = "No valid token", body = ErrorBody)))]
async fn whoami(Extension(p): Extension<Principal>) -> Json<WhoAmI> {
    Json(match p {
        Principal::Admin { token } => WhoAmI {
            token,
            role: "admin".into(),
            vnodes: Vec::new(),
        },
        Principal::Tenant { token, vnodes } => WhoAmI {
            token,
            role: "tenant".into(),
            vnodes,
        },
    })
}

/// Every component the global managers know, alive or not (admin only).
#[utoipa::path(get, path = "/api/v1/components", security(("bearer" = [])),
    responses((status = 200, description = "The components", body = [ComponentView]), (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody)))]
async fn components(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Vec<ComponentView>>, ApiError> {
    admin_only(&p, peer, "/api/v1/components")?;
    Ok(Json(api.gm.snapshot().into_iter().map(ComponentView::from).collect()))
}

/// The cluster as a graph (admin only): hosts, the switch between them, components, and the
/// links pComponents measured to the mComponents their programs use, with latency and
/// bandwidth. The `nearest` placement counts hops on it.
#[utoipa::path(get, path = "/api/v1/topology", security(("bearer" = [])),
    responses((status = 200, description = "The topology graph", body = splitos_core::topology::Graph), (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody)))]
async fn topology(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
) -> Result<Json<splitos_core::topology::Graph>, ApiError> {
    admin_only(&p, peer, "/api/v1/topology")?;
    Ok(Json(api.gm.topology()))
}

/// Takes a pComponent or mComponent out of placement (admin only): no new programs start on
/// a cordoned pComponent, no new homes or vRegions go to a cordoned mComponent; what runs
/// there goes on. It outlives a restart of the managers.
#[utoipa::path(post, path = "/api/v1/components/{id}/cordon", security(("bearer" = [])), params(("id" = u32, Path, description = "The component's id")),
    responses((status = 200, description = "Cordoned", body = ComponentView), (status = 400, description = "Not a pComponent or mComponent", body = ErrorBody), (status = 401, description = "No valid token", body = ErrorBody),
              (status = 403, description = "Not an admin token", body = ErrorBody), (status = 404, description = "No such component", body = ErrorBody)))]
async fn cordon(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<ComponentView>, ApiError> {
    set_cordon(api, peer, p, id, true).await
}

/// Puts a cordoned component back into placement (admin only).
#[utoipa::path(post, path = "/api/v1/components/{id}/uncordon", security(("bearer" = [])), params(("id" = u32, Path, description = "The component's id")),
    responses((status = 200, description = "Uncordoned", body = ComponentView), (status = 400, description = "Not a pComponent or mComponent", body = ErrorBody), (status = 401, description = "No valid token", body = ErrorBody),
              (status = 403, description = "Not an admin token", body = ErrorBody), (status = 404, description = "No such component", body = ErrorBody)))]
async fn uncordon(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<ComponentView>, ApiError> {
    set_cordon(api, peer, p, id, false).await
}

async fn set_cordon(
    api: Arc<Api>,
    peer: SocketAddr,
    p: Principal,
    id: String,
    on: bool,
) -> Result<Json<ComponentView>, ApiError> {
    let verb = if on { "cordon" } else { "uncordon" };
    admin_only(&p, peer, &format!("/api/v1/components/{id}/{verb}"))?;
    let id: u32 = id
        .parse()
        .map_err(|_| ApiError(StatusCode::BAD_REQUEST, format!("{id:?} is not a component id")))?;
    let gm = api.gm.clone();
    let c = tokio::task::spawn_blocking(move || {
        let c = gm.cordon(id, on)?;
        gm.tell_cordon(&c);
        Ok::<_, crate::ComponentError>(c)
    })
    .await
    .map_err(internal)?
    .map_err(refused)?;
    tracing::info!(id, token = p.name(), "component {verb}ed through the API");
    Ok(Json(c.into()))
}

/// The whole cluster as `splitos cluster status` shows it (admin only).
#[derive(Serialize, utoipa::ToSchema)]
pub struct StatusView {
    /// Where the global managers serve the components, the REST API and their own metrics.
    pub gm: String,
    /// The leading manager (the one answering), and every manager alive.
    pub leader: Option<String>,
    pub managers: Vec<String>,
    pub api: Option<String>,
    /// Where every manager alive serves the API (only the leader answers).
    pub apis: Vec<String>,
    pub gm_metrics: Option<String>,
    pub vregion_size: u64,
    /// Each component as the managers know it (its role, address, liveness, load, cordon, a
    /// detach's progress) with `stats`: its own statistics, which differ by role (none when
    /// it did not answer within 2 s).
    #[schema(value_type = Vec<Object>)]
    pub components: Vec<serde_json::Value>,
}

/// Every component with its own statistics: what `splitos cluster status` prints (admin only).
#[utoipa::path(get, path = "/api/v1/status", security(("bearer" = [])),
    responses((status = 200, description = "The cluster", body = StatusView), (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody)))]
async fn status(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
) -> Result<Json<StatusView>, ApiError> {
    admin_only(&p, peer, "/api/v1/status")?;
    let gm = api.gm.clone();
    let (summary, all) = tokio::task::spawn_blocking(move || (gm.status_summary(), gm.status()))
        .await
        .map_err(internal)?;
    let components = all
        .into_iter()
        .map(|(c, stats)| {
            let mut v = serde_json::to_value(c).unwrap_or_default();
            v["stats"] = stats.unwrap_or_default();
            v
        })
        .collect();
    Ok(Json(StatusView {
        gm: api.gm.addr.clone(),
        leader: summary.leader,
        managers: summary.managers,
        api: summary.api,
        apis: summary.apis,
        gm_metrics: summary.metrics,
        vregion_size: summary.vregion_size,
        components,
    }))
}

/// The cluster's configuration as the global managers run it: the `[cluster]` table
/// (docs/configuration.md), admin only.
#[utoipa::path(get, path = "/api/v1/config", security(("bearer" = [])),
    responses((status = 200, description = "The [cluster] table", body = Object), (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody)))]
async fn config(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
) -> Result<Json<serde_json::Value>, ApiError> {
    admin_only(&p, peer, "/api/v1/config")?;
    Ok(Json(api.config.clone()))
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// The one mapping of the wire's refusal codes onto the API's statuses.
fn status_of(code: ErrCode) -> StatusCode {
    match code {
        ErrCode::NotFound => StatusCode::NOT_FOUND,
        ErrCode::Invalid => StatusCode::BAD_REQUEST,
        ErrCode::NoMemory => StatusCode::CONFLICT,
        ErrCode::Unreachable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A refusal of the managers (or of a component they asked) as the API answers it.
fn refused(e: impl Into<Refusal>) -> ApiError {
    let e = e.into();
    ApiError(status_of(e.code), e.msg)
}

/// The whole cluster's Prometheus metrics: the managers' and every alive component's series in
/// one exposition, each labelled with its component and role (admin only).
#[utoipa::path(get, path = "/metrics", security(("bearer" = [])),
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"), (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody)))]
async fn cluster_metrics(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
) -> Result<Response, ApiError> {
    admin_only(&p, peer, "/metrics")?;
    let gm = api.gm.clone();
    let text = tokio::task::spawn_blocking(move || gm.cluster_metrics())
        .await
        .map_err(internal)?;
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response())
}

/// A group of scrape targets as Prometheus's HTTP service discovery reads them.
#[derive(Serialize, utoipa::ToSchema)]
pub struct TargetGroup {
    /// One component's metrics address.
    pub targets: Vec<String>,
    /// `__meta_splitos_component` (its RPC address) and `__meta_splitos_role`, for relabelling:
    /// the series carry `component` and `role` labels of their own.
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Where every alive component and the managers serve their metrics, in the format of
/// Prometheus's `http_sd_configs` (admin only).
#[utoipa::path(get, path = "/api/v1/targets", security(("bearer" = [])),
    responses((status = 200, description = "Scrape targets", body = [TargetGroup]), (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody)))]
async fn targets(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Vec<TargetGroup>>, ApiError> {
    admin_only(&p, peer, "/api/v1/targets")?;
    let group = |metrics: String, component: String, role: &str| TargetGroup {
        targets: vec![metrics],
        labels: [
            ("__meta_splitos_component".to_string(), component),
            ("__meta_splitos_role".to_string(), role.to_string()),
        ]
        .into(),
    };
    let own = api
        .gm
        .metrics_addr()
        .map(|m| group(m, api.gm.addr.clone(), Role::Gm.name()));
    let comps = api
        .gm
        .snapshot()
        .into_iter()
        .filter(|c| c.alive)
        .filter_map(|c| Some(group(c.metrics?, c.addr, c.role.name())));
    Ok(Json(own.into_iter().chain(comps).collect()))
}

/// The vNodes the admin made: every one for an admin, its own for a tenant.
#[utoipa::path(get, path = "/api/v1/vnodes", security(("bearer" = [])),
    responses((status = 200, description = "The vNodes", body = [VnodeView]), (status = 401, description = "No valid token", body = ErrorBody)))]
async fn vnodes(State(api): State<Arc<Api>>, Extension(p): Extension<Principal>) -> Json<Vec<VnodeView>> {
    Json(
        api.gm
            .vnodes
            .list()
            .1
            .into_iter()
            .filter(|v| p.may_see_vnode(&v.name))
            .map(VnodeView::from)
            .collect(),
    )
}

/// Makes a vNode, granted to the users and groups named, with its memory quota (admin only).
/// pComponents grant it within a heartbeat (300 ms); it outlives a restart of the managers.
#[utoipa::path(post, path = "/api/v1/vnodes", security(("bearer" = [])), request_body = splitos_core::config::VnodeConfig,
    responses((status = 201, description = "Made", body = VnodeView), (status = 400, description = "Not JSON", body = ErrorBody), (status = 401, description = "No valid token", body = ErrorBody),
              (status = 403, description = "Not an admin token", body = ErrorBody), (status = 409, description = "It exists", body = ErrorBody), (status = 413, description = "A body over 64 KiB", body = ErrorBody),
              (status = 415, description = "Not application/json", body = ErrorBody), (status = 422, description = "Unknown or missing fields, a bad name, an unknown user or group, a quota under a page", body = ErrorBody)))]
async fn create_vnode(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Body(v): Body<splitos_core::config::VnodeConfig>,
) -> Result<(StatusCode, Json<VnodeView>), ApiError> {
    admin_only(&p, peer, "/api/v1/vnodes")?;
    let v = VnodeInfo {
        name: v.name,
        users: v.users,
        groups: v.groups,
        memory: v.memory.map(|m| m.0),
    };
    let gm = api.gm.clone();
    let made = v.clone();
    tokio::task::spawn_blocking(move || gm.vnodes.create(made))
        .await
        .map_err(internal)?
        .map_err(vnode_error)?;
    tracing::info!(vnode = %v.name, users = ?v.users, groups = ?v.groups, memory = ?v.memory, token = p.name(), "vNode made through the API");
    Ok((StatusCode::CREATED, Json(v.into())))
}

fn vnode_error(e: crate::vnodes::VnodeError) -> ApiError {
    use crate::vnodes::VnodeError;
    let status = match &e {
        VnodeError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
        VnodeError::Exists(_) => StatusCode::CONFLICT,
        VnodeError::NotFound(_) => StatusCode::NOT_FOUND,
        VnodeError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError(status, e.to_string())
}

/// Refuses a tenant another tenant's vNode, whether or not it exists.
fn tenant_of(p: &Principal, peer: SocketAddr, method: &str, name: &str) -> Result<(), ApiError> {
    match p.may_see_vnode(name) {
        true => Ok(()),
        false => Err(refuse(
            StatusCode::FORBIDDEN,
            peer,
            method,
            &format!("/api/v1/vnodes/{name}"),
            Some(p.name()),
            "not a vNode of this token".into(),
        )),
    }
}

/// One vNode: an admin any, a tenant its own; another tenant's is 403.
#[utoipa::path(get, path = "/api/v1/vnodes/{name}", security(("bearer" = [])), params(("name" = String, Path, description = "The vNode's name")),
    responses((status = 200, description = "The vNode", body = VnodeView), (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Another tenant's vNode", body = ErrorBody),
              (status = 404, description = "No such vNode", body = ErrorBody)))]
async fn vnode(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<VnodeView>, ApiError> {
    tenant_of(&p, peer, "GET", &name)?;
    api.gm
        .vnodes
        .get(&name)
        .map(|v| Json(v.into()))
        .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no vNode is named {name:?}")))
}

/// Deletes a vNode on which no job runs (admin only): its users are refused from then on,
/// and its files stay on its sComponent, for a vNode of the same name made later.
#[utoipa::path(delete, path = "/api/v1/vnodes/{name}", security(("bearer" = [])), params(("name" = String, Path, description = "The vNode's name")),
    responses((status = 204, description = "Deleted"), (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody),
              (status = 404, description = "No such vNode", body = ErrorBody), (status = 409, description = "Jobs run on it, or a pComponent did not say whether any does", body = ErrorBody)))]
async fn delete_vnode(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    admin_only(&p, peer, &format!("/api/v1/vnodes/{name}"))?;
    let gm = api.gm.clone();
    let n = name.clone();
    tokio::task::spawn_blocking(move || {
        gm.vnodes
            .get(&n)
            .ok_or_else(|| ApiError(StatusCode::NOT_FOUND, format!("no vNode is named {n:?}")))?;
        let jobs = gm.jobs();
        let running = jobs.running.iter().filter(|(_, j)| j.vnode == n).count();
        if running > 0 {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!("{running} job(s) run on vNode {n:?}: end them first (DELETE /api/v1/jobs/PID)"),
            ));
        }
        if let Some((c, e)) = jobs.unanswered.first() {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!(
                    "pComponent {} did not say whether jobs run on vNode {n:?} ({e}): try again",
                    c.id
                ),
            ));
        }
        let gone = gm.vnodes.delete(&n).map_err(vnode_error)?;
        gm.forget_quota_home(&n);
        Ok::<_, ApiError>(gone)
    })
    .await
    .map_err(internal)??;
    tracing::info!(vnode = %name, token = p.name(), "vNode deleted through the API");
    Ok(StatusCode::NO_CONTENT)
}

async fn not_found(req: Request) -> ApiError {
    ApiError(StatusCode::NOT_FOUND, format!("no such resource: {}", path_of(&req)))
}

#[derive(OpenApi)]
#[openapi(
    info(title = "splitos control plane", description = "The REST API of the global managers (docs/control-plane.md)."),
    paths(livez, readyz, whoami, status, components, topology, cordon, uncordon, memory::list, memory::detach, memory::attach, excache::get, excache::put, excache::get_policy, excache::put_policy, placement::get, placement::put, join::create, join::ca, join::join, config, jobs::jobs, jobs::kill_job, vnodes, create_vnode, vnode, delete_vnode, targets, cluster_metrics, dashboard::events),
    modifiers(&BearerAuth)
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        doc.components.get_or_insert_with(Default::default).add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The API's OpenAPI document (docs/openapi.json is this, checked in).
pub fn openapi_json() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes")
        + "\n"
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], openapi_json())
}

fn router(api: Arc<Api>) -> Router {
    let v1 = Router::new()
        .route("/whoami", get(whoami))
        .route("/status", get(status))
        .route("/components", get(components))
        .route("/topology", get(topology))
        .route("/components/{id}/cordon", axum::routing::post(cordon))
        .route("/components/{id}/uncordon", axum::routing::post(uncordon))
        .route("/memory", get(memory::list))
        .route("/memory/{id}/detach", axum::routing::post(memory::detach))
        .route("/memory/{id}/attach", axum::routing::post(memory::attach))
        .route("/pcomponents/{id}/excache", get(excache::get).put(excache::put))
        .route(
            "/pcomponents/{id}/policy",
            get(excache::get_policy).put(excache::put_policy),
        )
        .route("/placement", get(placement::get).put(placement::put))
        .route("/join-tokens", axum::routing::post(join::create))
        .route("/config", get(config))
        .route("/jobs", get(jobs::jobs))
        .route("/jobs/{pid}", delete(jobs::kill_job))
        .route("/vnodes", get(vnodes).post(create_vnode))
        .route("/vnodes/{name}", get(vnode).delete(delete_vnode))
        .route("/targets", get(targets))
        .route("/events", dashboard::events_route())
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(api.clone(), authenticate));
    let metrics = Router::new()
        .route("/metrics", get(cluster_metrics))
        .layer(middleware::from_fn_with_state(api.clone(), authenticate));
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/openapi.json", get(openapi))
        // The token in the body is the proof: a machine that joins has no bearer token yet.
        .route("/api/v1/join/ca", get(join::ca))
        .route("/api/v1/join", axum::routing::post(join::join))
        .nest("/api/v1", v1)
        .merge(metrics)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(api)
}
