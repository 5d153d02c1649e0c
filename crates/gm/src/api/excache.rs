//! `/api/v1/pcomponents/{id}/excache`: a running pComponent's ExCache, resized and shared out
//! among vNodes (docs/elastic-memory.md), and `/api/v1/pcomponents/{id}/policy`: its eviction
//! and read-ahead policies, replaced while programs run (docs/ebb.md), admin only.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use splitos_rpc::{ExcacheShare, PolicyState, P2G_EXCACHE};

use super::memory::parse_id;
use super::{admin_only, internal, refused, Api, ApiError, Body, ErrorBody, Principal};
use splitos_core::config::Size;

/// A pComponent's ExCache as it is now.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ExcacheView {
    /// Its size, the most it may grow to (`excache_max`), and what its lines hold.
    pub size_bytes: u64,
    pub max_bytes: u64,
    pub used_bytes: u64,
    /// Each vNode's share, and what that vNode's processes hold now.
    pub shares: BTreeMap<String, ShareView>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ShareView {
    pub share_bytes: u64,
    pub used_bytes: u64,
}

impl From<P2G_EXCACHE> for ExcacheView {
    fn from(r: P2G_EXCACHE) -> ExcacheView {
        let shares = r
            .shares
            .into_iter()
            .map(|s| {
                (
                    s.vnode,
                    ShareView {
                        share_bytes: s.bytes,
                        used_bytes: s.used,
                    },
                )
            })
            .collect();
        ExcacheView {
            size_bytes: r.size,
            max_bytes: r.max,
            used_bytes: r.used,
            shares,
        }
    }
}

/// A change of a running ExCache; what is absent stays as it is.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExcacheChange {
    /// The new size ("32M", or bytes), rounded down to whole ways of every set; at least 256K,
    /// at most the pComponent's excache_max. A shrink answers once the lines past it were
    /// written back and dropped.
    #[schema(value_type = Option<String>)]
    pub size: Option<Size>,
    /// Every vNode's share, replacing those set before ({} clears them): lines a vNode keeps
    /// against other vNodes' misses while it holds no more. They add up to no more than the size.
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub shares: Option<BTreeMap<String, Size>>,
}

/// A pComponent's ExCache: size, most, use and shares (admin only).
#[utoipa::path(get, path = "/api/v1/pcomponents/{id}/excache", security(("bearer" = [])), params(("id" = u32, Path, description = "The pComponent's id")),
    responses((status = 200, description = "The ExCache", body = ExcacheView), (status = 400, description = "Not a pComponent", body = ErrorBody), (status = 401, description = "No valid token", body = ErrorBody),
              (status = 403, description = "Not an admin token", body = ErrorBody), (status = 404, description = "No such component", body = ErrorBody), (status = 503, description = "It does not answer", body = ErrorBody)))]
pub async fn get(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<ExcacheView>, ApiError> {
    admin_only(&p, peer, &format!("/api/v1/pcomponents/{id}/excache"))?;
    change(api, parse_id(&id)?, None, None).await
}

/// Resizes a running pComponent's ExCache and sets the vNodes' shares of it (admin only).
/// Programs keep running: growing takes effect at once; shrinking evicts down to the new size,
/// writing dirty lines back first, so nothing is lost.
#[utoipa::path(put, path = "/api/v1/pcomponents/{id}/excache", security(("bearer" = [])), params(("id" = u32, Path, description = "The pComponent's id")), request_body = ExcacheChange,
    responses((status = 200, description = "Changed", body = ExcacheView), (status = 400, description = "Not a pComponent; a size out of bounds; shares over the size", body = ErrorBody),
              (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody), (status = 404, description = "No such component", body = ErrorBody),
              (status = 415, description = "Not application/json", body = ErrorBody), (status = 422, description = "Unknown fields or a bad size", body = ErrorBody), (status = 503, description = "It does not answer", body = ErrorBody)))]
pub async fn put(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    Body(c): Body<ExcacheChange>,
) -> Result<Json<ExcacheView>, ApiError> {
    admin_only(&p, peer, &format!("/api/v1/pcomponents/{id}/excache"))?;
    let id = parse_id(&id)?;
    let shares = c.shares.map(|s| {
        s.into_iter()
            .map(|(vnode, b)| ExcacheShare {
                vnode,
                bytes: b.0,
                used: 0,
            })
            .collect()
    });
    let view = change(api, id, c.size.map(|s| s.0), shares).await?;
    tracing::info!(
        id,
        size = view.size_bytes,
        shares = view.shares.len(),
        token = p.name(),
        "ExCache changed through the API"
    );
    Ok(view)
}

