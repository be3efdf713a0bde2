//! The crate's one error type.
//!
//! Every fallible public function returns [`Result`]. Settings problems carry
//! the name of the setting and what would work, so the message alone tells the
//! operator what to change.

use std::fmt;
use std::time::Duration;

use deadpool_redis::redis::{ErrorKind, RedisError};
use deadpool_redis::{HookError, PoolError};

mod batch;
mod duplicate;
mod reshard;

pub use batch::BatchRefused;
pub use duplicate::{BatchDuplicates, Duplicate};
pub use reshard::ReshardRefused;

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
    #[error("redis: {redis}{hint}", redis = .0, hint = redis_hint(.0))]
    Redis(#[from] RedisError),

    /// No connection could be taken from the pool.
    #[error("redis pool: {0}")]
    Pool(#[from] deadpool_redis::PoolError),

    /// The pool could not be created (for example a malformed URL).
    #[error("redis pool: {0}")]
    CreatePool(#[from] deadpool_redis::CreatePoolError),

    /// A payload could not be encoded.
    #[error("encoding the task: {0}")]
    Codec(#[from] CodecError),

    /// An encoded payload is larger than the producer's limit.
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes (`max_payload`)")]
    PayloadTooLarge {
        /// The encoded size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },

    /// An enqueue (or a dead letter's replay) refused because the task's
    /// unique key (`Options::unique`) is held by another task that is not
    /// final yet: nothing was enqueued. The key is free once that task
    /// succeeds, is dead-lettered or is cancelled.
    #[error("{0}")]
    Duplicate(Duplicate),

    /// Some tasks of a batch (`Producer::enqueue_batch_with`) were refused
    /// for their unique keys; the batch's other tasks were enqueued.
    #[error("{0}")]
    DuplicatesInBatch(Box<BatchDuplicates>),

    /// A batch refused an add or a seal (docs/design.md §19).
    #[error(transparent)]
    Batch(#[from] BatchRefused),

    /// A part of the consumer stopped unexpectedly.
    #[error("consumer runtime: {0}")]
    Runtime(String),

    /// Redis did not answer in time.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),

    /// A reshard did not start (docs/design.md §21): the refusal names why.
    #[error("{0}")]
    ReshardRefused(ReshardRefused),

    /// No service of this name has ever recorded its settings in this
    /// Redis: its `{N}:meta` does not exist (the name is misspelt, or the
    /// Redis or database is not the service's).
    #[error(
        "no service `{name}` at {url}: `{{{name}}}:meta` does not exist (nothing was ever \
         enqueued or consumed under that name there)"
    )]
    UnknownService {
        /// The name asked for.
        name: String,
        /// The Redis asked, its URL without the password.
        url: String,
    },

    /// A write landed on its master but fewer replicas than asked
    /// (`wait_for_replicas`) confirmed it within the timeout: a failover
    /// now could lose it. The write itself is done; an enqueue sent again
    /// with an idempotency key is not run twice.
    #[error(
        "a write reached {got} of {wanted} replicas within {within:?} (WAIT, \
         `wait_for_replicas`); a failover now could lose it"
    )]
    NotReplicated {
        /// Replicas asked for.
        wanted: u32,
        /// Replicas that confirmed (the fewest, on a Cluster).
        got: u32,
        /// How long it waited.
        within: Duration,
    },

    /// The Redis a producer connects to, or a consumer starts on, cannot be
    /// used: a producer could not reach it, or it refused this client (a
    /// wrong password, an ACL). A consumer waits for an unreachable Redis
    /// instead of returning this.
    #[error("cannot use redis at {url}: {source}{}", hint(.source))]
    Connect {
        /// The URL without its password, or a note that a pool was given.
        url: String,
        /// What failed.
        source: Box<Error>,
    },

    /// A PostgreSQL command failed (feature `postgres`): the outbox, its
    /// relay or the migrations.
    #[cfg(feature = "postgres")]
    #[error("postgres: {0}")]
    Postgres(#[from] sqlx::Error),

    /// The PostgreSQL database at `url` cannot be used (feature
    /// `postgres`): it could not be reached, refused this client, or a
    /// statement failed.
    #[cfg(feature = "postgres")]
    #[error("cannot use postgres at {url}: {source}")]
    PostgresAt {
        /// The URL without its password.
        url: String,
        /// What failed.
        source: sqlx::Error,
    },

    /// peerq's migrations cannot be applied to this database as it is
    /// (feature `postgres`): say, a version recorded under another name.
    #[cfg(feature = "postgres")]
    #[error("peerq migrations: {0}")]
    Migration(String),

    /// The etcd cluster of [`Membership::Etcd`](crate::Membership) cannot
    /// be used (feature `etcd`): no endpoint answers, it has lost its
    /// quorum (no leader), refused this user, or a request failed.
    #[cfg(feature = "etcd")]
    #[error("etcd at {endpoints}: {source}")]
    Etcd {
        /// The endpoints, as given.
        endpoints: String,
        /// What failed.
        source: etcd_client::Error,
    },
}

impl Error {
    /// Shorthand for [`Error::InvalidSetting`].
    pub(crate) fn invalid(setting: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidSetting {
            setting,
            message: message.into(),
        }
    }

    /// Whether trying again later may succeed: Redis cannot be reached
    /// (connection refused, a timeout, a name that does not resolve yet, any
    /// I/O error), is loading its data set, busy or failing over. Everything
    /// else is final, retrying cannot fix it: a wrong password (WRONGPASS,
    /// NOAUTH), an ACL refusal (NOPERM), an invalid URL or setting, a
    /// `{N}:meta` mismatch, a refused eviction policy, an unexpected reply.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Error::Redis(e) => redis_is_transient(e),
            Error::Pool(PoolError::Backend(e)) => redis_is_transient(e),
            Error::Pool(PoolError::PostCreateHook(HookError::Backend(e))) => redis_is_transient(e),
            Error::Pool(PoolError::Timeout(_)) | Error::Timeout(_) => true,
            // A replica that is down or catching up; it may confirm later.
            Error::NotReplicated { .. } => true,
            Error::Connect { source, .. } => source.is_transient(),
            #[cfg(feature = "postgres")]
            Error::Postgres(e) | Error::PostgresAt { source: e, .. } => sqlx_is_transient(e),
            // Unreachable, no leader, a request that timed out: a cluster
            // that may come back. A refused user or a bad TLS setup may not,
            // but the rounds retry every interval either way.
            #[cfg(feature = "etcd")]
            Error::Etcd { source, .. } => !matches!(
                source,
                etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_)
            ),
            _ => false,
        }
    }
}

