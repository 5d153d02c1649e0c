//! The compressed local tier: a bounded victim cache of compressed ExCache lines in the
//! pComponent's own memory, between the ExCache and the page store (zswap's idea for a
//! splitkernel). Lines the ExCache evicts are compressed into it instead of travelling to an
//! mComponent; a miss on one of them is a decompression, not a round trip.
//!
//! It is exclusive: a page is either a resident line, or a tier entry, or neither, never both,
//! so a tier entry is always the page's newest version and the tier's budget holds only
//! pages the ExCache does not. An entry is `dirty` when the store does not hold its contents
//! (it owes a write-back when it leaves the tier), clean when the store does.
//!
//! The miss path (miss/) keeps the entries' correctness rules; this file holds the two
//! parts a researcher swaps: how a page is compressed ([`Codec`]) and which entries the tier
//! keeps ([`VictimTier`]; [`OldestFirst`] pushes out the entry that left the ExCache first).
use std::collections::BTreeMap;

use splitos_rpc::PAGE_SIZE;

/// Pages that compress to more than this skip the tier: they would take most of a page of the
/// budget to save one round trip, where compressible pages save several in the same space.
pub const MAX_PACKED: usize = PAGE_SIZE * 3 / 4;

/// What one entry costs beyond its compressed bytes (its two index nodes and the allocation's
/// header), charged against the budget so that it bounds real memory even when pages compress
/// to a few bytes.
pub const ENTRY_OVERHEAD: u64 = 96;

/// How pages are compressed; called without the miss path's lock held.
pub trait Codec: Send + Sync {
    fn name(&self) -> &'static str;
    /// The compressed page, or `None` if it takes more than [`MAX_PACKED`] bytes.
    fn pack(&self, page: &[u8]) -> Option<Box<[u8]>>;
    /// Restores a page from what [`Codec::pack`] returned.
    fn unpack(&self, packed: &[u8], page: &mut [u8]) -> Result<(), UnpackError>;
}

/// Why a compressed page could not be restored.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("{got} bytes decompressed instead of {want}")]
    Length { got: usize, want: usize },
    #[error("{0}")]
    Lz4(lz4_flex::block::DecompressError),
}

/// LZ4 block compression (`lz4_flex`, pure Rust): a few µs per page, the choice of zram and
/// zswap for the same reason.
pub struct Lz4;

impl Codec for Lz4 {
    fn name(&self) -> &'static str {
        "lz4"
    }

    fn pack(&self, page: &[u8]) -> Option<Box<[u8]>> {
        let mut out = vec![0u8; lz4_flex::block::get_maximum_output_size(page.len())];
        let n = lz4_flex::block::compress_into(page, &mut out).ok()?;
        (n <= MAX_PACKED).then(|| out[..n].into())
    }

    fn unpack(&self, packed: &[u8], page: &mut [u8]) -> Result<(), UnpackError> {
        match lz4_flex::block::decompress_into(packed, page) {
            Ok(n) if n == page.len() => Ok(()),
            Ok(n) => Err(UnpackError::Length {
                got: n,
                want: page.len(),
            }),
            Err(e) => Err(UnpackError::Lz4(e)),
        }
    }
}

/// One page in the tier.
pub struct Entry {
    pub packed: Box<[u8]>,
    /// The store does not hold these contents.
    pub dirty: bool,
}

/// A page pushed out of the tier: `(pid, vpn, entry)`.
pub type Pushed = (u64, u64, Entry);

/// The tier's bookkeeping, called under the miss path's lock. Pages are (process, virtual page).
pub trait VictimTier: Send {
    fn name(&self) -> &'static str;
    fn contains(&self, pid: u64, vpn: u64) -> bool;
    /// A miss: the entry leaves the tier (the line now holds the page).
    fn take(&mut self, pid: u64, vpn: u64) -> Option<Entry>;
    /// Stores a victim, pushing out entries until it fits; returns them (a dirty one must be
    /// written back before anyone may miss on it).
    fn insert(&mut self, pid: u64, vpn: u64, e: Entry) -> Vec<Pushed>;
    /// The dirty entries of [first, end), pinned (neither taken nor pushed out) until
    /// [`VictimTier::unpin`]: their compressed bytes, for a write-back.
    fn pin_dirty(&mut self, pid: u64, first: u64, end: u64) -> Vec<(u64, Box<[u8]>)>;
    /// Ends a pinned write-back; `written`: the store acknowledged it, the entry is clean.
    fn unpin(&mut self, pid: u64, vpn: u64, written: bool);
    fn has_dirty(&self, pid: u64, first: u64, end: u64) -> bool;
    /// Forgets [first, end) of a process without writing anything back.
    fn drop_range(&mut self, pid: u64, first: u64, end: u64);
    /// Bytes charged against the budget (compressed bytes and [`ENTRY_OVERHEAD`] per entry).
    fn used(&self) -> u64;
    fn budget(&self) -> u64;
    fn entries(&self) -> usize;
}

struct Slot {
    e: Entry,
    /// Its position in `age`.
    seq: u64,
    pinned: bool,
}

/// Pushes out the entries that entered first. Entries leave on a hit, so the oldest is the
/// page that has gone unused the longest since the ExCache evicted it: LRU over victims.
pub struct OldestFirst {
    budget: u64,
    used: u64,
    slots: BTreeMap<(u64, u64), Slot>,
    age: BTreeMap<u64, (u64, u64)>,
    seq: u64,
}

