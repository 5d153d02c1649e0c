//! One model's replay of the workload: the tasks' start and end events in time order, each
//! start placed or queued, the waiting tasks retried as room is made, gauges sampled over the
//! replay, and a ledger that checks the pools' own accounting. A static list is not replayed
//! but filled in: its tasks come one after another and stay, and the fill follows how much of
//! what is free the list's tasks could still use.
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;

use super::model::{Fractions, Gauges, Kind, Model, Need};
use super::trace::Task;
use super::{failure, pool};

/// The latest time a replay may reach, shifts included (35,000 years).
const MAX_TIME: f64 = (1u64 << 40) as f64;

/// The replayed workload: the trace's tasks, copied and shifted.
pub(super) struct Workload {
    pub(super) tasks: Vec<Task>,
    copies: usize,
    shift: f64,
    /// (time, 0 = end / 1 = start, task id): ends first at equal times, so that what ends
    /// makes room for what starts.
    pub(super) events: Vec<(f64, u8, u32)>,
}

impl Workload {
    pub(super) fn new(tasks: Vec<Task>, copies: usize, shift: f64) -> anyhow::Result<Workload> {
        let total = tasks
            .len()
            .checked_mul(copies)
            .filter(|t| *t <= u32::MAX as usize)
            .context("too many tasks: the scale-up needs fewer than 2^32")?;
        let last = tasks.iter().map(|t| t.end).fold(0.0, f64::max) + (copies - 1) as f64 * shift;
        if last > MAX_TIME {
            bail!("--shift {shift}: the last copy of the task list would end at {last} s, past {MAX_TIME} s");
        }
        let mut w = Workload {
            tasks,
            copies,
            shift,
            events: Vec::new(),
        };
        w.events = (0..total)
            .flat_map(|id| [(w.start(id), 1, id as u32), (w.end(id), 0, id as u32)])
            .collect();
        w.events
            .sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        Ok(w)
    }

    /// A static list: `copies` of it one after another, each in file order.
    pub(super) fn in_order(tasks: Vec<Task>, copies: usize) -> anyhow::Result<Workload> {
        tasks
            .len()
            .checked_mul(copies)
            .filter(|t| *t <= u32::MAX as usize)
            .context("too many tasks: the scale-up needs fewer than 2^32")?;
        Ok(Workload {
            tasks,
            copies,
            shift: 0.0,
            events: Vec::new(),
        })
    }

    pub(super) fn len(&self) -> usize {
        self.tasks.len() * self.copies
    }

    fn task(&self, id: usize) -> &Task {
        &self.tasks[id % self.tasks.len()]
    }

    fn start(&self, id: usize) -> f64 {
        self.task(id).start + (id / self.tasks.len()) as f64 * self.shift
    }

    fn end(&self, id: usize) -> f64 {
        self.task(id).end + (id / self.tasks.len()) as f64 * self.shift
    }

