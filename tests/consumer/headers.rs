//! Task headers (docs/design.md §18) with in-process instances against a
//! real redis-server: a task's headers reach its handler on every path it
//! can take — a first run (enqueued alone or in a batch, with or without
//! the enqueue script), a retry enqueued again, a retry through the delayed
//! set, a delayed enqueue, a retry in place (ordered), a take-over of an
//! entry a gone consumer held, a hand-back at a graceful leave, a periodic
//! job's trigger, a dead letter and its replay — and a field the format
//! does not know survives them too. (The outbox relay: `tests/postgres`;
//! the CLI and the dashboard: `tests/operating`.)

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis::{self, AsyncCommands};
use peerq::consumer::ConsumerBuilder;
use peerq::dead_letters::DeadLetters;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Backoff, Bincode, Codec, Consumer, HandlerError, Headers, Periodic};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

use crate::Instance;

const MS: Duration = Duration::from_millis(1);
const P: u32 = 2;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Each run: seq → (instance, attempt, headers) in order.
type Runs = Arc<Mutex<BTreeMap<u64, Vec<(usize, u32, Headers)>>>>;

/// How the handler answers attempt `n` of task `seq`.
type Answer = fn(u64, u32) -> Result<(), HandlerError>;

type Builder = ConsumerBuilder<(), (), Bincode>;

