//! Socket addresses as programs pass them (struct sockaddr bytes) and as the wire carries
//! them (`SocketAddr`).
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use splitos_shim_abi::NET_DATA;

/// A sockaddr_in or sockaddr_in6; anything else is EAFNOSUPPORT, a short one EINVAL.
pub fn parse(b: &[u8]) -> Result<SocketAddr, i32> {
    if b.len() < 2 {
        return Err(libc::EINVAL);
    }
    let family = u16::from_ne_bytes([b[0], b[1]]) as i32;
    let port = |b: &[u8]| u16::from_be_bytes([b[2], b[3]]);
    match family {
        libc::AF_INET if b.len() >= 16 => Ok(SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::new(b[4], b[5], b[6], b[7]),
            port(b),
        ))),
        libc::AF_INET6 if b.len() >= 28 => {
            let ip: [u8; 16] = b[8..24].try_into().expect("16 bytes");
            let flow = u32::from_ne_bytes(b[4..8].try_into().expect("4 bytes"));
            let scope = u32::from_ne_bytes(b[24..28].try_into().expect("4 bytes"));
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port(b),
                flow,
                scope,
            )))
        }
        libc::AF_INET | libc::AF_INET6 => Err(libc::EINVAL),
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// The sockaddr bytes of `a`, and how many there are.
pub fn encode(a: SocketAddr) -> ([u8; NET_DATA], usize) {
    let mut b = [0u8; NET_DATA];
    match a {
        SocketAddr::V4(v4) => {
            b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&v4.port().to_be_bytes());
            b[4..8].copy_from_slice(&v4.ip().octets());
            (b, 16)
        }
        SocketAddr::V6(v6) => {
            b[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&v6.port().to_be_bytes());
            b[4..8].copy_from_slice(&v6.flowinfo().to_ne_bytes());
            b[8..24].copy_from_slice(&v6.ip().octets());
            b[24..28].copy_from_slice(&v6.scope_id().to_ne_bytes());
            (b, 28)
        }
    }
}

/// Which socket a descriptor is: its device and inode. The device tells a socket from a
/// socket file on a disk (whose inode number may be the same); a descriptor opened with
/// O_PATH refers to no socket at all.
pub type SockId = (u64, u64);

/// The [`SockId`] of a socket descriptor a program handed over.
pub fn inode(fd: i32) -> std::io::Result<SockId> {
    // SAFETY: fcntl(F_GETFL) takes no pointers.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || flags & libc::O_PATH != 0 {
        return Err(std::io::Error::from_raw_os_error(libc::ENOTSOCK));
    }
    // SAFETY: fstat writes a stat into the live, zeroed value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `fd` is a descriptor the caller holds.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(std::io::Error::from_raw_os_error(libc::ENOTSOCK));
    }
    Ok((st.st_dev, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_bad_ones_are_refused() {
        for a in ["10.1.2.3:8080", "[fe80::1%3]:443", "0.0.0.0:0", "[::]:9"] {
            let a: SocketAddr = a.parse().unwrap();
            let (b, n) = encode(a);
            assert_eq!(parse(&b[..n]), Ok(a));
        }
        let (b, _) = encode("1.2.3.4:5".parse().unwrap());
        assert_eq!(parse(&b[..15]), Err(libc::EINVAL));
        assert_eq!(parse(&[1, 0, 0, 0]), Err(libc::EAFNOSUPPORT));
        assert_eq!(parse(&[]), Err(libc::EINVAL));
    }
}
