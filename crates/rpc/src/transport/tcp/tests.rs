//! The TCP transport's bounds against a peer that floods or stalls: caps on connections,
//! frame deadlines, requests in flight per connection.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::AtomicUsize;

use super::*;
use crate::frame::encode;
use crate::serving::{Serving, ServingConfig};
use crate::wire::{FrameHeader, C2X_PING, MAGIC, MAX_BODY, WIRE_VERSION, X2C_PONG};
use zerocopy::IntoBytes;

/// Answers a ping after 50 ms, counting how many it serves at once.
#[derive(Default)]
struct Slow {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Handler for Slow {
    fn handle(&self, msg: Msg) -> Msg {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        self.now.fetch_sub(1, Ordering::SeqCst);
        match msg {
            Msg::C2X_PING(_) => X2C_PONG {
                role: crate::Role::Gm,
                id: 1,
            }
            .into(),
            m => m,
        }
    }
}

fn serve(cfg: TcpConfig, workers: usize, serving: &ServingConfig) -> (String, Arc<Slow>) {
    let t = TcpTransport::new(cfg, Polling::Fixed, None);
    let ep = t.listen("127.0.0.1:0").unwrap();
    let addr = ep.addr();
    let h = Arc::new(Slow::default());
    ep.serve(
        h.clone(),
        ServerConfig {
            name: "slow".into(),
            workers,
            fanout_workers: 1,
            serving: serving.clone(),
        },
    );
    (addr, h)
}

/// Both ways of serving: the bounds hold on each.
fn servings() -> [ServingConfig; 2] {
    [
        ServingConfig::default(),
        ServingConfig {
            kind: Serving::Loops,
            ..ServingConfig::default()
        },
    ]
}

fn ping_frame(id: u64) -> Vec<u8> {
    encode(FrameKind::Request, id, &C2X_PING.into())
}

/// Reads one frame: its kind and request id; `None` if the connection ends or times out.
fn try_frame(s: &mut TcpStream) -> Option<(u8, u64)> {
    let mut h = [0u8; FrameHeader::SIZE];
    s.read_exact(&mut h).ok()?;
    let len = u32::from_le_bytes(h[16..20].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    Some((h[6], u64::from_le_bytes(h[8..16].try_into().unwrap())))
}

fn next_frame(s: &mut TcpStream) -> (u8, u64) {
    try_frame(s).expect("a frame")
}

/// Reads one reply frame's request id, past the grant of credits.
fn reply_id(s: &mut TcpStream) -> u64 {
    loop {
        match next_frame(s) {
            (k, id) if k == FrameKind::Reply as u8 => return id,
            (k, _) => assert_eq!(k, FrameKind::Credit as u8, "a reply or a grant"),
        }
    }
}

/// True if the peer closed `s` within `within` (what it sent before, a grant, is read past).
fn closed(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Err(e) => return e.kind() == io::ErrorKind::ConnectionReset,
            Ok(_) => continue,
        }
    }
}

#[test]
fn one_connection_has_at_most_max_in_flight_requests_served_at_once() {
    for serving in &servings() {
        let (addr, h) = serve(
            TcpConfig {
                max_in_flight: 2,
                ..TcpConfig::default()
            },
            8,
            serving,
        );
        let mut s = TcpStream::connect(&addr).unwrap();
        assert_eq!(
            next_frame(&mut s),
            (FrameKind::Credit as u8, 2),
            "the connection is granted its credits first"
        );
        let burst: Vec<u8> = (1..=10).flat_map(ping_frame).collect();
        s.write_all(&burst).unwrap();
        let mut ids: Vec<u64> = (0..10).map(|_| reply_id(&mut s)).collect();
        ids.sort();
        assert_eq!(ids, (1..=10).collect::<Vec<_>>(), "every request is answered");
        assert_eq!(
            h.most.load(Ordering::SeqCst),
            2,
            "eight workers, but two requests of the connection at a time"
        );
    }
}

#[test]
fn an_injected_delay_holds_every_answer() {
    for serving in &servings() {
        let (addr, _) = serve(
            TcpConfig {
                delay_us: 200_000,
                ..TcpConfig::default()
            },
            0,
            serving,
        );
        let mut s = TcpStream::connect(&addr).unwrap();
        let t0 = Instant::now();
        s.write_all(&ping_frame(1)).unwrap();
        assert_eq!(reply_id(&mut s), 1);
        // The handler's 50 ms, and the delay before the answer.
        assert!(
            t0.elapsed() >= Duration::from_millis(250),
            "{serving:?}: answered after {:?}",
            t0.elapsed()
        );
    }
}

