//! The memory monitor (mComponent). For the processes it is home of, it handles every
//! virtual-memory call and keeps their vRegion array (which mComponent owns each 1 GiB vRegion)
//! and their address-space layout ([`home`]). For the vRegions it owns, it keeps a vma tree and
//! the virtual-to-physical map (here: page contents keyed by virtual page) and serves the
//! ExCache's fetches and flushes ([`owner`]).
//!
//! Memory is charged as Linux's overcommit modes do ([`Overcommit`], [`owner`]): in strict
//! mode when a mapping becomes writable (an mComponent out of memory fails the mmap, which the
//! program sees as ENOMEM, malloc returning NULL); in heuristic mode when pages are stored.
//!
//! In a logged cluster (`replication = "log"`) it is also the logger of some vRegions
//! ([`log`]): their write-backs go to a bounded log that it streams to an sComponent.
//!
//! It also holds the storage buffer cache of the files placed on it ([`bcache`]). This file is
//! the mComponent's dispatch table: which handler serves each message.
mod bcache;
mod home;
mod lease;
mod log;
mod netbuf;
mod owner;
mod pages;
mod peers;
mod quota;
mod room;
pub mod series;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use splitos_rpc::serving::Serving;
use splitos_rpc::*;

pub use peers::{Peers, RpcPeers};
use splitos_core::config::{McompConfig, MemArgs};
use splitos_metrics::counters;

use splitos_core::node::{self, Node};

const PAGE: u64 = PAGE_SIZE as u64;

/// Freed parity bytes worth a `malloc_trim` (it walks every arena).
const FREED_TO_TRIM: u64 = 1 << 20;
/// How often replica sets that a rebuild could not complete are tried again.
const REBUILD_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// How long an mComponent found unreachable is kept out of new replica sets.
const LOST_MEMORY: std::time::Duration = std::time::Duration::from_secs(30);

counters! {
    /// The mComponent's counters: keys of its statistics and the series
    /// `splitos_mcomp_<counter>_total`.
    pub struct Counters: "mcomp" {
        /// Pages fetched from this owner.
        fetches,
        /// Pages written back to this owner.
        flushes,
        /// Write-backs that came with a fetch, piggybacked on it.
        piggybacked,
        /// Requests refused for a process of another vNode or another pComponent, or a process
        /// id in use.
        denied,
        /// Requests refused for want of memory (the program sees ENOMEM).
        out_of_memory,
        /// Parity deltas applied as a striped set's parity member.
        parity_deltas_applied,
        /// Pages reconstructed from a striped set's parity for a fetch.
        reconstructed_pages,
        /// Pages replayed from the backup log when this mComponent was made a logged vRegion's
        /// primary.
        log_promoted_pages,
        /// Leases of a vRegion's pages granted for one-sided access.
        leases,
        /// Times a heap call needing a new vRegion's set found no global manager answering and
        /// waited to ask again (the only manager restarting).
        waits_for_managers,
    }
}

/// What the rebuilder thread does: everything that may wait on a home lock a rebuild holds,
/// so that neither the heartbeat nor a request waits on it.
enum Job {
    /// Bring the replica sets of this process back to the cluster's number of copies.
    Rebuild(u64),
    /// A heartbeat's answer from the global managers.
    Beat(G2X_BEAT),
    /// Ask this home to copy a vRegion whose backup log skipped write-backs to its logger again.
    Resync(Who, u64, ComponentRef),
}

