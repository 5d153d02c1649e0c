//! The miss path driven with an in-memory page store and region: no userfaultfd, no
//! processes. A "program" here reads and writes the first byte of pages through the region
//! and faults into the miss path exactly where a real one would trap.
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use splitos_rpc::{ErrCode, Refusal, ERR, PAGE_SIZE};

use super::*;
use crate::cache::{Clock, EvictionPolicy, ExCache, Fifo, GhostClock, Workingset};
use crate::huge::{SplitError, EXTENT};
use crate::region::Install;
use crate::store::Place;
use crate::tier::{Codec, Lz4, OldestFirst};

#[derive(Default)]
struct RegionPages {
    /// Contents and write protection of resident pages.
    pages: Mutex<HashMap<u64, (Vec<u8>, bool)>>,
    /// The kernel tracks writes (dirty tracking by scan): a write to a protected page lifts the
    /// protection without a fault, and an unprotected page counts as written.
    tracked: AtomicBool,
    /// Access sampling: resident pages may be unmapped; touching one maps it again, as the
    /// kernel's minor fault does, unseen by the miss path.
    sampling: AtomicBool,
    unmapped: Mutex<HashSet<u64>>,
}

#[derive(Clone, Default)]
struct MemRegion(Arc<RegionPages>);

impl Region for MemRegion {
    fn copy(&self, vpn: u64, data: &[u8], wp: bool) -> io::Result<Install> {
        let mut p = self.0.pages.lock().unwrap();
        if p.contains_key(&vpn) {
            return Ok(Install::Exists);
        }
        p.insert(vpn, (data.to_vec(), wp));
        self.0.unmapped.lock().unwrap().remove(&vpn);
        Ok(Install::Done)
    }
    fn zero(&self, vpn: u64, wp: bool) -> io::Result<Install> {
        self.copy(vpn, &[0u8; PAGE_SIZE], wp)
    }
    fn wake(&self, _vpn: u64) {}
    fn write_protect(&self, vpn: u64, pages: u64, on: bool) -> io::Result<()> {
        let mut p = self.0.pages.lock().unwrap();
        for v in vpn..vpn + pages {
            if let Some(e) = p.get_mut(&v) {
                e.1 = on;
            }
        }
        Ok(())
    }
    fn punch(&self, vpn: u64, pages: u64) -> io::Result<()> {
        let mut p = self.0.pages.lock().unwrap();
        p.retain(|v, _| *v < vpn || *v >= vpn + pages);
        self.0
            .unmapped
            .lock()
            .unwrap()
            .retain(|v| *v < vpn || *v >= vpn + pages);
        Ok(())
    }
    fn samples(&self) -> bool {
        self.0.sampling.load(Ordering::Relaxed)
    }
    fn unmap(&self, vpns: &[u64]) -> io::Result<()> {
        let p = self.0.pages.lock().unwrap();
        self.0
            .unmapped
            .lock()
            .unwrap()
            .extend(vpns.iter().filter(|v| p.contains_key(v)));
        Ok(())
    }
    fn present(&self, first: u64, end: u64) -> io::Result<Vec<u64>> {
        let p = self.0.pages.lock().unwrap();
        let u = self.0.unmapped.lock().unwrap();
        Ok((first..end).filter(|v| p.contains_key(v) && !u.contains(v)).collect())
    }
    fn read_out(&self, vpn: u64, buf: &mut [u8]) -> io::Result<()> {
        let p = self.0.pages.lock().unwrap();
        let (d, _) = p
            .get(&vpn)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "not resident"))?;
        buf.copy_from_slice(d);
        Ok(())
    }
    fn tracks_writes(&self) -> bool {
        self.0.tracked.load(Ordering::Relaxed)
    }
    fn written(&self, first: u64, end: u64) -> io::Result<Vec<u64>> {
        let mut p = self.0.pages.lock().unwrap();
        let mut w = Vec::new();
        for (v, e) in p.iter_mut().filter(|(v, _)| (first..end).contains(*v)) {
            if !e.1 {
                e.1 = true;
                w.push(*v);
            }
        }
        w.sort();
        Ok(w)
    }
    fn take(&self, vpn: u64, pages: u64, keep: crate::Keep) -> io::Result<Vec<crate::Taken>> {
        let mut p = self.0.pages.lock().unwrap();
        Ok((vpn..vpn + pages)
            .map(|v| {
                let (data, wp) = p.remove(&v).unwrap_or_else(|| (vec![0; PAGE_SIZE], false));
                let written = !wp || keep == crate::Keep::Dirty;
                crate::Taken {
                    vpn: v,
                    written,
                    data: (written || keep == crate::Keep::All).then_some(data),
                }
            })
            .collect())
    }
}

/// A page store in memory. Places are `vpn % places`; flushes to a place in `failing` are
/// refused; with `gate` closed, flushes wait until it opens.
struct MemStore {
    places: u64,
    pages: Mutex<HashMap<(u64, u64), Vec<u8>>>,
    failing: Mutex<HashSet<Place>>,
    calls: Mutex<Vec<&'static str>>,
    gate: (Mutex<bool>, Condvar),
}

impl MemStore {
    fn new(places: u64) -> Arc<MemStore> {
        Arc::new(MemStore {
            places,
            pages: Mutex::default(),
            failing: Mutex::default(),
            calls: Mutex::default(),
            gate: (Mutex::new(true), Condvar::new()),
        })
    }
    fn calls(&self, name: &str) -> usize {
        self.calls.lock().unwrap().iter().filter(|c| **c == name).count()
    }
    fn store(&self, pid: u64, vpn: u64, data: &[u8]) -> Result<(), Refusal> {
        let place = self.place(pid, vpn)?;
        let mut open = self.gate.0.lock().unwrap();
        while !*open {
            open = self.gate.1.wait(open).unwrap();
        }
        if self.failing.lock().unwrap().contains(&place) {
            return Err(ERR::new(
                ErrCode::Unreachable,
                format!(
                    "mComponent {place} at test: cannot write back heap page {:#x}",
                    vpn * 4096
                ),
            ));
        }
        self.pages.lock().unwrap().insert((pid, vpn), data.to_vec());
        Ok(())
    }
    fn load(&self, pid: u64, vpn: u64) -> Result<Page, Refusal> {
        // A fetch of a page that was never written back is a bug of the miss path.
        self.pages
            .lock()
            .unwrap()
            .get(&(pid, vpn))
            .cloned()
            .ok_or_else(|| ERR::new(ErrCode::NotFound, format!("page {vpn} of {pid} was never stored")))
    }
    fn set_gate(&self, open: bool) {
        *self.gate.0.lock().unwrap() = open;
        self.gate.1.notify_all();
    }
}

impl PageStore for MemStore {
    fn place(&self, _pid: u64, vpn: u64) -> Result<Place, Refusal> {
        Ok((vpn % self.places) as Place)
    }
    fn fetch(&self, pid: u64, vpn: u64) -> Result<Page, Refusal> {
        self.calls.lock().unwrap().push("fetch");
        self.load(pid, vpn)
    }
    fn flush(&self, pid: u64, vpn: u64, data: &[u8]) -> Result<(), Refusal> {
        self.calls.lock().unwrap().push("flush");
        self.store(pid, vpn, data)
    }
    fn flush_fetch(&self, (fp, fv, data): (u64, u64, &[u8]), (pid, vpn): (u64, u64)) -> Result<Page, Refusal> {
        self.calls.lock().unwrap().push("flush_fetch");
        self.store(fp, fv, data)?;
        self.load(pid, vpn)
    }
    fn fetch_many(&self, pid: u64, vpns: &[u64]) -> Result<Vec<Page>, Refusal> {
        self.calls.lock().unwrap().push("fetch_many");
        vpns.iter().map(|v| self.load(pid, *v)).collect()
    }
    fn flush_fetch_many(&self, flushes: &[(u64, u64, &[u8])], pid: u64, vpns: &[u64]) -> Result<Vec<Page>, Refusal> {
        self.calls.lock().unwrap().push("flush_fetch_many");
        for (fp, fv, data) in flushes {
            self.store(*fp, *fv, data)?;
        }
        vpns.iter().map(|v| self.load(pid, *v)).collect()
    }
    fn flush_many(&self, pid: u64, pages: &[(u64, &[u8])]) -> Result<(), Refusal> {
        self.calls.lock().unwrap().push("flush_many");
        for (v, d) in pages {
            self.store(pid, *v, d)?;
        }
        Ok(())
    }
}

struct Rig {
    mp: Arc<MissPath>,
    store: Arc<MemStore>,
    failed: Arc<Mutex<Vec<(u64, String)>>>,
}

fn rig(lines: usize, ways: usize, policy: Box<dyn EvictionPolicy>, places: u64, piggyback: bool) -> Rig {
    rig_with(lines, ways, policy, places, piggyback, 0)
}

fn rig_with(
    lines: usize,
    ways: usize,
    policy: Box<dyn EvictionPolicy>,
    places: u64,
    piggyback: bool,
    prefetch: usize,
) -> Rig {
    rig_full(lines, ways, policy, places, piggyback, (prefetch, 0, 0))
}

/// `levers`: lines read ahead, installed around a first touch, and pre-allocated past those.
fn rig_full(
    lines: usize,
    ways: usize,
    policy: Box<dyn EvictionPolicy>,
    places: u64,
    piggyback: bool,
    levers: (usize, usize, usize),
) -> Rig {
    let (prefetch, fault_around, prealloc) = levers;
    let store = MemStore::new(places);
    let failed = Arc::new(Mutex::new(Vec::new()));
    let f2 = failed.clone();
    let hook: FailHook = Box::new(move |t, why| f2.lock().unwrap().push((t.pid, why.to_string())));
    let prefetcher = crate::prefetcher(splitos_core::config::PrefetchPolicy::Sequential, prefetch);
    let mp = Arc::new(MissPath::new(MissPathParts {
        prefetcher,
        piggyback,
        fault_around,
        prealloc,
        ..parts(ExCache::new(lines, ways, policy), store.clone(), hook)
    }));
    Rig { mp, store, failed }
}

/// A miss path's parts with piggyback on, no read-ahead and no fresh lines.
fn parts(cache: ExCache, store: Arc<MemStore>, on_fail: FailHook) -> MissPathParts {
    MissPathParts {
        cache,
        store,
        prefetcher: crate::prefetcher(splitos_core::config::PrefetchPolicy::Sequential, 0),
        piggyback: true,
        fault_around: 0,
        prealloc: 0,
        // Every first touch gets the whole window, as the tests of fresh lines count it.
        window_start: usize::MAX,
        on_fail,
    }
}

/// A process as the test drives it.
struct Prog {
    t: Arc<ProcHeap>,
    mem: MemRegion,
}

