//! A new process's home: asked of the managers and made at the mComponent they name, with
//! the waits that let a program start while a manager restarts or the home picked pauses.
use super::*;
use splitos_rpc::{ComponentRef, RpcError, M2P_HOME, P2M_CREATE_UNDO};
use std::time::{Duration, Instant};

use splitos_core::node::MANAGERS_BACK;

/// How long a home given up on is told, again and again, that the process it may have made
/// ended: a paused mComponent may go on much later and carry out the creation then.
const UNDO_FOR: Duration = Duration::from_secs(600);

/// How long a creation waits for its answer before it is sent again: the program's start
/// waits on it, and a home that does not answer is asked again until held lost.
const CREATE_WAIT: Duration = Duration::from_secs(2);

/// What became of a creation sent to the home picked.
enum Creation {
    Made(M2P_HOME),
    /// Surely not delivered: the managers may be asked for another home.
    NotDelivered(RpcError),
    /// Perhaps delivered, and the home given up (held lost, or silent for too long): it is
    /// told the process ended, and the managers asked for another.
    GivenUp(RpcError),
    Refused(RpcError),
}

impl Pcomp {
    /// A new process's home, picked by the managers and made there. While no manager can be
    /// reached (the only one restarting), none knows a live mComponent yet (one just started
    /// again), or the home picked cannot be reached (dead, or paused, until held lost, which
    /// the managers' silence limit bounds), the program's start waits and asks again, for at
    /// most [`MANAGERS_BACK`].
    pub(super) fn make_home(
        &self,
        who: &Who,
        region_base: u64,
        region_size: u64,
    ) -> Result<(G2P_HOME, M2P_HOME), RpcError> {
        let t0 = Instant::now();
        // The creations given up so far: the next is numbered after them, so that a home
        // picked again tells it from one of theirs come late.
        let mut attempt = 0;
        loop {
            // A pick may be asked again whatever became of the last: it takes nothing, and a
            // manager killed during the call answers no more.
            let picked = self.node.call_gm(P2G_PICK_HOME {
                vnode: who.vnode.clone(),
                pcomp: self.node.id(),
            });
            let r = match picked {
                // Not delivered, closed, late, or answered "no mComponent alive".
                Err(e) if e.code() == ErrCode::Unreachable => e,
                Err(e) => return Err(e),
                Ok(home) => {
                    let create = P2M_PROC_CREATE {
                        who: who.clone(),
                        region_base,
                        region_size,
                        pcomp: self.node.id(),
                        memory_quota: home.memory_quota,
                        attempt,
                    };
                    match self.create_at(&home.mcomp, create, t0) {
                        Creation::Made(c) => return Ok((home, c)),
                        Creation::NotDelivered(e) => e,
                        Creation::GivenUp(e) => {
                            self.undo_creation(home.mcomp, who.clone(), attempt);
                            attempt += 1;
                            e
                        }
                        Creation::Refused(e) => return Err(e),
                    }
                }
            };
            if t0.elapsed() >= MANAGERS_BACK {
                tracing::warn!(vnode = %who.vnode, error = %r, waited_s = MANAGERS_BACK.as_secs(), "no home for a new process: the program is refused");
                return Err(r);
            }
            crate::series::STARTS_WAITED_FOR_MANAGERS.increment(1);
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Sends `create` to `home` until it answers. One that got no answer may have arrived,
    /// so it is sent again, never elsewhere (the home answers a repeat as it did the first),
    /// until the managers hold the home lost or the start's wait runs out.
    fn create_at(&self, home: &ComponentRef, create: P2M_PROC_CREATE, t0: Instant) -> Creation {
        let mut sent = false;
        loop {
            match self.node.rpc.call_timeout(&home.addr, create.clone(), CREATE_WAIT) {
                // Made just as the managers gave the home up: it is fenced when it hears so,
                // and drops the process.
                Ok(_) if self.node.mcomp_declared_lost(home.id) => {
                    return Creation::GivenUp(RpcError::Unreachable {
                        addr: home.addr.clone(),
                        why: "the global managers declared it lost".into(),
                    })
                }
                Ok(c) => return Creation::Made(c),
                Err(e @ RpcError::Unreachable { .. }) if !sent => return Creation::NotDelivered(e),
                Err(e @ RpcError::Unreachable { .. }) => return Creation::GivenUp(e),
                Err(e @ (RpcError::Timeout { .. } | RpcError::Closed { .. })) => {
                    sent = true;
                    if self.node.mcomp_declared_lost(home.id) || t0.elapsed() >= MANAGERS_BACK {
                        return Creation::GivenUp(e);
                    }
                    tracing::info!(pid = create.who.pid, mcomp = home.id, error = %e, "the home picked for a new process did not answer: asking it again");
                    crate::series::CREATIONS_SENT_AGAIN.increment(1);
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Creation::Refused(e),
            }
        }
    }

    /// Tells `home`, which may have received creation `attempt` of `who` without answering,
    /// that it was given up: made there later, the process would be held by nobody. From a
    /// thread of its own, until the home answers, is held lost and cannot be reached (what it
    /// held died with it, or is dropped when it comes back fenced), or [`UNDO_FOR`] has passed.
    fn undo_creation(&self, home: ComponentRef, who: Who, attempt: u32) {
        crate::series::CREATIONS_GIVEN_UP.increment(1);
        tracing::warn!(
            pid = who.pid,
            mcomp = home.id,
            "gave up the home picked for a new process; telling it the creation was given up"
        );
        let node = self.node.clone();
        let t0 = Instant::now();
        let undo = move || loop {
            match node.rpc.call(
                &home.addr,
                P2M_CREATE_UNDO {
                    who: who.clone(),
                    attempt,
                },
            ) {
                Ok(_) | Err(RpcError::Remote { .. } | RpcError::Protocol { .. }) => return,
                Err(RpcError::Unreachable { .. }) if node.mcomp_declared_lost(home.id) => return,
                Err(e) if t0.elapsed() >= UNDO_FOR => {
                    tracing::warn!(pid = who.pid, mcomp = home.id, error = %e, "a home given up never heard that its creation was given up");
                    return;
                }
                Err(_) => std::thread::sleep(Duration::from_secs(1)),
            }
        };
        if let Err(e) = std::thread::Builder::new().name("undo-create".into()).spawn(undo) {
            tracing::warn!(error = %e, "cannot tell a home given up that its creation was given up");
        }
    }
}
