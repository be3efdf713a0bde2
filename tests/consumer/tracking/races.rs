//! Cancel races (docs/design.md §14): whichever script Redis ran first wins,
//! and every task ends in exactly one final state: a storm of cancels
//! against starts, acks and retries; a cancel across a graceful handover;
//! a cancel while the service is paused.

use std::collections::BTreeMap;

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_racing_starts_acks_and_retries_leave_exactly_one_final_state_each() {
    let (_server, _name, runs, stop, task, producer, service) = setup().await;
    // Tasks of 0 to 20 ms, every third failing once first (a retry after
    // 50 ms), each even one cancelled 0 to 40 ms after its enqueue: while
    // it waits, starts, runs, is retried or acked.
    const N: u64 = 300;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let enqueue = {
        tokio::spawn(async move {
            for seq in 0..N {
                let (ms, fail) = (seq * 7 % 21, seq % 3 == 0);
                let job = if fail {
                    Job::FailOnce(seq, ms)
                } else {
                    Job::Work(seq, ms)
                };
                let id = producer.enqueue(&job).await.unwrap();
                tx.send((
                    seq,
                    producer.handle_of(&id, None),
                    tokio::time::Instant::now(),
                ))
                .unwrap();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let mut handles = Vec::new();
    let mut cancels = tokio::task::JoinSet::new();
    while let Some((seq, handle, at)) = rx.recv().await {
        if seq % 2 == 0 {
            let (service, handle) = (service.clone(), handle.clone());
            let after = Duration::from_millis(seq * 13 % 41);
            cancels.spawn(async move {
                tokio::time::sleep_until(at + after).await;
                (seq, service.cancel(&handle).await.unwrap())
            });
        }
        handles.push((seq, handle));
    }
    enqueue.await.unwrap();
    let mut outcomes = BTreeMap::new();
    while let Some(cancelled) = cancels.join_next().await {
        let (seq, outcome) = cancelled.unwrap();
        outcomes.insert(seq, outcome);
    }
    let kinds: BTreeMap<&str, usize> = outcomes.values().fold(BTreeMap::new(), |mut m, o| {
        *m.entry(match o {
            CancelOutcome::Cancelled => "cancelled",
            CancelOutcome::Requested { .. } => "requested",
            CancelOutcome::AlreadyFinal(_) => "final",
            _ => "unknown",
        })
        .or_default() += 1;
        m
    });
    eprintln!("cancel outcomes: {kinds:?}");
    for (seq, handle) in &handles {
        let Waited::Final(record) = service.wait(handle, PATIENCE).await.unwrap() else {
            panic!("task {seq} did not end");
        };
        let state = record.state.unwrap();
        let ran = runs.lock().unwrap().get(seq).cloned().unwrap_or_default();
        match (outcomes.get(seq), state) {
            // Not cancelled: it succeeded, after its failures.
            (None, TaskState::Succeeded) => {
                let want = if seq % 3 == 0 { 2 } else { 1 };
                assert_eq!(ran.len(), want, "task {seq}: {ran:?}");
            }
            // Cancelled before it started, or while its retry waited: it
            // never runs again, and ends cancelled.
            (Some(CancelOutcome::Cancelled), TaskState::Cancelled) => {
                let most = if seq % 3 == 0 { 1 } else { 0 };
                assert!(ran.len() <= most, "task {seq} ran on: {ran:?}");
            }
            // Running when cancelled: it ends cancelled, or succeeded if its
            // ack's script ran first; never retried after the cancel.
            (
                Some(CancelOutcome::Requested { .. }),
                TaskState::Cancelled | TaskState::Succeeded,
            ) => {}
            // Final first: the cancel said so, and it stays succeeded.
            (Some(CancelOutcome::AlreadyFinal(TaskState::Succeeded)), TaskState::Succeeded) => {}
            (outcome, state) => panic!("task {seq}: cancel said {outcome:?}, it ended {state:?}"),
        }
        assert!(record.is_final());
    }
    // Nothing runs after its end.
    let before = runs.lock().unwrap().clone();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let after = runs.lock().unwrap().clone();
    let moved: Vec<_> = (0..N).filter(|s| before.get(s) != after.get(s)).collect();
    assert!(moved.is_empty(), "tasks ran after they ended: {moved:?}");
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_a_task_after_a_graceful_handover_and_while_paused() {
    let (server, name, runs, stop_a, task_a, producer, service) = setup().await;
    let id = producer.enqueue(&Job::Hang(1)).await.unwrap();
    let handle = producer.handle_of(&id, None);
    wait_for_state(&service, &handle, TaskState::Running).await;
    let first = service.task(&handle).await.unwrap().unwrap().instance;
    // A second instance joins, the first leaves: its run is interrupted
    // (not cancelled) and the task runs again on the second.
    let (stop_b, task_b) = start(&server.url(), &name, &runs, false);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop_a.cancel();
    task_a.await.unwrap().unwrap();
    until_record(&service, &handle, |r| {
        r.state == Some(TaskState::Running) && r.instance != first && r.attempt == Some(2)
    })
    .await;
    // Paused: running tasks go on, and hear a cancel.
    paused(&service).await;
    assert!(matches!(
        service.cancel(&handle).await.unwrap(),
        CancelOutcome::Requested { .. }
    ));
    let Waited::Final(record) = service.wait(&handle, PATIENCE).await.unwrap() else {
        panic!("the cancelled task did not end");
    };
    assert_eq!(record.state, Some(TaskState::Cancelled));
    assert_eq!(
        runs.lock().unwrap()[&1],
        [
            (1, Some(CancelReason::Interrupted)),
            (2, Some(CancelReason::User))
        ],
        "interrupted by the handover, then cancelled by the user on the next owner"
    );
    stop_b.cancel();
    task_b.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_a_task_on_an_instance_whose_connections_were_cut() {
    let (server, name, runs, stop_a, task_a, producer, service) = setup().await;
    // A second instance, through a proxy; the first leaves, so the second
    // owns every partition.
    let proxy = support::Proxy::start(server.port());
    let (stop_b, task_b) = start(&proxy.url(), &name, &runs, false);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop_a.cancel();
    task_a.await.unwrap().unwrap();
    let id = producer.enqueue(&Job::Hang(7)).await.unwrap();
    let handle = producer.handle_of(&id, None);
    wait_for_state(&service, &handle, TaskState::Running).await;
    // Its subscription to the cancels breaks with the rest, and is made
    // again.
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.restore();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The cut may have interrupted the run (a lapsed lease): then the task
    // runs again. Either way a handler of it is running now, and its
    // record says so.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let running = runs.lock().unwrap()[&7].last().copied();
        let record = service.task(&handle).await.unwrap().unwrap();
        if let Some((attempt, None)) = running
            && record.state == Some(TaskState::Running)
            && record.attempt == Some(attempt)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{running:?} {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    service.cancel(&handle).await.unwrap();
    let Waited::Final(record) = service.wait(&handle, PATIENCE).await.unwrap() else {
        panic!("the cancelled task did not end");
    };
    assert_eq!(record.state, Some(TaskState::Cancelled));
    let last = runs.lock().unwrap()[&7].last().copied();
    assert_eq!(
        last.map(|(_, why)| why),
        Some(Some(CancelReason::User)),
        "{last:?}"
    );
    stop_b.cancel();
    task_b.await.unwrap().unwrap();
}
