//! The fetch loop of one owned partition: record this instance as its
//! owner, claim what others left behind, read its entries and hand each to
//! [`super::run_task`]. Fetching stops while the instance's lease does not
//! hold (docs/design.md §4 rule 6).
//!
//! Each worker reads with `XREADGROUP` on a connection of its own (a
//! blocking read stalls every other command on its connection), whose
//! response timeout is above the block time. After any read error it first
//! re-reads its own pending entries (`0`), because a read that failed on the
//! client may still have been delivered into its pending list.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use deadpool_redis::redis::streams::{StreamId, StreamReadOptions, StreamReadReply};
use deadpool_redis::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, warn};

use super::held::Held;
use super::lease::Lease;
use super::ownership::Ownership;
use super::run_task::RunTask;
use super::{Payload, Shared, TaskService};
use crate::assignment::Assignment;
use crate::codec::Codec;
use crate::keys;

/// Longest pause between attempts to reach Redis again.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How much earlier than the lease a blocking read must end (the read's
/// command reaches Redis one trip after the lease was checked; about a
/// round's latency on a LAN, like the lease margin).
const READ_MARGIN: Duration = Duration::from_millis(20);

/// A worker's own connection for blocking reads, and its id on the server
/// (to unblock a read on stop).
struct Reader {
    conn: MultiplexedConnection,
    client_id: u64,
}

/// The fetch loop of one partition.
pub(super) struct Fetcher<T, S, C> {
    pub(super) shared: Arc<Shared<T, S, C>>,
    pub(super) partition: u32,
    pub(super) stream: String,
    pub(super) assignment: watch::Receiver<Assignment>,
    pub(super) lease: Lease,
    pub(super) ownership: Arc<Ownership>,
    /// Fired once the owner record is written (housekeeping waits for it).
    pub(super) acquired: CancellationToken,
    /// Where the reader's server-side id is published, for the release.
    pub(super) reader_id: Arc<AtomicU64>,
    pub(super) tracker: TaskTracker,
    pub(super) held: Held,
}