pub struct Mem<P = RpcPeers> {
    /// The rest of the cluster, as this mComponent calls it.
    peers: P,
    capacity: u64,
    vregion_size: AtomicU64,
    /// What each vNode takes of `capacity`, and what is kept for vNodes' quotas.
    room: room::Room,
    /// Bytes of parity rows freed since the allocator last gave free memory back to the kernel.
    freed: AtomicU64,
    homes: Mutex<BTreeMap<u64, Arc<Mutex<home::HomeProc>>>>,
    /// Processes said to have ended that were not (yet) made here.
    ended: Mutex<home::Ended>,
    /// The mComponents the managers last said are lost: until fenced, they may still act on
    /// homes moved away since, and their copies of those are refused.
    declared_lost: Mutex<Vec<u32>>,
    /// Times this mComponent was fenced: a request held across one was sent to what it was.
    fences: AtomicU64,
    /// Home states this mComponent keeps as backup home, for taking over.
    backups: Mutex<BTreeMap<u64, HomeState>>,
    owned: Mutex<BTreeMap<u64, Arc<Mutex<owner::OwnerProc>>>>,
    replication: Mutex<Replication>,
    overcommit: Mutex<Overcommit>,
    /// The capacity of all live mComponents, as the global managers last said.
    cluster_memory: AtomicU64,
    /// Work for the rebuilder thread, which may hold a process's home lock for long.
    jobs: Mutex<std::sync::mpsc::Sender<Job>>,
    rebuilt_pages: AtomicU64,
    /// mComponents found unreachable lately: the global managers may still count them
    /// alive for a few heartbeats, and a replica placed there would be lost again.
    lost: Mutex<BTreeMap<u32, std::time::Instant>>,
    /// Members a pComponent of a process (by pid) could not reach while this home reached
    /// them, and when it said so: a vRegion moved off one goes to none of them, or it could
    /// move back and forth between two mComponents of a host parted from the pComponent.
    unreached: Mutex<BTreeMap<(u64, u32), std::time::Instant>>,
    last_retry: Mutex<std::time::Instant>,
    bcache: Arc<bcache::BufferCache<P>>,
    /// The log of the vRegions this mComponent is the logger of.
    backup_log: log::BackupLog,
    /// Leaf requests do not each have a thread of their own: a shared pool of workers serves
    /// them, or event loops do.
    shared_receivers: bool,
    /// Requests are received on event loops: one that waits for another component holds
    /// every connection of its loop.
    on_loops: bool,
    /// Socket buffers of the network's DMA path.
    netbufs: netbuf::NetBufs,
    /// vNodes' memory quotas, for the processes this mComponent is home of.
    quotas: quota::Ledger,
    /// Segments promised to lease holders (one-sided access).
    handouts: Arc<lease::Handouts>,
    /// Closed (true) once this mComponent leaves: file requests are refused `Moved` and go to
    /// another buffer cache. File requests hold it shared, so closing waits for those under way.
    files_closed: std::sync::RwLock<bool>,
    /// This mComponent being detached: what it held when that began, and its buffer cache
    /// written back.
    leaving: Mutex<Option<Leaving>>,
    /// Pages copied to other mComponents by vRegions moved off members (this home's work).
    moved_pages: AtomicU64,
    /// New homes of processes this leaving mComponent gave away, not yet told to their
    /// pComponents (by pComponent id).
    unannounced: Mutex<Vec<(u32, M2P_HOME_MOVED)>>,
    /// The mComponents leaving, as the managers' last heartbeat answer said: only they give
    /// homes away (`M2M_HOME_ADOPT`).
    leavers: Mutex<Vec<u32>>,
    /// Injected before serving each request (`serve_delay_us`).
    serve_delay: std::time::Duration,
    c: Counters,
}

/// A pComponent asked about a process another pComponent created ([`Mem::may_act`]).
#[derive(Debug, thiserror::Error)]
#[error("process {pid} runs on another pComponent")]
pub(crate) struct OtherPcomponent {
    pid: u64,
}

impl Refuse for OtherPcomponent {
    fn code(&self) -> ErrCode {
        ErrCode::Denied
    }
}

/// A file request to an mComponent that is leaving: the sender asks the global managers
/// where its files' cache went.
#[derive(Debug, thiserror::Error)]
#[error("mComponent {mcomp} is leaving: its buffer cache moved to another mComponent")]
struct CacheMoved {
    mcomp: u32,
}

impl Refuse for CacheMoved {
    fn code(&self) -> ErrCode {
        ErrCode::Moved
    }
}

/// This mComponent's own handler answered an owner request with another message than its reply.
#[derive(Debug, thiserror::Error)]
#[error("{request} answered with {reply}")]
struct WrongReply {
    request: &'static str,
    reply: &'static str,
}

impl Refuse for WrongReply {
    fn code(&self) -> ErrCode {
        ErrCode::Internal
    }
}

#[derive(Debug, thiserror::Error)]
#[error("a link probe of {bytes} bytes: at most {MAX_PROBE}")]
struct ProbeTooLarge {
    bytes: u32,
}

impl Refuse for ProbeTooLarge {
    fn code(&self) -> ErrCode {
        ErrCode::Invalid
    }
}

