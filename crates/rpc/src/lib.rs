//! The transport and RPC layer of splitos: every message between components goes through here.
//!
//! * [`wire`] — the versioned wire format: frame header and every message, named by direction.
//! * [`frame`] — reading and writing bounded frames on a byte stream.
//! * [`transport`] — the swappable byte-stream transport (TCP by default, with fault injection).
//! * [`client`] — a multiplexed client (many callers share one connection, replies matched by
//!   id) and direct calls on a connection owned by the calling thread (the data path).
//! * [`server`] — a receiving thread per connection handing requests to a pool of worker threads.

pub mod client;
pub mod frame;
pub mod server;
pub mod transport;
pub mod wire;

pub use client::{call_direct, Client, ClientPool, RpcError};
pub use server::{serve, Handler, ServerConfig, ServerHandle};
pub use wire::*;
