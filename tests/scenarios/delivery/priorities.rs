//! Priority levels (docs/design.md §17) with consumers as processes: tasks
//! of three levels, enqueued by the example's producer (`--priority`),
//! each run exactly once at its level's partitions while instances join,
//! leave gracefully and are killed (but for what the kill caught between a
//! run and its ack, which runs again with a higher attempt: §5 rule 3);
//! and high tasks enqueued behind a normal backlog start ahead of it.

use super::*;

#[test]
fn tasks_of_every_level_run_once_at_their_level_through_joins_leaves_and_kills() {
    let _serial = serial();
    let mut fleet = Fleet::new("levels", ServerOptions::default());
    // About 6 s of work for two instances: the churn lands while it runs.
    fleet.work_ms = 100;
    for _ in 0..2 {
        fleet.join();
    }
    std::thread::sleep(Duration::from_millis(2500));
    // A normal backlog first, then high and low tasks behind it.
    let normal = 6_000;
    let (producer, _) = fleet.produce(normal, 0);
    drop(wait_child(producer, Duration::from_secs(30)));
    fleet.produce_args = vec![
        "--priority".into(),
        "high".into(),
        "--first-seq".into(),
        normal.to_string(),
    ];
    let high_enqueued = now_us();
    let (producer, _) = fleet.produce(1_000, 0);
    drop(wait_child(producer, Duration::from_secs(30)));
    fleet.produce_args = vec![
        "--priority".into(),
        "low".into(),
        "--first-seq".into(),
        (normal + 1_000).to_string(),
    ];
    let (producer, _) = fleet.produce(1_000, 0);
    drop(wait_child(producer, Duration::from_secs(30)));
    let count = normal + 2_000;
    fleet.join();
    std::thread::sleep(Duration::from_millis(1500));
    fleet.kill(0);
    std::thread::sleep(Duration::from_millis(1500));
    fleet.leave(1);
    fleet.join();
    fleet.wait_handled(|| (0..count).collect(), Duration::from_secs(90));
    fleet.stop_all();
    fleet.assert_exactly_once(count);

    let lines = fleet.lines();
    let level = |seq: u64| match seq {
        s if s < normal => 0..PARTITIONS,
        s if s < normal + 1_000 => PARTITIONS..2 * PARTITIONS,
        _ => 2 * PARTITIONS..3 * PARTITIONS,
    };
    let misplaced: Vec<&Line> = lines
        .iter()
        .filter(|l| l.what == What::Start && !level(l.seq).contains(&l.partition))
        .collect();
    assert!(
        misplaced.is_empty(),
        "tasks out of their level's partitions: {:?}",
        &misplaced[..misplaced.len().min(5)]
    );
    // The high tasks overtook the normal backlog: half of them started
    // before half of the normal tasks enqueued before them.
    let mut high: Vec<u128> = lines
        .iter()
        .filter(|l| l.what == What::Start && (normal..normal + 1_000).contains(&l.seq))
        .map(|l| l.at)
        .collect();
    let mut backlog: Vec<u128> = lines
        .iter()
        .filter(|l| l.what == What::Start && l.seq < normal && l.at >= high_enqueued)
        .map(|l| l.at)
        .collect();
    high.sort_unstable();
    backlog.sort_unstable();
    eprintln!(
        "levels: {count} tasks once each; half the high tasks started {:.2} s after their enqueue, half the normal ones left then {:.2} s",
        (high[high.len() / 2] - high_enqueued) as f64 / 1e6,
        (backlog[backlog.len() / 2] - high_enqueued) as f64 / 1e6,
    );
    assert!(
        high[high.len() / 2] < backlog[backlog.len() / 2],
        "high tasks did not overtake the backlog"
    );
}
