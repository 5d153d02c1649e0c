//! The background evictor (evictor.rs): [`MissPath::refill`] is one round of its thread, run
//! here by hand between the program's accesses.
use super::*;

/// A miss path whose evictor keeps `reserve` spare ways in sets of `ways`.
fn rig_evictor(lines: usize, ways: usize, reserve: usize, places: u64) -> Rig {
    rig_beside(lines, ways, reserve, places, 0)
}

/// The same, its evictor taking up to `beside` pages on either side of a victim with it.
fn rig_beside(lines: usize, ways: usize, reserve: usize, places: u64, beside: u64) -> Rig {
    rig_policy(ExCache::new(lines, ways, Box::new(Fifo)), reserve, places, beside)
}

fn rig_policy(cache: ExCache, reserve: usize, places: u64, beside: u64) -> Rig {
    let store = MemStore::new(places);
    let failed = Arc::new(Mutex::new(Vec::new()));
    let f2 = failed.clone();
    let hook: FailHook = Box::new(move |t, why| f2.lock().unwrap().push((t.pid, why.to_string())));
    let mp = MissPath::new(parts(cache, store.clone(), hook));
    Rig {
        mp: Arc::new(mp.with_evictor(reserve).evicting_beside(beside)),
        store,
        failed,
    }
}

/// A call to a region: its name, first page and pages.
type Call = (&'static str, u64, u64);

/// A region that records its write-protect and punch calls and holds punches while its gate
/// is closed.
#[derive(Clone, Default)]
struct Watched {
    inner: MemRegion,
    calls: Arc<Mutex<Vec<Call>>>,
    closed: Arc<(Mutex<bool>, Condvar)>,
}

impl Watched {
    fn calls(&self, name: &str) -> Vec<(u64, u64)> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.0 == name)
            .map(|c| (c.1, c.2))
            .collect()
    }
    fn set_closed(&self, closed: bool) {
        *self.closed.0.lock().unwrap() = closed;
        self.closed.1.notify_all();
    }
}

impl Region for Watched {
    fn copy(&self, vpn: u64, data: &[u8], wp: bool) -> io::Result<Install> {
        self.inner.copy(vpn, data, wp)
    }
    fn zero(&self, vpn: u64, wp: bool) -> io::Result<Install> {
        self.inner.zero(vpn, wp)
    }
    fn wake(&self, vpn: u64) {
        self.inner.wake(vpn)
    }
    fn write_protect(&self, vpn: u64, pages: u64, on: bool) -> io::Result<()> {
        if on {
            self.calls.lock().unwrap().push(("write_protect", vpn, pages));
        }
        self.inner.write_protect(vpn, pages, on)
    }
    fn punch(&self, vpn: u64, pages: u64) -> io::Result<()> {
        self.calls.lock().unwrap().push(("punch", vpn, pages));
        let mut closed = self.closed.0.lock().unwrap();
        while *closed {
            closed = self.closed.1.wait(closed).unwrap();
        }
        self.inner.punch(vpn, pages)
    }
    fn read_out(&self, vpn: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_out(vpn, buf)
    }
}

fn watched(mp: &MissPath, pid: u64) -> (Prog, Watched) {
    let w = Watched::default();
    let t = ProcHeap::new(pid, Box::new(w.clone()), Arc::new(RunStats::default()));
    mp.add(t.clone(), Default::default());
    (
        Prog {
            t,
            mem: w.inner.clone(),
        },
        w,
    )
}

/// Sixteen lines in four sets of four, every way holding a dirty line of process 1: page `v`
/// holds `v + 1`.
fn full(r: &Rig, p: &Prog) {
    for v in 0..16 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    assert_eq!(p.stat(|s| &s.evictions), 0);
}

