//! Stream replies (`XREADGROUP`, `XAUTOCLAIM`) taken apart by value.
//!
//! Why not redis-rs's `StreamReadReply`: it clones the whole reply (it
//! tries two formats in turn) and builds a `HashMap` per entry, and the
//! entry's fields were then cloned once more into the task. In a profile
//! of the consume benchmark that was about a quarter of the consumer's
//! CPU. Here each value's bytes move from the reply into the entry.
//!
//! The shapes, RESP2 and RESP3: a read is nil (nothing came), or each
//! stream's key and entries, as an array of pairs or a map; an entry is
//! its id and its fields as a flat name-value array (nil: the entry was
//! deleted while pending, as a re-read of the pending list returns it),
//! which is kept as it came: the entry is read from it
//! ([`crate::entry::Entry::read`]).

use deadpool_redis::redis::{FromRedisValue, ParsingError, Value};

use crate::entry::RawFields;

/// One stream entry as read.
#[derive(Debug)]
pub(crate) struct RawEntry {
    /// Its stream id.
    pub(crate) id: String,
    /// Its fields in stream order; empty when the entry was deleted.
    pub(crate) fields: RawFields,
}

/// An `XREADGROUP` reply: each stream's entries, by the stream's key;
/// none when the read timed out.
#[derive(Debug, Default)]
pub(crate) struct Streams(pub(crate) Vec<(String, Vec<RawEntry>)>);

impl FromRedisValue for Streams {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let streams = match v {
            Value::Nil => Vec::new(),
            Value::Array(streams) => streams
                .into_iter()
                .map(|stream| {
                    let [key, entries] = pair(stream, "a stream's key and entries")?;
                    Ok((string(key)?, self::entries(entries)?))
                })
                .collect::<Result<_, ParsingError>>()?,
            Value::Map(streams) => streams
                .into_iter()
                .map(|(key, entries)| Ok((string(key)?, self::entries(entries)?)))
                .collect::<Result<_, ParsingError>>()?,
            other => return Err(unexpected("a stream read reply", &other)),
        };
        Ok(Streams(streams))
    }
}

/// An `XAUTOCLAIM` reply: where the next claim starts (`0-0`: the whole
/// pending list was scanned) and the entries claimed.
#[derive(Debug)]
pub(crate) struct AutoClaim {
    pub(crate) next: String,
    pub(crate) entries: Vec<RawEntry>,
    /// Each entry's delivery count, this claim counted (`fenced_claim.lua`
    /// adds them without `JUSTID`); empty when not given.
    pub(crate) deliveries: Vec<u32>,
}

impl FromRedisValue for AutoClaim {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Value::Array(parts) = v else {
            return Err(unexpected("an XAUTOCLAIM reply", &v));
        };
        // The third part (Redis 7: the ids deleted meanwhile, dropped from
        // the pending list by Redis itself) needs nothing here.
        let mut parts = parts.into_iter();
        let (Some(next), Some(entries)) = (parts.next(), parts.next()) else {
            return Err("an XAUTOCLAIM reply without its entries".to_owned().into());
        };
        let deliveries = match parts.nth(1) {
            Some(counts) => Vec::<u32>::from_redis_value(counts)?,
            None => Vec::new(),
        };
        Ok(AutoClaim {
            next: string(next)?,
            entries: self::entries(entries)?,
            deliveries,
        })
    }
}

/// A list of entries, each `[id, fields]`, or only ids (a claim with
/// `JUSTID`: those come without fields).
fn entries(v: Value) -> Result<Vec<RawEntry>, ParsingError> {
    let Value::Array(entries) = v else {
        return Err(unexpected("a list of stream entries", &v));
    };
    entries
        .into_iter()
        .map(|entry| match entry {
            Value::Array(_) => {
                let [id, fields] = pair(entry, "a stream entry's id and fields")?;
                Ok(RawEntry {
                    id: string(id)?,
                    fields: self::fields(fields)?,
                })
            }
            id => Ok(RawEntry {
                id: string(id)?,
                fields: RawFields::default(),
            }),
        })
        .collect()
}

