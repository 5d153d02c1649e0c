//! The live dashboard (docs/control-plane.md, "Dashboard"): a real headless Chromium, driven
//! over the DevTools protocol, opens the page a cluster's API serves, is told 401 for a bad
//! token, signs in as the admin and sees a running program's misses per second, the components
//! with their roles, the mComponents' memory and the topology; tenants see their own vNode's
//! jobs and nothing of the components. The event stream behind it is bounded: at most
//! `MAX_STREAMS` at once (`MAX_STREAMS_PER_TOKEN` per token), each ending when its client goes away or its token is revoked.
//!
//! `SPLITOS_SCREENSHOT=docs/dashboard.png` (relative to the workspace) keeps the screenshot the
//! test takes; without it, it goes to the test's temporary directory.
use crate::common;
use std::io::{BufRead, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// The Chromium that scripts/setup.sh installs (Debian's headless shell, or the full browser).
fn chromium_executable() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["chromium-headless-shell", "chromium"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|p| p.is_file())
        .expect("chromium-headless-shell or chromium on PATH (Debian's, which scripts/setup.sh installs)")
}

/// Headless Chromium with its DevTools endpoint on loopback, a fresh profile in a temporary
/// directory, and everything that would reach beyond the machine turned off. It runs in a
/// process group of its own, killed whole by its id when this is dropped, also when the test
/// fails.
struct Chromium {
    child: Child,
    /// The browser's DevTools websocket.
    ws: String,
    stderr: Arc<Mutex<String>>,
    _profile: tempfile::TempDir,
}

impl Chromium {
    fn start() -> Chromium {
        use std::os::unix::process::CommandExt;
        let profile = tempfile::Builder::new().prefix("splitos-chromium-").tempdir().unwrap();
        let mut cmd = Command::new(chromium_executable());
        cmd.args([
            "--headless",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--no-proxy-server",
            // Nothing but the loopback API resolves: no request can leave the machine.
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-breakpad",
            "--disable-domain-reliability",
            "--disable-client-side-phishing-detection",
            "--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication,CertificateTransparencyComponentUpdater",
            "--metrics-recording-only",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--window-size=1440,1000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()));
        // SAFETY: geteuid(2) takes nothing and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // Chromium's sandbox refuses to run as root; the page it loads is the test's own.
            cmd.arg("--no-sandbox");
        }
        let mut child = cmd
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        // Read its stderr to the end (a full pipe would stall it), handing over the line that
        // names the DevTools endpoint.
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let (pipe, log) = (child.stderr.take().unwrap(), stderr.clone());
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                if let Some(ws) = line.strip_prefix("DevTools listening on ") {
                    let _ = tx.send(ws.trim().to_string());
                }
                log.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let ws = rx.recv_timeout(Duration::from_secs(30));
        let c = Chromium {
            child,
            ws: ws.clone().unwrap_or_default(),
            stderr,
            _profile: profile,
        };
        assert!(
            ws.is_ok(),
            "Chromium named no DevTools endpoint within 30 s: {}",
            c.stderr.lock().unwrap()
        );
        assert!(c.ws.starts_with("ws://127.0.0.1:"), "{}", c.ws);
        c
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        // SAFETY: kill(2) takes no pointers; the group is Chromium's own (process_group(0)),
        // and its leader is our unreaped child, so the id names no other process.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// One page of the browser, driven over the DevTools protocol (as much of it as the test needs):
/// a target attached in flat mode, whose commands carry its session id, each answered by the
/// reply with its id; events in between are passed over. Input goes through `Input.*`, as a
/// user's clicks and keys do, not through scripts.
struct Tab {
    ws: std::cell::RefCell<WebSocket<MaybeTlsStream<std::net::TcpStream>>>,
    session: String,
    next: std::cell::Cell<u64>,
}

impl Tab {
    fn open(browser: &str) -> Tab {
        let (ws, _) = tungstenite::connect(browser).unwrap_or_else(|e| panic!("DevTools at {browser}: {e}"));
        if let MaybeTlsStream::Plain(s) = ws.get_ref() {
            // A browser that stops answering fails the test instead of hanging it.
            s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        }
        let mut tab = Tab {
            ws: std::cell::RefCell::new(ws),
            session: String::new(),
            next: std::cell::Cell::new(0),
        };
        let target = tab.call("Target.createTarget", json!({"url": "about:blank"}))["targetId"].clone();
        tab.session = tab.call("Target.attachToTarget", json!({"targetId": target, "flatten": true}))["sessionId"]
            .as_str()
            .unwrap()
            .to_string();
        tab
    }

