//! The first step of a task's path, fetch → run → settle: the fetch loop of
//! one owned partition. It records this instance as the partition's owner,
//! claims what others left behind, reads the partition's entries (through
//! the [`super::store`]'s reader) and hands each to [`super::run`].
//! Fetching stops while the instance's lease does not hold (docs/design.md
//! §4 rule 6).
//!
//! After any read error it first re-reads its own pending entries (`0`),
//! because a read that failed on the client may still have been delivered
//! into its pending list.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, warn};

use super::held::Held;
use super::lease::Lease;
use super::ownership::Ownership;
use super::run::{Batch, Source};
use super::shared::Shared;
use super::store::{self, Fetched, Reader};
use crate::assignment::Assignment;
use crate::retry::Pauses;

/// The pauses between attempts to reach Redis again: 50 ms, doubling, at
/// most 2 s; back to the first after a read that went through.
const PAUSES: Pauses = Pauses::new(Duration::from_millis(50), Duration::from_secs(2));
/// How much earlier than the lease a blocking read must end (the read's
/// command reaches Redis one trip after the lease was checked; about a
/// round's latency on a LAN, like the lease margin).
const READ_MARGIN: Duration = Duration::from_millis(20);

/// Where the fetch loop stands in its partition.
struct Position {
    /// Where the re-read of this instance's own pending list stands;
    /// `None` once it is done and new entries (`>`) are read.
    pending_from: Option<String>,
    /// Claims take what stayed pending elsewhere this long: 0 on acquire,
    /// then `claim_idle`.
    claim_idle: Duration,
    next_claim: Instant,
}

/// The fetch loop of one partition.
pub(super) struct Fetcher {
    pub(super) shared: Arc<Shared>,
    pub(super) partition: u32,
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

impl Fetcher {
    /// Fetches until the partition is released or lost.
    pub(super) async fn run(self) {
        let mut pauses = PAUSES;
        if !self.acquire(&mut pauses).await {
            return;
        }
        let mut connected: Option<Reader> = None;
        // Rule 3: on acquire, take over whatever other consumers still hold
        // in the partition (the old owner has drained or its deadline
        // passed); later, only what stayed idle for `claim_idle`.
        let mut at = Position {
            pending_from: None,
            claim_idle: Duration::ZERO,
            next_claim: Instant::now(),
        };
        self.reread(&mut at);
        loop {
            // Rule 6: no claim and no fetch without a lease.
            if !self.lease.valid() && self.or_stop(self.lease.held()).await.is_none() {
                return;
            }
            if Instant::now() >= at.next_claim {
                match self.or_stop(self.claim_due(&mut at)).await {
                    None => return,
                    Some(true) => {}
                    Some(false) => {
                        self.pause(&mut pauses).await;
                        continue;
                    }
                }
            }
            // Paused: nothing new is read, but claims stay due (what others
            // left is taken over as usual) and the lease is checked again.
            let gate = &self.shared.gate;
            if !gate.is_open() {
                if self.or_stop(gate.opened_or(at.next_claim)).await.is_none() {
                    return;
                }
                continue;
            }
            let Some(count) = self.room().await else {
                return;
            };
            let reader = match &mut connected {
                Some(reader) => reader,
                None => match self.or_stop(self.connect()).await {
                    None => return,
                    Some(Ok(r)) => connected.insert(r),
                    Some(Err(e)) => {
                        warn!(partition = self.partition, cause = %e, "cannot connect the reader; retrying");
                        self.pause(&mut pauses).await;
                        continue;
                    }
                },
            };
            if self.ownership.stop.is_cancelled() {
                return;
            }
            // Waiting for room or a connection may have outlived the lease,
            // or the service was paused meanwhile.
            if !self.lease.valid() || !self.shared.gate.is_open() {
                continue;
            }
            let block = match at.pending_from {
                // A re-read of the pending list never waits.
                Some(_) => None,
                // Rule 6 for a read that waits: it ends on the server before
                // the lease does. Redis serves the earliest blocked reader
                // first, so a frozen instance's open read would otherwise
                // take entries added after the next owner took over.
                None => match self.read_wait(self.shared.settings.block) {
                    Some(wait) => Some(wait),
                    None => {
                        let _ = self.or_stop(tokio::time::sleep(READ_MARGIN)).await;
                        continue;
                    }
                },
            };
            let from = at.pending_from.clone().unwrap_or_else(|| ">".to_owned());
            let Some((read, stopping)) = self.read(reader, &from, count, block).await else {
                return;
            };
            let fetched = match read {
                Ok(fetched) => fetched,
                Err(e) => {
                    warn!(partition = self.partition, cause = %e, "read failed; re-reading the pending list");
                    if store::is_nogroup(&e) {
                        self.recreate_group().await;
                    }
                    // A new connection: the failed one may be broken.
                    connected = None;
                    self.reread(&mut at);
                    if stopping {
                        return;
                    }
                    self.pause(&mut pauses).await;
                    continue;
                }
            };
            pauses.reset();
            if !self.dispatch(fetched, &mut at).await || stopping {
                return;
            }
        }
    }

