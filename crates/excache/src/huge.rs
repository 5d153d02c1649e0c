//! Huge pages for program heaps (`huge_pages = "on"`, docs/excache.md "Huge pages").
//!
//! A memfd follows the system-wide `shmem_enabled` setting, which is `never` on many machines,
//! so a heap behind one never gets transparent huge pages. A tmpfs mount has its own `huge=`
//! option: the pComponent mounts a private one ([`HeapFs`], attached to no directory) with
//! `huge=advise` and hands each program a file on it to back its heap region. On such a mount
//! only a mapping advised `MADV_HUGEPAGE` allocates huge folios: `fallocate` (pre-allocation)
//! and `UFFDIO_COPY` (installs) still allocate exactly the 4 KiB pages asked for, and the
//! program's own mapping, registered with userfaultfd, traps on every hole. So every page stays
//! where the miss path put it, and huge pages exist only where the pComponent makes them: it
//! maps a fresh 2 MiB extent into its own address space, advised, and populates it
//! ([`HugeHeap::allocate`]); the program's next touch maps the whole extent with one PMD.
//!
//! Punching part of a huge folio makes the kernel zero that part and then try to split the
//! folio; if the split fails (a transient reference, a pin), the zeroed page stays in the file
//! where the miss path believes a hole, and a later touch would read zeros instead of
//! trapping. So a huge page is never punched in part: [`HugeHeap::split`] first replaces it
//! with 4 KiB pages of the same contents (write-protect it, copy it out, punch it whole,
//! install the pages that stay), and only then is the part dropped.
use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::uffd::{self, PAGE};

/// Lines in a 2 MiB huge page.
pub const EXTENT: u64 = 512;
const HUGE: u64 = EXTENT * PAGE;
/// Not in the libc crate yet (uapi values).
const MADV_POPULATE_WRITE: libc::c_int = 23;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const THP: &str = "/sys/kernel/mm/transparent_hugepage";
/// How long a reading of the shared-memory huge page settings is used for the programs that
/// start: reading them took about 100 µs of each start (a dozen sysfs files), and a heap
/// follows the settings of the moment its pages are allocated in any case, not those its
/// program started with.
const THP_FRESH: Duration = Duration::from_secs(1);

/// The system's transparent huge page settings for shared memory, as one reading found them.
#[derive(Debug, PartialEq)]
pub(crate) struct ShmemThp {
    /// `shmem_enabled` as the file reads.
    pub top: String,
    /// Which setting lets a memfd get large folios, if one does. `advise` needs
    /// MADV_HUGEPAGE on the heap, which the shim does not pass on.
    pub large_folios: Option<String>,
}

impl ShmemThp {
    fn read() -> ShmemThp {
        let dir = std::path::Path::new(THP);
        let chosen = |path: &std::path::Path| {
            let s = std::fs::read_to_string(path).ok()?;
            s.split_whitespace().find_map(|w| {
                w.strip_prefix('[')
                    .and_then(|w| w.strip_suffix(']'))
                    .map(str::to_string)
            })
        };
        let top_path = dir.join("shmem_enabled");
        let top = std::fs::read_to_string(&top_path).unwrap_or_default();
        let large_folios = chosen(&top_path)
            .filter(|v| matches!(v.as_str(), "always" | "within_size" | "force"))
            .map(|v| format!("{} is {v}", top_path.display()))
            .or_else(|| {
                std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
                    if !e.file_name().to_string_lossy().starts_with("hugepages-") {
                        return None;
                    }
                    let p = e.path().join("shmem_enabled");
                    chosen(&p)
                        .filter(|v| matches!(v.as_str(), "always" | "within_size"))
                        .map(|v| format!("{} is {v}", p.display()))
                })
            });
        ShmemThp { top, large_folios }
    }
}

/// The last reading of the settings, used until it is [`THP_FRESH`] old.
struct LastReading(Mutex<Option<(Instant, Arc<ShmemThp>)>>);

impl LastReading {
    const fn new() -> LastReading {
        LastReading(Mutex::new(None))
    }

