//! One multiplexed Redis connection, shared, replaced after an error.
//!
//! Taking a connection from the deadpool pool for every command costs a
//! round trip (its recycle check pings the connection first). The parts that
//! send many short commands (the producer, the indexer's rounds, acks) keep
//! one multiplexed connection instead, which pipelines concurrent commands
//! by itself, and go back to the pool only after a failure, when the pool's
//! check replaces a broken connection. Blocking reads never use it: a
//! blocking command stalls every other command on its connection.

use std::sync::Mutex;
use std::time::Duration;

use deadpool_redis::Pool;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{Cmd, FromRedisValue, Pipeline, RedisError, ScriptInvocation, Value};

use crate::error::{Error, Result};

/// How long a command on a shared connection may wait for its reply. The
/// client's default (500 ms) turns a large pipelined batch into an error
/// although Redis applied it.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// The pool a builder was given, or one for the URL it was given.
pub(crate) fn pool(pool: Option<Pool>, url: Option<String>) -> Result<Pool> {
    match (pool, url) {
        (Some(pool), _) => Ok(pool),
        (None, Some(url)) => deadpool_redis::Config::from_url(url.as_str())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .map_err(|e| {
                Error::invalid(
                    "redis",
                    format!(
                        "`{}` is not a Redis URL ({e}); use redis://[user:password@]host[:port][/db], \
                         or rediss:// for TLS",
                        redact(&url)
                    ),
                )
            }),
        (None, None) => Err(Error::invalid(
            "redis",
            "no Redis given; call .redis(url) or .pool(pool)",
        )),
    }
}

/// How errors and logs name the Redis a builder was given: its URL without
/// the password, or the pool (which takes precedence).
pub(crate) fn target(pool: Option<&Pool>, url: Option<&str>) -> String {
    match (pool, url) {
        (Some(_), _) => "the pool given to the builder".to_owned(),
        (None, Some(url)) => redact(url),
        (None, None) => "no redis given".to_owned(),
    }
}

/// `url` with its password replaced by `***`: in the user info
/// (`redis://user:***@host/`) and in a `pass` or `password` query parameter
/// (`redis+unix:///run/redis.sock?pass=***`). Errors and logs show URLs only
/// through it.
pub(crate) fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let mut out = String::with_capacity(url.len());
    if let Some(scheme) = scheme {
        out.push_str(scheme);
        out.push_str("://");
    }
    // The last `@`, not the first: a password with an unescaped `@` must
    // not leave its tail in the host part.
    let rest = match rest.rfind('@') {
        Some(at) => {
            let user = &rest[..at];
            match user.split_once(':') {
                Some((name, _password)) => {
                    out.push_str(name);
                    out.push_str(":***");
                }
                None => out.push_str(user),
            }
            out.push('@');
            &rest[at + 1..]
        }
        None => rest,
    };
    match rest.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((key @ ("pass" | "password"), _)) => {
                        out.push_str(key);
                        out.push_str("=***");
                    }
                    _ => out.push_str(pair),
                }
            }
        }
        None => out.push_str(rest),
    }
    out
}

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

/// A multiplexed connection taken from `pool` on first use.
#[derive(Debug)]
pub(crate) struct SharedConnection {
    pool: Pool,
    // A std mutex: it is only held to clone or replace the handle, never
    // across an await.
    cached: Mutex<Option<MultiplexedConnection>>,
    /// Held while a connection is taken from the pool: callers that find
    /// none at once (every fetch loop at start, say) would each take one.
    connecting: tokio::sync::Mutex<()>,
    /// Connections are made anew by the pool's manager, never taken from
    /// its idle ones (see [`SharedConnection::made_here`]).
    made_here: bool,
}

impl SharedConnection {
    /// Takes its connection out of `pool`.
    pub(crate) fn new(pool: Pool) -> Self {
        SharedConnection {
            pool,
            cached: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            made_here: false,
        }
    }

    /// Makes its connection with `pool`'s settings on the runtime that
    /// first uses it: a multiplexed connection's I/O runs in a task on the
    /// runtime that made it, and one taken from the pool may have been made
    /// on another (the indexer's rounds have a runtime of their own).
    pub(crate) fn made_here(pool: Pool) -> Self {
        SharedConnection {
            made_here: true,
            ..SharedConnection::new(pool)
        }
    }

