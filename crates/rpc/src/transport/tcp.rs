//! TCP, the default transport: length-bounded frames ([`crate::frame`]) on TCP connections
//! with Nagle off. Callers on many threads share one multiplexed connection per peer (a reader
//! thread matches replies to callers by request id); the data path instead uses connections
//! owned by the calling thread ([`Transport::call_direct`]), so a reply wakes the caller
//! directly. The serving side has a receiving thread per connection.
//!
//! Its knobs ([`TcpConfig`]) can inject a delay per message, because `tc netem` does not exist
//! on our machines and tests need a slow network, and set how long a reader polls its socket
//! before sleeping.
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crossbeam_channel::{bounded, Sender};
use serde::{Deserialize, Serialize};

use super::{Endpoint, Transport};
use crate::error::RpcError;
use crate::frame::{read_frame, write_frame, FrameError};
use crate::poll::{Poller, Polling};
use crate::server::{Dispatcher, Handler, ServerConfig};
use crate::wire::{FrameKind, Msg};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TcpConfig {
    /// How long a reader polls its socket before sleeping in the kernel (µs). On virtual
    /// machines waking a halted vCPU costs more than a loopback round trip.
    #[serde(default = "default_spin_us")]
    pub spin_us: u64,
    /// Delay added before every message sent (µs): fault injection, 0 = none.
    #[serde(default)]
    pub delay_us: u64,
}

pub const DEFAULT_SPIN_US: u64 = 100;

fn default_spin_us() -> u64 {
    DEFAULT_SPIN_US
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig { spin_us: DEFAULT_SPIN_US, delay_us: 0 }
    }
}

pub struct TcpTransport {
    cfg: TcpConfig,
    polling: Polling,
    clients: Mutex<HashMap<String, Client>>,
}

impl TcpTransport {
    pub fn new(cfg: TcpConfig, polling: Polling) -> TcpTransport {
        TcpTransport { cfg, polling, clients: Mutex::new(HashMap::new()) }
    }

    /// A byte-stream connection with this transport's knobs (the benchmarks' raw floors).
    pub fn connect_stream(&self, addr: &str, timeout: Duration) -> io::Result<TcpConn> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr} resolves to no address"));
        for sa in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&sa, timeout) {
                Ok(s) => return TcpConn::new(s, &self.cfg, self.polling),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A listening socket whose connections get this transport's knobs.
    pub fn listen_stream(&self, addr: &str) -> io::Result<TcpListen> {
        Ok(TcpListen { l: TcpListener::bind(addr)?, cfg: self.cfg.clone(), polling: self.polling })
    }

    fn client(&self, addr: &str, timeout: Duration) -> Result<Client, RpcError> {
        if let Some(c) = self.clients.lock().unwrap().get(addr) {
            if !c.is_dead() {
                return Ok(c.clone());
            }
        }
        let conn = self
            .connect_stream(addr, timeout.min(Duration::from_secs(3)))
            .map_err(|e| RpcError::Unreachable { addr: addr.to_string(), why: e.to_string() })?;
        let c = Client::start(conn, addr)?;
        self.clients.lock().unwrap().insert(addr.to_string(), c.clone());
        Ok(c)
    }
}

