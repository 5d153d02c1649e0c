//! Placement policies: which of several units takes an allocation. The global managers place
//! processes on pComponents (GPM) and homes and vRegions on mComponents (GMM) with the one
//! `[cluster] placement` names; the datacenter simulator (`sim/`) places tasks on servers and
//! modules with the one its `--placement` names.
//!
//! A policy is an order of units, given by a key computed from a unit's own state (not from
//! the request): the placer takes the unit with the lowest key among those with room, ties to
//! the unit that comes first. That is all a new policy has to provide; it is also what lets
//! the simulator's pool keep its units indexed in the policy's order and find its choice in
//! about log(units).
//!
//! The global managers' policy is an Ebb ([`Placements`]): the admin replaces it while the
//! cluster runs (`splitos cluster set-placement`), through the messenger.
//!
//! Where the storage of a vNode or the buffer cache of a file goes is not a policy: those
//! placements must come out the same on every pComponent and after a restart of the global
//! managers, which rendezvous hashing gives (`gm/mod.rs`).

use bytes::Bytes;
use splitos_ebb::messenger::{Messagable, Origin, Refused, Serving};
use splitos_ebb::{Ebb, EbbId};
use splitos_rpc::knob::UnknownName;
use splitos_rpc::{ErrCode, PlacementState, Refuse, Role, SetPlacement, EBB_PLACEMENT};

use crate::config::PlacementPolicy;
use crate::state::{Store, Table};

/// What a policy sees of a unit.
pub struct Unit<'a> {
    /// Where the unit comes in the placer's order (the simulator's unit number; the order in
    /// which components registered with the global managers).
    pub index: usize,
    /// What the unit has free, per resource the placer counts.
    pub free: &'a [u64],
    /// Weights that put those resources on one scale (1 / their mean capacity), one per
    /// resource; zero for a resource that only limits and is not compared.
    pub weights: &'a [f64],
    /// How loaded the unit is, by the placer's own measure (higher is busier): the threads
    /// of a pComponent, the share of an mComponent's memory taken, the CPU or memory a
    /// simulated unit uses.
    pub load: f64,
}

pub trait Placement: Send + Sync {
    /// The unit's key: lower is preferred.
    fn key(&self, unit: &Unit) -> f64;
    /// Whether the policy packs (fills a unit before the next) rather than spreads: a
    /// packing policy places a task's memory in one piece where it can, a spreading one each
    /// vRegion on its own.
    fn packs(&self) -> bool;
    /// Whether units nearer the asker come first, whatever their keys: the placer orders
    /// them by hops on the topology graph (`crate::topology`) from the component the
    /// allocation is for, then by key.
    fn near_first(&self) -> bool {
        false
    }
}

/// The least loaded unit: what the global managers have always done (the pComponent running
/// the fewest threads, the mComponent with the smallest share of its memory taken). It
/// spreads load, the opposite of packing.
pub struct LeastLoaded;

impl Placement for LeastLoaded {
    fn key(&self, unit: &Unit) -> f64 {
        unit.load
    }
    fn packs(&self) -> bool {
        false
    }
}

/// The unit with the least free, its resources weighted alike (ThymesisFlow's policy): the one
/// left with the least after the allocation.
pub struct BestFit;

impl Placement for BestFit {
    fn key(&self, unit: &Unit) -> f64 {
        unit.free
            .iter()
            .zip(unit.weights)
            .map(|(free, w)| w * *free as f64)
            .sum()
    }
    fn packs(&self) -> bool {
        true
    }
}

/// The unit the fewest hops away from the asker, then the least loaded of those: the path
/// search of ThymesisFlow's control plane, which reserves the shortest path for each request.
/// Memory of the pComponent's own host comes first, then that of other hosts.
pub struct Nearest;

impl Placement for Nearest {
    fn key(&self, unit: &Unit) -> f64 {
        unit.load
    }
    fn packs(&self) -> bool {
        false
    }
    fn near_first(&self) -> bool {
        true
    }
}

/// The first unit that fits.
pub struct FirstFit;

impl Placement for FirstFit {
    fn key(&self, unit: &Unit) -> f64 {
        unit.index as f64
    }
    fn packs(&self) -> bool {
        true
    }
}

/// What each placement policy's name ([`PlacementPolicy`], in the configuration) places with.
/// A new policy implements [`Placement`], is named in config/gm.rs, and is given here: the
/// configuration, the command line and `cluster set-placement` then know it.
impl PlacementPolicy {
    pub fn rule(self) -> &'static dyn Placement {
        match self {
            PlacementPolicy::LeastLoaded => &LeastLoaded,
            PlacementPolicy::BestFit => &BestFit,
            PlacementPolicy::FirstFit => &FirstFit,
            PlacementPolicy::Nearest => &Nearest,
        }
    }
}

/// The global managers' placement policy, as an Ebb whose representative on each thread is
/// the policy that thread places with; a replacement reaches each thread at its next
/// placement. Its messages ([`EBB_PLACEMENT`]) are served while this lives.
pub struct Placements {
    rule: Ebb<PlacementPolicy>,
    store: Store,
    _messages: Serving,
}

