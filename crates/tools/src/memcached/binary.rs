//! memcached's binary protocol (protocol_binary.h of memcached 1.6): 24-byte headers, quiet
//! variants that answer only failures, and the same error texts as memcached's.
use bytes::{Buf, Bytes, BytesMut};

use super::store::{DeltaError, Mode, Stored, KEY_MAX};
use super::{take_value, Cache, Next, Out, OUT_HIGH_WATER, VERSION};

pub const HEADER: usize = 24;
pub const REQ_MAGIC: u8 = 0x80;
const RES_MAGIC: u8 = 0x81;

mod op {
    pub const GET: u8 = 0x00;
    pub const SET: u8 = 0x01;
    pub const ADD: u8 = 0x02;
    pub const REPLACE: u8 = 0x03;
    pub const DELETE: u8 = 0x04;
    pub const INCREMENT: u8 = 0x05;
    pub const DECREMENT: u8 = 0x06;
    pub const QUIT: u8 = 0x07;
    pub const FLUSH: u8 = 0x08;
    pub const GETQ: u8 = 0x09;
    pub const NOOP: u8 = 0x0a;
    pub const VERSION: u8 = 0x0b;
    pub const GETK: u8 = 0x0c;
    pub const GETKQ: u8 = 0x0d;
    pub const APPEND: u8 = 0x0e;
    pub const PREPEND: u8 = 0x0f;
    pub const STAT: u8 = 0x10;
    pub const SETQ: u8 = 0x11;
    pub const ADDQ: u8 = 0x12;
    pub const REPLACEQ: u8 = 0x13;
    pub const DELETEQ: u8 = 0x14;
    pub const INCREMENTQ: u8 = 0x15;
    pub const DECREMENTQ: u8 = 0x16;
    pub const QUITQ: u8 = 0x17;
    pub const FLUSHQ: u8 = 0x18;
    pub const APPENDQ: u8 = 0x19;
    pub const PREPENDQ: u8 = 0x1a;
    pub const TOUCH: u8 = 0x1c;
    pub const GAT: u8 = 0x1d;
    pub const GATQ: u8 = 0x1e;
    pub const GATK: u8 = 0x23;
    pub const GATKQ: u8 = 0x24;
}

mod status {
    pub const OK: u16 = 0x00;
    pub const NOT_FOUND: u16 = 0x01;
    pub const EXISTS: u16 = 0x02;
    pub const TOO_LARGE: u16 = 0x03;
    pub const INVALID: u16 = 0x04;
    pub const NOT_STORED: u16 = 0x05;
    pub const NON_NUMERIC: u16 = 0x06;
    pub const UNKNOWN: u16 = 0x81;
}

fn error_text(status: u16) -> &'static [u8] {
    match status {
        status::NOT_FOUND => b"Not found",
        status::EXISTS => b"Data exists for key.",
        status::TOO_LARGE => b"Too large.",
        status::INVALID => b"Invalid arguments",
        status::NOT_STORED => b"Not stored.",
        status::NON_NUMERIC => b"Non-numeric server-side value for incr or decr",
        _ => b"Unknown command",
    }
}

struct Req {
    opcode: u8,
    opaque: u32,
    cas: u64,
    extras: Bytes,
    key: Bytes,
    value: Bytes,
}

/// One response: header, then extras, key and value.
fn respond(out: &mut Out, req: &Req, status: u16, cas: u64, extras: &[u8], key: &[u8], value: &Bytes) {
    let body = extras.len() + key.len() + value.len();
    let mut h = [0u8; HEADER];
    h[0] = RES_MAGIC;
    h[1] = req.opcode;
    h[2..4].copy_from_slice(&(key.len() as u16).to_be_bytes());
    h[4] = extras.len() as u8;
    h[6..8].copy_from_slice(&status.to_be_bytes());
    h[8..12].copy_from_slice(&(body as u32).to_be_bytes());
    h[12..16].copy_from_slice(&req.opaque.to_be_bytes());
    h[16..24].copy_from_slice(&cas.to_be_bytes());
    out.put(&h);
    out.put(extras);
    out.put(key);
    out.put_value(value);
}

fn error(out: &mut Out, req: &Req, status: u16) {
    respond(out, req, status, 0, &[], &[], &Bytes::from_static(error_text(status)));
}

