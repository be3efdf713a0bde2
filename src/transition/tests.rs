//! The rules of docs/design.md §4, each on the machine alone.

use super::*;
use crate::timing::tests::{start, timing};

const MS: Duration = Duration::from_millis(1);
const P: u32 = 8;
const E: u64 = 100;

/// A long drain and a large skew: the handover deadline
/// (`I/2 + 450 ms + 270 ms`) falls after the next assignment, the case
/// where a pending acquire meets a newer assignment (rule 4).
fn slow_timing() -> Timing {
    Timing {
        skew: 100 * MS,
        drain_timeout: 450 * MS,
        ..timing()
    }
}

fn a(epoch: u64, index: u32, replicas: u32) -> Assignment {
    Assignment::modulo(epoch, index, replicas)
}

fn all_marked(e: u64) -> BTreeMap<u32, u64> {
    (0..P).map(|p| (p, e)).collect()
}

/// An instance that owns every partition from epoch `E` (acquired by
/// marks), its assignment for `E` in force.
fn owning_all() -> Partitions {
    let mut m = Partitions::new(timing(), P);
    m.assigned(a(E, 1, 1), start(E) + 100 * MS);
    let started = m.marks(&all_marked(E), start(E) + 200 * MS);
    assert_eq!(started.len(), P as usize);
    m
}

fn marks_in(effects: &[Effect]) -> Vec<(u32, u64)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Mark { partition, epoch } => Some((*partition, *epoch)),
            _ => None,
        })
        .collect()
}

#[test]
fn rule6_an_assignment_after_its_lease_fences_instead() {
    let mut m = owning_all();
    let late = timing().lease_end(E + 1);
    let effects = m.assigned(a(E + 1, 1, 2), late);
    assert!(marks_in(&effects).is_empty());
    assert_eq!(
        effects.len(),
        P as usize,
        "everything stops, nothing starts: {effects:?}"
    );
    assert!(
        effects
            .iter()
            .all(|e| matches!(e, Effect::Drain { cancel_at, .. } if cancel_at.is_zero()))
    );
}

#[test]
fn the_same_assignment_twice_changes_nothing() {
    let mut m = owning_all();
    assert!(m.assigned(a(E, 1, 1), start(E) + 300 * MS).is_empty());
    assert_eq!(m.token(0), Some(E));
}

#[test]
fn kept_partitions_never_pause() {
    let mut m = owning_all();
    let effects = m.assigned(a(E + 1, 1, 1), start(E + 1) + 100 * MS);
    assert!(effects.is_empty(), "{effects:?}");
    for p in 0..P {
        assert_eq!(
            m.state(p),
            State::Owned {
                token: E,
                epoch: E + 1
            }
        );
    }
}

#[test]
fn rule1_a_release_drains_from_the_earlier_of_arrival_and_half_interval() {
    let mut m = owning_all();
    let on_time = start(E + 1) + 100 * MS;
    let effects = m.assigned(a(E + 1, 1, 2), on_time);
    // Odd partitions move to index 2; they drain until arrival + drain.
    let drains: Vec<_> = effects
        .iter()
        .filter(|e| matches!(e, Effect::Drain { .. }))
        .collect();
    assert_eq!(drains.len(), 4);
    assert!(drains.iter().all(|d| matches!(d, Effect::Drain { partition, cancel_at } if partition % 2 == 1 && *cancel_at == on_time + 300 * MS)));

    // A late assignment gets a shorter drain, never a later one.
    let mut m = owning_all();
    let late = start(E + 1) + 900 * MS;
    let effects = m.assigned(a(E + 1, 1, 2), late);
    assert!(effects.contains(&Effect::Drain {
        partition: 1,
        cancel_at: start(E + 1) + 800 * MS
    }));
}

#[test]
fn rule1_the_mark_is_written_only_after_the_drain() {
    let mut m = owning_all();
    let effects = m.assigned(a(E + 1, 1, 2), start(E + 1) + 100 * MS);
    assert!(
        marks_in(&effects).is_empty(),
        "no mark before the drain: {effects:?}"
    );
    let effects = m.drained(1, start(E + 1) + 150 * MS);
    assert_eq!(marks_in(&effects), vec![(1, E + 1)]);
    assert_eq!(m.state(1), State::Idle);
}

#[test]
fn rule2_only_the_owner_under_the_previous_epoch_marks() {
    // An instance whose last assignment is E releases under E + 2 (it
    // missed E + 1): it was not the owner under E + 1, so no mark.
    let mut m = owning_all();
    let effects = m.assigned(a(E + 2, 1, 2), start(E + 2) + 100 * MS);
    assert!(marks_in(&effects).is_empty());
    let effects = m.drained(1, start(E + 2) + 150 * MS);
    assert!(marks_in(&effects).is_empty(), "{effects:?}");
}

