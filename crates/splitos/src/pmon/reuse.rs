//! Heap ranges a program unmapped that its home still keeps mapped, to hand out again without
//! asking the home. Allocators free and map the same sizes over and over (CPython's 1 MiB
//! arenas); answering the pair locally saves two round trips through the home and the owners.
//! Only ranges of which no page was ever written back are kept: nothing of them is on an
//! owner, so handing one out again gives zeros as a fresh mapping does.
use std::collections::BTreeMap;

pub struct HeapReuse {
    /// start -> (length, protection the home has for it).
    kept: BTreeMap<u64, (u64, u32)>,
    bytes: u64,
    /// Most bytes kept: they stay accounted at the owners.
    cap: u64,
}

impl HeapReuse {
    pub fn new(cap: u64) -> HeapReuse {
        HeapReuse { kept: BTreeMap::new(), bytes: 0, cap }
    }

    /// Keeps [start, start + len), mapped at the home with `prot`; false if that would exceed
    /// the cap (the range must then be unmapped at the home).
    pub fn keep(&mut self, start: u64, len: u64, prot: u32) -> bool {
        if self.bytes + len > self.cap || self.overlaps(start, start + len) {
            return false;
        }
        self.kept.insert(start, (len, prot));
        self.bytes += len;
        true
    }

    /// Takes out a kept range of exactly `len` bytes with `prot`, the lowest one.
    pub fn take(&mut self, len: u64, prot: u32) -> Option<u64> {
        let start = self.kept.iter().find(|(_, k)| **k == (len, prot)).map(|(s, _)| *s)?;
        self.kept.remove(&start);
        self.bytes -= len;
        Some(start)
    }

    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.kept.range(..end).next_back().is_some_and(|(s, (len, _))| s + len > start)
    }

    /// Takes out one kept range that overlaps [start, end), to be unmapped at the home.
    pub fn take_overlapping(&mut self, start: u64, end: u64) -> Option<(u64, u64, u32)> {
        let (s, (len, prot)) = self.kept.range(..end).rev().find(|(s, (len, _))| *s + len > start).map(|(s, k)| (*s, *k))?;
        self.kept.remove(&s);
        self.bytes -= len;
        Some((s, len, prot))
    }

    /// Puts back a range taken out whose unmapping failed.
    pub fn put_back(&mut self, start: u64, len: u64, prot: u32) {
        self.kept.insert(start, (len, prot));
        self.bytes += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_handed_out_again_by_size_and_protection_within_the_cap() {
        let mut r = HeapReuse::new(3 << 20);
        assert!(r.keep(10 << 20, 1 << 20, 3));
        assert!(r.keep(12 << 20, 1 << 20, 1));
        assert!(r.keep(14 << 20, 1 << 20, 3));
        assert!(!r.keep(16 << 20, 1 << 20, 3), "over the cap");
        assert!(!r.keep(10 << 20, 4096, 3), "already kept");
        assert_eq!(r.take(2 << 20, 3), None, "no range of that size");
        assert_eq!(r.take(1 << 20, 1), Some(12 << 20));
        assert_eq!(r.take(1 << 20, 3), Some(10 << 20), "the lowest first");
        assert!(r.keep(16 << 20, 1 << 20, 3), "room again");
    }

    #[test]
    fn overlapping_ranges_are_found_for_release() {
        let mut r = HeapReuse::new(1 << 30);
        r.keep(0x10000, 0x10000, 3);
        r.keep(0x30000, 0x10000, 3);
        assert!(!r.overlaps(0x20000, 0x30000));
        assert!(r.overlaps(0x1f000, 0x21000));
        assert!(r.overlaps(0, 0x100000));
        let mut gone = Vec::new();
        while let Some((s, _, _)) = r.take_overlapping(0x18000, 0x38000) {
            gone.push(s);
        }
        assert_eq!(gone, vec![0x30000, 0x10000]);
        assert!(!r.overlaps(0, u64::MAX));
        r.put_back(0x10000, 0x10000, 3);
        assert!(r.overlaps(0x10000, 0x10001));
    }
}
