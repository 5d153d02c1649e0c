//! The miss path's failure rule with real components: a dirty line evicted on behalf of
//! another process is never silently lost when its write-back fails.
use crate::common;
use common::*;

#[test]
fn a_failed_piggybacked_write_back_never_lets_the_victims_process_read_zeros() {
    // Direct-mapped: the same heap page of two processes (same layout) falls into one set, so
    // a miss of A evicts B's line at that address. Every fetch is a message, the one
    // piggybacking rides on: by one-sided access, A would copy its pages out of the killed
    // owner's segment until the managers declare it lost (docs/excache.md).
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"16M\"\nways = 1\npiggyback = true\none_sided = \"off\"\n[[mcomponent]]\n",
    ));
    let hold = program("hold");
    let hold = hold.to_str().unwrap();
    let native = native(&[hold, "2"]);
    let mut a = c.spawn(&[], &[hold, "2"]);
    assert_eq!(read_line(&mut a), "ready\n");
    // B's writes evict A's dirty lines (written back to the mComponent); B's own lines are
    // dirty and exist nowhere else.
    let mut b = c.spawn(&[], &[hold, "2"]);
    assert_eq!(read_line(&mut b), "ready\n");
    let m = c.components("mcomponent")[0]["stats"].clone();
    assert!(
        m["flushes"].as_u64().unwrap() > 400,
        "A's lines were written back when B evicted them: {m}"
    );
    let p = c.components("pcomponent")[0]["stats"]["one_sided"].clone();
    assert_eq!(p["reads"].as_u64(), Some(0), "{p}");

    c.kill_component(c.pid_of_addr(c.components("mcomponent")[0]["addr"].as_str().unwrap()));

    // A reads its buffer again: its first miss fetches from the dead mComponent with B's
    // dirty line piggybacked, and fails.
    drop(a.stdin.take());
    let a = a.wait_with_output().unwrap();
    assert!(
        !a.status.success(),
        "A cannot continue without its memory; it printed:\n{}",
        text(&a.stdout)
    );
    assert!(
        text(&a.stderr).contains("mComponent"),
        "A's error names the component: {}",
        text(&a.stderr)
    );

    // B lost its only copy of that page with the failed write-back: it must not go on as if
    // the page had never been written.
    drop(b.stdin.take());
    let b = b.wait_with_output().unwrap();
    let (out, err) = (text(&b.stdout), text(&b.stderr));
    assert!(
        !(b.status.success() && out != text(&native.stdout)),
        "B printed a wrong result and exited 0:\n{out}"
    );
    assert!(!b.status.success(), "B's page is gone with the mComponent: {out}");
    assert!(
        err.contains("only copy") && err.contains("mComponent"),
        "B is stopped with an error naming the component and the lost page: {err}"
    );
}

#[test]
fn read_ahead_cuts_the_remote_misses_of_a_sequential_scan() {
    let hold = program("hold");
    let cmd = [hold.to_str().unwrap(), "24"];
    // `stats_of` compares the output with a native run.
    let (_, off) = stats_of(&["--excache", "4M", "--prefetch-lines", "0"], &cmd);
    let (_, on) = stats_of(&["--excache", "4M", "--prefetch-lines", "8"], &cmd);
    let remote = |s: &serde_json::Value| n(s, "misses") - n(s, "plocal_fills");
    assert_eq!(n(&off, "prefetched"), 0);
    assert!(n(&on, "prefetched") > 2000, "{on}");
    assert!(
        remote(&on) * 3 < remote(&off),
        "remote misses: {} with read-ahead, {} without",
        remote(&on),
        remote(&off)
    );
    // The mComponents served the lines read ahead: their own fetch counts (and the copies out
    // of their segments) cover them.
    let served = pages_served(&on);
    assert!(
        served >= remote(&on) + n(&on, "prefetched"),
        "mComponents fetched {served} pages: {on}"
    );
}

