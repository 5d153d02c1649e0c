//! The logger side of an mComponent (`replication = "log"`, LegoOS section 4.7): for the
//! vRegions it is the secondary of, it keeps no pages but a log of their write-backs, which
//! a streamer thread sends in order to the backup file of each vRegion on an sComponent
//! (`M2S_LOG_APPEND`) and trims once it is there.
//!
//! The log is bounded (`--backup-log`). A write-back that finds it full is not logged, as in
//! LegoOS: the vRegion is unprotected from then on (counted, shown by `cluster status`), and
//! losing its primary then ends the program with an error rather than replaying a backup
//! that misses pages. Once the log has drained, the logger asks the home to copy the vRegion
//! to it again (`M2M_LOG_RESYNC`), and it is protected again.
//!
//! Appends carry the epoch of the set they were logged for: the sComponent refuses those of an
//! older epoch than the file's last reset, so a logger that was replaced while cut off cannot
//! write over its successor's backup.
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use super::{Job, Mem};

/// Records per `M2S_LOG_APPEND`, well inside a frame.
const APPEND_BATCH: usize = 64;
/// How long a logger waits for room for a copy (a resync, a rebuild), which may not be
/// skipped, and a promotion for its log to reach the sComponent.
pub(super) const COPY_WAIT: Duration = Duration::from_secs(30);
/// How often an unprotected vRegion asks its home for a copy again.
const RESYNC_EVERY: Duration = Duration::from_secs(3);

/// What the log keeps of one logged vRegion's write-back stream.
pub(super) enum Op {
    Reset,
    Record(LogRecord),
    CopyFrom(LogFile),
    DropProcess,
}

struct Entry {
    seq: u64,
    scomp: ComponentRef,
    file: LogFile,
    epoch: u64,
    op: Op,
}

fn size(op: &Op) -> u64 {
    match op {
        Op::Record(LogRecord::Page { .. }) => 17 + SEALED_PAGE as u64,
        Op::Record(LogRecord::Discard { .. }) => 17,
        _ => 0,
    }
}

#[derive(Default)]
struct Queue {
    entries: VecDeque<Entry>,
    bytes: u64,
    next_seq: u64,
    /// Entries up to this one are on their sComponent (or were refused there for good).
    done_seq: u64,
    /// Why the front entry does not reach its sComponent, while it does not.
    stalled: Option<String>,
}

pub(super) struct BackupLog {
    q: Mutex<Queue>,
    cv: Condvar,
    capacity: u64,
    streamed: AtomicU64,
    skipped: AtomicU64,
}

/// A vRegion this mComponent is the logger of, for one process.
#[derive(Clone, Debug)]
pub(super) struct Logged {
    pub scomp: ComponentRef,
    /// The process's home, which copies the vRegion again after a skip.
    pub home: ComponentRef,
    pub epoch: u64,
    /// Write-backs not logged since the last full copy: the backup misses them.
    pub skipped: u64,
    pub asked: Option<Instant>,
}

impl BackupLog {
    pub fn new(capacity: u64) -> BackupLog {
        BackupLog { q: Mutex::new(Queue::default()), cv: Condvar::new(), capacity, streamed: AtomicU64::new(0), skipped: AtomicU64::new(0) }
    }

    /// Queues `op` for `file`; `false` if the log has no room for it (within `wait`).
    pub fn push(&self, scomp: &ComponentRef, file: LogFile, epoch: u64, op: Op, wait: Option<Duration>) -> bool {
        let need = size(&op);
        let mut q = self.q.lock().unwrap();
        let until = wait.map(|w| Instant::now() + w);
        while q.bytes + need > self.capacity {
            match until {
                Some(t) if Instant::now() < t => q = self.cv.wait_timeout(q, t - Instant::now()).unwrap().0,
                _ => return false,
            }
        }
        q.next_seq += 1;
        let seq = q.next_seq;
        q.bytes += need;
        q.entries.push_back(Entry { seq, scomp: scomp.clone(), file, epoch, op });
        self.cv.notify_all();
        true
    }

