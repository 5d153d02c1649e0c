//! What every component process shares: logging, its metrics, its RPC server, and
//! registration plus heartbeats with the global managers.
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use splitos_rpc::auth::Credentials;
use splitos_rpc::{
    Endpoint, ErrCode, Leaving, LinkSample, Load, Request, Role, Rpc, RpcError, TransportConfig, G2X_LEADER,
    X2G_API_TOKEN, X2G_HEARTBEAT, X2G_REGISTER, X2G_WHO_LEADS,
};

use crate::config::ProcessArgs;

pub const HEARTBEAT: Duration = Duration::from_millis(300);
/// How many missed heartbeats make a component dead.
pub const MISSED_BEATS: u32 = 4;
pub const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a program's call that needs the global managers (its start, a new vRegion, a
/// file's buffer cache) waits for them when none answers: a manager started again is back
/// within seconds, and the program waits on its call, as under a kernel short of memory,
/// rather than failing with nothing to say why.
pub const MANAGERS_BACK: Duration = Duration::from_secs(30);

/// `call`, asked again every 200 ms while it fails `unreachable` (the managers restarting,
/// none of them answering), for at most [`MANAGERS_BACK`]; `waited` is told of each wait.
pub fn waiting_for_managers<T, E>(
    mut call: impl FnMut() -> Result<T, E>,
    unreachable: impl Fn(&E) -> bool,
    waited: impl Fn(),
) -> Result<T, E> {
    let t0 = Instant::now();
    loop {
        match call() {
            Err(e) if unreachable(&e) && t0.elapsed() < MANAGERS_BACK => {
                waited();
                std::thread::sleep(Duration::from_millis(200));
            }
            r => return r,
        }
    }
}

pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SPLITOS_LOG").unwrap_or_else(|_| "info".into());
    // Colours only for a person at a terminal, not in log files and pipes.
    use std::io::IsTerminal;
    // A line stderr does not take is dropped: the subscriber would say so on stderr, with a
    // panic when that fails too (a reader gone, a full disk).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .try_init();
}

/// Serves the component's metrics at `process.metrics_addr` unless it is `off`; beyond
/// loopback to requests with an admin token, which `is_admin` checks. Returns the address.
pub fn serve_metrics(
    process: &ProcessArgs,
    is_admin: impl Fn(&str) -> bool + Send + Sync + 'static,
) -> anyhow::Result<Option<String>> {
    if process.metrics_addr == "off" {
        return Ok(None);
    }
    crate::telemetry::serve(&process.metrics_addr, is_admin).map(Some)
}

/// The RPC client of a process that is not a component (the admin's tools), proving `creds`.
pub fn client_rpc(transport: &TransportConfig, creds: Arc<Credentials>, timeout: Duration) -> anyhow::Result<Rpc> {
    Ok(Rpc::new(
        transport.build(Some(creds)).map_err(|e| anyhow::anyhow!(e))?,
        timeout,
    ))
}

/// Loads credentials from `path` and checks they are of `role`.
pub fn credentials(path: &std::path::Path, role: Role) -> anyhow::Result<Arc<Credentials>> {
    let c =
        Credentials::load(path).map_err(|e| anyhow::anyhow!("cannot read the credentials {}: {e}", path.display()))?;
    if c.role != role {
        anyhow::bail!(
            "the credentials {} are a {}'s, not a {}'s",
            path.display(),
            c.role.name(),
            role.name()
        );
    }
    Ok(Arc::new(c))
}

/// How long one call to one of several global managers may take: one cut off is given up
/// sooner than a component is, so that the others are asked who leads.
const GM_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a caller looks for the leader among the managers before it gives up: longer
/// than a handover (a lease, and an election) many times over, since on a loaded host a new
/// leader may lose its lease while it starts, and the lead move again. A program whose
/// placement waits this long is slow; one that fails for it is lost.
const FIND_LEADER: Duration = Duration::from_secs(60);
/// How long a manager asked who leads has to answer.
const WHO_LEADS_TIMEOUT: Duration = Duration::from_secs(1);

/// The global managers a component or tool knows (`--gm ADDR[,ADDR...]`), and which of them
/// leads as it last heard: calls go to the leader, and when it refuses (`NotLeader`) or does
/// not answer, the caller asks every manager who leads and sends again there.
pub struct Managers {
    addrs: Vec<String>,
    leader: Mutex<String>,
}

