//! The connections partitions read on while their entries wait: an
//! instance's lanes.
//!
//! Throughput comes from many partitions' non-blocking reads in flight at
//! once on a few multiplexed connections (BENCHMARKS.md, the raw floor:
//! 64 per-stream loops on 2 shared connections reached 0.75 of a
//! connection each, on 4 0.88). An idle instance may hold only 4
//! connections, and its partitions then send no such reads (they wait in
//! the one blocking read, [`super::idle_reads`]). So two lanes are the
//! instance's shared connections, always there, and two are busy lanes:
//! made by the first read that goes out on them, and let go once no read
//! went out on them for [`LET_GO`]. An instance holds 6 connections while
//! a backlog is read, and 4 again about [`LET_GO`] after the last one.
//!
//! A fetch loop takes the next lane in turn when it starts, not one chosen
//! by its partition's number: an instance of `replicas` owns every
//! `replicas`-th partition, and lanes by `p % lanes` would leave lanes
//! unused whenever the two numbers share a factor (with 2 replicas, half
//! of them).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio_util::task::AbortOnDropHandle;
use tracing::Instrument;

use crate::connection::SharedConnection;

/// Lanes in all: the two shared connections and the busy lanes.
const LANES: usize = 4;
/// How long a busy lane stays connected after the last read on it.
pub(crate) const LET_GO: Duration = Duration::from_secs(2);
/// How often the busy lanes are looked at: a lane is let go at most this
/// long after [`LET_GO`].
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// The lanes of one instance.
#[derive(Debug)]
pub(crate) struct Lanes {
    /// Lane 0: the instance's shared connection (acks, scripts,
    /// housekeeping).
    conn: Arc<SharedConnection>,
    /// Lane 1: a second shared connection, for reads only.
    reads: SharedConnection,
    /// Lanes 2 and 3.
    busy: [Busy; LANES - 2],
    /// The lane the next fetch loop takes.
    next: AtomicUsize,
    /// What the busy lanes' last reads are counted from.
    epoch: Instant,
}

/// A lane connected only while reads go out on it.
#[derive(Debug)]
struct Busy {
    conn: SharedConnection,
    /// When a read last went out on it, in ms since the lanes' epoch.
    last_read: AtomicU64,
}

impl Lanes {
    /// Lane 0 on `conn`, the instance's shared connection; the other lanes
    /// to the same Redis, each connected on its first read.
    pub(crate) fn new(conn: Arc<SharedConnection>) -> Lanes {
        let busy = || Busy {
            conn: SharedConnection::new(conn.backend().clone()),
            last_read: AtomicU64::new(0),
        };
        Lanes {
            reads: SharedConnection::new(conn.backend().clone()),
            busy: [busy(), busy()],
            conn,
            next: AtomicUsize::new(0),
            epoch: Instant::now(),
        }
    }

    /// The lane of a fetch loop starting now: the lanes in turn.
    pub(crate) fn take(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % LANES
    }

    /// The connection of `lane`, for a read going out now.
    pub(crate) fn conn(&self, lane: usize) -> &SharedConnection {
        match lane % LANES {
            0 => &self.conn,
            1 => &self.reads,
            busy => {
                let busy = &self.busy[busy - 2];
                busy.last_read.store(self.now_ms(), Ordering::Relaxed);
                &busy.conn
            }
        }
    }

    /// Lets go of the busy lanes no read went out on for [`LET_GO`], until
    /// the returned handle is dropped.
    pub(crate) fn spawn_let_go(self: &Arc<Self>) -> AbortOnDropHandle<()> {
        let lanes = self.clone();
        AbortOnDropHandle::new(tokio::spawn(
            async move {
                let mut looks = tokio::time::interval(LOOK_EVERY);
                looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    looks.tick().await;
                    lanes.let_go_unused();
                }
            }
            .in_current_span(),
        ))
    }

    /// Drops the connection of each busy lane unused for [`LET_GO`]. A
    /// read still underway on it keeps its own handle and ends as usual;
    /// the next read on the lane connects again.
    fn let_go_unused(&self) {
        let now = self.now_ms();
        for busy in &self.busy {
            let last = busy.last_read.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= LET_GO.as_millis() as u64 {
                busy.conn.reset();
            }
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deadpool_redis::redis;
    use peerq_test_support as support;

    /// Clients connected to the server of `probe`, `probe` not counted.
    async fn others(probe: &mut redis::aio::MultiplexedConnection) -> usize {
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(probe)
            .await
            .unwrap();
        list.lines().count() - 1
    }

    #[tokio::test]
    async fn busy_lanes_connect_on_their_first_read_and_are_let_go_after_the_last() {
        let server = support::RedisServer::start();
        let mut probe = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let conn = Arc::new(SharedConnection::new(server.pool()));
        let lanes = Arc::new(Lanes::new(conn));
        let _let_go = lanes.spawn_let_go();
        let ping = redis::cmd("PING");
        // Fetch loops take the lanes in turn, every one of them.
        let taken: Vec<usize> = (0..8).map(|_| lanes.take()).collect();
        assert_eq!(taken, [0, 1, 2, 3, 0, 1, 2, 3]);
        for lane in 0..LANES {
            let _: String = lanes.conn(lane).query(&ping).await.unwrap();
        }
        assert_eq!(others(&mut probe).await, 4, "a connection per lane");
        // Reads keep going out on lane 3 only: lane 2 is let go, lane 3
        // (the same connection all along) and the shared ones stay.
        let id = redis::cmd("CLIENT").arg("ID").clone();
        let lane_3: u64 = lanes.conn(3).query(&id).await.unwrap();
        let until = Instant::now() + LET_GO + 2 * LOOK_EVERY;
        while Instant::now() < until {
            let _: String = lanes.conn(3).query(&ping).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(others(&mut probe).await, 3, "lane 2 let go, lane 3 kept");
        let still: u64 = lanes.conn(3).query(&id).await.unwrap();
        assert_eq!(still, lane_3, "lane 3 was let go while in use");
        // No reads at all: the shared connections stay.
        tokio::time::sleep(LET_GO + 2 * LOOK_EVERY).await;
        assert_eq!(others(&mut probe).await, 2, "only the shared connections");
        // A read on a lane let go connects it again.
        let _: String = lanes.conn(2).query(&ping).await.unwrap();
        assert_eq!(others(&mut probe).await, 3);
    }
}
