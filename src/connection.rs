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
use deadpool_redis::redis::{Cmd, FromRedisValue, Pipeline, RedisError, ScriptInvocation};

use crate::error::Result;

/// How long a command on a shared connection may wait for its reply. The
/// client's default (500 ms) turns a large pipelined batch into an error
/// although Redis applied it.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// The pool a builder was given, or one for the URL it was given.
pub(crate) fn pool(pool: Option<Pool>, url: Option<String>) -> Result<Pool> {
    match (pool, url) {
        (Some(pool), _) => Ok(pool),
        (None, Some(url)) => Ok(deadpool_redis::Config::from_url(url)
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))?),
        (None, None) => Err(crate::Error::invalid(
            "redis",
            "no Redis given; call .redis(url) or .pool(pool)",
        )),
    }
}

/// A multiplexed connection taken from `pool` on first use.
#[derive(Debug)]
pub(crate) struct SharedConnection {
    pool: Pool,
    // A std mutex: it is only held to clone or replace the handle, never
    // across an await.
    cached: Mutex<Option<MultiplexedConnection>>,
}

impl SharedConnection {
    pub(crate) fn new(pool: Pool) -> Self {
        SharedConnection {
            pool,
            cached: Mutex::new(None),
        }
    }

    /// The connection (a cheap clone of the shared handle).
    pub(crate) async fn get(&self) -> Result<MultiplexedConnection> {
        if let Some(conn) = self.lock().as_ref() {
            return Ok(conn.clone());
        }
        // Taken out of the pool for good: a connection left in the pool
        // could be handed to a blocking reader, and a blocked read on a
        // multiplexed connection stalls every command on its clones.
        let pooled = self.pool.get().await?;
        let mut conn = deadpool_redis::Connection::take(pooled);
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
