//! The raw redis-rs baselines: what Redis and redis-rs do with peerq's
//! entries when nothing else is asked of them. No fencing, no leases, no
//! housekeeping; entries are acked by plain `XACK`.
//!
//! Every baseline writes or reads entries with the fields and bytes a
//! peerq producer writes (a UUIDv7 id, attempt, enqueue time in ms, codec,
//! the same bincode payload), over 64 streams named as peerq names them.
//! The consumers read the same prefilled streams, each with a consumer
//! group of its own, so they read the very same entries.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::streams::StreamReadReply;
use deadpool_redis::redis::{self, aio::MultiplexedConnection};
use peerq::DEFAULT_PARTITIONS;

/// Entries per `XADD` pipeline.
pub(crate) const BATCH: usize = 1000;
/// Entries per `XREADGROUP`.
pub(crate) const READ_COUNT: usize = 100;

/// Partition `p`'s stream of service `name`, as peerq names it.
pub(crate) fn stream(name: &str, p: u32) -> String {
    format!("{{{name}/{p}}}:stream")
}

/// Adds `XADD <key> * <fields>` to `pipe`, with a new entry's fields as
/// peerq's producer writes them (no key): each entry its own id and time.
fn add_entry(pipe: &mut redis::Pipeline, key: &str, payload: &[u8]) {
    let id = uuid::Uuid::now_v7().hyphenated().to_string();
    let enqueued_at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
        .to_string();
    pipe.cmd("XADD")
        .arg(key)
        .arg("*")
        .arg(&[
            ("id", id.as_bytes()),
            ("attempt", &b"1"[..]),
            ("enqueued_at", enqueued_at.as_bytes()),
            ("codec", &b"bincode"[..]),
            ("payload", payload),
        ])
        .ignore();
}

/// How many of `tasks` go to partition `p` when task `seq` goes to
/// `seq % 64`.
fn share(tasks: u64, p: u32) -> u64 {
    let n = u64::from(DEFAULT_PARTITIONS);
    tasks / n + u64::from(u64::from(p) < tasks % n)
}

/// `connections` new multiplexed connections. Their replies may take
/// longer than redis-rs's default 500 ms: 64 pipelines of 1,000 `XADD`
/// sent at once are answered together, after all of them ran.
pub(crate) async fn connect(
    client: &redis::Client,
    connections: usize,
) -> Vec<MultiplexedConnection> {
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(30)));
    let mut conns = Vec::with_capacity(connections);
    for _ in 0..connections {
        conns.push(
            client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .unwrap(),
        );
    }
    conns
}

/// Deletes every stream of `name` (a repeated enqueue run's entries).
pub(crate) async fn delete_streams(conn: &mut MultiplexedConnection, name: &str) {
    let mut del = redis::cmd("DEL");
    for p in 0..DEFAULT_PARTITIONS {
        del.arg(stream(name, p));
    }
    let _: u64 = del.query_async(conn).await.unwrap();
}

/// Creates consumer group `group` from the start of every stream of `name`.
pub(crate) async fn create_group(conn: &mut MultiplexedConnection, name: &str, group: &str) {
    let mut pipe = redis::pipe();
    for p in 0..DEFAULT_PARTITIONS {
        pipe.cmd("XGROUP")
            .arg("CREATE")
            .arg(stream(name, p))
            .arg(group)
            .arg("0")
            .arg("MKSTREAM")
            .ignore();
    }
    let () = pipe.query_async(conn).await.unwrap();
}

/// One connection, pipelines of 1,000 `XADD` spread over the 64 streams
/// (task `seq` to stream `seq % 64`), one pipeline after the other.
pub(crate) async fn enqueue_serial(
    conn: &mut MultiplexedConnection,
    name: &str,
    tasks: u64,
    payload: &[u8],
) -> f64 {
    let started = Instant::now();
    let mut seq = 0;
    while seq < tasks {
        let mut pipe = redis::pipe();
        for _ in 0..BATCH.min((tasks - seq) as usize) {
            let p = (seq % u64::from(DEFAULT_PARTITIONS)) as u32;
            add_entry(&mut pipe, &stream(name, p), payload);
            seq += 1;
        }
        let () = pipe.query_async(conn).await.unwrap();
    }
    tasks as f64 / started.elapsed().as_secs_f64()
}

