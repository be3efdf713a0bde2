//! A task as it travels: its id, and the stream entry format.
//!
//! Every entry of a partition stream has these fields, so that a producer
//! in any language can enqueue (docs/guide/03-producing.md documents them):
//!
//! | field | value |
//! |---|---|
//! | `id` | the task id: any unique string (peerq writes a UUIDv7) |
//! | `key` | the partition key, when the producer gave one (absent: the id is the key) |
//! | `attempt` | decimal, 1 for the first run |
//! | `failures` | decimal, the failed runs so far; absent: none (peerq writes it on retries) |
//! | `enqueued_at` | decimal milliseconds since the Unix epoch |
//! | `codec` | `bincode` or `json`: how `payload` is encoded |
//! | `payload` | the encoded task |
//! | `unique` | the unique key whose lock the task holds (docs/design.md §16); absent: none |
//! | `h:<name>` | header `<name>` ([`Headers`](crate::Headers)), one field each; none: no headers |
//!
//! Any other field is kept as it was through every new entry of the task
//! (a retry, a hand-back, a take-over, a dead letter and its replay), so a
//! field a later version or another language adds survives this one.
//! Reserved, never to be written by a producer: the names above and those a
//! dead letter adds (`reason`, `error`, `stream_id`, `dead_at`).
//!
//! It also decides whether a consumer can run an entry at all
//! (`Entry::read`, `Entry::decode`): an entry too large, malformed or not
//! decodable is `Unrunnable`, and its `reason()` is the dead letter's.

mod packed;
mod raw;

pub(crate) use packed::{route_key, take, unpack_strings, unsigned, value_of};

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::Value;
use serde::de::DeserializeOwned;

use crate::codec::Codec;
use crate::error::CodecError;
use crate::error::Error;
use crate::headers::Headers;
pub(crate) use crate::task_id::TaskId;

pub(crate) use self::raw::RawFields;
use self::raw::{bytes, bytes_of, entry_size, missing, text};

/// The names of an entry's fields.
pub(crate) mod field {
    pub(crate) const ID: &str = "id";
    pub(crate) const KEY: &str = "key";
    pub(crate) const ATTEMPT: &str = "attempt";
    pub(crate) const FAILURES: &str = "failures";
    pub(crate) const ENQUEUED_AT: &str = "enqueued_at";
    pub(crate) const CODEC: &str = "codec";
    pub(crate) const PAYLOAD: &str = "payload";
    /// The unique key (`Options::unique`), while the task holds its lock.
    pub(crate) const UNIQUE: &str = "unique";
    /// A batch member's batch id (docs/design.md §19), among the fields
    /// the entry keeps without reading them.
    pub(crate) const BATCH: &str = "batch";
    /// Present (`1`) on a member whose batch wants its result.
    pub(crate) const BATCH_RESULTS: &str = "batch_results";
    /// Every field of the format, which the entry reads itself.
    pub(crate) const ALL: [&str; 8] = [
        ID,
        KEY,
        ATTEMPT,
        FAILURES,
        ENQUEUED_AT,
        CODEC,
        PAYLOAD,
        UNIQUE,
    ];
}

/// A field's name as [`Entry::fields`] gives it: the format's own are
/// static, a header's and an unknown field's are the entry's.
pub(crate) type FieldName = Cow<'static, str>;

/// A stream id `<ms>-<seq>` (or `<ms>`) as numbers, which order as the ids
/// do; `None` if it is not one.
pub(crate) fn stream_id_order(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

/// Now, in milliseconds since the Unix epoch (an entry's `enqueued_at`).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// A first attempt's field-value pairs to `XADD`, borrowed (a batch's
/// entries are written without a copy): the fields of
/// [`Entry::fields`] for an entry without a key.
pub(crate) fn first_attempt<'a>(
    id: &'a str,
    enqueued_at: &'a str,
    codec: &'a str,
    payload: &'a [u8],
) -> [(&'static str, &'a [u8]); 5] {
    [
        (field::ID, id.as_bytes()),
        (field::ATTEMPT, b"1"),
        (field::ENQUEUED_AT, enqueued_at.as_bytes()),
        (field::CODEC, codec.as_bytes()),
        (field::PAYLOAD, payload),
    ]
}

/// One task as stored in a partition stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) id: TaskId,
    pub(crate) key: Option<String>,
    pub(crate) attempt: u32,
    /// The runs of the task that failed so far (docs/design.md §6, attempt
    /// counting): only they spend `max_attempts`, not the runs a drain or
    /// a lapsed lease interrupted, which `attempt` counts too.
    pub(crate) failures: u32,
    pub(crate) enqueued_at: Duration,
    pub(crate) codec: String,
    pub(crate) payload: Vec<u8>,
    /// The unique key whose lock the task holds (docs/design.md §16): kept
    /// through every new entry of the task, so the script that ends it
    /// frees the lock.
    pub(crate) unique: Option<String>,
    /// The task's headers (`h:<name>` fields), kept through every new
    /// entry of the task.
    pub(crate) headers: Headers,
    /// The fields the format does not know (a later version's, another
    /// language's), in their order: kept as they were.
    pub(crate) extra: Vec<(String, Vec<u8>)>,
}

