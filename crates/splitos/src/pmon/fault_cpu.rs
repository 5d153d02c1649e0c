//! Where a fault worker runs (`fault_cpu`): anywhere, polling for the next fault (`any`), or on
//! the CPU of the thread whose fault it serves, sleeping between faults (`faulting`), as LegoOS
//! serves a miss on the faulting CPU. The faulting thread sleeps until its page is installed,
//! so its CPU is free for the worker and for the components the worker calls (they follow it
//! there, [`splitos_rpc::cpu`]); each wake-up along the miss is then a context switch instead
//! of a wake-up across CPUs (docs/excache.md, "Fault delivery").
//!
//! A fault message names the faulting thread (the shim asks for `UFFD_FEATURE_THREAD_ID`); the
//! CPU a thread is on is field 39 of /proc/PID/task/TID/stat, a few microseconds to read, so
//! each worker keeps each thread's file open and reads it again only every [`REREAD_FAULTS`]
//! faults or [`REREAD_AFTER`]. While it sleeps in a fault, a thread stays on its CPU: the field
//! is where it faulted and where it wakes. A worker moves only after [`MOVE_AFTER`] faults in a
//! row from one other CPU: moving costs about what one fault served across CPUs does, so a
//! worker serving threads on several CPUs in turn stays where it is. The program's threads are
//! never moved, so a multi-threaded program keeps its parallelism.
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use serde::Deserialize;
use splitos_rpc::cpu::{self, Placement};

use super::stats::RunStats;

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum FaultCpu {
    #[default]
    Any,
    Faulting,
}

pub const FAULT_CPUS: &[&str] = &["any", "faulting"];

impl std::str::FromStr for FaultCpu {
    type Err = String;
    fn from_str(s: &str) -> Result<FaultCpu, String> {
        match s {
            "any" => Ok(FaultCpu::Any),
            "faulting" => Ok(FaultCpu::Faulting),
            _ => Err(format!("unknown fault_cpu {s:?} (known: {})", FAULT_CPUS.join(", "))),
        }
    }
}

impl std::fmt::Display for FaultCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FaultCpu::Any => "any",
            FaultCpu::Faulting => "faulting",
        })
    }
}

/// A thread's CPU is read again after this many of its faults...
const REREAD_FAULTS: u32 = 16;
/// ... or this long after it was last read.
const REREAD_AFTER: Duration = Duration::from_millis(1);
/// Faults in a row from threads on one other CPU before the worker moves there.
const MOVE_AFTER: u32 = 4;
/// Threads a worker keeps files of; beyond, it forgets them all (threads come and go).
const MAX_THREADS: usize = 256;

struct Thread {
    stat: File,
    cpu: Option<u32>,
    faults: u32,
    read: Instant,
}

/// One fault worker's knowledge of its process's threads, and its own placement.
pub struct Follower {
    os_pid: i32,
    threads: HashMap<u32, Thread>,
    place: Placement,
    /// The other CPU the latest faults came from, and how many in a row.
    streak: (u32, u32),
}

impl Follower {
    /// For the calling worker thread, serving the process `os_pid`. Its calls to other
    /// components ask them to follow it too.
    pub fn new(os_pid: i32) -> Follower {
        cpu::set_follow_me(true);
        Follower { os_pid, threads: HashMap::new(), place: Placement::new(), streak: (0, 0) }
    }

    /// Notes a fault of thread `tid` about to be served: counts whether the worker runs on
    /// that thread's CPU.
    pub fn fault(&mut self, tid: u32, stats: [&RunStats; 2]) {
        let Some(at) = self.cpu_of(tid) else { return };
        let here = cpu::current() == Some(at);
        for s in stats {
            let c = if here { &s.faults_on_faulting_cpu } else { &s.faults_off_faulting_cpu };
            c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if self.place.at() == Some(at) {
            self.streak = (0, 0);
        } else if self.streak.0 == at {
            self.streak.1 += 1;
        } else {
            self.streak = (at, 1);
        }
    }

    /// After the faults at hand were served: moves the worker to the CPU they came from, right
    /// away when it was never placed, else after a streak. True when it moved.
    pub fn settle(&mut self) -> bool {
        let (at, n) = self.streak;
        let due = n >= MOVE_AFTER || (n > 0 && self.place.at().is_none());
        if !due {
            return false;
        }
        self.streak = (0, 0);
        self.place.move_to(at)
    }

    /// The CPU thread `tid` is on, as last read; `None` when unknown (no thread id in the
    /// message, a thread that ended, or one not of this process).
    fn cpu_of(&mut self, tid: u32) -> Option<u32> {
        if tid == 0 {
            return None;
        }
        if self.threads.len() >= MAX_THREADS && !self.threads.contains_key(&tid) {
            self.threads.clear();
        }
        let t = match self.threads.get_mut(&tid) {
            Some(t) => t,
            None => {
                let stat = File::open(format!("/proc/{}/task/{tid}/stat", self.os_pid)).ok()?;
                let cpu = read_cpu(&stat);
                self.threads.entry(tid).or_insert(Thread { stat, cpu, faults: 0, read: Instant::now() })
            }
        };
        t.faults += 1;
        if t.faults >= REREAD_FAULTS || t.read.elapsed() >= REREAD_AFTER {
            t.cpu = read_cpu(&t.stat);
            (t.faults, t.read) = (0, Instant::now());
        }
        let cpu = t.cpu;
        if cpu.is_none() {
            // Ended, or its id was taken by another thread since: open it again next time.
            self.threads.remove(&tid);
        }
        cpu
    }
}

/// Field 39 (processor) of a /proc/PID/task/TID/stat file; the fields after the command name,
/// which may hold spaces and parentheses, start at field 3.
fn read_cpu(stat: &File) -> Option<u32> {
    let mut buf = [0u8; 1024];
    let n = stat.read_at(&mut buf, 0).ok()?;
    let line = std::str::from_utf8(&buf[..n]).ok()?;
    line.rsplit_once(')')?.1.split_whitespace().nth(39 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_threads_cpu_is_read_from_proc() {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let mut f = Follower { os_pid: std::process::id() as i32, threads: HashMap::new(), place: Placement::new(), streak: (0, 0) };
        let mut p = Placement::new();
        let here = cpu::current().unwrap();
        p.move_to(here);
        assert_eq!(f.cpu_of(tid), Some(here));
        assert_eq!(f.cpu_of(999_999_999), None, "no such thread");
        p.release();
    }

    #[test]
    fn a_worker_moves_at_once_when_unplaced_and_after_a_streak_when_placed() {
        let h = std::thread::spawn(|| {
            let mut f = Follower { os_pid: 0, threads: HashMap::new(), place: Placement::new(), streak: (0, 0) };
            let here = cpu::current().unwrap();
            f.streak = (here, 1);
            assert!(f.settle(), "unplaced: moves with the first fault");
            assert_eq!(f.place.at(), Some(here));
            let other = (0..64).find(|c| *c != here && f.place.allows(*c));
            if let Some(other) = other {
                f.streak = (other, MOVE_AFTER - 1);
                assert!(!f.settle(), "placed: stays for a short streak");
                f.streak = (other, MOVE_AFTER);
                assert!(f.settle());
                assert_eq!(f.place.at(), Some(other));
            }
        });
        h.join().unwrap();
    }

    #[test]
    fn names_parse_and_bad_ones_are_refused() {
        assert_eq!("faulting".parse::<FaultCpu>(), Ok(FaultCpu::Faulting));
        assert_eq!(FaultCpu::Any.to_string(), "any");
        assert!("sometimes".parse::<FaultCpu>().unwrap_err().contains("any, faulting"));
    }
}
