//! Writes a failover must not lose, and the `WAIT` that confirms them
//! (`wait_for_replicas`, docs/design.md §8).
//!
//! `WAIT n timeout` waits until `n` replicas have everything up to the
//! last write *its own connection* made (Redis keeps that offset per
//! client), or the timeout; on a connection that wrote nothing it answers
//! at once. So it goes on the very connection that carried the writes,
//! after them:
//! - on one server, in the same pipeline, on the shared multiplexed
//!   connection. Other callers' commands may come between on it; their
//!   writes only raise the offset `WAIT` waits for, never lower it below
//!   ours, so it waits for at least our writes;
//! - on a Cluster, at the end of each per-node pipeline of peerq's own
//!   ([`pipeline::write_pipe`]), on the node that took the commands, a
//!   `MOVED` or `ASK` one included; a single write or script goes that way
//!   too, not through redis-rs's cluster connection, whose routing of a
//!   keyless `WAIT` need not pick the connection (or, during a slot move,
//!   the node) the write went on;
//! - a batch's parts, sent one after another on one connection, wait once
//!   at the end, on that connection (one server) or on every node
//!   connection that carried a part ([`Carriers`]).
//!
//! Without `wait_for_replicas`, each write runs as [`SharedConnection`]'s
//! plain commands do.

use deadpool_redis::redis::{
    self, Cmd, FromRedisValue, Pipeline, RedisError, RedisResult, ScriptInvocation, Value,
};

use super::pipeline::{self, Carriers, counted};
use super::{Conn, SharedConnection, Wait};
use crate::error::Result;

/// The replies of writes sent with a `WAIT` after them, and what each
/// `WAIT` counted.
#[derive(Debug)]
pub(crate) struct Waited {
    /// Each command's reply, an error reply in its place.
    replies: Vec<Value>,
    /// For each command, the replicas the `WAIT` after it counted; `None`
    /// without a `WAIT`, or for a command that never ran.
    replicas: Vec<Option<u32>>,
    wait: Option<Wait>,
}

impl Waited {
    /// Each command's reply, an error reply as a [`Value::ServerError`].
    pub(crate) fn replies(&self) -> &[Value] {
        &self.replies
    }

    /// `Ok` unless command `i` ran and fewer replicas than asked for
    /// confirmed it: then [`crate::Error::NotReplicated`].
    pub(crate) fn confirmed(&self, i: usize) -> Result<()> {
        match self.wait {
            Some(wait) => wait.confirmed(self.replicas.get(i).copied().flatten()),
            None => Ok(()),
        }
    }

    /// The reply of the first (the only) command: its error reply as an
    /// error; else, once confirmed, its value.
    pub(crate) fn reply<T: FromRedisValue>(mut self) -> Result<T> {
        let value = match self.replies.is_empty() {
            true => Value::Nil,
            false => self.replies.swap_remove(0),
        };
        let value = value.extract_error()?;
        self.confirmed(0)?;
        Ok(T::from_redis_value(value).map_err(RedisError::from)?)
    }
}

/// `WAIT <replicas> <timeout in ms>`.
fn wait_cmd(wait: Wait) -> Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(wait.replicas).arg(wait.timeout.as_millis() as u64);
    cmd
}

fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

impl Conn {
    /// Runs `pipe`, writes and no transaction, each reply in its place;
    /// with `wait`, a `WAIT` follows its commands in the same pipeline, on
    /// each connection that carried any (see the module's doc).
    pub(crate) async fn write_pipe(
        &mut self,
        pipe: &mut Pipeline,
        wait: Option<Wait>,
    ) -> RedisResult<Waited> {
        pipe.ignore_errors();
        let (replies, replicas) = match (self, wait) {
            (Conn::Node(conn), None) => {
                let replies: Vec<Value> = pipe.query_async(conn).await?;
                let replicas = vec![None; replies.len()];
                (replies, replicas)
            }
            (Conn::Node(conn), Some(wait)) => {
                let mut waited = pipe.clone();
                waited.add_command(wait_cmd(wait));
                let mut replies: Vec<Value> = waited.query_async(conn).await?;
                let count = counted(replies.pop().unwrap_or(Value::Nil))?;
                let replicas = vec![Some(count); replies.len()];
                (replies, replicas)
            }
            (Conn::Cluster(conn, cluster), wait) => {
                let wait = wait.map(wait_cmd);
                pipeline::write_pipe(conn, &cluster.nodes, pipe, wait.as_ref(), None).await?
            }
        };
        Ok(Waited {
            replies,
            replicas,
            wait,
        })
    }