/// Serves the whole requests in `input`, answering into `out`; `swallow` is set to the bytes
/// of a refused value still to come.
pub fn serve(cache: &Cache, input: &mut BytesMut, out: &mut Out, swallow: &mut usize) -> Next {
    loop {
        if out.len() >= OUT_HIGH_WATER {
            return Next::Full;
        }
        if input.len() < HEADER {
            return Next::Read;
        }
        if input[0] != REQ_MAGIC {
            // Not a request: nothing after it can be framed. memcached closes too.
            return Next::Close;
        }
        let keylen = u16::from_be_bytes([input[2], input[3]]) as usize;
        let extlen = input[4] as usize;
        let body = u32::from_be_bytes([input[8], input[9], input[10], input[11]]) as usize;
        if keylen + extlen > body {
            return Next::Close;
        }
        let (opcode, opaque) = (
            input[1],
            u32::from_be_bytes([input[12], input[13], input[14], input[15]]),
        );
        // Judged on the header alone, before the body is waited for: a client cannot make the
        // server hold more than a command may carry.
        let header_only = Req {
            opcode,
            opaque,
            cas: 0,
            extras: Bytes::new(),
            key: Bytes::new(),
            value: Bytes::new(),
        };
        if keylen > KEY_MAX {
            error(out, &header_only, status::INVALID);
            return Next::Close;
        }
        if body - keylen - extlen > cache.root.table.item_max() {
            // The key is waited for (a few hundred bytes at most), the value is not: as
            // memcached, a set that cannot be stored leaves no stale value behind.
            if input.len() < HEADER + extlen + keylen {
                return Next::Read;
            }
            let _ = input.split_to(HEADER + extlen);
            let key = input.split_to(keylen);
            if matches!(opcode, op::SET | op::SETQ) {
                let _ = cache.root.table.delete(&key, None);
            }
            error(out, &header_only, status::TOO_LARGE);
            *swallow = body - extlen - keylen;
            return Next::Read;
        }
        if input.len() < HEADER + body {
            return Next::Read;
        }
        let mut h = input.split_to(HEADER);
        h.advance(16);
        let cas = h.get_u64();
        let extras = input.split_to(extlen).freeze();
        let key = input.split_to(keylen).freeze();
        let value = take_value(input, body - extlen - keylen);
        let req = Req {
            opcode,
            opaque,
            cas,
            extras,
            key,
            value,
        };
        if key_or_extras_wrong(&req) {
            // memcached closes the connection after this answer: what follows is suspect.
            error(out, &req, status::INVALID);
            return Next::Close;
        }
        if !request(cache, &req, out) {
            return Next::Close;
        }
    }
}

/// Whether a request's key and extras are not what its command takes.
fn key_or_extras_wrong(r: &Req) -> bool {
    let (e, k, v) = (r.extras.len(), r.key.len(), r.value.len());
    if k > KEY_MAX {
        return true;
    }
    match r.opcode {
        op::GET | op::GETQ | op::GETK | op::GETKQ | op::DELETE | op::DELETEQ => e != 0 || k == 0 || v != 0,
        op::SET | op::SETQ | op::ADD | op::ADDQ | op::REPLACE | op::REPLACEQ => e != 8 || k == 0,
        op::APPEND | op::APPENDQ | op::PREPEND | op::PREPENDQ => e != 0 || k == 0,
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => e != 20 || k == 0 || v != 0,
        op::TOUCH | op::GAT | op::GATQ | op::GATK | op::GATKQ => e != 4 || k == 0 || v != 0,
        op::FLUSH | op::FLUSHQ => (e != 0 && e != 4) || k != 0 || v != 0,
        op::NOOP | op::VERSION | op::QUIT | op::QUITQ => e != 0 || k != 0 || v != 0,
        op::STAT => e != 0 || v != 0,
        _ => false,
    }
}

