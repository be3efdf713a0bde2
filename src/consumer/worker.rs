//! One owned partition: fetch its entries, run them, keep their pending
//! entries fresh, claim what others left behind, and release it on demand.
//!
//! Each worker reads with `XREADGROUP` on a connection of its own (a
//! blocking read stalls every other command on its connection), whose
//! response timeout is above the block time. After any read error it first
//! re-reads its own pending entries (`0`), because a read that failed on the
//! client may still have been delivered into its pending list.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::streams::{
    StreamAutoClaimReply, StreamId, StreamReadOptions, StreamReadReply,
};
use deadpool_redis::redis::{self, AsyncCommands, aio::MultiplexedConnection};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;
use tracing::{Instrument, debug, error, info_span, warn};

use super::{Payload, Shared, TaskService};
use crate::assignment::Assignment;
use crate::codec::Codec;
use crate::handler::{Task, TaskContext};
use crate::keys;
use crate::task::Entry;

/// Longest pause between attempts to reach Redis again.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often the owner trims acknowledged entries from its partitions.
const TRIM_EVERY: Duration = Duration::from_secs(1);

static TRIM: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../scripts/trim.lua")));

/// A running worker for one partition.
#[derive(Debug)]
pub(crate) struct Worker {
    partition: u32,
    /// Stops fetching (and claiming).
    stop: CancellationToken,
    /// Cancels running tasks.
    cancel: CancellationToken,
    tracker: TaskTracker,
    fetch: JoinHandle<()>,
}

impl Worker {
    /// Starts working on `partition`.
    pub(crate) fn start<T: Payload, S: TaskService<T>, C: Codec>(
        shared: Arc<Shared<T, S, C>>,
        partition: u32,
        assignment: watch::Receiver<Assignment>,
    ) -> Worker {
        let stop = CancellationToken::new();
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        let fetcher = Fetcher {
            shared,
            partition,
            stream: String::new(),
            assignment,
            stop: stop.clone(),
            cancel: cancel.clone(),
            tracker: tracker.clone(),
            in_flight: Arc::new(Mutex::new(HashSet::new())),
        };
        let fetch = tokio::spawn(fetcher.run());
        Worker {
            partition,
            stop,
            cancel,
            tracker,
            fetch,
        }
    }

    /// The partition.
    pub(crate) fn partition(&self) -> u32 {
        self.partition
    }

    /// Stops fetching, lets running tasks finish until `deadline`, then
    /// cancels the rest and waits until they have stopped (DESIGN.md §4
    /// rule 1). Cancelled tasks are enqueued again with `attempt + 1`.
    pub(crate) async fn release(self, deadline: Instant) {
        self.stop.cancel();
        let _ = self.fetch.await;
        self.tracker.close();
        if tokio::time::timeout_at(deadline, self.tracker.wait())
            .await
            .is_err()
        {
            warn!(
                partition = self.partition,
                "drain timed out; cancelling running tasks"
            );
            self.cancel.cancel();
            self.tracker.wait().await;
        }
    }
}

/// A worker's own connection for blocking reads, and its id on the server
/// (to unblock a read on stop).
struct Reader {
    conn: MultiplexedConnection,
    client_id: u64,
}

/// The fetch loop of one partition and what its tasks share.
struct Fetcher<T, S, C> {
    shared: Arc<Shared<T, S, C>>,
    partition: u32,
    stream: String,
    assignment: watch::Receiver<Assignment>,
    stop: CancellationToken,
    cancel: CancellationToken,
    tracker: TaskTracker,
    /// Stream ids of the tasks running now: skipped when re-reading the
    /// pending list, kept fresh so nobody claims them.
    in_flight: Arc<Mutex<HashSet<String>>>,
}

