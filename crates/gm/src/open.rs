//! The managers' start: their state opened, and their membership resumed from it (a restarted
//! manager, or a new leader, resumes with what the last one kept), on their clock.
use super::*;

impl Gm {
    pub(crate) fn now(&self) -> Instant {
        self.clock.now()
    }

    /// How long ago `t` was, in the managers' time.
    pub(crate) fn since(&self, t: Instant) -> Duration {
        self.now().saturating_duration_since(t)
    }

    /// The managers, resuming from what `state` keeps; `election`: theirs, when they are
    /// several.
    pub(crate) fn open(
        args: &GmArgs,
        addr: &str,
        t: &Arc<dyn splitos_rpc::Transport>,
        state: state::Store,
        election: Option<Arc<election::Election>>,
        clock: Arc<dyn clock::Clock>,
    ) -> anyhow::Result<Arc<Gm>> {
        let cfg = &args.cluster;
        let forget_dead = Duration::from_millis(cfg.forget_dead_ms);
        let authority = args
            .authority
            .as_deref()
            .map(|p| {
                splitos_rpc::auth::Authority::load(p)
                    .map_err(|e| anyhow::anyhow!("cannot read the cluster's authority {}: {e}", p.display()))
            })
            .transpose()?;
        let api_ca = args
            .api_ca
            .as_deref()
            .map(|p| {
                std::fs::read_to_string(p)
                    .map_err(|e| anyhow::anyhow!("cannot read the API's certificate authority {}: {e}", p.display()))
            })
            .transpose()?;
        let gm = Arc::new(Gm {
            addr: addr.to_string(),
            vregion_size: cfg.vregion_size.0,
            replication: cfg.replication.unwrap_or_default(),
            overcommit: cfg.overcommit,
            placement: splitos_core::placement::Placements::new(cfg.placement, state.clone())?,
            rebalance_percent: cfg.rebalance_percent,
            rebalancing: Mutex::new(None),
            forget_dead,
            reclaim_dead: Duration::from_millis(cfg.reclaim_dead_ms),
            period: beat::Period::new(
                cfg.heartbeats_per_s,
                Duration::from_millis(cfg.reclaim_dead_ms),
                clock.now(),
            ),
            comps: Mutex::new(
                Gm::resume(&state, clock.now())?
                    .into_iter()
                    .map(|e| (e.info.id, e))
                    .collect(),
            ),
            swept: Mutex::new(clock.now()),
            registering: Mutex::new(()),
            views: Default::default(),
            replaced: kept::Recent::open(state.clone(), state::Table("replaced-pcomponents"), forget_dead, &clock)?,
            replaced_mcomps: kept::Recent::open(
                state.clone(),
                state::Table("replaced-mcomponents"),
                forget_dead,
                &clock,
            )?,
            forgotten_mcomps: kept::Recent::open(
                state.clone(),
                state::Table("forgotten-mcomponents"),
                forget_dead,
                &clock,
            )?,
            detached: kept::Recent::open(state.clone(), state::Table("detached"), forget_dead, &clock)?,
            announced: Mutex::new(
                state
                    .load_keyed::<u64>(kept::ANNOUNCED)?
                    .into_iter()
                    .filter_map(|(id, fence)| {
                        let announced = membership::Announced { fence, told: true };
                        Some((id.parse().ok()?, announced))
                    })
                    .collect(),
            ),
            store: state.clone(),
            last_any: Mutex::new(clock.now()),
            started: clock.now(),
            vnodes: vnodes::Vnodes::open(state.clone(), &args.vnodes)?,
            cordons: cordon::Cordons::open(state.clone())?,
            quota_homes: Mutex::new(
                state
                    .load_keyed::<ComponentRef>(kept::QUOTA_HOMES)?
                    .into_iter()
                    .collect(),
            ),
            tokens: tokens::Tokens::open(state.clone())?,
            joins: joins::JoinTokens::open(state, authority, api_ca)?,
            metrics: std::sync::OnceLock::new(),
            rpc: Rpc::new(t.clone(), CONTROL_TIMEOUT),
            election,
            clock,
            write_failed_at: Mutex::new(None),
        });
        let resumed = gm.comps.lock().unwrap().len();
        crate::series::COMPONENTS_RESUMED.set(resumed as f64);
        if resumed > 0 {
            tracing::info!(components = resumed, "membership resumed from the managers' state: each component keeps its id, and gets a fresh start to heartbeat");
        }
        Ok(gm)
    }
}
