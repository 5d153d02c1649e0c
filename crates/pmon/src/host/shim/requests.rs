//! A program's requests on its socket once it runs: its virtual-memory calls, most forwarded to
//! its home mComponent, and a fork's preparation.
use std::sync::atomic::{AtomicBool, AtomicU64};

use splitos_rpc::Overcommit;

use super::*;

/// A heap call's part at the home that the program need not wait for: the home is told after
/// the program has its answer and before its next request is read, so the home still sees
/// the program's calls in their order, and the program's fault path goes by the local
/// layout, already changed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Posted {
    Munmap { addr: u64, len: u64 },
    Mprotect { addr: u64, len: u64, prot: u32 },
}

/// What a home may refuse that this pComponent can tell beforehand: strict overcommit
/// (learnt when registering) refuses writable memory past the owners' room, heuristic
/// overcommit a writable range larger than all the cluster's memory (told in heartbeats);
/// a vNode's memory quota is the process's own.
#[derive(Default)]
pub(crate) struct HomeRefusals {
    strict: AtomicBool,
    /// The capacity of all live mComponents; 0 until the managers have said.
    memory: AtomicU64,
}

impl HomeRefusals {
    pub(crate) fn set_overcommit(&self, o: Overcommit) {
        self.strict.store(o == Overcommit::Strict, Relaxed);
    }

    pub(crate) fn strict(&self) -> bool {
        self.strict.load(Relaxed)
    }

    pub(crate) fn set_memory(&self, bytes: u64) {
        self.memory.store(bytes, Relaxed);
    }

    /// What this pComponent knows, for its statistics.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::json!({"strict_overcommit": self.strict.load(Relaxed), "cluster_memory": self.memory.load(Relaxed)})
    }

    /// Whether a home could refuse to make `len` bytes `writable` (or not), `more` of them
    /// newly, for a process under `quota`. Half the cluster's memory leaves room for the
    /// mComponents lost or detached since the last heartbeat.
    fn may_refuse(&self, len: u64, writable: bool, more: u64, quota: Option<u64>) -> bool {
        if !writable {
            return false;
        }
        let memory = self.memory.load(Relaxed);
        memory == 0 || len > memory / 2 || (more > 0 && (quota.is_some() || self.strict.load(Relaxed)))
    }
}

impl Pcomp {
    /// A virtual-memory call to the process's home mComponent; a refusal is the errno the
    /// program sees.
    pub(super) fn home_call<R: Request + Clone>(&self, p: &Proc, req: R) -> Result<R::Reply, i64> {
        let mut res = p.memory.call_home(&self.node, req.clone()).map_err(Refusal::from);
        // What the vNode's ended processes held may be what was missing (see `ending`).
        if matches!(&res, Err(e) if e.code == ErrCode::NoMemory) && self.release_ended(&p.memory.who.vnode, p.pid) {
            res = p.memory.call_home(&self.node, req).map_err(Refusal::from);
        }
        res.map_err(|e| {
            static REFUSED: Refusals = Refusals::new("the home mComponent refused a memory call");
            if e.code != ErrCode::NoMemory && REFUSED.log_this(format_args!("uid {}", p.uid)) {
                tracing::warn!(pid = p.pid, error = %e, "the home mComponent refused a memory call");
            }
            vm_errno(&e)
        })
    }

    pub(super) fn count_local(&self, p: &Proc) {
        for s in [&p.heap.stats, self.miss.total()] {
            s.heap_calls_local.fetch_add(1, Relaxed);
        }
    }

    /// Counted before the reply: whoever reads the counters after the program's call sees it.
    fn count_posted(&self, p: &Proc) {
        for s in [&p.heap.stats, self.miss.total()] {
            s.heap_calls_posted.fetch_add(1, Relaxed);
        }
    }

    fn send_posted(&self, p: &Proc, posted: Posted) -> Result<(), i64> {
        let who = p.memory.who.clone();
        match posted {
            Posted::Munmap { addr, len } => {
                // Kept ranges first: unmapped at the home with the rest, one left kept would
                // later be handed out as mapped there.
                self.release_kept(p, addr, addr + len)?;
                self.home_call(p, P2M_MUNMAP { who, addr, len }).map(drop)
            }
            Posted::Mprotect { addr, len, prot } => self.home_call(p, P2M_MPROTECT { who, addr, len, prot }).map(drop),
        }
    }

