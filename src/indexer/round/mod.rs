//! The round loop: one task per instance that runs a round per interval
//! and publishes the instance's [`Standing`].

use std::sync::Arc;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

mod backend;
#[cfg(feature = "etcd")]
mod etcd;
mod script;
mod skew;

use script::Written;

use super::listed::{Listed, Read};
use super::liveness::Liveness;
use super::schedule::{Plan, Schedule};
use crate::assignment::{Assignment, Assignor};
use crate::assignment::{FenceReason, Standing};
use crate::clock::Clock;
use crate::config::ServiceName;
use crate::connection::{Backend, Conn, SharedConnection};
use crate::error::{Error, Result};
use crate::indexer::IndexerSettings;
use crate::instance::InstanceId;
use crate::metrics as m;
use crate::presence::Presence;
use crate::reshard::Layout;

/// How long a round key lives, in intervals: it is written during one
/// interval and read in the next round, at most 1.5 intervals later.
const ROUND_KEY_TTL_INTERVALS: u32 = 3;

/// The round this instance was last counted in.
#[derive(Debug, Clone, Copy)]
struct Counted {
    number: u64,
    /// `Incr` only: the value `INCR` returned, the index for epoch `number + 1`.
    incr_value: Option<u64>,
}

/// The state of the round task.
pub(super) struct RoundLoop {
    name: ServiceName,
    id: InstanceId,
    settings: IndexerSettings,
    schedule: Schedule,
    clock: Arc<dyn Clock>,
    /// The connection the rounds use, replaced after any failed round.
    conn: SharedConnection,
    tx: watch::Sender<Standing>,
    /// Set only by a round whose write succeeded, and cleared by any round
    /// that did not write: an instance that missed a round must not claim an
    /// index from an older one.
    counted: Option<Counted>,
    /// Whether the last clock check found the clock beyond the tolerated
    /// skew. While it is, rounds write nothing (and the error is logged once
    /// per episode, not every round).
    clock_fenced: bool,
    /// A consumer's live values, sent alongside each round.
    presence: Option<Arc<Presence>>,
    /// A consumer runtime's sign of life; `silent`: its last round saw
    /// none for an interval.
    liveness: Option<Arc<Liveness>>,
    silent: bool,
    /// Rendezvous: the last round's members this instance read.
    listed: Listed,
    /// The etcd side of the rounds, when the membership is there
    /// (docs/design.md §2.2).
    #[cfg(feature = "etcd")]
    etcd: Option<etcd::EtcdRounds>,
}

impl RoundLoop {
    pub(super) fn new(
        name: ServiceName,
        id: InstanceId,
        settings: IndexerSettings,
        schedule: Schedule,
        clock: Arc<dyn Clock>,
        backend: Backend,
        tx: watch::Sender<Standing>,
    ) -> Self {
        RoundLoop {
            name,
            id,
            settings,
            schedule,
            clock,
            // Made on the rounds' own runtime (`thread`).
            conn: SharedConnection::made_here(backend),
            tx,
            counted: None,
            clock_fenced: false,
            presence: None,
            liveness: None,
            silent: false,
            listed: Listed::default(),
            #[cfg(feature = "etcd")]
            etcd: None,
        }
    }

    /// Claims nothing while a consumer's runtime is silent ([`Liveness`]).
    pub(super) fn with_liveness(mut self, liveness: Option<Arc<Liveness>>) -> Self {
        self.liveness = liveness;
        self
    }

    /// Whether the consumer's runtime (if any) showed life within the last
    /// interval; says so in the log when that changes.
    fn runtime_alive(&mut self) -> bool {
        let Some(liveness) = &self.liveness else {
            return true;
        };
        let silent_for = liveness.silent_for();
        let silent = silent_for >= self.settings.interval;
        if silent && !self.silent {
            error!(service = %self.name, silent_for = ?silent_for,
                   "the consumer's runtime has not run for an interval; claiming no index until it does");
        } else if !silent && self.silent {
            info!(service = %self.name, "the consumer's runtime runs again");
        }
        self.silent = silent;
        !silent
    }

    /// Sends a consumer's members record and counts with each round.
    pub(super) fn with_presence(mut self, presence: Option<Arc<Presence>>) -> Self {
        self.presence = presence;
        self
    }

    pub(super) async fn run(mut self, stop: CancellationToken, leave: CancellationToken) {
        let mut n = self.schedule.first_round_from(self.clock.now());
        loop {
            let wait = self.schedule.round_time(n).saturating_sub(self.clock.now());
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            // Stopping drops a round in flight: a write that still lands
            // leaves this instance's index unheld for one epoch, no worse.
            let standing = tokio::select! {
                _ = stop.cancelled() => return,
                standing = self.round(n, leave.is_cancelled()) => standing,
            };
            let left = matches!(standing, Standing::Left { .. });
            self.publish(standing);
            if left {
                self.forget().await;
                return;
            }
            n = self.schedule.next_round(n, self.clock.now());
        }
    }

