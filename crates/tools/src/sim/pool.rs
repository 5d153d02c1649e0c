//! A pool of like units (servers, compute modules or memory modules) with a few resources
//! each, and an index that finds the unit a placement policy prefers. Units are kept in
//! classes by the magnitude of their free CPU and free memory (powers of two), each class
//! ordered by the policy's key: a request looks only at the classes that can hold it, and in
//! each takes the first unit that fits, which in every class above the request's own is
//! the first one unless links are short (links are not classed: a unit without a free link
//! is passed over). A placement costs about log(units), which is what lets a 100-fold
//! scale-up replay in seconds.

use std::collections::BTreeSet;

use splitos_core::placement::{Placement, Unit};

/// Resources a unit has: `[CPU (milli), memory (MiB), links]`. A pool leaves the ones its
/// units do not have at zero.
pub const RES: usize = 3;
pub const CPU: usize = 0;
pub const MEM: usize = 1;
pub const LINKS: usize = 2;

pub type Amount = [u64; RES];

/// Classes per resource: the bit length of free / grain, the last one open-ended.
const CLASSES: usize = 24;

/// Units of one part of the pool (a rack's memory modules), by class.
struct Part {
    sets: Vec<BTreeSet<(u64, u32)>>,
    /// Per CPU class, the memory classes holding units; and the CPU classes holding any.
    rows: [u32; CLASSES],
    cols: u32,
}

pub struct Pool {
    cap: Vec<Amount>,
    free: Vec<Amount>,
    /// Allocations a unit holds: a unit holding none could be switched off.
    holders: Vec<u32>,
    key: Vec<u64>,
    class: Vec<u16>,
    part: Vec<u32>,
    parts: Vec<Part>,
    grain: [u64; 2],
    policy: &'static dyn Placement,
    /// Units holding an allocation, and the sum of their free resources: what must stay
    /// powered although unused (the fragmentation index's numerator).
    on: usize,
    free_on: [u128; RES],
    free_all: [u128; RES],
    total: [u128; RES],
    /// Weights that put resources on one scale for the policies (1 / mean capacity).
    weights: [f64; RES],
}

fn bits(x: u64) -> usize {
    (64 - x.leading_zeros() as usize).min(CLASSES - 1)
}

/// A key as an integer in the same order (negative keys included).
fn ordered(k: f64) -> u64 {
    let b = k.to_bits();
    if b >> 63 == 1 {
        !b
    } else {
        b | 1 << 63
    }
}

impl Pool {
    /// A pool of units with capacities `caps`, unit `u` in part `part_of(u)` of `parts`.
    pub fn new(
        caps: Vec<Amount>,
        parts: usize,
        part_of: impl Fn(usize) -> usize,
        policy: &'static dyn Placement,
    ) -> Pool {
        let n = caps.len();
        let mut total = [0u128; RES];
        for c in &caps {
            for r in 0..RES {
                total[r] += c[r] as u128;
            }
        }
        let weights = std::array::from_fn(|r| {
            if total[r] == 0 || r == LINKS {
                0.0
            } else {
                n as f64 / total[r] as f64
            }
        });
        let max = |r: usize| caps.iter().map(|c| c[r]).max().unwrap_or(0);
        let grain = [(max(CPU) >> 16).max(1), (max(MEM) >> 16).max(1)];
        let mut pool = Pool {
            free: caps.clone(),
            holders: vec![0; n],
            key: vec![0; n],
            class: vec![0; n],
            part: (0..n).map(|u| part_of(u) as u32).collect(),
            parts: (0..parts.max(1))
                .map(|_| Part {
                    sets: vec![BTreeSet::new(); CLASSES * CLASSES],
                    rows: [0; CLASSES],
                    cols: 0,
                })
                .collect(),
            cap: caps,
            grain,
            policy,
            on: 0,
            free_on: [0; RES],
            free_all: total,
            total,
            weights,
        };
        for u in 0..n {
            pool.index(u);
        }
        pool
    }

    pub fn units(&self) -> usize {
        self.cap.len()
    }

    pub fn cap(&self, u: usize) -> &Amount {
        &self.cap[u]
    }

    pub fn free(&self, u: usize) -> &Amount {
        &self.free[u]
    }

    pub fn total(&self, r: usize) -> u128 {
        self.total[r]
    }

    pub fn on(&self) -> usize {
        self.on
    }

    pub fn free_on(&self, r: usize) -> u128 {
        self.free_on[r]
    }

    pub fn free_total(&self, r: usize) -> u128 {
        self.free_all[r]
    }

