//! The REST API of the global managers (docs/control-plane.md), over real HTTP against a
//! cluster started by `cluster up`: liveness and readiness without a token, everything under
//! /api/v1/ only with one, tenants kept from what is the admin's, tokens revoked for good and
//! kept across a restart of the global managers as hashes only, and the OpenAPI document the
//! server serves is the one checked into docs/.
use crate::common;
use std::time::Duration;

use common::*;

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

#[test]
fn the_api_serves_only_token_holders_and_tenants_only_their_own() {
    let c = TestCluster::up(None);
    let api = c.status()["api"]
        .as_str()
        .expect("cluster status --json names the API's address")
        .to_string();

    // Liveness and readiness need no token.
    assert_eq!(http(&api, "GET", "/livez", None, b"").0, 200);
    let (code, _, body) = http(&api, "GET", "/readyz", None, b"");
    assert_eq!((code, body.as_str()), (200, "ok\n"));

    // No token, a malformed header, a made-up token: 401, with the challenge, and logged.
    for t in [None, Some("splitos_0011223344556677_00"), Some("garbage")] {
        let (code, head, body) = http(&api, "GET", "/api/v1/components", t, b"");
        assert_eq!(code, 401, "{t:?}: {body}");
        assert!(head.contains("www-authenticate: bearer"), "{head}");
        assert!(json(&body)["error"].is_string());
    }
    assert!(
        c.log("gm").contains("API request refused"),
        "refusals are logged: {}",
        c.log("gm")
    );

    let admin = api_token(&c, &["ops", "--admin"]);
    let tenant = api_token(&c, &["lab-ci", "--vnode", "lab"]);
    assert!(admin.starts_with("splitos_") && tenant.starts_with("splitos_"));

    // The admin sees every component, as `cluster status` does.
    let (code, _, body) = http(&api, "GET", "/api/v1/components", Some(&admin), b"");
    assert_eq!(code, 200, "{body}");
    let comps = json(&body);
    let mut roles: Vec<&str> = comps
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["role"].as_str().unwrap())
        .collect();
    roles.sort();
    let mut expected: Vec<String> = c.status()["components"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["role"].as_str().unwrap().to_string())
        .collect();
    expected.sort();
    assert_eq!(roles, expected);
    assert!(roles.contains(&"pcomponent") && roles.contains(&"mcomponent"));
    assert!(comps
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["alive"] == true && c["host"] == "127.0.0.1"));
    let mem: u64 = comps
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["role"] == "mcomponent")
        .map(|c| c["capacity_bytes"].as_u64().unwrap())
        .sum();
    assert!(mem > 0);
    // `cluster status` asks the API (one request), which gathers every component's statistics.
    let (code, _, body) = http(&api, "GET", "/api/v1/status", Some(&admin), b"");
    assert_eq!(code, 200, "{body}");
    assert!(
        json(&body)["components"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["stats"].is_object()),
        "{body}"
    );
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let requests = || {
        metric_of(
            &http(&api, "GET", "/metrics", Some(&admin), b"").2,
            &gm,
            "splitos_gm_api_requests_total",
        )
    };
    let before = requests();
    assert!(c.status()["components"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["stats"].is_object()));
    assert_eq!(
        requests() - before,
        2.0,
        "one for `cluster status`, one for this scrape"
    );
    let (code, _, body) = http(&api, "GET", "/api/v1/config", Some(&admin), b"");
    assert_eq!(code, 200);
    // The `[cluster]` table as the managers run it: the default vRegion size, in bytes.
    assert_eq!(json(&body)["vregion_size"], 1u64 << 30, "{body}");
    assert_eq!(
        json(&http(&api, "GET", "/api/v1/whoami", Some(&admin), b"").2)["role"],
        "admin"
    );

    // A tenant is told who it is, and refused what is the admin's: 403, not 404.
    let who = json(&http(&api, "GET", "/api/v1/whoami", Some(&tenant), b"").2);
    assert_eq!(
        (who["role"].as_str(), who["vnodes"][0].as_str(), who["token"].as_str()),
        (Some("tenant"), Some("lab"), Some("lab-ci"))
    );
    for path in [
        "/api/v1/components",
        "/api/v1/config",
        "/api/v1/status",
        "/api/v1/memory",
    ] {
        let (code, _, body) = http(&api, "GET", path, Some(&tenant), b"");
        assert_eq!(code, 403, "{path}: {body}");
    }
    assert!(
        c.log("gm")
            .lines()
            .any(|l| l.contains("API request refused") && l.contains("lab-ci")),
        "a 403 names the token it refused: {}",
        c.log("gm")
    );

    // Unknown resources, and a 1 MiB body to a route that takes none: clear 4xx (the body is
    // never read), and the API keeps serving.
    assert_eq!(http(&api, "GET", "/api/v1/nothing", Some(&admin), b"").0, 404);
    assert_eq!(http(&api, "GET", "/nothing", None, b"").0, 404);
    let big = vec![b'x'; 1 << 20];
    let (code, _, _) = http(&api, "POST", "/api/v1/components", Some(&admin), &big);
    assert_eq!(code, 405, "a 1 MiB body");
    assert_eq!(http(&api, "GET", "/api/v1/components", Some(&admin), b"").0, 200);

    // Listed without secrets; revoked for good.
    let out = c.cmd(&["cluster", "token", "list", "--json"]).output().unwrap();
    let list = json(&text(&out.stdout));
    assert_eq!(
        list.as_array()
            .unwrap()
            .iter()
            .map(|t| (t["name"].as_str().unwrap(), t["role"].as_str().unwrap()))
            .collect::<Vec<_>>(),
        [("lab-ci", "tenant"), ("local-admin", "admin"), ("ops", "admin")],
        "cluster up made root's own token"
    );
    assert!(!text(&out.stdout).contains(&admin[admin.len() - 16..]));
    let out = c.cmd(&["cluster", "token", "revoke", "lab-ci"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(http(&api, "GET", "/api/v1/whoami", Some(&tenant), b"").0, 401);
    let out = c.cmd(&["cluster", "token", "revoke", "lab-ci"]).output().unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("no API token"),
        "{}",
        text(&out.stderr)
    );
    let out = c
        .cmd(&["cluster", "token", "create", "bad name", "--admin"])
        .output()
        .unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("name"),
        "{}",
        text(&out.stderr)
    );

    // The file keeps hashes, not secrets.
    let raw = std::fs::read(c.dir.path().join("gm/state.redb")).unwrap();
    let secret = admin.rsplit('_').next().unwrap().as_bytes();
    assert!(!raw.windows(secret.len()).any(|w| w == secret));

    // The served OpenAPI document is the checked-in one, and names every route.
    let (code, _, served) = http(&api, "GET", "/openapi.json", None, b"");
    assert_eq!(code, 200);
    let doc = json(&served);
    for p in [
        "/livez",
        "/readyz",
        "/api/v1/whoami",
        "/api/v1/components",
        "/api/v1/config",
    ] {
        assert!(doc["paths"][p].is_object(), "{p} in the OpenAPI document");
    }
    let checked_in =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json"))
            .unwrap();
    assert_eq!(
        json(&checked_in),
        doc,
        "docs/openapi.json is stale: regenerate it with `splitos cluster openapi > docs/openapi.json`"
    );
}

