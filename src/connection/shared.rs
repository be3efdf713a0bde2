//! One multiplexed connection, shared by the parts of an instance that
//! send many short commands, and replaced after an error.

use std::sync::Mutex;

use deadpool_redis::redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, Script, ScriptInvocation,
    ServerErrorKind, Value,
};

use super::{Backend, Conn, cluster};
use crate::error::Result;

/// A multiplexed connection to the service's Redis, made on first use.
#[derive(Debug)]
pub(crate) struct SharedConnection {
    backend: Backend,
    // A std mutex: it is only held to clone or replace the handle, never
    // across an await.
    cached: Mutex<Option<Conn>>,
    /// Held while a connection is made: callers that find none at once
    /// (every fetch loop at start, say) would each make one.
    connecting: tokio::sync::Mutex<()>,
    /// See [`SharedConnection::made_here`].
    made_here: bool,
}

impl SharedConnection {
    /// Takes its connection out of the pool of `backend` (or, on a
    /// Cluster, makes one to its nodes).
    pub(crate) fn new(backend: impl Into<Backend>) -> Self {
        SharedConnection {
            backend: backend.into(),
            cached: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            made_here: false,
        }
    }

    /// Makes its connection on the runtime that first uses it, never
    /// taking one of the pool's: a multiplexed connection's I/O runs in a
    /// task on the runtime that made it, and one taken from the pool may
    /// have been made on another (the indexer's rounds have a runtime of
    /// their own).
    pub(crate) fn made_here(backend: impl Into<Backend>) -> Self {
        SharedConnection {
            made_here: true,
            ..SharedConnection::new(backend)
        }
    }

    /// The connection (a cheap clone of the shared handle).
    pub(crate) async fn get(&self) -> Result<Conn> {
        if let Some(conn) = self.lock().as_ref() {
            return Ok(conn.clone());
        }
        let _connecting = self.connecting.lock().await;
        if let Some(conn) = self.lock().as_ref() {
            return Ok(conn.clone());
        }
        let conn = self.backend.connect(self.made_here).await?;
        *self.lock() = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets the connection after an error: the next `get` makes a new
    /// one.
    pub(crate) fn reset(&self) {
        *self.lock() = None;
    }

    /// Where its Redis is.
    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
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
        let reply = match self.get().await? {
            Conn::Node(mut conn) => conn.send_packed_command(cmd).await,
            Conn::Cluster(mut conn, _) => {
                use deadpool_redis::redis::aio::ConnectionLike as _;
                conn.req_packed_command(cmd).await
            }
        };
        let reply = match reply {
            Ok(Value::ServerError(e)) => Err(RedisError::from(e)),
            Ok(value) => T::from_redis_value(value).map_err(RedisError::from),
            Err(e) => Err(e),
        };
        Ok(reply.inspect_err(|e| self.reset_after(e))?)
    }

    /// Runs `pipe` in one round trip (on a Cluster, one per slot: see
    /// [`cluster::query_pipe`]), replacing the connection after an error.
    /// The first error reply fails it all.
    pub(crate) async fn query_pipe<T: FromRedisValue>(&self, pipe: &Pipeline) -> Result<T> {
        let reply = self.get().await?.query_pipe(pipe).await;
        Ok(reply.inspect_err(|e| self.reset_after(e))?)
    }

    /// Runs `pipe` like [`query_pipe`](Self::query_pipe), with each
    /// command's error reply in its place.
    pub(crate) async fn query_pipe_each<T: FromRedisValue>(
        &self,
        pipe: &mut Pipeline,
    ) -> Result<T> {
        let reply = self.get().await?.query_pipe_each(pipe).await;
        Ok(reply.inspect_err(|e| self.reset_after(e))?)
    }

