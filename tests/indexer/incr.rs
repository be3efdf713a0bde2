//! The seed's indexing (`Indexing::Incr`) end to end, next to `Ranked`:
//! ten consumers per service with stable membership, tasks flowing, sixty
//! epochs. `Incr` indices can swap between instances whose rounds reach
//! Redis in a different order from one interval to the next, and every swap
//! moves the partitions of both through the handover (docs/design.md §2,
//! §4). The test counts the swaps and the partitions they moved, and checks
//! that every task still ran exactly once through them.
//!
//! The consumers reach Redis through a proxy that adds a little jitter:
//! without it, swaps need two offsets within a millisecond or so, and some
//! runs have none.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use peerq::assignment::Standing;
use peerq::consumer::{PartitionChange, PartitionEvent};
use peerq::handler::Task;
use peerq::producer::Producer;
use peerq::{Consumer, HandlerError, Indexing};
use serde::{Deserialize, Serialize};
use support::{Proxy, RedisServer, unique_name, wait_until};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);
const INTERVAL: Duration = Duration::from_secs(1);
const DRAIN: Duration = Duration::from_millis(300);
const INSTANCES: usize = 10;
/// Epoch changes measured after the warm-up.
const EPOCHS: u64 = 60;
/// The default partition count, spelled out for the owner arithmetic.
const PARTITIONS: u32 = 64;
/// The most the proxy delays a chunk, either way: rounds whose offsets lie
/// closer than the resulting jitter can reach Redis in either order. The
/// proxy's own threads, on a loaded machine, add more.
const JITTER: Duration = Duration::from_millis(10);
/// The lease margin covers a round's latency (docs/design.md §2), which the
/// proxy raises (its threads wake late under load, and bytes that arrive
/// while a chunk waits wait for the next one). With the default 20 ms, an
/// instance whose offset lies near `I/2` can see its lease lapse before its
/// next assignment arrives, in either mode, and fence itself.
const LEASE_MARGIN: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Everything one service's instances report.
#[derive(Default)]
struct World {
    /// Completed handler runs: seq -> how many times.
    done: Mutex<HashMap<u64, u32>>,
    /// Runs on a later attempt (an entry a release left pending, taken over).
    taken_over: Mutex<u64>,
    /// Per partition, the instances running one of its tasks right now.
    running: Mutex<HashMap<u32, Vec<usize>>>,
    /// Two instances running tasks of one partition at once.
    overlaps: Mutex<Vec<String>>,
    /// Every partition event of each instance.
    events: Mutex<Vec<(usize, PartitionEvent)>>,
    /// Events the recorder missed (it fell behind): the counts would be off.
    lagged: Mutex<u64>,
    /// Every standing each instance published, in order.
    standings: Mutex<Vec<(usize, Standing)>>,
}

impl World {
    async fn run_task(&self, instance: usize, task: Task<Job>) -> Result<(), HandlerError> {
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
        // 2 to 5 ms of work.
        tokio::time::sleep((2 + task.payload.seq % 4) as u32 * MS).await;
        {
            let mut running = self.running.lock().unwrap();
            let here = running.get_mut(&p).unwrap();
            let at = here.iter().position(|i| *i == instance).unwrap();
            here.swap_remove(at);
        }
        // The effect happens only while the instance may still act.
        if !task.cx.still_owned() {
            return Err(HandlerError::msg("no longer the partition's owner"));
        }
        *self
            .done
            .lock()
            .unwrap()
            .entry(task.payload.seq)
            .or_default() += 1;
        if task.cx.attempt() > 1 {
            *self.taken_over.lock().unwrap() += 1;
        }
        Ok(())
    }

    fn distinct(&self) -> u64 {
        self.done.lock().unwrap().len() as u64
    }

    /// Each instance's newest epoch (assigned or fenced).
    fn newest_epochs(&self) -> BTreeMap<usize, u64> {
        let mut newest = BTreeMap::new();
        for (i, s) in self.standings.lock().unwrap().iter() {
            if let Some(e) = epoch_of(s) {
                newest.insert(*i, e);
            }
        }
        newest
    }
}

fn epoch_of(standing: &Standing) -> Option<u64> {
    match standing {
        Standing::Assigned(a) => Some(a.epoch),
        Standing::Fenced { epoch, .. } => Some(*epoch),
        _ => None,
    }
}

/// One service: ten consumers of one indexing mode in this process.
struct Service {
    indexing: Indexing,
    name: String,
    world: Arc<World>,
    stop: CancellationToken,
    consumers: Vec<JoinHandle<peerq::Result<()>>>,
}

