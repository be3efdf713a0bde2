//! The `mail_sender` example itself, as a person would run it: three
//! consumers as child processes, a producer of 5,000 tasks; with
//! `--wait-for-replicas`, on one server and on a Cluster, a producer that
//! prints a batch only once a replica has it; and with `--track` and
//! `--codec json`, tasks' progress, results and a user's cancel; with
//! `--concurrency-per-key`, at most that many tasks of one key at once
//! (`per_key`).

mod per_key;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::Json;
use peerq::admin::Admin;
use peerq::tracking::{CancelOutcome, TaskHandle, TaskState, Waited};
use support::{Proc, RedisServer, unique_name};

fn example_binary() -> PathBuf {
    support::example_binary("mail_sender")
}

/// One `handled ...` line.
#[derive(Debug, Clone)]
struct Handled {
    consumer: usize,
    seq: u64,
    partition: u32,
    index: u32,
    replicas: u32,
    epoch: u64,
    attempt: u32,
}

fn parse(consumer: usize, line: &str) -> Option<Handled> {
    let rest = line.strip_prefix("handled ")?;
    let fields: BTreeMap<&str, &str> = rest
        .split(' ')
        .filter_map(|kv| kv.split_once('='))
        .collect();
    Some(Handled {
        consumer,
        seq: fields.get("seq")?.parse().ok()?,
        partition: fields.get("partition")?.parse().ok()?,
        index: fields.get("index")?.parse().ok()?,
        replicas: fields.get("replicas")?.parse().ok()?,
        epoch: fields.get("epoch")?.parse().ok()?,
        attempt: fields.get("attempt")?.parse().ok()?,
    })
}

fn sigterm(child: &Child) {
    support::signal(child.id(), "TERM");
}

#[test]
fn three_example_consumers_handle_every_task_exactly_once_on_its_owner() {
    let server = RedisServer::start();
    let name = unique_name("example");
    let bin = example_binary();
    let handled: Arc<Mutex<Vec<Handled>>> = Arc::default();
    // Log lines where a consumer fenced itself (a lapsed lease or a failed
    // round, as on a starved machine): its tasks then run again elsewhere.
    let fences: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut consumers = Vec::new();
    for consumer in 0..3 {
        let mut child = Command::new(&bin)
            .args([
                "consume",
                "--redis",
                &server.url(),
                "--name",
                &name,
                "--print-tasks",
            ])
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a consumer");
        let err = child.stderr.take().unwrap();
        let fenced = fences.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("consumer {consumer}: {line}");
                if line.contains("fencing every partition") {
                    fenced.lock().unwrap().push(line);
                }
            }
        });
        let out = child.stdout.take().unwrap();
        let handled = handled.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if line.starts_with("start ") {
                    continue;
                }
                let parsed =
                    parse(consumer, &line).unwrap_or_else(|| panic!("unexpected line: {line}"));
                handled.lock().unwrap().push(parsed);
            }
        });
        consumers.push(Proc(child));
    }
    // Let all three take their first assignment (one to two intervals of
    // 1 s), then spread the tasks over two seconds.
    std::thread::sleep(Duration::from_millis(2500));
    let produced = Command::new(&bin)
        .args([
            "produce",
            "--redis",
            &server.url(),
            "--name",
            &name,
            "--count",
            "5000",
            "--batch",
            "50",
            "--rate",
            "2500",
        ])
        .status()
        .expect("run the producer");
    assert!(produced.success(), "the producer failed");

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen: BTreeSet<u64> = handled.lock().unwrap().iter().map(|h| h.seq).collect();
        if seen.len() == 5000 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {} of 5000 tasks handled",
            seen.len()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A graceful stop: SIGTERM, and each exits successfully.
    for c in &consumers {
        sigterm(&c.0);
    }
    for c in &mut consumers {
        let status = c.0.wait().unwrap();
        assert!(
            status.success(),
            "a consumer did not stop cleanly: {status}"
        );
    }

    let handled = handled.lock().unwrap().clone();
    let retried = handled.iter().filter(|h| h.attempt > 1).count();
    println!(
        "fences: {}, tasks handled on a later attempt: {retried}",
        fences.lock().unwrap().len()
    );
    let mut per_seq: BTreeMap<u64, usize> = BTreeMap::new();
    let mut holders: BTreeMap<(u64, u32), BTreeSet<usize>> = BTreeMap::new();
    for h in &handled {
        *per_seq.entry(h.seq).or_default() += 1;
        assert_eq!(
            h.partition % h.replicas,
            h.index - 1,
            "not the owner: {h:?}"
        );
        // A task runs again (attempt 2) only after a consumer fenced
        // itself: `still_owned` refused its effect, or it was interrupted.
        assert!(
            h.attempt == 1 || !fences.lock().unwrap().is_empty(),
            "a second attempt with no fence: {h:?}"
        );
        holders
            .entry((h.epoch, h.index))
            .or_default()
            .insert(h.consumer);
    }
    assert_eq!(per_seq.len(), 5000);
    let twice: Vec<_> = per_seq.iter().filter(|(_, n)| **n != 1).take(5).collect();
    assert!(twice.is_empty(), "handled more than once: {twice:?}");
    for ((epoch, index), who) in holders {
        assert_eq!(
            who.len(),
            1,
            "epoch {epoch}: index {index} held by consumers {who:?}"
        );
    }
    let by_consumer: BTreeSet<usize> = handled.iter().map(|h| h.consumer).collect();
    assert_eq!(by_consumer.len(), 3, "every consumer handled tasks");
}

