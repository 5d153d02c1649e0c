//! The connection to the pComponent: a Unix stream socket, its welcome (the userfaultfd
//! features to ask for, and maybe the file to back the heap with), a hello that hands over the
//! userfaultfd and the heap's file (SCM_RIGHTS), then one response per request.
use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering::*};
use splitos_shim_abi::{
    uffd, Admitted, Hello, IntoBytes, Op, ShimReq, ShimResp, VmaRec, Welcome, ADMITTED_COMMIT_ON_USE, HELLO_PROGRAM,
    REGION_BASE, WELCOME_HEAP_FILE, WELCOME_UFFD_DEV,
};

use crate::start::env;
use crate::sys::{
    die, errno, fmt_u64, high_fd, raw_mmap, raw_mprotect, served_by_trusted_user, spin_lock, spin_unlock, until_nul,
};
use crate::vm::REGION_SIZE;

pub(crate) static SOCK: AtomicI32 = AtomicI32::new(-1);
/// Serializes requests on the one socket; held across fork so no request is cut in half.
static LOCK: AtomicBool = AtomicBool::new(false);
/// A word on a MADV_WIPEONFORK page, set when this address space says hello. A process made
/// by copying the address space without the shim's fork (a clone system call without
/// CLONE_VM) reads zero here: it inherited the parent's socket but not its heap, and a request
/// from it would act on the parent's memory. Processes that share the address space (threads,
/// vfork children) share the word.
static HELLO_SAID: AtomicPtr<AtomicU64> = AtomicPtr::new(core::ptr::null_mut());

fn mark_hello_said() {
    let mut w = HELLO_SAID.load(Relaxed);
    if w.is_null() {
        let (rw, private) = (
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        );
        // SAFETY: a fresh page at an address the kernel picks replaces nothing.
        let p = unsafe { raw_mmap(0, 4096, rw, private, -1, 0) };
        // SAFETY: the advice only changes what a copy of the address space inherits of the page.
        if p == libc::MAP_FAILED || unsafe { libc::syscall(libc::SYS_madvise, p, 4096, libc::MADV_WIPEONFORK) } != 0 {
            die(&[b"cannot map the page that tells a forked copy from its parent"]);
        }
        w = p as *mut AtomicU64;
        HELLO_SAID.store(w, Relaxed);
    }
    // SAFETY: the page mapped above, never unmapped, aligned for a u64.
    unsafe { &*w }.store(1, Release);
}

fn hello_said_here() -> bool {
    let w = HELLO_SAID.load(Relaxed);
    // SAFETY: as in mark_hello_said; in a copied address space the page exists, zeroed.
    !w.is_null() && unsafe { &*w }.load(Acquire) == 1
}

/// What the pComponent's welcome gives the shim.
pub(crate) struct Welcomed {
    /// Userfaultfd features to ask for (of those the shim knows to ask for).
    pub features: u64,
    /// The userfaultfd device to create the userfaultfd from, or -1: then the system call.
    pub uffd_dev: c_int,
    /// The file to back the heap region with (the pComponent's own tmpfs, where huge pages are
    /// allowed), or -1: then the shim creates a memfd.
    pub heap_file: c_int,
}

