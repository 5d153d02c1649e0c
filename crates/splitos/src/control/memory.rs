//! `splitos memory`: attach and detach mComponents of a running cluster through the REST API
//! (docs/elastic-memory.md), `cluster drain` of an mComponent, `cluster set-excache` and
//! `cluster set-policy`.
use std::time::{Duration, Instant};

use splitos_rpc::{PolicyState, SetPolicy};

use super::{api_access, api_get, api_post, api_put, human, ApiArgs};
use crate::config::Size;

/// `memory list`: every mComponent, its state and, while it leaves, its progress.
pub fn list(a: ApiArgs, json: bool) -> anyhow::Result<()> {
    let (api, token) = api_access(a)?;
    let all = api_get(&api, &token, "/api/v1/memory")?;
    if json {
        crate::outln!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    crate::outln!("{}", table(&all));
    Ok(())
}

/// The mComponents as a table, its columns as wide as their widest cell.
fn table(all: &serde_json::Value) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t.set_header(["ID", "ADDRESS", "STATE", "CAPACITY", "USED", "PROGRESS"]);
    for m in all.as_array().into_iter().flatten() {
        let u = |k: &str| m[k].as_u64().unwrap_or(0);
        let progress = m["leaving"]
            .as_object()
            .map(|_| progress(&m["leaving"]))
            .unwrap_or_default();
        t.add_row([
            m["id"].to_string(),
            m["addr"].as_str().unwrap_or("?").to_string(),
            m["state"].as_str().unwrap_or("?").to_string(),
            human(u("capacity_bytes")),
            human(u("used_bytes")),
            progress,
        ]);
    }
    t
}

/// What a leaving mComponent still holds, in words.
fn progress(l: &serde_json::Value) -> String {
    let u = |k: &str| l[k].as_u64().unwrap_or(0);
    let mut parts = vec![format!(
        "{} moved, {} left",
        human(u("bytes_moved")),
        human(u("bytes_left"))
    )];
    for (k, what) in [
        ("homes", "home(s)"),
        ("backups", "backup home(s)"),
        ("processes", "process(es) with memory"),
        ("socket_buffers", "socket buffer(s)"),
    ] {
        if u(k) > 0 {
            parts.push(format!("{} {what}", u(k)));
        }
    }
    if l["files_released"] != true {
        parts.push("buffer cache not written back yet".into());
    }
    if let Some(s) = l["stuck"].as_str() {
        parts.push(format!("stuck: {s}"));
    }
    parts.join(", ")
}

/// `memory attach`: the mComponent takes new homes and vRegions (a standby one joins; a
/// detach under way is called off).
pub fn attach(a: ApiArgs, id: u32) -> anyhow::Result<()> {
    let (api, token) = api_access(a)?;
    let m = api_post(&api, &token, &format!("/api/v1/memory/{id}/attach"))?;
    crate::outln!(
        "mComponent {id} ({}) attached: {} for new homes and vRegions",
        m["addr"].as_str().unwrap_or("?"),
        human(m["capacity_bytes"].as_u64().unwrap_or(0))
    );
    Ok(())
}

