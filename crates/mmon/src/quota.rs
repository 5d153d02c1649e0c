//! vNodes' memory quotas (`[[vnode]] memory`). GMM makes one mComponent the home of every
//! process of a vNode with a quota, so that home sees all the memory the vNode maps and alone
//! decides: each process is charged what it has mapped writable (as strict overcommit charges
//! mappings), and a change that would take its vNode past the quota (mmap, mprotect to
//! writable, mremap growing, fork) is refused with ENOMEM before anything is done. A program
//! so learns it is out of memory where it asks for memory (malloc returns NULL), and no
//! program of another vNode is touched.
//!
//! A change reserves its growth first ([`Ledger::reserve`]) and settles to what the process
//! maps after it, done or failed ([`Ledger::settle`]): concurrent changes of a vNode's
//! processes never overrun the quota together.
use std::collections::BTreeMap;
use std::sync::Mutex;

use splitos_rpc::{ErrCode, Refuse};

#[derive(Default)]
struct VnodeMemory {
    quota: Option<u64>,
    /// Bytes its processes homed here map writable, and reservations of changes under way.
    used: u64,
    /// Changes refused for the quota.
    refused: u64,
}

/// A change refused because it would take its vNode past its memory quota.
#[derive(Debug, thiserror::Error)]
#[error("vNode {vnode} is at its memory quota: {used} of {quota} bytes mapped writable, {more} more asked")]
pub(super) struct OverQuota {
    vnode: String,
    used: u64,
    quota: u64,
    more: u64,
}

impl Refuse for OverQuota {
    fn code(&self) -> ErrCode {
        ErrCode::NoMemory
    }
}

#[derive(Default)]
pub(super) struct Ledger {
    vnodes: Mutex<BTreeMap<String, VnodeMemory>>,
}

impl Ledger {
    /// Reserves `more` bytes of `vnode`'s quota for a change about to be made; refused when
    /// that would take the vNode past `quota`.
    pub(super) fn reserve(&self, vnode: &str, quota: Option<u64>, more: u64) -> Result<(), OverQuota> {
        let mut all = self.vnodes.lock().unwrap();
        let v = all.entry(vnode.to_string()).or_default();
        v.quota = quota;
        // A change that takes nothing more (an unmap, a protection that adds no writable byte)
        // is never refused, even for a vNode already past a quota lowered under it: the
        // pComponent answers such changes before they reach here.
        if let Some(q) = quota.filter(|q| more > 0 && v.used.saturating_add(more) > *q) {
            v.refused += 1;
            crate::series::VNODE_MEMORY_REFUSED
                .with([vnode.to_string()])
                .increment(1);
            static OVER: splitos_rpc::refusals::Refusals =
                splitos_rpc::refusals::Refusals::new("refused a mapping past its vNode's memory quota");
            if OVER.log_this(format_args!("vNode {vnode}")) {
                tracing::info!(
                    vnode,
                    used = v.used,
                    quota = q,
                    more,
                    "refused a mapping past its vNode's memory quota"
                );
            }
            return Err(OverQuota {
                vnode: vnode.to_string(),
                used: v.used,
                quota: q,
                more,
            });
        }
        v.used += more;
        Ok(())
    }

    /// A change reserved `reserved` bytes for a process charged `before`, which after it maps
    /// `after` writable.
    pub(super) fn settle(&self, vnode: &str, reserved: u64, before: u64, after: u64) {
        let mut all = self.vnodes.lock().unwrap();
        let v = all.entry(vnode.to_string()).or_default();
        v.used = (v.used + after).saturating_sub(reserved + before);
        crate::series::VNODE_MEMORY_BYTES
            .with([vnode.to_string()])
            .set(v.used as f64);
    }

    /// Per vNode: `used`, `quota` and `refused`, as `cluster status --json` shows them.
    pub(super) fn stats(&self) -> serde_json::Value {
        let all = self.vnodes.lock().unwrap();
        all.iter()
            .map(|(name, v)| {
                (
                    name.clone(),
                    serde_json::json!({"used": v.used, "quota": v.quota, "refused": v.refused}),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// Sets the quota gauges the metrics export.
    pub(super) fn export(&self) {
        for (name, v) in self.vnodes.lock().unwrap().iter() {
            crate::series::VNODE_MEMORY_BYTES
                .with([name.clone()])
                .set(v.used as f64);
            if let Some(q) = v.quota {
                crate::series::VNODE_MEMORY_QUOTA_BYTES
                    .with([name.clone()])
                    .set(q as f64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vnode_gets_no_more_than_its_quota_and_others_are_not_charged_for_it() {
        let l = Ledger::default();
        l.reserve("a", Some(100), 60).unwrap();
        l.settle("a", 60, 0, 60);
        assert_eq!(l.reserve("a", Some(100), 41).unwrap_err().used, 60);
        l.reserve("b", None, 1000).unwrap();
        l.reserve("a", Some(100), 40).unwrap();
        // The change failed: the reservation is returned.
        l.settle("a", 40, 60, 60);
        l.settle("a", 0, 60, 0);
        l.reserve("a", Some(100), 100).unwrap();
        let s = l.stats();
        assert_eq!(
            (
                s["a"]["used"].as_u64(),
                s["a"]["quota"].as_u64(),
                s["a"]["refused"].as_u64()
            ),
            (Some(100), Some(100), Some(1))
        );
    }
}
