//! The faults of a chaos run, drawn from its seed before anything runs: the same seed and the
//! same cluster give the same sequence of faults, targets, holds and gaps, which is what
//! replaying a failure needs (the programs' timing around them is the machine's).
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// What one fault does to one component.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// kill -9 an mComponent; once its copies are rebuilt elsewhere, start it again.
    KillMem,
    /// SIGSTOP an mComponent for the hold, shorter than the managers' silence limit.
    StopMem,
    /// SIGSTOP an mComponent past the silence limit, until the managers hold it lost and its
    /// copies are rebuilt elsewhere; SIGCONT after the hold: it comes back fenced.
    PauseMem,
    /// kill -9 the global manager; start it again after the hold.
    KillGm,
    /// SIGSTOP the global manager for the hold.
    StopGm,
    /// SIGSTOP a pComponent for the hold: its programs wait, then go on.
    StopProc,
    /// kill -9 a pComponent (its programs end with it: beyond any configuration's tolerance);
    /// start it again after the hold.
    KillProc,
    /// Drain an mComponent while programs run (`cluster drain`: its memory moves to the
    /// others), then put it back into placement.
    DrainMem,
    /// Detach an mComponent while programs run (`memory detach`: its memory moves to the
    /// others, then it exits), and start it again after the hold, a new member; or, by the
    /// fault's `to` (`call-off`), call the detach off after a short hold, mid-move (`memory
    /// attach`).
    DetachMem,
    /// Resize a pComponent's ExCache (`cluster set-excache`) to the fault's size for the hold,
    /// then back.
    ResizeExcache,
    /// Replace a pComponent's eviction and read-ahead policies (`cluster set-policy`) with the
    /// fault's for the hold, then back.
    SwapPolicy,
    /// Replace the managers' placement policy (`cluster set-placement`) with the fault's for
    /// the hold, then back.
    SwapPlacement,
    /// SIGSTOP an sComponent for the hold, shorter than the silence limit: file calls wait.
    StopStorage,
    /// kill -9 an sComponent; start it again after the hold. With no other copy of the
    /// vNodes' files, beyond the tolerance of any configuration: file calls meanwhile fail.
    KillStorage,
    /// Slow an mComponent down for the hold, as an overloaded host or a noisy neighbour
    /// does: stopped 20 ms of every 50 (SIGSTOP, SIGCONT). Within every configuration's
    /// tolerance: its programs slow down, none fails.
    SlowMem,
    /// Fill an sComponent's disk for the hold, then free it: file writes meanwhile fail with
    /// ENOSPC (no configuration tolerates a full disk). Drawn only for an sComponent on a
    /// disk the chaos run made (run as root, the configuration giving it no directory).
    FullDisk,
    /// SIGSTOP an nComponent for the hold, shorter than the silence limit: socket calls
    /// wait.
    StopNet,
    /// kill -9 an nComponent; start it again after the hold. Its connections end with it
    /// (beyond the tolerance of a configuration with one nComponent): programs read end of
    /// file or `ENETDOWN`, and sockets made meanwhile get `ENETDOWN`.
    KillNet,
    /// SIGSTOP a member of the managers' etcd for the hold, shorter than the silence limit:
    /// the others keep a quorum (and elect a new etcd leader if it led).
    StopEtcd,
    /// kill -9 a member of the managers' etcd; start it again after the hold, as it was
    /// started, with its data directory. Within the tolerance of three members or more.
    KillEtcd,
    /// Cut a host (a network namespace of the configuration's components) off from every
    /// other for the hold, shorter than the silence limit: its links go down at this host's
    /// end, and what it sends or is sent is lost until they come up again.
    CutHost,
    /// Part two hosts from each other for the hold, shorter than the silence limit, while
    /// both reach every other host: each routes the other's addresses into a blackhole.
    SplitHosts,
}

