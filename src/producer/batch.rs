//! A batch's enqueue: many tasks, no options, in one pipelined round trip.

use deadpool_redis::redis;
use serde::Serialize;

use super::Producer;
use crate::codec::Codec;
use crate::error::Result;
use crate::keys;
use crate::task::TaskId;

impl<C: Codec> Producer<C> {
    /// Encodes every task, then sends them (see `enqueue_batch`).
    pub(super) async fn send_batch<T: Serialize>(&self, tasks: &[T]) -> Result<Vec<TaskId>> {
        let mut pipe = redis::pipe();
        let mut ids = Vec::with_capacity(tasks.len());
        for task in tasks {
            let entry = self.entry(task, None)?;
            pipe.cmd("XADD")
                .arg(keys::stream(&self.name, self.partition_of(&entry)))
                .arg("*")
                .arg(entry.fields())
                .ignore();
            ids.push(entry.id);
        }
        if ids.is_empty() {
            return Ok(ids);
        }
        self.conn.query_pipe::<()>(&pipe).await?;
        Ok(ids)
    }
}
