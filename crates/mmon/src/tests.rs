//! mComponents driven in-process: several [`Mem`]s whose calls to each other, to the global
//! managers and to an sComponent go through an in-memory cluster ([`Net`]) instead of RPC.
//! A test plays the pComponent (it sends the `P2M_*` requests a page store would), the
//! global managers' heartbeat answers, and the rebuilder and log streamer threads (it runs
//! their work when it chooses); and it breaks the cluster: a component down, two cut off from
//! each other, a call that fails, or something done just before a call is delivered.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use super::*;
use splitos_core::config::Size;

mod failover;
mod logged;
mod replica;
mod sim;
mod striped;

/// Bytes of a vRegion: small, so that a rebuild copies little; a multiple of a striped row.
const VRS: u64 = 1 << 20;
/// Where the test processes' heap region starts, and its size.
const BASE: u64 = 64 * VRS;
const REGION: u64 = 16 * VRS;
/// The mComponent every test process is created on.
const HOME: u32 = 1;
/// Ids and addresses of the components that are not mComponents.
const GM: u32 = 0;
const PCOMP: u32 = 90;
const SCOMP: u32 = 100;

fn addr(id: u32) -> String {
    match id {
        GM => "gm".into(),
        PCOMP => format!("p{id}"),
        SCOMP => format!("s{id}"),
        id => format!("m{id}"),
    }
}

fn id_of(addr: &str) -> u32 {
    if addr == "gm" {
        return GM;
    }
    addr[1..].parse().expect("an address of the test cluster")
}

/// How long a call may wait for its answer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum How {
    Rpc,
    Within(Duration),
    Direct,
}

/// A call made through the cluster.
#[derive(Clone)]
struct Call {
    from: u32,
    to: u32,
    msg: Msg,
    how: How,
}

/// A call that fails instead of being delivered.
struct Fault {
    to: Option<u32>,
    msg: &'static str,
    times: usize,
    error: RpcError,
}

/// Something done just before a call is delivered (once).
struct Hook {
    to: u32,
    msg: &'static str,
    run: Box<dyn FnOnce() + Send>,
}

/// An sComponent's backup files, by file: the epoch of their last reset and their records.
#[derive(Default)]
struct BackupFiles(Mutex<HashMap<LogFile, (u64, Vec<LogRecord>)>>);

impl BackupFiles {
    fn handle(&self, msg: Msg) -> Msg {
        let mut files = self.0.lock().unwrap();
        let stale = |at: u64| ERR::new(ErrCode::Stale, format!("the file was reset at epoch {at}"));
        match msg {
            Msg::M2S_LOG_APPEND(r) => on(r, |r| {
                let f = files.entry(r.file).or_default();
                if r.epoch < f.0 {
                    return Err(stale(f.0));
                }
                if r.reset {
                    *f = (r.epoch, Vec::new());
                }
                f.1.extend(r.records);
                Ok(OK)
            }),
            Msg::M2S_LOG_READ(r) => on(r, |r| {
                let f = files.get(&r.file).ok_or_else(|| Refusal::errno(libc::ENOENT))?;
                let from = (r.offset as usize).min(f.1.len());
                let next = (from + r.max.min(64) as usize).min(f.1.len());
                Ok(S2M_LOG {
                    records: f.1[from..next].to_vec(),
                    next: next as u64,
                    more: next < f.1.len(),
                })
            }),
            Msg::M2S_LOG_COPY(r) => on(r, |r| {
                let from = files.get(&r.from).map(|f| f.1.clone()).unwrap_or_default();
                let to = files.entry(r.to).or_default();
                if r.epoch < to.0 {
                    return Err(stale(to.0));
                }
                *to = (r.epoch, from);
                Ok(OK)
            }),
            Msg::M2S_LOG_DROP(r) => on(r, |r| {
                files.retain(|f, _| f.vnode != r.vnode || f.pid != r.pid);
                Ok(OK)
            }),
            other => Msg::ERR(ERR::new(
                ErrCode::Invalid,
                format!("the test sComponent does not handle {}", other.name()),
            )),
        }
    }

    fn pages(&self, file: &LogFile) -> BTreeMap<u64, ByteBuf> {
        let mut pages = BTreeMap::new();
        replay_log(
            self.0
                .lock()
                .unwrap()
                .get(file)
                .map(|f| f.1.clone())
                .unwrap_or_default(),
            &mut pages,
        );
        pages
    }
}

