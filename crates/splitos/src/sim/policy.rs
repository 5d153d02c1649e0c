//! Placement policies: which unit of a pool takes an allocation. A policy scores a unit that
//! fits (lower is better) and bounds the score of any unit of a subtree from the subtree's
//! summary, which is all a new policy has to provide for the pool's search to stay fast.

use super::pool::{Amount, CPU, MEM, RES};

/// What a policy knows of a subtree of units: the first index it may offer, and per
/// resource the largest and smallest free and the smallest used amount of its units.
pub struct Bound<'a> {
    pub first: usize,
    pub max_free: &'a Amount,
    pub min_free: &'a Amount,
    pub min_used: &'a Amount,
}

pub trait Placement: Send + Sync {
    fn name(&self) -> &'static str;
    /// The score of unit `unit` with `free` of `cap`, which fits `want`; `weights` put the
    /// resources on one scale.
    fn score(&self, unit: usize, free: &Amount, cap: &Amount, want: &Amount, weights: &[f64; RES]) -> f64;
    /// A lower bound of the score of every unit in a subtree that fits `want`.
    fn bound(&self, sub: &Bound, want: &Amount, weights: &[f64; RES]) -> f64;
    /// Whether the policy packs (fills a unit before the next) rather than spreads: a
    /// packing policy places a task's memory in one piece where it can, a spreading one
    /// (GMM) each vRegion on its own.
    fn packs(&self) -> bool {
        false
    }
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

/// The unit left with the least free after the allocation (ThymesisFlow's policy): what
/// is left over, weighted so that CPU and memory count alike.
pub struct BestFit;

impl Placement for BestFit {
    fn name(&self) -> &'static str {
        "best-fit"
    }
    fn score(&self, _unit: usize, free: &Amount, _cap: &Amount, want: &Amount, w: &[f64; RES]) -> f64 {
        (0..RES).map(|r| w[r] * (free[r] - want[r]) as f64).sum()
    }
    fn bound(&self, sub: &Bound, want: &Amount, w: &[f64; RES]) -> f64 {
        (0..RES).map(|r| w[r] * sub.min_free[r].max(want[r]).saturating_sub(want[r]) as f64).sum()
    }
    fn packs(&self) -> bool {
        true
    }
}

/// The lowest-numbered unit that fits.
pub struct FirstFit;

impl Placement for FirstFit {
    fn name(&self) -> &'static str {
        "first-fit"
    }
    fn score(&self, unit: usize, _free: &Amount, _cap: &Amount, _want: &Amount, _w: &[f64; RES]) -> f64 {
        unit as f64
    }
    fn bound(&self, sub: &Bound, _want: &Amount, _w: &[f64; RES]) -> f64 {
        sub.first as f64
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

impl LeastLoaded {
    fn primary(w: &[f64; RES]) -> usize {
        if w[CPU] > 0.0 {
            CPU
        } else {
            MEM
        }
    }
}

impl Placement for LeastLoaded {
    fn name(&self) -> &'static str {
        "gpm-gmm"
    }
    fn score(&self, _unit: usize, free: &Amount, cap: &Amount, _want: &Amount, w: &[f64; RES]) -> f64 {
        let r = Self::primary(w);
        (cap[r] - free[r]) as f64
    }
    fn bound(&self, sub: &Bound, _want: &Amount, w: &[f64; RES]) -> f64 {
        sub.min_used[Self::primary(w)] as f64
    }
}

/// The unit with the most free memory: where a task's memory goes when it must be split
/// over several memory modules, so that it needs as few links as it can.
pub struct MostFree;

impl Placement for MostFree {
    fn name(&self) -> &'static str {
        "most-free"
    }
    fn score(&self, _unit: usize, free: &Amount, _cap: &Amount, _want: &Amount, _w: &[f64; RES]) -> f64 {
        -(free[MEM] as f64)
    }
    fn bound(&self, sub: &Bound, _want: &Amount, _w: &[f64; RES]) -> f64 {
        -(sub.max_free[MEM] as f64)
    }
}
