//! The local protocol between the shim (loaded into a program) and its pComponent, over a Unix
//! stream socket. Fixed-size, plain-old-data records so that the shim can speak it without
//! allocating: it runs inside malloc.
//!
//! A connection starts with a [`Welcome`] from the pComponent: the userfaultfd features it
//! needs and, SCM_RIGHTS, with [`WELCOME_UFFD_DEV`] the userfaultfd device to create the
//! program's userfaultfd from, with [`WELCOME_HEAP_FILE`] the file to back the heap region
//! with (without, the shim creates a memfd); or, with `refused` set, why this user gets
//! nothing. Then a [`Hello`]:
//! - a program's ([`HELLO_PROGRAM`]) carries its userfaultfd and its heap's file or memfd
//!   (SCM_RIGHTS); after that, each [`ShimReq`] gets one [`ShimResp`];
//! - a launcher's ([`HELLO_LAUNCHER`], `splitos run` before it starts the program) carries no
//!   descriptors and is answered with a [`ShimResp`] whose `val` bytes that follow are the
//!   vNode's mount point (none: the cluster has no file system for it). After that it may ask
//!   [`Op::RunStats`], answered with a [`ShimResp`] whose `val` bytes that follow are the
//!   run's counters as JSON. The pComponent never speaks unasked, so a launcher reading the
//!   end of its connection knows the pComponent is gone.
//!
//! Who may do what is decided by the peer's credentials (SO_PEERCRED), never by the records:
//! a user the pComponent grants no vNode is refused in the welcome, and a hello naming a vNode
//! the user was not granted is refused with EACCES; a launcher's naming a vNode the cluster
//! does not have, with ENOENT unless it asks for it to be made ([`HELLO_CREATE_VNODE`]).
#![no_std]

use core::mem::{offset_of, size_of};
/// The byte views both sides use on these records, re-exported so that they agree on the version.
pub use zerocopy::{FromBytes, FromZeros, IntoBytes};
use zerocopy::{Immutable, KnownLayout};

pub const SHIM_ABI_VERSION: u32 = 10;

/// The welcome's `flags` bit set when a heap file comes with it.
pub const WELCOME_HEAP_FILE: u32 = 1;
/// The welcome's `flags` bit set when the userfaultfd device comes with it (first, before the
/// heap file): a program of a user without the privilege to create a userfaultfd that also
/// serves the kernel's own accesses (a read(2) into the heap) gets one from it.
pub const WELCOME_UFFD_DEV: u32 = 2;

/// [`Hello::kind`] of a program's process.
pub const HELLO_PROGRAM: u32 = 0;
/// [`Hello::kind`] of `splitos run` asking for its vNode's mount and, later, its run's counters.
pub const HELLO_LAUNCHER: u32 = 1;

/// Where the heap region sits in every program (the same address in a parent and a forked child).
pub const REGION_BASE: u64 = 0x2000_0000_0000;
pub const DEFAULT_REGION_SIZE: u64 = 16 << 40;

/// Environment variables the shim reads.
pub const ENV_SOCK: &str = "SPLITOS_PCOMP_SOCK";
pub const ENV_VNODE: &str = "SPLITOS_VNODE";
pub const ENV_RUN_ID: &str = "SPLITOS_RUN_ID";
pub const ENV_REGION_SIZE: &str = "SPLITOS_REGION_SIZE";
/// `1` lets a program whose shim finds no pComponent run natively instead of being stopped.
pub const ENV_ALLOW_NATIVE: &str = "SPLITOS_ALLOW_NATIVE";

/// Records cross the boundary as their bytes: zerocopy's derives check at compile time that
/// they have no hidden padding and that every byte pattern is a valid value.
#[repr(C)]
#[derive(Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Hello {
    pub abi: u32,
    /// [`HELLO_PROGRAM`] or [`HELLO_LAUNCHER`].
    pub kind: u32,
    pub region_base: u64,
    pub region_size: u64,
    /// Non-zero in a forked child: the process id its parent's FORK_PREPARE returned.
    pub fork_token: u64,
    pub run_id: u64,
    pub vnode: [u8; 64],
    /// A launcher's choice of interleaving for its run's processes (a program's hello leaves
    /// these 0): with `interleave_of` 0, the pComponent's own; else `interleave_local` of
    /// every `interleave_of` ranges of `interleave_unit` bytes of the heap kept local
    /// (`interleave_local` 0: none). Checked as the pComponent's own setting is.
    pub interleave_local: u32,
    pub interleave_of: u32,
    pub interleave_unit: u64,
    /// A launcher's [`HELLO_CREATE_VNODE`]; 0 in a program's hello.
    pub flags: u32,
    pub _pad: u32,
}