/// A payload could not be encoded or decoded (by a
/// [`Codec`](crate::codec::Codec)).
#[derive(Debug, thiserror::Error)]
#[error("{codec}: {message}")]
pub struct CodecError {
    /// The codec's name.
    pub codec: &'static str,
    /// What went wrong.
    pub message: String,
}

/// An error another attempt may cure: retry loops (`crate::retry`) take
/// any error that says so, the crate's own and a module's own (such as
/// `MajorityIds`'s `IdsError`, which wraps this crate's).
pub(crate) trait Transient {
    /// Whether trying again later may succeed.
    fn is_transient(&self) -> bool;
}

impl Transient for Error {
    fn is_transient(&self) -> bool {
        Error::is_transient(self)
    }
}

/// [`Error::is_transient`] for a PostgreSQL error: the server cannot be
/// reached, restarts, is out of connections, or ended this session's
/// transaction (a timeout, a deadlock, a conflict). A missing table, a
/// refused password or a closed pool are final.
#[cfg(feature = "postgres")]
pub(crate) fn sqlx_is_transient(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            // 08: connection exceptions; 53: out of resources (too many
            // connections); 57P01-03: shut down or starting; 40: the
            // transaction was rolled back (a deadlock, a serialization
            // failure); 55P03: a lock not available in time; 57014: a
            // statement timeout; 25P03: the idle-in-transaction timeout.
            code.starts_with("08")
                || code.starts_with("53")
                || code.starts_with("40")
                || matches!(
                    &*code,
                    "57P01" | "57P02" | "57P03" | "55P03" | "57014" | "25P03"
                )
        }),
        _ => false,
    }
}

