//! The ExCache miss path and the write-back paths.
//!
//! A miss: claim a way in the line's set (evicting the policy's victim: a clean victim is
//! dropped, a dirty one is write-protected, copied and flushed), fetch the line from its
//! vRegion owner (in the same RPC as the flush when both go to one mComponent: piggyback),
//! or zero-fill it locally if it never left this pComponent (a p-local line), then install it.
//! Lines installed for a read are write-protected, so the first write traps and marks them dirty.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use serde_bytes::ByteBuf;
use splitos_rpc::{ComponentRef, Msg, RpcError, PAGE_SIZE};
use splitos_shim_abi::uffd::{PAGEFAULT_FLAG_WP, PAGEFAULT_FLAG_WRITE};

use super::uffd::{self, Install, PAGE};
use super::{excache::LineState, Pcomp, Proc};

/// A dirty page on its way to its owner.
pub struct Writeback {
    pub proc: Arc<Proc>,
    pub vpn: u64,
    pub data: Vec<u8>,
}

/// One of a process's fault workers: each polls the process's uffd and serves the faults it
/// reads itself, so a miss crosses no thread boundary inside the pComponent. Several workers
/// serve several faulting threads of the program at once.
pub fn worker(p: Arc<Pcomp>, proc_: Arc<Proc>) {
    let wait = match uffd::FaultWait::new(&proc_.uffd, &proc_.stop) {
        Ok(w) => w,
        Err(e) => {
            p.fail_process(&proc_, format!("cannot wait for page faults: {e}"));
            return;
        }
    };
    let mut faults = Vec::with_capacity(16);
    while proc_.alive.load(Relaxed) {
        faults.clear();
        if wait.next(&proc_.uffd, p.fault_spin, 1000, &mut faults).is_none() {
            break;
        }
        let t0 = Instant::now();
        for &(flags, addr) in &faults {
            p.handle_fault(&proc_, flags, addr, t0);
        }
    }
}

impl Pcomp {
    /// Write-protects a dirty line and copies it out; the caller removes or cleans the line and
    /// marks it in flight before releasing the lock.
    fn capture(&self, vp: &Arc<Proc>, vpn: u64, wp: bool) -> Option<Writeback> {
        if !wp {
            if let Err(e) = uffd::write_protect(&vp.uffd, vpn * PAGE, PAGE, true) {
                tracing::warn!(pid = vp.pid, error = %e, "cannot write-protect a victim");
            }
        }
        let mut data = vec![0u8; PAGE_SIZE];
        match uffd::read_page(&vp.memfd, vpn * PAGE - vp.base, &mut data) {
            Ok(()) => Some(Writeback { proc: vp.clone(), vpn, data }),
            Err(e) => {
                tracing::warn!(pid = vp.pid, error = %e, "cannot read a victim line");
                None
            }
        }
    }

