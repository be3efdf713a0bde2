//! Resharding (docs/design.md §21) with in-process consumers against a real
//! redis-server: a service of 4 partitions resharded to 8 and back to 4
//! while a producer enqueues keyed batches, each task run once, in the
//! generation live when it ran; on an ordered service each key's tasks
//! start in their enqueue order and with fencing tokens that never fall
//! across both reshards; a consumer or producer given the old count is
//! refused, naming the new one; delayed tasks due during and after a reshard run
//! once, in the new layout, and dead letters follow it and are replayed
//! there. (With processes, churn and kills: the `scenarios` binary.)

use std::collections::{BTreeMap, HashMap};

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis;
use peerq::admin::Admin;
use peerq::producer::Options;
use peerq::{Consumer, Handler, HandlerError, Producer, TaskContext};
use support::{RedisServer, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

use crate::Instance;

const KEYS: u64 = 20;
const WITHIN: Duration = Duration::from_secs(60);

/// One run: the task's seq, its generation, partition and token.
#[derive(Debug, Clone)]
struct Run {
    seq: u64,
    generation: u32,
    token: u64,
    /// The task's id (a periodic job's: `cron:<job>:<due ms>`).
    id: peerq::TaskId,
}

#[derive(Clone, Default)]
struct Recording {
    runs: Arc<Mutex<Vec<Run>>>,
    /// While set, tasks from seq 1,000 on fail for good (dead letters).
    refuse: Arc<std::sync::atomic::AtomicBool>,
}

impl Recording {
    fn runs(&self) -> Vec<Run> {
        self.runs.lock().unwrap().clone()
    }

    fn newest_generation(&self) -> u32 {
        self.runs().iter().map(|r| r.generation).max().unwrap_or(0)
    }
}

impl Handler for Recording {
    type Task = u64;
    async fn handle(&self, seq: u64, cx: TaskContext) -> Result<(), HandlerError> {
        if seq >= 1000 && self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(HandlerError::msg(format!("task {seq} refused")).permanent());
        }
        self.runs.lock().unwrap().push(Run {
            seq,
            generation: cx.generation(),
            token: cx.fencing_token(),
            id: cx.task_id().clone(),
        });
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(())
    }
}

fn consumer(url: &str, name: &str, handler: Recording, ordered: bool) -> Instance {
    let builder = Consumer::builder().ordered(ordered);
    start(builder, url, name, handler)
}

/// A consumer whose partitions are placed by rendezvous.
fn rendezvous(url: &str, name: &str, handler: Recording) -> Instance {
    let builder = Consumer::builder().assignor(peerq::Assignor::Rendezvous);
    start(builder, url, name, handler)
}

/// Runs `builder` as a consumer of `name` (4 partitions, rounds of 300 ms).
fn start(
    builder: peerq::consumer::ConsumerBuilder<(), (), peerq::Bincode>,
    url: &str,
    name: &str,
    handler: Recording,
) -> Instance {
    support::init_tracing();
    let stop = CancellationToken::new();
    let run = builder
        .name(name)
        .redis(url)
        .partitions(4)
        .interval(Duration::from_millis(300))
        .drain_timeout(Duration::from_millis(100))
        .handler(handler)
        .run_until(stop.clone().cancelled_owned());
    Instance {
        stop,
        task: tokio::spawn(run),
    }
}

