//! The calling side as components use it: typed calls over whichever transport the cluster
//! configured. A call returns the request's own reply type or an [`RpcError`]; an `ERR`
//! answer becomes [`RpcError::Remote`], any other wrong answer [`RpcError::Protocol`].
use std::sync::Arc;
use std::time::Duration;

use crate::error::RpcError;
use crate::transport::Transport;
use crate::wire::{Msg, Request};

#[derive(Clone)]
pub struct Rpc {
    transport: Arc<dyn Transport>,
    timeout: Duration,
}

impl Rpc {
    pub fn new(transport: Arc<dyn Transport>, timeout: Duration) -> Rpc {
        Rpc { transport, timeout }
    }

    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    pub fn call<R: Request>(&self, addr: &str, req: R) -> Result<R::Reply, RpcError> {
        self.call_timeout(addr, req, self.timeout)
    }

    pub fn call_timeout<R: Request>(&self, addr: &str, req: R, timeout: Duration) -> Result<R::Reply, RpcError> {
        let msg: Msg = req.into();
        typed::<R>(addr, msg.name(), self.transport.call(addr, &msg, timeout))
    }

    /// [`Transport::call_direct`]: on the calling thread's own channel (the miss path).
    pub fn call_direct<R: Request>(&self, addr: &str, req: R) -> Result<R::Reply, RpcError> {
        let msg: Msg = req.into();
        typed::<R>(addr, msg.name(), self.transport.call_direct(addr, &msg, self.timeout))
    }

    /// [`Transport::call_all_direct`]: requests to several components under way at once,
    /// each answered with its reply (an `ERR` answer as [`RpcError::Remote`]).
    pub fn call_all_direct(&self, calls: &[(&str, &Msg)]) -> Vec<Result<Msg, RpcError>> {
        self.transport
            .call_all_direct(calls, self.timeout)
            .into_iter()
            .map(|r| match r? {
                Msg::ERR(e) => Err(RpcError::Remote {
                    code: e.code,
                    msg: e.msg,
                }),
                m => Ok(m),
            })
            .collect()
    }

    /// An untyped call, for tools that send whatever they are told to (debugging, floors).
    pub fn call_msg(&self, addr: &str, msg: &Msg) -> Result<Msg, RpcError> {
        match self.transport.call(addr, msg, self.timeout)? {
            Msg::ERR(e) => Err(RpcError::Remote {
                code: e.code,
                msg: e.msg,
            }),
            m => Ok(m),
        }
    }
}

fn typed<R: Request>(addr: &str, request: &'static str, r: Result<Msg, RpcError>) -> Result<R::Reply, RpcError> {
    match r? {
        Msg::ERR(e) => Err(RpcError::Remote {
            code: e.code,
            msg: e.msg,
        }),
        m => R::Reply::try_from(m).map_err(|m| RpcError::Protocol {
            addr: addr.to_string(),
            request,
            reply: m.name(),
        }),
    }
}