impl<P: Peers> Mem<P> {
    /// An mComponent as `args` say, reaching the cluster through `peers`; its rebuilder's work
    /// goes to `jobs`.
    fn new(peers: P, cfg: &McompConfig, jobs: std::sync::mpsc::Sender<Job>) -> Mem<P> {
        Mem {
            peers: peers.clone(),
            capacity: cfg.capacity.0,
            vregion_size: AtomicU64::new(1 << 30),
            room: room::Room::new(cfg.capacity.0),
            freed: AtomicU64::new(0),
            homes: Mutex::new(BTreeMap::new()),
            ended: Mutex::default(),
            declared_lost: Mutex::default(),
            fences: AtomicU64::new(0),
            backups: Mutex::new(BTreeMap::new()),
            owned: Mutex::new(BTreeMap::new()),
            replication: Mutex::new(Replication::None),
            overcommit: Mutex::new(Overcommit::Heuristic),
            cluster_memory: AtomicU64::new(0),
            jobs: Mutex::new(jobs),
            rebuilt_pages: AtomicU64::new(0),
            lost: Mutex::new(BTreeMap::new()),
            unreached: Mutex::new(BTreeMap::new()),
            last_retry: Mutex::new(std::time::Instant::now()),
            bcache: bcache::BufferCache::new(peers, cfg.bcache.0, cfg.readahead.0),
            backup_log: log::BackupLog::new(cfg.backup_log.0),
            shared_receivers: cfg.workers > 0 || cfg.serving.kind == Serving::Loops,
            on_loops: cfg.serving.kind == Serving::Loops,
            netbufs: netbuf::NetBufs::default(),
            quotas: quota::Ledger::default(),
            handouts: Arc::default(),
            files_closed: std::sync::RwLock::new(false),
            leaving: Mutex::new(None),
            moved_pages: AtomicU64::new(0),
            unannounced: Mutex::new(Vec::new()),
            leavers: Mutex::new(Vec::new()),
            serve_delay: std::time::Duration::from_micros(cfg.serve_delay_us),
            c: Counters::default(),
        }
    }

    fn me(&self) -> ComponentRef {
        ComponentRef {
            id: self.peers.id(),
            addr: self.peers.addr().to_string(),
        }
    }

    fn vrs(&self) -> u64 {
        self.vregion_size.load(Relaxed)
    }

    fn replication(&self) -> Replication {
        *self.replication.lock().unwrap()
    }

    /// Whether mappings are charged when made (strict overcommit) rather than pages when
    /// stored (heuristic).
    fn charges_mappings(&self) -> bool {
        *self.overcommit.lock().unwrap() == Overcommit::Strict
    }

    fn note_lost(&self, ids: &[u32]) {
        let mut l = self.lost.lock().unwrap();
        for id in ids {
            l.insert(*id, std::time::Instant::now());
        }
    }

    fn recently_lost(&self) -> Vec<u32> {
        let mut l = self.lost.lock().unwrap();
        l.retain(|_, at| at.elapsed() < LOST_MEMORY);
        l.keys().copied().collect()
    }

    fn queue(&self, job: Job) {
        let _ = self.jobs.lock().unwrap().send(job);
    }

    fn work(&self, job: Job) {
        match job {
            Job::Rebuild(pid) => self.rebuild(pid),
            Job::Beat(beat) => self.on_beat(beat),
            Job::Resync(who, index, home) => self.resync(who, index, home),
        }
    }

    /// Hands the memory of parity rows freed since the last heartbeat back to the kernel. Rows
    /// are small allocations spread over the allocator's per-thread arenas, which keep what is
    /// freed for later allocations: an mComponent would stay as large as its busiest moment
    /// while reporting nothing used. At most once a heartbeat, off every request's path.
    /// (Pages live in segments, whose memory goes back as they are freed.)
    fn give_back_freed(&self) {
        if self.freed.load(Relaxed) < FREED_TO_TRIM {
            return;
        }
        self.freed.store(0, Relaxed);
        // SAFETY: malloc_trim takes no pointers; it only returns the allocator's free memory.
        if unsafe { libc::malloc_trim(0) } != 0 {
            crate::series::MEMORY_TRIMS.increment(1);
        }
    }