impl Rig {
    fn prog(&self, pid: u64) -> Prog {
        self.prog_tracked(pid, false)
    }
    /// A process whose writes the kernel tracks (`tracked`) or that traps on them.
    fn prog_tracked(&self, pid: u64, tracked: bool) -> Prog {
        self.prog_with(pid, tracked, false)
    }
    /// A process whose accesses are sampled (`sampling`).
    fn prog_with(&self, pid: u64, tracked: bool, sampling: bool) -> Prog {
        let mem = MemRegion::default();
        mem.0.tracked.store(tracked, Ordering::Relaxed);
        mem.0.sampling.store(sampling, Ordering::Relaxed);
        let t = ProcHeap::new(pid, Box::new(mem.clone()), Arc::new(RunStats::default()));
        self.mp.add(t.clone(), Default::default());
        Prog { t, mem }
    }
    fn failed(&self) -> Vec<(u64, String)> {
        self.failed.lock().unwrap().clone()
    }
}

impl Prog {
    /// The first byte of page `vpn`, faulting it in; `None` once the process was failed.
    fn read(&self, mp: &MissPath, vpn: u64) -> Option<u8> {
        for _ in 0..8 {
            self.mem.0.unmapped.lock().unwrap().remove(&vpn);
            if let Some((d, _)) = self.mem.0.pages.lock().unwrap().get(&vpn) {
                return Some(d[0]);
            }
            if !self.t.alive() {
                return None;
            }
            mp.fault(&self.t, vpn, Access::Read, Instant::now());
        }
        None
    }
    /// Writes the first byte of page `vpn`; false once the process was failed.
    fn write(&self, mp: &MissPath, vpn: u64, b: u8) -> bool {
        for _ in 0..8 {
            self.mem.0.unmapped.lock().unwrap().remove(&vpn);
            let tracked = self.mem.0.tracked.load(Ordering::Relaxed);
            let access = match self.mem.0.pages.lock().unwrap().get_mut(&vpn) {
                Some((d, wp)) if !*wp || tracked => {
                    *wp = false;
                    d[0] = b;
                    return true;
                }
                Some(_) => Access::WriteProtect,
                None => Access::Write,
            };
            if !self.t.alive() {
                return false;
            }
            mp.fault(&self.t, vpn, access, Instant::now());
        }
        false
    }
    fn stat(&self, f: impl Fn(&RunStats) -> &std::sync::atomic::AtomicU64) -> u64 {
        f(&self.t.stats).load(Ordering::Relaxed)
    }
}

#[test]
fn p_local_lines_need_no_message_and_come_back_after_eviction() {
    let r = rig(2, 0, Box::new(Fifo), 1, true);
    let p = r.prog(1);
    assert!(p.write(&r.mp, 10, 7));
    assert!(p.write(&r.mp, 11, 8));
    assert_eq!(
        r.store.calls.lock().unwrap().len(),
        0,
        "first touches are p-local: no message"
    );
    assert_eq!(p.stat(|s| &s.plocal_fills), 2);
    assert!(p.write(&r.mp, 12, 9), "a third line evicts the oldest");
    assert_eq!(r.store.calls("flush"), 1, "the dirty victim was written back");
    assert_eq!(
        p.read(&r.mp, 10),
        Some(7),
        "the evicted line comes back with its contents"
    );
    assert_eq!(r.store.calls("flush_fetch") + r.store.calls("fetch"), 1);
    assert!(r.failed().is_empty());
}

#[test]
fn clean_victims_are_dropped_without_a_message() {
    let r = rig(2, 0, Box::new(Fifo), 1, true);
    let p = r.prog(1);
    assert!(p.write(&r.mp, 1, 1));
    assert!(p.write(&r.mp, 2, 2));
    assert!(p.write(&r.mp, 3, 3));
    assert!(p.write(&r.mp, 4, 4));
    let messages = r.store.calls.lock().unwrap().len();
    // Page 1 is fetched back (clean, write-protected) and evicted again: no flush for it.
    assert_eq!(p.read(&r.mp, 1), Some(1));
    assert_eq!(p.read(&r.mp, 2), Some(2));
    let flushes_before = r.store.calls("flush") + r.store.calls("flush_fetch");
    assert_eq!(p.read(&r.mp, 3), Some(3), "evicts clean page 1");
    assert_eq!(
        r.store.calls("flush") + r.store.calls("flush_fetch"),
        flushes_before,
        "a clean victim needs no write-back"
    );
    assert!(r.store.calls.lock().unwrap().len() > messages);
    assert!(p.stat(|s| &s.evictions) >= 4);
}

#[test]
fn eviction_follows_the_policy() {
    for (policy, keeps_rewritten) in [
        (Box::new(Fifo) as Box<dyn EvictionPolicy>, false),
        (Box::new(Clock), true),
    ] {
        let name = policy.name();
        let r = rig(3, 0, policy, 1, true);
        let p = r.prog(1);
        for v in 0..3 {
            assert!(p.write(&r.mp, v, v as u8 + 1));
        }
        // Both evict page 0; CLOCK also clears the reference bits of 1 and 2 and
        // write-protects them again so that their next write is seen.
        assert!(p.write(&r.mp, 3, 4));
        assert!(p.write(&r.mp, 1, 20));
        assert_eq!(
            p.stat(|s| &s.wp_faults),
            keeps_rewritten as u64,
            "{name}: only CLOCK watches the rewrite"
        );
        // FIFO evicts the oldest fill, page 1; CLOCK spares the re-referenced page 1 and evicts 2.
        assert!(p.write(&r.mp, 4, 5));
        let resident: Vec<u64> =
            r.mp.with_cache(|c| c.resident_in(1, 0, 10).into_iter().map(|(v, _)| v).collect());
        assert_eq!(resident.contains(&1), keeps_rewritten, "{name}: {resident:?}");
        assert_eq!(resident.contains(&2), !keeps_rewritten, "{name}: {resident:?}");
        for (v, want) in [(0u64, 1u8), (1, 20), (2, 3), (3, 4), (4, 5)] {
            assert_eq!(p.read(&r.mp, v), Some(want), "{name}: page {v} keeps its contents");
        }
    }
}

#[test]
fn piggyback_merges_the_victims_flush_with_the_fetch_only_when_enabled() {
    for piggyback in [true, false] {
        let r = rig(2, 0, Box::new(Fifo), 1, piggyback);
        let p = r.prog(1);
        for v in 0..4 {
            assert!(p.write(&r.mp, v, v as u8 + 1));
        }
        // Pages 0 and 1 are on the store; 2 and 3 are dirty and resident.
        assert_eq!(p.read(&r.mp, 0), Some(1));
        assert_eq!(
            r.store.calls("flush_fetch"),
            piggyback as usize,
            "piggyback={piggyback}"
        );
        assert_eq!(r.store.calls("fetch"), !piggyback as usize);
        assert_eq!(p.stat(|s| &s.piggybacked), piggyback as u64);
    }
}

#[test]
fn a_victims_failed_write_back_fails_its_own_process_not_silently() {
    // Place = vpn % 2: process 1's pages at even vpns go to place 0, which refuses flushes.
    let r = rig(2, 0, Box::new(Fifo), 2, true);
    let victim = r.prog(1);
    let other = r.prog(2);
    assert!(victim.write(&r.mp, 10, 42));
    assert!(victim.write(&r.mp, 12, 43));
    r.store.failing.lock().unwrap().insert(0);
    // Process 2 misses on a p-local page: process 1's dirty line 10 is the victim.
    assert!(other.write(&r.mp, 21, 5));
    let failed = r.failed();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, 1, "the victim's process is failed, not the faulting one");
    assert!(
        failed[0].1.contains("mComponent 0"),
        "the error names the component: {}",
        failed[0].1
    );
    assert!(!victim.t.alive());
    assert!(other.t.alive(), "the faulting process goes on");
    // The victim can never see its page as zeros: it is no longer served at all.
    assert_eq!(victim.read(&r.mp, 10), None);
    assert_eq!(other.read(&r.mp, 21), Some(5));
}

#[test]
fn a_failed_piggybacked_write_back_fails_its_own_process_and_the_fetch_goes_alone() {
    let r = rig(2, 0, Box::new(Fifo), 1, true);
    let victim = r.prog(1);
    let other = r.prog(2);
    // Process 2 has a page on the store, then process 1 fills the cache with dirty lines.
    assert!(other.write(&r.mp, 1, 11));
    assert!(other.write(&r.mp, 2, 12));
    assert!(victim.write(&r.mp, 3, 13));
    assert!(victim.write(&r.mp, 4, 14));
    r.store.failing.lock().unwrap().insert(0);
    let calls = |r: &Rig| {
        (
            r.store.calls("flush_fetch"),
            r.store.calls("flush"),
            r.store.calls("fetch"),
        )
    };
    let before = calls(&r);
    // Process 2 misses on page 1 (on the store): victim line 3 of process 1 rides along, and
    // its write-back fails. Process 2, perhaps of another vNode, gets its page all the same.
    assert_eq!(other.read(&r.mp, 1), Some(11));
    let failed = r.failed();
    assert_eq!(
        failed.iter().map(|f| f.0).collect::<Vec<_>>(),
        vec![1],
        "only the victim's process is failed: {failed:?}"
    );
    assert!(
        failed[0].1.contains("heap page 0x3000"),
        "with the error of its own page: {}",
        failed[0].1
    );
    assert_eq!(
        calls(&r),
        (before.0 + 1, before.1 + 1, before.2 + 1),
        "the victim written back apart, the page fetched alone"
    );
    assert_eq!(victim.read(&r.mp, 3), None, "never zeros for the lost page");
    assert!(other.t.alive());
}

#[test]
fn a_miss_waits_for_the_write_back_of_the_same_line() {
    let r = rig(1, 0, Box::new(Fifo), 1, false);
    let p = Arc::new(r.prog(1));
    assert!(p.write(&r.mp, 0, 77));
    r.store.set_gate(false);
    // Another page evicts page 0, whose write-back now hangs on the store.
    let (mp, p2) = (r.mp.clone(), p.clone());
    let evictor = std::thread::spawn(move || p2.write(&mp, 1, 1));
    while r.store.calls("flush") == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let done = Arc::new(AtomicBool::new(false));
    let (mp, p3, d2) = (r.mp.clone(), p.clone(), done.clone());
    let reader = std::thread::spawn(move || {
        let v = p3.read(&mp, 0);
        d2.store(true, Ordering::SeqCst);
        v
    });
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !done.load(Ordering::SeqCst),
        "the miss on page 0 must wait for its write-back"
    );
    r.store.set_gate(true);
    assert!(evictor.join().unwrap());
    // Had it not waited, it would have fetched a page the store never had and been failed.
    assert_eq!(reader.join().unwrap(), Some(77), "it then reads what was written back");
    assert!(r.failed().is_empty());
}

