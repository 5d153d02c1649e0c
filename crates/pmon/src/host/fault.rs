//! The fault workers of a process: each polls the process's userfaultfd and hands every fault
//! it reads to the miss path itself, so a miss crosses no thread boundary inside the
//! pComponent. Several workers serve several faulting threads of the program at once. With
//! `fault_cpu = "faulting"` each worker runs on the CPU of the thread whose fault it serves
//! and sleeps between faults ([`fault_cpu`](super::fault_cpu)).
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use splitos_rpc::poll::Poller;
use splitos_shim_abi::uffd::{PAGEFAULT_FLAG_WP, PAGEFAULT_FLAG_WRITE};

use super::fault_cpu::Follower;
use super::uffd::{FaultWait, PAGE};
use crate::{Pcomp, Proc};
use splitos_core::config::FaultCpu;
use splitos_excache::miss::Access;

pub fn worker(p: Arc<Pcomp>, proc_: Arc<Proc>) {
    let wait = match FaultWait::new(&proc_.uffd, &proc_.stop) {
        Ok(w) => w,
        Err(e) => {
            p.miss.fail(&proc_.heap, &format!("cannot wait for page faults: {e}"));
            return;
        }
    };
    let mut follower = (p.cfg.fault_cpu == FaultCpu::Faulting).then(|| Follower::new(proc_.os_pid));
    let polling = Poller::new(Duration::from_micros(p.cfg.fault_spin_us), p.cfg.fault_polling);
    // Beside the faulting thread a worker sleeps at once: polling would hold that CPU from the
    // program's other threads and from the components serving the miss.
    let sleeping = Poller::new(Duration::ZERO, p.cfg.fault_polling);
    let stats = [&*proc_.heap.stats, &**p.miss.total()];
    let mut faults = Vec::with_capacity(16);
    while proc_.heap.alive() {
        faults.clear();
        let poller = if follower.as_ref().is_some_and(Follower::beside) {
            &sleeping
        } else {
            &polling
        };
        if wait.next(&proc_.uffd, poller, 1000, &mut faults).is_none() {
            break;
        }
        let t0 = Instant::now();
        for f in &faults {
            // A program may register other ranges of its own with its userfaultfd: their
            // faults are none of the heap's, and must not reach the shared ExCache.
            if !proc_.heap_range.contains(&f.addr) {
                crate::series::FAULT_EVENTS_REFUSED.increment(1);
                p.miss.fail(
                    &proc_.heap,
                    &format!(
                        "a page fault at {:#x}, outside its heap region {:#x}..{:#x}, was refused",
                        f.addr, proc_.heap_range.start, proc_.heap_range.end
                    ),
                );
                break;
            }
            if let Some(fo) = &mut follower {
                fo.fault(f.tid, stats);
            }
            let access = if f.flags & PAGEFAULT_FLAG_WP != 0 {
                Access::WriteProtect
            } else if f.flags & PAGEFAULT_FLAG_WRITE != 0 {
                Access::Write
            } else {
                Access::Read
            };
            p.miss.fault(&proc_.heap, f.addr / PAGE, access, t0);
        }
        // Moving after the faults at hand were served keeps the move off their wait.
        if follower.as_mut().is_some_and(|fo| fo.settle()) {
            for s in stats {
                s.fault_worker_moves.fetch_add(1, Relaxed);
            }
        }
    }
}
