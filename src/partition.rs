//! Which partition a task goes to (docs/design.md §3).
//!
//! `partition = fnv1a64(key bytes) % P`: FNV-1a, 64 bit, over the key's
//! UTF-8 bytes, with no seed, so every process, version and language agrees
//! (the guide gives the five lines it takes elsewhere). Rust's default
//! hasher is seeded per process and would scatter one key over partitions.

use std::hash::Hasher;

use fnv::FnvHasher;

/// Default number of partitions `P` of a service.
pub const DEFAULT_PARTITIONS: u32 = 64;
/// Most partitions a service may have: each is a stream, a consumer group
/// and (for its owner) a reader; beyond this the per-partition overhead
/// dominates.
pub const MAX_PARTITIONS: u32 = 4096;

/// How many bits of a unit hold its number within its generation
/// (docs/design.md §21): the rest hold the generation.
const UNIT_BITS: u32 = 16;

/// The unit of partition `index` of generation `generation`
/// (docs/design.md §21): generation 0's units are the partition numbers.
pub(crate) fn unit(generation: u32, index: u32) -> u32 {
    debug_assert!(index < 1 << UNIT_BITS && generation < 1 << (32 - UNIT_BITS));
    generation << UNIT_BITS | index
}

/// The generation unit `u` belongs to.
pub(crate) fn generation_of(u: u32) -> u32 {
    u >> UNIT_BITS
}

/// Unit `u`'s number within its generation.
pub(crate) fn index_of(u: u32) -> u32 {
    u & ((1 << UNIT_BITS) - 1)
}

/// How unit `u` is written in keys, marks, handles and labels: `i` in
/// generation 0, `g.i` after, so no number is ever reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shown(pub(crate) u32);

impl std::fmt::Display for Shown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match generation_of(self.0) {
            0 => write!(f, "{}", self.0),
            g => write!(f, "{g}.{}", index_of(self.0)),
        }
    }
}

/// The unit written as `s` ([`Shown`]); `None` when `s` is no unit.
pub(crate) fn parse_unit(s: &str) -> Option<u32> {
    let plain = |t: &str| {
        (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .then(|| t.parse::<u32>().ok())
            .flatten()
    };
    match s.split_once('.') {
        None => plain(s).filter(|&i| i < 1 << UNIT_BITS),
        Some((g, i)) => {
            let (g, i) = (plain(g)?, plain(i)?);
            ((1..1 << (32 - UNIT_BITS)).contains(&g) && i < 1 << UNIT_BITS).then(|| unit(g, i))
        }
    }
}

/// FNV-1a 64 of `key`.
pub(crate) fn fnv1a64(key: &[u8]) -> u64 {
    let mut h = FnvHasher::default();
    h.write(key);
    h.finish()
}

/// The partition of `key` among `partitions`.
pub fn partition_of(key: &[u8], partitions: u32) -> u32 {
    (fnv1a64(key) % u64::from(partitions)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The published FNV-1a 64 test vectors, so the hash is the standard
    /// one another language's implementation reproduces.
    #[test]
    fn fnv1a64_matches_the_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn partitions_of_known_keys_are_stable() {
        // Pinned (computed independently): changing these moves every key
        // to another partition.
        assert_eq!(fnv1a64(b"user-42"), 0x32c6d7a54d35dacb);
        assert_eq!(partition_of(b"user-42", 64), 11);
        assert_eq!(partition_of(b"foobar", 64), 40);
        assert_eq!(
            partition_of(b"0190b2b5-0000-7000-8000-000000000000", 64),
            57
        );
    }

    #[test]
    fn units_show_their_generation_after_the_first() {
        assert_eq!(Shown(7).to_string(), "7");
        assert_eq!(Shown(unit(3, 17)).to_string(), "3.17");
        assert_eq!(parse_unit("7"), Some(7));
        assert_eq!(parse_unit("3.17"), Some(unit(3, 17)));
        assert_eq!(parse_unit("07"), Some(7));
        for bad in ["", "0.5", "3.", ".3", "a", "3.1.2", "65536", "-1", "+3"] {
            assert_eq!(parse_unit(bad), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn a_unit_is_shown_and_read_back(g in 0u32..65_536, i in 0u32..65_536) {
            let u = unit(g, i);
            prop_assert_eq!((generation_of(u), index_of(u)), (g, i));
            prop_assert_eq!(parse_unit(&Shown(u).to_string()), Some(u));
        }

        #[test]
        fn partition_is_in_range(key: Vec<u8>, p in 1u32..=MAX_PARTITIONS) {
            prop_assert!(partition_of(&key, p) < p);
        }
    }

    #[test]
    fn keys_spread_over_partitions() {
        let mut counts = [0u32; 64];
        for i in 0..64_000 {
            counts[partition_of(format!("key-{i}").as_bytes(), 64) as usize] += 1;
        }
        // 1000 expected per partition; a fair hash stays well within ±20 %.
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
