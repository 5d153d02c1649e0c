//! Shared helpers of the end-to-end tests: the real splitos binary, real component processes,
//! real programs compiled from tests/programs, compared with native runs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Says that the running test cannot run on this machine, and so passes without testing:
/// the caller returns right after. Written past the harness's capture of test output (which
/// hides a passing test's `eprintln!`), so that the skip shows in every run.
pub fn skip(reason: &str) {
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {reason}");
}

pub fn splitos() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_splitos"))
}

pub fn programs_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs")
}

/// The path of a script in tests/programs (Python, shell).
pub fn script(name: &str) -> String {
    programs_src().join(name).to_string_lossy().into_owned()
}

/// Builds tests/programs/<name>.c (or .cpp) once per test binary; returns the executable.
pub fn program(name: &str) -> PathBuf {
    // One shared directory, binaries named by their source's hash: test runs reuse them and
    // leave nothing new behind.
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let d = std::env::temp_dir().join("splitos-test-programs");
        std::fs::create_dir_all(&d).unwrap();
        d
    });
    static BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let (src, cc, extra): (PathBuf, &str, &[&str]) = if name == "static_hello" {
        (programs_src().join("static_hello.c"), "gcc", &["-static"])
    } else if name.starts_with("jemalloc") {
        // Linked with the system's jemalloc, as Debian's redis-server is.
        (
            programs_src().join(format!("{name}.c")),
            "gcc",
            &["-pthread", "-ljemalloc"],
        )
    } else if programs_src().join(format!("{name}.cpp")).exists() {
        (programs_src().join(format!("{name}.cpp")), "g++", &[])
    } else {
        (programs_src().join(format!("{name}.c")), "gcc", &["-pthread", "-lm"])
    };
    let code = std::fs::read(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    let hash = code.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    let out = dir.join(format!("{name}-{hash:016x}"));
    if out.exists() {
        return out;
    }
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let st = Command::new(cc)
        .args(["-O2", "-o"])
        .arg(&tmp)
        .arg(&src)
        .args(extra)
        .status()
        .expect("compiler runs");
    assert!(st.success(), "compiling {}", src.display());
    std::fs::rename(&tmp, &out).unwrap();
    out
}

pub fn native(cmd: &[&str]) -> Output {
    Command::new(cmd[0]).args(&cmd[1..]).output().expect("native run")
}

/// `splitos run [opts] -- cmd...` on an embedded cluster (unless opts name another).
pub fn under_splitos(opts: &[&str], cmd: &[&str]) -> Output {
    under_splitos_env(opts, cmd, &[])
}

/// As [`under_splitos`], with extra environment for splitos and its components.
pub fn under_splitos_env(opts: &[&str], cmd: &[&str], env: &[(&str, &str)]) -> Output {
    // Each run's embedded sComponent gets its own storage directory: runs of parallel tests
    // would otherwise contend for the default one.
    let data = tempfile::Builder::new().prefix("splitos-test-data-").tempdir().unwrap();
    Command::new(splitos())
        .arg("run")
        .args(opts)
        .arg("--")
        .args(cmd)
        .env_remove("SPLITOS_GM")
        .env(
            "SPLITOS_STATE_DIR",
            std::env::temp_dir().join("splitos-test-no-cluster"),
        )
        .env("SPLITOS_DATA_DIR", data.path())
        .envs(env.iter().copied())
        .output()
        .expect("splitos run")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// Runs `cmd` natively and under splitos; asserts identical stdout, stderr and exit status.
/// splitos' own hint about the ExCache's size (tested in cli.rs) is not the program's stderr.
pub fn same_as_native(opts: &[&str], cmd: &[&str]) -> Output {
    let n = native(cmd);
    let s = under_splitos(&[opts, &["--quiet"]].concat(), cmd);
    assert_eq!(
        text(&s.stdout),
        text(&n.stdout),
        "stdout differs for {cmd:?}; splitos stderr:\n{}",
        text(&s.stderr)
    );
    assert_eq!(text(&s.stderr), text(&n.stderr), "stderr differs for {cmd:?}");
    assert_eq!(s.status.code(), n.status.code(), "exit status differs for {cmd:?}");
    s
}

/// The interpreter that `python3` on PATH runs. PATH may hold a wrapper script instead (a
/// version manager's shim, which forks and execs helpers): tests that count the program images
/// a run served start the interpreter itself.
pub fn python3() -> String {
    static PY: OnceLock<String> = OnceLock::new();
    PY.get_or_init(|| {
        let out = native(&["python3", "-c", "import sys; print(sys.executable)"]);
        assert!(out.status.success(), "python3 runs: {}", text(&out.stderr));
        text(&out.stdout).trim().to_string()
    })
    .clone()
}

/// Runs `cmd` natively and under splitos with `--stats-json`; asserts identical stdout, stderr
/// and exit status; returns the run's counters.
pub fn same_as_native_with_stats(opts: &[&str], cmd: &[&str]) -> (Output, serde_json::Value) {
    let f = tempfile::NamedTempFile::new().unwrap();
    let path = f.path().to_str().unwrap().to_string();
    let mut o: Vec<&str> = opts.to_vec();
    o.extend(["--stats-json", &path, "--quiet"]);
    let n = native(cmd);
    let s = under_splitos(&o, cmd);
    assert_eq!(
        text(&s.stdout),
        text(&n.stdout),
        "stdout differs for {cmd:?}; splitos stderr:\n{}",
        text(&s.stderr)
    );
    assert_eq!(text(&s.stderr), text(&n.stderr), "stderr differs for {cmd:?}");
    assert_eq!(s.status.code(), n.status.code(), "exit status differs for {cmd:?}");
    let v = serde_json::from_str(&std::fs::read_to_string(f.path()).unwrap()).unwrap();
    (s, v)
}

/// As [`same_as_native_with_stats`], and the run must show that the program's memory went
/// through the components (see [`assert_through_components`]) in exactly `images` program
/// images (the program, each forked child and each exec'd image).
pub fn through_components(opts: &[&str], cmd: &[&str], images: u64) -> (Output, serde_json::Value) {
    let (out, s) = same_as_native_with_stats(opts, cmd);
    assert_through_components(&s, images);
    (out, s)
}

/// The sum of one counter over the mComponents' own statistics in a run's `--stats-json`
/// (its `mcomponents` list).
pub fn mcomp_sum(s: &serde_json::Value, k: &str) -> u64 {
    let ms = s["mcomponents"]
        .as_array()
        .unwrap_or_else(|| panic!("--stats-json lacks the mcomponents list: {s}"));
    assert!(!ms.is_empty(), "no mComponent in {s}");
    ms.iter()
        .map(|m| {
            m[k].as_u64()
                .unwrap_or_else(|| panic!("mComponent counter {k} missing in {m}"))
        })
        .sum()
}

/// Pages the mComponents served to a run: their own fetches, and the pages the pComponent
/// copied out of their segments (one-sided access, which they leased but do not count one by
/// one).
pub fn pages_served(s: &serde_json::Value) -> u64 {
    mcomp_sum(s, "fetches") + n(&s["one_sided"], "reads")
}

/// Pages the mComponents stored for a run: their own count, and the pages copied into their
/// segments.
pub fn pages_stored(s: &serde_json::Value) -> u64 {
    mcomp_sum(s, "flushes") + n(&s["one_sided"], "writes")
}

/// Asserts what a run's counters show when its heap really lived behind the ExCache: the
/// pComponent served misses and evicted and flushed lines; the mComponents (their own
/// counters, not the pComponent's) served at least every fetch the pComponent counted and
/// stored flushed pages; every one of the `images` program images reached the pComponent
/// (an image that lost the shim would run natively and not be counted); no errors.
pub fn assert_through_components(s: &serde_json::Value, images: u64) {
    assert_eq!(
        n(s, "processes"),
        images,
        "program images served by the pComponent: {s}"
    );
    assert!(
        n(s, "misses") > 0 && n(s, "evictions") > 0 && n(s, "flushes") > 0,
        "the ExCache must miss, evict and flush: {s}"
    );
    let remote_fills = n(s, "bytes_fetched") / 4096;
    assert!(remote_fills > 0, "some misses fetch a page flushed earlier: {s}");
    // Pages copied from an owner's segment (one-sided access) the owner never sees one by
    // one: it leased the segment, and counted the lease and the memfd it handed out.
    let (copied_in, copied_out) = (n(&s["one_sided"], "reads"), n(&s["one_sided"], "writes"));
    if copied_in + copied_out > 0 {
        let leases: u64 = s["mcomponents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["leases"].as_u64().unwrap() + m["lease_handouts"].as_u64().unwrap())
            .sum();
        assert!(
            leases >= 2,
            "pages were copied from owners' segments that no owner leased: {s}"
        );
    }
    let (fetches, flushes) = (pages_served(s), pages_stored(s));
    assert!(fetches >= remote_fills, "mComponents served {fetches} fetches (one-sided reads included) for the pComponent's {remote_fills} remote fills: {s}");
    assert!(flushes > 0, "mComponents stored flushed pages: {s}");
    if images == 1 {
        // With one process no victim can belong to a process that exited meanwhile: every
        // write-back the pComponent counted was stored by an mComponent. (It can store one
        // more than the pComponent counted: a miss cut short by the program's exit.)
        assert!(
            flushes >= n(s, "flushes"),
            "mComponents stored {flushes} of the pComponent's {} write-backs: {s}",
            n(s, "flushes")
        );
    }
    assert_eq!(s["errors"].as_array().map(|e| e.len()), Some(0), "{s}");
}

/// Runs `cmd` under splitos with `--stats-json`; asserts native output; returns the counters.
pub fn stats_of(opts: &[&str], cmd: &[&str]) -> (Output, serde_json::Value) {
    let f = tempfile::NamedTempFile::new().unwrap();
    let mut o: Vec<&str> = opts.to_vec();
    let path = f.path().to_str().unwrap().to_string();
    o.extend(["--stats-json", &path]);
    let n = native(cmd);
    let out = under_splitos(&o, cmd);
    assert_eq!(
        text(&out.stdout),
        text(&n.stdout),
        "stdout differs for {cmd:?}; stderr:\n{}",
        text(&out.stderr)
    );
    assert_eq!(out.status.code(), n.status.code());
    let v = serde_json::from_str(&std::fs::read_to_string(f.path()).unwrap()).unwrap();
    (out, v)
}

pub fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("counter {k} missing in {v}"))
}

