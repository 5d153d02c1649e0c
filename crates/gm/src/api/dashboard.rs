//! The live dashboard (docs/control-plane.md#dashboard): one page served at `/` and
//! `/dashboard`, and the event stream it reads, `GET /api/v1/events`.
//!
//! The page holds no data and is public; it asks for a token and reads the stream with it, so
//! that what it shows is what the token may see, enforced here as by the rest of the API. It
//! is self-contained (no script or style from elsewhere), and its Content-Security-Policy lets
//! it run only its own inline script and style and connect only to the API that served it.
//!
//! A stream sends a snapshot every [`PERIOD`]. Snapshots are taken for all streams together:
//! one open within half a period of another's snapshot is sent that one, so that any number of
//! open dashboards ask the components once per period. A stream is polled by its connection's
//! task and holds nothing else; it ends when its client goes away (the next write fails), when
//! its token is revoked, and at most [`MAX_STREAMS`] are open at once, so that dashboards left
//! open never take the connections every other client needs.
use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime};

use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};
use axum::Extension;
use serde::Serialize;
use splitos_rpc::{ComponentInfo, JobInfo, VnodeInfo};

use super::{internal, refuse, Api, ApiError, ComponentView, JobView, Principal, Unanswered, WhoAmI};
use crate::Gm;

/// The time between two snapshots of a stream: what a person watching sees as live, and one
/// round trip to each component per period whatever the number of dashboards.
pub const PERIOD: Duration = Duration::from_secs(1);

/// The most event streams open at once; one more is refused (503).
pub const MAX_STREAMS: usize = 32;
/// The most one token may hold open, so that one tenant's dashboards (or a script) cannot take
/// every stream from the others.
pub const MAX_STREAMS_PER_TOKEN: usize = 4;

const PAGE: &str = include_str!("dashboard.html");

/// Lets the page run its own inline script and style (by their hashes) and nothing else, and
/// connect only to the API that served it and the other managers' (`origins`), where the
/// leader's may be.
fn policy(origins: &[String]) -> String {
    static HASHES: LazyLock<(String, String)> = LazyLock::new(|| {
        let hash = |tag: &str| {
            use base64::Engine;
            use sha2::Digest;
            let body = PAGE
                .split_once(&format!("<{tag}>"))
                .and_then(|(_, rest)| rest.split_once(&format!("</{tag}>")))
                .map(|(body, _)| body)
                .expect("the page has its script and style elements, without attributes");
            format!(
                "'sha256-{}'",
                base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(body.as_bytes()))
            )
        };
        (hash("script"), hash("style"))
    });
    let connect: String = origins.iter().map(|o| format!(" {o}")).collect();
    format!("default-src 'none'; script-src {}; style-src {}; connect-src 'self'{connect}; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'", HASHES.0, HASHES.1)
}

/// The dashboard's page: no data in it, so no token needed. `origins`: the managers' APIs.
pub(super) async fn page(origins: &[String]) -> Response {
    let policy =
        HeaderValue::from_str(&policy(origins)).unwrap_or_else(|_| HeaderValue::from_static("default-src 'none'"));
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ),
            (header::CONTENT_SECURITY_POLICY, policy),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        PAGE,
    )
        .into_response()
}

/// The route of `GET /api/v1/events`, with what its streams share.
pub(super) fn events_route() -> MethodRouter<Arc<Api>> {
    get(events).layer(Extension(Arc::new(Shared {
        latest: Default::default(),
        slots: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
        per_token: Default::default(),
    })))
}

/// One snapshot of the cluster as the token may see it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Snapshot {
    /// When the managers took it, in milliseconds since the Unix epoch.
    pub time_unix_ms: u64,
    /// The time between two snapshots, in milliseconds.
    pub period_ms: u64,
    pub whoami: WhoAmI,
    /// Every component the managers know, with its load and memory (null for a tenant's token).
    pub components: Option<Vec<ComponentView>>,
    /// The vNodes the token may see: those of the managers' table, and those that run jobs or
    /// hold memory.
    pub vnodes: Vec<VnodeUse>,
    /// The jobs the token may see, as `GET /api/v1/jobs` lists them, with their rates.
    pub jobs: Vec<LiveJob>,
    /// pComponents whose jobs are missing because they did not answer (an admin's only).
    pub unanswered: Vec<Unanswered>,
    /// The topology graph, as `GET /api/v1/topology` answers it (null for a tenant's token).
    pub topology: Option<splitos_core::topology::Graph>,
    /// Every manager's API (URLs): where the page looks for the leader when the stream breaks.
    pub apis: Vec<String>,
}

