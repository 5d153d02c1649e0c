//! `splitos sim`: replays a cluster trace against a fixed datacenter of servers, a
//! disaggregated one of compute and memory modules, and splitos's own (pComponents with an
//! ExCache share plus mComponents), with the same total resources and one placement policy,
//! and reports fragmentation, modules that could be switched off, tasks that could not be
//! placed, utilization and the failure model of LegoOS section 6.3 (docs/simulation.md).
//! A task list without times is static: it fills the cluster in file order, and the report
//! follows fragmentation as the cluster fills.
//!
//! Each model replays on its own thread; a replay (`replay.rs`) is a sorted stream of
//! allocation and release events, a fill the tasks in order, and a placement a search of an
//! index of units (`pool.rs`).

pub mod failure;
pub mod model;
pub mod placement;
pub mod pool;
pub mod replay;
pub mod trace;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;

use model::{Kind, Model, Need, Spec, SpecError, Topology};
use replay::{fill, replay, Fill, ModelReport, Workload};
use splitos_core::config::{PlacementPolicy, Size};
use trace::{Columns, Node, TaskList, TaskStats};

#[derive(clap::Args, Debug, Clone)]
pub struct SimArgs {
    /// Node list (CSV): one row per server.
    #[arg(long)]
    pub nodes: PathBuf,
    /// Task list (CSV): one row per task, with its requests and its start and end times. A list without times is static: its tasks come in file order and stay until the cluster is full, and the report follows fragmentation as the cluster fills.
    #[arg(long)]
    pub tasks: PathBuf,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Columns of the node list, FIELD=COLUMN[*FACTOR],... (fields: cpu in milli-cores, mem in MiB) [default: cpu=cpu_milli,mem=memory_mib].
    #[arg(long, default_value = "", hide_default_value = true)]
    pub node_columns: String,
    /// Columns of the task list, FIELD=COLUMN[*FACTOR],... (fields: name, cpu in milli-cores, mem in MiB, start and end in seconds (both or neither: without them the list is static), phase, gpu; an empty COLUMN drops an optional field) [default: name=name,cpu=cpu_milli,mem=memory_mib,start=creation_time,end=deletion_time,phase=pod_phase,gpu=num_gpu].
    #[arg(long, default_value = "", hide_default_value = true)]
    pub task_columns: String,
    /// Placement policy of every model, named as `[cluster] placement` names the global managers' (least-loaded, best-fit, first-fit).
    #[arg(long, default_value = "best-fit")]
    pub placement: PlacementPolicy,
    #[arg(long, default_value = "fixed,disaggregated,splitos", help = format!("Models to replay, side by side: {}", model::MODELS.join(", ")))]
    pub models: String,
    /// What memory a compute unit can use: links:N (memory modules per unit and units per module at once, ThymesisFlow's 16 transceivers), racks:N (units spread over N racks; memory stays in its rack), both, or none.
    #[arg(long, default_value = "links:16")]
    pub topology: Topology,
    /// splitos: the part of each server's memory its pComponent keeps as ExCache, and of each task's memory it caches there.
    #[arg(long, default_value_t = 0.25)]
    pub excache_share: f64,
    /// splitos: the unit the global memory manager places memory in.
    #[arg(long, default_value = "1G")]
    pub vregion: Size,
    /// Memory modules of the disaggregated models, per copy of the cluster (0: as many as nodes).
    #[arg(long, default_value_t = 0)]
    pub memory_modules: usize,
    /// Scale-up: this many copies of the cluster, with this many copies of the task list, each shifted by --shift.
    #[arg(long, default_value_t = 1)]
    pub scale: usize,
    /// More load: this many copies of the task list per copy of the cluster, each shifted by --shift (a static list's copies come one after another).
    #[arg(long, default_value_t = 1)]
    pub load: usize,
    /// Seconds between the start times of consecutive copies of a timed task list.
    #[arg(long, default_value_t = 3600.0)]
    pub shift: f64,
    /// Average over this part of the replay only: START:END in the trace's seconds (after any shift), either may be left out; a static list has no times [default: the whole replay].
    #[arg(long, default_value = ":", hide_default_value = true, value_parser = parse_window)]
    pub window: (f64, f64),
    /// Waiting tasks a release tries to place, oldest first (a static list's tasks do not wait: a task without room fails).
    #[arg(long, default_value_t = 1000)]
    pub retry_window: usize,
    /// Skip and count the rows of a timed task list that lack a start or end time, instead of stopping (a list in which no row has a time is static, not incomplete).
    #[arg(long)]
    pub skip_incomplete: bool,
    /// Count tasks larger than any module of a model as unplaced instead of stopping.
    #[arg(long)]
    pub skip_oversized: bool,
    /// Device failure inputs (TOML); the default is LegoOS table 1's (docs/simulation.md).
    #[arg(long)]
    pub devices: Option<PathBuf>,
    /// Points of the time series in the JSON (a static list's fill has a point per percent of the cluster's capacity requested instead).
    #[arg(long, default_value_t = 400)]
    pub samples: usize,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// The most units a scaled-up cluster may have.
const MAX_UNITS: usize = (1 << 24) - 1;

fn parse_window(s: &str) -> Result<(f64, f64), SpecError> {
    let (a, b) = s.split_once(':').ok_or(SpecError::NotAWindow)?;
    let num = |x: &str, default: f64| {
        if x.trim().is_empty() {
            Ok(default)
        } else {
            x.trim()
                .parse::<f64>()
                .ok()
                .filter(|v| !v.is_nan())
                .ok_or_else(|| SpecError::NotSeconds(x.to_string()))
        }
    };
    let (a, b) = (num(a, f64::NEG_INFINITY)?, num(b, f64::INFINITY)?);
    if a >= b {
        return Err(SpecError::EmptyWindow { start: a, end: b });
    }
    Ok((a, b))
}

#[derive(Serialize)]
struct TraceReport {
    nodes_file: String,
    tasks_file: String,
    /// Nodes and tasks of the files, before any scale-up.
    nodes: usize,
    tasks: usize,
    stats: TaskStats,
    /// False for a static list: its tasks come in file order and never end, and `start` and
    /// `end` are 0.
    timed: bool,
    scale: usize,
    load: usize,
    shift_seconds: f64,
    /// Nodes and tasks replayed.
    replayed_nodes: usize,
    replayed_tasks: usize,
    start: f64,
    end: f64,
}

#[derive(Serialize)]
struct RunReport {
    placement: String,
    topology: String,
    excache_share: f64,
    vregion_mib: u64,
    events: usize,
    seconds: f64,
    events_per_second: f64,
    threads: usize,
    /// The part of the replay the averages are over (seconds).
    window: (f64, f64),
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let shown: Vec<Kind> = args
        .models
        .split(',')
        .map(|s| Kind::parse(s.trim()).map_err(anyhow::Error::new))
        .collect::<anyhow::Result<_>>()?;
    if let Some(k) = shown.iter().find(|k| shown.iter().filter(|x| x == k).count() > 1) {
        bail!("--models: `{}` is named twice", k.name());
    }
    // The fixed cluster is every failure comparison's baseline: it is replayed even when not shown.
    let mut kinds = shown.clone();
    if !kinds.contains(&Kind::Fixed) {
        kinds.insert(0, Kind::Fixed);
    }
    placement::rule(args.placement).map_err(anyhow::Error::new)?;
    if !(args.excache_share > 0.0 && args.excache_share < 1.0) {
        bail!(
            "--excache-share must be between 0 and 1 (exclusive), not {}",
            args.excache_share
        );
    }
    let vregion_mib = args.vregion.0 >> 20;
    if vregion_mib == 0 || !args.vregion.0.is_multiple_of(1 << 20) {
        bail!("--vregion must be a whole number of MiB, not {} bytes", args.vregion.0);
    }
    if args.scale == 0 || args.load == 0 || !(args.shift.is_finite() && args.shift >= 0.0) {
        bail!("--scale and --load must be at least 1, --shift a number of seconds of at least 0");
    }
    let copies = args
        .scale
        .checked_mul(args.load)
        .context("--scale x --load is too large")?;
    let memory_modules = args
        .memory_modules
        .checked_mul(args.scale)
        .filter(|m| *m <= MAX_UNITS)
        .context("--memory-modules x --scale is too large")?;
    let devices = failure::Devices::load(args.devices.as_deref())?;
    let node_cols = Columns::parse(&trace::NODE_FIELDS, &args.node_columns).context("--node-columns")?;
    let task_cols = Columns::parse(&trace::TASK_FIELDS, &args.task_columns).context("--task-columns")?;
    let base_nodes = trace::read_nodes(&args.nodes, &node_cols)?;
    let TaskList { tasks, stats, timed } = trace::read_tasks(&args.tasks, &task_cols, args.skip_incomplete)?;
    if base_nodes.len().checked_mul(args.scale).is_none_or(|n| n > MAX_UNITS) {
        bail!(
            "--scale {}: {} nodes per copy make more than {MAX_UNITS} units",
            args.scale,
            base_nodes.len()
        );
    }
    let base_tasks = tasks.len();
    let window = args.window;
    let w = if timed {
        Workload::new(tasks, copies, args.shift)?
    } else {
        if window != (f64::NEG_INFINITY, f64::INFINITY) {
            bail!("--window: {} is a static task list (no row has a start or end time), which has no times to average over", args.tasks.display());
        }
        Workload::in_order(tasks, copies)?
    };
    let nodes: Vec<Node> = (0..args.scale).flat_map(|_| base_nodes.iter().copied()).collect();
    let (start, end) = w.span();
    if timed && (window.1 <= start || window.0 >= end) {
        bail!(
            "--window {}:{}: the replay runs from {start} s to {end} s",
            window.0,
            window.1
        );
    }

