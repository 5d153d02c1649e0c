//! The managers' election and lease, over what keeps them ([`Keeper`]: etcd in a running
//! cluster, etcd.rs; the simulator's store in the simulation, sim.rs).
//!
//! Under the cluster's prefix, the keeper holds:
//! - `leader`: the leading manager's address, under its lease. The key's create revision is
//!   the leader's term; a manager wins by creating the key when it is absent.
//! - `managers/ADDR`: every manager alive, under its lease.
//! - `state/TABLE/KEY`: the managers' state (`splitos_core::state`).
//! - `state/published/status`: the leader's last status, under its lease, which followers
//!   answer `C2G_STATUS` with.
//!
//! Fencing: every write of the state is a transaction on the leader key's create revision
//! being the writer's term, so that a manager that stopped leading cannot change it; and a
//! leader starts again as a follower (it executes itself anew, so that nothing it held while
//! leading outlives its term) the moment its lease may have run out at the keeper (from the
//! send time of its last answered keep-alive, the lease's time to live less a margin), before
//! another can be elected; a request it was serving then gets no answer.
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use splitos_core::state::StateKey;

use crate::clock::Clock;

/// How often a follower tries to win, and a leader checks it still leads.
pub(crate) const WATCH: Duration = Duration::from_millis(250);
/// How long before its lease may have run out at the keeper a leader stops serving: room for
/// the difference between its clock and the keeper's.
pub(crate) const MARGIN: Duration = Duration::from_millis(500);

/// The leader key as the keeper holds it.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub value: Vec<u8>,
    /// Its create revision: the term of the manager that holds it.
    pub revision: i64,
    pub lease: i64,
}

/// A claim's outcome: won (at this revision), or what holds the key.
pub(crate) enum Claim {
    Won(i64),
    Held(Option<Held>),
}

/// What keeps the election and the state for one manager: its client of the keeper, which
/// also fences its state writes by the term it leads in. Keys are relative to the cluster's
/// prefix.
pub(crate) trait Keeper: Send + Sync {
    /// A new lease that lives `ttl` unless kept alive.
    fn grant(&self, ttl: Duration) -> anyhow::Result<i64>;
    /// Keeps `lease` alive for another time to live; false when it had expired.
    fn keep_alive(&self, lease: i64) -> anyhow::Result<bool>;
    fn revoke(&self, lease: i64) -> anyhow::Result<()>;
    /// Puts `key` (under `lease`, if any).
    fn put(&self, key: &str, value: Vec<u8>, lease: Option<i64>) -> anyhow::Result<()>;
    /// Every key under `prefix`, without it, with its value.
    fn list(&self, prefix: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>>;
    fn get(&self, key: &str) -> anyhow::Result<Option<Held>>;
    /// Creates `key` under `lease` if it is absent.
    fn claim(&self, key: &str, value: Vec<u8>, lease: i64) -> anyhow::Result<Claim>;
    /// Deletes `key` if it was created at `revision`.
    fn delete_if(&self, key: &str, revision: i64) -> anyhow::Result<()>;
    /// Puts `key` under `lease` if `guard` was created at `revision`; whether it did.
    fn put_if(&self, guard: &str, revision: i64, key: &str, value: Vec<u8>, lease: i64) -> anyhow::Result<bool>;
    /// The term this manager's state writes are fenced by (0: it may write none).
    fn lead_in(&self, term: i64);
}

/// Who leads, as a manager last saw it.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub leader: Option<String>,
    pub term: u64,
}

/// What one round of the election found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Round {
    /// This manager won: it leads from now.
    Won,
    /// It leads, or follows, as before.
    Same,
    /// It led, and another leads now (or none does): it must step down.
    Deposed,
    /// The keeper did not answer.
    Unreachable,
}

/// Set once the manager is stopping: it then gives up what it holds and exits, and does not
/// start again.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Set once this run of the manager has led.
static LED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// This manager's part in the election: its lease, and whether it leads.
pub struct Election {
    keeper: Arc<dyn Keeper>,
    /// What listings and the published status are signed with, as every record of the state.
    key: StateKey,
    addr: String,
    ttl: Duration,
    clock: Arc<dyn Clock>,
    base: Instant,
    /// Until when (ns after `base`) this manager's lease is surely alive at the keeper.
    valid_until: AtomicU64,
    /// Its lease (0: none yet).
    lease: AtomicI64,
    /// The term it leads in (0: it follows).
    term: AtomicI64,
    seen: Mutex<Seen>,
}

