//! Serving a caller on the caller's own CPU. On a virtual machine, waking a thread on another
//! CPU costs an inter-processor interrupt and, when that vCPU halted, a VM exit: 20-50 µs on
//! the 2-vCPU machines we measured, against a context switch when the waker and the woken
//! thread share a CPU. A caller that sleeps while it waits for its answer leaves its CPU free
//! for whoever serves it; a server that runs there, and sleeps rather than polls between
//! requests (a poller on the caller's CPU only keeps it from the caller), answers at the cost
//! of two context switches.
//!
//! A thread asks for that with [`set_follow_me`]: its shared-memory calls then tell the
//! channel's server thread which CPU to run on (transport.md, "Following the caller"). A thread
//! moves itself with a [`Placement`].
use std::cell::Cell;

thread_local! {
    static FOLLOW_ME: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread's shared-memory calls ask their server to come to its CPU and to
/// sleep rather than poll; the calling thread then sleeps while it waits for each answer.
pub fn set_follow_me(on: bool) {
    FOLLOW_ME.with(|f| f.set(on));
}

/// The CPU the calling thread's server should run on: its own, if it asked to be followed.
pub fn followed_at() -> Option<u32> {
    if FOLLOW_ME.with(Cell::get) {
        current()
    } else {
        None
    }
}

/// The CPU the calling thread runs on now (through the vDSO: no system call).
pub fn current() -> Option<u32> {
    // SAFETY: sched_getcpu has no preconditions.
    u32::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// Where the calling thread may run: the CPUs it was allowed when it started (which an
/// operator may have narrowed with taskset or a cpuset, and which it never leaves), and the one
/// of them it was moved onto, if any. Each thread owns its own.
pub struct Placement {
    allowed: libc::cpu_set_t,
    at: Option<u32>,
}

impl Default for Placement {
    fn default() -> Self {
        Placement::new()
    }
}

impl Placement {
    /// The calling thread's placement as it is now.
    pub fn new() -> Placement {
        // SAFETY: cpu_set_t is a plain bit array; all zeros is the empty set.
        let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `allowed` is a writable cpu_set_t of the size passed. On failure it stays
        // empty, and the thread is never moved.
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut allowed) };
        Placement { allowed, at: None }
    }

    /// The CPU the thread was moved onto, if it was.
    pub fn at(&self) -> Option<u32> {
        self.at
    }

    /// Whether the thread may run on `cpu`.
    pub fn allows(&self, cpu: u32) -> bool {
        // SAFETY: CPU_ISSET only reads the set; the index is checked against its size first.
        (cpu as usize) < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu as usize, &self.allowed) }
    }

    /// Moves the calling thread onto `cpu` alone. False when it is there already, when it may
    /// not run there, or when the kernel refused (a CPU gone offline).
    pub fn move_to(&mut self, cpu: u32) -> bool {
        if self.at == Some(cpu) || !self.allows(cpu) {
            return false;
        }
        // SAFETY: as in `new`.
        let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is below CPU_SETSIZE (checked by `allows`).
        unsafe { libc::CPU_SET(cpu as usize, &mut one) };
        if self.set(&one) {
            self.at = Some(cpu);
            true
        } else {
            false
        }
    }

    /// Lets the thread run on all its CPUs again (it stays where it is until the scheduler
    /// moves it).
    pub fn release(&mut self) {
        if self.at.is_some() && self.set(&self.allowed) {
            self.at = None;
        }
    }

    fn set(&self, set: &libc::cpu_set_t) -> bool {
        // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) == 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_moves_onto_a_cpu_it_may_run_on_and_back() {
        std::thread::spawn(|| {
            let mut p = Placement::new();
            let cpu = current().unwrap();
            assert!(p.allows(cpu));
            assert!(!p.allows(libc::CPU_SETSIZE as u32 + 5), "beyond the set");
            assert!(p.move_to(cpu));
            assert!(!p.move_to(cpu), "already there");
            assert_eq!(current(), Some(cpu));
            assert_eq!(p.at(), Some(cpu));
            p.release();
            assert_eq!(p.at(), None);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn only_a_thread_that_asked_is_followed() {
        std::thread::spawn(|| {
            assert_eq!(followed_at(), None);
            set_follow_me(true);
            assert!(followed_at().is_some());
            set_follow_me(false);
            assert_eq!(followed_at(), None);
        })
        .join()
        .unwrap();
    }
}
