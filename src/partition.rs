//! Which partition a task goes to (docs/design.md §3).
//!
//! `partition = fnv1a64(key bytes) % P`: FNV-1a, 64 bit, over the key's
//! UTF-8 bytes, with no seed, so every process, version and language agrees
//! (the README gives the five lines it takes elsewhere). Rust's default
//! hasher is seeded per process and would scatter one key over partitions.

use std::hash::Hasher;

use fnv::FnvHasher;

/// Default number of partitions `P` of a service.
pub const DEFAULT_PARTITIONS: u32 = 64;
/// Most partitions a service may have: each is a stream, a consumer group
/// and (for its owner) a reader; beyond this the per-partition overhead
/// dominates.
pub const MAX_PARTITIONS: u32 = 4096;

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

    proptest! {
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
