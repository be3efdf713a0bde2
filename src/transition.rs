//! Drain-then-switch (docs/design.md §4): an explicit state machine per
//! partition, free of I/O.
//!
//! The machine is told what happens — an assignment arrived, marks were
//! read, time passed, a drain finished, the instance fenced itself or
//! leaves — and answers with [`Effect`]s for the runtime to carry out (stop
//! fetching and drain, write a mark, start fetching with a fencing token).
//! Every rule of §4 that decides *when* is here, so each has a unit test on
//! the machine alone; the runtime only does what it is told. The times the
//! rules compute (deadlines, drain ends, lease ends) are
//! [`Timing`](crate::timing::Timing)'s. All times are the instance's local
//! wall clock (durations since the Unix epoch).
//!
//! Rules 6 (leases), 8 (fenced writes) and 9 (tokens at the side effects)
//! act at the runtime's edges; the machine gives them the fencing token,
//! and [`Timing::lease_for`](crate::timing::Timing::lease_for) the lease.

use std::collections::BTreeMap;
use std::time::Duration;

use tracing::{debug, warn};

use crate::assignment::Assignment;
use crate::timing::Timing;

/// Where one partition stands on this instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Not this instance's, nothing pending.
    Idle,
    /// Rule 3: owned from `epoch` on, waiting for mark(p) >= `epoch` or the
    /// `deadline` (local) before fetching.
    Acquiring { epoch: u64, deadline: Duration },
    /// Fetching. `token` is the epoch it was acquired in (the fencing
    /// token); `epoch` the newest assignment that owns it.
    Owned { token: u64, epoch: u64 },
    /// Rule 1: released for `epoch`; running tasks finish until `until`
    /// (then are cancelled); once drained, mark(p) := `epoch` if `mark`.
    /// `then`: an acquire that must wait for this drain (the partition came
    /// back before its drain ended).
    Draining {
        epoch: u64,
        until: Duration,
        mark: bool,
        then: Option<(u64, Duration)>,
    },
    /// Rule 4: an acquire for `epoch` made moot by the assignment of
    /// `new_epoch`; it keeps waiting for its own condition, then marks
    /// `new_epoch` (marking at once would let the next owner in while the
    /// real old owner still drains). `then`: an acquire that waits for it
    /// (the partition came back meanwhile).
    Moot {
        epoch: u64,
        deadline: Duration,
        new_epoch: u64,
        then: Option<(u64, Duration)>,
    },
}

impl State {
    /// The same drain or moot wait, with `then` as the acquire waiting for
    /// it; other states are returned as they are.
    fn with_then(self, then: Option<(u64, Duration)>) -> State {
        match self {
            State::Draining {
                epoch, until, mark, ..
            } => State::Draining {
                epoch,
                until,
                mark,
                then,
            },
            State::Moot {
                epoch,
                deadline,
                new_epoch,
                ..
            } => State::Moot {
                epoch,
                deadline,
                new_epoch,
                then,
            },
            other => other,
        }
    }
}

/// What the runtime must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Record this instance as owner with `token`, claim the partition's
    /// pending entries, start fetching.
    Start { partition: u32, token: u64 },
    /// Stop fetching; let running tasks finish until `cancel_at`, then
    /// cancel them and wait; report [`Partitions::drained`].
    Drain { partition: u32, cancel_at: Duration },
    /// mark(p) := max(mark(p), `epoch`) in `{N}:transition`.
    Mark { partition: u32, epoch: u64 },
}

/// The state machines of all partitions of one instance.
#[derive(Debug)]
pub(crate) struct Partitions {
    timing: Timing,
    partitions: u32,
    states: BTreeMap<u32, State>,
    /// The epoch of the last assignment applied; `None` after a fence.
    last_epoch: Option<u64>,
}

impl Partitions {
    pub(crate) fn new(timing: Timing, partitions: u32) -> Self {
        Partitions {
            timing,
            partitions,
            states: BTreeMap::new(),
            last_epoch: None,
        }
    }

    /// The state of partition `p`.
    pub(crate) fn state(&self, p: u32) -> State {
        self.states.get(&p).copied().unwrap_or(State::Idle)
    }

    /// Partitions waiting for a mark (to poll `{N}:transition` for).
    pub(crate) fn waiting(&self) -> Vec<u32> {
        self.states
            .iter()
            .filter(|(_, s)| matches!(s, State::Acquiring { .. } | State::Moot { .. }))
            .map(|(p, _)| *p)
            .collect()
    }

    /// The earliest handover deadline of a pending acquire or moot wait.
    pub(crate) fn next_deadline(&self) -> Option<Duration> {
        self.states
            .values()
            .filter_map(|s| match s {
                State::Acquiring { deadline, .. } | State::Moot { deadline, .. } => Some(*deadline),
                _ => None,
            })
            .min()
    }

    /// Whether nothing is owned, pending or draining.
    pub(crate) fn is_idle(&self) -> bool {
        self.states.is_empty()
    }

