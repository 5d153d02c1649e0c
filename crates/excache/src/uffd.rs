//! The userfaultfd and memfd operations the pComponent performs on a program's heap region.
//! Both descriptors were created by the program's shim and handed over at hello; every ioctl
//! here acts on the program's address space, not ours.
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use splitos_shim_abi::uffd;

pub const PAGE: u64 = splitos_rpc::PAGE_SIZE as u64;

fn ioctl<T>(fd: &OwnedFd, req: u64, arg: &mut T) -> io::Result<()> {
    // SAFETY: `arg` is the record this ioctl expects (see splitos_shim_abi::uffd).
    if unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `fd` is a userfaultfd: the kernel names each one `anon_inode:[userfaultfd]`. Any
/// other descriptor (a pipe, a file) would let a program write page-fault messages of its own,
/// at addresses of its choosing, for the miss path to serve.
pub fn is_userfaultfd(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|l| l.as_os_str() == "anon_inode:[userfaultfd]")
}

pub enum Install {
    Done,
    /// Someone installed the page first; waiters were woken.
    Exists,
    /// The program is gone.
    Gone,
}

/// Installs a page and wakes the faulting threads. `wp` maps it write-protected, so that the
/// first write traps and marks the line dirty.
pub fn copy(uffd_fd: &OwnedFd, addr: u64, data: &[u8], wp: bool) -> io::Result<Install> {
    copy_pages(uffd_fd, addr, &data[..PAGE as usize], wp)
}

/// Installs consecutive pages as [`copy`] installs one, in as few ioctls as it can.
pub fn copy_pages(uffd_fd: &OwnedFd, addr: u64, data: &[u8], wp: bool) -> io::Result<Install> {
    match copy_range(uffd_fd, addr, data, wp) {
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ESRCH) | Some(libc::ENOENT) | Some(libc::EFAULT)
            ) =>
        {
            Ok(Install::Gone)
        }
        r => r,
    }
}

/// Installs consecutive pages as [`copy`] installs one; a page someone installed first is
/// left as it is (and its waiters woken). Errors are the kernel's (ESRCH: the program is gone).
pub fn copy_range(uffd_fd: &OwnedFd, addr: u64, data: &[u8], wp: bool) -> io::Result<Install> {
    let (len, mut done, mut result) = (data.len() as u64, 0, Install::Done);
    // One ioctl covers one mapping only: past a refusal, the rest goes a page at a time.
    let mut one_by_one = false;
    while done < len {
        let chunk = if one_by_one { PAGE } else { len - done };
        let mut c = uffd::Copy {
            dst: addr + done,
            src: data[done as usize..].as_ptr() as u64,
            len: chunk,
            mode: if wp { uffd::COPY_MODE_WP } else { 0 },
            copy: 0,
        };
        match ioctl(uffd_fd, uffd::UFFDIO_COPY, &mut c) {
            Ok(()) => done += chunk,
            // Part of the range went in before the error: go on from there.
            Err(_) if c.copy > 0 => done += c.copy as u64,
            Err(e) => match e.raw_os_error() {
                Some(libc::EEXIST) => {
                    wake(uffd_fd, addr + done, PAGE);
                    done += PAGE;
                    result = Install::Exists;
                }
                Some(libc::EAGAIN) => std::thread::yield_now(),
                Some(libc::ENOENT) if chunk > PAGE => one_by_one = true,
                _ => return Err(e),
            },
        }
    }
    Ok(result)
}

/// Unmaps pages of the program at `runs` (start address, length) and keeps them in its memfd,
/// so that the next touch of each is a minor fault, which the kernel serves from the memfd.
/// `pidfd` is the program's. The kernel
/// unmaps them as reclaim would (MADV_PAGEOUT) and, with no swap to write them to, keeps them:
/// which is why sampling is off on a host with swap. Needs CAP_SYS_NICE.
pub fn unmap(pidfd: &OwnedFd, runs: &[(u64, u64)]) -> io::Result<()> {
    // The kernel takes at most IOV_MAX (1024) ranges per call.
    for chunk in runs.chunks(1024) {
        let iov: Vec<libc::iovec> = chunk
            .iter()
            .map(|&(a, l)| libc::iovec {
                iov_base: a as *mut _,
                iov_len: l as usize,
            })
            .collect();
        // SAFETY: process_madvise(2) reads `iov` (valid for the call) and acts on the
        // program's address space, never on ours.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                pidfd.as_raw_fd(),
                iov.as_ptr(),
                iov.len(),
                libc::MADV_PAGEOUT,
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // The kernel stops at the first range it cannot advise (one unmapped meanwhile): the
        // pages after it are still mapped.
        let asked: usize = chunk.iter().map(|&(_, l)| l as usize).sum();
        if (r as usize) < asked {
            return Err(io::Error::other(format!("unmapped {r} of {asked} bytes")));
        }
    }
    Ok(())
}

/// Why this host cannot sample accesses by unmapping, if it cannot.
pub fn cannot_unmap() -> Option<String> {
    // SAFETY: sysinfo(2) fills the record it is given.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `si` is valid for the call.
    if unsafe { libc::sysinfo(&mut si) } == 0 && si.totalswap > 0 {
        return Some("this host has swap, to which unmapping would write the ExCache's lines".into());
    }
    let caps = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        s.lines().find_map(|l| {
            l.strip_prefix("CapEff:")
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
    });
    const CAP_SYS_NICE: u64 = 23;
    if caps.is_some_and(|c| c & (1 << CAP_SYS_NICE) == 0) {
        return Some("the pComponent lacks CAP_SYS_NICE, which unmapping another process's pages needs".into());
    }
    // A touch is seen in the program's page tables (PAGEMAP_SCAN, Linux 6.7).
    let here = 0u8;
    let page = std::ptr::addr_of!(here) as u64 / PAGE;
    if let Err(e) = std::fs::File::open("/proc/self/pagemap").and_then(|m| crate::dirty::present(&m, page, page + 1)) {
        return Some(format!(
            "this kernel cannot tell which pages a program touched again (PAGEMAP_SCAN, Linux 6.7): {e}"
        ));
    }
    None
}

