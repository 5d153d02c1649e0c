//! `[cluster] placement`: the policy by which the global managers choose the mComponent of
//! each vRegion, seen in what the mComponents themselves report holding.
use crate::common;
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
    let held = mcomp_stats(&c)
        .iter()
        .map(|m| (n(&m["stats"], "capacity"), n(&m["stats"], "used")))
        .collect();
    assert_hold_ends_native(child);
    held
}

#[test]
fn least_loaded_spreads_vregions_and_first_fit_and_best_fit_pack_them() {
    let spread = held_with("least-loaded");
    assert!(
        spread.iter().all(|(_, used)| *used > 0),
        "least-loaded puts vRegions on both mComponents: {spread:?}"
    );

    let first = held_with("first-fit");
    assert!(
        first[0].1 >= 16 << 20 && first[1].1 == 0,
        "first-fit puts every vRegion on the first mComponent to register: {first:?}"
    );

    let best = held_with("best-fit");
    let held_by = |cap: u64| best.iter().find(|(c, _)| *c == cap).unwrap().1;
    assert!(
        held_by(64 << 20) >= 16 << 20 && held_by(256 << 20) == 0,
        "best-fit puts every vRegion on the mComponent with the least free: {best:?}"
    );
}

#[test]
fn an_unknown_placement_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        "[cluster]\nplacement = \"worst-fit\"\n[[pcomponent]]\n[[mcomponent]]\n",
    )
    .unwrap();
    let out = std::process::Command::new(splitos())
        .args(["cluster", "up", "--config"])
        .arg(&config)
        .env("SPLITOS_STATE_DIR", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("placement") && err.contains("worst-fit") && err.contains("least-loaded"),
        "{err}"
    );

    let out = std::process::Command::new(splitos())
        .args(["gm", "--placement", "worst-fit"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("--placement") && err.contains("least-loaded, best-fit, first-fit"),
        "{err}"
    );
}

/// The placement policy is an Ebb of the global managers: the admin replaces it while the
/// cluster runs, as a hosted caller sending its representative a message, and what is placed
/// afterwards follows the new policy (seen in what the mComponents themselves hold).
#[test]
fn the_placement_policy_is_replaced_while_the_cluster_runs() {
    let c = TestCluster::up(Some(
        "[cluster]\nplacement = \"least-loaded\"\nvregion_size = \"4M\"\nreplication = \"none\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\ncapacity = \"256M\"\n[[mcomponent]]\ncapacity = \"64M\"\n",
    ));
    let run = |args: &[&str]| {
        let out = c.cmd(args).output().unwrap();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    let (ok, out, err) = run(&["cluster", "set-placement"]);
    assert!(
        ok && out.contains("placement least-loaded (replaced 0 times)"),
        "{out}{err}"
    );
    let (ok, out, err) = run(&["cluster", "set-placement", "first-fit"]);
    assert!(
        ok && out.contains("placement first-fit (replaced 1 times)"),
        "{out}{err}"
    );
    let (child, _) = spawn_hold(&c, 24);
    let held: Vec<u64> = mcomp_stats(&c).iter().map(|m| n(&m["stats"], "used")).collect();
    assert_hold_ends_native(child);
    assert!(
        held[0] >= 16 << 20 && held[1] == 0,
        "first-fit, put in place of least-loaded, packs every vRegion on the first mComponent: {held:?}"
    );

    // The managers serve the Ebb (the map names them, at id 0) and counted what they received.
    let (ok, map, err) = run(&["cluster", "ebbs", "--json"]);
    assert!(ok, "{err}");
    let map: serde_json::Value = serde_json::from_str(&map).unwrap();
    let entry = map
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == 2)
        .unwrap_or_else(|| panic!("{map}"));
    assert_eq!(
        (
            entry["name"].as_str(),
            entry["homes"][0]["id"].as_u64(),
            entry["homes"][0]["role"].as_str()
        ),
        (Some("placement"), Some(0), Some("Gm")),
        "{map}"
    );
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    assert_eq!(c.metric(&gm, "splitos_ebb_messages_received_total"), 2.0);
    assert_eq!(c.metric(&gm, "splitos_gm_placement_swaps_total"), 1.0);

    // An unknown name and a sender other than the admin are refused, and change nothing.
    let (ok, _, err) = run(&["cluster", "set-placement", "worst-fit"]);
    assert!(!ok && err.contains("least-loaded, best-fit, first-fit"), "{err}");
    let creds = splitos_rpc::auth::Credentials::load(&c.issue("pcomponent")).unwrap();
    let as_pcomp = splitos_rpc::Rpc::new(
        splitos_rpc::TransportConfig::default()
            .build(Some(std::sync::Arc::new(creds)))
            .unwrap(),
        std::time::Duration::from_secs(5),
    );
    let body = postcard::to_allocvec(&splitos_rpc::SetPlacement {
        placement: Some("best-fit".into()),
    })
    .unwrap();
    let r = as_pcomp.call(
        &gm,
        splitos_rpc::X2X_EBB_MESSAGE {
            ebb: 2,
            to: None,
            body: serde_bytes::ByteBuf::from(body),
        },
    );
    assert_eq!(r.map(|_| ()).map_err(|e| e.code()), Err(splitos_rpc::ErrCode::Denied));
    let (_, out, _) = run(&["cluster", "set-placement"]);
    assert!(out.contains("placement first-fit (replaced 1 times)"), "{out}");

    // The REST API replaces it the same way, for admin tokens alone.
    let api = c.status()["api"].as_str().unwrap().to_string();
    let admin = std::fs::read_to_string(c.dir.path().join("admin.token"))
        .unwrap()
        .trim()
        .to_string();
    let tenant = api_token(&c, &["lab", "--vnode", "lab"]);
    let (code, _, body) = http(
        &api,
        "PUT",
        "/api/v1/placement",
        Some(&admin),
        br#"{"placement": "best-fit"}"#,
    );
    assert_eq!(code, 200, "{body}");
    let now: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        (now["placement"].as_str(), now["swaps"].as_u64()),
        (Some("best-fit"), Some(2)),
        "{body}"
    );
    assert_eq!(
        http(
            &api,
            "PUT",
            "/api/v1/placement",
            Some(&tenant),
            br#"{"placement": "nearest"}"#
        )
        .0,
        403
    );
    let (code, _, body) = http(
        &api,
        "PUT",
        "/api/v1/placement",
        Some(&admin),
        br#"{"placement": "worst-fit"}"#,
    );
    assert!(code == 400 && body.contains("least-loaded"), "{code} {body}");
    let (code, _, body) = http(&api, "GET", "/api/v1/placement", Some(&admin), b"");
    assert!(code == 200 && body.contains("best-fit"), "{code} {body}");
    assert_eq!(c.metric(&gm, "splitos_gm_placement_swaps_total"), 2.0);
}
