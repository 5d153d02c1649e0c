//! The admin's commands that go through the REST API (`--api`, `--token`), and the API's
//! client they share with `cluster memory` and `cluster excache`.
use comfy_table::Table;

use super::cluster;

/// How a command reaches the REST API.
#[derive(clap::Args, Clone)]
pub struct ApiArgs {
    /// The REST API's address ($SPLITOS_API); default: that of the cluster `cluster up` started.
    #[arg(long)]
    pub api: Option<String>,
    /// An API token ($SPLITOS_TOKEN; a tenant's sees only its vNodes); default: root's own
    /// token of the cluster `cluster up` started.
    #[arg(long)]
    pub token: Option<String>,
}

/// Where the REST API is and the token to use: the ones given (or $SPLITOS_API and
/// $SPLITOS_TOKEN), else those of the cluster `cluster up` started (its state directory is
/// root's, and so is its token). The API is every manager's address, `ADDR[,ADDR...]`: each
/// request goes to the one that leads ([`send`]).
pub(crate) fn api_access(a: ApiArgs) -> anyhow::Result<(String, String)> {
    let ApiArgs { api, token } = a;
    let state = cluster::read_state();
    let api = match api.or_else(|| std::env::var("SPLITOS_API").ok()) {
        Some(a) => a,
        None => {
            let s = state
                .as_ref()
                .filter(|s| s.api.is_some() || !s.apis.is_empty())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                    "no REST API known: give --api ADDR (or $SPLITOS_API), or start a cluster with `splitos cluster up`"
                )
                })?;
            // The leader when the cluster started first, then every manager.
            let mut all: Vec<String> = s.api.iter().chain(&s.apis).cloned().collect();
            all.dedup();
            let mut seen = std::collections::HashSet::new();
            all.retain(|a| seen.insert(a.clone()));
            all.join(",")
        }
    };
    let token = match token.or_else(|| std::env::var("SPLITOS_TOKEN").ok()) {
        Some(t) => t,
        None => {
            let f = cluster::state_dir().join(cluster::ADMIN_TOKEN);
            std::fs::read_to_string(&f)
                .map_err(|e| {
                    anyhow::anyhow!(
                        "no API token: give --token (or $SPLITOS_TOKEN); {} cannot be read: {e}",
                        f.display()
                    )
                })?
                .trim()
                .to_string()
        }
    };
    Ok((api, token))
}

/// The REST API's URL: HTTP on loopback, HTTPS beyond it (as the managers serve it).
pub(crate) fn api_url(api: &str) -> String {
    match api.parse::<std::net::SocketAddr>().is_ok_and(|a| a.ip().is_loopback()) {
        true => format!("http://{api}"),
        false => format!("https://{api}"),
    }
}

/// The REST API's client: HTTPS, trusting only the cluster's authority (`$SPLITOS_CA`, or
/// `ca.pem` of the state directory), for an API beyond loopback; HTTP on loopback.
pub(crate) fn api_client(api: &str) -> anyhow::Result<(String, ureq::Agent)> {
    let config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        // A manager's host that is gone answers nothing: the next manager is asked soon.
        .timeout_connect(Some(CONNECT))
        .timeout_global(Some(std::time::Duration::from_secs(10)));
    let url = api_url(api);
    if url.starts_with("http://") {
        return Ok((url, config.build().new_agent()));
    }
    let ca = std::env::var_os("SPLITOS_CA")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| cluster::state_dir().join(cluster::CA_CERT));
    let pem = std::fs::read(&ca).map_err(|e| anyhow::anyhow!("the REST API at {api} is beyond loopback and served with TLS: its authority's certificate {} cannot be read ($SPLITOS_CA): {e}", ca.display()))?;
    let cert = ureq::tls::Certificate::from_pem(&pem).map_err(|e| anyhow::anyhow!("{}: {e}", ca.display()))?;
    let tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::new_with_certs(&[cert]))
        .build();
    Ok((url, config.tls_config(tls).build().new_agent()))
}

/// How long a manager's API may take to accept a connection.
const CONNECT: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a request looks for a leader: a handover (the lease, 5 s by default) and some.
const FIND_LEADER: std::time::Duration = std::time::Duration::from_secs(20);

/// Why a request reached no leader.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    #[error("the REST API at {api}: {error}")]
    Client { api: String, error: String },
    #[error("the REST API at {api}: {error}")]
    Failed { api: String, error: ureq::Error },
    #[error("no global manager's REST API answered as the leader within {}s (at {apis}): {last}", FIND_LEADER.as_secs())]
    NoLeader { apis: String, last: String },
}

