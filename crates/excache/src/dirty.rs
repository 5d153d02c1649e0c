//! Dirty tracking by the kernel (`dirty_tracking = "scan"`): the program's userfaultfd has
//! asynchronous write protection (UFFD_FEATURE_WP_ASYNC), so a write to a protected line lifts
//! the protection inside the kernel (about 1.3 µs) instead of trapping to the pComponent (about
//! 10.5 µs), and PAGEMAP_SCAN on the program's /proc/PID/pagemap tells which pages were written
//! since they were last protected (PAGE_IS_WRITTEN), protecting them again in the same step if
//! asked (PM_SCAN_WP_MATCHING). Every line a read fills is installed protected (lines a write
//! fills are dirty from the start, as in fault mode); the miss path learns whether it was
//! written when it evicts it, writes it back ([`Tracker::written`]) or asks CLOCK's question
//! (was it used since its reference bit was cleared?). A clean line is dropped without a
//! write-back even in a process whose reads are mostly followed by writes.
//!
//! ## Why no write is lost
//! With synchronous write protection, protecting a page and then copying it is a barrier: a
//! write after the protection waits in the pComponent until the page is gone. With asynchronous
//! protection nothing waits, so eviction uses the one step that does stop writers, the hole
//! punch in the program's memfd, and learns everything it needs after it ([`Tracker::take`]):
//! 1. splice the page from the memfd into a pipe: the pipe now holds a reference to the page
//!    cache page itself, not a copy (shared memory's splice is zero-copy);
//! 2. punch the page out of the memfd: the kernel unmaps it from the program (flushing every
//!    CPU's TLB) and drops it from the page cache. A write that lands before the unmap is in the
//!    page the pipe holds; any access after it faults as missing and waits in the miss path,
//!    which holds the line in flight until its write-back is acknowledged;
//! 3. PAGEMAP_SCAN the page: the unmap left a write-protect marker in the page table if the
//!    page was still protected (not written since its last protection) and nothing if it was
//!    written; the scan reports the second as PAGE_IS_WRITTEN. Nothing can change that entry
//!    before the scan: the page is gone from the memfd and the miss path's lock is held;
//! 4. read the page out of the pipe if it was written (or the caller wants it anyway), else
//!    drop it.
//!
//! A line the miss path already knows to be dirty needs no question: steps 1, 2 and 4 alone.
//!
//! The written bit is exact at the moment the program lost the page, and the contents are
//! those of that moment. The bookkeeping bit `dirty` carries what a scan took out of the page
//! table: a scan that protects a written page again marks its line dirty first.
//!
//! What the design relies on is checked: the kernel features when the pComponent starts
//! ([`check_kernel`]), that the program's heap is under asynchronous protection when it says
//! hello ([`Tracker::open`]), and the splice, unmap and marker behaviour by a test on the real
//! kernel (`the_kernel_does_what_take_relies_on`). A partial punch of a large page cache folio
//! would zero the range inside the folio the pipe holds instead of dropping it, so scan mode
//! refuses to run where shared memory may use large folios.
//!
//! ## Access bits
//! This kernel offers no cheap way to see reads: pagemap has no accessed bit, there is no idle
//! page tracking and no MGLRU; /proc/PID/clear_refs with smaps walks the whole process; DAMON's
//! physical-address monitoring samples regions through sysfs at millisecond intervals, far
//! coarser than one line. Only writes are seen, as in fault mode.
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

use splitos_shim_abi::uffd;

use super::store::Page;
use crate::uffd::{punch, PAGE};
use splitos_core::config::DirtyTracking;

/// The userfaultfd features a program's shim must ask for to track its writes as `tracking` says.
pub fn uffd_features(tracking: DirtyTracking) -> u64 {
    match tracking {
        DirtyTracking::Fault => 0,
        DirtyTracking::Scan => uffd::FEATURE_WP_ASYNC,
    }
}

