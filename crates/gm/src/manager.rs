//! Leading and following, where several managers keep their state in etcd (the election is
//! election.rs's).
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

/// What a manager needs of the election to lead or follow (election.rs's `Election` in a
/// running cluster): a seam, so that the answers of a follower, and of a leader whose lease lapses, are
/// tested in process.
pub(crate) trait Lead: Send + Sync {
    /// Whether this manager leads now, its lease not lapsed.
    fn leading(&self) -> bool;
    /// Who leads, as this manager last saw it.
    fn seen(&self) -> election::Seen;
    /// Every manager's address.
    fn managers(&self) -> Vec<String>;
    /// The leader's last published status, if a manager of this cluster signed it.
    fn published_status(&self) -> Option<Vec<u8>>;
    /// Gives this manager's lease up, so that another may lead at once.
    fn resign(&self);
    /// Where every manager alive serves the REST API, each beside its own address (those a
    /// manager of this cluster listed and signed).
    fn apis(&self) -> Vec<(String, String)>;
    /// Where every manager of this cluster served the REST API, alive or not.
    fn apis_known(&self) -> Vec<String>;
}

/// Where this process serves the REST API, once it does: kept across a step-down's new image
/// ([`election::step_down`]), so that each manager's API address lasts as long as its process.
pub(crate) static API_AT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
/// The environment variable that hands [`API_AT`] to the new image.
pub const API_AGAIN: &str = "SPLITOS_GM_API_AGAIN";

/// What the single manager (no etcd) is to the REST API: it leads for as long as it runs.
pub(crate) struct Alone {
    pub(crate) addr: String,
}

impl Lead for Alone {
    fn leading(&self) -> bool {
        true
    }

    fn seen(&self) -> election::Seen {
        election::Seen {
            leader: Some(self.addr.clone()),
            term: 0,
        }
    }

    fn managers(&self) -> Vec<String> {
        vec![self.addr.clone()]
    }

    fn published_status(&self) -> Option<Vec<u8>> {
        None
    }

    fn resign(&self) {}

    fn apis(&self) -> Vec<(String, String)> {
        API_AT
            .get()
            .map(|a| (self.addr.clone(), a.clone()))
            .into_iter()
            .collect()
    }

    fn apis_known(&self) -> Vec<String> {
        API_AT.get().cloned().into_iter().collect()
    }
}

impl Lead for election::Election {
    fn leading(&self) -> bool {
        election::Election::leading(self)
    }

    fn seen(&self) -> election::Seen {
        election::Election::seen(self)
    }

    fn managers(&self) -> Vec<String> {
        election::Election::managers(self)
    }

    fn published_status(&self) -> Option<Vec<u8>> {
        election::Election::published_status(self)
    }

    fn resign(&self) {
        election::Election::resign(self)
    }

    fn apis(&self) -> Vec<(String, String)> {
        election::Election::apis(self)
    }

    fn apis_known(&self) -> Vec<String> {
        election::Election::apis_known(self)
    }
}

/// What answers the managers' address when they keep their state in etcd: the managers
/// themselves while this one leads; before that, and after it stopped, a follower that answers
/// who leads and reads (the leader's last status, the API tokens), and refuses the rest
/// `NotLeader`.
pub struct Manager {
    pub(crate) election: Arc<dyn Lead>,
    pub(crate) gm: std::sync::OnceLock<Arc<Gm>>,
    pub(crate) store: state::Store,
}

impl Handler for Manager {
    /// A follower forwards to the leader: only a leader answers from its memory.
    fn fans_out(&self, msg: &Msg) -> bool {
        !from_memory(msg) || self.leading().is_none()
    }

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
    /// The managers, while this one leads.
    pub fn leading(&self) -> Option<&Arc<Gm>> {
        self.gm.get().filter(|_| self.election.leading())
    }

    /// Where every manager alive serves the REST API.
    pub fn apis(&self) -> Vec<String> {
        self.election.apis().into_iter().map(|(_, api)| api).collect()
    }

    /// Where every manager of this cluster served the REST API, alive or not: the origins a
    /// dashboard may have been served from.
    pub fn apis_known(&self) -> Vec<String> {
        self.election.apis_known()
    }

    /// Where the leader serves the REST API, as it listed itself; none while no leader is
    /// elected (or it serves none).
    pub fn leader_api(&self) -> Option<String> {
        let leader = self.election.seen().leader?;
        self.election
            .apis()
            .into_iter()
            .find_map(|(gm, api)| (gm == leader).then_some(api))
    }

    /// Whom an API token speaks for, read from the managers' state as a follower reads it
    /// (the leader's own check is `Gm::tokens`).
    pub fn check_token(&self, token: &str) -> Result<Option<tokens::Principal>, anyhow::Error> {
        Ok(tokens::Tokens::open(self.store.clone())?.check(token))
    }

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
                s.apis = self.apis();
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

impl Gm {
    /// Where every manager alive serves the REST API (these managers alone: their own).
    pub fn apis(&self) -> Vec<String> {
        match &self.election {
            Some(e) => e.apis().into_iter().map(|(_, api)| api).collect(),
            None => API_AT.get().cloned().into_iter().collect(),
        }
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
