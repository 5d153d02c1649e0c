//! A long-lived cluster: placement, memory accounting and release, vNodes, two-level virtual
//! memory across mComponents, and errors (bad input, full pools, dead components).
use crate::common;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;
use splitos_rpc::transport::tcp::TcpConn;
use splitos_rpc::transport::{TcpConfig, TcpTransport};
use splitos_rpc::{FrameHeader, Msg, MAGIC, MAX_BODY, WIRE_VERSION};

fn mem_stats(c: &TestCluster) -> Vec<serde_json::Value> {
    c.components("mcomponent")
        .into_iter()
        .map(|m| m["stats"].clone())
        .collect()
}

#[test]
fn exit_frees_all_memory_and_status_shows_it() {
    // Strict overcommit: mappings are charged whole, which `committed` shows.
    let c = TestCluster::up(Some(
        "[cluster]\novercommit = \"strict\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[mcomponent]]\n",
    ));
    let p = program("hold");
    let mut child = c.spawn(&[], &[p.to_str().unwrap(), "24"]);
    assert_eq!(read_line(&mut child), "ready\n");
    let used: u64 = mem_stats(&c).iter().map(|s| s["used"].as_u64().unwrap()).sum();
    let committed: u64 = mem_stats(&c).iter().map(|s| s["committed"].as_u64().unwrap()).sum();
    assert!(
        used >= 16 << 20,
        "flushed pages live on mComponents while the program runs: {used}"
    );
    assert!(committed >= 24 << 20, "{committed}");
    let pcomp = &c.components("pcomponent")[0]["stats"];
    assert_eq!(pcomp["processes"].as_array().unwrap().len(), 1, "{pcomp}");
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && text(&out.stdout).starts_with("sum "),
        "{}",
        text(&out.stderr)
    );
    let freed = c.eventually(Duration::from_secs(5), |c| {
        mem_stats(c).iter().all(|s| s["used"] == 0 && s["committed"] == 0)
    });
    assert!(freed, "all memory is released after exit: {:?}", mem_stats(&c));
    let human = c.cmd(&["cluster", "status"]).output().unwrap();
    assert!(text(&human.stdout).contains("mcomponent") && text(&human.stdout).contains("pcomponent"));
}

#[test]
fn small_vregions_spread_one_process_over_both_mcomponents() {
    // Every access by message, so that each mComponent counts what it served.
    let c = TestCluster::up(Some("[cluster]\nvregion_size = \"8M\"\n[[pcomponent]]\nexcache = \"4M\"\none_sided = \"off\"\n[[mcomponent]]\n[[mcomponent]]\n"));
    let p = program("hold");
    let cmd = [p.to_str().unwrap(), "48"];
    let mut child = c.spawn(&[], &cmd);
    assert_eq!(read_line(&mut child), "ready\n");
    let pid = c.process_of(&child)["pid"].as_u64().unwrap();
    let during = mem_stats(&c);
    assert_eq!(during.len(), 2);
    for s in &during {
        // 48 MiB written through a 4 MiB ExCache: most pages were flushed to their owners.
        let pages = s["owned_processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["pid"] == pid)
            .map(|o| o["pages"].as_u64().unwrap());
        assert!(
            pages.is_some_and(|n| n > 100),
            "each mComponent owns pages of process {pid} in its vRegions: {s}"
        );
        assert!(
            s["flushes"].as_u64().unwrap() > 100,
            "each mComponent stored flushed pages: {s}"
        );
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(format!("ready\n{}", text(&out.stdout)), text(&native(&cmd).stdout));
    // Reading the buffer back fetched the flushed pages from both owners.
    for (before, after) in during.iter().zip(mem_stats(&c)) {
        assert!(
            after["fetches"].as_u64().unwrap() > before["fetches"].as_u64().unwrap() + 100,
            "each mComponent served fetches: {before} then {after}"
        );
    }
}

#[test]
fn an_mcomponent_refuses_pages_of_another_vnode() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let p = program("hold");
    let mut child = c.spawn(&["--vnode", "alpha", "--create-vnode"], &[p.to_str().unwrap(), "16"]);
    assert_eq!(read_line(&mut child), "ready\n");
    let pcomp = &c.components("pcomponent")[0]["stats"];
    let pid = pcomp["processes"][0]["pid"].as_u64().unwrap().to_string();
    assert_eq!(pcomp["processes"][0]["vnode"], "alpha");
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let addr = "0x200000000000";
    let ok = c
        .cmd(&[
            "debug", "fetch", "--mcomp", &m, "--vnode", "alpha", "--pid", &pid, "--vaddr", addr,
        ])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "the process's own vNode may read: {}",
        text(&ok.stderr)
    );
    let bad = c
        .cmd(&[
            "debug", "fetch", "--mcomp", &m, "--vnode", "beta", "--pid", &pid, "--vaddr", addr,
        ])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("Denied"), "{}", text(&bad.stderr));
    drop(child.stdin.take());
    assert!(child.wait_with_output().unwrap().status.success());
    assert!(c.log("mem0").contains("refused a request for another vNode"));
}

#[test]
fn out_of_memory_fails_malloc_not_the_cluster() {
    // Strict overcommit refuses the mapping, so malloc returns NULL (heuristic would stop
    // the program when its pages no longer fit anywhere, as Linux's OOM killer does).
    let c = TestCluster::up(Some(
        "[cluster]\novercommit = \"strict\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\ncapacity = \"96M\"\n",
    ));
    let p = program("oom");
    let out = c.run(&[], &[p.to_str().unwrap()]);
    let s = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        s.contains("malloc returned NULL with ENOMEM") && s.contains("malloc works: 1"),
        "{s}"
    );
    let m = program("memtouch");
    let again = c.run(&[], &[m.to_str().unwrap(), "8"]);
    assert_eq!(
        text(&again.stdout),
        text(&native(&[m.to_str().unwrap(), "8"]).stdout),
        "the cluster keeps serving"
    );
}

