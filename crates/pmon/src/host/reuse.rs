//! Heap ranges mapped at a process's home that the program does not have mapped, to hand out
//! without asking the home: a small mmap asks the home for a whole chunk and keeps the rest,
//! and a small munmap keeps its range. Allocators map and free arenas all the time (CPython's
//! 1 MiB arenas, about a hundred calls for a word count), and each call otherwise costs a
//! round trip to the home and from there to the owners. Only ranges of which no page was ever
//! written back are kept: nothing of them is on an owner, so handing one out gives zeros as a
//! fresh mapping does.
use std::collections::BTreeMap;

const PAGE: u64 = splitos_rpc::PAGE_SIZE as u64;

pub struct HeapReuse {
    /// start -> (length, protection the home has for it).
    kept: BTreeMap<u64, (u64, u32)>,
    bytes: u64,
    /// Most bytes kept: they stay accounted at the owners.
    cap: u64,
}

/// The share of the cap one chunk (or one kept range) may take.
const CHUNKS: u64 = 8;

impl HeapReuse {
    pub fn new(cap: u64) -> HeapReuse {
        HeapReuse {
            kept: BTreeMap::new(),
            bytes: 0,
            cap,
        }
    }

    /// How much to ask the home for when nothing kept fits an mmap of `len` bytes: a whole
    /// chunk, of which the rest is kept, if `len` is small and the rest fits under the cap.
    pub fn chunk_for(&self, len: u64) -> Option<u64> {
        let chunk = (self.cap / CHUNKS) & !(PAGE - 1);
        (len < chunk && self.bytes + chunk - len <= self.cap).then_some(chunk)
    }

    /// Keeps [start, start + len), mapped at the home with `prot`; false if the range is larger
    /// than a chunk (a whole reservation, not an arena) or the cap would be exceeded (the range
    /// must then be unmapped at the home). A kept range next to it with the same protection
    /// becomes one with it: V8 maps 508 KiB to cut an aligned 256 KiB page out of it and
    /// unmaps the ends, which only a freed page between them makes large enough to hand out again.
    pub fn keep(&mut self, start: u64, len: u64, prot: u32) -> bool {
        if len > self.cap / CHUNKS || self.bytes + len > self.cap || self.overlaps(start, start + len) {
            return false;
        }
        self.bytes += len;
        let (mut start, mut len) = (start, len);
        if let Some((&s, &(l, p))) = self.kept.range(..start).next_back() {
            if s + l == start && p == prot {
                self.kept.remove(&s);
                (start, len) = (s, l + len);
            }
        }
        if let Some(&(l, p)) = self.kept.get(&(start + len)) {
            if p == prot {
                self.kept.remove(&(start + len));
                len += l;
            }
        }
        self.kept.insert(start, (len, prot));
        true
    }

    /// Takes `len` bytes with `prot` from the front of the lowest kept range that has them.
    pub fn take(&mut self, len: u64, prot: u32) -> Option<u64> {
        let (start, klen) = self
            .kept
            .iter()
            .find(|(_, (l, p))| *l >= len && *p == prot)
            .map(|(s, (l, _))| (*s, *l))?;
        self.kept.remove(&start);
        if klen > len {
            self.kept.insert(start + len, (klen - len, prot));
        }
        self.bytes -= len;
        Some(start)
    }

    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        self.kept
            .range(..end)
            .next_back()
            .is_some_and(|(s, (len, _))| s + len > start)
    }

    /// Takes out one kept range that overlaps [start, end), to be unmapped at the home.
    pub fn take_overlapping(&mut self, start: u64, end: u64) -> Option<(u64, u64, u32)> {
        let (s, (len, prot)) = self
            .kept
            .range(..end)
            .rev()
            .find(|(s, (len, _))| *s + len > start)
            .map(|(s, k)| (*s, *k))?;
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
        let mut r = HeapReuse::new(24 << 20);
        assert!(r.keep(10 << 20, 1 << 20, 3));
        assert!(r.keep(12 << 20, 1 << 20, 1));
        assert!(r.keep(14 << 20, 2 << 20, 3));
        assert!(
            !r.keep(30 << 20, 4 << 20, 3),
            "larger than a chunk (an eighth of the cap)"
        );
        assert!(!r.keep(10 << 20, 4096, 3), "already kept");
        assert_eq!(r.take(4 << 20, 3), None, "no range that large");
        assert_eq!(r.take(1 << 20, 1), Some(12 << 20));
        assert_eq!(r.take(1 << 20, 3), Some(10 << 20), "the lowest first");
        assert_eq!(r.take(1 << 20, 3), Some(14 << 20), "from the front of a larger one");
        assert_eq!(r.take(1 << 20, 3), Some(15 << 20));
        assert_eq!(r.take(4096, 3), None);
        for i in 0..8 {
            assert!(r.keep((40 + 3 * i) << 20, 3 << 20, 3), "range {i}");
        }
        assert!(!r.keep(100 << 20, 1 << 20, 3), "over the cap");
    }

    #[test]
    fn neighbouring_ranges_of_one_protection_are_kept_as_one() {
        let mut r = HeapReuse::new(64 << 20);
        // V8's pattern: the ends of a 508 KiB mapping around an aligned 256 KiB page, then the page.
        assert!(r.keep(0x100000, 0x3f000, 3));
        assert!(r.keep(0x180000, 0x3f000, 3));
        assert_eq!(r.take(0x7f000, 3), None, "the page between them is still mapped");
        assert!(r.keep(0x13f000, 0x41000, 3));
        assert!(r.keep(0x1bf000, 0x1000, 1), "another protection stays apart");
        assert_eq!(r.take(0x7f000, 3), Some(0x100000), "the three are one range now");
        assert_eq!(r.take(0x7f000, 3), None, "what is left of it is too small");
        assert_eq!(r.take(0x40000, 3), Some(0x17f000));
        assert_eq!(r.take(0x1000, 1), Some(0x1bf000));
        assert!(!r.overlaps(0, u64::MAX), "every byte was handed out once");
        assert!(r.keep(0x100000, 0x1000, 3) && r.keep(0x102000, 0x1000, 3) && r.keep(0x101000, 0x1000, 3));
        assert_eq!(
            r.take_overlapping(0x100000, 0x100001),
            Some((0x100000, 0x3000, 3)),
            "a hole filled joins both sides"
        );
    }

    #[test]
    fn a_small_mmap_asks_for_a_chunk_while_its_rest_fits() {
        let mut r = HeapReuse::new(64 << 20);
        assert_eq!(r.chunk_for(1 << 20), Some(8 << 20));
        assert_eq!(r.chunk_for(8 << 20), None, "a chunk or more is asked for as it is");
        for i in 0..9 {
            r.keep(i * (8 << 20), 7 << 20, 3);
        }
        assert_eq!(r.chunk_for(1 << 20), None, "the rest would not fit under the cap");
        assert_eq!(HeapReuse::new(0).chunk_for(4096), None, "off");
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
