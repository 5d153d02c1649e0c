//! `splitos bench floor`: the floors a miss is compared with, measured on this machine in the
//! same run as the benchmark: a native first-touch page fault, a userfaultfd fault served by
//! another thread with a local page, a raw TCP loopback round trip carrying 4 KB, and the
//! splitos RPC round trip carrying 4 KB to a running mComponent. Waiters poll before they
//! sleep, as the system's own do.
pub mod managers;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Instant;

use hdrhistogram::Histogram;
use splitos_rpc::poll::{Poller, Polling};
use splitos_rpc::transport::tcp::DEFAULT_SPIN_US;
use splitos_rpc::transport::{TcpConfig, TcpTransport};
use splitos_shim_abi::uffd;

const PAGE: usize = 4096;
/// The floors poll for the system's whole polling ceiling ([`Poller`], fixed), so that the
/// comparison is between mechanisms, not between a polling and a sleeping waiter.
const SPIN: std::time::Duration = std::time::Duration::from_micros(DEFAULT_SPIN_US);

fn summary(name: &str, h: &Histogram<u64>) -> serde_json::Value {
    serde_json::json!({"name": name, "n": h.len(), "p50_ns": h.value_at_quantile(0.5), "p99_ns": h.value_at_quantile(0.99), "mean_ns": h.mean() as u64})
}

/// Nanoseconds, up to a minute (a managers' answer under overload takes seconds).
fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("bounds")
}

