//! Resharding a running service, with processes (docs/design.md §21):
//! three example consumers of 16 partitions, the example's producer at
//! 1,000 tasks a second, a reshard to 64 and, once that is open, back to
//! 16, with instances joining and leaving during each. Gracefully: every
//! task runs exactly once. With a SIGKILL during each: every task at
//! least once, twice only when in flight on the killed instance. An
//! ordered service of 20 keys: each key's tasks start in their enqueue
//! order, with fencing tokens that never fall, across both reshards.

use std::collections::BTreeMap;

use peerq::admin::Admin;

use super::*;

/// 1,000 tasks a second for 16 s: both reshards are open within about
/// 10 s of the first task (the second 7.6 to 9.9 s in, measured alone),
/// so the last generation still runs 6,000 tasks or more.
const COUNT: u64 = 16_000;
const RATE: u64 = 1_000;

/// Starts a reshard of `fleet`'s service to `partitions`, waiting out the
/// previous one's settling (`running`); returns the new generation.
fn start_reshard(fleet: &Fleet, partitions: u32) -> u32 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let admin = Admin::connect(fleet.server.url().as_str()).await.unwrap();
        let service = admin.service(&fleet.name).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match service.reshard(partitions).await {
                Ok(r) => return r.generation,
                Err(peerq::Error::ReshardRefused(r))
                    if r.reason() == "running" && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("reshard to {partitions}: {e}"),
            }
        }
    })
}

/// Waits until a task ran in `generation`.
fn wait_generation(fleet: &Fleet, generation: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !fleet
        .lines()
        .iter()
        .any(|l| l.what == What::Handled && l.generation == generation)
    {
        assert!(
            Instant::now() < deadline,
            "generation {generation} never ran a task"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How an instance goes during each reshard.
#[derive(Clone, Copy, PartialEq)]
enum Goes {
    Leaves,
    Killed,
}

/// Three consumers, the producer, and both reshards with a join and a
/// departure during each; returns the fleet once every task ran.
fn two_reshards(prefix: &str, goes: Goes, ordered: bool) -> Fleet {
    let mut fleet = Fleet::new(prefix, ServerOptions::default());
    if ordered {
        // 20 keys are at most 20 partitions at work, one task each at a
        // time: shorter tasks keep up with the producer.
        fleet.work_ms = 5;
        fleet.consume_args = vec!["--ordered".into(), "--priorities".into(), "normal".into()];
        fleet.produce_args = vec![
            "--keys".into(),
            "20".into(),
            "--priorities".into(),
            "normal".into(),
        ];
    }
    // The first consumer makes the service of 16; the others adopt it (a
    // count given after a reshard must be the new one).
    let plain = fleet.consume_args.clone();
    fleet
        .consume_args
        .extend(["--partitions".into(), "16".into()]);
    fleet.join();
    fleet.consume_args = plain;
    // The others once it has recorded the count (first come, first
    // recorded).
    let mut conn = fleet.server.client().get_connection().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let recorded: Option<u32> = redis::cmd("HGET")
            .arg(format!("{{{}}}:meta", fleet.name))
            .arg("partitions")
            .query(&mut conn)
            .unwrap();
        if recorded == Some(16) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first consumer recorded {recorded:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..2 {
        fleet.join();
    }
    std::thread::sleep(Duration::from_millis(2500));
    let (producer, _) = fleet.produce(COUNT, RATE);
    let mut gone = Vec::new();
    for (partitions, want) in [(64, 1), (16, 2)] {
        std::thread::sleep(Duration::from_secs(3));
        let generation = start_reshard(&fleet, partitions);
        assert_eq!(generation, want);
        // While the old layout drains: one joins, one goes.
        fleet.join();
        std::thread::sleep(Duration::from_millis(400));
        let id = fleet
            .running()
            .into_iter()
            .find(|id| !gone.contains(id))
            .unwrap();
        match goes {
            Goes::Leaves => {
                fleet.leave(id);
                gone.push(id);
            }
            Goes::Killed => fleet.kill(id),
        }
        wait_generation(&fleet, generation);
    }
    for id in gone {
        fleet.wait_exit(id, Duration::from_secs(20));
    }
    drop(wait_child(producer, Duration::from_secs(60)));
    fleet.wait_handled(|| (0..COUNT).collect(), Duration::from_secs(60));
    fleet.stop_all();
    // The last tasks ran in the last generation, the first in the first.
    let lines = fleet.lines();
    let handled = |g| {
        lines
            .iter()
            .filter(|l| l.what == What::Handled && l.generation == g)
            .count()
    };
    println!(
        "{COUNT} tasks: {} in generation 0 (16), {} in 1 (64), {} in 2 (16)",
        handled(0),
        handled(1),
        handled(2)
    );
    assert!(handled(0) > 0 && handled(1) > 0 && handled(2) > 0);
    fleet
}

#[test]
fn a_reshard_up_and_down_under_graceful_churn_runs_every_task_exactly_once() {
    let _serial = serial();
    let fleet = two_reshards("reshard", Goes::Leaves, false);
    let after_a_fence = fleet.assert_exactly_once(COUNT);
    println!("each handled once but {after_a_fence} run again after a fence");
}

#[test]
fn a_reshard_up_and_down_with_kills_runs_every_task_at_least_once() {
    let _serial = serial();
    let fleet = two_reshards("reshard-kill", Goes::Killed, false);
    // Twice only when in flight on a killed instance (or after a fence).
    let again = fleet.assert_exactly_once(COUNT);
    println!("{again} tasks run again: in flight at a kill, or after a fence");
}

#[test]
fn an_ordered_service_keeps_each_keys_order_and_tokens_across_two_reshards() {
    let _serial = serial();
    let fleet = two_reshards("reshard-ordered", Goes::Leaves, true);
    fleet.assert_exactly_once(COUNT);
    // Each key's starts, by the handlers' clocks: in enqueue order (a seq
    // may start again after an interrupted run), tokens never falling.
    let mut starts: Vec<&Line> = Vec::new();
    let lines = fleet.lines();
    starts.extend(lines.iter().filter(|l| l.what == What::Start));
    starts.sort_by_key(|l| l.at);
    let mut last: BTreeMap<u64, (u64, u64, u32)> = BTreeMap::new();
    for s in starts {
        let key = s.seq % 20;
        if let Some(&(seq, token, generation)) = last.get(&key) {
            assert!(
                s.seq >= seq,
                "key {key}: task {} (generation {}) started after task {seq} (generation {generation})",
                s.seq,
                s.generation
            );
            assert!(
                s.token >= token,
                "key {key}: token {} after {token}",
                s.token
            );
        }
        last.insert(key, (s.seq, s.token, s.generation));
    }
}
