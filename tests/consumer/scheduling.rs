//! Scheduling (docs/design.md §6) against a real redis-server: delayed tasks run
//! once, when due, also when their partition changes owner meanwhile; a
//! periodic job runs once per due time across several instances while they
//! come and go.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use deadpool_redis::redis;
use peerq::Periodic;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower::util::BoxCloneSyncService;

const MS: Duration = Duration::from_millis(1);
const P: u32 = 8;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// When each seq ran, by the system clock.
type Runs = Arc<Mutex<BTreeMap<u64, Vec<SystemTime>>>>;

fn consumer(
    url: &str,
    name: &str,
    runs: &Runs,
) -> (CancellationToken, JoinHandle<peerq::Result<()>>) {
    consumer_with(url, name, runs, None)
}

/// A producer of the service, with its `P` partitions.
async fn producer(url: &str, name: &str) -> Producer {
    Producer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .connect()
        .await
        .unwrap()
}

/// The ids of the periodic job's runs, with the time each ran.
type Ticks = Arc<Mutex<Vec<(String, SystemTime)>>>;

/// A handler service that records when each task ran: a periodic job's
/// in `ticks`, any other in `runs`.
fn recording(runs: &Runs, ticks: &Ticks) -> BoxCloneSyncService<Task<Job>, (), HandlerError> {
    let (r, t) = (runs.clone(), ticks.clone());
    BoxCloneSyncService::new(tower::service_fn(move |task: Task<Job>| {
        let (r, t) = (r.clone(), t.clone());
        async move {
            let id = task.cx.task_id().as_str().to_owned();
            if id.starts_with("cron:") {
                t.lock().unwrap().push((id, SystemTime::now()));
            } else {
                r.lock()
                    .unwrap()
                    .entry(task.payload.seq)
                    .or_default()
                    .push(SystemTime::now());
            }
            Ok::<(), HandlerError>(())
        }
    }))
}