    /// The fencing token of a partition this instance fetches.
    #[cfg(test)]
    pub(crate) fn token(&self, p: u32) -> Option<u64> {
        match self.state(p) {
            State::Owned { token, .. } => Some(token),
            _ => None,
        }
    }

    /// An assignment arrived at local time `now` (rules 1–5).
    pub(crate) fn assigned(&mut self, a: Assignment, now: Duration) -> Vec<Effect> {
        let e = a.epoch;
        // The same epoch again (a repeated delivery) changes nothing.
        if self.last_epoch == Some(e) {
            return Vec::new();
        }
        // Rule 6: an assignment that arrives after its own lease vouches
        // for nothing; behave as after a lapsed lease.
        if self.timing.lease_for(e, now).is_none() {
            return self.fence();
        }
        let mut effects = Vec::new();
        // Rule 5: after a skipped epoch, nothing held before is trusted.
        // Said like every other fence, so an operator (and the scenario
        // tests) can tell this stop from a paused kept partition.
        if let Some(last) = self.last_epoch.filter(|last| last + 1 != e) {
            if !self.is_idle() {
                warn!(
                    last,
                    epoch = e,
                    "an epoch was skipped; fencing every partition"
                );
            }
            effects.extend(self.fence());
        }
        // Rule 2: only the owner under E - 1 may mark E.
        let continuous = self.last_epoch == Some(e.wrapping_sub(1));
        self.last_epoch = Some(e);
        let deadline = self.timing.deadline(e);
        for p in 0..self.partitions {
            let owns = a.owns(p, self.partitions);
            let from = self.state(p);
            let to = match (from, owns) {
                (State::Idle, false) => State::Idle,
                (State::Idle, true) => State::Acquiring { epoch: e, deadline },
                // Kept partitions never pause.
                (State::Owned { token, .. }, true) => State::Owned { token, epoch: e },
                (
                    State::Owned {
                        epoch: owned_in, ..
                    },
                    false,
                ) => self.release(p, e, now, continuous && owned_in + 1 == e, &mut effects),
                // Rule 4: a pending acquire still owned keeps its epoch and
                // deadline (restarting it starves a dead owner's partitions).
                (acquiring @ State::Acquiring { .. }, true) => acquiring,
                (State::Acquiring { epoch, deadline }, false) => State::Moot {
                    epoch,
                    deadline,
                    new_epoch: e,
                    then: None,
                },
                // A drain or a moot wait goes on; if the partition comes
                // back, it is acquired anew (keeping the first such epoch)
                // once that is over.
                (waiting @ (State::Draining { then, .. } | State::Moot { then, .. }), owns) => {
                    waiting.with_then(owns.then(|| then.unwrap_or((e, deadline))))
                }
            };
            self.set(p, from, to);
        }
        effects.extend(self.settle(now, &BTreeMap::new()));
        effects
    }

    /// Rule 8: Redis refused a fenced write on `p` owned with `token`:
    /// another instance holds it now. Only `p` stops (cancelled now, no
    /// mark: this instance's ownership is not vouched for); a later
    /// assignment that still owns it acquires it anew through the deadline.
    pub(crate) fn lost(&mut self, p: u32, token: u64) -> Vec<Effect> {
        let from = self.state(p);
        if !matches!(from, State::Owned { token: t, .. } if t == token) {
            // Released or acquired anew since: the refusal is old news.
            return Vec::new();
        }
        let mut effects = Vec::new();
        let to = Self::stop_now(p, &mut effects);
        self.set(p, from, to);
        effects
    }

    /// Rule 5: a skipped epoch, a lapsed lease or a failed round. Everything
    /// owned stops at once (cancelled now, no mark: its ownership is no
    /// longer vouched for), pending acquires are dropped, and the next
    /// assignment acquires anew through marks and deadlines.
    pub(crate) fn fence(&mut self) -> Vec<Effect> {
        let mut effects = Vec::new();
        self.last_epoch = None;
        for p in 0..self.partitions {
            let from = self.state(p);
            let to = match from {
                State::Owned { .. } => Self::stop_now(p, &mut effects),
                // Its release was vouched for before the fence: the mark
                // it will write after the drain is still true.
                draining @ State::Draining { .. } => draining.with_then(None),
                State::Acquiring { .. } | State::Moot { .. } | State::Idle => State::Idle,
            };
            self.set(p, from, to);
        }
        effects
    }

