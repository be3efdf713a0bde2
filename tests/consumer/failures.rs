//! Failures (docs/design.md §6) against a real redis-server: retries after a
//! growing backoff, errors that ask for a delay or for none, dead letters
//! listed, replayed once and purged, entries over `max_entry_bytes`, and
//! producer idempotency keys.
//! (Undecodable entries and panicking handlers: `tests/consumer/consumer.rs`.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis::AsyncCommands;
use deadpool_redis::redis::streams::{StreamPendingReply, StreamRangeReply};
use peerq::Backoff;
use peerq::Consumer;
use peerq::HandlerError;
use peerq::consumer::ConsumerBuilder;
use peerq::dead_letters::DeadLetters;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Bincode, Codec};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);
const P: u32 = 4;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Each run a handler saw: seq → (attempt, when) in order.
type Runs = Arc<Mutex<BTreeMap<u64, Vec<(u32, Instant)>>>>;

/// How the test's handler answers attempt `n` of task `seq`.
type Answer = fn(u64, u32) -> Result<(), HandlerError>;

/// A consumer whose handler records each run and answers with `answer`.
fn consumer(
    url: &str,
    name: &str,
    max_attempts: u32,
    answer: Answer,
) -> (Runs, CancellationToken, JoinHandle<peerq::Result<()>>) {
    consumer_with(url, name, max_attempts, answer, |builder| builder)
}

type Builder = ConsumerBuilder<(), (), Bincode>;

/// [`consumer`], with more settings made by `configure`.
fn consumer_with(
    url: &str,
    name: &str,
    max_attempts: u32,
    answer: Answer,
    configure: impl FnOnce(Builder) -> Builder,
) -> (Runs, CancellationToken, JoinHandle<peerq::Result<()>>) {
    support::init_tracing();
    let runs: Runs = Arc::default();
    let r = runs.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let r = r.clone();
        async move {
            let (seq, attempt) = (task.payload.seq, task.cx.attempt());
            r.lock()
                .unwrap()
                .entry(seq)
                .or_default()
                .push((attempt, Instant::now()));
            answer(seq, attempt)
        }
    });
    let builder = configure(Consumer::builder())
        .name(name)
        .redis(url)
        .partitions(P)
        .max_attempts(max_attempts)
        .backoff(Backoff::exponential(200 * MS, 5_000 * MS))
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    (runs, stop, task)
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

