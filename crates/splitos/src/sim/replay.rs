//! One model's replay of the workload: the tasks' start and end events in time order, each
//! start placed or queued, the waiting tasks retried as room is made, gauges sampled over the
//! replay, and a ledger that checks the pools' own accounting.
use std::collections::VecDeque;
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;

use super::model::{Fractions, Gauges, Model, Need};
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
        let total = tasks.len().checked_mul(copies).filter(|t| *t <= u32::MAX as usize).context("too many tasks: the scale-up needs fewer than 2^32")?;
        let last = tasks.iter().map(|t| t.end).fold(0.0, f64::max) + (copies - 1) as f64 * shift;
        if last > MAX_TIME {
            bail!("--shift {shift}: the last copy of the task list would end at {last} s, past {MAX_TIME} s");
        }
        let mut w = Workload { tasks, copies, shift, events: Vec::new() };
        w.events = (0..total).flat_map(|id| [(w.start(id), 1, id as u32), (w.end(id), 0, id as u32)]).collect();
        w.events.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        Ok(w)
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
        (self.events.first().map_or(0.0, |e| e.0), self.events.last().map_or(0.0, |e| e.0))
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
        let columns = [&mut self.fragmentation_cpu, &mut self.fragmentation_mem, &mut self.switched_off_compute, &mut self.switched_off_memory, &mut self.utilization_cpu, &mut self.utilization_mem];
        for (c, v) in columns.into_iter().zip(g.fractions.to_array()) {
            c.push(v);
        }
        self.waiting.push(waiting);
    }
}

#[derive(Serialize, Clone)]
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
    pub policy: String,
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
}

/// Replays `w` against `m`.
/// The averages are over `window` (seconds of the replay), clipped to the replay.
pub(super) fn replay(mut m: Model, w: &Workload, needs: &[Option<Need>], retry_window: usize, samples: usize, window: (f64, f64), progress: &indicatif::ProgressBar) -> ModelReport {
    let started = Instant::now();
    let mut state = vec![State::New; w.len()];
    let mut queue: VecDeque<u32> = VecDeque::new();
    let mut dead = 0usize;
    let (t0, t1) = w.span();
    let step = if samples > 1 { (t1 - t0) / (samples - 1) as f64 } else { f64::INFINITY };
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
    let pct = |p: f64| if waits.is_empty() { 0.0 } else { waits[((waits.len() - 1) as f64 * p).round() as usize] };
    let seconds = started.elapsed().as_secs_f64();
    let (compute, memory) = (&m.compute, m.memory.as_ref());
    ModelReport {
        policy: String::new(),
        topology: m.spec.topology.to_string(),
        compute_units: compute.units(),
        memory_units: memory.unwrap_or(compute).units(),
        memory_unit_mib: {
            let units = memory.unwrap_or(compute);
            (0..units.units()).map(|u| units.cap(u)[pool::MEM]).max().unwrap_or(0)
        },
        cpu_milli: compute.total(pool::CPU),
        memory_mib: compute.total(pool::MEM) + memory.map_or(0, |p| p.total(pool::MEM)),
        average: Fractions::from_array(std::array::from_fn(avg)),
        unplaced: unplaced + oversized,
        oversized,
        placed,
        instant,
        waits: Waits { waited: waits.len(), p50_seconds: pct(0.5), p99_seconds: pct(0.99), max_seconds: waits.last().copied().unwrap_or(0.0) },
        peak_compute_on: peak_c,
        peak_memory_on: peak_m,
        average_remote_mib: if span > 0.0 { remote_sum / span } else { g.remote_mem },
        peak_remote_mib: peak_remote,
        events: w.events.len(),
        seconds,
        events_per_second: w.events.len() as f64 / seconds.max(1e-9),
        reliability: None,
        redundancy: None,
        audit,
        series,
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
            over |= m.memory.as_ref().is_none_or(|p| self.memory[u as usize] > p.cap(u as usize)[pool::MEM]);
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
        self.units_left_holding = self.compute.iter().filter(|c| c[0] > 0 || c[1] > 0).count() + self.memory.iter().filter(|m| **m > 0).count() + m.busy_units();
    }
}