/// A system call's result, or the error it set.
fn checked(r: i64, what: &str) -> anyhow::Result<i64> {
    if r < 0 {
        anyhow::bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(r)
}

/// A new mapping of `len` bytes, or the error.
fn map(len: usize, prot: i32, flags: i32, fd: i32) -> anyhow::Result<*mut u8> {
    // SAFETY: a new mapping (no MAP_FIXED) overlaps no memory of ours.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
    if p == libc::MAP_FAILED {
        anyhow::bail!("mmap of {len} bytes: {}", std::io::Error::last_os_error());
    }
    Ok(p as *mut u8)
}

/// First touch of fresh anonymous memory, served by the kernel.
fn native_first_touch(n: usize) -> anyhow::Result<Histogram<u64>> {
    let mut h = hist();
    let p = map(
        n * PAGE,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
    )?;
    for i in 0..n {
        let t = Instant::now();
        // SAFETY: page i lies inside the n-page mapping above, which nothing else references.
        unsafe { std::ptr::write_volatile(p.add(i * PAGE), 1) };
        let _ = h.record(t.elapsed().as_nanos() as u64);
    }
    // SAFETY: the mapping is ours alone and no reference into it outlives this call.
    unsafe { libc::munmap(p as *mut _, n * PAGE) };
    Ok(h)
}

/// How [`uffd_floor`]'s server installs a page.
#[derive(Clone, Copy)]
enum InstallBy {
    /// UFFDIO_COPY: allocate, copy and map in one call.
    Copy,
    /// pwrite into the memfd, then UFFDIO_CONTINUE maps the page it now holds: the install
    /// that writes a fetched line where it lives and maps it without a second copy.
    Continue,
}

/// A missing fault on a uffd-registered shared-memory page, served by another thread that
/// installs a local page `by` one of the two ways: the trap-and-install cost with no network
/// at all.
fn uffd_floor(n: usize, by: InstallBy) -> anyhow::Result<Histogram<u64>> {
    let memfd = checked(
        // SAFETY: the name is a NUL-terminated static string; the call creates a new descriptor.
        unsafe { libc::memfd_create(c"floor".as_ptr(), libc::MFD_CLOEXEC) } as i64,
        "memfd_create",
    )? as i32;
    // SAFETY: `memfd` is a descriptor this function just made and still owns.
    let memfd = unsafe { OwnedFd::from_raw_fd(memfd) };
    checked(
        // SAFETY: integers only.
        unsafe { libc::ftruncate(memfd.as_raw_fd(), (n * PAGE) as i64) } as i64,
        "ftruncate",
    )?;
    let base = map(
        n * PAGE,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED,
        memfd.as_raw_fd(),
    )? as u64;
    let ufd = checked(
        // SAFETY: integers only; the result is checked before it is owned.
        unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) },
        "userfaultfd",
    )? as i32;
    // SAFETY: `ufd` is a descriptor this function just made; OwnedFd closes it once.
    let ufd = unsafe { OwnedFd::from_raw_fd(ufd) };
    let (features, minor) = match by {
        InstallBy::Copy => (uffd::FEATURE_MISSING_SHMEM, 0),
        InstallBy::Continue => (
            uffd::FEATURE_MISSING_SHMEM | uffd::FEATURE_MINOR_SHMEM,
            uffd::REGISTER_MODE_MINOR,
        ),
    };
    let mut api = uffd::Api {
        api: uffd::UFFD_API,
        features,
        ioctls: 0,
    };
    checked(
        // SAFETY: `api` is the repr(C) struct UFFDIO_API reads and writes, live for the call.
        unsafe { libc::ioctl(ufd.as_raw_fd(), uffd::UFFDIO_API as _, &mut api) } as i64,
        "UFFDIO_API",
    )?;
    let mut reg = uffd::Register {
        range: uffd::Range {
            start: base,
            len: (n * PAGE) as u64,
        },
        mode: uffd::REGISTER_MODE_MISSING | minor,
        ioctls: 0,
    };
    checked(
        // SAFETY: `reg` is the repr(C) struct UFFDIO_REGISTER reads and writes; the range is our mapping.
        unsafe { libc::ioctl(ufd.as_raw_fd(), uffd::UFFDIO_REGISTER as _, &mut reg) } as i64,
        "UFFDIO_REGISTER",
    )?;
    let raw = ufd.as_raw_fd();
    let mfd = memfd.as_raw_fd();
    let server = std::thread::spawn(move || {
        let page = vec![7u8; PAGE];
        let poller = Poller::new(SPIN, Polling::Fixed);
        let mut served = 0;
        while served < n {
            let mut m = uffd::Msg::default();
            let got = poller.poll(|| {
                // SAFETY: reads at most size_of::<Msg>() bytes into `m`, a live repr(C) record
                // valid for any bytes; `raw` stays open until the thread is joined.
                let r = unsafe {
                    libc::read(
                        raw,
                        &mut m as *mut _ as *mut libc::c_void,
                        std::mem::size_of::<uffd::Msg>(),
                    )
                };
                (r > 0).then_some(())
            });
            if got.is_err() {
                let mut pfd = libc::pollfd {
                    fd: raw,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one live pollfd; a timeout or error only leads to another read attempt.
                unsafe { libc::poll(&mut pfd, 1, 1000) };
                continue;
            }
            if m.event != uffd::EVENT_PAGEFAULT {
                continue;
            }
            let dst = m.address & !(PAGE as u64 - 1);
            match by {
                InstallBy::Copy => {
                    let mut c = uffd::Copy {
                        dst,
                        src: page.as_ptr() as u64,
                        len: PAGE as u64,
                        mode: 0,
                        copy: 0,
                    };
                    // SAFETY: `c` is the repr(C) struct UFFDIO_COPY reads and writes; its source
                    // is `page`, PAGE live bytes, and its destination a page of the registered mapping.
                    unsafe { libc::ioctl(raw, uffd::UFFDIO_COPY as _, &mut c) };
                }
                InstallBy::Continue => {
                    // SAFETY: writes PAGE bytes of `page` into the memfd, which stays open until
                    // the thread is joined.
                    let wrote =
                        unsafe { libc::pwrite(mfd, page.as_ptr() as *const libc::c_void, PAGE, (dst - base) as i64) };
                    // Without the page in the memfd UFFDIO_CONTINUE fails and the faulting thread waits for good.
                    assert_eq!(
                        wrote,
                        PAGE as isize,
                        "pwrite into the floor's memfd: {}",
                        std::io::Error::last_os_error()
                    );
                    let mut c = uffd::Continue {
                        range: uffd::Range {
                            start: dst,
                            len: PAGE as u64,
                        },
                        mode: 0,
                        mapped: 0,
                    };
                    // SAFETY: `c` is the repr(C) struct UFFDIO_CONTINUE reads and writes; the
                    // range is a page of the registered mapping that the memfd now holds.
                    unsafe { libc::ioctl(raw, uffd::UFFDIO_CONTINUE as _, &mut c) };
                }
            }
            served += 1;
        }
    });
    let mut h = hist();
    for i in 0..n {
        let t = Instant::now();
        // SAFETY: page i lies inside the mapping; the fault it raises is served by the thread above.
        unsafe { std::ptr::read_volatile((base as *const u8).add(i * PAGE)) };
        let _ = h.record(t.elapsed().as_nanos() as u64);
    }
    server.join().expect("uffd server");
    // SAFETY: the server thread is joined, so nothing uses the mapping any more.
    unsafe { libc::munmap(base as *mut _, n * PAGE) };
    Ok(h)
}

