//! Counters of the miss path: per run (all processes one `splitos run` started) and for the
//! whole pComponent.
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

use hdrhistogram::Histogram;

use splitos_metrics::counters;

counters! {
    /// Counters of one `splitos run` (all processes it started) or of the whole pComponent.
    /// Each is a key of the run's and the pComponent's statistics and, for the whole
    /// pComponent, the Prometheus metric `pcomp_<counter>_total`.
    pub struct RunStats: "pcomp" {
        /// Misses served: the line fetched, decompressed from the compressed tier or filled
        /// in the pComponent.
        misses,
        /// Lines evicted from the ExCache, on a miss's way or by the background evictor.
        evictions,
        /// Lines written back to the mComponents.
        flushes,
        /// Of the write-backs, the ones handed to the page store with a miss's fetch
        /// (piggyback): one round trip by message, or copies where one-sided access reaches
        /// the owner (counted in `one_sided.writes` too).
        piggybacked,
        /// Misses on p-local lines (never left this pComponent), zero-filled without a
        /// round trip.
        plocal_fills,
        /// Lines fetched ahead of a miss with it (read-ahead) and installed clean.
        prefetched,
        /// Lines pinned local for good by interleaving when they were filled (the job's or
        /// the pComponent's `interleave`).
        pinned,
        /// Read-ahead lines kept in the pComponent as samples (one in `prefetch::SAMPLE`).
        prefetch_sampled,
        /// Of the samples, the ones the program touched.
        prefetch_sample_used,
        /// Of the samples, the ones evicted untouched.
        prefetch_sample_wasted,
        /// Fresh lines installed zero-filled and writable next to a first touch (fault-around).
        faulted_around,
        /// Fresh lines made resident in the memfd ahead of the program (pre-allocation):
        /// touching one is an ordinary page fault, not a trap.
        preallocated,
        /// Pre-allocated lines still all zeros when they were evicted or written back: the
        /// program never wrote them.
        prealloc_unused,
        /// Dirty lines that never left this pComponent and were still all zeros when evicted
        /// or written back: no write-back was sent (a later miss fills them with zeros again).
        zero_writebacks_skipped,
        /// The program's virtual-memory calls on its heap (mmap, munmap, mprotect, madvise,
        /// mremap).
        heap_calls,
        /// The time the pComponent spent answering the program's heap calls.
        heap_call_ns,
        /// Of the heap calls, the ones answered without asking the home mComponent.
        heap_calls_local,
        /// Of the heap calls, the ones answered before the home mComponent had them (an
        /// unmap, a protection change no home would refuse): the home is told after the reply.
        heap_calls_posted,
        /// Of the posted heap calls, the ones the home refused after the program had its
        /// answer (logged; expected never).
        heap_calls_posted_refused,
        /// Of the heap calls, the ones the pComponent's thread serving the program found
        /// without sleeping for them: caught while polling (`heap_call_spin_us`), or already
        /// waiting when it looked.
        heap_calls_polled,
        /// Bytes fetched from the mComponents (misses and their read-ahead).
        bytes_fetched,
        /// Bytes written back to the mComponents.
        bytes_flushed,
        /// Write-protect faults: first writes to lines installed write-protected.
        wp_faults,
        /// Access sampling: resident lines unmapped (kept in the memfd) so that their next touch
        /// shows they are in use.
        sample_unmaps,
        /// Access sampling: the unmap requests that carried them (one per process per batch).
        sample_unmap_calls,
        /// Access sampling: unmapped lines found mapped again (touched) when they would have
        /// left, each a reference bit.
        sample_touches,
        /// Misses served by decompressing the line from the compressed tier (no round trip).
        tier_hits,
        /// Victims compressed into the tier.
        tier_stores,
        /// The bytes of the victims compressed into the tier, before compression.
        tier_bytes_raw,
        /// The same, after compression.
        tier_bytes_packed,
        /// Victims that compressed too poorly for the tier (dirty ones went to the store).
        tier_incompressible,
        /// Tier entries written to the store: pushed out dirty, or before a fork or an mremap.
        /// Also counted in `flushes`.
        tier_writebacks,
        /// CPU time compressing (stored and refused victims).
        tier_pack_ns,
        /// CPU time decompressing (hits, write-backs).
        tier_unpack_ns,
        /// Dirty tracking by scan: PAGEMAP_SCAN requests (a range with many written runs may
        /// take more than one call).
        dirty_scans,
        /// The pages the PAGEMAP_SCAN requests covered.
        dirty_scanned_pages,
        /// Evicted lines a scan found unwritten since their last write-back or fetch: dropped
        /// without a write-back.
        scan_clean_evictions,
        /// Of the evicted lines a scan found unwritten, the ones a read miss filled (not read
        /// ahead): fault tracking installs such a line writable and dirty, and writes it back,
        /// whenever its process predicts writes (most of its read misses followed by a
        /// write), as wordfreq's does most of its run.
        writebacks_avoided,
        /// Processes that became the pComponent's (started or forked).
        processes,
        /// With `fault_cpu = "faulting"`: faults a worker served on the CPU the faulting
        /// thread was on (as last read).
        faults_on_faulting_cpu,
        /// With `fault_cpu = "faulting"`: faults a worker served on another CPU than the
        /// faulting thread's.
        faults_off_faulting_cpu,
        /// The times a fault worker moved to another CPU.
        fault_worker_moves,
        /// The times a fault worker went to serve from elsewhere for a while because the
        /// thread it sat beside was put on another (idle) CPU.
        fault_worker_partings,
        /// Fresh 2 MiB extents pre-allocated as huge pages (their lines also count in
        /// `preallocated`, less the touched one).
        huge_pages,
        /// Huge pages split into 4 KiB pages because part of them left the program.
        huge_splits,
        /// Lines evicted on a miss's way (for the line, its read-ahead or its fault-around):
        /// the miss waited for them. Also counted in `evictions`.
        inline_evictions,
        /// Lines of this run a miss of another run evicted: the ExCache is shared, and the
        /// others' misses took them (for the whole pComponent: every line one run took from
        /// another).
        evicted_by_others,
        /// Dirty victims taken out of their programs with their contents in one step (splice
        /// into a pipe, punch, read: one TLB flush), not write-protected first for the copy.
        taken_dirty,
        /// Lines the background evictor took out ahead of the misses. Also counted in
        /// `evictions`.
        bg_evictions,
        /// Of those, the lines that left beside a victim, in its run (`evict_beside`).
        evicted_beside,
        /// The runs of neighbouring pages the background evictor took out, each in one step
        /// (one hole punch, one TLB flush) unless a page of it could not be copied.
        bg_eviction_runs,
        /// Pages the background evictor wrote back: dirty victims, and the dirty tier entries
        /// they pushed out.
        bg_writebacks,
        /// The messages that carried the background evictor's write-backs.
        bg_writeback_batches,
        /// Time the background evictor spent working, between its sleeps (a run is charged
        /// its share of the lines of each round).
        evictor_ns,
        /// The CPU time of the background evictor's thread in those rounds, charged the same
        /// way.
        evictor_cpu_ns,
    }
    also {
        pub miss_ns: Mutex<Histogram<u64>> = histogram(),
        /// Where a miss spends its time inside the pComponent: choosing and dropping a
        /// victim, the network round trip(s), and installing the line into the program.
        pub evict_ns: Mutex<Histogram<u64>> = histogram(),
        pub rpc_ns: Mutex<Histogram<u64>> = histogram(),
        pub install_ns: Mutex<Histogram<u64>> = histogram(),
        pub errors: Mutex<Vec<String>> = Mutex::default(),
        /// Pages its processes had lines for (each page of a process once, fetched,
        /// filled or read ahead), summed over the processes alive, and the most at once:
        /// the ExCache the run needs, processes that ran one after another not added up;
        /// and the lines claimed again for pages already had (capacity and conflict misses).
        pub pages: Pages = Pages::default(),
    }
}

