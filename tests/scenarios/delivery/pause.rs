//! Pausing a service (docs/design.md §7) while tasks flow and instances
//! come and go: while `{N}:paused` exists no handler starts, handovers go
//! on, and after the resume every task runs exactly once.

use super::*;

impl Fleet {
    /// Pauses the service (as the CLI does: the key with its record) or
    /// resumes it; returns when Redis has it.
    fn set_paused(&self, paused: bool) {
        let mut conn = self.server.client().get_connection().unwrap();
        let key = format!("{{{}}}:paused", self.name);
        if paused {
            let record = format!(r#"{{"at_ms":{},"by":"scenario"}}"#, now_us() / 1000);
            let () = redis::cmd("SET")
                .arg(&key)
                .arg(record)
                .query(&mut conn)
                .unwrap();
        } else {
            let _: u64 = redis::cmd("DEL").arg(&key).query(&mut conn).unwrap();
        }
    }
}

/// How long after the key changes every instance has seen it: one
/// interval or 1 s, whichever is shorter, plus room for a loaded machine.
const SEEN_WITHIN_US: u128 = 1_500_000;

#[test]
fn a_pause_across_a_join_and_a_leave_starts_nothing_and_the_resume_runs_every_task_once() {
    let _serial = serial();
    let mut fleet = Fleet::new("paused", ServerOptions::default());
    fleet.join();
    fleet.join();
    std::thread::sleep(Duration::from_millis(2500));
    // 6 s of tasks; the pause starts 1.5 s in, so most arrive while paused.
    let count = 12_000;
    let (producer, _) = fleet.produce(count, 2000);
    std::thread::sleep(Duration::from_millis(1500));
    let paused_at = now_us();
    fleet.set_paused(true);

    // Churn while paused: a join, then a graceful leave.
    std::thread::sleep(Duration::from_millis(1500));
    let joined = fleet.join();
    std::thread::sleep(Duration::from_millis(2000));
    fleet.leave(0);
    fleet.wait_exit(0, Duration::from_secs(20));
    drop(wait_child(producer, Duration::from_secs(30)));
    std::thread::sleep(Duration::from_millis(1500));
    let resumed_at = now_us();
    let handled_while_paused = fleet.handled().len() as u64;
    fleet.set_paused(false);

    fleet.wait_handled(|| (0..count).collect(), Duration::from_secs(60));
    fleet.wait_nothing_pending();
    fleet.stop_all();

    let lines = fleet.lines();
    let starts_while_paused: Vec<&Line> = lines
        .iter()
        .filter(|l| l.what == What::Start && l.at > paused_at + SEEN_WITHIN_US && l.at < resumed_at)
        .collect();
    assert!(
        starts_while_paused.is_empty(),
        "{} handlers started while paused, the first: {:?}",
        starts_while_paused.len(),
        starts_while_paused.first()
    );
    // The tasks enqueued meanwhile waited for the resume.
    assert!(
        handled_while_paused + 5_000 <= count,
        "only {} of {count} tasks were left for the resume",
        count - handled_while_paused
    );
    let first_after = lines
        .iter()
        .filter(|l| l.what == What::Start && l.at >= resumed_at)
        .map(|l| l.at)
        .min()
        .expect("tasks start after the resume");
    assert!(
        first_after - resumed_at <= SEEN_WITHIN_US,
        "the first task after the resume started {} ms later",
        (first_after - resumed_at) / 1000
    );
    // Handovers went on: the instance that joined while paused started
    // partitions before the resume.
    let started_while_paused = lines
        .iter()
        .filter(|l| {
            l.consumer == joined
                && matches!(l.what, What::Started { .. })
                && l.at > paused_at
                && l.at < resumed_at
        })
        .count();
    assert!(
        started_while_paused > 0,
        "the instance that joined while paused started no partition before the resume"
    );
    let after_a_fence = fleet.assert_exactly_once(count);
    println!(
        "{count} tasks: {handled_while_paused} handled before the resume, the first after it {} ms after; \
         c{joined} started {started_while_paused} partitions while paused; each task once but {after_a_fence} \
         run again after their instance fenced itself",
        (first_after - resumed_at) / 1000
    );
}
