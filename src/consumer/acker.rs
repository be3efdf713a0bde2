//! Batched, fenced acknowledgements.
//!
//! Finished tasks are acked by one task per instance: it takes whatever has
//! finished since its last round trip and sends one fenced ack script per
//! partition in one pipeline, so acks cost one round trip per batch, not
//! per task, and add no delay when the instance is idle. The script acks
//! only while this instance is the partition's recorded owner (docs/design.md §4
//! rule 8).
//!
//! Each ack's outcome goes back, with its id, on the channel its sender
//! gave: one per batch of tasks (`super::run`), not one per task.
//!
//! The acks of released partitions go first: a release's drain waits for
//! its last acks before its mark (docs/design.md §4 rule 1), within the
//! drain timeout, and a busy instance may have thousands of acks queued
//! before them. In FIFO order a drain missed its 300 ms in a debug build
//! under load once the queue was allowed 16,384 acks.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, warn};

use super::store::{self, AckReply, PartitionStore};
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::retry::Pauses;

/// Most acks sent in one pipeline. With `IN_FLIGHT`, it bounds the
/// finished tasks waiting for acks ([`super::room::Room`]): at 1,024 (a
/// bound of 4,096) a busy instance read about half the entries it asked
/// for, at 4,096 full batches.
pub(crate) const MAX_BATCH: usize = 4096;
/// Most pipelines of acks underway at once.
pub(crate) const IN_FLIGHT: usize = 4;
/// How often a failed ack batch is tried before its entries are left
/// pending (the partition's owner then claims and re-runs them): with the
/// pauses below, about 10 s, so a short outage of Redis costs no re-runs.
const ATTEMPTS: u32 = 8;
/// The pauses between two tries: 100 ms, doubling, at most 2 s.
const PAUSES: Pauses = Pauses::new(Duration::from_millis(100), Duration::from_secs(2));

/// One finished task to ack.
#[derive(Debug)]
pub(crate) struct Ack {
    /// The partition and token it ran under.
    store: Arc<PartitionStore>,
    /// The partition's release: once it fired, this ack goes first.
    released: CancellationToken,
    /// Its stream entry id.
    id: String,
    /// Told the id and the outcome once the ack has landed, was refused,
    /// or was given up; `None` once told.
    reply: Option<Replies>,
}

/// Where the outcomes of acks go back: a stream entry id and how its ack
/// ended.
pub(crate) type Replies = mpsc::UnboundedSender<(String, Acked)>;

impl Ack {
    /// Entry `id` of the partition of `store` (with its token), released
    /// when `released` fires, whose outcome goes to `reply`.
    pub(crate) fn new(
        store: Arc<PartitionStore>,
        released: CancellationToken,
        id: String,
        reply: Replies,
    ) -> Ack {
        Ack {
            store,
            released,
            id,
            reply: Some(reply),
        }
    }

    /// Tells the sender how its ack ended.
    fn tell(mut self, acked: Acked) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send((std::mem::take(&mut self.id), acked));
        }
    }
}

impl Drop for Ack {
    /// An ack dropped before it was told (the acker stopped, a send to it
    /// failed) was given up: its sender must not wait for it forever.
    fn drop(&mut self) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send((std::mem::take(&mut self.id), Acked::GaveUp));
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
    /// Redis did not answer; the entry stays pending and will run again.
    GaveUp,
}

/// Sends acks in batches until every sender is dropped.
pub(crate) fn spawn(
    name: ServiceName,
    conn: Arc<SharedConnection>,
) -> (mpsc::UnboundedSender<Ack>, JoinHandle<()>) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Ack>();
    let task = tokio::spawn(
        async move {
            // Up to `IN_FLIGHT` batches underway at once, on the one
            // multiplexed connection: while one round trip is underway
            // (several ms under load, most of it waiting for its turn on
            // the client's two cores), the next batch need not wait.
            let mut underway = FuturesUnordered::new();
            let mut queue = Queue::default();
            let mut open = true;
            while open || !queue.is_empty() || !underway.is_empty() {
                // Everything sent so far is queued here, so a batch can
                // take released partitions' acks first.
                while let Ok(ack) = rx.try_recv() {
                    queue.push(ack);
                }
                if !queue.is_empty() && underway.len() < IN_FLIGHT {
                    underway.push(send(&name, &conn, queue.next_batch()));
                    continue;
                }
                tokio::select! {
                    ack = rx.recv(), if open => match ack {
                        Some(ack) => queue.push(ack),
                        None => open = false,
                    },
                    Some(()) = underway.next(), if !underway.is_empty() => {}
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

    /// At most `MAX_BATCH` acks: those of released partitions first, then
    /// the oldest others.
    fn next_batch(&mut self) -> Vec<Ack> {
        let mut batch = Vec::with_capacity(self.0.len().min(MAX_BATCH));
        if self.0.iter().any(|ack| ack.released.is_cancelled()) {
            let mut rest = VecDeque::with_capacity(self.0.len());
            for ack in self.0.drain(..) {
                if batch.len() < MAX_BATCH && ack.released.is_cancelled() {
                    batch.push(ack);
                } else {
                    rest.push_back(ack);
                }
            }
            self.0 = rest;
        }
        while batch.len() < MAX_BATCH {
            match self.0.pop_front() {
                Some(ack) => batch.push(ack),
                None => break,
            }
        }
        batch
    }
}

/// Acks `batch` and tells each sender how it went.
async fn send(name: &ServiceName, conn: &SharedConnection, batch: Vec<Ack>) {
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
    let outcomes = ack_groups(name, conn, &groups).await;
    for ((_, acks), outcome) in groups.into_iter().zip(outcomes) {
        for ack in acks {
            ack.tell(outcome);
        }
    }
}

/// One outcome per group, with retries.
async fn ack_groups(
    name: &ServiceName,
    conn: &SharedConnection,
    groups: &[(Arc<PartitionStore>, Vec<Ack>)],
) -> Vec<Acked> {
    let ids: Vec<(&PartitionStore, Vec<&str>)> = groups
        .iter()
        .map(|(store, acks)| (&**store, acks.iter().map(|a| a.id.as_str()).collect()))
        .collect();
    let mut pauses = PAUSES;
    for attempt in 1..=ATTEMPTS {
        match store::ack(conn, &ids).await {
            Ok(replies) => return replies.into_iter().map(outcome).collect(),
            Err(cause) => {
                warn!(service = %name, attempt, cause, "ack failed; retrying");
                pauses.wait().await;
            }
        }
    }
    let count: usize = groups.iter().map(|(_, acks)| acks.len()).sum();
    error!(
        service = %name,
        count,
        "acks failed {ATTEMPTS} times; the tasks stay pending and will run again"
    );
    vec![Acked::GaveUp; groups.len()]
}

fn outcome(reply: AckReply) -> Acked {
    match reply {
        AckReply::Acked => Acked::Yes,
        AckReply::Fenced => Acked::Fenced,
        AckReply::Refused(e) => {
            error!(cause = e, "ack refused by redis");
            Acked::GaveUp
        }
    }
}
