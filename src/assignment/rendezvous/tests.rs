//! Property tests of rendezvous ownership: one owner per partition, few
//! moves per membership change, shares that follow weights.

use super::*;
use proptest::prelude::*;

/// Instance ids as peerq makes them: a host name, a pid and a random part.
fn ids(n: usize) -> impl Strategy<Value = Vec<String>> {
    prop::collection::hash_set("[a-z]{3,8}-[0-9]{1,5}-[0-9a-f]{8}", n)
        .prop_map(|set| set.into_iter().collect())
}

fn members(ids: &[String], weights: &[u32]) -> Members {
    Members::new(
        ids.iter()
            .zip(weights.iter().chain(std::iter::repeat(&1)))
            .map(|(id, &weight)| Member {
                id: id.clone(),
                weight,
            })
            .collect(),
    )
}

/// The owner's instance id of each partition.
fn owners(m: &Members, partitions: u32) -> Vec<String> {
    (0..partitions)
        .map(|p| m.list()[m.owner(p, partitions).unwrap()].id.clone())
        .collect()
}

/// The bound on the partitions one member wins, beyond `P / N`: five
/// standard deviations of the binomial count, and 2 for small counts.
/// (The count a member wins is Binomial(P, 1/N): it has no hard bound;
/// at five deviations one list in about three million goes over.)
fn slack(partitions: u32, n: usize) -> f64 {
    let q = 1.0 / n as f64;
    5.0 * (f64::from(partitions) * q * (1.0 - q)).sqrt() + 2.0
}

#[test]
fn member_names_carry_weights() {
    assert_eq!(Member::name("h-1-ab", 7), "h-1-ab@7");
    assert_eq!(
        Member::parse("h-1-ab@7"),
        Member {
            id: "h-1-ab".into(),
            weight: 7
        }
    );
    // An id with no weight (or a weight out of range) weighs 1, whole.
    assert_eq!(Member::parse("h-1-ab").weight, 1);
    assert_eq!(Member::parse("a@b@0").id, "a@b@0");
    assert_eq!(Member::parse("a@b@3").id, "a@b");
}

#[test]
fn hash64_is_the_documented_function() {
    // XXH3-64 (seed 0) of "5\0inst" and "17\0host-42-deadbeef", as the
    // Python `xxhash` package computes them: a change of function would
    // give two owners in a rolling deploy, so the values are pinned.
    assert_eq!(hash64(5, "inst"), 0x22a4_66c2_325b_8a6c);
    assert_eq!(hash64(17, "host-42-deadbeef"), 0xa4fd_70df_9598_b23f);
}

/// The concatenation as the documentation says it, built the plain way.
fn plain_hash64(partition: u32, id: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(format!("{partition}\0{id}").as_bytes())
}

#[test]
fn hash64_hashes_the_same_bytes_for_every_partition_and_id_length() {
    let long = "x".repeat(200);
    for id in [
        "",
        "a",
        "inst",
        "host-42-deadbeef",
        &"y".repeat(53),
        &"z".repeat(54),
        &long,
    ] {
        for p in [0, 9, 10, 99, 1023, 1_000_000, u32::MAX] {
            assert_eq!(hash64(p, id), plain_hash64(p, id), "{p} {id:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every partition has exactly one owner, the same whichever order
    /// the list comes in, with any weights.
    #[test]
    fn each_partition_has_exactly_one_owner(
        ids in (1usize..30).prop_flat_map(ids),
        weights in prop::collection::vec(1u32..=MAX_WEIGHT, 30),
        partitions in 1u32..300,
    ) {
        let m = members(&ids, &weights);
        let mut reversed: Vec<Member> = m.list().to_vec();
        reversed.reverse();
        let r = Members::new(reversed);
        prop_assert_eq!(owners(&m, partitions), owners(&r, partitions));
        let mut count = vec![0u32; partitions as usize];
        for i in 0..m.list().len() {
            for p in 0..partitions {
                if m.owner(p, partitions) == Some(i) {
                    count[p as usize] += 1;
                }
            }
        }
        prop_assert!(count.iter().all(|&c| c == 1));
    }

    /// A member joining takes only partitions it wins (none moves between
    /// the others), at most `P / N + slack` of them; one leaving gives
    /// away only its own.
    #[test]
    fn one_member_more_or_less_moves_about_p_over_n(
        ids in (2usize..25).prop_flat_map(ids),
        partitions in prop::sample::select(vec![16u32, 64, 256, 1024]),
    ) {
        let before = members(&ids[1..], &[]);
        let after = members(&ids, &[]);
        let (old, new) = (owners(&before, partitions), owners(&after, partitions));
        let moved: Vec<usize> = (0..old.len()).filter(|&p| old[p] != new[p]).collect();
        prop_assert!(moved.iter().all(|&p| new[p] == ids[0]), "only to the newcomer");
        let bound = f64::from(partitions) / ids.len() as f64 + slack(partitions, ids.len());
        prop_assert!(moved.len() as f64 <= bound, "{} moved, bound {bound:.1}", moved.len());
        // Leaving is the same change backwards: only the leaver's move.
        prop_assert!(moved.iter().all(|&p| old[p] != ids[0]));
    }

    /// Shares follow weights: each member's count is within five standard
    /// deviations (plus 2) of `P * w / W`.
    #[test]
    fn shares_follow_weights(
        ids in (2usize..12).prop_flat_map(ids),
        weights in prop::collection::vec(1u32..=10, 12),
    ) {
        let partitions = 1024u32;
        let m = members(&ids, &weights);
        let total: u32 = m.list().iter().map(|x| x.weight).sum();
        for (i, member) in m.list().iter().enumerate() {
            let won = (0..partitions).filter(|&p| m.owner(p, partitions) == Some(i)).count();
            let q = f64::from(member.weight) / f64::from(total);
            let expected = f64::from(partitions) * q;
            let sd = (f64::from(partitions) * q * (1.0 - q)).sqrt();
            prop_assert!(
                (won as f64 - expected).abs() <= 5.0 * sd + 2.0,
                "weight {} of {total}: {won} partitions, expected {expected:.0}", member.weight
            );
        }
    }
}
