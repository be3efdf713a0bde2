//! Reading a partition: the blocking `XREADGROUP` on a connection of its
//! own, and the parse of raw stream entries into [`Fetched`] ones, at this
//! boundary, so the rest of the consumer never sees a Redis reply.
//!
//! A blocking read stalls every other command on its connection, so each
//! worker reads on a connection of its own, taken out of the pool for good
//! and with a response timeout above the block time: the client gives up
//! on a reply after 500 ms by default, while the server may still deliver
//! into the pending list.

use std::time::Duration;

use deadpool_redis::Pool;
use deadpool_redis::redis::streams::{StreamId, StreamReadOptions, StreamReadReply};
use deadpool_redis::redis::{self, AsyncCommands, aio::MultiplexedConnection};

use super::{Fields, PartitionStore};
use crate::connection::SharedConnection;
use crate::error::{Error, Result};
use crate::keys;
use crate::task::{Entry, Unrunnable};

/// An entry as read from a partition.
#[derive(Debug)]
pub(crate) struct Fetched {
    /// Its stream id.
    pub(crate) id: String,
    /// The entry, or why it cannot run.
    pub(crate) entry: std::result::Result<Entry, Unreadable>,
}

/// An entry that cannot be read: too large, or not in the format.
#[derive(Debug)]
pub(crate) struct Unreadable {
    /// Why (the dead letters' reason).
    pub(crate) why: Unrunnable,
    /// Its fields as they are, to dead-letter it unchanged.
    pub(crate) fields: Fields,
}

impl Fetched {
    /// Parses a raw stream entry: at most `max_bytes` large, counted before
    /// anything is parsed, and in the entry format.
    pub(crate) fn parse(raw: StreamId, max_bytes: usize) -> Fetched {
        let entry = Entry::read(&raw.map, max_bytes).map_err(|why| Unreadable {
            why,
            fields: raw
                .map
                .iter()
                .map(|(k, v)| {
                    let value = redis::from_redis_value_ref::<Vec<u8>>(v).unwrap_or_default();
                    (k.clone(), value)
                })
                .collect(),
        });
        Fetched { id: raw.id, entry }
    }
}

/// A worker's own connection for blocking reads, and its id on the server
/// (to unblock a read, or drop the client).
pub(crate) struct Reader {
    conn: MultiplexedConnection,
    client_id: u64,
}

impl Reader {
    /// Takes a connection out of `conn`'s pool for reads that block up to
    /// `block`. (Out of the pool for good: the pool's recycling must not
    /// hand a connection with a blocked read to anyone else.)
    pub(crate) async fn connect(pool: &Pool, block: Duration) -> Result<Reader> {
        let pooled = pool.get().await?;
        let mut conn = deadpool_redis::Connection::take(pooled);
        conn.set_response_timeout(block + Duration::from_secs(5));
        let client_id: u64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut conn)
            .await?;
        Ok(Reader { conn, client_id })
    }

    /// The connection's id on the server.
    pub(crate) fn client_id(&self) -> u64 {
        self.client_id
    }

    /// Reads up to `count` of `store`'s partition entries after `from` for
    /// this instance: `>` for new ones (waiting up to `block`, never 0,
    /// which would wait forever), or an id to re-read its own pending list
    /// from (which never waits).
    pub(crate) async fn read(
        &mut self,
        store: &PartitionStore,
        from: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<Fetched>> {
        let mut opts = StreamReadOptions::default()
            .group(keys::GROUP, &store.consumer)
            .count(count);
        if let Some(block) = block {
            opts = opts.block(block.as_millis().max(1) as usize);
        }
        let reply: Option<StreamReadReply> = self
            .conn
            .xread_options(&[store.stream.as_str()], &[from], &opts)
            .await?;
        Ok(reply
            .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .map(|raw| Fetched::parse(raw, store.max_entry_bytes))
            .collect())
    }
}

/// Ends the blocked read of client `client_id` on the server (it returns
/// what it has, maybe nothing); `conn` must not be the reader's own.
pub(crate) async fn unblock(conn: &SharedConnection, client_id: u64) -> Result<()> {
    let mut unblock = redis::cmd("CLIENT");
    unblock.arg("UNBLOCK").arg(client_id);
    conn.query::<u32>(&unblock).await.map(drop)
}

/// Has Redis drop client `client_id`; returns once it is gone.
pub(crate) async fn kill(conn: &SharedConnection, client_id: u64) -> Result<()> {
    let mut kill = redis::cmd("CLIENT");
    kill.arg("KILL").arg("ID").arg(client_id);
    conn.query::<redis::Value>(&kill).await.map(drop)
}

/// Whether a read failed because the consumer group is gone.
pub(crate) fn is_nogroup(e: &Error) -> bool {
    matches!(e, Error::Redis(e) if e.code() == Some("NOGROUP"))
}
