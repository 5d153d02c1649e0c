//! The Ebb runtime, after EbbRT (OSDI '16): a system is built from Elastic Building Blocks.
//!
//! - An [`Ebb`] has an id ([`EbbId`]) and, on every core that uses it, a representative of its
//!   own, built on that core's first use by the Ebb's miss handler: calls take no lock and
//!   share no cache line with other cores, unless the Ebb's representatives choose to share
//!   state (through a root they all hold). [`Ebb::replace`] swaps the miss handler while the
//!   system runs: every core builds a new representative at its next call.
//! - Every core runs an [`EventLoop`](event::EventLoop): non-preemptive, each event runs to
//!   completion; one-shot events, timers, idle handlers and I/O readiness. A loop switches
//!   itself between polling (no sleep between events) and sleeping in epoll, by the rate of
//!   events it sees, with hysteresis ([`event::LoopConfig`]), as EbbRT's drivers switch
//!   between polling and interrupts.
//! - Futures ([`exec`]) run on a core's loop and carry results and errors across cores.
//! - The [`messenger`] carries messages between the representatives of one Ebb on different
//!   components; a transport delivers them, and tells the global id map which Ebbs are here.
//! - Buffers ([`buf::Chain`]) are chains of reference-counted slices: appending, splitting and
//!   writing with `writev` copy nothing.
//!
//! A core here is an event loop's thread ([`runtime::Runtime`] starts one per core it is
//! given); a thread outside any loop (a hosted caller) is a core of its own to the Ebbs it
//! calls. docs/ebb.md describes the runtime and how to write an Ebb.
pub mod buf;
pub mod ebb;
pub mod event;
pub mod exec;
pub mod messenger;
pub mod runtime;
pub mod series;

pub use ebb::{Ebb, EbbId};
pub use event::{EventLoop, LoopConfig, LoopStats};
pub use runtime::Runtime;
