//! A unique key through the moves of its task: a retry through the
//! delayed set, an interrupted run and a handover, in ordered partitions a
//! retry in place and a claim by the next owner; its end by a dead letter
//! (and the replay that waits for the key) and by a user's cancel.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_survives_a_retry_and_a_handover_and_is_free_after_them() {
    let server = RedisServer::start();
    let name = unique_name("unique-moves");
    let producer = producer(&server.url(), &name).await;
    let (runs, gate): (Runs, _) = (Arc::default(), Arc::new(Semaphore::new(0)));
    let a = consumer(&server.url(), &name, &runs, &gate);
    // Attempt 1 fails (a retry through the delayed set), attempt 2 runs
    // until a drain interrupts it (enqueued again at once, for the next
    // owner), attempt 3 waits for the gate on that owner.
    let plan = [Step::Fail, Step::Hang, Step::Gate];
    let first = producer
        .enqueue_with(job(1, &plan), unique("sync-42"))
        .await
        .unwrap();
    wait_until(Duration::from_secs(15), "attempt 2 runs", || {
        runs.lock().unwrap().get(&1).is_some_and(|r| r.len() == 2)
    })
    .await;
    refused(&producer, job(2, &[]), "sync-42", &first).await;
    // A handover: b joins, a leaves while attempt 2 runs.
    let b = consumer(&server.url(), &name, &runs, &gate);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.stop().await;
    wait_until(Duration::from_secs(15), "attempt 3 runs on b", || {
        runs.lock().unwrap().get(&1).is_some_and(|r| r.len() == 3)
    })
    .await;
    refused(&producer, job(3, &[]), "sync-42", &first).await;
    gate.add_permits(1);
    wait_free(&server, &name, "sync-42").await;
    producer
        .enqueue_with(job(4, &[]), unique("sync-42"))
        .await
        .unwrap();
    wait_until(Duration::from_secs(15), "the next runs", || {
        runs.lock().unwrap().contains_key(&4)
    })
    .await;
    b.stop().await;
    assert_eq!(runs.lock().unwrap()[&1], [1, 2, 3]);
    assert!(!runs.lock().unwrap().contains_key(&2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_ordered_partitions_a_key_survives_a_retry_in_place_and_a_handover() {
    let server = RedisServer::start();
    let name = unique_name("unique-ordered");
    let producer = producer(&server.url(), &name).await;
    let (runs, gate): (Runs, _) = (Arc::default(), Arc::new(Semaphore::new(0)));
    let a = start(&server.url(), &name, &runs, &gate, true);
    // Retried in place (the entry stays pending), then left pending by a
    // drain and claimed by the next owner, where it waits for the gate.
    let plan = [Step::Fail, Step::Hang, Step::Gate];
    let first = producer
        .enqueue_with(job(1, &plan), unique("ledger-5"))
        .await
        .unwrap();
    wait_until(Duration::from_secs(15), "attempt 2 runs", || {
        runs.lock().unwrap().get(&1).is_some_and(|r| r.len() == 2)
    })
    .await;
    refused(&producer, job(2, &[]), "ledger-5", &first).await;
    let b = start(&server.url(), &name, &runs, &gate, true);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    a.stop().await;
    wait_until(Duration::from_secs(15), "attempt 3 runs on b", || {
        runs.lock().unwrap().get(&1).is_some_and(|r| r.len() == 3)
    })
    .await;
    refused(&producer, job(3, &[]), "ledger-5", &first).await;
    gate.add_permits(1);
    wait_free(&server, &name, "ledger-5").await;
    b.stop().await;
    assert_eq!(runs.lock().unwrap()[&1], [1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_frees_its_key_and_its_replay_waits_for_the_key() {
    let server = RedisServer::start();
    let name = unique_name("unique-dead");
    let producer = producer(&server.url(), &name).await;
    let (runs, gate): (Runs, _) = (Arc::default(), Arc::new(Semaphore::new(0)));
    let a = consumer(&server.url(), &name, &runs, &gate);
    let dead_id = producer
        .enqueue_with(job(1, &[Step::Die]), unique("invoice-9"))
        .await
        .unwrap();
    wait_free(&server, &name, "invoice-9").await;
    let dead = DeadLetters::connect(server.url(), &name).await.unwrap();
    let letter = dead.list(10).await.unwrap().pop().expect("a dead letter");
    assert_eq!(letter.unique.as_deref(), Some("invoice-9"));
    // The key is free: another task takes it, and the replay is refused
    // while that task runs; the letter stays.
    let other = producer
        .enqueue_with(job(2, &[Step::Gate]), unique("invoice-9"))
        .await
        .unwrap();
    wait_until(Duration::from_secs(15), "the other runs", || {
        runs.lock().unwrap().contains_key(&2)
    })
    .await;
    match dead.replay(&letter).await {
        Err(Error::Duplicate(held)) => {
            assert_eq!(held.existing, other);
            assert_eq!(held.unique, "invoice-9");
            let said = Error::Duplicate(held).to_string();
            assert!(said.contains("`invoice-9` is held by task"), "{said}");
        }
        other => panic!("expected a refused replay, got {other:?}"),
    }
    assert_eq!(dead.list(10).await.unwrap().len(), 1, "the letter stays");
    assert_eq!(
        dead.replay_all(None).await.unwrap(),
        0,
        "skipped, not failed"
    );
    // Once free, the replay takes the key again: a new enqueue is refused
    // with the replayed task's id.
    gate.add_permits(1);
    wait_free(&server, &name, "invoice-9").await;
    a.stop().await;
    assert!(dead.replay(&letter).await.unwrap());
    refused(&producer, job(3, &[]), "invoice-9", &dead_id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_cancel_frees_the_key_at_once() {
    let server = RedisServer::start();
    let name = unique_name("unique-cancel");
    let admin = Admin::connect(server.url()).await.unwrap();
    // The service exists once a producer recorded it; tracking on first.
    let producer = producer(&server.url(), &name).await;
    let service = admin.service(&name).await.unwrap();
    service.set_tracking(Tracking::on()).await.unwrap();
    let producer = {
        drop(producer);
        self::producer(&server.url(), &name).await
    };
    let first = producer
        .enqueue_with(job(1, &[]), unique("export-3"))
        .await
        .unwrap();
    refused(&producer, job(2, &[]), "export-3", &first).await;
    let handle = producer.handle_of(&first, Some("export-3"));
    service.cancel(&handle).await.unwrap();
    // No consumer runs: the cancel itself freed the key.
    let next = producer
        .enqueue_with(job(3, &[]), unique("export-3"))
        .await
        .unwrap();
    // The cancelled task's entry, acked without running by the start that
    // reads it, leaves the newer task's lock alone.
    let (runs, gate): (Runs, _) = (Arc::default(), Arc::new(Semaphore::new(0)));
    let a = consumer(&server.url(), &name, &runs, &gate);
    wait_until(Duration::from_secs(15), "the next runs", || {
        runs.lock().unwrap().contains_key(&3)
    })
    .await;
    wait_free(&server, &name, "export-3").await;
    a.stop().await;
    let runs = runs.lock().unwrap().clone();
    assert!(
        !runs.contains_key(&1),
        "the cancelled task never ran: {runs:?}"
    );
    assert_ne!(next, first);
}
