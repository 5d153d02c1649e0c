//! The serving side, independent of the transport: a component's [`Handler`] and the worker
//! pools its requests run on. A transport delivers each request to [`Dispatcher::submit`] with
//! a way to send the reply.
//!
//! Requests that may themselves call other components (`Handler::fans_out`) run on a separate
//! pool, so that two components calling each other can never exhaust each other's workers.
//!
//! With `workers: 0` the receiving thread serves leaf requests itself. Every connection has its
//! own receiving thread, so requests on different connections still run in parallel; on a
//! machine with few cores this saves the hand-off, which costs more than the work (a wake-up
//! of a halted virtual CPU per request).
use std::sync::Arc;

use crossbeam_channel::{unbounded, Receiver, Sender};

use crate::error::Refusal;
use crate::wire::{may_send, Msg, Request, Role};

/// Sends a request's answer back to its caller; called once, from any thread.
pub type Reply = Box<dyn FnOnce(Msg) + Send>;

pub trait Handler: Send + Sync + 'static {
    fn handle(&self, msg: Msg) -> Msg;
    /// True for requests whose handling makes RPCs of its own.
    fn fans_out(&self, _msg: &Msg) -> bool {
        false
    }
    /// True for a request that fans out only so as not to hold a receiver that other callers
    /// share: from a caller whose channel has a thread of its own, which waits for the
    /// answer anyway, it is served on that thread ([`Dispatcher::serve_waiting`]).
    fn served_where_it_waits(&self, _msg: &Msg) -> bool {
        false
    }
    /// True for requests whose answer waits for an event (a socket's bytes, a connection):
    /// they go to [`Handler::handle_later`], so that no worker is held while they wait.
    fn answers_later(&self, _msg: &Msg) -> bool {
        false
    }
    /// Takes a request [`Handler::answers_later`] chose, on the receiving thread (so it must
    /// not block), and answers it through `reply` when it can.
    fn handle_later(&self, msg: Msg, reply: Reply) {
        reply(self.handle(msg))
    }
}

/// One entry of a monitor's dispatch table: runs `f` on the request and encodes its answer.
/// `f` must return the request's own reply type.
pub fn on<R: Request>(req: R, f: impl FnOnce(R) -> Result<R::Reply, Refusal>) -> Msg {
    match f(req) {
        Ok(reply) => reply.into(),
        Err(e) => Msg::ERR(e),
    }
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub name: String,
    /// Worker threads for leaf requests (the data path); 0 serves them on the receiving thread.
    pub workers: usize,
    /// Worker threads for requests that fan out to other components.
    pub fanout_workers: usize,
    /// Whether requests are received on a thread per connection or on event loops.
    pub serving: crate::serving::ServingConfig,
}

/// Who sent a request, as its connection's handshake proved: its role and its static key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub role: Role,
    pub key: [u8; 32],
}

/// Its role and the first bytes of its key, as logs name it.
impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "{} {:02x}{:02x}{:02x}{:02x}",
            self.role.name(),
            self.key[0],
            self.key[1],
            self.key[2],
            self.key[3]
        )
    }
}

thread_local! {
    static PEER: std::cell::Cell<Option<Peer>> = const { std::cell::Cell::new(None) };
}

/// The sender of the request this thread is handling (`None` on a transport without
/// credentials). A handler that binds state to a sender (a process to the pComponent that
/// created it) asks here, so that the `Handler` interface stays one message in, one out.
pub fn current_peer() -> Option<Peer> {
    PEER.with(|p| p.get())
}

/// Handles `msg` with `peer` as the current sender. A message for an Ebb goes to the
/// messenger, whatever the component.
fn handle_from(handler: &dyn Handler, msg: Msg, peer: Option<Peer>) -> Msg {
    let before = PEER.with(|p| p.replace(peer));
    let reply = match msg {
        Msg::X2X_EBB_MESSAGE(m) => crate::messenger::receive(m, peer),
        msg => handler.handle(msg),
    };
    PEER.with(|p| p.set(before));
    reply
}

type Job = (Msg, Option<Peer>, Box<dyn FnOnce(Msg) + Send>);

/// Runs a component's requests on the right thread.
pub struct Dispatcher {
    handler: Arc<dyn Handler>,
    /// `None`: leaf requests are served on the receiving thread.
    leaf: Option<Sender<Job>>,
    fan: Sender<Job>,
}

