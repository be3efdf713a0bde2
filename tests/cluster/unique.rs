//! Unique keys on the shared Cluster (docs/design.md §16): the locks live
//! in their partitions' slots on every master, where the enqueue, the
//! promotion of a delayed task, the ack and the dead letter read and write
//! them in their scripts.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::handler::Task;
use peerq::{Consumer, Error, HandlerError, Redis};
use support::{RedisCluster, unique_name};
use tokio_util::sync::CancellationToken;

use super::{Job, Options, producer};

const KEYS: u64 = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_keys_on_every_master_refuse_and_come_free() {
    support::init_tracing();
    let cluster = RedisCluster::shared();
    let name = unique_name("cluster-unique");
    let producer = producer(cluster, &name).await;
    // Every key held by a task delayed 2 s; a second enqueue is refused.
    let later = |k: u64| {
        Options::new()
            .unique(format!("k{k}"))
            .delay(Duration::from_secs(2))
    };
    let mut held = Vec::new();
    for k in 0..KEYS {
        held.push(
            producer
                .enqueue_with(Job { seq: k }, later(k))
                .await
                .unwrap(),
        );
    }
    for k in 0..KEYS {
        match producer.enqueue_with(Job { seq: 100 + k }, later(k)).await {
            Err(Error::Duplicate(refused)) => assert_eq!(refused.existing, held[k as usize]),
            other => panic!("k{k}: {other:?}"),
        }
    }
    // The odd seqs die (a dead letter), the even succeed: either frees.
    let ran: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let seen = ran.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().insert(task.payload.seq);
            match task.payload.seq % 2 {
                0 => Ok(()),
                _ => Err(HandlerError::msg("no such mailbox").permanent()),
            }
        }
    });
    let stop = CancellationToken::new();
    let run = Consumer::builder()
        .redis(Redis::cluster(cluster.seed_urls()))
        .name(&name)
        .service(service)
        .run_until(stop.clone().cancelled_owned());
    let run = tokio::spawn(run);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut free = BTreeSet::new();
    while free.len() < KEYS as usize {
        assert!(
            tokio::time::Instant::now() < deadline,
            "keys still held: {free:?} free of {KEYS}"
        );
        let waiting: Vec<u64> = (0..KEYS).filter(|k| !free.contains(k)).collect();
        for k in waiting {
            let now = Options::new().unique(format!("k{k}"));
            // Seq 200 + 2k succeeds, freeing the key again.
            match producer.enqueue_with(Job { seq: 200 + 2 * k }, now).await {
                Ok(_) => {
                    free.insert(k);
                }
                Err(Error::Duplicate(_)) => {}
                Err(e) => panic!("{e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ran.lock().unwrap().is_superset(&(0..KEYS).collect()));
    assert!(
        ran.lock()
            .unwrap()
            .is_disjoint(&(100..100 + KEYS).collect())
    );
    stop.cancel();
    run.await.unwrap().unwrap();
}
