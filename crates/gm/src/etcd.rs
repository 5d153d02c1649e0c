//! Several global managers with their state in etcd (`[cluster] etcd`): one leads, elected
//! through etcd, and the others follow, answer reads and take over when it goes.
//!
//! Under the cluster's prefix, etcd holds:
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
//! leading outlives its term) the moment its lease may have run out at etcd (from the send
//! time of its last answered keep-alive, the lease's time to live less a margin), before
//! another can be elected; a request it was serving then gets no answer.
use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, PutOptions, TlsOptions, Txn, TxnOp,
};

use splitos_core::state::{Backend, StateKey};

/// How long one request to etcd may take.
const OP_TIMEOUT: Duration = Duration::from_secs(2);
/// How often a follower tries to win, and a leader checks it still leads.
const WATCH: Duration = Duration::from_millis(250);
/// How long before its lease may have run out at etcd a leader stops serving: room for the
/// difference between its clock and etcd's.
const MARGIN: Duration = Duration::from_millis(500);

/// The cluster's state and election in etcd, as one manager sees them.
pub struct Etcd {
    rt: tokio::runtime::Handle,
    client: Client,
    prefix: String,
    /// The term this manager leads in (the create revision of its leader key); 0 while it
    /// follows.
    term: AtomicI64,
    /// What the published status is signed with, as every record of the state.
    key: StateKey,
}

/// The files the managers prove themselves to etcd with, and check etcd's certificate
/// against.
pub struct Tls<'a> {
    pub ca: &'a std::path::Path,
    pub cert: &'a std::path::Path,
    pub key: &'a std::path::Path,
}

impl Tls<'_> {
    fn options(&self) -> anyhow::Result<TlsOptions> {
        let read =
            |p: &std::path::Path| std::fs::read(p).map_err(|e| anyhow::anyhow!("etcd's TLS: {}: {e}", p.display()));
        let key = splitos_rpc::auth::read_private(self.key).map_err(|e| anyhow::anyhow!("etcd's TLS: {e}"))?;
        Ok(TlsOptions::new()
            .ca_certificate(Certificate::from_pem(read(self.ca)?))
            .identity(Identity::from_pem(read(self.cert)?, key)))
    }
}

fn key_error(e: etcd_client::Error) -> anyhow::Error {
    anyhow::anyhow!("etcd: {e}")
}

impl Etcd {
    /// A client of the etcd cluster at `endpoints`, for the cluster whose keys start with
    /// `prefix`, over TLS with `tls` for https endpoints. It connects lazily: etcd may come
    /// up after the managers.
    pub fn connect(endpoints: &[String], prefix: &str, tls: Option<Tls>, key: StateKey) -> anyhow::Result<Arc<Etcd>> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = rt.handle().clone();
        std::thread::Builder::new()
            .name("etcd".into())
            .spawn(move || rt.block_on(std::future::pending::<()>()))?;
        let eps: Vec<String> = endpoints.to_vec();
        // A request to a member cut off from the majority fails instead of answering from its
        // stale copy.
        let mut options = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(OP_TIMEOUT)
            .with_timeout(OP_TIMEOUT)
            .with_keep_alive(Duration::from_secs(1), OP_TIMEOUT);
        if endpoints.iter().any(|e| e.starts_with("https://")) {
            let tls = tls.ok_or_else(|| anyhow::anyhow!("etcd over https needs the managers' client certificate (--etcd-ca, --etcd-cert, --etcd-key; `cluster up` issues them)"))?;
            options = options.with_tls(tls.options()?);
        }
        let client = wait(&handle, async move {
            Client::connect(eps, Some(options)).await.map_err(key_error)
        })?;
        Ok(Arc::new(Etcd {
            rt: handle,
            client,
            prefix: prefix.trim_end_matches('/').to_string(),
            term: AtomicI64::new(0),
            key,
        }))
    }

    fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.prefix)
    }

    /// Runs a request on the client's runtime and waits for it, from any thread but the
    /// client's own (an async one included); one that takes longer than [`OP_TIMEOUT`] fails.
    fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(Client) -> std::pin::Pin<Box<dyn Future<Output = Result<T, etcd_client::Error>> + Send>>,
    ) -> anyhow::Result<T> {
        let fut = f(self.client.clone());
        wait(&self.rt, async move { fut.await.map_err(key_error) })
    }

    pub fn term(&self) -> u64 {
        self.term.load(Ordering::Relaxed).max(0) as u64
    }
}

