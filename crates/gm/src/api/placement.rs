//! `/api/v1/placement`: the global managers' placement policy, replaced while the cluster runs
//! (docs/ebb.md#the-placement-policy-as-an-ebb), admin only. It is the same replacement as the
//! `placement` Ebb's message (`splitos cluster set-placement`).
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use splitos_rpc::PlacementState;

use super::{admin_only, internal, refused, Api, ApiError, Body, ErrorBody, Principal};

/// The placement policy in place.
#[derive(Serialize, utoipa::ToSchema)]
pub struct PlacementView {
    /// least-loaded, best-fit, first-fit or nearest (the `placement` knob's names).
    pub placement: String,
    /// How many times it was replaced since the managers started.
    pub swaps: u64,
}

impl From<PlacementState> for PlacementView {
    fn from(s: PlacementState) -> PlacementView {
        PlacementView {
            placement: s.placement,
            swaps: s.swaps,
        }
    }
}

/// A placement policy to put in place.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PlacementChange {
    pub placement: String,
}

/// The global managers' placement policy (admin only).
#[utoipa::path(get, path = "/api/v1/placement", security(("bearer" = [])),
    responses((status = 200, description = "The policy", body = PlacementView), (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Not an admin token", body = ErrorBody)))]
pub async fn get(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
) -> Result<Json<PlacementView>, ApiError> {
    admin_only(&p, peer, "/api/v1/placement")?;
    Ok(Json(api.gm.placement(None).map_err(refused)?.into()))
}

/// Replaces the placement policy while the cluster runs (admin only): placements from then on
/// follow it; what is placed stays where it is. It is kept in the managers' state, and
/// outlives their restart.
#[utoipa::path(put, path = "/api/v1/placement", security(("bearer" = [])), request_body = PlacementChange,
    responses((status = 200, description = "Replaced", body = PlacementView), (status = 400, description = "An unknown policy", body = ErrorBody), (status = 401, description = "No valid token", body = ErrorBody),
              (status = 403, description = "Not an admin token", body = ErrorBody), (status = 415, description = "Not application/json", body = ErrorBody), (status = 422, description = "Unknown fields", body = ErrorBody)))]
pub async fn put(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Body(c): Body<PlacementChange>,
) -> Result<Json<PlacementView>, ApiError> {
    admin_only(&p, peer, "/api/v1/placement")?;
    // Kept in the managers' state first (etcd may take a while): not on the API's thread.
    let gm = api.gm.clone();
    let now = tokio::task::spawn_blocking(move || gm.placement(Some(c.placement)))
        .await
        .map_err(internal)?
        .map_err(refused)?;
    tracing::info!(placement = %now.placement, token = p.name(), "placement policy replaced through the API");
    Ok(Json(now.into()))
}
