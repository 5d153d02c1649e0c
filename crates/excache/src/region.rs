//! What the miss path does to a program's heap: the [`Region`] interface, and
//! [`UffdRegion`], its implementation with the userfaultfd and memfd the program's shim handed
//! over. Pages are numbered by virtual page (address / 4096).
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use super::dirty::{Keep, Taken, Taker, Tracker};
use crate::huge::{HugeHeap, SplitError, EXTENT};
use crate::uffd::{self, PAGE};

pub use crate::uffd::Install;

pub trait Region: Send + Sync {
    /// Installs a page and wakes the threads waiting for it; `wp` maps it write-protected so
    /// that the first write traps.
    fn copy(&self, vpn: u64, data: &[u8], wp: bool) -> io::Result<Install>;
    /// Installs a page of zeros (a line that never left this pComponent).
    fn zero(&self, vpn: u64, wp: bool) -> io::Result<Install>;
    /// Installs `pages` consecutive pages of zeros from `vpn`, writable, and wakes the threads
    /// waiting on any of them: a first touch, its fault-around window, pre-allocated lines.
    /// `Exists` if some were there already (left as they were), `Gone` if the program is.
    fn zero_run(&self, vpn: u64, pages: u64) -> io::Result<Install> {
        let mut result = Install::Done;
        for v in vpn..vpn + pages {
            match self.zero(v, false)? {
                Install::Gone => return Ok(Install::Gone),
                Install::Exists => result = Install::Exists,
                Install::Done => {}
            }
        }
        Ok(result)
    }
    /// Wakes threads waiting on a page that is already there.
    fn wake(&self, vpn: u64);
    /// Sets or lifts write protection of resident pages; lifting wakes waiting writers.
    fn write_protect(&self, vpn: u64, pages: u64, on: bool) -> io::Result<()>;
    /// Drops pages from the program and frees the memory behind them; the next access faults.
    fn punch(&self, vpn: u64, pages: u64) -> io::Result<()>;
    /// The current contents of a resident page.
    fn read_out(&self, vpn: u64, buf: &mut [u8]) -> io::Result<()>;
    /// True if resident pages can be unmapped and kept ([`Region::unmap`]): the kernel maps
    /// each again at its next touch, and [`Region::present`] tells which it did.
    fn samples(&self) -> bool {
        false
    }
    /// Unmaps resident pages, keeping them in the memfd: the program's next touch of each is a
    /// minor fault the kernel serves, mapping it again as it was (write-protected if it was).
    /// `vpns` is sorted.
    fn unmap(&self, _vpns: &[u64]) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
    /// The pages of [first, end) mapped in the program now: of the pages [`Region::unmap`]
    /// unmapped, those the program touched since.
    fn present(&self, _first: u64, _end: u64) -> io::Result<Vec<u64>> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
    /// Whether fresh 2 MiB extents can be made resident as huge pages ([`Region::allocate_huge`]).
    fn huge_pages(&self) -> bool {
        false
    }
    /// Makes the fresh 2 MiB extent starting at `vpn` resident as zeros without mapping it, as
    /// one huge page if it can (returns true; the program's first touch maps all of it), else
    /// as 4 KiB pages, write-protected, holding what the program wrote meanwhile.
    fn allocate_huge(&self, _vpn: u64) -> Result<bool, SplitError> {
        Err(SplitError::Kept(io::ErrorKind::Unsupported.into()))
    }
    /// Splits the huge pages that [vpn, vpn + pages) covers only in part into 4 KiB pages with
    /// the same contents, write-protected, leaving out the range's own pages; a punch of the
    /// range then frees only those. Returns how many it split.
    fn split_huge(&self, _vpn: u64, _pages: u64) -> Result<u64, SplitError> {
        Ok(0)
    }
    /// True if the kernel tracks the region's writes (dirty tracking by scan, dirty.rs): a
    /// write to a protected page lifts the protection without a fault message, so only
    /// [`Region::written`] and [`Region::take`] tell which pages were written.
    fn tracks_writes(&self) -> bool {
        false
    }
    /// True if [`Region::take`] answers [`Keep::Dirty`]: a page known to be dirty leaves the
    /// program with its contents in one step, without being write-protected for the copy.
    fn takes_dirty(&self) -> bool {
        self.tracks_writes()
    }
    /// The resident pages of [first, end) written since they were last protected, protected
    /// again in the same step. The range holds only resident pages.
    fn written(&self, _first: u64, _end: u64) -> io::Result<Vec<u64>> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
    /// Drops resident pages from the program as [`Region::punch`] does, telling of each
    /// whether it was written since it was last protected, with the contents as it left that
    /// `keep` asks for. On an error the pages may be gone without their contents.
    fn take(&self, _vpn: u64, _pages: u64, _keep: Keep) -> io::Result<Vec<Taken>> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// A program's heap region: its userfaultfd, and the memfd behind the region at `base` (or a
/// file on the pComponent's private tmpfs, see `huge`).
pub struct UffdRegion {
    pub uffd: Arc<OwnedFd>,
    pub memfd: OwnedFd,
    pub base: u64,
    pub huge: HugeHeap,
    /// With dirty tracking by scan: the program's page tables.
    pub tracker: Option<Tracker>,
    /// Without it, where the heap's pages are all small: what takes dirty pages out
    /// ([`Taker::for_heap`]).
    pub taker: Option<Taker>,
    /// With access sampling: the program, whose pages are unmapped through it, and its page
    /// tables, which say which it touched since.
    pub sampling: Option<Sampling>,
}

/// What access sampling needs of a program.
pub struct Sampling {
    pub pidfd: Arc<OwnedFd>,
    pub pagemap: File,
}

/// Pages of zeros to install from: one ioctl installs a fault-around window of up to this
/// many (an ioctl per page cost 3 µs a page; a window in one, about 1).
const ZERO_RUN: u64 = 64;
static ZEROS: [u8; (ZERO_RUN * PAGE) as usize] = [0; (ZERO_RUN * PAGE) as usize];

impl UffdRegion {
    fn offset(&self, vpn: u64) -> u64 {
        vpn * PAGE - self.base
    }

