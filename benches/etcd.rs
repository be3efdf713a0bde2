//! What the rounds cost when the membership is on etcd (docs/design.md
//! §2.2), against the Redis rounds in the same run: etcd requests per
//! instance per second, by method, and the Redis calls that remain.
//!
//! Run with `cargo bench --features etcd --bench etcd`. For 1 and 10
//! standalone indexers (default interval, 1 s) of one service on each
//! backend it starts a private three-node etcd (the test harness's, tuned
//! to a 50 ms heartbeat, so its leases' minimum TTL is 1 s) and a private
//! `redis-server`, lets the rounds settle, then counts over `WINDOW`:
//!
//! - etcd: the gRPC messages the three nodes received
//!   (`grpc_server_msg_received_total`, a unary request is one message, a
//!   keep-alive one message on its stream), by method;
//! - Redis: `INFO commandstats`' calls (commands inside scripts included),
//!   without the bench's own `INFO`.

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

use std::collections::BTreeMap;
use std::time::Duration;

use deadpool_redis::redis;
use peerq::Membership;
use peerq::indexer::{Indexer, IndexerHandle};
use support::{EtcdCluster, RedisServer, unique_name};

/// How long the counters are read over.
const WINDOW: Duration = Duration::from_secs(20);
/// How long the rounds run before the window: every instance assigned.
const SETTLE: Duration = Duration::from_secs(4);

/// The etcd messages received by the three nodes, by method.
fn etcd_messages(etcd: &EtcdCluster) -> BTreeMap<String, f64> {
    let mut by_method = BTreeMap::new();
    for node in 0..3 {
        let metrics = etcd.metrics(node).expect("etcd answers its metrics");
        for line in metrics
            .lines()
            .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        {
            let Some((labels, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Some(method) = labels
                .split("grpc_method=\"")
                .nth(1)
                .and_then(|m| m.split('"').next())
            else {
                continue;
            };
            *by_method.entry(method.to_owned()).or_default() += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    by_method
}

/// Redis's calls so far, all commands (those inside scripts included).
fn redis_calls(server: &RedisServer) -> f64 {
    let mut conn = server.client().get_connection().unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_info:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<f64>()
                .ok()
        })
        .sum()
}

async fn start(n: usize, redis: &RedisServer, membership: &Membership) -> Vec<IndexerHandle> {
    let name = unique_name("etcd-cost");
    let mut handles = Vec::new();
    for _ in 0..n {
        let indexer = Indexer::builder()
            .name(&name)
            .redis(redis.url())
            .membership(membership.clone())
            .build()
            .unwrap();
        handles.push(indexer.start().await.unwrap());
    }
    handles
}

/// Per instance per second: Redis calls, and etcd messages by method.
async fn measure(
    n: usize,
    membership: Membership,
    etcd: &EtcdCluster,
) -> (f64, BTreeMap<String, f64>) {
    let redis = RedisServer::start();
    let handles = start(n, &redis, &membership).await;
    tokio::time::sleep(SETTLE).await;
    let assigned = handles
        .iter()
        .filter(|h| h.standing().borrow().assignment().is_some())
        .count();
    assert_eq!(assigned, n, "every instance assigned before the window");
    let (calls, messages) = (redis_calls(&redis), etcd_messages(etcd));
    tokio::time::sleep(WINDOW).await;
    let per = |d: f64| d / n as f64 / WINDOW.as_secs_f64();
    let calls = per(redis_calls(&redis) - calls);
    let mut after = etcd_messages(etcd);
    for (method, before) in messages {
        *after.entry(method).or_default() -= before;
    }
    let rates = after
        .into_iter()
        .filter(|(_, d)| *d > 0.0)
        .map(|(m, d)| (m, per(d)))
        .collect();
    for h in handles {
        h.stop().await;
    }
    (calls, rates)
}

#[tokio::main]
async fn main() {
    let etcd = EtcdCluster::start();
    println!("## Rounds on etcd against rounds on Redis (interval 1 s), per instance per second\n");
    println!("| instances | backend | Redis calls | etcd requests | etcd by method |");
    println!("|---|---|---|---|---|");
    for n in [1, 10] {
        let (redis_only, _) = measure(n, Membership::Redis, &etcd).await;
        println!("| {n} | redis | {redis_only:.1} | 0 | — |");
        let (calls, by_method) = measure(n, Membership::etcd(etcd.endpoints()), &etcd).await;
        let total: f64 = by_method.values().sum();
        let methods: Vec<String> = by_method
            .iter()
            .map(|(m, r)| format!("{m} {r:.2}"))
            .collect();
        println!(
            "| {n} | etcd | {calls:.1} | {total:.2} | {} |",
            methods.join(", ")
        );
    }
}
