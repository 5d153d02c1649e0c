//! Bounded frames: a fixed 24-byte header (see [`crate::wire::FrameHeader`]) then a body.
use std::io::{self, Read, Write};

use zerocopy::{FromBytes, IntoBytes};

use crate::wire::{FrameHeader, FrameKind, Msg, MAGIC, MAX_BODY, WIRE_VERSION};

/// Why a frame was refused. The connection that sent it is closed; the component keeps serving others.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("i/o: {0}")]
    Io(io::Error),
    #[error("bad magic {0:#010x} (not a splitos peer)")]
    BadMagic(u32),
    #[error("wire version {0}, this build speaks {WIRE_VERSION}")]
    BadVersion(u16),
    #[error("unknown frame kind {0}")]
    BadKind(u8),
    #[error("frame body of {0} bytes exceeds the {MAX_BODY}-byte bound")]
    TooLarge(u32),
    #[error("body does not decode: {0}")]
    Undecodable(String),
}

impl From<io::Error> for FrameError {
    fn from(e: io::Error) -> Self {
        FrameError::Io(e)
    }
}

/// A decoded frame.
#[derive(Debug)]
pub struct Frame {
    pub kind: FrameKind,
    pub req_id: u64,
    pub msg: Msg,
}

pub fn encode(kind: FrameKind, req_id: u64, msg: &Msg) -> Vec<u8> {
    let mut buf = postcard::to_extend(msg, vec![0u8; FrameHeader::SIZE]).expect("encoding into a Vec cannot fail");
    let len = (buf.len() - FrameHeader::SIZE) as u32;
    let hdr = FrameHeader {
        magic: MAGIC,
        version: WIRE_VERSION,
        kind: kind as u8,
        flags: 0,
        req_id,
        len,
        reserved: 0,
    };
    buf[..FrameHeader::SIZE].copy_from_slice(hdr.as_bytes());
    buf
}

pub fn write_frame<W: Write + ?Sized>(w: &mut W, kind: FrameKind, req_id: u64, msg: &Msg) -> io::Result<()> {
    let buf = encode(kind, req_id, msg);
    if buf.len() - FrameHeader::SIZE > MAX_BODY as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("message body of {} bytes exceeds the frame bound", buf.len()),
        ));
    }
    w.write_all(&buf)
}

/// How much of a frame body is read at a time.
const BODY_STEP: usize = 64 << 10;

