//! TCP, the default transport: length-bounded frames ([`crate::frame`]) on TCP connections
//! with Nagle off. Callers on many threads share one multiplexed connection per peer (a reader
//! thread matches replies to callers by request id); the data path instead uses connections
//! owned by the calling thread ([`Transport::call_direct`]), so a reply wakes the caller
//! directly. The serving side has a receiving thread per connection.
//!
//! Its knobs ([`TcpConfig`]) can inject a delay per message, because `tc netem` does not exist
//! on our machines and tests need a slow network, and set how long a reader polls its socket
//! before sleeping.
//!
//! Anyone who reaches the port can connect, so what a connection may hold is bounded: the
//! connections served at once, in all and per peer address (one more is closed at once); the
//! time a frame may take to arrive once it began, and a new connection's first frame from the
//! accept (a peer that stalls is closed); the requests of one connection in flight at once,
//! granted to the peer as credits when the connection begins (a caller beyond them waits for a
//! reply; a frame sent beyond them is not read until one is answered); and the memory of a
//! frame, which grows with the bytes that arrived rather than with the length its header
//! announces.
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Sender};
use serde::{Deserialize, Serialize};

use super::{Endpoint, Transport};
use crate::auth::{self, AuthError, Credentials, Session};
use crate::error::RpcError;
use crate::frame::{read_frame, write_frame, FrameError};
use crate::poll::{Poller, Polling};
use crate::refusals::Refusals;
use crate::server::{Dispatcher, Handler, Peer, ServerConfig};
use crate::serving::Loops;
use crate::wire::{may_receive, wrong_receiver, FrameKind, Msg};

/// The knobs of TCP (`[transport.tcp]`), which both kinds use to reach other hosts.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, clap::Args)]
#[serde(deny_unknown_fields, default)]
#[command(next_help_heading = "Transport: TCP")]
pub struct TcpConfig {
    /// How long a reader polls its socket before sleeping in the kernel (µs). On virtual
    /// machines waking a halted vCPU costs more than a loopback round trip.
    #[arg(id = "tcp.spin_us", value_name = "US", long = "tcp-spin-us", default_value_t = DEFAULT_SPIN_US)]
    pub spin_us: u64,
    /// Delay added before every message sent (µs): fault injection, 0 = none.
    #[arg(id = "tcp.delay_us", value_name = "US", long = "tcp-delay-us", default_value_t = 0)]
    pub delay_us: u64,
    /// Connections a component serves at once, from all peers.
    #[arg(
        id = "tcp.max_connections",
        value_name = "N",
        long = "tcp-max-connections",
        default_value_t = 4096
    )]
    pub max_connections: usize,
    /// Connections a component serves at once from one peer address. Loopback peers share one
    /// address: every component of a host, and a pComponent makes a connection per fault
    /// worker (one per program) to each mComponent.
    #[arg(
        id = "tcp.max_connections_per_peer",
        value_name = "N",
        long = "tcp-max-connections-per-peer",
        default_value_t = 2048
    )]
    pub max_connections_per_peer: usize,
    /// How long a frame may take to arrive once its first byte did, and a new connection's
    /// first frame from the accept (ms).
    #[arg(
        id = "tcp.frame_timeout_ms",
        value_name = "MS",
        long = "tcp-frame-timeout-ms",
        default_value_t = 10_000
    )]
    pub frame_timeout_ms: u64,
    /// Credits: requests of one connection served at once, granted to the peer when the
    /// connection begins; a peer's caller beyond them waits for a reply, and a frame sent
    /// beyond them is not read until one is answered.
    #[arg(
        id = "tcp.max_in_flight",
        value_name = "N",
        long = "tcp-max-in-flight",
        default_value_t = 64
    )]
    pub max_in_flight: usize,
}

pub const DEFAULT_SPIN_US: u64 = 100;

impl Default for TcpConfig {
    fn default() -> Self {
        crate::knob::defaults()
    }
}

impl TcpConfig {
    pub fn validate(&self) -> Result<(), super::TransportError> {
        if self.max_connections == 0
            || self.max_connections_per_peer == 0
            || self.max_in_flight == 0
            || self.frame_timeout_ms == 0
        {
            return Err(super::TransportError::TcpLimits);
        }
        Ok(())
    }
}

mod client;
mod direct;
mod loops;

use client::Client;
use direct::{call_all_direct, call_direct};

