//! The crate's one error type.
//!
//! Every fallible public function returns [`Result`]. Settings problems carry
//! the name of the setting and what would work, so the message alone tells the
//! operator what to change.

use std::fmt;
use std::time::Duration;

use deadpool_redis::redis::RedisError;

/// A `Result` with peerq's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in peerq.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is out of its allowed range. Raised when a builder's
    /// `build()` or `run()` validates, before anything touches Redis.
    #[error("invalid setting `{setting}`: {message}")]
    InvalidSetting {
        /// The builder method / setting name, for example `interval`.
        setting: &'static str,
        /// What is wrong and what would work.
        message: String,
    },

    /// This instance's service-wide settings differ from the ones the service
    /// stored in `{N}:meta` on first use.
    #[error("{0}")]
    SettingsMismatch(SettingsMismatch),

    /// A Redis command failed.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),

    /// No connection could be taken from the pool.
    #[error("redis pool: {0}")]
    Pool(#[from] deadpool_redis::PoolError),

    /// The pool could not be created (for example a malformed URL).
    #[error("redis pool: {0}")]
    CreatePool(#[from] deadpool_redis::CreatePoolError),

    /// A payload could not be encoded.
    #[error("encoding the task: {0}")]
    Codec(#[from] crate::codec::CodecError),

    /// An encoded payload is larger than the producer's limit.
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes (`max_payload`)")]
    PayloadTooLarge {
        /// The encoded size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },

    /// A part of the consumer stopped unexpectedly.
    #[error("consumer runtime: {0}")]
    Runtime(String),

    /// Redis did not answer in time.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
}

impl Error {
    /// Shorthand for [`Error::InvalidSetting`].
    pub(crate) fn invalid(setting: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidSetting {
            setting,
            message: message.into(),
        }
    }
}

/// The settings of one instance that differ from those stored for its
/// service. Each entry names the setting, this instance's value and the
/// stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingsMismatch {
    /// The Redis key that holds the service's settings (`{N}:meta`).
    pub key: String,
    /// One entry per differing setting.
    pub settings: Vec<SettingDiff>,
}

/// One setting that differs from the service's stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingDiff {
    /// The setting's name, as the builder method calls it.
    pub setting: String,
    /// This instance's value.
    pub ours: String,
    /// The value stored for the service.
    pub stored: String,
}

impl fmt::Display for SettingsMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "settings differ from the service's (stored in `{}`):",
            self.key
        )?;
        for (i, d) in self.settings.iter().enumerate() {
            let sep = if i == 0 { " " } else { "; " };
            write!(
                f,
                "{sep}`{}` is {} here but {} for the service",
                d.setting, d.ours, d.stored
            )?;
        }
        write!(
            f,
            ". Every instance of a service must use the same values; to change them, stop all \
             instances and delete `{}`",
            self.key
        )
    }
}
