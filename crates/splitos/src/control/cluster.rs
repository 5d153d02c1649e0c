//! Starting, finding, inspecting and stopping a cluster of component processes on this host.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use splitos_rpc::auth::Authority;
use splitos_rpc::{ComponentInfo, Request, Role, Rpc, TransportConfig, C2G_STATUS, C2X_STATS, X2G_WHO_LEADS};

use crate::config::{
    self, ClusterConfig, GmArgs, GmConfig, MemArgs, NetArgs, NodeArgs, ProcArgs, ProcessArgs, ScompConfig, StorageArgs,
};

/// What `cluster up` leaves behind so that `run`, `status` and `down` find the cluster.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct ClusterState {
    pub gm: String,
    pub dir: PathBuf,
    pub pids: Vec<u32>,
    #[serde(default)]
    pub transport: TransportConfig,
    /// Where the leading manager served the REST API when the cluster started.
    #[serde(default)]
    pub api: Option<String>,
    /// Where every manager serves it (each for as long as it runs; only the leader answers).
    #[serde(default)]
    pub apis: Vec<String>,
    /// The components of the configuration that run on other machines, not started here.
    #[serde(default)]
    pub elsewhere: Vec<String>,
}

/// The directory of the long-lived cluster's state: $SPLITOS_STATE_DIR, else /run/splitos
/// for root, else the user's own runtime directory ($XDG_RUNTIME_DIR/splitos), else one in
/// the user's home: never a shared directory such as /tmp, where another user could make it
/// first.
pub fn state_dir() -> PathBuf {
    if let Ok(d) = std::env::var("SPLITOS_STATE_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: getuid takes nothing and cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        return PathBuf::from("/run/splitos");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("splitos"),
        _ => home().join(".local/state/splitos"),
    }
}

/// This user's home: $HOME, else the one the user database names.
fn home() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.dir)
        })
        .unwrap_or_else(|| PathBuf::from("/nonexistent"))
}

/// Where sComponents keep files unless configured otherwise: $SPLITOS_DATA_DIR, else
/// /var/lib/splitos for root, else ~/.local/share/splitos. Unlike the state directory it
/// outlives reboots.
pub fn data_dir() -> PathBuf {
    if let Ok(d) = std::env::var("SPLITOS_DATA_DIR") {
        return PathBuf::from(d);
    }
    // SAFETY: getuid takes nothing and cannot fail.
    if unsafe { libc::getuid() } == 0 {
        return PathBuf::from("/var/lib/splitos");
    }
    home().join(".local/share/splitos")
}

/// The state directory of the host's cluster, the one users run programs on:
/// $SPLITOS_STATE_DIR, else root's (/run/splitos), whoever asks.
pub fn host_state_dir() -> PathBuf {
    std::env::var_os("SPLITOS_STATE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/run/splitos"))
}

/// Where the pComponents of the cluster whose state is in `state` put their program sockets:
/// the one place in the state directory that every user may list.
pub fn programs_dir(state: &Path) -> PathBuf {
    state.join("programs")
}

/// Where they mount vNode file systems; each mount's top directory admits its vNode's users.
pub fn vnodes_dir(state: &Path) -> PathBuf {
    state.join("vnodes")
}

pub fn state_file() -> PathBuf {
    state_dir().join("cluster.json")
}

pub fn read_state() -> Option<ClusterState> {
    serde_json::from_str(&std::fs::read_to_string(state_file()).ok()?).ok()
}

/// The admin's credentials that the control plane proves: set for an embedded cluster, else
/// $SPLITOS_CREDENTIALS, else those in the state directory.
static ADMIN: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

pub fn use_admin_credentials(path: &Path) {
    *ADMIN.lock().unwrap() = Some(path.to_path_buf());
}

pub fn admin_credentials() -> PathBuf {
    ADMIN
        .lock()
        .unwrap()
        .clone()
        .or_else(|| std::env::var_os("SPLITOS_CREDENTIALS").map(PathBuf::from))
        .unwrap_or_else(|| state_dir().join(ADMIN_CREDENTIALS))
}

