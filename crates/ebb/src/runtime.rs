//! A set of cores, each running an event loop on a thread of its own.
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::event::{self, EventLoop, LoopConfig, LoopCounts, Remote};
use crate::exec;

/// Cores running event loops; stops them when dropped.
pub struct Runtime {
    remotes: Vec<Arc<Remote>>,
    threads: Vec<JoinHandle<()>>,
}

impl Runtime {
    /// Starts `cores` loops (threads `NAME-0`, `NAME-1`, ...), running `init(core)` first on each.
    pub fn start(
        name: &str,
        cores: usize,
        cfg: LoopConfig,
        init: impl Fn(usize) + Send + Sync + 'static,
    ) -> io::Result<Runtime> {
        if cores == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a runtime needs at least one core",
            ));
        }
        let init = Arc::new(init);
        let (mut remotes, mut threads) = (Vec::new(), Vec::new());
        for core in 0..cores {
            let lp = EventLoop::new(core, cfg)?;
            remotes.push(lp.remote());
            let init = init.clone();
            lp.remote().spawn(move || init(core));
            threads.push(
                std::thread::Builder::new()
                    .name(format!("{name}-{core}"))
                    .spawn(move || lp.run())?,
            );
        }
        Ok(Runtime { remotes, threads })
    }

    pub fn cores(&self) -> usize {
        self.remotes.len()
    }

    pub fn remote(&self, core: usize) -> Arc<Remote> {
        self.remotes[core].clone()
    }

    /// Runs `f` on `core`'s loop.
    pub fn spawn_on(&self, core: usize, f: impl FnOnce() + Send + 'static) {
        self.remotes[core].spawn(f)
    }

    /// Runs `f` on `core`'s loop; its result comes back as a future.
    pub fn call_on<T: Send + 'static>(
        &self,
        core: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = Result<T, exec::Broken>> {
        let (p, r) = exec::oneshot();
        self.remotes[core].spawn(move || p.set(f()));
        r
    }

    /// Every core's counters.
    pub fn counts(&self) -> Vec<LoopCounts> {
        self.remotes.iter().map(|r| r.stats().counts()).collect()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        for r in &self.remotes {
            r.spawn(event::stop);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