/// A frame header as the wire defines it (docs/wire.md): little-endian fields in order.
fn frame_header(h: FrameHeader) -> Vec<u8> {
    let mut b = Vec::with_capacity(FrameHeader::SIZE);
    b.extend_from_slice(&h.magic.to_le_bytes());
    b.extend_from_slice(&h.version.to_le_bytes());
    b.extend_from_slice(&[h.kind, h.flags]);
    b.extend_from_slice(&h.req_id.to_le_bytes());
    b.extend_from_slice(&h.len.to_le_bytes());
    b.extend_from_slice(&h.reserved.to_le_bytes());
    assert_eq!(b.len(), FrameHeader::SIZE);
    assert_eq!(b.len(), std::mem::size_of::<FrameHeader>());
    b
}

/// A well-formed request frame header for a body of `len` bytes.
fn request_header(req_id: u64, len: u32) -> FrameHeader {
    FrameHeader {
        magic: MAGIC,
        version: WIRE_VERSION,
        kind: 0,
        flags: 0,
        req_id,
        len,
        reserved: 0,
    }
}

/// A complete, well-formed frame carrying `msg`.
fn frame(h: FrameHeader, msg: &Msg) -> Vec<u8> {
    let body = postcard::to_allocvec(msg).unwrap();
    let mut f = frame_header(FrameHeader {
        len: body.len() as u32,
        ..h
    });
    f.extend_from_slice(&body);
    f
}

/// A TCP connection to `addr` that made its handshake with the cluster's admin credentials:
/// what follows are plain frames (loopback).
fn authenticated(c: &TestCluster, addr: &str) -> TcpConn {
    let creds = splitos_rpc::auth::Credentials::load(&c.dir.path().join("admin.cred")).unwrap();
    let t = TcpTransport::new(
        TcpConfig::default(),
        splitos_rpc::poll::Polling::Fixed,
        Some(std::sync::Arc::new(creds)),
    );
    let mut s = t.connect_stream(addr, Duration::from_secs(5)).unwrap();
    s.stream().set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // The receiver's first frame grants the connection its credits.
    let mut h = [0u8; FrameHeader::SIZE];
    s.read_exact(&mut h).expect("a credit frame");
    assert_eq!(h[6], 2, "a credit frame");
    assert_eq!(
        u64::from_le_bytes(h[8..16].try_into().unwrap()),
        TcpConfig::default().max_in_flight as u64,
        "the grant is max_in_flight"
    );
    let mut body = vec![0u8; u32::from_le_bytes(h[16..20].try_into().unwrap()) as usize];
    s.read_exact(&mut body).unwrap();
    s
}

/// Sends a ping on `s` and returns the decoded reply.
fn ping(s: &mut TcpConn, req_id: u64) -> Msg {
    s.write_all(&frame(request_header(req_id, 0), &Msg::C2X_PING(splitos_rpc::C2X_PING)))
        .unwrap();
    let mut h = [0u8; FrameHeader::SIZE];
    s.read_exact(&mut h).expect("a reply header");
    assert_eq!(u32::from_le_bytes(h[0..4].try_into().unwrap()), MAGIC);
    assert_eq!(u16::from_le_bytes(h[4..6].try_into().unwrap()), WIRE_VERSION);
    assert_eq!(h[6], 1, "a reply frame");
    assert_eq!(u64::from_le_bytes(h[8..16].try_into().unwrap()), req_id);
    let mut body = vec![0u8; u32::from_le_bytes(h[16..20].try_into().unwrap()) as usize];
    s.read_exact(&mut body).unwrap();
    postcard::from_bytes(&body).unwrap()
}

#[test]
fn malformed_frames_are_rejected_and_others_still_served() {
    let c = TestCluster::up(None);
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    // The documented wire format without a handshake gets nothing.
    let mut raw = std::net::TcpStream::connect(&m).unwrap();
    raw.write_all(&frame(request_header(1, 0), &Msg::C2X_PING(splitos_rpc::C2X_PING)))
        .unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(
        matches!(raw.read(&mut [0u8; 8]), Ok(0) | Err(_)),
        "a frame without a handshake was answered"
    );
    // Past the handshake, frames are checked. A connection opened before the bad frames keeps
    // being served after them.
    let mut good = authenticated(&c, &m);
    assert!(
        matches!(ping(&mut good, 1), Msg::X2C_PONG { .. }),
        "the well-formed frame these tests alter is answered"
    );
    let rejected_before = c.metric(&m, "splitos_rpc_frames_rejected_total");

    let valid = request_header(7, 0);
    let ping_body = postcard::to_allocvec(&Msg::C2X_PING(splitos_rpc::C2X_PING)).unwrap();
    let with_ping = |h: FrameHeader| {
        let mut f = frame_header(FrameHeader {
            len: ping_body.len() as u32,
            ..h
        });
        f.extend_from_slice(&ping_body);
        f
    };
    // Each differs from a well-formed ping in one thing. The first five are refused from what
    // the component has read, so it must close the connection without waiting for more; the
    // truncated one ends (our write side closes) in the middle of its body.
    let bad: Vec<(&str, Vec<u8>, bool)> = vec![
        (
            "bad magic",
            with_ping(FrameHeader {
                magic: u32::from_le_bytes(*b"GET "),
                ..valid
            }),
            false,
        ),
        (
            "bad version",
            with_ping(FrameHeader {
                version: WIRE_VERSION + 1,
                ..valid
            }),
            false,
        ),
        ("bad kind", with_ping(FrameHeader { kind: 0xee, ..valid }), false),
        (
            "oversized length",
            frame_header(FrameHeader {
                len: MAX_BODY + 1,
                ..valid
            }),
            false,
        ),
        (
            "undecodable body",
            {
                let mut f = frame_header(FrameHeader { len: 64, ..valid });
                f.extend_from_slice(&[0xff; 64]);
                f
            },
            false,
        ),
        (
            "truncated body",
            {
                let mut f = frame_header(FrameHeader { len: 64, ..valid });
                f.extend_from_slice(&[0; 10]);
                f
            },
            true,
        ),
    ];
    for (what, bytes, close_write) in &bad {
        let mut s = authenticated(&c, &m);
        s.write_all(bytes).unwrap();
        if *close_write {
            s.stream().shutdown(std::net::Shutdown::Write).unwrap();
        }
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => panic!("{what}: the component answered with {n} bytes instead of closing the connection"),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                panic!("{what}: the connection was still open 5 s later")
            }
            Err(e) => panic!("{what}: {e}"),
        }
    }
    let rejected = c.metric(&m, "splitos_rpc_frames_rejected_total") - rejected_before;
    assert_eq!(
        rejected,
        bad.len() as f64,
        "the mComponent counted each bad frame as rejected"
    );
    assert!(
        matches!(ping(&mut good, 2), Msg::X2C_PONG { .. }),
        "the other connection is still served"
    );
    // The cluster has two mComponents, which register in either order: read the attacked one's log.
    let log = ["mem0", "mem1"]
        .iter()
        .map(|n| c.log(n))
        .find(|l| l.contains(&m))
        .expect("the attacked mComponent's log names its address");
    assert!(log.contains("rejected malformed frame"), "{log}");

    // The pComponent's program socket gets garbage too.
    let sock = c.dir.path().join("programs/proc0.sock");
    let mut u = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    u.write_all(&[0x41; 10]).unwrap();
    drop(u);
    let p = program("memtouch");
    let (_, s) = {
        let f = tempfile::NamedTempFile::new().unwrap();
        let out = c.run(
            &["--stats-json", f.path().to_str().unwrap()],
            &[p.to_str().unwrap(), "8"],
        );
        assert_eq!(
            text(&out.stdout),
            text(&native(&[p.to_str().unwrap(), "8"]).stdout),
            "{}",
            text(&out.stderr)
        );
        (
            out,
            serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(f.path()).unwrap()).unwrap(),
        )
    };
    assert!(
        n(&s, "processes") == 1 && n(&s, "misses") > 0,
        "the cluster keeps serving programs: {s}"
    );
    assert!(c.eventually(Duration::from_secs(5), |c| c.log("proc0").contains("malformed hello")));
}

