//! Periodic jobs (docs/design.md §6): a job registered with an interval or a
//! cron expression is triggered once per due time across the whole
//! service, never twice, not by a leader but by a claim.
//!
//! Every assigned instance computes the same due times (intervals are
//! aligned to the Unix epoch; cron expressions are in UTC). At each one it
//! runs one script in the slot of the job's partition (`hash(job name) % P`)
//! that moves the job's high-water mark `{N/p}:cron:<job>` to the due time,
//! if it is below, and enqueues the job's task in the same step; the first
//! instance wins, the others (and any instance late with an older due
//! time) are refused. The task's id is `cron:<job>:<due ms>`, so a handler
//! can tell the due time.

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use deadpool_redis::redis;

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::entry::{Entry, TaskId};
use crate::error::{Error, Result};
use crate::headers::Headers;
use crate::keys;
use crate::partition::{generation_of, index_of};
use crate::reshard::Generation;

static TRIGGER: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(concat!(
        include_str!("scripts/sealed.lua"),
        include_str!("scripts/trigger.lua")
    ))
});

/// What one trigger call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Triggered {
    /// This call triggered the due time.
    Now,
    /// It was triggered before (or is older than one that was).
    Before,
    /// The partition is sealed by a reshard (docs/design.md §21): nothing
    /// written; its mark, frozen, is the new layout's floor.
    Sealed { mark: i64 },
}

/// What to do with due times missed while no instance ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Missed {
    /// Forget them (the default).
    #[default]
    Skip,
    /// Run the job once for the latest one missed, when an instance starts.
    RunOnce,
}

#[derive(Clone)]
enum When {
    Every(Duration),
    Cron(Box<cron::Schedule>, String),
}

/// A job that enqueues its task at every due time.
///
/// ```
/// use std::time::Duration;
/// use peerq::{Missed, Periodic};
///
/// let digest = Periodic::every("hourly-digest", Duration::from_secs(3600));
/// let nightly = Periodic::cron("nightly-report", "0 30 2 * * *")?  // sec min hour dom mon dow
///     .missed(Missed::RunOnce);
/// # Ok::<(), peerq::Error>(())
/// ```
#[derive(Clone)]
pub struct Periodic {
    name: String,
    when: When,
    missed: Missed,
    headers: Headers,
}

impl fmt::Debug for Periodic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let when = match &self.when {
            When::Every(d) => format!("every {d:?}"),
            When::Cron(_, expr) => format!("cron `{expr}`"),
        };
        f.debug_struct("Periodic")
            .field("name", &self.name)
            .field("when", &when)
            .field("missed", &self.missed)
            .field("headers", &self.headers)
            .finish()
    }
}

impl Periodic {
    /// Due every `interval`, at multiples of it since the Unix epoch (so
    /// every instance agrees on the due times). An interval of 0 is refused
    /// when the consumer starts.
    pub fn every(name: impl Into<String>, interval: Duration) -> Self {
        Periodic {
            name: name.into(),
            when: When::Every(interval),
            missed: Missed::Skip,
            headers: Headers::new(),
        }
    }

    /// Due at the times of a cron expression with seconds, in UTC:
    /// `sec min hour day-of-month month day-of-week [year]`.
    pub fn cron(name: impl Into<String>, expression: &str) -> Result<Self> {
        let schedule = cron::Schedule::from_str(expression).map_err(|e| {
            Error::invalid(
                "cron",
                format!(
                    "`{expression}` does not parse ({e}); use `sec min hour day-of-month month day-of-week`, \
                     e.g. `0 */5 * * * *` for every five minutes"
                ),
            )
        })?;
        Ok(Periodic {
            name: name.into(),
            when: When::Cron(Box::new(schedule), expression.to_owned()),
            missed: Missed::Skip,
            headers: Headers::new(),
        })
    }

