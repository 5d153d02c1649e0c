//! The topology graph and the `nearest` placement on a cluster of two hosts (network
//! namespaces, `common::Hosts`), each with a pComponent and an mComponent: the graph the API
//! serves, the links the pComponents measured (and the mComponents served the probes of), and
//! each program's memory kept on its own host.
use crate::common;
use std::time::Duration;

use common::*;

#[test]
fn nearest_placement_keeps_each_programs_memory_on_its_host_and_the_graph_shows_measured_links() {
    let h = Hosts::new(&["gm", "a", "b"]);
    let at = |host: &str| format!("listen = \"{}:0\"\nnetns = \"{}\"\n", h.addr(host), h.netns(host));
    let cfg = format!(
        "[cluster]\ngm = \"{}:0\"\nnetns = \"{}\"\nvregion_size = \"4M\"\nplacement = \"nearest\"\n[[pcomponent]]\n{}excache = \"4M\"\nlink_probe_ms = 200\n[[pcomponent]]\n{}excache = \"4M\"\nlink_probe_ms = 200\n[[mcomponent]]\n{}[[mcomponent]]\n{}",
        h.addr("gm"),
        h.netns("gm"),
        at("a"),
        at("b"),
        at("a"),
        at("b")
    );
    let c = TestCluster::up(Some(&cfg));
    let (first, second, first_pid, second_pid) = hold_on_both_pcomponents(&c);
    // Each heap (a home and six vRegions) is on the mComponent of its pComponent's host, two
    // hops away, none on the other host's, four hops away; the least-loaded placement spreads
    // them over both (tests/e2e/hosts.rs).
    let host_of = |addr: &str| addr.rsplit_once(':').unwrap().0.to_string();
    let pcomp_of = |pid: u64| {
        c.components("pcomponent")
            .into_iter()
            .find(|p| {
                p["stats"]["processes"]
                    .as_array()
                    .is_some_and(|ps| ps.iter().any(|x| x["pid"] == pid))
            })
            .unwrap()
    };
    for pid in [first_pid, second_pid] {
        let home_host = host_of(pcomp_of(pid)["addr"].as_str().unwrap());
        let holders: Vec<String> = c
            .components("mcomponent")
            .iter()
            .filter(|m| {
                m["stats"]["owned_processes"]
                    .as_array()
                    .is_some_and(|o| o.iter().any(|p| p["pid"] == pid))
            })
            .map(|m| host_of(m["addr"].as_str().unwrap()))
            .collect();
        assert_eq!(
            holders,
            vec![home_host.clone()],
            "process {pid} of a pComponent on {home_host}"
        );
    }

    // The graph, through the API (on the managers' loopback, so from their host): three hosts
    // on one switch, each component on its host, and a measured link from each pComponent to
    // the mComponent it uses.
    let topology = |json: bool| {
        let mut args = vec![
            splitos().to_str().unwrap().to_string(),
            "cluster".into(),
            "topology".into(),
        ];
        if json {
            args.push("--json".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = h
            .exec("gm", &args)
            .env("SPLITOS_STATE_DIR", c.dir.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "cluster topology: {}", text(&out.stderr));
        text(&out.stdout)
    };
    let measured = |g: &serde_json::Value| {
        g["links"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["kind"] == "uses")
            .cloned()
            .collect::<Vec<_>>()
    };
    let mut g = serde_json::Value::Null;
    assert!(
        c.eventually(Duration::from_secs(15), |_| {
            g = serde_json::from_str(&topology(true)).unwrap();
            measured(&g).len() == 2
        }),
        "both pComponents measured their link: {g:#}"
    );
    let nodes = g["nodes"].as_array().unwrap();
    let kinds = |k: &str| nodes.iter().filter(|n| n["kind"] == k).count();
    assert_eq!(
        (
            kinds("host"),
            kinds("switch"),
            kinds("pcomponent"),
            kinds("mcomponent"),
            kinds("gm")
        ),
        (3, 1, 2, 2, 1),
        "{g:#}"
    );
    let attached = g["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["kind"] == "attached")
        .count();
    assert_eq!(attached, 5, "every component and the managers on a host: {g:#}");
    let id_of = |node: &str| {
        nodes.iter().find(|n| n["id"] == node).unwrap()["label"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for l in measured(&g) {
        let (from, to) = (id_of(l["from"].as_str().unwrap()), id_of(l["to"].as_str().unwrap()));
        assert!(from.starts_with("pcomponent") && to.starts_with("mcomponent"), "{l}");
        let host = |label: &str| host_of(label.rsplit(' ').next().unwrap());
        assert_eq!(
            host(&from),
            host(&to),
            "a pComponent uses the mComponent of its own host: {l}"
        );
        assert!(
            l["latency_us"].as_f64().unwrap() > 0.0 && l["bandwidth_mbps"].as_f64().unwrap() > 0.0,
            "{l}"
        );
    }
    // The mComponents served the probes: their own counters say so.
    let out = c.cmd(&["cluster", "metrics"]).output().unwrap();
    let all = text(&out.stdout);
    for m in c.components("mcomponent") {
        let ours = format!("component=\"{}\"", m["addr"].as_str().unwrap());
        let probes: f64 = all
            .lines()
            .filter(|l| {
                l.starts_with("splitos_mcomp_requests_total{")
                    && l.contains(&ours)
                    && l.contains("msg=\"P2M_PROBE_LINK\"")
            })
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        assert!(probes >= 5.0, "mComponent {} served {probes} link probes", m["addr"]);
    }
    let text_view = topology(false);
    assert!(
        text_view.contains(&format!("host {}", h.addr("a")))
            && text_view.contains("µs")
            && text_view.contains("Gbit/s"),
        "{text_view}"
    );

    assert_hold_ends_native(first);
    assert_hold_ends_native(second);
}
