//! A pool of like units (servers, compute modules or memory modules) with a few resources
//! each, searched by a placement policy. A segment tree keeps, per subtree, the largest and
//! smallest free amount and the smallest used amount of every resource, so that a search
//! skips subtrees where nothing fits or nothing can beat the best unit found so far: a
//! placement costs about log(units), which is what lets a 100-fold scale-up replay in seconds.

use super::policy::{Bound, Placement};

/// Resources a unit has: `[CPU (milli), memory (MiB), links]`. A pool leaves the ones its
/// units do not have at zero.
pub const RES: usize = 3;
pub const CPU: usize = 0;
pub const MEM: usize = 1;
pub const LINKS: usize = 2;

pub type Amount = [u64; RES];

#[derive(Clone, Copy)]
struct Agg {
    max_free: Amount,
    min_free: Amount,
    min_used: Amount,
}

const EMPTY: Agg = Agg { max_free: [0; RES], min_free: [u64::MAX; RES], min_used: [u64::MAX; RES] };

pub struct Pool {
    cap: Vec<Amount>,
    free: Vec<Amount>,
    /// Allocations a unit holds: a unit holding none could be switched off.
    holders: Vec<u32>,
    leaves: usize,
    tree: Vec<Agg>,
    /// Units holding an allocation, and the sum of their free resources: what must stay
    /// powered although unused (the fragmentation index's numerator).
    on: usize,
    free_on: [u128; RES],
    free_all: [u128; RES],
    total: [u128; RES],
    /// Weights that put resources on one scale for the policies (1 / mean capacity).
    weights: [f64; RES],
}

impl Pool {
    pub fn new(caps: Vec<Amount>) -> Pool {
        let n = caps.len();
        let leaves = n.next_power_of_two().max(1);
        let mut total = [0u128; RES];
        for c in &caps {
            for r in 0..RES {
                total[r] += c[r] as u128;
            }
        }
        let weights = std::array::from_fn(|r| if total[r] == 0 || r == LINKS { 0.0 } else { n as f64 / total[r] as f64 });
        let mut pool = Pool { free: caps.clone(), cap: caps, holders: vec![0; n], leaves, tree: vec![EMPTY; 2 * leaves], on: 0, free_on: [0; RES], free_all: total, total, weights };
        for u in 0..n {
            pool.tree[leaves + u] = pool.leaf(u);
        }
        for i in (1..leaves).rev() {
            pool.tree[i] = merge(&pool.tree[2 * i], &pool.tree[2 * i + 1]);
        }
        pool
    }

