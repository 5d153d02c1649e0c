//! memcached's text protocol: the commands and answers of memcached 1.6's protocol.txt, with
//! its error strings, so that a client sees the same bytes from either server (the
//! conformance test compares them). Meta commands (`mg`, `ms`, ...) are not served.
use bytes::{Bytes, BytesMut};

use super::store::{DeltaError, Mode, Stored, KEY_MAX};
use super::{take_value, Cache, Next, Out, LINE_MAX, LINE_MAX_GET, OUT_HIGH_WATER, VERSION};

const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";

/// Serves the whole commands in `input`, answering into `out`; `swallow` is set to the bytes
/// of a refused value still to come.
pub fn serve(cache: &Cache, input: &mut BytesMut, out: &mut Out, swallow: &mut usize) -> Next {
    loop {
        if out.len() >= OUT_HIGH_WATER {
            return Next::Full;
        }
        let Some(nl) = input.iter().position(|b| *b == b'\n') else {
            let most = if [&b"get "[..], b"gets ", b"gat ", b"gats "]
                .iter()
                .any(|p| input.starts_with(p))
            {
                LINE_MAX_GET
            } else {
                LINE_MAX
            };
            if input.len() > most {
                out.put(b"CLIENT_ERROR line too long\r\n");
                return Next::Close;
            }
            return Next::Read;
        };
        let line = input[..nl].strip_suffix(b"\r").unwrap_or(&input[..nl]);
        let tokens: Vec<&[u8]> = line.split(|b| *b == b' ').filter(|t| !t.is_empty()).collect();
        let Some(&cmd) = tokens.first() else {
            let _ = input.split_to(nl + 1);
            out.put(b"ERROR\r\n");
            continue;
        };
        let noreply = tokens.len() > 1 && *tokens.last().unwrap() == b"noreply";
        let args = &tokens[1..tokens.len() - noreply as usize];
        let store_mode = match cmd {
            b"set" => Some(Mode::Set),
            b"add" => Some(Mode::Add),
            b"replace" => Some(Mode::Replace),
            b"append" => Some(Mode::Append),
            b"prepend" => Some(Mode::Prepend),
            b"cas" => Some(Mode::Cas(0)),
            _ => None,
        };
        if let Some(mode) = store_mode {
            let want = if mode == Mode::Cas(0) { 5 } else { 4 };
            if args.len() != want {
                let _ = input.split_to(nl + 1);
                out.put(b"ERROR\r\n");
                continue;
            }
            let parsed = (|| {
                let flags: u32 = num(args[1])?;
                let exptime: i64 = num(args[2])?;
                let len: i32 = num(args[3])?;
                let cas: u64 = if want == 5 { num(args[4])? } else { 0 };
                (len >= 0 && args[0].len() <= KEY_MAX).then_some((flags, exptime, len as usize, cas))
            })();
            let Some((flags, exptime, len, cas)) = parsed else {
                let _ = input.split_to(nl + 1);
                out.put(BAD_FORMAT);
                continue;
            };
            let key = Bytes::copy_from_slice(args[0]);
            if len > cache.root.table.item_max() {
                let _ = input.split_to(nl + 1);
                if mode == Mode::Set {
                    let _ = cache.root.table.delete(&key, None);
                }
                if !noreply {
                    out.put(b"SERVER_ERROR object too large for cache\r\n");
                }
                *swallow = len + 2;
                return Next::Read;
            }
            if input.len() < nl + 1 + len + 2 {
                return Next::Read;
            }
            let _ = input.split_to(nl + 1);
            let value = take_value(input, len);
            let end = input.split_to(2);
            Cache::bump(&cache.stats.cmd_set);
            if &end[..] != b"\r\n" {
                out.put(b"CLIENT_ERROR bad data chunk\r\n");
                continue;
            }
            let mode = if let Mode::Cas(_) = mode { Mode::Cas(cas) } else { mode };
            let r = cache.root.table.store(mode, &key, flags, exptime, value);
            if let Mode::Cas(_) = mode {
                Cache::bump(match r {
                    Stored::Stored(_) => &cache.stats.cas_hits,
                    Stored::Exists => &cache.stats.cas_badval,
                    _ => &cache.stats.cas_misses,
                });
            }
            let answer: &[u8] = match r {
                Stored::Stored(_) => b"STORED\r\n",
                Stored::NotStored => b"NOT_STORED\r\n",
                Stored::Exists => b"EXISTS\r\n",
                Stored::NotFound => b"NOT_FOUND\r\n",
                Stored::TooLarge => b"SERVER_ERROR object too large for cache\r\n",
            };
            if !noreply {
                out.put(answer);
            }
            continue;
        }
        let quit = command(cache, cmd, &tokens, args, noreply, out);
        let _ = input.split_to(nl + 1);
        if quit {
            return Next::Close;
        }
    }
}

fn num<T: std::str::FromStr>(t: &[u8]) -> Option<T> {
    std::str::from_utf8(t).ok()?.parse().ok()
}

/// Whether `args` are a key and one argument (`incr`, `decr`, `touch`); answers the error if not.
fn key_and_one_more(args: &[&[u8]], out: &mut Out) -> bool {
    if args.len() != 2 {
        out.put(b"ERROR\r\n");
        false
    } else if args[0].len() > KEY_MAX {
        out.put(BAD_FORMAT);
        false
    } else {
        true
    }
}

