//! The series the RPC layer records: its servers, transports and polling (`splitos-metrics`
//! explains the declarations).
splitos_metrics::series! {
    /// Messages sent to an Ebb of another component, by Ebb.
    pub EBB_MESSAGES_SENT: Counter["ebb"] = "ebb_messages_sent_total";
    /// Waits that polled for their answer before sleeping.
    pub POLL_SPINS: Counter = "poll_spins_total";
    /// Polling waits whose budget ran out before the answer came (they then slept).
    pub POLL_SLEEPS: Counter = "poll_sleeps_total";
    /// Waits that did not poll at all: the adaptive budget had learnt polling did not pay.
    pub POLL_SKIPPED: Counter = "poll_skipped_total";
    /// Waits that did not poll because every CPU polling may use was taken by another.
    pub POLL_CROWDED: Counter = "poll_crowded_total";
    /// Requests a receiving thread handed to a worker pool (`fan-out`: those that call other
    /// components, from receivers several callers share; `workers`: the leaf pool), rather
    /// than serving them itself.
    pub REQUESTS_HANDED_OFF: Counter["pool"] = "rpc_requests_handed_off_total";
    /// Requests refused because the sender's role may not send them.
    pub REQUESTS_REFUSED: Counter = "rpc_requests_refused_total";
    /// Calls that waited for a credit (their peer held as many of this component's requests
    /// as it grants).
    pub CREDIT_WAITS: Counter = "rpc_credit_waits_total";
    /// Shared-memory channels a server refused to open for want of credit, waited out by
    /// this component.
    pub SHM_CHANNELS_REFUSED: Counter = "rpc_shm_channels_refused_total";
    /// Shared-memory channels closed after being idle.
    pub SHM_IDLE_CLOSED: Counter = "rpc_shm_idle_closed_total";
    /// Malformed frames or requests rejected (the connection or channel is closed; others
    /// are still served).
    pub FRAMES_REJECTED: Counter = "rpc_frames_rejected_total";
    /// Shared-memory channels served by an event loop now.
    pub LOOP_CHANNELS: Gauge = "rpc_loop_channels";
    /// Shared-memory channels open to this server now.
    pub SHM_CHANNELS: Gauge = "rpc_shm_channels";
    /// The most shared-memory channels one client process held at once.
    pub SHM_PEER_CHANNELS_PEAK: Gauge = "rpc_shm_peer_channels_peak";
    /// Requests after which a channel's serving thread followed its caller to the caller's
    /// CPU's neighbourhood.
    pub SHM_FOLLOWED: Counter = "rpc_shm_followed_total";
    /// Times a channel's serving thread moved to another CPU to follow its caller.
    pub SHM_SERVER_MOVES: Counter = "rpc_shm_server_moves_total";
    /// Shared-memory channels refused because their client had no credit left.
    pub SHM_OVER_CREDIT: Counter = "rpc_shm_over_credit_total";
    /// Shared-memory channels refused for a client that may not open one.
    pub SHM_REFUSED: Counter = "rpc_shm_refused_total";
    /// Requests served over shared memory.
    pub SHM_REQUESTS: Counter = "rpc_shm_requests_total";
    /// Requests whose caller said no program waits on it: the channel's thread slept, without
    /// polling, until the next one.
    pub SHM_UNHURRIED: Counter = "rpc_shm_unhurried_total";
    /// TCP connections refused for exceeding a per-peer or total cap.
    pub CONNECTIONS_REFUSED: Counter = "rpc_connections_refused_total";
    /// TCP connections whose handshake completed.
    pub TCP_CONNECTIONS_ACCEPTED: Counter = "rpc_tcp_connections_accepted_total";
    /// TCP connections whose handshake failed (bad key, wrong cluster, garbage).
    pub HANDSHAKES_REFUSED: Counter = "rpc_handshakes_refused_total";
    /// Frames a peer did not finish sending within the frame timeout (the connection closes).
    pub FRAMES_TIMED_OUT: Counter = "rpc_frames_timed_out_total";
    /// Writes delayed on purpose (`tcp_delay_us`, to study a slow link).
    pub INJECTED_DELAYS: Counter = "rpc_injected_delays_total";
    /// Replies that could not be sent (too large, or the connection broke).
    pub REPLIES_UNDELIVERED: Counter = "rpc_replies_undelivered_total";
    /// Times a peer sent more requests than its credits allow (they wait in its socket).
    pub REQUESTS_OVER_CREDIT: Counter = "rpc_requests_over_credit_total";
    /// TCP connections served by an event loop now.
    pub LOOP_CONNECTIONS: Gauge = "rpc_loop_connections";
}
