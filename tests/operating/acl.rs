//! peerq as a Redis ACL user with only the rights the README's rule gives
//! (derived from every command and script in `src/`): a consumer, a
//! producer, the CLI and the outbox relay work; a user missing one right
//! gets a one-line error naming the command and what to grant; a wrong
//! password is an authentication error without the password in it. A
//! rate limit (its tokens leased from `{N}:rate`, `peerq limit`), a
//! concurrency and a rate per key from the task (its units in
//! `{N}:units:<key>`, its shares in `{N}:rate:<key>`),
//! priority levels (their partitions), a unique key (its lock in
//! `{N/p}:unique`), a batch (its record, its members' completion records,
//! `peerq batch show` and `cancel`), and task tracking (records, `wait`, a cancel heard by
//! the running task) work as that user too.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::producer::{Options, Producer};
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

/// The README's rule for a service's user, for service `name`.
fn service_rule(user: &str, password: &str, name: &str) -> String {
    format!(
        "{user} on >{password} resetkeys ~{{{name}}}:* ~{{{name}/*}}:* \
         resetchannels &{{{name}}}:* &{{{name}/*}}:* -@all \
         +@stream +@hash +@sortedset +@list +get +set +incr +del +exists +expire +pexpire \
         +evalsha +script|load +ping +time +wait +info +client|id +client|unblock \
         +publish +subscribe +spublish +ssubscribe +hello +auth"
    )
}

