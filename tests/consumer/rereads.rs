//! Entries this instance finds in its own pending list (docs/design.md §6,
//! attempt counting): they may have run before, here or elsewhere, so
//! whatever happens next their next run has a higher attempt, here or on
//! another instance after a hand-back. Found by the chaos run
//! (RELIABILITY.md): a concurrent service ran such an entry again with
//! attempt 1.
//!
//! Two ways an entry that ran gets there:
//! - its ack was refused (a newer owner), and this instance acquired the
//!   partition again: the claim on acquire takes it over;
//! - a claim of it (from a consumer that ran it) landed in Redis but its
//!   reply never arrived (a connection cut, a Redis restart): the re-read
//!   after the failed command finds it, without a claim's take-over.
//!
//! Both are made by hand: the first by writing the partition's owner
//! record with the next epoch's token and another id during the run, as a
//! newer owner's acquire does; the second by a script that has another
//! consumer read the entry and then claims it for this instance, followed
//! by a cut of every client connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis::{self, AsyncCommands};
use peerq::handler::Task;
use peerq::producer::Options;
use peerq::{Bincode, Codec, Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

use crate::Instance;

const INTERVAL: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// One run: the task, its attempt and the fencing token it ran under.
#[derive(Debug, Clone, Copy)]
struct Run {
    instance: &'static str,
    seq: u64,
    attempt: u32,
    token: u64,
}

type Runs = Arc<Mutex<Vec<Run>>>;

/// The task whose first run has its ack refused.
const REFUSED: u64 = 1;
/// The task another consumer ran, claimed for this instance by a claim
/// whose reply never arrived.
const CLAIMED: u64 = 3;
/// A task that holds its key (one at a time per key) until interrupted.
const HOLDER: u64 = 2;

/// A consumer named `instance`; its handler logs each run, makes a newer
/// owner of task `REFUSED`'s partition during that task's first run, and
/// holds task `HOLDER` until interrupted on instance `a`.
fn start(url: &str, name: &str, instance: &'static str, partitions: u32, runs: &Runs) -> Instance {
    support::init_tracing();
    let client = redis::Client::open(url).unwrap();
    let (runs, name_) = (runs.clone(), name.to_owned());
    let service = tower::service_fn(move |task: Task<Job>| {
        let (runs, client, name) = (runs.clone(), client.clone(), name_.clone());
        async move {
            let cx = &task.cx;
            let seq = task.payload.seq;
            let first = !runs.lock().unwrap().iter().any(|r| r.seq == seq);
            runs.lock().unwrap().push(Run {
                instance,
                seq,
                attempt: cx.attempt(),
                token: cx.fencing_token(),
            });
            if seq == REFUSED && first {
                let owner = format!("{{{name}/{}}}:owner", cx.partition());
                let newer = format!("{}:a-newer-owner", cx.fencing_token() + 1);
                let mut conn = client.get_multiplexed_async_connection().await.unwrap();
                let () = conn.set(owner, newer).await.unwrap();
            }
            if seq == HOLDER && instance == "a" {
                task.cx.cancelled().await;
                return Err(HandlerError::msg("interrupted"));
            }
            Ok::<(), HandlerError>(())
        }
    });
    let builder = Consumer::builder()
        .name(name)
        .redis(url)
        .interval(INTERVAL)
        .drain_timeout(Duration::from_millis(300))
        .partitions(partitions)
        .concurrency_per_key(1)
        // Only the claim on acquire and the re-read find what is left in a
        // pending list during a test.
        .claim_idle(Duration::from_secs(600))
        .service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    Instance { stop, task }
}

fn runs_of(runs: &Runs, seq: u64) -> Vec<Run> {
    runs.lock()
        .unwrap()
        .iter()
        .filter(|r| r.seq == seq)
        .copied()
        .collect()
}

/// The instance id in `p`'s owner record (`<token>:<id>`), once there is
/// one.
async fn owner_of(server: &RedisServer, name: &str, p: u32) -> String {
    let mut conn = server.connection().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let record: Option<String> = conn.get(format!("{{{name}/{p}}}:owner")).await.unwrap();
        if let Some(record) = record {
            return record.split_once(':').expect("<token>:<id>").1.to_owned();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "partition {p} has no owner"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Task `seq` as the producer writes it, read by another consumer (it ran
/// there), then claimed for `owner` by a claim whose reply `owner` never
/// saw: in one script, so that `owner` cannot read it first.
const RAN_ELSEWHERE_THEN_CLAIMED: &str = r"
local id = redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'attempt', '1',
  'enqueued_at', ARGV[2], 'codec', 'bincode', 'key', ARGV[5], 'payload', ARGV[3])
redis.call('XREADGROUP', 'GROUP', 'peerq', 'another-consumer', 'COUNT', 1, 'STREAMS', KEYS[1], '>')
redis.call('XCLAIM', KEYS[1], 'peerq', ARGV[4], 0, id)
return id
";

/// Puts task `CLAIMED` (with `key`) of partition `p` in `owner`'s pending
/// list as [`RAN_ELSEWHERE_THEN_CLAIMED`] says, then cuts every client's
/// connection, so that `owner`'s next command fails and it re-reads its
/// pending list; the entry's id.
async fn claimed_then_cut(
    server: &RedisServer,
    name: &str,
    p: u32,
    owner: &str,
    key: &str,
) -> String {
    let mut conn = server.connection().await;
    let now = std::time::SystemTime::now();
    let enqueued_ms = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let payload = Bincode.encode(&Job { seq: CLAIMED }).unwrap();
    let id: String = redis::Script::new(RAN_ELSEWHERE_THEN_CLAIMED)
        .key(format!("{{{name}/{p}}}:stream"))
        .arg(format!("claimed-{CLAIMED}"))
        .arg(enqueued_ms.to_string())
        .arg(payload)
        .arg(owner)
        .arg(key)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    let _: redis::Value = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query_async(&mut conn)
        .await
        .unwrap();
    id
}

/// How often Redis has delivered entry `id` of partition `p` (0: it is
/// not pending).
async fn deliveries(server: &RedisServer, name: &str, p: u32, id: &str) -> u64 {
    let mut conn = server.connection().await;
    let reply: redis::streams::StreamPendingCountReply = redis::cmd("XPENDING")
        .arg(format!("{{{name}/{p}}}:stream"))
        .arg("peerq")
        .arg(id)
        .arg(id)
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    reply.ids.first().map_or(0, |e| e.times_delivered as u64)
}

/// Its ack refused, the entry stays in the pending list of the instance
/// that ran it, which takes it over when it acquires the partition again,
/// and runs it with the next attempt. (This path was right before the
/// chaos run's fix too: the claim on acquire takes over this instance's
/// own entries as well.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_whose_ack_was_refused_runs_again_here_with_a_higher_attempt() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("refused-ack"));
    let runs = Runs::default();
    let instance = start(&url, &name, "a", 1, &runs);
    let producer = crate::producer(&url, &name, 1).await;
    producer.enqueue(Job { seq: REFUSED }).await.unwrap();

    let ran_twice = || runs_of(&runs, REFUSED).len() >= 2;
    wait_until(Duration::from_secs(15), "a second run", ran_twice).await;
    let both = runs_of(&runs, REFUSED);
    assert!(
        both[1].token > both[0].token,
        "the second run is under a newer tenure: {both:?}"
    );
    assert!(
        both[1].attempt > both[0].attempt,
        "it ran before (its ack was refused), so it runs again with a higher attempt: {both:?}"
    );
    instance.leave().await;
}

/// Task `CLAIMED`'s one run, once it ran: with a higher attempt than the
/// 1 it ran with elsewhere.
async fn the_claimed_entrys_run(runs: &Runs) -> Run {
    wait_until(Duration::from_secs(15), "the claimed entry's run", || {
        !runs_of(runs, CLAIMED).is_empty()
    })
    .await;
    let ran = runs_of(runs, CLAIMED);
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert!(
        ran[0].attempt > 1,
        "it ran elsewhere with attempt 1, so it runs again with a higher one: {ran:?}"
    );
    ran[0]
}

/// Claimed for this instance by a claim whose reply never arrived, found
/// by the re-read after the cut, the entry runs with a higher attempt than
/// the one it ran with elsewhere. Fails without the fix: attempt 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_a_lost_claim_left_in_the_pending_list_runs_with_a_higher_attempt() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("lost-claim"));
    let runs = Runs::default();
    let instance = start(&url, &name, "a", 1, &runs);
    let owner = owner_of(&server, &name, 0).await;
    claimed_then_cut(&server, &name, 0, &owner, "k").await;

    let ran = the_claimed_entrys_run(&runs).await;
    assert_eq!(ran.instance, "a");
    instance.leave().await;
}

/// The same entry, read back but released before it started (it waited
/// aside for its key, which a task holds until interrupted): handed back
/// with the attempt it would have run with, and run so on the next
/// instance. Fails without the fix: attempt 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_a_lost_claim_left_in_the_pending_list_is_handed_back_with_a_higher_attempt() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("lost-claim-back"));
    let runs = Runs::default();
    let a = start(&url, &name, "a", 1, &runs);
    let producer = crate::producer(&url, &name, 1).await;
    producer
        .enqueue_with(Job { seq: HOLDER }, Options::new().key("k"))
        .await
        .unwrap();
    wait_until(Duration::from_secs(10), "the holder's run", || {
        !runs_of(&runs, HOLDER).is_empty()
    })
    .await;
    let owner = owner_of(&server, &name, 0).await;
    let id = claimed_then_cut(&server, &name, 0, &owner, "k").await;
    // Read back by A (its third delivery), waiting for its key.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while deliveries(&server, &name, 0, &id).await < 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "A never re-read its pending list"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        runs_of(&runs, CLAIMED).is_empty(),
        "it waits for the permit"
    );
    a.leave().await;
    assert!(runs_of(&runs, CLAIMED).is_empty(), "handed back unstarted");
    assert_eq!(
        deliveries(&server, &name, 0, &id).await,
        0,
        "handed back, not left pending"
    );

    let b = start(&url, &name, "b", 1, &runs);
    let ran = the_claimed_entrys_run(&runs).await;
    assert_eq!(ran.instance, "b");
    b.leave().await;
}