#[test]
fn rule3_an_acquire_waits_for_its_mark_or_its_deadline() {
    let mut m = Partitions::new(timing(), P);
    let effects = m.assigned(a(E, 1, 2), start(E) + 100 * MS);
    assert!(
        effects.is_empty(),
        "nothing starts before its mark: {effects:?}"
    );
    // An older mark is not enough.
    let older: BTreeMap<u32, u64> = [(0, E - 1)].into();
    assert!(m.marks(&older, start(E) + 200 * MS).is_empty());
    let marked: BTreeMap<u32, u64> = [(0, E)].into();
    assert_eq!(
        m.marks(&marked, start(E) + 210 * MS),
        vec![Effect::Start {
            partition: 0,
            token: E
        }]
    );
    // The others start at the deadline, not a moment before.
    let deadline = timing().deadline(E);
    assert!(m.tick(deadline - MS).is_empty());
    let started = m.tick(deadline);
    assert_eq!(started.len(), 3, "{started:?}");
    assert_eq!(m.token(2), Some(E));
}

#[test]
fn rule4_a_pending_acquire_still_owned_keeps_its_epoch_and_deadline() {
    let mut m = Partitions::new(slow_timing(), P);
    m.assigned(a(E, 1, 1), start(E) + 100 * MS);
    let effects = m.assigned(a(E + 1, 1, 1), start(E + 1) + 100 * MS);
    assert!(effects.is_empty());
    assert_eq!(
        m.state(3),
        State::Acquiring {
            epoch: E,
            deadline: slow_timing().deadline(E)
        }
    );
    // Its own mark (E) completes it; it would not if restarted for E + 1.
    let marked: BTreeMap<u32, u64> = [(3, E)].into();
    assert_eq!(
        m.marks(&marked, start(E + 1) + 200 * MS),
        vec![Effect::Start {
            partition: 3,
            token: E
        }]
    );
}

#[test]
fn rule4_a_moot_acquire_waits_for_its_own_condition_then_marks() {
    let mut m = Partitions::new(slow_timing(), P);
    m.assigned(a(E, 1, 1), start(E) + 100 * MS);
    let effects = m.assigned(a(E + 1, 1, 2), start(E + 1) + 100 * MS);
    assert!(
        marks_in(&effects).is_empty(),
        "no mark at once: {effects:?}"
    );
    assert!(matches!(m.state(1), State::Moot { epoch: E, new_epoch, .. } if new_epoch == E + 1));
    let marked: BTreeMap<u32, u64> = [(1, E)].into();
    let effects = m.marks(&marked, start(E + 1) + 200 * MS);
    assert_eq!(marks_in(&effects), vec![(1, E + 1)]);
    assert_eq!(m.state(1), State::Idle);
    // The ones still owned (even) are unaffected.
    assert!(matches!(m.state(0), State::Acquiring { epoch: E, .. }));
}

#[test]
fn rule5_after_a_gap_everything_is_fenced_and_acquired_anew_without_marks() {
    let mut m = owning_all();
    let effects = m.assigned(a(E + 2, 1, 1), start(E + 2) + 100 * MS);
    // Stopped at once, no marks, and no fetching until acquired again.
    assert_eq!(effects.len(), P as usize);
    assert!(
        effects
            .iter()
            .all(|e| matches!(e, Effect::Drain { cancel_at, .. } if cancel_at.is_zero()))
    );
    for p in 0..P {
        let effects = m.drained(p, start(E + 2) + 150 * MS);
        assert!(marks_in(&effects).is_empty(), "{effects:?}");
        assert!(matches!(m.state(p), State::Acquiring { epoch, .. } if epoch == E + 2));
    }
    let started = m.marks(&all_marked(E + 2), start(E + 2) + 300 * MS);
    assert!(
        started
            .iter()
            .all(|e| matches!(e, Effect::Start { token, .. } if *token == E + 2))
    );
}

#[test]
fn rule5_a_fence_stops_everything_and_drops_pending_acquires() {
    let mut m = owning_all();
    m.assigned(a(E + 1, 1, 1), start(E + 1) + 100 * MS);
    let effects = m.fence();
    assert_eq!(effects.len(), P as usize);
    assert!(marks_in(&effects).is_empty());
    let mut m = Partitions::new(timing(), P);
    m.assigned(a(E, 1, 1), start(E) + 100 * MS);
    assert!(m.fence().is_empty());
    assert!(m.waiting().is_empty(), "pending acquires dropped");
}

