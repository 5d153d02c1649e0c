use super::*;

fn start(cfg: LoopConfig) -> (Arc<Remote>, std::thread::JoinHandle<()>) {
    let lp = EventLoop::new(0, cfg).unwrap();
    let r = lp.remote();
    (r, std::thread::spawn(move || lp.run()))
}

#[test]
fn closures_timers_and_idle_handlers_run_on_the_loop_in_order() {
    let (r, t) = start(LoopConfig::default());
    let (tx, rx) = std::sync::mpsc::channel();
    r.spawn(move || {
        let tx2 = tx.clone();
        after(Duration::from_millis(20), move || tx2.send("timer").unwrap());
        let tx3 = tx.clone();
        let cancelled = after(Duration::from_millis(5), move || tx3.send("cancelled").unwrap());
        cancel(cancelled);
        let tx4 = tx.clone();
        spawn_local(move || tx4.send("local").unwrap());
        let seen = Rc::new(Cell::new(0));
        let tx5 = tx.clone();
        let id = Rc::new(Cell::new(None));
        let id2 = id.clone();
        id.set(Some(add_idle(move || {
            seen.set(seen.get() + 1);
            if seen.get() == 3 {
                tx5.send("idle3").unwrap();
                remove_idle(id2.get().unwrap());
            }
        })));
        tx.send(if current_core() == Some(0) {
            "on core 0"
        } else {
            "elsewhere"
        })
        .unwrap();
    });
    let got: Vec<&str> = (0..4)
        .map(|_| rx.recv_timeout(Duration::from_secs(5)).unwrap())
        .collect();
    assert_eq!(got, ["on core 0", "local", "idle3", "timer"]);
    assert!(
        rx.recv_timeout(Duration::from_millis(50)).is_err(),
        "the cancelled timer never fired"
    );
    r.spawn(stop);
    t.join().unwrap();
}

/// A ring another thread writes: a count it bumps, and a doorbell it rings only when the
/// device asked for one, as a shared-memory channel does.
struct Ring {
    seq: Arc<AtomicU64>,
    armed: Arc<AtomicBool>,
    seen: u64,
    done: std::sync::mpsc::Sender<u64>,
}

impl Device for Ring {
    fn poll(&mut self) -> u64 {
        let now = self.seq.load(Ordering::SeqCst);
        let n = now - self.seen;
        self.seen = now;
        if n > 0 {
            self.done.send(now).unwrap();
        }
        n
    }
    fn arm(&mut self) -> bool {
        self.armed.store(true, Ordering::SeqCst);
        self.seq.load(Ordering::SeqCst) == self.seen
    }
    fn disarm(&mut self) {
        self.armed.store(false, Ordering::SeqCst);
    }
}

