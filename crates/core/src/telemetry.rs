//! A component's metrics as Prometheus reads them (docs/control-plane.md, "Metrics"): every
//! series is named `splitos_…`, counts in base units (`_total`, `_bytes`, `_seconds`), and
//! carries the `component` (its RPC address) and `role` labels; `splitos_build_info` says
//! what runs. Values are taken when asked for, so a scrape sees them live.
//!
//! Two kinds of series meet in one exposition: those recorded through the `metrics` crate as
//! things happen (its recorder adds the prefix and the labels), and the components' counter
//! sets and gauges, rendered by the sources each component registers ([`on_render`]).
//!
//! Each component serves them at its metrics address ([`serve`]): on loopback to anyone on
//! the host who can reach it, as the rest of its state; beyond loopback only to a request
//! with an admin token of the REST API.
use std::sync::{Arc, Mutex, OnceLock};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::layers::{Layer, PrefixLayer};
use splitos_metrics::{escape, Exposition, PREFIX};
use splitos_rpc::Role;

/// How long an HTTP client may take to send a request's headers, or keep a connection idle.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// HTTP connections an HTTP server serves at once.
pub const MAX_CONNECTIONS: usize = 256;
/// HTTP connections one peer ([`Peer`]) may hold on an HTTP server at once, unless its
/// configuration says otherwise (the REST API's `[cluster] api_connections_per_peer`).
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;

/// Threads an HTTP server's handlers may block in at once (calls to components, rendering);
/// more wait for one.
pub const BLOCKING_THREADS: usize = 4;

/// A component's series rendered at each scrape.
type Source = Box<dyn Fn(&mut Exposition) + Send + Sync>;

struct Registry {
    handle: PrometheusHandle,
    /// `component="…",role="…"`, for the series rendered here rather than by the recorder.
    labels: String,
    sources: Mutex<Vec<Source>>,
}

static REGISTRY: OnceLock<Registry> = OnceLock::new();

/// Installs the process's metrics recorder, labelling every series with the component's
/// address and role. Series recorded before it are lost, so a component calls it as soon as
/// it knows its address.
pub fn init(role: Role, component: &str) {
    REGISTRY.get_or_init(|| {
        let role = role.name();
        let recorder = PrometheusBuilder::new()
            .add_global_label("component", component)
            .add_global_label("role", role)
            .build_recorder();
        let handle = recorder.handle();
        match metrics::set_global_recorder(PrefixLayer::new(PREFIX).layer(recorder)) {
            Ok(()) => splitos_metrics::describe(),
            Err(e) => tracing::warn!("metrics recorder not installed: {e}"),
        }
        Registry {
            handle,
            labels: format!("component=\"{}\",role=\"{role}\"", escape(component)),
            sources: Mutex::default(),
        }
    });
}

/// Adds a source of series rendered at every scrape.
pub fn on_render(f: impl Fn(&mut Exposition) + Send + Sync + 'static) {
    if let Some(r) = REGISTRY.get() {
        r.sources.lock().unwrap().push(Box::new(f));
    }
}

/// The component's series now, in the Prometheus text format.
pub fn render() -> String {
    let Some(r) = REGISTRY.get() else { return String::new() };
    let mut e = Exposition::new(r.labels.clone());
    e.family(
        &crate::series::BUILD_INFO,
        [(
            [
                env!("CARGO_PKG_VERSION").to_string(),
                splitos_rpc::WIRE_VERSION.to_string(),
            ],
            1.0,
        )],
    );
    for source in r.sources.lock().unwrap().iter() {
        source(&mut e);
    }
    // The sources may have set the recorder's gauges: it renders last.
    r.handle.render() + e.text()
}

/// One family as it arrives from a component: its help and type lines and its samples.
#[derive(Default)]
struct Family {
    meta: Vec<String>,
    samples: Vec<String>,
}

