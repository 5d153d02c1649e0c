//! splitos-core: the types every component shares — its configuration, its logging, metrics and
//! registration with the managers, the managers' state, placement and topology, and what a host
//! offers (users, mounts, trusted directories, memfd segments, the vma tree).
//!
//! It is a crate of its own so that it stays below everything else: it imports no monitor, no
//! manager and no tool. Inside one crate nothing but discipline kept that true; a crate
//! boundary makes the compiler keep it.
//!
//! * [`config`] the configuration of a cluster and of each component, declared once
//! * [`node`] what every component process shares (logging, metrics, registration)
//! * [`telemetry`] a component's metrics as Prometheus reads them, and the server that exposes them
//! * [`topology`] the cluster as a graph of hosts, switches, components and their links
//! * [`state`] the managers' state: tables of HMAC-tagged records in redb, etcd or memory
//! * [`placement`] the placement policies of the global managers and the simulator
//! * [`series`] the series this crate records (`splitos-metrics` declares every series once)
//! * [`out`] what the command-line tools print: a reader gone (`| head`) ends a command quietly
//! * [`segment`] a vRegion's pages in a memfd, shared by an owner and a pComponent of one host (one-sided access)
//! * [`vma`] the vma tree of a process's address space, shared by the pComponent and mComponents
//! * [`sys`] this host's users, groups and mounts, as components and the control plane see them
//! * [`trusted`] directories no other user can change (state, storage, sockets, mount points)
pub mod config;
pub mod node;
pub mod out;
pub mod placement;
pub mod segment;
pub mod series;
pub mod state;
pub mod sys;
pub mod telemetry;
pub mod topology;
pub mod trusted;
pub mod vma;
