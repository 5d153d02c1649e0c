//! The benchmark suite's quick mode, end to end, so that it cannot rot: real workloads under
//! native Linux, splitos and Linux swapping in a memory cgroup, with every figure produced.
//! It runs beside other tests (its times are not results here), with its time bounds four times
//! as long, and never beside the access-sampling tests: it turns swap devices on, and those
//! need a host without swap (tests/apart.txt).
use crate::cli::run_cmd;
use crate::common;

use std::path::Path;
use std::process::Command;

fn swaps() -> String {
    std::fs::read_to_string("/proc/swaps").unwrap()
}

#[test]
fn quick_suite_runs_every_configuration_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_path_buf();
    let swaps_before = swaps();
    let thp = || std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let thp_before = thp();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench/suite.py");
    let run = Command::new("python3")
        .arg(&script)
        .args(["--quick", "--slack", "4", "--out"])
        .arg(&out)
        .env("SPLITOS_BIN", common::splitos())
        .env("SPLITOS_DATA_DIR", out.join("data"))
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "suite failed: {}",
        &stderr[stderr.len().saturating_sub(3000)..]
    );

    let res: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("suite.json")).unwrap()).unwrap();
    let workloads = res["workloads"].as_object().unwrap();
    assert!(workloads.len() >= 5, "{workloads:?}");
    for (name, w) in workloads {
        assert_eq!(
            w["mismatches"].as_array().unwrap().len(),
            0,
            "{name}: outputs differ from native"
        );
        // A run stopped at the suite's time bound is recorded at that bound, not as a result.
        assert!(w["timeout_s"].as_f64().unwrap() > 0.0, "{name}: {w}");
        let stopped = w
            .get("timed_out")
            .and_then(|t| t.as_array())
            .map(|t| t.len())
            .unwrap_or(0);
        assert_eq!(
            stopped, 0,
            "{name}: runs stopped at the {} s bound: {}",
            w["timeout_s"], w["timed_out"]
        );
        assert!(w["native_s"][0].as_f64().unwrap() > 0.0, "{name}");
        for frac in ["0.25", "1.0"] {
            let r = &w["splitos"][frac][0];
            assert!(r["s"].as_f64().unwrap() > 0.0, "{name} at {frac}: {r}");
        }
        // At a quarter of its working set a program must miss in the ExCache.
        assert!(
            w["splitos"]["0.25"][0]["misses"].as_u64().unwrap() > 0,
            "{name}: no misses at 25%"
        );
        // The memory sweep: every system at every share quick mode measures.
        for (kind, frac) in [("splitos-tcp", "1.0"), ("swap-file", "1.0"), ("zram", "1.0")] {
            assert!(w[kind][frac][0]["s"].as_f64().unwrap() > 0.0, "{name} {kind} at {frac}");
        }
        for kind in ["swap-file", "zram"] {
            let r = &w[kind]["0.25"][0];
            assert!(r["s"].as_f64().unwrap() > 0.0, "{name} {kind}");
            // What swapping cost Linux, to set beside splitos's remote misses.
            assert!(r["pswpin"].is_u64() && r["majflt"].is_u64(), "{name} {kind}: {r}");
        }
        // An ExCache four times the working set, fully associative, evicts nothing; 25% over TCP
        // misses as the default transport does.
        let fits = &w["splitos-fits"]["4.0"][0];
        assert_eq!(fits["evictions"].as_u64().unwrap(), 0, "{name} fits: {fits}");
        assert!(
            w["splitos-tcp"]["0.25"][0]["misses"].as_u64().unwrap() > 0,
            "{name}: no misses at 25% over TCP"
        );
        assert!(
            w["native_cpu_s"][0].as_f64().unwrap() > 0.0 && fits["cpu_s"].as_f64().unwrap() > 0.0,
            "{name}: CPU time measured"
        );
    }
    let names: Vec<&String> = workloads.keys().collect();
    for lang in ["perl", "node"] {
        assert!(
            names.iter().any(|n| n.starts_with(lang)),
            "a {lang} workload: {names:?}"
        );
    }
    assert!(res["fig13"]["configs"].as_array().unwrap().len() >= 3);
    assert!(res["fig14"]["configs"].as_array().unwrap().len() >= 2);
    // Figures 13 and 14 record whether each run's output equalled the native run's (a run
    // stopped at the time bound does not).
    for fig in ["fig13", "fig14"] {
        for c in res[fig]["configs"].as_array().unwrap() {
            for r in c["runs"].as_array().unwrap() {
                assert_eq!(r["ok"], true, "{fig}: {c}");
            }
        }
    }
    let f15 = res["fig15"]["configs"].as_array().unwrap();
    assert_eq!(f15.len(), 3);
    for c in f15 {
        assert_eq!(c["runs"][0]["slowdown"].as_object().unwrap().len(), 2, "{c}");
    }
    for png in [
        "suite-slowdown.png",
        "suite-sweep.png",
        "suite-sweep-misses.png",
        "suite-fig13.png",
        "suite-fig14.png",
        "suite-fig15.png",
    ] {
        let bytes = std::fs::read(out.join(png)).unwrap_or_else(|e| panic!("{png}: {e}"));
        assert_eq!(&bytes[1..4], b"PNG", "{png}");
    }
    let report = std::fs::read_to_string(out.join("benchmarks.md")).unwrap();
    for want in [
        "<!-- suite:begin",
        "Machine:",
        "splitos fits",
        "The memory sweep",
        "| splitos TCP |",
        "swap file reads",
        "Geometric means",
        "Time over native per remote miss",
        "CPU time",
        "Figure 13",
        "Figure 14",
        "Figure 15",
        "<!-- suite:end -->",
    ] {
        assert!(report.contains(want), "report lacks {want}");
    }

    // Swap devices, memory cgroups and the huge-page setting are the suite's to undo.
    assert_eq!(swaps(), swaps_before, "swap devices left behind");
    assert_eq!(thp(), thp_before, "the transparent huge page setting is restored");
    let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup/memory")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("splitos-bench-"))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
}