fn threads_of(pid: i32) -> usize {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    st.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_flood_of_stalled_connections_leaves_the_component_bounded_and_serving() {
    let c = TestCluster::up(Some("[transport.tcp]\nmax_connections_per_peer = 40\nframe_timeout_ms = 3000\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let pid = c.pid_of_addr(&m);
    let before = threads_of(pid);
    // 400 connections, each sending half of a handshake's first message.
    let half: &[u8] = &[32, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    let mut flood: Vec<std::net::TcpStream> = (0..400)
        .filter_map(|_| std::net::TcpStream::connect(&m).ok())
        .map(|mut s| {
            let _ = s.write_all(half);
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let during = threads_of(pid);
    // The per-peer cap, and at most one thread per kind of refusal that will log the
    // flood's summary (connections over the cap, handshakes that fail).
    assert!(
        during <= before + 40 + 2,
        "threads of the mComponent: {before} before, {during} during the flood"
    );
    // A program runs meanwhile (its components reach each other over shared memory), with
    // its output as natively.
    let p = program("memtouch");
    let p = p.to_str().unwrap();
    let out = c.run(&[], &[p, "16"]);
    assert_eq!(
        text(&out.stdout),
        text(&native(&[p, "16"]).stdout),
        "{}",
        text(&out.stderr)
    );
    // Every stalled connection is closed by the component once its frame is overdue.
    for s in flood.iter_mut() {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 8];
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("a stalled connection was not closed: {other:?}"),
        }
    }
    // The program's shared-memory channel to the mComponent ends with the flood's threads only
    // once it has been idle for the transport's idle time (5 s, checked every 2.5 s).
    let channel_idle = Duration::from_millis(splitos_rpc::transport::shm::DEFAULT_IDLE_MS * 3 / 2);
    assert!(
        c.eventually(channel_idle + Duration::from_secs(5), |_| threads_of(pid) <= before + 2),
        "threads back to {before}: {}",
        threads_of(pid)
    );
    assert!(c.metric(&m, "splitos_rpc_connections_refused_total") >= 360.0);
    assert!(c.metric(&m, "splitos_rpc_handshakes_refused_total") >= 40.0);
    // And the port serves an authenticated peer again.
    assert!(matches!(
        c.admin_rpc().call(&m, splitos_rpc::C2X_PING),
        Ok(splitos_rpc::X2C_PONG { .. })
    ));
}

#[test]
fn a_dead_mcomponent_is_named_in_the_error() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let p = program("hold");
    // The program's stderr is a file it already wrote to: the error is appended to what it
    // wrote, never written over it.
    let errfile = c.dir.path().join("program.err");
    let mut child = c
        .cmd(&[
            "run",
            "--",
            "bash",
            "-c",
            &format!("echo 'the program wrote this first' >&2; exec {} 16", p.display()),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&errfile).unwrap())
        .spawn()
        .unwrap();
    assert_eq!(read_line(&mut child), "ready\n");
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    c.kill_component(c.pid_of_addr(&m));
    drop(child.stdin.take());
    assert!(!child.wait().unwrap().success());
    let err = std::fs::read_to_string(&errfile).unwrap();
    assert!(err.starts_with("the program wrote this first\n"), "{err}");
    assert!(
        err.contains("mComponent") && err.contains(&m),
        "the error names the component: {err}"
    );
}

#[test]
fn unreachable_cluster_and_bad_config_are_named() {
    let out = std::process::Command::new(splitos())
        .args(["run", "--gm", "127.0.0.1:9", "--", "true"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("127.0.0.1:9"), "{}", text(&out.stderr));
    let dir = tempfile::tempdir().unwrap();
    for (cfg, field) in [
        ("[[pcomponent]]\nexcahce = \"4M\"\n[[mcomponent]]\n", "excahce"),
        ("[[pcomponent]]\nexcache = \"4Q\"\n[[mcomponent]]\n", "excache"),
        ("[[pcomponent]]\nways = -1\n[[mcomponent]]\n", "ways"),
        ("[[pcomponent]]\n", "mcomponent"),
        (
            "[cluster]\nreclaim_dead_ms = 40000\n[[pcomponent]]\n[[mcomponent]]\n",
            "reclaim_dead_ms",
        ),
        (
            "[[pcomponent]]\nnetns = \"../root\"\n[[mcomponent]]\n",
            "pcomponent[0].netns",
        ),
        (
            "[[pcomponent]]\n[[mcomponent]]\nnetns = \"no-such-namespace-here\"\n",
            "no-such-namespace-here",
        ),
    ] {
        let f = dir.path().join("bad.toml");
        std::fs::write(&f, cfg).unwrap();
        let out = std::process::Command::new(splitos())
            .args(["cluster", "up", "--config"])
            .arg(&f)
            .env("SPLITOS_STATE_DIR", dir.path())
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0));
        assert!(
            text(&out.stderr).contains(field),
            "error for {cfg:?} names {field}: {}",
            text(&out.stderr)
        );
    }
}

#[test]
fn run_never_moves_to_another_cluster_when_the_configured_one_is_down() {
    let c = TestCluster::up(None);
    assert!(c.run(&[], &["true"]).status.success());
    // The state directory is root's (the admin's) to list and its files root's alone, also
    // when the directory existed open to all; others pass through to the program sockets.
    use std::os::unix::fs::PermissionsExt;
    let open = c.dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let up = std::process::Command::new(splitos())
        .args(["cluster", "up"])
        .env("SPLITOS_STATE_DIR", &open)
        .env("SPLITOS_DATA_DIR", c.dir.path().join("open-data"))
        .output()
        .unwrap();
    let down = std::process::Command::new(splitos())
        .args(["cluster", "down"])
        .env("SPLITOS_STATE_DIR", &open)
        .output()
        .unwrap();
    assert!(
        up.status.success() && down.status.success(),
        "{} {}",
        text(&up.stderr),
        text(&down.stderr)
    );
    assert_eq!(std::fs::metadata(&open).unwrap().permissions().mode() & 0o777, 0o711);
    for f in ["gm.log", "gm.ready", "admin.cred", "authority.key"] {
        assert_eq!(
            std::fs::metadata(open.join(f)).unwrap().permissions().mode() & 0o777,
            0o600,
            "{f}"
        );
    }
    assert_eq!(
        std::fs::metadata(open.join("programs")).unwrap().permissions().mode() & 0o777,
        0o755
    );
    for pid in c.state_pids() {
        c.kill_component(pid);
    }
    // The state file of `cluster up` is still there: the program must not run elsewhere.
    let out = c.run(&[], &["true"]);
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("cluster up") && err.contains(&c.dir.path().join("cluster.json").display().to_string()),
        "the error names the cluster: {err}"
    );
    let out = c.run(&["--embedded"], &["echo", "embedded"]);
    assert_eq!(text(&out.stdout), "embedded\n", "{}", text(&out.stderr));
    // A cluster named by the environment.
    let out = c
        .cmd(&["run", "--", "true"])
        .env("SPLITOS_GM", "127.0.0.1:9")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(err.contains("SPLITOS_GM") && err.contains("127.0.0.1:9"), "{err}");
}

/// Each component the global managers list: (address, role, id, alive), by address.
fn members(c: &TestCluster) -> Vec<(String, String, u64, bool)> {
    let mut m: Vec<_> = c.status()["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["addr"].as_str().unwrap().to_string(),
                x["role"].as_str().unwrap().to_string(),
                x["id"].as_u64().unwrap(),
                x["alive"].as_bool().unwrap(),
            )
        })
        .collect();
    m.sort();
    m
}

