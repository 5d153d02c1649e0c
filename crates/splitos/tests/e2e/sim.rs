//! `splitos sim` as a user runs it: the real Alibaba trace shipped in data/traces, the real
//! binary, its JSON report checked for invariants, and bad input refused by name.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn traces() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/traces")
}

fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_splitos"))
        .arg("sim")
        .args(args)
        .output()
        .expect("run splitos sim")
}

/// Runs the simulator on the shipped openb trace with `extra` arguments; its JSON report.
fn report(extra: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("sim.json");
    let (nodes, tasks) = (
        traces().join("alibaba-openb-nodes.csv"),
        traces().join("alibaba-openb-pods.csv"),
    );
    let mut args = vec![
        "--nodes",
        nodes.to_str().unwrap(),
        "--tasks",
        tasks.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ];
    args.extend_from_slice(extra);
    let out = sim(&args);
    assert!(
        out.status.success(),
        "splitos sim {extra:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("fragmentation CPU") && stdout.contains("events"),
        "{stdout}"
    );
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// Every model's report holds together: nothing held beyond capacity, every release
/// matched an allocation and nothing is left held, every task accounted for, and the
/// fractions are fractions at every sampled time.
fn check_invariants(r: &Value, models: &[&str]) {
    let tasks = n(&r["trace"]["replayed_tasks"]);
    for m in models {
        let x = &r[*m];
        let a = &x["audit"];
        assert_eq!(
            (
                n(&a["over_capacity"]),
                n(&a["missing_allocations"]),
                n(&a["unmatched_releases"]),
                n(&a["units_left_holding"])
            ),
            (0, 0, 0, 0),
            "{m}: {a}"
        );
        assert_eq!(n(&a["placements"]), n(&x["placed"]), "{m}");
        assert_eq!(
            n(&a["releases"]),
            n(&x["placed"]),
            "{m}: every placed task was released once"
        );
        assert_eq!(
            n(&x["placed"]) + n(&x["unplaced"]) + n(&x["instant"]),
            tasks,
            "{m}: every task placed, unplaced or instant"
        );
        for k in [
            "fragmentation_cpu",
            "fragmentation_mem",
            "switched_off_compute",
            "switched_off_memory",
            "utilization_cpu",
            "utilization_mem",
        ] {
            let v = f(&x[k]);
            assert!((0.0..=1.0).contains(&v), "{m}.{k} = {v}");
            for p in x["series"][k].as_array().unwrap() {
                assert!((0.0..=1.0 + 1e-9).contains(&f(p)), "{m}.series.{k}: {p}");
            }
        }
        // What is free on powered units is at most what is free at all.
        let s = &x["series"];
        for i in 0..s["time"].as_array().unwrap().len() {
            assert!(
                f(&s["fragmentation_cpu"][i]) <= 1.0 - f(&s["utilization_cpu"][i]) + 1e-9,
                "{m} at sample {i}"
            );
            assert!(
                f(&s["fragmentation_mem"][i]) <= 1.0 - f(&s["utilization_mem"][i]) + 1e-9,
                "{m} at sample {i}"
            );
        }
        assert!(
            n(&x["peak_compute_on"]) <= n(&x["compute_units"]) && n(&x["peak_memory_on"]) <= n(&x["memory_units"]),
            "{m}"
        );
        assert!(f(&x["events_per_second"]) > 0.0);
        let rel = &x["reliability"];
        assert!(
            f(&rel["failures_per_year"]) > 0.0 && f(&rel["cluster_mttf_days"]) > 0.0,
            "{m}: {rel}"
        );
    }
}

#[test]
fn the_alibaba_trace_replays_with_its_invariants() {
    let r = report(&[]);
    let models = ["fixed", "disaggregated", "splitos"];
    check_invariants(&r, &models);
    // The report counts what the simulator does not model, against the file itself.
    let text = std::fs::read_to_string(traces().join("alibaba-openb-pods.csv")).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().skip(1).map(|l| l.split(',').collect()).collect();
    let t = &r["trace"];
    assert_eq!((n(&t["tasks"]), n(&t["nodes"])), (rows.len() as u64, 1523));
    assert_eq!(
        n(&t["stats"]["gpu_tasks"]),
        rows.iter().filter(|r| r[3].parse::<u64>().unwrap() > 0).count() as u64
    );
    assert_eq!(
        n(&t["stats"]["phases"]["Pending"]),
        rows.iter().filter(|r| r[7] == "Pending").count() as u64
    );
    // Same totals in every model.
    for m in models {
        assert_eq!(r[m]["cpu_milli"], r["fixed"]["cpu_milli"], "{m}");
        assert_eq!(r[m]["memory_mib"], r["fixed"]["memory_mib"], "{m}");
    }
    // The failure model: pComponents, mComponents and the fixed cluster's disks.
    let s = &r["splitos"]["reliability"];
    assert_eq!(
        (n(&s["pcomponents"]), n(&s["mcomponents"]), n(&s["scomponents"])),
        (
            n(&r["splitos"]["peak_compute_on"]),
            n(&r["splitos"]["peak_memory_on"]),
            n(&r["fixed"]["peak_compute_on"])
        )
    );
    let red = r["splitos"]["redundancy"].as_array().unwrap();
    let schemes: Vec<&str> = red.iter().map(|x| x["scheme"].as_str().unwrap()).collect();
    assert_eq!(schemes, ["none", "replica", "log", "ec:2", "ec:4", "ec:8"]);
    assert!(f(&red[1]["memory_needed_gib"]) > 1.9 * f(&red[0]["memory_needed_gib"]));
    assert!(f(&red[1]["expected_loss_gib_per_year"]) < f(&red[0]["expected_loss_gib_per_year"]));
    assert!((f(&r["paper"]["server_mttf_years"]) - 5.8).abs() < 0.01);
}

/// More load on the same cluster (twenty shifted copies of the task list), with each
/// policy: the disaggregated models let more memory modules be switched off than servers,
/// and the global managers' spreading policy leaves more fragments than packing.
#[test]
fn under_load_disaggregation_frees_memory_modules() {
    let packed = report(&["--load", "20", "--shift", "600"]);
    check_invariants(&packed, &["fixed", "disaggregated", "splitos"]);
    assert_eq!(n(&packed["trace"]["replayed_tasks"]), 20 * 8152);
    for m in ["disaggregated", "splitos"] {
        assert!(
            f(&packed[m]["switched_off_memory"]) > f(&packed["fixed"]["switched_off_memory"]),
            "{m}"
        );
        assert!(
            f(&packed[m]["fragmentation_mem"]) < f(&packed["fixed"]["fragmentation_mem"]),
            "{m}"
        );
    }
    let spread = report(&[
        "--load",
        "20",
        "--shift",
        "600",
        "--placement",
        "least-loaded",
        "--models",
        "splitos",
    ]);
    check_invariants(&spread, &["splitos"]);
    assert!(spread.get("fixed").is_none(), "only the models asked for");
    assert_eq!(spread["splitos"]["placement"], "least-loaded");
    assert!(f(&spread["splitos"]["fragmentation_mem"]) > f(&packed["splitos"]["fragmentation_mem"]));
    let first = report(&[
        "--load",
        "20",
        "--shift",
        "600",
        "--placement",
        "first-fit",
        "--models",
        "fixed",
        "--samples",
        "7",
    ]);
    check_invariants(&first, &["fixed"]);
    assert_eq!(first["fixed"]["series"]["time"].as_array().unwrap().len(), 7);
}

/// The scale-up copies the cluster and the task list; the ExCache share and the topology
/// are the splitos model's.
#[test]
fn scale_and_model_knobs() {
    // The fixed cluster is the failure model's baseline whether it is shown or not.
    let alone = report(&["--models", "splitos"]);
    let all = report(&[]);
    assert_eq!(alone["splitos"]["reliability"], all["splitos"]["reliability"]);
    let r = report(&[
        "--scale",
        "3",
        "--models",
        "splitos",
        "--excache-share",
        "0.5",
        "--topology",
        "racks:4",
    ]);
    check_invariants(&r, &["splitos"]);
    assert_eq!(
        (n(&r["trace"]["replayed_nodes"]), n(&r["trace"]["replayed_tasks"])),
        (3 * 1523, 3 * 8152)
    );
    assert_eq!(r["splitos"]["topology"], "racks:4");
    let quarter = report(&["--models", "splitos"]);
    // A task keeps its ExCache share on its pComponent besides all its memory on
    // mComponents: memory use is (1 + share) times the tasks'.
    let ratio = f(&r["splitos"]["utilization_mem"]) / f(&quarter["splitos"]["utilization_mem"]);
    assert!((ratio - 1.5 / 1.25).abs() < 0.02, "{ratio}");
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn fails_with(args: &[&str], needle: &str) {
    let out = sim(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(needle),
        "{args:?}: expected `{needle}` in: {err}"
    );
}

#[test]
fn bad_input_is_refused_by_row_and_field() {
    let d = tempfile::tempdir().unwrap();
    let nodes = write(
        d.path(),
        "nodes.csv",
        "sn,cpu_milli,memory_mib\nn0,4000,8192\nn1,4000,8192\n",
    );
    let head = "name,cpu_milli,memory_mib,creation_time,deletion_time\n";
    let bad = write(
        d.path(),
        "bad.csv",
        &format!("{head}a,1000,1024,0,10\nb,1000,lots,0,10\n"),
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &bad],
        "row 2, field `memory_mib` (mem): `lots` is not a number",
    );
    let short = write(d.path(), "short.csv", &format!("{head}a,1000,1024,0\n"));
    fails_with(&["--nodes", &nodes, "--tasks", &short], "row 1");
    fails_with(
        &["--nodes", &nodes, "--tasks", &bad, "--task-columns", "mem=memory_gib"],
        "no column `memory_gib` for field `mem`",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &bad, "--task-columns", "disk=x"],
        "unknown field `disk`",
    );
    let big = write(
        d.path(),
        "big.csv",
        &format!("{head}a,1000,1024,0,10\nhuge,8000,1024,0,10\n"),
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &big],
        "row 2 (huge), field `cpu_milli`: a task larger than any module of model `fixed`",
    );
    // 12 GiB fit no server, but fit two memory modules of the disaggregated model.
    let wide = write(d.path(), "wide.csv", &format!("{head}a,1000,12288,0,10\n"));
    fails_with(
        &["--nodes", &nodes, "--tasks", &wide],
        "row 1 (a), field `memory_mib`: a task larger than any module of model `fixed`",
    );
    let json = d.path().join("wide.json");
    let out = sim(&[
        "--nodes",
        &nodes,
        "--tasks",
        &wide,
        "--models",
        "disaggregated",
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(
        out.status.success(),
        "the fixed baseline, not asked for, does not stop the run: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(
        (
            n(&r["disaggregated"]["placed"]),
            n(&r["disaggregated"]["peak_memory_on"])
        ),
        (1, 2)
    );
    assert_eq!(
        (n(&r["fixed_baseline"]["oversized"]), n(&r["fixed_baseline"]["servers"])),
        (1, 0),
        "what the unshown baseline skipped is reported"
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &big, "--placement", "worst-fit"],
        "unknown placement \"worst-fit\"",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &big, "--placement", "nearest"],
        "orders units by hops on the global managers' topology graph",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &big, "--topology", "links:0"],
        "not a positive number",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &big, "--models", "fixed,cloud"],
        "unknown model `cloud`",
    );
    let devices = write(d.path(), "devices.toml", "[mttf_years]\ncpu = 1\n");
    fails_with(
        &["--nodes", &nodes, "--tasks", &big, "--devices", &devices],
        "missing field",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &write(d.path(), "nothing.csv", head)],
        "no tasks",
    );
    fails_with(
        &[
            "--nodes",
            &write(d.path(), "n.csv", "sn,cpu_milli,memory_mib\nn0,4000,\n"),
            "--tasks",
            &big,
        ],
        "row 1, field `memory_mib` (mem) is empty",
    );

    // Counted, not silently skipped, when asked.
    let json = d.path().join("out.json");
    let out = sim(&[
        "--nodes",
        &nodes,
        "--tasks",
        &big,
        "--skip-oversized",
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for m in ["fixed", "disaggregated", "splitos"] {
        assert_eq!(
            (n(&r[m]["oversized"]), n(&r[m]["unplaced"]), n(&r[m]["placed"])),
            (1, 1, 1),
            "{m}"
        );
    }
    let incomplete = write(
        d.path(),
        "incomplete.csv",
        &format!("{head}a,1000,1024,0,10\nb,1000,1024,,10\n"),
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &incomplete],
        "row 2 (b), field `creation_time` (start) is empty",
    );
    let out = sim(&[
        "--nodes",
        &nodes,
        "--tasks",
        &incomplete,
        "--skip-incomplete",
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(out.status.success());
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(
        (
            n(&r["trace"]["stats"]["skipped_incomplete"]),
            n(&r["trace"]["replayed_tasks"])
        ),
        (1, 1)
    );
}

/// Another trace through a column mapping: the DLRM serving trace asks for cores and GiB,
/// and has rows without times.
#[test]
fn another_trace_through_a_column_mapping() {
    let nodes = traces().join("alibaba-openb-nodes.csv");
    let tasks = traces().join("alibaba-dlrm-instances.csv");
    let d = tempfile::tempdir().unwrap();
    let json = d.path().join("dlrm.json");
    let map = "name=instance_sn,cpu=cpu_request*1000,mem=memory_request*1024,start=creation_time,end=deletion_time,phase=role,gpu=gpu_request";
    let out = sim(&[
        "--nodes",
        nodes.to_str().unwrap(),
        "--tasks",
        tasks.to_str().unwrap(),
        "--task-columns",
        map,
        "--skip-incomplete",
        "--skip-oversized",
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    check_invariants(&r, &["fixed", "disaggregated", "splitos"]);
    let s = &r["trace"]["stats"];
    assert_eq!(n(&s["rows"]), 23871);
    assert_eq!(n(&s["skipped_incomplete"]) + n(&r["trace"]["replayed_tasks"]), 23871);
    assert!(n(&s["phases"]["HN"]) > 0 && n(&s["phases"]["CN"]) > 0);
}

/// The knobs of the replay on a small hand-made trace whose answers are known.
#[test]
fn replay_knobs_do_what_they_say() {
    let d = tempfile::tempdir().unwrap();
    let nodes = write(d.path(), "nodes.csv", "sn,cpu_milli,memory_mib\nn0,4000,8192\n");
    // b arrives while a holds the only server, and gets it when a ends.
    let tasks = write(
        d.path(),
        "tasks.csv",
        "name,cpu_milli,memory_mib,creation_time,deletion_time\na,4000,1024,0,100\nb,4000,2048,50,200\n",
    );
    let run = |extra: &[&str]| -> Value {
        let json = d.path().join("k.json");
        let mut args = vec![
            "--nodes",
            &nodes,
            "--tasks",
            &tasks,
            "--json",
            json.to_str().unwrap(),
            "--quiet",
            "--models",
            "fixed,disaggregated",
        ];
        args.extend_from_slice(extra);
        let out = sim(&args);
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
    };
    let r = run(&[]);
    assert_eq!(
        (
            n(&r["fixed"]["placed"]),
            n(&r["fixed"]["waits"]["waited"]),
            f(&r["fixed"]["waits"]["max_seconds"])
        ),
        (2, 1, 50.0)
    );
    // The server is busy all the time: 0-100 with a, 100-200 with b.
    assert!((f(&r["fixed"]["utilization_cpu"]) - 1.0).abs() < 1e-9);
    // No retries: b never gets the server.
    let r = run(&["--retry-window", "0"]);
    assert_eq!((n(&r["fixed"]["placed"]), n(&r["fixed"]["unplaced"])), (1, 1));
    // The window: before 100 a runs (1 GiB), from 100 on b (2 GiB).
    let whole = f(&run(&[])["fixed"]["utilization_mem"]);
    assert!((whole - 1.5 / 8.0).abs() < 1e-9, "{whole}");
    let r = run(&["--window", "100:"]);
    assert!((f(&r["fixed"]["utilization_mem"]) - 2.0 / 8.0).abs() < 1e-9);
    assert_eq!(r["run"]["window"], serde_json::json!([100.0, 200.0]));
    let r = run(&["--window", ":100"]);
    assert!((f(&r["fixed"]["utilization_mem"]) - 1.0 / 8.0).abs() < 1e-9);
    fails_with(
        &["--nodes", &nodes, "--tasks", &tasks, "--window", "1000:"],
        "the replay runs from 0 s to 200 s",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &tasks, "--window", "nan:"],
        "not a number of seconds",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &tasks, "--models", "fixed,fixed"],
        "named twice",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &tasks, "--shift", "1e300", "--load", "3"],
        "the last copy of the task list would end",
    );
    // Copies shifted by --shift: the second copy's b ends 1,000 s later.
    let r = run(&["--load", "2", "--shift", "1000"]);
    assert_eq!((f(&r["trace"]["end"]), n(&r["trace"]["replayed_tasks"])), (1200.0, 4));
    assert_eq!(n(&r["fixed"]["placed"]), 4);
    // Memory modules of the disaggregated model, and the cluster copies of --scale.
    let r = run(&["--memory-modules", "4", "--scale", "2"]);
    assert_eq!(
        (
            n(&r["disaggregated"]["memory_units"]),
            n(&r["disaggregated"]["memory_unit_mib"]),
            n(&r["disaggregated"]["compute_units"])
        ),
        (8, 2048, 2)
    );
    // Device inputs: every device twice as reliable, every server twice as reliable.
    let devices = write(
        d.path(),
        "d.toml",
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tools/src/sim/devices.toml"))
            .unwrap()
            .replace("cpu = 204.3", "cpu = 408.6")
            .replace("memory = 289.9", "memory = 579.8")
            .replace("disk = 538.8", "disk = 1077.6")
            .replace("nic = 100.5", "nic = 201")
            .replace("power = 27.4", "power = 54.8")
            .replace("board = 8.64", "board = 17.28"),
    );
    let r = run(&["--devices", &devices]);
    assert!(
        (f(&r["paper"]["server_mttf_years"]) - 11.6).abs() < 0.02,
        "{}",
        r["paper"]
    );
    // vRegions larger than an mComponent cannot be placed.
    let two = write(
        d.path(),
        "two.csv",
        "sn,cpu_milli,memory_mib\nn0,4000,8192\nn1,4000,8192\n",
    );
    let big = write(
        d.path(),
        "big.csv",
        "name,cpu_milli,memory_mib,creation_time,deletion_time\na,1000,8192,0,100\n",
    );
    let json = d.path().join("v.json");
    let out = sim(&[
        "--nodes",
        &two,
        "--tasks",
        &big,
        "--models",
        "splitos",
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(
        (n(&r["splitos"]["placed"]), n(&r["splitos"]["peak_memory_on"])),
        (1, 2),
        "8 GiB in 1 GiB vRegions over two mComponents of 6 GiB"
    );
    fails_with(
        &[
            "--nodes",
            &two,
            "--tasks",
            &big,
            "--models",
            "splitos",
            "--vregion",
            "8G",
        ],
        "vRegions of 8192 MiB, larger than an mComponent (6144 MiB)",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &tasks, "--window", "5:1"],
        "not before its end",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &tasks, "--excache-share", "1"],
        "--excache-share must be between 0 and 1",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &tasks, "--topology", "racks:2"],
        "topology racks:2: more racks than compute units (1)",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &tasks, "--vregion", "1536K"],
        "--vregion must be a whole number of MiB",
    );
    fails_with(
        &[
            "--nodes",
            &nodes,
            "--tasks",
            &tasks,
            "--scale",
            "4",
            "--load",
            "9223372036854775807",
        ],
        "--scale x --load is too large",
    );
    fails_with(
        &["--nodes", &nodes, "--tasks", &tasks, "--scale", "20000000"],
        "make more than 16777215 units",
    );
}

