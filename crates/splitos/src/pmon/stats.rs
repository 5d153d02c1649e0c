//! Counters of the miss path: per run (all processes one `splitos run` started) and for the
//! whole pComponent.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use hdrhistogram::Histogram;

/// Counters of one `splitos run` (all processes it started) or of the whole pComponent.
pub struct RunStats {
    pub misses: AtomicU64,
    pub evictions: AtomicU64,
    pub flushes: AtomicU64,
    pub piggybacked: AtomicU64,
    pub plocal_fills: AtomicU64,
    /// Lines fetched ahead of a miss with it (read-ahead) and installed clean.
    pub prefetched: AtomicU64,
    /// Read-ahead lines kept in the pComponent as samples (one in `prefetch::SAMPLE`), and of
    /// those, the ones the program touched and the ones evicted untouched.
    pub prefetch_sampled: AtomicU64,
    pub prefetch_sample_used: AtomicU64,
    pub prefetch_sample_wasted: AtomicU64,
    /// Fresh lines installed zero-filled and writable next to a first touch (fault-around).
    pub faulted_around: AtomicU64,
    /// Fresh lines made resident in the memfd ahead of the program (pre-allocation): touching
    /// one is an ordinary page fault, not a trap.
    pub preallocated: AtomicU64,
    /// Pre-allocated lines still all zeros when they were evicted or written back: the
    /// program never wrote them.
    pub prealloc_unused: AtomicU64,
    /// Dirty lines that never left this pComponent and were still all zeros when evicted or
    /// written back: no write-back was sent (a later miss fills them with zeros again).
    pub zero_writebacks_skipped: AtomicU64,
    /// The program's virtual-memory calls on its heap (mmap, munmap, mprotect, madvise,
    /// mremap) and the time the pComponent spent answering them.
    pub heap_calls: AtomicU64,
    pub heap_call_ns: AtomicU64,
    /// Of those, the calls answered without asking the home mComponent.
    pub heap_calls_local: AtomicU64,
    pub bytes_fetched: AtomicU64,
    pub bytes_flushed: AtomicU64,
    pub wp_faults: AtomicU64,
    /// Misses served by decompressing the line from the compressed tier (no round trip).
    pub tier_hits: AtomicU64,
    /// Victims compressed into the tier, their bytes before and after compression.
    pub tier_stores: AtomicU64,
    pub tier_bytes_raw: AtomicU64,
    pub tier_bytes_packed: AtomicU64,
    /// Victims that compressed too poorly for the tier (dirty ones went to the store).
    pub tier_incompressible: AtomicU64,
    /// Tier entries written to the store: pushed out dirty, or before a fork or an mremap.
    /// Also counted in `flushes`.
    pub tier_writebacks: AtomicU64,
    /// CPU time compressing (stored and refused victims) and decompressing (hits, write-backs).
    pub tier_pack_ns: AtomicU64,
    pub tier_unpack_ns: AtomicU64,
    /// Dirty tracking by scan: PAGEMAP_SCAN requests (a range with many written runs may take
    /// more than one call) and the pages they covered.
    pub dirty_scans: AtomicU64,
    pub dirty_scanned_pages: AtomicU64,
    /// Evicted lines a scan found unwritten since their last write-back or fetch: dropped
    /// without a write-back.
    pub scan_clean_evictions: AtomicU64,
    /// Of those, the lines a read miss filled (not read ahead): fault tracking installs such a
    /// line writable and dirty, and writes it back, whenever its process predicts writes (most
    /// of its read misses followed by a write), as wordfreq's does most of its run.
    pub writebacks_avoided: AtomicU64,
    pub processes: AtomicU64,
    /// With `fault_cpu = "faulting"`: faults a worker served on the CPU the faulting thread
    /// was on (as last read) and elsewhere, the times a worker moved to another CPU, and the
    /// times it went to serve from elsewhere for a while because the thread it sat beside was
    /// put on another (idle) CPU.
    pub faults_on_faulting_cpu: AtomicU64,
    pub faults_off_faulting_cpu: AtomicU64,
    pub fault_worker_moves: AtomicU64,
    pub fault_worker_partings: AtomicU64,
    pub miss_ns: Mutex<Histogram<u64>>,
    /// Where a miss spends its time inside the pComponent: choosing and dropping a victim,
    /// the network round trip(s), and installing the line into the program.
    pub evict_ns: Mutex<Histogram<u64>>,
    pub rpc_ns: Mutex<Histogram<u64>>,
    pub install_ns: Mutex<Histogram<u64>>,
    pub errors: Mutex<Vec<String>>,
    /// Fresh 2 MiB extents pre-allocated as huge pages (their lines also count in
    /// `preallocated`, less the touched one).
    pub huge_pages: AtomicU64,
    /// Huge pages split into 4 KiB pages because part of them left the program.
    pub huge_splits: AtomicU64,
    /// Lines evicted on a miss's way (for the line, its read-ahead or its fault-around):
    /// the miss waited for them. Also counted in `evictions`.
    pub inline_evictions: AtomicU64,
    /// Lines the background evictor took out ahead of the misses. Also counted in
    /// `evictions`.
    pub bg_evictions: AtomicU64,
    /// Pages it wrote back: dirty victims, and the dirty tier entries they pushed out.
    pub bg_writebacks: AtomicU64,
    /// The messages that carried them.
    pub bg_writeback_batches: AtomicU64,
    /// Time the background evictor spent working, between its sleeps (a run is charged its
    /// share of the lines of each round).
    pub evictor_ns: AtomicU64,
    /// The CPU time of its thread in those rounds, charged the same way.
    pub evictor_cpu_ns: AtomicU64,
}

