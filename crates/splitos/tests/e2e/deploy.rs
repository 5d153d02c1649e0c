//! Installing splitos as a service (docs/deployment.md): the release archive puts splitos and
//! its shim side by side, and the systemd units in it parse and run options splitos has.
use crate::common;
use std::path::Path;
use std::process::Command;

use common::*;

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .parent()
        .unwrap()
}

#[test]
fn the_release_archive_holds_splitos_its_shim_and_units_that_systemd_accepts() {
    let bin = splitos();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(root().join("scripts/package.sh"))
        .args(["--from", bin.parent().unwrap().to_str().unwrap(), "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let archive = text(&out.stdout).trim().to_string();
    let prefix = dir.path().join("usr-local");
    std::fs::create_dir(&prefix).unwrap();
    assert!(Command::new("tar")
        .arg("-C")
        .arg(&prefix)
        .arg("-xzf")
        .arg(&archive)
        .status()
        .unwrap()
        .success());
    // `splitos run` finds the shim next to the binary.
    // Owned by root, whoever packed it: unpacked as root, it hands no directory to the packer.
    let listing = text(
        &Command::new("tar")
            .args(["--numeric-owner", "-tvzf", &archive])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(
        listing.lines().all(|l| l.split_whitespace().nth(1) == Some("0/0")
            && l.as_bytes().get(5) != Some(&b'w')
            && l.as_bytes().get(8) != Some(&b'w')),
        "{listing}"
    );
    for f in [
        "bin/splitos",
        "bin/libsplitos_shim.so",
        "lib/tmpfiles.d/splitos.conf",
        "share/doc/splitos/deployment.md",
    ] {
        assert!(prefix.join(f).is_file(), "{f} is in the archive");
    }
    let help = Command::new(prefix.join("bin/splitos")).arg("--help").output().unwrap();
    assert!(
        help.status.success() && text(&help.stdout).contains("cluster"),
        "{}",
        text(&help.stdout)
    );

    let units: Vec<_> = std::fs::read_dir(prefix.join("lib/systemd/system"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(units.len(), 5, "a unit per monitor: {units:?}");
    let verify = dir.path().join("verify");
    std::fs::create_dir(&verify).unwrap();
    for unit in units {
        let name = unit.file_name().unwrap().to_string_lossy().into_owned();
        // The units run splitos where the archive unpacked into /usr/local puts it; here, the
        // one unpacked into the test's directory.
        let text_of = std::fs::read_to_string(&unit).unwrap();
        assert!(text_of.contains("ExecStart=/usr/local/bin/splitos "), "{name}");
        std::fs::write(
            verify.join(&name),
            text_of.replace("/usr/local/bin/splitos", prefix.join("bin/splitos").to_str().unwrap()),
        )
        .unwrap();
        let instance = name.replace("@.service", "@test.service");
        let v = Command::new("systemd-analyze")
            .arg("verify")
            .arg(verify.join(&instance))
            .output()
            .unwrap();
        assert!(
            v.status.success() && text(&v.stderr).trim().is_empty(),
            "{name}: {}{}",
            text(&v.stdout),
            text(&v.stderr)
        );
        // Every option the unit gives is one of its subcommand's.
        let exec = text_of.lines().find_map(|l| l.strip_prefix("ExecStart=")).unwrap();
        let sub = exec.split_whitespace().nth(1).unwrap();
        let sub_help = text(&Command::new(&bin).args([sub, "--help"]).output().unwrap().stdout);
        for opt in exec.split_whitespace().filter(|w| w.starts_with("--")) {
            assert!(
                sub_help.contains(&format!("{opt} ")),
                "{name}: splitos {sub} has no {opt}"
            );
        }
        // Each cluster (the instance) has state and runtime directories of its own.
        assert!(
            text_of
                .lines()
                .filter(|l| !l.starts_with('#')
                    && (l.contains("/var/lib/splitos") || l.contains("/run/splitos") || l.contains("/etc/splitos")))
                .all(|l| l.contains("%i")),
            "{name}"
        );
    }
}