    /// The connection (a cheap clone of the shared handle).
    pub(crate) async fn get(&self) -> Result<MultiplexedConnection> {
        if let Some(conn) = self.lock().as_ref() {
            return Ok(conn.clone());
        }
        let _connecting = self.connecting.lock().await;
        if let Some(conn) = self.lock().as_ref() {
            return Ok(conn.clone());
        }
        // Taken out of the pool for good: a connection left in the pool
        // could be handed to a blocking reader, and a blocked read on a
        // multiplexed connection stalls every command on its clones.
        let mut conn = if self.made_here {
            use deadpool::managed::Manager as _;
            self.pool.manager().create().await?
        } else {
            deadpool_redis::Connection::take(self.pool.get().await?)
        };
        conn.set_response_timeout(RESPONSE_TIMEOUT);
        *self.lock() = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets the connection after an error: the next `get` takes a fresh
    /// one from the pool.
    pub(crate) fn reset(&self) {
        *self.lock() = None;
    }

    /// The pool behind it.
    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Runs `cmd`, replacing the connection after an error.
    pub(crate) async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        let mut conn = self.get().await?;
        let reply: Result<T, RedisError> = cmd.query_async(&mut conn).await;
        Ok(reply.inspect_err(|e| self.reset_after(e))?)
    }

    /// Runs `cmd`, whose reply is never an error nested in data (a stream
    /// read's), replacing the connection after an error. Only an error
    /// reply itself is an error here: `query` walks and rebuilds the whole
    /// reply looking for nested ones, about 5 % of the consumer's CPU when
    /// it was used for reads.
    pub(crate) async fn query_flat<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        let mut conn = self.get().await?;
        let reply = match conn.send_packed_command(cmd).await {
            Ok(Value::ServerError(e)) => Err(RedisError::from(e)),
            Ok(value) => T::from_redis_value(value).map_err(RedisError::from),
            Err(e) => Err(e),
        };
        Ok(reply.inspect_err(|e| self.reset_after(e))?)
    }

    /// Runs `pipe` in one round trip, replacing the connection after an error.
    pub(crate) async fn query_pipe<T: FromRedisValue>(&self, pipe: &Pipeline) -> Result<T> {
        let mut conn = self.get().await?;
        let reply: Result<T, RedisError> = pipe.query_async(&mut conn).await;
        Ok(reply.inspect_err(|e| self.reset_after(e))?)
    }

    /// Runs a script, replacing the connection after an error.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
    ) -> Result<T> {
        let mut conn = self.get().await?;
        let reply: Result<T, RedisError> = script.invoke_async(&mut conn).await;
        Ok(reply.inspect_err(|e| self.reset_after(e))?)
    }

    /// Replaces the connection after `error` if it may be broken; an error
    /// reply from Redis (a BUSYGROUP, a script error) leaves it in use.
    pub(crate) fn reset_after(&self, error: &RedisError) {
        if error.is_io_error()
            || error.is_connection_dropped()
            || error.is_timeout()
            || error.is_unrecoverable_error()
        {
            self.reset();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.cached.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_passwords_and_keeps_the_rest() {
        let cases = [
            (
                "redis://:s3cret@127.0.0.1:6390/",
                "redis://:***@127.0.0.1:6390/",
            ),
            (
                "rediss://app:s3cret@db.internal/2",
                "rediss://app:***@db.internal/2",
            ),
            // An unescaped `@` in the password.
            ("redis://app:s3@cret@db/", "redis://app:***@db/"),
            ("redis://app@db/", "redis://app@db/"),
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            (
                "redis+unix:///run/redis.sock?user=app&pass=s3cret&db=1",
                "redis+unix:///run/redis.sock?user=app&pass=***&db=1",
            ),
            (
                "redis://db/?password=s3cret&protocol=resp3",
                "redis://db/?password=***&protocol=resp3",
            ),
            ("app:s3cret@db:6379", "app:***@db:6379"),
        ];
        for (url, redacted) in cases {
            assert_eq!(redact(url), redacted, "{url}");
            assert!(!redact(url).contains("s3"), "{url}");
        }
    }

    #[test]
    fn a_malformed_url_is_refused_without_its_password() {
        let err = pool(None, Some("redis//:s3cret@db".to_owned())).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("invalid setting `redis`"), "{msg}");
        assert!(msg.contains(":***@db"), "{msg}");
        assert!(!msg.contains("s3cret"), "{msg}");
    }

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