impl Managers {
    pub fn new(list: &str) -> Managers {
        let addrs: Vec<String> = list
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect();
        Managers {
            leader: Mutex::new(addrs.first().cloned().unwrap_or_default()),
            addrs,
        }
    }

    /// The leader as last heard (the first manager before any answer).
    pub fn leader(&self) -> String {
        self.leader.lock().unwrap().clone()
    }

    /// Calls the leading manager; one manager alone is called as any component is. A
    /// request refused `NotLeader`, or that reached no manager, is sent again to the leader
    /// the managers name; one that may have been carried out (its answer was lost or late) is
    /// not, and the caller gets the error, while the next call goes to the leader found.
    pub fn call<R: Request>(&self, rpc: &Rpc, req: R) -> Result<R::Reply, RpcError> {
        if self.addrs.len() < 2 {
            return rpc.call(&self.leader(), req);
        }
        let mut last = rpc.call_timeout(&self.leader(), req.clone(), GM_TIMEOUT);
        let t0 = Instant::now();
        while Managers::elsewhere(&last) && t0.elapsed() < FIND_LEADER {
            let Some(l) = self.follow_leader(rpc) else {
                std::thread::sleep(Duration::from_millis(200));
                continue;
            };
            if !Managers::undelivered(&last) {
                return last;
            }
            last = rpc.call_timeout(&l, req.clone(), GM_TIMEOUT);
            if Managers::elsewhere(&last) {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        last
    }

    /// Asks the managers who leads, and remembers it.
    fn follow_leader(&self, rpc: &Rpc) -> Option<String> {
        let l = self.find_leader(rpc)?;
        if l != self.leader() {
            tracing::info!(leader = %l, "the global managers have another leader");
            crate::series::NODE_GM_LEADER_CHANGES.increment(1);
            *self.leader.lock().unwrap() = l.clone();
        }
        Some(l)
    }

    /// Whether an answer says to look for the leader elsewhere.
    fn elsewhere<T>(r: &Result<T, RpcError>) -> bool {
        Managers::undelivered(r) || matches!(r, Err(RpcError::Closed { .. } | RpcError::Timeout { .. }))
    }

    /// Whether a request was surely not carried out, and may be sent again.
    fn undelivered<T>(r: &Result<T, RpcError>) -> bool {
        matches!(
            r,
            Err(RpcError::Unreachable { .. }
                | RpcError::Remote {
                    code: ErrCode::NotLeader,
                    ..
                })
        )
    }

    /// The leader the managers name, in the latest term any of them knows.
    pub fn find_leader(&self, rpc: &Rpc) -> Option<String> {
        self.addrs
            .iter()
            .filter_map(|a| rpc.call_timeout(a, X2G_WHO_LEADS, WHO_LEADS_TIMEOUT).ok())
            .filter_map(|G2X_LEADER { leader, term }| Some((term, leader?)))
            .max_by_key(|(term, _)| *term)
            .map(|(_, l)| l)
    }
}

/// Refuses a listening address that cannot be advertised: the address a component listens on
/// is the one it registers, and others reach it there; `0.0.0.0` (or `::`) names no host.
pub fn advertisable(role: Role, listen: &str) -> anyhow::Result<()> {
    if listen
        .parse::<std::net::SocketAddr>()
        .is_ok_and(|a| a.ip().is_unspecified())
    {
        anyhow::bail!("{} cannot listen on {listen}: that address is also the one it advertises, and it names no host; listen on one of this host's addresses others reach", role.name());
    }
    Ok(())
}

/// A component's link to the rest of the cluster.
pub struct Node {
    pub role: Role,
    pub addr: String,
    pub gm: Arc<Managers>,
    pub rpc: Rpc,
    id: AtomicU32,
    /// An nComponent's interface addresses, told to the global managers at every registration.
    pub nics: std::sync::OnceLock<Vec<std::net::IpAddr>>,
    /// Where it serves its Prometheus metrics, if it does.
    pub metrics: Option<String>,
    /// An mComponent that joins out of placement, for the admin to attach.
    pub standby: std::sync::atomic::AtomicBool,
    /// When the global managers last answered a heartbeat, and the mComponents they had
    /// declared lost then.
    heard: Mutex<Option<(Instant, Vec<u32>)>>,
    /// Whether this component was stopped for long, and the managers have not answered since.
    stop: stop::StopWatch,
    /// What it last measured of its links to the components it uses, and when: told to the
    /// global managers in every heartbeat (`crate::topology`).
    links: Mutex<Vec<(LinkSample, Instant)>>,
    /// A leaving mComponent's progress, told in every heartbeat.
    leaving: Mutex<Option<Leaving>>,
    /// The last fence the managers gave this component that it acted on (0: none), told in
    /// every heartbeat and registration: they give it again until it is.
    fenced_by: AtomicU64,
    /// Drawn when it starts: told in every registration, so that one repeated before its
    /// answer came gets the same id.
    start: u64,
    /// The heartbeat period the managers told last, in ms ([`HEARTBEAT`] until they do).
    beat_ms: AtomicU64,
}

impl Node {
    /// Claims the component's address on the configured transport and serves its metrics;
    /// the returned endpoint serves once the component is built around the node.
    pub fn bind(
        role: Role,
        gm: &str,
        listen: &str,
        process: &ProcessArgs,
    ) -> anyhow::Result<(Arc<Node>, Box<dyn Endpoint>)> {
        let t = process
            .transport
            .build(Some(credentials(process.credentials()?, role)?))
            .map_err(|e| anyhow::anyhow!(e))?;
        advertisable(role, listen)?;
        let ep = t
            .listen(listen)
            .map_err(|e| anyhow::anyhow!("{} cannot listen on {listen}: {e}", role.name()))?;
        crate::telemetry::init(role, &ep.addr());
        let rpc = Rpc::new(t, RPC_TIMEOUT);
        // The global managers keep the tokens: a scrape beyond loopback asks them.
        let managers = Arc::new(Managers::new(gm));
        let (asker, m) = (rpc.clone(), managers.clone());
        let metrics = serve_metrics(process, move |token| {
            m.call(
                &asker,
                X2G_API_TOKEN {
                    token: token.to_string(),
                },
            )
            .is_ok_and(|p| p.admin)
        })?;
        Ok((
            Arc::new(Node {
                role,
                addr: ep.addr(),
                gm: managers,
                rpc,
                id: AtomicU32::new(0),
                nics: std::sync::OnceLock::new(),
                metrics,
                standby: Default::default(),
                heard: Mutex::new(None),
                stop: stop::StopWatch::new(),
                links: Mutex::new(Vec::new()),
                leaving: Mutex::new(None),
                fenced_by: AtomicU64::new(0),
                start: splitos_rpc::auth::random_u64(),
                beat_ms: AtomicU64::new(HEARTBEAT.as_millis() as u64),
            }),
            ep,
        ))
    }

    /// Replaces what it tells the global managers of its links.
    pub fn set_links(&self, links: Vec<(LinkSample, Instant)>) {
        *self.links.lock().unwrap() = links;
    }

    /// This component acted on `fence` (a fence of the managers' answer; 0: none): it holds
    /// nothing of before it, and says so from its next heartbeat.
    pub fn acted_on_fence(&self, fence: u64) {
        if fence != 0 {
            self.fenced_by.store(fence, Ordering::Relaxed);
        }
    }

    /// Replaces what it tells the global managers of its detach.
    pub fn set_leaving(&self, leaving: Option<Leaving>) {
        *self.leaving.lock().unwrap() = leaving;
    }

    fn links(&self) -> Vec<LinkSample> {
        self.links
            .lock()
            .unwrap()
            .iter()
            .map(|(l, at)| LinkSample {
                age_ms: at.elapsed().as_millis() as u64,
                ..l.clone()
            })
            .collect()
    }

    pub fn id(&self) -> u32 {
        self.id.load(Ordering::Relaxed)
    }

    pub fn call_gm<R: Request>(&self, req: R) -> Result<R::Reply, RpcError> {
        self.gm.call(&self.rpc, req)
    }

    /// Registers with the global managers (retrying while they start) and returns what they
    /// say of the cluster (vRegion size, replication).
    pub fn register(&self, shim_sock: Option<String>, load: Load) -> Result<splitos_rpc::G2X_REGISTERED, RpcError> {
        let mut last = None;
        for _ in 0..100 {
            let msg = X2G_REGISTER {
                role: self.role,
                addr: self.addr.clone(),
                shim_sock: shim_sock.clone(),
                nics: self.nics.get().cloned().unwrap_or_default(),
                load: load.clone(),
                id: self.id(),
                metrics: self.metrics.clone(),
                standby: self.standby.load(Ordering::Relaxed),
                ebbs: splitos_rpc::messenger::served(),
                fenced_by: self.fenced_by.load(Ordering::Relaxed),
                start: self.start,
            };
            match self.call_gm(msg) {
                Ok(r) => {
                    self.id.store(r.id, Ordering::Relaxed);
                    splitos_rpc::messenger::set_component_id(r.id);
                    self.told_period(r.beat_ms);
                    return Ok(r);
                }
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(last.expect("at least one attempt"))
    }

    /// Whether mComponent `id` still counts as alive, late maybe: the global managers answer
    /// heartbeats and have not declared it lost. A call to it that got no answer is then
    /// worth waiting for (it may be paused, swapping, overloaded) rather than giving up what
    /// it holds.
    pub fn mcomp_not_lost(&self, id: u32) -> bool {
        match &*self.heard.lock().unwrap() {
            Some((at, lost)) => at.elapsed() < self.beat() * MISSED_BEATS && !lost.contains(&id),
            None => false,
        }
    }

    /// How long it waits between heartbeats: the period the managers told it last.
    pub fn beat(&self) -> Duration {
        Duration::from_millis(self.beat_ms.load(Ordering::Relaxed))
    }

    /// The managers told a heartbeat period (0: none, as before).
    fn told_period(&self, ms: u32) {
        if ms != 0 {
            self.beat_ms.store(ms as u64, Ordering::Relaxed);
            crate::series::NODE_HEARTBEAT_PERIOD_MS.set(ms as f64);
        }
    }

    /// Whether the global managers said in their last answer that mComponent `id` is lost.
    pub fn mcomp_declared_lost(&self, id: u32) -> bool {
        self.heard
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|(_, lost)| lost.contains(&id))
    }

    /// After a long stop of this component, waits until the managers have answered since
    /// ([`stop`]): what it was sent before is not carried out by a home it may no longer be.
    pub fn after_stop(&self) {
        self.stop.after_stop();
    }

    /// Heartbeats forever, handing each answer to `on_beat`; re-registers if the global
    /// managers forgot us (they restarted).
    pub fn heartbeat_forever(
        self: Arc<Self>,
        shim_sock: Option<String>,
        load: impl Fn() -> Load + Send + 'static,
        on_beat: impl Fn(splitos_rpc::G2X_BEAT) + Send + 'static,
    ) {
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                let watched = self.clone();
                std::thread::Builder::new()
                    .name("stop-watch".into())
                    .spawn(move || watched.stop.tick_forever())
                    .expect("spawn the stop watch");
                let mut silence = Silence::default();
                // The first beat goes at once: its answer tells what registering did not (the
                // cluster's memory, for one).
                loop {
                let leaving = self.leaving.lock().unwrap().clone();
                let sent = self.stop.beat_sent();
                match self.call_gm(X2G_HEARTBEAT {
                    id: self.id(),
                    addr: self.addr.clone(),
                    load: load(),
                    links: self.links(),
                    leaving,
                    ebbs: splitos_rpc::messenger::served(),
                    fenced_by: self.fenced_by.load(Ordering::Relaxed),
                }) {
                    Ok(beat) => {
                        if let Some(silent) = silence.answered() {
                            tracing::info!(silent_s = silent.as_secs(), "the global managers answer heartbeats again");
                        }
                        *self.heard.lock().unwrap() = Some((Instant::now(), beat.lost_mcomps.clone()));
                        self.told_period(beat.beat_ms);
                        // Acted on once `on_beat` returns: a fence drops everything before.
                        let fence = beat.fence;
                        on_beat(beat);
                        self.acted_on_fence(fence);
                        self.stop.answered(sent);
                    }
                    Err(RpcError::Remote {
                        code: ErrCode::NotFound,
                        ..
                    }) => {
                        crate::series::NODE_REGISTRATIONS_AGAIN.increment(1);
                        if let Ok(r) = self.register(shim_sock.clone(), load()) {
                            if r.fence != 0 {
                                on_beat(splitos_rpc::G2X_BEAT {
                                    fence: r.fence,
                                    ..splitos_rpc::G2X_BEAT::nothing()
                                });
                                self.acted_on_fence(r.fence);
                            }
                            self.stop.answered(sent);
                        }
                    }
                    Err(e) => match silence.failed() {
                        Some(silent) => tracing::warn!(error = %e, silent_s = silent.as_secs(), "the global managers do not answer heartbeats; this component goes on serving and keeps trying"),
                        None => tracing::debug!(error = %e, "heartbeat to the global managers failed"),
                    },
                }
                std::thread::sleep(self.beat());
                }
            })
            .expect("spawn heartbeat");
    }
}

/// How long the managers have not answered heartbeats, and when that was last said: a
/// component on its own says so at once and then every [`Silence::EVERY`], not at every beat
/// (a debug line each) nor never.
#[derive(Default)]
struct Silence {
    since: Option<Instant>,
    said: Option<Instant>,
}

impl Silence {
    const EVERY: Duration = Duration::from_secs(30);

