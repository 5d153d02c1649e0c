//! The simulated keeper: leases, revisions and transactions as etcd keeps them, with its
//! requests and answers lost, late, or cut off for a manager.
use super::*;

/// Who holds what at the keeper, as etcd would.
pub(super) struct Kv {
    /// The keeper's time: never behind the simulation's, at most [`KEEPER_LATE`] ahead.
    pub(super) now: Instant,
    pub(super) revision: i64,
    pub(super) keys: BTreeMap<String, Held>,
    /// Each lease with when it expires, and its time to live.
    pub(super) leases: BTreeMap<i64, (Instant, Duration)>,
}

impl Kv {
    /// Moves the keeper's time to `t` (never back), expiring leases and their keys.
    pub(super) fn at(&mut self, t: Instant) {
        self.now = self.now.max(t);
        let now = self.now;
        let gone: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, (e, _))| *e <= now)
            .map(|(l, _)| *l)
            .collect();
        for l in gone {
            self.leases.remove(&l);
            self.keys.retain(|_, h| h.lease != l);
        }
    }

    pub(super) fn put(&mut self, key: &str, value: Vec<u8>, lease: i64) {
        self.revision += 1;
        let revision = self.keys.get(key).map_or(self.revision, |h| h.revision);
        self.keys.insert(key.to_string(), Held { value, revision, lease });
    }

    /// The manager whose term the leader key carries, with a live lease, if any.
    pub(super) fn leader(&self) -> Option<(String, i64)> {
        let h = self.keys.get("leader")?;
        self.leases
            .get(&h.lease)
            .filter(|(e, _)| *e > self.now)
            .map(|_| (String::from_utf8_lossy(&h.value).into_owned(), h.revision))
    }
}

/// What the simulation draws from, shared by the keeper's clients (everything runs on one
/// thread, in one order, so draws made inside the managers' calls replay too).
pub(super) struct World {
    pub(super) kv: Mutex<Kv>,
    pub(super) clock: Arc<Simulated>,
    pub(super) rng: Mutex<StdRng>,
    pub(super) tally: Mutex<BTreeMap<&'static str, u64>>,
    /// Set once the faults end: nothing is lost or late any more.
    pub(super) calm: AtomicBool,
}

impl World {
    pub(super) fn count(&self, what: &'static str) {
        *self.tally.lock().unwrap().entry(what).or_default() += 1;
    }

    /// A fault drawn with odds `n` in `d` (none once calm).
    pub(super) fn ratio(&self, n: u32, d: u32) -> bool {
        !self.calm.load(Relaxed) && self.rng.lock().unwrap().random_ratio(n, d)
    }
}

/// One manager's client of the keeper.
pub(super) struct SimKeeper {
    pub(super) world: Arc<World>,
    pub(super) cut: AtomicBool,
    pub(super) term: AtomicI64,
}

impl SimKeeper {
    /// A request to the keeper: refused while cut off, lost on the way one time in fifty,
    /// applied up to [`KEEPER_LATE`] ms late, and its answer lost one time in thirty.
    fn op<T>(&self, f: impl FnOnce(&mut Kv) -> anyhow::Result<T>) -> anyhow::Result<T> {
        anyhow::ensure!(!self.cut.load(Relaxed), "cut off from the keeper");
        if self.world.ratio(1, 50) {
            self.world.count("keeper requests lost");
            anyhow::bail!("the request to the keeper was lost");
        }
        let late = match self.world.calm.load(Relaxed) {
            true => Duration::ZERO,
            false => Duration::from_millis(self.world.rng.lock().unwrap().random_range(0..=KEEPER_LATE)),
        };
        let r = {
            let mut kv = self.world.kv.lock().unwrap();
            kv.at(self.world.clock.now() + late);
            f(&mut kv)
        };
        if self.world.ratio(1, 30) {
            self.world.count("keeper answers lost");
            anyhow::bail!("the keeper's answer was lost");
        }
        r
    }

    /// Whether `term` is the leader key's: a state write in another term is refused.
    fn fenced(kv: &Kv, term: i64) -> anyhow::Result<()> {
        anyhow::ensure!(
            term > 0 && kv.keys.get("leader").is_some_and(|h| h.revision == term),
            "this manager no longer leads (term {term})"
        );
        Ok(())
    }
}

impl Keeper for SimKeeper {
    fn grant(&self, ttl: Duration) -> anyhow::Result<i64> {
        self.op(|kv| {
            kv.revision += 1;
            let id = kv.revision;
            let expires = kv.now + ttl;
            kv.leases.insert(id, (expires, ttl));
            Ok(id)
        })
    }

    fn keep_alive(&self, lease: i64) -> anyhow::Result<bool> {
        self.op(|kv| {
            let now = kv.now;
            Ok(kv.leases.get_mut(&lease).map(|(e, ttl)| *e = now + *ttl).is_some())
        })
    }

    fn revoke(&self, lease: i64) -> anyhow::Result<()> {
        self.op(|kv| {
            kv.leases.remove(&lease);
            kv.keys.retain(|_, h| h.lease != lease);
            Ok(())
        })
    }

    fn put(&self, key: &str, value: Vec<u8>, lease: Option<i64>) -> anyhow::Result<()> {
        self.op(|kv| {
            let lease = lease.unwrap_or(0);
            anyhow::ensure!(lease == 0 || kv.leases.contains_key(&lease), "no such lease");
            kv.put(key, value, lease);
            Ok(())
        })
    }

    fn list(&self, prefix: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        self.op(|kv| {
            Ok(kv
                .keys
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, h)| (k[prefix.len()..].to_string(), h.value.clone()))
                .collect())
        })
    }

    fn get(&self, key: &str) -> anyhow::Result<Option<Held>> {
        self.op(|kv| Ok(kv.keys.get(key).cloned()))
    }

    fn claim(&self, key: &str, value: Vec<u8>, lease: i64) -> anyhow::Result<Claim> {
        self.op(|kv| {
            if let Some(h) = kv.keys.get(key) {
                return Ok(Claim::Held(Some(h.clone())));
            }
            anyhow::ensure!(kv.leases.contains_key(&lease), "no such lease");
            kv.put(key, value, lease);
            Ok(Claim::Won(kv.revision))
        })
    }

    fn delete_if(&self, key: &str, revision: i64) -> anyhow::Result<()> {
        self.op(|kv| {
            if kv.keys.get(key).is_some_and(|h| h.revision == revision) {
                kv.keys.remove(key);
            }
            Ok(())
        })
    }

    fn put_if(&self, guard: &str, revision: i64, key: &str, value: Vec<u8>, lease: i64) -> anyhow::Result<bool> {
        self.op(|kv| {
            if kv.keys.get(guard).is_none_or(|h| h.revision != revision) {
                return Ok(false);
            }
            kv.put(key, value, lease);
            Ok(true)
        })
    }

    fn lead_in(&self, term: i64) {
        self.term.store(term, Relaxed);
    }
}

impl state::Backend for SimKeeper {
    fn load(&self, table: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        self.list(&format!("state/{table}/"))
    }

    fn put(&self, table: &str, key: &str, value: Option<&[u8]>) -> anyhow::Result<()> {
        let term = self.term.load(Relaxed);
        let key = format!("state/{table}/{key}");
        self.op(|kv| {
            SimKeeper::fenced(kv, term)?;
            match value {
                Some(v) => kv.put(&key, v.to_vec(), 0),
                None => {
                    kv.keys.remove(&key);
                }
            }
            Ok(())
        })
    }
}
