//! Pages of dead letters across partitions: oldest or newest first, of one
//! reason, from a cursor.
//!
//! Each partition's dead letters are a stream ordered by id (the Redis
//! time they were dead-lettered), so a page over all partitions is a merge:
//! a page's worth of each partition from the cursor on (`XRANGE` or
//! `XREVRANGE … COUNT n`, pipelined), sorted by `(id, partition)`, cut to
//! the page. Ties of one id in two partitions are broken by the partition,
//! so a cursor names one position and no letter is skipped or shown twice.

use std::cmp::Reverse;
use std::fmt;
use std::str::FromStr;

use deadpool_redis::redis::{self, streams::StreamRangeReply};
use serde::{Serialize, Serializer};

use super::{DeadLetter, DeadLetters};
use crate::entry::stream_id_order;
use crate::error::{Error, Result};
use crate::keys;

/// Most letters a page with a reason reads before it returns what it has,
/// so a rare reason among many letters costs a bounded read (its `next`
/// goes on from there).
const MOST_READ: usize = 10_000;

/// Which letters come first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// The oldest dead letter first (the default).
    #[default]
    OldestFirst,
    /// The newest dead letter first.
    NewestFirst,
}

/// A dead letter's position: its partition and its id in the partition's
/// dead letters. Written `<partition>/<id>`, such as `3/1795316400000-0`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cursor {
    /// The partition.
    pub partition: u32,
    /// The id in `{N/p}:dead`.
    pub id: String,
}

impl Cursor {
    /// The sort key of the position: `(ms, seq, partition)`.
    fn key(&self) -> (u64, u64, u32) {
        let (ms, seq) = stream_id_order(&self.id).unwrap_or_default();
        (ms, seq, self.partition)
    }

    /// `id` if it is a stream id (`<ms>-<seq>` or `<ms>`), else an error
    /// naming it.
    pub(crate) fn valid_id(id: &str) -> Result<&str> {
        match stream_id_order(id) {
            Some(_) => Ok(id),
            None => Err(Error::invalid(
                "id",
                format!(
                    "`{id}` is not a dead letter's id; use `<ms>-<seq>` or \
                     `<partition>/<ms>-<seq>`, as listed"
                ),
            )),
        }
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", crate::partition::Shown(self.partition), self.id)
    }
}

impl FromStr for Cursor {
    type Err = Error;

    /// Reads `<partition>/<id>`.
    fn from_str(text: &str) -> Result<Self> {
        let parsed = text.split_once('/').and_then(|(p, id)| {
            let p = crate::partition::parse_unit(p)?;
            Some((p, Cursor::valid_id(id).ok()?))
        });
        match parsed {
            Some((partition, id)) => Ok(Cursor {
                partition,
                id: id.to_owned(),
            }),
            None => Err(Error::invalid(
                "cursor",
                format!("`{text}` is not `<partition>/<id>`, such as `3/1795316400000-0`"),
            )),
        }
    }
}

impl Serialize for Cursor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// Which dead letters a [`DeadLetters::page`] returns.
///
/// ```
/// use peerq::dead_letters::{Order, Query};
/// let newest_failures = Query::new(20).order(Order::NewestFirst).reason("failed");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct Query {
    limit: usize,
    order: Order,
    reason: Option<String>,
    after: Option<Cursor>,
}

impl Query {
    /// Up to `limit` letters (at least 1), oldest first, any reason.
    pub fn new(limit: usize) -> Self {
        Query {
            limit: limit.max(1),
            order: Order::OldestFirst,
            reason: None,
            after: None,
        }
    }

    /// In this order.
    pub fn order(mut self, order: Order) -> Self {
        self.order = order;
        self
    }

    /// Only letters with this reason (`failed`, `permanent`, `decode`,
    /// `malformed`, `too_large`, `relay`).
    pub fn reason(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }

    /// Starting after this position (a page's [`Page::next`]).
    pub fn after(mut self, cursor: Cursor) -> Self {
        self.after = Some(cursor);
        self
    }
}

/// One page of dead letters. Its JSON: `letters` (each as
/// [`DeadLetter`]'s) and `next` (`<partition>/<id>` or null).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Page {
    /// The letters, in the query's order.
    pub letters: Vec<DeadLetter>,
    /// Where the next page starts (pass it to [`Query::after`]); `None`
    /// once the page reached the last letter.
    pub next: Option<Cursor>,
}

