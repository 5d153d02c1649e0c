//! What a chaos run found: each failed run matched with the fault that explains it, the
//! report by workload, and the command that draws the same faults again.
use super::*;

#[derive(Serialize)]
pub(super) struct WorkloadReport {
    name: String,
    command: String,
    runs: usize,
    as_native: usize,
    wrong: usize,
    errors: usize,
    explained: usize,
    hangs: usize,
}

#[derive(Serialize)]
pub(super) struct Report {
    seed: u64,
    minutes: f64,
    faults: BTreeMap<&'static str, usize>,
    schedule: Vec<Injected>,
    workloads: Vec<WorkloadReport>,
    wrong: usize,
    unexplained: usize,
    hangs: usize,
    errors: Vec<RunRecord>,
    leaks: Vec<String>,
    pub(super) passed: bool,
}

/// The fault that explains a failed run, if any: one beyond the configuration's tolerance
/// (a pComponent killed, or stopped until the managers gave it up; with one manager, the
/// manager killed; an mComponent lost without a copy elsewhere; an sComponent killed or its
/// disk full; an nComponent killed) while the run went on, which its error (the last line of
/// its stderr) names. A change an operator makes (a drain, a resize, a policy) explains
/// nothing.
fn explain(r: &RunRecord, faults: &[Injected], t: &Targets) -> Option<String> {
    // A run that started as a fault healed may have met it on its way in.
    let grace = 2_000;
    let e = &r.error;
    // A file's buffer cache has no copy elsewhere: writes not yet synced die with their
    // mComponent, and the file's reads and next fsync say so with EIO.
    let file_lost = e.contains("Input/output error");
    let names = |k: Kind| match k {
        Kind::KillProc | Kind::StopProc => e.contains("pComponent"),
        Kind::KillGm | Kind::StopGm => e.contains("cannot reach the cluster"),
        Kind::KillMem | Kind::StopMem | Kind::PauseMem => e.contains("mComponent") || file_lost,
        // A file call the sComponent could not serve fails with EIO.
        Kind::KillStorage | Kind::StopStorage => e.contains("sComponent") || e.contains("Input/output error"),
        // A filler that also takes the room kept for the namespace database (given up to it
        // at the sComponent's first commit on the full disk, which may come while the filler
        // still writes) rolls the namespace back to its last durable commit
        // (docs/storage.md): names made or removed since then are so again.
        Kind::FullDisk => [
            "No space left on device",
            "No such file or directory",
            "Directory not empty",
        ]
        .iter()
        .any(|m| e.contains(m)),
        // A connection the nComponent carried ends with it: ENETDOWN, a reset, or an end of
        // file where more was due (Python's `IncompleteRead`, `RemoteDisconnected`).
        Kind::KillNet | Kind::StopNet => [
            "Network is down",
            "Connection reset",
            "Broken pipe",
            "IncompleteRead",
            "RemoteDisconnected",
            "nComponent",
        ]
        .iter()
        .any(|m| e.contains(m)),
        // A host cut off (or parted from another) past the silence limit is its components
        // lost, whichever they are.
        Kind::CutHost | Kind::SplitHosts => [
            "mComponent",
            "pComponent",
            "sComponent",
            "cannot reach the cluster",
            "Input/output error",
        ]
        .iter()
        .any(|m| e.contains(m)),
        // Never beyond the tolerance (below): nothing to name.
        _ => false,
    };
    faults
        .iter()
        .rev()
        .find(|f| {
            let overlaps = f.start_ms <= r.end_ms && r.start_ms <= f.end_ms + grace;
            let held_lost = f.seen.contains("held lost");
            let beyond = match f.fault.kind {
                Kind::KillProc => true,
                Kind::StopProc => held_lost,
                // A start waits 10 s for the managers: a stop is shorter than that.
                Kind::KillGm => t.managers == 1,
                Kind::StopGm => false,
                Kind::KillMem | Kind::PauseMem => !t.mem_loss_tolerated || file_lost,
                Kind::StopMem => held_lost && (!t.mem_loss_tolerated || file_lost),
                // The vNodes' files have no copy elsewhere.
                Kind::KillStorage => true,
                Kind::StopStorage => held_lost,
                Kind::FullDisk => true,
                Kind::KillNet => true,
                Kind::StopNet => held_lost,
                Kind::DrainMem
                | Kind::DetachMem
                | Kind::ResizeExcache
                | Kind::SwapPolicy
                | Kind::SwapPlacement
                | Kind::SlowMem
                | Kind::StopEtcd
                | Kind::KillEtcd => false,
                Kind::CutHost | Kind::SplitHosts => held_lost,
            };
            overlaps && beyond && names(f.fault.kind)
        })
        .map(|f| format!("{} {} at {} ms", f.fault.kind.name(), f.fault.target, f.start_ms))
}

