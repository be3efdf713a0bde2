//! An entry's fields as a stream reply holds them, and reading text and
//! bytes out of them without a copy.

use deadpool_redis::redis::Value;

use super::MalformedEntry;

/// An entry's fields as a stream reply holds them: names and values
/// alternating, in stream order (a name written twice: its last value
/// counts). Kept as the reply's own array, so reading an entry copies
/// nothing but its short text fields.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct RawFields(pub(crate) Vec<Value>);

impl RawFields {
    /// Where the value of field `name` is (its last one).
    pub(super) fn find(&self, name: &str) -> Option<usize> {
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
pub(super) fn bytes_of(value: &Value) -> Option<&[u8]> {
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
pub(super) fn entry_size(fields: &RawFields) -> usize {
    fields
        .0
        .iter()
        .map(|v| bytes_of(v).map_or(0, <[u8]>::len))
        .fold(0, usize::saturating_add)
}

pub(super) fn missing(field: &str) -> MalformedEntry {
    MalformedEntry(format!("no `{field}` field"))
}

/// The bytes of the value at `at`, the value of field `at - 1`.
pub(super) fn bytes(fields: &RawFields, at: usize) -> Result<&[u8], MalformedEntry> {
    let value = fields.0.get(at).unwrap_or(&Value::Nil);
    bytes_of(value).ok_or_else(|| MalformedEntry(format!("`{}` is {value:?}", name_at(fields, at))))
}

/// The text of the value at `at`.
pub(super) fn text(fields: &RawFields, at: usize) -> Result<&str, MalformedEntry> {
    std::str::from_utf8(bytes(fields, at)?)
        .map_err(|_| MalformedEntry(format!("`{}` is not UTF-8", name_at(fields, at))))
}

/// The name of the value at `at`, for errors.
fn name_at(fields: &RawFields, at: usize) -> String {
    let name = bytes_of(&fields.0[at - 1]).unwrap_or_default();
    String::from_utf8_lossy(name).into_owned()
}
