//! Rendezvous (highest random weight) ownership (docs/design.md §9): the
//! owner of partition `p` in an epoch is the member of the epoch's list
//! with the highest score for `p`.
//!
//! A member joining takes only the partitions it wins, and one leaving
//! gives away only its own: about `P / N` partitions move per change,
//! where the modulo filter moves most of them. Every instance computes
//! the owners from the same list (the previous round's ranked set), so
//! the score must come out the same on every machine and every Rust
//! release: [`hash64`] is XXH3-64, a fixed published function, and the
//! weighted score takes its logarithm from `libm`, the same code on every
//! platform (not the system's math library).

use std::sync::OnceLock;

use xxhash_rust::xxh3::xxh3_64;

/// The weight a member has when its name carries none.
pub const DEFAULT_WEIGHT: u32 = 1;
/// The largest weight an instance may have.
pub const MAX_WEIGHT: u32 = 1000;

/// The hash rendezvous ownership scores with: XXH3-64 (seed 0) of the
/// partition number in decimal, a NUL byte, and the member's instance id.
///
/// ```
/// // Fixed forever: instances of different builds must agree.
/// assert_eq!(peerq::assignment::hash64(0, "a"), peerq::assignment::hash64(0, "a"));
/// assert_ne!(peerq::assignment::hash64(0, "a"), peerq::assignment::hash64(1, "a"));
/// ```
pub fn hash64(partition: u32, id: &str) -> u64 {
    // On the stack for the ids peerq makes (about 20 bytes): an owner table
    // hashes every partition with every member at each membership change,
    // P × N times (a million at P = 1,024 and N = 1,000), and two heap
    // allocations per hash were most of its time.
    let mut digits = [0_u8; 10];
    let mut at = digits.len();
    let mut rest = partition;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let digits = &digits[at..];
    let len = digits.len() + 1 + id.len();
    let mut stack = [0_u8; 64];
    let mut heap = Vec::new();
    let bytes: &mut [u8] = if len <= stack.len() {
        &mut stack[..len]
    } else {
        heap.resize(len, 0);
        &mut heap
    };
    bytes[..digits.len()].copy_from_slice(digits);
    bytes[digits.len()] = 0;
    bytes[digits.len() + 1..].copy_from_slice(id.as_bytes());
    xxh3_64(bytes)
}

/// The hash rendezvous scores a singleton's holders with: XXH3-64 (seed 0)
/// of `singleton`, a NUL byte, the singleton's name, a NUL byte, and the
/// member's instance id. Fixed forever, as [`hash64`] is.
pub(crate) fn singleton_hash64(name: &str, id: &str) -> u64 {
    let mut bytes = Vec::with_capacity(11 + name.len() + id.len());
    bytes.extend_from_slice(b"singleton\0");
    bytes.extend_from_slice(name.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(id.as_bytes());
    xxh3_64(&bytes)
}

/// The number the modulo assignor places singleton `name` by: XXH3-64 of
/// `singleton`, a NUL byte and the name.
pub(crate) fn singleton_slot(name: &str) -> u64 {
    let mut bytes = Vec::with_capacity(10 + name.len());
    bytes.extend_from_slice(b"singleton\0");
    bytes.extend_from_slice(name.as_bytes());
    xxh3_64(&bytes)
}

/// One member of an epoch: an instance id and its weight, as the round's
/// ranked set names it (`<id>@<weight>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Member {
    pub(crate) id: String,
    pub(crate) weight: u32,
}

impl Member {
    /// The member name in a round's ranked set: `<id>@<weight>`.
    pub(crate) fn name(id: &str, weight: u32) -> String {
        format!("{id}@{weight}")
    }

    /// Reads a member name; one without a valid `@<weight>` suffix (an
    /// instance of a release that wrote plain ids) has weight 1.
    pub(crate) fn parse(name: &str) -> Member {
        match name.rsplit_once('@') {
            Some((id, w)) => match w.parse::<u32>() {
                Ok(weight) if (1..=MAX_WEIGHT).contains(&weight) => Member {
                    id: id.to_owned(),
                    weight,
                },
                _ => Member::plain(name),
            },
            None => Member::plain(name),
        }
    }

    fn plain(name: &str) -> Member {
        Member {
            id: name.to_owned(),
            weight: DEFAULT_WEIGHT,
        }
    }

    /// The member's score for `partition`: the hash itself when every
    /// weight is equal, else `weight / -ln(u)` with `u` the hash mapped
    /// into (0, 1) (weighted rendezvous: a member wins a share of the
    /// partitions proportional to its weight).
    fn score(&self, partition: u32, weighted: bool) -> Score {
        self.score_of(hash64(partition, &self.id), weighted)
    }

    /// The score of a hash `h` of this member and what it may own.
    fn score_of(&self, h: u64, weighted: bool) -> Score {
        if !weighted {
            return Score::Hash(h);
        }
        // The top 53 bits, centred in their step: never 0, never 1.
        let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        Score::Weighted(f64::from(self.weight) / -libm::log(u), h)
    }
}

