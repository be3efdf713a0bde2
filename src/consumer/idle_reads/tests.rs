//! The idle read's waits: each ends when what blocked the read is gone,
//! also when it went between the look and the wait. Against a real
//! redis-server (the pause gate opens on its first read of the service's
//! pause key), started by the integration tests' harness.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;

use super::wait::{Blocked, by_lease};
use super::*;
use crate::clock::{Clock, SystemClock};
use crate::config::ServiceName;
use crate::gate;
use crate::instance::InstanceId;
use peerq_test_support as support;

/// Longer than any wait that is to end at once, on a loaded machine.
const PATIENCE: Duration = Duration::from_secs(2);

#[test]
fn a_lease_too_short_to_read_in_still_lets_the_wait_end() {
    // 20.5 ms left: too little for a read that must end 20 ms before
    // the lease and block at least 1 ms. `wait_for_change` then sleeps
    // for the margin (its lease is valid, `by_lease` says no), rather
    // than wait for a request that may never come.
    let lease = Lease::new(Arc::new(SystemClock));
    lease.grant(SystemClock.now() + Duration::from_micros(20_500));
    assert!(by_lease(&lease).is_none());
    assert!(lease.valid());
    lease.grant(SystemClock.now() + Duration::from_millis(500));
    let wait = by_lease(&lease).expect("time to read");
    assert!(
        wait <= Duration::from_millis(480) && wait >= super::wait::MIN_BLOCK,
        "{wait:?}"
    );
}

/// An idle read with one partition in it, as an instance whose every
/// partition waits there: no fetch loop reads for itself, so no request
/// comes unless a partition moves. The gate is open; room for one task;
/// no lease until a test grants it.
struct OnePartition {
    reader: IdleReader,
    room: Arc<Room>,
    lease: Lease,
    _server: support::RedisServer,
    _gate: AbortOnDropHandle<()>,
    _requests: mpsc::UnboundedSender<Request>,
    _delivered: mpsc::UnboundedReceiver<Delivery>,
}

impl OnePartition {
    async fn start() -> OnePartition {
        let server = support::RedisServer::start();
        let conn = Arc::new(SharedConnection::new(server.pool()));
        let name = ServiceName::new(&support::unique_name("idle")).unwrap();
        let (gate, watcher) = gate::watch(name.clone(), conn.clone(), Duration::from_millis(10));
        tokio::time::timeout(PATIENCE, gate.opened())
            .await
            .expect("the gate opens: the service is not paused");
        let lease = Lease::new(Arc::new(SystemClock));
        let room = Arc::new(Room::new(1, false));
        let setup = Setup {
            backend: conn.backend().clone(),
            conn: conn.clone(),
            lease: lease.clone(),
            gate,
            room: room.clone(),
            order: Order::Concurrent,
            batch: 64,
            block: Duration::from_secs(1),
        };
        let (requests, received) = mpsc::unbounded_channel();
        let mut reader = IdleReader::new(setup, None, received);
        let store = PartitionStore::new(conn, &name, 0, 1, &InstanceId::generate(), 1 << 20);
        let (mailbox, delivered) = mpsc::unbounded_channel();
        reader.apply(Request::Join {
            store: Arc::new(store),
            held: Held::default(),
            mailbox,
        });
        OnePartition {
            reader,
            room,
            lease,
            _server: server,
            _gate: watcher,
            _requests: requests,
            _delivered: delivered,
        }
    }

    /// A lease for long enough.
    fn grant(&self) {
        self.lease
            .grant(SystemClock.now() + Duration::from_secs(10));
    }

    /// The look finds the read blocked by `cause`.
    fn look(&self, cause: Blocked) -> Blocked {
        let blocked = self.reader.ready().expect_err("blocked, no read");
        assert_eq!(blocked, cause);
        blocked
    }

    /// Whether the wait for the end of `blocked` ends within [`PATIENCE`].
    async fn wait_ends(&mut self, blocked: Blocked) -> bool {
        tokio::time::timeout(PATIENCE, self.reader.wait_for_change(blocked))
            .await
            .is_ok_and(|open| open)
    }

    /// The wait for the end of `blocked`, whose cause went before the wait
    /// began, ends, and a read may start: else `missed`.
    async fn reads_after_the_wait(&mut self, blocked: Blocked, missed: &str) {
        assert!(self.wait_ends(blocked).await, "{missed}");
        assert!(self.reader.ready().is_ok(), "it reads now");
    }
}

#[tokio::test]
async fn room_freed_between_the_look_and_the_wait_ends_the_wait() {
    let mut idle = OnePartition::start().await;
    idle.grant();
    let task = idle.room.run(crate::priority::Priority::Normal).await;
    let blocked = idle.look(Blocked::NoRoom);
    // No busy loop: the wait lasts while the room is taken.
    let waited = tokio::time::timeout(
        Duration::from_millis(200),
        idle.reader.wait_for_change(blocked),
    )
    .await;
    assert!(waited.is_err(), "it waits while the room is taken");
    // The task ends after the look and before the next wait (in a
    // consumer, a handler on another worker thread: as the instance fills
    // up, room comes and goes between any two looks).
    drop(task);
    let missed = "the wait missed the room freed before it began: the idle read stops for good";
    idle.reads_after_the_wait(blocked, missed).await;
}

#[tokio::test]
async fn a_lease_granted_between_the_look_and_the_wait_ends_the_wait() {
    let mut idle = OnePartition::start().await;
    let blocked = idle.look(Blocked::NoLease);
    idle.grant();
    let missed = "the wait missed the lease granted before it began";
    idle.reads_after_the_wait(blocked, missed).await;
}
