//! What the pComponent reports about itself: its statistics (`C2X_STATS`, shown by `cluster
//! status`) and its Prometheus metrics.
use super::*;

impl Pcomp {
    pub(super) fn stats_json(&self) -> String {
        let procs: Vec<Arc<Proc>> = self.procs.lock().unwrap().values().cloned().collect();
        let tier = self.miss.tier_usage().map(|(policy, codec, budget, used, entries)| serde_json::json!({"budget_bytes": budget, "used_bytes": used, "entries": entries, "policy": policy, "codec": codec}));
        // Read before the cache's lock is taken below: it takes that lock too.
        let (_, prefetch_policy) = self.miss.policy_names();
        self.miss.with_cache(|c| {
            serde_json::json!({
                "role": "pcomponent", "id": self.node.id(), "addr": self.node.addr,
                "uptime_ms": self.started.elapsed().as_millis() as u64,
                "excache": {
                    "capacity_bytes": c.lines() as u64 * PAGE_SIZE as u64, "max_bytes": c.max_lines() as u64 * PAGE_SIZE as u64, "lines": c.lines(), "ways": c.ways(),
                    "sets": c.sets(), "eviction": c.policy_name(), "piggyback": self.miss.piggyback(), "prefetch_lines": self.cfg.prefetch_lines, "prefetch": prefetch_policy, "victims_by_policy": c.victims_by_policy(), "policy_swaps": {"eviction": self.policies.eviction.generation(), "prefetch": self.policies.prefetch.generation()}, "fault_around": self.cfg.fault_around, "prealloc": self.cfg.prealloc, "heap_reuse": self.cfg.heap_reuse, "huge_pages": self.cfg.huge_pages.to_string(), "dirty_tracking": self.cfg.dirty_tracking.to_string(), "access_sampling": if self.sampling { "unmap" } else { "off" }, "one_sided": self.cfg.one_sided.to_string(), "idle_poll": self.cfg.idle_poll.to_string(),
                    "used_lines": c.used(), "pinned_lines": c.pinned_lines(), "fault_workers": self.cfg.fault_workers, "fault_cpu": self.cfg.fault_cpu.to_string(), "evict_reserve": self.cfg.reserve_ways(), "evict_beside": self.cfg.evict_beside, "share_floor": self.cfg.share_floor,
                },
                "compressed_tier": tier,
                "net": self.net.stats(),
                // Runs whose launcher is still connected (or whose processes said hello first).
                "runs": self.runs.lock().unwrap().len(),
                // Programs of users other than root, against `max_programs`.
                "users_programs": self.programs.lock().unwrap().held(),
                "processes": procs.iter().map(|p| serde_json::json!({"pid": p.pid, "os_pid": p.os_pid, "vnode": p.memory.who.vnode, "resident_lines": c.resident_of(p.pid)})).collect::<Vec<_>>(),
                "totals": self.miss.total().json(),
                "one_sided": splitos_metrics::counters::json(self.store.one_sided.stats.counters()),
                "idle_poll": {"in_force": self.idle.in_force(), "counters": splitos_metrics::counters::json(self.idle.stats.counters())},
                "home_refusals": self.refusals.json(),
                "ending": self.ending.json(),
            })
        })
        .to_string()
    }

    /// Its counters and gauges, and each job's, as they are at a scrape.
    pub(super) fn render_metrics(&self, e: &mut Exposition) {
        use crate::series::*;
        self.miss.total().render(e);
        self.store.one_sided.stats.render(e);
        self.idle.stats.render(e);
        self.net.c.render(e);
        e.one(&EXCACHE_USED_LINES, self.miss.with_cache(|c| c.used()) as f64);
        e.one(&EXCACHE_LINES, self.miss.with_cache(|c| c.lines()) as f64);
        e.one(&EXCACHE_PINNED_LINES, self.miss.with_cache(|c| c.pinned_lines()) as f64);
        let shares = self.miss.shares();
        e.family(
            &EXCACHE_SHARE_LINES,
            shares.iter().map(|(v, share, _)| ([v.clone()], *share as f64)),
        );
        e.family(
            &EXCACHE_VNODE_LINES,
            shares.iter().map(|(v, _, held)| ([v.clone()], *held as f64)),
        );
        let (used, entries) = self
            .miss
            .tier_usage()
            .map_or((0, 0), |(_, _, _, used, entries)| (used, entries));
        e.one(&TIER_USED_BYTES, used as f64);
        e.one(&TIER_ENTRIES, entries as f64);
        // A job is a run: the processes one `splitos run` started share its counters, and it
        // is named by its first process's pid (as `splitos ps` shows it; `job` is the label
        // Prometheus gives its own scrape jobs).
        let mut runs: Vec<(u64, Arc<RunStats>, String)> = Vec::new();
        for p in self.procs.lock().unwrap().values() {
            match runs.iter_mut().find(|(_, r, _)| Arc::ptr_eq(r, &p.heap.stats)) {
                Some(run) => run.0 = run.0.min(p.pid),
                None => runs.push((p.pid, p.heap.stats.clone(), p.memory.who.vnode.clone())),
            }
        }
        let per_job = |c: fn(&RunStats) -> &std::sync::atomic::AtomicU64| {
            runs.iter().map(move |(pid, stats, vnode)| {
                (
                    [pid.to_string(), vnode.clone()],
                    c(stats).load(std::sync::atomic::Ordering::Relaxed) as f64,
                )
            })
        };
        e.family(&JOB_MISSES, per_job(|s| &s.misses));
        e.family(&JOB_EVICTIONS, per_job(|s| &s.evictions));
        e.family(&JOB_WRITEBACKS, per_job(|s| &s.flushes));
    }
}
