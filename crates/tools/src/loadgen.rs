//! `splitos loadgen`: a load generator for memcached-protocol servers, after mutilate and the
//! load generator of ThymesisFlow's evaluation (section VI-E): Facebook's ETC key and value
//! sizes (Atikoglu et al., SIGMETRICS 2012), GET:SET 30:1, Zipf key popularity, several client
//! threads each with one connection to every server and keys sharded among the servers on the
//! client side, pipelining, and open-loop (Poisson arrivals at a fixed rate) or closed-loop load.
//!
//! In open loop a request's latency counts from the moment it was due, not from when it was
//! written: a server that falls behind shows its queue instead of slowing the generator down
//! (coordinated omission). Every value read back is checked against what its key was set to, so
//! a server that returns a wrong byte fails the run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use crossbeam_channel::{Receiver, Sender};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp, Zipf};

/// memcached's longest key.
const MAX_KEY: usize = 250;
/// How long a connection waits for a reply before the run fails: a server that stops answering
/// must end the benchmark, not hang it.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// Sets written before their replies are read while preloading.
const PRELOAD_BATCH: usize = 64;

#[derive(clap::Args, Clone, Debug)]
pub struct LoadgenArgs {
    /// A memcached server, HOST:PORT; repeat the option for several (each key goes to one of
    /// them, chosen by a hash of the key on the client side, as libmemcached does).
    #[arg(long = "server", required = true)]
    pub servers: Vec<String>,
    /// Client threads; each has one connection to every server.
    #[arg(long, default_value_t = 8)]
    pub clients: usize,
    /// Closed loop: requests a client may have outstanding at once (pipelining across its
    /// connections). The open loop sends whatever is outstanding.
    #[arg(long, default_value_t = 1)]
    pub depth: usize,
    /// Requests per second over all clients, sent at exponentially distributed intervals
    /// whatever the replies (open loop); 0: each client sends its next request as soon as it
    /// has fewer than --depth outstanding (closed loop).
    #[arg(long, default_value_t = 0.0)]
    pub rate: f64,
    /// Seconds of measured load.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Seconds of load before the measured part, not recorded.
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u64,
    /// Exponent of the Zipf distribution of key popularity (0: every key equally likely).
    #[arg(long, default_value_t = 1.0)]
    pub zipf: f64,
    /// GETs to SETs, as "G:S".
    #[arg(long, default_value = "30:1")]
    pub mix: Mix,
    /// Key lengths: "etc" (ETC's generalized extreme value distribution, at most 250 bytes) or
    /// a number of bytes.
    #[arg(long, default_value = "etc")]
    pub key_size: Sizes,
    /// Value lengths: "etc" (ETC's generalized Pareto distribution, at most --max-value) or a
    /// number of bytes.
    #[arg(long, default_value = "etc")]
    pub value_size: Sizes,
    /// Longest value, bytes: ETC's tail is long, and memcached refuses items over 1 MiB.
    #[arg(long, default_value_t = 65536)]
    pub max_value: usize,
    /// Do not set every key once before the load.
    #[arg(long)]
    pub no_preload: bool,
    /// Seed of every random choice (the same seed gives the same keys, sizes and requests).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print one JSON object instead of a summary.
    #[arg(long)]
    pub json: bool,
}

/// A GET:SET ratio.
#[derive(Clone, Copy, Debug)]
pub struct Mix {
    gets: u32,
    sets: u32,
}

/// Why a command line's mix or size is not one the generator takes.
#[derive(Debug, thiserror::Error)]
pub enum ArgError {
    #[error("{0:?} is not a GET:SET ratio such as 30:1")]
    NotAMix(String),
    #[error("{0:?}: a ratio needs GETs or SETs")]
    EmptyMix(String),
    #[error("{0:?} is neither \"etc\" nor a positive number of bytes")]
    NotASize(String),
}

