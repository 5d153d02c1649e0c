//! The shared connection to a peer: callers on many threads send on it, each request with its
//! id, within the credits its receiver granted, and a reader thread hands each reply to the
//! caller that waits for it.
use super::*;

pub(super) type Waiter = Sender<Result<Msg, RpcError>>;

pub(super) struct Inner {
    pub(super) addr: String,
    /// The peer its handshake proved (`None` without credentials).
    pub(super) peer: Option<Peer>,
    pub(super) writer: Mutex<TcpConn>,
    pub(super) pending: Mutex<HashMap<u64, Waiter>>,
    pub(super) next_id: AtomicU64,
    pub(super) dead: AtomicBool,
    pub(super) credits: Mutex<Credits>,
    /// Signalled when a credit comes back, more are granted, or the connection dies.
    pub(super) credit_back: Condvar,
}

/// The requests a connection may have in flight, as its receiver granted, and those it has:
/// a caller beyond the grant waits for a reply to bring a credit back, so that a slow
/// receiver slows its callers instead of queueing their requests.
pub(super) struct Credits {
    pub(super) granted: u64,
    pub(super) used: u64,
}

/// Credits a connection has before its receiver's grant arrives: one request is always
/// allowed (every receiver serves at least one at a time).
pub(super) const FIRST_CREDITS: u64 = 1;

/// A multiplexed connection: callers on many threads share it; a reader thread matches
/// replies to callers by request id.
#[derive(Clone)]
pub(super) struct Client {
    pub(super) inner: Arc<Inner>,
}

impl Client {
    pub(super) fn start(conn: TcpConn, addr: &str) -> Result<Client, RpcError> {
        let reader = conn.try_clone().map_err(|e| RpcError::Unreachable {
            addr: addr.to_string(),
            why: e.to_string(),
        })?;
        let inner = Arc::new(Inner {
            addr: addr.to_string(),
            peer: conn.peer,
            writer: Mutex::new(conn),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            dead: AtomicBool::new(false),
            credits: Mutex::new(Credits {
                granted: FIRST_CREDITS,
                used: 0,
            }),
            credit_back: Condvar::new(),
        });
        let weak = Arc::downgrade(&inner);
        std::thread::Builder::new()
            .name(format!("rpc-rx {addr}"))
            .spawn(move || reader_loop(reader, weak))
            .expect("spawn rpc reader");
        Ok(Client { inner })
    }

    pub(super) fn is_dead(&self) -> bool {
        self.inner.dead.load(Ordering::Acquire)
    }

    pub(super) fn call(&self, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError> {
        let inner = &self.inner;
        if inner.dead.load(Ordering::Acquire) {
            return Err(RpcError::Closed {
                addr: inner.addr.clone(),
            });
        }
        if let Some(p) = inner.peer.filter(|p| !may_receive(p.role, msg)) {
            return Err(wrong_receiver(&inner.addr, p.role, msg));
        }
        let t0 = Instant::now();
        self.take_credit(msg, timeout)?;
        let timeout = timeout.saturating_sub(t0.elapsed());
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = bounded(1);
        inner.pending.lock().unwrap().insert(id, tx);
        let sent = write_frame(&mut *inner.writer.lock().unwrap(), FrameKind::Request, id, msg);
        if let Err(e) = sent {
            inner.pending.lock().unwrap().remove(&id);
            inner.dead.store(true, Ordering::Release);
            wake_credit_waiters(inner);
            return Err(RpcError::Unreachable {
                addr: inner.addr.clone(),
                why: e.to_string(),
            });
        }
        match rx.recv_timeout(timeout) {
            Ok(r) => r,
            Err(_) => {
                inner.pending.lock().unwrap().remove(&id);
                Err(RpcError::Timeout {
                    addr: inner.addr.clone(),
                    msg: msg.name(),
                    after: timeout,
                })
            }
        }
    }
}

impl Client {
    /// Waits up to `timeout` for a credit of the connection and takes it; a reply gives it back.
    pub(super) fn take_credit(&self, msg: &Msg, timeout: Duration) -> Result<(), RpcError> {
        let inner = &self.inner;
        let deadline = Instant::now() + timeout;
        let mut c = inner.credits.lock().unwrap();
        if c.used >= c.granted {
            crate::series::CREDIT_WAITS.increment(1);
        }
        while c.used >= c.granted {
            if inner.dead.load(Ordering::Acquire) {
                return Err(RpcError::Closed {
                    addr: inner.addr.clone(),
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(RpcError::Timeout {
                    addr: inner.addr.clone(),
                    msg: msg.name(),
                    after: timeout,
                });
            }
            c = inner.credit_back.wait_timeout(c, left).unwrap().0;
        }
        c.used += 1;
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(w) = self.writer.lock() {
            w.close();
        }
    }
}

pub(super) fn reader_loop(mut conn: TcpConn, inner: Weak<Inner>) {
    loop {
        let frame = read_frame(&mut conn);
        let Some(inner) = inner.upgrade() else { return };
        match frame {
            Ok(Some(f)) if f.kind == FrameKind::Reply => {
                // Every reply brings its credit back, also one whose caller gave up waiting:
                // the receiver served that request all the same.
                let mut c = inner.credits.lock().unwrap();
                c.used = c.used.saturating_sub(1);
                drop(c);
                inner.credit_back.notify_one();
                if let Some(w) = inner.pending.lock().unwrap().remove(&f.req_id) {
                    let _ = w.send(Ok(f.msg));
                }
            }
            Ok(Some(f)) if f.kind == FrameKind::Credit => {
                inner.credits.lock().unwrap().granted = f.req_id.max(1);
                inner.credit_back.notify_all();
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

pub(super) fn fail_all(inner: &Inner) {
    inner.dead.store(true, Ordering::Release);
    wake_credit_waiters(inner);
    for (_, w) in inner.pending.lock().unwrap().drain() {
        let _ = w.send(Err(RpcError::Closed {
            addr: inner.addr.clone(),
        }));
    }
}

/// Wakes the callers waiting for a credit of a connection that died. Taken under the credits'
/// lock, so that a caller between its check of `dead` and its wait cannot miss the wake-up.
pub(super) fn wake_credit_waiters(inner: &Inner) {
    let _held = inner.credits.lock().unwrap();
    inner.credit_back.notify_all();
}
