//! Processes that ended and whose memory their homes have not yet released. Natively an
//! ended process's memory is free before its parent learns that it ended; here its home
//! releases it when this pComponent tells it, a moment later. A program of a vNode at its
//! memory quota started (or growing) in that moment would be refused memory the ended process
//! no longer uses: a call refused so waits for those releases and is tried again.
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::*;

/// How long a refused call waits for its vNode's ended processes to be released: a home that
/// does not answer within it leaves the refusal standing.
const RELEASE_WAIT: Duration = Duration::from_secs(5);
/// How often that wait looks again for ended processes still in the table: their threads'
/// releases wake it when they end, but not when they begin.
const POLL_ENDS: Duration = Duration::from_millis(1);

/// Releases under way, counted by vNode, from the moment this pComponent takes an ended
/// process out of its table until its home has answered.
#[derive(Default)]
pub(crate) struct Ending {
    by_vnode: Mutex<BTreeMap<String, usize>>,
    released: Condvar,
    /// Calls refused for memory that were tried again after ended processes were released.
    retried: AtomicU64,
}

impl Ending {
    /// Runs `take` (which takes a process of `vnode` out of the table) and counts its release
    /// as under way, at once for [`Ending::wait`].
    fn begin<T>(&self, vnode: &str, take: impl FnOnce() -> T) -> T {
        let mut all = self.by_vnode.lock().unwrap();
        let taken = take();
        *all.entry(vnode.to_string()).or_default() += 1;
        taken
    }

    fn end(&self, vnode: &str) {
        let mut all = self.by_vnode.lock().unwrap();
        if let Some(n) = all.get_mut(vnode) {
            *n -= 1;
            if *n == 0 {
                all.remove(vnode);
            }
        }
        self.released.notify_all();
    }

    /// Waits until no release of `vnode`'s is under way and `unreleased` (whether an ended
    /// process of it is still in the table) says false, at most until `until`: whether there
    /// was any to wait for.
    fn wait(&self, vnode: &str, until: Instant, unreleased: impl Fn() -> bool) -> bool {
        let mut all = self.by_vnode.lock().unwrap();
        let mut any = false;
        loop {
            // Under this lock an ended process is in the table or counted here.
            let waiting = all.contains_key(vnode) || unreleased();
            any |= waiting;
            let Some(left) = until.checked_duration_since(Instant::now()).filter(|_| waiting) else {
                break;
            };
            all = self.released.wait_timeout(all, left.min(POLL_ENDS)).unwrap().0;
        }
        if any {
            self.retried.fetch_add(1, Relaxed);
            crate::series::CALLS_RETRIED_AFTER_RELEASES.increment(1);
        }
        any
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({"retried_after_releases": self.retried.load(Relaxed)})
    }
}

/// Whether the process of `pidfd` has ended (a zombie has: its memory is gone, only its
/// parent has yet to hear of it).
fn ended(pidfd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: polls one pollfd that lives through the call, without waiting.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

impl Pcomp {
    /// Releases a process that ended (or exec'd) at its home.
    pub(super) fn exit_process(&self, p: &Arc<Proc>) {
        let vnode = &p.memory.who.vnode;
        self.ending.begin(vnode, || self.procs.lock().unwrap().remove(&p.pid));
        let one: u64 = 1;
        // SAFETY: writes the 8 bytes of `one` to the process's own eventfd.
        unsafe { libc::write(p.stop.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
        self.miss.remove(&p.heap);
        self.store.detach(p.pid);
        if let Err(e) = p.memory.call_home(
            &self.node,
            P2M_EXIT {
                who: p.memory.who.clone(),
            },
        ) {
            tracing::warn!(pid = p.pid, error = %e, "home did not release an exited process");
        }
        self.ending.end(vnode);
        tracing::info!(pid = p.pid, os_pid = p.os_pid, "process exited; its memory is released");
    }

    /// After a call of process `caller` of `vnode` was refused for memory: waits until the
    /// vNode's other processes that ended (or exec'd: the image they were admitted with is
    /// gone) are released at their homes; their connections' threads see the ends at once, but
    /// a call may beat them. Whether there were any, so that the call is worth trying again.
    pub(super) fn release_ended(&self, vnode: &str, caller: u64) -> bool {
        self.ending.wait(vnode, Instant::now() + RELEASE_WAIT, || {
            self.procs.lock().unwrap().values().any(|o| {
                o.pid != caller && o.memory.who.vnode == vnode && (o.replaced.load(Relaxed) || ended(&o.pidfd))
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn a_refused_call_waits_for_its_vnodes_releases_and_no_other_vnodes() {
        let e = Arc::new(Ending::default());
        let soon = || Instant::now() + Duration::from_secs(5);
        // Nothing ended: the refusal stands at once.
        assert!(!e.wait("a", soon(), || false));
        // One of a's processes ended and its thread has not yet taken it out of the table;
        // then it does, and its home answers 50 ms later.
        let in_table = Arc::new(AtomicBool::new(true));
        let (e2, t2) = (e.clone(), in_table.clone());
        // Before the releaser starts its sleeps, which the bound below adds up.
        let t0 = Instant::now();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            e2.begin("a", || t2.store(false, Relaxed));
            std::thread::sleep(Duration::from_millis(50));
            e2.end("a");
        });
        assert!(!e.wait("b", soon(), || false), "b does not wait for a's release");
        assert!(e.wait("a", soon(), || in_table.load(Relaxed)));
        assert!(t0.elapsed() >= Duration::from_millis(70), "{:?}", t0.elapsed());
        releaser.join().unwrap();
        // A home that never answers: the wait gives up at its bound, saying there was one.
        e.begin("a", || ());
        let t0 = Instant::now();
        assert!(e.wait("a", Instant::now() + Duration::from_millis(30), || false));
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert_eq!(e.json()["retried_after_releases"], 2);
    }
}
