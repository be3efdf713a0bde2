//! An instance's place in its service for one epoch, and the partitions that
//! place owns (docs/design.md §3: the modulo filter).

use std::fmt;

/// What the peer indexer tells an instance for one epoch: it is instance
/// number `index` of `replicas`.
///
/// Always `1 <= index <= replicas`, and within one epoch the live instances'
/// indices are exactly `1..=replicas`, each once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Assignment {
    /// The round number the assignment was formed in: epoch `E` is formed by
    /// the rounds of the interval starting at `(E - 1) * I`.
    pub epoch: u64,
    /// This instance's index, from 1.
    pub index: u32,
    /// How many instances took part in the round the index came from.
    pub replicas: u32,
}

impl Assignment {
    /// Whether this assignment owns `partition`: `p % replicas == index - 1`.
    pub fn owns(&self, partition: u32) -> bool {
        partition % self.replicas == self.index - 1
    }

    /// The partitions of `0..partitions` this assignment owns, ascending.
    pub fn owned_partitions(&self, partitions: u32) -> impl Iterator<Item = u32> + use<> {
        (self.index - 1..partitions).step_by(self.replicas as usize)
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
        let a = Assignment {
            epoch: 1,
            index: 2,
            replicas: 3,
        };
        assert_eq!(a.owned_partitions(10).collect::<Vec<_>>(), vec![1, 4, 7]);
        assert!(a.owns(4) && !a.owns(5));
    }

    proptest! {
        /// Every partition has exactly one owner among indices 1..=replicas,
        /// and `owned_partitions` lists exactly the ones `owns` accepts.
        #[test]
        fn each_partition_has_exactly_one_owner(replicas in 1u32..100, partitions in 1u32..300) {
            let mut owners = vec![0u32; partitions as usize];
            for index in 1..=replicas {
                let a = Assignment { epoch: 7, index, replicas };
                let listed: Vec<u32> = a.owned_partitions(partitions).collect();
                let by_filter: Vec<u32> = (0..partitions).filter(|&p| a.owns(p)).collect();
                prop_assert_eq!(&listed, &by_filter);
                for p in listed {
                    owners[p as usize] += 1;
                }
            }
            prop_assert!(owners.iter().all(|&n| n == 1));
        }
    }
}
