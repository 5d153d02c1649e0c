use super::*;

fn fill(c: &mut ExCache, pid: u64, vpn: u64, dirty: bool) -> Option<Line> {
    let cl = c.claim(pid, vpn).expect("a way");
    c.complete(cl.slot, Filled { dirty, wp: !dirty });
    cl.victim
}

#[test]
fn sets_are_virtually_indexed_and_bounded_by_ways() {
    let mut c = ExCache::new(8, 2, Box::new(Fifo));
    assert_eq!((c.sets(), c.ways()), (4, 2));
    assert!(fill(&mut c, 1, 0, false).is_none());
    assert!(fill(&mut c, 1, 4, false).is_none());
    // vpn 8 maps to set 0 as well: the set is full although other sets are empty.
    let v = fill(&mut c, 1, 8, false).expect("eviction in a full set");
    assert_eq!(v.vpn, 0);
    assert_eq!(c.used(), 2);
    assert!(c.lookup(1, 0).is_none());
    assert!(c.lookup(1, 8).is_some());
}

#[test]
fn free_ways_are_used_before_any_eviction() {
    let mut c = ExCache::new(4, 4, Box::new(Fifo));
    for v in 0..4 {
        assert!(fill(&mut c, 7, v, true).is_none());
    }
    assert_eq!(c.used(), 4);
    c.remove(7, 2);
    assert!(fill(&mut c, 7, 9, true).is_none(), "the freed way is reused");
}

#[test]
fn fifo_evicts_in_fill_order_regardless_of_use() {
    let mut c = ExCache::new(3, 3, Box::new(Fifo));
    for v in [10, 11, 12] {
        fill(&mut c, 1, v, false);
    }
    let s = c.lookup(1, 10).unwrap();
    c.line_mut(s).referenced = true;
    assert_eq!(fill(&mut c, 1, 13, false).unwrap().vpn, 10);
    assert_eq!(fill(&mut c, 1, 14, false).unwrap().vpn, 11);
}

#[test]
fn clock_spares_referenced_lines_and_asks_to_rearm_them() {
    let mut c = ExCache::new(3, 3, Box::new(Clock));
    for v in [10, 11, 12] {
        fill(&mut c, 1, v, true);
    }
    // All referenced after fill: the first sweep clears, the second evicts the hand's first.
    assert_eq!(fill(&mut c, 1, 13, true).unwrap().vpn, 10);
    let rearm = c.take_rearm(13);
    assert_eq!(
        rearm.len(),
        2,
        "the lines whose bit was cleared are to be observed again"
    );
    // 11 is written again (its bit set); 12 is not: CLOCK evicts 12, FIFO would evict 11.
    let s = c.lookup(1, 11).unwrap();
    c.line_mut(s).referenced = true;
    assert_eq!(fill(&mut c, 1, 14, true).unwrap().vpn, 12);
}

#[test]
fn clock_asks_about_unseen_writes_before_evicting_and_fifo_does_not() {
    let mut c = ExCache::new(3, 3, Box::new(Clock));
    for v in [10, 11, 12] {
        fill(&mut c, 1, v, false);
    }
    // After the first sweep, 10 is the victim; it was written unseen, so 11 goes instead.
    let mut asked = Vec::new();
    let cl = c
        .claim_observing(
            1,
            13,
            |_| true,
            |l| {
                asked.push(l.vpn);
                l.dirty |= l.vpn == 10;
                l.vpn == 10
            },
        )
        .unwrap();
    assert_eq!(cl.victim.unwrap().vpn, 11);
    assert_eq!(asked, vec![10, 11]);
    assert!(
        c.line(c.lookup(1, 10).unwrap()).dirty,
        "what the question learned stays"
    );
    let mut f = ExCache::new(2, 2, Box::new(Fifo));
    fill(&mut f, 1, 0, false);
    fill(&mut f, 1, 2, false);
    assert_eq!(
        f.claim_observing(1, 4, |_| true, |_| panic!("FIFO does not ask"))
            .unwrap()
            .victim
            .unwrap()
            .vpn,
        0
    );
}