/// The cluster between the mComponents of a test.
#[derive(Default)]
struct Net {
    mems: Mutex<BTreeMap<u32, Weak<Mem<Peer>>>>,
    /// Components that answer nothing.
    down: Mutex<HashSet<u32>>,
    /// Pairs that cannot reach each other (either way).
    cut: Mutex<HashSet<(u32, u32)>>,
    faults: Mutex<Vec<Fault>>,
    /// Calls delivered and handled whose answers are lost: (message, times left).
    lost_replies: Mutex<Vec<(&'static str, usize)>>,
    hooks: Mutex<Vec<Hook>>,
    calls: Mutex<Vec<Call>>,
    /// The global managers: mComponents they declared lost (never chosen again), those
    /// without room for pages, and how often they chose each.
    lost: Mutex<HashSet<u32>>,
    full: Mutex<HashSet<u32>>,
    picks: Mutex<HashMap<u32, u32>>,
    scomp: BackupFiles,
    /// Members stopped past the managers' patience that went on and have not heard that
    /// they were declared lost.
    stopped: Mutex<HashSet<u32>>,
    /// What mComponents told the pComponent (`M2P_HOME_MOVED`), in order.
    pcomp_inbox: Mutex<Vec<Msg>>,
}

impl Net {
    fn deliver(&self, from: u32, to_addr: &str, msg: Msg, how: How) -> Result<Msg, RpcError> {
        let to = id_of(to_addr);
        let name = msg.name();
        self.calls.lock().unwrap().push(Call {
            from,
            to,
            msg: msg.clone(),
            how,
        });
        let hook = {
            let mut hooks = self.hooks.lock().unwrap();
            hooks
                .iter()
                .position(|h| h.to == to && h.msg == name)
                .map(|i| hooks.remove(i))
        };
        if let Some(h) = hook {
            (h.run)();
        }
        let cut = |a: u32, b: u32| self.cut.lock().unwrap().contains(&(a.min(b), a.max(b)));
        if self.down.lock().unwrap().contains(&to) || cut(from, to) {
            return Err(RpcError::Unreachable {
                addr: to_addr.into(),
                why: "cut off in the test".into(),
            });
        }
        {
            let mut faults = self.faults.lock().unwrap();
            if let Some(i) = faults
                .iter()
                .position(|f| f.msg == name && f.to.is_none_or(|t| t == to))
            {
                let error = faults[i].error.clone();
                faults[i].times -= 1;
                if faults[i].times == 0 {
                    faults.remove(i);
                }
                return Err(error);
            }
        }
        let reply = match to {
            GM => self.managers(msg),
            SCOMP => self.scomp.handle(msg),
            PCOMP => {
                self.pcomp_inbox.lock().unwrap().push(msg);
                Msg::OK(OK)
            }
            id => {
                let m = self
                    .mems
                    .lock()
                    .unwrap()
                    .get(&id)
                    .and_then(Weak::upgrade)
                    .expect("a member of the test cluster");
                m.handle(msg)
            }
        };
        if let Some(left) = self
            .lost_replies
            .lock()
            .unwrap()
            .iter_mut()
            .find(|(m, left)| *m == name && *left > 0)
            .map(|(_, left)| left)
        {
            *left -= 1;
            return Err(RpcError::Timeout {
                addr: to_addr.into(),
                msg: name,
                after: Duration::ZERO,
            });
        }
        match reply {
            Msg::ERR(e) => Err(RpcError::Remote {
                code: e.code,
                msg: e.msg,
            }),
            m => Ok(m),
        }
    }