pub struct TcpTransport {
    cfg: TcpConfig,
    polling: Polling,
    /// This component's identity: every connection it makes or serves is authenticated with
    /// it. `None` only for the benchmarks' raw floors and the transport's own tests.
    creds: Option<Arc<Credentials>>,
    clients: Mutex<HashMap<String, Client>>,
}

impl TcpTransport {
    pub fn new(cfg: TcpConfig, polling: Polling, creds: Option<Arc<Credentials>>) -> TcpTransport {
        TcpTransport {
            cfg,
            polling,
            creds,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// A connection with this transport's knobs, authenticated if the transport has
    /// credentials (records encrypted unless the peer is on loopback).
    pub fn connect_stream(&self, addr: &str, timeout: Duration) -> io::Result<TcpConn> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr} resolves to no address"));
        for sa in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&sa, timeout) {
                Ok(s) => {
                    let mut c = TcpConn::new(s, &self.cfg, self.polling)?;
                    if let Some(creds) = &self.creds {
                        let _ = c.s.set_read_timeout(Some(timeout));
                        let hs =
                            auth::initiate(&mut c, creds, !sa.ip().to_canonical().is_loopback()).map_err(
                                |e| match e {
                                    AuthError::Io(e) => e,
                                    AuthError::Refused(why) => {
                                        io::Error::new(io::ErrorKind::PermissionDenied, format!("{addr}: {why}"))
                                    }
                                },
                            )?;
                        c.s.set_read_timeout(None)?;
                        c.peer = Some(hs.peer);
                        c.session = hs.session.map(Arc::new);
                    }
                    return Ok(c);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// A listening socket whose connections get this transport's knobs and credentials.
    pub fn listen_stream(&self, addr: &str) -> io::Result<TcpListen> {
        Ok(TcpListen {
            l: TcpListener::bind(addr)?,
            cfg: self.cfg.clone(),
            polling: self.polling,
            creds: self.creds.clone(),
        })
    }

    fn client(&self, addr: &str, timeout: Duration) -> Result<Client, RpcError> {
        if let Some(c) = self.clients.lock().unwrap().get(addr) {
            if !c.is_dead() {
                return Ok(c.clone());
            }
        }
        let conn = self
            .connect_stream(addr, timeout.min(Duration::from_secs(3)))
            .map_err(|e| RpcError::Unreachable {
                addr: addr.to_string(),
                why: e.to_string(),
            })?;
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

    fn call_all_direct(&self, calls: &[(&str, &Msg)], timeout: Duration) -> Vec<Result<Msg, RpcError>> {
        call_all_direct(self, calls, timeout)
    }

    fn listen(&self, addr: &str) -> io::Result<Box<dyn Endpoint>> {
        Ok(Box::new(self.listen_stream(addr)?))
    }
}

/// One TCP connection. Reads poll for up to `spin_us` ([`Poller`]) before sleeping; writes
/// wait `delay_us` first when a delay is injected.
pub struct TcpConn {
    s: TcpStream,
    /// The peer, once a handshake established it.
    peer: Option<Peer>,
    /// Record keys, if records are encrypted; each side counts its records.
    session: Option<Arc<Session>>,
    sent: u64,
    received: u64,
    /// Plaintext of the last record received, not yet read.
    plain: Vec<u8>,
    plain_at: usize,
    poller: Poller,
    polling: Polling,
    spin: Duration,
    delay: Duration,
    /// On a served connection: how long a frame may take once begun ([`TcpConn::frame_done`]).
    frame_timeout: Option<Duration>,
    /// When the frame being read must have arrived.
    deadline: Option<Instant>,
    /// Whether the socket has a read timeout set for `deadline`.
    timed: bool,
}

impl TcpConn {
    fn new(s: TcpStream, cfg: &TcpConfig, polling: Polling) -> io::Result<TcpConn> {
        s.set_nodelay(true)?;
        let spin = Duration::from_micros(cfg.spin_us);
        Ok(TcpConn {
            s,
            peer: None,
            session: None,
            sent: 0,
            received: 0,
            plain: Vec::new(),
            plain_at: 0,
            poller: Poller::new(spin, polling),
            polling,
            spin,
            delay: Duration::from_micros(cfg.delay_us),
            frame_timeout: None,
            deadline: None,
            timed: false,
        })
    }

    /// The same connection with polling state of its own (for another thread).
    pub fn try_clone(&self) -> io::Result<TcpConn> {
        Ok(TcpConn {
            s: self.s.try_clone()?,
            peer: self.peer,
            session: self.session.clone(),
            sent: self.sent,
            received: self.received,
            plain: Vec::new(),
            plain_at: 0,
            poller: Poller::new(self.spin, self.polling),
            polling: self.polling,
            spin: self.spin,
            delay: self.delay,
            frame_timeout: None,
            deadline: None,
            timed: false,
        })
    }

    /// The socket, for its options (a test's read timeout).
    pub fn stream(&self) -> &TcpStream {
        &self.s
    }

    /// Reads and decrypts the peer's next record into `plain`.
    fn next_record(&mut self, session: &Session) -> io::Result<bool> {
        let mut len = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            match self.read_raw(&mut len[got..])? {
                0 if got == 0 => return Ok(false),
                0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "truncated record")),
                n => got += n,
            }
        }
        let len = u32::from_le_bytes(len) as usize;
        if len > auth::RECORD + 16 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a record of {len} bytes"),
            ));
        }
        let mut sealed = vec![0u8; len];
        let mut at = 0;
        while at < len {
            match self.read_raw(&mut sealed[at..])? {
                0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "truncated record")),
                n => at += n,
            }
        }
        session.open(self.received, &sealed, &mut self.plain)?;
        self.received += 1;
        self.plain_at = 0;
        Ok(true)
    }

    /// Makes reads of a served connection time out: its first frame must arrive within
    /// `timeout` from now, and each later one within `timeout` of its first byte.
    fn bound_frames(&mut self, timeout: Duration) {
        self.frame_timeout = Some(timeout);
        self.deadline = Some(Instant::now() + timeout);
    }

    /// A whole frame arrived: the connection may now stay idle until the next one begins.
    fn frame_done(&mut self) -> io::Result<()> {
        self.deadline = None;
        if self.timed {
            self.timed = false;
            self.s.set_read_timeout(None)?;
        }
        Ok(())
    }

    /// The blocking read of `s`, bounded by the frame's `deadline` if one runs (`timed`: the
    /// socket has a read timeout set).
    fn read_blocking(
        mut s: &TcpStream,
        deadline: Option<Instant>,
        timed: &mut bool,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let Some(deadline) = deadline else { return s.read(buf) };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "frame not received in time"));
        }
        s.set_read_timeout(Some(left))?;
        *timed = true;
        match s.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                Err(io::Error::new(io::ErrorKind::TimedOut, "frame not received in time"))
            }
            r => r,
        }
    }

    /// Starts a frame's deadline with its first byte.
    fn arrived(&mut self, r: io::Result<usize>) -> io::Result<usize> {
        if let (Ok(n), None, Some(t)) = (&r, self.deadline, self.frame_timeout) {
            if *n > 0 {
                self.deadline = Some(Instant::now() + t);
            }
        }
        r
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
        let Some(session) = self.session.clone() else {
            return self.read_raw(buf);
        };
        while self.plain_at == self.plain.len() {
            if buf.is_empty() || !self.next_record(&session)? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.plain.len() - self.plain_at);
        buf[..n].copy_from_slice(&self.plain[self.plain_at..self.plain_at + n]);
        self.plain_at += n;
        Ok(n)
    }
}

