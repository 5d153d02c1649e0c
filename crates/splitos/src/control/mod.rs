//! The control plane's command-line side: running programs and managing a cluster.
mod api;
mod as_user;
pub mod chaos;
pub mod cluster;
pub mod job;
pub mod launcher;
pub mod memory;
pub mod procs;
pub mod run;
pub mod top;

use comfy_table::Table;
use splitos_rpc::{
    unseal_page, Role, Who, C2G_TOKEN_CREATE, C2G_TOKEN_LIST, C2G_TOKEN_REVOKE, C2M_DEBUG_FLIP, C2X_METRICS,
    G2C_STATUS, P2M_FETCH, PAGE_SIZE,
};

pub(crate) use api::{api_access, api_get, api_post, api_put};
pub use api::{cordon, drain, join_token, ps, topology, ApiArgs};

use crate::config::ClusterConfig;
use cluster::{Cluster, ClusterState};

/// The leading global manager of the cluster named by `--gm`, `$SPLITOS_GM` or the state of
/// `cluster up` (each a list of managers, `ADDR[,ADDR...]`).
fn gm_addr(gm: Option<String>) -> anyhow::Result<String> {
    let gm = managers_named(gm).ok_or_else(|| {
        anyhow::anyhow!("no cluster is running (start one with `splitos cluster up`, or pass --gm ADDR)")
    })?;
    cluster::leader(&gm)
}

/// The managers named by `--gm`, `$SPLITOS_GM` or the state of `cluster up`.
fn managers_named(gm: Option<String>) -> Option<String> {
    gm.or_else(|| std::env::var("SPLITOS_GM").ok())
        .or_else(|| cluster::read_state().map(|s| s.gm))
}

/// Holds an exclusive lock next to the state directory `dir` until dropped: two `cluster up`
/// at once would both start components in it and race on its files.
fn lock_state_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "splitos".into());
    let path = dir.with_file_name(format!("{name}.lock"));
    crate::trusted::make_parents(dir)?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("cannot open the lock file {}: {e}", path.display()))?;
    // Beside a state directory in a shared directory, another user could have made the lock
    // first and hold it for ever.
    let owner = std::os::unix::fs::MetadataExt::uid(&f.metadata()?);
    // SAFETY: geteuid has no preconditions.
    if owner != unsafe { libc::geteuid() } {
        anyhow::bail!("the lock file {} belongs to uid {owner}, not to this user: remove it, or keep the state directory where only its user makes names", path.display());
    }
    // SAFETY: flock takes the descriptor of `f`, open for the call.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        crate::errln!(
            "splitos: another `splitos cluster up` is starting a cluster in {}; waiting for it",
            dir.display()
        );
        // SAFETY: as above.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            anyhow::bail!("cannot lock {}: {}", path.display(), std::io::Error::last_os_error());
        }
    }
    Ok(f)
}