/// A long-lived cluster (`splitos cluster up`) in a private state directory, stopped (its
/// processes killed by PID) when dropped, also when the test fails.
pub struct TestCluster {
    pub dir: tempfile::TempDir,
}

impl TestCluster {
    pub fn up(config: Option<&str>) -> TestCluster {
        TestCluster::up_in(TestCluster::state_dir(), config)
    }

    /// A state directory for [`TestCluster::up_in`], where certificates for what the cluster
    /// relies on (etcd) can be issued before it starts.
    pub fn state_dir() -> tempfile::TempDir {
        tempfile::Builder::new().prefix("splitos-cluster-").tempdir().unwrap()
    }

    pub fn up_in(dir: tempfile::TempDir, config: Option<&str>) -> TestCluster {
        let mut cmd = Command::new(splitos());
        cmd.args(["cluster", "up"])
            .env("SPLITOS_STATE_DIR", dir.path())
            .env("SPLITOS_DATA_DIR", dir.path().join("data"));
        if let Some(c) = config {
            let p = dir.path().join("cluster.toml");
            std::fs::write(&p, c).unwrap();
            cmd.arg("--config").arg(p);
        }
        let out = cmd.output().unwrap();
        // What `cluster up` said on stderr, for tests of what people read.
        std::fs::write(dir.path().join("up.stderr"), &out.stderr).unwrap();
        let c = TestCluster { dir };
        assert!(out.status.success(), "cluster up: {}", text(&out.stderr));
        c
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(splitos());
        c.args(args)
            .env("SPLITOS_STATE_DIR", self.dir.path())
            .env("SPLITOS_DATA_DIR", self.dir.path().join("data"))
            .env_remove("SPLITOS_GM");
        c
    }

    pub fn run(&self, opts: &[&str], prog: &[&str]) -> Output {
        let mut c = self.cmd(&["run"]);
        c.args(opts).arg("--").args(prog);
        c.output().unwrap()
    }

    /// Runs `cmd` on the cluster with `--stats-json`; asserts native output; returns the run's
    /// counters.
    pub fn run_stats(&self, cmd: &[&str]) -> serde_json::Value {
        let f = self.dir.path().join("run-stats.json");
        let out = self.run(&["--stats-json", f.to_str().unwrap()], cmd);
        assert_eq!(text(&out.stdout), text(&native(cmd).stdout), "{}", text(&out.stderr));
        serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap()
    }

