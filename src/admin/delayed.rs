//! A service's delayed tasks (delayed enqueues and retries waiting for
//! their backoff): the soonest due, over all partitions, from a page of
//! each partition's delayed set.

use deadpool_redis::redis::{self, Value};
use serde::Serialize;

use super::Service;
use super::partitions::parse;
use crate::entry::{field, unpack_strings};
use crate::error::Result;
use crate::headers::Headers;
use crate::keys;

/// A page of delayed tasks. Its JSON: `total` and `tasks`.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Delayed {
    /// Delayed tasks over all partitions.
    pub total: u64,
    /// The soonest due ones, soonest first.
    pub tasks: Vec<DelayedTask>,
}

/// One delayed task. Its JSON: `partition`, `due_at_ms`, `due_in_ms`,
/// `task_id`, `key`, `attempt`, `codec`, `enqueued_at_ms`,
/// `payload_bytes`, `payload` (the JSON value, for a JSON payload) and
/// `payload_hex` (the bytes, for any other).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct DelayedTask {
    /// Its partition.
    pub partition: u32,
    /// When it is due, by Redis's clock (Unix ms).
    pub due_at_ms: u64,
    /// How long until then (0: due, about to move into the stream).
    pub due_in_ms: u64,
    /// The task's id.
    pub task_id: Option<String>,
    /// Its partition key, when it has one.
    pub key: Option<String>,
    /// The attempt it will run as (above 1: a retry).
    pub attempt: Option<u32>,
    /// Its payload's codec.
    pub codec: Option<String>,
    /// When it was first enqueued (the producer's clock), Unix ms.
    pub enqueued_at_ms: Option<u64>,
    /// Its payload's size in bytes.
    pub payload_bytes: usize,
    /// Its payload, when it is JSON.
    pub payload: Option<serde_json::Value>,
    /// Its payload in hex, when it is not JSON.
    pub payload_hex: Option<String>,
}

impl Service {
    /// The `limit` soonest due delayed tasks over all partitions (a page of
    /// each partition's delayed set, merged), and how many there are.
    pub async fn delayed(&self, limit: usize) -> Result<Delayed> {
        let conn = &self.admin.conn;
        let now_ms = self.admin.now_ms().await?;
        let mut pipe = redis::pipe();
        for &p in self.units().iter() {
            let key = keys::delayed(&self.name, p);
            pipe.cmd("ZCARD").arg(&key);
            pipe.cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(limit.saturating_sub(1))
                .arg("WITHSCORES");
        }
        let replies: Vec<Value> = match self.units().len() {
            0 => Vec::new(),
            _ => conn.query_pipe(&pipe).await?,
        };
        let mut total = 0;
        let mut tasks = Vec::new();
        for (&p, pair) in self.units().iter().zip(replies.chunks(2)) {
            let [count, page] = pair else {
                break;
            };
            total += parse::<u64>(count.clone())?;
            let page: Vec<(Vec<u8>, f64)> = parse(page.clone())?;
            tasks.extend(
                page.into_iter()
                    .map(|(member, due)| task(p, &member, due as u64, now_ms)),
            );
        }
        tasks.sort_by_key(|t| (t.due_at_ms, t.partition));
        tasks.truncate(limit);
        Ok(Delayed { total, tasks })
    }
}

/// What [`Service::delayed_act`] does to a delayed task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayedAction {
    /// Make it due now: the partition's owner moves it into the stream
    /// within a second (its next promotion).
    RunNow,
    /// Remove it for good.
    Delete,
}

impl Service {
    /// Does `action` to the delayed task `task_id` of `partition`, due at
    /// `due_at_ms` (as [`delayed`](Self::delayed) listed it); false when it
    /// is not delayed any more (promoted, or acted on meanwhile). Each step
    /// touches one key, so a promotion in between is never undone.
    pub async fn delayed_act(
        &self,
        partition: u32,
        due_at_ms: u64,
        task_id: &str,
        action: DelayedAction,
    ) -> Result<bool> {
        if !self.units().contains(&partition) {
            return Ok(false);
        }
        let Some(member) = self.delayed_member(partition, due_at_ms, task_id).await? else {
            return Ok(false);
        };
        let conn = &self.admin.conn;
        let key = keys::delayed(&self.name, partition);
        let changed: u64 = match action {
            DelayedAction::RunNow => {
                let now_ms = self.admin.now_ms().await?;
                let mut zadd = redis::cmd("ZADD");
                // XX: never add it back if it was promoted meanwhile.
                zadd.arg(&key).arg("XX").arg("CH").arg(now_ms).arg(&member);
                let changed: u64 = conn.query(&zadd).await?;
                if changed == 1 {
                    // The owner learns of it at its next look at the due
                    // index (within a second), not only when the task was
                    // due before.
                    conn.query::<()>(&crate::due::notice(&self.name, partition, now_ms))
                        .await?;
                }
                changed
            }
            DelayedAction::Delete => {
                let mut zrem = redis::cmd("ZREM");
                zrem.arg(&key).arg(&member);
                conn.query(&zrem).await?
            }
        };
        Ok(changed == 1)
    }
}

