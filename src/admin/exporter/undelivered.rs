//! What waits in one partition stream: how many entries its consumer group
//! has not been given yet, and the `XRANGE` that finds the first of them.
//! Pure arithmetic on the replies; the reads are the exporter's.

use deadpool_redis::redis::streams::StreamInfoGroupsReply;

use crate::{backlog, keys};

/// Entries read to count a partition's undelivered ones when Redis cannot
/// tell the group's lag (before Redis 7): the count is exact below it.
const COUNTED: u64 = 100;

/// A partition's entries not yet delivered, as its stream's length and
/// consumer groups tell them.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Undelivered {
    /// None: no stream, or a group that was given every entry.
    None,
    /// `count` of them (one or more), after `after`.
    Known { count: u64, after: After },
    /// A group whose lag Redis cannot tell: they are after `after`, and
    /// at most `upper` (the stream's length less the group's pending).
    Counted { after: After, upper: u64 },
}

/// Where a partition's undelivered entries start.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum After {
    /// At the stream's start: no group yet, nothing was delivered.
    Start,
    /// After this id, the group's last delivered one.
    Id(String),
}

impl Undelivered {
    /// What waits in a stream of `length` entries with `groups` (`None`:
    /// no stream).
    pub(super) fn of(length: u64, groups: Option<StreamInfoGroupsReply>) -> Undelivered {
        let Some(groups) = groups else {
            return Undelivered::None;
        };
        let group = groups.groups.into_iter().find(|g| g.name == keys::GROUP);
        let (count, after) = match group {
            // No group yet: no instance ever read it, every entry waits.
            None => (length, After::Start),
            Some(group) => {
                let after = After::Id(group.last_delivered_id);
                match group.lag {
                    Some(lag) => {
                        let pending = group.pending as u64;
                        (backlog::undelivered(lag as u64, length, pending), after)
                    }
                    None => match length.saturating_sub(group.pending as u64) {
                        0 => return Undelivered::None,
                        upper => return Undelivered::Counted { after, upper },
                    },
                }
            }
        };
        match count {
            0 => Undelivered::None,
            count => Undelivered::Known { count, after },
        }
    }

    /// The `XRANGE` start and `COUNT` that read the first of them (and
    /// count them, up to [`COUNTED`], when the lag is not known); `None`
    /// when none waits.
    pub(super) fn range(&self) -> Option<(String, u64)> {
        let (after, count) = match self {
            Undelivered::None => return None,
            Undelivered::Known { after, .. } => (after, 1),
            Undelivered::Counted { after, .. } => (after, COUNTED),
        };
        let start = match after {
            After::Start => "-".to_owned(),
            // Exclusive (Redis 6.2): the last delivered is not waiting.
            After::Id(id) => format!("({id}"),
        };
        Some((start, count))
    }

    /// How many wait, given that the [`range`](Self::range) read `read`
    /// entries.
    pub(super) fn count(&self, read: u64) -> u64 {
        match *self {
            Undelivered::None => 0,
            // Nothing after the last delivered entry: none waits, whatever
            // the lag says (see `of`).
            Undelivered::Known { .. } if read == 0 => 0,
            Undelivered::Known { count, .. } => count,
            // Fewer than asked for: all of them. Else at least those, and
            // at most what the stream holds beyond the pending (acked
            // entries not trimmed yet are in it too).
            Undelivered::Counted { upper, .. } if read >= COUNTED => read.max(upper),
            Undelivered::Counted { .. } => read,
        }
    }
}

#[cfg(test)]
mod tests {
    use deadpool_redis::redis::streams::StreamInfoGroup;

    use super::*;

    fn groups(lag: Option<usize>, pending: usize) -> Option<StreamInfoGroupsReply> {
        let group = StreamInfoGroup {
            name: keys::GROUP.to_owned(),
            pending,
            last_delivered_id: "17-3".to_owned(),
            lag,
            ..StreamInfoGroup::default()
        };
        Some(StreamInfoGroupsReply {
            groups: vec![group],
        })
    }

    #[test]
    fn what_waits_comes_from_the_group_or_the_whole_stream() {
        assert_eq!(Undelivered::of(9, None), Undelivered::None, "no stream");
        assert_eq!(Undelivered::None.range(), None);
        let no_group = Undelivered::of(9, Some(StreamInfoGroupsReply::default()));
        assert_eq!(no_group.range(), Some(("-".to_owned(), 1)));
        assert_eq!(no_group.count(1), 9);
        assert_eq!(Undelivered::of(9, groups(Some(0), 2)), Undelivered::None);
        let lagging = Undelivered::of(9, groups(Some(4), 2));
        assert_eq!(lagging.range(), Some(("(17-3".to_owned(), 1)));
        assert_eq!(lagging.count(1), 4);
    }

    #[test]
    fn a_lag_beyond_the_stream_is_not_believed() {
        // After an AOF reload Redis may count deleted entries in the lag.
        let overstated = Undelivered::of(3, groups(Some(1145), 1));
        assert_eq!(
            overstated.count(1),
            2,
            "at most the stream less the pending"
        );
        assert_eq!(Undelivered::of(1, groups(Some(1145), 1)), Undelivered::None);
        let nothing_after = Undelivered::of(9, groups(Some(4), 2));
        assert_eq!(nothing_after.count(0), 0, "the read found none waiting");
    }

    #[test]
    fn with_no_lag_known_they_are_counted_up_to_a_bound() {
        assert_eq!(Undelivered::of(2, groups(None, 2)), Undelivered::None);
        let unknown = Undelivered::of(500, groups(None, 2));
        assert_eq!(unknown.range(), Some(("(17-3".to_owned(), COUNTED)));
        assert_eq!(unknown.count(7), 7, "fewer than asked for: all of them");
        assert_eq!(
            unknown.count(COUNTED),
            498,
            "else the stream less the pending"
        );
        let trimmed = Undelivered::of(COUNTED + 5, groups(None, 10));
        assert_eq!(trimmed.count(COUNTED), COUNTED, "never fewer than read");
    }
}
