//! The pComponent's configuration ([`PcompConfig`]) and its knobs that take names.
use clap::ArgAction;
use serde::{Deserialize, Serialize};
use splitos_rpc::knob_enum;
use splitos_rpc::poll::Polling;

use super::{check_netns, ConfigError, Size, ANY_PORT, PAGE};

// The ExCache's policies by name. How a name builds its policy is the ExCache's part
// (splitos-excache's policies.rs, `BuildEviction` and `BuildPrefetch`): the configuration, the
// command line and the managers take the names without importing the pComponent.
knob_enum! {
    /// Which line of a full ExCache set a miss evicts.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum EvictPolicy, "eviction", EVICT_POLICIES {
        /// The line installed first.
        Fifo = "fifo",
        /// The first line not referenced since the hand last passed it (second chance), an
        /// approximation of LRU; "lru" is refused rather than taken for it.
        Clock = "clock",
        /// CLOCK whose new lines start unreferenced unless they were evicted recently (ghost
        /// entries): lines used once leave first. Wants access_sampling = "unmap".
        GhostClock = "ghost-clock",
        /// The kernel's inactive and active lists: a line missed again soon after it was
        /// evicted (its refault distance within the set's ways), or written while inactive,
        /// is active, and lines used once leave first. O(1) per miss at any ways.
        #[default]
        Workingset = "workingset",
    }
}

knob_enum! {
    /// Which lines a remote miss reads ahead (docs/excache.md).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum PrefetchPolicy, "prefetch", PREFETCH_POLICIES {
        /// The next lines, only while a process's misses are sequential.
        Sequential = "sequential",
        /// As `sequential`, and the next line of any remote miss.
        Nextline = "nextline",
        /// Leap (ATC'20): the majority stride of the recent misses, with a window that grows
        /// while what it read ahead is used.
        #[default]
        Leap = "leap",
    }
}

/// Ways of a set that interleaving never pins. With one, memcached under 1:2 interleaving with
/// more local pages than the ExCache holds stopped for good: its two threads, each faulting on
/// a remote page of the same set, took the one way from each other at every fault. The
/// configuration checks `interleave` against it, so it is declared here, for the ExCache too.
pub const MIN_UNPINNED: usize = 2;

knob_enum! {
    /// How the pComponent learns which lines a program wrote.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum DirtyTracking, "dirty_tracking", DIRTY_TRACKING {
        /// A line installed after a read is write-protected and the first write traps to the
        /// pComponent; lines of a process whose reads are mostly followed by writes are
        /// installed writable and dirty instead.
        #[default]
        Fault = "fault",
        /// The kernel lifts write protection itself and PAGEMAP_SCAN reports written pages.
        Scan = "scan",
    }
}

knob_enum! {
    /// How the ExCache learns that a resident line is still in use.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum AccessSampling, "access_sampling", ACCESS_SAMPLING {
        /// Only misses and first writes are seen: a line read but never written looks unused.
        #[default]
        Off = "off",
        /// Lines the policy passed over are unmapped in batches, their pages kept; the kernel
        /// maps one again at its next touch, and the page tables say so before it would
        /// leave: a reference bit (docs/excache.md).
        Unmap = "unmap",
    }
}

knob_enum! {
    /// Whether misses and write-backs reach the pages of owners on this host by a copy.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum OneSided, "one_sided", ONE_SIDED {
        /// Every fetch and write-back is a message to the owner.
        Off = "off",
        /// An owner on this host (shared-memory transport) hands over its segment of each
        /// vRegion, and the miss path copies pages in and out without waking it
        /// (docs/excache.md).
        #[default]
        On = "on",
    }
}

knob_enum! {
    /// Whether idle CPUs poll while programs run here.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum IdlePoll, "idle_poll", IDLE_POLL {
        /// The kernel's idle states: a CPU whose thread waits for a miss may halt.
        Off = "off",
        /// While programs run, a CPU latency request of 0 µs keeps idle CPUs polling
        /// (docs/excache.md).
        #[default]
        On = "on",
    }
}

