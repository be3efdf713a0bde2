//! The consumer and producer against a real redis-server: several
//! instances in one process split a service's partitions by modulo.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis::AsyncCommands;
use peerq::Bincode;
use peerq::consumer::ConsumerBuilder;
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// One run of a task's handler, as the handler saw it.
#[derive(Debug, Clone)]
struct Execution {
    seq: u64,
    partition: u32,
    index: u32,
    replicas: u32,
    epoch: u64,
    attempt: u32,
    /// Which instance ran it (the test's own numbering).
    instance: usize,
}

#[derive(Clone, Default)]
struct Recorder {
    runs: Arc<Mutex<Vec<Execution>>>,
    instance: usize,
}

impl Handler for Recorder {
    type Task = Job;
    async fn handle(&self, job: Job, cx: TaskContext) -> Result<(), HandlerError> {
        self.runs.lock().unwrap().push(Execution {
            seq: job.seq,
            partition: cx.partition(),
            index: cx.index(),
            replicas: cx.replicas(),
            epoch: cx.epoch(),
            attempt: cx.attempt(),
            instance: self.instance,
        });
        Ok(())
    }
}

impl Recorder {
    /// The same record, for another instance.
    fn for_instance(&self, instance: usize) -> Recorder {
        Recorder {
            runs: self.runs.clone(),
            instance,
        }
    }

    fn runs(&self) -> Vec<Execution> {
        self.runs.lock().unwrap().clone()
    }

    fn distinct(&self) -> usize {
        let mut seqs: Vec<u64> = self.runs().iter().map(|e| e.seq).collect();
        seqs.sort_unstable();
        seqs.dedup();
        seqs.len()
    }
}

/// The settings every test starts from. The interval is the default (1 s):
/// shorter ones leave a round too little time on a loaded 2-core machine.
fn base(url: &str, name: &str) -> ConsumerBuilder<(), (), Bincode> {
    support::init_tracing();
    Consumer::builder().name(name).redis(url)
}

/// A consumer instance running in this process until `stop` is cancelled.
struct Instance {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<peerq::Result<()>>,
}

impl Instance {
    fn start(url: &str, name: &str, handler: Recorder) -> Instance {
        let builder = base(url, name).handler(handler);
        Instance::spawn(move |signal| builder.run_until(signal))
    }