/// Eviction and read-ahead policies a pComponent can take while it runs, and placements.
const EVICTIONS: [&str; 4] = ["workingset", "fifo", "clock", "ghost-clock"];
const PREFETCHERS: [&str; 3] = ["leap", "sequential", "nextline"];
const PLACEMENTS: [&str; 4] = ["least-loaded", "best-fit", "first-fit", "nearest"];
/// How a detach ends: the mComponent exits, or the admin calls it off while it moves.
const DETACH_ENDS: [&str; 2] = ["exit", "call-off"];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::KillMem => "kill-mem",
            Kind::StopMem => "stop-mem",
            Kind::PauseMem => "pause-mem",
            Kind::KillGm => "kill-gm",
            Kind::StopGm => "stop-gm",
            Kind::StopProc => "stop-proc",
            Kind::KillProc => "kill-proc",
            Kind::DrainMem => "drain-mem",
            Kind::DetachMem => "detach-mem",
            Kind::ResizeExcache => "resize-excache",
            Kind::SwapPolicy => "swap-policy",
            Kind::SwapPlacement => "swap-placement",
            Kind::StopStorage => "stop-storage",
            Kind::KillStorage => "kill-storage",
            Kind::SlowMem => "slow-mem",
            Kind::FullDisk => "full-disk",
            Kind::StopNet => "stop-net",
            Kind::KillNet => "kill-net",
            Kind::StopEtcd => "stop-etcd",
            Kind::KillEtcd => "kill-etcd",
            Kind::CutHost => "cut-host",
            Kind::SplitHosts => "split-hosts",
        }
    }

    /// The component kind it hits, as the state directory names them (`mem0`, `gm`, ...).
    pub fn target_kind(self) -> &'static str {
        match self {
            Kind::KillMem | Kind::StopMem | Kind::PauseMem | Kind::DrainMem | Kind::DetachMem | Kind::SlowMem => "mem",
            Kind::KillGm | Kind::StopGm | Kind::SwapPlacement => "gm",
            Kind::StopProc | Kind::KillProc | Kind::ResizeExcache | Kind::SwapPolicy => "proc",
            Kind::StopStorage | Kind::KillStorage | Kind::FullDisk => "storage",
            Kind::StopNet | Kind::KillNet => "net",
            Kind::StopEtcd | Kind::KillEtcd => "etcd",
            Kind::CutHost | Kind::SplitHosts => "host",
        }
    }

    /// Whether it holds a component stopped or cut off for a third of the silence limit at
    /// most: within every configuration's tolerance, as a short stall of a host is.
    pub fn under_silence(self) -> bool {
        matches!(
            self,
            Kind::StopMem
                | Kind::StopGm
                | Kind::StopProc
                | Kind::StopStorage
                | Kind::StopNet
                | Kind::StopEtcd
                | Kind::CutHost
                | Kind::SplitHosts
        )
    }

    /// Whether it is a change an operator makes through the REST API (none without it).
    pub fn through_api(self) -> bool {
        matches!(
            self,
            Kind::DrainMem | Kind::DetachMem | Kind::ResizeExcache | Kind::SwapPolicy | Kind::SwapPlacement
        )
    }
}

/// One fault of the schedule.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kind: Kind,
    /// The component, by its name in the state directory.
    pub target: String,
    /// How long the component stays stopped, dead before it is started again, or changed.
    pub hold_ms: u64,
    /// What a change sets: an ExCache's size in bytes, `EVICTION/PREFETCH`, a placement;
    /// how a detach ends (`exit`, or `call-off`); the host a split parts the target from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The quiet time before the fault, while the programs run on.
    pub gap_ms: u64,
}

