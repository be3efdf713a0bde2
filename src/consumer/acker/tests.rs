//! The acker's batching of acks, without Redis round trips.

use super::*;
use crate::instance::InstanceId;
use peerq_test_support as support;

/// An ack of `n` ids of partition `p` (never sent: the store's
/// connection is only made on first use).
fn ack(server: &support::RedisServer, p: u32, n: usize, released: bool) -> Ack {
    let conn = Arc::new(SharedConnection::new(server.pool()));
    let name = ServiceName::new("acker-test").unwrap();
    let store = PartitionStore::new(conn, &name, p, 1, &InstanceId::generate(), 1 << 20);
    let token = CancellationToken::new();
    if released {
        token.cancel();
    }
    let ids = (0..n).map(|i| format!("1-{i}")).collect();
    let (reply, _) = mpsc::unbounded_channel();
    Ack::new(Arc::new(store), token, ids, None, reply)
}

fn partitions(batch: &[Ack]) -> Vec<u32> {
    batch.iter().map(|ack| ack.store.partition()).collect()
}

#[test]
fn a_batch_holds_at_most_max_batch_ids_or_one_larger_ack_and_released_ones_go_first() {
    let server = support::RedisServer::start();
    let mut queue = Queue::default();
    for (p, n, released) in [(0, 3000, false), (1, 1000, false), (2, 97, false)] {
        queue.push(ack(&server, p, n, released));
    }
    queue.push(ack(&server, 3, 5000, false));
    queue.push(ack(&server, 4, 100, true));
    // The released partition's ack first; then the oldest while they
    // fit under MAX_BATCH ids.
    assert_eq!(partitions(&queue.next_batch()), [4, 0]);
    assert_eq!(partitions(&queue.next_batch()), [1, 2]);
    // Larger than MAX_BATCH alone: sent alone, not held back forever.
    assert_eq!(partitions(&queue.next_batch()), [3]);
    assert!(queue.is_empty());
}