/// A consumer; with `ticks`, it also registers an every-second job.
fn consumer_with(
    url: &str,
    name: &str,
    runs: &Runs,
    ticks: Option<&Ticks>,
) -> (CancellationToken, JoinHandle<peerq::Result<()>>) {
    support::init_tracing();
    let mut builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .service(recording(runs, &ticks.cloned().unwrap_or_default()));
    if ticks.is_some() {
        let every_second = Periodic::cron("tick", "* * * * * *").unwrap();
        builder = builder.periodic(every_second, &Job { seq: u64::MAX });
    }
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_tasks_run_once_when_due_also_across_a_handover() {
    let server = RedisServer::start();
    let name = unique_name("delayed");
    let runs: Runs = Arc::default();
    let (stop_a, a) = consumer(&server.url(), &name, &runs);
    let producer = producer(&server.url(), &name).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;

    // 40 tasks due 0.5 to 4.4 s from now (a tenth by `at`, the rest by
    // `delay`), spread over the partitions.
    let mut due = BTreeMap::new();
    for seq in 0..40u64 {
        let wait = Duration::from_millis(500 + 100 * seq);
        let options = if seq % 10 == 0 {
            Options::new().at(SystemTime::now() + wait)
        } else {
            Options::new().delay(wait)
        };
        due.insert(seq, SystemTime::now() + wait);
        producer.enqueue_with(Job { seq }, options).await.unwrap();
    }
    // Meanwhile a second instance joins: about half the partitions, and
    // their delayed tasks, move to it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (stop_b, b) = consumer(&server.url(), &name, &runs);
    wait_until(Duration::from_secs(15), "every delayed task", || {
        runs.lock().unwrap().len() == 40
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let runs = runs.lock().unwrap().clone();
    let mut late = Vec::new();
    for (seq, times) in &runs {
        assert_eq!(times.len(), 1, "seq {seq} ran {} times", times.len());
        let due = due[seq];
        // Due by Redis's clock (the same machine's); 10 ms for rounding.
        assert!(
            times[0] + 10 * MS >= due,
            "seq {seq} ran {:?} early",
            due.duration_since(times[0]).unwrap()
        );
        late.push(times[0].duration_since(due).unwrap_or_default());
    }
    late.sort();
    println!(
        "delayed tasks ran after their due time: p50 {:?}, max {:?}",
        late[late.len() / 2],
        late[late.len() - 1]
    );
    assert!(*late.last().unwrap() < Duration::from_millis(2500));
    stop_a.cancel();
    stop_b.cancel();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
}

/// A producer's delayed task is moved when due because its notice in the
/// due index `{N}:due` told the partition's owner; one whose notice was
/// lost (a producer that failed between its two writes, or an older peerq)
/// still runs, after the owner's slow check of its delayed set (every 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_task_runs_when_due_by_its_notice_and_without_one_after_the_slow_check() {
    let server = RedisServer::start();
    let name = unique_name("notice");
    let runs: Runs = Arc::default();
    let (stop, consumer) = consumer(&server.url(), &name, &runs);
    let producer = producer(&server.url(), &name).await;
    // Owned, and the first look at each delayed set done.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut raw = server.connection().await;
    // Due in 10 s: its notice is read only 2 s before, so removing it now
    // means the owner never hears of it.
    let lost_due = SystemTime::now() + Duration::from_secs(10);
    let lost = Options::new().key("lost").delay(Duration::from_secs(10));
    producer.enqueue_with(Job { seq: 1 }, lost).await.unwrap();
    let () = redis::cmd("DEL")
        .arg(format!("{{{name}}}:due"))
        .query_async(&mut raw)
        .await
        .unwrap();
    let kept_due = SystemTime::now() + Duration::from_secs(3);
    let kept = Options::new().key("kept").delay(Duration::from_secs(3));
    producer.enqueue_with(Job { seq: 2 }, kept).await.unwrap();

    wait_until(Duration::from_secs(45), "both delayed tasks", || {
        runs.lock().unwrap().len() == 2
    })
    .await;
    let runs = runs.lock().unwrap().clone();
    let late = |seq: u64, due: SystemTime| {
        assert_eq!(runs[&seq].len(), 1, "seq {seq} ran once");
        let ran = runs[&seq][0];
        assert!(ran + 10 * MS >= due, "seq {seq} ran early");
        ran.duration_since(due).unwrap_or_default()
    };
    let (kept_late, lost_late) = (late(2, kept_due), late(1, lost_due));
    println!("with its notice {kept_late:?} late, without {lost_late:?}");
    assert!(kept_late < Duration::from_millis(500), "{kept_late:?}");
    assert!(lost_late < Duration::from_secs(30), "{lost_late:?}");
    stop.cancel();
    consumer.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_job_runs_once_per_due_time_while_instances_come_and_go() {
    let server = RedisServer::start();
    let name = unique_name("periodic");
    let (runs, ticks): (Runs, Ticks) = Default::default();
    let mut instances: Vec<_> = (0..3)
        .map(|_| consumer_with(&server.url(), &name, &runs, Some(&ticks)))
        .collect();
    tokio::time::sleep(Duration::from_secs(8)).await;
    // One leaves gracefully, another joins.
    let (stop, task) = instances.remove(0);
    stop.cancel();
    task.await.unwrap().unwrap();
    instances.push(consumer_with(&server.url(), &name, &runs, Some(&ticks)));
    tokio::time::sleep(Duration::from_secs(16)).await;
    let seen = ticks.lock().unwrap().clone();
    for (stop, task) in instances {
        stop.cancel();
        task.await.unwrap().unwrap();
    }

    // Due times in milliseconds, from the ids `cron:tick:<due ms>`.
    let mut dues: Vec<u64> = seen
        .iter()
        .map(|(id, _)| id.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    dues.sort_unstable();
    let distinct = {
        let mut d = dues.clone();
        d.dedup();
        d
    };
    assert_eq!(dues, distinct, "a due time ran twice");
    let gaps: Vec<_> = distinct
        .windows(2)
        .filter(|w| w[1] - w[0] != 1000)
        .collect();
    assert!(gaps.is_empty(), "due times skipped: {gaps:?}");
    assert!(distinct.len() >= 20, "only {} due times", distinct.len());
    let late: Vec<Duration> = seen
        .iter()
        .map(|(id, at)| {
            let due: u64 = id.rsplit(':').next().unwrap().parse().unwrap();
            at.duration_since(SystemTime::UNIX_EPOCH + Duration::from_millis(due))
                .unwrap_or_default()
        })
        .collect();
    println!(
        "{} due times, each run once, none skipped; ran at most {:?} after the due time",
        distinct.len(),
        late.iter().max().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_partitions_keep_same_key_order_through_a_retry_and_a_handover() {
    let server = RedisServer::start();
    let name = unique_name("ordered");
    // (key, seq, attempt, started, succeeded at) per run.
    type Log = Arc<Mutex<Vec<(String, u64, u32, SystemTime, Option<SystemTime>)>>>;
    let log: Log = Arc::default();
    #[derive(Debug, Clone, Serialize, Deserialize)]
    struct Keyed {
        key: String,
        seq: u64,
    }
    let start = |log: Log| {
        let service = tower::service_fn(move |task: Task<Keyed>| {
            let log = log.clone();
            async move {
                let Keyed { key, seq } = task.payload;
                let attempt = task.cx.attempt();
                // One lock: tasks of other keys run at the same time.
                let at = {
                    let mut log = log.lock().unwrap();
                    log.push((key.clone(), seq, attempt, SystemTime::now(), None));
                    log.len() - 1
                };
                tokio::time::sleep(10 * MS).await;
                // Key "a", seq 10 fails its first attempt: the partition
                // waits for its retry.
                if key == "a" && seq == 10 && attempt == 1 {
                    return Err(HandlerError::msg("first attempt fails"));
                }
                log.lock().unwrap()[at].4 = Some(SystemTime::now());
                Ok::<(), HandlerError>(())
            }
        });
        let builder = Consumer::builder()
            .name(&name)
            .redis(server.url())
            .partitions(P)
            .ordered(true)
            .backoff(peerq::Backoff::exponential(300 * MS, 1000 * MS))
            .service(service);
        let stop = CancellationToken::new();
        (
            stop.clone(),
            tokio::spawn(builder.run_until(stop.cancelled_owned())),
        )
    };
    let first = start(log.clone());
    let producer = producer(&server.url(), &name).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let keys = ["a", "b", "c", "d"];
    let mut second = None;
    for seq in 0..40u64 {
        for key in keys {
            let task = Keyed {
                key: key.into(),
                seq,
            };
            producer
                .enqueue_with(task, Options::new().key(key))
                .await
                .unwrap();
        }
        tokio::time::sleep(100 * MS).await;
        if seq == 10 {
            // A second instance joins: about half the partitions move.
            second = Some(start(log.clone()));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while log.lock().unwrap().iter().filter(|r| r.4.is_some()).count() < 160 {
        if Instant::now() > deadline {
            let log = log.lock().unwrap().clone();
            let progress: Vec<_> = keys
                .iter()
                .map(|k| {
                    let done = log.iter().filter(|r| r.0 == *k && r.4.is_some()).count();
                    let last: Vec<_> = log.iter().filter(|r| r.0 == *k).rev().take(2).collect();
                    format!("{k}: {done} done, last runs {last:?}")
                })
                .collect();
            panic!("not every task succeeded: {progress:#?}");
        }
        tokio::time::sleep(20 * MS).await;
    }
    for (stop, task) in [first, second.unwrap()] {
        stop.cancel();
        task.await.unwrap().unwrap();
    }

    let log = log.lock().unwrap().clone();
    for key in keys {
        let mut runs: Vec<_> = log.iter().filter(|r| r.0 == key).cloned().collect();
        runs.sort_by_key(|r| r.3);
        // Successes in enqueue order, each once.
        let done: Vec<u64> = runs.iter().filter(|r| r.4.is_some()).map(|r| r.1).collect();
        assert_eq!(done, (0..40).collect::<Vec<_>>(), "key {key}: {done:?}");
        // Nothing of a key starts before the task before it succeeded.
        for pair in runs.windows(2) {
            let (prev, next) = (&pair[0], &pair[1]);
            let prev_end = prev.4.unwrap_or(prev.3);
            assert!(
                next.3 >= prev_end,
                "key {key}: seq {} started before seq {} ended",
                next.1,
                prev.1
            );
        }
    }
    let retried: Vec<_> = log
        .iter()
        .filter(|r| r.0 == "a" && r.1 == 10)
        .map(|r| r.2)
        .collect();
    assert_eq!(retried, vec![1, 2], "retried in place with attempt 2");
    println!("4 keys x 40 tasks in order through a retry in place and a handover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn due_times_missed_while_no_instance_ran_are_skipped_or_run_once() {
    use peerq::Missed;
    let server = RedisServer::start();
    let name = unique_name("missed");
    let ticks: Ticks = Arc::default();
    let start = |ticks: Ticks| {
        let service = tower::service_fn(move |task: Task<Job>| {
            let ticks = ticks.clone();
            async move {
                let id = task.cx.task_id().as_str().to_owned();
                ticks.lock().unwrap().push((id, SystemTime::now()));
                Ok::<(), HandlerError>(())
            }
        });
        let every = Duration::from_secs(2);
        let builder = Consumer::builder()
            .name(&name)
            .redis(server.url())
            .partitions(P)
            .periodic(Periodic::every("skipper", every), &Job { seq: 1 })
            .periodic(
                Periodic::every("catcher", every).missed(Missed::RunOnce),
                &Job { seq: 2 },
            )
            .service(service);
        let stop = CancellationToken::new();
        (
            stop.clone(),
            tokio::spawn(builder.run_until(stop.cancelled_owned())),
        )
    };
    let due_of = |id: &str| -> u64 { id.rsplit(':').next().unwrap().parse().unwrap() };
    let ms = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };

    let first_start = ms(SystemTime::now());
    let (stop, task) = start(ticks.clone());
    wait_until(Duration::from_secs(15), "both jobs to run", || {
        let t = ticks.lock().unwrap();
        ["skipper", "catcher"]
            .iter()
            .all(|j| t.iter().any(|(id, _)| id.contains(j)))
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    let stopped = ms(SystemTime::now());
    // No instance runs for 5 s: two or three due times pass.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let restarted = ms(SystemTime::now());
    let (stop, task) = start(ticks.clone());
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.cancel();
    task.await.unwrap().unwrap();

    let ticks = ticks.lock().unwrap().clone();
    let in_gap = |job: &str| {
        ticks
            .iter()
            .filter(|(id, _)| id.contains(job))
            .map(|(id, _)| due_of(id))
            .filter(|due| *due > stopped && *due <= restarted)
            .collect::<Vec<_>>()
    };
    println!(
        "missed due times run: skipper {:?}, catcher {:?}",
        in_gap("skipper"),
        in_gap("catcher")
    );
    // The jobs' first start registered them: there was nothing to miss
    // before it (the catcher's first mark is its registration).
    let before_first: Vec<&String> = ticks
        .iter()
        .map(|(id, _)| id)
        .filter(|id| due_of(id) < first_start)
        .collect();
    assert!(
        before_first.is_empty(),
        "due times from before the jobs existed ran: {before_first:?}"
    );
    assert!(in_gap("skipper").is_empty(), "Skip ran a missed due time");
    assert_eq!(
        in_gap("catcher").len(),
        1,
        "RunOnce runs the latest missed due time once"
    );
    assert!(
        in_gap("catcher")[0] + 2000 > restarted,
        "the latest missed one, not an older one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_task_left_by_a_crashed_owner_runs_first_with_a_higher_attempt() {
    use deadpool_redis::redis;
    let server = RedisServer::start();
    let name = unique_name("ordered-crash");
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
    for seq in 0..3u64 {
        producer
            .enqueue_with(Job { seq }, Options::new().key("k"))
            .await
            .unwrap();
    }
    // An instance that crashed had read the first task (it may have run).
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("peerq")
        .arg("crashed-instance")
        .arg("COUNT")
        .arg(1)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut *conn)
        .await
        .unwrap();

    let seen: Arc<Mutex<Vec<(u64, u32)>>> = Arc::default();
    let s = seen.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let s = s.clone();
        async move {
            s.lock()
                .unwrap()
                .push((task.payload.seq, task.cx.attempt()));
            Ok::<(), HandlerError>(())
        }
    });
    let builder = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(P)
        .ordered(true)
        .service(service);
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    wait_until(Duration::from_secs(15), "the three tasks", || {
        seen.lock().unwrap().len() == 3
    })
    .await;
    stop.cancel();
    consumer.await.unwrap().unwrap();
    assert_eq!(
        seen.lock().unwrap().clone(),
        vec![(0, 2), (1, 1), (2, 1)],
        "the crashed owner's task first, its attempt showing the earlier delivery"
    );
}

/// A periodic job registered before the builder's codec is set runs with
/// that codec: its task is encoded when the consumer starts, not when
/// `periodic` is called (which encoded it with the default codec then, a
/// task the JSON consumer dead-lettered as `decode` at every due time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_periodic_task_given_before_the_codec_runs_with_that_codec() {
    support::init_tracing();
    let server = RedisServer::start();
    let name = unique_name("periodic-codec");
    let ticks: Ticks = Arc::default();
    let builder = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(P)
        .periodic(
            Periodic::every("json-tick", Duration::from_millis(200)),
            &Job { seq: 7 },
        )
        .codec(peerq::Json)
        .service(recording(&Runs::default(), &ticks));
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    let dead = loop {
        match peerq::DeadLetters::connect(&server.url(), &name).await {
            Ok(dead) => break dead,
            // Not recorded yet: the consumer is starting.
            Err(peerq::Error::UnknownService { .. }) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while ticks.lock().unwrap().is_empty() {
        if let Some(letter) = dead.list(1).await.unwrap().first() {
            panic!(
                "the periodic task was dead-lettered: {} ({})",
                letter.reason, letter.error
            );
        }
        assert!(Instant::now() < deadline, "the periodic task never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    consumer.await.unwrap().unwrap();
    assert!(
        dead.list(1).await.unwrap().is_empty(),
        "nothing dead-lettered"
    );
}
