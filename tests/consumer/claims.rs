//! The owner's periodic claim (the design's handover rule 8): an entry
//! left pending on a consumer that will never ack it is claimed by the
//! partition's owner once it has been idle for `claim_idle`, and runs again
//! with `attempt + 1`. Two ways an entry gets there, with real Redis:
//!
//! - a read of the owner's own whose reply never arrived (a read command
//!   the network delayed past the client's timeout and the owner's re-read
//!   of its pending list) left it in the owner's own pending list (an ack
//!   that Redis refuses is not such a way: the acker sends it again until
//!   it lands, see `tests/consumer/memory.rs`);
//! - a consumer that is not the owner anymore (cut off by a proxy that
//!   holds its traffic) had a read reach Redis late, which delivered the
//!   entry into its pending list after the new owner had acquired the
//!   partition (so the acquire's claim could not see it). A consumer's own
//!   reads end with its lease, so only a network delay of the command can
//!   do this; the test issues that late read itself.
//!
//! In both, the owner's claim on acquire has already run, so only the
//! periodic claim can pick the entry up.

use crate::producer;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, AsyncCommands};
use peerq::assignment::Standing;
use peerq::consumer::{ConsumerBuilder, PartitionChange, PartitionEvent};
use peerq::handler::HandlerService;
use peerq::{Bincode, Codec};
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use serde::{Deserialize, Serialize};
use support::{Proxy, RedisServer, unique_name, wait_until};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);
/// Short, so the test waits seconds, not the default 30 s.
const CLAIM_IDLE: Duration = Duration::from_secs(2);
/// The default read block: the fetch loop looks at its claim timer when a
/// read returns, so a claim may come up to one block after it is due.
const BLOCK: Duration = Duration::from_secs(1);
/// Slack on the upper bound for a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Each handler run: seq → (attempt, when it started), in order.
type Runs = Arc<Mutex<BTreeMap<u64, Vec<(u32, Instant)>>>>;

fn runs_of(runs: &Runs, seq: u64) -> Vec<(u32, Instant)> {
    runs.lock().unwrap().get(&seq).cloned().unwrap_or_default()
}

/// A handler that records every run in `runs`.
#[derive(Clone)]
struct Recorder {
    runs: Runs,
}

impl Handler for Recorder {
    type Task = Job;
    async fn handle(&self, job: Job, cx: TaskContext) -> Result<(), HandlerError> {
        self.runs
            .lock()
            .unwrap()
            .entry(job.seq)
            .or_default()
            .push((cx.attempt(), Instant::now()));
        Ok(())
    }
}

type Builder = ConsumerBuilder<Job, HandlerService<Recorder>, Bincode>;

/// A consumer whose handler records every run in `runs`.
fn builder(url: &str, name: &str, partitions: u32, runs: &Runs) -> Builder {
    support::init_tracing();
    Consumer::builder()
        .name(name)
        .redis(url)
        .partitions(partitions)
        .claim_idle(CLAIM_IDLE)
        .block(BLOCK)
        .handler(Recorder { runs: runs.clone() })
}

fn stream(name: &str, p: u32) -> String {
    format!("{{{name}/{p}}}:stream")
}

/// The pending entries of partition `p`: (entry id, consumer).
async fn pending_entries(
    conn: &mut deadpool_redis::Connection,
    name: &str,
    p: u32,
) -> Vec<(String, String)> {
    let reply: redis::streams::StreamPendingCountReply = conn
        .xpending_count(stream(name, p), "peerq", "-", "+", 100)
        .await
        .unwrap();
    reply.ids.into_iter().map(|e| (e.id, e.consumer)).collect()
}

/// The instance id recorded as `p`'s owner (`<token>:<id>`).
async fn owner_of(conn: &mut deadpool_redis::Connection, name: &str, p: u32) -> String {
    let record: String = conn.get(format!("{{{name}/{p}}}:owner")).await.unwrap();
    let (_, id) = record.split_once(':').expect("<token>:<id>");
    id.to_owned()
}

