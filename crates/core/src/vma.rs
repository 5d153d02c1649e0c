//! An ordered map of non-overlapping virtual memory areas. The home mComponent uses one for a
//! process's address-space layout, each vRegion owner one per process for its vma tree.
use std::collections::BTreeMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vma {
    pub end: u64,
    pub prot: u32,
    /// Memory promised to this area (writable areas are accounted when they become writable).
    pub accounted: bool,
}

#[derive(Default, Clone, Debug)]
pub struct VmaMap {
    map: BTreeMap<u64, Vma>,
}

impl VmaMap {
    pub fn iter(&self) -> impl Iterator<Item = (u64, Vma)> + '_ {
        self.map.iter().map(|(s, v)| (*s, *v))
    }

    /// Makes `addr` a boundary: a vma strictly containing it becomes two.
    pub fn split_at(&mut self, addr: u64) {
        let hit = self.map.range(..addr).next_back().map(|(s, v)| (*s, *v));
        if let Some((s, v)) = hit {
            if v.end > addr {
                self.map.insert(s, Vma { end: addr, ..v });
                self.map.insert(addr, v);
            }
        }
    }

    /// The vmas inside [start, end) after cutting at both ends.
    pub fn carve(&mut self, start: u64, end: u64) -> Vec<(u64, Vma)> {
        self.split_at(start);
        self.split_at(end);
        self.map.range(start..end).map(|(s, v)| (*s, *v)).collect()
    }

    pub fn remove_range(&mut self, start: u64, end: u64) -> Vec<(u64, Vma)> {
        let gone = self.carve(start, end);
        for (s, _) in &gone {
            self.map.remove(s);
        }
        gone
    }

    pub fn insert(&mut self, start: u64, vma: Vma) {
        debug_assert!(self.is_free(start, vma.end));
        self.map.insert(start, vma);
    }

    pub fn set(&mut self, start: u64, vma: Vma) {
        self.map.insert(start, vma);
    }

    pub fn is_free(&self, start: u64, end: u64) -> bool {
        if let Some((_, v)) = self.map.range(..start).next_back() {
            if v.end > start {
                return false;
            }
        }
        self.map.range(start..end).next().is_none()
    }

    /// True if [start, end) is mapped with no hole.
    pub fn covers(&self, start: u64, end: u64) -> bool {
        let mut at = start;
        if let Some((_, v)) = self.map.range(..=start).next_back() {
            if v.end > start {
                at = v.end;
            }
        }
        for (s, v) in self.map.range(start..end) {
            if *s > at {
                return false;
            }
            at = at.max(v.end);
        }
        at >= end
    }

    /// The protection of [start, end) if it is mapped with no hole and one protection.
    pub fn prot_of(&self, start: u64, end: u64) -> Option<u32> {
        let prot = self.find(start)?.1.prot;
        (self.covers(start, end) && self.map.range(start..end).all(|(_, v)| v.prot == prot)).then_some(prot)
    }

    /// Bytes of [start, end) mapped writable.
    pub fn writable_in(&self, start: u64, end: u64) -> u64 {
        let first = self.find(start).map_or(start, |(s, _)| s);
        self.map
            .range(first..end)
            .filter(|(_, v)| v.prot & libc::PROT_WRITE as u32 != 0)
            .map(|(s, v)| v.end.min(end).saturating_sub((*s).max(start)))
            .sum()
    }

    pub fn find(&self, addr: u64) -> Option<(u64, Vma)> {
        self.map
            .range(..=addr)
            .next_back()
            .filter(|(_, v)| v.end > addr)
            .map(|(s, v)| (*s, *v))
    }

    /// First gap of `len` bytes in [base, limit), trying `hint` first.
    pub fn find_gap(&self, base: u64, limit: u64, len: u64, hint: u64) -> Option<u64> {
        if hint >= base && hint.checked_add(len).is_some_and(|e| e <= limit) && self.is_free(hint, hint + len) {
            return Some(hint);
        }
        let mut at = base;
        for (s, v) in self.map.range(base..) {
            if s.saturating_sub(at) >= len {
                break;
            }
            at = at.max(v.end);
        }
        (at.checked_add(len)? <= limit).then_some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(end: u64) -> Vma {
        Vma {
            end,
            prot: 3,
            accounted: true,
        }
    }

    #[test]
    fn carve_splits_and_gap_search_skips_used_ranges() {
        let mut m = VmaMap::default();
        m.insert(0x1000, v(0x5000));
        m.insert(0x8000, v(0x9000));
        assert!(m.covers(0x1000, 0x5000));
        assert!(!m.covers(0x1000, 0x9000));
        let mid = m.carve(0x2000, 0x3000);
        assert_eq!(mid, vec![(0x2000, v(0x3000))]);
        assert_eq!(m.iter().count(), 4);
        assert_eq!(m.find_gap(0x1000, 0x10000, 0x3000, 0), Some(0x5000));
        assert_eq!(m.find_gap(0x1000, 0x10000, 0x4000, 0), Some(0x9000));
        assert_eq!(m.find_gap(0x1000, 0x10000, 0x1000, 0x6000), Some(0x6000));
        m.remove_range(0x0, 0x10000);
        assert_eq!(m.iter().count(), 0);
    }

    #[test]
    fn writable_bytes_count_only_writable_areas_cut_at_the_range() {
        let mut m = VmaMap::default();
        m.insert(0x1000, v(0x4000));
        m.insert(
            0x4000,
            Vma {
                end: 0x6000,
                prot: 1,
                accounted: false,
            },
        );
        m.insert(0x8000, v(0xa000));
        assert_eq!(m.writable_in(0x2000, 0x9000), 0x2000 + 0x1000);
        assert_eq!(m.writable_in(0x4000, 0x6000), 0);
        assert_eq!(m.writable_in(0x0, 0x10000), 0x3000 + 0x2000);
        assert_eq!(m.writable_in(0x6000, 0x8000), 0);
    }
}
