//! The network component: programs on a pComponent whose host has no route out use TCP
//! through an nComponent, which alone is linked to the outside (network namespaces as hosts,
//! `common::Hosts`). Programs nobody on the team wrote (curl, python3 -m http.server, Node.js)
//! on both ends, output compared with native runs, counters read at the nComponent.
use crate::common;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A rack of four hosts (global managers, pComponent, mComponent, nComponent) and the
/// outside, linked to the nComponent's host alone. Returns the hosts, the cluster, the
/// nComponent's address on the outside link and the outside host's.
fn rack() -> (Hosts, TestCluster, String, String) {
    rack_with("")
}

/// [`rack`] with more settings of the pComponent.
fn rack_with(pcomp: &str) -> (Hosts, TestCluster, String, String) {
    rack_of(pcomp, "", "")
}

/// [`rack`] with more settings of each component (their tables' last lines).
fn rack_of(pcomp: &str, mcomp: &str, ncomp: &str) -> (Hosts, TestCluster, String, String) {
    let mut h = Hosts::new(&["gm", "p1", "m1", "n1"]);
    let (n1_out, out) = h.add_outside("n1");
    let at = |host: &str| format!("listen = \"{}:0\"\nnetns = \"{}\"\n", h.addr(host), h.netns(host));
    let cfg = format!("[cluster]\ngm = \"{}:0\"\nnetns = \"{}\"\n[[pcomponent]]\n{}{pcomp}\n[[mcomponent]]\n{}{mcomp}\n[[ncomponent]]\n{}{ncomp}\n", h.addr("gm"), h.netns("gm"), at("p1"), at("m1"), at("n1"));
    let c = TestCluster::up(Some(&cfg));
    (h, c, n1_out, out)
}

/// `splitos run` on host `host` of the cluster.
fn run_on(h: &Hosts, c: &TestCluster, host: &str, prog: &[&str]) -> Command {
    let mut cmd = h.exec(host, &[splitos().to_str().unwrap(), "run", "--"]);
    cmd.args(prog)
        .env("SPLITOS_STATE_DIR", c.dir.path())
        .env("SPLITOS_DATA_DIR", c.dir.path().join("data"))
        .env_remove("SPLITOS_GM");
    cmd
}

/// Kills a server a test started (its `ip netns exec` wrapper execs it, so the PID is its own).
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(mut cmd: Command) -> Server {
    Server(cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap())
}

