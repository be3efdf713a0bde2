//! The checker on histories written by hand: each guarantee it checks is
//! reported broken when the history breaks it, and a second run is let
//! pass only when a fault that allows it hit the first run's process.

use std::time::Duration;

use crate::check::check;
use crate::plan::Plan;
use crate::report::Report;

/// 1,000 s after the epoch: the run's start, in µs.
const T0: u64 = 1_000_000_000;

/// Checks `files` (name, lines) with faults injected for `secs` seconds.
fn checked(files: &[(&str, &str)], secs: u64) -> Report {
    let dir = std::env::temp_dir().join(support::unique_name("chaos-check"));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, lines) in files {
        std::fs::write(dir.join(format!("{name}.ev")), lines).unwrap();
    }
    // A limit of 10 starts a second, unless a test gives its own window.
    if !files.iter().any(|(name, _)| *name == "window") {
        let window = format!("W {T0} {} 10\n", T0 + secs * 1_000_000);
        std::fs::write(dir.join("window.ev"), window).unwrap();
    }
    let plan = Plan {
        run_for: Duration::from_secs(secs),
        rate: 100,
        seed: 1,
        min_consumers: 2,
        max_consumers: 2,
        fault_every: Duration::from_secs(1),
        dir: dir.clone(),
    };
    let report = check(&plan);
    std::fs::remove_dir_all(dir).unwrap();
    report
}

#[test]
fn a_task_enqueued_and_never_run_is_lost() {
    let r = checked(
        &[
            ("p1", "E 1 1000000100 P\nE 2 1000000100 P\n"),
            ("c0.1", "F a 1 0 1 1 1000000200 1000000201\n"),
        ],
        5,
    );
    assert_eq!(r.lost.len(), 1, "{r:?}");
    assert_eq!(r.violations(), 1);
}

#[test]
fn a_poison_task_must_be_dead_once() {
    let r = checked(
        &[
            (
                "p1",
                "E 1 1000000100 X\nE 2 1000000100 X\nE 3 1000000100 X\n",
            ),
            ("orchestra", "L 1\nL 2\nL 2\n"),
        ],
        5,
    );
    assert_eq!((r.lost.len(), r.twice_dead.len()), (1, 1), "{r:?}");
}

#[test]
fn a_second_run_is_allowed_only_after_a_fault_on_the_first_runs_process() {
    let history = "E 1 1000000100 P\nE 2 1000000100 P\n";
    let runs = [
        (
            "c0.1",
            "F a 1 0 1 1 1000000200 1000000201\nF a 2 0 1 1 1000000200 1000000201\n",
        ),
        (
            "c1.1",
            "F a 1 0 2 2 1008000000 1008000001\nF a 2 0 2 2 1008000000 1008000001\n",
        ),
    ];
    // No fault: both second runs are violations.
    let r = checked(&[("p1", history), runs[0], runs[1]], 5);
    assert_eq!(r.unexplained.len(), 2, "{r:?}");
    // A kill of c0.1 right after its effects explains them; a kill of
    // another process, one long after, or one after the second run, or a
    // graceful leave, does not.
    let kill = "K kill c0.1 1000000500 1000000500\n";
    let r = checked(&[("p1", history), runs[0], runs[1], ("orchestra", kill)], 5);
    assert_eq!(r.unexplained.len(), 0, "{r:?}");
    for other in [
        "K kill c1.1 1000000500 1000000500\n",
        "K kill c0.1 1006000000 1006000000\n",
        "K kill c0.1 1009000000 1009000000\n",
        "K leave c0.1 1000000500 1000000600\n",
    ] {
        let r = checked(
            &[("p1", history), runs[0], runs[1], ("orchestra", other)],
            5,
        );
        assert_eq!(r.unexplained.len(), 2, "{other}: {r:?}");
    }
    // A fence of c0.1's own unordered instance right after its effects
    // explains them too; one of its ordered instance does not.
    let fence = (
        "c0.1",
        "F a 1 0 1 1 1000000200 1000000201\nF a 2 0 1 1 1000000200 1000000201\nA a f 1000900000\n",
    );
    let r = checked(&[("p1", history), fence, runs[1]], 5);
    assert_eq!(r.unexplained.len(), 0, "{r:?}");
    let other = (
        "c0.1",
        "F a 1 0 1 1 1000000200 1000000201\nF a 2 0 1 1 1000000200 1000000201\nA o f 1000900000\n",
    );
    let r = checked(&[("p1", history), other, runs[1]], 5);
    assert_eq!(r.unexplained.len(), 2, "{r:?}");
    // A second run must have a higher attempt, whatever the fault.
    let same_attempt = (
        "c1.1",
        "F a 1 0 2 1 1008000000 1008000001\nF a 2 0 2 2 1008000000 1008000001\n",
    );
    let r = checked(
        &[("p1", history), runs[0], same_attempt, ("orchestra", kill)],
        5,
    );
    assert_eq!((r.unexplained.len(), r.same_attempt.len()), (0, 1), "{r:?}");
}

