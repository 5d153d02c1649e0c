//! The series the nComponent records and renders (`splitos-metrics` explains the declarations).
splitos_metrics::series! {
    /// Requests served, by message.
    pub REQUESTS: Counter["msg"] = "ncomp_requests_total";
    /// Bytes moved between programs' stubs and this nComponent, by direction and path (`ddio`:
    /// in the requests and their answers; `dma`: through socket buffers on mComponents).
    pub PATH_BYTES: Counter["dir", "path"] = "ncomp_path_bytes_total";
    /// Bytes programs' sockets sent and received on this host's stack, by direction.
    pub WIRE_BYTES: Counter["dir"] = "ncomp_wire_bytes_total";
    /// Connections programs opened to other hosts.
    pub CONNECTS: Counter = "ncomp_connects_total";
    /// Connections programs' listening sockets accepted.
    pub ACCEPTS: Counter = "ncomp_accepts_total";
    /// Sockets open for programs.
    pub OPEN_SOCKETS: Gauge = "ncomp_open_sockets";
}
