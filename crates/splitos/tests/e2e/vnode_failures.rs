//! A vNode's files when components fail (docs/storage.md). Writes not yet synced live in one
//! mComponent's buffer cache, with no copy elsewhere: when that mComponent is lost they are
//! gone, and the program must hear it (its next fsync fails with EIO, as Linux reports a
//! failed write back) rather than have fsync succeed on what is left. A pComponent that died
//! leaves its vNode mounts behind, dead, and must start again over them.
use crate::common;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
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

/// The kernel answers at a dead pComponent's mount point with ENOTCONN once its connection is
/// aborted (here through `/sys/fs/fuse/connections/N/abort`, as when the daemon dies), and
/// with ECONNABORTED a request that was pending at the abort (seen by a chaos run: a new
/// pComponent's look at the mount while the old one's connection went down): either way a
/// new pComponent starts over it and mounts the vNode anew.
#[test]
fn a_pcomponent_starts_again_over_the_aborted_mount_of_the_one_that_died() {
    let c = TestCluster::up(None);
    let touch = [
        "python3",
        "-c",
        "import os; d = os.environ['SPLITOS_VNODE_DIR']; open(os.path.join(d, 'x'), 'w').write('x'); print(sorted(os.listdir(d)))",
    ];
    let first = c.run(&[], &touch);
    assert_eq!(text(&first.stdout), "['x']\n", "{}", text(&first.stderr));
    let mnt = c.dir.path().join("vnodes").join("default");
    let dev = std::fs::metadata(&mnt).unwrap().dev();
    let _fusectl = Fusectl::mounted();
    std::fs::write(format!("{FUSECTL}/{dev}/abort"), "1").unwrap();
    // Past the attributes' time to live: the kernel asks the dead connection.
    std::thread::sleep(Duration::from_millis(1500));
    let dead = std::fs::metadata(&mnt).unwrap_err().raw_os_error();
    assert!(matches!(dead, Some(libc::ECONNABORTED | libc::ENOTCONN)), "{dead:?}");
    let pcomp = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    c.kill_component(c.pid_of_addr(&pcomp));
    let again = c.cmd(&["cluster", "restart", "proc0"]).output().unwrap();
    assert!(again.status.success(), "{}", text(&again.stderr));
    let second = c.run(&[], &touch);
    assert_eq!(text(&second.stdout), "['x']\n", "{}", text(&second.stderr));
}

const FUSECTL: &str = "/sys/fs/fuse/connections";

/// The FUSE control file system, mounted for the test where it was not (and unmounted after
/// it, also when it fails).
struct Fusectl(bool);

impl Fusectl {
    fn mounted() -> Fusectl {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        if mounts.lines().any(|l| l.split(' ').nth(1) == Some(FUSECTL)) {
            return Fusectl(false);
        }
        let out = std::process::Command::new("mount")
            .args(["-t", "fusectl", "fusectl", FUSECTL])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        Fusectl(true)
    }
}

impl Drop for Fusectl {
    fn drop(&mut self) {
        if self.0 {
            let _ = std::process::Command::new("umount").arg(FUSECTL).output();
        }
    }
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