    /// Runs `script`, a write, as [`write_pipe`](Self::write_pipe) does
    /// (loading it first if Redis does not know it); without `wait`, as
    /// redis-rs invokes it.
    pub(crate) async fn write_script(
        &mut self,
        script: &ScriptInvocation<'_>,
        wait: Option<Wait>,
    ) -> RedisResult<Waited> {
        if wait.is_none() {
            let reply: Value = script.invoke_async(self).await?;
            return Ok(Waited {
                replies: vec![reply],
                replicas: vec![None],
                wait,
            });
        }
        let mut pipe = redis::pipe();
        pipe.invoke_script(script);
        let waited = self.write_pipe(&mut pipe, wait).await?;
        if !waited.replies.first().is_some_and(is_noscript) {
            return Ok(waited);
        }
        // Redis restarted and forgot it: pipelines do not load scripts.
        script.load_async(self).await?;
        self.write_pipe(&mut pipe, wait).await
    }

    /// Runs `pipe`, one part of a batch of writes, and returns each reply
    /// in its place, error replies included (a script's says what it did,
    /// or `NOSCRIPT`; an `XADD` into a partition a reshard sealed, its
    /// refusal); on a Cluster, records in `carriers` the node connections
    /// that carried it, for [`wait_after`](Self::wait_after).
    pub(crate) async fn write_part_each(
        &mut self,
        pipe: &mut Pipeline,
        carriers: &Carriers,
    ) -> RedisResult<Vec<Value>> {
        pipe.ignore_errors();
        match self {
            Conn::Node(conn) => pipe.query_async(conn).await,
            Conn::Cluster(conn, cluster) => {
                let (replies, _) =
                    pipeline::write_pipe(conn, &cluster.nodes, pipe, None, Some(carriers)).await?;
                Ok(replies)
            }
        }
    }

    /// A `WAIT` for `wait`'s replicas after parts sent with
    /// [`write_part_each`](Self::write_part_each), on this connection (one server),
    /// or on each connection in `carriers` (a Cluster): the fewest replicas
    /// one counted (`None`: nothing carried a part).
    pub(crate) async fn wait_after(
        &mut self,
        carriers: &Carriers,
        wait: Wait,
    ) -> RedisResult<Option<u32>> {
        let cmd = wait_cmd(wait);
        match self {
            Conn::Node(conn) => Ok(Some(counted(cmd.query_async(conn).await?)?)),
            Conn::Cluster(..) => carriers.wait(&cmd).await,
        }
    }
}

impl SharedConnection {
    /// `wait_for_replicas`, if set.
    pub(crate) fn wait(&self) -> Option<Wait> {
        self.backend().wait
    }

    /// Runs `cmd`, a write a failover must not lose: with
    /// `wait_for_replicas`, [`Error::NotReplicated`] unless enough
    /// replicas confirmed it (see the module's doc); else as
    /// [`query`](Self::query).
    pub(crate) async fn write<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        if self.wait().is_none() {
            return self.query(cmd).await;
        }
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone());
        self.write_pipe(&mut pipe).await?.reply()
    }

    /// Runs `script`, a write a failover must not lose, as
    /// [`write`](Self::write) runs a command; else as
    /// [`invoke`](Self::invoke).
    pub(crate) async fn write_script<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
    ) -> Result<T> {
        let Some(wait) = self.wait() else {
            return self.invoke(script).await;
        };
        let waited = self.get().await?.write_script(script, Some(wait)).await;
        waited.inspect_err(|e| self.reset_after(e))?.reply()
    }

    /// Runs `pipe`, writes a failover must not lose, each reply in its
    /// place, with what confirmed them (see [`Conn::write_pipe`]).
    pub(crate) async fn write_pipe(&self, pipe: &mut Pipeline) -> Result<Waited> {
        let waited = self.get().await?.write_pipe(pipe, self.wait()).await;
        Ok(waited.inspect_err(|e| self.reset_after(e))?)
    }
}
