//! Flow limits (docs/design.md §15): a service-wide rate limit on handler
//! starts, and a limit on the tasks of one partition key running at once,
//! changeable on a running service.
//!
//! The limits live in `{N}:limits`, a hash the instances read every second:
//! the consumers' builder gives the first value (written by the first
//! instance that finds no key), operators change it with `peerq limit` or
//! [`Service::set_limits`](crate::admin::Service::set_limits). `{N}:meta`
//! stays write-once.
//!
//! The rate limit's state is one GCRA key, `{N}:rate`, from which the
//! instances lease tokens in small chunks (the consumer's `limiter`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis;
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, info, warn};

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::{Error, Result};
use crate::keys;

/// How often the instances read `{N}:limits`.
pub(crate) const PERIOD: Duration = Duration::from_secs(1);

/// At most this many starts per `per`, across every instance of a service.
///
/// ```
/// use std::time::Duration;
/// use peerq::limits::RateLimit;
///
/// let limit = RateLimit::new(300, Duration::from_secs(1));
/// assert_eq!(limit.per_second(), 300.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    count: u32,
    per: Duration,
}

impl RateLimit {
    /// `count` starts per `per` (validated when set: `count` at least 1,
    /// `per` from 1 ms to 1 day).
    pub fn new(count: u32, per: Duration) -> Self {
        RateLimit { count, per }
    }

    /// How many starts each `per`.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The period the count is for.
    pub fn per(&self) -> Duration {
        self.per
    }

    /// The limit as starts per second.
    pub fn per_second(&self) -> f64 {
        self.count as f64 / self.per.as_secs_f64()
    }

    /// The time between two tokens, in microseconds (may be below 1).
    pub(crate) fn interval_us(&self) -> f64 {
        self.per.as_micros() as f64 / self.count as f64
    }

    /// Refused by the name of `setting` when out of range.
    fn validate(&self, setting: &'static str) -> Result<()> {
        if self.count == 0 {
            return Err(Error::invalid(
                setting,
                "a count of 0 would start nothing; pause the service instead",
            ));
        }
        if self.per < Duration::from_millis(1) || self.per > Duration::from_secs(86_400) {
            return Err(Error::invalid(
                setting,
                format!("per {:?} is out of range: from 1ms to 1 day", self.per),
            ));
        }
        Ok(())
    }

    /// As `{N}:limits` holds it: `<count>/<per ms>`.
    fn field(&self) -> String {
        format!("{}/{}", self.count, self.per.as_millis())
    }

    fn parse(field: &str) -> Option<RateLimit> {
        let (count, per) = field.trim().split_once('/')?;
        let limit = RateLimit::new(
            count.trim().parse().ok()?,
            Duration::from_millis(per.trim().parse().ok()?),
        );
        limit.validate("rate_limit").ok().map(|()| limit)
    }
}

impl std::fmt::Display for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `300/1s`, `5/250ms`: what `peerq limit set --rate` takes.
        let ms = self.per.as_millis();
        match ms % 1000 {
            0 => write!(f, "{}/{}s", self.count, ms / 1000),
            _ => write!(f, "{}/{}ms", self.count, ms),
        }
    }
}

/// A service's flow limits: none by default.
///
/// ```
/// use std::time::Duration;
/// use peerq::limits::{Limits, RateLimit};
///
/// let limits = Limits::none().rate(RateLimit::new(300, Duration::from_secs(1)));
/// assert_eq!(limits.rate_limit().map(|r| r.count()), Some(300));
/// assert_eq!(Limits::none().rate_limit(), None);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    rate: Option<RateLimit>,
    rate_per_key: Option<RateLimit>,
    per_key: Option<u32>,
}

impl Limits {
    /// No limit.
    pub fn none() -> Self {
        Limits::default()
    }

    /// With the service-wide rate limit `rate`.
    pub fn rate(mut self, rate: RateLimit) -> Self {
        self.rate = Some(rate);
        self
    }

    /// Without a service-wide rate limit.
    pub fn without_rate(mut self) -> Self {
        self.rate = None;
        self
    }

