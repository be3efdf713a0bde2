//! A batch's tracked tasks in memory: how a user's cancel reaches a run
//! and its handler's signal, whenever the handler asks for it.

use std::time::Duration;

use peerq_test_support as support;

use super::*;
use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::handler::Tracker;
use crate::instance::InstanceId;

/// Two tasks, `a` and `b`, registered as one batch of partition 0, under
/// `interrupt` (the store's connection is never used).
fn batch(
    server: &support::RedisServer,
    running: &Arc<Running>,
    interrupt: &CancellationToken,
) -> Registered {
    let conn = Arc::new(SharedConnection::new(server.pool()));
    let name = ServiceName::new("running-test").unwrap();
    let store = PartitionStore::new(conn, &name, 0, 1, &InstanceId::generate(), 1 << 20);
    let run = Run {
        attempt: 1,
        started_at: 2,
        enqueued_at: 1,
    };
    let tasks = [("a".into(), run), ("b".into(), run)];
    running.register(Arc::new(store), interrupt, "bincode", tasks)
}

/// Whether `stopped` resolves within a second.
async fn stops(task: &RunningTask) -> bool {
    tokio::time::timeout(Duration::from_secs(1), task.stopped())
        .await
        .is_ok()
}

#[tokio::test]
async fn a_users_cancel_fires_the_handlers_signal_made_before_or_after_it_and_stops_the_run() {
    let server = support::RedisServer::start();
    let running = Arc::new(Running::default());
    let interrupt = CancellationToken::new();
    let registered = batch(&server, &running, &interrupt);
    let (a, b) = (registered.task(0), registered.task(1));

    // `a`'s handler asked for its signal, and its run waits, before the
    // cancel.
    let signal = a.tracks.either(a.at).clone();
    let waiting = tokio::spawn({
        let a = a.clone();
        async move { stops(&a).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!signal.is_cancelled() && !a.is_stopped());
    running.find("a").expect("a runs here").cancel();
    assert!(signal.is_cancelled() && a.user_cancelled() && a.is_stopped());
    assert!(waiting.await.unwrap(), "the waiting run heard the cancel");

    // `b` is cancelled before anything asked: its signal is made fired,
    // and its run stops at once.
    running.find("b").expect("b runs here").cancel();
    assert!(b.tracks.either(b.at).is_cancelled());
    assert!(stops(&b).await);

    // A task whose run ended, or whose batch is gone, is not found.
    a.ended();
    assert!(running.find("a").is_none());
    assert!(running.find("b").is_some());
    drop(registered);
    assert!(running.find("b").is_none());
}

#[tokio::test]
async fn the_partitions_interruption_stops_a_tracked_run_and_is_no_users_cancel() {
    let server = support::RedisServer::start();
    let running = Arc::new(Running::default());
    let interrupt = CancellationToken::new();
    let registered = batch(&server, &running, &interrupt);
    let a = registered.task(0);
    assert!(!stops(&a).await);
    interrupt.cancel();
    assert!(stops(&a).await);
    assert!(a.is_stopped() && !a.user_cancelled());
    assert!(a.tracks.either(a.at).is_cancelled());
    assert!(!a.tracks.user_cancelled(a.at));
}
