//! The idle partitions' read: one blocking `XREADGROUP` over every owned
//! partition whose stream was read out, on a connection of its own. On a
//! Redis Cluster one command cannot read streams of several slots, so each
//! idle partition has a read of its own, on a connection to the master of
//! its slot ([`IdleReads::spawn`]).
//!
//! A partition with entries waiting reads them itself, with non-blocking
//! reads on the instance's shared connections, many partitions' reads in
//! flight at once: that is where throughput comes from (BENCHMARKS.md, the
//! raw floor). A blocking read stalls every other command on its
//! connection, so waiting for new entries happens here, once per instance
//! rather than once per partition: an idle instance sends one read per
//! `block`, whatever its number of partitions, on one connection.
//!
//! A fetch loop whose read came back short joins with a mailbox; the read
//! delivers the partition's new entries there. A delivery that fills the
//! read's `count` (more may be waiting), and any delivery of an ordered
//! partition (the next read waits for its task), takes the partition out:
//! it reads for itself again until its stream is read out.
//!
//! Joining or leaving while the read is blocked unblocks it (`CLIENT
//! UNBLOCK` from the shared connection) and takes its answer first, so a
//! partition that leaves finds every entry delivered to it in its mailbox
//! before it hears that it left: nothing is delivered into its pending list
//! unseen. A failed read may have delivered entries nobody saw: every
//! partition in it is taken out and re-reads its own pending list.
//!
//! Rule 6 (docs/design.md §4) holds as for every read: none without the
//! lease, and the blocking read ends on the server before the lease does
//! (Redis serves the earliest blocked reader first, so a frozen instance's
//! open read would otherwise take entries added after the next owner took
//! over). Like the fetch loops, it reads nothing while the service is
//! paused or the instance has no room for another task.

mod per_partition;
mod read;
mod wait;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::task::AbortOnDropHandle;
use tracing::{Instrument, warn};

use super::held::Held;
use super::policy::Order;
use super::room::Room;
use super::store::{BlockingReads, Fetched, PartitionStore};
use crate::connection::{Backend, SharedConnection};
use crate::gate::Gate;
use crate::lease::Lease;
use crate::retry::Pauses;
use wait::Blocked;

/// How much earlier than the lease the blocking read must end (the read
/// reaches Redis one trip after the lease was checked; about a round's
/// latency on a LAN, like the lease margin).
const READ_MARGIN: Duration = Duration::from_millis(20);
/// The pauses between attempts to reach Redis again after a failed read:
/// 50 ms, doubling, at most 2 s; back to the first after a read that went
/// through.
const PAUSES: Pauses = Pauses::new(Duration::from_millis(50), Duration::from_secs(2));
/// How often an unblock is sent again while the read has not returned: an
/// unblock that overtook its read (sent on another connection) finds
/// nothing blocked.
const UNBLOCK_AGAIN: Duration = Duration::from_millis(2);

/// What the idle read hands a partition's fetch loop.
#[derive(Debug)]
pub(crate) enum Delivery {
    /// New entries read for the partition, taken into its [`Held`] already
    /// (kept fresh, skipped by its claims) however long they wait in the
    /// mailbox. `out`: the partition is no longer in the idle read, and
    /// reads for itself now.
    Entries { fetched: Vec<Fetched>, out: bool },
    /// A read failed, maybe after Redis delivered entries nobody saw: the
    /// partition is out, and must re-read its own pending list.
    Failed,
}

enum Request {
    Join {
        store: Arc<PartitionStore>,
        held: Held,
        mailbox: mpsc::UnboundedSender<Delivery>,
    },
    Leave {
        partition: u32,
        token: u64,
        left: oneshot::Sender<()>,
    },
}

/// The handle of an instance's idle read; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct IdleReads {
    requests: mpsc::UnboundedSender<Request>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Join { store, .. } => write!(f, "Join({})", store.partition()),
            Request::Leave { partition, .. } => write!(f, "Leave({partition})"),
        }
    }
}