impl<T: Payload, S: TaskService<T>, C: Codec> Fetcher<T, S, C> {
    pub(super) async fn run(self) {
        let (block, batch) = (self.shared.settings.block, self.shared.settings.batch);
        let mut backoff = Duration::from_millis(50);
        if !self.acquire(&mut backoff).await {
            return;
        }
        let mut reader: Option<Reader> = None;
        // Where the re-read of this instance's own pending list stands;
        // `None` once it is done and new entries (`>`) are read.
        let mut pending_from = Some("0".to_owned());
        self.held.begin_reread();
        // Rule 3: on acquire, take over whatever other consumers still hold
        // in the partition (the old owner has drained or its deadline
        // passed); later, only what stayed idle for `claim_idle`.
        let mut claim_idle = Duration::ZERO;
        let mut next_claim = Instant::now();
        loop {
            // Rule 6: no claim and no fetch without a lease.
            if !self.lease.valid() && self.or_stop(self.lease.held()).await.is_none() {
                return;
            }
            if Instant::now() >= next_claim {
                let Some(claimed) = self.or_stop(self.claim(claim_idle)).await else {
                    return;
                };
                match claimed {
                    Ok(took_any) => {
                        claim_idle = self.shared.settings.claim_idle;
                        // Ordered: what was claimed is now in this
                        // instance's pending list; read it from there, in
                        // stream order, before anything new.
                        if took_any && self.shared.settings.ordered {
                            pending_from = Some("0".to_owned());
                            self.held.begin_reread();
                        }
                    }
                    Err(e) => {
                        warn!(partition = self.partition, cause = %e, "claim failed");
                        // Ordered: what other consumers still hold comes
                        // before anything new in the stream, so nothing new
                        // is read until the first claim has gone through.
                        if self.shared.settings.ordered && claim_idle.is_zero() {
                            self.pause(&mut backoff).await;
                            continue;
                        }
                    }
                }
                next_claim = Instant::now() + self.shared.settings.claim_idle / 3;
            }
            // Read only while the instance has room, and about as much as
            // it has room for. No permit is held during the read: a blocked
            // read on an empty partition must not starve busy ones.
            let Some(room) = self.or_stop(self.shared.permits.acquire()).await else {
                return;
            };
            drop(room);
            // Ordered: one at a time.
            let count = match self.shared.settings.ordered {
                true => 1,
                false => self.shared.permits.available_permits().clamp(1, batch),
            };
            let Reader { conn, client_id } = match &mut reader {
                Some(reader) => reader,
                None => match self.or_stop(self.connect_reader()).await {
                    None => return,
                    Some(Ok(r)) => {
                        self.reader_id.store(r.client_id, Ordering::SeqCst);
                        reader.insert(r)
                    }
                    Some(Err(e)) => {
                        warn!(partition = self.partition, cause = %e, "cannot connect the reader; retrying");
                        self.pause(&mut backoff).await;
                        continue;
                    }
                },
            };
            let id = pending_from.clone().unwrap_or_else(|| ">".to_owned());
            let mut opts = StreamReadOptions::default()
                .group(keys::GROUP, self.shared.id.as_str())
                .count(count);
            if self.ownership.stop.is_cancelled() {
                return;
            }
            // Waiting for room or a connection may have outlived the lease.
            if !self.lease.valid() {
                continue;
            }
            if pending_from.is_none() {
                // Rule 6 for a read that waits: it ends on the server before
                // the lease does. Redis serves the earliest blocked reader
                // first, so a frozen instance's open read would otherwise
                // take entries added after the next owner took over.
                let Some(wait) = self.read_wait(block) else {
                    let _ = self.or_stop(tokio::time::sleep(READ_MARGIN)).await;
                    continue;
                };
                // Never 0 ms: `BLOCK 0` waits forever.
                opts = opts.block(wait.as_millis().max(1) as usize);
            }
            let (streams, ids) = ([self.stream.as_str()], [id.as_str()]);
            let (read, stopping) = {
                let read =
                    conn.xread_options::<_, _, Option<StreamReadReply>>(&streams, &ids, &opts);
                tokio::pin!(read);
                tokio::select! {
                    biased;
                    read = &mut read => (read, false),
                    _ = self.ownership.stop.cancelled() => {
                        // Unblock the read on the server and take its answer:
                        // entries it delivered are this instance's to run or
                        // hand back. Dropping the connection instead could
                        // leave them delivered into the pending list, unseen.
                        // (If the unblock overtakes the read, the read ends
                        // by its own block time.)
                        let mut unblock = redis::cmd("CLIENT");
                        unblock.arg("UNBLOCK").arg(*client_id);
                        let _ = self.shared.conn.query::<u32>(&unblock).await;
                        match tokio::time::timeout(block + Duration::from_secs(2), &mut read).await {
                            Ok(read) => (read, true),
                            Err(_) => {
                                error!(partition = self.partition, "a stopped read did not return; its entries stay pending until claimed");
                                return;
                            }
                        }
                    }
                }
            };
            let entries: Vec<StreamId> = match read {
                Ok(reply) => reply
                    .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
                    .unwrap_or_default(),
                Err(e) => {
                    warn!(partition = self.partition, cause = %e, "read failed; re-reading the pending list");
                    if e.code() == Some("NOGROUP") {
                        self.recreate_group().await;
                    }
                    reader = None;
                    pending_from = Some("0".to_owned());
                    self.held.begin_reread();
                    if stopping {
                        return;
                    }
                    self.pause(&mut backoff).await;
                    continue;
                }
            };
            backoff = Duration::from_millis(50);
            let redelivered = pending_from.is_some();
            let mut reread_ended = false;
            if let Some(from) = &mut pending_from {
                match entries.last() {
                    Some(last) => *from = last.id.clone(),
                    None => {
                        pending_from = None;
                        reread_ended = true;
                    }
                }
            }
            for entry in entries {
                // Not one this worker holds already, or finished during
                // the re-read.
                if !self.held.take(&entry.id) {
                    continue;
                }
                let run = self.spawn_task(entry, redelivered);
                if !self.shared.settings.ordered {
                    continue;
                }
                // Ordered: the next read waits until this task is done; one
                // left pending (no lease, a failed write) is read again
                // before anything after it.
                match self.or_stop(run).await {
                    None => return,
                    Some(Ok(true)) => {}
                    Some(_) => {
                        pending_from = Some("0".to_owned());
                        self.held.begin_reread();
                        break;
                    }
                }
            }
            if reread_ended {
                self.held.end_reread();
            }
            if stopping {
                return;
            }
        }
    }

    /// Rule 3: records this instance as the partition's owner with its
    /// fencing token, retrying while Redis is unreachable. False when the
    /// worker stopped first or a newer owner is recorded already.
    async fn acquire(&self, backoff: &mut Duration) -> bool {
        loop {
            match self
                .or_stop(self.ownership.fence.acquire(&self.shared.conn))
                .await
            {
                None => return false,
                Some(Ok(None)) => {
                    debug!(
                        partition = self.partition,
                        token = self.ownership.fence.token(),
                        "acquired"
                    );
                    self.acquired.cancel();
                    return true;
                }
                Some(Ok(Some(recorded))) => {
                    warn!(
                        partition = self.partition,
                        recorded, "the partition has an owner with a newer token"
                    );
                    self.ownership.fenced("recording the owner");
                    return false;
                }
                Some(Err(e)) => {
                    warn!(partition = self.partition, cause = %e, "cannot record the owner; retrying");
                    self.pause(backoff).await;
                }
            }
        }
    }

