//! Faults injected into the chaos run's cluster and healed: signals, restarts, and the
//! changes an operator makes through the REST API.
use std::time::{Duration, Instant};

use super::schedule::{Fault, Kind, Targets};
use super::{interrupted, settled, short_vregions, Rig, SETTLE};

/// A slowed component is stopped this long of every `SLOW_STOPPED + SLOW_RUNNING`.
const SLOW_STOPPED: Duration = Duration::from_millis(20);
const SLOW_RUNNING: Duration = Duration::from_millis(30);

/// Whether process `pid` is stopped now (state `T` in /proc).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s[s.rfind(')')? + 2..].starts_with('T')))
        .unwrap_or(false)
}

pub(super) fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill takes plain integers.
    unsafe { libc::kill(pid as i32, sig) };
}

/// The connections and bytes nComponent `name` carried for programs, as it counts them.
fn carried(rig: &Rig, name: &str) -> String {
    let addr = rig.addr_of(name).unwrap_or_default();
    let Some(s) = rig.status() else {
        return String::new();
    };
    let n = super::components(&s, "ncomponent")
        .into_iter()
        .find(|c| c["addr"] == addr.as_str())
        .map(|c| c["stats"].clone())
        .unwrap_or_default();
    format!(
        "carried {} connection(s), {} bytes received; ",
        n["connects"].as_u64().unwrap_or(0),
        n["wire_received_bytes"].as_u64().unwrap_or(0)
    )
}

