//! One service's state: its settings, members, partitions, totals and the
//! last five minutes' task rates.

use std::collections::HashMap;

use deadpool_redis::redis::{self, Value};
use serde::Serialize;

use super::ServiceLayout;
use super::partitions::{self, PartitionState, parse};
use super::{Admin, Member, Service, Settings, members};
use crate::config::ServiceName;
use crate::error::Result;
use crate::keys;
use crate::limits;
use crate::pause::{self, Pause};
use crate::singleton::{self, SingletonHolder};

/// The minutes the rates cover: the current one (partial) and the four
/// before it.
const RATE_MINUTES: u64 = 5;

/// A service's state. Its JSON: `name`, `redis`, `at_ms`, `settings`,
/// `paused` (null, or `at_ms` and `by`), `limits`, `layout` (`generation`,
/// `partitions`, `state`, `from_generation`, `from_partitions`,
/// `open_epoch`, `started_ms`, `opened_ms`, `replaced`, `sealed`,
/// `retired`), `members`, `partitions`,
/// `singletons` (each `name`, `instance`, `token`, `since_ms`, `released`),
/// `totals`, `rates`, `etcd` (null unless the membership is on etcd).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Status {
    /// The service's name.
    pub name: String,
    /// The Redis read, its URL without the password.
    pub redis: String,
    /// When it was read, by Redis's clock (Unix ms).
    pub at_ms: u64,
    /// Its settings from `{N}:meta`.
    pub settings: Settings,
    /// Who paused it and when, while it is paused.
    pub paused: Option<Pause>,
    /// The flow limits in force, and what waits on them.
    pub limits: LimitsStatus,
    /// The generation of partitions in use, and a reshard under way
    /// (docs/design.md §21).
    pub layout: ServiceLayout,
    /// Its instances, by index (unassigned ones last).
    pub members: Vec<Member>,
    /// Its partitions, by number.
    pub partitions: Vec<PartitionState>,
    /// Who holds each of its singletons (docs/design.md §20), by name:
    /// every singleton ever held.
    pub singletons: Vec<SingletonHolder>,
    /// Sums over the partitions and members.
    pub totals: Totals,
    /// Tasks per outcome over the last five minutes.
    pub rates: Rates,
    /// The etcd cluster and its last round, when the membership is there
    /// (docs/design.md §2.2).
    pub etcd: Option<super::EtcdStatus>,
}

/// The flow limits in force (docs/design.md §15). Its JSON: `rate` and
/// `rate_per_key` (each null, or `count`, `per_ms`, `per_second` and
/// `waiting`), `concurrency_per_key` (null, or how many tasks of one key
/// may run at once) and `waiting_per_key` (tasks held aside for a limit per
/// key, over the live instances).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct LimitsStatus {
    /// The service-wide rate limit, if any.
    pub rate: Option<RateStatus>,
    /// The rate limit on each partition key's starts, if any (its
    /// `waiting` is the service's, as for `rate`).
    pub rate_per_key: Option<RateStatus>,
    /// How many tasks of one key may run at once, if limited.
    pub concurrency_per_key: Option<u32>,
    /// Tasks the live instances read and hold aside, waiting on a limit
    /// per key (its concurrency or its rate): the members' `aside`.
    pub waiting_per_key: u64,
}

/// The service-wide rate limit, and the tasks that wait on it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RateStatus {
    /// Starts per period.
    pub count: u32,
    /// The period, in milliseconds.
    pub per_ms: u64,
    /// Starts per second.
    pub per_second: f64,
    /// Tasks that wait to start: the backlog less the handlers running
    /// (every task waits on a service-wide limit).
    pub waiting: u64,
}

/// Sums over a service's partitions and members. Its JSON: `length`,
/// `pending`, `backlog`, `delayed`, `dead`, `owned_partitions`,
/// `live_members`, `in_flight`, `handled`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Totals {
    /// Entries in the partition streams.
    pub length: u64,
    /// Entries delivered and not yet acked.
    pub pending: u64,
    /// Entries not yet delivered or acked.
    pub backlog: u64,
    /// Delayed tasks.
    pub delayed: u64,
    /// Dead letters.
    pub dead: u64,
    /// Partitions whose owner record names a live member.
    pub owned_partitions: u32,
    /// Members seen within three round intervals.
    pub live_members: usize,
    /// Handler runs in progress, over the live members.
    pub in_flight: u64,
    /// Tasks handled, over the live members, since each started.
    pub handled: u64,
}