    /// A heartbeat's answer, on the rebuilder thread (fencing was done on the heartbeat's).
    fn on_beat(&self, beat: G2X_BEAT) {
        // A fenced or departing component's answer says 0: the last figure stays the best
        // known (a pComponent answers changes a home would refuse only past half of it).
        if beat.memory > 0 {
            self.cluster_memory.store(beat.memory, Relaxed);
        }
        self.leave(&beat.leaving);
        if let Some(full) = beat.rebalance {
            self.rebalance_pass(full);
        }
        self.reclaim_lost(&beat.lost);
        self.netbufs_of_lost(&beat.lost);
        self.mcomps_lost(&beat.lost_mcomps);
        if !self.unannounced.lock().unwrap().is_empty() {
            self.announce_moves();
        }
        self.give_back_freed();
        // Sets a rebuild could not complete (no room then) are tried again, now and then.
        let mut last = self.last_retry.lock().unwrap();
        if last.elapsed() < REBUILD_RETRY {
            return;
        }
        *last = std::time::Instant::now();
        drop(last);
        let homes: Vec<(u64, Arc<Mutex<home::HomeProc>>)> = self
            .homes
            .lock()
            .unwrap()
            .iter()
            .map(|(p, h)| (*p, h.clone()))
            .collect();
        for (pid, h) in homes {
            if h.lock().unwrap().short_of(self.replication().members()) > 0 {
                self.rebuild(pid);
            }
        }
    }

    /// A file request, unless this mComponent left (its files' caches are elsewhere now).
    fn file_request<R>(&self, f: impl FnOnce() -> Result<R, Refusal>) -> Result<R, Refusal> {
        let closed = self.files_closed.read().unwrap();
        if *closed {
            return Err(CacheMoved { mcomp: self.peers.id() }.into());
        }
        f()
    }

    fn home_stats(&self) -> Vec<serde_json::Value> {
        let homes: Vec<Arc<Mutex<home::HomeProc>>> = self.homes.lock().unwrap().values().cloned().collect();
        homes
            .iter()
            .filter_map(|h| h.try_lock().ok().map(|g| g.stats()))
            .collect()
    }

    /// vRegions of the processes this mComponent is home of that have fewer copies than the
    /// cluster's replication asks (and at least one).
    fn short_vregions(&self) -> u64 {
        let copies = self.replication().members();
        let homes: Vec<Arc<Mutex<home::HomeProc>>> = self.homes.lock().unwrap().values().cloned().collect();
        // A process being rebuilt now counts as one short vRegion: its lock is the rebuild's.
        homes
            .iter()
            .map(|h| h.try_lock().map_or(1, |g| g.short_of(copies)))
            .sum()
    }

    fn load(&self) -> Load {
        Load {
            threads: 0,
            processes: self.homes.lock().unwrap().len() as u32,
            capacity: self.capacity,
            committed: self.room.taken(),
            used: self.room.used(),
        }
    }

    /// Refuses a request about process `pid` from a pComponent other than the one that created
    /// it (`creator`): a pComponent's credentials do not let it read or change the memory of
    /// programs it does not run. Other mComponents (forwarding their home's work) and the
    /// admin's tools may act on any process.
    fn may_act(&self, pid: u64, creator: Option<[u8; 32]>) -> Result<(), OtherPcomponent> {
        match splitos_rpc::current_peer() {
            Some(p) if p.role == Role::Proc && creator.is_some_and(|c| c != p.key) => {
                self.c.denied.fetch_add(1, Relaxed);
                static NOT_YOURS: splitos_rpc::refusals::Refusals = splitos_rpc::refusals::Refusals::new(
                    "refused a request about a process another pComponent created",
                );
                if NOT_YOURS.log_this(p) {
                    tracing::warn!(pid, peer = %p, "refused a request about a process another pComponent created");
                }
                Err(OtherPcomponent { pid })
            }
            _ => Ok(()),
        }
    }

    /// Sends an owner request to the vRegion's owner, through this mComponent's own dispatch
    /// table when that is us.
    fn to_owner<R: Request>(&self, owner: &ComponentRef, req: R) -> Result<R::Reply, Refusal> {
        if owner.id != self.peers.id() {
            return Ok(self.peers.call(&owner.addr, req)?);
        }
        let msg: Msg = req.into();
        let name = msg.name();
        match self.serve(msg) {
            Msg::ERR(e) => Err(e),
            m => R::Reply::try_from(m).map_err(|m| {
                WrongReply {
                    request: name,
                    reply: m.name(),
                }
                .into()
            }),
        }
    }