pub fn up(config: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let _only_one = lock_state_dir(&cluster::state_dir())?;
    if let Some(s) = cluster::read_state() {
        if cluster::status(&s.gm).is_ok() {
            anyhow::bail!(
                "a cluster is already running (global managers at {}); `splitos cluster down` first",
                s.gm
            );
        }
    }
    let mut cfg = match &config {
        Some(p) => ClusterConfig::load(p).map_err(|e| anyhow::anyhow!(e))?,
        None => ClusterConfig::embedded(),
    };
    // SAFETY: geteuid takes nothing and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let dir = cluster::state_dir();
    if uid != 0 {
        // Made either way: the user's own, and where a later `cluster up` of theirs keeps its state.
        cluster::private_dir(&dir)?;
        as_user::fit(&mut cfg, uid).map_err(|e| anyhow::anyhow!("not starting a cluster for uid {uid}: {e}"))?;
    }
    let c = Cluster::start(&cfg, &dir, true)?;
    let mut state: ClusterState = c.detach();
    // Written once before the API is known: the admin's RPC client takes the cluster's
    // transport from it.
    splitos_rpc::auth::write_private(&cluster::state_file(), serde_json::to_string_pretty(&state)?.as_bytes())?;
    // Every manager started here lists where it serves the API a moment after it is ready.
    let here = cfg.managers().len() - state.elsewhere.iter().filter(|e| e.starts_with("gm")).count();
    let t0 = std::time::Instant::now();
    let mut managers = cluster::gm_status(&state.gm)?;
    while managers.api.is_some() && managers.apis.len() < here && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        managers = cluster::gm_status(&state.gm)?;
    }
    (state.api, state.apis) = (managers.api, managers.apis);
    if state.api.is_some() {
        // Root's own tools reach the API with a token of their own, made anew each time so
        // that one left by an earlier cluster in this directory is not kept alive.
        let leader = cluster::leader(&state.gm)?;
        let _ = cluster::ask(
            &leader,
            C2G_TOKEN_REVOKE {
                name: cluster::ADMIN_TOKEN_NAME.into(),
            },
        );
        let t = cluster::ask(
            &leader,
            C2G_TOKEN_CREATE {
                name: cluster::ADMIN_TOKEN_NAME.into(),
                admin: true,
                vnodes: Vec::new(),
            },
        )?;
        splitos_rpc::auth::write_private(&dir.join(cluster::ADMIN_TOKEN), t.token.as_bytes())?;
    }
    splitos_rpc::auth::write_private(&cluster::state_file(), serde_json::to_string_pretty(&state)?.as_bytes())?;
    let here = |prefix: &str, of: usize| {
        of - state
            .elsewhere
            .iter()
            .filter(|e| {
                e.strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
            })
            .count()
    };
    crate::outln!(
        "cluster up: global managers at {}, {} pComponent(s), {} mComponent(s), {} sComponent(s) started here; logs in {}",
        state.gm,
        here("proc", cfg.pcomponent.len()),
        here("mem", cfg.mcomponent.len()),
        here("storage", cfg.scomponent.len()),
        dir.display()
    );
    if !state.elsewhere.is_empty() {
        crate::outln!(
            "cluster up: not started here, their addresses being another machine's: {}; start each on its machine, which gets its credentials with `splitos join` (a token from `splitos cluster join-token`; docs/deployment.md)",
            state.elsewhere.join(", ")
        );
    }
    Ok(())
}

/// Issues credentials of `role` from the authority of the cluster in the state directory.
pub fn credentials(role: &str, out: &std::path::Path) -> anyhow::Result<()> {
    let role = crate::config::role_named(role)?;
    let dir = cluster::state_dir();
    if !dir.join(cluster::AUTHORITY).exists() {
        anyhow::bail!(
            "no cluster authority in {} (`splitos cluster up` makes one)",
            dir.display()
        );
    }
    cluster::authority(&dir)?.issue(role)?.save(out)?;
    crate::outln!("credentials of a {} in {}", role.name(), out.display());
    Ok(())
}

pub fn etcd_cert(ips: &[std::net::IpAddr], out: &std::path::Path) -> anyhow::Result<()> {
    let dir = cluster::state_dir();
    cluster::private_dir(&dir)?;
    let issued = splitos_gm::api::tls::issue_etcd_member(
        &splitos_gm::api::tls::authority_key(&dir.join(cluster::X509_AUTHORITY))?,
        ips,
    )?;
    std::fs::create_dir_all(out).map_err(|e| anyhow::anyhow!("cannot make {}: {e}", out.display()))?;
    splitos_gm::api::tls::write_issued(
        &issued,
        &out.join("ca.pem"),
        &out.join("etcd.pem"),
        &out.join("etcd.key"),
    )?;
    crate::outln!(
        "an etcd member's certificate for {} in {} (etcd.pem, etcd.key, ca.pem)",
        ips.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", "),
        out.display()
    );
    Ok(())
}