/// `memory detach` (`stay`: `cluster drain`): starts moving everything off the mComponent,
/// then waits until it is gone (or drained), printing progress; gives up waiting (the move
/// goes on) after `timeout`.
pub fn detach(a: ApiArgs, id: u32, stay: bool, wait: bool, timeout: Duration) -> anyhow::Result<()> {
    let (api, token) = api_access(a)?;
    let path = format!("/api/v1/memory/{id}/detach{}", if stay { "?stay=true" } else { "" });
    let m = api_post(&api, &token, &path)?;
    let verb = if stay { "draining" } else { "detaching" };
    crate::outln!(
        "mComponent {id} ({}) {verb}: {} to move to the other mComponents",
        m["addr"].as_str().unwrap_or("?"),
        human(m["used_bytes"].as_u64().unwrap_or(0))
    );
    if !wait {
        return Ok(());
    }
    let t0 = Instant::now();
    let mut last = String::new();
    loop {
        let all = api_get(&api, &token, "/api/v1/memory")?;
        let Some(m) = all.as_array().into_iter().flatten().find(|m| m["id"] == id) else {
            crate::outln!(
                "mComponent {id} detached in {:.1} s: it held nothing any more and exited",
                t0.elapsed().as_secs_f64()
            );
            return Ok(());
        };
        match m["state"].as_str() {
            Some("drained") => {
                crate::outln!("mComponent {id} drained in {:.1} s: it holds nothing and stays out of placement (memory attach {id} gives it back)", t0.elapsed().as_secs_f64());
                return Ok(());
            }
            Some("detaching" | "draining") => {}
            Some(s) => anyhow::bail!("mComponent {id} is {s}: its detach was called off"),
            None => anyhow::bail!("mComponent {id}: the API gave no state"),
        }
        let now = progress(&m["leaving"]);
        if now != last {
            crate::outln!("  {now}");
            last = now.clone();
        }
        if t0.elapsed() >= timeout {
            anyhow::bail!(
                "mComponent {id} is still {verb} after {} s ({now}); it goes on (memory list shows it)",
                timeout.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `cluster set-excache`: resizes a running pComponent's ExCache (`size` none: as it is) and
/// sets the vNodes' shares of it (`shares` none: as they are; empty: none), then prints it.
pub fn set_excache(a: ApiArgs, id: u32, size: Option<Size>, shares: Option<Vec<String>>) -> anyhow::Result<()> {
    let (api, token) = api_access(a)?;
    let mut body = serde_json::Map::new();
    if let Some(s) = size {
        body.insert("size".into(), s.to_string().into());
    }
    if let Some(list) = shares {
        let mut m = serde_json::Map::new();
        for s in list {
            let (vnode, bytes) = s
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--share {s:?}: expected VNODE=SIZE (e.g. lab=16M)"))?;
            let bytes: Size = bytes.parse().map_err(|e| anyhow::anyhow!("--share {s:?}: {e}"))?;
            m.insert(vnode.to_string(), bytes.to_string().into());
        }
        body.insert("shares".into(), m.into());
    }
    let path = format!("/api/v1/pcomponents/{id}/excache");
    let c = api_put(&api, &token, &path, &body.into(), EXCACHE_TIMEOUT)?;
    let u = |v: &serde_json::Value, k: &str| human(v[k].as_u64().unwrap_or(0));
    crate::outln!(
        "pComponent {id}: ExCache {} (at most {}), {} in use",
        u(&c, "size_bytes"),
        u(&c, "max_bytes"),
        u(&c, "used_bytes")
    );
    for (vnode, s) in c["shares"].as_object().into_iter().flatten() {
        crate::outln!(
            "  vNode {vnode}: share {}, holds {}",
            u(s, "share_bytes"),
            u(s, "used_bytes")
        );
    }
    Ok(())
}

/// `cluster set-policy`: replaces a running pComponent's eviction or read-ahead policy (none
/// given: prints them), then prints them. It asks the REST API, as every admin command does;
/// the managers, hosted callers of the pComponent's `excache-policies` Ebb, send it the message.
pub fn set_policy(a: ApiArgs, id: u32, eviction: Option<String>, prefetch: Option<String>) -> anyhow::Result<()> {
    let change = SetPolicy { eviction, prefetch };
    let (api, token) = api_access(a)?;
    let body = serde_json::to_value(&change)?;
    let now: PolicyState = serde_json::from_value(api_put(
        &api,
        &token,
        &format!("/api/v1/pcomponents/{id}/policy"),
        &body,
        Duration::from_secs(30),
    )?)?;
    let PolicyState {
        eviction,
        prefetch,
        eviction_swaps,
        prefetch_swaps,
    } = now;
    crate::outln!("pComponent {id}: eviction {eviction} (replaced {eviction_swaps} times), read-ahead {prefetch} (replaced {prefetch_swaps} times)");
    Ok(())
}

/// How long `set-excache` waits for the pComponent: a shrink writes dirty lines back first.
const EXCACHE_TIMEOUT: Duration = Duration::from_secs(130);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_list_keeps_its_columns_aligned_whatever_the_ids_width() {
        let all = serde_json::json!([
            {"id": 7, "addr": "127.0.0.1:4000", "state": "attached", "capacity_bytes": 1 << 30, "used_bytes": 0},
            {"id": 12_345_678, "addr": "10.200.0.12:45000", "state": "draining", "capacity_bytes": 1 << 30, "used_bytes": 4096,
             "leaving": {"bytes_moved": 0, "bytes_left": 4096, "files_released": true}},
        ]);
        let text = table(&all).to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        // Each column starts where its header does.
        for head in ["ADDRESS", "STATE", "CAPACITY"] {
            let at = lines[0].find(head).unwrap();
            for l in &lines[1..] {
                assert!(
                    l[at..].starts_with(|c: char| c.is_ascii_alphanumeric()),
                    "{head} in {text}"
                );
                assert_eq!(&l[at - 1..at], " ", "{head} in {text}");
            }
        }
    }
}
