//! One dead letter: the fields the consumer adds to a task it gives up on,
//! and how a stored letter reads back (and shows, in JSON).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, streams::StreamId};
use serde::{Serialize, Serializer};

use super::Cursor;
use crate::entry::{TaskId, field};
use crate::headers::Headers;

/// The fields the consumer adds to a task when it dead-letters it.
pub(crate) mod added {
    pub(crate) const REASON: &str = "reason";
    pub(crate) const ERROR: &str = "error";
    pub(crate) const STREAM_ID: &str = "stream_id";
    pub(crate) const DEAD_AT: &str = "dead_at";
    pub(crate) const ALL: [&str; 4] = [REASON, ERROR, STREAM_ID, DEAD_AT];
}

/// The dead letter of an entry: its `fields` with the reason, the last
/// error, the id it had in its partition stream (none for a task that
/// never reached one, such as an outbox row) and the time, now.
pub(crate) fn letter(
    mut fields: Vec<(String, Vec<u8>)>,
    reason: &str,
    error: &str,
    stream_id: Option<&str>,
) -> Vec<(String, Vec<u8>)> {
    // Reserved: a field of the task with one of these names (another
    // language's producer wrote it) would be read as the letter's own.
    fields.retain(|(name, _)| !added::ALL.contains(&name.as_str()));
    fields.push((added::REASON.into(), reason.into()));
    fields.push((added::ERROR.into(), error.into()));
    if let Some(id) = stream_id {
        fields.push((added::STREAM_ID.into(), id.into()));
    }
    let dead_at = crate::entry::now_ms().to_string().into_bytes();
    fields.push((added::DEAD_AT.into(), dead_at));
    fields
}

/// One dead letter.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The partition it came from.
    pub partition: u32,
    /// Its id in the partition's dead-letter stream.
    pub id: String,
    /// The task's id (`None` for an entry too malformed to have one).
    pub task_id: Option<TaskId>,
    /// Why: `failed` (its last attempt), `permanent` (the handler said so),
    /// `decode` (the payload does not decode), `malformed` (the entry
    /// lacks the format's fields), `too_large` (the entry is larger than
    /// the consumer's `max_entry_bytes`; kept as it was, undecoded) or
    /// `relay` (an outbox row of another codec, or over the relay's
    /// `max_payload`: it never reached a stream, so its `stream_id` is
    /// empty).
    pub reason: String,
    /// The last error.
    pub error: String,
    /// Attempts made: the last run's attempt number, interrupted runs
    /// included.
    pub attempts: u32,
    /// The runs that failed (an error or a panic), the last one included:
    /// `max_attempts` bounds these.
    pub failures: u32,
    /// The encoded payload, as enqueued.
    pub payload: Vec<u8>,
    /// The payload's codec (`bincode`, `json`), as the entry names it.
    pub codec: String,
    /// The partition key, when the task had one.
    pub key: Option<String>,
    /// The unique key (`Options::unique`), when the task had one: a replay
    /// takes it again, and is refused while another task holds it.
    pub unique: Option<String>,
    /// When the task was first enqueued (the producer's clock).
    pub enqueued_at: SystemTime,
    /// The entry's id in the partition stream it was read from.
    pub stream_id: String,
    /// When it was dead-lettered.
    pub dead_at: SystemTime,
    /// The task's headers ([`Options::header`](crate::Options::header)):
    /// a replay keeps them.
    pub headers: Headers,
    /// Every field, to replay it as it was.
    fields: Vec<(String, Vec<u8>)>,
}

