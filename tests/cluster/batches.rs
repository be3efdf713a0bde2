//! Batches on the shared Cluster (docs/design.md §19): members spread over
//! every master end in their partitions' slots, their completion records
//! are forwarded to batches whose homes are on every master too, and each
//! batch's callback runs once with its counts, with two instances.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::handler::Task;
use peerq::workflow::BatchSummary;
use peerq::{Consumer, HandlerError, Redis};
use support::{RedisCluster, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

use super::{Job, producer};

const BATCHES: u64 = 30;
const SIZE: u64 = 20;

/// A callback's seq: far above the members'.
fn callback_seq(b: u64) -> u64 {
    u64::MAX - b
}

/// Members whose seq is 4 mod 5 die.
fn dies(seq: u64) -> bool {
    seq % 5 == 4
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_run_once_with_their_counts_over_every_master() {
    support::init_tracing();
    let cluster = RedisCluster::shared();
    let name = unique_name("cluster-batch");
    let callbacks: Arc<Mutex<BTreeMap<u64, Vec<BatchSummary>>>> = Arc::default();
    let members: Arc<Mutex<BTreeMap<u64, usize>>> = Arc::default();
    let instances: Vec<_> = (0..2)
        .map(|_| {
            let (callbacks, members) = (callbacks.clone(), members.clone());
            let service = tower::service_fn(move |task: Task<Job>| {
                let (callbacks, members) = (callbacks.clone(), members.clone());
                async move {
                    let seq = task.payload.seq;
                    if let Some(summary) = task.cx.batch_summary() {
                        let b = u64::MAX - seq;
                        callbacks
                            .lock()
                            .unwrap()
                            .entry(b)
                            .or_default()
                            .push(summary.clone());
                        return Ok(());
                    }
                    *members.lock().unwrap().entry(seq).or_default() += 1;
                    match dies(seq) {
                        true => Err(HandlerError::msg("no such mailbox").permanent()),
                        false => Ok(()),
                    }
                }
            });
            let stop = CancellationToken::new();
            let run = Consumer::builder()
                .redis(Redis::cluster(cluster.seed_urls()))
                .name(&name)
                .service(service)
                .run_until(stop.clone().cancelled_owned());
            (stop, tokio::spawn(run))
        })
        .collect();
    let producer = producer(cluster, &name).await;
    let mut homes = BTreeSet::new();
    for b in 0..BATCHES {
        let jobs: Vec<Job> = (b * SIZE..(b + 1) * SIZE).map(|seq| Job { seq }).collect();
        let batch = producer.batch().callback(&Job {
            seq: callback_seq(b),
        });
        let id = batch.enqueue(&jobs).await.unwrap();
        let stream = format!("{{{name}/{}}}:stream", id.home());
        homes.insert(cluster.master_of_key(&stream).port);
    }
    assert_eq!(homes.len(), 3, "batch homes only on {homes:?}");
    wait_until(Duration::from_secs(30), "every callback", || {
        callbacks.lock().unwrap().len() == BATCHES as usize
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (b, runs) in callbacks.lock().unwrap().iter() {
        assert_eq!(runs.len(), 1, "batch {b}");
        let dead = (b * SIZE..(b + 1) * SIZE).filter(|s| dies(*s)).count() as u64;
        let s = &runs[0];
        assert_eq!(
            (s.total, s.succeeded, s.dead),
            (SIZE, SIZE - dead, dead),
            "batch {b}"
        );
        assert_eq!(s.dead_ids.len() as u64, dead);
    }
    let ran = members.lock().unwrap().clone();
    assert_eq!(ran.len(), (BATCHES * SIZE) as usize);
    assert!(ran.values().all(|n| *n == 1), "a member ran twice");
    for (stop, run) in instances {
        stop.cancel();
        run.await.unwrap().unwrap();
    }
}
