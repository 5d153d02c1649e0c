//! splitos's tools: they run beside a cluster, or without one, and no component needs them.
//!
//! * [`sim`] `splitos sim`, the datacenter simulator: cluster traces replayed against fixed, disaggregated and splitos's own models
//! * [`loadgen`] `splitos loadgen`, a load generator for memcached-protocol servers
//! * [`memcached`] `splitos memcached`, a memcached-protocol server on the Ebb runtime
pub mod loadgen;
pub mod memcached;
pub mod sim;