knob_enum! {
    /// Whether the pComponent backs heaps with its private tmpfs and pre-allocates fresh 2 MiB
    /// extents as huge pages.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum HugePages, "huge_pages", HUGE_PAGES {
        #[default]
        Off = "off",
        On = "on",
    }
}

knob_enum! {
    /// Where fault workers run.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum FaultCpu, "fault_cpu", FAULT_CPUS {
        Any = "any",
        #[default]
        Faulting = "faulting",
    }
}

knob_enum! {
    /// How a socket's bytes travel between a pComponent and its nComponent (the paper's
    /// section 3.4-3.6).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
    pub enum NetPath, "net_path", NET_PATHS {
        /// In the requests themselves, straight between the two (DDIO).
        #[default]
        Ddio = "ddio",
        /// Through socket buffers on an mComponent: the stub writes what a program sends
        /// there and the nComponent fetches it; the nComponent writes what it receives there
        /// and the stub reads it (DMA).
        Dma = "dma",
    }
}

/// A pComponent's knobs: a `[[pcomponent]]` table of the cluster configuration, the options of
/// `splitos proc`, and those `splitos run` gives the embedded cluster's pComponent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct PcompConfig {
    /// Where it listens for the other components (port 0: any free port).
    #[arg(long, default_value = ANY_PORT)]
    pub listen: String,
    /// ExCache capacity: at least 256K, at most the host's memory. `splitos run`'s embedded
    /// cluster, when it is not given, sizes it for the host: a quarter of the memory it has
    /// available, from 64M to 4G (docs/excache.md).
    #[arg(long, default_value_t = Size(64 << 20))]
    pub excache: Size,
    /// The most `cluster set-excache` may grow the ExCache to while it runs (0: four times
    /// excache, at most the host's memory). Only the lines' bookkeeping is reserved for it, about 40 bytes a line.
    #[arg(long, default_value_t = Size(0))]
    pub excache_max: Size,
    /// ExCache associativity: lines per set (0: fully associative, any line may hold any
    /// page; with the workingset policy a miss costs the same at any size).
    #[arg(long, default_value_t = 0)]
    pub ways: usize,
    /// Eviction policy: fifo, clock (second chance), ghost-clock (new lines start
    /// unreferenced unless evicted recently; with access_sampling = "unmap"), or workingset
    /// (the kernel's inactive and active lists, a line missed again soon after it left is
    /// active; O(1) per miss at any ways).
    #[arg(long, default_value_t)]
    pub eviction: EvictPolicy,
    /// Piggybacking: a dirty victim's flush goes in the same RPC as the fill when both go to
    /// one mComponent (`--no-piggyback`: separate RPCs).
    #[arg(long = "no-piggyback", action = ArgAction::SetFalse)]
    pub piggyback: bool,
    /// Threads serving the misses of each process.
    #[arg(long, default_value_t = 1)]
    pub fault_workers: usize,
    /// How long a fault worker polls for the next fault before sleeping (µs): a busy program
    /// faults again within microseconds, and a sleeping worker's vCPU is slow to wake. Beside
    /// the faulting thread (fault_cpu = faulting) a worker sleeps at once instead.
    #[arg(long, default_value_t = 100)]
    pub fault_spin_us: u64,
    /// How long the thread serving a program's heap calls (mmap, munmap, mprotect, madvise,
    /// mremap) polls for the next one after answering, and how long the program polls for
    /// each answer, before sleeping (µs; 0: both sleep at once). Each wake-up of a sleeping
    /// side costs the call several microseconds on a virtual machine (docs/excache.md).
    #[arg(long, default_value_t = 20)]
    pub heap_call_spin_us: u64,
    /// Whether fault workers' polling adapts to how often the process faults: adaptive shrinks
    /// it while the process idles and grows it back while it faults; fixed always polls
    /// fault_spin_us (docs/transport.md).
    #[arg(long, default_value_t)]
    pub fault_polling: Polling,
    /// Most lines read ahead with a remote miss (0: off; docs/excache.md).
    #[arg(long, default_value_t = 32)]
    pub prefetch_lines: usize,
    /// Links to each mComponent a batch of fetched pages is striped across, all under way at
    /// once (ThymesisFlow's bonding): a miss that reads ahead N pages sends up to `links`
    /// requests of about N/links pages each, on as many connections (or shared-memory
    /// channels) of the faulting thread. 1: one request per batch (docs/elastic-memory.md).
    #[arg(long, default_value_t = 1)]
    pub links: usize,
    /// Read-ahead policy: leap (the majority stride of recent misses), sequential (only while
    /// misses are sequential), nextline (also the next line of any remote miss).
    #[arg(long, default_value_t)]
    pub prefetch: PrefetchPolicy,
    /// Fresh lines installed zero-filled and writable with a first touch (0: off).
    #[arg(long, default_value_t = 16)]
    pub fault_around: usize,
    /// Memory for evicted lines kept compressed (LZ4) beyond the ExCache (0: off, else at
    /// least 4096).
    #[arg(long, default_value_t = Size(0))]
    pub compressed_tier: Size,
    /// Fresh lines pre-allocated in the heap's memfd past a first touch, so that touching them
    /// does not trap (0: off).
    #[arg(long, default_value_t = 64)]
    pub prealloc: usize,
    /// Fresh lines a first touch gets (installed, then pre-allocated) when it does not continue
    /// a run of first touches; each touch that continues one gets four times the run's last,
    /// up to fault_around + prealloc (at that or more: every first touch gets the whole
    /// window). A program that fills new memory soon gets whole windows; one that touches
    /// new memory here and there is not given lines it never uses (docs/excache.md).
    #[arg(long, default_value_t = 8)]
    pub fault_around_start: usize,
    /// Unmapped heap each process keeps mapped at its home, to map again without asking it
    /// (0: off; none for processes of a vNode with a memory quota, which it would charge).
    #[arg(long, default_value_t = Size(64 << 20))]
    pub heap_reuse: Size,
    /// Huge pages: on puts heaps on a private tmpfs and pre-allocates fresh 2 MiB extents as
    /// huge pages (needs root); off: memfd heaps, 4 KiB pages.
    #[arg(long, default_value_t)]
    pub huge_pages: HugePages,
    /// Where fault workers run: faulting (each on the CPU of the thread whose fault it serves,
    /// sleeping between faults unless the thread keeps leaving that CPU; the mComponents'
    /// shared-memory channels follow it), or any (anywhere, polling fault_spin_us).
    #[arg(long, default_value_t)]
    pub fault_cpu: FaultCpu,
    /// How it learns which lines a program wrote: fault (the first write to a line traps to
    /// it) or scan (the kernel records writes and eviction asks it; Linux 6.7+, not with huge
    /// pages or the evictor).
    #[arg(long, default_value_t)]
    pub dirty_tracking: DirtyTracking,
    /// Reads made visible: off, or unmap (lines the policy asks to observe are unmapped in
    /// batches, the kernel maps one again at its next touch, and a line found mapped again
    /// when it would leave counts as used: with workingset, an eighth of the lines, the next
    /// to leave, wait unmapped at the inactive list's head and stay if touched; with clock,
    /// every line the hand passes; not with fifo; needs dirty_tracking = fault, not huge
    /// pages; the pComponent needs CAP_SYS_NICE, Linux 6.7+ and a host without swap, else it
    /// runs with off and says why).
    #[arg(long, default_value_t)]
    pub access_sampling: AccessSampling,
    /// One-sided access: on (owners on this host hand over their pages of each vRegion in a
    /// memfd; a miss or write-back of a page the owner holds is a copy, with no message and no
    /// mComponent thread woken; vRegions with one member only, not replicated, striped or
    /// logged ones; the shared-memory transport only), or off (every access a message).
    #[arg(long, default_value_t)]
    pub one_sided: OneSided,
    /// Idle polling: on (while programs run here, the pComponent asks the kernel to keep idle
    /// CPUs polling instead of entering idle states, through /dev/cpu_dma_latency: a thread
    /// waiting for a miss resumes without its CPU being woken, tens of microseconds a miss on
    /// a virtual machine; idle CPUs spin while programs run), or off.
    #[arg(long, default_value_t)]
    pub idle_poll: IdlePoll,
    /// Spare ways a background evictor keeps in each ExCache set a miss used, fewer than ways
    /// (0: off, misses evict inline), or auto: a fully associative ExCache of 64 lines or more
    /// keeps a sixteenth of its lines spare, at most 128, and a set-associative one, or one
    /// with dirty_tracking = scan or huge pages, none.
    #[arg(long, default_value_t)]
    pub evict_reserve: EvictReserve,
    /// Pages on either side of each of the background evictor's victims that leave with it
    /// when its policy would let them go soon too (not seen used, filled before the last three
    /// quarters of the ExCache's fills), at most 64; 0: victims leave alone. A run of pages
    /// leaves its program with one hole punch and one TLB flush where scattered victims cost
    /// one each (docs/excache.md#victims-neighbours).
    #[arg(long, default_value_t = 15)]
    pub evict_beside: usize,
    /// Interleaving (ThymesisFlow's best configuration): "N:M" keeps N of every M heap pages
    /// (or ranges of interleave_unit) in the ExCache for good, local, and the others remote,
    /// round robin; off: none. A set keeps at most all its ways but two (and but
    /// evict_reserve) pinned. `splitos run` on a running cluster sets it for its job alone
    /// (docs/elastic-memory.md#interleaving).
    #[arg(long, default_value_t)]
    pub interleave: InterleaveRatio,
    /// What interleaving deals out round robin: 4K (by page), or a larger multiple of 4K (by
    /// range).
    #[arg(long, default_value_t = Size(PAGE))]
    pub interleave_unit: Size,
    /// Percent of an equal share of the ExCache (its lines over the processes holding lines)
    /// that each process keeps against other processes' misses (0: off, at most 100;
    /// docs/excache.md).
    #[arg(long, default_value_t = 0)]
    pub share_floor: usize,
    /// The shortcut: two programs of a vNode connect through their pComponents (this one, or
    /// two directly), not through an nComponent (`--no-net-shortcut`: always through the
    /// nComponent; docs/network.md).
    #[arg(long = "no-net-shortcut", action = ArgAction::SetFalse)]
    pub net_shortcut: bool,
    /// How sockets' bytes travel to the nComponent: ddio (in the requests) or dma (through
    /// socket buffers on an mComponent; docs/network.md).
    #[arg(long, default_value_t)]
    pub net_path: NetPath,
    /// Programs of one user other than root that may run here at once (a forked child counts
    /// from its parent's fork); beyond, a program is refused at its start and a fork fails
    /// (EAGAIN; docs/security.md).
    #[arg(long, default_value_t = 128)]
    pub max_programs_per_user: usize,
    /// Programs of all users but root that may run here at once.
    #[arg(long, default_value_t = 1024)]
    pub max_programs: usize,
    /// How long a forked child whose parent has ended may take to say hello before it is given
    /// up and its home drops its copy of the address space (ms); a live parent's wait for it.
    #[arg(long, default_value_t = 30_000)]
    pub fork_timeout_ms: u64,
    /// How often it measures the latency and bandwidth of its links to the mComponents its
    /// programs use, for the topology graph (ms; 0: never). Each round costs per mComponent
    /// three small round trips and two 256 KiB replies (docs/control-plane.md#topology).
    #[arg(long, default_value_t = 5_000)]
    pub link_probe_ms: u64,
    /// The network namespace (`ip netns`) `cluster up` starts it in: a "host" of a cluster on
    /// one machine (docs/deployment.md); none: the namespace of `cluster up`.
    #[arg(skip)]
    pub netns: Option<String>,
}