const PAGEMAP_SCAN: u64 = 0xc060_6610;
const PAGE_IS_WPALLOWED: u64 = 1 << 0;
const PAGE_IS_WRITTEN: u64 = 1 << 1;
const PAGE_IS_PRESENT: u64 = 1 << 3;
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
/// Written runs one PAGEMAP_SCAN call reports before the range is walked on.
const RUNS: usize = 64;

/// `struct page_region`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRun {
    start: u64,
    end: u64,
    categories: u64,
}

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Default)]
struct ScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

const _: () = assert!(std::mem::size_of::<ScanArg>() == 96 && PAGEMAP_SCAN >> 16 & 0x3fff == 96);
const _: () = assert!(std::mem::size_of::<PageRun>() == 24);

/// Walks the program's page tables over the virtual pages [first, end) and returns the pages
/// whose categories include any of `anyof` (with PM_SCAN_WP_MATCHING in `flags`, protecting
/// them in the same walk).
fn scan(pagemap: &File, first: u64, end: u64, flags: u64, anyof: u64) -> io::Result<Vec<u64>> {
    let mut found = Vec::new();
    let mut runs = [PageRun::default(); RUNS];
    let (mut at, stop) = (first * PAGE, end * PAGE);
    while at < stop {
        let mut a = ScanArg {
            size: std::mem::size_of::<ScanArg>() as u64,
            flags,
            start: at,
            end: stop,
            vec: runs.as_mut_ptr() as u64,
            vec_len: RUNS as u64,
            category_anyof_mask: anyof,
            return_mask: anyof,
            ..ScanArg::default()
        };
        // SAFETY: `a` is a pm_scan_arg (size asserted) whose output vector `runs` is writable
        // for `vec_len` entries for the whole call; the ioctl reads the program's page tables.
        let n = unsafe { libc::ioctl(pagemap.as_raw_fd(), PAGEMAP_SCAN as _, &mut a) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        for r in &runs[..n as usize] {
            found.extend(r.start / PAGE..r.end / PAGE);
        }
        // A full output vector ends the walk early; it goes on where it stopped.
        if a.walk_end <= at {
            return Err(io::Error::other("PAGEMAP_SCAN made no progress"));
        }
        at = a.walk_end;
    }
    Ok(found)
}

/// The pages of [first, end) written since they were last protected (`protect`: protected
/// again in the same walk). The kernel counts a page that is not mapped as written, and
/// protecting one maps page tables for it: callers scan lines they hold, not holes.
fn written(pagemap: &File, first: u64, end: u64, protect: bool) -> io::Result<Vec<u64>> {
    scan(
        pagemap,
        first,
        end,
        if protect { PM_SCAN_WP_MATCHING } else { 0 },
        PAGE_IS_WRITTEN,
    )
}

/// The pages of [first, end) mapped in the program: of those access sampling unmapped
/// (MADV_PAGEOUT keeps them in the memfd), the ones the program touched since.
pub fn present(pagemap: &File, first: u64, end: u64) -> io::Result<Vec<u64>> {
    scan(pagemap, first, end, 0, PAGE_IS_PRESENT)
}

/// Which pages [`Tracker::take`] hands back the contents of.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Keep {
    /// Those written since their last protection.
    Written,
    /// All of them, telling which were written.
    All,
    /// All of them, all counted as written: the caller writes them all back anyway, so the
    /// kernel is not asked.
    Dirty,
}

/// What eviction learned about one page it took from the program.
pub struct Taken {
    pub vpn: u64,
    /// Written between its last protection and the moment the program lost it.
    pub written: bool,
    /// Its contents at that moment, if written or asked for.
    pub data: Option<Page>,
}

/// A program's page tables as the pComponent reads them, and the pipe eviction holds pages in.
pub struct Tracker {
    pagemap: File,
    taker: Taker,
}

