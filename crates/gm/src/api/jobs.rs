//! `/api/v1/jobs`: the programs running on the cluster, and signals to them; an admin sees and
//! signals every one, a tenant those of its vNodes.
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};

use super::{internal, refuse, Api, ApiError, ErrorBody, Principal};

/// A program running on the cluster.
#[derive(Serialize, utoipa::ToSchema)]
pub struct JobView {
    /// Its process id in the cluster, a decimal string (64 bits do not fit a JSON number that
    /// JavaScript reads exactly).
    pub pid: String,
    /// Its process id on its pComponent's host.
    pub os_pid: i32,
    pub user: String,
    pub uid: u32,
    pub vnode: String,
    pub command: String,
    pub started_unix_s: u64,
    /// The id of the pComponent it runs on, and its address.
    pub pcomponent: u32,
    pub pcomponent_addr: String,
    /// Counters of its run (all processes one `splitos run` started): ExCache misses served,
    /// lines evicted, lines written back to mComponents.
    pub misses: u64,
    pub evictions: u64,
    pub writebacks: u64,
}

impl JobView {
    pub(super) fn of(c: splitos_rpc::ComponentInfo, j: splitos_rpc::JobInfo) -> JobView {
        JobView {
            pid: j.pid.to_string(),
            os_pid: j.os_pid,
            user: j.user,
            uid: j.uid,
            vnode: j.vnode,
            command: j.command,
            started_unix_s: j.started_unix_s,
            pcomponent: c.id,
            pcomponent_addr: c.addr,
            misses: j.misses,
            evictions: j.evictions,
            writebacks: j.writebacks,
        }
    }
}

/// A pComponent that did not answer for its jobs.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Unanswered {
    pub pcomponent: u32,
    pub error: String,
}

/// The jobs the caller may see.
#[derive(Serialize, utoipa::ToSchema)]
pub struct JobList {
    pub jobs: Vec<JobView>,
    /// pComponents whose jobs are missing from `jobs` because they did not answer (shown to
    /// an admin only).
    pub unanswered: Vec<Unanswered>,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SignalQuery {
    /// TERM (the default), INT, KILL, HUP, USR1 or USR2.
    pub signal: Option<String>,
}

/// The running programs: every one for an admin, those of its vNodes for a tenant.
#[utoipa::path(get, path = "/api/v1/jobs", security(("bearer" = [])),
    responses((status = 200, description = "The jobs", body = JobList), (status = 401, description = "No valid token", body = ErrorBody)))]
pub(super) async fn jobs(
    State(api): State<Arc<Api>>,
    Extension(p): Extension<Principal>,
) -> Result<Json<JobList>, ApiError> {
    let gm = api.gm.clone();
    let jobs = tokio::task::spawn_blocking(move || gm.jobs()).await.map_err(internal)?;
    // Which pComponents are silent is the admin's business.
    let unanswered = match p {
        Principal::Admin { .. } => jobs
            .unanswered
            .into_iter()
            .map(|(c, error)| Unanswered {
                pcomponent: c.id,
                error,
            })
            .collect(),
        Principal::Tenant { .. } => Vec::new(),
    };
    Ok(Json(JobList {
        jobs: jobs
            .running
            .into_iter()
            .filter(|(_, j)| p.may_see_vnode(&j.vnode))
            .map(|(c, j)| JobView::of(c, j))
            .collect(),
        unanswered,
    }))
}

/// Signals a job (SIGTERM unless `signal` says otherwise): an admin any, a tenant those of its
/// vNodes; another tenant's job is 403.
#[utoipa::path(delete, path = "/api/v1/jobs/{pid}", security(("bearer" = [])), params(("pid" = String, Path, description = "The job's pid"), SignalQuery),
    responses((status = 202, description = "Signalled", body = JobView), (status = 400, description = "Not a pid or a signal", body = ErrorBody),
              (status = 401, description = "No valid token", body = ErrorBody), (status = 403, description = "Another tenant's job", body = ErrorBody),
              (status = 404, description = "No such job", body = ErrorBody)))]
pub(super) async fn kill_job(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(p): Extension<Principal>,
    Path(pid): Path<String>,
    Query(q): Query<SignalQuery>,
) -> Result<(StatusCode, Json<JobView>), ApiError> {
    let pid: u64 = pid
        .parse()
        .map_err(|_| ApiError(StatusCode::BAD_REQUEST, format!("{pid:?} is not a pid")))?;
    let signal = match q.signal.as_deref().unwrap_or("TERM").trim_start_matches("SIG") {
        "TERM" => libc::SIGTERM,
        "INT" => libc::SIGINT,
        "KILL" => libc::SIGKILL,
        "HUP" => libc::SIGHUP,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        other => {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("{other:?} is not a signal this API sends (TERM, INT, KILL, HUP, USR1, USR2)"),
            ))
        }
    };
    let gm = api.gm.clone();
    tokio::task::spawn_blocking(move || {
        let Some((c, j)) = gm.jobs().running.into_iter().find(|(_, j)| j.pid == pid) else {
            return Err(ApiError(StatusCode::NOT_FOUND, format!("no job {pid} runs")));
        };
        if !p.may_see_vnode(&j.vnode) {
            return Err(refuse(
                StatusCode::FORBIDDEN,
                peer,
                "DELETE",
                &format!("/api/v1/jobs/{pid}"),
                Some(p.name()),
                format!("job {pid} is not of this token's vNodes"),
            ));
        }
        gm.signal(&c, pid, signal)
            .map_err(|e| ApiError(StatusCode::NOT_FOUND, format!("job {pid}: {e}")))?;
        tracing::info!(pid, signal, token = p.name(), "job signalled through the API");
        Ok((StatusCode::ACCEPTED, Json(JobView::of(c, j))))
    })
    .await
    .map_err(internal)?
}
