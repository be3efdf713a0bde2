//! Connections to a service's Redis: where it is ([`Redis`], the value
//! every part takes, and [`Backend`], what it is built into: one server, a
//! master that Redis Sentinel watches, or a Cluster), the one multiplexed connection each part of
//! an instance shares, replaced after an error ([`SharedConnection`]), and
//! the `WAIT` after writes a failover must not lose ([`replicated`]).
//!
//! Taking a connection from the deadpool pool for every command costs a
//! round trip (its recycle check pings the connection first). The parts that
//! send many short commands (the producer, the indexer's rounds, acks) keep
//! one multiplexed connection instead, which pipelines concurrent commands
//! by itself, and make a new one only after a failure. Blocking reads never
//! use it: a blocking command stalls every other command on its connection.

mod backend;
pub(crate) mod channels;
pub(crate) mod cluster;
mod node;
mod pipeline;
mod redact;
mod redis;
mod replicated;
mod sentinel;
mod shared;
pub(crate) mod subscriber;
mod tls;

use std::time::Duration;

pub(crate) use backend::{Backend, Conn, Servers};
pub(crate) use pipeline::Carriers;
pub(crate) use redact::redact;
pub use redis::Redis;
pub(crate) use redis::given;
pub(crate) use replicated::Waited;
pub(crate) use shared::{SharedConnection, evalsha};
pub use tls::Tls;

use deadpool_redis::redis::{Client, RedisError};

use crate::error::{Error, Result};

/// `WAIT <replicas> <timeout>` after the writes a failover must not lose
/// (docs/design.md §8): the write's command fails unless that many
/// replicas have it within the timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl Wait {
    /// [`Error::NotReplicated`] if a `WAIT` counted `got` replicas, fewer
    /// than asked for; `Ok` if that many, or if none was sent (`None`).
    pub(crate) fn confirmed(self, got: Option<u32>) -> Result<()> {
        match got {
            Some(got) if got < self.replicas => Err(Error::NotReplicated {
                wanted: self.replicas,
                got,
                within: self.timeout,
            }),
            _ => Ok(()),
        }
    }
}

/// How long a command on a shared connection may wait for its reply. The
/// client's default (500 ms) turns a large pipelined batch into an error
/// although Redis applied it.
/// How long connecting to one node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// `e`, from a producer connecting or a consumer starting, with the Redis
/// it came from when Redis or the network caused it (a refusal, an
/// unreachable server). Other errors, such as a settings mismatch, stay as
/// they are, so callers can still match on them.
pub(crate) fn at(target: &str, e: Error) -> Error {
    let source = match e {
        // The pool's wrapping adds nothing the operator needs.
        Error::Pool(deadpool_redis::PoolError::Backend(e)) => Error::Redis(e),
        e @ (Error::Redis(_) | Error::Pool(_) | Error::Timeout(_)) => e,
        other => return other,
    };
    Error::Connect {
        url: target.to_owned(),
        source: Box::new(source),
    }
}

/// Whether the connection that returned `error` may be broken and must be
/// replaced; an error reply from Redis (a BUSYGROUP, a script error)
/// leaves it usable.
pub(crate) fn is_broken(error: &RedisError) -> bool {
    // A server that a failover demoted (or cut off from its replicas)
    // answers every write with an error reply: a connection to the
    // master Sentinel names now must replace it. On one server given by
    // its URL the new connection goes to the same server, no worse.
    sentinel::not_the_master(error)
        || error.is_io_error()
        || error.is_connection_dropped()
        || error.is_timeout()
        || error.is_unrecoverable_error()
}

/// A redis-rs client for the one server at `url`, with `tls` if given; a
/// URL that does not parse is an invalid `setting`, shown without its
/// password.
pub(crate) fn client(url: &str, tls: Option<&Tls>, setting: &'static str) -> Result<Client> {
    match tls {
        #[cfg(feature = "tls")]
        Some(tls) => tls::client(url, tls),
        #[cfg(not(feature = "tls"))]
        Some(_) => Err(tls::unavailable()),
        None => Client::open(url).map_err(|e| redact::not_a_url(setting, url, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_redis_errors_name_the_redis() {
        let refused = Error::Pool(deadpool_redis::PoolError::Backend(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
        ));
        let Error::Connect { url, source } = at("redis://db/", refused) else {
            panic!("not wrapped");
        };
        assert_eq!(url, "redis://db/");
        assert!(matches!(*source, Error::Redis(_)), "{source:?}");
        let invalid = at("redis://db/", Error::invalid("allow_eviction", "no"));
        assert!(
            matches!(invalid, Error::InvalidSetting { .. }),
            "{invalid:?}"
        );
    }
}