/// Takes pages out of a program's memfd with their contents in one step (steps 1, 2 and 4 of
/// the module documentation): the pipe the pages wait in between the splice and the read.
/// With write faults tracking dirtiness, this takes a dirty victim out with one TLB flush, the
/// punch's, where write-protecting it for the copy cost a second.
pub struct Taker {
    /// Created on first use and again after any error (which may leave pages in it).
    pipe: Mutex<Option<Pipe>>,
}

impl Taker {
    /// A taker for a heap whose pages are all small; `None` where a page of the heap may be
    /// part of a large folio, whose partial punch would zero the page the pipe holds.
    pub fn for_heap(huge_pages: bool) -> Option<Taker> {
        (!huge_pages && crate::huge::shmem_thp().large_folios.is_none()).then(|| Taker { pipe: Mutex::new(None) })
    }

    /// As [`Tracker::take`]; without the program's page tables (`pagemap`) only
    /// [`Keep::Dirty`] can be answered.
    pub fn take(
        &self,
        memfd: &OwnedFd,
        off: u64,
        vpn: u64,
        pages: u64,
        pagemap: Option<&File>,
        keep: Keep,
    ) -> io::Result<Vec<Taken>> {
        if pagemap.is_none() && keep != Keep::Dirty {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "which pages were written is known only from the page tables",
            ));
        }
        let mut slot = self.pipe.lock().unwrap();
        let r = take_with(&mut slot, memfd, off, vpn, pages, pagemap, keep);
        if r.is_err() {
            *slot = None;
        }
        r
    }
}

fn dev_null() -> io::Result<&'static File> {
    static NULL: OnceLock<File> = OnceLock::new();
    if let Some(f) = NULL.get() {
        return Ok(f);
    }
    let f = std::fs::OpenOptions::new().write(true).open("/dev/null")?;
    Ok(NULL.get_or_init(|| f))
}

/// A pipe, non-blocking at both ends, and how many pages it holds.
struct Pipe {
    r: OwnedFd,
    w: OwnedFd,
    pages: u64,
}

fn new_pipe() -> io::Result<Pipe> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two fresh descriptors that nothing else owns.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: F_GETPIPE_SZ takes no pointer.
    let bytes = unsafe { libc::fcntl(w.as_raw_fd(), libc::F_GETPIPE_SZ) };
    if bytes < PAGE as i32 {
        return Err(io::Error::last_os_error());
    }
    Ok(Pipe {
        r,
        w,
        pages: bytes as u64 / PAGE,
    })
}

fn splice_in(memfd: &OwnedFd, off: u64, len: u64, w: &OwnedFd) -> io::Result<()> {
    let (mut off, mut left) = (off as i64, len as usize);
    while left > 0 {
        // SAFETY: splice reads the memfd at `off` (updated by the kernel) into the pipe; the
        // only pointer is to `off`, live for the call.
        let n = unsafe {
            libc::splice(
                memfd.as_raw_fd(),
                &mut off,
                w.as_raw_fd(),
                std::ptr::null_mut(),
                left,
                libc::SPLICE_F_NONBLOCK,
            )
        };
        if n <= 0 {
            return Err(if n == 0 {
                io::Error::other("the heap memfd ended early")
            } else {
                io::Error::last_os_error()
            });
        }
        left -= n as usize;
    }
    Ok(())
}

/// Moves the next page out of the pipe: into a buffer if `keep`, else nowhere.
fn page_out(r: &OwnedFd, keep: bool) -> io::Result<Option<Page>> {
    if !keep {
        // SAFETY: splice moves a page from the pipe to /dev/null; no pointers.
        let n = unsafe {
            libc::splice(
                r.as_raw_fd(),
                std::ptr::null_mut(),
                dev_null()?.as_raw_fd(),
                std::ptr::null_mut(),
                PAGE as usize,
                0,
            )
        };
        return if n == PAGE as isize {
            Ok(None)
        } else {
            Err(io::Error::last_os_error())
        };
    }
    let mut page = vec![0u8; PAGE as usize];
    let mut got = 0;
    while got < page.len() {
        // SAFETY: reads into the unfilled tail of `page`, live and exclusively borrowed.
        let n = unsafe { libc::read(r.as_raw_fd(), page[got..].as_mut_ptr() as *mut _, page.len() - got) };
        if n <= 0 {
            return Err(io::Error::last_os_error());
        }
        got += n as usize;
    }
    Ok(Some(page))
}