/// Starts one example consumer of `name`, its output discarded.
fn consumer(bin: &PathBuf, url: &str, name: &str) -> Proc {
    let child = Command::new(bin)
        .args(["consume", "--redis", url, "--name", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start a consumer");
    Proc(child)
}

/// Waits for `proc` to exit successfully; returns when it did.
fn exited(proc: &mut Proc, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = proc.0.try_wait().unwrap() {
            assert!(
                status.success(),
                "a consumer did not stop cleanly: {status}"
            );
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "a consumer did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn one_sigterm_leaves_gracefully_and_a_second_leaves_at_once() {
    let server = RedisServer::start();
    let name = unique_name("signals");
    let bin = example_binary();
    let mut graceful = consumer(&bin, &server.url(), &name);
    let mut hasty = consumer(&bin, &server.url(), &name);
    // Both assigned (one to two intervals of 1 s).
    std::thread::sleep(Duration::from_millis(2500));

    // A graceful leave waits for the first round without the instance: at
    // least an interval.
    let sent = Instant::now();
    sigterm(&graceful.0);
    let took = exited(&mut graceful, Duration::from_secs(10)) - sent;
    println!("graceful leave: {took:?}");
    assert!(took >= Duration::from_millis(900), "left after {took:?}");

    // A second SIGTERM cuts the leave short.
    let sent = Instant::now();
    sigterm(&hasty.0);
    std::thread::sleep(Duration::from_millis(50));
    sigterm(&hasty.0);
    let took = exited(&mut hasty, Duration::from_secs(10)) - sent;
    println!("leave at once: {took:?}");
    assert!(took < Duration::from_millis(700), "left after {took:?}");
}

/// The service's indexing mode as recorded in its meta hash, once the first
/// consumer has started.
fn recorded_indexing(server: &RedisServer, name: &str) -> Option<String> {
    let mut con = server.client().get_connection().unwrap();
    redis::cmd("HGET")
        .arg(format!("{{{name}}}:meta"))
        .arg("indexing")
        .query(&mut con)
        .unwrap()
}

#[test]
fn indexing_flag_picks_the_service_mode() {
    let server = RedisServer::start();
    let bin = example_binary();
    let incr = unique_name("flag-incr");
    let ranked = unique_name("flag-ranked");
    let _incr = {
        let child = Command::new(&bin)
            .args(["consume", "--redis", &server.url(), "--name", &incr])
            .args(["--indexing", "incr"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a consumer");
        Proc(child)
    };
    let _ranked = consumer(&bin, &server.url(), &ranked);
    let deadline = Instant::now() + Duration::from_secs(10);
    while recorded_indexing(&server, &incr).is_none()
        || recorded_indexing(&server, &ranked).is_none()
    {
        assert!(Instant::now() < deadline, "no consumer recorded its mode");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(recorded_indexing(&server, &incr).as_deref(), Some("incr"));
    assert_eq!(
        recorded_indexing(&server, &ranked).as_deref(),
        Some("ranked"),
        "ranked is the default"
    );

    // Any other value is refused before the consumer starts.
    let out = Command::new(&bin)
        .args(["consume", "--redis", &server.url(), "--name", &ranked])
        .args(["--indexing", "sorted"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid value 'sorted'"), "{err}");
}

#[test]
fn logs_to_a_pipe_or_a_file_carry_no_colour_codes() {
    // Nothing listens on the port: the consumer logs a warning per try.
    let url = format!("redis://127.0.0.1:{}/", support::unused_port());
    let mut child = Proc(
        Command::new(example_binary())
            .args(["consume", "--redis", &url, "--name", &unique_name("colour")])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a consumer"),
    );
    let (lines, logged) = std::sync::mpsc::channel();
    let err = child.0.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let line = loop {
        let line = logged
            .recv_timeout(Duration::from_secs(10))
            .expect("a warning on stderr");
        if line.contains("cannot reach redis") {
            break line;
        }
    };
    sigterm(&child.0);
    assert!(!line.contains('\u{1b}'), "colour codes in {line:?}");
    assert!(line.contains(" WARN "), "{line:?}");
}

/// A server and a replica of it that has synced.
fn master_and_replica() -> (RedisServer, RedisServer) {
    let master = RedisServer::start();
    let replica = RedisServer::start();
    let mut con = replica.client().get_connection().unwrap();
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port())
        .query::<()>(&mut con)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut con)
            .unwrap();
        if info.contains("master_link_status:up") {
            return (master, replica);
        }
        assert!(Instant::now() < deadline, "the replica never synced");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Each line of `stream`, as it comes.
fn lines(stream: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// `produce --wait-for-replicas 1 --print-enqueued` of 200 tasks into
/// service `name` at `redis` (`--redis` and maybe `--cluster`) while a
/// replica is frozen (`thaw` thaws it): the enqueues fail, none is
/// printed, until the replica runs again; then every batch is, once.
fn produce_while_a_replica_is_frozen(redis: &[&str], name: &str, thaw: impl FnOnce()) {
    let mut producer = Proc(
        Command::new(example_binary())
            .arg("produce")
            .args(redis)
            .args(["--name", name, "--count", "200", "--batch", "100"])
            .args(["--print-enqueued", "--wait-for-replicas", "1"])
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the producer"),
    );
    let printed = lines(producer.0.stdout.take().unwrap());
    let logged = lines(producer.0.stderr.take().unwrap());
    // A batch no replica confirmed fails, and is sent again.
    loop {
        let line = logged
            .recv_timeout(Duration::from_secs(10))
            .expect("an enqueue that failed");
        if line.contains("enqueue failed") {
            assert!(line.contains("0 of 1 replicas"), "{line}");
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        printed.try_recv().ok(),
        None,
        "printed before a replica had it"
    );
    thaw();
    let status = producer.0.wait().unwrap();
    assert!(status.success(), "the producer failed: {status}");
    let printed: Vec<String> = printed.iter().collect();
    assert_eq!(
        printed,
        ["enqueued from=0 to=100", "enqueued from=100 to=200"]
    );
}

/// A consumer with `--wait-for-replicas 1` at `redis` runs every task of
/// `0..count` (at least once: a batch sent again is there twice), and
/// stops cleanly.
fn consume_with_a_replica(redis: &[&str], name: &str, count: u64) {
    let mut consumer = Proc(
        Command::new(example_binary())
            .arg("consume")
            .args(redis)
            .args(["--name", name, "--print-tasks", "--wait-for-replicas", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a consumer"),
    );
    let printed = lines(consumer.0.stdout.take().unwrap());
    let mut seen = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < count as usize {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = printed
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("only {} of {count} tasks handled", seen.len()));
        if let Some(handled) = parse(0, &line) {
            seen.insert(handled.seq);
        }
    }
    sigterm(&consumer.0);
    let status = consumer.0.wait().unwrap();
    assert!(
        status.success(),
        "the consumer did not stop cleanly: {status}"
    );
}

#[test]
fn with_wait_for_replicas_a_batch_is_printed_only_once_a_replica_has_it() {
    let (master, replica) = master_and_replica();
    let name = unique_name("replicas");
    let url = master.url();
    let redis = ["--redis", url.as_str()];
    replica.pause();
    produce_while_a_replica_is_frozen(&redis, &name, || replica.resume());
    consume_with_a_replica(&redis, &name, 200);
}

#[test]
fn with_wait_for_replicas_on_a_cluster_a_batch_is_printed_only_once_a_replica_has_it() {
    let cluster = support::RedisCluster::start(3, 1);
    let name = unique_name("replicas-cluster");
    let urls = cluster.seed_urls().join(",");
    let redis = ["--redis", urls.as_str(), "--cluster"];
    let master = cluster.masters().remove(0);
    let replica = cluster.replicas_of(&master).remove(0);
    cluster.freeze(&replica);
    produce_while_a_replica_is_frozen(&redis, &name, || cluster.thaw(&replica));
    consume_with_a_replica(&redis, &name, 200);
}

#[test]
fn wait_for_replicas_0_is_refused_naming_the_setting() {
    let url = format!("redis://127.0.0.1:{}/", support::unused_port());
    for command in [&["consume"][..], &["produce", "--count", "1"]] {
        let out = Command::new(example_binary())
            .args(command)
            .args([
                "--redis",
                &url,
                "--name",
                "zero",
                "--wait-for-replicas",
                "0",
            ])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{command:?} accepted 0 replicas");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("wait_for_replicas"), "{command:?}: {err}");
    }
}

/// Starts `mail_sender consume` of `name` at `url` with a short interval,
/// `--codec json` and `flags`; returns it with its stdout's lines (its
/// warnings go to the test's stderr).
fn json_consumer(url: &str, name: &str, flags: &[&str]) -> (Proc, Receiver<String>) {
    let mut child = Command::new(example_binary())
        .args(["consume", "--redis", url, "--name", name])
        .args([
            "--interval-ms",
            "500",
            "--drain-ms",
            "200",
            "--codec",
            "json",
        ])
        .args(flags)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start a consumer");
    let printed = lines(child.stdout.take().unwrap());
    (Proc(child), printed)
}

/// Runs `mail_sender produce` of `name` at `url` with `--codec json` and
/// `flags` to its end.
fn produce_json(url: &str, name: &str, flags: &[&str]) -> std::process::Output {
    Command::new(example_binary())
        .args(["produce", "--redis", url, "--name", name, "--codec", "json"])
        .args(flags)
        .output()
        .expect("run the producer")
}

/// The fields of a printed `<kind> key=value …` line, if it is one.
fn fields<'a>(line: &'a str, kind: &str) -> Option<BTreeMap<&'a str, &'a str>> {
    let rest = line.strip_prefix(kind)?.strip_prefix(' ')?;
    Some(
        rest.split(' ')
            .filter_map(|kv| kv.split_once('='))
            .collect(),
    )
}

/// What `read` gives once it gives something, tried for at most 20 s.
fn eventually<T>(what: &str, mut read: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = read() {
            return value;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn with_track_a_task_reports_progress_returns_its_seq_and_stops_at_once_on_a_users_cancel() {
    let server = RedisServer::start();
    let url = server.url();
    let name = unique_name("track");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let admin = rt.block_on(Admin::connect(url.clone())).unwrap();

    // A first consumer, without --track, records the service with tracking
    // off; a later --track switches it on all the same. (It is stopped
    // once assigned: a consumer still starting may not have installed its
    // SIGTERM handler yet.)
    let (mut untracked, events) = json_consumer(&url, &name, &["--print-events"]);
    while !events
        .recv_timeout(Duration::from_secs(20))
        .expect("the first consumer assigned")
        .starts_with("standing kind=assigned ")
    {}
    let service = rt.block_on(admin.service(&name)).unwrap();
    assert!(!rt.block_on(service.tracking()).unwrap().is_on());
    let record = |handle: &TaskHandle| rt.block_on(service.task(handle)).unwrap();
    sigterm(&untracked.0);
    exited(&mut untracked, Duration::from_secs(10));
    let flags = ["--track", "--work-ms", "2000", "--print-tasks"];
    let (mut consumer, printed) = json_consumer(&url, &name, &flags);
    eventually("tracking switched on", || {
        rt.block_on(service.tracking())
            .unwrap()
            .is_on()
            .then_some(())
    });

    let produced = Command::new(example_binary())
        .args([
            "produce", "--redis", &url, "--name", &name, "--codec", "json",
        ])
        .args(["--count", "3", "--print-enqueued", "--print-ids"])
        .output()
        .expect("run the producer");
    assert!(produced.status.success(), "the producer failed");
    let stdout = String::from_utf8(produced.stdout).unwrap();
    let mut produced = stdout.lines();
    assert_eq!(produced.next(), Some("enqueued from=0 to=3"));
    let handles: BTreeMap<u64, TaskHandle> = produced
        .map(|line| {
            let task = fields(line, "task").unwrap_or_else(|| panic!("unexpected line: {line}"));
            (task["seq"].parse().unwrap(), task["id"].parse().unwrap())
        })
        .collect();
    assert_eq!(handles.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
    assert!(
        handles.values().all(|h| h.partition().is_some()),
        "{handles:?}"
    );

    // Each task starts at once (64 may run together): cancel seq 0's run.
    let mut started: BTreeMap<u64, u128> = BTreeMap::new();
    while started.len() < 3 {
        let line = printed
            .recv_timeout(Duration::from_secs(20))
            .expect("every task started");
        if let Some(start) = fields(&line, "start") {
            started.insert(start["seq"].parse().unwrap(), start["at"].parse().unwrap());
        }
    }
    let cancelled = &handles[&0];
    eventually("seq 0 running", || {
        let state = record(cancelled).and_then(|r| r.state);
        (state == Some(TaskState::Running)).then_some(())
    });
    let outcome = rt.block_on(service.cancel(cancelled)).unwrap();
    assert!(
        matches!(outcome, CancelOutcome::Requested { .. }),
        "{outcome:?}"
    );

    // Its progress is readable while a task runs.
    let running = eventually("seq 1's progress", || {
        record(&handles[&1]).filter(|r| r.progress.is_some())
    });
    assert_eq!(running.state, Some(TaskState::Running), "{running:?}");
    let progress: serde_json::Value = running.progress_as(&Json).unwrap().unwrap();
    assert!(
        matches!(progress.as_u64(), Some(25 | 50 | 75 | 100)),
        "{progress}"
    );

    // The cancelled run stops at once, long before its 2 s of work end.
    let line = loop {
        let line = printed
            .recv_timeout(Duration::from_secs(10))
            .expect("a `cancelled` line");
        if line.starts_with("cancelled ") {
            break line;
        }
    };
    let at = line
        .strip_prefix("cancelled seq=0 reason=user at=")
        .and_then(|at| at.parse::<u128>().ok())
        .unwrap_or_else(|| panic!("unexpected line: {line}"));
    assert!(
        at < started[&0] + 2_000_000,
        "stopped {} µs after its start",
        at - started[&0]
    );

    let patience = Duration::from_secs(20);
    match rt.block_on(service.wait(cancelled, patience)).unwrap() {
        Waited::Final(r) => assert_eq!(r.state, Some(TaskState::Cancelled), "{r:?}"),
        other => panic!("seq 0 did not end: {other:?}"),
    }
    for seq in [1, 2] {
        let done = match rt.block_on(service.wait(&handles[&seq], patience)).unwrap() {
            Waited::Final(r) => r,
            other => panic!("seq {seq} did not end: {other:?}"),
        };
        assert_eq!(done.state, Some(TaskState::Succeeded), "{done:?}");
        let result = done.result_as::<serde_json::Value, _>(&Json);
        assert_eq!(result.unwrap().unwrap(), serde_json::json!({ "seq": seq }));
        let progress = done.progress_as::<serde_json::Value, _>(&Json);
        assert_eq!(progress.unwrap().unwrap(), 100, "the last progress lands");
    }

    sigterm(&consumer.0);
    exited(&mut consumer, Duration::from_secs(10));
}

/// A cancel reaches a task after its owner was killed (SIGKILL): the next
/// owner takes it over (attempt 2), runs it, and stops it on the cancel;
/// the record ends `cancelled`, once (docs/design.md §14).
#[test]
fn a_cancel_reaches_a_task_taken_over_from_a_killed_owner() {
    let server = RedisServer::start();
    let url = server.url();
    let name = unique_name("track-kill");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let admin = rt.block_on(Admin::connect(url.clone())).unwrap();
    let flags = ["--track", "--work-ms", "60000", "--print-tasks"];
    let (first, printed) = json_consumer(&url, &name, &flags);
    let service = eventually("the service", || rt.block_on(admin.service(&name)).ok());
    eventually("tracking switched on", || {
        rt.block_on(service.tracking())
            .unwrap()
            .is_on()
            .then_some(())
    });
    let produced = Command::new(example_binary())
        .args([
            "produce", "--redis", &url, "--name", &name, "--codec", "json",
        ])
        .args(["--count", "1", "--print-ids"])
        .output()
        .expect("run the producer");
    assert!(produced.status.success(), "the producer failed");
    let stdout = String::from_utf8(produced.stdout).unwrap();
    let task = stdout
        .lines()
        .find_map(|l| fields(l, "task"))
        .expect("a task line");
    let handle: TaskHandle = task["id"].parse().unwrap();
    loop {
        let line = printed
            .recv_timeout(Duration::from_secs(20))
            .expect("seq 0 started");
        if fields(&line, "start").is_some() {
            break;
        }
    }
    let record = |handle: &TaskHandle| rt.block_on(service.task(handle)).unwrap();
    let killed = record(&handle)
        .and_then(|r| r.instance)
        .expect("running on the first");
    support::signal(first.0.id(), "KILL");
    drop(first);

    let (mut second, printed) = json_consumer(&url, &name, &flags);
    let running = eventually("taken over and running again", || {
        record(&handle)
            .filter(|r| r.state == Some(TaskState::Running) && r.instance.as_ref() != Some(&killed))
    });
    assert_eq!(
        running.attempt,
        Some(2),
        "it may have run on the killed owner"
    );
    let outcome = rt.block_on(service.cancel(&handle)).unwrap();
    assert!(
        matches!(outcome, CancelOutcome::Requested { .. }),
        "{outcome:?}"
    );
    let line = loop {
        let line = printed
            .recv_timeout(Duration::from_secs(20))
            .expect("a `cancelled` line");
        if line.starts_with("cancelled ") {
            break line;
        }
    };
    assert!(
        line.starts_with("cancelled seq=0 reason=user at="),
        "{line}"
    );
    match rt
        .block_on(service.wait(&handle, Duration::from_secs(20)))
        .unwrap()
    {
        Waited::Final(r) => assert_eq!(r.state, Some(TaskState::Cancelled), "{r:?}"),
        other => panic!("it did not end: {other:?}"),
    }
    sigterm(&second.0);
    exited(&mut second, Duration::from_secs(10));
}

/// `produce --keys K --first-seq N`: tasks numbered from N, task `seq`
/// keyed `k<seq % K>` (in that key's partition), all through the batch
/// path with options; the consumer's `start` and `handled` lines name the
/// key.
#[test]
fn keys_and_first_seq_place_the_tasks_and_the_lines_name_their_keys() {
    let server = RedisServer::start();
    let url = server.url();
    let name = unique_name("keys");
    let (mut consumer, printed) = json_consumer(&url, &name, &["--print-tasks"]);
    let plan = [
        "--count",
        "30",
        "--batch",
        "7",
        "--keys",
        "3",
        "--first-seq",
        "100",
    ];
    let printing = ["--print-enqueued", "--print-ids"];
    let produced = produce_json(&url, &name, &[&plan[..], &printing].concat());
    assert!(produced.status.success(), "the producer failed");
    let stdout = String::from_utf8(produced.stdout).unwrap();
    let enqueued: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("enqueued "))
        .collect();
    assert_eq!(enqueued.first(), Some(&"enqueued from=100 to=107"));
    assert_eq!(enqueued.last(), Some(&"enqueued from=128 to=130"));
    // Each task's handle names its key's partition.
    let partitions = 64;
    for task in stdout.lines().filter_map(|l| fields(l, "task")) {
        let seq: u64 = task["seq"].parse().unwrap();
        let handle: TaskHandle = task["id"].parse().unwrap();
        let key = format!("k{}", seq % 3);
        assert_eq!(
            handle.partition(),
            Some(peerq::partition_of(key.as_bytes(), partitions))
        );
    }
    let mut handled = BTreeMap::new();
    while handled.len() < 30 {
        let line = printed
            .recv_timeout(Duration::from_secs(20))
            .expect("every task handled");
        for kind in ["start", "handled"] {
            if let Some(f) = fields(&line, kind) {
                let seq: u64 = f["seq"].parse().unwrap();
                assert_eq!(
                    f.get("key").copied(),
                    Some(format!("k{}", seq % 3).as_str()),
                    "{line}"
                );
                if kind == "handled" {
                    handled.insert(seq, ());
                }
            }
        }
    }
    assert_eq!(
        handled.keys().copied().collect::<Vec<_>>(),
        (100..130).collect::<Vec<_>>()
    );
    sigterm(&consumer.0);
    exited(&mut consumer, Duration::from_secs(10));
}

/// A SIGTERM that comes while a consumer is still starting (its first
/// attempt underway: here its groups' creation held by a proxy) stops it
/// gracefully once that attempt ends, rather than killing it: the signal's
/// handler is installed as `run()` starts, not when the stop signal is
/// first polled (which, during the start, is only between attempts).
#[test]
fn a_sigterm_while_a_consumer_starts_stops_it_gracefully() {
    let server = RedisServer::start();
    let proxy = support::Proxy::start(server.port());
    let name = unique_name("starting");
    proxy.hold_on(b"XGROUP");
    let (mut consumer, _printed) = json_consumer(&proxy.url(), &name, &[]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while proxy.held() == 0 {
        assert!(
            Instant::now() < deadline,
            "the consumer never created its groups"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    sigterm(&consumer.0);
    // Held a moment longer: the signal comes well within the attempt.
    std::thread::sleep(Duration::from_millis(200));
    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = consumer.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the consumer did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        status.success(),
        "stopped by the signal's default action: {status}"
    );
}
