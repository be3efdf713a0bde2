//! The consumer's run loop: start the parts, follow the assignment, shut
//! down gracefully.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use deadpool_redis::Pool;
use deadpool_redis::redis;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::worker::Worker;
use super::{ConsumerSettings, Payload, Shared, TaskService, acker};
use crate::assignment::Assignment;
use crate::codec::Codec;
use crate::config::{self, IndexerSettings, ServiceName, fmt_duration};
use crate::connection::SharedConnection;
use crate::error::{Error, Result};
use crate::indexer::{Indexer, Standing};
use crate::instance::InstanceId;
use crate::{keys, meta};

/// Everything `run` needs, validated.
pub(super) struct Parts<S, C> {
    pub(super) name: ServiceName,
    pub(super) pool: Pool,
    pub(super) indexer: IndexerSettings,
    pub(super) settings: ConsumerSettings,
    pub(super) service: S,
    pub(super) codec: C,
    pub(super) standing: watch::Sender<Standing>,
}

/// Resolves on SIGTERM or ctrl-c.
pub(super) async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            },
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

pub(super) async fn run<T: Payload, S: TaskService<T>, C: Codec>(
    parts: Parts<S, C>,
    signal: impl Future<Output = ()> + Send,
) -> Result<()> {
    let Parts {
        name,
        pool,
        indexer,
        settings,
        service,
        codec,
        standing: published,
    } = parts;
    let conn = Arc::new(SharedConnection::new(pool.clone()));
    check_eviction(&conn, settings.allow_eviction).await?;
    let mut fields = config::queue_meta_fields(settings.partitions, C::NAME);
    fields.push(("drain_timeout", fmt_duration(settings.drain_timeout)));
    meta::ensure(&mut conn.get().await?, &name, &fields).await?;
    create_groups(&conn, &name, settings.partitions).await?;

    let id = InstanceId::generate();
    let indexer = Indexer::builder()
        .name(name.as_str())
        .pool(pool)
        .interval(indexer.interval)
        .skew(indexer.skew)
        .lease_margin(indexer.lease_margin)
        .indexing(indexer.indexing)
        .instance_id(id.clone())
        .build()?
        .start()
        .await?;
    let (acks, acker) = acker::spawn(name.clone(), conn.clone());
    let shared = Arc::new(Shared {
        name: name.clone(),
        id: id.clone(),
        conn,
        service,
        codec,
        permits: Arc::new(Semaphore::new(settings.concurrency)),
        acks,
        settings,
        task: PhantomData,
    });
    info!(service = %name, instance = %id, "consumer started");

    let mut ownership = Ownership {
        shared: shared.clone(),
        workers: BTreeMap::new(),
        assignment: None,
        idle: false,
    };
    let mut standing = indexer.standing();
    tokio::pin!(signal);
    loop {
        tokio::select! {
            _ = &mut signal => break,
            changed = standing.changed() => {
                if changed.is_err() {
                    // Never expected: the indexer ends only when told to.
                    ownership.release_all().await;
                    return Err(Error::Runtime(format!("the peer indexer of `{name}` stopped unexpectedly")));
                }
                let now = standing.borrow_and_update().clone();
                ownership.follow(&now).await;
                published.send_replace(now);
            }
        }
    }

    info!(service = %name, instance = %id, "shutting down");
    indexer.stop().await;
    ownership.release_all().await;
    drop(ownership);
    // The acker ends once the last sender (in `shared`) is gone.
    drop(shared);
    let _ = acker.await;
    info!(service = %name, instance = %id, "stopped");
    Ok(())
}

/// The partitions this instance works on, and their workers.
struct Ownership<T, S, C> {
    shared: Arc<Shared<T, S, C>>,
    workers: BTreeMap<u32, Worker>,
    /// The assignment in force, for the tasks' context.
    assignment: Option<watch::Sender<Assignment>>,
    /// Whether the last assignment owned no partition (logged once).
    idle: bool,
}

