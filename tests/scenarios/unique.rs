//! Unique keys under SIGKILL churn (docs/design.md §16): three `mail_sender`
//! consumers as processes, one killed with SIGKILL and replaced every two
//! seconds, while this process enqueues tasks with six unique keys as fast
//! as the keys come free. Checked: every refusal names the key's latest
//! accepted task; no task of a key starts before the key's previous task
//! printed its last line (no two live tasks with one key, from the
//! handlers' own timestamps); and once the queue is drained no key is held
//! and every key takes a new task (no stuck key).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis;
use peerq::producer::{Options, Producer};
use peerq::{Error, TaskId};
use serde::Serialize;
use support::{Proc, RedisServer, signal, unique_name};

const PARTITIONS: u32 = 16;
const KEYS: u64 = 6;

/// The example's task (`mail_sender`'s `Mail`), encoded alike.
#[derive(Serialize)]
struct Mail {
    seq: u64,
    to: String,
}

/// A `start` or `handled` line: its seq, its key, and the handler's time
/// (µs since the Unix epoch).
#[derive(Debug, Clone)]
struct Line {
    seq: u64,
    key: String,
    at: u128,
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

fn parse(line: &str) -> Option<Line> {
    let rest = line
        .strip_prefix("start ")
        .or_else(|| line.strip_prefix("handled "))?;
    let fields: BTreeMap<&str, &str> = rest
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    Some(Line {
        seq: fields.get("seq")?.parse().ok()?,
        key: (*fields.get("key")?).to_owned(),
        at: fields.get("at")?.parse().ok()?,
    })
}

/// Starts one example consumer whose task lines go to `lines`.
fn consumer(url: &str, name: &str, lines: &Arc<Mutex<Vec<Line>>>) -> Proc {
    let mut child = Command::new(support::example_binary("mail_sender"))
        .args(["consume", "--redis", url, "--name", name])
        .args(["--partitions", &PARTITIONS.to_string(), "--work-ms", "20"])
        .arg("--print-tasks")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a consumer");
    let stdout = child.stdout.take().unwrap();
    let lines = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(line) = parse(&line) {
                lines.lock().unwrap().push(line);
            }
        }
    });
    Proc(child)
}

/// One accepted task: its seq, id, and when its enqueue returned (µs).
#[derive(Debug, Clone)]
struct Accepted {
    seq: u64,
    id: TaskId,
    at: u128,
}

#[test]
fn under_sigkill_churn_no_key_has_two_live_tasks_and_none_stays_held() {
    let server = RedisServer::start();
    let name = unique_name("unique-churn");
    let url = server.url();
    let lines: Arc<Mutex<Vec<Line>>> = Arc::default();
    let mut consumers: Vec<Proc> = (0..3).map(|_| consumer(&url, &name, &lines)).collect();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let producer = runtime.block_on(async {
        Producer::builder()
            .name(&name)
            .redis(url.as_str())
            .partitions(PARTITIONS)
            .connect()
            .await
            .unwrap()
    });
    let mut accepted: BTreeMap<String, Vec<Accepted>> = BTreeMap::new();
    let (mut refusals, mut kills) = (0, 0);
    let started = Instant::now();
    let mut next_kill = started + Duration::from_secs(2);
    let mut seq = 0;
    while started.elapsed() < Duration::from_secs(14) {
        if Instant::now() >= next_kill {
            // SIGKILL one, and a new one joins.
            let victim = consumers.remove(kills % consumers.len());
            signal(victim.0.id(), "KILL");
            drop(victim);
            consumers.push(consumer(&url, &name, &lines));
            kills += 1;
            next_kill += Duration::from_secs(2);
        }
        seq += 1;
        let key = format!("u{}", seq % KEYS);
        let mail = Mail {
            seq,
            to: format!("{seq}@example.com"),
        };
        let sent = runtime.block_on(producer.enqueue_with(mail, Options::new().unique(&key)));
        match sent {
            Ok(id) => accepted.entry(key).or_default().push(Accepted {
                seq,
                id,
                at: now_us(),
            }),
            Err(Error::Duplicate(held)) => {
                refusals += 1;
                let latest = accepted.get(&key).and_then(|a| a.last());
                assert_eq!(
                    Some(&held.existing),
                    latest.map(|a| &a.id),
                    "a refusal of `{key}` names its latest accepted task"
                );
            }
            Err(e) => panic!("enqueue failed: {e}"),
        }
        std::thread::sleep(Duration::from_millis(3));
    }
    // Drained: every accepted task printed `handled`, then no key is held.
    let all: Vec<u64> = accepted.values().flatten().map(|a| a.seq).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen: std::collections::BTreeSet<u64> =
            lines.lock().unwrap().iter().map(|l| l.seq).collect();
        if all.iter().all(|s| seen.contains(s)) {
            break;
        }
        assert!(Instant::now() < deadline, "accepted tasks never ran");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut conn = server.client().get_connection().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held: usize = (0..PARTITIONS)
            .map(|p| {
                redis::cmd("HLEN")
                    .arg(format!("{{{name}/{p}}}:unique"))
                    .query::<usize>(&mut conn)
                    .unwrap()
            })
            .sum();
        if held == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{held} unique keys stay held after the drain"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for k in 0..KEYS {
        let mail = Mail {
            seq: 0,
            to: "last@example.com".into(),
        };
        let key = format!("u{k}");
        runtime
            .block_on(producer.enqueue_with(mail, Options::new().unique(&key)))
            .unwrap_or_else(|e| panic!("`{key}` is stuck: {e}"));
    }
    // No overlap: each key's tasks, in acceptance order, each printing its
    // lines only before the next was accepted, and the next printing only
    // after.
    let lines = lines.lock().unwrap().clone();
    let mut by_seq: BTreeMap<u64, Vec<&Line>> = BTreeMap::new();
    for line in &lines {
        by_seq.entry(line.seq).or_default().push(line);
    }
    for (key, tasks) in &accepted {
        for pair in tasks.windows(2) {
            let (before, after) = (&pair[0], &pair[1]);
            let last = by_seq[&before.seq].iter().map(|l| l.at).max().unwrap();
            let first = by_seq[&after.seq].iter().map(|l| l.at).min().unwrap();
            assert!(
                last < after.at && last < first,
                "`{key}`: task {} ran at {last} µs, after task {} was accepted ({} µs) or \
                 started ({first} µs)",
                before.seq,
                after.seq,
                after.at
            );
            assert!(by_seq[&before.seq].iter().all(|l| &l.key == key));
        }
    }
    eprintln!(
        "unique churn: {} accepted, {refusals} refused, {kills} consumers killed",
        all.len()
    );
    assert!(kills >= 5 && refusals > 0 && all.len() > 50);
}