    fn call(&self, method: &str, params: serde_json::Value) -> serde_json::Value {
        let id = self.next.get() + 1;
        self.next.set(id);
        let mut msg = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            msg["sessionId"] = self.session.clone().into();
        }
        let mut ws = self.ws.borrow_mut();
        ws.send(Message::text(msg.to_string()))
            .unwrap_or_else(|e| panic!("{method}: {e}"));
        loop {
            let m = ws.read().unwrap_or_else(|e| panic!("{method}: {e}"));
            let Ok(text) = m.to_text() else { continue };
            let reply = json(text);
            if reply["id"] != id {
                continue;
            }
            if let Some(e) = reply.get("error") {
                panic!("{method}: {e}");
            }
            return reply["result"].clone();
        }
    }

    /// Loads `url` and waits until the page and its scripts have loaded.
    fn navigate(&self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }));
        until(self, "the page loaded", 30, || {
            let state = self.evaluate("document.readyState === 'complete' && location.href !== 'about:blank'");
            state.as_bool().filter(|v| *v)
        });
    }

    /// The value of a JavaScript expression in the page; an exception fails the test.
    fn evaluate(&self, expr: &str) -> serde_json::Value {
        let r = self.call("Runtime.evaluate", json!({"expression": expr, "returnByValue": true}));
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expr}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// Clicks the middle of the element `selector` names, once it is there.
    fn click(&self, selector: &str) {
        let at = until(self, selector, 10, || {
            let box_ = self.evaluate(&format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return null; e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); return r.width > 0 ? [r.x + r.width / 2, r.y + r.height / 2] : null; }})()",
                json!(selector)
            ));
            box_.as_array()
                .map(|xy| (xy[0].as_f64().unwrap(), xy[1].as_f64().unwrap()))
        });
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": at.0, "y": at.1, "button": "left", "clickCount": 1}),
            );
        }
    }

    /// Text as a paste gives it: typing key by key takes long for a token.
    fn insert_text(&self, text: &str) {
        self.call("Input.insertText", json!({ "text": text }));
    }

    fn press_enter(&self) {
        for kind in ["keyDown", "keyUp"] {
            self.call(
                "Input.dispatchKeyEvent",
                json!({"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "nativeVirtualKeyCode": 13, "text": "\r"}),
            );
        }
    }
}

/// A program run on the cluster, killed when dropped (the cluster's teardown ends the rest).
struct Job(Child);

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// What `expr` (a JavaScript expression whose value is a string of JSON) says in the page.
fn eval(tab: &Tab, expr: &str) -> serde_json::Value {
    let v = tab.evaluate(&format!("JSON.stringify({expr})"));
    json(v.as_str().unwrap_or("null"))
}

/// Waits until `f` returns something, for at most `secs`; fails saying `what`, with what the
/// page showed last.
fn until<T>(tab: &Tab, what: &str, secs: u64, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if t0.elapsed() > Duration::from_secs(secs) {
            panic!(
                "{what}: not within {secs} s; the page shows:\n{}",
                eval(tab, "document.body.innerText")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn sign_in(tab: &Tab, token: &str) {
    until(tab, "the sign-in form", 10, || {
        eval(tab, "!document.getElementById('login').hidden")
            .as_bool()
            .filter(|v| *v)
    });
    tab.click("#token");
    tab.insert_text(token);
    tab.press_enter();
}

fn sign_out(tab: &Tab) {
    tab.click("#logout");
    until(tab, "signed out", 10, || {
        eval(
            tab,
            "!document.getElementById('login').hidden && sessionStorage.length === 0",
        )
        .as_bool()
        .filter(|v| *v)
    });
}

/// The rows of the jobs table: pid, vNode, command, misses per second.
fn jobs_shown(tab: &Tab) -> Vec<(String, String, String, f64)> {
    let rows = eval(tab, "[...document.querySelectorAll('#jobs tr[data-pid]')].map(r => [r.dataset.pid, r.dataset.vnode, r.querySelector('.cmd').textContent, Number(r.querySelector('.mps').dataset.value || 0)])");
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_str().unwrap().into(),
                r[1].as_str().unwrap().into(),
                r[2].as_str().unwrap().into(),
                r[3].as_f64().unwrap(),
            )
        })
        .collect()
}

/// The event streams the global managers hold open, from their metrics.
fn open_streams(api: &str, admin: &str) -> f64 {
    let (code, _, body) = http(api, "GET", "/metrics", Some(admin), b"");
    assert_eq!(code, 200, "{body}");
    body.lines()
        .filter(|l| l.starts_with("splitos_gm_api_event_streams{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// A PNG of the whole page.
fn screenshot(tab: &Tab) -> Vec<u8> {
    use base64::Engine;
    let height = eval(tab, "document.documentElement.scrollHeight").as_f64().unwrap();
    let shot = tab.call(
        "Page.captureScreenshot",
        json!({"format": "png", "clip": {"x": 0, "y": 0, "width": 1440, "height": height, "scale": 1}, "fromSurface": true, "captureBeyondViewport": true}),
    );
    base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().unwrap())
        .unwrap()
}

#[test]
fn a_browser_signs_in_and_sees_a_running_program_live_and_tenants_only_their_own() {
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\n[[mcomponent]]\n[[scomponent]]\n",
    ));
    let api = c.status()["api"].as_str().unwrap().to_string();
    let admin = api_token(&c, &["ops", "--admin"]);
    let lab = api_token(&c, &["lab-ci", "--vnode", "lab"]);
    let other = api_token(&c, &["other-ci", "--vnode", "other"]);
    let (code, _, body) = http(
        &api,
        "POST",
        "/api/v1/vnodes",
        Some(&admin),
        br#"{"name": "lab", "memory": "256M"}"#,
    );
    assert_eq!(code, 201, "{body}");
    // 8 MiB in random order through a 4 MiB ExCache, a round every 100 ms or so, for much
    // longer than the test: it misses all along, at a pace that leaves other tests their CPUs.
    // Started from the cluster's directory, so that the command line it shows (and the
    // screenshot) names no test directory.
    std::fs::copy(program("randpages"), c.dir.path().join("randpages")).unwrap();
    let mut run = c.cmd(&["run", "--vnode", "lab", "--", "./randpages", "8", "100000", "100"]);
    let mut job = Job(run
        .current_dir(c.dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap());
    let pid = until_listed(&c, &api, &admin, &mut job);

    let chromium = Chromium::start();
    let tab = Tab::open(&chromium.ws);
    tab.navigate(&format!("http://{api}/dashboard"));

    // A token that was never issued: the 401, in words, and still the sign-in form.
    sign_in(&tab, "splitos_0000000000000000_00");
    let said = until(&tab, "the 401 of a bad token", 10, || {
        eval(&tab, "document.getElementById('login-error').textContent")
            .as_str()
            .filter(|t| t.contains("401"))
            .map(str::to_string)
    });
    assert!(said.contains("not a valid token"), "{said}");
    assert_eq!(eval(&tab, "sessionStorage.length"), 0, "a refused token is not kept");

    // The admin: the program live, with its misses per second.
    sign_in(&tab, &admin);
    let (_, vnode, command, _) = until(&tab, "the program's misses per second", 30, || {
        jobs_shown(&tab).into_iter().find(|j| j.0 == pid && j.3 > 0.0)
    });
    assert_eq!(vnode, "lab");
    assert_eq!(command, "./randpages 8 100000 100");
    // Its PID column is the process id on its host, as ps shows it, not the cluster's id.
    let os_pid = json(&http(&api, "GET", "/api/v1/jobs", Some(&admin), b"").2)["jobs"][0]["os_pid"].to_string();
    assert_eq!(
        eval(
            &tab,
            &format!("document.querySelector('#jobs tr[data-pid=\"{pid}\"] td').textContent")
        ),
        os_pid.as_str()
    );
    assert_eq!(eval(&tab, "document.getElementById('conn').textContent"), "live");
    assert!(eval(&tab, "document.getElementById('updated').textContent")
        .as_str()
        .unwrap()
        .starts_with("last update "));
    // The token is kept in the tab's session storage, never in its address.
    assert_eq!(
        eval(&tab, "sessionStorage.getItem('splitos-dashboard-token')"),
        admin.as_str()
    );
    assert!(!eval(&tab, "location.href").as_str().unwrap().contains(&admin[8..]));

    // Every component, with its role and state, as the API lists them.
    let (_, _, body) = http(&api, "GET", "/api/v1/components", Some(&admin), b"");
    let mut want: Vec<(String, String)> = json(&body)
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].to_string(), c["role"].as_str().unwrap().to_string()))
        .collect();
    want.sort();
    let rows = eval(&tab, "[...document.querySelectorAll('#components tr[data-role]')].map(r => [r.dataset.id, r.dataset.role, r.dataset.state])");
    let mut shown: Vec<(String, String)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_str().unwrap().to_string()))
        .collect();
    shown.sort();
    assert_eq!(shown, want);
    assert!(rows.as_array().unwrap().iter().all(|r| r[2] == "alive"), "{rows}");
    let roles: Vec<&str> = shown.iter().map(|(_, r)| r.as_str()).collect();
    assert_eq!(
        (
            roles.iter().filter(|r| **r == "pcomponent").count(),
            roles.iter().filter(|r| **r == "mcomponent").count()
        ),
        (1, 2),
        "{roles:?}"
    );
    // A memory bar per mComponent; the vNode's quota and what it maps; the topology with a
    // circle per component.
    assert_eq!(eval(&tab, "document.querySelectorAll('#memory .mem').length"), 2);
    let lab_row = eval(&tab, "document.querySelector('#vnodes tr[data-vnode=lab]').textContent");
    assert!(lab_row.as_str().unwrap().contains("of 256 MiB"), "{lab_row}");
    for (id, _) in &want {
        let drawn = eval(
            &tab,
            &format!("!!document.querySelector('#topology g[data-id=\"component:{id}\"] circle')"),
        );
        assert_eq!(drawn, true, "component {id} in the topology");
    }

    // A few more seconds of misses for the sparkline, then the picture.
    std::thread::sleep(Duration::from_secs(6));
    let png = screenshot(&tab);
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 30_000,
        "a PNG of {} bytes",
        png.len()
    );
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert!(w == 1440 && h >= 800, "{w}x{h}");
    let out = match std::env::var_os("SPLITOS_SCREENSHOT") {
        Some(p) => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p),
        None => c.dir.path().join("dashboard.png"),
    };
    std::fs::write(&out, &png).unwrap();

    // Signed out, the stream ends: the managers hold none open.
    sign_out(&tab);
    assert!(
        c.eventually(Duration::from_secs(5), |_| open_streams(&api, &admin) == 0.0),
        "streams open after signing out: {}",
        open_streams(&api, &admin)
    );

    // Nothing the admin was shown stays in the page for whoever signs in next.
    assert_eq!(jobs_shown(&tab), vec![], "the admin's jobs are gone with the admin");
    assert_eq!(
        eval(
            &tab,
            "[...document.querySelectorAll('#components tbody tr, #memory *, #topology *')].length"
        ),
        0
    );

    // The tenant of the program's vNode sees it, and nothing of the components.
    sign_in(&tab, &lab);
    until(&tab, "the tenant's job", 30, || {
        jobs_shown(&tab).into_iter().find(|j| j.0 == pid && j.3 > 0.0)
    });
    assert_eq!(
        eval(&tab, "document.getElementById('who').textContent"),
        "lab-ci · tenant of lab"
    );
    assert_eq!(
        eval(
            &tab,
            "['components-card', 'memory-card', 'topology-card'].map(id => document.getElementById(id).hidden)"
        ),
        serde_json::json!([true, true, true])
    );
    sign_out(&tab);

    // Another tenant sees no job, and not the vNode.
    sign_in(&tab, &other);
    until(&tab, "the other tenant's view", 30, || {
        eval(&tab, "document.getElementById('conn').textContent === 'live'")
            .as_bool()
            .filter(|v| *v)
    });
    assert!(jobs_shown(&tab).is_empty(), "{:?}", jobs_shown(&tab));
    assert_eq!(
        eval(&tab, "document.querySelectorAll('#vnodes tr[data-vnode]').length"),
        0
    );

    let (code, _, body) = http(
        &api,
        "DELETE",
        &format!("/api/v1/jobs/{pid}?signal=KILL"),
        Some(&admin),
        b"",
    );
    assert_eq!(code, 202, "{body}");
    let _ = job.0.wait();
}

