//! Leading and following, where several managers keep their state in etcd (the election is
//! etcd.rs's).
use super::*;

/// Why a manager that does not lead refuses, or cannot answer what followers answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ManagerError {
    #[error("this global manager follows; the leader is at {leader}")]
    Follower { leader: String },
    #[error("this global manager follows, and no leader is elected yet")]
    NoLeader,
    #[error("the leader's published status: {0}")]
    Published(postcard::Error),
    #[error("the managers' state: {0}")]
    State(anyhow::Error),
    #[error("not a valid API token")]
    NotAToken,
}

impl Refuse for ManagerError {
    fn code(&self) -> ErrCode {
        match self {
            ManagerError::Follower { .. } | ManagerError::NoLeader => ErrCode::NotLeader,
            ManagerError::Published(_) => ErrCode::Internal,
            ManagerError::State(_) => ErrCode::Unreachable,
            ManagerError::NotAToken => ErrCode::NotFound,
        }
    }
}

/// What a manager needs of the election to lead or follow (etcd.rs's `Election` in a running
/// cluster): a seam, so that the answers of a follower, and of a leader whose lease lapses, are
/// tested in process.
pub(crate) trait Lead: Send + Sync {
    /// Whether this manager leads now, its lease not lapsed.
    fn leading(&self) -> bool;
    /// Who leads, as this manager last saw it.
    fn seen(&self) -> etcd::Seen;
    /// Every manager's address.
    fn managers(&self) -> Vec<String>;
    /// The leader's last published status, if a manager of this cluster signed it.
    fn published_status(&self) -> Option<Vec<u8>>;
    /// Gives this manager's lease up, so that another may lead at once.
    fn resign(&self);
}

impl Lead for etcd::Election {
    fn leading(&self) -> bool {
        etcd::Election::leading(self)
    }

    fn seen(&self) -> etcd::Seen {
        etcd::Election::seen(self)
    }

    fn managers(&self) -> Vec<String> {
        etcd::Election::managers(self)
    }

    fn published_status(&self) -> Option<Vec<u8>> {
        etcd::Election::published_status(self)
    }

    fn resign(&self) {
        etcd::Election::resign(self)
    }
}

/// What answers the managers' address when they keep their state in etcd: the managers
/// themselves while this one leads; before that, and after it stopped, a follower that answers
/// who leads and reads (the leader's last status, the API tokens), and refuses the rest
/// `NotLeader`.
pub(crate) struct Manager {
    pub(crate) election: Arc<dyn Lead>,
    pub(crate) gm: std::sync::OnceLock<Arc<Gm>>,
    pub(crate) store: state::Store,
}

impl Handler for Manager {
    fn handle(&self, msg: Msg) -> Msg {
        match msg {
            Msg::X2G_WHO_LEADS(r) => return on(r, |_| Ok(self.who_leads())),
            // A leader that stops gives its lease up: another leads at once.
            Msg::C2X_SHUTDOWN(r) => {
                return on(r, |_| {
                    self.election.resign();
                    splitos_core::node::exit_soon();
                    Ok(OK)
                })
            }
            _ => {}
        }
        match self.gm.get().filter(|_| self.election.leading()) {
            // An answer made while the lease lapsed is not sent: another may lead by now.
            Some(gm) => match gm.handle(msg) {
                _ if !self.election.leading() => Msg::ERR(self.not_leader()),
                answer => answer,
            },
            None => self.follow(msg),
        }
    }
}

impl Manager {
    fn who_leads(&self) -> G2X_LEADER {
        let seen = self.election.seen();
        G2X_LEADER {
            leader: seen.leader,
            term: seen.term,
        }
    }

    fn follow(&self, msg: Msg) -> Msg {
        crate::series::FOLLOWER_REQUESTS.increment(1);
        match msg {
            Msg::C2X_PING(r) => on(r, |_| Ok(X2C_PONG { role: Role::Gm, id: 0 })),
            Msg::C2X_METRICS(r) => on(r, |_| {
                Ok(X2C_METRICS {
                    text: splitos_core::telemetry::render(),
                })
            }),
            Msg::C2X_STATS(r) => on(r, |_| {
                Ok(X2C_STATS { json: serde_json::json!({"role": "global-managers", "leading": false, "leader": self.election.seen().leader}).to_string() })
            }),
            Msg::C2G_STATUS(r) => on(r, |_| {
                let published = self.election.published_status().ok_or_else(|| self.not_leader())?;
                let mut s: G2C_STATUS = postcard::from_bytes(&published).map_err(ManagerError::Published)?;
                s.leader = self.election.seen().leader;
                s.managers = self.election.managers();
                Ok(s)
            }),
            Msg::X2G_API_TOKEN(r) => on(r, |r| {
                let tokens = tokens::Tokens::open(self.store.clone()).map_err(ManagerError::State)?;
                principal(tokens.check(&r.token))
            }),
            _ => Msg::ERR(self.not_leader()),
        }
    }

    fn not_leader(&self) -> ERR {
        match self.election.seen().leader {
            Some(leader) => ManagerError::Follower { leader },
            None => ManagerError::NoLeader,
        }
        .into()
    }
}

/// What the managers answer `X2G_API_TOKEN` with.
pub(crate) fn principal(p: Option<tokens::Principal>) -> Result<G2X_API_PRINCIPAL, Refusal> {
    match p {
        Some(tokens::Principal::Admin { token }) => Ok(G2X_API_PRINCIPAL {
            name: token,
            admin: true,
            vnodes: Vec::new(),
        }),
        Some(tokens::Principal::Tenant { token, vnodes }) => Ok(G2X_API_PRINCIPAL {
            name: token,
            admin: false,
            vnodes,
        }),
        None => Err(ManagerError::NotAToken.into()),
    }
}
