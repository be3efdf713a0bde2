//! Tracking in ordered partitions, where a failed task is retried in place
//! (docs/design.md §6, §14): its record says `retrying` (attempt, due time,
//! error) during the backoff and `running` again as its next attempt
//! starts; a user's cancel during the backoff ends it `cancelled`, and it
//! never runs again.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_retried_in_place_is_retrying_then_succeeds_and_a_cancel_in_its_backoff_ends_it() {
    let (_server, _name, runs, stop, task, producer, service) = setup_with(true).await;
    // Two keys: two partitions, so neither waits behind the other.
    let options = |key: &str| Options::new().key(key);
    let retried = producer
        .enqueue_with(&Job::RetryLater(1), options("a"))
        .await
        .unwrap();
    let retried = producer.handle_of(&retried, Some("a"));
    let cancelled = producer
        .enqueue_with(&Job::RetryLater(2), options("b"))
        .await
        .unwrap();
    let cancelled = producer.handle_of(&cancelled, Some("b"));
    until_record(&service, &retried, |r| r.state == Some(TaskState::Retrying)).await;
    let record = service.task(&retried).await.unwrap().unwrap();
    assert_eq!(record.attempt, Some(2), "the attempt it runs next");
    assert_eq!(record.error.as_deref(), Some("later"));
    assert!(record.due_at.is_some());
    until_record(&service, &cancelled, |r| {
        r.state == Some(TaskState::Retrying)
    })
    .await;
    assert_eq!(
        service.cancel(&cancelled).await.unwrap(),
        CancelOutcome::Cancelled
    );

    let Waited::Final(record) = service.wait(&retried, PATIENCE).await.unwrap() else {
        panic!("the retried task did not end");
    };
    assert_eq!(record.state, Some(TaskState::Succeeded));
    assert_eq!(record.attempt, Some(2));
    let Waited::Final(record) = service.wait(&cancelled, PATIENCE).await.unwrap() else {
        panic!("the cancelled task did not end");
    };
    assert_eq!(record.state, Some(TaskState::Cancelled));
    // Its backoff ended long ago: it did not run again, and its partition
    // goes on.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        runs.lock().unwrap()[&2].len(),
        1,
        "a cancelled task never runs again"
    );
    let after = producer
        .enqueue_with(&Job::Succeed(3), options("b"))
        .await
        .unwrap();
    let after = producer.handle_of(&after, Some("b"));
    let waited = service.wait(&after, PATIENCE).await.unwrap();
    assert!(matches!(waited, Waited::Final(r) if r.state == Some(TaskState::Succeeded)));
    stop.cancel();
    task.await.unwrap().unwrap();
}
