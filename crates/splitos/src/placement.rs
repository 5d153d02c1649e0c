//! Placement policies: which of several units takes an allocation. The global managers place
//! processes on pComponents (GPM) and homes and vRegions on mComponents (GMM) with the one
//! `[cluster] placement` names; the datacenter simulator (`sim/`) places tasks on servers and
//! modules with the one its `--policy` names.
//!
//! A policy is an order of units, given by a key computed from a unit's own state (not from
//! the request): the placer takes the unit with the lowest key among those with room, ties to
//! the unit that comes first. That is all a new policy has to provide; it is also what lets
//! the simulator's pool keep its units indexed in the policy's order and find its choice in
//! about log(units).
//!
//! Where the storage of a vNode or the buffer cache of a file goes is not a policy: those
//! placements must come out the same on every pComponent and after a restart of the global
//! managers, which rendezvous hashing gives (`gm/mod.rs`).

use crate::config::PlacementPolicy;

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
        unit.free.iter().zip(unit.weights).map(|(free, w)| w * *free as f64).sum()
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

impl PlacementPolicy {
    /// The rule a configuration names.
    pub fn rule(self) -> &'static dyn Placement {
        match self {
            PlacementPolicy::LeastLoaded => &LeastLoaded,
            PlacementPolicy::BestFit => &BestFit,
            PlacementPolicy::FirstFit => &FirstFit,
            PlacementPolicy::Nearest => &Nearest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units as (free, load), numbered in order; one resource.
    fn choice(policy: PlacementPolicy, units: &[(u64, f64)]) -> usize {
        let keys: Vec<f64> = units.iter().enumerate().map(|(index, (free, load))| policy.rule().key(&Unit { index, free: &[*free], weights: &[1.0], load: *load })).collect();
        (0..units.len()).min_by(|a, b| keys[*a].total_cmp(&keys[*b])).unwrap()
    }

    #[test]
    fn least_loaded_takes_the_unit_with_the_lowest_load() {
        assert_eq!(choice(PlacementPolicy::LeastLoaded, &[(10, 3.0), (5, 1.0), (20, 2.0)]), 1);
        assert_eq!(choice(PlacementPolicy::LeastLoaded, &[(10, 1.0), (5, 1.0)]), 0, "ties go to the first");
        assert!(!PlacementPolicy::LeastLoaded.rule().packs());
    }

    #[test]
    fn best_fit_takes_the_unit_with_the_least_free() {
        assert_eq!(choice(PlacementPolicy::BestFit, &[(10, 0.0), (5, 9.0), (20, 1.0)]), 1);
        assert!(PlacementPolicy::BestFit.rule().packs());
        // Resources weighted to one scale: 4 of 8 CPUs free weighs as much as 512 of 1024 MiB.
        let key = |free: [u64; 2]| BestFit.key(&Unit { index: 0, free: &free, weights: &[1.0 / 8.0, 1.0 / 1024.0], load: 0.0 });
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

    #[test]
    fn policies_are_named_as_the_configuration_names_them() {
        for name in crate::config::PLACEMENT_POLICIES {
            assert_eq!(name.parse::<PlacementPolicy>().unwrap().to_string(), *name);
        }
        assert_eq!(PlacementPolicy::default(), PlacementPolicy::LeastLoaded);
        let err = "worst-fit".parse::<PlacementPolicy>().unwrap_err();
        assert!(err.contains("placement") && err.contains("least-loaded, best-fit, first-fit, nearest"), "{err}");
    }
}
