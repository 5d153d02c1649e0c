//! The data path of a socket (DDIO: bytes go straight between this pComponent and the
//! nComponent, in the requests): a watcher thread per socket takes what the program writes
//! into its end and sends it to the skeleton, and sees the program close it; a receiver
//! thread asks the skeleton for bytes and writes them into the program's end; a listening
//! socket's acceptor takes the skeleton's connections and hands each to the program with a
//! token byte that makes the listening descriptor readable.
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use super::{NetPath, NetStub, Phase, Sock};

/// Most bytes one send to the skeleton carries, and one receive asks for (and the size of a
/// socket buffer on the DMA path).
pub(super) const CHUNK: usize = 256 << 10;
/// How long a receive or an accept waits at the skeleton before it is asked again.
const WAIT_MS: u32 = 2000;

/// An eventfd that wakes a socket's watcher.
pub fn waker() -> std::io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; its result is checked before it is owned.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub fn wake(fd: &OwnedFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

fn write_all(fd: &OwnedFd, mut b: &[u8]) -> std::io::Result<()> {
    while !b.is_empty() {
        // SAFETY: sends from a live slice; MSG_NOSIGNAL: a program gone is EPIPE, not a signal.
        let n = unsafe { libc::send(fd.as_raw_fd(), b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        b = &b[n as usize..];
    }
    Ok(())
}

/// The stream ends for a shortcut connection's program: its other end shut down writing or
/// went away.
pub(super) fn end_stream(s: &Sock) {
    shutdown(&s.mine, libc::SHUT_WR);
}

/// Whether a Unix socket (the program's end of a pair, by its inode) still exists: held by a
/// descriptor somewhere. The kernel's socket diagnostics (sock_diag) find it by its inode.
fn end_alive(ino: u64) -> bool {
    #[repr(C)]
    struct Req {
        h: libc::nlmsghdr,
        family: u8,
        protocol: u8,
        pad: u16,
        states: u32,
        ino: u32,
        show: u32,
        cookie: [u32; 2],
    }
    /// SOCK_DIAG_BY_FAMILY (linux/sock_diag.h).
    const BY_FAMILY: u16 = 20;
    let req = Req {
        h: libc::nlmsghdr {
            nlmsg_len: std::mem::size_of::<Req>() as u32,
            nlmsg_type: BY_FAMILY,
            nlmsg_flags: libc::NLM_F_REQUEST as u16,
            nlmsg_seq: 1,
            nlmsg_pid: 0,
        },
        family: libc::AF_UNIX as u8,
        protocol: 0,
        pad: 0,
        states: u32::MAX,
        ino: ino as u32,
        show: 0,
        // INET_DIAG_NOCOOKIE: found by the inode alone.
        cookie: [u32::MAX; 2],
    };
    // SAFETY: a netlink socket, closed below; send and recv on live buffers of the sizes given.
    unsafe {
        let fd = libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        );
        if fd < 0 {
            return false;
        }
        let mut buf = [0u8; 512];
        let sent = libc::send(fd, (&req as *const Req).cast(), std::mem::size_of::<Req>(), 0)
            == std::mem::size_of::<Req>() as isize;
        let n = if sent {
            libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0)
        } else {
            -1
        };
        libc::close(fd);
        // The answer is the socket's description, or an error (ENOENT) once it is gone.
        n >= 16 && u16::from_ne_bytes([buf[4], buf[5]]) == BY_FAMILY
    }
}

/// One token byte in a listening socket: a connection waits for the program's accept.
pub(super) fn token(listener: &Sock) {
    if write_all(&listener.mine, &[1]).is_err() {
        tracing::debug!("a listening socket went away with a connection queued");
    }
}

fn shutdown(fd: &OwnedFd, how: i32) {
    // SAFETY: shutdown(2) on a descriptor the socket owns.
    unsafe { libc::shutdown(fd.as_raw_fd(), how) };
}

/// The program's end of a socket held unwritable while its non-blocking connect runs: its
/// send buffer shrunk to the least and filled with bytes the bridge discards on release.
pub struct Hold {
    theirs: OwnedFd,
    sndbuf: i32,
    filler: usize,
}

impl Hold {
    pub fn new(theirs: OwnedFd) -> Hold {
        let fd = theirs.as_raw_fd();
        let mut sndbuf: i32 = 0;
        let mut len = 4 as libc::socklen_t;
        // SAFETY: get/setsockopt on a descriptor we hold, with live i32s of the size given.
        unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&mut sndbuf as *mut i32).cast(),
                &mut len,
            );
            let least = 1i32;
            libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, (&least as *const i32).cast(), 4);
        }
        let mut filler = 0;
        // Bounded: a send buffer of the least size takes a few bytes only.
        while filler < 1 << 16 {
            // SAFETY: sends one byte from a live array without blocking.
            let n = unsafe { libc::send(fd, [0u8].as_ptr().cast(), 1, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            if n != 1 {
                break;
            }
            filler += 1;
        }
        Hold { theirs, sndbuf, filler }
    }

    /// Gives the program's end its send buffer back and drops the filler from `mine`.
    pub fn release(self, mine: &OwnedFd) {
        // The kernel doubles what it is given; this gives back what was read.
        let half = self.sndbuf / 2;
        // SAFETY: setsockopt with a live i32 on a descriptor we hold.
        unsafe {
            libc::setsockopt(
                self.theirs.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&half as *const i32).cast(),
                4,
            )
        };
        let mut left = self.filler;
        let mut buf = [0u8; 256];
        while left > 0 {
            // SAFETY: reads into a live buffer of at least the length given.
            let n = unsafe { libc::recv(mine.as_raw_fd(), buf.as_mut_ptr().cast(), left.min(buf.len()), 0) };
            if n <= 0 {
                break;
            }
            left -= n as usize;
        }
    }
}