#[test]
fn membership_survives_restarts_of_the_global_managers() {
    // A fixed address, so that the restarted global managers are where the components look.
    let port = restartable_port();
    let c = TestCluster::up(Some(&format!("[cluster]\ngm = \"127.0.0.1:{port}\"\nforget_dead_ms = 8000\nreclaim_dead_ms = 2000\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[mcomponent]]\n")));
    let before = members(&c);
    assert!(before.iter().all(|m| m.3) && before.len() >= 3, "{before:?}");
    let ids: std::collections::HashSet<u64> = before.iter().map(|m| m.2).collect();
    assert_eq!(ids.len(), before.len(), "ids are distinct: {before:?}");
    let memtouch = program("memtouch");
    let memtouch = memtouch.to_str().unwrap();
    let native_out = text(&native(&[memtouch, "16"]).stdout);
    let gm_addr = format!("127.0.0.1:{port}");
    // A program runs across every restart: the managers are never on its data path.
    let hold = program("hold");
    let hold = hold.to_str().unwrap();
    let mut across = c.spawn(&[], &[hold, "16"]);
    assert_eq!(read_line(&mut across), "ready\n");
    assert!(c
        .cmd(&["cluster", "set-placement", "first-fit"])
        .status()
        .unwrap()
        .success());
    for round in 0..3 {
        let gm = c.pid_of_addr(&gm_addr);
        let cmdline = std::fs::read(format!("/proc/{gm}/cmdline")).unwrap();
        // Each argument ends with a NUL; some are empty (`--shm-dir ""`).
        let argv: Vec<String> = cmdline
            .strip_suffix(&[0])
            .unwrap()
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        c.kill_component(gm);
        let log = std::fs::File::create(c.dir.path().join(format!("gm-again{round}.log"))).unwrap();
        let restarted = {
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
        remember_pid(c.dir.path(), restarted.id() as i32);
        // The managers resume the membership from their state: the components that outlived
        // them keep their ids, and none registers again.
        assert!(
            c.eventually(Duration::from_secs(15), |c| c
                .cmd(&["cluster", "status", "--json"])
                .output()
                .is_ok_and(|o| o.status.success())
                && members(c) == before),
            "round {round}: {before:?}; the managers' log: {}",
            c.log(&format!("gm-again{round}"))
        );
        assert_eq!(
            c.metric(&gm_addr, "splitos_gm_components_resumed"),
            before.len() as f64,
            "round {round}"
        );
        assert_eq!(
            c.metric(&gm_addr, "splitos_gm_registrations_total"),
            0.0,
            "round {round}: {}",
            c.log(&format!("gm-again{round}"))
        );
        assert!(c.log(&format!("gm-again{round}")).contains("membership resumed"));
        // The policy the admin put in place outlives the managers too.
        let placement = c.cmd(&["cluster", "set-placement"]).output().unwrap();
        assert!(
            text(&placement.stdout).contains("placement first-fit"),
            "round {round}: {}{}",
            text(&placement.stdout),
            text(&placement.stderr)
        );
        let out = c.run(&[], &[memtouch, "16"]);
        assert_eq!(text(&out.stdout), native_out, "round {round}: {}", text(&out.stderr));
    }
    drop(across.stdin.take());
    let out = across.wait_with_output().unwrap();
    assert_eq!(
        format!("ready\n{}", text(&out.stdout)),
        text(&native(&[hold, "16"]).stdout),
        "{}",
        text(&out.stderr)
    );
    let again: f64 = before
        .iter()
        .filter(|m| m.1 != "global-managers")
        .map(|m| c.metric(&m.0, "splitos_node_registrations_again_total"))
        .sum();
    assert_eq!(again, 0.0, "no component had to register again");
    // A component that stops is shown dead, then forgotten. It is dead after four missed
    // heartbeats and forgotten after `forget_dead_ms`: the window between must outlast a few
    // `cluster status` runs on a loaded machine.
    let (addr, _, _, _) = before.iter().find(|m| m.1 == "mcomponent").unwrap().clone();
    c.kill_component(c.pid_of_addr(&addr));
    assert!(
        c.eventually(Duration::from_secs(7), |c| members(c)
            .iter()
            .any(|m| m.0 == addr && !m.3)),
        "{:?}",
        members(&c)
    );
    assert!(
        c.eventually(Duration::from_secs(20), |c| members(c).iter().all(|m| m.0 != addr)),
        "{:?}",
        members(&c)
    );
    assert!(c.log("gm-again2").contains("component forgotten"));
}

#[test]
fn knobs_of_a_configured_cluster_take_effect() {
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"4M\"\nways = 1\nfault_workers = 3\n[[mcomponent]]\nworkers = 2\n",
    ));
    let pcomp_pid = c.pid_of_addr(c.components("pcomponent")[0]["addr"].as_str().unwrap());
    let mcomp_pid = c.pid_of_addr(c.components("mcomponent")[0]["addr"].as_str().unwrap());
    // Thread names: the mComponent's request workers `mcomp-w<i>` (none when requests are
    // served on the receiving threads, the default), a program's fault workers
    // `fault<os_pid>.<i>` on the pComponent while it runs.
    assert_eq!(threads_named(mcomp_pid, "mcomp-w"), 2, "two mComponent workers");
    let p = program("hold");
    let cmd = [p.to_str().unwrap(), "8"];
    let mut child = c.spawn(&[], &cmd);
    assert_eq!(read_line(&mut child), "ready\n");
    let pcomp = c.components("pcomponent")[0]["stats"].clone();
    let os_pid = pcomp["processes"][0]["os_pid"].as_i64().unwrap();
    assert_eq!(
        threads_named(pcomp_pid, &format!("fault{os_pid}.")),
        3,
        "three fault workers serve the process"
    );
    // 8 MiB written through a 4 MiB ExCache: the process holds at most 1024 lines.
    let resident = pcomp["processes"][0]["resident_lines"].as_u64().unwrap();
    assert!(resident <= 1024, "{pcomp}");
    assert!(
        pcomp["totals"]["evictions"].as_u64().unwrap() >= 1024,
        "a program twice the ExCache evicts: {pcomp}"
    );
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(format!("ready\n{}", text(&out.stdout)), text(&native(&cmd).stdout));
    let ended = c.eventually(Duration::from_secs(5), |_| {
        threads_named(pcomp_pid, &format!("fault{os_pid}.")) == 0
    });
    assert!(ended, "fault workers end with their process");

    // Direct-mapped: eight pages 4 MiB apart share the one line of their set and evict each
    // other on every touch; in a 4-way (or wider) cache of the same size they would all stay.
    let s = c.dir.path().join("stride.json");
    let stride = program("stride");
    let cmd = [stride.to_str().unwrap(), "4", "8", "100"];
    let out = c.run(&["--stats-json", s.to_str().unwrap()], &cmd);
    assert_eq!(text(&out.stdout), text(&native(&cmd).stdout), "{}", text(&out.stderr));
    let st: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&s).unwrap()).unwrap();
    assert!(n(&st, "evictions") >= 700, "ways = 1: {st}");

    let out = c.cmd(&["cluster", "metrics"]).output().unwrap();
    assert!(
        text(&out.stdout).contains("splitos_pcomp_misses_total"),
        "Prometheus counters: {}",
        text(&out.stdout)
    );
}

