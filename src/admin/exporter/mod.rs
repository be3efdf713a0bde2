//! The queue figures of the services on a Redis, read from Redis alone, as
//! Prometheus gauges: what `peerq exporter` serves. An instance reports its
//! own service's figures, but an autoscaler that scales a service to zero
//! has no instance left to ask; these reads need none, so a service with
//! work waiting and no instance still shows its backlog.
//!
//! It owns the reads and the text exposition, so both are tested without
//! HTTP; serving them is the CLI's (`src/bin/peerq/exporter.rs`).
//!
//! A service at zero instances moves no due delayed task or retry into its
//! stream (only a partition's owner does), so the backlog counts the due
//! ones as well as the stream entries not yet delivered: an autoscaler
//! that saw the streams alone would never wake a service whose only work
//! is a retry. Entries delivered and not acked are running, not waiting,
//! and are not backlog, unless no instance is live: then they were left
//! by one that is gone (a leave that timed out, a crash), and wait for an
//! instance to start and claim them, so they count.
//!
//! **Cost of a scrape**, with S services and U partitions over them (every
//! priority level's, and both generations while a reshard runs, so the old
//! layout's draining entries count): three round trips, each one pipeline
//! for every service together, of single-key commands only (never a
//! script or a `MULTI`: under Redis Cluster the keys live in different
//! slots):
//!
//! 1. `TIME`, and per service `HGETALL` of `{N}:meta`, `{N}:layout` and
//!    `{N}:members` and `EXISTS {N}:paused`: 1 + 4S commands;
//! 2. per partition `XLEN` and `XINFO GROUPS` of the stream, `ZCOUNT` (due
//!    now) and `ZCARD` of `{N/p}:delayed`, `XLEN` of `{N/p}:dead`: 5U;
//! 3. per partition with entries not yet delivered, `XRANGE` of the one
//!    after the group's last delivered id (`COUNT 1`): at most U. (On a
//!    Redis that cannot tell a group's lag, before 7.0, `COUNT 100`, which
//!    counts them too: see `undelivered.rs`.)
//!
//! The figures are read at every scrape, never cached. The list of
//! services is: the names given ([`Exporter::only`]), which costs no scan;
//! or the `{N}:meta` keys a `SCAN MATCH {*}:meta` finds (never `KEYS`),
//! at most once per [`Exporter::rescan`] period, kept in between.

mod exposition;
mod undelivered;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_redis::redis::streams::StreamInfoGroupsReply;
use deadpool_redis::redis::streams::StreamRangeReply;
use deadpool_redis::redis::{self, Value};
use serde::Serialize;
use tokio::time::Instant;

use super::partitions::{parse, parse_or_missing};
use super::{Admin, Settings, members};
use crate::config::ServiceName;
use crate::error::{Error, Result};
use crate::keys;
use undelivered::Undelivered;

/// How often [`Exporter`] looks for new services by default.
const DEFAULT_RESCAN: Duration = Duration::from_secs(60);

/// The commands of the second round trip, per partition, in this order.
const READS: usize = 5;

/// One service's queue figures, as read at one moment. Its JSON: `name`,
/// `backlog`, `oldest_waiting_ms`, `delayed`, `dead`, `instances`,
/// `paused`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ServiceGauges {
    /// The service's name.
    pub name: String,
    /// Tasks waiting to start: entries of its partition streams not yet
    /// delivered to the consumer group, plus delayed tasks and retries
    /// already due (which wait for an owner to move them into the stream).
    /// Entries being handled (delivered, not acked) are not in it.
    pub backlog: u64,
    /// How long the oldest stream entry not yet delivered has waited: Redis's
    /// clock now less the time in its stream id, in milliseconds; 0 when
    /// none waits.
    pub oldest_waiting_ms: u64,
    /// Delayed tasks and retries waiting, due or not.
    pub delayed: u64,
    /// Dead letters.
    pub dead: u64,
    /// Live instances: members seen within three round intervals, as
    /// [`Service::status`](super::Service::status) counts them.
    pub instances: u64,
    /// Whether it is paused.
    pub paused: bool,
}

/// Reads the [`ServiceGauges`] of the services on a Redis at each call, and
/// writes them in the Prometheus text format.
///
/// ```no_run
/// # async fn demo() -> peerq::Result<()> {
/// use peerq::admin::{Admin, Exporter};
///
/// let exporter = Exporter::new(Admin::connect("redis://127.0.0.1/").await?).only(["mail-sender"])?;
/// print!("{}", exporter.scrape().await?); // peerq_service_backlog_entries{service="mail-sender"} 12 …
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Exporter {
    admin: Admin,
    /// The services named, sorted; `None`: every service a scan finds.
    only: Option<Arc<[ServiceName]>>,
    rescan: Duration,
    /// What the last scan found, and when it ran.
    scanned: Mutex<Option<(Instant, Arc<[ServiceName]>)>>,
}

