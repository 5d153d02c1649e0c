//! A multiplexed RPC client: callers on many threads share one connection; a reader thread
//! matches replies to callers by request id; every call has a timeout.
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{bounded, Sender};

use crate::frame::{read_frame, write_frame};
use crate::transport::{Conn, Transport};
use crate::wire::{ErrCode, FrameKind, Msg};

#[derive(Debug, Clone)]
pub enum RpcError {
    /// The component could not be reached at all.
    Unreachable { addr: String, why: String },
    /// The connection broke while the call was outstanding.
    Closed { addr: String },
    Timeout { addr: String, msg: &'static str, after: Duration },
    /// The component answered with an error.
    Remote { code: ErrCode, msg: String },
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RpcError::Unreachable { addr, why } => write!(f, "component at {addr} cannot be reached: {why}"),
            RpcError::Closed { addr } => write!(f, "connection to component at {addr} closed during the call"),
            RpcError::Timeout { addr, msg, after } => write!(f, "{msg} to component at {addr} got no reply within {after:?}"),
            RpcError::Remote { code, msg } => write!(f, "{code:?}: {msg}"),
        }
    }
}

impl std::error::Error for RpcError {}

impl RpcError {
    pub fn code(&self) -> ErrCode {
        match self {
            RpcError::Remote { code, .. } => *code,
            _ => ErrCode::Unreachable,
        }
    }
}

type Waiter = Sender<Result<Msg, RpcError>>;

struct Inner {
    addr: String,
    writer: Mutex<Box<dyn Conn>>,
    pending: Mutex<HashMap<u64, Waiter>>,
    next_id: AtomicU64,
    dead: AtomicBool,
    timeout: Duration,
}