fn wait<T: Send + 'static>(
    rt: &tokio::runtime::Handle,
    f: impl Future<Output = anyhow::Result<T>> + Send + 'static,
) -> anyhow::Result<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let r = match tokio::time::timeout(OP_TIMEOUT, f).await {
            Ok(r) => r,
            Err(_) => Err(anyhow::anyhow!("etcd did not answer within {OP_TIMEOUT:?}")),
        };
        let _ = tx.send(r);
    });
    rx.recv().map_err(|_| anyhow::anyhow!("the etcd client stopped"))?
}

impl Backend for Etcd {
    fn load(&self, table: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let prefix = self.key(&format!("state/{table}/"));
        // A read may be sent again: the client may have picked a member that is cut off, and
        // picks another the next time.
        let mut tries = 0;
        let r = loop {
            let p = prefix.clone();
            match self.run(move |mut c| Box::pin(async move { c.get(p, Some(GetOptions::new().with_prefix())).await }))
            {
                Ok(r) => break r,
                Err(e) if tries < 3 => {
                    tries += 1;
                    tracing::debug!(error = %e, table, "reading the state from etcd failed; trying again");
                }
                Err(e) => return Err(e),
            }
        };
        Ok(r.kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned(),
                    kv.value().to_vec(),
                )
            })
            .collect())
    }

    fn put(&self, table: &str, key: &str, value: Option<&[u8]>) -> anyhow::Result<()> {
        let term = self.term.load(Ordering::Relaxed);
        if term <= 0 {
            anyhow::bail!("this manager does not lead: it may not change the cluster's state");
        }
        let k = self.key(&format!("state/{table}/{key}"));
        let op = match value {
            Some(v) => TxnOp::put(k, v.to_vec(), None),
            None => TxnOp::delete(k, None),
        };
        let txn = Txn::new()
            .when([Compare::create_revision(self.key("leader"), CompareOp::Equal, term)])
            .and_then([op]);
        let r = self.run(move |mut c| Box::pin(async move { c.txn(txn).await }))?;
        if !r.succeeded() {
            anyhow::bail!("this manager no longer leads (term {term} ended): it may not change the cluster's state");
        }
        Ok(())
    }
}

/// Who leads, as a manager last saw it.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub leader: Option<String>,
    pub term: u64,
}

/// Set once the manager is stopping: it then gives up what it holds and exits, and does not
/// start again.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Set once this run of the manager has led.
static LED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// This manager's part in the election: its lease, and whether it leads.
pub struct Election {
    pub etcd: Arc<Etcd>,
    addr: String,
    ttl: Duration,
    base: Instant,
    /// Until when (ns after `base`) this manager's lease is surely alive at etcd.
    valid_until: AtomicU64,
    /// Its lease (0: none yet).
    lease: AtomicI64,
    seen: Mutex<Seen>,
}

impl Election {
    pub fn new(etcd: Arc<Etcd>, addr: &str, ttl: Duration) -> Arc<Election> {
        Arc::new(Election {
            etcd,
            addr: addr.to_string(),
            ttl,
            base: Instant::now(),
            valid_until: AtomicU64::new(0),
            lease: AtomicI64::new(0),
            seen: Mutex::new(Seen::default()),
        })
    }