impl DeadLetters {
    /// A page of dead letters over all partitions: up to the query's
    /// limit, in its order, from its cursor on. With a reason it reads on
    /// until it found a page's worth, or Redis sent it 10,000 letters.
    pub async fn page(&self, query: &Query) -> Result<Page> {
        let mut letters = Vec::new();
        let mut at = query.after.clone();
        let mut read = 0;
        loop {
            let (merged, fetched) = self.merged(query.order, at.as_ref(), query.limit).await?;
            let last = merged.len() < query.limit;
            // Counted as Redis sent them: each merge reads up to `limit`
            // of every partition to keep `limit` of them.
            read += fetched;
            for letter in merged {
                at = Some(letter.cursor());
                if query.reason.as_ref().is_none_or(|r| *r == letter.reason) {
                    letters.push(letter);
                    if letters.len() == query.limit {
                        return Ok(Page { letters, next: at });
                    }
                }
            }
            if last {
                return Ok(Page {
                    letters,
                    next: None,
                });
            }
            if read >= MOST_READ {
                return Ok(Page { letters, next: at });
            }
        }
    }

    /// The first `n` letters after `after` in `order`, over all partitions,
    /// and how many letters Redis sent to find them.
    async fn merged(
        &self,
        order: Order,
        after: Option<&Cursor>,
        n: usize,
    ) -> Result<(Vec<DeadLetter>, usize)> {
        if self.units.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let mut pipe = redis::pipe();
        for &p in self.units.iter() {
            let key = keys::dead(&self.name, p);
            // The letters after `(id, partition)` in the merged order: in
            // the partitions the order puts after the cursor's, the id
            // itself may come next; in the others only ids beyond it.
            let bound = |inclusive: bool| match after {
                None => None,
                Some(c) if inclusive => Some(c.id.clone()),
                Some(c) => Some(format!("({}", c.id)),
            };
            match order {
                Order::OldestFirst => {
                    let start = bound(after.is_some_and(|c| p > c.partition));
                    pipe.cmd("XRANGE")
                        .arg(key)
                        .arg(start.as_deref().unwrap_or("-"))
                        .arg("+")
                }
                Order::NewestFirst => {
                    let end = bound(after.is_some_and(|c| p < c.partition));
                    pipe.cmd("XREVRANGE")
                        .arg(key)
                        .arg(end.as_deref().unwrap_or("+"))
                        .arg("-")
                }
            }
            .arg("COUNT")
            .arg(n);
        }
        let replies: Vec<StreamRangeReply> = self.conn.query_pipe(&pipe).await?;
        let mut letters: Vec<DeadLetter> = (self.units.iter().copied())
            .zip(replies)
            .flat_map(|(p, reply)| reply.ids.into_iter().map(move |e| DeadLetter::read(p, e)))
            .collect();
        match order {
            Order::OldestFirst => letters.sort_by_key(|l| l.cursor().key()),
            Order::NewestFirst => letters.sort_by_key(|l| Reverse(l.cursor().key())),
        }
        let fetched = letters.len();
        letters.truncate(n);
        Ok((letters, fetched))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_what_it_writes() {
        let c: Cursor = "3/1795316400000-2".parse().unwrap();
        assert_eq!((c.partition, c.id.as_str()), (3, "1795316400000-2"));
        assert_eq!(c.to_string(), "3/1795316400000-2");
        for bad in ["1795316400000-2", "x/1-0", "3/abc", "3/1-x", ""] {
            let err = bad.parse::<Cursor>().unwrap_err().to_string();
            assert!(err.contains("cursor") && err.contains(bad), "{err}");
        }
    }

    #[test]
    fn positions_order_by_time_then_sequence_then_partition() {
        let c = |text: &str| text.parse::<Cursor>().unwrap().key();
        assert!(c("9/1-0") < c("0/2-0"));
        assert!(c("9/2-0") < c("0/2-1"));
        assert!(c("0/2-1") < c("1/2-1"));
        assert!(c("0/10-0") > c("0/9-5"), "numbers, not text");
    }
}
