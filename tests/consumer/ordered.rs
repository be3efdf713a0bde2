//! Ordered partitions at their edges, against a real redis-server: an
//! attempt counted in place survives graceful handovers (so `max_attempts`
//! holds), an ack that Redis refused is sent again while the next task of
//! its key waits, and the next owner's re-run says so in its attempt, and a first claim that fails keeps new entries waiting behind
//! the ones other consumers still hold.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis;
use peerq::dead_letters::DeadLetters;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};

use crate::Instance;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);
const P: u32 = 4;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Each run: (instance label, seq, attempt).
type Runs = Arc<Mutex<Vec<(&'static str, u64, u32)>>>;

/// What the handler does with a run.
#[derive(Clone, Copy)]
enum Behaviour {
    Succeed,
    /// Fail, asking for the next attempt after this delay.
    FailAfter(Duration),
}

/// An ordered consumer labelled `label`, logging every run into `runs`.
fn ordered(
    url: &str,
    name: &str,
    label: &'static str,
    runs: &Runs,
    behaviour: Behaviour,
    tune: impl FnOnce(
        peerq::consumer::ConsumerBuilder<Job, BoxedJobService, peerq::Bincode>,
    ) -> peerq::consumer::ConsumerBuilder<Job, BoxedJobService, peerq::Bincode>,
) -> Instance {
    support::init_tracing();
    let runs = runs.clone();
    let service: BoxedJobService =
        tower::util::BoxCloneSyncService::new(tower::service_fn(move |task: Task<Job>| {
            let runs = runs.clone();
            async move {
                let attempt = task.cx.attempt();
                runs.lock()
                    .unwrap()
                    .push((label, task.payload.seq, attempt));
                match behaviour {
                    Behaviour::Succeed => Ok(()),
                    Behaviour::FailAfter(delay) => {
                        Err(HandlerError::msg("always fails").retry_after(delay))
                    }
                }
            }
        }));
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .ordered(true)
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(tune(builder).run_until(stop.clone().cancelled_owned()));
    Instance { stop, task }
}

type BoxedJobService = tower::util::BoxCloneSyncService<Task<Job>, (), HandlerError>;

async fn producer(url: &str, name: &str) -> Producer {
    Producer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .connect()
        .await
        .unwrap()
}

fn attempts(runs: &Runs, seq: u64) -> Vec<u32> {
    let runs = runs.lock().unwrap();
    runs.iter().filter(|r| r.1 == seq).map(|r| r.2).collect()
}

async fn pending(server: &RedisServer, name: &str, p: u32) -> usize {
    let mut conn = server.pool().get().await.unwrap();
    let stream = format!("{{{name}/{p}}}:stream");
    let reply: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
        .arg(&stream)
        .arg("peerq")
        .query_async(&mut *conn)
        .await
        .unwrap();
    reply.count()
}

/// An ACL user `worker` (password `pw`) with every right but `denied`.
async fn user_without(server: &RedisServer, denied: &str) -> String {
    let mut conn = server.pool().get().await.unwrap();
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("worker")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg(format!("-{denied}"))
        .query_async(&mut *conn)
        .await
        .unwrap();
    format!("redis://worker:pw@127.0.0.1:{}/", server.port())
}

async fn grant(server: &RedisServer, command: &str) {
    let mut conn = server.pool().get().await.unwrap();
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("worker")
        .arg(format!("+{command}"))
        .query_async(&mut *conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_retry_keeps_counting_across_graceful_handovers_until_the_dead_letters() {
    let server = RedisServer::start();
    let name = unique_name("ordered-attempts");
    let runs: Runs = Arc::default();
    // Enough attempts (0.7 s apart) that the partition moves mid-retry
    // even when a's leave takes two intervals.
    const MAX: u32 = 12;
    let start = |label| {
        ordered(
            server.url().as_str(),
            &name,
            label,
            &runs,
            Behaviour::FailAfter(700 * MS),
            |b| b.max_attempts(MAX),
        )
    };
    let a = start("a");
    let producer = producer(&server.url(), &name).await;
    producer.enqueue(&Job { seq: 1 }).await.unwrap();
    wait_until(Duration::from_secs(15), "two attempts on a", || {
        attempts(&runs, 1).len() >= 2
    })
    .await;
    // b joins and a leaves: the partition moves to b, mid-retry.
    let b = start("b");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.leave().await;
    wait_until(Duration::from_secs(15), "five attempts", || {
        attempts(&runs, 1).len() >= 5
    })
    .await;
    // c joins and b leaves: it moves once more.
    let c = start("c");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    b.leave().await;
    let letters = DeadLetters::connect(&server.url(), &name).await.unwrap();
    wait_until(
        Duration::from_secs(30),
        "the task in the dead letters",
        || attempts(&runs, 1).len() >= MAX as usize,
    )
    .await;
    // Give a wrongly continued count time to show more runs.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    c.leave().await;

    let log = runs.lock().unwrap().clone();
    println!("runs (instance, seq, attempt): {log:?}");
    let seen = attempts(&runs, 1);
    assert_eq!(
        seen,
        (1..=MAX).collect::<Vec<_>>(),
        "every attempt once, in order, across the handovers"
    );
    let instances: std::collections::BTreeSet<_> = log.iter().map(|r| r.0).collect();
    assert!(
        instances.len() >= 2,
        "the partition never moved mid-retry: {log:?}"
    );
    let dead = letters.list(10).await.unwrap();
    assert_eq!(dead.len(), 1, "dead-lettered once");
    assert_eq!(dead[0].reason, "failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_task_whose_ack_redis_refused_runs_again_only_on_the_next_owner_with_a_higher_attempt()
 {
    let server = RedisServer::start();
    let name = unique_name("ordered-refused");
    let runs: Runs = Arc::default();
    // Redis refuses every ack of a's user.
    let url = user_without(&server, "xack").await;
    let a = ordered(&url, &name, "a", &runs, Behaviour::Succeed, |b| b);
    let producer = producer(&server.url(), &name).await;
    for seq in 1..=2 {
        producer
            .enqueue_with(Job { seq }, Options::new().key("k"))
            .await
            .unwrap();
    }
    wait_until(Duration::from_secs(15), "a to run seq 1", || {
        !attempts(&runs, 1).is_empty()
    })
    .await;
    wait_refused(&server, "xack").await;
    // a sends the ack again and again; meanwhile it neither runs the task
    // again nor starts the next one of its key, which must not run before
    // it has been acked.
    tokio::time::sleep(1500 * MS).await;
    assert_eq!(attempts(&runs, 1), [1], "a ran seq 1 once");
    assert!(attempts(&runs, 2).is_empty(), "seq 2 waits for seq 1's ack");
    a.leave().await;
    let p = peerq::partition_of(b"k", P);
    assert_eq!(pending(&server, &name, p).await, 1, "seq 1 left pending");

    // The next owner may ack: it runs seq 1 again, saying it may have run,
    // then seq 2.
    let b = ordered(&server.url(), &name, "b", &runs, Behaviour::Succeed, |b| b);
    wait_until(Duration::from_secs(15), "b to run both", || {
        attempts(&runs, 2).len() == 1
    })
    .await;
    b.leave().await;
    let seen = runs.lock().unwrap().clone();
    println!("runs of a task whose acks were refused: {seen:?}");
    assert_eq!(seen, [("a", 1, 1), ("b", 1, 2), ("b", 2, 1)]);
    assert_eq!(pending(&server, &name, p).await, 0, "acked in the end");
}

/// Waits until Redis has logged a refused `command`.
async fn wait_refused(server: &RedisServer, command: &str) {
    let mut conn = server.pool().get().await.unwrap();
    for _ in 0..500 {
        let log: Vec<redis::Value> = redis::cmd("ACL")
            .arg("LOG")
            .query_async(&mut *conn)
            .await
            .unwrap();
        if format!("{log:?}").contains(command) {
            return;
        }
        tokio::time::sleep(20 * MS).await;
    }
    panic!("Redis never refused {command}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_partition_reads_nothing_new_before_its_first_claim_went_through() {
    let server = RedisServer::start();
    let name = unique_name("ordered-claim");
    let producer = producer(&server.url(), &name).await;
    let p = peerq::partition_of(b"k", P);
    let stream = format!("{{{name}/{p}}}:stream");
    let mut conn = server.pool().get().await.unwrap();
    let () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg("peerq")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut *conn)
        .await
        .unwrap();
    for seq in 0..2u64 {
        producer
            .enqueue_with(Job { seq }, Options::new().key("k"))
            .await
            .unwrap();
    }
    // An earlier owner that is gone holds the first two.
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("peerq")
        .arg("gone-instance")
        .arg("COUNT")
        .arg(2)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut *conn)
        .await
        .unwrap();
    for seq in 2..4u64 {
        producer
            .enqueue_with(Job { seq }, Options::new().key("k"))
            .await
            .unwrap();
    }
    // The new owner's claims fail until XAUTOCLAIM is granted.
    let url = user_without(&server, "xautoclaim").await;
    let runs: Runs = Arc::default();
    let consumer = ordered(&url, &name, "a", &runs, Behaviour::Succeed, |b| {
        b.claim_idle(Duration::from_secs(3))
    });
    // It acquires the partition (records itself as owner) within two
    // intervals; its claims fail, so it must read nothing new.
    let owner = format!("{{{name}/{p}}}:owner");
    for _ in 0..100 {
        let recorded: Option<String> = redis::cmd("GET")
            .arg(&owner)
            .query_async(&mut *conn)
            .await
            .unwrap();
        if recorded.is_some() {
            break;
        }
        tokio::time::sleep(100 * MS).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let refusals: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut *conn)
        .await
        .unwrap();
    assert!(!refusals.is_empty(), "its claims were refused");
    assert!(
        runs.lock().unwrap().is_empty(),
        "nothing ran while the first claim failed: {:?}",
        runs.lock().unwrap()
    );
    grant(&server, "xautoclaim").await;
    wait_until(Duration::from_secs(15), "the four tasks", || {
        runs.lock().unwrap().len() >= 4
    })
    .await;
    consumer.leave().await;
    let order: Vec<u64> = runs.lock().unwrap().iter().map(|r| r.1).collect();
    assert_eq!(
        order,
        vec![0, 1, 2, 3],
        "the held entries first, though the claim failed at first"
    );
}
