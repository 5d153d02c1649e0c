//! Storage end to end: the sComponent, the buffer cache on mComponents and the vNode mount on
//! the pComponent, each its own process, exercised by unmodified programs (bash, coreutils,
//! tar, sqlite3, git, Python) whose output is compared with the same steps on a local
//! directory.
use crate::common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The steps a user would take on a file system; `$1` is the directory to take them in.
fn workload() -> String {
    let r = repo();
    format!(
        r##"set -e
cd "$1"
python3 {fsops} .
mkdir src
tar -C {crates} -cf - rpc shim-abi | tar -C src -xf -
(cd src && find . -type f | LC_ALL=C sort | xargs md5sum && find . | LC_ALL=C sort)
tar -C src -cf tree.tar .
mkdir back && tar -C back -xf tree.tar && diff -r src back && echo "untar round trip identical"
tar -tvf tree.tar | awk '{{print $1, $3, $6}}' | LC_ALL=C sort
sqlite3 db.sqlite "CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);
BEGIN; WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < 5000) INSERT INTO t SELECT i, printf('v%05d', i*7919 % 5000) FROM c; COMMIT;
BEGIN; DELETE FROM t WHERE k % 3 = 0; ROLLBACK;
BEGIN; UPDATE t SET v = 'changed' WHERE k < 10; COMMIT;
CREATE INDEX tv ON t(v);
SELECT count(*), min(v), max(v) FROM t; PRAGMA integrity_check;"
sqlite3 db.sqlite "SELECT count(*) FROM t WHERE v = 'changed';"
git init -q repo
cp -r src/rpc repo/
cd repo
git add .
git -c user.email=t@example.com -c user.name=t commit -q -m first
echo "# changed" >> rpc/Cargo.toml
git -c user.email=t@example.com -c user.name=t commit -q -am second
git log --format=%s
git ls-files | wc -l
git status --porcelain
git fsck --no-progress 2>&1
git gc -q --prune=now && git count-objects -v | grep -E '^(count|in-pack)'
cd ..
python3 {fsx} . 11 2500 700000
"##,
        fsops = script("fsops.py"),
        fsx = script("fsx.py"),
        crates = r.join("crates").display()
    )
}

fn run_script(c: &TestCluster, opts: &[&str], body: &str, dir_expr: &str) -> Output {
    let f = c.dir.path().join(format!("script-{}.sh", std::process::id()));
    std::fs::write(&f, body).unwrap();
    let wrapper = format!("bash {} \"{dir_expr}\"", f.display());
    let mut cmd = c.cmd(&["run"]);
    cmd.args(opts).args(["--", "bash", "-c", &wrapper]);
    cmd.output().unwrap()
}

/// stats of every mComponent's buffer cache.
fn bcache_stats(c: &TestCluster) -> Vec<serde_json::Value> {
    c.components("mcomponent")
        .iter()
        .map(|m| m["stats"]["buffer_cache"].clone())
        .collect()
}

#[test]
fn unmodified_programs_on_a_vnode_mount_match_a_local_directory() {
    // Small buffer caches, so that blocks are evicted and written back during the run.
    let c = TestCluster::up(Some(
        "[[pcomponent]]\n[[mcomponent]]\nbcache = \"256K\"\n[[mcomponent]]\nbcache = \"256K\"\n[[scomponent]]\n",
    ));
    let local = tempfile::tempdir().unwrap();
    let body = workload();
    let native = Command::new("bash")
        .arg("-c")
        .arg(&body)
        .arg("workload")
        .arg(local.path())
        .output()
        .unwrap();
    assert!(
        native.status.success(),
        "the workload fails natively: {}",
        text(&native.stderr)
    );
    let out = run_script(&c, &[], &body, "$SPLITOS_VNODE_DIR");
    assert_eq!(
        text(&out.stdout),
        text(&native.stdout),
        "stderr under splitos:\n{}",
        text(&out.stderr)
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("fsx: 2500 operations matched the model"));

    let caches = bcache_stats(&c);
    let total = |k: &str| caches.iter().map(|s| s[k].as_u64().unwrap_or(0)).sum::<u64>();
    assert!(
        total("evictions") > 0 && total("writebacks") > 0 && total("misses") > 0,
        "the buffer caches were exercised: {caches:?}"
    );
    assert!(
        caches.iter().all(|s| s["blocks"].as_u64().unwrap() <= 64),
        "no cache holds more than its 256 KiB: {caches:?}"
    );
}