    /// The part (rack) unit `u` is in.
    pub fn part(&self, u: usize) -> usize {
        self.part[u] as usize
    }

    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    pub fn policy(&self) -> &dyn Placement {
        self.policy
    }

    fn classes(&self, a: &Amount) -> (usize, usize) {
        (bits(a[CPU] / self.grain[0]), bits(a[MEM] / self.grain[1]))
    }

    /// How loaded unit `u` is: what it uses of the pool's first resource, CPU for servers and
    /// compute modules, memory for memory modules.
    fn load(&self, u: usize) -> f64 {
        let r = if self.weights[CPU] > 0.0 { CPU } else { MEM };
        (self.cap[u][r] - self.free[u][r]) as f64
    }

    fn index(&mut self, u: usize) {
        let (ci, cm) = self.classes(&self.free[u]);
        let unit = Unit {
            index: u,
            free: &self.free[u],
            weights: &self.weights,
            load: self.load(u),
        };
        let key = ordered(self.policy.key(&unit));
        let part = &mut self.parts[self.part[u] as usize];
        part.sets[ci * CLASSES + cm].insert((key, u as u32));
        part.rows[ci] |= 1 << cm;
        part.cols |= 1 << ci;
        self.key[u] = key;
        self.class[u] = (ci * CLASSES + cm) as u16;
    }

    fn unindex(&mut self, u: usize) {
        let c = self.class[u] as usize;
        let part = &mut self.parts[self.part[u] as usize];
        part.sets[c].remove(&(self.key[u], u as u32));
        if part.sets[c].is_empty() {
            let (ci, cm) = (c / CLASSES, c % CLASSES);
            part.rows[ci] &= !(1 << cm);
            if part.rows[ci] == 0 {
                part.cols &= !(1 << ci);
            }
        }
    }

    /// Whether unit `u` holds an allocation.
    pub fn holds(&self, u: usize) -> bool {
        self.holders[u] > 0
    }

    pub fn fits(&self, u: usize, want: &Amount) -> bool {
        (0..RES).all(|r| self.free[u][r] >= want[r])
    }

    /// Takes `amount` from unit `u` as one more allocation it holds (`hold`) or as more of
    /// one it already holds.
    pub fn take(&mut self, u: usize, amount: &Amount, hold: bool) {
        assert!(
            self.fits(u, amount),
            "unit {u} cannot take {amount:?}: {:?} free",
            self.free[u]
        );
        self.change(
            u,
            |free| {
                for r in 0..RES {
                    free[r] -= amount[r];
                }
            },
            if hold { 1 } else { 0 },
        );
    }

    /// Gives `amount` back to unit `u`, ending one allocation it held when `release`.
    pub fn give(&mut self, u: usize, amount: &Amount, release: bool) {
        assert!(
            !release || self.holders[u] > 0,
            "unit {u} holds no allocation to release"
        );
        self.change(
            u,
            |free| {
                for r in 0..RES {
                    free[r] += amount[r];
                }
            },
            if release { -1 } else { 0 },
        );
        assert!(
            (0..RES).all(|r| self.free[u][r] <= self.cap[u][r]),
            "unit {u} was given more than it has"
        );
    }

    fn change(&mut self, u: usize, f: impl FnOnce(&mut Amount), holders: i32) {
        self.unindex(u);
        if self.holders[u] > 0 {
            self.on -= 1;
            for r in 0..RES {
                self.free_on[r] -= self.free[u][r] as u128;
            }
        }
        for r in 0..RES {
            self.free_all[r] -= self.free[u][r] as u128;
        }
        f(&mut self.free[u]);
        for r in 0..RES {
            self.free_all[r] += self.free[u][r] as u128;
        }
        self.holders[u] = self.holders[u].checked_add_signed(holders).expect("holder count");
        if self.holders[u] > 0 {
            self.on += 1;
            for r in 0..RES {
                self.free_on[r] += self.free[u][r] as u128;
            }
        }
        self.index(u);
    }

    /// The policy's rank of unit `u`: lower is preferred, ties to the lower unit.
    pub fn rank(&self, u: usize) -> (u64, u32) {
        (self.key[u], u as u32)
    }

