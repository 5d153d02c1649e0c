//! The simulator's names for the placement policies (`--policy`); the policies themselves are
//! the global managers' (`splitos_core::placement`). `gpm-gmm` is their default, least loaded.

use splitos_core::placement::{BestFit, FirstFit, LeastLoaded, Placement};

/// Names of the policies, as `--policy` takes them.
pub const POLICIES: [&str; 3] = ["best-fit", "first-fit", "gpm-gmm"];

pub fn by_name(name: &str) -> Result<Box<dyn Placement>, String> {
    match name {
        "best-fit" => Ok(Box::new(BestFit)),
        "first-fit" => Ok(Box::new(FirstFit)),
        "gpm-gmm" => Ok(Box::new(LeastLoaded)),
        other => Err(format!(
            "unknown placement policy `{other}` (one of: {})",
            POLICIES.join(", ")
        )),
    }
}
