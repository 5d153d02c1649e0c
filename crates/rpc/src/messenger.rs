//! The Ebb messenger over the project's transport (docs/ebb.md#the-messenger): messages
//! between the representatives of one Ebb on different components, named through the global
//! id map the global managers keep.
//!
//! - **Receiving.** Every component's dispatcher hands an `X2X_EBB_MESSAGE` to
//!   [`splitos_ebb::messenger::deliver`], on its fan-out pool (a representative may send
//!   messages of its own), with the sender's role as its transport proved it. Nothing else of
//!   a component is involved: an Ebb served with `splitos_ebb::messenger::serve` is reachable.
//! - **The id map.** A component names the Ebbs it serves ([`served`]) in its registration and
//!   its heartbeats; the global managers answer `X2G_EBB_FIND` with each Ebb's live homes.
//! - **Sending.** A [`Messenger`] sends a message to an Ebb's representative on one component,
//!   found in the map. It is all a hosted program (one not run under splitos, as the global
//!   managers) needs to call an Ebb that lives in the cluster.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use serde_bytes::ByteBuf;
use splitos_ebb::messenger::{self, Origin, Refused, Undelivered};
use splitos_ebb::EbbId;

use crate::server::Peer;
use crate::wire::{
    EbbHome, EbbHomes, EbbServed, ErrCode, Msg, ERR, G2X_EBB_MAP, X2G_EBB_FIND, X2X_EBB_ANSWER, X2X_EBB_MESSAGE,
};
use crate::{Rpc, RpcError};

/// This process's component id, once the global managers gave it (above `u32::MAX`: not yet).
static COMPONENT: AtomicU64 = AtomicU64::new(u64::MAX);

/// Says which component this process is (the global managers are 0): a message meant for
/// another (`X2X_EBB_MESSAGE.to`) is refused.
pub fn set_component_id(id: u32) {
    COMPONENT.store(id as u64, Ordering::Relaxed);
}

/// A message for an Ebb at another component than the one it reached.
#[derive(Debug, thiserror::Error)]
#[error("this is not component {0}")]
struct NotThisComponent(u32);

impl crate::Refuse for NotThisComponent {
    fn code(&self) -> ErrCode {
        ErrCode::NotFound
    }
}

/// Answers an `X2X_EBB_MESSAGE` with the representative of its Ebb on the serving thread.
pub(crate) fn receive(m: X2X_EBB_MESSAGE, peer: Option<Peer>) -> Msg {
    let me = COMPONENT.load(Ordering::Relaxed);
    if let Some(to) = m.to.filter(|to| *to as u64 != me) {
        return Msg::ERR(NotThisComponent(to).into());
    }
    let from = Origin {
        role: peer.map(|p| p.role.name().to_string()),
    };
    match messenger::deliver(EbbId(m.ebb), &from, Bytes::from(m.body.into_vec())) {
        Ok(body) => X2X_EBB_ANSWER {
            body: ByteBuf::from(Vec::from(body)),
        }
        .into(),
        Err(e @ Undelivered::NotServed(_)) => Msg::ERR(ERR::new(ErrCode::NotFound, e.to_string())),
        Err(Undelivered::Refused(Refused::Denied(why))) => Msg::ERR(ERR::new(ErrCode::Denied, why)),
        Err(Undelivered::Refused(Refused::Invalid(why))) => Msg::ERR(ERR::new(ErrCode::Invalid, why)),
    }
}

/// The Ebbs this process serves, as registrations and heartbeats name them.
pub fn served() -> Vec<EbbServed> {
    messenger::served()
        .into_iter()
        .map(|(id, name)| EbbServed { id: id.0, name })
        .collect()
}

/// Where a [`Messenger`] reads the homes of an Ebb (the global managers' id map: their answer
/// to `X2G_EBB_FIND`, or, for the managers themselves, their own).
pub type Resolve = Box<dyn Fn(EbbId) -> Result<Vec<EbbHome>, RpcError> + Send + Sync>;

