//! `splitos run`: runs an unmodified program with its heap on the cluster's mComponents.
use std::io::{IsTerminal, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use splitos_rpc::C2G_PLACE_PROCESS;
use splitos_shim_abi::{ENV_RUN_ID, ENV_SOCK, ENV_VNODE};

/// Where the program finds its vNode's files.
pub const ENV_VNODE_DIR: &str = "SPLITOS_VNODE_DIR";

use super::cluster::{self, Cluster};
use super::job;
use super::launcher::Launcher;
use crate::config::{Embedded, Size};

/// `splitos run`: its own options, and those of the embedded cluster it starts when it runs
/// on none other.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Always start an embedded cluster, even if one is running.
    #[arg(long)]
    pub embedded: bool,
    /// Address of the global managers of a running cluster (needs the admin's credentials).
    #[arg(long)]
    pub gm: Option<String>,
    /// The program socket of a pComponent of this host to run on, as a user the cluster's
    /// admin granted the vNode (see docs/security.md); also $SPLITOS_PCOMPONENT.
    #[arg(long, value_name = "SOCKET")]
    pub pcomponent: Option<PathBuf>,
    /// The vNode to run the process in: `default`, or one of the cluster's configuration or
    /// made through its API (another name is refused, as a typo would be).
    #[arg(long, default_value = splitos_shim_abi::DEFAULT_VNODE)]
    pub vnode: String,
    /// Run on --vnode even if the cluster has no vNode of that name (root): its files and
    /// memory are made as the program uses them.
    #[arg(long)]
    pub create_vnode: bool,
    /// Write the run's counters as JSON to this file.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Print the run's counters to stderr when it ends.
    #[arg(long = "stats")]
    pub print_stats: bool,
    /// Also run the program natively first and report both times.
    #[arg(long)]
    pub compare_native: bool,
    /// Run a statically linked program natively (with a warning) instead of refusing it.
    #[arg(long)]
    pub allow_native: bool,
    /// Print no hints, such as the one when most of the run went to ExCache misses of a too
    /// small ExCache.
    #[arg(long, short)]
    pub quiet: bool,
    #[command(flatten)]
    pub cluster: Embedded,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true)]
    pub program: Vec<String>,
}

/// A program `run` could not start, with the exit status a shell gives for it.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}: command not found")]
    NotFound(String),
    #[error("{}: {why}", path.display())]
    NoSuchFile { path: PathBuf, why: std::io::Error },
    #[error("{}: {why}", path.display())]
    NotExecutable { path: PathBuf, why: std::io::Error },
}

impl StartError {
    /// 127 for a program that is not there, 126 for one that is but cannot be run.
    pub fn exit_code(&self) -> i32 {
        match self {
            StartError::NotFound(_) | StartError::NoSuchFile { .. } => 127,
            StartError::NotExecutable { .. } => 126,
        }
    }

    fn of_exec(path: &Path, why: std::io::Error) -> StartError {
        let path = path.to_path_buf();
        match why.kind() {
            std::io::ErrorKind::NotFound => StartError::NoSuchFile { path, why },
            _ => StartError::NotExecutable { path, why },
        }
    }
}

/// Finds `prog` the way execvp would: a name with a slash is a path, any other the first
/// executable file of that name in $PATH; one found only without execute permission cannot be
/// run (a shell's 126), none found is not there (127).
fn resolve(prog: &str) -> Result<PathBuf, StartError> {
    let runnable = |p: &Path| -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(p)?;
        if meta.is_dir() {
            return Err(std::io::Error::from_raw_os_error(libc::EISDIR));
        }
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
        // SAFETY: access reads the NUL-terminated path, which outlives the call.
        if meta.permissions().mode() & 0o111 == 0 || unsafe { libc::access(c.as_ptr(), libc::X_OK) } != 0 {
            return Err(std::io::Error::from_raw_os_error(libc::EACCES));
        }
        Ok(())
    };
    if prog.contains('/') {
        let path = PathBuf::from(prog);
        return match runnable(&path) {
            Ok(()) => Ok(path),
            Err(why) => Err(StartError::of_exec(&path, why)),
        };
    }
    let mut denied = None;
    for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
        let path = dir.join(prog);
        match runnable(&path) {
            Ok(()) => return Ok(path),
            Err(why) if why.kind() == std::io::ErrorKind::PermissionDenied && denied.is_none() => {
                denied = Some(StartError::NotExecutable { path, why })
            }
            Err(_) => {}
        }
    }
    Err(denied.unwrap_or_else(|| StartError::NotFound(prog.to_string())))
}

