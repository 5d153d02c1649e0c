//! The simulator places with the global managers' policies (`splitos_core::placement`), under
//! the names `[cluster] placement` gives them: `--placement` takes the same names.

use splitos_core::config::PlacementPolicy;
use splitos_core::placement::Placement;

/// The policies the simulator places with: all but those that order units by hops on the
/// managers' topology graph, which its units are not on (its racks confine memory instead).
pub const PLACEMENTS: [PlacementPolicy; 3] = [
    PlacementPolicy::LeastLoaded,
    PlacementPolicy::BestFit,
    PlacementPolicy::FirstFit,
];

pub fn rule(placement: PlacementPolicy) -> Result<&'static dyn Placement, super::model::SpecError> {
    if PLACEMENTS.contains(&placement) {
        Ok(placement.rule())
    } else {
        Err(super::model::SpecError::Placement(placement))
    }
}