    /// A heartbeat failed: how long they have been silent, when that is to be said now.
    fn failed(&mut self) -> Option<Duration> {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if self.said.is_some_and(|s| now.duration_since(s) < Silence::EVERY) {
            return None;
        }
        self.said = Some(now);
        Some(now.duration_since(since))
    }

    /// A heartbeat was answered: how long they had been silent, if they had.
    fn answered(&mut self) -> Option<Duration> {
        self.said = None;
        self.since.take().map(|s| s.elapsed())
    }
}

/// SIGTERM and SIGINT, blocked in every thread and taken by one waiter, so that a component
/// can finish its work (unmount, write back, commit) before it exits.
pub struct StopSignals(libc::sigset_t);

/// Blocks the stop signals; call before the component starts any thread (threads inherit the mask).
pub fn block_stop_signals() -> StopSignals {
    // SAFETY: sigset_t is a plain bit array; all zeros is a valid value (sigemptyset sets it anyway).
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: every pointer is to `set`, a live local, and the old mask is not asked for
    // (null). With valid signal numbers sigemptyset and sigaddset cannot fail.
    let r = unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut())
    };
    // Not blocked, a stop signal would end the component at once, skipping its orderly stop.
    assert_eq!(
        r,
        0,
        "cannot block the stop signals: {}",
        std::io::Error::from_raw_os_error(r)
    );
    StopSignals(set)
}

