//! One partition as a worker owns it: its store (the partition's keys,
//! with this instance's fencing token), the tokens that stop its fetching
//! and interrupt its tasks, and how it learns it lost the partition.
//!
//! Every write to the partition's entries is fenced (docs/design.md §4 rule 8):
//! once another instance holds the partition, Redis refuses them, and the
//! worker drops the partition's work ([`Ownership::fenced`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::error;

use super::store::PartitionStore;
use crate::lease::Lease;

/// What a worker tells the runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Report {
    /// Redis refused a fenced write: another instance holds `partition`
    /// now, so this instance's view of it (with `token`) is stale.
    Fenced { partition: u32, token: u64 },
}

/// One partition as this worker owns it: its fence, and how to drop its
/// work once Redis says another instance owns it.
#[derive(Debug)]
pub(crate) struct Ownership {
    /// The partition's keys and the commands on them, fenced with this
    /// worker's token.
    pub(crate) store: Arc<PartitionStore>,
    /// Stops fetching (and claiming); tasks not started yet are handed back.
    pub(crate) stop: CancellationToken,
    /// Interrupts running tasks: the handlers' stop signal
    /// ([`TaskContext::cancelled`](crate::TaskContext::cancelled)).
    pub(crate) cancel: CancellationToken,
    /// Told when a retry was delayed: the housekeeping then looks at when
    /// the partition's next delayed entry is due.
    pub(crate) delayed: Notify,
    reports: mpsc::UnboundedSender<Report>,
    is_fenced: AtomicBool,
    /// Once released: when its drain ends (rule 1). Until then its running
    /// tasks may still act, with or without a lease (a graceful leave
    /// revokes the lease before its drains).
    drain_until: OnceLock<Instant>,
}

impl Ownership {
    /// The partition of `store`, owned now; Redis's refusals are told to
    /// `reports`.
    pub(crate) fn new(store: PartitionStore, reports: mpsc::UnboundedSender<Report>) -> Self {
        Ownership {
            store: Arc::new(store),
            stop: CancellationToken::new(),
            cancel: CancellationToken::new(),
            delayed: Notify::new(),
            reports,
            is_fenced: AtomicBool::new(false),
            drain_until: OnceLock::new(),
        }
    }

    /// Whether Redis refused a write of the partition to this worker.
    pub(crate) fn is_fenced(&self) -> bool {
        self.is_fenced.load(Ordering::SeqCst)
    }

    /// Stops fetching: the partition is released, and its running tasks
    /// may finish until `deadline`.
    pub(crate) fn release(&self, deadline: Instant) {
        let _ = self.drain_until.set(deadline);
        self.stop.cancel();
    }

    /// Whether this worker may still act on the partition now, from
    /// memory: not fenced, and within its drain if released, else within
    /// `lease`.
    pub(crate) fn holds(&self, lease: &Lease) -> bool {
        if self.is_fenced() {
            return false;
        }
        match self.drain_until.get() {
            Some(deadline) => Instant::now() < *deadline,
            None => lease.valid(),
        }
    }

    /// Redis refused `what` (an ack, a move, a claim): the partition has a
    /// newer owner. Stop fetching, interrupt what runs (its writes would be
    /// refused too; the new owner runs it), and tell the runtime, once.
    pub(crate) fn fenced(&self, what: &str) {
        if !self.is_fenced.swap(true, Ordering::SeqCst) {
            let (partition, token) = (self.store.partition(), self.store.token());
            error!(
                partition,
                token, what, "fenced: another instance owns the partition now; dropping its work"
            );
            let _ = self.reports.send(Report::Fenced { partition, token });
        }
        self.stop.cancel();
        self.cancel.cancel();
    }
}