impl Default for PcompConfig {
    fn default() -> Self {
        splitos_rpc::knob::defaults()
    }
}

/// The least ExCache a program works with: an instruction, a system call's buffers and the
/// interpreter's hot pages need lines at once, and with fewer (4K: one) each miss evicts the
/// line the next access needs again, so that even a Python one-liner never ends.
const MIN_EXCACHE: u64 = 256 << 10;
/// The most pages on either side of a victim that may leave with it (`evict_beside`): in a
/// run of 129 the flush is already a small part of each page's cost.
const MAX_EVICT_BESIDE: usize = 64;

/// Interleaving's share of the heap kept local: `off`, or `N:M`, N of every M pages (or ranges)
/// with 1 <= N < M <= 1024.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterleaveRatio(pub Option<(u32, u32)>);

impl std::str::FromStr for InterleaveRatio {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<InterleaveRatio, ConfigError> {
        let t = s.trim();
        if t.is_empty() || t == "off" {
            return Ok(InterleaveRatio(None));
        }
        let bad = || ConfigError::NotARatio(s.to_string());
        let (n, m) = t.split_once(':').ok_or_else(bad)?;
        let (n, m): (u32, u32) = (
            n.trim().parse().map_err(|_| bad())?,
            m.trim().parse().map_err(|_| bad())?,
        );
        InterleaveRatio::of(n, m).map_err(|_| bad())
    }
}

