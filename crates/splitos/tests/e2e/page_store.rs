//! The RPC page store (what the miss path fetches from and writes back to), driven in-process
//! against real mComponent processes: single and batched fetches and flushes, piggyback, the
//! all-or-nothing rule of a batch, and vNode isolation, with the mComponent's own counters;
//! and the same store reaching the owner's pages by a copy (one-sided access).
use crate::common;
use std::sync::Arc;

use common::*;
use splitos::node::Node;
use splitos_pmon::{PageStore, ProcMemory, RemoteStore};
use splitos_rpc::*;

const BASE: u64 = 0x2000_0000_0000;

fn page(b: u8) -> Vec<u8> {
    let mut p = vec![b; PAGE_SIZE];
    p[1] = b.wrapping_mul(7);
    p
}

fn mcomp_counter(c: &TestCluster, addr: &str, key: &str) -> u64 {
    c.components("mcomponent")
        .iter()
        .find(|m| m["addr"] == addr)
        .map(|m| m["stats"][key].as_u64().unwrap())
        .unwrap()
}

/// What a pComponent the test builds in its own process is started with: credentials from the
/// cluster's authority, no metrics served.
fn process_args(c: &TestCluster) -> splitos::config::ProcessArgs {
    splitos::config::ProcessArgs {
        credentials: Some(c.issue("pcomponent")),
        ready_file: None,
        metrics_addr: "off".into(),
        transport: TransportConfig::default(),
    }
}

#[test]
fn the_rpc_page_store_serves_single_and_batched_pages_from_real_owners() {
    let c = TestCluster::up(Some("[[pcomponent]]\n[[mcomponent]]\n"));
    let st = c.status();
    let gm = st["gm"].as_str().unwrap();
    let (node, _unused_endpoint) = Node::bind(Role::Proc, gm, "127.0.0.1:0", &process_args(&c)).unwrap();
    let home = node
        .call_gm(P2G_PICK_HOME {
            vnode: "store-test".into(),
            pcomp: 0,
        })
        .unwrap()
        .mcomp;
    let who = Who::new("store-test", 0x7fff_0001);
    let created = node
        .rpc
        .call(
            &home.addr,
            P2M_PROC_CREATE {
                who: who.clone(),
                region_base: BASE,
                region_size: 1 << 30,
                pcomp: 0,
                memory_quota: None,
                attempt: 0,
            },
        )
        .unwrap();
    let mapped = node
        .rpc
        .call(
            &home.addr,
            P2M_MMAP {
                who: who.clone(),
                hint: 0,
                len: 64 * PAGE_SIZE as u64,
                prot: 3,
                fixed: false,
                noreserve: false,
            },
        )
        .unwrap();
    let first = mapped.addr / PAGE_SIZE as u64;

    let store = RemoteStore::new(node.clone(), false, 1);
    let space = Arc::new(ProcMemory::new(who.clone(), home.clone(), created.backup));
    space.learn(&mapped.owners, mapped.epoch, mapped.backup.clone());
    store.attach(who.pid, space);
    let owner = mapped.owners[0].owners[0].clone();
    assert_eq!(store.place(who.pid, first).unwrap(), owner.id);

    let flushes0 = mcomp_counter(&c, &owner.addr, "flushes");
    let fetches0 = mcomp_counter(&c, &owner.addr, "fetches");
    let pages: Vec<(u64, Vec<u8>)> = (0..16u8).map(|i| (first + i as u64, page(i + 1))).collect();
    let refs: Vec<(u64, &[u8])> = pages.iter().map(|(v, d)| (*v, &d[..])).collect();
    store.flush_many(who.pid, &refs).unwrap();
    assert_eq!(
        mcomp_counter(&c, &owner.addr, "flushes") - flushes0,
        16,
        "one batch, sixteen pages stored by the owner"
    );

    let want = [first + 15, first, first + 7];
    let got = store.fetch_many(who.pid, &want).unwrap();
    for (v, d) in want.iter().zip(&got) {
        assert_eq!(d, &page((v - first) as u8 + 1), "page {v} in the order asked");
    }
    assert_eq!(store.fetch(who.pid, first + 3).unwrap(), page(4));
    assert_eq!(
        store.fetch(who.pid, first + 40).unwrap(),
        vec![0u8; PAGE_SIZE],
        "a mapped page never written is zeros"
    );
    assert_eq!(mcomp_counter(&c, &owner.addr, "fetches") - fetches0, 5);

    let piggy0 = mcomp_counter(&c, &owner.addr, "piggybacked");
    let d = store
        .flush_fetch((who.pid, first + 20, &page(99)), (who.pid, first + 2))
        .unwrap();
    assert_eq!(d, page(3));
    assert_eq!(store.fetch(who.pid, first + 20).unwrap(), page(99));
    assert_eq!(mcomp_counter(&c, &owner.addr, "piggybacked") - piggy0, 1);

    // A batch with one page outside the mapping stores nothing at all.
    let bad: Vec<(u64, &[u8])> = vec![(first + 1, &pages[5].1[..]), (first + 1000, &pages[5].1[..])];
    let e = store.flush_many(who.pid, &bad).unwrap_err();
    assert_eq!(e.code, ErrCode::Invalid, "{e}");
    assert!(
        e.msg.contains(&format!("mComponent {}", owner.id)),
        "the error names the component: {e}"
    );
    assert_eq!(store.fetch(who.pid, first + 1).unwrap(), page(2), "all or nothing");

    // Another vNode presenting this process's pid is refused by the owner.
    let thief = Who::new("other", who.pid);
    let r = node.rpc.call(
        &owner.addr,
        P2M_FETCH_MANY {
            who: thief,
            vpns: vec![first],
        },
    );
    assert!(
        matches!(
            r,
            Err(RpcError::Remote {
                code: ErrCode::Denied,
                ..
            })
        ),
        "{r:?}"
    );

    node.rpc.call(&home.addr, P2M_EXIT { who }).unwrap();
    assert!(c.eventually(std::time::Duration::from_secs(5), |c| c
        .components("mcomponent")
        .iter()
        .all(|m| m["stats"]["used"] == 0)));
}

