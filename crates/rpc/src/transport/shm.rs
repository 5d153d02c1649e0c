//! Shared memory, for components on one host: a request and its reply cross a memory channel
//! both processes map, so a call costs no system call while the peer is polling. Peers on
//! other hosts are reached over TCP as before; every component also listens on TCP, so that
//! hosts without a channel to it still reach it.
//!
//! How a channel is made: a component listening at `ADDR` also listens on a Unix socket named
//! after `ADDR` and its network namespace (components in other namespaces, the tests' "hosts",
//! never find it) in a directory only its user may enter (`0700`, checked at start). A caller
//! that finds the socket connects; the server checks the caller's user (`SO_PEERCRED`), makes
//! a sealed memfd (the caller cannot shrink it under the server) and passes it over. The
//! socket stays open: it carries doorbells when a side sleeps, and its end tells either side
//! that the other died.
//!
//! A channel holds one call at a time: the caller writes the request and bumps `req_seq`; the
//! server polls for it (`spin_us`), then sleeps on the socket after announcing so in the
//! header, and the caller rings the doorbell only then. The reply comes back the same way.
//!
//! Credits: since a channel holds one call, the channels a caller has open to a server are its
//! calls in flight there. The server grants each caller (a process) `max_channels_per_peer`
//! in every channel's header and refuses a channel beyond them; a caller that has as many
//! open as granted waits for one to come back, so that a slow server slows its callers
//! instead of gaining a thread and a channel's memory for every one of their threads.
//! Bytes a peer wrote are copied out before they are decoded and checked like any frame.
//!
//! A caller that asked to be followed ([`crate::cpu`]) puts its CPU in the header with each
//! request and sleeps while it waits; the server thread answers, then moves onto that CPU (if
//! it may run there) and sleeps without polling until the next request, so that the caller's
//! next doorbell wakes it on the caller's CPU. A request without a CPU lets the thread run on
//! all its CPUs again. Each channel has its own server thread, and callers on different CPUs
//! never pull one back and forth: a followed caller takes, from the free channels to a peer,
//! one whose server already runs on its CPU, else one whose server runs anywhere, else a new
//! one.
//!
//! A caller that nobody waits on ([`crate::poll::set_unhurried`]: the pComponent's evictor,
//! whose write-backs come a batch at a time) says so with each request; its server answers,
//! then sleeps rather than polls until the next one, which would come long after any polling
//! gave up, and the caller sleeps while it waits for its answer.
//!
//! The caller's side is here, in channel.rs and in credits.rs; the server's in serve.rs.
mod channel;
mod credits;
mod serve;
#[cfg(test)]
mod tests;

use channel::{pick, Channel};
use credits::{Credit, Credits};
#[cfg(test)]
use serve::{offer, Held};
use serve::{ShmListen, NO_CREDIT};
use std::cell::Cell;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use serde::{Deserialize, Serialize};
use splitos_ebb::event::{add_device, deregister, register, remove_device, Device, DeviceId, Remote};

use super::tcp::TcpListen;
use super::{Endpoint, TcpConfig, TcpTransport, Transport};
use crate::auth::{self, AuthError, Credentials};
use crate::cpu::{self, Placement};
use crate::error::RpcError;
use crate::fdpass::{recv_fds, send_fds};
use crate::poll::{Poller, Polling};
use crate::server::{self, Dispatcher, Handler, ServerConfig};
use crate::serving::Loops;
use crate::wire::{may_receive, wrong_receiver, Msg, MAGIC, MAX_BODY, WIRE_VERSION};

