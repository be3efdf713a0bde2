//! The round loop: one task per instance that writes a round per interval
//! and publishes the instance's [`Standing`].

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::Pool;
use deadpool_redis::redis::{self, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::schedule::{Plan, Schedule};
use super::{FenceReason, Standing};
use crate::assignment::Assignment;
use crate::clock::{Clock, signed_secs};
use crate::config::{IndexerSettings, Indexing, ServiceName};
use crate::error::{Error, Result};
use crate::instance::InstanceId;
use crate::{keys, metrics as m};

/// How long a round key lives, in intervals: it is written during one
/// interval and read in the next round, at most 1.5 intervals later.
const ROUND_KEY_TTL_INTERVALS: u32 = 3;

/// The round this instance was last counted in.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counted {
    number: u64,
    /// `Incr` only: the value `INCR` returned, the index for epoch `number + 1`.
    index: u64,
}

/// The state of the round task.
pub(super) struct RoundLoop {
    pub(super) name: ServiceName,
    pub(super) id: InstanceId,
    pub(super) settings: IndexerSettings,
    pub(super) schedule: Schedule,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) pool: Pool,
    pub(super) tx: watch::Sender<Standing>,
    /// Set only by a round whose write succeeded, and cleared by any round
    /// that did not write: an instance that missed a round must not claim an
    /// index from an older one.
    pub(super) counted: Option<Counted>,
    /// Whether the last clock check found the clock beyond the tolerated
    /// skew (so the error is logged once per episode, not every round).
    pub(super) clock_fenced: bool,
}

impl RoundLoop {
    pub(super) async fn run(mut self, stop: CancellationToken, leave: CancellationToken) {
        let mut n = self.schedule.first_round_from(self.clock.now());
        loop {
            let wait = self.schedule.round_time(n).saturating_sub(self.clock.now());
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let standing = self.round(n, leave.is_cancelled()).await;
            let left = matches!(standing, Standing::Left { .. });
            self.publish(standing);
            if left {
                return;
            }
            n = self.schedule.next_round(n, self.clock.now());
        }
    }

    /// Runs round `n` to its standing. Any failure clears `counted`.
    async fn round(&mut self, n: u64, leaving: bool) -> Standing {
        let now = self.clock.now();
        let (number, deadline) = match self.schedule.plan(n, now) {
            Plan::OnTime { number, deadline } => (number, deadline),
            Plan::Late { number, into } => {
                self.counted = None;
                return Standing::Fenced {
                    epoch: number,
                    reason: FenceReason::LateRound { into },
                };
            }
        };
        // A reply after the deadline may mean the write landed after others
        // read the count: treat it as failed at once instead of waiting for
        // a slow Redis error (DESIGN.md §4 rule 6).
        let budget = deadline.saturating_sub(now);
        let outcome = tokio::time::timeout(budget, self.exchange(number, leaving)).await;
        match outcome.unwrap_or(Err(Error::Timeout(budget))) {
            Ok(standing) => standing,
            Err(e) => {
                self.counted = None;
                Standing::Fenced {
                    epoch: number,
                    reason: FenceReason::RoundFailed {
                        error: e.to_string(),
                    },
                }
            }
        }
    }

    /// The round's Redis work: the clock check, then one pipelined round
    /// trip that writes this round and reads the previous one.
    async fn exchange(&mut self, number: u64, leaving: bool) -> Result<Standing> {
        let mut conn = self.pool.get().await?;
        if let Some(reason) = self.check_clock(&mut conn).await? {
            self.counted = None;
            return Ok(Standing::Fenced {
                epoch: number,
                reason,
            });
        }
        let key = keys::round(&self.name, number);
        let prev_key = keys::round(&self.name, number - 1);
        let prev = self.counted.filter(|c| c.number == number - 1);
        let ttl = u64::try_from((self.settings.interval * ROUND_KEY_TTL_INTERVALS).as_millis())
            .unwrap_or(u64::MAX);

        let mut pipe = redis::pipe();
        // A leaving instance reads what it earned but writes no more rounds.
        if !leaving {
            match self.settings.indexing {
                Indexing::Ranked => {
                    // The score is the offset: the rank is the order in which
                    // instances act, decided by the offsets, not by the network.
                    let score = self.schedule.offset().as_micros() as f64;
                    pipe.zadd(&key, self.id.as_str(), score).ignore();
                }
                Indexing::Incr => {
                    pipe.incr(&key, 1u64);
                }
            }
            pipe.pexpire(&key, ttl as i64).ignore();
        }
        if prev.is_some() {
            match self.settings.indexing {
                Indexing::Ranked => pipe.zrank(&prev_key, self.id.as_str()).zcard(&prev_key),
                Indexing::Incr => pipe.get(&prev_key),
            };
        }
        let values: Vec<Value> = if pipe.cmd_iter().next().is_some() {
            pipe.query_async(&mut *conn).await?
        } else {
            Vec::new()
        };
        let mut values = values.into_iter();

        self.counted = None;
        if !leaving {
            let index = match self.settings.indexing {
                Indexing::Incr => parse(next(&mut values)?)?,
                Indexing::Ranked => 0,
            };
            self.counted = Some(Counted { number, index });
        }
        let Some(prev) = prev else {
            return Ok(if leaving {
                Standing::Left { epoch: number }
            } else if *self.tx.borrow() == Standing::Joining {
                Standing::Joining
            } else {
                Standing::Fenced {
                    epoch: number,
                    reason: FenceReason::NotCounted,
                }
            });
        };
        let (index, replicas): (Option<u64>, Option<u64>) = match self.settings.indexing {
            Indexing::Ranked => {
                let rank: Option<u64> = parse(next(&mut values)?)?;
                let card: u64 = parse(next(&mut values)?)?;
                (rank.map(|r| r + 1), Some(card))
            }
            Indexing::Incr => (Some(prev.index), parse(next(&mut values)?)?),
        };
        Ok(assignment(number, index, replicas))
    }

