//! Prometheus metrics (docs/control-plane.md, "Metrics"): a real Prometheus (Debian's) finds
//! every component through the REST API's service discovery, scrapes them and the API's
//! cluster-wide `/metrics` while a program runs, and answers the rate of the program's misses;
//! a component serving its metrics beyond loopback answers admin tokens only, and the knob
//! turns serving off.
use crate::common;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A Prometheus server of the test's own, stopped when dropped.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts Prometheus with `config` (YAML) and waits until it serves.
    fn start(config: &str) -> Prometheus {
        let dir = tempfile::Builder::new()
            .prefix("splitos-prometheus-")
            .tempdir()
            .unwrap();
        let file = dir.path().join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        // Prometheus does not say which port it took for port 0: take a free one first.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("prometheus (Debian's `prometheus`, which scripts/setup.sh installs)");
        let p = Prometheus { child, addr, _dir: dir };
        let t0 = Instant::now();
        while std::net::TcpStream::connect(&p.addr).is_err() || http(&p.addr, "GET", "/-/ready", None, b"").0 != 200 {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "Prometheus did not start: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The samples of an instant query through Prometheus's HTTP API: each one's labels and value.
    fn query(&self, q: &str) -> Vec<(serde_json::Value, f64)> {
        let encoded: String = q
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"_.-".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let (code, _, body) = http(&self.addr, "GET", &format!("/api/v1/query?query={encoded}"), None, b"");
        assert_eq!(code, 200, "{q}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["data"]["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["metric"].clone(), s["value"][1].as_str().unwrap().parse().unwrap()))
            .collect()
    }

    /// Waits until `q` has samples that `ok` accepts; returns them.
    fn eventually(&self, q: &str, ok: impl Fn(&[(serde_json::Value, f64)]) -> bool) -> Vec<(serde_json::Value, f64)> {
        let t0 = Instant::now();
        loop {
            let r = self.query(q);
            if ok(&r) {
                return r;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{q} never held: {r:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_real_prometheus_scrapes_the_cluster_and_answers_the_rate_of_misses() {
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[mcomponent]]\n[[scomponent]]\n[[ncomponent]]\n",
    ));
    let status = c.status();
    let api = status["api"].as_str().unwrap().to_string();
    let token = c.dir.path().join("prometheus.token");
    std::fs::write(&token, api_token(&c, &["prometheus", "--admin"])).unwrap();
    // Prometheus 2.42 leaves the scheme out of service discovery's header unless told.
    let auth = serde_json::json!({"type": "Bearer", "credentials_file": token});
    let config = serde_json::json!({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "splitos", "authorization": auth, "http_sd_configs": [{"url": format!("http://{api}/api/v1/targets"), "refresh_interval": "2s", "authorization": auth}]},
            {"job_name": "cluster", "authorization": auth, "static_configs": [{"targets": [api]}]},
        ],
    });
    // YAML reads JSON.
    let prom = Prometheus::start(&config.to_string());

    // Every component and the managers are found and up, each on its own and through the API.
    let components = status["components"].as_array().unwrap().len();
    prom.eventually("up{job=\"splitos\"} == 1", |r| r.len() == components + 1);
    prom.eventually("splitos_build_info{job=\"cluster\"}", |r| {
        r.len() == components + 1 && r.iter().all(|(l, _)| l["wire"].is_string() && l["version"].is_string())
    });

    // A program that misses for as long as it runs: 32 MiB touched at random through a 4 MiB ExCache.
    let randpages = program("randpages");
    let mut job = c.spawn(&[], &[randpages.to_str().unwrap(), "32", "100000"]);
    let pcomp = c.components("pcomponent")[0]["addr"].as_str().unwrap().to_string();
    let rate = prom.eventually(
        &format!("rate(splitos_pcomp_misses_total{{job=\"splitos\",component=\"{pcomp}\",role=\"pcomponent\"}}[5s])"),
        |r| r.len() == 1 && r[0].1 > 0.0,
    );
    let per_job = prom.eventually("rate(splitos_pcomp_job_misses_total{job=\"splitos\"}[5s])", |r| {
        r.len() == 1 && r[0].1 > 0.0
    });
    assert_eq!(per_job[0].0["vnode"], "default", "{per_job:?}");
    let _ = job.kill();
    let _ = job.wait();

    // What Prometheus saw is what the pComponent counted.
    let seen = prom.query(&format!(
        "splitos_pcomp_misses_total{{job=\"splitos\",component=\"{pcomp}\"}}"
    ));
    let counted = c.metric(&pcomp, "splitos_pcomp_misses_total");
    assert!(
        seen.len() == 1 && seen[0].1 > 0.0 && seen[0].1 <= counted,
        "Prometheus {seen:?}, pComponent {counted}; rate {rate:?}"
    );

    // Every series any component exported, from either scrape job, is declared once in the
    // code with the type, help and labels it carries (`splitos cluster metrics --declared`).
    let declared = declared_series(&c);
    let (code, _, body) = http(&prom.addr, "GET", "/api/v1/metadata", None, b"");
    assert_eq!(code, 200, "{body}");
    let meta: serde_json::Value = serde_json::from_str(&body).unwrap();
    let exported = prom.query("{__name__=~\"splitos_.+\"}");
    let mut families = std::collections::BTreeSet::new();
    for (labels, _) in &exported {
        let name = labels["__name__"].as_str().unwrap();
        let Some((kind, help, own)) = declared.get(name) else {
            panic!("{name} is exported but not declared: {labels}")
        };
        for l in labels.as_object().unwrap().keys() {
            assert!(
                ["__name__", "job", "instance", "component", "role"].contains(&l.as_str()) || own.contains(l),
                "{name} carries the undeclared label {l}: {labels}"
            );
        }
        let m = &meta["data"][name][0];
        assert_eq!(
            (m["type"].as_str(), m["help"].as_str()),
            (Some(kind.as_str()), Some(help.as_str())),
            "{name}"
        );
        families.insert(name.to_string());
    }
    // Each kind of component's own families were among them.
    for family in [
        "splitos_pcomp_misses_total",
        "splitos_mcomp_requests_total",
        "splitos_scomp_used_bytes",
        "splitos_ncomp_open_sockets",
        "splitos_gm_components",
        "splitos_rpc_shm_requests_total",
    ] {
        assert!(families.contains(family), "{family} not in {families:?}");
    }
}

