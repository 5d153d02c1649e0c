//! The ExCache's run-time options each change behaviour that the counters show; the size `run`
//! chooses for the host, and the hint when the ExCache is too small.
use crate::common;
use common::*;

#[test]
fn capacity_bounds_what_stays_resident() {
    let p = program("memtouch");
    let (_, big) = stats_of(&["--excache", "64M"], &[p.to_str().unwrap(), "16"]);
    let (_, small) = stats_of(&["--excache", "4M"], &[p.to_str().unwrap(), "16"]);
    assert_eq!(n(&big, "evictions"), 0, "16 MiB fits a 64 MiB ExCache: {big}");
    assert!(n(&small, "evictions") > 2000, "{small}");
}

#[test]
fn associativity_decides_conflicts() {
    // Eight pages 16 MiB apart share one set of a 16 MiB direct-mapped cache.
    let p = program("stride");
    let cmd = [p.to_str().unwrap(), "16", "8", "100"];
    let (_, direct) = stats_of(&["--excache", "16M", "--ways", "1"], &cmd);
    let (_, full) = stats_of(&["--excache", "16M", "--ways", "0"], &cmd);
    assert!(n(&direct, "evictions") >= 700, "direct-mapped: {direct}");
    assert_eq!(n(&full, "evictions"), 0, "fully associative: {full}");
}

#[test]
fn clock_keeps_a_written_hot_set_that_fifo_evicts() {
    let p = program("hotcold");
    let cmd = [p.to_str().unwrap(), "256", "4096"];
    // Without read-ahead: what it saves of the cold stream depends on timing (with 32 lines
    // ahead, FIFO missed 1,876 times beside five other tests and CLOCK 3,076; 2,514 and 498
    // alone), where the policies' choices do not.
    let base = ["--excache", "2M", "--prefetch-lines", "0"];
    let (_, fifo) = stats_of(&[&base[..], &["--eviction", "fifo"]].concat(), &cmd);
    let (_, clock) = stats_of(&[&base[..], &["--eviction", "clock"]].concat(), &cmd);
    assert!(
        n(&clock, "misses") * 10 < n(&fifo, "misses") * 9,
        "clock {} vs fifo {} misses",
        n(&clock, "misses"),
        n(&fifo, "misses")
    );
}

/// The default policy keeps a hot set that is only read (no write trap ever says it is in
/// use) against a stream passing through, from the misses alone: a hot page that comes back
/// soon after it left is activated. FIFO lets every pass of the stream push the hot set out.
#[test]
fn the_default_workingset_keeps_a_read_hot_set_against_a_stream_that_fifo_lets_push_it_out() {
    let p = program("readhot");
    // 1,024 hot pages read at random between passes of 512 pages of a 32 MiB stream, 12
    // rounds, through a fully associative 8 MiB ExCache (2,048 lines) without read-ahead.
    let (hot, rounds) = (1024, 12);
    let cmd = [p.to_str().unwrap(), "1024", "8192", "12"];
    let base = ["--excache", "8M", "--prefetch-lines", "0"];
    let (_, fifo) = through_components(&[&base[..], &["--eviction", "fifo"]].concat(), &cmd, 1);
    let (_, ws) = through_components(&base, &cmd, 1);
    // What the pComponent runs and did: it names the policy, and every victim was its.
    assert_eq!(ws["pcomponent"]["eviction"], "workingset", "{ws}");
    assert_eq!(ws["pcomponent"]["sets"], 1, "fully associative by default: {ws}");
    // The automatic reserve: a sixteenth of the 2,048 lines, 128, which the evictor kept. How
    // many of the evictions it takes ahead of the misses depends on the CPU it gets (most of
    // them on a quiet machine, a quarter with five other tests beside it on two cores);
    // evictor::the_evictor_takes_evictions_off_the_miss_path_and_programs_see_their_own_data
    // measures that.
    assert_eq!(ws["pcomponent"]["evict_reserve"], 128, "{ws}");
    assert!(n(&ws, "bg_evictions") * 10 > n(&ws, "evictions"), "{ws}");
    assert_eq!(
        ws["pcomponent"]["victims_by_policy"]["workingset"].as_u64(),
        Some(n(&ws, "evictions")),
        "{ws}"
    );
    // Both miss every page of the stream once; what differs is how often the hot set comes
    // back.
    let hot_misses = |s: &serde_json::Value| n(s, "misses") - n(s, "plocal_fills") - rounds * hot / 2;
    assert!(
        hot_misses(&ws) * 2 < hot_misses(&fifo),
        "hot pages missed: workingset {} vs fifo {}",
        hot_misses(&ws),
        hot_misses(&fifo)
    );
}

