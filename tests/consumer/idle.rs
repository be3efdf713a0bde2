//! What an instance costs Redis in connections: a few, whatever its number
//! of partitions, busy or idle. Busy partitions read on the instance's
//! lanes (its two shared connections, and two more while a backlog is
//! read); the partitions read out wait together in one blocking read on a
//! connection of its own, which must still hand each of them its new
//! entries.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis;
use peerq::admin::Admin;
use peerq::consumer::PartitionChange;
use peerq::producer::Producer;
use peerq::tracking::Tracking;
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

/// Partitions: many more than connections.
const P: u32 = 128;
/// The most connections an idle instance may hold.
const MOST: usize = 4;
/// The most an idle instance may hold with tracking on: one more, its
/// subscription to `{N}:cancels`.
const MOST_TRACKED: usize = MOST + 1;
/// The most while it reads a backlog: two busy lanes more.
const MOST_BUSY: usize = MOST + 2;
/// How soon after its last read a busy lane is let go, at most (2 s, and
/// a look every 0.5 s), with time to spare on a loaded machine.
const LET_GO: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// How often each seq ran.
#[derive(Clone, Default)]
struct Runs(Arc<Mutex<BTreeMap<u64, u32>>>);

impl Handler for Runs {
    type Task = Job;
    async fn handle(&self, job: Job, _cx: TaskContext) -> Result<(), HandlerError> {
        *self.0.lock().unwrap().entry(job.seq).or_default() += 1;
        Ok(())
    }
}

impl Runs {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Every seq in `0..n` ran exactly once.
    fn assert_each_once(&self, n: u64) {
        let runs = self.0.lock().unwrap();
        let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
        assert!(twice.is_empty(), "ran more than once: {twice:?}");
        let missing: Vec<u64> = (0..n).filter(|s| !runs.contains_key(s)).collect();
        assert!(missing.is_empty(), "never ran: {missing:?}");
        assert_eq!(runs.len() as u64, n, "seqs outside 0..{n} ran");
    }
}

/// Clients connected to `server` other than `probe` itself.
async fn clients(probe: &mut redis::aio::MultiplexedConnection) -> usize {
    client_list(probe).await.len()
}

/// The `CLIENT LIST` lines of every client but `probe`.
async fn client_list(probe: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    let me: u64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(probe)
        .await
        .unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(probe)
        .await
        .unwrap();
    list.lines()
        .filter(|l| !l.starts_with(&format!("id={me} ")))
        .map(str::to_owned)
        .collect()
}

async fn enqueue(url: &str, name: &str, seqs: std::ops::Range<u64>) {
    let producer = Producer::builder()
        .name(name)
        .redis(url)
        .partitions(P)
        .connect()
        .await
        .unwrap();
    let jobs: Vec<Job> = seqs.map(|seq| Job { seq }).collect();
    for chunk in jobs.chunks(1000) {
        producer.enqueue_batch(chunk).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_holds_six_connections_busy_and_four_idle_five_tracked_and_every_idle_partition_gets_its_tasks()
 {
    support::init_tracing();
    let server = RedisServer::start();
    let url = server.url();
    let name = unique_name("idle");
    let mut probe = server.connection().await;
    // A backlog first, its producer gone before the instance starts, so
    // every other client is the instance's.
    const BACKLOG: u64 = 20_000;
    enqueue(&url, &name, 0..BACKLOG).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while clients(&mut probe).await > 0 {
        assert!(
            Instant::now() < deadline,
            "the producer's connections stay open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let runs = Runs::default();
    let stop = CancellationToken::new();
    let builder = Consumer::builder()
        .name(&name)
        .redis(&url)
        .partitions(P)
        .handler(runs.clone());
    let mut events = builder.partition_events();
    let instance = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));

    // Busy: the backlog, read by every partition at once.
    let mut most = Vec::new();
    let started = Instant::now();
    while runs.count() < BACKLOG as usize {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the backlog did not run: {} of {BACKLOG}",
            runs.count()
        );
        let now = client_list(&mut probe).await;
        if now.len() > most.len() {
            most = now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    runs.assert_each_once(BACKLOG);
    assert!(
        most.len() <= MOST_BUSY,
        "{} connections while busy, at most {MOST_BUSY} expected: {most:#?}",
        most.len()
    );
    let mut owned = std::collections::BTreeSet::new();
    while let Ok(event) = events.try_recv() {
        if matches!(event.change, PartitionChange::Started { .. }) {
            owned.insert(event.partition);
        }
    }
    assert_eq!(owned.len() as u32, P, "the instance owns every partition");

    // Idle: every partition read out and waiting in the one blocking read,
    // the busy lanes let go.
    let read_out = Instant::now();
    loop {
        let idle = client_list(&mut probe).await;
        if idle.len() <= MOST {
            break;
        }
        assert!(
            read_out.elapsed() < LET_GO,
            "{} connections {LET_GO:?} after the backlog ran, at most {MOST} expected: {idle:#?}",
            idle.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And it stays there.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = clients(&mut probe).await;
    assert!(idle <= MOST, "{idle} connections while idle");

    // Tracking switched on while it runs: one connection more, the
    // subscription to `{N}:cancels`, and no more (the admin's is closed).
    {
        let admin = Admin::connect(url.as_str()).await.unwrap();
        let service = admin.service(&name).await.unwrap();
        service.set_tracking(Tracking::on()).await.unwrap();
    }
    let switched = Instant::now();
    loop {
        let now = client_list(&mut probe).await;
        if now.len() == idle + 1 {
            break;
        }
        assert!(
            switched.elapsed() < LET_GO,
            "{} connections with tracking on, {} expected: {now:#?}",
            now.len(),
            idle + 1
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tracked = clients(&mut probe).await;
    assert!(
        tracked <= MOST_TRACKED,
        "{tracked} connections while idle with tracking on"
    );

    // New tasks, a few at a time, reach partitions that all wait idle.
    const MORE: u64 = 600;
    let producer = Producer::builder()
        .name(&name)
        .redis(&url)
        .partitions(P)
        .connect()
        .await
        .unwrap();
    for seq in BACKLOG..BACKLOG + MORE {
        producer.enqueue(Job { seq }).await.unwrap();
        if seq % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    wait_until(
        Duration::from_secs(20),
        "the tasks enqueued while idle ran",
        || runs.count() as u64 == BACKLOG + MORE,
    )
    .await;
    runs.assert_each_once(BACKLOG + MORE);

    stop.cancel();
    instance.await.unwrap().unwrap();
}
