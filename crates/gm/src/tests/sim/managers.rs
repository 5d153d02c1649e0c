//! The managers' processes as the simulator runs them: started, paused, killed; their lease
//! watch, keep-alives and election rounds; the real managers opened when one wins.
use super::*;

/// A manager's process, as the simulator runs it.
pub(super) struct Mgr {
    pub(super) addr: String,
    pub(super) keeper: Arc<SimKeeper>,
    /// Its election and what answers its address; none while it is down.
    pub(super) run: Option<(Arc<Election>, Arc<Manager>)>,
    pub(super) lease_taken: bool,
    pub(super) next_round: Instant,
    pub(super) next_renew: Instant,
    pub(super) paused_until: Option<Instant>,
    pub(super) down_until: Option<Instant>,
    /// Heard by the managers it leads now: each component's last heartbeat or registration
    /// answered, when they opened or took every component for alive after a stall (`fresh`),
    /// their last heartbeat of all, the mComponents they are detaching.
    pub(super) heard: BTreeMap<u32, Instant>,
    pub(super) fresh: Instant,
    pub(super) last_any: Option<Instant>,
    pub(super) detaching: BTreeSet<u32>,
}

impl Sim {
    pub(super) fn start_manager(&mut self, m: usize) {
        let g = &mut self.mgrs[m];
        let election = Election::new(
            g.keeper.clone(),
            self.key.clone(),
            &g.addr,
            LEASE,
            self.world.clock.clone() as Arc<dyn Clock>,
        );
        g.keeper.lead_in(0);
        let manager = Arc::new(Manager {
            election: election.clone(),
            gm: std::sync::OnceLock::new(),
            store: state::Store::on(g.keeper.clone(), self.key.clone()),
        });
        g.run = Some((election, manager));
        g.lease_taken = false;
        g.down_until = None;
        g.next_round = self.world.clock.now();
    }

    /// The manager's process ends (it steps down, or is killed): a new one starts later.
    pub(super) fn end_manager(&mut self, m: usize, why: &str, after: Duration) {
        let now = self.now();
        let g = &mut self.mgrs[m];
        g.run = None;
        g.keeper.lead_in(0);
        g.paused_until = None;
        g.down_until = Some(now + after);
        let addr = g.addr.clone();
        self.note("managers ended", format!("manager {addr} ends: {why}"));
    }

    /// What a manager does in a step: its lease watch, keep-alive and election round.
    pub(super) fn manager_step(&mut self, m: usize, seed: u64) {
        let now = self.now();
        if self.mgrs[m].down_until.is_some_and(|u| u <= now) {
            self.start_manager(m);
        }
        if self.mgrs[m].paused_until.is_some_and(|u| u > now) {
            return;
        }
        if self.mgrs[m].paused_until.take().is_some() {
            let addr = self.mgrs[m].addr.clone();
            self.note("managers resumed", format!("manager {addr} resumes"));
            // Requests that arrived while it was paused are served before its lease watch
            // runs: the order in which a resumed process's threads run is not given.
            self.deliver(seed, Some(m));
        }
        let Some((election, _)) = self.mgrs[m].run.clone() else {
            return;
        };
        if !self.mgrs[m].lease_taken {
            if now >= self.mgrs[m].next_round {
                match election.take_lease() {
                    Ok(l) => {
                        self.mgrs[m].lease_taken = true;
                        self.mgrs[m].next_renew = now + LEASE / 4;
                        let addr = self.mgrs[m].addr.clone();
                        self.note("leases taken", format!("manager {addr} takes lease {l}"));
                    }
                    Err(_) => self.mgrs[m].next_round = now + Duration::from_secs(1),
                }
            }
            return;
        }
        if !election.lease_alive() {
            self.end_manager(m, "its lease may have run out", Duration::from_millis(100));
            return;
        }
        if now >= self.mgrs[m].next_renew {
            match election.renew() {
                Ok(true) => self.mgrs[m].next_renew = now + LEASE / 4,
                Ok(false) => return self.end_manager(m, "its lease expired at the keeper", Duration::from_millis(100)),
                Err(_) => self.mgrs[m].next_renew = now + Duration::from_millis(200),
            }
        }
        if now >= self.mgrs[m].next_round {
            self.mgrs[m].next_round = now + WATCH;
            match election.round() {
                Round::Won => self.lead(m),
                Round::Deposed => self.end_manager(m, "another manager leads", Duration::from_millis(100)),
                Round::Same | Round::Unreachable => {}
            }
        }
    }

    /// Manager `m` won: it opens the managers from the keeper's state. One `Gm` a process (its
    /// placement Ebb has a static id): another manager's, left by a paused leader deposed
    /// meanwhile, is dropped first, as that process would drop it when it resumes.
    pub(super) fn lead(&mut self, m: usize) {
        for o in (0..MANAGERS).filter(|o| *o != m) {
            let Some((e, old)) = self.mgrs[o].run.clone() else {
                continue;
            };
            if old.gm.get().is_some() {
                self.mgrs[o].run = Some((
                    e.clone(),
                    Arc::new(Manager {
                        election: e,
                        gm: std::sync::OnceLock::new(),
                        store: old.store.clone(),
                    }),
                ));
            }
        }
        let (election, manager) = self.mgrs[m].run.clone().expect("it runs");
        let store = state::Store::on(self.mgrs[m].keeper.clone(), self.key.clone());
        let addr = self.mgrs[m].addr.clone();
        let opened = Gm::open(
            &self.args,
            &addr,
            &self.t,
            store,
            Some(election.clone()),
            self.world.clock.clone() as Arc<dyn Clock>,
        );
        match opened {
            Ok(gm) => {
                let _ = manager.gm.set(gm);
                let now = self.now();
                let g = &mut self.mgrs[m];
                g.heard.clear();
                g.fresh = now;
                g.last_any = Some(now);
                g.detaching.clear();
                self.note(
                    "elections won",
                    format!("manager {addr} leads in term {}", election.term()),
                );
            }
            Err(e) => {
                election.revoke();
                self.end_manager(
                    m,
                    &format!("it could not start leading: {e}"),
                    Duration::from_millis(100),
                );
            }
        }
    }
}