impl Tracker {
    /// Opens the page tables of the program `os_pid` and checks that its heap at `region_base`
    /// is under asynchronous write protection.
    pub fn open(os_pid: i32, region_base: u64) -> io::Result<Tracker> {
        if let Some(why) = crate::huge::shmem_thp().large_folios.clone() {
            return Err(io::Error::other(format!(
                "shared memory may use large pages now ({why})"
            )));
        }
        let pagemap = File::open(format!("/proc/{os_pid}/pagemap"))?;
        let first = region_base / PAGE;
        // PAGE_IS_WPALLOWED: mapped in a range registered with asynchronous protection.
        if scan(&pagemap, first, first + 1, 0, PAGE_IS_WPALLOWED)? != [first] {
            return Err(io::Error::other("its heap is not under asynchronous write protection"));
        }
        Ok(Tracker {
            pagemap,
            taker: Taker { pipe: Mutex::new(None) },
        })
    }

    /// The pages of [first, end) written since they were last protected, protected again in
    /// the same step: a write after it shows in the next scan. Every page of the range should
    /// be a line the caller holds (a page never mapped counts as written).
    pub fn written(&self, first: u64, end: u64) -> io::Result<Vec<u64>> {
        written(&self.pagemap, first, end, true)
    }

    /// Drops [vpn, vpn + pages) from the program (at byte `off` of its memfd) and tells for
    /// each page whether it was written since it was last protected, with the contents `keep`
    /// asks for (see the module documentation for why no write is lost). On an error some of
    /// the pages may be gone without their contents: the caller treats them as lost.
    pub fn take(&self, memfd: &OwnedFd, off: u64, vpn: u64, pages: u64, keep: Keep) -> io::Result<Vec<Taken>> {
        self.taker.take(memfd, off, vpn, pages, Some(&self.pagemap), keep)
    }
}

fn take_with(
    slot: &mut Option<Pipe>,
    memfd: &OwnedFd,
    off: u64,
    vpn: u64,
    pages: u64,
    pagemap: Option<&File>,
    keep: Keep,
) -> io::Result<Vec<Taken>> {
    if slot.is_none() {
        *slot = Some(new_pipe()?);
    }
    let pipe = slot.as_ref().expect("made above");
    let mut out = Vec::with_capacity(pages as usize);
    let mut done = 0;
    while done < pages {
        let (first, n) = (vpn + done, pipe.pages.min(pages - done));
        let at = off + done * PAGE;
        splice_in(memfd, at, n * PAGE, &pipe.w)?;
        punch(memfd, at, n * PAGE)?;
        // Unknown is written: a write-back too many, never one too few.
        let asked = match pagemap {
            Some(pm) if keep != Keep::Dirty => written(pm, first, first + n, false).map_err(drop),
            _ => Err(()),
        };
        let written = asked.unwrap_or_else(|()| (first..first + n).collect());
        for v in first..first + n {
            let w = written.binary_search(&v).is_ok();
            out.push(Taken {
                vpn: v,
                written: w,
                data: page_out(&pipe.r, w || keep != Keep::Written)?,
            });
        }
        done += n;
    }
    Ok(out)
}

