//! The series the Ebb runtime records (`splitos-metrics` explains the declarations).
splitos_metrics::series! {
    /// Representatives built on first use on a core (a miss in the Ebb's per-core table).
    pub REP_MISSES: Counter = "ebb_rep_misses_total";
    /// Ebbs replaced while the component ran (a policy swapped for another).
    pub REPLACEMENTS: Counter = "ebb_replacements_total";
    /// Events a core's event loop handled.
    pub LOOP_EVENTS: Counter["core"] = "ebb_loop_events_total";
    /// Times a core's event loop slept waiting for an event.
    pub LOOP_SLEEPS: Counter["core"] = "ebb_loop_sleeps_total";
    /// Times a core's event loop waited `coalesce` after work instead of sleeping in epoll.
    pub LOOP_COALESCED: Counter["core"] = "ebb_loop_coalesced_waits_total";
    /// Times a core's event loop switched between polling and sleeping, by what it switched to.
    pub LOOP_SWITCHES: Counter["core", "to"] = "ebb_loop_switches_total";
    /// Messages delivered to an Ebb of this component from another, by Ebb.
    pub MESSAGES_RECEIVED: Counter["ebb"] = "ebb_messages_received_total";
    /// Messages an Ebb of this component refused, by Ebb.
    pub MESSAGES_REFUSED: Counter["ebb"] = "ebb_messages_refused_total";
}
