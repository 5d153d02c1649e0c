//! The storage buffer cache an mComponent holds for the files the global managers placed on
//! it (LegoOS §4.5: sComponents have little memory, so file caching lives with memory).
//!
//! Blocks of 4 KiB, keyed by (vNode, inode, block); least recently used blocks are evicted,
//! dirty ones written back first. A file's size lives here while the file is cached, so that
//! writes cost one round trip from the pComponent; it reaches the sComponent with every write
//! back. Writes reach the sComponent on fsync, on eviction, and from a background thread
//! every `WRITEBACK_EVERY`. Space on the sComponent is reserved ahead of the size in
//! `RESERVE_STEP`s, so a full disk or quota fails the write that needs the space (ENOSPC), not
//! a later write back.
//!
//! One lock serialises the cache, sComponent calls included: a miss never races a write back
//! of the same block. That bounds it to one outstanding sComponent request per mComponent,
//! which the single-threaded programs of the storage benchmark do not notice.
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_bytes::ByteBuf;
use splitos_metrics::counters;
use splitos_rpc::*;

use super::Peers;

const BLOCK: u64 = PAGE_SIZE as u64;
const RESERVE_STEP: u64 = 1 << 20;
/// Largest run of blocks one sComponent request carries.
const RUN_BLOCKS: u64 = 256;
pub const WRITEBACK_EVERY: Duration = Duration::from_secs(1);

type Key = (String, u64);

struct Block {
    data: Box<[u8; PAGE_SIZE]>,
    dirty: bool,
    tick: u64,
}

struct FileState {
    scomp: String,
    size: u64,
    reserved: u64,
    /// Written since the last background pass; an idle file gives back unused reservation.
    active: bool,
    /// The block after the file's last read, and the current read-ahead window (blocks).
    next_read: u64,
    window: u64,
    mtime_ns: i64,
    blocks: BTreeMap<u64, Block>,
}

#[derive(Default)]
struct Inner {
    files: HashMap<Key, FileState>,
    /// Recency order of every cached block: tick -> (file, block).
    lru: BTreeMap<u64, (Key, u64)>,
    tick: u64,
    blocks: usize,
}

counters! {
    /// The buffer cache's counters: keys of its statistics (`buffer_cache`) and the series
    /// `splitos_mcomp_bcache_<counter>_total`.
    pub struct Counters: "mcomp_bcache" {
        /// Blocks read from the cache.
        hits,
        /// Blocks read from sComponents.
        misses,
        /// Blocks written back to sComponents.
        writebacks,
        /// Blocks evicted.
        evictions,
        /// Read requests sent to sComponents.
        fetches,
        /// Blocks those requests brought ahead of a read.
        prefetched,
    }
}

/// Decides how far past a read that missed the buffer cache to fetch with it. Swappable: a
/// researcher's read-ahead policy implements this and is chosen where the cache is built.
/// (Not the miss path's `Prefetcher`, which brings heap pages ahead of a fault.)
pub trait ReadAhead: Send + Sync {
    /// `sequential`: this read starts where the file's previous read ended; `window`: the
    /// file's window so far (0 at first). Returns the new window, in blocks.
    fn window(&self, sequential: bool, window: u64) -> u64;
}

/// Linux-style read-ahead: the window doubles while reads are sequential, up to a maximum, and
/// closes on a random read. A maximum of 0 turns read-ahead off.
pub struct SequentialReadAhead {
    pub max_blocks: u64,
}

impl ReadAhead for SequentialReadAhead {
    fn window(&self, sequential: bool, window: u64) -> u64 {
        if sequential {
            (window * 2).clamp(4, self.max_blocks.max(4)).min(self.max_blocks)
        } else {
            0
        }
    }
}

pub struct BufferCache<P> {
    peers: P,
    capacity: usize,
    read_ahead: Box<dyn ReadAhead>,
    inner: Mutex<Inner>,
    pub(super) c: Counters,
}