/// A component process this test started; killed by PID when the test ends, also on failure.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pid_of(c: &TestCluster, arg: &str) -> i32 {
    *c.state_pids()
        .iter()
        .find(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|cl| cl.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
        })
        .unwrap_or_else(|| panic!("no component process with {arg}"))
}

fn py(c: &TestCluster, opts: &[&str], code: &str) -> Output {
    let mut cmd = c.cmd(&["run"]);
    cmd.args(opts).args(["--", "python3", "-c", code]);
    cmd.output().unwrap()
}

#[test]
fn fsynced_data_survives_kill_9_of_the_scomponent_which_is_eio_until_restarted() {
    let port = restartable_port();
    let store = tempfile::tempdir().unwrap();
    let cfg = format!(
        "[[pcomponent]]\n[[mcomponent]]\n[[mcomponent]]\n[[scomponent]]\nlisten = \"127.0.0.1:{port}\"\ndir = \"{}\"\n",
        store.path().display()
    );
    let c = TestCluster::up(Some(&cfg));
    let write = r#"
import os
d = os.environ["SPLITOS_VNODE_DIR"]
os.makedirs(d + "/keep", exist_ok=True)
fd = os.open(d + "/keep/durable", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, b"acknowledged by fsync\n" * 1000)
os.fsync(fd)
os.close(fd)
print("written")
"#;
    let out = py(&c, &[], write);
    assert_eq!(text(&out.stdout), "written\n", "{}", text(&out.stderr));

    c.kill_component(pid_of(&c, "storage"));

    let probe = r#"
import errno, os
d = os.environ["SPLITOS_VNODE_DIR"]
for what, f in (("listdir", lambda: os.listdir(d + "/keep")), ("create", lambda: open(d + "/new-file", "w"))):
    try:
        f()
        print(what, "ok")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
"#;
    let out = py(&c, &[], probe);
    assert_eq!(
        text(&out.stdout),
        "listdir EIO\ncreate EIO\n",
        "programs see EIO while the sComponent is down: {}",
        text(&out.stderr)
    );

    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let log = std::fs::File::create(c.dir.path().join("storage-restarted.log")).unwrap();
    let _restarted = Proc(
        Command::new(splitos())
            .args([
                "storage",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--gm",
                &gm,
                "--dir",
            ])
            .arg(store.path())
            .arg("--credentials")
            .arg(c.issue("scomponent"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    assert!(
        c.eventually(Duration::from_secs(10), |c| c
            .components("scomponent")
            .iter()
            .any(|s| s["alive"] == true && s["stats"].is_object())),
        "the sComponent re-registered"
    );

    let check = r#"
import hashlib, os
d = os.environ["SPLITOS_VNODE_DIR"]
print(sorted(os.listdir(d + "/keep")), open(d + "/keep/durable", "rb").read() == b"acknowledged by fsync\n" * 1000)
open(d + "/after", "w").write("recovered\n")
print(open(d + "/after").read(), end="")
"#;
    let out = py(&c, &[], check);
    assert_eq!(
        text(&out.stdout),
        "['durable'] True\nrecovered\n",
        "{}",
        text(&out.stderr)
    );
}

/// Writes the bytes of the local file `argv[1]` to `$SPLITOS_VNODE_DIR/durable`: one block,
/// then "started" and a wait for a line with the PID of a component; the rest, fsync,
/// "synced", and kill -9 of that component at once, so that the test finds out what fsync
/// made durable before a background write back could hide a broken fsync. Then it keeps the
/// file open until stdin closes.
const WRITE_AND_FSYNC: &str = r#"
import os, signal, sys
data = memoryview(open(sys.argv[1], "rb").read())
fd = os.open(os.environ["SPLITOS_VNODE_DIR"] + "/durable", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
done = os.write(fd, data[:4096])
print("started", flush=True)
victim = int(sys.stdin.readline())
while done < len(data):
    done += os.write(fd, data[done:done + 65536])
os.fsync(fd)
print("synced", flush=True)
os.kill(victim, signal.SIGKILL)
sys.stdin.read()
os.close(fd)
"#;

/// A `splitos run` of the writer; killed when dropped (the test failed) if still running.
fn start_writer(c: &TestCluster, src: &Path) -> Proc {
    let mut w = Proc(c.spawn(&[], &["python3", "-c", WRITE_AND_FSYNC, src.to_str().unwrap()]));
    assert_eq!(read_line(&mut w.0), "started\n");
    w
}

/// Waits up to 20 s for a `splitos run` to end; returns its status and stderr.
fn finished(w: &mut Proc) -> (std::process::ExitStatus, String) {
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(20) {
        if let Some(st) = w.0.try_wait().unwrap() {
            let mut err = String::new();
            w.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
            return (st, err);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the writer did not end");
}

/// 3 MiB and part of a block of pseudo-random bytes (no two blocks alike, so a block at a wrong
/// offset shows), written to a local file.
fn durable_content(c: &TestCluster) -> (PathBuf, Vec<u8>) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..(3 << 20) + 1234)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let p = c.dir.path().join("durable.expected");
    std::fs::write(&p, &data).unwrap();
    (p, data)
}

/// The file as a program on the vNode mount reads it (cat), copied to a local file.
fn read_back(c: &TestCluster) -> Vec<u8> {
    let out = c.dir.path().join("durable.read");
    let _ = std::fs::remove_file(&out);
    let r = c.run(
        &[],
        &[
            "bash",
            "-c",
            "cat \"$SPLITOS_VNODE_DIR/durable\" > \"$0\"",
            out.to_str().unwrap(),
        ],
    );
    assert!(r.status.success(), "reading the file back: {}", text(&r.stderr));
    std::fs::read(&out).unwrap()
}

/// The file's bytes as the sComponent stores them, read past every cache.
fn stored_on_scomponent(c: &TestCluster) -> Vec<u8> {
    use splitos_rpc::{M2S_READ, P2S_LOOKUP};
    let s = c.components("scomponent")[0]["addr"].as_str().unwrap().to_string();
    let client = c.admin_rpc();
    let attr = match client.call(
        &s,
        P2S_LOOKUP {
            vnode: "default".into(),
            path: "/durable".into(),
        },
    ) {
        Ok(r) => r.attr,
        other => panic!("the sComponent has no /durable: {other:?}"),
    };
    let mut out = Vec::new();
    while (out.len() as u64) < attr.size {
        match client.call(
            &s,
            M2S_READ {
                vnode: "default".into(),
                ino: attr.ino,
                offset: out.len() as u64,
                len: 1 << 20,
            },
        ) {
            Ok(r) if !r.data.is_empty() => out.extend_from_slice(&r.data),
            other => panic!("reading /durable at {} of {} bytes: {other:?}", out.len(), attr.size),
        }
    }
    out
}

fn same_bytes(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    assert!(
        first.is_none(),
        "{what}: bytes differ from offset {}",
        first.unwrap_or(0)
    );
}

/// The global managers count the component at `addr` alive, and it answers.
fn serving(c: &TestCluster, role: &str, addr: &str) -> bool {
    c.components(role)
        .iter()
        .any(|m| m["addr"] == addr && m["alive"] == true && m["stats"].is_object())
}

/// The global managers count the component at `addr` dead (they place nothing on it).
fn seen_dead(c: &TestCluster, role: &str, addr: &str) -> bool {
    c.components(role)
        .iter()
        .any(|m| m["addr"] == addr && m["alive"] == false)
}

#[test]
fn fsynced_data_survives_kill_9_of_the_mcomponent_holding_its_buffer_cache() {
    // Fixed ports, so that the killed mComponent can come back at its address.
    let m0 = restartable_port();
    let m1 = std::iter::repeat_with(restartable_port).find(|p| *p != m0).unwrap();
    let c = TestCluster::up(Some(&format!("[[pcomponent]]\n[[mcomponent]]\nlisten = \"127.0.0.1:{m0}\"\n[[mcomponent]]\nlisten = \"127.0.0.1:{m1}\"\n[[scomponent]]\n")));
    let (src, want) = durable_content(&c);
    let mut writer = start_writer(&c, &src);

    // The one mComponent whose buffer cache holds the file (the other has seen no file).
    let mcomps = c.components("mcomponent");
    let (holders, others): (Vec<_>, Vec<_>) = mcomps
        .iter()
        .partition(|m| m["stats"]["buffer_cache"]["files"].as_u64().unwrap() > 0);
    assert_eq!(
        (holders.len(), others.len()),
        (1, 1),
        "one buffer cache holds the file: {mcomps:?}"
    );
    assert!(
        holders[0]["stats"]["buffer_cache"]["blocks"].as_u64().unwrap() > 0,
        "{mcomps:?}"
    );
    let holder = holders[0]["addr"].as_str().unwrap().to_string();
    let survivor = others[0]["addr"].as_str().unwrap().to_string();

    // The writer kills it as its fsync returns (out of the cluster's PID record first).
    let pid = c.pid_of_addr(&holder);
    forget_pid(c.dir.path(), pid);
    writeln!(writer.0.stdin.as_mut().unwrap(), "{pid}").unwrap();
    assert_eq!(read_line(&mut writer.0), "synced\n");
    assert!(
        c.eventually(Duration::from_secs(5), |_| !pid_running(pid)),
        "the mComponent survived kill -9"
    );
    drop(writer.0.stdin.take());
    // The writer's memory may have been on the killed mComponent too: its end is not checked.
    finished(&mut writer);
    assert!(
        c.eventually(Duration::from_secs(10), |c| seen_dead(c, "mcomponent", &holder)),
        "the global managers see the mComponent dead"
    );

    // Read through the surviving mComponent, which had none of the file: from the sComponent.
    same_bytes(&stored_on_scomponent(&c), &want, "on the sComponent");
    same_bytes(
        &read_back(&c),
        &want,
        "read back after kill -9 of the buffer cache's mComponent",
    );
    let cache = &c
        .components("mcomponent")
        .into_iter()
        .find(|m| m["addr"] == survivor.as_str())
        .unwrap()["stats"]["buffer_cache"];
    assert!(
        cache["files"].as_u64().unwrap() > 0 && cache["misses"].as_u64().unwrap() > 0,
        "the survivor took the file over: {cache}"
    );

    // The killed mComponent comes back at its address; the file reads the same.
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let log = std::fs::File::create(c.dir.path().join("mem-restarted.log")).unwrap();
    let _restarted = Proc(
        Command::new(splitos())
            .args(["mem", "--listen", &holder, "--gm", &gm])
            .arg("--credentials")
            .arg(c.issue("mcomponent"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    assert!(
        c.eventually(Duration::from_secs(10), |c| serving(c, "mcomponent", &holder)),
        "the mComponent re-registered"
    );
    same_bytes(&read_back(&c), &want, "read back after the mComponent's restart");
}

#[test]
fn fsynced_data_survives_kill_9_of_the_pcomponent() {
    let c = TestCluster::up(None);
    let (src, want) = durable_content(&c);
    // The writer kills the pComponent as its fsync returns (out of the cluster's PID record
    // first), and keeps running with the file open, as a program would when that happens.
    let mut writer = start_writer(&c, &src);
    let old = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let pid = pid_of(&c, "proc");
    forget_pid(c.dir.path(), pid);
    writeln!(writer.0.stdin.as_mut().unwrap(), "{pid}").unwrap();
    assert_eq!(read_line(&mut writer.0), "synced\n");
    // At once, before a background write back: what fsync acknowledged is on the sComponent.
    same_bytes(&stored_on_scomponent(&c), &want, "on the sComponent");
    assert!(
        c.eventually(Duration::from_secs(5), |_| !pid_running(pid)),
        "the pComponent survived kill -9"
    );
    // `run` stops the program of a pComponent that is gone, naming it.
    let (st, err) = finished(&mut writer);
    assert!(!st.success() && err.contains(&old), "{err}");

    // A new pComponent, started as `cluster up` starts one, mounts the vNode again.
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let (sock, vnodes) = (c.dir.path().join("proc-restarted.sock"), c.dir.path().join("vnodes"));
    let log = std::fs::File::create(c.dir.path().join("proc-restarted.log")).unwrap();
    let _restarted = Proc(
        Command::new(splitos())
            .args(["proc", "--gm", &gm, "--shim-sock"])
            .arg(&sock)
            .arg("--vnode-root")
            .arg(&vnodes)
            .arg("--credentials")
            .arg(c.issue("pcomponent"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let only_the_new_one = |c: &TestCluster| {
        let live: Vec<_> = c
            .components("pcomponent")
            .into_iter()
            .filter(|p| p["alive"] == true)
            .collect();
        live.len() == 1 && live[0]["addr"] != old.as_str() && live[0]["stats"].is_object()
    };
    assert!(
        c.eventually(Duration::from_secs(10), only_the_new_one),
        "the new pComponent serves, the killed one is seen dead"
    );
    same_bytes(&read_back(&c), &want, "read back after kill -9 of the pComponent");
}

#[test]
fn one_vnode_never_sees_another_vnodes_files() {
    let c = TestCluster::up(None);
    let a = c.run(
        &["--vnode", "alpha", "--create-vnode"],
        &[
            "bash",
            "-c",
            "echo secret > $SPLITOS_VNODE_DIR/only-alpha && mkdir $SPLITOS_VNODE_DIR/dir && echo $SPLITOS_VNODE_DIR",
        ],
    );
    assert!(a.status.success(), "{}", text(&a.stderr));
    let alpha_dir = text(&a.stdout).trim().to_string();
    let b = c.run(
        &["--vnode", "beta", "--create-vnode"],
        &["bash", "-c", "echo $SPLITOS_VNODE_DIR; ls -A $SPLITOS_VNODE_DIR | wc -l; ls -A $SPLITOS_VNODE_DIR/../alpha | wc -l; cat $SPLITOS_VNODE_DIR/../alpha/only-alpha 2>/dev/null || echo unreadable"],
    );
    let lines: Vec<String> = text(&b.stdout).lines().map(String::from).collect();
    assert_eq!(lines.len(), 4, "{}", text(&b.stderr));
    assert_ne!(lines[0], alpha_dir, "each vNode has its own mount point");
    assert_eq!(
        &lines[1..],
        ["0", "0", "unreadable"],
        "beta sees none of alpha's files, not even through .."
    );
    let again = c.run(
        &["--vnode", "alpha", "--create-vnode"],
        &["bash", "-c", "cat $SPLITOS_VNODE_DIR/only-alpha"],
    );
    assert_eq!(text(&again.stdout), "secret\n");
}

#[test]
fn a_full_quota_is_enospc_and_files_persist_across_cluster_restarts() {
    let store = tempfile::tempdir().unwrap();
    let cfg = format!(
        "[[pcomponent]]\n[[mcomponent]]\n[[scomponent]]\nquota = \"3M\"\ndir = \"{}\"\n",
        store.path().display()
    );
    let code = r#"
import errno, os
d = os.environ["SPLITOS_VNODE_DIR"]
open(d + "/keep", "wb").write(b"k" * 1000000)
fd = os.open(d + "/big", os.O_WRONLY | os.O_CREAT, 0o644)
written = 0
try:
    while written < (8 << 20):
        written += os.write(fd, b"x" * 65536)
    print("no error")
except OSError as e:
    print(errno.errorcode[e.errno], "before 3 MiB:", written < (3 << 20))
os.close(fd)
os.unlink(d + "/big")
open(d + "/after-delete", "wb").write(b"y" * 1000000)
print("space is back after the delete")
"#;
    {
        let c = TestCluster::up(Some(&cfg));
        let out = py(&c, &[], code);
        assert_eq!(
            text(&out.stdout),
            "ENOSPC before 3 MiB: True\nspace is back after the delete\n",
            "{}",
            text(&out.stderr)
        );
    }
    let c = TestCluster::up(Some(&cfg));
    let out = c.run(
        &[],
        &[
            "bash",
            "-c",
            "cd $SPLITOS_VNODE_DIR && ls && wc -c keep after-delete | head -2",
        ],
    );
    assert_eq!(
        text(&out.stdout),
        "after-delete\nkeep\n1000000 keep\n1000000 after-delete\n",
        "files outlive the cluster: {}",
        text(&out.stderr)
    );
}

#[test]
fn the_embedded_cluster_keeps_its_storage_between_runs() {
    let data = tempfile::tempdir().unwrap();
    let env = [("SPLITOS_DATA_DIR", data.path().to_str().unwrap())];
    let first = under_splitos_env(&[], &["bash", "-c", "echo kept > $SPLITOS_VNODE_DIR/note"], &env);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let second = under_splitos_env(
        &[],
        &["bash", "-c", "cat $SPLITOS_VNODE_DIR/note; echo $SPLITOS_VNODE_DIR"],
        &env,
    );
    let out = text(&second.stdout);
    let (note, mount) = out.split_once('\n').unwrap();
    assert_eq!(note, "kept", "{}", text(&second.stderr));
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !info.contains(mount.trim()),
        "the embedded run left its mount {mount} behind"
    );
}

#[test]
fn storage_requests_cannot_escape_their_vnode_and_garbage_is_refused() {
    use splitos_rpc::*;
    let c = TestCluster::up(None);
    let ok = c.run(
        &["--vnode", "v", "--create-vnode"],
        &["bash", "-c", "echo inside > $SPLITOS_VNODE_DIR/f"],
    );
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    let s = c.components("scomponent")[0]["addr"].as_str().unwrap().to_string();
    let client = c.admin_rpc();
    let errno = |m: Msg| match client.call_msg(&s, &m) {
        Err(RpcError::Remote {
            code: ErrCode::Errno(e),
            ..
        }) => e,
        other => panic!("{} was not refused: {other:?}", m.name()),
    };
    let v = || "v".to_string();
    for bad in ["/../v/f", "f", "/a/./f", "//f", "/f/", "/x/.."] {
        assert_eq!(
            errno(Msg::P2S_LOOKUP(P2S_LOOKUP {
                vnode: v(),
                path: bad.into()
            })),
            libc::EINVAL,
            "{bad}"
        );
        assert_eq!(
            errno(Msg::P2S_CREATE(P2S_CREATE {
                vnode: v(),
                path: bad.into(),
                kind: FileKind::File,
                perm: 0o644,
                uid: 0,
                gid: 0,
                excl: false,
                target: None
            })),
            libc::EINVAL,
            "{bad}"
        );
    }
    assert_eq!(
        errno(Msg::P2S_LOOKUP(P2S_LOOKUP {
            vnode: v(),
            path: format!("/{}", "n".repeat(300))
        })),
        libc::ENAMETOOLONG
    );
    assert_eq!(
        errno(Msg::P2S_LOOKUP(P2S_LOOKUP {
            vnode: "".into(),
            path: "/f".into()
        })),
        libc::EINVAL
    );
    assert_eq!(
        errno(Msg::P2S_LOOKUP(P2S_LOOKUP {
            vnode: "other".into(),
            path: "/f".into()
        })),
        libc::ENOENT,
        "another vNode's names are not there"
    );
    assert_eq!(
        errno(Msg::M2S_READ(M2S_READ {
            vnode: v(),
            ino: 999_999,
            offset: 0,
            len: 4096
        })),
        libc::ENOENT
    );
    assert_eq!(
        errno(Msg::P2S_UNLINK(P2S_UNLINK {
            vnode: v(),
            path: "/".into(),
            dir: true
        })),
        libc::EBUSY
    );

    let mut t = std::net::TcpStream::connect(&s).unwrap();
    t.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let _ = t.shutdown(std::net::Shutdown::Write);
    t.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let _ = t.read_to_end(&mut buf);
    assert!(buf.is_empty(), "garbage gets no reply");

    let after = c.run(
        &["--vnode", "v", "--create-vnode"],
        &["bash", "-c", "cat $SPLITOS_VNODE_DIR/f"],
    );
    assert_eq!(
        text(&after.stdout),
        "inside\n",
        "the sComponent still serves: {}",
        text(&after.stderr)
    );
}

#[test]
fn bad_storage_configuration_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    for (cfg, field) in [
        (
            "[[pcomponent]]\n[[mcomponent]]\n[[scomponent]]\nquota = 0\n",
            "scomponent[0].quota",
        ),
        (
            "[[pcomponent]]\n[[mcomponent]]\nbcache = \"1K\"\n",
            "mcomponent[0].bcache",
        ),
        ("[[pcomponent]]\n[[mcomponent]]\n[[scomponent]]\ndri = \"/x\"\n", "dri"),
    ] {
        std::fs::write(&p, cfg).unwrap();
        let out = Command::new(splitos())
            .args(["cluster", "up", "--config"])
            .arg(&p)
            .env("SPLITOS_STATE_DIR", dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(text(&out.stderr).contains(field), "{field}: {}", text(&out.stderr));
    }
}

#[test]
fn a_full_disk_is_enospc_even_within_the_quota() {
    let disk = SmallDisk::new("4m");
    let cfg = format!(
        "[[pcomponent]]\n[[mcomponent]]\n[[scomponent]]\nquota = \"1G\"\ndir = \"{}\"\n",
        disk.0.path().join("store").display()
    );
    let c = TestCluster::up(Some(&cfg));
    let code = r#"
import errno, os
d = os.environ["SPLITOS_VNODE_DIR"]
fd = os.open(d + "/fill", os.O_WRONLY | os.O_CREAT, 0o644)
written = 0
try:
    while written < (64 << 20):
        written += os.write(fd, b"z" * 65536)
        if written % (1 << 20) == 0:
            os.fsync(fd)
    print("no error")
except OSError as e:
    print(errno.errorcode[e.errno])
os.close(fd)
os.unlink(d + "/fill")
open(d + "/small", "w").write("fits again\n")
print(open(d + "/small").read(), end="")
"#;
    let out = py(&c, &[], code);
    assert_eq!(text(&out.stdout), "ENOSPC\nfits again\n", "{}", text(&out.stderr));
    // The cluster stops before its disk goes away.
    drop(c);
}

fn total_bcache(c: &TestCluster, key: &str) -> u64 {
    bcache_stats(c).iter().map(|s| s[key].as_u64().unwrap_or(0)).sum()
}

#[test]
fn readahead_turns_sequential_misses_into_few_storage_requests() {
    let mut fetches = Vec::new();
    for ra in ["0", "128K"] {
        let c = TestCluster::up(Some(&format!(
            "[[pcomponent]]\n[[mcomponent]]\nbcache = \"1M\"\nreadahead = \"{ra}\"\n[[scomponent]]\n"
        )));
        let w = c.run(&[], &["bash", "-c", "head -c 8388608 /dev/urandom > $SPLITOS_VNODE_DIR/f && sync $SPLITOS_VNODE_DIR/f && md5sum < $SPLITOS_VNODE_DIR/f"]);
        assert!(w.status.success(), "{}", text(&w.stderr));
        let before = total_bcache(&c, "fetches");
        let r = c.run(
            &[],
            &["bash", "-c", "dd if=$SPLITOS_VNODE_DIR/f bs=4k status=none | md5sum"],
        );
        assert_eq!(
            text(&r.stdout),
            text(&w.stdout),
            "the same bytes come back: {}",
            text(&r.stderr)
        );
        fetches.push((total_bcache(&c, "fetches") - before, total_bcache(&c, "prefetched")));
    }
    let ((plain, none), (ahead, prefetched)) = (fetches[0], fetches[1]);
    assert_eq!(none, 0, "readahead = 0 fetches nothing ahead");
    assert!(
        prefetched > 1000 && ahead * 4 < plain,
        "read-ahead cuts sComponent requests: {plain} without, {ahead} with ({prefetched} blocks ahead)"
    );
}

/// `splitos run --vnode shared --stats-json STATS -- bash -c SCRIPT` on an embedded cluster
/// whose sComponent keeps its files in `data`, started in `cwd`.
fn embedded_run(data: &Path, cwd: &Path, stats: &Path, script: &str) -> Command {
    let mut c = Command::new(splitos());
    c.args([
        "run",
        "--vnode",
        "shared",
        "--create-vnode",
        "--stats-json",
        stats.to_str().unwrap(),
        "--",
        "bash",
        "-c",
        script,
    ])
    .env_remove("SPLITOS_GM")
    .env(
        "SPLITOS_STATE_DIR",
        std::env::temp_dir().join("splitos-test-no-cluster"),
    )
    .env("SPLITOS_DATA_DIR", data)
    .current_dir(cwd)
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

/// A run under way, killed (with its embedded cluster, which dies with it) if the test fails.
struct Running(Option<Child>);

impl Running {
    /// The program's output up to and with its line `ready` (all of it if it ends first),
    /// read one byte at a time so that nothing past it is taken from the pipe.
    fn until_ready(&mut self) -> String {
        let out = self.0.as_mut().unwrap().stdout.as_mut().unwrap();
        let mut got = Vec::new();
        let mut b = [0u8];
        while !(got.ends_with(b"\nready\n") || got == b"ready\n") && out.read(&mut b).unwrap() == 1 {
            got.push(b[0]);
        }
        text(&got)
    }

    /// Lets the program go on past its `read` and waits for the rest of its output.
    fn finish(mut self) -> Output {
        let mut c = self.0.take().unwrap();
        c.stdin.take().unwrap().write_all(b"go\n").unwrap();
        c.wait_with_output().unwrap()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn sharing(stats: &Path) -> serde_json::Value {
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(stats).unwrap()).unwrap();
    s["scomponents"][0]["sharing"].clone()
}

/// Two embedded runs at once on one storage directory (as two `splitos run` of root on the
/// default one): the second run's sComponent passes its requests on files to the first run's,
/// which has the directory open, and takes the directory over when the first run ends. Each
/// run reads the file the other wrote and fsynced (the runs' buffer caches are their own), a
/// third run reads all, and nothing lands in the directory the runs were started in.
#[test]
fn two_embedded_runs_at_once_share_their_vnode_files() {
    let data = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let records = tempfile::tempdir().unwrap();
    let (sa, sb, sc) = (
        records.path().join("a.json"),
        records.path().join("b.json"),
        records.path().join("c.json"),
    );
    let mut a = Running(Some(
        embedded_run(
            data.path(),
            cwd.path(),
            &sa,
            r#"set -e; cd "$SPLITOS_VNODE_DIR"; echo from-a > a.txt; sync a.txt; echo ready; read go; cat b.txt"#,
        )
        .spawn()
        .unwrap(),
    ));
    assert_eq!(a.until_ready(), "ready\n", "the first run started");
    let mut b = Running(Some(
        embedded_run(data.path(), cwd.path(), &sb, r#"set -e; cd "$SPLITOS_VNODE_DIR"; echo from-b > b.txt; sync b.txt; cat a.txt; echo ready; read go; echo from-b2 > b2.txt; cat a.txt b.txt b2.txt"#).spawn().unwrap(),
    ));
    assert_eq!(
        b.until_ready(),
        "from-a\nready\n",
        "the second run, while the first holds the storage, reads its file"
    );

    let out = a.finish();
    assert_eq!(
        (text(&out.stdout), out.status.code()),
        ("from-b\n".to_string(), Some(0)),
        "the first run reads the second's file: {}",
        text(&out.stderr)
    );
    let owner = sharing(&sa);
    assert!(
        owner["owner"] == true && owner["served_requests"].as_u64().unwrap() > 0,
        "the first run's sComponent had the directory open and served the second's requests: {owner}"
    );

    // The first run's cluster is gone: the second one's sComponent takes the directory over.
    let out = b.finish();
    assert_eq!(
        (text(&out.stdout), out.status.code()),
        ("from-a\nfrom-b\nfrom-b2\n".to_string(), Some(0)),
        "the second run goes on with the files after the first ended: {}",
        text(&out.stderr)
    );
    let front = sharing(&sb);
    assert!(
        front["forwarded_requests"].as_u64().unwrap() > 0 && front["takeovers"] == 1 && front["owner"] == true,
        "the second run's sComponent passed requests on, then took the directory over: {front}"
    );

    let c = embedded_run(
        data.path(),
        cwd.path(),
        &sc,
        r#"cd "$SPLITOS_VNODE_DIR" && cat a.txt b.txt b2.txt"#,
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    assert_eq!(
        text(&c.stdout),
        "from-a\nfrom-b\nfrom-b2\n",
        "a third run sees both runs' files: {}",
        text(&c.stderr)
    );
    assert_eq!(
        sharing(&sc)["takeovers"],
        0,
        "alone, a run's sComponent opens the directory itself"
    );
    let left: Vec<_> = std::fs::read_dir(cwd.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        left.is_empty(),
        "nothing was written in the runs' current directory: {left:?}"
    );
}

/// A run whose vNode's files cannot be had does not start its program: it would write in the
/// host's current directory instead. Two ways: the storage directory cannot be made, and
/// another process holds it without sharing it.
#[test]
fn a_run_that_cannot_have_its_vnode_files_fails_and_runs_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let stats = tmp.path().join("stats.json");
    let script = r#"cd "$SPLITOS_VNODE_DIR"; echo ran > marker"#;
    let not_a_dir = tmp.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let out = embedded_run(&not_a_dir, cwd.path(), &stats, script)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("the cluster cannot keep its vNodes' files")
            && err.contains("storage0 exited during start-up"),
        "{err}"
    );

    let data = tmp.path().join("data");
    std::fs::create_dir_all(data.join("storage")).unwrap();
    let held = std::fs::File::create(data.join("storage/namespace.redb")).unwrap();
    assert_eq!(
        // SAFETY: flock takes the descriptor of `held`, which outlives the call.
        unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&held), libc::LOCK_EX) },
        0
    );
    let out = embedded_run(&data, cwd.path(), &stats, script)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is in use by another process, and no sComponent that shares it answers"),
        "{err}"
    );
    drop(held);

    let left: Vec<_> = std::fs::read_dir(cwd.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "the program did not run: {left:?}");
}
