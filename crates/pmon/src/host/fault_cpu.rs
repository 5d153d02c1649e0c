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
//! is where it faulted. A worker moves only after [`MOVE_AFTER`] faults in a row from one
//! other CPU: moving costs about what one fault served across CPUs does, so a worker serving
//! threads on several CPUs in turn stays where it is. The program's threads are never moved
//! or pinned (a program that reads its affinity sees what it sees natively, and a
//! multi-threaded program keeps its parallelism); so the scheduler decides where a woken
//! thread runs, and the worker adapts to that ([`Follower`]).
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use splitos_rpc::cpu::{self, Placement};

use splitos_excache::stats::RunStats;

/// A thread's CPU is read again after this many of its faults...
const REREAD_FAULTS: u32 = 16;
/// ... or this long after it was last read.
const REREAD_AFTER: Duration = Duration::from_millis(1);
/// After the worker moved beside a thread, that thread's CPU is read at each of its next this
/// many faults, to see at once whether the scheduler put it elsewhere.
const CHECK_AFTER_MOVE: u32 = 4;
/// Faults in a row from threads on one other CPU before the worker moves there.
const MOVE_AFTER: u32 = 4;
/// How long a worker whose thread left its CPU serves from elsewhere before trying again: at
/// first, and at most (it doubles with each try that ends within [`SETTLED`]).
const APART_MIN: Duration = Duration::from_millis(10);
const APART_MAX: Duration = Duration::from_millis(200);
const SETTLED: Duration = Duration::from_millis(100);
/// Threads a worker keeps files of; beyond, it forgets them all (threads come and go).
const MAX_THREADS: usize = 256;

struct Thread {
    stat: File,
    cpu: Option<u32>,
    faults: u32,
    read: Instant,
    /// Faults left at which the CPU is read every time.
    check: u32,
}

/// One fault worker's knowledge of its process's threads, and its own placement.
///
/// Beside a thread, the worker shares its CPU. When it wakes the thread there (installing its
/// page) while another CPU idles, the scheduler puts the thread on the idle CPU: then serving
/// beside it buys nothing, for the thread flees every time, and the worker serves from
/// elsewhere as with `any` (polling, its calls not followed) for a while, trying again after
/// [`APART_MIN`], doubling up to [`APART_MAX`] while the thread keeps fleeing. So the worker
/// sits beside the program when the machine is busy (where it pays) and polls on an idle CPU
/// when there is one (where polling costs nobody anything).
pub struct Follower {
    os_pid: i32,
    threads: HashMap<u32, Thread>,
    place: Placement,
    /// The other CPU the latest faults came from, how many in a row, and the latest thread.
    streak: (u32, u32, u32),
    /// The thread the worker moved beside, and when.
    lead: Option<(u32, Instant)>,
    /// Serving from elsewhere until then.
    apart_until: Option<Instant>,
    apart_for: Duration,
}

impl Follower {
    /// For the calling worker thread, serving the process `os_pid`.
    pub fn new(os_pid: i32) -> Follower {
        Follower {
            os_pid,
            threads: HashMap::new(),
            place: Placement::new(),
            streak: (0, 0, 0),
            lead: None,
            apart_until: None,
            apart_for: APART_MIN,
        }
    }

    /// Whether the worker serves beside a faulting thread now: it then sleeps between faults,
    /// and its calls ask the components to follow it. Until it first moved, and while apart,
    /// it serves as with `any`.
    pub fn beside(&self) -> bool {
        self.place.at().is_some()
    }

    /// Notes a fault of thread `tid` about to be served: counts whether the worker runs on
    /// that thread's CPU; sees whether the thread it sits beside left it.
    pub fn fault(&mut self, tid: u32, stats: [&RunStats; 2]) {
        let Some(at) = self.cpu_of(tid) else { return };
        let here = cpu::current() == Some(at);
        for s in stats {
            let c = if here {
                &s.faults_on_faulting_cpu
            } else {
                &s.faults_off_faulting_cpu
            };
            c.fetch_add(1, Relaxed);
        }
        if self.apart_until.is_some() {
            return;
        }
        if let Some((lead, since)) = self.lead {
            if lead == tid && self.place.at() != Some(at) {
                self.part(since, stats);
                return;
            }
        }
        if self.place.at() == Some(at) {
            self.streak = (0, 0, 0);
        } else if self.streak.0 == at && self.streak.1 > 0 {
            self.streak = (at, self.streak.1 + 1, tid);
        } else {
            self.streak = (at, 1, tid);
        }
    }

