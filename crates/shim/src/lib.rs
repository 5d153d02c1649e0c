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
#![allow(clippy::missing_safety_doc)]

mod heap;
mod region;

pub use heap::*;
pub use region::*;
