//! Several global managers with their state in etcd (docs/deployment.md): three hosts, each
//! with an etcd member and a manager, and a fourth with the components. Programs run through a
//! dead leader, partitions of an etcd member and of the leader, and a restart of every
//! manager at once, with output equal to native.
use crate::common;
use std::time::Duration;

use common::*;

/// Who leads and which managers are alive, as `cluster status --json` says.
fn leadership(c: &TestCluster) -> Option<(String, Vec<String>)> {
    let out = c.cmd(&["cluster", "status", "--json"]).output().ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let mut managers: Vec<String> = v["managers"]
        .as_array()?
        .iter()
        .filter_map(|m| m.as_str().map(String::from))
        .collect();
    managers.sort();
    Some((v["leader"].as_str()?.to_string(), managers))
}

/// The leader that took over from `old`, waited for up to `secs` and read once: a second
/// read may find no leader for a moment (an election under way).
fn leader_after(c: &TestCluster, old: &str, secs: u64) -> String {
    let mut got = None;
    let held = c.eventually(Duration::from_secs(secs), |c| {
        got = leadership(c).map(|(l, _)| l).filter(|l| l != old);
        got.is_some()
    });
    assert!(held, "{}", story(c));
    got.unwrap()
}

/// Who leads, and the last lines of every manager's logs: what a failed check shows.
fn story(c: &TestCluster) -> String {
    let mut out = format!("{:?}\n", leadership(c));
    let mut logs: Vec<_> = std::fs::read_dir(c.dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("gm") && n.to_string_lossy().ends_with(".log"))
        })
        .collect();
    logs.sort();
    for l in logs {
        let text = std::fs::read_to_string(&l).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(12).collect();
        out += &format!(
            "--- {}\n{}\n",
            l.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    out
}

/// The argument vector of process `pid`.
fn argv(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap()
        .strip_suffix(&[0])
        .unwrap()
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Starts a manager again on host `host` as it was started (`argv`), logging to `log`.
fn start_manager(c: &TestCluster, h: &Hosts, host: &str, argv: &[String], log: &str) {
    let log = std::fs::File::create(c.dir.path().join(format!("{log}.log"))).unwrap();
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let child = {
        use std::os::unix::process::CommandExt;
        h.exec(host, &argv)
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap()
    };
    remember_pid(c.dir.path(), child.id() as i32);
}

/// The time stamp of the last line of `log` that contains `what` (log lines start with one,
/// in UTC and of one width, so that they compare as text).
fn last_stamp(log: &str, what: &str) -> Option<String> {
    log.lines()
        .rfind(|l| l.contains(what))
        .and_then(|l| l.split_whitespace().next())
        .map(String::from)
}

#[test]
fn managers_in_etcd_survive_a_dead_leader_partitions_and_a_restart_of_all() {
    let h = Hosts::new(&["a", "b", "c", "w"]);
    let data = tempfile::tempdir().unwrap();
    let state = TestCluster::state_dir();
    let etcd = EtcdCluster::start(&h, &["a", "b", "c"], data.path(), state.path());
    let gm_at = |host: &str| format!("{}:7100", h.addr(host));
    let host_of = |addr: &str| {
        ["a", "b", "c"]
            .into_iter()
            .find(|n| gm_at(n) == addr)
            .unwrap_or_else(|| panic!("no manager host has {addr}"))
    };
    let at = |host: &str| format!("listen = \"{}:0\"\nnetns = \"{}\"\n", h.addr(host), h.netns(host));
    let mut cfg = format!(
        "[cluster]\n{}etcd_prefix = \"/managers-test\"\napi = \"off\"\nvregion_size = \"4M\"\n",
        etcd.config()
    );
    for n in ["a", "b", "c"] {
        cfg += &format!("[[gm]]\nlisten = \"{}\"\nnetns = \"{}\"\n", gm_at(n), h.netns(n));
    }
    cfg += &format!(
        "[[pcomponent]]\n{}excache = \"4M\"\n[[mcomponent]]\n{}[[mcomponent]]\n{}",
        at("w"),
        at("w"),
        at("w")
    );
    let c = TestCluster::up_in(state, Some(&cfg));
    let all: Vec<String> = ["a", "b", "c"].into_iter().map(gm_at).collect();
    let settled = |c: &TestCluster| leadership(c).filter(|(_, m)| *m == all).map(|(l, _)| l);
    // The leader all managers agree on, waited for and read once: under load they may move on
    // between two reads.
    let settle = |c: &TestCluster, secs: u64| {
        let mut got = None;
        let held = c.eventually(Duration::from_secs(secs), |c| {
            got = settled(c);
            got.is_some()
        });
        assert!(held, "{}", story(c));
        got.unwrap()
    };
    let first = settle(&c, 20);
    let comps = c.status()["components"].as_array().unwrap().len();
    assert_eq!(comps, 3, "{}", c.status());
    // The text view names the leader and the followers.
    let text_status = text(&c.cmd(&["cluster", "status"]).output().unwrap().stdout);
    assert!(
        text_status.contains(&format!("global managers at {first} (leader; following: ")),
        "{text_status}"
    );

    let mut leaders = vec![first.clone()];
    python_phases_as_native(&c, |c, phase, round, _pid| {
        // Who leads now, as the managers say (it may have changed since the last phase: a
        // follower cut off may have come back as the leader).
        let leader = settle(c, 30);
        if leaders.last() != Some(&leader) {
            leaders.push(leader.clone());
        }
        let lhost = host_of(&leader);
        match (round, phase) {
            // The leader dies mid-run: another takes over, and the dead one, started again,
            // follows.
            (0, 1) => {
                let pid = c.pid_of_addr(&leader);
                let again = argv(pid);
                c.kill_component(pid);
                leaders.push(leader_after(c, &leader, 20));
                start_manager(c, &h, lhost, &again, &format!("gm-{lhost}-again"));
                assert_eq!(Some(&settle(c, 20)), leaders.last(), "a manager started again follows");
            }
            // One etcd member and the manager beside it are cut off: the majority goes on (the
            // leader with it, unless the member cut off led etcd and its new election took
            // longer than the managers' lease), and the cut-off manager follows once back.
            (0, 2) => {
                let cut = ["a", "b", "c"].into_iter().find(|n| *n != lhost).unwrap();
                h.link(cut, false);
                assert!(
                    c.eventually(Duration::from_secs(20), |c| leadership(c)
                        .is_some_and(|(_, m)| !m.contains(&gm_at(cut)))),
                    "{}",
                    story(c)
                );
                h.link(cut, true);
                leaders.push(settle(c, 30));
            }
            // The leader is cut off from the etcd majority: it steps down before another is
            // elected (never two leaders placing at once), and follows once it is back.
            (1, 1) => {
                let log_of = |host: &str| {
                    format!(
                        "{}{}",
                        c.log(&format!(
                            "gm{}",
                            ["a", "b", "c"].iter().position(|n| *n == host).unwrap()
                        )),
                        std::fs::read_to_string(c.dir.path().join(format!("gm-{host}-again.log"))).unwrap_or_default()
                    )
                };
                // Only what it logs from the cut on.
                let before_cut = log_of(lhost).len();
                let since_cut = || log_of(lhost).get(before_cut..).unwrap_or_default().to_string();
                h.link(lhost, false);
                let next = leader_after(c, &leader, 20);
                leaders.push(next.clone());
                assert!(
                    c.eventually(Duration::from_secs(10), |_| since_cut().contains("stops leading")),
                    "{}",
                    since_cut()
                );
                let (stepped_down, elected) = (
                    last_stamp(&since_cut(), "stops leading").unwrap(),
                    last_stamp(&log_of(host_of(&next)), "this manager leads now").unwrap(),
                );
                assert!(
                    stepped_down < elected,
                    "the old leader stopped at {stepped_down}, the new one began at {elected}"
                );
                let before_heal: Vec<usize> = ["a", "b", "c"].iter().map(|n| log_of(n).len()).collect();
                h.link(lhost, true);
                let after = settle(c, 30);
                // The old leader follows. Leadership may still move once more: on a loaded
                // machine etcd's own election, when its member comes back, can outlast the
                // managers' lease. Then it moved by a new election (the old leader may win
                // it), never by the old leader leading on from before the cut.
                if after != next {
                    let n = ["a", "b", "c"].iter().position(|n| *n == host_of(&after)).unwrap();
                    assert!(
                        log_of(host_of(&after))
                            .get(before_heal[n]..)
                            .unwrap_or_default()
                            .contains("this manager leads now"),
                        "{after} leads after the heal without an election\n{}",
                        story(c)
                    );
                    leaders.push(after);
                }
            }
            // Every manager restarts at once: they resume from etcd, and no component
            // registers again.
            (1, 2) => {
                let running: Vec<(i32, Vec<String>, &str)> = all
                    .iter()
                    .map(|a| c.pid_of_addr(a))
                    .map(|pid| (pid, argv(pid), ""))
                    .collect();
                for (pid, _, _) in &running {
                    c.kill_component(*pid);
                }
                for ((_, again, _), n) in running.iter().zip(["a", "b", "c"]) {
                    start_manager(c, &h, n, again, &format!("gm-{n}-all"));
                }
                leaders.push(settle(c, 20));
            }
            _ => {}
        }
    });
    // Each component followed the leader by itself, and none registered again.
    assert!(
        c.eventually(Duration::from_secs(20), |c| c.status()["components"]
            .as_array()
            .is_some_and(|a| a.len() == 3 && a.iter().all(|x| x["alive"] == true))),
        "{}\n{}",
        c.status(),
        story(&c)
    );
    let comps: Vec<String> = c.status()["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["addr"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(comps.len(), 3);
    let pcomp = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    assert!(
        c.metric(&pcomp, "splitos_node_gm_leader_changes_total") >= 2.0,
        "the pComponent followed the handovers"
    );
    let again: f64 = comps
        .iter()
        .map(|a| c.metric(a, "splitos_node_registrations_again_total"))
        .sum();
    assert_eq!(again, 0.0, "no component registered again; leaders: {leaders:?}");
    let leader = settle(&c, 20);
    assert_eq!(
        c.metric(&leader, "splitos_gm_components_resumed"),
        3.0,
        "the last leader ({leader}) resumed the membership from etcd\n{}",
        story(&c)
    );
    assert_eq!(c.metric(&leader, "splitos_gm_registrations_total"), 0.0);
}

/// The address of every manager's REST API, as `cluster up` recorded them in its state file.
fn recorded_apis(c: &TestCluster) -> Vec<String> {
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.dir.path().join("cluster.json")).unwrap()).unwrap();
    state["apis"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The manager that answered `cluster topology --json`: the graph's node of the managers.
fn topology_leader(c: &TestCluster) -> String {
    let out = c.cmd(&["cluster", "topology", "--json"]).output().unwrap();
    assert!(out.status.success(), "cluster topology: {}", text(&out.stderr));
    let g: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let gm = g["nodes"].as_array().unwrap().iter().find(|n| n["id"] == "gm").unwrap();
    let label = gm["label"].as_str().unwrap();
    label.rsplit(' ').next().unwrap().to_string()
}

/// `splitos ARGS` succeeds; its standard output.
fn works(c: &TestCluster, args: &[&str]) -> String {
    let out = c.cmd(args).output().unwrap();
    assert!(out.status.success(), "splitos {args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// What `curl ARGS` printed (headers and body with `-i`), for what `http` cannot send: a
/// browser's `Origin`, a preflight, and a stream read for a moment.
fn curl(args: &[&str]) -> String {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-i", "--max-time", "3"])
        .args(args)
        .output()
        .unwrap();
    text(&out.stdout)
}

#[test]
fn the_rest_api_and_the_dashboard_follow_the_leader_when_it_is_killed() {
    let h = Hosts::new(&["e"]);
    let data = tempfile::tempdir().unwrap();
    let state = TestCluster::state_dir();
    let etcd = EtcdCluster::start(&h, &["e"], data.path(), state.path());
    let gms: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", restartable_port())).collect();
    // Each manager's API on any free port of loopback, as the embedded cluster has it.
    let mut cfg = format!(
        "[cluster]\n{}etcd_prefix = \"/api-failover\"\nleader_lease_s = 4\n",
        etcd.config()
    );
    for g in &gms {
        cfg += &format!("[[gm]]\nlisten = \"{g}\"\n");
    }
    cfg += "[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n";
    let c = TestCluster::up_in(state, Some(&cfg));
    let apis = recorded_apis(&c);
    assert_eq!(apis.len(), 3, "every manager serves the API: {apis:?}");
    let token = std::fs::read_to_string(c.dir.path().join("admin.token")).unwrap();
    let first = topology_leader(&c);
    assert!(gms.contains(&first), "{first}");
    works(&c, &["ps"]);
    works(&c, &["memory", "list"]);
    let first_api = c.status()["api"].as_str().unwrap().to_string();

    // The leader dies at once; nothing is changed for the tools, which are run right away.
    c.kill_component(c.pid_of_addr(&first));
    let ps = works(&c, &["ps"]);
    assert!(ps.contains("PID"), "{ps}");
    let memory = works(&c, &["memory", "list"]);
    assert!(memory.contains("attached"), "{memory}");
    let second = topology_leader(&c);
    assert!(second != first && gms.contains(&second), "{first} -> {second}");
    let pcomp = c.components("pcomponent")[0]["id"].as_u64().unwrap().to_string();
    let drained = works(&c, &["cluster", "drain", &pcomp, "--timeout", "30"]);
    assert!(drained.contains("drained"), "{drained}");
    works(&c, &["cluster", "uncordon", &pcomp]);
    // A loaded machine can make the new leader miss its lease too (the tools follow that
    // as well): whichever survivor leads now is the one the rest asks.
    let status = c.status();
    let now = status["leader"].as_str().unwrap_or_default().to_string();
    assert!(now != first && gms.contains(&now), "{status}");
    let second_api = status["api"].as_str().unwrap().to_string();
    assert!(second_api != first_api && apis.contains(&second_api), "{status}");

    // The dashboard: the page the dead leader served reads the stream from the others, which
    // let its origin in; a follower serves the page too, and names the leader.
    let follower_api = apis.iter().find(|a| **a != first_api && **a != second_api).unwrap();
    let (dead, leader, follower) = (
        format!("http://{first_api}"),
        format!("http://{second_api}"),
        format!("http://{follower_api}"),
    );
    let page = curl(&[&format!("{follower}/")]);
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    let policy = page
        .lines()
        .find(|l| l.to_lowercase().starts_with("content-security-policy:"))
        .unwrap_or_default()
        .to_string();
    assert!(
        policy.contains(&dead) && policy.contains(&leader),
        "the page may connect to every manager's API: {policy}"
    );
    let bearer = format!("Authorization: Bearer {token}");
    // The follower learns of the election from its own watch, a moment after the leader
    // knows: until then it answers 503 with retry-after, as a client is told to honour.
    let mut misdirected = String::new();
    c.eventually(Duration::from_secs(10), |_| {
        misdirected = curl(&["-H", &bearer, &format!("{follower}/api/v1/events")]);
        !misdirected.starts_with("HTTP/1.1 503")
    });
    assert!(
        misdirected.starts_with("HTTP/1.1 421") && misdirected.contains(&format!("\"leader_url\":\"{leader}\"")),
        "{misdirected}"
    );
    // As strict as the leader: no token, no way to the leader.
    let (status, _, body) = http(follower_api, "GET", "/api/v1/jobs", None, b"");
    assert_eq!(status, 401, "{body}");
    let origin = format!("Origin: {dead}");
    let preflight = curl(&[
        "-X",
        "OPTIONS",
        "-H",
        &origin,
        "-H",
        "Access-Control-Request-Method: GET",
        "-H",
        "Access-Control-Request-Headers: authorization",
        &format!("{leader}/api/v1/events"),
    ]);
    assert!(
        preflight.starts_with("HTTP/1.1 204")
            && preflight
                .to_lowercase()
                .contains(&format!("access-control-allow-origin: {dead}")),
        "{preflight}"
    );
    let stream = curl(&["-N", "-H", &bearer, "-H", &origin, &format!("{leader}/api/v1/events")]);
    assert!(
        stream.starts_with("HTTP/1.1 200") && stream.contains("event: snapshot"),
        "{stream}"
    );
    assert!(
        stream.contains(&format!("\"{follower}\"")),
        "the snapshot names every manager's API: {stream}"
    );
    let stranger = curl(&[
        "-X",
        "OPTIONS",
        "-H",
        "Origin: http://example.com",
        &format!("{leader}/api/v1/events"),
    ]);
    assert!(
        !stranger.to_lowercase().contains("access-control-allow-origin"),
        "{stranger}"
    );

    // One manager left still leads, and says so.
    c.kill_component(c.pid_of_addr(&second));
    let third = {
        let mut got = None;
        let held = c.eventually(Duration::from_secs(20), |c| {
            got = leadership(c).map(|(l, _)| l).filter(|l| *l != second);
            got.is_some()
        });
        assert!(held, "{}", story(&c));
        got.unwrap()
    };
    works(&c, &["ps"]);
    let text_status = works(&c, &["cluster", "status"]);
    assert!(
        text_status.contains(&format!("global managers at {third} (leader)")),
        "{text_status}"
    );
}

/// `splitos bench-managers --simulated` runs the real managers in its own process, in simulated
/// time, under the components it plays: every component registers and heartbeats, the failed
/// mComponent is named lost after the silence limit (within the window: 7 s after it falls
/// silent, past the 5 s limit), no other is; asked for managers to load as well, it refuses.
#[test]
fn bench_managers_simulated_runs_the_real_managers_in_simulated_time() {
    let out = std::process::Command::new(splitos())
        .args(["bench-managers", "--simulated", "--components", "200", "--hosts", "20"])
        .args(["--seconds", "14", "--fail", "1", "--picks-per-s", "10"])
        .env("SPLITOS_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["simulated"], true);
    assert_eq!(r["register"]["latency"]["n"], 200, "{r}");
    assert_eq!(r["failover"]["named_lost"], 1, "{r}");
    assert_eq!(r["wrongly_lost"], 0, "{r}");
    assert!(r["beats"]["per_s"].as_f64().unwrap() > 600.0, "{r}");
    let both = std::process::Command::new(splitos())
        .args(["bench-managers", "--simulated", "--gm", "127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!both.status.success());
    assert!(
        String::from_utf8_lossy(&both.stderr).contains("cannot be used with"),
        "{both:?}"
    );
}
