//! One round's script: what a round sends to Redis (`round_ranked.lua` or
//! `round_incr.lua`) and how its reply reads. The loop around it, and what
//! the reply means for the instance's standing, are the round module's.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_redis::redis::{self, Script, Value};
use tracing::warn;

use super::{Counted, ROUND_KEY_TTL_INTERVALS, RoundLoop};
use crate::assignment::{Assignor, Member};
use crate::connection::Conn;
use crate::error::Result;
use crate::indexer::Indexing;
use crate::indexer::listed::Read;
use crate::keys;
use crate::reshard::Layout;

static ROUND_RANKED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/round_ranked.lua")));
static ROUND_INCR: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/round_incr.lua")));

/// What one round's script did and read.
#[derive(Debug)]
pub(super) struct RoundReply {
    pub(super) written: Written,
    /// The previous round's `(index, replicas)` for this instance, when it
    /// was read; `None` inside where the key does not hold this instance.
    pub(super) prev: Option<(Option<u64>, Option<u64>)>,
    /// The previous round's member names (rendezvous only).
    pub(super) members: Read,
    /// Redis's clock when the script ran.
    pub(super) redis_now: Duration,
    /// The service's layout, read with the count (docs/design.md §21):
    /// `None` for a service never resharded.
    pub(super) layout: Option<Arc<Layout>>,
}

/// Whether the round's write landed.
#[derive(Debug)]
pub(super) enum Written {
    /// Written; for `Incr` with the value `INCR` returned.
    Yes(Option<u64>),
    /// Not asked for (leaving, or fenced by the clock).
    NotAsked,
    /// Refused by Redis: it arrived after the round's window.
    Refused { late_by: Duration },
    /// Refused by etcd: the round was closed already (docs/design.md §2.2).
    #[cfg(feature = "etcd")]
    Closed,
}

impl Written {
    /// Why the write was refused, if it was: the round is missed.
    pub(super) fn refusal(&self) -> Option<String> {
        match self {
            Written::Yes(_) | Written::NotAsked => None,
            Written::Refused { late_by } => Some(format!(
                "redis refused the round's write: it ran {late_by:?} after the round's window"
            )),
            #[cfg(feature = "etcd")]
            Written::Closed => Some(
                "etcd refused the round's registration: the round was closed already by the \
                 next round's first reader"
                    .to_owned(),
            ),
        }
    }
}