/// What the idle read needs of its instance.
#[derive(Clone)]
pub(crate) struct Setup {
    /// Where its own connection comes from.
    pub(crate) backend: Backend,
    /// For the unblocks (never the read's own connection).
    pub(crate) conn: Arc<SharedConnection>,
    pub(crate) lease: Lease,
    pub(crate) gate: Gate,
    pub(crate) room: Arc<Room>,
    pub(crate) order: Order,
    pub(crate) batch: usize,
    pub(crate) block: Duration,
}

impl IdleReads {
    /// Starts the idle read of an instance; it runs until the handle and
    /// every clone of it are dropped, or the returned task handle is.
    ///
    /// On a Cluster, the handle's requests go to a task that starts one
    /// reader per partition as it first joins; each reader holds its
    /// connection while its partition is in it.
    pub(crate) fn spawn(setup: Setup) -> (IdleReads, AbortOnDropHandle<()>) {
        let (requests, received) = mpsc::unbounded_channel();
        let task = if setup.backend.is_cluster() {
            tokio::spawn(per_partition::run(setup, received).in_current_span())
        } else {
            tokio::spawn(
                IdleReader::new(setup, None, received)
                    .run()
                    .in_current_span(),
            )
        };
        (IdleReads { requests }, AbortOnDropHandle::new(task))
    }

    /// Puts the partition of `store` in the idle read; its new entries are
    /// taken into `held` as the read returns, and go to `mailbox`.
    pub(crate) fn join(
        &self,
        store: Arc<PartitionStore>,
        held: Held,
        mailbox: mpsc::UnboundedSender<Delivery>,
    ) {
        let _ = self.requests.send(Request::Join {
            store,
            held,
            mailbox,
        });
    }

    /// Takes partition `partition` (owned with `token`) out of the idle
    /// read; resolves once no read includes it any more and whatever was
    /// read for it is in its mailbox.
    pub(crate) async fn leave(&self, partition: u32, token: u64) {
        let (left, done) = oneshot::channel();
        let request = Request::Leave {
            partition,
            token,
            left,
        };
        if self.requests.send(request).is_ok() {
            let _ = done.await;
        }
    }
}

/// One partition in the idle read.
struct Member {
    store: Arc<PartitionStore>,
    /// The entries its worker holds: what the read delivers joins them
    /// before it reaches the mailbox (docs/design.md §3, held entries).
    held: Held,
    mailbox: mpsc::UnboundedSender<Delivery>,
}

/// The task behind [`IdleReads`] (on a Cluster, one per partition).
struct IdleReader {
    setup: Setup,
    /// On a Cluster, the one partition it reads: it lets go of its
    /// connection while the partition is not in it.
    partition: Option<u32>,
    requests: mpsc::UnboundedReceiver<Request>,
    /// The partitions in the idle read, by partition.
    members: BTreeMap<u32, Member>,
}

impl IdleReader {
    fn new(
        setup: Setup,
        partition: Option<u32>,
        requests: mpsc::UnboundedReceiver<Request>,
    ) -> IdleReader {
        IdleReader {
            setup,
            partition,
            requests,
            members: BTreeMap::new(),
        }
    }

