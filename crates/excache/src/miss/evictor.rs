//! The background evictor: one thread per pComponent that keeps free ways in the ExCache's
//! sets ahead of the misses, as kswapd keeps free pages ahead of allocations, so that a miss
//! rarely has to capture and drop a victim on its way.
//!
//! The reserve is per set, because a miss can only take a way of its own line's set: every
//! claim that leaves its set with fewer than `reserve` spare ways (free, or being freed here)
//! queues that set ([`MissPath::claimed`], on the miss path). The evictor sleeps until the
//! sets are short by enough lines to work in batches (the low watermark), then brings each
//! queued set back to `reserve` spare ways (the high watermark) with the policy's victims,
//! and sleeps again.
//!
//! Working in batches is what makes it cheaper than evicting inline, not only off the miss's
//! path: the victims of neighbouring sets are often neighbouring pages, and write-protecting
//! and punching a run of pages costs the kernel one TLB flush instead of one per page. Where
//! the policy's victims are scattered (a program that misses all over its heap fills lines,
//! and so lets them go, in no order of address), their neighbours that the policy would let
//! go soon too leave with them (`evict_beside`): a CPython program's evictor took out 1.4
//! pages per flush, each flush an interrupt of the program's CPU. Victims are captured and
//! dropped without the miss path's lock: a picked line is `Evicting`, still resident, and a
//! miss on it waits as on a line being filled. Dirty victims are then written
//! back together, per process and place, under the miss path's one failure rule
//! ([`MissPath::settle`]); clean ones are dropped, or offered to the compressed tier first.
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use splitos_rpc::PAGE_SIZE;

use super::{Held, LineState, MissPath, ProcHeap, Reserve, State, Writeback, PAGE};
use crate::dirty::Keep;
#[cfg(doc)]
use crate::region::Region;
use crate::store::Page;

/// Most lines one round of the evictor takes out: enough for the kernel's range operations
/// and one write-back message per place to pay, few enough that a miss on one of them does
/// not wait long.
const ROUND: usize = 64;

/// A line the evictor picked, between the lock hold that picked it and the one that drops it.
pub(super) struct Victim {
    pub(super) heap: Arc<ProcHeap>,
    pub(super) vpn: u64,
    pub(super) slot: usize,
    dirty: bool,
    /// Copied out before it is dropped: dirty, or clean and wanted by the compressed tier.
    capture: bool,
    data: Option<Page>,
    /// Write-protected: a write after the copy would trap, never go unseen.
    protected: bool,
    /// Punched out of its process.
    dropped: bool,
    /// Taken beside another victim ([`crate::cache::ExCache::pick_beside`]), in the same set
    /// as it when `for_others`: making room for another run's claims as it does.
    beside: bool,
    for_others: bool,
    /// Unmapped by access sampling when it was picked: the program may have touched it since.
    pub(super) unmapped: bool,
}

impl MissPath {
    /// Keeps `ways` spare ways in every set a claim used, with a background evictor that
    /// [`MissPath::run_evictor`] runs. `ways` must be less than the cache's ways per set.
    pub fn with_evictor(mut self, ways: usize) -> MissPath {
        let st = self.state.get_mut().unwrap();
        assert!(
            ways > 0 && ways < st.cache.ways(),
            "a reserve of {ways} ways in sets of {}",
            st.cache.ways()
        );
        let sets = st.cache.sets();
        // Lines short of the reserve, at most a round: a sixteenth of many sets a way short
        // each (a set that a batch is waiting to refill is rarely missed in again before the
        // refill), or half the reserve of a few sets, a fully associative cache's one. A
        // wake-up per miss would cost more than the inline eviction it saves.
        st.reserve = Some(Reserve {
            ways,
            wake_at: (ways * sets / 2).min(sets.div_ceil(16) * ways).clamp(1, ROUND),
            owed: 0,
            owed_by: HashMap::new(),
            short: VecDeque::new(),
            queued: vec![false; sets],
            beside: 0,
            stop: false,
        });
        self
    }

    /// Takes out up to `pages` pages on either side of each of the evictor's victims with it,
    /// where its policy would let them go soon too ([`crate::cache::ExCache::pick_beside`]).
    pub fn evicting_beside(mut self, pages: u64) -> MissPath {
        if let Some(r) = self.state.get_mut().unwrap().reserve.as_mut() {
            r.beside = pages;
        }
        self
    }

