//! A core's event loop: non-preemptive, every event runs to completion on the loop's thread.
//!
//! Events are one-shot closures ([`spawn_local`], or [`Remote::spawn`] from another thread),
//! timers ([`after`]), I/O readiness of sources registered with [`register`], idle
//! handlers ([`add_idle`]), which run whenever an iteration found nothing else to do, and
//! devices ([`add_device`]): rings in memory a peer writes (a shared-memory channel), looked
//! at on every iteration, which must ask for a wake-up (a doorbell) before the loop sleeps.
//!
//! The loop switches itself between two ways of waiting, as EbbRT's drivers switch between
//! interrupts and polling: **sleeping** in epoll until an event comes, which costs a wake-up
//! (tens of microseconds on a virtual machine) per event but no CPU at rest, and **polling**
//! (epoll with a zero timeout, again and again), which catches an event within a microsecond
//! or two but holds a CPU. It counts the events of every window ([`LoopConfig::window`]); at a
//! rate above [`LoopConfig::poll_above`] it polls, and below [`LoopConfig::sleep_below`] it
//! sleeps again: the gap between the two is the hysteresis that keeps a rate near one
//! threshold from flapping. An installed idle handler keeps the loop polling (that is what it
//! is for: a device polled for work). [`LoopStats`] counts the switches.
use std::cell::{Cell, RefCell};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Registry, Token, Waker};

/// How a loop waits for events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Waiting {
    /// Polls above [`LoopConfig::poll_above`] events per second, sleeps below
    /// [`LoopConfig::sleep_below`].
    #[default]
    Adaptive,
    /// Always polls (a CPU per loop, always).
    Poll,
    /// Always sleeps in epoll between events.
    Sleep,
}

impl std::str::FromStr for Waiting {
    type Err = LoopError;
    fn from_str(s: &str) -> Result<Self, LoopError> {
        match s {
            "adaptive" => Ok(Waiting::Adaptive),
            "poll" => Ok(Waiting::Poll),
            "sleep" => Ok(Waiting::Sleep),
            _ => Err(LoopError::UnknownWaiting(s.to_string())),
        }
    }
}

/// Why an event loop's configuration is refused.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("unknown waiting {0:?} (adaptive, poll or sleep)")]
    UnknownWaiting(String),
    #[error(
        "sleep_below ({sleep_below}) must not exceed poll_above ({poll_above}): the loop would switch on every window"
    )]
    SleepAbovePoll { sleep_below: u64, poll_above: u64 },
    #[error("the rate window must be longer than zero")]
    NoWindow,
}

impl serde::Serialize for Waiting {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Waiting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Waiting, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl std::fmt::Display for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Waiting::Adaptive => "adaptive",
            Waiting::Poll => "poll",
            Waiting::Sleep => "sleep",
        })
    }
}

/// When a loop polls and when it sleeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoopConfig {
    pub waiting: Waiting,
    /// Events per second above which an adaptive loop starts polling.
    pub poll_above: u64,
    /// Events per second below which a polling adaptive loop sleeps again (at most
    /// `poll_above`).
    pub sleep_below: u64,
    /// The window the rate is measured over.
    pub window: Duration,
    /// How long an adaptive loop that is not polling keeps polling after its last event
    /// before it sleeps:
    /// a caller that waits for an answer often sends its next request at once, which then
    /// finds the loop awake although the rate is below `poll_above` (zero: sleep as soon as
    /// there is nothing to do). It costs CPU only after work.
    pub linger: Duration,
    /// How long a loop that would sleep in epoll right after work waits first, off the CPU,
    /// so that what arrives meanwhile is served in one wake-up rather than one each (zero:
    /// none). Each event waits up to this long; a loop serving requests that come a few
    /// hundred microseconds apart is woken that much less often.
    pub coalesce: Duration,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            waiting: Waiting::Adaptive,
            poll_above: 20_000,
            sleep_below: 5_000,
            window: Duration::from_millis(10),
            linger: Duration::ZERO,
            coalesce: Duration::ZERO,
        }
    }
}

