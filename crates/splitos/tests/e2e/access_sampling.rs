//! Access sampling with real components and real programs: the pComponent unmaps lines its
//! policy asks to observe (their pages kept), the kernel maps one again when it is touched and
//! the page tables tell the pComponent before the line would leave,
//! programs give their native output, and a read-only hot set survives streams that push it
//! out of an ExCache that sees only misses and writes.
use crate::common;
use common::*;

/// Sampling needs CAP_SYS_NICE and a host without swap; elsewhere the pComponent runs
/// without it (and says so), and these tests have nothing to show.
fn sampling_possible() -> bool {
    let swap = std::fs::read_to_string("/proc/swaps")
        .map(|s| s.lines().count() > 1)
        .unwrap_or(true);
    if swap {
        skip("this host has swap: access sampling is off on it");
    }
    !swap
}

#[test]
fn sampled_reads_keep_a_read_hot_set_that_streams_push_out_otherwise() {
    if !sampling_possible() {
        return;
    }
    let p = program("readhot");
    // 1,024 hot pages (4 MiB) read at random, then 512 pages of a 32 MiB stream, 12 rounds,
    // through an 8 MiB ExCache without read-ahead (every miss is one page).
    let (hot, rounds) = (1024, 12);
    let cmd = [p.to_str().unwrap(), "1024", "8192", "12"];
    // Sets of 8 ways, as sampling was measured with: the default fully associative
    // workingset keeps this hot set from its misses alone (excache.rs).
    let base = ["--excache", "8M", "--prefetch-lines", "0", "--ways", "8"];
    let (_, fifo) = through_components(&[&base[..], &["--eviction", "fifo"]].concat(), &cmd, 1);
    let (_, blind) = through_components(&[&base[..], &["--eviction", "ghost-clock"]].concat(), &cmd, 1);
    let (_, sampled) = through_components(
        &[&base[..], &["--eviction", "ghost-clock", "--access-sampling", "unmap"]].concat(),
        &cmd,
        1,
    );
    // The pComponent unmapped lines and saw them touched again: its own counters.
    assert!(
        n(&sampled, "sample_unmaps") > 1000 && n(&sampled, "sample_touches") > 1000,
        "{sampled}"
    );
    assert_eq!(
        sampled["pcomponent"]["access_sampling"], "unmap",
        "the pComponent says sampling is on: {sampled}"
    );
    assert_eq!(blind["pcomponent"]["access_sampling"], "off", "{blind}");
    assert_eq!(
        n(&fifo, "sample_unmaps") + n(&blind, "sample_touches"),
        0,
        "no sampling unless asked: {fifo} {blind}"
    );
    // Every page of the stream is read once, a remote miss under any policy, and the hot set
    // comes back once after the stream's first touches pushed it out: what is left are the
    // hot set's re-misses, which the policy decides.
    let again = |s: &serde_json::Value| (n(s, "misses") - n(s, "plocal_fills")).saturating_sub(rounds * hot / 2 + hot);
    let (f, b, s) = (again(&fifo), again(&blind), again(&sampled));
    assert!(
        s * 4 < f,
        "seeing reads keeps the hot set: {s} re-misses sampled, {f} with fifo"
    );
    assert!(
        s * 2 < b,
        "the policy alone cannot: {s} re-misses sampled, {b} with ghost-clock without sampling"
    );
}

#[test]
fn programs_keep_their_output_with_sampling_and_their_writes_survive_unmapping() {
    if !sampling_possible() {
        return;
    }
    // Python: dicts and lists written and read while their pages are unmapped under them, with
    // CLOCK (every line the hand passes) and with the default workingset (the lines about to
    // leave, at the head of the inactive list).
    for eviction in ["clock", "workingset"] {
        let opts = ["--excache", "2M", "--eviction", eviction, "--access-sampling", "unmap"];
        let (_, s) = through_components(
            &opts,
            &[
                &python3(),
                "-c",
                "d={i:str(i)*3 for i in range(60000)}; print(sum(len(v) for v in d.values()), sorted(d)[-1])",
            ],
            1,
        );
        assert!(
            n(&s, "sample_unmaps") > 0 && n(&s, "sample_touches") > 0,
            "{eviction}: {s}"
        );
        assert_eq!(s["pcomponent"]["eviction"], eviction, "{s}");
    }
    // Threads incrementing counters in pages that are evicted and unmapped as they write.
    let p = program("rewriters");
    let (out, s) = through_components(
        &[
            "--excache",
            "256K",
            "--eviction",
            "ghost-clock",
            "--access-sampling",
            "unmap",
        ],
        &[p.to_str().unwrap(), "8", "20000"],
        1,
    );
    assert!(text(&out.stdout).contains("lost 0,"), "{}", text(&out.stdout));
    assert!(n(&s, "sample_touches") > 0, "{s}");
}

#[test]
fn access_sampling_that_cannot_work_is_refused_with_why() {
    for (opts, why) in [
        (&["--access-sampling", "unmap", "--eviction", "fifo"][..], "fifo"),
        (
            &[
                "--access-sampling",
                "unmap",
                "--eviction",
                "clock",
                "--dirty-tracking",
                "scan",
            ][..],
            "dirty_tracking",
        ),
        (
            &[
                "--access-sampling",
                "unmap",
                "--eviction",
                "clock",
                "--huge-pages",
                "on",
            ][..],
            "huge_pages",
        ),
        (&["--access-sampling", "sometimes"][..], "access-sampling"),
    ] {
        let out = under_splitos(opts, &["true"]);
        assert!(
            !out.status.success() && text(&out.stderr).contains(why),
            "{opts:?}: {}",
            text(&out.stderr)
        );
    }
}