impl FromStr for Mix {
    type Err = ArgError;
    fn from_str(s: &str) -> Result<Self, ArgError> {
        let bad = || ArgError::NotAMix(s.to_string());
        let (g, st) = s.split_once(':').ok_or_else(bad)?;
        let (gets, sets) = (
            g.trim().parse().map_err(|_| bad())?,
            st.trim().parse().map_err(|_| bad())?,
        );
        match (gets, sets) {
            (0, 0) => Err(ArgError::EmptyMix(s.to_string())),
            _ => Ok(Mix { gets, sets }),
        }
    }
}

/// How long keys or values are.
#[derive(Clone, Copy, Debug)]
pub enum Sizes {
    /// Facebook's ETC pool.
    Etc,
    Fixed(usize),
}

impl FromStr for Sizes {
    type Err = ArgError;
    fn from_str(s: &str) -> Result<Self, ArgError> {
        match s {
            "etc" => Ok(Sizes::Etc),
            _ => match s.parse::<usize>() {
                Ok(n) if n > 0 => Ok(Sizes::Fixed(n)),
                _ => Err(ArgError::NotASize(s.to_string())),
            },
        }
    }
}

/// splitmix64: a key's length and shard follow from its index alone, so that every thread
/// agrees on them without sharing a table.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform number in (0, 1) from a hash.
fn unit(h: u64) -> f64 {
    ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// ETC's key sizes: a generalized extreme value distribution (mu 30.7984, sigma 8.20449,
/// k 0.078688), by inversion.
fn etc_key(u: f64) -> f64 {
    let (mu, sigma, k) = (30.7984, 8.20449, 0.078688);
    mu + sigma / k * ((-u.ln()).powf(-k) - 1.0)
}

/// ETC's value sizes: a generalized Pareto distribution (theta 0, sigma 214.476, k 0.348238),
/// by inversion.
fn etc_value(u: f64) -> f64 {
    let (sigma, k) = (214.476, 0.348238);
    sigma / k * (u.powf(-k) - 1.0)
}

/// The keys, their sizes and their servers.
#[derive(Clone, Copy)]
struct Keyspace {
    seed: u64,
    key_size: Sizes,
    value_size: Sizes,
    max_value: usize,
    servers: usize,
}

impl Keyspace {
    fn key(&self, idx: u64) -> String {
        let mut k = format!("k{idx}:");
        let want = match self.key_size {
            Sizes::Etc => etc_key(unit(mix64(self.seed ^ idx.rotate_left(17)))).round().max(1.0) as usize,
            Sizes::Fixed(n) => n,
        };
        let want = want.clamp(k.len(), MAX_KEY);
        k.extend(std::iter::repeat_n('x', want - k.len()));
        k
    }

    fn value_len(&self, rng: &mut SmallRng) -> usize {
        match self.value_size {
            Sizes::Etc => (etc_value(rng.random_range(f64::EPSILON..1.0)).round() as usize).clamp(1, self.max_value),
            Sizes::Fixed(n) => n.min(self.max_value),
        }
    }

    fn server(&self, idx: u64) -> usize {
        (mix64(idx ^ 0x5eed) % self.servers as u64) as usize
    }
}

/// The 32 bytes that every value of key `idx` with `len` bytes repeats: whichever SET a GET
/// returns, its bytes are known, and another key's value (or another length's) differs.
fn value_pattern(idx: u64, len: usize) -> [u8; 32] {
    let mut p = [0u8; 32];
    let mut h = idx ^ (len as u64).rotate_left(40);
    for (i, b) in p.iter_mut().enumerate() {
        if i % 8 == 0 {
            h = mix64(h);
        }
        *b = b'a' + ((h >> (8 * (i % 8))) as u8) % 26;
    }
    p
}

fn fill_value(out: &mut Vec<u8>, idx: u64, len: usize) {
    out.extend(value_pattern(idx, len).iter().cycle().take(len));
}

fn value_is(data: &[u8], idx: u64) -> bool {
    let p = value_pattern(idx, data.len());
    data.chunks(p.len()).all(|c| c == &p[..c.len()])
}

fn write_set(out: &mut Vec<u8>, key: &str, idx: u64, len: usize) {
    out.extend_from_slice(format!("set {key} 0 0 {len}\r\n").as_bytes());
    fill_value(out, idx, len);
    out.extend_from_slice(b"\r\n");
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Get,
    Set,
}

/// A request written and not yet answered, in the order of its connection.
struct Pending {
    idx: u64,
    op: Op,
    due: Instant,
}

/// What one connection saw.
struct Seen {
    get: Histogram<u64>,
    set: Histogram<u64>,
    /// Replies that arrived within the measured interval (whenever their requests were due).
    answered: u64,
    hits: u64,
    misses: u64,
    set_refused: u64,
    corrupt: u64,
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("bounds")
}

impl Seen {
    fn new() -> Self {
        Seen {
            get: hist(),
            set: hist(),
            answered: 0,
            hits: 0,
            misses: 0,
            set_refused: 0,
            corrupt: 0,
        }
    }

    fn add(&mut self, o: &Seen) {
        self.get.add(&o.get).expect("same bounds");
        self.set.add(&o.set).expect("same bounds");
        self.answered += o.answered;
        self.hits += o.hits;
        self.misses += o.misses;
        self.set_refused += o.set_refused;
        self.corrupt += o.corrupt;
    }
}

fn connect(addr: &str) -> anyhow::Result<TcpStream> {
    let s = TcpStream::connect(addr).with_context(|| format!("connecting to memcached at {addr}"))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(REPLY_TIMEOUT))?;
    // A server that stops reading must fail the run as one that stops answering does.
    s.set_write_timeout(Some(REPLY_TIMEOUT))?;
    Ok(s)
}

