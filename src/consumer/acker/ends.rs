//! What a task's ack ends besides its entry: the lock of its unique key
//! (docs/design.md §16) and, for a batch member, its place in the batch,
//! as its completion record (§19). Both are written by the ack script, in
//! the step that acks the entry.

use crate::entry::{Entry, TaskId};

/// What one succeeded task's ack ends besides its entry.
#[derive(Debug, Default)]
pub(crate) struct Ends {
    /// Its task id and unique key, if it holds one: the key is freed.
    pub(crate) unique: Option<(TaskId, String)>,
    /// Its task id and batch id, if it is a batch member: it is counted.
    pub(crate) member: Option<(TaskId, String)>,
}

impl Ends {
    /// What `entry`'s ack ends.
    pub(crate) fn of(entry: &Entry) -> Ends {
        let id = || entry.id.clone();
        Ends {
            unique: entry.unique.as_ref().map(|key| (id(), key.clone())),
            member: entry.member_of().map(|batch| (id(), batch.to_owned())),
        }
    }
}

/// A batch member an ack ends: its stream id, task id and batch id.
pub(crate) type Member = (String, TaskId, String);

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