/// In a launcher's hello: run on the vNode named even if the cluster has none of that name
/// (root's `splitos run --create-vnode`); without it a name neither [`DEFAULT_VNODE`] nor in
/// the managers' table of vNodes is refused with ENOENT, as a typo would be.
pub const HELLO_CREATE_VNODE: u32 = 1;

/// The vNode a run goes to when it names none: every cluster has it.
pub const DEFAULT_VNODE: &str = "default";

/// The first record on a connection, from the pComponent, before the shim creates its
/// userfaultfd: features are fixed when the descriptor is set up (UFFDIO_API), so the
/// pComponent names those its miss path depends on here.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Welcome {
    /// [`WELCOME_MARK`]: a shim of ABI version 1, which expects no welcome, reads it as the
    /// reply to its hello and stops with "refused (errno 71)" instead of misreading the rest.
    pub mark: i64,
    pub abi: u32,
    /// [`WELCOME_HEAP_FILE`], or 0.
    pub flags: u32,
    /// Userfaultfd features to ask for beyond missing and write-protect faults on shared
    /// memory; only those in [`uffd::FEATURES_ON_REQUEST`].
    pub uffd_features: u64,
    /// 0, or the errno (EACCES) of a pComponent that serves this user nothing: it grants the
    /// user no vNode. Nothing else follows; the connection closes.
    pub refused: u32,
    /// How long the program polls for the answer to each of its requests before sleeping
    /// (µs; 0: it sleeps at once). A pComponent of ABI version 2 before this field sent 0.
    pub reply_spin_us: u32,
}

/// -EPROTO.
pub const WELCOME_MARK: i64 = -71;

#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Op {
    Mmap = 1,
    Munmap = 2,
    Mprotect = 3,
    Dontneed = 4,
    Mremap = 5,
    ForkPrepare = 6,
    ForkAbort = 7,
    /// A launcher's: the counters of run `a`, if that run is the same user's.
    RunStats = 8,
}

impl Op {
    pub fn from_u32(v: u32) -> Option<Op> {
        Some(match v {
            1 => Op::Mmap,
            2 => Op::Munmap,
            3 => Op::Mprotect,
            4 => Op::Dontneed,
            5 => Op::Mremap,
            6 => Op::ForkPrepare,
            7 => Op::ForkAbort,
            8 => Op::RunStats,
            _ => return None,
        })
    }
}

pub const MMAP_FIXED: u64 = 1;
/// The program passed `MAP_NORESERVE`: not charged when mapped (heuristic overcommit).
pub const MMAP_NORESERVE: u64 = 2;
/// The program wants the hint's address or nothing (`MAP_FIXED_NOREPLACE`): the hint is
/// tried wherever it lies. Other hints are followed only inside the process's vRegions.
pub const MMAP_AT_HINT: u64 = 4;
pub const MREMAP_MAYMOVE: u64 = 1;
pub const MREMAP_FIXED: u64 = 2;

/// One request. Argument meaning by op:
/// Mmap(a=hint, b=len, c=prot, d=MMAP_FIXED | MMAP_NORESERVE | MMAP_AT_HINT) -> val=addr; Munmap(a=addr, b=len);
/// Mprotect(a, b, c=prot); Dontneed(a, b); Mremap(a=old, b=old_len, c=new_len, d=flags,
/// e=new addr if MREMAP_FIXED) -> val=addr; ForkPrepare -> val=token; ForkAbort(a=token, b=errno of the fork that failed);
/// RunStats(a=run id) -> val=length of the JSON that follows.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ShimReq {
    pub op: u32,
    pub _pad: u32,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub e: u64,
}

/// `ret` is 0 or a negative errno. The reply that admits a program is followed by an
/// [`Admitted`] and, for a forked child, `val2` [`VmaRec`]s: the protections the child must
/// re-apply to its new region.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ShimResp {
    pub ret: i64,
    pub val: u64,
    pub val2: u64,
}

