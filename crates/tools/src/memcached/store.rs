//! The items: a hash table in shards, each with its own lock, LRU list and share of the
//! memory limit. A store that finds its shard full evicts that shard's least recently used
//! items, as memcached evicts within a slab class.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use slab::Slab;

/// What an item costs beyond its key and value (the table's entry, the list's links, the
/// item's fields), so that many tiny items cannot overrun the limit.
pub const ITEM_OVERHEAD: usize = 64;
/// Longest key, as memcached's.
pub const KEY_MAX: usize = 250;
/// Relative expiry times above this are absolute Unix times, as memcached reads them.
const REL_TIME_MAX: i64 = 60 * 60 * 24 * 30;

#[derive(Clone, Debug)]
pub struct Item {
    pub value: Bytes,
    pub flags: u32,
    pub cas: u64,
    /// Unix seconds it expires at; 0 never.
    exptime: u64,
    /// Unix seconds it was stored at (a delayed flush compares it).
    stored: u64,
}

struct Node {
    key: Bytes,
    item: Item,
    prev: Option<usize>,
    next: Option<usize>,
}

/// One shard: its items, most recently used first.
#[derive(Default)]
struct Shard {
    map: HashMap<Bytes, usize>,
    nodes: Slab<Node>,
    head: Option<usize>,
    tail: Option<usize>,
    bytes: usize,
}

