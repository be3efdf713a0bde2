//! An instance's place in its service for one epoch, and the partitions that
//! place owns (docs/design.md §3 and §9): by the modulo filter, or by
//! rendezvous over the epoch's members ([`Assignor::Rendezvous`]).

mod rendezvous;
mod standing;

use std::fmt;
use std::sync::Arc;

pub use rendezvous::{DEFAULT_WEIGHT, MAX_WEIGHT, hash64};
pub(crate) use rendezvous::{Member, Members};
pub use standing::{FenceReason, Standing};

use crate::partition;
use crate::reshard::Layout;

/// An assignment's numbers without its owners: what a task's context
/// tells (copied per task, where the owners would cost a reference count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) epoch: u64,
    pub(crate) index: u32,
    pub(crate) replicas: u32,
}

/// Who owns which partition in an epoch: a service-wide setting, recorded
/// in `{N}:meta` (every instance must compute the same owners).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Assignor {
    /// Partition `p` belongs to the instance with `index - 1 == p % replicas`.
    /// Needs nothing but the index and the count, works with either
    /// indexing, and moves most partitions at every membership change.
    #[default]
    Modulo,
    /// Partition `p` belongs to the epoch's member with the highest
    /// [`hash64`]`(p, id)` score (weighted by
    /// [`ConsumerBuilder::weight`](crate::consumer::ConsumerBuilder::weight)): about
    /// `P / N` partitions move per join or leave. Needs `Ranked` indexing,
    /// whose rounds name their members.
    Rendezvous,
}

impl Assignor {
    /// The name recorded in `{N}:meta` and taken on command lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Assignor::Modulo => "modulo",
            Assignor::Rendezvous => "rendezvous",
        }
    }
}

impl fmt::Display for Assignor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Assignor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "modulo" => Ok(Assignor::Modulo),
            "rendezvous" => Ok(Assignor::Rendezvous),
            other => Err(format!("unknown assignor {other:?}: modulo or rendezvous")),
        }
    }
}

/// What the peer indexer tells an instance for one epoch: it is instance
/// number `index` of `replicas`, and which partitions it owns.
///
/// Always `1 <= index <= replicas`, and within one epoch the live instances'
/// indices are exactly `1..=replicas`, each once. Every instance assigned
/// for one epoch computes the same owner for each partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Assignment {
    /// The round number the assignment was formed in: epoch `E` is formed by
    /// the rounds of the interval starting at `(E - 1) * I`.
    pub epoch: u64,
    /// This instance's index, from 1.
    pub index: u32,
    /// How many instances took part in the round the index came from.
    pub replicas: u32,
    owner: Owner,
    /// The layout the round read beside the count (docs/design.md §21);
    /// `None`: the service was never resharded.
    layout: Option<Arc<Layout>>,
}

/// How an assignment decides ownership.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Owner {
    Modulo,
    /// This instance is member `me` of the epoch's `members`.
    Rendezvous {
        members: Arc<Members>,
        me: usize,
    },
}

impl Assignment {
    /// A modulo assignment: instance `index` of `replicas` in `epoch`.
    pub fn modulo(epoch: u64, index: u32, replicas: u32) -> Assignment {
        Assignment {
            epoch,
            index,
            replicas,
            owner: Owner::Modulo,
            layout: None,
        }
    }

    /// A rendezvous assignment: member `me` of the epoch's `members`, with
    /// its index and the count from the same ranked set.
    pub(crate) fn rendezvous(
        epoch: u64,
        index: u32,
        replicas: u32,
        members: Arc<Members>,
        me: usize,
    ) -> Assignment {
        Assignment {
            epoch,
            index,
            replicas,
            owner: Owner::Rendezvous { members, me },
            layout: None,
        }
    }

    /// The same assignment, formed with the layout its round read.
    pub(crate) fn with_layout(mut self, layout: Option<Arc<Layout>>) -> Assignment {
        self.layout = layout;
        self
    }

    /// The layout its round read; `None`: the service was never resharded.
    pub(crate) fn layout(&self) -> Option<&Layout> {
        self.layout.as_deref()
    }

    /// Whether this assignment owns unit `u` (docs/design.md §21), of a
    /// generation with `units` units: a unit of generation 0 as
    /// [`owns`](Self::owns) a partition; a later one by its number within
    /// its generation (modulo) or by the members' scores for the unit
    /// (rendezvous), so no two generations share an owner table.
    pub(crate) fn owns_unit(&self, u: u32, units: u32) -> bool {
        if partition::generation_of(u) == 0 {
            return self.owns(u, units);
        }
        match &self.owner {
            Owner::Modulo => partition::index_of(u) % self.replicas == self.index - 1,
            Owner::Rendezvous { members, me } => members.owner_of_unit(u, units) == Some(*me),
        }
    }

    /// The assignor that formed this assignment.
    pub fn assignor(&self) -> Assignor {
        match self.owner {
            Owner::Modulo => Assignor::Modulo,
            Owner::Rendezvous { .. } => Assignor::Rendezvous,
        }
    }

