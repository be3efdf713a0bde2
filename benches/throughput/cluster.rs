//! peerq on a local Redis Cluster of three masters next to the single
//! node of the same run (issue 17): enqueue in batches and consume with
//! one instance, the same measurements on both; and what waiting for a
//! replica (`wait_for_replicas`) costs an enqueue, on a cluster with a
//! replica per master.
//!
//! Every node runs on this machine's two cores, with the bench itself:
//! three masters get no more CPU than one, so this shows what the Cluster
//! path costs, not how it scales.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use peerq::Consumer;
use peerq::producer::{Options, Producer};
use tokio_util::sync::CancellationToken;

use super::{BATCH, Job, counting, job};
use support::{RedisCluster, RedisServer, unique_name};

/// Single enqueues timed for the latency of `wait_for_replicas`.
const LATENCY_SAMPLES: usize = 2000;

/// Where a run's Redis is.
enum At<'a> {
    Node(&'a RedisServer),
    Cluster(&'a RedisCluster),
}

impl At<'_> {
    fn redis(&self) -> peerq::Redis {
        match self {
            At::Node(server) => peerq::Redis::url(server.url()),
            At::Cluster(cluster) => peerq::Redis::cluster(cluster.seed_urls()),
        }
    }

    fn producer(&self, name: &str) -> peerq::producer::ProducerBuilder<peerq::Bincode> {
        Producer::builder().name(name).redis(self.redis())
    }

    fn consumer(&self, name: &str) -> peerq::consumer::ConsumerBuilder<(), (), peerq::Bincode> {
        Consumer::builder().name(name).redis(self.redis())
    }
}

/// Prints the Cluster tables.
pub(super) async fn run(server: &RedisServer, tasks: u64) {
    // No persistence, like the single node.
    let cluster = RedisCluster::start_with(3, 0, false);
    let (node_enqueue, node_consume) = enqueue_and_consume(&At::Node(server), tasks).await;
    let (cluster_enqueue, cluster_consume) =
        enqueue_and_consume(&At::Cluster(&cluster), tasks).await;
    drop(cluster);
    println!();
    println!("| peerq, {tasks} tasks | one node | Cluster, 3 masters | Cluster / node |");
    println!("|---|---|---|---|");
    println!(
        "| enqueue, batches of {BATCH} | {node_enqueue:.0} tasks/s | {cluster_enqueue:.0} tasks/s | {:.2} |",
        cluster_enqueue / node_enqueue
    );
    println!(
        "| consume, 1 instance, no-op handler (first to last handler call) | {node_consume:.0} tasks/s | {cluster_consume:.0} tasks/s | {:.2} |",
        cluster_consume / node_consume
    );

    let replicated = RedisCluster::start_with(3, 1, false);
    let at = At::Cluster(&replicated);
    let (plain50, plain99) = enqueue_latency(&at, false).await;
    let (wait50, wait99) = enqueue_latency(&at, true).await;
    println!();
    println!(
        "| one enqueue at a time, Cluster of 3 masters with a replica each ({LATENCY_SAMPLES} samples) | p50 | p99 |"
    );
    println!("|---|---|---|");
    println!(
        "| without waiting for replicas | {:.2} ms | {:.2} ms |",
        plain50 * 1e3,
        plain99 * 1e3
    );
    println!(
        "| wait_for_replicas(1, 100 ms) | {:.2} ms | {:.2} ms |",
        wait50 * 1e3,
        wait99 * 1e3
    );
}

/// Enqueue rate in batches, then one instance's consume rate of those tasks.
async fn enqueue_and_consume(at: &At<'_>, tasks: u64) -> (f64, f64) {
    let name = unique_name("bench-cluster");
    let producer = at.producer(&name).connect().await.unwrap();
    let jobs: Vec<Job> = (0..tasks).map(job).collect();
    let started = Instant::now();
    for chunk in jobs.chunks(BATCH) {
        producer.enqueue_batch(chunk).await.unwrap();
    }
    let enqueue = tasks as f64 / started.elapsed().as_secs_f64();

    let (done, first, service) = counting();
    let stop = CancellationToken::new();
    let consumer = at.consumer(&name).concurrency(256).service(service);
    let signal = stop.clone();
    let run = tokio::spawn(async move { consumer.run_until(signal.cancelled_owned()).await });
    while done.load(Ordering::Relaxed) < tasks {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let started = first.lock().unwrap().expect("a task ran");
    let consume = tasks as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    run.await.unwrap().unwrap();
    (enqueue, consume)
}

/// p50 and p99 (seconds) of single enqueues one after the other.
async fn enqueue_latency(at: &At<'_>, wait: bool) -> (f64, f64) {
    let name = unique_name("bench-wait");
    let mut builder = at.producer(&name);
    if wait {
        builder = builder.redis(at.redis().wait_for_replicas(1, Duration::from_millis(100)));
    }
    let producer = builder.connect().await.unwrap();
    let mut samples = Vec::with_capacity(LATENCY_SAMPLES);
    for seq in 0..LATENCY_SAMPLES as u64 {
        let started = Instant::now();
        producer
            .enqueue_with(job(seq), Options::new())
            .await
            .unwrap();
        samples.push(started.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}