    async fn run(mut self) {
        let mut connected: Option<BlockingReads> = None;
        let mut pauses = PAUSES;
        loop {
            while let Ok(request) = self.requests.try_recv() {
                self.apply(request);
            }
            // A fetch loop that ended without leaving (aborted at the drain
            // timeout) reads nothing any more.
            self.members.retain(|_, m| !m.mailbox.is_closed());
            let wait = match self.ready() {
                Ok(wait) => wait,
                Err(blocked) => {
                    if blocked == Blocked::NoMember && self.partition.is_some() {
                        // Its partition may have gone to another instance.
                        connected = None;
                    }
                    // Nothing to read for, or not now: wait for a change.
                    if !self.wait_for_change(blocked).await {
                        return;
                    }
                    continue;
                }
            };
            let Some(reader) = &mut connected else {
                match self.connect().await {
                    // Look again before reading: connecting took up to its
                    // timeout (5 s), and the read's bound by the lease,
                    // the gate, the room and the members must be those of
                    // the instant it is sent (rule 6: a read ends before
                    // the lease; one bounded before connecting could stay
                    // blocked past it and past the successor's deadline).
                    Ok(reader) => connected = Some(reader),
                    Err(e) => {
                        warn!(cause = %e, "cannot connect the idle partitions' reader; retrying");
                        if !self.pause(&mut pauses).await {
                            return;
                        }
                    }
                }
                continue;
            };
            let count = self
                .setup
                .order
                .read_count(self.setup.room.available(), self.setup.batch);
            let (read, later) = self.read(reader, count, wait).await;
            match read {
                Ok(delivered) => {
                    pauses.reset();
                    self.deliver(delivered, count);
                }
                Err(e) => {
                    warn!(cause = %e, partitions = self.members.len(), "the idle partitions' read failed; they re-read their pending lists");
                    for (_, member) in std::mem::take(&mut self.members) {
                        let _ = member.mailbox.send(Delivery::Failed);
                    }
                    // A new connection: the failed one may be broken.
                    connected = None;
                }
            }
            let closed = later.is_none();
            for request in later.into_iter().flatten() {
                self.apply(request);
            }
            if closed {
                return;
            }
            if connected.is_none() && !self.pause(&mut pauses).await {
                return;
            }
        }
    }

    /// A connection for the reads: on a Cluster, to the master of its
    /// partition's slot.
    async fn connect(&self) -> crate::error::Result<BlockingReads> {
        let slot = self
            .members
            .values()
            .next()
            .map_or(0, |member| member.store.slot());
        let s = &self.setup;
        BlockingReads::connect(&s.backend, &s.conn, slot, s.block).await
    }

    /// Hands each partition its entries, held by its worker from here on;
    /// one that got a full read, or is ordered, is taken out.
    fn deliver(&mut self, delivered: Vec<(u32, Vec<Fetched>)>, count: usize) {
        for (partition, mut fetched) in delivered {
            let Some(member) = self.members.get(&partition) else {
                continue;
            };
            let out = fetched.len() >= count || self.setup.order.one_at_a_time();
            // Held before the mailbox: its worker may not look at the
            // mailbox for a while (paused, waiting for room, claiming), and
            // an entry nobody holds is neither kept fresh nor known to the
            // claims, which would take it over (attempt 2) while this copy
            // still waits to run (issue 36: a pause longer than
            // `claim_idle` ran a task twice).
            member.held.take_all(&mut fetched, |entry| &entry.id);
            let n = fetched.len();
            if member
                .mailbox
                .send(Delivery::Entries { fetched, out })
                .is_err()
            {
                warn!(
                    partition,
                    entries = n,
                    "entries read for a partition whose fetch loop ended; they stay pending until claimed"
                );
                self.members.remove(&partition);
                continue;
            }
            if out {
                self.members.remove(&partition);
            }
        }
    }

    fn apply(&mut self, request: Request) {
        match request {
            Request::Join {
                store,
                held,
                mailbox,
            } => {
                let member = Member {
                    store,
                    held,
                    mailbox,
                };
                self.members.insert(member.store.partition(), member);
            }
            Request::Leave {
                partition,
                token,
                left,
            } => {
                if self
                    .members
                    .get(&partition)
                    .is_some_and(|m| m.store.token() == token)
                {
                    self.members.remove(&partition);
                }
                let _ = left.send(());
            }
        }
    }

    /// Waits the next pause, answering requests meanwhile; false once
    /// every handle is gone.
    async fn pause(&mut self, pauses: &mut Pauses) -> bool {
        let pause = pauses.wait();
        tokio::pin!(pause);
        loop {
            tokio::select! {
                _ = &mut pause => return true,
                request = self.requests.recv() => match request {
                    Some(request) => self.apply(request),
                    None => return false,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests;