#[test]
fn piggyback_merges_flush_and_fetch_only_when_enabled() {
    // One mComponent: every victim and every missed line have the same owner, so with
    // piggyback on each dirty eviction that precedes a fetch travels with it. Every access by
    // message: one-sided access copies what the owner holds instead. A victim rides a fetch
    // only when the miss evicts it: the background evictor (which takes most of them ahead of
    // the misses) is off.
    let p = program("memtouch");
    // The read pass's misses evict the lines the write pass dirtied: thousands of each; the
    // random read-modify-writes only add more of the same.
    let cmd = [p.to_str().unwrap(), "12", "20000"];
    let (_, on) = through_components(
        &[
            "--excache",
            "4M",
            "--mcomponents",
            "1",
            "--one-sided",
            "off",
            "--evict-reserve",
            "0",
        ],
        &cmd,
        1,
    );
    let (_, off) = through_components(
        &[
            "--excache",
            "4M",
            "--mcomponents",
            "1",
            "--no-piggyback",
            "--one-sided",
            "off",
            "--evict-reserve",
            "0",
        ],
        &cmd,
        1,
    );
    assert!(n(&on, "piggybacked") > 1000, "{on}");
    // The mComponent received them as combined flush+fetch requests: its own count agrees.
    assert_eq!(mcomp_sum(&on, "piggybacked"), n(&on, "piggybacked"), "{on}");
    assert_eq!(n(&off, "piggybacked"), 0, "{off}");
    assert_eq!(
        mcomp_sum(&off, "piggybacked"),
        0,
        "no combined requests reach the mComponent: {off}"
    );
    assert!(
        n(&off, "flushes") > 1000 && mcomp_sum(&off, "flushes") > 1000,
        "write-backs go as separate flushes: {off}"
    );
}

