//! The shim: the thin processor-side part of the splitkernel that lives inside an unmodified,
//! dynamically linked program (LD_PRELOAD).
//!
//! It reserves one heap region, backed by a memfd and registered with a userfaultfd, and hands
//! both descriptors to its pComponent, which serves every fault on the region from its ExCache.
//! The whole malloc family is mimalloc, whose only source of memory is our `mmap`; anonymous
//! mmap/munmap/mremap/mprotect/madvise and brk/sbrk on the region become requests to the
//! pComponent, which forwards them to the process's home mComponent.
//!
//! This code runs inside malloc and inside fork: nothing on these paths may allocate, so it
//! uses raw system calls and fixed-size records only. There is no fault handler here, so no
//! thread of the program ever serves faults on its own heap.
//!
//! - `start`: the start-up state machine, the environment cache, the library constructor;
//! - `conn`: the connection to the pComponent (hello with the descriptors, request/response);
//! - `vm`: the heap region and the virtual-memory calls that land on it;
//! - `brk`: the program break, emulated inside the region;
//! - `fork`: fork, giving the child a private copy through the mComponents, and the
//!   registration of fork handlers, the shim's own child handler first;
//! - `exec`: the exec family and spawn, so that a new image keeps the shim;
//! - `directio`: reads from FUSE files into the heap, through memory outside it;
//! - `heap`: the malloc family;
//! - `net`: TCP sockets run by an nComponent (the socket stub's program side);
//! - `trap`: the seccomp filter that sends the program's own socket system calls to `net`;
//! - `sys`: raw system calls and the allocation-free helpers everything above uses.
#![deny(unsafe_op_in_unsafe_fn)]
// The exported functions are C's: their contract is that of the function they replace.
#![allow(clippy::missing_safety_doc)]

mod brk;
mod conn;
mod directio;
mod exec;
mod fork;
mod heap;
mod net;
mod start;
mod sys;
mod trap;
mod vm;

pub use brk::*;
pub use exec::*;
pub use fork::*;
pub use heap::*;
pub use net::*;
pub use vm::*;