#[test]
fn tokens_outlive_a_restart_of_the_global_managers() {
    let c = TestCluster::up(None);
    let admin = api_token(&c, &["ops", "--admin"]);
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    c.kill_component(c.pid_of_addr(&gm));
    // Started again from the configuration `cluster up` gave it, on any free port (its old
    // one may be taken by then): the same token file.
    let mut args: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(c.dir.path().join("gm.json")).unwrap()).unwrap();
    let ready = c.dir.path().join("gm-again.ready");
    args["listen"] = "127.0.0.1:0".into();
    args["process"]["ready_file"] = ready.to_str().unwrap().into();
    let conf = c.dir.path().join("gm-again.json");
    std::fs::write(&conf, args.to_string()).unwrap();
    let log = std::fs::File::create(c.dir.path().join("gm-again.log")).unwrap();
    let restarted = {
        use std::os::unix::process::CommandExt;
        c.cmd(&["gm", "--config-file", conf.to_str().unwrap()])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .unwrap()
    };
    remember_pid(c.dir.path(), restarted.id() as i32);
    assert!(
        c.eventually(Duration::from_secs(15), |_| ready.exists()),
        "{}",
        c.log("gm-again")
    );
    let gm = std::fs::read_to_string(&ready).unwrap();
    let out = c.cmd(&["cluster", "status", "--json", "--gm", &gm]).output().unwrap();
    let api = json(&text(&out.stdout))["api"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", text(&out.stderr)))
        .to_string();
    let (code, _, body) = http(&api, "GET", "/api/v1/whoami", Some(&admin), b"");
    assert_eq!((code, json(&body)["token"].as_str()), (200, Some("ops")), "{body}");
}

