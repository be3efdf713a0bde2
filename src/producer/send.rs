//! One task's enqueue: a plain `XADD`, or the enqueue script when the task
//! has an idempotency key, a unique key, a delay or (sent by the outbox
//! relay) a dedup record of its own. Tracked, a plain task's record goes
//! just before its `XADD`, in one round trip (docs/design.md §14).

use std::sync::LazyLock;
use std::time::{Duration, UNIX_EPOCH};

use deadpool_redis::redis;
use serde::Serialize;
use tracing::warn;

use super::{Options, Producer, route};
use crate::codec::Codec;
use crate::entry::{Entry, TaskId};
use crate::error::{Duplicate, Error, Result};
use crate::keys;
use crate::reshard::Generation;
use crate::tracking::{PAD, packed, tracked_script};

pub(super) static ENQUEUE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(tracked_script!("enqueue.lua")));

/// What became of one task sent through the enqueue script.
#[derive(Debug)]
pub(super) enum Enqueued {
    /// Added, with this id.
    New(TaskId),
    /// A dedup record named an earlier task: nothing added.
    Earlier(TaskId),
    /// Its unique key is held by this task: nothing added.
    Refused(TaskId),
}

/// `enqueue.lua`'s third reply when a reshard sealed the partition.
pub(super) const SEALED: u8 = 2;
/// Its third reply to a probe of a partition not sealed yet.
pub(super) const NOT_SEALED: u8 = 3;
/// How long an enqueue waits for a partition of the replaced layout to be
/// sealed (its owner does so at its next assignment).
pub(super) const SEAL_WITHIN: Duration = Duration::from_secs(30);

/// What the replaced layout's partition said (docs/design.md §21).
enum Asked {
    /// Nothing there: the task goes to the new layout.
    Clear,
    /// Its record names an earlier task, or the unique key's holder.
    Found(Enqueued),
    /// The outbox relay's deadline passed.
    Late,
}

/// What one send did.
enum Sent {
    Enqueued(Enqueued),
    /// A reshard sealed the partition: nothing was written.
    Sealed,
}

impl Enqueued {
    /// The enqueue script's reply for task `id`: the id it names, its due
    /// time, and whether the unique key refused it.
    pub(super) fn of(id: &TaskId, (named, _, refused): (String, u64, u8)) -> Enqueued {
        let named = TaskId::from(named.as_str());
        match (refused, named == *id) {
            (1.., _) => Enqueued::Refused(named),
            (0, true) => Enqueued::New(named),
            (0, false) => Enqueued::Earlier(named),
        }
    }
}

impl<C: Codec> Producer<C> {
    /// Enqueues one task; its id, and whether it is new (not a repeat of an
    /// idempotency key).
    pub(super) async fn send<T: Serialize>(
        &self,
        task: T,
        options: Options,
    ) -> Result<(TaskId, bool)> {
        options.check()?;
        self.know_levels([options.priority]).await?;
        let mut entry = self.entry(&task, options.partition_key().map(str::to_owned))?;
        entry.unique = options.unique.clone();
        entry.headers = options.headers.clone();
        #[cfg(feature = "otel")]
        crate::trace_context::add(&mut entry.headers, crate::trace_context::current().as_ref());
        let sent = self.send_entry(entry, &options, None).await?;
        // Only the outbox relay's record comes with a deadline.
        match sent.expect("without a deadline a send is never late") {
            Enqueued::New(id) => Ok((id, true)),
            Enqueued::Earlier(id) => Ok((id, false)),
            Enqueued::Refused(existing) => Err(Error::Duplicate(Duplicate {
                unique: options.unique.unwrap_or_default(),
                existing,
            })),
        }
    }