/// Instance `me`, whose handler records each run and answers with
/// `answer`, taking `work` per task; `configure` sets the rest.
fn instance(
    url: &str,
    name: &str,
    me: usize,
    runs: &Runs,
    answer: Answer,
    work: Duration,
    configure: impl FnOnce(Builder) -> Builder,
) -> Instance {
    support::init_tracing();
    let runs = runs.clone();
    let service = tower::service_fn(move |task: Task<Job>| {
        let runs = runs.clone();
        async move {
            let (seq, attempt) = (task.payload.seq, task.cx.attempt());
            let headers = task.cx.headers().clone();
            runs.lock()
                .unwrap()
                .entry(seq)
                .or_default()
                .push((me, attempt, headers));
            tokio::time::sleep(work).await;
            answer(seq, attempt)
        }
    });
    let builder = configure(Consumer::builder())
        .name(name)
        .redis(url)
        .partitions(P)
        .interval(Duration::from_millis(500))
        .drain_timeout(Duration::from_millis(200))
        .max_attempts(3)
        .backoff(Backoff::exponential(100 * MS, 200 * MS))
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    Instance { stop, task }
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

/// The headers every test's task `seq` carries.
fn expected(seq: u64) -> Headers {
    let mut headers = Headers::new();
    headers.insert("seq", seq.to_string());
    headers.insert("trace", format!("t-{seq}"));
    headers
}

fn with_headers(seq: u64) -> Options {
    expected(seq)
        .iter()
        .fold(Options::new(), |o, (n, v)| o.header(n, v))
}

fn runs_of(runs: &Runs, seq: u64) -> Vec<(usize, u32, Headers)> {
    runs.lock().unwrap().get(&seq).cloned().unwrap_or_default()
}

/// Every run of `seq` saw its headers; returns its attempts.
fn assert_headers_every_run(runs: &Runs, seq: u64) -> Vec<u32> {
    let seen = runs_of(runs, seq);
    for (_, attempt, headers) in &seen {
        assert_eq!(headers, &expected(seq), "seq {seq}, attempt {attempt}");
    }
    seen.iter().map(|r| r.1).collect()
}

fn ok(_: u64, _: u32) -> Result<(), HandlerError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_reach_the_handler_alone_in_a_batch_through_retries_and_delays() {
    let server = RedisServer::start();
    let name = unique_name("headers");
    let runs: Runs = Arc::default();
    // 1: fails once, enqueued again at once; 2: fails once, retried
    // through the delayed set; the rest succeed.
    let answer: Answer = |seq, attempt| match (seq, attempt) {
        (1, 1) => Err(HandlerError::msg("again").retry_after(Duration::ZERO)),
        (2, 1) => Err(HandlerError::msg("later")),
        _ => Ok(()),
    };
    let a = instance(&server.url(), &name, 0, &runs, answer, MS, |b| b);
    let producer = producer(&server.url(), &name).await;
    for seq in [1, 2] {
        producer
            .enqueue_with(&Job { seq }, with_headers(seq))
            .await
            .unwrap();
    }
    // 3: delayed; 4 and 5 in a batch (5 with a key: both without the
    // script), 6 delayed in the batch (with it).
    let delayed = with_headers(3).delay(300 * MS);
    producer
        .enqueue_with(&Job { seq: 3 }, delayed)
        .await
        .unwrap();
    let batch = vec![
        (Job { seq: 4 }, with_headers(4)),
        (Job { seq: 5 }, with_headers(5).key("k")),
        (Job { seq: 6 }, with_headers(6).delay(200 * MS)),
    ];
    producer.enqueue_batch_with(&batch).await.unwrap();
    wait_until(Duration::from_secs(15), "every run", || {
        (1..=6).all(|seq| runs_of(&runs, seq).len() == if seq <= 2 { 2 } else { 1 })
    })
    .await;
    a.leave().await;
    for seq in 1..=6 {
        let attempts = assert_headers_every_run(&runs, seq);
        let want = if seq <= 2 { vec![1, 2] } else { vec![1] };
        assert_eq!(attempts, want, "seq {seq}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_keeps_the_headers_and_its_replay_runs_with_them() {
    let server = RedisServer::start();
    let name = unique_name("headers-dead");
    let runs: Runs = Arc::default();
    // Fails for good on its first run, succeeds once replayed.
    let answer: Answer = |_, _| Err(HandlerError::msg("no").permanent());
    let a = instance(&server.url(), &name, 0, &runs, answer, MS, |b| b);
    let producer = producer(&server.url(), &name).await;
    producer
        .enqueue_with(&Job { seq: 1 }, with_headers(1))
        .await
        .unwrap();
    let dead = DeadLetters::connect(&server.url(), &name).await.unwrap();
    let mut letters = Vec::new();
    wait_until(Duration::from_secs(10), "the dead letter", || {
        !runs_of(&runs, 1).is_empty()
    })
    .await;
    for _ in 0..100 {
        letters = dead.list(10).await.unwrap();
        if !letters.is_empty() {
            break;
        }
        tokio::time::sleep(50 * MS).await;
    }
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].headers, expected(1), "the letter's headers");
    let json = serde_json::to_value(&letters[0]).unwrap();
    assert_eq!(json["headers"]["trace"], "t-1", "{json}");
    assert!(dead.replay(&letters[0]).await.unwrap());
    wait_until(Duration::from_secs(10), "the replayed run", || {
        runs_of(&runs, 1).len() == 2
    })
    .await;
    a.leave().await;
    assert_eq!(assert_headers_every_run(&runs, 1), vec![1, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ordered_retry_in_place_and_a_periodic_trigger_keep_their_headers() {
    let server = RedisServer::start();
    let name = unique_name("headers-ordered");
    let runs: Runs = Arc::default();
    let answer: Answer = |seq, attempt| match (seq, attempt) {
        (1, 1) => Err(HandlerError::msg("in place")),
        _ => Ok(()),
    };
    let tick = expected(1_000)
        .iter()
        .fold(Periodic::every("tick", 300 * MS), |j, (n, v)| {
            j.header(n, v)
        });
    let a = instance(&server.url(), &name, 0, &runs, answer, MS, |b| {
        b.ordered(true).periodic(tick, &Job { seq: 1_000 })
    });
    let producer = producer(&server.url(), &name).await;
    producer
        .enqueue_with(&Job { seq: 1 }, with_headers(1))
        .await
        .unwrap();
    wait_until(Duration::from_secs(10), "the retry and a tick", || {
        runs_of(&runs, 1).len() == 2 && !runs_of(&runs, 1_000).is_empty()
    })
    .await;
    a.leave().await;
    assert_eq!(assert_headers_every_run(&runs, 1), vec![1, 2]);
    assert_headers_every_run(&runs, 1_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_a_gone_consumer_held_is_taken_over_with_its_headers_and_unknown_fields() {
    let server = RedisServer::start();
    let name = unique_name("headers-taken");
    let mut conn = server.pool().get().await.unwrap();
    // Partition 0's entry, written as a producer in another language
    // would (a header, and a field of a later format), read by a consumer
    // that is gone: pending there.
    let stream = format!("{{{name}/0}}:stream");
    let _: () = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&stream)
        .arg("peerq")
        .arg("0")
        .arg("MKSTREAM")
        .query_async(&mut *conn)
        .await
        .unwrap();
    let payload = Bincode.encode(&Job { seq: 1 }).unwrap();
    let mut fields: Vec<(String, Vec<u8>)> = vec![
        ("id".into(), b"task-1".to_vec()),
        ("attempt".into(), b"1".to_vec()),
        ("enqueued_at".into(), b"1700000000000".to_vec()),
        ("codec".into(), b"bincode".to_vec()),
        ("payload".into(), payload),
        ("lineage".into(), b"import-7".to_vec()),
    ];
    fields.extend(
        expected(1)
            .iter()
            .map(|(n, v)| (format!("h:{n}"), v.as_bytes().to_vec())),
    );
    let _: String = conn.xadd(&stream, "*", &fields).await.unwrap();
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("peerq")
        .arg("gone")
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut *conn)
        .await
        .unwrap();
    let runs: Runs = Arc::default();
    // Fails once (its retry is a new entry, which keeps them too), then
    // for good: its dead letter, never trimmed, shows what its last entry
    // held.
    let answer: Answer = |_, attempt| match attempt {
        2 => Err(HandlerError::msg("once more").retry_after(Duration::ZERO)),
        _ => Err(HandlerError::msg("no").permanent()),
    };
    let a = instance(&server.url(), &name, 0, &runs, answer, MS, |b| b);
    let dead = format!("{{{name}/0}}:dead");
    let mut letters = redis::streams::StreamRangeReply::default();
    for _ in 0..300 {
        letters = conn.xrange_all(&dead).await.unwrap();
        if !letters.ids.is_empty() {
            break;
        }
        tokio::time::sleep(50 * MS).await;
    }
    a.leave().await;
    // Taken over at attempt 2 (it may have run on the gone consumer).
    assert_eq!(assert_headers_every_run(&runs, 1), vec![2, 3]);
    assert_eq!(letters.ids.len(), 1, "its dead letter");
    let letter = &letters.ids[0];
    let lineage: Option<String> = letter.get("lineage");
    assert_eq!(lineage.as_deref(), Some("import-7"), "{:?}", letter.map);
    let trace: Option<String> = letter.get("h:trace");
    assert_eq!(trace.as_deref(), Some("t-1"), "{:?}", letter.map);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_handed_back_at_a_graceful_leave_run_on_the_next_owner_with_their_headers() {
    let server = RedisServer::start();
    let name = unique_name("headers-handed");
    let runs: Runs = Arc::default();
    // One at a time, 200 ms each: the leaving instance has read more than
    // it starts before its drain ends.
    let one_at_a_time = |b: Builder| b.concurrency(1).batch(20);
    let a = instance(&server.url(), &name, 0, &runs, ok, 200 * MS, one_at_a_time);
    let producer = producer(&server.url(), &name).await;
    let batch: Vec<(Job, Options)> = (0..20)
        .map(|seq| (Job { seq }, with_headers(seq).key("one")))
        .collect();
    producer.enqueue_batch_with(&batch).await.unwrap();
    wait_until(Duration::from_secs(10), "the first start", || {
        !runs_of(&runs, 0).is_empty()
    })
    .await;
    let b = instance(&server.url(), &name, 1, &runs, ok, MS, one_at_a_time);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.leave().await;
    wait_until(Duration::from_secs(20), "every task", || {
        (0..20).all(|seq| !runs_of(&runs, seq).is_empty())
    })
    .await;
    b.leave().await;
    let on_b = (0..20)
        .filter(|seq| runs_of(&runs, *seq).iter().any(|r| r.0 == 1 && r.1 == 1))
        .count();
    assert!(on_b > 0, "nothing was handed to the next owner");
    for seq in 0..20 {
        assert_headers_every_run(&runs, seq);
    }
}

#[tokio::test]
async fn headers_out_of_their_bounds_are_refused_by_name_and_nothing_is_enqueued() {
    let server = RedisServer::start();
    let name = unique_name("headers-refused");
    let producer = producer(&server.url(), &name).await;
    let many = (0..33).fold(Options::new(), |o, i| o.header(format!("h{i}"), "v"));
    let large = Options::new().header("big", "x".repeat(5_000));
    let odd = Options::new().header("no spaces", "v");
    for bad in [many, large, odd] {
        let e = producer
            .enqueue_with(&Job { seq: 1 }, bad.clone())
            .await
            .unwrap_err();
        assert!(e.to_string().starts_with("invalid setting `header`"), "{e}");
        let e = producer
            .enqueue_batch_with(&[(Job { seq: 2 }, bad)])
            .await
            .unwrap_err();
        assert!(e.to_string().starts_with("invalid setting `header`"), "{e}");
    }
    let mut conn = server.pool().get().await.unwrap();
    let streams: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{{{name}/*}}:stream"))
        .query_async(&mut *conn)
        .await
        .unwrap();
    assert!(streams.is_empty(), "enqueued: {streams:?}");
}
