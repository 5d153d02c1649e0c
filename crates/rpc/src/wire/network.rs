//! Messages of the socket stub: with the global network manager, with the proxies of
//! nComponents, with other pComponents (the shortcut), and with the mComponents holding
//! socket buffers (the DMA path).
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::net::{IpAddr, SocketAddr};

use super::ComponentRef;

/// One datagram of a datagram socket: to `addr` (none: the socket's connected peer) when it
/// is sent, from `addr` when it was received.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Datagram {
    pub addr: Option<SocketAddr>,
    pub data: ByteBuf,
}

message_types! {
    // ---- the socket stub (pComponent) <-> the global network manager (GNM)
    /// Which nComponent a socket of `vnode` lives on: the one whose interfaces hold `ip`
    /// (a bind to that address), else the vNode's own (`ip` none, unspecified or loopback).
    P2G_PICK_NET { pub vnode: String, pub ip: Option<IpAddr> };
    G2P_NET { pub ncomp: ComponentRef };

    // ---- the socket stub (pComponent) -> the proxy of an nComponent (docs/network.md).
    // A skeleton belongs to the pComponent that made it (its credentials' key): a request
    // about another's socket is refused. Socket errors come back as `ERR Errno(n)`.
    /// A socket skeleton for a program of `vnode`, run by user `uid` (who may bind ports
    /// below 1024 only if 0). `kind`: SOCK_STREAM or SOCK_DGRAM.
    P2N_SOCKET { pub vnode: String, pub uid: u32, pub family: i32, pub kind: i32, pub protocol: i32 };
    N2P_SOCKET { pub sock: u64 };
    P2N_SETSOCKOPT { pub sock: u64, pub level: i32, pub name: i32, pub value: ByteBuf };
    P2N_GETSOCKOPT { pub sock: u64, pub level: i32, pub name: i32, pub len: u32 };
    N2P_OPT { pub value: ByteBuf };
    P2N_BIND { pub sock: u64, pub addr: SocketAddr };
    /// `direct`: the pComponent's address, where programs of the vNode on other pComponents
    /// may connect to this listener without the nComponent (its shortcut is on).
    P2N_LISTEN { pub sock: u64, pub backlog: i32, pub direct: Option<String> };
    /// Which pComponent holds a listener of `vnode` that a connect to `addr` (one of this
    /// nComponent's addresses, or loopback) would reach, if it takes direct connections.
    P2N_FIND_LISTENER { pub vnode: String, pub addr: SocketAddr };
    N2P_LISTENER { pub pcomp: Option<String> };
    /// Answered with the next connection, or `ERR Errno(EAGAIN)` when none came in `wait_ms`.
    P2N_ACCEPT { pub sock: u64, pub wait_ms: u32 };
    N2P_ACCEPTED { pub sock: u64, pub peer: SocketAddr };
    /// Answered once the connection is made (the local address) or failed.
    P2N_CONNECT { pub sock: u64, pub addr: SocketAddr };
    P2N_NAME { pub sock: u64, pub peer: bool };
    N2P_ADDR { pub addr: SocketAddr };
    /// Bytes to send, carried in the request (the DDIO path). Answered once the skeleton's
    /// send queue took them; it takes none while it holds more than its bound.
    P2N_SEND { pub sock: u64, pub data: ByteBuf };
    /// Up to `max` received bytes, answered as soon as there are some, at the end of the
    /// stream (`eof`), or empty after `wait_ms`.
    P2N_RECV { pub sock: u64, pub max: u32, pub wait_ms: u32 };
    N2P_DATA { pub data: ByteBuf, pub eof: bool };
    /// shutdown(2) with `how` (SHUT_RD, SHUT_WR, SHUT_RDWR), after the queued bytes left.
    P2N_SHUTDOWN { pub sock: u64, pub how: i32 };
    P2N_CLOSE { pub sock: u64 };
    /// The DMA path: bytes to send that the stub put in socket buffer `buf` on mComponent
    /// `mcomp`, from `offset`; the nComponent fetches them from there (`N2M_NETBUF_READ`).
    P2N_SEND_DMA { pub sock: u64, pub mcomp: String, pub buf: u64, pub offset: u32, pub len: u32 };
    /// The DMA path: as `P2N_RECV`, the bytes written to socket buffer `buf` on `mcomp` at
    /// `offset` (`N2M_NETBUF_WRITE`) and only their count answered.
    P2N_RECV_DMA { pub sock: u64, pub max: u32, pub wait_ms: u32, pub mcomp: String, pub buf: u64, pub offset: u32 };
    N2P_RECEIVED { pub len: u32, pub eof: bool };
    /// A datagram socket's datagrams, sent in order; one that cannot go (no route, too big,
    /// a loopback port of another vNode) is dropped and counted, as a lost datagram.
    P2N_SENDTO { pub sock: u64, pub grams: Vec<Datagram> };
    /// A datagram socket's received datagrams, whole, at least one and then as many as fit in
    /// `max` bytes, answered as soon as there is one, or empty after `wait_ms`.
    P2N_RECVFROM { pub sock: u64, pub max: u32, pub wait_ms: u32 };
    N2P_GRAMS { pub grams: Vec<Datagram> };
    /// connect(2) of a datagram socket to AF_UNSPEC: it forgets its peer.
    P2N_DISCONNECT { pub sock: u64 };

    // ---- the shortcut between two pComponents (docs/network.md): a connection between two
    // programs of a vNode whose listener is on another pComponent. Each end has an id at its
    // pComponent, random, which is the capability to send to it.
    /// A connection from the program socket `conn` at pComponent `from` (component id
    /// `from_id`) to the listener of `vnode` that `addr` reaches here; `peer`: the connecting
    /// end's address, as it names itself. Answered with the accepted end's id and this
    /// pComponent's component id (each side ends the connection when the global managers say
    /// the other is lost).
    P2P_CONNECT { pub vnode: String, pub addr: SocketAddr, pub peer: SocketAddr, pub conn: u64, pub from: String, pub from_id: u32 };
    P2P_CONNECTED { pub conn: u64, pub id: u32 };
    /// Bytes for end `conn`: answered with how many it took now (a program that does not
    /// read takes fewer; the sender offers the rest again).
    P2P_SEND { pub conn: u64, pub data: ByteBuf };
    P2P_TAKEN { pub n: u32 };
    /// The other end shut down writing (`close`: it is gone).
    P2P_SHUTDOWN { pub conn: u64, pub close: bool };

    // ---- socket buffers on an mComponent (the DMA path). `buf` is the capability: random,
    // known only to the pComponent that allocated it and the nComponents it names it to.
    P2M_NETBUF_ALLOC { pub vnode: String, pub bytes: u32 };
    M2P_NETBUF { pub buf: u64 };
    P2M_NETBUF_FREE { pub buf: u64 };
    P2M_NETBUF_WRITE { pub buf: u64, pub offset: u32, pub data: ByteBuf };
    P2M_NETBUF_READ { pub buf: u64, pub offset: u32, pub len: u32 };
    M2P_NETBUF_DATA { pub data: ByteBuf };
    /// `owner`: the key of the pComponent whose socket asked (from its connection's
    /// handshake at the nComponent): the buffer must be that pComponent's.
    N2M_NETBUF_READ { pub owner: [u8; 32], pub buf: u64, pub offset: u32, pub len: u32 };
    M2N_NETBUF_DATA { pub data: ByteBuf };
    N2M_NETBUF_WRITE { pub owner: [u8; 32], pub buf: u64, pub offset: u32, pub data: ByteBuf };
}
