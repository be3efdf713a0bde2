//! Drain-then-switch (docs/design.md §4) with real Redis and several instances
//! in one process: partitions move between instances with no task run twice
//! and no overlap, kept partitions never pause, stale owners are fenced, an
//! instance cut from Redis stops within its lease, and a leave can be cut
//! short.
//!
//! Each rule of the state machine has a unit test in `src/transition/tests.rs`;
//! these tests show the wired runtime keeps them.

use crate::producer;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use deadpool_redis::redis::{self, AsyncCommands};
use peerq::Bincode;
use peerq::assignment::Standing;
use peerq::consumer::{ConsumerBuilder, PartitionChange, PartitionEvent};
use peerq::handler::Task;
use peerq::producer::{Options, Producer};
use peerq::{Consumer, HandlerError};
use serde::{Deserialize, Serialize};
use support::{Proxy, RedisServer, unique_name, wait_until};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);
const INTERVAL: Duration = Duration::from_secs(1);
const DRAIN: Duration = Duration::from_millis(300);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

fn base(url: &str, name: &str, partitions: u32) -> ConsumerBuilder<(), (), Bincode> {
    support::init_tracing();
    Consumer::builder()
        .name(name)
        .redis(url)
        .interval(INTERVAL)
        .drain_timeout(DRAIN)
        .partitions(partitions)
}

/// A key for each partition `0..partitions`.
fn keys_by_partition(partitions: u32) -> BTreeMap<u32, String> {
    let mut keys = BTreeMap::new();
    for i in 0.. {
        let key = format!("k{i}");
        keys.entry(peerq::partition_of(key.as_bytes(), partitions))
            .or_insert(key);
        if keys.len() == partitions as usize {
            return keys;
        }
    }
    unreachable!()
}

/// One handler run.
#[derive(Debug, Clone)]
struct Run {
    seq: u64,
    attempt: u32,
}

/// What every instance's handler and runtime report, in one place.
#[derive(Default)]
struct World {
    runs: Mutex<Vec<Run>>,
    /// Per partition, the instances running one of its tasks right now.
    running: Mutex<HashMap<u32, Vec<usize>>>,
    /// Two instances running tasks of one partition at once.
    overlaps: Mutex<Vec<String>>,
    events: Mutex<Vec<(usize, PartitionEvent)>>,
    /// Instances that fenced themselves (a late or failed round).
    fenced: Mutex<Vec<(usize, String)>>,
}

impl World {
    fn runs(&self) -> Vec<Run> {
        self.runs.lock().unwrap().clone()
    }

    fn distinct(&self) -> usize {
        let mut seqs: Vec<u64> = self.runs().iter().map(|r| r.seq).collect();
        seqs.sort_unstable();
        seqs.dedup();
        seqs.len()
    }

    async fn run_task(&self, instance: usize, task: Task<Job>) {
        let p = task.cx.partition();
        {
            let mut running = self.running.lock().unwrap();
            let here = running.entry(p).or_default();
            if let Some(other) = here.iter().find(|i| **i != instance) {
                self.overlaps.lock().unwrap().push(format!(
                    "partition {p}: instance {instance} started seq {} while instance {other} ran one",
                    task.payload.seq
                ));
            }
            here.push(instance);
        }
        // Long enough for an overlap to be seen, short against the drain.
        tokio::time::sleep(2 * MS).await;
        {
            let mut running = self.running.lock().unwrap();
            let here = running.get_mut(&p).unwrap();
            let at = here.iter().position(|i| *i == instance).unwrap();
            here.swap_remove(at);
        }
        self.runs.lock().unwrap().push(Run {
            seq: task.payload.seq,
            attempt: task.cx.attempt(),
        });
    }
}

/// A consumer instance in this process, its events and standings recorded
/// in the world.
struct Instance {
    stop: CancellationToken,
    task: JoinHandle<peerq::Result<()>>,
    standing: tokio::sync::watch::Receiver<Standing>,
}