/// A vNode's memory and the counters of its jobs.
#[derive(Serialize, utoipa::ToSchema)]
pub struct VnodeUse {
    pub name: String,
    /// Its memory quota in bytes; null: none.
    pub memory_bytes: Option<u64>,
    /// Bytes its processes map writable, which is what its quota limits, as the mComponents
    /// that are homes of its processes count them (those that answered within 2 s).
    pub mapped_bytes: u64,
    /// How many of its jobs run, and the sums of their counters.
    pub jobs: u32,
    pub misses: u64,
    pub evictions: u64,
    pub writebacks: u64,
    /// The sum of its jobs' misses per second (null until the stream's second snapshot).
    pub misses_per_s: Option<f64>,
}

/// A job with the rates of its counters.
#[derive(Serialize, utoipa::ToSchema)]
pub struct LiveJob {
    #[serde(flatten)]
    pub job: JobView,
    /// Change of its counters per second since this stream's previous snapshot (null in the
    /// first snapshot, and for a job that started since).
    pub misses_per_s: Option<f64>,
    pub evictions_per_s: Option<f64>,
    pub writebacks_per_s: Option<f64>,
}

/// What the managers know at one time, before it is cut to what a token may see.
struct Raw {
    taken: Instant,
    time_unix_ms: u64,
    comps: Vec<ComponentInfo>,
    vnodes: Vec<VnodeInfo>,
    jobs: crate::Jobs,
    /// Per vNode, bytes mapped writable on the mComponents (from their metrics).
    mapped: BTreeMap<String, u64>,
    topology: splitos_core::topology::Graph,
    apis: Vec<String>,
}

impl Raw {
    /// Asks the pComponents for their jobs and every component for its metrics, at once.
    fn take(gm: &Gm) -> Raw {
        let (jobs, metrics) = std::thread::scope(|s| {
            let metrics = s.spawn(|| gm.cluster_metrics());
            (gm.jobs(), metrics.join().unwrap_or_default())
        });
        Raw {
            taken: Instant::now(),
            time_unix_ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            comps: gm.snapshot(),
            vnodes: gm.vnodes.list().1,
            jobs,
            mapped: mapped_by_vnode(&metrics),
            topology: gm.topology(),
            apis: gm.apis().iter().map(|a| super::url_of(a)).collect(),
        }
    }
}

/// The gauge `splitos_mcomp_vnode_memory_bytes` of a Prometheus exposition, summed per vNode
/// over the mComponents.
fn mapped_by_vnode(exposition: &str) -> BTreeMap<String, u64> {
    let mut by = BTreeMap::new();
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("splitos_mcomp_vnode_memory_bytes{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let (Some(vnode), Ok(v)) = (label(labels, "vnode"), value.trim().parse::<f64>()) else {
            continue;
        };
        *by.entry(vnode).or_insert(0) += v as u64;
    }
    by
}

/// The value of label `name` in a sample's labels (`a="x",b="y"`), unescaped.
fn label(labels: &str, name: &str) -> Option<String> {
    let mut rest = labels;
    loop {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        if key.trim_start_matches(',') == name {
            return Some(value);
        }
        rest = &after[end + 1..];
    }
}

/// What the streams of one API share: the last snapshot, and their slots.
pub(super) struct Shared {
    latest: tokio::sync::Mutex<Option<Arc<Raw>>>,
    slots: Arc<tokio::sync::Semaphore>,
    /// Streams open per token, by its name.
    per_token: Arc<std::sync::Mutex<HashMap<String, usize>>>,
}

impl Shared {
    /// A snapshot taken after `after`: another stream's if it is less than half a period old,
    /// else a new one. Streams that want one at once wait for the one being taken.
    async fn after(&self, gm: &Arc<Gm>, after: Option<Instant>) -> Result<Arc<Raw>, ApiError> {
        let mut latest = self.latest.lock().await;
        if let Some(r) = latest
            .as_ref()
            .filter(|r| after.is_none_or(|a| r.taken > a) && r.taken.elapsed() < PERIOD / 2)
        {
            return Ok(r.clone());
        }
        let gm = gm.clone();
        let r = Arc::new(
            tokio::task::spawn_blocking(move || Raw::take(&gm))
                .await
                .map_err(internal)?,
        );
        *latest = Some(r.clone());
        Ok(r)
    }
}

/// An open stream's slot, counted while it is open.
struct Slot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    per_token: Arc<std::sync::Mutex<HashMap<String, usize>>>,
    token: String,
}

