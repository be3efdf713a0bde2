//! A task as it travels: its id, and the stream entry format.
//!
//! Every entry of a partition stream has these fields, so that a producer
//! in any language can enqueue (the README documents them):
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
//!
//! It also decides whether a consumer can run an entry at all
//! (`Entry::read`, `Entry::decode`): an entry too large, malformed or not
//! decodable is `Unrunnable`, and its `reason()` is the dead letter's.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::Value;
use serde::de::DeserializeOwned;

use crate::codec::Codec;
use crate::error::CodecError;
use crate::error::Error;
pub(crate) use crate::task_id::TaskId;

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

/// An entry's fields as a stream reply holds them: names and values
/// alternating, in stream order (a name written twice: its last value
/// counts). Kept as the reply's own array, so reading an entry copies
/// nothing but its short text fields.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RawFields(pub(crate) Vec<Value>);

impl RawFields {
    /// Where the value of field `name` is (its last one).
    fn find(&self, name: &str) -> Option<usize> {
        let is = |v: &Value| bytes_of(v) == Some(name.as_bytes());
        (0..self.0.len())
            .step_by(2)
            .rev()
            .find(|&i| is(&self.0[i]))
            .map(|i| i + 1)
    }

    /// The fields as names and bytes, as a dead letter keeps them: a name
    /// that is not UTF-8 lossily, a value that is no string as nothing.
    pub(crate) fn into_named(self) -> Vec<(String, Vec<u8>)> {
        let mut values = self.0.into_iter();
        let mut named = Vec::new();
        while let Some(name) = values.next() {
            let value = values.next().unwrap_or(Value::Nil);
            let name = match name {
                Value::BulkString(b) => String::from_utf8(b)
                    .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()),
                Value::SimpleString(s) => s,
                other => format!("{other:?}"),
            };
            let value = match value {
                Value::BulkString(b) => b,
                Value::SimpleString(s) => s.into_bytes(),
                _ => Vec::new(),
            };
            named.push((name, value));
        }
        named
    }
}

/// The bytes of a string value.
fn bytes_of(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// An entry's size as the limit counts it: its field names' and values'
/// bytes. Redis sends stream names and values as bulk strings; any other
/// value (not one Redis writes into a stream) counts nothing here, and
/// `parse` refuses it in a format field.
fn entry_size(fields: &RawFields) -> usize {
    fields
        .0
        .iter()
        .map(|v| bytes_of(v).map_or(0, <[u8]>::len))
        .fold(0, usize::saturating_add)
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
        }
    }

    /// The field-value pairs to `XADD`.
    pub(crate) fn fields(&self) -> Vec<(&'static str, Vec<u8>)> {
        let mut fields = vec![
            (field::ID, self.id.as_str().as_bytes().to_vec()),
            (field::ATTEMPT, self.attempt.to_string().into_bytes()),
            (
                field::ENQUEUED_AT,
                self.enqueued_at.as_millis().to_string().into_bytes(),
            ),
            (field::CODEC, self.codec.as_bytes().to_vec()),
            (field::PAYLOAD, self.payload.clone()),
        ];
        if let Some(key) = &self.key {
            fields.push((field::KEY, key.as_bytes().to_vec()));
        }
        if let Some(unique) = &self.unique {
            fields.push((field::UNIQUE, unique.as_bytes().to_vec()));
        }
        // Absent while none failed: a first attempt looks as any producer
        // writes it.
        if self.failures > 0 {
            fields.push((field::FAILURES, self.failures.to_string().into_bytes()));
        }
        fields
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
        Ok(Entry {
            id: TaskId::from(id.as_str()),
            key,
            attempt,
            failures,
            enqueued_at: Duration::from_millis(enqueued_ms),
            codec,
            payload,
            unique,
        })
    }
}

fn missing(field: &str) -> MalformedEntry {
    MalformedEntry(format!("no `{field}` field"))
}

/// The bytes of the value at `at`, the value of field `at - 1`.
fn bytes(fields: &RawFields, at: usize) -> Result<&[u8], MalformedEntry> {
    let value = fields.0.get(at).unwrap_or(&Value::Nil);
    bytes_of(value).ok_or_else(|| MalformedEntry(format!("`{}` is {value:?}", name_at(fields, at))))
}

/// The text of the value at `at`.
fn text(fields: &RawFields, at: usize) -> Result<&str, MalformedEntry> {
    std::str::from_utf8(bytes(fields, at)?)
        .map_err(|_| MalformedEntry(format!("`{}` is not UTF-8", name_at(fields, at))))
}

/// The name of the value at `at`, for errors.
fn name_at(fields: &RawFields, at: usize) -> String {
    let name = bytes_of(&fields.0[at - 1]).unwrap_or_default();
    String::from_utf8_lossy(name).into_owned()
}

