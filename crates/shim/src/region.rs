//! The heap region and the virtual-memory calls that land on it.
use core::ffi::{c_char, c_int, c_void};
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use libc::{off_t, pid_t, size_t};
use splitos_shim_abi::{as_bytes, as_bytes_mut, uffd, Hello, Op, ShimReq, ShimResp, VmaRec};
use splitos_shim_abi::{DEFAULT_REGION_SIZE, ENV_REGION_SIZE, ENV_RUN_ID, ENV_SOCK, ENV_VNODE, MMAP_FIXED, REGION_BASE};

const UNINIT: u32 = 0;
const INITIALIZING: u32 = 1;
const READY: u32 = 2;
/// No pComponent named in the environment: every call goes straight to the kernel.
const OFF: u32 = 3;

static STATE: AtomicU32 = AtomicU32::new(UNINIT);
static SOCK: AtomicI32 = AtomicI32::new(-1);
static UFFD: AtomicI32 = AtomicI32::new(-1);
static MEMFD: AtomicI32 = AtomicI32::new(-1);
static REGION_SIZE: AtomicU64 = AtomicU64::new(0);
/// Serializes requests on the one socket; held across fork so no request is cut in half.
static LOCK: AtomicBool = AtomicBool::new(false);
/// Set by our fork() for the child's handler: the process id the pComponent made for the child.
static FORK_TOKEN: AtomicU64 = AtomicU64::new(0);
static REAL_FORK: AtomicUsize = AtomicUsize::new(0);
static BRK_LOCK: AtomicBool = AtomicBool::new(false);
static BRK_BASE: AtomicU64 = AtomicU64::new(0);
static BRK_CUR: AtomicU64 = AtomicU64::new(0);
static BRK_TOP: AtomicU64 = AtomicU64::new(0);
const BRK_RESERVE: u64 = 1 << 30;
/// `mi_option_arena_reserve` in mimalloc v3's option enum (the binding does not name it); KiB.
const MI_OPTION_ARENA_RESERVE: libmimalloc_sys::mi_option_t = 23;
const PAGE: u64 = 4096;
/// The shim's descriptors live high so that programs which close their low fds keep them.
const HIGH_FD: c_int = 900;

/// What the shim read from the environment at start-up. A forked child must not call getenv:
/// a program may keep its environment in heap memory that the child has not mapped yet.
struct EnvCache {
    sock: [u8; 108],
    vnode: [u8; 64],
    run_id: u64,
}

static mut ENV: EnvCache = EnvCache { sock: [0; 108], vnode: [0; 64], run_id: 0 };

fn env() -> &'static EnvCache {
    // SAFETY: written once in init(), before STATE becomes READY; read-only afterwards.
    unsafe { &*core::ptr::addr_of!(ENV) }
}

fn until_nul(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|c| *c == 0).unwrap_or(b.len())]
}

fn errno() -> c_int {
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    unsafe { *libc::__errno_location() = e }
}

fn spin_lock(l: &AtomicBool) {
    while l.compare_exchange_weak(false, true, Acquire, Relaxed).is_err() {
        unsafe { libc::sched_yield() };
    }
}

fn spin_unlock(l: &AtomicBool) {
    l.store(false, Release);
}

fn say(parts: &[&[u8]]) {
    for p in parts {
        unsafe { libc::write(2, p.as_ptr() as *const c_void, p.len()) };
    }
}

/// A fatal condition under which continuing would be silently wrong.
fn die(parts: &[&[u8]]) -> ! {
    say(&[b"splitos shim: "]);
    say(parts);
    say(&[b"\n"]);
    unsafe { libc::_exit(127) }
}

fn cstr(p: *const c_char) -> &'static [u8] {
    if p.is_null() {
        return b"";
    }
    unsafe { core::slice::from_raw_parts(p as *const u8, libc::strlen(p)) }
}

