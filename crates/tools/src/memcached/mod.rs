//! `splitos memcached`: a memcached-protocol server on the Ebb runtime (EbbRT section 5.2).
//!
//! The item table is one Ebb ([`Cache`]) whose representative on each core holds the shared
//! table and that core's own counters, so that counting a command writes only the core's cache
//! lines. Every core runs an event loop with its own listening socket on the one port
//! (`SO_REUSEPORT`: the kernel spreads connections over the cores) and serves its connections
//! to completion, without locks but the table shard's. A stored value is a reference-counted
//! slice: a GET's reply is a chain of its header, the value and the trailer, written with one
//! `writev`, the value never copied. Text and binary protocols ([`text`], [`binary`]), told
//! apart by a connection's first byte, as memcached does. docs/ebb.md.
pub mod binary;
pub mod store;
pub mod text;

use std::cell::RefCell;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Token};
use splitos_ebb::buf::Chain;
use splitos_ebb::ebb::Core;
use splitos_ebb::event::{self, LoopConfig, Waiting};
use splitos_ebb::{Ebb, Runtime};

use splitos_core::config::Size;
use store::Table;

/// The version `version` and `stats` report.
pub const VERSION: &str = concat!("splitos-", env!("CARGO_PKG_VERSION"));

/// Shards of the item table per core: enough that cores rarely meet on one lock.
const SHARDS_PER_CORE: usize = 16;
/// A connection stops reading while this much of its replies wait to be sent (a client that
/// sends without reading must not grow the server without bound).
pub const OUT_HIGH_WATER: usize = 4 << 20;
/// A command line longer than this without its end is an error, as in memcached.
pub const LINE_MAX: usize = 2048;
/// The longest `get` or `gets` line (memcached takes them longer than other commands): 250
/// keys of the longest kind.
pub const LINE_MAX_GET: usize = 64 << 10;

#[derive(clap::Args, Clone, Debug)]
pub struct MemcachedArgs {
    /// Where to listen, HOST:PORT (port 0 picks one, printed at start).
    #[arg(long, default_value = "127.0.0.1:11211")]
    pub listen: String,
    /// Memory for items (keys, values and a per-item overhead of 64 bytes); the least recently
    /// used items are evicted beyond it. Each of the table's shards gets an equal share, and
    /// an item larger than a share is refused.
    #[arg(long, default_value = "64M")]
    pub memory: Size,
    /// Cores: event loops, each a thread serving its own connections.
    #[arg(long, default_value_t = 1)]
    pub cores: usize,
    /// Largest item (key and value), as memcached's -I.
    #[arg(long, default_value = "1M")]
    pub max_item_size: Size,
    /// How the event loops wait: adaptive (poll above --poll-above events per second, sleep in
    /// epoll below --sleep-below), poll (always) or sleep (always).
    #[arg(long, default_value_t = Waiting::Adaptive)]
    pub waiting: Waiting,
    /// Events per second per core above which an adaptive loop polls.
    #[arg(long, default_value_t = LoopConfig::default().poll_above)]
    pub poll_above: u64,
    /// Events per second per core below which a polling adaptive loop sleeps again.
    #[arg(long, default_value_t = LoopConfig::default().sleep_below)]
    pub sleep_below: u64,
}

/// One core's command counters, written by that core alone.
#[derive(Default)]
pub struct CoreStats {
    pub cmd_get: AtomicU64,
    pub get_hits: AtomicU64,
    pub get_misses: AtomicU64,
    pub cmd_set: AtomicU64,
    pub cmd_touch: AtomicU64,
    pub touch_hits: AtomicU64,
    pub touch_misses: AtomicU64,
    pub cmd_flush: AtomicU64,
    pub delete_hits: AtomicU64,
    pub delete_misses: AtomicU64,
    pub incr_hits: AtomicU64,
    pub incr_misses: AtomicU64,
    pub decr_hits: AtomicU64,
    pub decr_misses: AtomicU64,
    pub cas_hits: AtomicU64,
    pub cas_misses: AtomicU64,
    pub cas_badval: AtomicU64,
    pub curr_connections: AtomicU64,
    pub total_connections: AtomicU64,
}