/// Connects to the pComponent and reads its welcome.
pub(crate) fn connect() -> Welcomed {
    let path = until_nul(&env().sock);
    // SAFETY: socket(2) only creates a descriptor.
    let sock = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    // SAFETY: sockaddr_un is plain data, valid when zeroed.
    let mut sa: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as _;
    if sock < 0 || path.len() >= sa.sun_path.len() {
        die(&[b"bad pComponent socket path ", path]);
    }
    for (i, b) in path.iter().enumerate() {
        sa.sun_path[i] = *b as c_char;
    }
    // SAFETY: the address is a live sockaddr_un of the length passed.
    if unsafe {
        libc::connect(
            sock,
            &sa as *const _ as *const libc::sockaddr,
            core::mem::size_of::<libc::sockaddr_un>() as u32,
        )
    } != 0
    {
        die(&[b"cannot reach the pComponent at ", path, b" (is the cluster up?)"]);
    }
    if !served_by_trusted_user(sock) {
        die(&[b"the socket at ", path, b" is served by another user, not by root or this program's user: it is not a pComponent, refusing to give it this program's memory"]);
    }
    let sock = high_fd(sock);
    SOCK.store(sock, Relaxed);
    // A pComponent of an older build sends no welcome and waits for the hello: do not wait
    // for ever.
    let patience = libc::timeval { tv_sec: 30, tv_usec: 0 };
    set_receive_timeout(sock, &patience);
    let mut welcome = Welcome::default();
    let mut cbuf = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: welcome.as_mut_bytes().as_mut_ptr() as *mut c_void,
        iov_len: core::mem::size_of::<Welcome>(),
    };
    // SAFETY: msghdr is plain data, valid when zeroed.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut c_void;
    msg.msg_controllen = core::mem::size_of_val(&cbuf) as _;
    // SAFETY: the message points at the welcome's bytes and at cbuf, both live and sized as
    // declared; the kernel installs any descriptor it carries in this process for us alone.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC | libc::MSG_WAITALL) };
    let mut fds = [-1 as c_int; 2];
    // SAFETY: CMSG_FIRSTHDR stays inside the control buffer the kernel filled; the data of an
    // SCM_RIGHTS header is as many descriptors installed in this process as its length says.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if n > 0 && !c.is_null() && (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
            let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / core::mem::size_of::<c_int>();
            for (i, fd) in fds.iter_mut().enumerate().take(count) {
                *fd = core::ptr::read_unaligned((libc::CMSG_DATA(c) as *const c_int).add(i));
            }
        }
    }
    if n != core::mem::size_of::<Welcome>() as isize {
        die(&[
            b"no welcome from the pComponent at ",
            path,
            b" within 30 s (closed; started and not yet registered with its managers, which do not answer; or a splitos build older than this shim)",
        ]);
    }
    set_receive_timeout(sock, &libc::timeval { tv_sec: 0, tv_usec: 0 });
    if welcome.mark != splitos_shim_abi::WELCOME_MARK || welcome.abi != splitos_shim_abi::SHIM_ABI_VERSION {
        die(&[
            b"the pComponent at ",
            path,
            b" speaks another shim ABI version (a different splitos build)",
        ]);
    }
    if welcome.refused == libc::EAGAIN as u32 {
        die(&[
            b"the pComponent at ",
            path,
            b" is busy: too many of this user's processes are starting at once",
        ]);
    }
    if welcome.refused != 0 {
        let mut uid = [0u8; 20];
        // SAFETY: getuid takes nothing and cannot fail.
        let uid = fmt_u64(unsafe { libc::getuid() } as u64, &mut uid);
        die(&[
            b"the pComponent at ",
            path,
            b" grants no vNode to this user (uid ",
            uid,
            b"): ask the cluster's admin for one",
        ]);
    }
    let mut next = fds.into_iter();
    let mut take = |flag: u32| {
        if welcome.flags & flag != 0 {
            next.next().unwrap_or(-1)
        } else {
            -1
        }
    };
    let (uffd_dev, heap_file) = (take(WELCOME_UFFD_DEV), take(WELCOME_HEAP_FILE));
    for fd in next.filter(|fd| *fd >= 0) {
        // SAFETY: a descriptor that was just installed for us, which the flags did not announce
        // and nothing else knows.
        unsafe { libc::close(fd) };
    }
    REPLY_SPIN_NS.store(welcome.reply_spin_us as u64 * 1000, Relaxed);
    Welcomed {
        features: welcome.uffd_features & uffd::FEATURES_ON_REQUEST,
        uffd_dev,
        heap_file,
    }
}

/// `mi_option_arena_eager_commit` in mimalloc v3's option enum (the binding does not name it).
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// Sends the hello with the two descriptors on the connection [`connect`] made and, in a
/// forked child, re-applies the protections of the address space it inherited.
///
/// # Safety
/// The region is freshly mapped and nothing uses it yet: the protections change under it.
pub(crate) unsafe fn hello(uffd: c_int, memfd: c_int, fork_token: u64) {
    let sock = SOCK.load(Relaxed);
    mark_hello_said();

    let hello = Hello {
        abi: splitos_shim_abi::SHIM_ABI_VERSION,
        kind: HELLO_PROGRAM,
        region_base: REGION_BASE,
        region_size: REGION_SIZE.load(Relaxed),
        fork_token,
        run_id: env().run_id,
        vnode: env().vnode,
        interleave_local: 0,
        interleave_of: 0,
        interleave_unit: 0,
        flags: 0,
        _pad: 0,
    };

    let fds = [uffd, memfd];
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: hello.as_bytes().as_ptr() as *mut c_void,
        iov_len: core::mem::size_of::<Hello>(),
    };
    // SAFETY: msghdr is plain data, valid when zeroed.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut c_void;
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(core::mem::size_of_val(&fds) as u32) } as _;
    // SAFETY: cbuf (64 bytes, 8-aligned) holds one header with two descriptors (CMSG_SPACE of
    // 8 bytes is 24), so the first header is non-null and its data has room for both fds;
    // sendmsg only reads the hello through iov.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(core::mem::size_of_val(&fds) as u32) as _;
        core::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c) as *mut c_int, 2);
        if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) != core::mem::size_of::<Hello>() as isize {
            die(&[b"cannot introduce this process to the pComponent"]);
        }
    }
    let mut resp = ShimResp::default();
    if !read_all(sock, resp.as_mut_bytes()) {
        die(&[b"the pComponent closed the connection during the hello"]);
    }
    if resp.ret == -(libc::EACCES as i64) {
        die(&[
            b"vNode ",
            until_nul(&env().vnode),
            b" is not granted to this user: the pComponent refused this process",
        ]);
    }
    if resp.ret == -(libc::EAGAIN as i64) {
        die(&[b"the pComponent refused this process: too many of this user's programs run there"]);
    }
    if resp.ret == -(libc::EPERM as i64) {
        die(&[b"the pComponent could not admit this process: its home mComponent, or the process it was forked from, refused it (the pComponent's log says why)"]);
    }
    if resp.ret < 0 {
        let mut b = [0u8; 20];
        die(&[
            b"the pComponent refused this process (errno ",
            fmt_u64((-resp.ret) as u64, &mut b),
            b")",
        ]);
    }
    let mut admitted = Admitted::default();
    if !read_all(sock, admitted.as_mut_bytes()) {
        die(&[b"the pComponent closed the connection during the hello"]);
    }
    if admitted.flags & ADMITTED_COMMIT_ON_USE != 0 {
        // SAFETY: a plain setter; mimalloc reads the option when it next reserves an arena.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
    }
    for _ in 0..resp.val2 {
        let mut v = VmaRec::default();
        if !read_all(sock, v.as_mut_bytes()) {
            die(&[b"the pComponent closed the connection while sending the forked address space"]);
        }
        // SAFETY: the records describe ranges of the fresh region, which nothing references
        // yet (this function's contract); the kernel rejects anything outside a mapping.
        if v.prot != 0 && unsafe { raw_mprotect(v.start, v.end - v.start, v.prot as c_int) } != 0 {
            die(&[b"cannot restore protections of the forked address space"]);
        }
    }
}