#[test]
fn gpm_places_two_programs_on_two_pcomponents() {
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"4M\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n",
    ));
    assert_eq!(c.components("pcomponent").len(), 2);
    let p = program("hold");
    let cmd = [p.to_str().unwrap(), "16"];
    let mut first = c.spawn(&[], &cmd);
    assert_eq!(read_line(&mut first), "ready\n");
    // The GPM places by the thread counts of heartbeats; wait for one sent after the first
    // program started, so that the choice below does not depend on a heartbeat in flight.
    let ready = Instant::now();
    let fresh = c.eventually(Duration::from_secs(5), |c| {
        c.components("pcomponent").iter().any(|pc| {
            pc["load"]["threads"].as_u64().unwrap_or(0) >= 1
                && (pc["since_heartbeat_ms"].as_u64().unwrap() as u128) + 20 < ready.elapsed().as_millis()
        })
    });
    assert!(
        fresh,
        "a heartbeat reports the first program's threads: {:?}",
        c.components("pcomponent")
    );
    let mut second = c.spawn(&[], &cmd);
    assert_eq!(read_line(&mut second), "ready\n");
    let pcs = c.components("pcomponent");
    for pc in &pcs {
        let procs = pc["stats"]["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 1, "each pComponent runs one of the two programs: {pcs:?}");
    }
    for child in [first, second] {
        let mut child = child;
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(format!("ready\n{}", text(&out.stdout)), text(&native(&cmd).stdout));
    }
    // Each pComponent did the work of its program: misses and write-backs through its ExCache.
    for pc in c.components("pcomponent") {
        let t = &pc["stats"]["totals"];
        assert!(
            t["misses"].as_u64().unwrap() > 0 && t["flushes"].as_u64().unwrap() > 0,
            "{pc}"
        );
        assert_eq!(t["processes"], 1, "{pc}");
    }
}

