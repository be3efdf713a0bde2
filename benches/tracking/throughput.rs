//! Enqueue and consume with tracking off and on (the first two parts of
//! the bench): `REPEATS` repeats, off and on interleaved, each on a service
//! of its own, and what each cost Redis per task ([`cost`](crate::cost)).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis::aio::MultiplexedConnection;
use peerq::admin::{Admin, Service};
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::tracking::Tracking;
use peerq::{Consumer, DEFAULT_PARTITIONS, HandlerError, TaskId};
use support::{RedisServer, unique_name};
use tokio_util::sync::CancellationToken;

use crate::cost::{self, Reading, Records, Spent};
use crate::meter::{listed, median};
use crate::{Done, Job, job, pending};

/// Tasks per `enqueue_batch`.
const BATCH: usize = 1000;
/// Entries per read of the consumer (the throughput bench's).
const READ_COUNT: usize = 100;
/// Runs of each enqueue and consume; the median counts.
pub(crate) const REPEATS: usize = 3;
/// How often the bench asks whether the last acks have landed.
const ACK_POLL: Duration = Duration::from_millis(10);
/// How long a profiler has to attach before the profiled consume.
const PROFILER_READY: Duration = Duration::from_secs(3);

/// The three consume runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Off,
    On,
    /// On, the handler returning [`Done`].
    OnResult,
}

/// A timed run: its rate and what it cost, for how many tasks.
struct Run {
    rate: f64,
    spent: Spent,
}

/// One repeat's runs.
pub(crate) struct Repeat {
    batch_off: Run,
    batch_on: Run,
    single_off: Run,
    single_on: Run,
    consume_off: Run,
    consume_on: Run,
    consume_result: Run,
    /// The bytes of the records, read in the first repeat.
    pub(crate) records: Option<Records>,
}

/// One repeat: each enqueue off then on, then each consume off, on, and
/// on with a result, over the queues the enqueues left (the last one's
/// queue prefilled untimed). `sample`: also read the bytes of the records
/// the tracked runs wrote.
pub(crate) async fn repeat(
    server: &RedisServer,
    admin: &Admin,
    conn: &mut MultiplexedConnection,
    tasks: u64,
    single: u64,
    sample: bool,
) -> Repeat {
    let (batch_off, off, _) = enqueue_batch(server, admin, conn, Tracking::off(), tasks).await;
    let (batch_on, on, _) = enqueue_batch(server, admin, conn, Tracking::on(), tasks).await;
    let waiting = match sample {
        true => Some(cost::records_of(conn, on.name()).await),
        false => None,
    };
    let (_, with_result, _) = enqueue_batch(server, admin, conn, Tracking::on(), tasks).await;
    let single_off = enqueue_single(server, admin, conn, Tracking::off(), single).await;
    let single_on = enqueue_single(server, admin, conn, Tracking::on(), single).await;
    let consume_off = consume(server, conn, &off, tasks, Kind::Off).await;
    let consume_on = consume(server, conn, &on, tasks, Kind::On).await;
    let consume_result = consume(server, conn, &with_result, tasks, Kind::OnResult).await;
    let records = match waiting {
        Some(waiting) => {
            let (succeeded, member, kept) = cost::finished(conn, on.name()).await;
            let (with_result, _, _) = cost::finished(conn, with_result.name()).await;
            Some(Records {
                waiting,
                succeeded,
                with_result,
                member,
                kept,
            })
        }
        None => None,
    };
    Repeat {
        batch_off,
        batch_on,
        single_off,
        single_on,
        consume_off,
        consume_on,
        consume_result,
        records,
    }
}

/// One consume alone, tracked (`on`) or not, for a profiler of Redis or
/// of this process: the queue is prefilled, then redis-server's pid and
/// this process's are printed on stderr, and the consume starts
/// [`PROFILER_READY`] later, so that a profiler started on that line
/// (`perf record -p <pid>`) sees both idle until the consume.
pub(crate) async fn profiled(
    server: &RedisServer,
    admin: &Admin,
    conn: &mut MultiplexedConnection,
    tasks: u64,
    on: bool,
) {
    let (tracking, kind) = match on {
        true => (Tracking::on(), Kind::On),
        false => (Tracking::off(), Kind::Off),
    };
    let (_, service, _) = enqueue_batch(server, admin, conn, tracking, tasks).await;
    eprintln!(
        "redis-server pid {}, bench pid {}",
        server.pid(),
        std::process::id()
    );
    tokio::time::sleep(PROFILER_READY).await;
    let run = consume(server, conn, &service, tasks, kind).await;
    let what = if on { "tracked" } else { "untracked" };
    println!("{what} consume: {:.0} tasks/s", run.rate);
    cost::print_spent(&[(what, &run.spent)]);
}