impl Service {
    fn start(url: &str, indexing: Indexing) -> Self {
        support::init_tracing();
        let name = unique_name(&format!("incr-{indexing}"));
        let world = Arc::new(World::default());
        let stop = CancellationToken::new();
        let mut consumers = Vec::new();
        for instance in 0..INSTANCES {
            let builder = Consumer::builder()
                .name(&name)
                .redis(url)
                .indexing(indexing)
                .interval(INTERVAL)
                .lease_margin(LEASE_MARGIN)
                .drain_timeout(DRAIN)
                .partitions(PARTITIONS)
                .service(tower::service_fn({
                    let world = world.clone();
                    move |task: Task<Job>| {
                        let world = world.clone();
                        async move { world.run_task(instance, task).await }
                    }
                }));
            record(
                instance,
                &world,
                builder.partition_events(),
                builder.standing(),
            );
            consumers.push(tokio::spawn(
                builder.run_until(stop.clone().cancelled_owned()),
            ));
        }
        Service {
            indexing,
            name,
            world,
            stop,
            consumers,
        }
    }
}

/// Records an instance's partition events and standings in `world`.
fn record(
    instance: usize,
    world: &Arc<World>,
    mut events: tokio::sync::broadcast::Receiver<PartitionEvent>,
    mut standing: tokio::sync::watch::Receiver<Standing>,
) {
    tokio::spawn({
        let world = world.clone();
        async move {
            loop {
                match events.recv().await {
                    Ok(event) => world.events.lock().unwrap().push((instance, event)),
                    Err(RecvError::Lagged(n)) => *world.lagged.lock().unwrap() += n,
                    Err(RecvError::Closed) => return,
                }
            }
        }
    });
    tokio::spawn({
        let world = world.clone();
        async move {
            while standing.changed().await.is_ok() {
                let now = standing.borrow_and_update().clone();
                world.standings.lock().unwrap().push((instance, now));
            }
        }
    });
}

/// Enqueues 10 tasks every 50 ms (200/s) until stopped; returns how many.
fn produce(producer: Producer, stop: CancellationToken) -> JoinHandle<u64> {
    tokio::spawn(async move {
        let mut seq = 0;
        let mut tick = tokio::time::interval(50 * MS);
        while !stop.is_cancelled() {
            tick.tick().await;
            let jobs: Vec<Job> = (seq..seq + 10).map(|seq| Job { seq }).collect();
            producer.enqueue_batch(&jobs).await.unwrap();
            seq += 10;
        }
        seq
    })
}

/// Assignments by epoch: epoch -> instance -> (index, replicas).
type Epochs = BTreeMap<u64, BTreeMap<usize, (u32, u32)>>;

fn epochs(world: &World) -> Epochs {
    let mut by_epoch = Epochs::new();
    for (i, s) in world.standings.lock().unwrap().iter() {
        if let Standing::Assigned(a) = s {
            by_epoch
                .entry(a.epoch)
                .or_default()
                .insert(*i, (a.index, a.replicas));
        }
    }
    by_epoch
}

/// The first epoch in which all ten instances were assigned.
fn first_full(world: &World) -> Option<u64> {
    epochs(world)
        .into_iter()
        .find(|(_, a)| a.len() == INSTANCES)
        .map(|(e, _)| e)
}

/// Within one epoch: one replicas value, indices distinct and in
/// `1..=replicas`; with all ten assigned, exactly `1..=10`.
fn assert_exact(epoch: u64, assigned: &BTreeMap<usize, (u32, u32)>) {
    let replicas: BTreeSet<u32> = assigned.values().map(|a| a.1).collect();
    assert_eq!(
        replicas.len(),
        1,
        "epoch {epoch}: replicas disagree: {assigned:?}"
    );
    let r = *replicas.first().unwrap();
    let indices: BTreeSet<u32> = assigned.values().map(|a| a.0).collect();
    assert_eq!(
        indices.len(),
        assigned.len(),
        "epoch {epoch}: an index held twice: {assigned:?}"
    );
    assert!(
        indices.iter().all(|&i| 1 <= i && i <= r),
        "epoch {epoch}: {assigned:?}"
    );
    if assigned.len() == INSTANCES {
        assert_eq!(
            indices,
            (1..=INSTANCES as u32).collect(),
            "epoch {epoch}: {assigned:?}"
        );
    }
}

/// The instance owning `p` under one epoch's assignments, if assigned.
fn owner(assigned: &BTreeMap<usize, (u32, u32)>, p: u32) -> Option<usize> {
    assigned
        .iter()
        .find(|(_, (index, replicas))| p % replicas + 1 == *index)
        .map(|(i, _)| *i)
}

