use super::*;
use placement::PLACEMENTS;
use trace::Task;

/// Replays hand-made tasks `(cpu, mem, start, end)` on nodes `(cpu, mem)`, with an
/// ExCache share of a quarter and vRegions of 4 MiB.
fn replay_of(
    kind: Kind,
    nodes: &[(u64, u64)],
    tasks: &[(u64, u64, f64, f64)],
    policy: &str,
    topology: &str,
) -> ModelReport {
    let nodes: Vec<Node> = nodes.iter().map(|&(cpu, mem)| Node { cpu, mem }).collect();
    let tasks = tasks
        .iter()
        .enumerate()
        .map(|(i, &(cpu, mem, start, end))| Task {
            name: format!("t{i}"),
            row: i + 1,
            cpu,
            mem,
            start,
            end,
        })
        .collect();
    let w = Workload::new(tasks, 1, 0.0).unwrap();
    let spec = Spec {
        kind,
        topology: topology.parse().unwrap(),
        excache_share: 0.25,
        vregion_mib: 4,
        memory_modules: 0,
    };
    let m = Model::new(spec, &nodes, w.len(), policy.parse().unwrap()).unwrap();
    let needs: Vec<Option<Need>> = w
        .tasks
        .iter()
        .map(|t| Some(m.need(t.cpu, t.mem)).filter(|n| m.oversized(n).is_none()))
        .collect();
    let r = replay(
        m,
        &w,
        &needs,
        100,
        3,
        (f64::NEG_INFINITY, f64::INFINITY),
        &indicatif::ProgressBar::hidden(),
    );
    let a = &r.audit;
    assert_eq!(
        (
            a.over_capacity,
            a.missing_allocations,
            a.unmatched_releases,
            a.units_left_holding,
            a.placements,
            a.releases
        ),
        (0, 0, 0, 0, r.placed, r.placed)
    );
    r
}

