//! Cluster traces: a node list and a task list in CSV, read through a column mapping so that
//! any trace with CPU and memory per row can be replayed. A task list is either timed (every
//! task has a start and an end) or static (no task has either: the pod lists of fragmentation
//! studies, which fill a cluster in file order). The defaults are the columns of Alibaba's
//! `openb` files (cluster-trace-gpu-v2023).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{anyhow, bail, Context};

/// A machine of the trace: CPU in milli-cores, memory in MiB.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Node {
    pub cpu: u64,
    pub mem: u64,
}

/// A task: what it asks for while it lives, from `start` to `end` (seconds). A task of a
/// static list is there from 0 and never ends; its place in the list is its arrival order.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    pub name: String,
    /// Its data row in the file (1 = the first after the header).
    pub row: usize,
    pub cpu: u64,
    pub mem: u64,
    pub start: f64,
    pub end: f64,
}

/// What a trace held besides its tasks: nothing is dropped without being counted here.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TaskStats {
    pub rows: usize,
    /// Tasks by the trace's own phase column, when it has one.
    pub phases: BTreeMap<String, usize>,
    /// Tasks asking for GPUs, which the models do not have: they are replayed for their CPU
    /// and memory.
    pub gpu_tasks: usize,
    /// Rows without a start or end time, skipped because `--skip-incomplete` said so.
    pub skipped_incomplete: usize,
}

/// A task list as read: its tasks, what was counted, and whether it has times.
#[derive(Debug)]
pub struct TaskList {
    pub tasks: Vec<Task>,
    pub stats: TaskStats,
    /// False for a static list: no row had a start or an end time.
    pub timed: bool,
}

/// Which column feeds which field, and the factor that brings its values to the simulator's
/// units (milli-cores, MiB, seconds).
#[derive(Clone, Debug)]
pub struct Columns {
    fields: Vec<(&'static str, Option<Mapping>)>,
}

#[derive(Clone, Debug)]
struct Mapping {
    column: String,
    factor: f64,
    /// Given by the user (missing is an error) rather than a default (missing is ignored
    /// when the field is optional).
    explicit: bool,
}

/// Fields of a node list: (name, default column, required).
pub const NODE_FIELDS: [(&str, &str, bool); 2] = [("cpu", "cpu_milli", true), ("mem", "memory_mib", true)];
/// Fields of a task list: (name, default column, required). The times are optional as a
/// pair: a list without both is static.
pub const TASK_FIELDS: [(&str, &str, bool); 7] = [
    ("name", "name", false),
    ("cpu", "cpu_milli", true),
    ("mem", "memory_mib", true),
    ("start", "creation_time", false),
    ("end", "deletion_time", false),
    ("phase", "pod_phase", false),
    ("gpu", "num_gpu", false),
];

impl Columns {
    /// The defaults for `fields`, overridden by `spec`: `field=column[*factor],...`.
    pub fn parse(fields: &[(&'static str, &'static str, bool)], spec: &str) -> anyhow::Result<Columns> {
        let mut cols = Columns {
            fields: fields
                .iter()
                .map(|(f, c, _)| {
                    (
                        *f,
                        Some(Mapping {
                            column: c.to_string(),
                            factor: 1.0,
                            explicit: false,
                        }),
                    )
                })
                .collect(),
        };
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (field, value) = item
                .split_once('=')
                .ok_or_else(|| anyhow!("column mapping `{item}`: expected FIELD=COLUMN[*FACTOR]"))?;
            let slot = cols
                .fields
                .iter_mut()
                .find(|(f, _)| *f == field.trim())
                .ok_or_else(|| {
                    anyhow!(
                        "column mapping `{item}`: unknown field `{}` (fields: {})",
                        field.trim(),
                        fields.iter().map(|f| f.0).collect::<Vec<_>>().join(", ")
                    )
                })?;
            let value = value.trim();
            if value.is_empty() {
                slot.1 = None;
                continue;
            }
            let (column, factor) = match value.split_once('*') {
                Some((c, f)) => {
                    let factor: f64 = f
                        .trim()
                        .parse()
                        .map_err(|_| anyhow!("column mapping `{item}`: factor `{}` is not a number", f.trim()))?;
                    if !(factor.is_finite() && factor > 0.0) {
                        bail!("column mapping `{item}`: factor must be positive");
                    }
                    (c.trim(), factor)
                }
                None => (value, 1.0),
            };
            slot.1 = Some(Mapping {
                column: column.to_string(),
                factor,
                explicit: true,
            });
        }
        for (f, _, required) in fields {
            if *required && cols.get(f).is_none() {
                bail!("column mapping: field `{f}` is required");
            }
        }
        Ok(cols)
    }

