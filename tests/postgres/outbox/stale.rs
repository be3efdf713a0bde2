//! A relay frozen right before a send, past its claim's time to send and
//! past the grace of the row's record, while another relay moved the row:
//! once it resumes, Redis refuses its send by Redis's own clock, and the
//! task runs once (docs/design.md §10).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use peerq::Options;

use super::outage::record_ttl;
use super::{Record, World, mail, ran_once};

/// The frozen relay's time to send, and the records' grace after a
/// committed delete, both shortened from 20 s and 15 min.
const SENDING: Duration = Duration::from_secs(1);
const GRACE: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_frozen_before_a_send_sends_nothing_once_it_resumes() {
    let world = World::new("outbox-stale").await;
    let record = Record::default();
    let consumer = world.consumer(&record, |b| b);
    let id = world.commit(&mail("k", 1), Options::new()).await;

    // Relay A freezes right before its first send, holding the lane.
    let (frozen_tx, frozen_rx) = mpsc::channel::<()>();
    let (resume_tx, resume_rx) = mpsc::channel::<()>();
    let resume_rx = Mutex::new(resume_rx);
    let first = AtomicBool::new(true);
    let frozen = world.relay(|r| {
        r.test_timing(SENDING, GRACE).before_send(move |_| {
            if first.swap(false, Ordering::SeqCst) {
                frozen_tx.send(()).unwrap();
                resume_rx.lock().unwrap().recv().unwrap();
            }
        })
    });
    tokio::task::spawn_blocking(move || frozen_rx.recv().unwrap())
        .await
        .unwrap();
    // Postgres ends its session, as its idle-in-transaction timeout would
    // after a minute: the lane's lock and the row go free.
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND state = 'idle in transaction'",
    )
    .fetch_all(&world.pool)
    .await
    .unwrap();
    assert_eq!(ended, [true], "the frozen relay's claim");

    // Relay B moves the row: it runs once, its delete commits, and its
    // record expires after the grace.
    let other = world.relay(|r| r.test_timing(SENDING, GRACE));
    ran_once(&record, &id, "the row, moved by the other relay").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while world.outbox_rows().await != 0 || record_ttl(&world, &id, &id).await != -2 {
        assert!(
            Instant::now() < deadline,
            "the row's delete and its record's expiry"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A resumes, long past its time to send: Redis refuses the send.
    resume_tx.send(()).unwrap();
    // Two poll intervals: a second run would show by then.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(record.counts().get(&id), Some(&1), "{:?}", record.counts());
    frozen.stop().await;
    other.stop().await;
    consumer.stop().await;
}
