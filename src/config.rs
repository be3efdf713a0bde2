//! Validated settings shared by the parts of an instance.
//!
//! Validation happens once, when a builder builds; every check names the
//! setting and the range that would work. The service-wide settings among
//! them are also recorded in `{N}:meta` (see the `meta` module) so that
//! instances of one service cannot silently disagree.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::assignment::{Assignor, DEFAULT_WEIGHT, MAX_WEIGHT};
use crate::error::{Error, Result};

/// Default round interval `I`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(1);
/// Default tolerated clock skew `S`.
pub const DEFAULT_SKEW: Duration = Duration::from_millis(50);
/// Default lease margin (about the round latency on a LAN, docs/design.md §4 rule 6).
pub const DEFAULT_LEASE_MARGIN: Duration = Duration::from_millis(20);
/// Smallest interval accepted: below it a round's latency, the timer
/// granularity and the skew allowance leave no room for the protocol.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Largest interval accepted: beyond it membership changes take hours to show.
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);
/// Longest service name accepted.
pub const MAX_NAME_LEN: usize = 100;

/// The name of a service: all instances with one name split one queue.
///
/// It becomes part of every key (`{name}:…`), so it may not contain the
/// characters of the key layout (`{`, `}`, `:`, `/`), whitespace or control
/// characters, and it is 1 to [`MAX_NAME_LEN`] characters long.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ServiceName(Arc<str>);

impl ServiceName {
    /// Validates `name`.
    ///
    /// ```
    /// use peerq::config::ServiceName;
    /// assert!(ServiceName::new("mail-sender").is_ok());
    /// assert!(ServiceName::new("mail:sender").is_err());
    /// ```
    pub fn new(name: &str) -> Result<Self> {
        const RULE: &str = "a name is 1 to 100 characters, without `{`, `}`, `:`, `/`, whitespace \
                            or control characters (it becomes part of every Redis key)";
        if name.is_empty() {
            return Err(Error::invalid("name", format!("the name is empty; {RULE}")));
        }
        if name.chars().count() > MAX_NAME_LEN {
            return Err(Error::invalid(
                "name",
                format!("the name has {} characters; {RULE}", name.chars().count()),
            ));
        }
        if let Some(c) = name
            .chars()
            .find(|c| matches!(c, '{' | '}' | ':' | '/') || c.is_whitespace() || c.is_control())
        {
            return Err(Error::invalid(
                "name",
                format!("{name:?} contains {c:?}; {RULE}"),
            ));
        }
        Ok(ServiceName(name.into()))
    }

    /// Validates the name a builder was given; without one, says to call
    /// `.name()`.
    pub(crate) fn given(name: Option<&str>) -> Result<Self> {
        match name {
            Some(name) => ServiceName::new(name),
            None => Err(Error::invalid(
                "name",
                "no name given; call .name(\"mail-sender\") with the service's name: the \
                 instances and producers of one service share it",
            )),
        }
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

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

    /// The `{N}:meta` fields these settings are recorded as.
    pub(crate) fn meta_fields(&self) -> Vec<(&'static str, String)> {
        vec![
            ("interval", fmt_duration(self.interval)),
            ("skew", fmt_duration(self.skew)),
            ("lease_margin", fmt_duration(self.lease_margin)),
            ("indexing", self.indexing.as_str().to_owned()),
            ("assignor", self.assignor.as_str().to_owned()),
        ]
    }
}

/// Validates the number of partitions `P`.
pub(crate) fn validate_partitions(partitions: u32) -> Result<()> {
    use crate::partition::MAX_PARTITIONS;
    if !(1..=MAX_PARTITIONS).contains(&partitions) {
        return Err(Error::invalid(
            "partitions",
            format!("{partitions} is out of range; a service has 1 to {MAX_PARTITIONS} partitions"),
        ));
    }
    Ok(())
}

/// The `{N}:meta` fields of the queue itself, shared by producers and
/// consumers: the partitions and the codec.
pub(crate) fn queue_meta_fields(partitions: u32, codec: &str) -> Vec<(&'static str, String)> {
    vec![
        ("partitions", partitions.to_string()),
        ("codec", codec.to_owned()),
    ]
}

/// Formats a duration exactly and readably: `1s`, `250ms`, `1500us`.
///
/// Used for `{N}:meta` values, so two equal durations always format alike.
pub(crate) fn fmt_duration(d: Duration) -> String {
    let us = d.as_micros();
    if us.is_multiple_of(1_000_000) {
        format!("{}s", us / 1_000_000)
    } else if us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

/// Reads a duration written as a whole number and a unit: `1500us`,
/// `250ms`, `10s`, `5m`, `2h`, `1d`; the durations `{N}:meta` holds read
/// back unchanged. `None` for anything else (no unit, a fraction, a
/// negative number, an overflow).
///
/// ```
/// use std::time::Duration;
/// use peerq::config::parse_duration;
/// assert_eq!(parse_duration("250ms"), Some(Duration::from_millis(250)));
/// assert_eq!(parse_duration("5m"), Some(Duration::from_secs(300)));
/// assert_eq!(parse_duration("5"), None);
/// ```
pub fn parse_duration(text: &str) -> Option<Duration> {
    let digits = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let secs = |factor: u64| n.checked_mul(factor).map(Duration::from_secs);
    match unit {
        "us" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => secs(1),
        "m" => secs(60),
        "h" => secs(3600),
        "d" => secs(86_400),
        _ => None,
    }
}

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
    fn names_with_key_syntax_are_rejected() {
        for bad in [
            "",
            "a{b",
            "a}b",
            "a:b",
            "a/b",
            "a b",
            "a\nb",
            &"x".repeat(101),
        ] {
            let err = ServiceName::new(bad).unwrap_err().to_string();
            assert!(err.contains("`name`"), "{err}");
            assert!(err.contains("1 to 100 characters"), "{err}");
        }
        for good in ["mail-sender", "a", "Mail_Sender.v2", &"x".repeat(100)] {
            ServiceName::new(good).unwrap();
        }
    }

    #[test]
    fn a_missing_name_says_to_call_name() {
        let err = ServiceName::given(None).unwrap_err().to_string();
        assert!(
            err.starts_with("invalid setting `name`: no name given; call .name("),
            "{err}"
        );
        ServiceName::given(Some("mail-sender")).unwrap();
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

    #[test]
    fn durations_format_exactly() {
        assert_eq!(fmt_duration(Duration::from_secs(2)), "2s");
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(fmt_duration(Duration::from_micros(1500)), "1500us");
        assert_eq!(fmt_duration(Duration::ZERO), "0s");
    }

    #[test]
    fn durations_read_back_and_nonsense_is_refused() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1d"), Some(Duration::from_secs(86_400)));
        for bad in [
            "",
            "s",
            "10",
            "1.5s",
            "-1s",
            "10 s",
            "10sec",
            "99999999999999999999d",
        ] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn what_fmt_duration_writes_parses_back(us in 0u64..10_000_000_000) {
            let d = Duration::from_micros(us);
            prop_assert_eq!(parse_duration(&fmt_duration(d)), Some(d));
        }
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
