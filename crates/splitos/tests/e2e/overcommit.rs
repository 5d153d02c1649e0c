//! Memory charged as Linux's overcommit modes (`[cluster] overcommit`, docs/failures.md):
//! heuristic by default (pages charged when stored), strict as an option (writable mappings
//! charged whole when made); a write-back that finds its owner full moves the vRegion to an
//! mComponent with room.
use crate::common;
use common::*;

#[test]
fn fifty_forked_children_fit_with_heuristic_overcommit_and_strict_refuses_them() {
    let forks = program("forkmany");
    let cmd = [forks.to_str().unwrap(), "50", "8"];
    let small = [
        "--embedded",
        "--mcomponents",
        "2",
        "--mem-capacity",
        "256M",
        "--excache",
        "4M",
    ];
    let native_out = text(&native(&cmd).stdout);
    assert_eq!(native_out, "forked 50 of 50, 50 children ok\n");
    let heuristic = under_splitos(&[&small[..], &["--overcommit", "heuristic"]].concat(), &cmd);
    assert_eq!(text(&heuristic.stdout), native_out, "{}", text(&heuristic.stderr));
    // Strict charges each child its parent's writable mappings whole: most forks fail, as
    // they would on Linux in mode 2 with this little memory.
    let strict = under_splitos(&[&small[..], &["--overcommit", "strict"]].concat(), &cmd);
    assert!(!strict.status.success(), "{}", text(&strict.stdout));
    assert!(
        text(&strict.stderr).contains("Cannot allocate memory"),
        "{}",
        text(&strict.stderr)
    );
}

#[test]
fn a_terabyte_mapped_writable_with_noreserve_is_charged_only_under_strict_overcommit() {
    let r = program("reserve");
    let r = r.to_str().unwrap();
    let out = under_splitos(&["--embedded", "--excache", "4M"], &[r]);
    assert_eq!(text(&out.stdout), text(&native(&[r]).stdout), "{}", text(&out.stderr));
    let strict = under_splitos(&["--embedded", "--excache", "4M", "--overcommit", "strict"], &[r]);
    assert!(
        text(&strict.stdout).contains("1 TiB writable MAP_NORESERVE: failed"),
        "{}",
        text(&strict.stdout)
    );
}

#[test]
fn a_write_back_that_finds_its_owner_full_moves_the_vregion_to_one_with_room() {
    let c = TestCluster::up(Some(
        "[cluster]\nvregion_size = \"4M\"\nreplication = \"none\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\ncapacity = \"24M\"\n[[mcomponent]]\ncapacity = \"24M\"\n[[mcomponent]]\ncapacity = \"512M\"\n",
    ));
    let hold = program("hold");
    let hold = hold.to_str().unwrap();
    let out = c.run(&[], &[hold, "96"]);
    assert_eq!(
        text(&out.stdout),
        text(&native(&[hold, "96"]).stdout),
        "{}",
        text(&out.stderr)
    );
    // More than all of them hold: mComponents fill up, their vRegions move to those with
    // room while there are some, and then the program is stopped with an error naming it.
    let out = c.run(&[], &[hold, "900"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is full") && text(&out.stderr).contains("mComponent"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        mcomp_metric(&c, "splitos_mcomp_full_writes_total") >= 1.0,
        "mComponents filled up"
    );
    assert!(
        mcomp_metric(&c, "splitos_mcomp_vregions_moved_total") >= 1.0,
        "and vRegions moved off them: {}",
        text(&out.stderr)
    );
    let p = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    assert!(c.metric(&p, "splitos_pcomp_owner_full_total") >= 1.0);
}
