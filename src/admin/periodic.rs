//! A service's periodic jobs: their schedules from `{N}:periodic`, the last
//! due time each triggered (`{N/p}:cron:<job>`) and the next one.

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use deadpool_redis::redis;
use serde::{Deserialize, Serialize};

use super::Service;
use crate::error::Result;
use crate::keys;
use crate::partition::partition_of;
use crate::periodic::Periodic;

/// One periodic job. Its JSON: `name`, `every_ms` (null for a cron job),
/// `cron` (null for an interval job), `missed` (`skip`, `run_once`),
/// `partition`, `last_due_ms`, `next_due_ms`.
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
    /// The partition its tasks go to.
    pub partition: u32,
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
                let partition = record
                    .partition
                    .unwrap_or_else(|| partition_of(name.as_bytes(), self.partitions().max(1)));
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
                    partition,
                    last_due_ms: None,
                    next_due_ms,
                }
            })
            .collect();
        jobs.sort_by(|a, b| a.name.cmp(&b.name));
        if jobs.is_empty() {
            return Ok(jobs);
        }
        let mut pipe = redis::pipe();
        for job in &jobs {
            pipe.cmd("GET")
                .arg(keys::cron(&self.name, job.partition, &job.name));
        }
        let last: Vec<Option<u64>> = conn.query_pipe(&pipe).await?;
        for (job, last) in jobs.iter_mut().zip(last) {
            job.last_due_ms = last;
        }
        Ok(jobs)
    }
}
