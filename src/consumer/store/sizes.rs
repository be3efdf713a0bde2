//! What a partition store knows of its partition's sizes, for the queue
//! gauges and the housekeeping's decisions (trim, promote, claim): read
//! from Redis now and then (the consumer group often, the dead letters' and
//! the delayed set's sizes seldom), and kept current in between by the
//! store's own writes that change them (a dead letter, a delayed retry, a
//! promotion), which all go through the store.

use std::sync::MutexGuard;
use std::time::Duration;

use deadpool_redis::redis;
use deadpool_redis::redis::streams::StreamInfoGroupsReply;
use tokio::time::Instant;

use super::PartitionStore;
use crate::error::Result;
use crate::{backlog, keys};

/// How much a partition holds, for the queue metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Sizes {
    /// Entries not yet delivered, plus delivered ones not yet acked.
    pub(crate) backlog: u64,
    /// Dead letters.
    pub(crate) dead: u64,
    /// Delayed tasks (retries waiting for their backoff, delayed enqueues).
    pub(crate) delayed: u64,
}

/// The consumer group's state in the partition, as `XINFO GROUPS` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group {
    /// Entries delivered to any consumer and not acked yet.
    pub(crate) pending: u64,
    /// The last entry delivered to the group: it moves with every read.
    last_delivered: String,
    /// Entries not delivered yet; `None` when Redis cannot tell (after
    /// deletions inside the stream).
    lag: Option<u64>,
}

impl Group {
    /// Whether entries may have been acked between `self` and `later`:
    /// only a read (which moves the last delivered entry) or an ack
    /// (which lowers the pending count) leaves something to trim.
    pub(crate) fn acked_by(&self, later: &Group) -> bool {
        self.last_delivered != later.last_delivered || self.pending != later.pending
    }
}

/// What the store last learnt of its partition's sizes.
#[derive(Debug, Default)]
pub(super) struct Known {
    /// The last look at the consumer group; `None` before the first or
    /// after a failed one.
    group: Option<Group>,
    backlog: Option<u64>,
    dead: Option<u64>,
    delayed: Option<u64>,
    /// When the earliest retry this store delayed since it was last asked
    /// is due.
    retry_due: Option<Instant>,
}

impl PartitionStore {
    fn known(&self) -> MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Looks at the partition's consumer group and its stream's length
    /// (`XINFO GROUPS` and `XLEN`, one round trip): its pending count and
    /// how far it has read, and the backlog. `Ok(None)` when the group is
    /// gone (the fetch loop creates it again).
    pub(crate) async fn look(&self) -> Result<Option<Group>> {
        let looked = self.read_group().await;
        let mut known = self.known();
        match &looked {
            Ok(Some((group, backlog))) => {
                known.group = Some(group.clone());
                known.backlog = Some(*backlog);
            }
            _ => known.group = None,
        }
        looked.map(|found| found.map(|(group, _)| group))
    }

    async fn read_group(&self) -> Result<Option<(Group, u64)>> {
        let mut pipe = redis::pipe();
        pipe.cmd("XINFO").arg("GROUPS").arg(&self.stream);
        pipe.cmd("XLEN").arg(&self.stream);
        let (groups, length): (StreamInfoGroupsReply, u64) = self.conn.query_pipe(&pipe).await?;
        let Some(group) = groups.groups.into_iter().find(|g| g.name == keys::GROUP) else {
            return Ok(None);
        };
        let group = Group {
            pending: group.pending as u64,
            last_delivered: group.last_delivered_id,
            lag: group.lag.map(|lag| lag as u64),
        };
        let backlog = match group.lag {
            Some(lag) => backlog::undelivered(lag, length, group.pending) + group.pending,
            // Acked entries leave the stream at the next trim, within a
            // second while the partition is busy.
            None => length,
        };
        Ok(Some((group, backlog)))
    }

    /// Reads the sizes of the dead letters and the delayed set; true when
    /// the delayed set's is not what the store knew (someone else changed
    /// it, or nothing was known).
    pub(crate) async fn count(&self) -> Result<bool> {
        let mut pipe = redis::pipe();
        pipe.cmd("XLEN").arg(&self.dead);
        pipe.cmd("ZCARD").arg(&self.delayed);
        let (dead, delayed): (u64, u64) = self.conn.query_pipe(&pipe).await?;
        let mut known = self.known();
        known.dead = Some(dead);
        Ok(known.delayed.replace(delayed) != Some(delayed))
    }

    /// The partition's sizes as last learnt; `None` until each was read
    /// once.
    pub(crate) fn sizes(&self) -> Option<Sizes> {
        let known = self.known();
        Some(Sizes {
            backlog: known.backlog?,
            dead: known.dead?,
            delayed: known.delayed?,
        })
    }

    /// The group's pending count at the last look; `None` before the first
    /// or after a failed one.
    pub(crate) fn pending_seen(&self) -> Option<u64> {
        self.known().group.as_ref().map(|g| g.pending)
    }

    /// When the earliest retry this store delayed since the last call is
    /// due, if it delayed any.
    pub(crate) fn take_retry_due(&self) -> Option<Instant> {
        self.known().retry_due.take()
    }

    /// An entry was acked and moved to the dead letters.
    pub(super) fn noted_dead_letter(&self) {
        let mut known = self.known();
        known.backlog = known.backlog.map(|b| b.saturating_sub(1));
        known.dead = known.dead.map(|d| d + 1);
    }

