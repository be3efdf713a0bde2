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

#[test]
fn headers_and_unknown_fields_survive_the_entry_written_again() {
    let mut e = Entry::new(TaskId::from("t-1"), None, "json", b"{}".to_vec());
    e.headers.insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    );
    e.headers.insert("tenant", "acme");
    let mut fields = raw(&e);
    // A later version's field, and one written twice.
    push(&mut fields, "lineage", Value::BulkString(b"a".to_vec()));
    push(&mut fields, "lineage", Value::BulkString(b"b".to_vec()));
    let read = Entry::parse(&mut fields).unwrap();
    assert_eq!(read.headers, e.headers);
    assert_eq!(read.extra, vec![("lineage".to_owned(), b"b".to_vec())]);
    // Written again (a retry, a hand-back), then read: the same.
    let again = Entry::parse(&mut raw(&read)).unwrap();
    assert_eq!(again, read);
    let names: Vec<String> = again
        .fields()
        .into_iter()
        .map(|(n, _)| n.into_owned())
        .collect();
    assert!(names.contains(&"h:tenant".to_owned()), "{names:?}");
    assert!(names.contains(&"lineage".to_owned()), "{names:?}");
}