    /// The evictor's thread: sleeps until enough sets are short of their reserve, refills
    /// them, and again, until [`MissPath::stop_evictor`].
    pub fn run_evictor(&self) {
        // No program waits on its write-backs: its polling, and its mComponents' polling for
        // its next batch, would only take CPUs from the programs.
        splitos_rpc::poll::set_unhurried(true);
        loop {
            let mut g = self.state.lock().unwrap();
            loop {
                let r = g.reserve.as_ref().expect("the evictor runs only with a reserve");
                if r.stop {
                    return;
                }
                if r.owed >= r.wake_at {
                    break;
                }
                g = self.evictor_cv.wait(g).unwrap();
            }
            drop(g);
            let (t0, cpu0) = (Instant::now(), thread_cpu_ns());
            let served = self.refill();
            // The lines its policy asked to observe are unmapped here rather than after the
            // next miss, on a thread no program waits on.
            self.flush_unmaps();
            // Each process's run is charged its share of the round.
            let (ns, cpu) = (t0.elapsed().as_nanos() as u64, thread_cpu_ns().saturating_sub(cpu0));
            let lines: u64 = served.values().map(|(_, n)| n).sum();
            for (t, n) in served.values() {
                self.bump(t, |s| {
                    s.evictor_ns.fetch_add(ns * n / lines.max(1), Relaxed);
                    s.evictor_cpu_ns.fetch_add(cpu * n / lines.max(1), Relaxed);
                });
            }
        }
    }

    pub fn stop_evictor(&self) {
        if let Some(r) = self.state.lock().unwrap().reserve.as_mut() {
            r.stop = true;
        }
        self.evictor_cv.notify_all();
    }

    /// One round: takes queued sets back to their reserve, at most [`ROUND`] victims.
    /// Returns the processes whose lines it took, with how many.
    pub(super) fn refill(&self) -> HashMap<u64, (Arc<ProcHeap>, u64)> {
        self.evict_picked(self.pick())
    }

    /// Without the lock: takes lines marked `Evicting` out of their programs, in runs of
    /// neighbouring pages, and writes the dirty ones back; those that access sampling unmapped
    /// and the program touched since stay. Returns the processes whose lines it took, with how
    /// many.
    pub(super) fn evict_picked(&self, mut victims: Vec<Victim>) -> HashMap<u64, (Arc<ProcHeap>, u64)> {
        victims.sort_by_key(|v| (v.heap.pid, v.vpn));
        self.spare_touched(&mut victims);
        let mut served: HashMap<u64, (Arc<ProcHeap>, u64)> = HashMap::new();
        for v in &victims {
            served.entry(v.heap.pid).or_insert_with(|| (v.heap.clone(), 0)).1 += 1;
        }
        let mut wbs = Vec::new();
        let mut rest = &mut victims[..];
        while !rest.is_empty() {
            let (run, tail) = rest.split_at_mut(run_len(rest));
            self.bump(&run[0].heap, |s| {
                s.bg_eviction_runs.fetch_add(1, Relaxed);
            });
            self.take_out(run);
            self.finish(run, &mut wbs);
            rest = tail;
        }
        let wbs = self.stash(wbs);
        for wb in &wbs {
            self.bump(&wb.heap, |s| {
                s.bg_writebacks.fetch_add(1, Relaxed);
            });
        }
        for t in self.flush_apart(wbs) {
            self.bump(&t, |s| {
                s.bg_writeback_batches.fetch_add(1, Relaxed);
            });
        }
        served
    }

