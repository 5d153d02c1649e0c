//! The links between a pComponent and its mComponents (docs/elastic-memory.md, "Bonded links
//! and credits"): a batch of fetched pages striped across several connections (bonding), and
//! the requests a peer may have in flight bounded by the receiver's grant (credits). Real
//! programs over TCP, their output compared with native runs, and the counters of the
//! component that did the work.
use crate::common;
use common::*;

fn cluster(links: usize) -> TestCluster {
    TestCluster::up(Some(&format!(
        "[transport]\nkind = \"tcp\"\n[[pcomponent]]\nexcache = \"4M\"\nlinks = {links}\n[[mcomponent]]\n"
    )))
}

/// Runs a sequential scan and STREAM (two threads) on a cluster whose pComponent stripes each
/// batch across `links` links; returns the fetch requests it sent as stripes and the
/// connections the mComponent accepted.
fn scan_with(links: usize) -> (f64, f64) {
    let c = cluster(links);
    let memtouch = program("memtouch");
    let stream = program("stream");
    for cmd in [
        // Scans only: sequential misses are what read-ahead batches.
        vec![memtouch.to_str().unwrap(), "24", "0"],
        vec![stream.to_str().unwrap(), "6", "2", "2"],
    ] {
        let out = c.run(&[], &cmd);
        assert_eq!(
            text(&out.stdout),
            text(&native(&cmd).stdout),
            "links = {links}, {cmd:?}: {}",
            text(&out.stderr)
        );
    }
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    (
        c.metric(&p, "splitos_pcomp_fetch_stripes_total"),
        c.metric(&m, "splitos_rpc_tcp_connections_accepted_total"),
    )
}

#[test]
fn bonded_links_stripe_each_batch_of_fetched_pages() {
    let (stripes1, accepted1) = scan_with(1);
    assert_eq!(stripes1, 0.0, "one link: a batch is one request");
    let (stripes4, accepted4) = scan_with(4);
    assert!(stripes4 > 0.0, "four links: batches went out in stripes");
    // Each faulting thread holds a connection per link to the mComponent.
    assert!(
        accepted4 >= accepted1 + 3.0,
        "the mComponent served the stripes on their own connections: {accepted1} with one link, {accepted4} with four"
    );
    // A link count out of bounds is refused at start, naming the knob.
    for bad in [0, 17] {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("bad.toml");
        std::fs::write(&f, format!("[[pcomponent]]\nlinks = {bad}\n[[mcomponent]]\n")).unwrap();
        let out = std::process::Command::new(splitos())
            .args(["cluster", "up", "--config"])
            .arg(&f)
            .env("SPLITOS_STATE_DIR", dir.path())
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0));
        assert!(text(&out.stderr).contains("links"), "{bad}: {}", text(&out.stderr));
    }
}

/// The peak memory of a process (VmHWM), in KiB.
fn peak_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Six programs at once on a pComponent whose mComponent takes 2 ms for every request and
/// grants two credits (`config`); returns the pComponent's and the mComponent's addresses, the
/// mComponent's peak memory in KiB, and the cluster.
fn six_programs_on_a_slow_mcomponent(config: &str) -> (TestCluster, String, String, u64) {
    let c = TestCluster::up(Some(config));
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let mpid = c.pid_of_addr(&m);
    let threads = program("threads");
    let memtouch = program("memtouch");
    let cmds: Vec<Vec<&str>> = (0..3)
        .flat_map(|_| {
            [
                vec![threads.to_str().unwrap(), "2"],
                vec![memtouch.to_str().unwrap(), "6"],
            ]
        })
        .collect();
    let running: Vec<_> = cmds
        .iter()
        .map(|cmd| {
            c.cmd(&["run", "--"])
                .args(cmd)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (cmd, child) in cmds.iter().zip(running) {
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            text(&out.stdout),
            text(&native(cmd).stdout),
            "{cmd:?}: {}",
            text(&out.stderr)
        );
    }
    let peak = peak_kib(mpid);
    (c, p, m, peak)
}

#[test]
fn a_slow_mcomponent_slows_its_clients_within_their_credits() {
    // Two credits per connection.
    let (c, p, m, peak) = six_programs_on_a_slow_mcomponent("[transport]\nkind = \"tcp\"\n[transport.tcp]\nmax_in_flight = 2\n[[pcomponent]]\nexcache = \"16M\"\n[[mcomponent]]\nserve_delay_us = 2000\n");
    let waits = c.metric(&p, "splitos_rpc_credit_waits_total");
    let over = c.metric(&m, "splitos_rpc_requests_over_credit_total");
    let served = c.metric(&m, "splitos_mcomp_requests_total");
    eprintln!("credit waits {waits}, over credit {over}, served {served}, mcomp peak {peak} KiB");
    assert!(served > 0.0);
    assert_eq!(over, 0.0, "no client sent beyond its credits");
    assert!(waits > 0.0, "callers waited for credits");
    // The programs hold 24 MiB: requests queued without bound would show far beyond it.
    assert!(
        peak < 128 << 10,
        "the slow mComponent's memory stayed bounded: {peak} KiB at its peak"
    );
}

#[test]
fn a_slow_mcomponent_keeps_its_shared_memory_callers_within_their_credits() {
    // Two channels per caller, each one call; every fetch a message (no one-sided copies). Sets
    // of 8 ways, as it was measured with: fully associative, the six programs barely miss.
    let (c, p, m, peak) =
        six_programs_on_a_slow_mcomponent("[transport]\nkind = \"shm\"\n[transport.shm]\nmax_channels_per_peer = 2\n[[pcomponent]]\nexcache = \"16M\"\nways = 8\none_sided = \"off\"\n[[mcomponent]]\nserve_delay_us = 2000\n");
    let waits = c.metric(&p, "splitos_rpc_credit_waits_total");
    let most = c.metric(&m, "splitos_rpc_shm_peer_channels_peak");
    let requests = c.metric(&m, "splitos_rpc_shm_requests_total");
    eprintln!(
        "credit waits {waits}, most channels of one caller {most}, shm requests {requests}, mcomp peak {peak} KiB"
    );
    // How many misses there are depends on how much the six programs overlap (a quiet machine
    // runs them more one after another): what counts is that they crossed shared memory at all.
    assert!(
        requests > 20.0,
        "the programs' misses crossed shared memory: {requests}"
    );
    assert!(waits > 0.0, "callers waited for credits");
    assert!(
        most > 0.0 && most <= 2.0,
        "the mComponent served at most two channels of one caller at once: {most}"
    );
    assert!(
        peak < 128 << 10,
        "the slow mComponent's memory stayed bounded: {peak} KiB at its peak"
    );
    // No credit at all is refused at start, naming the knob.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.toml");
    std::fs::write(
        &f,
        "[transport.shm]\nmax_channels_per_peer = 0\n[[pcomponent]]\n[[mcomponent]]\n",
    )
    .unwrap();
    let out = std::process::Command::new(splitos())
        .args(["cluster", "up", "--config"])
        .arg(&f)
        .env("SPLITOS_STATE_DIR", dir.path())
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("max_channels_per_peer"),
        "{}",
        text(&out.stderr)
    );
}
