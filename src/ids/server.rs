//! One of the servers of [`MajorityIds`](super::MajorityIds): its
//! connection, made on first use and again after an error, checked for
//! durability each time it is made; and the commands a sequence sends it.
//!
//! Not [`SharedConnection`](crate::connection::SharedConnection): that one
//! is made from a pool and knows nothing of a check that must pass before
//! a new connection's first vote (a server restarted with other settings
//! comes back on a new connection).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self, AsyncConnectionConfig, Client, RedisError, Script};

use super::votes::{ServerState, Write};
use crate::connection::{self, Tls, redact};
use crate::error::{Error, Result};

/// How long connecting to a server may take. Short: a vote that is late
/// only slows the callers when the others cannot make a majority.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one command may wait for its reply.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

static ADVANCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../scripts/ids_advance.lua")));

/// Why a server cannot vote now.
#[derive(Debug)]
pub(super) enum Failure {
    /// Redis, the network or the client failed.
    Down(Error),
    /// It may lose what it acknowledges, or that could not be checked.
    Unsafe(String),
}

impl Failure {
    /// As a vote's state: unreachable if trying again may work, else
    /// refused.
    pub(super) fn state(&self) -> ServerState {
        match self {
            Failure::Down(e) if e.is_transient() => ServerState::Unreachable(e.to_string()),
            Failure::Down(e) => ServerState::Refused(e.to_string()),
            Failure::Unsafe(reason) => ServerState::Refused(reason.clone()),
        }
    }
}

/// One server, and the multiplexed connection its commands share.
#[derive(Debug)]
pub(super) struct Server {
    /// Its URL without the password, for errors and logs.
    name: String,
    client: Client,
    /// Whether each new connection checks `appendonly` and `appendfsync`
    /// before its first command.
    check: bool,
    // Held only to clone or replace the handle, never across an await.
    cached: Mutex<Option<MultiplexedConnection>>,
    /// Held while a connection is made, so concurrent callers make one.
    connecting: tokio::sync::Mutex<()>,
}

impl Server {
    /// The server at `url`; connects nothing yet. A URL that does not
    /// parse is an invalid `servers` setting.
    pub(super) fn new(url: &str, tls: Option<&Tls>, check: bool) -> Result<Server> {
        Ok(Server {
            name: redact(url),
            client: connection::client(url, tls, "servers")?,
            check,
            cached: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
        })
    }

    /// Its URL without the password.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Where it is (`host:port` and database), to refuse one server given
    /// twice.
    pub(super) fn address(&self) -> String {
        let info = self.client.get_connection_info();
        format!("{}/{}", info.addr(), info.redis_settings().db())
    }

    /// The connection, made (and checked) if there is none; and whether
    /// it was made now.
    pub(super) async fn connection(&self) -> Result<(MultiplexedConnection, bool), Failure> {
        if let Some(conn) = self.lock().as_ref() {
            return Ok((conn.clone(), false));
        }
        let _connecting = self.connecting.lock().await;
        if let Some(conn) = self.lock().as_ref() {
            return Ok((conn.clone(), false));
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let mut conn = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| Failure::Down(e.into()))?;
        if self.check {
            durable(&mut conn).await?;
        }
        *self.lock() = Some(conn.clone());
        Ok((conn, true))
    }

