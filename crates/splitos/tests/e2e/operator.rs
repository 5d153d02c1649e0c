//! The operator's commands (docs/control-plane.md). `splitos top` shows the jobs' misses per
//! second while they run, to an admin with the components and to a tenant without. Cordoning
//! and draining: a cordoned
//! pComponent starts no new program, whether placed by the global managers or reached by its
//! program socket, and a cordoned mComponent takes no new home or vRegion, as their own
//! counters show, while programs keep giving the output of a native run; `cluster drain` waits
//! for what runs there to end, and says so when it gives up.
use crate::common;
use std::time::Duration;

use common::*;

fn splitos_ok(c: &TestCluster, args: &[&str]) -> String {
    let out = c.cmd(args).output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn cordoned_components_take_no_new_work_and_drain_waits_for_the_rest() {
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"4M\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[mcomponent]]\n",
    ));
    let pcomps = c.components("pcomponent");
    let a = pcomps
        .iter()
        .find(|p| p["shim_sock"].as_str().unwrap().ends_with("proc0.sock"))
        .unwrap()
        .clone();
    let (a_id, a_sock) = (
        a["id"].as_u64().unwrap().to_string(),
        a["shim_sock"].as_str().unwrap().to_string(),
    );
    let m1 = c.components("mcomponent")[0]["id"].as_u64().unwrap().to_string();

    assert!(splitos_ok(&c, &["cluster", "cordon", &a_id]).contains("cordoned: it takes no new programs"));
    assert!(splitos_ok(&c, &["cluster", "cordon", &m1]).contains("cordoned: it takes no new homes and vRegions"));
    let cordoned: Vec<String> = c.status()["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["cordoned"] == true)
        .map(|x| x["id"].to_string())
        .collect();
    assert_eq!(cordoned.len(), 2, "{}", c.status());
    assert!(splitos_ok(&c, &["cluster", "status"]).contains("yes, cordoned"));

    // Programs placed by the managers run on the other pComponent, their memory on the other
    // mComponent, with the output of a native run.
    let py = python3();
    let prog = [
        py.as_str(),
        "-c",
        "x = {i: str(i) * 3 for i in range(100000)}; print(len(x), sum(map(len, x.values())))",
    ];
    for _ in 0..3 {
        let out = c.run(&[], &prog);
        assert_eq!(text(&out.stdout), text(&native(&prog).stdout), "{}", text(&out.stderr));
    }
    let of = |role: &str, id: &str| {
        c.components(role)
            .into_iter()
            .find(|x| x["id"].as_u64() == id.parse().ok())
            .unwrap()
    };
    assert_eq!(
        of("pcomponent", &a_id)["stats"]["totals"]["processes"],
        0,
        "the cordoned pComponent ran nothing"
    );
    let m = of("mcomponent", &m1);
    assert_eq!(
        (m["stats"]["fetches"].as_u64(), m["stats"]["flushes"].as_u64()),
        (Some(0), Some(0)),
        "the cordoned mComponent served no page: {m}"
    );

    // Its program socket refuses a new run too, and says why.
    let out = c.run(&["--pcomponent", &a_sock], &["true"]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("is cordoned: it takes no new programs"),
        "{}",
        text(&out.stderr)
    );

    // Uncordoned, it takes programs again as soon as the command returns, and cordoned, it
    // refuses them as soon: the pComponent has its cordon before the command says so (twice,
    // so that a heartbeat carrying it in time is not what passes).
    for _ in 0..2 {
        splitos_ok(&c, &["cluster", "uncordon", &a_id]);
        let out = c.run(&["--pcomponent", &a_sock], &["true"]);
        assert!(out.status.success(), "right after uncordon: {}", text(&out.stderr));
        splitos_ok(&c, &["cluster", "cordon", &a_id]);
        let out = c.run(&["--pcomponent", &a_sock], &["true"]);
        assert!(
            !out.status.success() && text(&out.stderr).contains("is cordoned"),
            "right after cordon: {}",
            text(&out.stderr)
        );
    }
    splitos_ok(&c, &["cluster", "uncordon", &a_id]);
    let hold = program("hold");
    let mut job = c.spawn(&["--pcomponent", &a_sock], &[hold.to_str().unwrap(), "4"]);
    assert_eq!(read_line(&mut job), "ready\n");
    let out = c.cmd(&["cluster", "drain", &a_id, "--timeout", "2"]).output().unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("is not drained after 2 s: 1 process(es) run on it"),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(of("pcomponent", &a_id)["cordoned"], true);
    // The job ends (its stdin closes) while drain waits: drain then returns.
    let drain = c
        .cmd(&["cluster", "drain", &a_id, "--timeout", "30"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    drop(job.stdin.take());
    let _ = job.wait();
    let out = drain.wait_with_output().unwrap();
    assert!(
        out.status.success() && text(&out.stdout).contains("drained in"),
        "{}",
        text(&out.stdout)
    );

    // Bad input: an id no component has.
    let out = c.cmd(&["cluster", "cordon", "12345"]).output().unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("no component has id 12345"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn top_shows_the_misses_per_second_of_a_running_job() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let randpages = program("randpages");
    // 8 MiB over a 4 MiB ExCache, a round every 100 ms or so: misses all along, at a pace
    // that leaves the suite's other tests their CPUs.
    let mut job = c.spawn(&[], &[randpages.to_str().unwrap(), "8", "100000", "100"]);
    let pcomp = c.components("pcomponent")[0]["id"].to_string();
    assert!(
        c.eventually(Duration::from_secs(10), |c| c.components("pcomponent")[0]["stats"]
            ["processes"]
            .as_array()
            .is_some_and(|p| !p.is_empty()))
    );
    let tenant = api_token(&c, &["default-ci", "--vnode", "default"]);
    for (token, components) in [(None, true), (Some(tenant.as_str()), false)] {
        let mut args = vec!["top", "-n", "2", "-d", "1"];
        args.extend(token.map(|t| ["--token", t]).into_iter().flatten());
        let out = splitos_ok(&c, &args);
        let frames: Vec<&str> = out.split("splitos top: ").filter(|f| !f.is_empty()).collect();
        assert_eq!(frames.len(), 2, "{out}");
        assert_eq!(
            frames[1].contains(&format!(" {pcomp} ")) && frames[1].contains("ROLE"),
            components,
            "{out}"
        );
        // The second look has a rate: the job's line, its misses per second above zero.
        let line = frames[1]
            .lines()
            .find(|l| l.contains("randpages"))
            .unwrap_or_else(|| panic!("{out}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        let per_s: f64 = cols[4].parse().unwrap_or_else(|_| panic!("{line}"));
        assert!(per_s > 0.0 && cols[2] == "default", "{line}");
    }
    let out = c.cmd(&["top", "-d", "0"]).output().unwrap();
    assert!(!out.status.success() && text(&out.stderr).contains("--interval must be at least 0.1 seconds"));
    top_on_a_terminal(&c);
    let _ = job.kill();
    let _ = job.wait();
}

/// `splitos top` on a terminal 80 columns wide, as its controlling terminal: no line is
/// wider, it says that q quits, q quits at once, and the terminal is given back as it was.
fn top_on_a_terminal(c: &TestCluster) {
    use nix::sys::termios::{tcgetattr, LocalFlags};
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let size = nix::pty::Winsize {
        ws_row: 40,
        ws_col: 80,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = nix::pty::openpty(&size, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let mut cmd = c.cmd(&["top", "-d", "30"]);
    cmd.stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave.try_clone().unwrap());
    // SAFETY: setsid and ioctl are async-signal-safe and touch no memory of ours; the
    // terminal becomes the child's controlling one, as a login's is.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            (libc::ioctl(0, libc::TIOCSCTTY, 0) == 0)
                .then_some(())
                .ok_or_else(std::io::Error::last_os_error)
        })
    };
    let mut top = cmd.spawn().unwrap();
    let mut master = std::fs::File::from(pty.master);
    // The first frame: up to its jobs' header.
    let mut seen = Vec::new();
    let t0 = std::time::Instant::now();
    while !text(&seen).contains("COMMAND") && t0.elapsed() < Duration::from_secs(20) {
        let mut buf = [0u8; 4096];
        match master.read(&mut buf) {
            Ok(n) if n > 0 => seen.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let frame = text(&seen);
    assert!(frame.contains("(q quits)"), "{frame}");
    let wide: Vec<&str> = frame
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| l.rsplit('\x1b').next().unwrap().chars().count() > 80)
        .collect();
    assert!(wide.is_empty(), "wider than the terminal: {wide:?}");
    let asked = std::time::Instant::now();
    std::io::Write::write_all(&mut master, b"q").unwrap();
    let mut ended = None;
    while ended.is_none() && asked.elapsed() < Duration::from_secs(5) {
        ended = top.try_wait().unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = top.kill();
    let _ = top.wait();
    assert!(ended.is_some_and(|s| s.success()), "q did not quit top: {ended:?}");
    let given_back = tcgetattr(&slave).unwrap().local_flags;
    assert!(
        given_back.contains(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG),
        "{given_back:?}"
    );
}

/// A manager that died is started again by name, at the address the components know, and
/// they register with it again; `cluster down` stops it with the rest (it is not the PID
/// recorded at start), and counts only the processes it stopped.
#[test]
fn a_dead_manager_is_restarted_by_name_and_down_stops_it_counting_only_what_it_stopped() {
    let c = TestCluster::up(None);
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    // While it is down, no "any port" of a connection or listener on this host may take the
    // addresses it comes back at: they are below the ephemeral range.
    let ephemeral: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let api = c.status()["api"].as_str().unwrap().to_string();
    for a in [&gm, &api] {
        let port = a.rsplit(':').next().unwrap().parse::<u16>().unwrap();
        assert!(port < ephemeral, "{a} is in the ephemeral range, from {ephemeral}");
    }
    let recorded = c.state_pids();
    let gm_pid = c.pid_of_addr(&gm);
    // Dead, but still in the record, as a crash leaves it.
    // SAFETY: kill(2) takes no pointers; the PID is this test's own manager.
    unsafe { libc::kill(gm_pid, libc::SIGKILL) };
    assert!(c.eventually(Duration::from_secs(5), |_| !pid_running(gm_pid)));

    let out = c.cmd(&["cluster", "restart", "nosuch"]).output().unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("gm, mem0, mem1, proc0, storage0"),
        "{}",
        text(&out.stderr)
    );
    let said = splitos_ok(&c, &["cluster", "restart", "gm"]);
    assert!(said.contains("gm started again (pid ") && said.contains(&gm), "{said}");
    let again: i32 = said
        .split("(pid ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let out = c.cmd(&["cluster", "restart", "gm"]).output().unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains(&format!("gm runs (pid {again})")),
        "{}",
        text(&out.stderr)
    );
    // The components find it where it was, and programs run again.
    assert!(
        c.eventually(Duration::from_secs(15), |c| c.status()["components"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["alive"] == true && x["role"] != "global-managers")
            .count()
            == recorded.len() - 1),
        "{}",
        c.log("gm")
    );
    let out = c.run(&[], &["true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let said = splitos_ok(&c, &["cluster", "down"]);
    assert!(
        said.contains(&format!(
            "stopped {} component process(es); 1 had exited before",
            recorded.len()
        )),
        "{said}"
    );
    assert!(!pid_running(again), "the restarted manager was left running");
}

/// A cluster started again after `cluster down` shows only its own components, each alive:
/// none of the earlier start's lingers as lost.
#[test]
fn a_cluster_started_again_shows_no_component_of_the_last_start() {
    let c = TestCluster::up(None);
    let before: Vec<String> = c.status()["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].to_string())
        .collect();
    splitos_ok(&c, &["cluster", "down"]);
    splitos_ok(&c, &["cluster", "up"]);
    let status = c.status();
    let comps = status["components"].as_array().unwrap();
    assert_eq!(comps.len(), before.len(), "{status}");
    assert!(
        comps
            .iter()
            .all(|x| x["alive"] == true && !before.contains(&x["id"].to_string())),
        "{status}"
    );
}