impl Election {
    pub(crate) fn new(
        keeper: Arc<dyn Keeper>,
        key: StateKey,
        addr: &str,
        ttl: Duration,
        clock: Arc<dyn Clock>,
    ) -> Arc<Election> {
        Arc::new(Election {
            keeper,
            key,
            addr: addr.to_string(),
            ttl,
            base: clock.now(),
            clock,
            valid_until: AtomicU64::new(0),
            lease: AtomicI64::new(0),
            term: AtomicI64::new(0),
            seen: Mutex::new(Seen::default()),
        })
    }

    fn elapsed(&self) -> Duration {
        self.clock.now().saturating_duration_since(self.base)
    }

    /// Whether this manager leads now: it won, and its lease cannot have run out yet.
    pub fn leading(&self) -> bool {
        self.term.load(Ordering::Relaxed) > 0 && self.lease_alive()
    }

    /// Whether this manager's lease cannot have run out at the keeper yet.
    pub(crate) fn lease_alive(&self) -> bool {
        (self.elapsed().as_nanos() as u64) < self.valid_until.load(Ordering::Relaxed)
    }

    /// The term it leads in (0: it follows).
    pub(crate) fn term(&self) -> i64 {
        self.term.load(Ordering::Relaxed)
    }

    pub(crate) fn lease(&self) -> i64 {
        self.lease.load(Ordering::Relaxed)
    }

    pub fn seen(&self) -> Seen {
        self.seen.lock().unwrap().clone()
    }

    /// The managers alive, by address.
    pub fn managers(&self) -> Vec<String> {
        match self.keeper.list("managers/") {
            Ok(kvs) => kvs.into_iter().map(|(k, _)| k).collect(),
            Err(e) => {
                tracing::debug!(error = %e, "cannot list the managers");
                Vec::new()
            }
        }
    }

    /// Where each manager alive serves the REST API, beside its address: those whose listing
    /// a manager of this cluster signed, and that serve one.
    pub fn apis(&self) -> Vec<(String, String)> {
        self.signed("managers")
    }

    /// Where every manager of this cluster served the REST API, alive or not.
    pub fn apis_known(&self) -> Vec<String> {
        self.signed("apis").into_iter().map(|(_, api)| api).collect()
    }

    /// The records under `table/`, each beside its key, that a manager of this cluster signed
    /// and that are not empty.
    fn signed(&self, table: &str) -> Vec<(String, String)> {
        let kvs = match self.keeper.list(&format!("{table}/")) {
            Ok(kvs) => kvs,
            Err(e) => {
                tracing::debug!(error = %e, table, "cannot list the managers");
                return Vec::new();
            }
        };
        kvs.into_iter()
            .filter_map(|(key, record)| {
                let Some(value) = self.key.open(table, &key, &record) else {
                    splitos_core::series::GM_STATE_UNSIGNED.increment(1);
                    tracing::warn!(%key, table, "a manager's listing is not signed by a manager of this cluster; its API is not used");
                    return None;
                };
                let value = String::from_utf8_lossy(value).into_owned();
                (!value.is_empty()).then_some((key, value))
            })
            .collect()
    }

    /// Publishes what followers answer `C2G_STATUS` with: only while leading, and under this
    /// manager's lease, so that it goes with the leader.
    pub fn publish_status(&self, status: &[u8]) -> anyhow::Result<()> {
        let put = self.keeper.put_if(
            "leader",
            self.term(),
            "state/published/status",
            self.key.seal("published", "status", status),
            self.lease(),
        )?;
        anyhow::ensure!(put, "this manager no longer leads");
        Ok(())
    }

    /// The leader's last published status, if a manager of this cluster signed it.
    pub fn published_status(&self) -> Option<Vec<u8>> {
        let record = self.keeper.get("state/published/status").ok()??.value;
        let status = self.key.open("published", "status", &record);
        if status.is_none() {
            splitos_core::series::GM_STATE_UNSIGNED.increment(1);
            tracing::warn!("the published status is not signed by a manager of this cluster; it is not answered");
        }
        status.map(<[u8]>::to_vec)
    }

