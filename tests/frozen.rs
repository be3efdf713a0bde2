//! An instance frozen past its lease (a GC pause, SIGSTOP, a VM stall),
//! against a real redis-server: its open blocking reads end with its lease,
//! so nothing enqueued after the next owner took over is delivered to it;
//! and once it resumes, `TaskContext::still_owned` says no at once.
//!
//! The frozen instance runs on a runtime of its own thread, which the test
//! blocks: the process goes on, only that instance stands still, as under a
//! freeze.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

const P: u32 = 4;
const MS: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Runs of each seq: (instance label, when).
type Runs = Arc<Mutex<BTreeMap<u64, Vec<(&'static str, Instant)>>>>;

fn service(
    label: &'static str,
    runs: &Runs,
) -> impl tower::Service<
    Task<Job>,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Clone
+ Send
+ Sync
+ 'static {
    let runs = runs.clone();
    tower::service_fn(move |task: Task<Job>| {
        let runs = runs.clone();
        async move {
            runs.lock()
                .unwrap()
                .entry(task.payload.seq)
                .or_default()
                .push((label, Instant::now()));
            Ok::<(), HandlerError>(())
        }
    })
}

fn builder(
    url: &str,
    name: &str,
) -> peerq::consumer::ConsumerBuilder<(), (), peerq::codec::Bincode> {
    support::init_tracing();
    Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .interval(Duration::from_secs(1))
        .drain_timeout(300 * MS)
}

/// A consumer on a current-thread runtime of its own thread, which
/// [`Frozen::freeze`] blocks.
struct Frozen {
    handle: tokio::runtime::Handle,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<peerq::Result<()>>>,
}

impl Frozen {
    fn start<F>(run: impl FnOnce(CancellationToken) -> F + Send + 'static) -> Frozen
    where
        F: Future<Output = peerq::Result<()>>,
    {
        let stop = CancellationToken::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let signal = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            tx.send(rt.handle().clone()).unwrap();
            rt.block_on(run(signal))
        });
        Frozen {
            handle: rx.recv().unwrap(),
            stop,
            thread: Some(thread),
        }
    }

    /// Blocks the instance's only thread for `d`, from now.
    fn freeze(&self, d: Duration) {
        let (tx, rx) = std::sync::mpsc::channel();
        self.handle.spawn(async move {
            tx.send(()).unwrap();
            std::thread::sleep(d);
        });
        rx.recv().unwrap();
    }

    async fn stop(mut self) {
        self.stop.cancel();
        let thread = self.thread.take().unwrap();
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap()
            .unwrap();
    }
}