impl<T: Payload, S: TaskService<T>, C: Codec> Ownership<T, S, C> {
    /// Moves to the partitions `standing` owns: releases the others (drain,
    /// then cancel), starts the new ones; kept partitions run on.
    async fn follow(&mut self, standing: &Standing) {
        let partitions = self.shared.settings.partitions;
        let target: BTreeSet<u32> = match standing {
            Standing::Assigned(a) => a.owned_partitions(partitions).collect(),
            _ => BTreeSet::new(),
        };
        // Release first: tasks the released workers still start run under
        // the assignment that owned their partition, never the new one.
        let released: Vec<u32> = self
            .workers
            .keys()
            .filter(|p| !target.contains(p))
            .copied()
            .collect();
        if !released.is_empty() {
            debug!(service = %self.shared.name, ?released, "releasing partitions");
            let deadline = Instant::now() + self.shared.settings.drain_timeout;
            let workers = released
                .iter()
                .filter_map(|p| self.workers.remove(p))
                .collect();
            drain(workers, deadline).await;
        }
        let Standing::Assigned(a) = standing else {
            return;
        };
        let idle = target.is_empty();
        if idle && !self.idle {
            info!(service = %self.shared.name, index = a.index, replicas = a.replicas, partitions,
                  "more instances than partitions: this instance idles");
        }
        self.idle = idle;
        let assignment = self.assignment.get_or_insert_with(|| watch::channel(*a).0);
        assignment.send_replace(*a);
        for p in target {
            if !self.workers.contains_key(&p) {
                let worker = Worker::start(self.shared.clone(), p, assignment.subscribe());
                self.workers.insert(p, worker);
            }
        }
    }

    async fn release_all(&mut self) {
        let deadline = Instant::now() + self.shared.settings.drain_timeout;
        let workers = std::mem::take(&mut self.workers).into_values().collect();
        drain(workers, deadline).await;
    }
}

/// Releases `workers` in parallel, each draining until `deadline`.
async fn drain(workers: Vec<Worker>, deadline: Instant) {
    let mut set = tokio::task::JoinSet::new();
    for worker in workers {
        let p = worker.partition();
        set.spawn(async move {
            worker.release(deadline).await;
            p
        });
    }
    while set.join_next().await.is_some() {}
}

/// Refuses a Redis that may evict keys, unless the user allowed it. Reads
/// `INFO memory`, which managed services and ACL users allow more often
/// than `CONFIG GET`.
async fn check_eviction(conn: &SharedConnection, allowed: bool) -> Result<()> {
    let info: String = conn.query(redis::cmd("INFO").arg("memory")).await?;
    let policy = info
        .lines()
        .find_map(|l| l.strip_prefix("maxmemory_policy:"))
        .map(|p| p.trim().to_owned())
        .unwrap_or_default();
    if policy == "noeviction" || policy.is_empty() {
        return Ok(());
    }
    if allowed {
        warn!(
            policy,
            "redis may evict keys (maxmemory-policy); tasks and coordination keys can be lost"
        );
        return Ok(());
    }
    Err(Error::invalid(
        "allow_eviction",
        format!(
            "redis has maxmemory-policy `{policy}`, which can silently evict tasks, owner records and \
             marks; set it to `noeviction` (CONFIG SET maxmemory-policy noeviction), or call \
             .allow_eviction(true) to run anyway"
        ),
    ))
}

/// Creates every partition's stream and consumer group, reading from the
/// start, so tasks enqueued before any consumer existed are delivered. One
/// pipeline; BUSYGROUP (the group exists) is the common answer.
async fn create_groups(conn: &SharedConnection, name: &ServiceName, partitions: u32) -> Result<()> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for p in 0..partitions {
        pipe.cmd("XGROUP")
            .arg("CREATE")
            .arg(keys::stream(name, p))
            .arg(keys::GROUP)
            .arg("0")
            .arg("MKSTREAM");
    }
    let replies: Vec<redis::RedisResult<redis::Value>> = conn.query_pipe(&pipe).await?;
    for reply in replies {
        match reply {
            Ok(_) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