pub fn down(force: bool) -> anyhow::Result<()> {
    let Some(s) = cluster::read_state() else {
        crate::outln!("no cluster is running");
        return Ok(());
    };
    // Programs on it would be stopped mid-way: only when asked to.
    // Each pComponent's count of runs is exact; its heartbeat's count of processes may lag.
    let runs = |c: &splitos_rpc::ComponentInfo| {
        cluster::component_stats(&c.addr)
            .ok()
            .and_then(|s| s["runs"].as_u64())
            .unwrap_or(c.load.processes.into())
    };
    let comps = cluster::status(&s.gm).unwrap_or_default();
    let running: u64 = comps.iter().filter(|c| c.alive && c.role == Role::Proc).map(runs).sum();
    let addrs: Vec<String> = comps
        .iter()
        .map(|c| c.addr.clone())
        .chain(s.gm.split(',').map(String::from))
        .collect();
    if running > 0 {
        if !force {
            anyhow::bail!("{running} program(s) run on the cluster and would be stopped with it; `splitos cluster down --force` stops them too");
        }
        crate::errln!("splitos: warning: stopping {running} program(s) that run on the cluster");
    }
    let (stop, gone) = procs::to_stop(&s);
    cluster::stop_pids(&stop);
    cluster::unmount_vnodes(&s.dir);
    // The stopped components' rendezvous sockets would stay until the next cluster starts.
    if s.transport.kind == "shm" {
        if let Ok(t) = splitos_rpc::transport::ShmTransport::new(
            &s.transport.shm,
            s.transport.tcp.clone(),
            s.transport.polling,
            None,
        ) {
            // A component whose main thread has exited can hold its sockets until its last
            // thread is gone: give the stopped ones a moment to let go of theirs.
            let t0 = std::time::Instant::now();
            while addrs
                .iter()
                .any(|a| std::os::unix::net::UnixStream::connect(t.socket_path(a)).is_ok())
                && t0.elapsed() < std::time::Duration::from_secs(3)
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            t.sweep();
        }
    }
    let _ = std::fs::remove_file(cluster::state_file());
    match gone {
        0 => crate::outln!("cluster down: stopped {} component process(es)", stop.len()),
        _ => crate::outln!(
            "cluster down: stopped {} component process(es); {gone} had exited before",
            stop.len()
        ),
    }
    Ok(())
}

pub(crate) fn human(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.1}G", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1}M", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1}K", b as f64 / 1024.0),
        b => format!("{b}"),
    }
}

/// What `cluster status` shows: the managers' address, the API's and their metrics', and each
/// component with its own statistics.
struct Status {
    gm: String,
    /// The leading manager, and every manager alive (one alone: itself).
    leader: Option<String>,
    managers: Vec<String>,
    api: Option<String>,
    apis: Vec<String>,
    metrics: Option<String>,
    comps: Vec<(splitos_rpc::ComponentInfo, Option<serde_json::Value>)>,
}

/// The cluster's status through its REST API (`GET /api/v1/status`), when one is known and
/// the managers were not named by address.
fn status_by_api(gm: &Option<String>) -> Option<Status> {
    if gm.is_some() {
        return None;
    }
    let (api, token) = api_access(ApiArgs { api: None, token: None }).ok()?;
    let v = match api_get(&api, &token, "/api/v1/status") {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!(error = %e, "the REST API does not answer: asking the global managers directly");
            return None;
        }
    };
    let comps = v["components"]
        .as_array()?
        .iter()
        .filter_map(|c| {
            Some((
                serde_json::from_value(c.clone()).ok()?,
                Some(c["stats"].clone()).filter(|s| !s.is_null()),
            ))
        })
        .collect();
    let strings = |v: &serde_json::Value| {
        v.as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
            .unwrap_or_default()
    };
    Some(Status {
        gm: v["gm"].as_str()?.to_string(),
        leader: v["leader"].as_str().map(String::from),
        managers: strings(&v["managers"]),
        api: v["api"].as_str().map(String::from),
        apis: strings(&v["apis"]),
        metrics: v["gm_metrics"].as_str().map(String::from),
        comps,
    })
}

/// The same from the managers and each component directly (a cluster without a REST API).
fn status_by_rpc(gm: Option<String>) -> anyhow::Result<Status> {
    let gm = gm_addr(gm)?;
    let G2C_STATUS {
        components,
        api,
        metrics,
        leader,
        managers,
        apis,
        ..
    } = cluster::gm_status(&gm)?;
    let comps = components
        .into_iter()
        .map(|c| (c.alive.then(|| cluster::component_stats(&c.addr).ok()).flatten(), c))
        .map(|(s, c)| (c, s))
        .collect();
    Ok(Status {
        gm,
        leader,
        managers,
        api,
        apis,
        metrics,
        comps,
    })
}

