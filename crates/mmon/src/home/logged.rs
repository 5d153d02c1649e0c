//! Logged sets (`replication = "log"`, docs/failures.md): a primary lost is replaced by its
//! logger, which replays the backup file into pages; a logger whose log skipped write-backs
//! while full is copied to again once the log drains.
use splitos_rpc::*;

use super::{lock_home, HomeError, HomeProc, Replicas};
use crate::{Mem, Peers};

/// How long a logger made primary may take to replay its backup.
const REPLAY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

impl<P: Peers> Mem<P> {
    /// Makes the logger of logged set `idx`, whose primary (a retired member now) is lost, its
    /// primary, holding the home lock: the logger is fenced first, then told the set it is
    /// the only member of, and replays the backup file and its log into pages before it
    /// answers. A refusal (the log skipped write-backs, the sComponent cannot be read) leaves
    /// the set as it was: the program waits for the lost primary and is told which it is.
    pub(super) fn promote_logger(&self, h: &mut HomeProc, idx: u64) -> Result<(), Refusal> {
        let started = std::time::Instant::now();
        let set = h.vregions.get(&idx).cloned().expect("listed by the caller");
        let (gone, logger) = (set.owners[0].clone(), set.owners[1].clone());
        let who = h.who();
        self.fence_set(&set.wire(idx), &who, Some(gone.id))?;
        let promoted = Replicas {
            epoch: h.epoch,
            owners: vec![logger.clone()],
            ..set
        };
        // Replaying reads the whole backup from the sComponent: longer than a call may take.
        let replay = M2M_SET {
            who,
            set: promoted.wire(idx),
            creator: h.creator,
            home: self.me(),
            log: LogStep::Replay,
        };
        match logger.id == self.peers.id() {
            true => self.to_owner(&logger, replay).map(|_| ())?,
            false => self
                .peers
                .call_timeout(&logger.addr, replay, REPLAY_TIMEOUT)
                .map(|_| ())?,
        }
        h.vregions.insert(idx, promoted);
        crate::series::LOGGERS_PROMOTED.increment(1);
        tracing::info!(
            pid = h.who.pid,
            vregion = idx,
            lost = gone.id,
            logger = logger.id,
            ms = started.elapsed().as_millis() as u64,
            "logger made primary from its backup"
        );
        Ok(())
    }

    /// `M2M_LOG_RESYNC`: the logger of vRegion `index` skipped write-backs while its log was
    /// full. With the set fenced (no write-back lands meanwhile), its backup starts anew and
    /// the primary's pages are copied to it.
    pub(crate) fn log_resync(&self, r: M2M_LOG_RESYNC) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = lock_home(&hp)?;
        let idx = r.index;
        let set = h
            .vregions
            .get(&idx)
            .cloned()
            .filter(|s| s.log.is_some() && s.owners.len() == 2)
            .ok_or(HomeError::NoLogger { idx, pid: r.who.pid })?;
        let (primary, logger) = (set.owners[0].clone(), set.owners[1].clone());
        h.epoch += 1;
        let who = h.who();
        let vrs = self.vrs();
        let out = self.fence_set(&set.wire(idx), &who, None).and_then(|()| {
            let s = Replicas { epoch: h.epoch, ..set };
            self.tell_set(&h, idx, &s, LogStep::Restart)?;
            let n = self.copy_pages(&primary, &logger, &who, idx * vrs, (idx + 1) * vrs)?;
            self.tell_member(&h, &logger, idx, &s, LogStep::Whole)?;
            Ok((s, n))
        });
        let (s, n) = match out {
            Ok(x) => x,
            Err(e) => {
                self.sync_backup(&mut h);
                return Err(e);
            }
        };
        h.vregions.insert(idx, s);
        self.sync_backup(&mut h);
        crate::series::LOG_RESYNCS.increment(1);
        tracing::info!(
            pid = r.who.pid,
            vregion = idx,
            logger = logger.id,
            pages = n,
            "copied a vRegion to its logger again: protected again"
        );
        Ok(OK)
    }
}
