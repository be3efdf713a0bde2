//! The middle step of a task's path, fetch → run → settle: the entries of
//! one read (or one claim) of a partition run in one spawned task, a
//! [`Batch`]. Each entry waits for room and for the lease, is decoded, and
//! runs through the handler ([`entry`]); its outcome goes to
//! [`super::settle`]. What differs for ordered partitions is asked of
//! [`super::policy`].
//!
//! Why a task per batch rather than per entry: a spawned task costs an
//! aligned allocation of the whole future, a copy of it, and the runtime's
//! bookkeeping, about a fifth of the consumer's CPU when a task was spawned
//! per entry (and an ack's oneshot channel per entry besides). The handler
//! calls of a batch still run concurrently (each is a future of its own,
//! polled as it wakes), so a handler that awaits I/O never holds up the
//! others; they share one worker thread at a time, as the tasks of one
//! partition.
//!
//! The batch stays in the worker's tracker until every ack it sent has
//! been told back (landed, refused or given up): a release waits for the
//! tracker, so a drain's acks land before its mark (docs/design.md §4
//! rule 1).

mod aside;
mod entry;
mod in_place;
mod ready;
mod redelivered;
mod started;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use tokio::sync::{SemaphorePermit, mpsc};

use self::aside::Aside;
use self::started::Started;
use super::acker::{Acked, Ends, Member, Tracked};
use super::held::Held;
use super::limiter::Reserved;
use super::ownership::Ownership;
use super::room::Room;
use super::settle::Settle;
use super::shared::Shared;
use super::store::{Fetched, Succeeded};
use crate::lease::Lease;

use crate::assignment::Place;
use crate::handler::Tenure;
use crate::priority::Priority;

/// Where a batch's entries come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// New entries (`>`).
    New,
    /// This instance's own pending list: with attempts kept in Redis, the
    /// attempt number comes from the delivery count too.
    Redelivered,
    /// Another consumer's pending list (a crashed or fenced instance, a
    /// lost ack): they may have run there, so they are taken over.
    Claimed,
}

/// The entries of one read or claim of one partition, and what running
/// them needs.
pub(crate) struct Batch {
    pub(crate) shared: Arc<Shared>,
    pub(crate) partition: u32,
    /// The partition's priority level: its tasks' turn for permits.
    pub(crate) level: Priority,
    /// The assignment in force when the entries were fetched.
    pub(crate) place: Place,
    pub(crate) lease: Lease,
    /// The partition as this worker owns it. Its `stop` is the partition's
    /// release: an entry not started by then is handed back. Its `cancel`
    /// fires at the drain timeout, a lapsed lease or a fence.
    pub(crate) ownership: Arc<Ownership>,
    pub(crate) held: Held,
    pub(crate) source: Source,
    /// The rate limit's tokens its read reserved (docs/design.md §15).
    pub(crate) tokens: Reserved,
}

/// How one entry's run ended.
enum Ran {
    /// Its handler succeeded (or a user cancelled it), and it holds an ack
    /// slot: to be acked; tracked, with how it ended; with what else its
    /// ack ends.
    Succeeded(String, Option<Succeeded>, Ends),
    /// Done here: settled (no longer pending), or left pending.
    Done(String, bool),
}