#[test]
fn a_range_write_back_keeps_lines_dirty_until_acknowledged() {
    let r = rig(8, 0, Box::new(Fifo), 1, true);
    let p = r.prog(1);
    for v in 0..4 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    r.store.failing.lock().unwrap().insert(0);
    assert!(r.mp.write_back_range(&p.t, 0, 8).is_err());
    let dirty =
        r.mp.with_cache(|c| c.resident_in(1, 0, 8).iter().filter(|(_, s)| c.line(*s).dirty).count());
    assert_eq!(dirty, 4, "a failed write-back leaves every line dirty and resident");
    assert!(r.failed().is_empty(), "nothing was lost, so nobody is failed");
    r.store.failing.lock().unwrap().clear();
    assert!(r.mp.write_back_range(&p.t, 0, 8).is_ok());
    assert_eq!(
        r.store.calls("flush_many"),
        2,
        "one batched message per place each time"
    );
    let dirty =
        r.mp.with_cache(|c| c.resident_in(1, 0, 8).iter().filter(|(_, s)| c.line(*s).dirty).count());
    assert_eq!(dirty, 0);
    assert_eq!(r.store.pages.lock().unwrap().get(&(1, 3)).map(|d| d[0]), Some(4));
    // A write after the write-back traps (the line is write-protected again) and makes it dirty.
    assert!(p.write(&r.mp, 2, 99));
    assert_eq!(p.stat(|s| &s.wp_faults), 1);
}

#[test]
fn reads_then_writes_are_predicted_and_installed_writable() {
    let r = rig(256, 0, Box::new(Fifo), 1, true);
    let p = r.prog(1);
    for v in 0..64 {
        assert_eq!(p.read(&r.mp, v), Some(0));
        assert!(p.write(&r.mp, v, 1));
    }
    assert_eq!(
        p.stat(|s| &s.wp_faults),
        64,
        "each read-then-write takes one write-protect fault"
    );
    assert_eq!(p.read(&r.mp, 100), Some(0));
    assert!(p.write(&r.mp, 100, 1));
    assert_eq!(
        p.stat(|s| &s.wp_faults),
        64,
        "once predicted, a read miss is installed writable and dirty"
    );
    let slot = r.mp.with_cache(|c| c.lookup(1, 100)).unwrap();
    assert!(r.mp.with_cache(|c| c.line(slot).dirty));
}

#[test]
fn mremap_keeps_a_write_made_during_its_write_back() {
    let r = rig(8, 0, Box::new(Fifo), 1, true);
    let p = Arc::new(r.prog(1));
    for v in 0..4 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    r.store.set_gate(false);
    let (mp, p2) = (r.mp.clone(), p.clone());
    let mover = std::thread::spawn(move || mp.evict_range(&p2.t, 0, 8));
    while r.store.calls("flush_many") == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Another thread of the program writes page 2 while the write-back is on the wire.
    assert!(p.write(&r.mp, 2, 99));
    r.store.set_gate(true);
    assert!(mover.join().unwrap().is_ok());
    assert_eq!(
        r.store.calls("flush_many"),
        2,
        "the raced write is written back in a second round"
    );
    assert_eq!(p.read(&r.mp, 2), Some(99), "the write made during the move survives it");
}

/// A region whose next read-out fails once.
struct FlakyRegion {
    inner: MemRegion,
    fail_read: Arc<AtomicBool>,
}

impl Region for FlakyRegion {
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
        self.inner.write_protect(vpn, pages, on)
    }
    fn punch(&self, vpn: u64, pages: u64) -> io::Result<()> {
        self.inner.punch(vpn, pages)
    }
    fn read_out(&self, vpn: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.fail_read.swap(false, Ordering::SeqCst) {
            return Err(io::Error::other("injected"));
        }
        self.inner.read_out(vpn, buf)
    }
}

fn flaky(mp: &MissPath, pid: u64) -> (Prog, Arc<AtomicBool>) {
    let mem = MemRegion::default();
    let fail_read = Arc::new(AtomicBool::new(false));
    let t = ProcHeap::new(
        pid,
        Box::new(FlakyRegion {
            inner: mem.clone(),
            fail_read: fail_read.clone(),
        }),
        Arc::new(RunStats::default()),
    );
    mp.add(t.clone(), Default::default());
    (Prog { t, mem }, fail_read)
}

#[test]
fn a_line_that_could_not_be_copied_out_stays_dirty_and_writable_again() {
    let r = rig(8, 0, Box::new(Fifo), 1, true);
    let (p, fail_read) = flaky(&r.mp, 1);
    assert!(p.write(&r.mp, 1, 7));
    fail_read.store(true, Ordering::SeqCst);
    assert!(r.mp.write_back_range(&p.t, 0, 8).is_err());
    assert!(
        p.write(&r.mp, 1, 8),
        "the protection the failed copy left is lifted by the next write"
    );
    assert!(r.mp.write_back_range(&p.t, 0, 8).is_ok());
    assert_eq!(r.store.pages.lock().unwrap().get(&(1, 1)).map(|d| d[0]), Some(8));
}

#[test]
fn the_fail_hook_never_runs_under_the_miss_paths_lock() {
    let store = MemStore::new(1);
    let me: Arc<std::sync::OnceLock<std::sync::Weak<MissPath>>> = Arc::default();
    let free_in_hook: Arc<Mutex<Vec<bool>>> = Arc::default();
    let (me2, seen) = (me.clone(), free_in_hook.clone());
    // Failing a process writes to its stderr and signals it, which may block: other processes'
    // misses must not wait behind that.
    let hook: FailHook = Box::new(move |_t, _why| {
        let mp = me2.get().unwrap().upgrade().unwrap();
        seen.lock().unwrap().push(mp.state.try_lock().is_ok());
    });
    let mp = Arc::new(MissPath::new(parts(ExCache::new(1, 1, Box::new(Fifo)), store, hook)));
    me.set(Arc::downgrade(&mp)).unwrap();
    let (a, fail_read) = flaky(&mp, 1);
    assert!(a.write(&mp, 0, 1));
    fail_read.store(true, Ordering::SeqCst);
    let b = {
        let mem = MemRegion::default();
        let t = ProcHeap::new(2, Box::new(mem.clone()), Arc::new(RunStats::default()));
        mp.add(t.clone(), Default::default());
        Prog { t, mem }
    };
    // B's miss evicts A's dirty line, which cannot be copied out: A is failed.
    assert!(b.write(&mp, 5, 2));
    assert!(!a.t.alive());
    assert_eq!(*free_in_hook.lock().unwrap(), vec![true]);
}

#[test]
fn sequential_misses_read_ahead_in_one_batch_and_random_ones_do_not() {
    let r = rig_with(16, 0, Box::new(Fifo), 1, true, 8);
    let p = r.prog(1);
    for v in 0..64 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    // Pages 0..48 are on the store now; 48..64 are dirty and resident.
    let fetches = |r: &Rig| r.store.calls("fetch") + r.store.calls("flush_fetch");
    let batches = |r: &Rig| r.store.calls("fetch_many") + r.store.calls("flush_fetch_many");
    let flushes_before = r.store.calls("flush");
    for v in 0..48 {
        assert_eq!(p.read(&r.mp, v), Some(v as u8 + 1), "page {v}");
    }
    let prefetched = p.stat(|s| &s.prefetched);
    assert!(
        prefetched >= 30,
        "most of a sequential scan arrives ahead of its misses: {prefetched}"
    );
    assert!(batches(&r) >= 4, "read-ahead travels in batches");
    // The window opens after two misses and doubles up to 8 lines: 48 lines in a handful of
    // round trips, the dirty lines they push out riding along.
    assert!(
        fetches(&r) + batches(&r) <= 10,
        "48 lines in few round trips: {} + {}",
        fetches(&r),
        batches(&r)
    );
    assert!(
        r.store.calls("flush_fetch_many") > 0 && r.store.calls("flush") == flushes_before,
        "dirty victims ride with the batch"
    );

    // Random misses open no window.
    let before = (batches(&r), p.stat(|s| &s.prefetched));
    for v in [40u64, 3, 29, 11, 45, 7, 33, 19] {
        assert_eq!(p.read(&r.mp, v), Some(v as u8 + 1));
    }
    assert_eq!((batches(&r), p.stat(|s| &s.prefetched)), before);
    assert!(r.failed().is_empty());
}

#[test]
fn one_read_ahead_line_in_sample_is_staged_and_its_use_or_waste_is_counted() {
    let r = rig_with(64, 0, Box::new(Fifo), 1, true, 8);
    let p = r.prog(1);
    for v in 0..64 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    r.mp.evict_range(&p.t, 0, 64).unwrap();
    // A sequential scan: every line read ahead is used, the staged ones through a trap.
    for v in 0..64 {
        assert_eq!(p.read(&r.mp, v), Some(v as u8 + 1), "page {v}");
    }
    let (prefetched, sampled, used) = (
        p.stat(|s| &s.prefetched),
        p.stat(|s| &s.prefetch_sampled),
        p.stat(|s| &s.prefetch_sample_used),
    );
    assert_eq!(
        sampled,
        prefetched / crate::prefetch::SAMPLE,
        "one in SAMPLE of {prefetched}"
    );
    assert!(
        sampled >= 2 && used == sampled,
        "a scan uses every sample: {used} of {sampled}"
    );
    // A staged line is installed on its first touch, written back when written, and a staged
    // line of a range that was unmapped is gone with it.
    r.mp.evict_range(&p.t, 0, 64).unwrap();
    let wasted = p.stat(|s| &s.prefetch_sample_wasted);
    let mut staged = Vec::new();
    for v in 0..64 {
        if p.mem.0.pages.lock().unwrap().contains_key(&v) {
            continue;
        }
        assert_eq!(p.read(&r.mp, v), Some(v as u8 + 1));
        staged.extend((v + 1..64).filter(|w| {
            r.mp.with_cache(|c| c.lookup(1, *w).is_some()) && !p.mem.0.pages.lock().unwrap().contains_key(w)
        }));
        if !staged.is_empty() {
            break;
        }
    }
    let s = staged[0];
    assert!(p.write(&r.mp, s, 99), "a write to a staged line installs it writable");
    assert_eq!(p.stat(|s| &s.prefetch_sample_used), used + 1);
    r.mp.evict_range(&p.t, 0, 64).unwrap();
    assert_eq!(p.read(&r.mp, s), Some(99), "the write reached the store");
    // Lines read ahead and never touched: pushed out by other pages, the staged one is waste.
    for v in 0..64 {
        let _ = p.read(&r.mp, v);
    }
    r.mp.discard_range(&p.t, 0, 64);
    for v in 0..64 {
        assert_eq!(
            p.read(&r.mp, v),
            Some(0),
            "unmapped and touched again: zeros, never a stale sample"
        );
    }
    for v in 200..300 {
        assert!(p.write(&r.mp, v, 1));
    }
    assert!(
        p.stat(|s| &s.prefetch_sample_wasted) >= wasted,
        "evicted untouched samples are waste"
    );
    assert!(r.failed().is_empty());
}

#[test]
fn staged_samples_evicted_untouched_are_waste() {
    let store = MemStore::new(1);
    let mp = MissPath::new(MissPathParts {
        prefetcher: crate::prefetcher(splitos_core::config::PrefetchPolicy::Nextline, 8),
        ..parts(ExCache::new(32, 0, Box::new(Fifo)), store.clone(), Box::new(|_, _| {}))
    });
    let r = Rig {
        mp: Arc::new(mp),
        store,
        failed: Arc::default(),
    };
    let p = r.prog(1);
    for v in 0..256 {
        assert!(p.write(&r.mp, v, 1));
    }
    r.mp.evict_range(&p.t, 0, 256).unwrap();
    // Touch only every 8th page: the line read ahead with each miss (and the samples among
    // them) is evicted untouched by later misses.
    for v in (0..256).step_by(8) {
        assert_eq!(p.read(&r.mp, v), Some(1));
    }
    for v in 1000..1064 {
        assert!(p.write(&r.mp, v, 2));
    }
    let (sampled, used, wasted) = (
        p.stat(|s| &s.prefetch_sampled),
        p.stat(|s| &s.prefetch_sample_used),
        p.stat(|s| &s.prefetch_sample_wasted),
    );
    assert!(sampled > 0 && wasted > 0, "{sampled} sampled, {wasted} wasted");
    assert!(used + wasted <= sampled);
}