/// A new service with `tracking` and a producer of it: the producer writes
/// the service's `{N}:meta` (which `Admin::service` needs), and reads
/// `{N}:tracking` on its first enqueue, after it is set here.
async fn tracked_service(
    server: &RedisServer,
    admin: &Admin,
    tracking: Tracking,
) -> (Producer, Service) {
    let name = unique_name(if tracking.is_on() { "on" } else { "off" });
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let service = admin.service(&name).await.unwrap();
    service.set_tracking(tracking).await.unwrap();
    (producer, service)
}

/// `tasks` tasks in batches of [`BATCH`] into a new service with
/// `tracking`; its run, the service (its queue stays, for a consume run)
/// and the ids of the last batch.
async fn enqueue_batch(
    server: &RedisServer,
    admin: &Admin,
    conn: &mut MultiplexedConnection,
    tracking: Tracking,
    tasks: u64,
) -> (Run, Service, Vec<TaskId>) {
    let (producer, service) = tracked_service(server, admin, tracking).await;
    let jobs: Vec<Job> = (0..tasks).map(job).collect();
    let before = Reading::take(conn).await;
    let started = Instant::now();
    let mut last = Vec::new();
    for chunk in jobs.chunks(BATCH) {
        last = producer.enqueue_batch(chunk).await.unwrap();
    }
    let elapsed = started.elapsed();
    let spent = Reading::take(conn).await.since(&before, tasks);
    let rate = tasks as f64 / elapsed.as_secs_f64();
    (Run { rate, spent }, service, last)
}

/// `tasks` tasks, one `enqueue` after the other, into a new service with
/// `tracking` (never consumed).
async fn enqueue_single(
    server: &RedisServer,
    admin: &Admin,
    conn: &mut MultiplexedConnection,
    tracking: Tracking,
    tasks: u64,
) -> Run {
    let (producer, _) = tracked_service(server, admin, tracking).await;
    let jobs: Vec<Job> = (0..tasks).map(job).collect();
    let before = Reading::take(conn).await;
    let started = Instant::now();
    for job in &jobs {
        producer.enqueue(job).await.unwrap();
    }
    let elapsed = started.elapsed();
    let spent = Reading::take(conn).await.since(&before, tasks);
    Run {
        rate: tasks as f64 / elapsed.as_secs_f64(),
        spent,
    }
}

