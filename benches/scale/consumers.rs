//! 200 consumers with P = 1,024 on one Redis (issue 22): tasks flow while
//! 20 instances leave gracefully; every task must run exactly once, and the
//! partitions the leave moved pause for as long as the handover takes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime};

use peerq::assignment::Standing;
use peerq::consumer::{PartitionChange, PartitionEvent};
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::{Assignor, Consumer, HandlerError};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::redis_load;
use support::{RedisServer, unique_name};

const PARTITIONS: u32 = 1024;
/// Tasks enqueued per second while the instances come and go.
const RATE: u64 = 2000;
/// How many of the instances leave.
const LEAVING: usize = 20;

/// Handler runs per task.
type Runs = Arc<Vec<AtomicU32>>;

/// Every partition event of every instance, with the instance.
type Events = Arc<Mutex<Vec<(usize, PartitionEvent)>>>;

/// A consumer on a thread and a runtime of its own, as a process of its
/// own would be: on one shared runtime, 200 instances' work (rendezvous
/// computes each one's owner table, P × N scores, at every membership
/// change) starves the others, whose rounds then refuse to claim an index
/// ("the consumer's runtime has not run for an interval").
struct Instance {
    stop: CancellationToken,
    run: std::thread::JoinHandle<peerq::Result<()>>,
    standing: tokio::sync::watch::Receiver<Standing>,
}

impl Instance {
    /// Leaves gracefully; true once it has, within `within`.
    async fn leave(self, within: Duration) -> bool {
        self.stop.cancel();
        let deadline = Instant::now() + within;
        while !self.run.is_finished() {
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.run.join().unwrap().unwrap();
        true
    }
}

fn start(
    server: &RedisServer,
    name: &str,
    assignor: Assignor,
    i: usize,
    runs: &Runs,
    events: &Events,
) -> Instance {
    let runs = runs.clone();
    let builder = Consumer::builder()
        .name(name)
        .redis(server.url())
        .partitions(PARTITIONS)
        .assignor(assignor)
        .service(tower::service_fn(move |task: Task<u64>| {
            let runs = runs.clone();
            async move {
                runs[task.payload as usize].fetch_add(1, Ordering::SeqCst);
                Ok::<_, HandlerError>(())
            }
        }));
    let mut rx = builder.partition_events();
    let standing = builder.standing();
    let events = events.clone();
    let stop = CancellationToken::new();
    let stopped = stop.clone().cancelled_owned();
    let run = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            tokio::spawn(async move {
                while let Ok(event) = rx.recv().await {
                    events.lock().await.push((i, event));
                }
            });
            builder.run_until(stopped).await
        })
    });
    Instance {
        stop,
        run,
        standing,
    }
}

