//! The home, owner and backup-home protocols under seeded faults: every mComponent's real
//! handlers over the tests' in-process cluster, driven by a schedule drawn from a seed of
//! what programs do (create, map, write, read, fork, exit) and what goes wrong (answers lost
//! and requests sent again, members lost and rebuilt, lost members back and fenced), with the
//! invariants checked after every step. A failing seed panics with the seed and its trace;
//! `SPLITOS_SIM_SEEDS` (how many) and `SPLITOS_SIM_FIRST` (from which) run others.
use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// mComponents of a simulated cluster; [`HOME`] holds layouts, the others pages.
const MEMBERS: u32 = 7;
/// At most this many members are lost in one run, never two before the first is rebuilt:
/// the replication's tolerance holds, so no acknowledged write may be lost.
const MOST_LOST: usize = 3;
const STEPS: usize = 80;

/// What the simulated programs wrote, by process: (vRegions mapped, round of each page).
#[derive(Clone, Default)]
struct Written {
    vregions: u64,
    pages: BTreeMap<u64, u8>,
}

struct Sim {
    rig: Rig,
    rng: StdRng,
    live: BTreeMap<u64, Written>,
    ended: Vec<u64>,
    lost: Vec<u32>,
    fenced: Vec<u32>,
    next_pid: u64,
    trace: Vec<String>,
    /// What happened, by kind: shows that the faults were drawn, not only the programs' steps.
    tally: BTreeMap<&'static str, u64>,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        Sim {
            rig: Rig::new(MEMBERS, Replication::Replica),
            rng: StdRng::seed_from_u64(seed),
            live: BTreeMap::new(),
            ended: Vec::new(),
            lost: Vec::new(),
            fenced: Vec::new(),
            next_pid: 1,
            trace: Vec::new(),
            tally: BTreeMap::new(),
        }
    }

    /// Answers of `msg` lost at random (one time in four): the pComponent's call then sends
    /// it again, as it does after a timeout.
    fn maybe_lose(&mut self, msg: &'static str) {
        if self.rng.random_ratio(1, 4) {
            self.note("answers lost", format!("  the answer to {msg} is lost"));
            self.rig.net.lose_replies(msg, 1);
        }
    }

    /// A pComponent's call to the home: sent again while its answer is lost.
    fn call_home<R: Request + Clone>(&self, req: R) -> Result<R::Reply, Refusal> {
        loop {
            match self.rig.call(HOME, req.clone()) {
                Err(e) if e.code == ErrCode::Unreachable => continue,
                r => return r,
            }
        }
    }

    /// Records step `what` in the trace, counted as `kind`.
    fn note(&mut self, kind: &'static str, what: String) {
        *self.tally.entry(kind).or_default() += 1;
        self.trace.push(what);
    }

    fn who(pid: u64) -> Who {
        Who::new("v", pid)
    }

    fn pick_live(&mut self) -> Option<u64> {
        let pids: Vec<u64> = self.live.keys().copied().collect();
        (!pids.is_empty()).then(|| pids[self.rng.random_range(0..pids.len())])
    }

    fn step(&mut self) -> Result<(), String> {
        match self.rng.random_range(0..100) {
            0..10 => self.create(),
            10..20 => self.map(),
            20..50 => self.write(),
            50..70 => self.read(),
            70..78 => self.fork(),
            78..86 => self.exit(),
            86..93 => self.lose(),
            _ => self.come_back_fenced(),
        }
    }

    fn create(&mut self) -> Result<(), String> {
        if self.live.len() >= 4 {
            return Ok(());
        }
        let pid = self.next_pid;
        self.next_pid += 1;
        self.note("creations", format!("create {pid}"));
        self.maybe_lose("P2M_PROC_CREATE");
        self.call_home(P2M_PROC_CREATE {
            who: Sim::who(pid),
            region_base: BASE,
            region_size: REGION,
            pcomp: 7,
            memory_quota: None,
        })
        .map_err(|e| format!("create {pid}: {e}"))?;
        self.live.insert(pid, Written::default());
        Ok(())
    }

    fn map(&mut self) -> Result<(), String> {
        let Some(pid) = self.pick_live() else { return Ok(()) };
        if self.live[&pid].vregions >= 3 {
            return Ok(());
        }
        self.note("mappings", format!("map a vRegion of {pid}"));
        let m = self
            .rig
            .mmap(HOME, &Sim::who(pid), VRS)
            .map_err(|e| format!("mmap of {pid}: {e}"))?;
        let w = self.live.get_mut(&pid).unwrap();
        if m.addr != BASE + w.vregions * VRS {
            return Err(format!("mmap of {pid} at {:#x}, not after its others", m.addr));
        }
        w.vregions += 1;
        Ok(())
    }

    /// A page of a mapped vRegion of `pid`, if it has one.
    fn some_page(&mut self, pid: u64) -> Option<u64> {
        let v = self.live[&pid].vregions;
        (v > 0).then(|| vpn(self.rng.random_range(0..v), self.rng.random_range(0..8)))
    }

    /// Sends `act` again after telling the home of each member that could not be reached,
    /// as the pComponent's page store does.
    fn to_members<T>(
        &mut self,
        pid: u64,
        vpn: u64,
        mut act: impl FnMut(&Rig) -> Result<T, Refusal>,
    ) -> Result<T, String> {
        for _ in 0..MEMBERS {
            match act(&self.rig) {
                Err(e) if e.code == ErrCode::Unreachable => {
                    let set = self.rig.set(HOME, &Sim::who(pid), vpn * PAGE / VRS);
                    let gone = set
                        .owners
                        .iter()
                        .find(|o| self.rig.net.down.lock().unwrap().contains(&o.id));
                    let Some(gone) = gone.map(|o| o.id) else {
                        return Err(format!("page {vpn:#x} of {pid}: {e}, with every member up"));
                    };
                    self.note("members reported lost", format!("  member {gone} is reported lost"));
                    self.rig
                        .call(
                            HOME,
                            P2M_REPLICA_LOST {
                                who: Sim::who(pid),
                                lost: gone,
                                vpn,
                            },
                        )
                        .map_err(|e| format!("report of member {gone}: {e}"))?;
                }
                r => return r.map_err(|e| format!("page {vpn:#x} of {pid}: {e}")),
            }
        }
        Err(format!("page {vpn:#x} of {pid}: every member reported lost"))
    }

    fn write(&mut self) -> Result<(), String> {
        let Some(pid) = self.pick_live() else { return Ok(()) };
        let Some(vpn) = self.some_page(pid) else { return Ok(()) };
        let round: u8 = self.rng.random_range(1..=250);
        self.note("writes", format!("write page {vpn:#x} of {pid}, round {round}"));
        self.maybe_lose("P2M_FLUSH");
        self.to_members(pid, vpn, |rig| loop {
            match rig.write(HOME, &Sim::who(pid), vpn, round) {
                // Its answer lost: a write back is sent again, whole.
                Err(e) if e.code == ErrCode::Unreachable && e.msg.contains("no reply") => continue,
                r => return r,
            }
        })?;
        self.live.get_mut(&pid).unwrap().pages.insert(vpn, round);
        Ok(())
    }

    fn read(&mut self) -> Result<(), String> {
        let Some(pid) = self.pick_live() else { return Ok(()) };
        let Some(vpn) = self.some_page(pid) else { return Ok(()) };
        self.note("reads", format!("read page {vpn:#x} of {pid}"));
        self.check_page(pid, vpn)
    }

    fn check_page(&mut self, pid: u64, vpn: u64) -> Result<(), String> {
        let want = match self.live[&pid].pages.get(&vpn) {
            Some(round) => content(vpn, *round),
            None => vec![0; PAGE_SIZE],
        };
        let got = self.to_members(pid, vpn, |rig| rig.read(HOME, &Sim::who(pid), vpn))?;
        if got != want {
            return Err(format!(
                "page {vpn:#x} of {pid} reads {:?}, written {:?}",
                &got[..4],
                &want[..4]
            ));
        }
        Ok(())
    }

    fn fork(&mut self) -> Result<(), String> {
        let Some(parent) = self.pick_live() else { return Ok(()) };
        if self.live.len() >= 4 {
            return Ok(());
        }
        let child = self.next_pid;
        self.next_pid += 1;
        self.note("forks", format!("fork {parent} into {child}"));
        self.maybe_lose("P2M_FORK");
        self.call_home(P2M_FORK {
            parent: Sim::who(parent),
            child,
        })
        .map_err(|e| format!("fork of {parent} into {child}: {e}"))?;
        let copy = self.live[&parent].clone();
        self.live.insert(child, copy);
        Ok(())
    }

    fn exit(&mut self) -> Result<(), String> {
        let Some(pid) = self.pick_live() else { return Ok(()) };
        self.note("exits", format!("exit {pid}"));
        self.maybe_lose("P2M_EXIT");
        match self.call_home(P2M_EXIT { who: Sim::who(pid) }) {
            // Sent again after its answer was lost: the first freed it.
            Ok(_) => {}
            Err(e) if e.code == ErrCode::NotHome => {}
            Err(e) => return Err(format!("exit of {pid}: {e}")),
        }
        self.live.remove(&pid);
        self.ended.push(pid);
        Ok(())
    }

    /// A member holding pages is lost (killed): the managers declare it so, and every home
    /// rebuilds its copies elsewhere. Only once the last loss is rebuilt.
    fn lose(&mut self) -> Result<(), String> {
        if self.lost.len() >= MOST_LOST {
            return Ok(());
        }
        let up: Vec<u32> = (2..=MEMBERS).filter(|id| !self.lost.contains(id)).collect();
        let id = up[self.rng.random_range(0..up.len())];
        self.note("members lost", format!("member {id} is lost"));
        self.lost.push(id);
        // Some of the programs' steps run before the managers declare it lost (they find it
        // unreachable and tell the home), and some before the homes' rebuilds run.
        self.rig.down(id);
        for _ in 0..self.rng.random_range(0..6) {
            self.step_programs()?;
        }
        self.trace.push("  the managers declare it lost".into());
        self.rig.declare_lost(&[id]);
        for _ in 0..self.rng.random_range(0..3) {
            self.step_programs()?;
        }
        self.trace.push("  the homes rebuild".into());
        self.rig.run_jobs();
        Ok(())
    }

    fn step_programs(&mut self) -> Result<(), String> {
        match self.rng.random_range(0..3) {
            0 => self.write(),
            1 => self.read(),
            _ => self.map(),
        }
    }

    /// A lost member goes on (it was paused, or cut off) and hears it was declared lost: it
    /// must drop everything, and it is never chosen again.
    fn come_back_fenced(&mut self) -> Result<(), String> {
        let Some(&id) = self.lost.iter().find(|id| !self.fenced.contains(id)) else {
            return Ok(());
        };
        self.note("members fenced", format!("member {id} goes on, and is fenced"));
        self.rig.net.down.lock().unwrap().remove(&id);
        self.rig.mem(id).fence();
        self.fenced.push(id);
        Ok(())
    }

    /// What must hold after every step.
    fn check(&mut self) -> Result<(), String> {
        let up: Vec<u32> = (1..=MEMBERS)
            .filter(|id| !self.rig.net.down.lock().unwrap().contains(id))
            .collect();
        for pid in self.live.keys() {
            let homes: Vec<u32> = up
                .iter()
                .copied()
                .filter(|id| self.rig.mem(*id).homes.lock().unwrap().contains_key(pid))
                .collect();
            if homes != [HOME] {
                return Err(format!("process {pid} has the homes {homes:?}"));
            }
            for set in self.rig.sets(HOME, &Sim::who(*pid)).owners {
                let mut ids = ids(&set);
                if let Some(gone) = ids.iter().find(|id| self.fenced.contains(id)) {
                    return Err(format!("vRegion {} of {pid} names fenced member {gone}", set.index));
                }
                ids.sort();
                ids.dedup();
                if ids.len() != set.owners.len() {
                    return Err(format!("vRegion {} of {pid} names a member twice: {set:?}", set.index));
                }
            }
        }
        for pid in &self.ended {
            for id in &up {
                let m = self.rig.mem(*id);
                if m.homes.lock().unwrap().contains_key(pid)
                    || m.owned.lock().unwrap().contains_key(pid)
                    || m.backups.lock().unwrap().contains_key(pid)
                {
                    return Err(format!("member {id} still holds process {pid}, which ended"));
                }
            }
        }
        for id in &self.fenced {
            let m = self.rig.mem(*id);
            let held = m.homes.lock().unwrap().len() + m.owned.lock().unwrap().len() + m.backups.lock().unwrap().len();
            if held > 0 {
                return Err(format!("fenced member {id} holds {held} processes"));
            }
        }
        // Every page written reads back, once the homes' rebuilds are done.
        self.rig.run_jobs();
        let pages: Vec<(u64, u64)> = self
            .live
            .iter()
            .flat_map(|(pid, w)| w.pages.keys().map(move |v| (*pid, *v)))
            .collect();
        for (pid, vpn) in pages {
            self.check_page(pid, vpn)?;
        }
        Ok(())
    }

    /// Runs the seed's steps; adds to `tally` what happened, by kind.
    fn run(mut self, seed: u64, tally: &mut BTreeMap<&'static str, u64>) {
        for _ in 0..STEPS {
            let done = self.step().and_then(|()| self.check());
            if let Err(e) = done {
                panic!(
                    "seed {seed} failed: {e}\ntrace:\n{}\nreplay: SPLITOS_SIM_FIRST={seed} SPLITOS_SIM_SEEDS=1",
                    self.trace.join("\n")
                );
            }
        }
        let unused: usize = self.rig.net.lost_replies.lock().unwrap().iter().map(|(_, n)| n).sum();
        *self.tally.entry("answers lost").or_default() -= unused as u64;
        let copied: u64 = self.rig.mems.values().map(|m| m.rebuilt_pages.load(Relaxed)).sum();
        *self.tally.entry("pages copied by rebuilds").or_default() += copied;
        for (kind, n) in self.tally {
            *tally.entry(kind).or_default() += n;
        }
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn seeded_faults_never_lose_an_acknowledged_write_nor_leave_two_homes_or_a_leak() {
    let (first, seeds) = (env("SPLITOS_SIM_FIRST", 0), env("SPLITOS_SIM_SEEDS", 300));
    let mut tally = BTreeMap::new();
    for seed in first..first + seeds {
        Sim::new(seed).run(seed, &mut tally);
    }
    println!("{seeds} seeds: {tally:?}");
    // The faults happened, not only the programs' steps.
    if seeds >= 100 {
        for kind in [
            "answers lost",
            "members lost",
            "members reported lost",
            "members fenced",
            "pages copied by rebuilds",
            "forks",
            "exits",
        ] {
            let n = tally.get(kind).copied().unwrap_or(0);
            assert!(n >= seeds / 10, "{kind}: {n} in {seeds} seeds: {tally:?}");
        }
    }
}
