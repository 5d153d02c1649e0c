//! A running ExCache resized (`splitos cluster set-excache`, docs/elastic-memory.md): growing
//! gives every set more ways at once; shrinking takes the lines in the ways past the new end
//! out of their programs as the background evictor does (dirty ones written back first), so
//! nothing is lost and no miss waits on a line that is being dropped. And per-vNode shares:
//! lines a vNode keeps against other vNodes' misses.
use std::collections::HashMap;
use std::time::Duration;

use super::{LineState, MissPath, State};
use crate::Interleave;

/// How long a shrink waits for lines past the new end that are being filled or written back.
const SETTLE: Duration = Duration::from_millis(1);

/// Why a running ExCache was not resized or given new shares.
#[derive(Debug, thiserror::Error)]
pub enum ResizeError {
    #[error("{lines} lines: the ExCache has {sets} sets and grows to {ways} ways each, so it holds {sets} to {} lines", sets * ways)]
    Lines { lines: usize, sets: usize, ways: usize },
    #[error("{ways} ways per set leave none to fill beside the evictor's reserve of {reserve} (evict_reserve)")]
    Reserve { ways: usize, reserve: usize },
    #[error("the vNodes' shares add up to {shared} lines, more than the ExCache's {lines}")]
    Shares { shared: usize, lines: usize },
}

impl splitos_rpc::Refuse for ResizeError {
    fn code(&self) -> splitos_rpc::ErrCode {
        splitos_rpc::ErrCode::Invalid
    }
}

impl MissPath {
    /// Process `pid`'s job chose its own interleaving (`None`: none) over the pComponent's.
    pub fn set_interleave(&self, pid: u64, interleave: Option<Interleave>) {
        self.state.lock().unwrap().cache.set_interleave(pid, interleave);
    }

    /// The interleaving process `pid`'s job chose, if it chose one: a forked child keeps it.
    pub fn job_interleave(&self, pid: u64) -> Option<Option<Interleave>> {
        self.state.lock().unwrap().cache.job_interleave(pid)
    }

    /// Process `pid` belongs to vNode `vnode`: its lines count against that vNode's share.
    pub fn set_vnode(&self, pid: u64, vnode: &str) {
        let mut g = self.state.lock().unwrap();
        let id = vnode_id(&mut g, vnode);
        g.cache.set_group(pid, id);
    }

    /// Resizes the cache to `lines` lines (rounded down to whole ways of every set) and
    /// replaces every vNode's share (lines it keeps against other vNodes' misses while it
    /// holds no more), each left as it is when `None`; both are checked before either is
    /// applied. A shrink returns once the lines past the new size left, written back where
    /// dirty. Returns the number of lines. Refused beyond what the cache was started able to
    /// grow to, below the evictor's reserve plus one way, and for shares over the size.
    pub fn reconfigure(
        &self,
        lines: Option<usize>,
        shares: Option<HashMap<String, usize>>,
    ) -> Result<usize, ResizeError> {
        let mut g = self.state.lock().unwrap();
        let ways = match lines {
            Some(n) => g.cache.ways_for(n)?,
            None => g.cache.ways(),
        };
        if let Some(r) = g.reserve.as_ref().filter(|r| r.ways >= ways) {
            return Err(ResizeError::Reserve { ways, reserve: r.ways });
        }
        let new_lines = ways * g.cache.sets();
        let shared = match &shares {
            Some(s) => s.values().fold(0usize, |a, n| a.saturating_add(*n)),
            None => g.cache.shares().values().sum(),
        };
        if shared > new_lines {
            return Err(ResizeError::Shares {
                shared,
                lines: new_lines,
            });
        }
        if let Some(shares) = shares {
            let by_id = shares.iter().map(|(vnode, n)| (vnode_id(&mut g, vnode), *n)).collect();
            g.cache.set_shares(by_id);
        }
        if ways == g.cache.ways() {
            return Ok(new_lines);
        }
        g.cache.resize(ways);
        crate::series::EXCACHE_RESIZES.increment(1);
        // Misses waiting for a way may take the new ones.
        self.cv.notify_all();
        let mut left = usize::MAX;
        loop {
            let beyond = g.cache.beyond();
            if beyond.is_empty() {
                return Ok(new_lines);
            }
            // Lines being filled, written back or evicted are waited for, as are lines that
            // could not be taken out (their process's memory could not be protected or read):
            // a pass that took nothing out sleeps before the next.
            let progress = beyond.len() < left;
            left = beyond.len();
            let mut victims = Vec::new();
            for (slot, line) in beyond {
                if line.state == LineState::Ready {
                    g.cache.mark_evicting(slot);
                    // Past the end, a line leaves whether or not the program touched it.
                    victims.extend(self.victim_at(&mut g, slot).map(|mut v| {
                        v.unmapped = false;
                        v
                    }));
                }
            }
            drop(g);
            if !progress || victims.is_empty() {
                std::thread::sleep(SETTLE);
            }
            if !victims.is_empty() {
                self.evict_picked(victims);
            }
            g = self.state.lock().unwrap();
        }
    }

    /// Each vNode's share (lines), and the lines its processes hold now.
    pub fn shares(&self) -> Vec<(String, usize, usize)> {
        let g = self.state.lock().unwrap();
        let mut out: Vec<(String, usize, usize)> = g
            .vnode_ids
            .iter()
            .filter_map(|(v, id)| {
                g.cache
                    .shares()
                    .get(id)
                    .map(|n| (v.clone(), *n, g.cache.group_lines(*id)))
            })
            .collect();
        out.sort();
        out
    }
}

/// The id the cache knows vNode `vnode` by (one per vNode this pComponent has seen).
fn vnode_id(st: &mut State, vnode: &str) -> u32 {
    let next = st.vnode_ids.len() as u32;
    *st.vnode_ids.entry(vnode.to_string()).or_insert(next)
}
