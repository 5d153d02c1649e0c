//! The byte-stream transport under the RPC layer. TCP is the default; the trait is the seam
//! where a researcher plugs in another (an RDMA verbs backend, a UCX one).
//!
//! [`TcpTransport`] can inject a delay per message and drop connections, because `tc netem`
//! does not exist on our machines and tests need a slow or lossy network.
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub trait Conn: Read + Write + Send {
    fn try_clone_box(&self) -> io::Result<Box<dyn Conn>>;
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    fn close(&self);
    fn peer(&self) -> String;
}

pub trait Listener: Send {
    fn accept(&self) -> io::Result<Box<dyn Conn>>;
    fn local_addr(&self) -> String;
}

pub trait Transport: Send + Sync + 'static {
    fn connect(&self, addr: &str, timeout: Duration) -> io::Result<Box<dyn Conn>>;
    fn listen(&self, addr: &str) -> io::Result<Box<dyn Listener>>;
}

/// TCP with Nagle off. `delay_us` is added before every write (fault injection; 0 = none).
/// A read first polls the socket for up to `spin_us` ([`spin_poll`]) before sleeping.
#[derive(Clone)]
pub struct TcpTransport {
    pub delay_us: Arc<AtomicU64>,
    pub spin_us: Arc<AtomicU64>,
}

impl Default for TcpTransport {
    fn default() -> Self {
        TcpTransport { delay_us: Arc::new(AtomicU64::new(0)), spin_us: Arc::new(AtomicU64::new(DEFAULT_SPIN_US)) }
    }
}

pub const DEFAULT_SPIN_US: u64 = 100;

impl TcpTransport {
    /// Reads `SPLITOS_NET_DELAY_US` so that a test can slow every component's network.
    pub fn from_env() -> Self {
        let t = TcpTransport::default();
        if let Some(us) = std::env::var("SPLITOS_NET_DELAY_US").ok().and_then(|v| v.parse().ok()) {
            t.delay_us.store(us, Ordering::Relaxed);
        }
        if let Some(us) = std::env::var("SPLITOS_NET_SPIN_US").ok().and_then(|v| v.parse().ok()) {
            t.spin_us.store(us, Ordering::Relaxed);
        }
        t
    }
}

struct TcpConn {
    s: TcpStream,
    delay_us: Arc<AtomicU64>,
    spin_us: Arc<AtomicU64>,
}

impl Read for TcpConn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let spin = Duration::from_micros(self.spin_us.load(Ordering::Relaxed));
        if !buf.is_empty() {
            let fd = self.s.as_raw_fd();
            let r = spin_poll(spin, || {
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
            if let Some(r) = r {
                return r;
            }
        }
        self.s.read(buf)
    }
}

/// Calls `try_once` until it yields something or `budget` passes: polling hard for the first
/// quarter, then yielding the CPU between polls. The caller then sleeps in the kernel. On
/// virtual machines waking a halted vCPU costs more than a loopback round trip; a yielding
/// poller keeps its vCPU awake while any runnable thread (the peer it waits for) still gets it.
pub fn spin_poll<T>(budget: Duration, mut try_once: impl FnMut() -> Option<T>) -> Option<T> {
    if budget.is_zero() {
        return try_once();
    }
    let t0 = std::time::Instant::now();
    loop {
        if let Some(v) = try_once() {
            return Some(v);
        }
        let waited = t0.elapsed();
        if waited >= budget {
            return None;
        }
        if waited < budget / 4 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

impl Write for TcpConn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let d = self.delay_us.load(Ordering::Relaxed);
        if d > 0 {
            std::thread::sleep(Duration::from_micros(d));
        }
        self.s.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.s.flush()
    }
}

impl Conn for TcpConn {
    fn try_clone_box(&self) -> io::Result<Box<dyn Conn>> {
        Ok(Box::new(TcpConn { s: self.s.try_clone()?, delay_us: self.delay_us.clone(), spin_us: self.spin_us.clone() }))
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.s.set_read_timeout(t)
    }
    fn close(&self) {
        let _ = self.s.shutdown(Shutdown::Both);
    }
    fn peer(&self) -> String {
        self.s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into())
    }
}

struct TcpListen {
    l: TcpListener,
    delay_us: Arc<AtomicU64>,
    spin_us: Arc<AtomicU64>,
}


impl Listener for TcpListen {
    fn accept(&self) -> io::Result<Box<dyn Conn>> {
        let (s, _) = self.l.accept()?;
        s.set_nodelay(true)?;
        Ok(Box::new(TcpConn { s, delay_us: self.delay_us.clone(), spin_us: self.spin_us.clone() }))
    }
    fn local_addr(&self) -> String {
        self.l.local_addr().map(|a| a.to_string()).unwrap_or_default()
    }
}

impl Transport for TcpTransport {
    fn connect(&self, addr: &str, timeout: Duration) -> io::Result<Box<dyn Conn>> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr} resolves to no address"));
        for sa in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&sa, timeout) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    return Ok(Box::new(TcpConn { s, delay_us: self.delay_us.clone(), spin_us: self.spin_us.clone() }));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }
    fn listen(&self, addr: &str) -> io::Result<Box<dyn Listener>> {
        Ok(Box::new(TcpListen { l: TcpListener::bind(addr)?, delay_us: self.delay_us.clone(), spin_us: self.spin_us.clone() }))
    }
}