/// What one service's measured epochs show.
#[derive(Debug, Default)]
struct Figures {
    /// The epochs measured: each is compared with the one before.
    epochs: Vec<u64>,
    /// Epochs, all ten assigned in it and in the one before, in which some
    /// instance's index changed.
    swap_epochs: usize,
    /// Over those epochs, instances whose index changed.
    changed: usize,
    /// Partitions acquired in swap epochs by another instance than the one
    /// that ran them last (`Started` events).
    moved: usize,
    /// Partitions whose owner changed in swap epochs, from the assignments.
    computed: usize,
    /// Epochs in which (or the one before which) an instance was not
    /// assigned: a round failed or ran late, so it was fenced.
    fenced_epochs: usize,
    /// Partitions acquired by a new owner in those epochs.
    moved_by_fences: usize,
    /// Partitions acquired by a new owner in epochs where no index changed
    /// and all were assigned: nothing should move there.
    moved_when_quiet: usize,
    /// Partitions acquired again by the instance that ran them last, which
    /// owned them the epoch before too: it had stopped them without losing
    /// them, because its lease lapsed (its process starved past the lease)
    /// and it fenced itself.
    reacquired: usize,
    /// Partitions acquired again by the instance that ran them last, which
    /// did not own them the epoch before: a move undone (indices swapped
    /// back) before the other instance had started the partition.
    undone: usize,
}

/// Counts, over `EPOCHS` epochs after the warm-up (the first epoch with all
/// ten assigned and the one after it), the epochs whose indices changed and
/// the partitions that moved. Each `Started` event counts in the epoch its
/// fencing token names (the epoch it was acquired in), as a move when
/// another instance ran the partition last.
fn figures(world: &World) -> Figures {
    assert_eq!(*world.lagged.lock().unwrap(), 0, "partition events missed");
    let by_epoch = epochs(world);
    let base = first_full(world).expect("all assigned") + 1;
    let window: Vec<u64> = (base + 1..=base + EPOCHS).collect();
    for e in base..=base + EPOCHS {
        let assigned = by_epoch.get(&e).cloned().unwrap_or_default();
        assert_exact(e, &assigned);
    }
    let empty = BTreeMap::new();
    let assigned = |e: u64| by_epoch.get(&e).unwrap_or(&empty);
    let mut f = Figures {
        epochs: window.clone(),
        ..Figures::default()
    };
    // Per epoch, partitions acquired by another instance than the one
    // that ran them last.
    let mut started: Vec<(SystemTime, usize, u32, u64)> = Vec::new();
    for (i, ev) in world.events.lock().unwrap().iter() {
        if let PartitionChange::Started { token } = ev.change {
            started.push((ev.at, *i, ev.partition, token));
        }
    }
    started.sort();
    let mut last: HashMap<u32, usize> = HashMap::new();
    let mut moved: BTreeMap<u64, usize> = BTreeMap::new();
    for (_, i, p, token) in started {
        let before = last.insert(p, i);
        if !window.contains(&token) {
            continue;
        }
        if before != Some(i) {
            *moved.entry(token).or_default() += 1;
        } else if owner(assigned(token - 1), p) == Some(i) {
            f.reacquired += 1;
        } else {
            f.undone += 1;
        }
    }
    for e in window {
        let (prev, cur) = (assigned(e - 1), assigned(e));
        let acquired = moved.get(&e).copied().unwrap_or(0);
        if prev.len() < INSTANCES || cur.len() < INSTANCES {
            f.fenced_epochs += 1;
            f.moved_by_fences += acquired;
            continue;
        }
        let changed = cur.iter().filter(|(i, a)| prev[*i].0 != a.0).count();
        if changed == 0 {
            f.moved_when_quiet += acquired;
            continue;
        }
        f.swap_epochs += 1;
        f.changed += changed;
        f.moved += acquired;
        f.computed += (0..PARTITIONS)
            .filter(|p| owner(prev, *p) != owner(cur, *p))
            .count();
    }
    f
}

impl Figures {
    fn line(&self) -> String {
        format!(
            "{} of {} epochs swapped indices, {} instances changed index, {} partitions moved \
             ({} by the assignments); {} epochs with a fenced instance ({} partitions moved); \
             {} moved in quiet epochs; {} moves undone before they completed; \
             {} re-acquired by their owner after a lapsed lease",
            self.swap_epochs,
            self.epochs.len(),
            self.changed,
            self.moved,
            self.computed,
            self.fenced_epochs,
            self.moved_by_fences,
            self.moved_when_quiet,
            self.undone,
            self.reacquired
        )
    }
}