/// Follows the [`ShimResp`] that admits a program (before a forked child's [`VmaRec`]s): how
/// its memory is charged, which its allocator follows.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Admitted {
    /// [`ADMITTED_COMMIT_ON_USE`], or 0.
    pub flags: u64,
}

/// The program is charged for what it maps writable (its vNode has a memory quota, or the
/// cluster overcommits strictly): its allocator maps arenas inaccessible and makes them
/// writable as it uses them, instead of charging whole arenas (and, at a fork, the child's
/// copies of them) at once.
pub const ADMITTED_COMMIT_ON_USE: u64 = 1;

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct VmaRec {
    pub start: u64,
    pub end: u64,
    pub prot: u64,
}

/// The pComponent's socket for programs' socket calls is the program socket's path with this
/// suffix. Each call is its own connection, so that a call that waits (a blocking connect)
/// never holds up the program's memory calls on the program socket.
pub const NET_SOCK_SUFFIX: &[u8] = b".net";

/// A socket call of the socket stub ([`NetReq::op`]). Every call but `Socket` carries the
/// program's descriptor of the socket (SCM_RIGHTS): the pComponent knows the socket by it and
/// so acts only on sockets the caller holds. `Socket` and `Accept` are answered with the new
/// socket's descriptor.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum NetOp {
    /// a=family, b=type (SOCK_STREAM), c=protocol.
    Socket = 1,
    /// data=the address.
    Bind = 2,
    /// a=backlog.
    Listen = 3,
    /// After the shim took one of the listening socket's connection tokens; answered with the
    /// connection and data=its peer's address.
    Accept = 4,
    /// data=the address, a=1 if the socket is non-blocking (answered -EINPROGRESS at once).
    Connect = 5,
    SockName = 6,
    PeerName = 7,
    /// a=level, b=name, c=the caller's buffer size; answered with data=the value.
    GetOpt = 8,
    /// a=level, b=name, data=the value.
    SetOpt = 9,
    /// A datagram socket's way to an address (data): the pComponent makes the sender
    /// socket for it ([`udp_name`]) that the shim then sends the program's datagrams to.
    Route = 10,
    /// The program read the end of a TCP socket's stream: answered `-ECONNRESET` (and the
    /// error taken) if the peer reset the connection, as the kernel's read reports it, else 0.
    TakeReset = 11,
}

impl NetOp {
    pub fn from_u32(v: u32) -> Option<NetOp> {
        Some(match v {
            1 => NetOp::Socket,
            2 => NetOp::Bind,
            3 => NetOp::Listen,
            4 => NetOp::Accept,
            5 => NetOp::Connect,
            6 => NetOp::SockName,
            7 => NetOp::PeerName,
            8 => NetOp::GetOpt,
            9 => NetOp::SetOpt,
            10 => NetOp::Route,
            11 => NetOp::TakeReset,
            _ => return None,
        })
    }
}

/// A program's datagram socket is a Unix datagram socket the pComponent bound in the
/// directory named by the program socket's path with this suffix: `<dir>/<n>`. Each address
/// it sends to and receives from has a sender socket there, `<dir>/<n>-<address>`
/// ([`udp_name`]): the program sends a datagram to the sender of its destination, and
/// receives each datagram from the sender of its source, so that the shim's recvfrom says the
/// source by the sender's name and reads and writes need nothing from the shim.
pub const NET_UDP_SUFFIX: &[u8] = b".udp/";

/// The largest UDP payload (IPv6's; IPv4's is 20 bytes less).
pub const NET_UDP_MAX: usize = 65527;

/// Longest address part of a sender's name.
pub const UDP_NAME_MAX: usize = 31;

/// The digits of a sender's name: 6 bits each, safe in a file name.
const DIGITS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+_";

/// `bytes` in [`DIGITS`], 6 bits per digit, the last one padded with zeros.
fn encode(out: &mut [u8], n: &mut usize, bytes: &[u8]) {
    for chunk in bytes.chunks(3) {
        let mut v = [0u8; 3];
        v[..chunk.len()].copy_from_slice(chunk);
        let w = (v[0] as u32) << 16 | (v[1] as u32) << 8 | v[2] as u32;
        for i in 0..chunk.len() + 1 {
            out[*n] = DIGITS[(w >> (18 - 6 * i) & 63) as usize];
            *n += 1;
        }
    }
}