    fn stats_json(&self) -> String {
        // Not holding the map while locking each process: a fork locks a process, then the map.
        let owned: Vec<(u64, Arc<Mutex<owner::OwnerProc>>)> = self
            .owned
            .lock()
            .unwrap()
            .iter()
            .map(|(pid, p)| (*pid, p.clone()))
            .collect();
        let per_proc: Vec<_> = owned
            .iter()
            .map(|(pid, p)| {
                let g = p.lock().unwrap();
                let unprotected: Vec<u64> = g.logs.iter().filter(|(_, l)| !l.protects()).map(|(i, _)| *i).collect();
                serde_json::json!({"pid": pid, "vnode": g.vnode, "pages": g.pages.len(), "parity_rows": g.parity.len(), "logged_vregions": g.logs.len(), "unprotected_vregions": unprotected, "committed": g.committed})
            })
            .collect();
        let state = serde_json::json!({
            "role": "mcomponent", "id": self.peers.id(), "addr": self.peers.addr(),
            "capacity": self.capacity, "committed": self.room.committed(), "used": self.room.used(), "taken": self.room.taken(), "kept_for_vnodes": self.room.stats(),
            "home_of": self.homes.lock().unwrap().len(), "owned_processes": per_proc, "home_processes": self.home_stats(),
            "replication": self.replication().to_string(), "overcommit": self.overcommit.lock().unwrap().name(), "backup_of": self.backups.lock().unwrap().len(),
            "rebuild": {"short_vregions": self.short_vregions(), "copied_pages": self.rebuilt_pages.load(Relaxed)},
            "moved_pages": self.moved_pages.load(Relaxed), "leaving": self.leave_report(),
            "backup_log": self.backup_log.stats(), "buffer_cache": self.bcache.stats(), "socket_buffers": self.netbufs.stats(),
            "vnode_memory": self.quotas.stats(),
        });
        counters::json_with(self.c.counters().chain(self.handouts.stats.counters()), state).to_string()
    }

    /// Its counters and gauges, as they are at a scrape.
    fn render_metrics(&self, e: &mut splitos_metrics::Exposition) {
        self.c.render(e);
        self.handouts.stats.render(e);
        self.bcache.c.render(e);
        crate::series::COMMITTED_BYTES.set(self.room.committed() as f64);
        crate::series::USED_BYTES.set(self.room.used() as f64);
        crate::series::TAKEN_BYTES.set(self.room.taken() as f64);
        self.quotas.export();
    }

    fn shutdown(&self) -> Result<OK, Refusal> {
        self.bcache.write_back_all();
        node::exit_soon();
        Ok(OK)
    }
}

/// What other components send: held after a stop of this mComponent until the managers'
/// word, then served.
impl<P: Peers> Handler for Mem<P> {
    fn handle(&self, msg: Msg) -> Msg {
        let fences = self.fences.load(Relaxed);
        self.peers.after_stop();
        // A home's change held through a stop that ended in a fence would make this member
        // hold pages of a process whose sets have moved on without it (or that has ended),
        // and a creation or fork held so a home its pComponent gave up on: the sender hears
        // it lost it, as it would have had it arrived after the fence.
        let name = msg.name();
        let makes = name.starts_with("M2M_") || matches!(msg, Msg::P2M_PROC_CREATE(_) | Msg::P2M_FORK(_));
        if self.fences.load(Relaxed) != fences && makes {
            return Msg::ERR(ERR::new(
                ErrCode::NotFound,
                format!(
                    "mComponent {} was fenced while {name} waited: it holds nothing",
                    self.peers.id()
                ),
            ));
        }
        self.serve(msg)
    }

    /// A program's heap calls and its process's start, fork and exit: the home may call the
    /// owners of the range, but on a channel that serves its caller alone that blocks no one
    /// else, and a heap call is on the program's path.
    fn served_where_it_waits(&self, msg: &Msg) -> bool {
        matches!(
            msg,
            Msg::P2M_MMAP(_)
                | Msg::P2M_MUNMAP(_)
                | Msg::P2M_MPROTECT(_)
                | Msg::P2M_MREMAP(_)
                | Msg::P2M_DONTNEED(_)
                | Msg::P2M_PROC_CREATE(_)
                | Msg::P2M_FORK(_)
                | Msg::P2M_EXIT(_)
                | Msg::P2M_CREATE_UNDO(_)
        )
    }

