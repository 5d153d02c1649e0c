//! `splitos memcached`, the memcached on the Ebb runtime: its answers against stock memcached's,
//! real clients, its memory limit, its event loops' polling and sleeping, and bad input.
use crate::common;
use common::*;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server started for a test, ended whatever the test's outcome.
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

/// `splitos memcached` on a free port, with `args`.
fn ours(args: &[&str]) -> Server {
    let mut child = Command::new(splitos())
        .args(["memcached", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("127.0.0.1:"))
        .and_then(|p| p.parse().ok());
    let port = port.unwrap_or_else(|| panic!("splitos memcached names its port at start: {line:?}"));
    Server { child, port }
}

/// Debian's memcached, one worker thread, no UDP.
fn stock() -> Server {
    let port = restartable_port();
    let child = Command::new("memcached")
        .args([
            "-u",
            "root",
            "-U",
            "0",
            "-l",
            "127.0.0.1",
            "-t",
            "1",
            "-m",
            "64",
            "-p",
            &port.to_string(),
        ])
        .stderr(Stdio::null())
        .spawn()
        .expect("memcached is installed by scripts/setup.sh");
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "stock memcached did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    Server { child, port }
}

/// Sends `req` on a new connection and reads until the answer ends with `end` (or the
/// connection closes).
fn talk(port: u16, req: &[u8], end: &[u8]) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(req).unwrap();
    let mut all = Vec::new();
    let mut buf = [0u8; 65536];
    while !all.ends_with(end) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
        }
    }
    text(&all)
}

fn stats(port: u16) -> std::collections::HashMap<String, u64> {
    talk(port, b"stats\r\n", b"END\r\n")
        .lines()
        .filter_map(|l| l.strip_prefix("STAT "))
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect()
}

/// Debian's Python, which has Debian's pymemcache (a version manager's python3 may not).
const DEBIAN_PYTHON: &str = "/usr/bin/python3";