/// What every core shares: the table, every core's counters, the loops' counters.
pub struct Root {
    pub table: Table,
    cores: Vec<Arc<CoreStats>>,
    started: Instant,
    loops: std::sync::OnceLock<Vec<Arc<event::Remote>>>,
}

/// The cache Ebb's representative on one core.
pub struct Cache {
    pub root: Arc<Root>,
    pub stats: Arc<CoreStats>,
}

impl Cache {
    pub fn bump(c: &AtomicU64) {
        // Only this core writes its counters: a load and a store, no locked instruction.
        c.store(c.load(Relaxed) + 1, Relaxed);
    }

    /// `stats`' lines, as name and value.
    pub fn stats(&self) -> Vec<(&'static str, String)> {
        let r = &self.root;
        let sum = |f: fn(&CoreStats) -> &AtomicU64| r.cores.iter().map(|c| f(c).load(Relaxed)).sum::<u64>().to_string();
        let (items, bytes) = r.table.usage();
        let loops: Vec<_> = r
            .loops
            .get()
            .map(|l| l.iter().map(|r| r.stats().counts()).collect())
            .unwrap_or_default();
        let lsum = |f: fn(&event::LoopCounts) -> u64| loops.iter().map(f).sum::<u64>().to_string();
        vec![
            ("pid", std::process::id().to_string()),
            ("uptime", r.started.elapsed().as_secs().to_string()),
            ("time", store::now().to_string()),
            ("version", VERSION.to_string()),
            ("pointer_size", "64".to_string()),
            ("curr_connections", sum(|c| &c.curr_connections)),
            ("total_connections", sum(|c| &c.total_connections)),
            ("cmd_get", sum(|c| &c.cmd_get)),
            ("cmd_set", sum(|c| &c.cmd_set)),
            ("cmd_flush", sum(|c| &c.cmd_flush)),
            ("cmd_touch", sum(|c| &c.cmd_touch)),
            ("get_hits", sum(|c| &c.get_hits)),
            ("get_misses", sum(|c| &c.get_misses)),
            ("delete_misses", sum(|c| &c.delete_misses)),
            ("delete_hits", sum(|c| &c.delete_hits)),
            ("incr_misses", sum(|c| &c.incr_misses)),
            ("incr_hits", sum(|c| &c.incr_hits)),
            ("decr_misses", sum(|c| &c.decr_misses)),
            ("decr_hits", sum(|c| &c.decr_hits)),
            ("cas_misses", sum(|c| &c.cas_misses)),
            ("cas_hits", sum(|c| &c.cas_hits)),
            ("cas_badval", sum(|c| &c.cas_badval)),
            ("touch_hits", sum(|c| &c.touch_hits)),
            ("touch_misses", sum(|c| &c.touch_misses)),
            ("threads", r.cores.len().saturating_sub(1).to_string()),
            ("limit_maxbytes", r.table.limit().to_string()),
            ("bytes", bytes.to_string()),
            ("curr_items", items.to_string()),
            ("total_items", r.table.counts.total_items.load(Relaxed).to_string()),
            (
                "expired_unfetched",
                r.table.counts.expired_unfetched.load(Relaxed).to_string(),
            ),
            ("evictions", r.table.counts.evictions.load(Relaxed).to_string()),
            ("ebb_loop_events", lsum(|c| c.events)),
            ("ebb_loop_sleeps", lsum(|c| c.sleeps)),
            ("ebb_loop_switches_to_poll", lsum(|c| c.to_poll)),
            ("ebb_loop_switches_to_sleep", lsum(|c| c.to_sleep)),
            (
                "ebb_loops_polling",
                loops.iter().filter(|c| c.polling).count().to_string(),
            ),
        ]
    }
}

/// A reply under construction: small pieces gather in one buffer, values join the chain as
/// they are.
#[derive(Default)]
pub struct Out {
    pub chain: Chain,
    scratch: BytesMut,
}

