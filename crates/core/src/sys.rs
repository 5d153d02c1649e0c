//! What components and the control plane ask of this host that no one monitor owns: users and
//! groups by name, and the mounts under a directory (a pComponent's vNode file systems, which
//! `cluster down` and `run` also look at).
use std::path::{Path, PathBuf};

/// Why a user's or group's name gives no id here.
#[derive(Debug, thiserror::Error)]
pub enum IdError {
    #[error("no {what} {name:?} on this host")]
    Unknown { what: &'static str, name: String },
    #[error("cannot look up {what} {name:?}: {error}")]
    Lookup {
        what: &'static str,
        name: String,
        error: nix::Error,
    },
}

/// A user's or group's id, from its number or its name on this host; a name this host does not
/// know is an error, not a grant to nobody.
fn id_of(what: &'static str, name: &str, lookup: impl Fn(&str) -> nix::Result<Option<u32>>) -> Result<u32, IdError> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    match lookup(name) {
        Ok(Some(id)) => Ok(id),
        Ok(None) => Err(IdError::Unknown {
            what,
            name: name.to_string(),
        }),
        Err(error) => Err(IdError::Lookup {
            what,
            name: name.to_string(),
            error,
        }),
    }
}

pub fn uid_of(name: &str) -> Result<u32, IdError> {
    id_of("user", name, |n| {
        nix::unistd::User::from_name(n).map(|u| u.map(|u| u.uid.as_raw()))
    })
}

pub fn gid_of(name: &str) -> Result<u32, IdError> {
    id_of("group", name, |n| {
        nix::unistd::Group::from_name(n).map(|g| g.map(|g| g.gid.as_raw()))
    })
}

/// Detaches whatever is mounted at `dir` (a mount left by a pComponent that was killed).
pub fn unmount(dir: &Path) {
    if let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) {
        // SAFETY: `c` is a NUL-terminated path that outlives the call, which only reads it. The
        // result is not needed: EINVAL (nothing mounted there) is the usual case. A link in the
        // mount point's place is not followed: it never names one of our mounts.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    }
}

/// Every mount point under `dir`, deepest first (from /proc/self/mountinfo).
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir) && p != dir)
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    v
}

/// The user who owns the TCP listener at `addr` on this host (in this network namespace), or
/// None when nothing listens there: a client about to send a secret to a local port asks who
/// listens on it, since any user may bind a port its server left. The kernel's exact lookup
/// of a socket from `addr` to nowhere finds no connection and falls back to the listener that
/// would accept one at `addr`.
pub fn tcp_listener_uid(addr: std::net::SocketAddr) -> Option<u32> {
    tcp_listener(addr).map(|(uid, _)| uid)
}

/// The owner and inode of the TCP listener at `addr`: the kernel's exact lookup of a socket
/// from `addr` to nowhere finds no connection and falls back to the listener.
fn tcp_listener(addr: std::net::SocketAddr) -> Option<(u32, u32)> {
    let nowhere = match addr.ip().to_canonical() {
        std::net::IpAddr::V4(_) => std::net::SocketAddr::from(([0u8; 4], 0)),
        std::net::IpAddr::V6(_) => std::net::SocketAddr::from(([0u16; 8], 0)),
    };
    tcp_socket(addr, nowhere)
}

/// The user whose socket is the other end of the TCP connection from `peer` to `local`, when
/// that socket is on this host (in this network namespace): every user of the host shares its
/// addresses, loopback's and its own, so only the socket's owner tells them apart. None for a
/// peer on another host, or one already gone. One exact lookup by the kernel (sock_diag), not
/// a walk of every socket.
pub fn tcp_peer_uid(peer: std::net::SocketAddr, local: std::net::SocketAddr) -> Option<u32> {
    tcp_socket(peer, local).map(|(uid, _)| uid)
}

/// The process that holds the TCP listener at `addr` on this host (in this network namespace)
/// and can be seen here, or None. Its socket's inode found by the kernel, then looked for among
/// the processes' descriptors (one walk of /proc).
pub fn tcp_listener_pid(addr: std::net::SocketAddr) -> Option<u32> {
    let (_, inode) = tcp_listener(addr)?;
    let socket = format!("socket:[{inode}]");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|p| {
        let pid: u32 = p.file_name().to_str()?.parse().ok()?;
        std::fs::read_dir(p.path().join("fd"))
            .ok()?
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == socket.as_str()))
            .then_some(pid)
    })
}

/// The owner and inode of the TCP socket that is the other end of a connection from `peer`
/// to `local` (the listener, for a `local` of nowhere).
fn tcp_socket(peer: std::net::SocketAddr, local: std::net::SocketAddr) -> Option<(u32, u32)> {
    use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
    use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP};
    use netlink_packet_sock_diag::inet::{ExtensionFlags, InetRequest, SocketId, StateFlags};
    use netlink_packet_sock_diag::SockDiagMessage;
    // A peer of an IPv6 listener that connected over IPv4 (::ffff:a.b.c.d) has an IPv4 socket.
    let (peer_ip, local_ip) = (peer.ip().to_canonical(), local.ip().to_canonical());
    let family = match (peer_ip, local_ip) {
        (std::net::IpAddr::V4(_), std::net::IpAddr::V4(_)) => AF_INET,
        (std::net::IpAddr::V6(_), std::net::IpAddr::V6(_)) => AF_INET6,
        _ => return None,
    };
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    let socket_id = SocketId {
        source_port: peer.port(),
        destination_port: local.port(),
        source_address: peer_ip,
        destination_address: local_ip,
        interface_id: 0,
        cookie: [0xff; 8],
    };
    let request = InetRequest {
        family,
        protocol: IPPROTO_TCP,
        extensions: ExtensionFlags::empty(),
        states: StateFlags::all(),
        socket_id,
    };
    let mut msg = NetlinkMessage::new(header, SockDiagMessage::InetRequest(request).into());
    msg.finalize();
    let mut out = vec![0u8; msg.buffer_len()];
    msg.serialize(&mut out);
    let s = socket2::Socket::new(
        socket2::Domain::from(libc::AF_NETLINK),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::from(libc::NETLINK_SOCK_DIAG)),
    )
    .ok()?;
    // The kernel answers while the request is sent: nothing to wait for after.
    s.set_nonblocking(true).ok()?;
    s.send(&out).ok()?;
    let mut answer = [0u8; 1024];
    let n = std::io::Read::read(&mut &s, &mut answer).ok()?;
    match NetlinkMessage::<SockDiagMessage>::deserialize(&answer[..n])
        .ok()?
        .payload
    {
        NetlinkPayload::InnerMessage(SockDiagMessage::InetResponse(r)) => Some((r.header.uid, r.header.inode)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_listeners_owner_is_found_and_a_closed_port_has_none() {
        // SAFETY: geteuid takes nothing and cannot fail.
        let euid = unsafe { libc::geteuid() };
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        assert_eq!(super::tcp_listener_uid(at), Some(euid));
        let any = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        let port = any.local_addr().unwrap().port();
        assert_eq!(
            super::tcp_listener_uid(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
            Some(euid),
            "a listener on every address listens on loopback too"
        );
        assert_eq!(super::tcp_listener_pid(at), Some(std::process::id()));
        drop(l);
        assert_eq!(super::tcp_listener_uid(at), None);
        assert_eq!(super::tcp_listener_pid(at), None);
    }
}