    /// Tells the home a call the program already has its answer to. One that fails (a
    /// component lost on the way) is owed: tried again before the program's next call that
    /// depends on the home's layout.
    pub(super) fn post(&self, p: &Proc, posted: Posted) {
        if let Err(errno) = self.send_posted(p, posted) {
            for s in [&p.heap.stats, self.miss.total()] {
                s.heap_calls_posted_refused.fetch_add(1, Relaxed);
            }
            static POSTED: Refusals = Refusals::new("the home refused a heap call its program had been answered");
            if POSTED.log_this(format_args!("uid {}", p.uid)) {
                tracing::warn!(pid = p.pid, call = ?posted, errno, "the home refused a heap call its program had been answered; it is tried again before the next");
            }
            p.owed.lock().unwrap().push(posted);
        }
    }

    /// Sends the posted calls the home did not take, in their order; while one still fails,
    /// the program's call waiting on them fails with its errno: the home's layout (what a
    /// fork copies, where an mremap grows) must be the program's before it is used.
    fn pay_owed(&self, p: &Proc) -> Result<(), i64> {
        let mut owed = p.owed.lock().unwrap();
        while let Some(&first) = owed.first() {
            self.send_posted(p, first)?;
            owed.remove(0);
        }
        Ok(())
    }

    /// Unmaps at the home the kept ranges (see [`HeapReuse`]) that overlap [start, end): the
    /// home must see the layout the program sees before anything depends on it there.
    pub(super) fn release_kept(&self, p: &Proc, start: u64, end: u64) -> Result<(), i64> {
        let mut kept = p.reuse.lock().unwrap();
        while let Some((s, len, prot)) = kept.take_overlapping(start, end) {
            if let Err(e) = self.home_call(
                p,
                P2M_MUNMAP {
                    who: p.memory.who.clone(),
                    addr: s,
                    len,
                },
            ) {
                kept.put_back(s, len, prot);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Answers request `r`; what the home is to be told after the answer goes to `posted`.
    pub(super) fn request(&self, p: &Arc<Proc>, r: &ShimReq, posted: &mut Option<Posted>) -> Result<(u64, u64), i64> {
        // The shim sends only ranges in the heap region; anything else (an end past the end of
        // the address space included) is refused before it reaches the miss path.
        let within =
            |a: u64, len: u64| a >= p.heap_range.start && a.checked_add(len).is_some_and(|e| e <= p.heap_range.end);
        let valid = match Op::from_u32(r.op) {
            // The shim sends whole pages (it refuses an unaligned address, rounds the length up).
            Some(Op::Munmap) => r.b > 0 && r.a.is_multiple_of(PAGE) && r.b.is_multiple_of(PAGE) && within(r.a, r.b),
            Some(Op::Mprotect | Op::Dontneed) => within(r.a, r.b),
            Some(Op::Mmap) => r.b > 0 && (r.d & MMAP_FIXED == 0 || within(r.a, r.b)),
            Some(Op::Mremap) => r.b > 0 && r.c > 0 && within(r.a, r.b) && (r.d & MREMAP_FIXED == 0 || within(r.e, r.c)),
            _ => true,
        };
        if !valid {
            static OUTSIDE: Refusals = Refusals::new("refused a memory call outside the heap region");
            if OUTSIDE.log_this(format_args!("uid {}", p.uid)) {
                tracing::warn!(
                    pid = p.pid,
                    op = r.op,
                    addr = r.a,
                    len = r.b,
                    "refused a memory call outside the heap region"
                );
            }
            return Err(libc::EINVAL as i64);
        }
        if !matches!(Op::from_u32(r.op), Some(Op::ForkAbort | Op::RunStats) | None) {
            self.pay_owed(p)?;
        }
        let who = p.memory.who.clone();
        let t = &p.heap;
        let pages = |a: u64, len: u64| (a / PAGE, (a + len).div_ceil(PAGE));
        match Op::from_u32(r.op) {
            Some(Op::Mmap) => {
                let fixed = r.d & MMAP_FIXED != 0;
                let noreserve = r.d & MMAP_NORESERVE != 0;
                let prot = r.c as u32;
                // A hint is followed where the program insists (fixed, MAP_FIXED_NOREPLACE) or
                // where it costs nothing: inside the process's vRegions. V8 gives a random one
                // anywhere with each of its 508 KiB mappings, and following each would have
                // the home place a vRegion for it.
                let hint = if fixed
                    || r.d & MMAP_AT_HINT != 0
                    || (p.heap_range.contains(&r.a) && self.store.in_active_vregions(&p.memory, r.a, r.b))
                {
                    r.a
                } else {
                    0
                };
                if hint == 0 {
                    let reused = p.reuse.lock().unwrap().take(r.b, prot);
                    if let Some(addr) = reused {
                        self.miss.set_prot(p.pid, addr, addr + r.b, Some(prot));
                        self.count_local(p);
                        return Ok((addr, prot as u64));
                    }
                    let chunk = p.reuse.lock().unwrap().chunk_for(r.b);
                    if let Some(chunk) = chunk {
                        // A full home falls through to asking for the exact size.
                        if let Ok(m) = self.home_call(
                            p,
                            P2M_MMAP {
                                who: who.clone(),
                                hint: 0,
                                len: chunk,
                                prot,
                                fixed: false,
                                noreserve,
                            },
                        ) {
                            p.memory.learn(&m.owners, m.epoch, m.backup.clone());
                            let (rest, rest_len) = (m.addr + r.b, chunk - r.b);
                            if !p.reuse.lock().unwrap().keep(rest, rest_len, m.prot) {
                                self.home_call(
                                    p,
                                    P2M_MUNMAP {
                                        who: who.clone(),
                                        addr: rest,
                                        len: rest_len,
                                    },
                                )?;
                            }
                            self.miss.set_prot(p.pid, m.addr, m.addr + r.b, Some(m.prot));
                            return Ok((m.addr, m.prot as u64));
                        }
                    }
                } else {
                    // A hint or a fixed address the program sees free must be free at the home.
                    self.release_kept(p, r.a, r.a.saturating_add(r.b))?;
                }
                if fixed {
                    let (f, e) = pages(r.a, r.b);
                    self.miss.discard_range(t, f, e);
                }
                let call = || {
                    self.home_call(
                        p,
                        P2M_MMAP {
                            who: who.clone(),
                            hint,
                            len: r.b,
                            prot,
                            fixed,
                            noreserve,
                        },
                    )
                };
                let m = match call() {
                    // What the home keeps mapped for reuse is accounted at the owners: give it back.
                    Err(e) if e == libc::ENOMEM as i64 && p.reuse.lock().unwrap().overlaps(0, u64::MAX) => {
                        self.release_kept(p, 0, u64::MAX)?;
                        call()?
                    }
                    m => m?,
                };
                p.memory.learn(&m.owners, m.epoch, m.backup.clone());
                self.miss.set_prot(p.pid, m.addr, m.addr + r.b, Some(m.prot));
                Ok((m.addr, m.prot as u64))
            }
            Some(Op::Munmap) => {
                let (f, e) = pages(r.a, r.b);
                let end = r.a.saturating_add(r.b);
                let prot = self.miss.prot_of(p.pid, r.a, end);
                // A mapping none of whose pages ever left this pComponent stays mapped at the home,
                // to be handed out again by a later mmap of its size.
                let stored = self.miss.discard_range(t, f, e);
                if let Some(prot) = prot.filter(|_| !stored) {
                    if p.reuse.lock().unwrap().keep(r.a, r.b, prot) {
                        self.miss.set_prot(p.pid, r.a, end, None);
                        self.count_local(p);
                        return Ok((0, 0));
                    }
                }
                self.miss.set_prot(p.pid, r.a, end, None);
                // The home refuses no aligned unmap in the heap region.
                self.count_posted(p);
                *posted = Some(Posted::Munmap { addr: r.a, len: r.b });
                Ok((0, 0))
            }
            Some(Op::Mprotect) => {
                if p.reuse.lock().unwrap().overlaps(r.a, r.a.saturating_add(r.b)) {
                    // Part of the range is unmapped, as far as the program knows.
                    return Err(libc::ENOMEM as i64);
                }
                let (end, prot) = (r.a + r.b, r.c as u32);
                // Answered here when the home could not refuse it: a range the layout maps
                // whole (else ENOMEM), aligned, and nothing the overcommit or a quota stops.
                let sure = r.a.is_multiple_of(PAGE)
                    && r.b.is_multiple_of(PAGE)
                    && r.b > 0
                    && self.miss.writable_in(p.pid, r.a, end).is_some_and(|w| {
                        !self
                            .refusals
                            .may_refuse(r.b, prot & libc::PROT_WRITE as u32 != 0, r.b - w, p.memory_quota)
                    });
                if sure {
                    self.miss.set_prot(p.pid, r.a, end, Some(prot));
                    self.count_posted(p);
                    *posted = Some(Posted::Mprotect {
                        addr: r.a,
                        len: r.b,
                        prot,
                    });
                    return Ok((0, 0));
                }
                self.home_call(
                    p,
                    P2M_MPROTECT {
                        who,
                        addr: r.a,
                        len: r.b,
                        prot: r.c as u32,
                    },
                )?;
                self.miss.set_prot(p.pid, r.a, r.a + r.b, Some(r.c as u32));
                Ok((0, 0))
            }
            Some(Op::Dontneed) => {
                let (f, e) = pages(r.a, r.b);
                // Owners hold only pages that were written back: a range of lines that never
                // left this pComponent (an allocator purging fresh memory) is answered here.
                if self.miss.discard_range(t, f, e) {
                    self.home_call(
                        p,
                        P2M_DONTNEED {
                            who,
                            addr: r.a,
                            len: r.b,
                        },
                    )?;
                } else {
                    self.count_local(p);
                }
                Ok((0, 0))
            }
            Some(Op::Mremap) => {
                // Growing in place needs the home to see the program's free space as free.
                self.release_kept(p, 0, u64::MAX)?;
                let (f, e) = pages(r.a, r.b);
                self.miss.evict_range(t, f, e).map_err(|e| vm_errno(&e))?;
                let fixed_to = (r.d & MREMAP_FIXED != 0).then_some(r.e);
                if let Some(to) = fixed_to {
                    // Whatever was mapped at the destination is replaced, as by munmap.
                    let (tf, te) = pages(to, r.c);
                    self.miss.discard_range(t, tf, te);
                }
                let m = self.home_call(
                    p,
                    P2M_MREMAP {
                        who,
                        old: r.a,
                        old_len: r.b,
                        new_len: r.c,
                        may_move: r.d & MREMAP_MAYMOVE != 0,
                        fixed_to,
                    },
                )?;
                p.memory.learn(&m.owners, m.epoch, m.backup.clone());
                self.miss.shift_materialized(p.pid, r.a, r.b, r.c, m.addr);
                if m.addr == r.a && r.c <= r.b {
                    // Shrunk in place: the areas kept keep their protections, as at the home.
                    self.miss.set_prot(p.pid, r.a + r.c, r.a + r.b, None);
                } else {
                    self.miss.set_prot(p.pid, r.a, r.a + r.b, None);
                    self.miss.set_prot(p.pid, m.addr, m.addr + r.c, Some(m.prot));
                }
                Ok((m.addr, m.prot as u64))
            }
            Some(Op::ForkPrepare) => self.fork_prepare(p).map(|t| (t, 0)).map_err(|(errno, why)| {
                static REFUSED: Refusals = Refusals::new("refused a fork");
                if REFUSED.log_this(format_args!("uid {}", p.uid)) {
                    tracing::warn!(pid = p.pid, errno, "refused a fork: {why}");
                }
                errno
            }),
            Some(Op::ForkAbort) => {
                let mine = {
                    let mut pending = self.pending.lock().unwrap();
                    match pending.get(&r.a) {
                        Some(c) if c.parent == p.pid => pending.remove(&r.a),
                        _ => None,
                    }
                };
                if let Some(c) = mine {
                    static FAILED: Refusals = Refusals::new("a fork the pComponent had prepared failed in the kernel");
                    if FAILED.log_this(format_args!("uid {}", p.uid)) {
                        tracing::warn!(
                            pid = p.pid,
                            errno = r.b,
                            "a fork the pComponent had prepared failed in the kernel"
                        );
                    }
                    let _ = c.memory.call_home(
                        &self.node,
                        P2M_EXIT {
                            who: c.memory.who.clone(),
                        },
                    );
                }
                Ok((0, 0))
            }
            Some(Op::RunStats) | None => {
                static UNKNOWN: Refusals = Refusals::new("refused a request programs do not make");
                if UNKNOWN.log_this(format_args!("uid {}", p.uid)) {
                    tracing::warn!(pid = p.pid, op = r.op, "refused a request programs do not make");
                }
                Err(libc::ENOSYS as i64)
            }
        }
    }

    /// Writes back the parent's dirty lines, has the home copy the address space for the
    /// child, and parks the child's state until its hello.
    /// Refused with an errno, as fork(2) says, and why.
    pub(super) fn fork_prepare(&self, p: &Arc<Proc>) -> Result<u64, (i64, String)> {
        // The child's program slot is taken here, not at its hello: forks in a row (or of
        // many processes at once) would otherwise all pass before their children said hello,
        // and the children over the cap would be refused after fork(2) had succeeded.
        let Some(program) = take_slot(&self.programs, p.uid, p.uid) else {
            // As fork(2) says when a user may not have more.
            return Err((
                libc::EAGAIN as i64,
                "the user runs as many programs here as they may".into(),
            ));
        };
        if self
            .pending
            .lock()
            .unwrap()
            .values()
            .filter(|c| c.parent == p.pid)
            .count()
            >= PENDING_PER_PARENT
        {
            return Err((
                libc::EAGAIN as i64,
                format!("{PENDING_PER_PARENT} children of this process have not started yet"),
            ));
        }
        // The child's layout is the home's: it must not map what the parent unmapped.
        self.release_kept(p, 0, u64::MAX)
            .map_err(|errno| (errno, "the home did not take back ranges kept for reuse".into()))?;
        self.miss.write_back_range(&p.heap, 0, u64::MAX / PAGE).map_err(|e| {
            (
                libc::ENOMEM as i64,
                format!("writing back the parent's dirty lines failed: {e}"),
            )
        })?;
        let child = crate::new_pid();
        let forked = self
            .home_call(
                p,
                P2M_FORK {
                    parent: p.memory.who.clone(),
                    child,
                },
            )
            .map_err(|errno| {
                (
                    errno,
                    format!("the home did not copy the address space (errno {errno})"),
                )
            })?;
        let memory = Arc::new(ProcMemory::new(
            Who::new(p.memory.who.vnode.clone(), child),
            p.memory.home(),
            forked.backup.clone(),
        ));
        memory.learn(&forked.owners, forked.epoch, forked.backup.clone());
        let materialized = self.miss.materialized_of(p.pid);
        self.pending.lock().unwrap().insert(
            child,
            PendingChild {
                memory,
                memory_quota: p.memory_quota,
                run: p.heap.stats.clone(),
                interleave: self.miss.job_interleave(p.pid),
                vmas: forked.vmas,
                materialized,
                uid: p.uid,
                parent: p.pid,
                since: std::time::Instant::now(),
                program,
            },
        );
        Ok(child)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_write_access_added_under_a_quota_strict_overcommit_or_unknown_memory_may_be_refused() {
        let r = HomeRefusals::default();
        assert!(!r.may_refuse(1 << 40, false, 0, Some(1)), "taking write access away");
        assert!(
            r.may_refuse(4096, true, 4096, None),
            "the cluster's memory not known yet"
        );
        r.set_memory(1 << 30);
        assert!(!r.may_refuse(4096, true, 4096, None));
        assert!(r.may_refuse(4096, true, 4096, Some(1 << 20)), "under a quota");
        assert!(
            !r.may_refuse(4096, true, 0, Some(1 << 20)),
            "already writable, under a quota"
        );
        assert!(
            r.may_refuse((1 << 29) + 4096, true, 0, None),
            "more than half the cluster's memory"
        );
        r.set_overcommit(Overcommit::Strict);
        assert!(r.may_refuse(4096, true, 4096, None), "strict overcommit");
        assert!(
            !r.may_refuse(4096, true, 0, None),
            "already writable, strict overcommit"
        );
    }
}