fn read_line(r: &mut BufReader<TcpStream>, line: &mut String, addr: &str) -> anyhow::Result<()> {
    line.clear();
    match r.read_line(line) {
        Ok(0) => bail!("{addr} closed the connection"),
        Ok(_) => Ok(()),
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            bail!("{addr} did not answer within {} s", REPLY_TIMEOUT.as_secs())
        }
        Err(e) => Err(e).with_context(|| format!("reading from {addr}")),
    }
}

/// A GET's answer: a miss, or the key the server named and the value's bytes and their end.
enum Got {
    Miss,
    Hit { key: String, data: Vec<u8> },
}

/// Reads the answer to a GET, whole (its bytes are checked after the clock has been read).
fn read_get(r: &mut BufReader<TcpStream>, addr: &str) -> anyhow::Result<Got> {
    let mut line = String::new();
    read_line(r, &mut line, addr)?;
    if line == "END\r\n" {
        return Ok(Got::Miss);
    }
    let (key, len) = match line
        .strip_prefix("VALUE ")
        .map(|rest| rest.split_whitespace().collect::<Vec<_>>())
    {
        Some(f) if f.len() >= 3 => (
            f[0].to_string(),
            f[2].parse::<usize>()
                .with_context(|| format!("{addr}: bad length in {line:?}"))?,
        ),
        _ => bail!("{addr} answered a GET with {line:?}"),
    };
    let mut data = vec![0u8; len + 2];
    r.read_exact(&mut data)
        .with_context(|| format!("reading a {len}-byte value from {addr}"))?;
    read_line(r, &mut line, addr)?;
    if line != "END\r\n" {
        bail!("{addr} ended a GET's value with {line:?}");
    }
    Ok(Got::Hit { key, data })
}

fn read_set(r: &mut BufReader<TcpStream>, seen: &mut Seen, addr: &str) -> anyhow::Result<()> {
    let mut line = String::new();
    read_line(r, &mut line, addr)?;
    match line.as_str() {
        "STORED\r\n" => {}
        // memcached refuses an item it cannot make room for; the load goes on.
        l if l.starts_with("SERVER_ERROR") => seen.set_refused += 1,
        l => bail!("{addr} answered a SET with {l:?}"),
    }
    Ok(())
}