/// A score, compared within one epoch's list (all of one kind).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Score {
    Hash(u64),
    /// The weighted score, then the hash to break an exact tie.
    Weighted(f64, u64),
}

impl Score {
    fn beats(self, other: Score) -> bool {
        match (self, other) {
            (Score::Hash(a), Score::Hash(b)) => a > b,
            (Score::Weighted(a, ha), Score::Weighted(b, hb)) => a > b || (a == b && ha > hb),
            _ => unreachable!("one list scores one way"),
        }
    }
}

/// The members of one epoch, in the order of the round's ranked set, and
/// the owner of each partition once asked.
#[derive(Debug)]
pub(crate) struct Members {
    list: Vec<Member>,
    weighted: bool,
    /// For the partition count asked first: the position of each
    /// partition's owner in `list`. Computed once per list (the indexer
    /// keeps one `Members` while the list stays the same).
    owners: OnceLock<(u32, Vec<u32>)>,
    /// The same for a later generation's units (docs/design.md §21): its
    /// number, its unit count, and each unit's owner by its number in the
    /// generation, for the generation asked first.
    later: OnceLock<(u32, u32, Vec<u32>)>,
}

impl Members {
    /// The members named in a round's ranked set.
    pub(crate) fn from_names<S: AsRef<str>>(names: &[S]) -> Members {
        Members::new(names.iter().map(|n| Member::parse(n.as_ref())).collect())
    }

    pub(crate) fn new(list: Vec<Member>) -> Members {
        let weighted = list.windows(2).any(|w| w[0].weight != w[1].weight);
        Members {
            list,
            weighted,
            owners: OnceLock::new(),
            later: OnceLock::new(),
        }
    }

    /// The members, in the ranked set's order.
    pub(crate) fn list(&self) -> &[Member] {
        &self.list
    }

    /// The position of the member with instance id `id`.
    pub(crate) fn position(&self, id: &str) -> Option<usize> {
        self.list.iter().position(|m| m.id == id)
    }

    /// The position of the owner of `partition` (of `partitions`), or
    /// `None` for an empty list.
    pub(crate) fn owner(&self, partition: u32, partitions: u32) -> Option<usize> {
        if self.list.is_empty() {
            return None;
        }
        let (cached_for, owners) = self
            .owners
            .get_or_init(|| (partitions, self.compute(partitions)));
        if *cached_for == partitions {
            return owners.get(partition as usize).map(|&i| i as usize);
        }
        Some(self.owner_of(partition))
    }

    /// The position of the owner of unit `u` of a later generation
    /// (docs/design.md §21), scored from the unit itself; `None` for an
    /// empty list.
    /// `units`: how many the generation has; its owner table is computed
    /// once per list, as generation 0's.
    pub(crate) fn owner_of_unit(&self, u: u32, units: u32) -> Option<usize> {
        if self.list.is_empty() {
            return None;
        }
        let generation = crate::partition::generation_of(u);
        let (cached, count, owners) = self.later.get_or_init(|| {
            let table = (0..units)
                .map(|i| self.owner_of(crate::partition::unit(generation, i)) as u32)
                .collect();
            (generation, units, table)
        });
        if (*cached, *count) == (generation, units) {
            let i = crate::partition::index_of(u) as usize;
            return owners.get(i).map(|&o| o as usize);
        }
        Some(self.owner_of(u))
    }

    fn compute(&self, partitions: u32) -> Vec<u32> {
        (0..partitions).map(|p| self.owner_of(p) as u32).collect()
    }

    /// The position of the owner of `partition` (or a later generation's
    /// unit), scored directly; the list must not be empty.
    pub(crate) fn owner_of(&self, partition: u32) -> usize {
        self.best(|m| m.score(partition, self.weighted))
    }

    /// The position of the holder of singleton `name`, or `None` for an
    /// empty list: the member with the highest score for the name, as for
    /// a partition, so weights apply and singletons spread over members.
    pub(crate) fn singleton_owner(&self, name: &str) -> Option<usize> {
        if self.list.is_empty() {
            return None;
        }
        Some(self.best(|m| m.score_of(singleton_hash64(name, &m.id), self.weighted)))
    }

    fn best(&self, score: impl Fn(&Member) -> Score) -> usize {
        let mut best = 0;
        let mut best_score = score(&self.list[0]);
        for (i, m) in self.list.iter().enumerate().skip(1) {
            let score = score(m);
            if score.beats(best_score) {
                (best, best_score) = (i, score);
            }
        }
        best
    }
}

impl PartialEq for Members {
    fn eq(&self, other: &Members) -> bool {
        self.list == other.list
    }
}

impl Eq for Members {}

impl std::hash::Hash for Members {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.list.hash(state);
    }
}

#[cfg(test)]
mod tests;
