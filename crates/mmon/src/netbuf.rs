//! Socket buffers: memory a pComponent's socket stub holds on this mComponent for the DMA
//! path of the network (docs/network.md). The stub writes what a program sends into a buffer
//! and the nComponent fetches it from there; the nComponent writes what it received into
//! another and the stub reads it from there. A buffer serves only the pComponent that
//! allocated it, and an nComponent acting for that pComponent's socket: the nComponent names
//! the pComponent its own handshake with it proved.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use serde_bytes::ByteBuf;
use splitos_rpc::*;

use super::{Mem, Peers};

/// The largest socket buffer.
pub const NETBUF_MAX: u32 = 1 << 20;

struct NetBuf {
    owner: Option<[u8; 32]>,
    data: Vec<u8>,
}

#[derive(Default)]
pub struct NetBufs {
    bufs: Mutex<HashMap<u64, NetBuf>>,
    /// Bytes written into buffers by pComponents, and by nComponents.
    written_by_pcomps: AtomicU64,
    written_by_ncomps: AtomicU64,
    /// Bytes read out of buffers by nComponents, and by pComponents.
    read_by_ncomps: AtomicU64,
    read_by_pcomps: AtomicU64,
}

impl NetBufs {
    pub fn count(&self) -> usize {
        self.bufs.lock().unwrap().len()
    }

    pub fn stats(&self) -> serde_json::Value {
        serde_json::json!({
            "buffers": self.bufs.lock().unwrap().len(),
            "written_by_pcomponents": self.written_by_pcomps.load(Relaxed), "read_by_ncomponents": self.read_by_ncomps.load(Relaxed),
            "written_by_ncomponents": self.written_by_ncomps.load(Relaxed), "read_by_pcomponents": self.read_by_pcomps.load(Relaxed),
        })
    }
}

/// A socket buffer this mComponent does not keep (freed, or never allocated here).
#[derive(Debug, thiserror::Error)]
#[error("no socket buffer {0:x}")]
struct UnknownBuffer(u64);

impl Refuse for UnknownBuffer {
    fn code(&self) -> ErrCode {
        ErrCode::NotFound
    }
}

/// Bytes [offset, offset + len) of a buffer of `size`, or EINVAL.
fn span(size: usize, offset: u32, len: usize) -> Result<std::ops::Range<usize>, Refusal> {
    let start = offset as usize;
    match start.checked_add(len) {
        Some(end) if end <= size => Ok(start..end),
        _ => Err(Refusal::errno(libc::EINVAL)),
    }
}

/// Whose socket buffers are, in what the mComponent's memory holds ([`super::room`]).
const NO_VNODE: &str = "";

impl<P: Peers> Mem<P> {
    pub(super) fn netbuf_alloc(&self, r: P2M_NETBUF_ALLOC) -> Result<M2P_NETBUF, Refusal> {
        if r.bytes == 0 || r.bytes > NETBUF_MAX {
            return Err(Refusal::errno(libc::EINVAL));
        }
        // A socket buffer is no vNode's heap: no room kept for a quota covers it.
        self.commit(NO_VNODE, r.bytes as u64)?;
        let buf = splitos_rpc::auth::random_u64();
        let owner = current_peer().map(|p| p.key);
        self.netbufs.bufs.lock().unwrap().insert(
            buf,
            NetBuf {
                owner,
                data: vec![0; r.bytes as usize],
            },
        );
        self.room.add_pages(NO_VNODE, r.bytes as u64);
        crate::series::NETBUFS.increment(1.0);
        Ok(M2P_NETBUF { buf })
    }

    /// Runs `f` on buffer `buf` if the sender may use it: the pComponent that allocated it,
    /// or an nComponent acting for that pComponent's socket (`for_pcomp`).
    fn with_netbuf<T>(
        &self,
        buf: u64,
        for_pcomp: Option<[u8; 32]>,
        f: impl FnOnce(&mut Vec<u8>) -> Result<T, Refusal>,
    ) -> Result<T, Refusal> {
        let mut bufs = self.netbufs.bufs.lock().unwrap();
        let b = bufs.get_mut(&buf).ok_or(UnknownBuffer(buf))?;
        let asker = match current_peer() {
            Some(p) if p.role == Role::Proc => Some(p.key),
            Some(p) if p.role == Role::Net => for_pcomp,
            _ => b.owner,
        };
        if asker != b.owner {
            self.c.denied.fetch_add(1, Relaxed);
            return Err(UnknownBuffer(buf).into());
        }
        f(&mut b.data)
    }

    /// Frees the buffers of pComponents known to be gone.
    pub(super) fn netbufs_of_lost(&self, lost: &[LostPcomp]) {
        let mut bufs = self.netbufs.bufs.lock().unwrap();
        let gone: Vec<u64> = bufs
            .iter()
            .filter(|(_, b)| lost.iter().any(|l| Some(l.key) == b.owner))
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            if let Some(b) = bufs.remove(&id) {
                self.release_netbuf(b.data.len() as u64);
            }
        }
    }

    pub(super) fn netbuf_free(&self, r: P2M_NETBUF_FREE) -> Result<OK, Refusal> {
        self.with_netbuf(r.buf, None, |_| Ok(()))?;
        // Looked up and removed in one step: a second free of the same buffer finds nothing.
        let Some(b) = self.netbufs.bufs.lock().unwrap().remove(&r.buf) else {
            return Err(UnknownBuffer(r.buf).into());
        };
        self.release_netbuf(b.data.len() as u64);
        Ok(OK)
    }

    fn release_netbuf(&self, size: u64) {
        self.room.uncommit(NO_VNODE, size);
        self.room.free_pages(NO_VNODE, size);
        crate::series::NETBUFS.decrement(1.0);
    }

    pub(super) fn netbuf_write(
        &self,
        buf: u64,
        for_pcomp: Option<[u8; 32]>,
        offset: u32,
        data: &[u8],
    ) -> Result<OK, Refusal> {
        self.with_netbuf(buf, for_pcomp, |d| {
            let at = span(d.len(), offset, data.len())?;
            d[at].copy_from_slice(data);
            Ok(OK)
        })?;
        let by_ncomp = current_peer().is_some_and(|p| p.role == Role::Net);
        if by_ncomp {
            &self.netbufs.written_by_ncomps
        } else {
            &self.netbufs.written_by_pcomps
        }
        .fetch_add(data.len() as u64, Relaxed);
        Ok(OK)
    }

    pub(super) fn netbuf_read(
        &self,
        buf: u64,
        for_pcomp: Option<[u8; 32]>,
        offset: u32,
        len: u32,
    ) -> Result<ByteBuf, Refusal> {
        let data = self.with_netbuf(buf, for_pcomp, |d| Ok(d[span(d.len(), offset, len as usize)?].to_vec()))?;
        let by_ncomp = current_peer().is_some_and(|p| p.role == Role::Net);
        if by_ncomp {
            &self.netbufs.read_by_ncomps
        } else {
            &self.netbufs.read_by_pcomps
        }
        .fetch_add(data.len() as u64, Relaxed);
        Ok(ByteBuf::from(data))
    }
}
