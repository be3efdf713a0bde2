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
//!
//! A machine can also move singletons (docs/design.md §20): unit
//! `partitions + k` is the `k`-th singleton name, held where the
//! assignment places that name, under the same rules.
//!
//! Partitions are units of a generation (docs/design.md §21): the units an
//! assignment may own are those of the generation its layout makes live in
//! its epoch, and a generation's units are acquired at once in the first
//! epoch it is live after a reshard (no instance owned them before).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};

use tokio::time::Instant;

use crate::assignment::Assignment;
use crate::lease::Lease;
use crate::partition;
use crate::reshard::Generation;
use crate::timing::Timing;

mod state;

pub(crate) use state::{Effect, State};

/// The state machines of all partitions of one instance.
#[derive(Debug)]
pub(crate) struct Partitions {
    timing: Timing,
    /// Generation 0's units: its partitions times the levels.
    partitions: u32,
    /// The priority levels (docs/design.md §17): a generation of `P`
    /// partitions has `P * levels` units.
    levels: u32,
    /// The singletons' names: unit `partitions + k` is `singletons[k]`.
    singletons: Vec<Arc<str>>,
    states: BTreeMap<u32, State>,
    /// The epoch of the last assignment applied; `None` after a fence.
    last_epoch: Option<u64>,
}

impl Partitions {
    pub(crate) fn new(timing: Timing, partitions: u32) -> Self {
        Partitions {
            timing,
            partitions,
            levels: 1,
            singletons: Vec::new(),
            states: BTreeMap::new(),
            last_epoch: None,
        }
    }

    /// A machine of singletons alone: unit `k` is `names[k]`.
    pub(crate) fn singletons(timing: Timing, names: Vec<Arc<str>>) -> Self {
        Partitions {
            timing,
            partitions: 0,
            levels: 1,
            singletons: names,
            states: BTreeMap::new(),
            last_epoch: None,
        }
    }

    /// A machine of partitions with `levels` priority levels (its
    /// `partitions` are generation 0's units, every level's).
    pub(crate) fn with_levels(mut self, levels: u32) -> Self {
        self.levels = levels.max(1);
        self
    }

    /// The generation whose units assignment `a` may own, and its unit
    /// count: generation 0 while the service was never resharded.
    fn live(&self, a: &Assignment) -> (Generation, u32) {
        let live = a.layout().map_or(
            Generation {
                number: 0,
                partitions: self.partitions / self.levels,
            },
            |l| l.live(a.epoch),
        );
        (live, live.partitions * self.levels)
    }

    /// The units assignment `a` may concern: the live generation's, the
    /// singletons', and every unit with a state here.
    fn units(&self, a: &Assignment) -> BTreeSet<u32> {
        let mut units: BTreeSet<u32> = self.states.keys().copied().collect();
        if self.partitions > 0 {
            units.extend(self.live(a).0.units(self.levels));
        }
        units.extend(self.partitions..self.partitions + self.singletons.len() as u32);
        units
    }

    /// The units with a state: all that a fence, a leave or a mark can
    /// change (an idle unit stays idle).
    fn stated(&self) -> Vec<u32> {
        self.states.keys().copied().collect()
    }

    /// Whether assignment `a` owns unit `u`.
    fn owns(&self, a: &Assignment, u: u32) -> bool {
        if partition::generation_of(u) == 0
            && let Some(k) = u.checked_sub(self.partitions)
        {
            return self
                .singletons
                .get(k as usize)
                .is_some_and(|name| a.holds_singleton(name));
        }
        let (live, units) = self.live(a);
        partition::generation_of(u) == live.number
            && partition::index_of(u) < units
            && a.owns_unit(u, units)
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
        // A generation's first live epoch after a reshard: no instance
        // owned its units before, so nothing is waited for.
        let fresh = a.layout().and_then(|l| {
            l.first_epoch(l.current.number)
                .map(|o| (l.current.number, o))
        });
        for p in self.units(&a) {
            let owns = self.owns(&a, p);
            let from = self.state(p);
            let to = match (from, owns) {
                (State::Idle, false) => State::Idle,
                (State::Idle, true) if fresh == Some((partition::generation_of(p), e)) => {
                    State::Acquiring {
                        epoch: e,
                        deadline: now,
                    }
                }
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
        for p in self.stated() {
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
        for p in self.stated() {
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
        let stated = self.stated();
        for p in stated.iter().chain(&stated).copied() {
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

/// When a handover driver (the partitions', the singletons') must wake up
/// next: the lease's end (if `leased`), `machine`'s next handover
/// deadline, or `poll`, the next read of the marks (if one is due).
pub(crate) fn wake_at(
    machine: &Partitions,
    lease: &Lease,
    leased: bool,
    poll: Option<Instant>,
) -> Instant {
    let now = Instant::now();
    let now_wall = lease.now();
    let mut wake = now + Duration::from_secs(3600);
    if leased {
        wake = wake.min(now + lease.left().unwrap_or_default());
    }
    if let Some(deadline) = machine.next_deadline() {
        wake = wake.min(now + deadline.saturating_sub(now_wall));
    }
    if let Some(poll) = poll {
        wake = wake.min(poll);
    }
    wake
}

#[cfg(test)]
mod reshard_tests;
#[cfg(test)]
mod tests;
