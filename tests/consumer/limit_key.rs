//! Concurrency per key by a function of the task (docs/design.md §15,
//! `ConsumerBuilder::limit_key`) with in-process instances: a customer id
//! inside the task, whatever the partition, runs at most `n` at once across
//! three instances (through a graceful leave) while the other customers
//! start at once; units a holder stopped keeping lapse, so nothing stays
//! stuck; and what cannot work is refused by name.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::{Consumer, Error, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

use crate::Instance;
use crate::per_key::{Runs, most_at_once};

const P: u32 = 8;
/// Tasks of one customer that may run at once.
const N: u32 = 2;
const WORK: Duration = Duration::from_millis(30);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    customer: String,
    seq: u64,
}

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
                .push((job.customer, job.seq, started, Instant::now()));
            Ok(())
        }
    }));
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .interval(Duration::from_millis(500))
        .drain_timeout(Duration::from_millis(200))
        .service(service)
        .concurrency_per_key(N)
        .limit_key(|job: &Job| Some(job.customer.clone()));
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    Instance { stop, task }
}

/// A handler that does nothing.
fn noop() -> JobService {
    JobService::new(tower::service_fn(|_: Task<Job>| async { Ok(()) }))
}

async fn producer(server: &RedisServer, name: &str) -> Producer {
    Producer::builder()
        .name(name)
        .redis(server.url())
        .partitions(P)
        .connect()
        .await
        .unwrap()
}

fn jobs(customer: &str, seqs: std::ops::Range<u64>) -> Vec<Job> {
    seqs.map(|seq| Job {
        customer: customer.to_owned(),
        seq,
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_from_the_task_runs_at_most_n_at_once_across_instances_and_others_start_at_once() {
    let server = RedisServer::start();
    let name = unique_name("limit-key");
    let runs: Runs = Arc::default();
    let mut instances: Vec<Instance> = (0..3)
        .map(|_| instance(&server.url(), &name, &runs))
        .collect();
    let producer = producer(&server, &name).await;
    // Every instance owns partitions before the flood.
    producer.enqueue_batch(&jobs("warm", 0..40)).await.unwrap();
    wait_until(Duration::from_secs(10), "the warm-up", || {
        runs.lock().unwrap().len() >= 40
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // One customer floods (no partition key: its tasks spread over every
    // partition and so every instance): 200 tasks, 2 at a time, 30 ms
    // each, 3 s.
    producer
        .enqueue_batch(&jobs("flood", 0..200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Twenty others trickle in meanwhile.
    let mut enqueued: HashMap<u64, Instant> = HashMap::new();
    for round in 0..5u64 {
        for k in 0..20u64 {
            let seq = 1_000 + round * 100 + k;
            enqueued.insert(seq, Instant::now());
            let job = Job {
                customer: format!("c{k}"),
                seq,
            };
            producer.enqueue(job).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A graceful leave while the flood runs.
    instances.remove(0).leave().await;
    let total = 40 + 200 + enqueued.len();
    wait_until(Duration::from_secs(30), "every task", || {
        runs.lock().unwrap().len() >= total
    })
    .await;
    for instance in instances {
        instance.leave().await;
    }
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), total, "each task once");
    let most = most_at_once(&runs);
    println!(
        "most at once per customer: flood {}, others {:?}",
        most["flood"],
        most.iter()
            .filter(|(k, _)| k.starts_with('c'))
            .map(|(_, m)| *m)
            .max()
    );
    for (customer, at_once) in &most {
        assert!(*at_once <= N as usize, "{customer}: {at_once} at once");
    }
    assert_eq!(most["flood"], N as usize, "the flood ran {N} at a time");
    let flood_end = runs
        .iter()
        .filter(|r| r.0 == "flood")
        .map(|r| r.3)
        .max()
        .unwrap();
    let mut late = Vec::new();
    for (customer, seq, started, _) in runs.iter().filter(|r| r.1 >= 1_000) {
        let waited = *started - enqueued[seq];
        if waited >= Duration::from_secs(1) {
            late.push((customer.clone(), *seq, waited));
        }
    }
    assert!(late.is_empty(), "customers held up by the flood: {late:?}");
    let last_other = runs
        .iter()
        .filter(|r| r.1 >= 1_000)
        .map(|r| r.2)
        .max()
        .unwrap();
    assert!(
        last_other < flood_end,
        "the flood was over before the others ran"
    );
    // Every unit went back: no key's set is left.
    let mut conn = server.pool().get().await.unwrap();
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{name}}}:units:*"))
        .query_async(&mut *conn)
        .await
        .unwrap();
    assert!(left.is_empty(), "units left: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_a_holder_stopped_keeping_lapse() {
    let server = RedisServer::start();
    let name = unique_name("limit-key-lapse");
    // A holder that is gone (killed, frozen) left both units of `stuck`,
    // kept until a second from now.
    let mut conn = server.pool().get().await.unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut *conn).await.unwrap();
    let lapse_ms = secs * 1000 + micros / 1000 + 1_000;
    // Its field: two units, none short, lapsing then.
    let _: () = redis::cmd("HSET")
        .arg(format!("{{{name}}}:units:stuck"))
        .arg("gone-1")
        .arg(format!("2 0 {lapse_ms}"))
        .query_async(&mut *conn)
        .await
        .unwrap();
    let runs: Runs = Arc::default();
    let a = instance(&server.url(), &name, &runs);
    let producer = producer(&server, &name).await;
    producer.enqueue_batch(&jobs("free", 0..2)).await.unwrap();
    wait_until(Duration::from_secs(10), "a free customer's tasks", || {
        runs.lock().unwrap().len() >= 2
    })
    .await;
    producer
        .enqueue_batch(&jobs("stuck", 10..12))
        .await
        .unwrap();
    wait_until(
        Duration::from_secs(10),
        "the stuck customer's tasks",
        || runs.lock().unwrap().len() >= 4,
    )
    .await;
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut *conn).await.unwrap();
    let now_ms = secs * 1000 + micros / 1000;
    assert!(
        now_ms >= lapse_ms,
        "a task of the stuck key started before its units lapsed"
    );
    a.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_key_is_service_wide_and_takes_the_handlers_task_type() {
    let server = RedisServer::start();
    let name = unique_name("limit-key-refused");
    let runs: Runs = Arc::default();
    let a = instance(&server.url(), &name, &runs);
    let producer = producer(&server, &name).await;
    producer.enqueue_batch(&jobs("c", 0..1)).await.unwrap();
    wait_until(Duration::from_secs(10), "the first instance", || {
        !runs.lock().unwrap().is_empty()
    })
    .await;
    // Without the function, another instance would count elsewhere.
    let without = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(P)
        .interval(Duration::from_millis(500))
        .drain_timeout(Duration::from_millis(200))
        .service(noop())
        .run_until(std::future::ready(()))
        .await
        .unwrap_err();
    assert!(
        matches!(&without, Error::SettingsMismatch(m) if m.to_string().contains("limit_key")),
        "{without}"
    );
    // Given before the handler, the function takes another task type.
    let before = Consumer::builder()
        .name(unique_name("limit-key-order"))
        .redis(server.url())
        .limit_key(|_: &()| None)
        .service(noop())
        .run_until(std::future::ready(()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &before,
            Error::InvalidSetting {
                setting: "limit_key",
                ..
            }
        ),
        "{before}"
    );
    a.leave().await;
}