/// Sends messages to the representatives of Ebbs on other components.
pub struct Messenger {
    rpc: Rpc,
    resolve: Resolve,
    /// The homes last found per Ebb: a send to a component found here goes straight to it,
    /// and the map is read again once if that address no longer answers for it.
    homes: Mutex<Vec<(EbbId, Vec<EbbHome>)>>,
}

impl Messenger {
    pub fn new(rpc: Rpc, resolve: Resolve) -> Messenger {
        Messenger {
            rpc,
            resolve,
            homes: Mutex::new(Vec::new()),
        }
    }

    /// Sends `body` to the representative of Ebb `ebb` on component `component` and returns
    /// its answer. A home remembered that turned out wrong before the message was delivered
    /// (unreachable, or not serving the Ebb as that component) is looked up again, once; one
    /// whose connection broke during the call is not, since the message may have been
    /// served.
    pub fn send_to(&self, ebb: EbbId, component: u32, body: Bytes) -> Result<Bytes, RpcError> {
        let cached = self
            .homes
            .lock()
            .unwrap()
            .iter()
            .find(|(id, _)| *id == ebb)
            .and_then(|(_, h)| h.iter().find(|h| h.id == component).cloned());
        if let Some(home) = cached {
            match deliver_to(&self.rpc, &home.addr, ebb, Some(component), body.clone()) {
                Err(
                    RpcError::Unreachable { .. }
                    | RpcError::Remote {
                        code: ErrCode::NotFound,
                        ..
                    },
                ) => {}
                answer => return answer,
            }
        }
        let homes = (self.resolve)(ebb)?;
        let home = homes.iter().find(|h| h.id == component).cloned();
        {
            let mut cache = self.homes.lock().unwrap();
            cache.retain(|(id, _)| *id != ebb);
            cache.push((ebb, homes));
        }
        let home = home.ok_or_else(|| RpcError::Remote {
            code: ErrCode::NotFound,
            msg: format!("no live component {component} serves {ebb} (the global id map names no such home)"),
        })?;
        deliver_to(&self.rpc, &home.addr, ebb, Some(component), body)
    }
}

/// Sends `body` to the representative of Ebb `ebb` on the component at `addr` and returns its
/// answer.
pub fn send(rpc: &Rpc, addr: &str, ebb: EbbId, body: Bytes) -> Result<Bytes, RpcError> {
    deliver_to(rpc, addr, ebb, None, body)
}

fn deliver_to(rpc: &Rpc, addr: &str, ebb: EbbId, to: Option<u32>, body: Bytes) -> Result<Bytes, RpcError> {
    crate::series::EBB_MESSAGES_SENT.with([ebb.0.to_string()]).increment(1);
    let a = rpc.call(
        addr,
        X2X_EBB_MESSAGE {
            ebb: ebb.0,
            to,
            body: ByteBuf::from(Vec::from(body)),
        },
    )?;
    Ok(Bytes::from(a.body.into_vec()))
}

