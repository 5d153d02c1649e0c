//! Placement policies: which unit of a pool takes an allocation. A policy is an order of
//! units, given by a key computed from a unit's own state (not from the request); the pool
//! takes the unit with the lowest key among those with room. That is all a new policy has
//! to provide for the pool's index to find its choice in about log(units).

use super::pool::{Amount, CPU, MEM, RES};

pub trait Placement: Send + Sync {
    /// The key of unit `unit` with `free` of `cap` (lower is preferred); `weights` put the
    /// resources on one scale (1 / the mean capacity).
    fn key(&self, unit: usize, free: &Amount, cap: &Amount, weights: &[f64; RES]) -> f64;
    /// Whether the policy packs (fills a unit before the next) rather than spreads: a
    /// packing policy places a task's memory in one piece where it can, a spreading one
    /// (GMM) each vRegion on its own.
    fn packs(&self) -> bool;
}

/// Names of the policies, as `--policy` takes them.
pub const POLICIES: [&str; 3] = ["best-fit", "first-fit", "gpm-gmm"];

pub fn by_name(name: &str) -> Result<Box<dyn Placement>, String> {
    match name {
        "best-fit" => Ok(Box::new(BestFit)),
        "first-fit" => Ok(Box::new(FirstFit)),
        "gpm-gmm" => Ok(Box::new(LeastLoaded)),
        other => Err(format!("unknown placement policy `{other}` (one of: {})", POLICIES.join(", "))),
    }
}

/// The unit with the least free (ThymesisFlow's policy), CPU and memory weighted alike: the
/// one left with the least after the allocation.
pub struct BestFit;

impl Placement for BestFit {
    fn key(&self, _unit: usize, free: &Amount, _cap: &Amount, w: &[f64; RES]) -> f64 {
        (0..RES).map(|r| w[r] * free[r] as f64).sum()
    }
    fn packs(&self) -> bool {
        true
    }
}

/// The lowest-numbered unit that fits.
pub struct FirstFit;

impl Placement for FirstFit {
    fn key(&self, unit: usize, _free: &Amount, _cap: &Amount, _w: &[f64; RES]) -> f64 {
        unit as f64
    }
    fn packs(&self) -> bool {
        true
    }
}

/// The project's global managers: GPM puts a process on the pComponent running the fewest
/// threads, GMM a vRegion on the least loaded mComponent with room (`gm/mod.rs`). Here that
/// is the unit using the least of the pool's first resource: CPU for servers and compute
/// modules, memory for memory modules. It spreads load, the opposite of packing.
pub struct LeastLoaded;

impl Placement for LeastLoaded {
    fn key(&self, _unit: usize, free: &Amount, cap: &Amount, w: &[f64; RES]) -> f64 {
        let r = if w[CPU] > 0.0 { CPU } else { MEM };
        (cap[r] - free[r]) as f64
    }
    fn packs(&self) -> bool {
        false
    }
}
