//! The messenger's receiving side: messages between the representatives of one Ebb on
//! different components, as EbbRT's messenger carries them between nodes.
//!
//! An Ebb whose representatives answer messages ([`Messagable`]) is served with [`serve`]: a
//! message that arrives for its id is handed to the representative of the core (thread) that
//! delivers it. The runtime knows no network: a transport hands each message it receives to
//! [`deliver`], and says which Ebbs this process serves ([`served`]) to whatever keeps the
//! global id map. The project's transport does both (`splitos_rpc::messenger`).
//!
//! Only Ebbs with a static id (below [`FIRST_DYNAMIC`]) may be served: a dynamic id names an
//! Ebb in one process only, so another component could not name it.
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

use crate::ebb::{Ebb, EbbError, EbbId, FIRST_DYNAMIC};

/// Who sent a message, as the transport proved it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The sender's role (the transport's name for it, e.g. `global-managers`, `admin`);
    /// `None` on a transport without credentials.
    pub role: Option<String>,
}

/// A representative that answers the messages sent to its Ebb.
pub trait Messagable: 'static {
    /// Answers one message from `from`. An `Err` goes back to the sender as the refusal.
    fn receive(&self, from: &Origin, body: Bytes) -> Result<Bytes, Refused>;
}

/// A representative's refusal of a message, which its sender sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The sender may not ask this.
    Denied(String),
    /// The message makes no sense (it does not decode, or names what is not there).
    Invalid(String),
}

/// Why a message was not answered by a representative.
#[derive(Debug, PartialEq, Eq)]
pub enum Undelivered {
    /// No Ebb of this id is served here.
    NotServed(EbbId),
    /// The representative refused it.
    Refused(Refused),
}

impl std::fmt::Display for Undelivered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Undelivered::NotServed(id) => write!(f, "{id} is not served here"),
            Undelivered::Refused(Refused::Denied(why) | Refused::Invalid(why)) => f.write_str(why),
        }
    }
}

type Deliver = Arc<dyn Fn(&Origin, Bytes) -> Result<Bytes, Refused> + Send + Sync>;

struct ServedEbb {
    name: String,
    deliver: Deliver,
}

fn table() -> &'static Mutex<HashMap<EbbId, ServedEbb>> {
    static T: OnceLock<Mutex<HashMap<EbbId, ServedEbb>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// While it lives, an Ebb's messages are delivered here; dropped, they are refused.
#[must_use = "the Ebb is served only while this lives"]
pub struct Serving(EbbId);

impl Drop for Serving {
    fn drop(&mut self) {
        table().lock().unwrap().remove(&self.0);
    }
}

/// Serves `ebb`'s messages in this process until the returned guard is dropped. The guard
/// holds the Ebb: its representatives live as long as it is served.
pub fn serve<R: Messagable>(ebb: &Ebb<R>) -> Result<Serving, EbbError> {
    let id = ebb.id();
    if id.0 >= FIRST_DYNAMIC {
        return Err(EbbError::NotStatic(id));
    }
    let mut t = table().lock().unwrap();
    if t.contains_key(&id) {
        return Err(EbbError::Taken(id));
    }
    let e = ebb.clone();
    let deliver: Deliver = Arc::new(move |from, body| e.call(|rep| rep.receive(from, body)));
    t.insert(
        id,
        ServedEbb {
            name: ebb.name().to_string(),
            deliver,
        },
    );
    Ok(Serving(id))
}

/// Hands a message that arrived for Ebb `id` to the calling core's representative and
/// returns its answer. The table's lock is not held while the representative runs, so a
/// representative may itself send (or serve) messages.
pub fn deliver(id: EbbId, from: &Origin, body: Bytes) -> Result<Bytes, Undelivered> {
    let d = table()
        .lock()
        .unwrap()
        .get(&id)
        .map(|s| s.deliver.clone())
        .ok_or(Undelivered::NotServed(id))?;
    crate::series::MESSAGES_RECEIVED.with([id.0.to_string()]).increment(1);
    d(from, body).map_err(|why| {
        crate::series::MESSAGES_REFUSED.with([id.0.to_string()]).increment(1);
        Undelivered::Refused(why)
    })
}

/// The Ebbs this process serves, by id, with their names: what it tells the global id map.
pub fn served() -> Vec<(EbbId, String)> {
    let mut v: Vec<(EbbId, String)> = table()
        .lock()
        .unwrap()
        .iter()
        .map(|(id, s)| (*id, s.name.clone()))
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Echoes with a per-representative count, refusing senders without a role.
    struct Echo {
        seen: Cell<u32>,
    }

    impl Messagable for Echo {
        fn receive(&self, from: &Origin, body: Bytes) -> Result<Bytes, Refused> {
            let role = from
                .role
                .as_deref()
                .ok_or_else(|| Refused::Denied("who are you?".into()))?;
            self.seen.set(self.seen.get() + 1);
            Ok(Bytes::from(format!(
                "{role}:{}:{}",
                self.seen.get(),
                String::from_utf8_lossy(&body)
            )))
        }
    }

    #[test]
    fn a_served_ebb_answers_on_the_receiving_cores_representative_until_its_guard_drops() {
        let e = Ebb::with_id(EbbId(900), "echo", |_| Echo { seen: Cell::new(0) }).unwrap();
        let admin = Origin {
            role: Some("admin".into()),
        };
        assert_eq!(
            deliver(EbbId(900), &admin, Bytes::from_static(b"x")),
            Err(Undelivered::NotServed(EbbId(900)))
        );
        let serving = serve(&e).unwrap();
        assert!(served().contains(&(EbbId(900), "echo".to_string())));
        assert_eq!(serve(&e).err(), Some(EbbError::Taken(EbbId(900))));
        assert_eq!(
            deliver(EbbId(900), &admin, Bytes::from_static(b"hi")).unwrap(),
            "admin:1:hi"
        );
        assert_eq!(
            deliver(EbbId(900), &admin, Bytes::from_static(b"again")).unwrap(),
            "admin:2:again"
        );
        assert_eq!(
            deliver(EbbId(900), &Origin { role: None }, Bytes::new()),
            Err(Undelivered::Refused(Refused::Denied("who are you?".into())))
        );
        // Another thread is another core: a representative of its own.
        std::thread::spawn(move || {
            assert_eq!(
                deliver(
                    EbbId(900),
                    &Origin {
                        role: Some("gm".into())
                    },
                    Bytes::from_static(b"t")
                )
                .unwrap(),
                "gm:1:t"
            )
        })
        .join()
        .unwrap();
        assert_eq!(e.built(), 2);
        drop(serving);
        assert_eq!(
            deliver(EbbId(900), &admin, Bytes::new()),
            Err(Undelivered::NotServed(EbbId(900)))
        );
        assert!(!served().iter().any(|(id, _)| *id == EbbId(900)));
    }

    #[test]
    fn only_static_ids_are_served() {
        let e = Ebb::new("local", |_| Echo { seen: Cell::new(0) });
        assert_eq!(serve(&e).err(), Some(EbbError::NotStatic(e.id())));
    }
}