    /// Measures this instance's clock against Redis `TIME`, corrected by
    /// half the round trip. Returns the fence reason while the offset
    /// exceeds the tolerated skew.
    pub(super) async fn check_clock(
        &mut self,
        conn: &mut deadpool_redis::Connection,
    ) -> Result<Option<FenceReason>> {
        let before = self.clock.now();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut **conn).await?;
        let after = self.clock.now();
        let local = before + (after.saturating_sub(before)) / 2;
        let server = Duration::from_secs(secs) + Duration::from_micros(micros);
        let offset = signed_secs(local, server);
        metrics::gauge!(m::CLOCK_OFFSET_SECONDS, "service" => self.name.to_string()).set(offset);
        let tolerated = self.settings.skew;
        if offset.abs() <= tolerated.as_secs_f64() {
            if self.clock_fenced {
                self.clock_fenced = false;
                info!(service = %self.name, offset_ms = offset * 1e3, "clock back within the tolerated skew");
            }
            return Ok(None);
        }
        if !self.clock_fenced {
            self.clock_fenced = true;
            error!(
                service = %self.name,
                instance = %self.id,
                offset_ms = offset * 1e3,
                tolerated_ms = tolerated.as_secs_f64() * 1e3,
                "clock offset against redis TIME exceeds the tolerated skew: fencing this instance until it is back within"
            );
        }
        Ok(Some(FenceReason::ClockSkew {
            offset_us: (offset * 1e6) as i64,
            tolerated,
        }))
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
            .set(a.map_or(0.0, |a| f64::from(a.index)));
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

/// The standing for epoch `number` from the previous round's index and count.
fn assignment(number: u64, index: Option<u64>, replicas: Option<u64>) -> Standing {
    match (index, replicas) {
        (Some(index), Some(replicas)) if 1 <= index && index <= replicas => {
            match (u32::try_from(index), u32::try_from(replicas)) {
                (Ok(index), Ok(replicas)) => Standing::Assigned(Assignment {
                    epoch: number,
                    index,
                    replicas,
                }),
                _ => inconsistent(number, index, replicas),
            }
        }
        // The previous round's key is gone or no longer holds this instance:
        // something outside the protocol changed it.
        (index, replicas) => inconsistent(number, index.unwrap_or(0), replicas.unwrap_or(0)),
    }
}

fn inconsistent(epoch: u64, index: u64, replicas: u64) -> Standing {
    error!(
        epoch,
        index, replicas, "round key holds counts that break 1 <= index <= replicas"
    );
    Standing::Fenced {
        epoch,
        reason: FenceReason::Inconsistent { index, replicas },
    }
}

fn parse<T: redis::FromRedisValue>(value: Value) -> Result<T> {
    Ok(redis::from_redis_value(value).map_err(redis::RedisError::from)?)
}

fn next(values: &mut impl Iterator<Item = Value>) -> Result<Value> {
    values.next().ok_or_else(|| {
        Error::Redis(redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "round pipeline returned fewer replies than commands",
        )))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assignments_keep_index_within_replicas() {
        assert_eq!(
            assignment(9, Some(2), Some(3)),
            Standing::Assigned(Assignment {
                epoch: 9,
                index: 2,
                replicas: 3
            })
        );
        for (i, r) in [
            (Some(3), Some(2)),
            (Some(0), Some(2)),
            (None, Some(2)),
            (Some(1), None),
        ] {
            assert!(matches!(
                assignment(9, i, r),
                Standing::Fenced {
                    epoch: 9,
                    reason: FenceReason::Inconsistent { .. }
                }
            ));
        }
    }
}
