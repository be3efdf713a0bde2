//! Unique keys (`Options::unique`, docs/design.md §16) against a real
//! redis-server, instances in this process: a held key refuses an enqueue
//! with the holder's id, alone and per task of a batch, through a retry and
//! a handover (in ordered partitions too); the key is free at once after a
//! success, a dead letter and a user's cancel; a dead letter's replay is
//! refused while another task holds its key and takes it again once free;
//! a lock whose task no longer exists (its entry deleted) is taken over; a
//! unique key beside another partition key is refused by name. (SIGKILL
//! churn: `tests/scenarios/unique.rs`.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis;
use peerq::admin::Admin;
use peerq::dead_letters::DeadLetters;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::tracking::Tracking;
use peerq::{Consumer, Error, HandlerError, TaskId, partition_of};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

mod moves;

const P: u32 = 4;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
    /// What the handler does with attempt `n` (index `n - 1`; past the
    /// end: succeed).
    plan: Vec<Step>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
enum Step {
    /// Fails, retried after 300 ms.
    Fail,
    /// Fails for good: a dead letter.
    Die,
    /// Waits for a permit of the test's gate, then succeeds.
    Gate,
    /// Waits for its run to be interrupted (a drain), and gives up.
    Hang,
}

/// The attempts each seq ran.
type Runs = Arc<Mutex<BTreeMap<u64, Vec<u32>>>>;

struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<peerq::Result<()>>,
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

fn consumer(url: &str, name: &str, runs: &Runs, gate: &Arc<Semaphore>) -> Running {
    start(url, name, runs, gate, false)
}

/// A consumer of `name`, its partitions `ordered` or not.
fn start(url: &str, name: &str, runs: &Runs, gate: &Arc<Semaphore>, ordered: bool) -> Running {
    support::init_tracing();
    let (runs, gate) = (runs.clone(), gate.clone());
    let service = tower::service_fn(move |task: Task<Job>| {
        let (runs, gate) = (runs.clone(), gate.clone());
        async move {
            let (job, cx) = (task.payload, task.cx);
            runs.lock()
                .unwrap()
                .entry(job.seq)
                .or_default()
                .push(cx.attempt());
            match job.plan.get(cx.attempt() as usize - 1) {
                Some(Step::Fail) => {
                    Err(HandlerError::msg("fails").retry_after(Duration::from_millis(300)))
                }
                Some(Step::Die) => Err(HandlerError::msg("dies").permanent()),
                Some(Step::Gate) => {
                    gate.acquire().await.unwrap().forget();
                    Ok(())
                }
                Some(Step::Hang) => {
                    cx.cancelled().await;
                    Ok(())
                }
                None => Ok(()),
            }
        }
    });
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .drain_timeout(Duration::from_millis(300))
        .ordered(ordered)
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    Running { stop, task }
}

async fn producer(url: &str, name: &str) -> Producer {
    Producer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .connect()
        .await
        .unwrap()
}

fn job(seq: u64, plan: &[Step]) -> Job {
    Job {
        seq,
        plan: plan.to_vec(),
    }
}

fn unique(key: &str) -> Options {
    Options::new().unique(key)
}

/// The enqueue of `job` with unique key `key` is refused, naming `holder`.
async fn refused(producer: &Producer, job: Job, key: &str, holder: &TaskId) {
    match producer.enqueue_with(job, unique(key)).await {
        Err(Error::Duplicate(held)) => {
            assert_eq!(&held.existing, holder);
            assert_eq!(held.unique, key);
        }
        other => panic!("expected a refusal naming {holder}, got {other:?}"),
    }
}

/// The unique keys held in service `name`'s partition of `key`.
async fn held(server: &RedisServer, name: &str, key: &str) -> usize {
    let p = partition_of(key.as_bytes(), P);
    let mut conn = server.pool().get().await.unwrap();
    redis::cmd("HLEN")
        .arg(format!("{{{name}/{p}}}:unique"))
        .query_async(&mut conn)
        .await
        .unwrap()
}

