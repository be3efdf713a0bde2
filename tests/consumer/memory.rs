//! Bounded memory with a large backlog: a consumer over 1,000,000 queued
//! tasks with a slow handler holds about `concurrency` tasks plus one read
//! per owned partition in memory, never the backlog; and one whose acks
//! cannot land stops reading at its bound of finished tasks waiting for
//! their acks.
//!
//! The consumer is the example binary (`mail_sender consume`, 64
//! partitions, concurrency 64, reads of at most 64 entries, each task
//! 50 ms), a child process, so its memory is its own: the test reads its
//! `/proc/<pid>/status` (Linux only; elsewhere the test says so and
//! passes). Its peak RSS over the backlog is compared with its peak RSS on
//! an empty queue.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, AsyncCommands};
use peerq::producer::Producer;
use peerq::{Bincode, Codec};
use serde::{Deserialize, Serialize};
use support::{Proc, RedisServer, unique_name};

const TASKS: u64 = 1_000_000;
/// The example's defaults.
const PARTITIONS: u32 = 64;
/// Tasks enqueued through the producer, to time it; the rest is written
/// by a script in the same entry format, as the producer is too slow in a
/// debug build to enqueue a million tasks within the test's time.
const THROUGH_PRODUCER: u64 = 20_000;
const WORK_MS: u64 = 50;
/// How long the consumer works through the backlog while it is sampled.
const RUN: Duration = Duration::from_secs(10);
/// Growth of the peak RSS over the idle consumer's peak that the test
/// allows. Measured (debug build): idle ~16 MiB, over the backlog ~20-26
/// MiB (growth 4-10 MiB). With reads of 10,000 entries whatever the room
/// (changed in the worker for a trial run), the consumer read ~80,000
/// entries in the same time, peaked at 265 MiB (growth 249 MiB) and the
/// test failed; reading the whole backlog would take several times that.
const BOUND: u64 = 64 << 20;

/// The example's task (`mail_sender`'s `Mail`), encoded the same way.
#[derive(Serialize, Deserialize)]
struct Mail {
    seq: u64,
    to: String,
}

/// Adds `ARGV[1]` entries to `KEYS[1]` in the entry format the README
/// documents (`id`, `attempt`, `enqueued_at`, `codec`, `payload`); ids are
/// `ARGV[2]..i`, so unique. (Entries are spread over the partitions
/// evenly, not by the hash of their id: the consumer runs whatever is in
/// the partitions it owns.)
const FILL: &str = r"
local n = tonumber(ARGV[1])
for i = 1, n do
  redis.call('XADD', KEYS[1], '*', 'id', ARGV[2] .. i, 'attempt', '1',
    'enqueued_at', ARGV[3], 'codec', 'bincode', 'payload', ARGV[4])
end
return n
";

/// Adds `total` entries of `mail` to service `name`'s first `partitions`
/// partitions, spread evenly, by [`FILL`], one call per partition.
async fn fill(server: &RedisServer, name: &str, partitions: u32, total: u64, mail: &Mail) {
    let payload = Bincode.encode(mail).unwrap();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    let fill = redis::Script::new(FILL);
    // A connection of its own: a call fills ~15,000 entries, longer than
    // the pool's response timeout on a loaded machine.
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(60)));
    let mut filler = server
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap();
    for p in 0..u64::from(partitions) {
        let n = total / u64::from(partitions) + u64::from(p < total % u64::from(partitions));
        let _: u64 = fill
            .key(format!("{{{name}/{p}}}:stream"))
            .arg(n)
            .arg(format!("fill-{p}-"))
            .arg(&now_ms)
            .arg(&payload)
            .invoke_async(&mut filler)
            .await
            .unwrap();
    }
}

/// A `VmRSS`/`VmHWM` line of `/proc/<pid>/status`, in bytes.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// What a consumer child printed: partitions started, tasks handled.
#[derive(Debug, Default)]
struct Printed {
    started: u32,
    handled: u64,
}