/// The manager that answered last as the leader: asked first by the next request.
static LEADER: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Whether `e` says the request never reached the server, so that sending it to another is
/// safe whatever it does.
fn unreached(e: &ureq::Error) -> bool {
    use std::io::ErrorKind::*;
    match e {
        ureq::Error::Io(e) => matches!(
            e.kind(),
            ConnectionRefused | HostUnreachable | NetworkUnreachable | AddrNotAvailable
        ),
        ureq::Error::ConnectionFailed | ureq::Error::Timeout(ureq::Timeout::Connect) => true,
        _ => false,
    }
}

/// Whether `e` says the manager took the request and closed the connection before answering:
/// one that died or lost its lease meanwhile. A request that reads only may be sent to the
/// next leader; one that changes something may have been carried out, and is not.
fn cut_short(e: &ureq::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e, ureq::Error::Io(e) if matches!(e.kind(), UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe))
}

/// Why the API address `api` on loopback must not be sent a token: its listener belongs to a
/// user that is neither root (the managers' user) nor this tool's, who may have bound the port
/// a dead manager left. Beyond loopback TLS proves the server instead; None when nothing
/// listens (the request is then refused, as for any manager that is down).
fn impostor(api: &str) -> Option<String> {
    let addr: std::net::SocketAddr = api
        .parse()
        .ok()
        .filter(|a: &std::net::SocketAddr| a.ip().is_loopback())?;
    let uid = splitos_core::sys::tcp_listener_uid(addr)?;
    let me = nix::unistd::geteuid().as_raw();
    (uid != 0 && uid != me).then(|| {
        format!("listened on by uid {uid}, which runs no global manager: it is not sent the request or its token")
    })
}

/// Whether `r` is a follower's refusal (api/follow.rs in the managers): `421` naming the
/// leader, or `503` with `Retry-After` while none is elected.
fn from_follower(r: &ureq::http::Response<ureq::Body>) -> bool {
    r.status() == 421 || r.status() == 503 && r.headers().contains_key("retry-after")
}