/// Fills hand-made static tasks `(cpu, mem)` into nodes `(cpu, mem)`, as `replay_of`.
fn fill_of(kind: Kind, nodes: &[(u64, u64)], tasks: &[(u64, u64)], topology: &str) -> ModelReport {
    let nodes: Vec<Node> = nodes.iter().map(|&(cpu, mem)| Node { cpu, mem }).collect();
    let tasks = tasks
        .iter()
        .enumerate()
        .map(|(i, &(cpu, mem))| Task {
            name: format!("t{i}"),
            row: i + 1,
            cpu,
            mem,
            start: 0.0,
            end: f64::INFINITY,
        })
        .collect();
    let w = Workload::in_order(tasks, 1).unwrap();
    let spec = Spec {
        kind,
        topology: topology.parse().unwrap(),
        excache_share: 0.25,
        vregion_mib: 4,
        memory_modules: 0,
    };
    let m = Model::new(spec, &nodes, w.len(), PlacementPolicy::BestFit).unwrap();
    let needs: Vec<Option<Need>> = w
        .tasks
        .iter()
        .map(|t| Some(m.need(t.cpu, t.mem)).filter(|n| m.oversized(n).is_none()))
        .collect();
    let r = fill(m, &w, &needs, &indicatif::ProgressBar::hidden());
    let a = &r.audit;
    assert_eq!(
        (
            a.over_capacity,
            a.missing_allocations,
            a.unmatched_releases,
            a.units_left_holding,
            a.placements,
            a.releases
        ),
        (0, 0, 0, 0, r.placed, r.placed)
    );
    r
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn packing_switches_servers_off_and_spreading_fragments() {
    let tasks = [(2000, 4, 0.0, 10.0), (2000, 4, 0.0, 10.0)];
    for policy in ["best-fit", "first-fit"] {
        let r = replay_of(Kind::Fixed, &[(4000, 8), (4000, 8)], &tasks, policy, "none");
        assert!(
            close(r.average.switched_off_compute, 0.5) && close(r.average.switched_off_memory, 0.5),
            "{policy}"
        );
        assert!(
            close(r.average.fragmentation_cpu, 0.0) && close(r.average.fragmentation_mem, 0.0),
            "{policy}"
        );
        assert!(
            close(r.average.utilization_cpu, 0.5) && close(r.average.utilization_mem, 0.5),
            "{policy}"
        );
    }
    let r = replay_of(Kind::Fixed, &[(4000, 8), (4000, 8)], &tasks, "least-loaded", "none");
    assert!(
        close(r.average.switched_off_compute, 0.0)
            && close(r.average.fragmentation_cpu, 0.5)
            && close(r.average.fragmentation_mem, 0.5)
    );
}

/// Two tasks leave 1 core and 6 MiB on each server: a third (1 core, 7 MiB) fits no
/// server, but fits the same resources pooled.
#[test]
fn disaggregation_places_what_servers_cannot() {
    let nodes = [(4000, 8), (4000, 8)];
    let tasks = [(3000, 2, 0.0, 10.0), (3000, 2, 0.0, 10.0), (1000, 7, 0.0, 10.0)];
    let f = replay_of(Kind::Fixed, &nodes, &tasks, "best-fit", "none");
    assert_eq!((f.placed, f.unplaced, f.waits.waited), (2, 1, 0));
    assert!(close(f.average.fragmentation_cpu, 0.25) && close(f.average.fragmentation_mem, 0.75));
    let d = replay_of(Kind::Disaggregated, &nodes, &tasks, "best-fit", "none");
    assert_eq!((d.placed, d.unplaced), (3, 0));
    // Compute: one module full, one with 1 core free. Memory: 4 and 1 MiB free.
    assert!(
        close(d.average.fragmentation_cpu, 0.125) && close(d.average.fragmentation_mem, 5.0 / 16.0),
        "{} {}",
        d.average.fragmentation_cpu,
        d.average.fragmentation_mem
    );
    assert!(close(d.average.switched_off_compute, 0.0) && close(d.average.switched_off_memory, 0.0));
}

#[test]
fn a_task_waits_for_room_and_gives_up_at_its_end() {
    let r = replay_of(
        Kind::Fixed,
        &[(4000, 8)],
        &[
            (4000, 8, 0.0, 10.0),
            (4000, 8, 5.0, 20.0),
            (1000, 1, 6.0, 9.0),
            (1, 1, 12.0, 12.0),
        ],
        "best-fit",
        "none",
    );
    assert_eq!((r.placed, r.unplaced, r.instant, r.waits.waited), (2, 1, 1, 1));
    assert!(close(r.waits.p50_seconds, 5.0) && close(r.waits.max_seconds, 5.0));
    assert!(close(r.average.utilization_cpu, 1.0) && close(r.average.switched_off_compute, 0.0));
}

/// splitos: pComponents of 4 cores and 4 MiB of ExCache, two mComponents of 12 MiB.
#[test]
fn splitos_memory_follows_the_topology() {
    let nodes = [(4000, 16), (4000, 16)];
    // 16 MiB do not fit one mComponent: 12 go to one, 4 to the other, over two links.
    let task = [(1000, 16, 0.0, 10.0)];
    let r = replay_of(Kind::Splitos, &nodes, &task, "best-fit", "links:2");
    assert_eq!(
        (r.placed, r.peak_memory_on, r.memory_units, r.memory_unit_mib),
        (1, 2, 2, 12)
    );
    assert!(close(r.average.utilization_mem, (4.0 + 16.0) / 32.0));
    let r = replay_of(Kind::Splitos, &nodes, &task, "best-fit", "links:1");
    assert_eq!((r.placed, r.unplaced), (0, 1));
    // Racks: each pComponent reaches only its rack's mComponent, 12 MiB.
    let m = Model::new(
        Spec {
            kind: Kind::Splitos,
            topology: "racks:2".parse().unwrap(),
            excache_share: 0.25,
            vregion_mib: 4,
            memory_modules: 0,
        },
        &[Node { cpu: 4000, mem: 16 }; 2],
        1,
        PlacementPolicy::BestFit,
    )
    .unwrap();
    let (field, why) = m.oversized(&m.need(1000, 16)).unwrap();
    assert!(
        field == "mem" && why.contains("more than a compute unit can reach (12 MiB)"),
        "{why}"
    );
    assert!(m.oversized(&m.need(1000, 12)).is_none());
    let (field, _) = m.oversized(&m.need(5000, 1)).unwrap();
    assert_eq!(field, "cpu");
    let r = replay_of(
        Kind::Splitos,
        &nodes,
        &[(1000, 8, 0.0, 10.0), (1000, 8, 0.0, 10.0)],
        "first-fit",
        "racks:2",
    );
    assert_eq!(
        (r.placed, r.peak_compute_on, r.peak_memory_on),
        (2, 2, 2),
        "the second task's pComponent cannot reach the first mComponent's room"
    );
}

/// Memory fills rack after rack: a task goes to a rack whose memory has room, whatever
/// the policy's favourite compute unit in another.
#[test]
fn racks_fill_one_after_another() {
    let nodes = [(4000, 8); 16];
    let tasks: Vec<(u64, u64, f64, f64)> = (0..16).map(|i| (1000, 8, i as f64, 100.0)).collect();
    for policy in PLACEMENTS.map(|p| p.to_string()) {
        let r = replay_of(Kind::Disaggregated, &nodes, &tasks, &policy, "racks:2");
        assert_eq!((r.placed, r.unplaced, r.oversized), (16, 0, 0), "{policy}");
        assert_eq!(r.peak_memory_on, 16, "{policy}: all memory is used");
    }
}

/// A pComponent with its one link taken cannot reach a second mComponent: the task
/// waits and ends unplaced, though it is not too large.
#[test]
fn links_run_out_at_placement() {
    let nodes: Vec<Node> = vec![Node { cpu: 4000, mem: 16 }];
    let spec = Spec {
        kind: Kind::Splitos,
        topology: "links:1".parse().unwrap(),
        excache_share: 0.25,
        vregion_mib: 4,
        memory_modules: 2,
    };
    let tasks = vec![
        Task {
            name: "a".into(),
            row: 1,
            cpu: 1000,
            mem: 4,
            start: 0.0,
            end: 10.0,
        },
        Task {
            name: "b".into(),
            row: 2,
            cpu: 1000,
            mem: 4,
            start: 1.0,
            end: 5.0,
        },
    ];
    let w = Workload::new(tasks, 1, 0.0).unwrap();
    let m = Model::new(spec, &nodes, w.len(), PlacementPolicy::BestFit).unwrap();
    let needs: Vec<Option<Need>> = w
        .tasks
        .iter()
        .map(|t| Some(m.need(t.cpu, t.mem)).filter(|n| m.oversized(n).is_none()))
        .collect();
    assert!(needs.iter().all(Option::is_some), "neither task is too large");
    let r = replay(
        m,
        &w,
        &needs,
        100,
        3,
        (f64::NEG_INFINITY, f64::INFINITY),
        &indicatif::ProgressBar::hidden(),
    );
    assert_eq!((r.placed, r.unplaced, r.oversized, r.peak_memory_on), (1, 1, 0, 1));
    assert_eq!(r.audit.units_left_holding, 0);
}

/// Many tasks give up while one holds the only server: the queue is compacted and the
/// last one still gets the server.
#[test]
fn a_long_queue_of_waiting_tasks() {
    // The first to wait waits longest: the others give up behind it, out of the queue's
    // order.
    let mut tasks = vec![(4000, 8, 0.0, 1000.0), (4000, 8, 0.5, 950.0)];
    tasks.extend((0..200).map(|i| (4000, 8, 1.0 + i as f64, 500.0 + i as f64)));
    tasks.push((4000, 8, 900.0, 2000.0));
    let r = replay_of(Kind::Fixed, &[(4000, 8)], &tasks, "best-fit", "none");
    assert_eq!((r.placed, r.unplaced, r.waits.waited), (2, 201, 1));
    assert!(close(r.waits.max_seconds, 100.0));
}

/// GMM places each vRegion on the least loaded mComponent; best fit keeps a task's
/// memory together.
#[test]
fn gmm_spreads_vregions() {
    let nodes = [(4000, 16), (4000, 16)];
    let task = [(1000, 8, 0.0, 10.0)];
    let r = replay_of(Kind::Splitos, &nodes, &task, "least-loaded", "links:16");
    assert_eq!(r.peak_memory_on, 2);
    assert!(close(r.average.switched_off_memory, 0.0));
    let r = replay_of(Kind::Splitos, &nodes, &task, "best-fit", "links:16");
    assert_eq!(r.peak_memory_on, 1);
    assert!(
        close(r.average.switched_off_memory, 0.5) && close(r.average.fragmentation_mem, (2.0 + 4.0) / 32.0),
        "{}",
        r.average.fragmentation_mem
    );
}

/// Two tasks leave 1 core and 6 MiB on each server: no task of the list fits what is
/// left on either, so all of it is fragmented, and the third task finds the cluster
/// full. Pooled memory leaves the compute modules and memory usable by half of the list,
/// and takes the third task.
#[test]
fn a_static_list_fills_until_the_cluster_is_full() {
    let nodes = [(4000, 8), (4000, 8)];
    let tasks = [(3000, 2), (3000, 2), (1000, 7), (1000, 7)];
    let f = fill_of(Kind::Fixed, &nodes, &tasks, "none");
    let x = f.fill.as_ref().unwrap();
    assert_eq!((x.tried, x.failed, x.full, f.placed, f.unplaced), (3, 1, true, 2, 2));
    let first = x.first_failed.as_ref().unwrap();
    assert_eq!((first.task, first.row, first.name.as_str()), (2, 3, "t2"));
    assert!(close(first.arrived, 0.75));
    let c = &x.curve;
    assert_eq!(
        (c.tasks.as_slice(), c.placed.as_slice()),
        (&[0, 1, 2, 3][..], &[0, 1, 2, 2][..])
    );
    assert!(
        close(c.arrived[1], 3000.0 / 8000.0)
            && close(c.arrived_mem[1], 2.0 / 16.0)
            && close(c.arrived[3], 7000.0 / 8000.0)
    );
    // An empty cluster: every task fits a unit, nothing is fragmented.
    assert!(close(c.fragmentation_rate_cpu[0], 0.0) && close(c.fragmentation_rate_mem[0], 0.0));
    assert!(close(c.fragmentation_rate_cpu[2], 1.0) && close(c.fragmentation_rate_mem[2], 1.0));
    assert!(close(c.utilization_cpu[2], 0.75) && close(f.average.utilization_cpu, 0.75) && f.peak_compute_on == 2);

    let d = fill_of(Kind::Disaggregated, &nodes, &tasks, "none");
    let x = d.fill.as_ref().unwrap();
    assert_eq!((x.tried, x.failed, x.full, d.placed, d.unplaced), (4, 1, true, 3, 1));
    assert_eq!(x.first_failed.as_ref().unwrap().row, 4);
    // After two tasks: 1 core free on each compute module and 4 and 8 MiB on the memory
    // modules, usable by the tasks of 1 core and 7 MiB, half of the list.
    let c = &x.curve;
    assert!(
        close(c.fragmentation_rate_cpu[2], 0.5) && close(c.fragmentation_rate_mem[2], 0.5),
        "{} {}",
        c.fragmentation_rate_cpu[2],
        c.fragmentation_rate_mem[2]
    );
}

/// What fits what: a server too small for a task of the list leaves all its free
/// resources fragmented for that task; a memory module without room for a vRegion, or
/// in a rack whose compute units are full, is fragmented for every task.
#[test]
fn fragmentation_counts_what_the_list_cannot_use() {
    // A small and a large server; half the list needs the large one.
    let f = fill_of(Kind::Fixed, &[(1000, 4), (4000, 16)], &[(1000, 2), (4000, 16)], "none");
    let c = &f.fill.as_ref().unwrap().curve;
    // Empty: the small server (1 core, 4 MiB) serves half of the list.
    assert!(
        close(c.fragmentation_rate_cpu[0], 0.5 * 1000.0 / 5000.0)
            && close(c.fragmentation_rate_mem[0], 0.5 * 4.0 / 20.0)
    );
    assert_eq!(f.placed, 2);
    // splitos, two racks: the first task takes all the CPU of rack 0's pComponent, so
    // the rest of its ExCache and its mComponent's memory are of no use to anyone.
    let s = fill_of(Kind::Splitos, &[(1000, 16), (1000, 16)], &[(1000, 4)], "racks:2");
    let c = &s.fill.as_ref().unwrap().curve;
    // Free: rack 0's ExCache 4 - 1 MiB and mComponent 12 - 4 MiB (useless), rack 1's
    // ExCache 4 and mComponent 12 MiB (usable).
    assert!(
        close(c.fragmentation_rate_mem[1], 11.0 / 27.0),
        "{}",
        c.fragmentation_rate_mem[1]
    );
    assert!(close(c.fragmentation_rate_cpu[1], 0.0));
}