/// The README's addition for an operator's user (the CLI, the dashboard):
/// finding the services needs `SCAN` and every service's `{N}:meta`.
fn operator_rule(user: &str, password: &str, name: &str) -> String {
    format!("{} %R~{{*}}:meta +scan", service_rule(user, password, name))
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Runs every task; every seq that is a multiple of 10 fails once (a
/// retry with a delay: the delayed set and its promotion), and seq 3 fails
/// for good (the dead letters).
#[derive(Clone, Default)]
struct Flaky(Arc<Mutex<Vec<(u64, u32)>>>);

impl Handler for Flaky {
    type Task = Job;
    async fn handle(&self, job: Job, cx: TaskContext) -> Result<(), HandlerError> {
        self.0.lock().unwrap().push((job.seq, cx.attempt()));
        match job.seq {
            3 => Err(HandlerError::msg("no such mailbox").permanent()),
            seq if seq % 10 == 0 && cx.attempt() == 1 => {
                Err(HandlerError::msg("try later").retry_after(Duration::from_millis(200)))
            }
            _ => Ok(()),
        }
    }
}

impl Flaky {
    fn done(&self, count: u64) -> bool {
        let runs = self.0.lock().unwrap();
        (0..count).all(|seq| {
            runs.iter()
                .any(|(s, attempt)| *s == seq && (seq % 10 != 0 || *attempt == 2))
        })
    }
}

const LEVELS: [peerq::Priority; 3] = [
    peerq::Priority::High,
    peerq::Priority::Normal,
    peerq::Priority::Low,
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_a_producer_and_the_cli_work_as_a_least_privilege_user() {
    support::init_tracing();
    let server = RedisServer::start();
    let name = unique_name("acl");
    server.acl_setuser(&operator_rule("mail", "s3cret-pw", &name));
    let url = server.url_as("mail", "s3cret-pw");
    let handler = Flaky::default();
    let stop = CancellationToken::new();
    // A singleton as this user: its holder's record in `{N}:singletons`,
    // its marks in `{N}:transition`.
    let held = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = held.clone();
    let consumer = Consumer::builder()
        .redis(&url)
        .name(&name)
        .singleton("acl-one", move |cx: peerq::singleton::SingletonContext| {
            seen.store(true, std::sync::atomic::Ordering::SeqCst);
            async move {
                cx.cancelled().await;
                Ok::<_, std::io::Error>(())
            }
        })
        // Limited: no task starts without a token leased from `{N}:rate`
        // as this user (a refused lease would leave them all waiting).
        .rate_limit(1_000, Duration::from_secs(1))
        // Three levels: three times the partitions, all in `{N/…}`.
        .priorities(LEVELS)
        .handler(handler.clone())
        // Counted in `{N}:units:<key>` and `{N}:rate:<key>` as this user: a
        // refused unit or share would leave every task waiting aside.
        .concurrency_per_key(100)
        .rate_limit_per_key(1_000, Duration::from_secs(1))
        .limit_key(|job: &Job| Some(format!("s{}", job.seq % 5)))
        .periodic(
            peerq::Periodic::every("tick", Duration::from_millis(500)),
            &Job { seq: 1_000 },
        );
    let running = tokio::spawn(consumer.run_until(stop.clone().cancelled_owned()));
    let producer = Producer::builder()
        .redis(&url)
        .name(&name)
        .priorities(LEVELS)
        .connect()
        .await
        .unwrap();
    let jobs: Vec<(Job, Options)> = (0..50)
        .map(|seq| {
            (
                Job { seq },
                Options::new().priority(LEVELS[(seq % 3) as usize]),
            )
        })
        .collect();
    producer.enqueue_batch_with(&jobs).await.unwrap();
    let options = Options::new()
        .idempotency_key("once")
        .delay(Duration::from_millis(300));
    producer
        .enqueue_with(Job { seq: 50 }, options.clone())
        .await
        .unwrap();
    producer
        .enqueue_with(Job { seq: 50 }, options)
        .await
        .unwrap();
    // A unique key as this user: the second enqueue finds the first still
    // held (its script checks that the holder's entry is alive).
    let unique = Options::new().unique("acl-once");
    let holder = producer
        .enqueue_with(Job { seq: 51 }, unique.clone())
        .await
        .unwrap();
    match producer.enqueue_with(Job { seq: 51 }, unique).await {
        Err(peerq::Error::Duplicate(d)) => assert_eq!(d.existing, holder),
        other => panic!("a held unique key enqueued again: {other:?}"),
    }
    // A batch as this user: its record in its home partition's slot, its
    // members' completion records in theirs, its callback (seq 54).
    let batch = producer.batch().callback(&Job { seq: 54 });
    let batch = batch.enqueue(&[Job { seq: 52 }, Job { seq: 53 }]).await;
    let batch = batch.unwrap();
    wait_until(Duration::from_secs(30), "every task ran", || {
        assert!(!running.is_finished(), "the consumer stopped");
        handler.done(55)
    })
    .await;
    let shown = cli(
        &url,
        &[
            "batch",
            "show",
            "--name",
            &name,
            "--id",
            batch.as_str(),
            "--json",
        ],
    );
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["succeeded"], 2, "{shown}");
    assert_eq!(shown["callback"], "enqueued", "{shown}");
    // A cancel as this user: the batch's remembered members (`:c`) and
    // its home partition's completion records, forwarded by the canceller.
    let open = producer.batch().callback(&Job { seq: 99 }).cancellable();
    let open = open.open().await.unwrap();
    let cancelled = cli(
        &url,
        &[
            "batch",
            "cancel",
            "--name",
            &name,
            "--id",
            open.id().as_str(),
            "--json",
        ],
    );
    let cancelled: serde_json::Value = serde_json::from_str(&cancelled).unwrap();
    assert_eq!(cancelled["found"], true, "{cancelled}");
    assert_eq!(cancelled["was_done"], false, "{cancelled}");
    let dead = peerq::DeadLetters::connect(&url, &name).await.unwrap();
    // Read to the end each time: a read polled once and dropped (as
    // `now_or_never` did here) only sees a reply that came at once, which
    // a loaded machine does not give.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while dead.list(10).await.unwrap().len() != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for the dead letter"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_until(Duration::from_secs(10), "the singleton ran", || {
        held.load(std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    let status = cli(&url, &["status", "--name", &name, "--json"]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["singletons"][0]["name"], "acl-one", "{status}");
    assert_eq!(status["singletons"][0]["released"], false, "{status}");
    assert!(cli(&url, &["services", "--json"]).contains(&name));
    let limits = cli(
        &url,
        &["limit", "set", "--name", &name, "--rate", "2000/1s"],
    );
    assert!(limits.contains("rate limit 2000/1s"), "{limits}");
    // A reshard as this user (docs/design.md §21): the seal (`XSETID`),
    // the moves of the dead letter, the periodic mark, the retire and the
    // open, all in `{N/…}` and `{N}`.
    let resharded = cli(
        &url,
        &["reshard", "--name", &name, "--partitions", "8", "--json"],
    );
    let resharded: serde_json::Value = serde_json::from_str(&resharded).unwrap();
    assert_eq!(resharded["generation"], 1, "{resharded}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = cli(&url, &["status", "--name", &name, "--json"]);
        let status: serde_json::Value = serde_json::from_str(&status).unwrap();
        if status["layout"]["state"] == "open" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reshard never opened: {}",
            status["layout"]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let moved = peerq::DeadLetters::connect(&url, &name).await.unwrap();
    let letters = moved.list(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert!(letters[0].partition >= 1 << 16, "moved: {letters:?}");
    stop.cancel();
    running.await.unwrap().unwrap();
}

/// Waits for the end of a task on a tracked service; seq 7 waits for its
/// cancel.
#[derive(Clone, Default)]
struct Cancellable;

impl Handler for Cancellable {
    type Task = Job;
    async fn handle(&self, job: Job, cx: TaskContext) -> Result<(), HandlerError> {
        if job.seq == 7 {
            cx.progress(&50u8);
            cx.cancelled().await;
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_wait_and_cancel_work_as_a_least_privilege_user() {
    use peerq::tracking::{CancelOutcome, TaskState, Tracking, Waited};
    support::init_tracing();
    let server = RedisServer::start();
    let name = unique_name("acl-tracking");
    server.acl_setuser(&operator_rule("mail", "s3cret-pw", &name));
    let url = server.url_as("mail", "s3cret-pw");
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .redis(&url)
        .name(&name)
        .tracking(Tracking::on())
        .handler(Cancellable);
    let running = tokio::spawn(consumer.run_until(stop.clone().cancelled_owned()));
    let admin = peerq::admin::Admin::connect(url.as_str()).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let service = loop {
        if let Ok(service) = admin.service(&name).await
            && service.tracking().await.unwrap().is_on()
        {
            break service;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the consumer never started"
        );
        assert!(!running.is_finished(), "the consumer stopped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let producer = Producer::builder()
        .redis(&url)
        .name(&name)
        .connect()
        .await
        .unwrap();
    let done = producer.enqueue(Job { seq: 1 }).await.unwrap();
    let done = producer.handle_of(&done, None);
    let waited = service.wait(&done, Duration::from_secs(20)).await.unwrap();
    assert!(
        matches!(&waited, Waited::Final(r) if r.state == Some(TaskState::Succeeded)),
        "{waited:?}"
    );
    let hanging = producer.enqueue(Job { seq: 7 }).await.unwrap();
    let hanging = producer.handle_of(&hanging, None);
    loop {
        let record = service.task(&hanging).await.unwrap();
        if record.is_some_and(|r| r.progress.is_some()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline + Duration::from_secs(10),
            "seq 7 never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let outcome = service.cancel(&hanging).await.unwrap();
    assert!(
        matches!(outcome, CancelOutcome::Requested { .. }),
        "{outcome:?}"
    );
    let waited = service
        .wait(&hanging, Duration::from_secs(20))
        .await
        .unwrap();
    assert!(
        matches!(&waited, Waited::Final(r) if r.state == Some(TaskState::Cancelled)),
        "{waited:?}"
    );
    stop.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_right_is_named_with_what_to_grant() {
    let server = RedisServer::start();
    let name = unique_name("acl-missing");
    // No XADD: the producer cannot enqueue.
    server.acl_setuser(&format!("{} -xadd", service_rule("noadd", "pw-1", &name)));
    let producer = Producer::builder()
        .redis(server.url_as("noadd", "pw-1"))
        .name(&name)
        .connect()
        .await
        .unwrap();
    let line = producer
        .enqueue(Job { seq: 0 })
        .await
        .unwrap_err()
        .to_string();
    println!("no xadd: {line}");
    assert!(line.contains("may not run `xadd`"), "{line}");
    assert!(line.contains("+xadd"), "{line}");
    assert_eq!(line.lines().count(), 1, "{line}");

    // No INFO: the consumer cannot check the eviction policy, and says
    // what to do instead.
    server.acl_setuser(&format!("{} -info", service_rule("noinfo", "pw-2", &name)));
    let err = Consumer::builder()
        .redis(server.url_as("noinfo", "pw-2"))
        .name(&name)
        .handler(Flaky::default())
        .run_until(std::future::pending())
        .await
        .unwrap_err()
        .to_string();
    println!("no info: {err}");
    assert!(err.contains("invalid setting `allow_eviction`"), "{err}");
    assert!(err.contains("+info"), "{err}");
    assert!(err.contains(".allow_eviction(true)"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_authentication_error_without_the_password() {
    let server = RedisServer::start();
    let name = unique_name("acl-pw");
    server.acl_setuser(&service_rule("mail", "right-pw", &name));
    let err = Producer::builder()
        .redis(server.url_as("mail", "wr0ng-pw"))
        .name(&name)
        .connect()
        .await
        .unwrap_err()
        .to_string();
    println!("wrong password: {err}");
    assert!(err.contains("check the user and password"), "{err}");
    assert!(!err.contains("wr0ng-pw"), "{err}");
    assert!(err.contains("mail:***@"), "{err}");
}

/// Runs `peerq --redis url args…`, which must succeed; its stdout.
fn cli(url: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_peerq"))
        .env_remove("PEERQ_REDIS_URL")
        .args(["--redis", url])
        .args(args)
        .output()
        .expect("run peerq");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The outbox relay (feature `postgres`) as the same user: it reads
/// Redis's clock for its claims' deadlines, enqueues and dead-letters rows
/// with its dedup records, and gives the records their expiry once the
/// rows' delete committed (`PEXPIRE`), all within the rule.
#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_relay_works_as_a_least_privilege_user() {
    use deadpool_redis::redis;
    use peerq::Json;
    use peerq::postgres::{Outbox, Relay};
    use support::PostgresServer;

    support::init_tracing();
    let server = tokio::task::spawn_blocking(RedisServer::start)
        .await
        .unwrap();
    let name = unique_name("acl-relay");
    server.acl_setuser(&service_rule("mail", "s3cret-pw", &name));
    let url = server.url_as("mail", "s3cret-pw");
    let db = tokio::task::spawn_blocking(|| PostgresServer::shared().database())
        .await
        .unwrap();
    let pool = sqlx::PgPool::connect_with(db.options()).await.unwrap();
    peerq::postgres::migrate(&pool).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let job = Outbox::enqueue(&mut tx, &name, &Job { seq: 1 }, Options::new())
        .await
        .unwrap()
        .to_string();
    // Another codec than the service's: dead-lettered, reason `relay`.
    let poison = Outbox::enqueue_with_codec(&mut tx, &name, Json, &Job { seq: 2 }, Options::new())
        .await
        .unwrap()
        .to_string();
    tx.commit().await.unwrap();

    let stop = CancellationToken::new();
    let relay = Relay::builder()
        .postgres(pool.clone())
        .name(&name)
        .redis(&url)
        .test_timing(Duration::from_secs(20), Duration::from_secs(2))
        .build()
        .unwrap();
    let relaying = tokio::spawn(relay.run_until(stop.clone().cancelled_owned()));
    // Both records come and, the rows deleted, go after their grace.
    let mut admin = server.pool().get().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut seen = [false, false];
    loop {
        let mut gone = true;
        for (i, id) in [&job, &poison].into_iter().enumerate() {
            let pattern = format!("{{{name}/*}}:dedup:outbox:{id}");
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(&pattern)
                .query_async(&mut admin)
                .await
                .unwrap();
            seen[i] |= !keys.is_empty();
            gone &= keys.is_empty();
        }
        let left: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM peerq_outbox) + (SELECT count(*) FROM peerq_outbox_sent)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if seen == [true, true] && gone && left == 0 {
            break;
        }
        assert!(!relaying.is_finished(), "the relay stopped");
        assert!(
            std::time::Instant::now() < deadline,
            "timed out: records seen {seen:?}, all gone {gone}, rows and markers left {left}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dead = peerq::DeadLetters::connect(&url, &name).await.unwrap();
    let letters = dead.list(10).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].reason, "relay");
    stop.cancel();
    relaying.await.unwrap().unwrap();
}
