//! Cancel latency: from a `Service::cancel` call to the handler's
//! `cx.cancelled()` firing on the instance that runs the task.
//!
//! Two instances of one tracked service run in this process; the caller is
//! the bench's `Admin` `Service` (a connection of its own, never an
//! instance), so every cancel travels as a user's does: `cancel.lua` writes
//! the request, then a `PUBLISH` on `{N}:cancels` wakes the owner, which
//! fires the task's signal. Tasks arrive one `enqueue` each millisecond
//! (1,000 tasks/s); each runs until cancelled, and says it started on a
//! channel the canceller reads, which calls `cancel` at once, in a task of
//! its own per cancel (calls overlap as they would from many users). The
//! first [`WARM_UP`] tasks are left out of the figures (scripts loaded,
//! subscriptions up).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deadpool_redis::redis::aio::MultiplexedConnection;
use peerq::admin::Admin;
use peerq::handler::{CancelReason, Task};
use peerq::producer::Producer;
use peerq::tracking::{CancelOutcome, TaskHandle, Tracking};
use peerq::{Consumer, HandlerError};
use support::{RedisServer, unique_name};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{PATIENCE, Quantiles, job, pending, service_of, wait_assigned};

/// The instances.
const INSTANCES: usize = 2;
/// Tasks left out of the figures, first.
const WARM_UP: u64 = 200;
/// How long a task waits for its cancel before giving up (a lost cancel).
const GIVE_UP: Duration = Duration::from_secs(10);

/// What a task's handler saw.
struct Heard {
    /// When `cx.cancelled()` fired; `None` if it never did.
    at: Option<Instant>,
    /// The instance (0 or 1) that ran it.
    instance: usize,
    reason: Option<CancelReason>,
}

/// A cancel call.
struct Call {
    seq: u64,
    at: Instant,
    took: Duration,
    outcome: CancelOutcome,
    handle: TaskHandle,
}

/// What the run measured.
pub(crate) struct Cancels {
    /// Call → `cx.cancelled()` fired.
    latency: Quantiles,
    /// Call → `cancel` returned.
    call: Quantiles,
    /// Tasks per second enqueued (the warm-up's too).
    rate: f64,
    /// Measured tasks per instance.
    instances: [u64; INSTANCES],
    /// How the calls ended, by outcome.
    outcomes: BTreeMap<String, u64>,
    /// The measured tasks' final states.
    states: BTreeMap<String, u64>,
    /// Tasks whose signal fired for another reason than a user's cancel.
    not_user: u64,
    /// Tasks whose signal never fired.
    missed: u64,
}

