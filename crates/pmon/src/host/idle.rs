//! Idle polling: while programs run on this pComponent, it asks the kernel to keep idle CPUs
//! polling instead of entering idle states (a CPU latency QoS request of 0 µs through
//! `/dev/cpu_dma_latency`). A thread waiting for a miss sleeps in the kernel, and its CPU goes
//! idle; on a virtual machine an idle CPU halts and only the hypervisor can wake it, which
//! costs the install's wake-up and the thread's return tens of microseconds a miss
//! (docs/excache.md). The request belongs to the open descriptor: the kernel drops it when the
//! last program exits, or when the pComponent dies.
use std::fs::File;
use std::io::Write;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use splitos_metrics::counters;

counters! {
    /// Counters of idle polling, for the whole pComponent (`idle_poll` in its statistics;
    /// Prometheus `pcomp_idle_poll_<counter>_total`).
    pub struct IdlePollStats: "pcomp_idle_poll" {
        /// Times the request was made (the first program started after none ran).
        requests,
        /// Times it was dropped (the last running program exited).
        releases,
        /// Times the kernel refused it (no `/dev/cpu_dma_latency`, or no permission): programs
        /// run with the kernel's idle states.
        refused,
    }
}

const DEVICE: &str = "/dev/cpu_dma_latency";

pub struct CpuLatency {
    on: bool,
    /// Programs holding the request, and the descriptor that makes it while any do.
    held: Mutex<(usize, Option<File>)>,
    pub stats: IdlePollStats,
}

/// One running program's share of the request; dropping it gives the share back.
pub struct LatencyHold(Arc<CpuLatency>);

impl CpuLatency {
    pub fn new(on: bool) -> Arc<CpuLatency> {
        Arc::new(CpuLatency {
            on,
            held: Mutex::new((0, None)),
            stats: IdlePollStats::default(),
        })
    }

    /// Whether the request is in force now.
    pub fn in_force(&self) -> bool {
        self.held.lock().unwrap().1.is_some()
    }

    /// A program starts: the first one makes the request. None when idle polling is off.
    pub fn hold(self: &Arc<Self>) -> Option<LatencyHold> {
        if !self.on {
            return None;
        }
        let mut g = self.held.lock().unwrap();
        g.0 += 1;
        if g.0 == 1 {
            match request() {
                Ok(f) => {
                    g.1 = Some(f);
                    self.stats.requests.fetch_add(1, Relaxed);
                }
                Err(e) => {
                    if self.stats.refused.fetch_add(1, Relaxed) == 0 {
                        tracing::warn!(error = %e, "idle_poll = \"on\": the kernel refused the CPU latency request; idle CPUs halt as usual");
                    }
                }
            }
        }
        Some(LatencyHold(self.clone()))
    }
}

/// Makes the request; it holds while the descriptor stays open.
pub fn request() -> std::io::Result<File> {
    let mut f = std::fs::OpenOptions::new().write(true).open(DEVICE)?;
    f.write_all(&0i32.to_ne_bytes())?;
    Ok(f)
}

impl Drop for LatencyHold {
    fn drop(&mut self) {
        let mut g = self.0.held.lock().unwrap();
        g.0 -= 1;
        if g.0 == 0 && g.1.take().is_some() {
            self.0.stats.releases.fetch_add(1, Relaxed);
        }
    }
}