pub fn wake(uffd_fd: &OwnedFd, addr: u64, len: u64) {
    let mut r = uffd::Range { start: addr, len };
    let _ = ioctl(uffd_fd, uffd::UFFDIO_WAKE, &mut r);
}

/// Sets or clears write protection of resident pages; clearing wakes writers waiting on it.
pub fn write_protect(uffd_fd: &OwnedFd, addr: u64, len: u64, protect: bool) -> io::Result<()> {
    let mut w = uffd::WriteProtect {
        range: uffd::Range { start: addr, len },
        mode: if protect { uffd::WP_MODE_WP } else { 0 },
    };
    match ioctl(uffd_fd, uffd::UFFDIO_WRITEPROTECT, &mut w) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::ESRCH) | Some(libc::ENOENT)) => Ok(()),
        r => r,
    }
}

/// Reads a resident page's current contents through the memfd.
pub fn read_page(memfd: &OwnedFd, off: u64, buf: &mut [u8]) -> io::Result<()> {
    if buf.len() < PAGE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a page buffer is shorter than a page",
        ));
    }
    // SAFETY: `buf` is writable for at least PAGE bytes (checked above) for the whole call.
    let n = unsafe { libc::pread(memfd.as_raw_fd(), buf.as_mut_ptr() as *mut _, PAGE as usize, off as i64) };
    if n == PAGE as isize {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Drops pages from the program: unmaps them and frees the local memory behind them. The
/// next access faults to us again.
pub fn punch(memfd: &OwnedFd, off: u64, len: u64) -> io::Result<()> {
    let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    // SAFETY: fallocate(2) takes no pointers; it acts on the program's memfd only.
    if unsafe { libc::fallocate(memfd.as_raw_fd(), mode, off as i64, len as i64) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A page fault as its message tells it.
#[derive(Clone, Copy)]
pub struct Fault {
    pub flags: u64,
    pub addr: u64,
    /// The faulting thread (0: unknown).
    pub tid: u32,
}

/// One fault worker's wait: an epoll set holding the process's uffd exclusively (a fault wakes
/// one worker, not all of them) and the process's stop eventfd.
pub struct FaultWait {
    ep: OwnedFd,
}

impl FaultWait {
    pub fn new(uffd_fd: &OwnedFd, stop: &OwnedFd) -> io::Result<FaultWait> {
        use std::os::fd::FromRawFd;
        // SAFETY: epoll_create1(2) takes no pointers; the result is checked below.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ep` is a fresh descriptor that nothing else owns.
        let ep = unsafe { OwnedFd::from_raw_fd(ep) };
        for (fd, flags, tag) in [
            (uffd_fd, libc::EPOLLIN | libc::EPOLLEXCLUSIVE, 0u64),
            (stop, libc::EPOLLIN, 1),
        ] {
            let mut ev = libc::epoll_event {
                events: flags as u32,
                u64: tag,
            };
            // SAFETY: `ev` is a valid epoll_event for the duration of the call.
            if unsafe { libc::epoll_ctl(ep.as_raw_fd(), libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(FaultWait { ep })
    }

    /// Waits up to `timeout_ms` for faults; appends the page faults to `out`.
    /// `None` when the process was told to stop.
    /// Polls the uffd first (a busy program faults again within microseconds, and a sleeping
    /// worker's vCPU is slow to wake).
    pub fn next(
        &self,
        uffd_fd: &OwnedFd,
        poller: &splitos_rpc::poll::Poller,
        timeout_ms: i32,
        out: &mut Vec<Fault>,
    ) -> Option<()> {
        match poller.poll(|| (read_msgs(uffd_fd, out) > 0).then_some(())) {
            Ok(()) => Some(()),
            Err(pending) => {
                let r = self.sleep(uffd_fd, timeout_ms, out);
                pending.slept();
                r
            }
        }
    }

    fn sleep(&self, uffd_fd: &OwnedFd, timeout_ms: i32, out: &mut Vec<Fault>) -> Option<()> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 2];
        // SAFETY: `evs` has room for the 2 events asked for.
        let n = unsafe { libc::epoll_wait(self.ep.as_raw_fd(), evs.as_mut_ptr(), 2, timeout_ms) };
        if n <= 0 {
            return Some(());
        }
        if evs[..n as usize]
            .iter()
            .any(|e| e.u64 == 1 || e.events & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0)
        {
            return None;
        }
        read_msgs(uffd_fd, out);
        Some(())
    }
}

/// Reads pending uffd messages without blocking; returns how many page faults it added.
fn read_msgs(uffd_fd: &OwnedFd, out: &mut Vec<Fault>) -> usize {
    let before = out.len();
    let mut msgs = [uffd::Msg::default(); 16];
    // SAFETY: `msgs` is writable for its whole size, and any bytes are a valid uffd::Msg
    // (plain integers).
    let n = unsafe {
        libc::read(
            uffd_fd.as_raw_fd(),
            msgs.as_mut_ptr() as *mut _,
            std::mem::size_of_val(&msgs),
        )
    };
    if n > 0 {
        for m in &msgs[..n as usize / std::mem::size_of::<uffd::Msg>()] {
            if m.event == uffd::EVENT_PAGEFAULT {
                out.push(Fault {
                    flags: m.flags,
                    addr: m.address,
                    tid: m.tid(),
                });
            }
        }
    }
    out.len() - before
}