/// How a store command treats an existing item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    /// Stores only over the item with this cas.
    Cas(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    Stored(u64),
    NotStored,
    Exists,
    NotFound,
    TooLarge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeltaError {
    NotFound,
    NonNumeric,
    /// The cas given does not match.
    Exists,
}

/// Counters of the whole table (the per-core command counters are the representatives').
#[derive(Default)]
pub struct TableCounts {
    pub evictions: AtomicU64,
    pub total_items: AtomicU64,
    pub expired_unfetched: AtomicU64,
}

pub struct Table {
    shards: Vec<Mutex<Shard>>,
    shard_limit: usize,
    item_max: usize,
    cas: AtomicU64,
    /// Items whose cas is below this were flushed (0: no immediate flush yet).
    flushed_below_cas: AtomicU64,
    /// Items stored before this Unix second are flushed once it has passed (0: none pending).
    flush_at: AtomicU64,
    pub counts: TableCounts,
}

/// Unix seconds now.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An expiry as a client writes it (0 never, negative already, up to 30 days relative, else an
/// absolute Unix time) as absolute Unix seconds, 0 for never.
pub fn expiry(exptime: i64, now: u64) -> u64 {
    match exptime {
        0 => 0,
        e if e < 0 => 1,
        e if e <= REL_TIME_MAX => now + e as u64,
        e => (e as u64).max(1),
    }
}

fn fnv(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

fn cost(key: &[u8], value: &[u8]) -> usize {
    key.len() + value.len() + ITEM_OVERHEAD
}

/// The number an incr or decr reads from a value: digits, then nothing but white space (a
/// value shortened in place keeps trailing spaces).
fn numeric(v: &[u8]) -> Option<u64> {
    let digits = v.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || !v[digits..].iter().all(|b| b.is_ascii_whitespace()) {
        return None;
    }
    std::str::from_utf8(&v[..digits]).ok()?.parse().ok()
}

impl Shard {
    fn unlink(&mut self, i: usize) {
        let (prev, next) = (self.nodes[i].prev, self.nodes[i].next);
        match prev {
            Some(p) => self.nodes[p].next = next,
            None => self.head = next,
        }
        match next {
            Some(n) => self.nodes[n].prev = prev,
            None => self.tail = prev,
        }
    }

    fn push_front(&mut self, i: usize) {
        self.nodes[i].prev = None;
        self.nodes[i].next = self.head;
        if let Some(h) = self.head {
            self.nodes[h].prev = Some(i);
        }
        self.head = Some(i);
        if self.tail.is_none() {
            self.tail = Some(i);
        }
    }

    fn touch_lru(&mut self, i: usize) {
        if self.head != Some(i) {
            self.unlink(i);
            self.push_front(i);
        }
    }

    fn remove(&mut self, i: usize) -> Node {
        self.unlink(i);
        let n = self.nodes.remove(i);
        self.map.remove(&n.key);
        self.bytes -= cost(&n.key, &n.item.value);
        n
    }
}

impl Table {
    /// A table holding at most `limit` bytes in `shards` shards; items larger than `item_max`
    /// (or than a shard's share) are refused.
    pub fn new(limit: usize, shards: usize, item_max: usize) -> Table {
        let shards = shards.max(1);
        Table {
            shards: (0..shards).map(|_| Mutex::default()).collect(),
            shard_limit: limit / shards,
            item_max: item_max.min(limit / shards),
            cas: AtomicU64::new(0),
            flushed_below_cas: AtomicU64::new(0),
            flush_at: AtomicU64::new(0),
            counts: TableCounts::default(),
        }
    }

    /// The largest value (with its key) an item may have.
    pub fn item_max(&self) -> usize {
        self.item_max
    }

    pub fn limit(&self) -> usize {
        self.shard_limit * self.shards.len()
    }

    fn shard(&self, key: &[u8]) -> std::sync::MutexGuard<'_, Shard> {
        let i = (fnv(key) % self.shards.len() as u64) as usize;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    fn next_cas(&self) -> u64 {
        self.cas.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn dead(&self, it: &Item, now: u64) -> bool {
        let below = self.flushed_below_cas.load(Ordering::Relaxed);
        let at = self.flush_at.load(Ordering::Relaxed);
        (it.exptime != 0 && it.exptime <= now) || it.cas < below || (at != 0 && at <= now && it.stored < at)
    }

    /// The live item under `key`, if any (a dead one is removed on the way).
    fn find(&self, s: &mut Shard, key: &[u8], now: u64) -> Option<usize> {
        let i = *s.map.get(key)?;
        if self.dead(&s.nodes[i].item, now) {
            s.remove(i);
            self.counts.expired_unfetched.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Some(i)
    }

    /// The item under `key`, made the most recently used; with `touch`, its expiry is reset.
    pub fn get(&self, key: &[u8], touch: Option<i64>) -> Option<Item> {
        let now = now();
        let mut s = self.shard(key);
        let i = self.find(&mut s, key, now)?;
        s.touch_lru(i);
        if let Some(e) = touch {
            s.nodes[i].item.exptime = expiry(e, now);
        }
        Some(s.nodes[i].item.clone())
    }

    /// Resets an item's expiry: whether it was there.
    pub fn touch(&self, key: &[u8], exptime: i64) -> bool {
        self.get(key, Some(exptime)).is_some()
    }

    pub fn delete(&self, key: &[u8], cas: Option<u64>) -> Result<(), DeltaError> {
        let mut s = self.shard(key);
        let i = self.find(&mut s, key, now()).ok_or(DeltaError::NotFound)?;
        if cas.is_some_and(|c| c != s.nodes[i].item.cas) {
            return Err(DeltaError::Exists);
        }
        s.remove(i);
        Ok(())
    }

    /// Stores `value` under `key` as `mode` says.
    pub fn store(&self, mode: Mode, key: &[u8], flags: u32, exptime: i64, value: Bytes) -> Stored {
        let now = now();
        let mut s = self.shard(key);
        let old = self.find(&mut s, key, now);
        if cost(key, &value) - ITEM_OVERHEAD > self.item_max {
            // As memcached: a set that cannot be stored leaves no stale value behind.
            if let (Mode::Set, Some(i)) = (mode, old) {
                s.remove(i);
            }
            return Stored::TooLarge;
        }
        let (value, flags, exptime) = match (mode, old) {
            (Mode::Add, Some(i)) => {
                // An add that finds the item still makes it the most recently used.
                s.touch_lru(i);
                return Stored::NotStored;
            }
            (Mode::Replace | Mode::Append | Mode::Prepend, None) => return Stored::NotStored,
            (Mode::Cas(_), None) => return Stored::NotFound,
            (Mode::Cas(c), Some(i)) if s.nodes[i].item.cas != c => return Stored::Exists,
            (Mode::Append | Mode::Prepend, Some(i)) => {
                let it = &s.nodes[i].item;
                let (a, b) = if mode == Mode::Append {
                    (&it.value, &value)
                } else {
                    (&value, &it.value)
                };
                let mut joined = Vec::with_capacity(a.len() + b.len());
                joined.extend_from_slice(a);
                joined.extend_from_slice(b);
                // memcached answers a concatenation it cannot allocate as one it did not store.
                if key.len() + joined.len() > self.item_max {
                    return Stored::NotStored;
                }
                (Bytes::from(joined), it.flags, it.exptime)
            }
            _ => (value, flags, expiry(exptime, now)),
        };
        let cas = self.next_cas();
        self.put(
            &mut s,
            key,
            Item {
                value,
                flags,
                cas,
                exptime,
                stored: now,
            },
        );
        Stored::Stored(cas)
    }

    /// Puts `item` under `key` (over any item there), evicting from the shard's cold end until
    /// it fits.
    fn put(&self, s: &mut Shard, key: &[u8], item: Item) {
        if let Some(&i) = s.map.get(key) {
            s.remove(i);
        }
        let need = cost(key, &item.value);
        while s.bytes + need > self.shard_limit {
            let Some(t) = s.tail else { break };
            s.remove(t);
            self.counts.evictions.fetch_add(1, Ordering::Relaxed);
        }
        let key = Bytes::copy_from_slice(key);
        let i = s.nodes.insert(Node {
            key: key.clone(),
            item,
            prev: None,
            next: None,
        });
        s.map.insert(key, i);
        s.push_front(i);
        s.bytes += need;
        self.counts.total_items.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `delta` to (or takes it from) the number stored under `key`. A missing item is
    /// created as `init` says (the binary protocol's initial value and expiry), else refused.
    /// Returns the new number and cas.
    pub fn delta(
        &self,
        key: &[u8],
        incr: bool,
        delta: u64,
        init: Option<(u64, i64)>,
        cas: Option<u64>,
    ) -> Result<(u64, u64), DeltaError> {
        let now = now();
        let mut s = self.shard(key);
        let Some(i) = self.find(&mut s, key, now) else {
            let (initial, exptime) = init.ok_or(DeltaError::NotFound)?;
            let cas = self.next_cas();
            let value = Bytes::from(initial.to_string());
            self.put(
                &mut s,
                key,
                Item {
                    value,
                    flags: 0,
                    cas,
                    exptime: expiry(exptime, now),
                    stored: now,
                },
            );
            return Ok((initial, cas));
        };
        if cas.is_some_and(|c| c != 0 && c != s.nodes[i].item.cas) {
            return Err(DeltaError::Exists);
        }
        let old = numeric(&s.nodes[i].item.value).ok_or(DeltaError::NonNumeric)?;
        let new = if incr {
            old.wrapping_add(delta)
        } else {
            old.saturating_sub(delta)
        };
        let mut text = new.to_string().into_bytes();
        let it = &s.nodes[i].item;
        // As memcached: a shorter number is written over the old one, padded with spaces.
        if text.len() < it.value.len() {
            text.resize(it.value.len(), b' ');
        }
        let cas = self.next_cas();
        let item = Item {
            value: Bytes::from(text),
            flags: it.flags,
            cas,
            exptime: it.exptime,
            stored: now,
        };
        self.put(&mut s, key, item);
        Ok((new, cas))
    }

    /// Flushes every item now, or every item stored before `delay` seconds from now once they
    /// have passed.
    pub fn flush(&self, delay: i64) {
        if delay > 0 {
            self.flush_at.store(expiry(delay, now()), Ordering::Relaxed);
        } else {
            // As memcached, whose one flush time this overwrites: a delayed flush still to
            // come is called off.
            self.flush_at.store(0, Ordering::Relaxed);
            self.flushed_below_cas
                .store(self.cas.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }

    /// Items and bytes held (flushed or expired ones until they are found dead count too, as
    /// in memcached).
    pub fn usage(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(n, b), s| {
            let s = s.lock().unwrap_or_else(|p| p.into_inner());
            (n + s.map.len() as u64, b + s.bytes as u64)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn store_modes_and_cas_behave_as_memcached() {
        let t = Table::new(1 << 20, 4, 1 << 20);
        assert_eq!(t.store(Mode::Replace, b"k", 0, 0, v("x")), Stored::NotStored);
        let Stored::Stored(c1) = t.store(Mode::Add, b"k", 5, 0, v("a")) else {
            panic!()
        };
        assert_eq!(t.store(Mode::Add, b"k", 0, 0, v("b")), Stored::NotStored);
        assert_eq!(t.store(Mode::Append, b"k", 9, 0, v("z")), Stored::Stored(c1 + 1));
        assert_eq!(t.store(Mode::Prepend, b"k", 9, 0, v("<")), Stored::Stored(c1 + 2));
        let it = t.get(b"k", None).unwrap();
        assert_eq!(
            (&it.value[..], it.flags),
            (&b"<az"[..], 5),
            "append and prepend keep the flags"
        );
        assert_eq!(t.store(Mode::Cas(c1), b"k", 0, 0, v("c")), Stored::Exists);
        assert!(matches!(
            t.store(Mode::Cas(it.cas), b"k", 0, 0, v("c")),
            Stored::Stored(_)
        ));
        assert_eq!(t.store(Mode::Cas(1), b"nope", 0, 0, v("c")), Stored::NotFound);
        assert_eq!(t.store(Mode::Set, b"gone", 0, -1, v("c")), Stored::Stored(c1 + 4));
        assert!(t.get(b"gone", None).is_none(), "a negative expiry has expired already");
        t.flush(0);
        assert!(t.get(b"k", None).is_none());
        t.store(Mode::Set, b"k", 0, 0, v("after"));
        assert!(t.get(b"k", None).is_some(), "stored after the flush");
    }

    #[test]
    fn incr_and_decr_wrap_floor_and_pad_as_memcached() {
        let t = Table::new(1 << 20, 1, 1 << 20);
        assert_eq!(t.delta(b"n", true, 1, None, None), Err(DeltaError::NotFound));
        t.store(Mode::Set, b"n", 3, 0, v("10"));
        assert_eq!(t.delta(b"n", false, 1, None, None).unwrap().0, 9);
        assert_eq!(&t.get(b"n", None).unwrap().value[..], b"9 ");
        assert_eq!(t.delta(b"n", true, 91, None, None).unwrap().0, 100);
        assert_eq!(t.delta(b"n", false, 1000, None, None).unwrap().0, 0);
        t.store(Mode::Set, b"n", 0, 0, v("18446744073709551615"));
        assert_eq!(t.delta(b"n", true, 2, None, None).unwrap().0, 1);
        t.store(Mode::Set, b"s", 0, 0, v("abc"));
        assert_eq!(t.delta(b"s", true, 1, None, None), Err(DeltaError::NonNumeric));
        assert_eq!(t.delta(b"new", true, 1, Some((42, 0)), None).unwrap().0, 42);
    }

    #[test]
    fn a_full_shard_evicts_its_least_recently_used_items() {
        let t = Table::new(10 * (ITEM_OVERHEAD + 101), 1, 1 << 20);
        for i in 0..10 {
            t.store(Mode::Set, format!("k{i}").as_bytes(), 0, 0, Bytes::from(vec![0u8; 99]));
        }
        assert!(t.get(b"k0", None).is_some(), "k0 is now the most recently used");
        t.store(Mode::Set, b"k10", 0, 0, Bytes::from(vec![0u8; 98]));
        assert!(t.get(b"k1", None).is_none(), "k1 was the least recently used");
        assert!(t.get(b"k0", None).is_some());
        assert_eq!(t.counts.evictions.load(Ordering::Relaxed), 1);
        assert!(t.usage().1 <= t.limit() as u64);
        assert_eq!(
            t.store(Mode::Set, b"k0", 0, 0, Bytes::from(vec![0u8; 2000])),
            Stored::TooLarge
        );
        assert!(t.get(b"k0", None).is_none(), "a set too large drops the old value");
    }
}
