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

/// A simulated program's process as its pComponent knows it: its home and backup home as
/// last answered, the vRegions it mapped and the round it last wrote in each page.
#[derive(Clone)]
struct Written {
    home: u32,
    backup: Option<u32>,
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

    fn home(&self, pid: u64) -> u32 {
        self.live[&pid].home
    }

    fn is_down(&self, id: u32) -> bool {
        self.rig.net.down.lock().unwrap().contains(&id)
    }

    /// A pComponent's call to `to`: sent again while its answer is lost.
    fn call_again<R: Request + Clone>(&self, to: u32, req: &R) -> Result<R::Reply, Refusal> {
        loop {
            match self.rig.call(to, req.clone()) {
                Err(e) if e.msg.contains("no reply") => continue,
                r => return r,
            }
        }
    }

    /// A pComponent's call to the home of `pid`: sent again while its answer is lost, and to
    /// the backup, made the home, when the home cannot be reached or no longer is the home.
    fn call_home<R: Request + Clone>(&mut self, pid: u64, req: R) -> Result<R::Reply, String> {
        for _ in 0..MEMBERS {
            match self.call_again(self.home(pid), &req) {
                Err(e) if matches!(e.code, ErrCode::Unreachable | ErrCode::NotHome) => self.take_over(pid)?,
                r => return r.map_err(|e| e.to_string()),
            }
        }
        Err(format!("no home of {pid} answers"))
    }

