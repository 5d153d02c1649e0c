//! A process's memory as the page store knows it: its home and backup home, and the sets of its
//! vRegions as last heard.
use super::*;

pub(super) struct Homes {
    pub(super) home: ComponentRef,
    pub(super) backup: Option<ComponentRef>,
}

/// The replica sets of a process's vRegions as this pComponent last heard them.
#[derive(Default)]
pub(super) struct View {
    pub(super) epoch: u64,
    pub(super) vregions: HashMap<u64, VregionReplicas>,
}

/// A process's memory as the page store needs it: who the process is, its home (and backup
/// home), and the replica sets of its vRegions learnt so far. One of a process's three
/// facets: `Proc` (pmon/mod.rs) is its hosting, `ProcHeap` (excache/miss/) its heap as the miss
/// path serves it.
pub struct ProcMemory {
    pub who: Who,
    pub(super) homes: Mutex<Homes>,
    pub(super) view: Mutex<View>,
    /// Members reported lost that the home kept in the sets: how many times in a row, and
    /// when last.
    pub(super) kept: Mutex<HashMap<u32, (u32, std::time::Instant)>>,
    /// Owners' segments this process's pages are reached in by a copy.
    pub(super) leases: Leases,
    /// Held while this pComponent asks the backup home to take over: threads that find the
    /// home lost at once (a fault worker and the evictor) ask once; the others then find the
    /// new home, where a second request would be refused (the backup keeps no copy of a home
    /// it has become).
    taking_over: Mutex<()>,
}

/// Reports of one member that its home keeps before an operation gives up on it: the home
/// reaches it (the pComponent's trouble may pass) or cannot do without it (a striped set that
/// lost two places).
pub(super) const KEPT_REPORTS: u32 = 3;

/// Reports further apart than this do not count as in a row.
pub(super) const KEPT_WINDOW: std::time::Duration = std::time::Duration::from_secs(5);

impl ProcMemory {
    pub fn new(who: Who, home: ComponentRef, backup: Option<ComponentRef>) -> ProcMemory {
        ProcMemory {
            who,
            homes: Mutex::new(Homes { home, backup }),
            view: Mutex::new(View::default()),
            kept: Mutex::new(HashMap::new()),
            leases: Leases::default(),
            taking_over: Mutex::new(()),
        }
    }

    pub fn home(&self) -> ComponentRef {
        self.homes.lock().unwrap().home.clone()
    }

    pub fn backup(&self) -> Option<ComponentRef> {
        self.homes.lock().unwrap().backup.clone()
    }

    /// The process as it names itself in write-backs: with the epoch of its replica sets.
    pub(super) fn who_now(&self) -> Who {
        Who {
            epoch: self.view.lock().unwrap().epoch,
            ..self.who.clone()
        }
    }

    /// Replica sets the home announced (in `M2P_MAPPED`, `M2P_FORKED`, `M2P_VREGIONS`): all
    /// of the process's, so they replace older ones whole.
    pub fn learn(&self, owners: &[VregionReplicas], epoch: u64, backup: Option<ComponentRef>) {
        let mut v = self.view.lock().unwrap();
        if epoch < v.epoch {
            return;
        }
        v.epoch = epoch;
        v.vregions = owners.iter().map(|o| (o.index, o.clone())).collect();
        drop(v);
        if backup.is_some() {
            self.homes.lock().unwrap().backup = backup;
        }
    }

    /// A call to the process's home; a home that cannot be reached, or is no longer the
    /// process's home (it was fenced), is replaced by the backup home, which takes over once
    /// it finds the same.
    pub fn call_home<R: Request + Clone>(&self, node: &Node, req: R) -> Result<R::Reply, RpcError> {
        let mut home = self.home();
        let mut r = node.rpc.call(&home.addr, req.clone());
        // A home that left names the new one (`M2P_HOME_MOVED`), before or as it refuses.
        for attempt in 0..TRIES {
            let Err(RpcError::Remote {
                code: ErrCode::NotHome, ..
            }) = &r
            else {
                break;
            };
            if self.home().id == home.id {
                // Not told yet: a fenced home says the same, and then its backup takes over.
                if attempt >= 2 && self.backup().is_some() {
                    break;
                }
                std::thread::sleep(splitos_core::node::HEARTBEAT);
            }
            home = self.home();
            r = node.rpc.call(&home.addr, req.clone());
        }
        // A home that is only late is waited for while the global managers have not declared it
        // lost, even where a backup could take over: one that answers nothing in time but
        // holds its connection may hold the process through a long repair (a logger made
        // primary replays its backup under the process's lock), and its backup would refuse
        // to take over from a home it still reaches, failing the program.
        while let Err(e) = &r {
            let late = matches!(e, RpcError::Timeout { .. });
            if (self.backup().is_some() && !late) || !waited_for(node, &home, e) {
                break;
            }
            r = node.rpc.call(&home.addr, req.clone());
        }
        match r {
            Err(e)
                if transport_failure(&e)
                    || matches!(
                        e,
                        RpcError::Remote {
                            code: ErrCode::NotHome,
                            ..
                        }
                    ) =>
            {
                let _one = self.taking_over.lock().unwrap();
                let now = self.home();
                if now.id != home.id {
                    // Another thread's request made the backup the home meanwhile.
                    return node.rpc.call(&now.addr, req);
                }
                let Some(backup) = self.backup() else { return Err(e) };
                let taken = node.rpc.call(
                    &backup.addr,
                    P2M_HOME_TAKEOVER {
                        who: self.who_now(),
                        lost: home.id,
                    },
                );
                let r = match taken {
                    Ok(r) => r,
                    Err(te) => {
                        tracing::warn!(pid = self.who.pid, home = home.id, backup = backup.id, error = %te, "the backup home did not take over");
                        return Err(e);
                    }
                };
                tracing::warn!(pid = self.who.pid, lost = home.id, home = backup.id, error = %e, "home mComponent lost: its backup took over");
                crate::series::HOME_TAKEOVERS.increment(1);
                *self.homes.lock().unwrap() = Homes {
                    home: backup.clone(),
                    backup: r.backup,
                };
                node.rpc.call(&backup.addr, req)
            }
            r => r,
        }
    }
}
