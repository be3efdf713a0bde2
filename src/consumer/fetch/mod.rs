//! The first step of a task's path, fetch → run → settle: the fetch loop of
//! one owned partition. It records this instance as the partition's owner,
//! claims what others left behind, reads the partition's entries and hands
//! each to [`super::run`]. Fetching stops while the instance's lease does
//! not hold (docs/design.md §4 rule 6).
//!
//! While entries wait, it reads them itself, never blocking, on one of the
//! instance's shared connections; once a read comes back short (the stream
//! is read out), it waits in the instance's one blocking read of its idle
//! partitions ([`super::idle_reads`]) until that delivers or takes it out.
//!
//! After any read error it first re-reads its own pending entries (`0`),
//! because a read that failed on the client may still have been delivered
//! into its pending list.
//!
//! Its claims are in [`claims`], its side of the idle read in [`idle`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, warn};

use super::held::Held;
use super::idle_reads::Delivery;
use super::key_slots::MOST_THROTTLED;
use super::limiter::Reserved;
use super::ownership::Ownership;
use super::run::{Batch, Source};
use super::shared::Shared;
use super::store::{self, Fetched};
use crate::assignment::Assignment;
use crate::lease::Lease;
use crate::priority::Priority;
use crate::retry::Pauses;

mod claims;
mod idle;

/// The pauses between attempts to reach Redis again: 50 ms, doubling, at
/// most 2 s; back to the first after a read that went through.
const PAUSES: Pauses = Pauses::new(Duration::from_millis(50), Duration::from_secs(2));
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

impl Position {
    /// Moves past a read's reply (all of it, before any entry is skipped
    /// as held): where it came from, and whether it ended the re-read of
    /// the pending list (an empty reply of the re-read).
    fn advance(&mut self, fetched: &[Fetched]) -> (Source, bool) {
        let Some(from) = &mut self.pending_from else {
            return (Source::New, false);
        };
        match fetched.last() {
            Some(last) => {
                *from = last.id.clone();
                (Source::Redelivered, false)
            }
            None => {
                self.pending_from = None;
                (Source::Redelivered, true)
            }
        }
    }
}

/// The partition's place in the instance's idle read.
struct Idle {
    /// In the idle read now.
    joined: bool,
    /// Where the idle read delivers (kept to join again).
    mailbox: mpsc::UnboundedSender<Delivery>,
    delivered: mpsc::UnboundedReceiver<Delivery>,
}

/// The fetch loop of one partition.
pub(super) struct Fetcher {
    pub(super) shared: Arc<Shared>,
    pub(super) partition: u32,
    /// The lane its reads go out on ([`super::lanes`]).
    pub(super) lane: usize,
    pub(super) assignment: watch::Receiver<Assignment>,
    pub(super) lease: Lease,
    pub(super) ownership: Arc<Ownership>,
    /// Fired once the owner record is written (housekeeping waits for it).
    pub(super) acquired: CancellationToken,
    pub(super) tracker: TaskTracker,
    pub(super) held: Held,
}

impl Fetcher {
    /// Fetches until the partition is released or lost; then leaves the
    /// idle read, and hands back whatever it delivered meanwhile.
    pub(super) async fn run(self) {
        let (mailbox, delivered) = mpsc::unbounded_channel();
        let mut idle = Idle {
            joined: false,
            mailbox,
            delivered,
        };
        let mut at = Position {
            pending_from: None,
            claim_idle: Duration::ZERO,
            next_claim: Instant::now(),
        };
        self.fetch(&mut idle, &mut at).await;
        self.leave_idle(&mut idle, &mut at).await;
    }