#[test]
fn a_dead_pcomponent_stops_its_programs_with_a_message() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let p = program("hold");
    let mut child = c.spawn(&[], &[p.to_str().unwrap(), "8"]);
    assert_eq!(read_line(&mut child), "ready\n");
    let os_pid = c.process_of(&child)["os_pid"].as_i64().unwrap() as i32;
    let pcomp_addr = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    c.kill_component(c.pid_of_addr(&pcomp_addr));
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("pComponent") && err.contains(&pcomp_addr), "{err}");
    assert!(
        !std::path::Path::new(&format!("/proc/{os_pid}")).exists(),
        "the program does not outlive its pComponent"
    );
}

#[test]
fn a_dead_pcomponents_memory_is_released_on_every_mcomponent() {
    // Small vRegions spread each program's heap over both mComponents.
    let c = TestCluster::up(Some("[cluster]\nreclaim_dead_ms = 4000\nvregion_size = \"4M\"\n[[pcomponent]]\nexcache = \"4M\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[mcomponent]]\n"));
    let (mut doomed, survivor, doomed_pid, _) = hold_on_both_pcomponents(&c);
    let holding = mcomponents_holding;
    assert_eq!(holding(&c, doomed_pid), 2, "the program's heap is on both mComponents");
    let homes = |c: &TestCluster| {
        c.components("mcomponent")
            .iter()
            .map(|m| m["stats"]["home_of"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(homes(&c), 2);
    let pcomp = c
        .components("pcomponent")
        .into_iter()
        .find(|p| p["stats"]["processes"][0]["pid"] == doomed_pid)
        .unwrap();
    let killed = std::time::Instant::now();
    c.kill_component(c.pid_of_addr(pcomp["addr"].as_str().unwrap()));
    assert!(!doomed.wait().unwrap().success());
    // Kept while the pComponent has been silent for less than reclaim_dead_ms (it may only be
    // slow; asked within 3 s of the kill, or the check proves nothing), then within a few
    // seconds every mComponent let go of its process, and only of it: the other program's
    // memory is untouched.
    let held_meanwhile = holding(&c, doomed_pid);
    if killed.elapsed() < Duration::from_secs(3) {
        assert_eq!(held_meanwhile, 2, "released before reclaim_dead_ms");
    }
    assert!(
        c.eventually(Duration::from_secs(15), |c| holding(c, doomed_pid) == 0
            && homes(c) == 1),
        "memory of the lost pComponent's process: {:?}",
        c.components("mcomponent")
    );
    let released: f64 = c
        .components("mcomponent")
        .iter()
        .map(|m| {
            c.metric(
                m["addr"].as_str().unwrap(),
                "splitos_mcomp_lost_processes_released_total",
            )
        })
        .sum();
    assert_eq!(released, 1.0);
    assert_hold_ends_native(survivor);
}

#[test]
fn a_page_changed_on_its_mcomponent_is_never_taken_for_the_programs_data() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let hold = program("hold");
    let mut child = c.spawn(&[], &[hold.to_str().unwrap(), "16"]);
    assert_eq!(read_line(&mut child), "ready\n");
    let m = c.components("mcomponent")[0].clone();
    let addr = m["addr"].as_str().unwrap().to_string();
    let pid = m["stats"]["owned_processes"][0]["pid"].as_u64().unwrap().to_string();
    // A bit flips in pages spread over the 12 MiB the ExCache pushed out (fault injection).
    let mut from = 0x2000_0000_0000u64;
    let mut flipped = 0;
    while flipped < 12 {
        let out = c
            .cmd(&[
                "debug",
                "flip",
                "--mcomp",
                &addr,
                "--vnode",
                "default",
                "--pid",
                &pid,
                "--vaddr",
                &format!("{from:#x}"),
                "--bit",
                "12345",
            ])
            .output()
            .unwrap();
        if !out.status.success() {
            break;
        }
        let page = u64::from_str_radix(text(&out.stdout).trim().rsplit("0x").next().unwrap(), 16).unwrap();
        from = page + (1 << 20);
        flipped += 1;
    }
    assert!(flipped >= 8, "pages of the program are on the mComponent: {flipped}");
    // The program reads its buffer back: it is stopped at the first changed page, naming the
    // mComponent, and never prints a sum of wrong data.
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert_eq!(text(&out.stdout), "", "no output from wrong data");
    let err = text(&out.stderr);
    assert!(err.contains("fails its checksum") && err.contains(&addr), "{err}");
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    assert!(c.metric(&p, "splitos_pcomp_checksum_failures_total") >= 1.0);
}

#[test]
fn an_mcomponent_gives_the_memory_of_exited_programs_back_to_the_kernel() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let pid = c.pid_of_addr(&m);
    // Resident memory of the real mComponent process, in KiB.
    let rss = || -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .unwrap()
            .trim()
            .trim_end_matches(" kB")
            .trim()
            .parse()
            .unwrap()
    };
    let idle = rss();
    let (mut child, _) = spawn_hold(&c, 128);
    let held = rss();
    assert!(
        held > idle + (100 << 10),
        "the mComponent holds the heap: {idle} KiB idle, {held} KiB held"
    );
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    let used = |c: &TestCluster| c.components("mcomponent")[0]["stats"]["used"].as_u64().unwrap();
    assert!(c.eventually(Duration::from_secs(10), |c| used(c) == 0), "released");
    let back = c.eventually(Duration::from_secs(10), |_| rss() < idle + (held - idle) / 4);
    assert!(
        back,
        "freed pages go back to the kernel: {idle} KiB idle, {held} KiB held, {} KiB after the exit",
        rss()
    );
}

