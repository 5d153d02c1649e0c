//! The component processes of the cluster `cluster up` started, found by the configuration
//! file each runs with (`splitos ROLE --config-file STATE/NAME.json`) rather than only by the
//! PIDs recorded at start: `cluster down` stops a component started again after it died,
//! and counts only what it stopped; `cluster restart NAME` starts one that died, as it was.
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::cluster::{self, ClusterState};

/// The kinds of component, in the order they start (and stop in reverse): managers first,
/// sComponents before the mComponents that write back to them, pComponents last but the
/// nComponents.
const START_ORDER: [&str; 5] = ["gm", "storage", "mem", "proc", "net"];

/// The kind of component `name` (`gm1`: `gm`), which is also its subcommand.
fn kind(name: &str) -> Option<&'static str> {
    let base = name.trim_end_matches(|c: char| c.is_ascii_digit());
    START_ORDER.iter().copied().find(|k| *k == base)
}

fn rank(name: &str) -> Option<usize> {
    let k = kind(name)?;
    START_ORDER.iter().position(|x| *x == k)
}

/// The component of state directory `dir` that command line `cmdline` (NUL-separated, as
/// /proc has it) runs, by its name.
fn name_in(cmdline: &[u8], dir: &Path) -> Option<String> {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    let at = args.iter().position(|a| *a == b"--config-file")?;
    let file = Path::new(std::ffi::OsStr::from_bytes(args.get(at + 1)?));
    if file.parent()? != dir {
        return None;
    }
    let name = file.file_name()?.to_str()?.strip_suffix(".json")?;
    (args.get(1).copied() == kind(name).map(str::as_bytes)).then(|| name.to_string())
}

/// Every live process that runs a component of state directory `dir`, with its name.
pub fn running(dir: &Path) -> Vec<(String, u32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<u32>().ok()?;
            let name = name_in(&std::fs::read(e.path().join("cmdline")).ok()?, dir)?;
            cluster::pid_alive(pid).then_some((name, pid))
        })
        .collect()
}

/// What `cluster down` stops, in the order they started: the recorded processes still alive
/// and those running a component of the cluster's directory that the record lacks (one
/// started again); and how many recorded ones had exited already.
pub fn to_stop(s: &ClusterState) -> (Vec<u32>, usize) {
    let found = running(&s.dir);
    let rank_of = |pid: u32| found.iter().find(|(_, p)| *p == pid).and_then(|(n, _)| rank(n));
    let (mut order, mut gone, mut last) = (Vec::new(), 0, 0);
    for &p in &s.pids {
        if !cluster::pid_alive(p) {
            gone += 1;
            continue;
        }
        // One started by hand with options rather than a file stays where it was recorded.
        last = rank_of(p).unwrap_or(last);
        order.push((last, p));
    }
    for (name, p) in &found {
        if !s.pids.contains(p) {
            order.push((rank(name).unwrap_or(0), *p));
        }
    }
    // Stable: the recorded keep their order; one started again goes after its kind.
    order.sort_by_key(|(r, _)| *r);
    (order.into_iter().map(|(_, p)| p).collect(), gone)
}

/// `cluster restart NAME`: starts component NAME of the cluster `cluster up` started again,
/// with the configuration, credentials and network namespace it had, once it has exited. A
/// manager keeps the address the others know it by (and, alone, its REST API's).
pub fn restart(name: &str) -> anyhow::Result<()> {
    let s = cluster::read_state().ok_or_else(|| {
        anyhow::anyhow!("no cluster started by `splitos cluster up` is here to restart a component of")
    })?;
    let dir = s.dir.as_path();
    let _only_one = super::lock_state_dir(dir)?;
    let config = dir.join(format!("{name}.json"));
    let Some(command) = kind(name).filter(|_| config.exists()) else {
        let mut names: Vec<String> = std::fs::read_dir(dir)?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(String::from))
            .filter(|n| kind(n).is_some())
            .collect();
        names.sort();
        anyhow::bail!(
            "{name:?} is no component of the cluster in {}; its components: {}",
            dir.display(),
            names.join(", ")
        );
    };
    if let Some((_, pid)) = running(dir).into_iter().find(|(n, _)| n == name) {
        anyhow::bail!("{name} runs (pid {pid}): `cluster restart` starts a component that has exited");
    }
    if command == "gm" {
        keep_addresses(&config, name, &s)?;
    }
    let netns = std::fs::read_to_string(dir.join(format!("{name}.netns"))).ok();
    // The log goes on after the last start's, which says why it ended.
    let log = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .append(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(dir.join(format!("{name}.log")))?
    };
    let (mut child, ready) = cluster::launch(dir, name, command, log, true, netns.as_deref())?;
    let addr = cluster::wait_ready(&mut child, &ready, name, dir)?;
    crate::outln!(
        "{name} started again (pid {}) at {addr}; log: {}; `splitos cluster down` stops it with the rest",
        child.id(),
        dir.join(format!("{name}.log")).display()
    );
    Ok(())
}

/// Makes the start file of manager `name` listen where it did (its configuration may say
/// port 0, "any"), where the components and tools look for it.
fn keep_addresses(config: &Path, name: &str, s: &ClusterState) -> anyhow::Result<()> {
    let mut args: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(config)?)?;
    let managers: Vec<&str> = s.gm.split(',').collect();
    let at = match name.strip_prefix("gm").unwrap_or("") {
        "" => managers.first().copied(),
        i => i.parse::<usize>().ok().and_then(|i| managers.get(i).copied()),
    };
    if let Some(at) = at {
        args["listen"] = at.into();
    }
    if let (1, Some(api)) = (managers.len(), &s.api) {
        args["cluster"]["api"] = api.as_str().into();
    }
    crate::config::write_start_file(config, &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmdline(args: &[&str]) -> Vec<u8> {
        args.iter().flat_map(|a| a.bytes().chain([0])).collect()
    }

    #[test]
    fn a_component_is_known_by_its_configuration_file_in_the_state_directory() {
        let dir = Path::new("/run/splitos");
        let of = |args: &[&str]| name_in(&cmdline(args), dir);
        assert_eq!(
            of(&["splitos", "gm", "--config-file", "/run/splitos/gm.json"]).as_deref(),
            Some("gm")
        );
        assert_eq!(
            of(&["/usr/bin/splitos", "mem", "--config-file", "/run/splitos/mem1.json"]).as_deref(),
            Some("mem1")
        );
        // Another cluster's, a subcommand not the file's, and no file at all.
        assert_eq!(of(&["splitos", "gm", "--config-file", "/tmp/other/gm.json"]), None);
        assert_eq!(
            of(&["splitos", "proc", "--config-file", "/run/splitos/mem0.json"]),
            None
        );
        assert_eq!(of(&["splitos", "mem", "--gm", "127.0.0.1:7000"]), None);
    }

    #[test]
    fn the_order_of_start_puts_managers_first_and_pcomponents_after_memory() {
        let mut names = ["proc0", "gm1", "mem0", "storage0", "gm", "net0"];
        names.sort_by_key(|n| rank(n));
        assert_eq!(names, ["gm1", "gm", "storage0", "mem0", "proc0", "net0"]);
        assert_eq!(kind("etcd"), None);
    }
}
