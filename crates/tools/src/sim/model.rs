//! The datacenter models a trace is replayed against, built from the same node list so that
//! they have the same total CPU and memory:
//!
//! * `fixed`: the servers as they are; a task's CPU and memory come from one server.
//! * `disaggregated` (ThymesisFlow): one compute module per server with its CPU, and as many
//!   memory modules sharing the total memory evenly; a task's CPU comes from one compute
//!   module and its memory from memory modules it can reach, in one piece where one fits.
//! * `splitos` (LegoOS): one pComponent per server with its CPU and an ExCache share of its
//!   memory, and mComponents sharing the rest; a task takes its CPU and the ExCache share of
//!   its memory on one pComponent, and all its memory, in vRegions, from mComponents it can
//!   reach.
//!
//! What a compute unit can reach is the topology: a unit has a number of links, one per
//! memory module it uses (ThymesisFlow's 16 transceivers), and/or units are in racks and reach
//! only memory modules of their own rack. The racks are the topology graph the global
//! managers keep (`splitos_core::topology`): each unit on its rack's switch, and the memory a unit
//! reaches is what a path search finds from it (every module of its rack, two hops away, so
//! that `nearest` would order them as least-loaded does).

use super::placement;
use super::pool::{Amount, Pool, CPU, LINKS, MEM};
use super::trace::Node;
use splitos_core::config::PlacementPolicy;

/// Why the simulator's models, topology, placement or window, as its command line gives
/// them, are not ones it can run.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("unknown model `{0}` (one of: {models})", models = MODELS.join(", "))]
    UnknownModel(String),
    #[error("topology `{0}`: expected links:N or racks:N")]
    NotAConstraint(String),
    #[error("topology `{part}`: `{value}` is not a positive number")]
    NotPositive { part: String, value: String },
    #[error("topology `{0}`: too many links")]
    TooManyLinks(String),
    #[error("topology `{part}`: unknown constraint `{key}` (links or racks)")]
    UnknownConstraint { part: String, key: String },
    #[error(
        "topology racks:{racks}: more racks than compute units ({units}), memory modules ({modules}) or {MAX_RACKS}"
    )]
    TooManyRacks { racks: usize, units: usize, modules: usize },
    #[error("placement `{0}` orders units by hops on the global managers' topology graph, which the simulator has not (one of: {known}; --topology racks:N keeps memory in its rack)", known = super::placement::PLACEMENTS.map(|p| p.to_string()).join(", "))]
    Placement(PlacementPolicy),
    #[error("expected START:END (seconds; either may be left out)")]
    NotAWindow,
    #[error("`{0}` is not a number of seconds")]
    NotSeconds(String),
    #[error("the window's start {start} is not before its end {end}")]
    EmptyWindow { start: f64, end: f64 },
}

pub const MODELS: [&str; 3] = ["fixed", "disaggregated", "splitos"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Fixed,
    Disaggregated,
    Splitos,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Fixed => "fixed",
            Kind::Disaggregated => "disaggregated",
            Kind::Splitos => "splitos",
        }
    }

    pub fn parse(s: &str) -> Result<Kind, SpecError> {
        match s {
            "fixed" => Ok(Kind::Fixed),
            "disaggregated" => Ok(Kind::Disaggregated),
            "splitos" => Ok(Kind::Splitos),
            other => Err(SpecError::UnknownModel(other.to_string())),
        }
    }
}

/// Which memory modules a compute unit may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Topology {
    /// Memory modules a compute unit, and compute units a memory module, can use at once.
    pub links: Option<u32>,
    /// Racks the units are spread over, in order; memory stays within a rack.
    pub racks: Option<usize>,
}

