//! Several global managers with their state in etcd (`[cluster] etcd`): one leads, elected
//! through etcd (election.rs says what it keeps there, and how), and the others follow,
//! answer reads and take over when it goes. This is the managers' client of etcd: it keeps
//! their state ([`Backend`], each write fenced by the writer's term) and their election
//! ([`Keeper`]).
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, PutOptions, TlsOptions, Txn, TxnOp,
};

use splitos_core::state::Backend;

use crate::election::{Claim, Held, Keeper};

/// How long one request to etcd may take.
const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// The cluster's state and election in etcd, as one manager sees them.
pub struct Etcd {
    rt: tokio::runtime::Handle,
    client: Client,
    prefix: String,
    /// The term this manager leads in (the create revision of its leader key); 0 while it
    /// follows.
    term: AtomicI64,
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
    pub fn connect(endpoints: &[String], prefix: &str, tls: Option<Tls>) -> anyhow::Result<Arc<Etcd>> {
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

fn held(kv: &etcd_client::KeyValue) -> Held {
    Held {
        value: kv.value().to_vec(),
        revision: kv.create_revision(),
        lease: kv.lease(),
    }
}

impl Keeper for Etcd {
    fn grant(&self, ttl: Duration) -> anyhow::Result<i64> {
        let ttl = ttl.as_secs() as i64;
        Ok(self
            .run(move |mut c| Box::pin(async move { c.lease_grant(ttl, None).await }))?
            .id())
    }

    fn keep_alive(&self, lease: i64) -> anyhow::Result<bool> {
        // Opening the keep-alive stream sends one and reads its answer: the client refuses a
        // lease that expired there, by this message.
        self.run(move |mut c| {
            Box::pin(async move {
                match c.lease_keep_alive(lease).await {
                    Ok(_) => Ok(true),
                    Err(etcd_client::Error::LeaseKeepAliveError(m)) if m == "lease not found" => Ok(false),
                    Err(e) => Err(e),
                }
            })
        })
    }

    fn revoke(&self, lease: i64) -> anyhow::Result<()> {
        self.run(move |mut c| Box::pin(async move { c.lease_revoke(lease).await }))?;
        Ok(())
    }

    fn put(&self, key: &str, value: Vec<u8>, lease: Option<i64>) -> anyhow::Result<()> {
        let key = self.key(key);
        let options = lease.map(|l| PutOptions::new().with_lease(l));
        self.run(move |mut c| Box::pin(async move { c.put(key, value, options).await }))?;
        Ok(())
    }

    fn list(&self, prefix: &str) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
        let p = self.key(prefix);
        let p2 = p.clone();
        let r =
            self.run(move |mut c| Box::pin(async move { c.get(p2, Some(GetOptions::new().with_prefix())).await }))?;
        Ok(r.kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key()[p.len()..]).into_owned(),
                    kv.value().to_vec(),
                )
            })
            .collect())
    }

    fn get(&self, key: &str) -> anyhow::Result<Option<Held>> {
        let k = self.key(key);
        let r = self.run(move |mut c| Box::pin(async move { c.get(k, None).await }))?;
        Ok(r.kvs().first().map(held))
    }

    fn claim(&self, key: &str, value: Vec<u8>, lease: i64) -> anyhow::Result<Claim> {
        let key = self.key(key);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key, None)]);
        let r = self.run(move |mut c| Box::pin(async move { c.txn(txn).await }))?;
        if r.succeeded() {
            return Ok(Claim::Won(r.header().map_or(0, |h| h.revision())));
        }
        Ok(Claim::Held(r.op_responses().into_iter().find_map(|o| match o {
            etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(held),
            _ => None,
        })))
    }

    fn delete_if(&self, key: &str, revision: i64) -> anyhow::Result<()> {
        let key = self.key(key);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(key, None)]);
        self.run(move |mut c| Box::pin(async move { c.txn(txn).await }))?;
        Ok(())
    }

    fn put_if(&self, guard: &str, revision: i64, key: &str, value: Vec<u8>, lease: i64) -> anyhow::Result<bool> {
        let txn = Txn::new()
            .when([Compare::create_revision(self.key(guard), CompareOp::Equal, revision)])
            .and_then([TxnOp::put(
                self.key(key),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        Ok(self
            .run(move |mut c| Box::pin(async move { c.txn(txn).await }))?
            .succeeded())
    }

    fn lead_in(&self, term: i64) {
        self.term.store(term, Ordering::Relaxed);
    }
}