impl Slot {
    /// A slot for one more stream of the token named `token`, if it holds fewer than
    /// [`MAX_STREAMS_PER_TOKEN`].
    fn new(permit: tokio::sync::OwnedSemaphorePermit, shared: &Shared, token: &str) -> Option<Slot> {
        let mut per_token = shared.per_token.lock().unwrap();
        let open = per_token.entry(token.to_string()).or_default();
        if *open >= MAX_STREAMS_PER_TOKEN {
            return None;
        }
        *open += 1;
        crate::series::API_EVENT_STREAMS.increment(1.0);
        Some(Slot {
            _permit: permit,
            per_token: shared.per_token.clone(),
            token: token.to_string(),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut per_token = self.per_token.lock().unwrap();
        if let Some(open) = per_token.get_mut(&self.token) {
            *open -= 1;
            if *open == 0 {
                per_token.remove(&self.token);
            }
        }
        crate::series::API_EVENT_STREAMS.decrement(1.0);
    }
}

/// One open stream.
struct Stream {
    api: Arc<Api>,
    shared: Arc<Shared>,
    /// Checked again at every snapshot: a token revoked meanwhile ends the stream.
    token: String,
    ticks: tokio::time::Interval,
    /// The last snapshot sent, with the counters of its jobs, for their rates.
    last: Option<(Instant, HashMap<u64, [u64; 3]>)>,
    ended: bool,
    _slot: Slot,
}

fn counters(j: &JobInfo) -> [u64; 3] {
    [j.misses, j.evictions, j.writebacks]
}

impl Stream {
    async fn next(&mut self) -> Event {
        self.ticks.tick().await;
        let Some(p) = self.api.gm.tokens.check(&self.token) else {
            self.ended = true;
            return error_event(StatusCode::UNAUTHORIZED, "the token was revoked");
        };
        let raw = match self.shared.after(&self.api.gm, self.last.as_ref().map(|l| l.0)).await {
            Ok(r) => r,
            Err(ApiError(status, why)) => return error_event(status, &why),
        };
        let snap = self.view(&raw, p);
        self.last = Some((
            raw.taken,
            raw.jobs.running.iter().map(|(_, j)| (j.pid, counters(j))).collect(),
        ));
        Event::default()
            .event("snapshot")
            .json_data(&snap)
            .unwrap_or_else(|e| error_event(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()))
    }

    /// `raw` as `p` may see it, with the rates since the last snapshot sent.
    fn view(&self, raw: &Raw, p: Principal) -> Snapshot {
        let rates = |j: &JobInfo| -> Option<[f64; 3]> {
            let (at, before) = self.last.as_ref()?;
            let (dt, before) = (raw.taken.duration_since(*at).as_secs_f64(), before.get(&j.pid)?);
            let now = counters(j);
            Some(std::array::from_fn(|i| now[i].saturating_sub(before[i]) as f64 / dt))
        };
        let jobs: Vec<LiveJob> = raw
            .jobs
            .running
            .iter()
            .filter(|(_, j)| p.may_see_vnode(&j.vnode))
            .map(|(c, j)| {
                let r = rates(j);
                LiveJob {
                    job: JobView::of(c.clone(), j.clone()),
                    misses_per_s: r.map(|r| r[0]),
                    evictions_per_s: r.map(|r| r[1]),
                    writebacks_per_s: r.map(|r| r[2]),
                }
            })
            .collect();
        let mut vnodes: BTreeMap<&str, VnodeUse> = BTreeMap::new();
        let names = raw
            .vnodes
            .iter()
            .map(|v| v.name.as_str())
            .chain(raw.mapped.keys().map(String::as_str))
            .chain(jobs.iter().map(|j| j.job.vnode.as_str()));
        for name in names.filter(|n| p.may_see_vnode(n)) {
            vnodes.entry(name).or_insert_with(|| VnodeUse {
                name: name.to_string(),
                memory_bytes: raw.vnodes.iter().find(|v| v.name == name).and_then(|v| v.memory),
                mapped_bytes: raw.mapped.get(name).copied().unwrap_or(0),
                jobs: 0,
                misses: 0,
                evictions: 0,
                writebacks: 0,
                misses_per_s: self.last.as_ref().map(|_| 0.0),
            });
        }
        for j in &jobs {
            let v = vnodes
                .get_mut(j.job.vnode.as_str())
                .expect("every job's vNode is listed");
            v.jobs += 1;
            v.misses += j.job.misses;
            v.evictions += j.job.evictions;
            v.writebacks += j.job.writebacks;
            v.misses_per_s = v.misses_per_s.map(|s| s + j.misses_per_s.unwrap_or(0.0));
        }
        let admin = matches!(p, Principal::Admin { .. });
        let whoami = match p {
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
        };
        Snapshot {
            time_unix_ms: raw.time_unix_ms,
            period_ms: PERIOD.as_millis() as u64,
            whoami,
            components: admin.then(|| raw.comps.iter().cloned().map(ComponentView::from).collect()),
            vnodes: vnodes.into_values().collect(),
            jobs,
            unanswered: if admin {
                raw.jobs
                    .unanswered
                    .iter()
                    .map(|(c, error)| Unanswered {
                        pcomponent: c.id,
                        error: error.clone(),
                    })
                    .collect()
            } else {
                Vec::new()
            },
            topology: admin.then(|| raw.topology.clone()),
            apis: raw.apis.clone(),
        }
    }
}

/// An `error` event: `{"status", "error"}`; the page signs out on 401.
fn error_event(status: StatusCode, why: &str) -> Event {
    Event::default()
        .event("error")
        .data(serde_json::json!({"status": status.as_u16(), "error": why}).to_string())
}

/// The cluster live, as the token may see it: every second an `event: snapshot` whose data
/// is a Snapshot, as long as the client reads. A token revoked meanwhile ends the
/// stream with an `event: error` whose data is `{"status": 401, "error": "..."}`.
#[utoipa::path(get, path = "/api/v1/events", security(("bearer" = [])),
    responses((status = 200, description = "Server-sent events: `event: snapshot` with a Snapshot as data, every second", body = Snapshot, content_type = "text/event-stream"),
              (status = 401, description = "No valid token", body = super::ErrorBody),
              (status = 429, description = "The token holds as many event streams open as one token may", body = super::ErrorBody),
              (status = 503, description = "As many event streams as the API serves at once are open", body = super::ErrorBody)))]
