//! What each vNode takes of this mComponent's memory, and the room kept for vNodes with a
//! memory quota, so that no other vNode can take it.
//!
//! A vNode's share is what its processes' pages hold here, or what their writable mappings
//! were promised (strict overcommit), whichever is more, or, if more still, what is kept for
//! it: its quota, on the mComponent that is its home (the global managers name the quotas each
//! mComponent keeps, `G2X_BEAT.keep`) and on every mComponent holding some of its processes'
//! vRegions (their home names the quota with their mappings, `M2M_VMA_ADD.quota`). The sum of
//! the shares never goes past the capacity by a page or a promise: a vNode grows within what is
//! kept for it whatever the others took, and beyond it only into what nobody took or kept.
//! A vNode kept room for after others had taken it (a quota made while the memory was full)
//! grows within it as they give theirs back.
use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Default, Clone, Copy)]
struct Share {
    /// Bytes of pages, parity rows and socket buffers held for the vNode's processes.
    pages: u64,
    /// Bytes of writable mappings promised to them (strict overcommit).
    committed: u64,
    /// Its quota, kept because this mComponent is its home.
    home: u64,
    /// Its quota, kept while this mComponent holds `holders` of its processes.
    quota: u64,
    holders: u32,
}

impl Share {
    fn kept(&self) -> u64 {
        self.home.max(if self.holders > 0 { self.quota } else { 0 })
    }

    fn taken(&self) -> u64 {
        self.pages.max(self.committed).max(self.kept())
    }
}

#[derive(Default)]
struct Inner {
    vnodes: HashMap<String, Share>,
    /// Sums over the vNodes: pages, promises, and each one's share.
    used: u64,
    committed: u64,
    taken: u64,
}

pub(super) struct Room {
    capacity: u64,
    inner: Mutex<Inner>,
}

/// What grows: pages held or mappings promised.
#[derive(Clone, Copy)]
enum Grow {
    Pages,
    Committed,
}

