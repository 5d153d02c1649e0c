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
//!
//! This file keeps the sets and how a call reaches their members; the virtual-memory calls
//! are in [`vm`], the rebuilds in [`rebuild`], the backup home and its taking over in
//! [`failover`].
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use splitos_rpc::*;

use super::{Mem, Peers, PAGE};
use splitos_core::vma::{Vma, VmaMap};

mod failover;
mod leave;
mod logged;
mod moves;
mod rebuild;
mod vm;

pub(crate) use vm::Ended;

/// Pages per message when a mapping moves between owners (mremap) or a replica is rebuilt.
const MOVE_BATCH: u32 = 128;

const PROT_WRITE: u32 = 2;

/// How long a home waits for a member a pComponent reported lost, and a backup for the home
/// it would replace, before it takes them for lost.
const VERIFY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

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
        VregionReplicas {
            index,
            epoch: self.epoch,
            owners: self.owners.clone(),
            data: self.data,
            log: self.log.clone(),
        }
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
    /// Members taken out of its sets that may still hold copies (they were only cut off) or
    /// its record (its vRegions moved off them): freed when the process exits.
    retired: Vec<ComponentRef>,
    /// The process exited: a rebuild queued before must not bring it back.
    exited: bool,
    /// The home this leaving mComponent gives the process to: from the moment it is asked,
    /// this one no longer acts for the process (a call is answered `NotHome` and goes there),
    /// so the state it sent stays the state; `handed` once it answered.
    moved_to: Option<ComponentRef>,
    handed: bool,
    /// The leaving home that gave this mComponent the process: a repeat of its request (the
    /// answer was lost) is answered again.
    adopted_from: Option<u32>,
    /// Its vNode's memory quota ([`super::quota`]).
    memory_quota: Option<u64>,
    /// What it is charged against that quota: the bytes it maps writable.
    charged: u64,
    /// The creation that made it, as its pComponent numbers them (`P2M_PROC_CREATE.attempt`):
    /// the undo of that creation or a later one ends it, of an earlier one (late) does not.
    attempt: u32,
}

impl HomeProc {
    /// Whether this mComponent no longer acts for the process: it exited, or its home moved.
    fn gone(&self) -> bool {
        self.exited || self.moved_to.is_some()
    }

    fn owners(&self) -> Vec<VregionReplicas> {
        self.vregions.iter().map(|(i, r)| r.wire(*i)).collect()
    }

    /// The answer to the fork that made this process.
    fn forked(&self) -> M2P_FORKED {
        let vmas = self
            .layout
            .iter()
            .map(|(s, v)| VmaInfo {
                start: s,
                end: v.end,
                prot: v.prot,
            })
            .collect();
        M2P_FORKED {
            vmas,
            owners: self.owners(),
            epoch: self.epoch,
            backup: self.backup.clone(),
        }
    }