#[test]
fn unknown_policy_is_refused() {
    let out = under_splitos(&["--eviction", "lfu"], &["true"]);
    assert_ne!(out.status.code(), Some(0));
    // Refused as the command line is read, by the option's name, with the policies there are.
    assert!(
        text(&out.stderr).contains("--eviction") && text(&out.stderr).contains("fifo, clock"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_configured_network_delay_reaches_every_component_and_every_remote_miss() {
    // `[transport.tcp] delay_us`: every component waits before each message it sends over TCP
    // (shared memory between components of one host has no network to slow down).
    let p = program("stride");
    let cmd = [p.to_str().unwrap(), "4", "8", "30"];
    let base = "[[pcomponent]]\nexcache = \"4M\"\nways = 1\n[[mcomponent]]\n";
    let slow = TestCluster::up(Some(&format!(
        "{base}[transport]\nkind = \"tcp\"\n[transport.tcp]\ndelay_us = 3000\n"
    )));
    let fast = TestCluster::up(Some(base));
    let s = slow.run_stats(&cmd);
    assert!(n(&s, "evictions") >= 200, "{s}");
    // A remote miss is a request and a reply, each sent after the delay: at least 6 ms.
    let rpc = s["miss_breakdown_ns_p50"]["rpc"].as_u64().unwrap();
    assert!(rpc >= 6_000_000, "a remote miss waits for the delay both ways: {s}");
    let f = fast.run_stats(&cmd);
    assert!(n(&f, "evictions") >= 200, "{f}");
    for (c, delayed) in [(&slow, true), (&fast, false)] {
        for role in ["pcomponent", "mcomponent"] {
            let addr = c.components(role)[0]["addr"].as_str().unwrap().to_string();
            let d = c.metric(&addr, "splitos_rpc_injected_delays_total");
            assert_eq!(d > 0.0, delayed, "{role} counts the delays it injected: {d}");
        }
    }
}

/// `hold 1` (1 MiB) waits on the cluster while `randpages` thrashes the shared 4 MiB ExCache;
/// then it reads its buffer back. Returns hold's counters and the thrasher's.
fn beside_a_thrasher(share_floor: u32) -> (serde_json::Value, serde_json::Value) {
    let c = TestCluster::up(Some(&format!(
        "[[pcomponent]]\nexcache = \"4M\"\nshare_floor = {share_floor}\n[[mcomponent]]\n"
    )));
    let (hold, rnd) = (program("hold"), program("randpages"));
    let f = c.dir.path().join("hold.json");
    let mut small = c.spawn(
        &["-q", "--stats-json", f.to_str().unwrap()],
        &[hold.to_str().unwrap(), "1"],
    );
    assert_eq!(read_line(&mut small), "ready\n");
    let big = c.run_stats(&[rnd.to_str().unwrap(), "16", "3"]);
    drop(small.stdin.take());
    let out = small.wait_with_output().unwrap();
    assert!(
        out.status.success() && text(&out.stdout).starts_with("sum "),
        "{}",
        text(&out.stderr)
    );
    (
        serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap(),
        big,
    )
}

#[test]
fn a_process_keeps_its_floor_of_lines_beside_a_thrashing_one() {
    // Two processes: an equal share is 512 lines, and the floor all of it; hold needs about 300.
    let (kept, big) = beside_a_thrasher(100);
    assert!(n(&big, "evictions") > 4000, "the thrasher evicted: {big}");
    assert_eq!(n(&kept, "evicted_by_others"), 0, "{kept}");
    assert_eq!(
        n(&kept, "bytes_fetched"),
        0,
        "no line came back from an mComponent: {kept}"
    );
    // Without a floor, the thrasher's misses take hold's lines (FIFO: the oldest go first).
    let (lost, _) = beside_a_thrasher(0);
    assert!(n(&lost, "evicted_by_others") >= 200, "{lost}");
    assert!(
        n(&lost, "bytes_fetched") >= 200 * 4096,
        "its lines came back from an mComponent: {lost}"
    );
}

#[test]
fn programs_thrashing_a_shared_excache_are_told_the_others_are_why() {
    let c = TestCluster::up(Some("[[pcomponent]]\nexcache = \"1M\"\n[[mcomponent]]\n"));
    let p = program("randpages");
    let cmd = [p.to_str().unwrap(), "8", "6"];
    // Three at once: each has the others' misses take most of its lines.
    let files: Vec<_> = (0..3).map(|i| c.dir.path().join(format!("s{i}.json"))).collect();
    let runs: Vec<_> = files
        .iter()
        .map(|f| c.spawn(&["--stats-json", f.to_str().unwrap()], &cmd))
        .collect();
    for (run, f) in runs.into_iter().zip(&files) {
        let out = run.wait_with_output().unwrap();
        assert_eq!(text(&out.stdout), text(&native(&cmd).stdout));
        let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        let err = text(&out.stderr);
        assert!(
            err.contains("the ExCache is too small for the programs sharing it")
                && err.contains("other programs' misses evicted"),
            "{err}\n{s}"
        );
        assert!(n(&s, "evicted_by_others") * 4 >= n(&s, "evictions"), "{s}");
    }
    // Alone, the same program is told about its own size only, and nobody took its lines.
    let f = c.dir.path().join("alone.json");
    let out = c.run(&["--stats-json", f.to_str().unwrap()], &cmd);
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    assert!(
        text(&out.stderr).contains("the ExCache is too small for this program"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(n(&s, "evicted_by_others"), 0, "{s}");
}

#[test]
fn a_too_small_excache_gets_one_hint_a_fitting_one_none() {
    let p = program("randpages");
    let cmd = [p.to_str().unwrap(), "32", "3"];
    let hint = "the ExCache is too small for this program";
    let (small, s) = stats_of(&["--embedded", "--excache", "1M"], &cmd);
    let err = text(&small.stderr);
    assert_eq!(err.matches(hint).count(), 1, "{err}");
    assert!(err.contains("--excache"), "{err}");
    // The counters it came from: pages fetched back again and again.
    assert!(n(&s, "misses") > n(&s, "plocal_fills") * 2, "{s}");
    let (quiet, _) = stats_of(&["--embedded", "--excache", "1M", "--quiet"], &cmd);
    assert!(!text(&quiet.stderr).contains(hint), "{}", text(&quiet.stderr));
    let (fits, s) = stats_of(&["--embedded", "--excache", "256M"], &cmd);
    assert!(!text(&fits.stderr).contains(hint), "{}", text(&fits.stderr));
    assert_eq!(n(&s, "bytes_fetched"), 0, "nothing came back from the mComponents: {s}");
}

/// With no --excache the embedded cluster's ExCache is sized for the host (a quarter of its
/// available memory, a power of two from 64M to 4G): a program of a few hundred MB that a 64M
/// ExCache made fetch its pages back again and again fits, and the pComponent says so; an
/// explicit --excache still gives partial memory.
#[test]
fn the_default_excache_fits_the_host_and_an_explicit_one_is_kept() {
    let p = program("randpages");
    let cmd = [p.to_str().unwrap(), "192", "2"];
    let available = std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("MemAvailable:")?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap()
        << 10;
    let (out, s) = stats_of(&["--embedded", "--stats"], &cmd);
    let err = text(&out.stderr);
    let capacity = n(&s["pcomponent"], "capacity_bytes");
    assert!(
        capacity.is_power_of_two() && (64 << 20..=4 << 30).contains(&capacity),
        "{s}"
    );
    // Within a power of two of the rule: the host's memory moves while the test runs.
    assert!(
        capacity <= available / 4 && (capacity == 4 << 30 || capacity * 4 > available / 4),
        "{capacity} for {available} available"
    );
    let said = match capacity % (1 << 30) {
        0 => format!("excache={}G ", capacity >> 30),
        _ => format!("excache={}M ", capacity >> 20),
    };
    assert!(err.contains(&said), "{said} in {err}");
    if capacity >= 512 << 20 {
        assert_eq!((n(&s, "evictions"), n(&s, "bytes_fetched")), (0, 0), "{s}");
        assert!(!err.contains("the ExCache is too small"), "{err}");
    }
    let (small, s) = stats_of(&["--embedded", "--excache", "64M"], &cmd);
    assert_eq!(n(&s["pcomponent"], "capacity_bytes"), 64 << 20, "{s}");
    assert!(n(&s, "evictions") > 0 && n(&s, "bytes_fetched") > 0, "{s}");
    assert!(
        text(&small.stderr).contains("the ExCache is too small"),
        "{}",
        text(&small.stderr)
    );
}

/// A script that starts hundreds of short processes in a small ExCache fills far more fresh
/// pages than it fetches back, and still spends its run in misses: it gets the hint, and the
/// size the hint names, from the pages of the processes alive at once (not of all that ran),
/// brings few of its pages back.
#[test]
fn a_fork_heavy_script_gets_a_hint_whose_size_brings_few_pages_back() {
    let script = "i=0; while [ $i -lt 40 ]; do echo \"line $i\" | sed s/line/row/ | tr a-z A-Z; i=$((i+1)); done";
    let cmd = ["sh", "-c", script];
    let hint = "the ExCache is too small for this program";
    // In 8-way sets under FIFO, where 2M is far too small for it; the default fully
    // associative workingset runs it at 2M near the hint's threshold.
    let old = ["--embedded", "--ways", "8", "--eviction", "fifo", "--excache"];
    let (small, s) = stats_of(&[&old[..], &["2M"]].concat(), &cmd);
    let err = text(&small.stderr);
    assert_eq!(err.matches(hint).count(), 1, "{err}");
    assert!(n(&s, "processes") >= 120, "{s}");
    let size = err
        .split("an ExCache of ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap();
    let mb: u64 = size.strip_suffix('M').unwrap().parse().unwrap();
    // All the processes' pages added up would ask for far more.
    let fresh = n(&s, "plocal_fills") + n(&s, "faulted_around") + n(&s, "preallocated");
    assert!(
        mb << 20 < fresh * 4096 / 4 && mb <= 32,
        "{size} for {fresh} fresh pages: {err}"
    );
    // At that size the pages it had already had come back far less often. Whether what is
    // left still takes a quarter of the run, and so whether a hint comes there, is timing:
    // none in most runs, now and then one for a megabyte more.
    let again_small = n(&s, "pages_again");
    let (_, s) = stats_of(&[&old[..], &[size]].concat(), &cmd);
    assert!(
        n(&s, "pages_again") * 3 < again_small,
        "{again_small} pages again at 2M: {s}"
    );
}