    /// What to do with due times missed while no instance ran (default
    /// [`Missed::Skip`]).
    pub fn missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// Sets header `name` to `value` on every task of the job (as
    /// [`Options::header`](crate::Options::header) does for one task);
    /// checked when the consumer starts.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// The job's headers, refused by the name `header` when out of their
    /// bounds.
    pub(crate) fn checked_headers(&self) -> Result<&Headers> {
        self.headers.check()?;
        Ok(&self.headers)
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The first due time strictly after `t`.
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        match &self.when {
            When::Every(interval) => aligned(*interval, t, 1),
            When::Cron(schedule, _) => {
                let after: DateTime<Utc> = t.into();
                schedule.after(&after).next().map(SystemTime::from)
            }
        }
    }

    /// The latest due time at or before `t`.
    fn last_at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        match &self.when {
            When::Every(interval) => aligned(*interval, t, 0),
            When::Cron(schedule, _) => {
                // Going backwards from just after `t`.
                let after: DateTime<Utc> = (t + Duration::from_millis(1)).into();
                schedule.after(&after).next_back().map(SystemTime::from)
            }
        }
    }

    /// How far the due time after `due` is.
    pub(crate) fn period_near(&self, due: SystemTime) -> Option<Duration> {
        self.next_after(due)?.duration_since(due).ok()
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad_name = self.name.is_empty()
            || self.name.len() > 200
            || self
                .name
                .chars()
                .any(|c| c.is_whitespace() || c.is_control());
        if bad_name {
            return Err(Error::invalid(
                "periodic",
                format!(
                    "job name `{}`: use 1 to 200 characters, no whitespace",
                    self.name
                ),
            ));
        }
        if matches!(self.when, When::Every(d) if d < Duration::from_millis(100)) {
            return Err(Error::invalid(
                "periodic",
                format!("job `{}`: use an interval of at least 100ms", self.name),
            ));
        }
        Ok(())
    }
}

/// The multiple of `every` (since the Unix epoch) at or before `t`, plus
/// `ahead` more: every instance computes the same due times.
fn aligned(every: Duration, t: SystemTime, ahead: u128) -> Option<SystemTime> {
    let every = every.as_millis().max(1);
    let ms = (t.duration_since(UNIX_EPOCH).ok()?.as_millis() / every + ahead) * every;
    Some(UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).ok()?))
}

/// A registered job with its task's payload, ready to trigger.
#[derive(Debug, Clone)]
pub(crate) struct Registered {
    pub(crate) job: Periodic,
    pub(crate) codec: &'static str,
    pub(crate) payload: Vec<u8>,
}

impl Registered {
    /// Claims due time `due` in unit `p` and enqueues the job's task
    /// there, once across the service (`tracked`: with its record,
    /// docs/design.md §14; `floor`: a mark the claim must be above, -1 for
    /// none).
    pub(crate) async fn trigger(
        &self,
        conn: &SharedConnection,
        name: &ServiceName,
        p: u32,
        due: SystemTime,
        tracked: bool,
        floor: i64,
    ) -> Result<Triggered> {
        let job = &self.job.name;
        let due_ms = due
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        let id = TaskId::from(format!("cron:{job}:{due_ms}").as_str());
        let mut entry = Entry::new(id, Some(job.clone()), self.codec, self.payload.clone());
        entry.headers = self.job.headers.clone();
        let mut script = TRIGGER.key(keys::stream(name, p));
        script
            .key(keys::cron(name, p, job))
            .key(keys::tasks(name, p))
            .arg(due_ms)
            .arg(if tracked { entry.id.as_str() } else { "" })
            .arg(floor);
        for (k, v) in entry.fields() {
            script.arg(k).arg(v);
        }
        let (code, mark): (i64, i64) = conn.invoke(&script).await?;
        Ok(match code {
            1 => Triggered::Now,
            -2 => Triggered::Sealed { mark },
            _ => Triggered::Before,
        })
    }

