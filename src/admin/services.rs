//! The services on a Redis: found by their `{N}:meta` keys with `SCAN`,
//! each summed up from counters.

use std::collections::HashMap;
use std::sync::Arc;

use deadpool_redis::redis::{self, Value};
use serde::Serialize;

use super::partitions::{self, PartitionState, parse};
use super::{Admin, Settings, members};
use crate::config::ServiceName;
use crate::error::Result;
use crate::keys;

/// Keys `SCAN` looks at per call: a call stays short for Redis, and a few
/// calls cover a large keyspace.
const SCAN_COUNT: usize = 1000;

/// One service on a Redis. Its JSON: `name`, `partitions`, `codec`,
/// `instances`, `backlog`, `delayed`, `dead`, `paused`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ServiceSummary {
    /// The service's name.
    pub name: String,
    /// Its partitions, when recorded.
    pub partitions: Option<u32>,
    /// Its codec, when recorded.
    pub codec: Option<String>,
    /// Its live instances (seen within three round intervals).
    pub instances: usize,
    /// Entries not yet delivered or acked, over all partitions.
    pub backlog: u64,
    /// Delayed tasks, over all partitions.
    pub delayed: u64,
    /// Dead letters, over all partitions.
    pub dead: u64,
    /// Whether it is paused.
    pub paused: bool,
}

impl Admin {
    /// Every service on this Redis (every `{N}:meta` key, found with
    /// `SCAN`), by name.
    pub async fn services(&self) -> Result<Vec<ServiceSummary>> {
        let names = self.scan_services().await?;
        let mut pipe = redis::pipe();
        pipe.cmd("TIME");
        for name in &names {
            pipe.cmd("HGETALL").arg(keys::meta(name));
            pipe.cmd("HGETALL").arg(keys::members(name));
            pipe.cmd("EXISTS").arg(keys::paused(name));
            pipe.cmd("HGETALL").arg(keys::layout(name));
        }
        let replies: Vec<Value> = self.conn.query_pipe(&pipe).await?;
        let mut replies = replies.into_iter();
        let mut next = || replies.next().unwrap_or(Value::Nil);
        let (secs, micros): (u64, u64) = parse(next())?;
        let now_ms = secs * 1000 + micros / 1000;
        let mut read = Vec::with_capacity(names.len());
        for name in names {
            let meta: HashMap<String, String> = parse(next())?;
            let members: HashMap<String, String> = parse(next())?;
            let paused: bool = parse(next())?;
            let layout: HashMap<String, String> = parse(next())?;
            let settings = Settings::from_meta(&meta);
            let layout = crate::reshard::Layout::from_fields(&layout).ok().flatten();
            let units = settings.units(layout.as_ref());
            read.push((name, settings, members, paused, units));
        }
        let sizes: Vec<(ServiceName, Arc<[u32]>)> = read
            .iter()
            .map(|(name, _, _, _, units)| (name.clone(), units.clone()))
            .collect();
        let states = partitions::read(&self.conn, &sizes, now_ms).await?;
        Ok(read
            .into_iter()
            .zip(states)
            .map(|((name, settings, records, paused, _), states)| {
                let sum = |f: fn(&PartitionState) -> u64| states.iter().map(f).sum::<u64>();
                let interval = settings.interval();
                ServiceSummary {
                    name: name.to_string(),
                    instances: members::members(records, now_ms, interval)
                        .iter()
                        .filter(|m| m.live)
                        .count(),
                    backlog: sum(|s| s.backlog),
                    delayed: sum(|s| s.delayed),
                    dead: sum(|s| s.dead),
                    paused,
                    partitions: settings.partitions,
                    codec: settings.codec,
                }
            })
            .collect())
    }

    /// The names of the services whose `{N}:meta` exists, sorted (on a
    /// Cluster, from every master).
    pub(super) async fn scan_services(&self) -> Result<Vec<ServiceName>> {
        let mut names = Vec::new();
        for node in self.conn.key_nodes().await? {
            let node = node.as_ref().map(|(host, port)| (host.as_str(), *port));
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(keys::META_PATTERN)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, found): (u64, Vec<String>) = self.conn.query_on(&scan, node).await?;
                names.extend(found.iter().filter_map(|key| keys::service_of_meta(key)));
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        // SCAN may return a key more than once.
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        Ok(names)
    }
}
