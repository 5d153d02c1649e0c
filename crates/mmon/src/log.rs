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

use super::{Job, Mem, Peers};

/// Why a logger cannot read what the backup of a vRegion holds.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BackupLogError {
    #[error("the backup log did not reach the sComponent within {secs} s ({why})")]
    NotStreamed { secs: u64, why: String },
    #[error("cannot read the backup file of vRegion {idx} from sComponent {scomp} at {addr}: {cause}")]
    Read {
        idx: u64,
        scomp: u32,
        addr: String,
        cause: RpcError,
    },
}

impl Refuse for BackupLogError {
    fn code(&self) -> ErrCode {
        ErrCode::Unreachable
    }
}

/// Records per `M2S_LOG_APPEND`, well inside a frame.
const APPEND_BATCH: usize = 64;
/// How long a logger waits for room for a page of a copy (a resync, a rebuild), which may
/// not be skipped: well inside the home's call, which then fails rather than times out.
pub(super) const COPY_WAIT: Duration = Duration::from_secs(5);
/// How long a promotion waits for the vRegion's log to reach the sComponent.
const DRAIN_WAIT: Duration = Duration::from_secs(30);
/// How often a vRegion whose log skipped records asks its home for a copy again.
const RESYNC_EVERY: Duration = Duration::from_secs(3);
/// How long a restarted backup may wait for the copy that makes it whole (one that failed
/// on the way is asked for again after this).
const COPY_DUE: Duration = Duration::from_secs(60);

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
    /// Why the front entry does not reach its sComponent, while it does not.
    stalled: Option<String>,
}

pub(super) struct BackupLog {
    q: Mutex<Queue>,
    cv: Condvar,
    capacity: u64,
    streamed: AtomicU64,
    /// Bytes the sComponent refused for good (dropped, not stored).
    refused_bytes: AtomicU64,
    /// Why the sComponent last refused records (its disk is full, say).
    refusal: Mutex<Option<String>>,
    skipped: AtomicU64,
    /// Files whose records the sComponent refused for good (with the epoch they were logged
    /// at): their vRegions are unprotected, marked so when their process is next free.
    refused: Mutex<Vec<(LogFile, u64)>>,
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
    /// The copy that follows a restart of the backup is complete (`LogStep::Whole`).
    pub whole: bool,
    /// When the home was last asked for a copy, or the backup restarted.
    pub asked: Option<Instant>,
    /// Copies asked for since the last that made the backup whole, which failed: each
    /// doubles the wait before the next, up to `COPY_DUE` (a copy holds the process's home
    /// while it waits for room in a log that stays full).
    pub copies_failed: u32,
}

impl Logged {
    /// Whether losing the primary can be survived: the backup holds every write-back.
    pub fn protects(&self) -> bool {
        self.whole && self.skipped == 0
    }

    fn wants_copy(&self) -> bool {
        let since = |d: Duration| self.asked.is_none_or(|t| t.elapsed() > d);
        let resync = RESYNC_EVERY
            .saturating_mul(1 << self.copies_failed.min(5))
            .min(COPY_DUE);
        (self.skipped > 0 && since(resync)) || (!self.whole && since(COPY_DUE))
    }
}

impl BackupLog {
    pub fn new(capacity: u64) -> BackupLog {
        BackupLog {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            capacity,
            streamed: AtomicU64::new(0),
            refused_bytes: AtomicU64::new(0),
            refusal: Mutex::new(None),
            skipped: AtomicU64::new(0),
            refused: Mutex::new(Vec::new()),
        }
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
        q.entries.push_back(Entry {
            seq,
            scomp: scomp.clone(),
            file,
            epoch,
            op,
        });
        self.cv.notify_all();
        true
    }

