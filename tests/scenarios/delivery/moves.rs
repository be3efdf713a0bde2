//! How many partitions one membership change moves, by assignor: `N`
//! consumers, one more joins, then that one leaves again (P = 64, the
//! README's table). Rendezvous moves about `P / (N + 1)` each way, only to
//! and from the instance that came and went; modulo moves most of them.

use super::*;

/// What one consumer's join and leave beside `n` others moved: the
/// partitions moved by each, and the pauses of the moved partitions by
/// churn event.
struct Moves {
    joined: usize,
    left: usize,
    rows: Vec<(String, Vec<Duration>)>,
}

/// One consumer joins `n` others under `assignor` and leaves again, on a
/// Redis of its own.
fn one_in_one_out(n: usize, assignor: &'static str) -> Moves {
    let mut fleet = Fleet::new("moves", ServerOptions::default());
    fleet.assignor = assignor;
    // The 64 partitions of the README's table: no levels, whose
    // partitions would move too.
    fleet.consume_args = vec!["--priorities".into(), "normal".into()];
    for _ in 0..n {
        fleet.join();
    }
    // First assignments come one to two intervals after start, then the
    // acquires: settled well within three intervals.
    std::thread::sleep(Duration::from_millis(3 * INTERVAL_MS));
    let newcomer = fleet.join();
    std::thread::sleep(Duration::from_millis(3 * INTERVAL_MS));
    fleet.leave(newcomer);
    fleet.wait_exit(newcomer, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(2 * INTERVAL_MS));
    let end = now_us();
    fleet.stop_all();
    let lines = fleet.lines();
    let rows = pauses(&fleet, &lines, end);
    let moved = |label: String| {
        rows.iter()
            .filter(|(event, _)| *event == label)
            .map(|(_, pauses)| pauses.len())
            .sum::<usize>()
    };
    Moves {
        joined: moved(format!("join c{newcomer}")),
        left: moved(format!("leave c{newcomer}")),
        rows,
    }
}

/// The most partitions one member of `n` may win under rendezvous: `P / n`
/// and five standard deviations of the binomial count, plus 2.
fn bound(n: usize) -> usize {
    let p = f64::from(PARTITIONS);
    let q = 1.0 / n as f64;
    (p * q + 5.0 * (p * q * (1.0 - q)).sqrt() + 2.0) as usize
}

#[test]
fn rendezvous_moves_about_p_over_n_per_join_and_leave_where_modulo_moves_most() {
    let _serial = serial();
    let mut table = Vec::new();
    for n in [3, 10] {
        // Both assignors' runs at once, each with its own Redis and
        // consumers: idle consumers wait on their rounds, not on the CPU
        // (the four runs one after another used 0.12 of a core in 45 s).
        let assignors = ["modulo", "rendezvous"];
        let runs = std::thread::scope(|s| {
            assignors
                .map(|assignor| s.spawn(move || one_in_one_out(n, assignor)))
                .map(|run| run.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
        });
        for (assignor, Moves { joined, left, rows }) in assignors.into_iter().zip(runs) {
            print_pauses(
                &format!("{n} -> {} -> {n} instances, {assignor}", n + 1),
                &rows,
            );
            table.push((n, assignor, joined, left));
            if assignor == "rendezvous" {
                // Only the newcomer's partitions move, each way.
                assert!(
                    joined > 0 && joined <= bound(n + 1),
                    "{n}: join moved {joined}"
                );
                assert!(left <= bound(n + 1), "{n}: leave moved {left}");
                assert_eq!(joined, left, "{n}: the leaver gives back what it took");
                for kind in ["join", "leave"] {
                    let max = max_pause(&rows, kind).expect("partitions moved");
                    assert!(max <= Duration::from_secs(3), "a {kind} paused for {max:?}");
                }
            }
        }
    }
    println!("| instances | assignor | moved by the join | moved by the leave |");
    for (n, assignor, joined, left) in table {
        println!(
            "| {n} -> {} -> {n} | {assignor} | {joined} of {PARTITIONS} | {left} of {PARTITIONS} |",
            n + 1
        );
    }
}
