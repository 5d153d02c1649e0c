//! Every end-to-end test, in one binary: each module is one capability, run as a user runs it
//! (the real `splitos` binary, real components as separate processes, real programs compared
//! with native runs). One binary rather than one per file: the shared harness (`common`) is
//! compiled and linked once, and `scripts/run-tests.py` runs each test in a process of its own
//! anyway (`e2e MODULE::TEST --exact`).

mod access_sampling;
mod api;
mod backup_log;
mod bench_suite;
mod chaos;
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
mod vnode_failures;

/// The tests signal jobs as a terminal and a supervisor do, and expect what an interactive
/// shell's foreground job gets. A suite started under `nohup` or as a script's background job
/// inherits these signals ignored, and `run` hands that on to its program, as natively: so
/// each test process starts with them at their defaults, before the harness runs.
#[used]
#[link_section = ".init_array"]
static DEFAULT_SIGNALS: extern "C" fn() = default_signals;

extern "C" fn default_signals() {
    for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
        // SAFETY: signal takes no pointers; these are valid signal numbers.
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
}
