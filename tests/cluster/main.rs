//! peerq on a real local Redis Cluster of three masters (one cluster for
//! the whole binary, [`RedisCluster::shared`]): each partition's keys are
//! in a slot of their own, so a service's partitions spread over every
//! master; consumers follow a slot that moves while tasks flow; the CLI,
//! the dashboard and the dead letters read a service spread over them.
//! Failovers (`cluster/failover.rs`), replicas that confirm writes or not
//! (`cluster/replicas.rs`) and TLS (`cluster/tls.rs`) each take a cluster
//! of their own.

// The harness crate, named `support` in every module of this binary.
extern crate peerq_test_support as support;

mod batches;
mod failover;
mod replicas;
mod singleton;
mod tls;
mod tracking;
mod unique;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use peerq::producer::{Options, Producer};
use peerq::{Consumer, Handler, HandlerError, TaskContext};
use serde::{Deserialize, Serialize};
use support::{RedisCluster, unique_name, wait_until};
use tokio_util::sync::CancellationToken;

const MS: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    seq: u64,
}

/// Every run of a handler: the seq and the instance that ran it.
#[derive(Clone, Default)]
struct Recorder {
    runs: Arc<Mutex<Vec<(u64, usize)>>>,
    instance: usize,
    /// Every [`FAILING`]th task fails for good.
    fail: bool,
}

/// With `Recorder::fail`, the tasks whose seq is `n * FAILING - 1` fail.
const FAILING: u64 = 10;

impl Handler for Recorder {
    type Task = Job;
    async fn handle(&self, job: Job, _cx: TaskContext) -> Result<(), HandlerError> {
        self.runs.lock().unwrap().push((job.seq, self.instance));
        if job.seq % FAILING == FAILING - 1 && self.fail {
            return Err(HandlerError::msg("no such mailbox").permanent());
        }
        Ok(())
    }
}

impl Recorder {
    fn for_instance(&self, instance: usize) -> Recorder {
        Recorder {
            runs: self.runs.clone(),
            instance,
            fail: self.fail,
        }
    }

    fn distinct(&self) -> usize {
        let runs = self.runs.lock().unwrap();
        runs.iter()
            .map(|(seq, _)| *seq)
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// The instances that ran tasks.
    fn instances(&self) -> BTreeSet<usize> {
        let runs = self.runs.lock().unwrap();
        runs.iter().map(|(_, instance)| *instance).collect()
    }

    /// Each seq of `0..count` ran exactly once.
    fn assert_each_once(&self, count: u64) {
        let (missing, twice) = self.tally(count);
        assert!(twice.is_empty(), "tasks ran more than once: {twice:?}");
        assert!(missing.is_empty(), "tasks never ran: {missing:?}");
    }

    /// The seqs of `0..count` that never ran, and those that ran more than
    /// once; a run of a seq outside `0..count` fails the test.
    fn tally(&self, count: u64) -> (Vec<u64>, Vec<u64>) {
        let runs = self.runs.lock().unwrap();
        let mut per_seq: BTreeMap<u64, usize> = BTreeMap::new();
        for (seq, _) in runs.iter() {
            assert!(*seq < count, "a run of task {seq}, never enqueued");
            *per_seq.entry(*seq).or_default() += 1;
        }
        let twice = per_seq.iter().filter(|(_, n)| **n > 1).map(|(seq, _)| *seq);
        let missing = (0..count).filter(|seq| !per_seq.contains_key(seq));
        (missing.collect(), twice.collect())
    }
}

/// The builder of an instance, before its handler.
type Builder = peerq::consumer::ConsumerBuilder<(), (), peerq::Bincode>;

/// A consumer instance on the cluster, running until shut down.
struct Instance {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<peerq::Result<()>>,
    /// The instance's assignment, round by round.
    standing: tokio::sync::watch::Receiver<peerq::assignment::Standing>,
}

impl Instance {
    fn start(cluster: &RedisCluster, name: &str, handler: Recorder) -> Instance {
        Instance::start_with(cluster, name, handler, |builder| builder)
    }

    /// An instance whose builder `settings` changed.
    fn start_with(
        cluster: &RedisCluster,
        name: &str,
        handler: Recorder,
        settings: impl FnOnce(Builder) -> Builder,
    ) -> Instance {
        support::init_tracing();
        let builder = Consumer::builder()
            .redis(peerq::Redis::cluster(cluster.seed_urls()))
            .name(name);
        let builder = settings(builder).handler(handler);
        let standing = builder.standing();
        let stop = CancellationToken::new();
        let task = tokio::spawn(builder.run_until(stop.clone().cancelled_owned()));
        Instance {
            stop,
            task,
            standing,
        }
    }