/// Waits until nothing of `name` is pending any more.
async fn wait_nothing_pending(conn: &mut deadpool_redis::Connection, name: &str, partitions: u32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut left = Vec::new();
        for p in 0..partitions {
            left.extend(pending_entries(conn, name, p).await);
        }
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "still pending: {left:?}");
        tokio::time::sleep(50 * MS).await;
    }
}

/// `rerun` happened after the entry had been idle `CLAIM_IDLE` (counted
/// from `enqueued`, before its delivery), and within one claim period and
/// one read block after it became claimable at `idle_from` (plus slack).
fn assert_claimed_in_time(seq: u64, enqueued: Instant, idle_from: Instant, rerun: Instant) {
    let after = rerun - enqueued;
    let upper = (idle_from - enqueued) + CLAIM_IDLE + CLAIM_IDLE / 3 + BLOCK + SLACK;
    eprintln!(
        "seq {seq}: ran again {:.3}s after its enqueue (claim_idle {:.1}s, bound {:.3}s)",
        after.as_secs_f64(),
        CLAIM_IDLE.as_secs_f64(),
        upper.as_secs_f64()
    );
    assert!(
        after >= CLAIM_IDLE,
        "seq {seq} ran again {after:?} after its enqueue, before claim_idle"
    );
    assert!(
        after <= upper,
        "seq {seq} ran again {after:?} after its enqueue, later than {upper:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_whose_read_reply_never_arrived_is_claimed_by_its_owner_after_claim_idle() {
    const P: u32 = 2;
    let server = RedisServer::start();
    let name = unique_name("lost-read");
    let mut conn = server.pool().get().await.unwrap();
    let runs = Runs::default();
    let consumer = builder(&server.url(), &name, P, &runs);
    let mut events = consumer.partition_events();
    let stop = CancellationToken::new();
    let task = tokio::spawn(consumer.run_until(stop.clone().cancelled_owned()));
    // Every partition acquired: the claim on acquire (idle 0) has run.
    let mut started = BTreeSet::new();
    while started.len() < P as usize {
        let e = tokio::time::timeout(Duration::from_secs(15), events.recv())
            .await
            .expect("partitions start")
            .unwrap();
        if let PartitionChange::Started { .. } = e.change {
            started.insert(e.partition);
        }
    }
    // The fetch loop records its owner after the partition has started.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !conn
        .exists::<_, bool>(format!("{{{name}/0}}:owner"))
        .await
        .unwrap()
    {
        assert!(Instant::now() < deadline, "partition 0 has no owner record");
        tokio::time::sleep(10 * MS).await;
    }
    let owner = owner_of(&mut conn, &name, 0).await;
    // A task the owner reads itself, and runs: its fetch loop has passed
    // the re-read of its own pending list that a partition starts with
    // (which would find the entry below at once, as it should), and
    // reads only new entries now.
    let first = Bincode.encode(&Job { seq: 0 }).unwrap();
    let _: String = redis::cmd("XADD")
        .arg(stream(&name, 0))
        .arg("*")
        .arg(&[
            ("id", "first-0"),
            ("attempt", "1"),
            ("enqueued_at", "1"),
            ("codec", "bincode"),
        ])
        .arg("payload")
        .arg(first)
        .query_async(&mut *conn)
        .await
        .unwrap();
    wait_until(Duration::from_secs(10), "the first task to run", || {
        !runs_of(&runs, 0).is_empty()
    })
    .await;

    // One entry read into the owner's own pending list by a read whose
    // reply the owner never saw: a read command the network delayed past
    // the client's timeout and its re-read of the pending list. The test
    // issues that read itself, in one script with the XADD, so the owner's
    // waiting read cannot take the entry first.
    let enqueued = Instant::now();
    let payload = Bincode.encode(&Job { seq: 1 }).unwrap();
    let enqueued_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    let () = redis::Script::new(LATE_READ)
        .key(stream(&name, 0))
        .arg("lost-1")
        .arg(enqueued_ms)
        .arg(payload)
        .arg(&owner)
        .invoke_async(&mut *conn)
        .await
        .unwrap();
    let delivered = Instant::now();
    let pending = pending_entries(&mut conn, &name, 0).await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].1, owner, "pending on the owner's own consumer");

    // Tasks enqueued meanwhile run at once, once.
    let producer = producer(&server.url(), &name, P).await;
    let later: Vec<Job> = (2..12).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&later).await.unwrap();
    wait_until(Duration::from_secs(10), "the later tasks to run", || {
        (2..12).all(|seq| !runs_of(&runs, seq).is_empty())
    })
    .await;
    assert!(
        runs_of(&runs, 1).is_empty(),
        "the owner never saw the entry, so only its claim can run it"
    );

    wait_until(Duration::from_secs(15), "the lost entry to run", || {
        !runs_of(&runs, 1).is_empty()
    })
    .await;
    let ran = runs_of(&runs, 1);
    assert_eq!(ran.len(), 1, "{ran:?}");
    assert_eq!(ran[0].0, 2, "taken over with attempt + 1");
    assert_claimed_in_time(1, enqueued, delivered, ran[0].1);
    wait_nothing_pending(&mut conn, &name, P).await;
    for seq in 2..12 {
        let r = runs_of(&runs, seq);
        assert_eq!(r.len(), 1, "seq {seq}: {r:?}");
        assert_eq!(r[0].0, 1, "seq {seq}: {r:?}");
    }
    // Nothing runs twice.
    tokio::time::sleep(CLAIM_IDLE).await;
    assert_eq!(runs_of(&runs, 1).len(), 1);
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// Adds one entry to `KEYS[1]` in the documented entry format (`id`,
/// `attempt`, `enqueued_at`, `codec`, `payload` = `ARGV[1..3]`) and reads it
/// into consumer `ARGV[4]`'s pending list, in one step.
const LATE_READ: &str = r"
redis.call('XADD', KEYS[1], '*', 'id', ARGV[1], 'attempt', '1',
  'enqueued_at', ARGV[2], 'codec', 'bincode', 'payload', ARGV[3])
