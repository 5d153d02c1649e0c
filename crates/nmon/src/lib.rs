//! The network monitor (nComponent): the one component that owns network interfaces. It
//! registers their addresses with the global network manager and runs programs' sockets on
//! its own host's stack: a proxy takes the socket stubs' requests and makes one socket
//! skeleton per socket ([`proxy`], [`skeleton`]), each vNode's loopback sockets in a network
//! namespace of the vNode's ([`netns`]). It never calls another component on the data path.
//! docs/network.md tells the whole design.
mod ddma;
mod netns;
mod proxy;
pub mod series;
mod skeleton;

use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use splitos_rpc::*;

use proxy::{Job, ProxyHandle};
use series::Counters;
use splitos_core::config::NetArgs;
use splitos_core::node::{self, Node};

pub struct Net {
    node: Arc<Node>,
    proxy: Arc<ProxyHandle>,
    ddma: ddma::Ddma,
    c: Arc<Counters>,
    started: Instant,
}

impl Net {
    fn load(&self) -> Load {
        Load {
            threads: 0,
            processes: self.c.open.load(Relaxed) as u32,
            capacity: 0,
            committed: 0,
            used: 0,
        }
    }

    fn stats_json(&self) -> String {
        let c = &self.c;
        let state = serde_json::json!({
            "role": "ncomponent", "id": self.node.id(), "addr": self.node.addr, "uptime_ms": self.started.elapsed().as_millis() as u64,
            "nics": self.node.nics.get().cloned().unwrap_or_default(),
            "open_sockets": c.open.load(Relaxed), "vnode_loopbacks": self.proxy.loopbacks(),
        });
        splitos_metrics::counters::json_with(c.counters(), state).to_string()
    }
}

/// The nComponent's dispatch table: socket requests go to the proxy, which answers them when
/// their socket is ready; the rest are answered here.
impl Handler for Net {
    fn answers_later(&self, msg: &Msg) -> bool {
        msg.name().starts_with("P2N_")
    }

    fn handle_later(&self, msg: Msg, reply: Reply) {
        let key = current_peer().map(|p| p.key);
        match msg {
            Msg::P2N_SEND_DMA(r) => self.ddma.fetch_and_send(r, key, reply),
            Msg::P2N_RECV_DMA(r) => {
                let recv = P2N_RECV {
                    sock: r.sock,
                    max: r.max,
                    wait_ms: r.wait_ms,
                };
                let store = self.ddma.store_received(key, r.mcomp, r.buf, r.offset, reply);
                self.proxy.submit(Job(recv.into(), key, store));
            }
            Msg::P2N_SEND(r) => {
                let n = r.data.len() as u64;
                let c = self.c.clone();
                let counted: Reply = Box::new(move |m| {
                    if matches!(m, Msg::OK(_)) {
                        c.ddio_sent_bytes.fetch_add(n, Relaxed);
                    }
                    reply(m)
                });
                self.proxy.submit(Job(r.into(), key, counted));
            }
            Msg::P2N_SENDTO(r) => {
                let n: u64 = r.grams.iter().map(|g| g.data.len() as u64).sum();
                self.c.ddio_sent_bytes.fetch_add(n, Relaxed);
                self.proxy.submit(Job(r.into(), key, reply));
            }
            Msg::P2N_RECVFROM(r) => {
                let c = self.c.clone();
                let counted: Reply = Box::new(move |m| {
                    if let Msg::N2P_GRAMS(g) = &m {
                        let n: u64 = g.grams.iter().map(|g| g.data.len() as u64).sum();
                        c.ddio_received_bytes.fetch_add(n, Relaxed);
                        c.datagrams_received.fetch_add(g.grams.len() as u64, Relaxed);
                    }
                    reply(m)
                });
                self.proxy.submit(Job(r.into(), key, counted));
            }
            Msg::P2N_RECV(r) => {
                let c = self.c.clone();
                let counted: Reply = Box::new(move |m| {
                    if let Msg::N2P_DATA(d) = &m {
                        c.ddio_received_bytes.fetch_add(d.data.len() as u64, Relaxed);
                    }
                    reply(m)
                });
                self.proxy.submit(Job(r.into(), key, counted));
            }
            other => self.proxy.submit(Job(other, key, reply)),
        }
    }

