//! Slots: what users other than root may hold at once of what the pComponent has a bounded
//! number of (connections waiting for their hello, runs, programs, a vNode's network calls).
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// Connections of one user that may wait for their hello at once, and of all users: each
/// holds a thread. A shim says hello within microseconds of its welcome, so only a burst of
/// forks comes near.
const WAITING_PER_USER: usize = 256;
const WAITING_TOTAL: usize = 1024;
/// Runs of one user that may be under way at once, and of all users: each launcher holds a
/// thread and the run's counters.
const RUNS_PER_USER: usize = 64;
const RUNS_TOTAL: usize = 1024;

/// What users other than root hold of something the pComponent has a bounded number of: in
/// all, and per share (a user's, or a vNode's for what a vNode's users hold together).
pub(crate) struct Slots<K: Hash + Eq = u32> {
    total: usize,
    per_share: HashMap<K, usize>,
    max_total: usize,
    max_per_share: usize,
}

/// Slots shared with the threads that hold them.
pub(crate) type SharedSlots<K = u32> = Arc<Mutex<Slots<K>>>;

impl<K: Hash + Eq> Slots<K> {
    pub(crate) fn new(max_total: usize, max_per_share: usize) -> SharedSlots<K> {
        Arc::new(Mutex::new(Slots {
            total: 0,
            per_share: HashMap::new(),
            max_total,
            max_per_share,
        }))
    }

    /// Slots held, by all users but root.
    pub(crate) fn held(&self) -> usize {
        self.total
    }

    /// Whether `uid` would be refused a slot of `share` now.
    pub(crate) fn full_for(&self, uid: u32, share: &K) -> bool {
        uid != 0
            && (self.total >= self.max_total || self.per_share.get(share).copied().unwrap_or(0) >= self.max_per_share)
    }
}

impl Slots {
    pub(crate) fn waiting() -> SharedSlots {
        Slots::new(WAITING_TOTAL, WAITING_PER_USER)
    }

    pub(crate) fn runs() -> SharedSlots {
        Slots::new(RUNS_TOTAL, RUNS_PER_USER)
    }
}

/// One slot, given back when dropped. Root's take none: root is never refused.
pub(crate) struct Slot<K: Hash + Eq = u32>(Option<(SharedSlots<K>, K)>);

impl<K: Hash + Eq> Drop for Slot<K> {
    fn drop(&mut self) {
        let Some((slots, share)) = self.0.take() else { return };
        let mut w = slots.lock().unwrap();
        w.total -= 1;
        if let Some(n) = w.per_share.get_mut(&share) {
            *n -= 1;
            if *n == 0 {
                w.per_share.remove(&share);
            }
        }
    }
}

/// A slot of `share` for `uid`, if there is room.
pub(crate) fn take_slot<K: Hash + Eq + Clone>(slots: &SharedSlots<K>, uid: u32, share: K) -> Option<Slot<K>> {
    if uid == 0 {
        return Some(Slot(None));
    }
    let mut w = slots.lock().unwrap();
    if w.full_for(uid, &share) {
        return None;
    }
    w.total += 1;
    *w.per_share.entry(share.clone()).or_insert(0) += 1;
    Some(Slot(Some((slots.clone(), share))))
}
