//! Task handles across a reshard (docs/design.md §21): a delayed task and
//! a dead letter move to the new layout with their records and cancel
//! requests, and a handle of either layout finds its task where it is; a
//! wait begun before the move follows the task; a cancel by an old handle
//! after the move stops the task in the new layout; a producer that still
//! routes to the old layout leaves no record behind in a sealed
//! partition; the retired partitions' records expire after the keep time.

use super::*;
use deadpool_redis::redis;

/// A unit's generation (docs/design.md §21: `g << 16 | i`).
fn generation(handle: &TaskHandle) -> u32 {
    handle.partition().unwrap() >> 16
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn task_handles_follow_their_tasks_across_a_reshard() {
    let (server, name, runs, stop, task, producer, service) = setup().await;
    let mut conn = server.connection().await;
    // Connected now and used only after the cut-over: it still routes to
    // the old layout, whose sealed partitions refuse it.
    let late = super::producer(&server, &name).await;

    // A task that ran in the old layout.
    let early = Options::new().key("early");
    let early_id = producer
        .enqueue_with(&Job::Succeed(300), early.clone())
        .await
        .unwrap();
    let early = producer.handle_with(&early_id, &early);
    let waited = service.wait(&early, PATIENCE).await.unwrap();
    assert!(matches!(waited, Waited::Final(_)), "{waited:?}");
    // Dead letters, with their `dead` records.
    let mut dying = Vec::new();
    for seq in 100..105 {
        let id = producer.enqueue(&Job::Fail(seq)).await.unwrap();
        dying.push(producer.handle_of(&id, None));
    }
    for handle in &dying {
        let waited = service.wait(handle, PATIENCE).await.unwrap();
        assert!(
            matches!(&waited, Waited::Final(r) if r.state == Some(TaskState::Dead)),
            "{waited:?}"
        );
    }
    // Delayed tasks, due well after the cut-over; four cancelled before it.
    let mut delayed = Vec::new();
    for seq in 0..20u64 {
        let options = Options::new()
            .key(format!("k{seq}"))
            .delay(Duration::from_secs(9));
        let id = producer
            .enqueue_with(&Job::Succeed(seq), options.clone())
            .await
            .unwrap();
        delayed.push(producer.handle_with(&id, &options));
    }
    for handle in &delayed[..4] {
        let outcome = service.cancel(handle).await.unwrap();
        assert_eq!(outcome, CancelOutcome::Cancelled);
    }
    // A wait begun in the old layout.
    let waiter = {
        let (service, handle) = (service.clone(), delayed[10].clone());
        tokio::spawn(async move { service.wait(&handle, PATIENCE * 3).await })
    };

    service.reshard(8).await.unwrap();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while service.layout().await.unwrap().state != "open" {
        assert!(tokio::time::Instant::now() < deadline, "never opened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Every delayed task moved, with its record and cancel request: its
    // old handle finds it in the new layout.
    for (seq, handle) in delayed.iter().enumerate() {
        assert_eq!(generation(handle), 0);
        let record = service.task(handle).await.unwrap().expect("a record");
        assert_eq!(generation(&record.handle), 1, "task {seq}: {record:?}");
        let expected = match seq {
            0..4 => TaskState::Cancelled,
            _ => TaskState::Delayed,
        };
        assert_eq!(record.state, Some(expected), "task {seq}");
    }
    // Cancelled by their old handles after the move: cancelled where they
    // are now.
    for handle in &delayed[4..8] {
        let outcome = service.cancel(handle).await.unwrap();
        assert_eq!(outcome, CancelOutcome::Cancelled);
    }
    // The dead letters moved with their records, which name the letters
    // by their new ids (their headers are read from them).
    // (The dead letters of the layout as it is now.)
    let admin = Admin::connect(server.url()).await.unwrap();
    let now = admin.service(&name).await.unwrap();
    let letters = now.dead_letters().list(100).await.unwrap();
    for handle in &dying {
        let record = service.task(handle).await.unwrap().expect("a record");
        assert_eq!(record.state, Some(TaskState::Dead));
        assert_eq!(generation(&record.handle), 1, "{record:?}");
        let partition = record.handle.partition().unwrap();
        let dead_id = record.dead_id.clone().expect("a dead id");
        assert!(
            letters
                .iter()
                .any(|l| l.partition == partition && l.id == dead_id),
            "{record:?} names no letter of {letters:?}"
        );
        assert!(record.headers.is_some(), "its letter not found: {record:?}");
        // And it is kept by the new partition's retention.
        let ended: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{{{name}/1.{}}}:ended", partition & 0xffff))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ended.contains(&handle.id().to_string()), "{ended:?}");
    }
    // A handle naming a partition of the new layout finds a task that ran
    // in the old one.
    let elsewhere = TaskHandle::new(1 << 16 | 7, early.id().clone());
    let record = service.task(&elsewhere).await.unwrap().expect("a record");
    assert_eq!(record.handle, early);
    assert_eq!(record.state, Some(TaskState::Succeeded));

    // A producer that routes to the old layout: refused by the seal, sent
    // again to the new one, and no record left in the old one.
    let single = late.enqueue(&Job::Succeed(200)).await.unwrap();
    let batch = late
        .enqueue_batch(&[Job::Succeed(201), Job::Succeed(202)])
        .await
        .unwrap();
    for id in std::iter::once(&single).chain(batch.iter()) {
        for p in 0..P {
            let left: bool = redis::cmd("HEXISTS")
                .arg(format!("{{{name}/{p}}}:tasks"))
                .arg(id.as_str())
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(!left, "task {id}'s record left in old partition {p}");
        }
        let bare = TaskHandle::bare(id.clone());
        let waited = service.wait(&bare, PATIENCE).await.unwrap();
        let Waited::Final(record) = waited else {
            panic!("{waited:?}")
        };
        assert_eq!(generation(&record.handle), 1, "{record:?}");
    }

    // The wait begun in the old layout followed its task.
    let waited = waiter.await.unwrap().unwrap();
    let Waited::Final(record) = waited else {
        panic!("{waited:?}")
    };
    assert_eq!(record.state, Some(TaskState::Succeeded));
    assert_eq!(generation(&record.handle), 1);
    assert_eq!(
        record.result_as::<Done, _>(&Json).unwrap().unwrap(),
        Done { seq: 10 }
    );
    for handle in &delayed[8..] {
        let waited = service.wait(handle, PATIENCE).await.unwrap();
        assert!(
            matches!(&waited, Waited::Final(r) if r.state == Some(TaskState::Succeeded)),
            "{waited:?}"
        );
    }
    // The cancelled ones never ran, in either layout.
    for seq in 0..8 {
        assert!(!runs.lock().unwrap().contains_key(&seq), "task {seq} ran");
    }
    // The retired partitions' records go after the keep time.
    for p in 0..P {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("{{{name}/{p}}}:tasks"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            ttl == -2 || (ttl > 0 && ttl <= 24 * 3600 * 1000),
            "old partition {p}'s records kept for {ttl} ms"
        );
    }
    stop.cancel();
    task.await.unwrap().unwrap();
}
