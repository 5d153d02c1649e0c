//! Ebbs: a system-wide id, and a representative per core built on the core's first call.
//!
//! The fast path of a call is a thread-local vector indexed by the Ebb's slot in this process,
//! a generation check and a type check: no lock, no atomic write, no shared cache line
//! written (`benches/rep.rs` measures it). A core that has no representative yet, or one of an
//! older generation, takes the miss path: the Ebb's miss handler (its factory) builds one for
//! that core, as EbbRT's per-core translation tables fault to a miss handler.
use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// An Ebb's system-wide name. Ids below [`FIRST_DYNAMIC`] are static: every component knows
/// them by number (the policies a pComponent runs, for one). Others are handed out at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EbbId(pub u32);

/// The first id [`Ebb::new`] hands out.
pub const FIRST_DYNAMIC: u32 = 1024;

impl std::fmt::Display for EbbId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ebb#{}", self.0)
    }
}

/// The core a representative is built for: an event loop's index, or a thread outside any
/// loop, which is a core of its own to the Ebbs it calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Core {
    Loop(usize),
    Hosted,
}

impl Core {
    pub fn current() -> Core {
        crate::event::current_core().map_or(Core::Hosted, Core::Loop)
    }
}

type Factory<R> = Arc<dyn Fn(Core) -> R + Send + Sync>;

struct Entry<R> {
    id: EbbId,
    name: String,
    /// This process's dense index of the Ebb, into every thread's table of representatives.
    slot: usize,
    /// Bumped by [`Ebb::replace`]: a representative of an older generation is rebuilt.
    generation: AtomicU64,
    factory: RwLock<Factory<R>>,
    built: AtomicU64,
}

/// A reference to an Ebb whose representatives are `R`; cheap to clone and to send to any core.
pub struct Ebb<R: 'static> {
    entry: Arc<Entry<R>>,
}

impl<R: 'static> Clone for Ebb<R> {
    fn clone(&self) -> Self {
        Ebb {
            entry: self.entry.clone(),
        }
    }
}

/// A representative and the generation of the Ebb it was built for.
type Built = (u64, Rc<dyn Any>);

thread_local! {
    /// This core's representatives, by slot.
    static REPS: RefCell<Vec<Option<Built>>> = const { RefCell::new(Vec::new()) };
}

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);
static NEXT_ID: AtomicU32 = AtomicU32::new(FIRST_DYNAMIC);

/// What [`list`] tells of one Ebb.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EbbInfo {
    pub id: EbbId,
    pub name: String,
    pub generation: u64,
    /// Representatives built so far, over all cores and generations.
    pub built: u64,
}

/// This process's Ebbs by id: what [`Ebb::lookup`] and [`list`] read. The registry does not
/// keep an Ebb alive: one whose every reference was dropped (and with it what its factory
/// holds) leaves it.
struct Registered {
    /// A `Weak<Entry<R>>`.
    entry: Box<dyn Any + Send + Sync>,
    info: Box<dyn Fn() -> Option<EbbInfo> + Send + Sync>,
}

fn registry() -> &'static Mutex<HashMap<EbbId, Registered>> {
    static R: OnceLock<Mutex<HashMap<EbbId, Registered>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Why an Ebb could not be created or found.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum EbbError {
    /// The id names an Ebb already.
    #[error("{0} exists already")]
    Taken(EbbId),
    /// No Ebb has the id in this process.
    #[error("no Ebb {0}")]
    Unknown(EbbId),
    /// The id names an Ebb of another representative type.
    #[error("{0} has representatives of another type")]
    WrongType(EbbId),
    /// The id is dynamic, so it names the Ebb in this process only.
    #[error("{0} is not a static id (below {FIRST_DYNAMIC}): other components cannot name it")]
    NotStatic(EbbId),
}