/// The confirmed outcomes of the last five minutes (docs/design.md §7:
/// `{N}:stats:<minute>`). Its JSON: `window_s`, `ok`, `failed`, `dead`,
/// `retried`, `ok_per_s`, `failed_per_s`, `dead_per_s`, `retried_per_s`,
/// `minutes` (each `minute`, `ok`, `failed`, `dead`, `retried`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Rates {
    /// The seconds the rates are over: from the start of the first of the
    /// five minutes with counts (or, within it, the oldest member's start)
    /// to now, so a service that just started is not averaged over minutes
    /// it did not run in.
    pub window_s: f64,
    /// Tasks acked.
    pub ok: u64,
    /// Failed attempts (retried or dead-lettered).
    pub failed: u64,
    /// Entries moved to the dead letters.
    pub dead: u64,
    /// Failed tasks enqueued for another attempt.
    pub retried: u64,
    /// `ok` per second over the window.
    pub ok_per_s: f64,
    /// `failed` per second.
    pub failed_per_s: f64,
    /// `dead` per second.
    pub dead_per_s: f64,
    /// `retried` per second.
    pub retried_per_s: f64,
    /// The counts of each minute, oldest first.
    pub minutes: Vec<MinuteCounts>,
}

/// The counts of one Unix minute.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct MinuteCounts {
    /// The minute: Unix seconds / 60.
    pub minute: u64,
    /// Tasks acked.
    pub ok: u64,
    /// Failed attempts.
    pub failed: u64,
    /// Entries dead-lettered.
    pub dead: u64,
    /// Failed tasks retried.
    pub retried: u64,
    /// The backlog, as the instances last read it in that minute (the sum
    /// of each one's figure for the partitions it owned); `None` when no
    /// instance recorded one.
    pub backlog: Option<u64>,
}

impl Service {
    /// The service's state now, read in two round trips on one connection:
    /// Redis's time and the pause, then the members and counts in one
    /// pipeline and the partitions in another, sent together.
    pub async fn status(&self) -> Result<Status> {
        let conn = &self.admin.conn;
        let etcd = async {
            match (&self.settings.membership, &self.settings.etcd_prefix) {
                (Some(m), Some(prefix)) if m == "etcd" => {
                    super::etcd::read(&self.admin, &self.name, prefix)
                        .await
                        .map(Some)
                }
                _ => Ok(None),
            }
        };
        let (first, paused, limits, singletons, layout, etcd) = tokio::join!(
            self.admin.now_ms(),
            pause::read(conn, &self.name),
            limits::read(conn, &self.name),
            singleton::store::holders(conn, &self.name),
            self.layout(),
            etcd
        );
        let (now_ms, paused, limits) = (first?, paused?, limits?.unwrap_or_default());
        let minute_now = now_ms / 60_000;
        let minutes: Vec<u64> = (minute_now + 1 - RATE_MINUTES..=minute_now).collect();
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL").arg(keys::members(&self.name));
        for minute in &minutes {
            pipe.cmd("HGETALL").arg(keys::stats(&self.name, *minute));
        }
        let sizes = [(self.name.clone(), self.units().clone())];
        let (replies, states) = tokio::join!(
            conn.query_pipe::<Vec<Value>>(&pipe),
            partitions::read(conn, &sizes, now_ms)
        );
        let mut replies = replies?.into_iter();
        let records: HashMap<String, String> = parse(replies.next().unwrap_or(Value::Nil))?;
        let members = members::members(records, now_ms, self.settings.interval());
        let counts = minute_counts(minutes, replies)?;
        let partitions = states?.pop().unwrap_or_default();
        let started = members.iter().map(|m| m.started_at_ms).min();
        let totals = totals(&partitions, &members);
        let waiting = totals.backlog.saturating_sub(totals.in_flight);
        let rate = |rate: crate::limits::RateLimit| RateStatus {
            count: rate.count(),
            per_ms: rate.per().as_millis() as u64,
            per_second: rate.per_second(),
            waiting,
        };
        let limits = LimitsStatus {
            rate: limits.rate_limit().map(rate),
            rate_per_key: limits.rate_limit_per_key().map(rate),
            concurrency_per_key: limits.per_key(),
            waiting_per_key: members.iter().filter(|m| m.live).map(|m| m.aside).sum(),
        };
        Ok(Status {
            name: self.name.to_string(),
            redis: self.admin.redis.to_string(),
            at_ms: now_ms,
            settings: self.settings.clone(),
            paused,
            limits,
            layout: layout?,
            totals,
            rates: rates(counts, started, now_ms),
            members,
            partitions,
            singletons: singletons?,
            etcd: etcd?,
        })
    }

    /// Who holds each of the service's singletons (docs/design.md §20):
    /// every singleton ever held, by name, with whether its holder has
    /// released it since.
    pub async fn singletons(&self) -> Result<Vec<SingletonHolder>> {
        singleton::store::holders(&self.admin.conn, &self.name).await
    }
}

impl Service {
    /// The counts of the last `count` minutes (the current one last); a
    /// minute without counts is zeros.
    pub async fn minutes(&self, count: u32) -> Result<Vec<MinuteCounts>> {
        let mut each = self.admin.minutes(&[&self.name], count).await?;
        Ok(each.pop().unwrap_or_default())
    }
}