/// [`encode`] backwards into `out`, whose length says how many bytes the digits hold.
fn decode(s: &[u8], out: &mut [u8]) -> Option<()> {
    if s.len() != (out.len() * 4).div_ceil(3) {
        return None;
    }
    let digit = |c: u8| DIGITS.iter().position(|d| *d == c).map(|v| v as u32);
    for (i, o) in out.iter_mut().enumerate() {
        let bit = i * 8;
        let (at, shift) = (bit / 6, bit % 6);
        let hi = digit(s[at])?;
        let lo = s.get(at + 1).map_or(Some(0), |c| digit(*c))?;
        *o = (((hi << 6 | lo) >> (4 - shift)) & 0xff) as u8;
    }
    Some(())
}

/// The address part of a sender's name for a sockaddr_in or sockaddr_in6: `4` or `6`, then
/// the address, the port and, for IPv6, a non-zero scope, in 6-bit digits (at most
/// [`UDP_NAME_MAX`] bytes, so that names fit a Unix socket address under long directories);
/// None for anything else or a short one.
pub fn udp_name(sa: &[u8]) -> Option<([u8; UDP_NAME_MAX], usize)> {
    let mut out = [0u8; UDP_NAME_MAX];
    let mut raw = [0u8; 22];
    let family = u16::from_ne_bytes([*sa.first()?, *sa.get(1)?]);
    let len = if family == 2 && sa.len() >= 16 {
        out[0] = b'4';
        raw[..4].copy_from_slice(&sa[4..8]);
        raw[4..6].copy_from_slice(&sa[2..4]);
        6
    } else if family == 10 && sa.len() >= 28 {
        out[0] = b'6';
        raw[..16].copy_from_slice(&sa[8..24]);
        raw[16..18].copy_from_slice(&sa[2..4]);
        let scope = u32::from_ne_bytes([sa[24], sa[25], sa[26], sa[27]]);
        raw[18..22].copy_from_slice(&scope.to_be_bytes());
        if scope == 0 {
            18
        } else {
            22
        }
    } else {
        return None;
    };
    let mut n = 1;
    encode(&mut out, &mut n, &raw[..len]);
    Some((out, n))
}

/// The sockaddr a sender's name part stands for ([`udp_name`] backwards), and its length.
pub fn udp_addr(name: &[u8]) -> Option<([u8; 28], usize)> {
    let mut sa = [0u8; 28];
    let (kind, rest) = name.split_first()?;
    let mut raw = [0u8; 22];
    match (kind, rest.len()) {
        (b'4', 8) => {
            decode(rest, &mut raw[..6])?;
            sa[..2].copy_from_slice(&2u16.to_ne_bytes());
            sa[4..8].copy_from_slice(&raw[..4]);
            sa[2..4].copy_from_slice(&raw[4..6]);
            Some((sa, 16))
        }
        (b'6', 24 | 30) => {
            let scoped = rest.len() == 30;
            decode(rest, &mut raw[..if scoped { 22 } else { 18 }])?;
            sa[..2].copy_from_slice(&10u16.to_ne_bytes());
            sa[8..24].copy_from_slice(&raw[..16]);
            sa[2..4].copy_from_slice(&raw[16..18]);
            if scoped {
                let scope = u32::from_be_bytes([raw[18], raw[19], raw[20], raw[21]]);
                sa[24..28].copy_from_slice(&scope.to_ne_bytes());
            }
            Some((sa, 28))
        }
        _ => None,
    }
}

/// Bytes of an address or an option value in a [`NetReq`] or [`NetResp`].
pub const NET_DATA: usize = 128;

#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NetReq {
    pub abi: u32,
    pub op: u32,
    pub a: i64,
    pub b: i64,
    pub c: i64,
    /// Bytes of `data` used.
    pub len: u32,
    pub _pad: u32,
    pub data: [u8; NET_DATA],
}

/// `ret` is 0 (or a value), a negative errno, or [`NET_LOCAL`].
#[repr(C)]
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NetResp {
    pub ret: i64,
    pub len: u32,
    pub _pad: u32,
    pub data: [u8; NET_DATA],
}

