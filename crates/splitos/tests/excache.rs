//! The ExCache's run-time options each change behaviour that the counters show.
mod common;
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
    let (_, fifo) = stats_of(&["--excache", "2M", "--policy", "fifo"], &cmd);
    let (_, clock) = stats_of(&["--excache", "2M", "--policy", "clock"], &cmd);
    assert!(n(&clock, "misses") * 10 < n(&fifo, "misses") * 9, "clock {} vs fifo {} misses", n(&clock, "misses"), n(&fifo, "misses"));
}

#[test]
fn piggyback_merges_flush_and_fetch_only_when_enabled() {
    // One mComponent: every victim and every missed line have the same owner, so with
    // piggyback on each dirty eviction that precedes a fetch travels with it.
    let p = program("memtouch");
    let cmd = [p.to_str().unwrap(), "12"];
    let (_, on) = through_components(&["--excache", "4M", "--mcomponents", "1"], &cmd, 1);
    let (_, off) = through_components(&["--excache", "4M", "--mcomponents", "1", "--no-piggyback"], &cmd, 1);
    assert!(n(&on, "piggybacked") > 1000, "{on}");
    // The mComponent received them as combined flush+fetch requests: its own count agrees.
    assert_eq!(mcomp_sum(&on, "piggybacked"), n(&on, "piggybacked"), "{on}");
    assert_eq!(n(&off, "piggybacked"), 0, "{off}");
    assert_eq!(mcomp_sum(&off, "piggybacked"), 0, "no combined requests reach the mComponent: {off}");
    assert!(n(&off, "flushes") > 1000 && mcomp_sum(&off, "flushes") > 1000, "write-backs go as separate flushes: {off}");
}

#[test]
fn unknown_policy_is_refused() {
    let out = under_splitos(&["--policy", "lfu"], &["true"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("pcomponent[0].policy"), "{}", text(&out.stderr));
}

#[test]
fn injected_network_delay_slows_every_miss() {
    // SPLITOS_NET_DELAY_US makes every component wait before each message it sends.
    let p = program("stride");
    let cmd = [p.to_str().unwrap(), "4", "8", "30"];
    let opts = ["--excache", "4M", "--ways", "1"];
    let (_, fast) = stats_of(&opts, &cmd);
    let (_, slow) = stats_of_env(&opts, &cmd, &[("SPLITOS_NET_DELAY_US", "3000")]);
    assert!(n(&slow, "evictions") >= 200, "{slow}");
    assert!(n(&slow, "miss_ns_p50") >= 3_000_000, "a remote miss waits for the delay: {slow}");
    assert!(n(&fast, "miss_ns_p50") < 3_000_000, "{fast}");
}