/// [`Error::is_transient`] for a redis-rs error.
fn redis_is_transient(e: &RedisError) -> bool {
    // A certificate refused, by either side: rustls reports it as an I/O
    // error too, but connecting again cannot fix it.
    if tls_refusal(e).is_some() {
        return false;
    }
    // Refused, reset, timed out, or a name that did not resolve: redis-rs
    // reports them all as I/O errors.
    if e.is_io_error() {
        return true;
    }
    match e.code() {
        // Loading its data set, a script running, a failover or a cluster
        // healing: the same command works later.
        Some("LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN" | "READONLY") => true,
        // Refused at connect while too many clients are connected (many
        // instances starting together).
        Some("ERR") => e
            .detail()
            .is_some_and(|d| d.starts_with("max number of clients reached")),
        _ => false,
    }
}

/// A hint after a [`Error::Connect`] message, for the refusals an operator
/// fixes in the URL or in Redis's ACL.
fn hint(source: &Error) -> String {
    let redis = match source {
        Error::Redis(e) | Error::Pool(PoolError::Backend(e)) => e,
        _ => return String::new(),
    };
    match (redis.kind(), redis.code()) {
        (ErrorKind::AuthenticationFailed, _) | (_, Some("WRONGPASS" | "NOAUTH")) => {
            "; check the user and password in the URL".to_owned()
        }
        // Said by the source's own message (`redis_hint`).
        (_, Some("NOPERM")) => String::new(),
        _ if tls_refusal(redis).is_some() => String::new(),
        _ if redis.is_io_error() => "; is redis running and reachable from here?".to_owned(),
        _ => String::new(),
    }
}

/// What to do about a refusal that a Redis error says wherever it comes
/// from: an ACL that lacks a right, a TLS certificate refused.
fn redis_hint(e: &RedisError) -> String {
    if e.code() == Some("NOPERM") {
        return acl_hint(e);
    }
    tls_refusal(e).unwrap_or_default().to_owned()
}

/// What to grant a Redis user whose ACL refused a command or a key, from
/// Redis's message ("…no permissions to run the 'xadd' command", "…to
/// access one of the keys…").
fn acl_hint(e: &RedisError) -> String {
    let detail = e.detail().unwrap_or_default();
    let command = detail
        .split_once("run the '")
        .and_then(|(_, rest)| rest.split_once('\''))
        .map(|(command, _)| command);
    match command {
        Some(command) => format!(
            "; the redis user may not run `{command}`, which peerq needs: grant it \
             (ACL SETUSER <user> +{command}; docs/guide/15-cluster-tls-acl.md has the whole rule)"
        ),
        None if detail.contains("keys") => "; the redis user may not use the service's keys: \
             grant ~{name}:* ~{name/*}:* (docs/guide/15-cluster-tls-acl.md has the whole rule)"
            .to_owned(),
        None => "; the redis user lacks a permission (ACL) peerq needs (docs/guide/15-cluster-tls-acl.md \
                 has the rule)"
            .to_owned(),
    }
}

/// For an error of a TLS handshake that a certificate failed, what to do:
/// the server's certificate is not one this client trusts (its CA, or the
/// name it is for), or the server refused this client's (none, or one it
/// does not trust). rustls says which in the message.
fn tls_refusal(e: &RedisError) -> Option<&'static str> {
    let message = e.to_string();
    if message.contains("invalid peer certificate") {
        Some(
            "; the server's TLS certificate is not trusted: give its CA (Tls::ca_file, \
             --tls-ca) and a host name it was issued for",
        )
    } else if message.contains("received fatal alert") {
        Some(
            "; the server refused this client's TLS certificate: it requires one its CA \
             signed (Tls::client_cert, --tls-cert and --tls-key)",
        )
    } else {
        None
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
    /// What to do about it, which depends on who was refused: an instance
    /// of the service, a producer, a standalone indexer.
    pub advice: String,
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
        write!(f, ". {}", self.advice)
    }
}