impl<T: Payload, S: TaskService<T>, C: Codec> Fetcher<T, S, C> {
    async fn run(mut self) {
        self.stream = keys::stream(&self.shared.name, self.partition);
        let settings = &self.shared.settings;
        let (block, batch) = (settings.block, settings.batch);
        let keep_every = settings.claim_idle / 3;
        let mut reader: Option<Reader> = None;
        // Where the re-read of this instance's own pending list stands;
        // `None` once it is done and new entries (`>`) are read.
        let mut pending_from = Some("0".to_owned());
        let mut backoff = Duration::from_millis(50);
        let mut next_claim = Instant::now();
        let mut next_keep = Instant::now() + keep_every;
        let mut next_trim = Instant::now() + TRIM_EVERY;
        loop {
            if self.stop.is_cancelled() {
                return;
            }
            if Instant::now() >= next_trim {
                self.trim().await;
                next_trim = Instant::now() + TRIM_EVERY;
            }
            if Instant::now() >= next_keep {
                self.keep_fresh().await;
                next_keep = Instant::now() + keep_every;
            }
            if Instant::now() >= next_claim {
                if self.claim().await.is_err() {
                    reader = None;
                }
                next_claim = Instant::now() + keep_every;
            }
            // Read only while the instance has room, and about as much as
            // it has room for. No permit is held during the read: a blocked
            // read on an empty partition must not starve busy ones.
            tokio::select! {
                _ = self.stop.cancelled() => return,
                room = self.shared.permits.acquire() => drop(room),
            }
            let count = self.shared.permits.available_permits().clamp(1, batch);
            let Reader { conn, client_id } = match &mut reader {
                Some(reader) => reader,
                None => match self.connect_reader().await {
                    Ok(conn) => reader.insert(conn),
                    Err(e) => {
                        warn!(partition = self.partition, cause = %e, "cannot connect the reader; retrying");
                        self.pause(&mut backoff).await;
                        continue;
                    }
                },
            };
            let id = pending_from.clone().unwrap_or_else(|| ">".to_owned());
            let mut opts = StreamReadOptions::default()
                .group(keys::GROUP, self.shared.id.as_str())
                .count(count);
            if pending_from.is_none() {
                opts = opts.block(block.as_millis() as usize);
            }
            let (streams, ids) = ([self.stream.as_str()], [id.as_str()]);
            let (read, stopping) = {
                let read =
                    conn.xread_options::<_, _, Option<StreamReadReply>>(&streams, &ids, &opts);
                tokio::pin!(read);
                tokio::select! {
                    read = &mut read => (read, false),
                    _ = self.stop.cancelled() => {
                        // Unblock the read on the server and take its answer:
                        // entries it delivered are this instance's to run
                        // (and drain). Dropping the connection instead could
                        // leave entries delivered into the pending list, unseen.
                        let mut unblock = redis::cmd("CLIENT");
                        unblock.arg("UNBLOCK").arg(*client_id);
                        let _ = self.shared.conn.query::<u32>(&unblock).await;
                        match tokio::time::timeout(Duration::from_secs(1), &mut read).await {
                            Ok(read) => (read, true),
                            Err(_) => return,
                        }
                    }
                }
            };
            let entries: Vec<StreamId> = match read {
                Ok(reply) => reply
                    .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
                    .unwrap_or_default(),
                Err(e) => {
                    warn!(partition = self.partition, cause = %e, "read failed; re-reading the pending list");
                    reader = None;
                    pending_from = Some("0".to_owned());
                    self.pause(&mut backoff).await;
                    continue;
                }
            };
            backoff = Duration::from_millis(50);
            if let Some(from) = &mut pending_from {
                match entries.last() {
                    Some(last) => *from = last.id.clone(),
                    None => pending_from = None,
                }
            }
            for entry in entries {
                // A pending entry this instance is running already.
                if self.lock_in_flight().insert(entry.id.clone()) {
                    self.spawn_task(entry);
                }
            }
            if stopping {
                return;
            }
        }
    }

