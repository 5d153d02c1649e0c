//! The serving side: an accept thread, a receiving thread per connection, and worker pools.
//!
//! Requests that may themselves call other components (`Handler::fans_out`) run on a separate
//! pool, so that two components calling each other can never exhaust each other's workers.
//!
//! With `workers: 0` the receiving thread serves leaf requests itself. Every connection has its
//! own receiving thread, so requests on different connections still run in parallel; on a
//! machine with few cores this saves the hand-off, which costs more than the work (a wake-up
//! of a halted virtual CPU per request).
use std::sync::{Arc, Mutex};

use crossbeam_channel::{unbounded, Receiver, Sender};

use crate::frame::{read_frame, write_frame, FrameError};
use crate::transport::{Conn, Listener};
use crate::wire::{FrameKind, Msg};

pub trait Handler: Send + Sync + 'static {
    fn handle(&self, msg: Msg) -> Msg;
    /// True for requests whose handling makes RPCs of its own.
    fn fans_out(&self, _msg: &Msg) -> bool {
        false
    }
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub name: String,
    /// Worker threads for leaf requests (the data path); 0 serves them on the receiving thread.
    pub workers: usize,
    /// Worker threads for requests that fan out to other components.
    pub fanout_workers: usize,
}

/// A running server; it serves until its process ends.
pub struct ServerHandle {
    pub addr: String,
}

type Job = (Arc<Mutex<Box<dyn Conn>>>, u64, Msg);

pub fn serve(listener: Box<dyn Listener>, handler: Arc<dyn Handler>, cfg: ServerConfig) -> ServerHandle {
    let addr = listener.local_addr();
    let (leaf_tx, leaf_rx) = unbounded::<Job>();
    let (fan_tx, fan_rx) = unbounded::<Job>();
    if cfg.workers > 0 {
        spawn_pool(&cfg.name, "w", cfg.workers, leaf_rx, handler.clone());
    }
    let inline = cfg.workers == 0;
    spawn_pool(&cfg.name, "f", cfg.fanout_workers.max(1), fan_rx, handler.clone());
    let name = cfg.name.clone();
    std::thread::Builder::new()
        .name(format!("{name}-accept"))
        .spawn(move || loop {
            match listener.accept() {
                Ok(conn) => {
                    let (leaf_tx, fan_tx, handler) = (leaf_tx.clone(), fan_tx.clone(), handler.clone());
                    let _ = std::thread::Builder::new()
                        .name(format!("{name}-rx"))
                        .spawn(move || receive_loop(conn, leaf_tx, fan_tx, handler, inline));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        })
        .expect("spawn accept thread");
    ServerHandle { addr }
}

fn spawn_pool(name: &str, tag: &str, n: usize, rx: Receiver<Job>, handler: Arc<dyn Handler>) {
    for i in 0..n {
        let (rx, handler) = (rx.clone(), handler.clone());
        std::thread::Builder::new()
            .name(format!("{name}-{tag}{i}"))
            .spawn(move || {
                for (conn, req_id, msg) in rx {
                    let reply = handler.handle(msg);
                    let mut c = conn.lock().unwrap();
                    if let Err(e) = write_frame(&mut **c, FrameKind::Reply, req_id, &reply) {
                        tracing::debug!(error = %e, "reply not delivered");
                    }
                }
            })
            .expect("spawn worker");
    }
}

fn receive_loop(conn: Box<dyn Conn>, leaf: Sender<Job>, fan: Sender<Job>, handler: Arc<dyn Handler>, inline: bool) {
    let peer = conn.peer();
    let mut reader = match conn.try_clone_box() {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "cannot clone connection");
            return;
        }
    };
    let writer = Arc::new(Mutex::new(conn));
    loop {
        match read_frame(&mut reader) {
            Ok(Some(f)) if f.kind == FrameKind::Request && inline && !handler.fans_out(&f.msg) => {
                let reply = handler.handle(f.msg);
                let mut c = writer.lock().unwrap();
                if let Err(e) = write_frame(&mut **c, FrameKind::Reply, f.req_id, &reply) {
                    tracing::debug!(error = %e, "reply not delivered");
                }
            }
            Ok(Some(f)) if f.kind == FrameKind::Request => {
                let q = if handler.fans_out(&f.msg) { &fan } else { &leaf };
                if q.send((writer.clone(), f.req_id, f.msg)).is_err() {
                    return;
                }
            }
            Ok(Some(f)) => {
                metrics::counter!("rpc_frames_rejected_total").increment(1);
                tracing::warn!(%peer, req_id = f.req_id, "unsolicited reply frame; closing connection");
                break;
            }
            Ok(None) => break,
            Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => {
                metrics::counter!("rpc_frames_rejected_total").increment(1);
                tracing::warn!(%peer, error = %e, "rejected malformed frame; closing that connection, still serving others");
                break;
            }
        }
    }
    writer.lock().unwrap().close();
}
