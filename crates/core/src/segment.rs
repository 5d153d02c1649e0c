//! A segment: the pages one owner keeps of one vRegion of one process, in a memfd that the
//! owner can hand to the pComponent of the process when both run on one host (one-sided
//! access, as RDMA registers a memory region). The pComponent then reads and writes back
//! those pages with a copy, without a message and without waking an mComponent thread.
//!
//! Layout (little-endian, `PAGE_SIZE` units): a header page; one meta word per page (0: the
//! owner holds no such page; else `PRESENT | CRC-32C of the page`); the pages themselves at
//! their offset in the vRegion. The owner stays authoritative: it decides which pages exist
//! (the pComponent writes in place only pages the owner holds, so it never allocates memory
//! the owner did not charge) and it takes the segment back from the pComponent before it
//! changes anything else there (a vma change, a new epoch, a rebuild reading the pages, the
//! process's exit): it bumps the header's generation and waits until no access of the older
//! one is under way. A pComponent access counts itself in, checks the generation it was
//! leased, and counts itself out: a lease taken back makes it fall back to the RPC path, which
//! learns of the change as it always did.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

use splitos_rpc::PAGE_SIZE;

const PAGE: usize = PAGE_SIZE;
const MAGIC: u32 = 0x5350_5347;
const VERSION: u32 = 1;
const PRESENT: u64 = 1 << 32;

/// How long an owner waits for a lease holder's accesses to finish before it goes on
/// regardless: a copy takes microseconds, so only a stuck or hostile holder is that slow, and
/// it can only spoil the pages of its own process.
const DRAIN: Duration = Duration::from_millis(100);

#[repr(C)]
struct Header {
    magic: AtomicU32,
    version: AtomicU32,
    pages: AtomicU64,
    /// Bumped by the owner each time it takes the segment back.
    generation: AtomicU64,
    /// Accesses of lease holders under way.
    in_access: AtomicU64,
}

/// What a one-sided access found.
#[derive(Debug, PartialEq, Eq)]
pub enum Access {
    Done,
    /// The owner holds no such page: the access goes through the owner (a write charges it).
    Absent,
    /// The lease's generation is over: the owner took the segment back.
    Revoked,
}

pub struct Segment {
    fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
    pages: u64,
}

// SAFETY: the mapping is plain shared memory; the header is accessed through atomics, pages
// and meta words through copies whose exclusion the lease protocol provides (and whose
// violation by a hostile peer spoils only bytes of its own process, caught by the checksum).
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

fn meta_bytes(pages: u64) -> usize {
    (pages as usize * 8).div_ceil(PAGE) * PAGE
}

fn size_of(pages: u64) -> usize {
    PAGE + meta_bytes(pages) + pages as usize * PAGE
}

impl Segment {
    /// A new, empty segment of `pages` pages (the owner's side).
    pub fn create(pages: u64) -> io::Result<Segment> {
        let name = c"splitos-pages";
        // SAFETY: memfd_create takes a valid C string and flags.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor memfd_create just returned, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = size_of(pages);
        // SAFETY: ftruncate and fcntl act on our own descriptor.
        unsafe {
            if libc::ftruncate(fd.as_raw_fd(), len as i64) != 0 {
                return Err(io::Error::last_os_error());
            }
            // A holder that could shrink it would make the owner's accesses fault (SIGBUS).
            if libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            ) != 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        let s = Segment::map(fd, pages)?;
        let h = s.header();
        h.pages.store(pages, Relaxed);
        h.version.store(VERSION, Relaxed);
        h.magic.store(MAGIC, Release);
        Ok(s)
    }