#[test]
fn interleaving_pins_its_pages_for_good_and_leaves_two_ways_for_the_others() {
    // Fully associative, 4 lines; every other page is local.
    let mut c = ExCache::growable(4, 8, 0, Box::new(Fifo)).with_interleave(Some(Interleave {
        local: 1,
        of: 2,
        unit: 1,
    }));
    for v in 0..4 {
        fill(&mut c, 1, v, false);
    }
    assert_eq!(c.pinned_lines(), 2);
    // FIFO passes over the pinned 0 and 2: the remote pages go.
    assert_eq!(fill(&mut c, 1, 4, false).unwrap().vpn, 1);
    // A third pinned line would leave one way for the others: 4 comes and goes.
    assert_eq!(c.pinned_lines(), 2);
    assert_eq!(fill(&mut c, 1, 6, false).unwrap().vpn, 3);
    for v in 7..40 {
        assert!(
            !matches!(fill(&mut c, 1, v, false), Some(l) if l.pinned),
            "a pinned line is never a victim"
        );
    }
    assert!(
        [0, 2].iter().all(|v| c.lookup(1, *v).is_some()),
        "the pinned pages stay"
    );
    // A line leaving with its range gives its pin back.
    c.remove(1, 0);
    assert_eq!(c.pinned_lines(), 1);
    // Shrinking keeps two ways of every set for the others: the newest pins give way.
    let mut c = ExCache::growable(4, 8, 0, Box::new(Fifo)).with_interleave(Some(Interleave {
        local: 3,
        of: 4,
        unit: 1,
    }));
    for v in 0..4 {
        fill(&mut c, 1, v, false);
    }
    assert_eq!(c.pinned_lines(), 2);
    c.resize(3);
    assert_eq!(c.pinned_lines(), 1);
    assert!(c.line(c.lookup(1, 0).unwrap()).pinned && !c.line(c.lookup(1, 1).unwrap()).pinned);
    // Two ways leave nothing to pin.
    c.resize(2);
    assert_eq!(c.pinned_lines(), 0);
    // By range: pages 0-3 local, 4-7 remote, 8-11 local.
    let r = Interleave {
        local: 1,
        of: 2,
        unit: 4,
    };
    assert!(r.is_local(3, 1) && !r.is_local(4, 1) && !r.is_local(7, 1) && r.is_local(8, 1));
    // With 4 sets, by page: each set's pages alternate, so every set keeps half local.
    let p = Interleave {
        local: 1,
        of: 2,
        unit: 1,
    };
    for set in 0..4 {
        let local: Vec<bool> = (0..4).map(|round| p.is_local(round * 4 + set, 4)).collect();
        assert_eq!(local, [true, false, true, false], "set {set}");
    }
    // Ranges of 8 pages over 4 sets: pages 0-7 local, 8-15 remote.
    assert!(Interleave { unit: 8, ..p }.is_local(7, 4) && !Interleave { unit: 8, ..p }.is_local(8, 4));
}

#[test]
fn a_job_interleaves_its_own_processes_and_pins_within_its_share_and_past_the_reserve() {
    let half = Some(Interleave {
        local: 1,
        of: 2,
        unit: 1,
    });
    // The pComponent interleaves nothing; process 1's job chose 1:2, process 2's nothing.
    let mut c = ExCache::growable(8, 8, 0, Box::new(Fifo));
    c.set_interleave(1, half);
    for v in 0..4 {
        fill(&mut c, 1, v, false);
        fill(&mut c, 2, v, false);
    }
    assert_eq!(c.pinned_lines(), 2, "pages 0 and 2 of process 1 alone");
    assert_eq!(c.job_interleave(1), Some(half));
    // A job's choice of none overrides the pComponent's; a pid reused is a new process.
    let mut c = ExCache::growable(8, 8, 0, Box::new(Fifo)).with_interleave(half);
    c.set_interleave(2, None);
    for v in 0..4 {
        fill(&mut c, 1, v, false);
        fill(&mut c, 2, v, false);
    }
    assert_eq!(
        c.pinned_lines(),
        2,
        "process 1's by the pComponent's, none of process 2's"
    );
    c.forget_group(2);
    assert_eq!(c.job_interleave(2), None);
    // With shares, a vNode pins only while it holds less than its share.
    let mut c = ExCache::growable(8, 8, 0, Box::new(Fifo)).with_interleave(half);
    c.set_group(1, 7);
    c.set_group(2, 9);
    c.set_shares(HashMap::from([(7, 2)]));
    for v in 0..8 {
        fill(&mut c, 1, v, false);
    }
    assert_eq!(
        c.pinned_lines(),
        1,
        "page 0 pinned with 0 lines held, page 2 with 2 (its share) not"
    );
    c.remove(1, 0);
    for v in 0..4 {
        fill(&mut c, 2, v, false);
    }
    assert_eq!(c.pinned_lines(), 0, "vNode 9 has no share to pin within");
    // The background evictor's reserve is never pinned: 6 ways, 2 kept, 2 reserved.
    let mut c = ExCache::growable(6, 6, 0, Box::new(Fifo))
        .with_interleave(Some(Interleave {
            local: 5,
            of: 6,
            unit: 1,
        }))
        .with_evict_reserve(2);
    for v in 0..6 {
        fill(&mut c, 1, v, false);
    }
    assert_eq!(c.pinned_lines(), 2);
}

