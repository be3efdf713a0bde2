//! Acting on many dead letters at once: replaying or purging every letter
//! a filter picks ([`DeadLetters::replay_all`],
//! [`DeadLetters::purge_reason`], the dashboard's action on a search's
//! matches).
//!
//! An action covers the letters that were dead when it began, and none
//! that died after: a replayed task that fails for good at once dies again,
//! and must not be replayed over and over. The bound is a position in each
//! partition's dead letters, read from Redis as the action begins: the id
//! of the partition's last letter ([`Ends`]). Redis gives a stream's
//! entries growing ids, so a letter added later has a greater id in its
//! partition whatever any clock says. Neither a letter's `dead_at` (the
//! consumer's clock) nor the caller's clock decides, nor any order across
//! partitions (on a Cluster their ids come from the clocks of different
//! servers).

use std::collections::BTreeMap;

use deadpool_redis::redis::{self, streams::StreamRangeReply};
use futures_util::future::try_join_all;

use super::{Cursor, DeadLetter, DeadLetters};
use crate::error::{Error, Result};
use crate::keys;

/// Letters a bulk action reads per call (one round trip for the reads,
/// then one pipeline of the call's actions).
pub(crate) const BULK_BATCH: usize = 500;

/// What a bulk action does to each letter it picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    /// Enqueues the task again ([`DeadLetters::replay`]).
    Replay,
    /// Removes the letter ([`DeadLetters::purge`]).
    Purge,
}

/// Where each partition's dead letters ended at one moment: the id of its
/// last letter, `None` for a partition that had none.
#[derive(Debug, Clone)]
pub(crate) struct Ends {
    last: BTreeMap<u32, String>,
}

impl Ends {
    /// Partition `p`'s end: its last letter's id, if it had one.
    pub(super) fn of(&self, p: u32) -> Option<&str> {
        self.last.get(&p).map(String::as_str)
    }
}

impl DeadLetters {
    /// Where each partition's dead letters end now (`XREVRANGE … + - COUNT
    /// 1` of each, in one pipeline).
    pub(crate) async fn ends(&self) -> Result<Ends> {
        if self.units.is_empty() {
            return Ok(Ends {
                last: BTreeMap::new(),
            });
        }
        let mut pipe = redis::pipe();
        for &p in self.units.iter() {
            pipe.cmd("XREVRANGE")
                .arg(keys::dead(&self.name, p))
                .arg("+")
                .arg("-")
                .arg("COUNT")
                .arg(1);
        }
        let replies: Vec<StreamRangeReply> = self.conn.query_pipe(&pipe).await?;
        let last = self
            .units
            .iter()
            .zip(replies)
            .filter_map(|(&p, reply)| Some((p, reply.ids.into_iter().next()?.id)))
            .collect();
        Ok(Ends { last })
    }

    /// Does `act` to every letter that `wanted` picks among those dead
    /// when it began (see the module's doc), partition after partition,
    /// each oldest first, in at most `calls` calls of [`BULK_BATCH`]
    /// letters, a call's letters at once (their commands share the
    /// connection's pipeline). Returns how many letters it did it to (one
    /// gone meanwhile does not count), and whether it stopped before the
    /// last letter.
    pub(crate) async fn act_on(
        &self,
        wanted: impl Fn(&DeadLetter) -> bool,
        act: Act,
        calls: usize,
    ) -> Result<(u64, bool)> {
        let ends = self.ends().await?;
        let mut after: Option<Cursor> = None;
        let mut done = 0;
        for _ in 0..calls {
            let scan = self
                .scan_to(after.as_ref(), BULK_BATCH, Some(&ends))
                .await?;
            let picked = scan.letters.iter().filter(|letter| wanted(letter));
            let acted = try_join_all(picked.map(|letter| async move {
                match act {
                    // A letter whose unique key another task holds stays.
                    Act::Replay => match self.replay(letter).await {
                        Err(Error::Duplicate(_)) => Ok(false),
                        replayed => replayed,
                    },
                    Act::Purge => self.purge(letter).await,
                }
            }))
            .await?;
            done += acted.into_iter().filter(|acted| *acted).count() as u64;
            match scan.next {
                Some(next) => after = Some(next),
                None => return Ok((done, false)),
            }
        }
        Ok((done, true))
    }
}
