//! Every end-to-end test, in one binary: each module is one capability, run as a user runs it
//! (the real `splitos` binary, real components as separate processes, real programs compared
//! with native runs). One binary rather than one per file: the shared harness (`common`) is
//! compiled and linked once, and `scripts/run-tests.py` runs each test in a process of its own
//! anyway (`e2e MODULE::TEST --exact`).

mod access_sampling;
mod api;
mod backup_log;
mod bench_suite;
mod cli;
mod cluster;
mod common;
mod compressed_tier;
mod dashboard;
mod deploy;
mod dirty_tracking;
mod elastic;
mod erasure;
mod evictor;
mod excache;
mod fault_cpu;
mod help;
mod hosts;
mod huge_pages;
mod links;
mod managers;
mod memcached;
mod metrics;
mod misspath;
mod network;
mod one_sided;
mod operator;
mod overcommit;
mod page_store;
mod placement;
mod programs;
mod quota;
mod replication;
mod security;
mod serving;
mod shell;
mod shim;
mod sim;
mod storage;
mod topology;
mod transport;
mod users;