    /// Whether this assignment owns `partition` of `partitions`.
    pub fn owns(&self, partition: u32, partitions: u32) -> bool {
        match &self.owner {
            Owner::Modulo => partition % self.replicas == self.index - 1,
            Owner::Rendezvous { members, me } => members.owner(partition, partitions) == Some(*me),
        }
    }

    /// Whether this assignment holds singleton `name` (docs/design.md §20):
    /// placed like a partition, by a number drawn from the name under
    /// modulo and by the members' scores for the name under rendezvous, so
    /// every instance assigned in the epoch finds the same holder from the
    /// name alone.
    pub(crate) fn holds_singleton(&self, name: &str) -> bool {
        match &self.owner {
            Owner::Modulo => {
                rendezvous::singleton_slot(name) % u64::from(self.replicas)
                    == u64::from(self.index - 1)
            }
            Owner::Rendezvous { members, me } => members.singleton_owner(name) == Some(*me),
        }
    }

    /// The partitions of `0..partitions` this assignment owns, ascending.
    pub fn owned_partitions(&self, partitions: u32) -> Vec<u32> {
        match &self.owner {
            Owner::Modulo => (self.index - 1..partitions)
                .step_by(self.replicas as usize)
                .collect(),
            Owner::Rendezvous { .. } => (0..partitions)
                .filter(|&p| self.owns(p, partitions))
                .collect(),
        }
    }

    /// The epoch, index and replicas.
    pub(crate) fn place(&self) -> Place {
        Place {
            epoch: self.epoch,
            index: self.index,
            replicas: self.replicas,
        }
    }
}

impl fmt::Display for Assignment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} (epoch {})", self.index, self.replicas, self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn modulo_filter_example() {
        let a = Assignment::modulo(1, 2, 3);
        assert_eq!(a.owned_partitions(10), vec![1, 4, 7]);
        assert!(a.owns(4, 10) && !a.owns(5, 10));
    }

    /// Weights apply to singletons as to partitions (docs/design.md §20):
    /// a member of weight 3 beside one of weight 1 holds about three
    /// quarters of the names.
    #[test]
    fn a_heavier_member_holds_more_singletons() {
        let members = Arc::new(Members::from_names(&["light@1", "heavy@3"]));
        let heavy = Assignment::rendezvous(3, 2, 2, members, 1);
        let held = (0..4000)
            .filter(|i| heavy.holds_singleton(&format!("job-{i}")))
            .count();
        assert!((2800..3200).contains(&held), "{held} of 4000");
    }

    proptest! {
        /// Every singleton has exactly one holder among indices
        /// 1..=replicas, and among the members of a rendezvous list.
        #[test]
        fn each_singleton_has_exactly_one_holder(replicas in 1u32..50, name in "[a-z]{1,12}") {
            let held = (1..=replicas)
                .filter(|&i| Assignment::modulo(3, i, replicas).holds_singleton(&name))
                .count();
            prop_assert_eq!(held, 1);
            let names: Vec<String> = (0..replicas).map(|i| format!("i{i}@1")).collect();
            let members = Arc::new(Members::from_names(&names));
            let held = (0..replicas as usize)
                .filter(|&me| {
                    Assignment::rendezvous(3, me as u32 + 1, replicas, members.clone(), me)
                        .holds_singleton(&name)
                })
                .count();
            prop_assert_eq!(held, 1);
        }

        /// A later generation's units (docs/design.md §21) each have exactly
        /// one owner too, under both assignors, whatever generation the
        /// members' table was first asked for.
        #[test]
        fn each_unit_of_a_later_generation_has_exactly_one_owner(
            replicas in 1u32..20,
            units in 1u32..200,
            generation in 1u32..5,
        ) {
            let names: Vec<String> = (0..replicas).map(|i| format!("i{i}@1")).collect();
            let members = Arc::new(Members::from_names(&names));
            for i in 0..units {
                let u = partition::unit(generation, i);
                let modulo = (1..=replicas)
                    .filter(|&x| Assignment::modulo(3, x, replicas).owns_unit(u, units))
                    .count();
                prop_assert_eq!(modulo, 1);
                let owners: Vec<usize> = (0..replicas as usize)
                    .filter(|&me| {
                        Assignment::rendezvous(3, me as u32 + 1, replicas, members.clone(), me)
                            .owns_unit(u, units)
                    })
                    .collect();
                prop_assert_eq!(owners.len(), 1);
                // The cached table and the direct score agree.
                prop_assert_eq!(members.owner_of(u), owners[0]);
            }
        }

        /// Every partition has exactly one owner among indices 1..=replicas,
        /// and `owned_partitions` lists exactly the ones `owns` accepts.
        #[test]
        fn each_partition_has_exactly_one_owner(replicas in 1u32..100, partitions in 1u32..300) {
            let mut owners = vec![0u32; partitions as usize];
            for index in 1..=replicas {
                let a = Assignment::modulo(7, index, replicas);
                let listed: Vec<u32> = a.owned_partitions(partitions);
                let by_filter: Vec<u32> = (0..partitions).filter(|&p| a.owns(p, partitions)).collect();
                prop_assert_eq!(&listed, &by_filter);
                for p in listed {
                    owners[p as usize] += 1;
                }
            }
            prop_assert!(owners.iter().all(|&n| n == 1));
        }
    }
}