/// Sends one request (`make` of a base URL and its client) to the API at `apis`
/// (`ADDR[,ADDR...]`, every manager's): to the last leader first, then each in turn, until the
/// leader answers. A follower names the leader (`421`), which is asked next; while none is
/// elected (`503`) the managers are asked again, for up to [`FIND_LEADER`]; when no manager
/// answers at all it is an error at once. Only a request that surely was not carried out is sent again: one refused
/// by a follower, or that reached no server; and one that only reads (`reads_only`) also when
/// the manager it reached closed the connection before answering. Returns the address that
/// answered, and its answer.
pub(crate) fn send(
    apis: &str,
    reads_only: bool,
    make: impl Fn(&str, &ureq::Agent) -> Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> Result<(String, ureq::http::Response<ureq::Body>), SendError> {
    let all: Vec<String> = apis
        .split(',')
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect();
    let t0 = std::time::Instant::now();
    let mut last = String::from("no address");
    // Managers that closed a connection without answering: one that does so again, with no
    // other answering, is no manager stepping down but a server that always does.
    let mut cut = std::collections::HashSet::new();
    loop {
        let mut queue: std::collections::VecDeque<String> = all.iter().cloned().collect();
        if let Some(l) = LEADER.lock().unwrap().clone().filter(|l| all.contains(l)) {
            queue.retain(|a| *a != l);
            queue.push_front(l);
        }
        let mut asked = std::collections::HashSet::new();
        // Whether a manager answered at all: one that is there will have a leader soon; if
        // none is reachable from here (all down, or their API on another network), waiting
        // only delays what the caller does instead.
        let mut heard = false;
        while let Some(api) = queue.pop_front() {
            if !asked.insert(api.clone()) {
                continue;
            }
            let (base, agent) = api_client(&api).map_err(|e| SendError::Client {
                api: api.clone(),
                error: format!("{e:#}"),
            })?;
            if let Some(why) = impostor(&api) {
                last = format!("{api}: {why}");
                continue;
            }
            match make(&base, &agent) {
                Err(e) if unreached(&e) => last = format!("{api}: {e}"),
                Err(e) if reads_only && cut_short(&e) => {
                    // It was there a moment ago: a leader follows soon, and the next pass
                    // asks every manager again.
                    heard |= cut.insert(api.clone());
                    last = format!("{api}: {e}");
                    LEADER.lock().unwrap().take();
                }
                Err(error) => return Err(SendError::Failed { api, error }),
                Ok(r) if !r.headers().contains_key(splitos_gm::api::MANAGER_HEADER) => {
                    last = format!(
                        "{api}: answered {} as no global manager does (another server holds the address now)",
                        r.status()
                    );
                }
                Ok(mut r) if from_follower(&r) => {
                    heard = true;
                    let body: serde_json::Value = r.body_mut().read_json().unwrap_or_default();
                    last = format!("{api}: {}", body["error"].as_str().unwrap_or("a follower"));
                    // The leader it names is asked next, even if the list does not hold it (a
                    // manager started since at another address).
                    if let Some(l) = body["leader_api"].as_str() {
                        queue.push_front(l.to_string());
                    }
                }
                Ok(r) => {
                    *LEADER.lock().unwrap() = Some(api.clone());
                    return Ok((api, r));
                }
            }
        }
        if !heard || t0.elapsed() > FIND_LEADER {
            return Err(SendError::NoLeader {
                apis: apis.to_string(),
                last,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// One GET of the REST API; an error carries the API's own message.
pub(crate) fn api_get(api: &str, token: &str, path: &str) -> anyhow::Result<serde_json::Value> {
    let (at, r) = send(api, true, |base, agent| {
        agent
            .get(format!("{base}{path}"))
            .header("Authorization", format!("Bearer {token}"))
            .call()
    })?;
    api_answer(&at, Ok(r))
}

/// One POST without a body.
pub(crate) fn api_post(api: &str, token: &str, path: &str) -> anyhow::Result<serde_json::Value> {
    let (at, r) = send(api, false, |base, agent| {
        agent
            .post(format!("{base}{path}"))
            .header("Authorization", format!("Bearer {token}"))
            .send_empty()
    })?;
    api_answer(&at, Ok(r))
}

/// One PUT of a JSON body, waiting up to `timeout` (an ExCache shrink writes back first).
pub(crate) fn api_put(
    api: &str,
    token: &str,
    path: &str,
    body: &serde_json::Value,
    timeout: std::time::Duration,
) -> anyhow::Result<serde_json::Value> {
    let (at, r) = send(api, false, |base, agent| {
        agent
            .put(format!("{base}{path}"))
            .config()
            .timeout_global(Some(timeout))
            .build()
            .header("Authorization", format!("Bearer {token}"))
            .send_json(body)
    })?;
    api_answer(&at, Ok(r))
}

pub(crate) fn api_answer(
    api: &str,
    r: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
) -> anyhow::Result<serde_json::Value> {
    let mut r = r.map_err(|e| anyhow::anyhow!("the REST API at {api}: {e}"))?;
    let status = r.status();
    let body: serde_json::Value = r
        .body_mut()
        .read_json()
        .map_err(|e| anyhow::anyhow!("the REST API at {api} answered {status} without JSON: {e}"))?;
    if !status.is_success() {
        anyhow::bail!(
            "the REST API at {api} answered {status}: {}",
            body["error"].as_str().unwrap_or("?")
        );
    }
    Ok(body)
}

/// `splitos cluster topology`: the graph the REST API serves, as text: each host with its
/// components, then the measured links.
pub fn topology(a: ApiArgs, json: bool) -> anyhow::Result<()> {
    let (api, token) = api_access(a)?;
    let g = api_get(&api, &token, "/api/v1/topology")?;
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(&g)?);
        return Ok(());
    }
    let nodes = g["nodes"].as_array().cloned().unwrap_or_default();
    let links = g["links"].as_array().cloned().unwrap_or_default();
    let label = |id: &str| {
        nodes
            .iter()
            .find(|n| n["id"] == id)
            .and_then(|n| n["label"].as_str())
            .unwrap_or(id)
            .to_string()
    };
    for host in nodes.iter().filter(|n| n["kind"] == "host") {
        crate::outln!("host {}", host["label"].as_str().unwrap_or("?"));
        for l in links
            .iter()
            .filter(|l| l["kind"] == "attached" && l["to"] == host["id"])
        {
            crate::outln!("  {}", label(l["from"].as_str().unwrap_or("?")));
        }
    }
    if let Some(sw) = nodes.iter().find(|n| n["kind"] == "switch") {
        crate::outln!(
            "the hosts reach each other through switch {}",
            sw["label"].as_str().unwrap_or("?")
        );
    }
    let mut t = Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t.set_header(["FROM", "TO", "LATENCY", "BANDWIDTH", "AGE"]);
    for l in links.iter().filter(|l| l["kind"] == "uses") {
        let latency = l["latency_us"].as_f64().map_or("-".into(), |us| format!("{us:.1} µs"));
        let bandwidth = l["bandwidth_mbps"]
            .as_f64()
            .map_or("-".into(), |m| format!("{:.2} Gbit/s", m / 1e3));
        let age = l["age_ms"]
            .as_u64()
            .map_or("-".into(), |ms| format!("{:.1} s", ms as f64 / 1e3));
        t.add_row([
            label(l["from"].as_str().unwrap_or("?")),
            label(l["to"].as_str().unwrap_or("?")),
            latency,
            bandwidth,
            age,
        ]);
    }
    match t.row_count() {
        0 => crate::outln!("no measured links (links are measured while programs use them)"),
        _ => crate::outln!("{t}"),
    }
    Ok(())
}

/// `splitos ps`: the running programs, as the REST API lists them for the token.
pub fn ps(a: ApiArgs, json: bool) -> anyhow::Result<()> {
    let (api, token) = api_access(a)?;
    let list = api_get(&api, &token, "/api/v1/jobs")?;
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut t = Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t.set_header([
        "PID",
        "USER",
        "VNODE",
        "PCOMP",
        "AGE",
        "MISSES",
        "EVICTIONS",
        "WRITEBACKS",
        "COMMAND",
    ]);
    for j in list["jobs"].as_array().into_iter().flatten() {
        let age = now.saturating_sub(j["started_unix_s"].as_u64().unwrap_or(now));
        let cmd = j["command"].as_str().unwrap_or("");
        t.add_row([
            // The process id on its pComponent's host, as ps shows it; the cluster's own id
            // (`pid`, for the API's signals) is in --json.
            j["os_pid"].to_string(),
            j["user"]
                .as_str()
                .filter(|u| !u.is_empty())
                .map(str::to_string)
                .unwrap_or_else(|| j["uid"].to_string()),
            j["vnode"].as_str().unwrap_or("").to_string(),
            j["pcomponent"].to_string(),
            span(age),
            j["misses"].to_string(),
            j["evictions"].to_string(),
            j["writebacks"].to_string(),
            if cmd.chars().count() > 60 {
                format!("{}...", cmd.chars().take(57).collect::<String>())
            } else {
                cmd.to_string()
            },
        ]);
    }
    crate::outln!("{t}");
    for u in list["unanswered"].as_array().into_iter().flatten() {
        crate::errln!(
            "splitos: pComponent {} did not answer: {}",
            u["pcomponent"],
            u["error"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

/// `splitos cluster join-token`: prints a join token for `role`, lasting `ttl_s`.
pub fn join_token(a: ApiArgs, role: &str, ttl_s: u64) -> anyhow::Result<()> {
    let (apis, token) = api_access(a)?;
    let (api, r) = send(&apis, false, |base, agent| {
        agent
            .post(format!("{base}/api/v1/join-tokens"))
            .header("Authorization", format!("Bearer {token}"))
            .send_json(serde_json::json!({ "role": role, "ttl_s": ttl_s }))
    })?;
    let t = api_answer(&api, Ok(r))?;
    crate::errln!(
        "a join token for a {} (once, until {}, in {}); on the machine to join: splitos join --token TOKEN {api}",
        t["role"].as_str().unwrap_or("?"),
        utc(t["expires_unix_s"].as_u64().unwrap_or(0)),
        span(ttl_s)
    );
    crate::outln!("{}", t["token"].as_str().unwrap_or_default());
    Ok(())
}

/// A span of seconds as `1h05m` or `4m07s`.
fn span(s: u64) -> String {
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s / 60 % 60)
    } else {
        format!("{}m{:02}s", s / 60, s % 60)
    }
}

/// A Unix time as UTC (`2026-12-02 22:05:00 UTC`), as people read a time.
fn utc(unix_s: u64) -> String {
    let (days, secs) = (unix_s / 86_400, unix_s % 86_400);
    // Howard Hinnant's civil_from_days: the proleptic Gregorian date of a day count.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// `cluster cordon` and `cluster uncordon`.
pub fn cordon(a: ApiArgs, id: u32, on: bool) -> anyhow::Result<()> {
    let (api, token) = api_access(a)?;
    let c = api_post(
        &api,
        &token,
        &format!("/api/v1/components/{id}/{}", if on { "cordon" } else { "uncordon" }),
    )?;
    let what = match c["role"].as_str() {
        Some("pcomponent") => "new programs",
        _ => "new homes and vRegions",
    };
    match on {
        true => crate::outln!(
            "{} {id} ({}) cordoned: it takes no {what}; what runs there goes on",
            c["role"].as_str().unwrap_or("?"),
            c["addr"].as_str().unwrap_or("?")
        ),
        false => crate::outln!(
            "{} {id} ({}) uncordoned: it takes {what} again",
            c["role"].as_str().unwrap_or("?"),
            c["addr"].as_str().unwrap_or("?")
        ),
    }
    Ok(())
}

/// `cluster drain`: cordons the component, then waits until nothing runs on it.
pub fn drain(a: ApiArgs, id: u32, timeout: std::time::Duration) -> anyhow::Result<()> {
    let (api, token) = api_access(a.clone())?;
    let comps = api_get(&api, &token, "/api/v1/components")?;
    if comps
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["id"] == id && c["role"] == "mcomponent")
    {
        // Its programs' memory moves to the other mComponents while they run.
        return super::memory::detach(a, id, true, true, timeout);
    }
    let c = api_post(&api, &token, &format!("/api/v1/components/{id}/cordon"))?;
    let role = c["role"].as_str().unwrap_or("?").to_string();
    crate::outln!("{role} {id} cordoned; waiting until nothing runs on it");
    let t0 = std::time::Instant::now();
    let mut last = String::new();
    loop {
        let jobs = api_get(&api, &token, "/api/v1/jobs")?;
        let n = jobs["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|j| j["pcomponent"] == id)
            .count();
        // The API lists processes: one `splitos run` may have started several.
        let left = (n > 0).then(|| format!("{n} process(es) run on it"));
        let Some(left) = left else {
            crate::outln!(
                "{role} {id} drained in {:.1} s: nothing runs on it (it stays cordoned)",
                t0.elapsed().as_secs_f64()
            );
            return Ok(());
        };
        if left != last {
            crate::outln!("  {left}");
            last = left.clone();
        }
        if t0.elapsed() >= timeout {
            anyhow::bail!(
                "{role} {id} is not drained after {} s: {left} (it stays cordoned)",
                timeout.as_secs()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unix_time_reads_as_a_utc_date() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_796_249_100), "2026-12-02 22:05:00 UTC");
    }

    #[test]
    fn the_api_beyond_loopback_is_https() {
        assert_eq!(api_url("127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(api_url("[::1]:8080"), "http://[::1]:8080");
        assert_eq!(api_url("10.0.0.1:8443"), "https://10.0.0.1:8443");
    }

    /// A manager on loopback that serves `n` requests: it reads each and then either closes
    /// the connection unanswered (one losing its lease mid-request) or answers as a leader,
    /// counting the requests it saw.
    fn manager(answers: bool) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::io::{BufRead, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                let mut c = std::io::BufReader::new(c.unwrap());
                let mut line = String::new();
                while c.read_line(&mut line).unwrap_or(0) > 2 {
                    line.clear();
                }
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if answers {
                    let body = r#"{"ok":true}"#;
                    let _ = write!(
                        c.get_mut(),
                        "HTTP/1.1 200 OK\r\n{}: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        splitos_gm::api::MANAGER_HEADER,
                        body.len()
                    );
                }
            }
        });
        (addr, seen)
    }

    #[test]
    fn a_read_cut_short_by_a_manager_stepping_down_goes_to_the_next_and_a_change_does_not() {
        let (dying, cut) = manager(false);
        let (leader, served) = manager(true);
        let both = format!("{dying},{leader}");
        LEADER.lock().unwrap().replace(dying.clone());
        let r = api_get(&both, "t", "/api/v1/processes").unwrap();
        assert_eq!(r["ok"], true);
        assert_eq!(cut.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 1);

        LEADER.lock().unwrap().replace(dying.clone());
        let e = api_post(&both, "t", "/api/v1/memory/rebalance").unwrap_err();
        assert!(format!("{e:#}").contains(&dying), "{e:#}");
        assert_eq!(cut.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(
            served.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "a change is sent once"
        );

        // A server that always closes the connection is asked once more, not for as long as
        // a leader may take to be elected.
        let (closer, seen) = manager(false);
        assert!(api_get(&closer, "t", "/api/v1/processes").is_err());
        assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