impl Transport for TcpTransport {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn call(&self, addr: &str, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError> {
        self.client(addr, timeout)?.call(msg, timeout)
    }

    fn call_direct(&self, addr: &str, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError> {
        call_direct(self, addr, msg, timeout)
    }

    fn listen(&self, addr: &str) -> io::Result<Box<dyn Endpoint>> {
        Ok(Box::new(self.listen_stream(addr)?))
    }
}

/// One TCP connection. Reads poll for up to `spin_us` ([`Poller`]) before sleeping; writes
/// wait `delay_us` first when a delay is injected.
pub struct TcpConn {
    s: TcpStream,
    poller: Poller,
    polling: Polling,
    spin: Duration,
    delay: Duration,
}

impl TcpConn {
    fn new(s: TcpStream, cfg: &TcpConfig, polling: Polling) -> io::Result<TcpConn> {
        s.set_nodelay(true)?;
        let spin = Duration::from_micros(cfg.spin_us);
        Ok(TcpConn { s, poller: Poller::new(spin, polling), polling, spin, delay: Duration::from_micros(cfg.delay_us) })
    }

    /// The same connection with polling state of its own (for another thread).
    pub fn try_clone(&self) -> io::Result<TcpConn> {
        Ok(TcpConn { s: self.s.try_clone()?, poller: Poller::new(self.spin, self.polling), polling: self.polling, spin: self.spin, delay: self.delay })
    }

    fn close(&self) {
        let _ = self.s.shutdown(Shutdown::Both);
    }

    fn peer(&self) -> String {
        self.s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into())
    }
}

impl Read for TcpConn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !buf.is_empty() {
            let fd = self.s.as_raw_fd();
            let r = self.poller.poll(|| {
                // SAFETY: `buf` is a valid writable buffer of `buf.len()` bytes for the whole
                // call, and `fd` is this connection's open socket.
                let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT) };
                if n >= 0 {
                    return Some(Ok(n as usize));
                }
                let e = io::Error::last_os_error();
                match e.kind() {
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => None,
                    _ => Some(Err(e)),
                }
            });
            match r {
                Ok(r) => return r,
                Err(pending) => {
                    let r = self.s.read(buf);
                    pending.slept();
                    return r;
                }
            }
        }
        self.s.read(buf)
    }
}

impl Write for TcpConn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.delay.is_zero() {
            metrics::counter!("rpc_injected_delays_total").increment(1);
            std::thread::sleep(self.delay);
        }
        self.s.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.s.flush()
    }
}

pub struct TcpListen {
    l: TcpListener,
    cfg: TcpConfig,
    polling: Polling,
}

impl TcpListen {
    pub fn accept(&self) -> io::Result<TcpConn> {
        let (s, _) = self.l.accept()?;
        TcpConn::new(s, &self.cfg, self.polling)
    }
}

impl Endpoint for TcpListen {
    fn addr(&self) -> String {
        self.l.local_addr().map(|a| a.to_string()).unwrap_or_default()
    }

    fn serve(self: Box<Self>, handler: Arc<dyn Handler>, cfg: ServerConfig) {
        let dispatcher = Arc::new(Dispatcher::new(handler, &cfg));
        self.serve_with(dispatcher, &cfg.name);
    }
}

