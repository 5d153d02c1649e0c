//! One-sided access from the miss path: the pComponent's side of [`splitos_core::segment`]. For a
//! vRegion with one member on this host, the page store leases the owner's segment once
//! (`P2M_LEASE`, then the memfd over the owner's pages socket) and from then on fetches and
//! writes back the pages the owner holds by a copy: no message, no mComponent thread woken.
//! Whatever it cannot do so (a page the owner does not hold yet, a lease the owner took back,
//! a page failing its checksum, a replicated, striped or logged vRegion, an owner on another
//! host) goes by message as before, and the owner's answers there are what they always were.
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use splitos_rpc::fdpass::recv_fds;
use splitos_rpc::*;

use splitos_core::node::Node;
use splitos_core::segment::{Access, Segment};
use splitos_metrics::counters;

/// Why a vRegion's pages are not leased for one-sided access (it then goes by message).
#[derive(Debug, thiserror::Error)]
pub enum NoLease {
    #[error("the transport has no one-sided access")]
    NoOneSided,
    #[error("the owner is on another host")]
    OtherHost,
    #[error("{0}")]
    Refused(RpcError),
    #[error("the owner's pages socket: {0}")]
    Socket(std::io::Error),
    #[error("the owner refused the token")]
    TokenRefused,
    #[error("cannot map the leased pages: {0}")]
    Map(std::io::Error),
}

counters! {
    /// Counters of one-sided access, for the whole pComponent (`one_sided` in its
    /// statistics; Prometheus `pcomp_one_sided_<counter>_total`).
    pub struct OneSidedStats: "pcomp_one_sided" {
        /// Pages fetched by a copy from an owner's segment.
        reads,
        /// Pages written back by a copy into an owner's segment.
        writes,
        /// Accesses that went by message because the owner did not hold the page yet (a
        /// first write-back charges it; a page never written is zeros).
        absent,
        /// Accesses that found their lease taken back (the owner changed the process's memory
        /// otherwise), and leased again.
        revoked,
        /// Leases taken (a segment mapped, or an old one's lease renewed).
        leases,
        /// Leases refused or failed: the vRegion goes by message for a while.
        refused,
        /// Pages read from a segment that failed their checksum: fetched by message instead.
        checksum_failures,
    }
}

/// How long a vRegion whose lease was refused goes by message before the next try.
const RETRY: Duration = Duration::from_secs(1);

enum Held {
    /// `stale`: the owner took the lease back; the segment stays mapped, so that a renewed
    /// lease on it needs no memfd.
    Leased {
        segment: u64,
        seg: Arc<Segment>,
        generation: u64,
        stale: bool,
    },
    Refused(Instant),
}

/// A process's leases, by owner and vRegion.
#[derive(Default)]
pub struct Leases {
    held: Mutex<HashMap<(u32, u64), Held>>,
}

/// The pages of one vRegion a copy can reach: the owner's segment, the lease's generation, and
/// the page's index in it.
struct Reach {
    seg: Arc<Segment>,
    generation: u64,
    i: u64,
}

pub struct OneSided {
    node: Arc<Node>,
    on: bool,
    pub stats: OneSidedStats,
}

impl OneSided {
    pub fn new(node: Arc<Node>, on: bool) -> OneSided {
        OneSided {
            node,
            on,
            stats: OneSidedStats::default(),
        }
    }

    /// Whether it is on: off, the page store asks nothing of it (not even whose a page is).
    pub fn on(&self) -> bool {
        self.on
    }

    /// The segment holding page `vpn` of vRegion `idx` at owner `o`, leased if need be.
    fn reach(&self, who: &Who, leases: &Leases, o: &ComponentRef, idx: u64, vpn: u64) -> Option<Reach> {
        // The memfd outlives its owner: the pages of an owner the managers declared lost are
        // not served from it, but go by message and fail as they would without a copy.
        if self.node.mcomp_declared_lost(o.id) {
            return None;
        }
        let mut held = leases.held.lock().unwrap();
        let old = match held.get(&(o.id, idx)) {
            Some(Held::Leased {
                seg,
                generation,
                stale: false,
                ..
            }) => {
                return Some(Reach {
                    seg: seg.clone(),
                    generation: *generation,
                    i: vpn % seg.pages(),
                })
            }
            Some(Held::Leased {
                segment,
                seg,
                stale: true,
                ..
            }) => Some((*segment, seg.clone())),
            Some(Held::Refused(at)) if at.elapsed() < RETRY => return None,
            _ => None,
        };
        drop(held);
        let got = self.lease(who, o, idx, old);
        held = leases.held.lock().unwrap();
        match got {
            Ok((segment, seg, generation)) => {
                self.stats.leases.fetch_add(1, Relaxed);
                held.insert(
                    (o.id, idx),
                    Held::Leased {
                        segment,
                        seg: seg.clone(),
                        generation,
                        stale: false,
                    },
                );
                Some(Reach {
                    i: vpn % seg.pages(),
                    seg,
                    generation,
                })
            }
            Err(why) => {
                self.stats.refused.fetch_add(1, Relaxed);
                tracing::debug!(
                    owner = o.id,
                    vregion = idx,
                    why = %why,
                    "no lease: this vRegion goes by message"
                );
                held.insert((o.id, idx), Held::Refused(Instant::now()));
                None
            }
        }
    }