async fn change(
    api: Arc<Api>,
    id: u32,
    size: Option<u64>,
    shares: Option<Vec<ExcacheShare>>,
) -> Result<Json<ExcacheView>, ApiError> {
    let gm = api.gm.clone();
    let r = tokio::task::spawn_blocking(move || gm.set_excache(id, size, shares))
        .await
        .map_err(internal)?
        .map_err(refused)?;
    Ok(Json(r.into()))
}

/// A pComponent's ExCache policies as they are now.
#[derive(Serialize, utoipa::ToSchema)]
pub struct PolicyView {
    /// The eviction policy and the read-ahead policy, by their configuration names.
    pub eviction: String,
    pub prefetch: String,
    /// How many times each was replaced since the pComponent started.
    pub eviction_swaps: u64,
    pub prefetch_swaps: u64,
}

impl From<PolicyState> for PolicyView {
    fn from(r: PolicyState) -> PolicyView {
        PolicyView {
            eviction: r.eviction,
            prefetch: r.prefetch,
            eviction_swaps: r.eviction_swaps,
            prefetch_swaps: r.prefetch_swaps,
        }
    }
}

/// Policies to put in place; what is absent stays as it is.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyChange {
    /// An eviction policy: workingset, fifo, clock or ghost-clock (the `eviction` knob's names).
    pub eviction: Option<String>,
    /// A read-ahead policy: leap, sequential or nextline (the `prefetch` knob's names).
    pub prefetch: Option<String>,
}

/// A pComponent's eviction and read-ahead policies (admin only).
#[utoipa::path(get, path = "/api/v1/pcomponents/{id}/policy", security(("bearer" = [])), params(("id" = u32, Path, description = "The pComponent's id")),
    responses((status = 200, description = "The policies", body = PolicyView), (status = 400, description = "Not a pComponent", body = ErrorBody), (status = 401, description = "No valid token", body = ErrorBody),
              (status = 403, description = "Not an admin token", body = ErrorBody), (status = 404, description = "No such component", body = ErrorBody), (status = 503, description = "It does not answer", body = ErrorBody)))]
pub async fn get_policy(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<PolicyView>, ApiError> {
    admin_only(&p, peer, &format!("/api/v1/pcomponents/{id}/policy"))?;
    change_policy(api, parse_id(&id)?, None, None).await
}

/// Replaces a running pComponent's eviction or read-ahead policy (admin only). Programs keep
/// running: the ExCache takes the new policy before its next miss, with the lines it holds.
#[utoipa::path(put, path = "/api/v1/pcomponents/{id}/policy", security(("bearer" = [])), params(("id" = u32, Path, description = "The pComponent's id")), request_body = PolicyChange,
    responses((status = 200, description = "Replaced", body = PolicyView), (status = 400, description = "Not a pComponent; an unknown policy; fifo while access sampling is on", body = ErrorBody),
              (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody), (status = 404, description = "No such component", body = ErrorBody),
              (status = 415, description = "Not application/json", body = ErrorBody), (status = 422, description = "Unknown fields", body = ErrorBody), (status = 503, description = "It does not answer", body = ErrorBody)))]
pub async fn put_policy(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Path(id): Path<String>,
    Body(c): Body<PolicyChange>,
) -> Result<Json<PolicyView>, ApiError> {
    admin_only(&p, peer, &format!("/api/v1/pcomponents/{id}/policy"))?;
    let id = parse_id(&id)?;
    let view = change_policy(api, id, c.eviction, c.prefetch).await?;
    tracing::info!(id, eviction = %view.eviction, prefetch = %view.prefetch, token = p.name(), "ExCache policies replaced through the API");
    Ok(view)
}

async fn change_policy(
    api: Arc<Api>,
    id: u32,
    eviction: Option<String>,
    prefetch: Option<String>,
) -> Result<Json<PolicyView>, ApiError> {
    let gm = api.gm.clone();
    let r = tokio::task::spawn_blocking(move || gm.set_policy(id, eviction, prefetch))
        .await
        .map_err(internal)?
        .map_err(refused)?;
    Ok(Json(r.into()))
}
