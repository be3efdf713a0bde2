//! One task's enqueue: a plain `XADD`, or the enqueue script when the task
//! has an idempotency key or a delay.

use std::sync::LazyLock;
use std::time::UNIX_EPOCH;

use deadpool_redis::redis;
use serde::Serialize;
use tracing::warn;

use super::{Options, Producer};
use crate::codec::Codec;
use crate::error::Result;
use crate::keys;
use crate::task::TaskId;

static ENQUEUE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../scripts/enqueue.lua")));

impl<C: Codec> Producer<C> {
    /// Enqueues one task; its id, and whether it is new (not a repeat of an
    /// idempotency key).
    pub(super) async fn send<T: Serialize>(
        &self,
        task: T,
        options: Options,
    ) -> Result<(TaskId, bool)> {
        // Without a partition key, the idempotency key places the task, so
        // a repeat lands in the partition that holds the key's record.
        let key = options
            .key
            .clone()
            .or_else(|| options.idempotency_key.clone());
        let entry = self.entry(&task, key)?;
        let id = entry.id.clone();
        let p = self.partition_of(&entry);
        let stream = keys::stream(&self.name, p);
        if options.scripted() {
            // The dedup record and the delayed set live in the task's
            // partition, so one script checks, delays and adds.
            let dedup = options.idempotency_key.as_deref().unwrap_or_default();
            let ttl = match options.idempotency_key {
                Some(_) => self.idempotency_ttl.as_millis() as u64,
                None => 0,
            };
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
            let mut script = ENQUEUE.key(&stream);
            script
                .key(keys::delayed(&self.name, p))
                .key(keys::dedup(&self.name, p, dedup))
                .arg(ttl)
                .arg(id.as_str())
                .arg(at)
                .arg(delay);
            for (k, v) in entry.fields() {
                script.arg(k).arg(v);
            }
            let (enqueued, due): (String, u64) = self.conn.invoke(&script).await?;
            self.conn.replicated([stream.as_str()]).await?;
            if due > 0 {
                self.notice(p, due).await;
            }
            let new = enqueued == id.as_str();
            return Ok((TaskId::from(enqueued.as_str()), new));
        }
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&stream).arg("*").arg(entry.fields());
        self.conn.query::<()>(&cmd).await?;
        self.conn.replicated([stream.as_str()]).await?;
        Ok((id, true))
    }

    /// Tells the owner of partition `p`, through the due index, that a task
    /// there is delayed until `due_ms`, so it moves the task when due
    /// rather than at its slow check of the delayed set (docs/design.md
    /// §6). The task is enqueued already: a failure here only delays it
    /// more, so it is logged, not returned (an error would have the caller
    /// enqueue the task twice).
    async fn notice(&self, p: u32, due_ms: u64) {
        let notice = crate::due::notice(&self.name, p, due_ms);
        if let Err(e) = self.conn.query::<()>(&notice).await {
            warn!(service = %self.name, partition = p, cause = %e, "a delayed task's notice to the due index failed; it runs up to 30 s late");
        }
    }
}
