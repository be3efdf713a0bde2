//! What a task's ack ends besides its entry: the lock of its unique key
//! (docs/design.md §16) and, for a batch member, its place in the batch,
//! as its completion record (§19), with its result when its batch wants
//! it (a chain's step, a flow's child). Both are written by the ack
//! script, in the step that acks the entry.

use crate::entry::{Entry, TaskId};
use crate::workflow::{BatchId, BatchLink};

/// What one succeeded task's ack ends besides its entry.
#[derive(Debug, Default)]
pub(crate) struct Ends {
    /// Its task id and unique key, if it holds one: the key is freed.
    pub(crate) unique: Option<(TaskId, String)>,
    /// Its place in a batch, if it is a member: it is counted. Boxed: a
    /// run's outcome stays small for the tasks that are no members.
    pub(crate) member: Option<Box<Member>>,
}

/// A batch member an ack ends.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) task: TaskId,
    /// Its batch's id.
    pub(crate) batch: BatchId,
    /// Whether its batch wants its result.
    pub(crate) wants_result: bool,
    /// Its result (the handler's output, encoded), once it succeeded and
    /// only if its batch wants it; empty otherwise.
    pub(crate) result: Vec<u8>,
    /// Where its entry's stream id is among its ack's ids.
    pub(crate) at: usize,
}

impl Ends {
    /// What `entry`'s ack ends.
    pub(crate) fn of(entry: &Entry) -> Ends {
        let id = || entry.id.clone();
        Ends {
            unique: entry.unique.as_ref().map(|key| (id(), key.clone())),
            // Its link as the run reads it (shared with the members before
            // it of its batch): no copy of the batch's id.
            member: BatchLink::of(&entry.extra).and_then(|link| {
                Some(Box::new(Member {
                    task: id(),
                    batch: link.member_of.clone()?,
                    wants_result: link.wants_result,
                    result: Vec::new(),
                    at: 0,
                }))
            }),
        }
    }

    /// Keeps `result` for the batch, if it wants it.
    pub(crate) fn with_result(mut self, result: &[u8]) -> Ends {
        if let Some(member) = self.member.as_mut().filter(|m| m.wants_result) {
            member.result = result.to_vec();
        }
        self
    }
}

/// What an [`Ack`](super::Ack) of many tasks ends: the unique keys (task
/// id and key) it frees, and the batch members it reports.
pub(crate) type Ending = (Vec<(TaskId, String)>, Vec<Member>);

/// A test hook (`tests/scenarios/batches.rs`): with the environment
/// variable `PEERQ_TEST_CRASH_AFTER_MEMBER_ACK` set, the process aborts at
/// once the first time an ack of batch members lands, before their ends are
/// forwarded: the crash the batches' exactly-once argument must survive
/// (docs/design.md §19). Read once; unset, it costs a load.
pub(super) fn crash_hook() {
    static SET: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        std::env::var_os("PEERQ_TEST_CRASH_AFTER_MEMBER_ACK").is_some()
    });
    if *SET {
        eprintln!("PEERQ_TEST_CRASH_AFTER_MEMBER_ACK: aborting after a member's ack");
        std::process::abort();
    }
}