/// Why the buffer cache fails a file request; the program sees each as an errno.
#[derive(Debug, thiserror::Error)]
enum FileError {
    #[error("{0}")]
    Storage(RpcError),
    #[error("offset or size beyond the largest file")]
    TooLarge,
}

impl Refuse for FileError {
    fn code(&self) -> ErrCode {
        match self {
            FileError::Storage(e) => match e.code() {
                ErrCode::Errno(n) => ErrCode::Errno(n),
                // The sComponent cannot be reached: the program sees EIO, and the next
                // request retries.
                _ => ErrCode::Errno(libc::EIO),
            },
            FileError::TooLarge => ErrCode::Errno(libc::EFBIG),
        }
    }
}

/// Ascending block numbers grouped into [start, end) runs of consecutive blocks, each at
/// most `RUN_BLOCKS` long: one sComponent request each.
fn runs(blocks: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in blocks {
        match out.last_mut() {
            Some((s, e)) if *e == b && b - *s < RUN_BLOCKS => *e += 1,
            _ => out.push((b, b + 1)),
        }
    }
    out
}

/// Offsets and sizes the file system can hold (the sComponent's bound).
fn fits(off: u64, len: u64) -> Result<(), FileError> {
    match off.checked_add(len) {
        Some(e) if e <= MAX_FILE_SIZE => Ok(()),
        _ => Err(FileError::TooLarge),
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

impl<P: Peers> BufferCache<P> {
    /// A cache of `capacity_bytes`, reading ahead up to `readahead_bytes` for sequential reads.
    pub fn new(peers: P, capacity_bytes: u64, readahead_bytes: u64) -> Arc<BufferCache<P>> {
        let read_ahead = Box::new(SequentialReadAhead {
            max_blocks: readahead_bytes / BLOCK,
        });
        let bc = Arc::new(BufferCache {
            peers,
            capacity: (capacity_bytes / BLOCK).max(1) as usize,
            read_ahead,
            inner: Mutex::new(Inner::default()),
            c: Counters::default(),
        });
        let weak = Arc::downgrade(&bc);
        std::thread::Builder::new()
            .name("bcache-writeback".into())
            .spawn(move || loop {
                std::thread::sleep(WRITEBACK_EVERY);
                let Some(bc) = weak.upgrade() else { return };
                bc.write_back_all();
            })
            .expect("spawn write-back thread");
        bc
    }

    fn call<R: Request>(&self, scomp: &str, req: R) -> Result<R::Reply, Refusal> {
        Ok(self.peers.call(scomp, req).map_err(FileError::Storage)?)
    }

    /// The file's state, loaded from the sComponent on first use.
    fn file<'a>(&self, g: &'a mut Inner, scomp: &str, key: &Key) -> Result<&'a mut FileState, Refusal> {
        if !g.files.contains_key(key) {
            let a = self
                .call(
                    scomp,
                    X2S_GETATTR {
                        vnode: key.0.clone(),
                        ino: key.1,
                    },
                )?
                .attr;
            g.files.insert(
                key.clone(),
                FileState {
                    scomp: scomp.to_string(),
                    size: a.size,
                    reserved: a.alloc.max(a.size),
                    active: false,
                    next_read: 0,
                    window: 0,
                    mtime_ns: a.mtime_ns,
                    blocks: BTreeMap::new(),
                },
            );
        }
        let f = g.files.get_mut(key).expect("just inserted");
        // The pComponent knows where the file is stored now (an sComponent may have moved).
        if f.scomp != scomp {
            f.scomp = scomp.to_string();
        }
        Ok(f)
    }

    fn touch(g: &mut Inner, key: &Key, blk: u64) {
        g.tick += 1;
        let t = g.tick;
        if let Some(b) = g.files.get_mut(key).and_then(|f| f.blocks.get_mut(&blk)) {
            g.lru.remove(&b.tick);
            b.tick = t;
            g.lru.insert(t, (key.clone(), blk));
        }
    }

    /// Writes dirty blocks [from, to) of a file back, in runs.
    fn write_back(&self, g: &mut Inner, key: &Key, range: std::ops::Range<u64>) -> Result<(), Refusal> {
        let Some(f) = g.files.get_mut(key) else { return Ok(()) };
        let dirty: Vec<u64> = f
            .blocks
            .range(range)
            .filter(|(_, b)| b.dirty)
            .map(|(k, _)| *k)
            .collect();
        for (start, end) in runs(&dirty) {
            let off = start * BLOCK;
            let upto = (end * BLOCK).min(f.size);
            if upto <= off {
                for b in start..end {
                    f.blocks.get_mut(&b).expect("dirty block").dirty = false;
                }
                continue;
            }
            let mut data = Vec::with_capacity((upto - off) as usize);
            for b in start..end {
                data.extend_from_slice(&f.blocks[&b].data[..]);
            }
            data.truncate((upto - off) as usize);
            let msg = M2S_WRITE {
                vnode: key.0.clone(),
                ino: key.1,
                offset: off,
                data: ByteBuf::from(data),
                size: f.size,
                mtime_ns: f.mtime_ns,
            };
            self.call(&f.scomp, msg)?;
            self.c.writebacks.fetch_add(end - start, Relaxed);
            for b in start..end {
                f.blocks.get_mut(&b).expect("dirty block").dirty = false;
            }
        }
        Ok(())
    }

    /// Makes room for `n` more blocks, writing back dirty victims.
    fn make_room(&self, g: &mut Inner, n: usize) -> Result<(), Refusal> {
        while g.blocks + n > self.capacity {
            let Some((&t, (key, blk))) = g.lru.iter().next() else {
                return Ok(());
            };
            let (key, blk) = (key.clone(), *blk);
            if g.files
                .get(&key)
                .and_then(|f| f.blocks.get(&blk))
                .is_some_and(|b| b.dirty)
            {
                self.write_back(g, &key, blk..blk + 1)?;
            }
            g.lru.remove(&t);
            let f = g.files.get_mut(&key).expect("cached file");
            f.blocks.remove(&blk);
            g.blocks -= 1;
            self.c.evictions.fetch_add(1, Relaxed);
        }
        Ok(())
    }

    fn insert(&self, g: &mut Inner, key: &Key, blk: u64, data: Box<[u8; PAGE_SIZE]>, dirty: bool) {
        g.tick += 1;
        let t = g.tick;
        g.lru.insert(t, (key.clone(), blk));
        g.blocks += 1;
        g.files
            .get_mut(key)
            .expect("cached file")
            .blocks
            .insert(blk, Block { data, dirty, tick: t });
    }

    /// Reads blocks [start, end) of a file from the sComponent (zeros past its end).
    fn fetch(&self, scomp: &str, key: &Key, start: u64, end: u64) -> Result<Vec<Box<[u8; PAGE_SIZE]>>, Refusal> {
        let msg = M2S_READ {
            vnode: key.0.clone(),
            ino: key.1,
            offset: start * BLOCK,
            len: ((end - start) * BLOCK) as u32,
        };
        let data = self.call(scomp, msg)?.data.into_vec();
        self.c.fetches.fetch_add(1, Relaxed);
        self.c.misses.fetch_add(end - start, Relaxed);
        Ok((start..end)
            .map(|b| {
                let mut blk = Box::new([0u8; PAGE_SIZE]);
                let o = ((b - start) * BLOCK) as usize;
                if o < data.len() {
                    let n = (data.len() - o).min(PAGE_SIZE);
                    blk[..n].copy_from_slice(&data[o..o + n]);
                }
                blk
            })
            .collect())
    }

    fn read(&self, scomp: &str, key: Key, offset: u64, len: u32) -> Result<M2P_FILE_DATA, Refusal> {
        let mut g = self.inner.lock().unwrap();
        let f = self.file(&mut g, scomp, &key)?;
        let end = (offset + len as u64).min(f.size);
        if end <= offset {
            return Ok(M2P_FILE_DATA { data: ByteBuf::new() });
        }
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        let mut missing: Vec<u64> = (first..=last).filter(|b| !f.blocks.contains_key(b)).collect();
        let demanded = missing.len() as u64;
        // A window beyond half the cache would evict its own blocks before they are read.
        f.window = self
            .read_ahead
            .window(first == f.next_read, f.window)
            .min(self.capacity as u64 / 2);
        f.next_read = last + 1;
        if missing.last() == Some(&last) && f.window > 0 {
            let file_blocks = f.size.div_ceil(BLOCK);
            missing.extend((last + 1..(last + 1 + f.window).min(file_blocks)).filter(|b| !f.blocks.contains_key(b)));
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let mut fetched: HashMap<u64, Box<[u8; PAGE_SIZE]>> = HashMap::new();
        for (s, e) in runs(&missing) {
            for (b, data) in (s..e).zip(self.fetch(scomp, &key, s, e)?) {
                fetched.insert(b, data);
            }
        }
        let f = g.files.get(&key).expect("cached file");
        for b in first..=last {
            let data: &[u8; PAGE_SIZE] = match f.blocks.get(&b) {
                Some(blk) => &blk.data,
                None => &fetched[&b],
            };
            let bstart = b * BLOCK;
            let from = offset.max(bstart);
            let to = end.min(bstart + BLOCK);
            out[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&data[(from - bstart) as usize..(to - bstart) as usize]);
        }
        let hits = (last - first + 1) - demanded;
        self.c.hits.fetch_add(hits, Relaxed);
        for b in first..=last {
            Self::touch(&mut g, &key, b);
        }
        // Blocks a read brought in are kept only as far as the cache holds them.
        let mut fetched: Vec<_> = fetched.into_iter().collect();
        fetched.sort_by_key(|(b, _)| *b);
        let keep = fetched.len().min(self.capacity);
        self.c.prefetched.fetch_add(fetched.len() as u64 - demanded, Relaxed);
        self.make_room(&mut g, keep)?;
        for (b, data) in fetched.into_iter().take(keep) {
            self.insert(&mut g, &key, b, data, false);
        }
        Ok(M2P_FILE_DATA {
            data: ByteBuf::from(out),
        })
    }

    fn write(&self, scomp: &str, key: Key, offset: u64, data: &[u8]) -> Result<M2P_FILE_SIZE, Refusal> {
        let mut g = self.inner.lock().unwrap();
        let f = self.file(&mut g, scomp, &key)?;
        let end = offset + data.len() as u64;
        if end > f.reserved {
            let want = end.div_ceil(RESERVE_STEP) * RESERVE_STEP;
            self.call(
                scomp,
                M2S_RESERVE {
                    vnode: key.0.clone(),
                    ino: key.1,
                    bytes: want,
                },
            )?;
            f.reserved = want;
        }
        f.active = true;
        if data.is_empty() {
            return Ok(M2P_FILE_SIZE {
                size: Some(f.size),
                mtime_ns: f.mtime_ns,
            });
        }
        let old_size = f.size;
        // The new size first: a block of this write evicted before the loop ends is written
        // back only up to the size.
        f.size = f.size.max(end);
        let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
        for b in first..=last {
            let bstart = b * BLOCK;
            let from = offset.max(bstart);
            let to = end.min(bstart + BLOCK);
            let cached = g.files[&key].blocks.contains_key(&b);
            if !cached {
                let whole = from == bstart && to == bstart + BLOCK;
                // A partly written block keeps the rest of its bytes: read it first if it has any.
                let mut blk = if !whole && bstart < old_size {
                    self.fetch(scomp, &key, b, b + 1)?.pop().expect("one block")
                } else {
                    Box::new([0u8; PAGE_SIZE])
                };
                blk[(from - bstart) as usize..(to - bstart) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                self.make_room(&mut g, 1)?;
                self.insert(&mut g, &key, b, blk, true);
            } else {
                let f = g.files.get_mut(&key).expect("cached file");
                let blk = f.blocks.get_mut(&b).expect("cached block");
                blk.data[(from - bstart) as usize..(to - bstart) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                blk.dirty = true;
                Self::touch(&mut g, &key, b);
            }
        }
        let f = g.files.get_mut(&key).expect("cached file");
        f.mtime_ns = now_ns();
        Ok(M2P_FILE_SIZE {
            size: Some(f.size),
            mtime_ns: f.mtime_ns,
        })
    }

    fn set_size(&self, scomp: &str, key: Key, size: u64) -> Result<M2P_FILE_SIZE, Refusal> {
        let mut g = self.inner.lock().unwrap();
        self.file(&mut g, scomp, &key)?;
        self.call(
            scomp,
            M2S_SETSIZE {
                vnode: key.0.clone(),
                ino: key.1,
                size,
            },
        )?;
        let keep_blocks = size.div_ceil(BLOCK);
        let f = g.files.get_mut(&key).expect("cached file");
        let gone: Vec<(u64, u64)> = f.blocks.range(keep_blocks..).map(|(b, blk)| (*b, blk.tick)).collect();
        for (b, _) in &gone {
            f.blocks.remove(b);
        }
        if !size.is_multiple_of(BLOCK) {
            if let Some(blk) = f.blocks.get_mut(&(size / BLOCK)) {
                blk.data[(size % BLOCK) as usize..].fill(0);
            }
        }
        f.size = size;
        f.reserved = size;
        f.mtime_ns = now_ns();
        let reply = M2P_FILE_SIZE {
            size: Some(f.size),
            mtime_ns: f.mtime_ns,
        };
        for (_, t) in gone {
            g.lru.remove(&t);
            g.blocks -= 1;
        }
        Ok(reply)
    }

    fn sync(&self, scomp: &str, key: Key) -> Result<OK, Refusal> {
        let mut g = self.inner.lock().unwrap();
        if g.files.contains_key(&key) {
            // Blocks that cannot reach the sComponent were not made durable, whatever the reason.
            self.write_back(&mut g, &key, 0..u64::MAX).map_err(|e| match e.code {
                ErrCode::Errno(libc::ENOENT) => ERR::new(ErrCode::Errno(libc::EIO), e.msg),
                _ => e,
            })?;
        }
        drop(g);
        self.call(
            scomp,
            X2S_SYNC {
                vnode: key.0,
                ino: Some(key.1),
            },
        )
    }

    fn forget(&self, key: Key) {
        let mut g = self.inner.lock().unwrap();
        if let Some(f) = g.files.remove(&key) {
            for blk in f.blocks.values() {
                g.lru.remove(&blk.tick);
            }
            g.blocks -= f.blocks.len();
        }
    }

    /// Makes every cached file durable on its sComponent and forgets it, for an mComponent
    /// that leaves (its files' caches go elsewhere). True when nothing is left.
    pub fn release(&self) -> bool {
        let files: Vec<(Key, String)> = self
            .inner
            .lock()
            .unwrap()
            .files
            .iter()
            .map(|(k, f)| (k.clone(), f.scomp.clone()))
            .collect();
        for (key, scomp) in files {
            match self.sync(&scomp, key.clone()) {
                Ok(_) => self.forget(key),
                Err(e) => {
                    tracing::warn!(vnode = %key.0, ino = key.1, error = %e.msg, "cannot write a leaving buffer cache's file back yet")
                }
            }
        }
        self.inner.lock().unwrap().files.is_empty()
    }

    /// The background write back: every file's dirty blocks, one file per lock hold. Files
    /// not written since the last pass give back reservation past their data.
    pub fn write_back_all(&self) {
        let keys: Vec<Key> = self.inner.lock().unwrap().files.keys().cloned().collect();
        for k in keys {
            let mut g = self.inner.lock().unwrap();
            match self.write_back(&mut g, &k, 0..u64::MAX) {
                // Deleted where this cache did not hear of it (another pComponent): nothing to keep.
                Err(e) if e.code == ErrCode::Errno(libc::ENOENT) => {
                    tracing::warn!(vnode = %k.0, ino = k.1, "file deleted while cached; its buffered blocks are dropped");
                    drop(g);
                    self.forget(k);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(vnode = %k.0, ino = k.1, error = %e.msg, "background write back failed; will retry");
                    continue;
                }
                Ok(()) => {}
            }
            let Some(f) = g.files.get_mut(&k) else { continue };
            let need = f.size.div_ceil(BLOCK) * BLOCK;
            if !f.active && f.reserved > need {
                let msg = M2S_RESERVE {
                    vnode: k.0.clone(),
                    ino: k.1,
                    bytes: need,
                };
                if self.peers.call(&f.scomp, msg).is_ok() {
                    f.reserved = need;
                }
            }
            f.active = false;
        }
    }

    pub fn file_read(&self, r: P2M_FILE_READ) -> Result<M2P_FILE_DATA, Refusal> {
        fits(r.offset, r.len as u64)?;
        self.read(&r.scomp, (r.vnode, r.ino), r.offset, r.len.min(MAX_BODY / 2))
    }

    pub fn file_write(&self, r: P2M_FILE_WRITE) -> Result<M2P_FILE_SIZE, Refusal> {
        fits(r.offset, r.data.len() as u64)?;
        self.write(&r.scomp, (r.vnode, r.ino), r.offset, &r.data)
    }

    pub fn file_setsize(&self, r: P2M_FILE_SETSIZE) -> Result<M2P_FILE_SIZE, Refusal> {
        fits(r.size, 0)?;
        self.set_size(&r.scomp, (r.vnode, r.ino), r.size)
    }

    pub fn file_sync(&self, r: P2M_FILE_SYNC) -> Result<OK, Refusal> {
        self.sync(&r.scomp, (r.vnode, r.ino))
    }

    pub fn file_stat(&self, r: P2M_FILE_STAT) -> Result<M2P_FILE_SIZE, Refusal> {
        let g = self.inner.lock().unwrap();
        Ok(match g.files.get(&(r.vnode, r.ino)) {
            Some(f) => M2P_FILE_SIZE {
                size: Some(f.size),
                mtime_ns: f.mtime_ns,
            },
            None => M2P_FILE_SIZE {
                size: None,
                mtime_ns: 0,
            },
        })
    }

    pub fn file_forget(&self, r: P2M_FILE_FORGET) -> Result<OK, Refusal> {
        self.forget((r.vnode, r.ino));
        Ok(OK)
    }

    pub fn stats(&self) -> serde_json::Value {
        let g = self.inner.lock().unwrap();
        let dirty: usize = g
            .files
            .values()
            .map(|f| f.blocks.values().filter(|b| b.dirty).count())
            .sum();
        counters::json_with(
            self.c.counters(),
            serde_json::json!({
                "capacity_blocks": self.capacity, "blocks": g.blocks, "dirty_blocks": dirty, "files": g.files.len(),
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_consecutive_and_bounded() {
        assert_eq!(runs(&[1, 2, 3, 7, 8, 10]), vec![(1, 4), (7, 9), (10, 11)]);
        let long: Vec<u64> = (0..RUN_BLOCKS + 3).collect();
        assert_eq!(runs(&long), vec![(0, RUN_BLOCKS), (RUN_BLOCKS, RUN_BLOCKS + 3)]);
        assert!(runs(&[]).is_empty());
    }

    #[test]
    fn sequential_window_doubles_to_its_maximum_and_random_reads_close_it() {
        let p = SequentialReadAhead { max_blocks: 32 };
        let grown: Vec<u64> = std::iter::successors(Some(0), |w| Some(p.window(true, *w)))
            .take(6)
            .collect();
        assert_eq!(grown, vec![0, 4, 8, 16, 32, 32]);
        assert_eq!(p.window(false, 32), 0);
        assert_eq!(
            SequentialReadAhead { max_blocks: 0 }.window(true, 0),
            0,
            "readahead = 0 is off"
        );
    }
}