impl InterleaveRatio {
    /// N of every M pages local, checked.
    pub fn of(n: u32, m: u32) -> Result<InterleaveRatio, ConfigError> {
        if n == 0 || n >= m || m > 1024 {
            return Err(ConfigError::Ratio { n, m });
        }
        Ok(InterleaveRatio(Some((n, m))))
    }

    /// Checks the ratio and its unit against an ExCache of `ways` ways per set whose
    /// background evictor keeps `reserve` of them free; an error names the field.
    pub fn check(&self, unit: Size, ways: u64, reserve: usize) -> Result<(), ConfigError> {
        if unit.0 < PAGE || !unit.0.is_multiple_of(PAGE) {
            return Err(ConfigError::InterleaveUnit(unit));
        }
        let unpinned = MIN_UNPINNED as u64 + reserve as u64;
        if self.0.is_some() && ways <= unpinned {
            return Err(ConfigError::InterleavePinsNothing { ways, reserve });
        }
        Ok(())
    }
}

impl std::fmt::Display for InterleaveRatio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            None => write!(f, "off"),
            Some((n, m)) => write!(f, "{n}:{m}"),
        }
    }
}

impl Serialize for InterleaveRatio {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for InterleaveRatio {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// The background evictor's reserve (`evict_reserve`): `auto` (None), or spare ways per set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvictReserve(pub Option<usize>);

impl std::str::FromStr for EvictReserve {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<EvictReserve, ConfigError> {
        match s.trim() {
            "auto" => Ok(EvictReserve(None)),
            t => t
                .parse()
                .map(|n| EvictReserve(Some(n)))
                .map_err(|_| ConfigError::NotAReserve(s.to_string())),
        }
    }
}

impl std::fmt::Display for EvictReserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            None => write!(f, "auto"),
            Some(n) => write!(f, "{n}"),
        }
    }
}