pub(crate) async fn run(
    server: &RedisServer,
    admin: &Admin,
    conn: &mut MultiplexedConnection,
    cancels: u64,
) -> Cancels {
    let name = unique_name("cancel");
    let total = WARM_UP + cancels;
    let (started_tx, mut started) = mpsc::unbounded_channel::<(u64, TaskHandle)>();
    let heard: Arc<Mutex<HashMap<u64, Heard>>> = Arc::default();
    let stop = CancellationToken::new();
    let mut runs = Vec::new();
    for instance in 0..INSTANCES {
        let (started, heard) = (started_tx.clone(), heard.clone());
        let handler = tower::service_fn(move |task: Task<crate::Job>| {
            let (started, heard) = (started.clone(), heard.clone());
            async move {
                let (seq, cx) = (task.payload.seq, task.cx);
                let handle = TaskHandle::new(cx.partition(), cx.task_id().clone());
                let _ = started.send((seq, handle));
                let fired = tokio::time::timeout(GIVE_UP, cx.cancelled()).await.is_ok();
                let at = fired.then(Instant::now);
                let reason = cx.cancel_reason();
                heard.lock().unwrap().insert(
                    seq,
                    Heard {
                        at,
                        instance,
                        reason,
                    },
                );
                Ok::<(), HandlerError>(())
            }
        });
        let consumer = Consumer::builder()
            .name(&name)
            .redis(server.url())
            .tracking(Tracking::on())
            .service(handler);
        runs.push(tokio::spawn(
            consumer.run_until(stop.clone().cancelled_owned()),
        ));
    }
    drop(started_tx);
    let service = service_of(admin, &name).await;
    wait_assigned(&service, INSTANCES).await;
    assert!(service.tracking().await.unwrap().is_on());
    let producer = Producer::connect(&server.url(), &name).await.unwrap();

    let canceller = {
        let service = service.clone();
        tokio::spawn(async move {
            let mut calls = Vec::new();
            for _ in 0..total {
                let (seq, handle) = started.recv().await.expect("a task started");
                let service = service.clone();
                calls.push(tokio::spawn(async move {
                    let at = Instant::now();
                    let outcome = service.cancel(&handle).await.unwrap();
                    Call {
                        seq,
                        at,
                        took: at.elapsed(),
                        outcome,
                        handle,
                    }
                }));
            }
            let mut done = Vec::new();
            for call in calls {
                done.push(call.await.unwrap());
            }
            done
        })
    };
    let began = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for seq in 0..total {
        tick.tick().await;
        producer.enqueue(&job(seq)).await.unwrap();
    }
    let rate = total as f64 / began.elapsed().as_secs_f64();
    let calls = tokio::time::timeout(PATIENCE, canceller)
        .await
        .expect("every task started and was cancelled")
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while (heard.lock().unwrap().len() as u64) < total || pending(conn, &name).await > 0 {
        assert!(Instant::now() < deadline, "tasks still running");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let heard = std::mem::take(&mut *heard.lock().unwrap());
    let (mut latencies, mut took) = (Vec::new(), Vec::new());
    let mut instances = [0; INSTANCES];
    let (mut outcomes, mut states) = (BTreeMap::new(), BTreeMap::new());
    let (mut not_user, mut missed) = (0, 0);
    for call in calls.iter().filter(|c| c.seq >= WARM_UP) {
        let task = &heard[&call.seq];
        instances[task.instance] += 1;
        let outcome = match &call.outcome {
            CancelOutcome::Requested { .. } => "requested (running)".to_owned(),
            other => format!("{other:?}"),
        };
        *outcomes.entry(outcome).or_default() += 1;
        took.push(call.took);
        if task.reason != Some(CancelReason::User) {
            not_user += 1;
        }
        match task.at {
            Some(at) => latencies.push(at.saturating_duration_since(call.at)),
            None => missed += 1,
        }
        let record = service.task(&call.handle).await.unwrap();
        let state = record.and_then(|r| r.state).map(|s| s.to_string());
        *states
            .entry(state.unwrap_or_else(|| "none".to_owned()))
            .or_default() += 1;
    }
    stop.cancel();
    for run in runs {
        run.await.unwrap().unwrap();
    }
    Cancels {
        latency: Quantiles::of(latencies),
        call: Quantiles::of(took),
        rate,
        instances,
        outcomes,
        states,
        not_user,
        missed,
    }
}

impl Cancels {
    pub(crate) fn print(&self) {
        let counts = |m: &BTreeMap<String, u64>| {
            let each: Vec<String> = m.iter().map(|(k, n)| format!("{k} {n}")).collect();
            each.join(", ")
        };
        println!(
            "| cancel: {INSTANCES} instances, tasks arriving at {:.0}/s, each cancelled by `Service::cancel` as it starts ({} cancels after {WARM_UP} left out) | p50 / p99 / max |",
            self.rate, self.latency.n
        );
        println!("|---|---|");
        println!(
            "| call → `cx.cancelled()` fired on the instance running the task | **{}** |",
            self.latency.ms()
        );
        println!("| call → `cancel` returned | {} |", self.call.ms());
        let split: Vec<String> = self.instances.iter().map(u64::to_string).collect();
        println!("| tasks run by each instance | {} |", split.join(" / "));
        println!("| outcomes of the calls | {} |", counts(&self.outcomes));
        println!("| the tasks' final states | {} |", counts(&self.states));
        println!(
            "| signals that fired for another reason / never fired | {} / {} |",
            self.not_user, self.missed
        );
        println!();
    }
}