/// The control plane's RPC client, one per credentials file.
pub fn rpc() -> anyhow::Result<&'static Rpc> {
    static RPC: std::sync::Mutex<Vec<(PathBuf, &'static Rpc)>> = std::sync::Mutex::new(Vec::new());
    let path = admin_credentials();
    let mut cache = RPC.lock().unwrap();
    if let Some((_, r)) = cache.iter().find(|(p, _)| *p == path) {
        return Ok(r);
    }
    let creds = crate::node::credentials(&path, Role::Admin).map_err(|e| {
        anyhow::anyhow!("{e} (the admin's tools need the cluster's admin credentials, readable by root)")
    })?;
    // The transport of the cluster `cluster up` started; TCP's defaults for any other.
    let t = read_state().map(|s| s.transport).unwrap_or_default();
    let r: &'static Rpc = Box::leak(Box::new(crate::node::client_rpc(&t, creds, Duration::from_secs(5))?));
    cache.push((path, r));
    Ok(r)
}

/// The cluster authority's X.509 certificate, which clients of an API beyond loopback trust,
/// and the API's certificate and key it issued.
pub const CA_CERT: &str = "ca.pem";
/// The key of that authority, made with the cluster and kept as long.
pub const X509_AUTHORITY: &str = "x509-authority.key";
pub const API_CERT: &str = "api.pem";
pub const API_KEY: &str = "api.key";
/// Where a state directory keeps what only the global managers read: their state file, the
/// key its records are signed with, and their client certificate for etcd (a directory only
/// the cluster's user can enter: the state directory itself lets others pass).
pub const MANAGERS_DIR: &str = "gm";
pub const GM_STATE: &str = "gm/state.redb";
pub const GM_STATE_KEY: &str = "gm/state.key";
pub const ETCD_CLIENT_CERT: &str = "gm/etcd-client.pem";
pub const ETCD_CLIENT_KEY: &str = "gm/etcd-client.key";
pub const ETCD_CA: &str = "gm/etcd-ca.pem";
/// Where a state directory keeps the cluster's authority and the admin's credentials.
pub const AUTHORITY: &str = "authority.key";
pub const ADMIN_CREDENTIALS: &str = "admin.cred";
/// Where a state directory keeps the REST API token of root's own tools (`splitos ps`), made
/// anew by every `cluster up`.
pub const ADMIN_TOKEN: &str = "admin.token";
/// That token's name in `cluster token list`.
pub const ADMIN_TOKEN_NAME: &str = "local-admin";

/// The authority of the cluster whose state is in `dir`, made on its first start and kept
/// for the next (so that the admin's credentials and those issued by hand stay valid).
pub fn authority(dir: &Path) -> anyhow::Result<Authority> {
    let p = dir.join(AUTHORITY);
    let a = if p.exists() {
        Authority::load(&p).map_err(|e| anyhow::anyhow!("cannot read the cluster's authority {}: {e}", p.display()))?
    } else {
        let a = Authority::generate()?;
        a.save(&p)?;
        a
    };
    let admin = dir.join(ADMIN_CREDENTIALS);
    if !admin.exists() {
        a.issue(Role::Admin)?.save(&admin)?;
    }
    Ok(a)
}

/// One request to the component at `addr`; an error names the component.
pub fn ask<R: Request>(addr: &str, req: R) -> anyhow::Result<R::Reply> {
    rpc()?
        .call(addr, req)
        .map_err(|e| anyhow::anyhow!("component at {addr}: {e}"))
}

/// A running set of component processes started by us.
pub struct Cluster {
    pub state: ClusterState,
    children: Vec<Child>,
}

fn self_exe() -> anyhow::Result<PathBuf> {
    std::env::current_exe().map_err(|e| anyhow::anyhow!("cannot locate the splitos binary: {e}"))
}

/// Starts a component process running `splitos COMMAND` with its whole configuration `args`
/// (written next to its log for its `--config-file`), in network namespace `netns` (a file of
/// /run/netns) if given.
fn spawn<T: Serialize>(
    dir: &Path,
    name: &str,
    command: &str,
    args: &T,
    detach: bool,
    netns: Option<&str>,
) -> anyhow::Result<(Child, PathBuf)> {
    let config = dir.join(format!("{name}.json"));
    config::write_start_file(&config, args)?;
    // Logs name programs, vNodes and addresses: for root (the admin) only.
    let log = crate::trusted::new_file(&dir.join(format!("{name}.log")), 0o600)
        .map_err(|e| anyhow::anyhow!("cannot create {name}'s log in {}: {e}", dir.display()))?;
    // `cluster restart` starts it again in the same namespace.
    let netns_file = dir.join(format!("{name}.netns"));
    match netns {
        Some(ns) => std::fs::write(&netns_file, ns)?,
        None => {
            let _ = std::fs::remove_file(&netns_file);
        }
    }
    launch(dir, name, command, log, detach, netns)
}