    fn handle_fault(&self, p: &Arc<Proc>, flags: u64, addr: u64, t0: Instant) {
        let vpn = addr / PAGE;
        let page_addr = vpn * PAGE;
        let write = flags & PAGEFAULT_FLAG_WRITE != 0;
        let wp_fault = flags & PAGEFAULT_FLAG_WP != 0;

        let mut g = self.inner.lock().unwrap();
        let (slot, victim, materialized) = loop {
            if !p.alive.load(Relaxed) {
                return;
            }
            if let Some(slot) = g.cache.lookup(p.pid, vpn) {
                let line = *g.cache.line(slot);
                if line.state == LineState::Filling {
                    g = self.cv.wait(g).unwrap();
                    continue;
                }
                if (wp_fault || write) && line.wp {
                    if !line.dirty {
                        p.written_after_read.fetch_add(1, Relaxed);
                    }
                    let l = g.cache.line_mut(slot);
                    l.wp = false;
                    l.dirty = true;
                    l.referenced = true;
                    self.bump(p, |s| {
                        s.wp_faults.fetch_add(1, Relaxed);
                    });
                    if let Err(e) = uffd::write_protect(&p.uffd, page_addr, PAGE, false) {
                        tracing::warn!(pid = p.pid, error = %e, "cannot lift write protection");
                    }
                } else {
                    uffd::wake(&p.uffd, page_addr, PAGE);
                }
                return;
            }
            if wp_fault {
                // Evicted while the writer waited: woken, it faults again as a miss.
                uffd::wake(&p.uffd, page_addr, PAGE);
                return;
            }
            if g.inflight.contains(&(p.pid, vpn)) {
                g = self.cv.wait(g).unwrap();
                continue;
            }
            let Some(claim) = g.cache.claim(p.pid, vpn) else {
                g = self.cv.wait(g).unwrap();
                continue;
            };
            let mut victim = None;
            if let Some(v) = claim.victim {
                if let Some(vp) = g.procs.get(&v.pid).cloned() {
                    if v.dirty && vp.alive.load(Relaxed) {
                        victim = self.capture(&vp, v.vpn, v.wp);
                        if victim.is_some() {
                            g.inflight.insert((v.pid, v.vpn));
                        }
                    }
                    if let Err(e) = uffd::punch(&vp.memfd, v.vpn * PAGE - vp.base, PAGE) {
                        tracing::warn!(pid = vp.pid, error = %e, "cannot drop a victim line");
                    }
                    self.bump(&vp, |s| {
                        s.evictions.fetch_add(1, Relaxed);
                    });
                }
            }
            for (pid, rv) in g.cache.take_rearm(vpn) {
                if let Some(q) = g.procs.get(&pid) {
                    let _ = uffd::write_protect(&q.uffd, rv * PAGE, PAGE, true);
                }
            }
            let materialized = g.materialized.get(&p.pid).is_some_and(|s| s.contains(&vpn));
            break (claim.slot, victim, materialized);
        };
        drop(g);
        let t_evicted = Instant::now();
        let data = self.fill(p, vpn, materialized, victim);
        let t_fetched = Instant::now();
        let data = match data {
            Ok(d) => d,
            Err(e) => {
                let mut g = self.inner.lock().unwrap();
                if g.cache.lookup(p.pid, vpn) == Some(slot) {
                    g.cache.remove(p.pid, vpn);
                }
                drop(g);
                self.cv.notify_all();
                self.fail_process(p, e);
                return;
            }
        };
        // A line installed writable is dirty from the start: no write to it can go unseen.
        let writable = write || p.predicts_write();
        if !writable {
            // Only lines installed write-protected can show whether a write follows.
            p.read_fills.fetch_add(1, Relaxed);
        }
        let installed = match uffd::copy(&p.uffd, page_addr, &data, !writable) {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(pid = p.pid, addr = page_addr, error = %e, "cannot install a line");
                Install::Gone
            }
        };
        let mut g = self.inner.lock().unwrap();
        if g.cache.lookup(p.pid, vpn) == Some(slot) {
            match installed {
                Install::Done | Install::Exists => g.cache.complete(slot, writable, !writable),
                Install::Gone => {
                    g.cache.remove(p.pid, vpn);
                }
            }
        }
        drop(g);
        self.cv.notify_all();
        let t_done = Instant::now();
        let ns = (t_done - t0).as_nanos() as u64;
        let parts = [(t_evicted - t0), (t_fetched - t_evicted), (t_done - t_fetched)].map(|d| (d.as_nanos() as u64).max(1));
        self.bump(p, |s| {
            let _ = s.evict_ns.lock().unwrap().record(parts[0]);
            if materialized {
                let _ = s.rpc_ns.lock().unwrap().record(parts[1]);
            }
            let _ = s.install_ns.lock().unwrap().record(parts[2]);
            s.misses.fetch_add(1, Relaxed);
            if materialized {
                s.bytes_fetched.fetch_add(PAGE, Relaxed);
            } else {
                s.plocal_fills.fetch_add(1, Relaxed);
            }
            let _ = s.miss_ns.lock().unwrap().record(ns.max(1));
        });
    }

    /// The line's contents: fetched (with the victim's write-back piggybacked when both go to
    /// one owner) or, for a p-local line, zeros with no message at all.
    fn fill(&self, p: &Arc<Proc>, vpn: u64, materialized: bool, victim: Option<Writeback>) -> Result<Vec<u8>, String> {
        let owner = if materialized { Some(self.owner_of(p, vpn).map_err(|e| describe(&e, "find the owner of", vpn))?) } else { None };
        if let Some(wb) = victim {
            let vowner = self.owner_of(&wb.proc, wb.vpn).map_err(|e| describe(&e, "find the owner of", wb.vpn))?;
            if let Some(o) = owner.as_ref().filter(|o| self.cfg.piggyback && o.id == vowner.id) {
                let msg = Msg::P2M_FLUSH_FETCH {
                    who: p.who.clone(),
                    fetch_vpn: vpn,
                    flush_who: wb.proc.who.clone(),
                    flush_vpn: wb.vpn,
                    data: ByteBuf::from(wb.data.clone()),
                };
                let r = self.node.pool.call_direct(&o.addr, &msg);
                self.written_back(&wb, r.is_ok(), true);
                return page_of(r, o, vpn);
            }
            let r = self.node.pool.call_direct(&vowner.addr, &Msg::P2M_FLUSH { who: wb.proc.who.clone(), vpn: wb.vpn, data: ByteBuf::from(wb.data.clone()) });
            let ok = r.is_ok();
            self.written_back(&wb, ok, false);
            if let Err(e) = r {
                self.fail_process(&wb.proc, describe(&e, "write back", wb.vpn));
            }
        }
        match owner {
            Some(o) => {
                let r = self.node.pool.call_direct(&o.addr, &Msg::P2M_FETCH { who: p.who.clone(), vpn });
                page_of(r, &o, vpn)
            }
            None => Ok(vec![0u8; PAGE_SIZE]),
        }
    }

    /// Ends a write-back: the page now exists on its owner; misses waiting on it proceed.
    fn written_back(&self, wb: &Writeback, ok: bool, piggybacked: bool) {
        let mut g = self.inner.lock().unwrap();
        g.inflight.remove(&(wb.proc.pid, wb.vpn));
        if ok {
            g.materialized.entry(wb.proc.pid).or_default().insert(wb.vpn);
        }
        drop(g);
        self.cv.notify_all();
        if ok {
            self.bump(&wb.proc, |s| {
                s.flushes.fetch_add(1, Relaxed);
                s.bytes_flushed.fetch_add(PAGE, Relaxed);
                if piggybacked {
                    s.piggybacked.fetch_add(1, Relaxed);
                }
            });
        }
    }

    /// Writes back every dirty line of `p` in [first, end) (virtual pages). With `keep`, the
    /// lines stay resident, clean and write-protected (fork); otherwise they leave the cache.
    pub(super) fn write_back_range(&self, p: &Arc<Proc>, first: u64, end: u64, keep: bool) -> Result<(), String> {
        let mut wbs = Vec::new();
        {
            let mut g = self.wait_range_settled(p.pid, first, end);
            for (vpn, slot) in g.cache.resident_in(p.pid, first, end) {
                let line = *g.cache.line(slot);
                if line.dirty {
                    if let Some(wb) = self.capture(p, vpn, line.wp) {
                        g.inflight.insert((p.pid, vpn));
                        wbs.push(wb);
                    }
                    let l = g.cache.line_mut(slot);
                    l.dirty = false;
                    l.wp = true;
                }
                if !keep {
                    g.cache.remove(p.pid, vpn);
                }
            }
            if !keep {
                let _ = uffd::punch(&p.memfd, first * PAGE - p.base, (end - first) * PAGE);
            }
        }
        let mut result = Ok(());
        for wb in wbs {
            let r = self.owner_of(p, wb.vpn).and_then(|o| self.node.pool.call_direct(&o.addr, &Msg::P2M_FLUSH { who: p.who.clone(), vpn: wb.vpn, data: ByteBuf::from(wb.data.clone()) }));
            self.written_back(&wb, r.is_ok(), false);
            if let Err(e) = r {
                result = Err(describe(&e, "write back", wb.vpn));
            }
        }
        result
    }

    /// Drops [first, end) from the cache and from the program without writing anything back,
    /// and forgets that those pages ever existed remotely (munmap, MADV_DONTNEED).
    pub(super) fn discard_range(&self, p: &Proc, first: u64, end: u64) {
        let mut g = self.wait_range_settled(p.pid, first, end);
        for (vpn, _) in g.cache.resident_in(p.pid, first, end) {
            g.cache.remove(p.pid, vpn);
        }
        if let Err(e) = uffd::punch(&p.memfd, first * PAGE - p.base, (end - first) * PAGE) {
            tracing::warn!(pid = p.pid, error = %e, "cannot drop a discarded range");
        }
        if let Some(m) = g.materialized.get_mut(&p.pid) {
            let gone: Vec<u64> = m.range(first..end).copied().collect();
            for v in gone {
                m.remove(&v);
            }
        }
    }

    /// Locks the cache once no line of [first, end) is being filled or written back.
    fn wait_range_settled(&self, pid: u64, first: u64, end: u64) -> std::sync::MutexGuard<'_, super::Inner> {
        let mut g = self.inner.lock().unwrap();
        loop {
            let filling = g.cache.resident_in(pid, first, end).iter().any(|(_, s)| g.cache.line(*s).state == LineState::Filling);
            let flying = g.inflight.iter().any(|(q, v)| *q == pid && *v >= first && *v < end);
            if !filling && !flying {
                return g;
            }
            g = self.cv.wait(g).unwrap();
        }
    }
}

fn describe(e: &RpcError, what: &str, vpn: u64) -> String {
    format!("cannot {what} heap page {:#x}: {e}", vpn * PAGE)
}

fn page_of(r: Result<Msg, RpcError>, o: &ComponentRef, vpn: u64) -> Result<Vec<u8>, String> {
    match r {
        Ok(Msg::M2P_PAGE { data }) if data.len() == PAGE_SIZE => Ok(data.into_vec()),
        Ok(other) => Err(format!("mComponent {} at {} answered a fetch of {:#x} with {}", o.id, o.addr, vpn * PAGE, other.name())),
        Err(e) => Err(format!("mComponent {} at {}: {}", o.id, o.addr, describe(&e, "fetch", vpn))),
    }
}
