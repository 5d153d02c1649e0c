//! The disaggregated DMA engine (the paper's dDMA): moves a socket's bytes between an
//! mComponent's socket buffer and the proxy, so that on the DMA path the stub never carries
//! them to the nComponent itself. Its threads make the calls to mComponents that the proxy,
//! which never blocks, must not.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crossbeam_channel::Sender;
use splitos_rpc::*;

use super::proxy::{Counters, Job, ProxyHandle};
use crate::node::Node;

/// Threads of the engine: a call to an mComponent takes tens of microseconds, and each
/// socket has at most one send and one receive under way.
const THREADS: usize = 2;

enum Work {
    /// Fetch the bytes of a send from their buffer, then give them to the proxy.
    Fetch(P2N_SEND_DMA, Option<[u8; 32]>, Reply),
    /// Store received bytes in a buffer, then answer their count.
    Store { mcomp: String, buf: u64, offset: u32, data: serde_bytes::ByteBuf, eof: bool, reply: Reply },
}

pub struct Ddma {
    tx: Sender<Work>,
}

impl Ddma {
    pub fn start(node: Arc<Node>, proxy: Arc<ProxyHandle>, c: Arc<Counters>) -> std::io::Result<Ddma> {
        let (tx, rx) = crossbeam_channel::unbounded::<Work>();
        for i in 0..THREADS {
            let (rx, node, proxy, c) = (rx.clone(), node.clone(), proxy.clone(), c.clone());
            std::thread::Builder::new().name(format!("ddma-{i}")).spawn(move || {
                for w in rx {
                    work(&node, &proxy, &c, w);
                }
            })?;
        }
        Ok(Ddma { tx })
    }

    pub fn fetch_and_send(&self, r: P2N_SEND_DMA, key: Option<[u8; 32]>, reply: Reply) {
        self.put(Work::Fetch(r, key, reply));
    }

    /// The answer to give a receive's bytes to, which stores them in `buf` on `mcomp` and
    /// answers `reply` with their count.
    pub fn store_received(&self, mcomp: String, buf: u64, offset: u32, reply: Reply) -> Reply {
        let tx = self.tx.clone();
        Box::new(move |m| match m {
            Msg::N2P_DATA(d) if !d.data.is_empty() => {
                if let Err(e) = tx.send(Work::Store { mcomp, buf, offset, data: d.data, eof: d.eof, reply }) {
                    let Work::Store { reply, .. } = e.into_inner() else { unreachable!() };
                    reply(Msg::ERR(ERR::new(ErrCode::Internal, "the nComponent's DMA engine is gone")));
                }
            }
            Msg::N2P_DATA(d) => reply(N2P_RECEIVED { len: 0, eof: d.eof }.into()),
            other => reply(other),
        })
    }

    fn put(&self, w: Work) {
        if let Err(e) = self.tx.send(w) {
            let (Work::Fetch(_, _, reply) | Work::Store { reply, .. }) = e.into_inner();
            reply(Msg::ERR(ERR::new(ErrCode::Internal, "the nComponent's DMA engine is gone")));
        }
    }
}

fn work(node: &Node, proxy: &ProxyHandle, c: &Arc<Counters>, w: Work) {
    match w {
        Work::Fetch(r, key, reply) => match node.rpc.call(&r.mcomp, N2M_NETBUF_READ { buf: r.buf, offset: r.offset, len: r.len }) {
            Ok(d) => {
                let n = d.data.len() as u64;
                let counted: Reply = {
                    let c = c.clone();
                    Box::new(move |m| {
                        if matches!(m, Msg::OK(_)) {
                            c.dma_sent.fetch_add(n, Relaxed);
                            metrics::counter!("ncomp_path_bytes_total", "dir" => "sent", "path" => "dma").increment(n);
                        }
                        reply(m)
                    })
                };
                proxy.submit(Job(P2N_SEND { sock: r.sock, data: d.data }.into(), key, counted));
            }
            Err(e) => {
                tracing::warn!(mcomp = %r.mcomp, error = %e, "could not fetch a send's bytes from its socket buffer");
                reply(Msg::ERR(Refusal::errno(libc::EIO)));
            }
        },
        Work::Store { mcomp, buf, offset, data, eof, reply } => {
            let len = data.len() as u32;
            match node.rpc.call(&mcomp, N2M_NETBUF_WRITE { buf, offset, data }) {
                Ok(_) => {
                    c.dma_received.fetch_add(len as u64, Relaxed);
                    metrics::counter!("ncomp_path_bytes_total", "dir" => "received", "path" => "dma").increment(len as u64);
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
