//! The background evictor with real components and real programs: with `evict_reserve` on,
//! the pComponent's evictor thread takes most evictions off the miss path, and programs see
//! exactly what they see natively, across fork too.
use std::path::Path;

use crate::common;
use common::*;

#[test]
fn the_evictor_takes_evictions_off_the_miss_path_and_programs_see_their_own_data() {
    let p = program("randpages");
    // 24 MiB touched in random order twice, through a 4 MiB ExCache: nearly every miss finds
    // its set full.
    let cmd = [p.to_str().unwrap(), "24", "2"];
    let (_, off) = same_as_native_with_stats(&["--excache", "4M", "--ways", "8", "--evict-reserve", "0"], &cmd);
    let (_, on) = same_as_native_with_stats(&["--excache", "4M", "--ways", "8", "--evict-reserve", "1"], &cmd);
    assert_eq!(
        n(&off, "bg_evictions") + n(&off, "bg_writebacks") + n(&off, "evictor_ns"),
        0,
        "{off}"
    );
    assert_eq!(n(&off, "inline_evictions"), n(&off, "evictions"), "{off}");
    assert!(n(&on, "bg_evictions") > 2000, "{on}");
    // At least halved: on a loaded machine the evictor's thread runs late (3.6x seen), on a
    // quiet one it takes nearly all of them.
    assert!(
        n(&on, "inline_evictions") * 2 < n(&off, "inline_evictions"),
        "inline evictions: {} with the evictor, {} without",
        n(&on, "inline_evictions"),
        n(&off, "inline_evictions")
    );
    assert_eq!(
        n(&on, "evictions"),
        n(&on, "bg_evictions") + n(&on, "inline_evictions"),
        "{on}"
    );
    // Its dirty victims went to the mComponents in batches, and they stored them.
    assert!(
        n(&on, "bg_writebacks") > 2 * n(&on, "bg_writeback_batches") && n(&on, "bg_writeback_batches") > 0,
        "{on}"
    );
    assert!(pages_stored(&on) >= n(&on, "flushes"), "{on}");
    // Dirty victims left their program in one step (splice, punch, read), never protected
    // for the copy, with or without the evictor: the program's output (above) is native.
    for s in [&on, &off] {
        assert!(
            n(s, "taken_dirty") > 1000 && n(s, "taken_dirty") <= n(s, "evictions"),
            "{s}"
        );
    }
    assert!(
        n(&on, "evictor_ns") >= n(&on, "evictor_cpu_ns") && n(&on, "evictor_cpu_ns") > 0,
        "{on}"
    );
    assert_eq!(on["errors"].as_array().map(|e| e.len()), Some(0), "{on}");
    let bad = under_splitos(&["--ways", "4", "--evict-reserve", "4"], &["true"]);
    assert!(
        !bad.status.success() && text(&bad.stderr).contains("evict_reserve"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn scattered_victims_take_their_old_cold_neighbours_out_with_them_and_programs_see_their_own_data() {
    // CPython builds, sorts and indexes a table of records through an ExCache of a fifth of
    // its heap: it misses all over its heap, so the policy's victims are scattered pages.
    let records = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/workloads/records.py");
    let cmd = ["python3", records.to_str().unwrap(), "20000"];
    let (_, alone) = same_as_native_with_stats(&["--excache", "6M", "--evict-beside", "0"], &cmd);
    let (_, beside) = same_as_native_with_stats(&["--excache", "6M", "--evict-beside", "15"], &cmd);
    assert_eq!(n(&alone, "evicted_beside"), 0, "{alone}");
    assert!(n(&beside, "evicted_beside") > 1000, "{beside}");
    assert!(n(&beside, "evicted_beside") < n(&beside, "bg_evictions"), "{beside}");
    // The pages each run took out of the program at once (one punch, one TLB flush): about
    // 1.3 alone, 1.9 with neighbours.
    let per_run = |s: &serde_json::Value| n(s, "bg_evictions") as f64 / n(s, "bg_eviction_runs").max(1) as f64;
    assert!(
        per_run(&beside) > 1.25 * per_run(&alone),
        "pages per run: {} with neighbours, {} without",
        per_run(&beside),
        per_run(&alone)
    );
    for s in [&alone, &beside] {
        assert_eq!(s["errors"].as_array().map(|e| e.len()), Some(0), "{s}");
    }
    let bad = under_splitos(&["--evict-beside", "65"], &["true"]);
    assert!(
        !bad.status.success() && text(&bad.stderr).contains("evict_beside"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn a_forked_child_gets_its_parents_pages_with_the_evictor_on_and_the_pcomponent_counts_it() {
    let (c, pcomp) = forktest_on("ways = 8\nevict_reserve = 2");
    let bg = c.metric(&pcomp, "splitos_pcomp_bg_evictions_total");
    assert!(bg > 0.0, "background evictions: {bg}");
    assert!(c.metric(&pcomp, "splitos_pcomp_inline_evictions_total") < bg);
    assert!(c.metric(&pcomp, "splitos_pcomp_bg_writeback_batches_total") > 0.0);
    assert!(c.metric(&pcomp, "splitos_pcomp_evictor_seconds_total") > 0.0);
}
