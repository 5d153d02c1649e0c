//! splitos as a library: the control plane's command-line side and the benchmarks' floors.
//! The `splitos` binary (main.rs) is only its command line. The monitors, the managers and the
//! tools are crates of their own, so each can be built and tested in-process:
//! `splitos-pmon` (the pComponent, over `splitos-excache`), `splitos-mmon` (the mComponent),
//! `splitos-smon` (the sComponent), `splitos-nmon` (the nComponent), `splitos-gm` (the global
//! managers and the REST API they serve) and `splitos-tools` (the simulator, the load
//! generator, memcached).
//!
//! * [`control`] the control plane's command-line side (`run`, `cluster ...`)
//! * [`catalogue`] every metric series a component may export
//!
//! The types every component shares live in splitos-core. They are re-exported here under their
//! old paths, so `crate::config::…`, `crate::outln!` and `splitos::node::Node` read as before.
pub use splitos_core::{
    config, errln, node, out, outln, placement, segment, state, sys, telemetry, topology, trusted, vma,
};

pub mod bench;
pub mod catalogue;
pub mod control;
