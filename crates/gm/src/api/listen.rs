//! Where the REST API listens: every manager serves it from its start (only the leader
//! answers, [`super::follow`]), and at the same address across a step-down and a restart.
use std::sync::Arc;

use axum::Router;

use super::{follow, tls, GmArgs, Manager};

/// Serves the REST API of this manager unless the configuration turns it off: what `gm::run`
/// is given to start it with, before the election (main.rs). Every manager serves it, and only
/// the leader answers ([`follow`]).
pub fn start(manager: &Arc<Manager>, args: &GmArgs) -> anyhow::Result<()> {
    let cfg = &args.cluster;
    if cfg.api == "off" {
        return Ok(());
    }
    let tls = match (&args.api_cert, &args.api_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        _ => None,
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    // A manager that starts again after leading serves where it did (its port may have been
    // any free one); so does one whose process was started again (by hand, by systemd), where
    // its tools and its dashboard still look, if that address is free.
    let again = std::env::var(crate::manager::API_AGAIN).ok();
    let before = again.clone().or_else(|| served_before(manager, &args.listen, &cfg.api));
    let routes = follow::router(manager.clone(), serde_json::to_value(cfg)?);
    let at = match before {
        Some(b) if again.is_none() => serve(&b, routes.clone(), tls.clone(), cfg.api_connections_per_peer).or_else(|e| {
            tracing::warn!(before = %b, error = %e, "cannot serve the REST API where this manager did before; serving at a new address");
            serve(&cfg.api, routes, tls, cfg.api_connections_per_peer)
        })?,
        Some(b) => serve(&b, routes, tls, cfg.api_connections_per_peer)?,
        None => serve(&cfg.api, routes, tls, cfg.api_connections_per_peer)?,
    };
    if let Err(e) = manager.store.put(API_SERVED, &args.listen, Some(&at)) {
        tracing::warn!(error = %e, "cannot keep the REST API's address in the managers' state: a restart may serve it elsewhere");
    }
    tracing::info!(api = %at, scheme, "serving the REST API (answered while this manager leads)");
    let _ = crate::manager::API_AT.set(at);
    Ok(())
}

/// Where each manager served the REST API, by the manager's own address.
const API_SERVED: splitos_core::state::Table = splitos_core::state::Table("api-served");

/// The address this manager (listening at `me`) served the API at before, when `configured`
/// leaves the port to chance: only on the configured host, so that a value in the state
/// names no other interface.
fn served_before(manager: &Manager, me: &str, configured: &str) -> Option<String> {
    let (host, port) = configured.rsplit_once(':')?;
    if port != "0" {
        return None;
    }
    let before: Vec<(String, String)> = manager.store.load_keyed(API_SERVED).ok()?;
    let (_, at) = before.into_iter().find(|(k, _)| k == me)?;
    let addr: std::net::SocketAddr = at.parse().ok()?;
    let wanted: std::net::IpAddr = host.trim_matches(['[', ']']).parse().ok()?;
    (addr.ip() == wanted).then_some(at)
}

/// Serves `routes` at `addr` on a thread of its own, each peer holding at most `per_peer`
/// connections at once; returns the address it listens at. Beyond loopback only with `tls`:
/// its tokens must not cross a network in the clear.
fn serve(
    addr: &str,
    routes: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    per_peer: usize,
) -> anyhow::Result<String> {
    let l =
        std::net::TcpListener::bind(addr).map_err(|e| anyhow::anyhow!("the REST API cannot listen on {addr}: {e}"))?;
    let local = l.local_addr()?;
    if !local.ip().is_loopback() && tls.is_none() {
        anyhow::bail!("the REST API listens beyond loopback ({local}) only with TLS: give --api-cert and --api-key (docs/control-plane.md)");
    }
    splitos_core::telemetry::serve_router(l, routes, "api", tls, per_peer)?;
    Ok(local.to_string())
}
