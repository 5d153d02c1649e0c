//! The faults of a chaos run, drawn from its seed before anything runs: the same seed and the
//! same cluster give the same sequence of faults, targets, holds and gaps, which is what
//! replaying a failure needs (the programs' timing around them is the machine's).
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// What one fault does to one component.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
}

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
        }
    }

    /// The component kind it hits, as the state directory names them (`mem0`, `gm`, ...).
    pub fn target_kind(self) -> &'static str {
        match self {
            Kind::KillMem | Kind::StopMem | Kind::PauseMem => "mem",
            Kind::KillGm | Kind::StopGm => "gm",
            Kind::StopProc | Kind::KillProc => "proc",
        }
    }
}

/// One fault of the schedule.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kind: Kind,
    /// The component, by its name in the state directory.
    pub target: String,
    /// How long the component stays stopped, or dead before it is started again.
    pub hold_ms: u64,
    /// The quiet time before the fault, while the programs run on.
    pub gap_ms: u64,
}

/// What the cluster has that faults may hit, and what it tolerates.
#[derive(Clone, Debug)]
pub struct Targets {
    pub mems: usize,
    pub procs: usize,
    /// Global managers: one is `gm`, several `gm0`, `gm1`, ...
    pub managers: usize,
    /// Whether an mComponent's loss loses no program's memory (replication with a copy
    /// elsewhere): only then is killing one a fault within tolerance.
    pub mem_loss_tolerated: bool,
    /// The managers' silence limit (`reclaim_dead_ms`): a stop stays well under it.
    pub silence_ms: u64,
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
    kinds.push((Kind::KillProc, 1));
    kinds.retain(|(k, _)| match k.target_kind() {
        "mem" => t.mems > 0,
        "proc" => t.procs > 0,
        _ => true,
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
        let target = match kind.target_kind() {
            "mem" => format!("mem{}", rng.random_range(0..t.mems)),
            "proc" => format!("proc{}", rng.random_range(0..t.procs)),
            _ if t.managers > 1 => format!("gm{}", rng.random_range(0..t.managers)),
            _ => "gm".to_string(),
        };
        let hold_ms = match kind {
            Kind::StopMem | Kind::StopGm | Kind::StopProc => rng.random_range(100..=stop_ms),
            Kind::KillMem | Kind::PauseMem | Kind::KillGm | Kind::KillProc => rng.random_range(200..=2000),
        };
        let gap_ms = rng.random_range(500..=4000);
        spent += gap_ms + hold_ms;
        out.push(Fault {
            kind,
            target,
            hold_ms,
            gap_ms,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(tolerated: bool) -> Targets {
        Targets {
            mems: 4,
            procs: 1,
            managers: 1,
            mem_loss_tolerated: tolerated,
            silence_ms: 2000,
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
        let s = draw(1, 600_000, &targets(true));
        for k in [
            Kind::KillMem,
            Kind::StopMem,
            Kind::PauseMem,
            Kind::KillGm,
            Kind::StopGm,
            Kind::StopProc,
            Kind::KillProc,
        ] {
            assert!(s.iter().any(|f| f.kind == k), "{k:?} drawn in ten minutes");
        }
        assert!(s
            .iter()
            .filter(|f| matches!(f.kind, Kind::StopMem | Kind::StopGm | Kind::StopProc))
            .all(|f| f.hold_ms <= 2000 / 3));
        assert!(s.iter().all(|f| match f.kind.target_kind() {
            "mem" => ["mem0", "mem1", "mem2", "mem3"].contains(&f.target.as_str()),
            "proc" => f.target == "proc0",
            _ => f.target == "gm",
        }));
        assert!(draw(1, 600_000, &targets(false))
            .iter()
            .all(|f| !matches!(f.kind, Kind::KillMem | Kind::PauseMem)));
    }
}
