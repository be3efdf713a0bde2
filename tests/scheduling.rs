//! Scheduling (DESIGN.md §6) against a real redis-server: delayed tasks run
//! once, when due, also when their partition changes owner meanwhile.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);
const P: u32 = 8;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// When each seq ran, by the system clock.
type Runs = Arc<Mutex<BTreeMap<u64, Vec<SystemTime>>>>;

fn consumer(
    url: &str,
    name: &str,
    runs: &Runs,
) -> (CancellationToken, JoinHandle<peerq::Result<()>>) {
    support::init_tracing();
    let r = runs.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let r = r.clone();
        async move {
            r.lock()
                .unwrap()
                .entry(task.payload.seq)
                .or_default()
                .push(SystemTime::now());
            Ok::<(), HandlerError>(())
        }
    });
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    (stop, task)
}

async fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(20 * MS).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_tasks_run_once_when_due_also_across_a_handover() {
    let server = RedisServer::start();
    let name = unique_name("delayed");
    let runs: Runs = Arc::default();
    let (stop_a, a) = consumer(&server.url(), &name, &runs);
    let producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(P)
        .connect()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;

    // 40 tasks due 0.5 to 4.4 s from now (a tenth by `at`, the rest by
    // `delay`), spread over the partitions.
    let mut due = BTreeMap::new();
    for seq in 0..40u64 {
        let wait = Duration::from_millis(500 + 100 * seq);
        let options = if seq % 10 == 0 {
            Options::new().at(SystemTime::now() + wait)
        } else {
            Options::new().delay(wait)
        };
        due.insert(seq, SystemTime::now() + wait);
        producer.enqueue_with(Job { seq }, options).await.unwrap();
    }
    // Meanwhile a second instance joins: about half the partitions, and
    // their delayed tasks, move to it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (stop_b, b) = consumer(&server.url(), &name, &runs);
    wait_until(Duration::from_secs(15), "every delayed task", || {
        runs.lock().unwrap().len() == 40
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let runs = runs.lock().unwrap().clone();
    let mut late = Vec::new();
    for (seq, times) in &runs {
        assert_eq!(times.len(), 1, "seq {seq} ran {} times", times.len());
        let due = due[seq];
        // Due by Redis's clock (the same machine's); 10 ms for rounding.
        assert!(
            times[0] + 10 * MS >= due,
            "seq {seq} ran {:?} early",
            due.duration_since(times[0]).unwrap()
        );
        late.push(times[0].duration_since(due).unwrap_or_default());
    }
    late.sort();
    println!(
        "delayed tasks ran after their due time: p50 {:?}, max {:?}",
        late[late.len() / 2],
        late[late.len() - 1]
    );
    assert!(*late.last().unwrap() < Duration::from_millis(2500));
    stop_a.cancel();
    stop_b.cancel();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
}
