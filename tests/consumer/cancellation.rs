//! The contract of an interrupted run, against a real redis-server: a run
//! whose stop signal (`TaskContext::cancelled`) fired before it returned
//! runs again with `attempt + 1` whatever it returned, unless the handler
//! said its effect was done with `TaskContext::finished`. (That it spends
//! none of `max_attempts`: `tests/consumer/attempts.rs`.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

const P: u32 = 4;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
    /// Whether the handler says it finished after its run was interrupted.
    says_finished: bool,
}

/// Runs of each seq: (instance label, attempt).
type Runs = Arc<Mutex<BTreeMap<u64, Vec<(&'static str, u32)>>>>;

fn start(
    url: &str,
    name: &str,
    label: &'static str,
    runs: &Runs,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<peerq::Result<()>>,
) {
    support::init_tracing();
    let runs = runs.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let runs = runs.clone();
        async move {
            let cx = task.cx;
            runs.lock()
                .unwrap()
                .entry(task.payload.seq)
                .or_default()
                .push((label, cx.attempt()));
            if cx.attempt() == 1 && task.payload.seq == 3 {
                // Its effect is done; then it hangs past the interrupted
                // run's grace and is dropped.
                cx.finished();
                tokio::time::sleep(Duration::from_secs(30)).await;
            } else if cx.attempt() == 1 {
                // Runs until the drain timeout interrupts it, then gives up
                // with Ok(()), as a handler that ignores errors might.
                cx.cancelled().await;
                if task.payload.says_finished {
                    cx.finished();
                }
            }
            Ok::<(), HandlerError>(())
        }
    });
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .drain_timeout(Duration::from_millis(300))
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    (stop, task)
}

/// A producer for the service `name` on `url`, with the tests' partitions.
async fn producer(url: &str, name: &str) -> Producer {
    Producer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_run_that_returns_ok_runs_again_unless_it_said_it_finished() {
    let server = RedisServer::start();
    let name = unique_name("cancelled-ok");
    let runs: Runs = Arc::default();
    let (stop_a, a) = start(&server.url(), &name, "a", &runs);
    let producer = producer(&server.url(), &name).await;
    for (seq, says_finished) in [(1, false), (2, true), (3, true)] {
        let job = Job { seq, says_finished };
        producer
            .enqueue_with(job, Options::new().key(format!("k{seq}")))
            .await
            .unwrap();
    }
    wait_until(Duration::from_secs(15), "the tasks start on a", || {
        runs.lock().unwrap().len() == 3
    })
    .await;
    // b joins and a leaves: every partition moves to b, and a's running
    // tasks are interrupted at the drain timeout.
    let (stop_b, b) = start(&server.url(), &name, "b", &runs);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop_a.cancel();
    a.await.unwrap().unwrap();
    wait_until(Duration::from_secs(15), "the unfinished run again", || {
        runs.lock().unwrap()[&1].len() == 2
    })
    .await;
    // Time for a wrong re-run of the finished one to show.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop_b.cancel();
    b.await.unwrap().unwrap();
    let runs = runs.lock().unwrap().clone();
    println!("runs: {runs:?}");
    assert_eq!(
        runs[&1],
        vec![("a", 1), ("b", 2)],
        "returned Ok after it was interrupted without saying it finished: runs again"
    );
    assert_eq!(runs[&2], vec![("a", 1)], "said it finished: runs once");
    assert_eq!(
        runs[&3],
        vec![("a", 1)],
        "said it finished, then was dropped after the grace: runs once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_draining_during_a_graceful_leave_still_owns_its_partition() {
    support::init_tracing();
    let server = RedisServer::start();
    let name = unique_name("leave-owned");
    let left = Arc::new(tokio::sync::Notify::new());
    // (attempt, still_owned once the instance has left) per run.
    let checks: Arc<Mutex<Vec<(u32, bool)>>> = Arc::default();
    let (l, c) = (left.clone(), checks.clone());
    let service = tower::service_fn(move |task: Task<Job>| {
        let (left, checks) = (l.clone(), c.clone());
        async move {
            let cx = task.cx;
            // Still running when the instance has left and its partitions
            // drain (the drain timeout is 450 ms).
            left.notified().await;
            checks
                .lock()
                .unwrap()
                .push((cx.attempt(), cx.still_owned()));
            Ok::<(), HandlerError>(())
        }
    });
    let builder = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(P)
        .drain_timeout(Duration::from_millis(450))
        .service(service);
    let mut events = builder.partition_events();
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    let producer = producer(&server.url(), &name).await;
    let job = Job {
        seq: 1,
        says_finished: false,
    };
    producer.enqueue(&job).await.unwrap();
    // Started: the handler waits for `left`.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.cancel();
    // Its partitions are released once it has left, and then its lease is
    // revoked: the task's partition drains (450 ms) with no lease.
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut stopped = 0;
        while stopped < P {
            let event = events.recv().await.unwrap();
            if event.change == peerq::consumer::PartitionChange::Stopped {
                stopped += 1;
            }
        }
    })
    .await
    .expect("the instance leaves and releases its partitions");
    tokio::time::sleep(Duration::from_millis(50)).await;
    left.notify_one();
    consumer.await.unwrap().unwrap();
    let checks = checks.lock().unwrap().clone();
    println!("(attempt, still_owned while draining the leave): {checks:?}");
    assert_eq!(
        checks,
        vec![(1, true)],
        "its partition drains: the task may still act, and ran once"
    );
}
