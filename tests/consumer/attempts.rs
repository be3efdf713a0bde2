//! Attempt numbers and the failure budget across handovers, against a real
//! redis-server (docs/design.md §6, attempt counting): a run interrupted by
//! a drain counts as an attempt (`attempt > 1` means "may have run
//! before") but spends none of `max_attempts`, which only failures spend,
//! in both modes; and an ordered entry released before it started runs on
//! the next owner with the attempt it would have run here, while one
//! released during its backoff runs with the next attempt and keeps its
//! failures.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis;
use peerq::dead_letters::DeadLetters;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError, TaskContext};
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

/// One run: which instance ran which task, with what the context said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    label: &'static str,
    seq: u64,
    attempt: u32,
    failures: u32,
}

type Runs = Arc<Mutex<Vec<Run>>>;

type Reply = Pin<Box<dyn Future<Output = Result<(), HandlerError>> + Send>>;

/// What an instance's handler does with a run (the run is logged first).
type Behaviour = Arc<dyn Fn(u64, TaskContext) -> Reply + Send + Sync>;

type JobService = tower::util::BoxCloneSyncService<Task<Job>, (), HandlerError>;
type Builder = peerq::consumer::ConsumerBuilder<Job, JobService, peerq::Bincode>;

/// A consumer labelled `label` whose runs go to `runs` and then to
/// `behaviour`.
fn start(
    url: &str,
    name: &str,
    label: &'static str,
    runs: &Runs,
    behaviour: Behaviour,
    tune: impl FnOnce(Builder) -> Builder,
) -> Instance {
    support::init_tracing();
    let runs = runs.clone();
    let service: JobService =
        tower::util::BoxCloneSyncService::new(tower::service_fn(move |task: Task<Job>| {
            let cx = task.cx;
            runs.lock().unwrap().push(Run {
                label,
                seq: task.payload.seq,
                attempt: cx.attempt(),
                failures: cx.failures(),
            });
            behaviour(task.payload.seq, cx)
        }));
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(tune(builder).run_until(stop.clone().cancelled_owned()));
    Instance { stop, task }
}

fn succeed() -> Behaviour {
    Arc::new(|_, _| Box::pin(async { Ok(()) }))
}

/// Holds the run until it is interrupted (its stop signal fires), then
/// gives up with an error, which counts as interrupted, not failed.
async fn until_interrupted(cx: TaskContext) -> Result<(), HandlerError> {
    cx.cancelled().await;
    Err(HandlerError::msg("interrupted, gave up"))
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

async fn enqueue(producer: &Producer, seq: u64, key: &str) {
    producer
        .enqueue_with(Job { seq }, Options::new().key(key))
        .await
        .unwrap();
}

fn runs_of(runs: &Runs, seq: u64) -> Vec<Run> {
    let runs = runs.lock().unwrap();
    runs.iter().filter(|r| r.seq == seq).copied().collect()
}

/// Each run of task `seq`: (instance, attempt, failures).
fn counts(runs: &Runs, seq: u64) -> Vec<(&'static str, u32, u32)> {
    let seen = runs_of(runs, seq);
    println!("runs of {seq}: {seen:?}");
    seen.iter()
        .map(|r| (r.label, r.attempt, r.failures))
        .collect()
}

/// Waits for the service's dead letter, the only one: its reason,
/// attempts and failures.
async fn the_dead_letter(url: &str, name: &str) -> (String, u32, u32) {
    let letters = DeadLetters::connect(url, name).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let dead = loop {
        let dead = letters.list(10).await.unwrap();
        if !dead.is_empty() {
            break dead;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the dead letter"
        );
        tokio::time::sleep(20 * MS).await;
    };
    assert_eq!(dead.len(), 1, "{dead:?}");
    (dead[0].reason.clone(), dead[0].attempts, dead[0].failures)
}

/// Polls `done` (which asks Redis) every 20 ms until it holds; panics after
/// `within`, naming `what`.
async fn eventually<F: Future<Output = bool>>(
    within: Duration,
    what: &str,
    mut done: impl FnMut() -> F,
) {
    let deadline = tokio::time::Instant::now() + within;
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(20 * MS).await;
    }
}