#[test]
fn filling_lines_are_never_victims() {
    let mut c = ExCache::new(2, 2, Box::new(Fifo));
    c.claim(1, 0).unwrap();
    c.claim(1, 2).unwrap();
    assert!(c.claim(1, 4).is_none());
    let mut k = ExCache::new(2, 2, Box::new(Clock));
    k.claim(1, 0).unwrap();
    k.claim(1, 2).unwrap();
    assert!(k.claim(1, 4).is_none());
}

#[test]
fn a_line_picked_for_the_evictor_stays_until_removed_and_is_nobody_elses_victim() {
    let mut c = ExCache::new(2, 2, Box::new(Fifo));
    fill(&mut c, 1, 0, true);
    fill(&mut c, 1, 2, true);
    assert_eq!(c.spare(0), 0);
    let slot = c.pick(0).expect("a victim");
    assert_eq!(c.line(slot).vpn, 0, "the policy's victim");
    assert_eq!((c.line(slot).state, c.spare(0), c.used()), (LineState::Evicting, 1, 2));
    assert_eq!(
        fill(&mut c, 1, 4, true).map(|v| v.vpn),
        Some(2),
        "a miss takes the other line, not the picked one"
    );
    let again = c.pick(0).expect("the line just filled");
    assert_eq!((c.line(again).vpn, c.spare(0)), (4, 2));
    c.keep(again);
    assert_eq!(c.spare(0), 1);
    c.remove(1, 0);
    assert_eq!((c.spare(0), c.used()), (1, 1));
    assert!(c.claim(1, 6).expect("the freed way").victim.is_none());
}

#[test]
fn a_process_at_its_floor_keeps_its_lines_against_anothers_misses() {
    // Two processes in 4 lines: an equal share is 2 lines, the floor all of it.
    for (floor, kept) in [(100, true), (0, false)] {
        let mut c = ExCache::new(4, 0, Box::new(Fifo)).with_floor(floor);
        fill(&mut c, 1, 10, true);
        fill(&mut c, 1, 11, true);
        fill(&mut c, 2, 20, true);
        fill(&mut c, 2, 21, true);
        let v = fill(&mut c, 2, 22, true).expect("a full cache evicts");
        assert_eq!(v.pid == 2, kept, "floor {floor}: {v:?}");
        assert_eq!(c.resident_of(1) == 2, kept);
        assert!(
            c.line(c.lookup(1, 10).or(c.lookup(1, 11)).unwrap()).state == LineState::Ready,
            "lines passed over are ready again"
        );
    }
    // Above its floor a process loses lines to another's misses as before: with 3 of the 4
    // lines, process 1 holds more than its 2.
    let mut c = ExCache::new(4, 0, Box::new(Fifo)).with_floor(100);
    for v in [10, 11, 12] {
        fill(&mut c, 1, v, true);
    }
    fill(&mut c, 2, 20, true);
    assert_eq!(fill(&mut c, 2, 21, true).map(|v| (v.pid, v.vpn)), Some((1, 10)));
}

#[test]
fn a_set_whose_lines_are_all_at_their_floor_still_gives_one() {
    // One set of 2 ways, both process 1's, the only process holding lines: its floor is the
    // whole cache. A miss of process 2 must not wait forever.
    let mut c = ExCache::new(2, 2, Box::new(Clock)).with_floor(100);
    fill(&mut c, 1, 0, true);
    fill(&mut c, 1, 2, true);
    let v = fill(&mut c, 2, 4, true).expect("the floor gives way");
    assert_eq!(v.pid, 1);
    // A process is never shielded from its own misses.
    let mut c = ExCache::new(2, 2, Box::new(Fifo)).with_floor(100);
    fill(&mut c, 1, 0, true);
    fill(&mut c, 1, 2, true);
    assert_eq!(fill(&mut c, 1, 4, true).map(|v| v.vpn), Some(0));
}