    /// Runs `op` on the connection. A connection kept from before that
    /// turns out broken (the server restarted since) is replaced and `op`
    /// run once more at once: else every restart would cost each caller a
    /// failed vote. Sending a command twice is safe here: none of them
    /// takes an ID for a caller by itself.
    async fn run<T, F, Fut>(&self, op: F) -> Result<T, ServerState>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let mut again = true;
        loop {
            let (conn, made_now) = self.connection().await.map_err(|f| f.state())?;
            match op(conn).await {
                Ok(reply) => return Ok(reply),
                Err(e) if again && !made_now && connection::is_broken(&e) => {
                    *self.lock() = None;
                    again = false;
                }
                Err(e) => return Err(self.failed(e)),
            }
        }
    }

    /// Its copy of the sequence at `key`.
    pub(super) async fn read(&self, key: &str) -> ServerState {
        let reply = self
            .run(|mut conn| async move {
                redis::cmd("GET")
                    .arg(key)
                    .query_async::<Option<String>>(&mut conn)
                    .await
            })
            .await;
        match reply {
            Ok(Some(value)) => match parse(&value) {
                Some(value) => ServerState::Holds(value),
                None => not_an_id(&value),
            },
            Ok(None) => ServerState::NeedsRepair,
            Err(state) => state,
        }
    }

    /// Raises its copy of the sequence at `key` to `id` if it is lower;
    /// with `repair`, creates it at `id` if it is missing.
    pub(super) async fn advance(&self, key: &str, id: u64, repair: bool) -> Write {
        let mode = if repair { "repair" } else { "next" };
        let id = &id.to_string();
        let reply = self
            .run(|mut conn| async move {
                ADVANCE
                    .key(key)
                    .arg(id)
                    .arg(mode)
                    .invoke_async::<Vec<String>>(&mut conn)
                    .await
            })
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(state) => return Write::NoVote(state),
        };
        match reply
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .as_slice()
        {
            ["1"] => Write::Set,
            ["0"] => Write::NoVote(ServerState::NeedsRepair),
            ["2", value] => {
                parse(value).map_or_else(|| Write::NoVote(not_an_id(value)), Write::Higher)
            }
            other => Write::NoVote(ServerState::Refused(format!(
                "unexpected reply {other:?} from the ids script"
            ))),
        }
    }

    /// Creates the sequence at `key` with `value` unless it exists:
    /// whether it was created.
    pub(super) async fn create(&self, key: &str, value: u64) -> Result<bool, ServerState> {
        let value = &value.to_string();
        self.run(|mut conn| async move {
            redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .query_async::<Option<String>>(&mut conn)
                .await
        })
        .await
        .map(|set| set.is_some())
    }

    /// The state of a command that failed, replacing the connection if it
    /// may be broken.
    fn failed(&self, e: RedisError) -> ServerState {
        if connection::is_broken(&e) {
            *self.lock() = None;
        }
        Failure::Down(e.into()).state()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<MultiplexedConnection>> {
        self.cached.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A server whose key holds `value`, which no ids script wrote.
fn not_an_id(value: &str) -> ServerState {
    ServerState::Refused(format!("its key holds `{value}`, not an ID"))
}

/// A stored value, if it is an ID as the script writes them: decimal,
/// without sign or leading zeros (the script compares them as strings).
fn parse(value: &str) -> Option<u64> {
    value
        .parse::<u64>()
        .ok()
        .filter(|parsed| parsed.to_string() == value)
}

/// A `CONFIG GET` reply: parameter -> value.
type Config = HashMap<String, String>;

/// Checks that the server keeps every write it acknowledged across a
/// crash: `appendonly yes` and `appendfsync always` (docs/design.md §13).
async fn durable(conn: &mut MultiplexedConnection) -> Result<(), Failure> {
    let mut pipe = redis::pipe();
    pipe.cmd("CONFIG")
        .arg("GET")
        .arg("appendonly")
        .cmd("CONFIG")
        .arg("GET")
        .arg("appendfsync");
    let reply: Result<(Config, Config), RedisError> = pipe.query_async(conn).await;
    let (appendonly, appendfsync) = match reply {
        Ok(replies) => replies,
        Err(e) if e.code() == Some("NOPERM") => {
            return Err(Failure::Unsafe(
                "the redis user may not run CONFIG GET (ACL), so its persistence cannot \
                 be checked; grant it +config|get"
                    .to_owned(),
            ));
        }
        Err(e) => {
            let e = Error::from(e);
            if e.is_transient() {
                return Err(Failure::Down(e));
            }
            return Err(Failure::Unsafe(format!(
                "its persistence cannot be checked (CONFIG GET failed: {e})"
            )));
        }
    };
    let appendonly = appendonly.get("appendonly").map_or("?", String::as_str);
    let appendfsync = appendfsync.get("appendfsync").map_or("?", String::as_str);
    if appendonly == "yes" && appendfsync == "always" {
        Ok(())
    } else {
        Err(Failure::Unsafe(format!(
            "it runs with appendonly {appendonly} and appendfsync {appendfsync}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_canonical_decimals_are_ids() {
        assert_eq!(parse("0"), Some(0));
        assert_eq!(parse("18446744073709551615"), Some(u64::MAX));
        for not_an_id in ["", "007", "+5", "-1", "1.0", "18446744073709551616", "x"] {
            assert_eq!(parse(not_an_id), None, "{not_an_id}");
        }
    }
}