/// An entry's fields: a flat name-value array, kept as it came (a map
/// under RESP3, flattened), none when the entry is gone.
fn fields(v: Value) -> Result<RawFields, ParsingError> {
    match v {
        Value::Nil => Ok(RawFields::default()),
        Value::Array(flat) => Ok(RawFields(flat)),
        Value::Map(pairs) => Ok(RawFields(
            pairs
                .into_iter()
                .flat_map(|(name, value)| [name, value])
                .collect(),
        )),
        other => Err(unexpected("an entry's fields", &other)),
    }
}

/// The two parts of a two-element array.
fn pair(v: Value, what: &str) -> Result<[Value; 2], ParsingError> {
    match v {
        Value::Array(parts) => <[Value; 2]>::try_from(parts)
            .map_err(|parts| format!("{what}: {} parts", parts.len()).into()),
        other => Err(unexpected(what, &other)),
    }
}

fn string(v: Value) -> Result<String, ParsingError> {
    match v {
        Value::BulkString(b) => String::from_utf8(b).map_err(|e| e.utf8_error().into()),
        Value::SimpleString(s) => Ok(s),
        other => Err(unexpected("a string", &other)),
    }
}

fn unexpected(what: &str, v: &Value) -> ParsingError {
    format!("expected {what}, got {v:?}").into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_read_reply_keeps_streams_entries_and_fields_in_order() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("s0"),
            Value::Array(vec![
                Value::Array(vec![
                    bulk("1-0"),
                    Value::Array(vec![bulk("id"), bulk("a"), bulk("id"), bulk("b")]),
                ]),
                // Deleted while pending.
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ])]);
        let Streams(streams) = Streams::from_redis_value(reply).unwrap();
        assert_eq!(streams.len(), 1);
        let (key, entries) = &streams[0];
        assert_eq!(key, "s0");
        assert_eq!(entries[0].id, "1-0");
        assert_eq!(
            entries[0].fields,
            RawFields(vec![bulk("id"), bulk("a"), bulk("id"), bulk("b")])
        );
        assert_eq!(entries[1].id, "2-0");
        assert!(entries[1].fields.0.is_empty());
    }

    #[test]
    fn resp3_maps_and_a_timed_out_read() {
        let reply = Value::Map(vec![(
            bulk("s1"),
            Value::Array(vec![Value::Array(vec![
                bulk("3-0"),
                Value::Map(vec![(bulk("payload"), bulk("x"))]),
            ])]),
        )]);
        let Streams(streams) = Streams::from_redis_value(reply).unwrap();
        assert_eq!(streams[0].0, "s1");
        assert_eq!(
            streams[0].1[0].fields,
            RawFields(vec![bulk("payload"), bulk("x")])
        );
        assert!(Streams::from_redis_value(Value::Nil).unwrap().0.is_empty());
    }

    #[test]
    fn odd_names_are_kept_for_the_dead_letters_and_odd_shapes_refused() {
        let entry = Value::Array(vec![
            bulk("4-0"),
            Value::Array(vec![
                Value::BulkString(vec![0xff, b'k']),
                bulk("v"),
                bulk("tail"),
            ]),
        ]);
        let claim = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![entry]),
            Value::Array(vec![]),
        ]);
        let AutoClaim {
            next,
            mut entries,
            deliveries,
        } = AutoClaim::from_redis_value(claim).unwrap();
        assert_eq!(next, "0-0");
        assert!(deliveries.is_empty(), "not given");
        let named = entries.remove(0).fields.into_named();
        assert_eq!(named[0], ("\u{fffd}k".to_owned(), b"v".to_vec()));
        assert_eq!(named[1], ("tail".to_owned(), Vec::new()));
        let just_ids = Value::Array(vec![bulk("0-0"), Value::Array(vec![bulk("5-0")])]);
        let AutoClaim { entries, .. } = AutoClaim::from_redis_value(just_ids).unwrap();
        assert_eq!(
            (entries[0].id.as_str(), entries[0].fields.0.len()),
            ("5-0", 0)
        );
        // fenced_claim.lua's fourth part: the delivery counts.
        let counted = Value::Array(vec![
            bulk("0-0"),
            Value::Array(vec![bulk("6-0")]),
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(3)]),
        ]);
        let AutoClaim { deliveries, .. } = AutoClaim::from_redis_value(counted).unwrap();
        assert_eq!(deliveries, vec![3]);
        assert!(Streams::from_redis_value(Value::Int(3)).is_err());
        let short = Value::Array(vec![Value::Array(vec![bulk("s0")])]);
        assert!(Streams::from_redis_value(short).is_err());
    }
}