#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    pub fn connect(transport: &dyn Transport, addr: &str, timeout: Duration) -> Result<Client, RpcError> {
        let conn = transport
            .connect(addr, timeout.min(Duration::from_secs(3)))
            .map_err(|e| RpcError::Unreachable { addr: addr.to_string(), why: e.to_string() })?;
        let reader = conn.try_clone_box().map_err(|e| RpcError::Unreachable { addr: addr.to_string(), why: e.to_string() })?;
        let inner = Arc::new(Inner {
            addr: addr.to_string(),
            writer: Mutex::new(conn),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            dead: AtomicBool::new(false),
            timeout,
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name(format!("rpc-rx {addr}"))
            .spawn(move || reader_loop(reader, weak))
            .expect("spawn rpc reader");
        Ok(Client { inner })
    }

    pub fn is_dead(&self) -> bool {
        self.inner.dead.load(Ordering::Acquire)
    }

    pub fn call(&self, msg: &Msg) -> Result<Msg, RpcError> {
        self.call_timeout(msg, self.inner.timeout)
    }

    pub fn call_timeout(&self, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError> {
        let inner = &self.inner;
        if inner.dead.load(Ordering::Acquire) {
            return Err(RpcError::Closed { addr: inner.addr.clone() });
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        inner.pending.lock().unwrap().insert(id, tx);
        let sent = {
            let mut w = inner.writer.lock().unwrap();
            write_frame(&mut *w, FrameKind::Request, id, msg)
        };
        if let Err(e) = sent {
            inner.pending.lock().unwrap().remove(&id);
            inner.dead.store(true, Ordering::Release);
            return Err(RpcError::Unreachable { addr: inner.addr.clone(), why: e.to_string() });
        }
        match rx.recv_timeout(timeout) {
            Ok(Ok(Msg::ERR { code, msg })) => Err(RpcError::Remote { code, msg }),
            Ok(r) => r,
            Err(_) => {
                inner.pending.lock().unwrap().remove(&id);
                Err(RpcError::Timeout { addr: inner.addr.clone(), msg: msg.name(), after: timeout })
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(w) = self.writer.lock() {
            w.close();
        }
    }
}

fn reader_loop(mut conn: Box<dyn Conn>, inner: std::sync::Weak<Inner>) {
    loop {
        let frame = read_frame(&mut conn);
        let Some(inner) = inner.upgrade() else { return };
        match frame {
            Ok(Some(f)) if f.kind == FrameKind::Reply => {
                if let Some(w) = inner.pending.lock().unwrap().remove(&f.req_id) {
                    let _ = w.send(Ok(f.msg));
                }
            }
            Ok(Some(f)) => {
                tracing::warn!(peer = %inner.addr, req_id = f.req_id, "peer sent a request on a client connection; closing");
                fail_all(&inner);
                return;
            }
            Ok(None) => {
                fail_all(&inner);
                return;
            }
            Err(e) => {
                tracing::warn!(peer = %inner.addr, error = %e, "bad reply frame; closing connection");
                fail_all(&inner);
                return;
            }
        }
    }
}

fn fail_all(inner: &Inner) {
    inner.dead.store(true, Ordering::Release);
    for (_, w) in inner.pending.lock().unwrap().drain() {
        let _ = w.send(Err(RpcError::Closed { addr: inner.addr.clone() }));
    }
}

/// A thread's own connections, by peer address, each with its next request id.
type DirectConns = HashMap<String, (Box<dyn Conn>, u64)>;

thread_local! {
    static DIRECT: std::cell::RefCell<DirectConns> = std::cell::RefCell::new(HashMap::new());
}

/// A call on a connection owned by the calling thread: no reader thread, no hand-off between
/// threads. The data path (one miss, one round trip) uses this; the connection is made on the
/// thread's first call to `addr` and dropped after any error.
pub fn call_direct(transport: &dyn Transport, addr: &str, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError> {
    DIRECT.with(|d| {
        let mut d = d.borrow_mut();
        if !d.contains_key(addr) {
            let c = transport.connect(addr, timeout.min(Duration::from_secs(3))).map_err(|e| RpcError::Unreachable { addr: addr.to_string(), why: e.to_string() })?;
            let _ = c.set_read_timeout(Some(timeout));
            d.insert(addr.to_string(), (c, 1));
        }
        let (conn, next) = d.get_mut(addr).expect("inserted above");
        *next += 1;
        let id = *next;
        let r = write_frame(&mut **conn, FrameKind::Request, id, msg)
            .map_err(|e| RpcError::Unreachable { addr: addr.to_string(), why: e.to_string() })
            .and_then(|_| loop {
                match read_frame(&mut **conn) {
                    Ok(Some(f)) if f.kind == FrameKind::Reply && f.req_id == id => return Ok(f.msg),
                    // A reply to an earlier call that timed out: skip it.
                    Ok(Some(f)) if f.kind == FrameKind::Reply && f.req_id < id => continue,
                    Ok(_) => return Err(RpcError::Closed { addr: addr.to_string() }),
                    Err(crate::frame::FrameError::Io(e)) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        return Err(RpcError::Timeout { addr: addr.to_string(), msg: msg.name(), after: timeout })
                    }
                    Err(_) => return Err(RpcError::Closed { addr: addr.to_string() }),
                }
            });
        match r {
            Ok(Msg::ERR { code, msg }) => Err(RpcError::Remote { code, msg }),
            Ok(m) => Ok(m),
            Err(e) => {
                d.remove(addr);
                Err(e)
            }
        }
    })
}

/// One client per peer address, reconnected when its connection died.
pub struct ClientPool {
    transport: Arc<dyn Transport>,
    timeout: Duration,
    clients: Mutex<HashMap<String, Client>>,
}

impl ClientPool {
    pub fn new(transport: Arc<dyn Transport>, timeout: Duration) -> Self {
        ClientPool { transport, timeout, clients: Mutex::new(HashMap::new()) }
    }

    pub fn get(&self, addr: &str) -> Result<Client, RpcError> {
        if let Some(c) = self.clients.lock().unwrap().get(addr) {
            if !c.is_dead() {
                return Ok(c.clone());
            }
        }
        let c = Client::connect(&*self.transport, addr, self.timeout)?;
        self.clients.lock().unwrap().insert(addr.to_string(), c.clone());
        Ok(c)
    }

    pub fn call(&self, addr: &str, msg: &Msg) -> Result<Msg, RpcError> {
        self.get(addr)?.call(msg)
    }

    /// [`call_direct`] with this pool's transport and timeout.
    pub fn call_direct(&self, addr: &str, msg: &Msg) -> Result<Msg, RpcError> {
        call_direct(&*self.transport, addr, msg, self.timeout)
    }
}
