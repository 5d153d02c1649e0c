//! The nComponent's configuration.
use serde::{Deserialize, Serialize};
use splitos_rpc::knob_enum;
use splitos_rpc::serving::ServingConfig;

use super::{check_netns, ConfigError, ANY_PORT};

knob_enum! {
    /// What a program's connect to a loopback address reaches.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum Loopback, "loopback", LOOPBACKS {
        /// Only ports its own vNode holds on this nComponent: neither the host's own services
        /// nor another vNode's loopback servers. Each vNode's loopback is a network namespace
        /// of its own here, which no process of the host reaches (docs/network.md).
        #[default]
        Vnode = "vnode",
        /// Every port of the host's loopback, as for a program of the host (the embedded
        /// cluster on one machine, whose user's services are there).
        Host = "host",
    }
}

/// An nComponent's knobs: an `[[ncomponent]]` table of the cluster configuration and the
/// options of `splitos net`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct NcompConfig {
    /// Where pComponents reach it (port 0: any free port).
    #[arg(long, default_value = ANY_PORT)]
    pub listen: String,
    /// An interface address to register with the global network manager (repeat it); none:
    /// every address of its host but loopback and IPv6 link-local ones (docs/network.md).
    #[arg(long = "nic-addr")]
    pub nics: Vec<std::net::IpAddr>,
    /// What programs' connects to loopback reach: vnode (only ports their vNode holds here,
    /// in a network namespace of the vNode's that no process of the host reaches) or host
    /// (the host's loopback too, where its processes reach the programs' loopback servers).
    #[arg(long, default_value_t)]
    pub loopback: Loopback,
    /// How its requests are served: on a thread per connection, or on Ebb event loops.
    #[command(flatten)]
    pub serving: ServingConfig,
    /// The network namespace (`ip netns`) `cluster up` starts it in: a "host" of a cluster on
    /// one machine (docs/deployment.md); none: the namespace of `cluster up`.
    #[arg(skip)]
    pub netns: Option<String>,
}

impl Default for NcompConfig {
    fn default() -> Self {
        splitos_rpc::knob::defaults()
    }
}

impl NcompConfig {
    /// An error names the field it is about.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.serving.validate().map_err(ConfigError::Transport)?;
        check_netns(&self.netns)
    }
}
