//! The mComponent's configuration.
use serde::{Deserialize, Serialize};

use splitos_rpc::serving::ServingConfig;

use super::{check_netns, ConfigError, Size, ANY_PORT, PAGE};

/// An mComponent's knobs: a `[[mcomponent]]` table of the cluster configuration, the options
/// of `splitos mem`, and (as `--mem-...`) those `splitos run` gives each mComponent of the
/// embedded cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct McompConfig {
    /// Where it listens for the other components (port 0: any free port).
    #[arg(long, default_value = ANY_PORT)]
    pub listen: String,
    /// Memory it offers; mappings beyond it fail with ENOMEM.
    #[arg(long, default_value_t = Size(8 << 30))]
    pub capacity: Size,
    /// Worker threads for data-path requests; 0 serves them on each connection's receiving
    /// thread (docs/excache.md has the cost of each).
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// How its requests are served: on a thread per connection, or on Ebb event loops.
    #[command(flatten)]
    pub serving: ServingConfig,
    /// Storage buffer cache held for the files the global managers place on it.
    #[arg(long, default_value_t = Size(256 << 20))]
    pub bcache: Size,
    /// Largest read-ahead for sequential file reads through the buffer cache (0: off).
    #[arg(long, default_value_t = Size(128 << 10))]
    pub readahead: Size,
    /// Backup log kept for the sComponent with replication "log": write-backs it logs and has
    /// yet to stream; beyond it they are skipped and their vRegion is unprotected until its
    /// primary copies it again (docs/failures.md).
    #[arg(long, default_value_t = Size(64 << 20))]
    pub backup_log: Size,
    /// Fault injection: how long it waits before serving each request (µs; 0: none). An
    /// artificially slow mComponent, to see its clients slow down with it instead of queueing
    /// requests without bound (docs/elastic-memory.md, "Credits").
    #[arg(long, default_value_t = 0)]
    pub serve_delay_us: u64,
    /// Join out of placement: it holds nothing until the admin attaches it (`splitos memory
    /// attach ID`), as memory a host lends when asked (docs/elastic-memory.md).
    #[arg(long, default_value_t = false)]
    pub standby: bool,
    /// The network namespace (`ip netns`) `cluster up` starts it in: a "host" of a cluster on
    /// one machine (docs/deployment.md); none: the namespace of `cluster up`.
    #[arg(skip)]
    pub netns: Option<String>,
}

impl Default for McompConfig {
    fn default() -> Self {
        splitos_rpc::knob::defaults()
    }
}

impl McompConfig {
    /// An error names the field it is about.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity.0 < PAGE {
            return Err(ConfigError::Capacity(self.capacity.0));
        }
        if self.bcache.0 < PAGE {
            return Err(ConfigError::Bcache(self.bcache.0));
        }
        self.serving.validate().map_err(ConfigError::Transport)?;
        check_netns(&self.netns)
    }
}
