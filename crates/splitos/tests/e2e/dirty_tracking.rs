//! Dirty tracking by scan with real components and real programs: the kernel records writes
//! (asynchronous write protection), the pComponent asks it with PAGEMAP_SCAN when it evicts,
//! no write traps, lines read and not written are dropped without a write-back, and no write
//! is lost, not even one racing the eviction of its page.
use crate::common;
use common::*;

#[test]
fn scan_tracking_drops_unwritten_lines_without_a_write_back_or_a_write_fault() {
    let p = program("dirtymix");
    // 16 MiB read in random order three times through a 4 MiB ExCache; three in four pages
    // read are then written, so fault tracking installs read misses writable and dirty.
    let cmd = [p.to_str().unwrap(), "16", "3"];
    // `through_components` compares the output with a native run.
    let (_, fault) = through_components(&["--excache", "4M", "--dirty-tracking", "fault"], &cmd, 1);
    let (_, scan) = through_components(&["--excache", "4M", "--dirty-tracking", "scan"], &cmd, 1);
    assert!(n(&fault, "wp_faults") > 0 && n(&fault, "dirty_scans") == 0, "{fault}");
    assert_eq!(n(&scan, "wp_faults"), 0, "no write traps: {scan}");
    assert!(
        n(&scan, "dirty_scans") > 0 && n(&scan, "dirty_scanned_pages") >= n(&scan, "dirty_scans"),
        "{scan}"
    );
    // About a quarter of the evicted lines were read and not written.
    assert!(n(&scan, "scan_clean_evictions") * 8 > n(&scan, "evictions"), "{scan}");
    assert!(n(&scan, "writebacks_avoided") * 10 > n(&scan, "evictions"), "{scan}");
    // The mComponents stored fewer pages: their own counters.
    let (ff, sf) = (pages_stored(&fault), pages_stored(&scan));
    assert!(sf * 10 < ff * 9, "mComponent flushes: fault tracking {ff}, scan {sf}");
}

#[test]
fn no_write_is_lost_while_threads_write_pages_under_eviction() {
    let p = program("rewriters");
    // Three threads each read a page of their own and increment a counter in it a few steps
    // later, every step missing on an 8 MiB buffer through a 256 KiB ExCache: pages come back
    // clean and are often evicted just as they are written (a design that asked the kernel
    // before taking the page, with 20 µs between the two, lost increments here).
    let cmd = [p.to_str().unwrap(), "8", "20000"];
    let (out, s) = through_components(&["--excache", "256K", "--dirty-tracking", "scan"], &cmd, 1);
    assert!(text(&out.stdout).contains("lost 0,"), "{}", text(&out.stdout));
    assert!(
        n(&s, "scan_clean_evictions") > 1000 && n(&s, "evictions") > 50_000,
        "{s}"
    );
    assert_eq!(n(&s, "wp_faults"), 0, "{s}");
}

#[test]
fn a_forked_child_gets_the_pages_its_parent_wrote_with_scan_tracking_from_the_config() {
    let (c, pcomp) = forktest_on("dirty_tracking = \"scan\"");
    // The fork's write-back asked the kernel which resident lines were written.
    assert!(c.metric(&pcomp, "splitos_pcomp_dirty_scans_total") > 0.0);
    assert_eq!(c.metric(&pcomp, "splitos_pcomp_wp_faults_total"), 0.0);
}

#[test]
fn a_bad_dirty_tracking_is_refused_with_its_name() {
    let out = under_splitos(&["--dirty-tracking", "sometimes"], &["true"]);
    assert!(
        !out.status.success() && text(&out.stderr).contains("dirty-tracking"),
        "{}",
        text(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.toml");
    std::fs::write(&cfg, "[[pcomponent]]\ndirty_tracking = \"sometimes\"\n[[mcomponent]]\n").unwrap();
    let out = std::process::Command::new(splitos())
        .args(["cluster", "up", "--config"])
        .arg(&cfg)
        .env("SPLITOS_STATE_DIR", dir.path())
        .output()
        .unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("dirty_tracking"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn clock_keeps_a_written_hot_set_with_scan_tracking_without_write_faults() {
    let p = program("hotcold");
    let cmd = [p.to_str().unwrap(), "256", "4096"];
    // Without read-ahead, as excache::clock_keeps_a_written_hot_set_that_fifo_evicts: what it
    // saves of the cold stream depends on timing, where the policies' choices do not.
    let base = ["--excache", "2M", "--dirty-tracking", "scan", "--prefetch-lines", "0"];
    let (_, fifo) = stats_of(&[&base[..], &["--eviction", "fifo"]].concat(), &cmd);
    let (_, clock) = stats_of(&[&base[..], &["--eviction", "clock"]].concat(), &cmd);
    // CLOCK learns of a write by asking the kernel, not by a write-protect fault.
    assert!(
        n(&clock, "misses") * 10 < n(&fifo, "misses") * 9,
        "clock {} vs fifo {} misses",
        n(&clock, "misses"),
        n(&fifo, "misses")
    );
    assert_eq!(n(&clock, "wp_faults"), 0, "{clock}");
    assert!(n(&clock, "dirty_scans") > n(&fifo, "dirty_scans"), "{clock}");
}
