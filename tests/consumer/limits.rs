//! The service-wide rate limit (docs/design.md §15) with in-process
//! consumers against a real redis-server: a limited instance reads no more
//! than it can start (nothing waits outside Redis's pending list, nothing
//! spends an attempt), and a limit set or cleared on a running service is
//! followed within about a second, while a consumer's start does not undo
//! an operator's change (a cleared limit stays cleared across a restart);
//! and an instance cut off from Redis starts nothing while it is away and
//! no burst when it comes back. (Three instances holding the limit through a join
//! and a leave: the `scenarios` binary.)

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::admin::{Admin, Service};
use peerq::handler::Task;
use peerq::limits::{Limits, RateLimit};
use peerq::producer::Producer;
use peerq::{Consumer, HandlerError};
use support::{RedisServer, unique_name, wait_until};

use crate::Instance;
use tokio_util::sync::CancellationToken;

/// Each start: when, and the attempt.
type Starts = Arc<Mutex<Vec<(Instant, u32)>>>;

type JobService = tower::util::BoxCloneSyncService<Task<u64>, (), HandlerError>;

/// A consumer of one partition whose tasks take 2 ms, recording their
/// starts; `rate`, the builder's limit.
fn instance(url: &str, name: &str, starts: &Starts, rate: Option<RateLimit>) -> Instance {
    support::init_tracing();
    let starts = starts.clone();
    let service = JobService::new(tower::service_fn(move |task: Task<u64>| {
        let starts = starts.clone();
        async move {
            starts
                .lock()
                .unwrap()
                .push((Instant::now(), task.cx.attempt()));
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok(())
        }
    }));
    let mut builder = Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(1)
        .service(service);
    if let Some(rate) = rate {
        builder = builder.rate_limit(rate.count(), rate.per());
    }
    let stop = CancellationToken::new();
    let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    Instance { stop, task }
}

async fn producer(server: &RedisServer, name: &str) -> Producer {
    Producer::builder()
        .name(name)
        .redis(server.url())
        .partitions(1)
        .connect()
        .await
        .unwrap()
}