#[test]
fn a_first_touch_brings_fresh_writable_lines_around_it_only_where_the_program_may_write() {
    let r = rig_full(64, 0, Box::new(Fifo), 1, true, (0, 8, 0));
    let p = r.prog(1);
    // Pages 0..12 are mapped writable, 12..16 read-only, nothing beyond.
    r.mp.set_prot(1, 0, 12 * 4096, Some(3));
    r.mp.set_prot(1, 12 * 4096, 16 * 4096, Some(1));
    assert!(p.write(&r.mp, 0, 1));
    assert_eq!(
        p.stat(|s| &s.faulted_around),
        8,
        "the next 8 lines came with the first touch"
    );
    for v in 1..9 {
        // Installed writable: the write needs no fault at all.
        let misses = p.stat(|s| &s.misses);
        assert!(p.write(&r.mp, v, v as u8));
        assert_eq!(p.stat(|s| &s.misses), misses, "page {v} was already there");
    }
    assert!(p.write(&r.mp, 9, 9));
    assert_eq!(
        p.stat(|s| &s.faulted_around),
        8 + 2,
        "stops where the writable mapping ends (page 12)"
    );
    assert_eq!(r.store.calls.lock().unwrap().len(), 0, "fresh lines need no message");
    // Lines installed writable are dirty: evicting them writes them back, so nothing is lost.
    let slot = r.mp.with_cache(|c| c.lookup(1, 5)).unwrap();
    assert!(r.mp.with_cache(|c| c.line(slot).dirty));
    r.mp.set_prot(1, 0, 12 * 4096, None);
    assert!(p.write(&r.mp, 20, 1), "unmapped in this layout: a plain miss");
    assert_eq!(p.stat(|s| &s.faulted_around), 10);
}

#[test]
fn fault_around_never_pushes_out_a_dirty_line() {
    let r = rig_full(4, 0, Box::new(Fifo), 1, true, (0, 8, 0));
    let p = r.prog(1);
    r.mp.set_prot(1, 0, 64 * 4096, Some(3));
    assert!(p.write(&r.mp, 0, 1));
    assert_eq!(p.stat(|s| &s.faulted_around), 3, "the free ways only");
    assert!(p.write(&r.mp, 20, 2));
    assert_eq!(
        p.stat(|s| &s.faulted_around),
        3,
        "every way holds a dirty line now: nothing comes along"
    );
    assert_eq!(p.read(&r.mp, 0), Some(1));
}

#[test]
fn lines_read_ahead_go_in_writable_once_most_of_those_read_ahead_were_written() {
    let r = rig_with(1024, 0, Box::new(Fifo), 1, true, 8);
    let p = r.prog(1);
    // Make the process one whose read misses are followed by writes (their prediction on).
    for v in 0..64 {
        assert_eq!(p.read(&r.mp, v), Some(0));
        assert!(p.write(&r.mp, v, 1));
    }
    r.mp.write_back_range(&p.t, 0, 64).unwrap();
    r.mp.discard_range(&p.t, 0, 64);
    // Pages on the store, read in runs: each miss reads the next ones ahead.
    for v in 100..400 {
        assert!(p.write(&r.mp, v, v as u8));
    }
    r.mp.evict_range(&p.t, 100, 400).unwrap();
    let line = |v: u64| r.mp.with_cache(|c| *c.line(c.lookup(1, v).expect("resident")));
    assert_eq!(p.read(&r.mp, 100), Some(100));
    assert_eq!(p.read(&r.mp, 101), Some(101));
    let main = line(101);
    assert!(
        main.dirty && !main.wp,
        "the missed line itself is installed as predicted: {main:?}"
    );
    let ahead = line(102);
    assert!(
        !ahead.dirty && ahead.wp && ahead.ahead,
        "lines read ahead have their own prediction, not on yet: {ahead:?}"
    );
    // Read the rest and write most of what was read ahead, without ever writing the others.
    let wp_before = p.stat(|s| &s.wp_faults);
    for v in 102..300 {
        assert_eq!(p.read(&r.mp, v), Some(v as u8));
        if v % 4 != 0 {
            assert!(p.write(&r.mp, v, 7));
        }
    }
    assert!(
        p.stat(|s| &s.prefetched) >= 64,
        "read ahead: {}",
        p.stat(|s| &s.prefetched)
    );
    assert!(
        p.stat(|s| &s.wp_faults) > wp_before,
        "lines read ahead trapped on their first write"
    );
    let wp_learned = p.stat(|s| &s.wp_faults);
    for v in 300..400 {
        assert_eq!(p.read(&r.mp, v), Some(v as u8));
    }
    let late = r.mp.with_cache(|c| {
        (300..400u64)
            .filter_map(|v| c.lookup(1, v).map(|s| *c.line(s)))
            .filter(|l| !l.wp)
            .count()
    });
    assert!(late >= 64, "most lines read ahead now go in writable: {late} of 100");
    for v in 300..400 {
        assert!(p.write(&r.mp, v, 9));
    }
    assert!(
        p.stat(|s| &s.wp_faults) - wp_learned <= 100 - late as u64,
        "writes to lines read ahead writable do not trap"
    );
    assert_eq!(p.read(&r.mp, 350), Some(9));
}

fn rig_tier(lines: usize, places: u64, tier_bytes: u64) -> Rig {
    let store = MemStore::new(places);
    let failed = Arc::new(Mutex::new(Vec::new()));
    let f2 = failed.clone();
    let hook: FailHook = Box::new(move |t, why| f2.lock().unwrap().push((t.pid, why.to_string())));
    let mp = MissPath::new(parts(ExCache::new(lines, 0, Box::new(Fifo)), store.clone(), hook));
    let mp = Arc::new(mp.with_tier(Box::new(OldestFirst::new(tier_bytes)), Box::new(Lz4)));
    Rig { mp, store, failed }
}

impl Rig {
    fn tier_entries(&self) -> usize {
        self.mp.tier_usage().expect("the tier is on").4
    }
    fn stored(&self, pid: u64, vpn: u64) -> Option<u8> {
        self.store.pages.lock().unwrap().get(&(pid, vpn)).map(|d| d[0])
    }
}

/// What one entry of a page written only in its first byte costs the tier.
fn small_entry() -> u64 {
    let mut page = vec![0u8; PAGE_SIZE];
    page[0] = 1;
    Lz4.pack(&page).unwrap().len() as u64 + crate::tier::ENTRY_OVERHEAD
}

/// Fills half of a resident page with noise: it compresses to about half a page.
fn half_noise(p: &Prog, vpn: u64, seed: u64) {
    let mut x = seed | 1;
    let mut pages = p.mem.0.pages.lock().unwrap();
    let d = &mut pages.get_mut(&vpn).expect("resident").0;
    for b in d[1..PAGE_SIZE / 2].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

#[test]
fn a_tier_hit_returns_the_latest_contents_without_a_round_trip() {
    let r = rig_tier(2, 1, 1 << 20);
    let p = r.prog(1);
    for v in 1..=4 {
        assert!(p.write(&r.mp, v, v as u8));
    }
    assert_eq!(r.tier_entries(), 2, "the two dirty victims went to the tier");
    assert_eq!(r.store.calls.lock().unwrap().len(), 0, "not to the store");
    assert_eq!(p.read(&r.mp, 1), Some(1));
    assert!(p.write(&r.mp, 1, 11), "a write to the line taken from the tier");
    assert!(p.write(&r.mp, 5, 5));
    assert!(p.write(&r.mp, 6, 6));
    assert_eq!(
        p.read(&r.mp, 1),
        Some(11),
        "the newest version comes back, not the first one stored"
    );
    for v in 2..=6 {
        assert_eq!(p.read(&r.mp, v), Some(if v == 1 { 11 } else { v as u8 }), "page {v}");
    }
    assert_eq!(r.store.calls.lock().unwrap().len(), 0, "every miss was served locally");
    assert!(p.stat(|s| &s.tier_hits) >= 6 && p.stat(|s| &s.tier_stores) >= 8);
    assert_eq!(
        p.stat(|s| &s.tier_bytes_raw),
        p.stat(|s| &s.tier_stores) * PAGE_SIZE as u64
    );
    assert!(
        p.stat(|s| &s.tier_bytes_packed) * 20 < p.stat(|s| &s.tier_bytes_raw),
        "nearly empty pages compress well"
    );
    assert!(r.failed().is_empty());
}

#[test]
fn lines_taken_from_the_tier_and_evicted_unwritten_lose_nothing() {
    // Room for three entries: pages pushed out of the tier go to the store.
    let r = rig_tier(2, 1, 3 * small_entry());
    let p = r.prog(1);
    for v in 0..4 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    // Page 0 was stored dirty: read back, it is installed write-protected but stays dirty...
    assert_eq!(p.read(&r.mp, 0), Some(1));
    let line = r.mp.with_cache(|c| *c.line(c.lookup(1, 0).unwrap()));
    assert!(line.dirty && line.wp, "{line:?}");
    // ...so evicted unwritten it goes back to the tier, and through it to the store.
    for v in 4..12 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    assert_eq!(r.stored(1, 0), Some(1), "pushed out of the tier, it was written back");
    // Clean entries (the store holds them) are captured on eviction and dropped when pushed out.
    let flushes = r.store.calls("flush") + r.store.calls("flush_many") + r.store.calls("flush_fetch");
    for _ in 0..2 {
        for v in 0..12 {
            assert_eq!(p.read(&r.mp, v), Some(v as u8 + 1), "page {v}");
        }
    }
    assert!(p.stat(|s| &s.tier_hits) > 0);
    assert!(
        r.store.calls("flush") + r.store.calls("flush_many") + r.store.calls("flush_fetch") > flushes,
        "the dirty pages of the first round were written back"
    );
    let flushes = r.store.calls("flush")
        + r.store.calls("flush_many")
        + r.store.calls("flush_fetch")
        + r.store.calls("flush_fetch_many");
    for v in 0..12 {
        assert_eq!(p.read(&r.mp, v), Some(v as u8 + 1), "page {v}");
    }
    let now = r.store.calls("flush")
        + r.store.calls("flush_many")
        + r.store.calls("flush_fetch")
        + r.store.calls("flush_fetch_many");
    assert_eq!(
        now, flushes,
        "pages never written since they were stored are never written back again"
    );
    assert!(r.failed().is_empty());
}

#[test]
fn a_write_back_range_pushes_the_tiers_dirty_pages_to_the_store_for_a_fork() {
    let r = rig_tier(2, 2, 1 << 20);
    let parent = r.prog(1);
    for v in 0..6 {
        assert!(parent.write(&r.mp, v, v as u8 + 1));
    }
    assert_eq!(r.tier_entries(), 4);
    assert!(r.mp.write_back_range(&parent.t, 0, 64).is_ok());
    for v in 0..6 {
        assert_eq!(
            r.stored(1, v),
            Some(v as u8 + 1),
            "page {v} is on the store for the child"
        );
    }
    assert_eq!(
        r.store.calls("flush_many"),
        2,
        "one batch per place, tier pages and lines together"
    );
    assert_eq!(parent.stat(|s| &s.tier_writebacks), 4);
    assert_eq!(r.tier_entries(), 4, "the tier keeps its pages, now clean");
    // The mComponent copies the parent's pages for the child, which starts knowing them.
    let copied: Vec<((u64, u64), Vec<u8>)> = r
        .store
        .pages
        .lock()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.0 == 1)
        .map(|(k, d)| ((2, k.1), d.clone()))
        .collect();
    r.store.pages.lock().unwrap().extend(copied);
    let mem = MemRegion::default();
    let child = Prog {
        t: ProcHeap::new(2, Box::new(mem.clone()), Arc::new(RunStats::default())),
        mem,
    };
    r.mp.add(child.t.clone(), r.mp.materialized_of(1));
    for v in 0..6 {
        assert_eq!(child.read(&r.mp, v), Some(v as u8 + 1), "the child sees page {v}");
    }
    // Clean now: evicting the parent's pages again writes nothing.
    let flushes = r.store.calls("flush") + r.store.calls("flush_many");
    for v in 0..6 {
        assert_eq!(parent.read(&r.mp, v), Some(v as u8 + 1));
    }
    assert_eq!(r.store.calls("flush") + r.store.calls("flush_many"), flushes);
    assert!(r.failed().is_empty());
}

