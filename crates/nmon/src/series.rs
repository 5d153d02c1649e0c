//! The series the nComponent records and renders, and its proxy's counters (`splitos-metrics`
//! explains the declarations).
use std::sync::atomic::AtomicU64;

use splitos_metrics::counters;

splitos_metrics::series! {
    /// Requests served, by message.
    pub REQUESTS: Counter["msg"] = "ncomp_requests_total";
    /// Sockets open for programs.
    pub OPEN_SOCKETS: Gauge = "ncomp_open_sockets";
}

counters! {
    /// The proxy's counters: keys of the nComponent's statistics and the series
    /// `splitos_ncomp_<counter>_total`.
    pub struct Counters: "ncomp" {
        /// Sockets opened for programs.
        sockets,
        /// Connections programs opened.
        connects,
        /// Connections programs' listening sockets accepted.
        accepts,
        /// Bytes programs' sockets sent on this host's stack.
        wire_sent_bytes,
        /// Bytes programs' sockets received on this host's stack.
        wire_received_bytes,
        /// Bytes that came from the stubs in their requests (the DDIO path).
        ddio_sent_bytes,
        /// Bytes that went to the stubs in the answers to their requests (the DDIO path).
        ddio_received_bytes,
        /// Bytes that came from the stubs through socket buffers on mComponents (the DMA path).
        dma_sent_bytes,
        /// Bytes that went to the stubs through socket buffers on mComponents (the DMA path).
        dma_received_bytes,
        /// Datagrams programs' datagram sockets sent on this host's stack.
        datagrams_sent,
        /// Datagrams programs' datagram sockets received on this host's stack.
        datagrams_received,
        /// Datagrams dropped: the kernel refused them, or they were for a loopback port of
        /// another vNode.
        datagrams_dropped,
        /// Requests refused: a socket of another pComponent, a loopback port the vNode does not
        /// hold.
        refused,
    }
    also {
        /// Sockets open for programs now.
        pub open: AtomicU64 = AtomicU64::new(0),
    }
}

/// Every series of the nComponent: those above and its proxy's counters.
pub fn all() -> Vec<splitos_metrics::Entry> {
    [declared(), Counters::declared()].concat()
}