/// A task per stream, each on its own connection from `conns`, adding its
/// stream's share in pipelines of 1,000 `XADD`.
pub(crate) async fn enqueue_per_stream(
    conns: &[MultiplexedConnection],
    name: &str,
    tasks: u64,
    payload: &[u8],
) -> f64 {
    let started = Instant::now();
    let mut loops = Vec::new();
    for p in 0..DEFAULT_PARTITIONS {
        let mut conn = conns[p as usize % conns.len()].clone();
        let (key, payload, mut left) = (stream(name, p), payload.to_vec(), share(tasks, p));
        loops.push(tokio::spawn(async move {
            while left > 0 {
                let n = left.min(BATCH as u64);
                let mut pipe = redis::pipe();
                for _ in 0..n {
                    add_entry(&mut pipe, &key, &payload);
                }
                let () = pipe.query_async(&mut conn).await.unwrap();
                left -= n;
            }
        }));
    }
    for l in loops {
        l.await.unwrap();
    }
    tasks as f64 / started.elapsed().as_secs_f64()
}

/// The ids in a read's reply.
fn ids(reply: Option<StreamReadReply>) -> Vec<String> {
    reply
        .map(|r| {
            r.keys
                .into_iter()
                .flat_map(|k| k.ids)
                .map(|i| i.id)
                .collect()
        })
        .unwrap_or_default()
}

/// One connection: a pipeline of, per stream, the `XACK` of its previous
/// batch and `XREADGROUP COUNT 100`, over all 64 streams, one pipeline after
/// the other, until every stream is read out.
pub(crate) async fn consume_serial(
    conn: &mut MultiplexedConnection,
    name: &str,
    group: &str,
    tasks: u64,
) -> f64 {
    let mut previous: Vec<Vec<String>> = vec![Vec::new(); DEFAULT_PARTITIONS as usize];
    let mut read = 0u64;
    let started = Instant::now();
    loop {
        let mut pipe = redis::pipe();
        for p in 0..DEFAULT_PARTITIONS {
            if !previous[p as usize].is_empty() {
                pipe.cmd("XACK")
                    .arg(stream(name, p))
                    .arg(group)
                    .arg(&previous[p as usize])
                    .ignore();
            }
            read_cmd(&mut pipe, group, &stream(name, p));
        }
        let replies: Vec<Option<StreamReadReply>> = pipe.query_async(conn).await.unwrap();
        let mut got = 0;
        for (p, reply) in replies.into_iter().enumerate() {
            previous[p] = ids(reply);
            got += previous[p].len();
        }
        read += got as u64;
        if got == 0 {
            break;
        }
    }
    let rate = read as f64 / started.elapsed().as_secs_f64();
    assert_eq!(read, tasks);
    rate
}

/// `XREADGROUP GROUP <group> c COUNT 100 STREAMS <stream> >`, never
/// blocking.
fn read_cmd(pipe: &mut redis::Pipeline, group: &str, stream: &str) {
    pipe.cmd("XREADGROUP")
        .arg("GROUP")
        .arg(group)
        .arg("c")
        .arg("COUNT")
        .arg(READ_COUNT)
        .arg("STREAMS")
        .arg(stream)
        .arg(">");
}