    let specs: Vec<Spec> = kinds
        .iter()
        .map(|&kind| Spec {
            kind,
            topology: if kind == Kind::Fixed {
                Topology::default()
            } else {
                args.topology
            },
            excache_share: args.excache_share,
            vregion_mib,
            memory_modules,
        })
        .collect();
    let models: Vec<Model> = specs
        .into_iter()
        .map(|s| Model::new(s, &nodes, w.len(), args.placement).map_err(anyhow::Error::new))
        .collect::<anyhow::Result<_>>()?;
    // A task no module of a model can ever hold stops the run, naming it, unless the user
    // asked to count such tasks. The baseline replayed without being asked for counts them.
    let mut needs: Vec<Vec<Option<Need>>> = Vec::new();
    for m in &models {
        let mut v = Vec::with_capacity(base_tasks);
        for t in &w.tasks {
            let need = m.need(t.cpu, t.mem);
            match m.oversized(&need) {
                None => v.push(Some(need)),
                Some((field, why)) if !args.skip_oversized && shown.contains(&m.spec.kind) => {
                    bail!(
                        "{}: row {} ({}), field `{}`: a task larger than any module of model `{}`: it {why}; --skip-oversized counts such tasks as unplaced",
                        args.tasks.display(),
                        t.row,
                        t.name,
                        task_cols.column(field).unwrap_or(field),
                        m.name()
                    )
                }
                Some(_) => v.push(None),
            }
        }
        needs.push(v);
    }

