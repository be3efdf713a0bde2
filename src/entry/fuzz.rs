//! Property tests over hostile entries, the way a consumer meets them:
//! arbitrary field lists, the format's fields with corrupted values, and
//! arbitrary payload bytes, through the size limit, the parser and both
//! codecs, for two task types. Whatever an entry holds, nothing panics, and
//! the entry either runs or goes to the dead letters with a known reason.
//!
//! Each property runs 4,096 cases (about a second in a debug build);
//! `PROPTEST_CASES=1000000` makes a longer fuzzing run.

use std::collections::{BTreeMap, HashMap};

use deadpool_redis::redis::Value;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{Entry, RawFields, TaskId, Unrunnable, field};
use crate::codec::{Bincode, Codec, Json};

/// The dead letters' reasons of an entry that cannot run.
const REASONS: [&str; 3] = ["too_large", "malformed", "decode"];

const FIELDS: [&str; 7] = [
    field::ID,
    field::KEY,
    field::ATTEMPT,
    field::FAILURES,
    field::ENQUEUED_AT,
    field::CODEC,
    field::PAYLOAD,
];

/// A task type of plain data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Mail {
    to: String,
    body: String,
    retries: u32,
    tags: Vec<String>,
    sent_at: Option<u64>,
}

/// A task type with variants, maps, chars and signed numbers: more ways
/// for bytes to be wrong (an unknown variant, an invalid char).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Command {
    Stop,
    Move { x: i64, y: i16 },
    Rename(String),
    Batch(Vec<u64>),
    Attrs(BTreeMap<String, Vec<u8>>),
    Flag(bool, char),
}

/// Any text of up to `max` chars (cheaper to generate than a regex).
fn text(max: usize) -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..=max).prop_map(String::from_iter)
}

/// 4,096 cases unless `PROPTEST_CASES` says otherwise.
fn config() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 4096;
    }
    config
}

fn mail() -> impl Strategy<Value = Mail> {
    (
        text(24),
        text(64),
        any::<u32>(),
        vec(text(8), 0..4),
        any::<Option<u64>>(),
    )
        .prop_map(|(to, body, retries, tags, sent_at)| Mail {
            to,
            body,
            retries,
            tags,
            sent_at,
        })
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        Just(Command::Stop),
        (any::<i64>(), any::<i16>()).prop_map(|(x, y)| Command::Move { x, y }),
        text(32).prop_map(Command::Rename),
        vec(any::<u64>(), 0..8).prop_map(Command::Batch),
        proptest::collection::btree_map(text(6), vec(any::<u8>(), 0..8), 0..4)
            .prop_map(Command::Attrs),
        (any::<bool>(), any::<char>()).prop_map(|(b, c)| Command::Flag(b, c)),
    ]
}

/// A valid encoding of either task type with either codec.
fn encoded() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        mail().prop_map(|m| Bincode.encode(&m).unwrap()),
        mail().prop_map(|m| Json.encode(&m).unwrap()),
        command().prop_map(|c| Bincode.encode(&c).unwrap()),
        command().prop_map(|c| Json.encode(&c).unwrap()),
    ]
}

/// Payload bytes: random, valid, valid but damaged, or written to hurt a
/// decoder (huge length prefixes, deep JSON nesting).
fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => vec(any::<u8>(), 0..128),
        3 => encoded(),
        // One byte changed.
        2 => (encoded(), any::<prop::sample::Index>(), any::<u8>()).prop_map(|(mut b, i, x)| {
            if !b.is_empty() {
                let i = i.index(b.len());
                b[i] = x;
            }
            b
        }),
        // Cut short.
        1 => (encoded(), any::<prop::sample::Index>()).prop_map(|(mut b, i)| {
            b.truncate(i.index(b.len() + 1));
            b
        }),
        // bincode's varint markers for u16/u32/u64/u128 with large values
        // where a length or a variant index is read.
        1 => (select(vec![251u8, 252, 253, 254, 255]), vec(any::<u8>(), 0..24)).prop_map(
            |(marker, rest)| {
                let mut b = vec![marker, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
                b.extend(rest);
                b
            }
        ),
        // Nesting past serde_json's recursion limit.
        1 => (1usize..20_000, select(vec!["[", "{\"to\":", "{\"Rename\":"]))
            .prop_map(|(depth, open)| open.repeat(depth).into_bytes()),
    ]
}