fn runs_of(runs: &Runs, seq: u64) -> Vec<(u32, Instant)> {
    runs.lock().unwrap().get(&seq).cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_wait_a_growing_backoff_and_count_their_attempts() {
    let server = RedisServer::start();
    let name = unique_name("backoff");
    // Fails its first four attempts.
    let (runs, stop, consumer) = consumer(&server.url(), &name, 10, |_, attempt| {
        if attempt <= 4 {
            Err(HandlerError::msg(format!("attempt {attempt} failed")))
        } else {
            Ok(())
        }
    });
    producer(&server.url(), &name)
        .await
        .enqueue(&Job { seq: 1 })
        .await
        .unwrap();
    wait_until(Duration::from_secs(20), "the fifth attempt", || {
        runs_of(&runs, 1).len() == 5
    })
    .await;
    tokio::time::sleep(300 * MS).await;
    let seen = runs_of(&runs, 1);
    assert_eq!(
        seen.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5],
        "one run per attempt, counting up, none after success"
    );
    // Backoff 200 ms doubling, with jitter: attempt n waits in
    // [100, 200] * 2^(n-1) ms (plus a little for the move and the read).
    let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].1 - w[0].1).collect();
    println!("gaps between attempts: {gaps:?}");
    for (n, gap) in gaps.iter().enumerate() {
        let full = 200 * MS * 2u32.pow(n as u32);
        assert!(
            *gap >= full / 2 - 5 * MS,
            "gap {n}: {gap:?} below {:?}",
            full / 2
        );
        assert!(
            *gap <= full + 1000 * MS,
            "gap {n}: {gap:?} far above {full:?}"
        );
    }
    stop.cancel();
    consumer.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_can_ask_for_its_own_delay_or_for_no_retry() {
    let server = RedisServer::start();
    let name = unique_name("disposition");
    let (runs, stop, consumer) = consumer(&server.url(), &name, 10, |seq, attempt| {
        match (seq, attempt) {
            (1, 1) => Err(HandlerError::msg("busy").retry_after(Duration::from_millis(1500))),
            (2, _) => Err(HandlerError::msg("no such user").permanent()),
            _ => Ok(()),
        }
    });
    let producer = producer(&server.url(), &name).await;
    producer
        .enqueue_batch(&[Job { seq: 1 }, Job { seq: 2 }])
        .await
        .unwrap();
    wait_until(Duration::from_secs(20), "the delayed retry", || {
        runs_of(&runs, 1).len() == 2
    })
    .await;
    let seen = runs_of(&runs, 1);
    let gap = seen[1].1 - seen[0].1;
    println!("retry_after(1.5 s) waited {gap:?}");
    assert!(gap >= 1500 * MS && gap < 3000 * MS, "{gap:?}");
    // The permanent failure ran once and went to the dead letters at once.
    let dead = DeadLetters::connect(&server.url(), &name).await.unwrap();
    let letters = dead.list(10).await.unwrap();
    assert_eq!(runs_of(&runs, 2).len(), 1);
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].reason, "permanent");
    assert_eq!(letters[0].error, "no such user");
    assert_eq!(letters[0].attempts, 1);
    stop.cancel();
    consumer.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_replayed_once_and_purged() {
    let server = RedisServer::start();
    let name = unique_name("dead");
    // Every task fails until it is replayed (attempt numbers restart at 1;
    // the replay is told apart by a flag the test sets).
    static REPLAYED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let (runs, stop, consumer) = consumer(&server.url(), &name, 2, |_, _| {
        if REPLAYED.load(std::sync::atomic::Ordering::SeqCst) {
            Ok(())
        } else {
            Err(HandlerError::msg("smtp down"))
        }
    });
    let producer = producer(&server.url(), &name).await;
    let jobs: Vec<Job> = (1..=3).map(|seq| Job { seq }).collect();
    let ids = producer.enqueue_batch(&jobs).await.unwrap();
    let dead = DeadLetters::connect(&server.url(), &name).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let letters = loop {
        let letters = dead.list(10).await.unwrap();
        if letters.len() == 3 {
            break letters;
        }
        assert!(
            Instant::now() < deadline,
            "only {} dead letters",
            letters.len()
        );
        tokio::time::sleep(50 * MS).await;
    };
    for seq in 1..=3 {
        assert_eq!(
            runs_of(&runs, seq).len(),
            2,
            "max_attempts(2): two runs, then dead"
        );
    }
    for letter in &letters {
        assert_eq!(letter.reason, "failed");
        assert_eq!(letter.error, "smtp down");
        assert_eq!(letter.attempts, 2);
        assert!(ids.contains(letter.task_id.as_ref().unwrap()));
        assert!(!letter.payload.is_empty(), "the original payload is kept");
    }

    // Replayed twice (two operators, or a retried call): it runs once, from
    // attempt 1.
    REPLAYED.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(dead.replay(&letters[0]).await.unwrap());
    assert!(
        !dead.replay(&letters[0]).await.unwrap(),
        "a second replay does nothing"
    );
    let task_id = letters[0].task_id.as_ref().unwrap();
    let replayed_seq = ids.iter().position(|id| id == task_id).unwrap() as u64 + 1;
    wait_until(Duration::from_secs(10), "the replay to run", || {
        runs_of(&runs, replayed_seq).len() == 3
    })
    .await;
    tokio::time::sleep(500 * MS).await;
    let replay_runs = runs_of(&runs, replayed_seq);
    assert_eq!(replay_runs.len(), 3, "one more run, not two");
    assert_eq!(replay_runs[2].0, 1, "the replay starts again at attempt 1");
    assert_eq!(dead.list(10).await.unwrap().len(), 2);

    // Purged: one, then the rest.
    let rest = dead.list(10).await.unwrap();
    assert!(dead.purge(&rest[0]).await.unwrap());
    assert_eq!(dead.purge_all().await.unwrap(), 1);
    assert!(dead.list(10).await.unwrap().is_empty());
    stop.cancel();
    consumer.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_over_max_entry_bytes_is_dead_lettered_as_it_was_and_never_run() {
    const LIMIT: usize = 64 * 1024;
    let server = RedisServer::start();
    let name = unique_name("too-large");
    let (runs, stop, consumer) = consumer_with(
        &server.url(),
        &name,
        3,
        |_, _| Ok(()),
        |b| b.max_entry_bytes(LIMIT),
    );
    let producer = producer(&server.url(), &name).await;
    let mut conn = server.pool().get().await.unwrap();
    // Added with a raw XADD, as anyone with access to Redis can: task 99,
    // whose payload decodes (it would run, but for a 64 KiB extra field),
    // and a payload of 64 KiB + 1 of bytes that do not decode (it would be
    // a `decode` dead letter, were it decoded).
    let valid = Bincode.encode(&Job { seq: 99 }).unwrap();
    let note = vec![b'x'; LIMIT];
    let garbage = vec![0xff; LIMIT + 1];
    type Fields<'a> = &'a [(&'a str, &'a [u8])];
    let huge: [(&str, Fields); 2] = [
        (
            "0",
            &[
                ("id", b"huge-valid"),
                ("attempt", b"1"),
                ("enqueued_at", b"0"),
                ("codec", b"bincode"),
                ("payload", &valid),
                ("note", &note),
            ],
        ),
        (
            "1",
            &[
                ("id", b"huge-garbage"),
                ("attempt", b"1"),
                ("enqueued_at", b"0"),
                ("codec", b"bincode"),
                ("payload", &garbage),
            ],
        ),
    ];
    for (p, fields) in huge {
        let _: String = conn
            .xadd(format!("{{{name}/{p}}}:stream"), "*", fields)
            .await
            .unwrap();
    }
    // Ordinary tasks after them, over all partitions.
    let jobs: Vec<Job> = (1..=8).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();

    let dead = DeadLetters::connect(&server.url(), &name).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let letters = loop {
        let letters = dead.list(10).await.unwrap();
        let ran = (1..=8).all(|seq| runs_of(&runs, seq).len() == 1);
        if letters.len() >= 2 && ran {
            break letters;
        }
        assert!(
            Instant::now() < deadline,
            "{} dead letters, runs {:?}",
            letters.len(),
            runs.lock().unwrap().keys().collect::<Vec<_>>()
        );
        tokio::time::sleep(50 * MS).await;
    };
    tokio::time::sleep(300 * MS).await;
    assert!(
        runs_of(&runs, 99).is_empty(),
        "the handler never saw task 99"
    );
    assert_eq!(dead.list(10).await.unwrap().len(), 2, "{letters:?}");
    for letter in &letters {
        eprintln!(
            "dead letter {:?}: {} ({}), payload {} bytes",
            letter.task_id,
            letter.reason,
            letter.error,
            letter.payload.len()
        );
        assert_eq!(letter.reason, "too_large");
        assert!(
            letter.error.contains(&format!(
                "exceeds the limit of {LIMIT} bytes (`max_entry_bytes`)"
            )),
            "{}",
            letter.error
        );
        // Kept as it was, to be inspected, or replayed under a larger limit.
        let (id, payload) = if letter.partition == 0 {
            ("huge-valid", &valid)
        } else {
            ("huge-garbage", &garbage)
        };
        assert_eq!(letter.task_id.as_ref().map(|t| t.as_str()), Some(id));
        assert_eq!(&letter.payload, payload);
    }
    let kept: StreamRangeReply = conn.xrange_all(format!("{{{name}/0}}:dead")).await.unwrap();
    let kept_note: Vec<u8> = kept.ids[0].get("note").unwrap();
    assert_eq!(kept_note, note, "the extra field is kept too");
    // Moved, so nothing is left pending to be claimed and tried again.
    for p in 0..P {
        let pending: StreamPendingReply = conn
            .xpending(format!("{{{name}/{p}}}:stream"), "peerq")
            .await
            .unwrap();
        assert_eq!(pending.count(), 0, "partition {p}");
    }
    stop.cancel();
    consumer.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_enqueued_twice_runs_once() {
    let server = RedisServer::start();
    let name = unique_name("idempotent");
    let (runs, stop, consumer) = consumer(&server.url(), &name, 3, |_, _| Ok(()));
    let producer = producer(&server.url(), &name).await;
    let once = Options::new().idempotency_key("order-1041");
    let first = producer
        .enqueue_with(Job { seq: 1 }, once.clone())
        .await
        .unwrap();
    // The producer retries, as after an ambiguous error: same key.
    let again = producer.enqueue_with(Job { seq: 2 }, once).await.unwrap();
    assert_eq!(
        first, again,
        "the second enqueue returns the first task's id"
    );
    // Another key is another task.
    producer
        .enqueue_with(Job { seq: 3 }, Options::new().idempotency_key("order-1042"))
        .await
        .unwrap();
    wait_until(Duration::from_secs(10), "the tasks to run", || {
        runs.lock().unwrap().len() >= 2
    })
    .await;
    tokio::time::sleep(1000 * MS).await;
    let seen: Vec<u64> = runs.lock().unwrap().keys().copied().collect();
    assert_eq!(seen, vec![1, 3], "the repeated key enqueued nothing");
    stop.cancel();
    consumer.await.unwrap().unwrap();
}
