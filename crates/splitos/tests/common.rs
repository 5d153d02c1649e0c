//! Shared helpers of the end-to-end tests: the real splitos binary, real component processes,
//! real programs compiled from tests/programs, compared with native runs.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub fn splitos() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_splitos"))
}

fn programs_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs")
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
    } else if programs_src().join(format!("{name}.cpp")).exists() {
        (programs_src().join(format!("{name}.cpp")), "g++", &[])
    } else {
        (programs_src().join(format!("{name}.c")), "gcc", &["-pthread"])
    };
    let code = std::fs::read(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
    let hash = code.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3));
    let out = dir.join(format!("{name}-{hash:016x}"));
    if out.exists() {
        return out;
    }
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    let st = Command::new(cc).args(["-O2", "-o"]).arg(&tmp).arg(&src).args(extra).status().expect("compiler runs");
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
        .env("SPLITOS_STATE_DIR", std::env::temp_dir().join("splitos-test-no-cluster"))
        .env("SPLITOS_DATA_DIR", data.path())
        .envs(env.iter().copied())
        .output()
        .expect("splitos run")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

/// Runs `cmd` natively and under splitos; asserts identical stdout, stderr and exit status.
pub fn same_as_native(opts: &[&str], cmd: &[&str]) -> Output {
    let n = native(cmd);
    let s = under_splitos(opts, cmd);
    assert_eq!(text(&s.stdout), text(&n.stdout), "stdout differs for {cmd:?}; splitos stderr:\n{}", text(&s.stderr));
    assert_eq!(text(&s.stderr), text(&n.stderr), "stderr differs for {cmd:?}");
    assert_eq!(s.status.code(), n.status.code(), "exit status differs for {cmd:?}");
    s
}

pub fn stats_of(opts: &[&str], cmd: &[&str]) -> (Output, serde_json::Value) {
    stats_of_env(opts, cmd, &[])
}

/// Runs `cmd` under splitos with `--stats-json`; asserts native output; returns the counters.
pub fn stats_of_env(opts: &[&str], cmd: &[&str], env: &[(&str, &str)]) -> (Output, serde_json::Value) {
    let f = tempfile::NamedTempFile::new().unwrap();
    let mut o: Vec<&str> = opts.to_vec();
    let path = f.path().to_str().unwrap().to_string();
    o.extend(["--stats-json", &path]);
    let n = native(cmd);
    let out = under_splitos_env(&o, cmd, env);
    assert_eq!(text(&out.stdout), text(&n.stdout), "stdout differs for {cmd:?}; stderr:\n{}", text(&out.stderr));
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
        let dir = tempfile::Builder::new().prefix("splitos-cluster-").tempdir().unwrap();
        let mut cmd = Command::new(splitos());
        cmd.args(["cluster", "up"]).env("SPLITOS_STATE_DIR", dir.path()).env("SPLITOS_DATA_DIR", dir.path().join("data"));
        if let Some(c) = config {
            let p = dir.path().join("cluster.toml");
            std::fs::write(&p, c).unwrap();
            cmd.arg("--config").arg(p);
        }
        let out = cmd.output().unwrap();
        let c = TestCluster { dir };
        assert!(out.status.success(), "cluster up: {}", text(&out.stderr));
        c
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(splitos());
        c.args(args).env("SPLITOS_STATE_DIR", self.dir.path()).env("SPLITOS_DATA_DIR", self.dir.path().join("data")).env_remove("SPLITOS_GM");
        c
    }

    pub fn run(&self, opts: &[&str], prog: &[&str]) -> Output {
        let mut c = self.cmd(&["run"]);
        c.args(opts).arg("--").args(prog);
        c.output().unwrap()
    }

    pub fn status(&self) -> serde_json::Value {
        let out = self.cmd(&["cluster", "status", "--json"]).output().unwrap();
        assert!(out.status.success(), "status: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    pub fn components(&self, role: &str) -> Vec<serde_json::Value> {
        self.status()["components"].as_array().unwrap().iter().filter(|c| c["role"] == role).cloned().collect()
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    pub fn state_pids(&self) -> Vec<i32> {
        let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(self.dir.path().join("cluster.json")).unwrap()).unwrap();
        s["pids"].as_array().unwrap().iter().map(|p| p.as_i64().unwrap() as i32).collect()
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

    pub fn spawn(&self, opts: &[&str], prog: &[&str]) -> std::process::Child {
        let mut c = self.cmd(&["run"]);
        c.args(opts).arg("--").args(prog).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().unwrap()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let pids = std::fs::read_to_string(self.dir.path().join("cluster.json")).ok().and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok());
        let _ = self.cmd(&["cluster", "down"]).output();
        if let Some(v) = pids {
            for p in v["pids"].as_array().into_iter().flatten() {
                unsafe { libc::kill(p.as_i64().unwrap() as i32, libc::SIGKILL) };
            }
        }
        unmount_under(self.dir.path());
    }
}

/// Detaches every mount under `dir` (vNode mounts a killed pComponent left), so that removing
/// the directory never walks into one.
pub fn unmount_under(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for m in info.lines().filter_map(|l| l.split(' ').nth(4)).filter(|m| Path::new(m).starts_with(dir)) {
        let c = std::ffi::CString::new(m).unwrap();
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
