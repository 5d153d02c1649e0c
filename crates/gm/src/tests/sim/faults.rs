//! What goes wrong in a simulated run, drawn from its seed, and the healing after.
use super::*;

impl Sim {
    pub(super) fn fault(&mut self) {
        let now = self.now();
        let (kind, m, c, d) = {
            let mut r = self.rng();
            if !r.random_ratio(1, 60) {
                return;
            }
            (
                r.random_range(0..9u32),
                r.random_range(0..MANAGERS),
                r.random_range(0..self.comps.len()),
                Duration::from_millis(r.random_range(300..=6000)),
            )
        };
        let addr = self.mgrs[m].addr.clone();
        match kind {
            0 if self.mgrs[m].run.is_some() => self.end_manager(m, "killed", d),
            1 if self.mgrs[m].run.is_some() && self.mgrs[m].paused_until.is_none() => {
                self.mgrs[m].paused_until = Some(now + d);
                self.note("managers paused", format!("manager {addr} paused for {d:?}"));
            }
            2 => {
                self.mgrs[m].keeper.cut.store(true, Relaxed);
                self.note(
                    "managers cut from the keeper",
                    format!("manager {addr} cut off from the keeper"),
                );
            }
            3 => {
                self.cuts.insert((c, m), now + d);
                let id = self.comps[c].id;
                self.note(
                    "links cut",
                    format!("component {id} and manager {addr} cut off for {d:?}"),
                );
            }
            4 if self.comps[c].up == Up::Running && self.crashed() < 2 => {
                self.comps[c].up = Up::Crashed;
                self.comps[c].call = None;
                let id = self.comps[c].id;
                self.note("components crashed", format!("component {id} crashes"));
            }
            5 if self.comps[c].up == Up::Running => {
                self.comps[c].up = Up::Paused;
                self.comps[c].paused_until = Some(now + d);
                let id = self.comps[c].id;
                self.note("components paused", format!("component {id} paused for {d:?}"));
            }
            6 if self.comps[c].up == Up::Crashed => {
                // A new start, which the managers give a new id: it replaces the one at its
                // address, whose detach and copies went with it, and holds nothing.
                let old = self.comps[c].id;
                self.replaced.insert(old);
                let k = &mut self.comps[c];
                k.id = 0;
                k.start += 1000;
                k.up = Up::Running;
                k.registered = false;
                k.left = None;
                k.detaching = false;
                k.must_fence = None;
                k.fenced_by = 0;
                k.next = now;
                self.note("components restarted", format!("component {old} starts again"));
            }
            7 => self.detach(c),
            _ => {
                for g in &self.mgrs {
                    g.keeper.cut.store(false, Relaxed);
                }
            }
        }
    }

    pub(super) fn crashed(&self) -> usize {
        self.comps.iter().filter(|k| k.up == Up::Crashed).count()
    }

    /// The admin detaches mComponent `c` through whichever manager leads.
    pub(super) fn detach(&mut self, c: usize) {
        if self.comps[c].role != Role::Mem {
            return;
        }
        let id = self.comps[c].id;
        let Some(m) = (0..MANAGERS).find(|m| {
            self.mgrs[*m].paused_until.is_none()
                && self.mgrs[*m].run.as_ref().is_some_and(|(_, g)| g.leading().is_some())
        }) else {
            return;
        };
        let gm = self.mgrs[m].run.as_ref().unwrap().1.leading().unwrap().clone();
        match gm.detach(id, true) {
            Ok(_) => {
                self.mgrs[m].detaching.insert(id);
                self.detached.insert(id);
                self.comps[c].detaching = true;
                self.note("detaches started", format!("the admin detaches mComponent {id}"));
            }
            Err(e) => self.note("detaches refused", format!("detach of {id} refused: {e}")),
        }
    }

    pub(super) fn heal(&mut self) {
        let now = self.now();
        self.cuts.clear();
        self.world.calm.store(true, Relaxed);
        for g in &mut self.mgrs {
            g.keeper.cut.store(false, Relaxed);
            if g.paused_until.is_some_and(|u| u > now) {
                g.paused_until = Some(now);
            }
        }
        for k in &mut self.comps {
            if k.up == Up::Paused {
                k.paused_until = Some(now);
            }
        }
        self.note(
            "healed",
            "the network heals (nothing is lost or late any more); paused processes resume".into(),
        );
    }
}
