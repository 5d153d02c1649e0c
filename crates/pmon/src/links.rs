//! Measures the links of the topology graph (`splitos_core::topology`) from the pComponent's side:
//! every `link_probe_ms` it probes each mComponent its programs use, and the next heartbeats
//! carry what it saw to the global managers. Probes are requests of their own on the
//! pComponent's control connections, never on a miss's way: a miss does not wait for one, and
//! the probe's cost (a few small round trips and one `PROBE_BYTES` reply per mComponent per
//! period) is what the measurement costs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use splitos_rpc::{ComponentRef, LinkSample, P2M_PROBE_LINK};

use super::excache::RemoteStore;
use splitos_core::node::Node;

/// The reply whose arrival rate is taken for the bandwidth: large enough that its transfer,
/// not the round trip, dominates on loopback and on a datacenter network.
pub const PROBE_BYTES: u32 = 256 << 10;
/// Small probes per round; the shortest is the latency (the others waited behind something).
const SMALL_PROBES: usize = 3;
/// Large probes per round; the fastest is the bandwidth.
const LARGE_PROBES: usize = 2;

/// One round of probes to `m`; `None` if it did not answer.
fn probe(node: &Node, m: &ComponentRef) -> Option<LinkSample> {
    let timed = |bytes: u32| {
        let t = Instant::now();
        let r = node.rpc.call(&m.addr, P2M_PROBE_LINK { bytes }).ok()?;
        (r.payload.len() == bytes as usize).then(|| t.elapsed())
    };
    let rtt = (0..SMALL_PROBES)
        .map(|_| timed(0))
        .collect::<Option<Vec<Duration>>>()?
        .into_iter()
        .min()?;
    let large = (0..LARGE_PROBES)
        .map(|_| timed(PROBE_BYTES))
        .collect::<Option<Vec<Duration>>>()?
        .into_iter()
        .min()?;
    let transfer = large.saturating_sub(rtt).max(Duration::from_micros(1));
    crate::series::LINK_PROBES.increment((SMALL_PROBES + LARGE_PROBES) as u64);
    Some(LinkSample {
        peer: m.id,
        rtt_ns: rtt.as_nanos() as u64,
        bytes_per_s: (PROBE_BYTES as f64 / transfer.as_secs_f64()) as u64,
        age_ms: 0,
    })
}

/// Probes the mComponents `store`'s programs use every `period`, forever. A link no program
/// uses any more is dropped at the next round.
pub fn probe_forever(node: Arc<Node>, store: Arc<RemoteStore>, period: Duration) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("link-probes".into())
        .spawn(move || loop {
            std::thread::sleep(period);
            let links = store
                .mcomponents()
                .iter()
                .filter_map(|m| Some((probe(&node, m)?, Instant::now())))
                .collect();
            node.set_links(links);
        })?;
    Ok(())
}
