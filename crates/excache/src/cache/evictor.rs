//! What the background evictor (miss/evictor.rs) asks of the cache: how many ways a set has
//! spare, its victims marked `Evicting` while they are taken out (with their neighbours), and
//! those that stay after all.
use super::{ExCache, Line, LineState};

impl ExCache {
    /// Ways of `set` that are free or being freed by the background evictor.
    pub fn spare(&self, set: usize) -> usize {
        self.ways - self.held[set] + self.evicting[set]
    }

    /// Whether the background evictor may not pick victims now: floors or shares are set.
    pub fn evictor_stands_aside(&self) -> bool {
        self.floor > 0 || !self.shares.is_empty()
    }

    /// Has the policy choose a victim in `set`, full or not, and marks it `Evicting`: it stays
    /// resident, and no miss or policy takes it, until [`ExCache::remove`] or
    /// [`ExCache::keep`]. `None` if no line of the set is `Ready`, and while processes keep
    /// floors or vNodes shares: who keeps which lines depends on whose miss needs the way,
    /// which only a miss knows, so misses evict inline then.
    pub fn pick(&mut self, set: usize) -> Option<usize> {
        if self.evictor_stands_aside() {
            return None;
        }
        let base = set * self.stride;
        let i = self
            .policy
            .victim(set, &mut self.slots[base..base + self.ways], &mut self.hands[set])?;
        self.line_mut(base + i).state = LineState::Evicting;
        self.evicting[set] += 1;
        Some(base + i)
    }

    /// Marks `Evicting`, beside the line in `slot` that [`ExCache::pick`] chose, the lines of
    /// its process on either side of it, up to `reach` pages each way, as long as each is a
    /// candidate its policy would let go soon ([`super::EvictionPolicy::cold`]) and was filled before
    /// the last three quarters of the cache's fills, and `stays` does not name it. The first
    /// line that is not (or a page not resident) ends the run on its side. Returns their slots.
    pub fn pick_beside(&mut self, slot: usize, reach: u64, stays: impl Fn(&Line) -> bool) -> Vec<usize> {
        let victim = *self.line(slot);
        // Not the newest lines, which the policy may still know nothing of: a miss's
        // read-ahead and fault-around sit beside it, unused as yet.
        let old = self.seq.saturating_sub(self.lines() as u64 * 3 / 4);
        let mut out = Vec::new();
        for step in [u64::checked_add, u64::checked_sub] {
            for d in 1..=reach {
                let Some(s) = step(victim.vpn, d).and_then(|vpn| self.lookup(victim.pid, vpn)) else {
                    break;
                };
                let (set, way) = (s / self.stride, s % self.stride);
                let l = self.line(s);
                if way >= self.ways || !l.candidate() || l.seq > old || !self.policy.cold(set, way, l) || stays(l) {
                    break;
                }
                self.line_mut(s).state = LineState::Evicting;
                self.evicting[set] += 1;
                out.push(s);
            }
        }
        out
    }

    /// A line [`ExCache::pick`] chose stays after all.
    pub fn keep(&mut self, slot: usize) {
        self.line_mut(slot).state = LineState::Ready;
        if slot % self.stride < self.ways {
            self.evicting[slot / self.stride] -= 1;
        }
    }
}
