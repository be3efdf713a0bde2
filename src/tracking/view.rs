//! A task's record as the CLI's `--json` and the dashboard show it: stable
//! field names, every field present (`null` when absent), times in Unix
//! milliseconds (Redis's clock), and the result and progress as JSON for a
//! service whose codec is JSON, else as `{"base64": …}` of their bytes.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use serde::Serialize;

use super::handle::TaskRecord;

/// A task's record, to show. JSON fields: `id` (the handle,
/// `<partition>/<task id>`), `state`, `attempt`, `partition`, `instance`,
/// `token`, `progress`, `result`, `error`, `reason`, `dead_id`, `headers`,
/// `cancel_requested_at`, `enqueued_at`, `due_at`, `started_at`,
/// `finished_at`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct TaskView {
    /// The handle: `<partition>/<task id>`.
    pub id: String,
    /// `waiting`, `delayed`, `running`, `retrying`, `succeeded`, `dead`,
    /// `cancelled`; `null` when only a cancel request is recorded.
    pub state: Option<&'static str>,
    /// The attempt underway, or the next one.
    pub attempt: Option<u32>,
    /// The partition.
    pub partition: Option<u32>,
    /// The instance that runs (or last ran) it.
    pub instance: Option<String>,
    /// The fencing token it runs (or last ran) under.
    pub token: Option<u64>,
    /// The last progress.
    pub progress: Option<serde_json::Value>,
    /// The result.
    pub result: Option<serde_json::Value>,
    /// The last failed attempt's error.
    pub error: Option<String>,
    /// Why it is dead or cancelled.
    pub reason: Option<String>,
    /// Its dead letter's id.
    pub dead_id: Option<String>,
    /// Its headers, name to value (`{}`: none); `null` when its entry was
    /// not read (see [`TaskRecord::headers`]).
    pub headers: Option<BTreeMap<String, String>>,
    /// When a cancel was requested (Unix ms).
    pub cancel_requested_at: Option<u64>,
    /// When it was enqueued (Unix ms).
    pub enqueued_at: Option<u64>,
    /// When a delayed task or a retry is due (Unix ms).
    pub due_at: Option<u64>,
    /// When its current (or last) attempt started (Unix ms).
    pub started_at: Option<u64>,
    /// When it became final (Unix ms).
    pub finished_at: Option<u64>,
}

impl TaskRecord {
    /// The record to show, its result and progress decoded for `codec`
    /// (the service's: `json` or `bincode`).
    pub fn view(&self, codec: &str) -> TaskView {
        let value = |bytes: &Option<Vec<u8>>| bytes.as_deref().map(|b| shown(b, codec));
        TaskView {
            id: self.handle.to_string(),
            state: self.state.map(|s| s.as_str()),
            attempt: self.attempt,
            partition: self.handle.partition(),
            instance: self.instance.clone(),
            token: self.token,
            progress: value(&self.progress),
            result: value(&self.result),
            error: self.error.clone(),
            reason: self.reason.clone(),
            dead_id: self.dead_id.clone(),
            headers: self.headers.as_ref().map(|h| {
                h.iter()
                    .map(|(n, v)| (n.to_owned(), v.to_owned()))
                    .collect()
            }),
            cancel_requested_at: ms(self.cancel_requested_at),
            enqueued_at: ms(self.enqueued_at),
            due_at: ms(self.due_at),
            started_at: ms(self.started_at),
            finished_at: ms(self.finished_at),
        }
    }
}

/// Encoded bytes as JSON: the value itself for the JSON codec (when it
/// parses), else `{"base64": …}`.
fn shown(bytes: &[u8], codec: &str) -> serde_json::Value {
    if codec == "json"
        && let Ok(value) = serde_json::from_slice(bytes)
    {
        return value;
    }
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    serde_json::json!({ "base64": encoded })
}

fn ms(time: Option<SystemTime>) -> Option<u64> {
    time.map(|t| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_services_values_show_as_json_and_others_as_base64() {
        let json = shown(br#"{"seq":7}"#, "json");
        assert_eq!(json, serde_json::json!({ "seq": 7 }));
        // Bincode's bytes, and JSON bytes that do not parse.
        let bincode = shown(&[7, 0, 255], "bincode");
        assert_eq!(bincode, serde_json::json!({ "base64": "BwD/" }));
        let broken = shown(b"{not json", "json");
        assert_eq!(broken, serde_json::json!({ "base64": "e25vdCBqc29u" }));
    }
}