redis.call('XREADGROUP', 'GROUP', 'peerq', ARGV[4], 'COUNT', 1, 'STREAMS', KEYS[1], '>')
";

/// A consumer instance in this process.
struct Instance {
    stop: CancellationToken,
    task: JoinHandle<peerq::Result<()>>,
    standing: tokio::sync::watch::Receiver<Standing>,
    events: Arc<Mutex<Vec<PartitionEvent>>>,
}

impl Instance {
    fn start(builder: Builder) -> Instance {
        let standing = builder.standing();
        let mut rx = builder.partition_events();
        let events = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn({
            let events = events.clone();
            async move {
                while let Ok(e) = rx.recv().await {
                    events.lock().unwrap().push(e);
                }
            }
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
        Instance {
            stop,
            task,
            standing,
            events,
        }
    }

    fn replicas(&self) -> Option<u32> {
        self.standing.borrow().assignment().map(|a| a.replicas)
    }

    /// The partitions this instance works on now (started, not stopped).
    fn owned(&self) -> BTreeSet<u32> {
        let mut owned = BTreeSet::new();
        for e in self.events.lock().unwrap().iter() {
            match e.change {
                PartitionChange::Started { .. } => {
                    owned.insert(e.partition);
                }
                PartitionChange::Stopped => {
                    owned.remove(&e.partition);
                }
                _ => {}
            }
        }
        owned
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_a_cut_off_former_owner_read_late_is_claimed_by_the_new_owner_after_claim_idle() {
    const P: u32 = 4;
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let name = unique_name("late-read");
    let runs = Runs::default();
    let mut conn = server.pool().get().await.unwrap();
    // A reaches Redis through the proxy, which will cut it off. B is direct.
    let a = Instance::start(
        builder(&proxy.url(), &name, P, &runs).leave_timeout(Duration::from_millis(100)),
    );
    let b = Instance::start(builder(&server.url(), &name, P, &runs));
    wait_until(
        Duration::from_secs(20),
        "two replicas, each with its partitions",
        || {
            a.replicas() == Some(2)
                && b.replicas() == Some(2)
                && a.owned().len() == 2
                && b.owned().len() == 2
        },
    )
    .await;
    // Let A's readers block on the server.
    tokio::time::sleep(500 * MS).await;
    let a_partitions = a.owned();
    let a_id = owner_of(&mut conn, &name, *a_partitions.first().unwrap()).await;
    eprintln!("A ({a_id}) owns {a_partitions:?}");

    // Cut A off: nothing it sends from now on arrives.
    proxy.hold();
    wait_until(Duration::from_secs(20), "B to own every partition", || {
        b.owned().len() == P as usize
    })
    .await;
    for &p in &a_partitions {
        let owner = owner_of(&mut conn, &name, p).await;
        assert_ne!(owner, a_id, "partition {p} is B's now");
        assert!(
            pending_entries(&mut conn, &name, p).await.is_empty(),
            "nothing pending when B acquired"
        );
    }

    // One task into each of A's former partitions, taken by a read of A's
    // that reached Redis late: a read command the network delayed past A's
    // lease (A's own reads end with its lease, so only such a delay leaves
    // an entry with a former owner). The test issues that read itself, in
    // one script with the XADD, so B's waiting read cannot take the entry
    // first.
    let enqueued = Instant::now();
    let mut stuck = Vec::new();
    for (seq, &p) in (100..).zip(&a_partitions) {
        let payload = Bincode.encode(&Job { seq }).unwrap();
        let enqueued_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis()
            .to_string();
        let () = redis::Script::new(LATE_READ)
            .key(stream(&name, p))
            .arg(format!("late-{seq}"))
            .arg(enqueued_ms)
            .arg(payload)
            .arg(&a_id)
            .invoke_async(&mut *conn)
            .await
            .unwrap();
        stuck.push(seq);
    }
    let delivered = Instant::now();
    for &p in &a_partitions {
        let pending = pending_entries(&mut conn, &name, p).await;
        assert_eq!(
            pending.len(),
            1,
            "partition {p}: the entry went to a read: {pending:?}"
        );
        assert_eq!(
            pending[0].1, a_id,
            "partition {p}: delivered to the former owner A, not to B"
        );
    }
    // More tasks, everywhere: B runs them at once.
    let producer = producer(&server.url(), &name, P).await;
    let later: Vec<Job> = (0..40).map(|seq| Job { seq }).collect();
    producer.enqueue_batch(&later).await.unwrap();

    wait_until(
        Duration::from_secs(20),
        "B to claim and run the stuck tasks",
        || stuck.iter().all(|&seq| !runs_of(&runs, seq).is_empty()),
    )
    .await;
    for &seq in &stuck {
        let r = runs_of(&runs, seq);
        // A never ran it (it never saw the read's reply): the claim's
        // take-over enqueues it again with attempt + 1, as it cannot know.
        assert_eq!(r.len(), 1, "seq {seq}: {r:?}");
        assert_eq!(r[0].0, 2, "seq {seq}: taken over with attempt + 1");
        assert_claimed_in_time(seq, enqueued, delivered, r[0].1);
    }
    wait_until(Duration::from_secs(10), "the later tasks to run", || {
        (0..40).all(|seq| !runs_of(&runs, seq).is_empty())
    })
    .await;
    wait_nothing_pending(&mut conn, &name, P).await;
    for seq in 0..40 {
        let r = runs_of(&runs, seq);
        assert_eq!(r.len(), 1, "seq {seq}: {r:?}");
        assert_eq!(r[0].0, 1, "seq {seq}: {r:?}");
    }

    b.stop.cancel();
    b.task.await.unwrap().unwrap();
    // A cannot reach Redis: it leaves at once after its leave timeout and
    // abandons what is underway; its end result does not matter here.
    a.stop.cancel();
    if tokio::time::timeout(Duration::from_secs(10), a.task)
        .await
        .is_err()
    {
        eprintln!("A did not stop within 10 s");
    }
    drop(proxy);
}