/// Waits until every instance holds an assignment among `n`.
async fn wait_assigned(fleet: &[Instance], within: Duration) {
    let deadline = Instant::now() + within;
    let n = fleet.len() as u32;
    while !fleet
        .iter()
        .all(|i| matches!(&*i.standing.borrow(), Standing::Assigned(a) if a.replicas == n))
    {
        assert!(
            Instant::now() < deadline,
            "the {n} instances were never assigned together"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Each partition's current owner from the events, if every partition has
/// exactly one.
async fn owners(events: &Events) -> Option<Vec<usize>> {
    let mut owner: Vec<Vec<usize>> = vec![Vec::new(); PARTITIONS as usize];
    for (i, e) in events.lock().await.iter() {
        let held = &mut owner[e.partition as usize];
        match e.change {
            PartitionChange::Started { .. } => held.push(*i),
            PartitionChange::Stopped => held.retain(|o| o != i),
            _ => {}
        }
    }
    owner
        .into_iter()
        .map(|o| (o.len() == 1).then(|| o[0]))
        .collect()
}

/// Waits until every partition has one owner, unchanged for 3 s.
async fn wait_owned(events: &Events, within: Duration, what: &str) -> Vec<usize> {
    let deadline = Instant::now() + within;
    let mut last: Option<(Vec<usize>, Instant)> = None;
    loop {
        let now = owners(events).await;
        match (&last, now) {
            (Some((held, since)), Some(now)) if *held == now => {
                if since.elapsed() >= Duration::from_secs(3) {
                    return now;
                }
            }
            (_, now) => last = now.map(|now| (now, Instant::now())),
        }
        assert!(
            Instant::now() < deadline,
            "no single owner per partition {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

pub(crate) async fn run(server: &RedisServer, n: usize, assignor: Assignor) {
    println!("\n## {n} consumers, P = {PARTITIONS}, {assignor}, I = 1 s, {RATE} tasks/s\n");
    let name = unique_name("scale-consumers");
    let max_tasks = 600_000;
    let runs: Runs = Arc::new((0..max_tasks).map(|_| AtomicU32::new(0)).collect());
    let events: Events = Arc::default();
    let t0 = Instant::now();
    let mut fleet: Vec<Instance> = (0..n)
        .map(|i| start(server, &name, assignor, i, &runs, &events))
        .collect();
    wait_assigned(&fleet, Duration::from_secs(180)).await;
    let assigned = t0.elapsed();
    let owned = wait_owned(&events, Duration::from_secs(180), "after the start").await;
    println!("| step | figure |\n|---|---|");
    println!(
        "| until all {n} are assigned; each of {PARTITIONS} partitions with one owner, 3 s unchanged | {:.1} s; {:.1} s after starting them |",
        assigned.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    let most = (0..n)
        .map(|i| owned.iter().filter(|&&o| o == i).count())
        .max()
        .unwrap();
    println!(
        "| partitions of the busiest instance | {most} (P / N = {}) |",
        PARTITIONS as usize / n
    );

    // Tasks flow from here on.
    let producer = Producer::builder()
        .name(&name)
        .redis(server.url())
        .partitions(PARTITIONS)
        .connect()
        .await
        .unwrap();
    let producing = Arc::new(AtomicBool::new(true));
    let produced = {
        let producing = producing.clone();
        tokio::spawn(async move {
            let mut seq = 0_u64;
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while producing.load(Ordering::SeqCst) && seq + RATE / 10 < max_tasks as u64 {
                tick.tick().await;
                let batch: Vec<u64> = (seq..seq + RATE / 10).collect();
                producer.enqueue_batch(&batch).await.unwrap();
                seq += RATE / 10;
            }
            seq
        })
    };
    let load = redis_load::read(server).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let load = redis_load::since(server, &load).await;
    println!(
        "| Redis with tasks flowing, stable | {:.0} commands/s, CPU {:.1} % of a core, {} connections |",
        load.commands_per_sec, load.cpu_percent, load.clients
    );

    // LEAVING instances leave gracefully at once.
    let leave_at = SystemTime::now();
    let leaving: Vec<Instance> = fleet.drain(..LEAVING).collect();
    for l in &leaving {
        l.stop.cancel();
    }
    for l in leaving {
        assert!(
            l.leave(Duration::from_secs(60)).await,
            "a leaving instance did not finish in 60 s"
        );
    }
    let left_in = leave_at.elapsed().unwrap();
    let after = wait_owned(&events, Duration::from_secs(60), "after the leave").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    producing.store(false, Ordering::SeqCst);
    let enqueued = produced.await.unwrap() as usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    while runs[..enqueued]
        .iter()
        .any(|r| r.load(Ordering::SeqCst) == 0)
    {
        assert!(
            Instant::now() < deadline,
            "tasks not run 60 s after the last enqueue"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let twice = runs[..enqueued]
        .iter()
        .filter(|r| r.load(Ordering::SeqCst) > 1)
        .count();
    let extra = runs[enqueued..]
        .iter()
        .filter(|r| r.load(Ordering::SeqCst) > 0)
        .count();

    // The pauses of the partitions the leave moved: from the old owner's
    // stop to the new owner's start.
    let log = events.lock().await.clone();
    let mut pauses = Vec::new();
    for p in 0..PARTITIONS {
        if owned[p as usize] == after[p as usize] {
            continue;
        }
        let stopped = log.iter().find(|(i, e)| {
            *i == owned[p as usize]
                && e.partition == p
                && e.change == PartitionChange::Stopped
                && e.at >= leave_at
        });
        let started = log.iter().rev().find(|(i, e)| {
            *i == after[p as usize]
                && e.partition == p
                && matches!(e.change, PartitionChange::Started { .. })
        });
        if let (Some((_, s)), Some((_, a))) = (stopped, started) {
            pauses.push(a.at.duration_since(s.at).unwrap_or_default());
        }
    }
    pauses.sort();
    println!(
        "| {LEAVING} leave gracefully at once | all exited {:.1} s after the signal; {} partitions moved |",
        left_in.as_secs_f64(),
        pauses.len()
    );
    if !pauses.is_empty() {
        println!(
            "| pause of a moved partition (stop → start) | p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms |",
            percentile(&pauses, 0.5).as_secs_f64() * 1e3,
            percentile(&pauses, 0.99).as_secs_f64() * 1e3,
            pauses.last().unwrap().as_secs_f64() * 1e3
        );
    }
    println!(
        "| tasks | {enqueued} enqueued, each ran: once {}, twice or more {twice}; never enqueued but ran {extra} |",
        enqueued - twice
    );
    assert_eq!(
        (twice, extra),
        (0, 0),
        "a task ran twice, or one that was never enqueued ran"
    );
    for i in &fleet {
        i.stop.cancel();
    }
    for i in fleet {
        i.leave(Duration::from_secs(60)).await;
    }
}
