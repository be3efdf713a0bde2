//! A service's periodic jobs: their schedules from `{N}:periodic`, the last
//! due time each triggered (`{N/p}:cron:<job>`) and the next one.

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use deadpool_redis::redis;
use serde::{Deserialize, Serialize};

use super::Service;
use crate::error::Result;
use crate::keys;
use crate::partition::{generation_of, index_of};
use crate::periodic::Periodic;

/// One periodic job. Its JSON: `name`, `every_ms` (null for a cron job),
/// `cron` (null for an interval job), `missed` (`skip`, `run_once`),
/// `partition`, `generation`, `last_due_ms`, `next_due_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PeriodicJob {
    /// The job's name.
    pub name: String,
    /// Its interval, for an interval job.
    pub every_ms: Option<u64>,
    /// Its cron expression (UTC, with seconds), for a cron job.
    pub cron: Option<String>,
    /// What it does with due times missed while no instance ran.
    pub missed: String,
    /// The partition its tasks go to, in the generation in use.
    pub partition: u32,
    /// That generation (docs/design.md §21): 0 until a reshard.
    pub generation: u32,
    /// The latest due time that was triggered (Unix ms); `None`: never.
    pub last_due_ms: Option<u64>,
    /// The next due time after now (Unix ms, by Redis's clock).
    pub next_due_ms: Option<u64>,
}

/// A `{N}:periodic` record as `periodic::Registered::record` writes it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Record {
    every_ms: Option<u64>,
    cron: Option<String>,
    missed: String,
    partition: Option<u32>,
}

impl Service {
    /// The service's periodic jobs, by name (the ones its consumers
    /// registered; a job no consumer registers any more stays listed).
    pub async fn periodic(&self) -> Result<Vec<PeriodicJob>> {
        let conn = &self.admin.conn;
        let mut hgetall = redis::cmd("HGETALL");
        hgetall.arg(keys::periodic(&self.name));
        let (records, now_ms) = tokio::join!(
            conn.query::<HashMap<String, String>>(&hgetall),
            self.admin.now_ms()
        );
        let (records, now_ms) = (records?, now_ms?);
        let mut jobs: Vec<PeriodicJob> = records
            .into_iter()
            .map(|(name, record)| {
                let record: Record = serde_json::from_str(&record).unwrap_or_default();
                let unit = self.generations.0.route(name.as_bytes(), 0);
                let schedule = match (&record.every_ms, &record.cron) {
                    (Some(ms), _) => Some(Periodic::every(&name, Duration::from_millis(*ms))),
                    (None, Some(expression)) => Periodic::cron(&name, expression).ok(),
                    (None, None) => None,
                };
                let now = UNIX_EPOCH + Duration::from_millis(now_ms);
                let next_due_ms = schedule
                    .and_then(|s| s.next_after(now))
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map(|d| d.as_millis() as u64);
                PeriodicJob {
                    name,
                    every_ms: record.every_ms,
                    cron: record.cron,
                    missed: record.missed,
                    partition: index_of(unit),
                    generation: generation_of(unit),
                    last_due_ms: None,
                    next_due_ms,
                }
            })
            .collect();
        jobs.sort_by(|a, b| a.name.cmp(&b.name));
        if jobs.is_empty() {
            return Ok(jobs);
        }
        // Its mark in the generation in use and, around a reshard, in the
        // replaced one, whose mark is the floor of the new one's.
        let (current, from) = self.generations;
        let mut pipe = redis::pipe();
        for job in &jobs {
            let key = job.name.as_bytes();
            pipe.cmd("GET")
                .arg(keys::cron(&self.name, current.route(key, 0), &job.name));
            let replaced = from.map_or(current, |f| f).route(key, 0);
            pipe.cmd("GET")
                .arg(keys::cron(&self.name, replaced, &job.name));
        }
        let last: Vec<Option<u64>> = conn.query_pipe(&pipe).await?;
        for (job, last) in jobs.iter_mut().zip(last.chunks(2)) {
            job.last_due_ms = last[0].max(last[1]);
        }
        Ok(jobs)
    }
}
