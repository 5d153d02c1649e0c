//! Hosts in network namespaces, as partitions part them. A cut takes one off from every other:
//! every link of the namespace but loopback goes down at this host's end of it (a veth whose
//! peer is in this namespace, as a cable pulled at the switch: the host's own interface stays
//! up and its packets are lost), or in the namespace where no such end is found; and comes up
//! again when healed. A split parts two hosts from each other while both reach every other
//! host, the managers' among them (a path lost between two racks): each routes the other's
//! addresses into a blackhole until healed.
use std::process::Command;

use serde_json::Value;

/// A link taken down: the namespace it is in (None: this one) and its name.
type Link = (Option<String>, String);

/// Links taken down for a partition; brought up again by [`Cut::heal`], or when dropped (an
/// interrupted run leaves no host cut off).
pub(super) struct Cut(Vec<Link>);

fn ip(ns: Option<&str>, args: &[&str]) -> anyhow::Result<String> {
    let mut c = Command::new("ip");
    if let Some(ns) = ns {
        c.args(["-n", ns]);
    }
    let out = c.args(args).output()?;
    if !out.status.success() {
        anyhow::bail!(
            "`ip {}{}` failed: {}",
            ns.map(|n| format!("-n {n} ")).unwrap_or_default(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn links(ns: Option<&str>) -> anyhow::Result<Vec<Value>> {
    Ok(serde_json::from_str(&ip(ns, &["-j", "link", "show"])?)?)
}

fn set(link: &Link, up: bool) -> anyhow::Result<()> {
    ip(
        link.0.as_deref(),
        &["link", "set", &link.1, if up { "up" } else { "down" }],
    )
    .map(drop)
}

fn up(l: &Value) -> bool {
    l["flags"].as_array().is_some_and(|f| f.iter().any(|f| f == "UP"))
}

/// Cuts the host of namespace `ns` off from every other. A link that was down already stays
/// as it was.
pub(super) fn cut(ns: &str) -> anyhow::Result<Cut> {
    let (inside, here) = (links(Some(ns))?, links(None)?);
    let mut cut = Cut(Vec::new());
    for l in inside.iter().filter(|l| l["ifname"] != "lo" && up(l)) {
        let name = l["ifname"].as_str().unwrap_or_default().to_string();
        // The peer of a veth whose other end is in this namespace names it back.
        let peer = here.iter().find(|h| {
            l["link_index"].is_u64()
                && h["ifindex"] == l["link_index"]
                && h["link_index"] == l["ifindex"]
                && h.get("link_netnsid").is_some()
        });
        let link = match peer {
            Some(h) if up(h) => (None, h["ifname"].as_str().unwrap_or_default().to_string()),
            Some(_) => continue,
            None => (Some(ns.to_string()), name),
        };
        set(&link, false)?;
        cut.0.push(link);
    }
    if cut.0.is_empty() {
        anyhow::bail!("network namespace {ns} has no link but loopback to cut");
    }
    Ok(cut)
}

impl Cut {
    /// Brings the links up again: the host is reachable as before.
    pub(super) fn heal(mut self) -> anyhow::Result<()> {
        let mut failed = None;
        // One that does not come up stays for the drop to try again.
        self.0.retain(|link| match set(link, true) {
            Ok(()) => false,
            Err(e) => {
                failed.get_or_insert(e);
                true
            }
        });
        failed.map_or(Ok(()), Err)
    }

    /// The links cut, as `ip link` names them.
    pub(super) fn names(&self) -> Vec<String> {
        self.0.iter().map(|(_, n)| n.clone()).collect()
    }
}

impl Drop for Cut {
    fn drop(&mut self) {
        for link in &self.0 {
            let _ = set(link, true);
        }
    }
}

/// A host's own addresses (global scope, on links but loopback), without their prefixes.
fn addrs(ns: &str) -> anyhow::Result<Vec<String>> {
    let links: Vec<Value> = serde_json::from_str(&ip(Some(ns), &["-j", "addr", "show"])?)?;
    Ok(links
        .iter()
        .filter(|l| l["ifname"] != "lo")
        .flat_map(|l| l["addr_info"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["scope"] == "global")
        .filter_map(|a| a["local"].as_str().map(String::from))
        .collect())
}

/// Blackhole routes that part two hosts, each as (namespace, destination): removed by
/// [`Split::heal`], or when dropped.
pub(super) struct Split(Vec<(String, String)>);

/// Parts the hosts of namespaces `a` and `b`: what either sends the other is dropped (an open
/// connection stalls; a new one is refused at once, `EINVAL`), while both reach the rest.
pub(super) fn split(a: &str, b: &str) -> anyhow::Result<Split> {
    let (of_a, of_b) = (addrs(a)?, addrs(b)?);
    if of_a.is_empty() || of_b.is_empty() {
        anyhow::bail!("network namespaces {a} and {b} need an address each to be split");
    }
    let mut split = Split(Vec::new());
    let routes = of_b.iter().map(|to| (a, to)).chain(of_a.iter().map(|to| (b, to)));
    for (ns, to) in routes {
        ip(Some(ns), &["route", "add", "blackhole", to])?;
        split.0.push((ns.to_string(), to.clone()));
    }
    Ok(split)
}

impl Split {
    /// How many of its routes the namespaces' routing tables hold now.
    pub(super) fn held(&self) -> usize {
        self.0
            .iter()
            .filter(|(ns, to)| {
                let family = if to.contains(':') { "-6" } else { "-4" };
                let table = ip(Some(ns), &[family, "-j", "route", "show", "type", "blackhole"]).unwrap_or_default();
                serde_json::from_str::<Vec<Value>>(&table)
                    .unwrap_or_default()
                    .iter()
                    .any(|r| r["dst"] == to.as_str())
            })
            .count()
    }

    /// The routes, as `namespace: blackhole destination`.
    pub(super) fn routes(&self) -> Vec<String> {
        self.0.iter().map(|(ns, to)| format!("{ns}: blackhole {to}")).collect()
    }

    /// Removes the routes: the hosts reach each other as before.
    pub(super) fn heal(mut self) -> anyhow::Result<()> {
        let mut failed = None;
        self.0
            .retain(|(ns, to)| match ip(Some(ns), &["route", "del", "blackhole", to]) {
                Ok(_) => false,
                Err(e) => {
                    failed.get_or_insert(e);
                    true
                }
            });
        failed.map_or(Ok(()), Err)
    }
}

impl Drop for Split {
    fn drop(&mut self) {
        for (ns, to) in &self.0 {
            let _ = ip(Some(ns), &["route", "del", "blackhole", to]);
        }
    }
}