/// Sets every key of `keys` on one server, `PRELOAD_BATCH` at a time, in a random order;
/// returns those stored. In index order the most popular keys (the lowest) would be the first
/// a full server evicts.
fn preload(addr: &str, ks: &Keyspace, mut keys: Vec<u64>, seed: u64) -> anyhow::Result<u64> {
    let mut w = connect(addr)?;
    let mut r = BufReader::new(w.try_clone()?);
    let mut rng = SmallRng::seed_from_u64(seed);
    keys.shuffle(&mut rng);
    let mut seen = Seen::new();
    let mut buf = Vec::new();
    for batch in keys.chunks(PRELOAD_BATCH) {
        buf.clear();
        for &idx in batch {
            write_set(&mut buf, &ks.key(idx), idx, ks.value_len(&mut rng));
        }
        w.write_all(&buf).with_context(|| format!("writing to {addr}"))?;
        for _ in batch {
            read_set(&mut r, &mut seen, addr)?;
        }
    }
    Ok(keys.len() as u64 - seen.set_refused)
}

/// The measured interval, and what a connection's reader shares with its client.
struct Watch {
    measured: Instant,
    end: Instant,
    ks: Keyspace,
    /// Closed loop: a slot to give back for every reply.
    window: Option<Receiver<()>>,
    /// Set by a reader that failed, so that its client stops at once.
    failed: Arc<AtomicBool>,
}

/// Reads one connection's replies in order, gives its client's window a slot back for each,
/// and records the latency of those due in the measured interval. A reader that fails shuts
/// its connection down and tells its client.
fn reader(stream: TcpStream, addr: String, pending: Receiver<Pending>, w: Watch) -> anyhow::Result<Seen> {
    let mut r = BufReader::new(stream);
    let mut seen = Seen::new();
    let read = (|| {
        let mut ignored = Seen::new();
        for p in pending {
            let s = if p.due >= w.measured { &mut seen } else { &mut ignored };
            let got = match p.op {
                Op::Get => Some(read_get(&mut r, &addr)?),
                Op::Set => {
                    read_set(&mut r, s, &addr)?;
                    None
                }
            };
            let done = Instant::now();
            if p.due >= w.measured {
                let h = if p.op == Op::Get { &mut s.get } else { &mut s.set };
                h.saturating_record((done - p.due).as_nanos().max(1) as u64);
            }
            if done >= w.measured && done < w.end {
                seen.answered += 1;
            }
            let s = if p.due >= w.measured { &mut seen } else { &mut ignored };
            match got {
                Some(Got::Miss) => s.misses += 1,
                Some(Got::Hit { key, data }) => {
                    s.hits += 1;
                    let len = data.len() - 2;
                    if key != w.ks.key(p.idx) || !value_is(&data[..len], p.idx) || &data[len..] != b"\r\n" {
                        s.corrupt += 1;
                    }
                }
                None => {}
            }
            if let Some(window) = &w.window {
                let _ = window.recv();
            }
        }
        seen.corrupt += ignored.corrupt;
        Ok(())
    })();
    if read.is_err() {
        w.failed.store(true, Ordering::Release);
        let _ = r.get_ref().shutdown(Shutdown::Both);
    }
    read.map(|()| seen)
}

struct ClientPlan {
    seed: u64,
    rate: f64,
    start: Instant,
    end: Instant,
}