    /// An entry was acked and its next attempt added, after `delay`.
    pub(super) fn noted_retry(&self, delay: Duration) {
        if delay.is_zero() {
            // Acked and added to the stream: the backlog is as it was.
            return;
        }
        let due = Instant::now() + delay;
        let mut known = self.known();
        known.backlog = known.backlog.map(|b| b.saturating_sub(1));
        known.delayed = known.delayed.map(|d| d + 1);
        known.retry_due = Some(known.retry_due.map_or(due, |at| at.min(due)));
    }

    /// A promotion moved `moved` entries into the stream and left
    /// `delayed`.
    pub(super) fn noted_promotion(&self, moved: u64, delayed: u64) {
        let mut known = self.known();
        known.backlog = known.backlog.map(|b| b + moved);
        known.delayed = Some(delayed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use deadpool_redis::redis::AsyncCommands;

    use super::*;
    use crate::config::ServiceName;
    use crate::connection::SharedConnection;
    use crate::consumer::store::{Moved, To};
    use crate::entry::{Entry, TaskId};
    use crate::instance::InstanceId;
    use peerq_test_support as support;

    #[tokio::test]
    async fn the_store_knows_the_sizes_from_its_looks_counts_and_own_writes() {
        let server = support::RedisServer::start();
        let conn = Arc::new(SharedConnection::new(server.pool()));
        let name = ServiceName::new(&support::unique_name("sizes")).unwrap();
        let me = InstanceId::generate();
        let store = PartitionStore::new(conn.clone(), &name, 0, 1, &me, 1 << 20);
        let mut raw = server.pool().get().await.unwrap();
        store.create_group().await.unwrap();
        assert_eq!(store.acquire().await.unwrap(), None);
        for _ in 0..3 {
            let _: String = raw
                .xadd(keys::stream(&name, 0), "*", &[("k", "v")])
                .await
                .unwrap();
        }
        assert_eq!(store.sizes(), None, "nothing read yet");
        assert_eq!(store.pending_seen(), None);
        let before = store.look().await.unwrap().unwrap();
        assert!(store.count().await.unwrap(), "nothing was known");
        let sizes = |backlog, dead, delayed| Sizes {
            backlog,
            dead,
            delayed,
        };
        assert_eq!(store.sizes(), Some(sizes(3, 0, 0)));
        assert_eq!(store.pending_seen(), Some(0));

        let read: redis::streams::StreamReadReply = raw
            .xread_options(
                &[keys::stream(&name, 0)],
                &[">"],
                &redis::streams::StreamReadOptions::default()
                    .group(keys::GROUP, me.as_str())
                    .count(3),
            )
            .await
            .unwrap();
        let ids: Vec<String> = read.keys[0].ids.iter().map(|e| e.id.clone()).collect();
        let after = store.look().await.unwrap().unwrap();
        assert!(
            before.acked_by(&after),
            "a read may leave something to trim"
        );
        assert!(!after.acked_by(&after));
        assert_eq!(
            (store.pending_seen(), store.sizes()),
            (Some(3), Some(sizes(3, 0, 0)))
        );

        // Its own writes count at once: a dead letter, a delayed retry, one
        // due at once.
        let fields = [("k", "v")];
        let moved = store
            .move_entry(To::DeadLetters, &ids[0], &fields, None)
            .await;
        assert_eq!(moved.unwrap(), Moved::Yes);
        assert_eq!(store.sizes(), Some(sizes(2, 1, 0)));
        let next = Entry::new(TaskId::generate(), None, "bincode", vec![1]);
        let hour = Duration::from_secs(3600);
        assert_eq!(
            store.retry(&ids[1], hour, &next, None).await.unwrap(),
            Moved::Yes
        );
        assert_eq!(store.sizes(), Some(sizes(1, 1, 1)));
        let due = store.take_retry_due().expect("a retry was delayed");
        assert!(due > Instant::now() + hour - Duration::from_secs(5));
        assert_eq!(store.take_retry_due(), None, "told once");
        assert!(!store.count().await.unwrap(), "as the store knew");

        // Someone else's delayed task shows at the next count.
        let _: u64 = raw
            .zadd(keys::delayed(&name, 0), "elsewhere", u64::MAX / 2)
            .await
            .unwrap();
        assert!(store.count().await.unwrap());
        assert_eq!(store.sizes(), Some(sizes(1, 1, 2)));

        let ms = Duration::from_millis(1);
        // Another task: a member of its own in the delayed set.
        let soon = Entry::new(TaskId::generate(), None, "bincode", vec![2]);
        assert_eq!(
            store.retry(&ids[2], ms, &soon, None).await.unwrap(),
            Moved::Yes
        );
        assert_eq!(store.sizes(), Some(sizes(0, 1, 3)));
        tokio::time::sleep(10 * ms).await;
        let (moved, wait) = store.promote(10).await.unwrap();
        assert_eq!(moved, 1);
        assert!(wait.is_some_and(|w| w > hour - Duration::from_secs(5)));
        assert_eq!(
            store.sizes(),
            Some(sizes(1, 1, 2)),
            "moved into the backlog"
        );
        assert!(
            !store.count().await.unwrap(),
            "the promotion told the set's size"
        );
    }
}