impl TcpListen {
    /// Serves with a dispatcher shared with another way in (the shared-memory transport's).
    pub(super) fn serve_with(self, dispatcher: Arc<Dispatcher>, name: &str) {
        let name = name.to_string();
        std::thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || loop {
                match self.accept() {
                    Ok(conn) => {
                        let d = dispatcher.clone();
                        let _ = std::thread::Builder::new().name(format!("{name}-rx")).spawn(move || receive_loop(conn, d));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
            })
            .expect("spawn accept thread");
    }
}

fn receive_loop(mut reader: TcpConn, dispatcher: Arc<Dispatcher>) {
    let peer = reader.peer();
    let writer = match reader.try_clone() {
        Ok(w) => Arc::new(Mutex::new(w)),
        Err(e) => {
            tracing::warn!(%peer, error = %e, "cannot clone connection");
            return;
        }
    };
    loop {
        match read_frame(&mut reader) {
            Ok(Some(f)) if f.kind == FrameKind::Request => {
                let (w, req_id) = (writer.clone(), f.req_id);
                dispatcher.submit(f.msg, move |reply| {
                    if let Err(e) = write_frame(&mut *w.lock().unwrap(), FrameKind::Reply, req_id, &reply) {
                        tracing::debug!(error = %e, "reply not delivered");
                    }
                });
            }
            Ok(Some(f)) => {
                metrics::counter!("rpc_frames_rejected_total").increment(1);
                tracing::warn!(%peer, req_id = f.req_id, "unsolicited reply frame; closing connection");
                break;
            }
            Ok(None) => break,
            Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset => break,
            Err(e) => {
                metrics::counter!("rpc_frames_rejected_total").increment(1);
                tracing::warn!(%peer, error = %e, "rejected malformed frame; closing that connection, still serving others");
                break;
            }
        }
    }
    writer.lock().unwrap().close();
}

type Waiter = Sender<Result<Msg, RpcError>>;

struct Inner {
    addr: String,
    writer: Mutex<TcpConn>,
    pending: Mutex<HashMap<u64, Waiter>>,
    next_id: AtomicU64,
    dead: AtomicBool,
}

/// A multiplexed connection: callers on many threads share it; a reader thread matches
/// replies to callers by request id.
#[derive(Clone)]
struct Client {
    inner: Arc<Inner>,
}

impl Client {
    fn start(conn: TcpConn, addr: &str) -> Result<Client, RpcError> {
        let reader = conn.try_clone().map_err(|e| RpcError::Unreachable { addr: addr.to_string(), why: e.to_string() })?;
        let inner = Arc::new(Inner {
            addr: addr.to_string(),
            writer: Mutex::new(conn),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            dead: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new().name(format!("rpc-rx {addr}")).spawn(move || reader_loop(reader, weak)).expect("spawn rpc reader");
        Ok(Client { inner })
    }

    fn is_dead(&self) -> bool {
        self.inner.dead.load(Ordering::Acquire)
    }

    fn call(&self, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError> {
        let inner = &self.inner;
        if inner.dead.load(Ordering::Acquire) {
            return Err(RpcError::Closed { addr: inner.addr.clone() });
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        inner.pending.lock().unwrap().insert(id, tx);
        let sent = write_frame(&mut *inner.writer.lock().unwrap(), FrameKind::Request, id, msg);
        if let Err(e) = sent {
            inner.pending.lock().unwrap().remove(&id);
            inner.dead.store(true, Ordering::Release);
            return Err(RpcError::Unreachable { addr: inner.addr.clone(), why: e.to_string() });
        }
        match rx.recv_timeout(timeout) {
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

fn reader_loop(mut conn: TcpConn, inner: Weak<Inner>) {
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
            // The peer went away (it stopped or was killed): the callers waiting learn it.
            Err(FrameError::Io(e)) => {
                tracing::debug!(peer = %inner.addr, error = %e, "connection lost");
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

/// A thread's own connections, by peer address, each with its last request id.
type DirectConns = HashMap<String, (TcpConn, u64)>;

thread_local! {
    static DIRECT: std::cell::RefCell<DirectConns> = std::cell::RefCell::new(HashMap::new());
}

/// A call on a connection owned by the calling thread: no reader thread, no hand-off between
/// threads. The connection is made on the thread's first call to `addr` and dropped after any
/// error.
fn call_direct(t: &TcpTransport, addr: &str, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError> {
    DIRECT.with(|d| {
        let mut d = d.borrow_mut();
        if !d.contains_key(addr) {
            let c = t.connect_stream(addr, timeout.min(Duration::from_secs(3))).map_err(|e| RpcError::Unreachable { addr: addr.to_string(), why: e.to_string() })?;
            let _ = c.s.set_read_timeout(Some(timeout));
            d.insert(addr.to_string(), (c, 1));
        }
        let (conn, next) = d.get_mut(addr).expect("inserted above");
        *next += 1;
        let id = *next;
        let r = write_frame(conn, FrameKind::Request, id, msg)
            .map_err(|e| RpcError::Unreachable { addr: addr.to_string(), why: e.to_string() })
            .and_then(|_| loop {
                match read_frame(conn) {
                    Ok(Some(f)) if f.kind == FrameKind::Reply && f.req_id == id => return Ok(f.msg),
                    // A reply to an earlier call that timed out: skip it.
                    Ok(Some(f)) if f.kind == FrameKind::Reply && f.req_id < id => continue,
                    Ok(_) => return Err(RpcError::Closed { addr: addr.to_string() }),
                    Err(FrameError::Io(e)) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                        return Err(RpcError::Timeout { addr: addr.to_string(), msg: msg.name(), after: timeout })
                    }
                    Err(_) => return Err(RpcError::Closed { addr: addr.to_string() }),
                }
            });
        if r.is_err() {
            d.remove(addr);
        }
        r
    })
}