impl Instance {
    fn start(url: &str, name: &str, partitions: u32, world: &Arc<World>, instance: usize) -> Self {
        let builder = base(url, name, partitions).service(tower::service_fn({
            let world = world.clone();
            move |task: Task<Job>| {
                let world = world.clone();
                async move {
                    world.run_task(instance, task).await;
                    Ok::<(), HandlerError>(())
                }
            }
        }));
        let mut events = builder.partition_events();
        let standing = builder.standing();
        tokio::spawn({
            let world = world.clone();
            async move {
                while let Ok(event) = events.recv().await {
                    world.events.lock().unwrap().push((instance, event));
                }
            }
        });
        tokio::spawn({
            let world = world.clone();
            let mut standing = standing.clone();
            async move {
                while standing.changed().await.is_ok() {
                    if let Standing::Fenced { epoch, reason } = &*standing.borrow() {
                        let why = format!("epoch {epoch}: {reason}");
                        world.fenced.lock().unwrap().push((instance, why));
                    }
                }
            }
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
        Instance {
            stop,
            task,
            standing,
        }
    }

    fn replicas(&self) -> Option<u32> {
        self.standing.borrow().assignment().map(|a| a.replicas)
    }

    /// A graceful leave; returns how long it took.
    async fn leave(self) -> Duration {
        let started = Instant::now();
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
        started.elapsed()
    }
}

async fn wait_replicas(instances: &[&Instance], replicas: u32) {
    wait_until(
        Duration::from_secs(15),
        &format!("{replicas} replicas"),
        || instances.iter().all(|i| i.replicas() == Some(replicas)),
    )
    .await;
}

/// Enqueues tasks steadily until stopped; returns how many.
fn produce(producer: Producer, stop: CancellationToken) -> JoinHandle<u64> {
    tokio::spawn(async move {
        let mut seq = 0;
        while !stop.is_cancelled() {
            let jobs: Vec<Job> = (seq..seq + 20).map(|seq| Job { seq }).collect();
            producer.enqueue_batch(&jobs).await.unwrap();
            seq += 20;
            tokio::time::sleep(50 * MS).await;
        }
        seq
    })
}

/// One stretch of a partition on one instance: from `Started` until
/// `Stopped` and `Drained`.
#[derive(Debug, Clone)]
struct Stretch {
    instance: usize,
    started: SystemTime,
    stopped: Option<SystemTime>,
    drained: Option<SystemTime>,
}

/// Each partition's stretches, in the order they started.
fn stretches(events: &[(usize, PartitionEvent)]) -> BTreeMap<u32, Vec<Stretch>> {
    let mut open: HashMap<(usize, u32), Stretch> = HashMap::new();
    let mut done: BTreeMap<u32, Vec<Stretch>> = BTreeMap::new();
    for (instance, e) in events {
        let key = (*instance, e.partition);
        match e.change {
            PartitionChange::Started { .. } => {
                open.insert(
                    key,
                    Stretch {
                        instance: *instance,
                        started: e.at,
                        stopped: None,
                        drained: None,
                    },
                );
            }
            PartitionChange::Stopped => {
                if let Some(s) = open.get_mut(&key) {
                    s.stopped = Some(e.at);
                }
            }
            PartitionChange::Drained => {
                if let Some(mut s) = open.remove(&key) {
                    s.drained = Some(e.at);
                    done.entry(e.partition).or_default().push(s);
                }
            }
            _ => {}
        }
    }
    for ((_, p), s) in open {
        done.entry(p).or_default().push(s);
    }
    for list in done.values_mut() {
        list.sort_by_key(|s| s.started);
    }
    done
}

fn secs(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

fn summary(mut pauses: Vec<Duration>) -> String {
    if pauses.is_empty() {
        return "none".into();
    }
    pauses.sort();
    let at = |q: f64| pauses[((pauses.len() - 1) as f64 * q).round() as usize];
    format!(
        "n={} p50={} p99={} max={}",
        pauses.len(),
        secs(at(0.5)),
        secs(at(0.99)),
        secs(*pauses.last().unwrap())
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_and_graceful_leaves_move_partitions_without_overlap_or_pauses_of_kept_ones() {
    const P: u32 = 16;
    let server = RedisServer::start();
    let name = unique_name("handover");
    let url = server.url();
    let world = Arc::new(World::default());
    let a = Instance::start(&url, &name, P, &world, 0);
    let b = Instance::start(&url, &name, P, &world, 1);
    wait_replicas(&[&a, &b], 2).await;
    let stop_producing = CancellationToken::new();
    let producer = producer(&url, &name, P).await;
    let produced = produce(producer, stop_producing.clone());

    // Churn: a join, a graceful leave, another join, each once the
    // previous one has settled, while tasks flow.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let join1 = SystemTime::now();
    let c = Instance::start(&url, &name, P, &world, 2);
    wait_replicas(&[&a, &b, &c], 3).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leave = SystemTime::now();
    let took = b.leave().await;
    println!("graceful leave took {}", secs(took));
    wait_replicas(&[&a, &c], 2).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let join2 = SystemTime::now();
    let d = Instance::start(&url, &name, P, &world, 3);
    wait_replicas(&[&a, &c, &d], 3).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    stop_producing.cancel();
    let count = produced.await.unwrap();
    wait_until(Duration::from_secs(30), "every task to run", || {
        world.distinct() as u64 == count
    })
    .await;
    let end = SystemTime::now();
    for instance in [a, c, d] {
        instance.leave().await;
    }

    // Exactly once, each on its first attempt, never two instances at once.
    let runs = world.runs();
    let mut per_seq: BTreeMap<u64, Vec<&Run>> = BTreeMap::new();
    for run in &runs {
        per_seq.entry(run.seq).or_default().push(run);
    }
    let twice: Vec<_> = per_seq.values().filter(|r| r.len() > 1).take(5).collect();
    assert!(twice.is_empty(), "tasks run twice: {twice:?}");
    assert_eq!(per_seq.len() as u64, count);
    // Attempt 2 only for an entry a release cut short left pending on the
    // old owner (fetched, never run), taken over by the new one.
    assert!(runs.iter().all(|r| r.attempt <= 2));
    let overlaps = world.overlaps.lock().unwrap().clone();
    assert!(overlaps.is_empty(), "{overlaps:?}");
    let taken_over = runs.iter().filter(|r| r.attempt == 2).count();
    println!("{count} tasks, each run once ({taken_over} taken over from a release cut short)");

    let fenced = world.fenced.lock().unwrap().clone();
    if !fenced.is_empty() {
        println!("instances fenced themselves (excused from the pause check): {fenced:?}");
    }
    let excused = |i: usize| fenced.iter().any(|(f, _)| *f == i);
    let events = world.events.lock().unwrap().clone();
    let stretches = stretches(&events);
    assert_eq!(stretches.len(), P as usize, "every partition ran");
    let (mut join_pauses, mut leave_pauses) = (Vec::new(), Vec::new());
    for (p, list) in &stretches {
        for pair in list.windows(2) {
            let (old, new) = (&pair[0], &pair[1]);
            // No overlap: the new owner starts after the old one drained.
            let drained = old.drained.expect("a stretch followed by another ended");
            assert!(
                new.started >= drained,
                "partition {p}: instance {} started {:?} before instance {} drained",
                new.instance,
                drained.duration_since(new.started).unwrap(),
                old.instance
            );
            // Kept partitions never pause: a partition only stops on an
            // instance to move to another one.
            let stopped = old.stopped.unwrap();
            if stopped < end && !excused(old.instance) {
                assert_ne!(
                    old.instance, new.instance,
                    "partition {p} paused on instance {} without moving",
                    old.instance
                );
            }
            let pause = new.started.duration_since(stopped).unwrap();
            if stopped >= end {
                // The final shutdown.
            } else if stopped >= leave && stopped < join2 {
                leave_pauses.push(pause);
            } else if stopped >= join1 {
                join_pauses.push(pause);
            }
        }
    }
    println!(
        "pause of moved partitions, joins: {}",
        summary(join_pauses.clone())
    );
    println!(
        "pause of moved partitions, graceful leave: {}",
        summary(leave_pauses.clone())
    );
    assert!(!join_pauses.is_empty() && !leave_pauses.is_empty());
    // The handover deadline bounds every pause: I/2 + drain + S_allow
    // (0.97 s here) after the epoch began; generous for a loaded machine.
    let bound = Duration::from_millis(2500);
    for pause in join_pauses.iter().chain(&leave_pauses) {
        assert!(
            *pause <= bound,
            "a pause of {} beyond {}",
            secs(*pause),
            secs(bound)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_owners_ack_is_refused_and_it_drops_the_partition() {
    const P: u32 = 4;
    let server = RedisServer::start();
    let name = unique_name("stale");
    let url = server.url();
    let keys = keys_by_partition(P);
    // Partition 0's first task waits until the test lets it finish.
    let release = Arc::new(tokio::sync::Notify::new());
    let runs = Arc::new(Mutex::new(Vec::<(u64, u64)>::new())); // (seq, token)
    let builder = base(&url, &name, P).service(tower::service_fn({
        let (release, runs) = (release.clone(), runs.clone());
        move |task: Task<Job>| {
            let (release, runs) = (release.clone(), runs.clone());
            async move {
                let first = runs.lock().unwrap().is_empty();
                runs.lock()
                    .unwrap()
                    .push((task.payload.seq, task.cx.fencing_token()));
                if first {
                    release.notified().await;
                }
                Ok::<(), HandlerError>(())
            }
        }
    }));
    let mut events = builder.partition_events();
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    let producer = producer(&url, &name, P).await;
    producer
        .enqueue_with(Job { seq: 1 }, Options::new().key(keys[&0].clone()))
        .await
        .unwrap();
    wait_until(Duration::from_secs(10), "the task to start", || {
        !runs.lock().unwrap().is_empty()
    })
    .await;
    let token = runs.lock().unwrap()[0].1;

    // Another instance takes partition 0 with a newer token meanwhile.
    let mut conn = server.pool().get().await.unwrap();
    let owner = format!("{{{name}/0}}:owner");
    let recorded: String = conn.get(&owner).await.unwrap();
    assert!(recorded.starts_with(&format!("{token}:")), "{recorded}");
    let newer = token + 2;
    let () = conn
        .set(&owner, format!("{newer}:someone-else"))
        .await
        .unwrap();
    release.notify_one();
    let released = SystemTime::now();

    // The ack is refused: the entry stays pending for the new owner, and
    // the stale owner stops partition 0.
    let stream = format!("{{{name}/0}}:stream");
    let stopped = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let e = events.recv().await.unwrap();
            if e.partition == 0 && e.change == PartitionChange::Stopped {
                return e;
            }
        }
    })
    .await
    .expect("partition 0 stopped after its ack was refused");
    let stopped_after = stopped.at.duration_since(released).unwrap_or_default();
    // Only partition 0: the others are still this instance's.
    tokio::time::sleep(Duration::from_millis(200)).await;
    while let Ok(e) = events.try_recv() {
        assert!(
            e.partition == 0 || e.change != PartitionChange::Stopped,
            "partition {} stopped too",
            e.partition
        );
    }
    let pending: redis::streams::StreamPendingReply =
        conn.xpending(&stream, "peerq").await.unwrap();
    assert_eq!(pending.count(), 1, "the refused ack left the entry pending");
    println!("partition 0 stopped {stopped_after:?} after the test released the handler");

    // Once its epochs pass the other's token, the instance acquires again,
    // with a newer token, and runs the entry the stale ack left: nothing is
    // lost.
    wait_until(
        Duration::from_secs(20),
        "the entry to run again and be acked",
        || runs.lock().unwrap().len() >= 2,
    )
    .await;
    let second = runs.lock().unwrap()[1];
    assert_eq!(second.0, 1);
    assert!(
        second.1 > newer,
        "acquired again with token {} > {newer}",
        second.1
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pending: redis::streams::StreamPendingReply =
            conn.xpending(&stream, "peerq").await.unwrap();
        if pending.count() == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the re-run's ack never landed");
        tokio::time::sleep(50 * MS).await;
    }
    stop.cancel();
    consumer.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_cut_from_redis_stops_within_its_lease() {
    const P: u32 = 4;
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let name = unique_name("cut");
    // What each run saw: (seq, started, interrupted at).
    type Seen = Arc<Mutex<Vec<(u64, SystemTime, Option<SystemTime>)>>>;
    let seen: Seen = Arc::default();
    let builder = base(&proxy.url(), &name, P)
        .concurrency(1)
        .service(tower::service_fn({
            let seen = seen.clone();
            move |task: Task<Job>| {
                let seen = seen.clone();
                async move {
                    let at = {
                        let mut seen = seen.lock().unwrap();
                        seen.push((task.payload.seq, SystemTime::now(), None));
                        seen.len() - 1
                    };
                    // The first run (the one running when Redis goes away;
                    // concurrency 1) runs until interrupted; the rest finish.
                    if at == 0 {
                        task.cx.cancelled().await;
                        seen.lock().unwrap()[at].2 = Some(SystemTime::now());
                        return Err(HandlerError::msg("interrupted"));
                    }
                    Ok::<(), HandlerError>(())
                }
            }
        }));
    let mut standing = builder.standing();
    let mut events = builder.partition_events();
    let stop = CancellationToken::new();
    let consumer = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    let producer = producer(&server.url(), &name, P).await;
    let jobs: Vec<Job> = (0..5).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&jobs).await.unwrap();
    wait_until(Duration::from_secs(10), "a task to start", || {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    // Cut right after an assignment arrived: the lease of that epoch is
    // what the instance may still use.
    standing.borrow_and_update();
    standing.changed().await.unwrap();
    let epoch = standing.borrow().assignment().expect("assigned").epoch;
    proxy.blackhole();
    let cut = SystemTime::now();
    let lease_end = SystemTime::UNIX_EPOCH
        + INTERVAL * (epoch as u32 - 1)
        + INTERVAL * 3 / 2
        + Duration::from_millis(20);
    println!(
        "cut {:?} before the lease end",
        lease_end.duration_since(cut).unwrap()
    );

    // Every partition stops, and the running task is interrupted, by the
    // lease's end (with slack for a loaded machine).
    let slack = Duration::from_millis(300);
    let mut stopped = 0;
    while stopped < P {
        let e = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("partitions stop")
            .unwrap();
        if e.change == PartitionChange::Stopped {
            assert!(
                e.at <= lease_end + slack,
                "partition {} stopped {:?} after the lease",
                e.partition,
                e.at.duration_since(lease_end)
            );
            stopped += 1;
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let runs = seen.lock().unwrap().clone();
    let cancelled = runs[0].2.expect("the running task was cancelled");
    assert!(
        cancelled <= lease_end + slack,
        "cancelled {:?} after the lease end",
        cancelled.duration_since(lease_end)
    );
    assert!(
        runs.iter().all(|(_, started, _)| *started < lease_end),
        "nothing starts after the lease: {runs:?}"
    );
    println!(
        "stopped and cancelled {:?} after the cut",
        cancelled.duration_since(cut).unwrap()
    );

    // Back in touch, it runs everything (the cancelled one again).
    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let runs = seen.lock().unwrap().clone();
        if (0..5).all(|seq| runs.iter().any(|(s, _, c)| *s == seq && c.is_none())) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every task finished: {runs:?}"
        );
        tokio::time::sleep(50 * MS).await;
    }
    stop.cancel();
    consumer.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leave_timeout_leaves_at_once_and_the_task_runs_again_elsewhere() {
    const P: u32 = 4;
    let server = RedisServer::start();
    let name = unique_name("leave-now");
    let url = server.url();
    let runs = Arc::new(Mutex::new(Vec::<(u64, u32)>::new()));
    let service = |runs: Arc<Mutex<Vec<(u64, u32)>>>| {
        tower::service_fn(move |task: Task<Job>| {
            let runs = runs.clone();
            async move {
                runs.lock()
                    .unwrap()
                    .push((task.payload.seq, task.cx.attempt()));
                if task.cx.attempt() == 1 {
                    task.cx.cancelled().await;
                    return Err(HandlerError::msg("interrupted"));
                }
                Ok::<(), HandlerError>(())
            }
        })
    };
    let builder = base(&url, &name, P)
        .leave_timeout(Duration::from_millis(100))
        .service(service(runs.clone()));
    let mut standing = builder.standing();
    let stop = CancellationToken::new();
    let first = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
    let producer = producer(&url, &name, P).await;
    producer.enqueue(&Job { seq: 7 }).await.unwrap();
    wait_until(Duration::from_secs(10), "the task to start", || {
        !runs.lock().unwrap().is_empty()
    })
    .await;
    // A graceful leave waits for a round without this instance (over an
    // interval); the timeout cuts it short.
    standing.borrow_and_update();
    let started = Instant::now();
    stop.cancel();
    first.await.unwrap().unwrap();
    let took = started.elapsed();
    println!("left at once after {}", secs(took));
    assert!(
        took < Duration::from_millis(800),
        "left after {}",
        secs(took)
    );
    assert!(
        !matches!(*standing.borrow(), Standing::Left { .. }),
        "it did not wait for the leave to finish"
    );

    // The cancelled task runs again (attempt 2) on the next instance.
    let second = base(&url, &name, P).service(service(runs.clone()));
    let stop = CancellationToken::new();
    let second = tokio::spawn(second.run_until(stop.clone().cancelled_owned()));
    wait_until(Duration::from_secs(15), "the task to run again", || {
        runs.lock().unwrap().len() == 2
    })
    .await;
    assert_eq!(runs.lock().unwrap().clone(), vec![(7, 1), (7, 2)]);
    stop.cancel();
    second.await.unwrap().unwrap();
}
