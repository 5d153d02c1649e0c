//! One-sided access: an owner hands the pComponent of a process its segment of a vRegion
//! ([`splitos_core::segment`]) when both run on one host. `P2M_LEASE` is an ordinary request,
//! authenticated and checked as a fetch is (the process's vNode and creating pComponent, its
//! epoch); its answer carries a one-time token, which the pComponent presents on the owner's
//! pages socket (a Unix socket in the transport's private directory, only this user may
//! reach) to receive the memfd. A token is good once, for a few seconds, and names one
//! segment: whoever can reach the socket without a token gets nothing.
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde_bytes::ByteBuf;
use splitos_metrics::counters;
use splitos_rpc::fdpass::{peer_cred, send_fds};
use splitos_rpc::*;

use super::{Mem, Peers, PAGE};
use splitos_core::segment::Segment;

/// Why an owner refuses a pComponent a lease on a vRegion's pages.
#[derive(Debug, thiserror::Error)]
pub(super) enum LeaseError {
    #[error("only a process's pComponent takes a lease on its pages")]
    NotProc,
    #[error("process {pid} has no memory in vRegion {idx} here")]
    NoMemoryIn { pid: u64, idx: u64 },
    #[error("vRegion {idx} is striped or logged: its write-backs go through its owner")]
    Redundant { idx: u64 },
}

impl Refuse for LeaseError {
    fn code(&self) -> ErrCode {
        match self {
            LeaseError::NotProc => ErrCode::Denied,
            LeaseError::NoMemoryIn { .. } | LeaseError::Redundant { .. } => ErrCode::Invalid,
        }
    }
}

const TOKEN: usize = 16;
/// How long a token waits for its holder to fetch the segment.
const TOKEN_LIFE: Duration = Duration::from_secs(10);

/// A segment promised, and when. The promise does not keep the segment: a holder that never
/// comes for it (a lease renewed on a segment it maps already, a process killed meanwhile)
/// leaves nothing behind once the owner lets go of the process's pages.
type Promise = (Weak<Segment>, Instant);

counters! {
    /// The pages socket's counters: keys of the mComponent's statistics and the series
    /// `splitos_mcomp_<counter>_total`.
    pub struct HandoutStats: "mcomp" {
        /// Leased segments handed out on the pages socket.
        lease_handouts,
        /// Requests on the pages socket refused (an unknown or expired token, a peer of another
        /// user).
        lease_handouts_refused,
    }
}

/// What a connection to the pages socket was.
enum Visit {
    /// A token redeemed: the segment went.
    Served,
    /// Closed before it sent a byte: a liveness probe, no request.
    Probed,
}

/// Segments promised to lease holders, by token.
#[derive(Default)]
pub(super) struct Handouts {
    pending: Mutex<HashMap<[u8; TOKEN], Promise>>,
    pub(super) stats: HandoutStats,
}

impl Handouts {
    fn promise(&self, seg: &Arc<Segment>) -> [u8; TOKEN] {
        let mut t = [0u8; TOKEN];
        t[..8].copy_from_slice(&auth::random_u64().to_ne_bytes());
        t[8..].copy_from_slice(&auth::random_u64().to_ne_bytes());
        let mut p = self.pending.lock().unwrap();
        p.retain(|_, (_, at)| at.elapsed() < TOKEN_LIFE);
        p.insert(t, (Arc::downgrade(seg), Instant::now()));
        t
    }

    fn redeem(&self, t: &[u8; TOKEN]) -> Option<Arc<Segment>> {
        let (seg, at) = self.pending.lock().unwrap().remove(t)?;
        seg.upgrade().filter(|_| at.elapsed() < TOKEN_LIFE)
    }