#[test]
fn lines_read_ahead_go_in_writable_once_the_program_writes_most_of_them() {
    // Each page is read, then written, page after page: every line read ahead would take a
    // write-protect fault if it went in protected.
    let p = program("bump");
    let cmd = [p.to_str().unwrap(), "24", "3"];
    // `stats_of` compares the output with a native run.
    let (_, s) = stats_of(&["--excache", "4M", "--prefetch-lines", "8"], &cmd);
    let (ahead, traps) = (n(&s, "prefetched"), n(&s, "wp_faults"));
    assert!(ahead > 10_000, "{s}");
    assert!(
        traps * 5 < ahead,
        "the pComponent counted {traps} write-protect faults for {ahead} lines read ahead: {s}"
    );
}

#[test]
fn the_prefetch_policy_decides_what_random_misses_bring() {
    let p = program("randpages");
    let cmd = [p.to_str().unwrap(), "24", "2"];
    let (_, seq) = stats_of(
        &["--excache", "4M", "--prefetch-lines", "8", "--prefetch", "sequential"],
        &cmd,
    );
    let (_, next) = stats_of(
        &["--excache", "4M", "--prefetch-lines", "8", "--prefetch", "nextline"],
        &cmd,
    );
    let remote = |s: &serde_json::Value| n(s, "misses") - n(s, "plocal_fills");
    assert!(remote(&seq) > 5000, "{seq}");
    assert!(
        n(&seq, "prefetched") * 100 < remote(&seq),
        "random misses open no sequential window: {seq}"
    );
    assert!(
        n(&next, "prefetched") * 2 > remote(&next),
        "nextline brings a line with every remote miss: {next}"
    );
    let bad = under_splitos(&["--prefetch", "lru"], &["true"]);
    assert!(
        !bad.status.success() && text(&bad.stderr).contains("unknown prefetch \"lru\""),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn leap_follows_a_strided_scan_and_sampled_lines_show_the_read_ahead_was_used() {
    let p = program("columns");
    let cmd = [p.to_str().unwrap(), "24", "3"];
    let (_, seq) = stats_of(
        &["--excache", "4M", "--prefetch-lines", "8", "--prefetch", "sequential"],
        &cmd,
    );
    let (_, leap) = stats_of(
        &["--excache", "4M", "--prefetch-lines", "8", "--prefetch", "leap"],
        &cmd,
    );
    let remote = |s: &serde_json::Value| n(s, "misses") - n(s, "plocal_fills");
    assert!(
        n(&seq, "prefetched") * 20 < remote(&seq),
        "every third page is no sequential stream: {seq}"
    );
    assert!(
        n(&leap, "prefetched") > 2 * remote(&leap),
        "Leap reads ahead along the stride: {leap}"
    );
    assert!(
        remote(&leap) * 2 < remote(&seq),
        "remote misses: leap {}, sequential {}",
        remote(&leap),
        remote(&seq)
    );
    // One prefetched line in 16 was kept back and trapped on first touch: the scan used them.
    let (sampled, used) = (n(&leap, "prefetch_sampled"), n(&leap, "prefetch_sample_used"));
    assert!(
        sampled * 16 <= n(&leap, "prefetched") && sampled * 20 >= n(&leap, "prefetched"),
        "{leap}"
    );
    assert!(
        used * 10 >= sampled * 9,
        "a strided scan uses what Leap fetched: {used} of {sampled} samples"
    );
    let served = pages_served(&leap);
    assert!(
        served >= remote(&leap) + n(&leap, "prefetched"),
        "mComponents fetched {served} pages: {leap}"
    );
}

#[test]
fn fault_around_keeps_every_program_semantic_and_saves_first_touches() {
    let zero = program("zero");
    let fork = program("forktest");
    let threads = program("threads");
    let hold = program("hold");
    // Zero semantics, realloc/mremap/brk, fork and threads behave as natively with fresh lines
    // installed ahead of the program, in a cache that fits and in one that does not.
    for excache in ["256M", "4M"] {
        for cmd in [
            vec![zero.to_str().unwrap()],
            vec![fork.to_str().unwrap(), "12"],
            vec![threads.to_str().unwrap(), "24"],
        ] {
            let (out, s) = stats_of(&["--excache", excache, "--fault-around", "16"], &cmd);
            assert!(
                !text(&out.stdout).contains(": 0"),
                "{cmd:?}: every check must hold:\n{}",
                text(&out.stdout)
            );
            assert!(n(&s, "faulted_around") > 0, "{cmd:?} at {excache}: {s}");
            assert_eq!(s["errors"].as_array().map(|e| e.len()), Some(0), "{s}");
        }
    }
    let cmd = [hold.to_str().unwrap(), "48"];
    let (_, off) = stats_of(&["--excache", "256M", "--fault-around", "0", "--prealloc", "0"], &cmd);
    let (_, on) = stats_of(&["--excache", "256M", "--fault-around", "16", "--prealloc", "0"], &cmd);
    assert_eq!(n(&off, "faulted_around"), 0);
    assert!(
        n(&on, "plocal_fills") * 8 < n(&off, "plocal_fills"),
        "first touches that trap: {} with fault-around, {} without",
        n(&on, "plocal_fills"),
        n(&off, "plocal_fills")
    );
}

#[test]
fn pre_allocation_keeps_every_program_semantic_and_saves_first_touches() {
    let zero = program("zero");
    let fork = program("forktest");
    let threads = program("threads");
    let hold = program("hold");
    let memsem = program("memsem");
    // Zero semantics, realloc/mremap/brk, fork (of a heap with pre-allocated lines the program
    // never touched), threads, mprotect and madvise behave as natively with fresh lines
    // pre-allocated, alone and with fault-around, in a cache that fits and in one that does not.
    for excache in ["256M", "4M"] {
        for around in ["0", "16"] {
            let cmds = [
                vec![zero.to_str().unwrap()],
                vec![fork.to_str().unwrap(), "12"],
                vec![threads.to_str().unwrap(), "24"],
                vec![memsem.to_str().unwrap(), "16"],
            ];
            for cmd in cmds {
                let (out, s) = stats_of(
                    &["--excache", excache, "--fault-around", around, "--prealloc", "64"],
                    &cmd,
                );
                let stdout = text(&out.stdout);
                assert!(
                    !stdout.contains(": 0") && !stdout.contains("NOT") && !stdout.contains("CHANGED"),
                    "{cmd:?}: every check must hold:\n{stdout}"
                );
                assert!(n(&s, "preallocated") > 0, "{cmd:?} at {excache}: {s}");
                assert_eq!(s["errors"].as_array().map(|e| e.len()), Some(0), "{s}");
            }
        }
    }
    // MADV_DONTNEED of memory that never left the pComponent is answered without its home.
    let (_, s) = stats_of(&["--excache", "256M", "--prealloc", "64"], &[zero.to_str().unwrap()]);
    assert!(
        n(&s, "heap_calls_local") > 0 && n(&s, "heap_calls") > n(&s, "heap_calls_local"),
        "{s}"
    );
    // CPython, which maps, unmaps and purges its arenas, and forks: the same output as natively.
    let py = python3();
    let script = PY_COUNTER_FORK;
    for excache in ["256M", "8M"] {
        let (_, s) = same_as_native_with_stats(&["--excache", excache, "--prealloc", "64"], &[&py, "-c", script]);
        assert!(n(&s, "preallocated") > 0 && n(&s, "processes") == 2, "{s}");
        assert_eq!(s["errors"].as_array().map(|e| e.len()), Some(0), "{s}");
    }
    // A program filling fresh memory traps once per window instead of once per page.
    let cmd = [hold.to_str().unwrap(), "48"];
    let (_, off) = stats_of(&["--excache", "256M", "--fault-around", "0", "--prealloc", "0"], &cmd);
    let (_, on) = stats_of(&["--excache", "256M", "--fault-around", "0", "--prealloc", "64"], &cmd);
    assert_eq!(n(&off, "preallocated"), 0);
    assert!(n(&on, "preallocated") > 10_000, "{on}");
    assert!(
        n(&on, "plocal_fills") * 16 < n(&off, "plocal_fills"),
        "first touches that trap: {} with pre-allocation, {} without",
        n(&on, "plocal_fills"),
        n(&off, "plocal_fills")
    );
}

#[test]
fn gnu_sort_filling_its_line_table_downwards_traps_once_per_window() {
    // GNU sort keeps the text at the start of its buffer and its table of lines growing down
    // from the end: the window after a first touch must follow that direction too.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("words");
    let mut words = String::new();
    let mut x: u64 = 7;
    for _ in 0..300_000 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        words.push_str(&format!("{:x}\n", x >> 40));
    }
    std::fs::write(&input, words).unwrap();
    let cmd = ["sort", "-S", "256M", input.to_str().unwrap()];
    let (_, off) = same_as_native_with_stats(&["--excache", "256M", "--fault-around", "0", "--prealloc", "0"], &cmd);
    let (_, on) = same_as_native_with_stats(&["--excache", "256M", "--fault-around", "16", "--prealloc", "64"], &cmd);
    assert!(n(&off, "plocal_fills") > 3_000, "{off}");
    assert!(n(&on, "preallocated") > 3_000, "{on}");
    assert!(
        n(&on, "plocal_fills") * 16 < n(&off, "plocal_fills"),
        "first touches that trap: {} with the window, {} without",
        n(&on, "plocal_fills"),
        n(&off, "plocal_fills")
    );
}

/// The kernel's count of entries into the idle loop's polling state, over all CPUs; None if
/// its first idle state is not polling, or it has no idle states.
fn idle_polls() -> Option<u64> {
    let cpus = std::fs::read_dir("/sys/devices/system/cpu").ok()?;
    let (mut total, mut seen) = (0, false);
    for cpu in cpus.flatten() {
        let state = cpu.path().join("cpuidle/state0");
        if std::fs::read_to_string(state.join("name")).is_ok_and(|n| n.trim() == "POLL") {
            total += std::fs::read_to_string(state.join("usage"))
                .ok()?
                .trim()
                .parse::<u64>()
                .ok()?;
            seen = true;
        } else if cpu.file_name().to_string_lossy().starts_with("cpu") && state.exists() {
            return None;
        }
    }
    // A kernel without a cpuidle driver (some virtual machines) counts no idle state at all.
    seen.then_some(total)
}

#[test]
fn idle_poll_keeps_idle_cpus_polling_while_programs_run_and_off_asks_for_nothing() {
    if !std::path::Path::new("/dev/cpu_dma_latency").exists() {
        skip("no /dev/cpu_dma_latency");
        return;
    }
    // The program reads the CPU latency the kernel enforces while it runs, and misses all the
    // while (a quarter of its 16 MiB fits).
    let prog = "import os, struct\nx = [bytearray(4096) for _ in range(4096)]\nfor _ in range(3):\n    for b in x:\n        b[0] += 1\nf = os.open('/dev/cpu_dma_latency', os.O_RDONLY)\nprint(struct.unpack('i', os.read(f, 4))[0], sum(b[0] for b in x))";
    let py = python3();
    let run = |mode: &str| {
        let f = tempfile::NamedTempFile::new().unwrap();
        let polls = idle_polls();
        let out = under_splitos(
            &[
                "--quiet",
                "--excache",
                "4M",
                "--idle-poll",
                mode,
                "--stats-json",
                f.path().to_str().unwrap(),
            ],
            &[&py, "-c", prog],
        );
        assert!(out.status.success(), "idle_poll = {mode}: {}", text(&out.stderr));
        let polled = polls.zip(idle_polls()).map(|(a, b)| b - a);
        (
            text(&out.stdout),
            serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(f.path()).unwrap()).unwrap(),
            polled,
        )
    };
    // On a cluster that outlives the program, so that what the pComponent does once the
    // program has exited can be seen: a run's statistics are taken as it ends, possibly before
    // the pComponent has retired the process.
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"4M\"\nidle_poll = \"on\"\n[[mcomponent]]\n",
    ));
    let f = c.dir.path().join("idle.json");
    let polls = idle_polls();
    let out = c.run(&["--quiet", "--stats-json", f.to_str().unwrap()], &[&py, "-c", prog]);
    assert!(out.status.success(), "idle_poll = on: {}", text(&out.stderr));
    let polled = polls.zip(idle_polls()).map(|(a, b)| b - a);
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
    assert_eq!(
        text(&out.stdout),
        format!("0 {}\n", 4096 * 3),
        "inside the program the kernel enforces a latency of 0 µs: {s}"
    );
    assert!(
        s["misses"].as_u64().unwrap() > 4096,
        "the program missed all the while: {s}"
    );
    assert_eq!(s["pcomponent"]["idle_poll"], "on");
    assert!(
        n(&s["idle_poll"]["counters"], "requests") >= 1,
        "the pComponent made the request: {s}"
    );
    let dropped = |c: &TestCluster| {
        let st = &c.components("pcomponent")[0]["stats"]["idle_poll"];
        st["in_force"] == false && n(&st["counters"], "releases") >= 1
    };
    assert!(
        c.eventually(std::time::Duration::from_secs(10), dropped),
        "and dropped it once the program exited: {}",
        c.components("pcomponent")[0]["stats"]["idle_poll"]
    );
    if let Some(p) = polled {
        assert!(p > 0, "idle CPUs polled during the run");
    }
    drop(c);
    let (out, s, _) = run("off");
    assert!(out.ends_with(&format!(" {}\n", 4096 * 3)), "{out}");
    assert_eq!(s["pcomponent"]["idle_poll"], "off");
    assert_eq!(
        n(&s["idle_poll"]["counters"], "requests"),
        0,
        "off asks the kernel for nothing: {s}"
    );
}