    /// Whether this manager leads now: it won, and its lease cannot have run out yet.
    pub fn leading(&self) -> bool {
        self.etcd.term.load(Ordering::Relaxed) > 0 && self.lease_alive()
    }

    /// Whether this manager's lease cannot have run out at etcd yet.
    fn lease_alive(&self) -> bool {
        (self.base.elapsed().as_nanos() as u64) < self.valid_until.load(Ordering::Relaxed)
    }

    pub fn seen(&self) -> Seen {
        self.seen.lock().unwrap().clone()
    }

    /// The managers alive, by address.
    pub fn managers(&self) -> Vec<String> {
        let p = self.etcd.key("managers/");
        let p2 = p.clone();
        match self
            .etcd
            .run(move |mut c| Box::pin(async move { c.get(p2, Some(GetOptions::new().with_prefix())).await }))
        {
            Ok(r) => r
                .kvs()
                .iter()
                .map(|kv| String::from_utf8_lossy(&kv.key()[p.len()..]).into_owned())
                .collect(),
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
        let p = self.etcd.key(&format!("{table}/"));
        let p2 = p.clone();
        let r = match self
            .etcd
            .run(move |mut c| Box::pin(async move { c.get(p2, Some(GetOptions::new().with_prefix())).await }))
        {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, table, "cannot list the managers");
                return Vec::new();
            }
        };
        r.kvs()
            .iter()
            .filter_map(|kv| {
                let key = String::from_utf8_lossy(&kv.key()[p.len()..]).into_owned();
                let Some(value) = self.etcd.key.open(table, &key, kv.value()) else {
                    splitos_core::series::GM_STATE_UNSIGNED.increment(1);
                    tracing::warn!(%key, table, "a manager's listing in etcd is not signed by a manager of this cluster; its API is not used");
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
        let term = self.etcd.term.load(Ordering::Relaxed);
        let lease = self.lease.load(Ordering::Relaxed);
        let put = TxnOp::put(
            self.etcd.key("state/published/status"),
            self.etcd.key.seal("published", "status", status),
            Some(PutOptions::new().with_lease(lease)),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.etcd.key("leader"),
                CompareOp::Equal,
                term,
            )])
            .and_then([put]);
        let r = self.etcd.run(move |mut c| Box::pin(async move { c.txn(txn).await }))?;
        anyhow::ensure!(r.succeeded(), "this manager no longer leads");
        Ok(())
    }

    /// The leader's last published status, if a manager of this cluster signed it.
    pub fn published_status(&self) -> Option<Vec<u8>> {
        let k = self.etcd.key("state/published/status");
        let r = self
            .etcd
            .run(move |mut c| Box::pin(async move { c.get(k, None).await }))
            .ok()?;
        let record = r.kvs().first()?.value();
        let status = self.etcd.key.open("published", "status", record);
        if status.is_none() {
            splitos_core::series::GM_STATE_UNSIGNED.increment(1);
            tracing::warn!(
                "the published status in etcd is not signed by a manager of this cluster; it is not answered"
            );
        }
        status.map(<[u8]>::to_vec)
    }

