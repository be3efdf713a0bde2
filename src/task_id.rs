//! A task's id ([`TaskId`]): its own room, below the error type, so that
//! an error can name the task it is about (`Error::Duplicate`).

use std::fmt;
use std::sync::Arc;

/// A task's id, unique per task. peerq's producer makes UUIDv7s (ordered by
/// creation time); producers in other languages may use any unique string.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(Arc<str>);

impl TaskId {
    /// A new UUIDv7 id.
    pub fn generate() -> Self {
        let mut text = [0; uuid::fmt::Hyphenated::LENGTH];
        TaskId(
            uuid::Uuid::now_v7()
                .hyphenated()
                .encode_lower(&mut text)
                .into(),
        )
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for TaskId {
    fn from(s: &str) -> Self {
        TaskId(s.into())
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}
