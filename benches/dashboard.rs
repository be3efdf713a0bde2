//! How long each dashboard page takes to render for a service with 64
//! partitions, 10,000 dead letters, 1,000 delayed tasks and a running
//! consumer, against a private `redis-server`, over HTTP on loopback.
//!
//! Run with `cargo bench --bench dashboard --features dashboard`. Each page
//! is asked for `ROUNDS` times from a fresh dashboard (so every request
//! reads Redis: the 2 s cache never answers), and once more from a warm
//! one (the cache's answer). It prints a markdown table: the median and the
//! slowest cold render, and the warm one.

// The test harness crate (`tests/support`), named `support` here.
extern crate peerq_test_support as support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::Json;
use peerq::admin::Admin;
use peerq::dashboard::{self, Settings};
use peerq::producer::{Options as EnqueueOptions, Producer};
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const PARTITIONS: u32 = 64;
const DEAD: usize = 10_000;
const DELAYED: usize = 1_000;
const ROUNDS: usize = 15;

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    order: String,
}

struct Idle;

impl Handler for Idle {
    type Task = Order;
    async fn handle(&self, _order: Order, _cx: TaskContext) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// `GET path` over a fresh connection; the status and the time to the
/// whole body.
async fn get(addr: SocketAddr, path: &str) -> (u16, Duration) {
    let started = Instant::now();
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    tcp.read_to_end(&mut reply).await.unwrap();
    let took = started.elapsed();
    let status = String::from_utf8_lossy(&reply[9..12]).parse().unwrap_or(0);
    (status, took)
}

async fn serve(url: &str) -> SocketAddr {
    let admin = Admin::connect(url).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = dashboard::router(admin, Settings::new());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = RedisServer::start();
    let name = unique_name("bench-dashboard");
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(
        Consumer::builder()
            .name(&name)
            .redis(server.url())
            .partitions(PARTITIONS)
            .codec(Json)
            .handler(Idle)
            .run_until(stop.clone().cancelled_owned()),
    );
    let producer: Producer<Json> = Producer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(PARTITIONS)
        .codec(Json)
        .connect()
        .await
        .unwrap();
    // Dead letters as the consumer writes them, spread over the partitions.
    let mut conn = server.pool().get().await.unwrap();
    let mut pipe = redis::pipe();
    for i in 0..DEAD {
        let payload = format!(r#"{{"order":"order-{i}"}}"#);
        pipe.cmd("XADD")
            .arg(format!("{{{name}/{}}}:dead", i as u32 % PARTITIONS))
            .arg("*")
            .arg("id")
            .arg(format!("task-{i}"))
            .arg("attempt")
            .arg(5)
            .arg("codec")
            .arg("json")
            .arg("payload")
            .arg(payload)
            .arg("reason")
            .arg("failed")
            .arg("error")
            .arg(format!("warehouse closed for order-{i}"))
            .arg("dead_at")
            .arg(1_795_000_000_000u64 + i as u64)
            .ignore();
    }
    let () = pipe.query_async(&mut *conn).await.unwrap();
    for i in 0..DELAYED {
        let order = Order {
            order: format!("later-{i}"),
        };
        let options = EnqueueOptions::new().delay(Duration::from_secs(3600));
        producer.enqueue_with(order, options).await.unwrap();
    }
    // Let the consumer own every partition and write its records.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let pages = [
        ("overview", "/".to_owned()),
        ("service", format!("/services/{name}")),
        ("service, live part", format!("/services/{name}/live")),
        ("dead letters, a page", format!("/services/{name}/dead")),
        (
            "dead letters, newest first",
            format!("/services/{name}/dead?order=newest"),
        ),
        (
            "dead letters, a search (every letter read)",
            format!("/services/{name}/dead?q=order-9999"),
        ),
        (
            "a dead letter",
            format!("/services/{name}/dead/letter?at=15/0-0"),
        ),
        ("delayed", format!("/services/{name}/delayed")),
        ("periodic", format!("/services/{name}/periodic")),
    ];
    // A real letter's position for the detail page.
    let first: Vec<(String, Vec<(String, String)>)> = {
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(format!("{{{name}/15}}:dead"))
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut *conn)
            .await
            .unwrap();
        reply.ids.into_iter().map(|e| (e.id, Vec::new())).collect()
    };
    let letter = format!("/services/{name}/dead/letter?at=15/{}", first[0].0);

    println!(
        "| page ({PARTITIONS} partitions, {DEAD} dead letters, {DELAYED} delayed) | median | slowest | cached |"
    );
    println!("|---|---|---|---|");
    for (label, path) in &pages {
        let path = if label == &"a dead letter" {
            &letter
        } else {
            path
        };
        let mut cold = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let addr = serve(&server.url()).await;
            let (status, took) = get(addr, path).await;
            assert_eq!(status, 200, "{label}: {path}");
            cold.push(took);
        }
        cold.sort();
        let addr = serve(&server.url()).await;
        get(addr, path).await;
        let (_, warm) = get(addr, path).await;
        println!(
            "| {label} | {:.1} ms | {:.1} ms | {:.1} ms |",
            ms(cold[ROUNDS / 2]),
            ms(cold[ROUNDS - 1]),
            ms(warm)
        );
    }
    stop.cancel();
    let _ = consumer.await;
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