impl LoopConfig {
    pub fn validate(&self) -> Result<(), LoopError> {
        if self.sleep_below > self.poll_above {
            return Err(LoopError::SleepAbovePoll {
                sleep_below: self.sleep_below,
                poll_above: self.poll_above,
            });
        }
        if self.window.is_zero() {
            return Err(LoopError::NoWindow);
        }
        Ok(())
    }
}

/// A loop's counters, readable from any thread.
#[derive(Debug, Default)]
pub struct LoopStats {
    /// Events run: closures, timers, readiness events.
    pub events: AtomicU64,
    /// Switches from sleeping to polling, and back.
    pub to_poll: AtomicU64,
    pub to_sleep: AtomicU64,
    /// Waits in epoll that could block (sleeping mode).
    pub sleeps: AtomicU64,
    /// Waits of `coalesce` after work, in place of a wait in epoll.
    pub coalesced: AtomicU64,
    /// Iterations that polled and found nothing.
    pub empty_polls: AtomicU64,
    pub idle_calls: AtomicU64,
    /// Whether the loop polls now.
    pub polling: AtomicBool,
}

/// A snapshot of [`LoopStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoopCounts {
    pub events: u64,
    pub to_poll: u64,
    pub to_sleep: u64,
    pub sleeps: u64,
    pub coalesced: u64,
    pub empty_polls: u64,
    pub idle_calls: u64,
    pub polling: bool,
}

impl LoopStats {
    pub fn counts(&self) -> LoopCounts {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LoopCounts {
            events: r(&self.events),
            to_poll: r(&self.to_poll),
            to_sleep: r(&self.to_sleep),
            sleeps: r(&self.sleeps),
            coalesced: r(&self.coalesced),
            empty_polls: r(&self.empty_polls),
            idle_calls: r(&self.idle_calls),
            polling: self.polling.load(Ordering::Relaxed),
        }
    }
}

const WAKER: Token = Token(0);

/// How long a polling loop watches its devices alone before it looks at its I/O sources again.
const DEVICE_SPIN: Duration = Duration::from_micros(50);

type Task = Box<dyn FnOnce() + Send>;

/// A loop as other threads see it: they hand it closures to run.
pub struct Remote {
    core: usize,
    queue: Mutex<Vec<Task>>,
    waker: Waker,
    /// Set while the loop may block in epoll: only then does a spawn pay for a wake-up.
    asleep: AtomicBool,
    stats: Arc<LoopStats>,
}

impl Remote {
    pub fn core(&self) -> usize {
        self.core
    }

    pub fn stats(&self) -> &LoopStats {
        &self.stats
    }

    /// Runs `f` on the loop, as soon as it gets to it.
    pub fn spawn(&self, f: impl FnOnce() + Send + 'static) {
        let asleep = {
            let mut q = self.queue.lock().unwrap();
            q.push(Box::new(f));
            // Read under the queue's lock, which the loop holds while it decides to sleep:
            // either it saw this task, or this sees it asleep and wakes it.
            self.asleep.load(Ordering::Relaxed)
        };
        if asleep {
            let _ = self.waker.wake();
        }
    }
}

type Handler = Rc<RefCell<dyn FnMut(&mio::event::Event)>>;
type Idle = Rc<RefCell<dyn FnMut()>>;
type Dev = Rc<RefCell<dyn Device>>;

/// What the loop's thread holds: everything the free functions of this module reach.
struct Local {
    remote: Arc<Remote>,
    registry: Registry,
    queue: VecDeque<Box<dyn FnOnce()>>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    timer_fns: BTreeMap<u64, Box<dyn FnOnce()>>,
    next_timer: u64,
    idle: BTreeMap<u64, Idle>,
    next_idle: u64,
    devices: BTreeMap<u64, Dev>,
    /// The devices as one list, rebuilt when one comes or goes: what each iteration polls,
    /// without a list made per iteration.
    device_list: Rc<[Dev]>,
    next_device: u64,
    sources: Vec<Option<Handler>>,
    free_sources: Vec<usize>,
    stop: bool,
}