/// The shipped pod list as the ATC '23 study's static pod lists come: without its time
/// columns. Returns its path.
fn static_pods(dir: &Path) -> String {
    let text = std::fs::read_to_string(traces().join("alibaba-openb-pods.csv")).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    let keep: Vec<usize> = (0..header.len()).filter(|&i| !header[i].ends_with("_time")).collect();
    assert_eq!(
        keep.len(),
        header.len() - 3,
        "creation, deletion and scheduled times dropped"
    );
    let rows: Vec<String> = text
        .lines()
        .map(|l| {
            keep.iter()
                .map(|&i| l.split(',').nth(i).unwrap())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    write(dir, "openb-static.csv", &(rows.join("\n") + "\n"))
}

/// Runs the simulator on the shipped nodes and `tasks`; its JSON report and its text.
fn run_on(tasks: &str, extra: &[&str]) -> (Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("sim.json");
    let nodes = traces().join("alibaba-openb-nodes.csv");
    let mut args = vec![
        "--nodes",
        nodes.to_str().unwrap(),
        "--tasks",
        tasks,
        "--json",
        json.to_str().unwrap(),
        "--quiet",
    ];
    args.extend_from_slice(extra);
    let out = sim(&args);
    assert!(
        out.status.success(),
        "splitos sim {extra:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn column(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(f).collect()
}

/// A static fill holds together: the curve only grows, its fractions are fractions, and its
/// counts are the report's.
fn check_fill(r: &Value, models: &[&str]) {
    let tasks = n(&r["trace"]["replayed_tasks"]);
    for m in models {
        let x = &r[*m];
        let fill = &x["fill"];
        let c = &fill["curve"];
        let len = c["arrived"].as_array().unwrap().len();
        for (k, v) in c.as_object().unwrap() {
            assert_eq!(v.as_array().unwrap().len(), len, "{m}: curve.{k}");
        }
        for k in [
            "arrived",
            "arrived_cpu",
            "arrived_mem",
            "tasks",
            "placed",
            "utilization_cpu",
            "utilization_mem",
        ] {
            let v = column(&c[k]);
            assert!(v.windows(2).all(|p| p[0] <= p[1] + 1e-12), "{m}: curve.{k} goes down");
        }
        let arrived = column(&c["arrived"]);
        assert_eq!(arrived[0], 0.0, "{m}: the curve starts empty");
        assert!(
            arrived.windows(2).all(|p| p[1] - p[0] < 0.02),
            "{m}: a point per percent"
        );
        for k in [
            "fragmentation_rate_cpu",
            "fragmentation_rate_mem",
            "utilization_cpu",
            "utilization_mem",
        ] {
            assert!(column(&c[k]).iter().all(|v| (0.0..=1.0).contains(v)), "{m}: curve.{k}");
        }
        let last = |k: &str| n(c[k].as_array().unwrap().last().unwrap());
        assert_eq!(
            (last("placed"), last("tasks")),
            (n(&x["placed"]), n(&fill["tried"])),
            "{m}"
        );
        assert_eq!(n(&x["audit"]["placements"]), n(&x["placed"]), "{m}");
        assert_eq!(
            n(&fill["failed"]) + n(&x["placed"]) + n(&x["oversized"]),
            n(&fill["tried"]),
            "{m}: every task that came was placed or failed"
        );
        assert_eq!(n(&x["unplaced"]), tasks - n(&x["placed"]), "{m}");
        assert!(
            n(&fill["tried"]) == tasks || fill["full"] == true,
            "{m}: the fill stops at the end of the list or full"
        );
    }
}

/// The ATC '23 experiment on the shipped pod list without its times: two copies of it fill
/// the cluster, and fragmentation is followed as it fills. Pooling memory leaves less of
/// what is free unusable, as ThymesisFlow and LegoOS argue.
#[test]
fn a_static_pod_list_fills_the_cluster() {
    let d = tempfile::tempdir().unwrap();
    let pods = static_pods(d.path());
    let models = ["fixed", "disaggregated", "splitos"];
    let (r, text) = run_on(&pods, &["--load", "2"]);
    let t = &r["trace"];
    assert_eq!(
        (
            t["timed"].as_bool(),
            n(&t["replayed_tasks"]),
            n(&t["stats"]["skipped_incomplete"])
        ),
        (Some(false), 2 * 8152, 0)
    );
    check_invariants(&r, &models);
    check_fill(&r, &models);
    let names: Vec<String> = std::fs::read_to_string(&pods)
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').next().unwrap().to_string())
        .collect();
    for m in models {
        let fill = &r[m]["fill"];
        // The list offers 136% of the cluster's CPU: it stops fitting in the second copy,
        // with the cluster almost full.
        let first = &fill["first_failed"];
        let task = n(&first["task"]) as usize;
        assert!((8152..2 * 8152).contains(&task), "{m}: {first}");
        assert_eq!(
            (n(&first["row"]) as usize, first["name"].as_str().unwrap()),
            (task % 8152 + 1, names[task % 8152].as_str()),
            "{m}"
        );
        assert!((0.9..1.0).contains(&f(&first["arrived"])), "{m}: {first}");
        assert!(f(&r[m]["utilization_cpu"]) > 0.95, "{m}");
        // The text says what the JSON says.
        let placed = format!("{m}: {} tasks came (", n(&fill["tried"]));
        let line = text
            .lines()
            .find(|l| l.starts_with(&placed))
            .unwrap_or_else(|| panic!("no `{placed}` in:\n{text}"));
        assert!(
            line.contains(&format!(
                " {} placed, {} failed",
                n(&r[m]["placed"]),
                n(&fill["failed"])
            )),
            "{line}"
        );
    }
    assert!(
        text.contains("As the cluster fills") && text.contains("fixed fragmented"),
        "{text}"
    );
    assert!(n(&r["disaggregated"]["placed"]) >= n(&r["fixed"]["placed"]));
    // Until the cluster is nearly full (then every model's few free resources are useless
    // to most tasks), at every point: memory modules leave less of the free memory
    // fragmented than servers, and pComponents, with a quarter of a task's memory on them,
    // in between; the compute modules' CPU is never more fragmented than the servers'.
    let curve = |m: &str, k: &str| column(&r[m]["fill"]["curve"][k]);
    let arrived = curve("fixed", "arrived");
    for m in ["disaggregated", "splitos"] {
        assert_eq!(curve(m, "arrived"), arrived, "the same tasks come to every model");
    }
    let (fixed, disaggregated, splitos) = (
        curve("fixed", "fragmentation_rate_mem"),
        curve("disaggregated", "fragmentation_rate_mem"),
        curve("splitos", "fragmentation_rate_mem"),
    );
    let (fixed_cpu, disaggregated_cpu) = (
        curve("fixed", "fragmentation_rate_cpu"),
        curve("disaggregated", "fragmentation_rate_cpu"),
    );
    let filling: Vec<usize> = (0..arrived.len())
        .filter(|&i| (0.1..=0.9).contains(&arrived[i]))
        .collect();
    assert!(filling.len() >= 75, "{}", filling.len());
    for &i in &filling {
        assert!(
            disaggregated[i] < splitos[i] && splitos[i] < fixed[i],
            "memory at {}: {} {} {}",
            arrived[i],
            fixed[i],
            disaggregated[i],
            splitos[i]
        );
        assert!(disaggregated_cpu[i] <= fixed_cpu[i] + 1e-9, "CPU at {}", arrived[i]);
    }
    assert!(
        fixed[*filling.last().unwrap()] > 5.0 * fixed[filling[0]],
        "servers strand more memory as they fill"
    );
    assert!(
        disaggregated[*filling.last().unwrap()] < 0.01,
        "memory modules strand almost none"
    );

    // Dropping the times by the column mapping makes the same static list of the file.
    let timed = traces().join("alibaba-openb-pods.csv");
    let (by_mapping, _) = run_on(timed.to_str().unwrap(), &["--task-columns", "start=,end="]);
    let (by_file, _) = run_on(&pods, &[]);
    for m in models {
        assert_eq!(by_mapping[m]["fill"], by_file[m]["fill"], "{m}");
        assert_eq!(by_file[m]["fill"]["full"], false, "{m}: one copy fits");
    }
    // A timed trace's report has no fill.
    let (timed_report, _) = run_on(timed.to_str().unwrap(), &["--models", "fixed"]);
    assert!(timed_report["fixed"].get("fill").is_none() && timed_report["trace"]["timed"] == true);

    // Policies, topology and scale-up work on a static list as on a trace.
    let (r, _) = run_on(
        &pods,
        &[
            "--load",
            "2",
            "--placement",
            "least-loaded",
            "--topology",
            "links:4,racks:4",
            "--models",
            "splitos",
        ],
    );
    check_invariants(&r, &["splitos"]);
    check_fill(&r, &["splitos"]);
    let (r, _) = run_on(
        &pods,
        &[
            "--scale",
            "2",
            "--load",
            "2",
            "--placement",
            "first-fit",
            "--models",
            "fixed,disaggregated",
            "--memory-modules",
            "500",
        ],
    );
    check_invariants(&r, &["fixed", "disaggregated"]);
    check_fill(&r, &["fixed", "disaggregated"]);
    assert_eq!(n(&r["disaggregated"]["memory_units"]), 1000);
}

/// A list is timed or static: one that mixes rows with times and rows without is refused,
/// naming the first row without, unless --skip-incomplete skips such rows.
#[test]
fn a_task_list_mixing_timed_and_untimed_rows_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let nodes = traces().join("alibaba-openb-nodes.csv");
    let nodes = nodes.to_str().unwrap();
    let text = std::fs::read_to_string(traces().join("alibaba-openb-pods.csv")).unwrap();
    // Row 100 (the 101st line) loses its creation and deletion times.
    let lines: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let mut cells: Vec<&str> = l.split(',').collect();
            if i == 100 {
                cells[8] = "";
                cells[9] = "";
            }
            cells.join(",")
        })
        .collect();
    let mixed = write(d.path(), "mixed.csv", &(lines.join("\n") + "\n"));
    fails_with(&["--nodes", nodes, "--tasks", &mixed], "mixed.csv: the list mixes timed and untimed rows: row 100 (openb-pod-0099) has no time (`creation_time` and `deletion_time` empty) but row 1 (openb-pod-0000) has");
    let (r, _) = run_on(&mixed, &["--skip-incomplete", "--models", "fixed"]);
    assert_eq!(
        (
            r["trace"]["timed"].as_bool(),
            n(&r["trace"]["stats"]["skipped_incomplete"]),
            n(&r["trace"]["replayed_tasks"])
        ),
        (Some(true), 1, 8151)
    );
    check_invariants(&r, &["fixed"]);

    // Static lists have no times to average over, and a list has both times or neither.
    let pods = static_pods(d.path());
    fails_with(
        &["--nodes", nodes, "--tasks", &pods, "--window", "0:100"],
        "is a static task list (no row has a start or end time)",
    );
    let half = write(
        d.path(),
        "half.csv",
        "name,cpu_milli,memory_mib,creation_time\na,1000,1024,0\n",
    );
    fails_with(
        &["--nodes", nodes, "--tasks", &half],
        "no column `deletion_time` for field `end`",
    );
}
