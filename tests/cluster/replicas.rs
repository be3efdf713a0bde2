//! `wait_for_replicas` on a Cluster with a replica per master, each test on
//! a cluster of its own: a replica frozen (SIGSTOP) acknowledges none of
//! its master's writes, so every write peerq promises to confirm must come
//! back `NotReplicated` (an enqueue) or be held until confirmed (a drain's
//! acks, and so its release mark), and every one must succeed once the
//! replica runs. `WAIT` counts only the writes of the connection it is
//! sent on: one sent anywhere else answers at once.

use peerq::assignment::Standing;
use peerq::consumer::{PartitionChange, PartitionEvent};
use support::slot_of;
use tokio::sync::broadcast;

use super::*;

/// The replicas and timeout every test here waits for.
const WAIT: (u32, Duration) = (1, Duration::from_millis(100));

/// A producer of service `name` on `cluster` that waits for a replica.
async fn waiting_producer(cluster: &RedisCluster, name: &str) -> Producer {
    let producer = Producer::builder()
        .redis(peerq::Redis::cluster(cluster.seed_urls()).wait_for_replicas(WAIT.0, WAIT.1))
        .name(name)
        .connect()
        .await
        .unwrap();
    // Every partition once, confirmed: the replicas have synced.
    let all: Vec<Job> = (0..1000).map(|seq| Job { seq }).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while let Err(e) = producer.enqueue_batch(&all).await {
        assert!(std::time::Instant::now() < deadline, "never confirmed: {e}");
    }
    producer
}

/// A partition key of service `name` whose partition's keys are on
/// `master`, and that partition.
fn key_on(cluster: &RedisCluster, name: &str, master: &support::NodeInfo) -> (String, u32) {
    (0..)
        .map(|i| format!("key-{i}"))
        .map(|key| {
            let p = peerq::partition_of(key.as_bytes(), 64);
            (key, p)
        })
        .find(|(_, p)| cluster.master_of_key(&format!("{{{name}/{p}}}:stream")).id == master.id)
        .expect("some partition is on every master")
}

/// The enqueues of one task each with partition key `key`: without
/// options (an `XADD`), and with an idempotency key (the enqueue script).
struct Enqueues<'a> {
    producer: &'a Producer,
    key: String,
}

impl Enqueues<'_> {
    async fn plain(&self) -> peerq::Result<peerq::TaskId> {
        let options = Options::new().key(&self.key);
        self.producer.enqueue_with(Job { seq: 0 }, options).await
    }

    async fn once(&self, seq: u64) -> peerq::Result<peerq::TaskId> {
        let options = Options::new()
            .key(&self.key)
            .idempotency_key(format!("once-{seq}"));
        self.producer.enqueue_with(Job { seq }, options).await
    }
}