    /// Serves the pages socket at `path`: each connection presents a token and gets the
    /// segment's memfd, or a refusal.
    pub(super) fn serve(self: Arc<Self>, path: PathBuf) -> std::io::Result<()> {
        // Bound so that another component's sweep of the transport's directory, which takes
        // a socket refusing connections for a dead component's, never removes it.
        let l = splitos_rpc::transport::shm::bind_private(&path)?;
        tracing::info!(socket = %path.display(), "serving one-sided access to the pages of this host's processes");
        std::thread::Builder::new()
            .name("mcomp-pages".into())
            .spawn(move || {
                for c in l.incoming().flatten() {
                    // A thread each: a peer that connects and says nothing holds up no one.
                    let me = self.clone();
                    let spawned = std::thread::Builder::new().name("mcomp-handout".into()).spawn(move || {
                        let mut c = c;
                        match me.hand_out(&c) {
                            Ok(Visit::Served) => {}
                            Ok(Visit::Probed) => {
                                tracing::debug!("the pages socket was probed (connected to and closed)")
                            }
                            Err(e) => {
                                // Counted before the peer hears it: whoever saw the refusal sees the count.
                                me.stats.lease_handouts_refused.fetch_add(1, Relaxed);
                                tracing::warn!(error = %e, "refused a request for a segment on the pages socket");
                                let _ = c.write_all(b"n");
                            }
                        }
                    });
                    if let Err(e) = spawned {
                        tracing::warn!(error = %e, "cannot serve a request on the pages socket");
                    }
                }
            })
            .map(|_| ())
    }

    fn hand_out(&self, mut c: &UnixStream) -> std::io::Result<Visit> {
        c.set_read_timeout(Some(Duration::from_secs(1)))?;
        // The directory is this user's alone; a peer of another user got in some other way.
        // SAFETY: geteuid has no preconditions.
        if peer_cred(c)?.uid != unsafe { libc::geteuid() } {
            return Err(std::io::Error::other("a peer of another user"));
        }
        let mut t = [0u8; TOKEN];
        let mut got = 0;
        while got < TOKEN {
            match c.read(&mut t[got..]) {
                // Closed before a byte: whoever sweeps the transport's directory of stale
                // sockets checks this one is served, and asks for nothing.
                Ok(0) if got == 0 => return Ok(Visit::Probed),
                Ok(0) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!("a token cut short after {got} of {TOKEN} bytes"),
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let seg = self
            .redeem(&t)
            .ok_or_else(|| std::io::Error::other("an unknown or expired token"))?;
        self.stats.lease_handouts.fetch_add(1, Relaxed);
        send_fds(c, b"k", &[seg.fd().as_raw_fd()])?;
        Ok(Visit::Served)
    }
}

impl<P: Peers> Mem<P> {
    /// `P2M_LEASE`: from the pComponent that created the process only, for a vRegion where
    /// the process has memory, with one member (no parity to keep, no log to append).
    pub(super) fn lease(&self, r: P2M_LEASE) -> Result<M2P_LEASE, Refusal> {
        if current_peer().is_some_and(|p| p.role != Role::Proc) {
            return Err(LeaseError::NotProc.into());
        }
        let p = self.owner_proc(&r.who)?;
        let mut g = self.live(&p)?;
        g.current(&r.who)?;
        let vrs = self.vrs();
        let (start, end) = (
            r.index.saturating_mul(vrs),
            r.index.saturating_add(1).saturating_mul(vrs),
        );
        if !g.has_memory_in(start, end) {
            return Err(LeaseError::NoMemoryIn {
                pid: r.who.pid,
                idx: r.index,
            }
            .into());
        }
        if g.sets.contains_key(&r.index) || g.logs.contains_key(&r.index) {
            return Err(LeaseError::Redundant { idx: r.index }.into());
        }
        let (segment, seg) = g.pages.segment(r.index)?;
        let generation = seg.generation();
        let token = self.handouts.promise(&seg);
        self.c.leases.fetch_add(1, Relaxed);
        Ok(M2P_LEASE {
            segment,
            pages: vrs / PAGE,
            generation,
            token: ByteBuf::from(token.to_vec()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A probe (connected to and closed) is no refused request; a token cut short is.
    #[test]
    fn a_probe_of_the_pages_socket_is_no_refusal_but_a_cut_token_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pages.sock");
        let h = Arc::new(Handouts::default());
        h.clone().serve(path.clone()).unwrap();
        let refused = || h.stats.lease_handouts_refused.load(Relaxed);
        let answer = |c: &mut UnixStream| {
            let mut b = Vec::new();
            let _ = c.read_to_end(&mut b);
            b
        };
        let mut probe = UnixStream::connect(&path).unwrap();
        probe.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(answer(&mut probe), b"", "a probe is answered nothing");
        assert_eq!(refused(), 0);
        let mut cut = UnixStream::connect(&path).unwrap();
        cut.write_all(&[7; TOKEN / 2]).unwrap();
        cut.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(answer(&mut cut), b"n", "a cut token is refused");
        assert_eq!(refused(), 1);
    }
}