#[test]
fn first_touches_here_and_there_get_few_fresh_lines_and_a_fill_gets_whole_windows() {
    // 400 pages 1 MiB apart: each first touch continues no run.
    let stride = program("stride");
    let cmd = [stride.to_str().unwrap(), "1", "400", "1"];
    let fresh = |s: &serde_json::Value| n(s, "faulted_around") + n(s, "preallocated");
    let (_, ramp) = stats_of(&["--excache", "1G"], &cmd);
    let (_, whole) = stats_of(&["--excache", "1G", "--fault-around-start", "80"], &cmd);
    assert!(n(&ramp, "plocal_fills") >= 400 && n(&whole, "plocal_fills") >= 400);
    assert!(
        fresh(&ramp) < 12 * n(&ramp, "plocal_fills"),
        "a touch that continues no run gets fault_around_start (8) lines: {ramp}"
    );
    assert!(
        fresh(&whole) > 40 * n(&whole, "plocal_fills"),
        "at fault_around + prealloc every first touch gets the whole window: {whole}"
    );
    // A program filling 48 MiB soon gets whole windows: a few traps more than with the whole
    // window from the first touch, not a trap per page.
    let hold = program("hold");
    let cmd = [hold.to_str().unwrap(), "48"];
    let (_, ramp) = stats_of(&["--excache", "256M"], &cmd);
    let (_, whole) = stats_of(&["--excache", "256M", "--fault-around-start", "80"], &cmd);
    assert!(
        n(&ramp, "plocal_fills") < n(&whole, "plocal_fills") + 100,
        "{} first touches trapped ramping up, {} with whole windows",
        n(&ramp, "plocal_fills"),
        n(&whole, "plocal_fills")
    );
}