#[test]
fn jobs_are_listed_to_whom_they_belong_and_signalled_through_the_api() {
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[mcomponent]]\n",
    ));
    let api = c.status()["api"].as_str().unwrap().to_string();
    let admin = api_token(&c, &["ops", "--admin"]);
    let mine = api_token(&c, &["default-ci", "--vnode", "default"]);
    let other = api_token(&c, &["lab-ci", "--vnode", "lab"]);
    let hold = program("hold");
    let hold = hold.to_str().unwrap();
    // 16 MiB through a 4 MiB ExCache: the job's counters move.
    let mut job = c.spawn(&[], &[hold, "16"]);
    assert_eq!(read_line(&mut job), "ready\n");

    let list = json(&http(&api, "GET", "/api/v1/jobs", Some(&admin), b"").2);
    let jobs = list["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1, "{list}");
    let j = &jobs[0];
    assert_eq!(
        (j["vnode"].as_str(), j["user"].as_str(), j["uid"].as_u64()),
        (Some("default"), Some("root"), Some(0)),
        "{j}"
    );
    let command = j["command"].as_str().unwrap();
    assert!(command.starts_with(hold) && command.ends_with(" 16"), "{j}");
    assert!(
        j["evictions"].as_u64().unwrap() > 0 && j["misses"].as_u64().unwrap() > 0,
        "{j}"
    );
    assert_eq!(j["pcomponent"], c.components("pcomponent")[0]["id"]);
    let age = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - j["started_unix_s"].as_u64().unwrap();
    assert!(age < 120, "{j}");
    let pid = j["pid"].as_str().unwrap().to_string();
    // As the pComponent itself counts them.
    let stats = &c.components("pcomponent")[0]["stats"];
    assert!(stats["totals"]["evictions"].as_u64().unwrap() >= j["evictions"].as_u64().unwrap());

    // A tenant of the job's vNode sees it; a tenant of another sees nothing, and may not signal it.
    assert_eq!(
        json(&http(&api, "GET", "/api/v1/jobs", Some(&mine), b"").2)["jobs"][0]["pid"],
        pid.as_str()
    );
    assert_eq!(
        json(&http(&api, "GET", "/api/v1/jobs", Some(&other), b"").2)["jobs"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    let (code, _, body) = http(&api, "DELETE", &format!("/api/v1/jobs/{pid}"), Some(&other), b"");
    assert_eq!(code, 403, "{body}");
    for (path, want) in [
        (format!("/api/v1/jobs/{}", 12345u64), 404),
        ("/api/v1/jobs/not-a-pid".to_string(), 400),
        (format!("/api/v1/jobs/{pid}?signal=STOP"), 400),
    ] {
        assert_eq!(http(&api, "DELETE", &path, Some(&admin), b"").0, want, "{path}");
    }

    // `splitos ps` shows what the API shows, with root's own token of this cluster.
    let out = c.cmd(&["ps"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ps = text(&out.stdout);
    assert!(ps.contains("hold") && ps.contains("default"), "{ps}");
    // Its PID column is the process id on its host, as ps shows it; the cluster's id is in --json.
    let row = ps.lines().find(|l| l.contains("hold")).unwrap();
    assert_eq!(
        row.split_whitespace().next(),
        Some(j["os_pid"].to_string().as_str()),
        "{ps}"
    );
    assert!(!ps.contains(&pid), "{ps}");
    let out = c.cmd(&["ps", "--json", "--token", &other]).output().unwrap();
    assert_eq!(json(&text(&out.stdout))["jobs"].as_array().unwrap().len(), 0);
    let out = c.cmd(&["ps", "--token", "splitos_00_00"]).output().unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("401"),
        "{}",
        text(&out.stderr)
    );

    // The tenant whose job it is ends it.
    let (code, _, body) = http(
        &api,
        "DELETE",
        &format!("/api/v1/jobs/{pid}?signal=KILL"),
        Some(&mine),
        b"",
    );
    assert_eq!(code, 202, "{body}");
    let st = job.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert!(
        st.signal() == Some(libc::SIGKILL) || st.code() == Some(128 + libc::SIGKILL),
        "{st:?}"
    );
    assert!(c.eventually(Duration::from_secs(10), |_| json(
        &http(&api, "GET", "/api/v1/jobs", Some(&admin), b"").2
    )["jobs"]
        .as_array()
        .unwrap()
        .is_empty()));
}

#[test]
fn the_api_knob_turns_it_off_and_refuses_an_unspecified_address() {
    let c = TestCluster::up(Some("[cluster]\napi = \"off\"\n[[pcomponent]]\n[[mcomponent]]\n"));
    assert!(c.status()["api"].is_null(), "{}", c.status());
    assert!(!c.log("gm").contains("serving the REST API"));
    let out = c.cmd(&["ps"]).output().unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("no REST API known"),
        "{}",
        text(&out.stderr)
    );
    drop(c);

    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("c.toml");
    std::fs::write(
        &conf,
        "[cluster]\napi = \"0.0.0.0:0\"\n[[pcomponent]]\n[[mcomponent]]\n",
    )
    .unwrap();
    let out = std::process::Command::new(splitos())
        .args(["cluster", "up", "--config"])
        .arg(&conf)
        .env("SPLITOS_STATE_DIR", dir.path())
        .env("SPLITOS_DATA_DIR", dir.path().join("data"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "cluster up with the API on every interface");
    assert!(
        text(&out.stderr).contains("cluster.api") && text(&out.stderr).contains("\"0.0.0.0:0\" is not an address"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_api_beyond_loopback_serves_https_with_a_certificate_of_the_clusters_authority() {
    let h = Hosts::new(&["gm", "a"]);
    let at = |host: &str| format!("listen = \"{}:0\"\nnetns = \"{}\"\n", h.addr(host), h.netns(host));
    let cfg = format!(
        "[cluster]\ngm = \"{0}:0\"\napi = \"{0}:0\"\nnetns = \"{1}\"\n[[pcomponent]]\n{2}[[mcomponent]]\n{2}",
        h.addr("gm"),
        h.netns("gm"),
        at("a")
    );
    let c = TestCluster::up(Some(&cfg));
    let api = c.status()["api"].as_str().unwrap().to_string();
    assert!(api.starts_with(&format!("{}:", h.addr("gm"))), "{api}");
    assert!(
        c.log("gm").contains("scheme=\"https\"") || c.log("gm").contains("scheme=https"),
        "{}",
        c.log("gm")
    );
    // The operator's tools reach it across the (namespaces') network, trusting the
    // cluster's authority.
    let out = c.cmd(&["ps", "--json"]).output().unwrap();
    assert!(
        out.status.success() && json(&text(&out.stdout))["jobs"].is_array(),
        "{}",
        text(&out.stderr)
    );
    let token = std::fs::read_to_string(c.dir.path().join("admin.token")).unwrap();
    let ca = c.dir.path().join("ca.pem");
    let curl = |args: &[&str]| {
        std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                "-H",
                &format!("Authorization: Bearer {}", token.trim()),
            ])
            .args(args)
            .output()
            .unwrap()
    };
    let ok = curl(&[
        "--cacert",
        ca.to_str().unwrap(),
        &format!("https://{api}/api/v1/whoami"),
    ]);
    assert!(
        ok.status.success() && json(&text(&ok.stdout))["role"] == "admin",
        "{} {}",
        text(&ok.stdout),
        text(&ok.stderr)
    );
    // A client that trusts only the web's authorities refuses the certificate (curl exit 60)
    // before any token is sent; a plain HTTP request gets no HTTP answer.
    let untrusted = curl(&[&format!("https://{api}/api/v1/whoami")]);
    assert_eq!(untrusted.status.code(), Some(60), "{}", text(&untrusted.stderr));
    let plain = curl(&["-o", "/dev/null", "-w", "%{http_code}", &format!("http://{api}/livez")]);
    assert!(
        !plain.status.success() || text(&plain.stdout) == "000",
        "plain HTTP was answered: {}",
        text(&plain.stdout)
    );
    // Without the authority's certificate the CLI says where it looked.
    let out = c
        .cmd(&["ps"])
        .env("SPLITOS_CA", c.dir.path().join("missing.pem"))
        .output()
        .unwrap();
    assert!(
        !out.status.success() && text(&out.stderr).contains("missing.pem"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn vnodes_made_through_the_api_are_granted_at_once_and_refused_once_deleted() {
    let alice = 60011u32;
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[scomponent]]\n",
    ));
    let api = c.status()["api"].as_str().unwrap().to_string();
    let admin = api_token(&c, &["ops", "--admin"]);
    let lab_tenant = api_token(&c, &["lab-ci", "--vnode", "lab"]);
    let other_tenant = api_token(&c, &["other-ci", "--vnode", "other"]);
    let state = c.dir.path().to_str().unwrap().to_string();
    let env = [("SPLITOS_STATE_DIR", state.as_str())];
    let py = "/usr/bin/python3";
    let squares = "import os; x = [i * i for i in range(200000)]; print(os.getuid(), sum(x))";
    let native = as_user(alice, &[py, "-c", squares], &[]);
    assert!(native.status.success(), "{}", text(&native.stderr));
    let run_as_alice = || {
        as_user(
            alice,
            &[
                splitos().to_str().unwrap(),
                "run",
                "--vnode",
                "lab",
                "--",
                py,
                "-c",
                squares,
            ],
            &env,
        )
    };

    // Before the vNode is made, Alice is granted nothing.
    let out = run_as_alice();
    assert!(
        !out.status.success() && text(&out.stderr).contains("grants no vNode to this user"),
        "{}",
        text(&out.stderr)
    );

    // Bad bodies get a clear 4xx in JSON, and make nothing.
    let lab = br#"{"name": "lab", "users": ["60011"], "memory": "64M"}"#;
    for (content_type, body, code, why) in [
        ("text/plain", &lab[..], 415, "not JSON"),
        ("application/json", &b"{\"name\": "[..], 400, "malformed"),
        (
            "application/json",
            &br#"{"name": "lab", "colour": "red"}"#[..],
            422,
            "an unknown field",
        ),
        ("application/json", &br#"{"users": []}"#[..], 422, "no name"),
        ("application/json", &br#"{"name": "../up"}"#[..], 422, "a bad name"),
        (
            "application/json",
            &br#"{"name": "lab", "users": ["no-such-user-here"]}"#[..],
            422,
            "an unknown user",
        ),
        (
            "application/json",
            &br#"{"name": "lab", "memory": "1K"}"#[..],
            422,
            "a quota under a page",
        ),
    ] {
        let (got, _, body) = http_as(&api, "POST", "/api/v1/vnodes", Some(&admin), content_type, body);
        assert_eq!(got, code, "{why}: {body}");
        assert!(
            json(&body)["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{why}: {body}"
        );
    }
    let huge = format!(r#"{{"name": "lab", "users": ["{}"]}}"#, "x".repeat(100 << 10));
    assert_eq!(
        http(&api, "POST", "/api/v1/vnodes", Some(&admin), huge.as_bytes()).0,
        413
    );
    assert_eq!(
        http(&api, "POST", "/api/v1/vnodes", Some(&lab_tenant), lab).0,
        403,
        "a tenant makes no vNode"
    );
    assert_eq!(http(&api, "POST", "/api/v1/vnodes", None, lab).0, 401);
    assert!(
        json(&http(&api, "GET", "/api/v1/vnodes", Some(&admin), b"").2)
            .as_array()
            .unwrap()
            .is_empty(),
        "nothing was made"
    );

    // Made, once.
    let (code, _, body) = http(&api, "POST", "/api/v1/vnodes", Some(&admin), lab);
    assert_eq!(code, 201, "{body}");
    assert_eq!(
        json(&body),
        serde_json::json!({"name": "lab", "users": ["60011"], "groups": [], "memory_bytes": 64 << 20})
    );
    assert_eq!(http(&api, "POST", "/api/v1/vnodes", Some(&admin), lab).0, 409);

    // Each tenant sees its own; another's is 403 whether it exists or not, a missing one of
    // its own 404.
    let names = |t: &str| {
        json(&http(&api, "GET", "/api/v1/vnodes", Some(t), b"").2)
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        (names(&admin), names(&lab_tenant), names(&other_tenant)),
        (vec!["lab".to_string()], vec!["lab".to_string()], vec![])
    );
    assert_eq!(http(&api, "GET", "/api/v1/vnodes/lab", Some(&lab_tenant), b"").0, 200);
    assert_eq!(http(&api, "GET", "/api/v1/vnodes/lab", Some(&other_tenant), b"").0, 403);
    assert_eq!(
        http(&api, "GET", "/api/v1/vnodes/nowhere", Some(&lab_tenant), b"").0,
        403
    );
    assert_eq!(
        http(&api, "GET", "/api/v1/vnodes/other", Some(&other_tenant), b"").0,
        404
    );
    assert_eq!(
        http(&api, "DELETE", "/api/v1/vnodes/lab", Some(&lab_tenant), b"").0,
        403,
        "a tenant deletes no vNode"
    );

    // The pComponent grants it within a heartbeat: Alice runs python3 as herself on it, and
    // it prints what it prints natively.
    assert!(
        c.eventually(Duration::from_secs(5), |_| run_as_alice().status.success()),
        "{}",
        text(&run_as_alice().stderr)
    );
    let out = run_as_alice();
    assert_eq!(text(&out.stdout), text(&native.stdout), "{}", text(&out.stderr));

    // Not deleted while a job runs on it.
    let hold = program("hold");
    let mut job = c.spawn(&["--vnode", "lab"], &[hold.to_str().unwrap(), "4"]);
    assert_eq!(read_line(&mut job), "ready\n");
    let (code, _, body) = http(&api, "DELETE", "/api/v1/vnodes/lab", Some(&admin), b"");
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("1 job(s) run on vNode"), "{body}");
    let jobs = json(&http(&api, "GET", "/api/v1/jobs", Some(&admin), b"").2);
    let pid = jobs["jobs"][0]["pid"].as_str().unwrap().to_string();
    assert_eq!(
        http(
            &api,
            "DELETE",
            &format!("/api/v1/jobs/{pid}?signal=KILL"),
            Some(&admin),
            b""
        )
        .0,
        202
    );
    let _ = job.wait();
    assert!(c.eventually(Duration::from_secs(10), |_| http(
        &api,
        "DELETE",
        "/api/v1/vnodes/lab",
        Some(&admin),
        b""
    )
    .0 == 204));
    assert_eq!(http(&api, "GET", "/api/v1/vnodes/lab", Some(&admin), b"").0, 404);

    // Deleted, it is root's alone again.
    assert!(c.eventually(Duration::from_secs(5), |_| !run_as_alice().status.success()));
    let out = run_as_alice();
    assert!(
        text(&out.stderr).contains("grants no vNode to this user"),
        "{}",
        text(&out.stderr)
    );
}

/// The threads of process `pid`.
fn threads(pid: i32) -> usize {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn slow_clients_and_floods_hold_bounded_resources_and_the_api_keeps_serving() {
    use std::io::{Read, Write};
    let c = TestCluster::up(None);
    let status = c.status();
    let api = status["api"].as_str().unwrap().to_string();
    let gm = c.pid_of_addr(status["gm"].as_str().unwrap());
    let admin = api_token(&c, &["ops", "--admin"]);
    assert_eq!(http(&api, "GET", "/api/v1/whoami", Some(&admin), b"").0, 200);
    let before = threads(gm);

    // 300 clients of one peer (root on this host) that send half a request's headers and
    // stall: the peer's 64 are served (and wait for the rest), those beyond are closed at once.
    let stalled: Vec<std::net::TcpStream> = (0..300)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(&api).unwrap();
            s.write_all(b"GET /api/v1/whoami HTTP/1.1\r\nHost: x\r\n").unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // Whether the server closed a connection within `wait`.
    let closed = |mut s: &std::net::TcpStream, wait: Duration| {
        s.set_read_timeout(Some(wait)).unwrap();
        match s.read(&mut [0u8; 64]) {
            Ok(0) => true,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
            Ok(_) => false,
        }
    };
    let early = stalled[64..]
        .iter()
        .filter(|s| closed(s, Duration::from_millis(200)))
        .count();
    assert_eq!(early, 236, "connections beyond the peer's 64 are closed at once");
    assert_eq!(
        stalled[..64]
            .iter()
            .filter(|s| closed(s, Duration::from_millis(10)))
            .count(),
        0,
        "the first 64 wait for the rest of their headers"
    );
    assert!(
        threads(gm) <= before + 4,
        "threads: {before} before, {} with 300 clients",
        threads(gm)
    );

    // While they stall, a new client of that peer is closed at once; once their headers' time
    // (10 s) is up they are closed, and the API serves it again.
    let livez = || {
        let Ok(mut s) = std::net::TcpStream::connect(&api) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ = s.write_all(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.starts_with("HTTP/1.1 200")
    };
    let t0 = std::time::Instant::now();
    assert!(!livez(), "no slot of the peer is free");
    assert!(c.eventually(Duration::from_secs(20), |_| livez()));
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "served again after {:?}",
        t0.elapsed()
    );
    assert_eq!(
        stalled[..64]
            .iter()
            .filter(|s| closed(s, Duration::from_secs(5)))
            .count(),
        64,
        "every stalled client was closed"
    );
    drop(stalled);

    // A body that never arrives whole: 408 once the body's time (10 s) is up, in JSON.
    let mut s = std::net::TcpStream::connect(&api).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let head = format!("POST /api/v1/vnodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {admin}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(b"{\"name\":").unwrap();
    let t0 = std::time::Instant::now();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    assert!(
        answer.starts_with("HTTP/1.1 408") && answer.contains("did not arrive within"),
        "{answer}"
    );
    assert!(t0.elapsed() >= Duration::from_secs(9), "{:?}", t0.elapsed());

    // A flood of bad tokens from 8 clients at once: each gets 401, the log holds a bounded
    // number of lines about them, and an admin is served afterwards.
    let floods: Vec<_> = (0..8)
        .map(|_| {
            let api = api.clone();
            std::thread::spawn(move || {
                (0..250)
                    .filter(|_| {
                        http(
                            &api,
                            "GET",
                            "/api/v1/components",
                            Some("splitos_0000000000000000_00"),
                            b"",
                        )
                        .0 == 401
                    })
                    .count()
            })
        })
        .collect();
    let refused: usize = floods.into_iter().map(|f| f.join().unwrap()).sum();
    assert_eq!(refused, 2000);
    assert_eq!(http(&api, "GET", "/api/v1/components", Some(&admin), b"").0, 200);
    let logged = c
        .log("gm")
        .lines()
        .filter(|l| l.contains("API request refused") || l.contains("API requests refused"))
        .count();
    assert!(logged <= 30, "{logged} log lines for 2000 refusals");
    assert!(
        threads(gm) <= before + 4,
        "threads: {before} before, {} after the flood",
        threads(gm)
    );
}

/// A server at `127.0.0.1:0` run as `nobody` that writes whatever reaches it to its stdout;
/// prints its port first.
const LISTEN_AS_NOBODY: &str = r#"
import socket, sys
l = socket.socket()
l.bind(("127.0.0.1", 0))
l.listen()
print(l.getsockname()[1], flush=True)
while True:
    c, _ = l.accept()
    c.settimeout(2)
    try:
        print(repr(c.recv(4096)), flush=True)
    except OSError:
        pass
    c.close()
"#;

#[test]
fn the_tools_send_a_token_only_to_a_manager_whatever_holds_an_address_they_keep() {
    use std::io::{BufRead, Read, Write};
    let c = TestCluster::up(None);
    let api = c.status()["api"].as_str().unwrap().to_string();
    // Every answer of a manager says so, a refusal as much as the liveness probe.
    for (path, code) in [("/livez", 200), ("/api/v1/jobs", 401), ("/nowhere", 404)] {
        let (status, head, _) = http(&api, "GET", path, None, b"");
        assert_eq!(status, code, "{path}");
        assert!(head.to_lowercase().contains("splitos-manager: "), "{path}: {head}");
    }

    // Another user binds a port, as it could the one a dead manager served at: the tools ask
    // it nothing, and go on to the manager after it.
    let mut nobody = std::process::Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
        ])
        .arg(LISTEN_AS_NOBODY)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(nobody.stdout.take().unwrap());
    let mut port = String::new();
    out.read_line(&mut port).unwrap();
    let theirs = format!("127.0.0.1:{}", port.trim());
    // A server of root's that is no manager (one that took such a port, or any other): it
    // gets the request, and its answer is not read as the cluster's.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let foreign = other.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for s in other.incoming().flatten() {
            let mut s = s;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });

    let both = format!("{theirs},{foreign},{api}");
    let ps = c.cmd(&["ps", "--api", &both]).output().unwrap();
    assert!(ps.status.success(), "{}", text(&ps.stderr));
    assert!(text(&ps.stdout).contains("PID"), "{}", text(&ps.stdout));
    let alone = c.cmd(&["ps", "--api", &theirs]).output().unwrap();
    assert!(!alone.status.success());
    assert!(
        text(&alone.stderr).contains("uid 65534, which runs no global manager"),
        "{}",
        text(&alone.stderr)
    );
    let foreign_only = c.cmd(&["ps", "--api", &foreign]).output().unwrap();
    assert!(!foreign_only.status.success());
    assert!(
        text(&foreign_only.stderr).contains("answered 404 Not Found as no global manager does"),
        "{}",
        text(&foreign_only.stderr)
    );

    // SAFETY: kill(2) takes no pointers; the child is this test's own.
    unsafe { libc::kill(nobody.id() as i32, libc::SIGKILL) };
    nobody.wait().unwrap();
    let mut heard = String::new();
    out.read_to_string(&mut heard).unwrap();
    assert!(heard.is_empty(), "nobody's server was sent: {heard}");
}