#[test]
fn lines_are_tagged_by_process() {
    let mut c = ExCache::new(4, 4, Box::new(Fifo));
    fill(&mut c, 1, 5, false);
    fill(&mut c, 2, 5, true);
    assert_ne!(c.lookup(1, 5), c.lookup(2, 5));
    assert_eq!(c.resident_in(2, 0, 10).len(), 1);
    assert!(c.remove(1, 5).is_some());
    assert!(c.lookup(2, 5).is_some());
}

#[test]
fn a_growable_cache_grows_in_place_and_a_shrink_leaves_the_lines_past_its_end_to_evict() {
    // 4 sets of 2 ways, able to grow to 4 ways.
    let mut c = ExCache::growable(8, 16, 2, Box::new(Fifo));
    assert_eq!((c.sets(), c.ways(), c.lines(), c.max_lines()), (4, 2, 8, 16));
    for v in [0, 4] {
        fill(&mut c, 1, v, false);
    }
    let (s0, s4) = (c.lookup(1, 0).unwrap(), c.lookup(1, 4).unwrap());
    c.resize(c.ways_for(16).unwrap());
    assert_eq!(c.lines(), 16);
    assert_eq!(
        (c.lookup(1, 0), c.lookup(1, 4)),
        (Some(s0), Some(s4)),
        "lines stay where they were"
    );
    assert!(
        fill(&mut c, 1, 8, false).is_none() && fill(&mut c, 1, 12, false).is_none(),
        "the new ways take misses without evicting"
    );
    assert!(fill(&mut c, 1, 16, false).is_some(), "four ways, then a victim");
    // Back to one way per set: three lines of set 0 are past the end, and a miss there
    // takes the one way left (its line is the policy's victim) and never a way past it.
    c.resize(c.ways_for(4).unwrap());
    let beyond: Vec<u64> = c.beyond().iter().map(|(_, l)| l.vpn).collect();
    assert_eq!(beyond.len(), 3, "{beyond:?}");
    for (slot, l) in c.beyond() {
        c.mark_evicting(slot);
        c.remove(l.pid, l.vpn);
    }
    assert!(c.beyond().is_empty());
    assert_eq!(c.used(), 1);
    let v = fill(&mut c, 1, 20, false).expect("the one way's line is the victim");
    assert!(!beyond.contains(&v.vpn));
    assert!(
        c.ways_for(2).is_err() && c.ways_for(32).is_err(),
        "under one way a set, or past the most it grows to"
    );
}

#[test]
fn a_vnode_within_its_share_keeps_its_lines_against_another_vnodes_misses() {
    for (share, kept) in [(Some(2), true), (None, false)] {
        let mut c = ExCache::new(4, 0, Box::new(Fifo));
        c.set_group(1, 10);
        c.set_group(2, 20);
        if let Some(n) = share {
            c.set_shares(HashMap::from([(10, n)]));
        }
        for v in 0..2 {
            fill(&mut c, 1, v, false);
        }
        for v in 10..12 {
            fill(&mut c, 2, v, false);
        }
        // Process 2's misses evict only its own lines while vNode 10 holds its share.
        for v in 12..20 {
            let victim = fill(&mut c, 2, v, false).expect("a victim");
            if kept {
                assert_eq!(victim.pid, 2, "share {share:?}: {victim:?}");
            }
        }
        assert_eq!(c.resident_of(1) == 2, kept, "share {share:?}");
        assert_eq!(c.group_lines(10), c.resident_of(1));
    }
    // A vNode's own misses may evict its own lines, and the share counts lines, not pids.
    let mut c = ExCache::new(2, 0, Box::new(Fifo));
    c.set_group(1, 10);
    c.set_shares(HashMap::from([(10, 2)]));
    for v in 0..3 {
        fill(&mut c, 1, v, false);
    }
    assert_eq!(c.group_lines(10), 2);
    c.forget_group(1);
    assert_eq!(c.group_lines(10), 0);
}