    /// Enqueues `entry` with `options` (its delay, its idempotency key);
    /// with `once`, the outbox relay's send (docs/design.md §10): also at
    /// most once per that dedup record (a name under `{N/p}:dedup:`, kept
    /// without an expiry) and only until that deadline (Unix ms by Redis's
    /// clock). What became of it; `None` when the deadline had passed and
    /// nothing was written.
    pub(super) async fn send_entry(
        &self,
        entry: Entry,
        options: &Options,
        once: Option<(&str, u64)>,
    ) -> Result<Option<Enqueued>> {
        let tracked = self.tracking.on(&self.conn, &self.name).await.is_some();
        // Its idempotency, unique or outbox record may be in the layout a
        // reshard replaced: asked first (docs/design.md §21).
        let recorded = options.idempotency_key.is_some() || options.unique.is_some();
        if let Some(from) = (recorded || once.is_some())
            .then(|| self.to_ask(&self.route()))
            .flatten()
        {
            match self.ask_replaced(&entry, from, options, once).await? {
                Asked::Clear => {}
                Asked::Found(enqueued) => return Ok(Some(enqueued)),
                Asked::Late => return Ok(None),
            }
        }
        // A partition a reshard sealed refuses the entry, nothing applied:
        // the layout is read again and the entry sent to the new one
        // (docs/design.md §21).
        for _ in 0..route::FOLLOW_AT_MOST {
            let p = self.place_at(entry.partition_key().as_bytes(), options.priority)?;
            match self.send_to(&entry, p, options, once, tracked).await {
                Err(Error::Redis(e)) if route::is_sealed(&e) => {}
                Ok(Some(Sent::Sealed)) => {}
                Ok(Some(Sent::Enqueued(enqueued))) => return Ok(Some(enqueued)),
                Ok(None) => return Ok(None),
                Err(e) => return Err(e),
            }
            self.follow_reshard().await?;
        }
        Err(Error::Runtime(format!(
            "service `{}` was resharded {} times while one task was sent; try again",
            self.name,
            route::FOLLOW_AT_MOST
        )))
    }

    /// Asks `entry`'s partition in generation `from` (which a reshard
    /// replaced) for the records it would find there, writing nothing
    /// (`enqueue.lua`'s probe): once the partition is sealed they are
    /// frozen, so what it answers then holds.
    async fn ask_replaced(
        &self,
        entry: &Entry,
        from: Generation,
        options: &Options,
        once: Option<(&str, u64)>,
    ) -> Result<Asked> {
        let p = self.place_gen(from, entry.partition_key().as_bytes(), options.priority)?;
        let deadline = tokio::time::Instant::now() + SEAL_WITHIN;
        loop {
            let mut script = self.enqueue_script(entry, p, options, once, false);
            script.key(keys::sealed(&self.name, p));
            let reply: (String, u64, u8) = self.conn.invoke(&script).await?;
            match reply.2 {
                SEALED => return Ok(Asked::Clear),
                NOT_SEALED if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                NOT_SEALED => {
                    return Err(Error::Runtime(format!(
                        "partition {} of service `{}`'s previous layout was not sealed within \
                         {SEAL_WITHIN:?}; are its consumers running?",
                        crate::partition::Shown(p),
                        self.name
                    )));
                }
                _ if reply.0.is_empty() => return Ok(Asked::Late),
                _ => return Ok(Asked::Found(Enqueued::of(&entry.id, reply))),
            }
        }
    }

    /// Sends `entry` to partition `p`: what became of it (`Sealed`: the
    /// partition refused it); `None` when the relay's deadline had passed.
    async fn send_to(
        &self,
        entry: &Entry,
        p: u32,
        options: &Options,
        once: Option<(&str, u64)>,
        tracked: bool,
    ) -> Result<Option<Sent>> {
        if options.scripted() || once.is_some() {
            // The script writes a tracked task's record with its entry.
            let script = self.enqueue_script(entry, p, options, once, tracked);
            let reply: (String, u64, u8) = self.conn.write_script(&script).await?;
            if reply.2 == SEALED {
                return Ok(Some(Sent::Sealed));
            }
            if reply.0.is_empty() {
                return Ok(None);
            }
            if reply.1 > 0 {
                self.notice(p, reply.1).await;
            }
            return Ok(Some(Sent::Enqueued(Enqueued::of(&entry.id, reply))));
        }
        let mut cmd = redis::cmd("XADD");
        cmd.arg(keys::stream(&self.name, p))
            .arg("*")
            .arg(entry.fields());
        if tracked {
            self.send_tracked(entry, p, cmd).await?;
        } else {
            self.conn.write::<()>(&cmd).await?;
        }
        Ok(Some(Sent::Enqueued(Enqueued::New(entry.id.clone()))))
    }