thread_local! {
    static LOCAL: RefCell<Option<Local>> = const { RefCell::new(None) };
    static CORE: Cell<Option<usize>> = const { Cell::new(None) };
}

fn with_local<T>(f: impl FnOnce(&mut Local) -> T) -> T {
    LOCAL.with(|l| f(l.borrow_mut().as_mut().expect("called outside an Ebb event loop")))
}

/// The index of the loop this thread runs, if it runs one.
pub fn current_core() -> Option<usize> {
    CORE.with(|c| c.get())
}

/// This loop as other threads reach it.
pub fn remote() -> Arc<Remote> {
    with_local(|l| l.remote.clone())
}

/// Whether this thread runs the loop `r` reaches (loops of two runtimes share core numbers).
pub fn is_current(r: &Arc<Remote>) -> bool {
    LOCAL.with(|l| {
        l.try_borrow()
            .ok()
            .and_then(|l| l.as_ref().map(|l| Arc::ptr_eq(&l.remote, r)))
            .unwrap_or(false)
    })
}

/// Runs `f` on this loop after the events already queued.
pub fn spawn_local(f: impl FnOnce() + 'static) {
    with_local(|l| l.queue.push_back(Box::new(f)));
}

/// A timer set by [`after`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerId(u64);

/// Runs `f` on this loop once `delay` has passed.
pub fn after(delay: Duration, f: impl FnOnce() + 'static) -> TimerId {
    with_local(|l| {
        let id = l.next_timer;
        l.next_timer += 1;
        l.timers.push(Reverse((Instant::now() + delay, id)));
        l.timer_fns.insert(id, Box::new(f));
        TimerId(id)
    })
}

/// Cancels a timer that has not fired (a fired or cancelled one is left alone).
pub fn cancel(t: TimerId) {
    with_local(|l| l.timer_fns.remove(&t.0));
}

/// A source of work the loop looks at itself, as a NIC's receive ring: polled on every
/// iteration, and armed before the loop sleeps, as EbbRT's drivers enable interrupts when they
/// stop polling.
pub trait Device {
    /// Looks for work and does it; returns the events it ran (they count towards the rate
    /// that decides between polling and sleeping).
    fn poll(&mut self) -> u64;
    /// The loop is about to sleep: ask to be woken (through a source registered with this
    /// loop) when work comes. False if work came meanwhile, so that the loop does not sleep;
    /// an armed device must then still take work when it is polled.
    fn arm(&mut self) -> bool;
    /// The loop is awake again: wake-ups may stop.
    fn disarm(&mut self);
}

/// A device added by [`add_device`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceId(u64);

/// Adds a device to this loop.
pub fn add_device(d: impl Device + 'static) -> DeviceId {
    with_local(|l| {
        let id = l.next_device;
        l.next_device += 1;
        l.devices.insert(id, Rc::new(RefCell::new(d)));
        l.device_list = l.devices.values().cloned().collect();
        DeviceId(id)
    })
}

/// Removes a device (which may be the one polled now: it is dropped after its call).
pub fn remove_device(id: DeviceId) {
    with_local(|l| {
        if let Some(d) = l.devices.remove(&id.0) {
            l.device_list = l.devices.values().cloned().collect();
            l.queue.push_back(Box::new(move || drop(d)));
        }
    });
}

/// An idle handler added by [`add_idle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdleId(u64);

/// Runs `f` whenever an iteration of this loop finds nothing else to do; while one is
/// installed the loop polls.
pub fn add_idle(f: impl FnMut() + 'static) -> IdleId {
    with_local(|l| {
        let id = l.next_idle;
        l.next_idle += 1;
        l.idle.insert(id, Rc::new(RefCell::new(f)));
        IdleId(id)
    })
}

pub fn remove_idle(id: IdleId) {
    with_local(|l| l.idle.remove(&id.0));
}