impl Serialize for EvictReserve {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            None => s.serialize_str("auto"),
            Some(n) => s.serialize_u64(n as u64),
        }
    }
}

impl<'de> Deserialize<'de> for EvictReserve {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A file written before `auto` existed says a number.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Given {
            Ways(usize),
            Name(String),
        }
        match Given::deserialize(d)? {
            Given::Ways(n) => Ok(EvictReserve(Some(n))),
            Given::Name(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// The most links a pComponent stripes a batch across: each is a connection of every faulting
/// thread to every mComponent it uses.
pub const MAX_LINKS: usize = 16;

impl PcompConfig {
    /// Lines per ExCache set, as the ExCache makes them: fully associative (`ways = 0`) is one
    /// set of every line, and a set has no more ways than the ExCache has lines.
    fn set_ways(&self) -> u64 {
        let lines = self.excache.0 / PAGE;
        if self.ways == 0 {
            lines
        } else {
            (self.ways as u64).min(lines)
        }
    }

    /// The background evictor's reserve in spare ways per set, `auto` resolved (0: off). In a
    /// fully associative ExCache a reserve costs a few lines of thousands, and a miss finds a
    /// free line instead of evicting on its way; in sets of a few ways it costs a share of
    /// every set. A first touch claims its fault-around window with it, 17 lines: a reserve
    /// of 32 ran dry within two such misses of a burst, and the evictor woke for a half of
    /// it, 16 lines a round; 128 lets it work in rounds of 64 and left node and word counting
    /// a fifth of the inline evictions (docs/excache.md#background-evictor). More costs
    /// capacity: 256 and 512 missed more on GNU sort and the record table.
    pub fn reserve_ways(&self) -> usize {
        match self.evict_reserve.0 {
            Some(n) => n,
            // Huge pages: every run the evictor cuts out of one splits it, and the pair is not
            // yet measured against inline eviction.
            None if self.dirty_tracking == DirtyTracking::Scan || self.huge_pages == HugePages::On => 0,
            None => {
                let ways = self.set_ways() as usize;
                if ways < 64 {
                    0
                } else {
                    (ways / 16).min(128)
                }
            }
        }
    }

    /// The most the ExCache may grow to, in bytes.
    pub fn excache_max(&self) -> u64 {
        match self.excache_max.0 {
            0 => (self.excache.0 * 4)
                .min(host_memory().unwrap_or(u64::MAX))
                .max(self.excache.0),
            max => max,
        }
    }

    /// An error names the field it is about.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_excache(self.excache.0).map_err(ConfigError::Excache)?;
        self.interleave
            .check(self.interleave_unit, self.set_ways(), self.reserve_ways())?;
        if !(1..=MAX_LINKS).contains(&self.links) {
            return Err(ConfigError::Links(self.links));
        }
        if self.excache_max.0 != 0 && self.excache_max.0 < self.excache.0 {
            return Err(ConfigError::ExcacheMaxBelow {
                max: self.excache_max,
                excache: self.excache,
            });
        }
        check_excache(self.excache_max.0.max(self.excache.0)).map_err(ConfigError::ExcacheMax)?;
        if self.dirty_tracking == DirtyTracking::Scan && self.huge_pages == HugePages::On {
            return Err(ConfigError::ScanWithHugePages);
        }
        if self.dirty_tracking == DirtyTracking::Scan && self.reserve_ways() > 0 {
            return Err(ConfigError::ScanWithEvictor);
        }
        if self.access_sampling == AccessSampling::Unmap {
            if self.eviction == EvictPolicy::Fifo {
                return Err(ConfigError::SamplingWithFifo);
            } else if self.dirty_tracking != DirtyTracking::Fault {
                return Err(ConfigError::SamplingWithScan);
            } else if self.huge_pages != HugePages::Off {
                return Err(ConfigError::SamplingWithHugePages);
            }
        }
        if self.compressed_tier.0 != 0 && self.compressed_tier.0 < PAGE {
            return Err(ConfigError::CompressedTier(self.compressed_tier.0));
        }
        if self.fault_workers == 0 {
            return Err(ConfigError::NoFaultWorkers);
        }
        if self.fork_timeout_ms == 0 {
            return Err(ConfigError::NoForkTimeout);
        }
        let ways = self.set_ways();
        if self.reserve_ways() as u64 >= ways {
            return Err(ConfigError::EvictReserve {
                reserve: self.reserve_ways(),
                ways,
            });
        }
        if self.share_floor > 100 {
            return Err(ConfigError::ShareFloor(self.share_floor));
        }
        if self.evict_beside > MAX_EVICT_BESIDE {
            return Err(ConfigError::EvictBeside(self.evict_beside));
        }
        check_netns(&self.netns)
    }
}

/// Refuses an ExCache size that cannot work: below [`MIN_EXCACHE`], or more than this host's
/// memory (its lines' bookkeeping alone would take seconds to set up and then not fit).
pub fn check_excache(bytes: u64) -> Result<(), ExcacheSize> {
    if bytes < MIN_EXCACHE {
        return Err(ExcacheSize::TooSmall(Size(bytes)));
    }
    if let Some(host) = host_memory().filter(|&h| bytes > h) {
        return Err(ExcacheSize::MoreThanHost {
            size: Size(bytes),
            host: Size(host),
        });
    }
    Ok(())
}

/// An ExCache size that cannot work ([`check_excache`]); the field it is about names it.
#[derive(Debug, thiserror::Error)]
pub enum ExcacheSize {
    #[error("{0} is less than the least workable ExCache, {min}: with fewer lines a program evicts the pages it is using and makes no progress", min = Size(MIN_EXCACHE))]
    TooSmall(Size),
    #[error("{size} is more than this host's memory ({host}); the ExCache lives in the pComponent's memory")]
    MoreThanHost { size: Size, host: Size },
}

fn host_memory() -> Option<u64> {
    meminfo("MemTotal")
}

/// A `/proc/meminfo` entry in bytes.
fn meminfo(key: &str) -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    m.lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(':')?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kb| kb << 10)
}