impl OldestFirst {
    pub fn new(budget: u64) -> OldestFirst {
        OldestFirst {
            budget,
            used: 0,
            slots: BTreeMap::new(),
            age: BTreeMap::new(),
            seq: 0,
        }
    }

    fn cost(e: &Entry) -> u64 {
        e.packed.len() as u64 + ENTRY_OVERHEAD
    }

    fn remove(&mut self, key: (u64, u64)) -> Option<Entry> {
        let s = self.slots.remove(&key)?;
        self.age.remove(&s.seq);
        self.used -= Self::cost(&s.e);
        Some(s.e)
    }
}

impl VictimTier for OldestFirst {
    fn name(&self) -> &'static str {
        "oldest-first"
    }

    fn contains(&self, pid: u64, vpn: u64) -> bool {
        self.slots.contains_key(&(pid, vpn))
    }

    fn take(&mut self, pid: u64, vpn: u64) -> Option<Entry> {
        if self.slots.get(&(pid, vpn))?.pinned {
            return None;
        }
        self.remove((pid, vpn))
    }

    fn insert(&mut self, pid: u64, vpn: u64, e: Entry) -> Vec<Pushed> {
        self.remove((pid, vpn));
        let need = Self::cost(&e);
        let mut out = Vec::new();
        // Pinned entries are being written back: they stay, and may hold the tier over its
        // budget until that write-back ends.
        while self.used + need > self.budget {
            let Some(k) = self.age.values().find(|k| !self.slots[*k].pinned).copied() else {
                break;
            };
            let old = self.remove(k).expect("an aged entry is in the tier");
            out.push((k.0, k.1, old));
        }
        self.seq += 1;
        self.used += need;
        self.age.insert(self.seq, (pid, vpn));
        self.slots.insert(
            (pid, vpn),
            Slot {
                e,
                seq: self.seq,
                pinned: false,
            },
        );
        out
    }

    fn pin_dirty(&mut self, pid: u64, first: u64, end: u64) -> Vec<(u64, Box<[u8]>)> {
        let mut out = Vec::new();
        for ((_, vpn), s) in self.slots.range_mut((pid, first)..(pid, end)) {
            if s.e.dirty && !s.pinned {
                s.pinned = true;
                out.push((*vpn, s.e.packed.clone()));
            }
        }
        out
    }

    fn unpin(&mut self, pid: u64, vpn: u64, written: bool) {
        if let Some(s) = self.slots.get_mut(&(pid, vpn)) {
            s.pinned = false;
            if written {
                s.e.dirty = false;
            }
        }
    }

    fn has_dirty(&self, pid: u64, first: u64, end: u64) -> bool {
        self.slots.range((pid, first)..(pid, end)).any(|(_, s)| s.e.dirty)
    }

    fn drop_range(&mut self, pid: u64, first: u64, end: u64) {
        let keys: Vec<(u64, u64)> = self.slots.range((pid, first)..(pid, end)).map(|(k, _)| *k).collect();
        for k in keys {
            self.remove(k);
        }
    }

    fn used(&self) -> u64 {
        self.used
    }

    fn budget(&self) -> u64 {
        self.budget
    }

    fn entries(&self) -> usize {
        self.slots.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: usize, dirty: bool) -> Entry {
        Entry {
            packed: vec![7u8; n].into(),
            dirty,
        }
    }

    #[test]
    fn lz4_round_trips_and_refuses_incompressible_pages() {
        let mut page = vec![0u8; PAGE_SIZE];
        for (i, b) in page.iter_mut().enumerate().step_by(64) {
            *b = i as u8;
        }
        let packed = Lz4.pack(&page).expect("a mostly empty page compresses");
        assert!(packed.len() < 512, "{}", packed.len());
        let mut back = vec![1u8; PAGE_SIZE];
        Lz4.unpack(&packed, &mut back).unwrap();
        assert_eq!(back, page);
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..PAGE_SIZE)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert!(Lz4.pack(&noise).is_none(), "random bytes skip the tier");
        assert!(
            Lz4.unpack(&packed[..packed.len() / 2], &mut back).is_err(),
            "a truncated entry is an error, not a page"
        );
    }

    #[test]
    fn the_oldest_unpinned_entries_make_room_and_the_budget_counts_overhead() {
        let per = 100 + ENTRY_OVERHEAD;
        let mut t = OldestFirst::new(3 * per);
        for v in 0..3 {
            assert!(t.insert(1, v, entry(100, v != 1)).is_empty());
        }
        assert_eq!(t.used(), 3 * per);
        assert_eq!(t.pin_dirty(1, 0, 1).len(), 1, "page 0 is being written back");
        let out = t.insert(2, 9, entry(100, true));
        assert_eq!(
            out.iter().map(|p| (p.0, p.1, p.2.dirty)).collect::<Vec<_>>(),
            vec![(1, 1, false)],
            "the oldest unpinned entry goes"
        );
        assert!(t.take(1, 0).is_none(), "a pinned entry is not taken");
        t.unpin(1, 0, true);
        assert!(
            !t.has_dirty(1, 0, 1),
            "an acknowledged write-back leaves the entry clean"
        );
        assert!(t.take(1, 0).is_some_and(|e| !e.dirty));
        t.drop_range(1, 0, 100);
        assert_eq!((t.entries(), t.used()), (1, per));
        assert!(t.contains(2, 9) && !t.contains(1, 2));
    }
}