pub fn status(gm: Option<String>, json: bool) -> anyhow::Result<()> {
    // Managers that elect a leader: the one left of several still leads.
    let elected = managers_named(gm.clone()).is_some_and(|g| g.contains(','));
    let found = match status_by_api(&gm) {
        Some(s) => Ok(s),
        None => status_by_rpc(gm),
    };
    let Status {
        gm,
        leader,
        managers,
        api,
        apis,
        metrics,
        comps,
    } = match found {
        Ok(f) => f,
        // A script reading --json gets JSON it can test, and the exit status says it too.
        Err(e) if json => {
            crate::outln!(
                "{}",
                serde_json::json!({"gm": null, "components": [], "error": format!("{e:#}")})
            );
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let mut rows = Vec::new();
    for (c, stats) in &comps {
        rows.push(serde_json::json!({
            "id": c.id, "role": c.role.name(), "addr": c.addr, "alive": c.alive, "lost": c.lost,
            "since_heartbeat_ms": c.since_heartbeat_ms, "load": c.load, "shim_sock": c.shim_sock, "nics": c.nics, "metrics": c.metrics, "cordoned": c.cordoned, "leaving": c.leaving, "stats": stats,
        }));
    }
    if json {
        crate::outln!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"gm": gm, "leader": leader, "managers": managers, "api": api, "apis": apis, "gm_metrics": metrics, "components": rows})
            )?
        );
        return Ok(());
    }
    let mut t = Table::new();
    t.set_header([
        "id",
        "role",
        "address",
        "alive",
        "processes",
        "threads",
        "memory used",
        "committed",
        "capacity",
    ]);
    for ((c, _), r) in comps.iter().zip(&rows) {
        let s = &r["stats"];
        let (used, committed) = match c.role {
            Role::Mem | Role::Storage => (
                human(s["used"].as_u64().unwrap_or(c.load.used)),
                human(s["committed"].as_u64().unwrap_or(c.load.committed)),
            ),
            _ => ("-".into(), "-".into()),
        };
        t.add_row([
            c.id.to_string(),
            c.role.name().to_string(),
            c.addr.clone(),
            match (c.alive, c.lost) {
                (true, _) if c.leaving.is_some() => {
                    let l = c.leaving.as_ref().expect("matched");
                    format!(
                        "yes, {}: {} moved, {} left",
                        if l.exit { "detaching" } else { "draining" },
                        human(l.bytes_at_start.saturating_sub(l.bytes_left)),
                        human(l.bytes_left)
                    )
                }
                (true, _) if c.cordoned => "yes, cordoned".into(),
                (true, _) => "yes".into(),
                // Late on heartbeats: paused or overloaded, waited for until declared lost.
                (false, false) => format!("unresponsive ({} ms)", c.since_heartbeat_ms),
                (false, true) => format!("LOST ({} ms)", c.since_heartbeat_ms),
            },
            c.load.processes.to_string(),
            c.load.threads.to_string(),
            used,
            committed,
            // An nComponent's capacity is its interfaces.
            if c.role == Role::Net {
                c.nics.iter().map(|ip| ip.to_string()).collect::<Vec<_>>().join(" ")
            } else {
                human(c.load.capacity)
            },
        ]);
    }
    let others: Vec<&String> = managers.iter().filter(|m| Some(*m) != leader.as_ref()).collect();
    let following = if others.is_empty() {
        match elected || managers.len() > 1 {
            true if leader.is_some() => " (leader)".to_string(),
            _ => String::new(),
        }
    } else {
        format!(
            " (leader; following: {})",
            others.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ")
        )
    };
    crate::outln!(
        "global managers at {gm}{following}{}\n{t}",
        api.map(|a| format!(", REST API at {}", api::api_url(&a)))
            .unwrap_or_default()
    );
    let mstats: Vec<&serde_json::Value> = rows
        .iter()
        .filter(|r| r["role"] == "mcomponent")
        .map(|r| &r["stats"])
        .filter(|s| !s.is_null())
        .collect();
    if let Some(scheme) = mstats.first().and_then(|s| s["replication"].as_str()) {
        let short: u64 = mstats
            .iter()
            .filter_map(|s| s["rebuild"]["short_vregions"].as_u64())
            .sum();
        let copied: u64 = mstats
            .iter()
            .filter_map(|s| s["rebuild"]["copied_pages"].as_u64())
            .sum();
        crate::outln!("replication: {scheme}");
        if short > 0 {
            crate::outln!(
                "rebuilding: {short} vRegion(s) short of copies; {copied} pages copied to new replicas so far"
            );
        }
        if scheme == "log" {
            let sum = |k: &str| mstats.iter().filter_map(|s| s["backup_log"][k].as_u64()).sum::<u64>();
            let unprotected: usize = mstats
                .iter()
                .filter_map(|s| s["owned_processes"].as_array())
                .flatten()
                .filter_map(|p| p["unprotected_vregions"].as_array())
                .map(|v| v.len())
                .sum();
            crate::outln!(
                "backup logs: {} queued, {} stored on sComponents, {} refused by them, {} write-backs and frees skipped",
                human(sum("queued_bytes")),
                human(sum("streamed_bytes")),
                human(sum("refused_bytes")),
                sum("skipped_records")
            );
            if unprotected > 0 {
                // The causes seen: a log that skipped records, a sComponent that refused them.
                let mut why: Vec<String> = mstats
                    .iter()
                    .filter_map(|s| s["backup_log"]["refusal"].as_str())
                    .map(|r| format!("the sComponent refused their backup records: {r}"))
                    .collect();
                why.sort();
                why.dedup();
                if sum("skipped_records") > 0 {
                    why.insert(0, "their backup log was full (the sComponent was too slow)".into());
                }
                if why.is_empty() {
                    why.push("their backup is being copied to their logger".into());
                }
                crate::outln!(
                    "unprotected: {unprotected} vRegion(s): {}; protected again once copied to their logger",
                    why.join("; ")
                );
            }
        }
    }
    Ok(())
}

