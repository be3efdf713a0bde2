//! Concurrency per key (docs/design.md §15) with in-process
//! instances: one key floods its partition while twenty others trickle in;
//! no key ever runs more than its limit at once (through a graceful leave),
//! and the other keys' tasks on the flooded partition start within a second
//! of their enqueue; and one instance flooded by one key at `n = 1` holds
//! at most 1,000 of its entries aside, reading no further.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError, partition_of};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

use crate::Instance;

const P: u32 = 4;
/// Tasks of one key that may run at once.
const N: u32 = 2;
const FLOOD: u64 = 300;
const WORK: Duration = Duration::from_millis(40);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    key: String,
    seq: u64,
}

/// Each run: its key and seq, when it started and when it ended.
pub(crate) type Runs = Arc<Mutex<Vec<(String, u64, Instant, Instant)>>>;

type JobService = tower::util::BoxCloneSyncService<Task<Job>, (), HandlerError>;

fn instance(url: &str, name: &str, runs: &Runs) -> Instance {
    support::init_tracing();
    let runs = runs.clone();
    let service = JobService::new(tower::service_fn(move |task: Task<Job>| {
        let runs = runs.clone();
        async move {
            let started = Instant::now();
            tokio::time::sleep(WORK).await;
            let job = task.payload;
            runs.lock()
                .unwrap()
                .push((job.key, job.seq, started, Instant::now()));
            Ok(())
        }
    }));
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .concurrency_per_key(N)
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    Instance { stop, task }
}