#[test]
fn connections_over_the_caps_are_closed_and_the_others_served() {
    for serving in &servings() {
        let (addr, _) = serve(
            TcpConfig {
                max_connections_per_peer: 3,
                ..TcpConfig::default()
            },
            0,
            serving,
        );
        let mut held: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&addr).unwrap()).collect();
        for (i, s) in held.iter_mut().enumerate() {
            s.write_all(&ping_frame(i as u64)).unwrap();
            assert_eq!(reply_id(s), i as u64);
        }
        let mut over = TcpStream::connect(&addr).unwrap();
        assert!(
            closed(&mut over, Duration::from_secs(5)),
            "a fourth connection from the same address is closed at once"
        );
        drop(held.pop());
        // The slot comes back once the component sees the connection end.
        let served = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(20));
            let mut s = TcpStream::connect(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            s.write_all(&ping_frame(99)).is_ok()
                && std::iter::from_fn(|| try_frame(&mut s)).any(|(k, id)| k == FrameKind::Reply as u8 && id == 99)
        });
        assert!(served, "a connection is served again once one ended");
        let (addr, _) = serve(
            TcpConfig {
                max_connections: 2,
                ..TcpConfig::default()
            },
            0,
            serving,
        );
        let _a = TcpStream::connect(&addr).unwrap();
        let _b = TcpStream::connect(&addr).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            closed(&mut TcpStream::connect(&addr).unwrap(), Duration::from_secs(5)),
            "max_connections holds for all peers together"
        );
    }
}