#[test]
fn channels_a_burst_opened_close_when_idle_and_their_threads_end() {
    let c = TestCluster::up(Some(
        "[transport.shm]\nidle_ms = 1000\n[[pcomponent]]\nexcache = \"4M\"\nfault_workers = 2\n[[mcomponent]]\n",
    ));
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let mcomp = c.pid_of_addr(&m);
    let servers = || threads_named(mcomp, "mcomp-shm");
    let before = servers();
    // Six programs at once, each missing on far more than the ExCache holds: the
    // pComponent's fault workers call the mComponent at the same time, on channels of their own.
    let py = python3();
    let script =
        "x = bytearray(16 << 20)\nfor i in range(0, len(x), 4096):\n    x[i] = i % 251\nprint(sum(x[::4096]))\n";
    let native = text(&native(&[&py, "-c", script]).stdout);
    let burst: Vec<std::process::Child> = (0..6).map(|_| c.spawn(&[], &[&py, "-c", script])).collect();
    let mut peak = servers();
    let mut outs = Vec::new();
    for mut child in burst {
        while child.try_wait().unwrap().is_none() {
            peak = peak.max(servers());
            std::thread::sleep(Duration::from_millis(20));
        }
        outs.push(child.wait_with_output().unwrap());
    }
    for out in outs {
        assert_eq!(text(&out.stdout), native, "{}", text(&out.stderr));
    }
    assert!(
        peak > before,
        "the burst opened channels: {before} server threads, then {peak}"
    );
    // Once unused for idle_ms, the pComponent closes them, and the mComponent's threads end.
    assert!(
        c.eventually(Duration::from_secs(20), |_| servers() <= before),
        "{} server threads left of {peak}, {before} before the burst",
        servers()
    );
    assert!(c.metric(&p, "splitos_rpc_shm_idle_closed_total") >= (peak - before) as f64);
}

// ---- An mComponent keeps the memory of a killed program resident

/// The OS process id of the program a `splitos run` (`run`) started from `exe`: the run's child.
fn program_pid(run: &std::process::Child, exe: &std::path::Path) -> i32 {
    let exe = std::fs::canonicalize(exe).unwrap();
    let children: Vec<i32> = std::fs::read_dir(format!("/proc/{}/task", run.id()))
        .unwrap()
        .flatten()
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    children
        .into_iter()
        .find(|p| std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == exe))
        .unwrap_or_else(|| panic!("no child of run {} runs {}", run.id(), exe.display()))
}

#[test]
fn an_mcomponent_gives_the_memory_of_a_killed_program_back_to_the_kernel() {
    let c = TestCluster::up(Some(
        "[cluster]\nreplication = \"none\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\ncapacity = \"1G\"\n",
    ));
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let mcomp = c.pid_of_addr(&m);
    // What the mComponent process has resident, its anonymous memory and the memfds of its
    // pages (shared memory), in KiB.
    let resident = || -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{mcomp}/status")).unwrap();
        ["RssAnon:", "RssShmem:"]
            .iter()
            .map(|k| {
                s.lines()
                    .find_map(|l| l.strip_prefix(k))
                    .unwrap()
                    .trim()
                    .trim_end_matches(" kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap()
            })
            .sum()
    };
    let idle = resident();
    // 8 MiB at a time: each new mapping takes the pages' segments back from the pComponent,
    // which then leases them again.
    let fill = program("fill");
    let mut child = c.spawn(&[], &[fill.to_str().unwrap(), "320", "wait"]);
    assert_eq!(read_line(&mut child), "filled 320 MiB\n");
    let used = |c: &TestCluster| c.components("mcomponent")[0]["stats"]["used"].as_u64().unwrap();
    assert!(
        c.eventually(Duration::from_secs(10), |c| used(c) >= 300 << 20),
        "the program's pages are on the mComponent: {} bytes",
        used(&c)
    );
    let held = resident();
    assert!(
        held > idle + (300 << 10),
        "the mComponent holds the heap: {idle} KiB idle, {held} KiB held"
    );
    let prog = program_pid(&child, &fill);
    // SAFETY: kill(2) takes no pointers; `prog` is this test's program, a child of its run.
    unsafe { libc::kill(prog, libc::SIGKILL) };
    assert!(!child.wait().unwrap().success());
    assert!(
        c.eventually(Duration::from_secs(10), |c| used(c) == 0
            && mem_stats(c)[0]["owned_processes"]
                .as_array()
                .is_some_and(|o| o.is_empty())),
        "released: {:?}",
        mem_stats(&c)
    );
    let back = c.eventually(Duration::from_secs(10), |_| resident() < idle + (held - idle) / 8);
    assert!(
        back,
        "freed pages go back to the kernel: {idle} KiB idle, {held} KiB held, {} KiB after the kill",
        resident()
    );
}

/// A program started while the cluster's only manager is down waits for it instead of
/// failing: the pComponent waits to pick its home (a run given the pComponent's socket
/// asks no manager itself), and `run` waits for the managers it needs to place a program.
/// Both then print what they print natively once the manager is started again.
#[test]
fn a_program_started_while_the_only_manager_restarts_waits_for_it_and_runs_as_natively() {
    let c = TestCluster::up(None);
    let cmd = ["python3", "-c", "print(sum(range(10**6)))"];
    let want = text(&native(&cmd).stdout);
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let sock = c.components("pcomponent")[0]["shim_sock"].as_str().unwrap().to_string();
    let down_then_up = |c: &TestCluster, child: std::process::Child| {
        // Long enough past the 1 s after which `run` says it waits, on a busy machine too.
        std::thread::sleep(Duration::from_secs(3));
        let again = c.cmd(&["cluster", "restart", "gm"]).output().unwrap();
        assert!(again.status.success(), "{}", text(&again.stderr));
        child.wait_with_output().unwrap()
    };
    c.kill_component(c.pid_of_addr(&gm));
    let out = down_then_up(&c, c.spawn(&["--pcomponent", &sock], &cmd));
    assert_eq!(text(&out.stdout), want, "{}", text(&out.stderr));
    let pcomp = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    // For the home, or first for the vNode's sComponent, which the start asks of the
    // managers too (then the home is picked at once).
    let waited = c.metric(&pcomp, "splitos_pcomp_starts_waited_for_managers_total")
        + c.metric(&pcomp, "splitos_pcomp_file_calls_waited_for_managers_total");
    assert!(waited >= 1.0, "the pComponent waited for the manager");
    // Started again by `cluster restart`, the manager is known by its configuration file.
    let conf = c.dir.path().join("gm.json");
    let again = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .find(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|l| l.split(|b| *b == 0).any(|a| a == conf.as_os_str().as_encoded_bytes()))
        })
        .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .expect("the manager started again");
    // Not in the PID record (`cluster down` finds it by its file): killed as it is.
    // SAFETY: kill(2) takes no pointers; `again` is this test's cluster's manager.
    unsafe { libc::kill(again, libc::SIGKILL) };
    assert!(c.eventually(Duration::from_secs(5), |_| !pid_running(again)));
    let out = down_then_up(&c, c.spawn(&[], &cmd));
    assert_eq!(text(&out.stdout), want, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("waiting for the global managers"),
        "{}",
        text(&out.stderr)
    );
}