    /// The home of `pid` cannot be reached (or is no longer its home): its backup takes over,
    /// as the pComponent asks it to (`P2M_HOME_TAKEOVER`).
    fn take_over(&mut self, pid: u64) -> Result<(), String> {
        self.hear();
        if !self.is_down(self.home(pid)) && self.rig.mem(self.home(pid)).homes.lock().unwrap().contains_key(&pid) {
            return Ok(());
        }
        let (home, backup) = (self.home(pid), self.live[&pid].backup);
        let backup = backup.ok_or_else(|| format!("the home {home} of {pid} is gone and it has no backup"))?;
        self.note(
            "takeovers asked",
            format!("  the backup {backup} of {pid} is asked to take over from {home}"),
        );
        let r = self
            .rig
            .call(
                backup,
                P2M_HOME_TAKEOVER {
                    who: Sim::who(pid),
                    lost: home,
                },
            )
            .map_err(|e| format!("takeover of {pid} by {backup}: {e}"))?;
        let w = self.live.get_mut(&pid).unwrap();
        (w.home, w.backup) = (backup, r.backup.map(|b| b.id));
        Ok(())
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

    /// What the mComponents told the pComponent meanwhile: a process's home moved (its
    /// backup took over on the managers' word). As the pComponent does, only a move from the
    /// home it knows counts.
    fn hear(&mut self) {
        let told = std::mem::take(&mut *self.rig.net.pcomp_inbox.lock().unwrap());
        for msg in told {
            let Msg::M2P_HOME_MOVED(m) = msg else { continue };
            if let Some(w) = self.live.get_mut(&m.who.pid).filter(|w| w.home == m.from) {
                (w.home, w.backup) = (m.home.id, m.backup.map(|b| b.id));
                *self.tally.entry("moves told").or_default() += 1;
                self.trace
                    .push(format!("  told: {} moved from {} to {}", m.who.pid, m.from, m.home.id));
            }
        }
    }

    /// The managers' heartbeat answer to every member up: the members lost and not come
    /// back (fenced) since, as the real managers name them until they register again.
    fn beat(&self) {
        let lost: Vec<u32> = self
            .lost
            .iter()
            .copied()
            .filter(|id| !self.fenced.contains(id))
            .collect();
        for (id, m) in &self.rig.mems {
            if !self.is_down(*id) {
                m.on_beat(lost_beat(lost.clone()));
            }
        }
    }

    fn step(&mut self) -> Result<(), String> {
        self.beat();
        self.hear();
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

    /// The id of a new process, unless four live already.
    fn fresh_pid(&mut self) -> Option<u64> {
        (self.live.len() < 4).then(|| {
            self.next_pid += 1;
            self.next_pid - 1
        })
    }

    fn create(&mut self) -> Result<(), String> {
        let Some(pid) = self.fresh_pid() else { return Ok(()) };
        self.note("creations", format!("create {pid}"));
        self.maybe_lose("P2M_PROC_CREATE");
        // The managers' pick: a member neither lost nor down.
        let home = (1..=MEMBERS).find(|id| !self.lost.contains(id)).expect("a member left");
        let creation = |attempt| P2M_PROC_CREATE {
            who: Sim::who(pid),
            region_base: BASE,
            region_size: REGION,
            pcomp: 7,
            memory_quota: None,
            attempt,
        };
        // The pComponent gave the first creation up (the home did not answer in time) and
        // undid it, and the managers picked the same home again: the first, made or still on
        // its way, must not make a second home or end the one the second made.
        let undo = P2M_CREATE_UNDO {
            who: Sim::who(pid),
            attempt: 0,
        };
        let given_up = self.rng.random_ratio(1, 8);
        let (made_first, undo_first, late_first) = (
            self.rng.random_bool(0.5),
            self.rng.random_bool(0.5),
            self.rng.random_bool(0.5),
        );
        if given_up {
            self.note(
                "creations given up",
                format!("  creation 0 of {pid} given up (made first: {made_first}, undone before creation 1: {undo_first}, come late: {late_first})"),
            );
            if made_first {
                let _ = self.rig.call(home, creation(0));
            }
        }
        if given_up && undo_first {
            self.call_again(home, &undo)
                .map_err(|e| format!("undo creation 0 of {pid} at {home}: {e}"))?;
            if late_first {
                match self.call_again(home, &creation(0)) {
                    Err(e) if e.code == ErrCode::Denied => {}
                    r => return Err(format!("creation 0 of {pid}, come after its undo, answered {r:?}")),
                }
            }
        }
        let created = self
            .call_again(home, &creation(u32::from(given_up)))
            .map_err(|e| format!("create {pid} at {home}: {e}"))?;
        if given_up && !undo_first {
            // The undo, sent from a thread of its own, comes after creation 1 was answered:
            // it must not end the process, nor may creation 0 come late make another.
            self.call_again(home, &undo)
                .map_err(|e| format!("undo creation 0 of {pid} at {home}: {e}"))?;
            if late_first {
                let _ = self.call_again(home, &creation(0));
            }
        }
        let w = Written {
            home,
            backup: created.backup.map(|b| b.id),
            vregions: 0,
            pages: BTreeMap::new(),
        };
        self.live.insert(pid, w);
        Ok(())
    }

    fn map(&mut self) -> Result<(), String> {
        let Some(pid) = self.pick_live() else { return Ok(()) };
        if self.live[&pid].vregions >= 3 {
            return Ok(());
        }
        self.note("mappings", format!("map a vRegion of {pid}"));
        let m = self.call_home(
            pid,
            P2M_MMAP {
                who: Sim::who(pid),
                hint: 0,
                len: VRS,
                prot: 3,
                fixed: false,
                noreserve: false,
            },
        )?;
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
    fn through_members<T>(
        &mut self,
        pid: u64,
        vpn: u64,
        mut act: impl FnMut(&Rig, u32) -> Result<T, Refusal>,
    ) -> Result<T, String> {
        for _ in 0..2 * MEMBERS {
            let home = self.home(pid);
            // The tests' page calls take the home's answers for granted: one that would not
            // answer (down, or no longer the home) makes the pComponent's first call fail, and
            // the backup take over.
            if self.is_down(home) || !self.rig.mem(home).homes.lock().unwrap().contains_key(&pid) {
                self.take_over(pid)?;
                continue;
            }
            match act(&self.rig, home) {
                Err(e) if self.is_down(home) || e.code == ErrCode::NotHome => self.take_over(pid)?,
                Err(e) if e.code == ErrCode::Unreachable => {
                    let set = self.rig.set(home, &Sim::who(pid), vpn * PAGE / VRS);
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
                            home,
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
        self.through_members(pid, vpn, |rig, home| loop {
            match rig.write(home, &Sim::who(pid), vpn, round) {
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
        let got = self.through_members(pid, vpn, |rig, home| rig.read(home, &Sim::who(pid), vpn))?;
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
        let Some(child) = self.fresh_pid() else { return Ok(()) };
        self.note("forks", format!("fork {parent} into {child}"));
        self.maybe_lose("P2M_FORK");
        let forked = self
            .call_home(
                parent,
                P2M_FORK {
                    parent: Sim::who(parent),
                    child,
                },
            )
            .map_err(|e| format!("fork of {parent} into {child}: {e}"))?;
        let mut copy = self.live[&parent].clone();
        copy.backup = forked.backup.map(|b| b.id);
        self.live.insert(child, copy);
        Ok(())
    }

    fn exit(&mut self) -> Result<(), String> {
        let Some(pid) = self.pick_live() else { return Ok(()) };
        self.note("exits", format!("exit {pid}"));
        self.maybe_lose("P2M_EXIT");
        // An answer lost and the exit sent again: the first freed it, and the repeat finds
        // no home, as does a takeover asked then.
        match self.call_home(pid, P2M_EXIT { who: Sim::who(pid) }) {
            Ok(_) => {}
            Err(e) if e.contains("NotHome") || e.contains("keeps no copy") => {}
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
        // Any member: one holding pages, or the home of processes (their backups take over).
        let up: Vec<u32> = (1..=MEMBERS).filter(|id| !self.lost.contains(id)).collect();
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
        self.rig.net.lost.lock().unwrap().insert(id);
        self.beat();
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
        self.rig.net.stopped.lock().unwrap().insert(id);
        self.rig.net.down.lock().unwrap().remove(&id);
        // A request sent to it before it stopped comes first (a mapping of a process it was
        // home of, whose home is another now): it waits for the managers' word, and is
        // refused once that fenced it.
        let stale = self.rig.mem(id).homes.lock().unwrap().keys().next().copied();
        if let Some(pid) = stale.filter(|_| self.rng.random_ratio(2, 3)) {
            self.note(
                "stale requests",
                format!("  it is asked to map a vRegion of {pid} as the home it was"),
            );
            if let Ok(m) = self.rig.mmap(id, &Sim::who(pid), VRS) {
                return Err(format!("member {id}, lost, mapped {:#x} for {pid} as its home", m.addr));
            }
        }
        if self.rig.net.stopped.lock().unwrap().remove(&id) {
            self.rig.mem(id).fence();
        }
        self.fenced.push(id);
        Ok(())
    }

    /// What must hold after every step.
    fn check(&mut self) -> Result<(), String> {
        let up: Vec<u32> = (1..=MEMBERS)
            .filter(|id| !self.rig.net.down.lock().unwrap().contains(id))
            .collect();
        let pids: Vec<u64> = self.live.keys().copied().collect();
        for pid in &pids {
            let homes: Vec<u32> = up
                .iter()
                .copied()
                .filter(|id| self.rig.mem(*id).homes.lock().unwrap().contains_key(pid))
                .collect();
            // The pComponent may not know yet that the managers' word made the backup the
            // home: it finds out at its next call.
            if homes.len() != 1 {
                return Err(format!("process {pid} has the homes {homes:?}"));
            }
            let sets = self.rig.sets(homes[0], &Sim::who(*pid));
            if homes[0] == self.home(*pid) {
                self.live.get_mut(pid).unwrap().backup = sets.backup.map(|b| b.id);
            }
            for set in sets.owners {
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
                let held = [
                    ("home", m.homes.lock().unwrap().contains_key(pid)),
                    ("pages", m.owned.lock().unwrap().contains_key(pid)),
                    ("backup", m.backups.lock().unwrap().contains_key(pid)),
                ];
                if let Some((what, _)) = held.iter().find(|(_, held)| *held) {
                    return Err(format!(
                        "member {id} still holds the {what} of process {pid}, which ended"
                    ));
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
            "takeovers asked",
            "moves told",
            "stale requests",
            "creations given up",
        ] {
            let n = tally.get(kind).copied().unwrap_or(0);
            assert!(n >= seeds / 10, "{kind}: {n} in {seeds} seeds: {tally:?}");
        }
    }
}