    /// A connection of its own for blocking reads, whose response timeout
    /// is above the block time (the client gives up on a reply after 500 ms
    /// by default, while the server may still deliver into the pending list).
    async fn connect_reader(&self) -> crate::Result<Reader> {
        // Taken out of the pool for good: the pool's recycling must not hand
        // a connection with a blocked read to anyone else.
        let pooled = self.shared.conn.pool().get().await?;
        let mut conn = deadpool_redis::Connection::take(pooled);
        conn.set_response_timeout(self.shared.settings.block + Duration::from_secs(5));
        let client_id: u64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut conn)
            .await?;
        Ok(Reader { conn, client_id })
    }

    async fn pause(&self, backoff: &mut Duration) {
        tokio::select! {
            _ = self.stop.cancelled() => {}
            _ = tokio::time::sleep(*backoff) => {}
        }
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
    }

    fn lock_in_flight(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Resets the idle time of the running tasks' pending entries, so that
    /// claiming never takes a task that is still running here.
    async fn keep_fresh(&self) {
        let ids: Vec<String> = self.lock_in_flight().iter().cloned().collect();
        if ids.is_empty() {
            return;
        }
        let mut cmd = redis::cmd("XCLAIM");
        cmd.arg(&self.stream)
            .arg(keys::GROUP)
            .arg(self.shared.id.as_str())
            .arg(0)
            .arg(&ids)
            .arg("JUSTID");
        if let Err(e) = self.shared.conn.query::<()>(&cmd).await {
            warn!(partition = self.partition, cause = %e, "could not keep running tasks' entries fresh");
        }
    }

    /// Trims the partition's acknowledged entries (only its owner does).
    async fn trim(&self) {
        let mut trim = TRIM.key(&self.stream);
        trim.arg(keys::GROUP);
        let trimmed: crate::Result<u64> = self.shared.conn.invoke(&trim).await;
        match trimmed {
            Ok(0) => {}
            Ok(n) => debug!(
                partition = self.partition,
                trimmed = n,
                "trimmed acknowledged entries"
            ),
            Err(e) => warn!(partition = self.partition, cause = %e, "trim failed"),
        }
    }

    /// Claims entries other consumers left pending longer than `claim_idle`
    /// (a crashed instance, a failed ack) and runs them.
    async fn claim(&self) -> crate::Result<()> {
        let idle = self.shared.settings.claim_idle.as_millis() as usize;
        let mut start = "0-0".to_owned();
        loop {
            let mut cmd = redis::cmd("XAUTOCLAIM");
            cmd.arg(&self.stream)
                .arg(keys::GROUP)
                .arg(self.shared.id.as_str())
                .arg(idle)
                .arg(&start)
                .arg("COUNT")
                .arg(self.shared.settings.batch);
            let reply: StreamAutoClaimReply = self.shared.conn.query(&cmd).await?;
            for entry in reply.claimed {
                if self.lock_in_flight().insert(entry.id.clone()) {
                    debug!(
                        partition = self.partition,
                        id = entry.id,
                        "claimed a pending entry"
                    );
                    self.spawn_task(entry);
                }
            }
            if reply.next_stream_id == "0-0" {
                return Ok(());
            }
            start = reply.next_stream_id;
        }
    }

    /// Runs `entry` in its own task, once the instance has room for it.
    fn spawn_task(&self, entry: StreamId) {
        let run = RunTask {
            shared: self.shared.clone(),
            partition: self.partition,
            stream: self.stream.clone(),
            assignment: *self.assignment.borrow(),
            stop: self.stop.clone(),
            cancel: self.cancel.child_token(),
            in_flight: self.in_flight.clone(),
        };
        self.tracker.spawn(run.run(entry));
    }
}

/// Runs one entry to its outcome: acked, enqueued again, or dead.
struct RunTask<T, S, C> {
    shared: Arc<Shared<T, S, C>>,
    partition: u32,
    stream: String,
    assignment: Assignment,
    /// The partition's release: a task not started by then is handed back.
    stop: CancellationToken,
    cancel: CancellationToken,
    in_flight: Arc<Mutex<HashSet<String>>>,
}

