//! Batches: member tasks and a callback enqueued once, when every member
//! is final (docs/design.md §19).
//!
//! A batch's record lives in the slot of its *home* partition `h` (its id
//! is `<h>/<uuid>`), and its callback is added to that partition's stream
//! by the same script that finds the batch complete, so the callback is
//! enqueued once whoever forwards the last member's end, and never again.
//! A member's end is written by the fenced script that ends it (ack, dead
//! letter, cancel) as a completion record in the member's own partition;
//! that partition's owner forwards the records to the batch
//! (`consumer::completions`), which counts each member once.
//!
//! - here: a batch's id, the summary a callback gets, and the batch
//!   script's calls; `view`: a batch as its record says; `cancel`: a
//!   user's cancel of a batch (a flow's parent);
//! - the producer's side ([`crate::producer::BatchBuilder`],
//!   [`crate::producer::OpenBatch`]) opens batches, adds members and seals.

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

use deadpool_redis::redis::{self, Script};
use serde::Serialize;

use crate::config::ServiceName;
use crate::error::{Error, Result};
use crate::keys;
use crate::task_id::TaskId;

/// The entry fields of batches (docs/design.md §19): a member's batch id
/// (and whether its batch wants its result, and a chain step's input), and
/// a callback's batch id, summary and members' results.
pub(crate) mod field {
    pub(crate) use crate::entry::field::{BATCH, BATCH_RESULTS};
    /// A chain step's input: the result of the step before.
    pub(crate) const PREVIOUS_RESULT: &str = "previous_result";
    /// A callback's batch id.
    pub(crate) const CALLBACK_OF: &str = "callback_of";
    /// A callback's summary: total, succeeded, dead, cancelled and the
    /// ids of the dead, space-separated.
    pub(crate) const SUMMARY: &str = "summary";
    /// A flow parent's members' results: task id and result pairs,
    /// MessagePack strings.
    pub(crate) const RESULTS: &str = "results";
}

mod cancel;
pub(crate) mod records;
mod view;

pub use cancel::BatchCancelled;
pub(crate) use cancel::cancel;
pub(crate) use records::Completion;
pub(crate) use view::view;
pub use view::{BatchView, CallbackState};

/// `batch.lua`, with `unique.lua`'s helpers before it.
pub(crate) static BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../scripts/unique.lua"),
        include_str!("../scripts/batch.lua")
    ))
});

/// A batch's id: its home partition and a UUIDv7, `<h>/<uuid>`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId {
    home: u32,
    /// Shared: every member's link and ack holds its batch's id.
    text: std::sync::Arc<str>,
}

impl BatchId {
    /// A new id whose home is the partition of its UUID among `partitions`
    /// (normal level): its callback's partition key is that UUID.
    pub(crate) fn generate(partitions: u32) -> BatchId {
        let uuid = TaskId::generate();
        let home = crate::partition::partition_of(uuid.as_str().as_bytes(), partitions);
        BatchId {
            home,
            text: format!("{home}/{uuid}").into(),
        }
    }

    /// The id as a string, `<h>/<uuid>`.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The home partition: where the batch's record and its callback are.
    pub fn home(&self) -> u32 {
        self.home
    }

    /// The UUID part: the callback's partition key.
    pub(crate) fn uuid(&self) -> &str {
        let slash = self.text.find('/').expect("a batch id has its home");
        &self.text[slash + 1..]
    }
}

impl fmt::Display for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl FromStr for BatchId {
    type Err = Error;

    /// Reads `<h>/<uuid>`, as [`BatchId::as_str`] writes it.
    fn from_str(s: &str) -> Result<BatchId> {
        let bad = || {
            Error::invalid(
                "batch",
                format!(
                    "`{s}` is no batch id: one reads `<partition>/<uuid>`, as the batch's enqueue returned it"
                ),
            )
        };
        let (home, uuid) = s.split_once('/').ok_or_else(bad)?;
        let home: u32 = home.parse().map_err(|_| bad())?;
        if uuid.is_empty() || uuid.contains(char::is_whitespace) {
            return Err(bad());
        }
        Ok(BatchId {
            home,
            text: s.into(),
        })
    }
}

/// What a batch's callback is told (`TaskContext::batch_summary`): how its
/// members ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct BatchSummary {
    /// The batch.
    #[serde(serialize_with = "as_str")]
    pub batch: BatchId,
    /// Its members.
    pub total: u64,
    /// Members that succeeded.
    pub succeeded: u64,
    /// Members that went to the dead letters.
    pub dead: u64,
    /// Members a user cancelled.
    pub cancelled: u64,
    /// The ids of the dead members (at most 1,000).
    #[serde(serialize_with = "ids")]
    pub dead_ids: Vec<TaskId>,
}

fn as_str<S: serde::Serializer>(id: &BatchId, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(id.as_str())
}

fn ids<S: serde::Serializer>(ids: &[TaskId], s: S) -> std::result::Result<S::Ok, S::Error> {
    s.collect_seq(ids.iter().map(TaskId::as_str))
}

impl BatchSummary {
    /// Reads a callback's `callback_of` and `summary` fields.
    pub(crate) fn read(batch: &str, summary: &str) -> Option<BatchSummary> {
        let mut words = summary.split(' ');
        let mut count = || words.next()?.parse::<u64>().ok();
        let (total, succeeded, dead, cancelled) = (count()?, count()?, count()?, count()?);
        Some(BatchSummary {
            batch: batch.parse().ok()?,
            total,
            succeeded,
            dead,
            cancelled,
            dead_ids: words.filter(|w| !w.is_empty()).map(TaskId::from).collect(),
        })
    }
}