#[cfg(test)]
mod fuzz;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{Bincode, Json};

    fn raw(entry: &Entry) -> RawFields {
        let mut flat = Vec::new();
        for (name, value) in entry.fields() {
            flat.push(Value::BulkString(name.as_bytes().to_vec()));
            flat.push(Value::BulkString(value));
        }
        RawFields(flat)
    }

    fn push(fields: &mut RawFields, name: &str, value: Value) {
        fields.0.push(Value::BulkString(name.as_bytes().to_vec()));
        fields.0.push(value);
    }

    fn remove(fields: &mut RawFields, name: &str) {
        let pairs: Vec<Value> = std::mem::take(&mut fields.0);
        for pair in pairs.chunks(2) {
            if bytes_of(&pair[0]) != Some(name.as_bytes()) {
                fields.0.extend(pair.iter().cloned());
            }
        }
    }

    #[test]
    fn entries_round_trip_through_their_fields() {
        let e = Entry::new(
            TaskId::generate(),
            Some("user-42".into()),
            "json",
            b"{}".to_vec(),
        );
        assert_eq!(Entry::parse(&mut raw(&e)).unwrap(), e);
        let unique = Entry {
            unique: Some("report-7".into()),
            ..e.clone()
        };
        assert_eq!(Entry::parse(&mut raw(&unique)).unwrap(), unique);
        let no_key = Entry::new(TaskId::generate(), None, "bincode", vec![1, 2]);
        let back = Entry::parse(&mut raw(&no_key)).unwrap();
        assert_eq!(back.key, None);
        assert_eq!(back.partition_key(), no_key.id.as_str());
    }

    #[test]
    fn a_field_written_twice_counts_by_its_last_value() {
        let e = Entry::new(TaskId::from("t-1"), None, "json", b"{}".to_vec());
        let mut fields = raw(&e);
        push(
            &mut fields,
            field::PAYLOAD,
            Value::BulkString(b"[]".to_vec()),
        );
        assert_eq!(Entry::parse(&mut fields).unwrap().payload, b"[]");
    }

    /// A payload type whose `Deserialize` panics, as user code may.
    #[derive(Debug)]
    struct Fragile;

    impl<'de> serde::Deserialize<'de> for Fragile {
        fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
            panic!("fragile payload")
        }
    }

    #[test]
    fn a_payload_whose_deserialize_panics_is_a_decode_failure() {
        let e = Entry::new(TaskId::generate(), None, "json", b"{}".to_vec());
        let err = e.decode::<Fragile, _>(&Json).unwrap_err();
        assert_eq!(err.reason(), "decode");
        assert!(err.to_string().contains("fragile payload"), "{err}");
    }

    #[test]
    fn malformed_entries_say_what_is_wrong_and_keep_their_fields() {
        let e = Entry::new(TaskId::generate(), None, "json", b"{}".to_vec());
        let mut fields = raw(&e);
        remove(&mut fields, field::PAYLOAD);
        assert_eq!(
            Entry::parse(&mut fields).unwrap_err().to_string(),
            "malformed entry: no `payload` field"
        );
        let mut fields = raw(&e);
        remove(&mut fields, field::ATTEMPT);
        push(
            &mut fields,
            field::ATTEMPT,
            Value::BulkString(b"x".to_vec()),
        );
        let (why, kept) = Entry::read(fields.clone(), usize::MAX).unwrap_err();
        assert!(why.to_string().contains("`attempt`"), "{why}");
        assert_eq!(kept, fields, "the dead letter gets the fields as they were");
    }

    fn bulk_x() -> Value {
        Value::BulkString(b"x".to_vec())
    }

    #[test]
    fn the_limit_counts_names_and_values_and_comes_before_parsing() {
        let e = Entry::new(TaskId::from("t-1"), None, "json", b"{}".to_vec());
        let fields = raw(&e);
        let size: usize = e.fields().iter().map(|(k, v)| k.len() + v.len()).sum();
        assert_eq!(
            Entry::read(fields.clone(), size),
            Ok(e.clone()),
            "at the limit"
        );
        let (over, _) = Entry::read(fields, size - 1).unwrap_err();
        assert_eq!(over.reason(), "too_large");
        assert_eq!(
            over.to_string(),
            format!(
                "entry of {size} bytes exceeds the limit of {} bytes (`max_entry_bytes`)",
                size - 1
            )
        );
        // Too large wins over malformed: nothing of it is looked at.
        let junk = RawFields(vec![bulk_x(), Value::BulkString(vec![0; 2000])]);
        assert_eq!(
            Entry::read(junk.clone(), 1024).unwrap_err().0.reason(),
            "too_large"
        );
        assert_eq!(Entry::read(junk, 4096).unwrap_err().0.reason(), "malformed");
    }

    #[test]
    fn a_payload_of_another_codec_or_type_does_not_decode() {
        let e = Entry::new(TaskId::generate(), None, "json", b"[1,2]".to_vec());
        assert_eq!(e.decode::<Vec<u8>, _>(&Json), Ok(vec![1, 2]));
        let other = e.decode::<Vec<u8>, _>(&Bincode).unwrap_err();
        assert_eq!(other.reason(), "decode");
        assert!(other.to_string().contains("encoded with `json`"), "{other}");
        let wrong = e.decode::<String, _>(&Json).unwrap_err();
        assert_eq!(wrong.reason(), "decode");
        let wrong = wrong.to_string();
        assert!(
            wrong.starts_with(
                "the payload does not decode as the handler's task type `alloc::string::String` \
                 with the `json` codec ("
            ) && wrong.ends_with("); was it enqueued as another type?"),
            "{wrong}"
        );
    }

    #[test]
    fn max_entry_bytes_is_refused_by_name_out_of_its_range() {
        for bad in [0, 1023, 512 * 1024 * 1024 + 1] {
            let err = validate_max_entry_bytes(bad).unwrap_err().to_string();
            assert!(
                err.starts_with("invalid setting `max_entry_bytes`: ")
                    && err.contains("1024 (1 KiB) to 536870912 (512 MiB)"),
                "{err}"
            );
        }
        for good in [1024, 4 * 1024 * 1024, 512 * 1024 * 1024] {
            validate_max_entry_bytes(good).unwrap();
        }
    }

    #[test]
    fn generated_ids_are_unique_and_ordered() {
        let ids: Vec<TaskId> = (0..1000).map(|_| TaskId::generate()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, ids);
    }
}
