//! A partition's part in a reshard (docs/design.md §21), as its owner
//! writes it: the seal, the retire, and its periodic jobs' marks (the
//! moves of its delayed tasks and dead letters are in `moves`).

use std::sync::LazyLock;
use std::time::Duration;

use deadpool_redis::redis::{self, Script};

use super::PartitionStore;
use crate::error::Result;
use crate::keys;
use crate::reshard::Generation;

static SEAL: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/seal.lua")));
static RETIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/retire.lua")));
static RAISE_MARK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../scripts/raise_mark.lua")));

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

    /// Retires the partition if nothing is left in it (`retire.lua`); its
    /// task records, all final then, are kept for `keep` from then on.
    pub(crate) async fn retire(&self, keep: Duration) -> Result<Retire> {
        let mut script = RETIRE.key(&self.stream);
        script
            .key(&self.owner)
            .key(keys::sealed(&self.name, self.partition))
            .key(&self.delayed)
            .key(&self.dead)
            .key(keys::retired(&self.name, self.partition))
            .key(&self.completions)
            .key(self.records.tasks())
            .key(self.records.running())
            .key(self.records.cancels())
            .key(keys::ended(&self.name, self.partition))
            .key(keys::ended_at(&self.name, self.partition))
            .arg(&self.record)
            .arg(keys::GROUP)
            .arg(keep.as_millis() as u64);
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
}