    fn sampling(&self) -> io::Result<&Sampling> {
        self.sampling
            .as_ref()
            .ok_or_else(|| io::Error::from(io::ErrorKind::Unsupported))
    }

    fn tracker(&self) -> io::Result<&Tracker> {
        self.tracker
            .as_ref()
            .ok_or_else(|| io::Error::from(io::ErrorKind::Unsupported))
    }
}

impl Region for UffdRegion {
    fn copy(&self, vpn: u64, data: &[u8], wp: bool) -> io::Result<Install> {
        uffd::copy(&self.uffd, vpn * PAGE, data, wp)
    }

    fn zero(&self, vpn: u64, wp: bool) -> io::Result<Install> {
        // UFFDIO_ZEROPAGE is no cheaper than copying zeros, and copying can write-protect.
        uffd::copy(&self.uffd, vpn * PAGE, &ZEROS, wp)
    }

    fn zero_run(&self, vpn: u64, pages: u64) -> io::Result<Install> {
        let mut result = Install::Done;
        let mut v = vpn;
        while v < vpn + pages {
            let n = (vpn + pages - v).min(ZERO_RUN);
            match uffd::copy_pages(&self.uffd, v * PAGE, &ZEROS[..(n * PAGE) as usize], false)? {
                Install::Gone => return Ok(Install::Gone),
                Install::Exists => result = Install::Exists,
                Install::Done => {}
            }
            v += n;
        }
        Ok(result)
    }

    fn wake(&self, vpn: u64) {
        uffd::wake(&self.uffd, vpn * PAGE, PAGE);
    }

    fn write_protect(&self, vpn: u64, pages: u64, on: bool) -> io::Result<()> {
        uffd::write_protect(&self.uffd, vpn * PAGE, pages * PAGE, on)
    }

    fn punch(&self, vpn: u64, pages: u64) -> io::Result<()> {
        // The kernel would zero the part of a huge page and keep it if it could not split it.
        if !self.huge.release(vpn, pages) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the range cuts a huge page that was not split",
            ));
        }
        uffd::punch(&self.memfd, self.offset(vpn), pages * PAGE)
    }

    fn read_out(&self, vpn: u64, buf: &mut [u8]) -> io::Result<()> {
        uffd::read_page(&self.memfd, self.offset(vpn), buf)
    }

    fn samples(&self) -> bool {
        self.sampling.is_some()
    }

    fn unmap(&self, vpns: &[u64]) -> io::Result<()> {
        let s = self.sampling()?;
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &v in vpns {
            match runs.last_mut() {
                Some((a, l)) if *a + *l == v * PAGE => *l += PAGE,
                _ => runs.push((v * PAGE, PAGE)),
            }
        }
        uffd::unmap(&s.pidfd, &runs)
    }

    fn present(&self, first: u64, end: u64) -> io::Result<Vec<u64>> {
        super::dirty::present(&self.sampling()?.pagemap, first, end)
    }

    fn huge_pages(&self) -> bool {
        self.huge.enabled()
    }

    fn allocate_huge(&self, vpn: u64) -> Result<bool, SplitError> {
        debug_assert_eq!(vpn % EXTENT, 0);
        self.huge.allocate(&self.uffd, &self.memfd, self.base, vpn)
    }

    fn split_huge(&self, vpn: u64, pages: u64) -> Result<u64, SplitError> {
        self.huge.split(&self.uffd, &self.memfd, self.base, vpn, pages)
    }

    fn tracks_writes(&self) -> bool {
        self.tracker.is_some()
    }

    fn written(&self, first: u64, end: u64) -> io::Result<Vec<u64>> {
        self.tracker()?.written(first, end)
    }

    fn takes_dirty(&self) -> bool {
        self.tracker.is_some() || self.taker.is_some()
    }

    fn take(&self, vpn: u64, pages: u64, keep: Keep) -> io::Result<Vec<Taken>> {
        let off = self.offset(vpn);
        match (&self.tracker, &self.taker) {
            (Some(t), _) => t.take(&self.memfd, off, vpn, pages, keep),
            (None, Some(t)) => t.take(&self.memfd, off, vpn, pages, None, keep),
            (None, None) => Err(io::Error::from(io::ErrorKind::Unsupported)),
        }
    }
}