    async fn shutdown(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// `n` instances of service `name`, recording into one record.
fn fleet(cluster: &RedisCluster, name: &str, n: usize) -> (Recorder, Vec<Instance>) {
    let record = Recorder::default();
    let instances = (0..n)
        .map(|i| Instance::start(cluster, name, record.for_instance(i)))
        .collect();
    (record, instances)
}

/// Waits until `count` distinct tasks ran, and time for one run twice to
/// show; fails at once if an instance stopped.
async fn wait_all_ran(record: &Recorder, instances: &[Instance], count: u64) {
    wait_until(Duration::from_secs(60), "every task ran", || {
        assert!(running(instances), "an instance stopped");
        record.distinct() as u64 == count
    })
    .await;
    tokio::time::sleep(500 * MS).await;
}

/// Waits until every instance is assigned among `instances.len()`, and
/// one epoch more, so that the handover of the first epoch that counted
/// them all (the joiners' partitions drained to them) is over.
async fn wait_settled(instances: &[Instance]) {
    let n = instances.len() as u32;
    // The oldest epoch of the instances' standings, if all count them all.
    let epoch = || -> Option<u64> {
        let mut oldest = u64::MAX;
        for instance in instances {
            let a = instance.standing.borrow().assignment()?;
            if a.replicas != n {
                return None;
            }
            oldest = oldest.min(a.epoch);
        }
        Some(oldest)
    };
    let mut first = None;
    wait_until(Duration::from_secs(30), "the fleet settled", || {
        assert!(running(instances), "an instance stopped");
        match (epoch(), first) {
            (None, _) => first = None,
            (Some(epoch), None) => first = Some(epoch),
            (Some(epoch), Some(at)) => return epoch > at,
        }
        false
    })
    .await;
}

/// Whether every instance still runs (one that stopped at start, on an
/// error, would otherwise show only as tasks that never run).
fn running(instances: &[Instance]) -> bool {
    instances
        .iter()
        .all(|instance| !instance.task.is_finished())
}

async fn producer(cluster: &RedisCluster, name: &str) -> Producer {
    Producer::builder()
        .redis(peerq::Redis::cluster(cluster.seed_urls()))
        .name(name)
        .connect()
        .await
        .unwrap()
}

/// Enqueues seqs `from..to` in batches of `batch`, pausing `pause` between
/// batches.
async fn enqueue(producer: &Producer, from: u64, to: u64, batch: u64, pause: Duration) {
    let mut seq = from;
    while seq < to {
        let end = (seq + batch).min(to);
        let jobs: Vec<Job> = (seq..end).map(|seq| Job { seq }).collect();
        producer.enqueue_batch(&jobs).await.unwrap();
        seq = end;
        tokio::time::sleep(pause).await;
    }
}

/// Enqueues seqs from `from` on, 50 every 20 ms, until `until` is
/// cancelled, then 500 more; resolves to the end of the seqs enqueued.
/// (Batches of 50 over 64 partitions often hold several tasks of one
/// partition: a pipeline within one slot.)
fn flow(
    producer: Arc<Producer>,
    from: u64,
    until: CancellationToken,
) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let mut next = from;
        while !until.is_cancelled() {
            enqueue(&producer, next, next + 50, 50, 20 * MS).await;
            next += 50;
        }
        enqueue(&producer, next, next + 500, 50, 20 * MS).await;
        next + 500
    })
}