/// `Some(false)` for a static ELF executable (no interpreter: LD_PRELOAD cannot reach it).
fn is_dynamic_elf(path: &Path) -> Option<bool> {
    let data = std::fs::read(path).ok()?;
    if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 {
        return None;
    }
    let u16_at = |o: usize| u16::from_le_bytes([data[o], data[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(data[o..o + 8].try_into().unwrap()) as usize;
    let (phoff, phentsize, phnum) = (u64_at(32), u16_at(54), u16_at(56));
    for i in 0..phnum {
        let o = phoff + i * phentsize;
        if o + 4 > data.len() {
            return None;
        }
        if u32::from_le_bytes(data[o..o + 4].try_into().unwrap()) == 3 {
            return Some(true);
        }
    }
    Some(false)
}

/// The shim ($SPLITOS_SHIM, or the one beside this binary), checked to be one the dynamic
/// loader can preload: given one it cannot, ld.so only warns and the program runs natively,
/// which a run must never do on its own.
pub fn shim_path() -> anyhow::Result<PathBuf> {
    let (p, named) = match std::env::var("SPLITOS_SHIM") {
        Ok(p) => (PathBuf::from(p), "$SPLITOS_SHIM"),
        Err(_) => (
            std::env::current_exe()?.with_file_name("libsplitos_shim.so"),
            "beside splitos",
        ),
    };
    loadable(&p).map_err(|why| {
        anyhow::anyhow!(
            "the shim {} ({named}) {why}: a program it is not loaded into would run natively, so none is run \
             (build the whole workspace: cargo build --release --workspace)",
            p.display()
        )
    })?;
    Ok(p)
}

/// Why the dynamic loader could not preload `path` into a program of this machine, if it
/// could not: it must be a 64-bit little-endian ELF shared object built for the machine this
/// binary is built for, and readable.
fn loadable(path: &Path) -> Result<(), String> {
    let head = |p: &Path| -> std::io::Result<[u8; 20]> {
        let mut h = [0u8; 20];
        std::io::Read::read_exact(&mut std::fs::File::open(p)?, &mut h)?;
        Ok(h)
    };
    let h = head(path).map_err(|e| format!("cannot be read ({e})"))?;
    let ours = head(&std::env::current_exe().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    if &h[..4] != b"\x7fELF" || h[4] != 2 || h[5] != 1 || u16::from_le_bytes([h[16], h[17]]) != 3 {
        return Err("is not a 64-bit ELF shared library".into());
    }
    if h[18..20] != ours[18..20] {
        return Err("is built for another machine".into());
    }
    Ok(())
}

fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// Where a program runs.
enum Target {
    /// A cluster whose global managers the admin's tools reach: GPM places the program.
    Cluster(String),
    /// A pComponent's program socket, reached as whoever runs `splitos run`.
    Socket(PathBuf),
    /// A cluster of this command's own.
    Embedded,
}

/// How long `run` waits for global managers that do not answer: one started again is back
/// within seconds; a cluster that is down is said so after this.
const MANAGERS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn reachable(gm: String, named_by: &str, instead: &str) -> anyhow::Result<Target> {
    use splitos_rpc::RpcError;
    let (t0, mut said) = (Instant::now(), false);
    loop {
        let leader = cluster::leader(&gm)
            .map_err(|e| anyhow::anyhow!("cannot reach the cluster {named_by}: {e} ({instead})"))?;
        let rpc = cluster::rpc().map_err(|e| {
            anyhow::anyhow!("cannot reach the cluster {named_by}: global managers at {leader}: {e} ({instead})")
        })?;
        let e = match rpc.call(&leader, splitos_rpc::C2G_STATUS) {
            Ok(_) => return Ok(Target::Cluster(leader)),
            Err(e) => e,
        };
        // Only a manager that does not answer is waited for; one that refuses says why.
        let silent = matches!(
            e,
            RpcError::Unreachable { .. } | RpcError::Closed { .. } | RpcError::Timeout { .. }
        );
        if !silent || t0.elapsed() >= MANAGERS_WAIT {
            anyhow::bail!("cannot reach the cluster {named_by}: global managers at {leader}: {e} ({instead})");
        }
        if !said && t0.elapsed() >= std::time::Duration::from_secs(1) {
            crate::errln!("splitos: waiting for the global managers of the cluster {named_by} at {leader} ({e})");
            said = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The cluster to run on: --embedded; --pcomponent; --gm; $SPLITOS_GM; $SPLITOS_PCOMPONENT;
/// the cluster `cluster up` started; for a user other than root, the program socket of the
/// host's cluster; else (root) an embedded cluster. A cluster named or started that cannot be
/// reached is an error naming it: running on another one instead would show the program
/// another vNode's files and memory as if nothing were wrong.
fn target(a: &RunArgs) -> anyhow::Result<Target> {
    if a.embedded {
        return Ok(Target::Embedded);
    }
    if let Some(p) = &a.pcomponent {
        return Ok(Target::Socket(p.clone()));
    }
    if let Some(gm) = a.gm.clone() {
        return reachable(
            gm,
            "named by --gm",
            "pass --embedded to run on a cluster of this command's own",
        );
    }
    if let Ok(gm) = std::env::var("SPLITOS_GM") {
        return reachable(
            gm,
            "named by SPLITOS_GM",
            "unset it, or pass --embedded, to run on a cluster of this command's own",
        );
    }
    if let Some(p) = std::env::var_os("SPLITOS_PCOMPONENT") {
        return Ok(Target::Socket(PathBuf::from(p)));
    }
    if let Some(s) = cluster::read_state() {
        let instead = format!(
            "restart it with `splitos cluster down` and `splitos cluster up`, or pass --embedded; state: {}",
            cluster::state_file().display()
        );
        return reachable(s.gm, "that `splitos cluster up` started", &instead);
    }
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        let dir = cluster::programs_dir(&cluster::host_state_dir());
        // Only the cluster's user may have made what is found there: a socket another user
        // put in its place would be handed this program's memory.
        if dir.exists() {
            crate::trusted::check_path(&dir)
                .map_err(|e| anyhow::anyhow!("will not look for the host's pComponent there: {e}"))?;
        }
        let mut socks: Vec<PathBuf> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "sock"))
            .collect();
        socks.sort();
        return socks.into_iter().next().map(Target::Socket).ok_or_else(|| {
            anyhow::anyhow!(
                "no cluster to run on: no pComponent's program socket in {}. A user runs programs on the host's cluster, which root starts (`splitos cluster up`) and which grants the user a vNode ([[vnode]] in its configuration); name a socket elsewhere with --pcomponent. An embedded cluster needs root.",
                dir.display()
            )
        });
    }
    Ok(Target::Embedded)
}

pub fn run(a: RunArgs) -> anyhow::Result<i32> {
    let prog = a.program.first().ok_or_else(|| anyhow::anyhow!("no program given"))?;
    let path = resolve(prog)?;
    if is_dynamic_elf(&path) == Some(false) {
        if !a.allow_native {
            anyhow::bail!(
                "{} is statically linked: the splitos shim cannot be loaded into it, so its memory cannot be disaggregated. \
                 Use a dynamically linked build, or pass --allow-native to run it natively.",
                path.display()
            );
        }
        crate::errln!(
            "splitos: warning: {} is statically linked; running it NATIVELY, its memory is not disaggregated",
            path.display()
        );
        let st = Command::new(&path).args(&a.program[1..]).status()?;
        return Ok(exit_code(st));
    }

    let shim = shim_path()?;
    let native_secs = if a.compare_native {
        let t0 = Instant::now();
        let out = Command::new(&path).args(&a.program[1..]).output()?;
        Some((t0.elapsed().as_secs_f64(), out))
    } else {
        None
    };

    let mut embedded = None;
    let mut excache = None;
    let mut target = target(&a)?;
    if !matches!(target, Target::Embedded) {
        not_for_a_running_cluster(&a.cluster)?;
    }
    job::forward_signals()?;
    if let Target::Embedded = target {
        // SAFETY: geteuid takes nothing and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            anyhow::bail!("an embedded cluster needs root (it mounts file systems and serves programs' memory faults); as a user, run on the host's cluster");
        }
        let (cfg, fitting) = a.cluster.config().map_err(|e| anyhow::anyhow!(e))?;
        // Its stderr is the program's: said where a person reads it, and in the statistics.
        if let Some(f) = fitting.filter(|_| !a.quiet && std::io::stderr().is_terminal()) {
            crate::errln!("splitos: {f}; --excache sets another");
        }
        excache = Some(cfg.pcomponent[0].excache);
        let dir = tempfile::Builder::new().prefix("splitos-run-").tempdir()?.keep();
        let c = match Cluster::start(&cfg, &dir, false) {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        // The authority only signed the components' credentials, now issued. A run killed
        // by SIGKILL leaves its directory behind; it must not leave a key that signs more.
        let _ = std::fs::remove_file(dir.join(cluster::AUTHORITY));
        target = Target::Cluster(c.state.gm.clone());
        embedded = Some((c, dir));
    }

    let result = run_on(&target, &path, &shim, &a, embedded.is_some());
    if let Some((mut c, dir)) = embedded {
        // Processes the program left behind (a pipeline's other end, a daemon) would hang on
        // their first miss once the cluster is gone: stop them, and say so.
        if let Ok((_, _, _, run_id)) = &result {
            let left = stop_processes_of_run(*run_id);
            if left > 0 {
                crate::errln!("splitos: stopped {left} process(es) the program left running; the embedded cluster ends with the run");
            }
        }
        c.stop();
        let _ = std::fs::remove_dir_all(dir);
    }
    let (code, secs, stats, _) = result?;
    if !a.quiet {
        if let Some(hint) = excache_hint(&stats, secs) {
            crate::errln!("splitos: hint: {hint}");
        }
    }
    if a.print_stats {
        let keys = [
            "misses",
            "evictions",
            "flushes",
            "piggybacked",
            "plocal_fills",
            "faulted_around",
            "preallocated",
            "prefetched",
            "tier_hits",
            "tier_stores",
            "tier_writebacks",
            "wp_faults",
            "sample_touches",
            "bytes_fetched",
            "bytes_flushed",
            "miss_ns_p50",
            "miss_ns_p99",
            "inline_evictions",
            "bg_evictions",
        ];
        let parts: Vec<String> = excache
            .map(|e| format!("excache={e}"))
            .into_iter()
            .chain(
                keys.iter()
                    .map(|k| format!("{k}={}", stats.get(*k).cloned().unwrap_or_default())),
            )
            .collect();
        crate::errln!("splitos: {}", parts.join(" "));
    }
    if let Some((native, out)) = native_secs {
        let same = out.status.code() == Some(code);
        crate::errln!(
            "splitos: native {:.3} s, splitos {:.3} s ({:.2}x native); exit status {}",
            native,
            secs,
            secs / native.max(1e-9),
            if same {
                "identical".to_string()
            } else {
                format!("DIFFERS (native {})", exit_code(out.status))
            }
        );
    }
    Ok(code)
}

/// `shim`: the one `shim_path` checked. `files`: the cluster has an sComponent for the
/// program's vNode, so a program that would get no files is not started (it would write to the
/// host's directory instead).
fn run_on(
    target: &Target,
    path: &Path,
    shim: &Path,
    a: &RunArgs,
    files: bool,
) -> anyhow::Result<(i32, f64, serde_json::Value, u64)> {
    let (sock, gm) = match target {
        Target::Cluster(gm) => {
            let pcomp = cluster::rpc()?
                .call(gm, C2G_PLACE_PROCESS)
                .map_err(|e| anyhow::anyhow!("global managers at {gm}: {e}"))?
                .pcomp;
            let sock = pcomp
                .shim_sock
                .clone()
                .ok_or_else(|| anyhow::anyhow!("pComponent {} has no program socket", pcomp.id))?;
            (PathBuf::from(sock), Some((gm.as_str(), pcomp)))
        }
        Target::Socket(p) => (p.clone(), None),
        Target::Embedded => unreachable!("an embedded cluster was started"),
    };
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", shim.display()),
        _ => shim.display().to_string(),
    };
    // Random: a run's id is its claim to its counters on the pComponent.
    let run_id = splitos_rpc::auth::random_u64();
    let (mut launcher, vnode_dir) =
        Launcher::connect(&sock, &a.vnode, a.create_vnode, run_id, a.cluster.job_interleave())?;
    let pcomp_name = match &gm {
        Some((_, pcomp)) => format!("pComponent {} at {}", pcomp.id, pcomp.addr),
        None => format!("the pComponent at {}", sock.display()),
    };
    let t0 = Instant::now();
    let mut cmd = Command::new(path);
    cmd.args(&a.program[1..])
        .env("LD_PRELOAD", preload)
        .env(ENV_SOCK, &sock)
        .env(ENV_RUN_ID, run_id.to_string())
        .env(ENV_VNODE, &a.vnode);
    match &vnode_dir {
        Some(d) => {
            cmd.env(ENV_VNODE_DIR, d);
            isolate_vnode(&mut cmd, d);
        }
        None if files => anyhow::bail!("{pcomp_name} cannot give vNode {:?} its files (no sComponent is alive to keep them): not running {} without them", a.vnode, path.display()),
        None => {
            cmd.env_remove(ENV_VNODE_DIR);
        }
    }
    // The program is a job of its own (its own process group, given the terminal if this run
    // has it): the terminal's ^C and ^Z reach it alone, and what reaches this run's group
    // (`timeout`, kill -INT -PGID) is passed on, so that no signal meant for the program
    // reaches the cluster's components.
    let tty = job::foreground_tty();
    cmd.process_group(0);
    // SAFETY: prctl, tcsetpgrp, getpid, signal and restore_inherited (made for such a hook) are
    // async-signal-safe and touch no memory of ours. The program dies with us rather than outliving the run that owns its cluster.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(fd) = tty {
                // SIGTTOU is ignored here (inherited), so a background group may take the terminal.
                libc::tcsetpgrp(fd, libc::getpid());
            }
            libc::signal(libc::SIGTTOU, libc::SIG_DFL);
            job::restore_inherited()
        })
    };
    let child = cmd.spawn().map_err(|e| StartError::of_exec(path, e))?;
    let pid = child.id() as i32;
    if let Some(fd) = tty {
        // Also here: whichever of the two runs first, the program has the terminal before exec.
        // SAFETY: tcsetpgrp takes no pointers.
        unsafe { libc::tcsetpgrp(fd, pid) };
    }
    job::started(pid);
    let (stop, stopper) = std::os::unix::net::UnixStream::pair()?;
    let (st, lost) = std::thread::scope(|scope| -> anyhow::Result<_> {
        let watcher = scope.spawn(|| watch_pcomponent(&launcher, &pcomp_name, &stop, run_id));
        let st = job::wait_program(pid, tty);
        // Wakes the watcher; if the write failed it would wait for ever, so it is checked.
        (&stopper).write_all(b"x")?;
        let lost = watcher.join().expect("the watcher does not panic");
        Ok((st?, lost))
    })?;
    if let Some(why) = lost {
        anyhow::bail!("{why}");
    }
    let secs = t0.elapsed().as_secs_f64();
    // A process whose memory could not be served was told why on its own stderr by the
    // pComponent that stopped it (the run's errors, in --stats-json): repeating it here
    // printed every such message twice.
    let stats = launcher.run_stats(run_id).unwrap_or_else(|| serde_json::json!({}));
    if let Some(f) = &a.stats_json {
        let mut s = stats.clone();
        s["wall_s"] = serde_json::json!(secs);
        s["exit_code"] = serde_json::json!(exit_code(st));
        // The components' own counters are the admin's to read.
        if let Some((gm, pcomp)) = &gm {
            let pstats = cluster::component_stats(&pcomp.addr).unwrap_or_default();
            s["pcomponent"] = pstats["excache"].clone();
            // The pComponent's, not the run's: every run on it adds to them.
            s["one_sided"] = pstats["one_sided"].clone();
            s["idle_poll"] = pstats["idle_poll"].clone();
            s["mcomponents"] = components_stats(gm, splitos_rpc::Role::Mem);
            s["scomponents"] = components_stats(gm, splitos_rpc::Role::Storage);
        }
        std::fs::write(f, serde_json::to_string_pretty(&s)?)?;
    }
    Ok((exit_code(st), secs, stats, run_id))
}