async fn query<T: redis::FromRedisValue>(server: &RedisServer, cmd: &mut redis::Cmd) -> T {
    let mut conn = server.pool().get().await.unwrap();
    cmd.query_async(&mut *conn).await.unwrap()
}

/// The instances in the service's members record.
async fn members(server: &RedisServer, name: &str) -> usize {
    query(
        server,
        redis::cmd("HLEN").arg(format!("{{{name}}}:members")),
    )
    .await
}

/// Once the instance started after `previous` is a member too (counted in
/// the rounds), lets `previous` leave: its partitions move to the other
/// through marks.
async fn hand_over(server: &RedisServer, name: &str, previous: Instance) {
    eventually(
        Duration::from_secs(15),
        "the next instance joins",
        || async { members(server, name).await == 2 },
    )
    .await;
    previous.leave().await;
}

/// The entries pending in partition `p`.
async fn pending(server: &RedisServer, name: &str, p: u32) -> usize {
    let reply: redis::streams::StreamPendingReply = query(
        server,
        redis::cmd("XPENDING")
            .arg(format!("{{{name}/{p}}}:stream"))
            .arg("peerq"),
    )
    .await;
    reply.count()
}

/// Keys that place tasks in `n` different partitions.
fn keys_in_partitions(n: usize) -> Vec<(String, u32)> {
    let mut found: Vec<(String, u32)> = Vec::new();
    for i in 0.. {
        let key = format!("k{i}");
        let p = peerq::partition_of(key.as_bytes(), P);
        if found.iter().all(|(_, q)| *q != p) {
            found.push((key, p));
        }
        if found.len() == n {
            break;
        }
    }
    found
}

