//! splitos as a library: every monitor, the global managers, the control plane and the
//! benchmarks' floors. The `splitos` binary (main.rs) is only its command line, so monitors can
//! be built and tested in-process.
//!
//! * [`config`] the configuration of a cluster and of each component, declared once
//! * [`pmon`] the process monitor (pComponent): ExCache, miss path, program connections, vNode mounts
//! * [`mmon`] the memory monitor (mComponent): homes, vRegion owners, the storage buffer cache
//! * [`smon`] the storage monitor (sComponent)
//! * [`gm`] the global managers (GPM, GMM, GSM)
//! * [`state`] the managers' state: tables of HMAC-tagged records in redb, etcd or memory
//! * [`placement`] the placement policies of the global managers and the simulator
//! * [`control`] the control plane's command-line side (`run`, `cluster ...`)
//! * [`counters`] counters declared once, for a component's statistics and Prometheus metrics
//! * [`node`] what every component process shares (logging, metrics, registration)
//! * [`out`] what the command-line tools print: a reader gone (`| head`) ends a command quietly
//! * [`sim`] the datacenter simulator: cluster traces replayed against fixed and disaggregated models
//! * [`segment`] a vRegion's pages in a memfd, shared by an owner and a pComponent of one host (one-sided access)
//! * [`vma`] the vma tree of a process's address space, shared by the pComponent and mComponents
//! * [`sys`] this host's users, groups and mounts, as components and the control plane see them
//! * [`trusted`] directories no other user can change (state, storage, sockets, mount points)
pub mod api;
pub mod bench;
pub mod config;
pub mod control;
pub mod counters;
pub mod gm;
pub mod loadgen;
pub mod memcached;
pub mod mmon;
pub mod nmon;
pub mod node;
pub mod out;
pub mod placement;
pub mod pmon;
pub mod segment;
pub mod sim;
pub mod smon;
pub mod state;
pub mod sys;
pub mod telemetry;
pub mod topology;
pub mod trusted;
pub mod vma;