    /// Picks the victims of one round under the lock, marking them `Evicting`.
    fn pick(&self) -> Vec<Victim> {
        let mut g = self.state.lock().unwrap();
        let mut victims = Vec::new();
        let r = g.reserve.as_mut().expect("a reserve");
        let (want, beside) = (r.ways, r.beside);
        r.owed = 0;
        let owed_by = std::mem::take(&mut r.owed_by);
        while victims.len() < ROUND {
            let st = &mut *g;
            let r = st.reserve.as_mut().expect("a reserve");
            let Some(set) = r.short.pop_front() else { break };
            r.queued[set] = false;
            let before = victims.len();
            while st.cache.spare(set) < want {
                let Some(slot) = st.cache.pick(set) else { break };
                let by_others = self.made_room_for_others(st, &owed_by, st.cache.line(slot).pid);
                let victim = self.victim_at(st, slot);
                if let Some(v) = victim.as_ref().filter(|_| by_others) {
                    self.bump(&v.heap, |s| {
                        s.evicted_by_others.fetch_add(1, Relaxed);
                    });
                }
                // Within a round's bound, the victim counted; staged samples were never in the
                // program and are judged by the prefetcher as they leave, so they end a run.
                let reach = beside.min((ROUND.saturating_sub(victims.len() + 1) / 2) as u64);
                let run = if victim.is_some() && reach > 0 {
                    let staged = &st.staged;
                    st.cache
                        .pick_beside(slot, reach, |l| staged.contains_key(&(l.pid, l.vpn)))
                } else {
                    Vec::new()
                };
                victims.extend(victim);
                for s in run {
                    if let Some(mut v) = self.victim_at(st, s) {
                        v.beside = true;
                        v.for_others = by_others && st.cache.set_of(v.vpn) == set;
                        victims.push(v);
                    }
                }
            }
            // The policy may have cleared reference bits in the set (CLOCK).
            if let Some(v) = victims.get(before).map(|v| v.vpn) {
                self.rearm(&mut g, v);
            }
        }
        victims
    }

    /// Whether a victim of process `pid` makes room mostly for other runs' lines: the claims
    /// since the last round (`owed_by`) of processes outside its run outnumber its run's own,
    /// as a miss that evicts another run's line inline counts it.
    fn made_room_for_others(&self, st: &State, owed_by: &HashMap<u64, usize>, pid: u64) -> bool {
        let Some(own) = st.heaps.get(&pid) else { return false };
        let (mut mine, mut theirs) = (0, 0);
        // Processes gone since their claims count for nobody.
        for (h, n) in owed_by.iter().filter_map(|(p, n)| Some((st.heaps.get(p)?, n))) {
            if Arc::ptr_eq(&h.stats, &own.stats) {
                mine += n;
            } else {
                theirs += n;
            }
        }
        theirs > mine
    }

    /// Under the lock: the victim to take out for the line in `slot`, just marked
    /// `Evicting`; none if it could leave at once (its process is gone, or it is a staged
    /// sample, never in the program).
    pub(super) fn victim_at(&self, st: &mut State, slot: usize) -> Option<Victim> {
        let line = *st.cache.line(slot);
        let Some(t) = st.heaps.get(&line.pid).cloned() else {
            st.cache.remove(line.pid, line.vpn);
            return None;
        };
        // As evict(): a staged sample was never in the program, nothing to take out.
        if st.staged.remove(&(line.pid, line.vpn)).is_some() {
            st.cache.remove(line.pid, line.vpn);
            st.prefetcher.outcome(line.pid, false);
            self.bump(&t, |s| {
                s.evictions.fetch_add(1, Relaxed);
                s.bg_evictions.fetch_add(1, Relaxed);
                s.prefetch_sample_wasted.fetch_add(1, Relaxed);
            });
            return None;
        }
        // As evict(): a clean line the store holds is worth keeping compressed.
        let for_tier = !line.dirty
            && self.codec.is_some()
            && st.materialized.get(&line.pid).is_some_and(|s| s.contains(&line.vpn));
        let capture = (line.dirty || for_tier) && t.alive();
        Some(Victim {
            heap: t,
            vpn: line.vpn,
            slot,
            dirty: line.dirty,
            capture,
            data: None,
            protected: line.wp,
            dropped: false,
            beside: false,
            for_others: false,
            unmapped: line.unmapped,
        })
    }

