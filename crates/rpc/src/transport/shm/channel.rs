//! A caller's channel to a server: opened by a handshake on the server's socket, then one call
//! at a time through the shared memory.
use super::*;

/// Which of the free channels a caller takes: one whose server runs where the caller wants it
/// (`want`: a followed caller's CPU), else one whose server runs anywhere; a caller that is not
/// followed then takes the one used last. `None`: open a new channel, so that a followed
/// caller never pulls a server away from another CPU's callers.
pub(super) fn pick(free: &[Channel], want: Option<u32>) -> Option<usize> {
    let last = free.len().checked_sub(1).filter(|_| want.is_none());
    free.iter()
        .rposition(|c| c.server_at == want)
        .or_else(|| free.iter().rposition(|c| c.server_at.is_none()))
        .or(last)
}

/// The calling side of one channel.
pub(super) struct Channel {
    pub(super) addr: String,
    /// The server its handshake proved (`None` without credentials).
    pub(super) peer: Option<server::Peer>,
    pub(super) sock: UnixStream,
    pub(super) map: Mapping,
    pub(super) seq: u64,
    pub(super) poller: Poller,
    /// The CPU the last call asked the server to run on.
    pub(super) server_at: Option<u32>,
    /// When it was last given back to the free channels.
    pub(super) idle_since: Instant,
    /// The credit it holds at its peer.
    pub(super) credit: Option<Credit>,
}

impl Channel {
    pub(super) fn open(
        path: &Path,
        addr: &str,
        timeout: Duration,
        poller: Poller,
        creds: Option<&Credentials>,
    ) -> io::Result<Channel> {
        let mut sock = UnixStream::connect(path)?;
        // A server that is paused or overloaded takes the connection (the kernel queues it)
        // and answers its handshake late: it is waited for as long as a call on an open
        // channel waits for its reply.
        sock.set_read_timeout(Some(timeout))?;
        let peer = match creds {
            Some(creds) => Some(
                auth::initiate(&mut sock, creds, false)
                    .map_err(|e| match e {
                        AuthError::Io(e) => e,
                        AuthError::Refused(why) => {
                            io::Error::new(io::ErrorKind::PermissionDenied, format!("{addr}: {why}"))
                        }
                    })?
                    .peer,
            ),
            None => None,
        };
        let mut hello = [0u8; 1];
        let fds = recv_fds(&sock, &mut hello)?;
        if &hello == NO_CREDIT {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("{addr}: no credit left for another channel"),
            ));
        }
        let fd = fds
            .into_iter()
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no channel passed"))?;
        sock.set_read_timeout(None)?;
        sock.set_nonblocking(true)?;
        // SAFETY: F_GET_SEALS on a descriptor we own takes no pointers.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "channel memory is not sealed against shrinking",
            ));
        }
        let size = std::fs::File::from(fd.try_clone()?).metadata()?.len();
        if size != CHANNEL as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("channel of {size} bytes, expected {CHANNEL}"),
            ));
        }
        let map = Mapping::new(&fd)?;
        let h = map.header();
        if h.magic.load(Acquire) != MAGIC || h.version.load(Acquire) != WIRE_VERSION as u32 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "peer speaks wire version {}, this build {WIRE_VERSION}",
                    h.version.load(Acquire)
                ),
            ));
        }
        Ok(Channel {
            addr: addr.to_string(),
            peer,
            sock,
            map,
            seq: 0,
            poller,
            server_at: None,
            idle_since: Instant::now(),
            credit: None,
        })
    }

    /// Whether the server's end of the socket is still open (stale doorbells are drained).
    pub(super) fn server_alive(&self) -> bool {
        let mut buf = [0u8; 64];
        loop {
            match (&self.sock).read(&mut buf) {
                Ok(0) => return false,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
    }

    pub(super) fn call(mut self, msg: &Msg, timeout: Duration) -> Result<(Channel, Msg), RpcError> {
        let follow = cpu::followed_at();
        self.send(msg, follow)?;
        self.finish(msg.name(), follow, timeout)
    }

    /// Puts a request into the channel and rings the server.
    pub(super) fn send(&mut self, msg: &Msg, follow: Option<u32>) -> Result<(), RpcError> {
        let body = postcard::to_allocvec(msg).expect("encoding into a Vec cannot fail");
        if body.len() > AREA {
            return Err(RpcError::Unreachable {
                addr: self.addr.clone(),
                why: format!("message body of {} bytes exceeds the frame bound", body.len()),
            });
        }
        let h = self.map.header();
        self.map.put(REQ, &body);
        h.req_len.store(body.len() as u32, Relaxed);
        h.follow_cpu.store(follow.map_or(0, |c| c + 1), Relaxed);
        h.unhurried.store(crate::poll::unhurried() as u32, Relaxed);
        self.server_at = follow;
        self.seq += 1;
        ring(&h.req_seq, self.seq, &h.server_sleeps, &self.sock);
        Ok(())
    }

    /// Waits for the reply to the request [`Channel::send`] put in.
    pub(super) fn finish(
        self,
        name: &'static str,
        follow: Option<u32>,
        timeout: Duration,
    ) -> Result<(Channel, Msg), RpcError> {
        let h = self.map.header();
        let deadline = Some(Instant::now() + timeout);
        // A followed caller leaves its CPU to the server at once.
        let got = if follow.is_some() {
            sleep_until_moved(&h.rep_seq, self.seq - 1, &h.client_sleeps, &self.sock, deadline)
        } else {
            wait(
                &h.rep_seq,
                self.seq - 1,
                &h.client_sleeps,
                &self.sock,
                &self.poller,
                deadline,
            )
        };
        let addr = &self.addr;
        match got {
            Ok(n) if n == self.seq => {}
            Ok(_) => return Err(RpcError::Closed { addr: addr.clone() }),
            Err(Gone::Closed) => return Err(RpcError::Closed { addr: addr.clone() }),
            Err(Gone::Timeout) => {
                return Err(RpcError::Timeout {
                    addr: addr.clone(),
                    msg: name,
                    after: timeout,
                })
            }
        }
        let bytes = self
            .map
            .take(REP, h.rep_len.load(Relaxed))
            .ok_or_else(|| RpcError::Closed { addr: addr.clone() })?;
        let reply = postcard::from_bytes::<Msg>(&bytes).map_err(|_| RpcError::Closed { addr: addr.clone() })?;
        Ok((self, reply))
    }
}
