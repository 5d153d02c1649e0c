//! The series the pComponent records and renders (`splitos-metrics` explains the
//! declarations; its run counters are the ExCache's `counters!` sets).
splitos_metrics::series! {
    /// vNode file systems mounted for programs.
    pub VNODE_MOUNTS: Counter = "pcomp_vnode_mounts_total";
    /// Page faults outside a program's heap region, refused (the program fails).
    pub FAULT_EVENTS_REFUSED: Counter = "pcomp_fault_events_refused_total";
    /// Descriptors a program handed over as its heap's userfaultfd that were not one.
    pub FAULT_SOURCES_REFUSED: Counter = "pcomp_fault_sources_refused_total";
    /// Connections to the program socket refused (not a program this pComponent started).
    pub PROGRAM_CONNECTIONS_REFUSED: Counter = "pcomp_program_connections_refused_total";
    /// Calls refused for memory that were tried again once the vNode's ended processes had
    /// been released at their homes.
    pub CALLS_RETRIED_AFTER_RELEASES: Counter = "pcomp_calls_retried_after_releases_total";
    /// Tries of a program's start that found no manager, no live mComponent or no home to
    /// reach, and waited to try again.
    pub STARTS_WAITED_FOR_MANAGERS: Counter = "pcomp_starts_waited_for_managers_total";
    /// Tries of a file call (a vNode's sComponent, a file's buffer cache) that found no
    /// manager to answer, and waited to ask again.
    pub FILE_CALLS_WAITED_FOR_MANAGERS: Counter = "pcomp_file_calls_waited_for_managers_total";
    /// Tries of a socket call's question for its vNode's nComponent that found no manager to
    /// answer, and waited to ask again.
    pub NET_CALLS_WAITED_FOR_MANAGERS: Counter = "pcomp_net_calls_waited_for_managers_total";
    /// Creations of a process sent again to the home picked, which had not answered.
    pub CREATIONS_SENT_AGAIN: Counter = "pcomp_creations_sent_again_total";
    /// Homes picked for a new process given up after a creation that may have arrived
    /// (held lost, or silent too long): told the process ended, and another one picked.
    pub CREATIONS_GIVEN_UP: Counter = "pcomp_creations_given_up_total";
    /// Messages sent to mComponents to measure the links to them.
    pub LINK_PROBES: Counter = "pcomp_link_probes_total";
    /// ExCache lines holding a page.
    pub EXCACHE_USED_LINES: Gauge = "pcomp_excache_used_lines";
    /// ExCache lines, as last resized.
    pub EXCACHE_LINES: Gauge = "pcomp_excache_lines";
    /// ExCache lines interleaving keeps local for good.
    pub EXCACHE_PINNED_LINES: Gauge = "pcomp_excache_pinned_lines";
    /// ExCache lines a vNode keeps against other vNodes' misses.
    pub EXCACHE_SHARE_LINES: Gauge["vnode"] = "pcomp_excache_share_lines";
    /// ExCache lines the processes of a vNode with a share hold.
    pub EXCACHE_VNODE_LINES: Gauge["vnode"] = "pcomp_excache_vnode_lines";
    /// Bytes the compressed tier holds.
    pub TIER_USED_BYTES: Gauge = "pcomp_tier_used_bytes";
    /// Pages the compressed tier holds.
    pub TIER_ENTRIES: Gauge = "pcomp_tier_entries";
    /// ExCache misses of a running job (its run's processes), by the job's first pid and its vNode.
    pub JOB_MISSES: Counter["pid", "vnode"] = "pcomp_job_misses_total";
    /// ExCache lines a running job evicted.
    pub JOB_EVICTIONS: Counter["pid", "vnode"] = "pcomp_job_evictions_total";
    /// Lines a running job wrote back to mComponents.
    pub JOB_WRITEBACKS: Counter["pid", "vnode"] = "pcomp_job_writebacks_total";
}

/// Every series of the pComponent: those above and its counter sets' (the ExCache's are its
/// crate's).
pub fn all() -> Vec<splitos_metrics::Entry> {
    [
        declared(),
        crate::host::idle::IdlePollStats::declared(),
        crate::net::NetCounters::declared(),
    ]
    .concat()
}