    /// The job's `{N}:periodic` record (docs/design.md §7): its schedule
    /// (`every_ms` or `cron`), what it does with missed due times, and the
    /// partition its tasks go to (unit `p`: its number in its generation,
    /// and the generation), as JSON.
    pub(crate) fn record(&self, p: u32) -> String {
        let mut record = serde_json::Map::new();
        match &self.job.when {
            When::Every(every) => {
                record.insert("every_ms".into(), (every.as_millis() as u64).into());
            }
            When::Cron(_, expression) => {
                record.insert("cron".into(), expression.clone().into());
            }
        }
        let missed = match self.job.missed {
            Missed::Skip => "skip",
            Missed::RunOnce => "run_once",
        };
        record.insert("missed".into(), missed.into());
        record.insert("partition".into(), index_of(p).into());
        record.insert("generation".into(), generation_of(p).into());
        serde_json::Value::Object(record).to_string()
    }

    /// The due time to catch up on at start, if the job runs missed ones.
    pub(crate) fn missed_due(&self, now: SystemTime) -> Option<SystemTime> {
        match self.job.missed {
            Missed::Skip => None,
            Missed::RunOnce => self.job.last_at_or_before(now),
        }
    }
}

/// Records `jobs`' schedules in `{N}:periodic`, in one `HSET` (idempotent:
/// every instance that registers them writes the same records), so tools
/// can show each job's schedule, last trigger and next due time.
///
/// A job registered for the first time also gets its first mark: `now`
/// (the time since the Unix epoch, by this instance's clock), written only
/// where the job has none. A due time from before the job existed is then
/// at or below its mark, so [`Missed::RunOnce`] never triggers one on the
/// job's first start; due times after `now` trigger as usual.
pub(crate) async fn record_schedules(
    conn: &SharedConnection,
    name: &ServiceName,
    current: Generation,
    jobs: &[Registered],
    now: Duration,
) -> Result<()> {
    if jobs.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    let hset = pipe.cmd("HSET").arg(keys::periodic(name));
    for registered in jobs {
        let p = current.route(registered.job.name().as_bytes(), 0);
        hset.arg(registered.job.name()).arg(registered.record(p));
    }
    hset.ignore();
    let now_ms = now.as_millis() as u64;
    for registered in jobs {
        let job = registered.job.name();
        let p = current.route(job.as_bytes(), 0);
        // Each mark is in its partition's slot, apart from `{N}:periodic`:
        // one command per key.
        pipe.cmd("SET")
            .arg(keys::cron(name, p, job))
            .arg(now_ms)
            .arg("NX")
            .ignore();
    }
    conn.query_pipe::<()>(&pipe).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A generation-0 layout of 8 partitions.
    const EIGHT: Generation = Generation {
        number: 0,
        partitions: 8,
    };

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn intervals_are_aligned_to_the_epoch() {
        let job = Periodic::every("j", Duration::from_secs(60));
        assert_eq!(job.next_after(at(1_000_000_010)), Some(at(1_000_000_020)));
        assert_eq!(
            job.next_after(at(1_000_000_020)),
            Some(at(1_000_000_080)),
            "strictly after"
        );
    }

    #[test]
    fn a_cron_expression_gives_its_next_due_times() {
        // 2026-11-22 03:00:00 UTC is 1795316400.
        let job = Periodic::cron("report", "0 30 2 * * *").unwrap();
        let next = job.next_after(at(1_795_316_400)).unwrap();
        assert_eq!(
            next,
            at(1_795_316_400 + 23 * 3600 + 30 * 60),
            "02:30 the next day"
        );
        let every5 = Periodic::cron("tick", "*/5 * * * * *").unwrap();
        let first = every5.next_after(at(1_795_316_401)).unwrap();
        assert_eq!(first, at(1_795_316_405));
        assert_eq!(every5.next_after(first), Some(at(1_795_316_410)));
    }

    #[test]
    fn a_bad_cron_expression_is_refused_by_name() {
        let err = Periodic::cron("x", "every tuesday")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cron") && err.contains("every tuesday"),
            "{err}"
        );
    }

    #[test]
    fn the_latest_missed_due_time_is_found() {
        let job = Periodic::every("j", Duration::from_secs(60));
        assert_eq!(
            job.last_at_or_before(at(1_000_000_050)),
            Some(at(1_000_000_020))
        );
        assert_eq!(
            job.last_at_or_before(at(1_000_000_020)),
            Some(at(1_000_000_020))
        );
        let cron = Periodic::cron("c", "0 0 * * * *").unwrap();
        assert_eq!(
            cron.last_at_or_before(at(1_795_316_400 + 10)),
            Some(at(1_795_316_400))
        );
    }

    #[tokio::test]
    async fn a_new_job_never_triggers_a_due_time_from_before_it_was_registered() {
        let server = peerq_test_support::RedisServer::start();
        let conn = SharedConnection::new(server.pool());
        let name = ServiceName::new(&peerq_test_support::unique_name("first-mark")).unwrap();
        let p = EIGHT.route(b"digest", 0);
        let job = Registered {
            job: Periodic::every("digest", Duration::from_secs(60)).missed(Missed::RunOnce),
            codec: "bincode",
            payload: vec![1],
        };
        let registered = Duration::from_secs(1_800_000_030);
        record_schedules(&conn, &name, EIGHT, std::slice::from_ref(&job), registered)
            .await
            .unwrap();
        // What a first start catches up on: the due time before it.
        let missed = job.missed_due(UNIX_EPOCH + registered).unwrap();
        assert_eq!(missed, at(1_800_000_000));
        assert_eq!(
            job.trigger(&conn, &name, p, missed, false, -1)
                .await
                .unwrap(),
            Triggered::Before,
            "a due time from before the job existed: refused"
        );
        // A later registration (a restart) leaves the mark where it is.
        let restarted = registered + Duration::from_secs(3600);
        record_schedules(&conn, &name, EIGHT, std::slice::from_ref(&job), restarted)
            .await
            .unwrap();
        assert_eq!(
            job.trigger(&conn, &name, p, at(1_800_000_060), false, -1)
                .await
                .unwrap(),
            Triggered::Now,
            "the first due time after the registration: triggered"
        );
    }

    #[tokio::test]
    async fn a_due_time_triggers_once_and_never_after_a_later_one() {
        let server = peerq_test_support::RedisServer::start();
        let conn = SharedConnection::new(server.pool());
        let name = ServiceName::new(&peerq_test_support::unique_name("trigger")).unwrap();
        // A monthly job: its claim must hold for any period (no expiry).
        let job = Registered {
            job: Periodic::cron("monthly", "0 0 0 1 * *").unwrap(),
            codec: "bincode",
            payload: vec![1, 2, 3],
        };
        let p = EIGHT.route(b"monthly", 0);
        let trigger = |secs, floor| job.trigger(&conn, &name, p, at(secs), false, floor);
        let now = |t: Result<Triggered>| t.unwrap() == Triggered::Now;
        assert!(now(trigger(1_800_000_000, -1).await), "first: triggered");
        assert!(
            !now(trigger(1_800_000_000, -1).await),
            "the same due time: refused"
        );
        assert!(
            !now(trigger(1_790_000_000, -1).await),
            "an older one (a paused instance): refused"
        );
        assert!(
            !now(trigger(1_802_592_000, 1_802_592_000_000).await),
            "at or below the floor (the replaced layout's mark): refused"
        );
        assert!(
            now(trigger(1_802_592_000, -1).await),
            "the next one: triggered"
        );
        let mut raw = server.pool().get().await.unwrap();
        let len: usize = redis::cmd("XLEN")
            .arg(keys::stream(&name, p))
            .query_async(&mut *raw)
            .await
            .unwrap();
        assert_eq!(len, 2, "two tasks enqueued");
    }
}