    fn handle(&self, msg: Msg) -> Msg {
        crate::series::REQUESTS.with([msg.name()]).increment(1);
        match msg {
            Msg::C2X_PING(r) => on(r, |_| {
                Ok(X2C_PONG {
                    role: Role::Net,
                    id: self.node.id(),
                })
            }),
            Msg::C2X_STATS(r) => on(r, |_| {
                Ok(X2C_STATS {
                    json: self.stats_json(),
                })
            }),
            Msg::G2X_STATS(r) => on(r, |_| {
                Ok(X2G_STATS {
                    json: self.stats_json(),
                })
            }),
            Msg::C2X_METRICS(r) => on(r, |_| {
                Ok(X2C_METRICS {
                    text: splitos_core::telemetry::render(),
                })
            }),
            Msg::G2X_METRICS(r) => on(r, |_| {
                Ok(X2G_METRICS {
                    text: splitos_core::telemetry::render(),
                })
            }),
            Msg::C2X_SHUTDOWN(r) => on(r, |_| {
                node::exit_soon();
                Ok(OK)
            }),
            other => Msg::ERR(
                Unhandled {
                    by: "an nComponent does",
                    msg: other.name(),
                }
                .into(),
            ),
        }
    }
}

/// This host's interface addresses, loopback and IPv6 link-local ones left out: those are the
/// addresses a bind can name and the outside can reach.
pub fn host_addresses() -> std::io::Result<Vec<IpAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list it hands to us; freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut at = head;
    while !at.is_null() {
        // SAFETY: a node of the list getifaddrs made, alive until freeifaddrs.
        let ifa = unsafe { &*at };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points at a sockaddr whose family says which one it is.
            let ip = unsafe {
                match (*ifa.ifa_addr).sa_family as i32 {
                    libc::AF_INET => Some(IpAddr::from(
                        (*(ifa.ifa_addr as *const libc::sockaddr_in))
                            .sin_addr
                            .s_addr
                            .to_ne_bytes(),
                    )),
                    libc::AF_INET6 => Some(IpAddr::from(
                        (*(ifa.ifa_addr as *const libc::sockaddr_in6)).sin6_addr.s6_addr,
                    )),
                    _ => None,
                }
            };
            let link_local = |ip: &IpAddr| matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80);
            if let Some(ip) = ip.filter(|ip| !ip.is_loopback() && !link_local(ip)) {
                if !out.contains(&ip) {
                    out.push(ip);
                }
            }
        }
        at = ifa.ifa_next;
    }
    // SAFETY: the list getifaddrs returned, not used after this.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

pub fn run(args: NetArgs) -> anyhow::Result<()> {
    let cfg = &args.ncomp;
    cfg.validate().map_err(|e| anyhow::anyhow!(e))?;
    let nics = if cfg.nics.is_empty() {
        host_addresses()?
    } else {
        cfg.nics.clone()
    };
    let (node, endpoint) = Node::bind(Role::Net, &args.node.gm, &cfg.listen, &args.node.process)?;
    let _ = node.nics.set(nics.clone());
    let c = Arc::new(Counters::default());
    let proxy = Arc::new(proxy::start(c.clone(), cfg.loopback, nics.clone())?);
    let ddma = ddma::Ddma::start(node.clone(), proxy.clone(), c.clone())?;
    let net = Arc::new(Net {
        node: node.clone(),
        proxy,
        ddma,
        c,
        started: Instant::now(),
    });
    let n = net.clone();
    splitos_core::telemetry::on_render(move |e| {
        n.c.render(e);
        e.one(&crate::series::OPEN_SOCKETS, n.c.open.load(Relaxed) as f64)
    });
    endpoint.serve(
        net.clone(),
        ServerConfig {
            name: "ncomp".into(),
            workers: 0,
            fanout_workers: 1,
            serving: cfg.serving.clone(),
        },
    );
    node.register(None, net.load())
        .map_err(|e| anyhow::anyhow!("cannot register with the global managers at {}: {e}", args.node.gm))?;
    let (n2, n3) = (net.clone(), net.clone());
    node.clone().heartbeat_forever(
        None,
        move || n2.load(),
        move |beat| {
            let keys: Vec<[u8; 32]> = beat.lost.iter().map(|l| l.key).collect();
            if !keys.is_empty() {
                n3.proxy.forget_owners(&keys);
            }
        },
    );
    let shown: Vec<String> = nics.iter().map(|ip| ip.to_string()).collect();
    tracing::info!(addr = %node.addr, transport = node.rpc.transport().name(), id = node.id(), role = "ncomponent", metrics = ?node.metrics, nics = %shown.join(","), loopback = %cfg.loopback, serving = %cfg.serving.kind, "splitos network monitor started");
    node::announce_ready(args.node.process.ready_file.as_deref(), &node.addr);
    splitos_core::node::park_forever()
}