/// What the cluster has that faults may hit, and what it tolerates.
#[derive(Clone, Debug)]
pub struct Targets {
    pub mems: usize,
    pub procs: usize,
    pub storages: usize,
    pub nets: usize,
    /// Members of the managers' etcd this run can hit: three or more on this host's loopback,
    /// or none.
    pub etcds: usize,
    /// The network namespaces the components are in, each a host a partition cuts off.
    pub hosts: Vec<String>,
    /// The configured ExCache of each pComponent, in bytes: a resize draws around it.
    pub excaches: Vec<u64>,
    /// Whether the managers serve the REST API, which changes go through.
    pub api: bool,
    /// Global managers: one is `gm`, several `gm0`, `gm1`, ...
    pub managers: usize,
    /// Whether an mComponent's loss loses no program's memory (replication with a copy
    /// elsewhere): only then is killing one a fault within tolerance.
    pub mem_loss_tolerated: bool,
    /// The managers' silence limit (`reclaim_dead_ms`): a stop stays well under it.
    pub silence_ms: u64,
    /// The sComponents on a disk of the run's own, by index: only those are filled.
    pub disks: Vec<usize>,
    /// The kinds of fault to draw from (empty: every kind the cluster has).
    pub only: Vec<Kind>,
}

/// The faults for `ms` of gaps and holds from `seed`.
pub fn draw(seed: u64, ms: u64, t: &Targets) -> Vec<Fault> {
    let mut rng = StdRng::seed_from_u64(seed);
    // Killing a pComponent ends its programs, so it is rare: the run is about surviving.
    let mut kinds = vec![
        (Kind::StopMem, 3),
        (Kind::KillGm, 2),
        (Kind::StopGm, 2),
        (Kind::StopProc, 2),
    ];
    if t.mem_loss_tolerated {
        kinds.push((Kind::KillMem, 3));
        kinds.push((Kind::PauseMem, 2));
    }
    kinds.extend([
        (Kind::KillProc, 1),
        (Kind::ResizeExcache, 2),
        (Kind::SwapPolicy, 2),
        (Kind::SwapPlacement, 1),
        (Kind::StopStorage, 2),
        (Kind::KillStorage, 1),
    ]);
    // Draining or detaching the only mComponent is refused: its memory has nowhere to go.
    if t.mems > 1 {
        kinds.push((Kind::DrainMem, 2));
        kinds.push((Kind::DetachMem, 2));
    }
    kinds.push((Kind::SlowMem, 2));
    if !t.disks.is_empty() {
        kinds.push((Kind::FullDisk, 1));
    }
    kinds.extend([
        (Kind::StopNet, 2),
        (Kind::KillNet, 1),
        (Kind::StopEtcd, 2),
        (Kind::KillEtcd, 2),
        (Kind::CutHost, 2),
    ]);
    // Two hosts at least to part.
    if t.hosts.len() > 1 {
        kinds.push((Kind::SplitHosts, 2));
    }
    kinds.retain(|(k, _)| {
        (t.only.is_empty() || t.only.contains(k))
            && (t.api || !k.through_api())
            && match k.target_kind() {
                "mem" => t.mems > 0,
                "proc" => t.procs > 0,
                "storage" => t.storages > 0,
                "net" => t.nets > 0,
                "etcd" => t.etcds > 0,
                "host" => !t.hosts.is_empty(),
                _ => true,
            }
    });
    let total: u32 = kinds.iter().map(|(_, w)| w).sum();
    let stop_ms = (t.silence_ms / 3).max(100);
    let (mut out, mut spent) = (Vec::new(), 0);
    while spent < ms && total > 0 {
        let mut pick = rng.random_range(0..total);
        let kind = kinds
            .iter()
            .find(|(_, w)| {
                let hit = pick < *w;
                pick = pick.saturating_sub(*w);
                hit
            })
            .map(|(k, _)| *k)
            .expect("a weight was drawn");
        let (target, index) = match kind.target_kind() {
            "mem" => ("mem", rng.random_range(0..t.mems)),
            "proc" => ("proc", rng.random_range(0..t.procs)),
            "storage" if kind == Kind::FullDisk => ("storage", t.disks[rng.random_range(0..t.disks.len())]),
            // Storage components are named from 0 with one as with several.
            "storage" => ("storage", rng.random_range(0..t.storages)),
            "net" => ("net", rng.random_range(0..t.nets)),
            "etcd" => ("etcd", rng.random_range(0..t.etcds)),
            "host" => (t.hosts[rng.random_range(0..t.hosts.len())].as_str(), usize::MAX),
            _ if t.managers > 1 => ("gm", rng.random_range(0..t.managers)),
            _ => ("gm", usize::MAX),
        };
        let target = match index {
            usize::MAX => target.to_string(),
            i => format!("{target}{i}"),
        };
        let detach_end = (kind == Kind::DetachMem).then(|| DETACH_ENDS[rng.random_range(0..DETACH_ENDS.len())]);
        let hold_ms = match kind {
            k if k.under_silence() => rng.random_range(100..=stop_ms),
            // Called off soon, while its memory moves: a move takes a second or so.
            Kind::DetachMem if detach_end == Some("call-off") => rng.random_range(50..=300),
            _ => rng.random_range(200..=2000),
        };
        let to = match kind {
            // From a quarter of the configured size to twice it, in whole MiB, 1 MiB at least.
            Kind::ResizeExcache => {
                let mib = (t.excaches[index] >> 20).max(1);
                Some((rng.random_range((mib / 4).max(1)..=mib * 2) << 20).to_string())
            }
            Kind::SwapPolicy => Some(format!(
                "{}/{}",
                EVICTIONS[rng.random_range(0..EVICTIONS.len())],
                PREFETCHERS[rng.random_range(0..PREFETCHERS.len())]
            )),
            Kind::SwapPlacement => Some(PLACEMENTS[rng.random_range(0..PLACEMENTS.len())].to_string()),
            Kind::DetachMem => detach_end.map(String::from),
            Kind::SplitHosts => {
                let others: Vec<&String> = t.hosts.iter().filter(|h| **h != target).collect();
                Some(others[rng.random_range(0..others.len())].clone())
            }
            _ => None,
        };
        let gap_ms = rng.random_range(500..=4000);
        spent += gap_ms + hold_ms;
        out.push(Fault {
            kind,
            target,
            hold_ms,
            to,
            gap_ms,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Kind; 22] = [
        Kind::KillMem,
        Kind::StopMem,
        Kind::PauseMem,
        Kind::DrainMem,
        Kind::DetachMem,
        Kind::KillGm,
        Kind::StopGm,
        Kind::SwapPlacement,
        Kind::StopProc,
        Kind::KillProc,
        Kind::ResizeExcache,
        Kind::SwapPolicy,
        Kind::StopStorage,
        Kind::KillStorage,
        Kind::SlowMem,
        Kind::FullDisk,
        Kind::StopNet,
        Kind::KillNet,
        Kind::StopEtcd,
        Kind::KillEtcd,
        Kind::CutHost,
        Kind::SplitHosts,
    ];

    fn targets(tolerated: bool) -> Targets {
        Targets {
            mems: 4,
            procs: 1,
            storages: 1,
            nets: 1,
            etcds: 3,
            hosts: vec!["rack-a".into(), "rack-b".into()],
            excaches: vec![16 << 20],
            api: true,
            only: Vec::new(),
            managers: 1,
            mem_loss_tolerated: tolerated,
            silence_ms: 2000,
            disks: vec![0],
        }
    }

    #[test]
    fn a_seed_draws_the_same_schedule_and_another_seed_another() {
        let a = draw(7, 120_000, &targets(true));
        assert_eq!(a, draw(7, 120_000, &targets(true)));
        assert_ne!(a, draw(8, 120_000, &targets(true)));
        let spent: u64 = a.iter().map(|f| f.gap_ms + f.hold_ms).sum();
        assert!((120_000..120_000 + 6_000).contains(&spent), "{spent}");
    }

    #[test]
    fn stops_stay_under_the_silence_limit_and_mcomponents_die_only_where_replicas_hold() {
        let s = draw(1, 1_200_000, &targets(true));
        for k in ALL {
            assert!(s.iter().any(|f| f.kind == k), "{k:?} drawn in twenty minutes");
        }
        assert!(s
            .iter()
            .filter(|f| f.kind.under_silence())
            .all(|f| f.hold_ms <= 2000 / 3));
        assert!(s.iter().all(|f| match f.kind.target_kind() {
            "mem" => ["mem0", "mem1", "mem2", "mem3"].contains(&f.target.as_str()),
            "proc" => f.target == "proc0",
            "storage" => f.target == "storage0",
            "net" => f.target == "net0",
            "etcd" => ["etcd0", "etcd1", "etcd2"].contains(&f.target.as_str()),
            "host" => ["rack-a", "rack-b"].contains(&f.target.as_str()),
            _ => f.target == "gm",
        }));
        // Each change says what it sets, within what the component takes.
        for f in &s {
            let to = f.to.as_deref();
            match f.kind {
                Kind::ResizeExcache => {
                    let b: u64 = to.unwrap().parse().unwrap();
                    assert!((4 << 20..=32 << 20).contains(&b) && b.is_multiple_of(1 << 20), "{b}");
                }
                Kind::SwapPolicy => {
                    let (e, p) = to.unwrap().split_once('/').unwrap();
                    assert!(EVICTIONS.contains(&e) && PREFETCHERS.contains(&p));
                }
                Kind::SwapPlacement => assert!(PLACEMENTS.contains(&to.unwrap())),
                Kind::DetachMem => assert!(DETACH_ENDS.contains(&to.unwrap())),
                Kind::SplitHosts => {
                    let other = to.unwrap();
                    assert!(other != f.target && ["rack-a", "rack-b"].contains(&other), "{f:?}");
                }
                _ => assert_eq!(to, None),
            }
        }
        assert!(draw(1, 600_000, &targets(false))
            .iter()
            .all(|f| !matches!(f.kind, Kind::KillMem | Kind::PauseMem)));
        let bare = Targets {
            storages: 0,
            nets: 0,
            etcds: 0,
            hosts: Vec::new(),
            api: false,
            ..targets(true)
        };
        assert!(draw(1, 600_000, &bare)
            .iter()
            .all(|f| !f.kind.through_api() && !["storage", "net", "etcd", "host"].contains(&f.kind.target_kind())));
        // A host alone is cut off, never split from another.
        let one_host = Targets {
            hosts: vec!["rack-a".into()],
            ..targets(true)
        };
        let s = draw(1, 600_000, &one_host);
        assert!(s.iter().any(|f| f.kind == Kind::CutHost) && s.iter().all(|f| f.kind != Kind::SplitHosts));
        // A disk not of the run's own is never filled.
        let theirs = Targets {
            storages: 2,
            disks: vec![1],
            ..targets(true)
        };
        let s = draw(1, 600_000, &theirs);
        assert!(s.iter().any(|f| f.kind == Kind::FullDisk));
        assert!(s
            .iter()
            .filter(|f| f.kind == Kind::FullDisk)
            .all(|f| f.target == "storage1"));
        assert!(draw(
            1,
            600_000,
            &Targets {
                disks: Vec::new(),
                ..targets(true)
            }
        )
        .iter()
        .all(|f| f.kind != Kind::FullDisk));
        let only = Targets {
            only: vec![Kind::KillStorage, Kind::SwapPolicy],
            ..targets(true)
        };
        let s = draw(1, 120_000, &only);
        assert!(s.iter().any(|f| f.kind == Kind::KillStorage) && s.iter().any(|f| f.kind == Kind::SwapPolicy));
        assert!(s.iter().all(|f| only.only.contains(&f.kind)));
    }
}