/// A task per stream, looping a pipeline of the `XACK` of its previous
/// batch and `XREADGROUP COUNT 100` until its stream is read out; stream
/// `p`'s loop runs on `conns[p % conns.len()]` (64 connections: one each;
/// fewer: multiplexed, their commands pipelined by redis-rs).
pub(crate) async fn consume_per_stream(
    conns: &[MultiplexedConnection],
    name: &str,
    group: &str,
    tasks: u64,
) -> f64 {
    let started = Instant::now();
    let mut loops = Vec::new();
    for p in 0..DEFAULT_PARTITIONS {
        let mut conn = conns[p as usize % conns.len()].clone();
        let (key, group) = (stream(name, p), group.to_owned());
        loops.push(tokio::spawn(async move {
            let mut previous: Vec<String> = Vec::new();
            let mut read = 0u64;
            loop {
                let mut pipe = redis::pipe();
                if !previous.is_empty() {
                    pipe.cmd("XACK")
                        .arg(&key)
                        .arg(&group)
                        .arg(&previous)
                        .ignore();
                }
                read_cmd(&mut pipe, &group, &key);
                let replies: Vec<Option<StreamReadReply>> =
                    pipe.query_async(&mut conn).await.unwrap();
                previous = ids(replies.into_iter().next().flatten());
                if previous.is_empty() {
                    return read;
                }
                read += previous.len() as u64;
            }
        }));
    }
    let mut read = 0;
    for l in loops {
        read += l.await.unwrap();
    }
    let rate = read as f64 / started.elapsed().as_secs_f64();
    assert_eq!(read, tasks);
    rate
}

/// Enqueue → read latency on the raw floor, at the rate of peerq's latency
/// run (5 entries every millisecond, `total` in all, to streams `seq % 64`):
/// one reader blocks in one `XREADGROUP … BLOCK` over all 64 streams on a
/// connection of its own and acks what it read with the next read; the
/// producer pipelines each millisecond's 5 `XADD`s on another connection.
/// `payload(seq)` encodes an entry's payload with its send time, which
/// `sent_ns(payload)` reads back. The delays, in ns, as they came.
pub(crate) async fn latency(
    client: &redis::Client,
    name: &str,
    total: u64,
    payload: impl Fn(u64) -> Vec<u8>,
    sent_ns: impl Fn(&[u8]) -> u64 + Send + 'static,
    now_ns: fn() -> u64,
) -> Vec<u64> {
    let mut conns = connect(client, 2).await;
    let (mut producer, mut reader) = (conns.remove(0), conns.remove(0));
    create_group(&mut producer, name, "latency").await;
    let streams: Vec<String> = (0..DEFAULT_PARTITIONS).map(|p| stream(name, p)).collect();
    let read_streams = streams.clone();
    let reading = tokio::spawn(async move {
        let mut delays = Vec::with_capacity(total as usize);
        let mut previous: Vec<(String, String)> = Vec::new();
        while (delays.len() as u64) < total {
            let mut pipe = redis::pipe();
            for (key, id) in previous.drain(..) {
                pipe.cmd("XACK").arg(key).arg("latency").arg(id).ignore();
            }
            pipe.cmd("XREADGROUP")
                .arg("GROUP")
                .arg("latency")
                .arg("raw")
                .arg("COUNT")
                .arg(READ_COUNT)
                .arg("BLOCK")
                .arg(1000)
                .arg("STREAMS")
                .arg(&read_streams);
            for _ in &read_streams {
                pipe.arg(">");
            }
            let (reply,): (Option<StreamReadReply>,) = pipe.query_async(&mut reader).await.unwrap();
            for key in reply.map(|r| r.keys).unwrap_or_default() {
                for entry in key.ids {
                    if let Some(redis::Value::BulkString(bytes)) = entry.map.get("payload") {
                        delays.push(now_ns().saturating_sub(sent_ns(bytes)));
                    }
                    previous.push((key.key.clone(), entry.id));
                }
            }
        }
        delays
    });
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut seq = 0;
    while seq < total {
        tick.tick().await;
        let mut pipe = redis::pipe();
        for s in seq..seq + 5 {
            let p = (s % u64::from(DEFAULT_PARTITIONS)) as usize;
            add_entry(&mut pipe, &streams[p], &payload(s));
        }
        let () = pipe.query_async(&mut producer).await.unwrap();
        seq += 5;
    }
    reading.await.unwrap()
}
