//! The Postgres outbox (docs/design.md §10) against a real PostgreSQL and a
//! real redis-server: migrations apply once however many run at once; a
//! rolled-back transaction enqueues nothing and a committed one runs once;
//! a relay killed between its `XADD`s and its delete, a relay whose
//! delete Postgres, away, could not commit for longer than the records'
//! grace, a relay frozen before a send, and three relays at once, still
//! run each task once; per-key order holds through several
//! relays; a row no consumer could run is dead-lettered with reason
//! `relay` and the rows behind it in its lane flow; a row's headers reach
//! the handler; and the commit → handler-start latency is measured.

mod headers;
mod killed;
mod latency;
mod outage;
mod reshard;
mod stale;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use peerq::Json;
use peerq::consumer::ConsumerBuilder;
use peerq::dead_letters::DeadLetters;
use peerq::handler::HandlerService;
use peerq::postgres::{Outbox, Relay};
use peerq::{Consumer, Handler, HandlerError, Options, TaskContext};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use support::{PostgresServer, RedisServer, ServerOptions, TestDatabase, unique_name, wait_until};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A task: which key it belongs to and its place among the key's tasks.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Mail {
    key: String,
    seq: u64,
}

/// One handler run.
#[derive(Debug, Clone)]
struct Run {
    id: String,
    key: String,
    seq: u64,
    started: SystemTime,
    headers: peerq::Headers,
    /// Its partition's generation (docs/design.md §21).
    generation: u32,
}

/// Records every run, and wakes whoever waits for one.
#[derive(Clone, Default)]
struct Record {
    runs: Arc<Mutex<Vec<Run>>>,
    ran: Arc<Notify>,
}

impl Handler for Record {
    type Task = Mail;
    async fn handle(&self, mail: Mail, cx: TaskContext) -> Result<(), HandlerError> {
        let started = SystemTime::now();
        self.runs.lock().unwrap().push(Run {
            id: cx.task_id().to_string(),
            key: mail.key,
            seq: mail.seq,
            started,
            headers: cx.headers().clone(),
            generation: cx.generation(),
        });
        self.ran.notify_waiters();
        Ok(())
    }
}

impl Record {
    fn runs(&self) -> Vec<Run> {
        self.runs.lock().unwrap().clone()
    }

    /// Handler runs per task id.
    fn counts(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for run in self.runs() {
            *counts.entry(run.id).or_default() += 1;
        }
        counts
    }
}

/// A Redis, a fresh migrated database and a service name, for one test.
struct World {
    redis: RedisServer,
    pool: PgPool,
    db_url: String,
    name: String,
}

impl World {
    async fn new(prefix: &str) -> World {
        World::with(prefix, ServerOptions::default()).await
    }

    async fn with(prefix: &str, options: ServerOptions) -> World {
        let db = tokio::task::spawn_blocking(|| PostgresServer::shared().database())
            .await
            .unwrap();
        World::on(prefix, options, db).await
    }

    /// On database `db`, and a Redis started with `options`.
    async fn on(prefix: &str, options: ServerOptions, db: TestDatabase) -> World {
        support::init_tracing();
        let redis = tokio::task::spawn_blocking(move || RedisServer::start_with(options))
            .await
            .unwrap();
        let pool = PgPool::connect_with(db.options()).await.unwrap();
        peerq::postgres::migrate(&pool).await.unwrap();
        World {
            redis,
            pool,
            db_url: db.url,
            name: unique_name(prefix),
        }
    }

    /// Writes `mail` (with `options`) in a transaction of its own, and
    /// commits it.
    async fn commit(&self, mail: &Mail, options: Options) -> String {
        commit(&self.pool, &self.name, mail, options).await
    }

    /// The service's dead letters (the first ten).
    async fn dead_letters(&self) -> Vec<peerq::dead_letters::DeadLetter> {
        DeadLetters::connect(&self.redis.url(), &self.name)
            .await
            .unwrap()
            .list(10)
            .await
            .unwrap()
    }