    /// Waits until everything queued so far is on its sComponent.
    pub fn wait_streamed(&self, timeout: Duration) -> Result<(), String> {
        let mut q = self.q.lock().unwrap();
        let target = q.next_seq;
        let until = Instant::now() + timeout;
        while q.done_seq < target {
            let now = Instant::now();
            if now >= until {
                return Err(format!("the backup log did not reach the sComponent within {} s ({})", timeout.as_secs(), q.stalled.as_deref().unwrap_or("still sending")));
            }
            q = self.cv.wait_timeout(q, until - now).unwrap().0;
        }
        Ok(())
    }

    /// Drops everything queued (the mComponent was fenced: its processes are gone).
    pub fn clear(&self) {
        let mut q = self.q.lock().unwrap();
        q.entries.clear();
        q.bytes = 0;
        q.done_seq = q.next_seq;
        self.cv.notify_all();
    }

    /// A record (a write-back or a freed range) the log had no room for.
    pub fn skipped_one(&self) {
        self.skipped.fetch_add(1, Relaxed);
        metrics::counter!("mcomp_log_skipped_records_total").increment(1);
    }

    fn roomy(&self) -> bool {
        self.q.lock().unwrap().bytes < self.capacity / 2
    }

    pub fn stats(&self) -> serde_json::Value {
        let q = self.q.lock().unwrap();
        serde_json::json!({"capacity": self.capacity, "queued_bytes": q.bytes, "queued_entries": q.entries.len(), "streamed_bytes": self.streamed.load(Relaxed), "skipped_records": self.skipped.load(Relaxed), "stalled": q.stalled})
    }

    /// The request the front of the queue makes, and how many entries it covers: a run of
    /// records of one file (after its reset, if it starts with one), or one other entry.
    fn next_request(&self) -> Option<(ComponentRef, Msg, usize, u64, u64)> {
        let q = self.q.lock().unwrap();
        let first = q.entries.front()?;
        let msg: Msg = match &first.op {
            Op::CopyFrom(from) => M2S_LOG_COPY { from: from.clone(), to: first.file.clone() }.into(),
            Op::DropProcess => M2S_LOG_DROP { vnode: first.file.vnode.clone(), pid: first.file.pid }.into(),
            Op::Reset | Op::Record(_) => {
                let reset = matches!(first.op, Op::Reset);
                let run: Vec<&Entry> = q.entries.iter().enumerate().take_while(|(i, e)| e.file == first.file && e.epoch == first.epoch && (*i == 0 || matches!(e.op, Op::Record(_)))).map(|(_, e)| e).take(APPEND_BATCH).collect();
                let records = run.iter().filter_map(|e| match &e.op {
                    Op::Record(r) => Some(r.clone()),
                    _ => None,
                });
                let n = run.len();
                let bytes: u64 = run.iter().map(|e| size(&e.op)).sum();
                let last = run.last().map(|e| e.seq).unwrap_or(first.seq);
                let m = M2S_LOG_APPEND { file: first.file.clone(), epoch: first.epoch, reset, records: records.collect() };
                return Some((first.scomp.clone(), m.into(), n, bytes, last));
            }
        };
        Some((first.scomp.clone(), msg, 1, 0, first.seq))
    }

    fn done(&self, n: usize, bytes: u64, last: u64) {
        let mut q = self.q.lock().unwrap();
        q.entries.drain(..n);
        q.bytes -= bytes;
        q.done_seq = last;
        q.stalled = None;
        self.streamed.fetch_add(bytes, Relaxed);
        self.cv.notify_all();
    }

    fn wait_for_work(&self, timeout: Duration) {
        let q = self.q.lock().unwrap();
        if q.entries.is_empty() {
            drop(self.cv.wait_timeout(q, timeout).unwrap());
        }
    }
}