    /// The service-wide rate limit, if any.
    pub fn rate_limit(&self) -> Option<RateLimit> {
        self.rate
    }

    /// With the rate limit `rate` on the starts of each partition key
    /// (tasks without a key are not limited by it).
    pub fn rate_per_key(mut self, rate: RateLimit) -> Self {
        self.rate_per_key = Some(rate);
        self
    }

    /// Without a rate limit per key.
    pub fn without_rate_per_key(mut self) -> Self {
        self.rate_per_key = None;
        self
    }

    /// The rate limit on each partition key's starts, if any.
    pub fn rate_limit_per_key(&self) -> Option<RateLimit> {
        self.rate_per_key
    }

    /// With at most `n` tasks of one partition key running at once across
    /// the service (tasks without a key run freely).
    pub fn concurrency_per_key(mut self, n: u32) -> Self {
        self.per_key = Some(n);
        self
    }

    /// Without a limit per key.
    pub fn without_concurrency_per_key(mut self) -> Self {
        self.per_key = None;
        self
    }

    /// How many tasks of one key may run at once, if limited.
    pub fn per_key(&self) -> Option<u32> {
        self.per_key
    }

    /// Refused by name when a limit is out of range.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.per_key == Some(0) {
            return Err(Error::invalid(
                "concurrency_per_key",
                "0 would start no task with a key; allow at least 1",
            ));
        }
        if let Some(rate) = &self.rate_per_key {
            rate.validate("rate_limit_per_key")?;
        }
        self.rate
            .as_ref()
            .map_or(Ok(()), |r| r.validate("rate_limit"))
    }

    /// From `{N}:limits`' fields: `None` when there is no such key. A
    /// field that does not parse (written by hand) is no limit, and says
    /// so in the log of whoever reads it.
    fn parse(fields: &HashMap<String, String>) -> Option<Limits> {
        if fields.is_empty() {
            return None;
        }
        let rate_of = |name: &str| {
            fields.get(name).and_then(|f| {
                let parsed = RateLimit::parse(f);
                if parsed.is_none() {
                    warn!(field = name, value = %f, "{{N}}:limits holds a rate that does not parse; no such limit");
                }
                parsed
            })
        };
        let (rate, rate_per_key) = (rate_of("rate"), rate_of("rate_per_key"));
        let per_key = fields.get("per_key").and_then(|f| {
            let parsed = f.trim().parse::<u32>().ok().filter(|n| *n >= 1);
            if parsed.is_none() {
                warn!(field = %f, "{{N}}:limits holds a per_key that does not parse; no limit per key");
            }
            parsed
        });
        Some(Limits {
            rate,
            rate_per_key,
            per_key,
        })
    }
}

/// Service `name`'s limits as `{N}:limits` says; `None` when never set.
pub(crate) async fn read(conn: &SharedConnection, name: &ServiceName) -> Result<Option<Limits>> {
    let mut get = redis::cmd("HGETALL");
    get.arg(keys::limits(name));
    let fields: HashMap<String, String> = conn.query(&get).await?;
    Ok(Limits::parse(&fields))
}

/// Sets service `name`'s limits (an operator's change, seen by every
/// instance within a second); the key stays, so a consumer's start does not
/// bring back its builder's limit.
pub(crate) async fn set(conn: &SharedConnection, name: &ServiceName, limits: Limits) -> Result<()> {
    limits.validate()?;
    let key = keys::limits(name);
    // No MULTI: the least-privilege ACL rule does not grant it, and a
    // reader between the two commands of a clear sees the old limit, as it
    // would a second earlier.
    let mut hset = redis::cmd("HSET");
    hset.arg(&key).arg("v").arg(1);
    let mut cleared = Vec::new();
    if let Some(rate) = limits.rate {
        hset.arg("rate").arg(rate.field());
    } else {
        cleared.push("rate");
    }
    if let Some(rate) = limits.rate_per_key {
        hset.arg("rate_per_key").arg(rate.field());
    } else {
        cleared.push("rate_per_key");
    }
    if let Some(n) = limits.per_key {
        hset.arg("per_key").arg(n);
    } else {
        cleared.push("per_key");
    }
    let mut pipe = redis::pipe();
    pipe.add_command(hset).ignore();
    if !cleared.is_empty() {
        pipe.cmd("HDEL").arg(&key).arg(&cleared).ignore();
    }
    conn.query_pipe::<()>(&pipe).await
}

