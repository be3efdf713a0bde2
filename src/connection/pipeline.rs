//! Pipelines on a Redis Cluster: one per master, on connections of peerq's
//! own, following redirections command by command.
//!
//! redis-rs's cluster connection handles a pipeline as a whole: when any
//! reply in it is a redirection it sends the whole pipeline again, to the
//! node named. Commands that had run then run twice: those of other slots
//! in a pipeline over several, and, after an `ASK` (its slot is moving),
//! all but the first even within one slot, since it sends one `ASKING`
//! for the pipeline and `ASKING` admits only the next command (a task
//! enqueued twice during a slot migration, in `tests/cluster/main.rs`). So a
//! pipeline goes here instead: grouped by the master that serves each
//! slot, as the slot map last read says, on a plain connection to that
//! master; a command sent to the wrong node (`MOVED`, `ASK`) or finding
//! the Cluster busy (`TRYAGAIN`, `CLUSTERDOWN`) did not run, and goes again,
//! to where the redirection says (an `ASKING` before each command for an
//! `ASK`) or a little later; after a `MOVED` the map is read again.
//!
//! A pipeline of writes that must reach a replica ([`write_pipe`]) ends
//! each per-node pipeline with a `WAIT`: `WAIT` counts the writes of the
//! connection it comes on, so it must come on the very one that carried
//! them, after them, wherever a redirection sent them (docs/design.md §8).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::cluster_async::ClusterConnection;
use deadpool_redis::redis::{self, Cmd, Pipeline, RedisResult, Value};
use futures_util::future::{join_all, try_join_all};

use super::cluster::{SlotMap, command_slot, slot_map};
use super::node::NodeSettings;

/// How often a command redirected or refused for now is sent again.
const ATTEMPTS: u32 = 6;

/// What the pipelines of one Cluster share: the slot map as last read, and
/// a connection to each master.
pub(crate) struct Nodes {
    /// How a connection to one node is made.
    settings: NodeSettings,
    map: Mutex<Option<Arc<SlotMap>>>,
    conns: Mutex<HashMap<(String, u16), NodeConn>>,
}

/// A connection to one node, as pipelines hold it.
#[derive(Clone)]
pub(crate) struct NodeConn {
    /// Tells it from a connection made to the same address after this one
    /// failed: a `WAIT` on that one would count none of this one's writes.
    id: u64,
    conn: MultiplexedConnection,
}

/// The node connections that carried the commands of Cluster pipelines
/// (each once), for a `WAIT` after them: a batch's parts, sent one after
/// another, wait once at the end ([`wait`](Carriers::wait)).
#[derive(Default)]
pub(crate) struct Carriers(Mutex<Vec<NodeConn>>);

impl Carriers {
    fn add(&self, node: &NodeConn) {
        let mut nodes = lock(&self.0);
        if !nodes.iter().any(|known| known.id == node.id) {
            nodes.push(node.clone());
        }
    }

    /// Sends `wait` (a `WAIT`) on each connection, all at once: the fewest
    /// replicas one counted, `None` when none carried anything.
    pub(crate) async fn wait(&self, wait: &Cmd) -> RedisResult<Option<u32>> {
        let nodes = lock(&self.0).clone();
        let waits = nodes.into_iter().map(|node| async move {
            let reply: Value = wait.query_async(&mut node.conn.clone()).await?;
            counted(reply)
        });
        Ok(try_join_all(waits).await?.into_iter().min())
    }
}

/// The replicas a `WAIT`'s reply counted.
pub(super) fn counted(reply: Value) -> RedisResult<u32> {
    match reply {
        Value::ServerError(e) => Err(e.into()),
        reply => Ok(redis::from_redis_value(reply)?),
    }
}

impl std::fmt::Debug for Nodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nodes")
    }
}

impl Nodes {
    /// No slot map and no connections yet.
    pub(crate) fn new(settings: NodeSettings) -> Nodes {
        Nodes {
            settings,
            map: Mutex::default(),
            conns: Mutex::default(),
        }
    }

    /// How a connection to one node is made.
    pub(crate) fn settings(&self) -> &NodeSettings {
        &self.settings
    }

    async fn map(&self, conn: &ClusterConnection) -> RedisResult<Arc<SlotMap>> {
        if let Some(map) = lock(&self.map).clone() {
            return Ok(map);
        }
        let map = Arc::new(slot_map(conn).await?);
        *lock(&self.map) = Some(map.clone());
        Ok(map)
    }