#[test]
fn stalled_frames_and_silent_connections_are_closed_after_the_frame_timeout() {
    for serving in &servings() {
        let (addr, _) = serve(
            TcpConfig {
                frame_timeout_ms: 300,
                ..TcpConfig::default()
            },
            0,
            serving,
        );
        // Half a header announcing the largest body; then a whole header and part of the body.
        let hdr = FrameHeader {
            magic: MAGIC,
            version: WIRE_VERSION,
            kind: 0,
            flags: 0,
            req_id: 1,
            len: MAX_BODY,
            reserved: 0,
        };
        let mut half = TcpStream::connect(&addr).unwrap();
        half.write_all(&hdr.as_bytes()[..10]).unwrap();
        let mut body = TcpStream::connect(&addr).unwrap();
        body.write_all(hdr.as_bytes()).unwrap();
        body.write_all(&[0u8; 1000]).unwrap();
        let mut silent = TcpStream::connect(&addr).unwrap();
        // A connection whose first frame came in time may then stay idle.
        let mut idle = TcpStream::connect(&addr).unwrap();
        idle.write_all(&ping_frame(5)).unwrap();
        assert_eq!(reply_id(&mut idle), 5);
        let t0 = Instant::now();
        for (what, s) in [
            ("half a header", &mut half),
            ("part of a body", &mut body),
            ("nothing", &mut silent),
        ] {
            assert!(closed(s, Duration::from_secs(5)), "{what}: closed");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(3),
            "closed after about the frame timeout: {:?}",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(400));
        idle.write_all(&ping_frame(6)).unwrap();
        assert_eq!(reply_id(&mut idle), 6, "an idle connection between frames is kept");
        // A frame that trickles in, each byte within the timeout, still has to arrive whole in time.
        let mut trickle = TcpStream::connect(&addr).unwrap();
        let f = ping_frame(7);
        let mut cut = false;
        for b in &f {
            if trickle.write_all(&[*b]).is_err() {
                cut = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            cut || closed(&mut trickle, Duration::from_secs(1)),
            "a trickled frame is cut at its deadline"
        );
    }
}

mod authenticated {
    use super::*;
    use crate::auth::Authority;
    use crate::wire::{Who, P2M_FETCH};
    use crate::Rpc;

    /// Answers anything with a pong.
    struct Pong;

    impl Handler for Pong {
        fn handle(&self, _: Msg) -> Msg {
            X2C_PONG {
                role: crate::Role::Mem,
                id: 7,
            }
            .into()
        }
    }

    fn serve_as(ca: &Authority, role: crate::Role, serving: &ServingConfig) -> String {
        let t = TcpTransport::new(
            TcpConfig::default(),
            Polling::Fixed,
            Some(Arc::new(ca.issue(role).unwrap())),
        );
        let ep = t.listen("127.0.0.1:0").unwrap();
        let addr = ep.addr();
        ep.serve(
            Arc::new(Pong),
            ServerConfig {
                name: "pong".into(),
                workers: 0,
                fanout_workers: 1,
                serving: serving.clone(),
            },
        );
        addr
    }

    fn client(ca: &Authority, role: crate::Role) -> Rpc {
        Rpc::new(
            Arc::new(TcpTransport::new(
                TcpConfig::default(),
                Polling::Fixed,
                Some(Arc::new(ca.issue(role).unwrap())),
            )),
            Duration::from_secs(5),
        )
    }

    #[test]
    fn a_peer_of_the_cluster_is_served_what_its_role_may_send() {
        for serving in &servings() {
            let ca = Authority::generate().unwrap();
            let addr = serve_as(&ca, crate::Role::Mem, serving);
            let fetch = || P2M_FETCH {
                who: Who::new("v", 1),
                vpn: 1,
            };
            let proc_ = client(&ca, crate::Role::Proc);
            assert!(
                matches!(proc_.call_msg(&addr, &fetch().into()), Ok(Msg::X2C_PONG(_))),
                "a pComponent may fetch"
            );
            for role in [crate::Role::Storage, crate::Role::Gm, crate::Role::Mem] {
                match client(&ca, role).call_msg(&addr, &fetch().into()) {
                    Err(crate::RpcError::Remote { msg, .. }) => {
                        assert!(msg.contains("may not send P2M_FETCH"), "{msg}")
                    }
                    other => panic!("a {} fetched a page: {other:?}", role.name()),
                }
            }
            assert!(
                matches!(
                    client(&ca, crate::Role::Admin).call_msg(&addr, &fetch().into()),
                    Ok(Msg::X2C_PONG(_))
                ),
                "the admin may"
            );
            // And a caller sends a page request only to a component that handles it, whoever
            // holds the address.
            let imposter = serve_as(&ca, crate::Role::Storage, serving);
            match proc_.call_msg(&imposter, &fetch().into()) {
                Err(crate::RpcError::Unreachable { why, .. }) => {
                    assert!(why.contains("does not handle P2M_FETCH"), "{why}")
                }
                other => panic!("a fetch went to an sComponent: {other:?}"),
            }
        }
    }

    /// A connection whose caller asks for encrypted records (as across hosts): whole frames
    /// spanning several records, pipelined, are served; a record that does not authenticate
    /// closes the connection.
    #[test]
    fn encrypted_records_are_served_and_a_forged_one_closes_the_connection() {
        for serving in &servings() {
            let ca = Authority::generate().unwrap();
            let addr = serve_as(&ca, crate::Role::Mem, serving);
            let creds = ca.issue(crate::Role::Proc).unwrap();
            let mut c = TcpConn::new(
                TcpStream::connect(&addr).unwrap(),
                &TcpConfig::default(),
                Polling::Fixed,
            )
            .unwrap();
            let hs = auth::initiate(&mut c, &creds, true).unwrap();
            c.session = Some(Arc::new(hs.session.expect("records are encrypted when asked")));
            let big = crate::wire::P2M_FLUSH {
                who: Who::new("v", 1),
                vpn: 3,
                data: serde_bytes::ByteBuf::from(vec![5u8; 3 * auth::RECORD + 100]),
            };
            let mut burst = Vec::new();
            for (id, m) in [
                (
                    1u64,
                    Msg::from(P2M_FETCH {
                        who: Who::new("v", 1),
                        vpn: 1,
                    }),
                ),
                (2, big.into()),
                (
                    3,
                    P2M_FETCH {
                        who: Who::new("v", 1),
                        vpn: 2,
                    }
                    .into(),
                ),
            ] {
                burst.extend(encode(FrameKind::Request, id, &m));
            }
            c.write_all(&burst).unwrap();
            let mut ids = Vec::new();
            while ids.len() < 3 {
                let f = crate::frame::read_frame(&mut c).unwrap().expect("a frame");
                if f.kind == FrameKind::Reply {
                    assert!(matches!(f.msg, Msg::X2C_PONG(_)), "{serving:?}: {:?}", f.msg);
                    ids.push(f.req_id);
                }
            }
            ids.sort();
            assert_eq!(ids, [1, 2, 3], "{serving:?}");
            // A record of the right length that does not authenticate.
            let mut raw = c.s.try_clone().unwrap();
            raw.write_all(&100u32.to_le_bytes()).unwrap();
            raw.write_all(&[0xa5u8; 100]).unwrap();
            assert!(
                closed(&mut raw, Duration::from_secs(5)),
                "{serving:?}: a forged record closes the connection"
            );
        }
    }

    #[test]
    fn a_peer_without_the_clusters_credentials_gets_nothing() {
        for serving in &servings() {
            let ca = Authority::generate().unwrap();
            let addr = serve_as(&ca, crate::Role::Mem, serving);
            // The documented wire format, without a handshake.
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(&ping_frame(1)).unwrap();
            assert!(
                closed(&mut s, Duration::from_secs(5)),
                "a frame without a handshake is not answered"
            );
            // A handshake with credentials of another authority.
            let other = Authority::generate().unwrap();
            let e = client(&other, crate::Role::Proc)
                .call_msg(&addr, &C2X_PING.into())
                .unwrap_err();
            assert!(
                e.to_string().contains("did not issue")
                    || e.to_string().contains("refused")
                    || e.to_string().contains("closed"),
                "{e}"
            );
        }
    }
}

/// Answers anything with a 1 MiB page.
struct Big;

impl Handler for Big {
    fn handle(&self, _: Msg) -> Msg {
        crate::wire::M2P_PAGE {
            data: serde_bytes::ByteBuf::from(vec![7u8; 1 << 20]),
        }
        .into()
    }
}

#[test]
fn a_peer_that_stops_reading_its_replies_does_not_hold_the_workers() {
    for serving in &servings() {
        let t = TcpTransport::new(
            TcpConfig {
                frame_timeout_ms: 300,
                ..TcpConfig::default()
            },
            Polling::Fixed,
            None,
        );
        let ep = t.listen("127.0.0.1:0").unwrap();
        let addr = ep.addr();
        ep.serve(
            Arc::new(Big),
            ServerConfig {
                name: "big".into(),
                workers: 1,
                fanout_workers: 1,
                serving: serving.clone(),
            },
        );
        // Sixty-four requests whose replies (64 MiB) are never read fill the socket's buffers.
        let mut stuck = TcpStream::connect(&addr).unwrap();
        let burst: Vec<u8> = (1..=64).flat_map(ping_frame).collect();
        stuck.write_all(&burst).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        // The one worker gives up on that peer and serves the next.
        let mut next = TcpStream::connect(&addr).unwrap();
        next.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        next.write_all(&ping_frame(99)).unwrap();
        assert_eq!(reply_id(&mut next), 99);
        // And the peer that does not read is closed once its answers stopped draining for the
        // frame timeout (reading earlier would drain them).
        std::thread::sleep(Duration::from_millis(600));
        assert!(
            closed(&mut stuck, Duration::from_secs(5)),
            "{serving:?}: the stuck peer was closed"
        );
    }
}

/// Reads frames until a request, and returns its id.
fn request_id(s: &mut TcpStream) -> u64 {
    let (k, id) = next_frame(s);
    assert_eq!(k, FrameKind::Request as u8);
    id
}

#[test]
fn a_client_has_no_more_requests_in_flight_than_its_receiver_granted() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let t = Arc::new(TcpTransport::new(TcpConfig::default(), Polling::Fixed, None));
    let pong = || {
        encode(
            FrameKind::Reply,
            0,
            &X2C_PONG {
                role: crate::Role::Gm,
                id: 1,
            }
            .into(),
        )
    };
    let reply = |id: u64| {
        let mut f = pong();
        f[8..16].copy_from_slice(&id.to_le_bytes());
        f
    };
    // A first call makes the connection; its receiver grants three credits.
    let first = {
        let (t, addr) = (t.clone(), addr.clone());
        std::thread::spawn(move || t.call(&addr, &C2X_PING.into(), Duration::from_secs(20)))
    };
    let (mut s, _) = l.accept().unwrap();
    s.write_all(&encode(FrameKind::Credit, 3, &Msg::OK(crate::wire::OK)))
        .unwrap();
    let id = request_id(&mut s);
    s.write_all(&reply(id)).unwrap();
    assert!(matches!(first.join().unwrap(), Ok(Msg::X2C_PONG(_))));
    // Ten callers at once: three requests come, and then one per reply.
    let callers: Vec<_> = (0..10)
        .map(|_| {
            let (t, addr) = (t.clone(), addr.clone());
            std::thread::spawn(move || t.call(&addr, &C2X_PING.into(), Duration::from_secs(20)))
        })
        .collect();
    let mut outstanding: Vec<u64> = (0..3).map(|_| request_id(&mut s)).collect();
    let mut answered = 0;
    while let Some(id) = outstanding.pop() {
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        assert!(try_frame(&mut s).is_none(), "no request beyond the three credits");
        s.set_read_timeout(None).unwrap();
        s.write_all(&reply(id)).unwrap();
        answered += 1;
        if answered + outstanding.len() < 10 {
            outstanding.push(request_id(&mut s));
        }
    }
    assert_eq!(answered, 10);
    for c in callers {
        assert!(
            matches!(c.join().unwrap(), Ok(Msg::X2C_PONG(_))),
            "every caller answered"
        );
    }
}
