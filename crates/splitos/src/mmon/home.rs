//! The home side of an mComponent: for every process it is home of, the vRegion array
//! (which mComponents hold each vRegion) and the address-space layout. Every virtual-memory
//! call of a process lands here (`P2M_MMAP`, `P2M_MUNMAP`, ...) and fans out to the replicas
//! of the vRegions it touches (`M2M_*`), in-process when a replica is this mComponent.
//!
//! In a replicated cluster each vRegion has a replica set ([`Replicas`], primary first) and
//! the home copies its state of each process to a backup home after every change
//! (`M2M_HOME_SYNC`); the backup takes over when the home is lost (`P2M_HOME_TAKEOVER`). A
//! replica that is lost leaves its sets and its copies are rebuilt on another mComponent
//! ([`Mem::rebuild`]); the process's epoch changes with every set, and the owners refuse
//! write-backs of an older one, so no page lands only on a set that has since changed.
//!
//! In an erasure-coded cluster ([`Replication::Ec`]) a set is striped: k data members and a
//! parity member, each at a fixed place ([`VregionReplicas`]). A lost member's place is
//! rebuilt at once, before the pComponent that reported it is answered: each of its pages is
//! the XOR of its row's parity and other pages ([`Mem::rebuild_place`]).
//!
//! In a logged cluster ([`Replication::Log`]) a set is a primary and a logger, which keeps a
//! log of the write-backs streamed to a backup file on an sComponent. A lost primary's
//! logger is made primary at once ([`Mem::promote_logger`]: it replays the backup); a lost
//! logger is replaced in the background by a new one, which gets a full copy; a logger whose
//! log skipped write-backs asks for a copy again ([`Mem::log_resync`]).
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use super::{Mem, Peers, PAGE};
use crate::vma::{Vma, VmaMap};

/// Pages per message when a mapping moves between owners (mremap) or a replica is rebuilt.
const MOVE_BATCH: u32 = 128;

const PROT_WRITE: u32 = 2;

/// How long a home waits for a member a pComponent reported lost, and a backup for the home
/// it would replace, before it takes them for lost.
const VERIFY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long a logger made primary may take to replay its backup.
const REPLAY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// The mComponents holding one vRegion: the primary (where fetches go) first.
#[derive(Clone, Debug)]
pub(super) struct Replicas {
    epoch: u64,
    owners: Vec<ComponentRef>,
    /// Data members of a striped set; 0: every member holds every page.
    data: u32,
    /// The sComponent of a logged set's backup file.
    log: Option<ComponentRef>,
}

impl Replicas {
    fn wire(&self, index: u64) -> VregionReplicas {
        VregionReplicas { index, epoch: self.epoch, owners: self.owners.clone(), data: self.data, log: self.log.clone() }
    }

    /// Whether its members are told the set ([`M2M_SET`]): they act on it.
    fn announced(&self) -> bool {
        self.data > 0 || self.log.is_some()
    }
}

/// Home state of one process.
pub(super) struct HomeProc {
    who: Who,
    /// The pComponent that created the process ([`super::may_act`]), and the component id
    /// of that start of it ([`Mem::reclaim_lost`]).
    creator: Option<[u8; 32]>,
    pcomp: u32,
    base: u64,
    limit: u64,
    layout: VmaMap,
    vregions: BTreeMap<u64, Replicas>,
    /// Bumped whenever a replica set changes.
    epoch: u64,
    backup: Option<ComponentRef>,
    /// Members taken out of its sets that may still hold copies (they were only cut off):
    /// freed when the process exits.
    retired: Vec<ComponentRef>,
    /// The process exited: a rebuild queued before must not bring it back.
    exited: bool,
    /// Its vNode's memory quota ([`super::quota`]).
    memory_quota: Option<u64>,
    /// What it is charged against that quota: the bytes it maps writable.
    charged: u64,
}

impl HomeProc {
    fn owners(&self) -> Vec<VregionReplicas> {
        self.vregions.iter().map(|(i, r)| r.wire(*i)).collect()
    }

    /// The end of [addr, addr + len), which must be page-aligned and inside the heap region.
    fn check_range(&self, addr: u64, len: u64) -> Result<u64, Refusal> {
        let end = addr.checked_add(len).ok_or_else(|| ERR::new(ErrCode::Invalid, "range overflows"))?;
        if !addr.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) || len == 0 || addr < self.base || end > self.limit {
            return Err(ERR::new(ErrCode::Invalid, format!("range {addr:#x}+{len:#x} is not page-aligned inside the heap region")));
        }
        Ok(end)
    }

    /// Bytes of [start, end) its layout has writable.
    fn writable_in(&self, start: u64, end: u64) -> u64 {
        self.layout.iter().filter(|(_, v)| v.prot & PROT_WRITE != 0).map(|(s, v)| v.end.min(end).saturating_sub(s.max(start))).sum()
    }

    fn mapped(&self, addr: u64, prot: u32) -> M2P_MAPPED {
        M2P_MAPPED { addr, prot, owners: self.owners(), epoch: self.epoch, backup: self.backup.clone() }
    }

    fn who(&self) -> Who {
        Who { epoch: self.epoch, ..self.who.clone() }
    }

    fn state(&self, home: ComponentRef) -> HomeState {
        HomeState {
            who: self.who(),
            home,
            creator: self.creator,
            pcomp: self.pcomp,
            base: self.base,
            limit: self.limit,
            vmas: self.layout.iter().map(|(start, v)| HomeVma { start, end: v.end, prot: v.prot, accounted: v.accounted }).collect(),
            vregions: self.owners(),
            retired: self.retired.clone(),
            memory_quota: self.memory_quota,
        }
    }

    fn from_state(s: HomeState) -> HomeProc {
        let mut layout = VmaMap::default();
        for v in s.vmas {
            layout.insert(v.start, Vma { end: v.end, prot: v.prot, accounted: v.accounted });
        }
        let vregions = s.vregions.into_iter().map(|r| (r.index, Replicas { epoch: r.epoch, owners: r.owners, data: r.data, log: r.log })).collect();
        HomeProc {
            epoch: s.who.epoch,
            who: Who { epoch: 0, ..s.who },
            creator: s.creator,
            pcomp: s.pcomp,
            base: s.base,
            limit: s.limit,
            layout,
            vregions,
            backup: None,
            retired: s.retired,
            exited: false,
            memory_quota: s.memory_quota,
            charged: 0,
        }
    }

    /// The process as `cluster status --json` shows it: where each vRegion's copies are.
    pub(super) fn stats(&self) -> serde_json::Value {
        let vregions: Vec<_> = self.vregions.iter().map(|(i, r)| serde_json::json!({"index": i, "owners": r.owners.iter().map(|o| o.id).collect::<Vec<_>>(), "backup_file_on": r.log.as_ref().map(|l| l.id)})).collect();
        serde_json::json!({"pid": self.who.pid, "epoch": self.epoch, "backup": self.backup.as_ref().map(|b| b.id), "vregions": vregions})
    }

    /// Whether vRegion set `s` lacks redundancy it should have: a replica set with fewer than
    /// `members` members (and at least one), a striped set with a lost member in its place.
    fn short(&self, s: &Replicas, members: usize) -> bool {
        match s.data {
            0 => !s.owners.is_empty() && s.owners.len() < members,
            _ => s.owners.iter().any(|o| self.retired.iter().any(|r| r.id == o.id)),
        }
    }

    /// How many of its vRegions lack redundancy ([`HomeProc::short`]).
    pub(super) fn short_of(&self, members: usize) -> u64 {
        self.vregions.values().filter(|s| self.short(s, members)).count() as u64
    }

    /// Every member of vRegion `idx`'s set, once each.
    fn members(&self, idx: u64) -> Vec<ComponentRef> {
        self.vregions.get(&idx).map(|r| r.wire(idx).distinct().into_iter().cloned().collect()).unwrap_or_default()
    }

    /// Every mComponent holding some vRegion of the process, once each.
    fn all_owners(&self) -> Vec<ComponentRef> {
        let mut seen: Vec<ComponentRef> = Vec::new();
        for o in self.vregions.values().flat_map(|r| &r.owners) {
            if !seen.iter().any(|s| s.id == o.id) {
                seen.push(o.clone());
            }
        }
        seen
    }
}

/// Refusals an owner may give for a process it never saw: nothing of it to remove there.
fn ignore_unknown(r: Result<OK, Refusal>) -> Result<(), Refusal> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.code == ErrCode::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A refusal that says the component could not be reached (rather than that it declined).
fn unreachable(e: &Refusal) -> bool {
    e.code == ErrCode::Unreachable
}