    /// A lease on vRegion `idx` from owner `o`; the segment `old` is kept if the owner still
    /// uses it, else the new one is fetched from its pages socket.
    fn lease(
        &self,
        who: &Who,
        o: &ComponentRef,
        idx: u64,
        old: Option<(u64, Arc<Segment>)>,
    ) -> Result<(u64, Arc<Segment>, u64), NoLease> {
        let path = self
            .node
            .rpc
            .transport()
            .pages_socket(&o.addr)
            .ok_or(NoLease::NoOneSided)?;
        if !path.exists() {
            return Err(NoLease::OtherHost);
        }
        let r = self
            .node
            .rpc
            .call_direct(
                &o.addr,
                P2M_LEASE {
                    who: who.clone(),
                    index: idx,
                },
            )
            .map_err(NoLease::Refused)?;
        if let Some((segment, seg)) = old.filter(|(s, _)| *s == r.segment) {
            return Ok((segment, seg, r.generation));
        }
        let mut c = UnixStream::connect(&path).map_err(NoLease::Socket)?;
        c.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(NoLease::Socket)?;
        c.write_all(&r.token).map_err(NoLease::Socket)?;
        let mut answer = [0u8; 1];
        let fd = recv_fds(&c, &mut answer)
            .map_err(NoLease::Socket)?
            .into_iter()
            .next()
            .ok_or(NoLease::TokenRefused)?;
        let seg = Segment::open(fd, r.pages).map_err(NoLease::Map)?;
        Ok((r.segment, Arc::new(seg), r.generation))
    }

    /// Forgets a lease the owner took back (the next access leases again).
    fn renew(&self, leases: &Leases, o: &ComponentRef, idx: u64) {
        self.stats.revoked.fetch_add(1, Relaxed);
        if let Some(Held::Leased { stale, .. }) = leases.held.lock().unwrap().get_mut(&(o.id, idx)) {
            *stale = true;
        }
    }

    /// Page `vpn` of vRegion `idx` at its one owner `o`, by a copy; `None`: by message.
    pub fn read(&self, who: &Who, leases: &Leases, o: &ComponentRef, idx: u64, vpn: u64) -> Option<Vec<u8>> {
        for _ in 0..2 {
            let r = self.reach(who, leases, o, idx, vpn)?;
            let mut page = vec![0u8; PAGE_SIZE];
            match r.seg.read(r.generation, r.i, &mut page) {
                (Access::Done, sum) if sum == page_checksum(&page) => {
                    self.stats.reads.fetch_add(1, Relaxed);
                    return Some(page);
                }
                (Access::Done, _) => {
                    self.stats.checksum_failures.fetch_add(1, Relaxed);
                    return None;
                }
                (Access::Absent, _) => {
                    self.stats.absent.fetch_add(1, Relaxed);
                    return None;
                }
                (Access::Revoked, _) => self.renew(leases, o, idx),
            }
        }
        None
    }

    /// Writes page `vpn` back by a copy; false: by message.
    pub fn write(&self, who: &Who, leases: &Leases, o: &ComponentRef, idx: u64, vpn: u64, data: &[u8]) -> bool {
        for _ in 0..2 {
            let Some(r) = self.reach(who, leases, o, idx, vpn) else {
                return false;
            };
            match r.seg.write(r.generation, r.i, data, page_checksum(data)) {
                Access::Done => {
                    self.stats.writes.fetch_add(1, Relaxed);
                    return true;
                }
                Access::Absent => {
                    self.stats.absent.fetch_add(1, Relaxed);
                    return false;
                }
                Access::Revoked => self.renew(leases, o, idx),
            }
        }
        false
    }
}