#[test]
fn a_device_is_polled_and_wakes_a_sleeping_loop_only_through_its_doorbell() {
    for waiting in [Waiting::Sleep, Waiting::Poll] {
        let (r, t) = start(LoopConfig {
            waiting,
            ..LoopConfig::default()
        });
        let (seq, armed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (done, seen) = std::sync::mpsc::channel();
        let (mut bell_rx, mut bell_tx) = mio::net::UnixStream::pair().unwrap();
        // The loop's end drops the handler and with it the socket, after `stop`.
        let rings = Arc::new(AtomicU64::new(0));
        let (s2, a2) = (seq.clone(), armed.clone());
        r.spawn(move || {
            add_device(Ring {
                seq: s2,
                armed: a2,
                seen: 0,
                done,
            });
            let fd = std::os::fd::AsRawFd::as_raw_fd(&bell_rx);
            register(&mut mio::unix::SourceFd(&fd), Interest::READABLE, move |_| {
                let mut b = [0u8; 64];
                while matches!(io::Read::read(&mut bell_rx, &mut b), Ok(n) if n > 0) {}
            })
            .map(drop)
            .unwrap();
        });
        std::thread::sleep(Duration::from_millis(20));
        for i in 1..=200u64 {
            seq.store(i, Ordering::SeqCst);
            if armed.load(Ordering::SeqCst) {
                rings.fetch_add(1, Ordering::Relaxed);
                let _ = io::Write::write(&mut bell_tx, b"!");
            }
            // Every bump is seen, asleep or not.
            let mut last = 0;
            while last < i {
                last = seen
                    .recv_timeout(Duration::from_secs(5))
                    .expect("the loop saw the bump");
            }
            // Time for the loop to go to sleep (a sleeping loop) between bumps.
            std::thread::sleep(Duration::from_micros(500));
        }
        let c = r.stats().counts();
        let rang = rings.load(Ordering::Relaxed);
        match waiting {
            // Asleep between bumps: each one needed the doorbell, and the loop slept.
            Waiting::Sleep => assert!(rang >= 100 && c.sleeps >= rang, "{rang} rings, {c:?}"),
            // Polling: the device was never armed, so no bump rang.
            _ => assert!(rang == 0 && c.sleeps == 0, "{rang} rings, {c:?}"),
        }
        assert!(c.events >= 200, "{c:?}");
        r.spawn(stop);
        t.join().unwrap();
    }
}

/// Always has work.
struct Busy(Rc<Cell<u64>>);

impl Device for Busy {
    fn poll(&mut self) -> u64 {
        self.0.set(self.0.get() + 1);
        1
    }
    fn arm(&mut self) -> bool {
        false
    }
    fn disarm(&mut self) {}
}

#[test]
fn a_device_that_always_has_work_neither_starves_io_nor_outlives_its_removal() {
    let (r, t) = start(LoopConfig {
        waiting: Waiting::Poll,
        ..LoopConfig::default()
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let (mut bell_rx, mut bell_tx) = mio::net::UnixStream::pair().unwrap();
    r.spawn(move || {
        let polls = Rc::new(Cell::new(0));
        let id = add_device(Busy(polls.clone()));
        let fd = std::os::fd::AsRawFd::as_raw_fd(&bell_rx);
        register(&mut mio::unix::SourceFd(&fd), Interest::READABLE, move |_| {
            let mut b = [0u8; 8];
            let _ = io::Read::read(&mut bell_rx, &mut b);
            // Seen while the device was busy all along; then it goes.
            remove_device(id);
            let at = polls.get();
            let (tx, polls) = (tx.clone(), polls.clone());
            after(Duration::from_millis(20), move || tx.send((at, polls.get())).unwrap());
        })
        .map(drop)
        .unwrap();
    });
    std::thread::sleep(Duration::from_millis(30));
    io::Write::write_all(&mut bell_tx, b"!").unwrap();
    let (at, later) = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("the socket's event ran beside a busy device");
    assert!(at > 0, "the device was polled");
    assert!(later <= at + 1, "a removed device is polled no more: {at} then {later}");
    r.spawn(stop);
    t.join().unwrap();
}

#[test]
fn a_loop_polls_under_load_and_sleeps_at_rest() {
    let cfg = LoopConfig {
        waiting: Waiting::Adaptive,
        poll_above: 2_000,
        sleep_below: 500,
        window: Duration::from_millis(5),
        linger: Duration::ZERO,
        coalesce: Duration::ZERO,
    };
    let (r, t) = start(cfg);
    // At rest: no switch, and the loop sleeps.
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(r.stats().counts().to_poll, 0);
    assert!(!r.stats().counts().polling);
    // 100 ms of events well above the threshold.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(100) {
        for _ in 0..50 {
            r.spawn(|| {});
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let busy = r.stats().counts();
    assert!(busy.to_poll >= 1 && busy.polling, "it polled under load: {busy:?}");
    std::thread::sleep(Duration::from_millis(50));
    let rest = r.stats().counts();
    assert!(!rest.polling && rest.to_sleep >= 1, "it went back to sleep: {rest:?}");
    let sleeps = rest.sleeps;
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        r.stats().counts().sleeps - sleeps <= 2,
        "asleep at rest, not spinning: {:?}",
        r.stats().counts()
    );
    r.spawn(stop);
    t.join().unwrap();
}

#[test]
fn a_lingering_loop_polls_a_while_after_each_event_then_sleeps() {
    // Long, so that a loop thread kept off its CPU a while still checks within it.
    let linger = Duration::from_millis(300);
    let cfg = LoopConfig {
        waiting: Waiting::Adaptive,
        poll_above: 1_000_000,
        sleep_below: 1,
        window: Duration::from_millis(5),
        linger,
        coalesce: Duration::ZERO,
    };
    let (r, t) = start(cfg);
    std::thread::sleep(Duration::from_millis(20));
    let rest = r.stats().counts();
    assert_eq!(rest.empty_polls, 0, "at rest it sleeps at once: {rest:?}");
    let (tx, rx) = std::sync::mpsc::channel();
    r.spawn(move || tx.send(Instant::now()).unwrap());
    let ran = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    let mut lingering = r.stats().counts();
    while lingering.empty_polls == 0 && ran.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
        lingering = r.stats().counts();
    }
    assert!(lingering.empty_polls > 0, "it polls after the event: {lingering:?}");
    // It sleeps once the linger has passed, not before: a sleep seen before the linger
    // ended came early. On a busy machine it may be kept off its CPU for a while after the
    // linger, so the end is waited for, not timed.
    let mut after = r.stats().counts();
    while after.sleeps == rest.sleeps && ran.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
        after = r.stats().counts();
        let seen = ran.elapsed();
        assert!(
            after.sleeps == rest.sleeps || seen >= linger,
            "asleep {seen:?} after the event: {after:?}"
        );
    }
    assert!(after.sleeps > rest.sleeps, "it slept once the linger passed: {after:?}");
    std::thread::sleep(Duration::from_millis(50));
    let later = r.stats().counts();
    assert_eq!(later.empty_polls, after.empty_polls, "and polls no more: {later:?}");
    assert_eq!(
        (later.to_poll, later.polling),
        (0, false),
        "lingering is not the switch to polling: {later:?}"
    );
    r.spawn(stop);
    t.join().unwrap();
}

#[test]
fn a_loop_that_only_sleeps_or_only_polls_never_switches() {
    for waiting in [Waiting::Sleep, Waiting::Poll] {
        let (r, t) = start(LoopConfig {
            waiting,
            poll_above: 10,
            sleep_below: 5,
            window: Duration::from_millis(1),
            linger: Duration::from_millis(50),
            coalesce: Duration::ZERO,
        });
        for _ in 0..2000 {
            r.spawn(|| {});
        }
        let t0 = Instant::now();
        while r.stats().counts().events < 2000 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{waiting}: the loop ran its events: {:?}",
                r.stats().counts()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // Windows pass with nothing to do: a switch, were one due, would come.
        std::thread::sleep(Duration::from_millis(20));
        let c = r.stats().counts();
        assert_eq!(
            (c.to_poll, c.to_sleep, c.polling),
            (0, 0, waiting == Waiting::Poll),
            "{waiting}: {c:?}"
        );
        r.spawn(stop);
        t.join().unwrap();
    }
}

#[test]
fn readiness_of_a_registered_socket_runs_its_handler() {
    let (r, t) = start(LoopConfig::default());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    r.spawn(move || {
        let mut l = mio::net::TcpListener::from_std(listener);
        let l2 = Rc::new(RefCell::new(None::<mio::net::TcpListener>));
        let l3 = l2.clone();
        let tok = register(&mut l, Interest::READABLE, move |_| {
            let mut g = l3.borrow_mut();
            let l = g.as_mut().unwrap();
            while let Ok((_s, peer)) = l.accept() {
                tx.send(peer).unwrap();
            }
        })
        .unwrap();
        assert_eq!(tok, Token(1));
        *l2.borrow_mut() = Some(l);
    });
    let c = std::net::TcpStream::connect(addr).unwrap();
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(5)).unwrap(),
        c.local_addr().unwrap()
    );
    r.spawn(stop);
    t.join().unwrap();
}