/// Every task enqueued was handled exactly once, and no partition ran on
/// two instances at once; unless an instance of the service fenced itself
/// (its process starved past its lease, as under a freeze): then only at
/// least once, and what ran twice is printed.
fn assert_exactly_once(s: &Service, count: u64, fenced_itself: bool) {
    let done = s.world.done.lock().unwrap();
    let twice: Vec<_> = done.iter().filter(|(_, n)| **n > 1).take(5).collect();
    let overlaps = s.world.overlaps.lock().unwrap();
    if fenced_itself && (!twice.is_empty() || !overlaps.is_empty()) {
        eprintln!(
            "{}: after an instance fenced itself, run twice: {twice:?}; overlaps: {overlaps:?}",
            s.indexing
        );
    } else {
        assert!(
            twice.is_empty(),
            "{}: tasks run twice: {twice:?}",
            s.indexing
        );
        assert!(overlaps.is_empty(), "{}: {overlaps:?}", s.indexing);
    }
    let lost: Vec<u64> = (0..count)
        .filter(|q| !done.contains_key(q))
        .take(5)
        .collect();
    assert!(lost.is_empty(), "{}: tasks never run: {lost:?}", s.indexing);
    assert_eq!(done.len() as u64, count, "{}: unexpected tasks", s.indexing);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incr_swaps_move_partitions_and_every_task_still_runs_once_ranked_never_swaps() {
    let server = RedisServer::start();
    let url = server.url();
    // Both services' consumers reach Redis through the same jitter, so
    // Ranked's figures are measured under the conditions Incr's are.
    let proxy = Proxy::start(server.port());
    proxy.jitter(JITTER);
    let mut services = [
        Service::start(&proxy.url(), Indexing::Incr),
        Service::start(&proxy.url(), Indexing::Ranked),
    ];
    let stop_producing = CancellationToken::new();
    let mut produced = Vec::new();
    for s in &services {
        let producer = Producer::builder()
            .name(&s.name)
            .redis(&url)
            .partitions(PARTITIONS)
            .connect()
            .await
            .unwrap();
        produced.push(produce(producer, stop_producing.clone()));
    }

    wait_until(Duration::from_secs(20), "all ten assigned in both", || {
        services.iter().all(|s| first_full(&s.world).is_some())
    })
    .await;
    // The warm-up epoch, then EPOCHS more, each seen by every instance.
    let within = INTERVAL * (EPOCHS as u32 + 15);
    wait_until(within, "the measured epochs", || {
        services.iter().all(|s| {
            let last = first_full(&s.world).unwrap() + 1 + EPOCHS;
            let newest = s.world.newest_epochs();
            newest.len() == INSTANCES && newest.values().all(|e| *e >= last)
        })
    })
    .await;

    stop_producing.cancel();
    let mut counts = Vec::new();
    for p in produced {
        counts.push(p.await.unwrap());
    }
    wait_until(Duration::from_secs(30), "every task to run", || {
        services
            .iter()
            .zip(&counts)
            .all(|(s, count)| s.world.distinct() == *count)
    })
    .await;
    // A task run twice could still show up late (a redelivery).
    tokio::time::sleep(2 * INTERVAL).await;
    for s in &services {
        s.stop.cancel();
    }
    for s in services.iter_mut() {
        for c in s.consumers.drain(..) {
            c.await.unwrap().unwrap();
        }
    }

    let mut lines = Vec::new();
    for (s, count) in services.iter().zip(&counts) {
        let f = figures(&s.world);
        assert_exactly_once(s, *count, f.reacquired > 0 || f.fenced_epochs > 0);
        let taken_over = *s.world.taken_over.lock().unwrap();
        eprintln!(
            "{:?}: {} | {count} tasks, each run once ({taken_over} on a later attempt)",
            s.indexing,
            f.line()
        );
        lines.push((s.indexing, f));
    }
    let (incr, ranked) = (&lines[0].1, &lines[1].1);
    eprintln!(
        "Incr: {} of {} epochs swapped indices, {} instances changed index, {} partitions moved; \
         Ranked: {} / {} / {} (through a proxy adding up to {JITTER:?} per chunk)",
        incr.swap_epochs,
        incr.epochs.len(),
        incr.changed,
        incr.moved,
        ranked.swap_epochs,
        ranked.changed,
        ranked.moved
    );
    if incr.swap_epochs == 0 {
        eprintln!("Incr: no index swapped in this run (no two rounds close enough to reorder)");
    }
    assert_eq!(
        ranked.swap_epochs, 0,
        "Ranked indices changed with stable membership"
    );
}