/// The pages a run's processes had lines for: summed over the processes alive, the most
/// that sum reached, and the lines claimed again for a page its process had already had
/// (each one a page the ExCache evicted and the process wanted back).
#[derive(Default)]
pub struct Pages {
    now: AtomicU64,
    peak: AtomicU64,
    again: AtomicU64,
}

impl Pages {
    pub fn first(&self) {
        let now = self.now.fetch_add(1, Relaxed) + 1;
        self.peak.fetch_max(now, Relaxed);
    }

    pub fn again(&self) {
        self.again.fetch_add(1, Relaxed);
    }

    /// A process that had `n` pages left.
    pub fn left(&self, n: u64) {
        self.now.fetch_sub(n, Relaxed);
    }

    pub fn peak(&self) -> u64 {
        self.peak.load(Relaxed)
    }

    pub fn had_again(&self) -> u64 {
        self.again.load(Relaxed)
    }
}

fn histogram() -> Mutex<Histogram<u64>> {
    Mutex::new(Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds"))
}

impl RunStats {
    /// The counters, the miss latencies and the errors, as `--stats-json` and the
    /// pComponent's statistics (`totals`) show them.
    pub fn json(&self) -> serde_json::Value {
        let mut j = counters::json(self.counters());
        let p50 = |m: &Mutex<Histogram<u64>>| m.lock().unwrap().value_at_quantile(0.5);
        let h = self.miss_ns.lock().unwrap();
        j.insert("miss_ns_p50".into(), h.value_at_quantile(0.5).into());
        j.insert("miss_ns_p99".into(), h.value_at_quantile(0.99).into());
        j.insert("miss_ns_mean".into(), (h.mean() as u64).into());
        j.insert("miss_breakdown_ns_p50".into(), serde_json::json!({"evict": p50(&self.evict_ns), "rpc": p50(&self.rpc_ns), "install": p50(&self.install_ns)}));
        // The tail is where a miss's mean goes: the mean and the 99th percentile of each part.
        let mean = |m: &Mutex<Histogram<u64>>| m.lock().unwrap().mean() as u64;
        let p99 = |m: &Mutex<Histogram<u64>>| m.lock().unwrap().value_at_quantile(0.99);
        j.insert("miss_breakdown_ns_mean".into(), serde_json::json!({"evict": mean(&self.evict_ns), "rpc": mean(&self.rpc_ns), "install": mean(&self.install_ns)}));
        j.insert("miss_breakdown_ns_p99".into(), serde_json::json!({"evict": p99(&self.evict_ns), "rpc": p99(&self.rpc_ns), "install": p99(&self.install_ns)}));
        j.insert("errors".into(), self.errors.lock().unwrap().clone().into());
        j.insert("pages_peak".into(), self.pages.peak().into());
        j.insert("pages_again".into(), self.pages.had_again().into());
        j.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    /// Keys that scripts/bench and the end-to-end tests read from `--stats-json` and the
    /// pComponent's statistics, and Prometheus metrics the tests read.
    const READ_KEYS: &[&str] = &[
        "misses",
        "evictions",
        "flushes",
        "processes",
        "prefetch_sample_used",
        "prefetch_sample_wasted",
        "evicted_by_others",
        "miss_ns_p50",
        "miss_ns_p99",
        "miss_breakdown_ns_p50",
        "errors",
        "pages_peak",
        "pages_again",
        "taken_dirty",
        "evicted_beside",
        "bg_eviction_runs",
    ];
    const READ_METRICS: &[&str] = &[
        "splitos_pcomp_misses_total",
        "splitos_pcomp_tier_hits_total",
        "splitos_pcomp_tier_writebacks_total",
        "splitos_pcomp_tier_stores_total",
        "splitos_pcomp_dirty_scans_total",
        "splitos_pcomp_wp_faults_total",
        "splitos_pcomp_bg_evictions_total",
        "splitos_pcomp_inline_evictions_total",
        "splitos_pcomp_bg_writeback_batches_total",
        "splitos_pcomp_evictor_seconds_total",
        "splitos_pcomp_faults_on_faulting_cpu_total",
        "splitos_pcomp_huge_pages_total",
    ];

    #[test]
    fn json_and_prometheus_name_every_counter() {
        let s = RunStats::default();
        // A distinct value per counter, so that a counter shown under another's name fails.
        for (i, c) in s.counters().enumerate() {
            c.atomic.store(1000 + i as u64, Relaxed);
        }
        let json = s.json();
        let mut e = splitos_metrics::Exposition::new(String::new());
        s.render(&mut e);
        let text = e.text();
        for c in s.counters() {
            assert_eq!(json[c.name], c.value(), "{}", c.name);
            let (metric, value) = c.metric("pcomp");
            let metric = format!("splitos_{metric}");
            assert!(
                text.lines().any(|l| l == format!("{metric} {value}")),
                "{metric} in\n{text}"
            );
            assert!(
                text.lines()
                    .any(|l| l.starts_with(&format!("# HELP {metric} ")) && l.len() > metric.len() + 10),
                "{metric}'s help in\n{text}"
            );
        }
        for k in READ_KEYS {
            assert!(json.get(k).is_some(), "{k} in {json}");
        }
        for m in READ_METRICS {
            assert!(text.contains(&format!("\n{m} ")), "{m} in\n{text}");
        }
    }
}