#[test]
fn the_evictor_frees_ways_ahead_of_misses_in_batches() {
    let r = rig_evictor(16, 4, 1, 1);
    let (p, w) = watched(&r.mp, 1);
    full(&r, &p);
    r.mp.refill();
    // Each set's oldest line (pages 0-3, neighbours) is protected and punched in one call
    // each, and the four are written back in one message.
    assert_eq!(
        (
            p.stat(|s| &s.bg_evictions),
            p.stat(|s| &s.bg_writebacks),
            p.stat(|s| &s.bg_writeback_batches)
        ),
        (4, 4, 1)
    );
    assert_eq!(w.calls("punch"), vec![(0, 4)]);
    assert_eq!(w.calls("write_protect"), vec![(0, 4)]);
    assert_eq!(r.store.calls("flush_many"), 1);
    assert_eq!(r.mp.with_cache(|c| c.used()), 12);
    // A miss in each set takes the spare way: none waits for a victim.
    for v in 16..20 {
        assert!(p.write(&r.mp, v, 1));
    }
    assert_eq!(p.stat(|s| &s.inline_evictions), 0);
    assert_eq!(
        r.store.calls.lock().unwrap().len(),
        1,
        "no write-back on the misses' way"
    );
    // With the reserve used up and the evictor not run, misses evict inline again.
    for v in 0..4 {
        assert_eq!(
            p.read(&r.mp, v),
            Some(v as u8 + 1),
            "page {v} comes back from the store"
        );
    }
    assert_eq!(p.stat(|s| &s.inline_evictions), 4);
    assert_eq!(p.stat(|s| &s.evictions), 8);
    assert!(r.failed().is_empty());
}

#[test]
fn scattered_victims_take_their_old_neighbours_out_in_one_punch_each() {
    // One set of 32 ways, filled a page in eight at a time (0, 8, 16, 24, 1, 9, ...): FIFO's
    // oldest lines, 0, 8, 16 and 24, are a page apart from each other's runs.
    let order: Vec<u64> = (0..8).flat_map(|i| [i, i + 8, i + 16, i + 24]).collect();
    let run = |beside| {
        let r = rig_beside(32, 32, 4, 1, beside);
        let (p, w) = watched(&r.mp, 1);
        for &v in &order {
            assert!(p.write(&r.mp, v, v as u8 + 1));
        }
        r.mp.refill();
        assert!(r.failed().is_empty());
        for v in 0..32 {
            assert_eq!(p.read(&r.mp, v), Some(v as u8 + 1), "page {v}");
        }
        let runs = p.stat(|s| &s.bg_eviction_runs);
        assert_eq!(runs, w.calls("punch").len() as u64);
        (
            w.calls("punch"),
            p.stat(|s| &s.bg_evictions),
            p.stat(|s| &s.evicted_beside),
        )
    };
    assert_eq!(run(0), (vec![(0, 1), (8, 1), (16, 1), (24, 1)], 4, 0));
    // Page 1 was filled fifth, old enough; page 2 was the ninth of 32, after the first
    // quarter, too young: each run ends there.
    assert_eq!(run(3), (vec![(0, 2), (8, 2)], 4, 2));
}

#[test]
fn a_failed_background_write_back_fails_the_victims_process_and_nothing_else() {
    // Place = vpn % 2: the victims at even pages go to place 0, which refuses write-backs.
    let r = rig_evictor(16, 4, 1, 2);
    let other = r.prog(2);
    let p = r.prog(1);
    full(&r, &p);
    r.store.failing.lock().unwrap().insert(0);
    r.mp.refill();
    let failed = r.failed();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, 1);
    assert!(
        failed[0].1.contains("mComponent 0") && failed[0].1.contains("only copy"),
        "{}",
        failed[0].1
    );
    assert!(!p.t.alive());
    // Never zeros for a lost page: the process is not served any more.
    assert_eq!(p.read(&r.mp, 0), None);
    // The victims at the other place were written back; other processes go on.
    assert_eq!(r.stored(1, 1), Some(2));
    assert!(other.write(&r.mp, 1, 5));
    assert_eq!(other.read(&r.mp, 1), Some(5));
}

