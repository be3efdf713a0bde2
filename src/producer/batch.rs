//! A batch's enqueue: many tasks without options, pipelined in parts that
//! go out while the next ones are built.
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

use deadpool_redis::redis::{Cmd, Pipeline, RedisResult};
use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use serde::Serialize;

use super::Producer;
use crate::codec::Codec;
use crate::connection::{Carriers, Conn};
use crate::entry::{self, TaskId};
use crate::error::Result;
use crate::keys;
use crate::partition::partition_of;
use crate::tracking::STALE;

/// Entries per part (`enqueue_batch`'s doc names it). Small enough that Redis starts on a batch soon after
/// its encoding (the first part is built while Redis waits), large enough
/// that a part's own costs (a request, a reply, a wake-up) stay small next
/// to its entries'. 128 to 334 measured alike; 1,000 in one part was
/// about 0.1 of the raw producer's rate slower.
const PART: usize = 128;

impl<C: Codec> Producer<C> {
    /// Encodes every task, then sends them in parts (see `enqueue_batch`).
    pub(super) async fn send_batch<T: Serialize>(&self, tasks: &[T]) -> Result<Vec<TaskId>> {
        let payloads = tasks
            .iter()
            .map(|task| self.payload(task))
            .collect::<Result<Vec<_>>>()?;
        if payloads.is_empty() {
            return Ok(Vec::new());
        }
        // One connection for the whole batch, taken once: after a reset,
        // parts that each took their own would race to the pool and could
        // go over different connections, out of order.
        let conn = self.conn.get().await?;
        // One time for the batch: its entries are enqueued together.
        let enqueued_at = entry::now_ms().to_string();
        // Tracked: each entry's record goes just before it, in the same
        // part (docs/design.md §14): an entry is only read once added, so
        // no start is written before its record.
        let tracked = self.tracking.on(&self.conn, &self.name).await.is_some();
        let mut ids = Vec::with_capacity(payloads.len());
        let carriers = Carriers::default();
        let mut sending = FuturesUnordered::new();
        let mut failed = None;
        for (i, part) in payloads.chunks(PART).enumerate() {
            if i > 0 {
                // Lets the connection's task write the part just handed to
                // it: a task woken from this thread runs only once this one
                // yields, which would hold every part back until the last.
                tokio::task::yield_now().await;
            }
            let mut pipe = Pipeline::with_capacity(part.len() * if tracked { 3 } else { 1 });
            for payload in part {
                let id = TaskId::generate();
                let p = partition_of(id.as_str().as_bytes(), self.partitions) as usize;
                if tracked {
                    record(
                        &mut pipe,
                        &keys::task(&self.name, p as u32, id.as_str()),
                        &enqueued_at,
                    );
                }
                let fields = entry::first_attempt(id.as_str(), &enqueued_at, C::NAME, payload);
                pipe.add_command(xadd(&self.streams[p], &fields));
                ids.push(id);
            }
            sending.push(self.send_part(conn.clone(), pipe, &carriers));
            // One poll hands the part to the connection (and collects any
            // part already answered); the rest is waited for below.
            while let Some(Some(sent)) = sending.next().now_or_never() {
                failed = failed.or(sent.err());
            }
        }
        while let Some(sent) = sending.next().await {
            failed = failed.or(sent.err());
        }
        if let Some(error) = failed {
            return Err(error);
        }
        if let Some(wait) = self.conn.wait() {
            let waited = conn.clone().wait_after(&carriers, wait).await;
            wait.confirmed(waited.inspect_err(|e| self.conn.reset_after(e))?)?;
        }
        Ok(ids)
    }

    /// Sends one part on `conn`, the producer's connection (on a Cluster,
    /// one pipeline per master, whose connections go in `carriers`), and
    /// forgets the connection if the error says it may be broken.
    async fn send_part(&self, mut conn: Conn, pipe: Pipeline, carriers: &Carriers) -> Result<()> {
        let sent: RedisResult<()> = conn.write_part(&pipe, carriers).await;
        Ok(sent.inspect_err(|e| self.conn.reset_after(e))?)
    }
}

/// A tracked task's record as its enqueue writes it: `waiting`, attempt 1.
/// `HSET`, so a cancel request made before the task existed stays.
fn record(pipe: &mut Pipeline, key: &str, enqueued_at: &str) {
    pipe.cmd("HSET")
        .arg(key)
        .arg("state")
        .arg("waiting")
        .arg("attempt")
        .arg(1)
        .arg("enqueued_at")
        .arg(enqueued_at)
        .ignore();
    pipe.cmd("PEXPIRE")
        .arg(key)
        .arg(STALE.as_millis() as u64)
        .ignore();
}

/// `XADD <stream> * <fields>`, its buffers allocated once at their size.
fn xadd(stream: &str, fields: &[(&str, &[u8])]) -> Cmd {
    let bytes =
        "XADD*".len() + stream.len() + fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    let mut cmd = Cmd::with_capacity(3 + 2 * fields.len(), bytes);
    cmd.arg("XADD").arg(stream).arg("*").arg(fields);
    cmd
}
