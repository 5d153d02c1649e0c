//! One-sided access with real components and real programs: an owner of this host hands the
//! pComponent its segment of each vRegion, misses and write-backs copy pages in and out of it
//! (the pComponent's counters count the copies, the owner's count the leases and the memfds it
//! handed out, and its own fetch count stays below the misses), programs give their native
//! output through vma changes, forks and mremaps that take leases back, and a lease or a
//! segment goes to no one but the process's own pComponent.
use crate::common;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use splitos_rpc::auth::Credentials;
use splitos_rpc::{Rpc, RpcError, Who, P2M_LEASE};

fn sided(s: &serde_json::Value, k: &str) -> u64 {
    n(&s["one_sided"], k)
}

/// Summed over the mComponents: `leases` (granted) or `lease_handouts`.
fn leases(s: &serde_json::Value, k: &str) -> u64 {
    s["mcomponents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m[k].as_u64().unwrap())
        .sum()
}

#[test]
fn misses_and_write_backs_copy_the_pages_of_owners_on_this_host() {
    let p = program("randpages");
    // 32 MiB written in a random order, twice, through a 4 MiB ExCache: every miss fetches a
    // page written back before.
    let cmd = [p.to_str().unwrap(), "32", "2"];
    let (_, on) = through_components(&["--excache", "4M", "--one-sided", "on"], &cmd, 1);
    let remote = n(&on, "bytes_fetched") / 4096;
    assert!(
        sided(&on, "reads") * 10 > remote * 9,
        "most remote fills were copies: {on}"
    );
    assert!(sided(&on, "writes") > 1000, "write-backs were copies: {on}");
    assert!(
        leases(&on, "leases") >= 1 && leases(&on, "lease_handouts") >= 1,
        "the owner leased its segment and handed over its memfd: {on}"
    );
    assert!(
        mcomp_sum(&on, "fetches") * 5 < remote,
        "the owner was not asked for the pages copied: {on}"
    );
    assert_eq!(on["pcomponent"]["one_sided"], "on", "{on}");
    // Off, every fetch is a message: no lease, no copy.
    let (_, off) = through_components(&["--excache", "4M", "--one-sided", "off"], &cmd, 1);
    assert_eq!(
        sided(&off, "reads") + sided(&off, "writes") + leases(&off, "leases"),
        0,
        "{off}"
    );
    assert!(mcomp_sum(&off, "fetches") >= n(&off, "bytes_fetched") / 4096, "{off}");
}

#[test]
fn programs_keep_their_output_while_owners_take_their_leases_back() {
    let opts = ["--excache", "1M", "--one-sided", "on", "--vregion-size", "4M"];
    // Arenas unmapped and mapped again: each change of the layout takes the leases back.
    let p = program("remap");
    let (_, s) = same_as_native_with_stats(&opts, &[p.to_str().unwrap()]);
    assert!(
        sided(&s, "revoked") > 0 && sided(&s, "reads") > 0,
        "leases taken back and renewed: {s}"
    );
    // Forked children reading their parent's heap while it lives in segments.
    let p = program("forkmany");
    same_as_native_with_stats(&opts, &[p.to_str().unwrap(), "8", "8"]);
    // Python: dicts and lists that grow by mremap and move between arenas.
    let (_, s) = through_components(
        &opts,
        &[
            &python3(),
            "-c",
            "d={i:str(i)*3 for i in range(60000)}; l=[d[k] for k in sorted(d)]; print(sum(len(v) for v in l), l[-1])",
        ],
        1,
    );
    assert!(sided(&s, "reads") > 0, "{s}");
}

fn rpc_as(c: &TestCluster, role: &str) -> Rpc {
    let creds = Credentials::load(&c.issue(role)).unwrap();
    Rpc::new(
        splitos_rpc::TransportConfig::default()
            .build(Some(Arc::new(creds)))
            .unwrap(),
        Duration::from_secs(5),
    )
}

/// The owner's pages socket, beside its rendezvous socket in the transport's directory.
fn pages_socket(addr: &str) -> std::path::PathBuf {
    let dirs = [
        std::env::var("XDG_RUNTIME_DIR")
            .map(|d| format!("{d}/splitos"))
            .unwrap_or_default(),
        "/run/splitos".into(),
    ];
    let tail = format!("-{addr}.pages.sock");
    dirs.iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_str().is_some_and(|s| s.ends_with(&tail)))
        .unwrap_or_else(|| panic!("no pages socket of {addr}"))
}

#[test]
fn a_lease_goes_to_the_processs_own_pcomponent_and_a_segment_to_its_token_alone() {
    let c = TestCluster::up(Some(
        "[[pcomponent]]\nexcache = \"4M\"\none_sided = \"on\"\n[[mcomponent]]\n",
    ));
    let hold = program("hold");
    let native_out = text(&native(&[hold.to_str().unwrap(), "16"]).stdout);
    let (mut victim, pid) = spawn_hold(&c, 16);
    let m = c.components("mcomponent")[0]["addr"].as_str().unwrap().to_string();
    let granted = |c: &TestCluster| c.components("mcomponent")[0]["stats"]["leases"].as_u64().unwrap();
    assert!(granted(&c) >= 1, "the victim's pComponent leased its segment");
    let index = 0x200000000000u64 / (1 << 30);
    // Another pComponent's credentials, knowing the process id and vNode: refused, counted.
    let other = rpc_as(&c, "pcomponent");
    let before = granted(&c);
    match other.call(
        &m,
        P2M_LEASE {
            who: Who::new("default", pid),
            index,
        },
    ) {
        Err(RpcError::Remote { msg, .. }) => assert!(msg.contains("runs on another pComponent"), "{msg}"),
        r => panic!("another pComponent got a lease: {r:?}"),
    }
    // The admin's tools may read pages by message, but take no lease.
    match c.admin_rpc().call(
        &m,
        P2M_LEASE {
            who: Who::new("default", pid),
            index,
        },
    ) {
        Err(RpcError::Remote { msg, .. }) => assert!(msg.contains("only a process's pComponent"), "{msg}"),
        r => panic!("the admin got a lease: {r:?}"),
    }
    assert_eq!(granted(&c), before, "no lease granted to either");
    // On the pages socket, a guessed token gets no memfd (and is counted before the answer),
    // and a peer that connects and says nothing does not keep the next one from an answer.
    let path = pages_socket(&m);
    let silent = UnixStream::connect(&path).unwrap();
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(&[0x5a; 16]).unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    assert_eq!(answer, b"n", "a guessed token is refused");
    assert!(c.metric(&m, "splitos_mcomp_lease_handouts_refused_total") >= 1.0);
    drop(silent);
    // The victim never noticed, and its pComponent still copies its pages.
    drop(victim.stdin.take());
    let out = victim.wait_with_output().unwrap();
    assert_eq!(
        text(&out.stdout),
        native_out.trim_start_matches("ready\n"),
        "{}",
        text(&out.stderr)
    );
    let reads = c.components("pcomponent")[0]["stats"]["one_sided"]["reads"]
        .as_u64()
        .unwrap();
    assert!(reads > 0, "the victim's misses were copies");
}
