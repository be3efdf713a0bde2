//! peerq on a master that Redis Sentinel watches ([`SentinelSet`]: a
//! master, two replicas, three sentinels, each test a set of its own):
//! consumers and a producer given `Redis::sentinel` follow a failover with
//! no restart, `SENTINEL FAILOVER` and a SIGKILL of the master alike.
//!
//! A Sentinel failover is asynchronous: the promoted replica may lack the
//! master's last writes, and the old master takes writes until the
//! sentinels demote it. Waiting for every replica (`wait_for_replicas(2,
//! …)`) is the condition under which no enqueue that returned success is
//! lost (docs/design.md §8); without it the losses are counted and printed.

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use peerq::producer::{Options, Producer};
use peerq::{Consumer, Handler, HandlerError, Redis, TaskContext};
use serde::{Deserialize, Serialize};
use support::{MASTER_NAME, SentinelSet, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);
/// Every replica of the set: the promoted one holds every write.
const EVERY_REPLICA: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Every run of a handler, by seq.
#[derive(Clone, Default)]
struct Recorder {
    runs: Arc<Mutex<Vec<u64>>>,
}

impl Handler for Recorder {
    type Task = Job;
    async fn handle(&self, job: Job, _cx: TaskContext) -> Result<(), HandlerError> {
        self.runs.lock().unwrap().push(job.seq);
        Ok(())
    }
}

impl Recorder {
    fn distinct(&self) -> usize {
        let runs = self.runs.lock().unwrap();
        runs.iter().collect::<BTreeSet<_>>().len()
    }

    /// The seqs of `0..count` that never ran, and those that ran more than
    /// once.
    fn tally(&self, count: u64) -> (Vec<u64>, Vec<u64>) {
        let runs = self.runs.lock().unwrap();
        let mut per_seq: BTreeMap<u64, usize> = BTreeMap::new();
        for seq in runs.iter() {
            assert!(*seq < count, "a run of task {seq}, never enqueued");
            *per_seq.entry(*seq).or_default() += 1;
        }
        let twice = per_seq.iter().filter(|(_, n)| **n > 1).map(|(seq, _)| *seq);
        let missing = (0..count).filter(|seq| !per_seq.contains_key(seq));
        (missing.collect(), twice.collect())
    }
}

/// The set's master through its sentinels, waiting for `wait` replicas.
fn redis(set: &SentinelSet, wait: Option<u32>) -> Redis {
    let redis = Redis::sentinel(MASTER_NAME, set.sentinel_urls());
    match wait {
        Some(n) => redis.wait_for_replicas(n, 100 * MS),
        None => redis,
    }
}

/// A consumer instance, running until shut down.
struct Instance {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<peerq::Result<()>>,
}

impl Instance {
    fn start(redis: Redis, name: &str, handler: Recorder) -> Instance {
        support::init_tracing();
        let builder = Consumer::builder().redis(redis).name(name).handler(handler);
        let stop = CancellationToken::new();
        let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
        Instance { stop, task }
    }

