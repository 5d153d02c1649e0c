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
                    "used_lines": c.used(), "pinned_lines": c.pinned_lines(), "fault_workers": self.cfg.fault_workers, "fault_cpu": self.cfg.fault_cpu.to_string(), "evict_reserve": self.cfg.evict_reserve, "share_floor": self.cfg.share_floor,
                },
                "compressed_tier": tier,
                "net": self.net.stats(),
                // Runs whose launcher is still connected (or whose processes said hello first).
                "runs": self.runs.lock().unwrap().len(),
                // Programs of users other than root, against `max_programs`.
                "users_programs": self.programs.lock().unwrap().held(),
                "processes": procs.iter().map(|p| serde_json::json!({"pid": p.pid, "os_pid": p.os_pid, "vnode": p.memory.who.vnode, "resident_lines": c.resident_of(p.pid)})).collect::<Vec<_>>(),
                "totals": self.miss.total().json(),
                "one_sided": splitos_core::counters::json(self.store.one_sided.stats.counters()),
                "idle_poll": {"in_force": self.idle.in_force(), "counters": splitos_core::counters::json(self.idle.stats.counters())},
            })
        })
        .to_string()
    }

    /// Its counters and gauges, and each job's, as they are at a scrape.
    pub(super) fn render_metrics(&self, e: &mut Exposition) {
        self.miss.total().render(e);
        splitos_core::counters::render(e, "pcomp_one_sided", self.store.one_sided.stats.counters());
        splitos_core::counters::render(e, "pcomp_idle_poll", self.idle.stats.counters());
        e.one(
            "pcomp_excache_used_lines",
            Kind::Gauge,
            "ExCache lines holding a page.",
            self.miss.with_cache(|c| c.used()) as f64,
        );
        e.one(
            "pcomp_excache_lines",
            Kind::Gauge,
            "ExCache lines, as last resized.",
            self.miss.with_cache(|c| c.lines()) as f64,
        );
        e.one(
            "pcomp_excache_pinned_lines",
            Kind::Gauge,
            "ExCache lines interleaving keeps local for good.",
            self.miss.with_cache(|c| c.pinned_lines()) as f64,
        );
        let shares = self.miss.shares();
        let vnode = |v: &String| vec![("vnode", v.clone())];
        e.family(
            "pcomp_excache_share_lines",
            Kind::Gauge,
            "ExCache lines a vNode keeps against other vNodes' misses.",
            shares.iter().map(|(v, share, _)| (vnode(v), *share as f64)),
        );
        e.family(
            "pcomp_excache_vnode_lines",
            Kind::Gauge,
            "ExCache lines the processes of a vNode with a share hold.",
            shares.iter().map(|(v, _, held)| (vnode(v), *held as f64)),
        );
        let (used, entries) = self
            .miss
            .tier_usage()
            .map_or((0, 0), |(_, _, _, used, entries)| (used, entries));
        e.one(
            "pcomp_tier_used_bytes",
            Kind::Gauge,
            "Bytes the compressed tier holds.",
            used as f64,
        );
        e.one(
            "pcomp_tier_entries",
            Kind::Gauge,
            "Pages the compressed tier holds.",
            entries as f64,
        );
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
        let job =
            |(pid, _, vnode): &(u64, Arc<RunStats>, String)| vec![("pid", pid.to_string()), ("vnode", vnode.clone())];
        let per_job = |c: fn(&RunStats) -> &std::sync::atomic::AtomicU64| {
            runs.iter()
                .map(move |r| (job(r), c(&r.1).load(std::sync::atomic::Ordering::Relaxed) as f64))
        };
        e.family(
            "pcomp_job_misses_total",
            Kind::Counter,
            "ExCache misses of a running job (its run's processes).",
            per_job(|s| &s.misses),
        );
        e.family(
            "pcomp_job_evictions_total",
            Kind::Counter,
            "ExCache lines a running job evicted.",
            per_job(|s| &s.evictions),
        );
        e.family(
            "pcomp_job_writebacks_total",
            Kind::Counter,
            "Lines a running job wrote back to mComponents.",
            per_job(|s| &s.flushes),
        );
    }
}
