//! Options on every task of a batch (`enqueue_batch_with`): keys, delays and
//! idempotency keys, in one batch of several parts, against a real
//! redis-server, with a consumer running: keyed tasks land in their key's
//! partition in the batch's order, a delayed one runs no earlier than its
//! delay, a repeated idempotency key enqueues once and returns the first
//! id, and a script Redis forgot (`SCRIPT FLUSH`) is loaded again.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use peerq::handler::Task;
use peerq::producer::Options;
use peerq::{Consumer, HandlerError};
use tokio_util::sync::CancellationToken;

use super::*;

const P: u32 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_with_options_places_delays_and_deduplicates_each_task() {
    support::init_tracing();
    let server = RedisServer::start();
    let name = unique_name("batch-options");
    // Each seq's starts.
    let started: Arc<Mutex<BTreeMap<u64, Vec<Instant>>>> = Arc::default();
    let runs = started.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let runs = runs.clone();
        async move {
            let mut runs = runs.lock().unwrap();
            runs.entry(task.payload.seq)
                .or_default()
                .push(Instant::now());
            Ok::<(), HandlerError>(())
        }
    });
    let producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(P)
        .connect()
        .await
        .unwrap();
    let job = |seq| Job {
        seq,
        body: "a mail body".into(),
    };

    // 300 tasks (three parts): every third keyed `k<seq % 4>`, every
    // tenth delayed 1.5 s, seqs 200..210 with idempotency keys `once-<seq>`.
    let mut tasks = Vec::new();
    for seq in 0..300u64 {
        let mut options = Options::new();
        if seq % 3 == 0 {
            options = options.key(format!("k{}", seq % 4));
        }
        if seq % 10 == 5 {
            options = options.delay(Duration::from_millis(1500));
        }
        if (200..210).contains(&seq) {
            options = options.idempotency_key(format!("once-{seq}"));
        }
        tasks.push((job(seq), options));
    }
    let sent_at = Instant::now();
    let ids = producer.enqueue_batch_with(&tasks).await.unwrap();
    assert_eq!(ids.len(), 300);

    // Keyed tasks are in their key's partition, in the batch's order
    // (before any consumer reads them).
    let mut conn = server.pool().get().await.unwrap();
    for k in 0..4 {
        let key = format!("k{k}");
        let p = partition_of(key.as_bytes(), P);
        let keyed: Vec<u64> = entries(&mut conn, &name, p)
            .await
            .iter()
            .filter(|f| f.get("key").map(Vec::as_slice) == Some(key.as_bytes()))
            .map(|f| Bincode.decode::<Job>(&f["payload"]).unwrap().seq)
            .collect();
        let want: Vec<u64> = (0..300)
            .filter(|s| s % 3 == 0 && s % 4 == k && s % 10 != 5)
            .collect();
        assert_eq!(keyed, want, "key {key}");
    }

    // The same tasks with the same options again (an idempotency key's
    // record is in the task's partition), in a second batch, after Redis
    // forgot its scripts: nothing enqueued, the first ids returned.
    let mut raw = server.connection().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut raw)
        .await
        .unwrap();
    let again = tasks[200..210].to_vec();
    let repeated = producer.enqueue_batch_with(&again).await.unwrap();
    assert_eq!(repeated, ids[200..210].to_vec(), "the first tasks' ids");

    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(P)
        .service(service)
        .run_until(stop.clone().cancelled_owned());
    let consumer = tokio::spawn(consumer);
    let deadline = Instant::now() + Duration::from_secs(20);
    while started.lock().unwrap().len() < 300 {
        let ran = started.lock().unwrap().len();
        assert!(Instant::now() < deadline, "{ran} of 300 ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = started.lock().unwrap().clone();
    for (seq, starts) in &started {
        assert_eq!(starts.len(), 1, "seq {seq} ran {} times", starts.len());
        if seq % 10 == 5 {
            let after = starts[0] - sent_at;
            assert!(
                after >= Duration::from_millis(1400),
                "seq {seq} ran after {after:?}"
            );
        }
    }
    stop.cancel();
    consumer.await.unwrap().unwrap();
}
