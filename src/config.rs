//! Settings every part of a service shares: its name, its number of
//! partitions, and durations written and read as operators write them
//! (`1s`, `250ms`). The indexer's own are in `indexer::settings`, the
//! consumer's in `consumer::settings`.
//!
//! Validation happens once, when a builder builds; every check names the
//! setting and the range that would work. The service-wide settings are
//! also recorded in `{N}:meta` (see the `meta` module) so that instances of
//! one service cannot silently disagree.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};

/// The `name` and `redis` setters of a builder with the fields
/// `name: Option<String>` and `redis: Option<Redis>` (the consumer's, the
/// producer's, the standalone indexer's), written once; each call gives
/// the two setters their docs, which say what the setting means for that
/// part.
macro_rules! name_and_redis_setters {
    (name: $(#[$name_doc:meta])* redis: $(#[$redis_doc:meta])*) => {
        $(#[$name_doc])*
        pub fn name(mut self, name: impl Into<String>) -> Self {
            self.name = Some(name.into());
            self
        }

        $(#[$redis_doc])*
        pub fn redis(mut self, redis: impl Into<$crate::connection::Redis>) -> Self {
            self.redis = Some(redis.into());
            self
        }
    };
}
pub(crate) use name_and_redis_setters;

/// Longest service name accepted.
pub(crate) const MAX_NAME_LEN: usize = 100;

/// The name of a service: all instances with one name split one queue.
///
/// It becomes part of every key (`{name}:…`), so it may not contain the
/// characters of the key layout (`{`, `}`, `:`, `/`), whitespace or control
/// characters, and it is 1 to [`MAX_NAME_LEN`] characters long.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct ServiceName(Arc<str>);

impl ServiceName {
    /// Validates `name`: `mail-sender` is one, `mail:sender` is not (the
    /// tests below list more).
    pub(crate) fn new(name: &str) -> Result<Self> {
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
    pub(crate) fn as_str(&self) -> &str {
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
/// use peerq::parse_duration;
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
}
