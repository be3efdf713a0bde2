//! The task, queue and producer metrics, read from a recorder installed in
//! this test process (`support::recorder`: each test reads its own
//! service's series by the `service` label), against a real redis-server.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis;
use peerq::Backoff;
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::{Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, recorder, unique_name, wait_until};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);
const P: u32 = 4;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    recorder::install().counter(name, labels)
}

fn gauge(name: &str, labels: &[(&str, &str)]) -> f64 {
    recorder::install().gauge(name, labels)
}

fn samples(name: &str, labels: &[(&str, &str)]) -> usize {
    recorder::install().samples(name, labels)
}

/// A private Redis and a service name, with the recorder installed.
fn start(prefix: &str) -> (RedisServer, String) {
    recorder::install();
    (RedisServer::start(), unique_name(prefix))
}

async fn producer(url: &str, name: &str) -> Producer {
    Producer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .max_payload(64)
        .connect()
        .await
        .unwrap()
}

/// Runs a consumer of `name` whose handler answers with `answer`, after
/// taking a permit of `gate` (closed: every run waits), until `stop`.
fn consume(
    url: &str,
    name: &str,
    gate: Arc<Semaphore>,
    answer: fn(u64, u32) -> Result<(), HandlerError>,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<peerq::Result<()>>,
) {
    support::init_tracing();
    let service = tower::service_fn(move |task: Task<Job>| {
        let gate = gate.clone();
        async move {
            let _permit = gate.acquire().await.expect("never closed");
            answer(task.payload.seq, task.cx.attempt())
        }
    });
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .max_attempts(3)
        .backoff(Backoff::exponential(50 * MS, 50 * MS))
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_outcomes_durations_and_enqueues_are_counted() {
    let (server, name) = start("metrics-tasks");
    let service = [("service", name.as_str())];
    let producer = producer(&server.url(), &name).await;
    // seq % 3: 0 succeeds; 1 fails for good (dead); 2 fails its first
    // attempt and succeeds on the second (retried).
    let jobs: Vec<Job> = (0..30).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    let too_large = producer.enqueue(&"x".repeat(100)).await;
    assert!(too_large.is_err(), "over max_payload: {too_large:?}");
    let (stop, consumer) = consume(
        &server.url(),
        &name,
        Arc::new(Semaphore::new(1000)),
        |seq, attempt| match seq % 3 {
            0 => Ok(()),
            1 => Err(HandlerError::msg("no such mailbox").permanent()),
            _ if attempt == 1 => Err(HandlerError::msg("busy")),
            _ => Ok(()),
        },
    );
    let outcome = |o: &'static str| counter("peerq_tasks_total", &[service[0], ("outcome", o)]);
    wait_until(Duration::from_secs(20), "every task to end", || {
        outcome("ok") == 20 && outcome("dead") == 10
    })
    .await;
    stop.cancel();
    consumer.await.unwrap().unwrap();

    assert_eq!(outcome("ok"), 20, "10 at once, 10 on their second attempt");
    assert_eq!(outcome("failed"), 20, "10 for good, 10 first attempts");
    assert_eq!(outcome("retried"), 10);
    assert_eq!(outcome("dead"), 10);
    assert_eq!(outcome("interrupted"), 0);
    assert_eq!(
        samples("peerq_task_duration_seconds", &service),
        40,
        "one per run"
    );
    assert_eq!(
        samples("peerq_task_wait_seconds", &service),
        40,
        "one per run"
    );
    assert_eq!(gauge("peerq_tasks_in_flight", &service), 0.0);
    assert_eq!(counter("peerq_enqueued_total", &service), 30);
    assert_eq!(counter("peerq_enqueue_errors_total", &service), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_gauges_show_the_backlog_the_dead_letters_and_the_delayed() {
    let (server, name) = start("metrics-queue");
    let service = [("service", name.as_str())];
    let producer = producer(&server.url(), &name).await;
    let jobs: Vec<Job> = (0..40).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    // Closed: every handler run waits, so nothing leaves the backlog.
    let gate = Arc::new(Semaphore::new(0));
    // seq % 4: 0 dead letter, 1 delayed for an hour, others succeed.
    let (stop, consumer) = consume(&server.url(), &name, gate.clone(), |seq, _| match seq % 4 {
        0 => Err(HandlerError::msg("no").permanent()),
        1 => Err(HandlerError::msg("later").retry_after(Duration::from_secs(3600))),
        _ => Ok(()),
    });
    let backlog = || gauge("peerq_backlog_entries", &service);
    wait_until(Duration::from_secs(20), "the backlog of 40", || {
        backlog() == 40.0
    })
    .await;
    // All 40 run (the concurrency is 64), each waiting at the gate.
    wait_until(Duration::from_secs(20), "40 runs in flight", || {
        gauge("peerq_tasks_in_flight", &service) == 40.0
    })
    .await;
    gate.add_permits(1000);
    wait_until(Duration::from_secs(20), "the queue to settle", || {
        backlog() == 0.0
            && gauge("peerq_dead_letters", &service) == 10.0
            && gauge("peerq_delayed_tasks", &service) == 10.0
    })
    .await;
    // Found by the chaos run: after Redis restarted from its AOF, a
    // group's lag went on counting entries delivered and deleted since.
    // Made so here (every entry is gone from the streams): the instance's
    // next look at its groups (within 10 s) must not count it.
    let mut conn = server.client().get_connection().unwrap();
    for p in 0..P {
        let _: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("SETID")
            .arg(format!("{{{name}/{p}}}:stream"))
            .arg("peerq")
            .arg("$")
            .arg("ENTRIESREAD")
            .arg(0)
            .query(&mut conn);
    }
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(backlog(), 0.0, "a lag beyond the stream is no backlog");
    stop.cancel();
    consumer.await.unwrap().unwrap();
    // Left: the instance owns no partition any more, so it counts none
    // (its housekeeping tasks end just after the run).
    wait_until(
        Duration::from_secs(5),
        "the gauges to forget the partitions",
        || {
            gauge("peerq_delayed_tasks", &service) == 0.0
                && gauge("peerq_dead_letters", &service) == 0.0
        },
    )
    .await;
    assert_eq!(gauge("peerq_tasks_in_flight", &service), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_pauses_are_measured_from_the_mark_or_the_epoch() {
    let (server, name) = start("metrics-pause");
    let service = [("service", name.as_str())];
    let pauses = || recorder::install().values("peerq_handover_pause_seconds", &service);
    let open = || Arc::new(Semaphore::new(1000));
    let (stop_a, a) = consume(&server.url(), &name, open(), |_, _| Ok(()));
    // The first instance acquires every partition at its deadline (nobody
    // marks): each pause runs from its epoch's start.
    wait_until(Duration::from_secs(20), "P starts", || {
        pauses().len() == P as usize
    })
    .await;
    // A second joins: half the partitions move, each after its mark.
    let (stop_b, b) = consume(&server.url(), &name, open(), |_, _| Ok(()));
    wait_until(Duration::from_secs(20), "the moves", || {
        pauses().len() >= (P + P / 2) as usize
    })
    .await;
    for stop in [stop_a, stop_b] {
        stop.cancel();
    }
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
    // At the default interval (1 s) a deadline is I/2 + drain timeout +
    // S_allow (about 0.97 s) into its epoch; a mark comes sooner.
    let all = pauses();
    assert!(
        all.iter().all(|p| (0.0..1.5).contains(p)),
        "pauses within the deadline: {all:?}"
    );
    // The moved partitions started soon after their marks, far sooner
    // than a deadline: measured from the mark, not from the epoch.
    let after_a_mark = all.iter().filter(|p| **p < 0.5).count();
    assert!(after_a_mark >= (P / 2) as usize, "pauses: {all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_singleton_that_panics_fails_or_returns_is_restarted_with_backoff() {
    let (server, name) = start("metrics-singleton");
    let starts: Arc<std::sync::Mutex<Vec<std::time::Instant>>> = Arc::default();
    let seen = starts.clone();
    // Run 1 panics before its future exists, run 2 in its future, run 3
    // fails, run 4 returns `Ok`, run 5 runs until told to stop.
    let job = move |cx: peerq::singleton::SingletonContext| {
        let run = {
            let mut starts = seen.lock().unwrap();
            starts.push(std::time::Instant::now());
            starts.len()
        };
        assert_ne!(run, 1, "the first run panics in the job's function");
        async move {
            match run {
                2 => panic!("the second run panics"),
                3 => Err(std::io::Error::other("the third run fails")),
                4 => Ok(()),
                _ => {
                    cx.cancelled().await;
                    Ok(())
                }
            }
        }
    };
    let builder = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(P)
        .singleton("restarts", job)
        .service(tower::service_fn(|_: Task<Job>| async {
            Ok::<_, HandlerError>(())
        }));
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    let held = [("service", name.as_str()), ("name", "restarts")];
    // Registered from the start (at 0 until the acquire), on every
    // instance that declares the singleton.
    wait_until(Duration::from_secs(5), "the held gauge", || {
        recorder::install().gauges(peerq::metrics::SINGLETON_HELD, &held) == 1
    })
    .await;
    wait_until(Duration::from_secs(15), "the fifth run", || {
        starts.lock().unwrap().len() == 5
    })
    .await;
    let labels = |outcome: &'static str| {
        [
            ("service", name.as_str()),
            ("name", "restarts"),
            ("outcome", outcome),
        ]
    };
    let runs = |outcome| counter(peerq::metrics::SINGLETON_RUNS_TOTAL, &labels(outcome));
    assert_eq!(
        (
            runs("panicked"),
            runs("failed"),
            runs("ok"),
            runs("interrupted")
        ),
        (2, 1, 1, 0)
    );
    assert_eq!(gauge(peerq::metrics::SINGLETON_HELD, &held), 1.0);
    // 100 ms after a run ended, doubling.
    let starts = starts.lock().unwrap().clone();
    for (i, least) in [100, 200, 400, 800].into_iter().enumerate() {
        let gap = starts[i + 1] - starts[i];
        assert!(
            gap >= Duration::from_millis(least),
            "restart {} after {gap:?}, before its backoff of {least} ms",
            i + 1
        );
    }
    stop.cancel();
    consumer.await.unwrap().unwrap();
    assert_eq!(runs("interrupted"), 1, "the leave stops the fifth run");
    assert_eq!(gauge(peerq::metrics::SINGLETON_HELD, &held), 0.0);
}