#[test]
fn text_and_binary_answers_match_stock_memcached() {
    let (theirs, mine) = (stock(), ours(&["--cores", "2"]));
    let transcript = |port: u16| {
        let out = Command::new(python3())
            .arg(script("memcached_conformance.py"))
            .arg(format!("127.0.0.1:{port}"))
            .output()
            .unwrap();
        assert!(out.status.success(), "conformance script: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let (want, got) = (transcript(theirs.port), transcript(mine.port));
    // A check that cannot pass vacuously: the sequence exercised both protocols.
    for seen in [
        "STORED",
        "VALUE a 5 3 c",
        "EXISTS",
        "CLIENT_ERROR bad data chunk",
        "SERVER_ERROR object too large",
        "status=0",
        "status=3",
        "Invalid arguments",
        "<closed>",
    ] {
        assert!(
            want.contains(seen),
            "stock memcached's transcript has {seen:?}:\n{want}"
        );
    }
    assert!(want.lines().count() > 100);
    for (w, g) in want.lines().zip(got.lines()) {
        assert_eq!(g, w, "first answer that differs from stock memcached's");
    }
    assert_eq!(got.lines().count(), want.lines().count());
    // The commands reached splitos's table, as its own counters say.
    let s = stats(mine.port);
    assert!(
        s["cmd_get"] > 50
            && s["cmd_set"] > 50
            && s["get_hits"] > 20
            && s["cas_badval"] >= 1
            && s["total_connections"] >= 4,
        "{s:?}"
    );
}

#[test]
fn real_memcached_clients_work_against_it() {
    let server = ours(&["--cores", "2"]);
    let addr = format!("127.0.0.1:{}", server.port);
    // libmemcached's protocol tester, both protocols.
    let cap = Command::new("memccapable")
        .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
        .output()
        .expect("memccapable (libmemcached-tools) is installed by scripts/setup.sh");
    assert!(
        cap.status.success() && text(&cap.stdout).contains("All tests passed"),
        "memccapable: {}{}",
        text(&cap.stdout),
        text(&cap.stderr)
    );
    // A file through memccp, read back with memccat over each protocol.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("payload.bin");
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&file, &payload).unwrap();
    let cp = Command::new("memccp")
        .args(["-s", &addr, file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(cp.status.success(), "memccp: {}", text(&cp.stderr));
    for proto in [&[][..], &["-b"][..]] {
        let cat = Command::new("memccat")
            .args(proto)
            .args(["-s", &addr, "payload.bin"])
            .output()
            .unwrap();
        assert!(cat.status.success(), "memccat {proto:?}: {}", text(&cat.stderr));
        assert!(
            cat.stdout.starts_with(&payload),
            "memccat {proto:?} read back what memccp stored"
        );
    }
    // memcslap, text and binary, several threads at once.
    for proto in [&[][..], &["-b"][..]] {
        let slap = Command::new("memcslap")
            .args(proto)
            .args(["-s", &addr, "-c", "4", "-e", "500", "-t", "get"])
            .output()
            .unwrap();
        assert!(
            slap.status.success() && text(&slap.stdout).contains("Time total"),
            "memcslap {proto:?}: {}{}",
            text(&slap.stdout),
            text(&slap.stderr)
        );
    }
    // pymemcache: every value it reads is the one it stored.
    let py = r#"
import sys
from pymemcache.client.base import Client
c = Client(("127.0.0.1", int(sys.argv[1])), default_noreply=False)
vals = {"k%d" % i: ("v%d" % i).encode() * (i % 50 + 1) for i in range(2000)}
assert c.set_many(vals) == []
got = c.get_many(list(vals))
assert got == vals, "get_many"
v, cas = c.gets("k7")
assert c.cas("k7", b"new", cas) is True and c.cas("k7", b"newer", cas) is False
assert c.get("k7") == b"new"
c.set("n", b"41")
assert c.incr("n", 1) == 42 and c.decr("n", 2) == 40
assert c.add("n", b"x") is False and c.replace("none", b"x") is False
assert c.touch("n", 100) is True and c.delete("n") is True and c.get("n") is None
assert int(c.stats()[b"curr_items"]) >= 2000
print("ok")
"#;
    let out = Command::new(DEBIAN_PYTHON)
        .args(["-c", py, &server.port.to_string()])
        .output()
        .unwrap();
    assert_eq!(
        text(&out.stdout).trim(),
        "ok",
        "pymemcache (python3-pymemcache, installed by scripts/setup.sh): {}",
        text(&out.stderr)
    );
    let s = stats(server.port);
    assert!(
        s["get_hits"] >= 2000 && s["cas_hits"] >= 1 && s["cas_badval"] >= 1 && s["touch_hits"] >= 1,
        "{s:?}"
    );
}

#[test]
fn a_full_memory_evicts_the_least_recently_used_items_and_stays_within_its_limit() {
    let server = ours(&["--memory", "1M", "--cores", "1"]);
    // 3,000 values of 1000 bytes: three times what 1 MiB holds.
    let mut req = Vec::new();
    for i in 0..3000 {
        req.extend_from_slice(format!("set key{i} 0 0 1000 noreply\r\n").as_bytes());
        req.extend_from_slice(&[b'a' + (i % 26) as u8; 1000]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"get key2999 key2998\r\n");
    let got = talk(server.port, &req, b"END\r\n");
    assert!(
        got.contains("VALUE key2999 0 1000\r\n") && got.contains("VALUE key2998 0 1000\r\n"),
        "the newest items are there: {}",
        &got[..got.len().min(200)]
    );
    let s = stats(server.port);
    assert!(s["evictions"] > 1000, "{s:?}");
    assert_eq!(s["limit_maxbytes"], 1 << 20);
    assert!(
        s["bytes"] <= s["limit_maxbytes"] && s["bytes"] > (1 << 20) * 3 / 4,
        "it uses its memory, not more: {s:?}"
    );
    assert_eq!(
        talk(server.port, b"get key0 key1 key2\r\n", b"END\r\n"),
        "END\r\n",
        "the oldest items were evicted"
    );
    // An item larger than a shard's share is refused with memcached's error, and the server
    // goes on.
    let big = format!("set big 0 0 100000\r\n{}\r\nget key2999\r\n", "x".repeat(100_000));
    let answer = talk(server.port, big.as_bytes(), b"END\r\n");
    assert!(
        answer.starts_with("SERVER_ERROR object too large for cache\r\nVALUE key2999"),
        "{}",
        &answer[..answer.len().min(200)]
    );
}

/// A client that pipelines far more answers than the server queues per connection (4 MiB),
/// then reads them all, or closes its sending side first: every answer comes, in order.
#[test]
fn a_client_pipelining_past_the_high_water_mark_gets_every_answer() {
    let server = ours(&["--cores", "1"]);
    let value = "v".repeat(900_000);
    assert_eq!(
        talk(
            server.port,
            format!("set big 0 0 {}\r\n{value}\r\nset small 0 0 2\r\nok\r\n", value.len()).as_bytes(),
            b"STORED\r\nSTORED\r\n"
        ),
        "STORED\r\nSTORED\r\n"
    );
    for half_close in [false, true] {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        // 20 answers of 900 KB: 18 MB, then the small one.
        s.write_all(&b"get big\r\n".repeat(20)).unwrap();
        s.write_all(b"get small\r\n").unwrap();
        if half_close {
            s.shutdown(std::net::Shutdown::Write).unwrap();
        }
        let mut all = Vec::new();
        let mut buf = vec![0u8; 1 << 20];
        while !all.ends_with(b"VALUE small 0 2\r\nok\r\nEND\r\n") {
            let n = s
                .read(&mut buf)
                .unwrap_or_else(|e| panic!("half close {half_close}: stalled after {} bytes: {e}", all.len()));
            assert!(n > 0, "half close {half_close}: closed after {} bytes", all.len());
            all.extend_from_slice(&buf[..n]);
        }
        let one = format!("VALUE big 0 {}\r\n{value}\r\nEND\r\n", value.len());
        assert_eq!(all.len(), 20 * one.len() + "VALUE small 0 2\r\nok\r\nEND\r\n".len());
        assert!(all.starts_with(one.as_bytes()));
    }
}

/// CPU seconds a process has used.
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<u64> = after.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    // utime and stime are fields 14 and 15; `after` starts at field 3.
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (f[11] + f[12]) as f64 / hz
}

#[test]
fn its_event_loops_poll_under_load_and_sleep_at_rest() {
    let server = ours(&["--cores", "2", "--poll-above", "2000", "--sleep-below", "500"]);
    let addr = format!("127.0.0.1:{}", server.port);
    let before = stats(server.port);
    assert_eq!(before["ebb_loop_switches_to_poll"], 0, "no load yet: {before:?}");
    let slap = Command::new("memcslap")
        .args(["-s", &addr, "-c", "4", "-e", "20000", "-t", "get"])
        .output()
        .unwrap();
    assert!(slap.status.success(), "memcslap: {}", text(&slap.stderr));
    let loaded = stats(server.port);
    assert!(
        loaded["ebb_loop_switches_to_poll"] >= 1,
        "the loops polled under load: {loaded:?}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let rested = stats(server.port);
    assert!(rested["ebb_loop_switches_to_sleep"] >= 1, "{rested:?}");
    // At rest the loops sleep in epoll: two seconds cost next to no CPU. The `stats` call
    // itself wakes one loop, so its polling may show; it stops within a window.
    std::thread::sleep(Duration::from_millis(200));
    let t0 = cpu_seconds(server.pid());
    std::thread::sleep(Duration::from_secs(2));
    let idle = cpu_seconds(server.pid()) - t0;
    assert!(idle < 0.05, "{idle} s of CPU in 2 s at rest");
    // The knob does what it says: loops told always to poll hold a CPU each at rest.
    let polling = ours(&["--cores", "1", "--waiting", "poll"]);
    std::thread::sleep(Duration::from_millis(300));
    let t0 = cpu_seconds(polling.pid());
    std::thread::sleep(Duration::from_secs(1));
    let busy = cpu_seconds(polling.pid()) - t0;
    // Well above the sleeping server's, with room for the other tests sharing the CPUs.
    assert!(busy > 0.2, "an always-polling loop used {busy} s of CPU in 1 s");
    assert_eq!(stats(polling.port)["ebb_loops_polling"], 1);
}

#[test]
fn garbage_closes_only_its_own_connection_and_bad_options_are_refused() {
    let server = ours(&["--cores", "1"]);
    let mut good = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    good.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let ask = |s: &mut std::net::TcpStream, req: &[u8]| {
        s.write_all(req).unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).unwrap();
        text(&buf[..n])
    };
    assert_eq!(ask(&mut good, b"set k 0 0 2\r\nok\r\n"), "STORED\r\n");
    // A line that never ends.
    assert_eq!(
        talk(server.port, &[b'x'; 5000], b"\n"),
        "CLIENT_ERROR line too long\r\n"
    );
    // A binary header announcing a body of 4 GiB: refused on its header, as memcached does,
    // without waiting for (or holding) the body. And one whose key overruns its body.
    let mut huge = vec![0x80u8, 0x01, 0, 1, 8, 0, 0, 0, 0xff, 0xff, 0xff, 0xff];
    huge.resize(24 + 8, 0);
    huge.push(b'z');
    assert!(talk(server.port, &huge, b"Too large.").ends_with("Too large."));
    let mut overrun = vec![0x80u8, 0x00, 0, 200, 0, 0, 0, 0, 0, 0, 0, 10];
    overrun.resize(34, b'k');
    assert_eq!(talk(server.port, &overrun, b"\xff"), "");
    // Random bytes.
    let noise: Vec<u8> = (0..20_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let _ = talk(server.port, &noise, b"\xff\xff\xff");
    assert_eq!(
        ask(&mut good, b"get k\r\n"),
        "VALUE k 0 2\r\nok\r\nEND\r\n",
        "the other connection is served all along"
    );
    for (args, says) in [
        (&["--cores", "0"][..], "--cores"),
        (&["--memory", "1K"][..], "--memory"),
        (&["--listen", "nowhere"][..], "--listen"),
        (&["--poll-above", "10", "--sleep-below", "20"][..], "--sleep-below"),
        (&["--waiting", "sometimes"][..], "sometimes"),
    ] {
        let out = Command::new(splitos()).arg("memcached").args(args).output().unwrap();
        assert!(
            !out.status.success() && text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}
