//! The sComponent's configuration.
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{check_netns, ConfigError, Size, ANY_PORT};

/// An sComponent's knobs: a `[[scomponent]]` table of the cluster configuration and the
/// options of `splitos storage`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct ScompConfig {
    /// Where it listens for the other components (port 0: any free port; a fixed one if it must
    /// come back at the same address).
    #[arg(long, default_value = ANY_PORT)]
    pub listen: String,
    /// Directory holding the namespace database and file data. If another sComponent has it
    /// open, this one passes requests on files to that one, and takes it over when it stops.
    /// In a cluster's configuration it may be left out: the data directory's `storage`
    /// (`storage1`, ... for more; docs/storage.md).
    #[arg(long, required = true)]
    pub dir: Option<PathBuf>,
    /// Bytes of file data stored for all vNodes together; beyond it writes fail with ENOSPC.
    #[arg(long, default_value_t = Size(16 << 30))]
    pub quota: Size,
    /// The network namespace (`ip netns`) `cluster up` starts it in: a "host" of a cluster on
    /// one machine (docs/deployment.md); none: the namespace of `cluster up`.
    #[arg(skip)]
    pub netns: Option<String>,
}

impl Default for ScompConfig {
    fn default() -> Self {
        splitos_rpc::knob::defaults()
    }
}

impl ScompConfig {
    /// An error names the field it is about.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.quota.0 == 0 {
            return Err(ConfigError::NoQuota);
        }
        check_netns(&self.netns)
    }
}