/// Bounds how long reads on `sock` wait (zero: for ever).
fn set_receive_timeout(sock: c_int, tv: &libc::timeval) {
    // SAFETY: setsockopt reads a timeval of the size given from a live reference.
    unsafe {
        libc::setsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            tv as *const _ as *const c_void,
            core::mem::size_of::<libc::timeval>() as u32,
        )
    };
}

fn read_all(fd: c_int, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reads into the unfilled tail of a live, exclusively borrowed buffer.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr() as *mut c_void, buf.len() - got) };
        if n > 0 {
            got += n as usize;
        } else if n < 0 && errno() == libc::EINTR {
            continue;
        } else {
            return false;
        }
    }
    true
}

fn write_all(fd: c_int, buf: &[u8]) -> bool {
    let mut put = 0;
    while put < buf.len() {
        // SAFETY: sends from the unsent tail of a live buffer; send only reads it.
        let n = unsafe {
            libc::send(
                fd,
                buf[put..].as_ptr() as *const c_void,
                buf.len() - put,
                libc::MSG_NOSIGNAL,
            )
        };
        if n > 0 {
            put += n as usize;
        } else if n < 0 && errno() == libc::EINTR {
            continue;
        } else {
            return false;
        }
    }
    true
}

/// How long a request polls for its reply before sleeping, as the pComponent's welcome says
/// (its `heap_call_spin_us`): it answers a heap call in a few microseconds, and a thread that
/// sleeps for it pays a wake-up on top (several microseconds on a virtual machine); the
/// thread waits for the reply either way.
static REPLY_SPIN_NS: AtomicU64 = AtomicU64::new(0);

fn now_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to a live reference.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Reads the reply to a request into `buf`: polling for it for [`REPLY_SPIN_NS`], then
/// sleeping until it comes.
fn await_reply(fd: c_int, buf: &mut [u8]) -> bool {
    let spin = REPLY_SPIN_NS.load(Relaxed);
    if spin == 0 {
        return read_all(fd, buf);
    }
    let t0 = now_ns();
    loop {
        // SAFETY: reads into a live, exclusively borrowed buffer of its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut c_void, buf.len(), libc::MSG_DONTWAIT) };
        if n > 0 {
            return read_all(fd, &mut buf[n as usize..]);
        }
        if n == 0 || n < 0 && !matches!(errno(), libc::EAGAIN | libc::EINTR) {
            return false;
        }
        let waited = now_ns() - t0;
        if waited >= spin {
            return read_all(fd, buf);
        }
        if waited < spin / 4 {
            core::hint::spin_loop();
        } else {
            // SAFETY: sched_yield takes nothing.
            unsafe { libc::sched_yield() };
        }
    }
}

/// Takes the request lock; fork holds it from its prepare request until both sides run again.
pub(crate) fn lock() {
    spin_lock(&LOCK);
}

pub(crate) fn unlock() {
    spin_unlock(&LOCK);
}

/// One request and its response; the caller holds the lock.
pub(crate) fn request_locked(req: &ShimReq) -> ShimResp {
    if !hello_said_here() {
        die(&[
            b"this process was made by a clone system call without CLONE_VM, which the shim cannot see: \
               it has no heap of its own (its parent's is not mapped here). Use fork(), vfork() or posix_spawn().",
        ]);
    }
    let sock = SOCK.load(Relaxed);
    let mut resp = ShimResp::default();
    if !write_all(sock, req.as_bytes()) || !await_reply(sock, resp.as_mut_bytes()) {
        die(&[b"lost the connection to the pComponent; the heap is unreachable"]);
    }
    resp
}

pub(crate) fn request(op: Op, a: u64, b: u64, c: u64, d: u64, e: u64) -> ShimResp {
    let req = ShimReq {
        op: op as u32,
        _pad: 0,
        a,
        b,
        c,
        d,
        e,
    };
    lock();
    let r = request_locked(&req);
    unlock();
    r
}
