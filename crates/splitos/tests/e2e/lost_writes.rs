//! Writes to a vNode's file not yet synced live in one mComponent's buffer cache, with no
//! copy elsewhere (docs/storage.md): when that mComponent is lost they are gone, and the
//! program must hear it (its next fsync fails with EIO, as Linux reports a failed write back)
//! rather than have fsync succeed on what is left.
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