impl TcpConn {
    /// Reads bytes as they come off the socket.
    fn read_raw(&mut self, buf: &mut [u8]) -> io::Result<usize> {
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
            let r = match r {
                Ok(r) => r,
                Err(pending) => {
                    let r = TcpConn::read_blocking(&self.s, self.deadline, &mut self.timed, buf);
                    pending.slept();
                    r
                }
            };
            return self.arrived(r);
        }
        self.s.read(buf)
    }
}

impl Write for TcpConn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.delay.is_zero() {
            crate::series::INJECTED_DELAYS.increment(1);
            std::thread::sleep(self.delay);
        }
        let Some(session) = &self.session else {
            return self.s.write(buf);
        };
        // Sealed whole, in records: a reader never sees part of one.
        let mut out = Vec::with_capacity(buf.len() + buf.len().div_ceil(auth::RECORD) * 20);
        let mut sealed = Vec::new();
        for chunk in buf.chunks(auth::RECORD) {
            session.seal(self.sent, chunk, &mut sealed)?;
            self.sent += 1;
            out.extend_from_slice(&(sealed.len() as u32).to_le_bytes());
            out.extend_from_slice(&sealed);
        }
        self.s.write_all(&out)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.s.flush()
    }
}

pub struct TcpListen {
    l: TcpListener,
    cfg: TcpConfig,
    polling: Polling,
    creds: Option<Arc<Credentials>>,
}