/// Injects fault `f` and heals it: what the cluster showed of it, or why it could not.
pub(super) fn inject(rig: &Rig, f: &Fault, t: &Targets) -> anyhow::Result<String> {
    let running = || {
        rig.pid_of(&f.target)
            .ok_or_else(|| anyhow::anyhow!("{} is not running", f.target))
    };
    let hold = Duration::from_millis(f.hold_ms);
    match f.kind {
        Kind::StopMem | Kind::StopGm | Kind::StopProc | Kind::StopStorage | Kind::StopNet | Kind::StopEtcd => {
            let pid = running()?;
            let addr = rig.addr_of(&f.target).unwrap_or_default();
            signal(pid, libc::SIGSTOP);
            // On a loaded host a stop shorter than the silence limit can still outlast it
            // (heartbeats late before it): then the managers gave the component up, as if it
            // had died. They say so only until its next heartbeat, so they are asked meanwhile.
            let addrs = match f.kind {
                Kind::StopGm | Kind::StopEtcd => Vec::new(),
                _ => vec![addr],
            };
            let mut held_lost = held_lost_within(rig, &addrs, hold);
            signal(pid, libc::SIGCONT);
            held_lost |= addrs.iter().any(|a| rig.lost(a));
            let said = if held_lost { "; held lost" } else { "" };
            Ok(format!("stopped for {} ms{said}", f.hold_ms))
        }
        Kind::SlowMem => {
            let pid = running()?;
            let (t0, mut stops) = (Instant::now(), 0);
            while t0.elapsed() < hold && !interrupted() {
                signal(pid, libc::SIGSTOP);
                std::thread::sleep(SLOW_STOPPED);
                // Seen stopped by the kernel, not only signalled.
                stops += u32::from(stopped(pid));
                signal(pid, libc::SIGCONT);
                std::thread::sleep(SLOW_RUNNING);
            }
            Ok(format!(
                "slowed for {} ms: stopped {stops} times for {} ms",
                f.hold_ms,
                SLOW_STOPPED.as_millis()
            ))
        }
        Kind::KillMem | Kind::PauseMem => {
            let pid = running()?;
            let addr = rig.addr_of(&f.target).unwrap_or_default();
            let paused = f.kind == Kind::PauseMem;
            signal(pid, if paused { libc::SIGSTOP } else { libc::SIGKILL });
            let t0 = Instant::now();
            while !rig.lost(&addr) && t0.elapsed() < Duration::from_millis(t.silence_ms + 15_000) && !interrupted() {
                std::thread::sleep(Duration::from_millis(200));
            }
            let held_lost = rig.lost(&addr);
            let mut short = 0;
            let rebuilt = rig.until(SETTLE, |s| {
                short = short.max(short_vregions(s));
                short_vregions(s) == 0
            });
            std::thread::sleep(hold);
            let back = if paused {
                signal(pid, libc::SIGCONT);
                if !rig.until(SETTLE, |s| settled(s, t)) {
                    anyhow::bail!(
                        "the cluster did not settle within {} s after {} went on",
                        SETTLE.as_secs(),
                        f.target
                    );
                }
                "went on"
            } else {
                restart(rig, &f.target, t)?;
                "started again"
            };
            Ok(format!(
                "held lost: {held_lost}; vRegions short of a copy, at most {short}, rebuilt: {rebuilt}; {back}"
            ))
        }
        Kind::KillGm | Kind::KillProc | Kind::KillStorage | Kind::KillNet => {
            // What an nComponent carried, by its own counters: the workload's sockets were its.
            let pid = running()?;
            let carried = match f.kind {
                Kind::KillNet => carried(rig, &f.target),
                _ => String::new(),
            };
            signal(pid, libc::SIGKILL);
            std::thread::sleep(hold);
            restart(rig, &f.target, t)?;
            Ok(format!("{carried}dead for {} ms; started again", f.hold_ms))
        }
        Kind::KillEtcd => {
            signal(running()?, libc::SIGKILL);
            std::thread::sleep(hold);
            if !gone(rig, &f.target) {
                anyhow::bail!("{} did not exit", f.target);
            }
            rig.etcd.restart(&f.target)?;
            if !rig.until(SETTLE, |s| settled(s, t)) {
                anyhow::bail!(
                    "the cluster did not settle within {} s after {} started again",
                    SETTLE.as_secs(),
                    f.target
                );
            }
            Ok(format!("dead for {} ms; started again", f.hold_ms))
        }
        Kind::CutHost => {
            // Its components, asked during the cut whether the managers hold them lost; not
            // where the managers are among them (cut off, they cannot be asked).
            let names = rig.in_netns(&f.target);
            let addrs: Vec<String> = match names.iter().any(|n| n.starts_with("gm")) {
                true => Vec::new(),
                false => names.iter().filter_map(|n| rig.addr_of(n)).collect(),
            };
            let cut = super::hosts::cut(&f.target)?;
            let links = cut.names().join(", ");
            let held_lost = held_lost_within(rig, &addrs, hold);
            cut.heal()?;
            let said = if held_lost { "; held lost" } else { "" };
            Ok(format!("cut off for {} ms ({links} down){said}", f.hold_ms))
        }
        Kind::SplitHosts => {
            let other = f.to.as_deref().unwrap_or_default();
            // The managers stay reachable from here (at most one side is theirs): every
            // component of both sides is asked whether it is held lost.
            let addrs: Vec<String> = [f.target.as_str(), other]
                .iter()
                .flat_map(|ns| rig.in_netns(ns))
                .filter(|n| !n.starts_with("gm"))
                .filter_map(|n| rig.addr_of(&n))
                .collect();
            let split = super::hosts::split(&f.target, other)?;
            let (routes, held) = (split.routes().len(), split.held());
            let held_lost = held_lost_within(rig, &addrs, hold);
            split.heal()?;
            let said = if held_lost { "; held lost" } else { "" };
            Ok(format!(
                "split from {other} for {} ms ({held} of {routes} blackhole routes in place){said}",
                f.hold_ms
            ))
        }
        Kind::FullDisk => {
            let filled = rig.disks.fill(&f.target)?;
            std::thread::sleep(hold);
            rig.disks.empty(&f.target)?;
            Ok(format!("its disk filled ({} MiB) for {} ms", filled >> 20, f.hold_ms))
        }
        Kind::DrainMem => {
            let id = rig.id_of(&f.target)?;
            let said = rig.cluster(&["drain", &id, "--timeout", &SETTLE.as_secs().to_string()])?;
            std::thread::sleep(hold);
            rig.cluster(&["uncordon", &id])?;
            Ok(last_line(&said))
        }
        Kind::DetachMem if f.to.as_deref() == Some("call-off") => {
            let id = rig.id_of(&f.target)?;
            let said = rig.cli("memory", &["detach", &id, "--no-wait"])?;
            std::thread::sleep(hold);
            match rig.cli("memory", &["attach", &id]) {
                Ok(back) => Ok(format!(
                    "{}; called off after {} ms: {}",
                    last_line(&said),
                    f.hold_ms,
                    last_line(&back)
                )),
                // A small mComponent may have emptied and exited within the hold: it starts
                // again, a new member, as after a detach that ran to its end.
                Err(e) => match gone(rig, &f.target) {
                    true => {
                        restart(rig, &f.target, t)?;
                        Ok(format!(
                            "{}; it exited before the call-off; started again",
                            last_line(&said)
                        ))
                    }
                    false => Err(e),
                },
            }
        }
        Kind::DetachMem => {
            let id = rig.id_of(&f.target)?;
            let said = rig.cli("memory", &["detach", &id, "--timeout", &SETTLE.as_secs().to_string()])?;
            std::thread::sleep(hold);
            restart(rig, &f.target, t)?;
            Ok(format!("{}; started again, a new member", last_line(&said)))
        }
        Kind::ResizeExcache => {
            let (id, to) = (rig.id_of(&f.target)?, f.to.clone().unwrap_or_default());
            let said = rig.cluster(&["set-excache", &id, &to])?;
            std::thread::sleep(hold);
            let size = t.excaches[target_index(&f.target)].to_string();
            let back = rig.cluster(&["set-excache", &id, &size])?;
            Ok(format!("{}; back: {}", last_line(&said), last_line(&back)))
        }
        Kind::SwapPolicy => {
            let id = rig.id_of(&f.target)?;
            let was = rig.cluster(&["set-policy", &id])?;
            let (eviction, prefetch) = f.to.as_deref().unwrap_or_default().split_once('/').unwrap_or_default();
            let said = rig.cluster(&["set-policy", &id, "--eviction", eviction, "--prefetch", prefetch])?;
            std::thread::sleep(hold);
            rig.cluster(&[
                "set-policy",
                &id,
                "--eviction",
                word_after(&was, "eviction ")?,
                "--prefetch",
                word_after(&was, "read-ahead ")?,
            ])?;
            Ok(format!("{}; then back", last_line(&said)))
        }
        Kind::SwapPlacement => {
            let was = rig.cluster(&["set-placement"])?;
            let said = rig.cluster(&["set-placement", f.to.as_deref().unwrap_or_default()])?;
            std::thread::sleep(hold);
            rig.cluster(&["set-placement", word_after(&was, "placement ")?])?;
            Ok(format!("{}; then back", last_line(&said)))
        }
    }
}