pub(super) async fn events(
    State(api): State<Arc<Api>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Extension(shared): Extension<Arc<Shared>>,
    Extension(p): Extension<Principal>,
    headers: HeaderMap,
) -> Result<impl IntoResponse, ApiError> {
    let Ok(permit) = shared.slots.clone().try_acquire_owned() else {
        return Err(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            peer,
            "GET",
            "/api/v1/events",
            Some(p.name()),
            format!("{MAX_STREAMS} event streams are open already: close a dashboard or try again later"),
        ));
    };
    let Some(slot) = Slot::new(permit, &shared, p.name()) else {
        return Err(refuse(
            StatusCode::TOO_MANY_REQUESTS,
            peer,
            "GET",
            "/api/v1/events",
            Some(p.name()),
            format!("this token holds {MAX_STREAMS_PER_TOKEN} event streams open already: close a dashboard"),
        ));
    };
    // The authentication in front of this handler read the same header.
    let token = splitos_core::telemetry::bearer(&headers)
        .flatten()
        .unwrap_or_default()
        .to_string();
    let mut ticks = tokio::time::interval(PERIOD);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stream = Stream {
        api,
        shared,
        token,
        ticks,
        last: None,
        ended: false,
        _slot: slot,
    };
    let events = futures_util::stream::unfold(stream, |mut s| async move {
        if s.ended {
            return None;
        }
        let event = s.next().await;
        Some((Ok::<_, Infallible>(event), s))
    });
    Ok(Sse::new(events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_memory_is_summed_per_vnode_over_the_mcomponents() {
        let text = "# TYPE splitos_mcomp_vnode_memory_bytes gauge\n\
            splitos_mcomp_vnode_memory_bytes{component=\"127.0.0.1:1\",role=\"mcomponent\",vnode=\"lab\"} 4096\n\
            splitos_mcomp_vnode_memory_bytes{component=\"127.0.0.1:2\",role=\"mcomponent\",vnode=\"lab\"} 8192\n\
            splitos_mcomp_vnode_memory_bytes{component=\"a\\\"b\",role=\"mcomponent\",vnode=\"default\"} 1e3\n\
            splitos_mcomp_vnode_memory_quota_bytes{component=\"127.0.0.1:1\",role=\"mcomponent\",vnode=\"lab\"} 65536\n";
        assert_eq!(
            mapped_by_vnode(text),
            BTreeMap::from([("default".to_string(), 1000), ("lab".to_string(), 12288)])
        );
    }

    #[test]
    fn the_policy_names_the_pages_own_script_and_style() {
        assert!(PAGE.contains("<script>") && PAGE.contains("<style>"));
        let policy = policy(&["http://127.0.0.1:2".into()]);
        assert!(
            policy.contains("script-src 'sha256-")
                && policy.contains("style-src 'sha256-")
                && policy.contains("connect-src 'self' http://127.0.0.1:2;")
                && !policy.contains("unsafe"),
            "{policy}"
        );
    }
}
