//! The transport and RPC layer of splitos: every message between components goes through here.
//!
//! * [`auth`] — who is on the other end: the cluster authority, credentials, the handshake.
//! * [`wire`] — the versioned wire format: every message as its own type, named by direction,
//!   each request with its reply type; protocol constants.
//! * [`error`] — [`RpcError`] (a call that got no reply) and [`Refusal`] (a handler's `ERR`).
//! * [`client`] — [`Rpc`], typed calls over the configured transport.
//! * [`server`] — a component's [`Handler`], its dispatch helper [`on`], and worker pools.
//! * [`transport`] — the message-level [`Transport`] interface, chosen from
//!   [`TransportConfig`]: TCP, and shared memory between components of one host.
//! * [`serving`] — [`serving::ServingConfig`]: requests received on a thread per connection,
//!   or on the Ebb runtime's event loops.
//! * [`poll`] — [`poll::Poller`], polling before sleeping that adapts to how long waits are.
//! * [`cpu`] — serving a caller on its own CPU: a thread that asks to be followed, a thread
//!   that moves itself.
//! * [`fdpass`] — descriptors over Unix sockets (shared-memory channels, a program's heap).
//! * [`frame`] — bounded frames on a byte stream (what the TCP transport sends).
//! * [`refusals`] — log lines for refusals that a flood cannot multiply.
//! * [`series`] — the metric series it records.
//! * [`knob`] — declaring a configuration knob once, for the command line and the files.

pub mod auth;
pub mod client;
pub mod cpu;
pub mod error;
pub mod fdpass;
pub mod frame;
pub mod knob;
pub mod messenger;
pub mod poll;
pub mod refusals;
pub mod series;
pub mod server;
pub mod serving;
pub mod transport;
pub mod wire;

pub use client::Rpc;
pub use error::{Refusal, Refuse, RpcError, Unhandled};
pub use server::{current_peer, on, Dispatcher, Handler, Peer, Reply, ServerConfig};
pub use transport::{Endpoint, Transport, TransportConfig};
pub use wire::*;
