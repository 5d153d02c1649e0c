//! A caller's credits at one peer: the channels it may have open there at once, as the peer
//! grants them in each channel's header (the module documentation of shm.rs tells why).
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A caller's credits at one peer: channels open (in use or free) and how many the peer
/// grants. `gen` moves whenever a channel comes back or closes, for a caller waiting for one.
pub(super) struct Credits {
    state: Mutex<CreditState>,
    back: std::sync::Condvar,
}

struct CreditState {
    open: usize,
    granted: usize,
    gen: u64,
}

/// Credits a caller has at a peer before the peer's first channel says how many it grants: no
/// bound of its own, the server's refusals bound it. One credit (as over TCP) made every
/// caller at a peer that was still starting wait behind one handshake after another, each up
/// to its timeout.
const FIRST_CREDITS: usize = usize::MAX;

impl Credits {
    pub(super) fn new() -> Arc<Credits> {
        Arc::new(Credits {
            state: Mutex::new(CreditState {
                open: 0,
                granted: FIRST_CREDITS,
                gen: 0,
            }),
            back: std::sync::Condvar::new(),
        })
    }

    pub(super) fn gen(&self) -> u64 {
        self.state.lock().unwrap().gen
    }

    /// The channels open, and how many the peer grants.
    #[cfg(test)]
    pub(super) fn open_of_granted(&self) -> (usize, usize) {
        let s = self.state.lock().unwrap();
        (s.open, s.granted)
    }

    /// Takes a credit if one is left.
    pub(super) fn take(self: &Arc<Credits>) -> Option<Credit> {
        let mut s = self.state.lock().unwrap();
        (s.open < s.granted).then(|| {
            s.open += 1;
            Credit(self.clone())
        })
    }

    /// Waits until `deadline` for a credit or a channel to come back after `gen`; false if
    /// none did.
    pub(super) fn wait(&self, gen: u64, deadline: Instant) -> bool {
        let mut s = self.state.lock().unwrap();
        while s.gen == gen && s.open >= s.granted {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self.back.wait_timeout(s, left).unwrap().0;
        }
        true
    }

    pub(super) fn grant(&self, n: u32) {
        let mut s = self.state.lock().unwrap();
        s.granted = (n as usize).max(1);
        s.gen += 1;
        self.back.notify_all();
    }

    /// The server refused a channel: it grants no more than the channels open now.
    pub(super) fn refused(&self) {
        let mut s = self.state.lock().unwrap();
        s.granted = s.open.max(1);
    }

    /// A channel came back to the pool.
    pub(super) fn returned(&self) {
        self.state.lock().unwrap().gen += 1;
        self.back.notify_all();
    }
}

/// A channel's hold on one of its peer's credits, given back when the channel closes.
pub(super) struct Credit(pub(super) Arc<Credits>);

impl Drop for Credit {
    fn drop(&mut self) {
        let mut s = self.0.state.lock().unwrap();
        s.open -= 1;
        s.gen += 1;
        self.0.back.notify_all();
    }
}