/// What a caught panic said: its `&str` or `String` payload, else nothing.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::io;

    use deadpool_redis::redis::{ServerErrorKind, make_extension_error};
    use deadpool_redis::{ConfigError, CreatePoolError, PoolError, TimeoutType};

    use super::*;

    fn io_error(kind: io::ErrorKind) -> RedisError {
        io::Error::from(kind).into()
    }

    fn server(kind: ServerErrorKind) -> RedisError {
        (ErrorKind::Server(kind), "from the server").into()
    }

    fn extension(code: &str) -> RedisError {
        make_extension_error(code.to_owned(), Some("from the server".to_owned()))
    }

    #[test]
    fn unreachable_loading_or_failing_over_is_transient() {
        let transient = [
            Error::Redis(io_error(io::ErrorKind::ConnectionRefused)),
            Error::Redis(io_error(io::ErrorKind::TimedOut)),
            Error::Redis(io_error(io::ErrorKind::ConnectionReset)),
            // How tokio reports a name that does not resolve.
            Error::Redis(io::Error::other("failed to lookup address information").into()),
            Error::Pool(PoolError::Backend(io_error(
                io::ErrorKind::ConnectionRefused,
            ))),
            Error::Pool(PoolError::Timeout(TimeoutType::Create)),
            Error::Redis(server(ServerErrorKind::BusyLoading)),
            Error::Redis(extension("LOADING")),
            Error::Redis(server(ServerErrorKind::MasterDown)),
            Error::Redis(extension("BUSY")),
            Error::Redis(
                (
                    ErrorKind::Server(ServerErrorKind::ResponseError),
                    "refused",
                    "max number of clients reached".to_owned(),
                )
                    .into(),
            ),
            Error::Timeout(Duration::from_secs(1)),
            Error::Connect {
                url: "redis://127.0.0.1:1/".into(),
                source: Box::new(Error::Redis(io_error(io::ErrorKind::ConnectionRefused))),
            },
        ];
        for e in transient {
            assert!(e.is_transient(), "{e}");
        }
    }

    #[test]
    fn refusals_and_bad_settings_are_final() {
        let final_ = [
            Error::Redis(
                (
                    ErrorKind::AuthenticationFailed,
                    "Password authentication failed",
                )
                    .into(),
            ),
            Error::Pool(PoolError::Backend(
                (
                    ErrorKind::AuthenticationFailed,
                    "Password authentication failed",
                )
                    .into(),
            )),
            Error::Redis(extension("WRONGPASS")),
            Error::Redis(extension("NOAUTH")),
            Error::Redis(server(ServerErrorKind::NoPerm)),
            Error::Redis(extension("NOPERM")),
            Error::Redis(server(ServerErrorKind::ResponseError)),
            Error::Redis((ErrorKind::InvalidClientConfig, "Redis URL did not parse").into()),
            Error::CreatePool(CreatePoolError::Config(
                ConfigError::UrlAndConnectionSpecified,
            )),
            Error::invalid("allow_eviction", "redis has maxmemory-policy `allkeys-lru`"),
            Error::SettingsMismatch(SettingsMismatch {
                key: "{n}:meta".into(),
                settings: Vec::new(),
                advice: String::new(),
            }),
            Error::Pool(PoolError::Closed),
            Error::Connect {
                url: "redis://:***@127.0.0.1:1/".into(),
                source: Box::new(Error::Redis(extension("WRONGPASS"))),
            },
        ];
        for e in final_ {
            assert!(!e.is_transient(), "{e}");
        }
    }

    #[test]
    fn a_connect_error_says_what_to_check() {
        let refused = Error::Connect {
            url: "redis://:***@db:6379/".into(),
            source: Box::new(Error::Redis(
                (
                    ErrorKind::AuthenticationFailed,
                    "Password authentication failed",
                )
                    .into(),
            )),
        };
        let msg = refused.to_string();
        assert!(
            msg.starts_with("cannot use redis at redis://:***@db:6379/: "),
            "{msg}"
        );
        assert!(
            msg.ends_with("check the user and password in the URL"),
            "{msg}"
        );
        let acl = Error::Connect {
            url: "redis://db/".into(),
            source: Box::new(Error::Redis(extension("NOPERM"))),
        };
        assert!(acl.to_string().contains("(ACL)"), "{acl}");
    }
}