/// A hot set of 4 pages read again and again beside a scan that never comes back, in a fully
/// associative cache of 8 lines: FIFO lets the scan push the hot pages out at every turn;
/// the two lists keep them once each came back soon after it left.
#[test]
fn workingset_keeps_lines_missed_again_soon_against_a_scan_and_fifo_does_not() {
    fn misses(policy: Box<dyn EvictionPolicy>) -> usize {
        let mut c = ExCache::new(8, 0, policy);
        let mut misses = 0;
        let mut scan = 1000;
        for _ in 0..50 {
            for v in (0..4).chain(scan..scan + 6) {
                if c.lookup(1, v).is_none() {
                    misses += 1;
                    fill(&mut c, 1, v, false);
                }
            }
            scan += 6;
        }
        misses
    }
    let (fifo, lists) = (misses(Box::new(Fifo)), misses(Box::new(Workingset::new(8, false))));
    // 300 scan misses either way; FIFO misses the hot pages at every turn as well.
    assert_eq!(fifo, 500);
    assert!(lists <= 300 + 8, "{lists}");
}

#[test]
fn workingset_activates_a_written_inactive_line_and_ages_the_active_list_to_half() {
    let mut c = ExCache::new(4, 4, Box::new(Workingset::new(4, false)));
    for v in [10, 11, 12, 13] {
        fill(&mut c, 1, v, false);
    }
    // 10 and 11 written while inactive: a second reference, as in the kernel.
    c.touch(c.lookup(1, 10).unwrap());
    c.touch(c.lookup(1, 11).unwrap());
    assert_eq!(fill(&mut c, 1, 14, false).unwrap().vpn, 12);
    assert_eq!(fill(&mut c, 1, 15, false).unwrap().vpn, 13);
    // A third active line makes the list more than half: its oldest goes back, unless it was
    // used since it became active; 10 was, so 11 goes back, behind 16, and leaves after it.
    c.touch(c.lookup(1, 14).unwrap());
    c.touch(c.lookup(1, 10).unwrap());
    assert_eq!(fill(&mut c, 1, 16, false).unwrap().vpn, 15);
    assert_eq!(fill(&mut c, 1, 17, false).unwrap().vpn, 11);
}

/// The pages of the lines a policy asked to be observed since the last call.
fn rearmed(c: &mut ExCache, vpn: u64) -> Vec<u64> {
    c.take_rearm(vpn).iter().map(|s| c.line(*s).vpn).collect()
}

#[test]
fn sampled_workingset_keeps_a_line_touched_while_it_waited_at_the_inactive_head() {
    // 16 lines, an eighth of them (2) waiting at the head of the inactive list to be seen used.
    let mut c = ExCache::new(16, 0, Box::new(Workingset::new(16, true)));
    for v in 0..16 {
        fill(&mut c, 1, v, false);
    }
    // The first miss asks for the two lines at the head to be observed, and takes the first
    // (it has nothing older): only page 1 is still there to be observed.
    assert_eq!(fill(&mut c, 1, 100, false).unwrap().vpn, 0);
    assert_eq!(rearmed(&mut c, 100), vec![1]);
    assert_eq!(fill(&mut c, 1, 101, false).unwrap().vpn, 1);
    assert_eq!(rearmed(&mut c, 101), vec![2]);
    // Page 2 is touched while it waits: it becomes active and stays; 3 and 4 leave untouched.
    c.touch(c.lookup(1, 2).unwrap());
    assert_eq!(fill(&mut c, 1, 102, false).unwrap().vpn, 3);
    assert_eq!(fill(&mut c, 1, 103, false).unwrap().vpn, 4);
    assert_eq!(rearmed(&mut c, 103), vec![5], "3 and 4 were asked for, and left");
    assert!(c.lookup(1, 2).is_some());
    // Without sampling the head of the inactive list leaves at once, and nothing is asked.
    let mut plain = ExCache::new(16, 0, Box::new(Workingset::new(16, false)));
    for v in 0..16 {
        fill(&mut plain, 1, v, false);
    }
    for (v, out) in [(100, 0), (101, 1), (102, 2)] {
        assert_eq!(fill(&mut plain, 1, v, false).unwrap().vpn, out);
        assert!(rearmed(&mut plain, v).is_empty());
    }
}

#[test]
fn workingset_takes_over_the_lines_another_policy_left_and_passes_over_those_not_candidates() {
    let mut c = ExCache::new(4, 4, Box::new(Fifo));
    for v in [10, 11, 12, 13] {
        fill(&mut c, 1, v, false);
    }
    c.set_policy(Box::new(Workingset::new(4, false)));
    let s = c.lookup(1, 10).unwrap();
    c.line_mut(s).state = LineState::Filling;
    assert_eq!(
        fill(&mut c, 1, 14, false).unwrap().vpn,
        11,
        "in fill order, past the one filling"
    );
    c.line_mut(s).state = LineState::Ready;
    assert_eq!(fill(&mut c, 1, 15, false).unwrap().vpn, 12);
    assert_eq!(fill(&mut c, 1, 16, false).unwrap().vpn, 13);
    assert_eq!(fill(&mut c, 1, 17, false).unwrap().vpn, 10);
    // Lines that leave with their range leave stale entries behind, which never come back
    // as victims however many there are.
    for round in 0..100u64 {
        c.remove(1, 14 + round);
        fill(&mut c, 1, 18 + round, false);
    }
    assert_eq!(c.used(), 4);
}

