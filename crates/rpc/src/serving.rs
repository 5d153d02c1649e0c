//! Where a component serves its requests once they arrived: on **threads**, a receiving thread
//! per TCP connection and per shared-memory channel, each polling its connection for `spin_us`
//! after every request before it sleeps; or on **loops**, the Ebb runtime's event loops
//! ([`splitos_ebb`]), a few threads each serving many connections and channels, which poll
//! while requests come faster than `poll_above` a second and sleep in epoll below
//! `sleep_below`, as EbbRT's drivers switch between polling and interrupts.
//!
//! Threads answer a lone caller soonest (its own poller waits for it alone); loops hold no CPU
//! for a connection that is quiet, so many idle connections cost nothing, and a neighbour on
//! the same CPUs keeps them. docs/ebb.md has what each costs, measured.
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use splitos_ebb::event::{LoopConfig, Remote, Waiting};
use splitos_ebb::Runtime;

use crate::transport::TransportError;

crate::knob_enum! {
    /// How a component serves requests: `threads` or `loops`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum Serving, "serving", SERVING {
        #[default]
        Threads = "threads",
        Loops = "loops",
    }
}

/// A component's serving knobs (`serving` in its table: `[mcomponent.serving]`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct ServingConfig {
    /// How requests are served: threads (a thread per connection and shared-memory channel,
    /// each polling before it sleeps) or loops (the Ebb runtime's event loops, each serving
    /// many, polling only while requests come fast).
    #[arg(id = "serving.kind", value_name = "HOW", long = "serving", default_value_t)]
    pub kind: Serving,
    /// Event loops, with loops: connections and channels are spread over them in turn. Each
    /// polling loop holds a CPU.
    #[arg(id = "serving.cores", value_name = "N", long = "serving-cores", default_value_t = 1)]
    pub cores: usize,
    /// How the loops wait: adaptive (poll above poll_above events a second, sleep below
    /// sleep_below), poll (always: a CPU per loop) or sleep (always in epoll).
    #[arg(
        id = "serving.waiting",
        value_name = "HOW",
        long = "serving-waiting",
        default_value_t
    )]
    pub waiting: Waiting,
    /// Events a second (requests, doorbells, connections) above which an adaptive loop polls.
    #[arg(
        id = "serving.poll_above",
        value_name = "N",
        long = "serving-poll-above",
        default_value_t = 20_000
    )]
    pub poll_above: u64,
    /// Events a second below which a polling adaptive loop sleeps again (at most poll_above:
    /// the gap keeps a rate near one threshold from switching on every window).
    #[arg(
        id = "serving.sleep_below",
        value_name = "N",
        long = "serving-sleep-below",
        default_value_t = 5_000
    )]
    pub sleep_below: u64,
    /// How long (µs) an adaptive loop below poll_above keeps polling after its last event
    /// before it sleeps, so that a caller's next request, sent as soon as it has its answer,
    /// finds it awake (as a thread polls for spin_us after each request); 0: sleep at once.
    /// At rest it costs nothing.
    #[arg(
        id = "serving.linger_us",
        value_name = "US",
        long = "serving-linger-us",
        default_value_t = 100
    )]
    pub linger_us: u64,
    /// How long (µs) a sleeping loop that just served requests waits before it looks for
    /// more, so that those arriving meanwhile are served in one wake-up instead of one each:
    /// a request waits up to this long, and a loop taking thousands of requests a second
    /// sleeps and wakes that much less often (0: never waits).
    #[arg(
        id = "serving.coalesce_us",
        value_name = "US",
        long = "serving-coalesce-us",
        default_value_t = 0
    )]
    pub coalesce_us: u64,
}

impl Default for ServingConfig {
    fn default() -> Self {
        crate::knob::defaults()
    }
}

/// The longest `linger_us` and `coalesce_us`.
pub(crate) const MAX_LINGER_US: u64 = 10_000;

/// The window a loop's event rate is measured over.
const WINDOW: Duration = Duration::from_millis(10);

impl ServingConfig {
    fn loop_config(&self) -> LoopConfig {
        LoopConfig {
            waiting: self.waiting,
            poll_above: self.poll_above,
            sleep_below: self.sleep_below,
            window: WINDOW,
            linger: Duration::from_micros(self.linger_us),
            coalesce: Duration::from_micros(self.coalesce_us),
        }
    }

    /// An error names the knob it is about.
    pub fn validate(&self) -> Result<(), TransportError> {
        if self.cores == 0 {
            return Err(TransportError::NoCores);
        }
        if self.linger_us > MAX_LINGER_US {
            return Err(TransportError::Linger(self.linger_us));
        }
        if self.coalesce_us > MAX_LINGER_US {
            return Err(TransportError::Coalesce(self.coalesce_us));
        }
        self.loop_config().validate().map_err(TransportError::Loop)
    }
}

/// A component's event loops, shared by its ways in (TCP and shared memory).
pub struct Loops {
    rt: Runtime,
    next: AtomicUsize,
}

impl Loops {
    /// Starts `cfg.cores` loops, threads `NAME-loop-0`, ...
    pub fn start(name: &str, cfg: &ServingConfig) -> io::Result<Arc<Loops>> {
        cfg.validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let rt = Runtime::start(&format!("{name}-loop"), cfg.cores, cfg.loop_config(), |_| {})?;
        tracing::info!(component = name, loops = cfg.cores, waiting = %cfg.waiting, poll_above = cfg.poll_above, sleep_below = cfg.sleep_below, "serving on Ebb event loops");
        Ok(Arc::new(Loops {
            rt,
            next: AtomicUsize::new(0),
        }))
    }

    /// The loops `cfg` asks for, if it asks for loops; a component whose loops cannot start
    /// serves on threads rather than not at all.
    pub fn for_config(name: &str, cfg: &ServingConfig) -> Option<Arc<Loops>> {
        match cfg.kind {
            Serving::Threads => None,
            Serving::Loops => Loops::start(name, cfg)
                .map_err(|e| tracing::error!(error = %e, "cannot start event loops; serving on threads"))
                .ok(),
        }
    }

    /// The loop the next connection or channel is served on: each in turn.
    pub fn next(&self) -> Arc<Remote> {
        self.rt
            .remote(self.next.fetch_add(1, Ordering::Relaxed) % self.rt.cores())
    }
}