#[test]
fn heap_calls_are_caught_by_polling_and_heap_call_spin_us_0_sleeps_instead() {
    // Heap calls back to back (the mappings untouched): the next call comes while the thread
    // still polls.
    let heapcalls = program("heapcalls");
    let cmd = [heapcalls.to_str().unwrap(), "3000", "0"];
    let (_, polled) = stats_of(&["--excache", "64M"], &cmd);
    let (_, slept) = stats_of(&["--excache", "64M", "--heap-call-spin-us", "0"], &cmd);
    for s in [&polled, &slept] {
        assert!(n(s, "heap_calls") >= 6000, "every mmap and munmap is a heap call: {s}");
    }
    assert!(
        n(&polled, "heap_calls_polled") * 2 > n(&polled, "heap_calls"),
        "the pComponent's thread polls for the next heap call: {polled}"
    );
    // Without polling only the calls that came while the thread was still busy are found
    // without a sleep.
    assert!(
        n(&slept, "heap_calls_polled") * 2 < n(&polled, "heap_calls_polled"),
        "with heap_call_spin_us = 0 it sleeps: {} of {} found without a sleep, against {} of {} polling",
        n(&slept, "heap_calls_polled"),
        n(&slept, "heap_calls"),
        n(&polled, "heap_calls_polled"),
        n(&polled, "heap_calls")
    );
}