    /// The column that feeds `field`.
    pub fn column(&self, field: &str) -> Option<&str> {
        self.get(field).map(|m| m.column.as_str())
    }

    fn get(&self, field: &str) -> Option<&Mapping> {
        self.fields
            .iter()
            .find(|(f, _)| *f == field)
            .and_then(|(_, m)| m.as_ref())
    }

    /// Column indices of the fields in `header`: a mapped column the file lacks is an error
    /// unless it is an optional field's default.
    fn resolve(
        &self,
        what: &Path,
        header: &csv::StringRecord,
        required: &[(&str, &str, bool)],
        flag: &str,
    ) -> anyhow::Result<BTreeMap<&'static str, (usize, f64)>> {
        let mut at = BTreeMap::new();
        for (field, m) in &self.fields {
            let Some(m) = m else { continue };
            match header.iter().position(|h| h.trim() == m.column) {
                Some(i) => {
                    at.insert(*field, (i, m.factor));
                }
                None => {
                    let needed = required.iter().any(|(f, _, r)| f == field && *r);
                    if needed || m.explicit {
                        bail!("{}: no column `{}` for field `{field}` (its columns: {}); map another with {flag} {field}=COLUMN", what.display(), m.column, header.iter().collect::<Vec<_>>().join(", "),);
                    }
                }
            }
        }
        Ok(at)
    }
}

fn reader(path: &Path) -> anyhow::Result<csv::Reader<std::fs::File>> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(false)
        .from_reader(file))
}

/// The largest value a field may have: 2^40 milli-cores or MiB, a million cores or a
/// thousand TiB per machine; 2^40 seconds is 35,000 years.
const MAX_VALUE: f64 = (1u64 << 40) as f64;

/// A row's field as a number in the simulator's unit: `None` if the cell is empty.
fn number(
    path: &Path,
    row: usize,
    rec: &csv::StringRecord,
    col: (usize, f64),
    field: &str,
    header: &csv::StringRecord,
) -> anyhow::Result<Option<f64>> {
    let cell = rec.get(col.0).unwrap_or("").trim();
    if cell.is_empty() {
        return Ok(None);
    }
    let v: f64 = cell.parse().map_err(|_| {
        anyhow!(
            "{}: row {row}, field `{}` ({field}): `{cell}` is not a number",
            path.display(),
            &header[col.0]
        )
    })?;
    if !v.is_finite() || v < 0.0 {
        bail!(
            "{}: row {row}, field `{}` ({field}): `{cell}` must be a finite number of at least 0",
            path.display(),
            &header[col.0]
        );
    }
    // Amounts are summed over a whole (scaled-up) cluster in 64 bits.
    if v * col.1 > MAX_VALUE {
        bail!("{}: row {row}, field `{}` ({field}): `{cell}` is too large (at most {MAX_VALUE} after the column's factor)", path.display(), &header[col.0]);
    }
    Ok(Some(v * col.1))
}

fn required(
    path: &Path,
    row: usize,
    v: Option<f64>,
    col: (usize, f64),
    field: &str,
    header: &csv::StringRecord,
) -> anyhow::Result<f64> {
    v.ok_or_else(|| {
        anyhow!(
            "{}: row {row}, field `{}` ({field}) is empty",
            path.display(),
            &header[col.0]
        )
    })
}

/// Reads a node list.
pub fn read_nodes(path: &Path, cols: &Columns) -> anyhow::Result<Vec<Node>> {
    let mut rd = reader(path)?;
    let header = rd
        .headers()
        .with_context(|| format!("{}: cannot read the header", path.display()))?
        .clone();
    let at = cols.resolve(path, &header, &NODE_FIELDS, "--node-columns")?;
    let mut nodes = Vec::new();
    for (i, rec) in rd.records().enumerate() {
        let row = i + 1;
        let rec = rec.map_err(|e| anyhow!("{}: row {row}: {e}", path.display()))?;
        let cpu = required(
            path,
            row,
            number(path, row, &rec, at["cpu"], "cpu", &header)?,
            at["cpu"],
            "cpu",
            &header,
        )?
        .round() as u64;
        let mem = required(
            path,
            row,
            number(path, row, &rec, at["mem"], "mem", &header)?,
            at["mem"],
            "mem",
            &header,
        )?
        .round() as u64;
        for (field, v) in [("cpu", cpu), ("mem", mem)] {
            if v == 0 {
                bail!("{}: row {row}, field `{}` ({field}): a node needs some (after the column's factor and rounding to milli-cores and MiB, it has 0)", path.display(), &header[at[field].0]);
            }
        }
        nodes.push(Node { cpu, mem });
    }
    if nodes.is_empty() {
        bail!("{}: no nodes", path.display());
    }
    Ok(nodes)
}