/// Starts `splitos COMMAND --config-file NAME.json` of state directory `dir`, its output to
/// `log`.
pub(crate) fn launch(
    dir: &Path,
    name: &str,
    command: &str,
    log: std::fs::File,
    detach: bool,
    netns: Option<&str>,
) -> anyhow::Result<(Child, PathBuf)> {
    let _ = std::fs::remove_file(ready_file(dir, name));
    let config = dir.join(format!("{name}.json"));
    let mut cmd = Command::new(self_exe()?);
    cmd.arg(command)
        .arg("--config-file")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    cmd.env_remove("LD_PRELOAD");
    use std::os::unix::process::CommandExt;
    // A process group of its own: signals for the job that started it (the terminal's ^C,
    // `timeout`) are for its program, not for the cluster.
    cmd.process_group(0);
    if !detach {
        // An embedded cluster ends with the run that started it, even if that run is killed.
        // SAFETY: the closure runs in the forked child before exec and only calls prctl, which
        // is async-signal-safe, touches no memory of ours and allocates nothing.
        unsafe {
            cmd.pre_exec(|| {
                (libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == 0)
                    .then_some(())
                    .ok_or_else(std::io::Error::last_os_error)
            })
        };
    }
    if let Some(ns) = netns {
        let f = std::fs::File::open(Path::new("/run/netns").join(ns))
            .map_err(|e| anyhow::anyhow!("{name}: network namespace {ns:?}: {e} (make it with `ip netns add {ns}`)"))?;
        // SAFETY: setns is async-signal-safe and takes the descriptor opened above, which
        // the closure owns and which lives until exec (close-on-exec).
        unsafe {
            cmd.pre_exec(move || {
                use std::os::fd::AsRawFd;
                (libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) == 0)
                    .then_some(())
                    .ok_or_else(std::io::Error::last_os_error)
            })
        };
    }
    let child = cmd.spawn().map_err(|e| anyhow::anyhow!("cannot start {name}: {e}"))?;
    Ok((child, ready_file(dir, name)))
}

/// Whether a component listening at `listen` (in network namespace `netns`) runs on this
/// machine: in one of its namespaces, at a loopback address, or at an address of one of its
/// interfaces (one it can bind).
/// A name that resolves to nothing is taken for local: the component started here says why
/// it cannot listen there.
fn local(listen: &str, netns: Option<&str>) -> bool {
    use std::net::ToSocketAddrs;
    if netns.is_some() {
        return true;
    }
    match listen.to_socket_addrs().ok().and_then(|mut a| a.next()) {
        // The whole address but its port, so that an IPv6 one keeps its scope.
        Some(mut a) => {
            a.set_port(0);
            a.ip().is_loopback() || std::net::TcpListener::bind(a).is_ok()
        }
        None => true,
    }
}

/// `listen` itself, unless it asks for any port (0) of an address here: then a free port below
/// the host's ephemeral range. A manager is started again at the address the others know it by,
/// and a port of that range, free while it is down, can be taken meanwhile by any connection's
/// or listener's "any port", so the manager could not come back there.
fn lasting(listen: &str, netns: Option<&str>) -> String {
    use rand::Rng;
    let Ok(addr) = listen.parse::<std::net::SocketAddr>() else {
        return listen.to_string();
    };
    if addr.port() != 0 || netns.is_some() {
        return listen.to_string();
    }
    // The kernel's default range starts at 32768; ports under 10000 are where services are
    // configured by hand.
    let below = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let from = 10000.min(below / 2).max(1024);
    if below <= from {
        return listen.to_string();
    }
    let mut rng = rand::rng();
    (0..64)
        .map(|_| std::net::SocketAddr::new(addr.ip(), rng.random_range(from..below)))
        .find(|a| std::net::TcpListener::bind(a).is_ok())
        .map_or_else(|| listen.to_string(), |a| a.to_string())
}