/// Registers an I/O source with this loop: `handler` runs on each readiness event. Returns
/// the token to [`reregister`] or [`deregister`] it with.
pub fn register<S: mio::event::Source + ?Sized>(
    source: &mut S,
    interest: Interest,
    handler: impl FnMut(&mio::event::Event) + 'static,
) -> io::Result<Token> {
    with_local(|l| {
        let slot = l.free_sources.pop().unwrap_or_else(|| {
            l.sources.push(None);
            l.sources.len() - 1
        });
        let token = Token(slot + 1);
        if let Err(e) = l.registry.register(source, token, interest) {
            l.free_sources.push(slot);
            return Err(e);
        }
        l.sources[slot] = Some(Rc::new(RefCell::new(handler)));
        Ok(token)
    })
}

pub fn reregister<S: mio::event::Source + ?Sized>(source: &mut S, token: Token, interest: Interest) -> io::Result<()> {
    with_local(|l| l.registry.reregister(source, token, interest))
}

/// Removes a source and its handler (which may be the handler running now).
pub fn deregister<S: mio::event::Source + ?Sized>(source: &mut S, token: Token) {
    with_local(|l| {
        let _ = l.registry.deregister(source);
        if let Some(h) = l.sources.get_mut(token.0 - 1).and_then(Option::take) {
            // Dropped after this borrow ends: the handler may be the caller. Its token is
            // reused only then, so that an event of the old source already collected in this
            // iteration finds no handler rather than a new source's.
            let slot = token.0 - 1;
            l.queue.push_back(Box::new(move || {
                drop(h);
                with_local(|l| l.free_sources.push(slot));
            }));
        }
    })
}

/// Ends this loop after the event running now.
pub fn stop() {
    with_local(|l| l.stop = true);
}

/// One core's loop, built on the thread that will run it or handed to it.
pub struct EventLoop {
    poll: Poll,
    events: Events,
    cfg: LoopConfig,
    remote: Arc<Remote>,
}

impl EventLoop {
    pub fn new(core: usize, cfg: LoopConfig) -> io::Result<EventLoop> {
        cfg.validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let remote = Arc::new(Remote {
            core,
            queue: Mutex::new(Vec::new()),
            waker,
            asleep: AtomicBool::new(false),
            stats: Arc::default(),
        });
        Ok(EventLoop {
            poll,
            events: Events::with_capacity(256),
            cfg,
            remote,
        })
    }

    pub fn remote(&self) -> Arc<Remote> {
        self.remote.clone()
    }

    /// Runs events on this thread until [`stop`] is called on it.
    pub fn run(mut self) {
        let core = self.remote.core;
        let registry = self.poll.registry().try_clone().expect("clone an epoll registry");
        LOCAL.with(|l| {
            *l.borrow_mut() = Some(Local {
                remote: self.remote.clone(),
                registry,
                queue: VecDeque::new(),
                timers: BinaryHeap::new(),
                timer_fns: BTreeMap::new(),
                next_timer: 0,
                idle: BTreeMap::new(),
                next_idle: 0,
                devices: BTreeMap::new(),
                device_list: Rc::new([]),
                next_device: 0,
                sources: Vec::new(),
                free_sources: Vec::new(),
                stop: false,
            })
        });
        CORE.with(|c| c.set(Some(core)));
        tracing::debug!(core, "Ebb event loop running");
        self.turn();
        // Handlers and queued closures may hold sources whose drop reaches the loop
        // (`deregister`, `spawn_local`): they are dropped while it is still there, each
        // outside the loop's borrow.
        loop {
            let (sources, queue, idle, timers, devices) = with_local(|l| {
                (
                    std::mem::take(&mut l.sources),
                    std::mem::take(&mut l.queue),
                    std::mem::take(&mut l.idle),
                    std::mem::take(&mut l.timer_fns),
                    {
                        l.device_list = Rc::new([]);
                        std::mem::take(&mut l.devices)
                    },
                )
            });
            if sources.iter().all(Option::is_none)
                && queue.is_empty()
                && idle.is_empty()
                && timers.is_empty()
                && devices.is_empty()
            {
                break;
            }
            drop((sources, queue, idle, timers, devices));
        }
        CORE.with(|c| c.set(None));
        LOCAL.with(|l| l.borrow_mut().take());
    }