impl<T: Payload, S: TaskService<T>, C: Codec> RunTask<T, S, C> {
    async fn run(self, raw: StreamId) {
        let stream_id = raw.id.clone();
        // Wait for room; a task that has not started when its partition is
        // released is handed back (enqueued again, same attempt) instead of
        // making the drain wait for it.
        let permit = tokio::select! {
            biased;
            permit = self.shared.permits.clone().acquire_owned() => Some(permit.expect("never closed")),
            _ = self.stop.cancelled() => None,
        };
        match permit {
            Some(_permit) => self.execute(raw).await,
            None => self.hand_back(raw).await,
        }
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&stream_id);
    }

    /// Enqueues a fetched but never started entry again as it is, and acks
    /// this copy, so the partition's next owner runs it.
    async fn hand_back(&self, raw: StreamId) {
        let fields: Vec<(String, Vec<u8>)> = raw
            .map
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    redis::from_redis_value_ref::<Vec<u8>>(v).unwrap_or_default(),
                )
            })
            .collect();
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("XADD")
            .arg(&self.stream)
            .arg("*")
            .arg(fields)
            .ignore()
            .xack(&self.stream, keys::GROUP, &[&raw.id])
            .ignore();
        if let Err(e) = self.shared.conn.query_pipe::<()>(&pipe).await {
            error!(partition = self.partition, cause = %e, "could not hand back an unstarted task; it stays pending and will be claimed");
        }
    }

    async fn execute(&self, raw: StreamId) {
        let entry = match Entry::parse(&raw.map) {
            Ok(entry) => entry,
            Err(e) => {
                return self
                    .dead_letter(&raw, None, "malformed", &e.to_string())
                    .await;
            }
        };
        let payload: T = match self.decode(&entry) {
            Ok(payload) => payload,
            Err(e) => return self.dead_letter(&raw, Some(&entry), "decode", &e).await,
        };
        let span = info_span!(
            "task",
            task_id = %entry.id,
            partition = self.partition,
            attempt = entry.attempt,
            epoch = self.assignment.epoch
        );
        let cx = TaskContext {
            task_id: entry.id.clone(),
            attempt: entry.attempt,
            partition: self.partition,
            enqueued_at: UNIX_EPOCH + entry.enqueued_at,
            assignment: self.assignment,
            fencing_token: None,
            cancel: self.cancel.clone(),
        };
        let mut service = self.shared.service.clone();
        // Its own task, so a panic in the handler is a failed attempt.
        let mut handler = tokio::spawn(
            async move {
                let service = service.ready().await.map_err(Into::into)?;
                service.call(Task { payload, cx }).await.map_err(Into::into)
            }
            .instrument(span.clone()),
        );
        let outcome = tokio::select! {
            biased;
            outcome = &mut handler => outcome,
            _ = self.cancel.cancelled() => {
                handler.abort();
                match handler.await {
                    // It finished before the abort took effect: keep its outcome.
                    Ok(outcome) => Ok(outcome),
                    Err(join) if join.is_panic() => Err(join),
                    Err(_) => {
                        let _enter = span.enter();
                        warn!("task cancelled; enqueued again");
                        return self.retry(&raw.id, &entry, "cancelled at the drain timeout").await;
                    }
                }
            }
        };
        let _enter = span.enter();
        match outcome {
            Ok(Ok(())) => {
                let _ = self.shared.acks.send((self.partition, raw.id.clone()));
            }
            Ok(Err(e)) => self.failed(&raw, &entry, &e.to_string()).await,
            Err(join) => {
                let why = if join.is_panic() {
                    "handler panicked"
                } else {
                    "handler task aborted"
                };
                self.failed(&raw, &entry, why).await;
            }
        }
    }

    fn decode(&self, entry: &Entry) -> Result<T, String> {
        if entry.codec != C::NAME {
            return Err(format!(
                "entry is encoded with `{}`, this service uses `{}`",
                entry.codec,
                C::NAME
            ));
        }
        self.shared
            .codec
            .decode(&entry.payload)
            .map_err(|e| e.to_string())
    }

    async fn failed(&self, raw: &StreamId, entry: &Entry, error: &str) {
        if entry.attempt >= self.shared.settings.max_attempts {
            warn!(
                error,
                "task failed its last attempt; moved to the dead letters"
            );
            self.dead_letter(raw, Some(entry), "failed", error).await;
        } else {
            warn!(error, "task failed; enqueued again");
            self.retry(&raw.id, entry, error).await;
        }
    }

    /// Enqueues the task again with `attempt + 1` and acks this entry, in
    /// one transaction. (Backoff between attempts comes with the retries
    /// issue; the handover issue routes this through the fencing script.)
    async fn retry(&self, stream_id: &str, entry: &Entry, _why: &str) {
        let next = Entry {
            attempt: entry.attempt + 1,
            ..entry.clone()
        };
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("XADD")
            .arg(&self.stream)
            .arg("*")
            .arg(next.fields())
            .ignore()
            .xack(&self.stream, keys::GROUP, &[stream_id])
            .ignore();
        if let Err(e) = self.shared.conn.query_pipe::<()>(&pipe).await {
            error!(cause = %e, "could not enqueue the task again; it stays pending and will be claimed");
        }
    }

    /// Moves the entry to the partition's dead letters with the reason, and
    /// acks it, in one transaction.
    async fn dead_letter(&self, raw: &StreamId, entry: Option<&Entry>, reason: &str, error: &str) {
        error!(
            partition = self.partition,
            stream_id = raw.id,
            reason,
            error,
            "entry moved to the dead letters"
        );
        let mut fields: Vec<(String, Vec<u8>)> = match entry {
            Some(entry) => entry
                .fields()
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
            None => raw
                .map
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        redis::from_redis_value_ref::<Vec<u8>>(v).unwrap_or_default(),
                    )
                })
                .collect(),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        fields.push(("reason".into(), reason.into()));
        fields.push(("error".into(), error.into()));
        fields.push(("stream_id".into(), raw.id.clone().into_bytes()));
        fields.push(("dead_at".into(), now.as_millis().to_string().into_bytes()));
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("XADD")
            .arg(keys::dead(&self.shared.name, self.partition))
            .arg("*")
            .arg(fields)
            .ignore()
            .xack(&self.stream, keys::GROUP, &[&raw.id])
            .ignore();
        if let Err(e) = self.shared.conn.query_pipe::<()>(&pipe).await {
            error!(cause = %e, "could not move the entry to the dead letters; it stays pending and will be claimed");
        }
    }
}