/// One instance over `service`'s prefilled queue of `tasks`, with a no-op
/// handler (returning [`Done`] for [`Kind::OnResult`]), from the first task
/// handled (the first assignment takes 1-2 intervals, which is not
/// throughput) to the last one acked. Its cost is read from the first task
/// to the last ack, for the tasks within.
async fn consume(
    server: &RedisServer,
    conn: &mut MultiplexedConnection,
    service: &Service,
    tasks: u64,
    kind: Kind,
) -> Run {
    let done = Arc::new(AtomicU64::new(0));
    let first: Arc<Mutex<Option<Instant>>> = Arc::default();
    let stop = CancellationToken::new();
    let tracking = match kind {
        Kind::Off => Tracking::off(),
        Kind::On | Kind::OnResult => Tracking::on(),
    };
    let builder = Consumer::builder()
        .name(service.name())
        .redis(server.url())
        .concurrency(256)
        .batch(READ_COUNT)
        .tracking(tracking);
    let signal = stop.clone().cancelled_owned();
    let run = match kind {
        Kind::Off | Kind::On => {
            let consumer = builder.service(counting(&done, &first, |_| ()));
            tokio::spawn(consumer.run_until(signal))
        }
        Kind::OnResult => {
            let consumer = builder.service(counting(&done, &first, |seq| Done { seq }));
            tokio::spawn(consumer.run_until(signal))
        }
    };
    let until = |n: u64| {
        let done = done.clone();
        async move {
            while done.load(Ordering::Relaxed) < n {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    until(1).await;
    let handled_before = done.load(Ordering::Relaxed);
    let before = Reading::take(conn).await;
    until(tasks).await;
    let started = first.lock().unwrap().expect("a task was handled");
    let mut polls = 0;
    while pending(conn, service.name()).await > 0 {
        polls += 1;
        tokio::time::sleep(ACK_POLL).await;
    }
    let acked = started.elapsed();
    let mut spent = Reading::take(conn)
        .await
        .since(&before, tasks - handled_before);
    // The polls' own commands are the bench's, not the consumer's.
    spent
        .cost
        .take_out("xpending", (polls + 1) * u64::from(DEFAULT_PARTITIONS));
    stop.cancel();
    run.await.unwrap().unwrap();
    Run {
        rate: tasks as f64 / acked.as_secs_f64(),
        spent,
    }
}

/// A handler that counts the tasks it ran, notes when it ran the first,
/// and returns `result(seq)`.
fn counting<R>(
    done: &Arc<AtomicU64>,
    first: &Arc<Mutex<Option<Instant>>>,
    result: fn(u64) -> R,
) -> impl tower::Service<
    Task<Job>,
    Response = R,
    Error = HandlerError,
    Future = impl Future<Output = Result<R, HandlerError>> + Send,
> + Clone
+ Send
+ Sync
+ 'static
where
    R: Send + 'static,
{
    let (done, first) = (done.clone(), first.clone());
    tower::service_fn(move |task: Task<Job>| {
        let (done, first) = (done.clone(), first.clone());
        async move {
            first.lock().unwrap().get_or_insert_with(Instant::now);
            done.fetch_add(1, Ordering::Relaxed);
            Ok::<R, HandlerError>(result(task.payload.seq))
        }
    })
}

/// One of a repeat's runs.
type Pick = fn(&Repeat) -> &Run;

/// The rates of off and on, each run's ratio and the medians' ratio.
pub(crate) fn print(repeats: &[Repeat], tasks: u64, single: u64) {
    let rates = |run: Pick| repeats.iter().map(|r| run(r).rate).collect::<Vec<_>>();
    println!();
    println!(
        "| tracking off vs on (runs in order; medians) | off, tasks/s | on, tasks/s | on / off, each run | on / off, medians |"
    );
    println!("|---|---|---|---|---|");
    let rows: [(String, Pick, Pick); 4] = [
        (
            format!("enqueue_batch, batches of {BATCH} ({tasks} tasks)"),
            |r| &r.batch_off,
            |r| &r.batch_on,
        ),
        (
            format!("enqueue, one at a time ({single} tasks)"),
            |r| &r.single_off,
            |r| &r.single_on,
        ),
        (
            format!(
                "consume to the last ack, 1 instance, no-op handler returning `()` ({tasks} prefilled)"
            ),
            |r| &r.consume_off,
            |r| &r.consume_on,
        ),
        (
            "consume, the handler returning a small result (`Done { seq }`, on) against `()` (off)"
                .to_owned(),
            |r| &r.consume_off,
            |r| &r.consume_result,
        ),
    ];
    for (what, off, on) in rows {
        let (off, on) = (rates(off), rates(on));
        let each: Vec<String> = off
            .iter()
            .zip(&on)
            .map(|(off, on)| format!("{:.2}", on / off))
            .collect();
        println!(
            "| {what} | {} ({:.0}) | {} ({:.0}) | {} | **{:.2}** |",
            listed(&off),
            median(&off),
            listed(&on),
            median(&on),
            each.join(" / "),
            median(&on) / median(&off)
        );
    }
    println!();
    cost::print_spent(&[
        ("enqueue_batch off", &repeats[0].batch_off.spent),
        ("enqueue_batch on", &repeats[0].batch_on.spent),
        ("enqueue off", &repeats[0].single_off.spent),
        ("enqueue on", &repeats[0].single_on.spent),
    ]);
    cost::print_spent(&[
        ("consume off", &repeats[0].consume_off.spent),
        ("consume on", &repeats[0].consume_on.spent),
        ("consume on, result", &repeats[0].consume_result.spent),
    ]);
}