fn parse_u64(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((c - b'0') as u64)?;
    }
    Some(v)
}

fn fmt_u64(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

unsafe fn raw_mmap(addr: u64, len: u64, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void
}

unsafe fn raw_mprotect(addr: u64, len: u64, prot: c_int) -> c_int {
    libc::syscall(libc::SYS_mprotect, addr, len, prot) as c_int
}

fn in_region(addr: u64, len: u64) -> bool {
    let size = REGION_SIZE.load(Relaxed);
    size != 0 && addr >= REGION_BASE && addr.saturating_add(len) <= REGION_BASE + size
}

fn overlaps_region(addr: u64, len: u64) -> bool {
    let size = REGION_SIZE.load(Relaxed);
    size != 0 && addr < REGION_BASE + size && addr.saturating_add(len) > REGION_BASE
}

fn page_up(n: u64) -> Option<u64> {
    n.checked_add(PAGE - 1).map(|v| v & !(PAGE - 1))
}

/// True once the region is set up and requests can be served; sets it up on first use.
fn ready() -> bool {
    loop {
        match STATE.load(Acquire) {
            READY => return true,
            OFF => return false,
            UNINIT => {
                if STATE.compare_exchange(UNINIT, INITIALIZING, AcqRel, Acquire).is_ok() {
                    let ok = unsafe { init() };
                    STATE.store(if ok { READY } else { OFF }, Release);
                    return ok;
                }
            }
            _ => unsafe {
                libc::sched_yield();
            },
        }
    }
}

unsafe fn init() -> bool {
    let path = libc::getenv(c"SPLITOS_PCOMP_SOCK".as_ptr());
    debug_assert_eq!(ENV_SOCK, "SPLITOS_PCOMP_SOCK");
    if path.is_null() || *path == 0 {
        return false;
    }
    let size = parse_u64(cstr(libc::getenv(c"SPLITOS_REGION_SIZE".as_ptr()))).unwrap_or(DEFAULT_REGION_SIZE);
    debug_assert_eq!(ENV_REGION_SIZE, "SPLITOS_REGION_SIZE");
    let e = &mut *core::ptr::addr_of_mut!(ENV);
    let sock = cstr(path);
    if sock.len() >= e.sock.len() {
        die(&[b"the pComponent socket path is too long: ", sock]);
    }
    e.sock[..sock.len()].copy_from_slice(sock);
    let vnode = cstr(libc::getenv(c"SPLITOS_VNODE".as_ptr()));
    let vnode: &[u8] = if vnode.is_empty() { b"default" } else { vnode };
    let n = vnode.len().min(e.vnode.len() - 1);
    e.vnode[..n].copy_from_slice(&vnode[..n]);
    e.run_id = parse_u64(cstr(libc::getenv(c"SPLITOS_RUN_ID".as_ptr()))).unwrap_or(0);
    debug_assert_eq!((ENV_RUN_ID, ENV_VNODE), ("SPLITOS_RUN_ID", "SPLITOS_VNODE"));
    REGION_SIZE.store(size & !(PAGE - 1), Relaxed);
    // mimalloc's default reserve would commit a GiB of an mComponent per process.
    libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_RESERVE, 64 * 1024);
    setup_region(0);
    true
}

unsafe fn high_fd(fd: c_int) -> c_int {
    let h = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, HIGH_FD);
    if h < 0 {
        return fd;
    }
    libc::close(fd);
    h
}

