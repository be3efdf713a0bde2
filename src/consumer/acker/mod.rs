//! Batched, fenced acknowledgements.
//!
//! Finished tasks are acked by one task per instance: it takes whatever has
//! finished since its last round trip and sends one fenced ack script per
//! partition in one pipeline, so acks cost one round trip per batch, not
//! per task, and add no delay when the instance is idle. The script acks
//! only while this instance is the partition's recorded owner (docs/design.md §4
//! rule 8).
//!
//! An [`Ack`] carries the ids of every task of one batch (`super::run`)
//! that finished in the same turn of the batch: with a no-op handler a
//! read's hundred tasks are one message, not a hundred (a message per task
//! cost a token, a store and a sender cloned and dropped, two channel
//! sends and a queue entry each; acks were about a fifth of the consumer's
//! CPU). Its outcome goes back, with its ids, on the channel its sender
//! gave: one per batch of tasks, not one per task.
//!
//! The acks of released partitions go first: a release's drain waits for
//! its last acks before its mark (docs/design.md §4 rule 1), within the
//! drain timeout, and a busy instance may have thousands of acks queued
//! before them. In FIFO order a drain missed its 300 ms in a debug build
//! under load once the queue was allowed 16,384 acks.
//!
//! An ack that did not land is sent again, after a pause of its own
//! (100 ms doubling to 2 s), until it lands or Redis says the partition
//! has a newer owner; it is never given up while the instance runs:
//! - Redis did not answer, or said "not now" (`LOADING`, `BUSY`, …);
//! - Redis refused it (`NOPERM` after an ACL change, `OOM` with a full
//!   memory): an operator can fix either while the instance runs, and
//!   its tasks must then not run again;
//! - with `wait_for_replicas`, replicas did not confirm it (a replica down
//!   or behind): a drain's mark must not survive a failover that lost the
//!   acks under it (docs/design.md §8).
//!
//! Why: a task holds its ack slot until its ack lands, so while acks do not
//! land the slots fill, and then the permits and the reads stop (§3). An
//! ack given up freed its slot: an instance whose acks Redis refused read
//! and ran its whole backlog, none of it acked, and every task ran again
//! once the acks could land (issue 36). Meanwhile a released partition's
//! successor waits for its deadline, acquires, and the next try is fenced.
//! An ack goes back to the queue between tries, so it holds no place among
//! the batches underway.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, warn};

use super::completions::Completions;
use super::store::{self, AckGroup, AckReply, PartitionStore, Succeeded};
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::entry::TaskId;
use crate::retry::Pauses;
use crate::tracking::Tracking;
pub(crate) use ends::{Ending, Ends, Member};

/// Most ids acked in one pipeline (an [`Ack`] with more goes alone).
/// With `IN_FLIGHT`, it bounds the finished tasks waiting for acks
/// ([`super::room::Room`]): at 1,024 (a bound of 4,096) a busy instance
/// read about half the entries it asked for, at 4,096 full batches.
pub(crate) const MAX_BATCH: usize = 4096;
/// Most pipelines of acks underway at once.
pub(crate) const IN_FLIGHT: usize = 4;
/// The pauses before an ack that did not land is sent again: 100 ms,
/// doubling, at most 2 s.
const PAUSES: Pauses = Pauses::new(Duration::from_millis(100), Duration::from_secs(2));

/// Finished tasks of one partition to ack: one batch's that finished
/// together.
#[derive(Debug)]
pub(crate) struct Ack {
    /// The partition and token they ran under.
    store: Arc<PartitionStore>,
    /// The partition's release: once it fired, this ack goes first.
    released: CancellationToken,
    /// Their stream entry ids (at least one).
    ids: Vec<String>,
    /// With tracking on: each id's task and result, in `ids`' order, and
    /// the tracking they were run under.
    tracked: Option<Tracked>,
    /// The task id and unique key of each of its tasks that holds one
    /// (docs/design.md §16): the ack frees their keys. Empty for most.
    unique: Vec<(TaskId, String)>,
    /// Its batch members (§19): the ack writes their completion records.
    /// Empty for most.
    members: Vec<Member>,
    /// Told the ids and the outcome once the ack has landed or was fenced
    /// (or given up, as the acker stops); `None` once told.
    reply: Option<Replies>,
    /// The pauses before it is sent again while it does not land.
    retries: Pauses,
}

/// The tracked tasks of an [`Ack`] (docs/design.md §14): the ack script
/// writes each one's final record, result included, with its ack.
#[derive(Debug)]
pub(crate) struct Tracked {
    pub(crate) tracking: Tracking,
    /// How each task ended, one per id of the ack.
    pub(crate) tasks: Vec<Succeeded>,
}

/// Where the outcomes of acks go back: the stream entry ids of one
/// [`Ack`] and how it ended.
pub(crate) type Replies = mpsc::UnboundedSender<(Vec<String>, Acked)>;