/// Each mComponent's or sComponent's own statistics (`C2X_STATS`: fetches, flushes,
/// piggybacked, pages owned per process, ...; requests on files passed to the sComponent that
/// has the storage directory open), read when the program has ended and before an embedded
/// cluster stops, so that a run's record shows the work the memory and storage sides did.
/// Counters are since the component started: on an embedded cluster that is this run. One that
/// cannot be asked is listed with the reason.
fn components_stats(gm: &str, role: splitos_rpc::Role) -> serde_json::Value {
    let comps = match cluster::status(gm) {
        Ok(c) => c,
        Err(e) => return serde_json::json!([{ "error": e.to_string() }]),
    };
    comps
        .iter()
        .filter(|c| c.role == role)
        .map(|c| match cluster::component_stats(&c.addr) {
            Ok(v) => v,
            Err(e) => serde_json::json!({ "role": role.name(), "id": c.id, "addr": c.addr, "alive": c.alive, "error": e.to_string() }),
        })
        .collect()
}

/// Other vNodes' file systems are mounted on the same pComponent, next to this one: a program
/// could reach them with `..`. As root, the program gets a private mount namespace without
/// them. Without the privilege the mounts stay visible (see docs/storage.md).
fn isolate_vnode(cmd: &mut Command, mine: &Path) {
    // SAFETY: geteuid takes nothing and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    let Some(root) = mine.parent() else { return };
    let others: Vec<std::ffi::CString> = crate::sys::mounts_under(root)
        .into_iter()
        .filter(|m| m != mine)
        .filter_map(|m| std::ffi::CString::new(m.into_os_string().into_encoded_bytes()).ok())
        .collect();
    // SAFETY: only async-signal-safe system calls on memory prepared before fork (the C strings
    // in `others`), and errno read into an io::Error, which does not allocate.
    unsafe {
        cmd.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Keep unmounts below from reaching the pComponent's namespace.
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            for m in &others {
                // A mount left in place would show the program another vNode's files. EINVAL or
                // ENOENT: it was unmounted since the list was taken, so nothing is visible there.
                if libc::umount2(m.as_ptr(), libc::MNT_DETACH) != 0
                    && !matches!(
                        std::io::Error::last_os_error().raw_os_error(),
                        Some(libc::EINVAL | libc::ENOENT)
                    )
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    };
}

/// Options of an embedded cluster given for a running one, which keeps its configuration: those
/// of its memory are an error, the others a note naming them ([`crate::config::OnRun`]).
fn not_for_a_running_cluster(e: &Embedded) -> anyhow::Result<()> {
    match e.for_a_running_cluster() {
        Err(refused) => anyhow::bail!(
            "{} configure(s) the memory of an embedded cluster (its mComponents and global managers), and this run goes to a running cluster, which has its own: pass --embedded to run on a cluster of this command's own, or leave them out",
            refused.join(", ")
        ),
        Ok(noted) if !noted.is_empty() => {
            crate::errln!("splitos: note: ignored: {} (options of an embedded cluster: the running cluster keeps its configuration; --embedded runs on a cluster of this command's own)", noted.join(", "));
            Ok(())
        }
        Ok(_) => Ok(()),
    }
}

/// One line when a quarter or more of the run went to ExCache misses that fetched back pages it
/// had already had (capacity misses: the ExCache is smaller than what the program keeps using),
/// from the run's own counters; `None` otherwise. The size it suggests holds the pages of the
/// run's processes alive at once, as the pComponent counted them: processes that ran one after
/// another do not add up.
fn excache_hint(stats: &serde_json::Value, secs: f64) -> Option<String> {
    let n = |k: &str| stats.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let misses = n("misses");
    // Misses for pages a process had already had and the ExCache evicted (counted where
    // the line is claimed again) took a good part of the run: the ExCache is what the run
    // waited for. Not all misses: a forked child's first touches of its parent's pages are
    // misses at any size, and a script that starts hundreds of processes makes many.
    // Lines read ahead or faulted around with a miss are claimed again too: at most one a miss
    // is the program's wait.
    let refetched = n("pages_again").min(misses);
    let again = refetched as f64 * n("miss_ns_mean") as f64 / 1e9;
    if secs <= 0.0 || again < secs / 4.0 {
        return None;
    }
    let pages = n("pages_peak").max(1);
    // A quarter more than the pages: lines go to sets of a few ways, and a set that fills
    // evicts while others have room (a fork-heavy script missed as often at 6M as at 4M
    // for 5.6 MB of pages, and ran as fast at 8M as at 64M).
    let fits = fitting(pages * splitos_rpc::PAGE_SIZE as u64 * 5 / 4);
    let (evicted, by_others) = (n("evictions"), n("evicted_by_others"));
    let (rate, share) = (misses as f64 / secs, (100.0 * again / secs).min(100.0));
    // Alone in the ExCache a program evicts only its own lines: when others' misses took a
    // good part of them, its size is not the whole story.
    if by_others > 0 && by_others * 4 >= evicted {
        return Some(format!(
            "the ExCache is too small for the programs sharing it: {misses} misses ({rate:.0}/s), the {refetched} of them for pages it had already had took about {share:.0}% of the run; other programs' misses evicted {by_others} of its lines ({:.0}% of its evictions); its processes had {pages} pages at most at once, which an ExCache of {fits} would hold for it alone (a larger ExCache, or fewer programs at once; --quiet drops this hint)",
            100.0 * by_others as f64 / evicted as f64
        ));
    }
    Some(format!(
        "the ExCache is too small for this program: {misses} misses ({rate:.0}/s), the {refetched} of them for pages it had already had took about {share:.0}% of the run; its processes had {pages} pages at most at once, which an ExCache of {fits} would hold (--excache; --quiet drops this hint)"
    ))
}

/// The ExCache to suggest for `bytes`: rounded up to a sixteenth of its power of two (at
/// least 1M), so that it is a size a person types and never twice what is needed.
fn fitting(bytes: u64) -> Size {
    let step = (bytes.next_power_of_two() / 16).max(1 << 20);
    Size(bytes.div_ceil(step) * step)
}

/// Every process of this run (the program and whatever it forked or executed).
fn processes_of_run(run_id: u64) -> Vec<i32> {
    let needle = format!("{ENV_RUN_ID}={run_id}");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
        })
        .collect()
}