impl DeadLetter {
    fn parse(partition: u32, id: String, fields: Vec<(String, Vec<u8>)>) -> Self {
        let text = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        let time = |name: &str| {
            let millis = text(name).and_then(|v| v.parse().ok()).unwrap_or(0);
            UNIX_EPOCH + Duration::from_millis(millis)
        };
        DeadLetter {
            partition,
            id,
            task_id: text(field::ID).map(|id| TaskId::from(id.as_str())),
            reason: text(added::REASON).unwrap_or_default(),
            error: text(added::ERROR).unwrap_or_default(),
            attempts: text(field::ATTEMPT)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            failures: text(field::FAILURES)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            payload: fields
                .iter()
                .find(|(k, _)| k == field::PAYLOAD)
                .map(|(_, v)| v.clone())
                .unwrap_or_default(),
            codec: text(field::CODEC).unwrap_or_default(),
            key: text(field::KEY),
            unique: text(field::UNIQUE),
            enqueued_at: time(field::ENQUEUED_AT),
            stream_id: text(added::STREAM_ID).unwrap_or_default(),
            dead_at: time(added::DEAD_AT),
            headers: {
                let mut headers = Headers::new();
                for (name, value) in &fields {
                    headers.read_field(name, value);
                }
                headers
            },
            fields,
        }
    }

    /// The letter read from `entry` of partition `partition`'s dead letters.
    pub(super) fn read(partition: u32, entry: StreamId) -> Self {
        let fields = entry
            .map
            .iter()
            .map(|(k, v)| {
                let bytes = redis::from_redis_value_ref::<Vec<u8>>(v).unwrap_or_default();
                (k.clone(), bytes)
            })
            .collect();
        DeadLetter::parse(partition, entry.id, fields)
    }

    /// Where the letter is: `<partition>/<id>`, as `--id` and `--after`
    /// take it.
    pub fn cursor(&self) -> Cursor {
        Cursor {
            partition: self.partition,
            id: self.id.clone(),
        }
    }

    /// The task as it is enqueued again: its own fields, attempt 1, no
    /// failures.
    pub(super) fn replayed(&self) -> Vec<(&str, &[u8])> {
        self.fields
            .iter()
            .filter(|(k, _)| !added::ALL.contains(&k.as_str()) && k != field::FAILURES)
            .map(|(k, v)| {
                if k == field::ATTEMPT {
                    (k.as_str(), b"1".as_slice())
                } else {
                    (k.as_str(), v.as_slice())
                }
            })
            .collect()
    }
}

/// The admin tools' JSON of a dead letter: `partition`, `id`, `ref`
/// (`<partition>/<id>`), `task_id`, `reason`, `error`, `attempts`,
/// `failures`,
/// `dead_at_ms`, `key`, `unique` (only when the task had one), `headers`
/// (an object of strings, `{}` for none), `codec`, `enqueued_at_ms`, `stream_id`,
/// `payload_bytes`, `payload` (the JSON value, for a JSON payload) and
/// `payload_hex` (the bytes, for any other).
impl Serialize for DeadLetter {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Shown<'a> {
            partition: u32,
            id: &'a str,
            #[serde(rename = "ref")]
            reference: String,
            task_id: Option<&'a str>,
            reason: &'a str,
            error: &'a str,
            attempts: u32,
            failures: u32,
            dead_at_ms: u64,
            key: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            unique: Option<&'a str>,
            headers: std::collections::BTreeMap<&'a str, &'a str>,
            codec: &'a str,
            enqueued_at_ms: u64,
            stream_id: &'a str,
            #[serde(flatten)]
            payload: crate::codec::Shown,
        }
        let ms =
            |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
        Shown {
            partition: self.partition,
            id: &self.id,
            reference: self.cursor().to_string(),
            task_id: self.task_id.as_ref().map(TaskId::as_str),
            reason: &self.reason,
            error: &self.error,
            attempts: self.attempts,
            failures: self.failures,
            dead_at_ms: ms(self.dead_at),
            key: self.key.as_deref(),
            unique: self.unique.as_deref(),
            headers: self.headers.iter().collect(),
            codec: &self.codec,
            enqueued_at_ms: ms(self.enqueued_at),
            stream_id: &self.stream_id,
            payload: crate::codec::shown(&self.codec, &self.payload),
        }
        .serialize(serializer)
    }
}
