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
//!
//! With priority levels (docs/design.md §17), running permits go to the
//! higher levels' waiting tasks first ([`Turns`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{Mutex, MutexGuard, Notify, Semaphore, SemaphorePermit};

use super::acker;
use crate::priority::Priority;

/// How many permits in a row a waiting level lets higher levels take
/// before it takes the next one itself: the guard against starving it.
pub(crate) const PASSED_OVER: u64 = 9;

/// The two bounds of one instance.
#[derive(Debug)]
pub(crate) struct Room {
    running: Semaphore,
    unacked: Semaphore,
    /// With levels, who queues for `running` next; `None`: first come,
    /// first served.
    turns: Option<Turns>,
}

/// The order of the levels' waits for a running permit.
///
/// Each level's waiting tasks queue for their turn (one per level at a
/// time queues for `running` itself, which serves first come, first
/// served). A level's turn holder queues for `running` only while no
/// higher level waits, or once higher levels took [`PASSED_OVER`] permits
/// since it got its turn. So a freed permit goes to a higher level's task
/// if one waits, except after the guard lets a lower one through; and at
/// most one task of each lower level can be queued ahead of a higher one.
#[derive(Debug, Default)]
struct Turns {
    /// One turn per level, by [`Priority::order`].
    turn: [Mutex<()>; 3],
    /// Tasks of each level waiting for a permit.
    waiting: [AtomicUsize; 3],
    /// Permits each level took after waiting, ever.
    granted: [AtomicU64; 3],
    /// Told whenever a wait ends.
    changed: Notify,
}

impl Turns {
    /// Tasks of levels above `order` waiting.
    fn above(&self, order: usize) -> usize {
        self.waiting[..order]
            .iter()
            .map(|w| w.load(Ordering::SeqCst))
            .sum()
    }

    /// Permits levels above `order` took.
    fn granted_above(&self, order: usize) -> u64 {
        self.granted[..order]
            .iter()
            .map(|g| g.load(Ordering::SeqCst))
            .sum()
    }

    /// Waits until a partition of level `order` may read: at most one
    /// batch of its level waits for a permit (so what it read before has
    /// about started, and the next read overlaps the last batch's wait
    /// rather than leaving permits idle for a round trip), and it may queue
    /// by the rule of [`may_queue`](Self::may_queue).
    async fn may_read(&self, order: usize) {
        let since = self.granted_above(order);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let queue = self.above(order) == 0 || self.granted_above(order) - since >= PASSED_OVER;
            if self.waiting[order].load(Ordering::SeqCst) <= 1 && queue {
                return;
            }
            changed.await;
        }
    }

    /// Waits until the turn of level `order` may queue for a permit: no
    /// higher level waits, or higher levels took [`PASSED_OVER`] permits
    /// since `since` (their count then).
    async fn may_queue(&self, order: usize, since: u64) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.above(order) == 0 || self.granted_above(order) - since >= PASSED_OVER {
                return;
            }
            changed.await;
        }
    }
}

/// A task of one level counted as waiting, until dropped.
struct Waiting<'a> {
    turns: &'a Turns,
    order: usize,
}

impl<'a> Waiting<'a> {
    fn new(turns: &'a Turns, order: usize) -> Self {
        turns.waiting[order].fetch_add(1, Ordering::SeqCst);
        Waiting { turns, order }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.turns.waiting[self.order].fetch_sub(1, Ordering::SeqCst);
        self.turns.changed.notify_waiters();
    }
}

impl Room {
    /// At most `concurrency` handlers at once, and [`unacked_bound`]
    /// finished tasks waiting for their acks.
    ///
    /// [`unacked_bound`]: Room::unacked_bound
    /// With `levels`, permits go to higher levels first.
    pub(crate) fn new(concurrency: usize, levels: bool) -> Room {
        Room {
            running: Semaphore::new(concurrency),
            unacked: Semaphore::new(Room::unacked_bound(concurrency)),
            turns: levels.then(Turns::default),
        }
    }

    /// How many finished tasks may wait for their acks: as many as the
    /// acker's batches underway hold, or `concurrency` if that is more, so
    /// that acks never cap a fast instance.
    pub(crate) fn unacked_bound(concurrency: usize) -> usize {
        (acker::IN_FLIGHT * acker::MAX_BATCH).max(concurrency)
    }

    /// Waits until both parts have room for a read of a partition of
    /// `level`, then says how much: the smaller of the two. Nothing is
    /// taken: a read that blocks on an empty partition must not hold room
    /// that busy partitions need.
    ///
    /// With levels, a level reads only once what it read before has about
    /// started (at most one batch of it waits; its tasks queue for their level's turn rather than for the
    /// semaphore, which alone would let every fetch loop through as each
    /// permit comes back: a million-task backlog had 97,000 entries read
    /// and not started), and a lower level reads only by the rule of the
    /// permits: while no higher level waits, or once higher levels took
    /// [`PASSED_OVER`] permits since it asked.
    pub(crate) async fn free(&self, level: Priority) -> usize {
        if let Some(turns) = &self.turns {
            turns.may_read(level.order()).await;
        }
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

    /// A running permit for a task of `level`, at once if one is free
    /// and no higher level waits for one.
    pub(crate) fn try_run(&self, level: Priority) -> Option<SemaphorePermit<'_>> {
        if let Some(turns) = &self.turns
            && turns.above(level.order()) > 0
        {
            return None;
        }
        self.running.try_acquire().ok()
    }