/// Serves one request; false when the connection is to close.
fn request(cache: &Cache, r: &Req, out: &mut Out) -> bool {
    let table = &cache.root.table;
    let s = &cache.stats;
    let none = Bytes::new();
    let be32 = |b: &[u8]| u32::from_be_bytes(b[..4].try_into().expect("4 bytes"));
    let be64 = |b: &[u8]| u64::from_be_bytes(b[..8].try_into().expect("8 bytes"));
    match r.opcode {
        op::GET | op::GETQ | op::GETK | op::GETKQ | op::GAT | op::GATQ | op::GATK | op::GATKQ | op::TOUCH => {
            let quiet = matches!(r.opcode, op::GETQ | op::GETKQ | op::GATQ | op::GATKQ);
            let with_key = matches!(r.opcode, op::GETK | op::GETKQ | op::GATK | op::GATKQ);
            let touch = (r.extras.len() == 4).then(|| i64::from(be32(&r.extras)));
            if touch.is_some() {
                Cache::bump(&s.cmd_touch);
            }
            if r.opcode != op::TOUCH {
                Cache::bump(&s.cmd_get);
            }
            let (hits, misses) = if touch.is_some() {
                (&s.touch_hits, &s.touch_misses)
            } else {
                (&s.get_hits, &s.get_misses)
            };
            match table.get(&r.key, touch) {
                Some(it) => {
                    Cache::bump(hits);
                    let flags = it.flags.to_be_bytes();
                    let key: &[u8] = if with_key { &r.key } else { &[] };
                    let value = if r.opcode == op::TOUCH { &none } else { &it.value };
                    respond(out, r, status::OK, it.cas, &flags, key, value);
                }
                None => {
                    Cache::bump(misses);
                    if quiet {
                    } else if with_key {
                        respond(out, r, status::NOT_FOUND, 0, &[], &r.key, &none);
                    } else {
                        error(out, r, status::NOT_FOUND);
                    }
                }
            }
        }
        op::SET
        | op::SETQ
        | op::ADD
        | op::ADDQ
        | op::REPLACE
        | op::REPLACEQ
        | op::APPEND
        | op::APPENDQ
        | op::PREPEND
        | op::PREPENDQ => {
            let quiet = matches!(
                r.opcode,
                op::SETQ | op::ADDQ | op::REPLACEQ | op::APPENDQ | op::PREPENDQ
            );
            let (flags, exptime) = if r.extras.len() == 8 {
                (be32(&r.extras), i64::from(be32(&r.extras[4..])))
            } else {
                (0, 0)
            };
            let mode = match r.opcode {
                _ if r.cas != 0 && matches!(r.opcode, op::SET | op::SETQ | op::REPLACE | op::REPLACEQ) => {
                    Mode::Cas(r.cas)
                }
                op::SET | op::SETQ => Mode::Set,
                op::ADD | op::ADDQ => Mode::Add,
                op::REPLACE | op::REPLACEQ => Mode::Replace,
                op::APPEND | op::APPENDQ => Mode::Append,
                _ => Mode::Prepend,
            };
            Cache::bump(&s.cmd_set);
            // An append or prepend with a cas stores only over that version.
            if r.cas != 0
                && matches!(mode, Mode::Append | Mode::Prepend)
                && table.get(&r.key, None).is_some_and(|it| it.cas != r.cas)
            {
                error(out, r, status::EXISTS);
                return true;
            }
            let st = match table.store(mode, &r.key, flags, exptime, r.value.clone()) {
                Stored::Stored(cas) => {
                    if !quiet {
                        respond(out, r, status::OK, cas, &[], &[], &none);
                    }
                    return true;
                }
                Stored::NotStored if mode == Mode::Add => status::EXISTS,
                Stored::NotStored if mode == Mode::Replace => status::NOT_FOUND,
                Stored::NotStored => status::NOT_STORED,
                Stored::Exists => status::EXISTS,
                Stored::NotFound => status::NOT_FOUND,
                Stored::TooLarge => status::TOO_LARGE,
            };
            error(out, r, st);
        }
        op::DELETE | op::DELETEQ => match table.delete(&r.key, (r.cas != 0).then_some(r.cas)) {
            Ok(()) => {
                Cache::bump(&s.delete_hits);
                if r.opcode == op::DELETE {
                    respond(out, r, status::OK, 0, &[], &[], &none);
                }
            }
            Err(e) => {
                Cache::bump(&s.delete_misses);
                error(
                    out,
                    r,
                    if e == DeltaError::Exists {
                        status::EXISTS
                    } else {
                        status::NOT_FOUND
                    },
                );
            }
        },
        op::INCREMENT | op::INCREMENTQ | op::DECREMENT | op::DECREMENTQ => {
            let incr = matches!(r.opcode, op::INCREMENT | op::INCREMENTQ);
            let quiet = matches!(r.opcode, op::INCREMENTQ | op::DECREMENTQ);
            let (delta, initial, exptime) = (be64(&r.extras), be64(&r.extras[8..]), be32(&r.extras[16..]));
            // An expiry of all ones means: do not create a missing item.
            let init = (exptime != u32::MAX).then_some((initial, i64::from(exptime)));
            let (hits, misses) = if incr {
                (&s.incr_hits, &s.incr_misses)
            } else {
                (&s.decr_hits, &s.decr_misses)
            };
            match table.delta(&r.key, incr, delta, init, Some(r.cas)) {
                Ok((n, cas)) => {
                    Cache::bump(hits);
                    if !quiet {
                        respond(
                            out,
                            r,
                            status::OK,
                            cas,
                            &[],
                            &[],
                            &Bytes::copy_from_slice(&n.to_be_bytes()),
                        );
                    }
                }
                Err(e) => {
                    Cache::bump(misses);
                    let st = match e {
                        DeltaError::NotFound => status::NOT_FOUND,
                        DeltaError::NonNumeric => status::NON_NUMERIC,
                        DeltaError::Exists => status::EXISTS,
                    };
                    error(out, r, st);
                }
            }
        }
        op::FLUSH | op::FLUSHQ => {
            Cache::bump(&s.cmd_flush);
            table.flush(if r.extras.len() == 4 {
                i64::from(be32(&r.extras))
            } else {
                0
            });
            if r.opcode == op::FLUSH {
                respond(out, r, status::OK, 0, &[], &[], &none);
            }
        }
        op::NOOP => respond(out, r, status::OK, 0, &[], &[], &none),
        op::VERSION => respond(out, r, status::OK, 0, &[], &[], &Bytes::from_static(VERSION.as_bytes())),
        op::QUIT | op::QUITQ => {
            if r.opcode == op::QUIT {
                respond(out, r, status::OK, 0, &[], &[], &none);
            }
            return false;
        }
        op::STAT => {
            if r.key.is_empty() {
                for (k, v) in cache.stats() {
                    respond(out, r, status::OK, 0, &[], k.as_bytes(), &Bytes::from(v));
                }
                respond(out, r, status::OK, 0, &[], &[], &none);
            } else {
                error(out, r, status::NOT_FOUND);
            }
        }
        _ => error(out, r, status::UNKNOWN),
    }
    true
}
