//! The sComponents' disks of a chaos run: a small file system of the run's own (a tmpfs) for
//! each sComponent its configuration gives no directory, so that `full-disk` can fill it.
//! Only a disk made here is ever filled, never one of the host's.
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::config::ClusterConfig;

/// Each disk's size: room for the vNodes' files of the default workloads many times over, and
/// what filling it takes of the host's memory for the hold.
const DISK_SIZE: &str = "256M";
/// The file that fills a disk, beside the sComponent's directory.
const BALLAST: &str = "chaos-ballast";

/// The disks made, unmounted when dropped (after the cluster stopped).
#[derive(Default)]
pub(super) struct Disks {
    /// By the sComponent's index: the mount point, for those that have one.
    mounts: Vec<Option<PathBuf>>,
}

impl Disks {
    /// The sComponents of `cfg` that get a disk of the run's own: those given no directory,
    /// when this process may mount (root).
    pub(super) fn plan(cfg: &ClusterConfig) -> Vec<usize> {
        // SAFETY: geteuid takes no arguments and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        (0..cfg.scomponent.len())
            .filter(|i| root && cfg.scomponent[*i].dir.is_none())
            .collect()
    }

    /// Mounts the disks `plan` names under `dir`, and writes there the configuration
    /// `config` with their directories: the one to start the cluster with.
    pub(super) fn make(config: &Path, plan: &[usize], dir: &Path) -> anyhow::Result<(Disks, PathBuf)> {
        let mut disks = Disks::default();
        if plan.is_empty() {
            return Ok((disks, config.to_path_buf()));
        }
        let mut table: toml::Table = std::fs::read_to_string(config)?.parse()?;
        let storages = table
            .get_mut("scomponent")
            .and_then(|s| s.as_array_mut())
            .ok_or_else(|| anyhow::anyhow!("{} has no [[scomponent]]", config.display()))?;
        for (i, s) in storages.iter_mut().enumerate() {
            let Some(s) = s.as_table_mut().filter(|_| plan.contains(&i)) else {
                disks.mounts.push(None);
                continue;
            };
            let mount = dir.join(format!("disk-storage{i}"));
            std::fs::create_dir_all(&mount)?;
            let out = std::process::Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={DISK_SIZE},mode=0700"),
                    "splitos-chaos-disk",
                ])
                .arg(&mount)
                .output()?;
            if !out.status.success() {
                anyhow::bail!(
                    "cannot make a disk for storage{i} at {}: {}",
                    mount.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            disks.mounts.push(Some(mount.clone()));
            s.insert("dir".into(), mount.join("store").to_string_lossy().into_owned().into());
        }
        let with_disks = dir.join("cluster-with-disks.toml");
        std::fs::write(&with_disks, toml::to_string(&table)?)?;
        Ok((disks, with_disks))
    }

    fn mount(&self, target: &str) -> anyhow::Result<&Path> {
        target
            .strip_prefix("storage")
            .and_then(|i| i.parse::<usize>().ok())
            .and_then(|i| self.mounts.get(i)?.as_deref())
            .ok_or_else(|| anyhow::anyhow!("{target} has no disk of the chaos run's own"))
    }

    /// Fills `target`'s disk to the last byte; returns the bytes it took. A fill that fails
    /// frees what it took.
    pub(super) fn fill(&self, target: &str) -> anyhow::Result<u64> {
        let path = self.mount(target)?.join(BALLAST);
        fill_at(&path).inspect_err(|_| {
            let _ = std::fs::remove_file(&path);
        })
    }

    /// Gives `target`'s disk its room back.
    pub(super) fn empty(&self, target: &str) -> anyhow::Result<()> {
        Ok(std::fs::remove_file(self.mount(target)?.join(BALLAST))?)
    }
}

/// Writes file `path` until its file system has no byte left.
fn fill_at(path: &Path) -> anyhow::Result<u64> {
    let mut f = std::fs::File::create(path)?;
    let chunk = vec![0u8; 64 << 10];
    // Chunks while they fit, then single bytes for what less than a chunk leaves.
    for len in [chunk.len(), 1] {
        loop {
            match f.write(&chunk[..len]) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(std::fs::metadata(path)?.len())
}

impl Drop for Disks {
    fn drop(&mut self) {
        for m in self.mounts.iter().flatten() {
            let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: `c` is a NUL-terminated path that outlives the call, which only reads it.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
