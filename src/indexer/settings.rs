//! The indexer's settings, validated: the round interval, the tolerated
//! clock skew, the lease margin, the indexing mode, the assignor and this
//! instance's weight (docs/design.md §2, §2.1 and §9). All but the weight
//! are service-wide, recorded in `{N}:meta`.

use std::fmt;
use std::time::Duration;

use crate::assignment::{Assignor, DEFAULT_WEIGHT, MAX_WEIGHT};
use crate::config::fmt_duration;
use crate::connection::Wait;
use crate::error::{Error, Result};
use crate::membership::Membership;
use crate::timing::Timing;

/// Default round interval `I`.
pub(crate) const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Default tolerated clock skew `S`.
pub(crate) const DEFAULT_SKEW: Duration = Duration::from_millis(50);
/// Default lease margin (about the round latency on a LAN, docs/design.md §4 rule 6).
pub(crate) const DEFAULT_LEASE_MARGIN: Duration = Duration::from_millis(20);
/// Smallest interval accepted: below it a round's latency, the timer
/// granularity and the skew allowance leave no room for the protocol.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Largest interval accepted: beyond it membership changes take hours to show.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// How the peer indexer derives an instance's index (docs/design.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Indexing {
    /// The seed's algorithm: `INCR` of the round's counter; the index is the
    /// order in which the writes reached Redis. Instances whose offsets lie
    /// closer together than the network jitter can swap indices between
    /// epochs, which moves partitions for nothing.
    Incr,
    /// `ZADD` of the instance's offset into the round's sorted set; the index
    /// is the rank of the offset, read in the next round. Stable while the
    /// membership is.
    #[default]
    Ranked,
}

impl Indexing {
    /// The mode's name as stored in `{N}:meta`.
    pub fn as_str(self) -> &'static str {
        match self {
            Indexing::Incr => "incr",
            Indexing::Ranked => "ranked",
        }
    }
}

impl fmt::Display for Indexing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The indexer's service-wide settings, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexerSettings {
    pub(crate) interval: Duration,
    pub(crate) skew: Duration,
    pub(crate) lease_margin: Duration,
    pub(crate) indexing: Indexing,
    /// Who owns which partition: service-wide.
    pub(crate) assignor: Assignor,
    /// This instance's weight under [`Assignor::Rendezvous`].
    pub(crate) weight: u32,
    /// Where the rounds run (docs/design.md §2.2): service-wide.
    pub(crate) membership: Membership,
}

impl Default for IndexerSettings {
    fn default() -> Self {
        IndexerSettings {
            interval: DEFAULT_INTERVAL,
            skew: DEFAULT_SKEW,
            lease_margin: DEFAULT_LEASE_MARGIN,
            indexing: Indexing::default(),
            assignor: Assignor::default(),
            weight: DEFAULT_WEIGHT,
            membership: Membership::Redis,
        }
    }
}

