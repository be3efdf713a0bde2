//! Rate limits per key across instances (docs/design.md §15), in-process:
//! by a function of the task (`ConsumerBuilder::limit_key` with
//! `rate_limit_per_key`), one customer's tasks, spread over every
//! partition and so every instance, start no faster than the customer's
//! rate across the three, the rate moves to every instance where the
//! customer's tasks wait, and other customers start beside it at theirs;
//! by the partition key, a key's rate holds through the handovers of its
//! partition, with at most one start early for each.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::{Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

use crate::Instance;

const P: u32 = 8;
/// Starts a second of one customer, across the service.
const RATE: u32 = 20;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    customer: String,
    seq: u64,
}

/// Each start: the customer, the instance, when.
type Starts = Arc<Mutex<Vec<(String, usize, Instant)>>>;

/// Instance `me` of service `name`; `by_task`: its limits count by the
/// customer in the task, else by the partition key.
fn instance(url: &str, name: &str, me: usize, starts: &Starts, by_task: bool) -> Instance {
    support::init_tracing();
    let starts = starts.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let starts = starts.clone();
        async move {
            let at = Instant::now();
            starts.lock().unwrap().push((task.payload.customer, me, at));
            Ok::<(), HandlerError>(())
        }
    });
    let stop = CancellationToken::new();
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .interval(Duration::from_millis(500))
        .drain_timeout(Duration::from_millis(200))
        .rate_limit_per_key(RATE, Duration::from_secs(1))
        .service(service);
    let run = if by_task {
        let builder = builder.limit_key(|job: &Job| Some(job.customer.clone()));
        tokio::spawn(builder.run_until(stop.clone().cancelled_owned()))
    } else {
        tokio::spawn(builder.run_until(stop.clone().cancelled_owned()))
    };
    let task = run;
    Instance { stop, task }
}

/// A producer of service `name`, once `n` tasks of the customer `warm`
/// have started.
async fn warmed_up(server: &RedisServer, name: &str, starts: &Starts, n: u64) -> Producer {
    let producer = Producer::builder()
        .name(name)
        .redis(server.url())
        .partitions(P)
        .connect()
        .await
        .unwrap();
    producer.enqueue_batch(&jobs("warm", 0..n)).await.unwrap();
    wait_until(Duration::from_secs(10), "the warm-up", || {
        starts.lock().unwrap().len() as u64 >= n
    })
    .await;
    producer
}