/// A running program whose heap grows into new vRegions while the cluster's only manager is
/// down waits on its heap call (the home asks the managers for the new vRegion's places
/// again) and goes on when the manager is back, printing what it prints natively: no ENOMEM
/// it could not explain, no crash.
#[test]
fn a_heap_growing_while_the_only_manager_restarts_waits_for_it_and_prints_as_natively() {
    let c = TestCluster::up(Some(
        "[cluster]\nvregion_size = \"4M\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[mcomponent]]\n",
    ));
    // A new mapping of a vRegion's size every 150 ms for 6 s, each filled: a refused one
    // ends the program with its errno.
    let grow = program("mapgrow");
    let cmd = [grow.to_str().unwrap(), "40", "4", "150"];
    let want = text(&native(&cmd).stdout);
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let child = c.spawn(&[], &cmd);
    std::thread::sleep(Duration::from_millis(1500));
    c.kill_component(c.pid_of_addr(&gm));
    std::thread::sleep(Duration::from_secs(3));
    let again = c.cmd(&["cluster", "restart", "gm"]).output().unwrap();
    assert!(again.status.success(), "{}", text(&again.stderr));
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), want, "{}", text(&out.stderr));
    let waited: f64 = c
        .components("mcomponent")
        .iter()
        .map(|m| c.metric(m["addr"].as_str().unwrap(), "splitos_mcomp_waits_for_managers_total"))
        .sum();
    assert!(waited >= 1.0, "the home waited for the manager to place a new vRegion");
}

/// A cluster with more components than `[cluster] heartbeats_per_s` allows at the usual
/// 300 ms: the managers tell every component a longer period, each component beats at it (its
/// own gauge, and the managers count fewer heartbeats), none looks late for it, programs run
/// as natively, and a killed mComponent is still declared lost after the silence limit and
/// not before.
#[test]
fn a_cluster_over_its_heartbeat_budget_beats_slower_and_still_declares_a_killed_component_lost() {
    let c = TestCluster::up(Some(
        "[cluster]\nheartbeats_per_s = 4\nreclaim_dead_ms = 5000\nreplication = \"replica\"\nvregion_size = \"4M\"\n\
         [[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[mcomponent]]\n[[mcomponent]]\n",
    ));
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let members: Vec<(String, String)> = c.status()["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["addr"].as_str().unwrap().to_string(),
                m["role"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    // N components at four beats a second, by steps of 100 ms, at most reclaim_dead / 4.
    let n = members.len() as u64;
    let period = (n * 1000 / 4).div_ceil(100).max(3) * 100;
    let period = period.min(1250);
    assert!(period > 300, "{n} components: a longer period than 300 ms");
    assert!(
        c.eventually(Duration::from_secs(10), |c| c
            .metric(&gm, "splitos_gm_heartbeat_period_ms")
            == period as f64),
        "the managers tell {period} ms"
    );
    for (addr, role) in &members {
        assert!(
            c.eventually(Duration::from_secs(10), |c| c
                .metric(addr, "splitos_node_heartbeat_period_ms")
                == period as f64),
            "the {role} at {addr} beats every {period} ms"
        );
    }
    let memtouch = program("memtouch");
    let cmd = [memtouch.to_str().unwrap(), "24"];
    let want = text(&native(&cmd).stdout);
    let before = c.metric(&gm, "splitos_gm_heartbeats_total");
    let t0 = Instant::now();
    let run = c.spawn(&[], &cmd);
    // Each component beats four times as seldom as it did at 300 ms: none looks late.
    while t0.elapsed() < Duration::from_secs(6) {
        for m in c.status()["components"].as_array().unwrap() {
            assert_eq!(m["alive"], true, "{m}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    let beats = c.metric(&gm, "splitos_gm_heartbeats_total") - before;
    let secs = t0.elapsed().as_secs_f64();
    let at_300ms = n as f64 * secs / 0.3;
    assert!(
        beats < at_300ms / 2.0 && beats > n as f64 * secs / (period as f64 / 1000.0) / 2.0,
        "{beats} heartbeats in {secs:.1} s from {n} components every {period} ms"
    );
    let out = run.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), want, "{}", text(&out.stderr));
    // The managers' loop waits for more after work (`serving.coalesce_us`).
    assert!(c.metric(&gm, "splitos_ebb_loop_coalesced_waits_total") > 0.0);
    // Killed: lost once silent for reclaim_dead_ms, not while it may only be late.
    let victim = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let id = c.components("mcomponent")[0]["id"].clone();
    c.kill_component(c.pid_of_addr(&victim));
    let killed = Instant::now();
    let lost = |c: &TestCluster| {
        c.status()["components"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == id && m["lost"] == true)
    };
    assert!(c.eventually(Duration::from_secs(15), lost), "declared lost");
    // Its last beat came up to a period before the kill.
    assert!(
        killed.elapsed() >= Duration::from_millis(5_000 - period - 200),
        "declared lost {:?} after the kill, before reclaim_dead_ms of silence",
        killed.elapsed()
    );
    let out = c.run(&[], &cmd);
    assert_eq!(text(&out.stdout), want, "{}", text(&out.stderr));
}
