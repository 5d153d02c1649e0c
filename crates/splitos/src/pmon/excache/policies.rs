//! A pComponent's policies as Ebbs (docs/ebb.md#policies-as-ebbs): the eviction policy and the
//! read-ahead policy are each an Ebb whose miss handler builds the policy the configuration (or
//! the last [`SetPolicy`]) names. The ExCache is one core to them: every miss is serialised
//! by the miss path's lock, so it keeps the representative itself ([`Ebb::build`]) rather than
//! per thread. Replacing a policy while programs run replaces the Ebb's miss handler and puts
//! a representative built by the new one in the ExCache between two misses.
//!
//! **Adding a policy is one entry in this file**: implement [`EvictionPolicy`] (cache.rs) or
//! [`Prefetcher`] (prefetch.rs), here or in a file of its own, and register it below in
//! [`EvictPolicy`] or [`PrefetchPolicy`] with its name, a doc comment saying what it does and
//! how its miss handler builds it. The configuration, the command line and the swap while
//! running then all know it.
//!
//! Replacements arrive through the messenger: every pComponent serves the `excache-policies`
//! Ebb ([`EBB_EXCACHE_POLICIES`]), whose representative here applies a [`SetPolicy`] message
//! from the global managers or the admin's tools ([`ask`] sends one).
use std::sync::{Mutex, Weak};

use bytes::Bytes;
use splitos_ebb::messenger::{Messagable, Origin, Refused, Serving};
use splitos_ebb::{Ebb, EbbId};
use splitos_rpc::{ErrCode, PolicyState, Role, RpcError, SetPolicy, EBB_EXCACHE_POLICIES};

use super::cache::{Clock, EvictionPolicy, Fifo, GhostClock};
use super::miss::MissPath;
use super::prefetch::{prefetcher, Leap, Prefetcher, Sequential};
use crate::pmon::Pcomp;

splitos_rpc::knob_registry! {
    /// Which line of a full ExCache set a miss evicts.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum EvictPolicy, "policy", EVICT_POLICIES, fn build(lines: usize) -> Box<dyn EvictionPolicy> {
        /// The line installed first.
        #[default]
        Fifo = "fifo" => Box::new(Fifo),
        /// The first line not referenced since the hand last passed it (second chance).
        Clock = "clock" | "lru" => Box::new(Clock),
        /// CLOCK whose new lines start unreferenced unless they were evicted recently (ghost
        /// entries): lines used once leave first. Wants access_sampling = "unmap".
        GhostClock = "ghost-clock" => Box::new(GhostClock::new(lines)),
    }
}

splitos_rpc::knob_registry! {
    /// Which lines a remote miss reads ahead (docs/excache.md).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum PrefetchPolicy, "prefetch_policy", PREFETCH_POLICIES, fn build(window: usize) -> Box<dyn Prefetcher> {
        /// The next lines, only while a process's misses are sequential.
        Sequential = "sequential" => Box::new(Sequential::new(window, 0)),
        /// As `sequential`, and the next line of any remote miss.
        Nextline = "nextline" => Box::new(Sequential::new(window, 1)),
        /// Leap (ATC'20): the majority stride of the recent misses, with a window that grows
        /// while what it read ahead is used.
        #[default]
        Leap = "leap" => Box::new(Leap::new(window)),
    }
}

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
        Policies {
            eviction: Ebb::new("excache-eviction", move |_| eviction.build(lines)),
            prefetch: Ebb::new("excache-prefetch", move |_| prefetcher(prefetch, window)),
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
            self.eviction.replace(move |_| k.build(lines));
            metrics::counter!("pcomp_policy_swaps_total", "policy" => "eviction").increment(1);
        }
        if let Some(k) = prefetch {
            self.prefetch.replace(move |_| prefetcher(k, window));
            metrics::counter!("pcomp_policy_swaps_total", "policy" => "prefetch").increment(1);
        }
        miss.replace_policies(
            eviction.map(|_| self.eviction.build()),
            prefetch.map(|_| self.prefetch.build()),
        )
    }
}

/// The representative of the `excache-policies` Ebb on a pComponent.
struct PolicyMessages {
    pcomp: Weak<Pcomp>,
}

impl Messagable for PolicyMessages {
    fn receive(&self, from: &Origin, body: Bytes) -> Result<Bytes, Refused> {
        // The transport without credentials is built by benchmarks and tests alone.
        if from
            .role
            .as_deref()
            .is_some_and(|r| r != Role::Gm.name() && r != Role::Admin.name())
        {
            return Err(Refused::Denied(format!(
                "a {} may not replace a pComponent's policies",
                from.role.as_deref().unwrap_or("?")
            )));
        }
        let r: SetPolicy =
            postcard::from_bytes(&body).map_err(|e| Refused::Invalid(format!("not a SetPolicy message: {e}")))?;
        let pcomp = self
            .pcomp
            .upgrade()
            .ok_or_else(|| Refused::Invalid("the pComponent is stopping".into()))?;
        let now = pcomp.set_policy(r).map_err(|e| match e.code {
            ErrCode::Denied => Refused::Denied(e.msg),
            _ => Refused::Invalid(e.msg),
        })?;
        Ok(postcard::to_allocvec(&now).expect("a PolicyState encodes").into())
    }
}

/// Serves the `excache-policies` Ebb of `pcomp` until the guard is dropped.
pub fn serve(pcomp: Weak<Pcomp>) -> Serving {
    let ebb = Ebb::with_id(EbbId(EBB_EXCACHE_POLICIES), "excache-policies", move |_| {
        PolicyMessages { pcomp: pcomp.clone() }
    })
    .expect("one pComponent per process");
    splitos_ebb::messenger::serve(&ebb).expect("a static id served once")
}

/// Sends `r` to a pComponent's `excache-policies` representative through `send` and returns
/// its policies after it.
pub fn ask(send: impl FnOnce(Bytes) -> Result<Bytes, RpcError>, r: &SetPolicy) -> Result<PolicyState, RpcError> {
    let answer = send(postcard::to_allocvec(r).expect("a SetPolicy encodes").into())?;
    postcard::from_bytes(&answer).map_err(|e| RpcError::Remote {
        code: ErrCode::Internal,
        msg: format!("the pComponent's answer is not a PolicyState: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry entry builds the policy it names: the name the configuration takes is the
    /// name the pComponent's statistics and `set-policy` report.
    #[test]
    fn every_registered_policy_builds_under_its_own_name() {
        for name in EVICT_POLICIES {
            assert_eq!(name.parse::<EvictPolicy>().unwrap().build(64).name(), *name);
        }
        for name in PREFETCH_POLICIES {
            assert_eq!(name.parse::<PrefetchPolicy>().unwrap().build(8).name(), *name);
        }
    }
}
