//! Starting before Redis: a consumer waits for an unreachable Redis and
//! retries, a stop ends the wait, a refusing Redis (wrong password, ACL) is
//! an error at once; a producer does not wait, and its error names the URL
//! without the password; a consumer given no partitions takes the
//! service's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use peerq::producer::Producer;
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use serde::{Deserialize, Serialize};
use support::{RedisServer, ServerOptions, unique_name, unused_port, wait_until};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Counts the runs of each task.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<BTreeMap<u64, u32>>>);

impl Handler for Runs {
    type Task = Job;
    async fn handle(&self, job: Job, _cx: TaskContext) -> Result<(), HandlerError> {
        *self.0.lock().unwrap().entry(job.seq).or_default() += 1;
        Ok(())
    }
}

impl Runs {
    fn distinct(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// A consumer of `name` at `url` running in this process until `stop` is
/// cancelled.
struct Instance {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<peerq::Result<()>>,
}

impl Instance {
    fn start(url: &str, name: &str, runs: Runs) -> Instance {
        support::init_tracing();
        let stop = CancellationToken::new();
        let run = Consumer::builder()
            .name(name)
            .redis(url)
            .handler(runs)
            .run_until(stop.clone().cancelled_owned());
        Instance {
            stop,
            task: tokio::spawn(run),
        }
    }
}

/// Starts a server on `port` without blocking the runtime's threads.
async fn start_server_on(port: u16) -> RedisServer {
    tokio::task::spawn_blocking(move || RedisServer::start_on(port, ServerOptions::default()))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_started_before_redis_waits_and_then_runs_every_task_once() {
    let port = unused_port();
    let url = format!("redis://127.0.0.1:{port}/");
    let name = unique_name("before-redis");
    let runs = Runs::default();
    let started = Instant::now();
    let consumer = Instance::start(&url, &name, runs.clone());

    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !consumer.task.is_finished(),
        "the consumer gave up on an unreachable redis: {:?}",
        consumer.task.await
    );
    let server = start_server_on(port).await;
    let up = started.elapsed();
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let jobs: Vec<Job> = (0..200).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();

    wait_until(Duration::from_secs(30), "every task to run", || {
        runs.distinct() == jobs.len()
    })
    .await;
    eprintln!(
        "redis up {:.1}s after the consumer started; all {} tasks ran {:.1}s after that",
        up.as_secs_f64(),
        jobs.len(),
        (started.elapsed() - up).as_secs_f64()
    );
    consumer.stop.cancel();
    tokio::time::timeout(Duration::from_secs(20), consumer.task)
        .await
        .expect("the consumer leaves")
        .unwrap()
        .unwrap();

    let per_seq = runs.0.lock().unwrap().clone();
    let twice: Vec<_> = per_seq.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "tasks run more than once: {twice:?}");
    assert_eq!(per_seq.len(), jobs.len());
}

/// A consumer given no partitions takes the service's: a producer made the
/// service with 8, so a consumer that took the default (64) would be
/// refused by `{N}:meta`; one given another count is refused, saying the
/// service's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_without_partitions_takes_the_services() {
    let server = RedisServer::start();
    let name = unique_name("adopt");
    let producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(8)
        .connect()
        .await
        .unwrap();
    let jobs: Vec<Job> = (0..100).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    let runs = Runs::default();
    let consumer = Instance::start(&server.url(), &name, runs.clone());
    wait_until(Duration::from_secs(20), "every task to run", || {
        assert!(!consumer.task.is_finished(), "the consumer stopped");
        runs.distinct() == jobs.len()
    })
    .await;
    consumer.stop.cancel();
    consumer.task.await.unwrap().unwrap();
    let refused = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(16)
        .handler(Runs::default())
        .run_until(std::future::pending())
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("partitions"),
        "refused without naming partitions: {refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_stopped_while_waiting_for_redis_returns_ok() {
    let port = unused_port();
    let consumer = Instance::start(
        &format!("redis://127.0.0.1:{port}/"),
        &unique_name("stop-waiting"),
        Runs::default(),
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!consumer.task.is_finished(), "{:?}", consumer.task.await);

