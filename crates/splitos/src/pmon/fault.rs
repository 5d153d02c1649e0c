//! The fault workers of a process: each polls the process's userfaultfd and hands every fault
//! it reads to the miss path itself, so a miss crosses no thread boundary inside the
//! pComponent. Several workers serve several faulting threads of the program at once.
use std::sync::Arc;
use std::time::{Duration, Instant};

use splitos_rpc::poll::Poller;
use splitos_shim_abi::uffd::{PAGEFAULT_FLAG_WP, PAGEFAULT_FLAG_WRITE};

use super::miss::Access;
use super::uffd::{FaultWait, PAGE};
use super::{Pcomp, Proc};

pub fn worker(p: Arc<Pcomp>, proc_: Arc<Proc>) {
    let wait = match FaultWait::new(&proc_.uffd, &proc_.stop) {
        Ok(w) => w,
        Err(e) => {
            p.miss.fail(&proc_.tenant, &format!("cannot wait for page faults: {e}"));
            return;
        }
    };
    let poller = Poller::new(Duration::from_micros(p.cfg.fault_spin_us), p.cfg.fault_polling);
    let mut faults = Vec::with_capacity(16);
    while proc_.tenant.alive() {
        faults.clear();
        if wait.next(&proc_.uffd, &poller, 1000, &mut faults).is_none() {
            break;
        }
        let t0 = Instant::now();
        for &(flags, addr) in &faults {
            let access = if flags & PAGEFAULT_FLAG_WP != 0 {
                Access::WriteProtect
            } else if flags & PAGEFAULT_FLAG_WRITE != 0 {
                Access::Write
            } else {
                Access::Read
            };
            p.miss.fault(&proc_.tenant, addr / PAGE, access, t0);
        }
    }
}
