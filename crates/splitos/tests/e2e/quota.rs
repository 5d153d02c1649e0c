//! vNodes' memory quotas (`[[vnode]] memory`, docs/security.md): a program of a vNode at its
//! quota gets ENOMEM where it asks for memory (malloc returns NULL) and carries on; programs
//! of other vNodes, and the vNode's own programs already running, are not touched.
use crate::common;
use common::*;
use std::io::Write;

const TWO_VNODES: &str = "[cluster]\nreplication = \"none\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\ncapacity = \"256M\"\n[[mcomponent]]\ncapacity = \"256M\"\n[[vnode]]\nname = \"small\"\nusers = [\"root\"]\nmemory = \"200M\"\n[[vnode]]\nname = \"big\"\nusers = [\"root\"]\n";

/// What a run printed and how it ended, to compare with a native run's.
fn outcome(o: &std::process::Output) -> (String, String, Option<i32>) {
    (text(&o.stdout), text(&o.stderr), o.status.code())
}

/// The vNode's entry in the stats of the mComponent that is home of its processes.
fn vnode_memory(c: &TestCluster, vnode: &str) -> serde_json::Value {
    let homes: Vec<serde_json::Value> = c
        .components("mcomponent")
        .iter()
        .map(|m| m["stats"]["vnode_memory"][vnode].clone())
        .filter(|v| !v.is_null())
        .collect();
    assert_eq!(
        homes.len(),
        1,
        "one home serves all processes of a vNode with a quota: {homes:?}"
    );
    homes[0].clone()
}

