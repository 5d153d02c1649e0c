//! The compressed local tier with real components and real programs: evicted lines are served
//! from the pComponent's own memory instead of the mComponents, and programs see exactly what
//! they see natively, across fork too.
use crate::common;
use common::*;

fn remote(s: &serde_json::Value) -> u64 {
    n(s, "misses") - n(s, "plocal_fills") - n(s, "tier_hits")
}

#[test]
fn the_tier_serves_evicted_lines_locally_and_programs_see_their_own_data() {
    let p = program("randpages");
    // 24 MiB touched in random order twice, through a 4 MiB ExCache: nearly every miss is a
    // line evicted earlier.
    let cmd = [p.to_str().unwrap(), "24", "2"];
    // `stats_of` compares the output with a native run. Without one-sided access every
    // fetch and write-back is a request the mComponent counts itself.
    let (_, off) = stats_of(
        &["--excache", "4M", "--compressed-tier", "0", "--one-sided", "off"],
        &cmd,
    );
    let (_, on) = stats_of(
        &["--excache", "4M", "--compressed-tier", "8M", "--one-sided", "off"],
        &cmd,
    );
    assert_eq!(n(&off, "tier_hits") + n(&off, "tier_stores"), 0, "{off}");
    assert!(n(&on, "tier_hits") > 4000, "misses served from the tier: {on}");
    assert!(n(&on, "tier_bytes_packed") * 4 < n(&on, "tier_bytes_raw"), "{on}");
    assert!(
        remote(&on) * 4 < remote(&off),
        "remote misses: {} with the tier, {} without",
        remote(&on),
        remote(&off)
    );
    // The mComponents' own counters agree: they served fewer fetches and stored fewer pages.
    let fetched = |s: &serde_json::Value| mcomp_sum(s, "fetches");
    assert!(
        fetched(&on) * 4 < fetched(&off),
        "mComponent fetches: {} with the tier, {} without",
        fetched(&on),
        fetched(&off)
    );
    assert!(mcomp_sum(&on, "flushes") * 4 < mcomp_sum(&off, "flushes"), "{on}");
    assert_eq!(on["errors"].as_array().map(|e| e.len()), Some(0), "{on}");
    let bad = under_splitos(&["--compressed-tier", "100"], &["true"]);
    assert!(
        !bad.status.success() && text(&bad.stderr).contains("compressed_tier"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn a_forked_child_gets_the_pages_the_tier_held_and_the_counters_show_it() {
    let (c, pcomp) = forktest_on("compressed_tier = \"8M\"");
    // 12 MiB through a 4 MiB ExCache: the parent's evicted pages were in the tier, dirty, when
    // it forked; they reached the mComponent before it copied the parent's pages.
    assert!(c.metric(&pcomp, "splitos_pcomp_tier_hits_total") > 0.0);
    assert!(c.metric(&pcomp, "splitos_pcomp_tier_writebacks_total") > 0.0);
    assert!(c.metric(&pcomp, "splitos_pcomp_tier_stores_total") > c.metric(&pcomp, "splitos_pcomp_tier_hits_total"));
    // Both processes exited: their entries are gone.
    assert_eq!(c.metric(&pcomp, "splitos_pcomp_tier_entries"), 0.0);
}