#[test]
fn a_failed_write_back_range_leaves_tier_pages_dirty_and_nobody_failed() {
    let r = rig_tier(2, 1, 1 << 20);
    let p = r.prog(1);
    for v in 0..6 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    r.store.failing.lock().unwrap().insert(0);
    assert!(r.mp.write_back_range(&p.t, 0, 64).is_err());
    assert!(r.failed().is_empty(), "nothing was lost");
    r.store.failing.lock().unwrap().clear();
    assert!(r.mp.write_back_range(&p.t, 0, 64).is_ok());
    for v in 0..6 {
        assert_eq!(r.stored(1, v), Some(v as u8 + 1), "page {v}");
    }
}

#[test]
fn mremap_writes_tier_pages_back_and_drops_them() {
    let r = rig_tier(2, 1, 1 << 20);
    let p = r.prog(1);
    for v in 0..6 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    assert!(r.mp.evict_range(&p.t, 0, 4).is_ok());
    for v in 0..4 {
        assert_eq!(r.stored(1, v), Some(v as u8 + 1), "page {v} moved to the store");
    }
    assert_eq!(
        r.tier_entries(),
        0,
        "nothing of the moved range is left behind: pages 4 and 5 are resident"
    );
}

#[test]
fn discarded_pages_leave_the_tier_and_a_reused_address_reads_zeros() {
    let r = rig_tier(2, 1, 1 << 20);
    let p = r.prog(1);
    for v in 0..4 {
        assert!(p.write(&r.mp, v, 9));
    }
    assert_eq!(r.tier_entries(), 2);
    r.mp.discard_range(&p.t, 0, 2);
    assert_eq!(r.tier_entries(), 0);
    assert_eq!(
        p.read(&r.mp, 0),
        Some(0),
        "munmap then mmap at the same address: fresh zeros, never the old page"
    );
    assert_eq!(p.read(&r.mp, 1), Some(0));
    assert_eq!(r.store.calls.lock().unwrap().len(), 0);
    // A process that exits frees its entries.
    assert!(p.write(&r.mp, 7, 1) && p.write(&r.mp, 8, 1) && p.write(&r.mp, 9, 1));
    assert!(r.tier_entries() > 0);
    r.mp.remove(&p.t);
    assert_eq!(r.tier_entries(), 0);
}

#[test]
fn a_full_tier_writes_back_its_oldest_pages_in_one_message() {
    let small = small_entry();
    let r = rig_tier(1, 1, 24 * small);
    let p = r.prog(1);
    for v in 0..24 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    assert_eq!(r.tier_entries(), 23, "the tier holds every victim so far");
    assert_eq!(r.store.calls.lock().unwrap().len(), 0);
    // A page of half noise takes about half a page of the budget: the oldest small entries
    // make room, written back together.
    half_noise(&p, 23, 7);
    assert!(p.write(&r.mp, 24, 25));
    assert_eq!(r.store.calls("flush_many"), 1, "{:?}", r.store.calls.lock().unwrap());
    let written = p.stat(|s| &s.tier_writebacks);
    assert!(written > 2, "{written}");
    for v in 0..written {
        assert_eq!(
            r.stored(1, v),
            Some(v as u8 + 1),
            "the oldest pages went first: page {v}"
        );
    }
    assert_eq!(r.stored(1, written), None);
    for v in 0..25 {
        assert_eq!(p.read(&r.mp, v), Some(v as u8 + 1), "page {v}");
    }
    assert!(r.failed().is_empty());
}

#[test]
fn incompressible_victims_skip_the_tier() {
    let r = rig_tier(1, 1, 1 << 20);
    let p = r.prog(1);
    assert!(p.write(&r.mp, 0, 3));
    {
        let mut pages = p.mem.0.pages.lock().unwrap();
        let d = &mut pages.get_mut(&0).unwrap().0;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for b in d[1..].iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
    }
    assert!(p.write(&r.mp, 1, 4));
    assert_eq!(p.stat(|s| &s.tier_incompressible), 1);
    assert_eq!(r.tier_entries(), 0);
    assert_eq!(r.stored(1, 0), Some(3), "written back to the store instead");
    assert_eq!(p.read(&r.mp, 0), Some(3));
}

#[test]
fn a_failed_write_back_of_a_pushed_out_page_fails_its_own_process() {
    // Place = vpn % 2; place 0 refuses. Process 1's pages sit in the tier; process 2 pushes
    // them out.
    let r = rig_tier(2, 2, 4 * small_entry());
    let victim = r.prog(1);
    let other = r.prog(2);
    for v in [10, 12, 14, 16] {
        assert!(victim.write(&r.mp, v, 42));
    }
    r.store.failing.lock().unwrap().insert(0);
    for v in [21, 23, 25, 27, 29, 31] {
        assert!(other.write(&r.mp, v, 5));
    }
    let failed = r.failed();
    assert_eq!(
        failed.iter().map(|f| f.0).collect::<HashSet<_>>(),
        HashSet::from([1]),
        "{failed:?}"
    );
    assert!(
        failed[0].1.contains("mComponent 0") && failed[0].1.contains("only copy"),
        "{}",
        failed[0].1
    );
    assert!(other.t.alive(), "the process that pushed them out goes on");
    assert_eq!(victim.read(&r.mp, 10), None, "never zeros, never an old page");
    for v in [21, 23, 25, 27, 29, 31] {
        assert_eq!(other.read(&r.mp, v), Some(5));
    }
}

#[test]
fn read_ahead_and_fault_around_never_go_past_a_page_in_the_tier() {
    let store = MemStore::new(1);
    let hook: FailHook = Box::new(|_, _| {});
    let mp = MissPath::new(MissPathParts {
        prefetcher: crate::prefetcher(splitos_core::config::PrefetchPolicy::Nextline, 8),
        fault_around: 8,
        ..parts(ExCache::new(4, 0, Box::new(Fifo)), store.clone(), hook)
    });
    let r = Rig {
        mp: Arc::new(mp.with_tier(Box::new(OldestFirst::new(1 << 20)), Box::new(Lz4))),
        store,
        failed: Arc::default(),
    };
    let p = r.prog(1);
    r.mp.set_prot(1, 0, 64 * 4096, Some(3));
    // Page 3 written and evicted into the tier without ever reaching the store.
    assert!(p.write(&r.mp, 3, 33));
    for v in [20, 30, 40, 50] {
        assert!(p.write(&r.mp, v, 1));
    }
    assert!(r.mp.with_cache(|c| c.lookup(1, 3).is_none()));
    // A first touch of page 0 installs fresh lines around it, but not over page 3.
    assert!(p.write(&r.mp, 0, 1));
    assert_eq!(p.read(&r.mp, 3), Some(33));
    // Pages 10..13 on the store, 11 newer in the tier: read-ahead from 10 stops before 11.
    for v in 10..14 {
        assert!(p.write(&r.mp, v, 10));
    }
    r.mp.evict_range(&p.t, 10, 14).unwrap();
    assert!(p.write(&r.mp, 11, 111));
    for v in [20, 30, 40, 50] {
        assert!(p.write(&r.mp, v, 1));
    }
    assert_eq!(p.read(&r.mp, 10), Some(10));
    assert_eq!(p.read(&r.mp, 11), Some(111));
    assert_eq!(p.read(&r.mp, 12), Some(10));
}

fn prealloc_rig(lines: usize, fault_around: usize, prealloc: usize) -> (Rig, Prog) {
    let r = rig_full(lines, 0, Box::new(Fifo), 1, true, (0, fault_around, prealloc));
    let p = r.prog(1);
    r.mp.set_prot(1, 0, 1024 * 4096, Some(3));
    (r, p)
}

fn line(r: &Rig, vpn: u64) -> Option<Line> {
    r.mp.with_cache(|c| c.lookup(1, vpn).map(|s| *c.line(s)))
}

#[test]
fn first_touches_here_and_there_get_few_lines_and_a_run_of_them_ever_more() {
    let store = MemStore::new(1);
    let mp = MissPath::new(MissPathParts {
        fault_around: 2,
        prealloc: 62,
        window_start: 1,
        ..parts(ExCache::new(512, 0, Box::new(Fifo)), store.clone(), Box::new(|_, _| {}))
    });
    let r = Rig {
        mp: Arc::new(mp),
        store,
        failed: Arc::default(),
    };
    let p = r.prog(1);
    r.mp.set_prot(1, 0, 4096 * 4096, Some(3));
    for v in [0, 200, 400, 600] {
        assert!(p.write(&r.mp, v, 1));
    }
    assert_eq!(
        (p.stat(|s| &s.faulted_around), p.stat(|s| &s.preallocated)),
        (4, 0),
        "touches far apart get one line beside them each"
    );
    for v in 700..=800 {
        assert!(p.write(&r.mp, v, v as u8), "page {v}");
    }
    // 700 gets 1 line, 702 four, 707 sixteen, 724 the whole 64, and 789 the whole 64 again.
    assert_eq!(p.stat(|s| &s.misses), 4 + 5);
    assert_eq!(p.stat(|s| &s.faulted_around), 4 + 1 + 2 + 2 + 2 + 2);
    assert_eq!(p.stat(|s| &s.preallocated), 2 + 14 + 62 + 62);
    // Two runs filled in turn (two threads, two arenas) each keep their own window: four
    // traps each, as alone.
    for i in 0..40 {
        assert!(p.write(&r.mp, 2000 + i, 1));
        assert!(p.write(&r.mp, 3000 + i, 1));
    }
    assert_eq!(p.stat(|s| &s.misses), 4 + 5 + 8);
    assert!(r.failed().is_empty());
}

