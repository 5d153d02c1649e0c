//! Passing descriptors over a Unix socket (SCM_RIGHTS): a program's shim hands the pComponent
//! its userfaultfd and heap memfd, a shared-memory transport hands a peer its channel. And who
//! is at the other end of one (SO_PEERCRED, SO_PEERGROUPS).
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Most descriptors one message carries here.
const MAX_FDS: usize = 4;

/// Room for `MAX_FDS` descriptors' control message, aligned for cmsghdr.
type ControlBuf = [u64; 8];

/// Sends `bytes` (not empty) with `fds` attached.
pub fn send_fds(s: &UnixStream, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    assert!(!bytes.is_empty() && fds.len() <= MAX_FDS);
    let mut cbuf: ControlBuf = [0; 8];
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut libc::c_void,
        iov_len: bytes.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is its empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    // SAFETY: CMSG_SPACE is a pure size computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of_val(fds) as u32) } as _;
    // SAFETY: `msg_controllen` fits in `cbuf` (MAX_FDS descriptors at most), so the first
    // header and its data lie inside `cbuf`; sendmsg only reads `bytes` through `iov`.
    let n = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c) as *mut RawFd, fds.len());
        libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != bytes.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short send of a descriptor message",
        ));
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes and the descriptors attached to them (close-on-exec).
pub fn recv_fds(s: &UnixStream, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    let mut cbuf: ControlBuf = [0; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is its empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    let n = loop {
        // SAFETY: `msg` points at `iov` (the bytes of `buf`) and at `cbuf`, both alive for the
        // call and sized as declared.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL) };
        let e = io::Error::last_os_error();
        // On a socket with a receive timeout, Linux fails the call with EINTR when the process
        // is stopped and continued (signal(7)), even with no handler: a component paused by
        // SIGSTOP must not drop the connections whose greeting it was waiting for.
        if n >= 0 || e.kind() != io::ErrorKind::Interrupted {
            break if n < 0 { return Err(e) } else { n };
        }
    };
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg`'s control buffer; CMSG_FIRSTHDR/NXTHDR stay inside
    // `msg_controllen`, and each SCM_RIGHTS payload holds `cmsg_len - CMSG_LEN(0)` bytes of
    // descriptors that were installed in this process for us alone.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let k =
                    ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(c) as *const RawFd;
                for i in 0..k {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n as usize != buf.len() || msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected {} bytes with descriptors, got {n}", buf.len()),
        ));
    }
    Ok(fds)
}

/// The process at the other end of a Unix socket, as the kernel recorded it when it connected
/// (`SO_PEERCRED`): pid, uid, gid.
pub fn peer_cred(s: &UnixStream) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into the ucred, which outlives the call.
    if unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut _ as *mut libc::c_void,
            &mut len,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(cred)
}

/// That process's supplementary groups when it connected (`SO_PEERGROUPS`).
pub fn peer_groups(s: &UnixStream) -> io::Result<Vec<u32>> {
    let size = std::mem::size_of::<libc::gid_t>();
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut len = (groups.len() * size) as libc::socklen_t;
        // SAFETY: SO_PEERGROUPS writes at most `len` bytes into the vector's buffer; on ERANGE
        // it writes none and says how many are needed.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr() as *mut libc::c_void,
                &mut len,
            )
        };
        let e = io::Error::last_os_error();
        if r == 0 {
            groups.truncate(len as usize / size);
            return Ok(groups);
        }
        if e.raw_os_error() != Some(libc::ERANGE) || len as usize <= groups.len() * size {
            return Err(e);
        }
        groups.resize(len as usize / size, 0);
    }
}

/// A pidfd of that process: it names the process that connected even after its pid is
/// reused. From the connection itself (`SO_PEERPIDFD`, Linux 6.5); on older kernels opened
/// by the pid the connection recorded (`pid`), which names the wrong process only if that
/// one ended and its pid was reused before this call.
pub fn peer_pidfd(s: &UnixStream, pid: libc::pid_t) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: SO_PEERPIDFD writes one descriptor number into `fd`, which outlives the call.
    if unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERPIDFD,
            &mut fd as *mut _ as *mut libc::c_void,
            &mut len,
        )
    } != 0
    {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOPROTOOPT) {
            return Err(e);
        }
        // SAFETY: pidfd_open takes no pointers.
        fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as libc::c_int;
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: a descriptor the kernel just installed for us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn nothing(_: libc::c_int) {}

    /// A receive interrupted by a signal (what a SIGSTOP and SIGCONT do to a receive with a
    /// timeout) goes on waiting and gets the message sent after it.
    #[test]
    fn an_interrupted_receive_waits_on_for_the_message() {
        // SAFETY: a handler that does nothing, installed without SA_RESTART so that the
        // blocked recvmsg fails with EINTR as it does after a stop.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
        }
        let (a, b) = UnixStream::pair().unwrap();
        b.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            // SAFETY: pthread_self takes no pointers.
            tx.send(unsafe { libc::pthread_self() }).unwrap();
            let mut buf = [0u8; 3];
            let fds = recv_fds(&b, &mut buf);
            (fds.map(|f| f.len()), buf)
        });
        let thread = rx.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        // SAFETY: the waiting thread is alive (it cannot return before the message is sent).
        assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR2) }, 0);
        std::thread::sleep(std::time::Duration::from_millis(200));
        send_fds(&a, b"hey", &[a.as_raw_fd()]).unwrap();
        let (fds, buf) = waiter.join().unwrap();
        assert_eq!(fds.unwrap(), 1);
        assert_eq!(&buf, b"hey");
    }
}