#[test]
fn a_program_over_its_vnodes_memory_quota_gets_null_from_malloc_and_other_vnodes_run_on() {
    let c = TestCluster::up(Some(TWO_VNODES));
    let oom = program("oom");
    let oom = oom.to_str().unwrap();
    let hold = program("hold");
    let hold = hold.to_str().unwrap();
    let native_oom = text(&native(&[oom, "400"]).stdout);
    assert_eq!(
        native_oom,
        "allocated some; malloc never failed\nafter freeing: malloc works: 1\n"
    );

    // A program of vNode "small" holds some of its quota meanwhile.
    let mut holder = c.spawn(&["--vnode", "small"], &[hold, "64"]);
    assert_eq!(read_line(&mut holder), "ready\n");
    let held = vnode_memory(&c, "small");
    assert!(held["used"].as_u64().unwrap() >= 64 << 20, "{held}");
    assert_eq!(held["quota"].as_u64(), Some(200 << 20));

    // Another of its programs asks for more than the rest: malloc returns NULL with ENOMEM,
    // and the program goes on once it freed what it had.
    let out = c.run(&["--vnode", "small"], &[oom, "400"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "allocated some; malloc returned NULL with ENOMEM\nafter freeing: malloc works: 1\n",
        "{}",
        text(&out.stderr)
    );
    let small = vnode_memory(&c, "small");
    assert!(small["refused"].as_u64().unwrap() >= 1, "{small}");
    assert!(small["used"].as_u64().unwrap() <= 200 << 20, "{small}");
    let home = c
        .components("mcomponent")
        .into_iter()
        .find(|m| !m["stats"]["vnode_memory"]["small"].is_null())
        .unwrap();
    assert!(
        c.metric(
            home["addr"].as_str().unwrap(),
            "splitos_mcomp_vnode_memory_refused_total"
        ) >= 1.0
    );

    // A program of vNode "big", which has no quota, gets all it asks for while "small" is at
    // its quota: the same 400 MiB, as natively.
    let out = c.run(&["--vnode", "big"], &[oom, "400"]);
    assert_eq!(text(&out.stdout), native_oom, "{}", text(&out.stderr));
    assert_eq!(vnode_memory(&c, "big")["refused"].as_u64(), Some(0));

    // The program that held memory of "small" all along was not touched.
    drop(holder.stdin.take());
    let out = holder.wait_with_output().unwrap();
    assert_eq!(
        format!("ready\n{}", text(&out.stdout)),
        text(&native(&[hold, "64"]).stdout),
        "{}",
        text(&out.stderr)
    );
    // Its memory is given back to the quota when it exits.
    assert!(
        c.eventually(std::time::Duration::from_secs(10), |c| vnode_memory(c, "small")["used"]
            .as_u64()
            == Some(0)),
        "{}",
        vnode_memory(&c, "small")
    );

    // A fork charges the child what its parent maps: past the quota, fork fails with ENOMEM
    // and the children forked before it run to the end.
    let forks = program("forkmany");
    let forks = forks.to_str().unwrap();
    assert_eq!(
        text(&native(&[forks, "20", "8"]).stdout),
        "forked 20 of 20, 20 children ok\n"
    );
    let refused = vnode_memory(&c, "small")["refused"].as_u64().unwrap();
    let out = c.run(&["--vnode", "small"], &[forks, "20", "8"]);
    assert!(
        text(&out.stderr).contains("fork: Cannot allocate memory"),
        "{}",
        text(&out.stderr)
    );
    let said = text(&out.stdout);
    let forked = said
        .strip_prefix("forked ")
        .and_then(|s| s.split_once(" of 20, "))
        .unwrap_or_else(|| panic!("{said}"));
    assert_eq!(forked.1, format!("{} children ok\n", forked.0), "{said}");
    assert!(forked.0.parse::<u32>().unwrap() < 20, "{said}");
    assert!(vnode_memory(&c, "small")["refused"].as_u64().unwrap() > refused);
}

#[test]
fn mprotect_past_the_quota_is_refused_and_memory_made_inaccessible_is_free_again_at_once() {
    // Write access added under a quota is asked of the home; write access taken away is
    // answered before the home has it, and the home has it before the program's next call.
    let c = TestCluster::up(Some(TWO_VNODES));
    wait_cluster_memory_known(&c);
    let p = program("protect_past");
    let out = c.run(&["--vnode", "small"], &[p.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{:?} {} {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(
        text(&out.stdout),
        "220 MiB writable: ENOMEM\n150 MiB writable: ok, inaccessible again: ok, the next 150 MiB: ok, 4\n",
        "{}",
        text(&out.stderr)
    );
    let small = vnode_memory(&c, "small");
    assert!(small["refused"].as_u64().unwrap() >= 1, "{small}");
    let totals = &c.components("pcomponent")[0]["stats"]["totals"];
    assert!(n(totals, "heap_calls_posted") >= 1, "{totals}");
    assert_eq!(n(totals, "heap_calls_posted_refused"), 0, "{totals}");
}

#[test]
fn a_bad_memory_quota_is_refused_with_a_message_naming_it() {
    let dir = tempfile::Builder::new().prefix("splitos-quota-").tempdir().unwrap();
    for (value, says) in [
        ("\"lots\"", "\"lots\": unknown size suffix"),
        (
            "\"1K\"",
            "vnode[0].memory: a memory quota of 1024 bytes is less than one 4 KiB page",
        ),
    ] {
        let p = dir.path().join("cluster.toml");
        let mut f = std::fs::File::create(&p).unwrap();
        write!(
            f,
            "[[pcomponent]]\n[[mcomponent]]\n[[vnode]]\nname = \"lab\"\nusers = [\"root\"]\nmemory = {value}\n"
        )
        .unwrap();
        let out = std::process::Command::new(splitos())
            .args(["cluster", "up", "--config"])
            .arg(&p)
            .env("SPLITOS_STATE_DIR", dir.path())
            .env("SPLITOS_DATA_DIR", dir.path().join("data"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(text(&out.stderr).contains(says), "{}", text(&out.stderr));
    }
}

// ---- A vNode within its quota is killed by another vNode filling memory

#[test]
fn a_vnode_within_its_quota_runs_as_natively_while_another_vnode_fills_the_memory() {
    // Strict overcommit: the vNode that fills the memory learns it from malloc.
    let c = TestCluster::up(Some(
        "[cluster]\nvregion_size = \"4M\"\nreplication = \"none\"\novercommit = \"strict\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\ncapacity = \"96M\"\n[[mcomponent]]\ncapacity = \"96M\"\n[[vnode]]\nname = \"va\"\nusers = [\"root\"]\n[[vnode]]\nname = \"vq\"\nusers = [\"root\"]\nmemory = \"48M\"\n",
    ));
    // The home of vq keeps its quota before any program of vq runs.
    let kept = |c: &TestCluster| {
        c.components("mcomponent")
            .iter()
            .filter_map(|m| m["stats"]["kept_for_vnodes"]["vq"]["kept"].as_u64())
            .collect::<Vec<_>>()
    };
    assert!(
        c.eventually(std::time::Duration::from_secs(5), |c| kept(c) == vec![48 << 20]),
        "one mComponent keeps vq's quota: {:?}",
        kept(&c)
    );
    let fill = program("fill");
    let fill = fill.to_str().unwrap();
    let touch = program("memtouch");
    let cmd = [touch.to_str().unwrap(), "24"];
    let native_touch = native(&cmd);
    for trial in 1..=3 {
        // vNode va takes all the memory it can get, 8 MiB at a time, and holds it.
        let mut filler = c.spawn(&["--vnode", "va"], &[fill, "1024", "wait"]);
        let said = read_line(&mut filler);
        let got: u64 = said
            .strip_prefix("filled ")
            .and_then(|s| s.strip_suffix(" MiB, then malloc returned NULL\n"))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("trial {trial}: {said:?}"));
        assert!(
            got <= 192 - 48,
            "trial {trial}: va took {got} MiB, some of what is kept for vq"
        );
        // vNode vq, within its quota, runs as natively all the same.
        let out = c.run(&["--vnode", "vq", "--quiet"], &cmd);
        assert_eq!(
            text(&out.stdout),
            text(&native_touch.stdout),
            "trial {trial}: {}",
            text(&out.stderr)
        );
        assert_eq!(
            (text(&out.stderr), out.status.code()),
            (text(&native_touch.stderr), native_touch.status.code()),
            "trial {trial}"
        );
        drop(filler.stdin.take());
        let rest = filler.wait_with_output().unwrap();
        assert!(rest.status.success(), "trial {trial}: {}", text(&rest.stderr));
        assert_eq!(
            (text(&rest.stdout), text(&rest.stderr)),
            ("freed\n".to_string(), String::new()),
            "trial {trial}: va's messages are its own"
        );
    }
}

#[test]
fn with_heuristic_overcommit_the_vnode_filling_the_memory_is_stopped_and_the_one_within_its_quota_runs_on() {
    // Linux's default: mappings are promised, pages found when touched. The vNode that fills
    // the memory can only be stopped (as the OOM killer would stop it), never the one within
    // its quota, whose vRegions' home keeps its room.
    let c = TestCluster::up(Some(
        "[cluster]\nvregion_size = \"4M\"\nreplication = \"none\"\n[[pcomponent]]\nexcache = \"4M\"\n\
         [[mcomponent]]\ncapacity = \"96M\"\n[[mcomponent]]\ncapacity = \"96M\"\n\
         [[vnode]]\nname = \"va\"\nusers = [\"root\"]\n[[vnode]]\nname = \"vq\"\nusers = [\"root\"]\nmemory = \"48M\"\n",
    ));
    let fill = program("fill");
    let touch = program("memtouch");
    let cmd = [touch.to_str().unwrap(), "24"];
    let native_touch = native(&cmd);
    for trial in 1..=2 {
        // va fills the memory 8 MiB at a time while vq's program runs again and again.
        let filler = c.spawn(&["--vnode", "va"], &[fill.to_str().unwrap(), "1024"]);
        for round in 1..=3 {
            let out = c.run(&["--vnode", "vq", "--quiet"], &cmd);
            assert_eq!(
                outcome(&out),
                outcome(&native_touch),
                "trial {trial}, round {round}: vq's program, within its quota"
            );
        }
        let rest = filler.wait_with_output().unwrap();
        let said = text(&rest.stderr);
        assert!(
            !rest.status.success(),
            "trial {trial}: va got 1 GiB out of 192 MiB: {}",
            text(&rest.stdout)
        );
        assert!(!said.contains("vq"), "trial {trial}: va is told of vq: {said}");
        assert!(
            !said.is_empty(),
            "trial {trial}: va's program is not told why it was stopped"
        );
    }
}

/// A quota charges what a vNode's programs map, and nothing the pComponent keeps mapped at the
/// home for reuse (heap reuse keeps up to a chunk of 8 MiB per process by default): a shell
/// running a program that maps most of the quota gets what it asks for, as it would natively.
#[test]
fn a_vnodes_quota_is_what_its_programs_map_not_what_heap_reuse_would_keep() {
    let c = TestCluster::up(Some(
        "[cluster]\nvregion_size = \"4M\"\nreplication = \"none\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\ncapacity = \"96M\"\n[[vnode]]\nname = \"vq\"\nusers = [\"root\"]\nmemory = \"48M\"\n",
    ));
    let hold = program("hold");
    let mut holder = c.spawn(&["--vnode", "vq"], &[hold.to_str().unwrap(), "16"]);
    assert_eq!(read_line(&mut holder), "ready\n");
    // 16 MiB and the process's own start (the allocator's first arena, a few MiB).
    let used = vnode_memory(&c, "vq")["used"].as_u64().unwrap();
    assert!(
        (16 << 20..22 << 20).contains(&used),
        "vq is charged {used} bytes for 16 MiB"
    );
    drop(holder.stdin.take());
    assert!(holder.wait_with_output().unwrap().status.success());
    // Two processes, the shell and a program of 30 MiB (and a calloc of 4 MiB).
    let touch = program("memtouch");
    let cmd = format!("{} 30; true", touch.display());
    let out = c.run(&["--vnode", "vq", "--quiet"], &["sh", "-c", &cmd]);
    let native = native(&["sh", "-c", &cmd]);
    assert_eq!(
        (text(&out.stdout), text(&out.stderr)),
        (text(&native.stdout), text(&native.stderr)),
        "{}",
        text(&out.stderr)
    );
}

/// A process's memory is its vNode's again when it ends, as natively, even while a child it
/// made with a raw clone (which no LD_PRELOAD library sees) holds its connection to the
/// pComponent open: the pComponent watches the process, not only its connection.
#[test]
fn an_ended_process_leaves_its_vnodes_quota_while_a_raw_clone_child_holds_its_connection() {
    let c = TestCluster::up(Some(
        "[cluster]\nvregion_size = \"4M\"\nreplication = \"none\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\ncapacity = \"96M\"\n[[vnode]]\nname = \"vq\"\nusers = [\"root\"]\nmemory = \"48M\"\n",
    ));
    let raw = program("rawclone");
    let touch = program("memtouch");
    let cmd = [touch.to_str().unwrap(), "24"];
    let native_touch = native(&cmd);
    for round in 1..=3 {
        let mut parent = c.spawn(&["--vnode", "vq"], &[raw.to_str().unwrap(), "outlive", "28"]);
        assert_eq!(read_line(&mut parent), "parent ends\n", "round {round}");
        // The run ends with the parent; the child lives on until the run's stdin closes
        // (which waiting for the run would close).
        let stdin = parent.stdin.take();
        assert!(parent.wait().unwrap().success(), "round {round}");
        let used = |c: &TestCluster| vnode_memory(c, "vq")["used"].as_u64().unwrap();
        assert!(
            c.eventually(std::time::Duration::from_secs(3), |c| used(c) == 0),
            "round {round}: vq is still charged {} bytes for a process that ended",
            used(&c)
        );
        let out = c.run(&["--vnode", "vq", "--quiet"], &cmd);
        assert_eq!(
            outcome(&out),
            outcome(&native_touch),
            "round {round}: a program within the quota the ended process left"
        );
        drop(stdin);
    }
    // An exec ends the image it replaces: what it mapped is the vNode's again for the new one.
    let fill = program("fill");
    let cmd = [fill.to_str().unwrap(), "28", "exec", touch.to_str().unwrap(), "24"];
    let native_exec = native(&cmd);
    for round in 1..=3 {
        let out = c.run(&["--vnode", "vq", "--quiet"], &cmd);
        assert_eq!(
            outcome(&out),
            outcome(&native_exec),
            "round {round}: a program exec'd by one that held 28 MiB of the quota"
        );
    }
}

/// A quota charges what is mapped writable, and a fork charges the child as much again: a
/// program's allocator under a quota maps its arenas inaccessible and makes them writable as it
/// uses them, so that a shell script's forks cost what the shell uses, as natively, not two of
/// the allocator's arenas (64 MiB each, which took a 128 MiB quota's shell past it at its first
/// fork).
#[test]
fn a_shell_forks_under_a_quota_smaller_than_two_allocator_arenas() {
    let c = TestCluster::up(Some(
        "[cluster]\nvregion_size = \"4M\"\nreplication = \"none\"\n[[pcomponent]]\nexcache = \"4M\"\n[[mcomponent]]\ncapacity = \"256M\"\n[[vnode]]\nname = \"vr\"\nusers = [\"root\"]\nmemory = \"128M\"\n",
    ));
    let cmd = ["bash", "-c", "x=$(echo forked); true | cat; echo $x $(seq 3)"];
    let native = native(&cmd);
    let out = c.run(&["--vnode", "vr", "--quiet"], &cmd);
    assert_eq!(outcome(&out), outcome(&native));
    assert_eq!(
        vnode_memory(&c, "vr")["refused"].as_u64(),
        Some(0),
        "no mapping of the shell's was refused"
    );
}
