//! A served TCP connection on an Ebb event loop (`serving = "loops"`), once its handshake is
//! done: the loop reads what the socket has, takes the frames whole, hands the requests to the
//! dispatcher, and writes the answers when they come, many in one write. The bounds of the
//! thread-per-connection way hold here too: credits (frames beyond them stay in the socket),
//! the frame timeout (a frame begun must arrive within it), and a peer that stops reading its
//! answers is closed once they stop draining for as long.
use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Token};
use splitos_ebb::event::{self, Remote};

use super::{Admitted, TcpConn};
use crate::auth::{self, Session};
use crate::frame::{encode, parse_frame};
use crate::refusals::Refusals;
use crate::server::{Dispatcher, Peer};
use crate::wire::{FrameKind, Msg, MAX_BODY};

/// Why the loop closes a connection. The peer's own end is no fault of it, and not logged.
#[derive(Debug, thiserror::Error)]
enum Closing {
    #[error("the peer closed the connection")]
    PeerLeft,
    #[error("the peer closed in the middle of a frame")]
    MidFrame,
    #[error("the peer takes no more bytes")]
    TakesNoMore,
    #[error("reply not delivered: {0}")]
    Undelivered(io::Error),
    #[error("{0}")]
    Io(io::Error),
    #[error("unsolicited reply frame {0}")]
    Unsolicited(u64),
    #[error("rejected malformed frame: {0}")]
    Malformed(crate::frame::FrameError),
    #[error("an answer of {0} bytes exceeds the frame bound")]
    TooLarge(usize),
    #[error("a frame did not arrive, or answers were not taken, in time")]
    Late,
}

/// Bytes read from the socket at a time.
const READ_STEP: usize = 64 << 10;

/// Answers waiting to be written beyond which no more requests are taken from the connection:
/// a peer that does not read its answers stops being served, and is closed after the frame
/// timeout.
const OUT_HIGH_WATER: usize = 4 << 20;

pub(super) struct LoopConn {
    s: TcpStream,
    addr: String,
    peer: Option<Peer>,
    session: Option<Arc<Session>>,
    /// Fault injection: how long each frame waits before it is sent (`delay_us`).
    delay: Duration,
    dispatcher: Arc<Dispatcher>,
    remote: Arc<Remote>,
    max_in_flight: usize,
    frame_timeout: Duration,
    st: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Sealed records received and not yet opened (with a session).
    raw: Vec<u8>,
    /// Bytes of frames received and not yet taken, from `at`.
    plain: Vec<u8>,
    at: usize,
    /// Records received and sent (a session's nonces).
    received: u64,
    sent: u64,
    /// Answers (sealed, with a session) not yet written, from `out_at`.
    out: Vec<u8>,
    out_at: usize,
    /// Requests handed to the dispatcher and not yet answered: the credits in use.
    in_flight: usize,
    /// Why the connection must close at its next turn (an answer that cannot be sent).
    broken: Option<Closing>,
    closed: bool,
    token: Option<Token>,
    /// Whether the loop waits for the socket to take more of `out`.
    writable: bool,
    /// A turn is queued on the loop.
    queued: bool,
    /// Since when a frame has begun arriving and not ended, and since when `out` has not
    /// drained: either beyond the frame timeout closes the connection.
    partial_since: Option<Instant>,
    stalled_since: Option<Instant>,
    /// No handshake was its first frame (a transport without credentials): the first frame
    /// is due within the frame timeout of the accept, as on a thread.
    awaiting_first: bool,
    /// The socket was read dry since it last said it had something: reading it again before
    /// it does would find nothing (its readiness is edge-triggered, told again for whatever
    /// arrives after a read). A read that finds nothing is a system call per request saved.
    drained: bool,
    /// Its place among the listener's connections, given back as it closes (a timer may
    /// hold the connection a while longer).
    admitted: Option<Admitted>,
    timer: bool,
}