    let total_events = (if timed { w.events.len() } else { w.len() } * models.len()) as u64;
    let progress = if args.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(total_events)
    };
    let what = if timed { "events" } else { "tasks" };
    progress.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{spinner}} [{{elapsed_precise}}] {{wide_bar}} {{human_pos}}/{{human_len}} {what} ({{eta}} left)"
        ))
        .expect("a valid template"),
    );
    let replay_started = Instant::now();
    let mut reports: Vec<(Kind, ModelReport)> = std::thread::scope(|s| {
        let handles: Vec<_> = models
            .into_iter()
            .zip(&needs)
            .map(|(m, needs)| {
                let (w, progress) = (&w, progress.clone());
                let kind = m.spec.kind;
                s.spawn(move || {
                    (
                        kind,
                        if timed {
                            replay(m, w, needs, args.retry_window, args.samples, window, &progress)
                        } else {
                            fill(m, w, needs, &progress)
                        },
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a replay thread panicked"))
            .collect()
    });
    progress.finish_and_clear();
    let replay_seconds = replay_started.elapsed().as_secs_f64();

    let rates = devices.rates();
    let servers = reports
        .iter()
        .find(|(k, _)| *k == Kind::Fixed)
        .expect("the fixed model is always replayed")
        .1
        .peak_compute_on;
    for (kind, r) in &mut reports {
        r.placement = args.placement.to_string();
        r.reliability = Some(match kind {
            Kind::Fixed => failure::reliability(&rates, r.peak_compute_on, None),
            _ => failure::reliability(&rates, servers, Some((r.peak_compute_on, r.peak_memory_on))),
        });
        if *kind == Kind::Splitos {
            let others = r.peak_compute_on as f64 * rates.pcomponent + servers as f64 * rates.scomponent;
            r.redundancy = Some(failure::redundancy(
                &devices,
                &rates,
                r.average_remote_mib,
                r.peak_remote_mib,
                r.memory_unit_mib as f64,
                others,
            ));
        }
    }
    let events: usize = reports.iter().map(|(_, r)| r.events).sum();
    let threads = reports
        .len()
        .min(std::thread::available_parallelism().map_or(1, |n| n.get()));
    // The baseline nobody asked for is summarized, so that what it counted is not lost.
    let baseline = (!shown.contains(&Kind::Fixed)).then(|| serde_json::json!({"servers": servers, "oversized": reports[0].1.oversized, "unplaced": reports[0].1.unplaced}));
    reports.retain(|(k, _)| shown.contains(k));
    let mut out = serde_json::json!({
        "trace": TraceReport {
            nodes_file: args.nodes.display().to_string(),
            tasks_file: args.tasks.display().to_string(),
            nodes: base_nodes.len(),
            tasks: base_tasks,
            stats,
            timed,
            scale: args.scale,
            load: args.load,
            shift_seconds: args.shift,
            replayed_nodes: nodes.len(),
            replayed_tasks: w.len(),
            start,
            end,
        },
        "run": RunReport {
            placement: args.placement.to_string(),
            topology: args.topology.to_string(),
            excache_share: args.excache_share,
            vregion_mib,
            events,
            seconds: replay_seconds,
            events_per_second: events as f64 / replay_seconds.max(1e-9),
            threads,
            window: (window.0.max(start), window.1.min(end)),
        },
        "paper": failure::paper_cases(&rates),
    });
    for (kind, r) in &reports {
        out[kind.name()] = serde_json::to_value(r)?;
    }
    if let Some(b) = baseline {
        splitos_core::outln!("the fixed baseline of the failure model needed {} servers and left {} tasks unplaced ({} too large for any server)", b["servers"], b["unplaced"], b["oversized"]);
        out["fixed_baseline"] = b;
    }
    print_report(&reports, &out, started.elapsed().as_secs_f64());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&out)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
        splitos_core::outln!("report: {}", path.display());
    }
    Ok(())
}

/// A redundancy scheme's figure for the splitos model, "-" for the others.
fn scheme(r: &ModelReport, name: &str, f: impl Fn(&failure::Redundancy) -> String) -> String {
    r.redundancy
        .iter()
        .flatten()
        .find(|x| x.scheme == name)
        .map_or("-".into(), f)
}

/// The report as a table: one column per model.
fn print_report(reports: &[(Kind, ModelReport)], out: &serde_json::Value, seconds: f64) {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    let mut header = vec!["".to_string()];
    header.extend(reports.iter().map(|(k, _)| k.name().to_string()));
    table.set_header(header);
    let pct = |v: f64| format!("{:.2}%", v * 100.0);
    type Row = (&'static str, fn(&ModelReport, &dyn Fn(f64) -> String) -> String);
    let rows: [Row; 16] = [
        ("units (compute / memory)", |r, _| {
            format!("{} / {}", r.compute_units, r.memory_units)
        }),
        ("fragmentation CPU", |r, p| p(r.average.fragmentation_cpu)),
        ("fragmentation memory", |r, p| p(r.average.fragmentation_mem)),
        ("switched off compute", |r, p| p(r.average.switched_off_compute)),
        ("switched off memory", |r, p| p(r.average.switched_off_memory)),
        ("utilization CPU", |r, p| p(r.average.utilization_cpu)),
        ("utilization memory", |r, p| p(r.average.utilization_mem)),
        ("placed", |r, _| r.placed.to_string()),
        ("unplaced (oversized)", |r, _| {
            format!("{} ({})", r.unplaced, r.oversized)
        }),
        ("waited, p50 / max wait", |r, _| {
            format!(
                "{}, {:.0} s / {:.0} s",
                r.waits.waited, r.waits.p50_seconds, r.waits.max_seconds
            )
        }),
        ("peak units on (compute / memory)", |r, _| {
            format!("{} / {}", r.peak_compute_on, r.peak_memory_on)
        }),
        ("cluster MTTF (days)", |r, _| {
            r.reliability
                .as_ref()
                .and_then(|f| f.cluster_mttf_days)
                .map_or("-".into(), |d| format!("{d:.1}"))
        }),
        ("MTTF vs fixed", |r, _| {
            r.reliability
                .as_ref()
                .and_then(|f| f.mttf_vs_fixed)
                .map_or("-".into(), |x| format!("{x:.2}x"))
        }),
        ("memory with replica / ec:4", |r, _| {
            format!(
                "{} / {} GiB",
                scheme(r, "replica", |x| format!("{:.0}", x.memory_needed_gib)),
                scheme(r, "ec:4", |x| format!("{:.0}", x.memory_needed_gib))
            )
        }),
        ("loss/yr none / replica", |r, _| {
            format!(
                "{} / {} GiB",
                scheme(r, "none", |x| format!("{:.3}", x.expected_loss_gib_per_year)),
                scheme(r, "replica", |x| format!("{:.2e}", x.expected_loss_gib_per_year))
            )
        }),
        ("events per second", |r, _| format!("{:.0}", r.events_per_second)),
    ];
    for (name, f) in rows {
        let mut row = vec![name.to_string()];
        row.extend(reports.iter().map(|(_, r)| f(r, &pct)));
        table.add_row(row);
    }
    let t = &out["trace"];
    let copies = t["replayed_tasks"].as_u64().unwrap_or(0) / t["tasks"].as_u64().unwrap_or(1).max(1);
    if t["timed"].as_bool().unwrap_or(true) {
        splitos_core::outln!(
            "{} nodes x {} = {}, {} tasks x {} = {} ({} rows; {} skipped as incomplete), placement {}, {} events in {:.2} s ({:.0} events/s)",
            t["nodes"],
            t["scale"],
            t["replayed_nodes"],
            t["tasks"],
            copies,
            t["replayed_tasks"],
            t["stats"]["rows"],
            t["stats"]["skipped_incomplete"],
            out["run"]["placement"].as_str().unwrap_or(""),
            out["run"]["events"],
            seconds,
            out["run"]["events_per_second"].as_f64().unwrap_or(0.0)
        );
    } else {
        splitos_core::outln!(
            "{} nodes x {} = {}, a static list of {} tasks x {} = {} ({} rows) in file order, placement {}, in {:.2} s; the table is the cluster where the fill stopped",
            t["nodes"],
            t["scale"],
            t["replayed_nodes"],
            t["tasks"],
            copies,
            t["replayed_tasks"],
            t["stats"]["rows"],
            out["run"]["placement"].as_str().unwrap_or(""),
            seconds,
        );
    }
    splitos_core::outln!("{table}");
    print_fill(reports);
}

/// A static list's fill: the curve every tenth of the cluster's capacity requested (the JSON
/// has every hundredth), then where each model stopped and why.
fn print_fill(reports: &[(Kind, ModelReport)]) {
    let fills: Vec<(&str, &Fill)> = reports
        .iter()
        .filter_map(|(k, r)| r.fill.as_ref().map(|f| (k.name(), f)))
        .collect();
    if fills.is_empty() {
        return;
    }
    splitos_core::outln!("As the cluster fills: allocated, and fragmented (the share of the free CPU / memory that the list's tasks cannot use), by requests come as a share of the cluster:");
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    let mut header = vec!["requested".to_string()];
    for (name, _) in &fills {
        header.push(format!("{name} allocated"));
        header.push(format!("{name} fragmented"));
    }
    table.set_header(header);
    let pair = |a: f64, b: f64| format!("{:.1}% / {:.1}%", a * 100.0, b * 100.0);
    let cells = |f: &Fill, i: Option<usize>| match i {
        Some(i) => {
            let c = &f.curve;
            [
                pair(c.utilization_cpu[i], c.utilization_mem[i]),
                pair(c.fragmentation_rate_cpu[i], c.fragmentation_rate_mem[i]),
            ]
        }
        None => ["-".to_string(), "-".to_string()],
    };
    let percent = |f: &Fill, i: usize| (f.curve.arrived[i] * 100.0).floor() as u64;
    let top = fills
        .iter()
        .map(|(_, f)| percent(f, f.curve.arrived.len() - 1))
        .max()
        .unwrap_or(0);
    for step in (10..=top).step_by(10) {
        let mut row = vec![format!("{step}%")];
        for (_, f) in &fills {
            row.extend(cells(f, (0..f.curve.arrived.len()).find(|&i| percent(f, i) >= step)));
        }
        table.add_row(row);
    }
    let mut row = vec!["stopped".to_string()];
    for (_, f) in &fills {
        row.extend(cells(f, Some(f.curve.arrived.len() - 1)));
    }
    table.add_row(row);
    splitos_core::outln!("{table}");
    for (name, f) in &fills {
        let c = &f.curve;
        let first = f.first_failed.as_ref().map_or("none failed".to_string(), |x| {
            format!(
                "the first to fail was row {} ({}), at {:.1}% requested",
                x.row,
                x.name,
                x.arrived * 100.0
            )
        });
        splitos_core::outln!(
            "{name}: {} tasks came ({:.1}% requested), {} placed, {} failed; {first}; {}",
            f.tried,
            c.arrived.last().copied().unwrap_or(0.0) * 100.0,
            c.placed.last().copied().unwrap_or(0),
            f.failed,
            if f.full {
                "stopped full: not even the smallest tasks fit"
            } else {
                "stopped at the end of the list"
            }
        );
    }
}

#[cfg(test)]
mod tests;
