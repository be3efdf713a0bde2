//! The machine across a reshard (docs/design.md §21): which generation's
//! units an assignment owns, the cut-over at the open epoch, and tokens
//! that keep growing; a property test drives several instances' machines
//! through membership changes and a layout change.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::partition::{generation_of, unit};
use crate::reshard::{Layout, Phase};
use crate::timing::tests::{start, timing};

const MS: Duration = Duration::from_millis(1);
const I: Duration = Duration::from_secs(1);

fn layout(from: u32, to: u32, open_epoch: Option<u64>) -> Arc<Layout> {
    Arc::new(Layout {
        current: Generation {
            number: 1,
            partitions: to,
        },
        from: Some(Generation {
            number: 0,
            partitions: from,
        }),
        phase: open_epoch.map_or(Phase::Draining, |open_epoch| Phase::Open { open_epoch }),
        started_ms: None,
        opened_ms: None,
        past: vec![Generation {
            number: 0,
            partitions: from,
        }],
    })
}

fn started(effects: &[Effect]) -> Vec<(u32, u64)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Start { partition, token } => Some((*partition, *token)),
            _ => None,
        })
        .collect()
}

#[test]
fn the_new_generation_starts_at_once_in_its_open_epoch_and_the_old_one_is_released() {
    let mut m = Partitions::new(timing(), 4);
    let a = |e, l| Assignment::modulo(e, 1, 1).with_layout(Some(l));
    // Draining: the old generation's units are owned as before.
    m.assigned(a(10, layout(4, 6, None)), start(10) + 100 * MS);
    let all_old: BTreeMap<u32, u64> = (0..4).map(|p| (p, 10)).collect();
    let effects = m.marks(&all_old, start(10) + 110 * MS);
    assert_eq!(started(&effects).len(), 4);
    // Open from epoch 12: epoch 11 still runs the old generation.
    let effects = m.assigned(a(11, layout(4, 6, Some(12))), start(11) + 100 * MS);
    assert!(effects.is_empty(), "{effects:?}");
    // Epoch 12: the old units are released with marks, the new ones start
    // at once (no mark, no deadline) with the open epoch as their token.
    let effects = m.assigned(a(12, layout(4, 6, Some(12))), start(12) + 100 * MS);
    let new: Vec<(u32, u64)> = (0..6).map(|i| (unit(1, i), 12)).collect();
    assert_eq!(started(&effects), new);
    let drains = effects
        .iter()
        .filter(|e| matches!(e, Effect::Drain { partition, .. } if *partition < 4))
        .count();
    assert_eq!(drains, 4);
    for p in 0..4 {
        let marked = m.drained(p, start(12) + 150 * MS);
        assert_eq!(
            marked,
            vec![Effect::Mark {
                partition: p,
                epoch: 12
            }]
        );
    }
}

#[test]
fn an_instance_that_missed_the_open_epoch_waits_for_marks_as_ever() {
    let mut m = Partitions::new(timing(), 4);
    let a = |e| Assignment::modulo(e, 1, 2).with_layout(Some(layout(4, 6, Some(12))));
    m.assigned(a(13), start(13) + 100 * MS);
    // Its units had an owner in epoch 12: it waits for the mark or the
    // deadline, as any acquire.
    assert!(started(&m.tick(start(13) + 200 * MS)).is_empty());
    let deadline = timing().deadline(13);
    let effects = m.tick(deadline);
    assert_eq!(
        started(&effects),
        vec![(unit(1, 0), 13), (unit(1, 2), 13), (unit(1, 4), 13)]
    );
}