    /// Re-reads this instance's pending list from the start before
    /// anything new.
    fn reread(&self, at: &mut Position) {
        at.pending_from = Some("0".to_owned());
        self.held.begin_reread();
    }

    /// Claims what others left pending; false when nothing new may be read
    /// yet (the first claim of a partition run one task at a time failed:
    /// what others still hold comes before anything new in the stream).
    async fn claim_due(&self, at: &mut Position) -> bool {
        let order = self.shared.order;
        match self.claim(at.claim_idle).await {
            Ok(took_any) => {
                at.claim_idle = self.shared.settings.claim_idle;
                // One at a time: what was claimed is now in this instance's
                // pending list; read it from there, in stream order, before
                // anything new.
                if took_any && order.one_at_a_time() {
                    self.reread(at);
                }
            }
            Err(e) => {
                warn!(partition = self.partition, cause = %e, "claim failed");
                if order.one_at_a_time() && at.claim_idle.is_zero() {
                    return false;
                }
            }
        }
        at.next_claim = Instant::now() + self.shared.settings.claim_idle / 3;
        true
    }

    /// Waits until the instance has room for a task, to run and to wait
    /// for its ack; how many entries to read then (about as many as it has
    /// room for). `None`: stopped. No room is held during the read: a
    /// blocked read on an empty partition must not starve busy ones.
    async fn room(&self) -> Option<usize> {
        let free = self.or_stop(self.shared.room.free()).await?;
        let batch = self.shared.settings.batch;
        Some(self.shared.order.read_count(free, batch))
    }