/// Maps the region, registers it with a fresh userfaultfd and introduces this process to the
/// pComponent. `fork_token` is non-zero in a forked child.
unsafe fn setup_region(fork_token: u64) {
    let size = REGION_SIZE.load(Relaxed);
    let memfd = libc::syscall(libc::SYS_memfd_create, c"splitos-heap".as_ptr(), libc::MFD_CLOEXEC) as c_int;
    if memfd < 0 || libc::ftruncate(memfd, size as off_t) != 0 {
        die(&[b"cannot create the heap memfd"]);
    }
    let flags = libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE | libc::MAP_NORESERVE;
    let p = raw_mmap(REGION_BASE, size, libc::PROT_NONE, flags, memfd, 0);
    if p as u64 != REGION_BASE {
        die(&[b"the heap region address range is already in use in this program"]);
    }
    // A child gets a region of its own from the mComponents' copy, never the parent's pages.
    libc::syscall(libc::SYS_madvise, REGION_BASE, size, libc::MADV_DONTFORK);
    let uffd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) as c_int;
    if uffd < 0 {
        die(&[b"userfaultfd is not available (needs root or vm.unprivileged_userfaultfd=1)"]);
    }
    let mut api = uffd::Api { api: uffd::UFFD_API, features: uffd::FEATURE_MISSING_SHMEM | uffd::FEATURE_WP_HUGETLBFS_SHMEM, ioctls: 0 };
    if libc::ioctl(uffd, uffd::UFFDIO_API as _, &mut api) != 0 {
        die(&[b"this kernel's userfaultfd lacks missing and write-protect faults on shared memory"]);
    }
    register_range(uffd, REGION_BASE, size);
    let memfd = high_fd(memfd);
    let uffd = high_fd(uffd);
    MEMFD.store(memfd, Relaxed);
    UFFD.store(uffd, Relaxed);
    connect_and_hello(uffd, memfd, fork_token);
}

unsafe fn register_range(uffd: c_int, start: u64, len: u64) {
    let mut reg = uffd::Register {
        range: uffd::Range { start, len },
        mode: uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP,
        ioctls: 0,
    };
    if libc::ioctl(uffd, uffd::UFFDIO_REGISTER as _, &mut reg) != 0 {
        die(&[b"cannot register the heap region with userfaultfd"]);
    }
}

unsafe fn connect_and_hello(uffd: c_int, memfd: c_int, fork_token: u64) {
    let path = until_nul(&env().sock);
    let sock = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
    let mut sa: libc::sockaddr_un = core::mem::zeroed();
    sa.sun_family = libc::AF_UNIX as _;
    if sock < 0 || path.len() >= sa.sun_path.len() {
        die(&[b"bad pComponent socket path ", path]);
    }
    for (i, b) in path.iter().enumerate() {
        sa.sun_path[i] = *b as c_char;
    }
    if libc::connect(sock, &sa as *const _ as *const libc::sockaddr, core::mem::size_of::<libc::sockaddr_un>() as u32) != 0 {
        die(&[b"cannot reach the pComponent at ", path, b" (is the cluster up?)"]);
    }
    let sock = high_fd(sock);
    SOCK.store(sock, Relaxed);

    let hello = Hello {
        abi: splitos_shim_abi::SHIM_ABI_VERSION,
        _pad: 0,
        region_base: REGION_BASE,
        region_size: REGION_SIZE.load(Relaxed),
        fork_token,
        run_id: env().run_id,
        os_pid: libc::getpid() as u64,
        vnode: env().vnode,
    };

    let fds = [uffd, memfd];
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec { iov_base: &hello as *const _ as *mut c_void, iov_len: core::mem::size_of::<Hello>() };
    let mut msg: libc::msghdr = core::mem::zeroed();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut c_void;
    msg.msg_controllen = libc::CMSG_SPACE(core::mem::size_of_val(&fds) as u32) as _;
    let c = libc::CMSG_FIRSTHDR(&msg);
    (*c).cmsg_level = libc::SOL_SOCKET;
    (*c).cmsg_type = libc::SCM_RIGHTS;
    (*c).cmsg_len = libc::CMSG_LEN(core::mem::size_of_val(&fds) as u32) as _;
    core::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c) as *mut c_int, 2);
    if libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) != core::mem::size_of::<Hello>() as isize {
        die(&[b"cannot introduce this process to the pComponent"]);
    }
    let mut resp = ShimResp::default();
    if !read_all(sock, as_bytes_mut(&mut resp)) {
        die(&[b"the pComponent closed the connection during the hello"]);
    }
    if resp.ret < 0 {
        let mut b = [0u8; 20];
        die(&[b"the pComponent refused this process (errno ", fmt_u64((-resp.ret) as u64, &mut b), b")"]);
    }
    for _ in 0..resp.val2 {
        let mut v = VmaRec::default();
        if !read_all(sock, as_bytes_mut(&mut v)) {
            die(&[b"the pComponent closed the connection while sending the forked address space"]);
        }
        if v.prot != 0 && raw_mprotect(v.start, v.end - v.start, v.prot as c_int) != 0 {
            die(&[b"cannot restore protections of the forked address space"]);
        }
    }
}