impl StopSignals {
    /// Runs `f` when a stop signal arrives, then exits.
    pub fn on_stop(self, f: impl FnOnce() + Send + 'static) {
        let set = self.0;
        std::thread::Builder::new()
            .name("stop-signals".into())
            .spawn(move || {
                let mut sig = 0;
                // SAFETY: `set` is an initialised signal set and `sig` a live local the call writes.
                let r = unsafe { libc::sigwait(&set, &mut sig) };
                if r != 0 {
                    // Still blocked everywhere, the stop signals could never end this component:
                    // take them in this thread with their default action (an immediate exit).
                    tracing::error!(error = %std::io::Error::from_raw_os_error(r), "cannot wait for stop signals; a stop signal now ends this component without its orderly stop");
                    // SAFETY: as above; only this thread's mask changes.
                    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut()) };
                    park_forever();
                }
                tracing::info!(signal = sig, "stopping");
                f();
                std::process::exit(0);
            })
            .expect("spawn signal thread");
    }
}

/// Writes the bound address where a parent that started us with `--ready-file` waits for it.
pub fn announce_ready(ready_file: Option<&std::path::Path>, addr: &str) {
    if let Some(p) = ready_file {
        if splitos_rpc::auth::write_private(p, addr.as_bytes()).is_err() {
            tracing::error!(path = %p.display(), "cannot write the ready file");
        }
    }
}

/// Ends the process shortly after the current reply is on its way.
pub fn exit_soon() {
    std::thread::spawn(|| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        std::process::exit(0);
    });
}

/// A component's main thread waits here while its own threads serve.
pub fn park_forever() -> ! {
    loop {
        std::thread::park();
    }
}

mod stop;
#[cfg(test)]
mod tests;
