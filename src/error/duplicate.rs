//! What refuses a task for its unique key (docs/design.md §16): the key and
//! the task that holds it, alone ([`Duplicate`]) or per task of a batch
//! ([`BatchDuplicates`]); the crate's `Error` carries them.

use std::fmt;

use crate::task_id::TaskId;

/// A task refused for its unique key: the key, and the task that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    /// The unique key asked for.
    pub unique: String,
    /// The id of the task that holds it (waiting, delayed, running or
    /// retrying).
    pub existing: TaskId,
}

impl fmt::Display for Duplicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unique key `{}` is held by task {}, which is not final yet; nothing was enqueued \
             (the key is free once that task succeeds, is dead-lettered or is cancelled)",
            self.unique, self.existing
        )
    }
}

/// The outcome of a batch some of whose tasks were refused for their
/// unique keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchDuplicates {
    /// Every task's id in the batch's order, as `enqueue_batch_with` would
    /// have returned them: for a refused task, the id of the task that
    /// holds its key.
    pub ids: Vec<TaskId>,
    /// The refused tasks: their places in the batch and what refused each.
    pub refused: Vec<(usize, Duplicate)>,
}

impl fmt::Display for BatchDuplicates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of the batch's {} tasks were refused, their unique keys held by tasks not \
             final yet (the others were enqueued)",
            self.refused.len(),
            self.ids.len()
        )?;
        if let Some((at, first)) = self.refused.first() {
            write!(f, "; the first, task {at}: {first}")?;
        }
        Ok(())
    }
}