    fn fans_out(&self, msg: &Msg) -> bool {
        // A write-back to a striped set waits on the parity member, which may be waiting on
        // this one (and a change of epoch on write-backs): with a shared worker pool or event
        // loops neither may hold a worker or a loop while it waits. With neither, each
        // connection's receiving thread serves its own requests, and the wait blocks no other.
        let forwards = matches!(
            msg,
            Msg::P2M_FLUSH(_)
                | Msg::P2M_FLUSH_MANY(_)
                | Msg::P2M_FLUSH_FETCH(_)
                | Msg::P2M_FLUSH_FETCH_MANY(_)
                | Msg::M2M_VMA_ADD(_)
                | Msg::M2M_VMA_REMOVE(_)
                | Msg::M2M_DISCARD(_)
                | Msg::M2M_PUT_PAGES(_)
                | Msg::M2M_EPOCH(_)
        );
        if forwards && self.shared_receivers && self.replication().data() > 0 {
            return true;
        }
        // A file request that misses the buffer cache waits on the sComponent's disk.
        if self.on_loops
            && matches!(
                msg,
                Msg::P2M_FILE_READ(_) | Msg::P2M_FILE_WRITE(_) | Msg::P2M_FILE_STAT(_) | Msg::P2M_FILE_FORGET(_)
            )
        {
            return true;
        }
        self.served_where_it_waits(msg)
            || matches!(
                msg,
                Msg::P2M_VREGIONS(_)
                | Msg::P2M_REPLICA_LOST(_)
                | Msg::P2M_OWNER_FULL(_)
                | Msg::P2M_HOME_TAKEOVER(_)
                | Msg::M2M_HOME_ADOPT(_)
                | Msg::P2M_RECONSTRUCT(_)
                | Msg::M2M_LOG_RESYNC(_)
                // Waits on the sComponent's disk: not on a receiving thread. Reads and writes stay
                // there: on two cores a hand-off to a pool thread costs more than a cache hit, and
                // page faults use their own connections, so only this pComponent's other control
                // requests queue behind a read that misses.
                | Msg::P2M_FILE_SETSIZE(_)
                | Msg::P2M_FILE_SYNC(_)
            )
    }
}

