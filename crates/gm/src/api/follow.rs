//! Every manager serves the REST API at its own address, from its start to its end, so that
//! an address a client holds outlives a handover (docs/control-plane.md#where-it-listens).
//! Only the leader answers the API: a request that reaches a follower is checked as the
//! leader would check it (a token for everything under `/api/`) and then answered `421
//! Misdirected Request` naming the leader's API, which the command-line tools and the
//! dashboard go to; `503` while no leader is elected. A follower serves what holds no data
//! itself: `/livez`, `/openapi.json` and the dashboard's page.
//!
//! The dashboard's page reads its event stream from the leader's API, which may be another
//! origin than the one that served the page (a follower's, or a manager that died since): the
//! event stream answers the managers' own API origins, and only them, across origins (CORS),
//! and the page's policy lets it connect to them and nowhere else.
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use super::{dashboard, internal, livez, openapi, path_of, refuse, Api};
use crate::Manager;

/// The path of the event stream, the one resource a page of another manager's origin reads.
const EVENTS: &str = "/api/v1/events";

/// The header every answer of a manager's API carries: an address a client keeps may be held
/// by another server once its manager has gone (its port taken by another's bind), and the
/// client asks the next manager rather than read that server's answer as the cluster's.
pub const MANAGER_HEADER: &str = "splitos-manager";

/// What every manager's API server holds: the manager, and the leader's routes once it leads.
pub(super) struct Switch {
    manager: Arc<Manager>,
    config: serde_json::Value,
    /// The API as the leader serves it, made the first time this manager answers as leader
    /// (a manager leads once per process: it starts again when it stops).
    leading: OnceLock<Router>,
}

/// A follower's answer: where the leader serves the API.
#[derive(Serialize)]
pub struct NotLeader {
    pub error: String,
    /// The leader's API address (none while no leader is elected).
    pub leader_api: Option<String>,
    /// The same as a URL (`http://` on loopback, else `https://`), for a page.
    pub leader_url: Option<String>,
}

/// The URL of an API address: the API serves HTTPS beyond loopback and HTTP on it.
pub fn url_of(api: &str) -> String {
    let loopback = api.parse::<SocketAddr>().is_ok_and(|a| a.ip().is_loopback());
    format!("{}://{api}", if loopback { "http" } else { "https" })
}

/// Every manager's router: what any manager serves, and the rest by the leader's routes or a
/// follower's answer.
pub(super) fn router(manager: Arc<Manager>, config: serde_json::Value) -> Router {
    let switch = Arc::new(Switch {
        manager,
        config,
        leading: OnceLock::new(),
    });
    Router::new()
        .route("/livez", get(livez))
        .route("/openapi.json", get(openapi))
        .route("/", get(page))
        .route("/dashboard", get(page))
        .fallback(switched)
        .layer(middleware::from_fn_with_state(switch.clone(), cross_origin))
        .layer(middleware::map_response(signed))
        .with_state(switch)
}

async fn signed(mut r: Response) -> Response {
    r.headers_mut()
        .insert(MANAGER_HEADER, HeaderValue::from_static(env!("CARGO_PKG_VERSION")));
    r
}

/// The dashboard's page, allowed to connect to every manager's API.
async fn page(State(s): State<Arc<Switch>>) -> Response {
    dashboard::page(&origins(&s).await).await
}

/// The API's origins of every manager of the cluster, alive or not: a page one of them served
/// reads the stream from the leader.
async fn origins(s: &Arc<Switch>) -> Vec<String> {
    let m = s.manager.clone();
    tokio::task::spawn_blocking(move || m.apis_known())
        .await
        .unwrap_or_default()
        .iter()
        .map(|a| url_of(a))
        .collect()
}

async fn switched(State(s): State<Arc<Switch>>, req: Request) -> Response {
    let Some(gm) = s.manager.leading() else {
        return follow(s, req).await;
    };
    let mut routes = s
        .leading
        .get_or_init(|| {
            super::router(Arc::new(Api {
                gm: gm.clone(),
                config: s.config.clone(),
            }))
        })
        .clone();
    std::future::poll_fn(|cx| tower_service::Service::<Request>::poll_ready(&mut routes, cx))
        .await
        .unwrap_or_else(|never| match never {});
    match tower_service::Service::call(&mut routes, req).await {
        Ok(r) => r,
        Err(never) => match never {},
    }
}

/// A follower's answer to what only the leader answers.
async fn follow(s: Arc<Switch>, req: Request) -> Response {
    let path = path_of(&req);
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)), |c| c.0);
    // As strict as the leader: a follower tells the way only to a caller the leader would
    // answer. The join routes prove themselves with the join token in their body, which the
    // leader checks.
    let joining = path == "/api/v1/join" || path == "/api/v1/join/ca";
    let checked = path.starts_with("/api/") && !joining || path == "/metrics";
    if checked {
        let token = match splitos_core::telemetry::bearer(req.headers()) {
            None => Err("no bearer token (Authorization: Bearer TOKEN; tokens: splitos cluster token create)"),
            Some(None) => Err("the Authorization header is not a bearer token"),
            Some(Some(t)) => Ok(t.to_string()),
        };
        let m = s.manager.clone();
        let principal = match token {
            Ok(t) => tokio::task::spawn_blocking(move || m.check_token(&t))
                .await
                .map_err(internal)
                .and_then(|r| r.map_err(internal))
                .map(|p| p.ok_or("not a valid token (revoked, or never issued)")),
            Err(why) => Ok(Err(why)),
        };
        match principal {
            Ok(Ok(_)) => {}
            Ok(Err(why)) => {
                return refuse(
                    StatusCode::UNAUTHORIZED,
                    peer,
                    req.method().as_str(),
                    &path,
                    None,
                    why.into(),
                )
                .into_response()
            }
            Err(e) => return e.into_response(),
        }
    }
    let m = s.manager.clone();
    let leader = tokio::task::spawn_blocking(move || m.leader_api()).await.ok().flatten();
    crate::series::FOLLOWER_REQUESTS.increment(1);
    let (status, error) = match &leader {
        Some(api) => (
            StatusCode::MISDIRECTED_REQUEST,
            format!("this global manager follows: the REST API is answered by the leader, at {api}"),
        ),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "this global manager follows, and no leader is elected yet: try again in a moment".to_string(),
        ),
    };
    let mut r = (
        status,
        Json(NotLeader {
            error,
            leader_url: leader.as_deref().map(url_of),
            leader_api: leader,
        }),
    )
        .into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

/// Lets a dashboard page of another manager's origin read the event stream here: its preflight
/// answered, and its answers (the stream, a refusal, a follower's `421`) readable by it. Any
/// other origin, and every other resource, gets no such header, as before.
async fn cross_origin(State(s): State<Arc<Switch>>, req: Request, next: Next) -> Response {
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .map(String::from);
    let Some(origin) = origin.filter(|_| path_of(&req) == EVENTS) else {
        return next.run(req).await;
    };
    if !origins(&s).await.contains(&origin) {
        return next.run(req).await;
    }
    let allow = HeaderValue::from_str(&origin).expect("an origin that is a manager's API is a header value");
    let mut r = if req.method() == Method::OPTIONS {
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET"));
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, accept"),
        );
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        r
    } else {
        next.run(req).await
    };
    r.headers_mut().insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, allow);
    r.headers_mut().append(header::VARY, HeaderValue::from_static("origin"));
    r
}
