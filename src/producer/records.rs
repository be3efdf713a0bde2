//! A tracked batch's records (docs/design.md §14): one `HSET` per
//! partition of the `waiting` records of the batch's tasks that go without
//! the enqueue script, sent with the batch's first part, before any of its
//! `XADD`s.

use std::collections::BTreeMap;

use deadpool_redis::redis::{self, Cmd, Value};
use tracing::warn;

use super::batch::Item;
use super::{Options, Producer};
use crate::codec::Codec;
use crate::entry::TaskId;
use crate::keys;
use crate::tracking::{PAD, packed};

/// A task id's length as the producer makes them (a hyphenated UUID), for
/// sizing buffers.
const TASK_ID_LEN: usize = 36;

impl<C: Codec> Producer<C> {
    /// Tracked: the `waiting` records of the tasks that go without the
    /// enqueue script (which writes its own), one `HSET` per partition for
    /// the whole batch (docs/design.md §14). A batch that fails part-way
    /// leaves the records of tasks never added, which the owners' sweep
    /// forgets; nobody has their ids.
    pub(super) fn records(
        &self,
        items: &[Item<'_>],
        placed: &[(TaskId, u32)],
        enqueued_ms: u64,
    ) -> Vec<Cmd> {
        let record = packed::waiting(enqueued_ms);
        let plain = || {
            let plain = items.iter().map(|(_, o)| !o.is_some_and(Options::scripted));
            plain
                .zip(placed)
                .filter_map(|(plain, placed)| plain.then_some(placed))
        };
        // Each partition's command sized for its records at once: grown one
        // record at a time, the commands' buffers were reallocated about
        // once per task.
        let mut counts: BTreeMap<u32, usize> = BTreeMap::new();
        for (_, p) in plain() {
            *counts.entry(*p).or_default() += 1;
        }
        let mut records: BTreeMap<u32, Cmd> = counts
            .into_iter()
            .map(|(p, n)| {
                let key = keys::tasks(&self.name, p);
                let bytes = key.len() + PAD.len() + n * (TASK_ID_LEN + record.len());
                let mut hset = Cmd::with_capacity(4 + 2 * n, 16 + bytes);
                // Kept a hash table from the first write (`PAD`).
                hset.arg("HSET").arg(key).arg("").arg(PAD);
                (p, hset)
            })
            .collect();
        for (id, p) in plain() {
            if let Some(hset) = records.get_mut(p) {
                hset.arg(id.as_str()).arg(&record);
            }
        }
        records.into_values().collect()
    }

    /// Takes back the `waiting` records of `tasks` (partition, id) that a
    /// sealed partition refused (docs/design.md §21): each is sent again to
    /// the new layout, with its record there, and a reader must not find
    /// a task that never was in the old one. Nothing is lost when this
    /// fails: a reader prefers the new layout's record, and the old
    /// partition's records expire with it.
    pub(super) async fn forget_records(&self, tasks: &[(u32, &TaskId)]) {
        let mut pipe = redis::pipe();
        for (p, id) in tasks {
            pipe.cmd("HDEL")
                .arg(keys::tasks(&self.name, *p))
                .arg(id.as_str());
        }
        if let Err(e) = self.conn.query_pipe::<Vec<Value>>(&pipe).await {
            warn!(service = %self.name, cause = %e, "cannot take back the records of tasks a sealed partition refused");
        }
    }
}
