//! The consumer's run loop: start the parts, follow the assignment, shut
//! down gracefully.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, watch};
use tokio::time::Instant;
use tracing::{Instrument, info, warn};

use super::acker;
use super::cancels;
use super::completions::Completions;
use super::due_watch::DueWatch;
use super::erased::Runner;
use super::event::PartitionEvent;
use super::handover::Handover;
use super::idle_reads::{self, IdleReads};
use super::key_rates::KeyRates;
use super::key_slots::KeySlots;
use super::lanes::Lanes;
use super::limiter::Limiter;
use super::meters::{QueueGauges, TaskMetrics};
use super::policy::Order;
use super::room::Room;
use super::running::Running;
use super::scheduler;
use super::settings::ConsumerSettings;
use super::shared::Shared;
use super::startup::{self, Startup};
use super::task_keys::TaskKeys;
use crate::assignment::Standing;
use crate::clock::Clock;
use crate::config::ServiceName;
use crate::connection::{Backend, SharedConnection};
use crate::error::{Error, Result};
use crate::gate;
use crate::indexer::IndexerSettings;
use crate::indexer::Liveness;
use crate::instance::InstanceId;
use crate::lease::Lease;
use crate::limits::{self, Limits};
use crate::presence::Presence;
use crate::singleton::{self, Singletons};
use crate::tracking::{self, Tracking};

/// How long leaving at once waits for interrupted tasks to be enqueued again
/// and finished ones to be acked.
const ABANDON_AFTER: Duration = Duration::from_secs(1);
/// How long a finished leave waits for its last acks.
const ACKER_GRACE: Duration = Duration::from_secs(15);

/// Everything `run` needs, validated.
pub(super) struct Parts {
    pub(super) name: ServiceName,
    /// This instance.
    pub(super) id: InstanceId,
    /// The Redis, as errors and logs name it (no password).
    pub(super) redis: String,
    pub(super) backend: Backend,
    pub(super) indexer: IndexerSettings,
    pub(super) settings: ConsumerSettings,
    /// The handler service with its layers and the codec.
    pub(super) runner: Runner,
    pub(super) standing: watch::Sender<Standing>,
    pub(super) events: broadcast::Sender<PartitionEvent>,
    pub(super) clock: Arc<dyn Clock>,
    /// The singletons this instance may hold.
    pub(super) singletons: Vec<crate::singleton::Declared>,
}