    /// Rule 7: a graceful leave, at round `number`, the first without an
    /// index. Everything owned is released for `number` with marks (if the
    /// last assignment was `number - 1`), so successors need not wait for
    /// the deadline; pending acquires become moot.
    pub(crate) fn leave(&mut self, number: u64, now: Duration) -> Vec<Effect> {
        let mut effects = Vec::new();
        let continuous = self.last_epoch == Some(number.wrapping_sub(1));
        self.last_epoch = None;
        for p in 0..self.partitions {
            let from = self.state(p);
            let to = match from {
                State::Owned {
                    epoch: owned_in, ..
                } => self.release(
                    p,
                    number,
                    now,
                    continuous && owned_in + 1 == number,
                    &mut effects,
                ),
                // Rule 2: a pending acquire may only chain a mark if this
                // instance was the owner under `number - 1`.
                State::Acquiring { epoch, deadline } if continuous => State::Moot {
                    epoch,
                    deadline,
                    new_epoch: number,
                    then: None,
                },
                State::Acquiring { .. } => State::Idle,
                waiting @ (State::Draining { .. } | State::Moot { .. }) => waiting.with_then(None),
                State::Idle => State::Idle,
            };
            self.set(p, from, to);
        }
        effects.extend(self.settle(now, &BTreeMap::new()));
        effects
    }

    /// Marks read from `{N}:transition` at local time `now` (rule 3).
    pub(crate) fn marks(&mut self, marks: &BTreeMap<u32, u64>, now: Duration) -> Vec<Effect> {
        self.settle(now, marks)
    }

    /// Time passed: deadlines (rule 3).
    pub(crate) fn tick(&mut self, now: Duration) -> Vec<Effect> {
        self.settle(now, &BTreeMap::new())
    }

    /// The runtime finished draining `p`: running tasks finished or were
    /// cancelled and awaited, and what finished is acked (rule 1). Only
    /// now is the mark written.
    pub(crate) fn drained(&mut self, p: u32, now: Duration) -> Vec<Effect> {
        let mut effects = Vec::new();
        let from = self.state(p);
        let State::Draining {
            epoch, mark, then, ..
        } = from
        else {
            return effects;
        };
        if mark {
            effects.push(Effect::Mark {
                partition: p,
                epoch,
            });
        }
        let to = match then {
            Some((epoch, deadline)) => State::Acquiring { epoch, deadline },
            None => State::Idle,
        };
        self.set(p, from, to);
        effects.extend(self.settle(now, &BTreeMap::new()));
        effects
    }

    /// Rule 1: releases owned `p` for epoch `e` (an assignment or a leave
    /// that arrived at `now`); `mark`: whether its release is vouched for.
    fn release(
        &self,
        p: u32,
        e: u64,
        now: Duration,
        mark: bool,
        effects: &mut Vec<Effect>,
    ) -> State {
        let until = self.timing.drain_end(e, now);
        effects.push(Effect::Drain {
            partition: p,
            cancel_at: until,
        });
        State::Draining {
            epoch: e,
            until,
            mark,
            then: None,
        }
    }

    /// Rules 5 and 8: stops owned `p` at once (cancelled now), no mark.
    fn stop_now(p: u32, effects: &mut Vec<Effect>) -> State {
        effects.push(Effect::Drain {
            partition: p,
            cancel_at: Duration::ZERO,
        });
        State::Draining {
            epoch: 0,
            until: Duration::ZERO,
            mark: false,
            then: None,
        }
    }

    /// Whether any partition waits for a mark.
    pub(crate) fn is_waiting(&self) -> bool {
        self.states
            .values()
            .any(|s| matches!(s, State::Acquiring { .. } | State::Moot { .. }))
    }

    /// Completes the waits whose condition holds: mark(p) >= epoch, or the
    /// deadline passed.
    fn settle(&mut self, now: Duration, marks: &BTreeMap<u32, u64>) -> Vec<Effect> {
        let mut effects = Vec::new();
        // Twice: a finished moot wait can start an acquire that is done too.
        for p in (0..self.partitions).chain(0..self.partitions) {
            let from = self.state(p);
            let done = |epoch: u64, deadline: Duration| {
                now >= deadline || marks.get(&p).is_some_and(|m| *m >= epoch)
            };
            let to = match from {
                State::Acquiring { epoch, deadline } if done(epoch, deadline) => {
                    effects.push(Effect::Start {
                        partition: p,
                        token: epoch,
                    });
                    State::Owned {
                        token: epoch,
                        epoch: self.last_epoch.unwrap_or(epoch),
                    }
                }
                State::Moot {
                    epoch,
                    deadline,
                    new_epoch,
                    then,
                } if done(epoch, deadline) => {
                    effects.push(Effect::Mark {
                        partition: p,
                        epoch: new_epoch,
                    });
                    match then {
                        Some((epoch, deadline)) => State::Acquiring { epoch, deadline },
                        None => State::Idle,
                    }
                }
                other => other,
            };
            self.set(p, from, to);
        }
        effects
    }

    fn set(&mut self, p: u32, from: State, to: State) {
        if from != to {
            debug!(partition = p, ?from, ?to, "partition");
        }
        if to == State::Idle {
            self.states.remove(&p);
        } else {
            self.states.insert(p, to);
        }
    }
}

#[cfg(test)]
mod tests {
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
        assert!(
            matches!(m.state(1), State::Moot { epoch: E, new_epoch, .. } if new_epoch == E + 1)
        );
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
}
