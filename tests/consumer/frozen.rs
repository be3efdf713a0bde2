//! An instance frozen past its lease (a GC pause, SIGSTOP, a VM stall),
//! against a real redis-server: its open blocking reads end with its lease,
//! so nothing enqueued after the next owner took over is delivered to it;
//! once it resumes, `TaskContext::still_owned` says no at once; and a task
//! that waited for the lease through a stall of the instance's loop does
//! not start under the ownership the next assignment stops.
//!
//! The frozen instance runs on a runtime of its own thread, which the test
//! blocks: the process goes on, only that instance stands still, as under a
//! freeze.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{Proxy, RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

const P: u32 = 4;
const MS: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Runs of each seq: (instance label, when).
type Runs = Arc<Mutex<BTreeMap<u64, Vec<(&'static str, Instant)>>>>;

fn service(
    label: &'static str,
    runs: &Runs,
) -> impl tower::Service<
    Task<Job>,
    Response = (),
    Error = HandlerError,
    Future = impl Future<Output = Result<(), HandlerError>> + Send,
> + Clone
+ Send
+ Sync
+ 'static {
    let runs = runs.clone();
    tower::service_fn(move |task: Task<Job>| {
        let runs = runs.clone();
        async move {
            runs.lock()
                .unwrap()
                .entry(task.payload.seq)
                .or_default()
                .push((label, Instant::now()));
            Ok::<(), HandlerError>(())
        }
    })
}

fn builder(url: &str, name: &str) -> peerq::consumer::ConsumerBuilder<(), (), peerq::Bincode> {
    support::init_tracing();
    Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .interval(Duration::from_secs(1))
        .drain_timeout(300 * MS)
}

/// A consumer on a current-thread runtime of its own thread, which
/// [`Frozen::freeze`] blocks.
struct Frozen {
    handle: tokio::runtime::Handle,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<peerq::Result<()>>>,
}

impl Frozen {
    fn start<F>(run: impl FnOnce(CancellationToken) -> F + Send + 'static) -> Frozen
    where
        F: Future<Output = peerq::Result<()>>,
    {
        let stop = CancellationToken::new();
        let (tx, rx) = std::sync::mpsc::channel();
        let signal = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            tx.send(rt.handle().clone()).unwrap();
            rt.block_on(run(signal))
        });
        Frozen {
            handle: rx.recv().unwrap(),
            stop,
            thread: Some(thread),
        }
    }

    /// Blocks the instance's only thread for `d`, from now.
    fn freeze(&self, d: Duration) {
        let (tx, rx) = std::sync::mpsc::channel();
        self.handle.spawn(async move {
            tx.send(()).unwrap();
            std::thread::sleep(d);
        });
        rx.recv().unwrap();
    }

    async fn stop(mut self) {
        self.stop.cancel();
        let thread = self.thread.take().unwrap();
        tokio::task::spawn_blocking(move || thread.join().unwrap())
            .await
            .unwrap()
            .unwrap();
    }
}

/// The ids pending under `consumer` name prefix in any partition of `name`.
async fn pending_under(server: &RedisServer, name: &str) -> BTreeMap<String, usize> {
    let mut conn = server.pool().get().await.unwrap();
    let mut by_consumer = BTreeMap::new();
    for p in 0..P {
        let stream = format!("{{{name}/{p}}}:stream");
        let reply: redis::streams::StreamPendingReply = redis::cmd("XPENDING")
            .arg(&stream)
            .arg("peerq")
            .query_async(&mut *conn)
            .await
            .unwrap();
        if let redis::streams::StreamPendingReply::Data(data) = reply {
            for c in data.consumers {
                *by_consumer.entry(c.name).or_default() += c.pending;
            }
        }
    }
    by_consumer
}

/// Waits until `partitions` partitions have started, at most 10 s apart
/// (`what` says what is awaited).
async fn until_started(
    events: &mut tokio::sync::broadcast::Receiver<peerq::consumer::PartitionEvent>,
    partitions: u32,
    what: &str,
) {
    let mut started = std::collections::BTreeSet::new();
    while started.len() < partitions as usize {
        let event = tokio::time::timeout(Duration::from_secs(10), events.recv())
            .await
            .expect(what)
            .unwrap();
        if matches!(
            event.change,
            peerq::consumer::PartitionChange::Started { .. }
        ) {
            started.insert(event.partition);
        }
    }
}