#[test]
fn one_sided_copies_reach_only_what_the_owner_holds_and_stop_when_it_changes_the_memory() {
    let c = TestCluster::up(Some("[[pcomponent]]\n[[mcomponent]]\n"));
    let gm = c.status()["gm"].as_str().unwrap().to_string();
    let (node, _unused_endpoint) = Node::bind(Role::Proc, &gm, "127.0.0.1:0", &process_args(&c)).unwrap();
    let home = node
        .call_gm(P2G_PICK_HOME {
            vnode: "store-test".into(),
            pcomp: 0,
        })
        .unwrap()
        .mcomp;
    let who = Who::new("store-test", 0x7fff_0002);
    let created = node
        .rpc
        .call(
            &home.addr,
            P2M_PROC_CREATE {
                who: who.clone(),
                region_base: BASE,
                region_size: 1 << 30,
                pcomp: 0,
                memory_quota: None,
                attempt: 0,
            },
        )
        .unwrap();
    let mapped = node
        .rpc
        .call(
            &home.addr,
            P2M_MMAP {
                who: who.clone(),
                hint: 0,
                len: 64 * PAGE_SIZE as u64,
                prot: 3,
                fixed: false,
                noreserve: false,
            },
        )
        .unwrap();
    let first = mapped.addr / PAGE_SIZE as u64;
    let store = RemoteStore::new(node.clone(), true, 1);
    let space = Arc::new(ProcMemory::new(who.clone(), home.clone(), created.backup));
    space.learn(&mapped.owners, mapped.epoch, mapped.backup.clone());
    store.attach(who.pid, space);
    let owner = mapped.owners[0].owners[0].clone();
    let stat = |k: &str| store.one_sided.stats.counters().find(|x| x.name == k).unwrap().value();

    // Pages the owner does not hold yet go by message: the owner charges them.
    let pages: Vec<(u64, Vec<u8>)> = (0..8u8).map(|i| (first + i as u64, page(i + 1))).collect();
    let refs: Vec<(u64, &[u8])> = pages.iter().map(|(v, d)| (*v, &d[..])).collect();
    let flushes0 = mcomp_counter(&c, &owner.addr, "flushes");
    store.flush_many(who.pid, &refs).unwrap();
    assert_eq!(
        mcomp_counter(&c, &owner.addr, "flushes") - flushes0,
        8,
        "new pages are the owner's to store"
    );
    assert_eq!(mcomp_counter(&c, &owner.addr, "used"), 8 * PAGE_SIZE as u64);
    // Held pages: fetched and written back by a copy, the owner asked nothing.
    let fetches0 = mcomp_counter(&c, &owner.addr, "fetches");
    assert_eq!(store.fetch(who.pid, first + 3).unwrap(), page(4));
    store.flush(who.pid, first + 3, &page(44)).unwrap();
    assert_eq!(
        store.fetch_many(who.pid, &[first + 3, first]).unwrap(),
        vec![page(44), page(1)]
    );
    assert_eq!(
        mcomp_counter(&c, &owner.addr, "fetches"),
        fetches0,
        "the owner was not asked"
    );
    assert_eq!(mcomp_counter(&c, &owner.addr, "flushes") - flushes0, 8);
    assert!(
        stat("reads") >= 3 && stat("writes") >= 1 && stat("leases") == 1,
        "{:?}",
        store
            .one_sided
            .stats
            .counters()
            .map(|x| (x.name, x.value()))
            .collect::<Vec<_>>()
    );
    // The owner sees the copy's write: a fetch by message (the admin's tools) gets it.
    let by_message = c
        .admin_rpc()
        .call(
            &owner.addr,
            P2M_FETCH {
                who: who.clone(),
                vpn: first + 3,
            },
        )
        .unwrap();
    assert_eq!(unseal_page(by_message.data).unwrap(), page(44));
    // A page never written is zeros, by message (the copy cannot tell a hole from a page).
    assert_eq!(store.fetch(who.pid, first + 40).unwrap(), vec![0u8; PAGE_SIZE]);
    assert!(stat("absent") >= 1);
    assert_eq!(
        mcomp_counter(&c, &owner.addr, "used"),
        8 * PAGE_SIZE as u64,
        "no copy adds a page"
    );
    // The home unmaps and maps the range again: the owner takes its lease back first, and the
    // copies see zeros, never the old pages.
    node.rpc
        .call(
            &home.addr,
            P2M_MUNMAP {
                who: who.clone(),
                addr: mapped.addr,
                len: 64 * PAGE_SIZE as u64,
            },
        )
        .unwrap();
    let again = node
        .rpc
        .call(
            &home.addr,
            P2M_MMAP {
                who: who.clone(),
                hint: mapped.addr,
                len: 64 * PAGE_SIZE as u64,
                prot: 3,
                fixed: true,
                noreserve: false,
            },
        )
        .unwrap();
    assert_eq!(again.addr, mapped.addr);
    assert_eq!(
        store.fetch(who.pid, first + 3).unwrap(),
        vec![0u8; PAGE_SIZE],
        "an unmapped page is gone"
    );
    assert!(stat("revoked") >= 1, "the copy found its lease taken back");
    store.flush(who.pid, first + 3, &page(5)).unwrap();
    assert_eq!(store.fetch(who.pid, first + 3).unwrap(), page(5));
    node.rpc.call(&home.addr, P2M_EXIT { who }).unwrap();
    assert!(c.eventually(std::time::Duration::from_secs(5), |c| c
        .components("mcomponent")
        .iter()
        .all(|m| m["stats"]["used"] == 0)));
}