    /// Without the lock: write-protects a run of neighbouring pages of one process, copies
    /// out those to capture and punches the others out, each in as few calls as the run
    /// allows. A line that could not be protected or copied is not dropped.
    fn take_out(&self, run: &mut [Victim]) {
        let (t, first) = (run[0].heap.clone(), run[0].vpn);
        let len = run.len() as u64;
        if t.region.takes_dirty() && run.iter().any(|v| v.capture && !v.protected) {
            return self.take_whole(&t, run);
        }
        if run.iter().any(|v| v.capture && !v.protected) {
            if let Err(e) = t.region.write_protect(first, len, true) {
                tracing::debug!(pid = t.pid, addr = first * PAGE, error = %e, "cannot write-protect victims; keeping them");
                return;
            }
            for v in run.iter_mut() {
                v.protected = true;
            }
        }
        for v in run.iter_mut().filter(|v| v.capture) {
            let mut data = vec![0u8; PAGE_SIZE];
            match t.region.read_out(v.vpn, &mut data) {
                Ok(()) => v.data = Some(data),
                Err(e) => {
                    tracing::debug!(pid = t.pid, addr = v.vpn * PAGE, error = %e, "cannot copy out a victim; keeping it")
                }
            }
        }
        for v in run.iter_mut() {
            v.dropped = !v.capture || v.data.is_some();
        }
        let mut i = 0;
        while i < run.len() {
            let n = run[i..].iter().take_while(|v| v.dropped == run[i].dropped).count();
            if run[i].dropped {
                // Splits a huge page the run cuts first (the pages it puts back keep their data).
                if let Err(why) = self.punch(&t, run[i].vpn, n as u64) {
                    self.fail(&t, &why.to_string());
                }
            }
            i += n;
        }
    }

    /// Without the lock: takes a run with a line to capture that is not write-protected out
    /// of its process in one step, with the contents of every page ([`Region::take`]), instead
    /// of protecting it for the copy. Pages taken without their contents (an error after the
    /// punch) are lost: the process is failed.
    fn take_whole(&self, t: &Arc<ProcHeap>, run: &mut [Victim]) {
        let (first, len) = (run[0].vpn, run.len() as u64);
        let taken = t.region.take(first, len, Keep::Dirty);
        for v in run.iter_mut() {
            v.dropped = true;
        }
        match taken {
            Ok(taken) => {
                let mut dirty = 0;
                for (v, tk) in run.iter_mut().zip(taken) {
                    if v.capture {
                        dirty += v.dirty as u64;
                        v.data = tk.data;
                    }
                }
                self.bump(t, |s| {
                    s.taken_dirty.fetch_add(dirty, Relaxed);
                });
            }
            Err(e) => self.fail(
                t,
                &format!(
                    "cannot take heap pages {:#x}..{:#x} out with their contents: {e}",
                    first * PAGE,
                    (first + len) * PAGE
                ),
            ),
        }
    }

    /// Under the lock: the dropped lines leave the cache, their copies in flight in `wbs`;
    /// the others stay, `Ready` again. A line its process gave up meanwhile is forgotten.
    fn finish(&self, run: &mut [Victim], wbs: &mut Vec<Writeback>) {
        let mut g = self.state.lock().unwrap();
        let (mut evicted, mut beside, mut for_others) = (0, 0, 0);
        for v in run.iter_mut() {
            let (pid, vpn) = (v.heap.pid, v.vpn);
            if g.cache.lookup(pid, vpn) != Some(v.slot) || g.cache.line(v.slot).state != LineState::Evicting {
                continue;
            }
            if !v.dropped {
                g.cache.keep(v.slot);
                g.cache.line_mut(v.slot).wp |= v.protected;
                continue;
            }
            let line = g.cache.remove(pid, vpn).expect("a picked line is resident");
            evicted += 1;
            beside += v.beside as u64;
            for_others += v.for_others as u64;
            let Some(data) = v.data.take() else { continue };
            if !self.needs_no_write_back(&g, &v.heap, &line, &data) {
                g.inflight.insert((pid, vpn));
                let held = if v.dirty { Held::Evicted } else { Held::Clean };
                wbs.push(Writeback {
                    heap: v.heap.clone(),
                    vpn,
                    data,
                    held,
                });
            }
        }
        drop(g);
        self.cv.notify_all();
        if evicted > 0 {
            self.bump(&run[0].heap, |s| {
                s.evictions.fetch_add(evicted, Relaxed);
                s.bg_evictions.fetch_add(evicted, Relaxed);
                s.evicted_beside.fetch_add(beside, Relaxed);
                s.evicted_by_others.fetch_add(for_others, Relaxed);
            });
        }
    }
}

/// How many of `victims` (sorted by process and page) from the first are neighbouring pages of
/// one process: a run, taken out in one step.
pub(super) fn run_len(victims: &[Victim]) -> usize {
    1 + victims
        .windows(2)
        .take_while(|w| w[1].heap.pid == w[0].heap.pid && w[1].vpn == w[0].vpn + 1)
        .count()
}

/// CPU time of the calling thread: what the evictor costs the machine, unlike its wall time,
/// which also counts waiting for the store and for a vCPU.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for clock_gettime to write.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