/// A producer for the service `name` on `url`, with the tests' partitions.
async fn producer(url: &str, name: &str) -> Producer {
    Producer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_owners_open_read_takes_nothing_enqueued_after_the_takeover() {
    let server = RedisServer::start();
    let name = unique_name("frozen-read");
    let runs: Runs = Arc::default();
    // Reads that may wait 20 s: far past the lease (1.5 s at I = 1 s).
    let a = builder(&server.url(), &name)
        .block(Duration::from_secs(20))
        .service(service("a", &runs));
    let a = Frozen::start(move |stop| a.run_until(stop.cancelled_owned()));
    let producer = producer(&server.url(), &name).await;
    producer.enqueue(&Job { seq: 0 }).await.unwrap();
    wait_until(Duration::from_secs(15), "a runs the first task", || {
        runs.lock().unwrap().contains_key(&0)
    })
    .await;
    // a's reads now wait on every partition. It freezes with them open.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let frozen_for = Duration::from_secs(9);
    let frozen_at = Instant::now();
    a.freeze(frozen_for);
    let b = builder(&server.url(), &name)
        .block(Duration::from_secs(20))
        .service(service("b", &runs));
    let b_events = b.partition_events();
    let stop_b = CancellationToken::new();
    let b = tokio::spawn(b.run_until(stop_b.clone().cancelled_owned()));
    // b takes every partition over at the handover deadline (a writes no
    // marks while frozen).
    let mut b_events = b_events;
    until_started(&mut b_events, P, "b takes every partition over").await;
    let took_over = frozen_at.elapsed();
    // Entries to every partition, while a is still frozen.
    for seq in 1..=16u64 {
        producer
            .enqueue_with(Job { seq }, Options::new().key(format!("k{seq}")))
            .await
            .unwrap();
    }
    wait_until(Duration::from_secs(5), "b runs the new tasks", || {
        let runs = runs.lock().unwrap();
        (1..=16).all(|s| runs.contains_key(&s))
    })
    .await;
    let ran_by_b = frozen_at.elapsed();
    assert!(
        ran_by_b < frozen_for,
        "checked while a was still frozen ({ran_by_b:?})"
    );
    let pending = pending_under(&server, &name).await;
    println!(
        "b took over {took_over:?} into the freeze; every new task ran on b by {ran_by_b:?}; pending: {pending:?}"
    );
    // Let a resume, then stop both.
    tokio::time::sleep(frozen_for.saturating_sub(frozen_at.elapsed()) + Duration::from_millis(500))
        .await;
    a.stop().await;
    stop_b.cancel();
    b.await.unwrap().unwrap();
    let runs = runs.lock().unwrap().clone();
    for seq in 1..=16u64 {
        let who: Vec<_> = runs[&seq].iter().map(|r| r.0).collect();
        assert_eq!(who, vec!["b"], "task {seq} ran once, on b");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_resumes_from_a_freeze_past_its_lease_is_no_longer_owned() {
    let server = RedisServer::start();
    let name = unique_name("frozen-task");
    // (still_owned right when the handler starts, right after it resumes,
    // when it resumed).
    type Checks = Arc<Mutex<Vec<(bool, bool, Instant)>>>;
    let checks: Checks = Arc::default();
    let started = Arc::new(tokio::sync::Notify::new());
    let (c, s) = (checks.clone(), started.clone());
    let handler = tower::service_fn(move |task: Task<Job>| {
        let (checks, started) = (c.clone(), s.clone());
        async move {
            let before = task.cx.still_owned();
            started.notify_one();
            // The freeze lands here; the timer is overdue when the thread
            // runs again, and fires in the same instant as the runtime's.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let after = task.cx.still_owned();
            checks.lock().unwrap().push((before, after, Instant::now()));
            Ok::<(), HandlerError>(())
        }
    });
    let a = builder(&server.url(), &name).service(handler);
    let a = Frozen::start(move |stop| a.run_until(stop.cancelled_owned()));
    let producer = producer(&server.url(), &name).await;
    producer.enqueue(&Job { seq: 0 }).await.unwrap();
    tokio::time::timeout(Duration::from_secs(15), started.notified())
        .await
        .expect("the task starts");
    let frozen_for = Duration::from_secs(3);
    let resumed = Instant::now() + frozen_for;
    a.freeze(frozen_for);
    wait_until(Duration::from_secs(10), "the handler checks again", || {
        !checks.lock().unwrap().is_empty()
    })
    .await;
    a.stop().await;
    let (before, after, at) = checks.lock().unwrap()[0];
    println!("still_owned: {before} before the freeze, {after} right after it");
    assert!(before, "owned while the lease holds");
    assert!(at >= resumed - 50 * MS, "checked after the freeze");
    assert!(!after, "a lease lapsed during the freeze is seen at once");
}

/// The blocked `XREADGROUP`s of a server's clients, by client id.
async fn blocked_reads(conn: &mut redis::aio::MultiplexedConnection) -> Vec<u64> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .unwrap();
    list.lines()
        .filter(|line| line.contains("cmd=xreadgroup") && line.contains("flags=b"))
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(|id| id.parse().unwrap())
        .collect()
}

/// Blocking reads as Redis received them: (when one arrived, Unix seconds
/// by Redis's clock, which is this machine's; its `BLOCK` in ms).
type Received = Arc<Mutex<Vec<(f64, u64)>>>;

/// Every blocking read Redis receives, as `MONITOR` shows them.
fn watch_blocking_reads(monitor: redis::aio::Monitor) -> (Received, tokio::task::JoinHandle<()>) {
    use futures_util::StreamExt;
    let reads = Received::default();
    let seen = reads.clone();
    let task = tokio::spawn(async move {
        let mut lines = monitor.into_on_message::<String>();
        while let Some(line) = lines.next().await {
            // 1700000000.123456 [0 127.0.0.1:5555] "XREADGROUP" ... "BLOCK" "980" ...
            let words: Vec<&str> = line.split(' ').collect();
            if words.get(3) != Some(&"\"XREADGROUP\"") {
                continue;
            }
            let Some(at) = words.iter().position(|w| *w == "\"BLOCK\"") else {
                continue;
            };
            let block = words[at + 1].trim_matches('"').parse().unwrap();
            seen.lock()
                .unwrap()
                .push((words[0].parse().unwrap(), block));
        }
    });
    (reads, task)
}

/// Rule 6 (docs/design.md §4): the idle read's `BLOCK` is bounded by the
/// lease as the read is sent. Connecting its reader can take seconds (a
/// slow network, a pool at its limit); a bound taken before connecting left
/// the read blocked past the lease end (issue 36, item 3: 0.38 s past it
/// here, with a 400 ms connect), where Redis would hand a frozen instance's read entries added
/// after its successor took over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_read_sent_after_a_slow_connect_still_ends_before_the_lease() {
    const I: Duration = Duration::from_secs(2);
    const SLOW: Duration = Duration::from_millis(400);
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let name = unique_name("slow-connect");
    let runs = Runs::default();
    let monitor = redis::Client::open(server.url())
        .unwrap()
        .get_async_monitor()
        .await
        .unwrap();
    let (reads, watching) = watch_blocking_reads(monitor);
    // Each read's bound is the lease: a block of a minute never ends first.
    let consumer = builder(&proxy.url(), &name)
        .interval(I)
        .block(Duration::from_secs(60))
        .service(service("a", &runs));
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run_until(stop.clone().cancelled_owned()));
    let mut admin = server.connection().await;
    let started = Instant::now();
    let first = loop {
        let blocked = blocked_reads(&mut admin).await;
        if !blocked.is_empty() {
            break blocked;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the idle read never blocked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Its next connection takes 0.4 s to make (below the client's 0.5 s
    // response timeout for its set-up commands); then its read is cut off,
    // and it connects again.
    proxy.slow_connects(SLOW);
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let _: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(first[0])
        .query_async(&mut admin)
        .await
        .unwrap();
    // Two reads on the new connection at least (each ends with the lease).
    wait_until(Duration::from_secs(30), "reads after the reconnect", || {
        let reads = reads.lock().unwrap();
        reads.iter().filter(|(at, _)| *at > killed_at + 1.0).count() >= 2
    })
    .await;
    stop.cancel();
    task.await.unwrap().unwrap();
    watching.abort();

    // A read that arrives at `at` is under an assignment of epoch
    // `floor(at / I) + 1` at the newest, whose lease ends 1.5 I + the lease
    // margin (20 ms) after the epoch's start.
    let i = I.as_secs_f64();
    let reads = reads.lock().unwrap().clone();
    let late: Vec<String> = reads
        .iter()
        .filter_map(|&(at, block)| {
            let lease_end = (at / i).floor() * i + 1.5 * i + 0.020;
            let ends = at + block as f64 / 1000.0;
            // Allows 50 ms for the trip to Redis beyond the read's margin.
            (ends > lease_end + 0.050).then(|| {
                format!(
                    "sent at {at:.3}, blocking {block} ms: {:.3} s past the lease",
                    ends - lease_end
                )
            })
        })
        .collect();
    assert!(
        late.is_empty(),
        "idle reads blocked past the lease (the reconnect took {SLOW:?}): {late:?}"
    );
}

/// How long one of [`Stall`]'s clock calls takes on the instance's loop
/// thread, while it is slow.
const SLOW_CALL: Duration = Duration::from_millis(150);

/// A stall of the thread that runs the instance's loop (its handover and
/// standing), while its runtime's workers and its rounds' thread go on:
/// the loop is frozen inside its stop signal's poll, then slow for a while
/// (each of its clock reads takes [`SLOW_CALL`]), as a descheduled thread
/// is.
#[derive(Debug, Default)]
struct Stall {
    /// The thread the loop runs on (the one that `block_on`s the run).
    loop_thread: std::sync::OnceLock<std::thread::ThreadId>,
    /// How long to freeze at the loop's next poll of its signal.
    freeze: Mutex<Option<Duration>>,
    /// The signal's last waker, to poll it again at once.
    waker: Mutex<Option<std::task::Waker>>,
    /// When the freeze ended, and until when the loop thread's clock
    /// reads are slow.
    resumed: Mutex<Option<(Instant, Instant)>>,
}

impl Stall {
    /// Freezes the loop thread for `d` from its next poll (at once), then
    /// makes it slow for `slow`.
    fn freeze(&self, d: Duration) {
        *self.freeze.lock().unwrap() = Some(d);
        if let Some(waker) = self.waker.lock().unwrap().take() {
            waker.wake();
        }
    }

    /// The stop signal the loop polls first on every turn: `stop`, or
    /// never; it freezes the thread when asked.
    fn signal(
        self: &Arc<Self>,
        stop: CancellationToken,
        slow: Duration,
    ) -> impl Future<Output = ()> + Send + use<> {
        let stall = self.clone();
        let hook = std::future::poll_fn(move |cx| {
            if let Some(d) = stall.freeze.lock().unwrap().take() {
                std::thread::sleep(d);
                let now = Instant::now();
                *stall.resumed.lock().unwrap() = Some((now, now + slow));
            }
            *stall.waker.lock().unwrap() = Some(cx.waker().clone());
            std::task::Poll::<()>::Pending
        });
        async move {
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = hook => {}
            }
        }
    }

    /// When the freeze ended, once it did.
    fn resumed(&self) -> Option<Instant> {
        self.resumed.lock().unwrap().map(|(at, _)| at)
    }
}

/// The system clock, read slowly on the stalled loop thread (the time of
/// the call, returned late).
#[derive(Debug)]
struct StallClock(Arc<Stall>);

impl peerq::Clock for StallClock {
    fn now(&self) -> Duration {
        let now = peerq::SystemClock.now();
        let stall = &self.0;
        let on_loop = stall.loop_thread.get() == Some(&std::thread::current().id());
        let slow = stall
            .resumed
            .lock()
            .unwrap()
            .is_some_and(|(_, until)| Instant::now() < until);
        if on_loop && slow {
            std::thread::sleep(SLOW_CALL);
        }
        now
    }
}

/// Rule 5 after a stall, with the lease granted only after the effects
/// (commit f55b692): a task fetched before an instance's loop stalled past
/// its lease, and waiting for the lease when the loop resumes, does not
/// start under the ownership that the next assignment (after skipped
/// epochs) stops; it runs under the one acquired anew.
///
/// One partition, `concurrency` 1. Task A runs (until `still_owned()` says
/// the lease lapsed) and holds the only permit, so task B waits in the
/// stream, the fetch loop behind A. The loop thread (handover and standing,
/// on a multi-thread runtime's `block_on` thread) freezes for 2.6 s: the
/// lease lapses, A ends, and the fetch loop waits for the lease, while the
/// rounds' thread goes on publishing assignments. On resuming, the loop
/// takes the newest assignment first (the runtime loop's `biased` order),
/// which skips epochs: fence every partition (stop the fetch loop), then
/// grant its lease. The thread is slow then (each clock read 150 ms), so a
/// lease granted before the stop would leave the fetch loop, on a worker,
/// at least 150 ms (the release's clock read) to read B and start it with
/// A's token: it does, every time (tried by granting first).
#[test]
fn a_task_that_waited_out_a_stall_for_the_lease_does_not_start_under_the_stopped_ownership() {
    let server = RedisServer::start();
    let name = unique_name("frozen-grant");
    // (seq, fencing token, when it started).
    type Started = Arc<Mutex<Vec<(u64, u64, Instant)>>>;
    let started: Started = Arc::default();
    let s = started.clone();
    let handler = tower::service_fn(move |task: Task<Job>| {
        let started = s.clone();
        async move {
            let (seq, token) = (task.payload.seq, task.cx.fencing_token());
            started.lock().unwrap().push((seq, token, Instant::now()));
            if seq == 0 {
                while task.cx.still_owned() {
                    tokio::time::sleep(10 * MS).await;
                }
                task.cx.finished();
            }
            Ok::<(), HandlerError>(())
        }
    });
    let stall = Arc::new(Stall::default());
    let stop = CancellationToken::new();
    let consumer = builder(&server.url(), &name)
        .partitions(1)
        .concurrency(1)
        .clock(StallClock(stall.clone()))
        .service(handler);
    let mut events = consumer.partition_events();
    let signal = stall.signal(stop.clone(), Duration::from_millis(1500));
    let loop_stall = stall.clone();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        loop_stall
            .loop_thread
            .set(std::thread::current().id())
            .unwrap();
        rt.block_on(consumer.run_until(signal))
    });
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Started: the service and its one partition are recorded.
    rt.block_on(until_started(&mut events, 1, "the partition starts"));
    let producer = rt.block_on(async { Producer::connect(&server.url(), &name).await.unwrap() });
    rt.block_on(producer.enqueue(&Job { seq: 0 })).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while started.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "task A never started");
        std::thread::sleep(10 * MS);
    }
    rt.block_on(producer.enqueue(&Job { seq: 1 })).unwrap();
    // Resume early in an epoch (epochs begin at whole seconds at I = 1 s),
    // right after its assignment (offsets lie below I/2), so that the
    // newest assignment's lease has most of an interval left through the
    // slow clock reads.
    let freeze = Duration::from_millis(2600);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let resume_at_ms = (now_ms + freeze.as_millis() as u64 + 500) / 1000 * 1000 + 1600;
    std::thread::sleep(Duration::from_millis(
        resume_at_ms - freeze.as_millis() as u64 - now_ms,
    ));
    stall.freeze(freeze);
    let deadline = Instant::now() + Duration::from_secs(20);
    let resumed = loop {
        if let Some(at) = stall.resumed() {
            break at;
        }
        assert!(Instant::now() < deadline, "the loop never froze");
        std::thread::sleep(10 * MS);
    };
    while started.lock().unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "task B never ran");
        std::thread::sleep(10 * MS);
    }
    // Time to run B again, if anything would (nothing to wait for: it
    // must not happen).
    std::thread::sleep(Duration::from_millis(500));
    stop.cancel();
    thread.join().unwrap().unwrap();
    let started = started.lock().unwrap().clone();
    println!(
        "started (seq, token): {:?}",
        started.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>()
    );
    let token_a = started[0].1;
    let b: Vec<_> = started.iter().filter(|s| s.0 == 1).collect();
    assert_eq!(b.len(), 1, "B started once: {started:?}");
    assert!(
        b[0].2 >= resumed - Duration::from_millis(300),
        "B started after the stall"
    );
    assert!(
        b[0].1 > token_a,
        "B started with token {}, that of the ownership the assignment after the stall \
         stopped (A ran with {token_a}), not under the one acquired anew",
        b[0].1
    );
}