    /// Waits for a running permit for a task of `level`.
    pub(crate) async fn run(&self, level: Priority) -> SemaphorePermit<'_> {
        let Some(turns) = &self.turns else {
            return self.acquire().await;
        };
        let order = level.order();
        let _waiting = Waiting::new(turns, order);
        let turn: MutexGuard<'_, ()> = turns.turn[order].lock().await;
        if order > 0 {
            let since = turns.granted_above(order);
            turns.may_queue(order, since).await;
        }
        let permit = self.acquire().await;
        turns.granted[order].fetch_add(1, Ordering::SeqCst);
        drop(turn);
        permit
    }

    async fn acquire(&self) -> SemaphorePermit<'_> {
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
        let room = Room::new(2, false);
        let bound = Room::unacked_bound(2);
        assert_eq!(room.free(Priority::Normal).await, 2);
        let running = room.run(Priority::Normal).await;
        assert_eq!(room.free(Priority::Normal).await, 1);
        // A task finishes: its ack slot is taken before its permit goes.
        room.ack_slot().await;
        drop(running);
        assert_eq!(
            room.free(Priority::Normal).await,
            2,
            "waiting acks leave handlers room"
        );
        for _ in 1..bound {
            room.ack_slot().await;
        }
        let full = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            room.free(Priority::Normal),
        )
        .await;
        assert!(full.is_err(), "no room while every ack slot is taken");
        room.acked(1);
        assert_eq!(
            room.free(Priority::Normal).await,
            1,
            "the smaller part says how much"
        );
        room.acked(bound - 1);
        assert_eq!(room.free(Priority::Normal).await, 2);
    }

    /// Runs `order` (a level per task, in the order they queue) on one
    /// permit: the order they start in.
    async fn starts(order: &[Priority]) -> Vec<Priority> {
        let room = std::sync::Arc::new(Room::new(1, true));
        let first = room.run(Priority::Normal).await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for &level in order {
            let (room, tx) = (room.clone(), tx.clone());
            tokio::spawn(async move {
                let permit = room.run(level).await;
                tx.send(level).unwrap();
                tokio::task::yield_now().await;
                drop(permit);
            });
            // Queued in this order.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        drop(first);
        let mut started = Vec::new();
        for _ in order {
            started.push(rx.recv().await.unwrap());
        }
        started
    }

    #[tokio::test]
    async fn a_higher_level_starts_before_lower_ones_that_waited_longer() {
        use Priority::*;
        // The normal and low turn holders queue for the permit only while
        // no high task waits: the first of each may be queued already.
        let started = starts(&[Low, Normal, Normal, High, High, Low]).await;
        let high: Vec<usize> = (0..started.len()).filter(|&i| started[i] == High).collect();
        assert!(high.iter().all(|&i| i <= 3), "{started:?}");
        let normal: Vec<usize> = (0..started.len())
            .filter(|&i| started[i] == Normal)
            .collect();
        assert!(normal.iter().all(|&i| i <= 4), "{started:?}");
    }

    #[tokio::test]
    async fn a_waiting_lower_level_is_passed_over_a_bounded_number_of_times() {
        use Priority::*;
        let mut order = vec![High, Normal];
        order.extend(std::iter::repeat_n(High, 30));
        let started = starts(&order).await;
        let at = started.iter().position(|&l| l == Normal).unwrap();
        // It waits while highs wait, until 9 of them took a permit; then it
        // queues, behind at most the one high task queued already.
        let passed = PASSED_OVER as usize;
        assert!(
            (passed..=passed + 1).contains(&at),
            "normal started {at}th: {started:?}"
        );
    }

    #[tokio::test]
    async fn a_lower_level_takes_no_free_permit_while_a_higher_one_waits() {
        use Priority::*;
        let room = std::sync::Arc::new(Room::new(1, true));
        let first = room.run(Normal).await;
        let high = tokio::spawn({
            let room = room.clone();
            async move { drop(room.run(High).await) }
        });
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        assert!(room.try_run(Normal).is_none());
        drop(first);
        high.await.unwrap();
        assert!(room.try_run(Low).is_some(), "nobody waits any more");
    }

    #[test]
    fn the_ack_bound_is_the_ackers_batches_or_the_concurrency() {
        assert_eq!(Room::unacked_bound(64), acker::IN_FLIGHT * acker::MAX_BATCH);
        assert_eq!(Room::unacked_bound(100_000), 100_000);
    }
}
