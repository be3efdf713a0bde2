//! The instance's room for tasks, in two parts: handlers running now (at
//! most `concurrency`), and tasks whose handler succeeded but whose ack has
//! not landed yet (at most [`Room::unacked_bound`]).
//!
//! They are bounded apart because they cost apart. A running handler is
//! the user's work, bounded by the setting. A finished task waiting for
//! its ack costs a few bytes and one ack round trip (1–2 ms under load):
//! counted against `concurrency`, that round trip alone capped the
//! instance near `concurrency / ack latency` tasks per second. It is still
//! bounded, so that a Redis that stops answering acks stops the reads too
//! (and memory does not grow without bound: measured, 1.6 GiB at 200,000
//! tasks before any bound).
//!
//! The fetch loops read only while both parts have room, about as many
//! entries as both have room for ([`Room::free`]); a task takes its
//! running permit before its handler starts, and a slot for its ack
//! before it gives that permit back, so a full ack part holds handlers'
//! permits and so the reads.

use tokio::sync::{Semaphore, SemaphorePermit};

use super::acker;

/// The two bounds of one instance.
#[derive(Debug)]
pub(crate) struct Room {
    running: Semaphore,
    unacked: Semaphore,
}

impl Room {
    /// At most `concurrency` handlers at once, and [`unacked_bound`]
    /// finished tasks waiting for their acks.
    ///
    /// [`unacked_bound`]: Room::unacked_bound
    pub(crate) fn new(concurrency: usize) -> Room {
        Room {
            running: Semaphore::new(concurrency),
            unacked: Semaphore::new(Room::unacked_bound(concurrency)),
        }
    }

    /// How many finished tasks may wait for their acks: as many as the
    /// acker's batches underway hold, or `concurrency` if that is more, so
    /// that acks never cap a fast instance.
    pub(crate) fn unacked_bound(concurrency: usize) -> usize {
        (acker::IN_FLIGHT * acker::MAX_BATCH).max(concurrency)
    }

    /// Waits until both parts have room, then says how much: the smaller
    /// of the two. Nothing is taken: a read that blocks on an empty
    /// partition must not hold room that busy partitions need.
    pub(crate) async fn free(&self) -> usize {
        // Closed never: the semaphores live as long as the instance.
        drop(self.running.acquire().await);
        drop(self.unacked.acquire().await);
        self.available()
    }

    /// How much both parts have room for now, without waiting.
    pub(crate) fn available(&self) -> usize {
        self.running
            .available_permits()
            .min(self.unacked.available_permits())
    }

    /// A running permit, at once if one is free.
    pub(crate) fn try_run(&self) -> Option<SemaphorePermit<'_>> {
        self.running.try_acquire().ok()
    }

    /// Waits for a running permit.
    pub(crate) async fn run(&self) -> SemaphorePermit<'_> {
        self.running.acquire().await.expect("never closed")
    }

    /// Takes a slot for a finished task's ack, waiting while every slot is
    /// taken; [`acked`](Self::acked) gives it back. (A count rather than a
    /// permit: one batch of tasks gives many back at once, after one
    /// confirmation.)
    pub(crate) async fn ack_slot(&self) {
        match self.unacked.try_acquire() {
            Ok(slot) => slot.forget(),
            Err(_) => self.unacked.acquire().await.expect("never closed").forget(),
        }
    }

    /// `n` acks taken with [`ack_slot`](Self::ack_slot) ended (landed,
    /// refused or given up).
    pub(crate) fn acked(&self, n: usize) {
        if n > 0 {
            self.unacked.add_permits(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn finished_tasks_take_ack_slots_not_running_permits() {
        let room = Room::new(2);
        let bound = Room::unacked_bound(2);
        assert_eq!(room.free().await, 2);
        let running = room.run().await;
        assert_eq!(room.free().await, 1);
        // A task finishes: its ack slot is taken before its permit goes.
        room.ack_slot().await;
        drop(running);
        assert_eq!(room.free().await, 2, "waiting acks leave handlers room");
        for _ in 1..bound {
            room.ack_slot().await;
        }
        let full = tokio::time::timeout(std::time::Duration::from_millis(50), room.free()).await;
        assert!(full.is_err(), "no room while every ack slot is taken");
        room.acked(1);
        assert_eq!(room.free().await, 1, "the smaller part says how much");
        room.acked(bound - 1);
        assert_eq!(room.free().await, 2);
    }

    #[test]
    fn the_ack_bound_is_the_ackers_batches_or_the_concurrency() {
        assert_eq!(Room::unacked_bound(64), acker::IN_FLIGHT * acker::MAX_BATCH);
        assert_eq!(Room::unacked_bound(100_000), 100_000);
    }
}