    fn at(&self, now: Instant) -> Arc<ShmemThp> {
        let mut last = self.0.lock().unwrap();
        match &*last {
            Some((at, s)) if now.saturating_duration_since(*at) < THP_FRESH => s.clone(),
            _ => {
                let s = Arc::new(ShmemThp::read());
                *last = Some((now, s.clone()));
                s
            }
        }
    }
}

/// The settings as read at most a second ago.
pub(crate) fn shmem_thp() -> Arc<ShmemThp> {
    static LAST: LastReading = LastReading::new();
    LAST.at(Instant::now())
}

fn cvt(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn dev_of(fd: &OwnedFd) -> io::Result<u64> {
    // SAFETY: fstat fills the zeroed stat we pass for the duration of the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `fd` is open.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_dev)
}

/// The pComponent's private tmpfs: mounted with the new mount API and never attached to a
/// directory, so no one else sees it and it goes away with the last file on it. Unlimited in
/// size and inodes, as the kernel's own mount behind memfds is.
pub struct HeapFs {
    root: OwnedFd,
    dev: u64,
}

impl HeapFs {
    /// Needs CAP_SYS_ADMIN (the pComponent runs as root).
    pub fn mount() -> io::Result<HeapFs> {
        // SAFETY: fsopen(2) with a NUL-terminated name only creates a descriptor.
        let fs = cvt(unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) })?;
        // SAFETY: a fresh descriptor that nothing else owns.
        let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
        for (k, v) in [
            (c"huge", c"advise"),
            (c"size", c"0"),
            (c"nr_inodes", c"0"),
            (c"mode", c"0700"),
        ] {
            // SAFETY: fsconfig(2) reads the two NUL-terminated strings during the call.
            cvt(unsafe {
                libc::syscall(
                    libc::SYS_fsconfig,
                    fs.as_raw_fd(),
                    FSCONFIG_SET_STRING,
                    k.as_ptr(),
                    v.as_ptr(),
                    0,
                )
            })?;
        }
        // SAFETY: fsconfig(2) without pointers: creates the superblock.
        cvt(unsafe { libc::syscall(libc::SYS_fsconfig, fs.as_raw_fd(), FSCONFIG_CMD_CREATE, 0, 0, 0) })?;
        // SAFETY: fsmount(2) takes no pointers; returns a descriptor of the mount's root.
        let root = cvt(unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), FSMOUNT_CLOEXEC, 0) })?;
        // SAFETY: a fresh descriptor that nothing else owns.
        let root = unsafe { OwnedFd::from_raw_fd(root as i32) };
        let dev = dev_of(&root)?;
        Ok(HeapFs { root, dev })
    }

    /// A new, unnamed file for one program's heap.
    pub fn create(&self) -> io::Result<OwnedFd> {
        // SAFETY: openat(2) with a NUL-terminated path relative to our mount's root.
        let fd = unsafe {
            libc::openat(
                self.root.as_raw_fd(),
                c".".as_ptr(),
                libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
                0o600,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Whether `f` lives on this mount (a program may back its heap with a memfd instead).
    pub fn holds(&self, f: &OwnedFd) -> bool {
        dev_of(f).is_ok_and(|d| d == self.dev)
    }
}

/// Whether `fallocate` on a heap file allocates exactly the pages asked for, given the
/// system-wide `shmem_enabled` setting. With `always` or `within_size` a memfd gets huge folios
/// from `fallocate`, covering pages around the range that may have left this pComponent (a
/// touch would then read zeros instead of trapping); `force` does that on every mount.
pub fn exact_fallocate(shmem_enabled: &str, on_heap_fs: bool) -> bool {
    let chosen = shmem_enabled
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .unwrap_or("never");
    match chosen {
        "force" => false,
        "always" | "within_size" => on_heap_fs,
        _ => true,
    }
}

/// Why a huge page could not be split.
#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    /// Before any page left the program: it is as it was.
    #[error("{0}")]
    Kept(io::Error),
    /// After the huge page left the program, while its pages were put back: those not back yet
    /// exist nowhere else.
    #[error("{0}")]
    Lost(io::Error),
}

/// The huge-page state of one heap region.
pub struct HugeHeap {
    /// The file is on the pComponent's private mount: huge pages can be made.
    enabled: bool,
    exact_fallocate: bool,
    /// First virtual pages of the extents populated as huge pages and not split since.
    extents: Mutex<BTreeSet<u64>>,
}

impl HugeHeap {
    pub fn of(file: &OwnedFd, fs: Option<&HeapFs>) -> HugeHeap {
        let enabled = fs.is_some_and(|fs| fs.holds(file));
        let thp = shmem_thp();
        let setting = &thp.top;
        let exact_fallocate = exact_fallocate(setting, enabled);
        if !exact_fallocate {
            tracing::warn!(shmem_enabled = setting.trim(), "fallocate on this heap may allocate huge pages beyond the pages asked for: fresh lines are installed instead of pre-allocated");
        }
        HugeHeap {
            enabled: enabled && exact_fallocate,
            exact_fallocate,
            extents: Mutex::new(BTreeSet::new()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn exact_fallocate(&self) -> bool {
        self.exact_fallocate
    }

    /// Populates the fresh extent at virtual page `first` through a mapping of our own advised
    /// for huge pages; the program's mapping is not involved, so nothing traps. Returns whether
    /// the extent is a huge page now (if the kernel has no free 2 MiB page it uses smaller
    /// folios, which are treated the same). If populating failed part way, another thread of
    /// the program may already have written to a page that was there: the extent is put back
    /// as 4 KiB pages with what they hold, write-protected, as a split leaves them.
    pub fn allocate(&self, uffd_fd: &OwnedFd, file: &OwnedFd, base: u64, first: u64) -> Result<bool, SplitError> {
        if !self.enabled {
            return Err(SplitError::Kept(io::ErrorKind::Unsupported.into()));
        }
        match populate(file, first * PAGE - base) {
            Ok(()) => {
                self.extents.lock().unwrap().insert(first);
                Ok(true)
            }
            Err(e) => {
                tracing::debug!(addr = first * PAGE, error = %e, "cannot populate a huge page; the extent gets 4 KiB pages");
                split_one(uffd_fd, file, base, first, first..first)?;
                Ok(false)
            }
        }
    }

    /// Splits every huge page that [vpn, vpn + pages) covers only in part (see the module
    /// documentation); the pages of the range itself are not put back. Returns how many it split.
    pub fn split(&self, uffd_fd: &OwnedFd, file: &OwnedFd, base: u64, vpn: u64, pages: u64) -> Result<u64, SplitError> {
        let end = vpn + pages;
        let mut extents = self.extents.lock().unwrap();
        let partial: Vec<u64> = extents
            .range(vpn.saturating_sub(EXTENT - 1)..end)
            .copied()
            .filter(|e| *e < vpn || e + EXTENT > end)
            .collect();
        for &first in &partial {
            split_one(uffd_fd, file, base, first, vpn.max(first)..end.min(first + EXTENT))?;
            extents.remove(&first);
        }
        Ok(partial.len() as u64)
    }

    /// Whether a punch of [vpn, vpn + pages) would cut a huge page; if not, forgets the huge
    /// pages it covers whole (they go with the punch).
    pub fn release(&self, vpn: u64, pages: u64) -> bool {
        let end = vpn + pages;
        let mut extents = self.extents.lock().unwrap();
        let covered: Vec<u64> = extents.range(vpn.saturating_sub(EXTENT - 1)..end).copied().collect();
        if covered.iter().any(|e| *e < vpn || e + EXTENT > end) {
            return false;
        }
        for e in covered {
            extents.remove(&e);
        }
        true
    }
}

fn populate(file: &OwnedFd, off: u64) -> io::Result<()> {
    // Reserve twice the size so that a 2 MiB-aligned window fits inside, map the file there.
    let span = (2 * HUGE) as usize;
    // SAFETY: a fresh reservation at an address the kernel picks replaces nothing.
    let r = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if r == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let at = (r as u64).next_multiple_of(HUGE);
    let flags = libc::MAP_SHARED | libc::MAP_FIXED;
    // SAFETY: replaces part of the reservation just made, which nothing else uses.
    let p = unsafe {
        libc::mmap(
            at as *mut libc::c_void,
            HUGE as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            file.as_raw_fd(),
            off as i64,
        )
    };
    let advise = |advice| {
        // SAFETY: advice on our own mapping of the file, which only we use.
        (unsafe { libc::madvise(p, HUGE as usize, advice) } == 0)
            .then_some(())
            .ok_or_else(io::Error::last_os_error)
    };
    let result = if p == libc::MAP_FAILED {
        Err(io::Error::last_os_error())
    } else {
        advise(libc::MADV_HUGEPAGE).and_then(|()| advise(MADV_POPULATE_WRITE))
    };
    // SAFETY: unmaps the reservation and our window into the file; the pages stay in the file.
    unsafe { libc::munmap(r, span) };
    result
}

fn split_one(
    uffd_fd: &OwnedFd,
    file: &OwnedFd,
    base: u64,
    first: u64,
    drop: std::ops::Range<u64>,
) -> Result<(), SplitError> {
    let (addr, off) = (first * PAGE, first * PAGE - base);
    // Writes trap from here on (the miss path lifts the protection of lines it holds writable),
    // so the copy below stays the current contents.
    uffd::write_protect(uffd_fd, addr, HUGE, true).map_err(SplitError::Kept)?;
    let mut data = vec![0u8; HUGE as usize];
    let mut got = 0;
    while got < data.len() {
        // SAFETY: reads into the unfilled tail of our buffer.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                data[got..].as_mut_ptr() as *mut libc::c_void,
                data.len() - got,
                (off + got as u64) as i64,
            )
        };
        match n {
            n if n > 0 => got += n as usize,
            0 => return Err(SplitError::Kept(io::ErrorKind::UnexpectedEof.into())),
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => return Err(SplitError::Kept(io::Error::last_os_error())),
        }
    }
    // A whole folio is removed, never split: accesses trap until the pages are back.
    uffd::punch(file, off, HUGE).map_err(SplitError::Kept)?;
    for (from, to) in [(first, drop.start), (drop.end, first + EXTENT)] {
        if from < to {
            let bytes = &data[((from - first) * PAGE) as usize..((to - first) * PAGE) as usize];
            match uffd::copy_range(uffd_fd, from * PAGE, bytes, true) {
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(()),
                r => r.map_err(SplitError::Lost)?,
            };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallocate_is_exact_unless_the_setting_gives_huge_pages_to_the_heap_file() {
        for (setting, memfd, ours) in [
            ("always within_size advise [never] deny force", true, true),
            ("always within_size [advise] never deny force", true, true),
            ("always within_size advise never [deny] force", true, true),
            ("[always] within_size advise never deny force", false, true),
            ("always [within_size] advise never deny force", false, true),
            ("always within_size advise never deny [force]", false, false),
            ("", true, true),
        ] {
            assert_eq!(exact_fallocate(setting, false), memfd, "{setting} (memfd)");
            assert_eq!(exact_fallocate(setting, true), ours, "{setting} (private mount)");
        }
    }

    #[test]
    fn the_shmem_settings_are_read_again_only_once_a_reading_is_a_second_old() {
        let last = LastReading::new();
        let t0 = Instant::now();
        let first = last.at(t0);
        assert_eq!(*first, ShmemThp::read(), "a reading is what the files say");
        assert!(
            Arc::ptr_eq(&first, &last.at(t0 + THP_FRESH / 2)),
            "within a second, the same reading"
        );
        let later = last.at(t0 + THP_FRESH);
        assert!(!Arc::ptr_eq(&first, &later), "a second on, the files are read again");
        assert!(Arc::ptr_eq(&later, &last.at(t0 + THP_FRESH)));
    }
}
