//! The error types of the RPC layer: [`RpcError`], what a caller gets when a call did not
//! produce its reply, and [`Refusal`], what a handler answers when it declines a request (it
//! travels as the `ERR` message). Frame-level errors are [`crate::frame::FrameError`].
//!
//! A handler's own errors are typed, an enum per operation whose variants a caller can match;
//! [`Refuse`] maps each such enum onto the wire's codes once, and the `From` below turns any of
//! them into the `ERR` that travels, its text the error's own. The refusals every component
//! shares are here: [`Unhandled`] and [`NotPermitted`].
use std::time::Duration;

use crate::wire::{ErrCode, ERR};

/// A handler's refusal of a request: travels as `ERR { code, msg }`.
pub type Refusal = ERR;

impl Refusal {
    /// A refusal the program sees as the Linux errno `e`.
    pub fn errno(e: i32) -> Refusal {
        ERR::new(ErrCode::Errno(e), std::io::Error::from_raw_os_error(e).to_string())
    }
}

/// An operation's typed error that a handler can answer with: the code the wire gives it.
pub trait Refuse: std::error::Error {
    fn code(&self) -> ErrCode;
}

impl<E: Refuse> From<E> for Refusal {
    fn from(e: E) -> Refusal {
        ERR::new(e.code(), e.to_string())
    }
}

/// A request that a component (or a part of one) has no handler for. `by` is the subject with
/// its verb ("an mComponent does", "the global managers do").
#[derive(Debug, thiserror::Error)]
#[error("{by} not handle {msg}")]
pub struct Unhandled {
    pub by: &'static str,
    pub msg: &'static str,
}

impl Refuse for Unhandled {
    fn code(&self) -> ErrCode {
        ErrCode::Invalid
    }
}

/// A request the sender's role may not send ([`crate::wire::may_send`]).
#[derive(Debug, thiserror::Error)]
#[error("a {role} may not send {msg}")]
pub struct NotPermitted {
    pub role: &'static str,
    pub msg: &'static str,
}

impl Refuse for NotPermitted {
    fn code(&self) -> ErrCode {
        ErrCode::Denied
    }
}

impl std::fmt::Display for ERR {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.code, self.msg)
    }
}

impl std::error::Error for ERR {}

#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// The component could not be reached at all: the request was not delivered, so sending
    /// it again is safe.
    #[error("component at {addr} cannot be reached: {why}")]
    Unreachable { addr: String, why: String },
    /// The connection broke while the call was outstanding.
    #[error("connection to component at {addr} closed during the call")]
    Closed { addr: String },
    #[error("{msg} to component at {addr} got no reply within {after:?}")]
    Timeout {
        addr: String,
        msg: &'static str,
        after: Duration,
    },
    /// The component answered with an error.
    #[error("{code:?}: {msg}")]
    Remote { code: ErrCode, msg: String },
    /// The component answered with a message that is not the reply to the request.
    #[error("component at {addr} answered {request} with {reply}")]
    Protocol {
        addr: String,
        request: &'static str,
        reply: &'static str,
    },
}

impl RpcError {
    pub fn code(&self) -> ErrCode {
        match self {
            RpcError::Remote { code, .. } => *code,
            RpcError::Protocol { .. } => ErrCode::Internal,
            _ => ErrCode::Unreachable,
        }
    }
}

/// A handler that needed another component and could not get its answer refuses with the
/// same code, so a program sees the errno of the real cause.
impl From<RpcError> for Refusal {
    fn from(e: RpcError) -> Refusal {
        match e {
            RpcError::Remote { code, msg } => ERR { code, msg },
            other => ERR {
                code: other.code(),
                msg: other.to_string(),
            },
        }
    }
}
