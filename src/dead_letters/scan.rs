//! Reading through every dead letter, a bounded call at a time: for a
//! search, which must see every letter but must not hold Redis or the
//! caller for long.
//!
//! A call is one round trip that reads at most `count` letters: the
//! partitions' lengths (`XLEN`, pipelined) say how many each still has, and
//! the call reads on from the cursor, partition after partition (`XRANGE …
//! COUNT n`, pipelined), until it has asked for `count`. Letters come in
//! partition order, then stream order.
//!
//! A bulk action ([`super::bulk`]) scans only to where each partition's
//! letters ended when it began: its reads end there (`XRANGE … <end>`),
//! and a partition that had none is skipped.

use deadpool_redis::redis::{self, streams::StreamRangeReply};

use super::bulk::Ends;
use super::{Cursor, DeadLetter, DeadLetters};
use crate::error::Result;
use crate::keys;

/// One call's letters, and where the next call goes on.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Scan {
    /// The letters read, in partition order.
    pub letters: Vec<DeadLetter>,
    /// Where the next call starts; `None` once the last letter was read.
    pub next: Option<Cursor>,
}

impl DeadLetters {
    /// Reads up to `count` letters (at least 1) after `after` (from the
    /// first one without it), in partition order.
    pub async fn scan(&self, after: Option<&Cursor>, count: usize) -> Result<Scan> {
        self.scan_to(after, count, None).await
    }

    /// [`scan`](Self::scan), reading each partition only to its end in
    /// `ends` when given (none of a partition that had no letter).
    pub(super) async fn scan_to(
        &self,
        after: Option<&Cursor>,
        count: usize,
        ends: Option<&Ends>,
    ) -> Result<Scan> {
        let count = count.max(1);
        // The position of the cursor's partition among those looked at.
        let first = after.map_or(0, |c| self.units.partition_point(|&u| u < c.partition));
        if first >= self.units.len() {
            return Ok(Scan {
                letters: Vec::new(),
                next: None,
            });
        }
        let mut lens = redis::pipe();
        for &p in &self.units[first..] {
            lens.cmd("XLEN").arg(keys::dead(&self.name, p));
        }
        let lens: Vec<usize> = self.conn.query_pipe(&lens).await?;
        // How many to ask of each partition, from the cursor's on.
        let mut asks: Vec<(u32, usize)> = Vec::new();
        let mut budget = count;
        for (&p, len) in self.units[first..].iter().zip(lens) {
            if budget == 0 {
                break;
            }
            // Nothing to read where the action's bound says the partition
            // had no letter.
            let ask = match ends.map(|ends| ends.of(p)) {
                Some(None) => 0,
                _ => len.min(budget),
            };
            if ask > 0 {
                asks.push((p, ask));
                budget -= ask;
            }
        }
        let mut reads = redis::pipe();
        for (p, ask) in &asks {
            let start = match after {
                Some(c) if c.partition == *p => format!("({}", c.id),
                _ => "-".to_owned(),
            };
            let end = ends.and_then(|ends| ends.of(*p)).unwrap_or("+");
            reads
                .cmd("XRANGE")
                .arg(keys::dead(&self.name, *p))
                .arg(start)
                .arg(end)
                .arg("COUNT")
                .arg(*ask);
        }
        let replies: Vec<StreamRangeReply> = match asks.len() {
            0 => Vec::new(),
            _ => self.conn.query_pipe(&reads).await?,
        };
        let mut letters = Vec::new();
        let mut last_got = 0;
        for ((p, _), reply) in asks.iter().zip(replies) {
            last_got = reply.ids.len();
            letters.extend(reply.ids.into_iter().map(|e| DeadLetter::read(*p, e)));
        }
        // The budget ran out at the last partition asked: if it gave all
        // that was asked it may hold more; if less (the cursor was inside
        // it, or its end came first), it is done and the next call starts
        // at the one after.
        // Otherwise every partition was read to its end (as long as it was
        // when the lengths were read). Each call moves on, so a search
        // always ends.
        let next = match (budget, asks.last()) {
            (0, Some((_, ask))) if last_got == *ask => letters.last().map(DeadLetter::cursor),
            (0, Some((p, _))) => {
                let at = self.units.partition_point(|u| u <= p);
                self.units.get(at).map(|&next| Cursor {
                    partition: next,
                    id: "0-0".to_owned(),
                })
            }
            _ => None,
        };
        Ok(Scan { letters, next })
    }
}