/// Fetches `url` with curl on host `host` until it answers (or 20 s pass): its body.
fn fetch_when_up(h: &Hosts, host: &str, url: &str) -> Vec<u8> {
    let t0 = Instant::now();
    loop {
        let out = h.exec(host, &["curl", "-sf", "-m", "5", url]).output().unwrap();
        if out.status.success() || t0.elapsed() > Duration::from_secs(20) {
            assert!(out.status.success(), "curl {url} on {host}: {}", text(&out.stderr));
            return out.stdout;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_program_on_a_host_without_a_route_reaches_the_outside_and_is_reached_from_it() {
    let (h, c, n1_out, out) = rack();
    let dir = tempfile::tempdir().unwrap();
    let body: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.path().join("data.bin"), &body).unwrap();
    let d = dir.path().to_str().unwrap();
    let py = python3();

    // The outside serves a file. Natively, the pComponent's host cannot reach it.
    let _outside = serve(h.exec(
        "out",
        &[&py, "-m", "http.server", "8701", "--bind", &out, "--directory", d],
    ));
    let url = format!("http://{out}:8701/data.bin");
    assert_eq!(
        fetch_when_up(&h, "n1", &url),
        body,
        "the nComponent's host reaches the outside"
    );
    let direct = h.exec("p1", &["curl", "-s", "-m", "3", &url]).output().unwrap();
    assert!(!direct.status.success(), "the pComponent's host has no route out");

    // curl under splitos on that host gets the file, through the nComponent.
    let got = run_on(&h, &c, "p1", &["curl", "-sS", &url]).output().unwrap();
    assert!(got.status.success(), "curl under splitos: {}", text(&got.stderr));
    assert!(
        got.stdout == body,
        "curl under splitos got {} bytes of {}",
        got.stdout.len(),
        body.len()
    );

    // A server under splitos on that host is reached from the outside at the nComponent's
    // address: Python's, then Node.js's.
    let _py_server = serve(run_on(
        &h,
        &c,
        "p1",
        &[&py, "-m", "http.server", "8702", "--bind", "0.0.0.0", "--directory", d],
    ));
    assert_eq!(
        fetch_when_up(&h, "out", &format!("http://{n1_out}:8702/data.bin")),
        body
    );
    let js = "require('http').createServer((q, r) => r.end('node saw ' + q.method + ' ' + q.url + '\\n')).listen(8703)";
    let _node = serve(run_on(&h, &c, "p1", &["node", "-e", js]));
    assert_eq!(
        text(&fetch_when_up(&h, "out", &format!("http://{n1_out}:8703/hello?x=1"))),
        "node saw GET /hello?x=1\n"
    );

    // The nComponent ran the sockets: its own counters say so (it received the file curl
    // fetched and sent the one the server served).
    let n = c.components("ncomponent").remove(0);
    let s = &n["stats"];
    assert!(
        s["connects"].as_u64().unwrap() >= 1 && s["accepts"].as_u64().unwrap() >= 2,
        "{s}"
    );
    assert!(s["ddio_received_bytes"].as_u64().unwrap() >= body.len() as u64, "{s}");
    assert!(s["ddio_sent_bytes"].as_u64().unwrap() >= body.len() as u64, "{s}");
    assert!(
        n["nics"].as_array().unwrap().iter().any(|ip| ip == &n1_out),
        "the nComponent registered its outside address: {n}"
    );
}

#[test]
fn the_socket_calls_of_a_c_program_behave_as_natively_through_the_ncomponent() {
    let (h, c, _, _) = rack_with("net_shortcut = false");
    let (_, p, n) = sockets_program(&h, &c);
    let net = &p["stats"]["net"];
    assert!(
        net["sent_bytes"].as_u64().unwrap() >= 8 << 20 && net["connects"].as_u64().unwrap() >= 4,
        "{net}"
    );
    assert_eq!(net["shortcuts"], 0, "{net}");
    assert!(
        n["stats"]["ddio_received_bytes"].as_u64().unwrap() >= 8 << 20,
        "the nComponent carried the bulk transfer: {}",
        n["stats"]
    );

    // Java's blocking and NIO sockets (IPv6 sockets with IPv4-mapped addresses).
    let dir = tempfile::tempdir().unwrap();
    let javac = Command::new("javac")
        .arg("-d")
        .arg(dir.path())
        .arg(programs_src().join("SocketEcho.java"))
        .status()
        .unwrap();
    assert!(javac.success());
    let cmd = ["java", "-cp", dir.path().to_str().unwrap(), "SocketEcho"];
    let native = h.exec("n1", &cmd).output().unwrap();
    assert!(native.status.success(), "{}", text(&native.stderr));
    let under = run_on(&h, &c, "p1", &cmd).output().unwrap();
    assert_eq!(text(&under.stdout), text(&native.stdout), "{}", text(&under.stderr));
    let before = net["connects"].as_u64().unwrap();
    let p = c.components("pcomponent").remove(0);
    assert!(
        p["stats"]["net"]["connects"].as_u64().unwrap() >= before + 2,
        "{}",
        p["stats"]["net"]
    );
}

/// The nComponent and the mComponent serving on Ebb event loops, each on a host of its own:
/// every request reaches them over TCP between hosts, in encrypted records, on a loop.
#[test]
fn an_ncomponent_and_an_mcomponent_serving_on_event_loops_carry_a_programs_sockets_and_heap() {
    let loops = "[ncomponent.serving]\nkind = \"loops\"\n";
    let (h, c, _, _) = rack_of(
        "net_shortcut = false\nexcache = \"2M\"",
        &loops.replace("ncomponent", "mcomponent"),
        loops,
    );
    let (_, p, n) = sockets_program(&h, &c);
    assert!(
        n["stats"]["ddio_received_bytes"].as_u64().unwrap() >= 8 << 20,
        "the nComponent carried the bulk transfer: {}",
        n["stats"]
    );
    assert!(
        p["stats"]["net"]["connects"].as_u64().unwrap() >= 4,
        "{}",
        p["stats"]["net"]
    );
    let memtouch = program("memtouch");
    let cmd = [memtouch.to_str().unwrap(), "3"];
    let under = run_on(&h, &c, "p1", &cmd).output().unwrap();
    assert_eq!(
        text(&under.stdout),
        text(&native(&cmd).stdout),
        "{}",
        text(&under.stderr)
    );
    let m = c.components("mcomponent").remove(0);
    for (what, addr) in [
        ("nComponent", n["addr"].as_str().unwrap()),
        ("mComponent", m["addr"].as_str().unwrap()),
    ] {
        let events = c.metric(addr, "splitos_ebb_loop_events_total");
        let open = c.metric(addr, "splitos_rpc_loop_connections");
        let accepted = c.metric(addr, "splitos_rpc_tcp_connections_accepted_total");
        eprintln!("{what}: loop events {events}, connections on the loop {open}, accepted {accepted}");
        assert!(
            events > 100.0 && open >= 1.0,
            "{what} served on its loop: {events} events, {open} connections"
        );
    }
    assert!(
        c.metric(m["addr"].as_str().unwrap(), "splitos_mcomp_requests_total") > 1000.0,
        "the program's misses reached the mComponent"
    );
}

#[test]
fn two_programs_of_a_vnode_on_one_pcomponent_connect_through_it_not_the_ncomponent() {
    let (h, c, _, _) = rack();
    let (_, p, n) = sockets_program(&h, &c);
    let net = &p["stats"]["net"];
    // The connections to a listener of the program (its forked child's, its own) took the
    // shortcut; those to a closed port went to the nComponent, which refused them.
    assert_eq!(net["shortcuts"], 2, "{net}");
    assert!(net["shortcut_bytes"].as_u64().unwrap() >= 8 << 20, "{net}");
    assert_eq!(n["stats"]["accepts"], 0, "{}", n["stats"]);
    assert!(
        n["stats"]["ddio_received_bytes"].as_u64().unwrap() < 1 << 20,
        "the bulk transfer did not reach the nComponent: {}",
        n["stats"]
    );
    // Servers and clients that are separate programs of the vNode too.
    let py = python3();
    let mut server = Server(
        run_on(&h, &c, "p1", &[&py, "-c", ECHO_SERVER, "127.0.0.1", "8731"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(read_line(&mut server.0), "listening\n");
    let client = "import socket\ns = socket.create_connection(('127.0.0.1', 8731))\ns.sendall(b'through the pComponent')\nprint(s.recv(100).decode(), s.getpeername()[1])\n";
    let out = run_on(&h, &c, "p1", &[&py, "-c", client]).output().unwrap();
    assert_eq!(
        text(&out.stdout),
        "through the pComponent 8731\n",
        "{}",
        text(&out.stderr)
    );
    let p = c.components("pcomponent").remove(0);
    assert_eq!(p["stats"]["net"]["shortcuts"], 3, "{}", p["stats"]["net"]);
}

/// Runs the socket calls' program natively on the nComponent's host and under splitos on the
/// pComponent's, asserts the same output; returns it and the pComponent's and nComponent's
/// status entries after the run.
fn sockets_program(h: &Hosts, c: &TestCluster) -> (String, serde_json::Value, serde_json::Value) {
    let prog = program("sockets");
    let cmd = [prog.to_str().unwrap(), "127.0.0.1", "9"];
    // Natively on the nComponent's host, whose stack the program's sockets use under splitos.
    let native = h.exec("n1", &cmd).output().unwrap();
    assert!(native.status.success(), "{}", text(&native.stdout));
    let under = run_on(h, c, "p1", &cmd).output().unwrap();
    assert_eq!(text(&under.stdout), text(&native.stdout), "{}", text(&under.stderr));
    (
        text(&under.stdout),
        c.components("pcomponent").remove(0),
        c.components("ncomponent").remove(0),
    )
}

const ECHO_SERVER: &str = "import socket, sys, threading\n\
s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n\
print('listening', flush=True)\n\
def echo(c):\n    with c:\n        while (d := c.recv(4096)):\n            c.sendall(d)\n\
while True:\n    c, _ = s.accept()\n    threading.Thread(target=echo, args=(c,), daemon=True).start()\n";

const ECHO_CLIENT: &str = "import os, socket, sys, time\n\
host, port = sys.argv[1], int(sys.argv[2])\n\
s = socket.create_connection((host, port))\n\
s.sendall(b'one')\n\
print('echo:', s.recv(100).decode(), flush=True)\n\
sys.stdin.readline()\n\
try:\n    print('after the nComponent died: recv returned', s.recv(100), 'and SO_ERROR is', os.strerror(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)), flush=True)\n\
except OSError as e:\n    print('after the nComponent died:', e.strerror, flush=True)\n\
s.close()\n\
sys.stdin.readline()\n\
for i in range(150):\n    try:\n        s = socket.create_connection((host, port), timeout=5)\n        break\n    except OSError as e:\n        time.sleep(0.2)\n\
s.sendall(b'two')\n\
print('echo again:', s.recv(100).decode(), flush=True)\n";

#[test]
fn a_dead_ncomponent_ends_its_connections_and_programs_connect_again_through_a_new_one() {
    let (h, c, _, out) = rack();
    let py = python3();
    let mut echo = Server(
        h.exec("out", &[&py, "-c", ECHO_SERVER, &out, "8711"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(read_line(&mut echo.0), "listening\n");
    let mut client = run_on(&h, &c, "p1", &[&py, "-c", ECHO_CLIENT, &out, "8711"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut first = read_line(&mut client);
    while first.is_empty() && t0.elapsed() < Duration::from_secs(20) {
        first = read_line(&mut client);
    }
    assert_eq!(first, "echo: one\n");

    for pid in h.pids("n1") {
        forget_pid(c.dir.path(), pid);
        // SAFETY: kill(2) takes no pointers; the nComponent's host runs nothing else of ours.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    use std::io::Write;
    client.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    assert_eq!(
        read_line(&mut client),
        "after the nComponent died: recv returned b'' and SO_ERROR is Network is down\n"
    );

    // A new nComponent on the same host: programs reach the outside through it.
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let cred = c.issue("ncomponent");
    let listen = format!("{}:0", h.addr("n1"));
    let _new = serve(h.exec(
        "n1",
        &[
            splitos().to_str().unwrap(),
            "net",
            "--listen",
            &listen,
            "--gm",
            &gm,
            "--credentials",
            cred.to_str().unwrap(),
        ],
    ));
    client.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let out = client.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout), "echo again: two\n", "{}", text(&out.stderr));
}

const HOLD_PORT: &str = "import socket, sys\n\
s = socket.socket()\n\
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n\
try:\n    s.bind(('0.0.0.0', int(sys.argv[1])))\n    s.listen()\n    print('bound', flush=True)\n\
except OSError as e:\n    print(e.strerror, flush=True)\n\
sys.stdin.readline()\n";

#[test]
fn one_vnode_cannot_take_another_vnodes_port_or_touch_its_sockets_and_bad_calls_are_refused() {
    let h = Hosts::new(&["p1"]);
    // One host this time: the cluster's components share it (the isolation is the point).
    let cfg = format!(
        "[cluster]\ngm = \"{ip}:0\"\nnetns = \"{ns}\"\n[[pcomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[mcomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[ncomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[vnode]]\nname = \"a\"\nusers = [\"root\"]\n[[vnode]]\nname = \"b\"\nusers = [\"root\"]\n",
        ns = h.netns("p1"),
        ip = h.addr("p1")
    );
    let c = TestCluster::up(Some(&cfg));
    let py = python3();
    let hold_on = |vnode: &str, port: &str| {
        let mut cmd = h.exec(
            "p1",
            &[
                splitos().to_str().unwrap(),
                "run",
                "--vnode",
                vnode,
                "--",
                &py,
                "-c",
                HOLD_PORT,
                port,
            ],
        );
        cmd.env("SPLITOS_STATE_DIR", c.dir.path())
            .env("SPLITOS_DATA_DIR", c.dir.path().join("data"))
            .env_remove("SPLITOS_GM");
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let line = read_line(&mut child);
        (child, line)
    };
    let hold = |vnode: &str| hold_on(vnode, "8721");
    let (a1, line) = hold("a");
    assert_eq!(line, "bound\n");
    // The same vNode may share the port (SO_REUSEPORT, as one user's programs may); another
    // may not, whatever it asks.
    let (a2, line) = hold("a");
    assert_eq!(line, "bound\n");
    let (b, line) = hold("b");
    assert_eq!(line, "Address already in use\n");

    // Loopback is the vNode's own: b cannot reach a's server there.
    // (The unspecified address is this host's loopback too, as Linux routes it.)
    let reach = "import socket\nfor ip in ('127.0.0.1', '0.0.0.0'):\n    try:\n        socket.create_connection((ip, 8721))\n        print('reached')\n    except OSError as e:\n        print(e.strerror)\n";
    let mut cmd = h.exec(
        "p1",
        &[
            splitos().to_str().unwrap(),
            "run",
            "--vnode",
            "b",
            "--",
            &py,
            "-c",
            reach,
        ],
    );
    let out = cmd
        .env("SPLITOS_STATE_DIR", c.dir.path())
        .env("SPLITOS_DATA_DIR", c.dir.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(
        text(&out.stdout),
        "Connection refused\nConnection refused\n",
        "{}",
        text(&out.stderr)
    );

    // A component holding credentials, but not the pComponent that made a socket, gets
    // nothing from it; the nComponent counts and keeps serving.
    let n = c.components("ncomponent").remove(0);
    let ncomp = n["addr"].as_str().unwrap().to_string();
    let admin = c.admin_rpc();
    let mut denied = 0;
    for sock in 1..40 {
        match admin.call_msg(&ncomp, &splitos_rpc::P2N_NAME { sock, peer: false }.into()) {
            Ok(m) => panic!("socket {sock} answered another component: {m:?}"),
            Err(splitos_rpc::RpcError::Remote {
                code: splitos_rpc::ErrCode::Denied,
                ..
            }) => denied += 1,
            Err(_) => {}
        }
    }
    assert!(denied >= 2, "the bound sockets exist and were refused");

    // A socket call from a process the pComponent does not run is refused; a program's
    // malformed calls (cut short, an unknown operation) too, and it keeps serving.
    let net_sock = c.dir.path().join("programs/proc0.sock.net");
    {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&net_sock).unwrap();
        let mut resp = [0u8; 144];
        s.read_exact(&mut resp).unwrap();
        assert_eq!(
            i64::from_ne_bytes(resp[..8].try_into().unwrap()),
            -(libc::EACCES as i64),
            "a process the pComponent does not run"
        );
        let _ = s.write_all(&[0u8; 168]);
    }
    let garbage = format!(
        "import socket, struct\n\
         s = socket.socket(socket.AF_UNIX)\ns.connect('{p}')\ns.sendall(b'\\x07' * 10)\ns.shutdown(socket.SHUT_WR)\nprint('cut short:', s.recv(200))\n\
         s = socket.socket(socket.AF_UNIX)\ns.connect('{p}')\ns.sendall(struct.pack('<II', {abi}, 99) + bytes(160))\nprint('unknown operation:', struct.unpack('<q', s.recv(200)[:8])[0])\n",
        p = net_sock.display(),
        abi = splitos_shim_abi::SHIM_ABI_VERSION
    );
    let out = h
        .exec(
            "p1",
            &[
                splitos().to_str().unwrap(),
                "run",
                "--vnode",
                "b",
                "--",
                &py,
                "-c",
                &garbage,
            ],
        )
        .env("SPLITOS_STATE_DIR", c.dir.path())
        .env("SPLITOS_DATA_DIR", c.dir.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(
        text(&out.stdout),
        format!("cut short: b''\nunknown operation: -{}\n", libc::EINVAL),
        "{}",
        text(&out.stderr)
    );
    let p = c.components("pcomponent").remove(0);
    assert!(
        p["stats"]["net"]["refused"].as_u64().unwrap() >= 3,
        "{}",
        p["stats"]["net"]
    );
    let n = c.components("ncomponent").remove(0);
    assert!(n["stats"]["refused"].as_u64().unwrap() >= 2, "{}", n["stats"]);
    assert!(c.log("proc0").contains("refused a malformed socket call"));

    // Both keep serving.
    let (b2, line) = hold_on("b", "8722");
    assert_eq!(line, "bound\n");
    for mut child in [a1, a2, b, b2] {
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
}

#[test]
fn on_the_dma_path_bytes_go_through_socket_buffers_on_an_mcomponent() {
    let (h, c, _, out) = rack_with("net_path = \"dma\"\nnet_shortcut = false");
    // Everything the C program sends and receives goes through memory, with native output.
    let (_, p, n) = sockets_program(&h, &c);
    assert_eq!(p["stats"]["net"]["path"], "dma");
    let s = &n["stats"];
    assert!(
        s["dma_sent_bytes"].as_u64().unwrap() >= 8 << 20 && s["dma_received_bytes"].as_u64().unwrap() >= 8 << 20,
        "{s}"
    );
    assert_eq!(
        (s["ddio_sent_bytes"].as_u64(), s["ddio_received_bytes"].as_u64()),
        (Some(0), Some(0)),
        "{s}"
    );
    // The mComponent saw both sides: the stub writing and the nComponent fetching, and back.
    let m = c.components("mcomponent").remove(0);
    let b = &m["stats"]["socket_buffers"];
    for k in [
        "written_by_pcomponents",
        "read_by_ncomponents",
        "written_by_ncomponents",
        "read_by_pcomponents",
    ] {
        assert!(b[k].as_u64().unwrap() >= 8 << 20, "{k}: {b}");
    }
    // And a file from the outside arrives whole.
    let dir = tempfile::tempdir().unwrap();
    let body: Vec<u8> = (0..2_000_000u32).map(|i| (i * 13 % 253) as u8).collect();
    std::fs::write(dir.path().join("f"), &body).unwrap();
    let _srv = serve(h.exec(
        "out",
        &[
            &python3(),
            "-m",
            "http.server",
            "8741",
            "--bind",
            &out,
            "--directory",
            dir.path().to_str().unwrap(),
        ],
    ));
    let url = format!("http://{out}:8741/f");
    fetch_when_up(&h, "n1", &url);
    let got = run_on(&h, &c, "p1", &["curl", "-sS", &url]).output().unwrap();
    assert!(
        got.stdout == body,
        "curl got {} bytes: {}",
        got.stdout.len(),
        text(&got.stderr)
    );
    // Closed sockets gave their buffers back.
    let m = c.components("mcomponent").remove(0);
    assert!(
        c.eventually(Duration::from_secs(5), |c| c.components("mcomponent").remove(0)
            ["stats"]["socket_buffers"]["buffers"]
            == 0),
        "{}",
        m["stats"]["socket_buffers"]
    );
}

#[test]
fn an_embedded_run_with_an_ncomponent_takes_the_programs_sockets_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let body: Vec<u8> = (0..1_500_000u32).map(|i| (i * 31 % 241) as u8).collect();
    std::fs::write(dir.path().join("f"), &body).unwrap();
    let mut server = Command::new(python3())
        .args([
            "-m",
            "http.server",
            "8751",
            "--bind",
            "127.0.0.1",
            "--directory",
            dir.path().to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stats = dir.path().join("stats.json");
    let url = "http://127.0.0.1:8751/f";
    let t0 = Instant::now();
    while Command::new("curl")
        .args(["-sf", "-o", "/dev/null", url])
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
        && t0.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = under_splitos(
        &[
            "--ncomponent",
            "--net-path",
            "dma",
            "--stats-json",
            stats.to_str().unwrap(),
        ],
        &["curl", "-sS", url],
    );
    let _ = server.kill();
    let _ = server.wait();
    assert!(out.stdout == body, "{} bytes: {}", out.stdout.len(), text(&out.stderr));
    // The embedded mComponents held the bytes on their way: the nComponent wrote them there.
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let stored: u64 = s["mcomponents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["socket_buffers"]["written_by_ncomponents"].as_u64().unwrap())
        .sum();
    assert!(stored >= body.len() as u64, "{}", s["mcomponents"]);
}

#[test]
fn redis_server_under_splitos_serves_redis_benchmark_from_the_outside() {
    let (h, c, n1_out, _) = rack();
    let _server = Server(
        run_on(
            &h,
            &c,
            "p1",
            &[
                "redis-server",
                "--port",
                "6390",
                "--bind",
                "0.0.0.0",
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let port = "6390";
    let cli = |args: &[&str]| {
        let mut a = vec!["redis-cli", "-h", &n1_out, "-p", port];
        a.extend_from_slice(args);
        h.exec("out", &a).output().unwrap()
    };
    let t0 = Instant::now();
    while text(&cli(&["ping"]).stdout) != "PONG\n" {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "redis-server under splitos never answered: {}",
            c.log("proc0")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(text(&cli(&["set", "disaggregated", "yes"]).stdout), "OK\n");
    assert_eq!(text(&cli(&["get", "disaggregated"]).stdout), "yes\n");
    // 20 clients at once, pipelined and not: every request answered.
    let bench = h
        .exec(
            "out",
            &[
                "redis-benchmark",
                "-h",
                &n1_out,
                "-p",
                port,
                "-q",
                "-n",
                "4000",
                "-c",
                "20",
                "-t",
                "set,get,lpush,lpop",
            ],
        )
        .output()
        .unwrap();
    let report = text(&bench.stdout);
    assert!(
        bench.status.success() && report.matches("requests per second").count() == 4,
        "{report}{}",
        text(&bench.stderr)
    );
    assert!(text(&cli(&["dbsize"]).stdout).trim().parse::<u64>().unwrap() >= 2);
    let n = c.components("ncomponent").remove(0);
    assert!(n["stats"]["accepts"].as_u64().unwrap() >= 24, "{}", n["stats"]);
}

const UDP_ECHO: &str = "import socket, sys\n\
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
s.bind((sys.argv[1], int(sys.argv[2])))\n\
print('listening', flush=True)\n\
while True:\n    d, a = s.recvfrom(65535)\n    s.sendto(d.upper() + (' from %s' % a[0]).encode(), a)\n";

const UDP_CLIENT: &str = "import socket, sys\n\
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
s.settimeout(2)\n\
for i in range(50):\n    s.sendto(b'query %d' % i, (sys.argv[1], int(sys.argv[2])))\n    try:\n        d, a = s.recvfrom(65535)\n        break\n    except socket.timeout:\n        pass\n\
print(d.decode(), 'answered by', a)\n";

#[test]
fn udp_sockets_behave_as_natively_and_reach_the_outside_through_the_ncomponent() {
    let (h, c, n1_out, out) = rack();
    // The C program's datagrams, on loopback: the same output natively and under splitos.
    let prog = program("udp");
    let cmd = [prog.to_str().unwrap(), "9460"];
    let native = h.exec("n1", &cmd).output().unwrap();
    assert!(
        native.status.success() && text(&native.stdout).ends_with("done\n"),
        "{}",
        text(&native.stdout)
    );
    let under = run_on(&h, &c, "p1", &cmd).output().unwrap();
    assert_eq!(text(&under.stdout), text(&native.stdout), "{}", text(&under.stderr));
    // Node.js's dgram (libuv's recvmsg and sendmsg) likewise.
    let js = "const d = require('dgram'); const s = d.createSocket('udp4');\n\
s.on('message', (m, r) => { console.log('server got', m.toString(), 'from', r.address); s.send(Buffer.from('pong'), r.port, r.address); });\n\
s.bind(9465, '127.0.0.1', () => { const c = d.createSocket('udp4');\n\
  c.on('message', (m, r) => { console.log('client got', m.toString(), 'from', r.address, r.port); c.close(); s.close(); });\n\
  c.send(Buffer.from('ping'), 9465, '127.0.0.1'); });\n";
    let native = h.exec("n1", &["node", "-e", js]).output().unwrap();
    assert_eq!(
        text(&native.stdout),
        "server got ping from 127.0.0.1\nclient got pong from 127.0.0.1 9465\n",
        "{}",
        text(&native.stderr)
    );
    let under = run_on(&h, &c, "p1", &["node", "-e", js]).output().unwrap();
    assert_eq!(text(&under.stdout), text(&native.stdout), "{}", text(&under.stderr));

    // The nComponent sent and received them on its stack; the stub carried them.
    let n = c.components("ncomponent").remove(0);
    let g = &n["stats"];
    assert!(
        g["datagrams_sent"].as_u64().unwrap() >= 215 && g["datagrams_received"].as_u64().unwrap() >= 215,
        "{}",
        n["stats"]
    );
    let p = c.components("pcomponent").remove(0);
    let net = &p["stats"]["net"];
    assert!(
        net["datagrams_sent"].as_u64().unwrap() >= 215 && net["datagrams_received"].as_u64().unwrap() >= 215,
        "{net}"
    );

    // Python under splitos asks a UDP server outside, and answers a client outside: each
    // side sees the other's real address.
    let py = python3();
    let mut echo = Server(
        h.exec("out", &[&py, "-c", UDP_ECHO, &out, "8761"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(read_line(&mut echo.0), "listening\n");
    let asked = run_on(&h, &c, "p1", &[&py, "-c", UDP_CLIENT, &out, "8761"])
        .output()
        .unwrap();
    assert_eq!(
        text(&asked.stdout),
        format!("QUERY 0 from {n1_out} answered by ('{out}', 8761)\n"),
        "{}",
        text(&asked.stderr)
    );
    let mut served = Server(
        run_on(&h, &c, "p1", &[&py, "-c", UDP_ECHO, "0.0.0.0", "8762"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(read_line(&mut served.0), "listening\n");
    let asking = h
        .exec("out", &[&py, "-c", UDP_CLIENT, &n1_out, "8762"])
        .output()
        .unwrap();
    let said = text(&asking.stdout);
    assert!(
        said.starts_with("QUERY ") && said.ends_with(&format!(" from {out} answered by ('{n1_out}', 8762)\n")),
        "{said}{}",
        text(&asking.stderr)
    );

    // Nobody else gets a datagram in: another user cannot send to a program's socket, and a
    // sender drops what does not come from its program (counted).
    let dir = c.dir.path().join("programs/proc0.sock.udp");
    // The earlier programs' sockets go within a second or two; then only the server's remain.
    let listing = || -> Vec<String> {
        std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    let one_socket = |names: &[String]| names.iter().filter(|n| !n.contains('-')).count() == 1;
    assert!(
        c.eventually(Duration::from_secs(10), |_| one_socket(&listing())),
        "{:?}",
        listing()
    );
    let names = listing();
    let end = dir.join(names.iter().find(|n| !n.contains('-')).expect("the server's socket"));
    let sender = dir.join(names.iter().find(|n| n.contains('-')).expect("a sender"));
    let send = "import socket, sys\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\ntry:\n    s.sendto(b'forged', sys.argv[1])\n    print('sent')\nexcept OSError as e:\n    print(e.strerror)\n";
    for target in [&end, &sender] {
        let other = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                &py,
                "-c",
                send,
                target.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert_eq!(
            text(&other.stdout),
            "Permission denied\n",
            "{}: {}",
            target.display(),
            text(&other.stderr)
        );
    }
    let before = c.components("pcomponent").remove(0)["stats"]["net"]["refused"]
        .as_u64()
        .unwrap();
    std::os::unix::net::UnixDatagram::unbound()
        .unwrap()
        .send_to(b"forged", &sender)
        .unwrap();
    assert!(
        c.eventually(Duration::from_secs(5), |c| c.components("pcomponent").remove(0)
            ["stats"]["net"]["refused"]
            .as_u64()
            .unwrap()
            > before)
    );

    // Closed sockets are forgotten: their names go, and the nComponent closes their skeletons.
    drop(served);
    assert!(
        c.eventually(Duration::from_secs(10), |_| std::fs::read_dir(&dir)
            .map(|d| d.count() == 0)
            .unwrap_or(false)),
        "{:?}",
        std::fs::read_dir(&dir).map(|d| d.map(|e| e.unwrap().file_name()).collect::<Vec<_>>())
    );
    assert!(
        c.eventually(Duration::from_secs(10), |c| c.components("ncomponent").remove(0)
            ["stats"]["open_sockets"]
            == 0),
        "{}",
        c.components("ncomponent").remove(0)["stats"]
    );
}

const BULK_CLIENT: &str = "import hashlib, socket, sys, threading\n\
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n\
peer = s.getpeername()[1]\n\
data = bytes(i * 7 % 251 for i in range(2_000_000))\n\
def send():\n    s.sendall(data)\n    s.shutdown(socket.SHUT_WR)\n\
t = threading.Thread(target=send)\nt.start()\n\
got = bytearray()\n\
while (d := s.recv(65536)):\n    got += d\n\
t.join()\n\
print(len(got), hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest(), peer)\n";

#[test]
fn programs_of_a_vnode_on_two_pcomponents_connect_directly_not_through_the_ncomponent() {
    let mut h = Hosts::new(&["gm", "p1", "p2", "m1", "n1"]);
    let (n1_out, _) = h.add_outside("n1");
    let at = |host: &str| format!("listen = \"{}:0\"\nnetns = \"{}\"\n", h.addr(host), h.netns(host));
    let cfg = format!("[cluster]\ngm = \"{}:0\"\nnetns = \"{}\"\n[[pcomponent]]\n{}[[pcomponent]]\n{}[[mcomponent]]\n{}[[ncomponent]]\n{}", h.addr("gm"), h.netns("gm"), at("p1"), at("p2"), at("m1"), at("n1"));
    let c = TestCluster::up(Some(&cfg));
    let on = |host: &str, i: usize, prog: &[&str]| {
        let sock = c.dir.path().join(format!("programs/proc{i}.sock"));
        let mut cmd = h.exec(
            host,
            &[
                splitos().to_str().unwrap(),
                "run",
                "--pcomponent",
                sock.to_str().unwrap(),
                "--",
            ],
        );
        cmd.args(prog)
            .env("SPLITOS_STATE_DIR", c.dir.path())
            .env("SPLITOS_DATA_DIR", c.dir.path().join("data"))
            .env_remove("SPLITOS_GM");
        cmd
    };
    let py = python3();
    let mut server = Server(
        on("p1", 0, &[&py, "-c", ECHO_SERVER, "0.0.0.0", "8771"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(read_line(&mut server.0), "listening\n");
    // A client of the vNode on the other pComponent, by loopback and by the nComponent's
    // address: both direct.
    for addr in ["127.0.0.1", n1_out.as_str()] {
        let out = on("p2", 1, &[&py, "-c", BULK_CLIENT, addr, "8771"]).output().unwrap();
        assert_eq!(
            text(&out.stdout),
            "2000000 True 8771\n",
            "{addr}: {}",
            text(&out.stderr)
        );
    }
    let stats = |i: usize| {
        c.components("pcomponent")
            .into_iter()
            .find(|p| p["shim_sock"].as_str().unwrap().ends_with(&format!("proc{i}.sock")))
            .unwrap()["stats"]["net"]
            .clone()
    };
    for i in [0, 1] {
        let s = &stats(i);
        assert_eq!(s["remote_shortcuts"], 2, "pComponent {i}: {s}");
        assert!(
            s["remote_shortcut_bytes"].as_u64().unwrap() >= 8_000_000,
            "pComponent {i}: {s}"
        );
    }
    let n = c.components("ncomponent").remove(0);
    assert_eq!(n["stats"]["accepts"], 0, "{}", n["stats"]);
    assert!(
        n["stats"]["ddio_received_bytes"].as_u64().unwrap() < 1 << 20,
        "{}",
        n["stats"]
    );
    // The same client not of the vNode (natively, on the nComponent's host) goes through the
    // nComponent at its address, with the same output; the vNode's loopback is not its.
    let native = h
        .exec("n1", &[&py, "-c", BULK_CLIENT, &n1_out, "8771"])
        .output()
        .unwrap();
    assert_eq!(text(&native.stdout), "2000000 True 8771\n", "{}", text(&native.stderr));
    let n = c.components("ncomponent").remove(0);
    assert_eq!(n["stats"]["accepts"], 1, "{}", n["stats"]);

    // The server's pComponent dies: once the global managers say it is lost, the client's
    // direct connection ends, as a reset one.
    let mut client = on("p2", 1, &[&py, "-c", WAIT_FOR_END, "127.0.0.1", "8771"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(read_line(&mut client), "echo: one\n");
    let recorded: Vec<i64> =
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(c.dir.path().join("cluster.json")).unwrap())
            .unwrap()["pids"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p.as_i64())
            .collect();
    for pid in h.pids("p1").into_iter().filter(|p| recorded.contains(&(*p as i64))) {
        forget_pid(c.dir.path(), pid);
        // SAFETY: kill(2) takes no pointers; the pid is the pComponent's, which this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let out = client.wait_with_output().unwrap();
    assert_eq!(
        text(&out.stdout),
        "recv: Connection reset by peer\n",
        "{}",
        text(&out.stderr)
    );
}

const WAIT_FOR_END: &str = "import socket, sys\n\
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n\
s.sendall(b'one')\n\
print('echo:', s.recv(100).decode(), flush=True)\n\
s.settimeout(60)\n\
try:\n    print('recv returned', s.recv(100), flush=True)\n\
except OSError as e:\n    print('recv:', e.strerror, flush=True)\n";

const RESETTING_SERVER: &str = "import socket, struct, sys\n\
s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n\
print('listening', flush=True)\n\
while True:\n    c, _ = s.accept()\n    c.recv(100)\n    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))\n    c.close()\n";

const RESET_CLIENT: &str = "import socket, sys, time\n\
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n\
s.sendall(b'hello')\n\
time.sleep(0.5)\n\
try:\n    print('recv returned', s.recv(100))\n\
except OSError as e:\n    print('recv:', e.strerror)\n\
print('then', s.recv(100))\n";

#[test]
fn a_connection_the_peer_resets_reads_as_reset_as_natively() {
    let (h, c, _, out) = rack();
    let py = python3();
    let mut server = Server(
        h.exec("out", &[&py, "-c", RESETTING_SERVER, &out, "8781"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert_eq!(read_line(&mut server.0), "listening\n");
    let native = h.exec("n1", &[&py, "-c", RESET_CLIENT, &out, "8781"]).output().unwrap();
    assert_eq!(
        text(&native.stdout),
        "recv: Connection reset by peer\nthen b''\n",
        "{}",
        text(&native.stderr)
    );
    let under = run_on(&h, &c, "p1", &[&py, "-c", RESET_CLIENT, &out, "8781"])
        .output()
        .unwrap();
    assert_eq!(text(&under.stdout), text(&native.stdout), "{}", text(&under.stderr));
}

#[test]
fn raw_socket_system_calls_go_through_the_stub_and_cannot_reach_another_vnodes_port() {
    let h = Hosts::new(&["p1"]);
    // One host: a listener of vNode a is a real port on this host's loopback, where a raw
    // connect that bypassed the stub would reach it.
    let cfg = format!(
        "[cluster]\ngm = \"{ip}:0\"\nnetns = \"{ns}\"\n[[pcomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[mcomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[ncomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[vnode]]\nname = \"a\"\nusers = [\"root\"]\n[[vnode]]\nname = \"b\"\nusers = [\"root\"]\n",
        ns = h.netns("p1"),
        ip = h.addr("p1")
    );
    let c = TestCluster::up(Some(&cfg));
    let raw = program("rawnet");
    let raw = raw.to_str().unwrap();
    let in_vnode = |vnode: &str, prog: &[&str]| {
        let mut cmd = h.exec("p1", &[splitos().to_str().unwrap(), "run", "--vnode", vnode, "--"]);
        cmd.args(prog)
            .env("SPLITOS_STATE_DIR", c.dir.path())
            .env("SPLITOS_DATA_DIR", c.dir.path().join("data"))
            .env_remove("SPLITOS_GM");
        cmd
    };
    // A server serves one connection and ends; the hosts end any left (their processes).
    let rest = |s: Child| text(&s.wait_with_output().unwrap().stdout);

    // Natively, on this host.
    let mut server = h
        .exec("p1", &[raw, "serve", "8731"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(read_line(&mut server), "listening on 127.0.0.1:8731\n");
    let native = h.exec("p1", &[raw, "connect", "8731"]).output().unwrap();
    assert!(native.status.success(), "{}", text(&native.stderr));
    let native_server = rest(server);

    // vNode a's server, raw calls too.
    let mut server = in_vnode("a", &[raw, "serve", "8732"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(read_line(&mut server), "listening on 127.0.0.1:8732\n");
    // vNode b's raw connect is refused, as an unreachable port is; also from an image a shell
    // forked and exec'd (the filter stays across exec; the new image's shim serves its calls).
    let b = in_vnode("b", &[raw, "connect", "8732"]).output().unwrap();
    assert_eq!(text(&b.stdout), "connect: Connection refused\n", "{}", text(&b.stderr));
    let b = in_vnode("b", &["sh", "-c", &format!("{raw} connect 8732; echo exit $?")])
        .output()
        .unwrap();
    assert_eq!(
        text(&b.stdout),
        "connect: Connection refused\nexit 1\n",
        "{}",
        text(&b.stderr)
    );
    // A statically linked copy, which the shim cannot be loaded into, keeps the filter and
    // is stopped at its first network socket (SIGSYS) rather than reach the port.
    let dir = tempfile::tempdir().unwrap();
    let fixed = dir.path().join("rawnet-static");
    assert!(Command::new("gcc")
        .args(["-O2", "-static", "-o"])
        .arg(&fixed)
        .arg(programs_src().join("rawnet.c"))
        .status()
        .unwrap()
        .success());
    let b = in_vnode(
        "b",
        &["sh", "-c", &format!("{} connect 8732; echo exit $?", fixed.display())],
    )
    .output()
    .unwrap();
    assert_eq!(
        text(&b.stdout),
        format!("exit {}\n", 128 + libc::SIGSYS),
        "{}",
        text(&b.stderr)
    );
    // vNode a's own client reaches it, output as native.
    let a = in_vnode("a", &[raw, "connect", "8732"]).output().unwrap();
    assert_eq!(text(&a.stdout), text(&native.stdout), "{}", text(&a.stderr));
    assert_eq!(rest(server), native_server);

    // The stub made the four sockets and the connections: the raw calls never reached the
    // host's stack.
    let p = c.components("pcomponent").remove(0);
    let net = &p["stats"]["net"];
    assert!(
        net["sockets"].as_u64().unwrap() >= 4 && net["connects"].as_u64().unwrap() >= 3,
        "{net}"
    );
    assert!(net["shortcuts"].as_u64().unwrap() >= 1, "{net}");
}

// ---- A program that gets around the socket stub

#[test]
fn a_program_that_gets_around_the_socket_stub_reaches_no_vnodes_loopback_server() {
    let h = Hosts::new(&["p1"]);
    // One host: the pComponent's programs and anyone logged in there share the nComponent's
    // host stack.
    let cfg = format!(
        "[cluster]\ngm = \"{ip}:0\"\nnetns = \"{ns}\"\n[[pcomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[mcomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[ncomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[vnode]]\nname = \"a\"\nusers = [\"root\"]\n[[vnode]]\nname = \"b\"\nusers = [\"root\"]\n",
        ns = h.netns("p1"),
        ip = h.addr("p1")
    );
    let c = TestCluster::up(Some(&cfg));
    let (raw, gate) = (program("rawnet"), program("gatenet"));
    let (raw, gate) = (raw.to_str().unwrap(), gate.to_str().unwrap());
    let in_vnode = |vnode: &str, prog: &[&str]| {
        let mut cmd = h.exec("p1", &[splitos().to_str().unwrap(), "run", "--vnode", vnode, "--"]);
        cmd.args(prog)
            .env("SPLITOS_STATE_DIR", c.dir.path())
            .env("SPLITOS_DATA_DIR", c.dir.path().join("data"))
            .env_remove("SPLITOS_GM");
        cmd
    };
    // vNode a's server on its loopback serves one connection, then ends.
    let mut server = in_vnode("a", &[raw, "serve", "8741"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(read_line(&mut server), "listening on 127.0.0.1:8741\n");
    // A program of vNode b that makes its socket calls through the shim's gate, and one not
    // run under splitos: the port is closed for both, as nothing listened there.
    let out = in_vnode("b", &[gate, "gate", "8741"]).output().unwrap();
    assert_eq!(
        text(&out.stdout),
        "connect: Connection refused\n",
        "{}",
        text(&out.stderr)
    );
    let out = h.exec("p1", &[gate, "raw", "8741"]).output().unwrap();
    assert_eq!(
        text(&out.stdout),
        "connect: Connection refused\n",
        "{}",
        text(&out.stderr)
    );
    // The server's one connection is its own vNode's client's.
    let own = in_vnode("a", &[raw, "connect", "8741"]).output().unwrap();
    assert!(own.status.success(), "{}", text(&own.stderr));
    let served = server.wait_with_output().unwrap();
    assert_eq!(
        text(&served.stdout),
        "accepted from 127.0.0.1\ngot: hello over raw system calls\n",
        "{}",
        text(&served.stderr)
    );
    // The nComponent put the server's socket in vNode a's loopback, and took no connection
    // on it (the client's went through the pComponent).
    let n = c.components("ncomponent").remove(0);
    assert!(n["stats"]["vnode_loopbacks"].as_u64().unwrap() >= 1, "{}", n["stats"]);
    assert_eq!(n["stats"]["accepts"], 0, "{}", n["stats"]);
}