impl Admin {
    /// The counts of the last `count` minutes (the current one last) of
    /// each of `services`, in order: Redis's `TIME`, then one pipeline for
    /// them all, however many services (the dashboard's overview charts).
    pub(crate) async fn minutes(
        &self,
        services: &[&ServiceName],
        count: u32,
    ) -> Result<Vec<Vec<MinuteCounts>>> {
        let minute_now = self.now_ms().await? / 60_000;
        let minutes: Vec<u64> = (minute_now + 1 - u64::from(count.max(1))..=minute_now).collect();
        if services.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for name in services {
            for minute in &minutes {
                pipe.cmd("HGETALL").arg(keys::stats(name, *minute));
            }
        }
        let replies: Vec<Value> = self.conn.query_pipe(&pipe).await?;
        let mut replies = replies.into_iter();
        services
            .iter()
            .map(|_| minute_counts(minutes.clone(), replies.by_ref().take(minutes.len())))
            .collect()
    }
}

/// The counts of `minutes` from their `HGETALL` replies.
fn minute_counts(
    minutes: Vec<u64>,
    replies: impl IntoIterator<Item = Value>,
) -> Result<Vec<MinuteCounts>> {
    let mut counts = Vec::with_capacity(minutes.len());
    for (minute, reply) in minutes.into_iter().zip(replies) {
        let fields: HashMap<String, u64> = parse(reply)?;
        let count = |f: &str| fields.get(f).copied().unwrap_or(0);
        let backlogs = fields.iter().filter(|(f, _)| f.starts_with("backlog:"));
        let backlog = backlogs.map(|(_, n)| *n).reduce(|a, b| a + b);
        counts.push(MinuteCounts {
            backlog,
            minute,
            ok: count("ok"),
            failed: count("failed"),
            dead: count("dead"),
            retried: count("retried"),
        });
    }
    Ok(counts)
}

fn totals(partitions: &[PartitionState], members: &[Member]) -> Totals {
    let sum = |f: fn(&PartitionState) -> u64| partitions.iter().map(f).sum::<u64>();
    let live: Vec<&Member> = members.iter().filter(|m| m.live).collect();
    let owned = partitions
        .iter()
        .filter(|p| {
            p.owner
                .as_ref()
                .is_some_and(|owner| live.iter().any(|m| m.id == *owner))
        })
        .count();
    Totals {
        length: sum(|p| p.length),
        pending: sum(|p| p.pending),
        backlog: sum(|p| p.backlog),
        delayed: sum(|p| p.delayed),
        dead: sum(|p| p.dead),
        owned_partitions: owned as u32,
        live_members: live.len(),
        in_flight: live.iter().map(|m| m.in_flight).sum(),
        handled: live.iter().map(|m| m.handled).sum(),
    }
}

fn rates(minutes: Vec<MinuteCounts>, started_ms: Option<u64>, now_ms: u64) -> Rates {
    let sum = |f: fn(&MinuteCounts) -> u64| minutes.iter().map(f).sum::<u64>();
    let (ok, failed, dead, retried) = (
        sum(|m| m.ok),
        sum(|m| m.failed),
        sum(|m| m.dead),
        sum(|m| m.retried),
    );
    let counted = |m: &&MinuteCounts| m.ok + m.failed + m.dead + m.retried > 0;
    let first = minutes.iter().find(counted).or(minutes.first());
    let from = first.map_or(now_ms, |m| {
        let (begins, ends) = (m.minute * 60_000, (m.minute + 1) * 60_000);
        // Nothing ran in that minute before the oldest member started
        // (unless members that left since ran then: rare, and it only
        // makes the rate look higher for a minute).
        started_ms
            .filter(|s| (begins..ends).contains(s))
            .unwrap_or(begins)
    });
    let window_ms = now_ms.saturating_sub(from);
    let window_s = window_ms as f64 / 1000.0;
    let per_s = |n: u64| {
        if window_s > 0.0 {
            n as f64 / window_s
        } else {
            0.0
        }
    };
    Rates {
        window_s,
        ok,
        failed,
        dead,
        retried,
        ok_per_s: per_s(ok),
        failed_per_s: per_s(failed),
        dead_per_s: per_s(dead),
        retried_per_s: per_s(retried),
        minutes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minute(minute: u64, ok: u64) -> MinuteCounts {
        MinuteCounts {
            minute,
            ok,
            ..MinuteCounts::default()
        }
    }

    #[test]
    fn rates_are_over_the_time_the_service_ran_in_the_window() {
        let now = 104 * 60_000 + 30_000;
        let quiet_then_busy = || (100..=104).map(|m| minute(m, if m >= 103 { 900 } else { 0 }));
        // Counted since minute 103: 90 s, whoever started when.
        let since_103 = rates(quiet_then_busy().collect(), None, now);
        assert_eq!((since_103.ok, since_103.window_s), (1800, 90.0));
        assert_eq!(since_103.ok_per_s, 20.0);
        // The oldest member started 30 s into minute 103: 60 s.
        let started = Some(103 * 60_000 + 30_000);
        assert_eq!(
            rates(quiet_then_busy().collect(), started, now).window_s,
            60.0
        );
        // Counts in every minute: the whole window, four minutes and a half.
        let busy = (100..=104).map(|m| minute(m, 1)).collect();
        assert_eq!(rates(busy, Some(0), now).window_s, 270.0);
    }
}