    /// Waits until nothing of `file` is left in the log (the queue is in order: what it
    /// copies from was sent before it).
    pub fn wait_streamed(&self, file: &LogFile, timeout: Duration) -> Result<(), BackupLogError> {
        let mut q = self.q.lock().unwrap();
        let until = Instant::now() + timeout;
        while q.entries.iter().any(|e| e.file == *file) {
            let now = Instant::now();
            if now >= until {
                return Err(BackupLogError::NotStreamed {
                    secs: timeout.as_secs(),
                    why: q.stalled.as_deref().unwrap_or("still sending").to_string(),
                });
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
        self.cv.notify_all();
    }

    /// A record (a write-back or a freed range) the log had no room for.
    pub fn skipped_one(&self) {
        self.skipped.fetch_add(1, Relaxed);
        crate::series::LOG_SKIPPED_RECORDS.increment(1);
    }

    fn roomy(&self) -> bool {
        self.q.lock().unwrap().bytes < self.capacity / 2
    }

    pub fn stats(&self) -> serde_json::Value {
        let q = self.q.lock().unwrap();
        serde_json::json!({"capacity": self.capacity, "queued_bytes": q.bytes, "queued_entries": q.entries.len(), "streamed_bytes": self.streamed.load(Relaxed), "refused_bytes": self.refused_bytes.load(Relaxed), "refusal": *self.refusal.lock().unwrap(), "skipped_records": self.skipped.load(Relaxed), "stalled": q.stalled})
    }

    /// The request the front of the queue makes, and how many entries it covers: a run of
    /// records of one file (after its reset, if it starts with one), or one other entry.
    fn next_request(&self) -> Option<(ComponentRef, Msg, LogFile, u64, u64)> {
        let q = self.q.lock().unwrap();
        let first = q.entries.front()?;
        let msg: Msg = match &first.op {
            Op::CopyFrom(from) => M2S_LOG_COPY {
                from: from.clone(),
                to: first.file.clone(),
                epoch: first.epoch,
            }
            .into(),
            Op::DropProcess => M2S_LOG_DROP {
                vnode: first.file.vnode.clone(),
                pid: first.file.pid,
            }
            .into(),
            Op::Reset | Op::Record(_) => {
                let reset = matches!(first.op, Op::Reset);
                let run: Vec<&Entry> = q
                    .entries
                    .iter()
                    .enumerate()
                    .take_while(|(i, e)| {
                        e.file == first.file && e.epoch == first.epoch && (*i == 0 || matches!(e.op, Op::Record(_)))
                    })
                    .map(|(_, e)| e)
                    .take(APPEND_BATCH)
                    .collect();
                let records = run.iter().filter_map(|e| match &e.op {
                    Op::Record(r) => Some(r.clone()),
                    _ => None,
                });
                let last = run.last().map(|e| e.seq).unwrap_or(first.seq);
                let m = M2S_LOG_APPEND {
                    file: first.file.clone(),
                    epoch: first.epoch,
                    reset,
                    records: records.collect(),
                };
                return Some((first.scomp.clone(), m.into(), first.file.clone(), first.epoch, last));
            }
        };
        Some((first.scomp.clone(), msg, first.file.clone(), first.epoch, first.seq))
    }

    /// The entries up to `last` reached their sComponent (`stored`) or were refused there for
    /// good. A fence may have cleared the queue meanwhile: only what is still there goes.
    fn done(&self, last: u64, stored: bool) -> u64 {
        let mut q = self.q.lock().unwrap();
        let mut bytes = 0;
        while q.entries.front().is_some_and(|e| e.seq <= last) {
            bytes += q.entries.pop_front().map_or(0, |e| size(&e.op));
        }
        q.bytes = q.bytes.saturating_sub(bytes);
        q.stalled = None;
        match stored {
            true => self.streamed.fetch_add(bytes, Relaxed),
            false => self.refused_bytes.fetch_add(bytes, Relaxed),
        };
        self.cv.notify_all();
        bytes
    }

    fn wait_for_work(&self, timeout: Duration) {
        let q = self.q.lock().unwrap();
        if q.entries.is_empty() {
            drop(self.cv.wait_timeout(q, timeout).unwrap());
        }
    }
}

impl<P: Peers> Mem<P> {
    /// The streamer thread: sends the log in order, one batch at a time, retrying a batch its
    /// sComponent did not take; and asks for a copy of the vRegions it had to skip once there
    /// is room again.
    pub(super) fn stream_logs(&self) {
        let mut backoff = Duration::from_millis(50);
        loop {
            if !self.stream_one(&mut backoff) {
                self.backup_log.wait_for_work(Duration::from_secs(1));
                self.ask_resyncs();
            }
        }
    }

    /// Sends the batch at the front of the log to its sComponent, if there is one (`false`:
    /// the log is empty). A batch not taken stays at the front, after a `backoff`.
    pub(super) fn stream_one(&self, backoff: &mut Duration) -> bool {
        let Some((scomp, msg, file, epoch, last)) = self.backup_log.next_request() else {
            return false;
        };
        let name = msg.name();
        match self.peers.call_msg(&scomp.addr, &msg) {
            Ok(_) => {
                *backoff = Duration::from_millis(50);
                let bytes = self.backup_log.done(last, true);
                crate::series::LOG_STREAMED_BYTES.increment(bytes);
                if self.backup_log.roomy() {
                    self.ask_resyncs();
                }
            }
            // Refused for good (a newer logger reset the file, a record it cannot take):
            // the batch is dropped, and the vRegion, if still logged here, is unprotected.
            Err(RpcError::Remote { code, msg }) => {
                crate::series::LOG_REFUSED.increment(1);
                tracing::warn!(scomp = scomp.id, pid = file.pid, vregion = file.index, ?code, error = %msg, "the sComponent refused backup records");
                self.backup_log.done(last, false);
                // A newer logger's reset is no fault of the sComponent's.
                if code != ErrCode::Stale {
                    *self.backup_log.refusal.lock().unwrap() = Some(msg);
                }
                self.backup_log.refused.lock().unwrap().push((file, epoch));
            }
            Err(e) => self.stalled(&scomp, name, &e.to_string(), backoff),
        }
        true
    }

    fn stalled(&self, scomp: &ComponentRef, name: &str, why: &str, backoff: &mut Duration) {
        let msg = format!("{name} to sComponent {} at {}: {why}", scomp.id, scomp.addr);
        let first = self.backup_log.q.lock().unwrap().stalled.replace(msg.clone()).is_none();
        if first {
            tracing::warn!(error = %msg, "the backup log cannot reach its sComponent; retrying");
        }
        crate::series::LOG_STREAM_RETRIES.increment(1);
        std::thread::sleep(*backoff);
        *backoff = (*backoff * 2).min(Duration::from_secs(1));
    }

    /// Marks the vRegions whose records the sComponent refused, and queues a request to the
    /// home of each process with a vRegion whose backup is not whole.
    pub(super) fn ask_resyncs(&self) {
        let owned: Vec<_> = self.owned.lock().unwrap().values().cloned().collect();
        let mut refused = std::mem::take(&mut *self.backup_log.refused.lock().unwrap());
        let roomy = self.backup_log.roomy();
        for p in owned {
            // A process busy now (a copy into its log may be waiting on this very thread to
            // make room) is seen to next time.
            let Ok(mut g) = p.try_lock() else { continue };
            let (vnode, pid) = (g.vnode.clone(), g.pid);
            refused.retain(|(f, epoch)| {
                let ours = f.vnode == vnode && f.pid == pid;
                if let Some(l) = g.logs.get_mut(&f.index).filter(|l| ours && l.epoch <= *epoch) {
                    l.skipped += 1;
                }
                !ours
            });
            if !roomy {
                continue;
            }
            let who = Who {
                epoch: g.epoch,
                ..Who::new(vnode, pid)
            };
            for (idx, l) in g.logs.iter_mut().filter(|(_, l)| l.wants_copy()) {
                l.asked = Some(Instant::now());
                self.queue(Job::Resync(who.clone(), *idx, l.home.clone()));
            }
        }
        // Those of processes busy now wait for the next round; those of processes gone go.
        let alive = self
            .owned
            .lock()
            .unwrap()
            .keys()
            .copied()
            .collect::<std::collections::HashSet<u64>>();
        refused.retain(|(f, _)| alive.contains(&f.pid));
        self.backup_log.refused.lock().unwrap().extend(refused);
    }

    /// On the rebuilder thread: the home copies the vRegion here again, if it still needs it.
    pub(super) fn resync(&self, who: Who, index: u64, home: ComponentRef) {
        let p = self.owned.lock().unwrap().get(&who.pid).cloned();
        if p.is_none_or(|p| p.lock().unwrap().logs.get(&index).is_none_or(|l| l.protects())) {
            return;
        }
        match self.to_owner(
            &home,
            M2M_LOG_RESYNC {
                who: who.clone(),
                index,
            },
        ) {
            Ok(_) => tracing::info!(
                pid = who.pid,
                vregion = index,
                "the home copied a vRegion whose backup was not whole to its logger"
            ),
            Err(e) => {
                tracing::warn!(pid = who.pid, vregion = index, home = home.id, error = %e, "cannot have the home copy a vRegion whose backup log skipped write-backs; will ask again");
                // A copy that failed after the home restarted the backup left it neither
                // whole nor counting a skip, and so asking again only after `COPY_DUE`: it
                // misses the copy's pages as it missed the skipped ones, and asks again
                // sooner, later each time it fails again.
                // The map's lock is let go first: a fork locks a process, then the map.
                let p = self.owned.lock().unwrap().get(&who.pid).cloned();
                if let Some(p) = p {
                    if let Some(l) = p.lock().unwrap().logs.get_mut(&index).filter(|l| !l.protects()) {
                        l.skipped = l.skipped.max(1);
                        l.copies_failed += 1;
                    }
                }
            }
        }
    }

    /// Every page the backup of vRegion `file` holds, once all queued records reached it.
    pub(super) fn read_backup(&self, scomp: &ComponentRef, file: &LogFile) -> Result<BTreeMap<u64, ByteBuf>, Refusal> {
        self.backup_log.wait_streamed(file, DRAIN_WAIT)?;
        let mut pages = BTreeMap::new();
        let mut offset = 0;
        loop {
            let r = self.peers.call(
                &scomp.addr,
                M2S_LOG_READ {
                    file: file.clone(),
                    offset,
                    max: u32::MAX,
                },
            );
            let S2M_LOG { records, next, more } = match r {
                Ok(r) => r,
                // Nothing was ever logged: an empty vRegion.
                Err(RpcError::Remote {
                    code: ErrCode::Errno(libc::ENOENT),
                    ..
                }) if offset == 0 => return Ok(pages),
                Err(e) => {
                    return Err(BackupLogError::Read {
                        idx: file.index,
                        scomp: scomp.id,
                        addr: scomp.addr.clone(),
                        cause: e,
                    }
                    .into())
                }
            };
            replay_log(records, &mut pages);
            offset = next;
            if !more {
                return Ok(pages);
            }
        }
    }
}