/// The ExCache an embedded cluster gets when none is asked for: a program that fits in it
/// runs at about native speed (it is only a bound: lines take memory as the program touches
/// pages), so it is sized from this host, a quarter of the memory it has available, in a
/// power of two between [`FITTING_EXCACHE_MIN`] and [`FITTING_EXCACHE_MAX`]. The most is
/// what its bookkeeping allows to set up in about 0.1 s at start (about 10 MB a GiB).
pub fn fitting_excache() -> FittingExcache {
    let available = meminfo("MemAvailable");
    let quarter = available.map_or(FITTING_EXCACHE_MIN, |a| a / 4);
    let size = if quarter < FITTING_EXCACHE_MIN {
        FITTING_EXCACHE_MIN
    } else {
        (1u64 << quarter.ilog2()).min(FITTING_EXCACHE_MAX)
    };
    FittingExcache {
        size: Size(size),
        available: available.map(Size),
    }
}

pub const FITTING_EXCACHE_MIN: u64 = 64 << 20;
pub const FITTING_EXCACHE_MAX: u64 = 4 << 30;

/// The ExCache [`fitting_excache`] chose, and what from.
#[derive(Clone, Copy, Debug)]
pub struct FittingExcache {
    pub size: Size,
    /// The host's available memory; `None` where it cannot be read.
    pub available: Option<Size>,
}