/// `cluster ebbs`: the global id map, as the global managers keep it.
pub fn ebbs(gm: Option<String>, json: bool) -> anyhow::Result<()> {
    let gm = gm_addr(gm)?;
    let map = splitos_rpc::messenger::find(cluster::rpc()?, &gm, None)
        .map_err(|e| anyhow::anyhow!("global managers at {gm}: {e}"))?;
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(&map)?);
        return Ok(());
    }
    let mut t = Table::new();
    t.set_header(["ebb", "name", "served by"]);
    for e in &map {
        let homes: Vec<String> = e
            .homes
            .iter()
            .map(|h| format!("{} {} ({})", h.role.name(), h.id, h.addr))
            .collect();
        t.add_row([e.id.to_string(), e.name.clone(), homes.join("\n")]);
    }
    crate::outln!("{t}");
    Ok(())
}

/// `cluster set-placement`: a hosted call of the global managers' `placement` Ebb, at the
/// managers' address (no map needed).
pub fn set_placement(gm: Option<String>, placement: Option<String>) -> anyhow::Result<()> {
    let gm = gm_addr(gm)?;
    let rpc = cluster::rpc()?;
    let change = splitos_rpc::SetPlacement { placement };
    let send = |body| splitos_rpc::messenger::send(rpc, &gm, splitos_ebb::EbbId(splitos_rpc::EBB_PLACEMENT), body);
    let now = change
        .ask(send)
        .map_err(|e| anyhow::anyhow!("global managers at {gm}: {e}"))?;
    crate::outln!("placement {} (replaced {} times)", now.placement, now.swaps);
    Ok(())
}