async fn wait_free(server: &RedisServer, name: &str, key: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while held(server, name, key).await > 0 {
        assert!(tokio::time::Instant::now() < deadline, "`{key}` stays held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_key_refuses_with_the_holders_id_until_its_task_succeeds() {
    let server = RedisServer::start();
    let name = unique_name("unique-held");
    let producer = producer(&server.url(), &name).await;
    let first = producer
        .enqueue_with(job(1, &[Step::Gate]), unique("report-7"))
        .await
        .unwrap();
    // Waiting: refused, whatever else the enqueue asks (a delay too).
    refused(&producer, job(2, &[]), "report-7", &first).await;
    let delayed = unique("report-7").delay(Duration::from_secs(5));
    match producer.enqueue_with(job(3, &[]), delayed).await {
        Err(Error::Duplicate(held)) => assert_eq!(held.existing, first),
        other => panic!("{other:?}"),
    }
    // Another key is free.
    producer
        .enqueue_with(job(4, &[]), unique("report-8"))
        .await
        .unwrap();
    // Running: still refused.
    let (runs, gate): (Runs, _) = (Arc::default(), Arc::new(Semaphore::new(0)));
    let a = consumer(&server.url(), &name, &runs, &gate);
    wait_until(Duration::from_secs(15), "the task runs", || {
        runs.lock().unwrap().contains_key(&1)
    })
    .await;
    refused(&producer, job(5, &[]), "report-7", &first).await;
    // Succeeded: free at once, and taken by the next.
    gate.add_permits(1);
    wait_free(&server, &name, "report-7").await;
    let next = producer
        .enqueue_with(job(6, &[]), unique("report-7"))
        .await
        .unwrap();
    assert_ne!(next, first);
    wait_until(Duration::from_secs(15), "the next runs", || {
        runs.lock().unwrap().contains_key(&6)
    })
    .await;
    wait_free(&server, &name, "report-7").await;
    a.stop().await;
    let runs = runs.lock().unwrap().clone();
    assert_eq!(
        runs.keys().copied().collect::<Vec<_>>(),
        [1, 4, 6],
        "{runs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_says_which_tasks_its_held_keys_refused() {
    let server = RedisServer::start();
    let name = unique_name("unique-batch");
    let producer = producer(&server.url(), &name).await;
    let held_by = producer
        .enqueue_with(job(0, &[]), unique("u1"))
        .await
        .unwrap();
    let tasks = [
        (job(1, &[]), unique("u1")),
        (job(2, &[]), Options::new()),
        (job(3, &[]), unique("u2")),
        // Refused by the task before it in the same batch.
        (job(4, &[]), unique("u2")),
        (
            job(5, &[]),
            Options::new().key("k").delay(Duration::from_secs(60)),
        ),
    ];
    let refusal = match producer.enqueue_batch_with(&tasks).await {
        Err(Error::DuplicatesInBatch(refusal)) => refusal,
        other => panic!("expected refusals, got {other:?}"),
    };
    let at: Vec<usize> = refusal.refused.iter().map(|(at, _)| *at).collect();
    assert_eq!(at, [0, 3]);
    assert_eq!(refusal.ids.len(), 5);
    assert_eq!(refusal.ids[0], held_by);
    assert_eq!(refusal.ids[3], refusal.ids[2]);
    assert_eq!(refusal.refused[1].1.unique, "u2");
    assert_eq!(refusal.refused[1].1.existing, refusal.ids[2]);
    // The others were enqueued: u2 is held by task 3.
    refused(&producer, job(6, &[]), "u2", &refusal.ids[2]).await;
    // A batch with nothing refused returns its ids as before.
    let ids = producer
        .enqueue_batch_with(&[(job(7, &[]), unique("u3"))])
        .await
        .unwrap();
    refused(&producer, job(8, &[]), "u3", &ids[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unique_key_beside_another_partition_key_is_refused_by_name() {
    let server = RedisServer::start();
    let name = unique_name("unique-key");
    let producer = producer(&server.url(), &name).await;
    let both = unique("a").key("b");
    let err = producer.enqueue_with(job(1, &[]), both.clone()).await;
    let err = err.unwrap_err().to_string();
    assert!(err.starts_with("invalid setting `unique`: "), "{err}");
    let err = producer.enqueue_batch_with(&[(job(1, &[]), both)]).await;
    let err = err.unwrap_err().to_string();
    assert!(err.starts_with("invalid setting `unique`: "), "{err}");
    // The same value for both is one key.
    producer
        .enqueue_with(job(2, &[]), unique("a").key("a"))
        .await
        .unwrap();
    assert_eq!(held(&server, &name, "a").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_task_no_longer_exists_is_taken_over() {
    let server = RedisServer::start();
    let name = unique_name("unique-stale");
    let producer = producer(&server.url(), &name).await;
    let gone = producer
        .enqueue_with(job(1, &[]), unique("orphan"))
        .await
        .unwrap();
    refused(&producer, job(2, &[]), "orphan", &gone).await;
    // An operator deletes the waiting entry (or an older version moved the
    // task without its lock): the lock names an entry that is gone.
    let p = partition_of(b"orphan", P);
    let stream = format!("{{{name}/{p}}}:stream");
    let mut conn = server.pool().get().await.unwrap();
    let entries: Vec<(String, BTreeMap<String, String>)> = redis::cmd("XRANGE")
        .arg(&stream)
        .arg("-")
        .arg("+")
        .query_async(&mut conn)
        .await
        .unwrap();
    let _: () = redis::cmd("XDEL")
        .arg(&stream)
        .arg(&entries[0].0)
        .query_async(&mut conn)
        .await
        .unwrap();
    let next = producer
        .enqueue_with(job(3, &[]), unique("orphan"))
        .await
        .unwrap();
    refused(&producer, job(4, &[]), "orphan", &next).await;
    // A delayed holder whose member is gone likewise.
    let later = unique("later").delay(Duration::from_secs(60));
    let first = producer.enqueue_with(job(5, &[]), later.clone()).await;
    let first = first.unwrap();
    refused(&producer, job(6, &[]), "later", &first).await;
    let _: () = redis::cmd("DEL")
        .arg(format!("{{{name}/{}}}:delayed", partition_of(b"later", P)))
        .query_async(&mut conn)
        .await
        .unwrap();
    let again = producer.enqueue_with(job(7, &[]), later).await.unwrap();
    assert_ne!(again, first);
}
