//! Retention of final records (docs/design.md §14): at most `keep_count`
//! per partition, none after `keep`, whatever the number of tasks; the
//! settings changed on the running service reach its instances; and what a
//! record costs Redis.

use super::*;

/// The service's task records, as `(partition, task id)`: the fields of
/// each partition's `{N/p}:tasks` (but `''`, whose long value only keeps
/// the hash out of a listpack).
async fn records(
    conn: &mut deadpool_redis::redis::aio::MultiplexedConnection,
    name: &str,
) -> Vec<(u32, String)> {
    let mut found = std::collections::BTreeSet::new();
    for p in 0..P {
        let fields: Vec<String> = deadpool_redis::redis::cmd("HKEYS")
            .arg(format!("{{{name}/{p}}}:tasks"))
            .query_async(conn)
            .await
            .unwrap();
        found.extend(
            fields
                .into_iter()
                .filter(|id| !id.is_empty())
                .map(|id| (p, id)),
        );
    }
    found.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn final_records_are_bounded_by_count_and_time_and_cost_a_few_hundred_bytes() {
    let (server, name, runs, stop, task, producer, service) = setup().await;
    let mut conn = server.connection().await;
    // Switched on the running service: 10 per partition, 2 s.
    const KEEP: u32 = 10;
    let tracking = Tracking::on().keep(Duration::from_secs(2)).keep_count(KEEP);
    service.set_tracking(tracking).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    const N: u64 = 400;
    let jobs: Vec<Job> = (0..N).map(Job::Succeed).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    // (`wait` would not do: a task's record may be gone, beyond the count,
    // by the time it is read.)
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while (0..N).any(|seq| !runs.lock().unwrap().contains_key(&seq)) {
        assert!(tokio::time::Instant::now() < deadline, "not every task ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every task ended: at most KEEP final records per partition remain.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let kept = loop {
        let kept = records(&mut conn, &name).await;
        let per_partition = (0..P).map(|p| kept.iter().filter(|(q, _)| *q == p).count());
        if per_partition.clone().all(|n| n <= KEEP as usize) {
            break kept;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "records per partition: {:?}",
            per_partition.collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        kept.len() >= P as usize,
        "the newest are kept: {}",
        kept.len()
    );
    for p in 0..P {
        let members: u64 = deadpool_redis::redis::cmd("LLEN")
            .arg(format!("{{{name}/{p}}}:ended"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(
            members <= u64::from(KEEP),
            "partition {p}: {members} in its ended list"
        );
    }
    // What one final record with a small result costs: the partitions'
    // records and ended lists over the records they hold.
    let mut bytes = 0;
    for p in 0..P {
        for key in [
            format!("{{{name}/{p}}}:tasks"),
            format!("{{{name}/{p}}}:ended"),
        ] {
            let used: Option<u64> = deadpool_redis::redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(key)
                .query_async(&mut conn)
                .await
                .unwrap();
            bytes += used.unwrap_or(0);
        }
    }
    let mean = bytes / kept.len().max(1) as u64;
    eprintln!(
        "a final record with a small result: {mean} bytes on average ({} records)",
        kept.len()
    );
    assert!(mean < 512, "{mean} bytes per record");
    // After `keep`, none is left.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // (The periodic job's tasks go on ending: theirs are newer.)
    let mut left = records(&mut conn, &name).await;
    left.retain(|(_, id)| !id.starts_with("cron:"));
    assert!(left.is_empty(), "records left after keep: {left:?}");
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// A replayed task's id leaves the ended lists (docs/design.md §14), so the
/// eviction of its first end cannot take the record of its second, and the
/// runs of `{N/p}:ended_at` still count the ids of `{N/p}:ended`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_task_leaves_the_ended_lists_and_the_runs_still_count_their_ids() {
    let (server, name, _runs, stop, task, producer, service) = setup().await;
    let id = producer.enqueue(&Job::Fail(7)).await.unwrap();
    let handle = producer.handle_of(&id, None);
    let Waited::Final(record) = service.wait(&handle, PATIENCE).await.unwrap() else {
        panic!("wait timed out");
    };
    assert_eq!(record.state, Some(TaskState::Dead));
    let p = record.handle.partition().expect("a partition");
    let mut conn = server.connection().await;
    assert!(
        list(&mut conn, &name, p, "ended")
            .await
            .contains(&id.to_string())
    );
    // Paused, so that the replayed task waits while the lists are read.
    paused(&service).await;
    let letters = service.dead_letters().list(10).await.unwrap();
    let letter = letters
        .iter()
        .find(|l| l.task_id.as_ref() == Some(&id))
        .expect("its dead letter");
    assert!(service.dead_letters().replay(letter).await.unwrap());
    let ended = list(&mut conn, &name, p, "ended").await;
    assert!(!ended.contains(&id.to_string()), "{ended:?}");
    let counted: usize = list(&mut conn, &name, p, "ended_at")
        .await
        .iter()
        .map(|run| run.rsplit_once(' ').unwrap().1.parse::<usize>().unwrap())
        .sum();
    assert_eq!(counted, ended.len());
    let record = service.task(&handle).await.unwrap().unwrap();
    assert_eq!(record.state, Some(TaskState::Waiting));
    service.resume().await.unwrap();
    stop.cancel();
    task.await.unwrap().unwrap();
}
