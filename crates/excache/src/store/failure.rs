//! What a page operation does after a member failed it: try again on the sets the home has
//! now, report a member lost, wait for one only late, or have a corrupt page rebuilt and the
//! bad copies repaired.
use super::*;

/// A failed call, naming the component, the page and what was attempted.
pub(super) fn failed(o: &ComponentRef, what: &'static str, vpn: u64, e: RpcError) -> Refusal {
    PageError::Call {
        mcomp: o.id,
        addr: o.addr.clone(),
        what,
        page: page(vpn),
        cause: e,
    }
    .into()
}

pub(super) fn corrupt(o: &ComponentRef, vpn: u64) -> Refusal {
    PageError::Corrupt {
        mcomp: o.id,
        addr: o.addr.clone(),
        page: page(vpn),
    }
    .into()
}

/// What to do after a failed call to a replica.
pub(super) enum Next {
    /// The replica sets changed (a replica was reported lost, or the owner said the epoch is
    /// stale): do the whole operation again on the new sets.
    Again,
    /// The member is late, and was waited for: the operation is done again without counting
    /// as one of its `TRIES`.
    Waited,
    Fail(Refusal),
}

/// A call that did not reach a component at all, or broke while under way: the component may
/// be lost (rather than having declined).
pub(super) fn transport_failure(e: &RpcError) -> bool {
    matches!(
        e,
        RpcError::Unreachable { .. } | RpcError::Closed { .. } | RpcError::Timeout { .. }
    )
}

/// After a call to mComponent `o` failed with `e`: whether it is only late (it did not answer,
/// and the global managers have not declared it lost), in which case this waits a heartbeat
/// for the call to be made again. A paused or overloaded mComponent that comes back loses
/// no program; one the managers declare lost fails them as before.
pub(super) fn waited_for(node: &Node, o: &ComponentRef, e: &RpcError) -> bool {
    if !transport_failure(e) || !node.mcomp_not_lost(o.id) {
        return false;
    }
    crate::series::LATE_MCOMPONENT_WAITS.increment(1);
    tracing::warn!(mcomp = o.id, addr = %o.addr, error = %e, "an mComponent does not answer, and the global managers have not declared it lost: waiting for it");
    std::thread::sleep(splitos_core::node::HEARTBEAT);
    true
}