#[test]
fn a_key_runs_in_its_order() {
    let history = "E 1 1000000100 O 7 1\nE 2 1000000100 O 7 2\nE 3 1000000100 O 7 3\n";
    let in_order = (
        "c0.1",
        "F o 1 3 1 1 1000000200 1000000201\nF o 2 3 1 1 1000000300 1000000301\nF o 3 3 1 1 1000000400 1000000401\n",
    );
    assert_eq!(checked(&[("p1", history), in_order], 5).violations(), 0);
    let skipped = (
        "c0.1",
        "F o 1 3 1 1 1000000200 1000000201\nF o 3 3 1 1 1000000300 1000000301\nF o 2 3 1 1 1000000400 1000000401\n",
    );
    let r = checked(&[("p1", history), skipped], 5);
    assert_eq!(r.order.len(), 2, "{r:?}");
}

#[test]
fn an_effect_checked_after_a_newer_owner_started_needs_a_freeze_in_between() {
    let history = "E 1 1000000100 P\n";
    // c0.1 holds partition 5 with token 1; c1.1 starts it with token 2 at
    // +2 s; c0.1's check passes at +3 s.
    let old = (
        "c0.1",
        "S a 1 5 1 1 1000000200\nF a 1 5 1 1 1003000000 1003000100\n",
    );
    let new = ("c1.1", "S a 9 5 2 1 1002000000\n");
    let r = checked(&[("p1", history), old, new], 5);
    assert_eq!(r.stale.len(), 1, "{r:?}");
    let frozen = ("orchestra", "K freeze c0.1 1003000050 1003500000\n");
    let r = checked(&[("p1", history), old, new, frozen], 5);
    assert_eq!((r.stale.len(), r.stale_explained), (0, 1), "{r:?}");
}

#[test]
fn a_periodic_due_time_not_run_is_missed_unless_skipped() {
    // Due times from 1,010 s to 1,019 s: all but 1,015 s run.
    let ticks: String = (1010..1020)
        .filter(|s| *s != 1015)
        .map(|s| {
            format!(
                "T {} 0 1 1 {} {}\n",
                s * 1000,
                s * 1_000_000,
                s * 1_000_000 + 1
            )
        })
        .collect();
    let ticks = format!("A a 1 1005000000\n{ticks}");
    let r = checked(&[("c0.1", &ticks)], 20);
    assert_eq!(r.ticks_missed, vec![1_015_000], "{r:?}");
    // Skipped, not missed: in a pause; with no instance assigned; with
    // the only one assigned frozen.
    let pause = "K pause all 1014500000 1015500000\n";
    let r = checked(&[("c0.1", &ticks), ("orchestra", pause)], 20);
    assert_eq!((r.ticks_missed.len(), r.ticks_skipped), (0, 1), "{r:?}");
    let fenced = format!("{ticks}A a o 1014900000\nA a 1 1015100000\n");
    let r = checked(&[("c0.1", &fenced)], 20);
    assert_eq!((r.ticks_missed.len(), r.ticks_skipped), (0, 1), "{r:?}");
    let fenced_late = format!("{ticks}A a f 1015300000\n");
    let r = checked(&[("c0.1", &fenced_late)], 20);
    assert_eq!((r.ticks_missed.len(), r.ticks_skipped), (0, 1), "{r:?}");
    let frozen = "K freeze c0.1 1014000000 1015200000\n";
    let r = checked(&[("c0.1", &ticks), ("orchestra", frozen)], 20);
    assert_eq!((r.ticks_missed.len(), r.ticks_skipped), (0, 1), "{r:?}");
}

#[test]
fn a_delayed_task_never_runs_before_its_due_time() {
    let r = checked(
        &[
            ("p1", "E 1 1000000100 D 1002000\n"),
            ("c0.1", "F a 1 0 1 1 1001000000 1001000001\n"),
        ],
        5,
    );
    assert_eq!(r.early.len(), 1, "{r:?}");
}