    /// A segment handed over by its owner (the pComponent's side): refused unless it is sealed
    /// against shrinking and has the size its header says.
    pub fn open(fd: OwnedFd, pages: u64) -> io::Result<Segment> {
        // SAFETY: fcntl and fstat on a descriptor we own; `st` is written by fstat.
        let (seals, size) = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
                return Err(io::Error::last_os_error());
            }
            (libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS), st.st_size as usize)
        };
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(bad("the segment is not sealed against shrinking".into()));
        }
        if size != size_of(pages) {
            return Err(bad(format!(
                "a segment of {pages} pages is {} bytes, this one {size}",
                size_of(pages)
            )));
        }
        let s = Segment::map(fd, pages)?;
        let h = s.header();
        if h.magic.load(Acquire) != MAGIC || h.version.load(Relaxed) != VERSION || h.pages.load(Relaxed) != pages {
            return Err(bad(
                "the segment's header is not a splitos segment of this version and size".into(),
            ));
        }
        Ok(s)
    }

    fn map(fd: OwnedFd, pages: u64) -> io::Result<Segment> {
        let len = size_of(pages);
        // SAFETY: a fresh shared mapping of the whole file, whose size was set or checked and
        // cannot shrink (sealed); nothing else refers to that range.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Segment {
            fd,
            ptr: p as *mut u8,
            len,
            pages,
        })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping starts page-aligned and is longer than a Header, made of atomics.
        unsafe { &*(self.ptr as *const Header) }
    }

    fn meta(&self, i: u64) -> &AtomicU64 {
        assert!(i < self.pages);
        // SAFETY: meta word `i` lies in the meta area, 8-byte aligned.
        unsafe { &*(self.ptr.add(PAGE + i as usize * 8) as *const AtomicU64) }
    }

    fn page_ptr(&self, i: u64) -> *mut u8 {
        assert!(i < self.pages);
        // SAFETY: page `i` lies in the data area.
        unsafe { self.ptr.add(PAGE + meta_bytes(self.pages) + i as usize * PAGE) }
    }

    pub fn generation(&self) -> u64 {
        self.header().generation.load(Acquire)
    }

    // ---- the owner's side

    /// Page `i` sealed with its checksum ([`splitos_rpc::SEALED_PAGE`] bytes), if held.
    pub fn get(&self, i: u64) -> Option<Vec<u8>> {
        let m = self.meta(i).load(Acquire);
        if m & PRESENT == 0 {
            return None;
        }
        let mut v = Vec::with_capacity(PAGE + 4);
        // SAFETY: page `i` is PAGE bytes of the mapping.
        v.extend_from_slice(unsafe { std::slice::from_raw_parts(self.page_ptr(i), PAGE) });
        v.extend_from_slice(&(m as u32).to_le_bytes());
        Some(v)
    }

    /// Stores page `i` from its sealed bytes.
    pub fn put(&self, i: u64, sealed: &[u8]) {
        let sum = u32::from_le_bytes(sealed[PAGE..PAGE + 4].try_into().expect("a sealed page"));
        // SAFETY: page `i` is PAGE bytes of the mapping; `sealed` has at least PAGE bytes.
        unsafe { std::ptr::copy_nonoverlapping(sealed.as_ptr(), self.page_ptr(i), PAGE) };
        self.meta(i).store(PRESENT | sum as u64, Release);
    }

    /// Changes page `i` in place (sealed bytes, checksum included), if held.
    pub fn modify(&self, i: u64, f: impl FnOnce(&mut [u8])) -> bool {
        let Some(mut v) = self.get(i) else { return false };
        f(&mut v);
        self.put(i, &v);
        true
    }

    /// Drops pages [from, to): their memory goes back to the host.
    pub fn clear(&self, from: u64, to: u64) {
        for i in from..to.min(self.pages) {
            self.meta(i).store(0, Release);
        }
        if to > from {
            let off = PAGE + meta_bytes(self.pages) + from as usize * PAGE;
            let len = (to.min(self.pages) - from) as usize * PAGE;
            // SAFETY: fallocate takes no pointers; it punches our own file.
            unsafe {
                libc::fallocate(
                    self.fd.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off as i64,
                    len as i64,
                )
            };
        }
    }

    /// Drops every page, meta words included (a hole reads as zeros: no page is held), without
    /// touching the meta area page by page: its memory goes back to the host too.
    pub fn clear_all(&self) {
        // SAFETY: fallocate takes no pointers; it punches our own file past its header.
        unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                PAGE as i64,
                (self.len - PAGE) as i64,
            )
        };
    }

    /// Takes the segment back from its lease holder: accesses of the older generation are
    /// over when this returns (or after [`DRAIN`], for a holder that does not finish them).
    pub fn revoke(&self) -> bool {
        let h = self.header();
        h.generation.fetch_add(1, SeqCst);
        let since = Instant::now();
        while h.in_access.load(SeqCst) != 0 {
            if since.elapsed() > DRAIN {
                tracing::warn!("a lease holder kept accessing a segment taken back from it: going on without it");
                return false;
            }
            std::hint::spin_loop();
            std::thread::yield_now();
        }
        true
    }

    // ---- the lease holder's side

    fn enter(&self, generation: u64) -> bool {
        let h = self.header();
        h.in_access.fetch_add(1, SeqCst);
        if h.generation.load(SeqCst) == generation {
            return true;
        }
        h.in_access.fetch_sub(1, SeqCst);
        false
    }

    fn leave(&self) {
        self.header().in_access.fetch_sub(1, SeqCst);
    }

    /// Reads page `i` under lease `generation` into `out` (PAGE bytes), and its checksum.
    pub fn read(&self, generation: u64, i: u64, out: &mut [u8]) -> (Access, u32) {
        if i >= self.pages || !self.enter(generation) {
            return (Access::Revoked, 0);
        }
        let m = self.meta(i).load(Acquire);
        let r = if m & PRESENT == 0 {
            Access::Absent
        } else {
            // SAFETY: page `i` is PAGE bytes of the mapping; `out` is PAGE bytes.
            unsafe { std::ptr::copy_nonoverlapping(self.page_ptr(i), out.as_mut_ptr(), PAGE) };
            Access::Done
        };
        self.leave();
        (r, m as u32)
    }

    /// Writes page `i` (PAGE bytes, and its checksum) back under lease `generation`, if the
    /// owner holds it.
    pub fn write(&self, generation: u64, i: u64, data: &[u8], sum: u32) -> Access {
        if i >= self.pages || !self.enter(generation) {
            return Access::Revoked;
        }
        let meta = self.meta(i);
        let r = if meta.load(Acquire) & PRESENT == 0 {
            Access::Absent
        } else {
            // SAFETY: page `i` is PAGE bytes of the mapping; `data` is PAGE bytes.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.page_ptr(i), PAGE) };
            meta.store(PRESENT | sum as u64, Release);
            Access::Done
        };
        self.leave();
        r
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference into it outlives self.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(byte: u8) -> Vec<u8> {
        splitos_rpc::seal_page(&[byte; PAGE]).into_vec()
    }

    #[test]
    fn a_holder_reads_and_writes_what_the_owner_holds_and_nothing_else() {
        let owner = Segment::create(16).unwrap();
        let dup = owner.fd().try_clone().unwrap();
        let holder = Segment::open(dup, 16).unwrap();
        let g = holder.generation();
        let mut buf = vec![0u8; PAGE];
        assert_eq!(holder.read(g, 3, &mut buf).0, Access::Absent);
        assert_eq!(
            holder.write(g, 3, &[1u8; PAGE], 5),
            Access::Absent,
            "a holder never adds a page"
        );
        assert!(owner.get(3).is_none());
        owner.put(3, &sealed(7));
        let (a, sum) = holder.read(g, 3, &mut buf);
        assert_eq!(a, Access::Done);
        assert_eq!(buf, vec![7u8; PAGE]);
        assert_eq!(sum, crc32c(&buf));
        let new = [9u8; PAGE];
        assert_eq!(holder.write(g, 3, &new, crc32c(&new)), Access::Done);
        assert_eq!(
            owner.get(3).unwrap(),
            sealed(9),
            "the owner sees the write and its checksum"
        );
        assert_eq!(holder.read(g, 99, &mut buf).0, Access::Revoked, "beyond the segment");
        owner.clear(0, 16);
        assert_eq!(holder.read(g, 3, &mut buf).0, Access::Absent);
        owner.put(5, &sealed(2));
        owner.clear_all();
        assert!(owner.get(5).is_none(), "every page dropped");
        assert_eq!(
            holder.read(g, 5, &mut buf).0,
            Access::Absent,
            "and the holder sees none either"
        );
    }

    #[test]
    fn a_segment_taken_back_refuses_the_old_lease() {
        let owner = Segment::create(4).unwrap();
        owner.put(0, &sealed(1));
        let holder = Segment::open(owner.fd().try_clone().unwrap(), 4).unwrap();
        let g = holder.generation();
        assert!(owner.revoke());
        let mut buf = vec![0u8; PAGE];
        assert_eq!(holder.read(g, 0, &mut buf).0, Access::Revoked);
        assert_eq!(holder.write(g, 0, &buf, 0), Access::Revoked);
        assert_eq!(
            holder.read(holder.generation(), 0, &mut buf).0,
            Access::Done,
            "a new lease reads again"
        );
    }

    #[test]
    fn a_holder_refuses_what_is_not_a_sealed_segment_of_the_size_it_was_told() {
        let owner = Segment::create(4).unwrap();
        assert!(Segment::open(owner.fd().try_clone().unwrap(), 8).is_err());
        // SAFETY: memfd_create with a valid name; the descriptor is owned below.
        let raw = unsafe { libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: a fresh descriptor.
        let plain = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own descriptor.
        unsafe { libc::ftruncate(plain.as_raw_fd(), size_of(4) as i64) };
        assert!(
            Segment::open(plain, 4).is_err(),
            "an unsealed file could shrink under the holder"
        );
    }

    fn crc32c(b: &[u8]) -> u32 {
        splitos_rpc::page_checksum(b)
    }
}
