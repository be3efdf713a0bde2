//! A reshard's moves (docs/design.md §21): the delayed tasks and dead
//! letters of a sealed partition go to the partitions of the new layout
//! their keys route to, each with its task record and cancel request
//! (§14) when it has them. Under Cluster the two partitions are in
//! different slots, so a move is two steps: written in the destination
//! (`move_in.lua`), then removed here (`moved.lua`) only if the source
//! still holds what was copied.

use std::sync::LazyLock;

use deadpool_redis::redis::{self, Script, Value};

use super::PartitionStore;
use crate::entry::{field, route_key, unpack_strings, value_of};
use crate::error::Result;
use crate::keys;
use crate::partition::{Shown, generation_of};
use crate::reshard::Generation;
use crate::tracking::{TaskState, packed};

static MOVE_IN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/move_in.lua")));
static MOVED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/moved.lua")));

/// A dead letter's fields, names and values.
type Letter = Vec<(Vec<u8>, Vec<u8>)>;

/// Most delayed tasks or dead letters moved per look.
const MOVE_BATCH: usize = 200;

/// One task on its way: what the source holds of it.
struct Moving<'a> {
    /// `delayed` or `dead`.
    kind: &'static str,
    /// The delayed member's bytes, or the dead letter's id.
    source: &'a [u8],
    /// The entry's (or letter's) fields, names and values.
    fields: Vec<Vec<u8>>,
    /// Its task record, as the source holds it (empty: none).
    record: Vec<u8>,
    /// Its cancel request's time, as the source holds it (empty: none).
    request: String,
}

impl Moving<'_> {
    fn id(&self) -> &[u8] {
        value_of(&self.fields, field::ID).unwrap_or_default()
    }

    /// Whether the record is final (it joins the destination's retention
    /// lists).
    fn is_final(&self) -> bool {
        packed::decode(&self.record)
            .and_then(|f| f.get("state").cloned())
            .and_then(|s| TaskState::parse(&String::from_utf8_lossy(&s)))
            .is_some_and(|s| s.is_final())
    }
}

impl PartitionStore {
    /// Moves up to a batch of the delayed tasks and dead letters of this
    /// partition (of generation `from`) to the partitions of `to` their
    /// keys route to. Returns how many left (others stay, to be moved
    /// again, when a cancel changed them meanwhile).
    pub(crate) async fn move_out(&self, from: Generation, to: Generation) -> Result<usize> {
        debug_assert_eq!(generation_of(self.partition), from.number);
        let mut range = redis::cmd("ZRANGE");
        range
            .arg(&self.delayed)
            .arg(0)
            .arg(MOVE_BATCH - 1)
            .arg("WITHSCORES");
        let delayed: Vec<(Vec<u8>, u64)> = self.conn.query(&range).await?;
        let mut range = redis::cmd("XRANGE");
        range
            .arg(&self.dead)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(MOVE_BATCH);
        let dead: Vec<(String, Letter)> = self.conn.query(&range).await?;
        let mut moving: Vec<(Moving, u64)> = Vec::with_capacity(delayed.len() + dead.len());
        for (member, due) in &delayed {
            let fields = unpack_strings(member).unwrap_or_default();
            moving.push((Moving::new("delayed", member, fields), *due));
        }
        for (id, pairs) in &dead {
            let fields = pairs
                .iter()
                .flat_map(|(k, v)| [k.clone(), v.clone()])
                .collect();
            moving.push((Moving::new("dead", id.as_bytes(), fields), 0));
        }
        self.read_records(&mut moving).await?;
        let rank = from.rank_of(self.partition);
        let mut left = 0;
        for (task, due) in &moving {
            let dest = to.route(route_key(&task.fields), rank);
            self.move_in(task, dest, *due).await?;
            if task.kind == "delayed" {
                // The new owner promotes it when due (after the open, it
                // looks at its delayed set as it starts).
                let _: i64 = self
                    .conn
                    .query(&crate::due::notice(&self.name, dest, *due))
                    .await?;
            }
            left += usize::from(self.let_go(task).await?);
        }
        Ok(left)
    }

    /// Reads the task record and cancel request of each of `moving`, in
    /// one round trip.
    async fn read_records(&self, moving: &mut [(Moving<'_>, u64)]) -> Result<()> {
        if moving.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (task, _) in moving.iter() {
            pipe.cmd("HGET").arg(self.records.tasks()).arg(task.id());
            pipe.cmd("ZSCORE")
                .arg(self.records.cancels())
                .arg(task.id());
        }
        let replies: Vec<Value> = self.conn.query_pipe(&pipe).await?;
        for ((task, _), pair) in moving.iter_mut().zip(replies.chunks(2)) {
            let [record, request] = pair else { break };
            let text = |v: &Value| -> Result<Option<Vec<u8>>> {
                Ok(redis::from_redis_value_ref(v).map_err(redis::RedisError::from)?)
            };
            task.record = text(record)?.unwrap_or_default();
            task.request = String::from_utf8_lossy(&text(request)?.unwrap_or_default()).into();
        }
        Ok(())
    }

    /// Writes `task` into partition `dest` (`move_in.lua`), due at `due`
    /// if delayed.
    async fn move_in(&self, task: &Moving<'_>, dest: u32, due: u64) -> Result<()> {
        let target = match task.kind {
            "delayed" => keys::delayed(&self.name, dest),
            _ => keys::dead(&self.name, dest),
        };
        let mut script = MOVE_IN.key(target);
        script
            .key(keys::unique(&self.name, dest))
            .key(keys::moved(&self.name, dest))
            .key(keys::tasks(&self.name, dest))
            .key(keys::cancel_requests(&self.name, dest))
            .key(keys::ended(&self.name, dest))
            .key(keys::ended_at(&self.name, dest))
            .arg(task.kind);
        if task.kind == "delayed" {
            script
                .arg("")
                .arg(due)
                .arg(task.source)
                .arg(value_of(&task.fields, field::UNIQUE).unwrap_or_default());
        } else {
            let letter = String::from_utf8_lossy(task.source);
            script
                .arg(format!("{}/{letter}", Shown(self.partition)))
                .arg(0)
                .arg("")
                .arg("");
        }
        script
            .arg(task.id())
            .arg(task.record.as_slice())
            .arg(&task.request)
            .arg(if task.is_final() { "1" } else { "0" });
        if task.kind == "dead" {
            for f in &task.fields {
                script.arg(f.as_slice());
            }
        }
        let _: i64 = self.conn.invoke(&script).await?;
        Ok(())
    }

    /// Removes `task` here, with its record, if they are still what was
    /// copied (`moved.lua`); else it stays, to be moved again (false).
    async fn let_go(&self, task: &Moving<'_>) -> Result<bool> {
        let source = match task.kind {
            "delayed" => &self.delayed,
            _ => &self.dead,
        };
        let mut script = MOVED.key(source);
        script
            .key(self.records.tasks())
            .key(self.records.cancels())
            .arg(task.kind)
            .arg(task.source)
            .arg(task.id())
            .arg(task.record.as_slice())
            .arg(&task.request)
            .arg(self.records.publish())
            .arg(self.records.channel());
        let removed: i64 = self.conn.invoke(&script).await?;
        Ok(removed == 1)
    }
}

impl<'a> Moving<'a> {
    fn new(kind: &'static str, source: &'a [u8], fields: Vec<Vec<u8>>) -> Self {
        Moving {
            kind,
            source,
            fields,
            record: Vec::new(),
            request: String::new(),
        }
    }
}

#[cfg(test)]
#[path = "moves_tests.rs"]
mod tests;