/// The series the code declares: name, then type, help and labels.
fn declared_series(c: &TestCluster) -> std::collections::HashMap<String, (String, String, Vec<String>)> {
    let out = c.cmd(&["cluster", "metrics", "--declared"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut all: std::collections::HashMap<String, (String, String, Vec<String>)> = Default::default();
    for line in text(&out.stdout).lines() {
        let (what, rest) = line.strip_prefix("# ").unwrap().split_once(' ').unwrap();
        let (name, value) = rest.split_once(' ').unwrap();
        let e = all.entry(name.to_string()).or_default();
        match what {
            "HELP" => e.1 = value.to_string(),
            "TYPE" => e.0 = value.to_string(),
            "LABELS" => e.2 = value.split(',').map(String::from).collect(),
            other => panic!("{other} in {line}"),
        }
    }
    all
}

#[test]
fn metrics_beyond_loopback_answer_admin_tokens_only_and_the_knob_turns_them_off() {
    let c = TestCluster::up(None);
    let admin = api_token(&c, &["ops", "--admin"]);
    let tenant = api_token(&c, &["lab-ci", "--vnode", "lab"]);
    let gm = c.status()["gm"].as_str().unwrap().to_string();

    // Two more mComponents started by hand: one serving its metrics on every address (beyond
    // loopback), one not serving them.
    let start = |name: &str, metrics: &str| {
        let ready = c.dir.path().join(format!("{name}.ready"));
        let log = std::fs::File::create(c.dir.path().join(format!("{name}.log"))).unwrap();
        let cred = c.issue("mcomponent");
        let mut child = Command::new(splitos())
            .args([
                "mem",
                "--gm",
                &gm,
                "--listen",
                "127.0.0.1:0",
                "--capacity",
                "64M",
                "--metrics-addr",
                metrics,
            ])
            .arg("--credentials")
            .arg(&cred)
            .arg("--ready-file")
            .arg(&ready)
            .stderr(log)
            .spawn()
            .unwrap();
        remember_pid(c.dir.path(), child.id() as i32);
        if !c.eventually(Duration::from_secs(15), |_| ready.exists()) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{}", c.log(name));
        }
        (std::fs::read_to_string(&ready).unwrap(), child)
    };
    let (wide, mut wide_child) = start("mem-wide", "0.0.0.0:0");
    let (quiet, mut quiet_child) = start("mem-quiet", "off");
    let of = |addr: &str| {
        c.components("mcomponent")
            .into_iter()
            .find(|m| m["addr"] == addr)
            .unwrap_or_else(|| panic!("{addr} in {}", c.status()))
    };
    assert!(
        of(&quiet)["metrics"].is_null(),
        "metrics_addr = off serves none: {}",
        of(&quiet)
    );
    let served = of(&wide)["metrics"].as_str().unwrap().to_string();
    assert!(served.starts_with("0.0.0.0:"), "{served}");
    // Reached over loopback, but the address it serves is not loopback's: the gate holds.
    let at = served.replace("0.0.0.0", "127.0.0.1");

    for (token, why) in [
        (None, "no token"),
        (Some("garbage"), "not a token"),
        (Some(tenant.as_str()), "a tenant's"),
    ] {
        let (code, head, body) = http(&at, "GET", "/metrics", token, b"");
        assert_eq!(code, 401, "{why}: {body}");
        assert!(
            head.contains("www-authenticate: bearer") && !body.contains("splitos_"),
            "{why}: {head}{body}"
        );
    }
    let (code, _, body) = http(&at, "GET", "/metrics", Some(&admin), b"");
    assert_eq!(code, 200, "{body}");
    assert!(metric_of(&body, &wide, "splitos_build_info") == 1.0, "{body}");
    assert!(
        metric_of(&body, &wide, "splitos_metrics_scrapes_refused_total") >= 3.0,
        "the refusals are counted: {body}"
    );
    let out = c.cmd(&["cluster", "token", "revoke", "ops"]).output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        http(&at, "GET", "/metrics", Some(&admin), b"").0,
        401,
        "a revoked token is refused"
    );

    // The components `cluster up` started serve on loopback to anyone on the host.
    let pcomp = &c.components("pcomponent")[0];
    let (code, _, body) = http(pcomp["metrics"].as_str().unwrap(), "GET", "/metrics", None, b"");
    assert_eq!(code, 200);
    assert_eq!(
        metric_of(&body, pcomp["addr"].as_str().unwrap(), "splitos_build_info"),
        1.0,
        "{body}"
    );
    for child in [&mut wide_child, &mut quiet_child] {
        let _ = child.kill();
        let _ = child.wait();
    }
}