    async fn shutdown(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

fn running(instances: &[Instance]) -> bool {
    instances.iter().all(|i| !i.task.is_finished())
}

/// Enqueues one task at a time, each under an idempotency key (its seq) so
/// that one sent again after an error is not a second task, until `stop`
/// and `at_least` tasks; returns how many were enqueued with success.
async fn enqueue_until(producer: Arc<Producer>, stop: CancellationToken, at_least: u64) -> u64 {
    let seqs = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(90);
    while !stop.is_cancelled() || seqs.load(Ordering::SeqCst) < at_least {
        let seq = seqs.fetch_add(1, Ordering::SeqCst);
        loop {
            let options = Options::new().idempotency_key(seq.to_string());
            match producer.enqueue_with(Job { seq }, options).await {
                Ok(_) => break,
                Err(e) => {
                    assert!(Instant::now() < deadline, "enqueues fail: {e}");
                    tokio::time::sleep(20 * MS).await;
                }
            }
        }
        tokio::time::sleep(5 * MS).await;
    }
    seqs.load(Ordering::SeqCst)
}

/// What a run through a failover counted.
#[derive(Debug)]
struct Counted {
    enqueued: u64,
    /// Enqueues that returned success but whose task never ran.
    lost: usize,
    /// Tasks that ran more than once.
    twice: usize,
}

/// Two consumers and a producer of a fresh service on a fresh set, tasks
/// flowing at a steady rate while `fail` fails the master over; every
/// part waits for `wait` replicas. Waits until every task ran, or nothing
/// changed for 10 s, and shuts the instances down (gracefully: they must
/// never have stopped).
async fn through_a_failover(
    prefix: &str,
    wait: Option<u32>,
    fail: impl FnOnce(&mut SentinelSet) -> u16,
) -> Counted {
    let mut set = SentinelSet::start();
    let name = unique_name(prefix);
    let record = Recorder::default();
    let instances: Vec<Instance> = (0..2)
        .map(|_| Instance::start(redis(&set, wait), &name, record.clone()))
        .collect();
    let producer = Producer::builder().redis(redis(&set, wait)).name(&name);
    let producer = Arc::new(producer.connect().await.unwrap());
    let stop = CancellationToken::new();
    let flowing = tokio::spawn(enqueue_until(producer, stop.clone(), 1000));
    wait_until(Duration::from_secs(30), "tasks run", || {
        record.distinct() > 100
    })
    .await;

    let old = set.master_port();
    let new = tokio::task::block_in_place(|| fail(&mut set));
    assert_ne!(old, new, "the master did not change");
    tracing::warn!(old, new, "test: failed over");
    // Tasks enqueued after the failover run too: both instances followed.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    let enqueued = flowing.await.unwrap();

    let mut last = (0, Instant::now());
    while record.distinct() as u64 != enqueued {
        assert!(running(&instances), "an instance stopped");
        let ran = record.distinct();
        if ran != last.0 {
            last = (ran, Instant::now());
        } else if last.1.elapsed() > Duration::from_secs(10) {
            break;
        }
        tokio::time::sleep(50 * MS).await;
    }
    tokio::time::sleep(500 * MS).await;
    assert!(running(&instances), "an instance stopped");
    for instance in instances {
        instance.shutdown().await;
    }
    let (lost, twice) = record.tally(enqueued);
    let counted = Counted {
        enqueued,
        lost: lost.len(),
        twice: twice.len(),
    };
    eprintln!(
        "{prefix}, wait_for_replicas {wait:?}: {} enqueued, {} lost ({lost:?}), {} ran twice",
        counted.enqueued, counted.lost, counted.twice
    );
    counted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_while_tasks_flow_loses_no_task_when_writes_wait_for_every_replica() {
    let counted = through_a_failover(
        "sentinel-failover",
        Some(EVERY_REPLICA),
        |set: &mut SentinelSet| set.failover(),
    )
    .await;
    assert_eq!(counted.lost, 0, "{counted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sentinel_master_loses_no_task_when_writes_wait_for_every_replica() {
    let counted = through_a_failover(
        "sentinel-kill",
        Some(EVERY_REPLICA),
        SentinelSet::kill_master,
    )
    .await;
    assert_eq!(counted.lost, 0, "{counted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_sentinel_master_without_waiting_for_replicas_is_measured() {
    // What an asynchronous failover costs without WAIT: printed, as the
    // Cluster's is. The run must still end with both instances running.
    let counted = through_a_failover("sentinel-kill-nowait", None, SentinelSet::kill_master).await;
    assert!(counted.enqueued >= 1000, "{counted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_without_waiting_for_replicas_is_measured() {
    let counted = through_a_failover("sentinel-failover-nowait", None, |set: &mut SentinelSet| {
        set.failover()
    })
    .await;
    assert!(counted.enqueued >= 1000, "{counted:?}");
}
