//! The transports with real components: shared memory carries the data path between
//! components of one host unless TCP is asked for, and a component killed mid-call is an
//! error for its callers, never a hang.
use crate::common;
use common::*;

#[test]
fn shared_memory_carries_misses_between_components_of_one_host_unless_tcp_is_asked_for() {
    let p = program("stride");
    let cmd = [p.to_str().unwrap(), "4", "8", "30"];
    // Every access by message: one-sided access (on this host) copies pages without one.
    let base = "[[pcomponent]]\nexcache = \"4M\"\nways = 1\none_sided = \"off\"\n[[mcomponent]]\n";
    for (kind, config) in [
        ("shm", base.to_string()),
        ("tcp", format!("{base}[transport]\nkind = \"tcp\"\n")),
    ] {
        let c = TestCluster::up(Some(&config));
        let s = c.run_stats(&cmd);
        let misses = n(&s, "misses") - n(&s, "plocal_fills");
        assert!(misses >= 200, "{kind}: the program missed remotely: {s}");
        let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
        let through_shm = c.metric(&m, "splitos_rpc_shm_requests_total");
        if kind == "shm" {
            assert!(
                through_shm >= misses as f64,
                "{kind}: the mComponent served every remote miss from its channels ({through_shm} of {misses})"
            );
        } else {
            assert_eq!(
                through_shm, 0.0,
                "{kind}: the mComponent served nothing through shared memory"
            );
        }
    }
}

#[test]
fn a_program_whose_mcomponent_dies_mid_run_gets_an_error_over_shared_memory() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n"));
    let hold = program("hold");
    let mut a = c.spawn(&[], &[hold.to_str().unwrap(), "16"]);
    assert_eq!(read_line(&mut a), "ready\n");
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    assert!(
        c.metric(&m, "splitos_rpc_shm_requests_total") > 0.0,
        "the pComponent reached the mComponent through shared memory"
    );
    c.kill_component(c.pid_of_addr(&m));
    drop(a.stdin.take());
    let a = a.wait_with_output().unwrap();
    assert!(!a.status.success(), "the program cannot continue without its memory");
    assert!(
        text(&a.stderr).contains("mComponent"),
        "its error names the component: {}",
        text(&a.stderr)
    );
}

#[test]
fn adaptive_polling_stops_polling_while_a_program_idles_and_fixed_polling_never_does() {
    let py = python3();
    // A few faults, then two seconds of nothing: the fault worker and the channels wait idle.
    let cmd = [
        py.as_str(),
        "-c",
        "import time; b = bytearray(8 << 20); time.sleep(2); print(len(b))",
    ];
    // Fault workers that poll wherever they run: beside the faulting thread they sleep at once.
    let adaptive = "[[pcomponent]]\nexcache = \"4M\"\nfault_cpu = \"any\"\nfault_polling = \"adaptive\"\n[[mcomponent]]\n[transport]\npolling = \"adaptive\"\n";
    let fixed = "[[pcomponent]]\nexcache = \"4M\"\nfault_cpu = \"any\"\n[[mcomponent]]\n";
    for (polling, config) in [("adaptive", adaptive), ("fixed", fixed)] {
        let c = TestCluster::up(Some(config));
        let out = c.run(&[], &cmd);
        assert_eq!(text(&out.stdout), text(&native(&cmd).stdout), "{}", text(&out.stderr));
        let skipped: f64 = ["pcomponent", "mcomponent"]
            .iter()
            .map(|r| {
                c.metric(
                    c.components(r)[0]["addr"].as_str().unwrap(),
                    "splitos_poll_skipped_total",
                )
            })
            .sum();
        let spins: f64 = ["pcomponent", "mcomponent"]
            .iter()
            .map(|r| c.metric(c.components(r)[0]["addr"].as_str().unwrap(), "splitos_poll_spins_total"))
            .sum();
        assert!(spins > 0.0, "{polling}: the components polled");
        if polling == "adaptive" {
            assert!(skipped > 0.0, "{polling}: idle waiters went to sleep without polling");
        } else {
            assert_eq!(skipped, 0.0, "{polling}: every wait polled for the whole spin");
        }
    }
}

/// Two "hosts" made of network namespaces joined by a veth pair (no other route): the global
/// managers, the pComponent and a small mComponent on host A, a large mComponent on host B.
/// Removed with everything started in them when dropped, even if the test failed.
struct TwoHosts {
    a: String,
    b: String,
    ip_a: String,
    ip_b: String,
    state: tempfile::TempDir,
    mem_b: Option<std::process::Child>,
}

fn ip(args: &[&str]) {
    let out = std::process::Command::new("ip").args(args).output().expect("ip runs");
    assert!(out.status.success(), "ip {args:?}: {}", text(&out.stderr));
}

