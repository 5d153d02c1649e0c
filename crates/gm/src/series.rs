//! The series the global managers and their REST API record (`splitos-metrics` explains the
//! declarations; those of their state and placement policy are splitos-core's).
splitos_metrics::series! {
    /// 1 while this manager leads, 0 otherwise.
    pub LEADING: Gauge = "gm_leading";
    /// Elections this manager won.
    pub ELECTIONS_WON: Counter = "gm_elections_won_total";
    /// Requests a follower forwarded to the leader.
    pub FOLLOWER_REQUESTS: Counter = "gm_follower_requests_total";
    /// Components known, alive or not yet forgotten.
    pub COMPONENTS: Gauge = "gm_components";
    /// Heartbeats answered.
    pub HEARTBEATS: Counter = "gm_heartbeats_total";
    /// The heartbeat period the managers tell the components now (ms).
    pub HEARTBEAT_PERIOD_MS: Gauge = "gm_heartbeat_period_ms";
    /// Components known from the state when this manager started to lead.
    pub COMPONENTS_RESUMED: Gauge = "gm_components_resumed";
    /// Views of the cluster worked out for heartbeats' answers (each serves those of up to
    /// 100 ms, unless membership changes sooner).
    pub VIEWS: Counter = "gm_views_total";
    /// Registrations of components (first ones and again after a restart).
    pub REGISTRATIONS: Counter = "gm_registrations_total";
    /// Components forgotten after no heartbeat for `forget_dead`.
    pub COMPONENTS_FORGOTTEN: Counter = "gm_components_forgotten_total";
    /// mComponents declared lost that came back, fenced (they drop their copies).
    pub MCOMPONENTS_FENCED: Counter = "gm_mcomponents_fenced_total";
    /// mComponents that left once detached (their memory moved elsewhere).
    pub MCOMPONENTS_DETACHED: Counter = "gm_mcomponents_detached_total";
    /// Detaches of mComponents asked for.
    pub MCOMPONENT_DETACHES: Counter = "gm_mcomponent_detaches_total";
    /// Attaches of mComponents asked for.
    pub MCOMPONENT_ATTACHES: Counter = "gm_mcomponent_attaches_total";
    /// Rebalances started, moving memory from the fullest mComponent to the emptiest.
    pub REBALANCES: Counter = "gm_rebalances_total";
    /// ExCache resizes asked of pComponents.
    pub EXCACHE_CHANGES: Counter = "gm_excache_changes_total";
    /// Policy swaps asked of pComponents.
    pub POLICY_CHANGES: Counter = "gm_policy_changes_total";
    /// Programs placed on a pComponent (GPM).
    pub GPM_PLACEMENTS: Counter = "gpm_placements_total";
    /// vRegions placed on an mComponent (GMM).
    pub GMM_VREGION_PLACEMENTS: Counter = "gmm_vregion_placements_total";
    /// vNodes' file caches placed on an mComponent (GMM).
    pub GMM_FILE_CACHE_PLACEMENTS: Counter = "gmm_file_cache_placements_total";
    /// Sockets placed on an nComponent (GNM).
    pub GNM_PLACEMENTS: Counter = "gnm_placements_total";
    /// REST API requests whose credentials were accepted.
    pub API_REQUESTS: Counter = "gm_api_requests_total";
    /// REST API requests refused, by the status answered.
    pub API_REQUESTS_REFUSED: Counter["status"] = "gm_api_requests_refused_total";
    /// Event streams (the dashboard's) open now.
    pub API_EVENT_STREAMS: Gauge = "gm_api_event_streams";
    /// Components that joined with a join token.
    pub JOINS: Counter = "gm_joins_total";
    /// Joins refused (an unknown, used or expired token).
    pub JOINS_REFUSED: Counter = "gm_joins_refused_total";
}