    let stopping = Instant::now();
    consumer.stop.cancel();
    let result = tokio::time::timeout(Duration::from_secs(10), consumer.task)
        .await
        .expect("the consumer stops while waiting for redis")
        .unwrap();
    let took = stopping.elapsed();
    eprintln!("stopped {} ms after the signal", took.as_millis());
    result.expect("a stop while waiting for redis is not an error");
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_redis_is_an_error_at_once_without_the_password() {
    const PASSWORD: &str = "s3cret-of-the-server";
    let server = tokio::task::spawn_blocking(|| {
        RedisServer::start_with(ServerOptions {
            requirepass: Some(PASSWORD),
            ..ServerOptions::default()
        })
    })
    .await
    .unwrap();
    let port = server.port();
    // A user that may do everything but read INFO, which the start needs.
    let mut admin = server.pool().get().await.unwrap();
    let _: () = deadpool_redis::redis::cmd("ACL")
        .arg(
            &[
                "SETUSER",
                "limited",
                "on",
                ">limited-pw-77",
                "~*",
                "&*",
                "+@all",
                "-info",
            ][..],
        )
        .query_async(&mut *admin)
        .await
        .unwrap();

    let cases = [
        (
            "wrong password",
            format!("redis://:not-the-password-42@127.0.0.1:{port}/"),
            "not-the-password-42",
            "check the user and password",
        ),
        (
            "no password",
            format!("redis://127.0.0.1:{port}/"),
            PASSWORD,
            "NOAUTH",
        ),
        (
            "acl refusal",
            format!("redis://limited:limited-pw-77@127.0.0.1:{port}/"),
            "limited-pw-77",
            "ACL SETUSER <user> +info",
        ),
    ];
    for (case, url, password, names) in cases {
        let started = Instant::now();
        let result = tokio::time::timeout(
            Duration::from_secs(20),
            Consumer::builder()
                .name(unique_name("refused"))
                .redis(&url)
                .handler(Runs::default())
                .run_until(std::future::pending()),
        )
        .await
        .unwrap_or_else(|_| panic!("{case}: the consumer kept waiting"));
        let took = started.elapsed();
        let msg = result.expect_err(case).to_string();
        eprintln!("{case}: refused after {} ms: {msg}", took.as_millis());
        assert!(took < Duration::from_secs(3), "{case}: took {took:?}");
        assert!(msg.contains(names), "{case}: {msg}");
        assert!(msg.contains(&format!("127.0.0.1:{port}")), "{case}: {msg}");
        assert!(!msg.contains(password), "{case}: {msg}");
        assert!(!msg.contains(PASSWORD), "{case}: {msg}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_without_redis_fails_naming_the_url_without_its_password() {
    support::init_tracing();
    let port = unused_port();
    let url = format!("redis://:s3cret@127.0.0.1:{port}/");
    let started = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        Producer::connect(&url, &unique_name("producer")),
    )
    .await
    .expect("a producer does not wait for redis")
    .unwrap_err();
    let took = started.elapsed();
    let msg = err.to_string();
    eprintln!("refused after {} ms: {msg}", took.as_millis());
    assert!(
        msg.contains(&format!("redis://:***@127.0.0.1:{port}/")),
        "{msg}"
    );
    assert!(!msg.contains("s3cret"), "{msg}");
    assert!(!format!("{err:?}").contains("s3cret"), "{err:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_and_indexers_name_the_redis_they_cannot_reach_or_parse() {
    use peerq::dead_letters::DeadLetters;
    use peerq::indexer::Indexer;
    let port = unused_port();
    let refused = format!("redis://:s3cret@127.0.0.1:{port}/");
    let malformed = "redis//:s3cret@127.0.0.1/";
    let indexer = |url: &str| {
        let built = Indexer::builder().name("svc").redis(url).build();
        async move { built?.start().await.map(drop) }
    };
    let dead_letters = |url: &str| {
        let url = url.to_owned();
        async move { DeadLetters::connect(&url, "svc").await.map(drop) }
    };
    let errors = [
        ("dead letters, refused", dead_letters(&refused).await),
        ("indexer, refused", indexer(&refused).await),
        ("dead letters, malformed", dead_letters(malformed).await),
        ("indexer, malformed", indexer(malformed).await),
    ];
    for (case, result) in errors {
        let msg = result.expect_err(case).to_string();
        if case.ends_with("refused") {
            let at = format!("cannot use redis at redis://:***@127.0.0.1:{port}/: ");
            assert!(msg.starts_with(&at), "{case}: {msg}");
            assert!(msg.contains("is redis running"), "{case}: {msg}");
        } else {
            let named = "invalid setting `redis`: `redis//:***@127.0.0.1/` is not a Redis URL";
            assert!(msg.starts_with(named), "{case}: {msg}");
        }
        assert!(!msg.contains("s3cret"), "{case}: {msg}");
    }
}

#[tokio::test]
async fn a_missing_name_says_to_call_name() {
    use peerq::indexer::Indexer;
    let url = "redis://127.0.0.1:1/";
    let errors = [
        Producer::builder().redis(url).connect().await.map(drop),
        Indexer::builder().redis(url).build().map(drop),
        Consumer::builder()
            .redis(url)
            .handler(Runs::default())
            .run_until(async {})
            .await,
    ];
    for result in errors {
        let msg = result.unwrap_err().to_string();
        assert!(
            msg.starts_with("invalid setting `name`: no name given; call .name("),
            "{msg}"
        );
    }
}

/// A periodic task that the consumer's codec cannot encode is an invalid
/// setting naming the job, whichever of `periodic` and `codec` came first
/// (the task is encoded when the consumer starts, with the codec it runs
/// with); no Redis is needed to find out.
#[tokio::test]
async fn a_periodic_task_its_codec_cannot_encode_is_an_invalid_setting() {
    // Keys that are no strings: bincode encodes it, JSON does not.
    let task = BTreeMap::from([((1u8, 2u8), 3u8)]);
    let job = || peerq::Periodic::every("tuple-keys", Duration::from_secs(1));
    let builder = || Consumer::builder().name("x").redis("redis://127.0.0.1:1/");
    let handler = Runs::default();
    let errors = [
        builder()
            .periodic(job(), &task)
            .codec(peerq::Json)
            .handler(handler.clone())
            .run_until(async {})
            .await,
        builder()
            .codec(peerq::Json)
            .periodic(job(), &task)
            .handler(handler.clone())
            .run_until(async {})
            .await,
    ];
    for result in errors {
        let msg = result.unwrap_err().to_string();
        assert!(
            msg.starts_with(
                "invalid setting `periodic`: job `tuple-keys`: its task does not encode: json:"
            ),
            "{msg}"
        );
    }
}