impl Exporter {
    /// An exporter of every service on `admin`'s Redis, found with a scan at
    /// most once a minute.
    #[must_use]
    pub fn new(admin: Admin) -> Exporter {
        Exporter {
            admin,
            only: None,
            rescan: DEFAULT_RESCAN,
            scanned: Mutex::new(None),
        }
    }

    /// Only these services, and no scan: a service named here that never
    /// recorded its `{N}:meta` is left out until it does. A name that is
    /// not a service name is an [`Error::InvalidSetting`] naming `name`.
    pub fn only<I>(mut self, names: I) -> Result<Exporter>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut only = names
            .into_iter()
            .map(|name| ServiceName::new(name.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        only.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        only.dedup();
        self.only = Some(only.into());
        Ok(self)
    }

    /// How often to look for services with a `SCAN` of the keyspace
    /// (default 60 s): a new service shows up within this.
    #[must_use]
    pub fn rescan(mut self, every: Duration) -> Exporter {
        self.rescan = every;
        self
    }

    /// The figures of every service, by name, read now (in three round
    /// trips; see the module's documentation).
    pub async fn read(&self) -> Result<Vec<ServiceGauges>> {
        let names = self.names().await?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let (now_ms, mut services) = self.services(&names).await?;
        self.partitions(&mut services, now_ms).await?;
        Ok(services.into_iter().map(|s| s.gauges).collect())
    }

    /// The figures of every service, read now, in the Prometheus text
    /// format (version 0.0.4).
    pub async fn scrape(&self) -> Result<String> {
        Ok(exposition::exposition(&self.read().await?))
    }

    /// The services to read: the names given, or the last scan's (scanning
    /// again once it is older than the rescan period).
    async fn names(&self) -> Result<Arc<[ServiceName]>> {
        if let Some(only) = &self.only {
            return Ok(only.clone());
        }
        if let Some(names) = self.still_scanned() {
            return Ok(names);
        }
        // Not under the lock, which a scan would hold across its awaits:
        // two scrapes at once may both scan, which costs a scan more.
        let names: Arc<[ServiceName]> = self.admin.scan_services().await?.into();
        *self.scanned.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Instant::now(), names.clone()));
        Ok(names)
    }

    /// The last scan's names, while younger than the rescan period.
    fn still_scanned(&self) -> Option<Arc<[ServiceName]>> {
        let scanned = self.scanned.lock().unwrap_or_else(PoisonError::into_inner);
        let (at, names) = scanned.as_ref()?;
        (at.elapsed() < self.rescan).then(|| names.clone())
    }

    /// Redis's clock, and what each service's own keys say (round trip
    /// 1); a service whose `{N}:meta` is gone (or never was) is left out.
    async fn services(&self, names: &[ServiceName]) -> Result<(u64, Vec<Read>)> {
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        for name in names {
            pipe.cmd("HGETALL").arg(keys::meta(name));
            pipe.cmd("HGETALL").arg(keys::layout(name));
            pipe.cmd("HGETALL").arg(keys::members(name));
            pipe.cmd("EXISTS").arg(keys::paused(name));
        }
        let replies: Vec<Value> = self.admin.conn.query_pipe(&pipe).await?;
        let mut replies = replies.into_iter();
        let mut next = || replies.next().ok_or_else(short_reply);
        let (secs, micros): (u64, u64) = parse(next()?)?;
        let now_ms = secs * 1000 + micros / 1000;
        let mut read = Vec::with_capacity(names.len());
        for name in names {
            let meta: HashMap<String, String> = parse(next()?)?;
            let layout: HashMap<String, String> = parse(next()?)?;
            let records: HashMap<String, String> = parse(next()?)?;
            let paused: bool = parse(next()?)?;
            if meta.is_empty() {
                continue;
            }
            let settings = Settings::from_meta(&meta);
            let layout = crate::reshard::Layout::from_fields(&layout).ok().flatten();
            let live = members::members(records, now_ms, settings.interval())
                .iter()
                .filter(|m| m.live)
                .count();
            read.push(Read {
                units: settings.units(layout.as_ref()),
                name: name.clone(),
                gauges: ServiceGauges {
                    name: name.to_string(),
                    instances: live as u64,
                    paused,
                    ..ServiceGauges::default()
                },
            });
        }
        Ok((now_ms, read))
    }

    /// Adds the partitions' figures to `services` (round trips 2 and 3).
    async fn partitions(&self, services: &mut [Read], now_ms: u64) -> Result<()> {
        let mut pipe = redis::pipe();
        for service in services.iter() {
            for &p in service.units.iter() {
                let (stream, delayed) = (
                    keys::stream(&service.name, p),
                    keys::delayed(&service.name, p),
                );
                pipe.cmd("XLEN").arg(&stream);
                pipe.cmd("XINFO").arg("GROUPS").arg(&stream);
                pipe.cmd("ZCOUNT").arg(&delayed).arg("-inf").arg(now_ms);
                pipe.cmd("ZCARD").arg(&delayed);
                pipe.cmd("XLEN").arg(keys::dead(&service.name, p));
            }
        }
        // A stream no one wrote to yet makes `XINFO` fail: an answer
        // (nothing there), not an error of the whole read.
        let replies: Vec<Value> = self.admin.conn.query_pipe_each(&mut pipe).await?;
        let mut replies = replies.into_iter();
        // The entries to look for, per service: (partition, what waits).
        let mut waiting: Vec<Vec<(u32, Undelivered)>> = Vec::with_capacity(services.len());
        for service in services.iter_mut() {
            let mut found = Vec::new();
            for &p in service.units.iter() {
                let reply: Vec<Value> = replies.by_ref().take(READS).collect();
                let [length, groups, due, delayed, dead] =
                    <[Value; READS]>::try_from(reply).map_err(|_| short_reply())?;
                let gauges = &mut service.gauges;
                gauges.backlog += parse::<u64>(due)?;
                gauges.delayed += parse::<u64>(delayed)?;
                gauges.dead += parse::<u64>(dead)?;
                let groups: Option<StreamInfoGroupsReply> = parse_or_missing(groups)?;
                if gauges.instances == 0 {
                    // Delivered to an instance that is gone (a leave that
                    // timed out, a crash): no one runs them until one
                    // starts and claims them, so they wait as the rest do.
                    let pending = groups.iter().flat_map(|g| &g.groups);
                    gauges.backlog += pending.map(|g| g.pending as u64).sum::<u64>();
                }
                match Undelivered::of(parse(length)?, groups) {
                    Undelivered::None => {}
                    undelivered => found.push((p, undelivered)),
                }
            }
            waiting.push(found);
        }
        self.oldest(services, waiting, now_ms).await
    }

    /// Reads the first undelivered entry of each partition in `waiting`
    /// (round trip 3): its age, and with no lag known, the count.
    async fn oldest(
        &self,
        services: &mut [Read],
        waiting: Vec<Vec<(u32, Undelivered)>>,
        now_ms: u64,
    ) -> Result<()> {
        if waiting.iter().all(Vec::is_empty) {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (service, found) in services.iter().zip(&waiting) {
            for (p, undelivered) in found {
                let Some((start, count)) = undelivered.range() else {
                    continue;
                };
                pipe.cmd("XRANGE")
                    .arg(keys::stream(&service.name, *p))
                    .arg(start)
                    .arg("+")
                    .arg("COUNT")
                    .arg(count);
            }
        }
        let replies: Vec<StreamRangeReply> = self.admin.conn.query_pipe(&pipe).await?;
        let mut replies = replies.into_iter();
        for (service, found) in services.iter_mut().zip(waiting) {
            for (_, undelivered) in found {
                // As sent: a read per partition with a range.
                if undelivered.range().is_none() {
                    continue;
                }
                let entries = replies.next().ok_or_else(short_reply)?.ids;
                let gauges = &mut service.gauges;
                gauges.backlog += undelivered.count(entries.len() as u64);
                // A stream id is `<ms>-<seq>`, the ms of the entry's write.
                let written = entries
                    .first()
                    .and_then(|e| e.id.split('-').next()?.parse::<u64>().ok());
                if let Some(written) = written {
                    let age = now_ms.saturating_sub(written);
                    gauges.oldest_waiting_ms = gauges.oldest_waiting_ms.max(age);
                }
            }
        }
        Ok(())
    }
}

/// One service being read: its name, partitions and figures so far.
struct Read {
    name: ServiceName,
    units: Arc<[u32]>,
    gauges: ServiceGauges,
}

/// A pipeline that answered fewer commands than it was sent.
fn short_reply() -> Error {
    Error::Runtime("redis answered fewer commands than the pipeline sent".to_owned())
}