unsafe fn read_all(fd: c_int, buf: &mut [u8]) -> bool {
    let mut got = 0;
    while got < buf.len() {
        let n = libc::read(fd, buf[got..].as_mut_ptr() as *mut c_void, buf.len() - got);
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

unsafe fn write_all(fd: c_int, buf: &[u8]) -> bool {
    let mut put = 0;
    while put < buf.len() {
        let n = libc::send(fd, buf[put..].as_ptr() as *const c_void, buf.len() - put, libc::MSG_NOSIGNAL);
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

unsafe fn request_locked(req: &ShimReq) -> ShimResp {
    let sock = SOCK.load(Relaxed);
    let mut resp = ShimResp::default();
    if !write_all(sock, as_bytes(req)) || !read_all(sock, as_bytes_mut(&mut resp)) {
        die(&[b"lost the connection to the pComponent; the heap is unreachable"]);
    }
    resp
}

fn request(op: Op, a: u64, b: u64, c: u64, d: u64, e: u64) -> ShimResp {
    let req = ShimReq { op: op as u32, _pad: 0, a, b, c, d, e };
    spin_lock(&LOCK);
    let r = unsafe { request_locked(&req) };
    spin_unlock(&LOCK);
    r
}

/// An anonymous private read/write mapping without exec is heap; everything else (files,
/// shared memory, stacks, JIT code) stays with the local kernel.
fn is_heap_mapping(prot: c_int, flags: c_int, fd: c_int) -> bool {
    let anon_private = flags & libc::MAP_ANONYMOUS != 0 && flags & libc::MAP_TYPE == libc::MAP_PRIVATE;
    let excluded = libc::MAP_HUGETLB | libc::MAP_GROWSDOWN | libc::MAP_STACK;
    anon_private && flags & excluded == 0 && prot & libc::PROT_EXEC == 0 && (fd == -1 || flags & libc::MAP_ANONYMOUS != 0)
}

fn region_mmap(hint: u64, len: u64, prot: c_int, fixed: bool) -> Result<u64, c_int> {
    let r = request(Op::Mmap, hint, len, prot as u64, if fixed { MMAP_FIXED } else { 0 }, 0);
    if r.ret < 0 {
        return Err((-r.ret) as c_int);
    }
    if fixed && hint != r.val {
        return Err(libc::ENOMEM);
    }
    if prot != libc::PROT_NONE && unsafe { raw_mprotect(r.val, len, prot) } != 0 {
        return Err(errno());
    }
    Ok(r.val)
}

/// Puts region pages back under our memfd mapping after a foreign mapping replaced them.
unsafe fn restore_region_backing(addr: u64, len: u64) {
    let flags = libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_NORESERVE;
    let p = raw_mmap(addr, len, libc::PROT_NONE, flags, MEMFD.load(Relaxed), (addr - REGION_BASE) as off_t);
    if p as u64 != addr {
        die(&[b"cannot restore the heap region after a foreign mapping"]);
    }
    libc::syscall(libc::SYS_madvise, addr, len, libc::MADV_DONTFORK);
    register_range(UFFD.load(Relaxed), addr, len);
}

#[no_mangle]
pub unsafe extern "C" fn mmap(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    let a = addr as u64;
    let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0;
    if !is_heap_mapping(prot, flags, fd) || !ready() || (fixed && !in_region(a, len as u64)) {
        if fixed && overlaps_region(a, len as u64) && ready() {
            // A file or executable mapping placed over heap the program reserved (a JIT's code
            // cache, a JVM's class archive): the kernel replaces those pages, so the
            // mComponents drop their contents but keep the range reserved (an inaccessible,
            // unaccounted area) so that it is never handed out again while the foreign mapping
            // lives. The program's munmap of it gives the range back.
            let start = a.max(REGION_BASE);
            let end = page_up((a + len as u64).min(REGION_BASE + REGION_SIZE.load(Relaxed))).unwrap_or(0);
            let r = request(Op::Mmap, start, end - start, libc::PROT_NONE as u64, MMAP_FIXED, 0);
            if r.ret < 0 {
                set_errno((-r.ret) as c_int);
                return libc::MAP_FAILED;
            }
        }
        return raw_mmap(a, len as u64, prot, flags, fd, off);
    }
    let Some(len) = page_up(len as u64).filter(|l| *l > 0) else {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    };
    if flags & libc::MAP_FIXED_NOREPLACE != 0 {
        match region_mmap(a, len, prot, false) {
            Ok(got) if got == a => return got as *mut c_void,
            Ok(got) => {
                munmap(got as *mut c_void, len as size_t);
                set_errno(libc::EEXIST);
                return libc::MAP_FAILED;
            }
            Err(e) => {
                set_errno(e);
                return libc::MAP_FAILED;
            }
        }
    }
    match region_mmap(a, len, prot, fixed) {
        Ok(p) => p as *mut c_void,
        Err(e) => {
            set_errno(e);
            libc::MAP_FAILED
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(addr: *mut c_void, len: size_t, prot: c_int, flags: c_int, fd: c_int, off: off_t) -> *mut c_void {
    mmap(addr, len, prot, flags, fd, off)
}

#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    let a = addr as u64;
    if STATE.load(Acquire) != READY || !overlaps_region(a, len as u64) {
        return libc::syscall(libc::SYS_munmap, a, len) as c_int;
    }
    if !a.is_multiple_of(PAGE) || len == 0 || !in_region(a, len as u64) {
        set_errno(libc::EINVAL);
        return -1;
    }
    let len = page_up(len as u64).unwrap_or(0);
    // If a foreign mapping sits here, put our backing back first; then nothing can touch the
    // pages while the pComponent drops them.
    restore_region_backing(a, len);
    let r = request(Op::Munmap, a, len, 0, 0, 0);
    if r.ret < 0 {
        set_errno((-r.ret) as c_int);
        return -1;
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: size_t, prot: c_int) -> c_int {
    let a = addr as u64;
    if STATE.load(Acquire) != READY || !in_region(a, len as u64) {
        return raw_mprotect(a, len as u64, prot);
    }
    let len = page_up(len as u64).unwrap_or(0);
    let r = request(Op::Mprotect, a, len, prot as u64, 0, 0);
    if r.ret < 0 {
        set_errno((-r.ret) as c_int);
        return -1;
    }
    raw_mprotect(a, len, prot)
}

#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    let a = addr as u64;
    if STATE.load(Acquire) != READY || !in_region(a, len as u64) {
        return libc::syscall(libc::SYS_madvise, a, len, advice) as c_int;
    }
    if !a.is_multiple_of(PAGE) {
        set_errno(libc::EINVAL);
        return -1;
    }
    match advice {
        libc::MADV_DONTNEED | libc::MADV_FREE | libc::MADV_REMOVE => {
            let len = page_up(len as u64).unwrap_or(0);
            let r = request(Op::Dontneed, a, len, 0, 0, 0);
            if r.ret < 0 {
                set_errno((-r.ret) as c_int);
                return -1;
            }
            0
        }
        // Placement hints mean nothing for memory that lives on mComponents.
        _ => 0,
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    if advice == libc::POSIX_MADV_DONTNEED && STATE.load(Acquire) == READY && in_region(addr as u64, len as u64) {
        // POSIX_MADV_DONTNEED must not discard contents (unlike MADV_DONTNEED).
        return 0;
    }
    if madvise(addr, len, advice) == 0 {
        0
    } else {
        errno()
    }
}

/// `mremap` is variadic in C; on x86-64 the optional fifth argument is simply the next
/// register, read only when MREMAP_FIXED says it was passed.
#[no_mangle]
pub unsafe extern "C" fn mremap(old: *mut c_void, old_len: size_t, new_len: size_t, flags: c_int, new_addr: *mut c_void) -> *mut c_void {
    let o = old as u64;
    if STATE.load(Acquire) != READY || !overlaps_region(o, old_len as u64) {
        return libc::syscall(libc::SYS_mremap, o, old_len, new_len, flags, new_addr) as *mut c_void;
    }
    let (Some(ol), Some(nl)) = (page_up(old_len as u64), page_up(new_len as u64)) else {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    };
    if !o.is_multiple_of(PAGE) || nl == 0 || !in_region(o, ol) {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    let fixed = flags & libc::MREMAP_FIXED != 0;
    if fixed && !in_region(new_addr as u64, nl) {
        set_errno(libc::EINVAL);
        return libc::MAP_FAILED;
    }
    let mut f = 0;
    if flags & libc::MREMAP_MAYMOVE != 0 {
        f |= splitos_shim_abi::MREMAP_MAYMOVE;
    }
    if fixed {
        f |= splitos_shim_abi::MREMAP_FIXED;
    }
    let r = request(Op::Mremap, o, ol, nl, f, new_addr as u64);
    if r.ret < 0 {
        set_errno((-r.ret) as c_int);
        return libc::MAP_FAILED;
    }
    let (new, prot) = (r.val, r.val2 as c_int);
    if new != o {
        raw_mprotect(o, ol, libc::PROT_NONE);
        raw_mprotect(new, nl, prot);
    } else if nl > ol {
        raw_mprotect(o + ol, nl - ol, prot);
    } else if nl < ol {
        raw_mprotect(o + nl, ol - nl, libc::PROT_NONE);
    }
    new as *mut c_void
}

unsafe fn native_sbrk(inc: isize) -> *mut c_void {
    let cur = libc::syscall(libc::SYS_brk, 0) as isize;
    if inc == 0 {
        return cur as *mut c_void;
    }
    let want = cur + inc;
    if libc::syscall(libc::SYS_brk, want) as isize != want {
        set_errno(libc::ENOMEM);
        return usize::MAX as *mut c_void;
    }
    cur as *mut c_void
}

/// The program break, emulated inside a reserved stretch of the region.
#[no_mangle]
pub unsafe extern "C" fn sbrk(inc: isize) -> *mut c_void {
    if !ready() {
        return native_sbrk(inc);
    }
    spin_lock(&BRK_LOCK);
    let r = sbrk_locked(inc);
    spin_unlock(&BRK_LOCK);
    match r {
        Ok(old) => old as *mut c_void,
        Err(e) => {
            set_errno(e);
            usize::MAX as *mut c_void
        }
    }
}

unsafe fn sbrk_locked(inc: isize) -> Result<u64, c_int> {
    if BRK_BASE.load(Relaxed) == 0 {
        let base = region_mmap(0, BRK_RESERVE, libc::PROT_NONE, false)?;
        BRK_BASE.store(base, Relaxed);
        BRK_CUR.store(base, Relaxed);
        BRK_TOP.store(base, Relaxed);
    }
    let (base, cur, top) = (BRK_BASE.load(Relaxed), BRK_CUR.load(Relaxed), BRK_TOP.load(Relaxed));
    let new = cur.checked_add_signed(inc as i64).ok_or(libc::ENOMEM)?;
    if new < base || new > base + BRK_RESERVE {
        return Err(libc::ENOMEM);
    }
    let new_top = page_up(new).ok_or(libc::ENOMEM)?;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    if new_top > top {
        if mprotect((top) as *mut c_void, (new_top - top) as size_t, rw) != 0 {
            return Err(libc::ENOMEM);
        }
    } else if new_top < top {
        madvise(new_top as *mut c_void, (top - new_top) as size_t, libc::MADV_DONTNEED);
        mprotect(new_top as *mut c_void, (top - new_top) as size_t, libc::PROT_NONE);
    }
    BRK_TOP.store(new_top, Relaxed);
    BRK_CUR.store(new, Relaxed);
    Ok(cur)
}

#[no_mangle]
pub unsafe extern "C" fn brk(addr: *mut c_void) -> c_int {
    if !ready() {
        return if libc::syscall(libc::SYS_brk, addr) as u64 == addr as u64 {
            0
        } else {
            set_errno(libc::ENOMEM);
            -1
        };
    }
    sbrk(0);
    let cur = BRK_CUR.load(Relaxed) as i64;
    if sbrk((addr as i64 - cur) as isize) as usize == usize::MAX {
        -1
    } else {
        0
    }
}

type ForkFn = unsafe extern "C" fn() -> pid_t;

unsafe fn real_fork() -> ForkFn {
    let mut f = REAL_FORK.load(Relaxed);
    if f == 0 {
        f = libc::dlsym(libc::RTLD_NEXT, c"fork".as_ptr()) as usize;
        REAL_FORK.store(f, Relaxed);
    }
    core::mem::transmute::<usize, ForkFn>(f)
}

/// fork without exec: the pComponent writes back the parent's dirty lines and the home
/// mComponent copies the whole address space for the child, which then maps a fresh region
/// and fetches from that copy.
#[no_mangle]
pub unsafe extern "C" fn fork() -> pid_t {
    let real = real_fork();
    if !ready() {
        return real();
    }
    spin_lock(&LOCK);
    let r = request_locked(&ShimReq { op: Op::ForkPrepare as u32, ..Default::default() });
    if r.ret < 0 {
        spin_unlock(&LOCK);
        set_errno((-r.ret) as c_int);
        return -1;
    }
    FORK_TOKEN.store(r.val, Release);
    let pid = real();
    if pid == 0 {
        if FORK_TOKEN.load(Acquire) != 0 {
            child_after_fork();
        }
        spin_unlock(&LOCK);
        return 0;
    }
    FORK_TOKEN.store(0, Release);
    if pid < 0 {
        let e = errno();
        request_locked(&ShimReq { op: Op::ForkAbort as u32, a: r.val, ..Default::default() });
        set_errno(e);
    }
    spin_unlock(&LOCK);
    pid
}

/// Runs first among the child's fork handlers (registered at load), so that handlers of other
/// libraries already find a heap.
unsafe extern "C" fn child_after_fork() {
    let token = FORK_TOKEN.swap(0, AcqRel);
    if token == 0 {
        if STATE.load(Acquire) == READY {
            // A fork that did not go through us: the child has no heap to run on.
            die(&[b"this program forked through a path the shim does not cover; the child has no heap"]);
        }
        return;
    }
    for fd in [SOCK.load(Relaxed), UFFD.load(Relaxed), MEMFD.load(Relaxed)] {
        libc::close(fd);
    }
    setup_region(token);
}

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: unsafe extern "C" fn() = constructor;

unsafe extern "C" fn constructor() {
    real_fork();
    libc::pthread_atfork(None, None, Some(child_after_fork));
    ready();
}
