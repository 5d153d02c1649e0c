//! The calls an mComponent makes to the rest of the cluster: to other mComponents (the
//! owners of its processes' vRegions, backup homes, parity members), to sComponents (backup
//! files, buffered file blocks) and to the global managers. [`Peers`] is that interface, as
//! `PageStore` is the miss path's: [`RpcPeers`] makes the calls over RPC, and the unit tests
//! put an in-memory cluster behind it, so that the home's and the owners' rules (rebuilds,
//! failover, epochs) can be driven in-process, calls that fail included.
use std::sync::Arc;
use std::time::Duration;

use splitos_rpc::{Msg, Request, RpcError};

use splitos_core::node::Node;

pub trait Peers: Clone + Send + Sync + 'static {
    /// This mComponent's id (0 until it registered).
    fn id(&self) -> u32;
    /// Where the others reach this mComponent.
    fn addr(&self) -> &str;
    /// A request to the component at `addr`, waiting the node's RPC timeout for its answer.
    fn call<R: Request>(&self, addr: &str, req: R) -> Result<R::Reply, RpcError>;
    /// A request waiting up to `timeout` for its answer.
    fn call_timeout<R: Request>(&self, addr: &str, req: R, timeout: Duration) -> Result<R::Reply, RpcError>;
    /// A request on the calling thread's own channel, which the receiver serves on a thread
    /// no other request waits on.
    fn call_direct<R: Request>(&self, addr: &str, req: R) -> Result<R::Reply, RpcError>;
    /// An untyped request (the backup log streams whichever message its queue holds).
    fn call_msg(&self, addr: &str, msg: &Msg) -> Result<Msg, RpcError>;
    /// A request to the global managers.
    fn call_gm<R: Request>(&self, req: R) -> Result<R::Reply, RpcError>;
    /// Whether mComponent `id`, which did not answer, is only late (paused, overloaded): the
    /// global managers answer this mComponent's heartbeats and have not declared it lost.
    fn late(&self, id: u32) -> bool;
    /// After a stop of this mComponent long enough to be taken for a death, waits until the
    /// managers have answered (and their answer, a fence maybe, was handled).
    fn after_stop(&self);
}

/// The calls over the component's RPC client, to the global managers it registered with.
#[derive(Clone)]
pub struct RpcPeers(pub Arc<Node>);

impl Peers for RpcPeers {
    fn id(&self) -> u32 {
        self.0.id()
    }

    fn addr(&self) -> &str {
        &self.0.addr
    }

    fn call<R: Request>(&self, addr: &str, req: R) -> Result<R::Reply, RpcError> {
        self.0.rpc.call(addr, req)
    }

    fn call_timeout<R: Request>(&self, addr: &str, req: R, timeout: Duration) -> Result<R::Reply, RpcError> {
        self.0.rpc.call_timeout(addr, req, timeout)
    }

    fn call_direct<R: Request>(&self, addr: &str, req: R) -> Result<R::Reply, RpcError> {
        self.0.rpc.call_direct(addr, req)
    }

    fn call_msg(&self, addr: &str, msg: &Msg) -> Result<Msg, RpcError> {
        self.0.rpc.call_msg(addr, msg)
    }

    fn call_gm<R: Request>(&self, req: R) -> Result<R::Reply, RpcError> {
        self.0.call_gm(req)
    }

    fn late(&self, id: u32) -> bool {
        self.0.mcomp_not_lost(id)
    }

    fn after_stop(&self) {
        self.0.after_stop();
    }
}