/// A consumer child process on `name`, and what it prints
/// (`--print-events`, `--print-tasks`).
fn consumer(server: &RedisServer, name: &str) -> (Proc, Arc<Mutex<Printed>>) {
    let mut child = Command::new(support::example_binary("mail_sender"))
        .args(["consume", "--redis", &server.url(), "--name", name])
        .args(["--work-ms", &WORK_MS.to_string()])
        .args(["--print-events", "--print-tasks"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the consumer");
    let printed = Arc::new(Mutex::new(Printed::default()));
    let out = child.stdout.take().unwrap();
    std::thread::spawn({
        let printed = printed.clone();
        move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut printed = printed.lock().unwrap();
                if line.starts_with("handled ") {
                    printed.handled += 1;
                } else if line.contains("change=started") {
                    printed.started += 1;
                }
            }
        }
    });
    (Proc(child), printed)
}

/// One consumer run: its peak RSS (the kernel's high-water mark, `VmHWM`),
/// the max of the samples, and the tasks it handled.
#[derive(Debug)]
struct Run {
    hwm: u64,
    sampled: u64,
    handled: u64,
}

/// Runs a consumer on `name` until all its partitions have started and
/// then for `run`, sampling its RSS every 100 ms.
fn measure(server: &RedisServer, name: &str, run: Duration) -> Run {
    let (mut proc, printed) = consumer(server, name);
    let pid = proc.0.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    while printed.lock().unwrap().started < PARTITIONS {
        assert!(
            Instant::now() < deadline,
            "the consumer did not start its partitions"
        );
        assert!(proc.0.try_wait().unwrap().is_none(), "the consumer exited");
        std::thread::sleep(Duration::from_millis(50));
    }
    let end = Instant::now() + run;
    let mut sampled = 0;
    while Instant::now() < end {
        sampled = sampled.max(status_bytes(pid, "VmRSS:").expect("VmRSS"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let hwm = status_bytes(pid, "VmHWM:").expect("VmHWM");
    assert!(proc.0.try_wait().unwrap().is_none(), "the consumer exited");
    support::signal(pid, "KILL");
    let _ = proc.0.wait();
    let handled = printed.lock().unwrap().handled;
    Run {
        hwm,
        sampled,
        handled,
    }
}

/// Entries delivered and not acked, over the first `partitions`
/// partitions.
async fn pending(conn: &mut deadpool_redis::Connection, name: &str, partitions: u32) -> u64 {
    let mut total = 0;
    for p in 0..partitions {
        let reply: redis::streams::StreamPendingReply = conn
            .xpending(format!("{{{name}/{p}}}:stream"), "peerq")
            .await
            .unwrap();
        total += reply.count() as u64;
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_over_a_million_task_backlog_holds_only_what_it_runs() {
    if !std::path::Path::new("/proc/self/status").exists() {
        eprintln!("no /proc: RSS cannot be read here; skipped");
        return;
    }
    let server = RedisServer::start();
    let name = unique_name("memory");
    let mut conn = server.pool().get().await.unwrap();

    // The producer, timed.
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let mail = |seq| Mail {
        seq,
        to: format!("user{seq}@example.com"),
    };
    let started = Instant::now();
    for from in (0..THROUGH_PRODUCER).step_by(1000) {
        let batch: Vec<Mail> = (from..from + 1000).map(mail).collect();
        producer.enqueue_batch(&batch).await.unwrap();
    }
    let producer_time = started.elapsed();
    // The rest by script, one call per partition.
    let started = Instant::now();
    let rest = TASKS - THROUGH_PRODUCER;
    fill(&server, &name, PARTITIONS, rest, &mail(0)).await;
    let script_time = started.elapsed();
    let mut queued = 0;
    for p in 0..PARTITIONS {
        let len: u64 = redis::cmd("XLEN")
            .arg(format!("{{{name}/{p}}}:stream"))
            .query_async(&mut conn)
            .await
            .unwrap();
        queued += len;
    }
    assert_eq!(queued, TASKS);
    let per_sec = THROUGH_PRODUCER as f64 / producer_time.as_secs_f64();
    eprintln!(
        "prefill: {THROUGH_PRODUCER} tasks through Producer::enqueue_batch in {:.2}s \
         ({per_sec:.0}/s: {:.0}s for a million), {rest} by script in {:.2}s",
        producer_time.as_secs_f64(),
        TASKS as f64 / per_sec,
        script_time.as_secs_f64()
    );

    // The same consumer on an empty queue, for its baseline.
    let idle = tokio::task::block_in_place(|| {
        measure(&server, &unique_name("memory-idle"), Duration::from_secs(3))
    });
    let busy = tokio::task::block_in_place(|| measure(&server, &name, RUN));
    let growth = busy.hwm.saturating_sub(idle.hwm);
    eprintln!(
        "idle consumer: peak RSS {} (sampled max {}); over the backlog for {}s: peak RSS {} \
         (sampled max {}), growth {}",
        mib(idle.hwm),
        mib(idle.sampled),
        RUN.as_secs(),
        mib(busy.hwm),
        mib(busy.sampled),
        mib(growth),
    );
    // Read: handled, or still pending (fetched, running or not acked).
    let read = busy.handled + pending(&mut conn, &name, PARTITIONS).await;
    eprintln!(
        "{} tasks handled, about {read} read, {} left unread",
        busy.handled,
        TASKS - read
    );
    assert!(
        growth < BOUND,
        "peak RSS {} grew by {} over the idle consumer's {}",
        mib(busy.hwm),
        mib(growth),
        mib(idle.hwm)
    );
    // It really worked through the backlog (64 × 20 tasks/s at best) …
    assert!(busy.handled >= 1000, "only {} tasks handled", busy.handled);
    // … and read only about what it could run, not the backlog.
    assert!(read < 100_000, "{read} entries read");
}

/// Finished tasks whose acks have not landed that an instance keeps, at
/// most: `Room::unacked_bound` (`IN_FLIGHT * MAX_BATCH` of the acker),
/// the larger of that and `concurrency`.
const UNACKED: u64 = 4 * 4096;

/// Waits until `ran()` reaches the bound of unacked tasks, then checks that
/// for 2 s nothing more is read or run, and that no more ran than the
/// bound and the `concurrency` tasks holding permits; returns the entries
/// read. `why` says why the acks do not land.
async fn assert_stops_at_the_bound(
    server: &RedisServer,
    name: &str,
    partitions: u32,
    concurrency: usize,
    total: u64,
    why: &str,
    ran: impl Fn() -> u64,
) -> u64 {
    support::wait_until(
        Duration::from_secs(60),
        "the bound of unacked tasks",
        || ran() >= UNACKED,
    )
    .await;
    let mut conn = server.pool().get().await.unwrap();
    let read = pending(&mut conn, name, partitions).await;
    let reached = ran();
    // Nothing more for 2 s: no new read, no new run (no ack is ever given
    // up, and these do not land).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let read_after = pending(&mut conn, name, partitions).await;
    println!(
        "acks {why}: ran {reached} tasks and read {read} entries of {total}; \
         2 s later {} and {read_after}",
        ran()
    );
    assert_eq!(ran(), reached, "tasks ran after the bound");
    assert_eq!(read_after, read, "entries were read after the bound");
    assert!(
        reached <= UNACKED + concurrency as u64,
        "{reached} tasks ran: more than the {UNACKED} waiting for acks and the {concurrency} \
         holding permits"
    );
    read
}

/// Reads stop when acks stop landing (docs/design.md §3): a task takes its
/// ack slot before it gives back its running permit, so once the finished
/// tasks waiting for their acks fill their bound, the handlers' permits
/// are held, and the reads stop, however much the partitions hold.
///
/// The instance reaches Redis through a proxy that holds every connection
/// that sends the `fenced_ack` script's hash, from that request on: its
/// acks never land (each try ends at the response timeout, and the next
/// one, on a new connection, is held again; the acker never gives an ack
/// up), while its reads on the connections that carry
/// no ack go on, and so do its rounds. 8 partitions hold 40,000 tasks:
/// 30,000 or more of them on partitions whose reads are not held. Then the
/// acks land (the proxy lets go), and the instance reads and runs the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_acks_cannot_land_stops_reading_at_its_bound() {
    const P: u32 = 8;
    const CONCURRENCY: usize = 4;
    const TOTAL: u64 = 40_000;
    support::init_tracing();
    let server = RedisServer::start();
    let name = unique_name("acks-stopped");
    let mail = Mail {
        seq: 0,
        to: "user@example.com".into(),
    };
    fill(&server, &name, P, TOTAL, &mail).await;
    let proxy = support::Proxy::start(server.port());
    // The ack script as the consumer sends it: the tracking functions
    // first (`tracked_script!`).
    let fenced_ack = redis::Script::new(concat!(
        include_str!("../../src/scripts/track.lua"),
        include_str!("../../src/scripts/unique.lua"),
        include_str!("../../src/scripts/members.lua"),
        include_str!("../../src/scripts/sealed.lua"),
        include_str!("../../src/scripts/fenced_ack.lua")
    ));
    proxy.hold_on(fenced_ack.get_hash().as_bytes());
    let runs = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let handler = {
        let runs = runs.clone();
        tower::service_fn(move |_: peerq::handler::Task<Mail>| {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Ok::<(), peerq::HandlerError>(()) }
        })
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let consumer = tokio::spawn(
        peerq::Consumer::builder()
            .name(&name)
            .redis(proxy.url())
            .partitions(P)
            .concurrency(CONCURRENCY)
            .service(handler)
            .run_until(stop.clone().cancelled_owned()),
    );
    let ran = || runs.load(std::sync::atomic::Ordering::SeqCst);
    let read = assert_stops_at_the_bound(&server, &name, P, CONCURRENCY, TOTAL, "held", ran).await;
    assert!(proxy.held() > 0, "no ack was held");
    assert!(read < TOTAL / 2, "{read} of {TOTAL} entries read");
    // The acks land: it reads and runs the rest.
    proxy.restore();
    support::wait_until(
        Duration::from_secs(120),
        "every task, once acks land",
        || ran() >= TOTAL,
    )
    .await;
    stop.cancel();
    consumer.await.unwrap().unwrap();
}

/// The same bound when Redis refuses the acks outright, not just slowly:
/// the consumer's user loses `XACK` (an operator's ACL change; a full
/// memory's `OOM` is alike), so every ack script fails with `NOPERM`. The
/// acker keeps such an ack, and its slot, and sends it again until it
/// lands: reads stop at the bound, and once `XACK` is granted again the
/// acks land and every task has run exactly once. (An ack given up on a
/// refusal freed its slot: the instance read and ran all 40,000 tasks with
/// none acked, and ran them again once acks could land; issue 36.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_whose_acks_redis_refuses_stops_reading_and_runs_each_task_once() {
    const P: u32 = 8;
    const CONCURRENCY: usize = 4;
    const TOTAL: u64 = 40_000;
    const USER: &str = "acker";
    const PASSWORD: &str = "acker-pw";
    support::init_tracing();
    let server = RedisServer::start();
    let name = unique_name("acks-refused");
    let mail = Mail {
        seq: 0,
        to: "user@example.com".into(),
    };
    fill(&server, &name, P, TOTAL, &mail).await;
    let mut admin = server.connection().await;
    let acl = |rule: &'static str| {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg(USER).arg(rule);
        cmd
    };
    for rule in ["on", ">acker-pw", "~*", "&*", "+@all", "-xack"] {
        let () = acl(rule).query_async(&mut admin).await.unwrap();
    }
    let runs: Arc<Mutex<std::collections::HashMap<String, u32>>> = Arc::default();
    let handler = {
        let runs = runs.clone();
        tower::service_fn(move |task: peerq::handler::Task<Mail>| {
            *runs
                .lock()
                .unwrap()
                .entry(task.cx.task_id().to_string())
                .or_default() += 1;
            async { Ok::<(), peerq::HandlerError>(()) }
        })
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let consumer = tokio::spawn(
        peerq::Consumer::builder()
            .name(&name)
            .redis(server.url_as(USER, PASSWORD))
            .partitions(P)
            .concurrency(CONCURRENCY)
            // Claims of what stays pending 3 s, every second: a task whose
            // ack was given up would soon run again.
            .claim_idle(Duration::from_secs(3))
            .service(handler)
            .run_until(stop.clone().cancelled_owned()),
    );
    let ran = || -> u64 { runs.lock().unwrap().values().map(|n| u64::from(*n)).sum() };
    assert_stops_at_the_bound(&server, &name, P, CONCURRENCY, TOTAL, "refused", ran).await;
    // The operator grants XACK again: the acks land, and the rest runs.
    let () = acl("+xack").query_async(&mut admin).await.unwrap();
    support::wait_until(
        Duration::from_secs(120),
        "every task, once acks land",
        || runs.lock().unwrap().len() as u64 >= TOTAL,
    )
    .await;
    // Time for a second run of any task, if one were coming (claims run
    // every second).
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.cancel();
    consumer.await.unwrap().unwrap();
    let runs = runs.lock().unwrap();
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(
        twice.is_empty(),
        "tasks ran more than once: {twice:?} (and maybe more)"
    );
    assert_eq!(runs.len() as u64, TOTAL);
}