    /// Runs `cmd`, which has no key, on the node of `key` (on one server,
    /// there): the clock the indexer's rounds read is the one of the node
    /// that holds the service's keys.
    pub(crate) async fn query_at<T: FromRedisValue>(&self, cmd: &Cmd, key: &str) -> Result<T> {
        let reply: Result<T, RedisError> = match self.get().await? {
            Conn::Node(mut conn) => cmd.query_async(&mut conn).await,
            Conn::Cluster(conn, _) => cluster::query_at(&conn, cmd, key)
                .await
                .and_then(|value| T::from_redis_value(value).map_err(RedisError::from)),
        };
        Ok(reply.inspect_err(|e| self.reset_after(e))?)
    }

    /// Runs `cmd`, which has no key, on the Cluster node `node`; on one
    /// server, or without a node, as [`query`](Self::query) does.
    pub(crate) async fn query_on<T: FromRedisValue>(
        &self,
        cmd: &Cmd,
        node: Option<(&str, u16)>,
    ) -> Result<T> {
        let reply: Result<T, RedisError> = match (self.get().await?, node) {
            (Conn::Cluster(conn, _), Some((host, port))) => {
                cluster::query_on(&conn, cmd, host, port)
                    .await
                    .and_then(|value| T::from_redis_value(value).map_err(RedisError::from))
            }
            (mut conn, _) => cmd.query_async(&mut conn).await,
        };
        Ok(reply.inspect_err(|e| self.reset_after(e))?)
    }

    /// Runs `cmd`, which has no key, on every master of a Cluster: each
    /// reply by the node's address. On one server, its reply, with an
    /// empty address.
    pub(crate) async fn query_masters(&self, cmd: &Cmd) -> Result<Vec<(String, Value)>> {
        let reply = match self.get().await? {
            Conn::Cluster(conn, _) => cluster::query_masters(&conn, cmd).await,
            Conn::Node(mut conn) => cmd
                .query_async::<Value>(&mut conn)
                .await
                .map(|value| vec![(String::new(), value)]),
        };
        Ok(reply.inspect_err(|e| self.reset_after(e))?)
    }

    /// The nodes that hold keys: on a Cluster, each master's address; on
    /// one server, `None` (for [`query_on`](Self::query_on)).
    pub(crate) async fn key_nodes(&self) -> Result<Vec<Option<(String, u16)>>> {
        let reply = match self.get().await? {
            Conn::Cluster(conn, _) => cluster::masters(&conn)
                .await
                .map(|masters| masters.into_iter().map(Some).collect()),
            Conn::Node(_) => Ok(vec![None]),
        };
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

    /// Runs `cmd`, an `EVALSHA` of `script` ([`evalsha`]), loading the
    /// script first if Redis no longer knows it (after a restart), and
    /// replacing the connection after an error.
    pub(crate) async fn eval<T: FromRedisValue>(&self, script: &Script, cmd: &Cmd) -> Result<T> {
        let mut conn = self.get().await?;
        let reply: Result<T, RedisError> = match cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                match script.prepare_invoke().load_async(&mut conn).await {
                    Ok(_) => cmd.query_async(&mut conn).await,
                    Err(e) => Err(e),
                }
            }
            reply => reply,
        };
        Ok(reply.inspect_err(|e| self.reset_after(e))?)
    }

    /// Replaces the connection after `error` if it may be broken; an error
    /// reply from Redis (a BUSYGROUP, a script error) leaves it in use.
    pub(crate) fn reset_after(&self, error: &RedisError) {
        if super::is_broken(error) {
            self.reset();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Conn>> {
        self.cached.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The start of an `EVALSHA` of `script` with `keys` keys, its buffers
/// sized for `args` more arguments of about `bytes` bytes in all, to run
/// with [`SharedConnection::eval`] (or in a pipeline, which loads no
/// script by itself). The arguments go straight into the command's one
/// buffer: redis-rs's `ScriptInvocation` keeps each in a buffer of its
/// own and then copies them all, an allocation per argument, which a
/// tracked batch's start and ack paid for every task (BENCHMARKS.md,
/// "Task tracking").
pub(crate) fn evalsha(script: &Script, keys: usize, args: usize, bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(3 + keys + args, 64 + bytes);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}