/// The ids pending under `consumer` name prefix in any partition of `name`.
async fn pending_under(server: &RedisServer, name: &str) -> BTreeMap<String, usize> {
    let mut conn = server.pool().get().await.unwrap();
    let mut by_consumer = BTreeMap::new();
    for p in 0..P {
        let stream = format!("{{{name}/{p}}}:stream");
        let reply: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
            .arg(&stream)
            .arg("peerq")
            .query_async(&mut *conn)
            .await
            .unwrap();
        if let redis::streams::StreamPendingReply::Data(data) = reply {
            for c in data.consumers {
                *by_consumer.entry(c.name).or_default() += c.pending;
            }
        }
    }
    by_consumer
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
async fn a_frozen_owners_open_read_takes_nothing_enqueued_after_the_takeover() {
    let server = RedisServer::start();
    let name = unique_name("frozen-read");
    let runs: Runs = Arc::default();
    // Reads that may wait 20 s: far past the lease (1.5 s at I = 1 s).
    let a = builder(&server.url(), &name)
        .block(Duration::from_secs(20))
        .service(service("a", &runs));
    let a = Frozen::start(move |stop| a.run_until(stop.cancelled_owned()));
    let producer = producer(&server.url(), &name).await;
    producer.enqueue(&Job { seq: 0 }).await.unwrap();
    wait_until(Duration::from_secs(15), "a runs the first task", || {
        runs.lock().unwrap().contains_key(&0)
    })
    .await;
    // a's reads now wait on every partition. It freezes with them open.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let frozen_for = Duration::from_secs(9);
    let frozen_at = Instant::now();
    a.freeze(frozen_for);
    let b = builder(&server.url(), &name)
        .block(Duration::from_secs(20))
        .service(service("b", &runs));
    let b_events = b.partition_events();
    let stop_b = CancellationToken::new();
    let b = tokio::spawn(b.run_until(stop_b.clone().cancelled_owned()));
    // b takes every partition over at the handover deadline (a writes no
    // marks while frozen).
    let mut started = std::collections::BTreeSet::new();
    let mut b_events = b_events;
    while started.len() < P as usize {
        let event = tokio::time::timeout(Duration::from_secs(10), b_events.recv())
            .await
            .expect("b takes every partition over")
            .unwrap();
        if matches!(
            event.change,
            peerq::consumer::PartitionChange::Started { .. }
        ) {
            started.insert(event.partition);
        }
    }
    let took_over = frozen_at.elapsed();
    // Entries to every partition, while a is still frozen.
    for seq in 1..=16u64 {
        producer
            .enqueue_with(Job { seq }, Options::new().key(format!("k{seq}")))
            .await
            .unwrap();
    }
    wait_until(Duration::from_secs(5), "b runs the new tasks", || {
        let runs = runs.lock().unwrap();
        (1..=16).all(|s| runs.contains_key(&s))
    })
    .await;
    let ran_by_b = frozen_at.elapsed();
    assert!(
        ran_by_b < frozen_for,
        "checked while a was still frozen ({ran_by_b:?})"
    );
    let pending = pending_under(&server, &name).await;
    println!(
        "b took over {took_over:?} into the freeze; every new task ran on b by {ran_by_b:?}; pending: {pending:?}"
    );
    // Let a resume, then stop both.
    tokio::time::sleep(frozen_for.saturating_sub(frozen_at.elapsed()) + Duration::from_millis(500))
        .await;
    a.stop().await;
    stop_b.cancel();
    b.await.unwrap().unwrap();
    let runs = runs.lock().unwrap().clone();
    for seq in 1..=16u64 {
        let who: Vec<_> = runs[&seq].iter().map(|r| r.0).collect();
        assert_eq!(who, vec!["b"], "task {seq} ran once, on b");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_resumes_from_a_freeze_past_its_lease_is_no_longer_owned() {
    let server = RedisServer::start();
    let name = unique_name("frozen-task");
    // (still_owned right when the handler starts, right after it resumes,
    // when it resumed).
    type Checks = Arc<Mutex<Vec<(bool, bool, Instant)>>>;
    let checks: Checks = Arc::default();
    let started = Arc::new(tokio::sync::Notify::new());
    let (c, s) = (checks.clone(), started.clone());
    let handler = tower::service_fn(move |task: Task<Job>| {
        let (checks, started) = (c.clone(), s.clone());
        async move {
            let before = task.cx.still_owned();
            started.notify_one();
            // The freeze lands here; the timer is overdue when the thread
            // runs again, and fires in the same instant as the runtime's.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let after = task.cx.still_owned();
            checks.lock().unwrap().push((before, after, Instant::now()));
            Ok::<(), HandlerError>(())
        }
    });
    let a = builder(&server.url(), &name).service(handler);
    let a = Frozen::start(move |stop| a.run_until(stop.cancelled_owned()));
    let producer = producer(&server.url(), &name).await;
    producer.enqueue(&Job { seq: 0 }).await.unwrap();
    tokio::time::timeout(Duration::from_secs(15), started.notified())
        .await
        .expect("the task starts");
    let frozen_for = Duration::from_secs(3);
    let resumed = Instant::now() + frozen_for;
    a.freeze(frozen_for);
    wait_until(Duration::from_secs(10), "the handler checks again", || {
        !checks.lock().unwrap().is_empty()
    })
    .await;
    a.stop().await;
    let (before, after, at) = checks.lock().unwrap()[0];
    println!("still_owned: {before} before the freeze, {after} right after it");
    assert!(before, "owned while the lease holds");
    assert!(at >= resumed - 50 * MS, "checked after the freeze");
    assert!(!after, "a lease lapsed during the freeze is seen at once");
}