    /// Runs round `n` to its standing. Any failure clears `counted`.
    async fn round(&mut self, n: u64, leaving: bool) -> Standing {
        let number = self.schedule.number(n);
        let prev = self.counted.filter(|c| c.number == number - 1);
        // A leaving instance that was not counted in the previous round has
        // nothing left to serve: it is gone, with or without Redis.
        if leaving && prev.is_none() {
            return Standing::Left { epoch: number };
        }
        let now = self.clock.now();
        let deadline = match self.schedule.plan(n, now) {
            Plan::OnTime { deadline, .. } => deadline,
            Plan::Late { into, .. } => {
                self.counted = None;
                return Standing::Fenced {
                    epoch: number,
                    reason: FenceReason::LateRound { into },
                };
            }
        };
        // A reply after the deadline may mean the write landed after others
        // read the count: treat it as failed at once instead of waiting for
        // a slow Redis error (docs/design.md §4 rule 6).
        let budget = deadline.saturating_sub(now);
        let outcome = tokio::time::timeout(budget, self.exchange(number, leaving, prev)).await;
        match outcome.unwrap_or(Err(Error::Timeout(budget))) {
            Ok(standing) => standing,
            Err(e) => {
                self.counted = None;
                // An etcd failure says nothing of the Redis connection.
                #[cfg(feature = "etcd")]
                let redis_failed = !matches!(e, Error::Etcd { .. });
                #[cfg(not(feature = "etcd"))]
                let redis_failed = true;
                if redis_failed {
                    self.conn.reset();
                }
                Standing::Fenced {
                    epoch: number,
                    reason: FenceReason::RoundFailed {
                        error: e.to_string(),
                    },
                }
            }
        }
    }

    /// The round's work, in one round trip (on etcd, one to each store at
    /// once): write this round, read the previous one, and measure the
    /// clock against Redis's.
    ///
    /// The clock measured in a round decides whether the next round writes:
    /// an instance whose clock went off in this round has already written,
    /// so it is counted once more without claiming the index (one epoch with
    /// that index unheld), which is safe; one whose clock was already off
    /// writes nothing until it is back within the skew.
    async fn exchange(
        &mut self,
        number: u64,
        leaving: bool,
        prev: Option<Counted>,
    ) -> Result<Standing> {
        let mut conn = self.conn.get().await?;
        self.tell(&conn, leaving);
        let write = !leaving && !self.clock_fenced && self.runtime_alive();
        let before = self.clock.now();
        let reply = self
            .write_and_read_any(&mut conn, number, write, prev)
            .await?;
        let after = self.clock.now();
        self.counted = None;
        if let Some(reason) = self.judge_clock(before, after, reply.redis_now) {
            return Ok(Standing::Fenced {
                epoch: number,
                reason,
            });
        }
        // Defensive on Redis: a reply in time from a script that ran after
        // the window means the clock stepped during the round. On etcd:
        // the round was closed before the registration came.
        if let Some(error) = reply.written.refusal() {
            return Ok(Standing::Fenced {
                epoch: number,
                reason: FenceReason::RoundFailed { error },
            });
        }
        if let Written::Yes(incr_value) = reply.written {
            self.counted = Some(Counted { number, incr_value });
        }
        Ok(match reply.prev {
            Some((index, replicas)) => {
                self.assignment(number, index, replicas, reply.members, reply.layout)
            }
            None if *self.tx.borrow() == Standing::Joining => Standing::Joining,
            None => Standing::Fenced {
                epoch: number,
                reason: FenceReason::NotCounted,
            },
        })
    }

    /// Sends the consumer's members record and counts, if any, with the
    /// round ([`Presence::send`]).
    fn tell(&self, conn: &Conn, leaving: bool) {
        if let Some(presence) = &self.presence {
            let current = self.tx.borrow().clone();
            let interval = self.settings.interval;
            presence.send(conn, &self.name, &self.id, &current, leaving, interval);
        }
    }