impl std::fmt::Display for FittingExcache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.available {
            Some(a) => write!(
                f,
                "ExCache {}, sized for this host (a quarter of the {:.1}G it has available, from {} to {})",
                self.size,
                a.0 as f64 / (1u64 << 30) as f64,
                Size(FITTING_EXCACHE_MIN),
                Size(FITTING_EXCACHE_MAX)
            ),
            None => write!(f, "ExCache {} (this host's available memory cannot be read)", self.size),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_parse_their_names_only() {
        for n in HUGE_PAGES {
            assert_eq!(n.parse::<HugePages>().unwrap().to_string(), *n);
        }
        assert!("2m".parse::<HugePages>().unwrap_err().to_string().contains("off, on"));
        // Not LRU, which no policy is: refused, not taken for clock.
        assert!("lru"
            .parse::<EvictPolicy>()
            .unwrap_err()
            .to_string()
            .contains("unknown eviction \"lru\" (known: fifo, clock, ghost-clock, workingset)"));
        assert!("lfu"
            .parse::<EvictPolicy>()
            .unwrap_err()
            .to_string()
            .contains("fifo, clock"));
        assert_eq!("faulting".parse::<FaultCpu>(), Ok(FaultCpu::Faulting));
        assert_eq!(FaultCpu::Any.to_string(), "any");
        assert!("sometimes"
            .parse::<FaultCpu>()
            .unwrap_err()
            .to_string()
            .contains("any, faulting"));
    }