/// The knobs of shared memory (`[transport.shm]`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, clap::Args)]
#[serde(deny_unknown_fields, default)]
#[command(next_help_heading = "Transport: shared memory")]
pub struct ShmConfig {
    /// How long a side polls its channel for the other's message before sleeping on the
    /// socket (µs). A sleeping side costs the other a doorbell and a wake-up.
    #[arg(id = "shm.spin_us", value_name = "US", long = "shm-spin-us", default_value_t = DEFAULT_SPIN_US)]
    pub spin_us: u64,
    /// Where the rendezvous sockets live; empty: `$XDG_RUNTIME_DIR/splitos`, else
    /// `/run/splitos` for root, else `$HOME/.local/state/splitos`. Every component of a host must agree.
    #[arg(id = "shm.dir", value_name = "DIR", long = "shm-dir", default_value_t)]
    pub dir: String,
    /// How long a channel a caller opened may sit unused before the caller closes it (ms),
    /// which ends its server's thread: the channels a burst of calls opened do not stay.
    #[arg(id = "shm.idle_ms", value_name = "MS", long = "shm-idle-ms", default_value_t = DEFAULT_IDLE_MS)]
    pub idle_ms: u64,
    /// Credits: channels one caller may have open to this component at once, each one call
    /// in flight (and a serving thread and two message areas here); a caller beyond them
    /// waits for one of its calls to end.
    #[arg(
        id = "shm.max_channels_per_peer",
        value_name = "N",
        long = "shm-max-channels-per-peer",
        default_value_t = 64
    )]
    pub max_channels_per_peer: usize,
}

pub const DEFAULT_SPIN_US: u64 = 100;
pub const DEFAULT_IDLE_MS: u64 = 5000;

impl Default for ShmConfig {
    fn default() -> Self {
        crate::knob::defaults()
    }
}

impl ShmConfig {
    pub fn validate(&self) -> Result<(), super::TransportError> {
        if self.max_channels_per_peer == 0 {
            return Err(super::TransportError::ShmChannels);
        }
        Ok(())
    }

    fn dir(&self) -> PathBuf {
        if !self.dir.is_empty() {
            return PathBuf::from(&self.dir);
        }
        // SAFETY: geteuid has no preconditions.
        let uid = unsafe { libc::geteuid() };
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(d) if !d.is_empty() => Path::new(&d).join("splitos"),
            // Only root may create in /run: no other user can take the name first.
            _ if uid == 0 => PathBuf::from("/run/splitos"),
            // Never a shared directory such as /tmp, where another user could make it first.
            _ => match std::env::var_os("HOME") {
                Some(h) if !h.is_empty() => Path::new(&h).join(".local/state/splitos"),
                _ => PathBuf::from(format!("/run/user/{uid}/splitos")),
            },
        }
    }
}

/// Bytes of a channel's header page, then of each of its two message areas.
const HEADER: usize = 4096;
const AREA: usize = MAX_BODY as usize;
const CHANNEL: usize = HEADER + 2 * AREA;

/// The start of a channel as both sides see it.
#[repr(C)]
struct Header {
    magic: AtomicU32,
    version: AtomicU32,
    req_seq: AtomicU64,
    rep_seq: AtomicU64,
    req_len: AtomicU32,
    rep_len: AtomicU32,
    /// Set by a side about to sleep on the socket: the other must ring.
    server_sleeps: AtomicU32,
    client_sleeps: AtomicU32,
    /// Set by the caller with each request: 0, or 1 + the CPU it runs on and sleeps on while
    /// it waits (serve it there, and do not poll for its next request).
    follow_cpu: AtomicU32,
    /// Set by the server: the channels it lets this caller have open at once (its credits).
    credits: AtomicU32,
    /// Set by the caller with each request: 1 if no program waits on it (a background
    /// writer), so the server sleeps rather than polls for its next request.
    unhurried: AtomicU32,
}

/// One channel's memory, mapped in this process.
struct Mapping {
    ptr: *mut u8,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics or through
// copies into and out of areas that the protocol gives to one side at a time.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: &OwnedFd) -> io::Result<Mapping> {
        // SAFETY: a fresh shared mapping of `CHANNEL` bytes of `fd`, whose size both sides
        // checked; nothing else in this process refers to that address range.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHANNEL,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p as *mut u8 })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts page-aligned and is at least HEADER bytes; Header is made
        // of atomics, valid for any bit pattern, and lives as long as `self`.
        unsafe { &*(self.ptr as *const Header) }
    }

    /// Copies `bytes` into the area at `off`.
    fn put(&self, off: usize, bytes: &[u8]) {
        assert!(bytes.len() <= AREA);
        // SAFETY: `off` is one of the two areas, `bytes.len()` fits in it; the protocol gives
        // this area to this side until it publishes the new sequence number.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(off), bytes.len()) }
    }

    /// Copies `len` bytes out of the area at `off`, if that many fit.
    fn take(&self, off: usize, len: u32) -> Option<Vec<u8>> {
        let len = len as usize;
        if len > AREA {
            return None;
        }
        let mut v = vec![0u8; len];
        // SAFETY: `off + len` stays in the mapping. A hostile peer may write the area while we
        // copy: we then copy garbage, which the decoder refuses like any bad frame.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), v.as_mut_ptr(), len) };
        Some(v)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; no reference into it outlives self.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, CHANNEL) };
    }
}

