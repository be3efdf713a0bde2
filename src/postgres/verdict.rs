//! What the relay does with one claimed row, free of I/O: enqueue it as the
//! outbox stored it, or dead-letter it (reason `relay`) when no consumer of
//! the service could run it, so it never blocks its lane.

use std::time::{Duration, UNIX_EPOCH};

use crate::entry::TaskId;
use crate::headers::Headers;
use crate::producer::{Options, Stored};

/// A row of `peerq_outbox` as the relay claims it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) id: i64,
    pub(crate) task_id: String,
    pub(crate) partition_key: Option<String>,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) delay_ms: Option<i64>,
    pub(crate) codec: String,
    pub(crate) payload: Vec<u8>,
    /// `created_at` in Unix milliseconds.
    pub(crate) created_ms: i64,
    /// Its `headers` (a JSON object of strings, `NULL` for none).
    pub(crate) headers: Option<String>,
}

/// What becomes of a row.
#[derive(Debug, Clone)]
pub(crate) enum Verdict {
    /// Enqueue it.
    Enqueue(Stored),
    /// Dead-letter it, with this error.
    DeadLetter(Stored, String),
}

/// The verdict on `row` for a service whose codec is `codec`, sent by a
/// producer that takes payloads up to `max_payload` bytes.
pub(crate) fn verdict(row: Row, codec: &str, max_payload: usize) -> Verdict {
    let written_ms = u64::try_from(row.created_ms).unwrap_or(0);
    // Counted from the row's `created_at`, so a relay that comes late
    // does not postpone it further.
    let at = row
        .delay_ms
        .filter(|&ms| ms > 0)
        .map(|ms| UNIX_EPOCH + Duration::from_millis(written_ms.saturating_add(ms as u64)));
    let options = Options {
        key: row.partition_key,
        idempotency_key: row.idempotency_key,
        unique: None,
        delay: None,
        at,
        priority: Default::default(),
        headers: Headers::new(),
        member_of: None,
        member_results: false,
        id: None,
    };
    let headers = Headers::from_json(row.headers.as_deref());
    let mut stored = Stored {
        id: TaskId::from(row.task_id.as_str()),
        codec: row.codec,
        payload: row.payload,
        written_ms,
        options,
    };
    match headers.and_then(|h| h.check().map(|()| h).map_err(|e| e.to_string())) {
        Ok(headers) => stored.options.headers = headers,
        Err(error) => return Verdict::DeadLetter(stored, error),
    }
    if stored.codec != codec {
        let error = format!(
            "the row is encoded with `{}`, and the service's codec is `{codec}`: write it \
             with `Outbox::enqueue_with_codec` and the service's codec",
            stored.codec
        );
        return Verdict::DeadLetter(stored, error);
    }
    if stored.payload.len() > max_payload {
        let error = format!(
            "payload of {} bytes exceeds the relay's limit of {max_payload} bytes (`max_payload`)",
            stored.payload.len()
        );
        return Verdict::DeadLetter(stored, error);
    }
    Verdict::Enqueue(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Row {
        Row {
            id: 7,
            task_id: "0190b2b5-0000-7000-8000-000000000000".into(),
            partition_key: Some("user-42".into()),
            idempotency_key: None,
            delay_ms: None,
            codec: "bincode".into(),
            payload: vec![1, 2, 3],
            created_ms: 1_700_000_000_000,
            headers: None,
        }
    }

    #[test]
    fn a_row_of_the_services_codec_is_enqueued_under_its_id_and_key() {
        let Verdict::Enqueue(stored) = verdict(row(), "bincode", 1024) else {
            panic!("dead-lettered");
        };
        assert_eq!(stored.id.as_str(), row().task_id);
        assert_eq!(stored.options.partition_key(), Some("user-42"));
        assert_eq!(stored.written_ms, 1_700_000_000_000);
        assert_eq!(stored.options.at, None, "not delayed");
    }

    #[test]
    fn a_delay_counts_from_the_rows_creation() {
        let delayed = Row {
            delay_ms: Some(60_000),
            ..row()
        };
        let Verdict::Enqueue(stored) = verdict(delayed, "bincode", 1024) else {
            panic!("dead-lettered");
        };
        let due = UNIX_EPOCH + Duration::from_millis(1_700_000_060_000);
        assert_eq!(stored.options.at, Some(due));
        let zero = Row {
            delay_ms: Some(0),
            ..row()
        };
        let Verdict::Enqueue(stored) = verdict(zero, "bincode", 1024) else {
            panic!("dead-lettered");
        };
        assert_eq!(stored.options.at, None);
    }

    #[test]
    fn another_codec_or_a_payload_too_large_is_dead_lettered_with_why() {
        let Verdict::DeadLetter(_, error) = verdict(row(), "json", 1024) else {
            panic!("enqueued");
        };
        assert!(
            error.contains("encoded with `bincode`") && error.contains("`json`"),
            "{error}"
        );
        let Verdict::DeadLetter(stored, error) = verdict(row(), "bincode", 2) else {
            panic!("enqueued");
        };
        assert!(
            error.contains("3 bytes exceeds") && error.contains("`max_payload`"),
            "{error}"
        );
        assert_eq!(stored.payload, vec![1, 2, 3], "kept as it was");
    }
}