    pub fn len(&self) -> usize {
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

    pub fn weights(&self) -> &[f64; RES] {
        &self.weights
    }

    fn leaf(&self, u: usize) -> Agg {
        let f = self.free[u];
        Agg { max_free: f, min_free: f, min_used: std::array::from_fn(|r| self.cap[u][r] - f[r]) }
    }

    fn fits(&self, u: usize, want: &Amount) -> bool {
        (0..RES).all(|r| self.free[u][r] >= want[r])
    }

    /// Takes `amount` from unit `u` as one more allocation it holds (`hold`) or as more of
    /// one it already holds.
    pub fn take(&mut self, u: usize, amount: &Amount, hold: bool) {
        assert!(self.fits(u, amount), "unit {u} cannot take {amount:?}: {:?} free", self.free[u]);
        self.change(u, |free| {
            for r in 0..RES {
                free[r] -= amount[r];
            }
        }, if hold { 1 } else { 0 });
    }

    /// Gives `amount` back to unit `u`, ending one allocation it held when `release`.
    pub fn give(&mut self, u: usize, amount: &Amount, release: bool) {
        assert!(!release || self.holders[u] > 0, "unit {u} holds no allocation to release");
        self.change(u, |free| {
            for r in 0..RES {
                free[r] += amount[r];
            }
        }, if release { -1 } else { 0 });
        debug_assert!((0..RES).all(|r| self.free[u][r] <= self.cap[u][r]), "unit {u} was given more than it has");
    }

    fn change(&mut self, u: usize, f: impl FnOnce(&mut Amount), holders: i32) {
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
        let mut i = self.leaves + u;
        self.tree[i] = self.leaf(u);
        while i > 1 {
            i /= 2;
            self.tree[i] = merge(&self.tree[2 * i], &self.tree[2 * i + 1]);
        }
    }

    /// The unit of `lo..hi` that `policy` likes best among those with `want` free, other
    /// than the ones in `skip`.
    pub fn search(&self, policy: &dyn Placement, want: &Amount, lo: usize, hi: usize, skip: &[usize]) -> Option<usize> {
        let mut best: Option<(f64, usize)> = None;
        let hi = hi.min(self.len());
        if lo < hi {
            self.descend(1, 0, self.leaves, policy, want, lo, hi, skip, &mut best);
        }
        best.map(|(_, u)| u)
    }

    /// The score `policy` gives unit `u` for `want` (lower is better).
    pub fn score(&self, policy: &dyn Placement, u: usize, want: &Amount) -> Option<f64> {
        self.fits(u, want).then(|| policy.score(u, &self.free[u], &self.cap[u], want, &self.weights))
    }

    #[allow(clippy::too_many_arguments)]
    fn descend(&self, i: usize, a: usize, b: usize, policy: &dyn Placement, want: &Amount, lo: usize, hi: usize, skip: &[usize], best: &mut Option<(f64, usize)>) {
        if b <= lo || hi <= a {
            return;
        }
        let agg = &self.tree[i];
        if (0..RES).any(|r| agg.max_free[r] < want[r]) {
            return;
        }
        if let Some((s, u)) = *best {
            // Every unit here scores at least `bound` and comes after `first`: ties go to the
            // lowest index, so a subtree that can at best tie from further right is skipped.
            let first = a.max(lo);
            let bound = policy.bound(&Bound { first, max_free: &agg.max_free, min_free: &agg.min_free, min_used: &agg.min_used }, want, &self.weights);
            if bound > s || (bound == s && first > u) {
                return;
            }
        }
        if b - a == 1 {
            if skip.contains(&a) {
                return;
            }
            if let Some(s) = self.score(policy, a, want) {
                if best.is_none_or(|(bs, bu)| (s, a) < (bs, bu)) {
                    *best = Some((s, a));
                }
            }
            return;
        }
        let m = (a + b) / 2;
        // The child whose bound is lower first, so that the other is more often skipped.
        let bl = policy.bound(&Bound { first: a.max(lo), max_free: &self.tree[2 * i].max_free, min_free: &self.tree[2 * i].min_free, min_used: &self.tree[2 * i].min_used }, want, &self.weights);
        let br = policy.bound(&Bound { first: m.max(lo), max_free: &self.tree[2 * i + 1].max_free, min_free: &self.tree[2 * i + 1].min_free, min_used: &self.tree[2 * i + 1].min_used }, want, &self.weights);
        if br < bl {
            self.descend(2 * i + 1, m, b, policy, want, lo, hi, skip, best);
            self.descend(2 * i, a, m, policy, want, lo, hi, skip, best);
        } else {
            self.descend(2 * i, a, m, policy, want, lo, hi, skip, best);
            self.descend(2 * i + 1, m, b, policy, want, lo, hi, skip, best);
        }
    }
}

fn merge(l: &Agg, r: &Agg) -> Agg {
    Agg {
        max_free: std::array::from_fn(|k| l.max_free[k].max(r.max_free[k])),
        min_free: std::array::from_fn(|k| l.min_free[k].min(r.min_free[k])),
        min_used: std::array::from_fn(|k| l.min_used[k].min(r.min_used[k])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::policy::{by_name, POLICIES};

    fn pool() -> Pool {
        Pool::new(vec![[8, 64, 0], [4, 32, 0], [16, 16, 0], [4, 8, 0], [32, 128, 0]])
    }

    /// Every policy's tree search finds the unit an exhaustive scan finds, whatever the state.
    #[test]
    fn search_agrees_with_a_scan() {
        let mut p = pool();
        let wants = [[1, 1, 0], [4, 8, 0], [4, 40, 0], [10, 10, 0], [0, 0, 0], [33, 1, 0], [2, 100, 0]];
        let mut taken = Vec::new();
        for step in 0..40usize {
            for name in POLICIES {
                let policy = by_name(name).unwrap();
                for want in &wants {
                    for (lo, hi) in [(0, 5), (1, 4), (2, 3), (3, 3)] {
                        let scan = (lo..hi).filter_map(|u| p.score(&*policy, u, want).map(|s| (s, u))).min_by(|a, b| a.partial_cmp(b).unwrap()).map(|(_, u)| u);
                        assert_eq!(p.search(&*policy, want, lo, hi, &[]), scan, "{name} {want:?} {lo}..{hi} at step {step}");
                    }
                }
            }
            let want = wants[step % wants.len()];
            if let Some(u) = p.search(&*by_name("first-fit").unwrap(), &want, 0, 5, &[]) {
                p.take(u, &want, true);
                taken.push((u, want));
            } else if let Some((u, w)) = taken.pop() {
                p.give(u, &w, true);
            }
        }
    }

    #[test]
    fn accounting_of_units_on_and_their_free_resources() {
        let mut p = pool();
        assert_eq!((p.on(), p.free_on(CPU)), (0, 0));
        p.take(1, &[1, 2, 0], true);
        p.take(1, &[1, 2, 0], true);
        p.take(4, &[2, 0, 0], true);
        assert_eq!((p.on(), p.free_on(CPU), p.free_on(MEM)), (2, 2 + 30, 28 + 128));
        p.give(1, &[1, 2, 0], true);
        assert_eq!((p.on(), p.free_on(CPU)), (2, 3 + 30));
        p.give(1, &[1, 2, 0], true);
        p.give(4, &[2, 0, 0], true);
        assert_eq!((p.on(), p.free_on(CPU), p.free_on(MEM)), (0, 0, 0));
        assert_eq!((p.total(CPU), p.total(MEM)), (64, 248));
    }

    #[test]
    fn skipped_units_are_not_chosen() {
        let p = pool();
        let bf = by_name("best-fit").unwrap();
        assert_eq!(p.search(&*bf, &[4, 8, 0], 0, 5, &[]), Some(3));
        assert_eq!(p.search(&*bf, &[4, 8, 0], 0, 5, &[3]), Some(1));
        assert_eq!(p.search(&*bf, &[4, 8, 0], 0, 5, &[3, 1, 0, 2, 4]), None);
    }
}
