//! The managers' etcd members, as faults hit them: found by the client address the
//! configuration names (on this host's loopback), killed or stopped, and started again as they
//! were started (the same program, arguments, directory and environment), so that a member
//! comes back with its data directory and rejoins.
use std::ffi::OsString;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a member started again may take to listen.
const BACK: Duration = Duration::from_secs(30);

/// How one member was started.
#[derive(Debug)]
struct Member {
    client: SocketAddr,
    exe: PathBuf,
    args: Vec<OsString>,
    cwd: PathBuf,
    env: Vec<(OsString, OsString)>,
}

/// The members of the configuration's etcd, each as `etcd<i>` in its order.
#[derive(Debug, Default)]
pub(super) struct Members(Vec<Member>);

impl Members {
    /// The members at `endpoints` when each listens on this host's loopback in a process this
    /// run can see; none otherwise (an etcd elsewhere is not this run's to hit). Fewer than
    /// three cannot lose one and keep a quorum: none either.
    pub(super) fn find(endpoints: &[String]) -> anyhow::Result<Members> {
        let clients: Vec<SocketAddr> = endpoints
            .iter()
            .filter_map(|e| e.split_once("://").map(|(_, rest)| rest.trim_end_matches('/')))
            .filter_map(|a| a.parse().ok())
            .filter(|a: &SocketAddr| a.ip().is_loopback())
            .collect();
        if clients.len() < 3 || clients.len() != endpoints.len() {
            return Ok(Members::default());
        }
        let mut out = Vec::new();
        for client in clients {
            let pid = splitos_core::sys::tcp_listener_pid(client)
                .ok_or_else(|| anyhow::anyhow!("no process of this host listens at etcd's {client}"))?;
            out.push(Member::of(pid, client)?);
        }
        Ok(Members(out))
    }

    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    fn index(name: &str) -> Option<usize> {
        name.strip_prefix("etcd")?.parse().ok()
    }

    /// The process of member `name` (`etcd1`) now.
    pub(super) fn pid_of(&self, name: &str) -> Option<u32> {
        let m = self.0.get(Members::index(name)?)?;
        splitos_core::sys::tcp_listener_pid(m.client)
    }

    /// Starts member `name` again as it was started, its output in `logs`, and waits until it
    /// listens.
    pub(super) fn restart(&self, name: &str, logs: &Path) -> anyhow::Result<()> {
        let m = Members::index(name)
            .and_then(|i| self.0.get(i))
            .ok_or_else(|| anyhow::anyhow!("no etcd member {name}"))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join(format!("{name}.log")))?;
        let mut c = Command::new(&m.exe);
        c.args(&m.args)
            .current_dir(&m.cwd)
            .env_clear()
            .envs(m.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // Its own session: the member outlives this run, as the one it replaces would have.
        // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut c, || {
                libc::setsid();
                Ok(())
            });
        }
        let mut child = c.spawn()?;
        let t0 = Instant::now();
        while splitos_core::sys::tcp_listener_pid(m.client).is_none() {
            if let Some(s) = child.try_wait()? {
                anyhow::bail!("etcd member {name} exited at its start ({s}): see {name}.log");
            }
            if t0.elapsed() > BACK {
                anyhow::bail!(
                    "etcd member {name} did not listen at {} within {} s",
                    m.client,
                    BACK.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Reaped by the system once this run ends; until then its exit is collected here.
        std::thread::spawn(move || child.wait());
        Ok(())
    }
}

impl Member {
    fn of(pid: u32, client: SocketAddr) -> anyhow::Result<Member> {
        let proc_ = PathBuf::from(format!("/proc/{pid}"));
        let read = |what: &str| {
            std::fs::read(proc_.join(what))
                .map_err(|e| anyhow::anyhow!("etcd at {client} (pid {pid}): its {what}: {e}"))
        };
        let split = |b: Vec<u8>| -> Vec<OsString> {
            b.split(|c| *c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| OsString::from_vec(s.to_vec()))
                .collect()
        };
        let args: Vec<OsString> = split(read("cmdline")?).into_iter().skip(1).collect();
        let env = split(read("environ")?)
            .into_iter()
            .filter_map(|kv| {
                let kv = kv.into_vec();
                let eq = kv.iter().position(|c| *c == b'=')?;
                Some((
                    OsString::from_vec(kv[..eq].to_vec()),
                    OsString::from_vec(kv[eq + 1..].to_vec()),
                ))
            })
            .collect();
        Ok(Member {
            client,
            exe: std::fs::read_link(proc_.join("exe"))?,
            args,
            cwd: std::fs::read_link(proc_.join("cwd"))?,
            env,
        })
    }
}