impl Ack {
    /// Entries `ids` of the partition of `store` (with its token),
    /// released when `released` fires, whose outcome goes to `reply`;
    /// `tracked`: their tasks' records are written too.
    pub(crate) fn new(
        store: Arc<PartitionStore>,
        released: CancellationToken,
        ids: Vec<String>,
        tracked: Option<Tracked>,
        reply: Replies,
    ) -> Ack {
        Ack {
            store,
            released,
            ids,
            tracked,
            unique: Vec::new(),
            members: Vec::new(),
            reply: Some(reply),
            retries: PAUSES,
        }
    }

    /// The same ack, ending `ending` too: freeing the unique keys (task
    /// id and key of each of its tasks that holds one) and reporting the
    /// batch members.
    pub(crate) fn ending(mut self, (unique, members): Ending) -> Ack {
        self.unique = unique;
        self.members = members;
        self
    }

    /// Sends it again after its next pause: it did not land.
    fn again(mut self) -> impl Future<Output = Ack> {
        let pause = self.retries.take();
        async move {
            tokio::time::sleep(pause).await;
            self
        }
    }

    /// Tells the sender how its ack ended.
    fn tell(mut self, acked: Acked) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send((std::mem::take(&mut self.ids), acked));
        }
    }
}

impl Drop for Ack {
    /// An ack dropped before it was told (the acker stopped, a send to it
    /// failed) was given up: its sender must not wait for it forever.
    fn drop(&mut self) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send((std::mem::take(&mut self.ids), Acked::GaveUp));
        }
    }
}

/// How an ack ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acked {
    /// Acked (or not pending any more).
    Yes,
    /// Refused: another instance owns the partition now.
    Fenced,
    /// The acker stopped first (the instance leaves at once): the entry
    /// stays pending, and runs again on the partition's next owner.
    GaveUp,
}

/// Sends acks in batches until every sender is dropped.
pub(crate) fn spawn(
    name: ServiceName,
    conn: Arc<SharedConnection>,
    completions: Arc<Completions>,
) -> (mpsc::UnboundedSender<Ack>, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Ack>();
    let task = tokio::spawn(
        async move {
            // Up to `IN_FLIGHT` batches underway at once, on the one
            // multiplexed connection: while one round trip is underway
            // (several ms under load, most of it waiting for its turn on
            // the client's two cores), the next batch need not wait.
            let mut underway = FuturesUnordered::new();
            // Acks that did not land, each waiting its pause.
            let mut unconfirmed = FuturesUnordered::new();
            let mut queue = Queue::default();
            let mut open = true;
            while open || !queue.is_empty() || !underway.is_empty() || !unconfirmed.is_empty() {
                // Everything sent so far is queued here, so a batch can
                // take released partitions' acks first.
                while let Ok(ack) = rx.try_recv() {
                    queue.push(ack);
                }
                if !queue.is_empty() && underway.len() < IN_FLIGHT {
                    underway.push(send(&name, &conn, &completions, queue.next_batch()));
                    continue;
                }
                tokio::select! {
                    ack = rx.recv(), if open => match ack {
                        Some(ack) => queue.push(ack),
                        None => open = false,
                    },
                    Some(again) = underway.next(), if !underway.is_empty() => {
                        unconfirmed.extend(again.into_iter().map(Ack::again));
                    }
                    Some(ack) = unconfirmed.next(), if !unconfirmed.is_empty() => queue.push(ack),
                }
            }
        }
        .in_current_span(),
    );
    (tx, task)
}

/// The acks waiting to be sent, in the order they came.
#[derive(Default)]
struct Queue(VecDeque<Ack>);

