//! A consumer process of the run: two services (the unordered one with
//! retries, delays, dead letters, tracking, workflow batches, a periodic
//! job and a rate limit; the ordered one with keys), one handler that writes each run's
//! start and effect to this process's history before it returns.

use std::sync::Arc;
use std::time::Duration;

use peerq::assignment::Standing;
use peerq::handler::HandlerWithResult;
use peerq::tracking::Tracking;
use peerq::{Backoff, Consumer, HandlerError, Periodic, Redis, TaskContext};

use tokio::sync::watch;

use crate::history::Log;
use crate::plan::{self, Job, Kind, now_us};

/// The unordered service's name for run `base`, and the ordered one's.
pub(crate) fn services(base: &str) -> (String, String) {
    (base.to_owned(), format!("{base}-ordered"))
}

/// Runs both services until SIGTERM (a graceful leave); the environment
/// names the Redis (`PEERQ_CHAOS_REDIS`), the services
/// (`PEERQ_CHAOS_SERVICE`) and the history file (`PEERQ_CHAOS_EVENTS`).
pub(crate) fn main() {
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let (redis, base, events) = (
        var("PEERQ_CHAOS_REDIS"),
        var("PEERQ_CHAOS_SERVICE"),
        var("PEERQ_CHAOS_EVENTS"),
    );
    let limit: u32 = var("PEERQ_CHAOS_LIMIT").parse().expect("a limit");
    crate::logs();
    let log = Arc::new(Log::open(events.as_ref()));
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async move {
        let (unordered, ordered) = services(&base);
        let common = |name: &str| {
            Consumer::builder()
                .redis(Redis::url(&redis))
                .name(name)
                .interval(plan::INTERVAL)
                .drain_timeout(plan::DRAIN)
                .skew(plan::SKEW)
                .max_attempts(plan::MAX_ATTEMPTS)
                .backoff(Backoff::exponential(
                    Duration::from_millis(100),
                    Duration::from_secs(1),
                ))
        };
        let a = common(&unordered)
            .partitions(plan::PARTITIONS)
            // Enough final records per partition (the default keeps 1,000)
            // that those the run's end reads are still there.
            .tracking(Tracking::on().keep_count(plan::KEEP_RECORDS))
            .rate_limit(limit, Duration::from_secs(1))
            .periodic(
                Periodic::every("tick", plan::TICK),
                &Job {
                    n: 0,
                    kind: Kind::Tick,
                },
            )
            .handler(Chaos {
                ordered: false,
                log: log.clone(),
            });
        tokio::spawn(standing('a', a.standing(), log.clone()));
        let o = common(&ordered)
            .partitions(plan::ORDERED_PARTITIONS)
            .ordered(true)
            .handler(Chaos {
                ordered: true,
                log: log.clone(),
            });
        tokio::spawn(standing('o', o.standing(), log));
        let (a, o) = tokio::join!(a.run(), o.run());
        a.expect("the unordered service's consumer");
        o.expect("the ordered service's consumer");
    });
}

/// Writes `A svc 1 at` when service `svc`'s instance becomes assigned,
/// `A svc f at` when it fences itself (a round failed, late or not
/// counted; a lease that ran out), `A svc o at` for any other standing
/// (joining, leaving): why a periodic due time was not triggered (no
/// instance was assigned), and why a task it had finished ran again (a
/// fence before its ack landed, which the guarantees allow).
async fn standing(svc: char, mut rx: watch::Receiver<Standing>, log: Arc<Log>) {
    let mut was = None;
    loop {
        let now = match *rx.borrow_and_update() {
            Standing::Assigned(_) => '1',
            Standing::Fenced { .. } => 'f',
            _ => 'o',
        };
        if was != Some(now) {
            log.write(&format!("A {svc} {now} {}\n", now_us()));
            was = Some(now);
        }
        if rx.changed().await.is_err() {
            log.write(&format!("A {svc} o {}\n", now_us()));
            return;
        }
    }
}

/// The run's handler: works 2 ms, fails or succeeds as the task's kind
/// says, and writes its effect only while it still owns the partition.
struct Chaos {
    ordered: bool,
    log: Arc<Log>,
}

impl Chaos {
    fn svc(&self) -> char {
        if self.ordered { 'o' } else { 'a' }
    }
}

impl HandlerWithResult for Chaos {
    type Task = Job;
    type Output = u64;

    async fn handle(&self, job: Job, cx: TaskContext) -> Result<u64, HandlerError> {
        // A tick's number is its due time, from its id `cron:tick:<ms>`.
        let n = match job.kind {
            Kind::Tick => cx
                .task_id()
                .as_str()
                .rsplit(':')
                .next()
                .and_then(|ms| ms.parse().ok())
                .ok_or_else(|| HandlerError::msg("a tick's id names its due time"))?,
            _ => job.n,
        };
        let (p, token, attempt) = (cx.partition(), cx.fencing_token(), cx.attempt());
        self.log.write(&format!(
            "S {} {n} {p} {token} {attempt} {}\n",
            self.svc(),
            now_us()
        ));
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(2)) => {}
            _ = cx.cancelled() => return Err(HandlerError::msg("interrupted")),
        }
        match job.kind {
            Kind::Poison => return Err(HandlerError::msg("poison")),
            Kind::RetryOnce if cx.failures() == 0 => return Err(HandlerError::msg("first run")),
            _ => {}
        }
        // The effect: its line, on disk before the ack can be sent. The
        // time is taken before the check, so that a freeze between a
        // check that passed and the clock read cannot date it later.
        let checked = now_us();
        if !cx.still_owned() {
            return Err(HandlerError::msg("no longer the partition's owner"));
        }
        let line = match job.kind {
            Kind::Tick => format!("T {n} {p} {token} {attempt} {checked} {}\n", now_us()),
            _ => format!(
                "F {} {n} {p} {token} {attempt} {checked} {}\n",
                self.svc(),
                now_us()
            ),
        };
        self.log.write(&line);
        cx.finished();
        Ok(n)
    }
}