/// [`NetResp::ret`] for a socket the pComponent does not run (its cluster has no
/// nComponent, or the descriptor is not one of its sockets): the call goes to the local stack.
pub const NET_LOCAL: i64 = 1;

// These sizes are part of SHIM_ABI_VERSION: the pComponent reads the hello before it can check
// the version, so a change here must bump it.
const _: () = assert!(
    size_of::<Welcome>() == 32
        && offset_of!(Welcome, abi) == 8
        && offset_of!(Welcome, flags) == 12
        && offset_of!(Welcome, uffd_features) == 16
        && offset_of!(Welcome, refused) == 24
);
const _: () = assert!(
    size_of::<Hello>() == 128
        && offset_of!(Hello, abi) == 0
        && offset_of!(Hello, kind) == 4
        && offset_of!(Hello, vnode) == 40
        && offset_of!(Hello, interleave_unit) == 112
);
const _: () = assert!(size_of::<ShimReq>() == 48 && offset_of!(ShimReq, a) == 8);
const _: () = assert!(size_of::<ShimResp>() == 24);
const _: () = assert!(size_of::<VmaRec>() == 24 && size_of::<Admitted>() == 8);
const _: () = assert!(size_of::<NetReq>() == 168 && size_of::<NetResp>() == 144);

/// The userfaultfd uapi subset both sides use (include/uapi/linux/userfaultfd.h).
pub mod uffd {
    use super::{offset_of, size_of, FromBytes, Immutable, IntoBytes, KnownLayout};

    pub const UFFD_API: u64 = 0xAA;
    pub const UFFDIO_API: u64 = 0xc018_aa3f;
    pub const UFFDIO_REGISTER: u64 = 0xc020_aa00;
    pub const UFFDIO_WAKE: u64 = 0x8010_aa02;
    pub const UFFDIO_COPY: u64 = 0xc028_aa03;
    pub const UFFDIO_WRITEPROTECT: u64 = 0xc018_aa06;
    pub const UFFDIO_CONTINUE: u64 = 0xc020_aa07;
    /// On /dev/userfaultfd: a new userfaultfd of the caller's address space; who may is
    /// decided when the device is opened, not by the caller's privileges.
    pub const USERFAULTFD_IOC_NEW: u64 = 0xaa00;

    pub const FEATURE_MISSING_SHMEM: u64 = 1 << 5;
    /// Each page-fault message carries the faulting thread's id ([`Msg::tid`]).
    pub const FEATURE_THREAD_ID: u64 = 1 << 8;
    /// A touch of a page that the memfd holds but the program does not map is a fault message
    /// too (a minor fault), answered with UFFDIO_CONTINUE (`splitos bench` measures the install
    /// this way).
    pub const FEATURE_MINOR_SHMEM: u64 = 1 << 10;
    pub const FEATURE_WP_HUGETLBFS_SHMEM: u64 = 1 << 12;
    /// A write to a write-protected page lifts the protection in the kernel, without a fault
    /// message; PAGEMAP_SCAN tells which pages were written (Linux 6.7).
    pub const FEATURE_WP_ASYNC: u64 = 1 << 15;
    /// What a [`super::Welcome`] may ask for.
    pub const FEATURES_ON_REQUEST: u64 = FEATURE_WP_ASYNC;

    pub const REGISTER_MODE_MISSING: u64 = 1;
    pub const REGISTER_MODE_WP: u64 = 2;
    pub const REGISTER_MODE_MINOR: u64 = 4;

    pub const COPY_MODE_WP: u64 = 2;
    pub const WP_MODE_WP: u64 = 1;

    pub const EVENT_PAGEFAULT: u8 = 0x12;
    pub const PAGEFAULT_FLAG_WRITE: u64 = 1;
    pub const PAGEFAULT_FLAG_WP: u64 = 2;

    #[repr(C)]
    #[derive(Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
    pub struct Api {
        pub api: u64,
        pub features: u64,
        pub ioctls: u64,
    }

    #[repr(C)]
    #[derive(Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
    pub struct Range {
        pub start: u64,
        pub len: u64,
    }

    #[repr(C)]
    #[derive(Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
    pub struct Register {
        pub range: Range,
        pub mode: u64,
        pub ioctls: u64,
    }

