//! Attacks by someone who merely reaches a component's port or shares its host, over the real
//! wire: each is refused, counted by the component that refused it, and the victim program's
//! output stays what a native run prints.
use crate::common;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use splitos_rpc::auth::{Authority, Credentials};
use splitos_rpc::poll::Polling;
use splitos_rpc::transport::{TcpConfig, TcpTransport};
use splitos_rpc::{FrameKind, Msg, Role, Rpc, RpcError, Who, P2M_FETCH};

/// Runs python3 as the user `nobody` with `script` and `args`; returns its stdout.
fn as_nobody(script: &str, args: &[&str]) -> String {
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            script,
        ])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_string()
}

/// Sends `frame` to `addr` and says whether anything came back before the connection closed.
const SEND_FRAME: &str = r#"
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((host, int(port)))
s.sendall(bytes.fromhex(sys.argv[2]))
s.settimeout(15)
try:
    print("answered" if s.recv(64) else "closed")
except ConnectionResetError:
    print("closed")
"#;

const READ_FILE: &str = r#"
import sys
try:
    open(sys.argv[1], "rb").read(); print("read")
except PermissionError:
    print("denied")
"#;

fn hex_frame(msg: Msg) -> String {
    splitos_rpc::frame::encode(FrameKind::Request, 1, &msg)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn fetch_frame(pid: u64) -> String {
    hex_frame(
        P2M_FETCH {
            who: Who::new("default", pid),
            vpn: 0x200000000,
        }
        .into(),
    )
}

fn rpc_with(creds: Credentials) -> Rpc {
    Rpc::new(
        Arc::new(TcpTransport::new(
            TcpConfig::default(),
            Polling::Fixed,
            Some(Arc::new(creds)),
        )),
        Duration::from_secs(5),
    )
}

#[test]
fn nobody_who_merely_reaches_a_port_gets_in() {
    let c = TestCluster::up(Some(
        "[transport]\nkind = \"tcp\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n",
    ));
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let prog = program("hold");
    let prog = prog.to_str().unwrap();
    let native_out = text(&native(&[prog, "8"]).stdout);
    let mut victim = c.spawn(&[], &[prog, "8"]);
    assert_eq!(read_line(&mut victim), "ready\n");

    // The keys are root's: nobody cannot read the authority, the admin's or a component's.
    for f in ["authority.key", "admin.cred", "mem0.cred"] {
        assert_eq!(
            as_nobody(READ_FILE, &[c.dir.path().join(f).to_str().unwrap()]),
            "denied",
            "{f}"
        );
    }
    // Nobody speaks the documented wire format without a handshake: no answer, the
    // connection is closed, and the mComponent counts the refusal.
    // Even knowing the victim's process id (random, so only the admin's tools see it).
    let victim_pid = c.components("mcomponent")[0]["stats"]["owned_processes"]
        .as_array()
        .unwrap()[0]["pid"]
        .as_u64()
        .unwrap();
    assert!(
        victim_pid > u32::MAX as u64,
        "process ids are random 64-bit numbers: {victim_pid}"
    );
    let before = c.metric(&m, "splitos_rpc_handshakes_refused_total");
    for pid in [victim_pid, 1, 2] {
        assert_eq!(as_nobody(SEND_FRAME, &[&m, &fetch_frame(pid)]), "closed");
    }
    assert!(c.metric(&m, "splitos_rpc_handshakes_refused_total") >= before + 3.0);
    // The other attacks of the issue, each to the component it hit: end a program, stop an
    // mComponent, register a rogue mComponent, stop the pComponent (whose program socket
    // refuses users it grants nothing: `users_run_programs_on_the_vnodes_granted_to_them`).
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let load = splitos_rpc::Load {
        capacity: 16 << 40,
        ..Default::default()
    };
    let attacks: Vec<(&str, Msg)> = vec![
        (
            &m,
            splitos_rpc::M2M_EXIT {
                who: Who::new("default", 1),
            }
            .into(),
        ),
        (&m, splitos_rpc::C2X_SHUTDOWN.into()),
        (
            &gm,
            splitos_rpc::X2G_REGISTER {
                role: Role::Mem,
                addr: "127.0.0.1:9".into(),
                shim_sock: None,
                nics: Vec::new(),
                load,
                id: 0,
                metrics: None,
                standby: false,
                ebbs: Vec::new(),
                fenced_by: 0,
                start: 0,
            }
            .into(),
        ),
        (&p, splitos_rpc::C2X_SHUTDOWN.into()),
    ];
    for (addr, msg) in attacks {
        let name = msg.name();
        assert_eq!(as_nobody(SEND_FRAME, &[addr, &hex_frame(msg)]), "closed", "{name}");
    }
    assert!(
        c.components("mcomponent").iter().all(|m| m["alive"] == true),
        "the mComponent still runs"
    );
    assert!(
        c.status()["components"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["addr"] != "127.0.0.1:9"),
        "no rogue mComponent"
    );
    // Credentials of another authority are refused in the handshake.
    let stranger = rpc_with(Authority::generate().unwrap().issue(Role::Proc).unwrap());
    match stranger.call_msg(&m, &splitos_rpc::C2X_STATS.into()) {
        Err(RpcError::Unreachable { why, .. }) => {
            assert!(why.contains("did not issue") || why.contains("refused"), "{why}")
        }
        other => panic!("a stranger was served: {other:?}"),
    }
    // This cluster's credentials of a role that may not fetch pages are refused per message.
    let f = c.dir.path().join("storage.cred");
    let out = c
        .cmd(&[
            "cluster",
            "credentials",
            "--role",
            "scomponent",
            "--out",
            f.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let storage = rpc_with(Credentials::load(&f).unwrap());
    match storage.call_msg(
        &m,
        &P2M_FETCH {
            who: Who::new("default", 1),
            vpn: 0,
        }
        .into(),
    ) {
        Err(RpcError::Remote { msg, .. }) => assert!(msg.contains("may not send P2M_FETCH"), "{msg}"),
        other => panic!("an sComponent fetched a page: {other:?}"),
    }
    assert!(c.metric(&m, "splitos_rpc_requests_refused_total") >= 1.0);
    // A pComponent's credentials reach only the programs that pComponent runs: another
    // pComponent, knowing the victim's id and vNode, can neither read its pages at the owner
    // nor change its layout at the home.
    let f = c.dir.path().join("other-proc.cred");
    let out = c
        .cmd(&[
            "cluster",
            "credentials",
            "--role",
            "pcomponent",
            "--out",
            f.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let other = rpc_with(Credentials::load(&f).unwrap());
    let victim_who = Who::new("default", victim_pid);
    let denied_before = c.components("mcomponent")[0]["stats"]["denied"].as_u64().unwrap();
    let attempts: Vec<Msg> = vec![
        P2M_FETCH {
            who: victim_who.clone(),
            vpn: 0x200000000,
        }
        .into(),
        splitos_rpc::P2M_MUNMAP {
            who: victim_who.clone(),
            addr: 0x200000000000,
            len: 1 << 20,
        }
        .into(),
        splitos_rpc::P2M_EXIT {
            who: victim_who.clone(),
        }
        .into(),
    ];
    for msg in attempts {
        let name = msg.name();
        match other.call_msg(&m, &msg) {
            Err(RpcError::Remote { msg, .. }) => assert!(msg.contains("runs on another pComponent"), "{name}: {msg}"),
            r => panic!("{name} from another pComponent was served: {r:?}"),
        }
    }
    // Nor take the victim's id over: creating a process under it, or forking into it.
    let mine = Who::new("default", 0x5eed);
    other
        .call(
            &m,
            splitos_rpc::P2M_PROC_CREATE {
                who: mine.clone(),
                region_base: 0x200000000000,
                region_size: 1 << 30,
                pcomp: 0,
                memory_quota: None,
                attempt: 0,
            },
        )
        .unwrap();
    let takeovers: Vec<Msg> = vec![
        splitos_rpc::P2M_PROC_CREATE {
            who: victim_who.clone(),
            region_base: 0x200000000000,
            region_size: 1 << 30,
            pcomp: 0,
            memory_quota: None,
            attempt: 0,
        }
        .into(),
        splitos_rpc::P2M_FORK {
            parent: mine.clone(),
            child: victim_pid,
        }
        .into(),
    ];
    for msg in takeovers {
        let name = msg.name();
        match other.call_msg(&m, &msg) {
            Err(RpcError::Remote { msg, .. }) => assert!(msg.contains("is in use"), "{name}: {msg}"),
            r => panic!("{name} over the victim's id was served: {r:?}"),
        }
    }
    assert!(
        c.components("mcomponent")[0]["stats"]["denied"].as_u64().unwrap() >= denied_before + 5,
        "the mComponent counted the refusals"
    );
    // A pComponent's credentials do not register an mComponent with the global managers.
    let load = splitos_rpc::Load {
        capacity: 16 << 40,
        ..Default::default()
    };
    match other.call_msg(
        &gm,
        &splitos_rpc::X2G_REGISTER {
            role: Role::Mem,
            addr: "127.0.0.1:9".into(),
            shim_sock: None,
            nics: Vec::new(),
            load,
            id: 0,
            metrics: None,
            standby: false,
            ebbs: Vec::new(),
            fenced_by: 0,
            start: 0,
        }
        .into(),
    ) {
        Err(RpcError::Remote { msg, .. }) => assert!(msg.contains("may not register as a mcomponent"), "{msg}"),
        r => panic!("a pComponent registered an mComponent: {r:?}"),
    }
    let log = ["mem0"].iter().map(|n| c.log(n)).collect::<String>();
    assert!(
        log.contains("did not authenticate") && log.contains("may not send"),
        "refusals are logged: {log}"
    );
    // The admin's tools work for root and not for nobody.
    assert!(c.cmd(&["cluster", "status"]).output().unwrap().status.success());
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(splitos())
        .args(["cluster", "status", "--gm", c.status()["gm"].as_str().unwrap()])
        .env("SPLITOS_STATE_DIR", c.dir.path())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "nobody ran cluster status: {}",
        text(&out.stdout)
    );
    // The victim never noticed.
    drop(victim.stdin.take());
    let out = victim.wait_with_output().unwrap();
    assert_eq!(
        text(&out.stdout),
        native_out.trim_start_matches("ready\n"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn another_user_cannot_enter_a_vnodes_files() {
    let c = TestCluster::up(None);
    let out = c.run(
        &[],
        &[
            "bash",
            "-c",
            "echo secret > \"$SPLITOS_VNODE_DIR/f\" && echo \"$SPLITOS_VNODE_DIR\"",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let dir = text(&out.stdout).trim().to_string();
    let probe = r#"
import os, sys
try:
    print(open(os.path.join(sys.argv[1], "f")).read().strip())
except PermissionError:
    print("denied")
"#;
    assert_eq!(
        as_nobody(probe, &[&dir]),
        "denied",
        "a vNode granted to no one is root's alone"
    );
    // Even with every directory above the mount opened up by mistake, the mount's top
    // directory keeps others out.
    use std::os::unix::fs::PermissionsExt;
    let mut p = std::path::PathBuf::from(&dir);
    while p.pop() && p.starts_with(c.dir.path()) {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    assert_eq!(as_nobody(probe, &[&dir]), "denied", "the mount keeps others out");
    let out = c.run(&[], &["bash", "-c", "cat \"$SPLITOS_VNODE_DIR/f\""]);
    assert_eq!(
        text(&out.stdout),
        "secret\n",
        "root's programs still read it: {}",
        text(&out.stderr)
    );
}

/// Allocates, writes a file where it is told, and says who it is: the same as a native run
/// when it runs as that user.
const USER_PROGRAM: &str = r#"
import os
d = os.environ["SPLITOS_VNODE_DIR"]
x = [i * i for i in range(400000)]
p = os.path.join(d, "mine.txt")
with open(p, "w") as f:
    f.write("written by %d\n" % os.getuid())
st = os.stat(p)
print(os.getuid(), os.getgid(), sum(x), open(p).read().strip(), st.st_uid, st.st_gid, oct(st.st_mode & 0o777))
"#;

#[test]
fn users_run_programs_on_the_vnodes_granted_to_them() {
    let (alice, bob, carol) = (60001u32, 60002u32, 60003u32);
    let c = TestCluster::up(Some(&format!("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[scomponent]]\n[[vnode]]\nname = \"lab\"\nusers = [\"{alice}\"]\n[[vnode]]\nname = \"other\"\ngroups = [\"{bob}\"]\n")));
    let sock = c.dir.path().join("programs/proc0.sock");
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let state = c.dir.path().to_str().unwrap().to_string();
    let env = [("SPLITOS_STATE_DIR", state.as_str())];
    // The system's python3: the test's own may be in a directory only root enters.
    let py = "/usr/bin/python3".to_string();

    // Alice runs python3 as herself on her vNode, found through the host's program socket,
    // and it prints what it prints natively as her.
    let native_dir = c.dir.path().join("native");
    std::fs::create_dir(&native_dir).unwrap();
    std::os::unix::fs::chown(&native_dir, Some(alice), Some(alice)).unwrap();
    let native = as_user(
        alice,
        &[&py, "-c", USER_PROGRAM],
        &[("SPLITOS_VNODE_DIR", native_dir.to_str().unwrap())],
    );
    assert!(native.status.success(), "{}", text(&native.stderr));
    let stats = c.dir.path().join("alice-stats.json");
    std::fs::write(&stats, "").unwrap();
    std::os::unix::fs::chown(&stats, Some(alice), Some(alice)).unwrap();
    let flushes_before = c.components("mcomponent")[0]["stats"]["flushes"].as_u64().unwrap();
    let out = as_user(
        alice,
        &[
            splitos().to_str().unwrap(),
            "run",
            "--vnode",
            "lab",
            "--stats-json",
            stats.to_str().unwrap(),
            "--",
            &py,
            "-c",
            USER_PROGRAM,
        ],
        &env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), text(&native.stdout), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with(&format!("{alice} {alice} ")),
        "{}",
        text(&out.stdout)
    );
    // Its heap lived behind the ExCache: the pComponent's counters for the run, and the
    // mComponent's own.
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    assert!(
        n(&s, "processes") == 1 && n(&s, "misses") > 0 && n(&s, "flushes") > 0,
        "{s}"
    );
    assert!(c.components("mcomponent")[0]["stats"]["flushes"].as_u64().unwrap() > flushes_before);
    // The pComponent keeps nothing of a run once its launcher is gone.
    assert!(
        c.eventually(Duration::from_secs(5), |c| c.components("pcomponent")[0]["stats"]
            ["runs"]
            == 0),
        "runs are forgotten"
    );
    // Her file is hers on the vNode, where set-user-ID bits and devices grant nothing.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let lab = mountinfo
        .lines()
        .find(|l| l.contains(&format!("{state}/vnodes/lab ")))
        .expect("lab is mounted");
    assert!(lab.contains("nosuid") && lab.contains("nodev"), "{lab}");
    use std::os::unix::fs::MetadataExt;
    let mine = c.dir.path().join("vnodes/lab/mine.txt");
    assert_eq!(
        (
            std::fs::metadata(&mine).unwrap().uid(),
            std::fs::metadata(&mine).unwrap().gid()
        ),
        (alice, alice)
    );

    // Bob, granted another vNode, is refused hers, and the refusal is counted.
    let refused_before = c.metric(&p, "splitos_pcomp_program_connections_refused_total");
    let out = as_user(
        bob,
        &[
            splitos().to_str().unwrap(),
            "run",
            "--vnode",
            "lab",
            "--",
            &py,
            "-c",
            "print(1)",
        ],
        &env,
    );
    assert!(!out.status.success() && text(&out.stdout).is_empty());
    assert!(
        text(&out.stderr).contains("vNode \"lab\" is not granted to this user (uid 60002)"),
        "{}",
        text(&out.stderr)
    );
    // Nor can his program name her vNode in its hello, or reach her files: not by the mount,
    // not through /proc of her program or of the pComponent.
    let mut hers = Command::new("setpriv")
        .args([
            &format!("--reuid={alice}"),
            &format!("--regid={alice}"),
            "--clear-groups",
        ])
        .arg(splitos())
        .args([
            "run",
            "--vnode",
            "lab",
            "--",
            "bash",
            "-c",
            "cd \"$SPLITOS_VNODE_DIR\" && echo ready && (read || true)",
        ])
        .env("SPLITOS_STATE_DIR", &state)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(read_line(&mut hers), "ready\n");
    let her_bash = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|d| d.ends_with("vnodes/lab")))
        .expect("her program runs in her vNode");
    let pcomp_pid = c.pid_of_addr(&p);
    let probe = format!(
        "for f in \"$SPLITOS_VNODE_DIR/../lab/mine.txt\" /proc/{her_bash}/cwd/mine.txt /proc/{pcomp_pid}/root{}/vnodes/lab/mine.txt; do cat \"$f\" 2>/dev/null && echo LEAKED; done; echo probed; SPLITOS_VNODE=lab {py} -c 'print(\"LEAKED\")'",
        c.dir.path().display()
    );
    let out = as_user(
        bob,
        &[
            splitos().to_str().unwrap(),
            "run",
            "--vnode",
            "other",
            "--",
            "bash",
            "-c",
            &probe,
        ],
        &env,
    );
    assert_eq!(text(&out.stdout), "probed\n", "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("vNode lab is not granted to this user"),
        "{}",
        text(&out.stderr)
    );
    drop(hers.stdin.take());
    assert!(hers.wait().unwrap().success());
    // A connection of hers that never says hello is closed by the pComponent, not kept.
    let silent = "import socket, sys, time\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.settimeout(30)\nt = time.time()\nwhile s.recv(4096): pass\nprint('closed' if time.time() - t < 25 else 'kept')";
    let out = as_user(alice, &[&py, "-c", silent, sock.to_str().unwrap()], &[]);
    assert_eq!(text(&out.stdout), "closed\n", "{}", text(&out.stderr));
    // Carol, granted nothing, gets nothing: not even the descriptors a program gets, nor a
    // look at the cluster's state.
    for f in [
        "cluster.json",
        "proc0.log",
        "proc0.ready",
        "data/storage/namespace.redb",
    ] {
        let out = as_user(carol, &["cat", c.dir.path().join(f).to_str().unwrap()], &[]);
        assert!(!out.status.success() && out.stdout.is_empty(), "{f} is root's");
    }
    let out = as_user(carol, &["ls", c.dir.path().to_str().unwrap()], &[]);
    assert!(!out.status.success(), "the state directory cannot be listed");
    let out = as_user(
        carol,
        &[
            splitos().to_str().unwrap(),
            "run",
            "--pcomponent",
            sock.to_str().unwrap(),
            "--",
            &py,
            "-c",
            "print(1)",
        ],
        &[],
    );
    assert!(
        text(&out.stderr).contains("grants no vNode to this user (uid 60003)"),
        "{}",
        text(&out.stderr)
    );
    assert!(c.metric(&p, "splitos_pcomp_program_connections_refused_total") >= refused_before + 3.0);
    // Root, the admin, still runs on any vNode.
    let out = c.run(
        &["--vnode", "lab"],
        &["bash", "-c", "cat \"$SPLITOS_VNODE_DIR/mine.txt\""],
    );
    assert_eq!(
        text(&out.stdout),
        format!("written by {alice}\n"),
        "{}",
        text(&out.stderr)
    );
}

/// A script speaking the shim protocol with this build's version where it says `@ABI@`.
fn with_abi(script: &str) -> String {
    script.replace("@ABI@", &splitos_shim_abi::SHIM_ABI_VERSION.to_string())
}

/// A granted user speaking the shim protocol (crates/shim-abi) by hand, as an attacker would:
/// `ended` (the process that connected ends before a child of it says hello), `misuse` (a
/// well-formed program whose memory calls overflow, and who asks for more forked children
/// than a process may have), `flood` (connections that never say hello). Prints what the
/// pComponent answered.
const SHIM_CLIENT: &str = r#"
import array, fcntl, os, socket, struct, sys, time
sock, what = sys.argv[1], sys.argv[2]
BASE, SIZE = 0x2000_0000_0000, 256 << 30

def connect():
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    return s

def welcome(s):
    msg, anc, _, _ = s.recvmsg(32, socket.CMSG_SPACE(16))
    fds = array.array("i")
    for _, _, data in anc:
        fds.frombytes(data[: len(data) - len(data) % 4])
    return msg, list(fds)

def exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b

def hello(s, fds, run_id):
    h = struct.pack("<IIQQQQ64sIIQII", @ABI@, 0, BASE, SIZE, 0, run_id, b"lab", 0, 0, 0, 0, 0)
    s.sendmsg([h], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    r = struct.unpack("<qQQ", exact(s, 24))
    if r[0] == 0:
        exact(s, 8)  # Admitted
    return r

def ask(s, op, a=0, b=0, c=0, d=0, e=0):
    s.sendall(struct.pack("<IIQQQQQ", op, 0, a, b, c, d, e))
    return struct.unpack("<qQQ", exact(s, 24))[0]

if what == "ended":
    # A child connects, hands the connection over and ends; once it is reaped its pid is free
    # for anyone, and the hello comes from another process.
    a, b = socket.socketpair()
    child = os.fork()
    if child == 0:
        s = connect()
        a.sendmsg([b"s"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [s.fileno()]))])
        os._exit(0)
    _, anc, _, _ = b.recvmsg(1, socket.CMSG_SPACE(4))
    s = socket.socket(fileno=array.array("i", anc[0][2][:4])[0])
    os.waitpid(child, 0)
    _, fds = welcome(s)
    memfd = os.memfd_create("h")
    print("hello", hello(s, [memfd, memfd], 7)[0])
elif what == "misuse":
    s = connect()
    _, fds = welcome(s)
    uffd = fcntl.ioctl(fds[0], 0xAA00, os.O_CLOEXEC | os.O_NONBLOCK)
    api = bytearray(struct.pack("<QQQ", 0xAA, (1 << 5) | (1 << 8) | (1 << 12), 0))
    fcntl.ioctl(uffd, 0xC018AA3F, api)
    memfd = os.memfd_create("h")
    os.ftruncate(memfd, SIZE)
    print("hello", hello(s, [uffd, memfd], 0x5EC0_0001)[0])
    print("dontneed", ask(s, 4, BASE + 4096, 2**64 - BASE))
    print("munmap", ask(s, 2, BASE + SIZE - 4096, 8192))
    forks = [ask(s, 6) for _ in range(258)]
    print("forks", sum(1 for f in forks if f == 0), "refused", sum(1 for f in forks if f == -11))
    sys.stdout.flush()
    time.sleep(float(sys.argv[3]))
elif what == "flood":
    socks = [connect() for _ in range(300)]
    answers = {}
    for s in socks:
        s.settimeout(5)
        w = exact(s, 32)
        refused = struct.unpack("<qIIQII", w)[4]
        answers[refused] = answers.get(refused, 0) + 1
    print("welcomed", answers.get(0, 0), "busy", answers.get(11, 0))
"#;

#[test]
fn a_granted_user_speaking_the_shim_protocol_by_hand_harms_no_one() {
    let alice = 60011u32;
    // Forked children count against the user's programs from their fork: a cap above the
    // 256 a process may have waiting, so that the latter is what refuses.
    let c = TestCluster::up(Some(&format!("[[pcomponent]]\nexcache = \"4M\"\nfork_timeout_ms = 2000\nmax_programs_per_user = 512\n[[mcomponent]]\n[[vnode]]\nname = \"lab\"\nusers = [\"{alice}\"]\n")));
    let sock = c.dir.path().join("programs/proc0.sock").to_str().unwrap().to_string();
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let py = "/usr/bin/python3";
    let held = |c: &TestCluster| c.components("mcomponent")[0]["stats"]["home_of"].as_u64().unwrap();
    // A process that connected and ended is no program, whoever has its pid by the hello:
    // refused with EPERM (EACCES is kept for a vNode not granted, which the shim says).
    let out = as_user(alice, &[py, "-c", &with_abi(SHIM_CLIENT), &sock, "ended"], &[]);
    assert_eq!(text(&out.stdout), "hello -1\n", "{}", text(&out.stderr));
    assert!(
        c.log("proc0").contains("that connected has ended"),
        "{}",
        c.log("proc0")
    );
    // Memory calls outside the heap region are refused, and forked children beyond a
    // process's share are EAGAIN, as fork(2) says; the pComponent serves on.
    let mut misuse = Command::new("setpriv")
        .args([
            &format!("--reuid={alice}"),
            &format!("--regid={alice}"),
            "--clear-groups",
            py,
            "-c",
            &with_abi(SHIM_CLIENT),
            &sock,
            "misuse",
            "5",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(misuse.stdout.take().unwrap()));
    let mut line = || lines.next().unwrap().unwrap();
    assert_eq!(line(), "hello 0");
    assert_eq!(line(), "dontneed -22");
    assert_eq!(line(), "munmap -22");
    assert_eq!(line(), "forks 256 refused 2");
    assert!(held(&c) >= 257, "the process and its 256 children are held at the home");
    // The launcherless run id left nothing behind.
    assert_eq!(c.components("pcomponent")[0]["stats"]["runs"], 0);
    // Connections that never say hello hold few threads, and not for long.
    let out = as_user(alice, &[py, "-c", &with_abi(SHIM_CLIENT), &sock, "flood"], &[]);
    assert_eq!(text(&out.stdout), "welcomed 256 busy 44\n", "{}", text(&out.stderr));
    assert!(c.metric(&p, "splitos_pcomp_program_connections_refused_total") >= 44.0);
    // Everyone else is served meanwhile.
    let out = c.run(&["--vnode", "lab"], &["echo", "served"]);
    assert_eq!(text(&out.stdout), "served\n", "{}", text(&out.stderr));
    // The children never said hello: once their parent is gone, given up within the
    // timeout and their copies released (`fork_timeout_ms`, not the default 30 s).
    assert!(misuse.wait().unwrap().success());
    assert!(
        c.eventually(Duration::from_secs(15), |c| held(c) == 0),
        "unclaimed children are reaped: {}",
        held(&c)
    );
    assert!(c.metric(&m, "splitos_rpc_requests_refused_total") == 0.0);
}

/// [`SHIM_CLIENT`]'s `forged`: a hello whose "userfaultfd" is a pipe the program could write
/// page-fault messages into, then a real userfaultfd with a range outside the heap region
/// registered on it by the program and touched.
const FORGED_FAULTS: &str = r#"
if what == "forged":
    import ctypes, mmap
    memfd = os.memfd_create("h")
    os.ftruncate(memfd, SIZE)
    s = connect()
    welcome(s)
    r, w = os.pipe()
    print("pipe", hello(s, [r, memfd], 0x5EC0_0002)[0])
    s = connect()
    _, fds = welcome(s)
    uffd = fcntl.ioctl(fds[0], 0xAA00, os.O_CLOEXEC | os.O_NONBLOCK)
    fcntl.ioctl(uffd, 0xC018AA3F, bytearray(struct.pack("<QQQ", 0xAA, (1 << 5) | (1 << 8) | (1 << 12), 0)))
    print("uffd", hello(s, [uffd, memfd], 0x5EC0_0003)[0])
    m = mmap.mmap(-1, 4096)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    fcntl.ioctl(uffd, 0xC020AA00, bytearray(struct.pack("<QQQQ", addr, 4096, 1, 0)))  # UFFDIO_REGISTER, missing
    sys.stdout.flush()
    m[0] = 1
    print("served outside the heap")
"#;

#[test]
fn fault_events_from_a_forged_descriptor_or_outside_the_heap_are_refused() {
    let alice = 60013u32;
    let c = TestCluster::up(Some(&format!(
        "[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[vnode]]\nname = \"lab\"\nusers = [\"{alice}\"]\n"
    )));
    let sock = c.dir.path().join("programs/proc0.sock").to_str().unwrap().to_string();
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let script = with_abi(&format!("{SHIM_CLIENT}{FORGED_FAULTS}"));
    let out = as_user(alice, &["/usr/bin/python3", "-c", &script, &sock, "forged"], &[]);
    // A pipe is no userfaultfd: EINVAL at hello. The fault outside the heap ends the program
    // that made it, with the reason on its stderr, before anything of it reaches the ExCache.
    assert_eq!(text(&out.stdout), "pipe -22\nuffd 0\n", "{}", text(&out.stderr));
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGKILL),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("outside its heap region"),
        "{}",
        text(&out.stderr)
    );
    assert!(c.log("proc0").contains("not a userfaultfd"), "{}", c.log("proc0"));
    assert_eq!(c.metric(&p, "splitos_pcomp_fault_sources_refused_total"), 1.0);
    assert_eq!(c.metric(&p, "splitos_pcomp_fault_events_refused_total"), 1.0);
    let stats = &c.components("pcomponent")[0]["stats"];
    assert_eq!(
        (
            stats["totals"]["misses"].as_u64(),
            stats["excache"]["used_lines"].as_u64()
        ),
        (Some(0), Some(0)),
        "nothing reached the ExCache: {stats}"
    );
    // Everyone else is served meanwhile.
    let out = c.run(&["--vnode", "lab"], &["echo", "served"]);
    assert_eq!(text(&out.stdout), "served\n", "{}", text(&out.stderr));
}

/// `cluster up` on a state directory in `state`, with its data beside it; a cluster it did
/// start (which it must not have) is stopped again.
fn up_on(state: &std::path::Path) -> std::process::Output {
    let data = state.with_extension("data");
    let out = Command::new(splitos())
        .args(["cluster", "up"])
        .env("SPLITOS_STATE_DIR", state)
        .env("SPLITOS_DATA_DIR", &data)
        .output()
        .unwrap();
    if out.status.success() {
        let _ = Command::new(splitos())
            .args(["cluster", "down"])
            .env("SPLITOS_STATE_DIR", state)
            .output();
        unmount_under(state);
    }
    out
}

/// Runs a shell command as `nobody`.
fn sh_as_nobody(cmd: &str) {
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c", cmd])
        .output()
        .unwrap();
    assert!(out.status.success(), "{cmd}: {}", text(&out.stderr));
}

/// A state directory that was open to other users holds what they planted while it was: a
/// link where a log is written, a `programs/` directory of theirs (where a fake pComponent
/// socket would be found), a link in place of a vNode's mount point. `cluster up` refuses each,
/// naming it, and follows none of them.
#[test]
fn a_state_directory_others_could_write_is_refused_naming_what_they_planted() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::Builder::new().prefix("splitos-planted-").tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let victim = t.path().join("victim");
    std::fs::write(&victim, "root's own\n").unwrap();
    let elsewhere = t.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let state = t.path().join("state");
    let open_state = |inner: &[&str]| {
        let _ = std::fs::remove_dir_all(&state);
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
        for d in inner {
            std::fs::create_dir(state.join(d)).unwrap();
            std::fs::set_permissions(state.join(d), std::fs::Permissions::from_mode(0o777)).unwrap();
        }
    };
    let (s, v, e) = (state.display(), victim.display(), elsewhere.display());

    open_state(&[]);
    sh_as_nobody(&format!("ln -s {v} {s}/gm.log"));
    let out = up_on(&state);
    assert!(
        !out.status.success() && text(&out.stderr).contains("gm.log") && text(&out.stderr).contains("uid 65534"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "root's own\n",
        "the planted link was followed"
    );

    open_state(&[]);
    sh_as_nobody(&format!("mkdir -m 777 {s}/programs && touch {s}/programs/proc0.sock"));
    let out = up_on(&state);
    assert!(
        !out.status.success() && text(&out.stderr).contains("programs") && text(&out.stderr).contains("uid 65534"),
        "{}",
        text(&out.stderr)
    );

    open_state(&["vnodes"]);
    sh_as_nobody(&format!("ln -s {e} {s}/vnodes/default"));
    let out = up_on(&state);
    assert!(
        !out.status.success() && text(&out.stderr).contains("vnodes/default"),
        "{}",
        text(&out.stderr)
    );

    // Taken away, the same directory is made the cluster's and serves programs.
    open_state(&[]);
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new(splitos())
        .args(["cluster", "up"])
        .env("SPLITOS_STATE_DIR", &state)
        .env("SPLITOS_DATA_DIR", state.with_extension("data"))
        .output()
        .unwrap();
    let _down = ClusterDown(state.clone());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::metadata(&state).unwrap().permissions().mode() & 0o7777, 0o711);
}

/// Stops the cluster whose state is in the directory when dropped.
struct ClusterDown(std::path::PathBuf);

impl Drop for ClusterDown {
    fn drop(&mut self) {
        let _ = Command::new(splitos())
            .args(["cluster", "down"])
            .env("SPLITOS_STATE_DIR", &self.0)
            .output();
        unmount_under(&self.0);
    }
}

/// Listens as `nobody` at argv[1] like a pComponent: sends a welcome, then reports what the
/// client sent and how many descriptors came with it.
const FAKE_PCOMPONENT: &str = r#"
import os, socket, struct, sys
l = socket.socket(socket.AF_UNIX)
l.bind(sys.argv[1]); os.chmod(sys.argv[1], 0o666); l.listen(4)
print("ready", flush=True)
l.settimeout(60)
got, fds = 0, 0
try:
    s, _ = l.accept()
    s.settimeout(10)
    s.sendall(struct.pack("<qIIQII", -71, @ABI@, 0, 0, 0, 0))
    while True:
        data, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(16 * 4))
        if not data: break
        got += len(data)
        for level, kind, d in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += len(d) // 4
except OSError:
    pass
print(got, fds, flush=True)
"#;

/// A socket of another user where a pComponent's is expected (named by `--pcomponent`, or
/// handed to a program's shim) is refused before anything is sent: the fake gets no hello, and
/// none of the program's heap or userfaultfd descriptors.
#[test]
fn a_socket_of_another_user_in_a_pcomponents_place_gets_nothing() {
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::Builder::new().prefix("splitos-fake-").tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let alice = 60011u32;
    let shim = splitos().with_file_name("libsplitos_shim.so");
    for (n, how) in ["launcher", "shim"].iter().enumerate() {
        let sock = t.path().join(format!("fake{n}.sock"));
        let mut fake = Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                &with_abi(FAKE_PCOMPONENT),
                sock.to_str().unwrap(),
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = std::io::BufReader::new(fake.stdout.take().unwrap()).lines();
        assert_eq!(lines.next().unwrap().unwrap(), "ready");
        let out = if *how == "launcher" {
            as_user(
                alice,
                &[
                    splitos().to_str().unwrap(),
                    "run",
                    "--pcomponent",
                    sock.to_str().unwrap(),
                    "--",
                    "/bin/true",
                ],
                &[],
            )
        } else {
            as_user(
                alice,
                &["/bin/true"],
                &[
                    ("LD_PRELOAD", shim.to_str().unwrap()),
                    ("SPLITOS_PCOMP_SOCK", sock.to_str().unwrap()),
                ],
            )
        };
        let said = lines.next().unwrap().unwrap();
        let _ = fake.kill();
        let _ = fake.wait();
        assert!(!out.status.success(), "{how}: ran with a fake pComponent");
        assert!(
            text(&out.stderr).contains("uid 65534") || text(&out.stderr).contains("served by another user"),
            "{how}: {}",
            text(&out.stderr)
        );
        assert_eq!(
            said, "0 0",
            "{how}: the fake pComponent was sent something (bytes, descriptors)"
        );
    }
}

/// `splitos run` of `args` as user `uid` with `env`, its stdin and stdout piped.
fn spawn_as(uid: u32, args: &[&str], env: &[(&str, &str)]) -> std::process::Child {
    let (u, g) = (format!("--reuid={uid}"), format!("--regid={uid}"));
    Command::new("setpriv")
        .args([u.as_str(), g.as_str(), "--clear-groups"])
        .arg(splitos())
        .arg("run")
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Tries to fork, says how that went (one line: `read_line` reads only one), then holds until
/// its stdin closes.
const FORK_AND_HOLD: &str = "import os, sys\n\
try:\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n    print('forked', flush=True)\n\
except OSError as e:\n    print('fork:', e.strerror, flush=True)\n\
sys.stdin.read()\n";

#[test]
fn a_user_over_the_program_cap_is_refused_while_another_users_programs_run() {
    let (alice, bob) = (60031u32, 60032u32);
    let c = TestCluster::up(Some(&format!("[[pcomponent]]\nexcache = \"4M\"\nmax_programs_per_user = 2\n[[mcomponent]]\n[[vnode]]\nname = \"lab\"\nusers = [\"{alice}\", \"{bob}\"]\n")));
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let state = c.dir.path().to_str().unwrap().to_string();
    let env = [("SPLITOS_STATE_DIR", state.as_str())];
    let py = "/usr/bin/python3";
    let hold = |uid: u32| spawn_as(uid, &["--vnode", "lab", "--", py, "-c", FORK_AND_HOLD], &env);
    // Alice's first program may fork (its child is her second program for a moment); her
    // second may not: with it she holds both her programs.
    let mut first = hold(alice);
    assert_eq!(read_line(&mut first), "forked\n");
    let users_programs = |c: &TestCluster| {
        c.components("pcomponent")[0]["stats"]["users_programs"]
            .as_u64()
            .unwrap()
    };
    assert!(
        c.eventually(Duration::from_secs(10), |c| users_programs(c) == 1),
        "the child's slot is given back when it ends"
    );
    let mut second = hold(alice);
    assert_eq!(read_line(&mut second), "fork: Resource temporarily unavailable\n");
    assert_eq!(users_programs(&c), 2);
    // A third is refused at its start, and says why.
    let refused_before = c.metric(&p, "splitos_pcomp_program_connections_refused_total");
    let out = as_user(
        alice,
        &[
            splitos().to_str().unwrap(),
            "run",
            "--vnode",
            "lab",
            "--",
            py,
            "-c",
            "print(1)",
        ],
        &env,
    );
    assert!(!out.status.success() && out.stdout.is_empty(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("too many of this user's programs run there"),
        "{}",
        text(&out.stderr)
    );
    assert!(c.metric(&p, "splitos_pcomp_program_connections_refused_total") >= refused_before + 1.0);
    assert!(c.log("proc0").contains("too many of the user's programs run here"));
    // Bob's programs run meanwhile, forks included, as natively.
    let script = "import os\nx = [i * i for i in range(300000)]\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint(sum(x))\n";
    let native = Command::new(py).args(["-c", script]).output().unwrap();
    let out = as_user(
        bob,
        &[
            splitos().to_str().unwrap(),
            "run",
            "--vnode",
            "lab",
            "--",
            py,
            "-c",
            script,
        ],
        &env,
    );
    assert_eq!(text(&out.stdout), text(&native.stdout), "{}", text(&out.stderr));
    // Once one of Alice's programs ends, she may start another.
    drop(first.stdin.take());
    assert!(first.wait().unwrap().success());
    assert!(
        c.eventually(Duration::from_secs(10), |c| users_programs(c) == 1),
        "the slot is given back when the program ends"
    );
    let out = as_user(
        alice,
        &[
            splitos().to_str().unwrap(),
            "run",
            "--vnode",
            "lab",
            "--",
            py,
            "-c",
            "print(1)",
        ],
        &env,
    );
    assert_eq!(text(&out.stdout), "1\n", "{}", text(&out.stderr));
    drop(second.stdin.take());
    assert!(second.wait().unwrap().success());
}

/// Keeps `argv[2]` connections to the socket-call socket `argv[1]` open that never say
/// anything, opening new ones as the pComponent closes them, until its stdin closes.
const SILENT_CALLS: &str = "import select, socket, sys\n\
def conn():\n    s = socket.socket(socket.AF_UNIX)\n    s.connect(sys.argv[1])\n    return s\n\
socks = [conn() for _ in range(int(sys.argv[2]))]\n\
print('flooding', flush=True)\n\
while True:\n    r, _, _ = select.select(socks + [sys.stdin], [], [])\n    if sys.stdin in r:\n        break\n    for s in r:\n        s.close()\n        socks[socks.index(s)] = conn()\n";

/// A listener and 40 connections to it on the vNode's loopback: how many made it, and why
/// the others did not.
const CONNECT_40: &str = "import socket\n\
errors = {}\nok = 0\n\
try:\n    srv = socket.create_server(('127.0.0.1', 8795))\n\
except OSError as e:\n    print('listen:', e.strerror)\n    raise SystemExit\n\
for _ in range(40):\n    try:\n        c = socket.create_connection(('127.0.0.1', 8795))\n        a, _ = srv.accept()\n        c.close()\n        a.close()\n        ok += 1\n    except OSError as e:\n        errors[e.strerror] = errors.get(e.strerror, 0) + 1\n\
print(ok, errors)\n";

#[test]
fn a_flood_of_refused_connections_logs_a_few_lines_and_a_summary() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let sock = c.dir.path().join("programs/proc0.sock").to_str().unwrap().to_string();
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let before = c.metric(&p, "splitos_pcomp_program_connections_refused_total");
    // Nobody, granted nothing, connects 2000 times.
    let flood = "import socket, sys\nfor _ in range(2000):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect(sys.argv[1])\n    s.recv(64)\n    s.close()\nprint('done')";
    assert_eq!(as_nobody(flood, &[&sock]), "done");
    let refused = c.metric(&p, "splitos_pcomp_program_connections_refused_total") - before;
    assert_eq!(refused, 2000.0, "each refusal is counted");
    // Each line logged one by one, and the summaries of those that were not, account for
    // every refusal once the last window's summary is out.
    let lines = accounted(&c, "proc0", "refused a program-socket connection", 2000);
    assert!(lines <= 2000 / 10, "{lines} lines for 2000 refusals");
}

// ---- the managers' state: etcd behind TLS, records signed

/// A REST API token record of role admin as the managers keep it (`api::tokens`), encoded as
/// they encode it, for the token `splitos_ID_SECRET`: what someone who can write to the
/// managers' backend would plant.
fn forged_admin_record(id: &str, secret: &str) -> Vec<u8> {
    use sha2::Digest;
    #[derive(serde::Serialize)]
    struct Stored {
        id: String,
        hash: [u8; 32],
        info: splitos_rpc::TokenInfo,
    }
    let hash: [u8; 32] = sha2::Sha256::digest(secret.as_bytes()).into();
    postcard::to_allocvec(&Stored {
        id: id.into(),
        hash,
        info: splitos_rpc::TokenInfo {
            name: "forged".into(),
            admin: true,
            vnodes: Vec::new(),
            created_unix_s: 0,
        },
    })
    .unwrap()
}

fn b64(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
}

#[test]
fn etcd_answers_only_the_managers_and_a_record_they_did_not_sign_grants_nothing() {
    let h = Hosts::new(&["e"]);
    let data = tempfile::tempdir().unwrap();
    let state = TestCluster::state_dir();
    let etcd = EtcdCluster::start(&h, &["e"], data.path(), state.path());
    let (gm, api) = (
        format!("127.0.0.1:{}", restartable_port()),
        format!("127.0.0.1:{}", restartable_port()),
    );
    let cfg = format!("[cluster]\n{}etcd_prefix = \"/sec\"\ngm = \"{gm}\"\napi = \"{api}\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n", etcd.config());
    let c = TestCluster::up_in(state, Some(&cfg));
    let admin = api_token(&c, &["ops", "--admin"]);
    assert_eq!(http(&api, "GET", "/api/v1/whoami", Some(&admin), b"").0, 200);

    // A user who reaches etcd's port gets nothing from it: no key read or written, in the
    // clear or over TLS without the cluster's client certificate.
    let url = format!("{}/v3/kv/range", etcd.endpoints[0]);
    let body = format!("{{\"key\":\"{}\",\"range_end\":\"{}\"}}", b64(b"/"), b64(b"0"));
    for scheme in ["https", "http"] {
        let u = url.replacen("https", scheme, 1);
        let out = as_user(
            65534,
            &["curl", "-sS", "-k", "--max-time", "5", "-X", "POST", &u, "-d", &body],
            &[],
        );
        assert!(
            !out.status.success() && !text(&out.stdout).contains("kvs"),
            "{scheme}: {} {}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    // Nor the managers' files: their directory is the cluster user's alone.
    for f in ["gm/state.key", "gm/etcd-client.key"] {
        assert_eq!(
            as_nobody(READ_FILE, &[c.dir.path().join(f).to_str().unwrap()]),
            "denied",
            "{f}"
        );
    }
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(c.dir.path().join("gm")).unwrap().permissions().mode() & 0o777,
        0o700
    );

    // Someone who could write etcd's keys anyway (with a certificate of the cluster's
    // authority, as a plain-http etcd let every local user) plants an admin token and deletes
    // the leader's key, so that the manager steps down and reads the state again.
    let tls = &etcd.tls[0];
    let put = |path: &str, body: String| {
        let f = |n: &str| tls.join(n).to_str().unwrap().to_string();
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "5",
                "--cacert",
                &f("ca.pem"),
                "--cert",
                &f("etcd.pem"),
                "--key",
                &f("etcd.key"),
                "-X",
                "POST",
                &format!("{}{path}", etcd.endpoints[0]),
                "-d",
                &body,
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{path}: {}", text(&out.stderr));
    };
    let (id, secret) = ("00112233deadbeef", "ab".repeat(32));
    put(
        "/v3/kv/put",
        format!(
            "{{\"key\":\"{}\",\"value\":\"{}\"}}",
            b64(b"/sec/state/tokens/forged"),
            b64(&forged_admin_record(id, &secret))
        ),
    );
    put("/v3/kv/deleterange", format!("{{\"key\":\"{}\"}}", b64(b"/sec/leader")));
    let refused = |c: &TestCluster| c.log("gm").contains("did not sign");
    assert!(
        c.eventually(Duration::from_secs(30), refused),
        "the manager read the state again and refused the record: {}",
        c.log("gm")
    );
    assert!(
        c.eventually(Duration::from_secs(30), |_| std::net::TcpStream::connect(&api).is_ok()
            && http(&api, "GET", "/api/v1/whoami", Some(&admin), b"").0 == 200),
        "{}",
        c.log("gm")
    );
    let forged = format!("splitos_{id}_{secret}");
    assert_eq!(
        http(&api, "GET", "/api/v1/whoami", Some(&forged), b"").0,
        401,
        "a token the managers did not make"
    );
    let grant = br#"{"name":"loot","users":["nobody"]}"#;
    assert_eq!(http(&api, "POST", "/api/v1/vnodes", Some(&forged), grant).0, 401);
    assert!(c.log("gm").contains("this manager leads now"), "{}", c.log("gm"));
}

// ---- Socket-call slots are capped per vNode, not per user

/// Makes sockets until 50 are refused (or 2000 were made); prints the refusals by reason.
const SOCKETS_UNTIL_REFUSED: &str = "import socket\n\
errors = {}\n\
for _ in range(2000):\n    try:\n        socket.socket().close()\n    except OSError as e:\n        errors[e.strerror] = errors.get(e.strerror, 0) + 1\n        if sum(errors.values()) == 50:\n            break\n\
print(errors)\n";

#[test]
fn a_vnodes_users_flooding_socket_calls_leave_another_vnode_its_share_and_get_eagain() {
    let users = [60051u32, 60052, 60053, 60054];
    let bob = 60055u32;
    let h = Hosts::new(&["p1"]);
    let granted: Vec<String> = users.iter().map(|u| format!("\"{u}\"")).collect();
    let cfg = format!(
        "[cluster]\ngm = \"{ip}:0\"\nnetns = \"{ns}\"\n[[pcomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[mcomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[ncomponent]]\nlisten = \"{ip}:0\"\nnetns = \"{ns}\"\n[[vnode]]\nname = \"a\"\nusers = [{granted}]\n[[vnode]]\nname = \"b\"\nusers = [\"{bob}\"]\n",
        ns = h.netns("p1"),
        ip = h.addr("p1"),
        granted = granted.join(", ")
    );
    let c = TestCluster::up(Some(&cfg));
    let net_sock = c
        .dir
        .path()
        .join("programs/proc0.sock.net")
        .to_str()
        .unwrap()
        .to_string();
    let state = c.dir.path().to_str().unwrap().to_string();
    let py = "/usr/bin/python3";
    let native = h.exec("p1", &[py, "-c", CONNECT_40]).output().unwrap();
    assert_eq!(text(&native.stdout), "40 {}\n", "{}", text(&native.stderr));
    let in_p1 = |uid: u32, args: &[&str]| {
        let mut cmd = h.exec(
            "p1",
            &[
                "setpriv",
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                splitos().to_str().unwrap(),
                "run",
            ],
        );
        cmd.args(args).env("SPLITOS_STATE_DIR", &state).env_remove("SPLITOS_GM");
        cmd
    };
    let flood = |uid: u32, n: &str| {
        let mut f = in_p1(uid, &["--vnode", "a", "--", py, "-c", SILENT_CALLS, &net_sock, n])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        assert_eq!(read_line(&mut f), "flooding\n");
        f
    };
    let stop = |mut f: std::process::Child| {
        drop(f.stdin.take());
        let _ = f.wait();
    };
    // Every user of vNode a keeps 300 silent socket calls open: more than all slots, as many
    // as four users' shares were.
    let floods: Vec<std::process::Child> = users.iter().map(|&u| flood(u, "300")).collect();
    let out = in_p1(bob, &["--vnode", "b", "--", py, "-c", CONNECT_40])
        .output()
        .unwrap();
    let busy = c.components("pcomponent")[0]["stats"]["net"]["busy"].as_u64().unwrap();
    floods.into_iter().for_each(stop);
    assert_eq!(
        text(&out.stdout),
        text(&native.stdout),
        "vNode b's connects: {}",
        text(&out.stderr)
    );
    assert!(
        busy > 0,
        "vNode a's calls beyond its share were answered at once, not given threads"
    );
    // One user holds vNode a's share; another user's program of vNode a is over it, and is
    // told to try again (answered at once, the stub mostly idle: the answer may come before
    // the call is sent).
    let holder = flood(users[1], "64");
    let over = in_p1(users[0], &["--vnode", "a", "--", py, "-c", SOCKETS_UNTIL_REFUSED])
        .output()
        .unwrap();
    stop(holder);
    assert_eq!(
        text(&over.stdout),
        "{'Resource temporarily unavailable': 50}\n",
        "{}",
        text(&over.stderr)
    );
}

// ---- Refusals logged a few lines at a time, per peer

/// The lines of `log` that `what` logged one by one, and the refusals its summaries counted
/// (`crates/rpc/src/refusals.rs`).
fn tally(log: &str, what: &str) -> (u64, u64) {
    let summary = " more not logged one by one";
    let lines = log.lines().filter(|l| l.contains(what) && !l.contains(summary)).count() as u64;
    let summarised = log
        .lines()
        .filter_map(|l| {
            l.split(&format!("{what}: "))
                .nth(1)?
                .split(summary)
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    (lines, summarised)
}

/// Waits until the lines and summaries of `what` in the log `name` account for `refused`
/// refusals (the last summary comes when its window ends); returns the lines logged one by one.
fn accounted(c: &TestCluster, name: &str, what: &str, refused: u64) -> u64 {
    let whole = |c: &TestCluster| {
        let (lines, summarised) = tally(&c.log(name), what);
        lines + summarised == refused
    };
    assert!(
        c.eventually(Duration::from_secs(30), whole),
        "{refused} refused, {:?} logged and summarised:\n{}",
        tally(&c.log(name), what),
        c.log(name)
    );
    tally(&c.log(name), what).0
}

/// A program that asks for 128 MiB, `argv[1]` times, and says how often malloc said no.
const MALLOCS: &str = "import ctypes, sys\nlibc = ctypes.CDLL(None)\nlibc.malloc.restype = ctypes.c_void_p\nprint(sum(1 for _ in range(int(sys.argv[1])) if not libc.malloc(128 << 20)))";

#[test]
fn a_program_mapping_past_its_vnodes_quota_in_a_loop_fills_no_log() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[vnode]]\nname = \"small\"\nusers = [\"root\"]\nmemory = \"64M\"\n"));
    let out = c.run(&["--vnode", "small"], &[&python3(), "-c", MALLOCS, "2000"]);
    assert_eq!(text(&out.stdout), "2000\n", "{}", text(&out.stderr));
    // The home counted every refusal; its log has a few lines and summaries for the rest.
    let refused = c.components("mcomponent")[0]["stats"]["vnode_memory"]["small"]["refused"]
        .as_u64()
        .unwrap();
    assert!(refused >= 2000, "{refused}");
    let lines = accounted(&c, "mem0", "memory quota", refused);
    assert!(lines <= refused / 10, "{lines} lines for {refused} refusals");
}

/// Sends 64 bytes that are no socket call to the socket-call socket `argv[1]`, `argv[2]`
/// times, each on a connection of its own, and waits for the pComponent to close it.
const GARBAGE_CALLS: &str = "import socket, sys\nfor _ in range(int(sys.argv[2])):\n    s = socket.socket(socket.AF_UNIX)\n    s.connect(sys.argv[1])\n    s.sendall(b'\\xa5' * 64)\n    s.shutdown(socket.SHUT_WR)\n    s.recv(64)\n    s.close()\nprint('sent')";

#[test]
fn garbage_on_the_socket_call_socket_in_a_loop_fills_no_log_and_hides_no_other_users_lines() {
    let bystander = 60071u32;
    let c = TestCluster::up(Some(&format!("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[vnode]]\nname = \"flooder\"\nusers = [\"root\"]\n[[vnode]]\nname = \"bystander\"\nusers = [\"{bystander}\"]\n")));
    let net_sock = c
        .dir
        .path()
        .join("programs/proc0.sock.net")
        .to_str()
        .unwrap()
        .to_string();
    // One every user may run.
    let py = "/usr/bin/python3";
    let refused = |c: &TestCluster| {
        c.components("pcomponent")[0]["stats"]["net"]["refused"]
            .as_u64()
            .unwrap()
    };
    let before = refused(&c);
    let out = c.run(&["--vnode", "flooder"], &[py, "-c", GARBAGE_CALLS, &net_sock, "2000"]);
    assert_eq!(text(&out.stdout), "sent\n", "{}", text(&out.stderr));
    // Another user's refusal right after gets its own line, whatever the flood took.
    let state = c.dir.path().to_str().unwrap().to_string();
    let out = as_user(
        bystander,
        &[
            splitos().to_str().unwrap(),
            "run",
            "--vnode",
            "bystander",
            "--",
            py,
            "-c",
            GARBAGE_CALLS,
            &net_sock,
            "1",
        ],
        &[("SPLITOS_STATE_DIR", &state)],
    );
    assert_eq!(text(&out.stdout), "sent\n", "{}", text(&out.stderr));
    let what = "refused a malformed socket call";
    let lines = accounted(&c, "proc0", what, refused(&c) - before);
    assert!(lines <= 2000 / 10, "{lines} lines for 2001 refusals");
    assert!(
        c.log("proc0")
            .lines()
            .any(|l| l.contains(what) && l.contains("bystander")),
        "{}",
        c.log("proc0")
    );
}

// ---- A slowloris on the API starves operators

/// Keeps `argv[2]` connections to the HTTP server at `argv[1]` sending a request's headers, a
/// line a second, never ending them (a slowloris); every second it opens again those the server
/// closed. Says `flooding` once all were opened, and how many it opened in all when its stdin
/// closes.
const SLOWLORIS: &str = r#"
import select, socket, sys
host, port = sys.argv[1].rsplit(":", 1)
opened = 0
def conn():
    global opened
    opened += 1
    s = socket.create_connection((host, int(port)))
    try:
        s.sendall(b"GET /api/v1/whoami HTTP/1.1\r\nHost: x\r\n")
    except OSError:
        pass
    return s
socks = [conn() for _ in range(int(sys.argv[2]))]
print("flooding", flush=True)
while not select.select([sys.stdin], [], [], 1)[0]:
    closed = select.select(socks, [], [], 0)[0]
    for i, s in enumerate(socks):
        if s in closed:
            s.close()
            socks[i] = conn()
            continue
        try:
            s.sendall(b"X-a: b\r\n")
        except OSError:
            pass
print(opened)
"#;

/// SLOWLORIS as user `uid` with `n` connections, flooding.
fn slowloris(uid: u32, api: &str, n: usize) -> std::process::Child {
    let (u, g) = (format!("--reuid={uid}"), format!("--regid={uid}"));
    let mut f = Command::new("setpriv")
        .args([
            u.as_str(),
            g.as_str(),
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            SLOWLORIS,
            api,
            &n.to_string(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(read_line(&mut f), "flooding\n");
    f
}

/// Ends a SLOWLORIS; how many connections it opened in all.
fn stop_slowloris(mut f: std::process::Child) -> usize {
    drop(f.stdin.take());
    let out = f.wait_with_output().unwrap();
    text(&out.stdout).trim().parse().unwrap()
}

/// GETs /livez from the HTTP server at `argv[1]`; prints the status line, or `closed`.
const LIVEZ: &str = r#"
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((host, int(port)))
try:
    s.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    print(s.makefile("rb").readline().decode().strip() or "closed")
except (BrokenPipeError, ConnectionResetError):
    print("closed")
"#;

/// The REST API's connections refused for `cap` (`peer` or `all`), as the managers count them.
fn api_refused(c: &TestCluster, gm: &str, cap: &str) -> f64 {
    let out = c.cmd(&["cluster", "metrics"]).output().unwrap();
    assert!(out.status.success(), "cluster metrics: {}", text(&out.stderr));
    let labels = [
        format!("component=\"{gm}\""),
        "server=\"api\"".to_string(),
        format!("cap=\"{cap}\""),
    ];
    let all = text(&out.stdout);
    let series = all.lines().filter(|l| {
        l.starts_with("splitos_http_connections_refused_total{") && labels.iter().all(|x| l.contains(x.as_str()))
    });
    series
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[test]
fn a_slowloris_of_one_user_leaves_the_api_to_operators_and_other_users() {
    let c = TestCluster::up(None);
    let status = c.status();
    let (api, gm) = (
        status["api"].as_str().unwrap().to_string(),
        status["gm"].as_str().unwrap().to_string(),
    );
    let admin = api_token(&c, &["ops", "--admin"]);
    let livez_as = |uid: u32| {
        text(&as_user(uid, &["/usr/bin/python3", "-c", LIVEZ, &api], &[]).stdout)
            .trim()
            .to_string()
    };
    // Nobody holds 400 connections (more than the 256 the API serves at once), renewing them,
    // while an operator makes 30 requests over about 12 s: past the 10 s the server gives a
    // request's headers, so the flood's connections are closed and opened again meanwhile.
    let nobody = slowloris(65534, &api, 400);
    for i in 0..30 {
        let (code, _, body) = http(&api, "GET", "/api/v1/components", Some(&admin), b"");
        assert_eq!(code, 200, "request {i}: {body}");
        std::thread::sleep(Duration::from_millis(400));
    }
    let ps = c.cmd(&["ps"]).output().unwrap();
    assert!(ps.status.success(), "splitos ps: {}", text(&ps.stderr));
    // Another user of the host is served too: the flood holds its own share, not all.
    assert_eq!(livez_as(60061), "HTTP/1.1 200 OK");
    let by_peer = api_refused(&c, &gm, "peer");
    assert!(
        by_peer >= 400.0 - 64.0,
        "{by_peer} connections refused for their peer's cap"
    );
    let log = c.log("gm");
    assert!(
        log.contains("HTTP connection refused: the peer holds as many connections as one peer may")
            && log.contains("uid 65534 on this host"),
        "{log}"
    );
    assert!(stop_slowloris(nobody) > 400, "the flood opened no connection again");
    // Four users hold 64 each: the API's 256 are all taken. Another user is refused, and
    // counted; the host's operators (root) are still served.
    let floods: Vec<std::process::Child> = (60062..60066).map(|u| slowloris(u, &api, 80)).collect();
    assert_eq!(livez_as(60066), "closed");
    for i in 0..5 {
        let (code, _, body) = http(&api, "GET", "/api/v1/whoami", Some(&admin), b"");
        assert_eq!(code, 200, "request {i} with all connections taken: {body}");
    }
    let ps = c.cmd(&["ps"]).output().unwrap();
    assert!(
        ps.status.success(),
        "splitos ps with all connections taken: {}",
        text(&ps.stderr)
    );
    assert!(
        api_refused(&c, &gm, "all") >= 1.0,
        "the refusal for the server's cap was not counted"
    );
    for f in floods {
        stop_slowloris(f);
    }
}

// ---- Forks over a user's cap

/// Two forkers, each forking 20 children as fast as it can once both exist, every child
/// holding until the pipe closes: one line (how many forks succeeded and how many failed with EAGAIN), then,
/// once stdin closes, each child's exit code.
const FORK_RACE: &str = r#"
import errno, os, sys
hold_r, hold_w = os.pipe()
res_r, res_w = os.pipe()
go_r, go_w = os.pipe()
def forker():
    os.read(go_r, 1)
    kids, eagain = [], 0
    for _ in range(20):
        try:
            pid = os.fork()
        except OSError as e:
            if e.errno != errno.EAGAIN:
                raise
            eagain += 1
            continue
        if pid == 0:
            os.close(hold_w)
            os.read(hold_r, 1)
            os._exit(0)
        kids.append(pid)
    os.write(res_w, f"{len(kids)} {eagain}\n".encode())
    os.close(hold_w)
    codes = [os.waitstatus_to_exitcode(os.waitpid(k, 0)[1]) for k in kids]
    os.write(res_w, (" ".join(map(str, codes)) + "\n").encode())
    os._exit(0)
forkers = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        forker()
    forkers.append(pid)
os.write(go_w, b"gg")
os.close(res_w)
res = os.fdopen(res_r)
counts = [res.readline().split() for _ in forkers]
print(sum(int(c[0]) for c in counts), sum(int(c[1]) for c in counts), flush=True)
sys.stdin.read()
os.close(hold_w)
codes = [res.readline().split() for _ in forkers]
for f in forkers:
    os.waitpid(f, 0)
print("exits", sorted(set(c for cs in codes for c in cs)))
"#;

#[test]
fn forks_over_the_program_cap_fail_with_eagain_in_the_parent_and_no_child_is_refused() {
    let alice = 60051u32;
    let cap = 8;
    let c = TestCluster::up(Some(&format!("[[pcomponent]]\nexcache = \"4M\"\nmax_programs_per_user = {cap}\n[[mcomponent]]\n[[vnode]]\nname = \"lab\"\nusers = [\"{alice}\"]\n")));
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let state = c.dir.path().to_str().unwrap().to_string();
    let refused_before = c.metric(&p, "splitos_pcomp_program_connections_refused_total");
    let mut race = spawn_as(
        alice,
        &["--vnode", "lab", "--", "/usr/bin/python3", "-c", FORK_RACE],
        &[("SPLITOS_STATE_DIR", state.as_str())],
    );
    // The parent and its two forkers hold three of the user's programs: five of the 40 forks
    // fit, and every other one failed in its parent.
    let counts = read_line(&mut race);
    // The status shows the pComponent's count as of its last heartbeat.
    let held = |c: &TestCluster| {
        c.components("pcomponent")[0]["stats"]["users_programs"]
            .as_u64()
            .unwrap()
    };
    let at_cap = c.eventually(Duration::from_secs(10), |c| held(c) == cap as u64);
    let held_then = held(&c);
    drop(race.stdin.take());
    let out = race.wait_with_output().unwrap();
    assert_eq!(
        counts,
        format!("{} {}\n", cap - 3, 40 - (cap - 3)),
        "{}",
        text(&out.stderr)
    );
    assert!(
        at_cap,
        "the pComponent holds {held_then} of the user's programs while they all run, not the cap of {cap}"
    );
    // Every child that fork(2) made ran: none was refused at its hello (exit 127).
    assert_eq!(text(&out.stdout), "exits ['0']\n", "{}", text(&out.stderr));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        c.metric(&p, "splitos_pcomp_program_connections_refused_total"),
        refused_before,
        "{}",
        c.log("proc0")
    );
    let log = c.log("proc0");
    assert!(!log.contains("too many of the user's programs run here"));
    // The forks refused say why where the admin looks.
    assert!(
        log.contains("refused a fork: the user runs as many programs here as they may"),
        "{log}"
    );
}
