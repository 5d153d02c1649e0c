//! A running ExCache resized (`splitos cluster set-excache`, docs/elastic-memory.md): growing
//! gives every set more ways at once; shrinking takes the lines in the ways past the new end
//! out of their programs as the background evictor does (dirty ones written back first), so
//! nothing is lost and no miss waits on a line that is being dropped. And per-vNode shares:
//! lines a vNode keeps against other vNodes' misses.
use std::collections::HashMap;
use std::time::Duration;

use super::{LineState, MissPath};

/// How long a shrink waits for a line past the new end that is being filled or written back.
const SETTLE: Duration = Duration::from_millis(1);

impl MissPath {
    /// Process `pid` belongs to vNode `vnode`: its lines count against that vNode's share.
    pub fn set_vnode(&self, pid: u64, vnode: &str) {
        let mut g = self.state.lock().unwrap();
        let next = g.vnode_ids.len() as u32;
        let id = *g.vnode_ids.entry(vnode.to_string()).or_insert(next);
        g.cache.set_group(pid, id);
    }

    /// The cache holds `lines` lines from now on (rounded down to whole ways of every set);
    /// a shrink returns once the lines past the new size left, written back where dirty.
    /// Returns the new number of lines. Refused below the vNodes' shares, below the
    /// evictor's reserve plus one way, and beyond what the cache was started able to grow to.
    pub fn resize(&self, lines: usize) -> Result<usize, String> {
        let mut g = self.state.lock().unwrap();
        let ways = g.cache.ways_for(lines)?;
        if let Some(r) = g.reserve.as_ref().filter(|r| r.ways >= ways) {
            return Err(format!("{ways} ways per set leave none to fill beside the evictor's reserve of {} (evict_reserve)", r.ways));
        }
        let shared: usize = g.shares.values().sum();
        let new_lines = ways * g.cache.sets();
        if shared > new_lines {
            return Err(format!("the vNodes' shares add up to {shared} lines, more than {new_lines}"));
        }
        g.cache.resize(ways);
        loop {
            let beyond = g.cache.beyond();
            if beyond.is_empty() {
                break;
            }
            let mut victims = Vec::new();
            for (slot, line) in beyond {
                // Lines being filled, written back or evicted are waited for.
                if line.state == LineState::Ready {
                    g.cache.mark_evicting(slot);
                    victims.extend(self.victim_at(&mut g, slot));
                }
            }
            drop(g);
            if victims.is_empty() {
                std::thread::sleep(SETTLE);
            } else {
                self.evict_picked(victims);
            }
            g = self.state.lock().unwrap();
        }
        metrics::counter!("pcomp_excache_resizes_total").increment(1);
        Ok(new_lines)
    }

    /// Replaces every vNode's share of the cache (lines it keeps against other vNodes'
    /// misses while it holds no more). Refused when they add up to more than the cache.
    pub fn set_shares(&self, shares: HashMap<String, usize>) -> Result<(), String> {
        let mut g = self.state.lock().unwrap();
        let total: usize = shares.values().sum();
        if total > g.cache.lines() {
            return Err(format!("the shares add up to {total} lines, more than the ExCache's {}", g.cache.lines()));
        }
        let mut by_id = HashMap::new();
        for (vnode, lines) in &shares {
            let next = g.vnode_ids.len() as u32;
            let id = *g.vnode_ids.entry(vnode.clone()).or_insert(next);
            by_id.insert(id, *lines);
        }
        g.cache.set_shares(by_id);
        g.shares = shares;
        Ok(())
    }

    /// Each vNode's share (lines), and the lines its processes hold now.
    pub fn shares(&self) -> Vec<(String, usize, usize)> {
        let g = self.state.lock().unwrap();
        let mut out: Vec<(String, usize, usize)> = g.shares.iter().map(|(v, n)| (v.clone(), *n, g.vnode_ids.get(v).map_or(0, |id| g.cache.group_lines(*id)))).collect();
        out.sort();
        out
    }
}
