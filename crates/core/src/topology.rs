//! The cluster as a graph, as ThymesisFlow's control plane keeps it: hosts, switches and
//! components are its nodes; what joins them are its links. Two kinds of links make the
//! structure paths run over (a component is `attached` to its host, hosts reach each other
//! through a `network` switch, or a rack's); a third, `uses`, is a link a component measured to
//! a component it talks to, with the latency and bandwidth it saw.
//!
//! The global managers build it from what components report (`Gm::topology`), serve it at
//! `GET /api/v1/topology`, and count hops on it for the `nearest` placement; the datacenter
//! simulator builds its racks on it and takes what a compute unit can reach from the same
//! path search.

use std::collections::{HashMap, VecDeque};

use serde::Serialize;
use splitos_rpc::{ComponentInfo, LinkSample, Role};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    Gm,
    Host,
    Switch,
    Pcomponent,
    Mcomponent,
    Scomponent,
    Ncomponent,
}

impl NodeKind {
    fn of(role: Role) -> NodeKind {
        match role {
            Role::Proc => NodeKind::Pcomponent,
            Role::Mem => NodeKind::Mcomponent,
            Role::Storage => NodeKind::Scomponent,
            Role::Net => NodeKind::Ncomponent,
            Role::Gm | Role::Admin => NodeKind::Gm,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LinkKind {
    /// A component on its host.
    Attached,
    /// A host on a switch.
    Network,
    /// Measured by the component at `from`, which uses the one at `to`; paths do not run
    /// over it (it is what a path carries).
    Uses,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Node {
    /// `host:ADDR`, `switch:NAME`, `component:ID` or `gm`.
    pub id: String,
    pub kind: NodeKind,
    pub label: String,
    /// The component's id, for a component.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub component: Option<u32>,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Link {
    pub from: String,
    pub to: String,
    pub kind: LinkKind,
    /// The shortest round trip of a small request, in microseconds (measured links).
    pub latency_us: Option<f64>,
    /// The rate a large reply arrived at, in megabits per second (measured links).
    pub bandwidth_mbps: Option<f64>,
    /// How long ago it was measured, in milliseconds (measured links).
    pub age_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct Graph {
    pub nodes: Vec<Node>,
    pub links: Vec<Link>,
    #[serde(skip)]
    index: HashMap<String, usize>,
    /// Per node, its neighbours over the links paths run on.
    #[serde(skip)]
    adjacent: Vec<Vec<usize>>,
}

pub fn component_id(id: u32) -> String {
    format!("component:{id}")
}

/// The host part of a component's address (`10.0.0.2:7000` → `10.0.0.2`): replicas go to
/// different hosts where the cluster has them, and the graph puts a component on its host.
pub fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

impl Graph {
    /// Adds a node, or returns the one with that id.
    pub fn node(&mut self, id: String, kind: NodeKind, label: String, component: Option<u32>) -> usize {
        if let Some(i) = self.index.get(&id) {
            return *i;
        }
        let i = self.nodes.len();
        self.index.insert(id.clone(), i);
        self.nodes.push(Node {
            id,
            kind,
            label,
            component,
        });
        self.adjacent.push(Vec::new());
        i
    }

    /// Joins nodes `a` and `b` by a structural link.
    pub fn join(&mut self, a: usize, b: usize, kind: LinkKind) {
        debug_assert!(kind != LinkKind::Uses);
        self.adjacent[a].push(b);
        self.adjacent[b].push(a);
        self.links.push(Link {
            from: self.nodes[a].id.clone(),
            to: self.nodes[b].id.clone(),
            kind,
            latency_us: None,
            bandwidth_mbps: None,
            age_ms: None,
        });
    }

    pub fn find(&self, id: &str) -> Option<usize> {
        self.index.get(id).copied()
    }

    /// The fewest hops from node `from` to each node (breadth-first over the structural
    /// links); `None` where there is no path.
    pub fn hops_from(&self, from: usize) -> Vec<Option<u32>> {
        let mut hops = vec![None; self.nodes.len()];
        hops[from] = Some(0);
        let mut queue = VecDeque::from([from]);
        while let Some(n) = queue.pop_front() {
            let next = hops[n].map(|h| h + 1);
            for &m in &self.adjacent[n] {
                if hops[m].is_none() {
                    hops[m] = next;
                    queue.push_back(m);
                }
            }
        }
        hops
    }

    /// The parts of the graph no path joins: per node, the number of its part, numbered in
    /// the order of their first nodes. One breadth-first pass over the whole graph, so that a
    /// simulated datacenter of millions of units takes time in proportion to its size.
    pub fn parts(&self) -> Vec<usize> {
        let mut part = vec![usize::MAX; self.nodes.len()];
        let mut parts = 0;
        let mut queue = VecDeque::new();
        for start in 0..self.nodes.len() {
            if part[start] != usize::MAX {
                continue;
            }
            part[start] = parts;
            queue.push_back(start);
            while let Some(n) = queue.pop_front() {
                for &m in &self.adjacent[n] {
                    if part[m] == usize::MAX {
                        part[m] = parts;
                        queue.push_back(m);
                    }
                }
            }
            parts += 1;
        }
        part
    }

    /// The cluster as the global managers know it: each component on the host of its
    /// address, the hosts on one switch when there are several, the managers on theirs, and
    /// the links components measured to the components they use (`samples`, by the measuring
    /// component's id; a link to a component no longer known is left out).
    pub fn cluster(gm_addr: &str, components: &[ComponentInfo], samples: &HashMap<u32, Vec<LinkSample>>) -> Graph {
        let mut g = Graph::default();
        let host = |g: &mut Graph, addr: &str| {
            let h = host_of(addr);
            g.node(format!("host:{h}"), NodeKind::Host, h.to_string(), None)
        };
        let gm = g.node("gm".into(), NodeKind::Gm, format!("global managers {gm_addr}"), None);
        let gm_host = host(&mut g, gm_addr);
        g.join(gm, gm_host, LinkKind::Attached);
        for c in components {
            let n = g.node(
                component_id(c.id),
                NodeKind::of(c.role),
                format!("{} {} {}", c.role.name(), c.id, c.addr),
                Some(c.id),
            );
            let h = host(&mut g, &c.addr);
            g.join(n, h, LinkKind::Attached);
        }
        let hosts: Vec<usize> = (0..g.nodes.len())
            .filter(|&i| g.nodes[i].kind == NodeKind::Host)
            .collect();
        if hosts.len() > 1 {
            let switch = g.node("switch:network".into(), NodeKind::Switch, "network".into(), None);
            for h in hosts {
                g.join(h, switch, LinkKind::Network);
            }
        }
        let mut measured: Vec<(&u32, &Vec<LinkSample>)> = samples.iter().collect();
        measured.sort_by_key(|(id, _)| **id);
        for (from, links) in measured {
            for s in links {
                let (a, b) = (component_id(*from), component_id(s.peer));
                if g.find(&a).is_some() && g.find(&b).is_some() {
                    g.links.push(Link {
                        from: a,
                        to: b,
                        kind: LinkKind::Uses,
                        latency_us: Some(s.rtt_ns as f64 / 1e3),
                        bandwidth_mbps: (s.bytes_per_s > 0).then(|| s.bytes_per_s as f64 * 8.0 / 1e6),
                        age_ms: Some(s.age_ms),
                    });
                }
            }
        }
        g
    }

    /// A datacenter of racks for the simulator: compute units and memory modules spread in
    /// order over `racks` (as `rack_of` spreads them), each on its rack's switch, and no path
    /// between racks. Compute unit `c` is node `c`, memory module `j` node `compute + j`; they
    /// have no labels, which would cost memory at millions of units.
    pub fn racks(compute: usize, memory: usize, racks: usize, rack_of: impl Fn(usize, usize, usize) -> usize) -> Graph {
        let mut g = Graph::default();
        for c in 0..compute {
            g.node(format!("compute:{c}"), NodeKind::Pcomponent, String::new(), None);
        }
        for j in 0..memory {
            g.node(format!("memory:{j}"), NodeKind::Mcomponent, String::new(), None);
        }
        let switches: Vec<usize> = (0..racks)
            .map(|r| g.node(format!("switch:rack{r}"), NodeKind::Switch, format!("rack {r}"), None))
            .collect();
        for c in 0..compute {
            g.join(c, switches[rack_of(c, compute, racks)], LinkKind::Network);
        }
        for j in 0..memory {
            g.join(compute + j, switches[rack_of(j, memory, racks)], LinkKind::Network);
        }
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitos_rpc::Load;

    fn comp(id: u32, role: Role, addr: &str) -> ComponentInfo {
        ComponentInfo {
            id,
            role,
            addr: addr.into(),
            shim_sock: None,
            nics: Vec::new(),
            load: Load::default(),
            alive: true,
            since_heartbeat_ms: 0,
            lost: false,
            metrics: None,
            cordoned: false,
            leaving: None,
        }
    }

    #[test]
    fn components_of_one_host_are_two_hops_apart_and_of_two_hosts_four() {
        let comps = [
            comp(1, Role::Proc, "10.0.0.1:7000"),
            comp(2, Role::Mem, "10.0.0.1:7001"),
            comp(3, Role::Mem, "10.0.0.2:7000"),
        ];
        let samples = HashMap::from([(
            1,
            vec![
                LinkSample {
                    peer: 2,
                    rtt_ns: 20_000,
                    bytes_per_s: 1_000_000_000,
                    age_ms: 5,
                },
                LinkSample {
                    peer: 99,
                    ..Default::default()
                },
            ],
        )]);
        let g = Graph::cluster("10.0.0.1:5000", &comps, &samples);
        let hops = g.hops_from(g.find("component:1").unwrap());
        assert_eq!(hops[g.find("component:2").unwrap()], Some(2));
        assert_eq!(hops[g.find("component:3").unwrap()], Some(4));
        assert_eq!(hops[g.find("gm").unwrap()], Some(2));
        let used: Vec<&Link> = g.links.iter().filter(|l| l.kind == LinkKind::Uses).collect();
        assert_eq!(used.len(), 1, "a link to an unknown component is left out");
        assert_eq!((used[0].latency_us, used[0].bandwidth_mbps), (Some(20.0), Some(8000.0)));
        // A switch joins hosts only when there are several.
        let one = Graph::cluster("10.0.0.1:5000", &comps[..2], &samples);
        assert!(one.find("switch:network").is_none(), "one host needs no switch");
    }

    #[test]
    fn racks_are_parts_no_path_joins() {
        let rack_of = |i: usize, n: usize, racks: usize| i * racks / n;
        let g = Graph::racks(4, 6, 2, rack_of);
        let parts = g.parts();
        assert_eq!(&parts[..4], &[0, 0, 1, 1]);
        assert_eq!(&parts[4..10], &[0, 0, 0, 1, 1, 1]);
        let hops = g.hops_from(0);
        assert_eq!(
            hops[4],
            Some(2),
            "compute to memory of its rack: through the rack's switch"
        );
        assert_eq!(hops[9], None, "no path to another rack");
    }
}