/// Every command but the storage ones; true for `quit`.
fn command(cache: &Cache, cmd: &[u8], tokens: &[&[u8]], args: &[&[u8]], noreply: bool, out: &mut Out) -> bool {
    let table = &cache.root.table;
    let s = &cache.stats;
    let reply = |out: &mut Out, b: &[u8]| {
        if !noreply {
            out.put(b)
        }
    };
    match cmd {
        b"get" | b"gets" | b"gat" | b"gats" => {
            let (with_cas, touch) = (cmd.ends_with(b"s"), cmd.starts_with(b"gat"));
            // Keys are every token after the command (a key may be called "noreply").
            let mut keys = &tokens[1..];
            let mut exptime = None;
            if touch {
                let Some((e, rest)) = keys.split_first() else {
                    out.put(b"ERROR\r\n");
                    return false;
                };
                let Some(e) = num::<i64>(e) else {
                    out.put(b"CLIENT_ERROR invalid exptime argument\r\n");
                    return false;
                };
                exptime = Some(e);
                keys = rest;
            }
            if keys.is_empty() {
                out.put(b"ERROR\r\n");
                return false;
            }
            for key in keys {
                if key.len() > KEY_MAX {
                    out.put(BAD_FORMAT);
                    return false;
                }
                if touch {
                    Cache::bump(&s.cmd_touch);
                }
                Cache::bump(&s.cmd_get);
                match table.get(key, exptime) {
                    Some(it) => {
                        Cache::bump(if touch { &s.touch_hits } else { &s.get_hits });
                        out.put(b"VALUE ");
                        out.put(key);
                        out.put(format!(" {} {}", it.flags, it.value.len()).as_bytes());
                        if with_cas {
                            out.put(format!(" {}", it.cas).as_bytes());
                        }
                        out.put(b"\r\n");
                        out.put_value(&it.value);
                        out.put(b"\r\n");
                    }
                    None => Cache::bump(if touch { &s.touch_misses } else { &s.get_misses }),
                }
            }
            out.put(b"END\r\n");
        }
        b"delete" => {
            let ok_args = match args {
                [_] => true,
                [_, z] => *z == b"0",
                _ => false,
            };
            if !ok_args || args[0].len() > KEY_MAX {
                out.put(b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n");
                return false;
            }
            match table.delete(args[0], None) {
                Ok(()) => {
                    Cache::bump(&s.delete_hits);
                    reply(out, b"DELETED\r\n")
                }
                Err(_) => {
                    Cache::bump(&s.delete_misses);
                    reply(out, b"NOT_FOUND\r\n")
                }
            }
        }
        b"incr" | b"decr" => {
            let incr = cmd == b"incr";
            if !key_and_one_more(args, out) {
                return false;
            }
            let Some(delta) = num::<u64>(args[1]) else {
                out.put(b"CLIENT_ERROR invalid numeric delta argument\r\n");
                return false;
            };
            let (hits, misses) = if incr {
                (&s.incr_hits, &s.incr_misses)
            } else {
                (&s.decr_hits, &s.decr_misses)
            };
            match table.delta(args[0], incr, delta, None, None) {
                Ok((n, _)) => {
                    Cache::bump(hits);
                    reply(out, format!("{n}\r\n").as_bytes())
                }
                Err(DeltaError::NonNumeric) => {
                    out.put(b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n")
                }
                Err(_) => {
                    Cache::bump(misses);
                    reply(out, b"NOT_FOUND\r\n")
                }
            }
        }
        b"touch" => {
            if !key_and_one_more(args, out) {
                return false;
            }
            let Some(e) = num::<i64>(args[1]) else {
                out.put(b"CLIENT_ERROR invalid exptime argument\r\n");
                return false;
            };
            Cache::bump(&s.cmd_touch);
            if table.touch(args[0], e) {
                Cache::bump(&s.touch_hits);
                reply(out, b"TOUCHED\r\n")
            } else {
                Cache::bump(&s.touch_misses);
                reply(out, b"NOT_FOUND\r\n")
            }
        }
        b"flush_all" => {
            let delay = match args {
                [] => Some(0),
                [d] => num::<i64>(d),
                _ => None,
            };
            let Some(delay) = delay else {
                out.put(BAD_FORMAT);
                return false;
            };
            Cache::bump(&s.cmd_flush);
            table.flush(delay);
            reply(out, b"OK\r\n")
        }
        // Counted from the tokens: `stats noreply` is a statistics group memcached does not have.
        b"stats" => match &tokens[1..] {
            [] => {
                for (k, v) in cache.stats() {
                    out.put(format!("STAT {k} {v}\r\n").as_bytes());
                }
                out.put(b"END\r\n");
            }
            _ => out.put(b"ERROR\r\n"),
        },
        b"version" => out.put(format!("VERSION {VERSION}\r\n").as_bytes()),
        b"verbosity" if (2..=3).contains(&tokens.len()) => reply(out, b"OK\r\n"),
        b"quit" => return true,
        _ => out.put(b"ERROR\r\n"),
    }
    false
}
