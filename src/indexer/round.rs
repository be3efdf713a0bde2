//! The round loop: one task per instance that writes a round per interval
//! and publishes the instance's [`Standing`].

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_redis::Pool;
use deadpool_redis::redis::{self, Script, Value, aio::MultiplexedConnection};
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

static ROUND_RANKED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/round_ranked.lua")));
static ROUND_INCR: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/round_incr.lua")));

/// What the round's script did and read.
#[derive(Debug)]
struct RoundReply {
    written: Written,
    /// Ranked: this instance's 0-based rank in the previous round.
    rank: Option<u64>,
    /// The previous round's count, when it was read and exists.
    count: Option<u64>,
    /// Redis's clock when the script ran.
    redis_now: Duration,
}

/// Whether the round's write landed.
#[derive(Debug)]
enum Written {
    /// Written; for `Incr` with the value `INCR` returned.
    Yes(u64),
    /// Not asked for (a leaving instance).
    NotAsked,
    /// Refused by Redis: it arrived after the round's window.
    Refused { late_by: Duration },
}

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
    /// The connection the rounds use, dropped after any failed round.
    pub(super) conn: Option<MultiplexedConnection>,
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
                // Take a fresh connection next round: this one may be broken.
                self.conn = None;
                Standing::Fenced {
                    epoch: number,
                    reason: FenceReason::RoundFailed {
                        error: e.to_string(),
                    },
                }
            }
        }
    }

    /// The round loop's connection: one multiplexed connection kept across
    /// rounds. Taking one from the pool every round would cost a `PING`
    /// round trip (the pool's recycle check) before the round's write.
    pub(super) async fn connection(&mut self) -> Result<MultiplexedConnection> {
        if let Some(conn) = &self.conn {
            return Ok(conn.clone());
        }
        let pooled = self.pool.get().await?;
        let conn = MultiplexedConnection::clone(&pooled);
        self.conn = Some(conn.clone());
        Ok(conn)
    }

    /// The round's Redis work, in one round trip: write this round, read
    /// the previous one, and measure the clock against Redis's.
    ///
    /// The clock measured in a round decides whether the next round writes:
    /// an instance whose clock went off in this round has already written,
    /// so it is counted once more without claiming the index (one epoch with
    /// that index unheld), which is safe; one whose clock was already off
    /// writes nothing until it is back within the skew.
    async fn exchange(&mut self, number: u64, leaving: bool) -> Result<Standing> {
        let mut conn = self.connection().await?;
        let prev = self.counted.filter(|c| c.number == number - 1);
        let write = !leaving && !self.clock_fenced;
        let before = self.clock.now();
        let reply = self
            .write_and_read(&mut conn, number, write, prev.is_some())
            .await?;
        let after = self.clock.now();
        self.counted = None;
        if let Some(reason) = self.judge_clock(before, after, reply.redis_now) {
            return Ok(Standing::Fenced {
                epoch: number,
                reason,
            });
        }
        match reply.written {
            Written::Yes(index) => self.counted = Some(Counted { number, index }),
            Written::Refused { late_by } => {
                return Ok(Standing::Fenced {
                    epoch: number,
                    reason: FenceReason::RoundFailed {
                        error: format!(
                            "redis refused the round's write: it arrived {late_by:?} after the round's window"
                        ),
                    },
                });
            }
            Written::NotAsked => {}
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
        let index = match self.settings.indexing {
            Indexing::Ranked => reply.rank.map(|r| r + 1),
            Indexing::Incr => Some(prev.index),
        };
        Ok(assignment(number, index, reply.count))
    }

    /// One round trip: the round's script writes this round (unless
    /// leaving) and reads the previous one (if this instance was counted
    /// there), atomically.
    async fn write_and_read(
        &self,
        conn: &mut MultiplexedConnection,
        number: u64,
        write: bool,
        read_prev: bool,
    ) -> Result<RoundReply> {
        let key = keys::round(&self.name, number);
        let prev_key = keys::round(&self.name, number - 1);
        let ttl = (self.settings.interval * ROUND_KEY_TTL_INTERVALS).as_millis() as u64;
        // By Redis's clock: the others read this key no earlier than
        // `number * I - S`; the window closes `late_end + S` after the interval
        // began, which is before that (DESIGN.md §2).
        let write_by = if write {
            (self.schedule.interval_start(number) + self.schedule.late_end() + self.settings.skew)
                .as_micros() as u64
        } else {
            0
        };
        let read_prev = if read_prev { "1" } else { "0" };
        let mut inv = match self.settings.indexing {
            Indexing::Ranked => {
                let mut inv = ROUND_RANKED.key(&key);
                // The score is the offset: the rank is the order in which
                // instances act, decided by the offsets, not by the network.
                inv.key(&prev_key)
                    .arg(self.id.as_str())
                    .arg(self.schedule.offset().as_micros() as u64);
                inv
            }
            Indexing::Incr => {
                let mut inv = ROUND_INCR.key(&key);
                inv.key(&prev_key);
                inv
            }
        };
        inv.arg(ttl).arg(write_by).arg(read_prev);
        let values: Vec<Value> = inv.invoke_async(conn).await?;
        let mut values = values.into_iter();
        let written: i64 = parse(next(&mut values)?)?;
        let (written_value, rank, count) = match self.settings.indexing {
            Indexing::Ranked => {
                let rank: Option<u64> = parse(next(&mut values)?)?;
                let count: u64 = parse(next(&mut values)?)?;
                (0, rank, read_prev.eq("1").then_some(count))
            }
            Indexing::Incr => {
                let value: u64 = parse(next(&mut values)?)?;
                let count: Option<u64> = parse(next(&mut values)?)?;
                (value, None, count)
            }
        };
        let redis_now: u64 = parse(next(&mut values)?)?;
        let written = match written {
            1 => Written::Yes(written_value),
            0 => Written::NotAsked,
            _ => Written::Refused {
                late_by: Duration::from_micros(redis_now.saturating_sub(write_by)),
            },
        };
        Ok(RoundReply {
            written,
            rank,
            count,
            redis_now: Duration::from_micros(redis_now),
        })
    }

    /// Measures this instance's clock against Redis `TIME`, corrected by
    /// half the round trip (at start; rounds measure with their script).
    /// Returns the fence reason while the offset exceeds the tolerated skew.
    pub(super) async fn check_clock(
        &mut self,
        conn: &mut MultiplexedConnection,
    ) -> Result<Option<FenceReason>> {
        let before = self.clock.now();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(conn).await?;
        let after = self.clock.now();
        let server = Duration::from_secs(secs) + Duration::from_micros(micros);
        Ok(self.judge_clock(before, after, server))
    }

    /// Judges one clock measurement: local time read `before` and `after` a
    /// request that Redis served at `server`. Returns the fence reason while
    /// the offset exceeds the tolerated skew, and logs each change.
    fn judge_clock(
        &mut self,
        before: Duration,
        after: Duration,
        server: Duration,
    ) -> Option<FenceReason> {
        let local = before + (after.saturating_sub(before)) / 2;
        let offset = signed_secs(local, server);
        metrics::gauge!(m::CLOCK_OFFSET_SECONDS, "service" => self.name.to_string()).set(offset);
        let tolerated = self.settings.skew;
        if offset.abs() <= tolerated.as_secs_f64() {
            if self.clock_fenced {
                self.clock_fenced = false;
                info!(service = %self.name, offset_ms = offset * 1e3, "clock back within the tolerated skew");
            }
            return None;
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
        Some(FenceReason::ClockSkew {
            offset_us: (offset * 1e6) as i64,
            tolerated,
        })
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
