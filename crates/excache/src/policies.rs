//! A pComponent's policies as Ebbs (docs/ebb.md#policies-as-ebbs): the eviction policy and the
//! read-ahead policy are each an Ebb whose miss handler builds the policy the configuration (or
//! the last [`SetPolicy`]) names. The ExCache is one core to them: every miss is serialised
//! by the miss path's lock, so it keeps the representative itself ([`Ebb::build`]) rather than
//! per thread. Replacing a policy while programs run replaces the Ebb's miss handler and puts
//! a representative built by the new one in the ExCache between two misses.
//!
//! **Adding a policy is two entries**: implement [`EvictionPolicy`] (cache/eviction.rs) or
//! [`Prefetcher`] (prefetch.rs), here or in a file of its own; name it in [`EvictPolicy`] or
//! [`PrefetchPolicy`] (config/pcomp.rs) with a doc comment saying what it does; and say how its
//! miss handler builds it in the `match` of [`BuildEviction`] or [`BuildPrefetch`] below, which
//! the compiler asks for, as the `match` is exhaustive. The configuration, the command line and
//! the swap while running then all know it. The names are the configuration's, so that it and
//! the managers take them without importing the pComponent.
//!
//! Replacements arrive through the messenger: every pComponent serves the `excache-policies`
//! Ebb ([`splitos_rpc::EBB_EXCACHE_POLICIES`]), whose representative (pmon/policy_ebb.rs)
//! applies a [`splitos_rpc::SetPolicy`] message from the global managers or the admin's tools
//! ([`splitos_rpc::SetPolicy::ask`] sends one) through [`Policies::replace`].
use std::sync::Mutex;

use splitos_ebb::Ebb;

use super::cache::{Clock, EvictionPolicy, Fifo, GhostClock, Workingset};
use super::miss::MissPath;
use super::prefetch::{prefetcher, Leap, Prefetcher, Sequential};
use splitos_core::config::{EvictPolicy, PrefetchPolicy};

/// What each eviction policy's name ([`EvictPolicy`], in the configuration) builds: the miss
/// handler of the `excache-eviction` Ebb.
pub trait BuildEviction {
    /// `sampled`: the programs' touches of lines the policy asks to observe are seen (access
    /// sampling), not only their writes.
    fn build(self, lines: usize, sampled: bool) -> Box<dyn EvictionPolicy>;
}

impl BuildEviction for EvictPolicy {
    fn build(self, lines: usize, sampled: bool) -> Box<dyn EvictionPolicy> {
        match self {
            EvictPolicy::Fifo => Box::new(Fifo),
            EvictPolicy::Clock => Box::new(Clock),
            EvictPolicy::GhostClock => Box::new(GhostClock::new(lines)),
            EvictPolicy::Workingset => Box::new(Workingset::new(lines, sampled)),
        }
    }
}

/// What each read-ahead policy's name ([`PrefetchPolicy`], in the configuration) builds, reading
/// ahead at most `window` lines: the miss handler of the `excache-prefetch` Ebb.
pub trait BuildPrefetch {
    fn build(self, window: usize) -> Box<dyn Prefetcher>;
}

impl BuildPrefetch for PrefetchPolicy {
    fn build(self, window: usize) -> Box<dyn Prefetcher> {
        match self {
            PrefetchPolicy::Sequential => Box::new(Sequential::new(window, 0)),
            PrefetchPolicy::Nextline => Box::new(Sequential::new(window, 1)),
            PrefetchPolicy::Leap => Box::new(Leap::new(window)),
        }
    }
}

pub struct Policies {
    pub eviction: Ebb<Box<dyn EvictionPolicy>>,
    pub prefetch: Ebb<Box<dyn Prefetcher>>,
    /// Access sampling is on: replacements are built for it too.
    sampled: bool,
    /// Replacements one at a time: an Ebb and the representative the ExCache holds change
    /// together.
    replacing: Mutex<()>,
}

impl Policies {
    /// The policies a pComponent starts with: `eviction` for a cache of `lines` (`sampled`:
    /// with access sampling), `prefetch` reading ahead at most `window` lines.
    pub fn new(
        eviction: EvictPolicy,
        lines: usize,
        sampled: bool,
        prefetch: PrefetchPolicy,
        window: usize,
    ) -> Policies {
        Policies {
            eviction: Ebb::new("excache-eviction", move |_| eviction.build(lines, sampled)),
            prefetch: Ebb::new("excache-prefetch", move |_| prefetcher(prefetch, window)),
            sampled,
            replacing: Mutex::new(()),
        }
    }

    /// Replaces the policies given (a cache now of `lines`) and puts them in `miss`'s place;
    /// returns the names in place.
    pub fn replace(
        &self,
        miss: &MissPath,
        eviction: Option<EvictPolicy>,
        prefetch: Option<PrefetchPolicy>,
        lines: usize,
        window: usize,
    ) -> (&'static str, &'static str) {
        let _one = self.replacing.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = eviction {
            let sampled = self.sampled;
            self.eviction.replace(move |_| k.build(lines, sampled));
            crate::series::POLICY_SWAPS.with(["eviction"]).increment(1);
        }
        if let Some(k) = prefetch {
            self.prefetch.replace(move |_| prefetcher(k, window));
            crate::series::POLICY_SWAPS.with(["prefetch"]).increment(1);
        }
        miss.replace_policies(
            eviction.map(|_| self.eviction.build()),
            prefetch.map(|_| self.prefetch.build()),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitos_core::config::{EVICT_POLICIES, PREFETCH_POLICIES};

    /// Every name builds the policy it names: the name the configuration takes is the
    /// name the pComponent's statistics and `set-policy` report.
    #[test]
    fn every_registered_policy_builds_under_its_own_name() {
        for name in EVICT_POLICIES {
            assert_eq!(name.parse::<EvictPolicy>().unwrap().build(64, false).name(), *name);
        }
        for name in PREFETCH_POLICIES {
            assert_eq!(name.parse::<PrefetchPolicy>().unwrap().build(8).name(), *name);
        }
    }
}