impl Room {
    pub fn new(capacity: u64) -> Room {
        Room {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Applies `f` to `vnode`'s share and keeps the sums.
    fn change(inner: &mut Inner, vnode: &str, f: impl FnOnce(&mut Share)) {
        let s = inner.vnodes.entry(vnode.to_string()).or_default();
        let before = *s;
        f(s);
        let after = *s;
        if after.pages == 0 && after.committed == 0 && after.home == 0 && after.holders == 0 {
            inner.vnodes.remove(vnode);
        }
        inner.used = inner.used + after.pages - before.pages;
        inner.committed = inner.committed + after.committed - before.committed;
        inner.taken = inner.taken + after.taken() - before.taken();
    }

    /// Grows `vnode`'s pages or promises by `bytes` if they fit: within what is kept for it
    /// (if its pages or promises still fit in the capacity), or into what no vNode took or
    /// kept.
    fn grow(&self, vnode: &str, bytes: u64, what: Grow) -> bool {
        let mut inner = self.inner.lock().unwrap();
        let s = inner.vnodes.get(vnode).copied().unwrap_or_default();
        let (mine, all) = match what {
            Grow::Pages => (s.pages, inner.used),
            Grow::Committed => (s.committed, inner.committed),
        };
        let mut grown = s;
        match what {
            Grow::Pages => grown.pages += bytes,
            Grow::Committed => grown.committed += bytes,
        }
        let taken = inner.taken - s.taken() + grown.taken();
        let kept_for_it = mine + bytes <= s.kept() && all + bytes <= self.capacity;
        if taken > self.capacity && !kept_for_it {
            return false;
        }
        Room::change(&mut inner, vnode, |s| *s = grown);
        true
    }

    /// A new page (`bytes` of them) of `vnode`, if it fits.
    pub fn take_pages(&self, vnode: &str, bytes: u64) -> bool {
        self.grow(vnode, bytes, Grow::Pages)
    }

    /// Pages held whatever the room: within a promise (strict), copies a rebuild makes, parity.
    pub fn add_pages(&self, vnode: &str, bytes: u64) {
        Room::change(&mut self.inner.lock().unwrap(), vnode, |s| s.pages += bytes);
    }

    pub fn free_pages(&self, vnode: &str, bytes: u64) {
        Room::change(&mut self.inner.lock().unwrap(), vnode, |s| {
            s.pages = s.pages.saturating_sub(bytes)
        });
    }

    /// A promise of `bytes` to a writable mapping of `vnode` (strict overcommit), if it fits.
    pub fn commit(&self, vnode: &str, bytes: u64) -> bool {
        self.grow(vnode, bytes, Grow::Committed)
    }

    pub fn uncommit(&self, vnode: &str, bytes: u64) {
        Room::change(&mut self.inner.lock().unwrap(), vnode, |s| {
            s.committed = s.committed.saturating_sub(bytes)
        });
    }

    /// This mComponent holds one more process of `vnode`, whose quota is `quota`: that much is
    /// kept for the vNode while it holds any.
    pub fn hold(&self, vnode: &str, quota: u64) {
        Room::change(&mut self.inner.lock().unwrap(), vnode, |s| {
            s.holders += 1;
            s.quota = s.quota.max(quota);
        });
    }

    /// It holds one process of `vnode` less.
    pub fn unhold(&self, vnode: &str) {
        Room::change(&mut self.inner.lock().unwrap(), vnode, |s| {
            s.holders = s.holders.saturating_sub(1);
            if s.holders == 0 {
                s.quota = 0;
            }
        });
    }

    /// The quotas of the vNodes this mComponent is home of, as the global managers last said:
    /// kept from now on, and no other's any more.
    pub fn keep_homes(&self, keep: &[(String, u64)]) {
        let mut inner = self.inner.lock().unwrap();
        let gone: Vec<String> = inner
            .vnodes
            .iter()
            .filter(|(v, s)| s.home > 0 && !keep.iter().any(|(k, _)| k == *v))
            .map(|(v, _)| v.clone())
            .collect();
        for v in gone {
            Room::change(&mut inner, &v, |s| s.home = 0);
        }
        for (v, quota) in keep {
            Room::change(&mut inner, v, |s| s.home = *quota);
        }
    }

    /// Bytes of pages held.
    pub fn used(&self) -> u64 {
        self.inner.lock().unwrap().used
    }

    /// Bytes promised to writable mappings.
    pub fn committed(&self) -> u64 {
        self.inner.lock().unwrap().committed
    }

    /// Bytes no other vNode may take: every vNode's share.
    pub fn taken(&self) -> u64 {
        self.inner.lock().unwrap().taken
    }

    /// Per vNode with room kept for it: how much, and how much of it its pages use.
    pub fn stats(&self) -> serde_json::Value {
        let inner = self.inner.lock().unwrap();
        inner
            .vnodes
            .iter()
            .filter(|(_, s)| s.kept() > 0)
            .map(|(v, s)| {
                (
                    v.clone(),
                    serde_json::json!({"kept": s.kept(), "pages": s.pages, "committed": s.committed}),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_kept_for_a_vnode_is_taken_by_no_other_and_grows_back_as_others_free_theirs() {
        let r = Room::new(100);
        r.keep_homes(&[("q".into(), 40)]);
        assert!(r.take_pages("a", 60));
        assert!(!r.take_pages("a", 1), "the rest is kept for q");
        assert!(r.take_pages("q", 40), "q gets all that is kept for it");
        assert!(!r.take_pages("q", 1), "and no more: nothing else is free");
        assert_eq!((r.used(), r.taken()), (100, 100));
        // Kept while it holds a process, even after the managers stop naming it.
        r.hold("q", 40);
        r.keep_homes(&[]);
        r.free_pages("q", 40);
        assert!(!r.take_pages("a", 1), "still kept while it holds a process of q");
        r.unhold("q");
        assert!(r.take_pages("a", 40), "free once nothing keeps it");
        // Kept after others took the room: q grows as they free theirs.
        r.keep_homes(&[("q".into(), 30)]);
        assert!(!r.take_pages("q", 1));
        r.free_pages("a", 10);
        assert!(r.take_pages("q", 10));
        assert!(!r.take_pages("a", 1), "what a frees goes to q first");
        // Promises are charged as pages are.
        assert!(!r.commit("a", 1));
        r.free_pages("a", 90);
        assert!(r.commit("a", 70) && !r.commit("a", 1));
        r.uncommit("a", 70);
        assert_eq!((r.used(), r.committed(), r.taken()), (10, 0, 30));
    }
}