    fn forget_map(&self) {
        *lock(&self.map) = None;
    }

    async fn conn(&self, host: &str, port: u16) -> RedisResult<NodeConn> {
        static MADE: AtomicU64 = AtomicU64::new(0);
        let key = (host.to_owned(), port);
        if let Some(conn) = lock(&self.conns).get(&key) {
            return Ok(conn.clone());
        }
        let conn = self
            .settings
            .connect(host, port, super::RESPONSE_TIMEOUT)
            .await
            .map_err(|e| match e {
                crate::error::Error::Redis(e) => e,
                other => redis::RedisError::from(std::io::Error::other(other.to_string())),
            })?;
        let conn = NodeConn {
            id: MADE.fetch_add(1, Ordering::Relaxed),
            conn,
        };
        lock(&self.conns).insert(key, conn.clone());
        Ok(conn)
    }

    fn forget_conn(&self, host: &str, port: u16) {
        lock(&self.conns).remove(&(host.to_owned(), port));
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a command goes next.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum To {
    /// The master at this address.
    Node(String, u16),
    /// The node at this address, after `ASKING` (its slot is moving there).
    Asking(String, u16),
    /// Through redis-rs's routing: a command without a key.
    Routed,
}

/// Runs `pipe` on a Cluster: a transaction (within one slot, as it must
/// be) through redis-rs as it is, any other as one pipeline per master,
/// all at once; the replies come back in the commands' order. Such a
/// pipeline must not `ignore()` commands (redis-rs does not say which are),
/// and its errors come back in place, as with `ignore_errors()`.
pub(crate) async fn query_pipe(
    conn: &ClusterConnection,
    nodes: &Nodes,
    pipe: &Pipeline,
) -> RedisResult<Value> {
    if pipe.is_transaction() {
        let mut conn = conn.clone();
        return pipe.query_async(&mut conn).await;
    }
    let (replies, _) = write_pipe(conn, nodes, pipe, None, None).await?;
    Ok(Value::Array(replies))
}

/// Runs `pipe`, writes and no transaction, as [`query_pipe`] does, each
/// per-node pipeline followed by `wait` (a `WAIT`) if given, and records
/// the node connections that carried its commands in `carriers` if given.
/// The replies in the commands' order, and for each the replicas counted
/// by the `WAIT` after it (`None` without one, or for a command that
/// never ran: its reply is the last redirection). A command without a key
/// gets no `WAIT`: peerq writes none.
pub(crate) async fn write_pipe(
    conn: &ClusterConnection,
    nodes: &Nodes,
    pipe: &Pipeline,
    wait: Option<&Cmd>,
    carriers: Option<&Carriers>,
) -> RedisResult<(Vec<Value>, Vec<Option<u32>>)> {
    debug_assert!(
        !pipe.is_transaction(),
        "a transaction goes through redis-rs"
    );
    let commands: Vec<&Cmd> = pipe.cmd_iter().collect();
    let map = nodes.map(conn).await?;
    let mut to: Vec<To> = commands
        .iter()
        .map(|cmd| match command_slot(cmd) {
            None => To::Routed,
            Some(slot) => map
                .iter()
                .find(|(range, _)| range.contains(&slot))
                // No master serves it (the Cluster is down for it): the
                // first master answers CLUSTERDOWN or MOVED.
                .or(map.first())
                .map_or(To::Routed, |(_, (host, port))| {
                    To::Node(host.clone(), *port)
                }),
        })
        .collect();
    let mut replies: Vec<Option<Value>> = vec![None; commands.len()];
    let mut replicas: Vec<Option<u32>> = vec![None; commands.len()];
    let mut pending: Vec<usize> = (0..commands.len()).collect();
    for attempt in 0..ATTEMPTS {
        if attempt > 0 {
            // A slot in the middle of moving, or a failover: give the
            // nodes time to agree.
            tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
        }
        let mut groups: BTreeMap<&To, Vec<usize>> = BTreeMap::new();
        for &at in &pending {
            groups.entry(&to[at]).or_default().push(at);
        }
        let sent = groups
            .iter()
            .map(|(to, ats)| send(conn, nodes, (*to).clone(), &commands, ats, wait));
        let answers = join_all(sent).await;
        let mut again = Vec::new();
        let mut moves = Vec::new();
        for ((to, ats), answer) in groups.into_iter().zip(answers) {
            let answer = match answer {
                Ok(answer) => answer,
                Err(e) => {
                    if let To::Node(host, port) | To::Asking(host, port) = to {
                        nodes.forget_conn(host, *port);
                    }
                    nodes.forget_map();
                    // Sent, and maybe run: going again could run it twice.
                    return Err(e);
                }
            };
            // The `WAIT` counts for the commands that ran here; one after
            // commands that were all sent on says nothing about them.
            let ran = answer.values.iter().any(|value| redirect(value).is_none());
            let counted = match answer.waited {
                Some(waited) if ran => Some(counted(waited)?),
                _ => None,
            };
            if let (Some(carriers), Some(node), true) = (carriers, &answer.node, ran) {
                carriers.add(node);
            }
            for (at, value) in ats.into_iter().zip(answer.values) {
                if let Some(next) = redirect(&value) {
                    if let Some(next) = next {
                        if matches!(next, To::Node(..)) {
                            nodes.forget_map();
                        }
                        moves.push((at, next));
                    }
                    again.push(at);
                } else {
                    replicas[at] = counted;
                }
                replies[at] = Some(value);
            }
        }
        for (at, next) in moves {
            to[at] = next;
        }
        if again.is_empty() {
            break;
        }
        again.sort_unstable();
        pending = again;
    }
    let replies = replies
        .into_iter()
        .map(|value| value.unwrap_or(Value::Nil))
        .collect();
    Ok((replies, replicas))
}

/// What one per-node pipeline answered.
struct Answer {
    /// The commands' replies, in order.
    values: Vec<Value>,
    /// The reply of the `WAIT` after them, if one was sent.
    waited: Option<Value>,
    /// The connection they went on (none through redis-rs's routing).
    node: Option<NodeConn>,
}

/// Sends the commands at `ats` (in order) to `to` in one pipeline, with
/// errors in place, and `wait` after them if given (not through
/// redis-rs's routing, which may take another connection).
async fn send(
    conn: &ClusterConnection,
    nodes: &Nodes,
    to: To,
    commands: &[&Cmd],
    ats: &[usize],
    wait: Option<&Cmd>,
) -> RedisResult<Answer> {
    let mut sub = redis::pipe();
    sub.ignore_errors();
    let asking = matches!(to, To::Asking(..));
    for &at in ats {
        if asking {
            // Each `ASKING` admits only the command after it.
            sub.cmd("ASKING");
        }
        sub.add_command(commands[at].clone());
    }
    let (host, port) = match to {
        To::Node(host, port) | To::Asking(host, port) => (host, port),
        To::Routed => {
            let values = sub.query_async(&mut conn.clone()).await?;
            return Ok(Answer {
                values,
                waited: None,
                node: None,
            });
        }
    };
    if let Some(wait) = wait {
        sub.add_command(wait.clone());
    }
    let node = nodes.conn(&host, port).await?;
    let mut values: Vec<Value> = sub.query_async(&mut node.conn.clone()).await?;
    let waited = wait.and_then(|_| values.pop());
    let values = match asking {
        // Every other reply is an `ASKING`'s `OK`.
        true => values.into_iter().skip(1).step_by(2).collect(),
        false => values,
    };
    Ok(Answer {
        values,
        waited,
        node: Some(node),
    })
}

/// For a reply that says its command did not run and may go again:
/// `Some(Some(to))` for where (`MOVED`, `ASK`), `Some(None)` to send it
/// where it went, a little later (`TRYAGAIN`, `CLUSTERDOWN`).
fn redirect(value: &Value) -> Option<Option<To>> {
    let Value::ServerError(e) = value else {
        return None;
    };
    let address = || {
        let (host, port) = e.details()?.split_whitespace().nth(1)?.rsplit_once(':')?;
        Some((host.to_owned(), port.parse().ok()?))
    };
    match e.code() {
        "MOVED" => Some(address().map(|(host, port)| To::Node(host, port))),
        "ASK" => Some(address().map(|(host, port)| To::Asking(host, port))),
        "TRYAGAIN" | "CLUSTERDOWN" => Some(None),
        _ => None,
    }
}
