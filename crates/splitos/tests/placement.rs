//! `[cluster] placement`: the policy by which the global managers choose the mComponent of
//! each vRegion, seen in what the mComponents themselves report holding.
mod common;
use common::*;

/// A cluster of two mComponents of different capacity with `placement`, running `hold 24`
/// (six 4 MiB vRegions, most of them out of a 4 MiB ExCache); per mComponent in the order
/// they registered (the global managers list them so), its capacity and the bytes of pages it
/// holds, by its own statistics.
fn held_with(placement: &str) -> Vec<(u64, u64)> {
    let c = TestCluster::up(Some(&format!(
        "[cluster]\nplacement = \"{placement}\"\nvregion_size = \"4M\"\nreplication = \"none\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\ncapacity = \"256M\"\n[[mcomponent]]\ncapacity = \"64M\"\n"
    )));
    let (child, _) = spawn_hold(&c, 24);
    let held = mcomp_stats(&c).iter().map(|m| (n(&m["stats"], "capacity"), n(&m["stats"], "used"))).collect();
    assert_hold_ends_native(child);
    held
}

#[test]
fn least_loaded_spreads_vregions_and_first_fit_and_best_fit_pack_them() {
    let spread = held_with("least-loaded");
    assert!(spread.iter().all(|(_, used)| *used > 0), "least-loaded puts vRegions on both mComponents: {spread:?}");

    let first = held_with("first-fit");
    assert!(first[0].1 >= 16 << 20 && first[1].1 == 0, "first-fit puts every vRegion on the first mComponent to register: {first:?}");

    let best = held_with("best-fit");
    let held_by = |cap: u64| best.iter().find(|(c, _)| *c == cap).unwrap().1;
    assert!(held_by(64 << 20) >= 16 << 20 && held_by(256 << 20) == 0, "best-fit puts every vRegion on the mComponent with the least free: {best:?}");
}

#[test]
fn an_unknown_placement_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(&config, "[cluster]\nplacement = \"worst-fit\"\n[[pcomponent]]\n[[mcomponent]]\n").unwrap();
    let out = std::process::Command::new(splitos()).args(["cluster", "up", "--config"]).arg(&config).env("SPLITOS_STATE_DIR", dir.path()).output().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("placement") && err.contains("worst-fit") && err.contains("least-loaded"), "{err}");

    let out = std::process::Command::new(splitos()).args(["gm", "--placement", "worst-fit"]).output().unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("--placement") && err.contains("least-loaded, best-fit, first-fit"), "{err}");
}
