//! `mail_sender consume --concurrency-per-key N` (issue 38): however many
//! tasks of one key wait, at most N of them run at once, while another
//! key's run beside them.

use super::*;

/// The most tasks of one key the consumer may run at once.
const N: usize = 2;

#[test]
fn concurrency_per_key_runs_at_most_n_tasks_of_a_key_at_once() {
    let server = RedisServer::start();
    let url = server.url();
    let name = unique_name("per-key");
    let n = N.to_string();
    let flags = [
        "--print-tasks",
        "--work-ms",
        "200",
        "--concurrency-per-key",
        &n,
    ];
    let (mut consumer, printed) = json_consumer(&url, &name, &flags);
    // 12 tasks of each of the keys k0 and k1, in one batch.
    let produced = produce_json(
        &url,
        &name,
        &["--count", "24", "--batch", "24", "--keys", "2"],
    );
    assert!(produced.status.success(), "the producer failed");

    // Each task's run, from its `start` line to its `handled` line (printed
    // before its handler returns, so before its slot is free).
    let mut runs: BTreeMap<u64, (String, u128, Option<u128>)> = BTreeMap::new();
    while runs.values().filter(|(_, _, end)| end.is_some()).count() < 24 {
        let line = printed
            .recv_timeout(Duration::from_secs(20))
            .expect("every task handled");
        let at = |f: &BTreeMap<&str, &str>| f["at"].parse::<u128>().unwrap();
        if let Some(f) = fields(&line, "start") {
            let seq = f["seq"].parse().unwrap();
            runs.insert(seq, (f["key"].to_owned(), at(&f), None));
        } else if let Some(f) = fields(&line, "handled") {
            let seq: u64 = f["seq"].parse().unwrap();
            runs.get_mut(&seq).expect("started before handled").2 = Some(at(&f));
        }
    }
    sigterm(&consumer.0);
    exited(&mut consumer, Duration::from_secs(10));

    let most = |key: Option<&str>| {
        let mut edges: Vec<(u128, i32)> = Vec::new();
        for (k, start, end) in runs.values() {
            if key.is_none_or(|key| key == k) {
                edges.extend([(*start, 1), (end.unwrap(), -1)]);
            }
        }
        // An end before a start at the same microsecond.
        edges.sort();
        let mut running = 0;
        edges.iter().fold(0, |most, (_, step)| {
            running += step;
            most.max(running)
        }) as usize
    };
    for key in ["k0", "k1"] {
        assert_eq!(
            most(Some(key)),
            N,
            "at most (and, with 12 waiting, up to) {N} of {key}"
        );
    }
    assert_eq!(most(None), 2 * N, "the other key's run beside them");
}