    pub(super) fn span(&self) -> (f64, f64) {
        (
            self.events.first().map_or(0.0, |e| e.0),
            self.events.last().map_or(0.0, |e| e.0),
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    New,
    Waiting,
    Running,
    /// Ended: ran, gave up waiting, was too large, or ended the instant it started.
    Done,
}

#[derive(Serialize, Default, Clone)]
pub struct Series {
    pub time: Vec<f64>,
    pub fragmentation_cpu: Vec<f64>,
    pub fragmentation_mem: Vec<f64>,
    pub switched_off_compute: Vec<f64>,
    pub switched_off_memory: Vec<f64>,
    pub utilization_cpu: Vec<f64>,
    pub utilization_mem: Vec<f64>,
    pub waiting: Vec<usize>,
}

impl Series {
    fn push(&mut self, t: f64, g: &Gauges, waiting: usize) {
        self.time.push(t);
        let columns = [
            &mut self.fragmentation_cpu,
            &mut self.fragmentation_mem,
            &mut self.switched_off_compute,
            &mut self.switched_off_memory,
            &mut self.utilization_cpu,
            &mut self.utilization_mem,
        ];
        for (c, v) in columns.into_iter().zip(g.fractions.to_array()) {
            c.push(v);
        }
        self.waiting.push(waiting);
    }
}

#[derive(Serialize, Clone, Default)]
pub struct Waits {
    /// Tasks placed after waiting for room.
    pub waited: usize,
    pub p50_seconds: f64,
    pub p99_seconds: f64,
    pub max_seconds: f64,
}

/// One model's replay. The averages are weighted by time over the replay.
#[derive(Serialize, Clone)]
pub struct ModelReport {
    pub placement: String,
    pub topology: String,
    pub compute_units: usize,
    pub memory_units: usize,
    /// MiB of the largest memory module (of a server, in the fixed model).
    pub memory_unit_mib: u64,
    pub cpu_milli: u128,
    pub memory_mib: u128,
    #[serde(flatten)]
    pub average: Fractions,
    /// Tasks never placed: they ended while waiting, or were larger than any module
    /// (`oversized`, with --skip-oversized).
    pub unplaced: usize,
    pub oversized: usize,
    pub placed: usize,
    /// Tasks whose end was their start: nothing to place.
    pub instant: usize,
    pub waits: Waits,
    pub peak_compute_on: usize,
    pub peak_memory_on: usize,
    pub average_remote_mib: f64,
    pub peak_remote_mib: f64,
    pub events: usize,
    pub seconds: f64,
    pub events_per_second: f64,
    pub reliability: Option<failure::Reliability>,
    pub redundancy: Option<Vec<failure::Redundancy>>,
    pub audit: Audit,
    pub series: Series,
    /// A static list's fill; a timed trace has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fill: Option<Fill>,
}

impl ModelReport {
    /// The report's figures of the model itself; the workload's are left at zero.
    fn of(m: &Model, audit: Audit) -> ModelReport {
        let (compute, memory) = (&m.compute, m.memory.as_ref());
        let units = memory.unwrap_or(compute);
        ModelReport {
            placement: String::new(),
            topology: m.spec.topology.to_string(),
            compute_units: compute.units(),
            memory_units: units.units(),
            memory_unit_mib: (0..units.units()).map(|u| units.cap(u)[pool::MEM]).max().unwrap_or(0),
            cpu_milli: compute.total(pool::CPU),
            memory_mib: compute.total(pool::MEM) + memory.map_or(0, |p| p.total(pool::MEM)),
            average: Fractions::default(),
            unplaced: 0,
            oversized: 0,
            placed: 0,
            instant: 0,
            waits: Waits::default(),
            peak_compute_on: 0,
            peak_memory_on: 0,
            average_remote_mib: 0.0,
            peak_remote_mib: 0.0,
            events: 0,
            seconds: 0.0,
            events_per_second: 0.0,
            reliability: None,
            redundancy: None,
            audit,
            series: Series::default(),
            fill: None,
        }
    }
}

/// Replays `w` against `m`.
/// The averages are over `window` (seconds of the replay), clipped to the replay.
pub(super) fn replay(
    mut m: Model,
    w: &Workload,
    needs: &[Option<Need>],
    retry_window: usize,
    samples: usize,
    window: (f64, f64),
    progress: &indicatif::ProgressBar,
) -> ModelReport {
    let started = Instant::now();
    let mut state = vec![State::New; w.len()];
    let mut queue: VecDeque<u32> = VecDeque::new();
    let mut dead = 0usize;
    let (t0, t1) = w.span();
    let step = if samples > 1 {
        (t1 - t0) / (samples - 1) as f64
    } else {
        f64::INFINITY
    };
    let mut next_sample = t0;
    let mut series = Series::default();
    let mut sums = [0f64; 6];
    let mut remote_sum = 0f64;
    let mut prev = t0;
    let (mut placed, mut unplaced, mut oversized, mut instant) = (0usize, 0usize, 0usize, 0usize);
    let mut waits: Vec<f64> = Vec::new();
    let (mut peak_c, mut peak_m, mut peak_remote) = (0usize, 0usize, 0f64);
    let mut g = m.gauges();
    let mut audit = Audit::new(&m);
    for (i, &(t, kind, id)) in w.events.iter().enumerate() {
        if t > prev {
            let dt = (t.min(window.1) - prev.max(window.0)).max(0.0);
            for (s, v) in sums.iter_mut().zip(g.fractions.to_array()) {
                *s += v * dt;
            }
            remote_sum += g.remote_mem * dt;
            prev = t;
        }
        while next_sample < t && series.time.len() < samples {
            series.push(next_sample, &g, queue.len() - dead);
            next_sample += step;
        }
        let id = id as usize;
        let mut released = false;
        match (kind, state[id]) {
            (1, State::New) => match needs[id % w.tasks.len()] {
                None => {
                    oversized += 1;
                    state[id] = State::Done;
                }
                Some(need) if m.place(id, need) => {
                    placed += 1;
                    state[id] = State::Running;
                    audit.placed(&m, id);
                }
                Some(_) => {
                    state[id] = State::Waiting;
                    queue.push_back(id as u32);
                }
            },
            (0, State::Running) => {
                audit.released(&m, id);
                m.release(id);
                state[id] = State::Done;
                released = true;
            }
            (0, State::Waiting) => {
                unplaced += 1;
                state[id] = State::Done;
                dead += 1;
            }
            (0, State::New) => {
                instant += 1;
                state[id] = State::Done;
            }
            _ => {}
        }
        if released && queue.len() > dead {
            let mut tries = 0;
            for &q in queue.iter() {
                if tries == retry_window {
                    break;
                }
                let q = q as usize;
                // A task whose end is now is about to give up.
                if state[q] != State::Waiting || w.end(q) <= t {
                    continue;
                }
                tries += 1;
                let need = needs[q % w.tasks.len()].expect("a waiting task fits an empty cluster");
                if m.place(q, need) {
                    placed += 1;
                    state[q] = State::Running;
                    dead += 1;
                    waits.push(t - w.start(q));
                    audit.placed(&m, q);
                }
            }
        }
        while queue.front().is_some_and(|&q| state[q as usize] != State::Waiting) {
            queue.pop_front();
            dead -= 1;
        }
        if dead > 64 && dead > queue.len() / 2 {
            queue.retain(|&q| state[q as usize] == State::Waiting);
            dead = 0;
        }
        g = m.gauges();
        peak_c = peak_c.max(g.compute_on);
        peak_m = peak_m.max(g.memory_on);
        peak_remote = peak_remote.max(g.remote_mem);
        if i % 8192 == 8191 {
            progress.inc(8192);
        }
    }
    progress.inc((w.events.len() % 8192) as u64);
    while series.time.len() < samples {
        series.push(next_sample.min(t1), &g, queue.len() - dead);
        next_sample += step;
    }
    audit.finish(&m);
    let span = (t1.min(window.1) - t0.max(window.0)).max(0.0);
    let now = g.fractions.to_array();
    let avg = |k: usize| if span > 0.0 { sums[k] / span } else { now[k] };
    waits.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if waits.is_empty() {
            0.0
        } else {
            waits[((waits.len() - 1) as f64 * p).round() as usize]
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    ModelReport {
        average: Fractions::from_array(std::array::from_fn(avg)),
        unplaced: unplaced + oversized,
        oversized,
        placed,
        instant,
        waits: Waits {
            waited: waits.len(),
            p50_seconds: pct(0.5),
            p99_seconds: pct(0.99),
            max_seconds: waits.last().copied().unwrap_or(0.0),
        },
        peak_compute_on: peak_c,
        peak_memory_on: peak_m,
        average_remote_mib: if span > 0.0 { remote_sum / span } else { g.remote_mem },
        peak_remote_mib: peak_remote,
        events: w.events.len(),
        seconds,
        events_per_second: w.events.len() as f64 / seconds.max(1e-9),
        series,
        ..ModelReport::of(&m, audit)
    }
}

/// How a static list filled the cluster.
#[derive(Serialize, Clone)]
pub struct Fill {
    /// Tasks that came, in arrival order, before the fill stopped.
    pub tried: usize,
    /// Tasks that came and found no room (tasks too large for any module not counted).
    pub failed: usize,
    /// Whether the fill stopped because the cluster was full (not even the smallest tasks of
    /// the list fit any more) rather than because the list ended.
    pub full: bool,
    pub first_failed: Option<FirstFailed>,
    pub curve: Curve,
}

#[derive(Serialize, Clone)]
pub struct FirstFailed {
    /// Its place in the arrival order, from 0, over the copies of --load and --scale.
    pub task: usize,
    pub row: usize,
    pub name: String,
    /// The workload that had come before it, as `Curve::arrived`.
    pub arrived: f64,
}

/// The fill, one point before the first task, one at each whole percent of the workload
/// come, and one where it stopped. All are fractions but the counts of tasks.
#[derive(Serialize, Default, Clone)]
pub struct Curve {
    /// The requests of the tasks that came, as a share of the cluster's capacity: the larger
    /// of the CPU and memory shares, which is what fills a cluster.
    pub arrived: Vec<f64>,
    pub arrived_cpu: Vec<f64>,
    pub arrived_mem: Vec<f64>,
    pub tasks: Vec<usize>,
    pub placed: Vec<usize>,
    pub utilization_cpu: Vec<f64>,
    pub utilization_mem: Vec<f64>,
    /// The share of the free CPU (memory) that the list's tasks could not use.
    pub fragmentation_rate_cpu: Vec<f64>,
    pub fragmentation_rate_mem: Vec<f64>,
}

impl Curve {
    fn push(&mut self, m: &Model, shapes: &Shapes, arrived: [f64; 2], tasks: usize, placed: usize) {
        let g = m.gauges().fractions;
        let (cpu, mem) = shapes.unusable(m);
        self.arrived.push(arrived[0].max(arrived[1]));
        self.arrived_cpu.push(arrived[0]);
        self.arrived_mem.push(arrived[1]);
        self.tasks.push(tasks);
        self.placed.push(placed);
        self.utilization_cpu.push(g.utilization_cpu);
        self.utilization_mem.push(g.utilization_mem);
        self.fragmentation_rate_cpu.push(cpu);
        self.fragmentation_rate_mem.push(mem);
    }
}

/// Fills `m` with the static workload `w`: each task in turn is placed or fails, and stays,
/// until the list ends or the cluster is full. The report's fractions and peaks are the
/// state where the fill stopped. Every task is then released, so that the audit checks the
/// pools' accounting as after a replay.
///
/// Nothing leaves a static fill, so what is free only shrinks: a need that found no room
/// finds none later, nor does a need at least as large in every resource. Such tasks fail
/// without a search, because once the cluster is nearly full a search that fails looks at
/// most units, and every later task would pay for it.
pub(super) fn fill(
    mut m: Model,
    w: &Workload,
    needs: &[Option<Need>],
    progress: &indicatif::ProgressBar,
) -> ModelReport {
    let started = Instant::now();
    let shapes = Shapes::of(needs);
    let total = [
        m.compute.total(pool::CPU) as f64,
        (m.compute.total(pool::MEM) + m.memory.as_ref().map_or(0, |p| p.total(pool::MEM))) as f64,
    ];
    let mut audit = Audit::new(&m);
    let mut curve = Curve::default();
    let mut came = [0u128; 2];
    let share = |came: &[u128; 2]| [came[0] as f64 / total[0], came[1] as f64 / total[1]];
    curve.push(&m, &shapes, [0.0; 2], 0, 0);
    let (mut tried, mut placed, mut failed, mut full) = (0usize, 0usize, 0usize, false);
    let mut no_room: Vec<Need> = Vec::new();
    let hopeless = |no_room: &[Need], n: &Need| no_room.iter().any(|f| at_most(f, n));
    let mut first_failed = None;
    let mut percent = 0.0;
    // Among the tasks tried: a fill that stops full never tries the rest.
    let mut oversized = 0;
    for id in 0..w.len() {
        let t = w.task(id);
        let before = share(&came);
        came[0] += u128::from(t.cpu);
        came[1] += u128::from(t.mem);
        tried += 1;
        match needs[id % w.tasks.len()] {
            None => oversized += 1,
            Some(need) if !hopeless(&no_room, &need) && m.place(id, need) => {
                placed += 1;
                audit.placed(&m, id);
            }
            Some(need) => {
                failed += 1;
                first_failed.get_or_insert_with(|| FirstFailed {
                    task: id,
                    row: t.row,
                    name: t.name.clone(),
                    arrived: before[0].max(before[1]),
                });
                if !hopeless(&no_room, &need) {
                    no_room.retain(|f| !at_most(&need, f));
                    no_room.push(need);
                    // Whether anything still fits, by placing and releasing each of the
                    // smallest needs not known to fail.
                    full = true;
                    for &n in &shapes.minimal {
                        if hopeless(&no_room, &n) {
                            continue;
                        }
                        if m.place(id, n) {
                            m.release(id);
                            full = false;
                            break;
                        }
                        no_room.push(n);
                    }
                }
            }
        }
        let now = share(&came);
        let at = (now[0].max(now[1]) * 100.0).floor();
        if at > percent {
            percent = at;
            curve.push(&m, &shapes, now, tried, placed);
        }
        if id % 8192 == 8191 {
            progress.inc(8192);
        }
        if full {
            break;
        }
    }
    progress.inc((tried % 8192) as u64);
    if curve.tasks.last() != Some(&tried) {
        curve.push(&m, &shapes, share(&came), tried, placed);
    }
    let g = m.gauges();
    for id in 0..w.len() {
        if m.allocation(id).is_some() {
            audit.released(&m, id);
            m.release(id);
        }
    }
    audit.finish(&m);
    let seconds = started.elapsed().as_secs_f64();
    ModelReport {
        average: g.fractions,
        unplaced: w.len() - placed,
        oversized,
        placed,
        peak_compute_on: g.compute_on,
        peak_memory_on: g.memory_on,
        average_remote_mib: g.remote_mem,
        peak_remote_mib: g.remote_mem,
        events: tried,
        seconds,
        events_per_second: tried as f64 / seconds.max(1e-9),
        fill: Some(Fill {
            tried,
            failed,
            full,
            first_failed,
            curve,
        }),
        ..ModelReport::of(&m, audit)
    }
}

/// Whether need `a` asks at most what `b` does, in every resource.
fn at_most(a: &Need, b: &Need) -> bool {
    a.cpu <= b.cpu && a.local <= b.local && a.remote <= b.remote
}

/// The tasks of a list by what they ask of one model, each with its share of the list's
/// tasks: the workload whose use of the free resources the fill measures (the ATC '23
/// fragmentation measure, for CPU and memory).
struct Shapes {
    all: Vec<(Need, f64)>,
    /// The needs that no other need is below in every resource: when none of these fits, no
    /// task of the list does.
    minimal: Vec<Need>,
}

impl Shapes {
    fn of(needs: &[Option<Need>]) -> Shapes {
        let mut count: BTreeMap<(u64, u64, u64), usize> = BTreeMap::new();
        for n in needs.iter().flatten() {
            *count.entry((n.cpu, n.local, n.remote)).or_default() += 1;
        }
        let tasks: usize = count.values().sum();
        let all: Vec<(Need, f64)> = count
            .into_iter()
            .map(|((cpu, local, remote), c)| (Need { cpu, local, remote }, c as f64 / tasks as f64))
            .collect();
        let minimal = all
            .iter()
            .map(|s| s.0)
            .filter(|n| !all.iter().any(|(o, _)| o != n && at_most(o, n)))
            .collect();
        Shapes { all, minimal }
    }

    /// The shares of the free CPU and of the free memory that the list's tasks could not use
    /// now. A unit's free resources count as fragmented for a task when the task could not be
    /// placed using them, and are weighted by the task's share of the list:
    /// * a compute unit (a server): it lacks the task's CPU or local memory, or its rack's
    ///   memory modules lack the task's memory;
    /// * a memory module: it lacks room for one piece of the task (a vRegion where GMM
    ///   spreads them, else the task's memory over its links, in whole vRegions, at most the
    ///   whole task), or its rack lacks the task's memory or a compute unit that fits it.
    ///
    /// A rack's memory is free for a task when one module holds all of it or whole vRegions
    /// over its modules do; which modules a compute unit has links to is not looked at.
    fn unusable(&self, m: &Model) -> (f64, f64) {
        let (c, mem) = (&m.compute, m.memory.as_ref());
        let racks = c.parts();
        let unit = if m.spec.kind == Kind::Splitos {
            m.spec.vregion_mib
        } else {
            1
        };
        let (mut whole, mut largest) = (vec![0u128; racks], vec![0u64; racks]);
        if let Some(p) = mem {
            for j in 0..p.units() {
                let (free, k) = (p.free(j)[pool::MEM], p.part(j));
                whole[k] += u128::from(free / unit * unit);
                largest[k] = largest[k].max(free);
            }
        }
        // Per rack, the compute units' free (CPU, memory) that no other unit of the rack beats
        // in both: a task's compute part fits in the rack when it fits one of these. (A pool
        // search would do, but one that fails looks at most units, and a nearly full cluster
        // fails for most tasks.)
        let mut best: Vec<Vec<[u64; 2]>> = vec![Vec::new(); racks];
        for u in 0..c.units() {
            best[c.part(u)].push([c.free(u)[pool::CPU], c.free(u)[pool::MEM]]);
        }
        for b in &mut best {
            b.sort_unstable_by(|x, y| y.cmp(x));
            let mut most_mem = None;
            b.retain(|x| {
                let beaten = most_mem.is_some_and(|seen| seen >= x[1]);
                most_mem = most_mem.max(Some(x[1]));
                !beaten
            });
        }
        let usable: Vec<Vec<bool>> = (0..racks)
            .map(|k| {
                let room = |r: u64| r == 0 || whole[k] >= u128::from(r) || largest[k] >= r;
                self.all
                    .iter()
                    .map(|(n, _)| room(n.remote) && best[k].iter().any(|b| b[0] >= n.cpu && b[1] >= n.local))
                    .collect()
            })
            .collect();
        let (mut lost_cpu, mut lost_mem) = (0f64, 0f64);
        let mut weights: HashMap<(u64, u64, usize), f64> = HashMap::new();
        for u in 0..c.units() {
            let (free, k) = (c.free(u), c.part(u));
            if free[pool::CPU] == 0 && free[pool::MEM] == 0 {
                continue;
            }
            let fits = *weights.entry((free[pool::CPU], free[pool::MEM], k)).or_insert_with(|| {
                self.all
                    .iter()
                    .zip(&usable[k])
                    .filter(|((n, _), ok)| **ok && n.cpu <= free[pool::CPU] && n.local <= free[pool::MEM])
                    .map(|((_, p), _)| p)
                    .sum()
            });
            let lost = (1.0 - fits).max(0.0);
            lost_cpu += lost * free[pool::CPU] as f64;
            lost_mem += lost * free[pool::MEM] as f64;
        }
        if let Some(p) = mem {
            let spreads = m.spec.kind == Kind::Splitos && !c.policy().packs();
            let piece = |r: u64| match m.spec.topology.links {
                Some(l) if !spreads => r.div_ceil(u64::from(l)).div_ceil(unit).saturating_mul(unit).min(r),
                _ => r.min(unit),
            };
            // Per rack, the pieces of the tasks it could take, smallest first, and the share of
            // the list that each piece size and the smaller ones make up.
            let by_piece: Vec<(Vec<u64>, Vec<f64>)> = usable
                .iter()
                .map(|ok| {
                    let mut v: Vec<(u64, f64)> = self
                        .all
                        .iter()
                        .zip(ok)
                        .filter(|((n, _), ok)| **ok && n.remote > 0)
                        .map(|((n, p), _)| (piece(n.remote), *p))
                        .collect();
                    v.sort_by_key(|x| x.0);
                    let mut sum = 0.0;
                    v.into_iter()
                        .map(|(size, p)| {
                            sum += p;
                            (size, sum)
                        })
                        .unzip()
                })
                .collect();
            for j in 0..p.units() {
                let free = p.free(j)[pool::MEM];
                let (sizes, sums) = &by_piece[p.part(j)];
                let fits = sizes
                    .partition_point(|&s| s <= free)
                    .checked_sub(1)
                    .map_or(0.0, |i| sums[i]);
                lost_mem += (1.0 - fits).max(0.0) * free as f64;
            }
        }
        let rate = |lost: f64, free: u128| if free == 0 { 0.0 } else { (lost / free as f64).min(1.0) };
        (
            rate(lost_cpu, c.free_total(pool::CPU)),
            rate(
                lost_mem,
                c.free_total(pool::MEM) + mem.map_or(0, |p| p.free_total(pool::MEM)),
            ),
        )
    }
}

/// A ledger of what each unit holds, kept from the placements and releases themselves
/// rather than from the pools' own accounting, which it checks.
#[derive(Serialize, Clone)]
pub struct Audit {
    pub placements: usize,
    pub releases: usize,
    /// Placements after which a unit held more than its capacity.
    pub over_capacity: usize,
    /// Placements the model reported without recording the allocation.
    pub missing_allocations: usize,
    /// Releases of a task holding nothing.
    pub unmatched_releases: usize,
    /// Units holding anything once every task has ended.
    pub units_left_holding: usize,
    #[serde(skip)]
    compute: Vec<[u64; 2]>,
    #[serde(skip)]
    memory: Vec<u64>,
}

impl Audit {
    fn new(m: &Model) -> Audit {
        Audit {
            placements: 0,
            releases: 0,
            over_capacity: 0,
            missing_allocations: 0,
            unmatched_releases: 0,
            units_left_holding: 0,
            compute: vec![[0; 2]; m.compute.units()],
            memory: vec![0; m.memory.as_ref().map_or(0, |p| p.units())],
        }
    }

    fn placed(&mut self, m: &Model, id: usize) {
        self.placements += 1;
        let Some(a) = m.allocation(id) else {
            self.missing_allocations += 1;
            return;
        };
        let c = a.compute as usize;
        self.compute[c][0] += a.cpu;
        self.compute[c][1] += a.local;
        let cap = m.compute.cap(c);
        let mut over = self.compute[c][0] > cap[pool::CPU] || self.compute[c][1] > cap[pool::MEM];
        for &(u, mib) in &a.pieces {
            self.memory[u as usize] += mib;
            over |= m
                .memory
                .as_ref()
                .is_none_or(|p| self.memory[u as usize] > p.cap(u as usize)[pool::MEM]);
        }
        self.over_capacity += usize::from(over);
    }

    fn released(&mut self, m: &Model, id: usize) {
        self.releases += 1;
        let Some(a) = m.allocation(id) else {
            self.unmatched_releases += 1;
            return;
        };
        self.compute[a.compute as usize][0] -= a.cpu;
        self.compute[a.compute as usize][1] -= a.local;
        for &(u, mib) in &a.pieces {
            self.memory[u as usize] -= mib;
        }
    }

    /// Once every task has ended, units still holding anything by the ledger or by the
    /// model's own pools (free below capacity, allocations, links).
    fn finish(&mut self, m: &Model) {
        self.units_left_holding = self.compute.iter().filter(|c| c[0] > 0 || c[1] > 0).count()
            + self.memory.iter().filter(|m| **m > 0).count()
            + m.busy_units();
    }
}
