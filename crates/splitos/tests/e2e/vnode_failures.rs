//! A vNode's files and sockets when components fail (docs/storage.md, docs/network.md). Writes not yet synced live in one
//! mComponent's buffer cache, with no copy elsewhere: when that mComponent is lost they are
//! gone, and the program must hear it (its next fsync fails with EIO, as Linux reports a
//! failed write back) rather than have fsync succeed on what is left. A program's reads
//! of them land in its heap pages even when another program's misses evict those pages.
use crate::common;
use std::io::Write;
use std::time::Duration;

use common::*;

const WRITER: &str = r#"
import os, sys
fd = os.open(os.path.join(os.environ["SPLITOS_VNODE_DIR"], "lost"), os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o644)
os.write(fd, b"a" * 4096)
os.fsync(fd)
print("synced", flush=True)
sys.stdin.readline()
os.write(fd, b"b" * 65536)
print("written", flush=True)
sys.stdin.readline()
for what in ("fsync", "fsync again"):
    try:
        os.fsync(fd)
        print(what, "ok")
    except OSError as e:
        print(what, e.strerror)
"#;

#[test]
fn writes_lost_with_their_buffer_cache_fail_the_next_fsync_with_eio() {
    let c = TestCluster::up(Some(
        "[cluster]\nreclaim_dead_ms = 2000\nforget_dead_ms = 60000\n[[pcomponent]]\n[[mcomponent]]\n[[mcomponent]]\n[[mcomponent]]\n[[scomponent]]\n",
    ));
    let mut w = c.spawn(&[], &["python3", "-c", WRITER]);
    assert_eq!(read_line(&mut w), "synced\n");
    // The sComponent paused: the buffer cache can write nothing back, so what is written now
    // stays in it alone.
    let storage = c.components("scomponent")[0]["addr"].as_str().unwrap().to_string();
    let paused = Stalled::new(c.pid_of_addr(&storage));
    writeln!(w.stdin.as_mut().unwrap()).unwrap();
    assert_eq!(read_line(&mut w), "written\n");
    let holder = c
        .components("mcomponent")
        .into_iter()
        .find(|m| m["stats"]["buffer_cache"]["dirty_blocks"].as_u64().unwrap_or(0) > 0)
        .expect("a buffer cache holds the unsynced writes")["addr"]
        .as_str()
        .unwrap()
        .to_string();
    c.kill_component(c.pid_of_addr(&holder));
    assert!(
        c.eventually(Duration::from_secs(20), |c| c
            .components_now("mcomponent")
            .iter()
            .any(|m| m["addr"] == holder.as_str() && m["alive"] == false)),
        "the managers hold the buffer cache's mComponent lost"
    );
    drop(paused);
    // Until the managers hear the sComponent again they answer that none is alive, and the
    // fsyncs below would fail for that.
    assert!(
        c.eventually(Duration::from_secs(20), |c| c
            .components_now("scomponent")
            .iter()
            .any(|s| s["addr"] == storage.as_str() && s["alive"] == true)),
        "the sComponent is heard again"
    );
    writeln!(w.stdin.as_mut().unwrap()).unwrap();
    drop(w.stdin.take());
    let out = w.wait_with_output().unwrap();
    // Reported once: the next fsync finds the file as it is now, durable.
    assert_eq!(
        text(&out.stdout),
        "fsync Input/output error\nfsync again ok\n",
        "{}",
        text(&out.stderr)
    );
    let pcomp = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    assert!(
        c.log("proc0").contains("lost with writes not yet synced"),
        "{pcomp}: {}",
        c.log("proc0")
    );
}

/// Reads a durable 4 MiB vNode file 30 times into fresh heap buffers while its heap grows,
/// and counts the reads that did not return what the file holds.
const READER: &str = r#"
import hashlib, os, tempfile
want = b"".join(hashlib.sha256(str(i).encode()).digest() * 2048 for i in range(64))
with tempfile.TemporaryDirectory(dir=os.environ["SPLITOS_VNODE_DIR"]) as t:
    p = os.path.join(t, "f")
    with open(p, "wb") as f:
        f.write(want)
        os.fsync(f.fileno())
    bad, junk = 0, []
    for r in range(30):
        junk.append(bytes([r + 1]) * (1 << 20))
        with open(p, "rb") as f:
            bad += f.read() != want
    print("bad reads:", bad)
"#;