impl TcpListen {
    pub fn accept(&self) -> io::Result<TcpConn> {
        let (s, _) = self.l.accept()?;
        TcpConn::new(s, &self.cfg, self.polling)
    }
}

/// The connections a listener serves, by peer address.
struct Admission {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// A served connection's place in its listener's [`Admission`], given back when it ends.
struct Admitted {
    admission: Arc<Mutex<Admission>>,
    peer: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut a = self.admission.lock().unwrap();
        a.total -= 1;
        if let Some(n) = a.per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                a.per_peer.remove(&self.peer);
            }
        }
    }
}

/// Admits a connection from `peer` within the caps, or says which cap it would exceed.
fn admit(admission: &Arc<Mutex<Admission>>, peer: IpAddr, cfg: &TcpConfig) -> Result<Admitted, &'static str> {
    let mut a = admission.lock().unwrap();
    if a.total >= cfg.max_connections {
        return Err("max_connections");
    }
    let n = a.per_peer.entry(peer).or_insert(0);
    if *n >= cfg.max_connections_per_peer {
        return Err("max_connections_per_peer");
    }
    *n += 1;
    a.total += 1;
    Ok(Admitted {
        admission: admission.clone(),
        peer,
    })
}

impl Endpoint for TcpListen {
    fn addr(&self) -> String {
        self.l.local_addr().map(|a| a.to_string()).unwrap_or_default()
    }

    fn serve(self: Box<Self>, handler: Arc<dyn Handler>, cfg: ServerConfig) {
        let dispatcher = Arc::new(Dispatcher::new(handler, &cfg));
        let loops = Loops::for_config(&cfg.name, &cfg.serving);
        self.serve_with(dispatcher, &cfg.name, loops);
    }
}