const REQ: usize = HEADER;
const REP: usize = HEADER + AREA;

/// Why waiting for the other side ended without its message.
enum Gone {
    Closed,
    Timeout,
}

/// Waits until `seq` moves past `last`: polls first ([`Poller`]), then sleeps on `sock` after
/// setting `sleeps`, so that the other side rings. The fences pair with [`ring`]'s: either the
/// other side sees `sleeps` set, or this side sees its new `seq`.
fn wait(
    seq: &AtomicU64,
    last: u64,
    sleeps: &AtomicU32,
    sock: &UnixStream,
    poller: &Poller,
    deadline: Option<Instant>,
) -> Result<u64, Gone> {
    match poller.poll(|| moved(seq, last)) {
        Ok(v) => Ok(v),
        Err(pending) => {
            let r = sleep_until_moved(seq, last, sleeps, sock, deadline);
            pending.slept();
            r
        }
    }
}

fn moved(seq: &AtomicU64, last: u64) -> Option<u64> {
    let v = seq.load(Acquire);
    (v != last).then_some(v)
}

fn sleep_until_moved(
    seq: &AtomicU64,
    last: u64,
    sleeps: &AtomicU32,
    mut sock: &UnixStream,
    deadline: Option<Instant>,
) -> Result<u64, Gone> {
    loop {
        sleeps.store(1, SeqCst);
        fence(SeqCst);
        if let Some(v) = moved(seq, last) {
            sleeps.store(0, Relaxed);
            return Ok(v);
        }
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    sleeps.store(0, Relaxed);
                    return Err(Gone::Timeout);
                }
                left.as_millis().clamp(1, i32::MAX as u128) as i32
            }
        };
        let mut pfd = libc::pollfd {
            fd: sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(&mut pfd, 1, ms) };
        if pfd.revents != 0 {
            // Doorbells are hints: drain them all; an end of stream is the peer's death.
            let mut buf = [0u8; 64];
            match sock.read(&mut buf) {
                Ok(0) => return Err(Gone::Closed),
                Ok(_) => {}
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                Err(_) => return Err(Gone::Closed),
            }
        }
    }
}

/// Publishes `n` in `seq` and rings the doorbell if the other side sleeps.
fn ring(seq: &AtomicU64, n: u64, sleeps: &AtomicU32, sock: &UnixStream) {
    seq.store(n, Release);
    fence(SeqCst);
    if sleeps.load(SeqCst) != 0 {
        // SAFETY: a one-byte send from a valid buffer on a socket we own. A full socket means
        // the peer has doorbells waiting anyway.
        unsafe {
            libc::send(
                sock.as_raw_fd(),
                b"!".as_ptr() as *const libc::c_void,
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
    }
}

fn netns() -> String {
    std::fs::read_link("/proc/self/ns/net")
        .ok()
        .and_then(|l| {
            l.to_str()
                .map(|s| s.trim_start_matches("net:[").trim_end_matches(']').to_string())
        })
        .unwrap_or_else(|| "0".into())
}

/// The rendezvous directory, made if missing; refused unless others can neither list it nor
/// make names in it. They may pass through it (`0711`, a cluster's state directory that is
/// also the rendezvous directory lets users reach their program sockets): the sockets are
/// this user's alone.
fn private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !m.is_dir() || m.uid() != me || m.permissions().mode() & 0o066 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("shared-memory directory {} must be a directory of uid {me} with mode 0700 or 0711 (it is uid {}, mode {:o})", dir.display(), m.uid(), m.permissions().mode() & 0o7777),
        ));
    }
    Ok(())
}