    /// Takes part in the election for good: keeps a lease, follows while another leads,
    /// calls `elected` once when this manager wins, and then makes this process start again
    /// (as a follower) the moment it may no longer lead. Never returns.
    pub fn run(self: Arc<Self>, elected: impl FnOnce() -> anyhow::Result<()>) -> ! {
        let lease = loop {
            match self.lease() {
                Ok(l) => break l,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot take a lease in etcd; trying again");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        };
        let mut elected = Some(elected);
        // Apart from the election's own requests to etcd (each up to its timeout), so that a
        // leader whose lease may have run out stops at once. A follower whose lease may have
        // run out starts again too: its listing among the managers went with the lease, and
        // the new run takes a new one.
        let watched = self.clone();
        std::thread::Builder::new()
            .name("lease-watch".into())
            .spawn(move || loop {
                if !watched.lease_alive() {
                    step_down("its lease may have run out at etcd (it cannot reach a majority)");
                }
                std::thread::sleep(Duration::from_millis(20));
            })
            .expect("spawn the lease watch");
        loop {
            if self.etcd.term.load(Ordering::Relaxed) > 0 {
                match self.check() {
                    Ok(true) => {}
                    Ok(false) => step_down("another manager leads"),
                    Err(e) => tracing::debug!(error = %e, "cannot check the leadership (etcd unreachable?)"),
                }
            } else {
                match self.campaign(lease) {
                    Ok(true) => {
                        let term = self.etcd.term();
                        tracing::info!(addr = %self.addr, term, "this manager leads now");
                        crate::series::ELECTIONS_WON.increment(1);
                        crate::series::LEADING.set(1.0);
                        if let Some(f) = elected.take() {
                            if let Err(e) = f() {
                                tracing::error!(error = %e, "cannot start leading");
                                // Another manager may lead at once, not after the lease.
                                self.revoke();
                                step_down("it could not start leading");
                            }
                        }
                    }
                    Ok(false) => {}
                    Err(e) => tracing::debug!(error = %e, "cannot campaign (etcd unreachable?)"),
                }
            }
            std::thread::sleep(WATCH);
        }
    }

    /// A lease kept alive from now on (`valid_until` follows its keep-alives), with this
    /// manager listed under it.
    fn lease(self: &Arc<Self>) -> anyhow::Result<i64> {
        let ttl = self.ttl.as_secs() as i64;
        // etcd counts the lease from when it grants it, which is after this.
        let asked = self.base.elapsed();
        let granted = self
            .etcd
            .run(move |mut c| Box::pin(async move { c.lease_grant(ttl, None).await }))?;
        let id = granted.id();
        self.lease.store(id, Ordering::Relaxed);
        // Listed with where it serves the REST API, signed: a client is sent there with its
        // token, so a listing planted by someone who can write etcd must not count.
        let api = crate::manager::API_AT.get().cloned().unwrap_or_default();
        let (key, listing) = (
            self.etcd.key(&format!("managers/{}", self.addr)),
            self.etcd.key.seal("managers", &self.addr, api.as_bytes()),
        );
        self.etcd.run(move |mut c| {
            Box::pin(async move { c.put(key, listing, Some(PutOptions::new().with_lease(id))).await })
        })?;
        // Kept after this manager is gone: a dashboard it served reads the stream from another
        // manager, which lets that page's origin in (api/follow.rs).
        if !api.is_empty() {
            let (key, kept) = (
                self.etcd.key(&format!("apis/{api}")),
                self.etcd.key.seal("apis", &api, api.as_bytes()),
            );
            self.etcd
                .run(move |mut c| Box::pin(async move { c.put(key, kept, None).await }))?;
        }
        let me = self.clone();
        let mut client = self.etcd.client.clone();
        self.valid_until.store(
            (asked + self.ttl).saturating_sub(MARGIN).as_nanos() as u64,
            Ordering::Relaxed,
        );
        self.etcd.rt.spawn(async move {
            loop {
                match tokio::time::timeout(OP_TIMEOUT, client.lease_keep_alive(id))
                    .await
                    .unwrap_or_else(|_| Err(etcd_client::Error::InvalidArgs("no answer".into())))
                {
                    Ok((mut keeper, mut stream)) => loop {
                        let sent = me.base.elapsed();
                        let alive = async {
                            keeper.keep_alive().await?;
                            stream.message().await
                        };
                        match tokio::time::timeout(OP_TIMEOUT, alive).await {
                            Ok(Ok(Some(r))) if r.ttl() > 0 => me.valid_until.store(
                                (sent + me.ttl).saturating_sub(MARGIN).as_nanos() as u64,
                                Ordering::Relaxed,
                            ),
                            Ok(Ok(Some(_))) => {
                                // The lease expired at etcd: whatever this manager led, it no
                                // longer does, and its listing is gone.
                                step_down("its lease expired at etcd");
                            }
                            _ => break,
                        }
                        tokio::time::sleep(me.ttl / 4).await;
                    },
                    Err(e) => tracing::debug!(error = %e, "cannot keep the lease alive"),
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Ok(id)
    }

    /// Gives up the lease, and with it the lead if this manager has it: another manager takes
    /// over at once instead of after the lease's time to live.
    pub fn resign(&self) {
        STOPPING.store(true, Ordering::Relaxed);
        if self.lease.load(Ordering::Relaxed) != 0 {
            self.valid_until.store(0, Ordering::Relaxed);
            self.revoke();
        }
    }

    fn revoke(&self) {
        let id = self.lease.load(Ordering::Relaxed);
        match self
            .etcd
            .run(move |mut c| Box::pin(async move { c.lease_revoke(id).await }))
        {
            Ok(_) => tracing::info!("lease given up: another manager can lead at once"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot give up the lease; another manager leads once it runs out")
            }
        }
    }

    /// Tries to become the leader; true when this manager won.
    fn campaign(&self, lease: i64) -> anyhow::Result<bool> {
        let key = self.etcd.key("leader");
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                self.addr.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let r = self.etcd.run(move |mut c| Box::pin(async move { c.txn(txn).await }))?;
        if r.succeeded() {
            LED.store(true, Ordering::Relaxed);
            let term = r.header().map_or(0, |h| h.revision());
            self.etcd.term.store(term, Ordering::Relaxed);
            *self.seen.lock().unwrap() = Seen {
                leader: Some(self.addr.clone()),
                term: term as u64,
            };
            return Ok(true);
        }
        let held = r.op_responses().into_iter().find_map(|o| match o {
            etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| {
                (
                    String::from_utf8_lossy(kv.value()).into_owned(),
                    kv.create_revision(),
                    kv.lease(),
                )
            }),
            _ => None,
        });
        // This manager's own key: it won, but the answer was lost (it timed out).
        if let Some((_, term, _)) = held.as_ref().filter(|h| h.0 == self.addr && h.2 == lease) {
            LED.store(true, Ordering::Relaxed);
            self.etcd.term.store(*term, Ordering::Relaxed);
            *self.seen.lock().unwrap() = Seen {
                leader: Some(self.addr.clone()),
                term: *term as u64,
            };
            return Ok(true);
        }
        // This manager's address under another lease: an earlier run of this manager led, and
        // is gone (this process holds its address now). Its key goes at once, not when its
        // lease runs out, and only that term's key.
        if let Some((_, term, _)) = held.as_ref().filter(|h| h.0 == self.addr && h.2 != lease) {
            let (key, term) = (self.etcd.key("leader"), *term);
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, term)])
                .and_then([TxnOp::delete(key, None)]);
            self.etcd.run(move |mut c| Box::pin(async move { c.txn(txn).await }))?;
            tracing::info!(term, "the lead of an earlier run of this manager is given up");
            return Ok(false);
        }
        let mut seen = self.seen.lock().unwrap();
        let now = Seen {
            leader: held.as_ref().map(|h| h.0.clone()),
            term: held.map_or(0, |h| h.1 as u64),
        };
        if now.leader != seen.leader {
            tracing::info!(leader = ?now.leader, term = now.term, "following");
        }
        *seen = now;
        Ok(false)
    }

    /// Whether the leader key is still this manager's, in its term.
    fn check(&self) -> anyhow::Result<bool> {
        let key = self.etcd.key("leader");
        let r = self
            .etcd
            .run(move |mut c| Box::pin(async move { c.get(key, None).await }))?;
        let term = self.etcd.term.load(Ordering::Relaxed);
        Ok(r.kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == term && kv.value() == self.addr.as_bytes()))
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