    async fn fetch(&self, idle: &mut Idle, at: &mut Position) {
        let mut pauses = PAUSES;
        if !self.acquire(&mut pauses).await {
            return;
        }
        // Rule 3: on acquire, take over whatever other consumers still hold
        // in the partition (the old owner has drained or its deadline
        // passed); later, only what stayed idle for `claim_idle`.
        self.reread(at);
        loop {
            // Rule 6: no claim and no fetch without a lease.
            if !self.lease.valid() && self.or_stop(self.lease.held()).await.is_none() {
                return;
            }
            if Instant::now() >= at.next_claim {
                // One at a time: what is claimed is read from the pending
                // list before anything new, so nothing new may arrive
                // meanwhile.
                if self.shared.order.one_at_a_time() && !self.leave_idle(idle, at).await {
                    return;
                }
                match self.or_stop(self.claim_due(at)).await {
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
            // Entries held aside for their keys (a flood of one key): up to
            // a bound, then nothing more is read until some start.
            while self.held.aside_count() >= MOST_THROTTLED {
                let rest = tokio::time::sleep(Duration::from_millis(10));
                if self.or_stop(rest).await.is_none() {
                    return;
                }
            }
            let Some(count) = self.room().await else {
                return;
            };
            // Limited: no more than the tokens it holds (docs/design.md
            // §15), so a limited instance reads what it can start.
            let limiter = &self.shared.limiter;
            let Some(tokens) = self.or_stop(limiter.reserve(count)).await else {
                return;
            };
            let tokens = tokens.returned_to(limiter);
            let count = tokens.count();
            if self.ownership.stop.is_cancelled() {
                return;
            }
            // Waiting for room or tokens may have outlived the lease, or the
            // service was paused meanwhile.
            if !self.lease.valid() || !self.shared.gate.is_open() {
                continue;
            }
            if idle.joined {
                if !self.wait_idle(idle, at).await {
                    return;
                }
                continue;
            }
            let from = at.pending_from.clone().unwrap_or_else(|| ">".to_owned());
            // Never blocking, so never cut short: a stop waits for its
            // answer, whose entries are this instance's to run or hand back.
            let lane = self.shared.lanes.conn(self.lane);
            let mut fetched = match self.ownership.store.read(lane, &from, count).await {
                Ok(fetched) => fetched,
                Err(e) => {
                    warn!(partition = self.partition, cause = %e, "read failed; re-reading the pending list");
                    if store::is_nogroup(&e) {
                        self.recreate_group().await;
                    }
                    self.reread(at);
                    if self.ownership.stop.is_cancelled() {
                        return;
                    }
                    self.pause(&mut pauses).await;
                    continue;
                }
            };
            pauses.reset();
            // Read out: wait with the other idle partitions.
            let read_out = at.pending_from.is_none() && fetched.len() < count;
            let (source, reread_ended) = at.advance(&fetched);
            // Held from here on (docs/design.md §3, held entries); one held
            // already (a re-read's reply lists what runs) is not run again.
            self.held.take_all(&mut fetched, |entry| &entry.id);
            if reread_ended {
                self.held.end_reread();
            }
            if !self.dispatch(fetched, source, at, tokens).await
                || self.ownership.stop.is_cancelled()
            {
                return;
            }
            if read_out && at.pending_from.is_none() {
                self.shared.idle.join(
                    self.ownership.store.clone(),
                    self.held.clone(),
                    idle.mailbox.clone(),
                );
                idle.joined = true;
            }
        }
    }

    /// Re-reads this instance's pending list from the start before
    /// anything new.
    fn reread(&self, at: &mut Position) {
        at.pending_from = Some("0".to_owned());
        self.held.begin_reread();
    }

    /// Waits until the instance has room for a task, to run and to wait
    /// for its ack; how many entries to read then (about as many as it has
    /// room for). `None`: stopped. No room is held during the read: a
    /// blocked read on an empty partition must not starve busy ones.
    async fn room(&self) -> Option<usize> {
        let free = self.or_stop(self.shared.room.free(self.level())).await?;
        let batch = self.shared.settings.batch;
        Some(self.shared.order.read_count(free, batch))
    }

    /// Hands fetched entries, which this worker took into its [`Held`] as
    /// their read returned, to a task that runs them; false when stopped.
    /// `tokens` are those the read reserved (see [`Limiter`]); the entries
    /// without one take theirs from the pool.
    ///
    /// [`Limiter`]: super::limiter::Limiter
    async fn dispatch(
        &self,
        fetched: Vec<Fetched>,
        source: Source,
        at: &mut Position,
        tokens: Reserved,
    ) -> bool {
        if self.shared.order.one_at_a_time() {
            // Each entry waits for the one before it: its tokens wait in
            // the pool, not here.
            drop(tokens);
            let mut entries = fetched.into_iter();
            while let Some(entry) = entries.next() {
                // One at a time: the next read waits until this task is
                // done; one left pending (no lease, a failed write) is read
                // again before anything after it.
                let batch = self.spawn_batch(vec![entry], source, Reserved::none());
                match self.or_stop(batch).await {
                    None => return false,
                    Some(Ok(true)) => {}
                    Some(_) => {
                        // The rest were never started: let them go, left
                        // pending, so the re-read takes them again.
                        self.held
                            .release_all(entries.as_slice().iter().map(|e| (&*e.id, false)));
                        self.reread(at);
                        break;
                    }
                }
            }
        } else if !fetched.is_empty() {
            self.spawn_batch(fetched, source, tokens);
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

    /// Runs `fut` unless the worker stops first.
    async fn or_stop<F: Future>(&self, fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            _ = self.ownership.stop.cancelled() => None,
            out = fut => Some(out),
        }
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

    /// The partition's priority level (docs/design.md §17).
    fn level(&self) -> Priority {
        (self.shared.levels).level_of(self.partition, self.shared.settings.partitions)
    }

    /// Runs `entries` (taken by [`Held`]) in one task of the worker's
    /// tracker, each once the instance has room for it; the task's result
    /// says whether every entry is no longer pending.
    fn spawn_batch(
        &self,
        entries: Vec<Fetched>,
        source: Source,
        tokens: Reserved,
    ) -> JoinHandle<bool> {
        let batch = Batch {
            tokens,
            shared: self.shared.clone(),
            partition: self.partition,
            level: self.level(),
            place: self.assignment.borrow().place(),
            lease: self.lease.clone(),
            ownership: self.ownership.clone(),
            held: self.held.clone(),
            source,
        };
        self.tracker.spawn(batch.run(entries).in_current_span())
    }
}
