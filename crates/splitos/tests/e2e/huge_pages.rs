//! Huge pages for program heaps with real components and real programs: fresh heap memory is
//! mapped with 2 MiB pages (the program's own smaps say so), lines leaving a huge page split it
//! first, and programs see exactly what they see natively.
use crate::common;
use common::*;

/// The kB of the program's memory mapped with huge pages, as it printed them on stderr.
fn huge_mapped(out: &std::process::Output) -> u64 {
    let err = text(&out.stderr);
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("huge-mapped "))
        .unwrap_or_else(|| panic!("no huge-mapped line in:\n{err}"));
    line.trim_end_matches(" kB").parse().unwrap()
}

#[test]
fn fresh_heap_memory_is_mapped_with_huge_pages_only_when_asked() {
    let p = program("hugetouch");
    let cmd = [p.to_str().unwrap(), "64", "2"];
    // `stats_of` compares the output with a native run.
    let (out, off) = stats_of(&["--excache", "256M", "--huge-pages", "off"], &cmd);
    assert_eq!((n(&off, "huge_pages"), huge_mapped(&out)), (0, 0), "{off}");
    let (out, on) = stats_of(&["--excache", "256M", "--huge-pages", "on"], &cmd);
    // The 64 MiB buffer is 32 extents; a few at its edges are shared with other allocations.
    assert!(n(&on, "huge_pages") >= 24, "{on}");
    assert!(
        huge_mapped(&out) >= 24 * 2048,
        "the program's own mappings: {} kB huge",
        huge_mapped(&out)
    );
    assert!(
        n(&on, "plocal_fills") * 4 < n(&off, "plocal_fills"),
        "first touches that trap: {} with huge pages, {} without",
        n(&on, "plocal_fills"),
        n(&off, "plocal_fills")
    );
    assert_eq!((n(&on, "huge_splits"), n(&on, "evictions")), (0, 0), "{on}");
    assert_eq!(on["errors"].as_array().map(|e| e.len()), Some(0), "{on}");
    let bad = under_splitos(&["--huge-pages", "2m"], &["true"]);
    assert!(
        !bad.status.success() && text(&bad.stderr).contains("huge_pages") && text(&bad.stderr).contains("off, on"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn huge_pages_split_when_their_lines_leave_and_every_program_keeps_its_semantics() {
    let rand = program("randpages");
    let zero = program("zero");
    let fork = program("forktest");
    let threads = program("threads");
    let memsem = program("memsem");
    let remap = program("remap");
    let (mut huge, mut splits) = (0, 0);
    // Zero semantics, realloc/mremap/brk, fork, threads, mprotect and madvise, unmapping and
    // mapping again, and random pages through an ExCache a quarter of their size: the same
    // output as natively, in a cache that fits and in one that does not.
    for excache in ["256M", "8M"] {
        let cmds = [
            vec![rand.to_str().unwrap(), "32", "2"],
            vec![zero.to_str().unwrap()],
            vec![fork.to_str().unwrap(), "12"],
            vec![threads.to_str().unwrap(), "24"],
            vec![memsem.to_str().unwrap(), "16"],
            vec![remap.to_str().unwrap()],
        ];
        for cmd in cmds {
            let (out, s) = stats_of(&["--excache", excache, "--huge-pages", "on"], &cmd);
            let stdout = text(&out.stdout);
            assert!(
                !stdout.contains(": 0") && !stdout.contains("NOT") && !stdout.contains("CHANGED"),
                "{cmd:?}: every check must hold:\n{stdout}"
            );
            assert_eq!(
                s["errors"].as_array().map(|e| e.len()),
                Some(0),
                "{cmd:?} at {excache}: {s}"
            );
            huge += n(&s, "huge_pages");
            splits += n(&s, "huge_splits");
        }
    }
    assert!(huge > 0 && splits > 0, "huge pages made {huge}, split {splits}");
    // CPython, which maps, unmaps and purges its arenas, and forks.
    let py = python3();
    let script = PY_COUNTER_FORK;
    for excache in ["256M", "8M"] {
        let (_, s) = same_as_native_with_stats(&["--excache", excache, "--huge-pages", "on"], &[&py, "-c", script]);
        assert!(n(&s, "huge_pages") > 0 && n(&s, "processes") == 2, "{s}");
        assert_eq!(s["errors"].as_array().map(|e| e.len()), Some(0), "{s}");
    }
}

#[test]
fn a_configured_cluster_takes_the_knob_and_its_pcomponent_counts_huge_pages() {
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"256M\"\nhuge_pages = \"on\"\n[[mcomponent]]\n",
    ));
    let p = program("hugetouch");
    let cmd = [p.to_str().unwrap(), "32", "1"];
    let native = native(&cmd);
    let out = c.run(&[], &cmd);
    assert_eq!(
        text(&out.stdout),
        text(&native.stdout),
        "stderr:\n{}",
        text(&out.stderr)
    );
    assert!(huge_mapped(&out) >= 8 * 2048, "{}", text(&out.stderr));
    let pcomp = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    assert!(c.metric(&pcomp, "splitos_pcomp_huge_pages_total") >= 8.0);
    let bad = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad.path(), "[[pcomponent]]\nhuge_pages = \"always\"\n[[mcomponent]]\n").unwrap();
    let up = std::process::Command::new(splitos())
        .args(["cluster", "up", "--config"])
        .arg(bad.path())
        .env("SPLITOS_STATE_DIR", c.dir.path().join("other"))
        .output()
        .unwrap();
    assert!(
        !up.status.success() && text(&up.stderr).contains("huge_pages"),
        "{}",
        text(&up.stderr)
    );
}
