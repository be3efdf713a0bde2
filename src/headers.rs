//! [`Headers`]: a task's small map of metadata (a trace context, a request
//! id, a tenant), set on enqueue ([`Options::header`]) and read by its
//! handler ([`TaskContext::headers`]), kept through every path the task
//! takes (docs/design.md §18).
//!
//! On the wire each header is one field of the task's stream entry, its
//! name prefixed with `h:` (`h:traceparent`), its value the header's: a
//! producer in any language adds them as it adds the other fields, and no
//! header can take the name of one of the entry's own fields or of those a
//! dead letter adds, none of which holds a `:`.
//!
//! [`Options::header`]: crate::producer::Options::header
//! [`TaskContext::headers`]: crate::TaskContext::headers

use std::sync::Arc;

use crate::error::{Error, Result};

/// What every header's field name starts with in a stream entry.
pub(crate) const PREFIX: &str = "h:";
/// The most headers a task may carry.
pub(crate) const MOST_HEADERS: usize = 32;
/// The most bytes a task's headers' names and values may take together.
pub(crate) const MOST_HEADER_BYTES: usize = 4096;
/// The longest header name, in bytes.
const MOST_NAME_BYTES: usize = 128;

/// A task's headers, in the order they were set; a name set twice keeps
/// its last value. Two are equal when they hold the same names and values,
/// in any order (a map: a dead letter, say, reads them back in another).
///
/// ```
/// use peerq::Headers;
///
/// let mut headers = Headers::new();
/// headers.insert("request-id", "req-7f3a");
/// headers.insert("tenant", "acme");
/// assert_eq!(headers.get("tenant"), Some("acme"));
/// assert_eq!(headers.len(), 2);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Headers(Arc<Vec<(String, String)>>);

impl PartialEq for Headers {
    fn eq(&self, other: &Headers) -> bool {
        self.len() == other.len() && self.iter().all(|(n, v)| other.get(n) == Some(v))
    }
}

