//! A partition's waiting entries: those no instance was given yet (after
//! its consumer group's last-delivered id), oldest first, a page at a
//! time (the dashboard's page of a partition's backlog). Two bounded reads
//! of the partition's keys: `XINFO GROUPS` for where delivery stands, then
//! one `XRANGE … COUNT`. Not atomic, and it need not be: an entry
//! delivered between the two reads shows as waiting once more, which a
//! page read a moment earlier would have shown anyway.

use std::collections::HashMap;

use deadpool_redis::redis::streams::{StreamId, StreamInfoGroupsReply, StreamRangeReply};
use deadpool_redis::redis::{self, Value};

use super::Service;
use super::partitions::parse_or_missing;
use crate::entry::{TaskId, field, stream_id_order};
use crate::error::{Error, Result};
use crate::headers::Headers;
use crate::keys;

/// One page of a partition's waiting entries.
#[derive(Debug, Clone)]
pub(crate) struct Waiting {
    /// The entries, oldest first.
    pub(crate) entries: Vec<WaitingEntry>,
    /// The id to read the next page after; `None` on the last page.
    pub(crate) next: Option<String>,
    /// The consumer group's last-delivered id: entries up to it were
    /// given to an instance (`None`: no group yet, nothing delivered).
    pub(crate) delivered_to: Option<String>,
}

/// One entry waiting in a partition stream, as the producer wrote it.
#[derive(Debug, Clone)]
pub(crate) struct WaitingEntry {
    /// Its stream id (`<ms>-<seq>`, Redis's clock when it was added).
    pub(crate) id: String,
    /// How long it has waited in the stream, by Redis's clock.
    pub(crate) waited_ms: u64,
    /// The task's id; `None` for an entry without one (malformed).
    pub(crate) task_id: Option<TaskId>,
    /// The attempt it will be (1 for a first run).
    pub(crate) attempt: u32,
    /// The partition key, when the task has one.
    pub(crate) key: Option<String>,
    /// The payload's codec (`bincode`, `json`), as the entry names it.
    pub(crate) codec: String,
    /// The encoded payload.
    pub(crate) payload: Vec<u8>,
    /// Its headers.
    pub(crate) headers: Headers,
}

impl Service {
    /// Up to `count` entries of partition `partition` that wait for an
    /// instance, oldest first, after stream id `after` (from the oldest
    /// without it); `None` when the service has no such partition (in the
    /// generation in use, or the one a reshard drains). An `after` that is
    /// no stream id is an [`Error::InvalidSetting`] naming `after`.
    pub(crate) async fn waiting(
        &self,
        partition: u32,
        after: Option<&str>,
        count: usize,
    ) -> Result<Option<Waiting>> {
        if !self.units().contains(&partition) {
            return Ok(None);
        }
        let after = match after {
            Some(id) => Some(stream_id_order(id).ok_or_else(|| {
                Error::invalid("after", format!("`{id}` is no stream id (`<ms>-<seq>`)"))
            })?),
            None => None,
        };
        let stream = keys::stream(&self.name, partition);
        // In a pipeline of its own: a stream no one created yet is an
        // error reply there (nothing waits), not an error of the read.
        let mut groups = redis::pipe();
        groups.cmd("XINFO").arg("GROUPS").arg(&stream);
        let (now_ms, groups) = tokio::join!(
            self.admin.now_ms(),
            self.admin.conn.query_pipe_each::<Vec<Value>>(&mut groups)
        );
        let now_ms = now_ms?;
        let groups = groups?.pop().unwrap_or(Value::Nil);
        let delivered_to = parse_or_missing::<StreamInfoGroupsReply>(groups)?
            .and_then(|g| g.groups.into_iter().find(|g| g.name == keys::GROUP))
            .map(|g| g.last_delivered_id)
            .filter(|id| stream_id_order(id).is_some_and(|o| o != (0, 0)));
        // Past whichever is later: what was delivered is no longer waiting.
        let delivered = delivered_to.as_deref().and_then(stream_id_order);
        let from = match (after, delivered) {
            (Some(a), Some(d)) => Some(a.max(d)),
            (a, d) => a.or(d),
        };
        let start = from.map_or("-".to_owned(), |(ms, seq)| format!("({ms}-{seq}"));
        // One more than the page, to know whether another page follows.
        let mut range = redis::cmd("XRANGE");
        range
            .arg(&stream)
            .arg(&start)
            .arg("+")
            .arg("COUNT")
            .arg(count + 1);
        let reply: StreamRangeReply = self.admin.conn.query(&range).await?;
        let more = reply.ids.len() > count;
        let entries: Vec<WaitingEntry> = reply
            .ids
            .into_iter()
            .take(count)
            .map(|entry| WaitingEntry::read(entry, now_ms))
            .collect();
        let next = more.then(|| entries.last().map(|e| e.id.clone())).flatten();
        Ok(Some(Waiting {
            entries,
            next,
            delivered_to,
        }))
    }
}

impl WaitingEntry {
    /// The entry as its fields say, read at Redis time `now_ms`.
    fn read(entry: StreamId, now_ms: u64) -> WaitingEntry {
        let fields: HashMap<String, Vec<u8>> = entry
            .map
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), redis::from_redis_value_ref(v).ok()?)))
            .collect();
        let text = |name: &str| {
            fields
                .get(name)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let mut headers = Headers::new();
        for (name, value) in &fields {
            headers.read_field(name, value);
        }
        let added_ms = stream_id_order(&entry.id).map_or(now_ms, |(ms, _)| ms);
        WaitingEntry {
            waited_ms: now_ms.saturating_sub(added_ms),
            task_id: text(field::ID).map(|id| TaskId::from(id.as_str())),
            attempt: text(field::ATTEMPT)
                .and_then(|a| a.parse().ok())
                .unwrap_or(1),
            key: text(field::KEY),
            codec: text(field::CODEC).unwrap_or_default(),
            payload: fields.get(field::PAYLOAD).cloned().unwrap_or_default(),
            headers,
            id: entry.id,
        }
    }
}
