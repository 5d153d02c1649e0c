//! The disaggregated DMA engine (the paper's dDMA): moves a socket's bytes between an
//! mComponent's socket buffer and the proxy, so that on the DMA path the stub never carries
//! them to the nComponent itself. Its threads make the calls to mComponents that the proxy,
//! which never blocks, must not. Each call names the pComponent the socket belongs to, and the
//! mComponent serves only that pComponent's buffers.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crossbeam_channel::{Sender, TrySendError};
use splitos_rpc::*;

use super::proxy::{Job, ProxyHandle, SocketError};
use super::series::Counters;
use splitos_core::node::Node;

/// Threads of the engine: a call to an mComponent takes tens of microseconds, and each
/// socket has at most one send and one receive under way.
const THREADS: usize = 2;
/// Transfers waiting for a thread; beyond it, new ones are refused (EAGAIN) rather than
/// queued without bound.
const QUEUE: usize = 4096;

enum Work {
    /// Fetch the bytes of a send from their buffer, then give them to the proxy.
    Fetch(P2N_SEND_DMA, [u8; 32], Reply),
    /// Store received bytes in a buffer, then answer their count.
    Store {
        owner: [u8; 32],
        mcomp: String,
        buf: u64,
        offset: u32,
        data: serde_bytes::ByteBuf,
        eof: bool,
        reply: Reply,
    },
}

impl Work {
    fn refuse(self, why: Refusal) {
        let (Work::Fetch(_, _, reply) | Work::Store { reply, .. }) = self;
        reply(Msg::ERR(why));
    }
}

pub struct Ddma {
    tx: Sender<Work>,
    proxy: Arc<ProxyHandle>,
}

impl Ddma {
    pub fn start(node: Arc<Node>, proxy: Arc<ProxyHandle>, c: Arc<Counters>) -> std::io::Result<Ddma> {
        let (tx, rx) = crossbeam_channel::bounded::<Work>(QUEUE);
        for i in 0..THREADS {
            let (rx, node, proxy, c) = (rx.clone(), node.clone(), proxy.clone(), c.clone());
            std::thread::Builder::new().name(format!("ddma-{i}")).spawn(move || {
                for w in rx {
                    work(&node, &proxy, &c, w);
                }
            })?;
        }
        Ok(Ddma { tx, proxy })
    }

    /// A send on the DMA path, for a socket of the sender (checked before any fetch).
    pub fn fetch_and_send(&self, r: P2N_SEND_DMA, key: Option<[u8; 32]>, reply: Reply) {
        if !self.proxy.owns(r.sock, key) {
            return reply(Msg::ERR(SocketError::NotYours(r.sock).into()));
        }
        put(&self.tx, Work::Fetch(r, key.unwrap_or([0; 32]), reply));
    }

    /// The answer to give a receive's bytes to, which stores them in `buf` on `mcomp` (a
    /// buffer of the pComponent `key`) and answers `reply` with their count.
    pub fn store_received(&self, key: Option<[u8; 32]>, mcomp: String, buf: u64, offset: u32, reply: Reply) -> Reply {
        let tx = self.tx.clone();
        let owner = key.unwrap_or([0; 32]);
        Box::new(move |m| match m {
            Msg::N2P_DATA(d) if !d.data.is_empty() => put(
                &tx,
                Work::Store {
                    owner,
                    mcomp,
                    buf,
                    offset,
                    data: d.data,
                    eof: d.eof,
                    reply,
                },
            ),
            Msg::N2P_DATA(d) => reply(N2P_RECEIVED { len: 0, eof: d.eof }.into()),
            other => reply(other),
        })
    }
}

fn put(tx: &Sender<Work>, w: Work) {
    match tx.try_send(w) {
        Ok(()) => {}
        Err(TrySendError::Full(w)) => w.refuse(Refusal::errno(libc::EAGAIN)),
        Err(TrySendError::Disconnected(w)) => w.refuse(SocketError::DmaGone.into()),
    }
}

fn work(node: &Node, proxy: &ProxyHandle, c: &Arc<Counters>, w: Work) {
    match w {
        Work::Fetch(r, owner, reply) => match node.rpc.call(
            &r.mcomp,
            N2M_NETBUF_READ {
                owner,
                buf: r.buf,
                offset: r.offset,
                len: r.len,
            },
        ) {
            Ok(d) => {
                let n = d.data.len() as u64;
                let c = c.clone();
                let counted: Reply = Box::new(move |m| {
                    if matches!(m, Msg::OK(_)) {
                        c.dma_sent_bytes.fetch_add(n, Relaxed);
                    }
                    reply(m)
                });
                proxy.submit(Job(
                    P2N_SEND {
                        sock: r.sock,
                        data: d.data,
                    }
                    .into(),
                    Some(owner),
                    counted,
                ));
            }
            Err(e) => {
                tracing::warn!(mcomp = %r.mcomp, error = %e, "could not fetch a send's bytes from its socket buffer");
                reply(Msg::ERR(Refusal::errno(libc::EIO)));
            }
        },
        Work::Store {
            owner,
            mcomp,
            buf,
            offset,
            data,
            eof,
            reply,
        } => {
            let len = data.len() as u32;
            match node.rpc.call(
                &mcomp,
                N2M_NETBUF_WRITE {
                    owner,
                    buf,
                    offset,
                    data,
                },
            ) {
                Ok(_) => {
                    c.dma_received_bytes.fetch_add(len as u64, Relaxed);
                    reply(N2P_RECEIVED { len, eof }.into());
                }
                Err(e) => {
                    tracing::warn!(%mcomp, error = %e, "could not store received bytes in their socket buffer");
                    reply(Msg::ERR(Refusal::errno(libc::EIO)));
                }
            }
        }
    }
}