/// An entry whose fields do not follow the format: it cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed entry: {0}")]
pub(crate) struct MalformedEntry(pub(crate) String);

/// Why a consumer cannot run an entry; it goes to the dead letters with
/// [`reason`](Self::reason).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unrunnable {
    /// Larger than the consumer's `max_entry_bytes`: nothing of it was
    /// parsed or decoded.
    #[error("entry of {size} bytes exceeds the limit of {limit} bytes (`max_entry_bytes`)")]
    TooLarge { size: usize, limit: usize },
    /// Its fields do not follow the format.
    #[error(transparent)]
    Malformed(#[from] MalformedEntry),
    /// Its payload does not decode into the task type, or was written with
    /// another codec.
    #[error("{0}")]
    Decode(String),
}

impl Unrunnable {
    /// The dead letter's `reason` field.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Unrunnable::TooLarge { .. } => "too_large",
            Unrunnable::Malformed(_) => "malformed",
            Unrunnable::Decode(_) => "decode",
        }
    }
}

/// The smallest `max_entry_bytes` a consumer accepts: the fields besides
/// the payload take about 100 bytes (their names, a UUID id, two decimal
/// numbers, the codec's name), so below 1 KiB hardly any task would pass.
const MIN_ENTRY_BYTES: usize = 1024;

/// The largest `max_entry_bytes`: Redis's own limit on one value
/// (`proto-max-bulk-len`, 512 MiB by default).
const MAX_ENTRY_BYTES: usize = 512 * 1024 * 1024;

/// Checks a consumer's `max_entry_bytes`.
pub(crate) fn validate_max_entry_bytes(bytes: usize) -> crate::error::Result<()> {
    if !(MIN_ENTRY_BYTES..=MAX_ENTRY_BYTES).contains(&bytes) {
        return Err(Error::invalid(
            "max_entry_bytes",
            format!(
                "{bytes} bytes is out of range; use {MIN_ENTRY_BYTES} (1 KiB) to \
                 {MAX_ENTRY_BYTES} (512 MiB), more than the producers' `max_payload` \
                 plus a few hundred bytes for the other fields"
            ),
        ));
    }
    Ok(())
}

impl Entry {
    /// A first attempt of `payload`, enqueued now.
    pub(crate) fn new(id: TaskId, key: Option<String>, codec: &str, payload: Vec<u8>) -> Self {
        Entry {
            id,
            key,
            attempt: 1,
            failures: 0,
            // Milliseconds are what the entry stores.
            enqueued_at: Duration::from_millis(now_ms()),
            codec: codec.to_owned(),
            payload,
            unique: None,
            headers: Headers::new(),
            extra: Vec::new(),
        }
    }

    /// The field-value pairs to `XADD`: the format's, the headers, and the
    /// fields it does not know.
    pub(crate) fn fields(&self) -> Vec<(FieldName, Vec<u8>)> {
        let mut fields: Vec<(FieldName, Vec<u8>)> = vec![
            (field::ID.into(), self.id.as_str().as_bytes().to_vec()),
            (field::ATTEMPT.into(), self.attempt.to_string().into_bytes()),
            (
                field::ENQUEUED_AT.into(),
                self.enqueued_at.as_millis().to_string().into_bytes(),
            ),
            (field::CODEC.into(), self.codec.as_bytes().to_vec()),
            (field::PAYLOAD.into(), self.payload.clone()),
        ];
        if let Some(key) = &self.key {
            fields.push((field::KEY.into(), key.as_bytes().to_vec()));
        }
        if let Some(unique) = &self.unique {
            fields.push((field::UNIQUE.into(), unique.as_bytes().to_vec()));
        }
        // Absent while none failed: a first attempt looks as any producer
        // writes it.
        if self.failures > 0 {
            let failures = self.failures.to_string().into_bytes();
            fields.push((field::FAILURES.into(), failures));
        }
        fields.extend(self.headers.fields().map(|(n, v)| (n.into(), v)));
        fields.extend(
            self.extra
                .iter()
                .map(|(n, v)| (n.clone().into(), v.clone())),
        );
        fields
    }

    /// The batch this task is a member of (docs/design.md §19), if any
    /// (its `batch` field, kept among the fields this module does not
    /// read), and whether the batch wants its result (`batch_results`).
    pub(crate) fn member_of(&self) -> Option<(&str, bool)> {
        use self::field::{BATCH, BATCH_RESULTS};
        let (_, value) = self.extra.iter().find(|(name, _)| name == BATCH)?;
        let wants = self.extra.iter().any(|(name, _)| name == BATCH_RESULTS);
        Some((std::str::from_utf8(value).ok()?, wants))
    }

    /// The partition key: the given key, else the id.
    pub(crate) fn partition_key(&self) -> &str {
        self.key.as_deref().unwrap_or(self.id.as_str())
    }