/// The vNode's files are read with direct I/O: the kernel pins the program's buffer when the
/// read starts and the pComponent's answer is copied into it later. Two programs whose misses
/// evict each other's pages (a 16 MiB ExCache for both) read what the file holds every time:
/// the shim reads FUSE files into heap buffers through memory outside the heap region. Before,
/// about one read in ten returned what the buffer's memory had held before.
#[test]
fn reads_of_vnode_files_into_heap_pages_evicted_meanwhile_return_the_files_bytes() {
    let c = TestCluster::up(Some(
        "[cluster]\nvregion_size = \"4M\"\n[[pcomponent]]\nexcache = \"16M\"\n[[mcomponent]]\n[[mcomponent]]\n[[scomponent]]\n",
    ));
    let readers: Vec<_> = (0..2)
        .map(|_| c.spawn(&["--quiet"], &["python3", "-c", READER]))
        .collect();
    for r in readers {
        let out = r.wait_with_output().unwrap();
        assert_eq!(text(&out.stdout), "bad reads: 0\n", "{}", text(&out.stderr));
    }
    let pcomp = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    assert!(
        c.metric(&pcomp, "splitos_pcomp_bg_evictions_total") + c.metric(&pcomp, "splitos_pcomp_inline_evictions_total")
            > 0.0,
        "the programs evicted each other's pages"
    );
}

/// Kills the cluster's only manager (at `gm`), tells program `p` to go on (a line on its
/// stdin), starts the manager again 3 s later, and returns what `p` printed.
fn go_on_while_the_only_manager_restarts(
    c: &TestCluster,
    gm: &str,
    mut p: std::process::Child,
) -> std::process::Output {
    c.kill_component(c.pid_of_addr(gm));
    writeln!(p.stdin.as_mut().unwrap()).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let again = c.cmd(&["cluster", "restart", "gm"]).output().unwrap();
    assert!(again.status.success(), "{}", text(&again.stderr));
    p.wait_with_output().unwrap()
}

/// A new file written while the cluster's only manager is down: its buffer cache must be
/// placed by the managers, and the write waits for them (as heap calls and starts do) instead
/// of failing with EIO at once.
#[test]
fn a_file_written_while_the_only_manager_restarts_waits_for_it_and_reads_back() {
    const NEW_FILE: &str = r#"
import os, sys
print("ready", flush=True)
sys.stdin.readline()
path = os.path.join(os.environ["SPLITOS_VNODE_DIR"], "while-down")
with open(path, "wb") as f:
    f.write(b"x" * 100000)
    f.flush()
    os.fsync(f.fileno())
with open(path, "rb") as f:
    print(len(f.read()), "bytes read back")
"#;
    let c = TestCluster::up(Some("[[pcomponent]]\n[[mcomponent]]\n[[scomponent]]\n"));
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let mut w = c.spawn(&[], &["python3", "-c", NEW_FILE]);
    assert_eq!(read_line(&mut w), "ready\n");
    let out = go_on_while_the_only_manager_restarts(&c, &gm, w);
    assert_eq!(text(&out.stdout), "100000 bytes read back\n", "{}", text(&out.stderr));
    let pcomp = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    assert!(
        c.metric(&pcomp, "splitos_pcomp_file_calls_waited_for_managers_total") >= 1.0,
        "the file call waited for the manager"
    );
}

/// A program's first socket of its vNode, made while the cluster's only manager is down: the
/// pComponent asks the managers where the vNode's sockets are served, and waits for them (as
/// a file's or a heap's call does) instead of failing the call with ENETDOWN at once. (Found
/// by `splitos chaos`: loadgen's connect to memcached during a `kill-gm`.)
#[test]
fn a_socket_made_while_the_only_manager_restarts_waits_for_it_and_connects() {
    const PING: &str = r#"
import socket, sys
print("ready", flush=True)
sys.stdin.readline()
l = socket.create_server(("127.0.0.1", 0))
c = socket.create_connection(l.getsockname())
a, _ = l.accept()
c.sendall(b"ping")
print(a.recv(4).decode(), "over loopback")
"#;
    let c = TestCluster::up(None);
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let mut p = c.spawn(&[], &["python3", "-c", PING]);
    assert_eq!(read_line(&mut p), "ready\n");
    let out = go_on_while_the_only_manager_restarts(&c, &gm, p);
    assert_eq!(text(&out.stdout), "ping over loopback\n", "{}", text(&out.stderr));
    let pcomp = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    assert!(
        c.metric(&pcomp, "splitos_pcomp_net_calls_waited_for_managers_total") >= 1.0,
        "the socket call waited for the manager"
    );
}
