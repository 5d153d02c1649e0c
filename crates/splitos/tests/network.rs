//! The network component: programs on a pComponent whose host has no route out use TCP
//! through an nComponent, which alone is linked to the outside (network namespaces as hosts,
//! `common::Hosts`). Programs nobody on the team wrote (curl, python3 -m http.server, Node.js)
//! on both ends, output compared with native runs, counters read at the nComponent.
mod common;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A rack of four hosts (global managers, pComponent, mComponent, nComponent) and the
/// outside, linked to the nComponent's host alone. Returns the hosts, the cluster, the
/// nComponent's address on the outside link and the outside host's.
fn rack() -> (Hosts, TestCluster, String, String) {
    let mut h = Hosts::new(&["gm", "p1", "m1", "n1"]);
    let (n1_out, out) = h.add_outside("n1");
    let at = |host: &str| format!("listen = \"{}:0\"\nnetns = \"{}\"\n", h.addr(host), h.netns(host));
    let cfg = format!(
        "[cluster]\ngm = \"{}:0\"\nnetns = \"{}\"\n[[pcomponent]]\n{}[[mcomponent]]\n{}[[ncomponent]]\n{}",
        h.addr("gm"),
        h.netns("gm"),
        at("p1"),
        at("m1"),
        at("n1")
    );
    let c = TestCluster::up(Some(&cfg));
    (h, c, n1_out, out)
}

/// `splitos run` on host `host` of the cluster.
fn run_on(h: &Hosts, c: &TestCluster, host: &str, prog: &[&str]) -> Command {
    let mut cmd = h.exec(host, &[splitos().to_str().unwrap(), "run", "--"]);
    cmd.args(prog).env("SPLITOS_STATE_DIR", c.dir.path()).env("SPLITOS_DATA_DIR", c.dir.path().join("data")).env_remove("SPLITOS_GM");
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
    let _outside = serve(h.exec("out", &[&py, "-m", "http.server", "8701", "--bind", &out, "--directory", d]));
    let url = format!("http://{out}:8701/data.bin");
    assert_eq!(fetch_when_up(&h, "n1", &url), body, "the nComponent's host reaches the outside");
    let direct = h.exec("p1", &["curl", "-s", "-m", "3", &url]).output().unwrap();
    assert!(!direct.status.success(), "the pComponent's host has no route out");

    // curl under splitos on that host gets the file, through the nComponent.
    let got = run_on(&h, &c, "p1", &["curl", "-sS", &url]).output().unwrap();
    assert!(got.status.success(), "curl under splitos: {}", text(&got.stderr));
    assert!(got.stdout == body, "curl under splitos got {} bytes of {}", got.stdout.len(), body.len());

    // A server under splitos on that host is reached from the outside at the nComponent's
    // address: Python's, then Node.js's.
    let _py_server = serve(run_on(&h, &c, "p1", &[&py, "-m", "http.server", "8702", "--bind", "0.0.0.0", "--directory", d]));
    assert_eq!(fetch_when_up(&h, "out", &format!("http://{n1_out}:8702/data.bin")), body);
    let js = "require('http').createServer((q, r) => r.end('node saw ' + q.method + ' ' + q.url + '\\n')).listen(8703)";
    let _node = serve(run_on(&h, &c, "p1", &["node", "-e", js]));
    assert_eq!(text(&fetch_when_up(&h, "out", &format!("http://{n1_out}:8703/hello?x=1"))), "node saw GET /hello?x=1\n");

    // The nComponent ran the sockets: its own counters say so (it received the file curl
    // fetched and sent the one the server served).
    let n = c.components("ncomponent").remove(0);
    let s = &n["stats"];
    assert!(s["connects"].as_u64().unwrap() >= 1 && s["accepts"].as_u64().unwrap() >= 2, "{s}");
    assert!(s["bytes_received"]["ddio"].as_u64().unwrap() >= body.len() as u64, "{s}");
    assert!(s["bytes_sent"]["ddio"].as_u64().unwrap() >= body.len() as u64, "{s}");
    assert!(n["nics"].as_array().unwrap().iter().any(|ip| ip == &n1_out), "the nComponent registered its outside address: {n}");
}

#[test]
fn the_socket_calls_of_a_c_program_behave_as_natively() {
    let (h, c, _, _) = rack();
    let prog = program("sockets");
    let cmd = [prog.to_str().unwrap(), "127.0.0.1", "9"];
    // Natively on the nComponent's host, whose stack the program's sockets use under splitos.
    let native = h.exec("n1", &cmd).output().unwrap();
    assert!(native.status.success(), "{}", text(&native.stdout));
    let under = run_on(&h, &c, "p1", &cmd).output().unwrap();
    assert_eq!(text(&under.stdout), text(&native.stdout), "{}", text(&under.stderr));
    let p = c.components("pcomponent").remove(0);
    let net = &p["stats"]["net"];
    assert!(net["bytes_sent"].as_u64().unwrap() >= 8 << 20 && net["connects"].as_u64().unwrap() >= 4, "{net}");
}