    fn turn(&mut self) {
        let stats = self.remote.stats.clone();
        let counters = Counters::new(self.remote.core);
        let mut polling = self.cfg.waiting == Waiting::Poll;
        stats.polling.store(polling, Ordering::Relaxed);
        let (mut window_start, mut window_events) = (Instant::now(), 0u64);
        let mut last_epoll = Instant::now();
        let linger = if self.cfg.waiting == Waiting::Adaptive {
            self.cfg.linger
        } else {
            Duration::ZERO
        };
        let mut last_work = Instant::now().checked_sub(linger).unwrap_or_else(Instant::now);
        // Whether the last iteration did anything: a loop woken for work waits `coalesce`
        // before it may sleep in epoll again.
        let mut worked = false;
        loop {
            let ran = self.run_remote() + run_queue() + run_timers() + poll_devices();
            if ran > 0 && !linger.is_zero() {
                last_work = Instant::now();
            }
            // Counted before the loop may sleep: what it did is seen while it sleeps.
            stats.events.fetch_add(ran, Ordering::Relaxed);
            counters.events.increment(ran);
            if with_local(|l| l.stop) {
                return;
            }
            let (busy, next_timer, idle) =
                with_local(|l| (!l.queue.is_empty(), l.timers.peek().map(|t| t.0 .0), !l.idle.is_empty()));
            let may_sleep = !busy && !polling && !idle && (linger.is_zero() || last_work.elapsed() >= linger);
            let timeout = if may_sleep {
                next_timer.map(|t| t.saturating_duration_since(Instant::now()))
            } else {
                Some(Duration::ZERO)
            };
            let coalesce = may_sleep && worked && !self.cfg.coalesce.is_zero();
            if coalesce {
                stats.coalesced.fetch_add(1, Ordering::Relaxed);
                counters.coalesced.increment(1);
                std::thread::sleep(timeout.map_or(self.cfg.coalesce, |t| t.min(self.cfg.coalesce)));
            }
            let armed = may_sleep && !coalesce && arm_devices();
            let sleep = armed && {
                let q = self.remote.queue.lock().unwrap();
                let empty = q.is_empty();
                self.remote.asleep.store(empty, Ordering::Relaxed);
                empty
            };
            if sleep {
                stats.sleeps.fetch_add(1, Ordering::Relaxed);
                counters.sleeps.increment(1);
            }
            // A polling loop with devices watches them rather than epoll for a while, so that
            // work in a device waits for a load rather than for a system call.
            // It still looks at epoll at least every DEVICE_SPIN, however busy the devices.
            let spun = if !sleep && !busy && ran == 0 {
                self.spin_devices(last_epoll + DEVICE_SPIN)
            } else {
                0
            };
            let r = if spun > 0 && last_epoll.elapsed() < DEVICE_SPIN {
                self.events.clear();
                Ok(())
            } else {
                last_epoll = Instant::now();
                self.poll
                    .poll(&mut self.events, if sleep { timeout } else { Some(Duration::ZERO) })
            };
            self.remote.asleep.store(false, Ordering::Relaxed);
            if armed {
                disarm_devices();
            }
            if let Err(e) = r {
                if e.kind() != io::ErrorKind::Interrupted {
                    tracing::error!(error = %e, "an Ebb event loop cannot wait for events; it stops");
                    return;
                }
            }
            let mut ready = 0;
            for ev in self.events.iter() {
                if ev.token() == WAKER {
                    continue;
                }
                let h = with_local(|l| l.sources.get(ev.token().0 - 1).cloned().flatten());
                if let Some(h) = h {
                    (h.borrow_mut())(ev);
                    ready += 1;
                }
            }
            let ready = ready + spun;
            stats.events.fetch_add(ready, Ordering::Relaxed);
            counters.events.increment(ready);
            let n = ran + ready;
            worked = n > 0;
            if ready > 0 && !linger.is_zero() {
                last_work = Instant::now();
            }
            if n == 0 && !sleep {
                stats.empty_polls.fetch_add(1, Ordering::Relaxed);
                let idle: Vec<Idle> = with_local(|l| l.idle.values().cloned().collect());
                for h in idle {
                    (h.borrow_mut())();
                    stats.idle_calls.fetch_add(1, Ordering::Relaxed);
                }
            }
            window_events += n;
            let elapsed = window_start.elapsed();
            if elapsed >= self.cfg.window {
                if self.cfg.waiting == Waiting::Adaptive {
                    let rate = (window_events as f64 / elapsed.as_secs_f64()) as u64;
                    if !polling && rate > self.cfg.poll_above {
                        polling = true;
                        stats.to_poll.fetch_add(1, Ordering::Relaxed);
                        counters.to_poll.increment(1);
                    } else if polling && rate < self.cfg.sleep_below {
                        polling = false;
                        stats.to_sleep.fetch_add(1, Ordering::Relaxed);
                        counters.to_sleep.increment(1);
                    }
                    stats.polling.store(polling, Ordering::Relaxed);
                }
                (window_start, window_events) = (Instant::now(), 0);
            }
        }
    }