#[test]
fn pre_allocated_lines_are_resident_without_a_trap_and_held_by_the_excache() {
    let (r, p) = prealloc_rig(64, 2, 8);
    assert!(p.write(&r.mp, 0, 1));
    assert_eq!(
        (
            p.stat(|s| &s.plocal_fills),
            p.stat(|s| &s.faulted_around),
            p.stat(|s| &s.preallocated)
        ),
        (1, 2, 8)
    );
    assert_eq!(
        r.mp.with_cache(|c| c.used()),
        11,
        "the touched line, 2 installed around it, 8 pre-allocated after those"
    );
    for v in 3..11 {
        let l = line(&r, v).expect("pre-allocated lines are ExCache lines");
        assert!(
            l.fresh && l.dirty && !l.wp && l.state == LineState::Ready,
            "page {v}: {l:?}"
        );
        assert!(p.write(&r.mp, v, v as u8), "page {v}");
    }
    assert_eq!(p.stat(|s| &s.misses), 1, "touching pre-allocated pages never trapped");
    assert!(p.write(&r.mp, 11, 1));
    assert_eq!(
        p.stat(|s| &s.misses),
        2,
        "past the window the next first touch traps and brings the next window"
    );
    assert_eq!(p.stat(|s| &s.preallocated), 16);
    assert_eq!(r.store.calls.lock().unwrap().len(), 0, "fresh lines need no message");
}

#[test]
fn memory_filled_downwards_gets_its_window_below_the_touched_line() {
    let (r, p) = prealloc_rig(64, 2, 8);
    assert!(p.write(&r.mp, 100, 1));
    assert_eq!(
        p.stat(|s| &s.preallocated),
        8,
        "the line above is fresh: the window runs upwards"
    );
    assert!(line(&r, 101).is_some() && line(&r, 99).is_none());
    // The line above is taken now: the next first touch's window runs downwards.
    assert!(p.write(&r.mp, 99, 2));
    assert_eq!(
        (
            p.stat(|s| &s.plocal_fills),
            p.stat(|s| &s.faulted_around),
            p.stat(|s| &s.preallocated)
        ),
        (2, 4, 16)
    );
    for v in (89..99).rev() {
        let l = line(&r, v).expect("the window below the touched line is in the ExCache");
        assert!(l.dirty && !l.wp, "page {v}: {l:?}");
        assert!(p.write(&r.mp, v, v as u8), "page {v}");
    }
    assert_eq!(
        p.stat(|s| &s.misses),
        2,
        "filling downwards through the window never trapped"
    );
    assert!(p.write(&r.mp, 88, 3));
    assert_eq!(
        (p.stat(|s| &s.misses), p.stat(|s| &s.preallocated)),
        (3, 24),
        "past the window the next one starts, downwards again"
    );
    assert_eq!(
        (p.read(&r.mp, 100), p.read(&r.mp, 95), p.read(&r.mp, 87)),
        (Some(1), Some(95), Some(0))
    );
    assert_eq!(r.store.calls.lock().unwrap().len(), 0, "fresh lines need no message");
}

#[test]
fn a_window_downwards_stops_at_a_line_that_left_the_pcomponent() {
    let (r, p) = prealloc_rig(64, 0, 8);
    // Page 95 is written back and evicted: it is not fresh, and the window must not zero it.
    // (The untouched lines of its window are evicted with it and are fresh again.)
    assert!(p.write(&r.mp, 95, 7));
    r.mp.evict_range(&p.t, 95, 104).unwrap();
    assert!(p.write(&r.mp, 99, 1));
    assert!(
        line(&r, 100).is_some() && line(&r, 98).is_none(),
        "the line above was fresh: the window ran upwards"
    );
    assert!(p.write(&r.mp, 98, 2));
    let below: Vec<u64> = (90..98).filter(|v| line(&r, *v).is_some()).collect();
    assert_eq!(
        below,
        vec![96, 97],
        "the window runs down to the stored page, not past it"
    );
    assert_eq!(p.read(&r.mp, 95), Some(7));
}

#[test]
fn pre_allocation_never_overfills_the_excache_nor_pushes_out_dirty_lines() {
    let (r, p) = prealloc_rig(8, 0, 64);
    assert!(p.write(&r.mp, 0, 1));
    assert_eq!(p.stat(|s| &s.preallocated), 7, "the free ways only");
    assert!(p.write(&r.mp, 100, 2));
    assert_eq!(
        p.stat(|s| &s.preallocated),
        7,
        "every way holds a dirty line: nothing is pre-allocated"
    );
    assert!(r.mp.with_cache(|c| c.used()) <= 8);
    assert_eq!(p.read(&r.mp, 0), Some(1));
    assert_eq!(p.read(&r.mp, 100), Some(2));
}

#[test]
fn evicting_an_untouched_pre_allocated_line_writes_nothing_back() {
    let (r, p) = prealloc_rig(4, 0, 3);
    assert!(p.write(&r.mp, 0, 1));
    assert_eq!(p.stat(|s| &s.preallocated), 3);
    // The program writes page 2 without trapping; pages 1 and 3 stay untouched.
    assert!(p.write(&r.mp, 2, 5));
    assert_eq!(p.stat(|s| &s.misses), 1);
    // FIFO evicts 0 (written), 1 (untouched), 2 (written), 3 (untouched) for four new lines.
    for v in 20..24 {
        assert!(p.write(&r.mp, v, 9));
        assert!(r.mp.with_cache(|c| c.used()) <= 4);
    }
    assert_eq!(
        r.store.calls("flush") + r.store.calls("flush_fetch"),
        2,
        "only the written lines were written back"
    );
    assert_eq!(
        (p.stat(|s| &s.prealloc_unused), p.stat(|s| &s.zero_writebacks_skipped)),
        (2, 2)
    );
    let stored: Vec<u64> = r.store.pages.lock().unwrap().keys().map(|(_, v)| *v).collect();
    assert!(
        stored.contains(&0) && stored.contains(&2) && !stored.contains(&1) && !stored.contains(&3),
        "{stored:?}"
    );
    // Untouched lines come back as zeros without a fetch; written ones with their contents.
    let fetches = r.store.calls("fetch") + r.store.calls("flush_fetch");
    assert_eq!(p.read(&r.mp, 1), Some(0));
    assert_eq!(p.read(&r.mp, 3), Some(0));
    assert_eq!(
        r.store.calls("fetch") + r.store.calls("flush_fetch"),
        fetches,
        "zeros are filled locally"
    );
    assert_eq!(p.read(&r.mp, 2), Some(5));
    assert_eq!(p.read(&r.mp, 0), Some(1));
    assert!(r.failed().is_empty());
}

#[test]
fn a_pre_allocated_line_written_with_zeros_over_stored_contents_is_written_back() {
    let (r, p) = prealloc_rig(2, 0, 0);
    assert!(p.write(&r.mp, 0, 7));
    r.mp.write_back_range(&p.t, 0, 1).unwrap();
    assert!(p.write(&r.mp, 0, 0), "zeros over contents that are on the store");
    r.mp.evict_range(&p.t, 0, 1).unwrap();
    assert_eq!(p.read(&r.mp, 0), Some(0), "the zeros were written back, not skipped");
    assert_eq!(p.stat(|s| &s.zero_writebacks_skipped), 0);
}

#[test]
fn fork_and_mremap_write_back_only_the_pre_allocated_lines_the_program_wrote() {
    let (r, p) = prealloc_rig(64, 0, 8);
    assert!(p.write(&r.mp, 0, 1));
    assert!(p.write(&r.mp, 4, 4));
    // Before a fork: the written lines go to the store; untouched ones become clean, stay
    // resident and are not on the store (a child reads them as zeros, as it should).
    r.mp.write_back_range(&p.t, 0, 1024).unwrap();
    assert_eq!(r.mp.materialized_of(1).into_iter().collect::<Vec<_>>(), vec![0, 4]);
    assert_eq!(p.stat(|s| &s.prealloc_unused), 7);
    let l = line(&r, 5).unwrap();
    assert!(!l.dirty && l.wp, "{l:?}");
    // A write after the fork's write-back traps and makes the line dirty again.
    assert!(p.write(&r.mp, 5, 6));
    assert!(line(&r, 5).unwrap().dirty);
    // mremap's move evicts the range, written lines through the store: nothing is lost.
    r.mp.evict_range(&p.t, 0, 9).unwrap();
    assert_eq!(r.mp.with_cache(|c| c.resident_in(1, 0, 9).len()), 0);
    for (v, want) in [(0, 1), (4, 4), (5, 6), (6, 0), (8, 0)] {
        assert_eq!(p.read(&r.mp, v), Some(want), "page {v}");
    }
}

#[test]
fn munmap_and_dontneed_drop_pre_allocated_lines_without_asking_anyone() {
    let (r, p) = prealloc_rig(64, 0, 8);
    assert!(p.write(&r.mp, 0, 1));
    assert!(p.write(&r.mp, 3, 3));
    assert!(
        !r.mp.discard_range(&p.t, 0, 9),
        "nothing of the range ever left: no owner holds any of it"
    );
    assert_eq!(r.mp.with_cache(|c| c.used()), 0);
    assert!(
        p.mem.0.pages.lock().unwrap().is_empty(),
        "the pre-allocated pages are gone from the program"
    );
    assert_eq!(p.read(&r.mp, 3), Some(0), "a discarded page reads as zeros again");
    assert_eq!(p.stat(|s| &s.misses), 2, "and it trapped: it was not resident any more");
    assert!(p.write(&r.mp, 20, 2));
    r.mp.evict_range(&p.t, 20, 21).unwrap();
    assert!(
        r.mp.discard_range(&p.t, 16, 32),
        "a page of the range is on the store: its owner must drop it"
    );
}

/// A region that cannot take a run of pages at once (the pages one by one it can).
struct FullRegion(MemRegion);

impl Region for FullRegion {
    fn copy(&self, vpn: u64, data: &[u8], wp: bool) -> io::Result<Install> {
        self.0.copy(vpn, data, wp)
    }
    fn zero(&self, vpn: u64, wp: bool) -> io::Result<Install> {
        self.0.zero(vpn, wp)
    }
    fn wake(&self, _vpn: u64) {}
    fn write_protect(&self, vpn: u64, pages: u64, on: bool) -> io::Result<()> {
        self.0.write_protect(vpn, pages, on)
    }
    fn zero_run(&self, _vpn: u64, _pages: u64) -> io::Result<Install> {
        Err(io::Error::from_raw_os_error(libc::ENOSPC))
    }
    fn punch(&self, vpn: u64, pages: u64) -> io::Result<()> {
        self.0.punch(vpn, pages)
    }
    fn read_out(&self, vpn: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_out(vpn, buf)
    }
}

