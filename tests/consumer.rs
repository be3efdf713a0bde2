//! The consumer and producer against a real redis-server: several
//! instances in one process split a service's partitions by modulo.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis::AsyncCommands;
use peerq::producer::Producer;
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
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
    attempt: u32,
}

#[derive(Clone, Default)]
struct Recorder {
    runs: Arc<Mutex<Vec<Execution>>>,
}

impl Handler for Recorder {
    type Task = Job;
    async fn handle(&self, job: Job, cx: TaskContext) -> Result<(), HandlerError> {
        self.runs.lock().unwrap().push(Execution {
            seq: job.seq,
            partition: cx.partition(),
            index: cx.index(),
            replicas: cx.replicas(),
            attempt: cx.attempt(),
        });
        Ok(())
    }
}

impl Recorder {
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

/// A consumer instance running in this process until `stop` is cancelled.
struct Instance {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<peerq::Result<()>>,
}

impl Instance {
    fn start(url: &str, name: &str, handler: Recorder) -> Instance {
        let stop = CancellationToken::new();
        let signal = stop.clone();
        let builder = Consumer::builder()
            .name(name)
            .redis(url)
            .interval(300 * MS)
            .skew(20 * MS)
            .lease_margin(10 * MS)
            .drain_timeout(100 * MS)
            .block(200 * MS)
            .handler(handler);
        let task = tokio::spawn(async move { builder.run_until(signal.cancelled_owned()).await });
        Instance { stop, task }
    }

    async fn shutdown(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Waits until `done` holds, polling; panics after `within`.
async fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(20 * MS).await;
    }
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
        .map(|_| Instance::start(&server.url(), &name, recorder.clone()))
        .collect();
    for chunk in jobs[5_000..].chunks(500) {
        producer.enqueue_batch(chunk).await.unwrap();
    }
    wait_until(Duration::from_secs(60), "all tasks to run", || {
        recorder.distinct() == 10_000
    })
    .await;
    // Acks are sent in the background; give them a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pending(&server, &name, 64).await > 0 {
        assert!(Instant::now() < deadline, "entries still pending");
        tokio::time::sleep(50 * MS).await;
    }
    for instance in instances {
        instance.shutdown().await;
    }

    let runs = recorder.runs();
    let mut per_seq: BTreeMap<u64, usize> = BTreeMap::new();
    for run in &runs {
        *per_seq.entry(run.seq).or_default() += 1;
        // Run by the owner of its partition under the assignment in force.
        assert_eq!(run.partition % run.replicas, run.index - 1, "{run:?}");
        assert_eq!(run.attempt, 1, "{run:?}");
    }
    let twice: Vec<_> = per_seq.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "tasks not run exactly once: {twice:?}");
    assert_eq!(per_seq.len(), 10_000);
    assert_eq!(pending(&server, &name, 64).await, 0);
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
