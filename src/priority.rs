//! Priority levels (docs/design.md §17): a service's partitions, once per
//! level it has.
//!
//! A service with levels has `P` partitions per level, `P * levels` in all,
//! each a partition like any other (its own stream, owner, delayed set and
//! dead letters, moved by the same handover rules). Level `normal` keeps
//! partitions `0..P`, so a service without levels is one with the normal
//! level only; the others follow in the order given (`high, normal, low`:
//! high is `P..2P`, low `2P..3P`). A task of key `k` at level `l` goes to
//! partition `rank(l) * P + fnv1a64(k) % P`.
//!
//! Why partitions rather than one stream per level inside each partition:
//! every part that moves a task (reads, acks, claims, trims, the idle read,
//! drains, marks) works per partition already, and each level then keeps
//! every rule of it unchanged. What it costs: a service with three levels
//! has three times the partitions, so three times the idle reads' streams
//! and owner records; and a partition key keeps its order within a level
//! only (a high task overtakes a normal one by design).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A task's priority level: an instance starts the tasks it has read at a
/// higher level before lower ones (with a guard against starving them;
/// docs/design.md §17), and reads higher levels first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Before every other level.
    High,
    /// The level of every task enqueued without one.
    #[default]
    Normal,
    /// After every other level.
    Low,
}

impl Priority {
    /// Every level, highest first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// The level's name: `high`, `normal` or `low`.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// 0 for the highest level: the order permits go in.
    pub(crate) fn order(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Priority {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                Error::invalid(
                    "priority",
                    format!("`{s}` is not a level; use high, normal or low"),
                )
            })
    }
}

/// The levels of one service, as `{N}:meta` records them (`priorities`:
/// `high,normal,low`; `normal` alone for a service without levels).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Levels {
    /// By rank: normal first, then the others highest first.
    ranked: Vec<Priority>,
}

impl Default for Levels {
    fn default() -> Self {
        Levels {
            ranked: vec![Priority::Normal],
        }
    }
}

impl Levels {
    /// The `{N}:meta` field.
    pub(crate) const FIELD: &'static str = "priorities";

    /// The levels `given`, which must hold `normal` (the level of a task
    /// enqueued without one) and no level twice.
    pub(crate) fn new(given: &[Priority]) -> Result<Levels> {
        let mut sorted = given.to_vec();
        sorted.sort();
        sorted.dedup();
        if sorted.len() != given.len() {
            return Err(Error::invalid("priorities", "a level is given twice"));
        }
        if !sorted.contains(&Priority::Normal) {
            return Err(Error::invalid(
                "priorities",
                "must include normal, the level of tasks enqueued without one",
            ));
        }
        let mut ranked = vec![Priority::Normal];
        ranked.extend(sorted.into_iter().filter(|&p| p != Priority::Normal));
        Ok(Levels { ranked })
    }

    /// The levels a `{N}:meta` value names; absent (a service recorded
    /// before levels existed) is normal alone.
    pub(crate) fn parse(recorded: Option<&str>) -> Result<Levels> {
        let Some(recorded) = recorded else {
            return Ok(Levels::default());
        };
        let given = recorded
            .split(',')
            .map(Priority::from_str)
            .collect::<Result<Vec<_>>>()?;
        Levels::new(&given)
    }

    /// How many levels: partitions per partition number.
    pub(crate) fn count(&self) -> u32 {
        self.ranked.len() as u32
    }

    /// Whether the service has any level but normal.
    pub(crate) fn any(&self) -> bool {
        self.ranked.len() > 1
    }

    /// Whether the service has `level`.
    pub(crate) fn has(&self, level: Priority) -> bool {
        self.ranked.contains(&level)
    }

    /// Every partition of a service of `partitions` per level.
    pub(crate) fn streams(&self, partitions: u32) -> u32 {
        partitions * self.count()
    }

    /// The partition of number `p` (of `partitions`) at `level`; `None`
    /// when the service has no such level.
    pub(crate) fn partition(&self, p: u32, level: Priority, partitions: u32) -> Option<u32> {
        let rank = self.ranked.iter().position(|&l| l == level)?;
        Some(rank as u32 * partitions + p)
    }

    /// The level of partition `q` (of `partitions` per level).
    pub(crate) fn level_of(&self, q: u32, partitions: u32) -> Priority {
        let rank = (q / partitions.max(1)) as usize;
        self.ranked.get(rank).copied().unwrap_or(Priority::Normal)
    }

    /// The partition `level` of a task of `key` goes to, or the error that
    /// names the level the service lacks.
    pub(crate) fn place(&self, key: &[u8], level: Priority, partitions: u32) -> Result<u32> {
        let p = crate::partition::partition_of(key, partitions);
        self.partition(p, level, partitions).ok_or_else(|| {
            Error::invalid(
                "priority",
                format!(
                    "the service has no level `{level}` (its levels: {self}); \
                     levels are chosen by its consumers' `priorities`"
                ),
            )
        })
    }
}

impl fmt::Display for Levels {
    /// Highest first, as `{N}:meta` records them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sorted = self.ranked.clone();
        sorted.sort();
        let names: Vec<&str> = sorted.iter().map(|p| p.as_str()).collect();
        f.write_str(&names.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_keeps_the_first_partitions_and_the_others_follow_highest_first() {
        let levels = Levels::new(&[Priority::Low, Priority::Normal, Priority::High]).unwrap();
        assert_eq!(levels.to_string(), "high,normal,low");
        assert_eq!(levels.streams(64), 192);
        assert_eq!(levels.partition(5, Priority::Normal, 64), Some(5));
        assert_eq!(levels.partition(5, Priority::High, 64), Some(69));
        assert_eq!(levels.partition(5, Priority::Low, 64), Some(133));
        assert_eq!(levels.level_of(69, 64), Priority::High);
        assert_eq!(levels.level_of(133, 64), Priority::Low);
        assert_eq!(levels.level_of(5, 64), Priority::Normal);
        assert_eq!(Levels::parse(Some("high,normal,low")).unwrap(), levels);
    }

    #[test]
    fn a_service_without_levels_is_normal_alone() {
        let none = Levels::parse(None).unwrap();
        assert_eq!(none, Levels::default());
        assert_eq!(none.to_string(), "normal");
        assert!(!none.any());
        assert_eq!(none.streams(64), 64);
        let refused = none.place(b"k", Priority::High, 64).unwrap_err();
        assert!(refused.to_string().contains("priority"), "{refused}");
    }

    #[test]
    fn levels_without_normal_or_twice_are_refused_by_name() {
        for bad in [&[Priority::High][..], &[Priority::Normal, Priority::Normal]] {
            let e = Levels::new(bad).unwrap_err();
            assert!(e.to_string().contains("priorities"), "{e}");
        }
        assert!(Levels::parse(Some("high,urgent")).is_err());
    }
}