/// Reads one frame. `Ok(None)` is a clean end of stream between frames.
pub fn read_frame<R: Read + ?Sized>(r: &mut R) -> Result<Option<Frame>, FrameError> {
    let mut hdr_bytes = [0u8; FrameHeader::SIZE];
    let mut got = 0;
    while got < hdr_bytes.len() {
        match r.read(&mut hdr_bytes[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(FrameError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "truncated frame header",
                )))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (kind, req_id, len) = check_header(&hdr_bytes)?;
    // The body's memory grows with the bytes that arrive, not with the length the header
    // announces: a peer that announces the bound and stalls costs no more than it sent.
    let mut body = Vec::with_capacity(len.min(BODY_STEP));
    while body.len() < len {
        let want = (len - body.len()).min(BODY_STEP);
        let at = body.len();
        body.resize(at + want, 0);
        if let Err(e) = r.read_exact(&mut body[at..]) {
            return Err(FrameError::Io(if e.kind() == io::ErrorKind::UnexpectedEof {
                io::Error::new(io::ErrorKind::UnexpectedEof, "truncated frame body")
            } else {
                e
            }));
        }
    }
    decode(kind, req_id, &body).map(Some)
}

/// Checks a frame's header: its kind, request id and body length, or the first rule it breaks.
fn check_header(bytes: &[u8; FrameHeader::SIZE]) -> Result<(FrameKind, u64, usize), FrameError> {
    let hdr = FrameHeader::read_from_bytes(bytes).expect("header size is fixed");
    if hdr.magic != MAGIC {
        return Err(FrameError::BadMagic(hdr.magic));
    }
    if hdr.version != WIRE_VERSION {
        return Err(FrameError::BadVersion(hdr.version));
    }
    let kind = FrameKind::from_u8(hdr.kind).ok_or(FrameError::BadKind(hdr.kind))?;
    if hdr.len > MAX_BODY {
        return Err(FrameError::TooLarge(hdr.len));
    }
    Ok((kind, hdr.req_id, hdr.len as usize))
}

fn decode(kind: FrameKind, req_id: u64, body: &[u8]) -> Result<Frame, FrameError> {
    let msg: Msg = postcard::from_bytes(body).map_err(|e| FrameError::Undecodable(e.to_string()))?;
    Ok(Frame { kind, req_id, msg })
}

/// The frame at the start of `buf` and the bytes it took, if all of it is there; its header
/// is checked as soon as it is (a reader need not wait for a body it will refuse).
pub fn parse_frame(buf: &[u8]) -> Result<Option<(Frame, usize)>, FrameError> {
    let Some(hdr) = buf.first_chunk::<{ FrameHeader::SIZE }>() else {
        return Ok(None);
    };
    let (kind, req_id, len) = check_header(hdr)?;
    let end = FrameHeader::SIZE + len;
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some((decode(kind, req_id, &buf[FrameHeader::SIZE..end])?, end)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Who, P2M_FETCH, P2M_FLUSH};
    use proptest::prelude::*;
    use serde_bytes::ByteBuf;

    fn fetch(vpn: u64) -> Msg {
        P2M_FETCH {
            who: Who::new("v", 7),
            vpn,
        }
        .into()
    }

    #[test]
    fn round_trip() {
        let buf = encode(FrameKind::Request, 9, &fetch(42));
        let f = read_frame(&mut &buf[..]).unwrap().unwrap();
        assert_eq!(f.req_id, 9);
        assert!(matches!(f.msg, Msg::P2M_FETCH(P2M_FETCH { vpn: 42, .. })));
    }

    #[test]
    fn a_buffer_parses_frame_by_frame_and_waits_for_the_rest() {
        let mut buf = encode(FrameKind::Request, 1, &fetch(1));
        let one = buf.len();
        buf.extend(encode(FrameKind::Request, 2, &fetch(2)));
        let (f, used) = parse_frame(&buf).unwrap().unwrap();
        assert_eq!((f.req_id, used), (1, one));
        assert!(
            parse_frame(&buf[one..buf.len() - 1]).unwrap().is_none(),
            "a partial body waits"
        );
        assert!(
            parse_frame(&buf[one..one + 3]).unwrap().is_none(),
            "a partial header waits"
        );
        assert_eq!(parse_frame(&buf[one..]).unwrap().unwrap().0.req_id, 2);
        let hdr = FrameHeader {
            magic: MAGIC,
            version: WIRE_VERSION,
            kind: 0,
            flags: 0,
            req_id: 1,
            len: MAX_BODY + 1,
            reserved: 0,
        };
        assert!(
            matches!(parse_frame(hdr.as_bytes()), Err(FrameError::TooLarge(_))),
            "refused on its header alone"
        );
    }

    #[test]
    fn oversized_and_garbage_are_refused() {
        let hdr = FrameHeader {
            magic: MAGIC,
            version: WIRE_VERSION,
            kind: 0,
            flags: 0,
            req_id: 1,
            len: MAX_BODY + 1,
            reserved: 0,
        };
        assert!(matches!(read_frame(&mut hdr.as_bytes()), Err(FrameError::TooLarge(_))));
        let junk = [0xffu8; 64];
        assert!(matches!(read_frame(&mut &junk[..]), Err(FrameError::BadMagic(_))));
        let buf = encode(FrameKind::Request, 1, &fetch(2));
        assert!(
            matches!(read_frame(&mut &buf[..buf.len() - 1]), Err(FrameError::Io(_))),
            "truncated body"
        );
        assert!(
            matches!(read_frame(&mut &buf[..10]), Err(FrameError::Io(_))),
            "truncated header"
        );
        let mut bad_version = buf.clone();
        let other = WIRE_VERSION + 1;
        bad_version[4..6].copy_from_slice(&other.to_le_bytes());
        assert!(matches!(read_frame(&mut &bad_version[..]), Err(FrameError::BadVersion(v)) if v == other));
    }

    /// Header fields that are mostly valid, so that every check of `read_frame` is reached.
    fn header() -> impl Strategy<Value = (u32, u16, u8, u32)> {
        (
            prop_oneof![4 => Just(MAGIC), 1 => any::<u32>()],
            prop_oneof![4 => Just(WIRE_VERSION), 1 => any::<u16>()],
            prop_oneof![2 => Just(0u8), 2 => Just(1u8), 1 => Just(2u8), 1 => any::<u8>()],
            prop_oneof![4 => 0u32..64, 1 => any::<u32>()],
        )
    }

    proptest! {
        /// Every page message decodes to exactly what was encoded.
        #[test]
        fn page_messages_round_trip(pid in any::<u64>(), vpn in any::<u64>(), vnode in "[a-z]{0,20}", data in proptest::collection::vec(any::<u8>(), 0..4096), id in any::<u64>()) {
            let m: Msg = P2M_FLUSH { who: Who::new(vnode.clone(), pid), vpn, data: ByteBuf::from(data.clone()) }.into();
            let buf = encode(FrameKind::Reply, id, &m);
            let f = read_frame(&mut &buf[..]).unwrap().unwrap();
            prop_assert_eq!(f.kind, FrameKind::Reply);
            prop_assert_eq!(f.req_id, id);
            match f.msg {
                Msg::P2M_FLUSH(P2M_FLUSH { who, vpn: v, data: d }) => {
                    prop_assert_eq!(who, Who::new(vnode, pid));
                    prop_assert_eq!(v, vpn);
                    prop_assert_eq!(d.into_vec(), data);
                }
                other => prop_assert!(false, "decoded as {}", other.name()),
            }
        }

        /// A frame is refused for the first rule it breaks, in the order the reader checks
        /// them, and only a frame that breaks none is accepted.
        #[test]
        fn each_header_rule_is_enforced((magic, version, kind, len) in header(), body in proptest::collection::vec(any::<u8>(), 0..80)) {
            let hdr = FrameHeader { magic, version, kind, flags: 0, req_id: 5, len, reserved: 0 };
            let mut buf = hdr.as_bytes().to_vec();
            buf.extend_from_slice(&body);
            let r = read_frame(&mut &buf[..]);
            if magic != MAGIC {
                prop_assert!(matches!(r, Err(FrameError::BadMagic(m)) if m == magic));
            } else if version != WIRE_VERSION {
                prop_assert!(matches!(r, Err(FrameError::BadVersion(v)) if v == version));
            } else if FrameKind::from_u8(kind).is_none() {
                prop_assert!(matches!(r, Err(FrameError::BadKind(k)) if k == kind));
            } else if len > MAX_BODY {
                prop_assert!(matches!(r, Err(FrameError::TooLarge(n)) if n == len));
            } else if (len as usize) > body.len() {
                prop_assert!(matches!(r, Err(FrameError::Io(_))), "a short body is truncated");
            } else {
                match r {
                    Ok(Some(f)) => {
                        prop_assert_eq!(f.req_id, 5);
                        // What was accepted is a real message: it survives its own round trip.
                        let again = encode(f.kind, 5, &f.msg);
                        let g = read_frame(&mut &again[..]).unwrap().unwrap();
                        prop_assert_eq!(g.msg.name(), f.msg.name());
                    }
                    Err(FrameError::Undecodable(_)) => {}
                    other => prop_assert!(false, "unexpected {:?}", other.map(|f| f.map(|f| f.msg.name()))),
                }
            }
        }

        #[test]
        fn a_stream_shorter_than_a_header_is_a_truncation(bytes in proptest::collection::vec(any::<u8>(), 1..FrameHeader::SIZE)) {
            prop_assert!(matches!(read_frame(&mut &bytes[..]), Err(FrameError::Io(_))));
        }
    }
}
