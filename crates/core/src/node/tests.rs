//! The managers as a component sees them ([`Managers`]): a call goes to the leader as last
//! heard; a follower's `NotLeader`, or a manager that cannot be reached, sends it on to the
//! leader the managers name in their latest term; a call that may have been carried out is
//! never sent twice. The managers here are loopback servers that answer as a leader or a
//! follower would.
use super::*;
use splitos_rpc::poll::Polling;
use splitos_rpc::transport::{TcpConfig, TcpTransport};
use splitos_rpc::{Handler, Msg, ServerConfig, Transport, C2X_PING, ERR, X2C_PONG};

/// A manager that leads (and answers pings, after `delay`) or follows (and refuses them);
/// either names the leader it knows, in its term.
struct Manager {
    leads: bool,
    names: Mutex<(Option<String>, u64)>,
    delay: Duration,
    pings: AtomicU32,
}

impl Handler for Manager {
    fn handle(&self, msg: Msg) -> Msg {
        match msg {
            Msg::X2G_WHO_LEADS(_) => {
                let (leader, term) = self.names.lock().unwrap().clone();
                G2X_LEADER { leader, term }.into()
            }
            Msg::C2X_PING(_) if self.leads => {
                self.pings.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(self.delay);
                X2C_PONG { role: Role::Gm, id: 0 }.into()
            }
            _ => Msg::ERR(ERR::new(ErrCode::NotLeader, "this manager follows")),
        }
    }
}

fn transport() -> Arc<TcpTransport> {
    Arc::new(TcpTransport::new(TcpConfig::default(), Polling::Fixed, None))
}

fn manager(leads: bool, delay: Duration) -> (String, Arc<Manager>) {
    let ep = transport().listen("127.0.0.1:0").unwrap();
    let addr = ep.addr();
    let m = Arc::new(Manager {
        leads,
        names: Mutex::new((None, 0)),
        delay,
        pings: AtomicU32::new(0),
    });
    ep.serve(
        m.clone(),
        ServerConfig {
            name: "gm".into(),
            workers: 2,
            fanout_workers: 1,
            serving: Default::default(),
        },
    );
    (addr, m)
}

fn names(m: &Manager, leader: &str, term: u64) {
    *m.names.lock().unwrap() = (Some(leader.to_string()), term);
}

fn rpc() -> Rpc {
    Rpc::new(transport(), Duration::from_secs(5))
}

#[test]
fn a_call_refused_by_a_follower_reaches_the_leader_of_the_latest_term() {
    let (a, fa) = manager(false, Duration::ZERO);
    let (b, fb) = manager(false, Duration::ZERO);
    let (c, lc) = manager(true, Duration::ZERO);
    // A still names B from an earlier term; B knows C won the latest.
    names(&fa, &b, 2);
    names(&fb, &c, 5);
    names(&lc, &c, 5);
    let gm = Managers::new(&format!("{a},{b},{c}"));
    assert_eq!(gm.leader(), a, "the first before any answer");
    gm.call(&rpc(), C2X_PING).unwrap();
    assert_eq!(gm.leader(), c);
    assert_eq!(lc.pings.load(Ordering::SeqCst), 1);
    // The next call goes to the leader at once.
    gm.call(&rpc(), C2X_PING).unwrap();
    assert_eq!(lc.pings.load(Ordering::SeqCst), 2);
}

#[test]
fn a_manager_that_cannot_be_reached_is_passed_over() {
    // A port nothing listens on any more.
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let (b, lb) = manager(true, Duration::ZERO);
    names(&lb, &b, 1);
    let gm = Managers::new(&format!("{gone},{b}"));
    gm.call(&rpc(), C2X_PING).unwrap();
    assert_eq!((gm.leader(), lb.pings.load(Ordering::SeqCst)), (b, 1));
}

#[test]
fn a_call_the_leader_may_have_carried_out_is_not_sent_again() {
    // The leader answers after the caller stopped waiting (GM_TIMEOUT): the ping may have
    // been carried out, so the caller gets the error rather than a second ping.
    let (a, la) = manager(true, GM_TIMEOUT + Duration::from_secs(1));
    names(&la, &a, 1);
    let (b, lb) = manager(true, Duration::ZERO);
    names(&lb, &a, 1);
    let gm = Managers::new(&format!("{a},{b}"));
    match gm.call(&rpc(), C2X_PING) {
        Err(RpcError::Timeout { .. }) => {}
        other => panic!("the caller is told it timed out: {other:?}"),
    }
    assert_eq!(la.pings.load(Ordering::SeqCst), 1);
    assert_eq!(lb.pings.load(Ordering::SeqCst), 0, "sent nowhere else");
}

/// A component whose heartbeats go unanswered says so at its first failure, not at each
/// beat, and says when the managers answer again.
#[test]
fn silent_managers_are_said_once_then_every_while_and_their_return_once() {
    let mut s = Silence::default();
    assert!(s.failed().is_some_and(|d| d < Silence::EVERY), "said at once");
    assert_eq!(s.failed(), None, "not at every beat");
    assert!(s.answered().is_some(), "their return is said");
    assert_eq!(s.answered(), None, "once");
    assert!(s.failed().is_some(), "a new silence is said at once again");
}