/// Service `name` once `n` consumers run it (a reshard needs their
/// records; they record the count before a producer records its default).
async fn running(admin: &Admin, name: &str, n: usize) -> peerq::admin::Service {
    let began = tokio::time::Instant::now();
    loop {
        if let Ok(service) = admin.service(name).await
            && service.status().await.unwrap().members.len() == n
        {
            return service;
        }
        assert!(began.elapsed() < WITHIN, "the consumers never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Enqueues batches of keyed tasks until `stop`; returns how many.
fn produce(producer: Producer, stop: CancellationToken) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut seq = 0;
        while !stop.is_cancelled() {
            let batch: Vec<(u64, Options)> = (seq..seq + 20)
                .map(|s| (s, Options::new().key(format!("k{}", s % KEYS))))
                .collect();
            producer.enqueue_batch_with(&batch).await.unwrap();
            seq += 20;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        seq
    })
}

/// Reshards `name` to `partitions`, waiting out a previous reshard that
/// has not settled (`running`), and then until the new generation runs.
async fn reshard(admin: &Admin, name: &str, partitions: u32, handler: &Recording, generation: u32) {
    let service = admin.service(name).await.unwrap();
    let started = tokio::time::Instant::now();
    loop {
        match service.reshard(partitions).await {
            Ok(r) => {
                assert_eq!((r.generation, r.partitions), (generation, partitions));
                break;
            }
            Err(peerq::Error::ReshardRefused(r)) if r.reason() == "running" => {
                assert!(
                    started.elapsed() < WITHIN,
                    "the previous reshard never settled"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("reshard to {partitions}: {e}"),
        }
    }
    wait_until(WITHIN, "the new generation runs tasks", || {
        handler.newest_generation() == generation
    })
    .await;
}

async fn up_and_down(ordered: bool, placed: bool) {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("reshard"));
    let handler = Recording::default();
    let instances: Vec<Instance> = (0..2)
        .map(|_| match placed {
            true => rendezvous(&url, &name, handler.clone()),
            false => consumer(&url, &name, handler.clone(), ordered),
        })
        .collect();
    let admin = Admin::connect(url.as_str()).await.unwrap();
    running(&admin, &name, 2).await;
    let producer = Producer::builder()
        .name(&name)
        .redis(url.as_str())
        .connect()
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let produced = produce(producer, stop.clone());
    wait_until(WITHIN, "tasks run", || handler.runs().len() > 100).await;
    reshard(&admin, &name, 8, &handler, 1).await;
    // A plain `XADD` into an old partition, as a producer of a previous
    // version or another language sends it: refused, nothing added.
    let mut raw = server.client().get_connection().unwrap();
    let stream = format!("{{{name}/0}}:stream");
    let before: u64 = redis::cmd("XLEN").arg(&stream).query(&mut raw).unwrap();
    let refused: redis::RedisResult<String> = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("id")
        .arg("stale")
        .query(&mut raw);
    let refused = refused.unwrap_err().to_string();
    assert!(
        refused.contains("exhausted the last possible ID"),
        "{refused}"
    );
    let after: u64 = redis::cmd("XLEN").arg(&stream).query(&mut raw).unwrap();
    assert_eq!(after, before);
    // The old count is refused, naming the new one, to a consumer and a
    // producer; the new count is taken.
    let old = Consumer::builder()
        .name(&name)
        .redis(url.as_str())
        .partitions(4)
        .handler(Recording::default())
        .run_until(std::future::ready(()))
        .await
        .unwrap_err();
    assert!(old.to_string().contains("now has 8 partitions"), "{old}");
    let old = Producer::builder()
        .name(&name)
        .redis(url.as_str())
        .partitions(4)
        .connect()
        .await
        .unwrap_err();
    assert!(old.to_string().contains("now has 8 partitions"), "{old}");
    let current = Producer::builder()
        .name(&name)
        .redis(url.as_str())
        .partitions(8)
        .connect()
        .await
        .unwrap();
    assert_eq!(current.partitions(), 8);
    reshard(&admin, &name, 4, &handler, 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    let produced = produced.await.unwrap();
    wait_until(WITHIN, "every task run", || {
        handler.runs().len() as u64 >= produced
    })
    .await;
    for instance in instances {
        instance.leave().await;
    }
    let runs = handler.runs();
    let mut seen: HashMap<u64, u32> = HashMap::new();
    for r in &runs {
        *seen.entry(r.seq).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "run twice: {twice:?}");
    assert_eq!(seen.len() as u64, produced, "every task ran");
    let status = admin.service(&name).await.unwrap().layout().await.unwrap();
    assert_eq!((status.generation, status.partitions), (2, 4));
    if ordered {
        // Per key: runs in enqueue order, tokens never falling.
        let mut last: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for r in &runs {
            let key = r.seq % KEYS;
            if let Some((seq, token)) = last.get(&key) {
                assert!(r.seq > *seq, "key {key}: {} ran after {seq}", r.seq);
                assert!(
                    r.token >= *token,
                    "key {key}: token {} after {token}",
                    r.token
                );
            }
            last.insert(key, (r.seq, r.token));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reshard_up_and_down_runs_every_task_once_under_load() {
    up_and_down(false, false).await;
}

/// The same with rendezvous placement: a later generation's units are
/// scored from their own numbers (docs/design.md §21).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reshard_under_rendezvous_runs_every_task_once() {
    up_and_down(false, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ordered_service_keeps_each_keys_order_and_tokens_across_two_reshards() {
    up_and_down(true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delayed_tasks_and_dead_letters_follow_a_reshard() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("reshard-moves"));
    let handler = Recording::default();
    handler
        .refuse
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let instances = vec![
        consumer(&url, &name, handler.clone(), false),
        consumer(&url, &name, handler.clone(), false),
    ];
    let admin = Admin::connect(url.as_str()).await.unwrap();
    let producer = Producer::builder()
        .name(&name)
        .redis(url.as_str())
        .partitions(4)
        .connect()
        .await
        .unwrap();
    // 50 tasks that die, and wait as dead letters in the old layout.
    let dying: Vec<u64> = (1000..1050).collect();
    producer.enqueue_batch(&dying).await.unwrap();
    let service = admin.service(&name).await.unwrap();
    let began = tokio::time::Instant::now();
    while service.dead_letters().list(100).await.unwrap().len() < 50 {
        assert!(began.elapsed() < WITHIN, "the tasks never died");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Delayed tasks in the old layout: due during the reshard, and after.
    for seq in 0..150u64 {
        let delay = Duration::from_millis(if seq < 50 { 300 } else { 4000 });
        let options = Options::new().key(format!("k{seq}")).delay(delay);
        producer.enqueue_with(seq, options).await.unwrap();
    }
    let service = running(&admin, &name, 2).await;
    let started = service.reshard(8).await.unwrap();
    assert_eq!(started.generation, 1);
    wait_until(WITHIN, "every delayed task run", || {
        handler.runs().iter().filter(|r| r.seq < 150).count() >= 150
    })
    .await;
    // The dead letters moved with the reshard, and replay in the new layout.
    let service = admin.service(&name).await.unwrap();
    let letters = service.dead_letters().list(100).await.unwrap();
    assert_eq!(letters.len(), 50);
    assert!(
        letters.iter().all(|l| l.partition >= 1 << 16),
        "letters left in the old layout: {letters:?}"
    );
    handler
        .refuse
        .store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(service.dead_letters().replay_all(None).await.unwrap(), 50);
    wait_until(WITHIN, "every replayed task run", || {
        handler.runs().iter().filter(|r| r.seq >= 1000).count() >= 50
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    for instance in instances {
        instance.leave().await;
    }
    let runs = handler.runs();
    let mut seen: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for r in &runs {
        seen.entry(r.seq).or_default().push(r.generation);
    }
    assert_eq!(seen.len(), 200, "every task ran");
    for (seq, generations) in &seen {
        assert_eq!(generations.len(), 1, "task {seq} ran in {generations:?}");
        // Due after the cut-over, or replayed after it: the new layout's.
        // (Those due at once may have run before their partition sealed.)
        if *seq >= 50 {
            assert_eq!(generations, &[1], "task {seq} ran in {generations:?}");
        }
    }
}

/// An idempotency key used before a reshard is honoured after it (a
/// producer that connects after the start asks the replaced layout
/// first), one at a time and in a batch; a unique key held by a task
/// delayed across the reshard still refuses a second task.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotency_and_unique_keys_hold_across_a_reshard() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("reshard-keys"));
    let handler = Recording::default();
    let instances = vec![
        consumer(&url, &name, handler.clone(), false),
        consumer(&url, &name, handler.clone(), false),
    ];
    let admin = Admin::connect(url.as_str()).await.unwrap();
    let connect = || async {
        Producer::builder()
            .name(&name)
            .redis(url.as_str())
            .connect()
            .await
            .unwrap()
    };
    let service = running(&admin, &name, 2).await;
    let before = connect().await;
    let mut ids = Vec::new();
    for seq in 0..40u64 {
        let options = Options::new().idempotency_key(format!("order-{seq}"));
        ids.push(before.enqueue_with(seq, options).await.unwrap());
    }
    for seq in 100..110u64 {
        let options = Options::new()
            .unique(format!("report-{seq}"))
            .delay(Duration::from_secs(3));
        before.enqueue_with(seq, options).await.unwrap();
    }
    wait_until(WITHIN, "the first tasks run", || handler.runs().len() >= 40).await;
    service.reshard(8).await.unwrap();
    let after = connect().await;
    assert_eq!(
        after.partitions(),
        8,
        "a producer connected after the start writes the new layout"
    );
    for seq in 0..20u64 {
        let options = Options::new().idempotency_key(format!("order-{seq}"));
        let again = after.enqueue_with(seq, options).await.unwrap();
        assert_eq!(again, ids[seq as usize], "order-{seq} enqueued twice");
    }
    let batch: Vec<(u64, Options)> = (20..40u64)
        .map(|seq| (seq, Options::new().idempotency_key(format!("order-{seq}"))))
        .collect();
    let sent = after.enqueue_batch_with(&batch).await.unwrap();
    assert_eq!(&sent[..], &ids[20..40], "a batch enqueued them twice");
    for seq in 100..110u64 {
        let options = Options::new().unique(format!("report-{seq}"));
        match after.enqueue_with(seq + 1000, options).await {
            Err(peerq::Error::Duplicate(_)) => {}
            other => panic!("report-{seq} taken twice: {other:?}"),
        }
    }
    wait_until(WITHIN, "the delayed tasks run", || {
        handler
            .runs()
            .iter()
            .filter(|r| (100..110).contains(&r.seq))
            .count()
            >= 10
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for instance in instances {
        instance.leave().await;
    }
    let runs = handler.runs();
    let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
    for r in &runs {
        *seen.entry(r.seq).or_default() += 1;
    }
    assert!(seen.values().all(|&n| n == 1), "run twice: {seen:?}");
    assert_eq!(seen.len(), 50, "{seen:?}");
}

/// A periodic job of 1 s across two reshards (4 → 8 → 4): every due time
/// fires once, none in both layouts and none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_periodic_job_fires_each_due_time_once_across_two_reshards() {
    let server = RedisServer::start();
    let (url, name) = (server.url(), unique_name("reshard-periodic"));
    let handler = Recording::default();
    let ticking = || {
        Consumer::builder().periodic(
            peerq::Periodic::every("tick", Duration::from_secs(1)),
            &999u64,
        )
    };
    let instances = vec![
        start(ticking(), &url, &name, handler.clone()),
        start(ticking(), &url, &name, handler.clone()),
    ];
    let admin = Admin::connect(url.as_str()).await.unwrap();
    running(&admin, &name, 2).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    reshard(&admin, &name, 8, &handler, 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    reshard(&admin, &name, 4, &handler, 2).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for instance in instances {
        instance.leave().await;
    }
    let mut dues: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    for r in handler.runs() {
        let due =
            r.id.as_str()
                .strip_prefix("cron:tick:")
                .expect("only ticks run");
        dues.entry(due.parse().unwrap())
            .or_default()
            .push(r.generation);
    }
    let fired: Vec<(u64, Vec<u32>)> = dues.into_iter().collect();
    assert!(fired.len() >= 6, "{fired:?}");
    for (due, generations) in &fired {
        assert_eq!(
            generations.len(),
            1,
            "due time {due} fired in {generations:?}"
        );
    }
    for pair in fired.windows(2) {
        assert_eq!(pair[1].0 - pair[0].0, 1000, "a due time lost: {fired:?}");
    }
    let generations: std::collections::BTreeSet<u32> = fired.iter().map(|(_, g)| g[0]).collect();
    assert_eq!(generations.len(), 3, "ticks in every generation: {fired:?}");
}