/// Reads a task list. A list in which no row has a time is static. In a timed list, a row
/// without a start or end time is an error, or skipped and counted with `skip_incomplete`;
/// the error names the first such row, and calls the list mixed when that row has no time at
/// all.
pub fn read_tasks(path: &Path, cols: &Columns, skip_incomplete: bool) -> anyhow::Result<TaskList> {
    let mut rd = reader(path)?;
    let header = rd
        .headers()
        .with_context(|| format!("{}: cannot read the header", path.display()))?
        .clone();
    let at = cols.resolve(path, &header, &TASK_FIELDS, "--task-columns")?;
    let columns = || header.iter().collect::<Vec<_>>().join(", ");
    match (at.contains_key("start"), at.contains_key("end")) {
        (true, false) | (false, true) => {
            let (has, lacks) = if at.contains_key("start") {
                ("start", "end")
            } else {
                ("end", "start")
            };
            let why = cols.column(lacks).map_or_else(
                || format!("field `{lacks}` is dropped"),
                |c| format!("no column `{c}` for field `{lacks}` (its columns: {})", columns()),
            );
            bail!(
                "{}: {why}, but column `{}` gives `{has}`: a task list has both times or neither (a static list); map one with --task-columns {lacks}=COLUMN, or drop both with {has}=,{lacks}=",
                path.display(),
                &header[at[has].0]
            );
        }
        _ => {}
    }
    let time_columns = at
        .get("start")
        .zip(at.get("end"))
        .map(|(s, e)| format!("`{}` and `{}`", &header[s.0], &header[e.0]));
    let mut tasks = Vec::new();
    let mut stats = TaskStats::default();
    // Rows without times before the first row with one: the list is static if no row has a
    // time, and these rows are its tasks; otherwise they are incomplete rows of a timed list.
    let mut untimed = Vec::new();
    let mut untimed_stats = TaskStats::default();
    let mut first_timed: Option<(usize, String)> = None;
    let mixed = |untimed_row: usize, untimed_name: &str, timed: &(usize, String)| {
        anyhow!(
            "{}: the list mixes timed and untimed rows: row {untimed_row} ({untimed_name}) has no time ({} empty) but row {} ({}) has; a task list is either timed (every row has a start and an end) or static (no row has either); --skip-incomplete skips and counts the rows without a start or end",
            path.display(),
            time_columns.as_deref().unwrap_or_default(),
            timed.0,
            timed.1
        )
    };
    for (i, rec) in rd.records().enumerate() {
        let row = i + 1;
        let rec = rec.map_err(|e| anyhow!("{}: row {row}: {e}", path.display()))?;
        stats.rows += 1;
        let name = at
            .get("name")
            .and_then(|c| rec.get(c.0))
            .map_or_else(|| format!("row {row}"), |s| s.trim().to_string());
        let num = |field: &str| -> anyhow::Result<Option<f64>> {
            at.get(field)
                .map_or(Ok(None), |&c| number(path, row, &rec, c, field, &header))
        };
        let cpu = required(path, row, num("cpu")?, at["cpu"], "cpu", &header)?.round() as u64;
        let mem = required(path, row, num("mem")?, at["mem"], "mem", &header)?.round() as u64;
        let (start, end) = (num("start")?, num("end")?);
        if start.is_none() && end.is_none() && first_timed.is_none() {
            count(&mut untimed_stats, &at, &rec, &num)?;
            untimed.push(Task {
                name,
                row,
                cpu,
                mem,
                start: 0.0,
                end: f64::INFINITY,
            });
            continue;
        }
        if first_timed.is_none() {
            first_timed = Some((row, name.clone()));
            if let (Some(first), false) = (untimed.first(), skip_incomplete) {
                return Err(mixed(first.row, &first.name, first_timed.as_ref().expect("just set")));
            }
        }
        let (start, end) = match (start, end) {
            (Some(s), Some(e)) => (s, e),
            _ if skip_incomplete => {
                stats.skipped_incomplete += 1;
                continue;
            }
            (None, None) => return Err(mixed(row, &name, first_timed.as_ref().expect("a timed row came first"))),
            (None, _) => bail!(
                "{}: row {row} ({name}), field `{}` (start) is empty; --skip-incomplete skips and counts such rows",
                path.display(),
                &header[at["start"].0]
            ),
            (_, None) => bail!(
                "{}: row {row} ({name}), field `{}` (end) is empty; --skip-incomplete skips and counts such rows",
                path.display(),
                &header[at["end"].0]
            ),
        };
        if end < start {
            bail!(
                "{}: row {row} ({name}), field `{}` (end): {end} is before its start {start}",
                path.display(),
                &header[at["end"].0]
            );
        }
        count(&mut stats, &at, &rec, &num)?;
        tasks.push(Task {
            name,
            row,
            cpu,
            mem,
            start,
            end,
        });
    }
    let timed = first_timed.is_some();
    if timed {
        stats.skipped_incomplete += untimed.len();
    } else {
        tasks = untimed;
        stats.phases = untimed_stats.phases;
        stats.gpu_tasks = untimed_stats.gpu_tasks;
    }
    if tasks.is_empty() {
        bail!(
            "{}: no tasks to replay ({} rows, {} skipped as incomplete)",
            path.display(),
            stats.rows,
            stats.skipped_incomplete
        );
    }
    Ok(TaskList { tasks, stats, timed })
}

