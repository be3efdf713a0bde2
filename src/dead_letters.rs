//! The dead letters (docs/design.md §6): tasks that failed their last attempt,
//! failed permanently, cannot be decoded or are too large, kept per
//! partition in `{N/p}:dead` with the reason, the last error, the attempt
//! count and the original payload. This module lists them across partitions, replays them
//! (back to their partition, attempts reset) and purges them.

use std::fmt;
use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, streams::StreamRangeReply};

use crate::config::ServiceName;
use crate::connection::SharedConnection;
use crate::error::{Error, Result};
use crate::keys;
use crate::task::{TaskId, field};

static REPLAY: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("scripts/replay.lua")));

/// The fields the consumer adds to a task when it dead-letters it.
pub(crate) mod added {
    pub(crate) const REASON: &str = "reason";
    pub(crate) const ERROR: &str = "error";
    pub(crate) const STREAM_ID: &str = "stream_id";
    pub(crate) const DEAD_AT: &str = "dead_at";
    pub(crate) const ALL: [&str; 4] = [REASON, ERROR, STREAM_ID, DEAD_AT];
}

/// One dead letter.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The partition it came from.
    pub partition: u32,
    /// Its id in the partition's dead-letter stream.
    pub id: String,
    /// The task's id (`None` for an entry too malformed to have one).
    pub task_id: Option<TaskId>,
    /// Why: `failed` (its last attempt), `permanent` (the handler said so),
    /// `decode` (the payload does not decode), `malformed` (the entry
    /// lacks the format's fields) or `too_large` (the entry is larger than
    /// the consumer's `max_entry_bytes`; kept as it was, undecoded).
    pub reason: String,
    /// The last error.
    pub error: String,
    /// Attempts made.
    pub attempts: u32,
    /// The encoded payload, as enqueued.
    pub payload: Vec<u8>,
    /// When it was dead-lettered.
    pub dead_at: SystemTime,
    /// Every field, to replay it as it was.
    fields: Vec<(String, Vec<u8>)>,
}

impl DeadLetter {
    fn parse(partition: u32, id: String, fields: Vec<(String, Vec<u8>)>) -> Self {
        let text = |name: &str| {
            fields
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        let millis = text(added::DEAD_AT)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        DeadLetter {
            partition,
            id,
            task_id: text(field::ID).map(|id| TaskId::from(id.as_str())),
            reason: text(added::REASON).unwrap_or_default(),
            error: text(added::ERROR).unwrap_or_default(),
            attempts: text(field::ATTEMPT)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            payload: fields
                .iter()
                .find(|(k, _)| k == field::PAYLOAD)
                .map(|(_, v)| v.clone())
                .unwrap_or_default(),
            dead_at: UNIX_EPOCH + Duration::from_millis(millis),
            fields,
        }
    }

    /// The task as it is enqueued again: its own fields, attempt 1.
    fn replayed(&self) -> Vec<(&str, &[u8])> {
        self.fields
            .iter()
            .filter(|(k, _)| !added::ALL.contains(&k.as_str()))
            .map(|(k, v)| {
                if k == field::ATTEMPT {
                    (k.as_str(), b"1".as_slice())
                } else {
                    (k.as_str(), v.as_slice())
                }
            })
            .collect()
    }
}

/// A service's dead letters.
///
/// ```no_run
/// # async fn demo() -> peerq::Result<()> {
/// use peerq::dead_letters::DeadLetters;
///
/// let dead = DeadLetters::connect("redis://127.0.0.1/", "mail-sender").await?;
/// for letter in dead.list(100).await? {
///     println!("{} {:?}: {} ({})", letter.partition, letter.task_id, letter.reason, letter.error);
///     if letter.reason == "failed" {
///         dead.replay(&letter).await?; // runs again, from attempt 1
///     }
/// }
/// # Ok(()) }
/// ```
pub struct DeadLetters {
    name: ServiceName,
    conn: SharedConnection,
    partitions: u32,
}

impl fmt::Debug for DeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetters")
            .field("name", &self.name)
            .field("partitions", &self.partitions)
            .finish_non_exhaustive()
    }
}

