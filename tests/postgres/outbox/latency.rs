//! The commit → handler-start latency through a consumer's own relay:
//! one task at a time, each committed once the one before ran.

use std::time::{Duration, SystemTime};

use peerq::Options;

use super::{Record, World, mail};

const TASKS: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn commit_to_handler_start_latency() {
    let world = World::new("outbox-latency").await;
    let record = Record::default();
    // Its first task waited for the instance's first assignment.
    let consumer = world.relaying(&record).await;
    let mut latencies = Vec::new();
    for seq in 1..=TASKS {
        let ran = record.ran.notified();
        tokio::pin!(ran);
        ran.as_mut().enable();
        let id = world.commit(&mail("a", seq), Options::new()).await;
        let committed = SystemTime::now();
        tokio::time::timeout(Duration::from_secs(10), ran)
            .await
            .expect("the task runs");
        let started = record
            .runs()
            .into_iter()
            .find(|run| run.id == id)
            .expect("the run that woke us")
            .started;
        latencies.push(started.duration_since(committed).unwrap_or_default());
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    let (p50, p99, max) = (at(0.50), at(0.99), latencies[latencies.len() - 1]);
    println!(
        "outbox commit -> handler start over {TASKS} tasks: p50 {p50:?}, p99 {p99:?}, max {max:?}"
    );
    // Notifications, not the 1 s poll, bring the rows to the relay.
    assert!(p50 < Duration::from_millis(500), "p50 {p50:?}");
    consumer.stop().await;
}