impl Batch {
    /// Runs `entries` (which [`Held`] has taken) to their outcomes, acks
    /// included; true if every one of them is no longer pending (false:
    /// some are left for this instance's or the next owner's pending
    /// list).
    ///
    /// Entries start in order, each once it has a running permit: the
    /// batch takes what is free at once and otherwise waits for one
    /// permit at a time (one waiter per batch, not one per entry: a queue
    /// of waiters would hold every permit given back until its task was
    /// polled again, and the no-op handlers of a benchmark ran at half
    /// speed behind it).
    pub(crate) async fn run(self, mut entries: Vec<Fetched>) -> bool {
        let tenure: Arc<dyn Tenure> = Arc::new(TaskTenure {
            shared: self.shared.clone(),
            lease: self.lease.clone(),
            ownership: self.ownership.clone(),
        });
        let settle = self.settle();
        // Concurrent: what this instance re-reads may have run before; its
        // attempt says so (before its record says `running`). A claim
        // counted them already.
        if !self.shared.order.attempts_in_redis()
            && self.source == Source::Redelivered
            && !Box::pin(self.count_deliveries(&mut entries)).await
        {
            self.held
                .release_all(entries.iter().map(|f| (&*f.id, false)));
            return false;
        }
        // Tracked: the tasks' records say `running` before any starts,
        // and those a user cancelled first leave here.
        let mut tracks = Started::default();
        let tracking = match self.source {
            Source::Claimed => None,
            _ => self.shared.tracking.on(),
        };
        if let Some(tracking) = tracking {
            match Box::pin(self.start(&tracking, &mut entries)).await {
                Some(started) => tracks = started,
                None => return false,
            }
        }
        let mut running = FuturesUnordered::new();
        let mut waiting = VecDeque::with_capacity(entries.len());
        for fetched in entries {
            // A claimed entry is taken over without running here (unless
            // it cannot be read: it runs to the dead letters).
            if self.source == Source::Claimed && fetched.entry.is_ok() {
                running.push(self.entry(fetched, None, &tenure, None, None));
            } else {
                waiting.push_back(fetched);
            }
        }
        // Entries whose key is at its limit (or out of tokens) wait aside.
        let shared = &self.shared;
        let (slots, rates) = (shared.key_slots.clone(), shared.key_rates.clone());
        let limit_key = shared.runner.limit_key_of().cloned();
        let mut aside = Aside::new(slots, rates, self.held.clone(), limit_key);
        // The wait for the next entry's permit, kept across the loop's
        // turns (a new one each turn would queue and unqueue a waiter).
        let mut next: Option<
            Pin<Box<dyn Future<Output = Option<SemaphorePermit<'_>>> + Send + '_>>,
        > = None;
        // Every ack of the batch tells its outcome here; the channel is
        // open for sending while entries still run or wait.
        let (reply, mut replies) = mpsc::unbounded_channel();
        let mut reply = Some(reply);
        let mut slots = Slots {
            room: &self.shared.room,
            taken: 0,
        };
        let mut told = Vec::new();
        let mut all_settled = true;
        loop {
            if next.is_none() {
                while let Some(permit) = waiting.front().and_then(|_| self.ready_at_once()) {
                    let Some((fetched, slot)) = aside.admit(&mut waiting) else {
                        break;
                    };
                    let track = tracks.take(&fetched);
                    running.push(self.entry(fetched, Some(permit), &tenure, track, slot));
                }
                if !waiting.is_empty() {
                    next = Some(Box::pin(self.ready()));
                }
            }
            if running.is_empty() && waiting.is_empty() && aside.is_empty() {
                reply = None;
                if slots.taken == 0 {
                    break;
                }
            }
            tokio::select! {
                permit = async { next.as_mut().expect("checked").await }, if next.is_some() => {
                    next = None;
                    match permit {
                        Some(permit) => {
                            // None: every waiting entry went aside.
                            if let Some((fetched, slot)) = aside.admit(&mut waiting) {
                                let track = tracks.take(&fetched);
                                running.push(self.entry(fetched, Some(permit), &tenure, track, slot));
                            }
                        }
                        // Released before they started: every waiting entry
                        // is handed back, and those aside.
                        None => {
                            for fetched in waiting.drain(..).chain(aside.take_all()) {
                                running.push(self.entry(fetched, None, &tenure, None, None));
                            }
                        }
                    }
                }
                // A slot of a key was given back: its entries aside go back
                // in front.
                keys = aside.freed(), if !aside.is_empty() => {
                    aside.back(&keys, &mut waiting);
                }
                // Released while only entries aside wait: handed back.
                _ = self.ownership.stop.cancelled(), if next.is_none() && !aside.is_empty() => {
                    for fetched in aside.take_all() {
                        running.push(self.entry(fetched, None, &tenure, None, None));
                    }
                }
                Some(ran) = running.next(), if !running.is_empty() => {
                    // Every entry that finished by now goes in one ack.
                    let (mut succeeded, mut tracked) = (Vec::new(), Vec::new());
                    let (mut unique, mut unique_tracked) = (Vec::new(), Vec::new());
                    let (mut members, mut members_tracked) = (Vec::new(), Vec::new());
                    let mut next = Some(ran);
                    while let Some(one) = next {
                        match one {
                            Ran::Succeeded(id, None, ends) => {
                                let at = succeeded.len();
                                members.extend(ends.member.map(|m| Member { at, ..*m }));
                                succeeded.push(id);
                                unique.extend(ends.unique);
                            }
                            Ran::Succeeded(id, Some(task), ends) => {
                                let at = tracked.len();
                                let member = ends.member.map(|m| Member { at, ..*m });
                                members_tracked.extend(member);
                                tracked.push((id, task));
                                unique_tracked.extend(ends.unique);
                            }
                            Ran::Done(id, settled) => {
                                all_settled &= settled;
                                self.held.release(&id, settled);
                            }
                        }
                        // The next one finished already, if any; no wait.
                        next = running.next().now_or_never().flatten();
                    }
                    let reply = reply.as_ref().expect("open while entries run");
                    if !succeeded.is_empty() {
                        slots.taken += succeeded.len();
                        settle.ack(succeeded, None, (unique, members), reply);
                    }
                    if let (false, Some(tracking)) = (tracked.is_empty(), tracking) {
                        slots.taken += tracked.len();
                        let (ids, tasks) = tracked.into_iter().unzip();
                        let tracked = Some(Tracked { tracking, tasks });
                        settle.ack(ids, tracked, (unique_tracked, members_tracked), reply);
                    }
                }
                n = replies.recv_many(&mut told, usize::MAX), if slots.taken > 0 => {
                    // Every ack tells once, also when dropped untold, so
                    // the channel does not end while acks are underway.
                    let ids: usize = told.iter().map(|(ids, _)| ids.len()).sum();
                    let landed = told.iter().filter(|(_, a)| *a == Acked::Yes);
                    let acked: usize = landed.map(|(ids, _)| ids.len()).sum();
                    let fenced = told.iter().any(|(_, a)| *a == Acked::Fenced);
                    all_settled &= acked == ids;
                    self.held.release_all(told.iter().flat_map(|(ids, a)| {
                        ids.iter().map(move |id| (id.as_str(), *a == Acked::Yes))
                    }));
                    told.clear();
                    slots.give_back(ids);
                    settle.acks_ended(acked, fenced);
                    if n == 0 {
                        break;
                    }
                }
                else => break,
            }
        }
        all_settled
    }