impl Dispatcher {
    pub fn new(handler: Arc<dyn Handler>, cfg: &ServerConfig) -> Dispatcher {
        let leaf = (cfg.workers > 0).then(|| {
            let (tx, rx) = unbounded::<Job>();
            spawn_pool(&cfg.name, "w", cfg.workers, rx, handler.clone());
            tx
        });
        let (fan, fan_rx) = unbounded::<Job>();
        spawn_pool(&cfg.name, "f", cfg.fanout_workers.max(1), fan_rx, handler.clone());
        Dispatcher { handler, leaf, fan }
    }

    /// Handles one request from a peer authenticated as `peer` (`None`: a transport without
    /// credentials, which only benchmarks and tests build); `reply` sends the answer back
    /// where the request came from. A request the peer's role may not send is refused here,
    /// the one place every transport's requests pass ([`may_send`]).
    pub fn submit(&self, msg: Msg, peer: Option<Peer>, reply: impl FnOnce(Msg) + Send + 'static) {
        self.route(msg, peer, reply, false);
    }

    /// Handles a request from a caller whose channel has a thread of its own that waits for
    /// the answer, and returns the answer (`None`: a worker pool is gone). A request the
    /// handler says is [`Handler::served_where_it_waits`] is served on this thread rather
    /// than by the fan-out pool: the pool keeps receivers that several callers share from
    /// waiting on another component, and this one serves no one else and would only sleep
    /// while a worker served it, each wake-up costing more on a machine with few cores than
    /// most requests (an mprotect's round trip to its home took 64 µs handed off, 33 served
    /// here). Ebb messages keep to the pool, whose order they rely on.
    pub fn serve_waiting(&self, msg: Msg, peer: Option<Peer>) -> Option<Msg> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        self.route(
            msg,
            peer,
            move |reply| {
                let _ = tx.send(reply);
            },
            true,
        );
        rx.recv().ok()
    }

    fn route(&self, msg: Msg, peer: Option<Peer>, reply: impl FnOnce(Msg) + Send + 'static, waiting: bool) {
        if let Some(p) = peer.filter(|p| !may_send(p.role, &msg)) {
            crate::series::REQUESTS_REFUSED.increment(1);
            static WRONG_ROLE: crate::refusals::Refusals =
                crate::refusals::Refusals::new("refused a request its sender's role may not send");
            if WRONG_ROLE.log_this(p) {
                tracing::warn!(peer = %p, msg = msg.name(), "refused a request its sender's role may not send");
            }
            return reply(Msg::ERR(
                crate::error::NotPermitted {
                    role: p.role.name(),
                    msg: msg.name(),
                }
                .into(),
            ));
        }
        // An Ebb's representative may send messages of its own.
        let fans_out = matches!(msg, Msg::X2X_EBB_MESSAGE(_)) || self.handler.fans_out(&msg);
        if !fans_out && self.handler.answers_later(&msg) {
            let before = PEER.with(|p| p.replace(peer));
            self.handler.handle_later(msg, Box::new(reply));
            PEER.with(|p| p.set(before));
            return;
        }
        let (q, pool) = match (fans_out, &self.leaf) {
            (true, _) if waiting && self.handler.served_where_it_waits(&msg) => {
                return reply(handle_from(&*self.handler, msg, peer))
            }
            (true, _) => (&self.fan, "fan-out"),
            (false, Some(q)) => (q, "workers"),
            (false, None) => return reply(handle_from(&*self.handler, msg, peer)),
        };
        crate::series::REQUESTS_HANDED_OFF.with([pool]).increment(1);
        if q.send((msg, peer, Box::new(reply))).is_err() {
            tracing::error!("a worker pool is gone; request dropped");
        }
    }
}

fn spawn_pool(name: &str, tag: &str, n: usize, rx: Receiver<Job>, handler: Arc<dyn Handler>) {
    for i in 0..n {
        let (rx, handler) = (rx.clone(), handler.clone());
        std::thread::Builder::new()
            .name(format!("{name}-{tag}{i}"))
            .spawn(move || {
                for (msg, peer, reply) in rx {
                    reply(handle_from(&*handler, msg, peer));
                }
            })
            .expect("spawn worker");
    }
}