/// Components on one host reached through shared memory, the others through TCP.
pub struct ShmTransport {
    tcp: TcpTransport,
    /// This component's identity, proved on every channel's socket before its memory is passed.
    creds: Option<Arc<Credentials>>,
    spin: Duration,
    polling: Polling,
    dir: PathBuf,
    netns: String,
    /// By peer address: the channels not in use, or when the peer was last found remote.
    peers: Arc<Mutex<HashMap<String, Peer>>>,
    /// The credits this component grants each caller.
    max_channels: usize,
}

enum Peer {
    Local(Pool),
    Remote(Instant),
}

/// The channels to one peer on this host: those not in use, and the credits they hold.
struct Pool {
    free: Vec<Channel>,
    credits: Arc<Credits>,
}

/// What opening a channel came to.
enum Opened {
    Channel(Box<Channel>),
    /// The peer is not on this host (after all).
    Remote,
    /// No credit left at the server.
    Refused,
}

/// How long a peer found without a rendezvous socket is reached over TCP before looking again.
const RECHECK: Duration = Duration::from_secs(1);

impl ShmTransport {
    pub fn new(
        cfg: &ShmConfig,
        tcp: TcpConfig,
        polling: Polling,
        creds: Option<Arc<Credentials>>,
    ) -> io::Result<ShmTransport> {
        let dir = cfg.dir();
        private_dir(&dir)?;
        let spin = Duration::from_micros(cfg.spin_us);
        let peers = Arc::new(Mutex::new(HashMap::new()));
        close_idle_channels(Arc::downgrade(&peers), Duration::from_millis(cfg.idle_ms));
        Ok(ShmTransport {
            tcp: TcpTransport::new(tcp, polling, creds.clone()),
            creds,
            spin,
            polling,
            dir,
            netns: netns(),
            peers,
            max_channels: cfg.max_channels_per_peer,
        })
    }

    /// The rendezvous socket of the component at `addr` in this namespace.
    pub fn socket_path(&self, addr: &str) -> PathBuf {
        self.dir.join(format!("{}-{}.sock", self.netns, addr.replace('/', "_")))
    }

    fn pages_path(&self, addr: &str) -> PathBuf {
        self.dir
            .join(format!("{}-{}.pages.sock", self.netns, addr.replace('/', "_")))
    }

