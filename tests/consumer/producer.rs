//! The producer's batch: a batch larger than one part lands whole, each task
//! once in its partition, in the batch's order, over one connection; an
//! error from Redis in one part is returned and leaves what Redis applied in
//! place (the ambiguity `enqueue_batch`'s doc warns of). A task refused late
//! in a large batch: `tests/consumer/consumer.rs`, with the payload limit.

mod options;

use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

use deadpool_redis::redis::{self, AsyncCommands};
use peerq::producer::Producer;
use peerq::{Bincode, Codec};
use peerq::{DEFAULT_PARTITIONS, partition_of};
use serde::{Deserialize, Serialize};
use support::{RedisServer, unique_name};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Job {
    seq: u64,
    body: String,
}

fn jobs(n: u64) -> Vec<Job> {
    (0..n)
        .map(|seq| Job {
            seq,
            body: "a mail body".into(),
        })
        .collect()
}

/// Larger than any part, not a multiple of one.
const BATCH: u64 = 1_000;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// An entry's fields by name.
type Fields = HashMap<String, Vec<u8>>;

/// Every entry of service `name`'s partition `p`, in stream order, as
/// field maps.
async fn entries(conn: &mut deadpool_redis::Connection, name: &str, p: u32) -> Vec<Fields> {
    let reply: Vec<(String, Fields)> = redis::cmd("XRANGE")
        .arg(format!("{{{name}/{p}}}:stream"))
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .unwrap();
    reply.into_iter().map(|(_, fields)| fields).collect()
}

/// How many clients Redis has connected now.
async fn clients(conn: &mut deadpool_redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(conn)
        .await
        .unwrap();
    list.lines().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_many_parts_lands_whole_each_task_once_in_order() {
    let server = RedisServer::start();
    let name = unique_name("batch");
    let mut conn = server.pool().get().await.unwrap();
    let before = clients(&mut conn).await;
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let started = now_ms();
    let batch = jobs(BATCH);
    let ids = producer.enqueue_batch(&batch).await.unwrap();
    let ended = now_ms();
    assert_eq!(ids.len(), batch.len());
    // The batch went out in several parts, over the producer's one
    // connection.
    assert_eq!(clients(&mut conn).await, before + 1);

    // Where each id landed: its partition, and its job.
    let mut found: HashMap<String, (u32, Job)> = HashMap::new();
    for p in 0..DEFAULT_PARTITIONS {
        let mut previous = None;
        for entry in entries(&mut conn, &name, p).await {
            let field = |f: &str| String::from_utf8(entry[f].clone()).unwrap();
            assert_eq!(field("attempt"), "1");
            assert_eq!(field("codec"), "bincode");
            let at: u64 = field("enqueued_at").parse().unwrap();
            assert!((started..=ended).contains(&at), "{at}");
            assert!(!entry.contains_key("key"), "{entry:?}");
            let job: Job = Bincode.decode(&entry["payload"]).unwrap();
            // Within a partition, the entries are in the batch's order.
            assert!(previous < Some(job.seq), "{previous:?} then {}", job.seq);
            previous = Some(job.seq);
            let again = found.insert(field("id"), (p, job));
            assert!(again.is_none(), "an id twice: {again:?}");
        }
    }
    assert_eq!(found.len(), batch.len(), "every task once, nothing else");
    // The ids come back in the tasks' order, each in its own partition.
    for (id, job) in ids.iter().zip(&batch) {
        let (p, stored) = &found[id.as_str()];
        assert_eq!(stored, job, "{id}");
        assert_eq!(*p, partition_of(id.as_str().as_bytes(), DEFAULT_PARTITIONS));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_from_redis_is_returned_and_what_redis_applied_stays() {
    let server = RedisServer::start();
    let name = unique_name("partial");
    let producer = Producer::connect(&server.url(), &name).await.unwrap();
    let mut conn = server.pool().get().await.unwrap();
    // Partition 7's stream is not a stream: its `XADD`s fail, the others'
    // do not.
    let broken = 7;
    let () = conn
        .set(format!("{{{name}/{broken}}}:stream"), "not a stream")
        .await
        .unwrap();
    let err = producer.enqueue_batch(&jobs(BATCH)).await.unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    let mut applied = 0;
    for p in (0..DEFAULT_PARTITIONS).filter(|p| *p != broken) {
        applied += entries(&mut conn, &name, p).await.len();
    }
    // About 1/64 of the tasks went to the broken partition.
    assert!(
        (900..BATCH as usize).contains(&applied),
        "{applied} of {BATCH} applied"
    );
}

/// `wait_for_replicas`: with a replica up, enqueues (one and a batch)
/// return once it has them; with it gone, they land on the master but
/// return `NotReplicated` after the timeout, without the password or
/// anything else of the URL in the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_wait_for_a_replica_and_say_when_none_confirmed() {
    let master = RedisServer::start();
    let replica = RedisServer::start();
    let mut conn = replica.connection().await;
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port())
        .query_async(&mut conn)
        .await
        .unwrap();
    let name = unique_name("wait");
    let producer = Producer::builder()
        .redis(
            peerq::Redis::url(master.url())
                // 1 s: a replica on a loaded 2-core machine took more than
                // 200 ms to confirm a batch of 1,000 (a full suite run).
                .wait_for_replicas(1, std::time::Duration::from_secs(1)),
        )
        .name(&name)
        .connect()
        .await
        .unwrap();
    // The replica syncs first: until then WAIT counts none.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while producer.enqueue(jobs(1)[0].clone()).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never confirmed"
        );
    }
    producer.enqueue_batch(&jobs(BATCH)).await.unwrap();
    drop(replica);
    let started = std::time::Instant::now();
    let err = producer.enqueue(jobs(1)[0].clone()).await.unwrap_err();
    assert!(
        matches!(
            err,
            peerq::Error::NotReplicated {
                wanted: 1,
                got: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(started.elapsed() >= std::time::Duration::from_secs(1));
    let err = producer.enqueue_batch(&jobs(10)).await.unwrap_err();
    assert!(err.to_string().contains("reached 0 of 1 replicas"), "{err}");
    // Both landed on the master nonetheless.
    let mut conn = master.connection().await;
    let mut total = 0;
    for p in 0..DEFAULT_PARTITIONS {
        let len: u64 = conn.xlen(format!("{{{name}/{p}}}:stream")).await.unwrap();
        total += len;
    }
    assert!(total >= 1 + BATCH + 1 + 10, "{total}");
}