impl<P: Peers> Mem<P> {
    fn home_proc(&self, who: &Who) -> Result<Arc<Mutex<HomeProc>>, Refusal> {
        let h = self.homes.lock().unwrap().get(&who.pid).cloned();
        let h = h.ok_or_else(|| ERR::new(ErrCode::NotHome, format!("mComponent {} is not home of process {}", self.peers.id(), who.pid)))?;
        let (vnode, creator) = {
            let g = h.lock().unwrap();
            (g.who.vnode.clone(), g.creator)
        };
        if vnode != who.vnode {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(ERR::new(ErrCode::Denied, format!("process {} belongs to another vNode", who.pid)));
        }
        self.may_act(who.pid, creator)?;
        Ok(h)
    }

    /// [start, end) cut at vRegion boundaries: (vRegion index, start, end) each.
    fn slices(&self, start: u64, end: u64) -> Vec<(u64, u64, u64)> {
        let vrs = self.vrs();
        let mut out = Vec::new();
        let mut at = start;
        while at < end {
            let idx = at / vrs;
            let stop = ((idx + 1) * vrs).min(end);
            out.push((idx, at, stop));
            at = stop;
        }
        out
    }

    /// One more mComponent for a replica set (or a backup home, `bytes` 0), none of
    /// `exclude`. `None` when no other has room: the set stays short, and says so.
    fn pick_other(&self, bytes: u64, exclude: &[u32]) -> Result<Option<ComponentRef>, Refusal> {
        let mut exclude = exclude.to_vec();
        exclude.extend(self.recently_lost());
        match self.peers.call_gm(M2G_PICK_OWNER { bytes, exclude }) {
            Ok(r) => Ok(Some(r.mcomp)),
            Err(RpcError::Remote { code: ErrCode::NoMemory, .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The replica set of vRegion `idx`, asking GMM for its members when it becomes active.
    fn ensure_owners(&self, h: &mut HomeProc, idx: u64) -> Result<Vec<ComponentRef>, Refusal> {
        if let Some(r) = h.vregions.get(&idx) {
            return Ok(r.owners.clone());
        }
        let scheme = self.replication();
        let data = scheme.data();
        let share = self.vrs() / data.max(1) as u64;
        let mut owners: Vec<ComponentRef> = Vec::new();
        for _ in 0..scheme.members() {
            let ids: Vec<u32> = owners.iter().map(|o| o.id).collect();
            match self.pick_other(share, &ids)? {
                Some(o) => owners.push(o),
                // A striped set needs all its places: with too few mComponents one stands at
                // two (losing it then loses rows).
                None if data > 0 => owners.push(self.pick_other(share, &[])?.unwrap_or_else(|| self.me())),
                // With every mComponent short of a whole free vRegion, the home holds it and
                // the accounting of each mapping decides what fits.
                None if !ids.contains(&self.peers.id()) => owners.push(self.me()),
                None => break,
            }
        }
        // A logged set's backup file goes where the vNode's files are (a set that starts
        // with its primary alone gets its logger when one has room, as a rebuild).
        let log = match scheme == Replication::Log {
            true => Some(self.peers.call_gm(M2G_BACKUP_STORE { vnode: h.who.vnode.clone() })?.scomp),
            false => None,
        };
        if log.is_some() {
            // Its own epoch: a logger named by an attempt that failed on the way cannot reset
            // the backup of the one named next.
            h.epoch += 1;
        }
        let set = Replicas { epoch: h.epoch, owners: owners.clone(), data, log };
        // A member taken out of the process's sets before and chosen again is a member now,
        // not a lost one.
        h.retired.retain(|r| !owners.iter().any(|o| o.id == r.id));
        if set.announced() {
            // An empty vRegion's backup is whole as soon as it starts.
            self.tell_set(h, idx, &set, LogStep::Restart)?;
            if let Some(logger) = set.wire(idx).logger() {
                self.tell_member(h, logger, idx, &set, LogStep::Whole)?;
            }
        }
        if set.wire(idx).distinct().len() < scheme.members() {
            metrics::counter!("mcomp_unprotected_vregions_total").increment(1);
            tracing::warn!(pid = h.who.pid, vregion = idx, copies = owners.len(), "no other mComponent can hold a replica: the vRegion has fewer copies than the cluster's replication asks");
        }
        tracing::debug!(vregion = idx, owners = ?owners.iter().map(|o| o.id).collect::<Vec<_>>(), "vRegion activated");
        h.vregions.insert(idx, set);
        Ok(owners)
    }

    /// Tells every member of striped or logged set `set` (vRegion `idx`) what it now is, and
    /// a logger what happens to its backup.
    fn tell_set(&self, h: &HomeProc, idx: u64, set: &Replicas, log: LogStep) -> Result<(), Refusal> {
        for o in set.wire(idx).distinct() {
            self.tell_member(h, o, idx, set, log)?;
        }
        Ok(())
    }

    fn tell_member(&self, h: &HomeProc, o: &ComponentRef, idx: u64, set: &Replicas, log: LogStep) -> Result<OK, Refusal> {
        self.to_owner(o, M2M_SET { who: h.who(), set: set.wire(idx), creator: h.creator, home: self.me(), log })
    }

    /// Sends `msg(who)` to every replica of vRegion `idx`. A replica that cannot be reached
    /// while another answers leaves the set (and is rebuilt): the call succeeds on the rest.
    fn to_replicas<R: Request>(&self, h: &mut HomeProc, idx: u64, msg: impl Fn(Who) -> R) -> Result<(), Refusal> {
        let owners = h.members(idx);
        let mut lost = Vec::new();
        let mut answered = false;
        let mut first_err = None;
        for o in &owners {
            match self.to_owner(o, msg(h.who())) {
                Ok(_) => answered = true,
                Err(e) if unreachable(&e) && owners.iter().any(|x| x.id != o.id) => lost.push(o.id),
                // Done on the member, whose change did not reach the parity: a parity member
                // lost is rebuilt from the pages as they are now.
                Err(e) if e.code == ErrCode::ParityLost => match self.parity_lost(h, idx) {
                    Some(p) => {
                        answered = true;
                        lost.push(p);
                    }
                    None => {
                        first_err.get_or_insert(e);
                    }
                },
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        if !answered && !owners.is_empty() {
            return Err(ERR::new(ErrCode::Unreachable, format!("no replica of vRegion {idx} of process {} can be reached", h.who.pid)));
        }
        if !lost.is_empty() {
            self.drop_replicas(h, &lost, Some(idx));
            self.to_joined(h, idx, &owners, msg)?;
        }
        Ok(())
    }

    /// The parity member of striped set `idx`, if this home cannot reach it either (an owner
    /// said it could not).
    fn parity_lost(&self, h: &HomeProc, idx: u64) -> Option<u32> {
        let p = h.vregions.get(&idx)?.wire(idx).parity()?.clone();
        (!self.reaches(&p, &h.who)).then_some(p.id)
    }

    /// Whether member `o` answers this home about the process, within [`VERIFY_TIMEOUT`].
    fn reaches(&self, o: &ComponentRef, who: &Who) -> bool {
        let who = Who::new(who.vnode.clone(), who.pid);
        o.id == self.peers.id() || self.peers.call_timeout(&o.addr, M2M_READ_PAGES { who, from: 0, end: 0, max: 0, parity: false }, VERIFY_TIMEOUT).is_ok()
    }

    /// Sends `msg(who)` to members of vRegion `idx`'s set that joined it since it had
    /// `before` (a striped set's place rebuilt while a call was under way).
    fn to_joined<R: Request>(&self, h: &HomeProc, idx: u64, before: &[ComponentRef], msg: impl Fn(Who) -> R) -> Result<(), Refusal> {
        for o in h.members(idx).into_iter().filter(|m| !before.iter().any(|b| b.id == m.id)) {
            self.to_owner(&o, msg(h.who()))?;
        }
        Ok(())
    }

    fn add_range(&self, h: &mut HomeProc, start: u64, end: u64, prot: u32) -> Result<(), Refusal> {
        // In the layout first: a member whose place is rebuilt meanwhile gets its vmas from it.
        h.layout.insert(start, Vma { end, prot, accounted: false });
        let mut done: Vec<(u64, u64, u64)> = Vec::new();
        for (idx, s, e) in self.slices(start, end) {
            let creator = h.creator;
            let r = self.ensure_owners(h, idx).and_then(|_| self.to_replicas(h, idx, |who| M2M_VMA_ADD { who, start: s, end: e, prot, creator }));
            match r {
                Ok(()) => done.push((idx, s, e)),
                Err(err) => {
                    for (idx, s, e) in done {
                        let _ = self.to_replicas(h, idx, |who| M2M_VMA_REMOVE { who, start: s, end: e });
                    }
                    h.layout.remove_range(start, end);
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    fn remove_range(&self, h: &mut HomeProc, start: u64, end: u64) -> Result<(), Refusal> {
        for (idx, s, e) in self.slices(start, end) {
            let owners = h.members(idx);
            for o in &owners {
                match self.to_owner(o, M2M_VMA_REMOVE { who: h.who(), start: s, end: e }) {
                    // Another member answers for the range; this one leaves the set.
                    Err(e) if unreachable(&e) && owners.iter().any(|x| x.id != o.id) => self.drop_replicas(h, &[o.id], Some(idx)),
                    Err(e) if e.code == ErrCode::ParityLost => match self.parity_lost(h, idx) {
                        Some(p) => self.drop_replicas(h, &[p], Some(idx)),
                        None => return Err(e),
                    },
                    r => ignore_unknown(r)?,
                }
            }
            self.to_joined(h, idx, &owners, |who| M2M_VMA_REMOVE { who, start: s, end: e })?;
        }
        h.layout.remove_range(start, end);
        Ok(())
    }

    /// Refuses a process id already in use here: a pComponent may not take over another's
    /// process by creating (or forking into) its id.
    fn fresh_pid(&self, pid: u64) -> Result<(), Refusal> {
        if self.homes.lock().unwrap().contains_key(&pid) {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(ERR::new(ErrCode::Denied, format!("process id {pid} is in use")));
        }
        Ok(())
    }

    /// Copies the home's state of the process to its backup home, choosing another backup
    /// when that one cannot be reached.
    fn sync_backup(&self, h: &mut HomeProc) {
        if !self.replication().redundant() || h.exited {
            return;
        }
        let mut failed = vec![self.peers.id()];
        for _ in 0..3 {
            let backup = match h.backup.clone() {
                Some(b) => b,
                None => match self.pick_other(0, &failed) {
                    Ok(Some(b)) => b,
                    _ => {
                        tracing::warn!(pid = h.who.pid, "no mComponent can be backup home: the process's layout has one copy");
                        return;
                    }
                },
            };
            match self.peers.call(&backup.addr, M2M_HOME_SYNC { state: h.state(self.me()) }) {
                Ok(_) => {
                    h.backup = Some(backup);
                    return;
                }
                Err(e) => {
                    tracing::warn!(pid = h.who.pid, backup = backup.id, error = %e, "backup home cannot be reached; choosing another");
                    failed.push(backup.id);
                    h.backup = None;
                }
            }
        }
    }

    pub(super) fn proc_create(&self, r: P2M_PROC_CREATE) -> Result<M2P_HOME, Refusal> {
        self.fresh_pid(r.who.pid)?;
        let mut h = HomeProc {
            who: Who { epoch: 0, ..r.who.clone() },
            creator: splitos_rpc::current_peer().map(|p| p.key),
            pcomp: r.pcomp,
            base: r.region_base,
            limit: r.region_base.saturating_add(r.region_size),
            layout: VmaMap::default(),
            vregions: BTreeMap::new(),
            epoch: 1,
            backup: None,
            retired: Vec::new(),
            exited: false,
            memory_quota: r.memory_quota,
            charged: 0,
        };
        // Shows the vNode and its quota before it maps anything.
        self.quotas.reserve(&r.who.vnode, r.memory_quota, 0)?;
        self.sync_backup(&mut h);
        let backup = h.backup.clone();
        self.homes.lock().unwrap().insert(r.who.pid, Arc::new(Mutex::new(h)));
        tracing::debug!(pid = r.who.pid, vnode = %r.who.vnode, "home of a new process");
        Ok(M2P_HOME { backup })
    }

    pub(super) fn mmap(&self, r: P2M_MMAP) -> Result<M2P_MAPPED, Refusal> {
        let hp = self.home_proc(&r.who)?;
        // Heuristic overcommit refuses only the obvious: one writable mapping larger than all
        // the cluster's memory, unless the program said it reserves no memory.
        if !r.noreserve {
            self.obvious_overcommit(r.len, r.prot)?;
        }
        let mut h = hp.lock().unwrap();
        // A fixed mapping replaces what it lands on.
        let replaced = if r.fixed { h.writable_in(r.hint, r.hint.saturating_add(r.len)) } else { 0 };
        let more = if r.prot & PROT_WRITE != 0 { r.len.saturating_sub(replaced) } else { 0 };
        let start = self.within_quota(&mut h, more, |m, h| {
            let start = if r.fixed {
                let end = h.check_range(r.hint, r.len)?;
                m.remove_range(h, r.hint, end)?;
                r.hint
            } else {
                h.layout.find_gap(h.base, h.limit, r.len, r.hint).ok_or_else(|| ERR::new(ErrCode::NoMemory, "the heap region has no free range that large"))?
            };
            let added = m.add_range(h, start, start + r.len, r.prot);
            m.sync_backup(h);
            added.map(|()| start)
        })?;
        Ok(h.mapped(start, r.prot))
    }

    /// Runs `change` on process `h` within its vNode's memory quota: `more`, the most it can
    /// add to what the process maps writable, is reserved first, and the process is charged
    /// what it maps after the change, done or failed.
    fn within_quota<T>(&self, h: &mut HomeProc, more: u64, change: impl FnOnce(&Self, &mut HomeProc) -> Result<T, Refusal>) -> Result<T, Refusal> {
        self.quotas.reserve(&h.who.vnode, h.memory_quota, more)?;
        let out = change(self, h);
        let after = h.writable_in(h.base, h.limit);
        self.quotas.settle(&h.who.vnode, more, h.charged, after);
        h.charged = after;
        out
    }

    /// Heuristic overcommit refuses only the obvious, as Linux's does: making writable at
    /// once more than all the cluster's memory (unless the program said it reserves none).
    fn obvious_overcommit(&self, len: u64, prot: u32) -> Result<(), Refusal> {
        // Until the first heartbeat's answer says how much the cluster has, this mComponent's
        // own capacity stands in for it.
        let memory = Some(self.cluster_memory.load(Relaxed)).filter(|m| *m > 0).unwrap_or(self.capacity);
        if !self.charges_mappings() && prot & 2 != 0 && len > memory {
            self.c.oom.fetch_add(1, Relaxed);
            return Err(ERR::new(ErrCode::NoMemory, format!("making {len} bytes writable at once is more than all the cluster's memory ({memory} bytes)")));
        }
        Ok(())
    }

    pub(super) fn munmap(&self, r: P2M_MUNMAP) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = hp.lock().unwrap();
        let end = h.check_range(r.addr, r.len)?;
        let removed = self.within_quota(&mut h, 0, |m, h| m.remove_range(h, r.addr, end));
        self.sync_backup(&mut h);
        removed.map(|()| OK)
    }

    pub(super) fn mprotect(&self, r: P2M_MPROTECT) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = hp.lock().unwrap();
        let end = h.check_range(r.addr, r.len)?;
        if !h.layout.covers(r.addr, end) {
            return Err(ERR::new(ErrCode::NoMemory, "mprotect of an unmapped range"));
        }
        self.obvious_overcommit(r.len, r.prot)?;
        let more = if r.prot & PROT_WRITE != 0 { r.len - h.writable_in(r.addr, end) } else { 0 };
        self.within_quota(&mut h, more, |m, h| {
            for (idx, s, e) in m.slices(r.addr, end) {
                m.ensure_owners(h, idx)?;
                m.to_replicas(h, idx, |who| M2M_VMA_PROTECT { who, start: s, end: e, prot: r.prot })?;
            }
            for (s, v) in h.layout.carve(r.addr, end) {
                h.layout.set(s, Vma { prot: r.prot, ..v });
            }
            Ok(())
        })?;
        self.sync_backup(&mut h);
        Ok(OK)
    }

    pub(super) fn dontneed(&self, r: P2M_DONTNEED) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = hp.lock().unwrap();
        let end = h.check_range(r.addr, r.len)?;
        for (idx, s, e) in self.slices(r.addr, end) {
            if h.vregions.contains_key(&idx) {
                self.to_replicas(&mut h, idx, |who| M2M_DISCARD { who, start: s, end: e }).or_else(|e| ignore_unknown(Err(e)))?;
            }
        }
        Ok(OK)
    }

    pub(super) fn mremap(&self, r: P2M_MREMAP) -> Result<M2P_MAPPED, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = hp.lock().unwrap();
        let writable = h.writable_in(r.old, r.old.saturating_add(r.old_len)) > 0;
        let more = if writable { r.new_len.saturating_sub(r.old_len) } else { 0 };
        let out = self.within_quota(&mut h, more, |m, h| m.mremap_locked(h, r));
        self.sync_backup(&mut h);
        out
    }

    fn mremap_locked(&self, h: &mut HomeProc, r: P2M_MREMAP) -> Result<M2P_MAPPED, Refusal> {
        let P2M_MREMAP { who: _, old, old_len, new_len, may_move, fixed_to } = r;
        let old_end = h.check_range(old, old_len)?;
        let Some((_, vma)) = h.layout.find(old).filter(|_| h.layout.covers(old, old_end)) else {
            return Err(ERR::new(ErrCode::Invalid, "mremap of an unmapped range"));
        };
        let prot = vma.prot;
        if fixed_to.is_none() && new_len <= old_len {
            if new_len < old_len {
                self.remove_range(h, old + new_len, old_end)?;
            }
            return Ok(h.mapped(old, prot));
        }
        if fixed_to.is_none() && old.checked_add(new_len).is_some_and(|e| e <= h.limit) && h.layout.is_free(old_end, old + new_len) {
            self.add_range(h, old_end, old + new_len, prot)?;
            h.layout.remove_range(old, old + new_len);
            h.layout.insert(old, Vma { end: old + new_len, prot, accounted: false });
            return Ok(h.mapped(old, prot));
        }
        if !may_move && fixed_to.is_none() {
            return Err(ERR::new(ErrCode::NoMemory, "cannot grow in place and moving is not allowed"));
        }
        let new = match fixed_to {
            Some(at) => {
                let end = h.check_range(at, new_len)?;
                self.remove_range(h, at, end)?;
                at
            }
            None => h.layout.find_gap(h.base, h.limit, new_len, 0).ok_or_else(|| ERR::new(ErrCode::NoMemory, "no free range for mremap"))?,
        };
        self.add_range(h, new, new + new_len, prot)?;
        self.move_pages(h, old, old + old_len.min(new_len), new)?;
        self.remove_range(h, old, old_end)?;
        Ok(h.mapped(new, prot))
    }

    pub(super) fn home_fork(&self, r: P2M_FORK) -> Result<M2P_FORKED, Refusal> {
        let P2M_FORK { parent, child } = r;
        self.fresh_pid(child)?;
        let hp = self.home_proc(&parent)?;
        let mut h = hp.lock().unwrap();
        // The child maps what its parent does: charged as much, or refused.
        self.quotas.reserve(&h.who.vnode, h.memory_quota, h.charged)?;
        let vrs = self.vrs();
        let idxs: Vec<u64> = h.vregions.keys().copied().collect();
        for idx in idxs {
            let forked = self.to_replicas(&mut h, idx, |who| M2M_FORK { parent: who, child, start: idx * vrs, end: (idx + 1) * vrs });
            if let Err(e) = forked {
                self.quotas.settle(&h.who.vnode, h.charged, 0, 0);
                for o in h.all_owners() {
                    let _ = self.to_owner(&o, M2M_EXIT { who: Who { pid: child, ..h.who() } });
                }
                return Err(e);
            }
        }
        let mut copy = HomeProc {
            who: Who { pid: child, ..h.who.clone() },
            creator: h.creator,
            pcomp: h.pcomp,
            base: h.base,
            limit: h.limit,
            layout: h.layout.clone(),
            vregions: h.vregions.clone(),
            epoch: h.epoch,
            backup: h.backup.clone(),
            retired: Vec::new(),
            exited: false,
            memory_quota: h.memory_quota,
            charged: h.charged,
        };
        self.sync_backup(&mut copy);
        let vmas = h.layout.iter().map(|(s, v)| VmaInfo { start: s, end: v.end, prot: v.prot }).collect();
        let forked = M2P_FORKED { vmas, owners: copy.owners(), epoch: copy.epoch, backup: copy.backup.clone() };
        self.homes.lock().unwrap().insert(child, Arc::new(Mutex::new(copy)));
        Ok(forked)
    }

    pub(super) fn home_exit(&self, r: P2M_EXIT) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        self.homes.lock().unwrap().remove(&r.who.pid);
        let mut h = hp.lock().unwrap();
        h.exited = true;
        self.quotas.settle(&h.who.vnode, 0, h.charged, 0);
        h.charged = 0;
        let mut all = h.all_owners();
        all.extend(h.retired.iter().filter(|r| !all.iter().any(|o| o.id == r.id)).cloned().collect::<Vec<_>>());
        let mut orphaned: Vec<ComponentRef> = Vec::new();
        for o in all {
            if let Err(e) = self.to_owner(&o, M2M_EXIT { who: h.who() }) {
                tracing::warn!(pid = r.who.pid, owner = o.id, error = %e, "owner did not free an exited process's memory");
                // A logger drops the process's backup files after what it still streams
                // there; those of a logger that cannot are dropped here.
                let logged = h.vregions.iter().filter(|(i, s)| s.wire(**i).logger().is_some_and(|l| l.id == o.id)).filter_map(|(_, s)| s.log.clone());
                orphaned.extend(logged.collect::<Vec<_>>());
            }
        }
        orphaned.sort_by_key(|s| s.id);
        orphaned.dedup_by_key(|s| s.id);
        for scomp in orphaned {
            if let Err(e) = self.peers.call(&scomp.addr, M2S_LOG_DROP { vnode: h.who.vnode.clone(), pid: h.who.pid }) {
                tracing::warn!(pid = r.who.pid, scomp = scomp.id, error = %e, "sComponent did not drop an exited process's backup files");
            }
        }
        if let Some(b) = &h.backup {
            if let Err(e) = self.peers.call(&b.addr, M2M_HOME_DROP { who: h.who() }) {
                tracing::warn!(pid = r.who.pid, backup = b.id, error = %e, "backup home did not drop an exited process's state");
            }
        }
        Ok(OK)
    }

    /// Releases, as their exit would, the processes created by pComponents the global
    /// managers say are lost: nobody will ever exit them.
    pub(super) fn reclaim_lost(&self, lost: &[LostPcomp]) {
        if lost.is_empty() {
            return;
        }
        let homes: Vec<(u64, Arc<Mutex<HomeProc>>)> = self.homes.lock().unwrap().iter().map(|(pid, h)| (*pid, h.clone())).collect();
        for (pid, h) in homes {
            let (who, orphan) = {
                let g = h.lock().unwrap();
                (g.who.clone(), lost.iter().any(|l| g.creator == Some(l.key) && g.pcomp == l.id))
            };
            if !orphan {
                continue;
            }
            tracing::warn!(pid, "releasing the memory of a process whose pComponent is lost");
            metrics::counter!("mcomp_lost_processes_released_total").increment(1);
            if let Err(e) = self.home_exit(P2M_EXIT { who }) {
                tracing::warn!(pid, error = %e, "cannot release a lost pComponent's process");
            }
        }
    }

    pub(super) fn vregions(&self, r: P2M_VREGIONS) -> Result<M2P_VREGIONS, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let h = hp.lock().unwrap();
        Ok(M2P_VREGIONS { owners: h.owners(), epoch: h.epoch, backup: h.backup.clone() })
    }

    /// A pComponent could not reach a replica of the process: once the home finds it
    /// unreachable too (or not holding the process), it leaves the process's sets and is
    /// rebuilt elsewhere in the background. A member the home still reaches stays: a
    /// pComponent's word alone takes no copy out of service.
    pub(super) fn replica_lost(&self, r: P2M_REPLICA_LOST) -> Result<M2P_VREGIONS, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let member = hp.lock().unwrap().vregions.values().flat_map(|s| s.owners.iter()).find(|o| o.id == r.lost).cloned();
        if let Some(o) = member {
            if self.reaches(&o, &r.who) {
                tracing::warn!(pid = r.who.pid, member = r.lost, "a pComponent cannot reach a replica this home reaches: it stays");
            } else {
                tracing::warn!(pid = r.who.pid, lost = r.lost, "a replica of a process is lost");
                // The vRegion the pComponent waits for first; the others in the background.
                self.drop_replicas(&mut hp.lock().unwrap(), &[r.lost], Some(r.vpn * PAGE / self.vrs()));
            }
        }
        self.vregions(P2M_VREGIONS { who: r.who })
    }

    /// A write-back of page `vpn` found member `full` out of memory (heuristic overcommit):
    /// the page's vRegion moves from it to an mComponent with room, its copy there is
    /// released, and the new sets are answered.
    pub(super) fn owner_full(&self, r: P2M_OWNER_FULL) -> Result<M2P_VREGIONS, Refusal> {
        let hp = self.home_proc(&r.who)?;
        {
            let mut h = hp.lock().unwrap();
            let idx = r.vpn * PAGE / self.vrs();
            let holds = h.vregions.get(&idx).and_then(|s| s.owners.iter().find(|o| o.id == r.full)).cloned();
            if let Some(full) = holds {
                self.relocate(&mut h, idx, &full)?;
            }
        }
        self.vregions(P2M_VREGIONS { who: r.who })
    }

    fn relocate(&self, h: &mut HomeProc, idx: u64, full: &ComponentRef) -> Result<(), Refusal> {
        let Some((new, moved)) = self.copy_to_new_member(h, idx, full, &[full.id], false)? else {
            metrics::counter!("mcomp_no_room_total").increment(1);
            return Err(ERR::new(ErrCode::NoMemory, format!("mComponent {} is full and no other mComponent has room for vRegion {idx} of process {}", full.id, h.who.pid)));
        };
        let s = h.vregions.get_mut(&idx).expect("checked by the caller");
        for o in s.owners.iter_mut().filter(|o| o.id == full.id) {
            *o = new.clone();
        }
        s.epoch = h.epoch;
        let set = s.clone();
        if set.announced() {
            // The full member learns it left the set before it frees its copy: what it frees
            // is on the new member now, and no change of it may reach the parity.
            self.tell_set(h, idx, &set, LogStep::Keep)?;
            if let Err(e) = self.tell_member(h, full, idx, &set, LogStep::Keep) {
                tracing::warn!(owner = full.id, error = %e, "cannot tell a full mComponent it left a striped set");
            }
        }
        let vrs = self.vrs();
        if let Err(e) = self.to_owner(full, M2M_VMA_REMOVE { who: h.who(), start: idx * vrs, end: (idx + 1) * vrs }) {
            tracing::warn!(owner = full.id, error = %e, "cannot release a moved vRegion on the full mComponent");
        }
        self.sync_backup(h);
        metrics::counter!("mcomp_vregions_moved_total").increment(1);
        tracing::info!(pid = h.who.pid, vregion = idx, from = full.id, to = new.id, pages = moved, "vRegion moved off a full mComponent");
        Ok(())
    }

    /// Takes `lost` out of every replica set of the process where another member remains (a
    /// set whose only member is lost keeps it: its pages are there if it comes back, and
    /// until then the program is told which mComponent it waits for), queues the sets that
    /// lost a member for rebuilding, and tells the backup home. A lost primary's logger is
    /// made primary at once; a striped set's lost place is rebuilt at once only in vRegion
    /// `urgent` (the one a caller waits for: its pages cannot be read or written until
    /// then), the others in the background.
    fn drop_replicas(&self, h: &mut HomeProc, lost: &[u32], urgent: Option<u64>) {
        self.note_lost(lost);
        let mut changed = false;
        let mut retired = Vec::new();
        let mut striped = Vec::new();
        let mut promote = Vec::new();
        for (idx, set) in h.vregions.iter_mut() {
            if set.log.is_some() && set.owners.len() == 2 && lost.contains(&set.owners[0].id) && !lost.contains(&set.owners[1].id) {
                // The logger replays the backup and becomes primary below.
                retired.push(set.owners[0].clone());
                promote.push(*idx);
                changed = true;
            } else if set.data > 0 {
                // A striped set keeps its places: the lost member's is rebuilt below.
                if let Some(o) = set.owners.iter().find(|o| lost.contains(&o.id)) {
                    retired.push(o.clone());
                    striped.push(*idx);
                    changed = true;
                }
            } else if set.owners.iter().any(|o| !lost.contains(&o.id)) {
                let (gone, kept): (Vec<ComponentRef>, Vec<ComponentRef>) = set.owners.drain(..).partition(|o| lost.contains(&o.id));
                set.owners = kept;
                changed |= !gone.is_empty();
                retired.extend(gone);
            } else if !set.owners.is_empty() {
                metrics::counter!("mcomp_vregions_unreachable_total").increment(1);
                tracing::error!(pid = h.who.pid, lost = ?lost, "every copy of a vRegion is on lost mComponents");
            }
        }
        for o in retired {
            if !h.retired.iter().any(|r| r.id == o.id) {
                h.retired.push(o);
            }
        }
        if h.backup.as_ref().is_some_and(|b| lost.contains(&b.id)) {
            h.backup = None;
            changed = true;
        }
        if changed {
            h.epoch += 1;
            let epoch = h.epoch;
            for set in h.vregions.values_mut().filter(|s| s.data == 0 && s.owners.len() < self.replication().members()) {
                set.epoch = epoch;
            }
            for idx in striped.into_iter().filter(|i| Some(*i) == urgent) {
                if let Err(e) = self.rebuild_place(h, idx) {
                    tracing::error!(pid = h.who.pid, vregion = idx, error = %e, "cannot rebuild a lost member of a striped set; will try again");
                }
            }
            for idx in promote {
                if let Err(e) = self.promote_logger(h, idx) {
                    metrics::counter!("mcomp_vregions_unreachable_total").increment(1);
                    tracing::error!(pid = h.who.pid, vregion = idx, error = %e, "the primary of a logged vRegion is lost and its logger cannot take its place: the program waits for the lost primary");
                }
            }
            self.sync_backup(h);
            if h.short_of(self.replication().members()) > 0 {
                self.queue(super::Job::Rebuild(h.who.pid));
            }
        }
    }

    /// Brings every replica set of process `pid` back to the cluster's number of copies, one
    /// vRegion at a time, holding the process's home lock for each (not between them): the
    /// process's calls and write-backs to that vRegion wait meanwhile (its owners refuse
    /// older epochs).
    pub(super) fn rebuild(&self, pid: u64) {
        let Some(hp) = self.homes.lock().unwrap().get(&pid).cloned() else { return };
        let members = self.replication().members();
        let mut tried = std::collections::BTreeSet::new();
        loop {
            let mut h = hp.lock().unwrap();
            if h.exited {
                return;
            }
            let Some(idx) = h.vregions.iter().find(|(i, s)| h.short(s, members) && !tried.contains(*i)).map(|(i, _)| *i) else { return };
            tried.insert(idx);
            let striped = h.vregions[&idx].data > 0;
            let done = if striped { self.rebuild_place(&mut h, idx) } else { self.rebuild_vregion(&mut h, idx) };
            if let Err(e) = done {
                tracing::warn!(pid, vregion = idx, error = %e, "cannot rebuild a replica; will try again");
            }
            self.sync_backup(&mut h);
        }
    }

    fn rebuild_vregion(&self, h: &mut HomeProc, idx: u64) -> Result<(), Refusal> {
        let started = std::time::Instant::now();
        let source = h.vregions.get(&idx).expect("listed by the caller").owners[0].clone();
        let Some((new, pages_copied)) = self.copy_to_new_member(h, idx, &source, &[], true)? else {
            return Err(ERR::new(ErrCode::NoMemory, "no other mComponent has room for a replica"));
        };
        let s = h.vregions.get_mut(&idx).expect("listed by the caller");
        s.owners.push(new.clone());
        s.epoch = h.epoch;
        h.retired.retain(|r| r.id != new.id);
        metrics::counter!("mcomp_rebuilt_vregions_total").increment(1);
        tracing::info!(pid = h.who.pid, vregion = idx, to = new.id, pages = pages_copied, ms = started.elapsed().as_millis() as u64, "replica rebuilt");
        Ok(())
    }

    /// Makes the logger of logged set `idx`, whose primary (a retired member now) is lost, its
    /// primary, holding the home lock: the logger is fenced first, then told the set it is
    /// the only member of, and replays the backup file and its log into pages before it
    /// answers. A refusal (the log skipped write-backs, the sComponent cannot be read) leaves
    /// the set as it was: the program waits for the lost primary and is told which it is.
    fn promote_logger(&self, h: &mut HomeProc, idx: u64) -> Result<(), Refusal> {
        let started = std::time::Instant::now();
        let set = h.vregions.get(&idx).cloned().expect("listed by the caller");
        let (gone, logger) = (set.owners[0].clone(), set.owners[1].clone());
        let who = h.who();
        self.fence_set(&set.wire(idx), &who, Some(gone.id))?;
        let promoted = Replicas { epoch: h.epoch, owners: vec![logger.clone()], ..set };
        // Replaying reads the whole backup from the sComponent: longer than a call may take.
        let replay = M2M_SET { who, set: promoted.wire(idx), creator: h.creator, home: self.me(), log: LogStep::Replay };
        match logger.id == self.peers.id() {
            true => self.to_owner(&logger, replay).map(|_| ())?,
            false => self.peers.call_timeout(&logger.addr, replay, REPLAY_TIMEOUT).map(|_| ())?,
        }
        h.vregions.insert(idx, promoted);
        metrics::counter!("mcomp_loggers_promoted_total").increment(1);
        tracing::info!(pid = h.who.pid, vregion = idx, lost = gone.id, logger = logger.id, ms = started.elapsed().as_millis() as u64, "logger made primary from its backup");
        Ok(())
    }

    /// `M2M_LOG_RESYNC`: the logger of vRegion `index` skipped write-backs while its log was
    /// full. With the set fenced (no write-back lands meanwhile), its backup starts anew and
    /// the primary's pages are copied to it.
    pub(super) fn log_resync(&self, r: M2M_LOG_RESYNC) -> Result<OK, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = hp.lock().unwrap();
        let idx = r.index;
        let set = h.vregions.get(&idx).cloned().filter(|s| s.log.is_some() && s.owners.len() == 2).ok_or_else(|| ERR::new(ErrCode::Invalid, format!("vRegion {idx} of process {} has no logger", r.who.pid)))?;
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
        metrics::counter!("mcomp_log_resyncs_total").increment(1);
        tracing::info!(pid = r.who.pid, vregion = idx, logger = logger.id, pages = n, "copied a vRegion to its logger again: protected again");
        Ok(OK)
    }

    /// Moves the members of set `set` but `skip` to the process's epoch in `who`; in a striped
    /// set the data members first and the parity member last: each answers once no change of its own
    /// is on its way to the parity, and a write-back that a data member took before it was
    /// told reaches a parity member that still takes it. From then on the set's pages and
    /// parity agree until the home lets go of the process.
    fn fence_set(&self, set: &VregionReplicas, who: &Who, skip: Option<u32>) -> Result<(), Refusal> {
        let parity = set.parity().map(|p| p.id);
        let mut members: Vec<&ComponentRef> = set.distinct().into_iter().filter(|o| Some(o.id) != skip).collect();
        members.sort_by_key(|o| Some(o.id) == parity);
        for o in members {
            self.to_owner(o, M2M_EPOCH { who: who.clone() })?;
        }
        Ok(())
    }

    /// `P2M_RECONSTRUCT`: page `vpn` of a striped set, whose holder sent a copy failing its
    /// checksum, as the parity and the rest of its row say it is, written over the bad copy.
    /// The set is fenced first: a checksum cannot tell a page rebuilt from a row that was
    /// changing (XOR of valid pages passes it), so the row must not change meanwhile. In a
    /// logged set the page is what the logger's backup says.
    pub(super) fn reconstruct(&self, r: P2M_RECONSTRUCT) -> Result<M2P_PAGE, Refusal> {
        let hp = self.home_proc(&r.who)?;
        let mut h = hp.lock().unwrap();
        let idx = r.vpn * PAGE / self.vrs();
        let set =
            h.vregions.get(&idx).map(|s| s.wire(idx)).filter(|s| s.data > 0 || s.logger().is_some()).ok_or_else(|| ERR::new(ErrCode::Invalid, format!("heap page {:#x} is in no striped or logged set", r.vpn * PAGE)))?;
        h.epoch += 1;
        let who = h.who();
        let out = self.fence_set(&set, &who, None).and_then(|()| match set.logger() {
            Some(logger) => Ok(self.read_all(logger, &who, r.vpn, r.vpn + 1, false)?.pop().map_or_else(sealed_zero_page, |(_, d)| d)),
            None => self.rebuild_page(&set, &who, r.vpn),
        });
        self.sync_backup(&mut h);
        let page = out?;
        if unseal_page(page.clone()).is_err() {
            return Err(ERR::new(ErrCode::Internal, format!("heap page {:#x} cannot be rebuilt: the result fails its checksum too (the parity, another page of its row, or the backup is corrupted)", r.vpn * PAGE)));
        }
        let holder = set.holder(r.vpn);
        self.to_owner(holder, M2M_PUT_PAGES { who: who.clone(), pages: vec![(r.vpn, page.clone())], put: Put::Copy })?;
        self.c.reconstructed.fetch_add(1, Relaxed);
        metrics::counter!("mcomp_pages_reconstructed_total").increment(1);
        tracing::warn!(pid = r.who.pid, vpn = r.vpn, holder = holder.id, "rebuilt a corrupted page from redundancy and wrote it over its holder's copy");
        Ok(M2P_PAGE { data: page })
    }

    /// Page `vpn` of a fenced striped set as the parity and the other pages of its row say.
    fn rebuild_page(&self, set: &VregionReplicas, who: &Who, vpn: u64) -> Result<ByteBuf, Refusal> {
        let row = set.row(vpn);
        let mut out = vec![0u8; SEALED_PAGE];
        let parity = set.parity().expect("a striped set");
        let from_parity = self.read_all(parity, who, row, row + 1, true)?;
        let others: Vec<u64> = set.row_pages(row).filter(|v| *v != vpn).collect();
        let mut pages = from_parity;
        for v in others {
            pages.extend(self.read_all(set.holder(v), who, v, v + 1, false)?);
        }
        for (_, d) in pages {
            out.iter_mut().zip(&d[..]).for_each(|(x, y)| *x ^= y);
        }
        Ok(if out.iter().all(|b| *b == 0) { sealed_zero_page() } else { ByteBuf::from(out) })
    }

    /// Rebuilds the place of a lost member (one of the process's retired members) of striped
    /// set `idx` on another mComponent, holding the home lock: the survivors move to a new
    /// epoch first and answer once no change of theirs is still on its way to the parity, so
    /// that the pages and the parity read agree. A lost data place gets each of its pages as
    /// the XOR of its row's parity and other pages, a lost parity place the XOR of each row.
    /// Two places lost at once cannot be rebuilt: the set keeps them, and the program is told
    /// which mComponent it waits for when it touches them.
    fn rebuild_place(&self, h: &mut HomeProc, idx: u64) -> Result<(), Refusal> {
        let started = std::time::Instant::now();
        let set = h.vregions.get(&idx).cloned().expect("listed by the caller");
        let k = set.data as usize;
        let retired: Vec<u32> = h.retired.iter().map(|r| r.id).collect();
        let lost: Vec<usize> = (0..=k).filter(|p| retired.contains(&set.owners[*p].id)).collect();
        let place = match lost[..] {
            [] => return Ok(()),
            [place] => place,
            _ => {
                metrics::counter!("mcomp_vregions_unreachable_total").increment(1);
                return Err(ERR::new(ErrCode::Unreachable, format!("vRegion {idx} of process {} lost {} of its {} places at once: one parity cannot rebuild them", h.who.pid, lost.len(), k + 1)));
            }
        };
        let gone = set.owners[place].clone();
        let wire = set.wire(idx);
        let survivors: Vec<ComponentRef> = wire.distinct().into_iter().filter(|o| o.id != gone.id).cloned().collect();
        let share = self.vrs() / k as u64;
        let mut out: Vec<u32> = set.owners.iter().map(|o| o.id).collect();
        out.extend(&retired);
        // Another mComponent if one has room; else a survivor takes a second place.
        let new = match self.pick_other(share, &out)? {
            Some(n) => n,
            None => self.pick_other(share, &retired)?.ok_or_else(|| ERR::new(ErrCode::NoMemory, format!("no mComponent has room to rebuild vRegion {idx} of process {}", h.who.pid)))?,
        };
        h.epoch += 1;
        let who = h.who();
        self.fence_set(&wire, &who, Some(gone.id))?;
        let vrs = self.vrs();
        let fresh = !survivors.iter().any(|o| o.id == new.id);
        let rebuilt = self.rebuild_rows(h, &wire, place, &survivors, &new, &who);
        if rebuilt.is_err() && fresh {
            // Whatever reached the new member is released there.
            let _ = self.to_owner(&new, M2M_VMA_REMOVE { who: who.clone(), start: idx * vrs, end: (idx + 1) * vrs });
        }
        let (pages_rebuilt, bad) = rebuilt?;
        if bad > 0 {
            // A survivor's copy was corrupted: those pages fail their checksum when fetched,
            // and the program stops there rather than read them.
            metrics::counter!("mcomp_rebuilt_pages_corrupt_total").increment(bad);
            tracing::error!(pid = h.who.pid, vregion = idx, pages = bad, "rebuilt pages fail their checksum: another page of their row was corrupted");
        }
        let s = h.vregions.get_mut(&idx).expect("listed by the caller");
        s.owners[place] = new.clone();
        s.epoch = h.epoch;
        let set = s.clone();
        self.tell_set(h, idx, &set, LogStep::Keep)?;
        metrics::counter!("mcomp_rebuilt_pages_total").increment(pages_rebuilt);
        metrics::counter!("mcomp_rebuilt_vregions_total").increment(1);
        tracing::info!(pid = h.who.pid, vregion = idx, place, lost = gone.id, to = new.id, pages = pages_rebuilt, ms = started.elapsed().as_millis() as u64, "striped set rebuilt from parity");
        Ok(())
    }

    /// Writes on `new` (which gets the vmas first unless it is a survivor) every page of
    /// `place` of the fenced striped set `set`, from the survivors' pages and parity; returns
    /// the pages written and how many of them fail their checksum.
    fn rebuild_rows(&self, h: &HomeProc, set: &VregionReplicas, place: usize, survivors: &[ComponentRef], new: &ComponentRef, who: &Who) -> Result<(u64, u64), Refusal> {
        let k = set.data as usize;
        let vrs = self.vrs();
        let (lo, hi) = (set.index * vrs / PAGE, (set.index + 1) * vrs / PAGE);
        if !survivors.iter().any(|o| o.id == new.id) {
            self.give_vmas(h, new, who, lo * PAGE, hi * PAGE)?;
        }
        let data: Vec<ComponentRef> = survivors.iter().filter(|o| set.owners[..k].iter().any(|d| d.id == o.id)).cloned().collect();
        // Whole rows at a time: a window is a multiple of k stripe units.
        let window = 8 * k as u64 * STRIPE_PAGES;
        let (mut pages_rebuilt, mut bad) = (0u64, 0u64);
        let mut at = lo;
        while at < hi {
            let end = (at + window).min(hi);
            let mut rows: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
            let mut add = |row: u64, d: &[u8]| {
                let row = rows.entry(row).or_insert_with(|| vec![0u8; SEALED_PAGE]);
                row.iter_mut().zip(d).for_each(|(x, y)| *x ^= y);
            };
            for o in &data {
                for (vpn, d) in self.read_all(o, who, at, end, false)? {
                    add(set.row(vpn), &d);
                }
            }
            if place < k {
                for (row, d) in self.read_all(&set.owners[k], who, at, end, true)? {
                    add(row, &d);
                }
            }
            let mut pages = Vec::new();
            for (row, d) in rows.into_iter().filter(|(_, d)| d.iter().any(|b| *b != 0)) {
                let d = ByteBuf::from(d);
                if place < k && unseal_page(d.clone()).is_err() {
                    bad += 1;
                }
                pages.push((if place < k { row + place as u64 * STRIPE_PAGES } else { row }, d));
            }
            pages_rebuilt += pages.len() as u64;
            // Progress as it goes, for `cluster status`.
            self.rebuilt_pages.fetch_add(pages.len() as u64, Relaxed);
            if !pages.is_empty() {
                self.to_owner(new, M2M_PUT_PAGES { who: who.clone(), pages, put: if place < k { Put::Copy } else { Put::Parity } })?;
            }
            at = end;
        }
        Ok((pages_rebuilt, bad))
    }

    /// Every page (or parity row) `o` holds of the process in pages [from, end).
    fn read_all(&self, o: &ComponentRef, who: &Who, from: u64, end: u64, parity: bool) -> Result<Vec<(u64, ByteBuf)>, Refusal> {
        let mut out = Vec::new();
        let mut at = from * PAGE;
        loop {
            let M2M_PAGES { pages, more } = self.to_owner(o, M2M_READ_PAGES { who: who.clone(), from: at, end: end * PAGE, max: MOVE_BATCH, parity })?;
            if let Some((last, _)) = pages.last() {
                at = (last + 1) * PAGE;
            }
            out.extend(pages);
            if !more {
                return Ok(out);
            }
        }
    }

    /// Picks an mComponent with room outside vRegion `idx`'s set (and `exclude`), moves the
    /// process to a new epoch that the set's members enforce from now on (no write-back of
    /// the old sets can land on them while their pages are copied, and so be missed by the
    /// new member), and copies `source`'s vmas and pages of the vRegion to it. `None`: no
    /// mComponent has room. The caller puts the new member into the set. In a logged set a
    /// new member joining `as_logger` is told so first: the copy starts its backup.
    fn copy_to_new_member(&self, h: &mut HomeProc, idx: u64, source: &ComponentRef, exclude: &[u32], as_logger: bool) -> Result<Option<(ComponentRef, u64)>, Refusal> {
        let set = h.vregions.get(&idx).cloned().expect("checked by the caller");
        let mut out: Vec<u32> = set.owners.iter().map(|o| o.id).collect();
        out.extend_from_slice(exclude);
        let Some(new) = self.pick_other(self.vrs(), &out)? else { return Ok(None) };
        h.epoch += 1;
        let who = h.who();
        self.fence_set(&set.wire(idx), &who, None)?;
        let vrs = self.vrs();
        let (lo, hi) = (idx * vrs, (idx + 1) * vrs);
        // In a logged set the new member learns its place before the copy: a new logger's
        // backup restarts with it, and a new primary that logged this vRegion before (a try
        // that failed on the way) stops logging it.
        let with = match as_logger {
            true => Replicas { epoch: h.epoch, owners: vec![source.clone(), new.clone()], ..set.clone() },
            false => Replicas { epoch: h.epoch, owners: set.owners.iter().map(|o| if o.id == source.id { new.clone() } else { o.clone() }).collect(), ..set.clone() },
        };
        let copied = |h: &HomeProc| -> Result<u64, Refusal> {
            if with.log.is_some() {
                self.tell_member(h, &new, idx, &with, if as_logger { LogStep::Restart } else { LogStep::Keep })?;
            }
            let n = self.copy_vregion(h, source, &new, &who, lo, hi)?;
            if with.log.is_some() && as_logger {
                self.tell_member(h, &new, idx, &with, LogStep::Whole)?;
            }
            Ok(n)
        };
        match copied(h) {
            Ok(n) => Ok(Some((new, n))),
            Err(e) => {
                // Whatever reached the new member is released there.
                let _ = self.to_owner(&new, M2M_VMA_REMOVE { who, start: lo, end: hi });
                Err(e)
            }
        }
    }

    /// Gives `new` the process's vmas of [lo, hi).
    fn give_vmas(&self, h: &HomeProc, new: &ComponentRef, who: &Who, lo: u64, hi: u64) -> Result<(), Refusal> {
        let vmas: Vec<(u64, Vma)> = h.layout.iter().filter(|(s, v)| *s < hi && v.end > lo).collect();
        for (s, v) in vmas {
            self.to_owner(new, M2M_VMA_ADD { who: who.clone(), start: s.max(lo), end: v.end.min(hi), prot: v.prot, creator: h.creator })?;
        }
        Ok(())
    }

    /// Gives `new` the vmas of [lo, hi) and a copy of every page and parity row `source`
    /// holds there; returns the number of pages and rows copied.
    fn copy_vregion(&self, h: &HomeProc, source: &ComponentRef, new: &ComponentRef, who: &Who, lo: u64, hi: u64) -> Result<u64, Refusal> {
        self.give_vmas(h, new, who, lo, hi)?;
        self.copy_pages(source, new, who, lo, hi)
    }

    /// Copies every page and parity row `source` holds in [lo, hi) to `new`.
    fn copy_pages(&self, source: &ComponentRef, new: &ComponentRef, who: &Who, lo: u64, hi: u64) -> Result<u64, Refusal> {
        let mut pages_copied = 0u64;
        for parity in [false, true] {
            let mut from = lo;
            loop {
                let M2M_PAGES { pages, more } = self.to_owner(source, M2M_READ_PAGES { who: who.clone(), from, end: hi, max: MOVE_BATCH, parity })?;
                if let Some((last, _)) = pages.last() {
                    from = (last + 1) * PAGE;
                }
                pages_copied += pages.len() as u64;
                self.rebuilt_pages.fetch_add(pages.len() as u64, Relaxed);
                metrics::counter!("mcomp_rebuilt_pages_total").increment(pages.len() as u64);
                if !pages.is_empty() {
                    self.to_owner(new, M2M_PUT_PAGES { who: who.clone(), pages, put: if parity { Put::Parity } else { Put::Copy } })?;
                }
                if !more {
                    break;
                }
            }
        }
        Ok(pages_copied)
    }

    /// The global managers say these mComponents are lost: every process this mComponent is
    /// home of loses its replicas there, and every process whose home was one of them gets
    /// this mComponent as its home if it was the backup.
    pub(super) fn mcomps_lost(&self, lost: &[u32]) {
        if lost.is_empty() || !self.replication().redundant() {
            return;
        }
        let homes: Vec<Arc<Mutex<HomeProc>>> = self.homes.lock().unwrap().values().cloned().collect();
        for hp in homes {
            let mut h = hp.lock().unwrap();
            let touched = h.vregions.values().any(|s| s.owners.iter().any(|o| lost.contains(&o.id))) || h.backup.as_ref().is_some_and(|b| lost.contains(&b.id));
            if touched {
                self.drop_replicas(&mut h, lost, None);
            }
        }
        let orphans: Vec<(Who, u32)> = self.backups.lock().unwrap().values().filter(|s| lost.contains(&s.home.id)).map(|s| (s.who.clone(), s.home.id)).collect();
        for (who, home) in orphans {
            let pid = who.pid;
            if let Err(e) = self.take_over(who, home) {
                tracing::warn!(pid, error = %e, "cannot take over a process whose home is lost");
            }
        }
    }

    /// A home's copy of its state of one process, kept for taking over.
    pub(super) fn home_sync(&self, r: M2M_HOME_SYNC) -> Result<OK, Refusal> {
        let pid = r.state.who.pid;
        if self.homes.lock().unwrap().contains_key(&pid) {
            return Err(ERR::new(ErrCode::Denied, format!("mComponent {} is now the home of process {pid}", self.peers.id())));
        }
        self.backups.lock().unwrap().insert(pid, r.state);
        Ok(OK)
    }

    pub(super) fn home_drop(&self, r: M2M_HOME_DROP) -> Result<OK, Refusal> {
        self.backups.lock().unwrap().remove(&r.who.pid);
        Ok(OK)
    }

    /// The pComponent of a process cannot reach its home: the backup becomes the home, once
    /// it finds the home unreachable too (or no longer the process's home). A home that is
    /// only slow stays the home: two homes of one process would each change its sets.
    pub(super) fn home_takeover(&self, r: P2M_HOME_TAKEOVER) -> Result<M2P_HOME, Refusal> {
        if let Ok(hp) = self.home_proc(&r.who) {
            return Ok(M2P_HOME { backup: hp.lock().unwrap().backup.clone() });
        }
        let kept = self.backups.lock().unwrap().get(&r.who.pid).map(|s| (s.who.vnode.clone(), s.creator, s.home.clone()));
        let Some((vnode, creator, home)) = kept else {
            return Err(ERR::new(ErrCode::NotFound, format!("mComponent {} keeps no copy of process {}'s home", self.peers.id(), r.who.pid)));
        };
        if vnode != r.who.vnode {
            return Err(ERR::new(ErrCode::Denied, format!("process {} belongs to another vNode", r.who.pid)));
        }
        self.may_act(r.who.pid, creator)?;
        if self.peers.call_timeout(&home.addr, M2M_HOME_OF { who: Who::new(vnode, r.who.pid) }, VERIFY_TIMEOUT).is_ok() {
            return Err(ERR::new(ErrCode::Unreachable, format!("mComponent {} at {} is still the home of process {}: it is slow, not lost", home.id, home.addr, r.who.pid)));
        }
        self.take_over(r.who, home.id)
    }

    /// `M2M_HOME_OF`: whether this mComponent is still the process's home.
    pub(super) fn home_of(&self, r: M2M_HOME_OF) -> Result<OK, Refusal> {
        self.homes.lock().unwrap().get(&r.who.pid).map(|_| OK).ok_or_else(|| ERR::new(ErrCode::NotHome, format!("mComponent {} is not home of process {}", self.peers.id(), r.who.pid)))
    }

    /// Becomes the home of `who` from the copy of its state kept here. The epoch moves past
    /// any the process's pComponent (`who.epoch`) or an owner may have seen.
    fn take_over(&self, who: Who, lost_home: u32) -> Result<M2P_HOME, Refusal> {
        let Some(state) = self.backups.lock().unwrap().remove(&who.pid) else {
            return Err(ERR::new(ErrCode::NotFound, format!("mComponent {} keeps no copy of process {}'s home", self.peers.id(), who.pid)));
        };
        let hp = Arc::new(Mutex::new(HomeProc::from_state(state)));
        let mut h = hp.lock().unwrap();
        self.homes.lock().unwrap().insert(who.pid, hp.clone());
        metrics::counter!("mcomp_home_takeovers_total").increment(1);
        tracing::warn!(pid = who.pid, lost = lost_home, "home of a process is lost: this mComponent, its backup, takes over");
        h.epoch = h.epoch.max(who.epoch) + 1;
        // Charged here now: what it had mapped is not refused, only what it maps next.
        h.charged = h.writable_in(h.base, h.limit);
        self.quotas.settle(&h.who.vnode, 0, 0, h.charged);
        let epoch_who = h.who();
        for o in h.all_owners() {
            if let Err(e) = self.to_owner(&o, M2M_EPOCH { who: epoch_who.clone() }) {
                tracing::debug!(owner = o.id, error = %e, "cannot tell an owner the new epoch");
            }
        }
        self.drop_replicas(&mut h, &[lost_home], None);
        // Loggers ask their home for copies: this one now.
        let logged: Vec<(u64, Replicas)> = h.vregions.iter().filter(|(_, s)| s.log.is_some()).map(|(i, s)| (*i, s.clone())).collect();
        for (idx, set) in logged {
            if let Err(e) = self.tell_set(&h, idx, &set, LogStep::Keep) {
                tracing::warn!(pid = who.pid, vregion = idx, error = %e, "cannot tell a logged set its new home");
            }
        }
        self.sync_backup(&mut h);
        Ok(M2P_HOME { backup: h.backup.clone() })
    }

    /// Moves the materialized pages of [start, end) to the same offsets from `to`.
    fn move_pages(&self, h: &HomeProc, start: u64, end: u64, to: u64) -> Result<(), Refusal> {
        let shift = |vpn: u64| vpn - start / PAGE + to / PAGE;
        let who = h.who();
        for (idx, s, e) in self.slices(start, end) {
            let Some(set) = h.vregions.get(&idx).map(|r| r.wire(idx)) else { continue };
            // Every page once: from the primary of a replica set, from each data member of a
            // striped one.
            let sources: Vec<ComponentRef> = match set.data {
                0 => vec![set.owners[0].clone()],
                k => set.distinct().into_iter().filter(|o| set.owners[..k as usize].iter().any(|d| d.id == o.id)).cloned().collect(),
            };
            for src in sources {
                // Copied, not taken: the old range is removed only after every copy landed.
                let mut from = s;
                loop {
                    let M2M_PAGES { pages, more } = self.to_owner(&src, M2M_READ_PAGES { who: who.clone(), from, end: e, max: MOVE_BATCH, parity: false })?;
                    if let Some((last, _)) = pages.last() {
                        from = (last + 1) * PAGE;
                    }
                    let mut by_owner: HashMap<u32, (ComponentRef, Vec<(u64, ByteBuf)>)> = HashMap::new();
                    for (vpn, data) in pages {
                        let nv = shift(vpn);
                        let to = h.vregions.get(&(nv * PAGE / self.vrs())).map(|r| r.wire(nv * PAGE / self.vrs())).ok_or_else(|| ERR::new(ErrCode::Internal, "moved page lands in an inactive vRegion"))?;
                        for o in to.writers(nv) {
                            by_owner.entry(o.id).or_insert_with(|| (o.clone(), Vec::new())).1.push((nv, data.clone()));
                        }
                    }
                    for (_, (o, pages)) in by_owner {
                        self.to_owner(&o, M2M_PUT_PAGES { who: who.clone(), pages, put: Put::Write })?;
                    }
                    if !more {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}
