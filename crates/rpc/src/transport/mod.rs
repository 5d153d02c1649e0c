//! The transport: how one component's request reaches another and its reply comes back. It is
//! a message-level interface (send a request, get its reply; serve requests with a handler),
//! so that a transport need not be a byte stream. Two are here: TCP, and shared memory for
//! components on one host (TCP to the others). An RDMA queue pair would plug in the same way,
//! by implementing [`Transport`] and adding a kind to [`TransportConfig`], which is the one
//! place a transport is chosen.
pub mod shm;
pub mod tcp;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::auth::Credentials;
use crate::error::RpcError;
use crate::poll::Polling;
use crate::server::{Handler, ServerConfig};
use crate::wire::Msg;

pub use shm::{ShmConfig, ShmTransport};
pub use tcp::{TcpConfig, TcpTransport};

pub trait Transport: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// Sends `msg` to the component at `addr` and waits up to `timeout` for its reply. Safe to
    /// call from any thread; calls of many threads may share a connection.
    fn call(&self, addr: &str, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError>;
    /// As [`Transport::call`], on a channel owned by the calling thread, so that the reply
    /// crosses no other thread: the miss path uses this. A transport whose calls involve no
    /// hand-off anyway keeps the default.
    fn call_direct(&self, addr: &str, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError> {
        self.call(addr, msg, timeout)
    }
    /// Several [`Transport::call_direct`]s whose replies the caller needs all of, in the order
    /// given: a transport that can have them under way at once (a write-back to every replica,
    /// the stripes of a bonded fetch to one component, each on a link of its own) does; the
    /// default makes them one after another.
    fn call_all_direct(&self, calls: &[(&str, &Msg)], timeout: Duration) -> Vec<Result<Msg, RpcError>> {
        calls
            .iter()
            .map(|(addr, msg)| self.call_direct(addr, msg, timeout))
            .collect()
    }
    /// Claims an address to serve at (`host:0` picks a free port).
    fn listen(&self, addr: &str) -> io::Result<Box<dyn Endpoint>>;
    /// Where the component at `addr` hands out memory for one-sided access, if this transport
    /// reaches it on this host (shared memory: a Unix socket beside its rendezvous socket).
    /// A transport without one-sided access (TCP) has none.
    fn pages_socket(&self, _addr: &str) -> Option<std::path::PathBuf> {
        None
    }
}

/// An address claimed by [`Transport::listen`], not yet serving.
pub trait Endpoint: Send {
    /// The address peers reach it at.
    fn addr(&self) -> String;
    /// Serves every request that arrives with `handler`, until the process ends.
    fn serve(self: Box<Self>, handler: Arc<dyn Handler>, cfg: ServerConfig);
}

/// Which transport a cluster uses and the knobs of each, in its own section
/// (`[transport]` with `kind`, `[transport.tcp]` and `[transport.shm]` with their knobs).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, clap::Args)]
#[serde(deny_unknown_fields, default)]
#[command(next_help_heading = "Transport")]
pub struct TransportConfig {
    /// Transport to the other components: shm (shared memory to components of this host, TCP
    /// to the others) or tcp (TCP to all).
    #[arg(long = "transport", default_value = "shm", value_parser = clap::builder::PossibleValuesParser::new(KINDS))]
    pub kind: String,
    /// How every waiter of the transport polls before sleeping: fixed (always the whole spin)
    /// or adaptive.
    #[arg(long, default_value_t)]
    pub polling: Polling,
    #[command(flatten)]
    pub tcp: TcpConfig,
    /// Shared memory's knobs; its calls to peers on other hosts use `tcp`'s.
    #[command(flatten)]
    pub shm: ShmConfig,
}

impl Default for TransportConfig {
    fn default() -> Self {
        crate::knob::defaults()
    }
}

/// The transport kinds this build has.
/// `shm`: shared memory to components on this host, TCP to the others; `tcp`: TCP to all.
pub const KINDS: &[&str] = &["shm", "tcp"];

/// Why a transport's or a component's serving configuration is refused.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("transport.kind: unknown transport {0:?} (known: {known})", known = KINDS.join(", "))]
    UnknownKind(String),
    #[error("[transport.tcp] max_connections, max_connections_per_peer, max_in_flight and frame_timeout_ms must be at least 1")]
    TcpLimits,
    #[error("[transport.shm] max_channels_per_peer must be at least 1")]
    ShmChannels,
    #[error("serving.cores: at least one loop")]
    NoCores,
    #[error("serving.linger_us: {0} is above {max} (a loop that lingers that long polls: waiting = \"poll\")", max = crate::serving::MAX_LINGER_US)]
    Linger(u64),
    #[error("serving.coalesce_us: {0} is above {max}: every request would wait that long", max = crate::serving::MAX_LINGER_US)]
    Coalesce(u64),
    #[error("serving: {0}")]
    Loop(splitos_ebb::event::LoopError),
}

impl TransportConfig {
    pub fn validate(&self) -> Result<(), TransportError> {
        if !KINDS.contains(&self.kind.as_str()) {
            return Err(TransportError::UnknownKind(self.kind.clone()));
        }
        self.tcp.validate()?;
        self.shm.validate()
    }

    /// The transport this configuration names, proving `creds` on every connection.
    pub fn build(&self, creds: Option<Arc<Credentials>>) -> Result<Arc<dyn Transport>, TransportError> {
        self.validate()?;
        match self.kind.as_str() {
            "tcp" => Ok(Arc::new(TcpTransport::new(self.tcp.clone(), self.polling, creds))),
            "shm" => match ShmTransport::new(&self.shm, self.tcp.clone(), self.polling, creds.clone()) {
                Ok(t) => Ok(Arc::new(t)),
                // Shared memory only speeds things up: without it the component still runs,
                // over TCP (another user holding the rendezvous directory must not stop it).
                Err(e) => {
                    tracing::warn!(error = %e, "transport.shm: shared memory unavailable, using TCP");
                    Ok(Arc::new(TcpTransport::new(self.tcp.clone(), self.polling, creds)))
                }
            },
            other => Err(TransportError::UnknownKind(other.to_string())),
        }
    }
}