impl RoundLoop {
    /// Runs the round's script: writes this round (if `write`) and reads the
    /// previous one (if this instance was counted there, `prev`), atomically.
    pub(super) async fn write_and_read(
        &self,
        conn: &mut Conn,
        number: u64,
        write: bool,
        prev: Option<Counted>,
    ) -> Result<RoundReply> {
        let ttl = (self.settings.interval * ROUND_KEY_TTL_INTERVALS).as_millis() as u64;
        // By Redis's clock: the others read this key no earlier than
        // `number * I - S`; the window closes `late_end + S` after the
        // interval began, which is before that (docs/design.md §2).
        let write_by = if write {
            let window = self.schedule.late_end() + self.settings.skew;
            (self.schedule.interval_start(number) + window).as_micros() as u64
        } else {
            0
        };
        let read_prev = if prev.is_some() { "1" } else { "0" };
        let rendezvous = self.settings.assignor == Assignor::Rendezvous;
        let script = match self.settings.indexing {
            Indexing::Ranked => {
                let mut script = ROUND_RANKED.key(keys::round(&self.name, number));
                script
                    .key(keys::round(&self.name, number - 1))
                    .key(keys::round(&self.name, number.saturating_sub(2)))
                    .key(keys::round_same(&self.name, number - 1))
                    .key(keys::layout(&self.name))
                    .arg(Member::name(self.id.as_str(), self.settings.weight))
                    // The score is the offset: the rank is the order in which
                    // instances act, decided by the offsets, not by the network.
                    .arg(self.schedule.offset().as_micros() as u64)
                    .arg(ttl)
                    .arg(write_by)
                    .arg(read_prev)
                    .arg(if rendezvous { "1" } else { "0" })
                    .arg(if self.listed.holds_before(number) {
                        "1"
                    } else {
                        "0"
                    });
                script
            }
            Indexing::Incr => {
                let mut script = ROUND_INCR.key(keys::round(&self.name, number));
                script
                    .key(keys::round_takers(&self.name, number))
                    .key(keys::round(&self.name, number - 1))
                    .key(keys::round_takers(&self.name, number - 1))
                    .key(keys::layout(&self.name))
                    .arg(self.id.as_str())
                    .arg(ttl)
                    .arg(write_by)
                    .arg(read_prev);
                script
            }
        };
        // With `wait_for_replicas`, a write is confirmed by a `WAIT` on the
        // connection that carried it: a round write a failover lost could
        // give two instances different counts for one epoch. Unconfirmed,
        // the round is missed (fenced), never used.
        let wait = self.conn.wait().filter(|_| write);
        let values: Vec<Value> = conn.write_script(&script, wait).await?.reply()?;
        let mut values = values.into_iter();
        let written: i64 = parse(&mut values)?;
        let (written_value, prev) = match (self.settings.indexing, prev) {
            (Indexing::Ranked, prev) => {
                let rank: Option<u64> = parse(&mut values)?;
                let count: u64 = parse(&mut values)?;
                (None, prev.map(|_| (rank.map(|r| r + 1), Some(count))))
            }
            (Indexing::Incr, prev) => {
                let value: u64 = parse(&mut values)?;
                let count: Option<u64> = parse(&mut values)?;
                let held: Option<u64> = parse(&mut values)?;
                let takers: u64 = parse(&mut values)?;
                let prev = prev.map(|p| {
                    let ours = p.incr_value;
                    // The counter must be the one this instance incremented,
                    // taken by exactly as many instances as it counts.
                    if held == ours && Some(takers) == count {
                        (ours, count)
                    } else {
                        warn!(
                            service = %self.name,
                            instance = %self.id,
                            round = number - 1,
                            ours, ?held, takers, ?count,
                            "round counter was lost or rewritten in redis; not trusting it"
                        );
                        (None, count)
                    }
                });
                (Some(value), prev)
            }
        };
        let redis_now: u64 = parse(&mut values)?;
        let members = match self.settings.indexing {
            Indexing::Ranked => {
                let names: Vec<String> = parse(&mut values)?;
                let unchanged: i64 = parse(&mut values)?;
                if unchanged == 1 {
                    Read::Unchanged
                } else {
                    Read::Names(names)
                }
            }
            Indexing::Incr => Read::Names(Vec::new()),
        };
        let layout = read_layout(&parse(&mut values)?)?;
        let written = match written {
            1 => Written::Yes(written_value),
            0 => Written::NotAsked,
            _ => Written::Refused {
                late_by: Duration::from_micros(redis_now.saturating_sub(write_by)),
            },
        };
        Ok(RoundReply {
            written,
            prev,
            members,
            redis_now: Duration::from_micros(redis_now),
            layout,
        })
    }
}

/// The service's layout from its `{N}:layout` fields, as a round reads
/// them with its count.
pub(super) fn read_layout(fields: &HashMap<String, String>) -> Result<Option<Arc<Layout>>> {
    let layout = Layout::from_fields(fields).map_err(|e| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "the service's layout does not read",
            e,
        ))
    })?;
    Ok(layout.map(Arc::new))
}

/// Parses the next value of a script's reply.
fn parse<T: redis::FromRedisValue>(values: &mut impl Iterator<Item = Value>) -> Result<T> {
    let value = values.next().ok_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "round script returned fewer values than expected",
        ))
    })?;
    Ok(redis::from_redis_value(value).map_err(redis::RedisError::from)?)
}