/// Kills every process of the run (SIGKILL); returns how many there were. One that cannot be
/// stopped (anything but ESRCH: it ended meanwhile) would hang on memory no one serves: say so.
fn stop_processes_of_run(run_id: u64) -> usize {
    let pids = processes_of_run(run_id);
    for pid in &pids {
        // SAFETY: kill takes no pointers; signalling another process cannot affect our memory.
        if unsafe { libc::kill(*pid, libc::SIGKILL) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ESRCH) {
                crate::errln!("splitos: warning: cannot stop process {pid} of the run: {e}");
            }
        }
    }
    pids.len()
}

/// The program's heap is served by its pComponent: if that component goes away, the
/// program's faults can never be served. Stops every process of the run with a message naming
/// the component instead of leaving them hung, and says why; `None` once `stop` is written.
fn watch_pcomponent(l: &Launcher, pcomp: &str, stop: &std::os::unix::net::UnixStream, run_id: u64) -> Option<String> {
    if !l.wait_lost(stop) {
        return None;
    }
    stop_processes_of_run(run_id);
    Some(format!(
        "{pcomp} went away; its programs' memory cannot be served, so they were stopped"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suggested_excache_holds_the_pages_and_is_never_twice_them() {
        for (bytes, want) in [
            (1, 1 << 20),
            (81 << 20, 88 << 20),
            (130 << 20, 144 << 20),
            (256 << 20, 256 << 20),
            ((256 << 20) + 1, 288 << 20),
        ] {
            let got = fitting(bytes).0;
            assert_eq!(got, want, "{bytes}");
            assert!(got >= bytes && (got < 2 * bytes || got == 1 << 20), "{bytes}");
        }
    }
}