/// Waits until the API lists the job `splitos run` started; returns its pid.
fn until_listed(c: &TestCluster, api: &str, admin: &str, job: &mut Job) -> String {
    let mut pid = None;
    let listed = c.eventually(Duration::from_secs(30), |_| {
        pid = json(&http(api, "GET", "/api/v1/jobs", Some(admin), b"").2)["jobs"][0]["pid"]
            .as_str()
            .map(str::to_string);
        pid.is_some()
    });
    if !listed {
        let _ = job.0.kill();
        let mut err = String::new();
        let _ = job.0.stderr.take().unwrap().read_to_string(&mut err);
        panic!("the job was never listed: {err}");
    }
    pid.unwrap()
}

/// An event stream opened over a connection of its own; its status and the connection.
fn open_stream(api: &str, token: &str) -> (u16, std::io::BufReader<std::net::TcpStream>) {
    let mut s = std::net::TcpStream::connect(api).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // HTTP/1.0: the body is the rest of the connection, not chunks.
    s.write_all(
        format!("GET /api/v1/events HTTP/1.0\r\nHost: {api}\r\nAuthorization: Bearer {token}\r\n\r\n").as_bytes(),
    )
    .unwrap();
    let mut r = std::io::BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    let code = status
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {status:?}"));
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
    }
    (code, r)
}

