//! A pComponent's policies as Ebbs (docs/ebb.md#policies-as-ebbs): the eviction policy and the
//! read-ahead policy are each an Ebb whose miss handler builds the policy the configuration (or
//! the last `G2P_SET_POLICY`) names. The ExCache is one core to them: every miss is serialised
//! by the miss path's lock, so it keeps the representative itself ([`Ebb::build`]) rather than
//! per thread. Replacing a policy while programs run replaces the Ebb's miss handler and puts
//! a representative built by the new one in the ExCache between two misses.
//!
//! A new policy implements [`EvictionPolicy`] (cache.rs) or [`Prefetcher`] (prefetch.rs) and
//! gets a name in its knob (`EvictPolicy`, `PrefetchPolicy` in config/pcomp.rs) and an arm in
//! [`eviction_policy`] or [`prefetcher`]: the configuration, the command line and the swap
//! then all know it.
use std::sync::Mutex;

use splitos_ebb::Ebb;

use super::cache::{eviction_policy, EvictionPolicy};
use super::miss::MissPath;
use super::prefetch::{prefetcher, Prefetcher};
use crate::config::{EvictPolicy, PrefetchPolicy};

pub struct Policies {
    pub eviction: Ebb<Box<dyn EvictionPolicy>>,
    pub prefetch: Ebb<Box<dyn Prefetcher>>,
    /// Replacements one at a time: an Ebb and the representative the ExCache holds change
    /// together.
    replacing: Mutex<()>,
}

impl Policies {
    /// The policies a pComponent starts with: `eviction` for a cache of `lines`, `prefetch`
    /// reading ahead at most `window` lines.
    pub fn new(eviction: EvictPolicy, lines: usize, prefetch: PrefetchPolicy, window: usize) -> Policies {
        Policies { eviction: Ebb::new("excache-eviction", move |_| eviction_policy(eviction, lines)), prefetch: Ebb::new("excache-prefetch", move |_| prefetcher(prefetch, window)), replacing: Mutex::new(()) }
    }

    /// Replaces the policies given (a cache now of `lines`) and puts them in `miss`'s place;
    /// returns the names in place.
    pub fn replace(&self, miss: &MissPath, eviction: Option<EvictPolicy>, prefetch: Option<PrefetchPolicy>, lines: usize, window: usize) -> (&'static str, &'static str) {
        let _one = self.replacing.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = eviction {
            self.eviction.replace(move |_| eviction_policy(k, lines));
            metrics::counter!("pcomp_policy_swaps_total", "policy" => "eviction").increment(1);
        }
        if let Some(k) = prefetch {
            self.prefetch.replace(move |_| prefetcher(k, window));
            metrics::counter!("pcomp_policy_swaps_total", "policy" => "prefetch").increment(1);
        }
        miss.replace_policies(eviction.map(|_| self.eviction.build()), prefetch.map(|_| self.prefetch.build()))
    }
}
