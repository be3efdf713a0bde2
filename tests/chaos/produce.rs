//! A producer process of the run: every 50 ms a batch of tasks of every
//! kind on the unordered service and a batch of keyed tasks on the ordered
//! one, each task with an idempotency key, so that its own retry after an
//! error (a reply lost in a Redis restart) never enqueues a task twice;
//! every 5 s a workflow batch. A batch's `E` lines are written once its
//! enqueue returned success. Stops at SIGTERM, after the batch in hand.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use peerq::admin::{Admin, Service};
use peerq::tracking::{CancelOutcome, TaskHandle};
use peerq::{Options, Producer, Redis, TaskId};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::signal::unix::{SignalKind, signal};

use crate::again;
use crate::consume::services;
use crate::history::{Log, kind_words};
use crate::plan::{self, Job, Kind, now_us, number};

/// The tick between two batches.
const TICK: Duration = Duration::from_millis(50);

/// Runs until SIGTERM: `PEERQ_CHAOS_REDIS`, `PEERQ_CHAOS_SERVICE`,
/// `PEERQ_CHAOS_EVENTS`, `PEERQ_CHAOS_PRODUCER` (this producer's number),
/// `PEERQ_CHAOS_RATE` (its tasks per second) and `PEERQ_CHAOS_SEED`.
pub(crate) fn main() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let num = |name: &str| -> u64 { var(name).parse().expect("a number") };
    let (redis, base, events) = (
        var("PEERQ_CHAOS_REDIS"),
        var("PEERQ_CHAOS_SERVICE"),
        var("PEERQ_CHAOS_EVENTS"),
    );
    let (me, rate, seed) = (
        num("PEERQ_CHAOS_PRODUCER"),
        num("PEERQ_CHAOS_RATE"),
        num("PEERQ_CHAOS_SEED"),
    );
    crate::logs();
    let log = Log::open(events.as_ref());
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async move {
        let (unordered, ordered) = services(&base);
        let a = connect(&redis, &unordered).await;
        let o = connect(&redis, &ordered).await;
        let service = admin(&redis, &unordered).await;
        let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
        let mut rng = StdRng::seed_from_u64(seed ^ (me + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut sender = Sender {
            me,
            seq: 1,
            key_seqs: vec![0; plan::ORDERED_KEYS as usize],
            batches: 0,
            cancels: VecDeque::new(),
            log,
        };
        // Per tick: 90 % of the rate on the unordered service, 10 % keyed.
        let per_tick = (rate as f64 * TICK.as_secs_f64()).max(2.0);
        let (unordered_n, ordered_n) = (
            (per_tick * 0.9).round() as usize,
            ((per_tick * 0.1).round() as usize).clamp(1, plan::ORDERED_KEYS as usize),
        );
        let mut ticks = tokio::time::interval(TICK);
        let mut last_batch = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = term.recv() => break,
                _ = ticks.tick() => {}
            }
            sender.unordered(&a, unordered_n, &mut rng).await;
            sender.ordered(&o, ordered_n, &mut rng).await;
            sender.cancel_due(&service).await;
            if last_batch.elapsed() >= plan::BATCH_EVERY {
                last_batch = tokio::time::Instant::now();
                sender.workflow(&a).await;
            }
        }
    });
}

async fn connect(redis: &str, name: &str) -> Producer {
    again("connect", || Producer::connect(Redis::url(redis), name)).await
}

/// The unordered service's admin view, for cancels.
async fn admin(redis: &str, name: &str) -> Service {
    again("admin", || async {
        Admin::connect(Redis::url(redis)).await?.service(name).await
    })
    .await
}

/// How long after its enqueue a task to cancel is cancelled (it is due
/// 1 to 3 s after it).
pub(crate) const CANCEL_AFTER: Duration = Duration::from_millis(300);

/// A producer's numbering and history.
struct Sender {
    me: u64,
    seq: u64,
    key_seqs: Vec<u64>,
    batches: u64,
    /// Tasks to cancel, when, in order.
    cancels: VecDeque<(tokio::time::Instant, u64, TaskHandle)>,
    log: Log,
}

impl Sender {
    fn next(&mut self) -> u64 {
        self.seq += 1;
        number(self.me, self.seq)
    }