impl IndexerSettings {
    /// Checks the ranges of docs/design.md §2 and §4.
    pub(crate) fn validate(&self) -> Result<()> {
        let i = self.interval;
        if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&i) {
            return Err(Error::invalid(
                "interval",
                format!(
                    "{} is out of range; the interval must be between {} and {}",
                    fmt_duration(i),
                    fmt_duration(MIN_INTERVAL),
                    fmt_duration(MAX_INTERVAL)
                ),
            ));
        }
        if self.lease_margin >= i / 4 {
            return Err(Error::invalid(
                "lease_margin",
                format!(
                    "{} is too large for an interval of {}; it must be below interval/4 = {} \
                     (about the round latency, 20ms on a LAN)",
                    fmt_duration(self.lease_margin),
                    fmt_duration(i),
                    fmt_duration(i / 4)
                ),
            ));
        }
        // Beyond I/4 - margin the counts of one interval can be read before
        // all its writes landed, and two instances own one partition.
        self.validate_assignor()?;
        self.membership.validate()?;
        let max_skew = i / 4 - self.lease_margin;
        if self.skew >= max_skew {
            return Err(Error::invalid(
                "skew",
                format!(
                    "{} is too large: the tolerated clock skew must be below interval/4 - \
                     lease_margin = {} (interval {}, lease_margin {}); raise the interval or \
                     synchronise the clocks better",
                    fmt_duration(self.skew),
                    fmt_duration(max_skew),
                    fmt_duration(i),
                    fmt_duration(self.lease_margin)
                ),
            ));
        }
        Ok(())
    }

    /// Checks the replicas the rounds' writes wait for (`WAIT` holds the
    /// rounds' connection: a round must still end in its window): a
    /// timeout of at most a tenth of the interval.
    pub(crate) fn validate_wait(&self, wait: Option<Wait>) -> Result<()> {
        match wait {
            Some(wait) if wait.timeout > self.interval / 10 => Err(Error::invalid(
                "wait_for_replicas",
                format!(
                    "a timeout of {:?} is more than a tenth of the interval ({:?})",
                    wait.timeout, self.interval
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Checks the assignor against the indexing, and the weight.
    fn validate_assignor(&self) -> Result<()> {
        if !(1..=MAX_WEIGHT).contains(&self.weight) {
            return Err(Error::invalid(
                "weight",
                format!(
                    "{} is out of range; an instance's weight is 1 to {MAX_WEIGHT}",
                    self.weight
                ),
            ));
        }
        if self.assignor == Assignor::Rendezvous && self.indexing == Indexing::Incr {
            return Err(Error::invalid(
                "assignor",
                "rendezvous needs ranked indexing: incr rounds count instances without naming \
                 them, so no instance could read the epoch's members"
                    .to_owned(),
            ));
        }
        if self.weight != DEFAULT_WEIGHT && self.assignor == Assignor::Modulo {
            return Err(Error::invalid(
                "weight",
                format!(
                    "{} needs the rendezvous assignor: modulo gives every instance the same share",
                    self.weight
                ),
            ));
        }
        Ok(())
    }

    /// The times of the handover rules (docs/design.md §4) of a service
    /// with these settings and `drain_timeout`.
    pub(crate) fn timing(&self, drain_timeout: Duration) -> Timing {
        Timing {
            interval: self.interval,
            skew: self.skew,
            lease_margin: self.lease_margin,
            drain_timeout,
        }
    }

    /// The `{N}:meta` fields these settings are recorded as.
    pub(crate) fn meta_fields(&self) -> Vec<(&'static str, String)> {
        let mut fields = vec![
            ("interval", fmt_duration(self.interval)),
            ("skew", fmt_duration(self.skew)),
            ("lease_margin", fmt_duration(self.lease_margin)),
            ("indexing", self.indexing.as_str().to_owned()),
            ("assignor", self.assignor.as_str().to_owned()),
        ];
        fields.extend(self.membership.meta_fields());
        fields
    }
}

/// The setters of the settings a builder shares with its peer indexer
/// (`interval`, `skew`, `lease_margin`, `indexing`, `assignor`, `weight`,
/// `membership`),
/// for a builder with a field `indexer: IndexerSettings`: a consumer's and
/// a standalone singleton's, written once.
macro_rules! indexer_setters {
    () => {
        /// The indexer's round interval `I` (default 1 s). Service-wide.
        pub fn interval(mut self, interval: std::time::Duration) -> Self {
            self.indexer.interval = interval;
            self
        }

        /// The tolerated clock skew `S` (default 50 ms). Service-wide.
        pub fn skew(mut self, skew: std::time::Duration) -> Self {
            self.indexer.skew = skew;
            self
        }

        /// The lease margin (default 20 ms). Service-wide.
        pub fn lease_margin(mut self, margin: std::time::Duration) -> Self {
            self.indexer.lease_margin = margin;
            self
        }

        /// The indexing mode (default
        /// [`Indexing::Ranked`](crate::indexer::Indexing::Ranked)). Service-wide.
        pub fn indexing(mut self, indexing: $crate::indexer::Indexing) -> Self {
            self.indexer.indexing = indexing;
            self
        }

        /// Who owns which partition and holds which singleton (default
        /// [`Assignor::Modulo`](crate::assignment::Assignor::Modulo)). Service-wide:
        /// [`Assignor::Rendezvous`](crate::assignment::Assignor::Rendezvous) moves
        /// about `P / N` partitions per join or leave instead of most of
        /// them, and needs [`Indexing::Ranked`](crate::indexer::Indexing::Ranked).
        pub fn assignor(mut self, assignor: $crate::assignment::Assignor) -> Self {
            self.indexer.assignor = assignor;
            self
        }

        /// This instance's weight, 1 to 1000 (default 1): under
        /// [`Assignor::Rendezvous`](crate::assignment::Assignor::Rendezvous) instances
        /// own partitions (and singletons) in proportion to their weights
        /// (give a machine with twice the cores weight 2). Each instance's
        /// own; the others read it from the round's member list.
        pub fn weight(mut self, weight: u32) -> Self {
            self.indexer.weight = weight;
            self
        }

        /// Where the rounds keep the service's membership (default
        /// [`Membership::Redis`](crate::membership::Membership::Redis); `Membership::Etcd`
        /// with the `etcd` feature). Service-wide: `{N}:meta` records it.
        pub fn membership(mut self, membership: $crate::membership::Membership) -> Self {
            self.indexer.membership = membership;
            self
        }
    };
}
pub(crate) use indexer_setters;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn settings(interval_ms: u64, skew_ms: u64, margin_ms: u64) -> IndexerSettings {
        IndexerSettings {
            interval: Duration::from_millis(interval_ms),
            skew: Duration::from_millis(skew_ms),
            lease_margin: Duration::from_millis(margin_ms),
            indexing: Indexing::Ranked,
            assignor: Assignor::Modulo,
            weight: 1,
            membership: Membership::Redis,
        }
    }

    fn setting_of(r: Result<()>) -> &'static str {
        match r {
            Err(Error::InvalidSetting { setting, .. }) => setting,
            other => panic!("expected an invalid setting, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        IndexerSettings::default().validate().unwrap();
    }

    #[test]
    fn interval_zero_or_absurd_is_rejected_with_the_range() {
        for ms in [0, 1, 99, 3_600_001] {
            let r = settings(ms, 0, 0).validate();
            let msg = r.as_ref().unwrap_err().to_string();
            assert!(msg.contains("between 100ms and 3600s"), "{msg}");
            assert_eq!(setting_of(r), "interval");
        }
        settings(100, 0, 0).validate().unwrap();
    }

    #[test]
    fn skew_of_a_quarter_interval_minus_margin_is_rejected() {
        // I = 1s, margin 20ms: S must stay below 230ms.
        assert_eq!(setting_of(settings(1000, 230, 20).validate()), "skew");
        assert_eq!(setting_of(settings(1000, 250, 0).validate()), "skew");
        settings(1000, 229, 20).validate().unwrap();
        let msg = settings(1000, 300, 20).validate().unwrap_err().to_string();
        assert!(
            msg.contains("below interval/4 - lease_margin = 230ms"),
            "{msg}"
        );
    }

    #[test]
    fn lease_margin_of_a_quarter_interval_is_rejected() {
        assert_eq!(
            setting_of(settings(1000, 0, 250).validate()),
            "lease_margin"
        );
    }

    proptest! {
        /// Whatever validates keeps the skew below I/4 - margin, so the writes
        /// of one interval land before its counts are read (docs/design.md §2).
        #[test]
        fn valid_settings_keep_the_skew_bound(i in 0u64..5000, s in 0u64..2000, m in 0u64..2000) {
            let st = settings(i, s, m);
            if st.validate().is_ok() {
                prop_assert!(st.skew + st.lease_margin < st.interval / 4);
                prop_assert!(st.interval >= MIN_INTERVAL);
            }
        }
    }
}
