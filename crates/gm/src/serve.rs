//! How the managers serve their requests: on which threads, and which requests where they
//! arrive.
use splitos_rpc::server::ServerConfig;
use splitos_rpc::Msg;

/// Whether `msg` is answered from the managers' memory alone: heartbeats and placement
/// questions, the bulk of what they serve, are answered on the event loop they arrive on
/// (a hand-off to a worker per request cost more than the answer). The rest may wait on the
/// state's store (etcd) or on other components, and go to a pool, which the loop does not wait
/// for. (A heartbeat or placement writes to the store only when membership changes: a
/// component forgotten or fenced, a vNode's quota home named.)
pub(crate) fn from_memory(msg: &Msg) -> bool {
    matches!(
        msg,
        Msg::X2G_HEARTBEAT(_)
            | Msg::P2G_PICK_HOME(_)
            | Msg::M2G_PICK_OWNER(_)
            | Msg::M2G_FIND(_)
            | Msg::P2G_FILE_CACHE(_)
            | Msg::P2G_VNODE_STORAGE(_)
            | Msg::M2G_BACKUP_STORE(_)
            | Msg::P2G_PICK_NET(_)
            | Msg::P2G_VNODES(_)
            | Msg::X2G_WHO_LEADS(_)
            | Msg::C2X_PING(_)
    )
}

/// The managers serve on event loops that sleep in epoll between requests: no thread per
/// component, and no CPU polling for requests that come every few hundred milliseconds from
/// each. Thousands of components' heartbeats a second arrive a few hundred microseconds
/// apart; a loop woken for each spent more on waking than on the answers, so after work it
/// waits [`COALESCE_US`] for more (docs/benchmarks.md, "The managers at datacenter scale").
pub(crate) fn server_config() -> ServerConfig {
    ServerConfig {
        name: "gm".into(),
        workers: 0,
        fanout_workers: 2,
        serving: splitos_rpc::serving::ServingConfig {
            kind: splitos_rpc::serving::Serving::Loops,
            waiting: splitos_ebb::event::Waiting::Sleep,
            coalesce_us: COALESCE_US,
            ..Default::default()
        },
    }
}

/// Placement and heartbeat answers are on no program's data path (a program's start waits
/// for one placement), so a millisecond more is nothing to them.
const COALESCE_US: u64 = 1_000;