impl LoopConn {
    /// Runs on the loop: serves `conn` there from now on, starting with its grant of credits.
    pub(super) fn start(
        conn: TcpConn,
        dispatcher: Arc<Dispatcher>,
        max_in_flight: usize,
        frame_timeout: Duration,
        admitted: Admitted,
    ) {
        let addr = conn.peer();
        let TcpConn {
            s,
            peer,
            session,
            sent,
            received,
            delay,
            ..
        } = conn;
        // The connection's own timeouts were for blocking reads and writes.
        if s.set_nonblocking(true).is_err() || s.set_read_timeout(None).is_err() || s.set_write_timeout(None).is_err() {
            return;
        }
        let awaiting_first = peer.is_none();
        let st = State {
            sent,
            received,
            awaiting_first,
            partial_since: awaiting_first.then(Instant::now),
            admitted: Some(admitted),
            ..State::default()
        };
        let c = Arc::new(LoopConn {
            s,
            addr,
            peer,
            session,
            delay,
            dispatcher,
            remote: event::remote(),
            max_in_flight,
            frame_timeout,
            st: Mutex::new(st),
        });
        let fd = c.s.as_raw_fd();
        let handler = c.clone();
        let token = match event::register(&mut SourceFd(&fd), Interest::READABLE, move |_| handler.turn(true)) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(peer = %c.addr, error = %e, "cannot add a connection to an event loop; closing it");
                return;
            }
        };
        crate::series::LOOP_CONNECTIONS.increment(1.0);
        c.lock().token = Some(token);
        c.send(FrameKind::Credit, max_in_flight as u64, Msg::OK(crate::wire::OK));
        c.turn(true);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap()
    }

    /// Writes what it can, then reads and takes the requests its credits allow, and hands them
    /// to the dispatcher outside the lock (an answer made on the spot comes back through it).
    /// `ready`: the socket said it has something (else the turn is for answers to write).
    fn turn(self: &Arc<Self>, ready: bool) {
        let mut requests = Vec::new();
        {
            let mut st = self.lock();
            st.queued = false;
            st.drained &= !ready;
            if st.closed {
                return;
            }
            let done = match st.broken.take() {
                Some(why) => Err(why),
                None => self
                    .write_out(&mut st)
                    .and_then(|()| self.read_in(&mut st, &mut requests)),
            };
            if let Err(why) = done {
                self.close(&mut st, &why);
                return;
            }
            st.in_flight += requests.len();
            self.watch_time(&mut st);
        }
        for (req_id, msg) in requests {
            let c = self.clone();
            self.dispatcher
                .submit(msg, self.peer, move |reply| c.answered(req_id, reply));
        }
    }

    /// An answer, from any thread.
    fn answered(self: &Arc<Self>, req_id: u64, reply: Msg) {
        self.send(FrameKind::Reply, req_id, reply)
    }

    /// Sends a frame from any thread: after the injected delay if there is one (`delay_us`),
    /// as a frame written on a thread waits for it.
    fn send(self: &Arc<Self>, kind: FrameKind, req_id: u64, msg: Msg) {
        if self.delay.is_zero() {
            return self.queue(kind, req_id, msg);
        }
        crate::series::INJECTED_DELAYS.increment(1);
        let c = self.clone();
        self.on_loop(move || {
            let delay = c.delay;
            event::after(delay, move || c.queue(kind, req_id, msg));
        });
    }

    /// Queues a frame (an answer gives its credit back) and has the loop write it on its next
    /// turn of this connection, with whatever else is queued by then.
    fn queue(self: &Arc<Self>, kind: FrameKind, req_id: u64, msg: Msg) {
        let mut st = self.lock();
        if kind == FrameKind::Reply {
            st.in_flight -= 1;
        }
        if st.closed {
            return;
        }
        self.queue_frame(&mut st, kind, req_id, &msg);
        if !st.queued {
            st.queued = true;
            drop(st);
            let c = self.clone();
            self.on_loop(move || c.turn(false));
        }
    }

    fn on_loop(&self, f: impl FnOnce() + Send + 'static) {
        if event::is_current(&self.remote) {
            event::spawn_local(f);
        } else {
            self.remote.spawn(f);
        }
    }

    /// Encodes a frame into `out`, sealed in records with a session.
    fn queue_frame(&self, st: &mut State, kind: FrameKind, req_id: u64, msg: &Msg) {
        let buf = encode(kind, req_id, msg);
        if buf.len() - crate::wire::FrameHeader::SIZE > MAX_BODY as usize {
            crate::series::REPLIES_UNDELIVERED.increment(1);
            st.broken = Some(Closing::TooLarge(buf.len()));
            return;
        }
        let Some(session) = &self.session else {
            return st.out.extend_from_slice(&buf);
        };
        let mut sealed = Vec::new();
        for chunk in buf.chunks(auth::RECORD) {
            if let Err(e) = session.seal(st.sent, chunk, &mut sealed) {
                st.broken = Some(Closing::Io(e));
                return;
            }
            st.sent += 1;
            st.out.extend_from_slice(&(sealed.len() as u32).to_le_bytes());
            st.out.extend_from_slice(&sealed);
        }
    }

    fn write_out(&self, st: &mut State) -> Result<(), Closing> {
        while st.out_at < st.out.len() {
            match (&self.s).write(&st.out[st.out_at..]) {
                Ok(0) => return Err(Closing::TakesNoMore),
                Ok(n) => {
                    st.out_at += n;
                    st.stalled_since = None;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    crate::series::REPLIES_UNDELIVERED.increment(1);
                    return Err(Closing::Undelivered(e));
                }
            }
        }
        let pending = st.out_at < st.out.len();
        if !pending || st.out_at >= READ_STEP {
            let at = st.out_at;
            st.out.drain(..at);
            st.out_at = 0;
        }
        if pending && st.stalled_since.is_none() {
            st.stalled_since = Some(Instant::now());
        }
        if pending != st.writable {
            let interest = if pending {
                Interest::READABLE | Interest::WRITABLE
            } else {
                Interest::READABLE
            };
            if let Some(t) = st.token {
                event::reregister(&mut SourceFd(&self.s.as_raw_fd()), t, interest).map_err(Closing::Io)?;
            }
            st.writable = pending;
        }
        Ok(())
    }

    /// Takes whole frames while credits last and answers are not piling up, reading the
    /// socket (to its end, as the loop's readiness is edge-triggered) when it needs more.
    fn read_in(&self, st: &mut State, requests: &mut Vec<(u64, Msg)>) -> Result<(), Closing> {
        loop {
            while st.in_flight + requests.len() < self.max_in_flight && st.out.len() - st.out_at < OUT_HIGH_WATER {
                match parse_frame(&st.plain[st.at..]) {
                    Ok(Some((f, used))) => {
                        st.at += used;
                        st.partial_since = None;
                        st.awaiting_first = false;
                        if f.kind != FrameKind::Request {
                            crate::series::FRAMES_REJECTED.increment(1);
                            return Err(Closing::Unsolicited(f.req_id));
                        }
                        requests.push((f.req_id, f.msg));
                    }
                    Ok(None) => break,
                    Err(e) => {
                        crate::series::FRAMES_REJECTED.increment(1);
                        return Err(Closing::Malformed(e));
                    }
                }
            }
            // Taken bytes go, so that a peer always a frame ahead cannot grow the buffer.
            if st.at == st.plain.len() || st.at >= READ_STEP {
                let at = st.at;
                st.plain.drain(..at);
                st.at = 0;
            }
            let full =
                st.in_flight + requests.len() >= self.max_in_flight || st.out.len() - st.out_at >= OUT_HIGH_WATER;
            if full {
                if full && st.at < st.plain.len() {
                    crate::series::REQUESTS_OVER_CREDIT.increment(1);
                }
                return Ok(());
            }
            if st.drained {
                return Ok(());
            }
            match self.read_some(st) {
                // The peer's end, as on a thread: what it still had in flight is not answered.
                Ok(0) if st.at < st.plain.len() || !st.raw.is_empty() => return Err(Closing::MidFrame),
                Ok(0) => return Err(Closing::PeerLeft),
                // A short read took all there was.
                Ok(n) => st.drained = n < READ_STEP,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    st.drained = true;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Err(Closing::PeerLeft),
                Err(e) => return Err(Closing::Io(e)),
            }
        }
    }

    /// Reads up to a step of bytes into `plain`, through the session's records if there is one.
    fn read_some(&self, st: &mut State) -> io::Result<usize> {
        let Some(session) = &self.session else {
            return read_into(&self.s, &mut st.plain);
        };
        let n = read_into(&self.s, &mut st.raw)?;
        let mut used = 0;
        let mut opened = Vec::new();
        while let Some(len) = st.raw[used..]
            .first_chunk::<4>()
            .map(|l| u32::from_le_bytes(*l) as usize)
        {
            if len > auth::RECORD + 16 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a record of {len} bytes"),
                ));
            }
            if st.raw.len() - used < 4 + len {
                break;
            }
            session.open(st.received, &st.raw[used + 4..used + 4 + len], &mut opened)?;
            st.received += 1;
            st.plain.extend_from_slice(&opened);
            used += 4 + len;
        }
        st.raw.drain(..used);
        Ok(n)
    }

    /// Keeps a timer while a frame is arriving or answers are not draining.
    fn watch_time(self: &Arc<Self>, st: &mut State) {
        let partial = st.at < st.plain.len() || !st.raw.is_empty();
        if partial && st.partial_since.is_none() {
            st.partial_since = Some(Instant::now());
        } else if !partial && !st.awaiting_first {
            st.partial_since = None;
        }
        let since = [st.partial_since, st.stalled_since].into_iter().flatten().min();
        let Some(since) = since else { return };
        if st.timer {
            return;
        }
        st.timer = true;
        // Weak: a closed connection's socket must not wait for the timer to be closed.
        let c = Arc::downgrade(self);
        event::after(
            (since + self.frame_timeout).saturating_duration_since(Instant::now()),
            move || {
                let Some(c) = c.upgrade() else { return };
                let mut st = c.lock();
                st.timer = false;
                if st.closed {
                    return;
                }
                let late = [st.partial_since, st.stalled_since]
                    .into_iter()
                    .flatten()
                    .any(|t| t.elapsed() >= c.frame_timeout);
                if late {
                    crate::series::FRAMES_TIMED_OUT.increment(1);
                    c.close(&mut st, &Closing::Late);
                } else {
                    c.watch_time(&mut st);
                }
            },
        );
    }

    fn close(&self, st: &mut State, why: &Closing) {
        if st.closed {
            return;
        }
        st.closed = true;
        if !matches!(why, Closing::PeerLeft) {
            static CLOSED: Refusals = Refusals::new("closed a connection on an event loop");
            if CLOSED.log_this(super::host(&self.s)) {
                tracing::warn!(peer = %self.addr, why = %why, "closing that connection, still serving others");
            }
        }
        if let Some(t) = st.token.take() {
            event::deregister(&mut SourceFd(&self.s.as_raw_fd()), t);
        }
        let _ = self.s.shutdown(Shutdown::Both);
        (st.raw, st.plain, st.out) = Default::default();
        st.admitted = None;
        crate::series::LOOP_CONNECTIONS.decrement(1.0);
    }
}

/// Appends up to [`READ_STEP`] bytes from `s` to `buf`, read through a buffer of the loop's
/// thread: growing `buf` by a zeroed [`READ_STEP`] at every read, where most bring a
/// heartbeat's hundred bytes and every last one none, was a third of the managers' CPU at
/// 10,000 components.
fn read_into(mut s: &TcpStream, buf: &mut Vec<u8>) -> io::Result<usize> {
    thread_local! {
        static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0; READ_STEP].into_boxed_slice());
    }
    SCRATCH.with_borrow_mut(|scratch| {
        let n = s.read(scratch)?;
        buf.extend_from_slice(&scratch[..n]);
        Ok(n)
    })
}
