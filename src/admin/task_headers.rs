//! A tracked task's headers (docs/design.md §14, §18), read from its entry
//! where its record says the entry is: the record holds no headers (it is
//! written whole on every task's end, and kept small for that), the entry
//! does, as its `h:<name>` fields.
//!
//! - `dead`: its dead letter (`dead_id`), one read;
//! - `delayed`, `retrying` after a backoff: the delayed set under its due
//!   time, a page of the tasks due then; promoted meanwhile, the stream;
//! - `waiting`, `running`, and a task with a cancel request alone: the
//!   stream, read a page at a time from a little before its enqueue time
//!   (every entry of a task is added after it), at most [`MOST`] entries;
//! - `succeeded`, `cancelled`: none is read. The entry is acked at the end
//!   and trimmed within a second or so: a read would find it or not by
//!   chance, so `task show` and `task wait` would disagree.
//!
//! `None` when no entry is found: the JSON's `null`.

use std::time::{Duration, UNIX_EPOCH};

use deadpool_redis::redis::{self, streams::StreamRangeReply};

use super::Service;
use super::delayed::member_headers;
use crate::dead_letters::Cursor;
use crate::entry::field;
use crate::error::Result;
use crate::headers::Headers;
use crate::keys;
use crate::tracking::{TaskRecord, TaskState};

/// How long before its `enqueued_at` (the producer's clock) a task's first
/// entry is looked for: its stream id is Redis's clock.
const SKEW: Duration = Duration::from_secs(10);

/// Entries read per page of the stream.
const PAGE: usize = 200;

/// The most entries of the stream read for one task: a task deeper than
/// this in a backlog (or enqueued by a producer whose clock runs more than
/// [`SKEW`] ahead of Redis's) shows no headers rather than a read of the
/// whole backlog.
const MOST: usize = 10_000;

impl Service {
    /// The headers of `record`'s task, from its entry; `None` when its
    /// entry is gone or not found.
    pub(super) async fn headers_of(&self, record: &TaskRecord) -> Result<Option<Headers>> {
        let Some(p) = record.handle.partition() else {
            return Ok(None);
        };
        let id = record.handle.id().as_str();
        match record.state {
            Some(TaskState::Succeeded | TaskState::Cancelled) => return Ok(None),
            Some(TaskState::Dead) => return self.letter_headers(p, record).await,
            Some(TaskState::Delayed | TaskState::Retrying) => {
                if let Some(due) = record.due_at.and_then(unix_ms) {
                    let member = self.delayed_member(p, due, id).await?;
                    if let Some(member) = member {
                        return Ok(Some(member_headers(&member)));
                    }
                }
            }
            _ => {}
        }
        let from = record.enqueued_at.and_then(unix_ms);
        self.stream_headers(p, id, from).await
    }

    /// The headers of a dead task's letter; `None` when it has none (it
    /// was purged).
    async fn letter_headers(&self, p: u32, record: &TaskRecord) -> Result<Option<Headers>> {
        let Some(id) = record.dead_id.clone() else {
            return Ok(None);
        };
        let cursor = Cursor { partition: p, id };
        let letter = self.dead_letters().get(&cursor).await?;
        Ok(letter.map(|l| l.headers))
    }

    /// The headers of task `id`'s entry in partition `p`'s stream, looked
    /// for from [`SKEW`] before `enqueued_ms` (from the start without it).
    async fn stream_headers(
        &self,
        p: u32,
        id: &str,
        enqueued_ms: Option<u64>,
    ) -> Result<Option<Headers>> {
        let key = keys::stream(&self.name, p);
        let skew = SKEW.as_millis() as u64;
        let mut start = enqueued_ms.map_or("-".to_owned(), |ms| {
            format!("{}-0", ms.saturating_sub(skew))
        });
        let mut read = 0;
        while read < MOST {
            let mut range = redis::cmd("XRANGE");
            range.arg(&key).arg(&start).arg("+").arg("COUNT").arg(PAGE);
            let page: StreamRangeReply = self.admin.conn.query(&range).await?;
            for entry in &page.ids {
                if text(entry.map.get(field::ID)).as_deref() == Some(id) {
                    let mut headers = Headers::new();
                    for (name, value) in &entry.map {
                        if let Some(value) = bytes(value) {
                            headers.read_field(name, &value);
                        }
                    }
                    return Ok(Some(headers));
                }
            }
            let Some(last) = page.ids.last().filter(|_| page.ids.len() == PAGE) else {
                return Ok(None);
            };
            start = format!("({}", last.id);
            read += PAGE;
        }
        Ok(None)
    }
}

fn bytes(value: &redis::Value) -> Option<Vec<u8>> {
    redis::from_redis_value_ref::<Vec<u8>>(value).ok()
}

fn text(value: Option<&redis::Value>) -> Option<String> {
    value
        .and_then(bytes)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn unix_ms(time: std::time::SystemTime) -> Option<u64> {
    time.duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}