impl RemoteStore {
    /// After a call to replica `o` of a set of `copies` failed: a stale epoch refreshes the
    /// sets (the owner has seen a newer one: the home has it); a replica that cannot be
    /// reached, or no longer holds the process (it was fenced), while others hold the page is
    /// reported to the home, which takes it out of the sets once it finds the same.
    pub(super) fn after(
        &self,
        s: &ProcMemory,
        o: &ComponentRef,
        copies: usize,
        what: &'static str,
        vpn: u64,
        e: RpcError,
    ) -> Next {
        if e.code() == ErrCode::ParityLost {
            // The holder stored the page but could not reach its set's parity member: that
            // member is the one to report.
            let parity = match self.set_of(s, vpn) {
                Ok(set) => set.parity().cloned(),
                Err(r) => return Next::Fail(r),
            };
            return match parity {
                Some(p) if p.id != o.id => self.after(
                    s,
                    &p,
                    copies,
                    what,
                    vpn,
                    RpcError::Unreachable {
                        addr: p.addr.clone(),
                        why: format!("the holder of heap page {:#x} says: {e}", page(vpn)),
                    },
                ),
                _ => Next::Fail(failed(o, what, vpn, e)),
            };
        }
        if e.code() == ErrCode::Stale {
            // The sets may have changed before or after this thread's view did (another
            // thread's mmap may have moved it on already): the view is refreshed and the call
            // tried again, at most `TRIES` times in all.
            if let Err(r) = self.refresh(s, vpn) {
                return Next::Fail(r);
            }
            return Next::Again;
        }
        if e.code() == ErrCode::NoMemory {
            // A write-back found its owner full (heuristic overcommit): the home moves the
            // page's vRegion to an mComponent with room.
            crate::series::OWNER_FULL.increment(1);
            return match s.call_home(
                &self.node,
                P2M_OWNER_FULL {
                    who: s.who.clone(),
                    vpn,
                    full: o.id,
                },
            ) {
                Ok(r) => {
                    s.learn(&r.owners, r.epoch, r.backup);
                    Next::Again
                }
                Err(he) => Next::Fail(failed(
                    o,
                    what,
                    vpn,
                    RpcError::Remote {
                        code: ErrCode::NoMemory,
                        msg: format!("{e}; and the home found no room elsewhere: {he}"),
                    },
                )),
            };
        }
        let gone = transport_failure(&e) || e.code() == ErrCode::NotFound;
        if gone
            && copies < 2
            && self.refresh(s, vpn).is_ok()
            && self.set_of(s, vpn).is_ok_and(|set| set.holder(vpn).id != o.id)
        {
            // The only copy's holder was detached, and the vRegion moved on before this
            // thread's view learned it: its home says where it is now.
            return Next::Again;
        }
        if copies < 2 && waited_for(&self.node, o, &e) {
            return Next::Waited;
        }
        if !gone || copies < 2 {
            return Next::Fail(failed(o, what, vpn, e));
        }
        tracing::warn!(pid = s.who.pid, replica = o.id, error = %e, "a replica cannot serve the process: reporting it to the home");
        crate::series::REPLICAS_LOST.increment(1);
        match s.call_home(
            &self.node,
            P2M_REPLICA_LOST {
                who: s.who.clone(),
                lost: o.id,
                vpn,
            },
        ) {
            Ok(r) => {
                s.learn(&r.owners, r.epoch, r.backup);
                let still = self
                    .set_of(s, vpn)
                    .is_ok_and(|set| set.owners.iter().any(|m| m.id == o.id));
                let mut kept = s.kept.lock().unwrap();
                if !still {
                    kept.remove(&o.id);
                    return Next::Again;
                }
                let now = std::time::Instant::now();
                let (n, at) = kept.entry(o.id).or_insert((0, now));
                if at.elapsed() > KEPT_WINDOW {
                    *n = 0;
                }
                *n += 1;
                *at = now;
                if *n < KEPT_REPORTS {
                    drop(kept);
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    return Next::Again;
                }
                kept.remove(&o.id);
                Next::Fail(failed(o, what, vpn, RpcError::Unreachable { addr: o.addr.clone(), why: format!("{e}; and its home keeps it in the page's set (it reaches it, or cannot rebuild the set without it)") }))
            }
            Err(he) => Next::Fail(failed(
                o,
                what,
                vpn,
                RpcError::Unreachable {
                    addr: o.addr.clone(),
                    why: format!("{e}; and the home cannot be told: {he}"),
                },
            )),
        }
    }

    /// Page `vpn` of a striped or logged set whose holder sent a copy failing its checksum,
    /// rebuilt by the home from the parity or the backup (which also writes it over the bad
    /// copy).
    pub(super) fn reconstruct(&self, s: &ProcMemory, vpn: u64, holder: &ComponentRef) -> Result<Page, Refusal> {
        let r = s
            .call_home(&self.node, P2M_RECONSTRUCT { who: s.who_now(), vpn })
            .map_err(|e| PageError::Unrebuildable {
                mcomp: holder.id,
                addr: holder.addr.clone(),
                page: page(vpn),
                cause: e,
            })?;
        match opened(&s.home(), vpn, r.data)? {
            Some(good) => {
                crate::series::PAGES_REPAIRED.increment(1);
                tracing::warn!(
                    holder = holder.id,
                    vpn,
                    "repaired a corrupted page from the parity or backup"
                );
                Ok(good)
            }
            None => Err(corrupt(holder, vpn)),
        }
    }

    /// Writes a good copy over replicas that sent a page failing its checksum.
    pub(super) fn repair(&self, who: &Who, vpn: u64, good: &[u8], bad: &[ComponentRef]) {
        for o in bad {
            match self.node.rpc.call_direct(
                &o.addr,
                P2M_FLUSH {
                    who: who.clone(),
                    vpn,
                    data: seal_page(good),
                },
            ) {
                Ok(_) => {
                    crate::series::PAGES_REPAIRED.increment(1);
                    tracing::warn!(replica = o.id, vpn, "repaired a corrupted page from another replica");
                }
                Err(e) => tracing::warn!(replica = o.id, vpn, error = %e, "cannot repair a corrupted page"),
            }
        }
    }
}