/// The policy the admin put in place, kept in the managers' state so that it outlives them.
const PLACEMENT: Table = Table("placement");

impl Placements {
    /// The placements of the global managers of this process: the policy the admin last put
    /// in place, kept in `store`, or else `configured`.
    pub fn new(configured: PlacementPolicy, store: Store) -> anyhow::Result<Placements> {
        let kept = store
            .load::<String>(PLACEMENT)?
            .into_iter()
            .next()
            .map(|name| name.parse::<PlacementPolicy>())
            .transpose()
            .map_err(|e| anyhow::anyhow!("the managers' state: {e}"))?;
        let initial = kept.unwrap_or(configured);
        let rule = Ebb::new("placement-rule", move |_| initial);
        let (r, s) = (rule.clone(), store.clone());
        let control = Ebb::with_id(EbbId(EBB_PLACEMENT), "placement", move |_| PlacementMessages {
            rule: r.clone(),
            store: s.clone(),
        })
        .expect("one global managers per process");
        let messages = splitos_ebb::messenger::serve(&control).expect("a static id served once");
        Ok(Placements {
            rule,
            store,
            _messages: messages,
        })
    }

    /// The policy in place.
    pub fn now(&self) -> PlacementPolicy {
        *self.rule.rep()
    }

    /// The rule of the policy in place.
    pub fn rule(&self) -> &'static dyn Placement {
        self.now().rule()
    }

    /// How many times the policy was replaced.
    pub fn swaps(&self) -> u64 {
        self.rule.generation()
    }

    /// Replaces the policy with the one `name` names (none: only reads it), as the
    /// `placement` Ebb's message does; the policy then.
    pub fn set(&self, name: Option<String>) -> Result<PlacementState, PlacementError> {
        replace(&self.rule, &self.store, name)
    }
}

/// Why the placement policy was not replaced.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error(transparent)]
    Unknown(#[from] UnknownName),
    #[error("cannot keep the placement policy: {0}")]
    Keep(anyhow::Error),
}

/// Either is the asker's to fix (a name, or asking the leader), as it always was refused.
impl Refuse for PlacementError {
    fn code(&self) -> ErrCode {
        ErrCode::Invalid
    }
}

/// Puts the policy `name` names in place of `rule`'s (none: only reads it), kept in `store`
/// first: a manager that may no longer write its state changes nothing.
fn replace(rule: &Ebb<PlacementPolicy>, store: &Store, name: Option<String>) -> Result<PlacementState, PlacementError> {
    if let Some(name) = name {
        let k: PlacementPolicy = name.parse()?;
        store
            .put(PLACEMENT, "policy", Some(&k.to_string()))
            .map_err(PlacementError::Keep)?;
        let before = *rule.rep();
        rule.replace(move |_| k);
        crate::series::GM_PLACEMENT_SWAPS.increment(1);
        tracing::info!(from = %before, to = %k, "placement policy replaced");
    }
    Ok(PlacementState {
        placement: rule.rep().to_string(),
        swaps: rule.generation(),
    })
}

/// The representative of the `placement` Ebb on the global managers.
struct PlacementMessages {
    rule: Ebb<PlacementPolicy>,
    store: Store,
}