/// Whether component `name` is another machine's (`local`), noted in `elsewhere` if so.
fn away(elsewhere: &mut Vec<String>, name: &str, listen: &str, netns: Option<&str>) -> bool {
    let away = !local(listen, netns);
    if away {
        elsewhere.push(format!("{name} at {listen}"));
    }
    away
}

/// Where the component `name` writes its address once it serves.
pub(crate) fn ready_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.ready"))
}

pub(crate) fn wait_ready(child: &mut Child, ready: &Path, name: &str, dir: &Path) -> anyhow::Result<String> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        if let Ok(addr) = std::fs::read_to_string(ready) {
            return Ok(addr);
        }
        if let Some(st) = child.try_wait()? {
            let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            anyhow::bail!(
                "{name} exited during start-up ({st}):\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    anyhow::bail!(
        "{name} did not become ready within 20 s (log: {})",
        dir.join(format!("{name}.log")).display()
    )
}

/// Creates the state directory so that its user alone lists it (`0711`), or makes an existing
/// one of that user so: it holds the secrets, the logs, the PID record and the rendezvous
/// sockets of shared memory, all its user's alone, and the two directories other users need
/// to pass through to: `programs` (the program sockets) and `vnodes` (the mounts). A tree that
/// another user could change, or that holds what its user did not make, is refused.
pub(crate) fn private_dir(dir: &Path) -> anyhow::Result<()> {
    let state = |e: anyhow::Error| anyhow::anyhow!("the state directory {}: {e}", dir.display());
    crate::trusted::own_dir(dir, 0o711).map_err(state)?;
    for d in [programs_dir(dir), vnodes_dir(dir)] {
        crate::trusted::own_dir(&d, 0o755).map_err(state)?;
    }
    crate::trusted::own_dir(&dir.join(MANAGERS_DIR), 0o700).map_err(state)?;
    // Earlier versions kept the managers' state here, readable by anyone who knew the path.
    let legacy = dir.join("gm-state.redb");
    if legacy.exists() {
        std::fs::remove_file(&legacy).map_err(|e| {
            state(anyhow::anyhow!(
                "cannot remove the unsigned state of an earlier version {}: {e}",
                legacy.display()
            ))
        })?;
        tracing::warn!(file = %legacy.display(), "removed the managers' state of an earlier version: its records are not signed; tokens made through the API must be made again");
    }
    Ok(())
}

/// The global managers' client certificate for etcd, issued by the cluster's X.509 authority
/// at every start, beside the authority's certificate that etcd's is checked against.
fn issue_etcd_client(dir: &Path) -> anyhow::Result<()> {
    let issued =
        splitos_gm::api::tls::issue_etcd_client(&splitos_gm::api::tls::authority_key(&dir.join(X509_AUTHORITY))?)?;
    splitos_gm::api::tls::write_issued(
        &issued,
        &dir.join(ETCD_CA),
        &dir.join(ETCD_CLIENT_CERT),
        &dir.join(ETCD_CLIENT_KEY),
    )
}

impl Cluster {
    /// Starts every component of `cfg`, each its own process, and waits until all registered.
    pub fn start(cfg: &ClusterConfig, dir: &Path, detach: bool) -> anyhow::Result<Cluster> {
        private_dir(dir)?;
        let mut c = Cluster {
            state: ClusterState {
                gm: String::new(),
                dir: dir.to_path_buf(),
                pids: Vec::new(),
                transport: cfg.transport.clone(),
                api: None,
                apis: Vec::new(),
                elsewhere: Vec::new(),
            },
            children: Vec::new(),
        };
        let r = c.start_all(cfg, dir, detach);
        if let Err(e) = r {
            c.stop();
            return Err(e);
        }
        Ok(c)
    }