impl<R: 'static> Ebb<R> {
    /// A new Ebb with a fresh id, whose representatives `factory` builds (once per core).
    pub fn new(name: &str, factory: impl Fn(Core) -> R + Send + Sync + 'static) -> Ebb<R> {
        let id = EbbId(NEXT_ID.fetch_add(1, Ordering::Relaxed));
        Ebb::with_id(id, name, factory).expect("fresh ids are never taken")
    }

    /// A new Ebb with a static id (below [`FIRST_DYNAMIC`]) or one handed out elsewhere.
    pub fn with_id(
        id: EbbId,
        name: &str,
        factory: impl Fn(Core) -> R + Send + Sync + 'static,
    ) -> Result<Ebb<R>, EbbError> {
        let mut reg = registry().lock().unwrap();
        reg.retain(|_, r| (r.info)().is_some());
        if reg.contains_key(&id) {
            return Err(EbbError::Taken(id));
        }
        let entry = Arc::new(Entry {
            id,
            name: name.to_string(),
            slot: NEXT_SLOT.fetch_add(1, Ordering::Relaxed),
            generation: AtomicU64::new(0),
            factory: RwLock::new(Arc::new(factory)),
            built: AtomicU64::new(0),
        });
        let e = Arc::downgrade(&entry);
        let info = Box::new(move || {
            e.upgrade().map(|e| EbbInfo {
                id: e.id,
                name: e.name.clone(),
                generation: e.generation.load(Ordering::Relaxed),
                built: e.built.load(Ordering::Relaxed),
            })
        });
        reg.insert(
            id,
            Registered {
                entry: Box::new(Arc::downgrade(&entry)),
                info,
            },
        );
        Ok(Ebb { entry })
    }

    /// The Ebb registered in this process under `id`, if its representatives are `R`.
    pub fn lookup(id: EbbId) -> Result<Ebb<R>, EbbError> {
        let reg = registry().lock().unwrap();
        let r = reg.get(&id).ok_or(EbbError::Unknown(id))?;
        let weak = r
            .entry
            .downcast_ref::<std::sync::Weak<Entry<R>>>()
            .ok_or(EbbError::WrongType(id))?;
        weak.upgrade().map(|entry| Ebb { entry }).ok_or(EbbError::Unknown(id))
    }

    pub fn id(&self) -> EbbId {
        self.entry.id
    }

    pub fn name(&self) -> &str {
        &self.entry.name
    }

    /// How many times [`Ebb::replace`] has swapped the miss handler.
    pub fn generation(&self) -> u64 {
        self.entry.generation.load(Ordering::Relaxed)
    }

    /// Representatives built so far, over all cores and generations.
    pub fn built(&self) -> u64 {
        self.entry.built.load(Ordering::Relaxed)
    }

    /// The calling core's representative, built on its first call.
    #[inline]
    pub fn rep(&self) -> Rc<R> {
        let gen = self.entry.generation.load(Ordering::Acquire);
        let slot = self.entry.slot;
        let hit = REPS.with(|t| match t.borrow().get(slot) {
            Some(Some((g, r))) if *g == gen => Some(r.clone()),
            _ => None,
        });
        match hit.map(|r| r.downcast::<R>()) {
            Some(Ok(r)) => r,
            _ => self.miss(gen),
        }
    }

    /// Calls `f` on the calling core's representative.
    #[inline]
    pub fn call<T>(&self, f: impl FnOnce(&R) -> T) -> T {
        f(&self.rep())
    }

    #[cold]
    fn miss(&self, gen: u64) -> Rc<R> {
        let factory = self.entry.factory.read().unwrap().clone();
        let rep = Rc::new(factory(Core::current()));
        self.entry.built.fetch_add(1, Ordering::Relaxed);
        crate::series::REP_MISSES.increment(1);
        let slot = self.entry.slot;
        REPS.with(|t| {
            let mut t = t.borrow_mut();
            if t.len() <= slot {
                t.resize_with(slot + 1, || None);
            }
            t[slot] = Some((gen, rep.clone() as Rc<dyn Any>));
        });
        rep
    }

    /// A representative built now by the current miss handler, for a user that keeps it
    /// itself rather than per thread: one whose calls are serialised already (a cache under its
    /// lock is one core to its policy). Such a user builds another after a [`Ebb::replace`].
    pub fn build(&self) -> R {
        let factory = self.entry.factory.read().unwrap().clone();
        self.entry.built.fetch_add(1, Ordering::Relaxed);
        factory(Core::current())
    }

    /// Replaces the miss handler while the system runs: every core builds a representative
    /// with `factory` at its next call (a call under way finishes on the old one). The old
    /// representatives are dropped as each core moves on; state they must hand over goes
    /// through the Ebb's shared root, which both factories hold.
    pub fn replace(&self, factory: impl Fn(Core) -> R + Send + Sync + 'static) {
        *self.entry.factory.write().unwrap() = Arc::new(factory);
        self.entry.generation.fetch_add(1, Ordering::Release);
        crate::series::REPLACEMENTS.increment(1);
        tracing::info!(ebb = %self.entry.id, name = %self.entry.name, generation = self.generation(), "Ebb replaced");
    }
}