/// One client: picks each request's operation and key and sends it to the key's server: when
/// due (open loop), or when fewer than `depth` are outstanding (closed loop).
fn client(args: &LoadgenArgs, ks: &Keyspace, plan: ClientPlan) -> anyhow::Result<Seen> {
    if plan.rate > 0.0 {
        // The default 50 us timer slack would be counted in every open-loop latency, which
        // runs from the moment a request was due.
        // SAFETY: PR_SET_TIMERSLACK takes a number and changes only this thread's timers.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64) };
    }
    let mut rng = SmallRng::seed_from_u64(plan.seed);
    let zipf = (args.zipf > 0.0)
        .then(|| Zipf::new(args.keys as f64, args.zipf))
        .transpose()
        .context("--zipf")?;
    let gaps = (plan.rate > 0.0)
        .then(|| Exp::new(plan.rate))
        .transpose()
        .context("--rate")?;
    let (window_tx, window_rx) = match gaps {
        Some(_) => (None, None),
        None => {
            let (tx, rx) = crossbeam_channel::bounded::<()>(args.depth);
            (Some(tx), Some(rx))
        }
    };
    let measured = plan.start + Duration::from_secs_f64(args.warmup);
    let failed = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    let mut readers = Vec::new();
    for addr in &args.servers {
        let s = connect(addr)?;
        let (tx, rx): (Sender<Pending>, Receiver<Pending>) = crossbeam_channel::unbounded();
        let w = Watch {
            measured,
            end: plan.end,
            ks: *ks,
            window: window_rx.clone(),
            failed: failed.clone(),
        };
        let (rs, addr2) = (s.try_clone()?, addr.clone());
        readers.push(std::thread::spawn(move || reader(rs, addr2, rx, w)));
        writers.push((s, tx));
    }
    let total = u64::from(args.mix.gets) + u64::from(args.mix.sets);
    let mut due = plan.start;
    let mut buf = Vec::new();
    let sent: anyhow::Result<()> = (|| {
        loop {
            if let Some(g) = &gaps {
                due += Duration::from_secs_f64(g.sample(&mut rng));
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
            }
            if let Some(window) = &window_tx {
                // Its readers time out on a silent server and then raise `failed`.
                while window.send_timeout((), Duration::from_millis(100)).is_err() {
                    if failed.load(Ordering::Acquire) {
                        return Ok(());
                    }
                }
                due = Instant::now();
            }
            if failed.load(Ordering::Acquire) {
                return Ok(());
            }
            if due >= plan.end {
                return Ok(());
            }
            let idx = match &zipf {
                Some(z) => z.sample(&mut rng) as u64 - 1,
                None => rng.random_range(0..args.keys),
            };
            let op = if rng.random_range(0..total) < u64::from(args.mix.gets) {
                Op::Get
            } else {
                Op::Set
            };
            let key = ks.key(idx);
            buf.clear();
            match op {
                Op::Get => buf.extend_from_slice(format!("get {key}\r\n").as_bytes()),
                Op::Set => write_set(&mut buf, &key, idx, ks.value_len(&mut rng)),
            }
            let (s, tx) = &mut writers[ks.server(idx)];
            // Written before its reader learns of it: the reader reads the socket only for a
            // request it knows, so the reply waits there if it comes first.
            s.write_all(&buf).context("writing a request")?;
            if tx.send(Pending { idx, op, due }).is_err() {
                // Its reader ended on an error, which the join below reports.
                return Ok(());
            }
        }
    })();
    drop(writers);
    drop(window_tx);
    let read: Vec<anyhow::Result<Seen>> = readers
        .into_iter()
        .map(|r| r.join().expect("a reader panicked"))
        .collect();
    sent?;
    let mut seen = Seen::new();
    for r in read {
        seen.add(&r?);
    }
    Ok(seen)
}

fn summary(h: &Histogram<u64>) -> serde_json::Value {
    let us = |ns: u64| (ns as f64 / 1000.0 * 10.0).round() / 10.0;
    let cdf: Vec<_> = [
        1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.9,
    ]
    .iter()
    .map(|&p| serde_json::json!([p, us(h.value_at_percentile(p))]))
    .collect();
    serde_json::json!({
        "n": h.len(),
        "mean_us": us(h.mean() as u64),
        "p50_us": us(h.value_at_quantile(0.5)),
        "p90_us": us(h.value_at_quantile(0.9)),
        "p99_us": us(h.value_at_quantile(0.99)),
        "p999_us": us(h.value_at_quantile(0.999)),
        "max_us": us(h.max()),
        "cdf": cdf,
    })
}