    /// GMM as far as mComponents ask it: the least chosen mComponent with room, not excluded
    /// nor declared lost; the sComponent of every vNode.
    fn managers(&self, msg: Msg) -> Msg {
        match msg {
            Msg::M2G_PICK_OWNER(r) => on(r, |r| {
                let (lost, full) = (self.lost.lock().unwrap(), self.full.lock().unwrap());
                let mut picks = self.picks.lock().unwrap();
                let ids = self.mems.lock().unwrap().keys().copied().collect::<Vec<u32>>();
                let fits =
                    |id: &u32| !r.exclude.contains(id) && !lost.contains(id) && (r.bytes == 0 || !full.contains(id));
                let id = ids
                    .into_iter()
                    .filter(fits)
                    .min_by_key(|id| (picks.get(id).copied().unwrap_or(0), *id));
                let id = id.ok_or_else(|| ERR::new(ErrCode::NoMemory, "no mComponent has room"))?;
                *picks.entry(id).or_default() += 1;
                Ok(G2M_OWNER {
                    mcomp: ComponentRef { id, addr: addr(id) },
                })
            }),
            Msg::M2G_FIND(r) => on(r, |r| {
                Ok(G2M_FOUND {
                    comp: ComponentRef {
                        id: r.id,
                        addr: addr(PCOMP),
                    },
                })
            }),
            Msg::M2G_BACKUP_STORE(r) => on(r, |_| {
                Ok(G2M_BACKUP_STORE {
                    scomp: ComponentRef {
                        id: SCOMP,
                        addr: addr(SCOMP),
                    },
                })
            }),
            other => Msg::ERR(ERR::new(
                ErrCode::Invalid,
                format!("the test's managers do not handle {}", other.name()),
            )),
        }
    }

    fn calls(&self, msg: &str) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.msg.name() == msg)
            .cloned()
            .collect()
    }

    /// Calls to `to` fail with `error`, `times` times (`None`: to any component).
    fn fail(&self, msg: &'static str, to: Option<u32>, times: usize, error: RpcError) {
        self.faults.lock().unwrap().push(Fault { to, msg, times, error });
    }

    /// The next `times` answers to `msg` are lost after it was handled (a timeout).
    fn lose_replies(&self, msg: &'static str, times: usize) {
        self.lost_replies.lock().unwrap().push((msg, times));
    }

    fn before(&self, msg: &'static str, to: u32, run: impl FnOnce() + Send + 'static) {
        self.hooks.lock().unwrap().push(Hook {
            to,
            msg,
            run: Box::new(run),
        });
    }

    fn cut(&self, a: u32, b: u32) {
        self.cut.lock().unwrap().insert((a.min(b), a.max(b)));
    }
}

/// How one mComponent of a test reaches the others.
#[derive(Clone)]
struct Peer {
    id: u32,
    addr: String,
    net: Arc<Net>,
}

impl Net {
    /// A typed call, as the RPC client makes it.
    fn send<R: Request>(&self, from: u32, addr: &str, req: R, how: How) -> Result<R::Reply, RpcError> {
        let msg: Msg = req.into();
        let request = msg.name();
        R::Reply::try_from(self.deliver(from, addr, msg, how)?).map_err(|m| RpcError::Protocol {
            addr: addr.into(),
            request,
            reply: m.name(),
        })
    }
}

impl Peers for Peer {
    fn id(&self) -> u32 {
        self.id
    }

    fn addr(&self) -> &str {
        &self.addr
    }

    fn call<R: Request>(&self, addr: &str, req: R) -> Result<R::Reply, RpcError> {
        self.net.send(self.id, addr, req, How::Rpc)
    }

    fn call_timeout<R: Request>(&self, addr: &str, req: R, timeout: Duration) -> Result<R::Reply, RpcError> {
        self.net.send(self.id, addr, req, How::Within(timeout))
    }

    fn call_direct<R: Request>(&self, addr: &str, req: R) -> Result<R::Reply, RpcError> {
        self.net.send(self.id, addr, req, How::Direct)
    }

    fn call_msg(&self, addr: &str, msg: &Msg) -> Result<Msg, RpcError> {
        self.net.deliver(self.id, addr, msg.clone(), How::Rpc)
    }

    fn call_gm<R: Request>(&self, req: R) -> Result<R::Reply, RpcError> {
        self.net.send(self.id, "gm", req, How::Rpc)
    }

    /// A member these tests cut off or fail is lost, never late.
    fn late(&self, _: u32) -> bool {
        false
    }

    /// A member a test stopped and let go on hears the managers' word (it is fenced) before
    /// it serves what was queued for it.
    fn after_stop(&self) {
        if self.net.stopped.lock().unwrap().remove(&self.id) {
            let m = self.net.mems.lock().unwrap().get(&self.id).and_then(Weak::upgrade);
            if let Some(m) = m {
                m.fence();
            }
        }
    }
}