    pub fn status(&self) -> serde_json::Value {
        let out = self.cmd(&["cluster", "status", "--json"]).output().unwrap();
        assert!(out.status.success(), "status: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The components of `role` as the status shows them at once, a live one without `stats`
    /// if it did not answer within the status's 5 s (one paused on purpose, say).
    pub fn components_now(&self, role: &str) -> Vec<serde_json::Value> {
        self.status()["components"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["role"] == role)
            .cloned()
            .collect()
    }

    /// The components of `role` once every live one answered with its statistics: a busy
    /// component may let the status's 5 s pass without them, so this asks again for up to 10 s
    /// (one just killed counts as live until the managers miss its heartbeats).
    pub fn components(&self, role: &str) -> Vec<serde_json::Value> {
        let t0 = Instant::now();
        loop {
            let all = self.components_now(role);
            if all.iter().all(|c| c["alive"] != true || !c["stats"].is_null()) || t0.elapsed() > Duration::from_secs(10)
            {
                return all;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The process that `child` (a `splitos run`) started, as its pComponent's statistics
    /// show it: found by its parent, not by its place in the list, which may still hold a
    /// process that ended a moment ago.
    pub fn process_of(&self, child: &std::process::Child) -> serde_json::Value {
        let run = child.id() as i64;
        let parent = |os_pid: i64| {
            std::fs::read_to_string(format!("/proc/{os_pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit(')').next()?.split_whitespace().nth(1)?.parse::<i64>().ok())
        };
        let t0 = Instant::now();
        loop {
            let found = self.components("pcomponent")[0]["stats"]["processes"]
                .as_array()
                .and_then(|ps| {
                    ps.iter()
                        .find(|p| p["os_pid"].as_i64().is_some_and(|o| o == run || parent(o) == Some(run)))
                        .cloned()
                });
            match found {
                Some(p) => return p,
                None if t0.elapsed() > Duration::from_secs(30) => panic!("no process of `splitos run` {run} in 30 s"),
                None => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    pub fn state_pids(&self) -> Vec<i32> {
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.dir.path().join("cluster.json")).unwrap()).unwrap();
        s["pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_i64().unwrap() as i32)
            .collect()
    }

    /// The PID of the cluster's component process listening on `addr` (as `cluster status`
    /// shows it).
    pub fn pid_of_addr(&self, addr: &str) -> i32 {
        let pids = self.state_pids();
        pid_listening_on(addr, &pids).unwrap_or_else(|| panic!("no component process of {pids:?} listens on {addr}"))
    }

    /// Kills a component with SIGKILL, taking it out of the cluster's PID record first (see
    /// [`forget_pid`]); returns once the process is gone.
    pub fn kill_component(&self, pid: i32) {
        forget_pid(self.dir.path(), pid);
        // SAFETY: kill(2) takes no pointers; `pid` is a component of this test's own cluster,
        // now out of its record so that nothing signals the number again.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let gone = self.eventually(Duration::from_secs(5), |_| !pid_running(pid));
        assert!(gone, "component {pid} still runs 5 s after SIGKILL");
    }

    /// One counter of the component at `addr` from `splitos cluster metrics` (Prometheus text;
    /// summed over label sets; 0 when the component never counted it).
    /// A metric of the component at `addr`, summed over its labels. A component too busy to
    /// answer the scrape in time is asked again, for up to 30 s.
    pub fn metric(&self, addr: &str, name: &str) -> f64 {
        let t0 = Instant::now();
        loop {
            let out = self.cmd(&["cluster", "metrics"]).output().unwrap();
            assert!(out.status.success(), "cluster metrics: {}", text(&out.stderr));
            let all = text(&out.stdout);
            if has_metrics_of(&all, addr) || t0.elapsed() > Duration::from_secs(30) {
                return metric_of(&all, addr, name);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until `f` holds or the timeout passes; returns whether it held.
    pub fn eventually(&self, timeout: Duration, mut f: impl FnMut(&TestCluster) -> bool) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if f(self) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// Credentials of `role` issued by the cluster's authority, for a component (or a client)
    /// the test starts by hand.
    pub fn issue(&self, role: &str) -> std::path::PathBuf {
        let f = self.dir.path().join(format!(
            "issued-{role}-{}.cred",
            ISSUED.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let out = self
            .cmd(&["cluster", "credentials", "--role", role, "--out", f.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "cluster credentials: {}", text(&out.stderr));
        f
    }

    /// A client holding the cluster's admin credentials, as the admin's tools do.
    pub fn admin_rpc(&self) -> splitos_rpc::Rpc {
        let creds = splitos_rpc::auth::Credentials::load(&self.dir.path().join("admin.cred")).unwrap();
        splitos_rpc::Rpc::new(
            splitos_rpc::TransportConfig::default()
                .build(Some(std::sync::Arc::new(creds)))
                .unwrap(),
            Duration::from_secs(5),
        )
    }

    pub fn spawn(&self, opts: &[&str], prog: &[&str]) -> std::process::Child {
        let mut c = self.cmd(&["run"]);
        c.args(opts)
            .arg("--")
            .args(prog)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    }
}

/// Two `hold 24` programs, one on each of the cluster's two pComponents (named by their
/// program sockets), both ready: (the one on the first, the one on the second, their process
/// ids).
pub fn hold_on_both_pcomponents(c: &TestCluster) -> (std::process::Child, std::process::Child, u64, u64) {
    let hold = program("hold");
    let sock = |i: usize| {
        c.dir
            .path()
            .join(format!("programs/proc{i}.sock"))
            .to_str()
            .unwrap()
            .to_string()
    };
    let mut first = c.spawn(&["--pcomponent", &sock(0)], &[hold.to_str().unwrap(), "24"]);
    let mut second = c.spawn(&["--pcomponent", &sock(1)], &[hold.to_str().unwrap(), "24"]);
    assert_eq!(read_line(&mut first), "ready\n");
    assert_eq!(read_line(&mut second), "ready\n");
    let pid_on = |i: usize| {
        c.components("pcomponent")
            .into_iter()
            .find(|p| p["shim_sock"] == sock(i))
            .unwrap()["stats"]["processes"][0]["pid"]
            .as_u64()
            .unwrap()
    };
    (first, second, pid_on(0), pid_on(1))
}

/// How many mComponents hold pages or mappings of process `pid` (their own statistics).
pub fn mcomponents_holding(c: &TestCluster, pid: u64) -> usize {
    c.components("mcomponent")
        .iter()
        .filter(|m| {
            m["stats"]["owned_processes"]
                .as_array()
                .is_some_and(|o| o.iter().any(|p| p["pid"] == pid))
        })
        .count()
}

/// Asserts that a `hold 24` program read its heap back and printed what it prints natively.
pub fn assert_hold_ends_native(mut child: std::process::Child) {
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let hold = program("hold");
    assert_eq!(
        format!("ready\n{}", text(&out.stdout)),
        text(&native(&[hold.to_str().unwrap(), "24"]).stdout),
        "{}",
        text(&out.stderr)
    );
}

static ISSUED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Copies the logs of a failed test's cluster to target/tmp/failed/<test>/, which the test
/// runner names in its report: the cluster's directory goes with the test, and a failure seen
/// once under load is explained by its components' logs or not at all.
fn keep_logs(dir: &std::path::Path) {
    let test = std::thread::current().name().unwrap_or("test").replace("::", "-");
    let to = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("failed")
        .join(test);
    let logs = std::fs::read_dir(dir).into_iter().flatten().flatten();
    let logs: Vec<_> = logs
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .collect();
    if !logs.is_empty() && std::fs::create_dir_all(&to).is_ok() {
        for e in logs {
            let _ = std::fs::copy(e.path(), to.join(e.file_name()));
        }
        eprintln!("the cluster's logs: {}", to.display());
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let pids = std::fs::read_to_string(self.dir.path().join("cluster.json"))
            .ok()
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
        let _ = self.cmd(&["cluster", "down", "--force"]).output();
        if std::thread::panicking() {
            keep_logs(self.dir.path());
        }
        // Whatever `cluster down` left running, if it is still a splitos process (a PID of a
        // component that ended may belong to another process by now).
        let exe = std::fs::canonicalize(splitos()).unwrap_or_else(|_| splitos());
        if let Some(v) = pids {
            for p in v["pids"].as_array().into_iter().flatten().filter_map(|p| p.as_i64()) {
                let ours = std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == exe);
                if ours {
                    // SAFETY: kill(2) takes no pointers; the PID runs the splitos binary of
                    // this test's cluster.
                    unsafe { libc::kill(p as i32, libc::SIGKILL) };
                }
            }
        }
        unmount_under(self.dir.path());
        // `cluster up` locks a file beside the state directory, outside the temporary one.
        if let Some(name) = self.dir.path().file_name() {
            let _ = std::fs::remove_file(
                self.dir
                    .path()
                    .with_file_name(format!("{}.lock", name.to_string_lossy())),
            );
        }
    }
}

/// Takes `pid` out of the PID record (`pids` in cluster.json) of the cluster whose state is in
/// `state_dir`. A test that kills a component calls this first, so that stopping the cluster
/// later never signals whatever process has reused the PID by then.
pub fn forget_pid(state_dir: &Path, pid: i32) {
    let f = state_dir.join("cluster.json");
    let mut s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    let pids = s["pids"]
        .as_array_mut()
        .unwrap_or_else(|| panic!("no pids in {}", f.display()));
    let before = pids.len();
    pids.retain(|p| p.as_i64() != Some(pid as i64));
    assert_eq!(pids.len() + 1, before, "{pid} is in the cluster's PID record once");
    std::fs::write(&f, serde_json::to_string_pretty(&s).unwrap()).unwrap();
}

/// Adds `pid` to the cluster's PID record, so that stopping the cluster stops it too.
pub fn remember_pid(state_dir: &Path, pid: i32) {
    let f = state_dir.join("cluster.json");
    let mut s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    s["pids"]
        .as_array_mut()
        .unwrap_or_else(|| panic!("no pids in {}", f.display()))
        .push(pid.into());
    std::fs::write(&f, serde_json::to_string_pretty(&s).unwrap()).unwrap();
}

/// Whether `pid` is a running (not zombie) process.
pub fn pid_running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // A killed process's first thread may be a zombie while its other threads still exit,
        // holding its descriptors (a manager's port, which a restart then cannot take).
        Ok(s) => {
            !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z')
                || std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|t| t.count() > 1)
        }
        Err(_) => false,
    }
}

/// Which of `pids` has a listening TCP socket on `addr`'s port (from each process's own
/// /proc/PID/net/tcp{,6}, which are of its network namespace, and its file descriptors).
pub fn pid_listening_on(addr: &str, pids: &[i32]) -> Option<i32> {
    let port: u16 = addr.rsplit(':').next()?.parse().ok()?;
    // Hosts in namespaces may each have a component at one port: the address tells them
    // apart (an IPv4 one as /proc/net/tcp prints it, its bytes in this machine's order).
    let ip = addr
        .rsplit_once(':')
        .and_then(|(h, _)| h.parse::<std::net::Ipv4Addr>().ok())
        .filter(|ip| !ip.is_unspecified());
    let ours = |hex: &str| {
        ip.is_none_or(|ip| {
            u32::from_str_radix(hex, 16).is_ok_and(|v| {
                [ip, std::net::Ipv4Addr::UNSPECIFIED].contains(&std::net::Ipv4Addr::from(v.to_le_bytes()))
            })
        })
    };
    pids.iter().copied().find(|pid| {
        let mut inodes = Vec::new();
        for table in ["tcp", "tcp6"] {
            for l in std::fs::read_to_string(format!("/proc/{pid}/net/{table}"))
                .unwrap_or_default()
                .lines()
                .skip(1)
            {
                let f: Vec<&str> = l.split_whitespace().collect();
                // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
                let listening = f.get(3) == Some(&"0A");
                let local = f.get(1).and_then(|a| a.rsplit_once(':'));
                let p = local.and_then(|(_, h)| u16::from_str_radix(h, 16).ok());
                if listening && p == Some(port) && (table == "tcp6" || local.is_some_and(|(h, _)| ours(h))) {
                    inodes.push(format!("socket:[{}]", f[9]));
                }
            }
        }
        !inodes.is_empty()
            && std::fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|t| inodes.iter().any(|i| t.as_os_str() == i.as_str()))
                })
    })
}

/// How many threads of `pid` have a name (comm) starting with `prefix`.
pub fn threads_named(pid: i32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap_or_else(|e| panic!("threads of {pid}: {e}"))
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix)))
        .count()
}

/// Detaches every mount under `dir` (vNode mounts a killed pComponent left), so that removing
/// the directory never walks into one.
pub fn unmount_under(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for m in info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
    {
        let c = std::ffi::CString::new(m).unwrap();
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Reads one line from a child's stdout.
pub fn read_line(child: &mut std::process::Child) -> String {
    use std::io::BufRead;
    let mut r = std::io::BufReader::new(child.stdout.as_mut().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    line
}

/// Runs `forktest 12` (a parent and a forked child checking each other's pages) on a cluster
/// whose pComponent has `pcomp` in its table and a 4 MiB ExCache, and checks its output against
/// a native run. Returns the cluster and its pComponent's address, for its counters.
pub fn forktest_on(pcomp: &str) -> (TestCluster, String) {
    let c = TestCluster::up(Some(&format!(
        "[[pcomponent]]\nexcache = \"4M\"\n{pcomp}\n[[mcomponent]]\n"
    )));
    let fork = program("forktest");
    let cmd = [fork.to_str().unwrap(), "12"];
    let native = native(&cmd);
    let out = c.run(&[], &cmd);
    assert_eq!(
        text(&out.stdout),
        text(&native.stdout),
        "stderr:\n{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("child sum=same changed=yes") && text(&out.stdout).contains("intact"),
        "{}",
        text(&out.stdout)
    );
    let addr = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    (c, addr)
}

/// A CPython script that maps, unmaps and purges its arenas and forks, printing what both
/// processes counted.
pub const PY_COUNTER_FORK: &str = "import collections, os, sys\n\
    words = [str(i * 7919 % 100003) for i in range(300000)]\n\
    c = collections.Counter(words)\n\
    pid = os.fork()\n\
    if pid == 0:\n    c['child'] += 1\n    print('child', len(c), sum(c.values()))\n    sys.stdout.flush()\n    os._exit(0)\n\
    os.waitpid(pid, 0)\n\
    print('parent', len(c), sum(c.values()), c.most_common(3))\n";

/// Hosts on one machine: a network namespace each, linked by veth pairs to a bridge that
/// this test made, with addresses of a /24 of their own. The test's own namespace gets the
/// subnet's .254 on the bridge, so that the admin's tools reach the components; no namespace
/// has a default route, so nothing leaves the machine. Dropped (also when the test fails),
/// it deletes the namespaces, which ends the links, and the bridge.
pub struct Hosts {
    tag: String,
    subnet: u8,
    names: Vec<String>,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {}: {}", args.join(" "), text(&out.stderr));
}

impl Hosts {
    pub fn new(names: &[&str]) -> Hosts {
        static NEXT: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
        // Tests run at once, in one process and in many: each set gets its own names and a
        // subnet no other set holds.
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let subnet = claim_subnet();
        let tag = format!("sp{}x{n}", std::process::id() % 100000);
        let h = Hosts {
            tag: tag.clone(),
            subnet,
            names: names.iter().map(|s| s.to_string()).collect(),
        };
        let br = format!("{tag}br");
        ip(&["link", "add", &br, "type", "bridge"]);
        ip(&["addr", "add", &format!("10.201.{subnet}.254/24"), "dev", &br]);
        ip(&["link", "set", &br, "up"]);
        for (i, name) in names.iter().enumerate() {
            let ns = h.netns(name);
            ip(&["netns", "add", &ns]);
            let (outer, inner) = (format!("{tag}o{i}"), format!("{tag}i{i}"));
            ip(&["link", "add", &outer, "type", "veth", "peer", "name", &inner]);
            ip(&["link", "set", &inner, "netns", &ns]);
            ip(&["link", "set", &outer, "master", &br, "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("{}/24", h.addr(name)), "dev", &inner]);
            ip(&["-n", &ns, "link", "set", &inner, "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        h
    }

    fn index(&self, name: &str) -> usize {
        self.names
            .iter()
            .position(|n| n == name)
            .unwrap_or_else(|| panic!("no host {name}"))
    }

    /// The network namespace of host `name`.
    pub fn netns(&self, name: &str) -> String {
        format!("{}-{name}", self.tag)
    }

    pub fn addr(&self, name: &str) -> String {
        format!("10.201.{}.{}", self.subnet, self.index(name) + 1)
    }

    /// The address of this machine itself on the hosts' bridge (the test's own namespace).
    pub fn bridge_addr(&self) -> String {
        format!("10.201.{}.254", self.subnet)
    }

    /// Adds host `out`, the world outside the rack: linked only to host `via`, by a link of a
    /// subnet of its own, so that no other host has a route to it. Returns the addresses of
    /// `via` and of `out` on that link.
    pub fn add_outside(&mut self, via: &str) -> (String, String) {
        let (ns_via, ns_out) = (self.netns(via), format!("{}-out", self.tag));
        ip(&["netns", "add", &ns_out]);
        self.names.push("out".into());
        let (a, b) = (format!("{}x{}", self.tag, self.index(via)), format!("{}y", self.tag));
        ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        ip(&["link", "set", &a, "netns", &ns_via]);
        ip(&["link", "set", &b, "netns", &ns_out]);
        let (via_ip, out_ip) = (format!("10.202.{}.1", self.subnet), format!("10.202.{}.2", self.subnet));
        ip(&["-n", &ns_via, "addr", "add", &format!("{via_ip}/24"), "dev", &a]);
        ip(&["-n", &ns_out, "addr", "add", &format!("{out_ip}/24"), "dev", &b]);
        for (ns, dev) in [(&ns_via, &a), (&ns_out, &b)] {
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        (via_ip, out_ip)
    }

    /// A command run in host `name`.
    pub fn exec(&self, name: &str, cmd: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns(name)]).args(cmd);
        c
    }

    /// Cuts (or restores) host `name`'s link to the others: a network partition.
    pub fn link(&self, name: &str, up: bool) {
        ip(&[
            "link",
            "set",
            &format!("{}o{}", self.tag, self.index(name)),
            if up { "up" } else { "down" },
        ]);
    }

    /// Parts hosts `a` and `b` from each other (or joins them again) while both reach every
    /// other host: each routes the other's address into a blackhole, a path lost between them.
    pub fn split(&self, a: &str, b: &str, on: bool) {
        for (from, to) in [(a, b), (b, a)] {
            let (ns, addr) = (self.netns(from), self.addr(to));
            ip(&["-n", &ns, "route", if on { "add" } else { "del" }, "blackhole", &addr]);
        }
    }

    /// The processes running in host `name`.
    pub fn pids(&self, name: &str) -> Vec<i32> {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.netns(name)])
            .output()
            .unwrap();
        text(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }
}

/// Deletes network namespace `ns` and the shared-memory rendezvous sockets its components
/// left (named after the namespace's inode): killed, they could not remove them, and once the
/// namespace is gone no sweep would know them for stale.
pub fn delete_netns(ns: &str) {
    use std::os::unix::fs::MetadataExt;
    if let Ok(m) = std::fs::metadata(format!("/run/netns/{ns}")) {
        let prefix = format!("{}-", m.ino());
        for e in std::fs::read_dir("/run/splitos").into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
}

const SUBNET_CLAIMS: &str = "/run/splitos-test-subnets";

/// Claims one of the subnets 10.201.1-250.0/24 for this process: a file named after it that
/// only one process can create, taken over when the process that made it is gone.
fn claim_subnet() -> u8 {
    std::fs::create_dir_all(SUBNET_CLAIMS).unwrap();
    let me = std::process::id();
    let start = (me % 250) as u8;
    for i in 0..250u8 {
        let subnet = 1 + (start.wrapping_add(i)) % 250;
        let path = format!("{SUBNET_CLAIMS}/{subnet}");
        let holder = std::fs::read_to_string(&path)
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok());
        if holder.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists()) {
            continue;
        }
        if holder.is_some() {
            let _ = std::fs::remove_file(&path);
        }
        if let Ok(mut f) = std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            use std::io::Write;
            write!(f, "{me}").unwrap();
            return subnet;
        }
    }
    panic!("every test subnet is taken ({SUBNET_CLAIMS})");
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for name in &self.names {
            for pid in self.pids(name) {
                // SAFETY: kill(2) takes no pointers; these are processes of this test's own host.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            delete_netns(&self.netns(name));
        }
        let _ = Command::new("ip")
            .args(["link", "del", &format!("{}br", self.tag)])
            .output();
        // Only now: a set given this subnet while the bridge was still here would have two
        // routes to it, and its hosts could not be reached.
        let _ = std::fs::remove_file(format!("{SUBNET_CLAIMS}/{}", self.subnet));
    }
}

/// An etcd cluster of one member per host of `hosts` (Debian's `etcd-server`), each member
/// in its host's namespace with its data under `dir`; dropped (also when the test fails), it
/// kills its members by PID.
pub struct EtcdCluster {
    members: Vec<std::process::Child>,
    /// The members' client URLs.
    pub endpoints: Vec<String>,
    /// Each member's certificate, key and the authority's certificate.
    pub tls: Vec<PathBuf>,
}

impl EtcdCluster {
    /// Members on `hosts`, serving and speaking to each other only over TLS with certificates
    /// of the cluster whose state directory is `state` (`splitos cluster etcd-cert`), and
    /// requiring a client certificate of it, as docs/deployment.md sets etcd up.
    pub fn start(h: &Hosts, hosts: &[&str], dir: &Path, state: &Path) -> EtcdCluster {
        let peers: Vec<String> = hosts
            .iter()
            .map(|n| format!("{n}=https://{}:2380", h.addr(n)))
            .collect();
        let mut e = EtcdCluster {
            members: Vec::new(),
            endpoints: hosts.iter().map(|n| format!("https://{}:2379", h.addr(n))).collect(),
            tls: Vec::new(),
        };
        for n in hosts {
            let (ip, data, tls) = (
                h.addr(n),
                dir.join(format!("etcd-{n}")),
                dir.join(format!("etcd-{n}-tls")),
            );
            let out = Command::new(splitos())
                .args(["cluster", "etcd-cert", "--ip", &ip, "--out", tls.to_str().unwrap()])
                .env("SPLITOS_STATE_DIR", state)
                .output()
                .unwrap();
            assert!(out.status.success(), "etcd-cert: {}", text(&out.stderr));
            let log = std::fs::File::create(dir.join(format!("etcd-{n}.log"))).unwrap();
            let (client, peer) = (format!("https://{ip}:2379"), format!("https://{ip}:2380"));
            let f = |name: &str| tls.join(name).to_str().unwrap().to_string();
            let (ca, cert, key) = (f("ca.pem"), f("etcd.pem"), f("etcd.key"));
            let child = h
                .exec(
                    n,
                    &[
                        "etcd",
                        "--name",
                        n,
                        "--data-dir",
                        data.to_str().unwrap(),
                        "--listen-client-urls",
                        &client,
                        "--advertise-client-urls",
                        &client,
                        "--listen-peer-urls",
                        &peer,
                        "--initial-advertise-peer-urls",
                        &peer,
                    ],
                )
                .args([
                    "--initial-cluster",
                    &peers.join(","),
                    "--initial-cluster-state",
                    "new",
                    "--initial-cluster-token",
                    &h.netns("etcd"),
                    "--auto-compaction-retention",
                    "1",
                ])
                .args([
                    "--client-cert-auth",
                    "--trusted-ca-file",
                    &ca,
                    "--cert-file",
                    &cert,
                    "--key-file",
                    &key,
                ])
                .args([
                    "--peer-client-cert-auth",
                    "--peer-trusted-ca-file",
                    &ca,
                    "--peer-cert-file",
                    &cert,
                    "--peer-key-file",
                    &key,
                ])
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            e.members.push(child);
            e.tls.push(tls);
        }
        let t0 = Instant::now();
        while !(0..e.endpoints.len()).all(|i| e.healthy(h, hosts[i], i)) {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "etcd did not become healthy; its logs are in {}",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        e
    }

    /// Whether member `i` (on host `host`) answers its health check, asked with its own
    /// certificate as etcd requires.
    fn healthy(&self, h: &Hosts, host: &str, i: usize) -> bool {
        let f = |name: &str| self.tls[i].join(name).to_str().unwrap().to_string();
        let url = format!("{}/health", self.endpoints[i]);
        h.exec(
            host,
            &[
                "curl",
                "-sS",
                "--max-time",
                "2",
                "--cacert",
                &f("ca.pem"),
                "--cert",
                &f("etcd.pem"),
                "--key",
                &f("etcd.key"),
                &url,
            ],
        )
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("\"health\":\"true\""))
    }

    /// `[cluster] etcd` naming the members.
    pub fn config(&self) -> String {
        format!(
            "etcd = [{}]\n",
            self.endpoints
                .iter()
                .map(|e| format!("{e:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.kill();
            let _ = m.wait();
        }
    }
}

// ---- replicated memory (tests/e2e/replication.rs, tests/e2e/hosts.rs)

/// What a phased program prints natively (it waits for a line after phases 1 and 2).
pub fn native_phased(cmd: &[&str]) -> String {
    let mut child = std::process::Command::new(cmd[0])
        .args(&cmd[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"\n\n").unwrap();
    text(&child.wait_with_output().unwrap().stdout)
}

/// Runs a phased program on the cluster, calling `between(cluster, phase, pid)` after phases
/// 1 and 2 before letting it go on; returns its stdout, stderr and whether it succeeded.
pub fn run_phased(
    c: &TestCluster,
    cmd: &[&str],
    mut between: impl FnMut(&TestCluster, usize, u64),
) -> (String, String, bool) {
    let mut child = c.spawn(&[], cmd);
    let mut stdin = child.stdin.take().unwrap();
    let mut out = String::new();
    for phase in 1..=2 {
        let line = read_line(&mut child);
        out.push_str(&line);
        if !line.starts_with(&format!("phase {phase}")) {
            break;
        }
        let pid = c.process_of(&child)["pid"].as_u64().unwrap();
        between(c, phase, pid);
        std::io::Write::write_all(&mut stdin, b"\n").unwrap();
    }
    drop(stdin);
    let rest = child.wait_with_output().unwrap();
    out.push_str(&text(&rest.stdout));
    (out, text(&rest.stderr), rest.status.success())
}

/// A free loopback port for a component that is killed and started again at the same address.
/// It lies below the kernel's ephemeral range, so that while its owner is down no outgoing
/// connection and no bind to port 0 (of this test or one running beside it) can be given it.
pub fn restartable_port() -> u16 {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let low: u16 = range
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or(32768);
    let (first, span) = (low.saturating_sub(12000).max(1024), low.saturating_sub(1024).min(12000));
    // Tests run in parallel: start from a different place in each so they rarely try the same port.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seed = std::process::id().wrapping_mul(2654435761)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
    let start = seed.wrapping_add(NEXT.fetch_add(7919, std::sync::atomic::Ordering::Relaxed));
    (0..u32::from(span))
        .map(|i| first + ((start.wrapping_add(i)) % u32::from(span)) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below the ephemeral range")
}

/// Kills the cluster's global managers (at `gm_addr`) and starts them again as they were
/// started, logging to `log` in the cluster's directory.
pub fn restart_gm(c: &TestCluster, gm_addr: &str, log: &str) {
    let gm = c.pid_of_addr(gm_addr);
    let argv: Vec<String> = std::fs::read(format!("/proc/{gm}/cmdline"))
        .unwrap()
        .strip_suffix(&[0])
        .unwrap()
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    c.kill_component(gm);
    let log = std::fs::File::create(c.dir.path().join(log)).unwrap();
    let again = {
        use std::os::unix::process::CommandExt;
        std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap()
    };
    remember_pid(c.dir.path(), again.id() as i32);
}

/// Runs `phases.py` with a dict and then with sqlite3 in memory, calling
/// `between(cluster, phase, round, pid)` after each of its first two phases, and asserts each
/// round prints what it prints natively.
pub fn python_phases_as_native(c: &TestCluster, mut between: impl FnMut(&TestCluster, usize, usize, u64)) {
    let py = python3();
    let phases = script("phases.py");
    for (round, kind) in ["dict", "sqlite"].into_iter().enumerate() {
        let cmd = [py.as_str(), phases.as_str(), kind];
        let (out, err, ok) = run_phased(c, &cmd, |c, phase, pid| between(c, phase, round, pid));
        assert!(ok, "{kind}: {err}");
        assert_eq!(out, native_phased(&cmd), "{kind}: {err}");
    }
}

/// Restarts the global managers at `gm_addr` (round `round` of a test) and waits until they
/// answer and know `mcomps` live mComponents again.
pub fn restart_gm_and_wait(c: &TestCluster, gm_addr: &str, round: usize, mcomps: usize) {
    restart_gm(c, gm_addr, &format!("gm-again{round}.log"));
    assert!(c.eventually(Duration::from_secs(15), |c| c
        .cmd(&["cluster", "status", "--json"])
        .output()
        .is_ok_and(|o| o.status.success())
        && mcomp_stats(c).len() == mcomps));
}

/// Kills the components at `addrs` under a running `hold`, lets it go on, and asserts it
/// fails with no output (none from lost data); returns its stderr.
pub fn hold_fails_after_losing(c: &TestCluster, mut child: std::process::Child, addrs: &[String]) -> String {
    let pids: Vec<i32> = addrs.iter().map(|a| c.pid_of_addr(a)).collect();
    for p in pids {
        c.kill_component(p);
    }
    // The program goes on once the managers hold them lost: before that, a program whose
    // misses are cheap could read its whole heap back through copies the pComponent still
    // maps (one-sided access) and end as if nothing were lost.
    let lost = c.eventually(Duration::from_secs(30), |c| {
        c.components_now("mcomponent")
            .iter()
            .filter(|m| addrs.iter().any(|a| m["addr"] == a.as_str()))
            .all(|m| m["alive"] != true)
    });
    assert!(lost, "the managers never held {addrs:?} lost");
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert_eq!(text(&out.stdout), "", "no output from lost data");
    text(&out.stderr)
}

/// Starts `hold MIB` on the cluster; returns it once its heap is filled, with its pid.
pub fn spawn_hold(c: &TestCluster, mib: u32) -> (std::process::Child, u64) {
    let hold = program("hold");
    let mut child = c.spawn(&[], &[hold.to_str().unwrap(), &mib.to_string()]);
    assert_eq!(read_line(&mut child), "ready\n");
    let pid = c.process_of(&child)["pid"].as_u64().unwrap();
    (child, pid)
}

pub fn mcomp_stats(c: &TestCluster) -> Vec<serde_json::Value> {
    c.components("mcomponent")
        .into_iter()
        .filter(|m| m["alive"] == true)
        .collect()
}

/// The address of the home of process `pid` and the replica sets of its vRegions (ids), as
/// the home's statistics show them; `None` while no live mComponent is its home (a backup
/// has yet to take over).
pub fn try_home_of(c: &TestCluster, pid: u64) -> Option<(String, Vec<Vec<u64>>)> {
    // Asked again by its callers: a home that missed the status's 5 s is not waited for here.
    let live: Vec<_> = c
        .components_now("mcomponent")
        .into_iter()
        .filter(|m| m["alive"] == true)
        .collect();
    live.into_iter().find_map(|m| {
        let p = m["stats"]["home_processes"]
            .as_array()?
            .iter()
            .find(|p| p["pid"] == pid)?
            .clone();
        let sets = p["vregions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                v["owners"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|o| o.as_u64().unwrap())
                    .collect()
            })
            .collect();
        Some((m["addr"].as_str().unwrap().to_string(), sets))
    })
}

/// The home of process `pid` and its sets, waited for: the status is the managers' view as of
/// the components' last heartbeats, which a restart of the managers or a take-over leaves
/// without the process for a moment.
pub fn home_of(c: &TestCluster, pid: u64) -> (String, Vec<Vec<u64>>) {
    let mut home = None;
    c.eventually(Duration::from_secs(20), |c| {
        home = try_home_of(c, pid);
        home.is_some()
    });
    home.unwrap_or_else(|| panic!("no mComponent is home of process {pid}: {:?}", mcomp_stats(c)))
}

pub fn addr_of(c: &TestCluster, id: u64) -> String {
    c.components("mcomponent").into_iter().find(|m| m["id"] == id).unwrap()["addr"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The sum of the series `name` of the component at `addr` in a Prometheus exposition (0
/// when it was never counted); fails unless the component's `splitos_build_info` is there.
fn is_of(line: &str, addr: &str) -> bool {
    line.split_once('{')
        .is_some_and(|(_, labels)| labels.contains(&format!("component=\"{addr}\"")))
}

/// Whether a scrape of the cluster holds the metrics of the component at `addr`.
pub fn has_metrics_of(all: &str, addr: &str) -> bool {
    all.lines()
        .any(|l| l.starts_with("splitos_build_info{") && is_of(l, addr))
}

pub fn metric_of(all: &str, addr: &str, name: &str) -> f64 {
    let of_it = |l: &&str| is_of(l, addr);
    assert!(has_metrics_of(all, addr), "no metrics of {addr}:\n{all}");
    all.lines()
        .filter(of_it)
        .filter(|l| l.split('{').next() == Some(name))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .unwrap()
                .parse::<f64>()
                .unwrap_or_else(|e| panic!("{l}: {e}"))
        })
        .sum()
}

/// Sum of a counter over the mComponents whose processes run. Not over those the managers
/// hear from in time: on a loaded machine a component's heartbeat may be late, and its
/// counters would be left out of the sum.
pub fn mcomp_metric(c: &TestCluster, name: &str) -> f64 {
    let pids = c.state_pids();
    c.components_now("mcomponent")
        .iter()
        .filter_map(|m| m["addr"].as_str())
        .filter(|a| pid_listening_on(a, &pids).is_some())
        .map(|a| c.metric(a, name))
        .sum()
}

/// Waits until every vRegion set of `pid` has `members` members, all live mComponents.
pub fn wait_rebuilt(c: &TestCluster, pid: u64, members: usize) {
    let ok = c.eventually(Duration::from_secs(60), |c| {
        let live: Vec<u64> = c
            .components_now("mcomponent")
            .iter()
            .filter(|m| m["alive"] == true)
            .map(|m| m["id"].as_u64().unwrap())
            .collect();
        try_home_of(c, pid).is_some_and(|(_, sets)| {
            !sets.is_empty()
                && sets
                    .iter()
                    .all(|s| s.len() == members && s.iter().all(|id| live.contains(id)))
        })
    });
    assert!(
        ok,
        "the replicas of process {pid} are rebuilt: {:?}",
        try_home_of(c, pid)
    );
}

/// The mComponent that is primary of the most vRegions of `pid`, other than its home.
pub fn busiest_primary(c: &TestCluster, pid: u64) -> String {
    let (home, sets) = home_of(c, pid);
    let mut count: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
    for s in &sets {
        *count.entry(s[0]).or_default() += 1;
    }
    let mut ids: Vec<(usize, u64)> = count.into_iter().map(|(id, n)| (n, id)).collect();
    ids.sort();
    ids.into_iter()
        .rev()
        .map(|(_, id)| addr_of(c, id))
        .find(|a| *a != home)
        .expect("a primary other than the home")
}

/// Flips bit `bit` of the first page of each of `pid`'s vRegions (4 MiB) on the first member
/// of its set, lets `child` (a `hold`) end, and asserts it printed its native output, the
/// pComponent caught bad pages and had them repaired, and a home rebuilt them (`how`).
pub fn flip_each_vregion_and_expect_rebuilt(
    c: &TestCluster,
    child: std::process::Child,
    pid: u64,
    bit: u32,
    how: &str,
) {
    let (_, sets) = home_of(c, pid);
    let home = c
        .components("mcomponent")
        .into_iter()
        .find_map(|m| {
            m["stats"]["home_processes"]
                .as_array()?
                .iter()
                .find(|p| p["pid"] == pid)
                .cloned()
        })
        .unwrap();
    let mut flipped = 0;
    for (i, set) in sets.iter().enumerate() {
        let at = home["vregions"][i]["index"].as_u64().unwrap() * (4 << 20);
        let out = c
            .cmd(&[
                "debug",
                "flip",
                "--mcomp",
                &addr_of(c, set[0]),
                "--vnode",
                "default",
                "--pid",
                &pid.to_string(),
                "--vaddr",
                &format!("{at:#x}"),
                "--bit",
                &bit.to_string(),
            ])
            .output()
            .unwrap();
        if out.status.success() {
            flipped += 1;
        }
    }
    assert!(flipped >= 5, "pages of the program are on the mComponents: {flipped}");
    assert_hold_ends_native(child);
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    assert!(c.metric(&p, "splitos_pcomp_checksum_failures_total") >= 1.0);
    assert!(c.metric(&p, "splitos_pcomp_pages_repaired_total") >= 1.0);
    assert!(
        mcomp_metric(c, "splitos_mcomp_reconstructed_pages_total") >= 1.0,
        "the home rebuilt the pages {how}"
    );
}

/// Stops a component (SIGSTOP) until dropped (SIGCONT): a component too slow to keep up, or
/// paused.
pub struct Stalled(i32);

impl Stalled {
    pub fn new(pid: i32) -> Stalled {
        // SAFETY: kill(2) takes no pointers; `pid` is a component of this test's own cluster.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        Stalled(pid)
    }
}

impl Drop for Stalled {
    fn drop(&mut self) {
        // SAFETY: as in `new`.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// One HTTP/1.1 request with a JSON body; returns the status, the headers (lowercased names)
/// and the body.
pub fn http(api: &str, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> (u16, String, String) {
    http_as(api, method, path, token, "application/json", body)
}

/// One HTTP/1.1 request with a body of `content_type`.
pub fn http_as(
    api: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(api).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!("{method} {path} HTTP/1.1\r\nHost: {api}\r\n{auth}Content-Length: {}\r\nContent-Type: {content_type}\r\nConnection: close\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).unwrap();
    // A body the server refuses early may find the connection closed: what it answered counts.
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let at = out.windows(4).position(|w| w == b"\r\n\r\n");
    let (head, body) = match at {
        Some(at) => (String::from_utf8_lossy(&out[..at]).to_string(), &out[at + 4..]),
        None => (String::from_utf8_lossy(&out).to_string(), &[][..]),
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {head:?}"));
    let head = head.to_lowercase();
    let body = match head.contains("transfer-encoding: chunked") {
        true => unchunked(body),
        false => body.to_vec(),
    };
    (status, head, String::from_utf8_lossy(&body).to_string())
}

/// A body sent in chunks (each a hexadecimal size, CRLF, that many bytes, CRLF), whole.
fn unchunked(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&rest[..eol]);
        let n = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap_or(0);
        let chunk = &rest[eol + 2..];
        if n == 0 || chunk.len() < n {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
        rest = chunk[n..].strip_prefix(b"\r\n").unwrap_or(&chunk[n..]);
    }
    body
}

/// A REST API token made with `splitos cluster token create ARGS` (its last line).
pub fn api_token(c: &TestCluster, args: &[&str]) -> String {
    let mut a = vec!["cluster", "token", "create"];
    a.extend_from_slice(args);
    let out = c.cmd(&a).output().unwrap();
    assert!(out.status.success(), "token create: {}", text(&out.stderr));
    text(&out.stdout).lines().last().unwrap().to_string()
}

/// Runs `args` as the user `uid` (with its own group and no other), with `env`.
pub fn as_user(uid: u32, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let (u, g) = (format!("--reuid={uid}"), format!("--regid={uid}"));
    std::process::Command::new("setpriv")
        .args([u.as_str(), g.as_str(), "--clear-groups"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Requests of kind `msg` the component at `addr` served, by its own counter.
pub fn requests_of(c: &TestCluster, addr: &str, msg: &str) -> f64 {
    let out = c.cmd(&["cluster", "metrics"]).output().unwrap();
    let (ours, kind) = (format!("component=\"{addr}\""), format!("msg=\"{msg}\""));
    text(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("splitos_mcomp_requests_total{") && l.contains(&ours) && l.contains(&kind))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// Waits until every pComponent of `c` has heard from the managers how much memory the cluster
/// has: until then it asks the home before answering a change that adds write access.
pub fn wait_cluster_memory_known(c: &TestCluster) {
    let t0 = Instant::now();
    while !c
        .components("pcomponent")
        .iter()
        .all(|p| p["stats"]["home_refusals"]["cluster_memory"].as_u64().unwrap_or(0) > 0)
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the pComponents never learnt the cluster's memory"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A tmpfs of `size` mounted for one test (a small disk to fill), unmounted when dropped, also
/// when the test fails.
pub struct SmallDisk(pub tempfile::TempDir);

impl SmallDisk {
    pub fn new(size: &str) -> SmallDisk {
        let d = tempfile::Builder::new()
            .prefix("splitos-small-disk-")
            .tempdir()
            .unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "splitos-test-disk",
            ])
            .arg(d.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {}", text(&out.stderr));
        SmallDisk(d)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        unmount_under(self.0.path());
    }
}