    /// Waits until the outbox holds `rows` rows, at most `within`.
    async fn wait_for_rows(&self, rows: i64, within: Duration, what: &str) {
        let started = std::time::Instant::now();
        while self.outbox_rows().await != rows {
            assert!(started.elapsed() < within, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn outbox_rows(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM peerq_outbox")
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// A consumer of the service that records its runs; `tune` sets more.
    fn consumer(&self, record: &Record, tune: impl FnOnce(Builder) -> Builder) -> Instance {
        let builder = Consumer::builder()
            .name(&self.name)
            .redis(self.redis.url())
            .handler(record.clone());
        let stop = CancellationToken::new();
        let task = tokio::spawn(tune(builder).run_until(stop.clone().cancelled_owned()));
        Instance { stop, task }
    }

    /// A consumer with its own relay, once a first task went through both.
    async fn relaying(&self, record: &Record) -> Instance {
        let consumer = self.consumer(record, |b| b.outbox_relay(self.pool.clone()));
        let first = self.commit(&mail("first", 0), Options::new()).await;
        ran_once(record, &first, "the first task").await;
        consumer
    }

    /// A relay of the service alone, with `tune` applied.
    fn relay(
        &self,
        tune: impl FnOnce(
            peerq::postgres::RelayBuilder<peerq::Bincode>,
        ) -> peerq::postgres::RelayBuilder<peerq::Bincode>,
    ) -> Instance {
        let relay = tune(
            Relay::builder()
                .postgres(self.pool.clone())
                .name(&self.name)
                .redis(self.redis.url()),
        )
        .build()
        .unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(relay.run_until(stop.clone().cancelled_owned()));
        Instance { stop, task }
    }
}

type Builder = ConsumerBuilder<Mail, HandlerService<Record>, peerq::Bincode>;

/// A running consumer or relay.
struct Instance {
    stop: CancellationToken,
    task: JoinHandle<peerq::Result<()>>,
}

impl Instance {
    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// Writes `mail` for service `name` in a transaction of its own, and
/// commits it; its task id.
async fn commit(pool: &PgPool, name: &str, mail: &Mail, options: Options) -> String {
    let mut tx = pool.begin().await.unwrap();
    let id = Outbox::enqueue(&mut tx, name, mail, options).await.unwrap();
    tx.commit().await.unwrap();
    id.to_string()
}

/// Waits until each of `ids` ran, and then a while longer; checks that
/// each ran once, nothing else ran, and the outbox is empty.
async fn each_ran_once(world: &World, record: &Record, ids: &[String]) {
    wait_until(Duration::from_secs(60), "every task to run", || {
        record.counts().len() >= ids.len()
    })
    .await;
    // Two poll intervals: a second run would show by then.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let counts = record.counts();
    for id in ids {
        assert_eq!(counts.get(id), Some(&1), "{id}");
    }
    assert_eq!(counts.len(), ids.len(), "{counts:?}");
    assert_eq!(world.outbox_rows().await, 0, "relayed rows are deleted");
}

/// Waits until task `id` ran (`what` it is), and checks it ran once.
async fn ran_once(record: &Record, id: &str, what: &str) {
    wait_until(Duration::from_secs(60), what, || {
        record.counts().contains_key(id)
    })
    .await;
    assert_eq!(record.counts().get(id), Some(&1), "{what}");
}

/// Checks that each of `keys` ran seqs `0..per_key`, in that order.
fn in_commit_order(runs: &[Run], keys: &[&str], per_key: u64) {
    for key in keys {
        let seqs: Vec<u64> = runs
            .iter()
            .filter(|r| r.key == *key)
            .map(|r| r.seq)
            .collect();
        assert_eq!(
            seqs,
            (0..per_key).collect::<Vec<_>>(),
            "{key} in commit order"
        );
    }
}

fn mail(key: &str, seq: u64) -> Mail {
    Mail {
        key: key.to_owned(),
        seq,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_apply_once_even_from_four_processes_at_once() {
    let db = tokio::task::spawn_blocking(|| PostgresServer::shared().database())
        .await
        .unwrap();
    // A pool each, as four processes would have.
    let mut runs = Vec::new();
    for _ in 0..4 {
        let options = db.options();
        runs.push(tokio::spawn(async move {
            let pool = PgPool::connect_with(options).await.unwrap();
            peerq::postgres::migrate(&pool).await.unwrap()
        }));
    }
    let mut applied = Vec::new();
    for run in runs {
        applied.extend(run.await.unwrap().into_iter().map(|m| m.version));
    }
    applied.sort();
    let all = peerq::postgres::MIGRATIONS;
    let versions: Vec<i32> = all.iter().map(|m| m.version).collect();
    assert!(versions.starts_with(&[1, 2]), "{versions:?}");
    assert_eq!(applied, versions, "each migration applied by exactly one");
    let pool = PgPool::connect_with(db.options()).await.unwrap();
    assert!(
        peerq::postgres::migrate(&pool).await.unwrap().is_empty(),
        "twice: nothing"
    );
    let recorded: Vec<(i32, String)> =
        sqlx::query_as("SELECT version, name FROM peerq_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    let named: Vec<(i32, String)> = all.iter().map(|m| (m.version, m.name.to_owned())).collect();
    assert_eq!(
        &named[..2],
        [(1, "outbox".to_owned()), (2, "inbox".to_owned())]
    );
    assert_eq!(recorded, named);
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = 'public' ORDER BY table_name",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    // peerq's history is its own: the application's `_sqlx_migrations` is
    // left alone.
    assert_eq!(
        tables,
        [
            "peerq_fences",
            "peerq_inbox",
            "peerq_migrations",
            "peerq_outbox",
            "peerq_outbox_sent"
        ]
    );

    // A database whose history names a version otherwise is refused.
    let other = tokio::task::spawn_blocking(|| PostgresServer::shared().database())
        .await
        .unwrap();
    let pool = PgPool::connect_with(other.options()).await.unwrap();
    sqlx::raw_sql(
        "CREATE TABLE peerq_migrations (version int PRIMARY KEY, name text NOT NULL, \
         applied_at timestamptz NOT NULL DEFAULT now()); \
         INSERT INTO peerq_migrations (version, name) VALUES (1, 'orders')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let refused = peerq::postgres::migrate(&pool).await.unwrap_err();
    assert!(
        matches!(&refused, peerq::Error::Migration(m) if m.contains("version 1 as `orders`")),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolled_back_transaction_enqueues_nothing_and_a_committed_one_runs_once() {
    let world = World::new("outbox-commit").await;
    let record = Record::default();
    let consumer = world.consumer(&record, |b| b.outbox_relay(world.pool.clone()));

    let mut tx = world.pool.begin().await.unwrap();
    let rolled_back = Outbox::enqueue(&mut tx, &world.name, &mail("a", 1), Options::new())
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let committed = world.commit(&mail("a", 2), Options::new()).await;
    // Twice with one idempotency key: enqueued once.
    let once = Options::new().idempotency_key("order-1041-mail");
    let first = world.commit(&mail("b", 1), once.clone()).await;
    let second = world.commit(&mail("b", 2), once).await;

    wait_until(
        Duration::from_secs(30),
        "the committed tasks to run",
        || {
            let counts = record.counts();
            counts.contains_key(&committed) && counts.contains_key(&first)
        },
    )
    .await;
    // Several poll intervals more: nothing else arrives.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts = record.counts();
    assert_eq!(counts.get(&committed), Some(&1));
    assert_eq!(counts.get(&first), Some(&1));
    assert!(
        !counts.contains_key(&rolled_back.to_string()),
        "rolled back: {counts:?}"
    );
    assert!(
        !counts.contains_key(&second),
        "a repeat of the idempotency key: {counts:?}"
    );
    assert_eq!(counts.len(), 2, "{counts:?}");
    assert_eq!(world.outbox_rows().await, 0, "relayed rows are deleted");
    consumer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_at_once_run_each_task_once() {
    let world = World::new("outbox-three").await;
    let record = Record::default();
    // Three instances, each with its relay, and rows committed meanwhile.
    let consumers: Vec<Instance> = (0..3)
        .map(|_| world.consumer(&record, |b| b.outbox_relay(world.pool.clone())))
        .collect();
    let mut ids = Vec::new();
    for seq in 0..300 {
        // No key: the rows spread over every lane.
        ids.push(world.commit(&mail("none", seq), Options::new()).await);
    }
    each_ran_once(&world, &record, &ids).await;
    for consumer in consumers {
        consumer.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_key_order_holds_through_several_relays() {
    let world = World::new("outbox-order").await;
    let record = Record::default();
    let consumer = world.consumer(&record, |b| b.ordered(true));
    // Small batches: the relays take turns on each lane many times.
    let relays: Vec<Instance> = (0..3).map(|_| world.relay(|r| r.batch(3))).collect();
    const KEYS: [&str; 4] = ["user-1", "user-2", "user-3", "user-4"];
    const PER_KEY: u64 = 40;
    for seq in 0..PER_KEY {
        for key in KEYS {
            world.commit(&mail(key, seq), Options::new().key(key)).await;
        }
    }
    let total = KEYS.len() * PER_KEY as usize;
    wait_until(Duration::from_secs(60), "every task to run", || {
        record.runs().len() >= total
    })
    .await;
    let runs = record.runs();
    assert_eq!(runs.len(), total, "each once");
    in_commit_order(&runs, &KEYS, PER_KEY);
    for relay in relays {
        relay.stop().await;
    }
    consumer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_row_is_dead_lettered_and_the_rows_behind_it_flow() {
    let world = World::new("outbox-poison").await;
    let record = Record::default();
    // Ordered: the runs are recorded in the rows' order.
    let consumer = world.consumer(&record, |b| {
        b.ordered(true).outbox_relay(world.pool.clone())
    });
    let key = Options::new().key("user-9");
    let before = world.commit(&mail("user-9", 1), key.clone()).await;
    // The service's codec is bincode: a JSON row cannot run.
    let mut tx = world.pool.begin().await.unwrap();
    let wrong_codec =
        Outbox::enqueue_with_codec(&mut tx, &world.name, Json, &mail("user-9", 2), key.clone())
            .await
            .unwrap();
    tx.commit().await.unwrap();
    // Written by another tool, over the relay's 1 MiB: too large.
    let too_large = "too-large-0000";
    sqlx::query(
        "INSERT INTO peerq_outbox (service, task_id, lane, partition_key, codec, payload) \
         VALUES ($1, $2, $3, 'user-9', 'bincode', $4)",
    )
    .bind(&world.name)
    .bind(too_large)
    .bind(peerq::postgres::lane_of("user-9") as i32)
    .bind(vec![0u8; 2 * 1024 * 1024])
    .execute(&world.pool)
    .await
    .unwrap();
    let after = world.commit(&mail("user-9", 3), key).await;

    wait_until(
        Duration::from_secs(30),
        "the rows around the poison to run",
        || {
            let counts = record.counts();
            counts.contains_key(&before) && counts.contains_key(&after)
        },
    )
    .await;
    let seqs: Vec<u64> = record.runs().iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![1, 3]);
    let letters = world.dead_letters().await;
    let mut dead: Vec<(String, String, String)> = letters
        .iter()
        .map(|l| {
            (
                l.task_id.as_ref().unwrap().to_string(),
                l.reason.clone(),
                l.error.clone(),
            )
        })
        .collect();
    dead.sort();
    assert_eq!(dead.len(), 2, "{dead:?}");
    let by_id: HashMap<&str, (&str, &str)> = dead
        .iter()
        .map(|(id, reason, error)| (id.as_str(), (reason.as_str(), error.as_str())))
        .collect();
    let (reason, error) = by_id[wrong_codec.as_str()];
    assert_eq!(reason, "relay");
    assert!(error.contains("encoded with `json`"), "{error}");
    let (reason, error) = by_id[too_large];
    assert_eq!(reason, "relay");
    assert!(error.contains("`max_payload`"), "{error}");
    assert_eq!(
        world.outbox_rows().await,
        0,
        "the poison rows are deleted too"
    );
    consumer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delayed_row_runs_no_earlier_than_its_delay() {
    let world = World::new("outbox-delay").await;
    let record = Record::default();
    let consumer = world.consumer(&record, |b| b.outbox_relay(world.pool.clone()));
    let committed = SystemTime::now();
    let id = world
        .commit(&mail("a", 1), Options::new().delay(Duration::from_secs(3)))
        .await;
    wait_until(Duration::from_secs(30), "the delayed task to run", || {
        record.counts().contains_key(&id)
    })
    .await;
    let started = record.runs()[0].started;
    let waited = started.duration_since(committed).unwrap();
    assert!(
        waited >= Duration::from_millis(2900),
        "ran after {waited:?}"
    );
    consumer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_carries_on_after_redis_comes_back() {
    let aof = ServerOptions {
        aof: true,
        ..ServerOptions::default()
    };
    let world = World::with("outbox-redis-away", aof).await;
    let record = Record::default();
    let consumer = world.relaying(&record).await;
    // Redis away for three seconds; a row committed meanwhile waits in
    // the outbox, and the relay sends it once Redis is back.
    let World {
        redis, pool, name, ..
    } = world;
    let restarting = tokio::task::spawn_blocking(move || {
        let mut redis = redis;
        redis.kill_and_restart_after(Duration::from_secs(3));
        redis
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = commit(&pool, &name, &mail("a", 2), Options::new()).await;
    let _redis = restarting.await.unwrap();
    ran_once(&record, &second, "the task committed while redis was away").await;
    consumer.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_carries_on_after_postgres_comes_back() {
    if std::env::var_os(support::POSTGRES_URL_ENV).is_some() {
        // A given server is not ours to restart.
        return;
    }
    // A server of its own, to restart.
    let mut server = tokio::task::spawn_blocking(PostgresServer::start)
        .await
        .unwrap();
    let world = World::on(
        "outbox-pg-away",
        ServerOptions::default(),
        server.database(),
    )
    .await;
    let record = Record::default();
    let consumer = world.relaying(&record).await;
    // Postgres away for three seconds: the relay's connections, its
    // listener's too, break.
    server = tokio::task::spawn_blocking(move || {
        server.restart_after(Duration::from_secs(3));
        server
    })
    .await
    .unwrap();
    let second = world.commit(&mail("a", 2), Options::new()).await;
    ran_once(&record, &second, "a task committed once postgres was back").await;
    consumer.stop().await;
    drop(world);
    tokio::task::spawn_blocking(move || drop(server))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_relayed_is_refused_before_anything_is_written() {
    let world = World::new("outbox-refused").await;
    let mut tx = world.pool.begin().await.unwrap();
    let bad_name = Outbox::enqueue(&mut tx, "mail:sender", &mail("a", 1), Options::new()).await;
    assert!(
        matches!(
            bad_name,
            Err(peerq::Error::InvalidSetting {
                setting: "name",
                ..
            })
        ),
        "{bad_name:?}"
    );
    let huge = Mail {
        key: "x".repeat(2 * 1024 * 1024),
        seq: 1,
    };
    let too_large = Outbox::enqueue(&mut tx, &world.name, &huge, Options::new()).await;
    assert!(
        matches!(too_large, Err(peerq::Error::PayloadTooLarge { limit, .. }) if limit == 1024 * 1024),
        "{too_large:?}"
    );
    tx.commit().await.unwrap();
    assert_eq!(world.outbox_rows().await, 0);

    // A relay's settings, each refused by name.
    let refused = |relay: peerq::Result<Relay>| match relay {
        Err(peerq::Error::InvalidSetting { setting, .. }) => setting,
        other => panic!("not refused: {other:?}"),
    };
    let relay = || {
        Relay::builder()
            .postgres(world.pool.clone())
            .name(&world.name)
    };
    assert_eq!(refused(relay().batch(0).build()), "batch");
    assert_eq!(refused(relay().batch(10_001).build()), "batch");
    let poll = Duration::from_millis(1);
    assert_eq!(
        refused(relay().poll_interval(poll).build()),
        "poll_interval"
    );
    for grace in [Duration::from_secs(59), Duration::from_secs(8 * 24 * 3600)] {
        assert_eq!(refused(relay().record_grace(grace).build()), "record_grace");
    }
    assert_eq!(
        refused(Relay::builder().name(&world.name).build()),
        "postgres"
    );
    let unnamed = Relay::builder().postgres(world.pool.clone()).build();
    assert_eq!(refused(unnamed), "name");
}

/// With `wait_for_replicas`, a row the relay cannot send is deleted only
/// once its dead letter is on a replica: the letter and the row's delete
/// are the task's only copies, and a failover that lost a letter whose row
/// was deleted would lose the task (issue 36, item 2: the relay's dead
/// letter was written without a `WAIT`). With the replica gone the row
/// stays in the outbox, claim after claim; once a replica has synced the
/// row goes, with one letter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_row_is_deleted_only_once_its_dead_letter_is_replicated() {
    let world = World::new("outbox-poison-replicated").await;
    let redis = world.redis.url();
    let replica = world.redis.replica();
    let relay = world.relay(|b| {
        b.redis(peerq::Redis::url(&redis).wait_for_replicas(1, Duration::from_millis(100)))
            .poll_interval(Duration::from_millis(50))
    });
    // The service's codec is bincode: a JSON row cannot run.
    let mut tx = world.pool.begin().await.unwrap();
    let good = Outbox::enqueue(&mut tx, &world.name, &mail("user-1", 1), Options::new())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    world
        .wait_for_rows(0, Duration::from_secs(30), "the good row relayed")
        .await;
    drop(replica);
    let mut tx = world.pool.begin().await.unwrap();
    let poison = Outbox::enqueue_with_codec(
        &mut tx,
        &world.name,
        Json,
        &mail("user-1", 2),
        Options::new(),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    // Many claims' worth: each writes the letter (once), finds no replica
    // confirming it, and rolls back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        world.outbox_rows().await,
        1,
        "the poison row was deleted although no replica had its dead letter"
    );
    let _replica = world.redis.replica();
    world
        .wait_for_rows(
            0,
            Duration::from_secs(30),
            "the poison row deleted once a replica synced",
        )
        .await;
    let letters = world.dead_letters().await;
    let ids: Vec<String> = letters
        .iter()
        .map(|l| l.task_id.as_ref().unwrap().to_string())
        .collect();
    assert_eq!(
        ids,
        vec![poison.to_string()],
        "one letter, the poison row's (and not {good})"
    );
    relay.stop().await;
}