    /// Settles this batch's entries.
    fn settle(&self) -> Settle<'_> {
        Settle {
            shared: &self.shared,
            ownership: &self.ownership,
        }
    }
}

/// The ack slots a batch holds (taken by its entries, see
/// [`Room::ack_slot`]), given back as their acks end, and all of them if
/// the batch is dropped first.
struct Slots<'a> {
    room: &'a Room,
    taken: usize,
}

impl Slots<'_> {
    fn give_back(&mut self, n: usize) {
        let n = n.min(self.taken);
        self.taken -= n;
        self.room.acked(n);
    }
}

impl Drop for Slots<'_> {
    fn drop(&mut self) {
        self.room.acked(self.taken);
    }
}

/// What a task's [`TaskContext::still_owned`](crate::TaskContext::still_owned)
/// consults: the partition's cancellation, fence and drain, and the lease.
/// One per batch, shared by its tasks' contexts.
struct TaskTenure {
    shared: Arc<Shared>,
    lease: Lease,
    ownership: Arc<Ownership>,
}

impl std::fmt::Debug for TaskTenure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskTenure")
            .field("service", &self.shared.name.as_str())
            .field("lease", &self.lease)
            .field("ownership", &self.ownership)
            .finish()
    }
}

impl Tenure for TaskTenure {
    fn cancel(&self) -> &tokio_util::sync::CancellationToken {
        &self.ownership.cancel
    }

    fn holds(&self) -> bool {
        self.ownership.holds(&self.lease)
    }

    fn service(&self) -> &str {
        self.shared.name.as_str()
    }

    fn interval(&self) -> std::time::Duration {
        self.shared.interval
    }
}
