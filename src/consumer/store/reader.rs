//! Reading partitions, and the parse of raw stream entries into
//! [`Fetched`] ones, at this boundary, so the rest of the consumer never
//! sees a Redis reply.
//!
//! Two kinds of read (docs/design.md §6): a partition with entries waiting
//! reads them with non-blocking `XREADGROUP`s on the instance's shared
//! connections, many partitions' reads in flight at once; the partitions
//! read out wait together in one blocking `XREADGROUP` over all their
//! streams, on a connection of its own ([`BlockingReads`]), because a
//! blocking command stalls every other command on its connection.

use std::time::Duration;

use deadpool_redis::redis::{self, aio::MultiplexedConnection};

use super::reply::{RawEntry, Streams};
use super::{Fields, PartitionStore};
use crate::connection::{Backend, Conn, Servers, SharedConnection, cluster};
use crate::entry::{Entry, Unrunnable};
use crate::error::{Error, Result};
use crate::keys;

/// An entry as read from a partition.
#[derive(Debug)]
pub(crate) struct Fetched {
    /// Its stream id.
    pub(crate) id: String,
    /// Its place in the batch that runs it (the batch sets it): where the
    /// batch finds what it keeps per entry without reading the stream id,
    /// which by then is often out of the cache (a lookup by the id was a
    /// cache miss per task, about 0.2 µs, in a profile of a tracked
    /// consume).
    pub(crate) place: usize,
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
    pub(crate) fn parse(raw: RawEntry, max_bytes: usize) -> Fetched {
        let entry = Entry::read(raw.fields, max_bytes).map_err(|(why, fields)| Unreadable {
            why,
            fields: fields.into_named(),
        });
        Fetched {
            id: raw.id,
            place: 0,
            entry,
        }
    }
}

impl PartitionStore {
    /// Reads up to `count` of the partition's entries after `from` for this
    /// instance, never waiting: `>` for new ones, or an id to re-read its
    /// own pending list from. On `conn`, a shared connection: many such
    /// reads of many partitions are in flight on it at once.
    pub(crate) async fn read(
        &self,
        conn: &SharedConnection,
        from: &str,
        count: usize,
    ) -> Result<Vec<Fetched>> {
        let mut cmd = read_group(&self.consumer, count);
        cmd.arg("STREAMS").arg(&self.stream).arg(from);
        let Streams(streams) = conn.query_flat(&cmd).await?;
        Ok(streams
            .into_iter()
            .flat_map(|(_, entries)| entries)
            .map(|raw| Fetched::parse(raw, self.max_entry_bytes))
            .collect())
    }
}

/// The connection of an instance's blocking read of its idle partitions,
/// and its id on the server (to unblock the read, or drop the client).
pub(crate) struct BlockingReads {
    conn: MultiplexedConnection,
    client_id: u64,
    /// On a Cluster, the node it is connected to.
    node: Option<(String, u16)>,
}

impl BlockingReads {
    /// Takes a connection out of `pool` for reads that block up to
    /// `block`. (Out of the pool for good: the pool's recycling must not
    /// hand a connection with a blocked read to anyone else.) Its response
    /// timeout is above the block time: the client gives up on a reply
    /// after 500 ms by default, while the server may still deliver into
    /// the pending list.
    ///
    /// On a Cluster, the connection goes to the master of `slot`, as the
    /// slot map `shared` reads says (a read there that finds the slot
    /// moved fails with `MOVED`, and the reader connects anew).
    pub(crate) async fn connect(
        backend: &Backend,
        shared: &SharedConnection,
        slot: u16,
        block: Duration,
    ) -> Result<BlockingReads> {
        let timeout = block + Duration::from_secs(5);
        let (mut conn, node) = match &backend.servers {
            Servers::Node(pool) => {
                let mut conn = deadpool_redis::Connection::take(pool.get().await?);
                conn.set_response_timeout(timeout);
                (conn, None)
            }
            // The master as the sentinels name it now: a reader whose read
            // failed (its master demoted, killed or cut off) finds the
            // promoted one here.
            Servers::Sentinel(sentinel) => (sentinel.connect(timeout).await?, None),
            Servers::Cluster(nodes) => {
                let Conn::Cluster(map, _) = shared.get().await? else {
                    unreachable!("a Cluster's shared connection is a Cluster connection");
                };
                let (host, port) = cluster::master_of(&map, slot).await?.ok_or_else(|| {
                    Error::Runtime(format!("no master of the Redis Cluster serves slot {slot}"))
                })?;
                let conn = nodes.node(&host, port, timeout).await?;
                (conn, Some((host, port)))
            }
        };
        let client_id: u64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut conn)
            .await?;
        Ok(BlockingReads {
            conn,
            client_id,
            node,
        })
    }

    /// The connection's id on the server.
    pub(crate) fn client_id(&self) -> u64 {
        self.client_id
    }

    /// On a Cluster, the node the connection goes to (where an unblock
    /// must go).
    pub(crate) fn node(&self) -> Option<(&str, u16)> {
        self.node
            .as_ref()
            .map(|(host, port)| (host.as_str(), *port))
    }

    /// Reads new entries (`>`) of every partition in `stores`, up to
    /// `count` each, waiting up to `block` (never 0, which would wait
    /// forever) until one of them has any; the entries by the index of
    /// their partition in `stores`. Every store is this instance's, so
    /// one consumer name reads them all.
    pub(crate) async fn read(
        &mut self,
        stores: &[&PartitionStore],
        count: usize,
        block: Duration,
    ) -> Result<Vec<(usize, Vec<Fetched>)>> {
        let Some(first) = stores.first() else {
            return Ok(Vec::new());
        };
        let mut cmd = read_group(&first.consumer, count);
        cmd.arg("BLOCK")
            .arg(block.as_millis().max(1) as u64)
            .arg("STREAMS");
        for store in stores {
            cmd.arg(&store.stream);
        }
        for _ in stores {
            cmd.arg(">");
        }
        let Streams(streams) = cmd.query_async(&mut self.conn).await?;
        Ok(streams
            .into_iter()
            .filter_map(|(key, entries)| {
                let at = stores.iter().position(|s| s.stream == key)?;
                let max = stores[at].max_entry_bytes;
                let fetched = entries
                    .into_iter()
                    .map(|raw| Fetched::parse(raw, max))
                    .collect();
                Some((at, fetched))
            })
            .collect())
    }
}

/// `XREADGROUP GROUP <group> <consumer> COUNT <count>`, to go on with the
/// options and streams.
fn read_group(consumer: &str, count: usize) -> redis::Cmd {
    let mut cmd = redis::cmd("XREADGROUP");
    cmd.arg("GROUP")
        .arg(keys::GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(count);
    cmd
}

/// Ends the blocked read of client `client_id` on the server (it returns
/// what it has, maybe nothing); `conn` must not be the reader's own. On a
/// Cluster, it goes to `node`, the reader's. False when the client was not
/// blocked (its read has not reached Redis yet, or has returned already).
pub(crate) async fn unblock(
    conn: &SharedConnection,
    client_id: u64,
    node: Option<(&str, u16)>,
) -> Result<bool> {
    let mut unblock = redis::cmd("CLIENT");
    unblock.arg("UNBLOCK").arg(client_id);
    conn.query_on::<u32>(&unblock, node).await.map(|n| n == 1)
}

/// Whether a read failed because the consumer group is gone.
pub(crate) fn is_nogroup(e: &Error) -> bool {
    matches!(e, Error::Redis(e) if e.code() == Some("NOGROUP"))
}