/// Several components' expositions as one: each family's help and type once, then every
/// component's samples of it (the text format allows a family only once). The components'
/// labels keep their samples apart.
pub fn merge(texts: impl IntoIterator<Item = String>) -> String {
    let mut families: std::collections::BTreeMap<String, Family> = Default::default();
    for text in texts {
        let mut current = String::new();
        for line in text.lines() {
            if let Some(meta) = line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")) {
                current = meta.split(' ').next().unwrap_or_default().to_string();
                let f = families.entry(current.clone()).or_default();
                if !f.meta.iter().any(|m| m[..7] == line[..7]) {
                    f.meta.push(line.to_string());
                }
            } else if !line.is_empty() && !line.starts_with('#') {
                // A sample outside its family's lines (a recorder's series without help)
                // belongs to the family its name starts.
                let name = line.split(['{', ' ']).next().unwrap_or_default();
                let family = if name.starts_with(&current) && !current.is_empty() {
                    current.clone()
                } else {
                    name.to_string()
                };
                families.entry(family).or_default().samples.push(line.to_string());
            }
        }
    }
    let mut out = String::new();
    for f in families.values() {
        for l in f.meta.iter().chain(&f.samples) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// The bearer token of a request: `None` without an Authorization header, `Some(None)` with
/// one of another scheme (which RFC 7235 names case-insensitively).
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<Option<&str>> {
    let v = headers.get(axum::http::header::AUTHORIZATION)?;
    Some(
        v.to_str()
            .ok()
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim()),
    )
}

/// Serves `GET /metrics` at `addr` on a thread of its own; returns the address it listens at.
/// On loopback it answers anyone who reaches it (the host's own users, as for the rest of the
/// component's state on the host); beyond loopback only a request whose bearer token
/// `token_check` accepts: metrics name programs, vNodes and addresses, which are not for the
/// network.
pub fn serve(addr: &str, token_check: impl Fn(&str) -> bool + Send + Sync + 'static) -> anyhow::Result<String> {
    use axum::extract::Request;
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;

    let l = std::net::TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("the metrics address {addr} cannot be served: {e}"))?;
    let local = l.local_addr()?;
    let gate = (!local.ip().is_loopback()).then(|| Arc::new(token_check));
    let metrics = move |req: Request| {
        let check = gate.clone();
        async move {
            if let Some(check) = check {
                let allowed = match bearer(req.headers()) {
                    Some(Some(t)) => {
                        let t = t.to_string();
                        tokio::task::spawn_blocking(move || check(&t)).await.unwrap_or(false)
                    }
                    _ => false,
                };
                if !allowed {
                    crate::series::SCRAPES_REFUSED.increment(1);
                    return (
                        StatusCode::UNAUTHORIZED,
                        [(header::WWW_AUTHENTICATE, "Bearer")],
                        "an admin token of the REST API is needed beyond loopback\n".to_string(),
                    )
                        .into_response();
                }
            }
            let text = tokio::task::spawn_blocking(render).await.unwrap_or_default();
            (
                [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                text,
            )
                .into_response()
        }
    };
    let router = axum::Router::new().route("/metrics", axum::routing::get(metrics));
    serve_router(l, router, "metrics", None, MAX_CONNECTIONS_PER_PEER)?;
    Ok(local.to_string())
}

/// Whose connections an HTTP server's per-peer cap counts together: a peer on another host is
/// its address; on this host every user shares the addresses (loopback's and the host's own),
/// so a local peer is the user that owns the connecting socket.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Peer {
    /// A peer on another host: its address.
    Remote(std::net::IpAddr),
    /// A peer on this host: its user.
    Local(u32),
}

impl Peer {
    fn of(peer: std::net::SocketAddr, local: std::net::SocketAddr) -> Peer {
        match crate::sys::tcp_peer_uid(peer, local) {
            Some(uid) => Peer::Local(uid),
            None => Peer::Remote(peer.ip().to_canonical()),
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Remote(ip) => write!(f, "{ip}"),
            Peer::Local(uid) => write!(f, "uid {uid} on this host"),
        }
    }
}

/// Connections each peer holds on one server.
type Held = Arc<Mutex<std::collections::HashMap<Peer, usize>>>;

/// One of a peer's connections, given back when dropped.
struct PeerSlot(Held, Peer);

impl PeerSlot {
    fn take(held: &Held, peer: &Peer, max: usize) -> Option<PeerSlot> {
        let mut h = held.lock().unwrap();
        let n = h.entry(peer.clone()).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot(held.clone(), peer.clone()))
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut h = self.0.lock().unwrap();
        if let Some(n) = h.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                h.remove(&self.1);
            }
        }
    }
}

/// HTTP connections closed as soon as they were accepted, logged a few at a time.
static CONNECTIONS_REFUSED: splitos_rpc::refusals::Refusals =
    splitos_rpc::refusals::Refusals::new("HTTP connections refused");

/// Closes a connection beyond `cap` ("peer": its peer's, or "all"), counted and logged.
fn refuse_connection(server: &str, peer: &Peer, cap: &'static str) {
    crate::series::HTTP_CONNECTIONS_REFUSED
        .with([server.to_string(), cap.to_string()])
        .increment(1);
    if CONNECTIONS_REFUSED.log_this(peer) {
        let why = match cap {
            "peer" => "the peer holds as many connections as one peer may",
            _ => "the server holds as many connections as it serves at once",
        };
        tracing::warn!(server, %peer, cap, "HTTP connection refused: {why}");
    }
}

