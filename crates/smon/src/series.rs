//! The series the sComponent records and renders (`splitos-metrics` explains the declarations).
splitos_metrics::series! {
    /// Requests served, by message.
    pub REQUESTS: Counter["msg"] = "scomp_requests_total";
    /// File syncs made durable for programs.
    pub SYNCS: Counter = "scomp_syncs_total";
    /// Bytes of vNodes' files read.
    pub READ_BYTES: Counter = "scomp_read_bytes_total";
    /// Bytes of vNodes' files written.
    pub WRITTEN_BYTES: Counter = "scomp_written_bytes_total";
    /// Bytes appended to mComponents' backup files.
    pub BACKUP_APPENDED_BYTES: Counter = "scomp_backup_appended_bytes_total";
    /// Changes of a backup file refused because the disk was full.
    pub BACKUP_DISK_FULL: Counter = "scomp_backup_disk_full_total";
    /// Backup files compacted (each page's latest record kept).
    pub BACKUP_COMPACTIONS: Counter = "scomp_backup_compactions_total";
    /// Times the namespace database was opened again after an I/O error poisoned it (a full
    /// disk): changes not yet synced were rolled back.
    pub NAMESPACE_REOPENED: Counter = "scomp_namespace_reopened_total";
    /// Times the room kept on the disk for the namespace database was given up to it (the
    /// disk nearly full): its commits found room instead of failing.
    pub NAMESPACE_RESERVE_RELEASED: Counter = "scomp_namespace_reserve_released_total";
    /// Bytes the vNodes' files take.
    pub USED_BYTES: Gauge = "scomp_used_bytes";
}
