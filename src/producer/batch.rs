//! A batch's enqueue: many tasks, each with its options or none, pipelined
//! in parts that go out while the next ones are built. A task without
//! options (or with a partition key only) is an `XADD`; one with an
//! idempotency key, a unique key or a delay goes through the enqueue
//! script, in the same part, so a batch of plain tasks costs what it did
//! before options.
//!
//! Every task is encoded and checked against `max_payload` first, so a task
//! that cannot be enqueued fails the batch before anything is sent. The
//! entries then go out in parts of [`PART`] `XADD`s, each handed to the
//! connection as soon as it is built: Redis adds one part's entries while
//! this process builds the next. One pipeline of the whole batch leaves
//! Redis idle while it is built and this process idle while Redis works,
//! which held a lone caller to about half of what Redis takes (issue 26).
//!
//! All parts of a batch travel on the producer's one connection, in order,
//! so Redis applies them in the batch's order, as it did one pipeline.
//! More connections bought nothing measurable, neither for one caller nor
//! for four concurrent ones: Redis runs the `XADD`s one at a time anyway.
//!
//! With `wait_for_replicas`, one `WAIT` follows the last part, on the
//! connection that carried the parts (on a Cluster, on each node
//! connection that carried any: docs/design.md §8). A `WAIT` per part
//! would hold the connection, and the parts behind it, for a replica's
//! round trip each.

use std::collections::BTreeMap;

use deadpool_redis::redis::{self, Cmd, Pipeline, ScriptInvocation, Value};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use serde::Serialize;

use std::sync::atomic::Ordering;

use tracing::warn;

use super::route::{self, Route};
use super::send::{ENQUEUE, Enqueued, SEALED};
use super::{Options, Producer};
use crate::codec::Codec;
use crate::connection::{Carriers, Conn};
use crate::entry::{self, Entry, TaskId};
use crate::error::{Duplicate, Result};
use crate::priority::Priority;
use crate::workflow::field::{BATCH, BATCH_RESULTS};

/// Entries per part (`enqueue_batch`'s doc names it). Small enough that Redis starts on a batch soon after
/// its encoding (the first part is built while Redis waits), large enough
/// that a part's own costs (a request, a reply, a wake-up) stay small next
/// to its entries'. 128 to 334 measured alike; 1,000 in one part was
/// about 0.1 of the raw producer's rate slower.
const PART: usize = 128;

/// One task of a batch: its encoded payload and its options, if any.
pub(super) type Item<'a> = (Vec<u8>, Option<&'a Options>);

/// What a batch enqueued: each task's id in the batch's order (for a
/// repeat of an idempotency key, the earlier task's; for a task refused
/// for its unique key, the holder's), how many are new, and the refused.
pub(super) struct Sent {
    pub(super) ids: Vec<TaskId>,
    pub(super) new: usize,
    pub(super) refused: Vec<(usize, Duplicate)>,
}

/// A task of a part that went through the enqueue script: where its reply
/// is in the part's, its place in the batch, its partition, and the call
/// (sent again if Redis no longer knows the script).
struct Scripted {
    reply: usize,
    task: usize,
    partition: u32,
    script: ScriptInvocation<'static>,
}

impl<C: Codec> Producer<C> {
    /// Encodes every task, then sends them in parts (see `enqueue_batch`).
    pub(super) async fn send_batch<T: Serialize>(&self, tasks: &[T]) -> Result<Vec<TaskId>> {
        let items = tasks
            .iter()
            .map(|task| Ok((self.payload(task)?, None)))
            .collect::<Result<Vec<_>>>()?;
        Ok(self.send_items(items).await?.ids)
    }

    /// Encodes every task, then sends them with their options in parts
    /// (see `enqueue_batch_with`).
    pub(super) async fn send_batch_with<T: Serialize>(
        &self,
        tasks: &[(T, Options)],
    ) -> Result<Sent> {
        let items = tasks
            .iter()
            .map(|(task, options)| {
                options.check()?;
                Ok((self.payload(task)?, Some(options)))
            })
            .collect::<Result<Vec<_>>>()?;
        // Collected first: a closure held across the await would keep the
        // future from being `Send` for a caller that spawns it.
        let levels: Vec<Priority> = tasks.iter().map(|(_, o)| o.priority).collect();
        self.know_levels(levels).await?;
        self.send_items(items).await
    }