fn histogram() -> Mutex<Histogram<u64>> {
    Mutex::new(Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds"))
}

impl Default for RunStats {
    fn default() -> Self {
        RunStats {
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            piggybacked: AtomicU64::new(0),
            plocal_fills: AtomicU64::new(0),
            prefetched: AtomicU64::new(0),
            prefetch_sampled: AtomicU64::new(0),
            prefetch_sample_used: AtomicU64::new(0),
            prefetch_sample_wasted: AtomicU64::new(0),
            faulted_around: AtomicU64::new(0),
            preallocated: AtomicU64::new(0),
            prealloc_unused: AtomicU64::new(0),
            zero_writebacks_skipped: AtomicU64::new(0),
            heap_calls: AtomicU64::new(0),
            heap_call_ns: AtomicU64::new(0),
            heap_calls_local: AtomicU64::new(0),
            bytes_fetched: AtomicU64::new(0),
            bytes_flushed: AtomicU64::new(0),
            wp_faults: AtomicU64::new(0),
            tier_hits: AtomicU64::new(0),
            tier_stores: AtomicU64::new(0),
            tier_bytes_raw: AtomicU64::new(0),
            tier_bytes_packed: AtomicU64::new(0),
            tier_incompressible: AtomicU64::new(0),
            tier_writebacks: AtomicU64::new(0),
            tier_pack_ns: AtomicU64::new(0),
            tier_unpack_ns: AtomicU64::new(0),
            dirty_scans: AtomicU64::new(0),
            dirty_scanned_pages: AtomicU64::new(0),
            scan_clean_evictions: AtomicU64::new(0),
            writebacks_avoided: AtomicU64::new(0),
            processes: AtomicU64::new(0),
            faults_on_faulting_cpu: AtomicU64::new(0),
            faults_off_faulting_cpu: AtomicU64::new(0),
            fault_worker_moves: AtomicU64::new(0),
            fault_worker_partings: AtomicU64::new(0),
            miss_ns: histogram(),
            evict_ns: histogram(),
            rpc_ns: histogram(),
            install_ns: histogram(),
            errors: Mutex::new(Vec::new()),
            huge_pages: AtomicU64::new(0),
            huge_splits: AtomicU64::new(0),
            inline_evictions: AtomicU64::new(0),
            bg_evictions: AtomicU64::new(0),
            bg_writebacks: AtomicU64::new(0),
            bg_writeback_batches: AtomicU64::new(0),
            evictor_ns: AtomicU64::new(0),
            evictor_cpu_ns: AtomicU64::new(0),
        }
    }
}

impl RunStats {
    pub fn json(&self) -> serde_json::Value {
        let h = self.miss_ns.lock().unwrap();
        let p50 = |m: &Mutex<Histogram<u64>>| m.lock().unwrap().value_at_quantile(0.5);
        serde_json::json!({
            "misses": self.misses.load(Relaxed),
            "evictions": self.evictions.load(Relaxed),
            "flushes": self.flushes.load(Relaxed),
            "piggybacked": self.piggybacked.load(Relaxed),
            "plocal_fills": self.plocal_fills.load(Relaxed),
            "prefetched": self.prefetched.load(Relaxed),
            "prefetch_sampled": self.prefetch_sampled.load(Relaxed),
            "prefetch_sample_used": self.prefetch_sample_used.load(Relaxed),
            "prefetch_sample_wasted": self.prefetch_sample_wasted.load(Relaxed),
            "faulted_around": self.faulted_around.load(Relaxed),
            "preallocated": self.preallocated.load(Relaxed),
            "prealloc_unused": self.prealloc_unused.load(Relaxed),
            "zero_writebacks_skipped": self.zero_writebacks_skipped.load(Relaxed),
            "heap_calls": self.heap_calls.load(Relaxed),
            "heap_call_ns": self.heap_call_ns.load(Relaxed),
            "heap_calls_local": self.heap_calls_local.load(Relaxed),
            "bytes_fetched": self.bytes_fetched.load(Relaxed),
            "bytes_flushed": self.bytes_flushed.load(Relaxed),
            "wp_faults": self.wp_faults.load(Relaxed),
            "tier_hits": self.tier_hits.load(Relaxed),
            "tier_stores": self.tier_stores.load(Relaxed),
            "tier_bytes_raw": self.tier_bytes_raw.load(Relaxed),
            "tier_bytes_packed": self.tier_bytes_packed.load(Relaxed),
            "tier_incompressible": self.tier_incompressible.load(Relaxed),
            "tier_writebacks": self.tier_writebacks.load(Relaxed),
            "tier_pack_ns": self.tier_pack_ns.load(Relaxed),
            "tier_unpack_ns": self.tier_unpack_ns.load(Relaxed),
            "dirty_scans": self.dirty_scans.load(Relaxed),
            "dirty_scanned_pages": self.dirty_scanned_pages.load(Relaxed),
            "scan_clean_evictions": self.scan_clean_evictions.load(Relaxed),
            "writebacks_avoided": self.writebacks_avoided.load(Relaxed),
            "processes": self.processes.load(Relaxed),
            "faults_on_faulting_cpu": self.faults_on_faulting_cpu.load(Relaxed),
            "faults_off_faulting_cpu": self.faults_off_faulting_cpu.load(Relaxed),
            "fault_worker_moves": self.fault_worker_moves.load(Relaxed),
            "fault_worker_partings": self.fault_worker_partings.load(Relaxed),
            "miss_ns_p50": h.value_at_quantile(0.5),
            "miss_ns_p99": h.value_at_quantile(0.99),
            "miss_ns_mean": h.mean() as u64,
            "miss_breakdown_ns_p50": {"evict": p50(&self.evict_ns), "rpc": p50(&self.rpc_ns), "install": p50(&self.install_ns)},
            "errors": *self.errors.lock().unwrap(),
            "huge_pages": self.huge_pages.load(Relaxed),
            "huge_splits": self.huge_splits.load(Relaxed),
            "inline_evictions": self.inline_evictions.load(Relaxed),
            "bg_evictions": self.bg_evictions.load(Relaxed),
            "bg_writebacks": self.bg_writebacks.load(Relaxed),
            "bg_writeback_batches": self.bg_writeback_batches.load(Relaxed),
            "evictor_ns": self.evictor_ns.load(Relaxed),
            "evictor_cpu_ns": self.evictor_cpu_ns.load(Relaxed),
        })
    }
}
