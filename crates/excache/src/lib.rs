//! The ExCache and its miss path: the cache's bookkeeping ([`cache`]), the miss path that moves
//! lines ([`miss`]), and the policies a researcher swaps: eviction ([`cache`]), read-ahead
//! ([`prefetch`]), both Ebbs replaceable while running ([`policies`]), dirty tracking ([`dirty`]), the compressed tier behind the cache ([`tier`]),
//! where lines come from ([`store`], by a copy where it can: [`onesided`]) and what is done to a program's heap ([`region`]).
//! Below the region, the operations on a heap region ([`uffd`], [`huge`]); beside the miss
//! path, the counters of each run ([`stats`]).
//!
//! It is a crate of its own, below the pComponent (`splitos::pmon`), which hosts the programs
//! and gives the miss path their regions: the ExCache can be built, tested and benchmarked
//! without a program socket, a FUSE mount or a network stub.
pub mod cache;
pub mod dirty;
pub mod huge;
pub mod miss;
pub mod onesided;
pub mod policies;
pub mod prefetch;
pub mod region;
pub mod series;
pub mod stats;
pub mod store;
pub mod tier;
pub mod uffd;

pub use cache::{Clock, EvictionPolicy, ExCache, Fifo, Interleave};
pub use dirty::{Keep, Taken};
pub use miss::{Access, FailHook, MissPath, MissPathParts, ProcHeap};
pub use policies::Policies;
pub use prefetch::{prefetcher, Prefetcher, Sequential};
pub use region::{Install, Region, UffdRegion};
pub use store::{Page, PageStore, Place, ProcMemory, RemoteStore};
pub use tier::{Codec, Entry, Lz4, OldestFirst, VictimTier};
