//! A skeleton on several NICs (docs/network.md): a listening or unconnected socket has a part on
//! each of the nComponent's interfaces, and a peer is answered from the part its traffic
//! reached.
use super::*;

impl Skeleton {
    /// Binds its socket to `addr`, and when that is all of the host's addresses in its
    /// vNode's loopback, a part on each of `nics` (of its family) on the same port. Fails as
    /// the kernel's bind would, with nothing bound.
    pub fn bind_all(
        &mut self,
        ns: Option<&Namespaces>,
        nics: &[std::net::IpAddr],
        addr: SocketAddr,
        share: bool,
    ) -> Result<SocketAddr, Refusal> {
        // An ephemeral port free in the vNode's loopback may be taken on an interface address.
        for _ in 0..8 {
            bind_one(&self.socket, addr, self.reuseport, share).map_err(|e| refusal(&e))?;
            let local = self
                .socket
                .local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .ok_or_else(|| Refusal::errno(libc::EINVAL))?;
            let Some(ns) = ns.filter(|_| self.realm == Realm::Vnode && addr.ip().is_unspecified()) else {
                return Ok(local);
            };
            match self.spread(ns, nics, local.port(), share) {
                Ok(()) => return Ok(local),
                Err(e) => {
                    self.remake(ns, Realm::Vnode)?;
                    if addr.port() != 0 || e.raw_os_error() != Some(libc::EADDRINUSE) {
                        return Err(refusal(&e));
                    }
                }
            }
        }
        Err(Refusal::errno(libc::EADDRINUSE))
    }

    /// Its parts on the host's interface addresses of its family (IPv4 ones as IPv6 names them
    /// too, unless the socket is IPv6 only), on `port`.
    pub(super) fn spread(
        &mut self,
        ns: &Namespaces,
        nics: &[std::net::IpAddr],
        port: u16,
        share: bool,
    ) -> std::io::Result<()> {
        let v6only = self.family == libc::AF_INET6 && self.socket.only_v6()?;
        let mut parts = Vec::new();
        for ip in nics {
            let at = match (self.family, ip) {
                (libc::AF_INET, std::net::IpAddr::V4(_)) | (libc::AF_INET6, std::net::IpAddr::V6(_)) => *ip,
                (libc::AF_INET6, std::net::IpAddr::V4(v4)) if !v6only => std::net::IpAddr::V6(v4.to_ipv6_mapped()),
                _ => continue,
            };
            let s = self
                .make(ns, Realm::Host)
                .map_err(|e| std::io::Error::from_raw_os_error(e.code.errno()))?;
            bind_one(&s, SocketAddr::new(at, port), self.reuseport, share)?;
            parts.push(s);
        }
        self.nic_parts = parts;
        self.routes.clear();
        Ok(())
    }

    /// Puts the socket where a connect to `peer` goes from: the vNode's loopback for a
    /// loopback peer, the host's namespace (its part on an interface address, if it has
    /// them) for any other. A connected socket is one socket.
    pub fn place_for(&mut self, ns: &Namespaces, peer: SocketAddr) -> Result<(), Refusal> {
        let want = Realm::of(peer.ip());
        let port = self
            .socket
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map_or(0, |a| a.port());
        match (self.realm, want) {
            (Realm::Vnode, Realm::Host) => {
                if let Some(i) = self.part_for(peer) {
                    self.socket = self.nic_parts.swap_remove(i);
                    self.realm = Realm::Host;
                } else if port == 0 {
                    self.remake(ns, Realm::Host)?;
                }
            }
            (Realm::Host, Realm::Vnode) => {
                self.remake(ns, Realm::Vnode)?;
                if port != 0 {
                    let any: std::net::IpAddr = if self.family == libc::AF_INET6 {
                        std::net::Ipv6Addr::UNSPECIFIED.into()
                    } else {
                        std::net::Ipv4Addr::UNSPECIFIED.into()
                    };
                    bind_one(&self.socket, SocketAddr::new(any, port), self.reuseport, true)
                        .map_err(|e| refusal(&e))?;
                }
            }
            _ => {}
        }
        self.nic_parts.clear();
        self.routes.clear();
        Ok(())
    }

    /// Its part on the interface address the host's routes send to `peer` from (else on one of
    /// the peer's family), if it has parts.
    pub(super) fn part_for(&self, peer: SocketAddr) -> Option<usize> {
        let ip = peer.ip().to_canonical();
        let local = |s: &Socket| {
            s.local_addr()
                .ok()
                .and_then(|a| a.as_socket())
                .map(|a| a.ip().to_canonical())
        };
        if self.nic_parts.is_empty() {
            return None;
        }
        // A datagram socket connected to the peer asks the routes, and sends nothing.
        let domain = if ip.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
        let source = Socket::new(domain, Type::DGRAM, None)
            .and_then(|s| {
                s.connect(&SockAddr::from(SocketAddr::new(ip, peer.port().max(1))))
                    .map(|()| s)
            })
            .ok()
            .as_ref()
            .and_then(local);
        let routed = self
            .nic_parts
            .iter()
            .position(|s| source.is_some() && local(s) == source);
        routed.or_else(|| {
            self.nic_parts
                .iter()
                .position(|s| local(s).is_some_and(|l| l.is_ipv4() == ip.is_ipv4()))
        })
    }

    /// The socket a datagram to `to` leaves from: for a peer beyond loopback, its part on the
    /// interface address the routes choose, if it has parts.
    pub(super) fn sender_for(&mut self, to: SocketAddr) -> &Socket {
        if Realm::of(to.ip()) == Realm::Host {
            let known = self.routes.iter().find(|(ip, _)| *ip == to.ip()).map(|(_, i)| *i);
            let part = known.or_else(|| {
                let i = self.part_for(to)?;
                if self.routes.len() >= ROUTES {
                    self.routes.remove(0);
                }
                self.routes.push((to.ip(), i));
                Some(i)
            });
            if let Some(i) = part {
                return &self.nic_parts[i];
            }
        }
        &self.socket
    }
}