/// Each of the 64 partitions' streams of service `name` is on the master
/// of its slot, and they are on all three masters.
fn assert_partitions_on_every_master(cluster: &RedisCluster, name: &str) {
    let streams: Vec<String> = (0..64).map(|p| format!("{{{name}/{p}}}:stream")).collect();
    let masters = cluster.masters_of_keys(&streams);
    let mut holders = BTreeSet::new();
    for ((stream, holder), master) in streams.iter().zip(cluster.holders(&streams)).zip(masters) {
        let port = holder.unwrap_or_else(|| panic!("{stream} is on no master"));
        assert_eq!(port, master.port, "{stream}");
        holders.insert(port);
    }
    assert_eq!(holders.len(), 3, "partitions only on {holders:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_consumers_on_three_masters_run_every_task_once() {
    let cluster = RedisCluster::shared();
    let name = unique_name("c3");
    let (record, instances) = fleet(cluster, &name, 3);
    let producer = producer(cluster, &name).await;
    // Tasks flow until each instance has run some (the first to start
    // owns every partition until the others are assigned), then 2,000 more.
    let mut count = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while record.instances().len() < 3 {
        assert!(running(&instances), "an instance stopped");
        assert!(
            std::time::Instant::now() < deadline,
            "instances not all assigned"
        );
        enqueue(&producer, count, count + 50, 50, 50 * MS).await;
        count += 50;
    }
    enqueue(&producer, count, count + 2000, 200, MS).await;
    count += 2000;
    wait_all_ran(&record, &instances, count).await;
    record.assert_each_once(count);

    assert_partitions_on_every_master(cluster, &name);
    for instance in instances {
        instance.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_that_move_while_tasks_flow_lose_nothing_and_run_nothing_twice() {
    let cluster = RedisCluster::shared();
    let name = unique_name("mig");
    let (record, instances) = fleet(cluster, &name, 2);
    let producer = Arc::new(producer(cluster, &name).await);
    // Some tasks first, so every partition's keys exist before they move;
    // then tasks flow until the slots have moved, and a while after.
    enqueue(&producer, 0, 1000, 100, MS).await;
    let moved = CancellationToken::new();
    let flowing = flow(producer.clone(), 1000, moved.clone());
    // Move the slots of four partitions, each to the next master, a key at
    // a time: the partition's scripts meet the slot half moved.
    let masters = cluster.masters();
    for p in 0..4 {
        let stream = format!("{{{name}/{p}}}:stream");
        let slot = support::slot_of(&stream);
        let from = cluster.master_of_slot(slot);
        let at = masters.iter().position(|m| m.id == from.id).unwrap();
        let to = &masters[(at + 1) % masters.len()];
        let mut migration = cluster.begin_migration(slot, to);
        while migration.step(1) {
            tokio::time::sleep(100 * MS).await;
        }
        migration.finish();
        assert_eq!(cluster.master_of_slot(slot).id, to.id);
        assert_eq!(
            cluster.holder(&stream),
            Some(to.port),
            "{stream} did not move"
        );
    }
    moved.cancel();
    let count = flowing.await.unwrap();
    wait_all_ran(&record, &instances, count).await;
    record.assert_each_once(count);
    for instance in instances {
        instance.shutdown().await;
    }
}

/// Runs the `peerq` CLI on the cluster: `--redis <masters> --cluster args…`.
fn peerq(cluster: &RedisCluster, args: &[&str]) -> serde_json::Value {
    let out = peerq_output(cluster, args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "peerq {args:?}: {stderr}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// What [`peerq`] runs, and its output whether it succeeded or not.
fn peerq_output(cluster: &RedisCluster, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_peerq"))
        .env_remove("PEERQ_REDIS_URL")
        .env_remove("PEERQ_TLS_CA")
        .env_remove("PEERQ_TLS_CERT")
        .env_remove("PEERQ_TLS_KEY")
        .arg("--redis")
        .arg(cluster.seed_urls().join(","))
        .arg("--cluster")
        .args(args)
        .output()
        .expect("run peerq")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_and_the_dead_letters_read_a_service_spread_over_the_masters() {
    let cluster = RedisCluster::shared();
    let name = unique_name("cli");
    let record = Recorder {
        fail: true,
        ..Recorder::default()
    };
    let instance = Instance::start(cluster, &name, record.for_instance(0));
    const COUNT: u64 = 500;
    let producer = producer(cluster, &name).await;
    enqueue(&producer, 0, COUNT, 100, MS).await;
    wait_until(Duration::from_secs(60), "every task ran", || {
        assert!(
            running(std::slice::from_ref(&instance)),
            "the instance stopped"
        );
        record.distinct() as u64 == COUNT
    })
    .await;

    // Every failed task is a dead letter, whatever master its partition is on.
    let dead = peerq::dead_letters::DeadLetters::connect(
        peerq::Redis::cluster(cluster.seed_urls()),
        &name,
    )
    .await
    .unwrap();
    let failed = COUNT / FAILING;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let letters = dead.list(1000).await.unwrap();
        if letters.len() as u64 == failed {
            let reasons: BTreeSet<&str> = letters.iter().map(|l| l.reason.as_str()).collect();
            assert_eq!(reasons, BTreeSet::from(["permanent"]));
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} dead letters, not {failed}",
            letters.len()
        );
        tokio::time::sleep(50 * MS).await;
    }

    // The CLI finds the service on its master, and its partitions on all.
    let cli = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            peerq(RedisCluster::shared(), &args)
        })
    };
    let services = cli(vec!["services".into(), "--json".into()]).await.unwrap();
    let ours = services
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name.as_str())
        .unwrap_or_else(|| panic!("{name} not listed: {services}"))
        .clone();
    assert_eq!(ours["partitions"], 64, "{ours}");
    let status = ["status", "--name", &name, "--json"]
        .map(String::from)
        .to_vec();
    let status = cli(status).await.unwrap();
    let dead_counted: u64 = status["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["dead"].as_u64().unwrap())
        .sum();
    assert_eq!(dead_counted, failed, "{status}");

    // `peerq dashboard --cluster` serves the service's page.
    let port = support::unused_port();
    let mut dashboard = support::Proc(
        std::process::Command::new(env!("CARGO_BIN_EXE_peerq"))
            .env_remove("PEERQ_REDIS_URL")
            .env_remove("PEERQ_DASHBOARD_BASIC_AUTH")
            .env_remove("PEERQ_DASHBOARD_TOKEN")
            .args(["--redis", &cluster.seed_urls().join(","), "--cluster"])
            .args(["dashboard", "--read-only", "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run peerq dashboard"),
    );
    let page = tokio::task::spawn_blocking({
        let path = format!("/services/{name}");
        move || get(port, &path)
    })
    .await
    .unwrap();
    assert!(page.starts_with("HTTP/1.1 200"), "{page}");
    assert!(page.contains(&name), "{page}");
    let _ = dashboard.0.kill();
    instance.shutdown().await;
}

/// The answer to `GET path` from the HTTP server on `port` of this
/// machine, head and body, once it listens (within 20 s).
fn get(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let request = format!(
                "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).unwrap();
            let mut answer = String::new();
            stream.read_to_string(&mut answer).unwrap();
            return answer;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing listens on {port}"
        );
        std::thread::sleep(50 * MS);
    }
}