    /// The end of [addr, addr + len), which must be page-aligned and inside the heap region.
    fn check_range(&self, addr: u64, len: u64) -> Result<u64, HomeError> {
        let end = addr.checked_add(len).ok_or(HomeError::RangeOverflows)?;
        if !addr.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) || len == 0 || addr < self.base || end > self.limit {
            return Err(HomeError::NotInHeap { addr, len });
        }
        Ok(end)
    }

    fn mapped(&self, addr: u64, prot: u32) -> M2P_MAPPED {
        M2P_MAPPED {
            addr,
            prot,
            owners: self.owners(),
            epoch: self.epoch,
            backup: self.backup.clone(),
        }
    }

    fn who(&self) -> Who {
        Who {
            epoch: self.epoch,
            ..self.who.clone()
        }
    }

    fn state(&self, home: ComponentRef) -> HomeState {
        HomeState {
            who: self.who(),
            home,
            creator: self.creator,
            pcomp: self.pcomp,
            base: self.base,
            limit: self.limit,
            vmas: self
                .layout
                .iter()
                .map(|(start, v)| HomeVma {
                    start,
                    end: v.end,
                    prot: v.prot,
                    accounted: v.accounted,
                })
                .collect(),
            vregions: self.owners(),
            retired: self.retired.clone(),
            memory_quota: self.memory_quota,
            attempt: self.attempt,
        }
    }

    fn from_state(s: HomeState) -> HomeProc {
        let mut layout = VmaMap::default();
        for v in s.vmas {
            layout.insert(
                v.start,
                Vma {
                    end: v.end,
                    prot: v.prot,
                    accounted: v.accounted,
                },
            );
        }
        let vregions = s
            .vregions
            .into_iter()
            .map(|r| {
                (
                    r.index,
                    Replicas {
                        epoch: r.epoch,
                        owners: r.owners,
                        data: r.data,
                        log: r.log,
                    },
                )
            })
            .collect();
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
            moved_to: None,
            handed: false,
            adopted_from: None,
            memory_quota: s.memory_quota,
            charged: 0,
            attempt: s.attempt,
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
        self.vregions
            .get(&idx)
            .map(|r| r.wire(idx).distinct().into_iter().cloned().collect())
            .unwrap_or_default()
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

/// The home state of a process, once a call may act on it: a process whose home moved away
/// while the call waited is refused with `NotHome`, naming the new home.
/// Why a home refuses a call about a process: its virtual-memory calls, the copy of its state
/// a backup keeps and takes over, a home handing it to another. A rebuild's own refusals are
/// [`rebuild::RebuildError`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum HomeError {
    #[error("range overflows")]
    RangeOverflows,
    #[error("range {addr:#x}+{len:#x} is not page-aligned inside the heap region")]
    NotInHeap { addr: u64, len: u64 },
    #[error("process {pid} moved to home mComponent {to} at {addr}")]
    Moved { pid: u64, to: u32, addr: String },
    #[error("mComponent {mcomp} is not home of process {pid}")]
    NotHome { mcomp: u32, pid: u64 },
    #[error("process {pid} belongs to another vNode")]
    OtherVnode { pid: u64 },
    #[error(transparent)]
    OtherPcomponent(#[from] super::OtherPcomponent),
    #[error("no replica of vRegion {idx} of process {pid} can be reached")]
    NoReplicaReachable { idx: u64, pid: u64 },
    #[error("process id {pid} is in use")]
    PidInUse { pid: u64 },
    #[error("process {pid} ended before its creation came")]
    EndedBeforeCreated { pid: u64 },
    #[error("mComponent {mcomp}, which sent a copy of process {pid}'s home, was declared lost")]
    DeclaredLost { mcomp: u32, pid: u64 },
    #[error("the heap region has no free range that large")]
    NoFreeRange,
    #[error("making {len} bytes writable at once is more than all the cluster's memory ({memory} bytes)")]
    MoreThanCluster { len: u64, memory: u64 },
    #[error("mprotect of an unmapped range")]
    MprotectUnmapped,
    #[error("mremap of an unmapped range")]
    MremapUnmapped,
    #[error("cannot grow in place and moving is not allowed")]
    CannotGrowInPlace,
    #[error("no free range for mremap")]
    NoRangeForMremap,
    #[error("moved page lands in an inactive vRegion")]
    MovedToInactive,
    #[error("no other mComponent can be the home of process {pid}")]
    NoOtherHome { pid: u64 },
    #[error("cannot give process {pid} to mComponent {to} as its home yet: {cause}")]
    HandOver { pid: u64, to: u32, cause: RpcError },
    #[error("vRegion {idx} of process {pid} has no logger")]
    NoLogger { idx: u64, pid: u64 },
    #[error("mComponent {mcomp} is now the home of process {pid}")]
    NowHome { mcomp: u32, pid: u64 },
    #[error("mComponent {mcomp} keeps no copy of process {pid}'s home")]
    NoCopy { mcomp: u32, pid: u64 },
    #[error("mComponent {mcomp} at {addr} is still the home of process {pid}: it is slow, not lost")]
    StillHome { mcomp: u32, addr: String, pid: u64 },
    #[error("mComponent {mcomp} is already the home of process {pid}")]
    AlreadyHome { mcomp: u32, pid: u64 },
    #[error("mComponent {mcomp} is not leaving (as the global managers last said): it keeps its homes")]
    NotLeaving { mcomp: u32 },
}

impl Refuse for HomeError {
    fn code(&self) -> ErrCode {
        use HomeError::*;
        match self {
            RangeOverflows | NotInHeap { .. } | MremapUnmapped | NoLogger { .. } | AlreadyHome { .. } => {
                ErrCode::Invalid
            }
            Moved { .. } | NotHome { .. } => ErrCode::NotHome,
            OtherVnode { .. }
            | PidInUse { .. }
            | EndedBeforeCreated { .. }
            | DeclaredLost { .. }
            | NowHome { .. }
            | NotLeaving { .. } => ErrCode::Denied,
            OtherPcomponent(e) => e.code(),
            NoReplicaReachable { .. } | StillHome { .. } => ErrCode::Unreachable,
            NoFreeRange
            | MoreThanCluster { .. }
            | MprotectUnmapped
            | CannotGrowInPlace
            | NoRangeForMremap
            | NoOtherHome { .. } => ErrCode::NoMemory,
            MovedToInactive => ErrCode::Internal,
            HandOver { cause, .. } => cause.code(),
            NoCopy { .. } => ErrCode::NotFound,
        }
    }
}

fn lock_home(hp: &Arc<Mutex<HomeProc>>) -> Result<std::sync::MutexGuard<'_, HomeProc>, HomeError> {
    let h = hp.lock().unwrap();
    match &h.moved_to {
        Some(to) => Err(HomeError::Moved {
            pid: h.who.pid,
            to: to.id,
            addr: to.addr.clone(),
        }),
        None => Ok(h),
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
    fn home_proc(&self, who: &Who) -> Result<Arc<Mutex<HomeProc>>, HomeError> {
        let h = self.homes.lock().unwrap().get(&who.pid).cloned();
        let h = h.ok_or_else(|| HomeError::NotHome {
            mcomp: self.peers.id(),
            pid: who.pid,
        })?;
        let (vnode, creator) = {
            let g = h.lock().unwrap();
            (g.who.vnode.clone(), g.creator)
        };
        if vnode != who.vnode {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(HomeError::OtherVnode { pid: who.pid });
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
    /// `exclude`. `None` when no other has room: the set stays short, and says so. `near`:
    /// the pComponent of the process (0: none), which a placement near first counts from.
    fn pick_other(&self, bytes: u64, exclude: &[u32], near: u32) -> Result<Option<ComponentRef>, Refusal> {
        let mut exclude = exclude.to_vec();
        exclude.extend(self.recently_lost());
        match self.peers.call_gm(M2G_PICK_OWNER { bytes, exclude, near }) {
            Ok(r) => Ok(Some(r.mcomp)),
            Err(RpcError::Remote {
                code: ErrCode::NoMemory,
                ..
            }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// [`Mem::pick_other`] for a program's heap call: while the managers cannot be reached
    /// it asks again ([`splitos_core::node::waiting_for_managers`]), rather than answer ENOMEM
    /// the program cannot explain. Only this process's lock is held (its caller waits on it
    /// anyway); heap calls are served where they wait, blocking no other.
    fn pick_waiting(&self, bytes: u64, exclude: &[u32], near: u32) -> Result<Option<ComponentRef>, Refusal> {
        splitos_core::node::waiting_for_managers(
            || self.pick_other(bytes, exclude, near),
            unreachable,
            || {
                self.c.waits_for_managers.fetch_add(1, Relaxed);
            },
        )
    }

    /// The replica set of vRegion `idx`, asking GMM for its members when it becomes active.
    fn ensure_owners(&self, h: &mut HomeProc, idx: u64) -> Result<Vec<ComponentRef>, Refusal> {
        if let Some(r) = h.vregions.get(&idx) {
            return Ok(r.owners.clone());
        }
        let scheme = self.replication();
        let data = scheme.data();
        let share = self.vrs() / data.max(1) as u64;
        // The home of a vNode with a quota keeps room for all of it: its processes' pages go
        // there first, where no other vNode can take that room (a leaving home excepted).
        let here = h.memory_quota.is_some() && self.leaving.lock().unwrap().is_none();
        let mut owners: Vec<ComponentRef> = if here { vec![self.me()] } else { Vec::new() };
        for _ in owners.len()..scheme.members() {
            let ids: Vec<u32> = owners.iter().map(|o| o.id).collect();
            match self.pick_waiting(share, &ids, h.pcomp)? {
                Some(o) => owners.push(o),
                // A striped set needs all its places: with too few mComponents one stands at
                // two (losing it then loses rows).
                None if data > 0 => owners.push(self.pick_waiting(share, &[], h.pcomp)?.unwrap_or_else(|| self.me())),
                // With every mComponent short of a whole free vRegion, the home holds it and
                // the accounting of each mapping decides what fits.
                None if !ids.contains(&self.peers.id()) => owners.push(self.me()),
                None => break,
            }
        }
        // A logged set's backup file goes where the vNode's files are (a set that starts
        // with its primary alone gets its logger when one has room, as a rebuild).
        let log = match scheme == Replication::Log {
            true => Some(
                self.peers
                    .call_gm(M2G_BACKUP_STORE {
                        vnode: h.who.vnode.clone(),
                    })?
                    .scomp,
            ),
            false => None,
        };
        if log.is_some() {
            // Its own epoch: a logger named by an attempt that failed on the way cannot reset
            // the backup of the one named next.
            h.epoch += 1;
        }
        let set = Replicas {
            epoch: h.epoch,
            owners: owners.clone(),
            data,
            log,
        };
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
            crate::series::UNPROTECTED_VREGIONS.increment(1);
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

    fn tell_member(
        &self,
        h: &HomeProc,
        o: &ComponentRef,
        idx: u64,
        set: &Replicas,
        log: LogStep,
    ) -> Result<OK, Refusal> {
        self.to_owner(
            o,
            M2M_SET {
                who: h.who(),
                set: set.wire(idx),
                creator: h.creator,
                home: self.me(),
                log,
            },
        )
    }

    /// Sends `msg()` to `o`, which holds the only copy of what it is about. One that does not
    /// answer while the global managers have not declared it lost is only late (paused,
    /// overloaded): it is waited for a heartbeat at a time and asked again, as the pComponent
    /// waits for it, so that a late mComponent costs its programs time, not a failed call.
    pub(crate) fn to_only_copy<R: Request>(&self, o: &ComponentRef, msg: impl Fn() -> R) -> Result<R::Reply, Refusal> {
        if o.id == self.peers.id() {
            return self.to_owner(o, msg());
        }
        loop {
            match self.peers.call(&o.addr, msg()) {
                Err(e)
                    if !matches!(e, RpcError::Remote { .. } | RpcError::Protocol { .. }) && self.peers.late(o.id) =>
                {
                    crate::series::LATE_MCOMPONENT_WAITS.increment(1);
                    tracing::warn!(mcomp = o.id, addr = %o.addr, error = %e, "an mComponent holding the only copy does not answer, and the global managers have not declared it lost: waiting for it");
                    std::thread::sleep(splitos_core::node::HEARTBEAT);
                }
                r => return r.map_err(Refusal::from),
            }
        }
    }

    /// Sends `msg(who)` to every replica of vRegion `idx`. A replica that cannot be reached
    /// while another answers leaves the set (and is rebuilt): the call succeeds on the rest.
    /// The only member of a set is waited for while it is late ([`Mem::to_only_copy`]).
    fn to_replicas<R: Request>(&self, h: &mut HomeProc, idx: u64, msg: impl Fn(Who) -> R) -> Result<(), Refusal> {
        let owners = h.members(idx);
        let mut lost = Vec::new();
        let mut answered = false;
        let mut first_err = None;
        for o in &owners {
            let sent = match owners.len() {
                1 => self.to_only_copy(o, || msg(h.who())),
                _ => self.to_owner(o, msg(h.who())),
            };
            match sent {
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
            return Err(HomeError::NoReplicaReachable { idx, pid: h.who.pid }.into());
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
        o.id == self.peers.id()
            || self
                .peers
                .call_timeout(
                    &o.addr,
                    M2M_READ_PAGES {
                        who,
                        from: 0,
                        end: 0,
                        max: 0,
                        parity: false,
                    },
                    VERIFY_TIMEOUT,
                )
                .is_ok()
    }

    /// Sends `msg(who)` to members of vRegion `idx`'s set that joined it since it had
    /// `before` (a striped set's place rebuilt while a call was under way).
    fn to_joined<R: Request>(
        &self,
        h: &HomeProc,
        idx: u64,
        before: &[ComponentRef],
        msg: impl Fn(Who) -> R,
    ) -> Result<(), Refusal> {
        for o in h
            .members(idx)
            .into_iter()
            .filter(|m| !before.iter().any(|b| b.id == m.id))
        {
            self.to_owner(&o, msg(h.who()))?;
        }
        Ok(())
    }

    fn add_range(&self, h: &mut HomeProc, start: u64, end: u64, prot: u32) -> Result<(), Refusal> {
        // In the layout first: a member whose place is rebuilt meanwhile gets its vmas from it.
        h.layout.insert(
            start,
            Vma {
                end,
                prot,
                accounted: false,
            },
        );
        let mut done: Vec<(u64, u64, u64)> = Vec::new();
        for (idx, s, e) in self.slices(start, end) {
            let (creator, quota) = (h.creator, h.memory_quota);
            let add = |m: &Self, h: &mut HomeProc| {
                m.to_replicas(h, idx, |who| M2M_VMA_ADD {
                    who,
                    start: s,
                    end: e,
                    prot,
                    creator,
                    quota,
                })
            };
            let mut r = self.ensure_owners(h, idx).and_then(|_| add(self, h));
            // Under strict overcommit a member out of memory to promise refuses: the vRegion
            // moves to an mComponent with room (memory attached since, say) and the range is
            // tried there.
            let out_of_memory = |r: &Result<(), Refusal>| matches!(r, Err(err) if err.code == ErrCode::NoMemory);
            if out_of_memory(&r) && self.charges_mappings() {
                for m in h.members(idx) {
                    if self.relocate(h, idx, &m, &[]).is_ok() {
                        r = add(self, h);
                        if !out_of_memory(&r) {
                            break;
                        }
                    }
                }
            }
            match r {
                Ok(()) => done.push((idx, s, e)),
                Err(err) => {
                    // Members that took this slice before another refused give it back too.
                    let _ = self.to_replicas(h, idx, |who| M2M_VMA_REMOVE { who, start: s, end: e });
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
                let remove = || M2M_VMA_REMOVE {
                    who: h.who(),
                    start: s,
                    end: e,
                };
                let removed = match owners.len() {
                    1 => self.to_only_copy(o, remove),
                    _ => self.to_owner(o, remove()),
                };
                match removed {
                    // Another member answers for the range; this one leaves the set.
                    Err(e) if unreachable(&e) && owners.iter().any(|x| x.id != o.id) => {
                        self.drop_replicas(h, &[o.id], Some(idx))
                    }
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
}
