//! What names a tracked task, and what a reader gets back.
//!
//! A handle names the partition as well as the task (`<partition>/<task
//! id>`, as `peerq dead show`'s reference does), so that the task's record
//! is read in one round trip in its own slot; a bare task id is looked up
//! over every partition in one pipeline.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;

use crate::codec::Codec;
use crate::entry::TaskId;
use crate::error::{CodecError, Error, Result};
use crate::headers::Headers;

/// A task, by its partition and id: `<partition>/<task id>`.
///
/// ```
/// use peerq::tracking::TaskHandle;
///
/// let handle: TaskHandle = "3/0190f1e2-aaaa-7bbb-8ccc-123456789abc".parse().unwrap();
/// assert_eq!(handle.partition(), Some(3));
/// assert_eq!(handle.to_string(), "3/0190f1e2-aaaa-7bbb-8ccc-123456789abc");
/// // A bare id: looked up over every partition.
/// let bare: TaskHandle = "0190f1e2-aaaa-7bbb-8ccc-123456789abc".parse().unwrap();
/// assert_eq!(bare.partition(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskHandle {
    partition: Option<u32>,
    id: TaskId,
}

impl TaskHandle {
    /// Task `id` in `partition`.
    pub fn new(partition: u32, id: TaskId) -> Self {
        TaskHandle {
            partition: Some(partition),
            id,
        }
    }

    /// Task `id`, partition unknown.
    pub fn bare(id: TaskId) -> Self {
        TaskHandle {
            partition: None,
            id,
        }
    }

    /// The partition, if the handle names it.
    pub fn partition(&self) -> Option<u32> {
        self.partition
    }

    /// The task's id.
    pub fn id(&self) -> &TaskId {
        &self.id
    }
}

impl fmt::Display for TaskHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.partition {
            Some(p) => write!(f, "{}/{}", crate::partition::Shown(p), self.id),
            None => write!(f, "{}", self.id),
        }
    }
}

impl FromStr for TaskHandle {
    type Err = Error;

    /// `<partition>/<task id>`, or a bare task id; refused (naming `id`)
    /// when empty or when the partition is not one (`7`, or `2.7` for
    /// partition 7 of generation 2, docs/design.md §21).
    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        let (partition, id) = match s.split_once('/') {
            Some((p, id)) => {
                let p = crate::partition::parse_unit(p).ok_or_else(|| {
                    Error::invalid(
                        "id",
                        format!("`{s}` is no task handle; use <partition>/<task id>, or the bare task id"),
                    )
                })?;
                (Some(p), id)
            }
            None => (None, s),
        };
        if id.is_empty() {
            return Err(Error::invalid("id", "no task id given"));
        }
        Ok(TaskHandle {
            partition,
            id: TaskId::from(id),
        })
    }
}

/// Where a tracked task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TaskState {
    /// In its partition's stream, not started (or handed back).
    Waiting,
    /// Enqueued with a delay, not due yet.
    Delayed,
    /// Its handler runs (or its batch took it and it waits for a permit).
    Running,
    /// A failed attempt's retry waits for its backoff.
    Retrying,
    /// Final: its handler succeeded.
    Succeeded,
    /// Final: in the dead letters.
    Dead,
    /// Final: a user cancelled it.
    Cancelled,
}