    /// Polls the devices until one has work (its events), a closure comes from another thread
    /// or `until` passes (0).
    fn spin_devices(&self, until: Instant) -> u64 {
        let devs = devices();
        if devs.is_empty() {
            return 0;
        }
        loop {
            let n: u64 = devs.iter().map(|d| d.borrow_mut().poll()).sum();
            if n > 0 {
                return n;
            }
            if !self.remote.queue.lock().unwrap().is_empty() || Instant::now() >= until {
                return 0;
            }
            std::hint::spin_loop();
        }
    }

    fn run_remote(&mut self) -> u64 {
        let tasks = std::mem::take(&mut *self.remote.queue.lock().unwrap());
        let n = tasks.len() as u64;
        for t in tasks {
            t();
        }
        n
    }
}

/// The loop's counters as Prometheus sees them, labelled by core.
struct Counters {
    events: metrics::Counter,
    sleeps: metrics::Counter,
    coalesced: metrics::Counter,
    to_poll: metrics::Counter,
    to_sleep: metrics::Counter,
}

impl Counters {
    fn new(core: usize) -> Counters {
        let core = core.to_string();
        Counters {
            events: crate::series::LOOP_EVENTS.with([core.clone()]),
            sleeps: crate::series::LOOP_SLEEPS.with([core.clone()]),
            coalesced: crate::series::LOOP_COALESCED.with([core.clone()]),
            to_poll: crate::series::LOOP_SWITCHES.with([core.clone(), "poll".to_string()]),
            to_sleep: crate::series::LOOP_SWITCHES.with([core, "sleep".to_string()]),
        }
    }
}

/// Runs the closures queued now (those they queue wait for the next iteration, so that
/// readiness events are not starved).
fn run_queue() -> u64 {
    let batch: VecDeque<Box<dyn FnOnce()>> = with_local(|l| std::mem::take(&mut l.queue));
    let n = batch.len() as u64;
    for f in batch {
        f();
    }
    n
}

fn devices() -> Rc<[Dev]> {
    with_local(|l| l.device_list.clone())
}

fn poll_devices() -> u64 {
    devices().iter().map(|d| d.borrow_mut().poll()).sum()
}

/// Arms every device; false (with all of them disarmed again) if one had work.
fn arm_devices() -> bool {
    let devs = devices();
    for (i, d) in devs.iter().enumerate() {
        if !d.borrow_mut().arm() {
            for d in &devs[..=i] {
                d.borrow_mut().disarm();
            }
            return false;
        }
    }
    true
}

fn disarm_devices() {
    for d in devices().iter() {
        d.borrow_mut().disarm();
    }
}

fn run_timers() -> u64 {
    let now = Instant::now();
    let mut n = 0;
    loop {
        let due = with_local(|l| match l.timers.peek() {
            Some(Reverse((at, id))) if *at <= now => {
                let id = *id;
                l.timers.pop();
                Some(l.timer_fns.remove(&id))
            }
            _ => None,
        });
        match due {
            None => return n,
            Some(None) => {}
            Some(Some(f)) => {
                f();
                n += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests;