    /// The thread the worker sat beside was put on another CPU: serve from elsewhere for a
    /// while, longer if it did not stay long.
    fn part(&mut self, since: Instant, stats: [&RunStats; 2]) {
        self.apart_for = if since.elapsed() < SETTLED {
            (self.apart_for * 2).min(APART_MAX)
        } else {
            APART_MIN
        };
        self.apart_until = Some(Instant::now() + self.apart_for);
        self.lead = None;
        self.streak = (0, 0, 0);
        self.place.release();
        cpu::set_follow_me(false);
        for s in stats {
            s.fault_worker_partings.fetch_add(1, Relaxed);
        }
    }

    /// After the faults at hand were served: moves the worker to the CPU they came from, right
    /// away when it was not placed, else after a streak; ends a time apart that is over. True
    /// when it moved.
    pub fn settle(&mut self) -> bool {
        if let Some(until) = self.apart_until {
            if Instant::now() < until {
                return false;
            }
            self.apart_until = None;
        }
        let (at, n, tid) = self.streak;
        let due = n >= MOVE_AFTER || (n > 0 && self.place.at().is_none());
        if !due {
            return false;
        }
        self.streak = (0, 0, 0);
        if !self.place.move_to(at) {
            return false;
        }
        cpu::set_follow_me(true);
        self.lead = Some((tid, Instant::now()));
        if let Some(t) = self.threads.get_mut(&tid) {
            t.check = CHECK_AFTER_MOVE;
        }
        true
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
                self.threads.entry(tid).or_insert(Thread {
                    stat,
                    cpu,
                    faults: 0,
                    read: Instant::now(),
                    check: 0,
                })
            }
        };
        t.faults += 1;
        if t.check > 0 || t.faults >= REREAD_FAULTS || t.read.elapsed() >= REREAD_AFTER {
            t.cpu = read_cpu(&t.stat);
            (t.faults, t.read, t.check) = (0, Instant::now(), t.check.saturating_sub(1));
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
        let mut f = Follower::new(std::process::id() as i32);
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
            let mut f = Follower::new(0);
            let here = cpu::current().unwrap();
            f.streak = (here, 1, 7);
            assert!(f.settle(), "unplaced: moves with the first fault");
            assert_eq!(f.place.at(), Some(here));
            let other = (0..64).find(|c| *c != here && f.place.allows(*c));
            if let Some(other) = other {
                f.streak = (other, MOVE_AFTER - 1, 7);
                assert!(!f.settle(), "placed: stays for a short streak");
                f.streak = (other, MOVE_AFTER, 7);
                assert!(f.settle());
                assert_eq!(f.place.at(), Some(other));
            }
        });
        h.join().unwrap();
    }

    #[test]
    fn a_worker_whose_thread_leaves_its_cpu_serves_from_elsewhere_for_a_while() {
        let p = Placement::new();
        let cpus: Vec<u32> = (0..64).filter(|c| p.allows(*c)).take(2).collect();
        if cpus.len() < 2 {
            use std::io::Write;
            // Past the harness's capture, which hides a passing test's output: the skip shows.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: {}: needs two usable CPUs, has {cpus:?}",
                std::thread::current().name().unwrap_or("a test")
            );
            return;
        }
        // A "faulting" thread that sits on the first CPU, then moves to the second when told.
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<u32>();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let first = cpus[0];
        let t = std::thread::spawn(move || {
            let mut p = Placement::new();
            for cpu in std::iter::once(first).chain(go_rx.iter()) {
                assert!(p.move_to(cpu));
                // SAFETY: gettid has no preconditions.
                tid_tx.send(unsafe { libc::gettid() } as u32).unwrap();
                if done_rx.recv().is_err() {
                    break;
                }
            }
        });
        let tid = tid_rx.recv().unwrap();
        let stats = RunStats::default();
        let mut f = Follower::new(std::process::id() as i32);
        f.fault(tid, [&stats, &stats]);
        assert!(f.settle(), "moves beside the thread");
        assert!(f.beside() && f.place.at() == Some(cpus[0]));
        assert!(cpu::followed_at().is_some(), "its calls ask to be followed");
        done_tx.send(()).unwrap();
        go_tx.send(cpus[1]).unwrap();
        tid_rx.recv().unwrap();
        f.fault(tid, [&stats, &stats]);
        assert_eq!(stats.fault_worker_partings.load(Relaxed), 2, "counted in both totals");
        assert!(
            !f.beside() && cpu::followed_at().is_none(),
            "serves from elsewhere, not followed"
        );
        f.fault(tid, [&stats, &stats]);
        assert!(!f.settle(), "and does not move back at once");
        drop((done_tx, go_tx));
        t.join().unwrap();
    }
}