impl TwoHosts {
    fn new() -> TwoHosts {
        let n = std::process::id() % 100_000;
        let (a, b) = (format!("spt-a-{n}"), format!("spt-b-{n}"));
        let net = format!("10.251.{}", n % 250);
        let h = TwoHosts {
            a: a.clone(),
            b: b.clone(),
            ip_a: format!("{net}.1"),
            ip_b: format!("{net}.2"),
            state: tempfile::tempdir().unwrap(),
            mem_b: None,
        };
        ip(&["netns", "add", &a]);
        ip(&["netns", "add", &b]);
        let (va, vb) = (format!("spa{n}"), format!("spb{n}"));
        ip(&[
            "link", "add", &va, "netns", &a, "type", "veth", "peer", "name", &vb, "netns", &b,
        ]);
        for (ns, dev, addr) in [(&a, &va, &h.ip_a), (&b, &vb, &h.ip_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/30"), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        h
    }

    /// `splitos ARGS` on host `ns`, with this cluster's state directory.
    fn splitos(&self, ns: &str, args: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", ns])
            .arg(splitos())
            .args(args)
            .env("SPLITOS_STATE_DIR", self.state.path())
            .env("SPLITOS_DATA_DIR", self.state.path().join("data"))
            .env_remove("SPLITOS_GM");
        c
    }

    fn ok(&self, ns: &str, args: &[&str]) -> String {
        let out = self.splitos(ns, args).output().unwrap();
        assert!(out.status.success(), "splitos {args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    }

    /// One counter of the component at `addr`, read from host A (0 when never counted).
    fn metric(&self, addr: &str, name: &str) -> f64 {
        metric_of(&self.ok(&self.a, &["cluster", "metrics"]), addr, name)
    }
}

impl Drop for TwoHosts {
    fn drop(&mut self) {
        if let Some(mut m) = self.mem_b.take() {
            let _ = m.kill();
            let _ = m.wait();
        }
        let _ = self.splitos(&self.a, &["cluster", "down", "--force"]).output();
        for ns in [&self.a, &self.b] {
            delete_netns(ns);
        }
    }
}

#[test]
fn components_on_another_host_are_reached_over_tcp_and_neighbours_through_shared_memory() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "this test needs root (it makes network namespaces): run the tests as root, as CI does"
    );
    let mut h = TwoHosts::new();
    // Host A's mComponent is too small for a vRegion (1 GiB), so the program's pages go to B.
    let config = format!("[cluster]\ngm = \"{a}:0\"\n[[pcomponent]]\nlisten = \"{a}:0\"\nexcache = \"4M\"\nways = 1\n[[mcomponent]]\nlisten = \"{a}:0\"\ncapacity = \"64M\"\n", a = h.ip_a);
    let cfg = h.state.path().join("cluster.toml");
    std::fs::write(&cfg, config).unwrap();
    h.ok(&h.a.clone(), &["cluster", "up", "--config", cfg.to_str().unwrap()]);
    let status: serde_json::Value =
        serde_json::from_str(&h.ok(&h.a.clone(), &["cluster", "status", "--json"])).unwrap();
    let gm = status["gm"].as_str().unwrap().to_string();
    let ready = h.state.path().join("mem-b.ready");
    let listen = format!("{}:0", h.ip_b);
    let b = h.b.clone();
    let creds = h.state.path().join("mem-b.cred");
    h.ok(
        &h.a.clone(),
        &[
            "cluster",
            "credentials",
            "--role",
            "mcomponent",
            "--out",
            creds.to_str().unwrap(),
        ],
    );
    let child = h
        .splitos(
            &b,
            &[
                "mem",
                "--gm",
                &gm,
                "--listen",
                &listen,
                "--capacity",
                "8G",
                "--ready-file",
                ready.to_str().unwrap(),
                "--credentials",
                creds.to_str().unwrap(),
            ],
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    h.mem_b = Some(child);
    let t0 = std::time::Instant::now();
    while !ready.exists() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "host B's mComponent did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let addr_b = std::fs::read_to_string(&ready).unwrap().trim().to_string();

    let p = program("stride");
    let cmd = [p.to_str().unwrap(), "4", "8", "30"];
    let out = h.splitos(&h.a, &["run", "--"]).args(cmd).output().unwrap();
    assert_eq!(text(&out.stdout), text(&native(&cmd).stdout), "{}", text(&out.stderr));

    let status: serde_json::Value =
        serde_json::from_str(&h.ok(&h.a.clone(), &["cluster", "status", "--json"])).unwrap();
    let mems: Vec<&serde_json::Value> = status["components"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["role"] == "mcomponent")
        .collect();
    let on_b = mems
        .iter()
        .find(|c| c["addr"] == addr_b.as_str())
        .expect("host B's mComponent is in the cluster");
    assert!(
        on_b["stats"]["flushes"].as_u64().unwrap() >= 200,
        "the program's lines went to host B: {on_b}"
    );
    assert_eq!(
        h.metric(&addr_b, "splitos_rpc_shm_requests_total"),
        0.0,
        "host B is reached over TCP only"
    );
    assert!(h.metric(&addr_b, "splitos_mcomp_requests_total") > 0.0);
    let on_a = mems.iter().find(|c| c["addr"] != addr_b.as_str()).unwrap()["addr"]
        .as_str()
        .unwrap()
        .to_string();
    let pcomp = status["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["role"] == "pcomponent")
        .unwrap()["addr"]
        .as_str()
        .unwrap()
        .to_string();
    let local: f64 = [on_a.as_str(), pcomp.as_str(), gm.as_str()]
        .iter()
        .map(|a| h.metric(a, "splitos_rpc_shm_requests_total"))
        .sum();
    assert!(
        local > 0.0,
        "components of host A reached each other through shared memory"
    );
}

#[test]
fn heap_calls_are_served_on_a_shared_memory_channels_own_thread_and_handed_off_over_tcp() {
    // Every mprotect reaches the process's home, which may call the owners of the range: a
    // request that fans out. Over shared memory the channel's thread serves it (it waits for
    // the answer either way); a TCP connection is shared by the pComponent's callers, so its
    // receiving thread hands it to the fan-out pool. No home could refuse these (the range is
    // mapped, no quota, heuristic overcommit): the program has its answer before the home has
    // the call.
    let p = program("protects");
    let cmd = [p.to_str().unwrap(), "1500"];
    let base = "[[pcomponent]]\nexcache = \"16M\"\n[[mcomponent]]\n";
    for (kind, config) in [
        ("shm", base.to_string()),
        ("tcp", format!("{base}[transport]\nkind = \"tcp\"\n")),
    ] {
        let c = TestCluster::up(Some(&config));
        wait_cluster_memory_known(&c);
        let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
        let handed_off = || c.metric(&m, "splitos_rpc_requests_handed_off_total");
        let before = handed_off();
        let protects = requests_of(&c, &m, "P2M_MPROTECT");
        let s = c.run_stats(&cmd);
        let calls = n(&s, "heap_calls") - n(&s, "heap_calls_local");
        assert!(calls >= 1500, "{kind}: every mprotect went to the home: {s}");
        assert!(
            n(&s, "heap_calls_posted") >= 1500,
            "{kind}: answered before the home had them: {s}"
        );
        assert_eq!(n(&s, "heap_calls_posted_refused"), 0, "{kind}: {s}");
        assert!(
            requests_of(&c, &m, "P2M_MPROTECT") - protects >= 1500.0,
            "{kind}: the home served every one of them"
        );
        let by_pool = handed_off() - before;
        if kind == "shm" {
            assert!(
                c.metric(&m, "splitos_rpc_shm_requests_total") >= calls as f64,
                "{kind}: the home served them from its channels: {s}"
            );
            assert!(
                by_pool * 10.0 < calls as f64,
                "{kind}: {by_pool} of {calls} heap calls were handed to a pool"
            );
        } else {
            assert!(
                by_pool >= calls as f64,
                "{kind}: the connection's thread handed every heap call to the pool ({by_pool} of {calls})"
            );
        }
    }
}

#[test]
fn the_evictors_write_backs_let_their_mcomponent_sleep_between_batches() {
    // 24 MiB written in random order through an 8 MiB ExCache: the background evictor writes
    // dirty victims back a batch at a time, the first of each page by message (its owner holds
    // none yet). No program waits on them, so the mComponent's channel thread sleeps after
    // each instead of polling for the next.
    let p = program("randpages");
    let cmd = [p.to_str().unwrap(), "24", "2"];
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"8M\"\n[[mcomponent]]\n"));
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let unhurried = || c.metric(&m, "splitos_rpc_shm_unhurried_total");
    // What the evictor sends: write-backs of one page or many, and when it is the first to
    // reach a vRegion, the question where its replicas are and the lease of its pages.
    let sent = |msgs: &[&str]| msgs.iter().map(|msg| requests_of(&c, &m, msg)).sum::<f64>();
    let writes = ["P2M_FLUSH", "P2M_FLUSH_MANY"];
    let asks = ["P2M_VREGIONS", "P2M_LEASE"];
    let (before, writes0, asks0) = (unhurried(), sent(&writes), sent(&asks));
    let s = c.run_stats(&cmd);
    let said = unhurried() - before;
    let (written, asked) = (sent(&writes) - writes0, sent(&asks) - asks0);
    // Marked: the evictor's, at most one message per batch; not the fault worker's (victims
    // of inline evictions, which a loaded machine has more of).
    let batches = n(&s, "bg_writeback_batches") as f64;
    assert!(
        said > 0.0 && said <= written + asked && said <= batches + asked,
        "{said} requests said no program waits on them, of {written} write-backs ({batches} batches of the evictor) and {asked} other requests the mComponent served: {s}"
    );
}
