//! Priority levels (docs/design.md §17) with in-process consumers against a
//! real redis-server: high tasks overtake a normal backlog on one instance,
//! a high flood slows the normal level to its guaranteed share but does
//! not stop it, a task keeps its level through a delay, its retries, its
//! dead letter and a replay, and what cannot work together is refused by
//! name. (Levels through joins, leaves and kills: the `scenarios` binary.)

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use peerq::dead_letters::DeadLetters;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Backoff, Consumer, Error, HandlerError, Priority};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

use crate::Instance;

/// Each start: the task, when, its partition and attempt.
type Starts = Arc<Mutex<Vec<(u64, Instant, u32, u32)>>>;

type JobService = tower::util::BoxCloneSyncService<Task<u64>, (), HandlerError>;

const PARTITIONS: u32 = 8;
/// High tasks are numbered from here.
const HIGH: u64 = 1_000_000;
const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

/// A consumer of `name` with every level whose tasks take `work`, record
/// their starts, and fail when `fail` says so.
fn instance(
    url: &str,
    name: &str,
    starts: &Starts,
    work: Duration,
    concurrency: usize,
    fail: fn(u64) -> bool,
) -> Instance {
    support::init_tracing();
    let starts = starts.clone();
    let service = JobService::new(tower::service_fn(move |task: Task<u64>| {
        let starts = starts.clone();
        async move {
            let cx = &task.cx;
            let start = (task.payload, Instant::now(), cx.partition(), cx.attempt());
            starts.lock().unwrap().push(start);
            tokio::time::sleep(work).await;
            match fail(task.payload) {
                true => Err(HandlerError::msg("fails on purpose")),
                false => Ok(()),
            }
        }
    }));
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(PARTITIONS)
        .priorities(ALL)
        .concurrency(concurrency)
        .max_attempts(2)
        .backoff(Backoff::exponential(
            Duration::from_millis(50),
            Duration::from_millis(50),
        ))
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    Instance { stop, task }
}

async fn producer(server: &RedisServer, name: &str) -> Producer {
    Producer::builder()
        .name(name)
        .redis(server.url())
        .partitions(PARTITIONS)
        .priorities(ALL)
        .connect()
        .await
        .unwrap()
}

fn starts_of(starts: &Starts) -> Vec<(u64, Instant, u32, u32)> {
    starts.lock().unwrap().clone()
}