    /// Takes part in the election for good: keeps a lease, follows while another leads,
    /// calls `elected` once when this manager wins, and then makes this process start again
    /// (as a follower) the moment it may no longer lead. Never returns.
    pub fn run(self: Arc<Self>, elected: impl FnOnce() -> anyhow::Result<()>) -> ! {
        loop {
            match self.take_lease() {
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot take a lease; trying again");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        let mut elected = Some(elected);
        // Apart from the election's own requests (each up to its timeout), so that a leader
        // whose lease may have run out stops at once. A follower whose lease may have run out
        // starts again too: its listing among the managers went with the lease, and the new
        // run takes a new one.
        let watched = self.clone();
        std::thread::Builder::new()
            .name("lease-watch".into())
            .spawn(move || loop {
                if !watched.lease_alive() {
                    step_down("its lease may have run out (it cannot reach the keeper's majority)");
                }
                std::thread::sleep(Duration::from_millis(20));
            })
            .expect("spawn the lease watch");
        let kept = self.clone();
        std::thread::Builder::new()
            .name("lease-keeper".into())
            .spawn(move || loop {
                match kept.renew() {
                    Ok(true) => std::thread::sleep(kept.ttl / 4),
                    // Whatever this manager led, it no longer does, and its listing is gone.
                    Ok(false) => step_down("its lease expired at the keeper"),
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot keep the lease alive");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            })
            .expect("spawn the lease keeper");
        loop {
            match self.round() {
                Round::Won => {
                    if let Some(f) = elected.take() {
                        if let Err(e) = f() {
                            tracing::error!(error = %e, "cannot start leading");
                            // Another manager may lead at once, not after the lease.
                            self.revoke();
                            step_down("it could not start leading");
                        }
                    }
                }
                Round::Deposed => step_down("another manager leads"),
                Round::Same | Round::Unreachable => {}
            }
            std::thread::sleep(WATCH);
        }
    }

    /// Takes a lease, kept alive from now on by [`Election::renew`], with this manager listed
    /// under it.
    pub(crate) fn take_lease(&self) -> anyhow::Result<i64> {
        // The keeper counts the lease from when it grants it, which is after this.
        let asked = self.elapsed();
        let id = self.keeper.grant(self.ttl)?;
        self.lease.store(id, Ordering::Relaxed);
        self.valid_until.store(
            (asked + self.ttl).saturating_sub(MARGIN).as_nanos() as u64,
            Ordering::Relaxed,
        );
        // Listed with where it serves the REST API, signed: a client is sent there with its
        // token, so a listing planted by someone who can write the keeper must not count.
        let api = crate::manager::API_AT.get().cloned().unwrap_or_default();
        self.keeper.put(
            &format!("managers/{}", self.addr),
            self.key.seal("managers", &self.addr, api.as_bytes()),
            Some(id),
        )?;
        // Kept after this manager is gone: a dashboard it served reads the stream from another
        // manager, which lets that page's origin in (api/follow.rs).
        if !api.is_empty() {
            self.keeper.put(
                &format!("apis/{api}"),
                self.key.seal("apis", &api, api.as_bytes()),
                None,
            )?;
        }
        Ok(id)
    }

    /// One keep-alive of the lease: true when it lives on (and until when is known again),
    /// false when it had expired at the keeper.
    pub(crate) fn renew(&self) -> anyhow::Result<bool> {
        let sent = self.elapsed();
        let alive = self.keeper.keep_alive(self.lease())?;
        if alive {
            self.valid_until.store(
                (sent + self.ttl).saturating_sub(MARGIN).as_nanos() as u64,
                Ordering::Relaxed,
            );
        }
        Ok(alive)
    }

    /// One round: a follower tries to win, a leader checks it still leads.
    pub(crate) fn round(&self) -> Round {
        let r = match self.term() > 0 {
            true => self
                .check()
                .map(|still| if still { Round::Same } else { Round::Deposed }),
            false => self.campaign(self.lease()),
        };
        r.unwrap_or_else(|e| {
            tracing::debug!(error = %e, "cannot take part in the election (the keeper unreachable?)");
            Round::Unreachable
        })
    }

    /// Gives up the lease, and with it the lead if this manager has it: another manager takes
    /// over at once instead of after the lease's time to live.
    pub fn resign(&self) {
        STOPPING.store(true, Ordering::Relaxed);
        if self.lease() != 0 {
            self.valid_until.store(0, Ordering::Relaxed);
            self.revoke();
        }
    }

    pub(crate) fn revoke(&self) {
        match self.keeper.revoke(self.lease()) {
            Ok(()) => tracing::info!("lease given up: another manager can lead at once"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot give up the lease; another manager leads once it runs out")
            }
        }
    }

    fn leads_in(&self, term: i64) {
        LED.store(true, Ordering::Relaxed);
        self.term.store(term, Ordering::Relaxed);
        self.keeper.lead_in(term);
        *self.seen.lock().unwrap() = Seen {
            leader: Some(self.addr.clone()),
            term: term as u64,
        };
        tracing::info!(addr = %self.addr, term, "this manager leads now");
        crate::series::ELECTIONS_WON.increment(1);
        crate::series::LEADING.set(1.0);
    }

    /// Tries to become the leader.
    fn campaign(&self, lease: i64) -> anyhow::Result<Round> {
        let held = match self.keeper.claim("leader", self.addr.clone().into_bytes(), lease)? {
            Claim::Won(term) => {
                self.leads_in(term);
                return Ok(Round::Won);
            }
            Claim::Held(held) => held,
        };
        let mine = held.as_ref().filter(|h| h.value == self.addr.as_bytes());
        // This manager's own key: it won, but the answer was lost (it timed out).
        if let Some(h) = mine.filter(|h| h.lease == lease) {
            self.leads_in(h.revision);
            return Ok(Round::Won);
        }
        // This manager's address under another lease: an earlier run of this manager led, and
        // is gone (this process holds its address now). Its key goes at once, not when its
        // lease runs out, and only that term's key.
        if let Some(h) = mine {
            self.keeper.delete_if("leader", h.revision)?;
            tracing::info!(
                term = h.revision,
                "the lead of an earlier run of this manager is given up"
            );
            return Ok(Round::Same);
        }
        let mut seen = self.seen.lock().unwrap();
        let now = Seen {
            leader: held.as_ref().map(|h| String::from_utf8_lossy(&h.value).into_owned()),
            term: held.map_or(0, |h| h.revision as u64),
        };
        if now.leader != seen.leader {
            tracing::info!(leader = ?now.leader, term = now.term, "following");
        }
        *seen = now;
        Ok(Round::Same)
    }

    /// Whether the leader key is still this manager's, in its term.
    fn check(&self) -> anyhow::Result<bool> {
        let term = self.term();
        Ok(self
            .keeper
            .get("leader")?
            .is_some_and(|h| h.revision == term && h.value == self.addr.as_bytes()))
    }
}

/// Ends this run of the manager, when it may no longer lead or its lease may have run out: it
/// starts again, the same process with the same arguments, as a follower (or exits, when it
/// is stopping).
pub fn step_down(why: &str) -> ! {
    crate::series::LEADING.set(0.0);
    if STOPPING.load(Ordering::Relaxed) {
        tracing::info!(why, "stopped");
        std::process::exit(0);
    }
    match LED.load(Ordering::Relaxed) {
        true => tracing::warn!(why, "this manager stops leading and starts again as a follower"),
        false => tracing::warn!(why, "this manager starts again, to follow under a new lease"),
    }
    use std::os::unix::process::CommandExt;
    // The binary by its path, so that the new image's command line is the one this process
    // was started with (an operator or supervisor finds it by it); the kernel's link to the
    // running image if that path is gone (the binary was replaced meanwhile).
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_default();
    let exe = std::env::current_exe()
        .ok()
        .filter(|p| p.exists())
        .unwrap_or_else(|| "/proc/self/exe".into());
    let mut again = std::process::Command::new(exe);
    // The new image serves the REST API where this one did (its port may have been any free
    // one): clients and dashboards keep the address they have.
    if let Some(at) = crate::manager::API_AT.get() {
        again.env(crate::manager::API_AGAIN, at);
    }
    let err = again.arg0(argv0).args(args).exec();
    tracing::error!(error = %err, "cannot start again; exiting");
    std::process::exit(1)
}