    /// A plain tracked task: its `waiting` record, then its entry (`xadd`),
    /// pipelined on one connection, as a batch's records go before its
    /// entries: Redis runs them in that order, so no start comes before the
    /// record. Through the enqueue script (a `TIME`, a record packed in
    /// Lua) the tracked enqueue ran at 0.58–0.88 of the untracked one's
    /// rate, one task after the other (BENCHMARKS.md, "Task tracking").
    /// The record refused and the entry added (Redis out of memory for the
    /// one and not the other) leaves the task with no record until it
    /// starts, as if enqueued while tracking was off: said in a warning,
    /// not an error, since the task is enqueued.
    async fn send_tracked(&self, entry: &Entry, p: u32, xadd: redis::Cmd) -> Result<()> {
        let record = packed::waiting(entry.enqueued_at.as_millis() as u64);
        let mut pipe = redis::pipe();
        pipe.cmd("HSET")
            .arg(keys::tasks(&self.name, p))
            .arg("")
            .arg(PAD)
            .arg(entry.id.as_str())
            .arg(record);
        pipe.add_command(xadd);
        let sent = self.conn.write_pipe(&mut pipe).await?;
        let [hset, xadd] = sent.replies() else {
            return Err(Error::Runtime(
                "an enqueue's pipeline of two commands had not two replies".into(),
            ));
        };
        if let Err(e) = xadd.clone().extract_error() {
            if route::is_sealed(&e) {
                // Sent again to the new layout, with its record there.
                self.forget_records(&[(p, &entry.id)]).await;
            }
            return Err(e.into());
        }
        sent.confirmed(1)?;
        if let Err(e) = hset.clone().extract_error() {
            warn!(service = %self.name, task = %entry.id, cause = %e, "a tracked task's record was refused; it has none until it starts");
        }
        Ok(())
    }

    /// The enqueue script's call for `entry` in partition `p` with
    /// `options` (and the outbox relay's `once`; `tracked`: with its
    /// record). It replies `{ the id enqueued (or the earlier one, or the
    /// unique key's holder, or '' past the deadline), its due time if
    /// delayed, else 0, 1 if refused for the unique key }`.
    pub(super) fn enqueue_script(
        &self,
        entry: &Entry,
        p: u32,
        options: &Options,
        once: Option<(&str, u64)>,
        tracked: bool,
    ) -> redis::ScriptInvocation<'static> {
        // The dedup records and the delayed set live in the task's
        // partition, so one script checks, delays and adds.
        let dedup = options.idempotency_key.as_deref().unwrap_or_default();
        let ttl = match options.idempotency_key {
            Some(_) => self.idempotency_ttl.as_millis() as u64,
            None => 0,
        };
        let (once_key, until_ms) = once.unwrap_or_default();
        let at = options
            .at
            .map(|at| {
                at.duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis()
                    .max(1) as u64
            })
            .unwrap_or(0);
        let delay = options.delay.map(|d| d.as_millis() as u64).unwrap_or(0);
        let id = entry.id.as_str();
        let mut script = ENQUEUE.key(keys::stream(&self.name, p));
        script
            .key(keys::delayed(&self.name, p))
            .key(keys::dedup(&self.name, p, dedup))
            .key(keys::dedup(&self.name, p, once_key))
            .key(keys::tasks(&self.name, p))
            .arg(ttl)
            .arg(id)
            .arg(at)
            .arg(delay)
            .arg(until_ms)
            .arg(u8::from(tracked));
        for (k, v) in entry.fields() {
            script.arg(k).arg(v);
        }
        script
    }

    /// Tells the owner of partition `p`, through the due index, that a task
    /// there is delayed until `due_ms`, so it moves the task when due
    /// rather than at its slow check of the delayed set (docs/design.md
    /// §6). The task is enqueued already: a failure here only delays it
    /// more, so it is logged, not returned (an error would have the caller
    /// enqueue the task twice).
    pub(super) async fn notice(&self, p: u32, due_ms: u64) {
        let notice = crate::due::notice(&self.name, p, due_ms);
        if let Err(e) = self.conn.query::<()>(&notice).await {
            warn!(service = %self.name, partition = p, cause = %e, "a delayed task's notice to the due index failed; it runs up to 30 s late");
        }
    }
}