impl TcpListen {
    /// Serves with a dispatcher shared with another way in (the shared-memory transport's).
    /// With `loops`, each connection is served on one of them once it authenticated.
    pub(super) fn serve_with(self, dispatcher: Arc<Dispatcher>, name: &str, loops: Option<Arc<Loops>>) {
        let name = name.to_string();
        let admission = Arc::new(Mutex::new(Admission {
            total: 0,
            per_peer: HashMap::new(),
        }));
        let refused = crate::series::CONNECTIONS_REFUSED.handle();
        std::thread::Builder::new()
            .name(format!("{name}-accept"))
            .spawn(move || loop {
                match self.accept() {
                    Ok(mut conn) => {
                        let Ok(peer) = conn.s.peer_addr() else { continue };
                        let admitted = match admit(&admission, peer.ip(), &self.cfg) {
                            Ok(a) => a,
                            Err(cap) => {
                                refused.increment(1);
                                static OVER_CAP: Refusals = Refusals::new("refused a connection over the cap");
                                if OVER_CAP.log_this(peer.ip()) {
                                    tracing::warn!(%peer, cap, "refused a connection over the cap; still serving the others");
                                }
                                conn.close();
                                continue;
                            }
                        };
                        conn.bound_frames(Duration::from_millis(self.cfg.frame_timeout_ms));
                        // A peer that stops reading its replies must not hold a worker: a
                        // reply that cannot be sent within the frame timeout ends the connection.
                        if conn.s.set_write_timeout(Some(Duration::from_millis(self.cfg.frame_timeout_ms))).is_err() {
                            continue;
                        }
                        let (d, in_flight, creds, loops) = (dispatcher.clone(), self.cfg.max_in_flight, self.creds.clone(), loops.clone());
                        let frame_timeout = Duration::from_millis(self.cfg.frame_timeout_ms);
                        let _ = std::thread::Builder::new().name(format!("{name}-rx")).spawn(move || {
                            // The handshake counts as the connection's first frame: it must
                            // be done within the frame timeout of the accept.
                            if let Some(creds) = creds {
                                match auth::respond(&mut conn, &creds, peer.ip().to_canonical().is_loopback()) {
                                    Ok(hs) if conn.frame_done().is_ok() => {
                                        conn.peer = Some(hs.peer);
                                        conn.session = hs.session.map(Arc::new);
                                        crate::series::TCP_CONNECTIONS_ACCEPTED.increment(1);
                                    }
                                    Ok(_) => return,
                                    Err(e) => {
                                        crate::series::HANDSHAKES_REFUSED.increment(1);
                                        static UNAUTHENTICATED: Refusals = Refusals::new("refused a connection that did not authenticate");
                                        if UNAUTHENTICATED.log_this(peer.ip()) {
                                            tracing::warn!(%peer, error = %e, "refused a connection that did not authenticate; still serving the others");
                                        }
                                        conn.close();
                                        return;
                                    }
                                }
                            }
                            match loops {
                                Some(loops) => loops.next().spawn(move || loops::LoopConn::start(conn, d, in_flight, frame_timeout, admitted)),
                                None => {
                                    receive_loop(conn, d, in_flight);
                                    drop(admitted);
                                }
                            }
                        });
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

/// Requests of one connection being served, and how many may be: the credits granted to it.
struct InFlight {
    n: Mutex<usize>,
    done: Condvar,
    max: usize,
}

impl InFlight {
    fn enter(&self) {
        let mut n = self.n.lock().unwrap();
        if *n >= self.max {
            // The peer sent beyond its credits: its frames wait in the socket, not here.
            crate::series::REQUESTS_OVER_CREDIT.increment(1);
        }
        while *n >= self.max {
            n = self.done.wait(n).unwrap();
        }
        *n += 1;
    }
    fn leave(&self) {
        *self.n.lock().unwrap() -= 1;
        self.done.notify_one();
    }
}

/// The address of the host at the other end of `s`, which names it among the peers whose
/// refusals are logged a few at a time.
pub(super) fn host(s: &TcpStream) -> String {
    s.peer_addr().map_or_else(|_| "?".to_string(), |a| a.ip().to_string())
}

fn receive_loop(mut reader: TcpConn, dispatcher: Arc<Dispatcher>, max_in_flight: usize) {
    static CLOSED: Refusals = Refusals::new("closed a connection that broke the protocol");
    let peer = reader.peer();
    let host = host(&reader.s);
    let writer = match reader.try_clone() {
        Ok(w) => Arc::new(Mutex::new(w)),
        Err(e) => {
            tracing::warn!(%peer, error = %e, "cannot clone connection");
            return;
        }
    };
    let in_flight = Arc::new(InFlight {
        n: Mutex::new(0),
        done: Condvar::new(),
        max: max_in_flight,
    });
    if let Err(e) = write_frame(
        &mut *writer.lock().unwrap(),
        FrameKind::Credit,
        max_in_flight as u64,
        &Msg::OK(crate::wire::OK),
    ) {
        tracing::debug!(%peer, error = %e, "cannot grant credits; closing the connection");
        writer.lock().unwrap().close();
        return;
    }
    loop {
        let frame = read_frame(&mut reader);
        if frame.is_ok() && reader.frame_done().is_err() {
            break;
        }
        match frame {
            Ok(Some(f)) if f.kind == FrameKind::Request => {
                let (w, req_id, flight) = (writer.clone(), f.req_id, in_flight.clone());
                flight.enter();
                dispatcher.submit(f.msg, reader.peer, move |reply| {
                    // The credit comes back before the reply goes: the peer may send its next
                    // request as soon as it has the reply.
                    flight.leave();
                    let mut w = w.lock().unwrap();
                    if let Err(e) = write_frame(&mut *w, FrameKind::Reply, req_id, &reply) {
                        crate::series::REPLIES_UNDELIVERED.increment(1);
                        tracing::debug!(error = %e, "reply not delivered; closing the connection");
                        w.close();
                    }
                });
            }
            Ok(Some(f)) => {
                crate::series::FRAMES_REJECTED.increment(1);
                if CLOSED.log_this(&host) {
                    tracing::warn!(%peer, req_id = f.req_id, "unsolicited reply frame; closing connection");
                }
                break;
            }
            Ok(None) => break,
            Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset => break,
            Err(FrameError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {
                crate::series::FRAMES_TIMED_OUT.increment(1);
                if CLOSED.log_this(&host) {
                    tracing::warn!(%peer, "a frame did not arrive in time; closing that connection, still serving others");
                }
                break;
            }
            Err(e) => {
                crate::series::FRAMES_REJECTED.increment(1);
                if CLOSED.log_this(&host) {
                    tracing::warn!(%peer, error = %e, "rejected malformed frame; closing that connection, still serving others");
                }
                break;
            }
        }
    }
    writer.lock().unwrap().close();
}

#[cfg(test)]
mod tests;