/// Every Ebb of this process, by id.
pub fn list() -> Vec<EbbInfo> {
    let mut v: Vec<EbbInfo> = registry().lock().unwrap().values().filter_map(|r| (r.info)()).collect();
    v.sort_by_key(|i| i.id);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    struct Counter {
        core: Core,
        calls: Cell<u64>,
        tag: &'static str,
    }

    #[test]
    fn each_thread_gets_its_own_representative_built_once() {
        let e = Ebb::new("counter", |core| Counter {
            core,
            calls: Cell::new(0),
            tag: "a",
        });
        for _ in 0..10 {
            e.call(|r| r.calls.set(r.calls.get() + 1));
        }
        assert_eq!(e.rep().calls.get(), 10);
        assert_eq!(e.rep().core, Core::Hosted);
        assert_eq!(e.built(), 1);
        let e2 = e.clone();
        std::thread::spawn(move || assert_eq!(e2.rep().calls.get(), 0, "another thread's representative is its own"))
            .join()
            .unwrap();
        assert_eq!(e.built(), 2);
    }

    #[test]
    fn replacing_the_miss_handler_rebuilds_each_representative_at_its_next_call() {
        let e = Ebb::new("policy", |core| Counter {
            core,
            calls: Cell::new(0),
            tag: "old",
        });
        assert_eq!(e.rep().tag, "old");
        e.replace(|core| Counter {
            core,
            calls: Cell::new(0),
            tag: "new",
        });
        assert_eq!(e.generation(), 1);
        assert_eq!(e.rep().tag, "new");
        assert_eq!(e.built(), 2);
        assert_eq!(e.rep().tag, "new");
        assert_eq!(e.built(), 2, "built once per generation");
        assert_eq!(e.build().tag, "new", "a representative its user keeps");
        assert_eq!(e.built(), 3);
    }

    #[test]
    fn ebbs_are_found_by_id_and_type() {
        let e = Ebb::new("findme", |_| 7u32);
        assert_eq!(*Ebb::<u32>::lookup(e.id()).unwrap().rep(), 7);
        assert_eq!(Ebb::<u64>::lookup(e.id()).err(), Some(EbbError::WrongType(e.id())));
        assert_eq!(Ebb::<u32>::lookup(EbbId(3)).err(), Some(EbbError::Unknown(EbbId(3))));
        assert_eq!(
            Ebb::with_id(e.id(), "again", |_| 1u32).err(),
            Some(EbbError::Taken(e.id()))
        );
        assert!(list()
            .iter()
            .any(|i| i.id == e.id() && i.name == "findme" && i.built == 1));
        // Dropped everywhere (this thread's representative aside), it is gone.
        let id = e.id();
        drop(e);
        assert_eq!(Ebb::<u32>::lookup(id).err(), Some(EbbError::Unknown(id)));
        assert!(!list().iter().any(|i| i.id == id));
        Ebb::with_id(id, "again", |_| 2u32).expect("its id is free again");
    }
}
