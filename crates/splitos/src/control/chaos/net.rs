//! The network workload of a chaos run whose cluster has nComponents: a program fetches a
//! document of 1 MiB over HTTP from a server of the host's on its loopback, through the
//! nComponent that carries the program's sockets. The server runs in the chaos process
//! itself, natively, for the whole run (the native run of the workload fetches from it too).
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// The workload's name (`--without network` leaves it out).
pub(super) const NAME: &str = "network";
/// The document's size: many segments, so that a fault can land mid-transfer.
const BODY: usize = 1 << 20;
/// The most of a request read (the workload's is a few lines).
const REQUEST_MAX: usize = 8192;

/// Starts the server on an unused port of the host's loopback; returns the port.
pub(super) fn serve() -> anyhow::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    let body: Vec<u8> = (0..BODY).map(|i| (i * 7 % 251) as u8).collect();
    let body: &'static [u8] = body.leak();
    std::thread::Builder::new().name("chaos-http".into()).spawn(move || {
        for s in l.incoming().flatten() {
            let _ = std::thread::Builder::new()
                .name("chaos-http".into())
                .spawn(move || answer(s, body));
        }
    })?;
    Ok(port)
}

/// Reads a request's head and sends the document; a client gone meanwhile is no concern.
fn answer(mut s: TcpStream, body: &[u8]) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < REQUEST_MAX {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let _ = write!(
        s,
        "HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(body);
}

/// The workload's command: the document's SHA-256, as natively.
pub(super) fn workload(port: u16) -> String {
    format!(
        "python3 -c 'import hashlib, urllib.request\nwith urllib.request.urlopen(\"http://127.0.0.1:{port}/\", timeout=30) as r:\n    print(hashlib.sha256(r.read()).hexdigest())'"
    )
}
