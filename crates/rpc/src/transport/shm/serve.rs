//! The server's side of shared-memory channels: it offers a channel to each caller that
//! connects (within the caller's credits), and serves each channel on a thread of its own or
//! on the component's event loop.
use super::*;

/// An address claimed on TCP and on its rendezvous socket.
pub struct ShmListen {
    pub(super) tcp: TcpListen,
    pub(super) unix: UnixListener,
    pub(super) path: PathBuf,
    pub(super) spin: Duration,
    pub(super) polling: Polling,
    pub(super) creds: Option<Arc<Credentials>>,
    pub(super) max_channels: usize,
}

/// What the server sends instead of a channel to a caller that has all its credits in use.
pub(super) const NO_CREDIT: &[u8; 1] = b"n";

/// Channels open per caller (process), on the serving side.
#[derive(Default)]
pub(super) struct Held {
    pub(super) by_pid: Mutex<HashMap<i32, usize>>,
    /// The most one caller has had open at once.
    pub(super) peak: std::sync::atomic::AtomicUsize,
}

/// One channel counted against its caller's credits while it is served.
pub(super) struct Hold {
    pub(super) held: Arc<Held>,
    pub(super) pid: i32,
}

impl Held {
    pub(super) fn hold(self: &Arc<Held>, pid: i32, max: usize) -> Option<Hold> {
        let mut m = self.by_pid.lock().unwrap();
        let n = m.entry(pid).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        let peak = self.peak.fetch_max(*n, Relaxed).max(*n);
        crate::series::SHM_CHANNELS.increment(1.0);
        crate::series::SHM_PEER_CHANNELS_PEAK.set(peak as f64);
        Some(Hold {
            held: self.clone(),
            pid,
        })
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut m = self.held.by_pid.lock().unwrap();
        if let Some(n) = m.get_mut(&self.pid) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.pid);
            }
        }
        crate::series::SHM_CHANNELS.decrement(1.0);
    }
}

impl Endpoint for ShmListen {
    fn addr(&self) -> String {
        self.tcp.addr()
    }

    fn serve(self: Box<Self>, handler: Arc<dyn Handler>, cfg: ServerConfig) {
        let dispatcher = Arc::new(Dispatcher::new(handler, &cfg));
        let ShmListen {
            tcp,
            unix,
            path,
            spin,
            polling,
            creds,
            max_channels,
        } = *self;
        let held = Arc::new(Held::default());
        let loops = Loops::for_config(&cfg.name, &cfg.serving);
        tcp.serve_with(dispatcher.clone(), &cfg.name, loops.clone());
        let name = cfg.name;
        tracing::debug!(socket = %path.display(), "shared-memory rendezvous");
        std::thread::Builder::new()
            .name(format!("{name}-shm-accept"))
            .spawn(move || {
                for s in unix.incoming() {
                    let s = match s {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!(error = %e, "shared-memory accept failed");
                            std::thread::sleep(Duration::from_millis(10));
                            continue;
                        }
                    };
                    let (d, creds, held, loops) = (dispatcher.clone(), creds.clone(), held.clone(), loops.clone());
                    // The channel's own thread checks the caller, so that one that stalls in
                    // its handshake holds up no other.
                    let _ = std::thread::Builder::new().name(format!("{name}-shm")).spawn(move || {
                        let mut s = s;
                        match offer(&mut s, creds.as_deref(), &held, max_channels) {
                            Ok((map, peer, hold)) => match loops {
                                Some(loops) => loops.next().spawn(move || LoopChannel::start(s, map, d, peer, hold)),
                                None => serve_channel(s, map, d, peer, Poller::new(spin, polling), hold),
                            },
                            Err(e) if e.kind() == io::ErrorKind::ResourceBusy => {
                                crate::series::SHM_OVER_CREDIT.increment(1);
                                tracing::debug!(error = %e, "shared-memory channel refused: no credit left");
                            }
                            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                                crate::series::SHM_REFUSED.increment(1);
                                tracing::warn!(error = %e, "shared-memory channel refused");
                            }
                            // A caller that left before its channel came (a sweep checking liveness).
                            Err(e) => tracing::debug!(error = %e, "shared-memory channel not set up"),
                        }
                    });
                }
            })
            .expect("spawn shared-memory accept thread");
    }
}