fn jobs(customer: &str, seqs: std::ops::Range<u64>) -> Vec<Job> {
    seqs.map(|seq| Job {
        customer: customer.to_owned(),
        seq,
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_from_the_task_starts_at_its_rate_across_instances_and_others_beside_it() {
    let server = RedisServer::start();
    let name = unique_name("key-rate");
    let starts: Starts = Arc::default();
    let instances: Vec<Instance> = (0..3)
        .map(|i| instance(&server.url(), &name, i, &starts, true))
        .collect();
    // Every instance owns partitions before the flood.
    let producer = warmed_up(&server, &name, &starts, 16).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // One customer floods: 100 tasks with no partition key, so on every
    // partition and instance, 5 s at its rate; four others, 10 each.
    producer
        .enqueue_batch(&jobs("flood", 0..100))
        .await
        .unwrap();
    let others: Vec<Job> = (0..4)
        .flat_map(|k| jobs(&format!("c{k}"), 1_000 * (k + 1)..1_000 * (k + 1) + 10))
        .collect();
    producer.enqueue_batch(&others).await.unwrap();
    let enqueued = Instant::now();
    wait_until(Duration::from_secs(20), "every task", || {
        starts.lock().unwrap().len() >= 16 + 100 + 40
    })
    .await;
    for instance in instances {
        instance.leave().await;
    }
    let starts = starts.lock().unwrap().clone();
    let mut by_customer: BTreeMap<String, Vec<Instant>> = BTreeMap::new();
    let mut flood_on: BTreeMap<usize, usize> = BTreeMap::new();
    for (customer, me, at) in &starts {
        by_customer.entry(customer.clone()).or_default().push(*at);
        if customer == "flood" {
            *flood_on.entry(*me).or_default() += 1;
        }
    }
    for (customer, at) in by_customer.iter_mut().filter(|(c, _)| *c != "warm") {
        // A burst of each instance's share aside (at least a start each).
        assert_at_rate(customer, at, RATE, 3);
    }
    // The flood ran at its rate, not slower: its rate moved to where its
    // tasks waited (every instance has some).
    let flood = &by_customer["flood"];
    let span = (flood[flood.len() - 1] - flood[0]).as_secs_f64();
    assert!(
        span < 100.0 / f64::from(RATE) * 1.6,
        "the flood took {span:.2} s"
    );
    println!("the flood's starts per instance: {flood_on:?}");
    assert!(flood_on.len() >= 2, "the flood ran on one instance only");
    // The others were not held up behind it: each done within about its
    // own 10 tasks' time at the rate.
    for k in 0..4 {
        let at = &by_customer[&format!("c{k}")];
        let last = at[at.len() - 1] - enqueued;
        assert!(
            last < Duration::from_secs(3),
            "c{k} last started after {last:?}"
        );
    }
    // Every share went back: no key's hash is left.
    let mut conn = server.pool().get().await.unwrap();
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{name}}}:rate:*"))
        .query_async(&mut *conn)
        .await
        .unwrap();
    assert!(left.is_empty(), "shares left: {left:?}");
}

/// `at` (sorted here) is no faster than `rate` a second over its whole
/// span, nor over any second, but for `extra` starts.
pub(crate) fn assert_at_rate(what: &str, at: &mut [Instant], rate: u32, extra: usize) {
    at.sort();
    let span = (at[at.len() - 1] - at[0]).as_secs_f64();
    let most = (span * f64::from(rate)).floor() as usize + 1 + extra;
    assert!(
        at.len() <= most,
        "{what}: {} starts in {span:.2} s",
        at.len()
    );
    for (i, first) in at.iter().enumerate() {
        let within = at[i..]
            .iter()
            .filter(|t| **t < *first + Duration::from_secs(1))
            .count();
        assert!(
            within <= rate as usize + extra,
            "{what}: {within} starts in one second"
        );
    }
    println!("{what}: {} starts in {span:.2} s", at.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_keys_rate_holds_through_its_handovers_but_for_a_start_each() {
    let server = RedisServer::start();
    let name = unique_name("key-rate-handover");
    let starts: Starts = Arc::default();
    let a = instance(&server.url(), &name, 0, &starts, false);
    let producer = warmed_up(&server, &name, &starts, 8).await;
    // 120 tasks of one partition key: 6 s at its rate. A second instance
    // joins 1.5 s in, and the first leaves 3.5 s in: the key's partition
    // moves at least once (to the second, at the latest at the leave),
    // each time to an owner that starts from no state of the key.
    let keyed: Vec<(Job, peerq::Options)> = jobs("k", 0..120)
        .into_iter()
        .map(|j| (j, peerq::Options::new().key("k")))
        .collect();
    producer.enqueue_batch_with(&keyed).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let b = instance(&server.url(), &name, 1, &starts, false);
    tokio::time::sleep(Duration::from_secs(2)).await;
    a.leave().await;
    wait_until(Duration::from_secs(20), "every task", || {
        starts.lock().unwrap().len() >= 8 + 120
    })
    .await;
    b.leave().await;
    let starts = starts.lock().unwrap().clone();
    let mut at: Vec<Instant> = starts.iter().filter(|s| s.0 == "k").map(|s| s.2).collect();
    let on: std::collections::BTreeSet<usize> =
        starts.iter().filter(|s| s.0 == "k").map(|s| s.1).collect();
    assert_eq!(on.len(), 2, "the key's partition never moved");
    // Two handovers at most, a start early for each.
    assert_at_rate("k", &mut at, RATE, 2);
}