/// What a task is to batches: a member of one (a chain's step with its
/// input), the callback of one (with its summary and, for a flow's parent,
/// its members' results), or both (a flow's child that is a flow itself).
#[derive(Debug, Default)]
pub(crate) struct BatchLink {
    pub(crate) member_of: Option<BatchId>,
    /// Its batch wants its result (its `batch_results`).
    pub(crate) wants_result: bool,
    pub(crate) previous_result: Option<Vec<u8>>,
    pub(crate) summary: Option<BatchSummary>,
    pub(crate) results: Vec<(TaskId, Vec<u8>)>,
}

impl BatchLink {
    /// The link an entry's other fields say; `None` for most tasks, with
    /// no allocation. A plain member's link is the one of the member
    /// before it on this thread when they share their batch (one read's
    /// members mostly do): read once, shared (its batch's id too).
    pub(crate) fn of(extra: &[(String, Vec<u8>)]) -> Option<std::sync::Arc<BatchLink>> {
        if extra.is_empty() {
            return None;
        }
        let bytes = |name: &str| extra.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let plain = bytes(field::PREVIOUS_RESULT).is_none() && bytes(field::CALLBACK_OF).is_none();
        let batch = bytes(field::BATCH);
        if let (true, Some(batch)) = (plain, batch) {
            let cached = LAST.with_borrow(|last| {
                let (id, link) = last.as_ref()?;
                (id.as_slice() == batch.as_slice()).then(|| link.clone())
            });
            if cached.is_some() {
                return cached;
            }
        }
        let link = BatchLink::read(extra)?;
        if let (true, Some(batch)) = (plain, batch) {
            LAST.with_borrow_mut(|last| *last = Some((batch.clone(), link.clone())));
        }
        Some(link)
    }

    /// The link an entry's other fields say, read.
    fn read(extra: &[(String, Vec<u8>)]) -> Option<std::sync::Arc<BatchLink>> {
        let bytes = |name: &str| extra.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let text = |name: &str| std::str::from_utf8(bytes(name)?).ok();
        let mut link = BatchLink {
            member_of: text(field::BATCH).and_then(|b| b.parse().ok()),
            wants_result: bytes(field::BATCH_RESULTS).is_some(),
            previous_result: bytes(field::PREVIOUS_RESULT).cloned(),
            ..BatchLink::default()
        };
        if let Some(batch) = text(field::CALLBACK_OF) {
            link.summary = BatchSummary::read(batch, text(field::SUMMARY)?);
            let results = bytes(field::RESULTS).and_then(|r| crate::tracking::packed::strings(r));
            let mut pairs = results.unwrap_or_default().into_iter();
            while let (Some(id), Some(result)) = (pairs.next(), pairs.next()) {
                let id = String::from_utf8_lossy(&id);
                link.results.push((TaskId::from(&*id), result));
            }
        }
        let none = link.member_of.is_none() && link.summary.is_none();
        (!none).then(|| std::sync::Arc::new(link))
    }
}

thread_local! {
    /// The last plain member's link read on this thread, by its batch id.
    static LAST: std::cell::RefCell<Option<(Vec<u8>, std::sync::Arc<BatchLink>)>> =
        const { std::cell::RefCell::new(None) };
}

/// A batch's keys: its record, its dead members, its home's stream, its
/// members' results, the members a cancel cancels.
pub(crate) struct BatchKeys {
    record: String,
    members: String,
    stream: String,
    results: String,
    children: String,
}

impl BatchKeys {
    pub(crate) fn of(name: &ServiceName, id: &BatchId) -> BatchKeys {
        BatchKeys {
            record: keys::batch(name, id.home, id.uuid()),
            members: keys::batch_members(name, id.home, id.uuid()),
            stream: keys::stream(name, id.home),
            results: keys::batch_results(name, id.home, id.uuid()),
            children: keys::batch_children(name, id.home, id.uuid()),
        }
    }

    /// The batch script's call `op` on these keys, for batch `id`.
    pub(crate) fn call(&self, op: &str, id: &BatchId) -> redis::ScriptInvocation<'static> {
        let mut script = BATCH.key(&self.record);
        script
            .key(&self.members)
            .key(&self.stream)
            .key(&self.results)
            .key(&self.children)
            .arg(op)
            .arg(id.as_str());
        script
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_id_names_its_home_and_reads_back() {
        let id = BatchId::generate(64);
        assert!(id.home() < 64);
        assert_eq!(
            crate::partition::partition_of(id.uuid().as_bytes(), 64),
            id.home()
        );
        let again: BatchId = id.as_str().parse().unwrap();
        assert_eq!(again, id);
        for bad in ["", "7", "x/abc", "7/", "7/a b"] {
            let err = bad.parse::<BatchId>().unwrap_err();
            assert!(err.to_string().contains("`batch`"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_summary_reads_its_counts_and_dead_ids() {
        let s = BatchSummary::read("3/u", "5 3 1 1 t-9").unwrap();
        assert_eq!((s.total, s.succeeded, s.dead, s.cancelled), (5, 3, 1, 1));
        assert_eq!(s.dead_ids, vec![TaskId::from("t-9")]);
        assert_eq!(s.batch.as_str(), "3/u");
        assert!(BatchSummary::read("3/u", "5 3").is_none());
    }
}