#[test]
fn lines_that_cannot_be_pre_allocated_are_given_back_and_trap_as_first_touches() {
    let r = rig_full(64, 0, Box::new(Fifo), 1, true, (0, 0, 4));
    let mem = MemRegion::default();
    let t = ProcHeap::new(1, Box::new(FullRegion(mem.clone())), Arc::new(RunStats::default()));
    r.mp.add(t.clone(), Default::default());
    r.mp.set_prot(1, 0, 64 * 4096, Some(3));
    let p = Prog { t, mem };
    assert!(p.write(&r.mp, 0, 1));
    assert_eq!(p.stat(|s| &s.preallocated), 0);
    for v in 1..5 {
        assert!(line(&r, v).is_none(), "the way of page {v} was given back");
    }
    // Each touch is a first touch of its own now, which (its window refused too) goes in alone.
    for v in 1..5 {
        assert!(p.write(&r.mp, v, 2));
        assert_eq!(p.read(&r.mp, v), Some(2));
    }
    assert_eq!(p.stat(|s| &s.misses), 5);
}

/// A region on which fresh extents can be huge pages: it refuses, as the real one does, a
/// punch that cuts a huge page not split first. With `lose_split`, the next split loses the
/// pages it should put back.
#[derive(Clone, Default)]
struct HugeRegion {
    mem: MemRegion,
    huge: Arc<Mutex<HashSet<u64>>>,
    splits: Arc<Mutex<Vec<u64>>>,
    lose_split: Arc<AtomicBool>,
}

impl Region for HugeRegion {
    fn copy(&self, vpn: u64, data: &[u8], wp: bool) -> io::Result<Install> {
        self.mem.copy(vpn, data, wp)
    }
    fn zero(&self, vpn: u64, wp: bool) -> io::Result<Install> {
        self.mem.zero(vpn, wp)
    }
    fn wake(&self, _vpn: u64) {}
    fn write_protect(&self, vpn: u64, pages: u64, on: bool) -> io::Result<()> {
        self.mem.write_protect(vpn, pages, on)
    }
    fn punch(&self, vpn: u64, pages: u64) -> io::Result<()> {
        let mut huge = self.huge.lock().unwrap();
        let cut = |e: &u64| *e < vpn + pages && e + EXTENT > vpn;
        assert!(
            huge.iter()
                .filter(|e| cut(e))
                .all(|e| *e >= vpn && e + EXTENT <= vpn + pages),
            "a punch of {vpn}+{pages} cuts a huge page"
        );
        huge.retain(|e| !cut(e));
        self.mem.punch(vpn, pages)
    }
    fn read_out(&self, vpn: u64, buf: &mut [u8]) -> io::Result<()> {
        self.mem.read_out(vpn, buf)
    }
    fn huge_pages(&self) -> bool {
        true
    }
    fn allocate_huge(&self, vpn: u64) -> Result<bool, SplitError> {
        assert_eq!(vpn % EXTENT, 0);
        self.huge.lock().unwrap().insert(vpn);
        self.mem.zero_run(vpn, EXTENT)?;
        Ok(true)
    }
    fn split_huge(&self, vpn: u64, pages: u64) -> Result<u64, SplitError> {
        let mut huge = self.huge.lock().unwrap();
        let cut: Vec<u64> = huge
            .iter()
            .copied()
            .filter(|e| *e < vpn + pages && e + EXTENT > vpn && (*e < vpn || e + EXTENT > vpn + pages))
            .collect();
        for e in &cut {
            huge.remove(e);
            self.splits.lock().unwrap().push(*e);
            if self.lose_split.swap(false, Ordering::SeqCst) {
                self.mem.punch(*e, EXTENT)?;
                return Err(SplitError::Lost(io::Error::from_raw_os_error(libc::ENOMEM)));
            }
            self.mem.write_protect(*e, EXTENT, true)?;
        }
        Ok(cut.len() as u64)
    }
}

impl From<io::Error> for SplitError {
    fn from(e: io::Error) -> SplitError {
        SplitError::Kept(e)
    }
}

fn huge_rig(lines: usize, mapped: u64) -> (Rig, Prog, HugeRegion) {
    let r = rig_full(lines, 0, Box::new(Fifo), 1, true, (0, 16, 64));
    let region = HugeRegion::default();
    let t = ProcHeap::new(1, Box::new(region.clone()), Arc::new(RunStats::default()));
    r.mp.add(t.clone(), Default::default());
    r.mp.set_prot(1, 0, mapped * 4096, Some(3));
    let p = Prog {
        t,
        mem: region.mem.clone(),
    };
    (r, p, region)
}

#[test]
fn a_fresh_extent_becomes_one_huge_page_held_as_512_lines() {
    let (r, p, region) = huge_rig(2048, 2048);
    assert!(
        p.write(&r.mp, 700, 7),
        "a first touch in the middle of the second extent"
    );
    assert_eq!(
        (
            p.stat(|s| &s.huge_pages),
            p.stat(|s| &s.preallocated),
            p.stat(|s| &s.plocal_fills),
            p.stat(|s| &s.faulted_around)
        ),
        (1, 511, 1, 0)
    );
    assert_eq!(*region.huge.lock().unwrap(), HashSet::from([512]));
    assert_eq!(r.mp.with_cache(|c| c.used()), 512);
    for v in 512..1024 {
        let l = line(&r, v).expect("every line of the extent is an ExCache line");
        assert!(
            l.dirty && !l.wp && l.state == LineState::Ready && l.fresh == (v != 700),
            "page {v}: {l:?}"
        );
        assert!(p.write(&r.mp, v, v as u8 | 1));
    }
    assert_eq!(p.stat(|s| &s.misses), 1, "no page of the extent trapped again");
    assert_eq!(r.store.calls.lock().unwrap().len(), 0, "fresh memory needs no message");
}

#[test]
fn an_extent_that_is_not_all_fresh_or_not_all_writable_stays_small_and_fault_around_stops_at_its_end() {
    let (r, p, region) = huge_rig(4096, 2048);
    r.mp.set_prot(1, 100 * 4096, 101 * 4096, Some(1));
    assert!(p.write(&r.mp, 500, 1), "the first extent holds a read-only page");
    assert_eq!(p.stat(|s| &s.huge_pages), 0);
    assert_eq!(
        p.stat(|s| &s.faulted_around) + p.stat(|s| &s.preallocated),
        11,
        "fresh lines up to the extent's end, none past it"
    );
    assert!(line(&r, 512).is_none());
    assert!(p.write(&r.mp, 512, 2), "the next extent's first touch takes it whole");
    assert_eq!(p.stat(|s| &s.huge_pages), 1);
    // One line of the third extent left for the store: it never becomes a huge page.
    assert!(p.write(&r.mp, 1100, 3));
    assert_eq!(p.stat(|s| &s.huge_pages), 2);
    r.mp.evict_range(&p.t, 1100, 1101).unwrap();
    assert_eq!(
        region.splits.lock().unwrap().clone(),
        vec![1024],
        "taking one line out splits its huge page first"
    );
    r.mp.discard_range(&p.t, 1024, 1100);
    assert!(p.write(&r.mp, 1030, 4));
    assert_eq!(
        p.stat(|s| &s.huge_pages),
        2,
        "page 1100 is on the store: the extent is not fresh"
    );
    assert_eq!(p.read(&r.mp, 1100), Some(3));
}

#[test]
fn evicting_a_line_of_a_huge_page_splits_it_once_and_keeps_every_byte() {
    let (r, p, region) = huge_rig(700, 4096);
    assert!(p.write(&r.mp, 0, 1));
    assert_eq!(p.stat(|s| &s.huge_pages), 1);
    for v in 0..512 {
        assert!(p.write(&r.mp, v, (v % 251) as u8 + 1));
    }
    // Too few ways for a second huge page: the next lines come 4 KiB at a time and, once the
    // cache is full, push out the huge page's lines oldest first.
    for v in 512..1400 {
        assert!(p.write(&r.mp, v, (v % 251) as u8 + 1));
    }
    assert_eq!(p.stat(|s| &s.huge_pages), 1);
    assert!(p.stat(|s| &s.evictions) > 600);
    assert_eq!(
        region.splits.lock().unwrap().clone(),
        vec![0],
        "split once, by its first evicted line"
    );
    assert_eq!(p.stat(|s| &s.huge_splits), 1);
    for v in 0..1400 {
        assert_eq!(p.read(&r.mp, v), Some((v % 251) as u8 + 1), "page {v}");
    }
    assert!(r.failed().is_empty() && r.mp.with_cache(|c| c.used()) <= 700);
}

#[test]
fn a_split_that_lost_pages_fails_the_process_instead_of_serving_zeros() {
    let (r, p, region) = huge_rig(2048, 2048);
    assert!(p.write(&r.mp, 0, 1));
    region.lose_split.store(true, Ordering::SeqCst);
    assert!(!r.mp.discard_range(&p.t, 0, 1));
    let failed = r.failed();
    assert!(failed.len() == 1 && failed[0].1.contains("huge page"), "{failed:?}");
    assert_eq!(p.read(&r.mp, 5), None, "no thread is served a lost page");
}

// Dirty tracking by scan: the region's kernel records writes instead of trapping on them.

/// Reads `v`, then writes it unless `v % 4 == 3`: three in four read misses are followed by a
/// write, enough for fault tracking to predict writes.
fn mostly_written(r: &Rig, p: &Prog, pages: std::ops::Range<u64>, b: u8) {
    for v in pages {
        assert!(p.read(&r.mp, v).is_some());
        if v % 4 != 3 {
            assert!(p.write(&r.mp, v, b.wrapping_add(v as u8)));
        }
    }
}

#[test]
fn scan_mode_writes_back_only_written_lines_without_a_trap() {
    let mut flushes = Vec::new();
    for tracked in [false, true] {
        let r = rig(16, 0, Box::new(Fifo), 1, true);
        let p = r.prog_tracked(1, tracked);
        // Every page is on the store once, then read and mostly rewritten twice over.
        for v in 0..200 {
            assert!(p.write(&r.mp, v, 1));
        }
        mostly_written(&r, &p, 0..200, 10);
        mostly_written(&r, &p, 0..200, 20);
        for v in 0..200 {
            let want = if v % 4 == 3 { 1 } else { 20u8.wrapping_add(v as u8) };
            assert_eq!(p.read(&r.mp, v), Some(want), "tracked={tracked}: page {v}");
        }
        let flushed = r.store.calls("flush")
            + r.store.calls("flush_fetch")
            + r.store.calls("flush_fetch_many")
            + r.store.calls("flush_many");
        flushes.push(flushed);
        if tracked {
            assert_eq!(p.stat(|s| &s.wp_faults), 0, "no write traps");
            assert!(
                p.stat(|s| &s.scan_clean_evictions) >= 100,
                "the unwritten quarter is dropped: {}",
                p.stat(|s| &s.scan_clean_evictions)
            );
            assert!(
                p.stat(|s| &s.writebacks_avoided) >= 50,
                "fault tracking would have written those back"
            );
            assert!(
                p.stat(|s| &s.dirty_scans) >= p.stat(|s| &s.scan_clean_evictions),
                "clean victims were asked about"
            );
        } else {
            assert!(p.stat(|s| &s.wp_faults) > 0);
            assert_eq!(p.stat(|s| &s.dirty_scans) + p.stat(|s| &s.writebacks_avoided), 0);
        }
        assert!(r.failed().is_empty());
    }
    assert!(
        flushes[1] + 80 < flushes[0],
        "write-backs: fault tracking {}, scan {}",
        flushes[0],
        flushes[1]
    );
}

