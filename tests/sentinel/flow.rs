//! What every Sentinel test runs: consumers that record each run of a
//! task with its time, a producer enqueuing one task at a time under
//! idempotency keys, and the tally of what ran.

use std::collections::{BTreeMap, BTreeSet};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, Handler, HandlerError, Redis, TaskContext};
use serde::{Deserialize, Serialize};
use support::SentinelSet;
use tokio_util::sync::CancellationToken;

pub(crate) const MS: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Job {
    pub(crate) seq: u64,
}

/// Every run of a handler: its task's seq and when it started.
#[derive(Clone, Default)]
pub(crate) struct Recorder {
    runs: Arc<Mutex<Vec<(u64, Instant)>>>,
}

impl Handler for Recorder {
    type Task = Job;
    async fn handle(&self, job: Job, _cx: TaskContext) -> Result<(), HandlerError> {
        self.runs.lock().unwrap().push((job.seq, Instant::now()));
        Ok(())
    }
}

impl Recorder {
    /// How many tasks ran at least once.
    pub(crate) fn distinct(&self) -> usize {
        let runs = self.runs.lock().unwrap();
        runs.iter()
            .map(|(seq, _)| seq)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// The seqs of `0..count` that never ran, and those that ran more than
    /// once.
    pub(crate) fn tally(&self, count: u64) -> (Vec<u64>, Vec<u64>) {
        let per_seq = self.per_seq();
        for seq in per_seq.keys() {
            assert!(*seq < count, "a run of task {seq}, never enqueued");
        }
        let twice = per_seq.iter().filter(|(_, runs)| runs.len() > 1);
        let missing = (0..count).filter(|seq| !per_seq.contains_key(seq));
        (missing.collect(), twice.map(|(seq, _)| *seq).collect())
    }

    /// When each task's runs started, by seq, in order.
    pub(crate) fn per_seq(&self) -> BTreeMap<u64, Vec<Instant>> {
        let mut per_seq: BTreeMap<u64, Vec<Instant>> = BTreeMap::new();
        for (seq, at) in self.runs.lock().unwrap().iter() {
            per_seq.entry(*seq).or_default().push(*at);
        }
        per_seq
    }
}

/// A consumer instance, running until shut down.
pub(crate) struct Instance {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<peerq::Result<()>>,
}

impl Instance {
    pub(crate) fn start(redis: Redis, name: &str, handler: Recorder) -> Instance {
        support::init_tracing();
        let builder = Consumer::builder().redis(redis).name(name).handler(handler);
        let stop = CancellationToken::new();
        let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
        Instance { stop, task }
    }

    pub(crate) async fn shutdown(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

pub(crate) fn running(instances: &[Instance]) -> bool {
    instances.iter().all(|i| !i.task.is_finished())
}

/// Two consumer instances and a producer enqueueing one task at a time
/// ([`enqueue_until`], at least 1,000), under way with more than 100 run.
pub(crate) struct Flow {
    pub(crate) record: Recorder,
    pub(crate) instances: Vec<Instance>,
    /// Ends the enqueues (once 1,000 were made).
    pub(crate) stop: CancellationToken,
    pub(crate) enqueues: tokio::task::JoinHandle<Vec<Enqueue>>,
}

impl Flow {
    /// Starts the flow on service `name`, each part on a connection value
    /// `redis` gives.
    pub(crate) async fn start(redis: impl Fn() -> Redis, name: &str) -> Flow {
        let record = Recorder::default();
        let instances: Vec<Instance> = (0..2)
            .map(|_| Instance::start(redis(), name, record.clone()))
            .collect();
        let producer = Producer::builder().redis(redis()).name(name);
        let producer = Arc::new(producer.connect().await.unwrap());
        let stop = CancellationToken::new();
        let enqueues = tokio::spawn(enqueue_until(producer, stop.clone(), 1000));
        support::wait_until(Duration::from_secs(30), "tasks run", || {
            record.distinct() > 100
        })
        .await;
        Flow {
            record,
            instances,
            stop,
            enqueues,
        }
    }
}

/// One task's enqueue.
pub(crate) struct Enqueue {
    /// When it returned success.
    pub(crate) confirmed: Instant,
    /// When it first failed, and why, if it did before it succeeded.
    pub(crate) failed: Option<(Instant, String)>,
}

/// Enqueues one task at a time, each under an idempotency key (its seq) so
/// that one sent again after an error is not a second task, until `stop`
/// and `at_least` tasks; returns each enqueue, by seq.
pub(crate) async fn enqueue_until(
    producer: Arc<Producer>,
    stop: CancellationToken,
    at_least: u64,
) -> Vec<Enqueue> {
    let seqs = AtomicU64::new(0);
    let mut enqueues = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while !stop.is_cancelled() || seqs.load(Ordering::SeqCst) < at_least {
        let seq = seqs.fetch_add(1, Ordering::SeqCst);
        let mut failed = None;
        loop {
            let options = Options::new().idempotency_key(seq.to_string());
            match producer.enqueue_with(Job { seq }, options).await {
                Ok(_) => break,
                Err(e) => {
                    assert!(Instant::now() < deadline, "enqueues fail: {e}");
                    failed.get_or_insert_with(|| (Instant::now(), e.to_string()));
                    tokio::time::sleep(20 * MS).await;
                }
            }
        }
        let confirmed = Instant::now();
        enqueues.push(Enqueue { confirmed, failed });
        tokio::time::sleep(5 * MS).await;
    }
    enqueues
}

/// Waits until all `enqueued` tasks ran, or none more ran for `stall`,
/// checking that every instance still runs.
pub(crate) async fn wait_ran(
    record: &Recorder,
    instances: &[Instance],
    enqueued: u64,
    stall: Duration,
) {
    let mut last = (0, Instant::now());
    while record.distinct() as u64 != enqueued {
        assert!(running(instances), "an instance stopped");
        let ran = record.distinct();
        if ran != last.0 {
            last = (ran, Instant::now());
        } else if last.1.elapsed() > stall {
            break;
        }
        tokio::time::sleep(50 * MS).await;
    }
    // Runs after the last new one: a task run twice shows now.
    tokio::time::sleep(500 * MS).await;
    assert!(running(instances), "an instance stopped");
}

/// The seqs whose idempotency record (`{name/p}:dedup:<seq>`) the server
/// on `port` holds.
pub(crate) fn dedup_records(set: &SentinelSet, port: u16, name: &str) -> BTreeSet<u64> {
    let pattern = format!("{{{name}/*}}:dedup:*");
    let mut seqs = BTreeSet::new();
    let mut cursor = 0u64;
    loop {
        let mut scan = redis::cmd("SCAN");
        scan.arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000);
        let (next, keys): (u64, Vec<String>) = set.query_server(port, &scan).expect("SCAN");
        for key in keys {
            let seq = key
                .rsplit(":dedup:")
                .next()
                .and_then(|s| s.parse::<u64>().ok());
            seqs.extend(seq);
        }
        if next == 0 {
            return seqs;
        }
        cursor = next;
    }
}