/// Why this machine cannot track dirty lines by scan.
#[derive(Debug, thiserror::Error)]
pub enum NoScan {
    #[error("userfaultfd is not available: {0}")]
    NoUserfaultfd(io::Error),
    #[error(
        "this kernel's userfaultfd has no asynchronous write protection (UFFD_FEATURE_WP_ASYNC, Linux 6.7 or later)"
    )]
    NoAsyncWriteProtect,
    #[error("cannot open /proc/self/pagemap: {0}")]
    Pagemap(io::Error),
    #[error("this kernel has no PAGEMAP_SCAN on /proc/PID/pagemap (Linux 6.7 or later): {0}")]
    NoPagemapScan(io::Error),
    #[error("shared memory may use large pages here ({0}), and punching one page out of a large page would lose the writes scan mode captures; set them to never or advise")]
    LargeFolios(String),
}

/// Why this machine cannot track dirty lines by scan, if it cannot.
pub fn check_kernel() -> Result<(), NoScan> {
    // SAFETY: userfaultfd(2) only creates a descriptor, owned below.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(NoScan::NoUserfaultfd(io::Error::last_os_error()));
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut api = uffd::Api {
        api: uffd::UFFD_API,
        features: 0,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API reads and writes a uffdio_api; asked for no feature, it reports all.
    if unsafe { libc::ioctl(fd.as_raw_fd(), uffd::UFFDIO_API as _, &mut api) } != 0
        || api.features & uffd::FEATURE_WP_ASYNC == 0
    {
        return Err(NoScan::NoAsyncWriteProtect);
    }
    let pagemap = File::open("/proc/self/pagemap").map_err(NoScan::Pagemap)?;
    let here = &api as *const _ as u64 / PAGE;
    written(&pagemap, here, here + 1, false).map_err(NoScan::NoPagemapScan)?;
    if let Some(why) = crate::huge::shmem_thp().large_folios.clone() {
        return Err(NoScan::LargeFolios(why));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;

    use super::*;

    /// A heap region like a shim's, in this test process: a memfd mapped shared and
    /// registered with a userfaultfd with asynchronous write protection.
    struct Heap {
        uffd: OwnedFd,
        memfd: OwnedFd,
        base: u64,
        pages: u64,
    }

    impl Heap {
        fn new(pages: u64) -> Heap {
            Heap::with(pages, uffd::FEATURE_WP_ASYNC)
        }

        /// With write protection as `features` ask (0: a write to a protected page would wait
        /// for a fault message nobody reads).
        fn with(pages: u64, features: u64) -> Heap {
            let len = pages * PAGE;
            // SAFETY: creates and sizes a file, maps it at an address the kernel picks, and
            // creates a userfaultfd; every result is checked.
            unsafe {
                let m = libc::memfd_create(c"dirty-test".as_ptr(), libc::MFD_CLOEXEC);
                assert!(m >= 0 && libc::ftruncate(m, len as i64) == 0);
                let memfd = OwnedFd::from_raw_fd(m);
                let p = libc::mmap(
                    std::ptr::null_mut(),
                    len as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    m,
                    0,
                );
                assert_ne!(p, libc::MAP_FAILED);
                let u = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) as i32;
                assert!(u >= 0, "userfaultfd: {}", io::Error::last_os_error());
                let uffd = OwnedFd::from_raw_fd(u);
                let mut api = uffd::Api {
                    api: uffd::UFFD_API,
                    features: uffd::FEATURE_MISSING_SHMEM | uffd::FEATURE_WP_HUGETLBFS_SHMEM | features,
                    ioctls: 0,
                };
                assert_eq!(libc::ioctl(u, uffd::UFFDIO_API as _, &mut api), 0);
                let mut reg = uffd::Register {
                    range: uffd::Range { start: p as u64, len },
                    mode: uffd::REGISTER_MODE_MISSING | uffd::REGISTER_MODE_WP,
                    ioctls: 0,
                };
                assert_eq!(libc::ioctl(u, uffd::UFFDIO_REGISTER as _, &mut reg), 0);
                Heap {
                    uffd,
                    memfd,
                    base: p as u64,
                    pages,
                }
            }
        }
        fn vpn(&self, i: u64) -> u64 {
            self.base / PAGE + i
        }
        /// Installs page `i` filled with `b`, write-protected.
        fn install(&self, i: u64, b: u8) {
            let data = vec![b; PAGE as usize];
            let r = crate::uffd::copy(&self.uffd, self.base + i * PAGE, &data, true).unwrap();
            assert!(matches!(r, crate::uffd::Install::Done));
        }
        /// Writes `b` at `at` in page `i` (resident: no fault message is needed).
        fn write(&self, i: u64, at: usize, b: u8) {
            // SAFETY: page `i` of the mapping is resident (installed); a protected page is
            // unprotected by the kernel without a message.
            unsafe { std::ptr::write_volatile(((self.base + i * PAGE) as *mut u8).add(at), b) };
        }
    }

    impl Drop for Heap {
        fn drop(&mut self) {
            // SAFETY: unmaps the mapping made in `new`, which nothing references any more.
            unsafe { libc::munmap(self.base as *mut _, (self.pages * PAGE) as usize) };
        }
    }

    /// This process's tracker, checked against the heap as a program's is at its hello.
    fn tracker(h: &Heap) -> Tracker {
        Tracker::open(std::process::id() as i32, h.base).unwrap()
    }

    #[test]
    fn scans_report_written_pages_once_and_take_returns_what_was_written() {
        let h = Heap::new(8);
        let t = tracker(&h);
        for i in 0..8 {
            h.install(i, i as u8);
        }
        h.write(2, 0, 0xaa);
        h.write(5, 100, 0xbb);
        assert_eq!(t.written(h.vpn(0), h.vpn(8)).unwrap(), vec![h.vpn(2), h.vpn(5)]);
        assert!(
            t.written(h.vpn(0), h.vpn(8)).unwrap().is_empty(),
            "the scan protected them again"
        );
        h.write(5, 200, 0xcc);
        let taken = t.take(&h.memfd, 4 * PAGE, h.vpn(4), 2, Keep::Written).unwrap();
        let fate: Vec<(bool, bool)> = taken.iter().map(|k| (k.written, k.data.is_some())).collect();
        assert_eq!(fate, vec![(false, false), (true, true)]);
        let five = taken[1].data.as_ref().unwrap();
        assert_eq!((five[0], five[100], five[200]), (5, 0xbb, 0xcc));
        let six = t.take(&h.memfd, 6 * PAGE, h.vpn(6), 1, Keep::All).unwrap();
        assert!(!six[0].written && six[0].data.as_ref().unwrap()[0] == 6);
        let seven = t.take(&h.memfd, 7 * PAGE, h.vpn(7), 1, Keep::Dirty).unwrap();
        assert!(seven[0].written && seven[0].data.as_ref().unwrap()[0] == 7);
    }

    /// Without page tables (write faults tracking dirtiness), a taker takes pages it is told
    /// are dirty with every write made before the punch, and refuses to say which were written.
    #[test]
    fn a_taker_without_page_tables_takes_dirty_pages_with_their_last_writes() {
        let h = Heap::new(2);
        let Some(t) = Taker::for_heap(false) else {
            eprintln!("skipped: shared memory may use large folios on this host");
            return;
        };
        h.install(0, 3);
        h.install(1, 4);
        h.write(1, 9, 0x99);
        assert_eq!(
            t.take(&h.memfd, 0, h.vpn(0), 2, None, Keep::Written)
                .err()
                .map(|e| e.kind()),
            Some(io::ErrorKind::Unsupported)
        );
        let taken = t.take(&h.memfd, 0, h.vpn(0), 2, None, Keep::Dirty).unwrap();
        let pages: Vec<(u64, u8, u8)> = taken
            .iter()
            .map(|k| {
                (
                    k.vpn - h.vpn(0),
                    k.data.as_ref().unwrap()[0],
                    k.data.as_ref().unwrap()[9],
                )
            })
            .collect();
        assert_eq!(pages, vec![(0, 3, 3), (1, 4, 0x99)]);
        // Both pages left the memfd: a read of them finds a hole.
        let mut buf = vec![1u8; PAGE as usize];
        // SAFETY: reads into a live buffer of the length given.
        let n = unsafe { libc::pread(h.memfd.as_raw_fd(), buf.as_mut_ptr() as *mut _, buf.len(), PAGE as i64) };
        assert!(n == PAGE as isize && buf.iter().all(|b| *b == 0));
        assert!(Taker::for_heap(true).is_none(), "huge pages are never taken by splice");
    }

    /// The facts eviction stands on (module documentation): a page spliced into a pipe is
    /// shared, not copied, so a write before the punch is in it; after the punch a scan tells
    /// a page written since its protection from one that was not.
    #[test]
    fn the_kernel_does_what_take_relies_on() {
        let h = Heap::new(4);
        let t = tracker(&h);
        h.install(0, 1);
        h.install(1, 2);
        let p = new_pipe().unwrap();
        splice_in(&h.memfd, 0, 2 * PAGE, &p.w).unwrap();
        h.write(0, 7, 0x77);
        punch(&h.memfd, 0, 2 * PAGE).unwrap();
        assert_eq!(
            written(&t.pagemap, h.vpn(0), h.vpn(2), false).unwrap(),
            vec![h.vpn(0)],
            "written: page 0 only"
        );
        let zero = page_out(&p.r, true).unwrap().unwrap();
        assert_eq!(
            (zero[0], zero[7]),
            (1, 0x77),
            "the write after the splice is in the pipe's page"
        );
        assert_eq!(page_out(&p.r, true).unwrap().unwrap()[0], 2);
    }

    /// What access sampling stands on (miss/sample.rs): a page unmapped as reclaim would stays
    /// in the memfd; the program's next touch maps it again with no fault message,
    /// write-protected as it was; the page tables then show it present.
    #[test]
    fn the_kernel_maps_an_unmapped_page_again_as_it_was_and_says_so() {
        if let Some(why) = crate::uffd::cannot_unmap() {
            eprintln!("skipped: {why}");
            return;
        }
        let h = Heap::with(2, 0);
        h.install(0, 5);
        h.install(1, 6);
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        // SAFETY: pidfd_open(2) of this process; the result is checked before it is owned.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id(), 0) } as i32;
        assert!(pidfd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: a fresh descriptor that nothing else owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        crate::uffd::unmap(&pidfd, &[(h.base, 2 * PAGE)]).unwrap();
        assert_eq!(present(&pagemap, h.vpn(0), h.vpn(2)).unwrap(), Vec::<u64>::new());
        // SAFETY: page 0 is in the memfd: the kernel maps it without a fault message.
        let b = unsafe { std::ptr::read_volatile(h.base as *const u8) };
        assert_eq!(b, 5);
        assert_eq!(present(&pagemap, h.vpn(0), h.vpn(2)).unwrap(), vec![h.vpn(0)]);
        let mut entry = [0u8; 8];
        pagemap.read_exact_at(&mut entry, h.vpn(0) * 8).unwrap();
        const PM_UFFD_WP: u64 = 1 << 57;
        assert_ne!(u64::from_ne_bytes(entry) & PM_UFFD_WP, 0, "still write-protected");
    }

    #[test]
    fn this_kernel_supports_scan_mode_and_a_heap_without_it_is_refused() {
        check_kernel().unwrap();
        let plain = vec![0u8; 3 * PAGE as usize];
        let page = (plain.as_ptr() as u64).div_ceil(PAGE) * PAGE;
        assert!(
            Tracker::open(std::process::id() as i32, page).is_err(),
            "memory not registered with userfaultfd"
        );
    }
}