fn last_line(s: &str) -> String {
    s.trim().lines().last().unwrap_or_default().trim().to_string()
}

/// The word after `key` in what a command printed (`eviction clock (replaced 1 times)`).
fn word_after<'a>(s: &'a str, key: &str) -> anyhow::Result<&'a str> {
    s.split_once(key)
        .and_then(|(_, rest)| rest.split([' ', ',', '\n']).next())
        .filter(|w| !w.is_empty())
        .ok_or_else(|| anyhow::anyhow!("no {key:?} in {s:?}"))
}

/// The index in a component's name (`proc0`: 0).
fn target_index(name: &str) -> usize {
    name.trim_start_matches(|c: char| !c.is_ascii_digit())
        .parse()
        .unwrap_or(0)
}

/// Whether component `name`'s process is gone, or goes within 10 s.
/// Whether the managers held any of `addrs` lost, asked every 100 ms for `hold` (less if the
/// run is interrupted): they say so only until its next heartbeat.
fn held_lost_within(rig: &Rig, addrs: &[String], hold: Duration) -> bool {
    let (t0, mut held) = (Instant::now(), false);
    while t0.elapsed() < hold && !interrupted() {
        held |= addrs.iter().any(|a| rig.lost(a));
        std::thread::sleep(Duration::from_millis(100).min(hold.saturating_sub(t0.elapsed())));
    }
    held
}

fn gone(rig: &Rig, name: &str) -> bool {
    let t = Instant::now();
    while rig.pid_of(name).is_some() {
        if t.elapsed() > Duration::from_secs(10) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

/// Starts component `name` again once its process is gone, and waits for the cluster to settle.
fn restart(rig: &Rig, name: &str, t: &Targets) -> anyhow::Result<()> {
    if !gone(rig, name) {
        anyhow::bail!("{name} did not exit");
    }
    rig.cluster(&["restart", name])?;
    if !rig.until(SETTLE, |s| settled(s, t)) {
        anyhow::bail!(
            "the cluster did not settle within {} s after {name} started again",
            SETTLE.as_secs()
        );
    }
    Ok(())
}