/// A field value as a stream reply may hold it; Redis only ever sends bulk
/// strings, but the parser must not trust that either.
fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => vec(any::<u8>(), 0..48).prop_map(Value::BulkString),
        1 => text(12).prop_map(Value::SimpleString),
        1 => any::<i64>().prop_map(Value::Int),
        1 => Just(Value::Nil),
        1 => vec(vec(any::<u8>(), 0..8).prop_map(Value::BulkString), 0..3).prop_map(Value::Array),
    ]
}

/// A field name: mostly the format's own, else anything.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => select(FIELDS.to_vec()).prop_map(String::from),
        1 => "[a-z_]{0,12}",
        1 => text(12),
    ]
}

/// A format field's value as a careless or hostile producer writes it.
fn wrong_text() -> impl Strategy<Value = Value> {
    prop_oneof![
        "[-+ 0-9]{0,24}".prop_map(|s| Value::BulkString(s.into_bytes())),
        Just(Value::BulkString(b"\xff\xfe".to_vec())),
        select(vec!["bincode", "json", "msgpack", ""])
            .prop_map(|s| Value::BulkString(s.as_bytes().to_vec())),
    ]
}

/// A well-formed entry: any id and key, attempt, failures and time,
/// either codec.
fn well_formed(payload: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Entry> {
    (
        text(40),
        proptest::option::of(text(40)),
        (any::<u32>(), any::<u32>()),
        any::<u64>(),
        select(vec![Bincode::NAME, Json::NAME]),
        payload,
    )
        .prop_map(|(id, key, (attempt, failures), ms, codec, payload)| Entry {
            id: TaskId::from(id.as_str()),
            key,
            attempt,
            failures,
            enqueued_at: std::time::Duration::from_millis(ms),
            codec: codec.to_owned(),
            payload,
            unique: None,
            headers: crate::headers::Headers::new(),
            extra: Vec::new(),
        })
}

#[derive(Debug, Clone)]
enum Mutation {
    Remove(&'static str),
    Set(String, Value),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        select(FIELDS.to_vec()).prop_map(Mutation::Remove),
        (name(), value()).prop_map(|(k, v)| Mutation::Set(k, v)),
        (select(FIELDS.to_vec()), wrong_text()).prop_map(|(k, v)| Mutation::Set(k.into(), v)),
    ]
}

/// The limit: the default, or small enough that many entries exceed it.
fn limit() -> impl Strategy<Value = usize> {
    prop_oneof![Just(4 * 1024 * 1024), 0usize..400]
}

fn as_map(entry: &Entry) -> HashMap<String, Value> {
    entry
        .fields()
        .into_iter()
        .map(|(k, v)| (k.into_owned(), Value::BulkString(v)))
        .collect()
}

/// `entry`'s fields as a retry writes them, in their order.
fn written(entry: &Entry) -> RawFields {
    let mut flat = Vec::new();
    for (name, value) in entry.fields() {
        flat.push(Value::BulkString(name.as_bytes().to_vec()));
        flat.push(Value::BulkString(value));
    }
    RawFields(flat)
}

/// `map`'s fields as a stream reply holds them.
fn flat(map: &HashMap<String, Value>) -> RawFields {
    let mut flat = Vec::new();
    for (name, value) in map {
        flat.push(Value::BulkString(name.as_bytes().to_vec()));
        flat.push(value.clone());
    }
    RawFields(flat)
}

/// What a consumer does with `map`: the entry and its task, to run, or
/// why not, for the dead letters (the two calls the consumer makes:
/// `Entry::read` as it fetches, `Entry::decode` as it runs).
fn classify<T: DeserializeOwned, C: Codec>(
    map: &HashMap<String, Value>,
    limit: usize,
    codec: &C,
) -> Result<(Entry, T), Unrunnable> {
    let entry = Entry::read(flat(map), limit).map_err(|(why, _)| why)?;
    let task = entry.decode(codec)?;
    Ok((entry, task))
}

/// Every task type and codec classifies `map` without a panic, to an entry
/// that matches its fields or to a known reason.
fn runs_or_has_a_reason(map: &HashMap<String, Value>, limit: usize) -> Result<(), TestCaseError> {
    // Counted here independently of the code under test.
    let size: usize = map
        .iter()
        .map(|(k, v)| match v {
            Value::BulkString(b) => k.len() + b.len(),
            Value::SimpleString(s) => k.len() + s.len(),
            _ => k.len(),
        })
        .sum();
    let outcomes = [
        classify::<Mail, _>(map, limit, &Bincode).map(|(e, _)| e),
        classify::<Mail, _>(map, limit, &Json).map(|(e, _)| e),
        classify::<Command, _>(map, limit, &Bincode).map(|(e, _)| e),
        classify::<Command, _>(map, limit, &Json).map(|(e, _)| e),
    ];
    for outcome in outcomes {
        match outcome {
            Ok(entry) => {
                prop_assert!(size <= limit);
                let payload = match map.get(field::PAYLOAD) {
                    Some(Value::BulkString(b)) => Some(b.as_slice()),
                    Some(Value::SimpleString(s)) => Some(s.as_bytes()),
                    _ => None,
                };
                prop_assert_eq!(payload, Some(entry.payload.as_slice()));
                // What runs is what a retry writes back (in its order:
                // the fields the format does not know keep theirs).
                prop_assert_eq!(Entry::read(written(&entry), usize::MAX).ok(), Some(entry));
            }
            Err(e) => {
                prop_assert!(REASONS.contains(&e.reason()), "{e}");
                prop_assert_eq!(e.reason() == "too_large", size > limit, "{}", e);
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_field_lists_run_or_are_dead_lettered_with_a_reason(
        fields in vec((name(), value()), 0..10),
        limit in limit(),
    ) {
        let map: HashMap<String, Value> = fields.into_iter().collect();
        runs_or_has_a_reason(&map, limit)?;
    }

    #[test]
    fn corrupted_entries_run_or_are_dead_lettered_with_a_reason(
        entry in well_formed(payload()),
        mutations in vec(mutation(), 0..4),
        limit in limit(),
    ) {
        let mut map = as_map(&entry);
        for m in mutations {
            match m {
                Mutation::Remove(k) => { map.remove(k); }
                Mutation::Set(k, v) => { map.insert(k, v); }
            }
        }
        runs_or_has_a_reason(&map, limit)?;
    }

    #[test]
    fn well_formed_entries_within_the_limit_run(entry in well_formed(Just(Vec::new())), mail in mail(), command in command()) {
        // The payload in the entry's own codec: it must run, as it was sent.
        let (mail_bytes, command_bytes) = if entry.codec == Json::NAME {
            (Json.encode(&mail).unwrap(), Json.encode(&command).unwrap())
        } else {
            (Bincode.encode(&mail).unwrap(), Bincode.encode(&command).unwrap())
        };
        let with = |payload| as_map(&Entry { payload, ..entry.clone() });
        let limit = 4 * 1024 * 1024;
        let (ran, got): (Entry, Mail) = if entry.codec == Json::NAME {
            classify(&with(mail_bytes.clone()), limit, &Json)?
        } else {
            classify(&with(mail_bytes.clone()), limit, &Bincode)?
        };
        prop_assert_eq!(got, mail);
        prop_assert_eq!(ran, Entry { payload: mail_bytes, ..entry.clone() });
        let got: Command = if entry.codec == Json::NAME {
            classify(&with(command_bytes), limit, &Json)?.1
        } else {
            classify(&with(command_bytes), limit, &Bincode)?.1
        };
        prop_assert_eq!(got, command);
    }
}