impl Mem {
    /// The streamer thread: sends the log in order, one batch at a time, retrying a batch its
    /// sComponent did not take; and asks for a copy of the vRegions it had to skip once there
    /// is room again.
    pub(super) fn stream_logs(&self) {
        let mut backoff = Duration::from_millis(50);
        loop {
            let Some((scomp, msg, n, bytes, last)) = self.backup.next_request() else {
                self.backup.wait_for_work(Duration::from_secs(1));
                self.ask_resyncs();
                continue;
            };
            let name = msg.name();
            match self.node.rpc.call_msg(&scomp.addr, &msg) {
                Err(RpcError::Remote { code: ErrCode::Stale, msg }) => {
                    // A newer logger took over the file: these records are not its to write.
                    metrics::counter!("mcomp_log_stale_dropped_total").increment(n as u64);
                    tracing::warn!(scomp = scomp.id, records = n, error = %msg, "backup records refused as stale: another logger owns the file now");
                    self.backup.done(n, bytes, last);
                }
                Ok(_) => {
                    backoff = Duration::from_millis(50);
                    self.backup.done(n, bytes, last);
                    metrics::counter!("mcomp_log_streamed_bytes_total").increment(bytes);
                    if self.backup.roomy() {
                        self.ask_resyncs();
                    }
                }
                Err(e) => self.stalled(&scomp, name, &e.to_string(), &mut backoff),
            }
        }
    }

    fn stalled(&self, scomp: &ComponentRef, name: &str, why: &str, backoff: &mut Duration) {
        let msg = format!("{name} to sComponent {} at {}: {why}", scomp.id, scomp.addr);
        let first = self.backup.q.lock().unwrap().stalled.replace(msg.clone()).is_none();
        if first {
            tracing::warn!(error = %msg, "the backup log cannot reach its sComponent; retrying");
        }
        metrics::counter!("mcomp_log_stream_retries_total").increment(1);
        std::thread::sleep(*backoff);
        *backoff = (*backoff * 2).min(Duration::from_secs(1));
    }

    /// Queues a request to the home of each process with a vRegion whose log skipped pages.
    fn ask_resyncs(&self) {
        if !self.backup.roomy() {
            return;
        }
        let owned: Vec<_> = self.owned.lock().unwrap().values().cloned().collect();
        for p in owned {
            // A process busy now (a copy into its log may be waiting on this very thread to
            // make room) is asked about next time.
            let Ok(mut g) = p.try_lock() else { continue };
            let who = Who { epoch: g.epoch, ..Who::new(g.vnode.clone(), g.pid) };
            for (idx, l) in g.logs.iter_mut().filter(|(_, l)| l.skipped > 0 && l.asked.is_none_or(|t| t.elapsed() > RESYNC_EVERY)) {
                l.asked = Some(Instant::now());
                self.queue(Job::Resync(who.clone(), *idx, l.home.clone()));
            }
        }
    }

    /// On the rebuilder thread: the home copies the vRegion here again.
    pub(super) fn resync(&self, who: Who, index: u64, home: ComponentRef) {
        match self.to_owner(&home, M2M_LOG_RESYNC { who: who.clone(), index }) {
            Ok(_) => tracing::info!(pid = who.pid, vregion = index, "backup log of a vRegion that skipped write-backs copied anew: protected again"),
            Err(e) => tracing::warn!(pid = who.pid, vregion = index, home = home.id, error = %e, "cannot have the home copy a vRegion whose backup log skipped write-backs; will ask again"),
        }
    }

    /// Every page the backup of vRegion `file` holds, once all queued records reached it.
    pub(super) fn read_backup(&self, scomp: &ComponentRef, file: &LogFile) -> Result<BTreeMap<u64, ByteBuf>, Refusal> {
        self.backup.wait_streamed(COPY_WAIT).map_err(|e| ERR::new(ErrCode::Unreachable, e))?;
        let mut pages = BTreeMap::new();
        let mut offset = 0;
        loop {
            let r = self.node.rpc.call(&scomp.addr, M2S_LOG_READ { file: file.clone(), offset, max: u32::MAX });
            let S2M_LOG { records, next, more } = match r {
                Ok(r) => r,
                // Nothing was ever logged: an empty vRegion.
                Err(RpcError::Remote { code: ErrCode::Errno(libc::ENOENT), .. }) if offset == 0 => return Ok(pages),
                Err(e) => return Err(ERR::new(ErrCode::Unreachable, format!("cannot read the backup file of vRegion {} from sComponent {} at {}: {e}", file.index, scomp.id, scomp.addr))),
            };
            replay_log(records, &mut pages);
            offset = next;
            if !more {
                return Ok(pages);
            }
        }
    }
}
