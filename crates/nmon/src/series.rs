//! The series the nComponent records and renders (`splitos-metrics` explains the declarations).
splitos_metrics::series! {
    /// Requests served, by message.
    pub REQUESTS: Counter["msg"] = "ncomp_requests_total";
    /// Sockets open for programs.
    pub OPEN_SOCKETS: Gauge = "ncomp_open_sockets";
}

/// Every series of the nComponent: those above and its proxy's counters.
pub fn all() -> Vec<splitos_metrics::Entry> {
    [declared(), crate::proxy::Counters::declared()].concat()
}
