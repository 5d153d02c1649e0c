//! Calls on connections owned by the calling thread (the data path): no reader thread, no
//! hand-off between threads.
use super::*;

/// A thread's own connections, by peer address and link (the n-th of the calls to one peer
/// that [`Transport::call_all_direct`] has under way at once), each with its last request id.
pub(super) type DirectConns = HashMap<(String, usize), (TcpConn, u64)>;

thread_local! {
    static DIRECT: std::cell::RefCell<DirectConns> = std::cell::RefCell::new(HashMap::new());
}

/// Sends `msg` on the calling thread's connection `link` to `addr`, made on first use; the
/// request id to wait for.
pub(super) fn send_direct(
    t: &TcpTransport,
    d: &mut DirectConns,
    key: &(String, usize),
    msg: &Msg,
    timeout: Duration,
) -> Result<u64, RpcError> {
    let addr = &key.0;
    if !d.contains_key(key) {
        let c = t
            .connect_stream(addr, timeout.min(Duration::from_secs(3)))
            .map_err(|e| RpcError::Unreachable {
                addr: addr.to_string(),
                why: e.to_string(),
            })?;
        let _ = c.s.set_read_timeout(Some(timeout));
        // A peer that stopped reading (a path lost on the way, its packets dropped) fills the
        // socket's send buffer: without a bound, a large request's write would wait for
        // TCP to give up, a quarter of an hour, with the program's fault behind it.
        let _ = c.s.set_write_timeout(Some(timeout));
        d.insert(key.clone(), (c, 1));
    }
    let (conn, next) = d.get_mut(key).expect("inserted above");
    if let Some(p) = conn.peer.filter(|p| !may_receive(p.role, msg)) {
        return Err(wrong_receiver(addr, p.role, msg));
    }
    *next += 1;
    let id = *next;
    write_frame(conn, FrameKind::Request, id, msg).map_err(|e| RpcError::Unreachable {
        addr: addr.to_string(),
        why: e.to_string(),
    })?;
    Ok(id)
}

/// Reads the reply to request `id` off the calling thread's connection `key`.
pub(super) fn receive_direct(
    d: &mut DirectConns,
    key: &(String, usize),
    id: u64,
    msg: &Msg,
    timeout: Duration,
) -> Result<Msg, RpcError> {
    let addr = &key.0;
    let (conn, _) = d
        .get_mut(key)
        .ok_or_else(|| RpcError::Closed { addr: addr.to_string() })?;
    loop {
        match read_frame(conn) {
            Ok(Some(f)) if f.kind == FrameKind::Reply && f.req_id == id => return Ok(f.msg),
            // A reply to an earlier call that timed out: skip it. A thread's own connection has
            // one request in flight at a time, within any grant.
            Ok(Some(f)) if (f.kind == FrameKind::Reply && f.req_id < id) || f.kind == FrameKind::Credit => continue,
            Ok(_) => return Err(RpcError::Closed { addr: addr.to_string() }),
            Err(FrameError::Io(e)) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(RpcError::Timeout {
                    addr: addr.to_string(),
                    msg: msg.name(),
                    after: timeout,
                })
            }
            Err(_) => return Err(RpcError::Closed { addr: addr.to_string() }),
        }
    }
}

/// A call on a connection owned by the calling thread: no reader thread, no hand-off between
/// threads. The connection is made on the thread's first call to `addr` and dropped after any
/// error.
pub(super) fn call_direct(t: &TcpTransport, addr: &str, msg: &Msg, timeout: Duration) -> Result<Msg, RpcError> {
    call_all_direct(t, &[(addr, msg)], timeout)
        .pop()
        .expect("one reply per call")
}

/// Every request sent before any reply is read: each on a connection of its own, so calls to
/// one peer (the stripes of a bonded fetch) are served at once by its receiving threads.
pub(super) fn call_all_direct(
    t: &TcpTransport,
    calls: &[(&str, &Msg)],
    timeout: Duration,
) -> Vec<Result<Msg, RpcError>> {
    DIRECT.with(|d| {
        let mut d = d.borrow_mut();
        // The n-th call to a peer goes on the thread's n-th link to it (a handful of calls:
        // counting the earlier ones costs less than a map on the data path).
        let keys: Vec<(String, usize)> = calls
            .iter()
            .enumerate()
            .map(|(i, (addr, _))| (addr.to_string(), calls[..i].iter().filter(|(a, _)| a == addr).count()))
            .collect();
        let sent: Vec<Result<u64, RpcError>> = calls
            .iter()
            .zip(&keys)
            .map(|((_, msg), key)| send_direct(t, &mut d, key, msg, timeout))
            .collect();
        calls
            .iter()
            .zip(&keys)
            .zip(sent)
            .map(|(((_, msg), key), id)| {
                let r = id.and_then(|id| receive_direct(&mut d, key, id, msg, timeout));
                if r.is_err() {
                    d.remove(key);
                }
                r
            })
            .collect()
    })
}
