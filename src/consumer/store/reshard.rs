//! A partition's part in a reshard (docs/design.md §21), as its owner
//! writes it: the seal, the retire, and the moves of its delayed tasks and
//! dead letters to the partitions of the new layout their keys route to.

use std::sync::LazyLock;

use deadpool_redis::redis::{self, Script};

use super::PartitionStore;
use crate::entry::{field, unpack_strings};
use crate::error::Result;
use crate::keys;
use crate::partition::{Shown, generation_of};
use crate::reshard::Generation;

static SEAL: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/seal.lua")));
static RETIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/retire.lua")));
static MOVE_IN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/move_in.lua")));
static RAISE_MARK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/raise_mark.lua")));

/// A dead letter's fields, names and values.
type Letter = Vec<(Vec<u8>, Vec<u8>)>;

/// Most delayed tasks or dead letters moved per look.
const MOVE_BATCH: usize = 200;

/// What `retire.lua` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retire {
    /// Retired, now or before.
    Done,
    /// Entries are pending or undelivered: the drain goes on.
    Busy,
    /// Delayed tasks or dead letters wait to be moved.
    Leftovers,
    /// Another instance owns the partition now.
    Fenced,
}

impl PartitionStore {
    /// Seals the partition for generation `generation` (`seal.lua`);
    /// false when fenced.
    pub(crate) async fn seal(&self, generation: u32) -> Result<bool> {
        let mut script = SEAL.key(&self.stream);
        script
            .key(&self.owner)
            .key(keys::sealed(&self.name, self.partition))
            .arg(&self.record)
            .arg(generation);
        let reply: i64 = self.conn.invoke(&script).await?;
        Ok(reply == 1)
    }

    /// Retires the partition if nothing is left in it (`retire.lua`).
    pub(crate) async fn retire(&self) -> Result<Retire> {
        let mut script = RETIRE.key(&self.stream);
        script
            .key(&self.owner)
            .key(keys::sealed(&self.name, self.partition))
            .key(&self.delayed)
            .key(&self.dead)
            .key(keys::retired(&self.name, self.partition))
            .key(&self.completions)
            .arg(&self.record)
            .arg(keys::GROUP);
        let reply: i64 = self.conn.invoke(&script).await?;
        Ok(match reply {
            1 => Retire::Done,
            0 => Retire::Busy,
            2 => Retire::Leftovers,
            _ => Retire::Fenced,
        })
    }

    /// Copies the marks of the periodic jobs whose triggers this sealed
    /// partition of generation `from` holds into their partitions of
    /// `to`, each only upward (`raise_mark.lua`): sealed, this partition's
    /// marks no longer move, and a trigger asks here first.
    pub(crate) async fn copy_marks(&self, from: Generation, to: Generation) -> Result<()> {
        let mut jobs = redis::cmd("HKEYS");
        jobs.arg(keys::periodic(&self.name));
        let jobs: Vec<String> = self.conn.query(&jobs).await?;
        for job in jobs {
            if from.route(job.as_bytes(), 0) != self.partition {
                continue;
            }
            let mut get = redis::cmd("GET");
            get.arg(keys::cron(&self.name, self.partition, &job));
            let Some(mark): Option<u64> = self.conn.query(&get).await? else {
                continue;
            };
            let dest = to.route(job.as_bytes(), 0);
            let mut raise = RAISE_MARK.key(keys::cron(&self.name, dest, &job));
            raise.arg(mark);
            let _: i64 = self.conn.invoke(&raise).await?;
        }
        Ok(())
    }

    /// Creates the partition's group if it has none (a unit of a later
    /// generation: producers may have written its stream before anyone
    /// read it; from `0`, so those entries are delivered).
    pub(crate) async fn ensure_group(&self) -> Result<()> {
        match self.create_group().await {
            Err(crate::error::Error::Redis(e)) if e.code() == Some("BUSYGROUP") => Ok(()),
            other => other,
        }
    }

    /// Moves up to a batch of the delayed tasks and dead letters of this
    /// partition (of generation `from`) to the partitions of `to` their
    /// keys route to: each written there first (`move_in.lua`, which makes
    /// a repeat harmless), then removed here. Returns how many moved.
    pub(crate) async fn move_out(&self, from: Generation, to: Generation) -> Result<usize> {
        debug_assert_eq!(generation_of(self.partition), from.number);
        let rank = from.rank_of(self.partition);
        let mut range = redis::cmd("ZRANGE");
        range
            .arg(&self.delayed)
            .arg(0)
            .arg(MOVE_BATCH - 1)
            .arg("WITHSCORES");
        let delayed: Vec<(Vec<u8>, u64)> = self.conn.query(&range).await?;
        for (member, due) in &delayed {
            let fields = unpack_strings(member).unwrap_or_default();
            let dest = to.route(route_key(&fields), rank);
            let mut script = MOVE_IN.key(keys::delayed(&self.name, dest));
            script
                .key(keys::unique(&self.name, dest))
                .key(keys::moved(&self.name, dest))
                .arg("delayed")
                .arg("")
                .arg(*due)
                .arg(member.as_slice())
                .arg(value_of(&fields, field::UNIQUE).unwrap_or_default())
                .arg(value_of(&fields, field::ID).unwrap_or_default());
            let _: i64 = self.conn.invoke(&script).await?;
            // The new owner promotes it when due (after the open, it looks
            // at its delayed set as it starts).
            let _: i64 = self
                .conn
                .query(&crate::due::notice(&self.name, dest, *due))
                .await?;
            let mut rem = redis::cmd("ZREM");
            rem.arg(&self.delayed).arg(member.as_slice());
            let _: i64 = self.conn.query(&rem).await?;
        }
        let mut range = redis::cmd("XRANGE");
        range
            .arg(&self.dead)
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(MOVE_BATCH);
        let dead: Vec<(String, Letter)> = self.conn.query(&range).await?;
        for (id, pairs) in &dead {
            let fields: Vec<Vec<u8>> = pairs
                .iter()
                .flat_map(|(k, v)| [k.clone(), v.clone()])
                .collect();
            let dest = to.route(route_key(&fields), rank);
            let mut script = MOVE_IN.key(keys::dead(&self.name, dest));
            script
                .key(keys::unique(&self.name, dest))
                .key(keys::moved(&self.name, dest))
                .arg("dead")
                .arg(format!("{}/{id}", Shown(self.partition)))
                .arg(0)
                .arg("")
                .arg("")
                .arg("");
            for f in &fields {
                script.arg(f.as_slice());
            }
            let _: i64 = self.conn.invoke(&script).await?;
            let mut del = redis::cmd("XDEL");
            del.arg(&self.dead).arg(id);
            let _: i64 = self.conn.query(&del).await?;
        }
        Ok(delayed.len() + dead.len())
    }
}

/// The value of field `name` in a field-value list.
fn value_of<'a>(fields: &'a [Vec<u8>], name: &str) -> Option<&'a [u8]> {
    fields
        .chunks(2)
        .find(|kv| kv.len() == 2 && kv[0] == name.as_bytes())
        .map(|kv| kv[1].as_slice())
}

/// What places a task: its `key`, else its `id` (docs/design.md §3).
fn route_key(fields: &[Vec<u8>]) -> &[u8] {
    value_of(fields, field::KEY)
        .or_else(|| value_of(fields, field::ID))
        .unwrap_or_default()
}
