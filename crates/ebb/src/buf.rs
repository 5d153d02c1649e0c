//! Chains of I/O buffers: reference-counted slices ([`Bytes`]) strung together, so that a
//! reply made of a header, a stored value and a trailer is written with one `writev` and the
//! value is never copied. Appending, consuming and splitting move references, not bytes.
use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};

use bytes::{Buf, Bytes};

/// Most slices handed to one `writev` (Linux takes up to 1024; more than this rarely helps).
const MOST_SLICES: usize = 64;

#[derive(Default, Debug, Clone)]
pub struct Chain {
    parts: VecDeque<Bytes>,
    len: usize,
}

impl Chain {
    pub fn new() -> Chain {
        Chain::default()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slices in the chain.
    pub fn parts(&self) -> usize {
        self.parts.len()
    }

    /// Appends `b` without copying it (an empty slice is dropped).
    pub fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.len += b.len();
            self.parts.push_back(b);
        }
    }

    pub fn push_static(&mut self, b: &'static [u8]) {
        self.push(Bytes::from_static(b))
    }

    /// Appends every slice of `other`.
    pub fn append(&mut self, other: Chain) {
        self.len += other.len;
        self.parts.extend(other.parts);
    }

    /// Splits off the first `n` bytes as a chain of their own (`n` at most [`Chain::len`]):
    /// a slice that straddles the cut is shared by both, not copied.
    pub fn split_to(&mut self, n: usize) -> Chain {
        assert!(n <= self.len, "split_to({n}) of a chain of {}", self.len);
        let mut head = Chain::new();
        while head.len < n {
            let mut p = self.parts.pop_front().expect("counted");
            let want = n - head.len;
            if p.len() > want {
                let rest = p.split_off(want);
                self.parts.push_front(rest);
            }
            self.len -= p.len();
            head.push(p);
        }
        head
    }

    /// Writes as much as `w` takes in one vectored write, and drops what it took.
    pub fn write_to(&mut self, w: &mut impl Write) -> io::Result<usize> {
        let slices: Vec<IoSlice<'_>> = self.parts.iter().take(MOST_SLICES).map(|p| IoSlice::new(p)).collect();
        let n = w.write_vectored(&slices)?;
        self.advance(n);
        Ok(n)
    }
}

impl Buf for Chain {
    fn remaining(&self) -> usize {
        self.len
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map_or(&[], |p| p)
    }

    fn advance(&mut self, mut n: usize) {
        assert!(n <= self.len, "advance({n}) past the end of a chain of {}", self.len);
        self.len -= n;
        while n > 0 {
            let p = self.parts.front_mut().expect("counted");
            if p.len() > n {
                p.advance(n);
                return;
            }
            n -= p.len();
            self.parts.pop_front();
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        let mut n = 0;
        for (d, p) in dst.iter_mut().zip(&self.parts) {
            *d = IoSlice::new(p);
            n += 1;
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_splits_and_writes_without_copying_its_slices() {
        let value = Bytes::from(vec![7u8; 1000]);
        let mut c = Chain::new();
        c.push_static(b"VALUE k 0 1000\r\n");
        c.push(value.clone());
        c.push_static(b"\r\n");
        c.push(Bytes::new());
        assert_eq!((c.len(), c.parts()), (1018, 3));
        let mut head = c.split_to(516);
        assert_eq!((head.len(), c.len()), (516, 502));
        // The value's bytes are the same memory in both halves: shared, not copied.
        assert_eq!(head.parts.back().unwrap().as_ptr(), value.as_ptr());
        assert_eq!(c.chunk().as_ptr(), value[500..].as_ptr());
        let mut out = Vec::new();
        while !head.is_empty() {
            head.write_to(&mut out).unwrap();
        }
        while !c.is_empty() {
            c.write_to(&mut out).unwrap();
        }
        let mut want = b"VALUE k 0 1000\r\n".to_vec();
        want.extend_from_slice(&value);
        want.extend_from_slice(b"\r\n");
        assert_eq!(out, want);
    }

    #[test]
    fn a_short_write_leaves_the_rest_in_order() {
        struct Short(Vec<u8>);
        impl Write for Short {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                let n = b.len().min(3);
                self.0.extend_from_slice(&b[..n]);
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut c = Chain::new();
        for p in [&b"ab"[..], b"cdef", b"g"] {
            c.push(Bytes::from_static(p));
        }
        let mut w = Short(Vec::new());
        while !c.is_empty() {
            c.write_to(&mut w).unwrap();
        }
        assert_eq!(w.0, b"abcdefg");
    }
}