/// A 64-byte request answered with 4 KB over TCP loopback, echo server on another thread,
/// both ends reading through the transport splitos uses, polling for `spin_us` first (0: a
/// plain blocking read, which the scheduler often turns into a same-CPU ping-pong).
fn tcp_floor(n: usize, spin_us: u64) -> Histogram<u64> {
    let t = TcpTransport::new(
        TcpConfig {
            spin_us,
            delay_us: 0,
            ..TcpConfig::default()
        },
        Polling::Fixed,
        None,
    );
    let l = t.listen_stream("127.0.0.1:0").expect("bind");
    let addr = splitos_rpc::Endpoint::addr(&l);
    std::thread::spawn(move || {
        let mut s = l.accept().expect("accept");
        let page = vec![1u8; PAGE];
        let mut req = [0u8; 64];
        while s.read_exact(&mut req).is_ok() {
            if s.write_all(&page).is_err() {
                break;
            }
        }
    });
    let mut c = t
        .connect_stream(&addr, std::time::Duration::from_secs(3))
        .expect("connect");
    let mut page = vec![0u8; PAGE];
    let mut h = hist();
    for _ in 0..n {
        let t0 = Instant::now();
        c.write_all(&[0u8; 64]).expect("write");
        c.read_exact(&mut page).expect("read");
        let _ = h.record(t0.elapsed().as_nanos() as u64);
    }
    h
}

/// The splitos RPC round trip with a 4 KB payload: C2X_PING is empty, so this sends a
/// P2M_FLUSH of a page to a process that does not exist and times the refusal, which exercises
/// the same framing, hand-off to a worker and reply path as a fetch. `kind` is the transport
/// (shared memory only reaches an mComponent of this host that serves it).
fn rpc_floor(addr: &str, n: usize, kind: &str, admin: &Path) -> anyhow::Result<Histogram<u64>> {
    let t = splitos_rpc::TransportConfig {
        kind: kind.into(),
        ..Default::default()
    };
    let creds = crate::node::credentials(admin, splitos_rpc::Role::Admin)?;
    let rpc = crate::node::client_rpc(&t, creds, std::time::Duration::from_secs(5))?;
    let mut h = hist();
    let msg = splitos_rpc::P2M_FLUSH {
        who: splitos_rpc::Who::new("bench", u64::MAX),
        vpn: 0,
        data: splitos_rpc::seal_page(&[0u8; PAGE]),
    };
    for _ in 0..n {
        let t0 = Instant::now();
        let _ = rpc.call_direct(addr, msg.clone());
        let _ = h.record(t0.elapsed().as_nanos() as u64);
    }
    Ok(h)
}

/// Prints the floors, `n` samples each; with `mcomp`, the RPC floors to that mComponent too,
/// proving the admin's credentials in `admin` (the command line's, given by main.rs, as this
/// module is below the control plane).
pub fn floor(n: usize, mcomp: Option<String>, admin: &Path) -> anyhow::Result<()> {
    let mut out = vec![
        summary("native_first_touch", &native_first_touch(n)?),
        summary("uffd_fault_local_page", &uffd_floor(n, InstallBy::Copy)?),
        summary("uffd_fault_local_page_continue", &uffd_floor(n, InstallBy::Continue)?),
    ];
    // The same with idle CPUs polling, as a pComponent with `idle_poll = "on"` has them.
    match splitos_pmon::host::idle::request() {
        Ok(_held) => {
            out.push(summary(
                "uffd_fault_local_page_idle_poll",
                &uffd_floor(n, InstallBy::Copy)?,
            ));
            out.push(summary(
                "uffd_fault_local_page_continue_idle_poll",
                &uffd_floor(n, InstallBy::Continue)?,
            ));
        }
        Err(e) => crate::errln!("no idle-polling floors: {e}"),
    }
    out.extend([
        summary("tcp_rtt_4k", &tcp_floor(n, 0)),
        summary("tcp_rtt_4k_polling", &tcp_floor(n, DEFAULT_SPIN_US)),
    ]);
    if let Some(a) = mcomp {
        out.push(summary("splitos_rpc_4k", &rpc_floor(&a, n, "tcp", admin)?));
        out.push(summary("splitos_rpc_4k_shm", &rpc_floor(&a, n, "shm", admin)?));
    }
    crate::outln!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}
