//! The managers' etcd members, as faults hit them: found by the client address the
//! configuration names (on this host's loopback), killed or stopped, and started again as they
//! were started (the same program, arguments, directory, environment and output files), so
//! that a member comes back with its data directory and rejoins.
use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a member started again may take to listen and answer healthy.
const BACK: Duration = Duration::from_secs(30);
/// Over TLS its health is not asked (that needs a client certificate of etcd's authority):
/// it is given this long to catch up once it listens.
const CATCH_UP: Duration = Duration::from_secs(3);

/// How one member was started.
#[derive(Debug)]
struct Member {
    client: SocketAddr,
    /// Its clients speak plain HTTP (`etcd_insecure`): its health can be asked.
    plain: bool,
    exe: PathBuf,
    args: Vec<OsString>,
    cwd: PathBuf,
    env: Vec<(OsString, OsString)>,
    /// The files its standard output and error went to, where they were files.
    out: [Option<PathBuf>; 2],
}

/// The members of the configuration's etcd, each as `etcd<i>` in its order.
#[derive(Debug, Default)]
pub(super) struct Members(Vec<Member>);

impl Members {
    /// The members at `endpoints` when each listens on this host's loopback in a process this
    /// run can see; none otherwise (an etcd elsewhere is not this run's to hit). Fewer than
    /// three cannot lose one and keep a quorum: none either.
    pub(super) fn find(endpoints: &[String]) -> anyhow::Result<Members> {
        let clients: Vec<(SocketAddr, bool)> = endpoints
            .iter()
            .filter_map(|e| e.split_once("://"))
            .filter_map(|(scheme, a)| Some((a.trim_end_matches('/').parse().ok()?, scheme == "http")))
            .filter(|(a, _): &(SocketAddr, bool)| a.ip().is_loopback())
            .collect();
        if clients.len() < 3 || clients.len() != endpoints.len() {
            return Ok(Members::default());
        }
        let mut out = Vec::new();
        for (client, plain) in clients {
            let pid = splitos_core::sys::tcp_listener_pid(client)
                .ok_or_else(|| anyhow::anyhow!("no process this run can see listens at etcd's {client}"))?;
            out.push(Member::of(pid, client, plain)?);
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

    /// Starts member `name` again as it was started, and waits until it listens and (over
    /// plain HTTP) answers healthy: the next fault may take another member down, and the
    /// quorum needs this one back.
    pub(super) fn restart(&self, name: &str) -> anyhow::Result<()> {
        let m = Members::index(name)
            .and_then(|i| self.0.get(i))
            .ok_or_else(|| anyhow::anyhow!("no etcd member {name}"))?;
        let output = |i: usize| -> anyhow::Result<Stdio> {
            Ok(match &m.out[i] {
                Some(p) => std::fs::OpenOptions::new().append(true).open(p)?.into(),
                None => Stdio::null(),
            })
        };
        let mut c = Command::new(&m.exe);
        c.args(&m.args)
            .current_dir(&m.cwd)
            .env_clear()
            .envs(m.env.iter().cloned())
            .stdin(Stdio::null())
            .stdout(output(0)?)
            .stderr(output(1)?);
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
        let ready = || match m.plain {
            true => m.healthy(),
            false => splitos_core::sys::tcp_listener_pid(m.client).is_some() && t0.elapsed() > CATCH_UP,
        };
        while !ready() {
            if let Some(s) = child.try_wait()? {
                anyhow::bail!("etcd member {name} exited at its start ({s})");
            }
            if t0.elapsed() > BACK {
                let _ = child.kill();
                let _ = child.wait();
                anyhow::bail!(
                    "etcd member {name} was not back at {} within {} s: stopped again",
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
    /// Whether it answers its health check as healthy (a member of a quorum).
    fn healthy(&self) -> bool {
        let ask = || -> std::io::Result<String> {
            let mut s = std::net::TcpStream::connect_timeout(&self.client, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            write!(s, "GET /health HTTP/1.0\r\nHost: {}\r\n\r\n", self.client)?;
            let mut answer = String::new();
            s.read_to_string(&mut answer)?;
            Ok(answer)
        };
        ask().is_ok_and(|a| a.contains("\"health\":\"true\""))
    }

    fn of(pid: u32, client: SocketAddr, plain: bool) -> anyhow::Result<Member> {
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
        let file = |fd: &str| {
            std::fs::read_link(proc_.join("fd").join(fd))
                .ok()
                .filter(|p| p.is_file())
        };
        Ok(Member {
            client,
            plain,
            out: [file("1"), file("2")],
            exe: std::fs::read_link(proc_.join("exe"))?,
            args,
            cwd: std::fs::read_link(proc_.join("cwd"))?,
            env,
        })
    }
}