/// Counts a kept row's phase and GPUs, which the models do not use.
fn count(
    stats: &mut TaskStats,
    at: &BTreeMap<&'static str, (usize, f64)>,
    rec: &csv::StringRecord,
    num: &dyn Fn(&str) -> anyhow::Result<Option<f64>>,
) -> anyhow::Result<()> {
    if let Some(c) = at.get("phase") {
        *stats
            .phases
            .entry(rec.get(c.0).unwrap_or("").trim().to_string())
            .or_default() += 1;
    }
    if num("gpu")?.is_some_and(|g| g > 0.0) {
        stats.gpu_tasks += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(text.as_bytes()).unwrap();
        f
    }

    fn tasks(text: &str, map: &str, skip: bool) -> anyhow::Result<(Vec<Task>, TaskStats)> {
        list(text, map, skip).map(|l| {
            assert!(l.timed, "a timed list");
            (l.tasks, l.stats)
        })
    }

    fn list(text: &str, map: &str, skip: bool) -> anyhow::Result<TaskList> {
        let f = file(text);
        read_tasks(f.path(), &Columns::parse(&TASK_FIELDS, map)?, skip)
    }

    const HEAD: &str = "name,cpu_milli,memory_mib,num_gpu,pod_phase,creation_time,deletion_time\n";

    #[test]
    fn reads_the_alibaba_columns_and_counts_what_it_does_not_model() {
        let (t, s) = tasks(
            &format!("{HEAD}a,1000,2048,1,Running,0,10\nb,500,0,0,Pending,5,7\n"),
            "",
            false,
        )
        .unwrap();
        assert_eq!(
            t[1],
            Task {
                name: "b".into(),
                row: 2,
                cpu: 500,
                mem: 0,
                start: 5.0,
                end: 7.0
            }
        );
        assert_eq!((s.rows, s.gpu_tasks, s.phases["Pending"]), (2, 1, 1));
    }

    #[test]
    fn bad_rows_name_the_row_and_field() {
        let err = |text: &str| tasks(&format!("{HEAD}{text}"), "", false).unwrap_err().to_string();
        assert!(err("a,1000,2048,0,Running,0,10\nb,x,1,0,Running,0,1\n")
            .contains("row 2, field `cpu_milli` (cpu): `x` is not a number"));
        assert!(err("a,1000,-1,0,Running,0,10\n").contains("row 1, field `memory_mib` (mem): `-1` must be"));
        assert!(err("a,1000,1,0,Pending,,10\n").contains("row 1 (a), field `creation_time` (start) is empty"));
        assert!(
            err("a,1000,1,0,Running,9,3\n").contains("row 1 (a), field `deletion_time` (end): 3 is before its start 9")
        );
        assert!(err("a,1000,1,0,Running\n").contains("row 1"));
        assert!(err("a,1e300,1,0,Running,0,1\n").contains("row 1, field `cpu_milli` (cpu): `1e300` is too large"));
        let (t, s) = tasks(
            &format!("{HEAD}a,1000,1,0,Pending,,10\nb,1,1,0,Running,1,2\n"),
            "",
            true,
        )
        .unwrap();
        assert_eq!((t.len(), s.skipped_incomplete, s.rows), (1, 1, 2));
    }

    #[test]
    fn a_list_without_times_is_static_in_file_order() {
        let static_task = |name: &str, row, cpu, mem| Task {
            name: name.into(),
            row,
            cpu,
            mem,
            start: 0.0,
            end: f64::INFINITY,
        };
        // The times' columns absent, or present and empty in every row.
        for text in [
            "name,cpu_milli,memory_mib,num_gpu,pod_phase\nb,2000,64,1,Running\na,1000,32,0,Failed\n",
            &format!("{HEAD}b,2000,64,1,Running,,\na,1000,32,0,Failed,,\n"),
        ] {
            let l = list(text, "", false).unwrap();
            assert!(!l.timed, "{text}");
            assert_eq!(l.tasks, [static_task("b", 1, 2000, 64), static_task("a", 2, 1000, 32)]);
            assert_eq!(
                (
                    l.stats.rows,
                    l.stats.gpu_tasks,
                    l.stats.phases["Failed"],
                    l.stats.skipped_incomplete
                ),
                (2, 1, 1, 0)
            );
        }
        // Dropping both times makes a timed file static; dropping one is refused.
        let l = list(&format!("{HEAD}a,1000,1,0,Running,0,10\n"), "start=,end=", false).unwrap();
        assert!(!l.timed && l.tasks[0].end == f64::INFINITY);
        let e = list(&format!("{HEAD}a,1000,1,0,Running,0,10\n"), "end=", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("field `end` is dropped, but column `creation_time` gives `start`: a task list has both times or neither"), "{e}");
        let e = list("name,cpu_milli,memory_mib,creation_time\na,1,1,0\n", "", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no column `deletion_time` for field `end` (its columns: name, cpu_milli, memory_mib, creation_time), but column `creation_time` gives `start`"), "{e}");
        // A mapped column the file lacks is still an error, not a static list.
        let e = list("id,cpu_milli,memory_mib\na,1,1\n", "start=t0,end=t1", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no column `t0` for field `start`"), "{e}");
    }

    #[test]
    fn a_list_mixing_timed_and_untimed_rows_names_the_first_untimed_row() {
        let mixed = "the list mixes timed and untimed rows";
        let e = list(
            &format!("{HEAD}a,1,1,0,Running,0,10\nb,1,1,0,Running,,\nc,1,1,0,Running,,\n"),
            "",
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(&format!(
                "{mixed}: row 2 (b) has no time (`creation_time` and `deletion_time` empty) but row 1 (a) has"
            )),
            "{e}"
        );
        // Untimed rows first: the first of them is named, against the first timed row.
        let e = list(
            &format!("{HEAD}a,1,1,0,Running,,\nb,1,1,0,Running,,\nc,1,1,0,Running,3,\n"),
            "",
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(&format!("{mixed}: row 1 (a) has no time")) && e.contains("but row 3 (c) has"),
            "{e}"
        );
        // --skip-incomplete keeps the timed rows, before and after, and counts the others.
        let (t, s) = tasks(
            &format!("{HEAD}a,1,1,0,Running,,\nb,1,1,1,Running,2,5\nc,1,1,0,Running,,\nd,1,1,0,Running,,7\n"),
            "",
            true,
        )
        .unwrap();
        assert_eq!(
            (
                t.len(),
                t[0].name.as_str(),
                s.skipped_incomplete,
                s.rows,
                s.gpu_tasks,
                s.phases["Running"]
            ),
            (1, "b", 3, 4, 1, 1)
        );
    }

    #[test]
    fn a_mapping_renames_and_scales_columns() {
        let text = "id,cores,gib,t0,t1\nx,2,1.5,3,4\n";
        let (t, _) = tasks(text, "name=id,cpu=cores*1000,mem=gib*1024,start=t0,end=t1", false).unwrap();
        assert_eq!((t[0].cpu, t[0].mem, t[0].name.as_str()), (2000, 1536, "x"));
        let e = tasks(text, "cpu=cores*1000,mem=gib*1024,start=t0,end=t1,phase=state", false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no column `state` for field `phase`"), "{e}");
        let e = tasks(text, "cpu=cores", false).unwrap_err().to_string();
        assert!(
            e.contains("no column `memory_mib` for field `mem`") && e.contains("its columns: id, cores, gib, t0, t1"),
            "{e}"
        );
        assert!(Columns::parse(&TASK_FIELDS, "disk=x")
            .unwrap_err()
            .to_string()
            .contains("unknown field `disk`"));
        assert!(Columns::parse(&TASK_FIELDS, "cpu=")
            .unwrap_err()
            .to_string()
            .contains("field `cpu` is required"));
        assert!(Columns::parse(&TASK_FIELDS, "cpu=a*-1").is_err());
    }

    #[test]
    fn nodes_need_cpu_and_memory() {
        let f = file("sn,cpu_milli,memory_mib\nn0,32000,262144\nn1,0,10\n");
        let e = read_nodes(f.path(), &Columns::parse(&NODE_FIELDS, "").unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 2, field `cpu_milli` (cpu): a node needs some"), "{e}");
    }
}
