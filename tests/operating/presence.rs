//! What instances tell operators (docs/design.md §7), against a real
//! redis-server: the `{N}:members` records (written each round, pruned when
//! stale, removed on leave), the per-minute counts `{N}:stats:<minute>`
//! (equal to the tasks handled, also when a partition of the network makes
//! flushes arrive late and be sent again), and `{N}:periodic`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, AsyncCommands};
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::{Consumer, HandlerError};
use peerq::{Missed, Periodic};
use serde::{Deserialize, Serialize};
use support::{Proxy, RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);
const P: u32 = 4;
const INTERVAL: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// A consumer of `name` at `url` whose handler counts its successful runs;
/// seq % 5 == 4 fails for good (a dead letter). `jobs`: with two periodic
/// jobs (whose tasks it would run too: one catches up at start).
fn consume(
    url: &str,
    name: &str,
    handled: Arc<AtomicU64>,
    jobs: bool,
) -> (
    CancellationToken,
    tokio::task::JoinHandle<peerq::Result<()>>,
) {
    support::init_tracing();
    let service = tower::service_fn(move |task: Task<Job>| {
        let handled = handled.clone();
        async move {
            if task.payload.seq % 5 == 4 {
                return Err(HandlerError::msg("no such mailbox").permanent());
            }
            handled.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    });
    let mut builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .interval(INTERVAL)
        .drain_timeout(100 * MS);
    if jobs {
        let nightly = Periodic::cron("nightly", "0 30 2 * * *").unwrap();
        builder = builder
            .periodic(
                Periodic::every("digest", Duration::from_secs(3600)),
                &Job { seq: 1_000_000 },
            )
            .periodic(nightly.missed(Missed::RunOnce), &Job { seq: 1_000_001 });
    }
    let builder = builder.service(service);
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    (stop, task)
}

async fn members(server: &RedisServer, name: &str) -> HashMap<String, serde_json::Value> {
    let mut conn = server.pool().get().await.unwrap();
    let raw: HashMap<String, String> = conn.hgetall(format!("{{{name}}}:members")).await.unwrap();
    raw.into_iter()
        .map(|(id, json)| (id, serde_json::from_str(&json).unwrap()))
        .collect()
}

/// The sums of the per-minute counts from `since` to now.
async fn counts(server: &RedisServer, name: &str, since: SystemTime) -> HashMap<String, u64> {
    let minute = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_secs() / 60;
    let mut conn = server.pool().get().await.unwrap();
    let mut sums = HashMap::new();
    for m in minute(since)..=minute(SystemTime::now()) {
        let counts: HashMap<String, u64> =
            conn.hgetall(format!("{{{name}}}:stats:{m}")).await.unwrap();
        // The counts; `backlog:<instance>` is a gauge, read elsewhere.
        for (field, n) in counts
            .into_iter()
            .filter(|(f, _)| !f.starts_with("backlog:"))
        {
            *sums.entry(field).or_default() += n;
        }
    }
    sums
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_recorded_each_round_pruned_when_stale_and_removed_on_leave() {
    let server = RedisServer::start();
    let name = unique_name("members");
    let (a, b) = (Arc::default(), Arc::default());
    let (stop_a, run_a) = consume(&server.url(), &name, a, false);
    let (stop_b, run_b) = consume(&server.url(), &name, b, false);
    // A record of an instance that died without leaving, last seen long ago.
    let mut conn = server.pool().get().await.unwrap();
    let stale = serde_json::json!({ "id": "gone-1", "seen_at_ms": 1 }).to_string();
    let _: () = conn
        .hset(format!("{{{name}}}:members"), "gone-1", stale)
        .await
        .unwrap();

    let mut both = HashMap::new();
    for _ in 0..200 {
        both = members(&server, &name).await;
        let assigned = both
            .values()
            .filter(|m| m["standing"] == "assigned" && m["replicas"] == 2)
            .count();
        let owned: u64 = both
            .values()
            .map(|m| m["owned"].as_u64().unwrap_or(0))
            .sum();
        if both.len() == 2 && assigned == 2 && owned == u64::from(P) {
            break;
        }
        tokio::time::sleep(50 * MS).await;
    }
    assert_eq!(both.len(), 2, "the stale record pruned, two live: {both:?}");
    let mut indices: Vec<u64> = both
        .values()
        .map(|m| m["index"].as_u64().unwrap())
        .collect();
    indices.sort_unstable();
    assert_eq!(indices, [1, 2]);
    for (id, m) in &both {
        assert_eq!(m["id"], id.as_str());
        assert_eq!(m["pid"], std::process::id());
        assert_eq!(m["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(m["weight"], 1);
        assert!(m["host"].as_str().is_some_and(|h| !h.is_empty()));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let seen = m["seen_at_ms"].as_u64().unwrap();
        assert!(
            now - seen < 3 * INTERVAL.as_millis() as u64,
            "seen each round: {m}"
        );
        assert!(m["started_at_ms"].as_u64().unwrap() <= seen);
    }
    let owned: u64 = both.values().map(|m| m["owned"].as_u64().unwrap()).sum();
    assert_eq!(owned, u64::from(P), "every partition owned once");

    // A graceful leave removes its record.
    stop_b.cancel();
    run_b.await.unwrap().unwrap();
    let mut left = HashMap::new();
    for _ in 0..100 {
        left = members(&server, &name).await;
        if left.len() == 1 {
            break;
        }
        tokio::time::sleep(50 * MS).await;
    }
    assert_eq!(left.len(), 1, "{left:?}");
    stop_a.cancel();
    run_a.await.unwrap().unwrap();
    assert!(
        members(&server, &name).await.is_empty(),
        "the last one left too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_minute_counts_equal_the_tasks_handled_across_a_partition() {
    let since = SystemTime::now();
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let name = unique_name("stats");
    let handled = Arc::new(AtomicU64::new(0));
    let (stop, run) = consume(&proxy.url(), &name, handled.clone(), false);
    let producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(P)
        .connect()
        .await
        .unwrap();
    let count = 500;
    for chunk in (0..count).collect::<Vec<u64>>().chunks(50) {
        let jobs: Vec<Job> = chunk.iter().map(|&seq| Job { seq }).collect();
        producer.enqueue_batch(&jobs).await.unwrap();
        tokio::time::sleep(20 * MS).await;
    }
    // A partition that heals: what the instance sent during it (rounds,
    // counts, acks) arrives late, after the instance gave up on the
    // replies and sends again.
    proxy.hold();
    tokio::time::sleep(3 * INTERVAL).await;
    proxy.restore();
    let (ok, dead) = (count - count / 5, count / 5);
    let mut sums = HashMap::new();
    for _ in 0..400 {
        sums = counts(&server, &name, since).await;
        if sums.get("ok") == Some(&ok) && sums.get("dead") == Some(&dead) {
            break;
        }
        tokio::time::sleep(50 * MS).await;
    }
    // A few rounds more: nothing is counted twice later either.
    tokio::time::sleep(4 * INTERVAL).await;
    let sums_later = counts(&server, &name, since).await;
    stop.cancel();
    run.await.unwrap().unwrap();
    assert_eq!(sums.get("ok"), Some(&ok), "{sums:?}");
    assert_eq!(sums.get("dead"), Some(&dead), "{sums:?}");
    assert_eq!(sums.get("failed"), Some(&dead), "failed for good: {sums:?}");
    assert_eq!(sums.get("retried"), None, "{sums:?}");
    assert_eq!(sums_later, sums, "not counted again later");
    assert!(
        handled.load(Ordering::SeqCst) >= ok,
        "each counted task ran (some may have run again after the partition)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_schedules_are_recorded() {
    let server = RedisServer::start();
    let name = unique_name("schedules");
    let (stop, run) = consume(&server.url(), &name, Arc::default(), true);
    let mut conn = server.pool().get().await.unwrap();
    let key = format!("{{{name}}}:periodic");
    let mut schedules: HashMap<String, String> = HashMap::new();
    for _ in 0..200 {
        schedules = conn.hgetall(&key).await.unwrap();
        if schedules.len() == 2 {
            break;
        }
        tokio::time::sleep(50 * MS).await;
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    let parse = |job: &str| -> serde_json::Value { serde_json::from_str(&schedules[job]).unwrap() };
    let digest = parse("digest");
    assert_eq!(digest["every_ms"], 3_600_000);
    assert_eq!(digest["missed"], "skip");
    let nightly = parse("nightly");
    assert_eq!(nightly["cron"], "0 30 2 * * *");
    assert_eq!(nightly["missed"], "run_once");
    for job in [&digest, &nightly] {
        assert!(job["partition"].as_u64().unwrap() < u64::from(P));
    }
    let _: redis::Value = conn.del(&key).await.unwrap();
}