    /// Sends `items` once: what it enqueued, and the tasks a sealed
    /// partition refused (counted neither as new nor as refused).
    pub(super) async fn send_round(&self, items: &[Item<'_>]) -> Result<(Sent, Vec<usize>)> {
        if items.is_empty() {
            let none = Sent {
                ids: Vec::new(),
                new: 0,
                refused: Vec::new(),
            };
            return Ok((none, Vec::new()));
        }
        // One connection for the whole batch, taken once: after a reset,
        // parts that each took their own would race to the pool and could
        // go over different connections, out of order.
        let conn = self.conn.get().await?;
        // One time for the batch: its entries are enqueued together; and
        // one trace context (feature `otel`), the caller's span's.
        let enqueued_ms = entry::now_ms();
        #[cfg(feature = "otel")]
        let trace = crate::trace_context::current();
        let enqueued_at = enqueued_ms.to_string();
        // Tracked: the entries' records go first (docs/design.md §14).
        let tracked = self.tracking.on(&self.conn, &self.name).await.is_some();
        if items.iter().any(|(_, o)| o.is_some_and(Options::scripted))
            && !self.script_loaded.load(Ordering::Relaxed)
        {
            // Loaded before the parts go: a `NOSCRIPT` sent again would
            // land after the tasks behind it, out of their key's order.
            let mut conn = conn.clone();
            let loaded = ENQUEUE.prepare_invoke().load_async(&mut conn).await;
            loaded.inspect_err(|e| self.conn.reset_after(e))?;
            self.script_loaded.store(true, Ordering::Relaxed);
        }
        let mut ids = Vec::with_capacity(items.len());
        let mut scripted: Vec<Vec<Scripted>> = Vec::new();
        // Each plain `XADD`'s part, place in the part's replies, and task.
        let mut plain: Vec<(usize, usize, usize)> = Vec::new();
        let carriers = Carriers::default();
        let mut sending = FuturesUnordered::new();
        let mut replies: Vec<Option<Vec<Value>>> = Vec::new();
        let mut failed = None;
        let route = self.route();
        let mut placed = self.place(items, &route)?.into_iter();
        let mut records = tracked.then(|| self.records(items, placed.as_slice(), enqueued_ms));
        // Tracked, where each record went: a sealed partition's refusal
        // leaves it behind, to be taken back (`forget_records`).
        let record_partitions: Vec<u32> = match tracked {
            true => placed.as_slice().iter().map(|(_, p)| *p).collect(),
            false => Vec::new(),
        };
        for (i, part) in items.chunks(PART).enumerate() {
            if i > 0 {
                // Lets the connection's task write the part just handed to
                // it: a task woken from this thread runs only once this one
                // yields, which would hold every part back until the last.
                tokio::task::yield_now().await;
            }
            let mut pipe = Pipeline::with_capacity(part.len() * if tracked { 3 } else { 1 });
            let mut commands = 0;
            let mut part_scripted = Vec::new();
            if let Some(records) = records.take() {
                // The batch's records first, in its first part: an entry is
                // only read once added, so no start is written before its
                // record.
                commands += records.len();
                for hset in records {
                    pipe.add_command(hset);
                }
            }
            let placed = placed.by_ref().take(part.len());
            for ((payload, options), (id, p)) in part.iter().zip(placed) {
                match options {
                    Some(options) if options.scripted() => {
                        let key = options.key.clone().or_else(|| options.unique.clone());
                        let mut entry = Entry::new(id.clone(), key, C::NAME, payload.clone());
                        entry.unique = options.unique.clone();
                        entry.headers = options.headers.clone();
                        if let Some(batch) = &options.member_of {
                            let member = (BATCH.to_owned(), batch.as_bytes().to_vec());
                            entry.extra.push(member);
                            if options.member_results {
                                entry.extra.push((BATCH_RESULTS.to_owned(), b"1".to_vec()));
                            }
                        }
                        #[cfg(feature = "otel")]
                        crate::trace_context::add(&mut entry.headers, trace.as_ref());
                        let script = self.enqueue_script(&entry, p, options, None, tracked);
                        pipe.invoke_script(&script);
                        part_scripted.push(Scripted {
                            reply: commands,
                            task: ids.len(),
                            partition: p,
                            script,
                        });
                        commands += 1;
                    }
                    _ => {
                        let fields =
                            entry::first_attempt(id.as_str(), &enqueued_at, C::NAME, payload);
                        let stream = &route.streams[crate::partition::index_of(p) as usize];
                        let mut cmd = match options.and_then(|o| o.key.as_deref()) {
                            Some(key) => xadd_keyed(stream, &fields, key),
                            None => xadd(stream, &fields),
                        };
                        #[cfg(not(feature = "otel"))]
                        let headers = options.map(|o| std::borrow::Cow::Borrowed(&o.headers));
                        #[cfg(feature = "otel")]
                        let headers =
                            crate::trace_context::with(options.map(|o| &o.headers), &trace);
                        for (name, value) in headers.iter().flat_map(|h| h.fields()) {
                            cmd.arg(name).arg(value);
                        }
                        if let Some(o) = options.filter(|o| o.member_of.is_some()) {
                            cmd.arg(BATCH).arg(o.member_of.as_deref());
                            if o.member_results {
                                cmd.arg(BATCH_RESULTS).arg("1");
                            }
                        }
                        pipe.add_command(cmd);
                        plain.push((i, commands, ids.len()));
                        commands += 1;
                    }
                }
                ids.push(id);
            }
            scripted.push(part_scripted);
            replies.push(None);
            sending.push(self.send_part(conn.clone(), pipe, &carriers, i));
            // One poll hands the part to the connection (and collects any
            // part already answered); the rest is waited for below.
            while let Some(Some(sent)) = sending.next().now_or_never() {
                collect(sent, &mut replies, &mut failed);
            }
        }
        while let Some(sent) = sending.next().await {
            collect(sent, &mut replies, &mut failed);
        }
        if let Some(error) = failed {
            return Err(error);
        }
        // The plain entries a sealed partition refused go again below;
        // any other error reply fails the batch, as before.
        let mut sealed = Vec::new();
        for (part, reply, task) in plain {
            if let Some(Value::ServerError(e)) = replies[part].as_ref().map(|r| &r[reply]) {
                let e = redis::RedisError::from(e.clone());
                if !route::is_sealed(&e) {
                    return Err(e.into());
                }
                sealed.push(task);
            }
        }
        if tracked && !sealed.is_empty() {
            let left: Vec<(u32, &TaskId)> = sealed
                .iter()
                .map(|&task| (record_partitions[task], &ids[task]))
                .collect();
            self.forget_records(&left).await;
        }
        let scripted: Vec<Scripted> = scripted.into_iter().flatten().collect();
        let mut refused = Vec::new();
        let mut new = self
            .scripted_replies(
                conn.clone(),
                scripted,
                replies,
                &carriers,
                &mut ids,
                (&mut refused, &mut sealed),
            )
            .await?;
        new -= sealed.len();
        let refused = refused
            .into_iter()
            .map(|task| {
                let unique = items[task].1.and_then(|o| o.unique.clone());
                let existing = ids[task].clone();
                let unique = unique.unwrap_or_default();
                (task, Duplicate { unique, existing })
            })
            .collect();
        if let Some(wait) = self.conn.wait() {
            let waited = conn.clone().wait_after(&carriers, wait).await;
            wait.confirmed(waited.inspect_err(|e| self.conn.reset_after(e))?)?;
        }
        Ok((Sent { new, ids, refused }, sealed))
    }

    /// Each task's new id and partition (its key's, else its id's, at
    /// its level).
    fn place(&self, items: &[Item<'_>], route: &Route) -> Result<Vec<(TaskId, u32)>> {
        items
            .iter()
            .map(|(_, options)| {
                let id = options.and_then(|o| o.id.clone());
                let id = id.unwrap_or_else(TaskId::generate);
                let key = options.and_then(|o| o.partition_key());
                let key = key.unwrap_or(id.as_str()).as_bytes();
                let p = match options {
                    Some(o) if o.priority != Priority::Normal => {
                        self.place_in(route, key, o.priority)?
                    }
                    _ => route.current.route(key, 0),
                };
                Ok((id, p))
            })
            .collect()
    }

    /// Reads the enqueue scripts' replies of every part: each task's id
    /// (the earlier one under an idempotency key), the due index's notices
    /// of delayed ones; a script Redis no longer knew (`NOSCRIPT`: it ran
    /// nothing) is loaded and those calls sent again. Returns how many of
    /// the batch's tasks are new; those refused for their unique keys go in
    /// `refused`, their ids replaced by the holders'.
    async fn scripted_replies(
        &self,
        mut conn: Conn,
        scripted: Vec<Scripted>,
        replies: Vec<Option<Vec<Value>>>,
        carriers: &Carriers,
        ids: &mut [TaskId],
        (refused, sealed): (&mut Vec<usize>, &mut Vec<usize>),
    ) -> Result<usize> {
        let mut repeats = 0;
        let mut due: BTreeMap<u32, u64> = BTreeMap::new();
        let mut again = Vec::new();
        let part_of = |task: usize| task / PART;
        let mut read =
            |s: &Scripted, reply: &Value, again: &mut Vec<usize>, k: usize| -> Result<()> {
                match reply {
                    Value::ServerError(e) if e.code() == "NOSCRIPT" => again.push(k),
                    _ => {
                        let reply: (String, u64, u8) = redis::from_redis_value(reply.clone())
                            .map_err(redis::RedisError::from)?;
                        if reply.2 == SEALED {
                            sealed.push(s.task);
                            return Ok(());
                        }
                        let at = reply.1;
                        match Enqueued::of(&ids[s.task], reply) {
                            Enqueued::New(_) => {}
                            Enqueued::Earlier(earlier) => {
                                repeats += 1;
                                ids[s.task] = earlier;
                            }
                            Enqueued::Refused(holder) => {
                                repeats += 1;
                                refused.push(s.task);
                                ids[s.task] = holder;
                            }
                        }
                        if at > 0 {
                            let min = due.entry(s.partition).or_insert(at);
                            *min = (*min).min(at);
                        }
                    }
                }
                Ok(())
            };
        for (k, s) in scripted.iter().enumerate() {
            let part = replies[part_of(s.task)]
                .as_ref()
                .expect("a scripted part's replies");
            read(s, &part[s.reply], &mut again, k)?;
        }
        if !again.is_empty() {
            // Redis restarted and forgot the script: pipelines do not load
            // scripts, and a `NOSCRIPT` ran nothing, so these go again,
            // after the batch's other tasks (a key's order can differ from
            // the batch's for them: said in `enqueue_batch_with`'s doc).
            warn!(
                service = %self.name,
                tasks = again.len(),
                "redis no longer knew the enqueue script; those tasks were sent again after the rest of their batch"
            );
            scripted[again[0]]
                .script
                .load_async(&mut conn)
                .await
                .inspect_err(|e| self.conn.reset_after(e))?;
            let mut pipe = Pipeline::with_capacity(again.len());
            for k in &again {
                pipe.invoke_script(&scripted[*k].script);
            }
            let sent = conn.write_part_each(&mut pipe, carriers).await;
            let sent = sent.inspect_err(|e| self.conn.reset_after(e))?;
            let mut still = Vec::new();
            for (reply, k) in sent.iter().zip(&again) {
                read(&scripted[*k], reply, &mut still, *k)?;
            }
            if !still.is_empty() {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Server(redis::ServerErrorKind::NoScript),
                    "the enqueue script is unknown to Redis after loading it",
                ))
                .into());
            }
        }
        for (p, at) in due {
            self.notice(p, at).await;
        }
        Ok(ids.len() - repeats)
    }

    /// Sends part `i` on `conn`, the producer's connection (on a Cluster,
    /// one pipeline per master, whose connections go in `carriers`), and
    /// forgets the connection if the error says it may be broken; its
    /// replies, each in its place: a script's says what it did, and a
    /// partition a reshard sealed refuses its entries and no other.
    async fn send_part(
        &self,
        mut conn: Conn,
        mut pipe: Pipeline,
        carriers: &Carriers,
        i: usize,
    ) -> Result<(usize, Vec<Value>)> {
        let sent = conn.write_part_each(&mut pipe, carriers).await;
        Ok((i, sent.inspect_err(|e| self.conn.reset_after(e))?))
    }
}

/// Keeps a part's replies, or the first error.
fn collect(
    sent: Result<(usize, Vec<Value>)>,
    replies: &mut [Option<Vec<Value>>],
    failed: &mut Option<crate::error::Error>,
) {
    match sent {
        Ok((i, part)) => replies[i] = Some(part),
        Err(e) => *failed = failed.take().or(Some(e)),
    }
}

/// `XADD <stream> * <fields> key <key>`: a task with a partition key.
fn xadd_keyed(stream: &str, fields: &[(&str, &[u8])], key: &str) -> Cmd {
    let mut cmd = xadd(stream, fields);
    cmd.arg(crate::entry::field::KEY).arg(key);
    cmd
}

/// `XADD <stream> * <fields>`, its buffers allocated once at their size.
fn xadd(stream: &str, fields: &[(&str, &[u8])]) -> Cmd {
    let bytes =
        "XADD*".len() + stream.len() + fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    let mut cmd = Cmd::with_capacity(3 + 2 * fields.len(), bytes);
    cmd.arg("XADD").arg(stream).arg("*").arg(fields);
    cmd
}