#[test]
fn scan_mode_range_write_back_sends_written_lines_and_sees_later_writes() {
    let r = rig(64, 0, Box::new(Fifo), 1, true);
    let p = r.prog_tracked(1, true);
    for v in 0..8 {
        assert!(p.write(&r.mp, v, 1));
    }
    r.mp.write_back_range(&p.t, 0, 8).unwrap();
    assert_eq!(r.store.pages.lock().unwrap().len(), 8);
    // Nothing written since: a second write-back sends nothing.
    let before = r.store.calls("flush_many");
    r.mp.write_back_range(&p.t, 0, 8).unwrap();
    assert_eq!(r.store.calls("flush_many"), before);
    // A write after the write-back is found by the next one.
    assert!(p.write(&r.mp, 5, 55));
    r.mp.write_back_range(&p.t, 0, 8).unwrap();
    assert_eq!(r.store.pages.lock().unwrap()[&(1, 5)][0], 55);
    assert_eq!(p.stat(|s| &s.wp_faults), 0);
}

#[test]
fn scan_mode_clock_keeps_a_line_written_since_its_bit_was_cleared() {
    let r = rig(3, 0, Box::new(Clock), 1, true);
    let p = r.prog_tracked(1, true);
    for v in 0..3 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    // Page 0 goes; CLOCK cleared the bits of 1 and 2 and protected them again.
    assert!(p.write(&r.mp, 3, 4));
    assert!(p.write(&r.mp, 1, 20));
    assert!(p.write(&r.mp, 4, 5));
    let resident: Vec<u64> =
        r.mp.with_cache(|c| c.resident_in(1, 0, 10).into_iter().map(|(v, _)| v).collect());
    assert!(
        resident.contains(&1) && !resident.contains(&2),
        "the rewritten page 1 stays: {resident:?}"
    );
    assert_eq!(p.stat(|s| &s.wp_faults), 0);
    for (v, want) in [(0u64, 1u8), (1, 20), (2, 3), (3, 4), (4, 5)] {
        assert_eq!(p.read(&r.mp, v), Some(want), "page {v} keeps its contents");
    }
}

#[test]
fn scan_mode_mremap_keeps_a_write_made_after_its_write_back() {
    let r = rig(8, 0, Box::new(Fifo), 1, true);
    let p = Arc::new(r.prog_tracked(1, true));
    for v in 0..4 {
        assert!(p.write(&r.mp, v, v as u8 + 1));
    }
    r.store.set_gate(false);
    let (mp, p2) = (r.mp.clone(), p.clone());
    let mover = std::thread::spawn(move || mp.evict_range(&p2.t, 0, 8));
    while r.store.calls("flush_many") == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Another thread writes page 2 while the write-back is on the wire: no trap tells anyone,
    // and the line is clean again once the write-back is acknowledged.
    assert!(p.write(&r.mp, 2, 99));
    r.store.set_gate(true);
    assert!(mover.join().unwrap().is_ok());
    assert_eq!(
        r.store.calls("flush"),
        1,
        "taking the range found the write and wrote it back"
    );
    assert_eq!(p.read(&r.mp, 2), Some(99), "the write made during the move survives it");
    assert!(r.failed().is_empty());
}

/// A region whose kernel cannot hand pages back.
struct Untakeable(MemRegion);

impl Region for Untakeable {
    fn copy(&self, vpn: u64, data: &[u8], wp: bool) -> io::Result<Install> {
        self.0.copy(vpn, data, wp)
    }
    fn zero(&self, vpn: u64, wp: bool) -> io::Result<Install> {
        self.0.zero(vpn, wp)
    }
    fn wake(&self, _vpn: u64) {}
    fn write_protect(&self, vpn: u64, pages: u64, on: bool) -> io::Result<()> {
        self.0.write_protect(vpn, pages, on)
    }
    fn punch(&self, vpn: u64, pages: u64) -> io::Result<()> {
        self.0.punch(vpn, pages)
    }
    fn read_out(&self, vpn: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_out(vpn, buf)
    }
    fn tracks_writes(&self) -> bool {
        true
    }
    fn written(&self, first: u64, end: u64) -> io::Result<Vec<u64>> {
        self.0.written(first, end)
    }
    fn take(&self, _vpn: u64, _pages: u64, _keep: crate::Keep) -> io::Result<Vec<crate::Taken>> {
        Err(io::Error::other("splice refused"))
    }
}

#[test]
fn scan_mode_fails_the_process_of_a_line_it_cannot_take_even_a_clean_one() {
    let r = rig(2, 0, Box::new(Fifo), 1, true);
    let mem = MemRegion::default();
    mem.0.tracked.store(true, Ordering::Relaxed);
    let t = ProcHeap::new(1, Box::new(Untakeable(mem.clone())), Arc::new(RunStats::default()));
    r.mp.add(t.clone(), Default::default());
    let p = Prog { t, mem };
    let other = r.prog(2);
    assert_eq!(p.read(&r.mp, 10), Some(0));
    assert_eq!(p.read(&r.mp, 11), Some(0));
    // Clean as far as anyone knows, but it may have been written: it cannot just be dropped.
    assert!(other.write(&r.mp, 12, 1));
    let failed = r.failed();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].0 == 1 && failed[0].1.contains("splice refused"), "{failed:?}");
    assert!(other.t.alive());
}

mod evictor;

/// A hot set read over and over between scans of pages read once, in a cache that holds the
/// hot set and a few more: re-misses on the hot set per configuration, and the process.
fn hot_and_scan(policy: Box<dyn EvictionPolicy>, sampling: bool) -> (u64, Prog, Rig) {
    let r = rig(64, 0, policy, 1, true);
    let p = r.mp_prog(1, sampling);
    let (hot, mut cold) = (0..32u64, 1000u64);
    for v in hot.clone() {
        assert!(p.write(&r.mp, v, v as u8));
    }
    let before = r.store.calls("fetch") + r.store.calls("flush_fetch");
    for _ in 0..20 {
        for v in hot.clone() {
            assert_eq!(p.read(&r.mp, v), Some(v as u8));
        }
        for _ in 0..48 {
            assert!(p.write(&r.mp, cold, 7));
            cold += 1;
        }
    }
    let refetched = (r.store.calls("fetch") + r.store.calls("flush_fetch") - before) as u64;
    (refetched, p, r)
}

impl Rig {
    fn mp_prog(&self, pid: u64, sampling: bool) -> Prog {
        self.prog_with(pid, false, sampling)
    }
}

#[test]
fn sampled_reads_keep_a_hot_set_that_scans_would_evict() {
    let (fifo, _, _) = hot_and_scan(Box::new(Fifo), false);
    let (clock_blind, _, _) = hot_and_scan(Box::new(GhostClock::new(64)), false);
    let (sampled, p, _r) = hot_and_scan(Box::new(GhostClock::new(64)), true);
    // Without sampling the hot set is only read: no policy can tell it from the scan.
    assert!(
        fifo > 300 && clock_blind > 300,
        "the scans push the hot set out: fifo {fifo}, ghost-clock without sampling {clock_blind} fetches"
    );
    assert!(
        sampled * 2 < fifo,
        "with reads seen the hot set stays: {sampled} fetches against {fifo} with fifo"
    );
    assert!(
        p.stat(|s| &s.sample_unmaps) > 0 && p.stat(|s| &s.sample_touches) > 0,
        "the lines were unmapped and their touches seen"
    );
}

#[test]
fn a_touch_keeps_the_lines_protection_and_is_seen_when_the_line_would_leave() {
    let r = rig(64, 0, Box::new(GhostClock::new(64)), 1, true);
    let p = r.mp_prog(1, true);
    assert!(p.write(&r.mp, 5, 9));
    assert_eq!(p.read(&r.mp, 6), Some(0));
    let slots = {
        let mut g = r.mp.state.lock().unwrap();
        [5, 6].map(|v| {
            let s = g.cache.lookup(1, v).unwrap();
            g.cache.line_mut(s).unmapped = true;
            s
        })
    };
    p.mem.unmap(&[5, 6]).unwrap();
    // The kernel maps the clean line again on its own, write-protected as it was.
    assert_eq!(p.read(&r.mp, 6), Some(0));
    assert!(
        p.mem.0.pages.lock().unwrap()[&6].1,
        "a clean line is mapped write-protected again"
    );
    assert_eq!(
        p.stat(|s| &s.sample_touches),
        0,
        "nobody is told of a touch as it happens"
    );
    // Asked when they would leave: the touched line was used, the other was not.
    let mut g = r.mp.state.lock().unwrap();
    let (mut l5, mut l6) = (*g.cache.line(slots[0]), *g.cache.line(slots[1]));
    assert!(r.mp.probe(&p.t, &mut l6) && !l6.unmapped, "{l6:?}");
    assert!(!r.mp.probe(&p.t, &mut l5) && l5.unmapped, "{l5:?}");
    g.cache.line_mut(slots[1]).unmapped = true;
    drop(g);
    // Its first write still traps: the line is dirty and, as far as sampling knows, mapped.
    assert!(p.write(&r.mp, 6, 1));
    let g = r.mp.state.lock().unwrap();
    let l = *g.cache.line(slots[1]);
    assert!(
        l.dirty && !l.wp && !l.unmapped && l.referenced,
        "a write makes the line dirty and referenced: {l:?}"
    );
    drop(g);
    assert_eq!(p.stat(|s| &s.sample_touches), 1, "one touch seen, by the probe");
    assert_eq!(p.read(&r.mp, 5), Some(9), "the untouched line kept its contents");
}

#[test]
fn pages_a_process_gave_up_are_not_counted_as_its_own_nor_as_had_again() {
    let r = rig(16, 0, Box::new(Fifo), 1, true);
    let p = r.prog(1);
    let pages = || &p.t.stats.pages;
    for v in 0..8 {
        assert!(p.write(&r.mp, v, 1));
    }
    assert_eq!(pages().peak(), 8);
    // Freed (munmap, MADV_DONTNEED) and the same addresses used again, as allocators do.
    r.mp.discard_range(&p.t, 0, 8);
    for v in 0..8 {
        assert_eq!(p.read(&r.mp, v), Some(0), "a fresh page after the discard");
    }
    // Freed and new addresses used, as a runtime that moves its heap around does.
    r.mp.discard_range(&p.t, 0, 8);
    for v in 100..108 {
        assert!(p.write(&r.mp, v, 2));
    }
    assert_eq!(pages().peak(), 8, "the process never had more than 8 pages at once");
    assert_eq!(pages().had_again(), 0, "no page came back after an eviction");
    // Evicted and wanted back: had again.
    for v in 200..216 {
        assert!(p.write(&r.mp, v, 3));
    }
    assert_eq!(p.read(&r.mp, 100), Some(2));
    assert!(pages().had_again() >= 1);
}