/// Sets service `name`'s limits to `limits` unless they were set before
/// (a consumer's start: the builder gives the first value, an operator's
/// later change wins). Returns what holds now.
pub(crate) async fn ensure(
    conn: &SharedConnection,
    name: &ServiceName,
    limits: Limits,
) -> Result<Limits> {
    limits.validate()?;
    let mut hsetnx = redis::cmd("HSETNX");
    hsetnx.arg(keys::limits(name)).arg("v").arg(1);
    let created: bool = conn.query(&hsetnx).await?;
    if created {
        set(conn, name, limits).await?;
        return Ok(limits);
    }
    Ok(read(conn, name).await?.unwrap_or(limits))
}

/// Watches service `name`'s limits from `first` (what the consumer's start
/// found), reading them every [`PERIOD`], until the handle is dropped. If
/// Redis cannot be read, the last answer holds.
pub(crate) fn watch(
    name: ServiceName,
    conn: Arc<SharedConnection>,
    first: Limits,
) -> (watch::Receiver<Limits>, AbortOnDropHandle<()>) {
    let (tx, rx) = watch::channel(first);
    let task = async move {
        let mut failing = false;
        loop {
            tokio::time::sleep(PERIOD).await;
            match read(&conn, &name).await {
                Ok(now) => {
                    failing = false;
                    let now = now.unwrap_or_default();
                    if *tx.borrow() != now {
                        let show =
                            |r: Option<RateLimit>| r.map_or("none".to_owned(), |r| r.to_string());
                        info!(service = %name, rate = %show(now.rate), rate_per_key = %show(now.rate_per_key), concurrency_per_key = ?now.per_key, "limits changed");
                    }
                    tx.send_if_modified(|l| std::mem::replace(l, now) != now);
                }
                Err(e) if !failing => {
                    failing = true;
                    warn!(service = %name, cause = %e, "cannot read the service's limits; keeping the last answer");
                }
                Err(_) => {}
            }
        }
    };
    let handle = tokio::spawn(task.in_current_span());
    (rx, AbortOnDropHandle::new(handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn limits_read_back_as_written_and_a_bad_rate_is_no_limit() {
        let rate = RateLimit::new(300, Duration::from_secs(1));
        let written = fields(&[("v", "1"), ("rate", &rate.field())]);
        assert_eq!(Limits::parse(&written), Some(Limits::none().rate(rate)));
        assert_eq!(Limits::parse(&fields(&[("v", "1")])), Some(Limits::none()));
        for bad in ["", "300", "0/1000", "300/0", "x/1000", "300/99999999999"] {
            let odd = fields(&[("v", "1"), ("rate", bad)]);
            assert_eq!(Limits::parse(&odd), Some(Limits::none()), "{bad}");
        }
        assert_eq!(Limits::parse(&HashMap::new()), None);
    }

    #[test]
    fn a_limit_out_of_range_is_refused_by_name() {
        for bad in [
            RateLimit::new(0, Duration::from_secs(1)),
            RateLimit::new(10, Duration::from_micros(10)),
            RateLimit::new(10, Duration::from_secs(90_000)),
        ] {
            let e = Limits::none().rate(bad).validate().unwrap_err();
            assert!(e.to_string().contains("rate_limit"), "{e}");
            let e = Limits::none().rate_per_key(bad).validate().unwrap_err();
            assert!(e.to_string().contains("rate_limit_per_key"), "{e}");
        }
        assert_eq!(
            RateLimit::new(4, Duration::from_secs(1)).interval_us(),
            250_000.0
        );
    }
}