/// The service's admin handle, once its first instance wrote its meta.
async fn service(server: &RedisServer, name: &str) -> Service {
    let admin = Admin::connect(server.url()).await.unwrap();
    let began = Instant::now();
    loop {
        if let Ok(service) = admin.service(name).await {
            return service;
        }
        assert!(began.elapsed() < Duration::from_secs(10), "no meta");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Entries delivered and not acked yet, in the one partition.
async fn pending(server: &RedisServer, name: &str) -> usize {
    let mut conn = server.pool().get().await.unwrap();
    let reply: redis::RedisResult<redis::streams::StreamPendingReply> = redis::cmd("XPENDING")
        .arg(format!("{{{name}/0}}:stream"))
        .arg("peerq")
        .query_async(&mut *conn)
        .await;
    // No group yet: nothing read.
    reply.map_or(0, |r| r.count())
}

fn starts_of(starts: &Starts) -> Vec<(Instant, u32)> {
    starts.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_instance_reads_no_more_than_it_can_start() {
    let server = RedisServer::start();
    let name = unique_name("limited-reads");
    let starts: Starts = Arc::default();
    let per_second = 20;
    let rate = RateLimit::new(per_second, Duration::from_secs(1));
    let a = instance(&server.url(), &name, &starts, Some(rate));
    let producer = producer(&server, &name).await;
    let tasks: Vec<u64> = (0..60).collect();
    producer.enqueue_batch(&tasks).await.unwrap();
    // Sampled while the backlog lasts (3 s at the limit).
    let mut most_pending = 0;
    let began = Instant::now();
    while starts_of(&starts).len() < 50 {
        most_pending = most_pending.max(pending(&server, &name).await);
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the tasks never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_until(Duration::from_secs(5), "every task", || {
        starts_of(&starts).len() == 60
    })
    .await;
    a.leave().await;
    let starts = starts_of(&starts);
    assert!(
        starts.iter().all(|(_, attempt)| *attempt == 1),
        "a wait for the limit spent an attempt: {starts:?}"
    );
    // Read no further than the tokens held: a lease is at most 30 ms of the
    // rate (here 1 token), and a read waits for its tokens; a few are read
    // at once only when the limit's burst allows them.
    assert!(
        most_pending <= 3,
        "{most_pending} entries read ahead of the limit's tokens"
    );
    let took = starts[59].0 - starts[0].0;
    assert!(
        took >= Duration::from_millis(2700),
        "60 tasks at {per_second}/s started within {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_set_and_cleared_on_a_running_service_is_followed_within_a_second() {
    let server = RedisServer::start();
    let name = unique_name("limit-changed");
    let starts: Starts = Arc::default();
    let a = instance(&server.url(), &name, &starts, None);
    let service = service(&server, &name).await;
    assert_eq!(service.limits().await.unwrap(), Limits::none());
    let producer = producer(&server, &name).await;
    // Running: the first task starts.
    producer.enqueue(0u64).await.unwrap();
    wait_until(Duration::from_secs(10), "the first task", || {
        starts_of(&starts).len() == 1
    })
    .await;
    let limited = Limits::none().rate(RateLimit::new(50, Duration::from_secs(1)));
    service.set_limits(limited).await.unwrap();
    // Seen within a second; then 2 s at 50/s.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let tasks: Vec<u64> = (1..1000).collect();
    producer.enqueue_batch(&tasks).await.unwrap();
    wait_until(Duration::from_secs(5), "the next task", || {
        starts_of(&starts).len() > 1
    })
    .await;
    let began = starts_of(&starts)[1].0;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let within = |s: &&(Instant, u32)| s.0 >= began && s.0 < began + Duration::from_secs(2);
    let while_limited = starts_of(&starts).iter().filter(within).count();
    // 2 s at 50/s, and at most the limit's burst more.
    assert!(
        (90..=105).contains(&while_limited),
        "{while_limited} starts in 2 s at 50/s"
    );

    // A second instance whose builder asks for another limit: an
    // operator's change wins over a builder's first value.
    let b = instance(
        &server.url(),
        &name,
        &starts,
        Some(RateLimit::new(5, Duration::from_secs(1))),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(service.limits().await.unwrap(), limited);

    service.set_limits(Limits::none()).await.unwrap();
    let cleared = Instant::now();
    wait_until(Duration::from_secs(5), "the rest, unlimited", || {
        starts_of(&starts).len() == 1000
    })
    .await;
    assert!(
        cleared.elapsed() < Duration::from_secs(3),
        "the rest took {:?} once the limit was cleared",
        cleared.elapsed()
    );
    b.leave().await;
    a.leave().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleared_limit_stays_cleared_when_an_instance_starts_again_with_its_builders_limit() {
    let server = RedisServer::start();
    let name = unique_name("limit-cleared");
    let starts: Starts = Arc::default();
    let five = Some(RateLimit::new(5, Duration::from_secs(1)));
    let a = instance(&server.url(), &name, &starts, five);
    let service = service(&server, &name).await;
    let began = Instant::now();
    while service.limits().await.unwrap() == Limits::none() {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "no limit written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(service.limits().await.unwrap().rate_limit(), five);
    service.set_limits(Limits::none()).await.unwrap();
    a.leave().await;
    // The same builder again, after the operator cleared its limit.
    let b = instance(&server.url(), &name, &starts, five);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(service.limits().await.unwrap(), Limits::none());
    let producer = producer(&server, &name).await;
    let tasks: Vec<u64> = (0..200).collect();
    producer.enqueue_batch(&tasks).await.unwrap();
    let enqueued = Instant::now();
    // At 5/s they would take 40 s.
    wait_until(Duration::from_secs(10), "200 tasks, unlimited", || {
        starts_of(&starts).len() == 200
    })
    .await;
    assert!(
        enqueued.elapsed() < Duration::from_secs(5),
        "200 tasks took {:?}: the builder's limit came back",
        enqueued.elapsed()
    );
    b.leave().await;
}

#[tokio::test]
async fn a_limit_out_of_range_is_refused_by_name() {
    let server = RedisServer::start();
    let name = unique_name("limit-refused");
    let starts: Starts = Arc::default();
    let bad = instance(
        &server.url(),
        &name,
        &starts,
        Some(RateLimit::new(0, Duration::from_secs(1))),
    );
    let e = bad.task.await.unwrap().unwrap_err();
    assert!(e.to_string().contains("rate_limit"), "{e}");
    drop(bad.stop);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_per_key_holds_each_key_and_other_keys_run_beside_it() {
    let server = RedisServer::start();
    let name = unique_name("limit-per-key");
    // Each start: its key (seq / 1000) and when.
    let starts: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    let recorded = starts.clone();
    let service = JobService::new(tower::service_fn(move |task: Task<u64>| {
        let starts = recorded.clone();
        async move {
            starts
                .lock()
                .unwrap()
                .push((task.payload / 1000, Instant::now()));
            Ok(())
        }
    }));
    let per_second = 10;
    let stop = CancellationToken::new();
    let consumer = Consumer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(1)
        .rate_limit_per_key(per_second, Duration::from_secs(1))
        .service(service)
        .run_until(stop.clone().cancelled_owned());
    let consumer = Instance {
        stop,
        task: tokio::spawn(consumer),
    };
    let producer = producer(&server, &name).await;
    // Keys 1 and 2 with 60 tasks each, and 100 tasks without a key.
    let keyed: Vec<(u64, peerq::Options)> = (0..60)
        .flat_map(|i| [(1000 + i, "one"), (2000 + i, "two")])
        .map(|(seq, key)| (seq, peerq::Options::new().key(key)))
        .collect();
    producer.enqueue_batch_with(&keyed).await.unwrap();
    let free: Vec<u64> = (0..100).collect();
    producer.enqueue_batch(&free).await.unwrap();
    wait_until(Duration::from_secs(10), "the first starts", || {
        starts.lock().unwrap().len() > 100
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    consumer.leave().await;

    let starts = starts.lock().unwrap().clone();
    let of = |key: u64| -> Vec<Instant> {
        let mut at: Vec<Instant> = starts.iter().filter(|s| s.0 == key).map(|s| s.1).collect();
        at.sort();
        at
    };
    assert_eq!(of(0).len(), 100, "tasks without a key are not limited");
    for key in [1, 2] {
        let mut at = of(key);
        // Both ran all along, beside each other, and no faster than the
        // limit over their whole span (a token of burst aside).
        assert!(at.len() >= 25, "key {key}: {} starts", at.len());
        crate::key_rate::assert_at_rate(&format!("key {key}"), &mut at, per_second, 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limited_instance_cut_from_redis_starts_no_burst_when_it_comes_back() {
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    let name = unique_name("limit-cut");
    let starts: Starts = Arc::default();
    let per_second = 50;
    let rate = RateLimit::new(per_second, Duration::from_secs(1));
    // The consumer reaches Redis through the proxy; the producer directly.
    let a = instance(&proxy.url(), &name, &starts, Some(rate));
    let producer = producer(&server, &name).await;
    let tasks: Vec<u64> = (0..300).collect();
    producer.enqueue_batch(&tasks).await.unwrap();
    wait_until(Duration::from_secs(10), "the first starts", || {
        starts_of(&starts).len() >= 50
    })
    .await;
    // Redis away for two seconds while tokens are leased: the starts stop
    // once they expire, and none are saved up for the return.
    proxy.cut();
    let cut = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = starts_of(&starts)
        .iter()
        .filter(|(at, _)| *at > cut + Duration::from_millis(100))
        .count();
    proxy.restore();
    wait_until(Duration::from_secs(30), "every task", || {
        starts_of(&starts).len() >= 300
    })
    .await;
    a.leave().await;
    assert_eq!(during, 0, "{during} starts while Redis was away");
    // At the limit before and after, and no burst on the return: a token
    // of burst, and one more from the tokens leased before the cut.
    let mut at: Vec<Instant> = starts_of(&starts).iter().map(|(at, _)| *at).collect();
    crate::key_rate::assert_at_rate("the service", &mut at, per_second, 3);
}