    /// Runs `run(signal)` until the instance is shut down.
    fn spawn<F, Fut>(run: F) -> Instance
    where
        F: FnOnce(tokio_util::sync::WaitForCancellationFutureOwned) -> Fut,
        Fut: std::future::Future<Output = peerq::Result<()>> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(stop.clone().cancelled_owned()));
        Instance { stop, task }
    }

    async fn shutdown(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Waits (up to 10 s) until no entry of `name` is pending: the acks, sent
/// in the background, have landed.
async fn wait_nothing_pending(server: &RedisServer, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while pending(server, name, 64).await > 0 {
        assert!(Instant::now() < deadline, "entries still pending");
        tokio::time::sleep(50 * MS).await;
    }
}

/// Every seq in `0..count` ran exactly once.
fn assert_each_once(runs: &[Execution], count: u64, when: &str) {
    let mut per_seq: BTreeMap<u64, usize> = BTreeMap::new();
    for run in runs {
        *per_seq.entry(run.seq).or_default() += 1;
    }
    let twice: Vec<u64> = per_seq
        .iter()
        .filter(|(_, n)| **n != 1)
        .map(|(seq, _)| *seq)
        .take(5)
        .collect();
    // Each run of those, to tell which instances ran them, when and how.
    let runs_twice: Vec<&Execution> = runs.iter().filter(|r| twice.contains(&r.seq)).collect();
    assert!(
        twice.is_empty(),
        "tasks run twice {when}: {twice:?}: {runs_twice:#?}"
    );
    assert_eq!(per_seq.len() as u64, count, "tasks missing {when}");
}

/// Pending entries over all partitions of `name`.
async fn pending(server: &RedisServer, name: &str, partitions: u32) -> usize {
    let mut conn = server.pool().get().await.unwrap();
    let mut total = 0;
    for p in 0..partitions {
        let reply: deadpool_redis::redis::streams::StreamPendingReply = conn
            .xpending(format!("{{{name}/{p}}}:stream"), "peerq")
            .await
            .unwrap();
        total += reply.count();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_tasks_on_three_instances_run_exactly_once_on_their_owners() {
    let server = RedisServer::start();
    let name = unique_name("split");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let jobs: Vec<Job> = (0..10_000).map(|seq| Job { seq }).collect();
    // Half before any consumer exists: they must be delivered too.
    for chunk in jobs[..5_000].chunks(500) {
        producer.enqueue_batch(chunk).await.unwrap();
    }
    let recorder = Recorder::default();
    let instances: Vec<Instance> = (0..3)
        .map(|i| Instance::start(&server.url(), &name, recorder.for_instance(i)))
        .collect();
    for chunk in jobs[5_000..].chunks(500) {
        producer.enqueue_batch(chunk).await.unwrap();
    }
    wait_until(Duration::from_secs(60), "all tasks to run", || {
        recorder.distinct() == 10_000
    })
    .await;
    // Acks are sent in the background; give them a moment.
    wait_nothing_pending(&server, &name).await;
    for instance in instances {
        instance.shutdown().await;
    }

    let runs = recorder.runs();
    for run in &runs {
        // Run by the owner of its partition under the assignment in force.
        assert_eq!(run.partition % run.replicas, run.index - 1, "{run:?}");
        // 1, or 2 for an entry a release cut short left in the old owner's
        // pending list (fetched, never run): the new owner takes it over
        // with attempt + 1, as it cannot know it never ran.
        assert!(run.attempt <= 2, "{run:?}");
    }
    assert_each_once(&runs, 10_000, "on three instances");
    assert_eq!(pending(&server, &name, 64).await, 0);
    assert_one_owner_per_index(&runs);
}

/// Within each epoch, each index was held by one instance only, so the
/// partitions each instance ran were its own.
fn assert_one_owner_per_index(runs: &[Execution]) {
    let mut holders: BTreeMap<(u64, u32), std::collections::BTreeSet<usize>> = BTreeMap::new();
    for run in runs {
        holders
            .entry((run.epoch, run.index))
            .or_default()
            .insert(run.instance);
    }
    for ((epoch, index), instances) in holders {
        assert_eq!(
            instances.len(),
            1,
            "epoch {epoch}: index {index} held by instances {instances:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_and_a_leave_while_tasks_flow_run_every_task_exactly_once() {
    let server = RedisServer::start();
    let name = unique_name("churn");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let recorder = Recorder::default();
    let mut instances: Vec<Instance> = (0..2)
        .map(|i| Instance::start(&server.url(), &name, recorder.for_instance(i)))
        .collect();
    // About 6 s of tasks; an instance joins after 1.5 s and another after
    // 3 s, and the first leaves (gracefully) after 4.5 s.
    for round in 0..60u64 {
        let jobs: Vec<Job> = (round * 100..(round + 1) * 100)
            .map(|seq| Job { seq })
            .collect();
        producer.enqueue_batch(&jobs).await.unwrap();
        match round {
            15 => instances.push(Instance::start(
                &server.url(),
                &name,
                recorder.for_instance(2),
            )),
            30 => instances.push(Instance::start(
                &server.url(),
                &name,
                recorder.for_instance(3),
            )),
            45 => instances.remove(0).shutdown().await,
            _ => {}
        }
        tokio::time::sleep(100 * MS).await;
    }
    wait_until(Duration::from_secs(30), "all tasks to run", || {
        recorder.distinct() == 6_000
    })
    .await;
    wait_nothing_pending(&server, &name).await;
    for instance in instances {
        instance.shutdown().await;
    }
    let runs = recorder.runs();
    for run in &runs {
        assert_eq!(run.partition % run.replicas, run.index - 1, "{run:?}");
    }
    assert_each_once(&runs, 6_000, "through joins and a leave");
    assert_one_owner_per_index(&runs);
    let ran = runs
        .iter()
        .map(|r| r.instance)
        .collect::<std::collections::BTreeSet<_>>();
    assert_eq!(ran.len(), 4, "every instance ran tasks: {ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_different_partition_count_is_refused_by_name() {
    let server = RedisServer::start();
    let name = unique_name("partitions");
    let _producer = Producer::connect(&server.url(), &name).await.unwrap();
    let err = Producer::builder()
        .redis(server.url())
        .name(&name)
        .partitions(32)
        .connect()
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("`partitions` is 32 here but 64"),
        "{err}"
    );
    let err = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(16)
        .handler(Recorder::default())
        .run_until(async {})
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("`partitions` is 16 here but 64"),
        "{err}"
    );
}

/// Asserts that a producer's refusal says each of `parts`, and never to
/// delete the meta of a service that may be running.
fn assert_advises(err: &str, parts: &[&str]) {
    for part in parts {
        assert!(err.contains(part), "{err}");
    }
    assert!(!err.contains("delete"), "advice to delete the meta: {err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_takes_the_services_partitions_and_is_told_how_to_match_its_codec() {
    use peerq::Json;
    let server = RedisServer::start();
    let url = server.url();
    // A service of 16 partitions, recorded by its first consumer.
    let name = unique_name("adopt");
    let first = base(&url, &name)
        .partitions(16)
        .handler(Recorder::default());
    first.run_until(async {}).await.unwrap();
    let producer = Producer::connect(&url, &name).await.unwrap();
    assert_eq!(producer.partitions(), 16, "the service's, not the default");
    let same = Producer::builder().redis(&url).name(&name).partitions(16);
    assert_eq!(same.connect().await.unwrap().partitions(), 16);
    let other = Producer::builder().redis(&url).name(&name).partitions(32);
    let err = other.connect().await.unwrap_err().to_string();
    assert_advises(
        &err,
        &[
            "`partitions` is 32 here but 16 for the service",
            "Leave `partitions` unset on a producer",
        ],
    );
    // Every task reaches a partition a consumer reads.
    let recorder = Recorder::default();
    let builder = base(&url, &name).partitions(16).handler(recorder.clone());
    let instance = Instance::spawn(move |signal| builder.run_until(signal));
    let jobs: Vec<Job> = (0..100).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    wait_until(Duration::from_secs(20), "every task", || {
        recorder.distinct() == 100
    })
    .await;
    instance.shutdown().await;

    // A JSON service: the default producer (bincode) is told how to build
    // a JSON one.
    let json = unique_name("adopt-json");
    let first = base(&url, &json).codec(Json).handler(Recorder::default());
    first.run_until(async {}).await.unwrap();
    let err = Producer::connect(&url, &json).await.unwrap_err();
    assert!(matches!(err, peerq::Error::SettingsMismatch(_)), "{err:?}");
    assert_advises(
        &err.to_string(),
        &[
            "`codec` is bincode here but json for the service",
            "`Producer::builder().codec(peerq::Json)",
        ],
    );
    let producer = Producer::builder()
        .redis(&url)
        .name(&json)
        .codec(Json)
        .connect()
        .await
        .unwrap();
    assert_eq!(producer.partitions(), 64);
}

/// Dead letters over all partitions of `name`: (reason, error) pairs.
async fn dead_letters(server: &RedisServer, name: &str, partitions: u32) -> Vec<(String, String)> {
    let mut conn = server.pool().get().await.unwrap();
    let mut out = Vec::new();
    for p in 0..partitions {
        let reply: deadpool_redis::redis::streams::StreamRangeReply = conn
            .xrange_all(format!("{{{name}/{p}}}:dead"))
            .await
            .unwrap();
        for entry in reply.ids {
            let reason: String = entry.get("reason").unwrap_or_default();
            let error: String = entry.get("error").unwrap_or_default();
            out.push((reason, error));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_entries_go_to_the_dead_letters_and_the_consumer_goes_on() {
    let server = RedisServer::start();
    let name = unique_name("garbage");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let mut conn = server.pool().get().await.unwrap();
    // A payload that does not decode, and an entry without the format's fields.
    let _: String = conn
        .xadd(
            format!("{{{name}/3}}:stream"),
            "*",
            &[
                ("id", &b"bad-1"[..]),
                ("attempt", b"1"),
                ("enqueued_at", b"0"),
                ("codec", b"bincode"),
                ("payload", b"\xff\xff\xff\xff\xff\xff"),
            ],
        )
        .await
        .unwrap();
    let _: String = conn
        .xadd(format!("{{{name}/5}}:stream"), "*", &[("hello", "world")])
        .await
        .unwrap();
    // A task of another type than the handler's, as a slip in user code
    // would enqueue it.
    producer.enqueue("receipt").await.unwrap();
    let recorder = Recorder::default();
    let instance = Instance::start(&server.url(), &name, recorder.clone());
    let jobs: Vec<Job> = (0..200).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    wait_until(Duration::from_secs(20), "the good tasks", || {
        recorder.distinct() == 200
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let dead = loop {
        let dead = dead_letters(&server, &name, 64).await;
        if dead.len() >= 3 || Instant::now() > deadline {
            break dead;
        }
        tokio::time::sleep(50 * MS).await;
    };
    instance.shutdown().await;
    let mut reasons: Vec<&str> = dead.iter().map(|d| d.0.as_str()).collect();
    reasons.sort_unstable();
    assert_eq!(reasons, vec!["decode", "decode", "malformed"], "{dead:?}");
    let not_a_job = format!(
        "the payload does not decode as the handler's task type `{}` with the `bincode` codec (",
        std::any::type_name::<Job>()
    );
    assert_eq!(
        dead.iter().filter(|d| d.1.starts_with(&not_a_job)).count(),
        2,
        "{dead:?}"
    );
    assert!(
        dead.iter().any(|d| d.1.contains("no `id` field")),
        "{dead:?}"
    );
    assert_eq!(pending(&server, &name, 64).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_a_failed_attempt_not_a_crash() {
    let server = RedisServer::start();
    let name = unique_name("panic");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let runs = Arc::new(Mutex::new(Vec::<(u64, u32)>::new()));
    let seen = runs.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let seen = seen.clone();
        async move {
            seen.lock()
                .unwrap()
                .push((task.payload.seq, task.cx.attempt()));
            if task.payload.seq == 7 && task.cx.attempt() == 1 {
                panic!("boom");
            }
            Ok::<(), HandlerError>(())
        }
    });
    let builder = base(&server.url(), &name).service(service);
    let instance = Instance::spawn(move |signal| builder.run_until(signal));
    let jobs: Vec<Job> = (0..20).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    wait_until(Duration::from_secs(20), "all tasks and the retry", || {
        runs.lock().unwrap().len() == 21
    })
    .await;
    instance.shutdown().await;
    let runs = runs.lock().unwrap().clone();
    let seven: Vec<u32> = runs.iter().filter(|r| r.0 == 7).map(|r| r.1).collect();
    assert_eq!(
        seven,
        vec![1, 2],
        "the panicked attempt runs again with attempt 2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_with_tasks_in_flight_loses_nothing_and_runs_nothing_twice() {
    let server = RedisServer::start();
    let name = unique_name("shutdown");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let jobs: Vec<Job> = (0..2_000).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    let runs = Arc::new(Mutex::new(Vec::<u64>::new()));
    let make = |runs: Arc<Mutex<Vec<u64>>>| {
        tower::service_fn(move |task: Task<Job>| {
            let runs = runs.clone();
            async move {
                // Well within the drain timeout (300 ms).
                tokio::time::sleep(20 * MS).await;
                runs.lock().unwrap().push(task.payload.seq);
                Ok::<(), HandlerError>(())
            }
        })
    };
    let first = base(&server.url(), &name)
        .concurrency(8)
        .service(make(runs.clone()));
    let first = Instance::spawn(move |signal| first.run_until(signal));
    wait_until(Duration::from_secs(20), "some tasks", || {
        runs.lock().unwrap().len() >= 50
    })
    .await;
    // Shut down with tasks running: they finish within the drain and are acked.
    first.shutdown().await;
    let after_first = runs.lock().unwrap().len();
    assert!(
        after_first < 2_000,
        "the first instance should not have finished everything"
    );
    assert_eq!(
        pending(&server, &name, 64).await,
        0,
        "a graceful stop leaves nothing pending"
    );

    let second = base(&server.url(), &name)
        .concurrency(8)
        .service(make(runs.clone()));
    let second = Instance::spawn(move |signal| second.run_until(signal));
    wait_until(Duration::from_secs(60), "the rest", || {
        runs.lock().unwrap().len() >= 2_000
    })
    .await;
    tokio::time::sleep(300 * MS).await;
    second.shutdown().await;
    let mut seqs = runs.lock().unwrap().clone();
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        (0..2_000).collect::<Vec<u64>>(),
        "every task exactly once"
    );
}

/// Records how many handler runs overlap.
#[derive(Clone, Default)]
struct Overlap {
    now: Arc<std::sync::atomic::AtomicUsize>,
    max: Arc<std::sync::atomic::AtomicUsize>,
    done: Arc<std::sync::atomic::AtomicUsize>,
}

impl Handler for Overlap {
    type Task = Job;
    async fn handle(&self, _job: Job, _cx: TaskContext) -> Result<(), HandlerError> {
        use std::sync::atomic::Ordering::SeqCst;
        /// Leaves the count also when the run is interrupted mid-way.
        struct Running<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, SeqCst);
            }
        }
        let now = self.now.fetch_add(1, SeqCst) + 1;
        let _running = Running(&self.now);
        self.max.fetch_max(now, SeqCst);
        tokio::time::sleep(10 * MS).await;
        self.done.fetch_add(1, SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limit_layer_bounds_the_observed_concurrency() {
    use std::sync::atomic::Ordering::SeqCst;
    let server = RedisServer::start();
    let jobs: Vec<Job> = (0..300).map(|seq| Job { seq }).collect();
    let mut observed = Vec::new();
    for limit in [None, Some(3)] {
        let name = unique_name("limit");
        let producer = Producer::connect(&server.url(), &name).await.unwrap();
        producer.enqueue_batch(&jobs).await.unwrap();
        let overlap = Overlap::default();
        let builder = base(&server.url(), &name).handler(overlap.clone());
        let instance = match limit {
            Some(n) => {
                let builder = builder.layer(tower::limit::ConcurrencyLimitLayer::new(n));
                Instance::spawn(move |signal| builder.run_until(signal))
            }
            None => Instance::spawn(move |signal| builder.run_until(signal)),
        };
        wait_until(Duration::from_secs(30), "all tasks", || {
            overlap.done.load(SeqCst) == 300
        })
        .await;
        instance.shutdown().await;
        observed.push(overlap.max.load(SeqCst));
    }
    println!(
        "max concurrency without a limit: {}, with a limit of 3: {}",
        observed[0], observed[1]
    );
    assert!(
        observed[0] > 3,
        "without a limit the instance runs tasks concurrently: {observed:?}"
    );
    assert!(
        observed[1] <= 3,
        "the layer bounds concurrency: {observed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_layer_fails_slow_tasks() {
    let server = RedisServer::start();
    let name = unique_name("timeout");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let finished = Arc::new(Mutex::new(Vec::<u64>::new()));
    let done = finished.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let done = done.clone();
        async move {
            // Every tenth task is too slow for the 300 ms timeout.
            let slow = task.payload.seq.is_multiple_of(10);
            tokio::time::sleep(if slow { Duration::from_secs(2) } else { MS }).await;
            done.lock().unwrap().push(task.payload.seq);
            Ok::<(), HandlerError>(())
        }
    });
    let builder = base(&server.url(), &name)
        .max_attempts(2)
        .service(service)
        .layer(tower::timeout::TimeoutLayer::new(300 * MS));
    let instance = Instance::spawn(move |signal| builder.run_until(signal));
    let jobs: Vec<Job> = (0..50).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let dead = loop {
        let dead = dead_letters(&server, &name, 64).await;
        let fast_done = finished.lock().unwrap().len() >= 45;
        if (dead.len() >= 5 && fast_done) || Instant::now() > deadline {
            break dead;
        }
        tokio::time::sleep(50 * MS).await;
    };
    instance.shutdown().await;
    assert_eq!(
        dead.len(),
        5,
        "the five slow tasks fail both attempts: {dead:?}"
    );
    assert!(
        dead.iter()
            .all(|d| d.0 == "failed" && d.1.contains("timed out")),
        "{dead:?}"
    );
    let finished = finished.lock().unwrap().clone();
    assert_eq!(finished.iter().filter(|s| *s % 10 != 0).count(), 45);
    assert!(
        finished.iter().all(|s| s % 10 != 0),
        "a timed-out task never finishes: {finished:?}"
    );
}

/// Stream entries over all partitions of `name`.
async fn stream_len(server: &RedisServer, name: &str, partitions: u32) -> usize {
    let mut conn = server.pool().get().await.unwrap();
    let mut total = 0;
    for p in 0..partitions {
        let len: usize = conn.xlen(format!("{{{name}/{p}}}:stream")).await.unwrap();
        total += len;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_trims_acknowledged_entries_and_nothing_else() {
    let server = RedisServer::start();
    let name = unique_name("trim");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    // Handlers wait at a gate: their entries stay pending, and with a
    // concurrency of 4 most others are never delivered meanwhile.
    let (gate, gate_rx) = tokio::sync::watch::channel(false);
    let runs = Arc::new(Mutex::new(Vec::<u64>::new()));
    let seen = runs.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let (seen, mut gate) = (seen.clone(), gate_rx.clone());
        async move {
            let _ = gate.wait_for(|open| *open).await;
            seen.lock().unwrap().push(task.payload.seq);
            Ok::<(), HandlerError>(())
        }
    });
    let builder = base(&server.url(), &name).concurrency(4).service(service);
    let instance = Instance::spawn(move |signal| builder.run_until(signal));
    let jobs: Vec<Job> = (0..2_000).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    // Several trims (one a second) while everything is pending or undelivered.
    // (The first assignment takes 1-2 s, then the owner trims every second.)
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        pending(&server, &name, 64).await > 0,
        "some entries are pending"
    );
    assert_eq!(
        stream_len(&server, &name, 64).await,
        2_000,
        "a pending or undelivered entry was trimmed"
    );

    gate.send_replace(true);
    wait_until(Duration::from_secs(30), "all tasks", || {
        runs.lock().unwrap().len() >= 2_000
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = stream_len(&server, &name, 64).await;
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} acknowledged entries were never trimmed"
        );
        tokio::time::sleep(100 * MS).await;
    }
    instance.shutdown().await;
    let mut seqs = runs.lock().unwrap().clone();
    seqs.sort_unstable();
    assert_eq!(
        seqs,
        (0..2_000).collect::<Vec<u64>>(),
        "every task exactly once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_redis_is_refused_unless_allowed() {
    let server = RedisServer::start();
    let name = unique_name("evict");
    let mut conn = server.pool().get().await.unwrap();
    let _: () = deadpool_redis::redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query_async(&mut *conn)
        .await
        .unwrap();
    let err = base(&server.url(), &name)
        .handler(Recorder::default())
        .run_until(async {})
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("`allow_eviction`") && msg.contains("allkeys-lru"),
        "{msg}"
    );
    base(&server.url(), &name)
        .allow_eviction(true)
        .handler(Recorder::default())
        .run_until(async {})
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_entry_written_by_another_language_is_handled() {
    use peerq::Json;
    use peerq::partition_of;
    let server = RedisServer::start();
    let name = unique_name("json");
    // A peerq producer with JSON, and an entry written by hand as the README
    // documents it for other languages.
    let producer = Producer::builder()
        .redis(server.url())
        .name(&name)
        .codec(Json)
        .connect()
        .await
        .unwrap();
    producer.enqueue(&Job { seq: 1 }).await.unwrap();
    let p = partition_of(b"order-7", 64);
    let mut conn = server.pool().get().await.unwrap();
    let _: String = conn
        .xadd(
            format!("{{{name}/{p}}}:stream"),
            "*",
            &[
                ("id", "from-python-1"),
                ("key", "order-7"),
                ("attempt", "1"),
                ("enqueued_at", "1767225600000"),
                ("codec", "json"),
                ("payload", r#"{"seq":2}"#),
            ],
        )
        .await
        .unwrap();
    let runs = Arc::new(Mutex::new(Vec::<(u64, String, u32)>::new()));
    let seen = runs.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push((
                task.payload.seq,
                task.cx.task_id().to_string(),
                task.cx.partition(),
            ));
            Ok::<(), HandlerError>(())
        }
    });
    let builder = base(&server.url(), &name).codec(Json).service(service);
    let instance = Instance::spawn(move |signal| builder.run_until(signal));
    wait_until(Duration::from_secs(20), "both tasks", || {
        runs.lock().unwrap().len() == 2
    })
    .await;
    instance.shutdown().await;
    let runs = runs.lock().unwrap().clone();
    assert!(
        runs.contains(&(2, "from-python-1".to_owned(), p)),
        "{runs:?}"
    );
    assert!(runs.iter().any(|r| r.0 == 1), "{runs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_over_the_limit_is_refused_and_nothing_is_enqueued() {
    let server = RedisServer::start();
    let name = unique_name("limit");
    let producer = Producer::builder()
        .redis(server.url())
        .name(&name)
        .max_payload(100)
        .connect()
        .await
        .unwrap();
    let big = "x".repeat(200);
    let err = producer.enqueue(&big).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("exceeds the limit of 100 bytes (`max_payload`)"),
        "{err}"
    );
    let err = producer
        .enqueue_batch(&["ok".to_owned(), big.clone()])
        .await
        .unwrap_err();
    assert!(matches!(err, peerq::Error::PayloadTooLarge { .. }), "{err}");
    // Late in a batch of many parts: every part before it is built by then,
    // and none is sent.
    let mut many = vec!["ok".to_owned(); 1000];
    many[990] = big;
    let err = producer.enqueue_batch(&many).await.unwrap_err();
    assert!(matches!(err, peerq::Error::PayloadTooLarge { .. }), "{err}");
    let mut conn = server.pool().get().await.unwrap();
    let keys: Vec<String> = conn.keys(format!("{{{name}/*")).await.unwrap();
    assert!(
        keys.is_empty(),
        "a refused batch enqueues nothing: {keys:?}"
    );
}

#[tokio::test]
async fn invalid_consumer_settings_are_refused_by_name_before_redis() {
    type Builder = ConsumerBuilder<(), (), Bincode>;
    type Spoil = fn(Builder) -> Builder;
    const URL: &str = "redis://127.0.0.1:1/";
    let cases: Vec<(&str, Spoil)> = vec![
        ("name", |b| b.name("a/b")),
        ("concurrency", |b| b.concurrency(0)),
        ("batch", |b| b.batch(0)),
        ("partitions", |b| b.partitions(0)),
        ("drain_timeout", |b| b.drain_timeout(Duration::from_secs(1))),
        ("block", |b| b.block(Duration::ZERO)),
        ("max_attempts", |b| b.max_attempts(0)),
        ("claim_idle", |b| b.claim_idle(MS)),
        ("max_entry_bytes", |b| b.max_entry_bytes(0)),
        ("max_entry_bytes", |b| b.max_entry_bytes(1023)),
        ("interval", |b| b.interval(Duration::ZERO)),
        ("weight", |b| b.weight(0)),
        ("weight", |b| b.weight(1001)),
        // Weights mean nothing to the modulo filter.
        ("weight", |b| b.weight(2)),
        ("assignor", |b| {
            b.assignor(peerq::Assignor::Rendezvous)
                .indexing(peerq::Indexing::Incr)
        }),
        ("wait_for_replicas", |b| {
            b.redis(peerq::Redis::url(URL).wait_for_replicas(0, 10 * MS))
        }),
        ("wait_for_replicas", |b| {
            b.redis(peerq::Redis::url(URL).wait_for_replicas(1, MS / 2))
        }),
        // More than a tenth of the interval: a round could miss its window.
        ("wait_for_replicas", |b| {
            b.redis(peerq::Redis::url(URL).wait_for_replicas(1, 500 * MS))
        }),
        // A Cluster without a seed node.
        ("redis_cluster", |b| {
            b.redis(peerq::Redis::cluster(Vec::<String>::new()))
        }),
        // TLS files beside a pool, which brings its own.
        ("tls", |b| {
            let pool = deadpool_redis::Config::from_url(URL)
                .create_pool(Some(deadpool_redis::Runtime::Tokio1));
            b.redis(peerq::Redis::pool(pool.unwrap()).tls(peerq::Tls::new()))
        }),
        ("redis", |b| b.redis("redis//127.0.0.1:1/")),
    ];
    let mut results = Vec::new();
    for (setting, bad) in cases {
        let result = bad(base(URL, "ok"))
            .handler(Recorder::default())
            .run_until(async {})
            .await;
        results.push((setting, result));
    }
    for (setting, result) in results {
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains(&format!("invalid setting `{setting}`")),
            "{setting}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_running_past_the_drain_timeout_is_interrupted_and_runs_again() {
    support::init_tracing();
    let server = RedisServer::start();
    let name = unique_name("cancel");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    // What each run did: (seq, attempt, "done" | "interrupted").
    let runs = Arc::new(Mutex::new(Vec::<(u64, u32, &'static str)>::new()));
    type Runs = Arc<Mutex<Vec<(u64, u32, &'static str)>>>;
    let make = |runs: Runs| {
        tower::service_fn(move |task: Task<Job>| {
            let runs = runs.clone();
            async move {
                let (seq, attempt) = (task.payload.seq, task.cx.attempt());
                if attempt == 1 {
                    // Far longer than the drain timeout, unless interrupted:
                    // then give up as the docs ask.
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(30)) => {}
                        _ = task.cx.cancelled() => {
                            runs.lock().unwrap().push((seq, attempt, "interrupted"));
                            return Err(HandlerError::msg("interrupted"));
                        }
                    }
                }
                runs.lock().unwrap().push((seq, attempt, "done"));
                Ok::<(), HandlerError>(())
            }
        })
    };
    // One task per partition (keys chosen to cover all 64), all running on
    // the first instance; max_attempts(1): an interrupted run must not count.
    let first = base(&server.url(), &name)
        .max_attempts(1)
        .service(make(runs.clone()));
    let first = Instance::spawn(move |signal| first.run_until(signal));
    let mut keys_by_partition = BTreeMap::new();
    for i in 0.. {
        let key = format!("k{i}");
        keys_by_partition
            .entry(peerq::partition_of(key.as_bytes(), 64))
            .or_insert(key);
        if keys_by_partition.len() == 64 {
            break;
        }
    }
    for (p, key) in &keys_by_partition {
        producer
            .enqueue_with(
                Job { seq: u64::from(*p) },
                peerq::producer::Options::new().key(key.clone()),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    // A second instance joins: about half the partitions move, and their
    // running tasks are interrupted at the drain timeout.
    let second = base(&server.url(), &name)
        .max_attempts(1)
        .service(make(runs.clone()));
    let second = Instance::spawn(move |signal| second.run_until(signal));
    wait_until(
        Duration::from_secs(20),
        "the moved tasks to run again",
        || {
            let runs = runs.lock().unwrap();
            runs.iter().any(|r| r.2 == "done")
                && runs.iter().filter(|r| r.2 == "interrupted").count()
                    == runs.iter().filter(|r| r.2 == "done").count()
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let runs = runs.lock().unwrap().clone();
    first.shutdown().await;
    second.shutdown().await;
    let interrupted: Vec<u64> = runs
        .iter()
        .filter(|r| r.2 == "interrupted")
        .map(|r| r.0)
        .collect();
    let done: Vec<(u64, u32)> = runs
        .iter()
        .filter(|r| r.2 == "done")
        .map(|r| (r.0, r.1))
        .collect();
    assert!(!interrupted.is_empty(), "some partitions moved: {runs:?}");
    let mut again: Vec<u64> = done.iter().map(|d| d.0).collect();
    again.sort_unstable();
    let mut expected = interrupted.clone();
    expected.sort_unstable();
    assert_eq!(
        again, expected,
        "each interrupted task ran again, once: {runs:?}"
    );
    assert!(done.iter().all(|d| d.1 == 2), "with attempt 2: {done:?}");
    assert!(
        dead_letters(&server, &name, 64).await.is_empty(),
        "an interrupted run is not a failed attempt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stalling_mid_flow_loses_nothing_and_the_consumer_recovers() {
    let server = RedisServer::start();
    let name = unique_name("stall");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let recorder = Recorder::default();
    let instance = Instance::start(&server.url(), &name, recorder.clone());
    for round in 0..30u64 {
        let jobs: Vec<Job> = (round * 100..(round + 1) * 100)
            .map(|seq| Job { seq })
            .collect();
        producer.enqueue_batch(&jobs).await.unwrap();
        if round == 15 {
            // Redis stops answering for 2 s (SIGSTOP), then comes back.
            server.pause_for(Duration::from_secs(2));
        }
        tokio::time::sleep(100 * MS).await;
    }
    wait_until(Duration::from_secs(60), "all tasks after the stall", || {
        recorder.distinct() == 3_000
    })
    .await;
    wait_nothing_pending(&server, &name).await;
    instance.shutdown().await;
    assert_each_once(&recorder.runs(), 3_000, "after a stall");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_cut_from_redis_reconnects_and_loses_nothing() {
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    let name = unique_name("cut");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let recorder = Recorder::default();
    // The consumer reaches Redis through the proxy; the producer directly.
    let instance = Instance::start(&proxy.url(), &name, recorder.clone());
    for round in 0..30u64 {
        let jobs: Vec<Job> = (round * 100..(round + 1) * 100)
            .map(|seq| Job { seq })
            .collect();
        producer.enqueue_batch(&jobs).await.unwrap();
        match round {
            10 => proxy.cut(),
            25 => proxy.restore(),
            _ => {}
        }
        tokio::time::sleep(100 * MS).await;
    }
    wait_until(Duration::from_secs(60), "all tasks after the cut", || {
        recorder.distinct() == 3_000
    })
    .await;
    wait_nothing_pending(&server, &name).await;
    instance.shutdown().await;
    assert_each_once(&recorder.runs(), 3_000, "after the cut");
}