impl Queue {
    fn push(&mut self, ack: Ack) {
        self.0.push_back(ack);
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Acks of at most `MAX_BATCH` ids (or one ack, if it alone has
    /// more): those of released partitions first, then the oldest others.
    fn next_batch(&mut self) -> Vec<Ack> {
        let mut batch = Batch::default();
        if self.0.iter().any(|ack| ack.released.is_cancelled()) {
            let mut rest = VecDeque::with_capacity(self.0.len());
            for ack in self.0.drain(..) {
                if ack.released.is_cancelled() && batch.has_room_for(&ack) {
                    batch.push(ack);
                } else {
                    rest.push_back(ack);
                }
            }
            self.0 = rest;
        }
        while let Some(ack) = self.0.pop_front() {
            if !batch.has_room_for(&ack) {
                self.0.push_front(ack);
                break;
            }
            batch.push(ack);
        }
        batch.acks
    }
}

/// The acks of one round trip, and their ids' count.
#[derive(Default)]
struct Batch {
    acks: Vec<Ack>,
    ids: usize,
}

impl Batch {
    /// Whether `ack` fits under `MAX_BATCH` ids (the first always does).
    fn has_room_for(&self, ack: &Ack) -> bool {
        self.acks.is_empty() || self.ids + ack.ids.len() <= MAX_BATCH
    }

    fn push(&mut self, ack: Ack) {
        self.ids += ack.ids.len();
        self.acks.push(ack);
    }
}

/// Acks `batch` and tells each sender how it went; returns the acks
/// replicas did not confirm, to send again.
async fn send(
    name: &ServiceName,
    conn: &SharedConnection,
    completions: &Completions,
    batch: Vec<Ack>,
) -> Vec<Ack> {
    // One script per partition and token (a partition may be released and
    // acquired again, with a new token, while acks are underway).
    let mut groups: BTreeMap<(u32, u64), (Arc<PartitionStore>, Vec<Ack>)> = BTreeMap::new();
    for ack in batch {
        let key = (ack.store.partition(), ack.store.token());
        groups
            .entry(key)
            .or_insert_with(|| (ack.store.clone(), Vec::new()))
            .1
            .push(ack);
    }
    let groups: Vec<(Arc<PartitionStore>, Vec<Ack>)> = groups.into_values().collect();
    let outcomes = ack_groups(name, conn, completions, &groups).await;
    let mut again = Vec::new();
    for ((_, acks), outcome) in groups.into_iter().zip(outcomes) {
        match outcome {
            Some(outcome) => acks.into_iter().for_each(|ack| ack.tell(outcome)),
            None => again.extend(acks),
        }
    }
    again
}

/// One outcome per group; `None` for a group to send again (its ack did
/// not land).
async fn ack_groups(
    name: &ServiceName,
    conn: &SharedConnection,
    completions: &Completions,
    groups: &[(Arc<PartitionStore>, Vec<Ack>)],
) -> Vec<Option<Acked>> {
    let ids: Vec<AckGroup<'_>> = groups
        .iter()
        .map(|(store, acks)| {
            let mut group = AckGroup {
                store,
                ids: Vec::new(),
                tracked: Vec::new(),
                tracking: None,
                unique: Vec::new(),
                members: Vec::new(),
            };
            for ack in acks {
                let unique = ack.unique.iter();
                group
                    .unique
                    .extend(unique.map(|(task, key)| (task.as_str(), key.as_str())));
                let members = ack.members.iter().map(|m| {
                    let stream_id = ack.ids[m.at].as_str();
                    (
                        m.task.as_str(),
                        m.batch.as_str(),
                        m.result.as_slice(),
                        stream_id,
                    )
                });
                group.members.extend(members);
                match &ack.tracked {
                    None => group.ids.extend(ack.ids.iter().map(String::as_str)),
                    Some(tracked) => {
                        group.tracking = Some(tracked.tracking);
                        let tasks = ack.ids.iter().zip(&tracked.tasks);
                        group
                            .tracked
                            .extend(tasks.map(|(id, task)| (id.as_str(), task)));
                    }
                }
            }
            group
        })
        .collect();
    match store::ack(conn, &ids).await {
        Ok(replies) => {
            let outcomes = groups.iter().zip(replies);
            outcomes
                .map(|((store, acks), reply)| outcome(name, completions, store, acks, reply))
                .collect()
        }
        Err(cause) => {
            let acks = groups.iter().flat_map(|(_, acks)| acks);
            if first_try(acks) {
                warn!(service = %name, cause, "ack failed; sending it again until it lands");
            } else {
                debug!(service = %name, cause, "ack failed again");
            }
            vec![None; groups.len()]
        }
    }
}

/// Whether any of `acks` is at its first try: the warning of a failure is
/// given once per ack, the next tries say nothing new.
fn first_try<'a>(acks: impl IntoIterator<Item = &'a Ack>) -> bool {
    acks.into_iter()
        .any(|ack| ack.retries.upcoming() == PAUSES.upcoming())
}

/// What `reply` means for the `acks` of the partition of `store`; `None`:
/// send them again.
fn outcome(
    name: &ServiceName,
    completions: &Completions,
    store: &Arc<PartitionStore>,
    acks: &[Ack],
    reply: AckReply,
) -> Option<Acked> {
    Some(match reply {
        AckReply::Acked => {
            if acks.iter().any(|ack| !ack.members.is_empty()) {
                ends::crash_hook();
                // Their completion records are written: forwarded soon
                // (noted here, not through the partition's housekeeping:
                // a task woken per ack less).
                completions.note(store);
            }
            Acked::Yes
        }
        AckReply::Fenced => Acked::Fenced,
        AckReply::Unconfirmed(cause) => {
            let partition = store.partition();
            if first_try(acks) {
                warn!(service = %name, partition, cause, "acks not confirmed by replicas; sending them again until they are");
            } else {
                debug!(service = %name, partition, cause, "acks still not confirmed by replicas");
            }
            return None;
        }
        AckReply::Refused(cause) => {
            let partition = store.partition();
            if first_try(acks) {
                error!(service = %name, partition, cause, "ack refused by redis; sending it again until it lands (reads stop once the instance's unacked tasks reach their bound)");
            } else {
                debug!(service = %name, partition, cause, "ack refused by redis again");
            }
            return None;
        }
    })
}

mod ends;
#[cfg(test)]
mod tests;