    /// Reads an entry a consumer may run from a stream reply's fields: at
    /// most `max_bytes` large, counted before anything is parsed (so an
    /// oversized entry, which anyone with `XADD` can write, never reaches a
    /// decoder), and with the format's fields. The payload's bytes move
    /// into the entry; an entry that cannot run gives its fields back
    /// untouched, for the dead letters.
    pub(crate) fn read(
        mut fields: RawFields,
        max_bytes: usize,
    ) -> Result<Entry, (Unrunnable, RawFields)> {
        let size = entry_size(&fields);
        if size > max_bytes {
            let too_large = Unrunnable::TooLarge {
                size,
                limit: max_bytes,
            };
            return Err((too_large, fields));
        }
        match Entry::parse(&mut fields) {
            Ok(entry) => Ok(entry),
            Err(e) => Err((e.into(), fields)),
        }
    }

    /// The task, decoded with the service's codec.
    pub(crate) fn decode<T: DeserializeOwned, C: Codec>(&self, codec: &C) -> Result<T, Unrunnable> {
        if self.codec != C::NAME {
            return Err(Unrunnable::Decode(format!(
                "entry is encoded with `{}`, this service uses `{}`",
                self.codec,
                C::NAME
            )));
        }
        // A codec or a payload type's `Deserialize` may panic on hostile
        // bytes: that is this entry's decode failure (dead-lettered), never
        // a lost worker task with the entry left pending for good.
        let decoded =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| codec.decode(&self.payload)))
                .unwrap_or_else(|panic| {
                    Err(CodecError {
                        codec: C::NAME,
                        message: format!(
                            "decoding panicked: {}",
                            crate::error::panic_message(&*panic)
                        ),
                    })
                })
                .map_err(|e| e.message);
        // Most often a producer enqueued a value of another type: say which
        // type the handler expects, and with which codec.
        decoded.map_err(|cause| {
            Unrunnable::Decode(format!(
                "the payload does not decode as the handler's task type `{}` with the `{}` \
                 codec ({cause}); was it enqueued as another type?",
                std::any::type_name::<T>(),
                C::NAME
            ))
        })
    }

    /// Reads an entry from a stream reply's fields; they are left as they
    /// were unless it succeeds (then the payload is taken out).
    fn parse(fields: &mut RawFields) -> Result<Entry, MalformedEntry> {
        let required = |name: &'static str| fields.find(name).ok_or_else(|| missing(name));
        let id = text(fields, required(field::ID)?)?.to_owned();
        let attempt = text(fields, required(field::ATTEMPT)?)?
            .parse::<u32>()
            .map_err(|e| MalformedEntry(format!("`attempt`: {e}")))?;
        let enqueued_ms = text(fields, required(field::ENQUEUED_AT)?)?
            .parse::<u64>()
            .map_err(|e| MalformedEntry(format!("`enqueued_at`: {e}")))?;
        let codec = text(fields, required(field::CODEC)?)?.to_owned();
        let key = match fields.find(field::KEY) {
            Some(key) => Some(text(fields, key)?.to_owned()),
            None => None,
        };
        let unique = match fields.find(field::UNIQUE) {
            Some(unique) => Some(text(fields, unique)?.to_owned()),
            None => None,
        };
        let failures = match fields.find(field::FAILURES) {
            Some(failures) => text(fields, failures)?
                .parse::<u32>()
                .map_err(|e| MalformedEntry(format!("`failures`: {e}")))?,
            None => 0,
        };
        let payload = required(field::PAYLOAD)?;
        bytes(fields, payload)?;
        // Checked: only now is anything taken.
        let payload = match std::mem::take(&mut fields.0[payload]) {
            Value::BulkString(b) => b,
            Value::SimpleString(s) => s.into_bytes(),
            _ => unreachable!("checked by `bytes`"),
        };
        let (headers, extra) = Entry::others(fields);
        Ok(Entry {
            id: TaskId::from(id.as_str()),
            key,
            attempt,
            failures,
            enqueued_at: Duration::from_millis(enqueued_ms),
            codec,
            payload,
            unique,
            headers,
            extra,
        })
    }

    /// The headers and the unknown fields among `fields` (a name written
    /// twice: its last value, in the place of its first).
    fn others(fields: &RawFields) -> (Headers, Vec<(String, Vec<u8>)>) {
        let mut headers = Headers::new();
        let mut extra: Vec<(String, Vec<u8>)> = Vec::new();
        for pair in fields.0.chunks(2) {
            let (Some(name), Some(value)) = (bytes_of(&pair[0]), pair.get(1).and_then(bytes_of))
            else {
                continue;
            };
            // The format's own fields, the most of every entry, are told
            // by their bytes: no UTF-8 check, no copy.
            if field::ALL.iter().any(|f| f.as_bytes() == name) {
                continue;
            }
            let name = String::from_utf8_lossy(name);
            if headers.read_field(&name, value) {
                continue;
            }
            match extra.iter_mut().find(|(n, _)| **n == *name) {
                Some((_, v)) => *v = value.to_vec(),
                None => extra.push((name.into_owned(), value.to_vec())),
            }
        }
        (headers, extra)
    }
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests;