impl DeadLetters {
    /// The dead letters of service `name` at `url` (its partitions are read
    /// from `{name}:meta`). A Redis that cannot be reached is an
    /// [`Error::Connect`] naming the URL without its password.
    pub async fn connect(url: &str, name: &str) -> Result<Self> {
        let name = ServiceName::new(name)?;
        let conn = SharedConnection::new(crate::connection::pool(None, Some(url.to_owned()))?);
        let mut hget = redis::cmd("HGET");
        hget.arg(keys::meta(&name)).arg("partitions");
        let partitions: Option<u32> = conn
            .query(&hget)
            .await
            .map_err(|e| crate::connection::at(&crate::connection::redact(url), e))?;
        let partitions = partitions.ok_or_else(|| {
            Error::invalid(
                "name",
                format!(
                    "service `{name}` has no recorded settings: nothing was ever enqueued for it"
                ),
            )
        })?;
        Ok(DeadLetters {
            name,
            conn,
            partitions,
        })
    }

    /// Up to `limit` dead letters over all partitions, oldest first.
    pub async fn list(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        let mut pipe = redis::pipe();
        for p in 0..self.partitions {
            pipe.cmd("XRANGE")
                .arg(keys::dead(&self.name, p))
                .arg("-")
                .arg("+")
                .arg("COUNT")
                .arg(limit);
        }
        let replies: Vec<StreamRangeReply> = self.conn.query_pipe(&pipe).await?;
        let mut letters: Vec<DeadLetter> = replies
            .into_iter()
            .zip(0..)
            .flat_map(|(reply, p)| {
                reply.ids.into_iter().map(move |entry| {
                    let fields = entry
                        .map
                        .iter()
                        .map(|(k, v)| {
                            let bytes =
                                redis::from_redis_value_ref::<Vec<u8>>(v).unwrap_or_default();
                            (k.clone(), bytes)
                        })
                        .collect();
                    DeadLetter::parse(p, entry.id, fields)
                })
            })
            .collect();
        letters.sort_by_key(|l| l.dead_at);
        letters.truncate(limit);
        Ok(letters)
    }

    /// Enqueues `letter`'s task again in its partition with attempt 1 and
    /// removes the letter, in one step; false if it was gone already (a
    /// replay happens once).
    pub async fn replay(&self, letter: &DeadLetter) -> Result<bool> {
        let mut script = REPLAY.key(keys::dead(&self.name, letter.partition));
        script
            .key(keys::stream(&self.name, letter.partition))
            .arg(&letter.id);
        for (k, v) in letter.replayed() {
            script.arg(k).arg(v);
        }
        match self.conn.invoke::<i64>(&script).await? {
            1 => Ok(true),
            0 => Ok(false),
            _ => Err(Error::Runtime(format!(
                "dead letter {} of partition {} holds no task fields to replay; purge it",
                letter.id, letter.partition
            ))),
        }
    }

    /// Removes `letter` for good; false if it was gone already.
    pub async fn purge(&self, letter: &DeadLetter) -> Result<bool> {
        let mut del = redis::cmd("XDEL");
        del.arg(keys::dead(&self.name, letter.partition))
            .arg(&letter.id);
        let removed: u64 = self.conn.query(&del).await?;
        Ok(removed == 1)
    }

    /// Removes every dead letter of the service; returns how many.
    pub async fn purge_all(&self) -> Result<u64> {
        let mut total = 0;
        for p in 0..self.partitions {
            let key = keys::dead(&self.name, p);
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("XLEN")
                .arg(&key)
                .cmd("DEL")
                .arg(&key)
                .ignore();
            let (len,): (u64,) = self.conn.query_pipe(&pipe).await?;
            total += len;
        }
        Ok(total)
    }
}