    /// The unit of `parts` that the policy prefers among those with `want` free,
    /// other than the ones in `skip`.
    pub fn search(&self, want: &Amount, parts: impl IntoIterator<Item = usize>, skip: &[usize]) -> Option<usize> {
        let (ca, cb) = self.classes(want);
        let mut best: Option<(u64, u32)> = None;
        for part in parts.into_iter().map(|p| &self.parts[p]) {
            let mut cols = part.cols & !((1u32 << ca) - 1);
            while cols != 0 {
                let ci = cols.trailing_zeros() as usize;
                cols &= cols - 1;
                let mut rows = part.rows[ci] & !((1u32 << cb) - 1);
                while rows != 0 {
                    let cm = rows.trailing_zeros() as usize;
                    rows &= rows - 1;
                    for &(k, u) in &part.sets[ci * CLASSES + cm] {
                        if best.is_some_and(|b| (k, u) >= b) {
                            break;
                        }
                        if !skip.contains(&(u as usize)) && self.fits(u as usize, want) {
                            best = Some((k, u));
                            break;
                        }
                    }
                }
            }
        }
        best.map(|(_, u)| u as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::placement::{rule, PLACEMENTS};
    use splitos_core::config::PlacementPolicy;

    fn pool(placement: PlacementPolicy) -> Pool {
        let caps = vec![
            [8000, 64, 0],
            [4000, 32, 2],
            [16000, 16, 1],
            [4000, 8, 0],
            [32000, 128 << 10, 3],
            [2, 1, 0],
        ];
        Pool::new(caps, 2, |u| usize::from(u >= 3), rule(placement).unwrap())
    }

    /// The index finds the unit an exhaustive scan in the policy's order finds, whatever
    /// the state.
    #[test]
    fn search_agrees_with_a_scan() {
        for name in PLACEMENTS {
            let mut p = pool(name);
            let wants = [
                [1000, 1, 0],
                [4000, 8, 0],
                [4000, 40, 0],
                [10000, 10, 0],
                [0, 0, 0],
                [33000, 1, 0],
                [2000, 100, 0],
                [1, 1, 1],
                [0, 5000, 0],
            ];
            let mut taken = Vec::new();
            for step in 0..60usize {
                for want in &wants {
                    for (parts, units) in [(0..2, 0..6), (0..1, 0..3), (1..2, 3..6)] {
                        for skip in [&[][..], &[0, 3][..]] {
                            let scan = units
                                .clone()
                                .filter(|u| p.fits(*u, want) && !skip.contains(u))
                                .min_by_key(|u| p.rank(*u));
                            assert_eq!(
                                p.search(want, parts.clone(), skip),
                                scan,
                                "{name} {want:?} {units:?} at step {step}"
                            );
                        }
                    }
                }
                let want = wants[step % wants.len()];
                if let Some(u) = p.search(&want, 0..2, &[]).filter(|_| step % 3 != 2) {
                    p.take(u, &want, true);
                    taken.push((u, want));
                } else if let Some((u, w)) = taken.pop() {
                    p.give(u, &w, true);
                }
            }
        }
    }

    #[test]
    fn accounting_of_units_on_and_their_free_resources() {
        let mut p = Pool::new(
            vec![[8, 64, 0], [4, 32, 0], [16, 16, 0], [4, 8, 0], [32, 128, 0]],
            1,
            |_| 0,
            rule(PlacementPolicy::BestFit).unwrap(),
        );
        assert_eq!((p.on(), p.free_on(CPU)), (0, 0));
        p.take(1, &[1, 2, 0], true);
        p.take(1, &[1, 2, 0], true);
        p.take(4, &[2, 0, 0], true);
        assert_eq!((p.on(), p.free_on(CPU), p.free_on(MEM)), (2, 2 + 30, 28 + 128));
        assert_eq!((p.free_total(CPU), p.free_total(MEM)), (64 - 4, 248 - 4));
        p.give(1, &[1, 2, 0], true);
        assert_eq!((p.on(), p.free_on(CPU)), (2, 3 + 30));
        p.give(1, &[1, 2, 0], true);
        p.give(4, &[2, 0, 0], true);
        assert_eq!((p.on(), p.free_on(CPU), p.free_on(MEM)), (0, 0, 0));
        assert_eq!((p.total(CPU), p.total(MEM)), (64, 248));
    }

    #[test]
    fn best_fit_takes_the_fullest_unit_that_fits() {
        let mut p = pool(PlacementPolicy::BestFit);
        assert_eq!(p.search(&[4000, 8, 0], 0..2, &[]), Some(3));
        assert_eq!(p.search(&[4000, 8, 0], 0..2, &[3]), Some(1));
        p.take(0, &[4000, 40, 0], true);
        assert_eq!(p.search(&[4000, 8, 0], 0..1, &[]), Some(0));
        assert_eq!(p.search(&[4000, 8, 0], 0..2, &[0, 1, 2, 3, 4]), None);
    }
}