#[test]
fn a_cancelled_task_never_starts_and_records_tell_the_truth() {
    let history = "E 1 1000000100 Z\nE 2 1000000100 Z\nE 3 1000000100 Z\nE 4 1000000100 P\nE 5 1000000100 X\n";
    // 1 was cancelled and never ran; 2's cancel came too late; 3's cancel
    // answered nothing (it may or may not run).
    let cancels = "Q 1 cancelled\nQ 2 final\n";
    let runs = "S a 2 0 1 1 1000000150\nF a 2 0 1 1 1000000200 1000000201\nF a 4 0 1 1 1000000200 1000000201\n";
    let records = "L 5\nR 1 cancelled\nR 2 succeeded\nR 4 succeeded\nR 5 dead\n";
    let r = checked(
        &[
            ("p1", &format!("{history}{cancels}")),
            ("c0.1", runs),
            ("orchestra", records),
        ],
        5,
    );
    assert_eq!(r.violations(), 0, "{r:?}");
    assert_eq!((r.to_cancel, r.cancelled, r.records), (3, 1, 4));
    // 1 started after all; 4's record says it is still waiting; 2 (final)
    // never ran: lost.
    let runs = "S a 1 0 1 1 1000000150\nF a 4 0 1 1 1000000200 1000000201\n";
    let records = "L 5\nR 1 cancelled\nR 4 waiting\nR 5 dead\n";
    let r = checked(
        &[
            ("p1", &format!("{history}{cancels}")),
            ("c0.1", runs),
            ("orchestra", records),
        ],
        5,
    );
    assert_eq!(
        (r.cancel_broken.len(), r.records_wrong.len(), r.lost.len()),
        (1, 1, 1),
        "{r:?}"
    );
}

#[test]
fn a_record_is_gone_only_when_its_partition_ended_enough_tasks_after_it() {
    use crate::plan::KEEP_RECORDS;
    // Task 1, cancelled on partition 0, then `later` plain tasks ending on
    // partition 0 after its cancel, and one on partition 1 (not counted).
    let with_later = |later: u64| {
        let mut history = "E 1 1000000100 Z\nH 1 0/t1\nQ 1 cancelled 1000000400\n".to_owned();
        let mut runs = String::new();
        for (i, p) in (0..later).map(|i| (i, 0)).chain([(later, 1)]) {
            let (n, at) = (10 + i, 1_000_000_500 + i);
            history.push_str(&format!("E {n} 1000000100 P\n"));
            runs.push_str(&format!("F a {n} {p} 1 1 {at} {at}\n"));
        }
        let records = "R 1 none\n";
        checked(
            &[("p1", &history), ("c0.1", &runs), ("orchestra", records)],
            5,
        )
    };
    let keep = u64::from(KEEP_RECORDS);
    let r = with_later(keep - 1);
    assert_eq!((r.records_wrong.len(), r.records_evicted), (1, 0), "{r:?}");
    let r = with_later(keep);
    assert_eq!((r.records_wrong.len(), r.records_evicted), (0, 1), "{r:?}");
    assert_eq!(r.violations(), 0, "{r:?}");
}

#[test]
fn the_rate_limit_holds_in_every_second_without_a_fault() {
    // 10 starts in second 1,001 (at the limit of 10), 12 in 1,003.
    let starts: String = (0..10)
        .map(|i| format!("S a {i} 0 1 1 {}\n", 1_001_000_000 + i * 1000))
        .chain((0..12).map(|i| format!("S a {i} 0 1 1 {}\n", 1_003_000_000 + i * 1000)))
        .collect();
    let r = checked(&[("c0.1", &starts)], 5);
    assert_eq!(r.rate.len(), 1, "{r:?}");
    assert!((r.busiest_second - 1.2).abs() < 1e-9, "{r:?}");
    let cut = "K cut c1.1 1002500000 1002900000\n";
    let r = checked(&[("c0.1", &starts), ("orchestra", cut)], 5);
    assert_eq!((r.rate.len(), r.rate_explained), (0, 1), "{r:?}");
    // No limit: nothing to check.
    let window = format!("W {T0} {} 0\n", T0 + 5_000_000);
    let r = checked(&[("c0.1", &starts), ("window", &window)], 5);
    assert_eq!(r.violations(), 0, "{r:?}");
}