/// Checks the caller's user and (with credentials) its identity and that it has a credit left,
/// then makes a sealed channel and passes it over; returns it with the caller's role and the
/// credit it holds.
pub(super) fn offer(
    s: &mut UnixStream,
    creds: Option<&Credentials>,
    held: &Arc<Held>,
    max_channels: usize,
) -> io::Result<(Mapping, Option<server::Peer>, Hold)> {
    let cred = crate::fdpass::peer_cred(s)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if cred.uid != me {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "caller pid {} runs as uid {}, this component as uid {me}",
                cred.pid, cred.uid
            ),
        ));
    }
    let peer = match creds {
        Some(creds) => {
            s.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
            let hs = auth::respond(s, creds, true).map_err(|e| match e {
                AuthError::Io(e) => e,
                AuthError::Refused(why) => io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("caller pid {}: {why}", cred.pid),
                ),
            })?;
            s.set_read_timeout(None)?;
            Some(hs.peer)
        }
        None => None,
    };
    let Some(hold) = held.hold(cred.pid, max_channels) else {
        s.write_all(NO_CREDIT)?;
        return Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!("caller pid {} has {max_channels} channels open", cred.pid),
        ));
    };
    // SAFETY: a NUL-terminated name and valid flags.
    let raw = unsafe { libc::memfd_create(c"splitos-shm".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: plain calls on the descriptor we own; sealing stops the caller from shrinking
    // the memory under this process's mapping (which would kill it with SIGBUS).
    let sealed = unsafe {
        libc::ftruncate(raw, CHANNEL as libc::off_t) == 0
            && libc::fcntl(
                raw,
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            ) == 0
    };
    if !sealed {
        return Err(io::Error::last_os_error());
    }
    let map = Mapping::new(&fd)?;
    let h = map.header();
    h.magic.store(MAGIC, Relaxed);
    h.credits.store(max_channels.min(u32::MAX as usize) as u32, Relaxed);
    h.version.store(WIRE_VERSION as u32, Release);
    send_fds(s, b"c", &[raw])?;
    Ok((map, peer, hold))
}

/// How long a caller has to prove who it is on a channel's socket.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves one caller's channel on a thread of its own until it goes away.
pub(super) fn serve_channel(
    sock: UnixStream,
    map: Mapping,
    dispatcher: Arc<Dispatcher>,
    peer: Option<server::Peer>,
    poller: Poller,
    _hold: Hold,
) {
    if sock.set_nonblocking(true).is_err() {
        return;
    }
    let h = map.header();
    let requests = crate::series::SHM_REQUESTS.handle();
    let followed = crate::series::SHM_FOLLOWED.handle();
    let moves = crate::series::SHM_SERVER_MOVES.handle();
    let mut place = Placement::new();
    let mut last = 0;
    let unhurried = crate::series::SHM_UNHURRIED.handle();
    // Whether to sleep at once until the next request: on the caller's CPU polling would only
    // hold it from the caller, who sleeps until it sends; a caller nobody waits on sends its
    // next one long after polling would have given up.
    let mut sleep_first = false;
    loop {
        let got = if sleep_first {
            sleep_until_moved(&h.req_seq, last, &h.server_sleeps, &sock, None)
        } else {
            wait(&h.req_seq, last, &h.server_sleeps, &sock, &poller, None)
        };
        let Ok(n) = got else { return };
        last = n;
        let follow = h.follow_cpu.load(Relaxed).checked_sub(1);
        let unhurried_caller = h.unhurried.load(Relaxed) == 1;
        let Some(msg) = map
            .take(REQ, h.req_len.load(Relaxed))
            .and_then(|b| postcard::from_bytes::<Msg>(&b).ok())
        else {
            crate::series::FRAMES_REJECTED.increment(1);
            tracing::warn!("rejected a malformed shared-memory request; closing that channel, still serving others");
            return;
        };
        requests.increment(1);
        // The reply comes back to this thread, so one channel never has two writers even if a
        // hostile caller sends again before its answer. A reply that never comes (its worker
        // pool is gone) ends the channel.
        let Some(reply) = dispatcher.serve_waiting(msg, peer) else {
            return;
        };
        let body = postcard::to_allocvec(&reply).expect("encoding into a Vec cannot fail");
        if body.len() > AREA {
            tracing::warn!(
                bytes = body.len(),
                "reply exceeds the frame bound; closing that channel"
            );
            return;
        }
        map.put(REP, &body);
        h.rep_len.store(body.len() as u32, Relaxed);
        ring(&h.rep_seq, n, &h.client_sleeps, &sock);
        // Moving after the answer keeps the move off the caller's wait.
        match follow {
            Some(cpu) => {
                followed.increment(1);
                if place.move_to(cpu) {
                    moves.increment(1);
                } else if place.at() != Some(cpu) {
                    // A CPU this component may not use: serve from anywhere instead.
                    place.release();
                }
            }
            None => place.release(),
        }
        if unhurried_caller {
            unhurried.increment(1);
        }
        sleep_first = unhurried_caller || (follow.is_some() && place.at() == follow);
    }
}

/// What of a channel served on an event loop its answer needs, from whichever thread answers.
pub(super) struct Answering {
    pub(super) map: Mapping,
    pub(super) sock: UnixStream,
    /// A request is being handled (on a worker, or waiting for an event): the loop takes no
    /// other from this channel until it is answered, so that the channel has one writer.
    pub(super) busy: AtomicBool,
    /// The caller's credit for the channel: given back when the last answer is done, as on a
    /// thread, so that a caller closing channels with requests under way gains none.
    pub(super) _hold: Hold,
    /// The loop, woken if the caller sent again before its answer (while the loop slept).
    pub(super) remote: Arc<Remote>,
}

impl Answering {
    /// Writes the answer to request `n` and rings if the caller sleeps. `busy` ends before
    /// the ring: once the caller can send its next request, the loop looks for it.
    pub(super) fn answer(&self, n: u64, reply: Msg) {
        let h = self.map.header();
        let body = postcard::to_allocvec(&reply).expect("encoding into a Vec cannot fail");
        if body.len() > AREA {
            tracing::warn!(
                bytes = body.len(),
                "reply exceeds the frame bound; closing that channel"
            );
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
            return;
        }
        self.map.put(REP, &body);
        h.rep_len.store(body.len() as u32, Relaxed);
        self.busy.store(false, SeqCst);
        ring(&h.rep_seq, n, &h.client_sleeps, &self.sock);
        if h.req_seq.load(SeqCst) != n {
            self.remote.spawn(|| {});
        }
    }
}

/// A caller's channel served by an event loop (`serving = "loops"`): a [`Device`] the loop
/// polls on each turn, whose doorbell (the channel's socket) wakes the loop when it sleeps.
/// A caller that asks to be followed is not: the loop stays on its own CPU.
pub(super) struct LoopChannel {
    pub(super) ans: Arc<Answering>,
    pub(super) dispatcher: Arc<Dispatcher>,
    pub(super) peer: Option<server::Peer>,
    pub(super) last: u64,
    pub(super) requests: metrics::Counter,
    /// Set when the channel closed, with what removes it from the loop.
    pub(super) closing: Rc<Closing>,
}

/// How a loop's channel leaves it: its device and its doorbell.
pub(super) struct Closing {
    pub(super) device: Cell<Option<DeviceId>>,
    pub(super) bell: Cell<Option<mio::Token>>,
}

impl Closing {
    pub(super) fn close(&self, fd: i32) {
        if let Some(d) = self.device.take() {
            remove_device(d);
        }
        if let Some(t) = self.bell.take() {
            deregister(&mut SourceFd(&fd), t);
        }
    }
}

impl LoopChannel {
    /// Runs on the loop: adds the channel and its doorbell to it.
    pub(super) fn start(
        sock: UnixStream,
        map: Mapping,
        dispatcher: Arc<Dispatcher>,
        peer: Option<server::Peer>,
        hold: Hold,
    ) {
        if sock.set_nonblocking(true).is_err() {
            return;
        }
        let fd = sock.as_raw_fd();
        let closing = Rc::new(Closing {
            device: Cell::new(None),
            bell: Cell::new(None),
        });
        let ans = Arc::new(Answering {
            map,
            sock,
            busy: AtomicBool::new(false),
            _hold: hold,
            remote: splitos_ebb::event::remote(),
        });
        let bell_ans = ans.clone();
        let bell_closing = closing.clone();
        let bell = register(&mut SourceFd(&fd), mio::Interest::READABLE, move |_| {
            // Doorbells are hints: drain them; an end of stream is the caller's death.
            let mut buf = [0u8; 64];
            loop {
                match (&bell_ans.sock).read(&mut buf) {
                    Ok(0) => return bell_closing.close(fd),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return bell_closing.close(fd),
                }
            }
        });
        let Ok(bell) = bell else { return };
        closing.bell.set(Some(bell));
        crate::series::LOOP_CHANNELS.increment(1.0);
        let requests = crate::series::SHM_REQUESTS.handle();
        let device = add_device(LoopChannel {
            ans,
            dispatcher,
            peer,
            last: 0,
            requests,
            closing: closing.clone(),
        });
        closing.device.set(Some(device));
    }
}

impl Drop for LoopChannel {
    fn drop(&mut self) {
        crate::series::LOOP_CHANNELS.decrement(1.0);
    }
}

impl Device for LoopChannel {
    fn poll(&mut self) -> u64 {
        if self.ans.busy.load(SeqCst) {
            return 0;
        }
        let h = self.ans.map.header();
        let Some(n) = moved(&h.req_seq, self.last) else {
            return 0;
        };
        self.last = n;
        let Some(msg) = self
            .ans
            .map
            .take(REQ, h.req_len.load(Relaxed))
            .and_then(|b| postcard::from_bytes::<Msg>(&b).ok())
        else {
            crate::series::FRAMES_REJECTED.increment(1);
            tracing::warn!("rejected a malformed shared-memory request; closing that channel, still serving others");
            let _ = self.ans.sock.shutdown(std::net::Shutdown::Both);
            self.closing.close(self.ans.sock.as_raw_fd());
            return 1;
        };
        self.requests.increment(1);
        self.ans.busy.store(true, SeqCst);
        let ans = self.ans.clone();
        self.dispatcher
            .submit(msg, self.peer, move |reply| ans.answer(n, reply));
        1
    }

    fn arm(&mut self) -> bool {
        let h = self.ans.map.header();
        h.server_sleeps.store(1, SeqCst);
        fence(SeqCst);
        self.ans.busy.load(SeqCst) || moved(&h.req_seq, self.last).is_none()
    }

    fn disarm(&mut self) {
        self.ans.map.header().server_sleeps.store(0, Relaxed);
    }
}