/// The mComponent's dispatch table: home calls in [`home`], owner and data-path requests in
/// [`owner`], file requests in [`bcache`].
impl<P: Peers> Mem<P> {
    /// Serves `msg`, from another component or from this one as an owner of its own
    /// processes' pages ([`Mem::to_owner`]: already past the wait its request made, and
    /// holding a home's lock that the managers' word may need).
    fn serve(&self, msg: Msg) -> Msg {
        let name = msg.name();
        crate::series::REQUESTS.with([name]).increment(1);
        if !self.serve_delay.is_zero() {
            std::thread::sleep(self.serve_delay);
        }
        let bc = &self.bcache;
        let reply = match msg {
            Msg::P2M_PROC_CREATE(r) => on(r, |r| self.proc_create(r)),
            Msg::P2M_MMAP(r) => on(r, |r| self.mmap(r)),
            Msg::P2M_MUNMAP(r) => on(r, |r| self.munmap(r)),
            Msg::P2M_MPROTECT(r) => on(r, |r| self.mprotect(r)),
            Msg::P2M_MREMAP(r) => on(r, |r| self.mremap(r)),
            Msg::P2M_DONTNEED(r) => on(r, |r| self.dontneed(r)),
            Msg::P2M_FORK(r) => on(r, |r| self.home_fork(r)),
            Msg::P2M_EXIT(r) => on(r, |r| self.home_exit(r)),
            Msg::P2M_CREATE_UNDO(r) => on(r, |r| self.create_undo(r)),
            Msg::P2M_VREGIONS(r) => on(r, |r| self.vregions(r)),
            Msg::P2M_REPLICA_LOST(r) => on(r, |r| self.replica_lost(r)),
            Msg::P2M_OWNER_FULL(r) => on(r, |r| self.owner_full(r)),
            Msg::P2M_HOME_TAKEOVER(r) => on(r, |r| self.home_takeover(r)),
            Msg::P2M_FETCH(r) => on(r, |r| self.fetch(r)),
            Msg::P2M_PROBE_LINK(r) => on(r, |r| match r.bytes {
                b if b > MAX_PROBE => Err(ProbeTooLarge { bytes: b }.into()),
                b => Ok(M2P_PROBED {
                    payload: serde_bytes::ByteBuf::from(vec![0; b as usize]),
                }),
            }),
            Msg::C2M_DEBUG_FLIP(r) => on(r, |r| self.debug_flip(r)),
            Msg::P2M_FLUSH(r) => on(r, |r| self.flush(r)),
            Msg::P2M_FLUSH_FETCH(r) => on(r, |r| self.flush_fetch(r)),
            Msg::P2M_FETCH_MANY(r) => on(r, |r| self.fetch_many(r)),
            Msg::P2M_FLUSH_MANY(r) => on(r, |r| self.flush_many(r)),
            Msg::P2M_FLUSH_FETCH_MANY(r) => on(r, |r| self.flush_fetch_many(r)),
            Msg::P2M_LEASE(r) => on(r, |r| self.lease(r)),
            Msg::M2M_VMA_ADD(r) => on(r, |r| self.vma_add(r)),
            Msg::M2M_VMA_REMOVE(r) => on(r, |r| self.vma_remove(r)),
            Msg::M2M_EPOCH(r) => on(r, |r| self.set_epoch(r)),
            Msg::M2M_SET(r) => on(r, |r| self.member_set(r)),
            Msg::M2M_PARITY(r) => on(r, |r| self.parity(r)),
            Msg::M2M_LOG_RESYNC(r) => on(r, |r| self.log_resync(r)),
            Msg::P2M_RECONSTRUCT(r) => on(r, |r| self.reconstruct(r)),
            Msg::M2M_READ_PAGES(r) => on(r, |r| self.read_pages(r)),
            Msg::M2M_HOME_OF(r) => on(r, |r| self.home_of(r)),
            Msg::M2M_HOME_SYNC(r) => on(r, |r| self.home_sync(r)),
            Msg::M2M_HOME_DROP(r) => on(r, |r| self.home_drop(r)),
            Msg::M2M_HOME_ADOPT(r) => on(r, |r| self.home_adopt(r)),
            Msg::M2M_VMA_PROTECT(r) => on(r, |r| self.vma_protect(r)),
            Msg::M2M_DISCARD(r) => on(r, |r| self.discard(r)),
            Msg::M2M_PUT_PAGES(r) => on(r, |r| self.put_pages(r)),
            Msg::M2M_FORK(r) => on(r, |r| self.owner_fork(r)),
            Msg::M2M_EXIT(r) => on(r, |r| self.owner_exit(r)),
            Msg::P2M_FILE_READ(r) => on(r, |r| self.file_request(|| bc.file_read(r))),
            Msg::P2M_FILE_WRITE(r) => on(r, |r| self.file_request(|| bc.file_write(r))),
            Msg::P2M_FILE_SETSIZE(r) => on(r, |r| self.file_request(|| bc.file_setsize(r))),
            Msg::P2M_FILE_SYNC(r) => on(r, |r| self.file_request(|| bc.file_sync(r))),
            Msg::P2M_FILE_STAT(r) => on(r, |r| self.file_request(|| bc.file_stat(r))),
            Msg::P2M_FILE_FORGET(r) => on(r, |r| self.file_request(|| bc.file_forget(r))),
            Msg::P2M_NETBUF_ALLOC(r) => on(r, |r| self.netbuf_alloc(r)),
            Msg::P2M_NETBUF_FREE(r) => on(r, |r| self.netbuf_free(r)),
            Msg::P2M_NETBUF_WRITE(r) => on(r, |r| self.netbuf_write(r.buf, None, r.offset, &r.data)),
            Msg::N2M_NETBUF_WRITE(r) => on(r, |r| self.netbuf_write(r.buf, Some(r.owner), r.offset, &r.data)),
            Msg::P2M_NETBUF_READ(r) => on(r, |r| {
                Ok(M2P_NETBUF_DATA {
                    data: self.netbuf_read(r.buf, None, r.offset, r.len)?,
                })
            }),
            Msg::N2M_NETBUF_READ(r) => on(r, |r| {
                Ok(M2N_NETBUF_DATA {
                    data: self.netbuf_read(r.buf, Some(r.owner), r.offset, r.len)?,
                })
            }),
            Msg::C2X_PING(r) => on(r, |_| {
                Ok(X2C_PONG {
                    role: Role::Mem,
                    id: self.peers.id(),
                })
            }),
            Msg::C2X_STATS(r) => on(r, |_| {
                Ok(X2C_STATS {
                    json: self.stats_json(),
                })
            }),
            Msg::G2X_STATS(r) => on(r, |_| {
                Ok(X2G_STATS {
                    json: self.stats_json(),
                })
            }),
            Msg::C2X_METRICS(r) => on(r, |_| {
                Ok(X2C_METRICS {
                    text: splitos_core::telemetry::render(),
                })
            }),
            Msg::G2X_METRICS(r) => on(r, |_| {
                Ok(X2G_METRICS {
                    text: splitos_core::telemetry::render(),
                })
            }),
            Msg::C2X_SHUTDOWN(r) => on(r, |_| self.shutdown()),
            other => Msg::ERR(
                Unhandled {
                    by: "an mComponent does",
                    msg: other.name(),
                }
                .into(),
            ),
        };
        if let Msg::ERR(e) = &reply {
            tracing::debug!(request = name, code = ?e.code, msg = %e.msg, "request refused");
        }
        reply
    }
}