#[test]
fn a_miss_on_a_victim_waits_for_its_background_write_back() {
    let r = rig_evictor(16, 4, 1, 1);
    let p = Arc::new(r.prog(1));
    full(&r, &p);
    r.store.set_gate(false);
    let mp = r.mp.clone();
    let evictor = std::thread::spawn(move || mp.refill());
    while r.store.calls("flush_many") == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let done = Arc::new(AtomicBool::new(false));
    let (mp, p2, d2) = (r.mp.clone(), p.clone(), done.clone());
    let reader = std::thread::spawn(move || {
        let v = p2.read(&mp, 2);
        d2.store(true, Ordering::SeqCst);
        v
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !done.load(Ordering::SeqCst),
        "the miss must wait for the write-back of its page"
    );
    r.store.set_gate(true);
    evictor.join().unwrap();
    assert_eq!(reader.join().unwrap(), Some(3));
    assert!(r.failed().is_empty());
}

#[test]
fn a_write_to_a_line_being_evicted_waits_and_is_kept() {
    let r = rig_evictor(16, 4, 1, 1);
    let (p, w) = watched(&r.mp, 1);
    let p = Arc::new(p);
    full(&r, &p);
    // The evictor stops in the punch: pages 0-3 are protected and copied, still resident.
    w.set_closed(true);
    let mp = r.mp.clone();
    let evictor = std::thread::spawn(move || mp.refill());
    while w.calls("punch").is_empty() {
        std::thread::sleep(Duration::from_millis(1));
    }
    let done = Arc::new(AtomicBool::new(false));
    let (mp, p2, d2) = (r.mp.clone(), p.clone(), done.clone());
    let writer = std::thread::spawn(move || {
        let ok = p2.write(&mp, 1, 99);
        d2.store(true, Ordering::SeqCst);
        ok
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !done.load(Ordering::SeqCst),
        "a write to a line being evicted waits for the eviction"
    );
    w.set_closed(false);
    evictor.join().unwrap();
    assert!(writer.join().unwrap());
    // The write landed on the line fetched back, after the copy taken for the write-back.
    assert_eq!(r.stored(1, 1), Some(2));
    r.mp.evict_range(&p.t, 0, 32).unwrap();
    assert_eq!(p.read(&r.mp, 1), Some(99));
    assert!(r.failed().is_empty());
}

#[test]
fn a_victim_that_cannot_be_copied_out_stays_resident_and_dirty() {
    let r = rig_evictor(16, 4, 1, 1);
    let (p, fail_read) = flaky(&r.mp, 1);
    full(&r, &p);
    fail_read.store(true, Ordering::SeqCst);
    r.mp.refill();
    assert!(r.failed().is_empty(), "nothing was lost: nobody is failed");
    assert_eq!(p.stat(|s| &s.bg_evictions), 3);
    let l =
        r.mp.with_cache(|c| c.lookup(1, 0).map(|s| *c.line(s)))
            .expect("page 0 stays");
    assert!(l.dirty && l.wp && l.state == LineState::Ready, "{l:?}");
    assert_eq!(r.stored(1, 0), None);
    // Protected by the attempt: its next write traps and is seen.
    assert!(p.write(&r.mp, 0, 50));
    assert_eq!(p.stat(|s| &s.wp_faults), 1);
    r.mp.evict_range(&p.t, 0, 32).unwrap();
    assert_eq!(p.read(&r.mp, 0), Some(50));
}

#[test]
fn the_evictor_thread_sleeps_until_sets_run_short_and_stops_when_told() {
    // 64 sets with a reserve of one way: four lines short wake the evictor.
    let r = rig_evictor(256, 4, 1, 1);
    let p = r.prog(1);
    let mp = r.mp.clone();
    let evictor = std::thread::spawn(move || mp.run_evictor());
    for v in 0..1024 {
        assert!(p.write(&r.mp, v, v as u8));
    }
    let t0 = Instant::now();
    while p.stat(|s| &s.bg_evictions) == 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    r.mp.stop_evictor();
    evictor.join().unwrap();
    assert!(p.stat(|s| &s.bg_evictions) > 0);
    assert_eq!(
        p.stat(|s| &s.evictions),
        p.stat(|s| &s.bg_evictions) + p.stat(|s| &s.inline_evictions)
    );
    for v in 0..1024 {
        assert_eq!(p.read(&r.mp, v), Some(v as u8), "page {v}");
    }
    assert!(r.failed().is_empty());
}

/// One set of 64 under sampled workingset, filled by one process, its evictor keeping 2 ways
/// spare: the 8 lines nearest the head of the inactive list wait unmapped.
fn sampled_and_full() -> (Rig, Prog) {
    let r = rig_policy(ExCache::new(64, 64, Box::new(Workingset::new(64, true))), 2, 1, 0);
    let p = r.mp_prog(1, true);
    for v in 0..64 {
        assert!(p.write(&r.mp, v, v as u8));
    }
    (r, p)
}

#[test]
fn the_evictor_keeps_a_sampled_victim_the_program_touched_and_lets_the_others_go() {
    let (r, p) = sampled_and_full();
    r.mp.refill();
    r.mp.flush_unmaps();
    let waiting: Vec<u64> = {
        let mut u: Vec<u64> = p.mem.0.unmapped.lock().unwrap().iter().copied().collect();
        u.sort_unstable();
        u
    };
    assert!(
        waiting.len() >= 4,
        "lines wait unmapped at the inactive head: {waiting:?}"
    );
    // The program reads the first two waiting; the kernel maps them again, nobody is told.
    for v in &waiting[..2] {
        assert_eq!(p.read(&r.mp, *v), Some(*v as u8));
    }
    let fetches = r.store.calls("fetch");
    // New lines take the spare ways; the evictor refills the reserve from the waiting lines.
    for v in 100..104 {
        assert!(p.write(&r.mp, v, 1));
        r.mp.refill();
    }
    let g = r.mp.state.lock().unwrap();
    for v in &waiting[..2] {
        assert!(g.cache.lookup(1, *v).is_some(), "touched line {v} stays");
    }
    let gone: Vec<u64> = waiting[2..]
        .iter()
        .copied()
        .filter(|v| g.cache.lookup(1, *v).is_none())
        .collect();
    assert!(!gone.is_empty(), "untouched waiting lines leave: {waiting:?}");
    drop(g);
    assert_eq!(p.stat(|s| &s.sample_touches), 2);
    for v in &waiting[..2] {
        assert_eq!(p.read(&r.mp, *v), Some(*v as u8));
    }
    assert_eq!(
        r.store.calls("fetch"),
        fetches,
        "the touched lines were never fetched again"
    );
}

#[test]
fn a_sampled_victim_not_unmapped_yet_is_not_taken_for_touched() {
    let (r, p) = sampled_and_full();
    // The lines at the inactive head are queued to be unmapped, but no batch is flushed: they
    // are still mapped, which says nothing of whether the program used them.
    r.mp.refill();
    r.mp.unmaps_due.store(false, Ordering::Relaxed);
    for v in 100..104 {
        assert!(p.write(&r.mp, v, 1));
        r.mp.refill();
        r.mp.unmaps_due.store(false, Ordering::Relaxed);
    }
    assert_eq!(p.stat(|s| &s.sample_unmaps), 0, "nothing was unmapped");
    assert_eq!(p.stat(|s| &s.sample_touches), 0, "no touch was seen");
    let g = r.mp.state.lock().unwrap();
    assert!(
        (2..6).all(|v| g.cache.lookup(1, v).is_none()),
        "the head of the inactive list left as without sampling"
    );
}

#[test]
fn a_line_resized_out_leaves_even_if_touched_since_sampling_unmapped_it() {
    let r = rig_policy(
        ExCache::growable(16, 16, 0, Box::new(Workingset::new(16, true))),
        2,
        1,
        0,
    );
    let p = r.mp_prog(1, true);
    for v in 0..16 {
        assert!(p.write(&r.mp, v, v as u8));
    }
    {
        let mut g = r.mp.state.lock().unwrap();
        for v in 0..16 {
            let s = g.cache.lookup(1, v).unwrap();
            g.cache.line_mut(s).unmapped = true;
        }
    }
    p.mem.unmap(&(0..16).collect::<Vec<u64>>()).unwrap();
    // Every line touched again since: each would stay, were it asked.
    for v in 0..16 {
        assert_eq!(p.read(&r.mp, v), Some(v as u8));
    }
    assert_eq!(r.mp.reconfigure(Some(8), None).unwrap(), 8);
    assert!(r.mp.state.lock().unwrap().cache.beyond().is_empty());
    assert_eq!(p.stat(|s| &s.sample_touches), 0, "lines past the end are not asked");
    for v in 0..16 {
        assert_eq!(p.read(&r.mp, v), Some(v as u8), "page {v} kept its contents");
    }
}