/// One instance of the model: its machine, and the units it runs.
struct Instance {
    machine: Partitions,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Instances come and go (each epoch a random count of them is
    /// assigned, the others miss it), while a reshard starts, drains and
    /// opens. At no step does a unit run on two instances; a unit starts
    /// only in an epoch where its generation is live; the new generation's
    /// tokens are all at least the open epoch, above every old token; each
    /// unit's tokens grow; and with steady membership every live unit runs.
    #[test]
    fn a_reshard_never_runs_a_unit_twice_nor_a_generation_out_of_its_epochs(
        from in 1u32..9,
        to in 1u32..9,
        replicas in proptest::collection::vec(1u32..5, 12),
        drain_at in 0usize..4,
        open_after in 0usize..4,
    ) {
        const FIRST: u64 = 100;
        let open_epoch = FIRST + (drain_at + open_after) as u64 + 2;
        let width = 4usize;
        let mut instances: Vec<Instance> = (0..width)
            .map(|_| Instance { machine: Partitions::new(timing(), from) })
            .collect();
        let mut marks: BTreeMap<u32, u64> = BTreeMap::new();
        let mut tokens: BTreeMap<u32, u64> = BTreeMap::new();
        let mut old_max = 0u64;
        let epochs = replicas.len() + 3;
        for step in 0..epochs {
            let e = FIRST + step as u64;
            // The layout a round of epoch e reads: written at the step
            // before the open epoch's round two rounds ahead.
            let draining = (step >= drain_at).then(|| layout(from, to, None));
            let open = Some(layout(from, to, Some(open_epoch)));
            let live = open.as_ref().map_or(0, |l| l.live(e).number);
            // The last three epochs are steady: every instance assigned.
            let n = replicas.get(step).copied().unwrap_or(width as u32) as usize;
            let now = start(e) + 100 * MS;
            let mut effects: Vec<(usize, Effect)> = Vec::new();
            for (i, inst) in instances.iter_mut().enumerate() {
                // Rounds of the open epoch or later read the open layout;
                // the two before it may or may not (written in between).
                let sees_open = e >= open_epoch || (e + 2 >= open_epoch && (i + step) % 2 == 0);
                let l = if sees_open { open.clone() } else { draining.clone() };
                let got = if i < n {
                    let a = Assignment::modulo(e, i as u32 + 1, n as u32).with_layout(l);
                    inst.machine.assigned(a, now)
                } else {
                    inst.machine.fence()
                };
                effects.extend(got.into_iter().map(|x| (i, x)));
            }
            // Then, in order: marks are read; the drains end and their
            // marks land, and are read; late in the epoch the deadlines
            // pass. A unit runs on two instances if one starts it while
            // another still owns or drains it.
            let mut drains: Vec<(usize, u32)> = Vec::new();
            for phase in 0..4 {
                let at = if phase == 3 { timing().deadline(e) } else { now + MS };
                match phase {
                    1 => {
                        for (i, inst) in instances.iter_mut().enumerate() {
                            effects.extend(inst.machine.marks(&marks, at).into_iter().map(|x| (i, x)));
                        }
                    }
                    2 => {
                        for (i, p) in std::mem::take(&mut drains) {
                            effects.extend(instances[i].machine.drained(p, at).into_iter().map(|x| (i, x)));
                        }
                    }
                    3 => {
                        for (i, inst) in instances.iter_mut().enumerate() {
                            effects.extend(inst.machine.marks(&marks, at).into_iter().map(|x| (i, x)));
                            effects.extend(inst.machine.tick(at).into_iter().map(|x| (i, x)));
                        }
                    }
                    _ => {}
                }
                for (i, effect) in effects.drain(..) {
                    match effect {
                        Effect::Drain { partition, .. } => drains.push((i, partition)),
                        Effect::Mark { partition, epoch } => {
                            let m = marks.entry(partition).or_default();
                            *m = (*m).max(epoch);
                        }
                        Effect::Start { partition, token } => {
                            let g = generation_of(partition);
                            prop_assert_eq!(g, live, "unit {} started in epoch {}", partition, e);
                            if g == 1 {
                                prop_assert!(token >= open_epoch);
                                prop_assert!(token > old_max);
                            } else {
                                old_max = old_max.max(token);
                            }
                            let before = tokens.insert(partition, token);
                            prop_assert!(before.is_none_or(|t| t < token), "unit {partition}: token {token} after {before:?}");
                        }
                    }
                }
                // No unit runs (owned, or draining) on two instances.
                let mut running: BTreeMap<u32, usize> = BTreeMap::new();
                for inst in &instances {
                    for (&u, s) in &inst.machine.states {
                        if matches!(s, State::Owned { .. } | State::Draining { .. }) {
                            *running.entry(u).or_default() += 1;
                        }
                    }
                }
                prop_assert!(running.values().all(|&c| c == 1), "epoch {e}, phase {phase}: {running:?}");
            }
            // Drains still open end before the next assignment.
            for (i, p) in drains {
                for effect in instances[i].machine.drained(p, now + I) {
                    if let Effect::Mark { partition, epoch } = effect {
                        let m = marks.entry(partition).or_default();
                        *m = (*m).max(epoch);
                    }
                }
            }
            let running: BTreeMap<u32, ()> = instances
                .iter()
                .flat_map(|inst| inst.machine.states.iter())
                .filter(|(_, s)| matches!(s, State::Owned { .. }))
                .map(|(&u, _)| (u, ()))
                .collect();
            // Steady membership, a step after it began: every live unit runs.
            if step + 1 == epochs {
                let units = if live == 1 { to } else { from };
                let want: Vec<u32> = (0..units).map(|i| unit(live, i)).collect();
                let have: Vec<u32> = running.keys().copied().collect();
                prop_assert_eq!(have, want);
            }
        }
    }
}