impl Out {
    pub fn put(&mut self, b: &[u8]) {
        self.scratch.extend_from_slice(b);
    }

    /// Appends a stored value: a short one is copied with its neighbours, a long one is linked.
    pub fn put_value(&mut self, v: &Bytes) {
        if v.len() < 256 {
            self.put(v);
        } else {
            self.seal();
            self.chain.push(v.clone());
        }
    }

    /// Moves what was gathered onto the chain.
    pub fn seal(&mut self) {
        if !self.scratch.is_empty() {
            self.chain.push(self.scratch.split().freeze());
        }
    }

    pub fn len(&self) -> usize {
        self.chain.len() + self.scratch.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a protocol handler asks of its connection after a batch of commands.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Read more (the input holds no whole command).
    Read,
    /// Stop serving until the replies queued are sent ([`OUT_HIGH_WATER`]).
    Full,
    /// Send what is queued, then close.
    Close,
}

/// Takes a value out of the read buffer, by copy: a value taken as a slice would keep its
/// whole read buffer alive, which the memory limit does not see.
pub fn take_value(input: &mut BytesMut, n: usize) -> Bytes {
    let v = Bytes::copy_from_slice(&input[..n]);
    input.advance(n);
    v
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Proto {
    Text,
    Binary,
}

struct Conn {
    stream: TcpStream,
    token: Token,
    input: BytesMut,
    out: Out,
    proto: Option<Proto>,
    /// Bytes of input to drop (the data of a value refused as too large).
    swallow: usize,
    /// The client sent its last bytes: what it sent is served, then the connection closes.
    eof: bool,
    /// A command asked to close (quit, a protocol error): the answers queued go, then it closes.
    closing: bool,
    writing: bool,
    cache: Rc<Cache>,
}

/// What a connection's driver wants next.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Wait for the socket's next event.
    Wait,
    /// It has more to do without an event: come back after the loop's other events.
    Again,
    Close,
}

/// Rounds of read, serve and write one turn of a connection may take before it lets the
/// loop's other events run.
const ROUNDS: usize = 8;
/// Bytes read per round: a client that pipelines faster than it reads its answers is held
/// back by TCP's flow control, not buffered here.
const READ_PER_ROUND: usize = 256 << 10;

impl Conn {
    /// The most input kept unserved: a whole command, the largest value included, must fit.
    fn input_high_water(&self) -> usize {
        self.cache.root.table.item_max() + LINE_MAX_GET + binary::HEADER + 512
    }

    /// Reads, serves and writes until the socket would block, the client is done, or the
    /// turn's rounds are spent.
    fn turn(&mut self) -> Step {
        for _ in 0..ROUNDS {
            let (mut progress, mut read_capped) = (false, false);
            if !self.eof && !self.closing {
                if self.input.len() < self.input_high_water() {
                    match self.read() {
                        Ok((n, eof, capped)) => {
                            progress |= n > 0;
                            self.eof |= eof;
                            read_capped = capped;
                        }
                        Err(_) => return Step::Close,
                    }
                } else {
                    // Bytes may wait in the socket for which no edge will come again.
                    read_capped = true;
                }
            }
            // Answers queued up to the mark from before: serving waits for them to drain.
            let mut full = !self.closing && self.out.len() >= OUT_HIGH_WATER;
            if !self.closing && !full {
                let before = self.input.len();
                match self.serve() {
                    Next::Read => {}
                    Next::Full => full = true,
                    Next::Close => self.closing = true,
                }
                progress |= self.input.len() != before;
            }
            self.out.seal();
            while !self.out.chain.is_empty() {
                match self.out.chain.write_to(&mut self.stream) {
                    Ok(n) => progress |= n > 0,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return Step::Close,
                }
            }
            if self.out.is_empty() && (self.closing || (self.eof && !full)) {
                return Step::Close;
            }
            // Input left unserved at the high-water mark, or unread bytes past this round's
            // share: no event will come for them (epoll is edge-triggered), so go on while
            // the answers drain.
            if !((full || read_capped) && self.out.len() < OUT_HIGH_WATER && progress) {
                return self.watch();
            }
        }
        Step::Again
    }