/// Runs the consumer: a graceful leave when `signal` resolves, and a leave
/// at once when `again()` resolves after it, or at the leave timeout.
pub(super) async fn run<F>(
    parts: Parts,
    signal: impl Future<Output = ()> + Send,
    again: impl FnOnce() -> F + Send,
) -> Result<()>
where
    F: Future<Output = ()> + Send,
{
    let Parts {
        name,
        id,
        redis,
        backend,
        indexer,
        mut settings,
        runner,
        standing: published,
        events,
        clock,
        singletons,
    } = parts;
    let conn = Arc::new(SharedConnection::new(backend));
    tokio::pin!(signal);
    // The service's count, read before anything uses it (a stop while
    // Redis cannot be reached ends the wait): a consumer given none takes
    // the service's; one given a count of a resharded service must give
    // the current generation's, and then runs with the first's, which
    // `{N}:meta` keeps (docs/design.md §21).
    let mut in_use = None;
    match startup::service_partitions(&conn, &name, &redis, &mut signal).await? {
        Some((first, Some(current))) => {
            in_use = Some(current);
            if settings.partitions_given && settings.partitions != current.partitions {
                return Err(Error::invalid(
                    "partitions",
                    format!(
                        "service `{name}` now has {} partitions (resharded to generation {}); \
                         leave `partitions` unset to follow the service, or give {}",
                        current.partitions, current.number, current.partitions
                    ),
                ));
            }
            if let Some(first) = first {
                settings.partitions = first;
            }
        }
        Some((Some(first), None)) if !settings.partitions_given => settings.partitions = first,
        Some(_) => {}
        None => {
            info!(service = %name, instance = %id, "stopped before redis could be reached");
            return Ok(());
        }
    }
    let fields = settings.meta_fields(runner.codec());
    let timing = indexer.timing(settings.drain_timeout);
    let leave_timeout = settings.leave_timeout(indexer.interval);
    let presence = Arc::new(Presence::new(clock.clone(), indexer.weight));
    // The rounds' thread claims an index only while this runtime runs.
    let liveness = Liveness::new();
    let beating = AbortOnDrop(tokio::spawn(
        liveness.clone().beat_every(indexer.interval / 10),
    ));
    let startup = Startup {
        name: &name,
        id: &id,
        redis: &redis,
        conn: &conn,
        indexer: &indexer,
        clock: &clock,
        meta: &fields,
        current: in_use.unwrap_or(crate::reshard::Generation {
            number: 0,
            partitions: settings.partitions,
        }),
        streams: settings.streams(),
        allow_eviction: settings.allow_eviction,
        periodic: &settings.periodic,
        presence: &presence,
        liveness: &liveness,
    };
    // A stop while Redis cannot be reached ends the wait for it.
    let Some(indexer) = startup.run(&mut signal).await? else {
        info!(service = %name, instance = %id, "stopped before redis could be reached");
        return Ok(());
    };
    let (first, first_limits) = loop {
        let ensured = tokio::select! {
            _ = &mut signal => {
                info!(service = %name, instance = %id, "stopped before it could read whether tasks are tracked");
                indexer.stop().await;
                return Ok(());
            }
            ensured = controls(&conn, &name, &settings) => ensured,
        };
        match ensured {
            Ok(first) => break first,
            // Redis answered the start's reads just now: a short outage.
            Err(e @ (Error::Redis(_) | Error::Pool(_) | Error::Timeout(_))) => {
                warn!(service = %name, cause = %e, "cannot read whether tasks are tracked or limited; trying again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let completions = Arc::new(Completions::default());
    let (acks, mut acker) = acker::spawn(name.clone(), conn.clone(), completions.clone());
    let (tracked, tracking_watcher) = tracking::watch::watch(name.clone(), conn.clone(), first);
    let (limits, limits_watcher) = limits::watch(name.clone(), conn.clone(), first_limits);
    let key_slots = Arc::new(KeySlots::new(&name, limits.clone(), presence.clone()));
    // With a function of the task as the key, its runs and starts are
    // counted in Redis.
    let units = settings.limit_key.then(|| {
        let units = Arc::new(TaskKeys::new(
            name.clone(),
            id.as_str(),
            limits.clone(),
            3 * timing.interval,
            key_slots.wakes().clone(),
        ));
        key_slots.count_in_redis(units.clone());
        let leaser = AbortOnDrop(tokio::spawn(
            units.clone().lease(conn.clone()).in_current_span(),
        ));
        (units, leaser)
    });
    let key_rates = Arc::new(KeyRates::new(limits.clone(), key_slots.wakes().clone()));
    let limiter = Arc::new(Limiter::new(&name, conn.clone(), limits));
    let running = Arc::new(Running::default());
    let cancels = cancels::listen(
        name.clone(),
        conn.backend().pubsub.clone(),
        tracked.clone(),
        running.clone(),
    );
    // Seen within one interval or one second, whichever is shorter.
    let (gate, gate_watcher) = gate::watch(
        name.clone(),
        conn.clone(),
        timing.interval.min(Duration::from_secs(1)),
    );
    let (reports, reported) = mpsc::unbounded_channel();
    let lease = Lease::new(clock.clone());
    // Beside the partitions, with a lease of their own from the same
    // assignments (docs/design.md §20).
    let singletons = Singletons::spawn(singleton::Setup {
        service: name.clone(),
        id: id.clone(),
        conn: conn.clone(),
        timing,
        lease: Lease::new(clock.clone()),
        gate: gate.clone(),
        standing: indexer.standing(),
        singletons,
    });
    let levels = settings.levels();
    let room = Arc::new(Room::new(settings.concurrency, levels.any()));
    let order = Order::of(settings.ordered);
    let (idle, idle_reader) = IdleReads::spawn(idle_reads::Setup {
        backend: conn.backend().clone(),
        conn: conn.clone(),
        lease: lease.clone(),
        gate: gate.clone(),
        room: room.clone(),
        order,
        batch: settings.batch,
        block: settings.block,
    });
    let lanes = Arc::new(Lanes::new(conn.clone()));
    let lanes_let_go = lanes.spawn_let_go();
    let (due, due_watcher) = DueWatch::spawn(name.clone(), conn.clone(), clock.clone());
    let forwarder = AbortOnDrop(tokio::spawn(
        completions
            .clone()
            .run(name.clone(), conn.clone())
            .in_current_span(),
    ));
    let shared = Arc::new(Shared {
        name: name.clone(),
        id: id.clone(),
        conn,
        lanes,
        idle,
        runner,
        order,
        metrics: TaskMetrics::new(&name, presence.clone()),
        queue: QueueGauges::new(&name, presence.clone()),
        due,
        interval: timing.interval,
        gate,
        room,
        acks,
        reports,
        settings,
        tracking: tracked,
        running,
        limiter,
        key_slots,
        key_rates,
        levels,
        completions,
    });
    info!(service = %name, instance = %id, "consumer started");

    let stop_jobs = tokio_util::sync::CancellationToken::new();
    let jobs = scheduler::spawn(
        &shared,
        clock.clone(),
        indexer.standing(),
        stop_jobs.clone(),
    );
    let mut handover = Handover::new(shared.clone(), timing, lease, reported, events);
    let mut standing = indexer.standing();
    let mut make_again = Some(again);
    let mut again: Option<Pin<Box<F>>> = None;
    let mut leave_by: Option<Instant> = None;
    // The indexer published `Left`, or the instance leaves at once: no more
    // standings are followed.
    let mut left = false;
    // Leaving at once: what is still underway by then is abandoned (entries
    // not acked or enqueued again stay pending, and the partitions' next
    // owners claim them).
    let mut abandon_at: Option<Instant> = None;
    let mut failure = None;
    loop {
        if left && handover.is_done() {
            break;
        }
        let at_once = tokio::select! {
            biased;
            _ = &mut signal, if leave_by.is_none() => {
                info!(service = %name, instance = %id, "leaving: no more rounds; serving until the first round without this instance");
                indexer.leave();
                leave_by = Some(Instant::now() + leave_timeout);
                again = make_again.take().map(|make| Box::pin(make()));
                false
            }
            _ = async { again.as_mut().expect("checked").await }, if again.is_some() && abandon_at.is_none() => {
                warn!(service = %name, instance = %id, "second signal: leaving at once");
                true
            }
            _ = tokio::time::sleep_until(leave_by.unwrap_or_else(Instant::now)), if leave_by.is_some() && abandon_at.is_none() => {
                warn!(service = %name, instance = %id, timeout = ?leave_timeout, "graceful leave timed out; leaving at once");
                true
            }
            _ = tokio::time::sleep_until(abandon_at.unwrap_or_else(Instant::now)), if abandon_at.is_some() => {
                warn!(service = %name, instance = %id, "left at once; abandoning what redis has not confirmed");
                break;
            }
            changed = standing.changed(), if !left => {
                if changed.is_err() {
                    // Never expected: the indexer ends only after `Left`.
                    failure = Some(Error::Runtime(format!("the peer indexer of `{name}` stopped unexpectedly")));
                    true
                } else {
                    let now = standing.borrow_and_update().clone();
                    handover.standing(&now);
                    left = matches!(now, Standing::Left { .. });
                    published.send_replace(now);
                    false
                }
            }
            wake = handover.next() => {
                handover.handle(wake);
                false
            }
        };
        if at_once {
            handover.leave_at_once();
            singletons.leave_at_once();
            left = true;
            abandon_at = Some(Instant::now() + ABANDON_AFTER);
        }
    }

    // The singletons follow the same `Left`: their jobs end and their marks
    // are written before the rounds stop.
    singletons
        .finished(abandon_at.unwrap_or_else(|| {
            leave_by
                .unwrap_or_else(Instant::now)
                .max(Instant::now() + ABANDON_AFTER)
        }))
        .await;
    stop_jobs.cancel();
    drop(jobs);
    drop(gate_watcher);
    drop(tracking_watcher);
    drop(limits_watcher);
    drop(cancels);
    drop(due_watcher);
    drop(lanes_let_go);
    drop(forwarder);
    indexer.stop().await;
    drop(beating);
    drop(handover);
    drop(idle_reader);
    if let Some((units, leaser)) = units {
        // The tasks have ended: their keys' units go back at once rather
        // than lapse (others would wait three intervals for them).
        drop(leaser);
        let conn = shared.conn.clone();
        let _ = tokio::time::timeout(Duration::from_secs(1), units.give_all_back(&conn)).await;
    }
    // The acker ends once the last sender (in `shared`) is gone.
    drop(shared);
    let abandon_at = abandon_at.unwrap_or_else(|| Instant::now() + ACKER_GRACE);
    if tokio::time::timeout_at(abandon_at, &mut acker)
        .await
        .is_err()
    {
        warn!(service = %name, instance = %id, "acks still underway abandoned; those tasks stay pending and run again");
        acker.abort();
    }
    info!(service = %name, instance = %id, "stopped");
    failure.map_or(Ok(()), Err)
}

/// A spawned task that ends with its handle: the beat stops with the
/// instance however `run` returns.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a start finds of the operators' settings: tracking and the flow
/// limits, each written from the builder's value if the service has none.
async fn controls(
    conn: &SharedConnection,
    name: &ServiceName,
    settings: &ConsumerSettings,
) -> Result<(Tracking, Limits)> {
    let tracking = tracking::ensure(conn, name, settings.tracking).await?;
    let limits = limits::ensure(conn, name, settings.limits).await?;
    Ok((tracking, limits))
}
