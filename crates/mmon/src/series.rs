//! The series the mComponent records (`splitos-metrics` explains the declarations).
splitos_metrics::series! {
    /// Requests served, by message.
    pub REQUESTS: Counter["msg"] = "mcomp_requests_total";
    /// Bytes promised to writable mappings (strict overcommit), now.
    pub COMMITTED_BYTES: Gauge = "mcomp_committed_bytes";
    /// Bytes of pages held, now.
    pub USED_BYTES: Gauge = "mcomp_used_bytes";
    /// Bytes no other vNode may take, now: every vNode's share.
    pub TAKEN_BYTES: Gauge = "mcomp_taken_bytes";
    /// Creations and forks of a process sent again by its pComponent (the first answer was
    /// late or lost), answered as the first was.
    pub CREATIONS_REPEATED: Counter = "mcomp_creations_repeated_total";
    /// Creations refused because their pComponent had said the process ended: it gave up
    /// waiting for this mComponent and made the process elsewhere.
    pub CREATIONS_AFTER_END: Counter = "mcomp_creations_after_end_total";
    /// Creations their pComponent gave up (`P2M_CREATE_UNDO`): this mComponent did not answer
    /// in time, and the process is made elsewhere or by a creation sent again.
    pub CREATIONS_UNDONE: Counter = "mcomp_creations_undone_total";
    /// Copies of a home's state refused because that home was declared lost (it went on
    /// before hearing so).
    pub STALE_HOME_SYNCS: Counter = "mcomp_stale_home_syncs_total";
    /// Times the managers fenced this mComponent (it let go of every process it held).
    pub FENCED: Counter = "mcomp_fenced_total";
    /// Times freed memory was given back to the host (malloc_trim).
    pub MEMORY_TRIMS: Counter = "mcomp_memory_trims_total";
    /// Write-backs refused because they were sent for replica sets that have changed since.
    pub STALE_WRITES_REFUSED: Counter = "mcomp_stale_writes_refused_total";
    /// Write-backs that found this owner full (heuristic overcommit; the vRegion then moves).
    pub FULL_WRITES: Counter = "mcomp_full_writes_total";
    /// Parity deltas sent to the parity members of striped sets.
    pub PARITY_DELTAS_SENT: Counter = "mcomp_parity_deltas_sent_total";
    /// vRegions left without their backup log (the log had no room or its sComponent failed).
    pub LOG_UNPROTECTED_VREGIONS: Counter = "mcomp_log_unprotected_vregions_total";
    /// Promotions of this mComponent's log refused: the log did not protect the vRegion
    /// (it skipped write-backs, so the backup is not whole).
    pub LOG_PROMOTIONS_REFUSED: Counter = "mcomp_log_promotions_refused_total";
    /// Backup-log records skipped for want of room in the log.
    pub LOG_SKIPPED_RECORDS: Counter = "mcomp_log_skipped_records_total";
    /// Bytes of the backup log streamed to sComponents.
    pub LOG_STREAMED_BYTES: Counter = "mcomp_log_streamed_bytes_total";
    /// Backup-log batches an sComponent refused for good (dropped; the vRegion is unprotected).
    pub LOG_REFUSED: Counter = "mcomp_log_refused_total";
    /// Backup-log batches retried because the sComponent could not be reached.
    pub LOG_STREAM_RETRIES: Counter = "mcomp_log_stream_retries_total";
    /// As a home: loggers made primary of a vRegion whose primary was lost.
    pub LOGGERS_PROMOTED: Counter = "mcomp_loggers_promoted_total";
    /// As a home: vRegions copied to their logger again after its log skipped write-backs.
    pub LOG_RESYNCS: Counter = "mcomp_log_resyncs_total";
    /// As a home: vRegions left with fewer members than the replication scheme asks.
    pub UNPROTECTED_VREGIONS: Counter = "mcomp_unprotected_vregions_total";
    /// As a home: times a call waited for an mComponent that did not answer but was not
    /// declared lost.
    pub LATE_MCOMPONENT_WAITS: Counter = "mcomp_late_mcomponent_waits_total";
    /// Times this mComponent, a backup home, took over a process whose home was lost.
    pub HOME_TAKEOVERS: Counter = "mcomp_home_takeovers_total";
    /// Processes whose home was handed to this mComponent by a leaving one.
    pub HOMES_ADOPTED: Counter = "mcomp_homes_adopted_total";
    /// Processes whose home this mComponent handed to another as it left.
    pub HOMES_HANDED_OFF: Counter = "mcomp_homes_handed_off_total";
    /// As a home: vRegions moved off a full mComponent to balance memory.
    pub REBALANCE_MOVES: Counter = "mcomp_rebalance_moves_total";
    /// As a home: vRegions that could not move or be rebuilt for want of room anywhere.
    pub NO_ROOM: Counter = "mcomp_no_room_total";
    /// As a home: vRegions moved off a member (a full owner, one leaving, or one a pComponent
    /// could not reach) to another.
    pub VREGIONS_MOVED: Counter = "mcomp_vregions_moved_total";
    /// As a home: vRegions moved off a member a pComponent could not reach while this home
    /// could (a path lost between their hosts).
    pub VREGIONS_MOVED_UNREACHED: Counter = "mcomp_vregions_moved_unreached_total";
    /// As a home: vRegions none of whose members could be reached (the program fails on them).
    pub VREGIONS_UNREACHABLE: Counter = "mcomp_vregions_unreachable_total";
    /// As a home: vRegions given a new member in place of a lost one.
    pub REBUILT_VREGIONS: Counter = "mcomp_rebuilt_vregions_total";
    /// As a home: pages copied or reconstructed onto new members.
    pub REBUILT_PAGES: Counter = "mcomp_rebuilt_pages_total";
    /// As a home: rebuilt pages whose survivors' copies were corrupted (they fail when fetched).
    pub REBUILT_PAGES_CORRUPT: Counter = "mcomp_rebuilt_pages_corrupt_total";
    /// As a home: processes whose pComponent was lost, their memory released.
    pub LOST_PROCESSES_RELEASED: Counter = "mcomp_lost_processes_released_total";
    /// Socket buffers held for the nComponent path through memory (DMA), now.
    pub NETBUFS: Gauge = "mcomp_netbufs";
    /// Bytes a vNode's processes hold here, by vNode.
    pub VNODE_MEMORY_BYTES: Gauge["vnode"] = "mcomp_vnode_memory_bytes";
    /// The memory quota of a vNode, in bytes, by vNode.
    pub VNODE_MEMORY_QUOTA_BYTES: Gauge["vnode"] = "mcomp_vnode_memory_quota_bytes";
    /// Requests refused for a vNode beyond its memory quota, by vNode.
    pub VNODE_MEMORY_REFUSED: Counter["vnode"] = "mcomp_vnode_memory_refused_total";
}

/// Every series of the mComponent: those above and its counter sets'.
pub fn all() -> Vec<splitos_metrics::Entry> {
    [
        declared(),
        crate::Counters::declared(),
        crate::bcache::Counters::declared(),
        crate::lease::HandoutStats::declared(),
    ]
    .concat()
}