/// A test's cluster: mComponents 1..=n, the global managers and one sComponent.
struct Rig {
    net: Arc<Net>,
    mems: BTreeMap<u32, Arc<Mem<Peer>>>,
    jobs: BTreeMap<u32, Receiver<Job>>,
}

/// What every test writes in page `vpn`: a byte of its own.
fn content(vpn: u64, round: u8) -> Vec<u8> {
    vec![((vpn % 251) as u8 + 1) ^ round; PAGE_SIZE]
}

impl Rig {
    fn new(n: u32, scheme: Replication) -> Rig {
        Rig::with(n, scheme, |_| 64 << 20, 64 << 20)
    }

    /// `capacity(id)`: mComponent `id`'s memory; `backup_log`: each logger's log, in bytes.
    fn with(n: u32, scheme: Replication, capacity: impl Fn(u32) -> u64, backup_log: u64) -> Rig {
        let net = Arc::new(Net::default());
        let (mut mems, mut jobs) = (BTreeMap::new(), BTreeMap::new());
        for id in 1..=n {
            let cfg = McompConfig {
                capacity: Size(capacity(id)),
                bcache: Size(1 << 20),
                readahead: Size(0),
                backup_log: Size(backup_log),
                workers: 0,
                ..McompConfig::default()
            };
            let (tx, rx) = std::sync::mpsc::channel();
            let m = Arc::new(Mem::new(
                Peer {
                    id,
                    addr: addr(id),
                    net: net.clone(),
                },
                &cfg,
                tx,
            ));
            m.vregion_size.store(VRS, Relaxed);
            *m.replication.lock().unwrap() = scheme;
            net.mems.lock().unwrap().insert(id, Arc::downgrade(&m));
            mems.insert(id, m);
            jobs.insert(id, rx);
        }
        // The home holds the processes' layout and no pages: a test loses members without
        // losing the home, and the home when it means to.
        net.full.lock().unwrap().insert(HOME);
        Rig { net, mems, jobs }
    }

    fn mem(&self, id: u32) -> &Mem<Peer> {
        &self.mems[&id]
    }

    /// A request from the pComponent.
    fn call<R: Request>(&self, to: u32, req: R) -> Result<R::Reply, Refusal> {
        Ok(self.net.send(PCOMP, &addr(to), req, How::Rpc)?)
    }

    /// A writable mapping of `len` bytes anywhere, as a program's mmap asks `home`.
    fn mmap(&self, home: u32, who: &Who, len: u64) -> Result<M2P_MAPPED, Refusal> {
        self.call(
            home,
            P2M_MMAP {
                who: who.clone(),
                hint: 0,
                len,
                prot: 3,
                fixed: false,
                noreserve: false,
            },
        )
    }

    /// Process `pid`, created on [`HOME`] with nothing mapped.
    fn create(&self, pid: u64) -> Who {
        let who = Who::new("v", pid);
        self.call(
            HOME,
            P2M_PROC_CREATE {
                who: who.clone(),
                region_base: BASE,
                region_size: REGION,
                pcomp: 7,
                memory_quota: None,
                attempt: 0,
            },
        )
        .expect("create a process");
        who
    }

    /// A process with `vregions` vRegions mapped writable, each with `pages` pages written.
    fn process(&self, pid: u64, vregions: u64, pages: u64) -> Who {
        let who = self.create(pid);
        let m = self.mmap(HOME, &who, vregions * VRS).expect("mmap");
        assert_eq!(m.addr, BASE, "the first mapping starts the heap region");
        for v in 0..vregions {
            for p in 0..pages {
                // Spread over the stripe units of a striped set.
                self.write(HOME, &who, vpn(v, p * 5), 0).expect("write back");
            }
        }
        who
    }

    /// The process's sets as its home answers them.
    fn sets(&self, home: u32, who: &Who) -> M2P_VREGIONS {
        self.call(home, P2M_VREGIONS { who: who.clone() })
            .expect("the home answers")
    }

    fn set(&self, home: u32, who: &Who, idx: u64) -> VregionReplicas {
        self.sets(home, who)
            .owners
            .into_iter()
            .find(|s| s.index == idx)
            .expect("an active vRegion")
    }