    #[test]
    fn an_evictor_takes_at_most_64_pages_on_either_side_of_a_victim() {
        let with = |evict_beside| {
            PcompConfig {
                evict_beside,
                ..PcompConfig::default()
            }
            .validate()
            .map_err(|e| e.to_string())
        };
        assert_eq!(PcompConfig::default().evict_beside, 15);
        assert!(with(0).is_ok());
        assert!(with(64).is_ok());
        assert!(with(65).unwrap_err().starts_with("evict_beside:"));
    }

    #[test]
    fn a_share_floor_is_at_most_an_equal_share() {
        let with = |share_floor| {
            PcompConfig {
                share_floor,
                ..PcompConfig::default()
            }
            .validate()
            .map_err(|e| e.to_string())
        };
        assert!(with(0).is_ok());
        assert!(with(100).is_ok());
        assert!(with(101).unwrap_err().starts_with("share_floor:"));
    }

    #[test]
    fn the_evictors_reserve_leaves_a_way_to_fill_in_every_set() {
        let with = |ways, excache, evict_reserve| {
            PcompConfig {
                ways,
                excache: Size(excache),
                evict_reserve,
                ..PcompConfig::default()
            }
            .validate()
            .map_err(|e| e.to_string())
        };
        let n = |n| EvictReserve(Some(n));
        assert!(with(8, 64 << 20, n(7)).is_ok());
        assert!(with(8, 64 << 20, n(8)).unwrap_err().starts_with("evict_reserve:"));
        // Fully associative: one set of every line.
        assert!(with(0, 256 << 10, n(63)).is_ok());
        assert!(with(0, 256 << 10, n(64)).is_err());
    }

    #[test]
    fn an_automatic_reserve_is_a_few_lines_of_a_fully_associative_excache_only() {
        let reserve = |ways, excache, dirty_tracking| {
            let c = PcompConfig {
                ways,
                excache: Size(excache),
                dirty_tracking,
                ..PcompConfig::default()
            };
            assert!(c.validate().is_ok());
            c.reserve_ways()
        };
        assert_eq!(reserve(0, 64 << 20, DirtyTracking::Fault), 128);
        assert_eq!(reserve(0, 4 << 20, DirtyTracking::Fault), 64);
        assert_eq!(reserve(0, 256 << 10, DirtyTracking::Fault), 4);
        assert_eq!(reserve(8, 64 << 20, DirtyTracking::Fault), 0);
        assert_eq!(reserve(0, 64 << 20, DirtyTracking::Scan), 0);
        let huge = PcompConfig {
            huge_pages: HugePages::On,
            ..PcompConfig::default()
        };
        assert_eq!(huge.reserve_ways(), 0);
        // A file says auto or a number; a number is taken as before auto existed.
        for (text, want) in [("\"auto\"", EvictReserve(None)), ("3", EvictReserve(Some(3)))] {
            let parsed: EvictReserve = toml::from_str::<toml::Table>(&format!("r = {text}")).unwrap()["r"]
                .clone()
                .try_into()
                .unwrap();
            assert_eq!(parsed, want);
        }
        assert!("some"
            .parse::<EvictReserve>()
            .unwrap_err()
            .to_string()
            .contains("evict_reserve"));
    }
}