    /// How long a read may wait for new entries: `block`, cut to end
    /// `READ_MARGIN` before the lease; `None` when the lease ends sooner.
    fn read_wait(&self, block: Duration) -> Option<Duration> {
        let left = self.lease.left()?.checked_sub(READ_MARGIN)?;
        Some(left.min(block)).filter(|wait| *wait >= Duration::from_millis(1))
    }

    /// Runs `fut` unless the worker stops first.
    async fn or_stop<F: Future>(&self, fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            _ = self.ownership.stop.cancelled() => None,
            out = fut => Some(out),
        }
    }

    /// A connection of its own for blocking reads, whose response timeout
    /// is above the block time (the client gives up on a reply after 500 ms
    /// by default, while the server may still deliver into the pending list).
    async fn connect_reader(&self) -> crate::Result<Reader> {
        // Taken out of the pool for good: the pool's recycling must not hand
        // a connection with a blocked read to anyone else.
        let pooled = self.shared.conn.pool().get().await?;
        let mut conn = deadpool_redis::Connection::take(pooled);
        conn.set_response_timeout(self.shared.settings.block + Duration::from_secs(5));
        let client_id: u64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut conn)
            .await?;
        Ok(Reader { conn, client_id })
    }

    async fn pause(&self, backoff: &mut Duration) {
        let _ = self.or_stop(tokio::time::sleep(*backoff)).await;
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
    }

    /// The group is gone (Redis lost its data, or someone deleted it):
    /// create it again from the start, so nothing still in the stream is
    /// lost (what was acked but not trimmed yet runs again).
    async fn recreate_group(&self) {
        error!(
            partition = self.partition,
            "the consumer group is gone; creating it again from the start of the stream"
        );
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(&self.stream)
            .arg(keys::GROUP)
            .arg("0")
            .arg("MKSTREAM");
        if let Err(e) = self.shared.conn.query::<()>(&cmd).await {
            warn!(partition = self.partition, cause = %e, "could not create the consumer group");
        }
    }

    /// Claims entries other consumers left pending for `idle` or longer
    /// (a crashed or fenced instance, a failed ack) and runs them; true if
    /// it took any.
    async fn claim(&self, idle: Duration) -> crate::Result<bool> {
        let mut took_any = false;
        let fence = &self.ownership.fence;
        let mut start = "0-0".to_owned();
        // Ordered: the delivery count is the attempt record; the claim must
        // not add to it (the re-read that runs the entries does).
        let ordered = self.shared.settings.ordered;
        loop {
            let batch = self.shared.settings.batch;
            let consumer = self.shared.id.as_str();
            let Some(reply) = fence
                .claim(&self.shared.conn, consumer, idle, &start, batch, ordered)
                .await?
            else {
                self.ownership.fenced("claiming");
                return Ok(took_any);
            };
            took_any |= !reply.claimed.is_empty();
            for entry in reply.claimed {
                // Ordered: they run from this instance's pending list, in
                // order, not enqueued again at the end.
                if ordered {
                    continue;
                }
                if self.held.take(&entry.id) {
                    debug!(
                        partition = self.partition,
                        id = entry.id,
                        "claimed a pending entry"
                    );
                    let run = self.run_task();
                    self.tracker.spawn(run.take_over(entry));
                }
            }
            if reply.next_stream_id == "0-0" {
                return Ok(took_any);
            }
            start = reply.next_stream_id;
        }
    }

    /// Runs `entry` in its own task, once the instance has room for it.
    /// `redelivered`: read from this instance's pending list (it may have
    /// run before, here or on a previous owner).
    fn spawn_task(&self, entry: StreamId, redelivered: bool) -> JoinHandle<bool> {
        let mut run = self.run_task();
        run.redelivered = redelivered;
        self.tracker.spawn(run.run(entry))
    }

    fn run_task(&self) -> RunTask<T, S, C> {
        RunTask {
            shared: self.shared.clone(),
            partition: self.partition,
            assignment: *self.assignment.borrow(),
            lease: self.lease.clone(),
            cancel: self.ownership.cancel.child_token(),
            ownership: self.ownership.clone(),
            held: self.held.clone(),
            settled: AtomicBool::new(false),
            redelivered: false,
        }
    }
}