fn at(level: Priority) -> Options {
    Options::new().priority(level)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_tasks_start_within_a_second_behind_a_backlog_of_normal_ones() {
    let server = RedisServer::start();
    let name = unique_name("priority-goal");
    let starts: Starts = Arc::default();
    let producer = producer(&server, &name).await;
    // 40,000 normal tasks of 50 ms: at the default concurrency (64), half a
    // minute of work.
    let backlog: Vec<u64> = (0..40_000).collect();
    for part in backlog.chunks(5_000) {
        producer.enqueue_batch(part).await.unwrap();
    }
    let a = instance(
        &server.url(),
        &name,
        &starts,
        Duration::from_millis(50),
        peerq::consumer::DEFAULT_CONCURRENCY,
        |_| false,
    );
    wait_until(Duration::from_secs(15), "the backlog running", || {
        starts_of(&starts).len() >= 1_000
    })
    .await;
    let high: Vec<(u64, Options)> = (HIGH..HIGH + 50).map(|t| (t, at(Priority::High))).collect();
    let enqueued = Instant::now();
    producer.enqueue_batch_with(&high).await.unwrap();
    wait_until(Duration::from_secs(10), "every high task started", || {
        starts_of(&starts).iter().filter(|s| s.0 >= HIGH).count() == 50
    })
    .await;
    let seen = starts_of(&starts);
    let latest = seen
        .iter()
        .filter(|s| s.0 >= HIGH)
        .map(|s| s.1.saturating_duration_since(enqueued))
        .max()
        .unwrap();
    let normal = seen.iter().filter(|s| s.0 < HIGH).count();
    println!(
        "50 high tasks started within {latest:?} of their enqueue; normal tasks started by then: {normal} of 40000"
    );
    assert!(
        latest <= Duration::from_secs(1),
        "the last high task started {latest:?} after its enqueue"
    );
    assert!(
        normal < 30_000,
        "the backlog was not waiting: {normal} started"
    );
    // Each at its level's partitions: high is 8..16.
    let places: Vec<u32> = seen.iter().filter(|s| s.0 >= HIGH).map(|s| s.2).collect();
    assert!(
        places
            .iter()
            .all(|p| (PARTITIONS..2 * PARTITIONS).contains(p)),
        "{places:?}"
    );
    a.stop.cancel();
    a.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_high_tasks_slows_the_normal_level_but_does_not_stop_it() {
    let server = RedisServer::start();
    let name = unique_name("priority-guard");
    let starts: Starts = Arc::default();
    let producer = producer(&server, &name).await;
    let high: Vec<(u64, Options)> = (HIGH..HIGH + 1_500)
        .map(|t| (t, at(Priority::High)))
        .collect();
    let normal: Vec<u64> = (0..300).collect();
    producer.enqueue_batch(&normal).await.unwrap();
    producer.enqueue_batch_with(&high).await.unwrap();
    let a = instance(
        &server.url(),
        &name,
        &starts,
        Duration::from_millis(5),
        4,
        |_| false,
    );
    wait_until(Duration::from_secs(20), "every task", || {
        starts_of(&starts).len() == 1_800
    })
    .await;
    let mut seen = starts_of(&starts);
    seen.sort_by_key(|s| s.1);
    // While the high flood lasts (its first 1,000 starts), the normal
    // level gets its share (one permit in ten, at least, more between the
    // high level's reads), and is overtaken: first come, first served,
    // all 300 started among the first 1,000 (measured 161 with levels).
    let window = &seen[..1_000];
    let normal = window.iter().filter(|s| s.0 < HIGH).count();
    println!("normal tasks among the first 1000 starts: {normal} (300 waiting)");
    assert!(normal >= 50, "the normal level starved: {normal} of 1000");
    assert!(
        normal <= 250,
        "normal tasks were not overtaken: {normal} of 1000"
    );
    a.stop.cancel();
    a.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_keeps_its_level_through_a_delay_retries_its_dead_letter_and_a_replay() {
    let server = RedisServer::start();
    let name = unique_name("priority-paths");
    let starts: Starts = Arc::default();
    let producer = producer(&server, &name).await;
    // Fails every time: two attempts, a dead letter; replayed, attempt 1
    // again.
    fn fail(_: u64) -> bool {
        true
    }
    let a = instance(&server.url(), &name, &starts, Duration::ZERO, 8, fail);
    let low = Options::new()
        .key("customer-7")
        .priority(Priority::Low)
        .delay(Duration::from_millis(300));
    let enqueued = Instant::now();
    let id = producer.enqueue_with(7u64, low.clone()).await.unwrap();
    let dead = DeadLetters::connect(server.url(), &name).await.unwrap();
    let began = Instant::now();
    let letter = loop {
        let letters = dead.list(10).await.unwrap();
        if let Some(letter) = letters
            .into_iter()
            .find(|l| l.task_id.as_ref() == Some(&id))
        {
            break letter;
        }
        assert!(began.elapsed() < Duration::from_secs(10), "no dead letter");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let p = peerq::partition_of(b"customer-7", PARTITIONS);
    let low_partition = 2 * PARTITIONS + p;
    let runs = starts_of(&starts);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(
        runs[0].1 >= enqueued + Duration::from_millis(290),
        "ran before its delay"
    );
    assert!(runs.iter().all(|r| r.2 == low_partition), "{runs:?}");
    assert_eq!(letter.partition, low_partition);
    // The handle names the partition of its level.
    let handle = producer.handle_with(&id, &low);
    assert_eq!(handle.partition(), Some(low_partition));
    assert!(dead.replay(&letter).await.unwrap());
    wait_until(Duration::from_secs(10), "the replayed run", || {
        starts_of(&starts).len() >= 3
    })
    .await;
    let replayed = starts_of(&starts)[2];
    assert_eq!((replayed.2, replayed.3), (low_partition, 1));
    a.stop.cancel();
    a.task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_levels_cannot_do_is_refused_by_name() {
    let server = RedisServer::start();
    let name = unique_name("priority-refused");
    let setting = |e: Error| match e {
        Error::InvalidSetting { setting, .. } => setting.to_string(),
        Error::SettingsMismatch { .. } => format!("mismatch: {e}"),
        other => panic!("{other:?}"),
    };
    // Ordered partitions would be overtaken.
    let ordered = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .ordered(true)
        .priorities(ALL)
        .service(JobService::new(tower::service_fn(|_: Task<u64>| async {
            Ok(())
        })))
        .run_until(std::future::ready(()))
        .await
        .unwrap_err();
    assert_eq!(setting(ordered), "priorities");
    // A service without levels has no high one.
    let plain = Producer::connect(server.url(), &name).await.unwrap();
    let refused = plain.enqueue_with(1u64, at(Priority::High)).await;
    assert_eq!(setting(refused.unwrap_err()), "priority");
    let batch = plain
        .enqueue_batch_with(&[(1u64, Options::new()), (2, at(Priority::Low))])
        .await;
    assert_eq!(setting(batch.unwrap_err()), "priority");
    // A unique key's lock lives in the normal level.
    let unique = Options::new().unique("u").priority(Priority::High);
    assert_eq!(
        setting(plain.enqueue_with(1u64, unique).await.unwrap_err()),
        "priority"
    );
    // Once a consumer recorded the levels, a producer connected before
    // them finds them at its next enqueue of a level.
    let other_name = unique_name("priority-late");
    let early = Producer::builder()
        .name(&other_name)
        .redis(server.url())
        .partitions(PARTITIONS)
        .connect()
        .await
        .unwrap();
    let starts: Starts = Arc::default();
    let a = instance(
        &server.url(),
        &other_name,
        &starts,
        Duration::ZERO,
        4,
        |_| false,
    );
    let began = Instant::now();
    loop {
        let mut conn = server.pool().get().await.unwrap();
        let levels: Option<String> = deadpool_redis::redis::cmd("HGET")
            .arg(format!("{{{other_name}}}:meta"))
            .arg("priorities")
            .query_async(&mut *conn)
            .await
            .unwrap();
        if levels.as_deref() == Some("high,normal,low") {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "no levels recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    early.enqueue_with(HIGH, at(Priority::High)).await.unwrap();
    // Levels are service-wide: a producer asking for others is refused.
    let other = Producer::builder()
        .name(&other_name)
        .redis(server.url())
        .partitions(PARTITIONS)
        .priorities([Priority::Normal, Priority::High])
        .connect()
        .await
        .unwrap_err();
    let other = setting(other);
    assert!(other.contains("priorities"), "{other}");
    wait_until(Duration::from_secs(10), "the high task", || {
        starts_of(&starts).iter().any(|s| s.0 == HIGH)
    })
    .await;
    a.stop.cancel();
    a.task.await.unwrap().unwrap();
}