impl NetStub {
    /// The watcher of socket `ino`: forwards what the program writes once the socket is
    /// connected, and closes the socket when the program closed every descriptor of it.
    pub(super) fn up(self: &Arc<Self>, ino: super::addr::SockId, s: &Arc<Sock>) {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let (phase, shut_wr) = {
                let st = s.st.lock().unwrap();
                (st.phase, st.shut_wr)
            };
            let reading = phase == Phase::Connected && !shut_wr;
            let mut fds = [
                libc::pollfd {
                    fd: s.mine.as_raw_fd(),
                    events: if reading { libc::POLLIN } else { 0 },
                    revents: 0,
                },
                libc::pollfd {
                    fd: s.wake.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: polls two live pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 {
                continue;
            }
            if fds[1].revents & libc::POLLIN != 0 {
                let mut v = 0u64;
                // SAFETY: reads the eventfd's 8-byte counter into a live u64.
                unsafe { libc::read(s.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            }
            let hup = fds[0].revents & (libc::POLLHUP | libc::POLLERR) != 0;
            if reading && fds[0].revents & (libc::POLLIN | libc::POLLHUP) != 0 {
                // What the program wrote by now goes in one send, up to a chunk.
                let mut got = 0usize;
                let mut end = false;
                while got < buf.len() {
                    // SAFETY: reads into the unfilled tail of the live buffer.
                    let n = unsafe {
                        libc::recv(
                            s.mine.as_raw_fd(),
                            buf[got..].as_mut_ptr().cast(),
                            buf.len() - got,
                            libc::MSG_DONTWAIT,
                        )
                    };
                    if n <= 0 {
                        end = n == 0;
                        break;
                    }
                    got += n as usize;
                }
                if got > 0 {
                    if !self.send_up(s, &buf[..got]) {
                        // The connection broke: the program's writes fail from now on.
                        shutdown(&s.mine, libc::SHUT_RD);
                        s.st.lock().unwrap().shut_wr = true;
                    }
                    continue;
                }
                if end {
                    // The program shut down writing, or closed: the skeleton sends its FIN.
                    s.st.lock().unwrap().shut_wr = true;
                    let remote = s.st.lock().unwrap().remote.clone();
                    if let Some(peer) = s.local_peer() {
                        end_stream(&peer);
                    } else if let Some(r) = remote {
                        self.end_remote(&r, false);
                    } else if let Some((at, id)) = s.skel() {
                        let _ = self.call(
                            &at,
                            P2N_SHUTDOWN {
                                sock: id,
                                how: libc::SHUT_WR,
                            },
                        );
                    }
                }
                continue;
            }
            if hup && !reading {
                // Both directions shut down looks as closed to poll; the program may still hold
                // the socket (and ask its names): look again in a second.
                if end_alive(ino.1) {
                    let mut w = libc::pollfd {
                        fd: s.wake.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: polls one live pollfd.
                    unsafe { libc::poll(&mut w, 1, 1000) };
                    continue;
                }
                self.close(ino, s);
                return;
            }
            if s.closed.load(Relaxed) {
                return;
            }
        }
    }

    fn send_up(&self, s: &Sock, data: &[u8]) -> bool {
        if let Some(peer) = s.local_peer() {
            self.c.shortcut_bytes.fetch_add(data.len() as u64, Relaxed);
            return write_all(&peer.mine, data).is_ok();
        }
        let remote = s.st.lock().unwrap().remote.clone();
        if let Some(r) = remote {
            return self.send_remote(s, &r, data);
        }
        let Some((at, id)) = s.skel() else { return false };
        let sent = match self.path {
            NetPath::Ddio => self.until_taken(s, || {
                self.call(
                    &at,
                    P2N_SEND {
                        sock: id,
                        data: ByteBuf::from(data.to_vec()),
                    },
                )
            }),
            // The bytes go to memory first (the ExCache's flush, step 2 of the paper's
            // figure 5), and the nComponent takes them from there.
            NetPath::Dma => self.dma_bufs(s).and_then(|b| {
                self.call(
                    &b.mcomp,
                    P2M_NETBUF_WRITE {
                        buf: b.tx,
                        offset: 0,
                        data: ByteBuf::from(data.to_vec()),
                    },
                )?;
                self.until_taken(s, || {
                    self.call(
                        &at,
                        P2N_SEND_DMA {
                            sock: id,
                            mcomp: b.mcomp.clone(),
                            buf: b.tx,
                            offset: 0,
                            len: data.len() as u32,
                        },
                    )
                })
            }),
        };
        match sent {
            Ok(()) => {
                self.c.sent_bytes.fetch_add(data.len() as u64, Relaxed);
                true
            }
            Err(e) => {
                tracing::debug!(errno = e, "a socket's send failed");
                false
            }
        }
    }

    /// The receiver of a connected socket: the skeleton's bytes into the program's end, the
    /// end of the stream as a shutdown of it.
    pub(super) fn down(self: &Arc<Self>, s: &Arc<Sock>) {
        let Some((at, id)) = s.skel() else { return };
        loop {
            if s.closed.load(Relaxed) {
                return;
            }
            match self.receive(s, &at, id) {
                Ok(r) if r.eof => {
                    shutdown(&s.mine, libc::SHUT_WR);
                    return;
                }
                Ok(r) if r.data.is_empty() => {}
                Ok(r) => {
                    self.c.received_bytes.fetch_add(r.data.len() as u64, Relaxed);
                    if write_all(&s.mine, &r.data).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    if !s.closed.load(Relaxed) {
                        tracing::debug!(errno = e, "a socket's receive failed; the program sees the stream end");
                        s.st.lock().unwrap().error = e;
                        shutdown(&s.mine, libc::SHUT_WR);
                    }
                    return;
                }
            }
        }
    }

    /// Offers a send until the skeleton takes it: it answers `EAGAIN` when its queue stayed
    /// full for a while (a peer that does not read), and the stub's writes wait meanwhile.
    fn until_taken(&self, s: &Sock, mut send: impl FnMut() -> Result<OK, i32>) -> Result<(), i32> {
        loop {
            match send() {
                Err(libc::EAGAIN) if !s.closed.load(Relaxed) => continue,
                r => return r.map(|_| ()),
            }
        }
    }

    /// One receive, on the socket's path: the bytes in the answer, or read from the socket
    /// buffer the nComponent wrote them to.
    fn receive(&self, s: &Sock, at: &str, id: u64) -> Result<N2P_DATA, i32> {
        match self.path {
            NetPath::Ddio => self.wait_call(
                at,
                P2N_RECV {
                    sock: id,
                    max: CHUNK as u32,
                    wait_ms: WAIT_MS,
                },
            ),
            NetPath::Dma => {
                let b = self.dma_bufs(s)?;
                let r = self.wait_call(
                    at,
                    P2N_RECV_DMA {
                        sock: id,
                        max: CHUNK as u32,
                        wait_ms: WAIT_MS,
                        mcomp: b.mcomp.clone(),
                        buf: b.rx,
                        offset: 0,
                    },
                )?;
                let data = if r.len > 0 {
                    self.call(
                        &b.mcomp,
                        P2M_NETBUF_READ {
                            buf: b.rx,
                            offset: 0,
                            len: r.len,
                        },
                    )?
                    .data
                } else {
                    ByteBuf::new()
                };
                Ok(N2P_DATA { data, eof: r.eof })
            }
        }
    }

    /// The acceptor of a listening socket.
    pub(super) fn accept_loop(self: &Arc<Self>, s: &Arc<Sock>) {
        let Some((at, id)) = s.skel() else { return };
        loop {
            {
                let mut st = s.st.lock().unwrap();
                while st.queue.len() >= st.backlog.max(1) && !s.closed.load(Relaxed) {
                    st = s.changed.wait_timeout(st, Duration::from_secs(1)).unwrap().0;
                }
            }
            if s.closed.load(Relaxed) {
                return;
            }
            match self.wait_call(
                &at,
                P2N_ACCEPT {
                    sock: id,
                    wait_ms: WAIT_MS,
                },
            ) {
                Ok(r) => {
                    self.c.accepts.fetch_add(1, Relaxed);
                    let made = self.new_sock(s.spec.clone(), Phase::Connected, Some((at.clone(), r.sock)));
                    let Ok((_, theirs)) = made else {
                        let _ = self.call(&at, P2N_CLOSE { sock: r.sock });
                        continue;
                    };
                    s.st.lock().unwrap().queue.push_back((theirs, r.peer));
                    token(s);
                }
                Err(libc::EAGAIN) => {}
                Err(_) if s.closed.load(Relaxed) => return,
                Err(e @ (libc::ENETDOWN | libc::EBADF)) => {
                    // The nComponent is gone (or forgot the socket): the program's accept
                    // returns the error from now on (the pair's end reads as end of file).
                    tracing::info!(errno = e, "a listening socket lost its nComponent");
                    s.st.lock().unwrap().error = libc::ENETDOWN;
                    shutdown(&s.mine, libc::SHUT_WR);
                    return;
                }
                Err(e) => {
                    tracing::debug!(errno = e, "a listening socket's accept failed");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }
}
