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

/// The script calls Redis has counted (`INFO commandstats`).
async fn script_calls(server: &support::RedisServer) -> u64 {
    let mut conn = server.pool().get().await.unwrap();
    let info: String = deadpool_redis::redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut *conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn progress_reported_often_is_written_at_most_every_250_ms() {
    let server = support::RedisServer::start();
    let running = Arc::new(Running::default());
    let interrupt = CancellationToken::new();
    let registered = batch(&server, &running, &interrupt);
    let a = registered.task(0);
    // One value written first: the script is loaded (a first `EVALSHA` that
    // Redis did not know counts too), and the next write is 250 ms away.
    a.tracks.clone().progress(a.at, vec![0]);
    a.flush().await;
    let before = script_calls(&server).await;
    // 60 values over about 750 ms: a write now, then one every 250 ms.
    let started = tokio::time::Instant::now();
    for percent in 0..60u8 {
        a.tracks.clone().progress(a.at, vec![percent]);
        tokio::time::sleep(Duration::from_millis(12)).await;
    }
    let reported = started.elapsed();
    a.flush().await;
    let writes = script_calls(&server).await - before;
    // One per 250 ms begun (the bound, not the constant: a test of
    // it), and the flush's: 60 unthrottled.
    let most = 2 + (reported.as_millis() / 250) as u64;
    assert!(
        (2..=most).contains(&writes),
        "{writes} writes in {reported:?}"
    );
}