fn check(args: &LoadgenArgs) -> anyhow::Result<()> {
    if args.clients == 0 || args.depth == 0 {
        bail!("--clients and --depth must be at least 1");
    }
    if args.keys == 0 {
        bail!("--keys must be at least 1");
    }
    if !(args.duration > 0.0 && args.duration.is_finite() && args.warmup >= 0.0 && args.warmup.is_finite()) {
        bail!("--duration must be above 0 and --warmup at least 0 seconds");
    }
    if !(args.rate >= 0.0 && args.rate.is_finite() && args.zipf >= 0.0 && args.zipf.is_finite()) {
        bail!("--rate and --zipf must be finite and at least 0");
    }
    if args.max_value == 0 {
        bail!("--max-value must be at least 1 byte");
    }
    Ok(())
}

/// Runs `splitos loadgen`.
pub fn run(args: LoadgenArgs) -> anyhow::Result<()> {
    check(&args)?;
    let ks = Keyspace {
        seed: args.seed,
        key_size: args.key_size,
        value_size: args.value_size,
        max_value: args.max_value,
        servers: args.servers.len(),
    };
    let mut stored = None;
    let t = Instant::now();
    if !args.no_preload {
        // A few connections per server share its keys.
        let per = 2;
        let mut shards: Vec<Vec<Vec<u64>>> = vec![vec![Vec::new(); per]; args.servers.len()];
        for idx in 0..args.keys {
            let s = ks.server(idx);
            shards[s][(idx % per as u64) as usize].push(idx);
        }
        let n = std::thread::scope(|sc| {
            let hs: Vec<_> = shards
                .into_iter()
                .enumerate()
                .flat_map(|(s, parts)| parts.into_iter().enumerate().map(move |(p, keys)| (s, p, keys)))
                .map(|(s, p, keys)| {
                    let (addr, ks) = (&args.servers[s], &ks);
                    sc.spawn(move || preload(addr, ks, keys, mix64(args.seed ^ ((s * 64 + p) as u64))))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("a preload thread panicked"))
                .sum::<anyhow::Result<u64>>()
        })?;
        stored = Some(n);
    }
    let preload_s = t.elapsed().as_secs_f64();
    let start = Instant::now() + Duration::from_millis(50);
    let end = start + Duration::from_secs_f64(args.warmup + args.duration);
    let rate = args.rate / args.clients as f64;
    let mut seen = Seen::new();
    std::thread::scope(|sc| -> anyhow::Result<()> {
        let hs: Vec<_> = (0..args.clients)
            .map(|c| {
                let (args, ks) = (&args, &ks);
                let plan = ClientPlan {
                    seed: mix64(args.seed.wrapping_add(1000 + c as u64)),
                    rate,
                    start,
                    end,
                };
                sc.spawn(move || client(args, ks, plan))
            })
            .collect();
        for h in hs {
            seen.add(&h.join().expect("a client panicked")?);
        }
        Ok(())
    })?;
    let done = seen.get.len() + seen.set.len();
    let out = serde_json::json!({
        "servers": args.servers,
        "mode": if args.rate > 0.0 { "open" } else { "closed" },
        "offered_per_s": args.rate,
        "clients": args.clients,
        "depth": args.depth,
        "duration_s": args.duration,
        "keys": args.keys,
        "zipf": args.zipf,
        "preload": {"stored": stored, "seconds": (preload_s * 100.0).round() / 100.0},
        "requests": done,
        // Replies that came within the measured interval: below the offered rate when the
        // server cannot keep up.
        "throughput_per_s": (seen.answered as f64 / args.duration).round(),
        "hit_ratio": if seen.hits + seen.misses > 0 { seen.hits as f64 / (seen.hits + seen.misses) as f64 } else { 0.0 },
        "sets_refused": seen.set_refused,
        "corrupt": seen.corrupt,
        "get": summary(&seen.get),
        "set": summary(&seen.set),
    });
    if args.json {
        splitos_core::outln!("{out}");
    } else {
        let line = |name: &str, v: &serde_json::Value| {
            splitos_core::outln!(
                "{name}: {} requests, mean {} us, p50 {} us, p90 {} us, p99 {} us, max {} us",
                v["n"],
                v["mean_us"],
                v["p50_us"],
                v["p90_us"],
                v["p99_us"],
                v["max_us"]
            )
        };
        splitos_core::outln!(
            "{} requests due in {} s, {} replies per second ({} loop)",
            done,
            args.duration,
            out["throughput_per_s"],
            out["mode"].as_str().unwrap_or("")
        );
        if let Some(n) = stored {
            splitos_core::outln!("preload: {n} of {} keys stored in {preload_s:.1} s", args.keys);
        }
        splitos_core::outln!(
            "hit ratio {:.3}, {} SETs refused",
            out["hit_ratio"].as_f64().unwrap_or(0.0),
            seen.set_refused
        );
        line("GET", &out["get"]);
        line("SET", &out["set"]);
    }
    if seen.corrupt > 0 {
        bail!("{} GETs returned a value other than the one stored", seen.corrupt);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ETC fits, inverted: keys a median of about 34 bytes, values a median of about 170
    /// bytes and a tail past 2 KB at the 99th percentile.
    #[test]
    fn etc_sizes_follow_the_published_fits() {
        let mut keys: Vec<f64> = (1..10_000).map(|i| etc_key(i as f64 / 10_000.0)).collect();
        let mut vals: Vec<f64> = (1..10_000).map(|i| etc_value(i as f64 / 10_000.0)).collect();
        keys.sort_by(f64::total_cmp);
        vals.sort_by(f64::total_cmp);
        let (k50, v50, v99) = (keys[5000], vals[5000], vals[9900]);
        assert!((30.0..37.0).contains(&k50), "median key {k50}");
        assert!((150.0..190.0).contains(&v50), "median value {v50}");
        assert!(v99 > 2000.0, "99th percentile value {v99}");
    }

    #[test]
    fn keys_are_valid_memcached_keys_and_stable() {
        let ks = Keyspace {
            seed: 7,
            key_size: Sizes::Etc,
            value_size: Sizes::Etc,
            max_value: 1000,
            servers: 3,
        };
        for idx in [0, 1, 99, 123_456_789, u64::MAX] {
            let k = ks.key(idx);
            assert!(
                k.len() <= MAX_KEY && !k.contains(|c: char| c.is_whitespace() || c.is_control()),
                "{k:?}"
            );
            assert_eq!(k, ks.key(idx));
            assert!(ks.server(idx) < 3);
        }
        let fixed = Keyspace {
            key_size: Sizes::Fixed(400),
            ..ks
        };
        assert_eq!(fixed.key(5).len(), MAX_KEY);
    }

    /// A value names its key and length: another key's value, another length's, or one byte
    /// changed is caught.
    #[test]
    fn values_are_checked_against_their_key() {
        let mut v = Vec::new();
        fill_value(&mut v, 7, 100);
        assert!(value_is(&v, 7));
        assert!(!value_is(&v, 7 + 26) && !value_is(&v, 8));
        assert!(!value_is(&v[..99], 7), "a shorter value of the same key");
        v[50] ^= 1;
        assert!(!value_is(&v, 7));
    }

    #[test]
    fn bad_options_are_refused() {
        assert!("30:1".parse::<Mix>().is_ok());
        for bad in ["30", "a:1", "0:0", "1:-1"] {
            assert!(bad.parse::<Mix>().is_err(), "{bad}");
        }
        assert!(matches!("etc".parse::<Sizes>(), Ok(Sizes::Etc)));
        assert!(matches!("100".parse::<Sizes>(), Ok(Sizes::Fixed(100))));
        assert!("0".parse::<Sizes>().is_err() && "big".parse::<Sizes>().is_err());
    }
}
