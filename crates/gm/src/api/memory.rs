//! `/api/v1/memory`: the cluster's mComponents as memory to attach and detach
//! (docs/elastic-memory.md), admin only.
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use splitos_rpc::{ComponentInfo, Role};

use super::{admin_only, internal, refused, Api, ApiError, ErrorBody, Principal};

/// How far a detach (or a drain) has come, as the leaving mComponent reports it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LeavingView {
    /// Bytes of pages it held when the detach began, moved since, and left.
    pub bytes_at_start: u64,
    pub bytes_moved: u64,
    pub bytes_left: u64,
    /// Processes it is still home of, home copies it keeps as backup, processes it still
    /// holds memory of, socket buffers in use on it.
    pub homes: u32,
    pub backups: u32,
    pub processes: u32,
    pub socket_buffers: u32,
    /// Its buffer cache was written back and handed over.
    pub files_released: bool,
    /// It exits once empty (a detach); else it stays, empty and out of placement (a drain).
    pub exit: bool,
    /// Why it cannot go on now (no room elsewhere), if it cannot: it is tried again.
    pub stuck: Option<String>,
}

impl From<splitos_rpc::Leaving> for LeavingView {
    fn from(l: splitos_rpc::Leaving) -> LeavingView {
        LeavingView {
            bytes_at_start: l.bytes_at_start,
            bytes_moved: l.bytes_at_start.saturating_sub(l.bytes_left),
            bytes_left: l.bytes_left,
            homes: l.homes,
            backups: l.backups,
            processes: l.processes,
            socket_buffers: l.socket_buffers,
            files_released: l.files_released,
            exit: l.exit,
            stuck: l.stuck,
        }
    }
}

/// One mComponent as memory of the cluster.
#[derive(Serialize, utoipa::ToSchema)]
pub struct MemoryView {
    pub id: u32,
    pub addr: String,
    pub host: String,
    pub alive: bool,
    /// attached (takes new homes and vRegions), cordoned, detaching, draining or drained.
    pub state: String,
    pub capacity_bytes: u64,
    pub committed_bytes: u64,
    pub used_bytes: u64,
    pub leaving: Option<LeavingView>,
}

impl From<ComponentInfo> for MemoryView {
    fn from(c: ComponentInfo) -> MemoryView {
        let state = match &c.leaving {
            Some(l) if l.exit => "detaching",
            Some(l) if l.empty() => "drained",
            Some(_) => "draining",
            None if c.cordoned => "cordoned",
            None => "attached",
        };
        MemoryView {
            id: c.id,
            host: splitos_core::topology::host_of(&c.addr).to_string(),
            addr: c.addr,
            alive: c.alive,
            state: state.into(),
            capacity_bytes: c.load.capacity,
            committed_bytes: c.load.committed,
            used_bytes: c.load.used,
            leaving: c.leaving.map(LeavingView::from),
        }
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DetachQuery {
    /// Stay, empty and out of placement, instead of exiting (what `cluster drain` does).
    #[serde(default)]
    pub stay: bool,
}

/// The cluster's mComponents as memory (admin only).
#[utoipa::path(get, path = "/api/v1/memory", security(("bearer" = [])),
    responses((status = 200, description = "The mComponents", body = [MemoryView]), (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody)))]
pub async fn list(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
) -> Result<Json<Vec<MemoryView>>, ApiError> {
    admin_only(&p, peer, "/api/v1/memory")?;
    Ok(Json(
        api.gm
            .snapshot()
            .into_iter()
            .filter(|c| c.role == Role::Mem)
            .map(MemoryView::from)
            .collect(),
    ))
}

/// Detaches an mComponent while programs run (admin only): it leaves placement at once, every
/// vRegion and home it holds moves to the others (chosen by the placement policy), its buffer
/// cache is written back, and it exits once empty. Progress is in `GET /api/v1/memory`.
#[utoipa::path(post, path = "/api/v1/memory/{id}/detach", security(("bearer" = [])), params(("id" = u32, Path, description = "The mComponent's id"), DetachQuery),
    responses((status = 202, description = "Detaching", body = MemoryView), (status = 400, description = "Not an mComponent, or a detach is under way", body = ErrorBody), (status = 401, description = "No valid token", body = ErrorBody),
              (status = 403, description = "Not an admin token", body = ErrorBody), (status = 404, description = "No such component", body = ErrorBody),
              (status = 409, description = "Nowhere to move its memory: the last mComponent, or too little room on the others", body = ErrorBody), (status = 503, description = "It does not answer", body = ErrorBody)))]
pub async fn detach(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    Query(q): Query<DetachQuery>,
) -> Result<(StatusCode, Json<MemoryView>), ApiError> {
    let path = format!("/api/v1/memory/{id}/detach");
    admin_only(&p, peer, &path)?;
    let id = parse_id(&id)?;
    let gm = api.gm.clone();
    let c = tokio::task::spawn_blocking(move || gm.detach(id, !q.stay))
        .await
        .map_err(internal)?
        .map_err(refused)?;
    tracing::info!(
        id,
        token = p.name(),
        stay = q.stay,
        "mComponent detach started through the API"
    );
    Ok((StatusCode::ACCEPTED, Json(c.into())))
}

/// Attaches an mComponent (admin only): it takes new homes and vRegions from now on; a detach
/// or drain under way is called off (what moved stays where it went), a cordon lifted. An
/// mComponent started with `--standby` waits for this.
#[utoipa::path(post, path = "/api/v1/memory/{id}/attach", security(("bearer" = [])), params(("id" = u32, Path, description = "The mComponent's id")),
    responses((status = 200, description = "Attached", body = MemoryView), (status = 400, description = "Not an mComponent", body = ErrorBody), (status = 401, description = "No valid token", body = ErrorBody),
              (status = 403, description = "Not an admin token", body = ErrorBody), (status = 404, description = "No such component", body = ErrorBody)))]
pub async fn attach(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<MemoryView>, ApiError> {
    admin_only(&p, peer, &format!("/api/v1/memory/{id}/attach"))?;
    let id = parse_id(&id)?;
    let gm = api.gm.clone();
    let c = tokio::task::spawn_blocking(move || gm.attach(id))
        .await
        .map_err(internal)?
        .map_err(refused)?;
    tracing::info!(id, token = p.name(), "mComponent attached through the API");
    Ok(Json(c.into()))
}

pub(super) fn parse_id(id: &str) -> Result<u32, ApiError> {
    id.parse()
        .map_err(|_| ApiError(StatusCode::BAD_REQUEST, format!("{id:?} is not a component id")))
}