#[test]
fn a_config_whose_thresholds_cross_is_refused() {
    let e = EventLoop::new(
        0,
        LoopConfig {
            sleep_below: 10,
            poll_above: 5,
            ..Default::default()
        },
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("sleep_below"), "{e}");
}

/// A sleeping loop with `coalesce` serves events that arrive close together in a few
/// wake-ups: after work it waits off the CPU instead of sleeping in epoll at once, then finds
/// everything that came meanwhile.
#[test]
fn a_coalescing_loop_serves_events_close_together_in_few_wake_ups() {
    let (r, t) = start(LoopConfig {
        waiting: Waiting::Sleep,
        coalesce: Duration::from_millis(10),
        ..LoopConfig::default()
    });
    let before = r.stats().counts();
    let n = 200;
    for _ in 0..n {
        r.spawn(|| {});
        std::thread::sleep(Duration::from_micros(100));
    }
    let t0 = Instant::now();
    while r.stats().counts().events < before.events + n {
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", r.stats().counts());
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = r.stats().counts();
    assert!(c.coalesced > 0, "it waited after work: {c:?}");
    // 200 events at least 100 µs apart, over 20 ms or more: a wake-up each without the
    // wait; with it, one per 10 ms window (more if this thread is kept off its CPU).
    assert!(c.sleeps - before.sleeps <= n / 4, "{c:?}");
    r.spawn(stop);
    t.join().unwrap();
}
