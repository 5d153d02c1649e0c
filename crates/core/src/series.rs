//! The series the shared parts of every component record: the HTTP servers, the metrics
//! server, a component's registration with the managers, and the managers' state and
//! placement (`splitos-metrics` explains the declarations).
splitos_metrics::series! {
    /// The splitos version and wire version this component runs (always 1).
    pub BUILD_INFO: Gauge["version", "wire"] = "build_info";
    /// Scrapes of the metrics address refused beyond loopback for want of an admin token.
    pub SCRAPES_REFUSED: Counter = "metrics_scrapes_refused_total";
    /// HTTP connections an HTTP server closed as soon as it accepted them, by server and by
    /// the cap they met (`peer`: one peer's connections; `all`: the server's).
    pub HTTP_CONNECTIONS_REFUSED: Counter["server", "cap"] = "http_connections_refused_total";
    /// TLS handshakes an HTTPS server saw fail or time out, by server.
    pub TLS_HANDSHAKES_FAILED: Counter["server"] = "http_tls_handshakes_failed_total";
    /// Times this component found that the global managers have another leader.
    pub NODE_GM_LEADER_CHANGES: Counter = "node_gm_leader_changes_total";
    /// Stops of this component (SIGSTOP, a stalled host) long enough to be taken for a death.
    pub NODE_STOPS_NOTICED: Counter = "node_stops_noticed_total";
    /// Requests held after such a stop until the managers answered a heartbeat.
    pub NODE_REQUESTS_HELD_AFTER_STOPS: Counter = "node_requests_held_after_stops_total";
    /// The heartbeat period the managers told this component last (ms; 300 until they tell one).
    pub NODE_HEARTBEAT_PERIOD_MS: Gauge = "node_heartbeat_period_ms";
    /// Times the managers did not know this component at a heartbeat and it registered again.
    pub NODE_REGISTRATIONS_AGAIN: Counter = "node_registrations_again_total";
    /// Placement policies the managers swapped in while the cluster ran.
    pub GM_PLACEMENT_SWAPS: Counter = "gm_placement_swaps_total";
    /// Records of the managers' state written (etcd puts and deletes, or the state file's).
    pub GM_STATE_WRITES: Counter = "gm_state_writes_total";
    /// Records of the managers' state that could not be read (left out of what was loaded).
    pub GM_STATE_UNREADABLE: Counter = "gm_state_unreadable_total";
    /// Records of the managers' state whose tag did not verify: forged or written with
    /// another key, refused.
    pub GM_STATE_UNSIGNED: Counter = "gm_state_unsigned_total";
}