    /// `count` tasks of mixed kinds.
    async fn unordered(&mut self, producer: &Producer, count: usize, rng: &mut StdRng) {
        let mut tasks = Vec::with_capacity(count);
        for _ in 0..count {
            let n = self.next();
            let mut options = Options::new().idempotency_key(format!("t{n}"));
            let kind = match rng.random_range(0..100u32) {
                0..79 => Kind::Plain,
                79..89 => Kind::RetryOnce,
                89..98 => {
                    let delay = rng.random_range(0..plan::MAX_DELAY.as_millis() as u64);
                    let due = SystemTime::now() + Duration::from_millis(delay);
                    options = options.at(due);
                    let due_ms = due.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
                    Kind::Delayed { due_ms }
                }
                98 => {
                    let delay = Duration::from_millis(rng.random_range(1000..3000));
                    options = options.at(SystemTime::now() + delay);
                    Kind::Cancel
                }
                _ => Kind::Poison,
            };
            tasks.push((Job { n, kind }, options));
        }
        let ids = self.send(producer, &tasks).await;
        // The handles of every task to cancel and of one plain task in a
        // hundred: the run's end reads their records.
        let mut lines = String::new();
        let cancel_at = tokio::time::Instant::now() + CANCEL_AFTER;
        for ((job, options), id) in tasks.iter().zip(&ids) {
            let sampled = job.kind == Kind::Plain && job.n % 100 == 0;
            if job.kind == Kind::Cancel || sampled {
                let handle = producer.handle_with(id, options);
                lines.push_str(&format!("H {} {handle}\n", job.n));
                if job.kind == Kind::Cancel {
                    self.cancels.push_back((cancel_at, job.n, handle));
                }
            }
        }
        self.log.write(&lines);
    }

    /// Cancels the tasks whose time came, and writes what each cancel
    /// answered; one that fails is tried again at the next tick.
    async fn cancel_due(&mut self, service: &Service) {
        let now = tokio::time::Instant::now();
        while let Some((at, n, handle)) = self.cancels.front().cloned() {
            if at > now {
                return;
            }
            let outcome = match service.cancel(&handle).await {
                Ok(CancelOutcome::Cancelled) => "cancelled",
                Ok(CancelOutcome::Requested { .. }) => "requested",
                Ok(CancelOutcome::AlreadyFinal(_)) => "final",
                Ok(_) => "none",
                Err(e) => {
                    eprintln!("cancel {handle}: {e}; again at the next tick");
                    return;
                }
            };
            self.log.write(&format!("Q {n} {outcome} {}\n", now_us()));
            self.cancels.pop_front();
        }
    }

    /// `count` keyed tasks, each of another key, so that a batch that
    /// lands in part and is sent again cannot reorder a key.
    async fn ordered(&mut self, producer: &Producer, count: usize, rng: &mut StdRng) {
        let first = rng.random_range(0..plan::ORDERED_KEYS);
        let mut tasks = Vec::with_capacity(count);
        for i in 0..count as u32 {
            let key = (first + i) % plan::ORDERED_KEYS;
            self.key_seqs[key as usize] += 1;
            let seq = self.key_seqs[key as usize];
            let n = self.next();
            let options = Options::new()
                .key(format!("p{}k{key}", self.me))
                .idempotency_key(format!("t{n}"));
            let key = (self.me as u32) * plan::ORDERED_KEYS + key;
            tasks.push((
                Job {
                    n,
                    kind: Kind::Ordered { key, seq },
                },
                options,
            ));
        }
        self.send(producer, &tasks).await;
    }

    /// Sends `tasks` until it succeeds (the same idempotency keys every
    /// time), then writes their `E` lines; their ids.
    async fn send(&self, producer: &Producer, tasks: &[(Job, Options)]) -> Vec<TaskId> {
        let mut backoff = Duration::from_millis(50);
        let ids = loop {
            match producer.enqueue_batch_with(tasks).await {
                Ok(ids) => break ids,
                Err(e) => eprintln!("enqueue failed ({e}); again in {backoff:?}"),
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        };
        let at = now_us();
        let lines: String = tasks
            .iter()
            .map(|(job, _)| format!("E {} {at} {}\n", job.n, kind_words(job.kind)))
            .collect();
        self.log.write(&lines);
        ids
    }

    /// A workflow batch: five members and a callback. A batch whose
    /// enqueue failed is not sent again (a batch has no idempotency key):
    /// its members and callback, if they landed, are not the checker's.
    async fn workflow(&mut self, producer: &Producer) {
        self.batches += 1;
        let batch = number(self.me, self.batches);
        let members: Vec<Job> = (0..plan::BATCH_MEMBERS)
            .map(|_| Job {
                n: self.next(),
                kind: Kind::Member { batch },
            })
            .collect();
        let callback = Job {
            n: self.next(),
            kind: Kind::Callback { batch },
        };
        match producer.batch().callback(&callback).enqueue(&members).await {
            Ok(_) => {
                let at = now_us();
                let mut lines = format!("B {batch} {at}\n");
                for job in members.iter().chain([&callback]) {
                    lines.push_str(&format!("E {} {at} {}\n", job.n, kind_words(job.kind)));
                }
                self.log.write(&lines);
            }
            Err(e) => eprintln!("batch {batch} failed ({e}): not checked"),
        }
    }
}