    #[repr(C)]
    #[derive(Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
    pub struct Copy {
        pub dst: u64,
        pub src: u64,
        pub len: u64,
        pub mode: u64,
        pub copy: i64,
    }

    #[repr(C)]
    #[derive(Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
    pub struct WriteProtect {
        pub range: Range,
        pub mode: u64,
    }

    #[repr(C)]
    #[derive(Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
    pub struct Continue {
        pub range: Range,
        pub mode: u64,
        /// Bytes mapped, or a negative errno.
        pub mapped: i64,
    }

    /// `struct uffd_msg` for a page fault: event at byte 0, flags at 8, address at 16, the
    /// faulting thread's id at 24 (with [`FEATURE_THREAD_ID`]).
    #[repr(C)]
    #[derive(Default, Clone, Copy, FromBytes, IntoBytes, Immutable, KnownLayout)]
    pub struct Msg {
        pub event: u8,
        pub _r1: u8,
        pub _r2: u16,
        pub _r3: u32,
        pub flags: u64,
        pub address: u64,
        pub arg: u64,
    }

    impl Msg {
        /// The faulting thread's id as its own PID namespace numbers it; 0 when unknown.
        pub fn tid(&self) -> u32 {
            self.arg as u32
        }
    }

    // The kernel reads and writes these at the sizes its ioctl numbers encode (the 0x18, 0x20,
    // 0x28 in bits 16..29 of UFFDIO_API, _REGISTER, _COPY): a wrong size is a wrong request.
    const _: () = assert!(size_of::<Api>() == 24 && UFFDIO_API >> 16 & 0x3fff == 24);
    const _: () = assert!(size_of::<Range>() == 16 && UFFDIO_WAKE >> 16 & 0x3fff == 16);
    const _: () = assert!(size_of::<Register>() == 32 && UFFDIO_REGISTER >> 16 & 0x3fff == 32);
    const _: () = assert!(size_of::<Copy>() == 40 && UFFDIO_COPY >> 16 & 0x3fff == 40 && offset_of!(Copy, copy) == 32);
    const _: () = assert!(size_of::<WriteProtect>() == 24 && UFFDIO_WRITEPROTECT >> 16 & 0x3fff == 24);
    const _: () = assert!(
        size_of::<Continue>() == 32 && UFFDIO_CONTINUE >> 16 & 0x3fff == 32 && offset_of!(Continue, mapped) == 24
    );
    const _: () = assert!(size_of::<Msg>() == 32 && offset_of!(Msg, flags) == 8 && offset_of!(Msg, address) == 16);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_names_round_trip_and_others_are_refused() {
        let mut v4 = [0u8; 16];
        v4[..2].copy_from_slice(&2u16.to_ne_bytes());
        v4[2..4].copy_from_slice(&5353u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[10, 0, 0, 7]);
        let (n, len) = udp_name(&v4).unwrap();
        assert_eq!(len, 9);
        let (back, blen) = udp_addr(&n[..len]).unwrap();
        assert_eq!(&back[..blen], &v4);
        let mut v6 = [0u8; 28];
        v6[..2].copy_from_slice(&10u16.to_ne_bytes());
        v6[2..4].copy_from_slice(&443u16.to_be_bytes());
        v6[8] = 0xfe;
        v6[9] = 0x80;
        v6[23] = 1;
        v6[24..28].copy_from_slice(&3u32.to_ne_bytes());
        let (n, len) = udp_name(&v6).unwrap();
        assert_eq!(len, UDP_NAME_MAX);
        let (back, blen) = udp_addr(&n[..len]).unwrap();
        assert_eq!(&back[..blen], &v6);
        assert!(udp_name(&v4[..15]).is_none());
        assert!(udp_name(&[1, 0, 0, 0]).is_none());
        let mut plain = v6;
        plain[24..28].copy_from_slice(&[0; 4]);
        let (n, len) = udp_name(&plain).unwrap();
        assert_eq!(len, 25);
        assert_eq!(&udp_addr(&n[..len]).unwrap().0[..28], &plain);
        for bad in [&b""[..], b"4", b"4CgAABxT", b"5CgAABxTp", b"4CgAA.xTp", b"6zz"] {
            assert!(udp_addr(bad).is_none(), "{bad:?}");
        }
    }
}
