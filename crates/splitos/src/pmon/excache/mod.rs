//! The ExCache and its miss path: the cache's bookkeeping ([`cache`]), the miss path that moves
//! lines ([`miss`]), and the policies a researcher swaps: eviction ([`cache`]), read-ahead
//! ([`prefetch`]), both Ebbs replaceable while running ([`policies`]), dirty tracking ([`dirty`]), the compressed tier behind the cache ([`tier`]),
//! where lines come from ([`store`], by a copy where it can: [`onesided`]) and what is done to a program's heap ([`region`]).
pub(super) mod cache;
pub(super) mod dirty;
pub(super) mod miss;
pub(super) mod onesided;
pub(crate) mod policies;
pub(super) mod prefetch;
pub(super) mod region;
pub(super) mod store;
pub(super) mod tier;

pub use cache::{Clock, EvictionPolicy, ExCache, Fifo, Interleave};
pub use dirty::{Keep, Taken};
pub use miss::{Access, FailHook, MissPath, MissPathParts, ProcHeap};
pub use policies::Policies;
pub use prefetch::{prefetcher, Prefetcher, Sequential};
pub use region::{Install, Region, UffdRegion};
pub use store::{Page, PageStore, Place, ProcMemory, RemoteStore};
pub use tier::{Codec, Entry, Lz4, OldestFirst, VictimTier};