pub fn run(args: MemArgs) -> anyhow::Result<()> {
    let stop = node::block_stop_signals();
    let cfg = &args.mcomp;
    cfg.validate().map_err(|e| anyhow::anyhow!(e))?;
    let (node, endpoint) = Node::bind(Role::Mem, &args.node.gm, &cfg.listen, &args.node.process)?;
    let (jobs_tx, jobs_rx) = std::sync::mpsc::channel::<Job>();
    let mem = Arc::new(Mem::new(RpcPeers(node.clone()), cfg, jobs_tx));
    let m = mem.clone();
    splitos_core::telemetry::on_render(move |e| m.render_metrics(e));
    let m3 = mem.clone();
    // Buffered file writes reach the sComponent before an orderly stop.
    stop.on_stop(move || m3.bcache.write_back_all());
    if let Some(path) = node.rpc.transport().pages_socket(&node.addr) {
        // One-sided access only speeds things up: without its socket every access is a message.
        if let Err(e) = mem.handouts.clone().serve(path) {
            tracing::warn!(error = %e, "cannot serve one-sided access: the pages of this host's processes go by message");
        }
    }
    endpoint.serve(
        mem.clone(),
        ServerConfig {
            name: "mcomp".into(),
            workers: cfg.workers,
            fanout_workers: 2,
            serving: cfg.serving.clone(),
        },
    );
    node.standby.store(cfg.standby, Relaxed);
    let reg = node
        .register(None, mem.load())
        .map_err(|e| anyhow::anyhow!("cannot register with the global managers at {}: {e}", args.node.gm))?;
    // A new start holds nothing: a fence it is given (it was declared lost before this
    // start) is acted on already.
    node.acted_on_fence(reg.fence);
    mem.vregion_size.store(reg.vregion_size, Relaxed);
    *mem.replication.lock().unwrap() = reg.replication;
    *mem.overcommit.lock().unwrap() = reg.overcommit;
    let m2 = mem.clone();
    let m3 = mem.clone();
    let node2 = node.clone();
    node.clone().heartbeat_forever(
        None,
        move || m2.load(),
        move |beat| {
            if beat.exit {
                m3.bcache.write_back_all();
                tracing::info!("detached: this mComponent holds nothing any more and exits");
                std::process::exit(0);
            }
            // At once, not behind a rebuild: until then this mComponent serves what may be old,
            // and other vNodes may take what is to be kept.
            m3.room.keep_homes(&beat.keep);
            if beat.fence != 0 {
                m3.fence();
            } else {
                m3.queue(Job::Beat(beat));
            }
            node2.set_leaving(m3.leave_report());
        },
    );
    let m4 = mem.clone();
    std::thread::Builder::new()
        .name("rebuild".into())
        .spawn(move || {
            while let Ok(job) = jobs_rx.recv() {
                m4.work(job);
            }
        })
        .expect("spawn the rebuilder");
    let m5 = mem.clone();
    std::thread::Builder::new()
        .name("log-stream".into())
        .spawn(move || m5.stream_logs())
        .expect("spawn the log streamer");
    tracing::info!(addr = %node.addr, transport = node.rpc.transport().name(), id = node.id(), role = "mcomponent", metrics = ?node.metrics, replication = %reg.replication, overcommit = reg.overcommit.name(), capacity = cfg.capacity.0, buffer_cache = cfg.bcache.0, readahead = cfg.readahead.0, backup_log = cfg.backup_log.0, workers = cfg.workers, serving = %cfg.serving.kind, "splitos memory monitor started");
    node::announce_ready(args.node.process.ready_file.as_deref(), &node.addr);
    splitos_core::node::park_forever()
}