/// Serves `router` on `l` from a thread of its own with a single-threaded runtime, so that a
/// flood of HTTP clients holds one thread, and at most [`BLOCKING_THREADS`] more for the
/// blocking work of its handlers, and never the component's request serving. Each connection
/// must send a request's headers within [`HEADER_TIMEOUT`] (an idle kept-alive one too) or is
/// closed; one [`Peer`] holds at most `per_peer` connections at once, and all peers at most
/// [`MAX_CONNECTIONS`]: clients that connect and send nothing, or send slowly, hold a bounded
/// number of sockets for a bounded time, one client never all of them, and a connection beyond
/// either bound is closed at once. Root's connections from this host count to their own
/// per-peer bound but not to the server's: others' floods never shut the host's operators out.
/// With `tls` it serves HTTPS, the handshake held to the same time as the headers.
pub fn serve_router(
    l: std::net::TcpListener,
    router: axum::Router,
    name: &str,
    tls: Option<tokio_rustls::TlsAcceptor>,
    per_peer: usize,
) -> anyhow::Result<()> {
    l.set_nonblocking(true)?;
    let local = l.local_addr()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .build()?;
    let what = name.to_string();
    std::thread::Builder::new()
        .name(format!("http-{name}"))
        .spawn(move || {
            rt.block_on(async move {
                let l = match tokio::net::TcpListener::from_std(l) {
                    Ok(l) => l,
                    Err(e) => return tracing::error!("the {what} server cannot serve: {e}"),
                };
                let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
                let held = Held::default();
                loop {
                    let (stream, peer) = match l.accept().await {
                        Ok(c) => c,
                        Err(e) => {
                            // Out of descriptors, most likely: others' connections end and free some.
                            tracing::warn!("the {what} server cannot accept a connection: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let who = Peer::of(peer, stream.local_addr().unwrap_or(local));
                    let Some(mine) = PeerSlot::take(&held, &who, per_peer) else {
                        refuse_connection(&what, &who, "peer");
                        continue;
                    };
                    let slot = match slots.clone().try_acquire_owned() {
                        Ok(slot) => Some(slot),
                        // The host's operators: bounded by their own cap, not shut out by others.
                        Err(_) if who == Peer::Local(0) => None,
                        Err(_) => {
                            refuse_connection(&what, &who, "all");
                            continue;
                        }
                    };
                    let service = hyper_util::service::TowerToHyperService::new(
                        router.clone().layer(axum::Extension(axum::extract::ConnectInfo(peer))),
                    );
                    let (tls, what) = (tls.clone(), what.clone());
                    tokio::spawn(async move {
                        match tls {
                            Some(tls) => match tokio::time::timeout(HEADER_TIMEOUT, tls.accept(stream)).await {
                                Ok(Ok(s)) => serve_connection(s, service).await,
                                Ok(Err(e)) => {
                                    crate::series::TLS_HANDSHAKES_FAILED.with([what]).increment(1);
                                    tracing::debug!(%peer, "TLS handshake failed: {e}");
                                }
                                Err(_) => crate::series::TLS_HANDSHAKES_FAILED.with([what]).increment(1),
                            },
                            None => serve_connection(stream, service).await,
                        }
                        drop((slot, mine));
                    });
                }
            })
        })?;
    Ok(())
}

/// Serves HTTP/1.1 on one connection, plain or TLS, until it ends.
async fn serve_connection<S, Io>(io: Io, service: S)
where
    Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<hyper::Request<hyper::body::Incoming>, Response = axum::response::Response>
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    let _ = http.serve_connection(hyper_util::rt::TokioIo::new(io), service).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_of_several_components_merge_with_their_help_once() {
        let a = "# HELP splitos_x_total X.\n# TYPE splitos_x_total counter\nsplitos_x_total{component=\"a\"} 1\nsplitos_y{component=\"a\"} 2\n";
        let b = "# HELP splitos_x_total X.\n# TYPE splitos_x_total counter\nsplitos_x_total{component=\"b\"} 3\n";
        let m = merge([a.to_string(), b.to_string()]);
        assert_eq!(m, "# HELP splitos_x_total X.\n# TYPE splitos_x_total counter\nsplitos_x_total{component=\"a\"} 1\nsplitos_x_total{component=\"b\"} 3\nsplitos_y{component=\"a\"} 2\n");
    }
}