pub(super) fn report(
    seed: u64,
    minutes: f64,
    workloads: &[Workload],
    schedule: Vec<Injected>,
    mut runs: Vec<RunRecord>,
    leaks: Vec<String>,
    t: &Targets,
) -> Report {
    for r in runs.iter_mut().filter(|r| r.outcome == Outcome::Error) {
        r.explained_by = explain(r, &schedule, t);
    }
    let mut faults = BTreeMap::new();
    for f in &schedule {
        *faults.entry(f.fault.kind.name()).or_default() += 1;
    }
    let per: Vec<WorkloadReport> = workloads
        .iter()
        .map(|w| {
            let mine: Vec<&RunRecord> = runs.iter().filter(|r| r.workload == w.name).collect();
            let n = |o: Outcome| mine.iter().filter(|r| r.outcome == o).count();
            WorkloadReport {
                name: w.name.clone(),
                command: w.cmd.clone(),
                runs: mine.len(),
                as_native: n(Outcome::AsNative),
                wrong: n(Outcome::Wrong),
                errors: n(Outcome::Error),
                explained: mine.iter().filter(|r| r.explained_by.is_some()).count(),
                hangs: n(Outcome::Hang),
            }
        })
        .collect();
    let wrong = per.iter().map(|w| w.wrong).sum();
    let hangs = per.iter().map(|w| w.hangs).sum();
    let unexplained = per.iter().map(|w| w.errors - w.explained).sum();
    let unreached = schedule.iter().filter(|f| f.seen.starts_with("could not")).count();
    let passed = wrong == 0 && hangs == 0 && unexplained == 0 && leaks.is_empty() && unreached == 0;
    Report {
        seed,
        minutes,
        faults,
        schedule,
        workloads: per,
        wrong,
        unexplained,
        hangs,
        errors: runs.into_iter().filter(|r| r.outcome != Outcome::AsNative).collect(),
        leaks,
        passed,
    }
}

/// This command line again, with the seed it drew.
pub(super) fn replay(seed: u64) -> String {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--seed" || a.starts_with("--seed=")) {
        args.splice(1..1, ["--seed".to_string(), seed.to_string()]);
    }
    let quote = |a: &String| match a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:+,".contains(c)) {
        true => a.clone(),
        false => format!("'{}'", a.replace('\'', "'\\''")),
    };
    std::iter::once("splitos".to_string())
        .chain(args.iter().map(quote))
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn print_report(r: &Report) {
    let faults: Vec<String> = r.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
    crate::outln!("faults injected: {}", faults.join(", "));
    for f in &r.schedule {
        crate::outln!(
            "  {:>7} ms  {:<14} {:<8} hold {:>4} ms  {}{}",
            f.start_ms,
            f.fault.kind.name(),
            f.fault.target,
            f.fault.hold_ms,
            f.fault.to.as_ref().map(|t| format!("to {t}: ")).unwrap_or_default(),
            f.seen
        );
    }
    crate::outln!("workload            runs  as native  wrong  errors (explained)  hangs");
    for w in &r.workloads {
        crate::outln!(
            "{:<18} {:>5} {:>10} {:>6} {:>7} ({}) {:>12}",
            w.name,
            w.runs,
            w.as_native,
            w.wrong,
            w.errors,
            w.explained,
            w.hangs
        );
    }
    const SHOWN: usize = 10;
    if r.errors.len() > SHOWN {
        crate::outln!(
            "the first {SHOWN} of {} runs that did not end as natively:",
            r.errors.len()
        );
    }
    for e in r.errors.iter().take(SHOWN) {
        crate::outln!(
            "  {} at {}-{} ms: {:?}, {}{}",
            e.workload,
            e.start_ms,
            e.end_ms,
            e.outcome,
            e.detail,
            e.explained_by
                .as_ref()
                .map(|x| format!(" [explained by {x}]"))
                .unwrap_or_default()
        );
    }
    match r.leaks.is_empty() {
        true => crate::outln!("leaks: none"),
        false => r.leaks.iter().for_each(|l| crate::outln!("leak: {l}")),
    }
    crate::outln!(
        "chaos {}: seed {}, {} wrong, {} unexplained error(s), {} hang(s), {} leak(s)",
        if r.passed { "passed" } else { "FAILED" },
        r.seed,
        r.wrong,
        r.unexplained,
        r.hangs,
        r.leaks.len()
    );
}