    /// Watches the socket for what the connection waits for: answers to send, or requests.
    fn watch(&mut self) -> Step {
        let want_write = !self.out.is_empty();
        if want_write != self.writing {
            self.writing = want_write;
            let interest = if want_write {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            if event::reregister(&mut self.stream, self.token, interest).is_err() {
                return Step::Close;
            }
        }
        Step::Wait
    }

    /// Reads up to a round's share: the bytes read, whether the client is done, whether the
    /// share ran out first.
    fn read(&mut self) -> io::Result<(usize, bool, bool)> {
        let mut buf = [0u8; 16 << 10];
        let mut n = 0;
        while n < READ_PER_ROUND {
            match self.stream.read(&mut buf) {
                Ok(0) => return Ok((n, true, false)),
                Ok(k) => {
                    self.input.extend_from_slice(&buf[..k]);
                    n += k;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok((n, false, false)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok((n, false, true))
    }

    fn serve(&mut self) -> Next {
        loop {
            if self.swallow > 0 {
                let n = self.swallow.min(self.input.len());
                let _ = self.input.split_to(n);
                self.swallow -= n;
                if self.swallow > 0 {
                    return Next::Read;
                }
            }
            if self.input.is_empty() {
                return Next::Read;
            }
            let proto = *self.proto.get_or_insert(if self.input[0] == binary::REQ_MAGIC {
                Proto::Binary
            } else {
                Proto::Text
            });
            let next = match proto {
                Proto::Text => text::serve(&self.cache, &mut self.input, &mut self.out, &mut self.swallow),
                Proto::Binary => binary::serve(&self.cache, &mut self.input, &mut self.out, &mut self.swallow),
            };
            // A refused value's bytes may be in already, and the commands after them.
            if !(next == Next::Read && self.swallow > 0) {
                return next;
            }
        }
    }
}

type Shared = Rc<RefCell<Option<Conn>>>;

/// Runs a turn of the connection; closes it when it is over, or queues its next turn.
fn drive(conn: &Shared) {
    let mut g = conn.borrow_mut();
    let Some(c) = g.as_mut() else { return };
    match c.turn() {
        Step::Wait => {}
        Step::Again => {
            let conn = conn.clone();
            event::spawn_local(move || drive(&conn));
        }
        Step::Close => {
            let mut c = g.take().expect("present");
            event::deregister(&mut c.stream, c.token);
            let s = &c.cache.stats.curr_connections;
            s.store(s.load(Relaxed) - 1, Relaxed);
        }
    }
}

/// A core's listening socket, and whether a retry of its accepts is due.
struct Listening {
    listener: RefCell<Option<TcpListener>>,
    retrying: std::cell::Cell<bool>,
}

/// Accepts this core's connections and serves each on this core. Out of descriptors, it
/// tries again shortly (once, however many events come meanwhile): with edge-triggered epoll,
/// no event comes for connections already waiting.
fn accept_all(listening: &Rc<Listening>, cache: &Ebb<Cache>) {
    let g = listening.listener.borrow();
    let Some(l) = g.as_ref() else { return };
    loop {
        match l.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                serve_conn(stream, cache.rep());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                if !listening.retrying.replace(true) {
                    tracing::warn!(error = %e, "memcached: accept failed; trying again in 10 ms");
                    let (listening, cache) = (listening.clone(), cache.clone());
                    event::after(Duration::from_millis(10), move || {
                        listening.retrying.set(false);
                        accept_all(&listening, &cache)
                    });
                }
                return;
            }
        }
    }
}

fn serve_conn(mut stream: TcpStream, cache: Rc<Cache>) {
    Cache::bump(&cache.stats.total_connections);
    Cache::bump(&cache.stats.curr_connections);
    let conn: Shared = Rc::new(RefCell::new(None));
    let c2 = conn.clone();
    match event::register(&mut stream, Interest::READABLE, move |_| drive(&c2)) {
        Ok(token) => {
            *conn.borrow_mut() = Some(Conn {
                stream,
                token,
                input: BytesMut::new(),
                out: Out::default(),
                proto: None,
                swallow: 0,
                eof: false,
                closing: false,
                writing: false,
                cache,
            });
        }
        Err(e) => {
            tracing::warn!(error = %e, "memcached: cannot watch a connection; closed");
            let s = &cache.stats.curr_connections;
            s.store(s.load(Relaxed) - 1, Relaxed);
        }
    }
}

/// A running server: its address, its runtime and its table.
pub struct Server {
    pub addr: SocketAddr,
    pub cache: Ebb<Cache>,
    /// Held for its drop, which stops the cores' loops.
    _runtime: Runtime,
}

impl Server {
    pub fn start(args: &MemcachedArgs) -> anyhow::Result<Server> {
        anyhow::ensure!(args.cores >= 1, "--cores must be at least 1");
        let cfg = LoopConfig {
            waiting: args.waiting,
            poll_above: args.poll_above,
            sleep_below: args.sleep_below,
            ..LoopConfig::default()
        };
        cfg.validate()
            .map_err(|e| anyhow::anyhow!("--sleep-below/--poll-above: {e}"))?;
        let shards = SHARDS_PER_CORE * args.cores;
        anyhow::ensure!(
            args.memory.0 as usize >= shards * 4096,
            "--memory {} is too small: at least {} (4K for each of the table's {shards} shards)",
            args.memory.0,
            shards * 4096
        );
        let table = Table::new(args.memory.0 as usize, shards, args.max_item_size.0 as usize);
        // One counter set per core, and one for callers outside the loops.
        let root = Arc::new(Root {
            table,
            cores: (0..=args.cores).map(|_| Arc::default()).collect(),
            started: Instant::now(),
            loops: Default::default(),
        });
        let r = root.clone();
        let cache = Ebb::new("memcached-cache", move |core| {
            let i = match core {
                Core::Loop(i) => i,
                Core::Hosted => r.cores.len() - 1,
            };
            Cache {
                root: r.clone(),
                stats: r.cores[i].clone(),
            }
        });
        let addr: SocketAddr = args
            .listen
            .parse()
            .map_err(|e| anyhow::anyhow!("--listen {:?}: {e} (want HOST:PORT)", args.listen))?;
        // Every core listens on the one port; the first bind settles a port 0.
        let first = reuseport_listener(addr)?;
        let addr = first.local_addr()?;
        let mut listeners = vec![first];
        for _ in 1..args.cores {
            listeners.push(reuseport_listener(addr)?);
        }
        let listeners = std::sync::Mutex::new(listeners.into_iter().map(Some).collect::<Vec<_>>());
        let c = cache.clone();
        let runtime = Runtime::start("memcached", args.cores, cfg, move |core| {
            let std_listener = listeners.lock().unwrap()[core].take().expect("one listener per core");
            let mut l = TcpListener::from_std(std_listener);
            let listening = Rc::new(Listening {
                listener: RefCell::new(None),
                retrying: Default::default(),
            });
            let l2 = listening.clone();
            let c = c.clone();
            match event::register(&mut l, Interest::READABLE, move |_| accept_all(&l2, &c)) {
                Ok(_) => *listening.listener.borrow_mut() = Some(l),
                Err(e) => tracing::error!(core, error = %e, "memcached: a core cannot watch its listener"),
            }
        })?;
        let _ = root.loops.set((0..args.cores).map(|i| runtime.remote(i)).collect());
        Ok(Server {
            addr,
            cache,
            _runtime: runtime,
        })
    }
}

fn reuseport_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let s = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    s.listen(1024)?;
    Ok(s.into())
}

/// `splitos memcached`: serves until killed.
pub fn run(args: MemcachedArgs) -> anyhow::Result<()> {
    let server = Server::start(&args)?;
    tracing::info!(addr = %server.addr, cores = args.cores, memory = args.memory.0, "memcached on the Ebb runtime listening");
    splitos_core::outln!(
        "splitos memcached listening on {} ({} cores, {} bytes for items)",
        server.addr,
        args.cores,
        args.memory.0
    );
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