    fn start_all(&mut self, cfg: &ClusterConfig, dir: &Path, detach: bool) -> anyhow::Result<()> {
        let ca = authority(dir)?;
        if !detach {
            use_admin_credentials(&dir.join(ADMIN_CREDENTIALS));
        }
        // Each component gets credentials of its own role, next to its log, and speaks the
        // cluster's transport.
        let process = |name: &str, role: Role| -> anyhow::Result<ProcessArgs> {
            let credentials = dir.join(format!("{name}.cred"));
            ca.issue(role)?.save(&credentials)?;
            Ok(ProcessArgs {
                transport: cfg.transport.clone(),
                credentials: Some(credentials),
                ready_file: Some(ready_file(dir, name)),
                metrics_addr: crate::config::METRICS_ADDR.to_string(),
            })
        };
        // Beyond loopback the API serves HTTPS, with a certificate the authority issues at
        // every start; clients trust the authority's certificate beside it.
        // Every manager serves it, each at its address: one certificate names them all.
        let mut api_ips: Vec<std::net::IpAddr> = cfg
            .managers()
            .iter()
            .filter_map(|m| {
                m.api
                    .as_deref()
                    .unwrap_or(&cfg.cluster.api)
                    .parse::<std::net::SocketAddr>()
                    .ok()
            })
            .map(|a| a.ip())
            .filter(|ip| !ip.is_loopback())
            .collect();
        api_ips.sort();
        api_ips.dedup();
        let (api_cert, api_key) = match api_ips.is_empty() {
            false => {
                let issued = splitos_gm::api::tls::issue(
                    &splitos_gm::api::tls::authority_key(&dir.join(X509_AUTHORITY))?,
                    &api_ips,
                )?;
                let (cert, key) = (dir.join(API_CERT), dir.join(API_KEY));
                std::fs::write(dir.join(CA_CERT), &issued.ca_pem)?;
                std::fs::write(&cert, &issued.cert_pem)?;
                splitos_rpc::auth::write_private(&key, issued.key_pem.as_bytes())?;
                (Some(cert), Some(key))
            }
            true => (None, None),
        };
        // One manager keeps the state in a file of the cluster's state directory; several keep
        // it in etcd, and each is named `gm<i>`. Either way its records are signed with a key
        // made with the cluster and kept as long.
        let managers = cfg.managers();
        crate::state::StateKey::at(&dir.join(GM_STATE_KEY), true)?;
        if cfg.cluster.etcd.iter().any(|e| e.starts_with("https://")) {
            issue_etcd_client(dir)?;
        }
        let mut addrs = Vec::new();
        // A configuration may span machines: what is another's is started there (by `splitos
        // gm`, `splitos mem`, ... or their service units), not here.
        let mut elsewhere = Vec::new();
        for (i, m) in managers.iter().enumerate() {
            let name = if cfg.gm.is_empty() {
                "gm".to_string()
            } else {
                format!("gm{i}")
            };
            if away(&mut elsewhere, &name, &m.listen, m.netns.as_deref()) {
                addrs.push(m.listen.clone());
                continue;
            }
            let state = cfg.cluster.etcd.is_empty().then(|| dir.join(GM_STATE));
            // Every component starts anew: the last start's would show as lost until forgotten.
            // (With etcd a manager of another machine may lead components that still run.)
            if let Some(file) = state.as_ref().filter(|f| f.exists()) {
                splitos_gm::forget_components(file, &dir.join(GM_STATE_KEY))?;
            }
            let etcd_tls = cfg.cluster.etcd.iter().any(|e| e.starts_with("https://"));
            let cluster = GmConfig {
                api: lasting(m.api.as_deref().unwrap_or(&cfg.cluster.api), m.netns.as_deref()),
                ..cfg.gm()
            };
            let api_ca = api_cert.as_ref().map(|_| dir.join(CA_CERT));
            let gm = GmArgs {
                listen: lasting(&m.listen, m.netns.as_deref()),
                cluster,
                vnodes: cfg.vnode.clone(),
                state,
                api_cert: api_cert.clone(),
                api_key: api_key.clone(),
                api_ca,
                authority: Some(dir.join(AUTHORITY)),
                state_key: Some(dir.join(GM_STATE_KEY)),
                etcd_ca: etcd_tls.then(|| dir.join(ETCD_CA)),
                etcd_cert: etcd_tls.then(|| dir.join(ETCD_CLIENT_CERT)),
                etcd_key: etcd_tls.then(|| dir.join(ETCD_CLIENT_KEY)),
                process: process(&name, Role::Gm)?,
            };
            let (mut ch, ready) = spawn(dir, &name, "gm", &gm, detach, m.netns.as_deref())?;
            let gm = wait_ready(&mut ch, &ready, &name, dir);
            self.state.pids.push(ch.id());
            self.children.push(ch);
            addrs.push(gm?);
        }
        // This machine holds the authority that issues every credential, and the components
        // it starts register with a manager: at least one runs here.
        if elsewhere.len() == managers.len() {
            anyhow::bail!("none of the global managers is on this machine: run `cluster up` where one is (it holds the cluster's authority)");
        }
        if addrs
            .iter()
            .any(|a| a.parse::<std::net::SocketAddr>().is_ok_and(|a| a.port() == 0))
            && !elsewhere.is_empty()
        {
            anyhow::bail!("a global manager on another machine needs a fixed port, which the components here are told");
        }
        self.state.gm = addrs.join(",");
        let node = |name: &str, role: Role| -> anyhow::Result<NodeArgs> {
            Ok(NodeArgs {
                gm: self.state.gm.clone(),
                process: process(name, role)?,
            })
        };
        // Started in dependency order and stopped in reverse: pComponents unmount first,
        // mComponents write their buffer caches back, and sComponents commit last.
        let mut pending = Vec::new();
        for (i, sc) in cfg.scomponent.iter().enumerate() {
            let name = format!("storage{i}");
            if away(&mut elsewhere, &name, &sc.listen, sc.netns.as_deref()) {
                continue;
            }
            let store = sc.dir.clone().unwrap_or_else(|| {
                data_dir().join(if i == 0 {
                    "storage".to_string()
                } else {
                    format!("storage{i}")
                })
            });
            let args = StorageArgs {
                scomp: ScompConfig {
                    dir: Some(store),
                    ..sc.clone()
                },
                node: node(&name, Role::Storage)?,
            };
            pending.push((
                name.clone(),
                spawn(dir, &name, "storage", &args, detach, sc.netns.as_deref())?,
            ));
        }
        for (i, m) in cfg.mcomponent.iter().enumerate() {
            let name = format!("mem{i}");
            if away(&mut elsewhere, &name, &m.listen, m.netns.as_deref()) {
                continue;
            }
            let args = MemArgs {
                mcomp: m.clone(),
                node: node(&name, Role::Mem)?,
            };
            pending.push((
                name.clone(),
                spawn(dir, &name, "mem", &args, detach, m.netns.as_deref())?,
            ));
        }
        for (i, p) in cfg.pcomponent.iter().enumerate() {
            let name = format!("proc{i}");
            if away(&mut elsewhere, &name, &p.listen, p.netns.as_deref()) {
                continue;
            }
            let args = ProcArgs {
                pcomp: p.clone(),
                shim_sock: programs_dir(dir).join(format!("{name}.sock")),
                vnode_root: vnodes_dir(dir),
                node: node(&name, Role::Proc)?,
            };
            pending.push((
                name.clone(),
                spawn(dir, &name, "proc", &args, detach, p.netns.as_deref())?,
            ));
        }
        for (i, n) in cfg.ncomponent.iter().enumerate() {
            let name = format!("net{i}");
            if away(&mut elsewhere, &name, &n.listen, n.netns.as_deref()) {
                continue;
            }
            let args = NetArgs {
                ncomp: n.clone(),
                node: node(&name, Role::Net)?,
            };
            pending.push((
                name.clone(),
                spawn(dir, &name, "net", &args, detach, n.netns.as_deref())?,
            ));
        }
        let want = pending.len();
        if !elsewhere.is_empty() {
            // `cluster up` says so in its summary; only an embedded run has nothing else to say it.
            if !detach {
                tracing::info!(components = ?elsewhere, "not started here: their addresses are another machine's");
            }
            self.state.elsewhere = elsewhere;
        }
        for (name, (mut ch, ready)) in pending {
            let r = wait_ready(&mut ch, &ready, &name, dir);
            self.state.pids.push(ch.id());
            self.children.push(ch);
            // Without its sComponent no program of the cluster could have its vNode's files.
            r.map_err(|e| {
                if name.starts_with("storage") {
                    e.context("the cluster cannot keep its vNodes' files")
                } else {
                    e
                }
            })?;
        }
        let t0 = Instant::now();
        loop {
            let alive = status(&self.state.gm).map(|s| s.iter().filter(|c| c.alive && c.role != Role::Gm).count());
            if alive.as_ref().is_ok_and(|a| *a >= want) {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(20) {
                match alive {
                    Ok(alive) => anyhow::bail!("only {alive} of {want} components registered with the global managers"),
                    // Its components may well have registered: this machine cannot ask.
                    Err(e) => anyhow::bail!("the global managers at {} do not answer here: {e}", self.state.gm),
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Leaves the processes running (for `cluster up`).
    pub fn detach(mut self) -> ClusterState {
        self.children.clear();
        self.state.clone()
    }

    pub fn stop(&mut self) {
        stop_pids(&self.state.pids);
        for c in &mut self.children {
            let _ = c.wait();
        }
        self.children.clear();
        unmount_vnodes(&self.state.dir);
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.children.is_empty() {
            self.stop();
        }
    }
}

/// Detaches vNode mounts a pComponent left under a cluster's directory (it was killed before
/// it could unmount them), so that nothing walks into a dead mount.
pub fn unmount_vnodes(dir: &Path) {
    for m in crate::sys::mounts_under(&vnodes_dir(dir)) {
        crate::sys::unmount(&m);
    }
}

/// Ends component processes by PID, last started first: SIGTERM, then SIGKILL for one still
/// there after 3 s.
pub fn stop_pids(pids: &[u32]) {
    for p in pids.iter().rev() {
        // SAFETY: kill takes no pointers; signalling another process cannot affect our memory.
        if unsafe { libc::kill(*p as i32, libc::SIGTERM) } != 0 {
            let e = std::io::Error::last_os_error();
            // ESRCH: already gone. Anything else (EPERM) leaves it running: say so, not "stopped".
            if e.raw_os_error() != Some(libc::ESRCH) {
                tracing::warn!(pid = p, error = %e, "cannot stop a component process");
            }
            continue;
        }
        let t0 = Instant::now();
        while pid_alive(*p) && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if pid_alive(*p) {
            // SAFETY: as above. SIGTERM reached it, so only ESRCH (it exited meanwhile) can fail this.
            unsafe { libc::kill(*p as i32, libc::SIGKILL) };
            // Gone before we go on: what comes after (the next component's stop, removing its
            // sockets, unmounting) must not find it still listening.
            let t0 = Instant::now();
            while pid_alive(*p) && t0.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

pub(crate) fn pid_alive(pid: u32) -> bool {
    // A zombie child of ours still answers kill(0); look at its state instead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

pub fn status(gm: &str) -> anyhow::Result<Vec<ComponentInfo>> {
    Ok(gm_status(gm)?.components)
}

/// What the global managers say of the cluster: its components and where its API is.
pub fn gm_status(gm: &str) -> anyhow::Result<splitos_rpc::G2C_STATUS> {
    let rpc = rpc().map_err(|e| anyhow::anyhow!("global managers at {gm}: {e}"))?;
    crate::node::Managers::new(gm)
        .call(rpc, C2G_STATUS)
        .map_err(|e| anyhow::anyhow!("global managers at {gm}: {e}"))
}

/// How long a tool waits for the managers to name a leader: about a handover.
const FIND_LEADER: Duration = Duration::from_secs(10);

/// The leading manager among `gm` (`ADDR[,ADDR...]`; one alone is taken as it is).
pub fn leader(gm: &str) -> anyhow::Result<String> {
    if !gm.contains(',') {
        return Ok(gm.to_string());
    }
    let (managers, rpc, t0) = (crate::node::Managers::new(gm), rpc()?, Instant::now());
    loop {
        // The one named must say so itself: during a handover the followers still name a
        // leader that is gone.
        if let Some(l) = managers.find_leader(rpc).filter(|l| {
            rpc.call_timeout(l, X2G_WHO_LEADS, Duration::from_secs(1))
                .is_ok_and(|w| w.leader.as_ref() == Some(l))
        }) {
            return Ok(l);
        }
        if t0.elapsed() > FIND_LEADER {
            anyhow::bail!("none of the global managers at {gm} names a leader");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Asks one component for its own statistics (exact, unlike heartbeat load).
pub fn component_stats(addr: &str) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::from_str(&ask(addr, C2X_STATS)?.json)?)
}