impl Eq for Headers {}

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Headers::default()
    }

    /// Sets header `name` to `value` (replacing an earlier value). Names
    /// and sizes are checked when the task is enqueued (see
    /// [`Options::header`](crate::producer::Options::header)).
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let (name, value) = (name.into(), value.into());
        // Shared by every copy (a task's context per attempt costs a count,
        // not a copy of its headers); written only before it is shared.
        let headers = Arc::make_mut(&mut self.0);
        match headers.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => *v = value,
            None => headers.push((name, value)),
        }
    }

    /// The value of header `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The headers as `(name, value)`, in the order they were set.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// How many headers there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The bytes of their names and values.
    pub(crate) fn bytes(&self) -> usize {
        self.0.iter().map(|(n, v)| n.len() + v.len()).sum()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Refused by the name `header` with more than 32 headers, more than
    /// 4 KiB of names and values together, or a name that is empty, longer
    /// than 128 bytes, or holds anything but ASCII letters, digits and
    /// `-`, `_`, `.` (so that every language's client writes it as it is).
    pub(crate) fn check(&self) -> Result<()> {
        if self.0.len() > MOST_HEADERS {
            return Err(Error::invalid(
                "header",
                format!(
                    "{} headers on one task; at most {MOST_HEADERS}",
                    self.0.len()
                ),
            ));
        }
        let bytes = self.bytes();
        if bytes > MOST_HEADER_BYTES {
            return Err(Error::invalid(
                "header",
                format!(
                    "the headers take {bytes} bytes; at most {MOST_HEADER_BYTES} (names and values together)"
                ),
            ));
        }
        for (name, _) in self.0.iter() {
            let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
            if name.is_empty() || name.len() > MOST_NAME_BYTES || !name.chars().all(allowed) {
                return Err(Error::invalid(
                    "header",
                    format!(
                        "the header name {name:?} is not 1 to {MOST_NAME_BYTES} ASCII letters, digits, `-`, `_` or `.`"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The stream entry's fields of these headers: `h:<name>`, value.
    pub(crate) fn fields(&self) -> impl Iterator<Item = (String, Vec<u8>)> + '_ {
        self.0
            .iter()
            .map(|(n, v)| (format!("{PREFIX}{n}"), v.as_bytes().to_vec()))
    }

    /// The header a stream entry's field `name` holds, if it is one (and
    /// its value is text): read back as it was set.
    pub(crate) fn read_field(&mut self, name: &str, value: &[u8]) -> bool {
        let (Some(header), Ok(value)) = (name.strip_prefix(PREFIX), std::str::from_utf8(value))
        else {
            return false;
        };
        self.insert(header, value);
        true
    }
}

/// The headers as a JSON object of strings (the outbox's `headers`
/// column), and back: `None` for none.
#[cfg(feature = "postgres")]
impl Headers {
    pub(crate) fn to_json(&self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let object: serde_json::Map<String, serde_json::Value> = self
            .iter()
            .map(|(n, v)| (n.to_owned(), serde_json::Value::from(v)))
            .collect();
        Some(serde_json::Value::Object(object).to_string())
    }

    /// The headers of an outbox row's column; an error says what is wrong
    /// (the row goes to the dead letters).
    pub(crate) fn from_json(json: Option<&str>) -> std::result::Result<Headers, String> {
        let Some(json) = json else {
            return Ok(Headers::new());
        };
        let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(json)
            .map_err(|e| format!("the row's `headers` are not a JSON object: {e}"))?;
        let mut headers = Headers::new();
        for (name, value) in object {
            let serde_json::Value::String(value) = value else {
                return Err(format!("the row's header {name:?} is not a string"));
            };
            headers.insert(name, value);
        }
        Ok(headers)
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = (&'a str, &'a str);
    type IntoIter = Box<dyn Iterator<Item = (&'a str, &'a str)> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_set_twice_keeps_its_last_value_and_its_place() {
        let mut h = Headers::new();
        h.insert("a", "1");
        h.insert("b", "2");
        h.insert("a", "3");
        assert_eq!(h.iter().collect::<Vec<_>>(), vec![("a", "3"), ("b", "2")]);
        let mut other = Headers::new();
        other.insert("b", "2");
        other.insert("a", "3");
        assert_eq!(h, other, "a map: equal in any order");
        other.insert("a", "4");
        assert_ne!(h, other);
    }

    #[test]
    fn headers_are_fields_with_a_prefix_and_read_back_as_they_were() {
        let mut h = Headers::new();
        h.insert("traceparent", "00-abc-def-01");
        let fields: Vec<(String, Vec<u8>)> = h.fields().collect();
        assert_eq!(
            fields,
            vec![("h:traceparent".into(), b"00-abc-def-01".to_vec())]
        );
        let mut back = Headers::new();
        assert!(back.read_field("h:traceparent", b"00-abc-def-01"));
        assert!(!back.read_field("attempt", b"1"), "not a header");
        assert!(!back.read_field("h:odd", &[0xff]), "not text: not a header");
        assert_eq!(back, h);
    }

    #[test]
    fn too_many_too_large_and_odd_names_are_refused_by_name() {
        let mut many = Headers::new();
        for i in 0..=MOST_HEADERS {
            many.insert(format!("h{i}"), "v");
        }
        let large = {
            let mut h = Headers::new();
            h.insert("big", "x".repeat(MOST_HEADER_BYTES));
            h
        };
        let odd = {
            let mut h = Headers::new();
            h.insert("a b", "v");
            h
        };
        for bad in [many, large, odd] {
            let e = bad.check().unwrap_err();
            assert!(e.to_string().contains("`header`"), "{e}");
        }
        let mut fine = Headers::new();
        fine.insert("x-request-id", "1");
        fine.insert("tenant.id", "acme");
        assert!(fine.check().is_ok());
    }
}