#[test]
fn rule7_a_leave_releases_everything_with_marks() {
    let mut m = owning_all();
    let effects = m.leave(E + 1, start(E + 1) + 100 * MS);
    assert_eq!(effects.len(), P as usize);
    let mut marks = Vec::new();
    for p in 0..P {
        marks.extend(marks_in(&m.drained(p, start(E + 1) + 200 * MS)));
    }
    assert_eq!(marks, (0..P).map(|p| (p, E + 1)).collect::<Vec<_>>());

    // A leave that is not right after this instance's last assignment
    // vouches for nobody: no marks, not even for pending acquires.
    let mut m = owning_all();
    m.leave(E + 3, start(E + 3) + 100 * MS);
    for p in 0..P {
        assert!(marks_in(&m.drained(p, start(E + 3) + 200 * MS)).is_empty());
    }
    let mut m = Partitions::new(slow_timing(), P);
    m.assigned(a(E, 1, 1), start(E) + 100 * MS);
    let left = m.leave(E + 2, start(E + 2) + 100 * MS);
    let later = m.marks(&all_marked(E), start(E + 2) + 200 * MS);
    assert!(marks_in(&[left, later].concat()).is_empty());
    assert!(m.waiting().is_empty());
}

#[test]
fn rule8_a_lost_partition_stops_alone_without_a_mark_and_is_acquired_anew() {
    let mut m = owning_all();
    // A refusal for an old token is old news.
    assert!(m.lost(2, E - 1).is_empty());
    let effects = m.lost(2, E);
    assert_eq!(
        effects,
        vec![Effect::Drain {
            partition: 2,
            cancel_at: Duration::ZERO
        }]
    );
    assert_eq!(m.token(1), Some(E), "the others run on");
    assert!(marks_in(&m.drained(2, start(E) + 300 * MS)).is_empty());
    // Still owned by the next assignment: acquired anew, with a new
    // token, at the deadline (no mark will come for it).
    assert!(
        m.assigned(a(E + 1, 1, 1), start(E + 1) + 100 * MS)
            .is_empty()
    );
    assert!(matches!(m.state(2), State::Acquiring { epoch, .. } if epoch == E + 1));
    let started = m.tick(timing().deadline(E + 1));
    assert_eq!(
        started,
        vec![Effect::Start {
            partition: 2,
            token: E + 1
        }]
    );
}

#[test]
fn a_partition_back_before_its_drain_ended_waits_for_it() {
    let mut m = owning_all();
    m.assigned(a(E + 1, 1, 2), start(E + 1) + 100 * MS);
    // Still draining (tasks ignore cancellation) when it comes back.
    let effects = m.assigned(a(E + 2, 1, 1), start(E + 2) + 100 * MS);
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::Start { partition: 1, .. })),
        "{effects:?}"
    );
    let effects = m.drained(1, start(E + 2) + 150 * MS);
    assert_eq!(marks_in(&effects), vec![(1, E + 1)]);
    assert!(matches!(m.state(1), State::Acquiring { epoch, .. } if epoch == E + 2));
}

/// Singletons (docs/design.md §20) move under the same rules: each unit
/// is held where the assignment places its name, waits for its mark, is
/// drained at a move and marked after the drain.
#[test]
fn singletons_are_units_held_where_the_assignment_places_their_names() {
    let names: Vec<Arc<str>> = ["alpha", "beta", "e", "f"]
        .into_iter()
        .map(Arc::from)
        .collect();
    let mut alone = Partitions::singletons(timing(), names.clone());
    alone.assigned(a(E, 1, 1), start(E) + 100 * MS);
    assert_eq!(alone.waiting(), vec![0, 1, 2, 3], "one instance holds all");
    let marks: BTreeMap<u32, u64> = (0..4).map(|u| (u, E)).collect();
    let started = alone.marks(&marks, start(E) + 150 * MS);
    assert_eq!(started.len(), 4);
    // A second instance joins: the units its assignment places there move,
    // each drained and then marked, and no other.
    let moved: Vec<u32> = (0..4u32)
        .filter(|&u| a(E + 1, 2, 2).holds_singleton(&names[u as usize]))
        .collect();
    assert!(
        !moved.is_empty() && moved.len() < 4,
        "the names spread: {moved:?}"
    );
    let effects = alone.assigned(a(E + 1, 1, 2), start(E + 1) + 100 * MS);
    let drained: Vec<u32> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::Drain { partition, .. } => Some(*partition),
            _ => None,
        })
        .collect();
    assert_eq!(drained, moved);
    for u in &moved {
        assert_eq!(
            marks_in(&alone.drained(*u, start(E + 1) + 200 * MS)),
            vec![(*u, E + 1)]
        );
    }
}