/// `sent` failed with the error the README names: no replica confirmed.
fn assert_not_replicated<T: std::fmt::Debug>(sent: peerq::Result<T>, what: &str) {
    match sent {
        Err(peerq::Error::NotReplicated {
            wanted: 1, got: 0, ..
        }) => {}
        other => panic!("{what}: {other:?}, not NotReplicated"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_to_a_master_whose_replica_is_frozen_are_not_replicated() {
    let cluster = RedisCluster::start(3, 1);
    let name = unique_name("wr");
    let producer = waiting_producer(&cluster, &name).await;
    let master = cluster.masters().remove(0);
    let replica = cluster.replicas_of(&master).remove(0);
    let (key, _) = key_on(&cluster, &name, &master);
    let streams: Vec<String> = (0..64).map(|p| format!("{{{name}/{p}}}:stream")).collect();
    let on_master: Vec<bool> = cluster
        .masters_of_keys(&streams)
        .iter()
        .map(|m| m.id == master.id)
        .collect();
    let one = Enqueues {
        producer: &producer,
        key,
    };
    // A third of the partitions are on that master.
    let batch: Vec<Job> = (0..200).map(|seq| Job { seq }).collect();

    cluster.freeze(&replica);
    // Batches of one task each, a third of them to that master: one
    // `WAIT` each, where a `WAIT` sent elsewhere answers at once.
    let mut singles = Vec::new();
    for seq in 0..30 {
        singles.push(producer.enqueue_batch(&[Job { seq }]).await);
    }
    let sent = (
        producer.enqueue_batch(&batch).await,
        one.plain().await,
        one.once(1).await,
    );
    tokio::task::block_in_place(|| {
        cluster.thaw(&replica);
        // Caught up, so the calls below are confirmed at once.
        cluster.wait_replicated(&master);
    });
    let mut refused = 0;
    for single in singles {
        match single {
            Ok(ids) => {
                let p = peerq::partition_of(ids[0].as_str().as_bytes(), 64);
                assert!(
                    !on_master[p as usize],
                    "a batch to partition {p}, on the master whose replica is frozen, returned Ok"
                );
            }
            err @ Err(_) => {
                assert_not_replicated(err, "enqueue_batch of one task");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "no batch of one went to that master");
    assert_not_replicated(sent.0, "enqueue_batch");
    assert_not_replicated(sent.1, "enqueue_with");
    assert_not_replicated(sent.2, "enqueue_with an idempotency key");

    // With the replica running, the same calls succeed.
    producer.enqueue_batch(&[Job { seq: 0 }]).await.unwrap();
    producer.enqueue_batch(&batch).await.unwrap();
    one.plain().await.unwrap();
    one.once(2).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_redirected_to_another_master_waits_for_that_masters_replica() {
    let cluster = RedisCluster::start(3, 1);
    let name = unique_name("wm");
    let producer = waiting_producer(&cluster, &name).await;
    let masters = cluster.masters();
    let (source, target) = (&masters[0], &masters[1]);
    let replica = cluster.replicas_of(target).remove(0);
    let (key, p) = key_on(&cluster, &name, source);
    let one = Enqueues {
        producer: &producer,
        key,
    };
    one.once(0).await.unwrap();

    // The partition's slot half moved, its keys all on the target: the
    // source answers `ASK`, and the target takes the writes. (Not the
    // enqueue script's: some of its keys are on neither node, and Redis
    // answers `TRYAGAIN` to a command of several keys until the slot has
    // moved.)
    let mut migration = cluster.begin_migration(slot_of(&format!("{{{name}/{p}}}:stream")), target);
    while migration.step(100) {}
    cluster.freeze(&replica);
    let asked = one.plain().await;
    tokio::task::block_in_place(|| {
        cluster.thaw(&replica);
        // Caught up, so the calls below are confirmed at once.
        cluster.wait_replicated(target);
    });
    assert_not_replicated(asked, "enqueue_with after ASK");
    one.plain().await.unwrap();

    // The slot moved: the source answers `MOVED`.
    migration.finish();
    cluster.freeze(&replica);
    let moved = (one.plain().await, one.once(3).await);
    tokio::task::block_in_place(|| {
        cluster.thaw(&replica);
        // Caught up, so the calls below are confirmed at once.
        cluster.wait_replicated(target);
    });
    assert_not_replicated(moved.0, "enqueue_with after MOVED");
    assert_not_replicated(moved.1, "enqueue_with an idempotency key after MOVED");
    one.plain().await.unwrap();
    one.once(4).await.unwrap();
}

/// A consumer of service `name` that waits for a replica, with its
/// partition events and standing.
struct Watched {
    instance: Instance,
    events: broadcast::Receiver<PartitionEvent>,
}

impl Watched {
    fn start(cluster: &RedisCluster, name: &str, handler: Recorder) -> Watched {
        support::init_tracing();
        let builder = Consumer::builder()
            .redis(peerq::Redis::cluster(cluster.seed_urls()).wait_for_replicas(WAIT.0, WAIT.1))
            .name(name)
            .handler(handler);
        let (events, standing) = (builder.partition_events(), builder.standing());
        let stop = CancellationToken::new();
        let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
        Watched {
            instance: Instance {
                stop,
                task,
                standing,
            },
            events,
        }
    }

    /// When each of `partitions` started here, waiting for them all.
    async fn started(&mut self, partitions: &BTreeSet<u32>) -> BTreeMap<u32, u128> {
        let mut started = BTreeMap::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while started.len() < partitions.len() {
            let event = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("started only {started:?} of {partitions:?}"))
                .unwrap();
            if let PartitionChange::Started { .. } = event.change
                && partitions.contains(&event.partition)
            {
                let at = event.at.duration_since(std::time::UNIX_EPOCH).unwrap();
                started.insert(event.partition, at.as_millis());
            }
        }
        started
    }

    /// The partitions its first assignment gives it.
    async fn assigned(&mut self) -> BTreeSet<u32> {
        let standing = tokio::time::timeout(
            Duration::from_secs(30),
            self.instance
                .standing
                .wait_for(|standing| matches!(standing, Standing::Assigned(_))),
        )
        .await
        .expect("never assigned")
        .unwrap();
        match &*standing {
            Standing::Assigned(a) => a.owned_partitions(64).into_iter().collect(),
            _ => unreachable!(),
        }
    }
}

/// Partition `p`'s release mark of service `name` and when it was written
/// (ms since the Unix epoch, Redis's clock), if any.
fn mark(cluster: &RedisCluster, name: &str, p: u32) -> Option<(u64, u128)> {
    let mut hmget = deadpool_redis::redis::cmd("HMGET");
    hmget
        .arg(format!("{{{name}}}:transition"))
        .arg(p)
        .arg(format!("{p}:at"));
    let (epoch, at): (Option<u64>, Option<u128>) = cluster.query(&hmget).unwrap();
    epoch.zip(at)
}

/// A partition key whose partition is `p`.
fn key_of(p: u32) -> String {
    (0..)
        .map(|i| format!("key-{i}"))
        .find(|key| peerq::partition_of(key.as_bytes(), 64) == p)
        .expect("every partition has keys")
}

/// Enqueues task `seq` into each of `partitions`, from `seq` on; returns
/// the next seq.
async fn one_each(producer: &Producer, partitions: &BTreeSet<u32>, mut seq: u64) -> u64 {
    for &p in partitions {
        producer
            .enqueue_with(Job { seq }, Options::new().key(key_of(p)))
            .await
            .unwrap();
        seq += 1;
    }
    seq
}

/// When a partition started on its new owner (ms since the Unix epoch), and
/// its release mark then: the epoch, and when it was written (Redis's
/// clock), if any.
type Started = (u128, Option<(u64, u128)>);

/// Instance A owns every partition and has run a task on each partition of
/// a master (not the one of the service's own keys) whose replica is
/// frozen, if `frozen`; instance B joins, and A drains the partitions B
/// takes over. `check` is given, for each of that master's partitions B
/// took, when B started it and A's release mark then; then every task must
/// have run once, and B run the partitions it took.
async fn handover(frozen: bool, check: impl FnOnce(BTreeMap<u32, Started>)) {
    let cluster = RedisCluster::start(3, 1);
    let name = unique_name(if frozen { "df" } else { "dr" });
    let own = cluster.master_of_key(&format!("{{{name}}}:transition"));
    let master = cluster
        .masters()
        .into_iter()
        .find(|m| m.id != own.id)
        .unwrap();
    let replica = cluster.replicas_of(&master).remove(0);
    let streams: Vec<String> = (0..64).map(|p| format!("{{{name}/{p}}}:stream")).collect();
    let there: BTreeSet<u32> = (0..64)
        .zip(cluster.masters_of_keys(&streams))
        .filter(|(_, m)| m.id == master.id)
        .map(|(p, _)| p)
        .collect();
    let record = Recorder::default();
    let a = Watched::start(&cluster, &name, record.for_instance(0));
    let producer = producer(&cluster, &name).await;
    // A task on every partition: once A ran them all, it has acquired
    // every partition (its owner records confirmed).
    let mut seq = one_each(&producer, &(0..64).collect(), 0).await;
    wait_until(
        Duration::from_secs(30),
        "A ran a task of each partition",
        || record.distinct() as u64 == seq,
    )
    .await;

    // A task on each of the master's partitions, run by A; with the
    // replica frozen, none of their acks is confirmed.
    if frozen {
        cluster.freeze(&replica);
    }
    seq = one_each(&producer, &there, seq).await;
    wait_until(Duration::from_secs(30), "A ran every task", || {
        record.distinct() as u64 == seq
    })
    .await;

    let mut b = Watched::start(&cluster, &name, record.for_instance(1));
    let moved: BTreeSet<u32> = b.assigned().await.intersection(&there).copied().collect();
    assert!(!moved.is_empty(), "B takes none of {there:?}");
    let started = b.started(&moved).await;
    check(
        started
            .iter()
            .map(|(&p, &at)| (p, (at, mark(&cluster, &name, p))))
            .collect(),
    );

    if frozen {
        tokio::task::block_in_place(|| cluster.thaw(&replica));
    }
    // Every task ran once, and B runs the partitions it took.
    seq = one_each(&producer, &moved, seq).await;
    let instances = [a.instance, b.instance];
    wait_all_ran(&record, &instances, seq).await;
    record.assert_each_once(seq);
    for instance in instances {
        instance.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_whose_acks_are_not_replicated_writes_no_mark_and_its_successor_waits_for_the_deadline()
 {
    handover(true, |seen| {
        for (p, (started, mark)) in seen {
            // A mark, if any by then, was written after B started: B did
            // not wait for it but for the deadline.
            if let Some((epoch, at)) = mark {
                assert!(
                    at > started,
                    "partition {p}: marked released (epoch {epoch}) at {at} ms, before its \
                     successor started at {started} ms, with the drain's acks on no replica"
                );
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_whose_acks_are_replicated_marks_its_release_and_its_successor_starts_on_it() {
    handover(false, |seen| {
        for (p, (started, mark)) in seen {
            let (_, at) = mark.unwrap_or_else(|| panic!("partition {p}: no mark when B started"));
            assert!(
                at <= started,
                "partition {p}: marked at {at} ms, started at {started} ms"
            );
        }
    })
    .await;
}
