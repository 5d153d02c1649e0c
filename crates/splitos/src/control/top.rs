//! `splitos top`: the cluster live in a terminal, through the REST API: its components (load,
//! memory, cordons) and its jobs with their ExCache misses, evictions and write-backs per
//! second, from the change of their counters between two looks.
use std::collections::HashMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use comfy_table::Table;

use super::{api_access, api_get, human, ApiArgs};

/// A job's counters at one look.
#[derive(Clone, Copy)]
struct Counts {
    misses: u64,
    evictions: u64,
    writebacks: u64,
}

fn counts(j: &serde_json::Value) -> Counts {
    let n = |k: &str| j[k].as_u64().unwrap_or(0);
    Counts {
        misses: n("misses"),
        evictions: n("evictions"),
        writebacks: n("writebacks"),
    }
}

/// Shows the cluster every `interval`, `frames` times (forever: none). On a terminal each
/// frame replaces the last; elsewhere frames follow one another.
pub fn top(a: ApiArgs, interval: Duration, frames: Option<u64>) -> anyhow::Result<()> {
    let (api, token) = api_access(a)?;
    let tty = std::io::stdout().is_terminal();
    let mut before: HashMap<String, (Instant, Counts)> = HashMap::new();
    let mut shown = 0;
    loop {
        let at = Instant::now();
        let comps = api_get(&api, &token, "/api/v1/components");
        let jobs = api_get(&api, &token, "/api/v1/jobs")?;
        let mut out = String::new();
        if tty {
            out.push_str("\x1b[H\x1b[2J");
        }
        out.push_str(&format!("splitos top: {api}, every {:.1} s\n", interval.as_secs_f64()));
        // A tenant's token sees its jobs, not the components.
        if let Ok(comps) = comps {
            let mut t = Table::new();
            t.load_preset(comfy_table::presets::NOTHING);
            t.set_header([
                "ID",
                "ROLE",
                "ADDRESS",
                "STATE",
                "PROCS",
                "THREADS",
                "USED",
                "COMMITTED",
                "CAPACITY",
            ]);
            for c in comps.as_array().into_iter().flatten() {
                let state = match (c["alive"].as_bool(), c["lost"].as_bool(), c["cordoned"].as_bool()) {
                    (Some(true), _, Some(true)) => "cordoned",
                    (Some(true), _, _) => "up",
                    (_, Some(true), _) => "LOST",
                    _ => "late",
                };
                let bytes = |k: &str| human(c[k].as_u64().unwrap_or(0));
                t.add_row([
                    c["id"].to_string(),
                    c["role"].as_str().unwrap_or("?").to_string(),
                    c["addr"].as_str().unwrap_or("?").to_string(),
                    state.to_string(),
                    c["processes"].to_string(),
                    c["threads"].to_string(),
                    bytes("used_bytes"),
                    bytes("committed_bytes"),
                    bytes("capacity_bytes"),
                ]);
            }
            out.push_str(&format!("{t}\n\n"));
        }
        let mut t = Table::new();
        t.load_preset(comfy_table::presets::NOTHING);
        t.set_header([
            "PID",
            "USER",
            "VNODE",
            "PCOMP",
            "MISSES/S",
            "EVICTIONS/S",
            "WRITEBACKS/S",
            "MISSES",
            "COMMAND",
        ]);
        let mut now = HashMap::new();
        for j in jobs["jobs"].as_array().into_iter().flatten() {
            let pid = j["pid"].as_str().unwrap_or("?").to_string();
            let c = counts(j);
            // A rate needs two looks at the job: the first shows none.
            let rate = |f: fn(&Counts) -> u64| match before.get(&pid) {
                Some((t0, c0)) => format!(
                    "{:.0}",
                    f(&c).saturating_sub(f(c0)) as f64 / at.duration_since(*t0).as_secs_f64().max(1e-3)
                ),
                None => "-".to_string(),
            };
            let cmd = j["command"].as_str().unwrap_or("");
            t.add_row([
                j["os_pid"].to_string(),
                j["user"].as_str().unwrap_or("?").to_string(),
                j["vnode"].as_str().unwrap_or("?").to_string(),
                j["pcomponent"].to_string(),
                rate(|c| c.misses),
                rate(|c| c.evictions),
                rate(|c| c.writebacks),
                c.misses.to_string(),
                if cmd.chars().count() > 50 {
                    format!("{}...", cmd.chars().take(47).collect::<String>())
                } else {
                    cmd.to_string()
                },
            ]);
            now.insert(pid, (at, c));
        }
        out.push_str(&format!("{} job(s)\n{t}\n", now.len()));
        if !tty {
            out.push('\n');
        }
        crate::out!("{out}");
        before = now;
        shown += 1;
        if frames.is_some_and(|n| shown >= n) {
            return Ok(());
        }
        std::thread::sleep(interval.saturating_sub(at.elapsed()));
    }
}
