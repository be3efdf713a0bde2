//! Task tracking on the shared Cluster (docs/design.md §14): records live in
//! their partitions' slots on every master, `wait` hears a task's end on
//! its partition's sharded channel, and a user's cancel reaches the
//! instance running the task through `{N}:cancels` (sharded too).

use std::time::Duration;

use peerq::admin::Admin;
use peerq::handler::{CancelReason, Task};
use peerq::tracking::{CancelOutcome, TaskState, Tracking, Waited};
use peerq::{Consumer, HandlerError, Redis};
use support::{RedisCluster, unique_name};
use tokio_util::sync::CancellationToken;

use super::{Job, producer};

const PATIENCE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_on_every_master_are_tracked_waited_for_and_cancelled() {
    support::init_tracing();
    let cluster = RedisCluster::shared();
    let name = unique_name("cluster-tracking");
    let (heard, hear) = std::sync::mpsc::channel();
    let service = tower::service_fn(move |task: Task<Job>| {
        let heard = heard.clone();
        async move {
            let cx = task.cx;
            // Seq 0 waits for its cancel; the others return their seq.
            if task.payload.seq == 0 {
                cx.cancelled().await;
                heard.send(cx.cancel_reason()).unwrap();
                return Err(HandlerError::msg("stopped"));
            }
            Ok::<_, HandlerError>(task.payload.seq)
        }
    });
    let stop = CancellationToken::new();
    let run = Consumer::builder()
        .redis(Redis::cluster(cluster.seed_urls()))
        .name(&name)
        .tracking(Tracking::on())
        .service(service)
        .run_until(stop.clone().cancelled_owned());
    let run = tokio::spawn(run);
    let admin = Admin::connect(Redis::cluster(cluster.seed_urls()))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let service = loop {
        if let Ok(service) = admin.service(&name).await
            && service.tracking().await.unwrap().is_on()
        {
            break service;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the consumer never started"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let producer = producer(cluster, &name).await;

    let hanging = producer.enqueue(Job { seq: 0 }).await.unwrap();
    let hanging = producer.handle_of(&hanging, None);
    let mut handles = Vec::new();
    for seq in 1..=30 {
        let id = producer.enqueue(Job { seq }).await.unwrap();
        handles.push((seq, producer.handle_of(&id, None)));
    }
    // Spread over the masters: their partitions' slots are.
    for (seq, handle) in &handles {
        let Waited::Final(record) = service.wait(handle, PATIENCE).await.unwrap() else {
            panic!("task {seq} did not end");
        };
        assert_eq!(record.state, Some(TaskState::Succeeded));
        assert_eq!(
            record
                .result_as::<u64, _>(&peerq::Bincode)
                .unwrap()
                .unwrap(),
            *seq
        );
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while service.task(&hanging).await.unwrap().and_then(|r| r.state) != Some(TaskState::Running) {
        assert!(tokio::time::Instant::now() < deadline, "task 0 never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let outcome = service.cancel(&hanging).await.unwrap();
    assert!(
        matches!(outcome, CancelOutcome::Requested { .. }),
        "{outcome:?}"
    );
    let reason = tokio::task::spawn_blocking(move || hear.recv_timeout(PATIENCE))
        .await
        .unwrap()
        .expect("the running task heard the cancel");
    assert_eq!(reason, Some(CancelReason::User));
    let Waited::Final(record) = service.wait(&hanging, PATIENCE).await.unwrap() else {
        panic!("the cancelled task did not end");
    };
    assert_eq!(record.state, Some(TaskState::Cancelled));
    stop.cancel();
    run.await.unwrap().unwrap();
}
