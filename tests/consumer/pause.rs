//! Pausing a service (docs/design.md §7) with in-process consumers against
//! a real redis-server: an ordered partition keeps its order across a pause
//! and a handover made while paused; a retry in place waits for the
//! resume; an instance whose pause watcher cannot read the pause key (an
//! ACL taken away mid-run) keeps its last answer, paused or running.
//! (Concurrent partitions, with processes that join and leave while
//! paused: the `scenarios` binary.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};

use crate::Instance;
use tokio_util::sync::CancellationToken;

const P: u32 = 4;
const KEYS: u64 = 8;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    key: u64,
    seq: u64,
}

/// Each run: (instance label, key, seq, attempt).
type Runs = Arc<Mutex<Vec<(&'static str, u64, u64, u32)>>>;

type JobService = tower::util::BoxCloneSyncService<Task<Job>, (), HandlerError>;

/// A service that logs each run and takes 5 ms; the first attempt of seq
/// `fail_seq` fails and is retried in place after 2 s (longer than an
/// instance takes to see a pause).
fn logging(label: &'static str, runs: &Runs, fail_seq: Option<u64>) -> JobService {
    let runs = runs.clone();
    tower::util::BoxCloneSyncService::new(tower::service_fn(move |task: Task<Job>| {
        let runs = runs.clone();
        async move {
            let (job, attempt) = (task.payload, task.cx.attempt());
            runs.lock()
                .unwrap()
                .push((label, job.key, job.seq, attempt));
            tokio::time::sleep(Duration::from_millis(5)).await;
            if Some(job.seq) == fail_seq && attempt == 1 {
                let retry = Duration::from_secs(2);
                return Err(HandlerError::msg("first attempt fails").retry_after(retry));
            }
            Ok(())
        }
    }))
}

fn start(builder: peerq::consumer::ConsumerBuilder<Job, JobService, peerq::Bincode>) -> Instance {
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    Instance { stop, task }
}

/// An ordered consumer of `P` partitions, [`logging`] its runs.
fn ordered(url: &str, name: &str, label: &'static str, runs: &Runs, fail_seq: u64) -> Instance {
    support::init_tracing();
    start(
        Consumer::builder()
            .name(name)
            .redis(url)
            .partitions(P)
            .ordered(true)
            .service(logging(label, runs, Some(fail_seq))),
    )
}

async fn set_paused(server: &RedisServer, name: &str, paused: bool) {
    let mut conn = server.pool().get().await.unwrap();
    let key = format!("{{{name}}}:paused");
    if paused {
        let () = redis::cmd("SET")
            .arg(&key)
            .arg(r#"{"at_ms":0,"by":"test"}"#)
            .query_async(&mut *conn)
            .await
            .unwrap();
    } else {
        let _: u64 = redis::cmd("DEL")
            .arg(&key)
            .query_async(&mut *conn)
            .await
            .unwrap();
    }
}

/// A producer of service `name`, as the default user.
async fn producer(server: &RedisServer, name: &str) -> Producer {
    Producer::builder()
        .name(name)
        .redis(server.url())
        .partitions(P)
        .connect()
        .await
        .unwrap()
}

async fn enqueue(producer: &Producer, seqs: std::ops::Range<u64>) {
    for seq in seqs {
        let job = Job {
            key: seq % KEYS,
            seq,
        };
        let key = format!("k{}", job.key);
        producer
            .enqueue_with(job, Options::new().key(key))
            .await
            .unwrap();
    }
}

fn runs_of(runs: &Runs) -> Vec<(&'static str, u64, u64, u32)> {
    runs.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_partition_keeps_its_order_across_a_pause_and_a_handover_while_paused() {
    let server = RedisServer::start();
    let name = unique_name("paused-ordered");
    let runs: Runs = Arc::default();
    // Seq 30's first attempt fails: its retry in place is due while paused.
    const FAIL: u64 = 30;
    let a = ordered(&server.url(), &name, "a", &runs, FAIL);
    let producer = producer(&server, &name).await;
    enqueue(&producer, 0..31).await;
    wait_until(Duration::from_secs(15), "seq 30's first attempt", || {
        runs_of(&runs).iter().any(|r| r.2 == FAIL)
    })
    .await;
    set_paused(&server, &name, true).await;
    // Seen within one interval (1 s); then nothing more starts.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let before = runs_of(&runs).len();
    enqueue(&producer, 31..200).await;
    // A handover while paused: b joins and a leaves.
    let b = ordered(&server.url(), &name, "b", &runs, FAIL);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.leave().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let paused_runs = runs_of(&runs)[before..].to_vec();
    assert!(
        paused_runs.is_empty(),
        "handlers ran while paused: {paused_runs:?}"
    );
    set_paused(&server, &name, false).await;
    wait_until(Duration::from_secs(20), "every task handled", || {
        let runs = runs_of(&runs);
        (0..200).all(|seq| runs.iter().any(|r| r.2 == seq && (seq != FAIL || r.3 == 2)))
    })
    .await;
    b.leave().await;

    let runs = runs_of(&runs);
    let mut by_key: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (_, key, seq, attempt) in &runs {
        by_key.entry(*key).or_default().push(*seq);
        // An entry read while paused and left pending by the handover never
        // started: its release takes back the delivery its read counted, so
        // it runs as attempt 1 on the next owner (docs/design.md §6, ordered
        // partitions). Only the failed one runs again, as attempt 2.
        let want = if *seq == FAIL { *attempt } else { 1 };
        assert_eq!(*attempt, want, "seq {seq} ran as attempt {attempt}");
    }
    for (key, seen) in &by_key {
        let want: Vec<u64> = (0..200)
            .filter(|s| s % KEYS == *key)
            .flat_map(|s| if s == FAIL { vec![s, s] } else { vec![s] })
            .collect();
        assert_eq!(
            seen, &want,
            "key {key}: each task once, in enqueue order, seq {FAIL} retried in place after the resume"
        );
    }
    let retried = runs.iter().filter(|r| r.2 == FAIL).nth(1).unwrap();
    assert!(retried.3 >= 2, "the retry is a later attempt: {retried:?}");
    assert_eq!(retried.0, "b", "the retry waited through the handover");
}

/// A consumer of one partition whose idle read blocks 4 s, with claims of
/// what stays pending 600 ms: a pause longer than `claim_idle` begins while
/// that read is open.
fn one_partition(url: &str, name: &str, ordered: bool, runs: &Runs) -> Instance {
    support::init_tracing();
    start(
        Consumer::builder()
            .name(name)
            .redis(url)
            .partitions(1)
            .ordered(ordered)
            .interval(Duration::from_secs(5))
            .block(Duration::from_secs(4))
            .claim_idle(Duration::from_millis(600))
            .service(logging("a", runs, None)),
    )
}

/// Issue 36, item 1: an entry the idle read delivers after the pause began
/// is held (kept fresh, known to the claims) from the moment the read
/// returns, so the paused loop's claims of what stays idle for `claim_idle`
/// never take it over: every task runs once, as attempt 1.
async fn a_pause_longer_than_claim_idle_runs_each_task_once(ordered: bool) {
    let server = RedisServer::start();
    let name = unique_name(if ordered {
        "long-pause-ordered"
    } else {
        "long-pause"
    });
    let runs: Runs = Arc::default();
    let consumer = one_partition(&server.url(), &name, ordered, &runs);
    let producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(1)
        .connect()
        .await
        .unwrap();
    let enqueue = |seq: u64| {
        let producer = &producer;
        async move {
            producer.enqueue(&Job { key: 0, seq }).await.unwrap();
        }
    };
    enqueue(0).await;
    // The first assignment comes one to two intervals (5 s) after start.
    wait_until(Duration::from_secs(20), "seq 0 ran", || {
        !runs.lock().unwrap().is_empty()
    })
    .await;
    // The partition is read out and waits in the idle read (4 s blocks).
    tokio::time::sleep(Duration::from_millis(200)).await;
    set_paused(&server, &name, true).await;
    // The pause watcher reads the key every second.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    enqueue(1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    enqueue(2).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during: Vec<_> = runs.lock().unwrap()[1..].to_vec();
    assert!(during.is_empty(), "ran while paused: {during:?}");
    set_paused(&server, &name, false).await;
    wait_until(Duration::from_secs(10), "seqs 1 and 2 ran", || {
        let runs = runs.lock().unwrap();
        [1, 2].iter().all(|seq| runs.iter().any(|r| r.2 == *seq))
    })
    .await;
    // Time for a second run, if one were coming (claims every 200 ms).
    tokio::time::sleep(Duration::from_secs(2)).await;
    consumer.leave().await;
    let mut seen: Vec<(u64, u32)> = runs_of(&runs).iter().map(|r| (r.2, r.3)).collect();
    seen.sort();
    assert_eq!(
        seen,
        [(0, 1), (1, 1), (2, 1)],
        "each task once, as attempt 1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_longer_than_claim_idle_runs_each_concurrent_task_once() {
    a_pause_longer_than_claim_idle_runs_each_task_once(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_longer_than_claim_idle_runs_each_ordered_task_once() {
    a_pause_longer_than_claim_idle_runs_each_task_once(true).await;
}

/// The user the consumers of the watcher tests log in as.
const USER: &str = "watcher";
const PASSWORD: &str = "w4tcher-pw";

/// Gives [`USER`] every command on service `name`'s keys; with `paused`
/// false, every key but `{name}:paused` (a glob for "anything else": Redis
/// key patterns only allow), so the pause watcher's `GET` is refused and
/// nothing else is.
fn grant(server: &RedisServer, name: &str, paused: bool) {
    let keys = if paused {
        format!("~{{{name}}}:*")
    } else {
        [
            "[^p]",
            "p[^a]",
            "pa[^u]",
            "pau[^s]",
            "paus[^e]",
            "pause[^d]",
            "paused?",
        ]
        .map(|head| format!("~{{{name}}}:{head}*"))
        .join(" ")
    };
    server.acl_setuser(&format!(
        "{USER} on >{PASSWORD} resetkeys ~{{{name}/*}}:* {keys} +@all"
    ));
}

/// How many reads of `{name}:paused` Redis refused [`USER`] (its ACL log).
async fn refused_reads(server: &RedisServer, name: &str) -> u64 {
    let mut conn = server.pool().get().await.unwrap();
    let log: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .arg(1000)
        .query_async(&mut *conn)
        .await
        .unwrap();
    let text = |entry: &std::collections::HashMap<String, redis::Value>, field: &str| {
        redis::from_redis_value_ref::<String>(&entry[field]).unwrap()
    };
    log.iter()
        .filter(|e| {
            text(e, "username") == USER && text(e, "object") == format!("{{{name}}}:paused")
        })
        .map(|e| redis::from_redis_value_ref::<u64>(&e["count"]).unwrap())
        .sum()
}

/// A consumer of service `name` logged in as [`USER`], that has run one
/// task (so its pause watcher has had an answer), and its producer.
async fn watched(server: &RedisServer, name: &str, runs: &Runs) -> (Instance, Producer) {
    grant(server, name, true);
    let a = ordered(&server.url_as(USER, PASSWORD), name, "a", runs, u64::MAX);
    let producer = producer(server, name).await;
    enqueue(&producer, 0..1).await;
    wait_until(Duration::from_secs(15), "the first task", || {
        !runs_of(runs).is_empty()
    })
    .await;
    (a, producer)
}

/// The pause watcher keeps its last answer while Redis refuses its read: a
/// paused service stays paused (docs/design.md §7). The read is refused by
/// an ACL taken away mid-run, and Redis's ACL log shows the refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_service_stays_paused_while_its_pause_key_cannot_be_read() {
    let readings = support::recorder::install();
    let server = RedisServer::start();
    let name = unique_name("paused-unread");
    let runs: Runs = Arc::default();
    let (a, producer) = watched(&server, &name, &runs).await;
    set_paused(&server, &name, true).await;
    let paused = || readings.gauge("peerq_paused", &[("service", &name)]) == 1.0;
    wait_until(
        Duration::from_secs(10),
        "the instance to see the pause",
        paused,
    )
    .await;
    grant(&server, &name, false);
    let refused = || async { refused_reads(&server, &name).await };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while refused().await == 0 {
        assert!(std::time::Instant::now() < deadline, "no read was refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    enqueue(&producer, 1..2).await;
    // Two more refused reads, a period apart: two more chances to change
    // its mind.
    let seen = refused().await;
    while refused().await < seen + 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the watcher stopped reading"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ran = runs_of(&runs);
    assert_eq!(ran.len(), 1, "a task started while paused: {ran:?}");
    assert!(paused(), "the gauge still says paused");
    // Readable again and resumed: it runs.
    grant(&server, &name, true);
    set_paused(&server, &name, false).await;
    wait_until(Duration::from_secs(10), "the task after the resume", || {
        runs_of(&runs).len() == 2
    })
    .await;
    a.leave().await;
}

/// The symmetric case: a running service keeps running while its pause
/// key cannot be read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_service_keeps_running_while_its_pause_key_cannot_be_read() {
    let server = RedisServer::start();
    let name = unique_name("running-unread");
    let runs: Runs = Arc::default();
    let (a, producer) = watched(&server, &name, &runs).await;
    grant(&server, &name, false);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while refused_reads(&server, &name).await == 0 {
        assert!(std::time::Instant::now() < deadline, "no read was refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    enqueue(&producer, 1..4).await;
    wait_until(Duration::from_secs(10), "the tasks enqueued after", || {
        runs_of(&runs).len() == 4
    })
    .await;
    a.leave().await;
}