impl TaskState {
    /// The state as records and JSON say it.
    pub fn as_str(&self) -> &'static str {
        match self {
            TaskState::Waiting => "waiting",
            TaskState::Delayed => "delayed",
            TaskState::Running => "running",
            TaskState::Retrying => "retrying",
            TaskState::Succeeded => "succeeded",
            TaskState::Dead => "dead",
            TaskState::Cancelled => "cancelled",
        }
    }

    /// Whether nothing moves the task any more.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            TaskState::Succeeded | TaskState::Dead | TaskState::Cancelled
        )
    }

    pub(crate) fn parse(s: &str) -> Option<TaskState> {
        Some(match s {
            "waiting" => TaskState::Waiting,
            "delayed" => TaskState::Delayed,
            "running" => TaskState::Running,
            "retrying" => TaskState::Retrying,
            "succeeded" => TaskState::Succeeded,
            "dead" => TaskState::Dead,
            "cancelled" => TaskState::Cancelled,
            _ => return None,
        })
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task's record: what Redis says of it now. Times are Redis's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TaskRecord {
    /// The task, with its partition.
    pub handle: TaskHandle,
    /// Where it is; `None` when only a cancel request is recorded (a task
    /// enqueued while tracking was off, or by a producer in another
    /// language, has no record until it starts).
    pub state: Option<TaskState>,
    /// Its attempt: the run underway, or the next one.
    pub attempt: Option<u32>,
    /// The instance that runs (or last ran) it.
    pub instance: Option<String>,
    /// The fencing token it runs (or last ran) under.
    pub token: Option<u64>,
    /// Its last progress, encoded with the service's codec.
    pub progress: Option<Vec<u8>>,
    /// Its result, encoded with the service's codec (none for a handler
    /// that returns nothing).
    pub result: Option<Vec<u8>>,
    /// The last failed attempt's error, while the task is not final, and
    /// in a `dead` record (a `succeeded` record holds none).
    pub error: Option<String>,
    /// Why it is dead or cancelled (`failed`, `permanent`, … or `user`).
    pub reason: Option<String>,
    /// Its dead letter's id in the partition's dead letters.
    pub dead_id: Option<String>,
    /// When a cancel was requested.
    pub cancel_requested_at: Option<SystemTime>,
    /// When it was enqueued.
    pub enqueued_at: Option<SystemTime>,
    /// When a delayed task or a retry is due.
    pub due_at: Option<SystemTime>,
    /// When its current (or last) attempt started.
    pub started_at: Option<SystemTime>,
    /// When it became final.
    pub finished_at: Option<SystemTime>,
    /// Its headers, read from its entry (the record holds none) by
    /// [`Service::task`](crate::admin::Service::task) and
    /// [`wait`](crate::admin::Service::wait); `None` when no entry was
    /// read: a `succeeded` or `cancelled` task's is gone (acked at its end,
    /// trimmed soon after), a `dead` one's letter was purged, or the entry
    /// was not found (docs/design.md §18, "Shown with a task's record").
    pub headers: Option<Headers>,
}

impl TaskRecord {
    /// From the record hash's fields and the task's `{N/p}:running` value
    /// (`instance|token|attempt|started_at`), which, present, says it runs
    /// now; `None` when there is neither.
    pub(crate) fn from_fields(
        handle: TaskHandle,
        mut fields: HashMap<String, Vec<u8>>,
        running: Option<String>,
    ) -> Option<TaskRecord> {
        if fields.is_empty() && running.is_none() {
            return None;
        }
        let mut text = |k: &str| {
            fields
                .remove(k)
                .map(|v| String::from_utf8_lossy(&v).into_owned())
        };
        let time = |v: Option<String>| {
            v.and_then(|v| v.parse::<u64>().ok())
                .map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
        };
        let ran_field = text("ran");
        let mut record = TaskRecord {
            handle,
            state: text("state").as_deref().and_then(TaskState::parse),
            attempt: text("attempt").and_then(|v| v.parse().ok()),
            instance: text("instance"),
            token: text("token").and_then(|v| v.parse().ok()),
            error: text("error"),
            reason: text("reason"),
            dead_id: text("dead_id"),
            cancel_requested_at: time(text("cancel")),
            enqueued_at: time(text("enqueued_at")),
            due_at: time(text("due_at")),
            started_at: time(text("started_at")),
            finished_at: time(text("finished_at")),
            progress: fields.remove("progress"),
            result: fields.remove("result"),
            headers: None,
        };
        // What it runs as now (the running hash), else what it last ran as
        // (a final record's `ran`): `instance|token|attempt|started_at`.
        let runs = running.is_some();
        let ran = running.or(ran_field).unwrap_or_default();
        if let [instance, token, attempt, started] = ran.split('|').collect::<Vec<_>>()[..] {
            if runs {
                record.state = Some(TaskState::Running);
            }
            record.instance = Some(instance.to_owned());
            record.token = token.parse().ok();
            // A dead record says its last attempt itself.
            if runs || record.attempt.is_none() {
                record.attempt = attempt.parse().ok();
            }
            record.started_at = time(Some(started.to_owned()));
        }
        Some(record)
    }

    /// Whether the task is final.
    pub fn is_final(&self) -> bool {
        self.state.is_some_and(|s| s.is_final())
    }

    /// The result, decoded with `codec` (the service's); `None` when
    /// there is none (yet).
    pub fn result_as<T: DeserializeOwned, C: Codec>(
        &self,
        codec: &C,
    ) -> Option<std::result::Result<T, CodecError>> {
        self.result.as_deref().map(|bytes| codec.decode(bytes))
    }

    /// The progress, decoded with `codec` (the service's).
    pub fn progress_as<T: DeserializeOwned, C: Codec>(
        &self,
        codec: &C,
    ) -> Option<std::result::Result<T, CodecError>> {
        self.progress.as_deref().map(|bytes| codec.decode(bytes))
    }
}