    /// Removes the sockets of this namespace's components that are gone (killed components
    /// leave theirs behind), so that the directory does not grow with every cluster.
    pub fn sweep(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mine = format!("{}-", self.netns);
        for e in entries.flatten() {
            let p = e.path();
            let ours = e
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&mine) && n.ends_with(".sock"));
            if ours && UnixStream::connect(&p).is_err_and(|e| e.kind() == io::ErrorKind::ConnectionRefused) {
                let _ = std::fs::remove_file(&p);
            }
        }
    }

    /// A free channel to `addr`, or `None` when `addr` is not on this host. Beyond the peer's
    /// credits it waits up to `credit_wait` for one of this component's channels to it to
    /// come back.
    fn channel(&self, addr: &str, timeout: Duration, credit_wait: Duration) -> Result<Option<Channel>, RpcError> {
        let deadline = Instant::now() + credit_wait;
        let want = cpu::followed_at();
        let mut waited = false;
        loop {
            let (credits, gen) = {
                let mut peers = self.peers.lock().unwrap();
                match peers.get_mut(addr) {
                    Some(Peer::Local(pool)) => {
                        // Read before the pool is looked at: a channel given back after this
                        // ends the wait below.
                        let gen = pool.credits.gen();
                        // A channel whose server died while it sat in the pool is dropped here,
                        // before a request goes into it: then the call reports the peer
                        // unreachable (safe to retry elsewhere) rather than a request lost on
                        // the way.
                        while let Some(i) = pick(&pool.free, want) {
                            let c = pool.free.remove(i);
                            if c.server_alive() {
                                return Ok(Some(c));
                            }
                        }
                        (pool.credits.clone(), gen)
                    }
                    Some(Peer::Remote(since)) if since.elapsed() < RECHECK => return Ok(None),
                    _ => {
                        if !self.socket_path(addr).exists() {
                            peers.insert(addr.to_string(), Peer::Remote(Instant::now()));
                            return Ok(None);
                        }
                        let credits = Credits::new();
                        peers.insert(
                            addr.to_string(),
                            Peer::Local(Pool {
                                free: Vec::new(),
                                credits: credits.clone(),
                            }),
                        );
                        (credits, 0)
                    }
                }
            };
            if let Some(credit) = credits.take() {
                match self.open(addr, timeout, credit)? {
                    Opened::Channel(c) => return Ok(Some(*c)),
                    Opened::Remote => return Ok(None),
                    // The server counts as many of this component's channels as it grants:
                    // wait for one of them (or for one just closed to be seen closed there).
                    Opened::Refused => {
                        crate::series::SHM_CHANNELS_REFUSED.increment(1);
                        std::thread::sleep(Duration::from_millis(1));
                        if Instant::now() >= deadline {
                            return Err(RpcError::Timeout {
                                addr: addr.to_string(),
                                msg: "a shared-memory credit",
                                after: credit_wait,
                            });
                        }
                        continue;
                    }
                }
            }
            // No credit left: a followed caller takes a channel served elsewhere rather than wait.
            if let Some(Peer::Local(pool)) = self.peers.lock().unwrap().get_mut(addr) {
                while let Some(c) = pool.free.pop() {
                    if c.server_alive() {
                        return Ok(Some(c));
                    }
                }
            }
            // A caller that would not wait (a batch going one by one instead) did not.
            if !waited && !credit_wait.is_zero() {
                waited = true;
                crate::series::CREDIT_WAITS.increment(1);
            }
            if !credits.wait(gen, deadline) {
                return Err(RpcError::Timeout {
                    addr: addr.to_string(),
                    msg: "a shared-memory credit",
                    after: credit_wait,
                });
            }
        }
    }

    /// Opens a new channel to `addr` on `credit`.
    fn open(&self, addr: &str, timeout: Duration, credit: Credit) -> Result<Opened, RpcError> {
        match Channel::open(&self.socket_path(addr), addr, timeout, Poller::new(self.spin, self.polling), self.creds.as_deref()) {
            Ok(mut c) => {
                credit.0.grant(c.map.header().credits.load(Acquire));
                c.credit = Some(credit);
                Ok(Opened::Channel(Box::new(c)))
            }
            Err(e) if e.kind() == io::ErrorKind::ResourceBusy => {
                let credits = credit.0.clone();
                drop(credit);
                credits.refused();
                Ok(Opened::Refused)
            }
            // A socket left by a component that is gone (whatever holds its port now, if
            // anything, is reached over TCP).
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound) => {
                self.peers.lock().unwrap().insert(addr.to_string(), Peer::Remote(Instant::now()));
                Ok(Opened::Remote)
            }
            // Nothing was sent: the caller may try again, as with a component that is late.
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                Err(RpcError::Unreachable { addr: addr.to_string(), why: format!("it did not answer a new shared-memory channel's handshake within {timeout:?} (paused or overloaded)") })
            }
            Err(e) => Err(RpcError::Unreachable { addr: addr.to_string(), why: format!("shared-memory channel: {e}") }),
        }
    }

    fn give_back(&self, addr: &str, mut c: Channel) {
        if let Some(Peer::Local(pool)) = self.peers.lock().unwrap().get_mut(addr) {
            c.idle_since = Instant::now();
            pool.free.push(c);
            pool.credits.returned();
        }
    }

    fn call_via(&self, addr: &str, msg: &Msg, timeout: Duration, direct: bool) -> Result<Msg, RpcError> {
        let Some(c) = self.channel(addr, timeout, timeout)? else {
            return if direct {
                self.tcp.call_direct(addr, msg, timeout)
            } else {
                self.tcp.call(addr, msg, timeout)
            };
        };
        if let Some(p) = c.peer.filter(|p| !may_receive(p.role, msg)) {
            self.give_back(addr, c);
            return Err(wrong_receiver(addr, p.role, msg));
        }
        // A channel that failed is dropped: a late reply must not answer the next call.
        let (c, r) = c.call(msg, timeout)?;
        self.give_back(addr, c);
        Ok(r)
    }
}

impl Transport for ShmTransport {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn pages_socket(&self, addr: &str) -> Option<PathBuf> {
        Some(self.pages_path(addr))
    }