/// The pages [`ExCache::pick_beside`] takes beside the victim in `slot`, 8 either side.
fn beside(c: &mut ExCache, slot: usize) -> Vec<u64> {
    c.pick_beside(slot, 8, |_| false)
        .iter()
        .map(|s| c.line(*s).vpn)
        .collect()
}

#[test]
fn only_inactive_old_lines_of_the_victims_process_leave_beside_it() {
    let mut c = ExCache::new(16, 16, Box::new(Workingset::new(16, false)));
    // Process 1's pages 0-5 first (the oldest quarter is the first four fills), then process
    // 2's page 6, then younger lines of process 1.
    for v in 0..6 {
        fill(&mut c, 1, v, false);
    }
    fill(&mut c, 2, 6, false);
    for v in 100..109 {
        fill(&mut c, 1, v, false);
    }
    // Page 2 was written while inactive: the policy keeps it a while (active).
    c.touch(c.lookup(1, 2).unwrap());
    let victim = c.pick(0).expect("a victim");
    assert_eq!(c.line(victim).vpn, 0);
    assert_eq!(beside(&mut c, victim), vec![1], "page 2 is active and ends the run");
    assert!(beside(&mut c, victim).is_empty(), "page 1 is being evicted already");
    // Page 3 is inactive and old, page 4 is inactive but filled after the oldest quarter.
    let s3 = c.lookup(1, 3).unwrap();
    assert_eq!(beside(&mut c, s3), Vec::<u64>::new(), "page 2 active, page 4 too young");
    // Process 2's page 6 is not process 1's page 6, which is not resident.
    let s5 = c.lookup(1, 5).unwrap();
    assert!(beside(&mut c, s5).is_empty());
}

#[test]
fn clock_keeps_the_second_chance_of_lines_its_hand_just_passed() {
    let mut c = ExCache::new(32, 32, Box::new(Clock));
    for v in 0..16 {
        fill(&mut c, 1, v, false);
    }
    // 24 fills since: pages 0-15 are older than the last three quarters of them.
    for v in 100..124 {
        fill(&mut c, 1, v, false);
        c.remove(1, v);
    }
    // Pages 0-3 were seen unused a turn ago (bit clear, nothing pending); page 2's bit was
    // cleared by the hand just now (rearm pending): its use since could not be seen yet.
    for v in 0..4 {
        c.line_mut(c.lookup(1, v).unwrap()).referenced = false;
    }
    c.line_mut(c.lookup(1, 2).unwrap()).rearm = true;
    let victim = c.pick(0).expect("a victim");
    assert_eq!(c.line(victim).vpn, 0);
    // A line the caller keeps (a staged sample) ends a run as well.
    assert!(c.pick_beside(victim, 8, |l| l.vpn == 1).is_empty());
    assert_eq!(beside(&mut c, victim), vec![1]);
}

#[test]
fn clock_looks_for_lines_to_rearm_only_where_its_hand_went() {
    let mut c = ExCache::new(64, 64, Box::new(Clock));
    for v in 0..64 {
        fill(&mut c, 1, v, false);
    }
    // All referenced: the hand clears every bit in one turn and takes page 0 on the second.
    assert_eq!(fill(&mut c, 1, 64, false).unwrap().vpn, 0);
    assert_eq!(c.take_rearm(64).len(), 63);
    // A mark far from the hand's way is not looked for; those it passes are.
    let far = c.lookup(1, 40).unwrap();
    c.line_mut(far).rearm = true;
    c.touch(c.lookup(1, 1).unwrap());
    assert_eq!(fill(&mut c, 1, 65, false).unwrap().vpn, 2);
    let near = c.lookup(1, 1).unwrap();
    assert_eq!(c.take_rearm(65), vec![near]);
    assert!(c.line(far).rearm);
    // After a resize the hand's count means other ways: every way is looked at once.
    c.resize(64);
    assert_eq!(c.take_rearm(65), vec![far]);
    assert!(c.take_rearm(65).is_empty());
}