/// `max_attempts` 2; the task's first two runs are interrupted at the
/// drains of two graceful leaves (a → b → c); its third run fails, and is
/// retried, although attempt 3 is past `max_attempts`; its fourth fails
/// too, its second failure, and it is dead-lettered.
async fn interrupted_twice_then_failing(ordered: bool) {
    let server = RedisServer::start();
    let name = unique_name(if ordered {
        "budget-ordered"
    } else {
        "budget-concurrent"
    });
    let runs: Runs = Arc::default();
    let behaviour: Behaviour = Arc::new(|_, cx: TaskContext| {
        Box::pin(async move {
            if cx.attempt() <= 2 {
                return until_interrupted(cx).await;
            }
            Err(HandlerError::msg("it fails").retry_after(50 * MS))
        })
    });
    let start = |label| {
        start(&server.url(), &name, label, &runs, behaviour.clone(), |b| {
            b.ordered(ordered).max_attempts(2).drain_timeout(300 * MS)
        })
    };
    let a = start("a");
    let producer = producer(&server.url(), &name).await;
    enqueue(&producer, 1, "k").await;
    let ran = |attempt: u32| {
        let runs = runs.clone();
        move || runs_of(&runs, 1).iter().any(|r| r.attempt == attempt)
    };
    wait_until(Duration::from_secs(15), "attempt 1 on a", ran(1)).await;
    let b = start("b");
    hand_over(&server, &name, a).await;
    wait_until(Duration::from_secs(15), "attempt 2 on b", ran(2)).await;
    let c = start("c");
    hand_over(&server, &name, b).await;
    let dead = the_dead_letter(&server.url(), &name).await;
    let p = peerq::partition_of(b"k", P);
    let failures_key = format!("{{{name}/{p}}}:failures");
    // Ordered: the failure count is forgotten once the entry left (at the
    // partition's next trim); concurrent: it was never written.
    eventually(
        Duration::from_secs(10),
        "no failure counts left",
        || async {
            let left: bool = query(&server, redis::cmd("EXISTS").arg(&failures_key)).await;
            !left
        },
    )
    .await;
    c.leave().await;

    assert_eq!(
        counts(&runs, 1),
        vec![("a", 1, 0), ("b", 2, 0), ("c", 3, 0), ("c", 4, 1)],
        "the interrupted runs count as attempts, not as failures: the first failure is retried"
    );
    assert_eq!(
        dead,
        ("failed".to_owned(), 4, 2),
        "dead-lettered at its second failure, as max_attempts says"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_runs_spend_no_attempts_of_the_budget_concurrent() {
    interrupted_twice_then_failing(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_runs_spend_no_attempts_of_the_budget_ordered() {
    interrupted_twice_then_failing(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_entry_released_before_it_started_runs_next_as_the_same_attempt() {
    let server = RedisServer::start();
    let name = unique_name("ordered-unstarted");
    let runs: Runs = Arc::default();
    let keys = keys_in_partitions(3);
    let [(z_key, _), (x_key, x_p), (y_key, y_p)] = &keys[..] else {
        unreachable!()
    };
    const Z: u64 = 0;
    // a runs one task at a time (concurrency 1). Z holds the one permit
    // until the test lets it go; any other task holds it until interrupted.
    let let_z_go = CancellationToken::new();
    let z_go = let_z_go.clone();
    let behaviour: Behaviour = Arc::new(move |seq, cx| {
        let z_go = z_go.clone();
        Box::pin(async move {
            if seq == Z {
                z_go.cancelled().await;
                return Ok(());
            }
            until_interrupted(cx).await
        })
    });
    let a = start(&server.url(), &name, "a", &runs, behaviour, |b| {
        b.ordered(true)
            .concurrency(1)
            .claim_idle(Duration::from_secs(300))
    });
    let producer = producer(&server.url(), &name).await;
    // Every partition has read its stream out and waits in the idle read,
    // blocked on the server (its first reads, a few ms after acquiring,
    // are over). Were X's partition still reading for itself when X
    // arrives, it would fetch X and wait for the permit ahead of the idle
    // read, and Y would stay unread: "no blocked read" below also holds
    // before the idle read was ever sent.
    let blocked = || async {
        let info: String = query(&server, redis::cmd("INFO").arg("clients")).await;
        info.lines().any(|l| l.trim() == "blocked_clients:1")
    };
    eventually(Duration::from_secs(15), "the idle read blocked", blocked).await;
    tokio::time::sleep(300 * MS).await;
    eventually(
        Duration::from_secs(5),
        "the idle read blocked still",
        blocked,
    )
    .await;
    enqueue(&producer, Z, z_key).await;
    wait_until(Duration::from_secs(15), "Z runs on a", || {
        !runs_of(&runs, Z).is_empty()
    })
    .await;
    // With no room, a sends no new read; the one in flight ends by its
    // block time. Then X and Y arrive, unread.
    eventually(Duration::from_secs(10), "no blocked read", || async {
        let info: String = query(&server, redis::cmd("INFO").arg("clients")).await;
        info.lines().any(|l| l.trim() == "blocked_clients:0")
    })
    .await;
    enqueue(&producer, 1, x_key).await;
    enqueue(&producer, 2, y_key).await;
    // Z ends: the reads that waited for room read X and Y at once; one
    // takes the permit and runs (until a's leave interrupts it), the other
    // waits for the permit, fetched and never started.
    let_z_go.cancel();
    let started = || {
        let runs = runs.lock().unwrap();
        runs.iter().filter(|r| r.seq != Z).count()
    };
    eventually(Duration::from_secs(10), "X and Y on a", || async {
        started() == 1
            && pending(&server, &name, *x_p).await == 1
            && pending(&server, &name, *y_p).await == 1
    })
    .await;
    let ran_on_a = runs
        .lock()
        .unwrap()
        .iter()
        .find(|r| r.seq != Z)
        .unwrap()
        .seq;
    let unstarted = if ran_on_a == 1 { 2 } else { 1 };
    // a leaves: both partitions are released, one run is interrupted at
    // the drain timeout, the other entry never started.
    a.leave().await;
    let b = start(&server.url(), &name, "b", &runs, succeed(), |b| {
        b.ordered(true)
    });
    wait_until(Duration::from_secs(15), "X and Y on b", || {
        let runs = runs.lock().unwrap();
        runs.iter().filter(|r| r.label == "b").count() == 2
    })
    .await;
    b.leave().await;

    let log = runs.lock().unwrap().clone();
    println!("runs: {log:?}");
    assert_eq!(started(), 3, "one run on a, two on b: {log:?}");
    let on_b = |seq| runs_of(&runs, seq).into_iter().find(|r| r.label == "b");
    assert_eq!(
        on_b(ran_on_a).map(|r| r.attempt),
        Some(2),
        "interrupted on a: it may have run, attempt 2"
    );
    assert_eq!(
        on_b(unstarted).map(|r| r.attempt),
        Some(1),
        "released before it started on a: it never ran, attempt 1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_entry_released_during_its_backoff_runs_next_with_the_next_attempt() {
    let server = RedisServer::start();
    let name = unique_name("ordered-backoff");
    let runs: Runs = Arc::default();
    // Attempt 1 fails and is retried soon; attempt 2 fails and waits a
    // minute, in place, when a leaves.
    let behaviour: Behaviour = Arc::new(|_, cx: TaskContext| {
        Box::pin(async move {
            let wait = if cx.attempt() == 1 { 50 } else { 60_000 };
            Err(HandlerError::msg("it fails").retry_after(wait * MS))
        })
    });
    let a = start(&server.url(), &name, "a", &runs, behaviour, |b| {
        b.ordered(true)
    });
    let producer = producer(&server.url(), &name).await;
    enqueue(&producer, 1, "k").await;
    let p = peerq::partition_of(b"k", P);
    let failures_key = format!("{{{name}/{p}}}:failures");
    eventually(Duration::from_secs(15), "two failures on a", || async {
        let recorded: Vec<u32> = query(&server, redis::cmd("HVALS").arg(&failures_key)).await;
        recorded == [2]
    })
    .await;
    a.leave().await;
    let b = start(&server.url(), &name, "b", &runs, succeed(), |b| {
        b.ordered(true)
    });
    wait_until(Duration::from_secs(15), "the task on b", || {
        runs_of(&runs, 1).len() == 3
    })
    .await;
    b.leave().await;

    assert_eq!(
        counts(&runs, 1),
        vec![("a", 1, 0), ("a", 2, 1), ("b", 3, 2)],
        "the next owner continues the attempts and the failures"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_failure_count_survives_a_take_over_and_an_interrupted_run() {
    use peerq::{Bincode, Codec};
    let server = RedisServer::start();
    let name = unique_name("failures-kept");
    let p = peerq::partition_of(b"k", P);
    let stream = format!("{{{name}/{p}}}:stream");
    let () = query(
        &server,
        redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&stream)
            .arg("peerq")
            .arg("0")
            .arg("MKSTREAM"),
    )
    .await;
    // A task that failed once, pending on an instance that is gone.
    let enqueued_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    let payload = Bincode.encode(&Job { seq: 1 }).unwrap();
    let _: String = query(
        &server,
        redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg(&[
                ("id", "t-1"),
                ("key", "k"),
                ("attempt", "1"),
                ("failures", "1"),
            ])
            .arg("enqueued_at")
            .arg(&enqueued_at)
            .arg("codec")
            .arg("bincode")
            .arg("payload")
            .arg(payload),
    )
    .await;
    let _: redis::Value = query(
        &server,
        redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg("peerq")
            .arg("gone-instance")
            .arg("STREAMS")
            .arg(&stream)
            .arg(">"),
    )
    .await;
    let runs: Runs = Arc::default();
    // The run a takes over is interrupted; every later run fails.
    let behaviour: Behaviour = Arc::new(|_, cx: TaskContext| {
        Box::pin(async move {
            if cx.attempt() == 2 {
                return until_interrupted(cx).await;
            }
            Err(HandlerError::msg("it fails").retry_after(50 * MS))
        })
    });
    let start = |label| {
        start(&server.url(), &name, label, &runs, behaviour.clone(), |b| {
            b.max_attempts(3)
        })
    };
    let a = start("a");
    wait_until(Duration::from_secs(15), "the taken-over task on a", || {
        !runs_of(&runs, 1).is_empty()
    })
    .await;
    let b = start("b");
    hand_over(&server, &name, a).await;
    let dead = the_dead_letter(&server.url(), &name).await;
    b.leave().await;

    assert_eq!(
        counts(&runs, 1),
        vec![("a", 2, 1), ("b", 3, 1), ("b", 4, 2)],
        "taken over (it may have run), interrupted, then failing: the first failure is never forgotten"
    );
    assert_eq!(dead, ("failed".to_owned(), 4, 3));
}