    fn call(&self, addr: &str, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError> {
        self.call_via(addr, msg, timeout, false)
    }

    fn call_direct(&self, addr: &str, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError> {
        self.call_via(addr, msg, timeout, true)
    }

    /// Every request is put into its channel and rung before the first reply is awaited, so
    /// that the servers work at once. Peers on other hosts (TCP), a caller whose server
    /// follows it to its CPU, and a request a peer does not handle go one after another.
    fn call_all_direct(&self, calls: &[(&str, &Msg)], timeout: Duration) -> Vec<Result<Msg, RpcError>> {
        let one_by_one = || calls.iter().map(|(a, m)| self.call_via(a, m, timeout, true)).collect();
        if calls.len() < 2 || cpu::followed_at().is_some() {
            return one_by_one();
        }
        let mut chans: Vec<Channel> = Vec::with_capacity(calls.len());
        for (addr, msg) in calls {
            // Without waiting: a caller holding one channel to a peer while it waits for
            // another would wait on callers doing the same.
            match self.channel(addr, timeout, Duration::ZERO) {
                Ok(Some(c)) if c.peer.is_none_or(|p| may_receive(p.role, msg)) => chans.push(c),
                other => {
                    if let Ok(Some(c)) = other {
                        self.give_back(addr, c);
                    }
                    for (c, (a, _)) in chans.into_iter().zip(calls) {
                        self.give_back(a, c);
                    }
                    return one_by_one();
                }
            }
        }
        let sent: Vec<Result<Channel, RpcError>> = chans
            .into_iter()
            .zip(calls)
            .map(|(mut c, (_, msg))| c.send(msg, None).map(|()| c))
            .collect();
        sent.into_iter()
            .zip(calls)
            .map(|(c, (addr, msg))| {
                // A channel that failed is dropped: a late reply must not answer the next call.
                let (c, r) = c?.finish(msg.name(), None, timeout)?;
                self.give_back(addr, c);
                Ok(r)
            })
            .collect()
    }

    fn listen(&self, addr: &str) -> io::Result<Box<dyn Endpoint>> {
        let tcp = self.tcp.listen_stream(addr)?;
        self.sweep();
        let path = self.socket_path(&tcp.addr());
        // The TCP port is ours, and so the name.
        let unix = bind_private(&path)?;
        Ok(Box::new(ShmListen {
            tcp,
            unix,
            path,
            spin: self.spin,
            polling: self.polling,
            creds: self.creds.clone(),
            max_channels: self.max_channels,
        }))
    }
}

/// A listening socket at `path` that only this user may reach. It is bound and listening
/// under a name the sweep ignores, then renamed into place: a neighbour's sweep never sees it
/// between bind and listen (when a connect would be refused, as by a dead component's). The
/// caller owns the name (the TCP port in it is its own), so a socket left there belongs to a
/// component that is gone, and the rename replaces it.
pub fn bind_private(path: &Path) -> io::Result<UnixListener> {
    let tmp = path.with_file_name(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("sock"),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let unix = UnixListener::bind(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    std::fs::rename(&tmp, path)?;
    Ok(unix)
}

/// Closes, as long as the transport exists, the free channels unused for `idle`: each one
/// closed ends its server's thread and unmaps its memory on both sides.
fn close_idle_channels(peers: std::sync::Weak<Mutex<HashMap<String, Peer>>>, idle: Duration) {
    let spawned = std::thread::Builder::new().name("shm-idle".into()).spawn(move || loop {
        std::thread::sleep(idle.max(Duration::from_millis(10)) / 2);
        let Some(peers) = peers.upgrade() else { return };
        let mut idle_ones = Vec::new();
        for p in peers.lock().unwrap().values_mut() {
            if let Peer::Local(pool) = p {
                let (old, kept): (Vec<Channel>, Vec<Channel>) = std::mem::take(&mut pool.free)
                    .into_iter()
                    .partition(|c| c.idle_since.elapsed() >= idle);
                pool.free = kept;
                idle_ones.extend(old);
            }
        }
        if !idle_ones.is_empty() {
            crate::series::SHM_IDLE_CLOSED.increment(idle_ones.len() as u64);
        }
        // Closed outside the lock: unmapping takes a while.
        drop(idle_ones);
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the thread that closes idle shared-memory channels; they stay open");
    }
}