/// The next event of a stream: its name and data; `None` once the stream has ended.
fn next_event(r: &mut impl BufRead) -> Option<(String, serde_json::Value)> {
    let (mut event, mut data) = (String::new(), String::new());
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        match line.trim_end_matches('\n') {
            "" if !data.is_empty() => return Some((event, json(&data))),
            l => {
                if let Some(e) = l.strip_prefix("event: ") {
                    event = e.to_string();
                } else if let Some(d) = l.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
        }
    }
}

#[test]
fn event_streams_are_bounded_and_end_with_their_client_or_their_token() {
    let c = TestCluster::up(None);
    let api = c.status()["api"].as_str().unwrap().to_string();
    let admin = api_token(&c, &["ops", "--admin"]);
    let tenant = api_token(&c, &["lab-ci", "--vnode", "lab"]);

    // The page is public, holds no data, and may run only its own script.
    for path in ["/", "/dashboard"] {
        let (code, head, body) = http(&api, "GET", path, None, b"");
        assert_eq!(code, 200, "{path}");
        assert!(
            head.contains("content-type: text/html")
                && head.contains("content-security-policy: default-src 'none'; script-src 'sha256-"),
            "{head}"
        );
        assert!(
            body.contains("<form id=\"login-form\"") && !body.contains("splitos_0"),
            "{path}"
        );
    }
    let (code, _, body) = http(&api, "GET", "/api/v1/events", None, b"");
    assert_eq!(code, 401, "{body}");
    assert!(json(&body)["error"].is_string());

    // A tenant's stream: snapshots a second apart, without components or topology; revoking
    // its token ends it with a 401 event.
    let (code, mut tenant_stream) = open_stream(&api, &tenant);
    assert_eq!(code, 200);
    let (event, first) = next_event(&mut tenant_stream).unwrap();
    assert_eq!(event, "snapshot", "{first}");
    assert_eq!(
        (first["whoami"]["role"].as_str(), first["period_ms"].as_u64()),
        (Some("tenant"), Some(1000)),
        "{first}"
    );
    assert!(
        first["components"].is_null() && first["topology"].is_null() && first["jobs"].as_array().unwrap().is_empty(),
        "{first}"
    );
    let (_, second) = next_event(&mut tenant_stream).unwrap();
    let apart = second["time_unix_ms"].as_u64().unwrap() - first["time_unix_ms"].as_u64().unwrap();
    assert!((500..=2500).contains(&apart), "snapshots {apart} ms apart");
    let out = c.cmd(&["cluster", "token", "revoke", "lab-ci"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ended = loop {
        match next_event(&mut tenant_stream) {
            Some((e, _)) if e == "snapshot" => continue,
            other => break other,
        }
    };
    let (event, data) = ended.expect("an error event before the end");
    assert_eq!(
        (event.as_str(), data["status"].as_u64()),
        ("error", Some(401)),
        "{data}"
    );
    assert!(
        next_event(&mut tenant_stream).is_none(),
        "the stream ends after its error"
    );

    // At most 4 streams per token, and 32 at once; one more is refused in JSON, and once
    // their clients go away the managers hold none and serve a new one.
    let tokens: Vec<String> = (0..8)
        .map(|i| api_token(&c, &[&format!("screen-{i}"), "--admin"]))
        .collect();
    let mut streams: Vec<_> = (0..4).map(|_| open_stream(&api, &tokens[0])).collect();
    let (code, _, body) = http(&api, "GET", "/api/v1/events", Some(&tokens[0]), b"");
    assert_eq!(code, 429, "{body}");
    assert!(
        json(&body)["error"].as_str().unwrap().contains("4 event streams"),
        "{body}"
    );
    streams.extend(
        tokens[1..]
            .iter()
            .flat_map(|t| (0..4).map(|_| open_stream(&api, t)).collect::<Vec<_>>()),
    );
    assert!(streams.iter().all(|(code, _)| *code == 200));
    assert_eq!(open_streams(&api, &admin), 32.0);
    let (code, _, body) = http(&api, "GET", "/api/v1/events", Some(&admin), b"");
    assert_eq!(code, 503, "{body}");
    assert!(
        json(&body)["error"].as_str().unwrap().contains("32 event streams"),
        "{body}"
    );
    assert_eq!(
        http(&api, "GET", "/api/v1/whoami", Some(&admin), b"").0,
        200,
        "other requests are served meanwhile"
    );
    drop(streams);
    assert!(
        c.eventually(Duration::from_secs(5), |_| open_streams(&api, &admin) == 0.0),
        "streams still open: {}",
        open_streams(&api, &admin)
    );
    let (code, mut again) = open_stream(&api, &admin);
    assert_eq!(code, 200);
    let (_, snap) = next_event(&mut again).unwrap();
    assert!(
        snap["components"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["role"] == "pcomponent"),
        "{snap}"
    );
}
