//! What `--help` tells: every positional argument of every command is described, and the
//! commands that start a cluster name every component they start.
use std::process::Command;

use crate::cli::commands_below;
use crate::common::*;

/// Every positional argument of every command says in its help what it is, and the help of
/// the commands that start a cluster names every component they start.
#[test]
fn every_commands_arguments_are_described() {
    for (path, _) in commands_below(&[]) {
        let help = text(
            &Command::new(splitos())
                .args(&path)
                .arg("--help")
                .output()
                .unwrap()
                .stdout,
        );
        let args: Vec<&str> = help
            .lines()
            .skip_while(|l| *l != "Arguments:")
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        // An argument's description is beside it, or on the lines below (clap's long help).
        let undescribed: Vec<&str> = args
            .iter()
            .enumerate()
            .filter(|(i, l)| {
                l.trim_start().starts_with(['<', '['])
                    && l.split_whitespace().count() == 1
                    && !args.get(i + 1).is_some_and(|next| next.starts_with("      "))
            })
            .map(|(_, l)| *l)
            .collect();
        assert!(undescribed.is_empty(), "{path:?}: {undescribed:?} in\n{help}");
    }
    for cmd in [&["run", "--help"][..], &["cluster", "up", "--help"]] {
        let help = text(&Command::new(splitos()).args(cmd).output().unwrap().stdout);
        assert!(help.contains("sComponent"), "{cmd:?}: {help}");
    }
}
