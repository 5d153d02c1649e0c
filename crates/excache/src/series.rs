//! The series the ExCache and its page stores record (`splitos-metrics` explains the
//! declarations; the run counters are the `counters!` sets of `stats.rs` and `onesided.rs`).
splitos_metrics::series! {
    /// Times the ExCache was resized while programs ran.
    pub EXCACHE_RESIZES: Counter = "pcomp_excache_resizes_total";
    /// Policies swapped while programs ran, by which (`eviction` or `prefetch`).
    pub POLICY_SWAPS: Counter["policy"] = "pcomp_policy_swaps_total";
    /// Pages fetched whose checksum did not match what was written back.
    pub CHECKSUM_FAILURES: Counter = "pcomp_checksum_failures_total";
    /// Fetches of striped (erasure-coded) pages, counting each stripe asked for.
    pub FETCH_STRIPES: Counter = "pcomp_fetch_stripes_total";
    /// Processes whose home mComponent moved (the old one was leaving).
    pub HOME_MOVES: Counter = "pcomp_home_moves_total";
    /// Times a request waited for an mComponent that did not answer but was not declared lost.
    pub LATE_MCOMPONENT_WAITS: Counter = "pcomp_late_mcomponent_waits_total";
    /// Write-backs that found their owner mComponent full (its vRegion then moves).
    pub OWNER_FULL: Counter = "pcomp_owner_full_total";
    /// Corrupted pages repaired from another replica, the parity or the backup log.
    pub PAGES_REPAIRED: Counter = "pcomp_pages_repaired_total";
    /// Replicas reported lost to their process's home.
    pub REPLICAS_LOST: Counter = "pcomp_replicas_lost_total";
    /// Times a process's backup home took over from a lost home.
    pub HOME_TAKEOVERS: Counter = "pcomp_home_takeovers_total";
}

/// Every series of the ExCache: those above and its counter sets'.
pub fn all() -> Vec<splitos_metrics::Entry> {
    [
        declared(),
        crate::stats::RunStats::declared(),
        crate::onesided::OneSidedStats::declared(),
    ]
    .concat()
}