    /// Reads from `from`, waiting up to `block` for new entries; whether it
    /// was cut short by a stop comes along. `None`: a stopped read did not
    /// return.
    async fn read(
        &self,
        reader: &mut Reader,
        from: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Option<(crate::Result<Vec<Fetched>>, bool)> {
        let client_id = reader.client_id();
        let read = reader.read(&self.ownership.store, from, count, block);
        tokio::pin!(read);
        tokio::select! {
            biased;
            read = &mut read => Some((read, false)),
            _ = self.ownership.stop.cancelled() => {
                // Unblock the read on the server and take its answer:
                // entries it delivered are this instance's to run or hand
                // back. Dropping the connection instead could leave them
                // delivered into the pending list, unseen. (If the unblock
                // overtakes the read, the read ends by its own block time.)
                let _ = store::unblock(&self.shared.conn, client_id).await;
                let wait = self.shared.settings.block + Duration::from_secs(2);
                match tokio::time::timeout(wait, &mut read).await {
                    Ok(read) => Some((read, true)),
                    Err(_) => {
                        error!(partition = self.partition, "a stopped read did not return; its entries stay pending until claimed");
                        None
                    }
                }
            }
        }
    }

    /// Hands the fetched entries this worker does not hold yet to a task
    /// that runs them; false when stopped.
    async fn dispatch(&self, mut fetched: Vec<Fetched>, at: &mut Position) -> bool {
        let source = match at.pending_from {
            Some(_) => Source::Redelivered,
            None => Source::New,
        };
        let mut reread_ended = false;
        if let Some(from) = &mut at.pending_from {
            match fetched.last() {
                Some(last) => *from = last.id.clone(),
                None => {
                    at.pending_from = None;
                    reread_ended = true;
                }
            }
        }
        if self.shared.order.one_at_a_time() {
            for entry in fetched {
                // Not one this worker holds already, or finished during the
                // re-read.
                if !self.held.take(&entry.id) {
                    continue;
                }
                // One at a time: the next read waits until this task is
                // done; one left pending (no lease, a failed write) is read
                // again before anything after it.
                match self.or_stop(self.spawn_batch(vec![entry], source)).await {
                    None => return false,
                    Some(Ok(true)) => {}
                    Some(_) => {
                        self.reread(at);
                        break;
                    }
                }
            }
        } else {
            self.held.take_all(&mut fetched, |entry| &entry.id);
            if !fetched.is_empty() {
                self.spawn_batch(fetched, source);
            }
        }
        if reread_ended {
            self.held.end_reread();
        }
        true
    }

    /// Rule 3: records this instance as the partition's owner with its
    /// fencing token, retrying while Redis is unreachable. False when the
    /// worker stopped first or a newer owner is recorded already.
    async fn acquire(&self, pauses: &mut Pauses) -> bool {
        let store = &self.ownership.store;
        loop {
            match self.or_stop(store.acquire()).await {
                None => return false,
                Some(Ok(None)) => {
                    debug!(
                        partition = self.partition,
                        token = store.token(),
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
                    self.pause(pauses).await;
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

    /// A connection of its own for blocking reads; its server-side id is
    /// published for the release.
    async fn connect(&self) -> crate::Result<Reader> {
        let reader = Reader::connect(self.shared.conn.pool(), self.shared.settings.block).await?;
        self.reader_id.store(reader.client_id(), Ordering::SeqCst);
        Ok(reader)
    }

    /// Waits the next pause, unless the worker stops first.
    async fn pause(&self, pauses: &mut Pauses) {
        let _ = self.or_stop(pauses.wait()).await;
    }

    /// The group is gone (Redis lost its data, or someone deleted it):
    /// create it again from the start, so nothing still in the stream is
    /// lost (what was acked but not trimmed yet runs again).
    async fn recreate_group(&self) {
        error!(
            partition = self.partition,
            "the consumer group is gone; creating it again from the start of the stream"
        );
        if let Err(e) = self.ownership.store.create_group().await {
            warn!(partition = self.partition, cause = %e, "could not create the consumer group");
        }
    }

    /// Claims entries other consumers left pending for `idle` or longer
    /// (a crashed or fenced instance, a failed ack) and runs them; true if
    /// it took any.
    async fn claim(&self, idle: Duration) -> crate::Result<bool> {
        let mut took_any = false;
        let store = &self.ownership.store;
        let order = self.shared.order;
        let batch = self.shared.settings.batch;
        let mut start = "0-0".to_owned();
        loop {
            let claimed = store
                .claim(idle, &start, batch, order.attempts_in_redis())
                .await?;
            let Some(claimed) = claimed else {
                self.ownership.fenced("claiming");
                return Ok(took_any);
            };
            took_any |= !claimed.entries.is_empty();
            // One at a time: they run from this instance's pending list, in
            // order, not enqueued again at the end.
            if !order.one_at_a_time() {
                let mut entries = claimed.entries;
                self.held.take_all(&mut entries, |entry| &entry.id);
                for entry in &entries {
                    debug!(
                        partition = self.partition,
                        id = entry.id,
                        "claimed a pending entry"
                    );
                }
                if !entries.is_empty() {
                    self.spawn_batch(entries, Source::Claimed);
                }
            }
            if claimed.next == "0-0" {
                return Ok(took_any);
            }
            start = claimed.next;
        }
    }

    /// Runs `entries` (taken by [`Held`]) in one task of the worker's
    /// tracker, each once the instance has room for it; the task's result
    /// says whether every entry is no longer pending.
    fn spawn_batch(&self, entries: Vec<Fetched>, source: Source) -> JoinHandle<bool> {
        let batch = Batch {
            shared: self.shared.clone(),
            partition: self.partition,
            assignment: *self.assignment.borrow(),
            lease: self.lease.clone(),
            ownership: self.ownership.clone(),
            held: self.held.clone(),
            source,
        };
        self.tracker.spawn(batch.run(entries).in_current_span())
    }
}