/// Compiles scripts/bench/<name>.c into `dir` as the benchmark scripts do.
fn bench_program(dir: &Path, name: &str) -> std::path::PathBuf {
    let exe = dir.join(name);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../scripts/bench/{name}.c"));
    let st = Command::new("gcc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("gcc runs");
    assert!(st.success(), "compiling {}", src.display());
    exe
}

/// The paging floor's pagers (scripts/bench/pager.c, which pagerfloor.py times) keep the
/// program's memory as it is natively, and really page: a floor measured by a pager that lost
/// writes, or never evicted, would be no floor.
#[test]
fn the_paging_floors_pagers_page_and_keep_the_programs_memory() {
    let dir = tempfile::tempdir().unwrap();
    let exe = bench_program(dir.path(), "pager");
    let run = |mode: &str| -> serde_json::Value {
        let out = Command::new(&exe)
            .args([mode, "2048", "1024", "50000", "10"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{mode}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let native = run("native");
    for mode in ["inline", "bg", "samecpu", "samecpu-bg", "sigbus"] {
        let r = run(mode);
        assert_eq!(
            r["sum"], native["sum"],
            "{mode}: the memory differs from the native run's: {r}"
        );
        // Half the pages resident and uniform accesses: about half the accesses miss.
        let misses = r["misses"].as_u64().unwrap();
        assert!((15_000..=35_000).contains(&misses), "{mode}: {r}");
        assert!(
            r["evictions"].as_u64().unwrap() >= misses,
            "{mode}: every miss past the fill evicted: {r}"
        );
    }
}

/// The unmap floor's program (scripts/bench/unmap.c, which pagerfloor.py times) really takes
/// the program's pages out of its page tables, keeping what they hold for sampling's unmap and
/// freeing them for an eviction's punch, with the program waiting and running: a floor
/// timed over calls that unmapped nothing would be no floor.
#[test]
fn the_unmap_floors_program_takes_the_pages_out_of_the_program() {
    let dir = tempfile::tempdir().unwrap();
    let exe = bench_program(dir.path(), "unmap");
    for how in ["pageout", "pageout-run", "punch", "punch-run"] {
        for place in ["waits", "other"] {
            let out = Command::new(&exe)
                .args([how, place, "1024", "32", "1"])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{how} {place}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let (mapped, kept) = (r["still_mapped"].as_u64().unwrap(), r["kept"].as_u64().unwrap());
            if how.starts_with("punch") {
                assert_eq!((mapped, kept), (0, 0), "{how} {place}: a punch frees the pages: {r}");
            } else {
                // Reclaim skips a page it cannot isolate at once (a few in a hundred).
                assert!(mapped <= 1024 / 10, "{how} {place}: most pages unmapped: {r}");
                assert_eq!(kept, 1024, "{how} {place}: the pages keep what the program wrote: {r}");
            }
        }
    }
}

/// The first-touch floor's programs (scripts/bench/firsttouch.c, which pagerfloor.py times)
/// touch every page and find it written, natively and under splitos; its pager traps once a
/// window, and under splitos the pComponent filled the pages (its own counters): a floor whose
/// pager installed nothing, or whose splitos run never reached splitos, would be no floor.
#[test]
fn the_first_touch_floors_programs_touch_every_page_and_their_pagers_fill_them() {
    let dir = tempfile::tempdir().unwrap();
    let exe = bench_program(dir.path(), "firsttouch");
    let json = |out: &std::process::Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // 16 MiB: 4,096 pages, each written once and summed.
    for mode in ["anon", "shmem", "uffd"] {
        let r = json(&Command::new(&exe).args([mode, "16", "80"]).output().unwrap());
        assert_eq!(
            (r["pages"].as_u64(), r["sum"].as_u64()),
            (Some(4096), Some(4096)),
            "{mode}: {r}"
        );
        let traps = if mode == "uffd" { 4096_u64.div_ceil(80) } else { 0 };
        assert_eq!(r["faults"].as_u64(), Some(traps), "{mode}: {r}");
    }
    let stats = dir.path().join("stats.json");
    let (stats_arg, exe) = (stats.to_str().unwrap(), exe.to_str().unwrap());
    let out = run_cmd(
        &["--embedded", "--quiet", "--stats-json", stats_arg],
        &[exe, "anon", "16", "80"],
        dir.path(),
    )
    .output()
    .unwrap();
    let r = json(&out);
    assert_eq!(r["sum"].as_u64(), Some(4096), "{r}");
    let s: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    let filled = ["plocal_fills", "faulted_around", "preallocated"]
        .iter()
        .map(|k| s[k].as_u64().unwrap())
        .sum::<u64>();
    assert!(filled >= 4096, "the pComponent filled {filled} pages of 4,096: {s}");
}