/// The most runs of one key at once, from their start and end times.
pub(crate) fn most_at_once(runs: &[(String, u64, Instant, Instant)]) -> BTreeMap<String, usize> {
    let mut events: HashMap<&str, Vec<(Instant, i32)>> = HashMap::new();
    for (key, _, start, end) in runs {
        let e = events.entry(key).or_default();
        e.push((*start, 1));
        e.push((*end, -1));
    }
    events
        .into_iter()
        .map(|(key, mut e)| {
            // An end before a start at the same instant.
            e.sort();
            let (mut now, mut most) = (0i32, 0i32);
            for (_, d) in e {
                now += d;
                most = most.max(now);
            }
            (key.to_owned(), most as usize)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_key_runs_at_most_n_at_once_and_the_other_keys_on_its_partition_start_at_once() {
    let server = RedisServer::start();
    let name = unique_name("per-key");
    let runs: Runs = Arc::default();
    let instances: Vec<Instance> = (0..3)
        .map(|_| instance(&server.url(), &name, &runs))
        .collect();
    let producer = producer(&server, &name, P).await;
    // The three split the partitions first (a task of each partition
    // runs).
    let warm: Vec<(Job, Options)> = (0..40)
        .map(|seq| {
            let key = format!("warm{seq}");
            (
                Job {
                    key: key.clone(),
                    seq,
                },
                Options::new().key(key),
            )
        })
        .collect();
    producer.enqueue_batch_with(&warm).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;

    let flood: Vec<(Job, Options)> = (0..FLOOD)
        .map(|seq| {
            let job = Job {
                key: "flood".into(),
                seq,
            };
            (job, Options::new().key("flood"))
        })
        .collect();
    producer.enqueue_batch_with(&flood).await.unwrap();
    let flooded = partition_of(b"flood", P);
    let keys: Vec<String> = (0..20).map(|k| format!("k{k}")).collect();
    let beside: Vec<&String> = keys
        .iter()
        .filter(|k| partition_of(k.as_bytes(), P) == flooded)
        .collect();
    assert!(
        beside.len() >= 2,
        "keys on the flooded partition: {beside:?}"
    );
    // The other keys trickle in while the flood waits (300 tasks, 2 at a
    // time, 40 ms each: 6 s).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut enqueued: HashMap<u64, Instant> = HashMap::new();
    for round in 0..5u64 {
        for (k, key) in keys.iter().enumerate() {
            let seq = 1_000 + round * 100 + k as u64;
            let job = Job {
                key: key.clone(),
                seq,
            };
            enqueued.insert(seq, Instant::now());
            producer
                .enqueue_with(job, Options::new().key(key.clone()))
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // A graceful leave while the flood runs: its partitions move by
    // drain-then-switch, and no key runs more than N at once across it.
    let mut instances = instances;
    instances.remove(0).leave().await;
    let total = 40 + FLOOD as usize + enqueued.len();
    wait_until(Duration::from_secs(30), "every task", || {
        runs.lock().unwrap().len() >= total
    })
    .await;
    for instance in instances {
        instance.leave().await;
    }

    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), total, "each task once");
    for (key, most) in most_at_once(&runs) {
        assert!(most <= N as usize, "key {key}: {most} at once");
    }
    let flood_most = most_at_once(&runs)["flood"];
    assert_eq!(flood_most, N as usize, "the flood ran {N} at a time");
    // The flood was still running when the last of the others started.
    let flood_end = runs
        .iter()
        .filter(|r| r.0 == "flood")
        .map(|r| r.3)
        .max()
        .unwrap();
    for (key, seq, started, _) in runs.iter().filter(|r| r.1 >= 1_000) {
        let waited = *started - enqueued[seq];
        if beside.contains(&key) {
            assert!(
                waited < Duration::from_secs(1),
                "{key} (seq {seq}) on the flooded partition started {waited:?} after its enqueue"
            );
            assert!(*started < flood_end, "the flood was over before {key} ran");
        }
    }
}

/// A producer of service `name` with `partitions` partitions.
async fn producer(server: &RedisServer, name: &str, partitions: u32) -> Producer {
    Producer::builder()
        .name(name)
        .redis(server.url())
        .partitions(partitions)
        .connect()
        .await
        .unwrap()
}

/// Entries of the one partition delivered and not acked.
async fn pending(server: &RedisServer, name: &str) -> usize {
    let mut conn = server.pool().get().await.unwrap();
    let reply: deadpool_redis::redis::RedisResult<
        deadpool_redis::redis::streams::StreamPendingReply,
    > = deadpool_redis::redis::cmd("XPENDING")
        .arg(format!("{{{name}/0}}:stream"))
        .arg("peerq")
        .query_async(&mut *conn)
        .await;
    reply.map_or(0, |r| r.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_holds_at_most_a_thousand_entries_aside_for_a_flooding_key() {
    let server = RedisServer::start();
    let name = unique_name("per-key-bound");
    let runs: Runs = Arc::default();
    support::init_tracing();
    let recorded = runs.clone();
    let service = JobService::new(tower::service_fn(move |task: Task<Job>| {
        let runs = recorded.clone();
        async move {
            let started = Instant::now();
            tokio::time::sleep(Duration::from_millis(2)).await;
            let job = task.payload;
            runs.lock()
                .unwrap()
                .push((job.key, job.seq, started, Instant::now()));
            Ok(())
        }
    }));
    let stop = CancellationToken::new();
    let run = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(1)
        .concurrency_per_key(1)
        .service(service)
        .run_until(stop.clone().cancelled_owned());
    let instance = Instance {
        stop,
        task: tokio::spawn(run),
    };
    let producer = producer(&server, &name, 1).await;
    let total = 2_000;
    let flood: Vec<(Job, Options)> = (0..total)
        .map(|seq| {
            (
                Job {
                    key: "flood".into(),
                    seq,
                },
                Options::new().key("flood"),
            )
        })
        .collect();
    producer.enqueue_batch_with(&flood).await.unwrap();
    // One at a time, a few ms each: the partition reads past the flood
    // until 1,000 wait aside, and no further; `peerq status` says how many
    // wait (from the members records, written each round).
    let admin = peerq::admin::Admin::connect(server.url()).await.unwrap();
    let (mut most, mut most_shown) = (0, 0);
    let began = Instant::now();
    while runs.lock().unwrap().len() < total as usize {
        most = most.max(pending(&server, &name).await);
        if let Ok(service) = admin.service(&name).await {
            let status = service.status().await.unwrap();
            most_shown = most_shown.max(status.limits.waiting_per_key);
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the flood never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    instance.leave().await;
    assert!(most >= 1_000, "read past the flood up to the bound: {most}");
    // The bound, plus the read that reached it and what runs.
    assert!(most <= 1_000 + 300, "{most} entries read for one key");
    // The entries aside, as the bound allows (with the read that reached
    // it, as above).
    assert!(
        (900..=1_300).contains(&most_shown),
        "status showed at most {most_shown} tasks waiting on a limit per key"
    );
    assert_eq!(most_at_once(&runs.lock().unwrap())["flood"], 1);
}