impl Messagable for PlacementMessages {
    fn receive(&self, from: &Origin, body: Bytes) -> Result<Bytes, Refused> {
        if from.role.as_deref().is_some_and(|r| r != Role::Admin.name()) {
            return Err(Refused::Denied(format!(
                "a {} may not replace the placement policy",
                from.role.as_deref().unwrap_or("?")
            )));
        }
        let r: SetPlacement =
            postcard::from_bytes(&body).map_err(|e| Refused::Invalid(format!("not a SetPlacement message: {e}")))?;
        let now = replace(&self.rule, &self.store, r.placement).map_err(|e| Refused::Invalid(e.to_string()))?;
        Ok(postcard::to_allocvec(&now).expect("a PlacementState encodes").into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units as (free, load), numbered in order; one resource.
    fn choice(policy: PlacementPolicy, units: &[(u64, f64)]) -> usize {
        let keys: Vec<f64> = units
            .iter()
            .enumerate()
            .map(|(index, (free, load))| {
                policy.rule().key(&Unit {
                    index,
                    free: &[*free],
                    weights: &[1.0],
                    load: *load,
                })
            })
            .collect();
        (0..units.len()).min_by(|a, b| keys[*a].total_cmp(&keys[*b])).unwrap()
    }

    #[test]
    fn least_loaded_takes_the_unit_with_the_lowest_load() {
        assert_eq!(
            choice(PlacementPolicy::LeastLoaded, &[(10, 3.0), (5, 1.0), (20, 2.0)]),
            1
        );
        assert_eq!(
            choice(PlacementPolicy::LeastLoaded, &[(10, 1.0), (5, 1.0)]),
            0,
            "ties go to the first"
        );
        assert!(!PlacementPolicy::LeastLoaded.rule().packs());
    }

    #[test]
    fn best_fit_takes_the_unit_with_the_least_free() {
        assert_eq!(choice(PlacementPolicy::BestFit, &[(10, 0.0), (5, 9.0), (20, 1.0)]), 1);
        assert!(PlacementPolicy::BestFit.rule().packs());
        // Resources weighted to one scale: 4 of 8 CPUs free weighs as much as 512 of 1024 MiB.
        let key = |free: [u64; 2]| {
            BestFit.key(&Unit {
                index: 0,
                free: &free,
                weights: &[1.0 / 8.0, 1.0 / 1024.0],
                load: 0.0,
            })
        };
        assert_eq!(key([4, 512]), 1.0);
        assert!(key([1, 100]) < key([4, 0]));
    }

    #[test]
    fn first_fit_takes_the_first_unit_whatever_their_state() {
        assert_eq!(choice(PlacementPolicy::FirstFit, &[(10, 5.0), (5, 1.0), (1, 0.0)]), 0);
        assert!(PlacementPolicy::FirstFit.rule().packs());
    }

    #[test]
    fn nearest_asks_the_placer_for_hops_first_then_orders_as_least_loaded() {
        assert!(PlacementPolicy::Nearest.rule().near_first());
        assert_eq!(choice(PlacementPolicy::Nearest, &[(10, 3.0), (5, 1.0)]), 1);
        assert!(!PlacementPolicy::LeastLoaded.rule().near_first() && !PlacementPolicy::BestFit.rule().near_first());
    }

    /// The managers' `placement` Ebb, as a message reaches it: the admin replaces the policy,
    /// and every thread places with the new one from its next placement; others are refused.
    #[test]
    fn the_placement_ebb_is_replaced_by_the_admin_alone_and_reaches_every_thread() {
        use splitos_ebb::messenger::{deliver, Undelivered};
        let p = std::sync::Arc::new(Placements::new(PlacementPolicy::LeastLoaded, Store::default()).unwrap());
        // A thread that places, before and after the swap: its representative is built once,
        // then rebuilt.
        let (ask_tx, ask_rx) = std::sync::mpsc::channel::<()>();
        let (now_tx, now_rx) = std::sync::mpsc::channel();
        let p2 = p.clone();
        let placer = std::thread::spawn(move || ask_rx.iter().for_each(|_| now_tx.send(p2.now()).unwrap()));
        let elsewhere = || {
            ask_tx.send(()).unwrap();
            now_rx.recv().unwrap()
        };
        assert_eq!(
            (p.now(), elsewhere(), p.swaps()),
            (PlacementPolicy::LeastLoaded, PlacementPolicy::LeastLoaded, 0)
        );
        let from = |role: &str| Origin {
            role: Some(role.into()),
        };
        let body = |name: Option<&str>| {
            Bytes::from(
                postcard::to_allocvec(&SetPlacement {
                    placement: name.map(Into::into),
                })
                .unwrap(),
            )
        };
        let answer = deliver(EbbId(EBB_PLACEMENT), &from("admin"), body(Some("first-fit"))).unwrap();
        let now: PlacementState = postcard::from_bytes(&answer).unwrap();
        assert_eq!((now.placement.as_str(), now.swaps), ("first-fit", 1));
        assert_eq!(p.now(), PlacementPolicy::FirstFit);
        assert!(p.rule().packs());
        assert_eq!(
            elsewhere(),
            PlacementPolicy::FirstFit,
            "the placing thread's representative is rebuilt"
        );
        for (who, b) in [
            ("pcomponent", body(Some("best-fit"))),
            ("global-managers", body(Some("best-fit"))),
        ] {
            assert!(
                matches!(
                    deliver(EbbId(EBB_PLACEMENT), &from(who), b),
                    Err(Undelivered::Refused(Refused::Denied(_)))
                ),
                "{who}"
            );
        }
        assert!(matches!(
            deliver(EbbId(EBB_PLACEMENT), &from("admin"), Bytes::from_static(&[0xff; 7])),
            Err(Undelivered::Refused(Refused::Invalid(_)))
        ));
        let Err(Undelivered::Refused(Refused::Invalid(why))) =
            deliver(EbbId(EBB_PLACEMENT), &from("admin"), body(Some("worst-fit")))
        else {
            panic!("an unknown name")
        };
        assert!(why.contains("least-loaded, best-fit"), "{why}");
        assert_eq!(
            (p.now(), p.swaps()),
            (PlacementPolicy::FirstFit, 1),
            "nothing refused changed it"
        );
        drop(ask_tx);
        placer.join().unwrap();
    }

    #[test]
    fn policies_are_named_as_the_configuration_names_them() {
        for name in crate::config::PLACEMENT_POLICIES {
            assert_eq!(name.parse::<PlacementPolicy>().unwrap().to_string(), *name);
        }
        assert_eq!(PlacementPolicy::default(), PlacementPolicy::LeastLoaded);
        let err = "worst-fit".parse::<PlacementPolicy>().unwrap_err().to_string();
        assert!(
            err.contains("placement") && err.contains("least-loaded, best-fit, first-fit, nearest"),
            "{err}"
        );
    }
}