impl Service {
    /// Task `task_id`'s member of `partition`'s delayed set, due at
    /// `due_at_ms`; `None` when it is not there (promoted, acted on, or
    /// never delayed at that time).
    pub(super) async fn delayed_member(
        &self,
        partition: u32,
        due_at_ms: u64,
        task_id: &str,
    ) -> Result<Option<Vec<u8>>> {
        let conn = &self.admin.conn;
        let key = keys::delayed(&self.name, partition);
        // Tasks enqueued with one `at` share a score: look among them a
        // page at a time, never all at once.
        const PAGE: usize = 100;
        let mut offset = 0;
        loop {
            let mut range = redis::cmd("ZRANGE");
            range
                .arg(&key)
                .arg(due_at_ms)
                .arg(due_at_ms)
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(offset)
                .arg(PAGE);
            let members: Vec<Vec<u8>> = conn.query(&range).await?;
            let last = members.len() < PAGE;
            let found = members
                .into_iter()
                .find(|m| task(partition, m, due_at_ms, 0).task_id.as_deref() == Some(task_id));
            match found {
                Some(member) => return Ok(Some(member)),
                None if last => return Ok(None),
                None => offset += PAGE,
            }
        }
    }
}

/// The headers of a delayed set's member (its `h:<name>` fields).
pub(super) fn member_headers(member: &[u8]) -> Headers {
    let fields = unpack_strings(member).unwrap_or_default();
    let mut headers = Headers::new();
    for pair in fields.chunks(2) {
        if let [name, value] = pair {
            headers.read_field(&String::from_utf8_lossy(name), value);
        }
    }
    headers
}

/// A delayed set's member: the entry's field-value list, packed by
/// `cmsgpack` (`enqueue.lua`, `fenced_retry.lua`).
fn task(partition: u32, member: &[u8], due_at_ms: u64, now_ms: u64) -> DelayedTask {
    let fields = unpack_strings(member).unwrap_or_default();
    let get = |name: &str| {
        fields
            .chunks(2)
            .find(|kv| kv.len() == 2 && kv[0] == name.as_bytes())
            .map(|kv| kv[1].clone())
    };
    let text = |name: &str| get(name).map(|v| String::from_utf8_lossy(&v).into_owned());
    let codec = text(field::CODEC);
    let payload = get(field::PAYLOAD).unwrap_or_default();
    let shown = crate::codec::shown(codec.as_deref().unwrap_or_default(), &payload);
    DelayedTask {
        partition,
        due_at_ms,
        due_in_ms: due_at_ms.saturating_sub(now_ms),
        task_id: text(field::ID),
        key: text(field::KEY),
        attempt: text(field::ATTEMPT).and_then(|a| a.parse().ok()),
        enqueued_at_ms: text(field::ENQUEUED_AT).and_then(|t| t.parse().ok()),
        codec,
        payload_bytes: shown.payload_bytes,
        payload: shown.payload,
        payload_hex: shown.payload_hex,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_cmsgpack_packs_unpacks() {
        // cmsgpack.pack({'id', 'a', 'payload', <40 bytes>}), as Redis
        // writes it: a fixarray of a fixstr and a str8.
        let mut packed = vec![0x94, 0xa2, b'i', b'd', 0xa1, b'a', 0xa7];
        packed.extend(b"payload");
        packed.extend([0xd9, 40]);
        packed.extend([7u8; 40]);
        let items = unpack_strings(&packed).unwrap();
        assert_eq!(items.len(), 4);
        assert_eq!(items[0], b"id");
        assert_eq!(items[3], [7u8; 40]);
        // An array16 of one str16.
        let mut long = vec![0xdc, 0, 1, 0xda, 1, 0];
        long.extend([b'x'; 256]);
        assert_eq!(unpack_strings(&long).unwrap()[0].len(), 256);
    }

    #[test]
    fn garbage_is_refused_not_a_panic() {
        for bad in [
            &[][..],
            &[0x92, 0xa1],
            &[0x91, 0xa5, b'a'],
            &[0xdd, 0xff, 0xff, 0xff, 0xff],
            &[0x91, 0x01],
            &[0x90, 0x00],
        ] {
            assert_eq!(unpack_strings(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_member_becomes_a_task() {
        let fields: Vec<&[u8]> = vec![
            b"id",
            b"t-1",
            b"attempt",
            b"2",
            b"enqueued_at",
            b"1000",
            b"codec",
            b"json",
            b"payload",
            br#"{"to":"a"}"#,
        ];
        let mut packed = vec![0x90 | fields.len() as u8];
        for f in &fields {
            packed.push(0xa0 | f.len() as u8);
            packed.extend(*f);
        }
        let task = task(3, &packed, 5_000, 4_000);
        assert_eq!(task.task_id.as_deref(), Some("t-1"));
        assert_eq!((task.attempt, task.enqueued_at_ms), (Some(2), Some(1000)));
        assert_eq!((task.partition, task.due_in_ms), (3, 1_000));
        assert_eq!(task.payload, Some(serde_json::json!({"to": "a"})));
    }
}