    /// Writes back page `vpn` as a pComponent does, to every member the set names for it, at
    /// the epoch its home says.
    fn write(&self, home: u32, who: &Who, vpn: u64, round: u8) -> Result<(), Refusal> {
        let v = self.sets(home, who);
        let set = v
            .owners
            .iter()
            .find(|s| s.index == vpn * PAGE / VRS)
            .expect("an active vRegion");
        let who = Who {
            epoch: v.epoch,
            ..who.clone()
        };
        for o in set.writers(vpn) {
            self.call(
                o.id,
                P2M_FLUSH {
                    who: who.clone(),
                    vpn,
                    data: seal_page(&content(vpn, round)),
                },
            )?;
        }
        Ok(())
    }

    /// Page `vpn` as member `from` serves it.
    fn read_from(&self, from: u32, who: &Who, vpn: u64) -> Result<Vec<u8>, Refusal> {
        let sealed = self.call(from, P2M_FETCH { who: who.clone(), vpn })?.data;
        unseal_page(sealed).map_err(|e| {
            ERR::new(
                ErrCode::Internal,
                format!("page {vpn:#x} from mComponent {from}: {e:?}"),
            )
        })
    }

    /// Page `vpn` from the member that serves it.
    fn read(&self, home: u32, who: &Who, vpn: u64) -> Result<Vec<u8>, Refusal> {
        let set = self.set(home, who, vpn * PAGE / VRS);
        self.read_from(set.holder(vpn).id, who, vpn)
    }

    /// The rebuilder threads' work, until none is left (not that of components down).
    fn run_jobs(&self) {
        loop {
            let mut ran = false;
            for (id, rx) in &self.jobs {
                if self.net.down.lock().unwrap().contains(id) {
                    continue;
                }
                while let Ok(job) = rx.try_recv() {
                    self.mems[id].work(job);
                    ran = true;
                }
            }
            if !ran {
                return;
            }
        }
    }

    /// The log streamers' work: each log sent to the sComponent (or given up after a while).
    fn stream_logs(&self) {
        for (id, m) in &self.mems {
            if self.net.down.lock().unwrap().contains(id) {
                continue;
            }
            let mut backoff = Duration::ZERO;
            for _ in 0..1000 {
                if !m.stream_one(&mut backoff) {
                    break;
                }
            }
        }
    }

    /// `ids` go down, and the global managers' next heartbeat answers say they are lost.
    fn declare_lost(&self, ids: &[u32]) {
        self.net.down.lock().unwrap().extend(ids);
        self.net.lost.lock().unwrap().extend(ids);
        for (id, m) in &self.mems {
            if !ids.contains(id) {
                m.on_beat(lost_beat(ids.to_vec()));
            }
        }
    }

    fn down(&self, id: u32) {
        self.net.down.lock().unwrap().insert(id);
    }

    /// mComponent `id`'s stats, as `cluster status --json` shows them.
    fn stats(&self, id: u32) -> serde_json::Value {
        serde_json::from_str(&self.mem(id).stats_json()).expect("stats are JSON")
    }
}

/// The global managers' heartbeat answer to an mComponent, naming `lost_mcomps` lost.
fn lost_beat(lost_mcomps: Vec<u32>) -> G2X_BEAT {
    G2X_BEAT {
        lost_mcomps,
        ..G2X_BEAT::nothing()
    }
}

/// Page `page` of vRegion `v` of the heap region.
fn vpn(v: u64, page: u64) -> u64 {
    (BASE + v * VRS) / PAGE + page
}

/// The vRegion index of the heap region's vRegion `v`.
fn idx(v: u64) -> u64 {
    (BASE + v * VRS) / VRS
}

/// Every page a test process wrote, read from the members that serve them.
fn check_pages(rig: &Rig, home: u32, who: &Who, vregions: u64, pages: u64) {
    for v in 0..vregions {
        for p in 0..pages {
            let vpn = vpn(v, p * 5);
            assert_eq!(
                rig.read(home, who, vpn)
                    .unwrap_or_else(|e| panic!("page {vpn:#x}: {e}")),
                content(vpn, 0),
                "page {vpn:#x}"
            );
        }
    }
}

fn ids(set: &VregionReplicas) -> Vec<u32> {
    set.owners.iter().map(|o| o.id).collect()
}