/// `cluster token create`: prints what the token may do, then the token itself as the last
/// line (for scripts: `| tail -1`).
pub fn token_create(gm: Option<String>, name: String, admin: bool, vnodes: Vec<String>) -> anyhow::Result<()> {
    let gm = gm_addr(gm)?;
    let t = cluster::ask(
        &gm,
        C2G_TOKEN_CREATE {
            name: name.clone(),
            admin,
            vnodes: vnodes.clone(),
        },
    )?;
    let what = if admin {
        "admin: every vNode, job and component".to_string()
    } else {
        format!("tenant of vNode(s) {}", vnodes.join(", "))
    };
    crate::outln!("API token {name:?} ({what}); it is shown only now:\n{}", t.token);
    Ok(())
}

pub fn token_list(gm: Option<String>, json: bool) -> anyhow::Result<()> {
    let gm = gm_addr(gm)?;
    let tokens = cluster::ask(&gm, C2G_TOKEN_LIST)?.tokens;
    if json {
        let rows: Vec<_> = tokens.iter().map(|t| serde_json::json!({"name": t.name, "role": if t.admin { "admin" } else { "tenant" }, "vnodes": t.vnodes, "created_unix_s": t.created_unix_s})).collect();
        crate::outln!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let mut t = Table::new();
    t.set_header(["name", "role", "vNodes", "created (Unix time)"]);
    for k in tokens {
        t.add_row([
            k.name,
            if k.admin { "admin".into() } else { "tenant".into() },
            if k.admin { "all".into() } else { k.vnodes.join(", ") },
            k.created_unix_s.to_string(),
        ]);
    }
    crate::outln!("{t}");
    Ok(())
}

pub fn token_revoke(gm: Option<String>, name: String) -> anyhow::Result<()> {
    let gm = gm_addr(gm)?;
    cluster::ask(&gm, C2G_TOKEN_REVOKE { name: name.clone() })?;
    crate::outln!("API token {name:?} revoked");
    Ok(())
}

/// Every alive component's metrics, merged as the REST API's `/metrics` serves them.
pub fn metrics(gm: Option<String>) -> anyhow::Result<()> {
    let gm = gm_addr(gm)?;
    let status = cluster::gm_status(&gm)?;
    // Every manager alive (followers too), then every component alive.
    let mut addrs = if status.managers.is_empty() {
        vec![gm.clone()]
    } else {
        status.managers
    };
    addrs.extend(status.components.into_iter().filter(|c| c.alive).map(|c| c.addr));
    // A silent component's series are missing, as from a scrape.
    let texts: Vec<String> = addrs
        .iter()
        .filter_map(|a| cluster::ask(a, C2X_METRICS).ok().map(|m| m.text))
        .collect();
    crate::out!("{}", crate::telemetry::merge(texts));
    Ok(())
}

/// `splitos debug fetch`: one P2M_FETCH as a pComponent would send it.
pub fn debug_fetch(mcomp: &str, vnode: String, pid: u64, vaddr: u64) -> anyhow::Result<()> {
    let page = cluster::rpc()?
        .call(
            mcomp,
            P2M_FETCH {
                who: Who::new(vnode, pid),
                vpn: vaddr / PAGE_SIZE as u64,
            },
        )
        .map_err(|e| anyhow::anyhow!("refused: {e}"))?;
    let at = vaddr & !(PAGE_SIZE as u64 - 1);
    match unseal_page(page.data) {
        Ok(data) => crate::outln!(
            "page {at:#x}: {} bytes, checksum good, first bytes {:02x?}",
            data.len(),
            &data[..16]
        ),
        Err(e) => crate::outln!("page {at:#x}: not what was written back ({e:?})"),
    }
    Ok(())
}

/// `splitos debug flip`: flips a bit of a page an mComponent stores, as a memory error would.
pub fn debug_flip(mcomp: &str, vnode: String, pid: u64, vaddr: u64, bit: u32) -> anyhow::Result<()> {
    let r = cluster::rpc()?
        .call(
            mcomp,
            C2M_DEBUG_FLIP {
                who: Who::new(vnode, pid),
                from_vpn: vaddr / PAGE_SIZE as u64,
                bit,
            },
        )
        .map_err(|e| anyhow::anyhow!("refused: {e}"))?;
    crate::outln!("flipped bit {bit} of page {:#x}", r.vpn * PAGE_SIZE as u64);
    Ok(())
}