impl std::str::FromStr for Topology {
    type Err = SpecError;
    /// `links:N`, `racks:N`, both (`links:16,racks:8`), or `none`.
    fn from_str(s: &str) -> Result<Topology, SpecError> {
        let mut t = Topology::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty() && *p != "none") {
            let (k, v) = part
                .split_once(':')
                .ok_or_else(|| SpecError::NotAConstraint(part.to_string()))?;
            let n: u64 = v
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| SpecError::NotPositive {
                    part: part.to_string(),
                    value: v.to_string(),
                })?;
            match k {
                "links" => t.links = Some(u32::try_from(n).map_err(|_| SpecError::TooManyLinks(part.to_string()))?),
                "racks" => t.racks = Some(n as usize),
                other => {
                    return Err(SpecError::UnknownConstraint {
                        part: part.to_string(),
                        key: other.to_string(),
                    })
                }
            }
        }
        Ok(t)
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match (self.links, self.racks) {
            (None, None) => write!(f, "none"),
            (Some(l), None) => write!(f, "links:{l}"),
            (None, Some(r)) => write!(f, "racks:{r}"),
            (Some(l), Some(r)) => write!(f, "links:{l},racks:{r}"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Spec {
    pub kind: Kind,
    pub topology: Topology,
    /// splitos: the part of a pComponent's memory that is ExCache, and of a task's memory
    /// that it keeps there.
    pub excache_share: f64,
    /// splitos: the unit GMM places memory in (MiB).
    pub vregion_mib: u64,
    /// Memory modules of the disaggregated models (0: one per node).
    pub memory_modules: usize,
}

/// Where a running task's resources are.
pub struct Alloc {
    pub compute: u32,
    pub cpu: u64,
    pub local: u64,
    /// (memory module, MiB): one entry per module.
    pub pieces: Vec<(u32, u64)>,
}

/// How many compute units a placement tries per rack before the task waits, when the unit
/// the policy chose cannot reach enough memory.
const TRIES: usize = 4;

pub struct Model {
    pub spec: Spec,
    pub compute: Pool,
    pub memory: Option<Pool>,
    /// Per compute unit: memory modules it has a link to, and the tasks using each.
    links: Vec<Vec<(u32, u32)>>,
    allocs: Vec<Option<Alloc>>,
    /// The distinct (CPU, memory) capacities of the compute units.
    shapes: Vec<[u64; 2]>,
    /// The most memory modules in a rack.
    rack_modules: usize,
    /// The rack of each compute unit: the part of the topology graph it is in.
    compute_rack: Vec<usize>,
}

/// What a task asks of one model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Need {
    pub cpu: u64,
    /// Memory on its compute unit.
    pub local: u64,
    /// Memory on memory modules.
    pub remote: u64,
}

/// The most racks a model may have: a placement looks at each rack's memory.
const MAX_RACKS: usize = 4096;

/// The rack of unit `i` of `n` spread in order over `racks`.
fn rack_of(i: usize, n: usize, racks: usize) -> usize {
    (i as u128 * racks as u128 / n as u128) as usize
}

/// The ExCache share of `mem` MiB, rounded up alike for a pComponent and for a task, so that
/// a task as large as its server fits.
fn excache(mem: u64, share: f64) -> u64 {
    (mem as f64 * share).ceil() as u64
}

impl Model {
    pub fn new(spec: Spec, nodes: &[Node], tasks: usize, placement: PlacementPolicy) -> Result<Model, SpecError> {
        let links = spec.topology.links.map_or(0, u64::from);
        let total_mem: u64 = nodes.iter().map(|n| n.mem).sum();
        let share = |mem: u64| match spec.kind {
            Kind::Fixed => mem,
            Kind::Disaggregated => 0,
            Kind::Splitos => excache(mem, spec.excache_share),
        };
        let caps: Vec<Amount> = nodes
            .iter()
            .map(|n| [n.cpu, share(n.mem), if spec.kind == Kind::Fixed { 0 } else { links }])
            .collect();
        let local_total: u64 = caps.iter().map(|c| c[MEM]).sum();
        let racks = spec.topology.racks.unwrap_or(1);
        let m = if spec.memory_modules == 0 {
            nodes.len()
        } else {
            spec.memory_modules
        };
        if spec.kind != Kind::Fixed && racks > nodes.len().min(m).min(MAX_RACKS) {
            return Err(SpecError::TooManyRacks {
                racks,
                units: nodes.len(),
                modules: m,
            });
        }
        let n = nodes.len();
        let part = splitos_core::topology::Graph::racks(n, m, racks, rack_of).parts();
        let memory = (spec.kind != Kind::Fixed).then(|| {
            let rest = total_mem - local_total;
            let caps = (0..m as u64)
                .map(|i| [0, rest / m as u64 + u64::from(i < rest % m as u64), links])
                .collect();
            placement::rule(placement).map(|p| Pool::new(caps, racks, |j| part[n + j], p))
        });
        let memory = memory.transpose()?;
        let shapes = caps
            .iter()
            .map(|c| [c[CPU], c[MEM]])
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let compute = Pool::new(caps, racks, |c| part[c], placement::rule(placement)?);
        let mut per_rack = vec![0usize; racks];
        (0..m).for_each(|j| per_rack[part[n + j]] += 1);
        let rack_modules = per_rack.into_iter().max().unwrap_or(0);
        Ok(Model {
            links: vec![Vec::new(); compute.units()],
            spec,
            compute,
            memory,
            allocs: (0..tasks).map(|_| None).collect(),
            shapes,
            rack_modules,
            compute_rack: part[..n].to_vec(),
        })
    }

    pub fn name(&self) -> &'static str {
        self.spec.kind.name()
    }

    pub fn need(&self, cpu: u64, mem: u64) -> Need {
        match self.spec.kind {
            Kind::Fixed => Need {
                cpu,
                local: mem,
                remote: 0,
            },
            Kind::Disaggregated => Need {
                cpu,
                local: 0,
                remote: mem,
            },
            Kind::Splitos => Need {
                cpu,
                local: excache(mem, self.spec.excache_share),
                remote: mem,
            },
        }
    }

    /// Why a task could never be placed, even on an empty cluster: the field at fault
    /// (`cpu` or `mem`) and the reason.
    pub fn oversized(&self, need: &Need) -> Option<(&'static str, String)> {
        if !self.shapes.iter().any(|s| s[0] >= need.cpu && s[1] >= need.local) {
            let what = match self.spec.kind {
                Kind::Fixed => "server",
                Kind::Disaggregated => "compute module",
                Kind::Splitos => "pComponent (CPU and ExCache share)",
            };
            let field = if self.shapes.iter().any(|s| s[0] >= need.cpu) {
                "mem"
            } else {
                "cpu"
            };
            return Some((
                field,
                format!(
                    "needs {} milli-cores and {} MiB on one {what}, more than any has",
                    need.cpu, need.local
                ),
            ));
        }
        let mem = self.memory.as_ref()?;
        let module = (0..mem.units()).map(|u| mem.cap(u)[MEM]).max().unwrap_or(0);
        let reach = self
            .rack_modules
            .min(self.spec.topology.links.map_or(usize::MAX, |l| l as usize)) as u64
            * module;
        if need.remote > reach {
            return Some((
                "mem",
                format!(
                    "needs {} MiB of memory modules, more than a compute unit can reach ({reach} MiB)",
                    need.remote
                ),
            ));
        }
        let vregion = need.remote.min(self.spec.vregion_mib);
        if self.spec.kind == Kind::Splitos && vregion > module {
            return Some((
                "mem",
                format!("needs vRegions of {vregion} MiB, larger than an mComponent ({module} MiB)"),
            ));
        }
        None
    }

    fn racks(&self) -> usize {
        self.spec.topology.racks.unwrap_or(1)
    }

    /// The rack (part of both pools) compute unit `c` is in.
    fn rack(&self, c: usize) -> usize {
        self.compute_rack[c]
    }

    /// Places task `id`; false if there is no room for it now. Only racks whose memory
    /// modules have room for a first piece of the task are searched, all together in the
    /// policy's order. The policy's choice of compute unit may have used up its links
    /// (packing policies choose the busiest): the next tries ask for a unit with the links
    /// the task needs free.
    pub fn place(&mut self, id: usize, need: Need) -> bool {
        let take: Amount = [need.cpu, need.local, 0];
        let (links_needed, racks) = match &self.memory {
            Some(mem) if need.remote > 0 => {
                let links = self.spec.topology.links.map_or(0, |l| {
                    need.remote.div_ceil(mem.cap(0)[MEM].max(1)).clamp(1, u64::from(l))
                });
                let first = need.remote.min(if self.spec.kind == Kind::Splitos {
                    self.spec.vregion_mib
                } else {
                    1
                });
                (
                    links,
                    (0..self.racks())
                        .filter(|&k| mem.search(&[0, first, 0], [k], &[]).is_some())
                        .collect(),
                )
            }
            _ => (0, (0..self.racks()).collect::<Vec<_>>()),
        };
        let mut tried = Vec::new();
        for attempt in 0..TRIES * racks.len() {
            let want = if attempt == 0 {
                take
            } else {
                [need.cpu, need.local, links_needed]
            };
            let Some(c) = self.compute.search(&want, racks.iter().copied(), &tried) else {
                return false;
            };
            let pieces = if need.remote == 0 {
                Some(Vec::new())
            } else {
                self.place_memory(c, need.remote)
            };
            match pieces {
                Some(pieces) => {
                    self.compute.take(c, &take, true);
                    self.allocs[id] = Some(Alloc {
                        compute: c as u32,
                        cpu: need.cpu,
                        local: need.local,
                        pieces,
                    });
                    return true;
                }
                None => tried.push(c),
            }
        }
        false
    }

    /// Takes `amount` MiB of memory modules reachable from compute unit `c`. A packing
    /// policy puts all of it on the module it prefers among those with room for all of it;
    /// a spreading one (GMM) places each vRegion on its own. When no module has room for the
    /// rest, it goes in parts of at least the rest over the links `c` has left, in whole
    /// vRegions (MiB in the disaggregated model), each on the module the policy prefers.
    fn place_memory(&mut self, c: usize, amount: u64) -> Option<Vec<(u32, u64)>> {
        let unit = if self.spec.kind == Kind::Splitos {
            self.spec.vregion_mib
        } else {
            1
        };
        let packs = self.compute.policy().packs();
        let per_vregion = self.spec.kind == Kind::Splitos && !packs;
        let mut pieces: Vec<(u32, u64)> = Vec::new();
        let mut left = amount;
        while left > 0 {
            let want = if per_vregion { left.min(unit) } else { left };
            let chosen = self.pick_memory(c, want).map(|m| (m, want)).or_else(|| {
                let links = match self.spec.topology.links {
                    Some(_) => self.compute.free(c)[LINKS].max(1),
                    None => u64::MAX,
                };
                let part = left.div_ceil(links).div_ceil(unit).saturating_mul(unit).min(left);
                // No module has room for all of the rest (else the first choice had found
                // it), so this takes whole vRegions, at least one.
                let m = self.pick_memory(c, part)?;
                Some((m, self.memory.as_ref()?.free(m)[MEM] / unit * unit))
            });
            let Some((m, got)) = chosen else {
                self.free_memory(c, &pieces);
                return None;
            };
            self.take_memory(c, m, got, &mut pieces);
            left -= got;
        }
        Some(pieces)
    }

    /// The memory module the policy prefers for `want` MiB among those `c` can reach: those
    /// it has a link to and, if it has a link free, those with a link free. A packing policy
    /// takes a module it has a link to whenever one has room, so that links last.
    fn pick_memory(&self, c: usize, want: u64) -> Option<usize> {
        let mem = self.memory.as_ref()?;
        let linked = self.links[c]
            .iter()
            .map(|(m, _)| *m as usize)
            .filter(|&m| mem.fits(m, &[0, want, 0]))
            .min_by_key(|&m| mem.rank(m));
        if linked.is_some() && mem.policy().packs() {
            return linked;
        }
        let other = match self.spec.topology.links {
            None => mem.search(&[0, want, 0], [self.rack(c)], &[]),
            Some(_) if self.compute.free(c)[LINKS] > 0 => mem.search(&[0, want, 1], [self.rack(c)], &[]),
            Some(_) => None,
        };
        [linked, other].into_iter().flatten().min_by_key(|&m| mem.rank(m))
    }

    fn take_memory(&mut self, c: usize, m: usize, amount: u64, pieces: &mut Vec<(u32, u64)>) {
        let limited = self.spec.topology.links.is_some();
        let mem = self.memory.as_mut().expect("a model with memory modules");
        match pieces.iter_mut().find(|(u, _)| *u as usize == m) {
            Some(p) => {
                mem.take(m, &[0, amount, 0], false);
                p.1 += amount;
            }
            None => {
                let link = self.links[c].iter_mut().find(|(u, _)| *u as usize == m);
                let new_link = link.is_none();
                match link {
                    Some(l) => l.1 += 1,
                    None => self.links[c].push((m as u32, 1)),
                }
                let l = u64::from(new_link && limited);
                mem.take(m, &[0, amount, l], true);
                if l > 0 {
                    self.compute.take(c, &[0, 0, 1], false);
                }
                pieces.push((m as u32, amount));
            }
        }
    }

    fn free_memory(&mut self, c: usize, pieces: &[(u32, u64)]) {
        let limited = self.spec.topology.links.is_some();
        for &(m, amount) in pieces {
            let i = self.links[c]
                .iter()
                .position(|(u, _)| *u == m)
                .expect("a piece has its link");
            self.links[c][i].1 -= 1;
            let last = self.links[c][i].1 == 0;
            if last {
                self.links[c].swap_remove(i);
            }
            let l = u64::from(last && limited);
            self.memory
                .as_mut()
                .expect("a model with memory modules")
                .give(m as usize, &[0, amount, l], true);
            if l > 0 {
                self.compute.give(c, &[0, 0, 1], false);
            }
        }
    }

    /// Ends task `id`, which must be running.
    pub fn release(&mut self, id: usize) {
        let a = self.allocs[id].take().expect("a release matches an allocation");
        self.free_memory(a.compute as usize, &a.pieces);
        self.compute.give(a.compute as usize, &[a.cpu, a.local, 0], true);
    }

    /// Units that hold anything: an allocation, resources taken, or a link.
    pub fn busy_units(&self) -> usize {
        let busy = |p: &Pool| (0..p.units()).filter(|&u| p.holds(u) || p.free(u) != p.cap(u)).count();
        busy(&self.compute) + self.memory.as_ref().map_or(0, busy) + self.links.iter().filter(|l| !l.is_empty()).count()
    }

    /// Where running task `id` is.
    pub fn allocation(&self, id: usize) -> Option<&Alloc> {
        self.allocs[id].as_ref()
    }

    /// The model's state now.
    pub fn gauges(&self) -> Gauges {
        let c = &self.compute;
        let used = |p: &Pool, r: usize| p.total(r) - p.free_total(r);
        let (m_on, m_len, m_free_on, m_total, m_used) = match &self.memory {
            Some(m) => (m.on(), m.units(), m.free_on(MEM), m.total(MEM), used(m, MEM)),
            None => (c.on(), c.units(), 0, 0, 0),
        };
        let total_cpu = c.total(CPU) as f64;
        let total_mem = (c.total(MEM) + m_total) as f64;
        Gauges {
            fractions: Fractions {
                fragmentation_cpu: c.free_on(CPU) as f64 / total_cpu,
                fragmentation_mem: (c.free_on(MEM) + m_free_on) as f64 / total_mem,
                switched_off_compute: (c.units() - c.on()) as f64 / c.units() as f64,
                switched_off_memory: (m_len - m_on) as f64 / m_len as f64,
                utilization_cpu: used(c, CPU) as f64 / total_cpu,
                utilization_mem: (used(c, MEM) + m_used) as f64 / total_mem,
            },
            compute_on: c.on(),
            memory_on: m_on,
            remote_mem: m_used as f64,
        }
    }
}

/// The fractions a model is measured by (docs/simulation.md).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Fractions {
    pub fragmentation_cpu: f64,
    pub fragmentation_mem: f64,
    pub switched_off_compute: f64,
    pub switched_off_memory: f64,
    pub utilization_cpu: f64,
    pub utilization_mem: f64,
}

impl Fractions {
    pub fn to_array(self) -> [f64; 6] {
        [
            self.fragmentation_cpu,
            self.fragmentation_mem,
            self.switched_off_compute,
            self.switched_off_memory,
            self.utilization_cpu,
            self.utilization_mem,
        ]
    }

    pub fn from_array(a: [f64; 6]) -> Fractions {
        Fractions {
            fragmentation_cpu: a[0],
            fragmentation_mem: a[1],
            switched_off_compute: a[2],
            switched_off_memory: a[3],
            utilization_cpu: a[4],
            utilization_mem: a[5],
        }
    }
}

/// A model's state at one time.
#[derive(Clone, Copy, Debug)]
pub struct Gauges {
    pub fractions: Fractions,
    pub compute_on: usize,
    pub memory_on: usize,
    /// MiB on memory modules.
    pub remote_mem: f64,
}
