//! `cluster up` by a user other than root: the state it keeps is its own, and a cluster that
//! user could not run programs on is refused before any component starts.
use crate::common::*;

use std::process::Command;

/// Ends every process of `uid` when dropped: what a `cluster up` of that user left running.
struct ProcessesOf(u32);

impl ProcessesOf {
    fn pids(&self) -> Vec<i32> {
        let uid = format!("Uid:\t{}\t", self.0);
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .is_ok_and(|s| s.lines().any(|l| l.starts_with(&uid)))
            })
            .collect()
    }
}

impl Drop for ProcessesOf {
    fn drop(&mut self) {
        for pid in self.pids() {
            // SAFETY: kill(2) takes no pointers; the process runs as this test's own user.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

#[test]
fn a_users_cluster_up_makes_the_directories_of_its_state_its_own() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // A user of no other test, with a fresh home and no runtime directory: the state goes to
    // ~/.local/state/splitos, none of whose directories exist yet.
    let uid = 60051u32;
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let home = t.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
    let _left = ProcessesOf(uid);
    let (u, g) = (format!("--reuid={uid}"), format!("--regid={uid}"));
    let as_user = |args: &[&str]| {
        Command::new("setpriv")
            .args([u.as_str(), g.as_str(), "--clear-groups"])
            .arg(splitos())
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &home)
            .output()
            .unwrap()
    };
    let out = as_user(&["cluster", "up"]);
    let err = text(&out.stderr);
    // What comes after depends on what the host lets a user do; a cluster that came up is
    // stopped again.
    if out.status.success() {
        let down = as_user(&["cluster", "down", "--force"]);
        assert!(down.status.success(), "{}", text(&down.stderr));
    }
    unmount_under(&home);
    assert!(!err.contains("lock file"), "{err}");
    for d in [".local", ".local/state", ".local/state/splitos"] {
        let m = std::fs::metadata(home.join(d)).unwrap_or_else(|e| panic!("{d}: {e}; {err}"));
        let want = if d.ends_with("splitos") { 0o711 } else { 0o700 };
        assert_eq!((m.uid(), m.mode() & 0o7777), (uid, want), "{d}");
    }
    assert_eq!(
        std::fs::metadata(home.join(".local/state/splitos.lock")).unwrap().uid(),
        uid
    );
}

/// A user's `cluster up` on a host where that user may not have a userfaultfd made (this one:
/// /dev/userfaultfd is root's, vm.unprivileged_userfaultfd 0) would start components on which
/// the same user then cannot run: it is refused before any starts, saying what root can do.
#[test]
fn a_users_cluster_up_that_could_not_serve_its_programs_is_refused_with_what_is_missing() {
    let uid = 60053u32;
    let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap();
    let dev = std::fs::metadata("/dev/userfaultfd")
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o006);
    if sysctl.trim() != "0" || dev.is_ok_and(|other| other == 0o006) {
        eprintln!("this host lets every user have a userfaultfd: nothing to refuse");
        return;
    }
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    let home = t.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(uid), Some(uid)).unwrap();
    let _left = ProcessesOf(uid);
    let out = Command::new("setpriv")
        .args([&format!("--reuid={uid}"), &format!("--regid={uid}"), "--clear-groups"])
        .arg(splitos())
        .args(["cluster", "up"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &home)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("not starting a cluster for uid {uid}"))
            && err.contains("/dev/userfaultfd")
            && err.contains("vm.unprivileged_userfaultfd"),
        "{err}"
    );
    assert!(!home.join(".local/state/splitos/cluster.json").exists(), "{err}");
    assert_eq!(ProcessesOf(uid).pids(), Vec::<i32>::new(), "nothing of the user's runs");
}