/// The global id map from the global managers at `gm`: Ebb `ebb`'s entry, or all.
pub fn find(rpc: &Rpc, gm: &str, ebb: Option<EbbId>) -> Result<Vec<EbbHomes>, RpcError> {
    let G2X_EBB_MAP { ebbs } = rpc.call(gm, X2G_EBB_FIND { ebb: ebb.map(|e| e.0) })?;
    Ok(ebbs)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use splitos_ebb::messenger::Messagable;
    use splitos_ebb::Ebb;

    use super::*;
    use crate::{Handler, Role, ServerConfig, TransportConfig};

    /// A component that handles nothing of its own: messages for Ebbs reach them anyway.
    struct Nothing;

    impl Handler for Nothing {
        fn handle(&self, msg: Msg) -> Msg {
            Msg::ERR(ERR::new(ErrCode::Invalid, format!("no {}", msg.name())))
        }
    }

    /// Answers with its body reversed, refusing an empty one.
    struct Reverse;

    impl Messagable for Reverse {
        fn receive(&self, _from: &Origin, body: Bytes) -> Result<Bytes, Refused> {
            if body.is_empty() {
                return Err(Refused::Invalid("nothing to reverse".into()));
            }
            Ok(body.iter().rev().copied().collect::<Vec<u8>>().into())
        }
    }

    #[test]
    fn a_message_reaches_the_ebb_on_the_component_the_map_names_and_the_map_is_read_again_when_its_home_moved() {
        let t = TransportConfig::default().build(None).unwrap();
        let ep = t.listen("127.0.0.1:0").unwrap();
        let addr = ep.addr();
        ep.serve(
            Arc::new(Nothing),
            ServerConfig {
                name: "msgr".into(),
                workers: 0,
                fanout_workers: 1,
                serving: Default::default(),
            },
        );
        let rpc = Rpc::new(t, Duration::from_secs(5));
        let ebb = Ebb::with_id(EbbId(901), "reverse", |_| Reverse).unwrap();
        let serving = messenger::serve(&ebb).unwrap();
        assert!(served().contains(&EbbServed {
            id: 901,
            name: "reverse".into()
        }));
        assert_eq!(
            send(&rpc, &addr, EbbId(901), Bytes::from_static(b"abc")).unwrap(),
            "cba"
        );
        let code = |r: Result<Bytes, RpcError>| r.map_err(|e| e.code());
        assert_eq!(code(send(&rpc, &addr, EbbId(901), Bytes::new())), Err(ErrCode::Invalid));
        assert_eq!(
            code(send(&rpc, &addr, EbbId(902), Bytes::from_static(b"x"))),
            Err(ErrCode::NotFound)
        );

        // Sent for component 7, it is refused: this process is component 5.
        set_component_id(5);
        assert_eq!(
            code(deliver_to(&rpc, &addr, EbbId(901), Some(7), Bytes::from_static(b"x"))),
            Err(ErrCode::NotFound)
        );
        assert_eq!(
            deliver_to(&rpc, &addr, EbbId(901), Some(5), Bytes::from_static(b"ok")).unwrap(),
            "ko"
        );

        // The map first names an address where nothing listens (component 5 moved), then the
        // right one.
        let dead = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let lookups = Arc::new(AtomicUsize::new(0));
        let (l, a) = (lookups.clone(), addr.clone());
        let m = Messenger::new(
            rpc,
            Box::new(move |id| {
                assert_eq!(id, EbbId(901));
                let at = if l.fetch_add(1, Ordering::SeqCst) == 0 {
                    dead.clone()
                } else {
                    a.clone()
                };
                Ok(vec![EbbHome {
                    id: 5,
                    role: Role::Mem,
                    addr: at,
                }])
            }),
        );
        assert_eq!(
            code(m.send_to(EbbId(901), 5, Bytes::from_static(b"12"))),
            Err(ErrCode::Unreachable),
            "a fresh lookup is not repeated"
        );
        assert_eq!(
            m.send_to(EbbId(901), 5, Bytes::from_static(b"12")).unwrap(),
            "21",
            "the remembered home did not answer: looked up again"
        );
        assert_eq!(lookups.load(Ordering::SeqCst), 2);
        assert_eq!(m.send_to(EbbId(901), 5, Bytes::from_static(b"345")).unwrap(), "543");
        assert_eq!(lookups.load(Ordering::SeqCst), 2, "the home found is remembered");
        assert_eq!(
            code(m.send_to(EbbId(901), 6, Bytes::from_static(b"x"))),
            Err(ErrCode::NotFound),
            "no such home in the map"
        );
        assert_eq!(lookups.load(Ordering::SeqCst), 3);
        // No longer served where the map said: read again once, then the refusal.
        drop(serving);
        assert_eq!(
            code(m.send_to(EbbId(901), 5, Bytes::from_static(b"x"))),
            Err(ErrCode::NotFound)
        );
        assert_eq!(lookups.load(Ordering::SeqCst), 4);
    }
}