    /// Removes this instance's members record once it has left, and gives
    /// its etcd lease back.
    async fn forget(&mut self) {
        #[cfg(feature = "etcd")]
        if let Some(etcd) = self.etcd.as_mut() {
            let _ = tokio::time::timeout(self.settings.interval, etcd.leave()).await;
        }
        if self.presence.is_none() {
            return;
        }
        let forget = async {
            let mut conn = self.conn.get().await?;
            Presence::leave(&mut conn, &self.name, &self.id).await
        };
        match tokio::time::timeout(self.settings.interval, forget).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                debug!(service = %self.name, cause = %e, "members record not removed; it goes stale")
            }
            Err(_) => {
                debug!(service = %self.name, "members record not removed in time; it goes stale")
            }
        }
    }

    /// The standing for epoch `number` from the previous round's index,
    /// count and (rendezvous) members: an assignment only if
    /// `1 <= index <= replicas` and, under rendezvous, the list holds this
    /// instance and as many members as the count says.
    fn assignment(
        &mut self,
        number: u64,
        index: Option<u64>,
        replicas: Option<u64>,
        read: Read,
        layout: Option<Arc<Layout>>,
    ) -> Standing {
        let (index, replicas) = (index.unwrap_or(0), replicas.unwrap_or(0));
        if let Some(a) = checked_assignment(number, index, replicas) {
            if self.settings.assignor == Assignor::Modulo {
                return Standing::Assigned(a.with_layout(layout));
            }
            let members = self.listed.members(number, read);
            let listed = members.as_ref().map_or(0, |m| m.list().len());
            if let Some(members) = members.filter(|_| listed as u64 == replicas)
                && let Some(me) = members.position(self.id.as_str())
            {
                let a = Assignment::rendezvous(number, a.index, a.replicas, members, me);
                return Standing::Assigned(a.with_layout(layout));
            }
            // Never a guess: without this instance in a full list the
            // epoch's owners are unknown here, so the epoch is missed.
            error!(
                service = %self.name,
                instance = %self.id,
                epoch = number,
                listed,
                replicas,
                "round key's member list does not hold this instance or disagrees with its count"
            );
            return Standing::Fenced {
                epoch: number,
                reason: FenceReason::Inconsistent { index, replicas },
            };
        }
        // The previous round's key is gone or no longer holds this instance:
        // something outside the protocol changed it.
        error!(
            service = %self.name,
            instance = %self.id,
            epoch = number,
            index,
            replicas,
            "round key holds counts that break 1 <= index <= replicas"
        );
        Standing::Fenced {
            epoch: number,
            reason: FenceReason::Inconsistent { index, replicas },
        }
    }

    /// Publishes a round's standing, logging every change.
    fn publish(&self, standing: Standing) {
        let service = self.name.to_string();
        let outcome = match &standing {
            Standing::Joining => "joining",
            Standing::Assigned(_) => "assigned",
            Standing::Fenced { .. } => "fenced",
            Standing::Left { .. } => "left",
        };
        metrics::counter!(m::ROUNDS_TOTAL, "service" => service.clone(), "outcome" => outcome)
            .increment(1);
        let a = standing.assignment();
        metrics::gauge!(m::INDEX, "service" => service.clone())
            .set(a.as_ref().map_or(0.0, |a| f64::from(a.index)));
        metrics::gauge!(m::REPLICAS, "service" => service)
            .set(a.map_or(0.0, |a| f64::from(a.replicas)));

        let from = self.tx.borrow().clone();
        match (&from, &standing) {
            (Standing::Assigned(old), Standing::Assigned(new))
                if (old.index, old.replicas) == (new.index, new.replicas) => {}
            (_, Standing::Assigned(new)) => {
                info!(service = %self.name, instance = %self.id, epoch = new.epoch, index = new.index, replicas = new.replicas, "assigned");
            }
            (Standing::Fenced { reason: old, .. }, Standing::Fenced { reason, .. })
                if std::mem::discriminant(old) == std::mem::discriminant(reason) => {}
            (_, Standing::Fenced { epoch, reason }) => {
                warn!(service = %self.name, instance = %self.id, epoch, %reason, "fenced: no assignment");
            }
            (_, Standing::Left { epoch }) => {
                info!(service = %self.name, instance = %self.id, epoch, "left the service");
            }
            _ => {}
        }
        debug!(service = %self.name, from = ?from, to = ?standing, "standing");
        self.tx.send_replace(standing);
    }
}

/// The (modulo) assignment for `epoch`, if `1 <= index <= replicas`.
fn checked_assignment(epoch: u64, index: u64, replicas: u64) -> Option<Assignment> {
    let (index, replicas) = (u32::try_from(index).ok()?, u32::try_from(replicas).ok()?);
    (1 <= index && index <= replicas).then(|| Assignment::modulo(epoch, index, replicas))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Nothing outside `1 <= index <= replicas` is ever an assignment.
        #[test]
        fn assignments_keep_index_within_replicas(index in 0u64..10_000_000_000, replicas in 0u64..10_000_000_000) {
            match checked_assignment(9, index, replicas) {
                Some(a) => {
                    prop_assert!(1 <= a.index && a.index <= a.replicas);
                    prop_assert_eq!((u64::from(a.index), u64::from(a.replicas), a.epoch), (index, replicas, 9));
                }
                None => prop_assert!(index == 0 || index > replicas || replicas > u64::from(u32::MAX)),
            }
        }
    }
}
