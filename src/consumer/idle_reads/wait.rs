//! When the idle read may read, and what it waits for when it may not.

use std::time::Duration;

use super::{IdleReader, READ_MARGIN};
use crate::lease::Lease;
use crate::priority::Priority;

/// How long a read may block by the lease: it must end `READ_MARGIN`
/// before the lease does, and block at least 1 ms (0 would block forever).
pub(super) fn by_lease(lease: &Lease) -> Option<Duration> {
    let left = lease.left()?.checked_sub(READ_MARGIN)?;
    (left >= MIN_BLOCK).then_some(left)
}

/// The shortest read worth sending: `BLOCK 0` waits forever.
pub(super) const MIN_BLOCK: Duration = Duration::from_millis(1);

/// Why the idle read may not read now: the one thing it waits for (besides
/// a request, which it always takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Blocked {
    /// No partition is in it.
    NoMember,
    /// The service is paused.
    Paused,
    /// The instance has no room for another task.
    NoRoom,
    /// No lease.
    NoLease,
    /// The lease holds, but ends too soon for a read to end before it.
    LeaseEnding,
}

impl IdleReader {
    /// How long the next read may block, if one may start now: some
    /// partition waits, the gate is open, the instance has room, and the
    /// lease holds for longer than the margin. Otherwise what it waits for.
    pub(super) fn ready(&self) -> Result<Duration, Blocked> {
        let s = &self.setup;
        if self.members.is_empty() {
            return Err(Blocked::NoMember);
        }
        if !s.gate.is_open() {
            return Err(Blocked::Paused);
        }
        if s.room.available() == 0 {
            return Err(Blocked::NoRoom);
        }
        match by_lease(&s.lease) {
            Some(wait) => Ok(wait.min(s.block)),
            None if s.lease.valid() => Err(Blocked::LeaseEnding),
            None => Err(Blocked::NoLease),
        }
    }

    /// Waits until a read may become possible: a request, or the end of
    /// what `blocked` it (the gate opens, the lease is granted, room frees,
    /// the lease margin passes). False once every handle is gone.
    ///
    /// It arms the wait that `ready` named, which ends at once if its cause
    /// is gone already, never one chosen by a second look at the state:
    /// the state changes between the looks (handlers end on other threads,
    /// the runtime grants the lease), and a second look that disagreed with
    /// the first armed nothing but the requests. With every partition in
    /// the read none came, and the idle read stopped for good while their
    /// entries piled up: once with a lease 20–21 ms from its end (a
    /// benchmark run), and with room freed between the looks as the
    /// instance filled up (the stall scenario: its instance started nothing
    /// after its 21 partitions had all joined the read).
    pub(super) async fn wait_for_change(&mut self, blocked: Blocked) -> bool {
        let (gate, lease) = (self.setup.gate.clone(), self.setup.lease.clone());
        let room = self.setup.room.clone();
        tokio::select! {
            request = self.requests.recv() => match request {
                Some(request) => {
                    self.apply(request);
                    true
                }
                None => false,
            },
            _ = gate.opened(), if blocked == Blocked::Paused => true,
            _ = lease.held(), if blocked == Blocked::NoLease => true,
            _ = tokio::time::sleep(READ_MARGIN), if blocked == Blocked::LeaseEnding => true,
            // Read as a high level's: whatever arrives in a read-out partition.
            _ = room.free(Priority::High), if blocked == Blocked::NoRoom => true,
        }
    }
}
