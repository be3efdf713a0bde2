//! Three instances sharing one backlog (issue 26): three consumers of one
//! service in this process, through the public API, over a backlog of
//! three times `PEERQ_BENCH_TASKS`, with the single-instance run's settings
//! (no-op handler, concurrency 256, reads of `READ_COUNT`).
//!
//! It times the three at work, not their assignment: the backlog is
//! prefilled and the service paused before they start, so they join and
//! split the partitions with nothing to run; once each owns about a third,
//! the service is resumed. The instances see the resume up to an interval
//! apart (each reads the pause key every second), so every handler first
//! waits at a start line until all three have been called; the clock runs
//! from then to the last ack on all three.
//!
//! It runs last in `main`, after the latency run installed a metrics
//! recorder: the three pay for their metrics, as instances with an
//! exporter do (the single-instance table shows what that costs one).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use peerq::Consumer;
use peerq::DEFAULT_PARTITIONS;
use peerq::HandlerError;
use peerq::admin::{Admin, Service};
use peerq::handler::Task;
use peerq::producer::Producer;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::raw::{self, BATCH, READ_COUNT};
use crate::{ACK_POLL, Job, job, pending};
use support::{RedisServer, unique_name};

/// The instances.
const INSTANCES: usize = 3;
/// How long the three may take to split the partitions.
const ASSIGNED_WITHIN: Duration = Duration::from_secs(60);
/// How often the split is read while waiting for it.
const STATUS_POLL: Duration = Duration::from_millis(100);

/// Where every instance's handlers wait until all of them have been
/// called, and when the last one was.
struct StartLine {
    arrived: [AtomicBool; INSTANCES],
    go: watch::Sender<Option<Instant>>,
}

impl StartLine {
    /// Instance `i`'s handler is at the line: returns once all are.
    async fn pass(&self, i: usize) {
        if self.go.borrow().is_some() {
            return;
        }
        self.arrived[i].store(true, Ordering::SeqCst);
        if self.arrived.iter().all(|a| a.load(Ordering::SeqCst)) {
            self.go.send_if_modified(|go| {
                let first = go.is_none();
                if first {
                    *go = Some(Instant::now());
                }
                first
            });
        }
        let _ = self.go.subscribe().wait_for(Option::is_some).await;
    }
}

/// Prefills `INSTANCES × tasks_per_instance` tasks, runs the three
/// instances over them, and prints the aggregate rate and each one's share.
pub(crate) async fn run(server: &RedisServer, tasks_per_instance: u64) {
    let tasks = tasks_per_instance * INSTANCES as u64;
    let name = unique_name("fleet");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    for from in (0..tasks).step_by(BATCH) {
        let jobs: Vec<Job> = (from..tasks.min(from + BATCH as u64)).map(job).collect();
        producer.enqueue_batch(&jobs).await.unwrap();
    }
    let service = Admin::connect(&server.url())
        .await
        .unwrap()
        .service(&name)
        .await
        .unwrap();
    service.pause("bench: fleet prefilled").await.unwrap();

    let handled: Arc<[AtomicU64; INSTANCES]> = Arc::new(Default::default());
    let line = Arc::new(StartLine {
        arrived: Default::default(),
        go: watch::Sender::new(None),
    });
    let stop = CancellationToken::new();
    let mut runs = Vec::new();
    for i in 0..INSTANCES {
        let (handled, line) = (handled.clone(), line.clone());
        let handler = tower::service_fn(move |_task: Task<Job>| {
            let (handled, line) = (handled.clone(), line.clone());
            async move {
                line.pass(i).await;
                handled[i].fetch_add(1, Ordering::Relaxed);
                Ok::<(), HandlerError>(())
            }
        });
        let consumer = Consumer::builder()
            .name(&name)
            .redis(server.url())
            .concurrency(256)
            .batch(READ_COUNT)
            .service(handler);
        let signal = stop.clone();
        runs.push(tokio::spawn(async move {
            consumer.run_until(signal.cancelled_owned()).await
        }));
    }
    let waited = Instant::now();
    wait_assigned(&service).await;
    let assigned = waited.elapsed();
    service.resume().await.unwrap();

    let total = || {
        handled
            .iter()
            .map(|h| h.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    while total() < tasks {
        tokio::time::sleep(ACK_POLL).await;
    }
    let mut conn = raw::connect(&server.client(), 1).await.remove(0);
    while pending(&mut conn, &name).await > 0 {
        tokio::time::sleep(ACK_POLL).await;
    }
    let started = line.go.borrow().expect("every handler passed the line");
    let elapsed = started.elapsed();
    stop.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }

    let split: Vec<String> = handled
        .iter()
        .map(|h| {
            let n = h.load(Ordering::Relaxed);
            format!("{n} ({:.1} %)", n as f64 * 100.0 / tasks as f64)
        })
        .collect();
    println!();
    println!(
        "| {INSTANCES} instances of one service in this process, sharing {tasks} prefilled tasks (no-op handler, reads of {READ_COUNT}, a metrics recorder installed) | tasks/s, all {INSTANCES} at work to the last ack | tasks per instance (share) |"
    );
    println!("|---|---|---|");
    println!(
        "| aggregate (the {INSTANCES} assigned after {:.1} s, with nothing to run) | {:.0} | {} |",
        assigned.as_secs_f64(),
        tasks as f64 / elapsed.as_secs_f64(),
        split.join(" / ")
    );
}

/// Waits until the instances are assigned, each owning about a third of
/// the partitions: every partition's owner record names one of the live,
/// assigned members, in shares that differ by at most one, and each member
/// fetches the partitions it is named for.
async fn wait_assigned(service: &Service) {
    let deadline = Instant::now() + ASSIGNED_WITHIN;
    loop {
        let status = service.status().await.unwrap();
        let members: Vec<_> = status
            .members
            .iter()
            .filter(|m| m.live && m.standing == "assigned" && m.replicas == Some(INSTANCES as u32))
            .collect();
        let owned = |id: &str| {
            status
                .partitions
                .iter()
                .filter(|p| p.owner.as_deref() == Some(id))
                .count() as u64
        };
        let fair = DEFAULT_PARTITIONS as u64 / INSTANCES as u64;
        let split = members.len() == INSTANCES
            && members.iter().map(|m| owned(&m.id)).sum::<u64>() == u64::from(DEFAULT_PARTITIONS)
            && members.iter().all(|m| {
                let n = owned(&m.id);
                (fair..=fair + 1).contains(&n) && m.owned == n
            });
        if split {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the {INSTANCES} instances did not split the partitions within {ASSIGNED_WITHIN:?}: {:?}",
            status.members
        );
        tokio::time::sleep(STATUS_POLL).await;
    }
}
