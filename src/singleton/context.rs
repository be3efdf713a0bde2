//! What a singleton's job is given ([`SingletonContext`]) and what it
//! holds while it runs ([`Hold`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::instance::InstanceId;
use crate::lease::Lease;

/// One acquired singleton on this instance: the stop of its runs and
/// whether it may still act, from memory (docs/design.md §20).
#[derive(Debug)]
pub(crate) struct Hold {
    lease: Lease,
    /// Fires at a release, a fence or a refused acquire: the job's
    /// [`SingletonContext::cancelled`].
    pub(crate) stop: CancellationToken,
    /// Once released: when its drain ends (rule 1). Until then the job may
    /// still act, with or without a lease (a graceful leave revokes the
    /// lease before its drains). Only ever brought forward: a leave at
    /// once during a drain ends it now (a fence leaves a drain as it is:
    /// its end lies before the next holder's deadline anyway, §4 rule 5).
    drain_until: watch::Sender<Option<Instant>>,
    /// Redis refused its acquire: another instance holds a newer token.
    lost: AtomicBool,
}

impl Hold {
    pub(crate) fn new(lease: Lease) -> Self {
        Hold {
            lease,
            stop: CancellationToken::new(),
            drain_until: watch::Sender::new(None),
            lost: AtomicBool::new(false),
        }
    }

    /// Whether the job may still act now: not refused, and within its
    /// drain if released, else within the lease (as a partition's
    /// `Ownership::holds`).
    pub(crate) fn holds(&self) -> bool {
        if self.lost.load(Ordering::SeqCst) {
            return false;
        }
        match *self.drain_until.borrow() {
            Some(deadline) => Instant::now() < deadline,
            None => self.lease.valid(),
        }
    }

    /// Released (or fenced, with `deadline` now): the job is told to stop
    /// at once and may act until `deadline`, or until an earlier deadline
    /// given before or after.
    pub(crate) fn release(&self, deadline: Instant) {
        self.drain_until.send_if_modified(|until| match until {
            Some(earlier) if *earlier <= deadline => false,
            _ => {
                *until = Some(deadline);
                true
            }
        });
        self.stop.cancel();
    }

    /// Resolves once the lease holds (at once if it does).
    pub(crate) async fn leased(&self) {
        self.lease.held().await;
    }

    /// When the drain ends, once released.
    pub(crate) fn drain_until(&self) -> Option<Instant> {
        *self.drain_until.borrow()
    }

    /// Told each time the drain's end is set or brought forward.
    pub(crate) fn drain_changes(&self) -> watch::Receiver<Option<Instant>> {
        self.drain_until.subscribe()
    }

    /// Redis refused the acquire.
    pub(crate) fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
        self.stop.cancel();
    }
}

/// What a singleton's job is given: who it runs as, its fencing token, and
/// the signals that say when to stop.
///
/// ```
/// # async fn job(cx: peerq::singleton::SingletonContext) -> Result<(), std::io::Error> {
/// while !cx.is_cancelled() {
///     // Check right before each external effect; put the token where
///     // the effect is written, so that a store refuses an older holder.
///     if !cx.still_owned() {
///         break;
///     }
///     let _token = cx.fencing_token();
///     tokio::select! {
///         _ = cx.cancelled() => break,
///         _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
///     }
/// }
/// Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SingletonContext {
    pub(crate) name: Arc<str>,
    pub(crate) token: u64,
    pub(crate) instance: InstanceId,
    pub(crate) hold: Arc<Hold>,
    /// This run's stop: the hold's, or a pause's.
    pub(crate) cancel: CancellationToken,
    /// The epoch of the instance's newest assignment.
    pub(crate) epoch: Arc<AtomicU64>,
}

impl SingletonContext {
    /// The singleton's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token: the epoch in which this instance acquired the
    /// singleton. Tokens of one singleton only grow from holder to holder,
    /// so a store that keeps the highest token it has seen and refuses a
    /// lower one (`UPDATE … WHERE token <= $t`) refuses a holder that
    /// resumed from a freeze after the next one started.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// The instance this run is on.
    pub fn instance_id(&self) -> &InstanceId {
        &self.instance
    }

    /// The epoch of this instance's newest assignment (it moves on every
    /// interval while the singleton stays here).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    /// Resolves when the job must stop: the singleton moves to another
    /// instance (graceful: it may act until the drain timeout, then the
    /// run's future is dropped), the instance fenced itself or leaves, or
    /// the service was paused.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// Whether [`cancelled`](Self::cancelled) has fired.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Whether this instance may still act as the holder, from memory, at
    /// no round trip: false from the lease's end by this instance's clocks
    /// (a freeze, a lost round), from the drain's end after a release, and
    /// once Redis refused the acquire; it stays true between a graceful
    /// release's [`cancelled`](Self::cancelled) and its drain's end, so a
    /// job can finish the step it is in. Check it right before each
    /// external effect; a freeze can still fall between the check and the
    /// effect, which only the [`fencing_token`](Self::fencing_token)
    /// checked by the store closes.
    pub fn still_owned(&self) -> bool {
        self.hold.holds()
    }
}
